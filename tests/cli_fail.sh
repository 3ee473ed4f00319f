#!/usr/bin/env bash
# A rank of a 4-rank `l3d train` dies (SIGKILL) or goes silent (SIGSTOP) mid-run, over each
# built network transport, with the ranks started by hand (torchrun-style variables) and under
# `l3d launch`. Every survivor must exit non-zero, and its message must name the victim as the
# rank that failed (not another survivor, not "no rank"); started by hand, it must do so within
# L3D_COMM_TIMEOUT plus a few seconds of teardown (before: UCX's cma transport crashed a
# survivor with a backtrace, survivors blamed a live rank, rank 0 took twice the timeout).
# Started by hand, a tp 2 x pp 2 job loses each of its ranks in turn too.
# L3D_FAIL_ITERS=N repeats every case N times (default 1; use 10 to check for flakiness).
# Usage: cli_fail.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
pids_all=()
cleanup() {
  for p in "${pids_all[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | cut -c1-300 | head -12; done; fails=$((fails + 1)); }
iters=${L3D_FAIL_ITERS:-1}
now() { date +%s.%N; }

cat >"$tmp/cfg.json" <<'EOF'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "train": {"steps": 100000, "threads": 1}, "data": {"seq_len": 32}}
EOF

# The rank a failure message names first, as a world rank: "rank N failed ...", "rank K (world
# rank N) failed ..." (a member of a split communicator) or "... unresponsive: rank N". Several
# unresponsive ranks print as "rank N, rank M", which is not a single rank.
named() {
  grep -oE "rank [0-9]+ (\(world rank [0-9]+\) )?failed|unresponsive: rank [0-9]+(, rank [0-9]+)*" |
    head -n 1 | sed -E 's/^unresponsive: //; s/^rank [0-9]+ \(world (rank [0-9]+)\)/\1/; s/ failed$//'
}

