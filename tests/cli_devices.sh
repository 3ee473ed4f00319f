#!/usr/bin/env bash
# The issue-27 job on the test devices, through the CLI: a dp 2 x tp 2 x pp 2 ZeRO-3 run as
# threads, saved at step 3, resumed to step 6, then generation and serving with tp 2 x pp 2
# from it, and `l3d forward`; and a dp 2 job launched as processes over each network
# transport. On cpu-opaque (memory the host cannot read) and cpu-async (ops that finish at the
# next wait) every printed loss, gradient norm and byte count, every saved shard, the generated
# and the served text and the logits are the cpu device's, byte for byte; on cpu-async also
# with the local transport taking the device buffers as they are (L3D_LOCAL_DEVICE_BUFFERS=1,
# NCCL's path).
# Usage: cli_devices.sh /path/to/l3d
set -u
L3D=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
check() {  # check NAME STATUS [FILE...]: STATUS 0 passes; otherwise FILEs are shown
  local name=$1 rc=$2; shift 2
  if [ "$rc" -eq 0 ]; then echo "ok   $name"; passes=$((passes + 1)); return; fi
  echo "FAIL $name"; for f in "$@"; do sed 's/^/    /' "$f" | tail -8; done
  fails=$((fails + 1))
}
export L3D_COMM_TIMEOUT=60
# What must match: the step and summary lines without the timings (tok/s, mfu, seconds) and
# the paths, which name the device's own directory.
numbers() { grep -E "^(step|done)" "$1" | sed -E 's/ \| [0-9]+ tok\/s \| mfu [0-9.]+%//; s/ in [0-9.]+ s//; s/checkpoint: .*//'; }

cat >"$tmp/z3.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "zero_optimization": {"stage": 3}, "parallel": {"dp": 2, "tp": 2, "pp": 2}}
JSON
# cpu-async-direct: cpu-async with the local transport taking device buffers as NCCL does
# (L3D_LOCAL_DEVICE_BUFFERS=1: the core hands them over as they are, not through host copies).
for d in cpu cpu-opaque cpu-async cpu-async-direct; do
  case $d in
    *-direct) export L3D_DEVICE=${d%-direct} L3D_LOCAL_DEVICE_BUFFERS=1 ;;
    *) export L3D_DEVICE=$d; unset L3D_LOCAL_DEVICE_BUFFERS ;;
  esac
  timeout 300 "$L3D" train --config "$tmp/z3.json" --steps 3 --save "$tmp/ck.$d" >"$tmp/a.$d" 2>&1
  check "$d: dp 2 x tp 2 x pp 2 ZeRO-3, 3 steps, saved" $? "$tmp/a.$d"
  timeout 300 "$L3D" train --config "$tmp/z3.json" --steps 6 --resume "$tmp/ck.$d" \
    --save "$tmp/ck.$d" >"$tmp/b.$d" 2>&1
  check "$d: resumed to step 6 and saved" $? "$tmp/b.$d"
  timeout 300 "$L3D" generate --checkpoint "$tmp/ck.$d" --tp 2 --pp 2 --prompt "The GNU" \
    --max-tokens 24 --temperature 0 >"$tmp/g.$d" 2>"$tmp/ge.$d"
  check "$d: generate --tp 2 --pp 2 from it" $? "$tmp/ge.$d"
  timeout 300 "$L3D" forward --checkpoint "$tmp/ck.$d" --tokens 1,72,101,108,108,111 \
    --out "$tmp/f.$d" >"$tmp/fo.$d" 2>&1
  check "$d: forward" $? "$tmp/fo.$d"
