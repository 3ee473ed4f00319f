# Shared by tests/cli_serve*.sh (sourced): the set-up, and starting l3d serve in the
# background. Needs L3D (the l3d under test).

# serve_setup: exits 77 (skipped) when this l3d has no HTTP server; else makes $tmp and the
# array pids, whose servers are killed and $tmp removed on exit
serve_setup() {
  if "$L3D" serve --help 2>&1 | grep -q "no HTTP server"; then
    echo "SKIP: this l3d was built without libmicrohttpd"; exit 77
  fi
  tmp=$(mktemp -d)
  pids=()
  trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
}

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
