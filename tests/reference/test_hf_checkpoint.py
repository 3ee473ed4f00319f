"""Hugging Face checkpoints as they ship: BF16 / F16 / F32 weights, one file or sharded with
model.safetensors.index.json, read by `l3d forward` and as the start of `l3d train --model DIR`,
and written back by saves with train.save_dtype / train.save_max_shard_size.

usage: /usr/bin/python3 tests/reference/test_hf_checkpoint.py /path/to/l3d

The fixture is made here, the way transformers' save_pretrained lays it out (llama_ref's
write_hf_sharded: huggingface_hub's split over the state_dict order, tensors laid out by name
inside each file, the index with indent 2 and sorted keys; BF16 rounded by torch). Checks:
  1. forward on the sharded BF16 directory (and a one-file F16 one) = the float64 reference on
     the same rounded weights: max|d|/max|ref| and elementwise <= 1e-4 (as test_forward.py:
     float32 sums over C = 64 .. F = 160 terms are ~1e-6 relative, far below; a wrong tensor,
     a transposed shard or a lost dtype is >= 1e-2).
  2. `l3d train --model DIR` starts from those weights and says so ("weights: DIR (bf16, N
     shards)"); its step-1 loss equals the float64 reference loss of the first batch on those
     weights (relative 1e-4, test_train.py's loss bound; fresh random weights are off by > 10%)
     for one rank, tp 2, pp 2 and dp 2 x tp 2 (threads; each rank reads only its own slices).
  3. The save: by default in the dtype loaded (BF16) with the source's tokenizer and
     generation files carried byte for byte; with save_dtype float32 and save_max_shard_size
     the same split and index text as transformers would write for those tensors; the BF16 save
     of a run equals torch's rounding of the float32 save of the same run, bit for bit.
  4. Round trip: forward on each saved directory = the reference on its weights (1e-4).
  5. Broken indexes and shards are refused with exit 2 naming the file and the tensor.
Exit 0 pass, 1 fail, 77 skip (no torch/numpy).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402

TOL = 1e-4
T_TOKENS = 40
SHARD = 40000  # bytes: the tiny model's BF16 weights (~150 KB) split into several shards
FAILS = []


def check(ok, what):
    print("  %s %s" % ("ok  " if ok else "FAIL", what), flush=True)
    if not ok:
        FAILS.append(what)
    return ok


def forward(l3d, ckdir, ids, out, V):
    R.run([l3d, "forward", "--checkpoint", ckdir, "--tokens", ",".join(str(int(i)) for i in ids),
           "--out", out])
    return R.np.fromfile(out, dtype="<f4").reshape(len(ids), V).astype(R.np.float64)


def ref_logits(weights, cfg, ids):
    P = R.params_from_numpy(weights, cfg, R.torch.float64)
    return R.forward(P, cfg, R.torch.tensor([list(ids)])).detach().numpy()[0]


def ref_loss(weights, cfg, tokens, B, T):
    x, y = R.batch(tokens, 0, B, T)
    P = R.params_from_numpy(weights, cfg, R.torch.float64)
    logits = R.forward(P, cfg, R.torch.from_numpy(x))
    return float(R.F.cross_entropy(logits.reshape(-1, cfg.V), R.torch.from_numpy(y).reshape(-1)))


def train(l3d, conf, model, steps, extra, metrics, save=None):
    cmd = [l3d, "train", "--config", conf, "--model", model, "--steps", str(steps),
           "--metrics", metrics] + extra + (["--save", save] if save else [])
    p = R.run(cmd)
    return p.stdout.decode(errors="replace"), R.read_metrics(metrics)


def refused(l3d, ckdir, needles):
    p = subprocess.run([l3d, "forward", "--checkpoint", ckdir, "--tokens", "1,2,3", "--out",
                        os.path.join(ckdir, "never.logits")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    err = p.stderr.decode(errors="replace")
    ok = p.returncode == 2 and all(n in err for n in needles)
    if not ok:
        print("    exit %d, stderr: %s" % (p.returncode, err.strip()[-400:]))
    return ok


def main():
    R.check_imports()
    if len(sys.argv) < 2:
        print("usage: test_hf_checkpoint.py /path/to/l3d")
        return 2
    l3d = os.path.abspath(sys.argv[1])
    np = R.np
    R.torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="l3d_ref_hf_")
    try:
        mcfg = R.small_model_config(tie=False, rope_scaling=True)
        cfg = R.Cfg(mcfg)
        w = R.random_params(cfg, seed=31, scale="wide")
        ids = np.random.default_rng(5).integers(0, cfg.V, T_TOKENS)

        print("== 1. reading BF16 shards and an F16 file")
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        R.write_json(os.path.join(src, "config.json"), mcfg)
        shards = R.write_hf_sharded(src, w, "BF16", SHARD, cfg)
        carried = {"tokenizer_config.json": b'{"bos_token": "<|begin_of_text|>"}\n',
                   "generation_config.json": b'{"eos_token_id": [128001, 128009]}\n',
                   "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n'}
        for k, v in carried.items():
            with open(os.path.join(src, k), "wb") as f:
                f.write(v)
        check(len(shards) >= 3, "fixture: %d BF16 shards and an index" % len(shards))
        wb = {k: R.round_to(v, "BF16") for k, v in w.items()}
        ours = forward(l3d, src, ids, os.path.join(tmp, "src.logits"), cfg.V)
        e = R.rel_err_stats(ours, ref_logits(wb, cfg, ids))
        check(max(e) <= TOL, "forward on BF16 shards = reference on the BF16 weights "
              "(%.2e, %.2e <= %g)" % (e[0], e[1], TOL))
        e_f32 = R.rel_err_stats(ours, ref_logits(w, cfg, ids))[0]
        print("    (against the unrounded float32 weights instead: %.2e: the check sees the "
              "rounding)" % e_f32)
        f16 = os.path.join(tmp, "f16")
        os.makedirs(f16)
        R.write_json(os.path.join(f16, "config.json"), mcfg)
        R.write_safetensors(os.path.join(f16, "model.safetensors"), w, {"format": "pt"}, "F16")
        ours = forward(l3d, f16, ids, os.path.join(tmp, "f16.logits"), cfg.V)
        wh = {k: R.round_to(v, "F16") for k, v in w.items()}
        e = R.rel_err_stats(ours, ref_logits(wh, cfg, ids))
        check(max(e) <= TOL, "forward on one F16 file = reference (%.2e, %.2e)" % e)

        print("== 2. train --model DIR starts from the weights")
        tokens = np.random.default_rng(12).integers(0, cfg.V, 1003)
        R.write_tokens(os.path.join(tmp, "tokens.bin"), tokens)
        B, T = 8, 16
        conf = os.path.join(tmp, "ds.json")
        ds = {"train_batch_size": B, "train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "data": {"path": os.path.join(tmp, "tokens.bin"), "seq_len": T},
              "train": {"seed": 7}}
        R.write_json(conf, ds)
        want = ref_loss(wb, cfg, tokens, B, T)
        fresh = ref_loss(R.random_params(cfg, seed=7, scale="init"), cfg, tokens, B, T)
        print("    reference step-1 loss %.6f (fresh init weights would give about %.3f)"
              % (want, fresh))
        outs = {}
        for label, extra in (("one rank", []), ("tp 2", ["--tp", "2"]), ("pp 2", ["--pp", "2"]),
                             ("dp 2 x tp 2", ["--dp", "2", "--tp", "2"])):
            out = os.path.join(tmp, "out_" + label.replace(" ", ""))
            stdout, m = train(l3d, conf, src, 2, extra, os.path.join(tmp, label + ".jsonl"),
                              out if label == "one rank" else None)
            outs[label] = out
            line = "weights: %s (bf16, %d shards)" % (src, len(shards))
            check(line in stdout, "%s: prints '%s'" % (label, line))
            got = m[0]["loss"]
            check(abs(got - want) <= TOL * abs(want),
                  "%s: step-1 loss %.6f = reference %.6f (rel %.1e <= %g)"
                  % (label, got, want, abs(got - want) / abs(want), TOL))

        print("== 3. saving")
        out = outs["one rank"]
        saved, dtypes = R.read_hf_weights(out)
        check(os.path.exists(os.path.join(out, "model.safetensors")) and
              set(dtypes.values()) == {"BF16"},
              "default save: one model.safetensors in the dtype loaded (%s)"
              % sorted(set(dtypes.values())))
        same = all(open(os.path.join(out, k), "rb").read() == v for k, v in carried.items()
                   if os.path.exists(os.path.join(out, k)))
        check(same and all(os.path.exists(os.path.join(out, k)) for k in carried),
              "tokenizer and generation files carried byte for byte")
        ds32 = dict(ds, train={"seed": 7, "save_dtype": "float32", "save_max_shard_size": SHARD})
        conf32 = os.path.join(tmp, "ds32.json")
        R.write_json(conf32, ds32)
        out32 = os.path.join(tmp, "out32")
        train(l3d, conf32, src, 2, [], os.path.join(tmp, "m32.jsonl"), out32)
        w32, dt32 = R.read_hf_weights(out32)
        check(set(dt32.values()) == {"F32"}, "save_dtype float32: F32 tensors")
        again = os.path.join(tmp, "hf_again")
        os.makedirs(again)
        names = R.write_hf_sharded(again, w32, "F32", SHARD, cfg)
        index_same = open(os.path.join(again, "model.safetensors.index.json")).read() == \
            open(os.path.join(out32, "model.safetensors.index.json")).read()
        check(len(names) > 1 and index_same,
              "save_max_shard_size %d: %d shards, the index transformers would write" %
              (SHARD, len(names)))
        files_same = all(open(os.path.join(again, n), "rb").read() ==
                         open(os.path.join(out32, n), "rb").read() for n in names)
        check(files_same, "each shard byte for byte what the safetensors library would write")
        bits = all(np.array_equal(R.f32_to_bf16_bits(w32[k]),
                                  R.f32_to_bf16_bits(saved[k])) for k in w32)
        check(bits, "the BF16 save = torch's rounding of the float32 save of the same run")

        # The other two dtype x layout pairs: BF16 shards, F32 in one file.
        more = {}
        for label, train_sec in (("bf16 shards", {"seed": 7, "save_dtype": "bfloat16",
                                                  "save_max_shard_size": "40KB"}),
                                 ("f32 one file", {"seed": 7, "save_dtype": "float32"})):
            c = os.path.join(tmp, label.replace(" ", "_") + ".json")
            R.write_json(c, dict(ds, train=train_sec))
            more[label] = os.path.join(tmp, "out_" + label.replace(" ", "_"))
            train(l3d, c, src, 2, [], os.path.join(tmp, label + ".jsonl"), more[label])
        sharded = os.path.exists(os.path.join(more["bf16 shards"], "model.safetensors.index.json"))
        _, dtb = R.read_hf_weights(more["bf16 shards"])
        _, dtf = R.read_hf_weights(more["f32 one file"])
        check(sharded and set(dtb.values()) == {"BF16"} and set(dtf.values()) == {"F32"} and
              os.path.exists(os.path.join(more["f32 one file"], "model.safetensors")),
              "save_max_shard_size \"40KB\" with bfloat16: BF16 shards; float32 alone: one F32 file")

        print("== 4. round trip")
        for label, d in (("bf16 one file", out), ("f32 shards", out32),
                         ("bf16 shards", more["bf16 shards"]), ("f32 one file", more["f32 one file"])):
            t, _ = R.read_hf_weights(d)
            ours = forward(l3d, d, ids, os.path.join(tmp, "rt.logits"), cfg.V)
            e = R.rel_err_stats(ours, ref_logits(t, cfg, ids))
            check(max(e) <= TOL, "forward on the saved %s = reference on its weights "
                  "(%.2e, %.2e)" % (label, e[0], e[1]))

        print("== 5. broken directories")
        bad = os.path.join(tmp, "bad")
        shutil.copytree(src, bad)
        idx_path = os.path.join(bad, "model.safetensors.index.json")
        idx = json.load(open(idx_path))
        os.remove(os.path.join(bad, shards[1]))
        check(refused(l3d, bad, [shards[1], "does not exist"]), "a missing shard: exit 2 naming it")
        shutil.copy(os.path.join(src, shards[1]), os.path.join(bad, shards[1]))
        # a tensor of a shard holding several, so that the shard stays in the index
        home = next(s for s in shards if list(idx["weight_map"].values()).count(s) > 1)
        victim = sorted(k for k, v in idx["weight_map"].items() if v == home)[0]
        other = shards[1] if home != shards[1] else shards[2]
        idx["weight_map"][victim] = other
        R.write_json(idx_path, idx)
        check(refused(l3d, bad, [victim, other]),
              "an index mapping a tensor to the wrong shard: exit 2 naming both")
        del idx["weight_map"][victim]
        R.write_json(idx_path, idx)
        check(refused(l3d, bad, [victim, "does not list"]),
              "a shard tensor the index does not list: exit 2 naming it")
        os.remove(idx_path)
        for sh in shards:
            os.remove(os.path.join(bad, sh))
        check(refused(l3d, bad, ["holds no model weights"]), "no weights at all: exit 2")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_hf_checkpoint:", "PASS" if not FAILS else "FAIL (%d)" % len(FAILS))
    return 0 if not FAILS else 1


if __name__ == "__main__":
    sys.exit(main())
