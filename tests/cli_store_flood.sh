#!/usr/bin/env bash
# The rendezvous port needs no token to connect to. 100 idle connections (and a stream of
# connections that send garbage) held open on it while a 4-rank job starts must neither keep
# the ranks out (before: 72 idle connections filled every slot, and ranks 1-3 failed with
# "lost the store") nor flood the log (before: one warning per connection). Loopback only,
# bounded: the flooder gives up after 30 s.
# Usage: cli_store_flood.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
fl=
trap '[ -n "$fl" ] && kill $fl 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | cut -c1-300 | head -20; done; fails=$((fails + 1)); }

cat >"$tmp/cfg.json" <<'EOF'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "train": {"steps": 3, "threads": 1}, "data": {"seq_len": 32}}
EOF
port=$("$L3D" launch -n 1 -- sh -c 'echo $MASTER_PORT')
port=${port#\[rank 0\] }

# The flooder: keeps up to 100 idle connections open (reconnecting those the store closes) and
# opens one garbage-sending connection per 10 ms, until the job is done (stop file) or 30 s.
cat >"$tmp/flood.py" <<'EOF'
import os, socket, sys, time
port, stop = int(sys.argv[1]), sys.argv[2]
idle, t_end = [], time.time() + 30
def conn():
    s = socket.socket(); s.settimeout(0.2)
    try: s.connect(("127.0.0.1", port)); return s
    except OSError: s.close(); return None
while time.time() < t_end and not os.path.exists(stop):
    alive = []
    for s in idle:
        try:
            s.setblocking(False)
            if s.recv(1) == b"": s.close(); continue  # closed by the store
        except BlockingIOError: pass
        except OSError: s.close(); continue
        alive.append(s)
    idle = alive
    while len(idle) < 100:
        s = conn()
        if s is None: break
        idle.append(s)
    g = conn()
    if g is not None:
        try: g.sendall(b"GET / HTTP/1.0\r\n\r\n")
        except OSError: pass
        g.close()
    time.sleep(0.01)
print(len(idle), "idle at the end", file=sys.stderr)
EOF
python3 "$tmp/flood.py" "$port" "$tmp/stop" 2>"$tmp/flood.err" &
fl=$!
sleep 1  # the flooder retries until rank 0 listens; give it a head start
L3D_COMM_TIMEOUT=60 "$L3D" launch -n 4 --port "$port" -- "$L3D" train --config "$tmp/cfg.json" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
touch "$tmp/stop"
wait $fl; fl=
if [ $rc -eq 0 ] && grep -q "step  *3/3" "$tmp/out"; then
  ok "a 4-rank job starts and finishes with 100 idle connections and garbage on its store port"
else
  fail "job under a connection flood (exit $rc)" "$tmp/err" "$tmp/flood.err"
fi
n=$(grep -c "bootstrap:" "$tmp/err")
if [ "$n" -le 12 ] && grep -q "connections that sent no valid hello" "$tmp/err"; then
  ok "the store's warnings about them are summarised ($n lines)"
else
  fail "store warnings: $n lines (at most 12, with a summary)" "$tmp/err"
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ] && [ $passes -gt 0 ]
