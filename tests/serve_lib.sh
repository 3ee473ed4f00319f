# Shared by tests/cli_serve*.sh (sourced): starting l3d serve in the background.
# Needs L3D (the l3d under test), tmp (a scratch directory) and the array pids (killed on exit).

# start NAME FLAGS...: a server on a free port; sets PORT and PID once it prints "listening"
start() {
  local name=$1; shift
  "$L3D" serve --port 0 --threads 1 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  PID=$!
  pids+=("$PID")
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's|^listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$tmp/$name.out")
    [ -n "$PORT" ] && return 0
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL $name did not start:"; sed 's/^/    /' "$tmp/$name.err" | tail -5
  exit 1
}
