#!/usr/bin/env bash
# ZeRO-1/2/3 memory per rank, l3d's dry run beside DeepSpeed's published estimates.
# Usage: bench/zero3_memory.sh [BUILD_DIR]            (default ./build)
#
# For llama3-8b and llama3-70b on 8, 64 and 512 ranks of pure data parallelism (one node of 8
# per 8 ranks), with the seed config's fp16 and zero_optimization sections (fp16 training;
# stage 3: prefetch 1e8, persistence 1e4, max live 1e9; every stage: reduce_bucket_size 1e8)
# and each of DeepSpeed's offload settings (stage 3: both to the cpu, as the seed file,
# optimizer only, none; stages 1-2: optimizer only, none), it prints `l3d train --dry-run`'s
# model-state memory of rank 0 (parameters + gradients + optimizer, device and host;
# activations apart) next to DeepSpeed's estimate: estimate_zero3_model_states_mem_needs
# (deepspeed/runtime/zero/stage3.py) at stage 3, estimate_zero2_model_states_mem_needs
# (deepspeed/runtime/zero/stage_1_and_2.py, which serves stages 1 and 2) below it, both
# documented at deepspeed.readthedocs.io memory.html, with zero_init and
# additional_buffer_factor 1.5; their CPU figure is per node and is divided by 8 here.
# All are fp16 mixed precision: DeepSpeed's formulas count 2-byte parameters and gradients on
# the GPU and partition the fp32 master and both moments (stage 3: the parameters and
# gradients too); llama3d partitions the same and keeps float16 parameters; it accumulates the
# weight gradients in float32 by default and in float16 under data_types.grad_accum_dtype
# "fp16" (DeepSpeed's fp16 gradients): both are printed, the ratio for each, with
# overlap_comm false (the gradient windows' ring as long as the longest bucket: what the
# formulas count), and then fp16 gradients with overlap_comm true (the seed file's, and
# DeepSpeed's stage-3 default: room for two neighbouring buckets, so that each reduces while
# the next fills; DeepSpeed's formulas leave its own double buckets out). The last column, for
# stages 1-2 with the optimizer offloaded (where DeepSpeed's formula counts no gradient at
# all), adds what DeepSpeed's backward allocates at least beyond the formula (its reduction
# bucket, and the whole 16-bit gradient of a parameter longer than the bucket) and gives the
# fp16 ratio against that. Nothing is allocated; the table takes a few seconds.
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
BUILD=${1:-./build}
L3D=$BUILD/l3d
if [ ! -x "$L3D" ]; then
  echo "zero3_memory.sh: $L3D not found (usage: bench/zero3_memory.sh [BUILD_DIR])" >&2
  exit 2
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/l3d-z3mem.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

