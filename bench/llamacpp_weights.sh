# Shared by bench/*_vs_llamacpp.sh (sourced): the weights both sides read.
# llamacpp_weights NAME CFG OUT [--tokenizer-json F]: `l3d train --steps 0 --save OUT/ck` writes
# random F32 weights of config CFG (empty: a 58.7M-parameter Llama 3 shape, vocabulary 128256,
# hidden 384, 6 layers, tied), then bench/gguf_from_hf.py writes OUT/model.gguf with the
# llama.cpp checkout's gguf-py (and the vocabulary of tokenizer.json F when given).
# Needs L3D, LLAMA, PY, HERE and die().
llamacpp_weights() {
  local name=$1 cfg=$2 out=$3
  shift 3
  if [ -z "$cfg" ]; then
    cfg=$out/model.json
    cat >"$cfg" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 384,
 "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 6,
 "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true,
 "bos_token_id": 128000, "eos_token_id": 128001, "initializer_range": 0.02, "torch_dtype": "float32"}
JSON
  fi
  echo "$name: writing the weights ($cfg)" >&2
  "$L3D" train --model "$cfg" --steps 0 --save "$out/ck" >"$out/train.log" 2>&1 ||
    { tail -3 "$out/train.log" >&2; die "l3d train --steps 0 --save failed"; }
  rm -f "$out"/ck/optimizer*.safetensors  # serving and generation read the weights only
  echo "$name: converting to GGUF F32 with $LLAMA/gguf-py" >&2
  "$PY" "$HERE/gguf_from_hf.py" "$out/ck" "$out/model.gguf" --gguf-py "$LLAMA/gguf-py" "$@" >&2 ||
    die "the GGUF conversion failed"
}
