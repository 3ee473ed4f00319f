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

# ---- two ranks by hand: the id exchange, then each names the missing GPU ---------------------
# (by hand, not through l3d launch: launch stops the other ranks once one exits, so whether the
# second rank got as far as saying so would be a race)
port=$(( 20000 + RANDOM % 20000 ))
start=$(date +%s)
for r in 0 1; do
  L3D_RANK=$r L3D_WORLD_SIZE=2 L3D_MASTER_ADDR=127.0.0.1 L3D_MASTER_PORT=$port L3D_TRANSPORT=nccl \
    L3D_LOG=debug L3D_COMM_TIMEOUT=30 timeout 90 "$L3D" train --config "$tmp/c.json" --dp 2 \
    >"$tmp/h$r.out" 2>&1 &
  eval "p$r=\$!"
done
wait $p0; rc0=$?
wait $p1; rc1=$?
took=$(( $(date +%s) - start ))
ids=$(cat "$tmp/h0.out" "$tmp/h1.out" | grep -o "nccl: rank [01] has rank 0's unique id [0-9a-f]*" | awk '{print $NF}' | sort -u)
nid=$(cat "$tmp/h0.out" "$tmp/h1.out" | grep -c "nccl: rank [01] has rank 0's unique id")
if [ "$nid" -eq 2 ] && [ "$(echo "$ids" | wc -l)" -eq 1 ] && [ -n "$ids" ]; then
  ok "rank 0's unique id reached both ranks through the rendezvous (digest $ids)"
else
  fail "unique id exchange ($nid lines)" "$tmp/h0.out" "$tmp/h1.out"
fi
if [ $rc0 -eq 2 ] && [ $rc1 -eq 2 ] && [ $took -le 60 ] \
   && grep -q "^l3d train: nccl: rank 0 has no GPU: " "$tmp/h0.out" \
   && grep -q "^l3d train: nccl: rank 1 has no GPU: " "$tmp/h1.out"; then
  ok "no GPU: each rank exits 2 naming it, in ${took} s"
else
  fail "no-GPU stop (exits $rc0 / $rc1 after ${took} s)" "$tmp/h0.out" "$tmp/h1.out"
fi

# ---- the same through l3d launch: non-zero within 60 s, the first rank's reason ---------------
start=$(date +%s)
timeout 120 "$L3D" launch -n 2 --transport nccl -- "$L3D" train --config "$tmp/c.json" --dp 2 \
  >"$tmp/l.out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 60 ] \
   && grep -q "^\[rank [01]\] l3d train: nccl: rank [01] has no GPU: " "$tmp/l.out" \
   && grep -q "rank [01] exited with status 2" "$tmp/l.out"; then
  ok "l3d launch -n 2 --transport nccl: exit $rc in ${took} s, a rank naming the missing GPU"
else
  fail "launch without a GPU (exit $rc after ${took} s)" "$tmp/l.out"
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
