#!/usr/bin/env bash
# Bad input through the CLI: each case must exit 2 with a one-line error naming the problem,
# and never crash. Usage: cli_errors.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0

# expect_error NAME PATTERN CMD...: exit status 2 and stderr matching PATTERN
expect_error() {
  local name=$1 pat=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qE -e "$pat" "$tmp/err"; then
    echo "FAIL $name: exit $rc, stderr:"; sed 's/^/    /' "$tmp/err" | head -5
    fails=$((fails + 1))
  else
    echo "ok   $name: $(head -1 "$tmp/err")"
    passes=$((passes + 1))
  fi
}

expect_error "unknown command" "unknown command 'trian' \(did you mean 'l3d train'\?\)" "$L3D" trian
# llama.cpp's and ollama's word for it: the hint names generate --chat (it gave no hint).
expect_error "unknown command chat" "unknown command 'chat' \(to chat with a model: l3d generate --checkpoint DIR --chat M.json\)" "$L3D" chat
expect_error "unknown command caht" "l3d generate --checkpoint DIR --chat M.json" "$L3D" caht
expect_error "unknown command, nothing near" "unknown command 'xyzzy' \(commands: train, generate" "$L3D" xyzzy
expect_error "a flag where the command goes" "unknown command '--steps' \(flags follow a command, e.g. 'l3d train --steps'" "$L3D" --steps 5
for c in trian chat xyzzy; do
  if [ "$("$L3D" $c 2>&1 | wc -l)" -ne 1 ]; then echo "FAIL unknown command $c: not one line"; fails=$((fails + 1)); fi
done
expect_error "unknown flag with suggestion" "did you mean '--steps'" "$L3D" train --stpes 3
expect_error "missing flag value" "--steps needs a value" "$L3D" train --steps
expect_error "non-integer steps" "--steps: 'ten' is not an integer" "$L3D" train --steps ten
expect_error "unknown preset" "llama3-tiny" "$L3D" train --model llama9-huge --steps 0
expect_error "missing config" "nope.json" "$L3D" train --config "$tmp/nope.json"
echo '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}' > "$tmp/mismatch.json"
expect_error "batch identity mismatch" "8.*3.*2|3.*2.*8" "$L3D" train --config "$tmp/mismatch.json" --steps 0
echo '{"train_batch_sise": 8}' > "$tmp/typo.json"
expect_error "unknown config key" "train_batch_size" "$L3D" train --config "$tmp/typo.json"
echo '{"train_batch_size": 8,' > "$tmp/syntax.json"
expect_error "config syntax error" "syntax.json" "$L3D" train --config "$tmp/syntax.json"
printf 'abc' > "$tmp/odd.bin"
expect_error "bin data of odd length" "odd.bin" "$L3D" train --data "$tmp/odd.bin" --steps 0
printf 'hi' > "$tmp/short.txt"
expect_error "data shorter than a sequence" "short.txt|tokens" "$L3D" train --data "$tmp/short.txt" --steps 1
expect_error "missing checkpoint" "does not exist" "$L3D" forward --checkpoint "$tmp/none" --tokens 1,2 --out "$tmp/x"
expect_error "bad token list" "not a token id" "$L3D" forward --checkpoint "$tmp/none" --tokens 1,x --out "$tmp/x"

# A real checkpoint, then damaged copies of it.
if "$L3D" train --steps 0 --save "$tmp/ck" >"$tmp/out" 2>&1; then
  st="$tmp/ck/model.safetensors"
  mkdir -p "$tmp/trunc" && cp "$tmp/ck/config.json" "$tmp/trunc/"
  head -c 1000 "$st" > "$tmp/trunc/model.safetensors"
  expect_error "truncated safetensors" "model.safetensors" "$L3D" forward --checkpoint "$tmp/trunc" --tokens 1,2 --out "$tmp/x"
  mkdir -p "$tmp/lying" && cp "$tmp/ck/config.json" "$tmp/lying/"
  # header length claims more bytes than the file has
  /usr/bin/python3 - "$st" "$tmp/lying/model.safetensors" <<'PY'
import struct, sys
data = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', data[:8])[0]
open(sys.argv[2], 'wb').write(struct.pack('<Q', n + 10**9) + data[8:])
PY
  expect_error "lying safetensors header" "model.safetensors" "$L3D" forward --checkpoint "$tmp/lying" --tokens 1,2 --out "$tmp/x"
  mkdir -p "$tmp/shape" && cp "$st" "$tmp/shape/"
  sed 's/"num_hidden_layers": *4/"num_hidden_layers": 3/' "$tmp/ck/config.json" > "$tmp/shape/config.json"
  expect_error "checkpoint not matching its config" "model.layers.3" "$L3D" forward --checkpoint "$tmp/shape" --tokens 1,2 --out "$tmp/x"
  sed 's/"hidden_size": *128/"hidden_size": 96/' "$tmp/ck/config.json" > "$tmp/shape/config.json"
  expect_error "tensor shape mismatch" "shape" "$L3D" forward --checkpoint "$tmp/shape" --tokens 1,2 --out "$tmp/x"
  expect_error "token outside vocabulary" "outside the vocabulary" "$L3D" forward --checkpoint "$tmp/ck" --tokens 1,99999 --out "$tmp/x"
else
  echo "FAIL could not write a checkpoint:"; cat "$tmp/out"; fails=$((fails + 1))
fi

# (the id is a JSON string in every answer of l3d serve: checked before anything loads)
expect_error "serve: a model id not UTF-8" "--model-name: the model's id must be 1-255 bytes of UTF-8" "$L3D" serve --checkpoint "$tmp/ck" --port 0 --model-name "$(printf 'a\xffb')"
expect_error "serve: an empty model id" "--model-name: the model's id" "$L3D" serve --checkpoint "$tmp/ck" --port 0 --model-name ''

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
