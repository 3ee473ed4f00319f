"""Training-step throughput: llama3d against plain PyTorch (float32, eager) on the same model.

usage: /usr/bin/python3 bench/train_step.py /path/to/l3d [--threads N] [--steps K] [--bf16]
                                             [--model NAME|config.json]

Model: the llama3-tiny preset (--model: another preset or an HF config.json), batch 8 x seq_len 64 (micro 8, accum 1), clipping 1.0, AdamW.
llama3d: `l3d train --config C --model llama3-tiny --steps K --metrics M` with
"train": {"threads": N}; its throughput is the median "tokens_per_s" over the steps after the
first two (and its "mfu", the fraction of its measured sgemm peak, likewise).
PyTorch: the checkpoint that `--steps 0 --save INIT` writes, loaded into the reference model of
tests/reference/llama_ref.py in float32 with torch.set_num_threads(N); each step is
forward + backward + clip_grad_norm_ + AdamW.step on the same batch shape; median step time
over the steps after the first two.
--bf16: llama3d with "bf16": {"enabled": true} (bfloat16 weights the passes read and
activations over float32 masters), PyTorch with its forward and loss under
torch.autocast("cpu", dtype=torch.bfloat16) (its matmuls in bfloat16, on oneDNN's AMX or
AVX512-BF16 kernels where the CPU has them) and float32 parameters and optimizer: the two
mixed-precision recipes side by side.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
import llama_ref as R  # noqa: E402

B, T = 8, 64
WARM = 2


def bench_l3d(l3d, d, conf, steps, model):
    metrics = os.path.join(d, "m.jsonl")
    t0 = time.perf_counter()
    R.run([l3d, "train", "--config", conf, "--model", model, "--steps", str(steps),
           "--metrics", metrics], timeout=3600)
    wall = time.perf_counter() - t0
    m = R.read_metrics(metrics)
    tail = m[WARM:] if len(m) > WARM else m
    tps = [r["tokens_per_s"] for r in tail if "tokens_per_s" in r]
    mfu = [r["mfu"] for r in tail if "mfu" in r]
    return (statistics.median(tps) if tps else None, statistics.median(mfu) if mfu else None,
            wall, m)


def bench_torch(init_dir, threads, steps, tokens, bf16):
    torch = R.torch
    torch.set_num_threads(threads)
    cfgd, tensors = R.load_checkpoint(init_dir)
    cfg = R.Cfg(cfgd)
    params = R.params_from_numpy(tensors, cfg, torch.float32, requires_grad=True)
    ds = {"optimizer": {"params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                   "weight_decay": 0.1}}}
    opt = R.make_optimizer(params, ds, foreach=True)  # torch's faster multi-tensor path
    plist = list(params.values())
    cos_sin = R.rope_cos_sin(cfg, T, torch.float32)
    times = []
    for s in range(steps):
        x, y = R.batch(tokens, s, B, T)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        t0 = time.perf_counter()
        for p in plist:
            p.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = R.forward(params, cfg, x, cos_sin=cos_sin)
            loss = R.F.cross_entropy(logits.reshape(-1, cfg.V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    tail = times[WARM:] if len(times) > WARM else times
    n_params = sum(p.numel() for p in plist)
    return B * T / statistics.median(tail), cfg, n_params


def main():
    R.check_imports()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("l3d")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", default="llama3-tiny", help="preset name or HF config.json")
    ap.add_argument("--bf16", action="store_true",
                    help="bf16.enabled against torch.autocast(bfloat16)")
    a = ap.parse_args()
    l3d = os.path.abspath(a.l3d)
    steps = max(a.steps, WARM + 1)
    tmp = tempfile.mkdtemp(prefix="l3d_bench_")
    try:
        np = R.np
        tokens = np.random.default_rng(0).integers(0, 256, 1 << 16)
        R.write_tokens(os.path.join(tmp, "tokens.bin"), tokens)
        conf = os.path.join(tmp, "config.json")
        R.write_json(conf, {
            "train_batch_size": B, "train_micro_batch_size_per_gpu": B,
            "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95],
                                                      "eps": 1e-8, "weight_decay": 0.1}},
            "data": {"path": os.path.join(tmp, "tokens.bin"), "seq_len": T},
            "train": {"steps": steps, "seed": 1, "threads": a.threads},
            **({"bf16": {"enabled": True}} if a.bf16 else {})})
        init = os.path.join(tmp, "init")
        model = os.path.abspath(a.model) if os.path.exists(a.model) else a.model
        R.run([l3d, "train", "--config", conf, "--model", model, "--steps", "0",
               "--save", init])
        l3d_tps, l3d_mfu, wall, m = bench_l3d(l3d, tmp, conf, steps, model)
        torch_tps, cfg, n_params = bench_torch(init, a.threads, steps, tokens, a.bf16)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(a.model + ": hidden %d, layers %d, heads %d/%d kv, head_dim %d, ffn %d, vocab %d, "
          "%.2fM params; batch %d x %d tokens, %d steps (median over steps %d..%d)"
          % (cfg.C, cfg.L, cfg.H, cfg.KVH, cfg.D, cfg.F, cfg.V, n_params / 1e6, B, T, steps,
             WARM + 1, steps))
    if l3d_tps is None:
        # no tokens_per_s in the metrics: fall back to the whole run's wall clock
        l3d_tps = B * T * steps / wall
        print("note: l3d's metrics have no tokens_per_s; using whole-run wall clock (%.2f s, "
              "includes start-up)" % wall)
    if a.bf16:
        print("bf16: llama3d bf16.enabled, torch autocast(bfloat16)")
    print("%-10s %8s %14s" % ("impl", "threads", "tokens/s"))
    print("%-10s %8d %14.1f" % ("llama3d", a.threads, l3d_tps))
    print("%-10s %8d %14.1f" % ("torch", a.threads, torch_tps))
    print("ratio llama3d/torch: %.3f" % (l3d_tps / torch_tps))
    print("llama3d mfu (median, fraction of its measured sgemm peak): %s"
          % ("%.3f" % l3d_mfu if l3d_mfu is not None else "n/a (no mfu in metrics)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
