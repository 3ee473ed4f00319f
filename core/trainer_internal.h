// The trainer's state, shared by core/trainer.c and core/checkpoint.c.
#ifndef L3D_TRAINER_INTERNAL_H
#define L3D_TRAINER_INTERNAL_H

#include "core/data.h"
#include "core/model_internal.h"
#include "llama3d/train.h"

struct l3d_trainer {
    l3d_ctx_t *ctx;
    l3d_train_config_t cfg;
    l3d_device_t *dev;
    l3d_model_t *model;
    l3d_tokenizer_t *tok;
    l3d_dataset_t *data;
    float *grads, *adam_m, *adam_v;  // arenas with the parameters' layout
    l3d_acts_t *acts;
    int32_t *h_tokens, *h_targets;  // (micro, T) host staging
    int step;                       // optimizer steps done
    double gemm_peak;               // GFLOP/s
    double flops_per_token;
};

// torch.nn.utils.clip_grad_norm_: the factor applied to every gradient for a global norm
// `norm` and limit `max_norm` (<= 0: no clipping): max_norm / (norm + 1e-6) when below 1.
float l3d_clip_scale(double norm, float max_norm);

#endif
