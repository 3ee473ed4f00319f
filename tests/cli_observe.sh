#!/usr/bin/env bash
# What users watch (issue 10, section 4): the eval loss on the progress line and in the
# metrics JSONL, shuffled training, the SVG chart (well-formed, axes with values, the eval
# curve, the learning rate), and the MFU roof: its per-machine cache (round trip, a corrupt
# file ignored with a warning), train.peak_flops, and a roof the run beats raised, said once.
# No timing assertions. Usage: cli_observe.sh /path/to/l3d
set -u
L3D=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
check() {  # check NAME CONDITION-EXIT-STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; passes=$((passes + 1)); else echo "FAIL $1"; fails=$((fails + 1)); fi
}
PY=/usr/bin/python3
export XDG_CACHE_HOME="$tmp/cache"   # every run here uses this cache, not the user's
# The cache key names the OpenBLAS kernel set: the runs below use the CPU's own ("auto") and
# then Haswell's, whatever the calling environment forces.
unset OPENBLAS_CORETYPE
cache="$tmp/cache/llama3d/gemm_peak.json"

cat > "$tmp/eval.json" <<'J'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 2,
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 3, "total_num_steps": 10}},
 "data": {"seq_len": 32, "eval_fraction": 0.1, "shuffle": true, "seed": 3},
 "train": {"steps": 10, "eval_interval": 5, "eval_iters": 2, "threads": 1}}
J

# ---- the cache: measured once, then reused ------------------------------------------------
"$L3D" train --config "$tmp/eval.json" --metrics "$tmp/a.jsonl" >"$tmp/a.out" 2>"$tmp/a.err"
rc=$?; check "eval + shuffle run" $rc
[ $rc -ne 0 ] && sed 's/^/    /' "$tmp/a.err" | tail -5
grep -q "MFU roof .* GFLOP/s per rank (measured now, cached in $cache)" "$tmp/a.out"; check "first run measures the roof and caches it" $?
$PY - "$cache" <<'P'; check "cache file: version 1, this machine's key with threads=1, a positive figure" $?
import json, sys
d = json.load(open(sys.argv[1]))
assert d["version"] == 1
(k, v), = d["entries"].items()
assert "threads=1" in k and "cpu=" in k and "cores=" in k and "openblas=" in k, k
assert v["peak_flops"] > 0
P
"$L3D" train --config "$tmp/eval.json" --steps 2 >"$tmp/b.out" 2>&1
grep -q "MFU roof .* GFLOP/s per rank (cached in $cache)" "$tmp/b.out"; check "second run reuses the cached roof" $?
OPENBLAS_CORETYPE=Haswell "$L3D" train --config "$tmp/eval.json" --steps 1 >/dev/null 2>&1
$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if len(d["entries"]) == 2 and any("openblas=Haswell" in k for k in d["entries"]) else 1)' "$cache"
check "another OpenBLAS core type is another entry, the first kept" $?

# ---- eval on the progress line and in the JSONL; shuffled ---------------------------------
grep -q "step      5/10 | loss [0-9.]* | eval [0-9.]* | lr" "$tmp/a.out"; check "progress line shows the eval loss" $?
grep -q "shuffled, seed 3" "$tmp/a.out"; check "summary says the data is shuffled" $?
grep -q "eval every 5 steps and at the end: 2 batches of the last 0.1 of the data" "$tmp/a.out"; check "summary names the eval stream" $?
$PY - "$tmp/a.jsonl" <<'P'; check "JSONL: eval_loss on steps 5 and 10 only, finite" $?
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ev = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
assert [s for s, _ in ev] == [5, 10], ev
assert all(math.isfinite(v) and 0 < v < 10 for _, v in ev), ev
assert all(0 <= r["mfu"] <= 1 and r["peak_flops"] > 0 for r in rows)
P
"$L3D" train --config "$tmp/eval.json" --metrics "$tmp/a2.jsonl" >/dev/null 2>&1
[ -s "$tmp/a2.jsonl" ] && cmp -s <($PY -c 'import json,sys; [print(repr(json.loads(l)["loss"]), json.loads(l).get("eval_loss")) for l in open(sys.argv[1])]' "$tmp/a.jsonl") \
       <($PY -c 'import json,sys; [print(repr(json.loads(l)["loss"]), json.loads(l).get("eval_loss")) for l in open(sys.argv[1])]' "$tmp/a2.jsonl")
check "shuffled run with eval is deterministic (bit-identical losses and eval losses)" $?
sed 's/"shuffle": true, "seed": 3/"shuffle": false/' "$tmp/eval.json" > "$tmp/inorder.json"
"$L3D" train --config "$tmp/inorder.json" --metrics "$tmp/c.jsonl" >/dev/null 2>&1
$PY -c 'import json,sys; a=[json.loads(l)["loss"] for l in open(sys.argv[1])]; b=[json.loads(l)["loss"] for l in open(sys.argv[2])]; sys.exit(0 if a[0] != b[0] else 1)' "$tmp/a.jsonl" "$tmp/c.jsonl"
check "data.shuffle changes the batches" $?
# Threads of one process (dp 2): the same eval losses as the single rank.
"$L3D" train --config "$tmp/eval.json" --dp 2 --threads 1 --metrics "$tmp/dp2.jsonl" >"$tmp/dp2.out" 2>&1
check "eval + shuffle with dp 2 as threads" $?
$PY - "$tmp/a.jsonl" "$tmp/dp2.jsonl" <<'P'; check "dp 2 eval losses = single rank's (1e-4)" $?
import json, sys
a, b = ([r["eval_loss"] for r in map(json.loads, open(f)) if "eval_loss" in r] for f in sys.argv[1:3])
assert len(a) == len(b) == 2 and all(abs(x - y) < 1e-4 for x, y in zip(a, b)), (a, b)
P

