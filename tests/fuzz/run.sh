#!/usr/bin/env bash
# Runs every libFuzzer target of a -DL3D_BUILD_FUZZ=ON build for SECONDS each, starting from
# a small seed corpus written here (no binary blobs in the repository). Exits non-zero on any
# crash, sanitizer report, leak or timeout; the input that did it is left under
# BUILD_DIR/fuzz-work/<target>-crash-* (reproduce: BUILD_DIR/tests/fuzz/<target> FILE).
#   usage: tests/fuzz/run.sh BUILD_DIR SECONDS
# FUZZ_SEED (default 1) seeds libFuzzer's mutations: with a fixed seed a run explores the same
# inputs every time, so CI's verdict on a commit does not depend on luck (the machine's speed
# still decides how far it gets). For a search of new ground, FUZZ_SEED=0 (a random seed each
# run) and long SECONDS.
set -euo pipefail
export LC_ALL=C  # ${#s} must count bytes

build=${1:?usage: run.sh BUILD_DIR SECONDS}
secs=${2:?usage: run.sh BUILD_DIR SECONDS}
bin=$build/tests/fuzz
work=$build/fuzz-work
for t in fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_serve fuzz_store; do
    if [[ ! -x $bin/$t ]]; then
        echo "run.sh: $bin/$t missing (configure with -DL3D_BUILD_FUZZ=ON)" >&2
        exit 2
    fi
done
rm -rf "$work/seeds-"*
mkdir -p "$work/seeds-fuzz_safetensors" "$work/seeds-fuzz_config" \
    "$work/corpus-fuzz_safetensors" "$work/corpus-fuzz_config" \
    "$work/seeds-fuzz_tokenizer" "$work/corpus-fuzz_tokenizer" \
    "$work/seeds-fuzz_serve" "$work/corpus-fuzz_serve" \
    "$work/seeds-fuzz_store" "$work/corpus-fuzz_store"

# ---- safetensors seeds: 8-byte LE header length, the header, NBYTES data bytes ----------
le() {  # BYTES N: N little-endian in BYTES bytes
    local n=$2 i
    for ((i = 0; i < $1; i++)); do
        printf "\\$(printf '%03o' $((n & 255)))"
        n=$((n >> 8))
    done
}
st_seed() {  # FILE HEADER NBYTES
    { le 8 "${#2}"; printf '%s' "$2"; head -c "$3" /dev/zero | tr '\000' '\074'; } >"$1"
}
s=$work/seeds-fuzz_safetensors
st_seed "$s/f32" '{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}' 16
st_seed "$s/empty" '{}      ' 0
st_seed "$s/meta" '{"__metadata__":{"format":"pt"},'\
'"w":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},'\
'"b":{"dtype":"BF16","shape":[1,1],"data_offsets":[6,8]}}' 8
st_seed "$s/mixed" '{"z":{"dtype":"F64","shape":[],"data_offsets":[4,12]},'\
'"i":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},'\
'"e":{"dtype":"BOOL","shape":[0,7],"data_offsets":[12,12]}}' 12
dict=$work/safetensors.dict
printf '%s\n' '"dtype"' '"shape"' '"data_offsets"' '"__metadata__"' '"F32"' '"F16"' \
    '"BF16"' '"F64"' '"I32"' '"I64"' '"U8"' '"BOOL"' '"{"' '"}"' '"["' '"]"' '":"' '","' >"$dict"

# ---- config seeds: a DeepSpeed ds_config.json and a Hugging Face config.json -------------
c=$work/seeds-fuzz_config
cat >"$c/ds_config.json" <<'JSON'
{
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 1.0,
  "steps_per_print": 10,
  "optimizer": {"type": "AdamW",
                "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 10,
                           "total_num_steps": 100}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 1, "overlap_comm": true, "reduce_bucket_size": 5e8},
  "model": "llama3-tiny",
  "data": {"seq_len": 64},
  "train": {"steps": 100, "seed": 7, "save_interval": 50},
  "parallel": {"dp": 1, "tp": 1, "pp": 1}
}
JSON
cat >"$c/hf_config.json" <<'JSON'
{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
  "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "attention_bias": false, "mlp_bias": false,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": true, "bos_token_id": 128000, "eos_token_id": 128001,
  "initializer_range": 0.02, "torch_dtype": "bfloat16"
}
JSON
printf '{}' >"$c/empty.json"

# ---- tokenizer seeds: mode byte + tokenizer.json / tokenizer.model / text ----------------
k=$work/seeds-fuzz_tokenizer
{
    printf '\100'
    for b in $(seq 0 255); do
        printf "%s %d\n" "$(printf "\\$(printf '%03o' "$b")" | base64)" "$b"
    done
    printf 'YWI= 256\n'
} >"$k/model"
printf '\000{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"],"ignore_merges":true},'\
'"added_tokens":[{"id":2,"content":"<|x|>","special":true}],"pre_tokenizer":{"type":'\
'"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\\\s+|\\\\S+"},'\
'"behavior":"Isolated"},{"type":"ByteLevel","use_regex":false}]},"decoder":{"type":"ByteLevel"}}' \
    >"$k/json"
