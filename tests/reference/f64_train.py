"""The float64 trajectory of a training run, and the spread of float32 runs around it, for the
layout tests (tests/test_parallel.c, which explains how the spread sets their tolerance).

usage: /usr/bin/python3 tests/reference/f64_train.py INIT_DIR DS_CONFIG.json STEPS OUT_DIR

INIT_DIR is an l3d checkpoint (config.json + model.safetensors) written before the first step;
DS_CONFIG.json the DeepSpeed config of the run (batch, clipping, AdamW, data.path, data.seq_len).
Trains STEPS steps with llama_ref.train (the loop test_train.py checks l3d against):
  - once in float64: OUT_DIR/f64/<tensor>.bin (raw little-endian float64 final weights,
    row-major) and OUT_DIR/f64/losses.bin (the STEPS per-step losses, float64);
  - REALIZATIONS times in float32, each accumulating a step's micro-batches in another order
    (the same math, other roundings): OUT_DIR/f32.txt, one line per run,
    "<rms> <max> <loss> <gnorm>": the root-mean-square and the max over every weight of
    |w32 - w64|, and the max over the steps of |loss32 - loss64| and of |gnorm32 - gnorm64|.
Exit 0 ok, 77 when torch/numpy are missing."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402

REALIZATIONS = 7


def orders(a):
    """REALIZATIONS distinct permutations of range(a) (a >= 2)."""
    r = list(range(a))
    ev = r[0::2] + r[1::2]
    out = [r, r[::-1], ev, ev[::-1], r[1:] + r[:1], r[a // 2:] + r[:a // 2], r[::-1][1:] + [a - 1]]
    return out[:REALIZATIONS]


def main():
    R.check_imports()
    np, torch = R.np, R.torch
    init_dir, ds_path, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with open(ds_path) as f:
        ds = json.load(f)
    cfgd, init = R.load_checkpoint(init_dir)
    cfg = R.Cfg(cfgd)
    tokens = np.fromfile(ds["data"]["path"], dtype="<u4").astype(np.int64)

    def run(dtype, order=None):
        p = R.params_from_numpy(init, cfg, dtype, requires_grad=True)
        recs = R.train(p, cfg, ds, tokens, steps, micro_order=order)
        w = {k: v.detach().to(torch.float64).numpy() for k, v in p.items()}
        return w, np.array([[r["loss"], r["grad_norm"]] for r in recs], dtype=np.float64)

    w64, l64 = run(torch.float64)
    os.makedirs(os.path.join(out, "f64"), exist_ok=True)
    for k, v in w64.items():
        v.astype("<f8").tofile(os.path.join(out, "f64", k + ".bin"))
    l64.astype("<f8").tofile(os.path.join(out, "f64", "steps.bin"))
    lines = []
    for order in orders(int(ds["gradient_accumulation_steps"])):
        w, losses = run(torch.float32, order)
        d = np.concatenate([(w[k] - w64[k]).ravel() for k in w64])
        e = np.abs(losses - l64).max(axis=0)
        lines.append("%.9g %.9g %.9g %.9g\n" % (np.sqrt(np.mean(d * d)), np.abs(d).max(), e[0], e[1]))
    with open(os.path.join(out, "f32.txt"), "w") as f:
        f.writelines(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
