#!/usr/bin/env bash
# Hostile checkpoints through the CLI: a config.json that lies about its files, a model
# dimension past any bound, non-finite weights, files that are not regular files (a FIFO, a
# device, a directory, a symlink loop). Each must exit 2 naming the file and the tensor, the
# key or what the file is, before the lie sizes an allocation, and without blocking.
# Usage: cli_ckpt_load.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0

# expect_error NAME PATTERN CMD...: exit status 2 and stderr matching PATTERN. A hang is a
# failure too: `timeout` only bounds a case that would otherwise never return.
expect_error() {
  local name=$1 pat=$2; shift 2
  timeout 120 "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qE -e "$pat" "$tmp/err"; then
    echo "FAIL $name: exit $rc, stderr:"; sed 's/^/    /' "$tmp/err" | tail -5
    fails=$((fails + 1))
  else
    echo "ok   $name: $(head -1 "$tmp/err")"
    passes=$((passes + 1))
  fi
}

if ! "$L3D" train --steps 0 --save "$tmp/ck" >"$tmp/out" 2>&1; then
  echo "FAIL could not write a checkpoint:"; cat "$tmp/out"; exit 1
fi
fwd=("$L3D" forward --tokens 1,2 --out "$tmp/logits" --checkpoint)  # then the directory

# 10,000 layers claimed over a 4-layer file: 8 GB of weights. Refused from the headers, so
# it fits a 3 GiB address space (before, it was allocated and filled: killed or exit 1).
mkdir -p "$tmp/lie" && cp "$tmp/ck/model.safetensors" "$tmp/lie/"
sed 's/"num_hidden_layers": *4/"num_hidden_layers": 10000/' "$tmp/ck/config.json" > "$tmp/lie/config.json"
expect_error "config.json lies about the layers" \
  "lie/model.safetensors: tensor 'model.layers.4.input_layernorm.weight' is missing" \
  bash -c 'ulimit -v 3145728; exec "$@"' _ "$L3D" forward --checkpoint "$tmp/lie" --tokens 1,2 --out "$tmp/logits"

# A dimension past any bound is refused when config.json is read, naming the key.
mkdir -p "$tmp/huge" && cp "$tmp/ck/model.safetensors" "$tmp/huge/"
sed 's/"num_hidden_layers": *4/"num_hidden_layers": 1e9/' "$tmp/ck/config.json" > "$tmp/huge/config.json"
expect_error "num_hidden_layers 1e9" "config.json: num_hidden_layers: 1000000000 is more than" \
  "${fwd[@]}" "$tmp/huge"

# One NaN in layer 1's q_proj: every command that loads weights names the place.
cp -r "$tmp/ck" "$tmp/nan"
/usr/bin/python3 - "$tmp/nan/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
t = json.loads(b[8:8 + n])['model.layers.1.self_attn.q_proj.weight']
off = 8 + n + t['data_offsets'][0] + 4 * (3 * 128 + 5)
b[off:off + 4] = struct.pack('<f', float('nan'))
open(p, 'wb').write(b)
PY
where="nan/model.safetensors: tensor 'model.layers.1.self_attn.q_proj.weight' holds nan at element 389 \(row 3, column 5\)"
expect_error "NaN weight: forward" "$where" "${fwd[@]}" "$tmp/nan"
expect_error "NaN weight: generate" "$where" "$L3D" generate --checkpoint "$tmp/nan" --prompt hi --max-tokens 2
expect_error "NaN weight: train --resume" "$where" "$L3D" train --steps 1 --resume "$tmp/nan"

# Files that are not regular files, wherever a checkpoint has them: every command that reads
# the file refuses it at once (a FIFO without a writer would block a plain open forever),
# naming the file and what it is.
# every_cmd NAME PATTERN DIR: forward, generate and train --model on DIR
every_cmd() {
  local name=$1 pat=$2 dir=$3
  expect_error "$name: forward" "$pat" "${fwd[@]}" "$dir"
  expect_error "$name: generate" "$pat" "$L3D" generate --checkpoint "$dir" --prompt hi --max-tokens 2
  expect_error "$name: train --model" "$pat" \
    "$L3D" train --model "$dir" --steps 1 --seq-len 32 --threads 1
}
# sharded DIR: the weights as an index and one shard, as transformers writes larger models
shard=model-00001-of-00001.safetensors
sharded() {
  mkdir -p "$1" && cp "$tmp/ck/config.json" "$1/"
  /usr/bin/python3 - "$tmp/ck/model.safetensors" "$1/model.safetensors.index.json" "$shard" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read(8)
h = json.loads(open(sys.argv[1], 'rb').read(8 + struct.unpack('<Q', b)[0])[8:])
wm = {k: sys.argv[3] for k in h if k != '__metadata__'}
json.dump({"metadata": {}, "weight_map": wm}, open(sys.argv[2], 'w'))
PY
}
sharded "$tmp/sh" && cp "$tmp/ck/model.safetensors" "$tmp/sh/$shard"
# The cases below differ from this one, which loads, by their one file.
if "${fwd[@]}" "$tmp/sh" >"$tmp/out" 2>&1; then
  echo "ok   a sharded checkpoint loads"; passes=$((passes + 1))