printf '\200abc abab  a\n\xff\xfe caf\xc3\xa9 \xe4\xb8\x96 1234567 <|eot_id|>' >"$k/text"

# ---- serve seeds: route byte (fuzz_serve.c: 0 chat, 1 completions, 2 tokenize, 3 detokenize,
# 4 models, 5 metrics; +8 cancels after two steps) + body ----------------------------------
v=$work/seeds-fuzz_serve
printf '\000{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0}' >"$v/chat"
printf '\001{"prompt":"ab","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},'\
'"logprobs":2,"stop":["a","b c"],"seed":3}' >"$v/completions"
printf '\002{"content":"abc <|eot_id|>","add_special":true,"parse_special":false}' >"$v/tokenize"
printf '\003{"tokens":[97,98,256]}' >"$v/detokenize"
printf '\010{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":'\
'"text","text":"x"}]}],"stream":true,"logprobs":true,"top_logprobs":3,"top_k":5}' >"$v/cancel"
printf '\011{"prompt":[1,2,300],"max_completion_tokens":2,"presence_penalty":1.5,'\
'"frequency_penalty":-1,"repeat_penalty":1.1,"min_p":0.1,"top_p":0.9,"model":"fuzz"}' >"$v/ids"
# (CI of 524a859: jansson's error text cut inside a character made the 400's body unwritable)
printf '\002{"content":"\\u0\311\2540"}' >"$v/bad-escape"
printf '\004' >"$v/models"
printf '\005' >"$v/metrics"
sdict=$work/serve.dict
printf '%s\n' '"messages"' '"role"' '"content"' '"user"' '"system"' '"assistant"' \
    '"developer"' '"prompt"' '"max_tokens"' '"stream"' '"stream_options"' '"include_usage"' \
    '"stop"' '"logprobs"' '"top_logprobs"' '"temperature"' '"seed"' '"model"' '"type"' \
    '"text"' '"tokens"' '"ignore_eos"' '"n"' '"<|eot_id|>"' '"\\u0000"' '"\\ud800"' >"$sdict"

# ---- store seeds: mode byte (fuzz_store.c: 1 = the harness says HELLO first) + messages of
# the rendezvous protocol (core/comm/bootstrap_wire.h) -----------------------------------
bsmsg() {  # TYPE PAYLOAD_FILE: one message
    printf 'L3DB'; le 2 1; le 2 "$1"; le 4 "$(wc -c <"$2")"; cat "$2"
}
p=$work/payload
hello_to() {  # RANK SIZE TOKEN
    { le 4 "$1"; le 4 "$2"; le 2 ${#3}; printf '%s' "$3"; } >"$p"; bsmsg 1 "$p"
}
key_to() {  # KEY [VALUE]
    { le 2 ${#1}; printf '%s' "$1" "${2:-}"; } >"$p"
}
o=$work/seeds-fuzz_store
world=$((1 << 23))
{ printf '\000'; hello_to 7 $world fuzz-job; } >"$o/hello"
{ printf '\000'; hello_to 5 $world xyz; } >"$o/token"
{ printf '\000'; hello_to 6 4 fuzz-job; } >"$o/size"
{ printf '\001'; key_to k1 value; bsmsg 3 "$p"; key_to k1; bsmsg 4 "$p"; } >"$o/put-get"
{ printf '\001'; key_to never; bsmsg 4 "$p"; } >"$o/pending"
{ printf '\001'; key_to a; bsmsg 4 "$p"; key_to b; bsmsg 4 "$p"; } >"$o/two-gets"
{ printf '\001'; : >"$p"; bsmsg 6 "$p"; } >"$o/bye"
{ printf '\001'; printf 'L3DB'; le 2 1; le 2 3; le 4 300000; printf 'ab'; } >"$o/short"
printf '\000GET / HTTP/1.1\r\nHost: x\r\n\r\n' >"$o/http"
rm -f "$p"

# ---- run ---------------------------------------------------------------------------------
status=0
# The targets run at once (libFuzzer runs one thread: a machine's cores each take one), each for
# SECONDS; then each reports, in order.
targets=(fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_serve fuzz_store)
pids=()
for t in "${targets[@]}"; do
    extra=()
    [[ $t == fuzz_safetensors ]] && extra=(-dict="$dict")
    [[ $t == fuzz_serve ]] && extra=(-dict="$sdict")
    "$bin/$t" -seed="${FUZZ_SEED:-1}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -max_len=8192 -print_final_stats=1 -artifact_prefix="$work/$t-" "${extra[@]}" \
        "$work/corpus-$t" "$work/seeds-$t" 2>"$work/$t.log" &
    pids+=($!)
done
for i in "${!targets[@]}"; do
    t=${targets[$i]}
    echo "== $t for ${secs}s"
    if ! wait "${pids[$i]}"; then
        echo "== $t FAILED (log: $work/$t.log)"
        tail -n 40 "$work/$t.log"
        status=1
    else
        grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ *DONE)' \
            "$work/$t.log" || true
    fi
done
exit $status
