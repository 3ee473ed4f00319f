#!/usr/bin/env bash
# Tensor-parallel modes side by side (parallel.tp_mode): Megatron's 1d split, 2d SUMMA on a
# q x q grid and the 3d cube, pairwise at the same tp size, measured here: bytes and calls per
# step on the tp group (rank 0's last step, from the metrics JSONL; 2d and 3d count their grid
# or cube communicators there) and the median step time of steps 3..N, with the second
# mode's ratio to the first.
# Usage: bench/tp_modes.sh [BUILD_DIR]     (default ./build)
#
# Measured pairs: tp 4 as 1d and 2d (2 x 2), dp 2 x tp 4 likewise, tp 8 as 1d and 3d
# (2 x 2 x 2) on a model made for all three (hidden 256, ffn 1024, 8 heads, 4 kv heads, vocab
# 264, untied embeddings, 2 layers; batch 8 = micro 4 x accumulation 2, seq_len 64) as ranks
# of `l3d launch --transport ucx` when ucx is built, else as threads of one process; and tp
# 64, the smallest size both a grid (8 x 8) and a cube (4 x 4 x 4) take, as 2d and 3d on a
# model made for both (8 kv heads, vocab 272; micro 16 = one step) as 64 threads of one
# process. A 2-core machine runs the ranks time-shared, so the step times say how the modes
# compare here, not on a GPU cluster; the bytes are exact.
#
# Planned (the second table): `l3d plan` searches every layout of Llama 3 70B and 405B and a
# 175B model (GPT-3's shape in Llama's form) on 64-4096 H100 and H200 GPUs (8 per node,
# NVLink 4 inside, IB NDR400 between; seq 8192, global batch 1024 sequences) once per mode
# and prints each mode's best step time and tensor-parallel communication time: dp x 2d
# against dp x 1d is the guide's reading (a) of "3D", the 3d cube against 2d SUMMA reading (b).
# Environment: L3D_BENCH_STEPS (default 8), UCX_TLS (default posix,self).
set -u
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
BUILD=${1:-./build}
L3D=$BUILD/l3d
STEPS=${L3D_BENCH_STEPS:-8}
export UCX_TLS=${UCX_TLS:-posix,self}
export L3D_COMM_TIMEOUT=${L3D_COMM_TIMEOUT:-60}
if [ ! -x "$L3D" ]; then
  echo "tp_modes.sh: $L3D not found or not executable (usage: bench/tp_modes.sh [BUILD_DIR])" >&2
  exit 2
fi
built=$("$L3D" launch -n 1 --transport nosuch -- true 2>&1 |
  sed -nE 's/.*\(built: ([^)]*)\).*/\1/p' | tr -d ,)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/l3d-tp-modes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/model.json" <<'J'
{"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
 "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 264, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "bos_token_id": 256, "eos_token_id": 257}
J
cat >"$tmp/model64.json" <<'J'
{"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
 "num_key_value_heads": 8, "head_dim": 32, "vocab_size": 272, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "bos_token_id": 256, "eos_token_id": 257}
J
conf() {  # dp tp mode -> config file
  local f="$tmp/c.$1.$2.$3.json" mb=4 b=$((8 * $1))
  [ "$2" -eq 64 ] && mb=16 b=16  # (the cube's 16 slices)
  cat >"$f" <<J
{"train_batch_size": $b, "train_micro_batch_size_per_gpu": $mb, "steps_per_print": 1000,
 "parallel": {"dp": $1, "tp": $2, "tp_mode": "$3"},
 "train": {"steps": $STEPS, "threads": 1}, "data": {"seq_len": 64}}
J
  echo "$f"
}
# median step time (s) of steps 3..STEPS, and the last step's tp calls and bytes
measure() {  # metrics file
  local t last
  t=$(sed -nE 's/.*"step": ([0-9]+),.*"step_time_s": ([0-9.eE+-]+).*/\1 \2/p' "$1" |
    awk '$1 >= 3 { print $2 }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit 1;
           printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  last=$(tail -n 1 "$1" |
    sed -nE 's/.*"comm_calls": \{"tp": ([0-9]+),.*"comm_bytes": \{"tp": ([0-9]+),.*/\1 \2/p')
  [ -n "$t" ] && [ -n "$last" ] && echo "$t $last"
}
run() {  # dp tp mode -> "time calls bytes", or fails
  local c m n=$(($1 * $2)) model="$tmp/model.json" how=" $built "
  c=$(conf "$1" "$2" "$3")
  m="$tmp/m.$1.$2.$3.jsonl"
  [ "$2" -eq 64 ] && model="$tmp/model64.json" how=threads
  case $how in
    *" ucx "*) "$L3D" launch -n "$n" --transport ucx -- "$L3D" train --model "$model" \
                 --config "$c" --metrics "$m" >"$tmp/log" 2>&1 ;;
    *) "$L3D" train --model "$model" --config "$c" --metrics "$m" >"$tmp/log" 2>&1 ;;
  esac || { sed 's/^/    /' "$tmp/log" | tail -5 >&2; return 1; }
  measure "$m"
}

