# Shared by bench/*_vs_llamacpp.sh (sourced): the checks they start with and the weights both
# sides read.
#
# llamacpp_setup NAME TOOL: defines skip() and die() for bench/NAME.sh, then needs a llama.cpp
# checkout in LLAMA with build/bin/TOOL (set as LLAMA_TOOL; else one line saying what was
# skipped, exit 0), BUILD/l3d and PY with numpy (else exit 1).
llamacpp_setup() {
  BENCH_NAME=$1
  skip() { echo "$BENCH_NAME: skipped: $*"; exit 0; }
  die() { echo "$BENCH_NAME: $*" >&2; exit 1; }
  [ -n "$LLAMA" ] || skip "no llama.cpp checkout given (usage: bash bench/$BENCH_NAME.sh LLAMA_CPP_DIR [BUILD_DIR])"
  [ -d "$LLAMA/gguf-py/gguf" ] || skip "$LLAMA is not a llama.cpp checkout (no gguf-py/gguf in it)"
  LLAMA_TOOL=$LLAMA/build/bin/$2
  [ -x "$LLAMA_TOOL" ] || skip "llama.cpp is not built: no $LLAMA_TOOL (see --help for the build command)"
  [ -x "$BUILD/l3d" ] || die "no $BUILD/l3d: build llama3d first"
  "$PY" -c 'import numpy' 2>/dev/null || die "$PY has no numpy"
}

# llamacpp_weights NAME CFG OUT [--tokenizer-json F]: `l3d train --steps 0 --save OUT/ck` writes
# random weights of config CFG (empty: a 58.7M-parameter Llama 3 shape, vocabulary 128256,
# hidden 384, 6 layers, tied) in WEIGHTS_DTYPE (f32, the default, or bf16: the checkpoint in
# BF16, the GGUF's matrices in BF16 and its norms in F32, as convert_hf_to_gguf.py --outtype
# bf16 writes), then bench/gguf_from_hf.py writes OUT/model.gguf with the llama.cpp checkout's
# gguf-py (and the vocabulary of tokenizer.json F when given).
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
  local dt=${WEIGHTS_DTYPE:-f32}
  case $dt in f32) printf '{}' ;; bf16) printf '{"train": {"save_dtype": "bfloat16"}}' ;;
    *) die "WEIGHTS_DTYPE: '$dt' is not f32 or bf16" ;; esac >"$out/save.json"
  echo "$name: writing the weights ($cfg, $dt)" >&2
  "$L3D" train --config "$out/save.json" --model "$cfg" --steps 0 --save "$out/ck" >"$out/train.log" 2>&1 ||
    { tail -3 "$out/train.log" >&2; die "l3d train --steps 0 --save failed"; }
  rm -f "$out"/ck/optimizer*.safetensors "$out"/ck/master.safetensors  # the weights only
  echo "$name: converting to GGUF ${dt^^} with $LLAMA/gguf-py" >&2
  "$PY" "$HERE/gguf_from_hf.py" "$out/ck" "$out/model.gguf" --gguf-py "$LLAMA/gguf-py" \
    --outtype "$dt" "$@" >&2 ||
    die "the GGUF conversion failed"
}
