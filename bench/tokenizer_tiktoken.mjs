// The tiktoken side of bench/tokenizer.sh: OpenAI's tiktoken (Rust as WASM) with Llama 3's
// ranks, special tokens and pattern taken from tokenizer.json; single thread.
//   node tokenizer_tiktoken.mjs NPM_PREFIX TOKENIZER.json TEXT REPEATS
import { createRequire } from 'module';
import fs from 'fs';

const [prefix, tjPath, textPath, repsArg] = process.argv.slice(2);
const require = createRequire(prefix + '/node_modules/');
const { Tiktoken } = require('tiktoken');
const tj = JSON.parse(fs.readFileSync(tjPath, 'utf8'));
const dec = new Map();
let k = 0;
for (let b = 0; b < 256; b++) {
  const keeps = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  dec.set(String.fromCodePoint(keeps ? b : 256 + k++), b);
}
const lines = Object.entries(tj.model.vocab).map(
  ([s, id]) => Buffer.from([...s].map((c) => dec.get(c))).toString('base64') + ' ' + id);
const specials = Object.fromEntries(tj.added_tokens.map((t) => [t.content, t.id]));
const enc = new Tiktoken(lines.join('\n'), specials,
  tj.pre_tokenizer.pretokenizers[0].pattern.Regex);
const text = fs.readFileSync(textPath, 'utf8');
const bytes = Buffer.byteLength(text);
let best = Infinity, n = 0;
for (let r = 0; r < Number(repsArg || 5); r++) {
  const t0 = process.hrtime.bigint();
  n = enc.encode(text, 'all').length;
  const dt = Number(process.hrtime.bigint() - t0) / 1e9;
  if (dt < best) best = dt;
}
console.log(`tiktoken ${n} ids ${bytes} bytes best ${best.toFixed(4)} s ` +
  `${(n / best).toFixed(0)} tokens/s ${(bytes / best / 1e6).toFixed(2)} MB/s`);
enc.free();
