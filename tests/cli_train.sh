#!/usr/bin/env bash
# End-to-end training through the CLI: the seed DeepSpeed config starts a run; a run is
# deterministic; --resume continues bit-identically; the main job (no config file) warms up,
# decays, evaluates a held-out tail and ends on one summary line; a save interrupted mid-way
# leaves the previous checkpoint whole; generate and forward work on the result.
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
# Run in $tmp: its tensorboard section writes ./tensorboard/llama3_3d_tp (tests/cli_monitor.sh
# reads such files back).
(cd "$tmp" && "$L3D" train --config "$here/data/ds_config_seed.json" --steps 2 --seq-len 32) >"$tmp/seed.out" 2>&1
rc=$?; check "seed ds_config starts a run" $rc
ls "$tmp"/tensorboard/llama3_3d_tp/events.out.tfevents.* >/dev/null 2>&1; check "seed run writes its tensorboard events" $?
[ "$(grep 'note:' "$tmp/seed.out" | grep -vc 'MFU roof')" = 0 ]
check "seed run: no note, every key effective (fp16, ZeRO-3, offload, partition_activations)" $?
grep -q "batch 32 = micro 4 x accumulation 8" "$tmp/seed.out"; check "seed run batch identity" $?
[ $rc -ne 0 ] && sed 's/^/    /' "$tmp/seed.out" | tail -5

common=(--seq-len 32 --threads 2)
"$L3D" train "${common[@]}" --steps 6 --metrics "$tmp/a.jsonl" >"$tmp/a.out" 2>&1; check "6-step run" $?
"$L3D" train "${common[@]}" --steps 6 --metrics "$tmp/b.jsonl" >/dev/null 2>&1; check "second 6-step run" $?
diff <(losses "$tmp/a.jsonl") <(losses "$tmp/b.jsonl") >/dev/null; check "same config and seed: bit-identical losses" $?
[ -s "$tmp/a.svg" ] && grep -q "<polyline" "$tmp/a.svg"; check "svg loss curve beside the metrics" $?
grep -q "memory: parameters" "$tmp/a.out"; check "memory breakdown printed" $?

# The main job's schedule for 6 steps written out as DeepSpeed's scheduler: the runs below
# that need a config file (where no scheduler would mean a constant lr) train as the main job.
sched6='"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 3, "total_num_steps": 6, "warmup_type": "linear", "warmup_min_ratio": 0, "cos_min_ratio": 0.1}}'
echo "{$sched6}" > "$tmp/sched6.json"

# Activation checkpointing recomputes each layer in the backward: same losses to the bit,
# smaller activation memory.
echo "{\"activation_checkpointing\": {\"partition_activations\": false}, $sched6}" > "$tmp/ac.json"
"$L3D" train --config "$tmp/ac.json" "${common[@]}" --steps 6 --metrics "$tmp/ac.jsonl" >"$tmp/ac.out" 2>&1; check "run with activation checkpointing" $?
diff <(losses "$tmp/a.jsonl") <(losses "$tmp/ac.jsonl") >/dev/null; check "activation checkpointing: bit-identical losses" $?
act() { sed -nE 's/.*activations ([0-9.]+) MiB.*/\1/p' "$1"; }
/usr/bin/python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$(act "$tmp/ac.out")" "$(act "$tmp/a.out")"
check "activation checkpointing: less activation memory ($(act "$tmp/ac.out") vs $(act "$tmp/a.out") MiB)" $?

# The first 3 of the 6 steps (the schedule is the file's, not --steps'), then the rest.
"$L3D" train --config "$tmp/sched6.json" "${common[@]}" --steps 3 --save "$tmp/ck" >/dev/null 2>&1; check "3 steps then save" $?
"$L3D" train --config "$tmp/sched6.json" "${common[@]}" --steps 6 --resume "$tmp/ck" --metrics "$tmp/r.jsonl" >/dev/null 2>&1; check "resume to step 6" $?
diff <(losses "$tmp/a.jsonl" | tail -3) <(losses "$tmp/r.jsonl") >/dev/null; check "resumed losses bit-identical to the uninterrupted run" $?

