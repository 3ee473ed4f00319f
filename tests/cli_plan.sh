#!/usr/bin/env bash
# l3d plan: bad input exits 2 naming what is wrong; --json is valid JSON with the documented
# keys; fixed keys stay fixed; --published prints its error summary; --config applies a
# ds_config.json; a link measured by l3d bench comm --json is read back. Usage: cli_plan.sh L3D
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | head -20; done; fails=$((fails + 1)); }

# usage NAME TEXT ARGS...: exit 2 and TEXT on stderr
usage() {
  local name=$1 text=$2; shift 2
  "$L3D" plan "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$text" "$tmp/err"; then ok "$name"; else fail "$name (exit $rc)" "$tmp/err"; fi
}
base=(--model llama3-8b --gpus 16 --seq 4096 --global-batch 64)
usage "missing flags" "are required" --model llama3-8b
usage "unknown gpu" "unknown GPU type 'b300'" "${base[@]}" --gpu b300
usage "unknown link" "unknown link 'nvlink9'" "${base[@]}" --intra nvlink9
usage "missing link file" "cannot read measured link $tmp/none.json" "${base[@]}" --inter "$tmp/none.json"
usage "layout key" "unknown key 'tpp'" "${base[@]}" --layout tpp=2
usage "layout value" "--layout tp: 'x'" "${base[@]}" --layout tp=x
usage "recompute value" "not none, selective or full" "${base[@]}" --layout recompute=some
usage "tp_mode value" "is not 1d, 2d or 3d" "${base[@]}" --layout tp_mode=4d
# A key twice or an empty item was taken without a word (the last tp won; ",,," fixed nothing).
usage "layout key twice" "key 'tp' given twice" "${base[@]}" --layout tp=8,tp=4
usage "layout key twice, same value" "key 'pp' given twice" "${base[@]}" --layout pp=2,tp=2,pp=2
for bad in ",,," "tp=8,,pp=2" "tp=8," ",tp=8" ""; do
  usage "layout '$bad': empty item" "an empty item" "${base[@]}" --layout "$bad"
done
usage "unknown model" "unknown model preset 'llama9'" --model llama9 --gpus 8 --seq 64 --global-batch 8
usage "no layout" "no valid layout of 16 GPUs" "${base[@]}" --layout tp=3
echo '{"train_batch_size": 8, "zero_optimization": {"stage": 9}}' >"$tmp/bad.json"
usage "bad config" "zero_optimization.stage" "${base[@]}" --config "$tmp/bad.json"

# tp_mode=3d plans q^3 cubes: 16 GPUs hold one of 8 (2 x 2 x 2) with dp or pp 2
"$L3D" plan "${base[@]}" --layout tp_mode=3d --top 3 >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 0 ] && grep -q "tp=8(3d)" "$tmp/out" && ! grep -qE "tp=[0-9]+ |tp=[0-9]+\(2d\)" "$tmp/out"; then
  ok "tp_mode=3d plans cubes"
else
  fail "tp_mode=3d plans cubes" "$tmp/out" "$tmp/err"
fi

# --json: a list of --top objects with the documented keys; tp=2,zero=1 kept by every one
"$L3D" plan "${base[@]}" --layout tp=2,zero=1 --top 4 --json >"$tmp/p.json" 2>"$tmp/err"
if python3 - "$tmp/p.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 4, len(rows)
for r in rows:
    for k in ("layout", "mem_gib_per_gpu", "step_time_s", "mfu", "tokens_per_s_per_gpu",
              "comm_bytes", "fits"):
        assert k in r, k
    assert r["layout"]["tp"] == 2 and r["layout"]["zero"] == 1, r["layout"]
    assert set(r["comm_bytes"]) == {"tp", "dp", "pp", "cp"}
    l = r["layout"]
    assert l["dp"] * l["tp"] * l["pp"] * l["cp"] == 16
times = [r["step_time_s"] for r in rows if r["fits"]]
assert times == sorted(times), times
EOF
then ok "json"; else fail "json" "$tmp/p.json" "$tmp/err"; fi

