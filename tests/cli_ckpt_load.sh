#!/usr/bin/env bash
# Hostile checkpoints through the CLI: a config.json that lies about its files, a model
# dimension past any bound, non-finite weights. Each must exit 2 naming the file and the
# tensor (or the key), before the lie sizes an allocation. Usage: cli_ckpt_load.sh /path/to/l3d
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
fwd() { "$L3D" forward --checkpoint "$1" --tokens 1,2 --out "$tmp/logits"; }

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
expect_error "num_hidden_layers 1e9" "config.json: num_hidden_layers: 1000000000 is more than" fwd "$tmp/huge"

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
expect_error "NaN weight: forward" "$where" fwd "$tmp/nan"
expect_error "NaN weight: generate" "$where" "$L3D" generate --checkpoint "$tmp/nan" --prompt hi --max-tokens 2
expect_error "NaN weight: train --resume" "$where" "$L3D" train --steps 1 --resume "$tmp/nan"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