else
  echo "FAIL a sharded checkpoint does not load:"; sed 's/^/    /' "$tmp/out" | tail -5
  fails=$((fails + 1))
fi

mkdir -p "$tmp/fifo_index" && cp "$tmp/ck/config.json" "$tmp/fifo_index/"
mkfifo "$tmp/fifo_index/model.safetensors.index.json"
every_cmd "index a FIFO" "fifo_index/model.safetensors.index.json: it is a FIFO" "$tmp/fifo_index"
sharded "$tmp/fifo_shard" && mkfifo "$tmp/fifo_shard/$shard"
every_cmd "shard a FIFO" "fifo_shard/$shard: it is a FIFO" "$tmp/fifo_shard"
sharded "$tmp/zero_shard" && ln -s /dev/zero "$tmp/zero_shard/$shard"
every_cmd "shard a symlink to /dev/zero" "zero_shard/$shard: it is a character device" \
  "$tmp/zero_shard"
sharded "$tmp/dir_shard" && mkdir "$tmp/dir_shard/$shard"
every_cmd "shard a directory" "dir_shard/$shard: it is a directory" "$tmp/dir_shard"
sharded "$tmp/loop_shard" && ln -s loop "$tmp/loop_shard/$shard" && ln -s "$shard" "$tmp/loop_shard/loop"
every_cmd "shard a symlink loop" "loop_shard/$shard: it is a symlink loop" "$tmp/loop_shard"
# model.safetensors a loop: before, train --model took the directory for one without weights
# and trained from scratch.
mkdir -p "$tmp/loop_weights" && cp "$tmp/ck/config.json" "$tmp/loop_weights/"
ln -s model.safetensors "$tmp/loop_weights/model.safetensors"
every_cmd "model.safetensors a symlink loop" "loop_weights/model.safetensors: it is a symlink loop" \
  "$tmp/loop_weights"

# tokenizer_config.json may be absent, but one that is there and not a regular file is refused,
# not taken for absent (forward reads no tokenizer).
# A byte-level BPE with the 256 byte tokens and two specials: fits llama3-tiny's 264 ids, so
# that without its config the directory loads.
cp -r "$tmp/ck" "$tmp/tcfg"
/usr/bin/python3 - "$tmp/tcfg/tokenizer.json" <<'PY'
import json, sys
n, vocab = 0, {}
for b in range(256):
    keeps = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
    vocab[chr(b if keeps else 256 + n)] = b
    n += not keeps
added = [{"id": 256 + i, "content": t, "special": True}
         for i, t in enumerate(["<|begin_of_text|>", "<|end_of_text|>"])]
json.dump({"added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": []}}, open(sys.argv[1], "w"))
PY
"$L3D" generate --checkpoint "$tmp/tcfg" --prompt hi --max-tokens 2 >"$tmp/out" 2>&1 ||
  { echo "FAIL the tokenizer does not load:"; sed 's/^/    /' "$tmp/out" | tail -3; fails=$((fails + 1)); }
mkfifo "$tmp/tcfg/tokenizer_config.json"
pat="tcfg/tokenizer_config.json: it is a FIFO"
expect_error "tokenizer_config.json a FIFO: generate" "$pat" \
  "$L3D" generate --checkpoint "$tmp/tcfg" --prompt hi --max-tokens 2
expect_error "tokenizer_config.json a FIFO: train --model" "$pat" \
  "$L3D" train --model "$tmp/tcfg" --steps 1 --seq-len 32 --threads 1
expect_error "tokenizer_config.json a FIFO: tokenize" "$pat" "$L3D" tokenize --tokenizer "$tmp/tcfg"

# A chat file and trainer_state.json that are FIFOs (tokenize --chat: cli_tokenize.sh).
mkfifo "$tmp/chat.fifo"
expect_error "--chat a FIFO: generate" "chat.fifo: it is a FIFO" \
  "$L3D" generate --checkpoint "$tmp/ck" --chat "$tmp/chat.fifo" --max-tokens 2
cp -r "$tmp/ck" "$tmp/state" && rm "$tmp/state/trainer_state.json"
mkfifo "$tmp/state/trainer_state.json"
expect_error "trainer_state.json a FIFO: train --resume" "state/trainer_state.json: it is a FIFO" \
  "$L3D" train --steps 1 --seq-len 32 --threads 1 --resume "$tmp/state"

# The checkpoint directory itself: what it is instead, not "no such directory".
ln -s loop_b "$tmp/loop_a" && ln -s loop_a "$tmp/loop_b"
for c in "generate --prompt x --checkpoint" "forward --tokens 1 --out $tmp/o.bin --checkpoint" \
         "train --steps 1 --seq-len 32 --threads 1 --resume"; do
  # shellcheck disable=SC2086
  expect_error "${c%% *} on a FIFO as the checkpoint" "chat.fifo: it is a FIFO \(named pipe\), not a directory" \
    "$L3D" $c "$tmp/chat.fifo"
  # shellcheck disable=SC2086
  expect_error "${c%% *} on a symlink loop as the checkpoint" "loop_a: it is a symlink loop" \
    "$L3D" $c "$tmp/loop_a"
  # shellcheck disable=SC2086
  expect_error "${c%% *} on a missing checkpoint" "nothere: it does not exist" \
    "$L3D" $c "$tmp/nothere"
done

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
