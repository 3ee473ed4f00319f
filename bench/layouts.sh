#!/usr/bin/env bash
# Tokens/s and bytes per group for each dp x tp x pp layout of llama3-tiny training.
# Usage: bench/layouts.sh [BUILD_DIR]            (default ./build; needs BUILD_DIR/l3d with ucx)
#
# Each layout trains llama3-tiny for 12 steps (batch 8 = micro 2 x accumulation 8/(2 dp) x dp,
# seq_len 64, one thread per rank; tp_mode 3d: micro 4, the cube's 4 slices) as ranks of
# `l3d launch --transport ucx`; (1,1,1) runs as a single process without launch. Layouts with
# dp > 1 run with ZeRO stage 0, 1 and 2; pipelines with 1F1B and interleaved 1F1B (2 chunks
# per stage); tp 4 also as a 2d grid (alone, with dp 2, with pp 2) and tp 8 as a 3d cube.
# reduce_bucket_size is 100000 elements (about one of llama3-tiny's layers at tp 2; a layer is
# never split, so at tp 1 each layer is a bucket too), so that ZeRO-2's windows hold a layer each rather than all of them. The
# gradient memory of rank 0 comes from the dry run (ZeRO-2: its 1/dp shard plus the reduction
# windows). From rank 0's metrics JSONL the script takes the median tokens_per_s of steps 3..12 (global tokens per
# second: 512 tokens / rank 0's step time), the last step's comm_calls/comm_bytes per group and
# the peak of mem_peak_bytes. `l3d train --dry-run` with the same layout gives the predicted
# communication; calls must agree exactly and bytes as MiB to 3 decimals (the precision the dry
# run prints), otherwise the cell says MISMATCH and the script exits 1.
#
# `l3d plan` plans each layout too (--config the run's file, --gpu measured with one thread,
# links measured first with `l3d bench comm --json` over the same transport): its bytes per
# group must equal the counted ones exactly (else MISMATCH and exit 1), and its predicted step
# time is printed beside the measured one (rank 0's median step time).
#
# Every layout is run REPS times (default 2, env L3D_BENCH_REPS) and the best median is kept:
# timings on the 2-core build machines vary by 30-50% from run to run. A markdown table goes to
# stdout, progress to stderr. Environment: UCX_TLS is honoured when set; otherwise the script
# sets posix,self (shared memory, as the ucx tests do). `l3d launch` itself sets no UCX_TLS, so
# without it UCX picks its own transports (llama3d pins tcp to lo on one host).
set -u
# --help prints the comment above (what is measured, usage, environment) and runs nothing.
case ${1:-} in -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
BUILD=${1:-./build}
L3D=$BUILD/l3d
REPS=${L3D_BENCH_REPS:-2}
RUN_TIMEOUT=${L3D_BENCH_TIMEOUT:-120}   # seconds per run before it is killed
export UCX_TLS=${UCX_TLS:-posix,self}
export L3D_COMM_TIMEOUT=${L3D_COMM_TIMEOUT:-60}

if [ ! -x "$L3D" ]; then
  echo "layouts.sh: $L3D not found or not executable (usage: bench/layouts.sh [BUILD_DIR])" >&2
  exit 2
fi
built=$("$L3D" launch -n 1 --transport nosuch -- true 2>&1 |
  sed -nE 's/.*\(built: ([^)]*)\).*/\1/p' | tr -d ,)
case " $built " in
  *" ucx "*) ;;
  *) echo "layouts.sh: $L3D was built without the ucx transport (built: ${built:-?})" >&2; exit 2 ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/l3d-layouts.XXXXXX")
cur=""   # pid of the run in flight (timeout wrapping l3d launch / l3d train)

# Stop the run in flight: timeout forwards SIGTERM to l3d launch, which forwards it to every
# rank's process group; ranks still alive after that are killed by their group id.
cleanup() {
  if [ -n "$cur" ] && kill -0 "$cur" 2>/dev/null; then
    local kids="" k
    for k in $(pgrep -P "$cur" 2>/dev/null); do kids="$kids $k $(pgrep -P "$k" 2>/dev/null)"; done
    kill -TERM "$cur" 2>/dev/null
    wait "$cur" 2>/dev/null
    sleep 0.5
    for k in $kids; do kill -KILL -- "-$k" 2>/dev/null || kill -KILL "$k" 2>/dev/null; done
  fi
  cur=""
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# z<stage>.json, and z<stage>i.json with interleaved 1F1B (2 chunks per stage)
for z in 0 1 2; do
  cat >"$tmp/z$z.json" <<EOF
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
 "zero_optimization": {"stage": $z, "reduce_bucket_size": 100000}, "steps_per_print": 100,
 "train": {"steps": 12, "threads": 1}, "data": {"seq_len": 64}}
