// The Llama 3 model: parameters on a device, forward, backward, inference with a KV cache.
// defines: l3d_model_t, l3d_model_create/destroy, l3d_model_init_weights, l3d_model_logits
#ifndef LLAMA3D_MODEL_H
#define LLAMA3D_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/config.h"
#include "llama3d/ctx.h"
#include "llama3d/device.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct l3d_model l3d_model_t;

// Creates a model with uninitialised parameters on `dev` (see l3d_model_init_weights or
// l3d_model_load). The model keeps pointers to ctx and dev; both must outlive it.
l3d_status l3d_model_create(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                            l3d_model_t **model_p);
void l3d_model_destroy(l3d_model_t *model);
const l3d_model_config_t *l3d_model_config(const l3d_model_t *model);

// Deterministic initialisation from `seed`: matrices N(0, initializer_range), norms 1.
// Each element's value depends only on (seed, tensor name, element index), so every
// parallel layout initialises its shard identically.
l3d_status l3d_model_init_weights(l3d_model_t *model, uint64_t seed);

// Loads a Hugging Face layout directory (config.json + model.safetensors) into the model;
// shapes must match the model's config (error names the tensor). Saves the same layout,
// atomically (a crash leaves the previous directory whole).
l3d_status l3d_model_load(l3d_model_t *model, const char *dir);
l3d_status l3d_model_save(l3d_model_t *model, const char *dir);
// Whether a save to `dir` would be refused, checked without writing anything (call it before
// hours of training). Every save (l3d_model_save, l3d_trainer_save) replaces only a missing
// or empty directory or one llama3d wrote (every entry a checkpoint file: config.json,
// *.safetensors of a checkpoint, trainer_state.json, shards.json), follows a symlink to its
// target, and refuses anything else with L3D_ERR_CONFIG naming the path and the foreign
// entry (docs/checkpoints.md).
l3d_status l3d_checkpoint_check_target(l3d_ctx_t *ctx, const char *dir);
// What the model's weights came from, for a start-up line: "bf16, 2 shards", "f32, 1 file",
// "f32, llama3d sharded checkpoint", or "new" when they were initialised here. Writes at most
// cap bytes (NUL included) and returns buf.
const char *l3d_model_weights_desc(const l3d_model_t *model, char *buf, size_t cap);
// Creates a model from a checkpoint directory's config.json and loads its weights.
l3d_status l3d_model_open(l3d_ctx_t *ctx, l3d_device_t *dev, const char *dir,
                          l3d_model_t **model_p);

// Forward over one sequence tokens[0..n) at positions 0..n-1; writes float32 logits (n, V)
// row-major to host memory `logits`.
l3d_status l3d_model_logits(l3d_model_t *model, const int32_t *tokens, int n, float *logits);

// ---- KV-cached inference ----------------------------------------------------------------
// Serving needs only a device, the model and a cache: memory is the weights plus
// 2 x n_seq x layers x capacity x kv_heads x head_dim floats plus a bounded scratch (no
// gradients, optimizer state or training activations). Every call on one cache must come
// from one thread at a time. Misuse (NULL, a cache of another model, a sequence out of range,
// positions past the capacity, a token outside the vocabulary) is L3D_ERR_INVALID_ARG.
typedef struct l3d_kv_cache l3d_kv_cache_t;
#define L3D_KV_MAX_SEQS 4096
// A cache for one sequence of up to `capacity` positions (<= max_position_embeddings).
l3d_status l3d_kv_cache_create(l3d_model_t *model, int capacity, l3d_kv_cache_t **cache_p);
// A cache for n_seq sequences (1 .. L3D_KV_MAX_SEQS) of up to `capacity` positions each.
l3d_status l3d_kv_cache_create_seqs(l3d_model_t *model, int n_seq, int capacity,
                                    l3d_kv_cache_t **cache_p);
void l3d_kv_cache_destroy(l3d_kv_cache_t *cache);
int l3d_kv_cache_len(const l3d_kv_cache_t *cache);               // sequence 0's positions
int l3d_kv_cache_seq_len(const l3d_kv_cache_t *cache, int seq);  // 0 out of range
// Keeps the first `keep` positions of sequence `seq` (0: a new conversation in its slot; a
// shorter prefix: re-decode from where a new prompt differs from what the cache holds).
l3d_status l3d_kv_cache_seq_truncate(l3d_kv_cache_t *cache, int seq, int keep);
// Appends tokens[0..n) to sequence 0 (l3d_model_decode) or `seq` and writes the logits of the
// LAST of them (vocab_size floats, host memory): a prompt in as few passes as the scratch
// allows, or one generated token.
l3d_status l3d_model_decode(l3d_model_t *model, l3d_kv_cache_t *cache, const int32_t *tokens,
                            int n, float *last_logits);
l3d_status l3d_model_decode_seq(l3d_model_t *model, l3d_kv_cache_t *cache, int seq,
                                const int32_t *tokens, int n, float *last_logits);
// Batched decode: appends tokens[i] to sequence seqs[i] for i < n (distinct sequences, each
// at its own position) in one pass, and writes logits (n, vocab_size) row i for seqs[i]. The
// weight GEMMs run once for all n rows; each row's logits equal what l3d_model_decode_seq of
// that token alone gives, up to float32 rounding of the batched GEMMs.
l3d_status l3d_model_decode_batch(l3d_model_t *model, l3d_kv_cache_t *cache, const int *seqs,
                                  const int32_t *tokens, int n, float *logits);
// Mixed decode (llama.cpp's batch of several sequences, vLLM's chunked prefill): span j
// appends its n tokens to sequence seq (distinct sequences; tokens laid out span after span)
// in as few passes as the scratch allows, the weight GEMMs over every span's rows at once and
// attention per span at its own positions. A span with `logits` set writes the logits of its
// last token as the next row of `logits` (rows in span order, vocab_size floats each, host).
// So a step feeds prompt chunks and generated tokens together and reads each weight once.
// Each row equals what l3d_model_decode_seq of that span alone gives, up to float32 rounding
// of the batched GEMMs (l3d_model_decode_batch's bound).
typedef struct l3d_decode_span {
    int seq, n, logits;
} l3d_decode_span_t;
l3d_status l3d_model_decode_spans(l3d_model_t *model, l3d_kv_cache_t *cache,
                                  const l3d_decode_span_t *spans, int n_spans,
                                  const int32_t *tokens, float *logits);

// Sampling (l3d_sampler_*) is include/llama3d/sampler.h.

#ifdef __cplusplus
}
#endif
#endif
