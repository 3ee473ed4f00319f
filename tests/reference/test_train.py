"""Cross-check of `l3d train` against a float32 PyTorch reference training loop (llama_ref.py).

usage: /usr/bin/python3 tests/reference/test_train.py /path/to/l3d

Each run: a tiny Llama 3 (hidden 64, 2 layers, 4 heads / 2 kv heads, vocab 264, llama3 rope
scaling), a random tokens.bin of 1003 ids (not a multiple of the 128 tokens a step takes, so
the stream wraps around mid-run), `l3d train --config C --steps 0 --save INIT`, then
`l3d train --config C --steps 10 --metrics M --save FINAL`. The reference loads INIT and trains
10 steps: batching rule, micro-batches with gradient accumulation, loss = sum CE / (B*T),
clip_grad_norm_, torch.optim.AdamW with decay on the 2-D weights only, DeepSpeed WarmupLR.
Compared per step: "lr" (rel 1e-6), "loss" (rel 1e-4), "grad_norm" (rel 1e-3); at the end
every FINAL tensor (max|d|/max|ref| <= 1e-3). Runs:
  base        batch 8 = micro 2 x accum 4, clipping 1.0, WarmupLR linear
  clip_tight  clipping 0.05 (below every step's norm: clipping acts on every step)
  clip_partial  clipping at the median of the base run's norms (acts on some steps only)
  accum1      micro 8 x accum 1, weight_decay 1.0 (so decaying the norms would show)
  tied        tie_word_embeddings true
  warmup_log  WarmupLR with DeepSpeed's default warmup_type "log", no clipping (grad_norm
              must still be reported)
For each run the distance of l3d's FINAL weights to deliberately wrong references (norms
decayed, no clipping, the simplified lr schedule) is printed, to show what the check can tell
apart and, on failure, which mistake l3d matches.
Exit 0 pass, 1 fail, 77 skip (no torch/numpy).
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402

STEPS = 10
N_TOKENS = 1003
TOL_LR = 1e-6
TOL_LOSS = 1e-4
TOL_GN = 1e-3
TOL_W = 1e-3
LAST_NORMS = []  # the reference grad norms of the last run


def base_ds(lr=3e-3):
    return {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
                                                     "warmup_num_steps": 4,
                                                     "warmup_type": "linear"}},
        "model": "model_config.json",
        "data": {"path": "tokens.bin", "seq_len": 16},
        "train": {"steps": STEPS, "seed": 7},
    }


def runs():
    out = []
    out.append(("base", base_ds(), False))
    ds = base_ds()
    ds["gradient_clipping"] = 0.05
    out.append(("clip_tight", ds, False))
    ds = base_ds()
    ds["gradient_clipping"] = "partial"  # set from the base run's norms, see main()
    out.append(("clip_partial", ds, False))
    ds = base_ds()
    ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"] = 8, 1
    ds["optimizer"]["params"]["weight_decay"] = 1.0
    out.append(("accum1", ds, False))
    out.append(("tied", base_ds(), True))
    ds = base_ds()
    ds["scheduler"]["params"]["warmup_type"] = "log"
    ds["scheduler"]["params"]["warmup_num_steps"] = 5
    ds["gradient_clipping"] = 0.0
    out.append(("warmup_log", ds, False))
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def ref_train(init, cfg, ds, tokens, **kw):
    p = R.params_from_numpy(init, cfg, R.torch.float32, requires_grad=True)
    recs = R.train(p, cfg, ds, tokens, STEPS, **kw)
    return recs, {k: v.detach().numpy().astype(R.np.float64) for k, v in p.items()}


def weight_errors(final, ref_w):
    """per tensor max|d|/max|ref|; returns (worst value, worst name, dict)."""
    errs = {}
    for k, r in ref_w.items():
        errs[k] = float(R.np.abs(final[k].astype(R.np.float64) - r).max()
                        / max(float(R.np.abs(r).max()), 1e-30))
    worst = max(errs, key=errs.get)
    return errs[worst], worst, errs


def run_case(l3d, tmp, name, ds, tie, tokens):
    np = R.np
    print("== run %s: batch %d = micro %d x accum %d, clip %g, wd %g, warmup %s/%d, tie %s"
          % (name, ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"],
             ds["gradient_accumulation_steps"], ds["gradient_clipping"],
             ds["optimizer"]["params"]["weight_decay"], ds["scheduler"]["params"]["warmup_type"],
             ds["scheduler"]["params"]["warmup_num_steps"], tie))
    d = os.path.join(tmp, name)
    os.makedirs(d)
    mcfg = R.small_model_config(tie=tie, rope_scaling=True)
    cfg = R.Cfg(mcfg)
    R.write_json(os.path.join(d, "model_config.json"), mcfg)
    R.write_tokens(os.path.join(d, "tokens.bin"), tokens)
    conf = os.path.join(d, "config.json")
    # absolute: l3d resolves data.path against the working directory, not the config's
    ds = dict(ds, data=dict(ds["data"], path=os.path.join(d, "tokens.bin")))
    R.write_json(conf, ds)
    init_dir, final_dir, metrics = (os.path.join(d, x) for x in ("init", "final", "m.jsonl"))
    R.run([l3d, "train", "--config", conf, "--steps", "0", "--save", init_dir])
    R.run([l3d, "train", "--config", conf, "--steps", str(STEPS), "--metrics", metrics,
           "--save", final_dir])
    _, init = R.load_checkpoint(init_dir)
    _, final = R.load_checkpoint(final_dir)
    ok = True
    for label, t in (("INIT", init), ("FINAL", final)):
        for p in R.check_checkpoint_layout(cfg, t):
            print("  FAIL %s: %s" % (label, p))
            ok = False
    if not ok:
        return False
    if name == "base":
        again = os.path.join(d, "init2")
        R.run([l3d, "train", "--config", conf, "--steps", "0", "--save", again])
        _, init2 = R.load_checkpoint(again)
        same = all(np.array_equal(init[k], init2[k]) for k in init)
        print("  initialisation deterministic for a fixed seed: %s" % ("yes" if same else "NO"))
        ok &= same

    m = R.read_metrics(metrics)
    if [r.get("step") for r in m] != list(range(1, STEPS + 1)):
        print("  FAIL: metrics steps are %s, want 1..%d" % ([r.get("step") for r in m], STEPS))
        return False
    for r in m:
        for key in ("loss", "lr", "grad_norm"):
            if key not in r:
                print("  FAIL: metrics line %s lacks %r" % (r, key))
                return False

    sched = ds["scheduler"]
    max_lr = sched["params"]["warmup_max_lr"]
    lr_ok = all(abs(r["lr"] - R.lr_for(ds, i)) <= TOL_LR * max_lr for i, r in enumerate(m))
    recs, ref_w = ref_train(init, cfg, ds, tokens)
    if not lr_ok:
        shifted = all(abs(r["lr"] - R.warmup_lr(sched, i, "scheduler-index")) <= TOL_LR * max_lr
                      for i, r in enumerate(m))
        print("  FAIL lr: l3d's per-step lr %s differ from a DeepSpeed run's %s%s"
              % ([round(r["lr"], 8) for r in m], [round(x["lr"], 8) for x in recs],
                 " -- l3d evaluates WarmupLR at last_batch_iteration = s for optimizer step s "
                 "(0-based); in DeepSpeed, WarmupLR.__init__ sets min_lr (iteration -1) and "
                 "engine.step() calls lr_scheduler.step() after optimizer.step(), so step s "
                 "runs with iteration s-1" if shifted else ""))
        print("  (continuing with l3d's own lr values to check the rest)")
        ok = False
        lrs = [r["lr"] for r in m]
        recs, ref_w = ref_train(init, cfg, ds, tokens, lr_override=lambda s: lrs[s])

    print("  step  lr(l3d)     lr(ref)     loss(l3d)   loss(ref)   rel       "
          "gnorm(l3d)  gnorm(ref)  rel")
    e_loss = e_gn = e_lr = 0.0
    for r, x in zip(m, recs):
        el, eg = rel(r["loss"], x["loss"]), rel(r["grad_norm"], x["grad_norm"])
        elr = abs(r["lr"] - x["lr"]) / max_lr
        e_loss, e_gn, e_lr = max(e_loss, el), max(e_gn, eg), max(e_lr, elr)
        flag = "" if (el <= TOL_LOSS and eg <= TOL_GN and elr <= TOL_LR) else "  <-- FAIL"
        print("  %4d  %.4e  %.4e  %.8f  %.8f  %.2e  %.6f  %.6f  %.2e%s"
              % (r["step"], r["lr"], x["lr"], r["loss"], x["loss"], el, r["grad_norm"],
                 x["grad_norm"], eg, flag))
    LAST_NORMS[:] = [x["grad_norm"] for x in recs]
    clip = ds["gradient_clipping"]
    n_clipped = sum(1 for x in recs if x["grad_norm"] > clip)
    if clip > 0:
        print("  clipping %g acted on %d of %d steps (reference norms)" % (clip, n_clipped, STEPS))
    else:
        print("  clipping off")
    ok &= e_loss <= TOL_LOSS and e_gn <= TOL_GN and e_lr <= TOL_LR
    if name == "clip_tight" and n_clipped != STEPS:
        print("  FAIL: clip_tight is meant to clip on every step")
        ok = False
    if name == "clip_partial" and not 0 < n_clipped < STEPS:
        print("  note: clip_partial was meant to clip on some steps only")

    ew, worst, errs = weight_errors(final, ref_w)
    moved = max(float(np.abs(ref_w[k] - init[k]).max() / np.abs(ref_w[k]).max()) for k in init)
    print("  final weights: worst tensor %s max|d|/max|ref| %.3e (median over tensors %.3e); "
          "training moved the weights by up to %.3e of their scale"
          % (worst, ew, float(np.median(list(errs.values()))), moved))
    if ew > TOL_W:
        for k in sorted(errs, key=errs.get, reverse=True)[:5]:
            print("      %-45s %.3e" % (k, errs[k]))
    ok &= ew <= TOL_W

    lrs = [r["lr"] for r in m]
    variants = [("norm weights decayed too", dict(decay_norms=True))]
    if clip > 0:
        variants.append(("no gradient clipping", dict(no_clip=True)))
    if sched["params"]["warmup_type"] == "linear" and lr_ok:
        variants.append(("lr = min+(max-min)*s/W",
                         dict(lr_override=lambda s: R.warmup_lr_simple(sched, s))))
    for label, kw in variants:
        if "lr_override" not in kw and not lr_ok:
            kw["lr_override"] = lambda s: lrs[s]
        _, bad_w = ref_train(init, cfg, ds, tokens, **kw)
        eb = weight_errors(bad_w, ref_w)[0]
        if eb == 0.0:
            continue
        print("      reference with '%s': %.3e from the right one, l3d is %.3e from it"
              % (label, eb, weight_errors(final, bad_w)[0]))
    print("  run %s: %s" % (name, "PASS" if ok else "FAIL"))
    return ok


def main():
    R.check_imports()
    if len(sys.argv) < 2:
        print("usage: test_train.py /path/to/l3d")
        return 2
    l3d = os.path.abspath(sys.argv[1])
    if not os.access(l3d, os.X_OK):
        print("FAIL: %s is not an executable" % l3d)
        return 1
    R.torch.set_num_threads(2)
    R.torch.manual_seed(0)
    tokens = R.np.random.default_rng(1234).integers(0, 264, N_TOKENS)
    tmp = tempfile.mkdtemp(prefix="l3d_ref_train_")
    results = {}
    try:
        base_norms = None
        for name, ds, tie in runs():
            try:
                if ds["gradient_clipping"] == "partial":
                    # between the smallest and largest unclipped norm: clips some steps only
                    if not base_norms:
                        raise RuntimeError("needs the base run's grad norms")
                    ds["gradient_clipping"] = float("%.3g" % R.np.median(base_norms))
                results[name] = run_case(l3d, tmp, name, ds, tie, tokens)
                if name == "base":
                    base_norms = LAST_NORMS[:]
            except Exception as e:
                print("  FAIL %s: %s: %s" % (name, type(e).__name__, e))
                results[name] = False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("summary: " + ", ".join("%s %s" % (k, "PASS" if v else "FAIL")
                                  for k, v in results.items()))
    ok = all(results.values())
    print("test_train:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