gib() { awk -v m="$1" 'BEGIN { printf "%.1f", m / 1024 }'; }
echo "| model | ranks | stage | offload | l3d device GiB (params + grads + optim), fp32 / fp16 gradients / fp16 overlap_comm | l3d host GiB | DeepSpeed GPU GiB | DeepSpeed CPU GiB per GPU | device l3d / DeepSpeed, fp32 / fp16 / fp16 overlap_comm | stages 1-2 offloaded: DeepSpeed's backward at least, l3d fp16 / it |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for model in llama3-8b llama3-70b; do
  # total parameters and DeepSpeed's largest layer (the embedding: vocabulary x hidden)
  info=$("$L3D" train --model "$model" --dry-run 2>&1 | sed -nE 's/.*\(([0-9.]+)M parameters: hidden ([0-9]+),.* vocab ([0-9]+).*/\1 \2 \3/p')
  read -r pm hidden vocab <<<"$info"
  for n in 8 64 512; do
    for stage in 3 2 1; do
      offs="both optimizer none"
      [ "$stage" = 3 ] || offs="optimizer none"
      for off in $offs; do
        case $off in
          both) o='"offload_optimizer": {"device": "cpu", "pin_memory": true}, "offload_param": {"device": "cpu", "pin_memory": true},' ;;
          optimizer) o='"offload_optimizer": {"device": "cpu", "pin_memory": true},' ;;
          none) o='' ;;
        esac
        z3=''
        [ "$stage" = 3 ] && z3=', "stage3_prefetch_bucket_size": 1e8, "stage3_param_persistence_threshold": 1e4, "stage3_max_live_parameters": 1e9'
        for v in fp32:false fp16:false fp16:true; do
          g=${v%:*} ov=${v#*:}
          printf '%s\n' "{\"train_batch_size\": $n, \"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1," \
            " \"fp16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": \"$g\"}," \
            " \"zero_optimization\": {\"stage\": $stage, $o \"overlap_comm\": $ov, \"reduce_bucket_size\": 1e8$z3}}" >"$tmp/c.json"
          line=$("$L3D" train --config "$tmp/c.json" --model "$model" --world "$n" --dry-run 2>&1 | grep '^memory')
          [ -n "$line" ] || { echo "zero3_memory.sh: $model on $n ranks, stage $stage: dry run failed" >&2; exit 1; }
          d=$(echo "$line" | sed -nE 's/^memory[^:]*: parameters ([0-9.]+) MiB, gradients ([0-9.]+) MiB, optimizer ([0-9.]+) MiB,.*/\1 \2 \3/p' |
            awk '{ print $1 + $2 + $3 }')
          case $v in
            fp32:false)
              dev=$d
              host=$(echo "$line" | sed -nE 's/.*host memory \(offload\): .* total ([0-9.]+) MiB.*/\1/p') ;;
            fp16:false) dev16=$d ;;
            *) devov=$d ;;
          esac
        done
        ds=$(awk -v pm="$pm" -v h="$hidden" -v v="$vocab" -v n="$n" -v off="$off" -v st="$stage" 'BEGIN {
          P = pm * 1e6; big = h * v; nodes = n / 8; gpus = n
          if (st == 3) {
            if (off == "both") { gpu = 4 * big; cpu = P * 18 / nodes * 1.5 }
            else if (off == "optimizer") { gpu = 4 * big + int(2 * P / gpus); cpu = P * 16 / nodes * 1.5 }
            else { gpu = 4 * big + int(18 * P / gpus); cpu = big * 4 * 8 * 1.5 }
          } else {
            if (off == "optimizer") { gpu = 2 * P; cpu = P * (4 * gpus > 16 ? 4 * gpus : 16) * 1.5 }
            else { gpu = 4 * P + int(16 * P / gpus); cpu = P * 4 * 8 * 1.5 }
          }
          # What the stage 1-2 backward allocates beyond the formula, which counts no gradient
          # once the optimizer is offloaded (stage_1_and_2.py): backward() makes ipg_buffer, one
          # (two with overlap_comm) of reduce_bucket_size 16-bit elements, for the whole
          # backward; a parameter longer than the bucket (extra_large_param_to_reduce) is
          # reduced from the whole 16-bit .grad autograd made, which lives until its reduction
          # (the embedding here, beside the bucket). A floor: fragmentation and the rest aside.
          # (No apostrophes in this awk text: it sits in single quotes.)
          run = gpu
          if (st != 3 && off == "optimizer") run = gpu + 2e8 + 2 * (big > 1e8 ? big : 0)
          printf "%.1f %.1f %.6f %.6f", gpu / 2^30, cpu / 8 / 2^30, gpu / 2^20, run / 2^20 }')
        # (the ratio against DeepSpeed's exact figure, not the GiB printed)
        read -r dsg dsc dsm dsrm <<<"$ds"
        ratio=$(awk -v a="$dev" -v c="$dev16" -v e="$devov" -v b="$dsm" 'BEGIN { printf "%.2f / %.2f / %.2f", a / b, c / b, e / b }')
        runr="-"
        [ "$stage" != 3 ] && [ "$off" = optimizer ] &&
          runr=$(awk -v c="$dev16" -v b="$dsrm" 'BEGIN { printf "%.1f GiB: %.3f", b / 1024, c / b }')
        printf "| %s | %d | %d | %s | %s / %s / %s | %s | %s | %s | %s | %s |\n" "$model" "$n" "$stage" "$off" \
          "$(gib "$dev")" "$(gib "$dev16")" "$(gib "$devov")" "$(gib "${host:-0}")" "$dsg" "$dsc" "$ratio" "$runr"
      done
    done
  done
done
