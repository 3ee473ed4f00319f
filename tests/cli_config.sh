#!/usr/bin/env bash
# l3d train's configuration as a user meets it: the batch identity checked once (after the
# file, the flags and the launcher's world), --model and --seq-len against the file's
# seq_len, --dry-run refusing what the run refuses, DeepSpeed's two spellings of a key
# agreeing, the DeepSpeed spelling --deepspeed_config, --resume without --model, the start-up
# summary's schedule, and bad L3D_* environment values named. Every case takes a second or two.
# Usage: cli_config.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | head -20; done; fails=$((fails + 1)); }
export L3D_COMM_TIMEOUT=60
data="$(dirname "$0")/data"

# expect NAME RC PATTERN CMD...: exit status RC ("nz": any failure, for l3d launch, which
# reports a failed rank its own way) and stdout+stderr matching PATTERN
expect() {
  local name=$1 want=$2 pat=$3; shift 3
  "$@" >"$tmp/out" 2>&1
  local rc=$? good=0
  if [ "$want" = nz ]; then [ $rc -ne 0 ] && good=1; else [ $rc -eq "$want" ] && good=1; fi
  if [ $good = 1 ] && grep -qE -e "$pat" "$tmp/out"; then ok "$name"; else fail "$name (exit $rc, want $want)" "$tmp/out"; fi
}

# ---- the batch identity: once, with the final dp ------------------------------------------
# The seed file on 8 ranks: the one message is about dp 8, and its fix then runs (before, the
# file was checked at dp 1 first, and the fix it gave failed with "dp 1 (= 4)").
expect "seed batch on 8 ranks: one message about dp 8" nz \
  "ds_config_seed.json: train_batch_size 32 != train_micro_batch_size_per_gpu 4 \* gradient_accumulation_steps 8 \* dp 8 \(= 256\); set gradient_accumulation_steps to 1" \
  "$L3D" launch -n 8 -- "$L3D" train --config "$data/ds_config_seed.json" --dry-run
sed 's/"gradient_accumulation_steps": 8/"gradient_accumulation_steps": 1/' \
  "$data/ds_config_seed.json" >"$tmp/seed_fixed.json"
expect "the suggested fix runs on 8 ranks" 0 "batch 32 = micro 4 x accumulation 1 x dp 8" \
  "$L3D" launch -n 8 -- "$L3D" train --config "$tmp/seed_fixed.json" --dry-run
# --world N: the same dry run without launching anything, and the same rank 0 memory line.
expect "--world 8 --dry-run: the launched job's layout" 0 "batch 32 = micro 4 x accumulation 1 x dp 8" \
  "$L3D" train --config "$tmp/seed_fixed.json" --world 8 --dry-run
"$L3D" launch -n 8 -- "$L3D" train --config "$data/ds_config_seed.json" --model llama3-8b --tp 2 --pp 4 \
  --dry-run 2>&1 | sed -n "s/^\[rank 0\] \(memory rank 0 \)/\1/p" >"$tmp/mem_launch"
"$L3D" train --config "$data/ds_config_seed.json" --model llama3-8b --tp 2 --pp 4 --world 8 --dry-run 2>&1 |
  grep "^memory rank 0 " >"$tmp/mem_world"
if [ -s "$tmp/mem_world" ] && cmp -s "$tmp/mem_launch" "$tmp/mem_world"; then
  ok "--world 8: the seed config with llama3-8b tp 2 x pp 4: rank 0's memory line as under l3d launch -n 8"
else
  fail "--world 8 memory line differs from the launched one" "$tmp/mem_launch" "$tmp/mem_world"
fi
expect "--world without --dry-run: exit 2" 2 "--world is for --dry-run" \
  "$L3D" train --world 8 --steps 1
expect "--world 6 with tp 4: the world's message" 2 "dp 1 x tp 4 x pp 1 = 4 ranks, but the world has 6" \
  "$L3D" train --tp 4 --dp 1 --world 6 --dry-run
echo '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}' >"$tmp/dp2.json"
expect "--dp 2 with a file whose batch holds for dp 2" 0 "batch 32 = micro 4 x accumulation 4 x dp 2" \
  "$L3D" train --config "$tmp/dp2.json" --dp 2 --dry-run
expect "--dp 4 with that file names dp 4 and the fix" 2 \
  "dp 4 \(= 64\); set gradient_accumulation_steps to 2" \
  "$L3D" train --config "$tmp/dp2.json" --dp 4 --dry-run

# ---- --model and --seq-len are read with the file, then checked once ------------------------
# A file's data.seq_len 4096 was checked against the default model (llama3-tiny, 1024
# positions) before --model was applied, and before --seq-len could replace it.
echo '{"data": {"seq_len": 4096}}' >"$tmp/seq4096.json"
expect "--model llama3-8b with the file's seq_len 4096" 0 "seq_len 4096 -> 32768 tokens" \
  "$L3D" train --config "$tmp/seq4096.json" --model llama3-8b --dry-run
expect "--seq-len 512 replaces the file's seq_len 4096" 0 "seq_len 512" \
  "$L3D" train --config "$tmp/seq4096.json" --seq-len 512 --dry-run
