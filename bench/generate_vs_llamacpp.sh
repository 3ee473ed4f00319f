#!/usr/bin/env bash
# generate_vs_llamacpp.sh: `l3d generate` beside llama.cpp's llama-bench on the same F32
# weights: prompt processing and decode tokens/s at 1 and 2 threads, and peak RSS.
#
#   bash bench/generate_vs_llamacpp.sh LLAMA_CPP_DIR [BUILD_DIR]    (default ./build)
#
# LLAMA_CPP_DIR is a llama.cpp checkout built beside us (never committed), with
# LLAMA_CPP_DIR/build/bin/llama-bench, e.g.
#   cmake -S DIR -B DIR/build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF &&
#   cmake --build DIR/build --target llama-bench      (about 45 min on a busy 2-core machine)
# Without one the script prints one line saying it skipped, and exits 0.
#
# What runs:
# 1. `l3d train --model CONFIG --steps 0 --save CK` writes random F32 weights of a Llama 3
#    shape (default: 58.7M parameters, hidden 384, 6 layers, 6 heads / 2 kv heads of 64,
#    intermediate 1024, vocabulary 128256, tied; GVL_MODEL=FILE.json gives another);
#    GVL_DTYPE=bf16 writes them in BF16 (l3d keeps them in bfloat16 with --dtype auto, the
#    default; GVL_L3D_DTYPE=bfloat16 passes --dtype bfloat16: bfloat16 products, as llama.cpp).
# 2. bench/gguf_from_hf.py writes CK as GGUF F32 (BF16 matrices under GVL_DTYPE=bf16) with the
#    checkout's gguf-py (/usr/bin/python3 and numpy; the q/k rows permuted as llama.cpp's
#    converter does).
# 3. For each thread count in GVL_THREADS (default "1 2"):
#    REPS rounds (GVL_REPS, default 5), each running the two tools in turn:
#    - llama-bench -p PROMPT -n GEN -t N -r 1 -o json: its pp and tg figures (it warms up first);
#    - `l3d generate`, L3D_NUM_THREADS=N, GEN tokens greedy, twice: with a
#      PROMPT-token prompt (BOS + PROMPT-1 bytes of the byte tokenizer) for the prompt figure,
#      and with a 2-token prompt for the decode figure (llama-bench's tg runs from an empty
#      context), from the closing lines;
#    each under /usr/bin/time -v for the peak RSS. Each side reports its best round (tokens/s)
#    and its largest peak RSS.
#    PROMPT = GVL_PROMPT (256), GEN = GVL_GEN (128).
# Output: progress on stderr, one markdown table on stdout:
#   | threads | measure | llama.cpp | llama3d | ratio |   ratio = llama3d / llama.cpp
# (for RSS a ratio below 1 is better, for tokens/s above 1).
#
# Both sides decode from (nearly) an empty context. llama-bench warms up before it measures;
# `l3d generate` measures its first prompt pass in a fresh process, as a user sees it.
# llama.cpp keeps its KV cache in f16 by default, llama3d in f32.
set -u -o pipefail

case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
LLAMA=${1:-}
BUILD=${2:-./build}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3
PROMPT=${GVL_PROMPT:-256}
GEN=${GVL_GEN:-128}
REPS=${GVL_REPS:-5}
THREADS=${GVL_THREADS:-1 2}

. "$HERE/llamacpp_weights.sh"
llamacpp_setup generate_vs_llamacpp llama-bench
LB=$LLAMA_TOOL
[ -x /usr/bin/time ] || die "needs GNU time (/usr/bin/time) for the peak RSS"
for v in "$PROMPT" "$GEN" "$REPS"; do [[ $v =~ ^[1-9][0-9]*$ ]] || die "GVL_PROMPT, GVL_GEN, GVL_REPS must be positive integers"; done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
L3D=$(cd "$(dirname "$BUILD/l3d")" && pwd)/l3d

# 1. the weights (bench/llamacpp_weights.sh)
WEIGHTS_DTYPE=${GVL_DTYPE:-f32} llamacpp_weights generate_vs_llamacpp "${GVL_MODEL:-}" "$tmp"

