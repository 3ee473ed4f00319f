#!/usr/bin/env bash
# DeepSpeed's monitors, read back by readers llama3d did not write: the tensorboard section
# writes events.out.tfevents.* files whose TFRecord CRCs crcmod's CRC-32C accepts and whose
# Event protos `protoc --decode_raw` decodes, with DeepSpeed's tags, steps counted in samples
# and the JSONL's losses (rounded to float32); csv_monitor writes DeepSpeed's CSV files with
# the same values; a resumed run continues them; a threaded layout writes them once (rank 0);
# wandb is refused. Usage: cli_monitor.sh /path/to/l3d
set -u
L3D=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # the runs cd into their folders
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0; passes=0
ok()   { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; shift; for f in "$@"; do sed 's/^/    /' "$f" | head -20; done; fails=$((fails + 1)); }
unset RANK WORLD_SIZE OMPI_COMM_WORLD_RANK SLURM_PROCID PMI_RANK L3D_RANK
if ! command -v protoc >/dev/null || ! $PY -c 'import crcmod.predefined' 2>/dev/null; then
  echo "skip: needs protoc (protobuf-compiler) and python3-crcmod (tools/install-deps.sh)"
  exit 77
fi

# check_run DIR JSONL BATCH TB_FILES: every event file's records and the CSV files against the
# JSONL. Prints what is wrong and exits 1.
cat >"$tmp/check.py" <<'EOF'
import glob, json, os, re, socket, struct, subprocess, sys
import crcmod.predefined

run, jsonl, batch, n_tb = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
crc = crcmod.predefined.mkCrcFun('crc-32c')
mask = lambda c: (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff
f32 = lambda x: struct.unpack('<f', struct.pack('<f', x))[0]
tags = ['train_loss', 'lr', 'loss_scale', 'grad_norm', 'tokens_per_s', 'mfu', 'mem_peak_bytes']
rows = [json.loads(l) for l in open(jsonl)]
want_steps = [r['step'] * batch for r in rows]
# the steps that evaluated (train.eval_interval) carry eval_loss, and only they
eval_rows = [r for r in rows if 'eval_loss' in r]
if eval_rows:
    tags.append('eval_loss')
steps_of = lambda t: [r['step'] * batch for r in eval_rows] if t == 'eval_loss' else want_steps
bad = []

# in the order they were written: names sort by pid within a second, not by run
files = sorted(glob.glob(os.path.join(run, 'tb', 'job', '*')), key=lambda p: (os.path.getmtime(p), p))
if len(files) != n_tb:
    sys.exit('%d event files, expected %d: %s' % (len(files), n_tb, files))
host = socket.gethostname()
events = {}  # tag -> [(step, value)] over every file, in file order
for path in files:
    name = os.path.basename(path)
    if not re.fullmatch(r'events\.out\.tfevents\.\d{10}\.%s\.\d+\.0' % re.escape(host), name):
        bad.append('file name ' + name)
    data, i, k = open(path, 'rb').read(), 0, 0
    while i < len(data):
        if len(data) - i < 16:
            sys.exit('%s: torn record at byte %d' % (name, i))
        n, = struct.unpack('<Q', data[i:i + 8])
        lcrc, = struct.unpack('<I', data[i + 8:i + 12])
        body = data[i + 12:i + 12 + n]
        dcrc, = struct.unpack('<I', data[i + 12 + n:i + 16 + n])
        if lcrc != mask(crc(data[i:i + 8])) or dcrc != mask(crc(body)) or len(body) != n:
            sys.exit('%s: record %d: bad CRC' % (name, k))
        text = subprocess.run(['protoc', '--decode_raw'], input=body, capture_output=True,
                              check=True).stdout.decode()
        if k == 0:
            if '3: "brain.Event:2"' not in text:
                bad.append('%s: first record is not the version: %s' % (name, text))
        else:
            step = re.search(r'^2: (\d+)$', text, re.M)
            tag = re.search(r'^    1: "(.*)"$', text, re.M)
            val = re.search(r'^    2: (0x[0-9a-f]+)$', text, re.M)
            if not (step and tag and val and re.search(r'^1: 0x', text, re.M)):
                sys.exit('%s: record %d: not a scalar event: %s' % (name, k, text))
            v = struct.unpack('<f', struct.pack('<I', int(val.group(1), 16)))[0]
            events.setdefault(tag.group(1), []).append((int(step.group(1)), v))
        i += 16 + n
        k += 1

if sorted(events) != sorted('Train/Samples/' + t for t in tags):
    bad.append('tags %s' % sorted(events))
for t in tags:
    got = events.get('Train/Samples/' + t, [])
    if [s for s, _ in got] != steps_of(t):
        bad.append('%s steps %s, expected %s' % (t, [s for s, _ in got], steps_of(t)))
loss = [v for _, v in events.get('Train/Samples/train_loss', [])]
if loss != [f32(r['loss']) for r in rows]:
    bad.append('tensorboard losses %s != the JSONL %s' % (loss, [r['loss'] for r in rows]))
ev = [v for _, v in events.get('Train/Samples/eval_loss', [])]
if ev != [f32(r['eval_loss']) for r in eval_rows]:
    bad.append('tensorboard eval losses %s != the JSONL %s' % (ev, [r['eval_loss'] for r in eval_rows]))
lr = [v for _, v in events.get('Train/Samples/lr', [])]
if lr != [f32(r['lr']) for r in rows]:
    bad.append('tensorboard lr %s != the JSONL %s' % (lr, [r['lr'] for r in rows]))

for t in tags:
    path = os.path.join(run, 'csv', 'job', 'Train_Samples_%s.csv' % t)
    lines = open(path, newline='').read().split('\r\n')
    if lines[0] != 'step,' + t or lines[-1] != '':
        bad.append('%s: header %r, last %r' % (path, lines[0], lines[-1]))
    body = [l.split(',') for l in lines[1:-1]]
    if [int(s) for s, _ in body] != steps_of(t):
        bad.append('%s: steps %s' % (path, [s for s, _ in body]))
    key = {'train_loss': 'loss'}.get(t, t)
    if t in ('train_loss', 'grad_norm', 'mem_peak_bytes', 'eval_loss'):
        if [float(v) for _, v in body] != [float(r[key]) for r in (eval_rows if t == 'eval_loss' else rows)]:
            bad.append('%s: values %s != the JSONL %s' % (path, [v for _, v in body],
                                                          [r[key] for r in rows]))
print('\n'.join(bad) if bad else 'ok')
sys.exit(1 if bad else 0)
EOF

cat >"$tmp/c.json" <<'EOF'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
 "data": {"seq_len": 32}, "train": {"threads": 1},
 "tensorboard": {"enabled": true, "output_path": "tb", "job_name": "job"},
 "csv_monitor": {"enabled": true, "output_path": "csv/", "job_name": "job"}}
