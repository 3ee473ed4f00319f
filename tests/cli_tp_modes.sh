#!/usr/bin/env bash
# parallel.tp_mode from the command line: "2d" (tp 4 as a 2 x 2 grid) and "3d" (tp 8 as a
# 2 x 2 x 2 cube, micro-batches of 4 = q^2 slices with half the accumulation: the same 8
# sequences a step), as threads of one process and as processes over each built network
# transport, train to the single rank's losses (1e-5 relative per step, the 1D layouts'
# standard in cli_parallel.sh), and what 2d and 3d do not take is refused with exit 2 naming it.
# Usage: cli_tp_modes.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | head -20; done; fails=$((fails + 1)); }
export L3D_COMM_TIMEOUT=60
losses() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
same_losses() {
  paste <(losses "$1") <(losses "$2") | awk '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($2 < 0 ? -$2 : $2)) bad++; n++ }
    END { exit (n > 0 && bad == 0) ? 0 : 1 }'
}

# llama3-tiny's shape with untied embeddings (the head a product of its own); the tied model
# itself runs at the end
cat >"$tmp/model.json" <<'J'
{"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 264, "max_position_embeddings": 1024,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "bos_token_id": 256, "eos_token_id": 257}
J
cat >"$tmp/one.json" <<'J'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5,
 "steps_per_print": 100, "train": {"steps": 4, "threads": 1}, "data": {"seq_len": 32}}
J
sed 's/"train": {/"parallel": {"tp": 4, "tp_mode": "2d"}, "train": {/' "$tmp/one.json" >"$tmp/2d.json"
sed -e 's/"train": {/"parallel": {"tp": 8, "tp_mode": "3d"}, "train": {/' \
    -e 's/"train_micro_batch_size_per_gpu": 2/"train_micro_batch_size_per_gpu": 4/' \
    "$tmp/one.json" >"$tmp/3d.json"

"$L3D" train --model "$tmp/model.json" --config "$tmp/one.json" --metrics "$tmp/one.jsonl" >"$tmp/out" 2>&1
if [ $? -eq 0 ] && [ "$(wc -l <"$tmp/one.jsonl")" -eq 4 ]; then ok "single-rank reference"; else fail "single-rank reference" "$tmp/out"; fi

"$L3D" train --model "$tmp/model.json" --config "$tmp/2d.json" --metrics "$tmp/2d.jsonl" >"$tmp/out" 2>&1
rc=$?
if [ $rc -eq 0 ] && same_losses "$tmp/2d.jsonl" "$tmp/one.jsonl"; then
  ok "tp 4 as 2d, threads: the single rank's losses"
else
  fail "tp 4 as 2d, threads (exit $rc)" "$tmp/out" "$tmp/2d.jsonl" "$tmp/one.jsonl"
fi

sed 's/"tp": 4,/"tp": 4, "pp": 2,/' "$tmp/2d.json" >"$tmp/2dpp.json"
"$L3D" train --model "$tmp/model.json" --config "$tmp/2dpp.json" --metrics "$tmp/2dpp.jsonl" >"$tmp/out" 2>&1
rc=$?
if [ $rc -eq 0 ] && same_losses "$tmp/2dpp.jsonl" "$tmp/one.jsonl"; then
  ok "tp 4 as 2d x pp 2, threads: the single rank's losses"
else
  fail "tp 4 as 2d x pp 2, threads (exit $rc)" "$tmp/out" "$tmp/2dpp.jsonl" "$tmp/one.jsonl"
fi

"$L3D" train --model "$tmp/model.json" --config "$tmp/3d.json" --metrics "$tmp/3d.jsonl" >"$tmp/out" 2>&1
rc=$?
if [ $rc -eq 0 ] && same_losses "$tmp/3d.jsonl" "$tmp/one.jsonl" && grep -q "tensor 3d on a cube of tp 8" "$tmp/out"; then
  ok "tp 8 as 3d, threads: the single rank's losses"
else
  fail "tp 8 as 3d, threads (exit $rc)" "$tmp/out" "$tmp/3d.jsonl" "$tmp/one.jsonl"
