// Sharded ("distributed") checkpoints: every rank of a parallel run writes its own part of the
// model and optimizer state in parallel, into one directory, and any layout (or a single-rank
// model) reads back what it needs. docs/checkpoints.md describes the format.
//
//   DIR/shards.json                 {"format": "llama3d-sharded-1", "world": W, "files": [..]}
//   DIR/shard-RRRRR-of-WWWWW.safetensors   world rank R's part
//   DIR/config.json, DIR/trainer_state.json (world rank 0)
//
// What a rank writes: its (tp, pp) place's parameter arena is split between the dp ranks
// along the ZeRO pieces (l3d_dp_piece; unsharded runs split it into dp equal ranges), so each
// element of the model is written exactly once. Each piece's part of a tensor is a flat range
// of the tensor's local shard, written as at most three rectangles (a partial first row, whole
// rows, a partial last row) named "<tensor><suffix>@R,C": R, C the rectangle's top-left in the
// FULL tensor's coordinates (1-D tensors: R = 0), suffix "" (parameters), ".exp_avg" and
// ".exp_avg_sq". A tensor held by several ranks (the norms on every tp rank, replicated kv
// heads, the last stage's copy of a tied embedding) is written by its first holder only.
// A reader fills each of its tensors from every rectangle of the same name that overlaps it,
// and checks that every element was found.
#ifndef L3D_CHECKPOINT_DIST_H
#define L3D_CHECKPOINT_DIST_H

#include "core/config/config_model_dir.h"
#include "core/model/model_internal.h"

#define L3D_CKPT_DIST_FORMAT "llama3d-sharded-1"

// What a sharded save writes of one rank, handed over by the run that saves
// (core/train/trainer_ckpt.c): the checkpoint code knows the files, the trainer how dp and ZeRO
// partition its state. Piece k of `pieces` is parameter floats [lo, hi) of model's arena,
// whose optimizer moments start at float sh of exp_avg and exp_avg_sq.
typedef struct l3d_ckpt_dist_src {
    l3d_ctx_t *ctx;
    l3d_model_t *model;                 // this rank's tp/pp part; the weights: model->params
    l3d_comm_t *world;                  // the save is collective over it
    const float *exp_avg, *exp_avg_sq;  // device arrays of optim_len floats
    size_t optim_len;
    int pieces;
    void (*piece)(const void *arg, int k, size_t *lo, size_t *hi, size_t *sh);
    // trainer_state.json into the temporary directory (called on world rank 0 only).
    l3d_status (*write_state)(const void *arg, const char *tmpdir);
    const void *arg;  // passed to piece and write_state
    int dp_rank;      // named in the shard's metadata
} l3d_ckpt_dist_src_t;

// Collective over src->world: writes the sharded checkpoint to dir, published atomically (a
// temporary directory that world rank 0 names and renames; an agreement after the writes, so
// a failure on any rank fails all and keeps an older dir).
l3d_status l3d_ckpt_dist_save(const l3d_ckpt_dist_src_t *src, const char *dir);
// Fills, in m's own layout (any tp/pp part, or a whole model), the arrays given (device
// arenas of m->n_params floats; NULL: skip): parameters, exp_avg, exp_avg_sq. Not collective.
l3d_status l3d_ckpt_dist_read(l3d_model_t *m, const char *dir, float *params, float *exp_avg,
                              float *exp_avg_sq);

// Shared with core/checkpoint/checkpoint.c: config.json of m into dir.
l3d_status l3d_ckpt_write_config(l3d_model_t *m, const char *dir);

#endif
