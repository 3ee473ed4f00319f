// Training: a trainer owns the device, model, data, gradients and optimizer state of a run.
// defines: l3d_trainer_t, l3d_step_stats_t, l3d_mem_breakdown_t, l3d_trainer_*
#ifndef LLAMA3D_TRAIN_H
#define LLAMA3D_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/comm.h"
#include "llama3d/config.h"
#include "llama3d/ctx.h"
#include "llama3d/model.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct l3d_trainer l3d_trainer_t;

typedef struct l3d_step_stats {
    int step;             // optimizer steps done, 1-based after the step
    double loss;          // mean cross-entropy over the global batch (before the update)
    float lr;             // learning rate used by this update
    double grad_norm;     // global L2 norm of the gradients before clipping
    double step_time_s;
    double tokens_per_s;
    double mfu;           // model FLOP/s over the measured GEMM peak of this device
    size_t mem_peak;      // peak bytes allocated through the context so far
    // communication of this rank during the step, per group [0] tp, [1] dp, [2] pp: calls and
    // bytes as l3d_comm_get_stats counts them (docs/parallel.md has the formulas)
    uint64_t comm_calls[3], comm_bytes[3];
} l3d_step_stats_t;

typedef struct l3d_mem_breakdown {
    size_t params, grads, optim, acts;  // bytes, as allocated
} l3d_mem_breakdown_t;

// Builds everything the configuration asks for (device, model initialised from cfg->seed,
// data, optimizer state). cfg is copied.
l3d_status l3d_trainer_create(l3d_ctx_t *ctx, const l3d_train_config_t *cfg,
                              l3d_trainer_t **trainer_p);
// One rank of a parallel run. `world` is a communicator of exactly dp * tp * pp ranks
// (cfg->dp/tp/pp; otherwise L3D_ERR_CONFIG showing the product and the world size), or NULL
// for a single rank (l3d_trainer_create). Collective over world: every rank calls it with the
// same cfg; steps, save and resume are collective too. The trainer borrows world (destroy
// the trainer first). Any dp x tp x pp layout; it makes the checks of
// l3d_train_config_finalize first (the batch identity, tp against the heads, pp against the
// layers, the schedule, the device), so a caller may skip finalize. The world may be
// l3d_comm_create_local's threads (as `l3d train` without a launcher) or processes.
l3d_status l3d_trainer_create_parallel(l3d_ctx_t *ctx, const l3d_train_config_t *cfg,
                                       l3d_comm_t *world, l3d_trainer_t **trainer_p);
void l3d_trainer_destroy(l3d_trainer_t *t);

// One optimizer step: gradient_accumulation_steps micro-batches, clipping, AdamW.
l3d_status l3d_trainer_step(l3d_trainer_t *t, l3d_step_stats_t *stats);
int l3d_trainer_steps_done(const l3d_trainer_t *t);

// Saves model (Hugging Face layout), optimizer state and trainer state into `dir`,
// atomically replacing it. Resume loads all three and continues bit-identically.
l3d_status l3d_trainer_save(l3d_trainer_t *t, const char *dir);
l3d_status l3d_trainer_resume(l3d_trainer_t *t, const char *dir);

l3d_model_t *l3d_trainer_model(l3d_trainer_t *t);
// The memory a trainer for `cfg` allocates, computed without allocating (for any preset,
// however large). Equals l3d_trainer_memory of a trainer created from the same config.
void l3d_train_config_memory(const l3d_train_config_t *cfg, l3d_mem_breakdown_t *mem);
void l3d_trainer_memory(const l3d_trainer_t *t, l3d_mem_breakdown_t *mem);
// The communication one step of `cfg` costs world rank 0, per group ([0] tp, [1] dp, [2] pp),
// from the analytic formulas of docs/parallel.md: equal to what l3d_trainer_step counts.
void l3d_train_config_comm(const l3d_train_config_t *cfg, l3d_comm_stats_t plan[3]);
// The sgemm peak measured at creation, GFLOP/s, and the model FLOPs per trained token.
double l3d_trainer_gemm_peak(const l3d_trainer_t *t);
double l3d_trainer_flops_per_token(const l3d_trainer_t *t);
int64_t l3d_trainer_data_tokens(const l3d_trainer_t *t);

#ifdef __cplusplus
}
#endif
#endif
