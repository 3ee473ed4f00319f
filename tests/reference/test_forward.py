"""Cross-check of `l3d forward` against the float64 PyTorch reference (llama_ref.py).

usage: /usr/bin/python3 tests/reference/test_forward.py /path/to/l3d

For each model variant (untied + llama3 rope scaling, tied + scaling, untied without scaling):
  1. `l3d train --config C --steps 0 --save DIR` writes the initial checkpoint; DIR/config.json
     is checked against the model config we gave, DIR/model.safetensors (parsed here with
     json + numpy) against the Hugging Face tensor names and shapes;
  2. `l3d forward --checkpoint DIR --tokens <40 ids> --out F` is compared with the reference
     run in float64 on the same float32 weights;
  3. the same on a checkpoint written here with "wide" random weights (attention far from
     uniform, norm weights not 1), so that RoPE, its scaling bands, GQA, the causal mask and
     each norm weight visibly change the logits; deliberately wrong variants of the reference
     are printed to show how far each mistake would be (and which one llama3d matches if it
     fails).
Pass: max|ours-ref|/max|ref| <= 1e-4 and max elementwise |ours-ref|/(|ref| + 0.05 max|ref|)
<= 1e-4 everywhere. Exit 0 pass, 1 fail, 77 skip (no torch/numpy).
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402

TOL_MAX = 1e-4
TOL_ELEM = 1e-4
T_TOKENS = 40

# keys of config.json that change the math; value compared (floats relatively)
MATH_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
             "max_position_embeddings", "tie_word_embeddings")


def _close(a, b):
    if isinstance(b, bool) or isinstance(a, bool):
        return bool(a) == bool(b) and type(a) == type(b)
    if isinstance(b, (int, float)) and isinstance(a, (int, float)):
        return abs(a - b) <= 1e-6 * max(abs(b), 1e-30)
    return a == b


def check_config(written, wanted):
    problems = []
    for k in MATH_KEYS:
        if k not in written:
            problems.append("config.json lacks %s" % k)
        elif not _close(written[k], wanted[k]):
            problems.append("config.json %s = %r, want %r" % (k, written[k], wanted[k]))
    rs_w, rs = written.get("rope_scaling", "absent"), wanted["rope_scaling"]
    if rs is None:
        if rs_w is not None:
            problems.append("config.json rope_scaling = %r, want null" % (rs_w,))
    elif not isinstance(rs_w, dict):
        problems.append("config.json rope_scaling = %r, want %r" % (rs_w, rs))
    else:
        for k, v in rs.items():
            if k not in rs_w or not _close(rs_w[k], v):
                problems.append("config.json rope_scaling.%s = %r, want %r"
                                % (k, rs_w.get(k), v))
    return problems


def l3d_forward(l3d, ckdir, ids, out, V):
    R.run([l3d, "forward", "--checkpoint", ckdir, "--tokens", ",".join(str(int(i)) for i in ids),
           "--out", out])
    raw = R.np.fromfile(out, dtype="<f4")
    if raw.size != len(ids) * V:
        raise RuntimeError("%s holds %d floats, want T*V = %d*%d" % (out, raw.size, len(ids), V))
    return raw.reshape(len(ids), V).astype(R.np.float64)


def compare(label, ours, weights, cfg, ids, show_variants):
    torch = R.torch
    P = R.params_from_numpy(weights, cfg, torch.float64)
    ref = R.forward(P, cfg, torch.tensor([list(ids)])).detach().numpy()[0]
    e_max, e_elem = R.rel_err_stats(ours, ref)
    ok = e_max <= TOL_MAX and e_elem <= TOL_ELEM and R.np.isfinite(ours).all()
    worst = R.np.unravel_index(R.np.argmax(R.np.abs(ours - ref)), ref.shape)
    print("  %-28s max|ref| %8.4f  max|d|/max|ref| %.3e  elementwise %.3e  worst at "
          "(t=%d, v=%d)  %s" % (label, R.np.abs(ref).max(), e_max, e_elem, worst[0], worst[1],
                                "ok" if ok else "FAIL"))
    if show_variants or not ok:
        for var in R.BUG_VARIANTS:
            if var == "rope_unscaled" and not cfg.rope_scaling:
                continue
            bad = R.forward(P, cfg, torch.tensor([list(ids)]), variant=var).detach().numpy()[0]
            print("      l3d vs reference-with-bug %-16s %.3e   (right vs this bug %.3e)"
                  % (var, R.rel_err_stats(ours, bad)[0], R.rel_err_stats(bad, ref)[0]))
        if not ok:
            per_t = R.np.abs(ours - ref).max(axis=1) / R.np.abs(ref).max()
            print("      error per position:", " ".join("%.1e" % e for e in per_t))
    return ok


def run_case(l3d, tmp, name, tie, scaling):
    np = R.np
    print("== case %s (tie_word_embeddings=%s, rope_scaling=%s)" % (name, tie, scaling))
    d = os.path.join(tmp, name)
    os.makedirs(d)
    mcfg = R.small_model_config(tie=tie, rope_scaling=scaling)
    cfg = R.Cfg(mcfg)
    R.write_json(os.path.join(d, "model_config.json"), mcfg)
    R.write_tokens(os.path.join(d, "tokens.bin"),
                   np.random.default_rng(11).integers(0, cfg.V, 512))
    R.write_json(os.path.join(d, "config.json"), {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95],
                                                  "eps": 1e-8, "weight_decay": 0.1}},
        "model": "model_config.json",
        "data": {"path": os.path.join(d, "tokens.bin"), "seq_len": 16},
        "train": {"steps": 10, "seed": 7}})
    ck = os.path.join(d, "init")
    R.run([l3d, "train", "--config", os.path.join(d, "config.json"), "--steps", "0",
           "--save", ck])
    ok = True
    written, tensors = R.load_checkpoint(ck)
    probs = check_config(written, mcfg) + R.check_checkpoint_layout(cfg, tensors)
    for p in probs:
        print("  FAIL " + p)
    if probs:
        return False
    print("  checkpoint layout: %d tensors, names/shapes/dtypes as Hugging Face's, config.json "
          "math keys as given" % len(tensors))
    stds = {k: float(v.std()) for k, v in tensors.items() if v.ndim == 2}
    print("  init std of matrices: %.4f .. %.4f (norm weights %s)"
          % (min(stds.values()), max(stds.values()),
             "all 1" if all((v == 1).all() for k, v in tensors.items() if v.ndim == 1)
             else "not all 1"))
    if min(stds.values()) == 0.0:
        print("  FAIL: some initial matrix is all zeros (%s)"
              % [k for k, s in stds.items() if s == 0.0])
        ok = False

    ids = np.random.default_rng(100 + len(name)).integers(0, cfg.V, T_TOKENS)
    ours = l3d_forward(l3d, ck, ids, os.path.join(d, "init.logits"), cfg.V)
    ok &= compare("l3d init weights", ours, tensors, cfg, ids, False)

    wide = os.path.join(d, "wide")
    os.makedirs(wide)
    shutil.copy(os.path.join(ck, "config.json"), os.path.join(wide, "config.json"))
    w = R.random_params(cfg, seed=21 + len(name), scale="wide")
    R.write_safetensors(os.path.join(wide, "model.safetensors"), w, {"format": "pt"})
    ours = l3d_forward(l3d, wide, ids, os.path.join(d, "wide.logits"), cfg.V)
    ok &= compare("wide random weights", ours, w, cfg, ids, not tie)
    return ok


def main():
    R.check_imports()
    if len(sys.argv) < 2:
        print("usage: test_forward.py /path/to/l3d")
        return 2
    l3d = os.path.abspath(sys.argv[1])
    if not os.access(l3d, os.X_OK):
        print("FAIL: %s is not an executable" % l3d)
        return 1
    R.torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="l3d_ref_fwd_")
    results = {}
    try:
        for name, tie, scaling in (("untied_llama3rope", False, True),
                                   ("tied_llama3rope", True, True),
                                   ("untied_plainrope", False, False)):
            try:
                results[name] = run_case(l3d, tmp, name, tie, scaling)
            except Exception as e:  # a crash in one case must not hide the others
                print("  FAIL %s: %s: %s" % (name, type(e).__name__, e))
                results[name] = False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("summary: " + ", ".join("%s %s" % (k, "PASS" if v else "FAIL")
                                  for k, v in results.items()))
    ok = all(results.values())
    print("test_forward:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