# ---- the chart ----------------------------------------------------------------------------
$PY - "$tmp/a.svg" <<'P'; check "SVG: well-formed, axes with tick values, titles, eval and lr series" $?
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
groups = {g.get("id"): g for g in root.iter(ns + "g")}
texts = lambda g: [t.text for t in g.iter(ns + "text")]
for gid, title in (("x-axis", "step"), ("loss-axis", "loss (cross-entropy)"), ("lr-axis", "learning rate")):
    assert gid in groups, gid
    labels = texts(groups[gid])
    assert title in labels, (gid, labels)
    values = [float(t) for t in labels if t != title]
    assert len(values) >= 3 and values == sorted(values), (gid, values)
x = [float(t) for t in texts(groups["x-axis"]) if t != "step"]
assert x[0] <= 1 and x[-1] >= 10, x
assert len(list(groups["eval-loss"].iter(ns + "circle"))) == 2
assert groups["lr"].find(ns + "polyline") is not None and groups["train-loss"].find(ns + "polyline") is not None
legend = " ".join(texts(groups["legend"]))
assert "training loss" in legend and "eval loss" in legend and "learning rate" in legend, legend
P
# A config file that asks for no evaluation (without one, l3d train evaluates a held-out tail).
echo '{}' > "$tmp/plain.json"
"$L3D" train --config "$tmp/plain.json" --steps 3 --seq-len 32 --threads 1 --metrics "$tmp/plain.jsonl" >/dev/null 2>&1
$PY - "$tmp/plain.svg" <<'P'; check "SVG without eval: well-formed, no eval series" $?
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ids = [g.get("id") for g in root.iter("{http://www.w3.org/2000/svg}g")]
assert "eval-loss" not in ids and "x-axis" in ids and "loss-axis" in ids, ids
P
if command -v rsvg-convert >/dev/null; then
  rsvg-convert "$tmp/a.svg" -o "$tmp/a.png"; check "rsvg-convert renders the chart" $?
fi

# ---- a corrupt cache, a roof the run beats, a given roof ----------------------------------
echo 'garbage{' > "$cache"
"$L3D" train --config "$tmp/eval.json" --steps 1 >"$tmp/d.out" 2>"$tmp/d.err"
check "corrupt cache: the run goes on" $?
grep -q "warning: GEMM peak cache $cache: .*ignoring it" "$tmp/d.err"; check "corrupt cache: a warning naming the file" $?
$PY -c 'import json,sys; json.load(open(sys.argv[1]))' "$cache"; check "corrupt cache: replaced by a good one" $?
# A roof of 1000 FLOP/s for this key: every step beats it.
$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); [e.update(peak_flops=1000.0) for e in d["entries"].values()]; json.dump(d, open(sys.argv[1], "w"))' "$cache"
"$L3D" train --config "$tmp/eval.json" --steps 4 --metrics "$tmp/e.jsonl" >"$tmp/e.out" 2>&1
check "run against a roof it beats" $?
[ "$(grep -c "above the MFU roof" "$tmp/e.out")" = 1 ]; check "a beaten roof is raised and said once" $?
$PY - "$tmp/e.jsonl" <<'P'; check "beaten roof: MFU never above 1, step 1 at 1, the roof raised" $?
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert all(0 < r["mfu"] <= 1 for r in rows), [r["mfu"] for r in rows]
assert rows[0]["mfu"] == 1 and rows[0]["peak_flops"] > 1000, rows[0]
assert all(b["peak_flops"] >= a["peak_flops"] for a, b in zip(rows, rows[1:]))
P
rm -rf "$tmp/cache"
sed 's/"threads": 1/"threads": 1, "peak_flops": 1e18/' "$tmp/eval.json" > "$tmp/peak.json"
"$L3D" train --config "$tmp/peak.json" --steps 1 >"$tmp/f.out" 2>&1
grep -q "MFU roof 1000000000.0 GFLOP/s per rank (train.peak_flops)" "$tmp/f.out"; check "train.peak_flops is the roof" $?
[ ! -e "$cache" ]; check "a given roof measures and caches nothing" $?
echo '{"data": {"eval_fraction": 1.5}}' > "$tmp/bad.json"
"$L3D" train --config "$tmp/bad.json" --steps 1 >/dev/null 2>"$tmp/bad.err"
[ $? -eq 2 ] && grep -q "data.eval_fraction" "$tmp/bad.err"; check "a bad eval_fraction is exit 2 naming the key" $?

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
