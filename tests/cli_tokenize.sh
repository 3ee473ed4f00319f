#!/usr/bin/env bash
# l3d tokenize on a small byte-level BPE written here (no node needed): encode, --out, --decode
# round trip, --bos, special tokens, --chat; every bad input exits 2 with a line naming it, a
# failed write exits 1. Usage: cli_tokenize.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok() { echo "ok   $1"; passes=$((passes + 1)); }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

# expect_exit NAME CODE PATTERN CMD...: exit status CODE and stderr matching PATTERN (a hang
# is a failure too: `timeout` only bounds a case that would otherwise never return)
expect_exit() {
  local name=$1 code=$2 pat=$3; shift 3
  timeout 60 "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  if [ $rc -ne "$code" ] || ! grep -qE -e "$pat" "$tmp/err" ||
     [ "$(wc -l <"$tmp/err")" -gt 1 ]; then
    bad "$name: exit $rc, stderr:"; sed 's/^/    /' "$tmp/err" | head -5
  else
    ok "$name: $(head -1 "$tmp/err")"
  fi
}

# A tokenizer: the 256 byte tokens, merges h+e, he+l, l+o, " "+w, and Llama 3's chat tokens.
mkdir "$tmp/tok"
/usr/bin/python3 - "$tmp/tok" "$(dirname "$0")/data/chat_templates/llama3.jinja" <<'PY'
import json, sys
d, tmpl = sys.argv[1], sys.argv[2]
n, sp = 0, {}
for b in range(256):
    keeps = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
    sp[b] = chr(b if keeps else 256 + n)
    if not keeps: n += 1
vocab = {sp[b]: b for b in range(256)}
merges = []
for a, c in (("h", "e"), ("he", "l"), ("l", "o"), (" ", "w")):
    sa, sc = "".join(sp[ord(x)] for x in a), "".join(sp[ord(x)] for x in c)
    vocab[sa + sc] = len(vocab)
    merges.append(sa + " " + sc)
names = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
         "<|eot_id|>"]
added = [{"id": 300 + i, "content": t, "special": True} for i, t in enumerate(names)]
pat = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
       "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
tj = {"added_tokens": added, "normalizer": None,
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False},
          {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
      "decoder": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": True}}
json.dump(tj, open(d + "/tokenizer.json", "w"))
json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
           "chat_template": open(tmpl).read(), "model_max_length": 1e30},
          open(d + "/tokenizer_config.json", "w"))
PY
T="$tmp/tok"

# Encoding: "hello" is hel + lo (ranks: h+e, he+l, l+o); " w" merges; specials become their
# ids; no BOS unless --bos.
got=$(printf 'hello world<|eot_id|>' | "$L3D" tokenize --tokenizer "$T")
[ "$got" = "257 258 259 111 114 108 100 304" ] && ok "encode: $got" || bad "encode: '$got'"
got=$(printf 'he' | "$L3D" tokenize --tokenizer "$T/tokenizer.json" --bos)
[ "$got" = "300 256" ] && ok "--bos: $got" || bad "--bos: '$got'"
printf 'hello <|eot_id|> w\xff!\n' > "$tmp/in.txt"
"$L3D" tokenize --tokenizer "$T" --in "$tmp/in.txt" --out "$tmp/ids.bin" &&
  [ "$(stat -c %s "$tmp/ids.bin")" -eq 32 ] && ok "--out writes 8 uint32" || bad "--out"
"$L3D" tokenize --tokenizer "$T" --decode --in "$tmp/ids.bin" --out "$tmp/back.txt" &&
  cmp -s "$tmp/in.txt" "$tmp/back.txt" && ok "--decode gives the bytes back" ||
  bad "--decode round trip"
echo '[{"role": "user", "content": " hi "}]' > "$tmp/m.json"
got=$("$L3D" tokenize --tokenizer "$T" --chat "$tmp/m.json")
want="300 302 117 115 101 114 303 10 10 104 105 304 302 97 115 115 105 115 116 97 110 116 303 10 10"
[ "$got" = "$want" ] && ok "--chat" || bad "--chat: '$got'"

