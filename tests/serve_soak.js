// A bounded soak of l3d serve on loopback (run by tests/cli_serve_soak.sh): REQUESTS requests
// from WORKERS concurrent clients, streamed and plain, a tenth of the streams dropped after
// their first chunk, short and long answers. Nothing may be lost: every request that was not
// dropped gets 200 with the tokens it asked for (or an end-of-text stop), the server's counters
// add up to what was sent, and its resident memory (VmRSS of SERVER_PID, read with nothing in
// flight) is flat: the growth over the second half is measured against the second quarter's.
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
// The resident kB of the brk heap: with one malloc arena (cli_serve_soak.sh) every allocation
// under malloc's mmap threshold lands there, from whichever thread, a leaked request's too.
function heap() {
  let cur = "", kb = 0;
  for (const l of fs.readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n")) {
    const m = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(l);
    if (m) cur = m[1];
    else if (cur === "[heap]" && /^Rss:/.test(l)) kb += Number(/(\d+) kB/.exec(l)[1]);
  }
  return kb;
}

let next = 0, ok = 0, dropped = 0, bad = [];
const rssAt = {}, heapAt = {};
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
async function worker(upto) {
  for (;;) {
    const i = next++;
    if (i >= upto) { next = upto; return; }
    try { await one(i); } catch (e) { bad.push(`#${i}: ${e}`); }
  }
}

// Waits until the server runs and queues nothing; its /metrics text.
async function idle() {
  let m = "";
  for (let t = 0; t < 50; t++) {
    m = await (await fetch(`${base}/metrics`)).text();
    if (/^l3d_requests_running 0$/m.test(m) && /^l3d_queue_depth 0$/m.test(m)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  return m;
}

async function main() {
  const t0 = Date.now();
  // In quarters, the server idle between them: its memory is read at the end of the first,
  // second and fourth, when no request is in flight.
  for (const upto of [NREQ / 4, NREQ / 2, (3 * NREQ) / 4, NREQ].map(Math.floor)) {
    await Promise.all([...Array(NWORK).keys()].map(() => worker(upto)));
    await idle();
    rssAt[upto] = rss();
    heapAt[upto] = heap();
  }
  const secs = (Date.now() - t0) / 1000;
  check(`${NREQ} requests from ${NWORK} clients in ${secs.toFixed(1)} s: ${ok} answered whole, ${dropped} dropped`,
    bad.length === 0 && ok + dropped === NREQ, bad.slice(0, 5).join("; "));
  // the server's counters: every request ended once, by its reason
  const m = await idle();
  const count = (re) => Number((re.exec(m) || [0, -1])[1]);
  const ended = ["stop", "length", "cancelled", "timeout", "error"].map((k) =>
    count(new RegExp(`^l3d_requests_finished_total\\{reason="${k}"\\} (\\d+)$`, "m")));
  check(`the server ended each request once (stop ${ended[0]}, length ${ended[1]}, cancelled ${ended[2]})`,
    ended[0] + ended[1] + ended[2] === NREQ && ended[3] === 0 && ended[4] === 0 && ended[2] <= dropped);
  check("nothing running or queued after", /^l3d_requests_running 0$/m.test(m) && /^l3d_queue_depth 0$/m.test(m));
  // memory: over the second half (the first quarter warms the allocator up) the heap may grow
  // by 512 bytes a request at most, 1000 kB at the 4000 requests ctest runs: a leak of 512
  // bytes a request or more fails it. Seen without one: 0-600 kB (it grows in steps when more
  // requests than before are live at once, not with their number: +600 kB over 8000 requests
  // of a 16000 soak, 0 over the 4000 before). The whole resident set is not held to that:
  // idle keep-alive connections keep their threads, 40-65 of them at these reads, each with
  // ~75 kB of touched stack, which moved it by 1.4-2 MiB between reads under a loaded ctest
  // (four failures since 2026-12-07, the heap flat each time); it gets 8 MiB of slack, for
  // leaks of blocks above malloc's mmap threshold, which the heap does not see.
  const q = Math.floor(NREQ / 4), h = Math.floor(NREQ / 2), e = NREQ;
  const g1 = heapAt[h] - heapAt[q], g2 = heapAt[e] - heapAt[h];
  check(`heap flat: ${heapAt[q]} -> ${heapAt[h]} -> ${heapAt[e]} kB`, g2 <= (NREQ / 2) * 0.5,
    `second half grew ${g2} kB, second quarter ${g1} kB`);
  const r1 = rssAt[h] - rssAt[q], r2 = rssAt[e] - rssAt[h];
  check(`resident memory flat: ${rssAt[q]} -> ${rssAt[h]} -> ${rssAt[e]} kB`,
    r2 <= Math.max(r1, 0) + 8192, `second half grew ${r2} kB, second quarter ${r1} kB`);
  console.log(`${passes} passed, ${fails} failed`);
  process.exit(fails ? 1 : 0);
}
main().catch((e) => { console.log("FAIL " + (e && e.stack || e)); process.exit(1); });
