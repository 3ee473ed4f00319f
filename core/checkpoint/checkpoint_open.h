// Opening a model part for parallel inference from a checkpoint directory: the checkpoint code
// reads the files, core/model/infer_parallel.c runs the layout (it sits below, in the model). The
// single-rank forms, l3d_model_open and l3d_model_load, are public (include/llama3d/model.h).
// defines: l3d_infer_open
#ifndef L3D_CHECKPOINT_OPEN_H
#define L3D_CHECKPOINT_OPEN_H

#include "core/model/infer_parallel.h"

// Collective over `world`: checkpoint `dir`'s config.json, checked against its files first (as
// l3d_model_open does), then l3d_infer_create_seqs with it (n_seq sequences of `capacity`
// positions) and this rank's slices of the weights, kept in `weights`: an l3d_dtype (float32,
// or bfloat16 / float16 with no float32 copy), or -1 for the checkpoint's own (bfloat16 when
// every tensor is BF16, else float32).
l3d_status l3d_infer_open(l3d_ctx_t *ctx, l3d_comm_t *world, int tp, int pp, l3d_device_t *dev,
                          const char *dir, int n_seq, int capacity, int weights,
                          l3d_infer_t **inf_p);

#endif
