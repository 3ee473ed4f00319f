// Which layouts a model admits: the tensor-parallel preconditions on the model's shapes.
// The layout checks (core/config/config_layout.c) refuse a config by them before anything is built,
// and the model (core/model/model.c) asserts them again when it is cut, so the rule lives here,
// below both. defines: l3d_tp_check, l3d_tp2d_check, l3d_tp3d_check
#ifndef L3D_CONFIG_LAYOUT_H
#define L3D_CONFIG_LAYOUT_H

#include "llama3d/config.h"
#include "llama3d/ctx.h"
#include "llama3d/status.h"

// Tensor parallelism preconditions: heads, key/value heads (or tp by them) and ffn divide by
// tp, vocabulary >= tp. L3D_ERR_CONFIG naming the dimension otherwise.
l3d_status l3d_tp_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, int tp);
// Tensor parallelism "2d" preconditions on a q x q grid: q divides hidden, heads, key/value
// heads, ffn and vocabulary; untied embeddings; L3D_ERR_CONFIG naming what does not.
l3d_status l3d_tp2d_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, int q);
// Tensor parallelism "3d" preconditions on a q-cube: q divides the heads and key/value heads;
// q^2 divides hidden, ffn, vocabulary and the q/k/v widths; untied embeddings; L3D_ERR_CONFIG
// naming what does not.
l3d_status l3d_tp3d_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, int q);

#endif
