"""Independent plain-PyTorch reference for llama3d: Llama 3 forward (as Hugging Face's
LlamaForCausalLM computes it), the training step (batching rule, gradient accumulation,
clipping, AdamW with two parameter groups, DeepSpeed's WarmupLR), and safetensors I/O.

Nothing here comes from llama3d; it is written from the published definitions so that
agreement with llama3d means something.  `python3 llama_ref.py` runs the self-checks
(the torch model against a second, loop-based numpy formulation, etc.).

Only /usr/bin/python3 has torch (Debian python3-torch 1.13) and numpy.
"""
import json
import math
import os
import struct
import subprocess
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the callers turn this into ctest's skip code
    np = None
    torch = None
    IMPORT_ERROR = e
else:
    IMPORT_ERROR = None

SKIP = 77

# ---- configs -----------------------------------------------------------------------------

HF_MATRIX_SUFFIXES = ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                      "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                      "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
HF_NORM_SUFFIXES = ("input_layernorm.weight", "post_attention_layernorm.weight")


def small_model_config(tie=False, rope_scaling=True, orig_max_pos=64):
    """The tiny model of the cross-checks.  head_dim 16 and rope_theta 500000 give wavelengths
    2*pi*500000^(i/8) = 6.3, 32.4, 167, ... so with original_max_position_embeddings 64,
    low_freq_factor 1, high_freq_factor 4 (low_freq_wavelen 64, high_freq_wavelen 16) pair 0 is
    high-frequency (kept), pair 1 is in the smoothed medium band, pairs 2..7 are divided by 8:
    all three branches of Llama 3.1's rope scaling are exercised."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 264,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": None,
        "max_position_embeddings": 128,
        "tie_word_embeddings": bool(tie),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "bos_token_id": 256,
        "eos_token_id": 257,
        "torch_dtype": "float32",
    }
    if rope_scaling:
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": orig_max_pos}
    return cfg


class Cfg:
    """The fields of an HF LlamaConfig dict that change the math."""

    def __init__(self, d):
        self.raw = d
        self.C = int(d["hidden_size"])
        self.F = int(d["intermediate_size"])
        self.L = int(d["num_hidden_layers"])
        self.H = int(d["num_attention_heads"])
        self.KVH = int(d.get("num_key_value_heads") or self.H)
        hd = d.get("head_dim")
        self.D = int(hd) if hd else self.C // self.H
        self.V = int(d["vocab_size"])
        self.eps = float(d.get("rms_norm_eps", 1e-6))
        self.theta = float(d.get("rope_theta", 10000.0))
        self.rope_scaling = d.get("rope_scaling")
        self.tie = bool(d.get("tie_word_embeddings", False))
        assert self.H % self.KVH == 0


def param_shapes(cfg):
    """HF tensor names -> shapes, in HF order."""
    C, F_, D, H, KVH, V = cfg.C, cfg.F, cfg.D, cfg.H, cfg.KVH, cfg.V
    out = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg.L):
        p = "model.layers.%d." % i
        out[p + "input_layernorm.weight"] = (C,)
        out[p + "self_attn.q_proj.weight"] = (H * D, C)
        out[p + "self_attn.k_proj.weight"] = (KVH * D, C)
        out[p + "self_attn.v_proj.weight"] = (KVH * D, C)
        out[p + "self_attn.o_proj.weight"] = (C, H * D)
        out[p + "post_attention_layernorm.weight"] = (C,)
        out[p + "mlp.gate_proj.weight"] = (F_, C)
        out[p + "mlp.up_proj.weight"] = (F_, C)
        out[p + "mlp.down_proj.weight"] = (C, F_)
    out["model.norm.weight"] = (C,)
    if not cfg.tie:
        out["lm_head.weight"] = (V, C)
    return out


def is_decayed(name):
    """Weight decay applies to the 2-D weights (embedding, projections, head), not norms."""
    return not name.endswith("norm.weight")


# ---- safetensors ---------------------------------------------------------------------------

_ST_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4", "I64": "<i8",
              "U8": "u1", "I8": "i1", "U32": "<u4", "BF16": "<u2"}


def bf16_bits_to_f32(bits):
    """bfloat16 bit patterns (uint16) -> float32 values (exact: bf16 is f32's top half)."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns, rounded as torch rounds (.to(torch.bfloat16))."""
    t = torch.from_numpy(np.array(a, dtype=np.float32))  # a writable copy
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def round_to(a, dtype):
    """float32 values as `dtype` ("F32", "BF16", "F16") would store them, back in float32."""
    a = np.asarray(a, dtype=np.float32)
    if dtype == "BF16":
        return bf16_bits_to_f32(f32_to_bf16_bits(a)).reshape(a.shape)
    if dtype == "F16":
        return a.astype(np.float16).astype(np.float32)
    return a


def read_safetensors(path):
    """Strict parser: 8-byte LE header length, JSON header, data_offsets relative to the data
    start. Returns (dict name -> np.ndarray, metadata dict, header dict); BF16 tensors come
    back as float32 values."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError("%s: shorter than the 8-byte header length" % path)
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise ValueError("%s: header length %d past the end (%d bytes)" % (path, n, len(buf)))
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    data = buf[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    spans = []
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, dt))
        shape = tuple(int(s) for s in info["shape"])
        b, e = (int(x) for x in info["data_offsets"])
        npdt = np.dtype(_ST_DTYPES[dt])
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= b <= e <= len(data)) or e - b != count * npdt.itemsize:
            raise ValueError("%s: tensor %s offsets [%d,%d) do not fit shape %s %s (data %d)"
                             % (path, name, b, e, shape, dt, len(data)))
        spans.append((b, e, name))
        t = np.frombuffer(data, dtype=npdt, count=count, offset=b).reshape(shape)
        tensors[name] = bf16_bits_to_f32(t).reshape(shape) if dt == "BF16" else t
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError("%s: tensors %s and %s overlap" % (path, n0, n1))
    return tensors, meta, header


def write_safetensors(path, tensors, metadata=None, dtype="F32"):
    """Writes tensors (dict name -> float array) in the safetensors format as `dtype` (F32,
    BF16 rounded as torch rounds, F16 as numpy rounds: both to nearest even)."""
    header = {}
    if metadata:  # first, as the safetensors library serialises its header
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name, arr in tensors.items():
        a = np.ascontiguousarray(np.asarray(arr, dtype="<f4"))
        if dtype == "BF16":
            raw = f32_to_bf16_bits(a).astype("<u2").tobytes()
        elif dtype == "F16":
            raw = a.astype("<f2").tobytes()
        else:
            raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for raw in blobs:
            f.write(raw)


def hf_state_dict_order(cfg):
    """Tensor names in LlamaForCausalLM.state_dict() order (module registration order:
    LlamaDecoderLayer registers self_attn, mlp, input_layernorm, post_attention_layernorm)."""
    out = ["model.embed_tokens.weight"]
    for i in range(cfg.L):
        p = "model.layers.%d." % i
        out += [p + s for s in HF_MATRIX_SUFFIXES] + [p + s for s in HF_NORM_SUFFIXES]
    out.append("model.norm.weight")
    if not cfg.tie:
        out.append("lm_head.weight")
    return out


def write_hf_sharded(ckdir, tensors, dtype, max_shard_size, cfg):
    """A Hugging Face directory's weights as transformers' save_pretrained writes them:
    huggingface_hub's split over the state_dict order (one tensor above the limit alone,
    numbered before the shard being filled; one that would overflow closes the current
    shard), files model-0000i-of-0000N.safetensors (tensors laid out by name, as the
    safetensors library does) and model.safetensors.index.json (indent 2, sorted keys,
    trailing newline). One shard: model.safetensors and no index."""
    size = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    shards, cur, cur_size, total = [], {}, 0, 0
    for name in hf_state_dict_order(cfg):
        arr = tensors[name]
        b = int(np.prod(arr.shape)) * size
        if b > max_shard_size:
            total += b
            shards.append({name: arr})
            continue
        if cur_size + b > max_shard_size:
            shards.append(cur)
            cur, cur_size = {}, 0
        cur[name] = arr
        cur_size += b
        total += b
    if cur:
        shards.append(cur)
    shards = [dict(sorted(sh.items())) for sh in shards]
    if len(shards) == 1:
        write_safetensors(os.path.join(ckdir, "model.safetensors"), shards[0], {"format": "pt"},
                          dtype)
        return ["model.safetensors"]
    names, wmap = [], {}
    for i, sh in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write_safetensors(os.path.join(ckdir, fname), sh, {"format": "pt"}, dtype)
        names.append(fname)
        for k in sh:
            wmap[k] = fname
    with open(os.path.join(ckdir, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}, indent=2,
                           sort_keys=True) + "\n")
    return names


def read_hf_weights(ckdir):
    """model.safetensors, or the index and its shards -> (tensors, {name: dtype})."""
    single = os.path.join(ckdir, "model.safetensors")
    files = [single]
    if not os.path.exists(single):
        with open(os.path.join(ckdir, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        files = [os.path.join(ckdir, x) for x in sorted(set(idx["weight_map"].values()))]
    tensors, dtypes = {}, {}
    for path in files:
        t, _, h = read_safetensors(path)
        tensors.update(t)
        dtypes.update({k: v["dtype"] for k, v in h.items()})
    return tensors, dtypes


def load_checkpoint(ckdir):
    """DIR/config.json + DIR/model.safetensors -> (config dict, tensors dict)."""
    with open(os.path.join(ckdir, "config.json")) as f:
        cfgd = json.load(f)
    tensors, _, _ = read_safetensors(os.path.join(ckdir, "model.safetensors"))
    return cfgd, tensors


def check_checkpoint_layout(cfg, tensors):
    """Returns a list of problems (names missing/extra, wrong shapes, dtypes)."""
    problems = []
    want = param_shapes(cfg)
    for name, shape in want.items():
        if name not in tensors:
            problems.append("missing tensor %s %s" % (name, shape))
        elif tuple(tensors[name].shape) != tuple(shape):
            problems.append("tensor %s has shape %s, want %s"
                            % (name, tuple(tensors[name].shape), shape))
        elif tensors[name].dtype != np.float32:
            problems.append("tensor %s has dtype %s, want float32" % (name, tensors[name].dtype))
    for name in tensors:
        if name not in want:
            problems.append("unexpected tensor %s %s" % (name, tuple(tensors[name].shape)))
    return problems


# ---- the model -------------------------------------------------------------------------------

def rope_inv_freq(cfg, dtype=None):
    """inv_freq (D/2,) as HF's rope init: default, or "llama3" (_compute_llama3_parameters)."""
    dtype = dtype or torch.float64
    D = cfg.D
    inv = 1.0 / (cfg.theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    rs = cfg.rope_scaling
    if rs:
        rtype = rs.get("rope_type", rs.get("type"))
        if rtype != "llama3":
            raise ValueError("rope_type %r not in the reference" % rtype)
        factor = float(rs["factor"])
        low = float(rs["low_freq_factor"])
        high = float(rs["high_freq_factor"])
        orig = float(rs["original_max_position_embeddings"])
        low_freq_wavelen = orig / low
        high_freq_wavelen = orig / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (~(wavelen < high_freq_wavelen)) & (~(wavelen > low_freq_wavelen))
        inv = torch.where(medium, smoothed, scaled)
    return inv.to(dtype)


def rope_cos_sin(cfg, T, dtype):
    inv = rope_inv_freq(cfg, torch.float64)
    pos = torch.arange(T, dtype=torch.float64)
    freqs = torch.outer(pos, inv)                       # (T, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)             # (T, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def _rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


# Deliberately wrong variants of the forward, used only to show that a check can tell them
# apart from the right one (and, when llama3d disagrees, which mistake it matches).
BUG_VARIANTS = ("rope_unscaled", "rope_interleaved", "gqa_modulo", "no_causal_mask",
                "norms_swapped")


def _rope_interleaved(x, cos, sin):
    # GPT-J / Meta-original pairing (x[2j], x[2j+1]) instead of HF's rotate_half
    h = x.shape[-1] // 2
    c, s = cos[..., :h], sin[..., :h]
    xe, xo = x[..., 0::2], x[..., 1::2]
    return torch.stack([xe * c - xo * s, xe * s + xo * c], dim=-1).flatten(-2)


def forward(params, cfg, ids, cos_sin=None, variant=None):
    """params: dict HF name -> tensor; ids: (B, T) int64. Returns logits (B, T, V).
    variant: None, or one of BUG_VARIANTS (diagnosis only)."""
    B, T = ids.shape
    H, KVH, D = cfg.H, cfg.KVH, cfg.D
    emb = params["model.embed_tokens.weight"]
    dtype = emb.dtype
    if variant == "rope_unscaled":
        cfg0 = Cfg(dict(cfg.raw, rope_scaling=None))
        cos, sin = rope_cos_sin(cfg0, T, dtype)
    else:
        cos, sin = cos_sin if cos_sin is not None else rope_cos_sin(cfg, T, dtype)
    x = emb[ids]                                         # (B, T, C)
    mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
    if variant == "no_causal_mask":
        mask = torch.zeros((T, T), dtype=dtype)
    rep = H // KVH
    n1, n2 = "input_layernorm.weight", "post_attention_layernorm.weight"
    if variant == "norms_swapped":
        n1, n2 = n2, n1
    for i in range(cfg.L):
        p = "model.layers.%d." % i
        hn = _rmsnorm(x, params[p + n1], cfg.eps)
        q = (hn @ params[p + "self_attn.q_proj.weight"].t()).view(B, T, H, D).transpose(1, 2)
        k = (hn @ params[p + "self_attn.k_proj.weight"].t()).view(B, T, KVH, D).transpose(1, 2)
        v = (hn @ params[p + "self_attn.v_proj.weight"].t()).view(B, T, KVH, D).transpose(1, 2)
        if variant == "rope_interleaved":
            q, k = _rope_interleaved(q, cos, sin), _rope_interleaved(k, cos, sin)
        else:
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        if variant == "gqa_modulo":
            k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)
        else:
            # GQA (HF repeat_kv): query head h uses kv head h // rep
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D) + mask
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + y @ params[p + "self_attn.o_proj.weight"].t()
        hn = _rmsnorm(x, params[p + n2], cfg.eps)
        g = hn @ params[p + "mlp.gate_proj.weight"].t()
        u = hn @ params[p + "mlp.up_proj.weight"].t()
        x = x + (F.silu(g) * u) @ params[p + "mlp.down_proj.weight"].t()
    x = _rmsnorm(x, params["model.norm.weight"], cfg.eps)
    head = params["lm_head.weight"] if not cfg.tie else emb
    return x @ head.t()


