// The official OpenAI client (npm `openai`) against l3d serve; run by tests/cli_serve_openai.sh,
// which starts the servers and passes what to compare with.
//   node serve_openai.js OPENAI_DIR TINY_PORT GREEDY_FILE BOUND CHAT_PORT CHAT_FILE SLOW_PORT
// TINY: the tiny checkpoint (API key "sekret"); GREEDY_FILE: l3d generate's greedy text of "The
// GNU General" (40 tokens); BOUND: the float32 bound on a logit's difference between a batched
// and a lone decode (tests/test_model.c's derivation, computed from the checkpoint by the
// wrapper). CHAT: a model over Meta's tokenizer and CHAT_FILE l3d generate --chat's answer
// (CHAT_PORT 0: not run). SLOW: a slower model, for a stream dropped mid-way.
"use strict";
const fs = require("fs");
const [dir, tinyPort, greedyFile, boundS, chatPort, chatFile, slowPort] = process.argv.slice(2);
const mod = require(dir + "/node_modules/openai");
const OpenAI = mod.OpenAI || mod.default;
const bound = Number(boundS);
let passes = 0, fails = 0;
function check(name, ok, detail) {
  if (ok) { console.log("ok   " + name); passes++; }
  else { console.log("FAIL " + name + (detail !== undefined ? ": " + detail : "")); fails++; }
}
const client = (port, key) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key || "sekret", maxRetries: 0, timeout: 120000 });

async function expectError(name, status, code, fn) {
  try {
    await fn();
    check(name, false, "no error");
  } catch (e) {
    const ok = e instanceof OpenAI.APIError && e.status === status && (!code || e.code === code) &&
      typeof e.message === "string" && e.message.length > 0;
    check(`${name}: ${e.status} ${e.error && e.error.message}`, ok, `${e.constructor.name} ${e.status} ${e.code}`);
  }
}