expect "the file's seq_len 4096 on llama3-tiny is still refused" 2 \
  "data.seq_len: 4096 must be in \[1, max_position_embeddings 1024\]" \
  "$L3D" train --config "$tmp/seq4096.json" --dry-run
echo '{"model": "llama3-8b", "data": {"seq_len": 4096}}' >"$tmp/m8b.json"
expect "--model llama3-tiny over a file's llama3-8b refuses its seq_len 4096" 2 \
  "max_position_embeddings 1024" \
  "$L3D" train --config "$tmp/m8b.json" --model llama3-tiny --dry-run

# ---- --dry-run refuses what the run refuses, with the same message --------------------------
for bad in "--tp 3" "--pp 5"; do
  "$L3D" train $bad --steps 1 >"$tmp/run" 2>&1; rrc=$?
  "$L3D" train $bad --dry-run >"$tmp/dry" 2>&1; drc=$?
  if [ $drc -eq 2 ] && [ $rrc -eq 2 ] && [ "$(tail -n 1 "$tmp/dry")" = "$(tail -n 1 "$tmp/run")" ]; then
    ok "--dry-run $bad: exit 2, the run's message ($(tail -n 1 "$tmp/dry"))"
  else
    fail "--dry-run $bad (dry exit $drc, run exit $rrc)" "$tmp/dry" "$tmp/run"
  fi
done

# A launched world that is not dp x tp x pp: the dry run says so as the run does.
"$L3D" launch -n 2 -- "$L3D" train --dp 4 --steps 1 >"$tmp/run" 2>&1; rrc=$?
"$L3D" launch -n 2 -- "$L3D" train --dp 4 --dry-run >"$tmp/dry" 2>&1; drc=$?
msg="dp 4 x tp 1 x pp 1 = 4 ranks, but the world has 2"
if [ $drc -ne 0 ] && [ $rrc -ne 0 ] && grep -q "$msg" "$tmp/dry" && grep -q "$msg" "$tmp/run"; then
  ok "--dry-run on 2 launched ranks with --dp 4: the run's message"
else
  fail "--dry-run world mismatch (dry exit $drc, run exit $rrc)" "$tmp/dry" "$tmp/run"
fi

# ---- DeepSpeed's two spellings of one key must agree ----------------------------------------
# stage3_gather_fp16_weights_on_model_save is the old name of ..._16bit_...: true and false
# were taken without a word (the true one won).
gather() {
  echo "{\"zero_optimization\": {\"stage\": 3, \"stage3_gather_16bit_weights_on_model_save\": $1,
        \"stage3_gather_fp16_weights_on_model_save\": $2}}" >"$tmp/gather.json"
}
gather true false
expect "gather 16bit true with fp16 false: exit 2 naming both" 2 \
  "stage3_gather_16bit_weights_on_model_save true and its old spelling stage3_gather_fp16_weights_on_model_save false" \
  "$L3D" train --config "$tmp/gather.json" --dry-run
gather false true
expect "gather 16bit false with fp16 true: exit 2" 2 "contradict each other" \
  "$L3D" train --config "$tmp/gather.json" --dry-run
gather true true
expect "gather 16bit and fp16 both true: taken" 0 "zero stage 3" \
  "$L3D" train --config "$tmp/gather.json" --dry-run

# ---- DeepSpeed's spelling of --config ------------------------------------------------------
expect "--deepspeed_config FILE is --config FILE" 0 "batch 16 = micro 2 x accumulation 4 x dp 2" \
  "$L3D" train --deepspeed_config "$data/ds_full.json" --dry-run
expect "--deepspeed_config=FILE too" 0 "batch 16 = micro 2 x accumulation 4 x dp 2" \
  "$L3D" train --deepspeed_config="$data/ds_full.json" --dry-run
expect "--help lists --deepspeed_config" 0 "--deepspeed_config FILE" "$L3D" train --help
expect "--config and --deepspeed_config naming different files" 2 "give one" \
  "$L3D" train --config "$data/ds_full.json" --deepspeed_config "$tmp/dp2.json" --dry-run

# ---- the start-up summary's schedule comes from the optimizer's lr --------------------------
# ds_full.json: AdamW lr 3e-4, WarmupCosineLR with warmup_min_ratio 0.1 and cos_min_ratio 0.01
# (it printed "0 -> 0.001", DeepSpeed's warmup_min_lr/max_lr defaults, which cosine ignores).
expect "WarmupCosineLR summary from the optimizer's lr" 0 \
  "schedule WarmupCosineLR \(3e-05 -> 0.0003 over 10 warmup steps, linear, then cosine to 3e-06 at step 100\)" \
  "$L3D" train --config "$data/ds_full.json" --dry-run