# ends=1 (the embedding and the head as layers of the pipeline split) stays fixed and is
# reported with the layers_per_stage that trains it: pp x v counts of llama3-8b's 32 layers,
# 34 places over the virtual stages, the first and the last one fewer; ends takes 0 or 1
"$L3D" plan "${base[@]}" --layout pp=2,ends=1 --top 2 --json >"$tmp/e.json" 2>"$tmp/err"
if python3 - "$tmp/e.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
assert rows and all(r["layout"]["ends"] is True and r["layout"]["pp"] == 2 for r in rows), rows
for r in rows:
    l = r["layout"]
    lps, U = l["layers_per_stage"], l["pp"] * l["v"]
    assert len(lps) == U and sum(lps) == 32, lps
    even = [34 // U + (u < 34 % U) for u in range(U)]
    assert lps == [even[0] - 1] + even[1:-1] + [even[-1] - 1], lps
EOF
then ok "ends"; else fail "ends" "$tmp/e.json" "$tmp/err"; fi
usage "ends value" "--layout ends" "${base[@]}" --layout ends=2

# --published: the calibration summary (the goals are asserted in tests/test_plan.c)
"$L3D" plan --published >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 0 ] && grep -qE "^calibration rows: mean \|error\| [0-9.]+%, max [0-9.]+%" "$tmp/out" &&
   [ "$(grep -c '^korthikanti2022-t5\|^narayanan2021-t1\|^llama3-t4' "$tmp/out")" -eq 22 ]; then
  ok "published"
else fail "published" "$tmp/out" "$tmp/err"; fi

# --config: the layouts apply to that file's precision (float32 here: twice bf16's activation
# bytes over tp) and its model
cat >"$tmp/fp32.json" <<'EOF'
{"train_batch_size": 8, "model": "llama3-tiny", "data": {"seq_len": 64}}
EOF
"$L3D" plan --config "$tmp/fp32.json" --gpus 2 --seq 64 --global-batch 8 --layout tp=2,sp=0,mb=8,recompute=none --top 1 --json >"$tmp/a.json" 2>"$tmp/err" &&
"$L3D" plan --model llama3-tiny --gpus 2 --seq 64 --global-batch 8 --layout tp=2,sp=0,mb=8,recompute=none --top 1 --json >"$tmp/b.json" 2>>"$tmp/err"
if python3 - "$tmp/a.json" "$tmp/b.json" <<'EOF'
import json, sys
a, b = (json.load(open(p))[0] for p in sys.argv[1:3])
assert a["comm_bytes"]["tp"] > b["comm_bytes"]["tp"], (a["comm_bytes"], b["comm_bytes"])
EOF
then ok "config"; else fail "config" "$tmp/a.json" "$tmp/b.json" "$tmp/err"; fi

# --config and --model are one configuration: the file's seq_len 4096 is not checked against
# the default model (llama3-tiny, 1024 positions) before --model llama3-8b replaces it.
echo '{"train_batch_size": 64, "data": {"seq_len": 4096}}' >"$tmp/seq4096.json"
"$L3D" plan --config "$tmp/seq4096.json" "${base[@]}" --top 1 >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 0 ] && ! grep -q max_position_embeddings "$tmp/err"; then ok "config seq_len with --model"
else fail "config seq_len with --model" "$tmp/out" "$tmp/err"; fi

# a measured link: bench comm --json on 2 thread ranks, read back by --intra
"$L3D" bench comm allreduce -b 8 -e 64K -f 8 -n 20 -w 5 -c 0 --json "$tmp/ar.json" >/dev/null 2>"$tmp/err" &&
"$L3D" plan --model llama3-tiny --gpus 2 --seq 64 --global-batch 8 --intra "$tmp/ar.json" --top 1 >"$tmp/out" 2>>"$tmp/err"
if [ $? -eq 0 ] && grep -q "measured (2 ranks) inside" "$tmp/out"; then ok "measured link"; else fail "measured link" "$tmp/ar.json" "$tmp/out" "$tmp/err"; fi
"$L3D" bench comm pingpong -b 8 -e 64K -f 8 -n 20 -w 5 -c 0 --json "$tmp/pp.json" >/dev/null 2>"$tmp/err"
usage "link without allreduce" "no allreduce file" "${base[@]}" --intra "$tmp/pp.json"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
