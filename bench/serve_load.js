// A load generator for OpenAI-compatible servers (bench/serve_vs_llamacpp.sh): CONC clients,
// each sending REQS streamed /v1/completions requests in turn, every request the same prompt
// ids (PROMPT_FILE: a JSON array of token ids, sent as ids so both servers see the same tokens)
// and GEN generated tokens (temperature 0, ignore_eos: every answer is GEN tokens long). It
// times each request from sending to its first text chunk (TTFT) and between chunks (ITL),
// and prints one JSON line: requests/s, generated tokens/s (usage, summed, over the wall time),
// TTFT and ITL percentiles (ms), and the server's peak RSS (VmHWM of PID).
//   node serve_load.js PORT PID PROMPT_FILE CONC REQS GEN
"use strict";
const fs = require("fs");
const [port, pid, promptFile, concS, reqsS, genS] = process.argv.slice(2);
const prompt = JSON.parse(fs.readFileSync(promptFile, "utf8"));
const CONC = Number(concS), REQS = Number(reqsS), GEN = Number(genS);
const ttft = [], itl = [];
let tokens = 0, done = 0, failed = 0;

async function one() {
  const t0 = performance.now();
  const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: GEN, temperature: 0, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } }),
  });
  if (r.status !== 200) { failed++; await r.text(); return; }
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = "", last = 0, first = true, usage = null, chunks = 0;
  for (;;) {
    const { done: end, value } = await reader.read();
    if (end) break;
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k).trim();
      buf = buf.slice(k + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const c = JSON.parse(ev.slice(6));
      if (c.usage) usage = c.usage;
      if (!c.choices || !c.choices.length || !c.choices[0].text) continue;
      const now = performance.now();
      chunks++;
      if (first) { ttft.push(now - t0); first = false; } else itl.push(now - last);
      last = now;
    }
  }
  tokens += usage ? usage.completion_tokens : chunks;  // (a server without usage: its chunks)
  done++;
}

function pct(a, p) {
  if (!a.length) return null;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))];
}

async function main() {
  const t0 = performance.now();
  await Promise.all([...Array(CONC).keys()].map(async () => { for (let i = 0; i < REQS; i++) await one(); }));
  const secs = (performance.now() - t0) / 1000;
  const hwm = Number(/VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))[1]);
  const r = (x) => (x === null ? null : Math.round(x * 100) / 100);
  console.log(JSON.stringify({
    requests: done, failed, seconds: r(secs), req_s: r(done / secs), tok_s: r(tokens / secs),
    ttft_p50: r(pct(ttft, 50)), ttft_p90: r(pct(ttft, 90)), ttft_p99: r(pct(ttft, 99)),
    itl_p50: r(pct(itl, 50)), itl_p90: r(pct(itl, 90)), itl_p99: r(pct(itl, 99)), rss_mib: r(hwm / 1024),
  }));
}
main().catch((e) => { console.error(e); process.exit(1); });
