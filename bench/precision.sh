#!/usr/bin/env bash
# float32 against bf16.enabled and fp16.enabled on the same run: tokens/s, activation memory,
# peak memory and tp traffic.
# Usage: bench/precision.sh [BUILD_DIR]            (default ./build)
#
# One model (8 layers, hidden 512, ffn 1536, 8 heads of 64, 2 kv heads, vocabulary 264: 25.6M
# parameters) trains for 10 steps (batch 8 = micro 4 x accumulation 2, seq_len 128) as tp 2
# ranks in one process (the embedded default transport, one thread per rank), in three
# variants: float32; bf16.enabled (the weights the passes read, activations and their
# gradients in bfloat16 over float32 masters, weight gradients and optimizer state);
# fp16.enabled (the same in float16, under DeepSpeed's loss scaler).
# Each round runs the three in turn and a variant keeps its best round; tok/s is the median of
# steps 3..10 of rank 0's metrics. "acts MiB" is rank 0's activation memory from `l3d train
# --dry-run` (tests/test_parallel_bf16.c checks the allocation agrees), "peak MiB" the largest
# mem_peak_bytes rank 0 reports, "tp MiB" rank 0's counted tp traffic of the last step.
# Environment: L3D_BENCH_REPS rounds (default 3).
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
BUILD=${1:-./build}
L3D=$BUILD/l3d
REPS=${L3D_BENCH_REPS:-3}
if [ ! -x "$L3D" ]; then
  echo "precision.sh: $L3D not found or not executable (usage: bench/precision.sh [BUILD_DIR])" >&2
  exit 2
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/l3d-precision.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# config NAME EXTRA_JSON: the run's DeepSpeed config with these top-level keys added
config() {
  cat >"$tmp/$1.json" <<EOF
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 100, $2
 "model": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
           "vocab_size": 264, "max_position_embeddings": 1024, "tie_word_embeddings": true,
           "bos_token_id": 256, "eos_token_id": 257},
 "parallel": {"tp": 2}, "train": {"steps": 10, "threads": 1}, "data": {"seq_len": 128}}
EOF
}
VARIANTS=(fp32 bf16 fp16)
declare -A label=([fp32]="float32" [bf16]="bf16.enabled" [fp16]="fp16.enabled (loss-scaled)")
config fp32 ''
config bf16 '"bf16": {"enabled": true},'
config fp16 '"fp16": {"enabled": true},'

. "$(dirname "$0")/rounds.sh"
declare -A acts
for v in "${VARIANTS[@]}"; do
  "$L3D" train --config "$tmp/$v.json" --dry-run >"$tmp/dry.log" 2>&1 ||
    { echo "precision.sh: $v: --dry-run failed:" >&2; cat "$tmp/dry.log" >&2; exit 1; }
  acts[$v]=$(sed -nE 's/.*activations ([0-9.]+) MiB.*/\1/p' "$tmp/dry.log" | head -n 1)
done
bench_rounds precision.sh tp "${VARIANTS[@]}"
echo "| variant | tok/s | vs float32 | acts MiB (dry run) | peak MiB rank 0 | tp MiB per step |"
echo "|---|---|---|---|---|---|"
for v in "${VARIANTS[@]}"; do
  awk -v n="${label[$v]}" -v t="${best[$v]}" -v b="${best[fp32]}" -v a="${acts[$v]}" \
      -v k="${peak[$v]}" -v d="${comm[$v]}" \
      'BEGIN { printf "| %s | %.0f | %.2f | %s | %.1f | %.1f |\n", n, t, t / b, a, k / 1048576, d / 1048576 }'
done