done
unset L3D_DEVICE L3D_LOCAL_DEVICE_BUFFERS
grep -q "^step      6/6 | loss" "$tmp/b.cpu"; check "the cpu run printed its steps" $? "$tmp/b.cpu"
for d in cpu-opaque cpu-async cpu-async-direct; do
  for r in a b; do
    diff <(numbers "$tmp/$r.cpu") <(numbers "$tmp/$r.$d") >"$tmp/diff" 2>&1
    check "$d: run $r prints the cpu device's losses, norms and bytes" $? "$tmp/diff"
  done
  same=0
  for f in "$tmp/ck.cpu"/*.safetensors; do
    cmp -s "$f" "$tmp/ck.$d/$(basename "$f")" || same=1
  done
  check "$d: every saved shard is the cpu device's, byte for byte" $same
  cmp -s "$tmp/g.cpu" "$tmp/g.$d"; check "$d: the same generated text" $? "$tmp/g.$d"
  cmp -s "$tmp/f.cpu" "$tmp/f.$d"; check "$d: the same logits" $?
done

# --device on generate and forward names the device as L3D_DEVICE does: the same text and
# logits from the cpu device's checkpoint on cpu-async; an unknown name is exit 2 listing the
# built ones.
timeout 300 "$L3D" generate --device cpu-async --checkpoint "$tmp/ck.cpu" --tp 2 --pp 2 \
  --prompt "The GNU" --max-tokens 24 --temperature 0 >"$tmp/g.flag" 2>"$tmp/ge.flag"
check "generate --device cpu-async" $? "$tmp/ge.flag"
cmp -s "$tmp/g.cpu" "$tmp/g.flag"; check "generate --device cpu-async: the same text" $? "$tmp/g.flag"
timeout 300 "$L3D" forward --device cpu-opaque --checkpoint "$tmp/ck.cpu" \
  --tokens 1,72,101,108,108,111 --out "$tmp/f.flag" >"$tmp/fo.flag" 2>&1
check "forward --device cpu-opaque" $? "$tmp/fo.flag"
cmp -s "$tmp/f.cpu" "$tmp/f.flag"; check "forward --device cpu-opaque: the same logits" $?
for c in "generate --prompt x" "forward --tokens 1 --out $tmp/f.bad"; do
  # (the command's own flags split on purpose)
  timeout 60 "$L3D" $c --device gpu --checkpoint "$tmp/ck.cpu" >"$tmp/bad" 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "'gpu' is not built in" "$tmp/bad"
  check "${c%% *} --device gpu: exit 2 naming the built devices (rc $rc)" $? "$tmp/bad"
done

# l3d serve --tp 2 x pp 2 on each device from the cpu device's checkpoint: a request alone
# (prompt chunks of 4 tokens, then its tokens) gives the cpu device's text; then four at once,
# whose steps feed generated tokens and prompt chunks in one pass, are all answered.
serve_on() {  # serve_on DEVICE: the server's port in $port, its pid in $spid
  "$L3D" serve --device "$1" --checkpoint "$tmp/ck.cpu" --tp 2 --pp 2 --parallel 4 --port 0 \
    --threads 1 --prefill-chunk 4 >"$tmp/s.$1.out" 2>"$tmp/s.$1.err" &
  spid=$!
  port=
  for _ in $(seq 1 300); do
    port=$(sed -n 's|^listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$tmp/s.$1.out")
    [ -n "$port" ] && return 0
    kill -0 "$spid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
answer() {  # answer FILE: the completion's text and token count
  /usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(repr(d["choices"][0]["text"]), d["usage"]["completion_tokens"])' "$1" 2>&1
}
if command -v curl >/dev/null && ! "$L3D" serve --help 2>&1 | grep -q "no HTTP server"; then
  for d in cpu cpu-opaque cpu-async; do
    serve_on "$d"; check "$d: serve --tp 2 --pp 2 starts" $? "$tmp/s.$d.err"
    curl -s "http://127.0.0.1:$port/v1/completions" -o "$tmp/s.$d.alone" \
      -d '{"prompt":"The GNU General","max_tokens":12,"temperature":0}'
    cpids=()
    for i in 1 2 3 4; do
      curl -s "http://127.0.0.1:$port/v1/completions" -o "$tmp/s.$d.$i" \
        -d "{\"prompt\":\"Device number $i says\",\"max_tokens\":12,\"temperature\":0}" &
      cpids+=($!)
    done
    wait "${cpids[@]}"
    ok=0
    for i in 1 2 3 4; do answer "$tmp/s.$d.$i" | grep -q " 12$" && ok=$((ok + 1)); done
    [ $ok -eq 4 ]; check "$d: four requests at once all answered ($ok)" $? "$tmp/s.$d.err"
    kill -TERM "$spid"; wait "$spid"; check "$d: serve exits 0 on SIGTERM" $? "$tmp/s.$d.err"
  done
  for d in cpu-opaque cpu-async; do
    [ "$(answer "$tmp/s.cpu.alone")" = "$(answer "$tmp/s.$d.alone")" ] &&
      answer "$tmp/s.cpu.alone" | grep -q " 12$"
    check "$d: serve's text is the cpu device's" $? "$tmp/s.$d.alone"
  done
fi

# Processes over the network transports: their buffers are host memory, the device's are
# staged (docs/comm.md).
. "$(dirname "$0")/transports_lib.sh"
built=$(network_transports "$L3D")
for tp in $built; do
  for d in cpu cpu-opaque cpu-async; do
    L3D_DEVICE=$d UCX_TLS=tcp timeout 300 "$L3D" launch -n 2 --transport "$tp" -- \
      "$L3D" train --dp 2 --steps 3 >"$tmp/l.$tp.$d" 2>&1
    check "$tp, $d: dp 2 as two processes" $? "$tmp/l.$tp.$d"
  done
  for d in cpu-opaque cpu-async; do
    diff <(numbers "$tmp/l.$tp.cpu") <(numbers "$tmp/l.$tp.$d") >"$tmp/diff" 2>&1
    check "$tp, $d: the cpu device's numbers" $? "$tmp/diff"
  done
done

if [ $fails -ne 0 ]; then echo "$fails failed, $passes passed"; exit 1; fi
echo "all $passes passed"
