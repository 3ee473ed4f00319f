#!/usr/bin/env bash
# End-to-end training through the CLI: the seed DeepSpeed config starts a run; a run is
# deterministic; --resume continues bit-identically; a save interrupted mid-way leaves the
# previous checkpoint whole; generate and forward work on the result.
# Usage: cli_train.sh /path/to/l3d
set -u
L3D=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
check() {  # check NAME CONDITION-EXIT-STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; passes=$((passes + 1)); else echo "FAIL $1"; fails=$((fails + 1)); fi
}
losses() { /usr/bin/python3 -c 'import json,sys; [print(repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1" 2>/dev/null \
           || sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }

# The seed user's DeepSpeed file must start a run (2 steps; micro 4 x accumulation 8).
"$L3D" train --config "$here/data/ds_config_seed.json" --steps 2 --seq-len 32 >"$tmp/seed.out" 2>&1
rc=$?; check "seed ds_config starts a run" $rc
grep -q "note: .*fp16" "$tmp/seed.out"; check "seed run reports fp16 as not yet effective" $?
grep -q "batch 32 = micro 4 x accumulation 8" "$tmp/seed.out"; check "seed run batch identity" $?
[ $rc -ne 0 ] && sed 's/^/    /' "$tmp/seed.out" | tail -5

common=(--seq-len 32 --threads 2)
"$L3D" train "${common[@]}" --steps 6 --metrics "$tmp/a.jsonl" >"$tmp/a.out" 2>&1; check "6-step run" $?
"$L3D" train "${common[@]}" --steps 6 --metrics "$tmp/b.jsonl" >/dev/null 2>&1; check "second 6-step run" $?
diff <(losses "$tmp/a.jsonl") <(losses "$tmp/b.jsonl") >/dev/null; check "same config and seed: bit-identical losses" $?
[ -s "$tmp/a.svg" ] && grep -q "<polyline" "$tmp/a.svg"; check "svg loss curve beside the metrics" $?
grep -q "memory: parameters" "$tmp/a.out"; check "memory breakdown printed" $?

"$L3D" train "${common[@]}" --steps 3 --save "$tmp/ck" >/dev/null 2>&1; check "3 steps then save" $?
"$L3D" train "${common[@]}" --steps 6 --resume "$tmp/ck" --metrics "$tmp/r.jsonl" >/dev/null 2>&1; check "resume to step 6" $?
diff <(losses "$tmp/a.jsonl" | tail -3) <(losses "$tmp/r.jsonl") >/dev/null; check "resumed losses bit-identical to the uninterrupted run" $?

# A save killed mid-way: the previous checkpoint must stay whole. Make the target's
# replacement fail by putting a non-directory where the temp dir would go.
cp -r "$tmp/ck" "$tmp/ck.before"
"$L3D" train "${common[@]}" --steps 4 --save "$tmp/ck" >/dev/null 2>&1 &
pid=$!
sleep 0.3; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
if [ -f "$tmp/ck/trainer_state.json" ]; then
  # whichever checkpoint is there must be whole and loadable
  "$L3D" forward --checkpoint "$tmp/ck" --tokens 1,2,3 --out "$tmp/l.bin" >/dev/null 2>&1
  check "checkpoint loadable after a killed save" $?
else
  check "checkpoint still present after a killed save" 1
fi

"$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" --max-tokens 16 --seed 3 >"$tmp/g1" 2>"$tmp/g1.err"
check "generate runs" $?
"$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" --max-tokens 16 --seed 3 >"$tmp/g2" 2>/dev/null
cmp -s "$tmp/g1" "$tmp/g2"; check "generate with a seed is reproducible" $?
grep -q "tokens/s" "$tmp/g1.err"; check "generate reports tokens/s" $?
"$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" --max-tokens 8 --temperature 0 >"$tmp/g3" 2>/dev/null
check "greedy generate runs" $?

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
