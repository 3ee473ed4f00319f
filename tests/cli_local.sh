#!/usr/bin/env bash
# Layouts without a launcher: l3d train with --dp/--tp/--pp (or a parallel section) and no
# RANK/WORLD_SIZE runs the ranks as threads of one process over the in-process transport. The
# losses equal the single rank's and the launched processes' (1e-5 relative, as
# test_parallel), rank 0 alone prints, a failing rank stops its peers naming it, and the
# process exits with that rank's code. Also: --resume without --model, --resume with --steps
# at or below its step, and what `l3d launch --transport local` means. Usage: cli_local.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | head -20; done; fails=$((fails + 1)); }
export L3D_COMM_TIMEOUT=60
unset RANK WORLD_SIZE OMPI_COMM_WORLD_RANK SLURM_PROCID PMI_RANK L3D_RANK

losses() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
# same_losses A B: as many steps, each within 1e-5 relative
same_losses() {
  [ "$(wc -l <"$1")" -eq "$(wc -l <"$2")" ] || return 1
  paste <(losses "$1") <(losses "$2") | awk '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($2 < 0 ? -$2 : $2)) bad++; n++ }
    END { exit (n > 0 && bad == 0) ? 0 : 1 }'
}

cat >"$tmp/c.json" <<'EOF'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "zero_optimization": {"stage": 1}, "train": {"steps": 3, "threads": 1}, "data": {"seq_len": 32}}
EOF
"$L3D" train --config "$tmp/c.json" --metrics "$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1 \
  || fail "single-rank reference" "$tmp/ref.out"

# ---- the layouts as threads: the single rank's losses -----------------------------------------
for lay in "--dp 2 --tp 2" "--dp 2 --pp 2" "--tp 2 --pp 2"; do
  name=$(echo "$lay" | tr -d ' -')
  "$L3D" train --config "$tmp/c.json" $lay --metrics "$tmp/$name.jsonl" >"$tmp/$name.out" 2>&1
  rc=$?
  set -- $lay
  if [ $rc -eq 0 ] && same_losses "$tmp/$name.jsonl" "$tmp/ref.jsonl"; then
    ok "threads, $lay: the single rank's losses"
  else
    fail "threads, $lay (exit $rc)" "$tmp/$name.out" "$tmp/$name.jsonl" "$tmp/ref.jsonl"
  fi
done
out="$tmp/dp2tp2.out"
# rank 0 prints as a launched rank 0 does: one summary, every rank's memory line, each step once
if [ "$(grep -c '^llama3d train: model' "$out")" -eq 1 ] && [ "$(grep -c '^step ' "$out")" -eq 3 ] \
   && grep -q "parallel dp 2 x tp 2 x pp 1" "$out" \
   && [ "$(grep -cE '^memory rank [0-3]: ' "$out")" -eq 4 ] && grep -q "comm MiB tp" "$out"; then
  ok "threads: rank 0 prints the summary, 4 memory lines and each step once"
else
  fail "threads: output" "$out"
fi

# ---- the same layout launched as processes: the same losses -----------------------------------
"$L3D" launch -n 4 -- "$L3D" train --config "$tmp/c.json" --dp 2 --tp 2 \
  --metrics "$tmp/launch.jsonl" >"$tmp/launch.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && same_losses "$tmp/launch.jsonl" "$tmp/dp2tp2.jsonl"; then
  ok "l3d launch -n 4 and the threads give the same losses"
else
  fail "launched vs threads (exit $rc)" "$tmp/launch.out" "$tmp/launch.jsonl" "$tmp/dp2tp2.jsonl"
fi

# ---- the README's command: examples/3d.json as 8 threads (2,2,2) ------------------------------
ex="$(dirname "$0")/../examples/3d.json"
"$L3D" train --config "$ex" --dp 2 --steps 2 --metrics "$tmp/3d.jsonl" >"$tmp/3d.out" 2>&1
rc=$?
"$L3D" train --config "$ex" --tp 1 --pp 1 --steps 2 --metrics "$tmp/3d.ref.jsonl" >"$tmp/3d.ref.out" 2>&1
if [ $rc -eq 0 ] && same_losses "$tmp/3d.jsonl" "$tmp/3d.ref.jsonl" && grep -q "parallel dp 2 x tp 2 x pp 2" "$tmp/3d.out"; then
  ok "README: l3d train --config examples/3d.json --dp 2 runs (2,2,2) as threads, one rank's losses"
else
  fail "README 3d as threads (exit $rc)" "$tmp/3d.out" "$tmp/3d.ref.out"
fi

# ---- a parallel section in the file, no flags --------------------------------------------------
sed 's/"train": {/"parallel": {"dp": 2}, "train": {/' "$tmp/c.json" >"$tmp/par.json"
"$L3D" train --config "$tmp/par.json" --metrics "$tmp/par.jsonl" >"$tmp/par.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && same_losses "$tmp/par.jsonl" "$tmp/ref.jsonl" && ! grep -q "world has" "$tmp/par.out"; then
  ok "a parallel section runs without a launcher"