async function streamText(c, params, opts) {
  const s = await c.completions.create({ ...params, stream: true }, opts);
  let text = "", usage = null, finish = null;
  for await (const ch of s) {
    if (ch.choices.length) {
      text += ch.choices[0].text;
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
    if (ch.usage) usage = ch.usage;
  }
  return { text, usage, finish };
}

// Where a concurrent answer differs from the lone one, the lone run's best two logprobs at that
// token must be within twice the bound (a near-tie that float32 rounding may flip).
function nearTie(alone, other) {
  const lp = alone.logprobs;
  let i = 0;
  while (i < alone.text.length && alone.text[i] === other[i]) i++;
  if (i === alone.text.length && other.length === alone.text.length) return { same: true };
  let k = lp.text_offset.findIndex((o, j) => j + 1 === lp.text_offset.length || lp.text_offset[j + 1] > i);
  const vals = Object.values(lp.top_logprobs[k]).sort((a, b) => b - a);
  return { same: false, gap: vals[0] - vals[1], k };
}

async function main() {
  const tiny = client(tinyPort);
  // models
  const models = await tiny.models.list();
  check("models.list: the model by --model-name", models.data.length === 1 && models.data[0].id === "tiny");
  // completions at temperature 0 = l3d generate's greedy text
  const greedy = fs.readFileSync(greedyFile, "utf8");
  const plain = await tiny.completions.create({ model: "tiny", prompt: "The GNU General", max_tokens: 40, temperature: 0 });
  check("completions.create at temperature 0 = l3d generate's text",
    "The GNU General" + plain.choices[0].text + "\n" === greedy, JSON.stringify(plain.choices[0].text));
  check("usage and finish_reason", plain.usage.completion_tokens === 40 && plain.usage.prompt_tokens > 0 &&
    plain.choices[0].finish_reason === "length" && plain.object === "text_completion");
  const st = await streamText(tiny, { model: "tiny", prompt: "The GNU General", max_tokens: 40, temperature: 0, stream_options: { include_usage: true } });
  check("streamed = plain, usage present", st.text === plain.choices[0].text && st.usage && st.usage.completion_tokens === 40 && st.finish === "length");

  // 16 concurrent streams, each equal to the same request made alone
  const N = 16, params = (i) => ({ model: "tiny", prompt: `Request number ${i}:`, max_tokens: 24, temperature: 0 });
  const alone = [];
  for (let i = 0; i < N; i++) {
    const r = await tiny.completions.create({ ...params(i), logprobs: 2 });
    alone.push({ text: r.choices[0].text, logprobs: r.choices[0].logprobs });
  }
  const together = await Promise.all([...Array(N).keys()].map((i) => streamText(tiny, params(i))));
  let same = 0, ties = 0, bad = [];
  together.forEach((t, i) => {
    const d = nearTie(alone[i], t.text);
    if (d.same) same++;
    else if (d.gap <= 2 * bound) ties++;
    else bad.push(`#${i} token ${d.k}: gap ${d.gap} > 2 x ${bound}`);
  });
  check(`16 concurrent streams = each alone (${same} equal, ${ties} at a near-tie)`, bad.length === 0, bad.join("; "));

  // client mistakes through the SDK's errors
  await expectError("a bad API key", 401, "invalid_api_key", () => client(tinyPort, "nope").models.list());
  await expectError("temperature 5", 400, "invalid_value", () => tiny.completions.create({ model: "tiny", prompt: "x", temperature: 5 }));
  await expectError("an unknown model", 404, "model_not_found", () => tiny.completions.create({ model: "gpt-4o", prompt: "x" }));
  await expectError("a prompt longer than the context", 400, "context_length_exceeded", () => tiny.completions.create({ model: "tiny", prompt: "a".repeat(3000) }));
  await expectError("a chat without a template", 400, "unsupported", () => tiny.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hi" }] }));
  await expectError("an unknown role", 400, "invalid_value", () => tiny.chat.completions.create({ model: "tiny", messages: [{ role: "wizard", content: "hi" }] }));
  await expectError("n 2", 400, "invalid_value", () => tiny.completions.create({ model: "tiny", prompt: "x", n: 2 }));

  // chat, plain and streamed, over Meta's tokenizer
  if (Number(chatPort)) {
    const chat = client(chatPort);
    const msgs = [{ role: "system", content: "You are terse." }, { role: "user", content: "Name three colours." }];
    const want = fs.readFileSync(chatFile, "utf8");
    const r = await chat.chat.completions.create({ model: "m", messages: msgs, max_tokens: 6, temperature: 0 });
    check("chat.completions.create = l3d generate --chat", r.choices[0].message.content + "\n" === want &&
      r.choices[0].message.role === "assistant" && r.object === "chat.completion", JSON.stringify(r.choices[0].message));
    const s = await chat.chat.completions.create({ model: "m", messages: msgs, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let text = "", usage = null, role = null;
    for await (const ch of s) {
      if (ch.choices.length) {
        text += ch.choices[0].delta.content || "";
        if (ch.choices[0].delta.role) role = ch.choices[0].delta.role;
      }
      if (ch.usage) usage = ch.usage;
    }
    check("chat streamed = plain, role and usage", text === r.choices[0].message.content && role === "assistant" &&
      usage && usage.completion_tokens === r.usage.completion_tokens);
    const lp = await chat.chat.completions.create({ model: "m", messages: msgs, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
    const c = lp.choices[0].logprobs.content;
    check("chat logprobs: each greedy token tops its top_logprobs", c.length > 0 &&
      c.every((e) => e.top_logprobs.length === 2 && Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6));
  }

  // a stream dropped mid-way: the server cancels it (its metrics say so)
  const slow = client(slowPort);
  const ac = new AbortController();
  const s = await slow.completions.create({ model: "slow", prompt: "The", max_tokens: 4000, temperature: 1, stream: true, ignore_eos: true }, { signal: ac.signal });
  let got = 0;
  try {
    for await (const ch of s) { if (++got === 3) ac.abort(); }
  } catch (e) { /* the abort */ }
  let cancelled = false;
  for (let t = 0; t < 50 && !cancelled; t++) {
    const m = await (await fetch(`http://127.0.0.1:${slowPort}/metrics`)).text();
    cancelled = /^l3d_requests_finished_total\{reason="cancelled"\} 1$/m.test(m);
    if (!cancelled) await new Promise((r) => setTimeout(r, 100));
  }
  check(`an aborted stream (after ${got} chunks) is cancelled on the server`, cancelled);
  console.log(`${passes} passed, ${fails} failed`);
  process.exit(fails ? 1 : 0);
}
main().catch((e) => { console.log("FAIL " + (e && e.stack || e)); process.exit(1); });