EOF

# ---- a run: event files and CSV files against its JSONL ------------------------------------
mkdir "$tmp/a"
(cd "$tmp/a" && "$L3D" train --config ../c.json --steps 4 --metrics m.jsonl) >"$tmp/a.out" 2>&1
if [ $? -eq 0 ]; then ok "a run with tensorboard and csv_monitor"; else fail "a run with tensorboard and csv_monitor" "$tmp/a.out"; fi
if $PY "$tmp/check.py" "$tmp/a" "$tmp/a/m.jsonl" 8 1 >"$tmp/a.chk" 2>&1; then
  ok "events: CRCs (crcmod), Events (protoc), tags, steps in samples, losses = JSONL; CSV = JSONL"
else
  fail "event and CSV files read back" "$tmp/a.chk"
fi
# The closing summary names where the monitors wrote; nothing else may mention them (no "not
# yet effective" note, no warning).
grep -v '^done: ' "$tmp/a.out" | grep -q "tensorboard" && fail "no note or warning about tensorboard" "$tmp/a.out" || ok "no note or warning about tensorboard"
grep -q '^done: .* | tensorboard: .*/job | csv: .*/job$' "$tmp/a.out" \
  && ok "the summary line names the TensorBoard and CSV directories" \
  || fail "the summary line names the TensorBoard and CSV directories" "$tmp/a.out"

# ---- with evaluation: eval_loss on the evaluated steps only -------------------------------
mkdir "$tmp/e"
sed 's/"data": {"seq_len": 32}, "train": {"threads": 1}/"data": {"seq_len": 32, "eval_fraction": 0.1}, "train": {"threads": 1, "eval_interval": 2, "eval_iters": 1}/' "$tmp/c.json" >"$tmp/e.json"
(cd "$tmp/e" && "$L3D" train --config ../e.json --steps 4 --metrics m.jsonl) >"$tmp/e.out" 2>&1
if [ $? -eq 0 ] && grep -q eval_loss "$tmp/e/m.jsonl" &&
   $PY "$tmp/check.py" "$tmp/e" "$tmp/e/m.jsonl" 8 1 >"$tmp/e.chk" 2>&1; then
  ok "with evaluation: Train/Samples/eval_loss in the events and the CSV on the evaluated steps"
else
  fail "with evaluation: eval_loss in the monitor files" "$tmp/e.out" "$tmp/e.chk" "$tmp/e.json"
fi

# ---- resumed: the CSV files continue (one header), a second event file ---------------------
mkdir "$tmp/r"
(cd "$tmp/r" && "$L3D" train --config ../c.json --steps 2 --save ck --metrics m.jsonl &&
 "$L3D" train --config ../c.json --steps 4 --resume ck --metrics m.jsonl) >"$tmp/r.out" 2>&1
if [ $? -eq 0 ] && $PY "$tmp/check.py" "$tmp/r" "$tmp/r/m.jsonl" 8 2 >"$tmp/r.chk" 2>&1; then
  ok "resumed run: CSV continued with one header, a second event file, steps 1..4"
else
  fail "resumed run's monitor files" "$tmp/r.out" "$tmp/r.chk"
fi

