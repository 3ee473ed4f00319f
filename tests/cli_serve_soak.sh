#!/usr/bin/env bash
# A bounded soak of l3d serve (tests/serve_soak.js): L3D_SOAK_REQUESTS requests (default 4000)
# from 32 concurrent clients with dropped streams; nothing lost, memory flat. Needs node (no
# npm package). Usage: cli_serve_soak.sh /path/to/l3d
set -u
L3D=$1
if ! command -v node >/dev/null; then echo "SKIP: node is not installed"; exit 77; fi
. "$(dirname "$0")/serve_lib.sh"
serve_setup
"$L3D" train --steps 20 --save "$tmp/ck" >"$tmp/train.log" 2>&1 || { echo "FAIL training"; exit 1; }
# One malloc arena: glibc opens one per contended thread, whenever contention first happens,
# and a late one showed as 1.8 MB of "growth" in the second half once; and with one, every
# allocation under malloc's mmap threshold, from any thread, is in the brk heap that
# serve_soak.js holds to 512 bytes a request (a leak of 1 KiB a request failed it: +1812 kB).
export MALLOC_ARENA_MAX=1
start soak --checkpoint "$tmp/ck" --parallel 8 --queue 64
node "$(dirname "$0")/serve_soak.js" "$PORT" "$PID" "${L3D_SOAK_REQUESTS:-4000}" 32
rc=$?
kill -TERM "$PID"
wait "$PID" || { echo "FAIL the server exited $? on SIGTERM"; rc=1; }
pids=()
exit $rc
