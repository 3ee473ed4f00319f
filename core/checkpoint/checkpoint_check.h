// Checking a checkpoint against its config.json BEFORE the model is allocated: a config that
// lies (10,000 layers over a 9.6 MB file) must be refused, not allocated and filled until the
// OOM killer ends the process. docs/checkpoints.md ("Validation") states the rules.
// defines: l3d_ckpt_check, l3d_ckpt_check_file_tensors, l3d_ckpt_tensor_name/required/count,
//          l3d_ckpt_dist_check, l3d_ckpt_tensor_of, l3d_ckpt_rect_name_parse,
//          l3d_ckpt_nonfinite, l3d_ckpt_check_layout
#ifndef L3D_CHECKPOINT_CHECK_H
#define L3D_CHECKPOINT_CHECK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/checkpoint/safetensors.h"
#include "llama3d/config.h"

// The whole model's tensor `name` (no suffix): its id in Hugging Face order (embed 0, layer l
// kind k 1 + 9 l + k, model.norm 1 + 9 L, lm_head 2 + 9 L) and its full shape; -1 when the
// model cfg describes has no such tensor (lm_head.weight is reported for tied models too).
int l3d_ckpt_tensor_of(const l3d_model_config_t *cfg, const char *name, int *ndim,
                       int64_t shape[2]);

// The model's tensor ids 0 .. (3 + 9 L) in Hugging Face order: the name of `id` (-1: no such
// id), whether a checkpoint must hold it (all but lm_head of a tied model), how many must be.
int l3d_ckpt_tensor_name(const l3d_model_config_t *cfg, size_t id, char *out, size_t cap);
int l3d_ckpt_tensor_required(const l3d_model_config_t *cfg, size_t id);
size_t l3d_ckpt_tensor_count(const l3d_model_config_t *cfg);

// Every tensor of one Hugging Face safetensors file is one cfg implies (name + suffix), with
// its shape and a float dtype. `cfg_origin` (the config.json) is named in the errors:
// L3D_ERR_FORMAT naming the file and the first foreign or mismatched tensor. Whether all the
// model's tensors are present is l3d_hf_set_check's business (core/checkpoint/checkpoint_hf.h).
l3d_status l3d_ckpt_check_file_tensors(l3d_ctx_t *ctx, const l3d_model_config_t *cfg,
                                       const char *cfg_origin, const l3d_st_file_t *f,
                                       const char *path, const char *suffix);

// A sharded checkpoint's shards.json, trainer_state.json layout and shard indexes: every
// entry names a tensor of the model, lies inside it, and the entries of each tensor cover it
// exactly once (parameters always; the optimizer moments when `optim` or when present).
l3d_status l3d_ckpt_dist_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg,
                               const char *cfg_origin, const char *dir, int optim);

// Either layout: everything that can be checked without allocating the model.
l3d_status l3d_ckpt_check(l3d_ctx_t *ctx, const char *dir, const l3d_model_config_t *cfg,
                          int optim);

// "<base><suffix>@R,C" -> base (cap bytes), suffix index (0 "", 1 ".exp_avg", 2
// ".exp_avg_sq"), R and C: plain decimals below 10^15, no sign. -1 when malformed.
int l3d_ckpt_rect_name_parse(const char *ename, char *base, size_t cap, int *suffix, int64_t *R,
                             int64_t *C);
extern const char *const l3d_ckpt_suffix[3];

// Index of the first NaN or infinity in x[0..n), or n when all are finite.
size_t l3d_ckpt_nonfinite(const float *x, size_t n);
// "nan", "inf" or "-inf".
const char *l3d_ckpt_nonfinite_name(float v);

// trainer_state.json's "layout": {dp, tp, pp, virtual_stages} positive integers; `world` > 0
// must equal dp x tp x pp. `path` is named in the errors.
l3d_status l3d_ckpt_check_layout(l3d_ctx_t *ctx, const char *path, json_t *state, int world);

#endif