EOF
  sed 's/"train": {/"parallel": {"schedule": "interleaved"}, "train": {/' "$tmp/z$z.json" >"$tmp/z${z}i.json"
  # tp_mode 2d, and 3d with micro-batches of 4 (its q^2 = 4 slices; accumulation halves)
  sed 's/"train": {/"parallel": {"tp_mode": "2d"}, "train": {/' "$tmp/z$z.json" >"$tmp/z${z}2d.json"
  sed -e 's/"train": {/"parallel": {"tp_mode": "3d"}, "train": {/' \
      -e 's/"train_micro_batch_size_per_gpu": 2/"train_micro_batch_size_per_gpu": 4/' \
      "$tmp/z$z.json" >"$tmp/z${z}3d.json"
done

# run LOG CMD...: run CMD under a timeout in the background (so a signal to this script is
# handled at once), output to LOG; returns CMD's exit status.
run() {
  local log=$1; shift
  timeout -k 10 "$RUN_TIMEOUT" "$@" >"$log" 2>&1 &
  cur=$!
  wait "$cur"
  local rc=$?
  cur=""
  return $rc
}

# median FILE: median tokens_per_s of steps 3..12
median() {
  sed -nE 's/.*"step": ([0-9]+),.*"tokens_per_s": ([0-9.eE+-]+),.*/\1 \2/p' "$1" |
    awk '$1 >= 3 && $1 <= 12 { print $2 }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit 1;
           printf "%.1f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# counted FILE: "tp_calls tp_bytes dp_calls dp_bytes pp_calls pp_bytes peak_bytes" of rank 0
counted() {
  local last peak
  last=$(tail -n 1 "$1")
  peak=$(sed -nE 's/.*"mem_peak_bytes": ([0-9]+).*/\1/p' "$1" | sort -n | tail -n 1)
  local g='\{"tp": ([0-9]+), "dp": ([0-9]+), "pp": ([0-9]+)\}'
  echo "$last" | sed -nE "s/.*\"comm_calls\": $g, \"comm_bytes\": $g.*/\\1 \\4 \\2 \\5 \\3 \\6/p" |
    awk -v peak="$peak" 'NF == 6 && peak != "" { print $0, peak }'
}
mib() { awk -v b="$1" 'BEGIN { printf "%.3f", b / 1048576 }'; }

# cell CALLS BYTES PCALLS PMIB: "counted / predicted" MiB and the calls; fails on a mismatch
fails=0
cell() {
  local m
  m=$(mib "$2")
  if [ "$1" = "$3" ] && [ "$m" = "$4" ]; then
    if [ "$1" = 0 ]; then printf -- "—"; else printf "%s / %s (%s calls)" "$m" "$4" "$1"; fi
  else
    printf "%s / %s **MISMATCH** (calls %s / %s)" "$m" "$4" "$1" "$3"
    return 1
  fi
}

start=$(date +%s)
# The links l3d plan costs communication with: this transport's all-reduce, all-gather and
# ping-pong between 2 process ranks, measured now.
links=""
for op in allreduce allgather pingpong; do
  run "$tmp/bench.log" "$L3D" launch -n 2 --transport ucx -- \
    "$L3D" bench comm "$op" -b 8 -e 16M -f 8 -n 50 -w 20 -c 0 --json "$tmp/link.$op.json"
  if [ $? -ne 0 ]; then
    echo "layouts.sh: measuring $op for l3d plan failed:" >&2; tail -n 20 "$tmp/bench.log" >&2; exit 1
  fi
  links="$links${links:+,}$tmp/link.$op.json"
done
# (dp tp pp zero schedule) in table order; schedule i: interleaved 1F1B, -: 1F1B (or none);
# 2d / 3d: that parallel.tp_mode (1F1B), else 1d
LAYOUTS=("1 1 1 0 -" "2 1 1 0 -" "2 1 1 1 -" "2 1 1 2 -" "1 2 1 0 -" "2 2 1 0 -" "2 2 1 1 -"
         "4 1 1 0 -" "4 1 1 1 -" "4 1 1 2 -" "1 4 1 0 -" "1 1 2 0 -" "1 1 2 0 i" "2 1 2 1 -"
         "2 1 2 1 i" "1 2 2 0 -" "2 2 2 1 -" "2 2 2 2 -" "2 2 2 2 i" "1 1 4 0 -"
         "1 4 1 0 2d" "2 4 1 1 2d" "1 4 2 0 2d" "1 8 1 0 3d")
declare -A pred best bestm err gmem plan

# Pass 1: the dry run's prediction of every layout.
for lay in "${LAYOUTS[@]}"; do
  # shellcheck disable=SC2086  # split "dp tp pp zero schedule" on purpose
  set -- $lay
  dp=$1; tp=$2; pp=$3; z=$4; c=$tmp/z$z${5/-/}.json; n=$((dp * tp * pp))
  run "$tmp/dry.log" "$L3D" train --config "$c" --dp "$dp" --tp "$tp" --pp "$pp" --dry-run
  rc=$?
  g='([0-9]+) calls ([0-9.]+) MiB'
  p=$(sed -nE "s/.*predicted\\): tp $g, dp $g, pp $g.*/\\1 \\2 \\3 \\4 \\5 \\6/p" "$tmp/dry.log")
  # a world of one prints no communication line: nothing is predicted
  [ $n -eq 1 ] && [ $rc -eq 0 ] && [ -z "$p" ] && p="0 0.000 0 0.000 0 0.000"
  if [ $rc -ne 0 ] || [ -z "$p" ]; then
    echo "layouts.sh: ($dp,$tp,$pp) zero $z: --dry-run failed (exit $rc):" >&2
    sed 's/^/    /' "$tmp/dry.log" | tail -n 20 >&2
    err[$lay]="dry run FAILED (exit $rc)"
    p=""
  fi
  pred[$lay]=$p
  gmem[$lay]=$(sed -nE 's/.*gradients ([0-9.]+) MiB.*/\1/p' "$tmp/dry.log" | head -n 1)
  # l3d plan's view of the same layout: "tp_bytes dp_bytes pp_bytes step_s"
  v=1; [ "$5" = i ] && v=2
  mode=1d; mb=2
  case $5 in 2d | 3d) mode=$5 ;; esac
  [ "$5" = 3d ] && mb=4
  run "$tmp/plan.json" "$L3D" plan --config "$c" --gpus "$n" --gpu measured --gpu-threads 1 \
    --intra "$links" --seq 64 --global-batch 8 \
    --layout "dp=$dp,tp=$tp,pp=$pp,cp=1,v=$v,mb=$mb,zero=$z,recompute=none,sp=0,ends=0,\
tp_mode=$mode" \
    --top 1 --json
  plan[$lay]=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; b=r["comm_bytes"]
