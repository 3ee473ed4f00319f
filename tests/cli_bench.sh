#!/usr/bin/env bash
# l3d bench comm: the nccl-tests table and its checked columns for every op, dtypes and
# algorithms, that the check can fail, bad flags, and a 2-process run over a network transport.
# Usage: cli_bench.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | head -30; done; fails=$((fails + 1)); }

# The checked columns of the table rows: size count type redop root #wrong(oop) #wrong(ip).
# Rows are the lines not starting with '#' (under l3d launch: after the "[rank 0] " prefix).
rows() { sed 's/^\[rank 0\] //' "$1" | awk '!/^#/ && NF >= 13 { print $1, $2, $3, $4, $5, $9, $13 }'; }
# Every row's #wrong columns are 0 (in-place "N/A" for the ops without one), at least one row.
all_right() {
  local f=$1 inplace=$2
  [ "$(rows "$f" | wc -l)" -ge 1 ] || return 1
  if [ "$inplace" = 1 ]; then
    [ -z "$(rows "$f" | awk '$6 != "0" || $7 != "0"')" ]
  else
    [ -z "$(rows "$f" | awk '$6 != "0" || $7 != "N/A"')" ]
  fi
}

# 1. The default op on 2 thread ranks: layout, every line a script parses, 9 sizes 8..512K.
"$L3D" bench comm -t 2 -b 8 -e 1M -f 4 -n 3 -w 1 >"$tmp/out" 2>"$tmp/err"
rc=$?
good=1
grep -qx "# l3d bench comm: allreduce, 2 ranks (local transport), float, sum, iters 3, warmup 1, check 1, buffers in host memory" "$tmp/out" || good=0
grep -qE '^#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong$' "$tmp/out" || good=0
grep -qE '^# memcpy bandwidth \(2 ranks copying at once\): [0-9]+\.[0-9]{2} GB/s$' "$tmp/out" || good=0
grep -qx "# Out of bounds values : 0 OK" "$tmp/out" || good=0
grep -qE '^# Avg bus bandwidth    : [0-9.e+-]+$' "$tmp/out" || good=0
grep -qE '^# allreduce memory bound at 512 KiB: busbw <= 2\(n-1\)/n\*B/n = [0-9.]+ GB/s; measured out-of-place [0-9.]+ \([0-9]+%\), in-place [0-9.]+ \([0-9]+%\)$' "$tmp/out" || good=0
# sizes 8, 32, ..., 524288 with count = size / 4, root -1
want=$(for s in 8 32 128 512 2048 8192 32768 131072 524288; do echo "$s $((s / 4)) float sum -1 0 0"; done)
[ "$(rows "$tmp/out")" = "$want" ] || good=0
if [ $rc -eq 0 ] && [ $good -eq 1 ] && [ ! -s "$tmp/err" ]; then ok "allreduce table on 2 thread ranks"; else fail "allreduce table (exit $rc)" "$tmp/out" "$tmp/err"; fi

# 2. Every op on 3 thread ranks (odd: blocks of size/3), int32 and half, avg and max, root 2.
#    The same checked columns with the message-based algorithms (L3D_ALGO) instead of the
#    local transport's native ones.
algos="allreduce:ring,reduce_scatter:ring,allgather:ring,broadcast:chain,reduce:chain"
for op in allreduce reduce_scatter allgather broadcast reduce alltoall sendrecv p2p pingpong; do
  case $op in alltoall|sendrecv|p2p|pingpong) inplace=0 ;; *) inplace=1 ;; esac
  for d in int32 half; do
    o=avg; [ $d = half ] && o=max
    args=(bench comm $op -t 3 -b 4 -e 96K -f 8 -n 2 -w 1 -d $d -o $o -r 2 -W 3)
    "$L3D" "${args[@]}" >"$tmp/a" 2>"$tmp/ae"; rca=$?
    L3D_ALGO=$algos "$L3D" "${args[@]}" >"$tmp/b" 2>"$tmp/be"; rcb=$?
    if [ $rca -eq 0 ] && [ $rcb -eq 0 ] && all_right "$tmp/a" $inplace && all_right "$tmp/b" $inplace \
       && [ "$(rows "$tmp/a")" = "$(rows "$tmp/b")" ] && grep -qx "# Out of bounds values : 0 OK" "$tmp/b"; then
      ok "$op $d $o on 3 ranks ($(rows "$tmp/a" | wc -l) sizes, native and $algos)"
    else
      fail "$op $d (exit $rca / $rcb with L3D_ALGO)" "$tmp/a" "$tmp/ae" "$tmp/b" "$tmp/be"
    fi
  done
done