fi

. "$(dirname "$0")/transports_lib.sh"
built=$(network_transports "$L3D")
for tp in $built; do
  for mode in "2d 4" "3d 8"; do
    set -- $mode
    "$L3D" launch -n "$2" --transport "$tp" -- "$L3D" train --model "$tmp/model.json" \
      --config "$tmp/$1.json" --metrics "$tmp/$tp.$1.jsonl" >"$tmp/out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && same_losses "$tmp/$tp.$1.jsonl" "$tmp/one.jsonl"; then
      ok "$tp: tp $2 as $1 in $2 processes: the single rank's losses"
    else
      fail "$tp: tp $2 as $1 (exit $rc)" "$tmp/out" "$tmp/$tp.$1.jsonl"
    fi
  done
done

# refusals: exit 2 and the reason
refuse() {  # name, expected text, sed expression on 2d.json (3d.json with a 4th argument)
  sed "$3" "$tmp/${4:-2d}.json" >"$tmp/bad.json"
  "$L3D" train --model "$tmp/model.json" --config "$tmp/bad.json" >"$tmp/out" 2>&1
  rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$2" "$tmp/out"; then ok "refused: $1"; else fail "refused: $1 (exit $rc)" "$tmp/out"; fi
}
refuse "tp not a square" 'needs a square tp' 's/"tp": 4/"tp": 2/'
refuse "an unknown mode" 'expected "1d"' 's/"2d"/"4d"/'
refuse "3d: tp not a cube" 'needs a cube tp' 's/"2d"/"3d"/'
refuse "3d: micro-batch not a multiple of q^2" 'a multiple of 4' 's/"train_micro_batch_size_per_gpu": 4/"train_micro_batch_size_per_gpu": 2/' 3d
refuse "3d: sequence parallelism" '"3d" does not take parallel.sequence_parallel' 's/"tp_mode": "3d"/"tp_mode": "3d", "sequence_parallel": true/' 3d
refuse "sequence parallelism" '"2d" does not take parallel.sequence_parallel' 's/"tp_mode": "2d"/"tp_mode": "2d", "sequence_parallel": true/'

# bf16 on the grid and the cube (tests/test_parallel_tp2d.c and tp3d.c hold them to the
# float64 trajectory): they run and learn
for mode in 2d 3d; do
  sed 's/"steps_per_print"/"bf16": {"enabled": true}, "steps_per_print"/' "$tmp/$mode.json" >"$tmp/b$mode.json"
  "$L3D" train --model "$tmp/model.json" --config "$tmp/b$mode.json" --metrics "$tmp/b$mode.jsonl" >"$tmp/out" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && losses "$tmp/b$mode.jsonl" | awk 'NR == 1 { f = $1 } { l = $1 } END { exit !(NR == 4 && l < f) }'; then
    ok "$mode in bf16: runs and learns"
  else
    fail "$mode in bf16 (exit $rc)" "$tmp/out" "$tmp/b$mode.jsonl"
  fi
done

# llama3-tiny itself (the default model: tied embeddings) as 2d and 3d threads
"$L3D" train --config "$tmp/one.json" --metrics "$tmp/tied.jsonl" >"$tmp/out" 2>&1
if [ $? -eq 0 ] && [ "$(wc -l <"$tmp/tied.jsonl")" -eq 4 ]; then ok "tied single-rank reference"; else fail "tied single-rank reference" "$tmp/out"; fi
for mode in "2d 4" "3d 8"; do
  set -- $mode
  "$L3D" train --config "$tmp/$1.json" --metrics "$tmp/tied.$1.jsonl" >"$tmp/out" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && same_losses "$tmp/tied.$1.jsonl" "$tmp/tied.jsonl"; then
    ok "llama3-tiny (tied) as tp $2 $1, threads: the single rank's losses"
  else
    fail "llama3-tiny (tied) as tp $2 $1 (exit $rc)" "$tmp/out" "$tmp/tied.$1.jsonl" "$tmp/tied.jsonl"
  fi
done

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