# A prompt of PROMPT tokens for the byte tokenizer: BOS + PROMPT-1 printable bytes.
prompt=$("$PY" -c 'import sys; s = "The quick brown fox jumps over the lazy dog. " * 100; print(s[:int(sys.argv[1]) - 1], end="")' "$PROMPT")

rss_kib() { awk -F: '/Maximum resident set size/ { gsub(/ /, "", $2); print $2 }' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }'; }

echo "| threads | measure | llama.cpp | llama3d | ratio |"
echo "|---|---|---|---|---|"
best() { awk -v a="$1" -v b="$2" 'BEGIN { print (b > a ? b : a) }'; }
for t in $THREADS; do
  echo "generate_vs_llamacpp: $t thread(s), $REPS rounds of llama-bench -r 1 then l3d generate" >&2
  lc_pp=0 lc_tg=0 lc_rss=0 l3_pp=0 l3_tg=0 l3_rss=0 produced=0
  # Rounds alternate the two tools, so a shift in the machine's memory bandwidth (a VM's
  # neighbours) lands on both sides; each side reports its best round.
  for r in $(seq "$REPS"); do
    /usr/bin/time -v "$LB" -m "$tmp/model.gguf" -p "$PROMPT" -n "$GEN" -t "$t" -r 1 -o json \
      >"$tmp/lb.json" 2>"$tmp/lb.err" || { tail -5 "$tmp/lb.err" >&2; die "llama-bench failed"; }
    read -r pp tg < <("$PY" - "$tmp/lb.json" <<'EOF2'
import json, sys
rows = json.loads(open(sys.argv[1]).read())
pp = [r["avg_ts"] for r in rows if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
tg = [r["avg_ts"] for r in rows if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
print("%.2f %.2f" % (pp[0] if pp else 0, tg[0] if tg else 0))
EOF2
    )
    lc_pp=$(best "$lc_pp" "$pp") lc_tg=$(best "$lc_tg" "$tg") lc_rss=$(best "$lc_rss" "$(rss_kib "$tmp/lb.err")")
    # As llama-bench's two tests: the prompt figure from a PROMPT-token prompt, the decode
    # figure from GEN tokens after a 2-token prompt (BOS and one byte: as near an empty context
    # as the byte tokenizer allows).
    for run in pp tg; do
      p=$prompt
      [ "$run" = tg ] && p=T
      L3D_NUM_THREADS=$t /usr/bin/time -v "$L3D" generate --checkpoint "$tmp/ck" --prompt "$p" \
        --dtype "${GVL_L3D_DTYPE:-auto}" \
        --max-tokens "$GEN" --temperature 0 >/dev/null 2>"$tmp/l3.err" ||
        { tail -5 "$tmp/l3.err" >&2; die "l3d generate failed"; }
      line=$(grep "^l3d generate: .*prompt [0-9]* tokens in" "$tmp/l3.err")
      read -r pp n tg < <(echo "$line" | sed -E 's/.*\(([0-9.]+) tokens\/s\), ([0-9]+) tokens in [0-9.]+ s \(([0-9.]+) tokens\/s\).*/\1 \2 \3/')
      if [ "$run" = pp ]; then
        l3_pp=$(best "$l3_pp" "$pp")
      else
        produced=$n l3_tg=$(best "$l3_tg" "$tg")
      fi
      l3_rss=$(best "$l3_rss" "$(rss_kib "$tmp/l3.err")")
    done
  done
  [ "$produced" -eq "$GEN" ] || echo "generate_vs_llamacpp: note: l3d generate stopped at $produced tokens (end of text)" >&2
  echo "| $t | prompt $PROMPT tokens/s | $lc_pp | $l3_pp | $(ratio "$l3_pp" "$lc_pp") |"
  echo "| $t | decode $GEN tokens/s | $lc_tg | $l3_tg | $(ratio "$l3_tg" "$lc_tg") |"
  echo "| $t | peak RSS MiB | $((lc_rss / 1024)) | $((l3_rss / 1024)) | $(ratio "$l3_rss" "$lc_rss") |"
done