# ---- a layout as threads: rank 0 alone writes ----------------------------------------------
mkdir "$tmp/t"
(cd "$tmp/t" && "$L3D" train --config ../c.json --dp 2 --steps 3 --metrics m.jsonl) >"$tmp/t.out" 2>&1
if [ $? -eq 0 ] && $PY "$tmp/check.py" "$tmp/t" "$tmp/t/m.jsonl" 8 1 >"$tmp/t.chk" 2>&1; then
  ok "dp 2 as threads: one event file, each step once"
else
  fail "dp 2 as threads: monitor files" "$tmp/t.out" "$tmp/t.chk"
fi

# ---- wandb: no network -------------------------------------------------------------------
echo '{"wandb": {"enabled": true, "project": "p"}}' >"$tmp/w.json"
"$L3D" train --config "$tmp/w.json" --steps 1 >"$tmp/w.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "wandb.enabled: .*network.*tensorboard or csv_monitor" "$tmp/w.out"; then
  ok "wandb.enabled refused (exit 2) pointing at tensorboard and csv_monitor"
else
  fail "wandb.enabled refused (rc $rc)" "$tmp/w.out"
fi

# ---- an output directory that cannot be made: exit 1 naming it -----------------------------
mkdir "$tmp/x" && touch "$tmp/x/tb"
(cd "$tmp/x" && "$L3D" train --config ../c.json --steps 1) >"$tmp/x.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "tensorboard: cannot create tb/job" "$tmp/x.out"; then
  ok "an output_path that is a file: exit 1 naming it"
else
  fail "an output_path that is a file (rc $rc)" "$tmp/x.out"
fi

# ---- metrics are a side channel: full files warn once each, training and --save go on -------
# warned_once OUT FILE: exactly one warning line naming FILE
warned_once() { [ "$(grep -i "warn" "$1" | grep -cF "$2")" -eq 1 ]; }
mkdir -p "$tmp/f/csv/job"
ln -s /dev/full "$tmp/f/m.jsonl"; ln -s /dev/full "$tmp/f/m.svg"
ln -s /dev/full "$tmp/f/csv/job/Train_Samples_lr.csv"
(cd "$tmp/f" && "$L3D" train --config ../c.json --steps 3 --metrics m.jsonl --save ck) >"$tmp/f.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && warned_once "$tmp/f.out" m.jsonl && warned_once "$tmp/f.out" m.svg &&
   warned_once "$tmp/f.out" csv/job/Train_Samples_lr.csv && grep -q "^saved ck (step 3)" "$tmp/f.out" &&
   "$L3D" forward --checkpoint "$tmp/f/ck" --tokens 1,2,3 --out "$tmp/f/l.bin" >/dev/null 2>&1; then
  ok "metrics, svg and a csv file on /dev/full: one warning each naming it, exit 0, --save written"
else
  fail "metrics on /dev/full (rc $rc)" "$tmp/f.out"
fi

# The same on a file system that fills mid-run (a 64 KiB tmpfs with one page left; needs
# root): the files end in whole lines and records, the checkpoint elsewhere is whole.
mnt="$tmp/g/full"
mkdir -p "$mnt"
if mount -t tmpfs -o size=64k l3d-test "$mnt" 2>/dev/null; then
  trap 'umount "$mnt" 2>/dev/null; rm -rf "$tmp"' EXIT
  dd if=/dev/zero of="$mnt/page" bs=4096 count=1 2>/dev/null
  dd if=/dev/zero of="$mnt/filler" bs=4096 2>/dev/null
  rm -f "$mnt/page"
  sed 's|"output_path": "tb"|"output_path": "full/tb"|; s|"output_path": "csv/"|"output_path": "full/csv"|' \
    "$tmp/c.json" >"$tmp/g.json"
  (cd "$tmp/g" && "$L3D" train --config ../g.json --steps 40 --metrics full/m.jsonl --save ck) >"$tmp/g.out" 2>&1
  rc=$?
  ev=$(cd "$tmp/g" && ls full/tb/job/events.out.tfevents.* 2>/dev/null)
  whole=$(cd "$tmp/g" && $PY - full/m.jsonl "$ev" <<'EOF'
import json, struct, sys
text = open(sys.argv[1]).read()
for l in text.splitlines(): json.loads(l)
assert text.endswith('\n') or not text, 'torn line'
d, i = open(sys.argv[2], 'rb').read(), 0
while i < len(d):
    n, = struct.unpack('<Q', d[i:i + 8]); i += 16 + n
assert i == len(d), 'torn record'
print('whole')
EOF
)
  if [ $rc -eq 0 ] && [ "$whole" = whole ] && warned_once "$tmp/g.out" full/m.jsonl &&
     warned_once "$tmp/g.out" "$ev" && grep -q "^saved ck (step 40)" "$tmp/g.out" &&
     "$L3D" forward --checkpoint "$tmp/g/ck" --tokens 1,2,3 --out "$tmp/g/l.bin" >/dev/null 2>&1; then
    ok "a file system filling mid-run: one warning per file, whole lines and records, exit 0, --save written"
  else
    fail "a file system filling mid-run (rc $rc, files: $whole)" "$tmp/g.out"
  fi
  umount "$mnt"
else
  echo "skip the filling file system: cannot mount a tmpfs here (not root)"
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
