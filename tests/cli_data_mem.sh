#!/usr/bin/env bash
# Large inputs stay bounded and announced: a run that cannot fit is refused before anything
# is allocated (exit 2 naming the sizes); a 200 MB text trains in bounded memory through a
# token cache that the next run reuses unchanged; progress lines appear on a terminal only. A
# cache that cannot be written beside the text (no permission, a full disk) goes to
# L3D_CACHE_DIR, else the run trains from the ids in memory with one warning; temporaries of
# runs killed while writing a cache are removed by the next run.
# Usage: cli_data_mem.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
mounted=""
trap '[ -z "$mounted" ] || umount "$mounted"; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT; [ -n "${KEEP:-}" ] && echo "tmp $tmp"
fails=0; passes=0
check() {  # check NAME CONDITION-EXIT-STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; passes=$((passes + 1)); else echo "FAIL $1"; fails=$((fails + 1)); fi
}
show() { sed 's/^/    /' "$1" | tail -5; }

# ---- memory: refused up front, exit 2, the sizes named --------------------------------------
timeout 60 "$L3D" train --model llama3-70b --steps 1 >"$tmp/70b.out" 2>"$tmp/70b.err"
rc=$?; [ $rc -eq 2 ]; check "llama3-70b --steps 1 refused with exit 2 (got $rc)" $?
grep -q "training llama3-70b (parameters .* GiB, gradients .* GiB, optimizer .* GiB, activations .*) needs .* GiB but only .* is available" "$tmp/70b.err"
check "the refusal names what is needed and what is available" $?
[ $rc -ne 2 ] && show "$tmp/70b.err"
! grep -q "^step" "$tmp/70b.out"; check "nothing trained" $?

# llama3-tiny needs 30.4 MiB (params, grads, AdamW, activations); its weights alone fit.
L3D_MEM_LIMIT=20M "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 >/dev/null 2>"$tmp/lim.err"
rc=$?; [ $rc -eq 2 ]; check "L3D_MEM_LIMIT=20M: tiny training refused with exit 2 (got $rc)" $?
grep -q "needs 30.4 MiB but only 20.0 MiB is available (L3D_MEM_LIMIT); nothing was allocated" "$tmp/lim.err"
check "the refusal names 30.4 MiB and the limit" $?
L3D_MEM_LIMIT=40M "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 >/dev/null 2>&1
check "L3D_MEM_LIMIT=40M: tiny training runs" $?
# Two ranks as threads of one process share its memory.
L3D_MEM_LIMIT=40M "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 --dp 2 >/dev/null 2>"$tmp/dp2.err"
rc=$?; [ $rc -eq 2 ] && grep -q "as 2 ranks in this process" "$tmp/dp2.err"
check "dp 2 as threads counts both ranks (exit $rc)" $?
# A device with memory of its own (mem_info; the test devices report L3D_DEVICE_MEMORY, as a
# GPU its own): the device part is checked against it, even where the machine has room.
L3D_DEVICE=cpu-opaque L3D_DEVICE_MEMORY=20M "$L3D" train --model llama3-tiny --steps 1 \
  --seq-len 64 >/dev/null 2>"$tmp/dev.err"
rc=$?; [ $rc -eq 2 ] && grep -q "needs 30.4 MiB but only 20.0 MiB is available (free memory of device cpu-opaque); nothing was allocated" "$tmp/dev.err"
check "cpu-opaque with 20 MiB: refused with exit 2 naming the device (exit $rc)" $?
[ $rc -ne 2 ] && show "$tmp/dev.err"
L3D_DEVICE=cpu-async L3D_DEVICE_MEMORY=40M "$L3D" train --model llama3-tiny --steps 1 \
  --seq-len 64 >/dev/null 2>&1
check "cpu-async with 40 MiB: tiny training runs" $?
L3D_DEVICE=cpu-opaque L3D_DEVICE_MEMORY=40M L3D_MEM_LIMIT=20M "$L3D" train --model llama3-tiny \
  --steps 1 --seq-len 64 >/dev/null 2>&1