# ---- bad L3D_* values: exit 2 naming the variable and what it takes -------------------------
# L3D_DEVICE=gpu was ignored (the run went on on the cpu); L3D_COMM_TIMEOUT=nan passed the
# range check and failed later in the bootstrap without naming the variable.
for kv in "L3D_DEVICE=gpu:L3D_DEVICE: 'gpu' is not a device of this build \(valid: cpu" \
          "L3D_COMM_TIMEOUT=nan:L3D_COMM_TIMEOUT: 'nan'" \
          "L3D_COMM_TIMEOUT=inf:L3D_COMM_TIMEOUT: 'inf'" \
          "L3D_NUM_THREADS=nan:L3D_NUM_THREADS: 'nan'" \
          "L3D_COMM_MAX_MSG=nan:L3D_COMM_MAX_MSG: 'nan'" \
          "L3D_PROGRESS_AFTER=-1:L3D_PROGRESS_AFTER: '-1' is not a number of seconds >= 0" \
          "L3D_STAGE_CHUNK=100:L3D_STAGE_CHUNK: '100' is not 0 or a byte count >= 256" \
          "L3D_STAGE_CHUNK=4Q:L3D_STAGE_CHUNK: '4Q' is not 0 or a byte count" \
          "L3D_CPU_BF16=fast:L3D_CPU_BF16: 'fast' is not auto, amx, avx512 or off" \
          "L3D_LOCAL_DEVICE_BUFFERS=yes:L3D_LOCAL_DEVICE_BUFFERS: 'yes' is not 0 or 1" \
          "L3D_TRANSPORT=tcp:L3D_TRANSPORT: 'tcp' is not a transport of this build \(valid: "; do
  expect "${kv%%:*}: exit 2 naming the variable" 2 "^llama3d: ${kv#*:}" env "${kv%%:*}" "$L3D" train --dry-run
  if [ "$(wc -l <"$tmp/out")" -ne 1 ]; then fail "${kv%%:*}: one line" "$tmp/out"; fi
done
expect "L3D_DEVICE=cpu is taken" 0 "device cpu" env L3D_DEVICE=cpu "$L3D" train --dry-run

# ---- --device: the device by name; the CUDA device without a GPU is exit 2 naming it, at once ---
expect "--device cpu-async is taken" 0 "device cpu-async" "$L3D" train --device cpu-async --dry-run
expect "--device gpu: exit 2 listing the built devices" 2 "'gpu' is not a device of this build" \
  "$L3D" train --device gpu --steps 1
if "$L3D" train --device cuda --dry-run 2>&1 | grep -q "not a device of this build"; then
  echo "skip --device cuda: the CUDA device is not built"
elif nvidia-smi -L >/dev/null 2>&1; then
  expect "--device cuda trains on the GPU" 0 "done: 1 step" timeout 120 "$L3D" train --device cuda --steps 1
else
  expect "--device cuda without a GPU: exit 2 naming it" 2 "cuda: no GPU: " \
    timeout 60 "$L3D" train --device cuda --steps 1
fi

# ---- L3D_CPU_BF16: a level the CPU has trains bf16; one it lacks is exit 2 naming its best ----
printf '{"bf16": {"enabled": true}}' >"$tmp/bf16.json"
for lv in off avx512 amx; do
  flag=$lv; [ $lv = avx512 ] && flag=avx512_bf16; [ $lv = amx ] && flag=amx_bf16
  if [ $lv = off ] || grep -qw $flag /proc/cpuinfo; then
    expect "L3D_CPU_BF16=$lv: bf16.enabled trains" 0 "done: 2 steps" \
      env L3D_CPU_BF16=$lv "$L3D" train --config "$tmp/bf16.json" --steps 2
  else
    expect "L3D_CPU_BF16=$lv on a CPU without it: exit 2 naming the CPU's best" 2 \
      "L3D_CPU_BF16=$lv: this CPU's best is" env L3D_CPU_BF16=$lv "$L3D" train --steps 1
  fi
done

# ---- OpenBLAS's kernels: this CPU's own, never a fallback older than it runs ----------------
# A DYNAMIC_ARCH OpenBLAS that does not know the CPU runs SSE3 "Prescott" kernels (Debian 12's
# 0.3.21 on Emerald Rapids: sgemm 6x slower); l3d then restarts itself with OPENBLAS_CORETYPE
# naming the set the CPU runs (cli/main.c). A set the caller forces is kept.
expect "--version names the OpenBLAS kernels a caller forces" 0 "^cpu device: OpenBLAS Haswell kernels$" \
  env OPENBLAS_CORETYPE=Haswell "$L3D" --version
core=$(env -u OPENBLAS_CORETYPE "$L3D" --version | sed -n 's/^cpu device: OpenBLAS \(.*\) kernels$/\1/p')
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  case $core in
    "" | Prescott | Core2 | Penryn | Nehalem | Atom | Sandybridge | Bulldozer | Piledriver)
      echo "FAIL an AVX2 CPU runs OpenBLAS's '$core' kernels when nothing forces them"; fails=$((fails + 1)) ;;
    *) ok "an AVX2 CPU runs AVX2 or AVX-512 OpenBLAS kernels unforced ($core)" ;;
  esac
else
  echo "skip the OpenBLAS kernel check: this CPU has no AVX2"
fi

if [ $fails -ne 0 ]; then echo "$fails failed, $passes passed"; exit 1; fi
echo "all $passes passed"