# 3. Sizes of the split ops are rounded down to a multiple of nranks * elemsize, and the
#    root column shows -r for broadcast/reduce only.
"$L3D" bench comm allgather -t 3 -b 100 -e 100 -n 1 -w 0 -d int64 >"$tmp/out" 2>&1
"$L3D" bench comm reduce -t 3 -b 100 -e 100 -n 1 -w 0 -d uint8 -r 1 >>"$tmp/out" 2>&1
if [ "$(rows "$tmp/out")" = "$(printf '96 12 int64 none -1 0 0\n100 100 uint8 sum 1 0 0')" ]; then ok "size rounding, redop and root columns"; else fail "size rounding" "$tmp/out"; fi

# 4. The check can fail: a flipped output byte on every checking rank is counted and fails the
#    run (exit 1, FAILED); -c 0 prints N/A.
L3D_BENCH_CORRUPT=1 "$L3D" bench comm reduce_scatter -t 3 -b 12 -e 48 -n 1 -w 0 >"$tmp/out" 2>&1
rc=$?
# 3 sizes x 2 variants x 3 checking ranks, one element each
if [ $rc -eq 1 ] && grep -qx "# Out of bounds values : 18 FAILED" "$tmp/out" \
   && [ -z "$(rows "$tmp/out" | awk '$6 != "3" || $7 != "3"')" ]; then ok "a corrupted result is caught"; else fail "corruption not caught (exit $rc)" "$tmp/out"; fi
"$L3D" bench comm -t 2 -b 8 -e 8 -c 0 -n 1 -w 0 >"$tmp/out" 2>&1
if [ $? -eq 0 ] && [ "$(rows "$tmp/out")" = "8 2 float sum -1 N/A N/A" ]; then ok "-c 0 prints N/A"; else fail "-c 0" "$tmp/out"; fi

# 4b. Buffers in a device's memory (--device): the test devices' memory faults when the host
#    touches it, so every row checked right means the communicator staged every buffer of
#    every op (in place too); the same sizes as on host memory, and a flipped byte still caught.
for op in allreduce reduce_scatter allgather broadcast reduce alltoall sendrecv pingpong; do
  case $op in alltoall|sendrecv|pingpong) inplace=0 ;; *) inplace=1 ;; esac
  for dev in cpu-opaque cpu-async; do
    "$L3D" bench comm $op -t 3 -b 4 -e 96K -f 8 -n 2 -w 1 -d half -o max -r 2 >"$tmp/h" 2>&1; rch=$?
    "$L3D" bench comm $op -t 3 -b 4 -e 96K -f 8 -n 2 -w 1 -d half -o max -r 2 --device $dev >"$tmp/d" 2>&1; rcd=$?
    if [ $rch -eq 0 ] && [ $rcd -eq 0 ] && all_right "$tmp/d" $inplace && [ "$(rows "$tmp/h")" = "$(rows "$tmp/d")" ] \
       && grep -q "buffers in device $dev\$" "$tmp/d"; then
      ok "$op on $dev buffers ($(rows "$tmp/d" | wc -l) sizes, as on host memory)"
    else
      fail "$op on $dev (exit $rch / $rcd)" "$tmp/h" "$tmp/d"
    fi
  done
done
# Chunked, pipelined staging (L3D_STAGE_CHUNK, down to 1000 bytes here so that every size past
# it runs as chunks, the last one short): the same rows, with the transport's native
# collectives and with each message-based algorithm.
for algo in "" "allreduce:ring,broadcast:chain,reduce:chain" "allreduce:rabenseifner,broadcast:tree,reduce:tree"; do
  for op in allreduce broadcast reduce; do
    args=(bench comm $op -t 3 -b 12 -e 200K -f 7 -n 2 -w 1 -d float -r 1)
    L3D_ALGO=$algo "$L3D" "${args[@]}" >"$tmp/h" 2>&1; rch=$?
    L3D_ALGO=$algo L3D_STAGE_CHUNK=1000 L3D_LOG=debug L3D_LOG_SUBSYS=comm "$L3D" "${args[@]}" --device cpu-async >"$tmp/d" 2>"$tmp/de"; rcd=$?
    # 201684 bytes (the largest size) in 202 chunks of 1000, the last one 684
    if [ $rch -eq 0 ] && [ $rcd -eq 0 ] && all_right "$tmp/d" 1 && [ "$(rows "$tmp/h")" = "$(rows "$tmp/d")" ] \
       && grep -q "$op of 201684 bytes staged in 202 chunks of 1000" "$tmp/de"; then
      ok "$op in chunks of 1000 bytes on cpu-async buffers (${algo:-native}; $(rows "$tmp/d" | wc -l) sizes)"
    else
      fail "$op in chunks (${algo:-native}; exit $rch / $rcd)" "$tmp/h" "$tmp/d" "$tmp/de"
    fi
  done
