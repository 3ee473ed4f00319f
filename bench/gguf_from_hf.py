"""Writes a llama3d / Hugging Face Llama checkpoint directory as a GGUF F32 file for llama.cpp.

usage: /usr/bin/python3 bench/gguf_from_hf.py CHECKPOINT_DIR OUT.gguf --gguf-py LLAMA_CPP/gguf-py
                                              [--tokenizer-json TOKENIZER_JSON]

Used by bench/generate_vs_llamacpp.sh. The tensors are read here with json + numpy (the
safetensors header is a JSON object after an 8-byte length) and written with the gguf-py
package of the llama.cpp checkout given, so the file is what that llama.cpp reads. What
llama.cpp's own convert_hf_to_gguf.py does for Llama and is repeated here:
  - names: model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight, etc.;
  - q_proj and k_proj rows are permuted from Hugging Face's rotate-half RoPE layout to ggml's
    interleaved one (LlamaModel.permute);
  - a tied lm_head is left out (llama.cpp then uses token_embd for the output);
  - rope_scaling of type llama3 becomes the rope_freqs.weight tensor of per-frequency factors.
Without --tokenizer-json no tokenizer is written: tokenizer.ggml.model is "no_vocab" with
vocab_size dummy tokens, which llama-bench accepts (it feeds random token ids), and the speed does
not depend on the ids. With it (Meta's Llama 3 tokenizer.json, for a model of its 128256 ids:
bench/serve_vs_llamacpp.sh, where llama-server must encode and decode), the byte-level BPE is
written as convert_hf_to_gguf.py writes Llama 3's: model "gpt2", pre-tokenizer "llama-bpe", the
token list by id (ids past the vocabulary are unused padding), control types for the special
tokens, the merges, and BOS / EOS from config.json.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "F32":
            t = raw.view(np.float32)
        elif dt == "F16":
            t = raw.view(np.float16).astype(np.float32)
        elif dt == "BF16":
            t = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            sys.exit("gguf_from_hf: %s: dtype %s is not F32, F16 or BF16" % (name, dt))
        out[name] = np.ascontiguousarray(t.reshape(info["shape"]), dtype=np.float32)
    return out


def load_tensors(ckdir):
    index = os.path.join(ckdir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for fn in files:
        tensors.update(read_safetensors(os.path.join(ckdir, fn)))
    return tensors


def permute(w, n_head):  # convert_hf_to_gguf.py, LlamaModel.permute
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def rope_factors(cfg, head_dim):  # convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors
    rs = cfg.get("rope_scaling") or {}
    if str(rs.get("rope_type", rs.get("type", ""))).lower() != "llama3":
        return None
    base = cfg.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = rs.get("factor", 8.0)
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    low_wl, high_wl = old / low, old / high
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def add_llama3_vocab(w, gguf, path, V, cfg):
    tj = json.load(open(path, encoding="utf-8"))
    tokens = ["[PAD%d]" % i for i in range(V)]
    types = [gguf.TokenType.UNUSED] * V
    for t, i in tj["model"]["vocab"].items():
        if i < V:
            tokens[i], types[i] = t, gguf.TokenType.NORMAL
    for t in tj.get("added_tokens", []):
        if t["id"] < V:
            tokens[t["id"]] = t["content"]
            types[t["id"]] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(int(cfg.get("bos_token_id", 128000)))
    eos = cfg.get("eos_token_id", 128001)
    w.add_eos_token_id(int(eos[0] if isinstance(eos, list) else eos))
    w.add_add_bos_token(True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--gguf-py", required=True, help="the gguf-py folder of a llama.cpp checkout")
    ap.add_argument("--tokenizer-json", help="a Llama 3 tokenizer.json to write as the vocabulary")
    ap.add_argument("--outtype", choices=["f32", "bf16"], default="f32",
                    help="the matrices' dtype (convert_hf_to_gguf.py's --outtype; norms stay F32)")
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    # gguf-py's vocab module imports sentencepiece at load time; the weights need none of it
    # (no vocabulary is written), and PyPI is out of reach here: an empty stand-in module
    # lets the package import where sentencepiece is not installed.
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        import types
        sp = types.ModuleType("sentencepiece")
        sp.SentencePieceProcessor = None
        sys.modules["sentencepiece"] = sp
    import gguf  # noqa: E402  (the checkout's own package)

    cfg = json.load(open(os.path.join(a.checkpoint, "config.json")))
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KVH = cfg.get("num_key_value_heads", H)
    D = cfg.get("head_dim") or C // H
    L, V = cfg["num_hidden_layers"], cfg["vocab_size"]
    T = load_tensors(a.checkpoint)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("llama3d checkpoint")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(C)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(KVH)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(V)
    bf16 = a.outtype == "bf16"
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)

    def add_matrix(name, t):  # rounded to nearest even, as convert_hf_to_gguf.py does
        t = np.ascontiguousarray(t, dtype=np.float32)
        if not bf16:
            w.add_tensor(name, t)
            return
        u = t.view(np.uint32)
        h = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        w.add_tensor(name, h, raw_shape=t.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)

    if a.tokenizer_json:
        add_llama3_vocab(w, gguf, a.tokenizer_json, V, cfg)
    else:
        w.add_tokenizer_model("no_vocab")

    add_matrix("token_embd.weight", T["model.embed_tokens.weight"])
    rf = rope_factors(cfg, D)
    if rf is not None:
        w.add_tensor("rope_freqs.weight", rf)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for l in range(L):
        for hf, gg in names.items():
            t = T["model.layers.%d.%s.weight" % (l, hf)]
            if gg == "attn_q":
                t = permute(t, H)
            elif gg == "attn_k":
                t = permute(t, KVH)
            if t.ndim == 2:
                add_matrix("blk.%d.%s.weight" % (l, gg), t)
            else:
                w.add_tensor("blk.%d.%s.weight" % (l, gg), np.ascontiguousarray(t))
    w.add_tensor("output_norm.weight", T["model.norm.weight"])
    if not cfg.get("tie_word_embeddings", False) and "lm_head.weight" in T:
        add_matrix("output.weight", T["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("gguf_from_hf: wrote %s (%d layers, vocabulary %d, %s)" % (a.out, L, V, a.outtype.upper()))


if __name__ == "__main__":
    main()