# ---- the main job: what `l3d train` without a config file does ---------------------------
# llama3d's schedule over --steps (warm-up, cosine to a floor), a held-out eval tail, and one
# summary line at the end; a config file keeps DeepSpeed's meaning (no scheduler: constant lr,
# no eval unless asked).
"$L3D" train "${common[@]}" --steps 20 --metrics "$tmp/m.jsonl" --save "$tmp/mck" >"$tmp/m.out" 2>"$tmp/m.err"
check "main job, 20 steps with metrics and a checkpoint" $?
/usr/bin/python3 - "$tmp/m.jsonl" <<'P'; check "main job: lr 0 at step 1, rising over the warm-up, then falling to the floor (1e-4) at step 20, not 200" $?
import json, sys
lr = [json.loads(l)["lr"] for l in open(sys.argv[1])]
peak = lr.index(max(lr))
assert len(lr) == 20 and lr[0] == 0 and 4 <= peak <= 7, lr
assert all(a < b for a, b in zip(lr[1:peak], lr[2:peak + 1])), lr           # warm-up
assert abs(max(lr) - 1e-3) < 2e-5, lr
assert all(a > b for a, b in zip(lr[peak:], lr[peak + 1:])), lr             # decay
assert 1e-4 <= lr[-1] <= 1.1e-4, lr                                         # the floor by step 20
P
grep -q "step     20/20 | loss [0-9.]* | eval [0-9.]* | lr" "$tmp/m.out"; check "main job: the last step prints its eval loss" $?
grep -q "eval every 50 steps and at the end: 4 batches of the last 0.1 of the data" "$tmp/m.out"; check "main job: start-up names the eval tail" $?
/usr/bin/python3 - "$tmp/m.jsonl" "$tmp/m.out" "$tmp" <<'P'; check "main job: one summary line, last, with 5,120 tokens (20 x 8 x 32), losses, metrics and checkpoint" $?
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = open(sys.argv[2]).read().splitlines()
done = [l for l in out if l.startswith("done:")]
assert len(done) == 1 and out[-1] == done[0], done
want = (r"done: 20 steps, 5,120 tokens in [0-9]+\.[0-9] s \| train loss %.4f -> %.4f \| "
        r"eval loss %.4f \| metrics: %s/m\.jsonl \| checkpoint: %s/mck$"
        % (rows[0]["loss"], rows[-1]["loss"], rows[-1]["eval_loss"], re.escape(sys.argv[3]),
           re.escape(sys.argv[3])))