check "the host's limit does not count against the device's memory" $?
L3D_DEVICE_MEMORY=x "$L3D" train --steps 1 >/dev/null 2>"$tmp/bad.err"
rc=$?; [ $rc -eq 2 ] && grep -q "L3D_DEVICE_MEMORY: 'x'" "$tmp/bad.err"
check "a bad L3D_DEVICE_MEMORY is exit 2 naming it (exit $rc)" $?
L3D_MEM_LIMIT=lots "$L3D" train --steps 1 >/dev/null 2>"$tmp/bad.err"
rc=$?; [ $rc -eq 2 ] && grep -q "L3D_MEM_LIMIT: 'lots'" "$tmp/bad.err"
check "a bad L3D_MEM_LIMIT is exit 2 naming it (exit $rc)" $?

# ---- a 200 MB text: bounded memory, a token cache reused --------------------------------
/usr/bin/python3 - "$tmp/big/big.txt" <<'PY'
import os, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
line = "The quick brown fox \u00e9\u20ac\U0001F600 jumps over the lazy dog. 0123456789\n".encode()
block = line * (1 << 16)
with open(sys.argv[1], "wb") as f:
    for _ in range(200 * 1000 * 1000 // len(block)): f.write(block)
PY
have_time=0; [ -x /usr/bin/time ] && have_time=1
have_script=0; command -v script >/dev/null && have_script=1
# run_big TAG: l3d train on big.txt, max RSS into $tmp/TAG.rss. A script file, not a shell
# function: script(1) starts $SHELL, and a dash there drops exported bash functions.
cat >"$tmp/run_big.sh" <<EOF_RUN
#!/bin/bash
if [ $have_time -eq 1 ]; then
  exec /usr/bin/time -f %M -o "$tmp/\$1.rss" "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 --data "$tmp/big/big.txt"
else
  exec "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 --data "$tmp/big/big.txt"
fi
EOF_RUN
chmod +x "$tmp/run_big.sh"
run_big() { "$tmp/run_big.sh" "$@"; }
# The first run on a terminal (script gives it a pty) draws its progress line. Tokenizing 200 MB
# takes under a second on a fast machine, less than the default delay before a line is drawn:
# L3D_PROGRESS_AFTER=0 draws it whatever the machine's speed.
if [ $have_script -eq 1 ]; then
  L3D_PROGRESS_AFTER=0 SHELL=/bin/sh script -q -e -c "$tmp/run_big.sh first" /dev/null >"$tmp/first.out" 2>&1
else
  run_big first >"$tmp/first.out" 2>&1
fi
check "train on a 200 MB text" $?
grep -q "^step      1/1" "$tmp/first.out" || show "$tmp/first.out"
cache=$(ls "$tmp"/big/big.txt.l3d-bytes-*.bin 2>/dev/null)
[ -n "$cache" ] && [ "$(stat -c %s "$cache")" -eq $(( ($(stat -c %s "$tmp/big/big.txt") + 2) * 4 )) ]
check "token cache beside the text: BOS + one id per byte + EOS, 4 bytes each" $?
if [ $have_script -eq 1 ]; then
  grep -aqE "tokenizing $tmp/big/big.txt: [0-9.]+ MiB / 189.[78] MiB \([0-9]+%\), [0-9.]+ MiB/s" "$tmp/first.out"
  check "on a terminal: a tokenizing progress line with bytes and rate" $?
fi
before=$(stat -c '%i %Y %s' "$cache")
run_big second >"$tmp/second.out" 2>"$tmp/second.err"
check "second run" $?
[ -n "$cache" ] && [ "$(stat -c '%i %Y %s' "$cache")" = "$before" ] && [ "$(ls "$tmp"/big | wc -l)" -eq 2 ]
check "second run maps the same cache (inode and mtime unchanged, no other file)" $?
[ ! -s "$tmp/second.err" ]; check "not a terminal: no progress lines, nothing on stderr" $?
[ -s "$tmp/second.err" ] && show "$tmp/second.err"
total=$(sed -nE 's/^memory: .*total ([0-9.]+) MiB on device .*/\1/p' "$tmp/second.out")
if [ $have_time -eq 1 ] && [ -n "$total" ]; then
  for tag in first second; do
    rss=$(tail -1 "$tmp/$tag.rss")
    # A baseline run of this model on a small text needs about 40 MiB: the model plus the
    # process. The text (200 MB) and its ids (800 MB) must not add to it.
    /usr/bin/python3 -c 'import sys; sys.exit(0 if int(sys.argv[1]) / 1024 < float(sys.argv[2]) + 64 else 1)' "$rss" "$total"
    check "$tag run: max RSS $((rss / 1024)) MiB < model $total MiB + 64 MiB" $?
  done
fi

# ---- a text in a directory the user cannot write: the cache goes to L3D_CACHE_DIR ------
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
  mkdir -p "$tmp/ro" "$tmp/cache" && chmod 755 "$tmp" "$tmp/ro"
  head -c 5000000 "$tmp/big/big.txt" > "$tmp/ro/t.txt"; printf '\n' >> "$tmp/ro/t.txt"
  chown nobody "$tmp/cache"
  as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups env HOME=/nonexistent L3D_CACHE_DIR="$tmp/cache" "$@"; }
  if as_nobody test -x "$L3D"; then
    as_nobody "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 --data "$tmp/ro/t.txt" >"$tmp/ro.out" 2>&1
    check "unwritable text directory: the run still works" $?
    [ "$(ls "$tmp/ro" | wc -l)" -eq 1 ] && ls "$tmp"/cache/t.txt.l3d-bytes-*.bin >/dev/null 2>&1
    check "the cache went to L3D_CACHE_DIR, nothing beside the text" $?
  else
    echo "skip unwritable-directory case: $L3D is not executable by nobody"
  fi