print(b["tp"], b["dp"], b["pp"], r["step_time_s"])' "$tmp/plan.json" 2>/dev/null)
  if [ -z "${plan[$lay]}" ]; then
    echo "layouts.sh: ($dp,$tp,$pp) zero $z: l3d plan failed:" >&2; tail -n 20 "$tmp/plan.json" >&2
    err[$lay]="l3d plan FAILED"; pred[$lay]=""
  fi
done

# Pass 2: REPS rounds over all layouts, so that a burst of load on the machine spoils one run
# of several layouts rather than every run of one.
for rep in $(seq 1 "$REPS"); do
  for lay in "${LAYOUTS[@]}"; do
    [ -z "${pred[$lay]}" ] && continue   # its dry run failed
    # shellcheck disable=SC2086
    set -- $lay
    dp=$1; tp=$2; pp=$3; z=$4; c=$tmp/z$z${5/-/}.json; n=$((dp * tp * pp))
    m=$tmp/m.$dp.$tp.$pp.$z.$5.$rep.jsonl
    if [ $n -eq 1 ]; then
      run "$tmp/run.log" "$L3D" train --config "$c" --metrics "$m"
    else
      run "$tmp/run.log" "$L3D" launch -n "$n" --transport ucx -- \
        "$L3D" train --config "$c" --dp "$dp" --tp "$tp" --pp "$pp" --metrics "$m"
    fi
    rc=$?
    med=""
    [ $rc -eq 0 ] && med=$(median "$m")
    if [ -z "$med" ]; then
      echo "layouts.sh: ($dp,$tp,$pp) zero $z run $rep failed (exit $rc):" >&2
      sed 's/^/    /' "$tmp/run.log" | tail -n 20 >&2
      err[$lay]="run FAILED (exit $rc)"
      fails=$((fails + 1))   # even if another run of it succeeds: a crash or hang is a bug
      continue
    fi
    echo "layouts.sh: ($dp,$tp,$pp) zero $z ranks $n run $rep: median $med tok/s" >&2
    if [ -z "${best[$lay]:-}" ] ||
       awk -v a="$med" -v b="${best[$lay]}" 'BEGIN { exit !(a > b) }'; then
      best[$lay]=$med; bestm[$lay]=$m
    fi
  done