assert re.match(want, done[0]), (done[0], want)
P
echo '{}' > "$tmp/plain.json"
"$L3D" train --config "$tmp/plain.json" "${common[@]}" --steps 6 --metrics "$tmp/p.jsonl" >"$tmp/p.out" 2>&1
check "a config file without a scheduler runs" $?
/usr/bin/python3 - "$tmp/p.jsonl" "$tmp/p.out" <<'P'; check "config without a scheduler: constant lr 1e-3, no eval, a summary without eval or checkpoint" $?
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 6 and all(abs(r["lr"] - 1e-3) < 1e-9 for r in rows), [r["lr"] for r in rows]
assert not any("eval_loss" in r for r in rows)
out = open(sys.argv[2]).read()
assert "| eval " not in out and "schedule constant" in out and "eval every" not in out, out
done = [l for l in out.splitlines() if l.startswith("done:")]
assert len(done) == 1 and done[0].startswith("done: 6 steps, 1,536 tokens in "), done
assert "eval loss" not in done[0] and "checkpoint" not in done[0] and done[0].endswith("p.jsonl"), done
P
"$L3D" train "${common[@]}" --dry-run >"$tmp/dry.out" 2>&1
[ $? -eq 0 ] && ! grep -q "^done:" "$tmp/dry.out"; check "--dry-run prints no summary" $?
"$L3D" train "${common[@]}" --steps 2 --metrics "$tmp/no/such/dir/m.jsonl" >"$tmp/bad.out" 2>&1
[ $? -eq 1 ] && ! grep -q "^done:" "$tmp/bad.out"; check "a failed run prints no summary" $?
"$L3D" train --seq-len 32 --threads 1 --dp 2 --steps 2 --metrics "$tmp/no/such/dir/m.jsonl" >"$tmp/bad2.out" 2>&1
[ $? -eq 1 ] && ! grep -q "^done:" "$tmp/bad2.out"; check "a failed run of two thread ranks prints no summary" $?
"$L3D" train --seq-len 32 --threads 1 --dp 2 --steps 2 >"$tmp/dp2.out" 2>&1
[ $? -eq 0 ] && [ "$(grep -c "^done: 2 steps, 1,024 tokens in " "$tmp/dp2.out")" = 1 ]
check "dp 2 as threads: one summary (rank 0), 2 x 16 x 32 tokens" $?
# Launched ranks (processes) over the first network transport built, as tests/cli_parallel.sh
# finds them.
built=$("$L3D" launch -n 1 --transport nosuch -- true 2>&1 | sed -nE 's/.*\(built: ([^)]*)\).*/\1/p' | tr -d ,)
set -- $built
if [ $# -eq 0 ] || [ "${1%;}" = none ]; then
  echo "skip launched ranks: no network transport built"
else
  "$L3D" launch -n 2 --transport "$1" -- "$L3D" train --seq-len 32 --threads 1 --steps 2 >"$tmp/l2.out" 2>&1
  [ $? -eq 0 ] && [ "$(grep -c "done: 2 steps, 1,024 tokens in " "$tmp/l2.out")" = 1 ] &&
    grep -q "^\[rank 0\] done: " "$tmp/l2.out"
  check "2 launched ranks ($1): one summary, rank 0's" $?
fi
# A data set too short to hold out the default tail trains on all of it, and says so.
printf 'a short text, shorter than ten sequences of 32 tokens. ' > "$tmp/short.txt"
"$L3D" train "${common[@]}" --data "$tmp/short.txt" --steps 2 >"$tmp/short.out" 2>&1
[ $? -eq 0 ] && grep -q "no eval: 57 tokens are too few to hold out 0.1" "$tmp/short.out" &&
  grep -q "^done: 2 steps, 512 tokens in [0-9.]* s | train loss [0-9.]* -> [0-9.]*$" "$tmp/short.out"
check "main job on a tiny --data: trains without the eval tail" $?

# Saves killed at arbitrary points: the checkpoint directory must always be whole. Saving
# every step makes most kills land inside a save.
cp -r "$tmp/ck" "$tmp/ck.before"
whole=0
for delay in 0.15 0.25 0.35 0.45 0.55 0.65; do
  "$L3D" train "${common[@]}" --steps 200 --save-interval 1 --save "$tmp/ck" >/dev/null 2>&1 &
  pid=$!
  sleep $delay; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  if "$L3D" forward --checkpoint "$tmp/ck" --tokens 1,2,3 --out "$tmp/l.bin" >/dev/null 2>&1 &&
     /usr/bin/python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/ck/trainer_state.json"; then
    whole=$((whole + 1))
  else
    echo "    checkpoint damaged after a kill at ${delay}s"
  fi
  rm -rf "$tmp"/ck.tmp.* "$tmp"/ck.old.*
done
[ $whole -eq 6 ]; check "checkpoint whole after 6 saves killed at random points" $?

"$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" --max-tokens 16 --seed 3 >"$tmp/g1" 2>"$tmp/g1.err"
check "generate runs" $?
"$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" --max-tokens 16 --seed 3 >"$tmp/g2" 2>/dev/null
cmp -s "$tmp/g1" "$tmp/g2"; check "generate with a seed is reproducible" $?
grep -qE "prompt [0-9]+ tokens in .*tokens/s\), [0-9]+ tokens in .*tokens/s\)" "$tmp/g1.err"; check "generate reports prompt and decode tokens/s" $?
"$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" --max-tokens 8 --temperature 0 >"$tmp/g3" 2>/dev/null
check "greedy generate runs" $?
# top-k 1 leaves one candidate: the greedy text whatever the temperature and seed.
"$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" --max-tokens 8 --top-k 1 \
  --temperature 1.5 --seed 9 >"$tmp/g4" 2>/dev/null
cmp -s "$tmp/g3" "$tmp/g4"; check "generate --top-k 1 gives the greedy text" $?
# A repetition penalty changes what greedy picks, and a huge one forbids repeating a token.
"$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" --max-tokens 8 --temperature 0 \
  --repeat-penalty 1.5 --presence-penalty 100 --repeat-last-n 12 >"$tmp/g5" 2>/dev/null
check "generate with penalties runs" $?
! cmp -s "$tmp/g3" "$tmp/g5"; check "penalties change the greedy text" $?
/usr/bin/python3 -c 'import sys; t=open(sys.argv[1],"rb").read()[3:]; sys.exit(len(set(t)) != len(t))' "$tmp/g5"
check "a presence penalty of 100 over the last 12 tokens repeats no byte in 8" $?
for bad in "--top-k -1" "--top-p 0" "--min-p 1.5" "--repeat-penalty 0" "--temperature -1" "--repeat-last-n -2"; do
  # shellcheck disable=SC2086
  "$L3D" generate --checkpoint "$tmp/ck.before" --prompt "GNU" $bad >/dev/null 2>"$tmp/bad.err"
  [ $? -eq 2 ] && grep -q -- "${bad%% *}" "$tmp/bad.err"; check "generate $bad: exit 2 naming the flag" $?
done

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
