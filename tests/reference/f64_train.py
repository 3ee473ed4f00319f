"""The float64 trajectory of a training run, and a float32 run of it by an implementation we
did not write, for the layout tests (tests/test_parallel.c explains how they set its
tolerance).

usage: /usr/bin/python3 tests/reference/f64_train.py INIT_DIR DS_CONFIG.json STEPS OUT_DIR [CACHE_DIR]

INIT_DIR is an l3d checkpoint (config.json + model.safetensors) written before the first step;
DS_CONFIG.json the DeepSpeed config of the run (batch, clipping, AdamW, data.path, data.seq_len).
Trains STEPS steps with llama_ref.train (the loop test_train.py checks l3d against):
  - in float64: OUT_DIR/f64/<tensor>.bin (raw little-endian float64 final weights, row-major)
    and OUT_DIR/f64/steps.bin (per step: the loss and the gradient norm before clipping);
  - in float32 (torch's kernels): OUT_DIR/f32.txt, "<rms> <max> <loss> <gnorm>": the
    root-mean-square and the max over every weight of |w32 - w64|, and the max over the steps
    of |loss32 - loss64| and of |gnorm32 - gnorm64|.
With CACHE_DIR, the outputs are kept under CACHE_DIR/<sha256 of every input, this script and
llama_ref.py> and copied from there when the same inputs come again (the layout tests ask for
the same reference in many processes). Exit 0 ok, 77 when torch/numpy are missing."""
import hashlib
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def compute(init_dir, ds, steps, out):
    # llama_ref imports torch (about a second): only a run that computes pays for it, not the
    # many processes that find the reference in the cache.
    import llama_ref as R
    R.check_imports()
    np, torch = R.np, R.torch
    cfgd, init = R.load_checkpoint(init_dir)
    cfg = R.Cfg(cfgd)
    tokens = np.fromfile(ds["data"]["path"], dtype="<u4").astype(np.int64)

    def run(dtype):
        p = R.params_from_numpy(init, cfg, dtype, requires_grad=True)
        recs = R.train(p, cfg, ds, tokens, steps)
        w = {k: v.detach().to(torch.float64).numpy() for k, v in p.items()}
        return w, np.array([[r["loss"], r["grad_norm"]] for r in recs], dtype=np.float64)

    w64, s64 = run(torch.float64)
    os.makedirs(os.path.join(out, "f64"))
    for k, v in w64.items():
        v.astype("<f8").tofile(os.path.join(out, "f64", k + ".bin"))
    s64.astype("<f8").tofile(os.path.join(out, "f64", "steps.bin"))
    w32, s32 = run(torch.float32)
    d = np.concatenate([(w32[k] - w64[k]).ravel() for k in w64])
    e = np.abs(s32 - s64).max(axis=0)
    with open(os.path.join(out, "f32.txt"), "w") as f:
        f.write("%.9g %.9g %.9g %.9g\n" % (np.sqrt(np.mean(d * d)), np.abs(d).max(), e[0], e[1]))


def main():
    init_dir, ds_path, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    cache = sys.argv[5] if len(sys.argv) > 5 else None
    with open(ds_path) as f:
        ds = json.load(f)
    if not cache:
        compute(init_dir, ds, steps, out)
        return 0
    h = hashlib.sha256(b"%d\0" % steps)
    # The config without the data's path (each test process writes the same tokens to a
    # temporary file of its own): the tokens' bytes are hashed below.
    key = json.loads(json.dumps(ds))
    key["data"].pop("path", None)
    h.update(json.dumps(key, sort_keys=True).encode() + b"\0")
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(init_dir, "config.json"), os.path.join(init_dir, "model.safetensors"),
              ds["data"]["path"], os.path.abspath(__file__), os.path.join(here, "llama_ref.py")):
        with open(p, "rb") as f:
            h.update(f.read())
    hit = os.path.join(cache, h.hexdigest())
    if not os.path.isdir(hit):
        os.makedirs(cache, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=cache, prefix=".tmp.")
        compute(init_dir, ds, steps, os.path.join(tmp, "r"))
        try:
            os.rename(os.path.join(tmp, "r"), hit)  # another process may have won: same bytes
        except OSError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(os.path.join(hit, "f64"), os.path.join(out, "f64"))
    shutil.copy(os.path.join(hit, "f32.txt"), os.path.join(out, "f32.txt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