done

# Pass 3: the table, from the best run of each layout.
rows=()
base=${best["1 1 1 0 -"]:-}
for lay in "${LAYOUTS[@]}"; do
  # shellcheck disable=SC2086
  set -- $lay
  dp=$1; tp=$2; pp=$3; z=$4; n=$((dp * tp * pp)); name="($dp,$tp,$pp)"
  sched="—"
  [ "$pp" -gt 1 ] && sched=1f1b
  [ "$5" = i ] && sched="interleaved ×2"
  case $5 in 2d | 3d) name="$name $5" ;; esac
  gm=${gmem[$lay]:-?}
  got=""
  [ -n "${bestm[$lay]:-}" ] && got=$(counted "${bestm[$lay]}")
  if [ -z "$got" ] || [ -z "${pred[$lay]}" ]; then
    rows+=("| $name | $z | $sched | $n | ${err[$lay]:-metrics unreadable} | | | | | | | |"); fails=$((fails + 1))
    continue
  fi
  b=${best[$lay]}
  # shellcheck disable=SC2086  # split the two number lists on purpose
  set -- $got ${pred[$lay]}
  # $1..$7: counted tp calls/bytes, dp calls/bytes, pp calls/bytes, peak bytes
  # $8..$13: predicted tp calls/MiB, dp calls/MiB, pp calls/MiB
  tpc=$(cell "$1" "$2" "$8" "$9") || fails=$((fails + 1))
  dpc=$(cell "$3" "$4" "${10}" "${11}") || fails=$((fails + 1))
  ppc=$(cell "$5" "$6" "${12}" "${13}") || fails=$((fails + 1))
  counted_bytes="$2 $4 $6"
  peak=$(awk -v v="$7" 'BEGIN { printf "%.2f", v / 1048576 }')
  # shellcheck disable=SC2086
  set -- ${plan[$lay]}
  if [ "$1 $2 $3" != "$counted_bytes" ]; then
    planc="**MISMATCH** planned bytes $1 $2 $3, counted $counted_bytes"; fails=$((fails + 1))
  else
    planc=$(awk -v m="$b" -v p="$4" 'BEGIN { printf "%.1f / %.1f", 512 / m * 1e3, p * 1e3 }')
  fi
  ratio="n/a"
  [ -n "$base" ] && ratio=$(awk -v a="$b" -v c="$base" 'BEGIN { printf "%.2f×", a / c }')
  rows+=("| $name | $z | $sched | $n | $(printf %.0f "$b") | $ratio | $tpc | $dpc | $ppc | $gm | $peak | $planc |")
done

echo "llama3-tiny, batch 8 x seq_len 64 (512 tokens/step), 12 steps, 1 thread per rank;"
echo "l3d launch --transport ucx, UCX_TLS=$UCX_TLS; $(nproc) cores; $(date -u +%Y-%m-%d);"
echo "tok/s: median of steps 3..12, best of $REPS runs;"
echo "MiB: rank 0, last step, counted / --dry-run; l3d plan's bytes equal the counted ones;"
echo "step ms: rank 0's median step (512 tokens / tok/s) / l3d plan --gpu measured."
echo
hdr="| layout (dp,tp,pp) | zero | pipeline | ranks | tok/s | vs (1,1,1) |"
hdr+=" tp MiB counted / predicted | dp MiB counted / predicted | pp MiB counted / predicted |"
hdr+=" grads MiB rank 0 | peak MiB rank 0 | step ms measured / l3d plan |"
echo "$hdr"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "layouts.sh: $(( $(date +%s) - start )) s" >&2
[ $fails -eq 0 ]