how=threads; case " $built " in *" ucx "*) how="ucx processes" ;; esac
echo "tp_modes.sh: model hidden 256 ffn 1024 heads 8/4 vocab 264, 2 layers; $STEPS steps; $how" >&2
echo "| layout | mode | tp bytes/step | tp calls/step | step time (s) | bytes vs first | time vs first |"
echo "|---|---|---|---|---|---|---|"
fails=0
for lay in "1 4 1d 2d" "2 4 1d 2d" "1 8 1d 3d" "1 64 2d 3d"; do
  set -- $lay
  dp=$1 tp=$2 ma=$3 mb=$4
  r1=$(run "$dp" "$tp" "$ma") || { echo "| dp $dp x tp $tp | $ma | failed | | | | |"; fails=$((fails + 1)); continue; }
  r2=$(run "$dp" "$tp" "$mb") || { echo "| dp $dp x tp $tp | $mb | failed | | | | |"; fails=$((fails + 1)); continue; }
  set -- $r1 $r2
  t1=$1 c1=$2 b1=$3 t2=$4 c2=$5 b2=$6
  echo "| dp $dp x tp $tp | $ma | $b1 | $c1 | $t1 | | |"
  awk -v b1="$b1" -v b2="$b2" -v t1="$t1" -v t2="$t2" -v c2="$c2" -v l="dp $dp x tp $tp" \
    -v m="$mb" -v a="$ma" 'BEGIN { printf "| %s | %s | %d | %d | %s | %.2f | %.2f |\n", l, m, b2, c2, t2, b2 / b1, t2 / t1 }'
done

# ---- planned --------------------------------------------------------------------------------
cat >"$tmp/175b.json" <<'J'
{"hidden_size": 12288, "intermediate_size": 49152, "num_hidden_layers": 96,
 "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
 "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": 128001}
J
best() {  # model gpu gpus mode -> "step_s mfu tp_s layout"
  "$L3D" plan --model "$1" --gpu "$2" --gpus "$3" --seq 8192 --global-batch 1024 \
    --layout "tp_mode=$4" --top 1 --json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
l = r["layout"]
lay = "dp=%d tp=%d pp=%d cp=%d v=%d mb=%d zero=%d rc=%s" % (l["dp"], l["tp"], l["pp"], l["cp"],
      l["v"], l["mb"], l["zero"], l["recompute"])
print("%.3f %.1f %.3f %s%s" % (r["step_time_s"], 100 * r["mfu"], r["comm_s"]["tp"], lay,
      "" if r["fits"] else " (does not fit)"))'
}
echo
echo "| model | GPUs | 1d step s (tp s) | 2d step s (tp s) | 3d step s (tp s) | 2d / 1d time | 3d / 2d time | 3d / 2d tp s | 1d layout | 2d layout | 3d layout |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for model in llama3-70b "$tmp/175b.json" llama3-405b; do
  name=$model; [ "$model" = "$tmp/175b.json" ] && name=175b
  for gpu in h100-sxm h200-sxm; do
    for n in 64 512 4096; do
      cells=() ts=() cs=() lays=()
      for mode in 1d 2d 3d; do
        r=$(best "$model" "$gpu" "$n" "$mode") || r=""
        if [ -z "$r" ]; then cells+=("none"); ts+=(""); cs+=(""); lays+=(""); continue; fi
        set -- $r; ts+=("$1"); cs+=("$3"); cells+=("$1 ($3)"); shift 3; lays+=("$*")
      done
      ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b / a }'; }
      echo "| $name ($gpu) | $n | ${cells[0]} | ${cells[1]} | ${cells[2]} | $(ratio "${ts[0]}" "${ts[1]}") | $(ratio "${ts[1]}" "${ts[2]}") | $(ratio "${cs[1]}" "${cs[2]}") | ${lays[0]} | ${lays[1]} | ${lays[2]} |"
    done
  done
done
[ "$fails" -eq 0 ]
