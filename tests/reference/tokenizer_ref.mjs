// The reference side of tests/reference/tokenizer_ref.py, run under node with the packages
// tools/install-deps.sh puts in L3D_NPM_PREFIX:
//   node tokenizer_ref.mjs PREFIX hf MODELS_DIR DOCS.json OUT.json
//       @lenml/tokenizers (a JS port of Hugging Face's tokenizers) encodes each document,
//       special tokens parsed, no BOS: [[ids...], ...]
//   node tokenizer_ref.mjs PREFIX tiktoken MODELS_DIR DOCS.json OUT.json
//       OpenAI's tiktoken (Rust, as WASM) with Llama 3's ranks, specials and pattern
//   node tokenizer_ref.mjs PREFIX chat MODELS_DIR TEMPLATE MESSAGES.json DATE OUT.json
//       apply_chat_template(messages, add_generation_prompt, date_string) with TEMPLATE
import { createRequire } from 'module';
import fs from 'fs';

const [prefix, mode, models, ...rest] = process.argv.slice(2);
const require = createRequire(prefix + '/node_modules/');
const tj = JSON.parse(fs.readFileSync(models + '/tokenizer.json', 'utf8'));
const tc = JSON.parse(fs.readFileSync(models + '/tokenizer_config.json', 'utf8'));

if (mode === 'hf') {
  const { TokenizerLoader } = require('@lenml/tokenizers');
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: tj, tokenizerConfig: tc });
  const docs = JSON.parse(fs.readFileSync(rest[0], 'utf8'));
  const out = docs.map((d) => tok.encode(d, { add_special_tokens: false }));
  fs.writeFileSync(rest[1], JSON.stringify(out));
} else if (mode === 'tiktoken') {
  const { Tiktoken } = require('tiktoken');
  // Hugging Face's byte-to-unicode alphabet, undone: vocabulary strings back to bytes.
  const dec = new Map();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const keeps = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    dec.set(String.fromCodePoint(keeps ? b : 256 + n++), b);
  }
  const lines = [];
  for (const [s, id] of Object.entries(tj.model.vocab)) {
    const bytes = Buffer.from([...s].map((c) => dec.get(c)));
    lines.push(bytes.toString('base64') + ' ' + id);
  }
  const specials = {};
  for (const t of tj.added_tokens) specials[t.content] = t.id;
  const pat = tj.pre_tokenizer.pretokenizers[0].pattern.Regex;
  const enc = new Tiktoken(lines.join('\n'), specials, pat);
  const docs = JSON.parse(fs.readFileSync(rest[0], 'utf8'));
  const out = docs.map((d) => Array.from(enc.encode(d, 'all')));
  enc.free();
  fs.writeFileSync(rest[1], JSON.stringify(out));
} else if (mode === 'chat') {
  const { TokenizerLoader } = require('@lenml/tokenizers');
  const [tmplPath, msgsPath, date, outPath] = rest;
  const cfg = { ...tc, chat_template: fs.readFileSync(tmplPath, 'utf8') };
  const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: tj, tokenizerConfig: cfg });
  const msgs = JSON.parse(fs.readFileSync(msgsPath, 'utf8'));
  const ids = tok.apply_chat_template(msgs, {
    tokenize: true, add_generation_prompt: true, date_string: date,
  });
  fs.writeFileSync(outPath, JSON.stringify(Array.from(ids)));
} else {
  console.error('tokenizer_ref.mjs: unknown mode ' + mode);
  process.exit(2);
}