fi

# ---- a full disk beside the text: L3D_CACHE_DIR, else memory --------------------------------
# An 8 MiB tmpfs holds the 5 MB text but not its 20 MB cache (before: the run stopped with
# "writing the token cache ...: No space left on device"). Mounting needs root.
mkdir -p "$tmp/full" "$tmp/cache2"
if mount -t tmpfs -o size=8M tmpfs "$tmp/full" 2>"$tmp/mount.err"; then
  mounted="$tmp/full"
  head -c 5000000 "$tmp/big/big.txt" > "$tmp/full/t.txt"; printf '\n' >> "$tmp/full/t.txt"
  small_run() { "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 --data "$tmp/full/t.txt"; }
  L3D_CACHE_DIR="$tmp/cache2" small_run >"$tmp/full1.out" 2>"$tmp/full1.err"
  rc=$?; [ $rc -eq 0 ] && grep -q "^step      1/1" "$tmp/full1.out"
  check "full disk beside the text: the run trains (exit $rc)" $?
  [ $rc -ne 0 ] && show "$tmp/full1.err"
  [ "$(ls -A "$tmp/full")" = t.txt ] && ls "$tmp"/cache2/t.txt.l3d-bytes-*.bin >/dev/null 2>&1 &&
    [ ! -s "$tmp/full1.err" ]
  check "the cache went to L3D_CACHE_DIR, no temporary beside the text, nothing on stderr" $?
  L3D_CACHE_DIR="$tmp/full/cache" small_run >"$tmp/full2.out" 2>"$tmp/full2.err"
  rc=$?; [ $rc -eq 0 ] && grep -q "^step      1/1" "$tmp/full2.out"
  check "L3D_CACHE_DIR full too: the run still trains (exit $rc)" $?
  [ "$(wc -l <"$tmp/full2.err")" -eq 1 ] &&
    grep -q "warn: cannot write the token cache $tmp/full/t.txt.l3d-bytes-[0-9a-f]*.bin: No space left on device; nor $tmp/full/cache/t.txt.l3d-bytes-[0-9a-f]*.bin: No space left on device; tokenizing $tmp/full/t.txt into memory instead" "$tmp/full2.err"
  ok=$?; check "one warning line naming both caches and the reason" $ok
  [ $ok -ne 0 ] && show "$tmp/full2.err"
  [ "$(ls -A "$tmp/full")" = "$(printf 'cache\nt.txt')" ] && [ -z "$(ls -A "$tmp/full/cache")" ]
  check "no temporary left in either place" $?
  umount "$tmp/full" && mounted=""
else
  echo "skip full-disk cases: cannot mount a tmpfs here: $(head -n 1 "$tmp/mount.err")"
fi

# ---- temporaries of runs killed while writing a cache -------------------------------------
# Their names give the writer's pid and host (16 hex digits: the FNV-1a 64 of the boot id and
# the pid namespace); a run that looks for the cache removes this host's whose process is gone
# (before: none was ever removed), and no other.
mkdir -p "$tmp/stale"
head -c 5000000 "$tmp/big/big.txt" > "$tmp/stale/t.txt"; printf '\n' >> "$tmp/stale/t.txt"
stale_run() { "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 --data "$tmp/stale/t.txt"; }
stale_run >/dev/null 2>&1
c=$(ls "$tmp"/stale/t.txt.l3d-bytes-*.bin 2>/dev/null)
tag=$(/usr/bin/python3 -c '
import os
s = open("/proc/sys/kernel/random/boot_id").read().strip() + " " + os.readlink("/proc/self/ns/pid")
h = 0xcbf29ce484222325
for b in s.encode(): h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
print("%016x" % h)')
sh -c 'exit 0' & dead=$!; wait $dead
if [ -n "$c" ]; then
  touch "$c.tmp.$dead.$tag.AbC123"              # this host, its process gone: removed
  touch "$c.tmp.$$.$tag.AbC123"                 # this shell's: alive, kept
  touch "$c.tmp.$dead.0123456789abcdef.AbC123"  # another machine's (a shared disk): kept
  touch "$c.tmp.$dead.AbC123"                   # no host in the name: kept
fi
stale_run >/dev/null 2>"$tmp/stale.err"
rc=$?; [ $rc -eq 0 ] && [ -n "$c" ] && [ ! -e "$c.tmp.$dead.$tag.AbC123" ] &&
  [ -e "$c.tmp.$$.$tag.AbC123" ] && [ -e "$c.tmp.$dead.0123456789abcdef.AbC123" ] &&
  [ -e "$c.tmp.$dead.AbC123" ]
check "a run removes the cache's temporaries of dead processes on this host, and only those" $?
[ $rc -ne 0 ] && show "$tmp/stale.err"
# A real kill while the cache is written (the 200 MB text, linked under another name: a new
# cache); the next run removes what it left.
mkdir -p "$tmp/kill" && ln "$tmp/big/big.txt" "$tmp/kill/big.txt"
"$L3D" train --model llama3-tiny --steps 1 --seq-len 64 --data "$tmp/kill/big.txt" >/dev/null 2>&1 &
kp=$!
for _ in $(seq 3000); do ls "$tmp"/kill/*.tmp.* >/dev/null 2>&1 && break; kill -0 $kp 2>/dev/null || break; sleep 0.01; done
kill -KILL $kp 2>/dev/null; wait $kp 2>/dev/null
if ls "$tmp"/kill/*.tmp.* >/dev/null 2>&1; then
  "$L3D" train --model llama3-tiny --steps 1 --seq-len 64 --data "$tmp/kill/big.txt" >/dev/null 2>"$tmp/kill.err"
  rc=$?; [ $rc -eq 0 ] && [ -z "$(ls "$tmp"/kill/*.tmp.* 2>/dev/null)" ]
  check "the temporary of a run killed while tokenizing is removed by the next run" $?
else
  echo "skip the killed-run case: the run finished before it could be killed"
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