# wait_step FILE: until rank 0 has printed step 2 (the job is running), at most 60 s
wait_step() {
  for _ in $(seq 600); do
    grep -q "step  *2/" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# by_hand TP SIG VICTIM TIMEOUT [TRAIN FLAGS]: 4 ranks started with RANK/WORLD_SIZE/MASTER_*
# set by hand (default layout: dp 4)
by_hand() {
  local tp=$1 sig=$2 victim=$3 tmo=$4 d port r
  shift 4
  d=$(mktemp -d "$tmp/hand.XXXX")
  port=$("$L3D" launch -n 1 -- sh -c 'echo $MASTER_PORT')  # a free port
  port=${port#\[rank 0\] }
  for r in 0 1 2 3; do
    ( RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port L3D_JOB_TOKEN=fail$port \
        L3D_TRANSPORT=$tp L3D_COMM_TIMEOUT=$tmo \
        "$L3D" train --config "$tmp/cfg.json" "$@" >"$d/out$r" 2>"$d/err$r" &
      echo $! >"$d/pid$r"; wait $!; echo $? >"$d/rc$r"; now >"$d/t$r" ) &
  done
  for r in 0 1 2 3; do while [ ! -s "$d/pid$r" ]; do sleep 0.05; done; pids_all+=("$(cat "$d/pid$r")"); done
  local what="$tp by hand${1:+ $*}, SIG$sig rank $victim"
  if ! wait_step "$d/out0"; then
    fail "$what: the job did not start" "$d/err0" "$d/err1"
    kill -KILL $(cat "$d"/pid?) 2>/dev/null; wait; return
  fi
  local t0; t0=$(now)
  kill -"$sig" "$(cat "$d/pid$victim")"
  local bound; bound=$(echo "$tmo + 2.5" | bc)  # the timeout, then teardown (store, transport)
  for _ in $(seq 600); do  # hang guard only: 60 s
    local left=0
    for r in 0 1 2 3; do [ "$r" = "$victim" ] || [ -s "$d/t$r" ] || left=1; done
    [ $left = 0 ] && break
    sleep 0.1
  done
  local bad="" rc t dt who
  for r in 0 1 2 3; do
    [ "$r" = "$victim" ] && continue
    rc=$(cat "$d/rc$r" 2>/dev/null); t=$(cat "$d/t$r" 2>/dev/null)
    who=$(grep "^l3d train:" "$d/err$r" | tail -n 1 | named)
    if [ -z "$t" ]; then bad="$bad rank $r still running;"; continue; fi
    dt=$(echo "$t - $t0" | bc)
    [ "${rc:-0}" != 0 ] || bad="$bad rank $r exited 0;"
    [ "$who" = "rank $victim" ] || bad="$bad rank $r named '${who:-nothing}';"
    [ "$(echo "$dt > $bound" | bc)" = 0 ] || bad="$bad rank $r took ${dt%????*} s (bound $bound);"
    grep -q "backtrace\|process_vm_readv" "$d/err$r" && bad="$bad rank $r crashed in the transport;"
  done
  kill -CONT "$(cat "$d/pid$victim")" 2>/dev/null
  kill -KILL $(cat "$d"/pid?) 2>/dev/null
  wait
  if [ -z "$bad" ]; then ok "$what: every survivor names it"
  else fail "$what:$bad" $(for r in 0 1 2 3; do [ "$r" = "$victim" ] || echo "$d/err$r"; done); fi
}

# launched TP SIG VICTIM TIMEOUT: the same under l3d launch (which stops the others once a
# rank exits): the launcher names the victim, and no rank's message names another rank.
launched() {
  local tp=$1 sig=$2 victim=$3 tmo=$4 d
  d=$(mktemp -d "$tmp/launch.XXXX")
  L3D_COMM_TIMEOUT=$tmo "$L3D" launch -n 4 --transport "$tp" -- \
    sh -c 'echo $$ >"$0/pid$RANK"; exec "$1" train --config "$2"' "$d" "$L3D" "$tmp/cfg.json" \
    >"$d/out" 2>"$d/err" &
  local lp=$!
  local what="$tp under l3d launch, SIG$sig rank $victim"
  for r in 0 1 2 3; do for _ in $(seq 600); do [ -s "$d/pid$r" ] && break; sleep 0.1; done; done
  pids_all+=($(cat "$d"/pid? 2>/dev/null))
  if ! wait_step "$d/out"; then
    fail "$what: the job did not start" "$d/err"
    kill -TERM $lp; wait; return
  fi
  kill -"$sig" "$(cat "$d/pid$victim")"
  for _ in $(seq 600); do kill -0 $lp 2>/dev/null || break; sleep 0.1; done  # hang guard 60 s
  local bad="" rc
  if kill -0 $lp 2>/dev/null; then bad=" the launcher still runs;"; kill -TERM $lp; fi
  wait $lp; rc=$?
  kill -CONT "$(cat "$d/pid$victim")" 2>/dev/null
  wait
  [ $rc = 1 ] || bad="$bad launcher exit $rc;"
  grep -q "backtrace\|process_vm_readv" "$d/err" && bad="$bad a rank crashed in the transport;"
  local who
  while IFS= read -r line; do
    who=$(echo "$line" | named)
    [ -z "$who" ] || [ "$who" = "rank $victim" ] || bad="$bad '${line:0:160}';"
  done < <(grep "l3d train:" "$d/err" | grep -v "^\[rank $victim\]")
  if [ "$sig" = KILL ]; then
    grep -q "l3d launch: rank $victim was killed by signal 9" "$d/err" || bad="$bad launcher did not name rank $victim;"
  else  # the survivors time out: the first to exit must name the stopped rank
    who=$(grep "l3d train:" "$d/err" | grep -v "^\[rank $victim\]" | head -n 1 | named)
    [ "$who" = "rank $victim" ] || bad="$bad first message names '${who:-nothing}';"
  fi
  if [ -z "$bad" ]; then ok "$what: the victim is named, nobody else"; else fail "$what:$bad" "$d/err"; fi
}

. "$(dirname "$0")/transports_lib.sh"
built=$(network_transports "$L3D")
for tp in $built; do
  for i in $(seq "$iters"); do
    by_hand "$tp" KILL $((i % 4)) 20
    by_hand "$tp" STOP $(((i + 1) % 4)) 3
    launched "$tp" KILL $(((i + 2) % 4)) 20
    launched "$tp" STOP $(((i + 3) % 4)) 2
  done
  # tp 2 x pp 2: the survivors learn of the death through split communicators, most of them
  # from a rank that gave up because of it, and must still name the victim, not that rank
  # (before: 2 runs in 7 blamed a live rank, "rank 0 failed: reported by a peer"). Every
  # victim, iters times over. Not over ofi yet: there libfabric 1.17's tcp;ofi_rxm segfaults
  # in fi_trecv in about 1 trial in 14 (a survivor posting a receive after rank 0's death),
  # a defect of its own; test_comm_fail's relayed_cause covers the naming over ofi.
  [ "$tp" = ofi ] && continue
  for i in $(seq $((4 * iters))); do
    by_hand "$tp" KILL $((i % 4)) 20 --tp 2 --pp 2
  done
done

echo "$passes passed, $fails failed"
[ $fails -eq 0 ] && [ $passes -gt 0 ]
