// A bounded soak of l3d serve on loopback (run by tests/cli_serve_soak.sh): REQUESTS requests
// from WORKERS concurrent clients, streamed and plain, a tenth of the streams dropped after
// their first chunk, short and long answers. Nothing may be lost: every request that was not
// dropped gets 200 with the tokens it asked for (or an end-of-text stop), the server's counters
// add up to what was sent, and its resident memory (VmRSS of SERVER_PID) is flat: the growth
// over the second half is measured against the first half's.
//   node serve_soak.js PORT SERVER_PID REQUESTS WORKERS
"use strict";
const fs = require("fs");
const [port, pid, nreqS, nworkS] = process.argv.slice(2);
const NREQ = Number(nreqS), NWORK = Number(nworkS);
const base = `http://127.0.0.1:${port}`;
let passes = 0, fails = 0;
function check(name, ok, detail) {
  if (ok) { console.log("ok   " + name); passes++; }
  else { console.log("FAIL " + name + (detail !== undefined ? ": " + detail : "")); fails++; }
}
const rss = () => Number(/VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))[1]);

let next = 0, ok = 0, dropped = 0, bad = [];
const rssAt = {};
async function one(i) {
  const stream = i % 2 === 0, drop = stream && i % 10 === 0;
  const max = 1 + (i * 7919) % 48;
  const body = { prompt: `Soak request ${i} says`, max_tokens: max, temperature: 0.8, seed: i, stream };
  const ac = new AbortController();
  const r = await fetch(`${base}/v1/completions`, { method: "POST", body: JSON.stringify(body), signal: ac.signal,
    headers: { "Content-Type": "application/json" } });
  if (r.status !== 200) { bad.push(`#${i}: ${r.status} ${await r.text()}`); return; }
  if (!stream) {
    const j = await r.json();
    const f = j.choices[0].finish_reason;
    if ((f === "length" && j.usage.completion_tokens === max) || (f === "stop" && j.usage.completion_tokens <= max)) ok++;
    else bad.push(`#${i}: ${f} ${j.usage.completion_tokens} of ${max}`);
    return;
  }
  const reader = r.body.getReader(), dec = new TextDecoder();
  let text = "", got = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += dec.decode(value, { stream: true });
      if (drop && ++got === 1) { ac.abort(); dropped++; return; }
    }
  } catch (e) { if (drop) return; throw e; }
  const ev = text.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6));
  const fin = ev.length > 1 ? JSON.parse(ev[ev.length - 2]).choices[0].finish_reason : null;
  if (ev[ev.length - 1] === "[DONE]" && (fin === "length" || fin === "stop")) ok++;
  else bad.push(`#${i}: stream ended ${JSON.stringify(ev.slice(-2))}`);
}
async function worker() {
  for (;;) {
    const i = next++;
    if (i >= NREQ) return;
    if (i === Math.floor(NREQ / 4) || i === Math.floor(NREQ / 2) || i === NREQ - 1) rssAt[i] = rss();
    try { await one(i); } catch (e) { bad.push(`#${i}: ${e}`); }
  }
}

async function main() {
  const t0 = Date.now();
  await Promise.all([...Array(NWORK).keys()].map(worker));
  const secs = (Date.now() - t0) / 1000;
  check(`${NREQ} requests from ${NWORK} clients in ${secs.toFixed(1)} s: ${ok} answered whole, ${dropped} dropped`,
    bad.length === 0 && ok + dropped === NREQ, bad.slice(0, 5).join("; "));
  // the server's counters: every request ended once, by its reason
  let m = "";
  for (let t = 0; t < 50; t++) {
    m = await (await fetch(`${base}/metrics`)).text();
    if (/^l3d_requests_running 0$/m.test(m) && /^l3d_queue_depth 0$/m.test(m)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const count = (re) => Number((re.exec(m) || [0, -1])[1]);
  const ended = ["stop", "length", "cancelled", "timeout", "error"].map((k) =>
    count(new RegExp(`^l3d_requests_finished_total\\{reason="${k}"\\} (\\d+)$`, "m")));
  check(`the server ended each request once (stop ${ended[0]}, length ${ended[1]}, cancelled ${ended[2]})`,
    ended[0] + ended[1] + ended[2] === NREQ && ended[3] === 0 && ended[4] === 0 && ended[2] <= dropped);
  check("nothing running or queued after", /^l3d_requests_running 0$/m.test(m) && /^l3d_queue_depth 0$/m.test(m));
  // memory: the second half may not grow more than the first half did, plus 1 MiB of slack for
  // the allocator's arenas settling (a leak of 1 KiB a request shows as NREQ/2 KiB: 2 MiB at
  // the 4000 requests ctest runs)
  const q = Math.floor(NREQ / 4), h = Math.floor(NREQ / 2), e = NREQ - 1;
  const g1 = rssAt[h] - rssAt[q], g2 = rssAt[e] - rssAt[h];
  check(`resident memory flat: ${rssAt[q]} -> ${rssAt[h]} -> ${rssAt[e]} kB`, g2 <= Math.max(g1, 0) + 1024,
    `second half grew ${g2} kB, first ${g1} kB`);
  console.log(`${passes} passed, ${fails} failed`);
  process.exit(fails ? 1 : 0);
}
main().catch((e) => { console.log("FAIL " + (e && e.stack || e)); process.exit(1); });
