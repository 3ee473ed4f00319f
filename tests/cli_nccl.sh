#!/usr/bin/env bash
# The nccl transport where no GPU is: rank 0's unique id reaches every rank through the
# rendezvous, then every rank stops naming the missing GPU (exit 2, no hang); a rank on another
# transport is named; bench comm refuses alike. Skips (77) when the build has no nccl transport
# or the machine has a GPU (tools/gpu-check.sh runs the transport there).
# Usage: cli_nccl.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | head -30; done; fails=$((fails + 1)); }

if "$L3D" bench comm --transport nccl -h 2>&1 | grep -q "is not one of"; then
  echo "skip: this build has no nccl transport (CUDA toolkit with NCCL, and ucx or ofi)"; exit 77
fi
if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then
  echo "skip: this machine has a GPU (tools/gpu-check.sh covers nccl there)"; exit 77
fi

cat >"$tmp/c.json" <<'EOF'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "train": {"steps": 2, "threads": 1},
 "data": {"seq_len": 32}}
EOF

# ---- launch -n 2 --transport nccl: the id exchange, then every rank names the missing GPU ------
start=$(date +%s)
L3D_LOG=debug timeout 120 "$L3D" launch -n 2 --transport nccl -- "$L3D" train --config "$tmp/c.json" \
  --dp 2 >"$tmp/l.out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
ids=$(grep -o "nccl: rank [01] has rank 0's unique id [0-9a-f]*" "$tmp/l.out" | awk '{print $NF}' | sort -u)
nid=$(grep -c "nccl: rank [01] has rank 0's unique id" "$tmp/l.out")
if [ "$nid" -eq 2 ] && [ "$(echo "$ids" | wc -l)" -eq 1 ] && [ -n "$ids" ]; then
  ok "rank 0's unique id reached both ranks through the rendezvous (digest $ids)"
else
  fail "unique id exchange ($nid lines)" "$tmp/l.out"
fi
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 60 ] \
   && grep -q "^\[rank 0\] l3d train: nccl: rank 0 has no GPU: " "$tmp/l.out" \
   && grep -q "^\[rank 1\] l3d train: nccl: rank 1 has no GPU: " "$tmp/l.out" \
   && grep -q "rank [01] exited with status 2" "$tmp/l.out"; then
  ok "no GPU: every rank stops naming it, status 2, in ${took} s (launch exit $rc)"
else
  fail "no-GPU stop (exit $rc after ${took} s)" "$tmp/l.out"
fi

# ---- a rank on another transport: named, no hang ------------------------------------------------
port=$(( 20000 + RANDOM % 20000 ))
L3D_RANK=0 L3D_WORLD_SIZE=2 L3D_MASTER_ADDR=127.0.0.1 L3D_MASTER_PORT=$port L3D_TRANSPORT=nccl \
  L3D_COMM_TIMEOUT=30 timeout 90 "$L3D" train --config "$tmp/c.json" --dp 2 >"$tmp/m0.out" 2>&1 &
p0=$!
L3D_RANK=1 L3D_WORLD_SIZE=2 L3D_MASTER_ADDR=127.0.0.1 L3D_MASTER_PORT=$port L3D_TRANSPORT=ucx \
  L3D_COMM_TIMEOUT=30 timeout 90 "$L3D" train --config "$tmp/c.json" --dp 2 >"$tmp/m1.out" 2>&1
rc1=$?
wait $p0
rc0=$?
if [ $rc0 -ne 0 ] && [ $rc0 -ne 124 ] && [ $rc1 -ne 0 ] && [ $rc1 -ne 124 ] \
   && grep -q "nccl: rank 1's address is not an nccl address" "$tmp/m0.out"; then
  ok "rank 1 on ucx: rank 0 (nccl) names it (exits $rc0 / $rc1)"
else
  fail "mixed transports (exits $rc0 / $rc1)" "$tmp/m0.out" "$tmp/m1.out"
fi

# ---- bench comm --------------------------------------------------------------------------------
"$L3D" bench comm --transport nccl -b 8 -e 64 >"$tmp/b.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "nccl: rank 0 has no GPU" "$tmp/b.out"; then
  ok "bench comm --transport nccl: exit 2 naming the missing GPU"
else
  fail "bench comm --transport nccl (exit $rc)" "$tmp/b.out"
fi

echo "$fails failed, $passes passed"
[ $fails -eq 0 ]
