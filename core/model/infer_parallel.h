// Inference on a tensor- and pipeline-parallel layout: each rank holds its part of the model
// (its tp slice of its pipeline stage's layers) and of the KV
// cache; a decode runs the stages in turn and gives every rank the same full logits, so every
// rank samples the same token from the same seed and no token is sent.
// defines: l3d_infer_t, l3d_infer_create, l3d_infer_create_seqs, l3d_infer_decode,
//          l3d_infer_decode_seq, l3d_infer_decode_batch, l3d_infer_decode_spans,
//          l3d_infer_truncate, l3d_infer_destroy,
//          l3d_infer_config, l3d_infer_model, l3d_infer_round_products
#ifndef L3D_INFER_PARALLEL_H
#define L3D_INFER_PARALLEL_H

#include "llama3d/comm.h"
#include "llama3d/config.h"
#include "llama3d/device.h"
#include "llama3d/model.h"

typedef struct l3d_infer l3d_infer_t;

// Collective over `world` (NULL: a single rank; then tp = pp = 1): the mesh (dp 1, Megatron's
// tp-fastest order), this rank's model part of `cfg` (weights not yet read: the caller loads
// them into l3d_infer_model, as l3d_infer_open of core/checkpoint/checkpoint_open.h does from a
// checkpoint), and a KV cache of `capacity` positions. `dev` must outlive it.
l3d_status l3d_infer_create(l3d_ctx_t *ctx, l3d_comm_t *world, int tp, int pp, l3d_device_t *dev,
                            const l3d_model_config_t *cfg, int capacity, l3d_infer_t **inf_p);
void l3d_infer_destroy(l3d_infer_t *inf);
const l3d_model_config_t *l3d_infer_config(const l3d_infer_t *inf);
l3d_model_t *l3d_infer_model(l3d_infer_t *inf);
int l3d_infer_len(const l3d_infer_t *inf);  // positions in the cache
// Appends tokens[0..n) (the same on every rank) and writes the logits of the last one
// (vocab_size floats, host) on every rank. Collective over the world. Beyond the capacity:
// L3D_ERR_INVALID_ARG.
l3d_status l3d_infer_decode(l3d_infer_t *inf, const int32_t *tokens, int n, float *logits);
// The same over n_seq sequences of `capacity` positions each (the serving engine's slots):
// decode_seq appends to sequence `seq` as l3d_infer_decode does to sequence 0; decode_batch
// appends tokens[i] to seqs[i] (distinct) and writes row i of logits (n, vocab_size) on every
// rank, as l3d_model_decode_batch does on one; truncate keeps a sequence's first `keep`
// positions. Each is collective over the world, with the same arguments on every rank.
// `weights`: float32, or bfloat16 / float16 for a model holding only 16-bit weights (half the
// memory; inference reads them as stored, computing in float32).
l3d_status l3d_infer_create_seqs(l3d_ctx_t *ctx, l3d_comm_t *world, int tp, int pp,
                                 l3d_device_t *dev, const l3d_model_config_t *cfg, int n_seq,
                                 int capacity, l3d_dtype weights, l3d_infer_t **inf_p);
// On a model holding bfloat16 weights alone: its weight products round the float32
// activations to bfloat16 and run in the CPU's 16-bit arithmetic where it has some (gemm's
// round_a): a bfloat16 model's precision in torch and vLLM, and llama.cpp's. Off (the
// default), the logits are the float32 model's bit for bit. L3D_ERR_INVALID_ARG on any other
// model.
l3d_status l3d_infer_round_products(l3d_infer_t *inf, int on);
l3d_status l3d_infer_decode_seq(l3d_infer_t *inf, int seq, const int32_t *tokens, int n,
                                float *logits);
l3d_status l3d_infer_decode_batch(l3d_infer_t *inf, const int *seqs, const int32_t *tokens,
                                  int n, float *logits);
// Spans of several sequences in one set of passes, as l3d_model_decode_spans on one rank:
// the logits of each span asking for them, in span order, on every rank.
l3d_status l3d_infer_decode_spans(l3d_infer_t *inf, const l3d_decode_span_t *spans, int n_spans,
                                  const int32_t *tokens, float *logits);
l3d_status l3d_infer_truncate(l3d_infer_t *inf, int seq, int keep);

#endif