# Bad input: exit 2, one line naming it.
expect_exit "no --tokenizer" 2 "--tokenizer is required" "$L3D" tokenize --in "$tmp/in.txt"
expect_exit "missing tokenizer" 2 "nope" "$L3D" tokenize --tokenizer "$tmp/nope"
expect_exit "empty directory" 2 "no tokenizer.json or tokenizer.model" "$L3D" tokenize \
  --tokenizer "$tmp/tok/.."
printf '{"model": {"type": "Unigram"}}' > "$tmp/uni.json"
expect_exit "unsupported model" 2 "uni.json: model.type Unigram is not supported" \
  "$L3D" tokenize --tokenizer "$tmp/uni.json"
printf 'abc' > "$tmp/odd.bin"
expect_exit "decode odd length" 2 "odd.bin: 3 bytes is not a whole number" \
  "$L3D" tokenize --tokenizer "$T" --decode --in "$tmp/odd.bin"
printf '\xff\xff\x00\x00' > "$tmp/big.bin"
expect_exit "decode id out of range" 2 "id 65535 at byte 0 is outside the vocabulary" \
  "$L3D" tokenize --tokenizer "$T" --decode --in "$tmp/big.bin"
expect_exit "missing --in" 2 "nothere.txt" "$L3D" tokenize --tokenizer "$T" --in "$tmp/nothere.txt"
echo '[{"role": "user"}]' > "$tmp/m2.json"
expect_exit "chat message without content" 2 "message 1 needs string" \
  "$L3D" tokenize --tokenizer "$T" --chat "$tmp/m2.json"
echo '[{"role": ' > "$tmp/m3.json"
expect_exit "chat syntax error" 2 "m3.json: line" \
  "$L3D" tokenize --tokenizer "$T" --chat "$tmp/m3.json"
mkfifo "$tmp/chat.fifo"
expect_exit "--chat a FIFO: refused at once" 2 "chat.fifo: it is a FIFO" \
  "$L3D" tokenize --tokenizer "$T" --chat "$tmp/chat.fifo"
expect_exit "chat with --bos" 2 "no --in, --decode or --bos" \
  "$L3D" tokenize --tokenizer "$T" --chat "$tmp/m.json" --bos
mkdir "$tmp/other" && cp "$T/tokenizer.json" "$tmp/other/"
echo '{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}' > \
  "$tmp/other/tokenizer_config.json"
expect_exit "unknown chat template" 2 "chat_template is not one llama3d knows" \
  "$L3D" tokenize --tokenizer "$tmp/other" --chat "$tmp/m.json"
# Jinja keeps whitespace outside its tags: a known template plus a trailing space is another
# template, which llama3d cannot render, not the known one.
mkdir "$tmp/trail" && cp "$T/tokenizer.json" "$tmp/trail/"
/usr/bin/python3 - "$T/tokenizer_config.json" "$tmp/trail/tokenizer_config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] += " "
json.dump(c, open(sys.argv[2], "w"))
PY
expect_exit "known chat template + a trailing space" 2 "chat_template is not one llama3d knows" \
  "$L3D" tokenize --tokenizer "$tmp/trail" --chat "$tmp/m.json"
# A tokenizer.json that is JSON but not an object errs as JSON, not as a tiktoken file.
mkdir "$tmp/arr" && echo '[1, 2]' > "$tmp/arr/tokenizer.json"
expect_exit "tokenizer.json a JSON array" 2 "arr/tokenizer.json: not a JSON object" \
  "$L3D" tokenize --tokenizer "$tmp/arr" --in "$tmp/in.txt"
expect_exit "unknown flag" 2 "did you mean '--decode'" "$L3D" tokenize --tokenizer "$T" --decod
# A failed write is a runtime failure: exit 1.
if [ -w /dev/full ]; then
  expect_exit "--out /dev/full" 1 "/dev/full" "$L3D" tokenize --tokenizer "$T" --in "$tmp/in.txt" \
    --out /dev/full
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