else
  fail "parallel section (exit $rc)" "$tmp/par.out"
fi

# ---- a failing rank stops its peers, naming it; its exit code ---------------------------------
# Only rank 0 opens the metrics file: it fails alone, the others are in the first step's
# reduction and must stop at once naming rank 0 (not wait L3D_COMM_TIMEOUT and blame no one).
L3D_COMM_TIMEOUT=300 "$L3D" train --config "$tmp/c.json" --dp 2 --metrics "$tmp/no/such/dir/m.jsonl" \
  >"$tmp/bad.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "^l3d train: rank 0: opening $tmp/no/such/dir/m.jsonl" "$tmp/bad.out" \
   && grep -qE "^l3d train: rank 1 stopped: .*rank 0" "$tmp/bad.out" && ! grep -q "timed out" "$tmp/bad.out"; then
  ok "rank 0 failing alone: exit 1, its reason, rank 1 stopped naming it"
else
  fail "rank failure (exit $rc)" "$tmp/bad.out"
fi
# Every rank failing alike (bad input): the single rank's one line and exit 2.
"$L3D" train --config "$tmp/c.json" --dp 2 --data "$tmp/none.txt" >"$tmp/bad2.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c "^l3d train: " "$tmp/bad2.out")" -eq 1 ] && grep -q "none.txt" "$tmp/bad2.out"; then
  ok "every rank refusing the data: one line, exit 2"
else
  fail "bad data on every rank (exit $rc)" "$tmp/bad2.out"
fi

# ---- --resume DIR takes the model from DIR and says what it resumed ---------------------------
# A 2-layer custom model saved by 2 threads (sharded), resumed by one rank with no --model.
cat >"$tmp/small.json" <<'EOF'
{"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 264, "max_position_embeddings": 128,
 "tie_word_embeddings": true}
EOF
"$L3D" train --config "$tmp/c.json" --model "$tmp/small.json" --dp 2 --steps 2 --save "$tmp/ck" \
  >"$tmp/save.out" 2>&1 || fail "save from threads" "$tmp/save.out"
"$L3D" train --config "$tmp/c.json" --resume "$tmp/ck" --steps 3 >"$tmp/res.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "hidden 64, ffn 160, layers 2" "$tmp/res.out" \
   && grep -q "^resumed $tmp/ck: step 2 of 3, saved by dp 2 x tp 1 x pp 1 (sharded); running dp 1 x tp 1 x pp 1" "$tmp/res.out" \
   && grep -q "^step      3/3" "$tmp/res.out"; then
  ok "--resume DIR without --model: the model from DIR, the step and layout printed"
else
  fail "resume without --model (exit $rc)" "$tmp/res.out"
fi

# --steps at or below the checkpoint's step: nothing to train, said on stderr, exit 0 (it
# exited 0 without a word), and --save still writes the checkpoint.
for n in 1 2; do
  "$L3D" train --config "$tmp/c.json" --resume "$tmp/ck" --steps $n --save "$tmp/ck.$n" \
    >"$tmp/res$n.out" 2>"$tmp/res$n.err"
  rc=$?
  if [ $rc -eq 0 ] && grep -q "^l3d train: checkpoint $tmp/ck is at step 2 and steps is $n .*: nothing to train$" "$tmp/res$n.err" \
     && ! grep -q "^step " "$tmp/res$n.out" && grep -q "^saved $tmp/ck.$n (step 2)" "$tmp/res$n.out"; then
    ok "--resume at step 2 with --steps $n: 'nothing to train' on stderr, exit 0, saved"
  else
    fail "--resume with --steps $n (exit $rc)" "$tmp/res$n.out" "$tmp/res$n.err"
  fi
done
if grep -q "nothing to train" "$tmp/res.out"; then fail "--steps 3 from step 2 said nothing to train" "$tmp/res.out"; fi

"$L3D" train --resume "$tmp/none" --steps 1 >"$tmp/nores.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "resume $tmp/none: it does not exist" "$tmp/nores.out"; then
  ok "--resume of a missing directory: exit 2 naming it"
else
  fail "--resume missing (exit $rc)" "$tmp/nores.out"
fi

# ---- l3d launch --transport local says what local is ------------------------------------------
"$L3D" launch -n 2 --transport local -- true >"$tmp/lt.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "run l3d train without the launcher" "$tmp/lt.out" && ! grep -q "not built" "$tmp/lt.out"; then
  ok "launch --transport local: exit 2 saying what local is for"
else
  fail "launch --transport local (exit $rc)" "$tmp/lt.out"
fi

if [ $fails -ne 0 ]; then echo "$fails failed, $passes passed"; exit 1; fi
echo "all $passes passed"