done
L3D_BENCH_CORRUPT=1 "$L3D" bench comm reduce_scatter -t 3 -b 12 -e 48 -n 1 -w 0 --device cpu-async >"$tmp/out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -qx "# Out of bounds values : 18 FAILED" "$tmp/out"; then ok "a corrupted device result is caught"; else fail "device corruption not caught (exit $rc)" "$tmp/out"; fi

# 5. Bad input exits 2 with one line naming the flag (or the op).
expect_usage() {
  local name=$1 pat=$2; shift 2
  "$L3D" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qE -e "$pat" "$tmp/err" && [ ! -s "$tmp/out" ]; then
    ok "$name: $(cat "$tmp/err")"
  else
    fail "$name (exit $rc)" "$tmp/out" "$tmp/err"
  fi
}
expect_usage "-b x" "^l3d bench comm: -b: 'x' is not a size" bench comm -b x
expect_usage "-e 1T" "^l3d bench comm: -e: '1T'" bench comm -e 1T
expect_usage "-d complex" "^l3d bench comm: -d: 'complex' is not one of float\|" bench comm -d complex
expect_usage "-o prod" "^l3d bench comm: -o: 'prod'" bench comm -o prod
expect_usage "unknown op" "^l3d bench comm: OP: 'allreduse' is not one of allreduce\|" bench comm allreduse
expect_usage "-n 0" "^l3d bench comm: -n: '0' is not an integer" bench comm -n 0
expect_usage "-b > -e" "^l3d bench comm: -b: 2M is larger than -e 1M" bench comm -b 2M -e 1M
expect_usage "root too big" "^l3d bench comm: -r: root 3 is not below the 2 ranks" bench comm broadcast -r 3
expect_usage "p2p on one rank" "^l3d bench comm: p2p needs at least 2 ranks" bench comm p2p -t 1
expect_usage "typo flag" "^l3d bench comm: unknown flag '--transprot' \(did you mean '--transport'\?\)" bench comm --transprot ucx
expect_usage "bad transport" "^l3d bench comm: --transport: 'tcp'" bench comm --transport tcp
expect_usage "unknown device" "^l3d bench comm: --device: 'gpu-nonesuch' is not a built device \(built: cpu, cpu-opaque, cpu-async" bench comm --device gpu-nonesuch
expect_usage "no benchmark" "^usage: l3d bench comm" bench
expect_usage "unknown benchmark" "^l3d bench: unknown benchmark 'gemm' \\(there is: comm" bench gemm

# 6. Two processes over the first network transport, when one is built.
"$L3D" bench comm --transport ucx -b 8 -e 8 -n 1 -w 0 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] && grep -qi "not built\|unsupported\|built:" "$tmp/err"; then
  echo "skip 2-process run: $(head -1 "$tmp/err")"
else
  timeout 120 "$L3D" launch -n 2 -- "$L3D" bench comm -b 8 -e 64K -n 2 -w 1 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 0 ] && grep -qE '^\[rank 0\] # l3d bench comm: allreduce, 2 ranks \((ucx|ofi) transport\)' "$tmp/out" \
     && all_right "$tmp/out" 1 && [ "$(rows "$tmp/out" | wc -l)" -eq 14 ] \
     && grep -qx "\[rank 0\] # Out of bounds values : 0 OK" "$tmp/out" && ! grep -q '^\[rank 1\]' "$tmp/out"; then
    ok "2 processes: $(head -1 "$tmp/out" | sed 's/.*: //')"
  else
    fail "2 processes (exit $rc)" "$tmp/out" "$tmp/err"
  fi
  timeout 120 "$L3D" launch -n 3 -- "$L3D" bench comm alltoall -b 8 -e 4K -f 8 -n 2 -w 1 -d bfloat16 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -eq 0 ] && all_right "$tmp/out" 0; then ok "3-process alltoall"; else fail "3-process alltoall (exit $rc)" "$tmp/out" "$tmp/err"; fi
fi

# 7. bench_comm (built beside l3d) is the same program.
bc="$(dirname "$L3D")/bench/bench_comm"
if [ -x "$bc" ]; then
  "$bc" sendrecv -t 3 -b 8 -e 1K -f 4 -n 1 -w 0 >"$tmp/out" 2>&1
  if [ $? -eq 0 ] && all_right "$tmp/out" 0 && grep -q "^# l3d bench comm: sendrecv, 3 ranks" "$tmp/out"; then ok "bench_comm"; else fail "bench_comm" "$tmp/out"; fi
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