def params_from_numpy(tensors, cfg, dtype, requires_grad=False):
    out = {}
    for name in param_shapes(cfg):
        t = torch.from_numpy(np.array(tensors[name], dtype=np.float64)).to(dtype).contiguous()
        t.requires_grad_(requires_grad)
        out[name] = t
    return out


def random_params(cfg, seed, scale="init"):
    """numpy float32 weights. scale "init": HF-like init (normal 0.02, norms 1); "wide":
    weights of a scale at which attention is far from uniform and norm weights are not 1, so
    that RoPE, masking and each norm weight matter in the logits."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("norm.weight"):
            w = np.ones(shape) if scale == "init" else rng.uniform(0.5, 1.5, shape)
        elif scale == "init":
            w = rng.normal(0.0, 0.02, shape)
        elif name == "model.embed_tokens.weight":
            w = rng.normal(0.0, 1.0, shape)
        else:
            fan_in = shape[1]
            gain = 2.5 if ("q_proj" in name or "k_proj" in name) else 1.0
            w = rng.normal(0.0, gain / math.sqrt(fan_in), shape)
        out[name] = w.astype(np.float32)
    return out


# ---- a second, loop-based formulation for the self-checks ----------------------------------

def inv_freq_scalar(cfg):
    """Llama 3.1 rope scaling written element by element (for the self-check)."""
    D = cfg.D
    out = []
    for j in range(D // 2):
        f = 1.0 / cfg.theta ** (2.0 * j / D)
        rs = cfg.rope_scaling
        if rs:
            wl = 2 * math.pi / f
            orig = rs["original_max_position_embeddings"]
            lo, hi, fac = rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
            if wl < orig / hi:
                pass
            elif wl > orig / lo:
                f = f / fac
            else:
                s = (orig / wl - lo) / (hi - lo)
                f = (1 - s) * f / fac + s * f
        out.append(f)
    return np.array(out)


def forward_numpy_loops(tensors, cfg, ids):
    """Single sequence, float64 numpy, explicit per-head / per-position loops and complex-number
    RoPE on (x[j], x[j + D/2]) pairs. ids: list of ints. Returns (T, V)."""
    P = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    T = len(ids)
    H, KVH, D = cfg.H, cfg.KVH, cfg.D
    inv = inv_freq_scalar(cfg)

    def norm(x, w):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) / x.shape[-1] + cfg.eps) * w

    def rope(vec, pos):  # vec (D,)
        z = (vec[:D // 2] + 1j * vec[D // 2:]) * np.exp(1j * pos * inv)
        return np.concatenate([z.real, z.imag])

    x = P["model.embed_tokens.weight"][np.array(ids)]
    for i in range(cfg.L):
        p = "model.layers.%d." % i
        hn = norm(x, P[p + "input_layernorm.weight"])
        q = hn @ P[p + "self_attn.q_proj.weight"].T
        k = hn @ P[p + "self_attn.k_proj.weight"].T
        v = hn @ P[p + "self_attn.v_proj.weight"].T
        y = np.zeros((T, H * D))
        for h in range(H):
            kh = h // (H // KVH)
            ks = [rope(k[s, kh * D:(kh + 1) * D], s) for s in range(T)]
            for t in range(T):
                qt = rope(q[t, h * D:(h + 1) * D], t)
                sc = np.array([qt @ ks[s] for s in range(t + 1)]) / math.sqrt(D)
                w = np.exp(sc - sc.max())
                w /= w.sum()
                y[t, h * D:(h + 1) * D] = sum(w[s] * v[s, kh * D:(kh + 1) * D]
                                              for s in range(t + 1))
        x = x + y @ P[p + "self_attn.o_proj.weight"].T
        hn = norm(x, P[p + "post_attention_layernorm.weight"])
        g = hn @ P[p + "mlp.gate_proj.weight"].T
        u = hn @ P[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ P[p + "mlp.down_proj.weight"].T
    x = norm(x, P["model.norm.weight"])
    head = P["lm_head.weight"] if not cfg.tie else P["model.embed_tokens.weight"]
    return x @ head.T


# ---- training ---------------------------------------------------------------------------------

def batch(tokens, step, B, T, first=0, count=None):
    """The batching rule: sequence i of step s starts at ((s*B + i) * T) % n; inputs and
    targets (shifted by one) wrap around the stream. Returns int64 (count, T) x2."""
    n = len(tokens)
    count = B if count is None else count
    idx = np.empty((count, T + 1), dtype=np.int64)
    for r in range(count):
        o = ((step * B + first + r) * T) % n
        idx[r] = (o + np.arange(T + 1)) % n
    seq = np.asarray(tokens, dtype=np.int64)[idx]
    return seq[:, :-1], seq[:, 1:]


# Which step index DeepSpeed's WarmupLR formula is evaluated at for optimizer step s (0-based):
#  "deepspeed-engine": s - 1, what a DeepSpeed run does (see warmup_lr);
#  "scheduler-index":  s, i.e. _get_gamma() with last_batch_iteration = s (lr reaches
#                      warmup_max_lr one step earlier and step 1 is already above min_lr).
LR_SCHEDULE_CONVENTION = "deepspeed-engine"


def warmup_lr(sched, step, convention=None):
    """Learning rate of optimizer step `step` (0-based) under DeepSpeed's WarmupLR
    (deepspeed/runtime/lr_schedules.py), as the DeepSpeed engine applies it:
      - __init__ sets the lr from last_batch_iteration = -1, for which get_lr() is min_lr;
      - engine.step() runs optimizer.step() and THEN lr_scheduler.step();
    so optimizer step s uses last_batch_iteration = s - 1 (min_lr for s = 0), and
      gamma = (s-1)/W (linear) or log(s)/log(W) (log) while s-1 < W, else 1,
    with W = max(2, warmup_num_steps)."""
    p = sched.get("params", {})
    lo = float(p.get("warmup_min_lr", 0.0))
    hi = float(p["warmup_max_lr"])
    W = max(2, int(p.get("warmup_num_steps", 1000)))
    kind = p.get("warmup_type", "log")
    convention = convention or LR_SCHEDULE_CONVENTION
    it = step - 1 if convention == "deepspeed-engine" else step
    if it < 0:
        return lo
    if it < W:
        if kind == "linear":
            gamma = it / W
        else:
            gamma = math.log(it + 1) / math.log(W)
    else:
        gamma = 1.0
    return lo + (hi - lo) * gamma


def warmup_lr_simple(sched, step):
    """The simplified reading min + (max-min) * s / W (s 0-based), for diagnosis only."""
    p = sched["params"]
    lo, hi = float(p.get("warmup_min_lr", 0.0)), float(p["warmup_max_lr"])
    W = int(p["warmup_num_steps"])
    return lo + (hi - lo) * step / W if step < W else hi


def warmup_cosine_lr(sched, lr, step):
    """Learning rate of optimizer step `step` (0-based) under DeepSpeed's WarmupCosineLR
    (deepspeed/runtime/lr_schedules.py) with the optimizer's `lr`, applied as warmup_lr says:
    step s runs with last_batch_iteration it = s - 1, and it = -1 gives warmup_min_ratio * lr.
    During warm-up ratio = min_ratio + g * (1 - min_ratio), g = (it+1 > 0 ? log(it+1)/log(W) :
    0) or it/W; after it, progress p = min(1, (it - W + 1) / max(1, N - W)) and ratio =
    cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi p)) / 2 (the clamp is current
    DeepSpeed's)."""
    p = sched.get("params", {})
    W = max(2, int(p.get("warmup_num_steps", 1000)))
    N = int(p["total_num_steps"])
    lo = float(p.get("warmup_min_ratio", 0.0))
    floor = float(p.get("cos_min_ratio", 0.0001))
    it = step - 1
    if it < 0:
        return lr * lo
    if it < W:
        g = it / W if p.get("warmup_type", "log") == "linear" else math.log(it + 1) / math.log(W)
        return lr * (lo + g * (1 - lo))
    prog = min(1.0, (it - W + 1) / max(1, N - W))
    return lr * max(0.0, floor + (1 - floor) * (1 + math.cos(math.pi * prog)) / 2)


def lr_for(ds, step):
    sched = ds.get("scheduler")
    if not sched:
        return float(ds["optimizer"]["params"]["lr"])
    if sched["type"] == "WarmupCosineLR":
        return warmup_cosine_lr(sched, float(ds["optimizer"]["params"]["lr"]), step)
    if sched["type"] != "WarmupLR":
        raise ValueError("scheduler %s not in the reference" % sched["type"])
    return warmup_lr(sched, step)


def make_optimizer(params, ds, foreach=None):
    op = ds["optimizer"]["params"]
    decay = [t for n, t in params.items() if is_decayed(n)]
    no_decay = [t for n, t in params.items() if not is_decayed(n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(op.get("weight_decay", 0.0))},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=float(op.get("lr", 1e-3)), betas=tuple(float(b) for b in op.get("betas", (0.9, 0.999))),
        eps=float(op.get("eps", 1e-8)), foreach=foreach)


def train(params, cfg, ds, tokens, steps, lr_override=None, decay_norms=False, no_clip=False):
    """Trains `params` (dict of leaf tensors with requires_grad) in place for `steps` optimizer
    steps under the ds_config dict `ds`. Returns per-step records {step, loss, lr, grad_norm}.
    lr_override(step) replaces the schedule; decay_norms / no_clip are deliberate mistakes
    (diagnosis only)."""
    B = int(ds["train_batch_size"])
    micro = int(ds.get("train_micro_batch_size_per_gpu", B))
    accum = int(ds.get("gradient_accumulation_steps", B // micro))
    assert micro * accum == B, (micro, accum, B)
    T = int(ds["data"]["seq_len"])
    clip = 0.0 if no_clip else float(ds.get("gradient_clipping", 0.0))
    opt = make_optimizer(params, ds)
    if decay_norms:
        opt.param_groups[1]["weight_decay"] = opt.param_groups[0]["weight_decay"]
    plist = list(params.values())
    recs = []
    for s in range(steps):
        for t in plist:
            t.grad = None
        total = 0.0
        for j in range(accum):
            x, y = batch(tokens, s, B, T, first=j * micro, count=micro)
            logits = forward(params, cfg, torch.from_numpy(x))
            ce = F.cross_entropy(logits.reshape(-1, cfg.V), torch.from_numpy(y).reshape(-1),
                                 reduction="sum")
            (ce / (B * T)).backward()
            total += float(ce.detach())
        loss = total / (B * T)
        if clip > 0:
            gn = float(torch.nn.utils.clip_grad_norm_(plist, clip))
        else:
            gn = float(torch.norm(torch.stack([t.grad.detach().norm(2) for t in plist]), 2))
        lr = lr_override(s) if lr_override else lr_for(ds, s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        recs.append({"step": s + 1, "loss": loss, "lr": lr, "grad_norm": gn})
    return recs


# ---- helpers for the tests ---------------------------------------------------------------------

def run(cmd, timeout=300, cwd=None):
    """Runs a command, echoing it; returns CompletedProcess. Raises on non-zero exit."""
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                       cwd=cwd)
    if p.returncode != 0:
        sys.stdout.write(p.stdout.decode(errors="replace")[-4000:])
        sys.stdout.write(p.stderr.decode(errors="replace")[-4000:])
        raise RuntimeError("command failed with exit %d: %s" % (p.returncode, " ".join(cmd)))
    return p


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def write_tokens(path, tokens):
    np.asarray(tokens, dtype="<u4").tofile(path)


def read_metrics(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def rel_err_stats(ours, ref, floor_frac=0.05):
    """(max|d|/max|ref|, max elementwise |d|/(|ref| + floor_frac*max|ref|))."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    m = float(np.abs(ref).max()) or 1.0
    d = np.abs(ours - ref)
    return float(d.max() / m), float((d / (np.abs(ref) + floor_frac * m)).max())


def check_imports():
    if IMPORT_ERROR is not None:
        print("SKIP: torch/numpy not importable: %s" % IMPORT_ERROR)
        sys.exit(SKIP)


# ---- self-checks -------------------------------------------------------------------------------

def _selfcheck():
    check_imports()
    torch.manual_seed(0)
    ok = True

    # 1. rope inv_freq: vectorised HF-style vs scalar; and the bands are all hit.
    cfg = Cfg(small_model_config(tie=False, rope_scaling=True))
    a = rope_inv_freq(cfg).numpy()
    b = inv_freq_scalar(cfg)
    base = 1.0 / cfg.theta ** (np.arange(0, cfg.D, 2) / cfg.D)
    ratio = a / base
    print("inv_freq ratio to unscaled:", np.round(ratio, 4))
    e = np.abs(a - b).max() / np.abs(b).max()
    print("inv_freq vectorised vs scalar: %.3g" % e)
    ok &= e < 1e-14
    ok &= ratio[0] == 1.0 and abs(ratio[-1] - 1 / 8) < 1e-12 and 1 / 8 < ratio[1] < 1
    # Llama 3.1 8B: D 128, theta 500000, factor 8, 1, 4, 8192: high pairs kept, low / 8.
    big = Cfg({"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 1,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 8,
               "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}})
    r = rope_inv_freq(big).numpy() / (1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128))
    n_hi, n_lo = int((r == 1).sum()), int((np.abs(r - 0.125) < 1e-15).sum())
    print("8B rope: %d pairs kept, %d divided by 8, %d smoothed" % (n_hi, n_lo, 64 - n_hi - n_lo))
    ok &= np.abs(rope_inv_freq(big).numpy() / inv_freq_scalar(big) - 1).max() < 1e-14

    # 2. forward: torch float64 vs loop numpy float64, several configs, wide weights.
    for tie, rs in ((False, True), (True, True), (False, False)):
        cfg = Cfg(small_model_config(tie=tie, rope_scaling=rs))
        w = random_params(cfg, seed=3, scale="wide")
        ids = list(np.random.default_rng(5).integers(0, cfg.V, 24))
        ref = forward(params_from_numpy(w, cfg, torch.float64), cfg,
                      torch.tensor([ids])).detach().numpy()[0]
        alt = forward_numpy_loops(w, cfg, ids)
        e1, e2 = rel_err_stats(ref, alt)
        f32 = forward(params_from_numpy(w, cfg, torch.float32), cfg,
                      torch.tensor([ids])).detach().numpy()[0]
        g1, g2 = rel_err_stats(f32, ref)
        # attention is peaked at this scale: check that RoPE matters (no-rope logits differ)
        print("forward tie=%d scaling=%d: torch64 vs loops %.2e/%.2e; torch32 vs torch64 "
              "%.2e/%.2e; |logits| max %.2f" % (tie, rs, e1, e2, g1, g2, np.abs(ref).max()))
        ok &= e1 < 1e-12 and e2 < 1e-10
        if not tie:
            P = params_from_numpy(w, cfg, torch.float64)
            for var in BUG_VARIANTS:
                if var == "rope_unscaled" and not rs:
                    continue
                bad = forward(P, cfg, torch.tensor([ids]), variant=var).detach().numpy()[0]
                b1, _ = rel_err_stats(bad, ref)
                print("  bug variant %-16s differs by %.2e" % (var, b1))
                ok &= b1 > 1e-3

    # 3. gradient accumulation over micro-batches == one big batch (float64).
    cfg = Cfg(small_model_config())
    tokens = np.random.default_rng(1).integers(0, cfg.V, 1003)
    init = random_params(cfg, seed=2)
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
          "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95],
                                                    "eps": 1e-8, "weight_decay": 0.1}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
                        "warmup_max_lr": 3e-3, "warmup_num_steps": 4, "warmup_type": "linear"}},
          "data": {"seq_len": 16}}
    pa = params_from_numpy(init, cfg, torch.float64, True)
    pb = params_from_numpy(init, cfg, torch.float64, True)
    ra = train(pa, cfg, ds, tokens, 3)
    ds1 = dict(ds, train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=1)
    rb = train(pb, cfg, ds1, tokens, 3)
    d = max(float((pa[n] - pb[n]).abs().max()) for n in pa)
    print("accum 4x2 vs 1x8 (float64): losses %s vs %s, max weight diff %.2e"
          % ([round(r["loss"], 9) for r in ra], [round(r["loss"], 9) for r in rb], d))
    ok &= d < 1e-12 and all(abs(x["loss"] - y["loss"]) < 1e-12 for x, y in zip(ra, rb))
    print("lrs:", [r["lr"] for r in ra])
    ok &= [warmup_lr(ds["scheduler"], s) for s in range(7)] == \
        [0.0, 0.0, 3e-3 * 0.25, 3e-3 * 0.5, 3e-3 * 0.75, 3e-3, 3e-3]

    # 4. batching: wrap-around and shift.
    x, y = batch(np.arange(10), 1, 2, 4)
    ok &= x.tolist() == [[8, 9, 0, 1], [2, 3, 4, 5]] and y.tolist() == [[9, 0, 1, 2], [3, 4, 5, 6]]

    # 5. training decreases the loss (float32, constant lr, repeated short stream).
    p = params_from_numpy(init, cfg, torch.float32, True)
    dsc = dict(ds, scheduler=None, data={"seq_len": 16})
    del dsc["scheduler"]
    recs = train(p, cfg, dsc, tokens[:160], 30)
    print("loss %.4f -> %.4f over 30 steps" % (recs[0]["loss"], recs[-1]["loss"]))
    ok &= recs[-1]["loss"] < recs[0]["loss"] - 0.5

    # 6. safetensors round trip.
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        fn = os.path.join(td, "m.safetensors")
        write_safetensors(fn, init, {"format": "pt"})
        back, meta, _ = read_safetensors(fn)
        ok &= all(np.array_equal(back[k], init[k]) for k in init) and meta == {"format": "pt"}
        ok &= check_checkpoint_layout(cfg, back) == []
    print("SELFCHECK", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_selfcheck())
