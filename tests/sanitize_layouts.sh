#!/usr/bin/env bash
# One run of each kind of parallel code, for the sanitizer build (registered only when
# L3D_SANITIZE is set): data parallel (ZeRO-1), tensor parallel, pipeline, ZeRO-3 with offload,
# 16-bit training, tensor- and pipeline-parallel generation, the collectives of `l3d bench comm`
# on thread ranks, 2d and 3d tensor parallelism, and `l3d launch` over UCX and over libfabric.
# (CI's sanitizer stage leaves the test_parallel* trajectories to tests/matrix.sh; these
# runs take the same code paths in seconds.) The build compiles with
# -fno-sanitize-recover=all, and UBSAN_OPTIONS halts too, so undefined behaviour or a memory
# error anywhere on these paths fails its case with the sanitizer's report.
# Usage: sanitize_layouts.sh /path/to/l3d (of a -DL3D_SANITIZE=address,undefined build)
set -u
L3D=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=0
export L3D_COMM_TIMEOUT=60  # sanitizers slow each rank several-fold on 2 cores
fails=0; passes=0
case_() {  # case_ NAME COMMAND...: passes when COMMAND exits 0 with no sanitizer report
  local name=$1; shift
  timeout 300 "$@" >out 2>err
  local rc=$?
  if [ $rc -eq 0 ] && ! grep -qE "runtime error:|ERROR: AddressSanitizer|SUMMARY: .*Sanitizer" err out; then
    echo "ok   $name"; passes=$((passes + 1))
  else
    echo "FAIL $name (exit $rc)"; grep -m 12 -E "runtime error|Sanitizer|#[0-9] |l3d" err | sed 's/^/    /'
    fails=$((fails + 1))
  fi
}
train=("$L3D" train --steps 2 --seq-len 32 --threads 1)

case_ "train dp 2 (ZeRO-1)" "${train[@]}" --dp 2
case_ "train tp 2" "${train[@]}" --tp 2
case_ "train pp 2 (1F1B)" "${train[@]}" --pp 2
echo '{"train_micro_batch_size_per_gpu":2,"gradient_accumulation_steps":2,"parallel":{"schedule":"interleaved"}}' >il.json
case_ "train pp 2 interleaved" "${train[@]}" --config il.json --pp 2
echo '{"zero_optimization":{"stage":3,"offload_optimizer":{"device":"cpu"},"offload_param":{"device":"cpu"}}}' >z3.json
case_ "train dp 2, ZeRO-3 with offload" "${train[@]}" --config z3.json --dp 2
echo '{"bf16":{"enabled":true},"zero_optimization":{"stage":2}}' >bf16.json
case_ "train bf16, dp 2 x tp 2, ZeRO-2" "${train[@]}" --config bf16.json --dp 2 --tp 2
echo '{"parallel":{"tp_mode":"2d"}}' >2d.json
case_ "train tp 4 as a 2d grid, pp 2" "${train[@]}" --config 2d.json --tp 4 --pp 2
echo '{"parallel":{"tp_mode":"3d"}}' >3d.json
case_ "train tp 8 as a 3d cube" "${train[@]}" --config 3d.json --tp 8
case_ "save sharded (tp 2 x pp 2)" "${train[@]}" --tp 2 --pp 2 --save ck
case_ "generate tp 2 x pp 2" "$L3D" generate --checkpoint ck --prompt "The" --max-tokens 4 \
  --seed 1 --tp 2 --pp 2
case_ "bench comm, 3 thread ranks, every op" sh -c \
  'for op in allreduce allgather reduce_scatter broadcast reduce alltoall; do
     "$0" bench comm $op -t 3 -b 8 -e 64K -f 64 -n 2 -w 1 || exit 1; done' "$L3D"
for tr in ucx ofi; do
  case_ "launch -n 2 over $tr: train dp 2" "$L3D" launch -n 2 --transport $tr -- \
    "${train[@]}" --dp 2
done

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
