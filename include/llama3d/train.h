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
    double mfu;           // model FLOP/s per rank over peak_flops (0: no roof known)
    double peak_flops;    // the roof of one rank, FLOP/s: train.peak_flops, raised to what
                          // the run achieved whenever it beat it (never an MFU above 1)
    int peak_raised;      // this step beat the roof and raised it
    double eval_loss;     // mean cross-entropy over the eval batches after this step's update
                          // (l3d_trainer_eval), on the steps that evaluate; NaN on the others
    double eval_time_s;   // the evaluation's time (not part of step_time_s); 0 when none
    size_t mem_peak;      // peak bytes allocated through the context so far
    // communication of this rank during the step, per group [0] tp, [1] dp, [2] pp: calls and
    // bytes as l3d_comm_get_stats counts them (docs/parallel.md has the formulas)
    uint64_t comm_calls[3], comm_bytes[3];
    // fp16 loss scaling (1, 0, 0 otherwise): the scale this step's backward used; whether the
    // step was skipped for an overflow (no update, no LR-schedule step); skips so far
    double loss_scale;
    int skipped;
    long long skipped_total;
} l3d_step_stats_t;

typedef struct l3d_mem_breakdown {
    size_t params, grads, optim, acts;  // bytes of device memory, as allocated
    // bytes of host memory for ZeRO offload (zero without it): the master or parameter pieces,
    // the gradient pieces the host's optimizer reads, its exp_avg and exp_avg_sq; and the
    // activation checkpoints with activation_checkpointing.cpu_checkpointing
    size_t host_params, host_grads, host_optim, host_acts;
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
// Evaluation: the mean cross-entropy over train.eval_iters global batches of the eval stream
// (data.eval_path, or the tail data.eval_fraction holds out), forward only: no gradient, the
// model and optimizer untouched. Collective; the same on every rank (core/train/trainer_eval.c has
// the batches). l3d_trainer_step calls it after the update on every train.eval_interval-th
// step and on the last (train.steps) when eval_interval > 0. No eval stream: L3D_ERR_INVALID_ARG.
l3d_status l3d_trainer_eval(l3d_trainer_t *t, double *loss);
int l3d_trainer_has_eval(const l3d_trainer_t *t);

// Saves model (Hugging Face layout), optimizer state and trainer state into `dir`,
// atomically replacing it. Resume loads all three and continues bit-identically.
l3d_status l3d_trainer_save(l3d_trainer_t *t, const char *dir);
l3d_status l3d_trainer_resume(l3d_trainer_t *t, const char *dir);

// The trainer's model (this rank's part). With dp > 1 under ZeRO-3, and under ZeRO-1/2 with
// bf16 or fp16 weights (whose float32 master is sharded as DeepSpeed's is), its float32
// parameters are partitioned between steps: the model's own entry points (save, load,
// logits, KV caches) refuse it with L3D_ERR_INVALID_ARG; l3d_trainer_save gathers and saves
// them.
l3d_model_t *l3d_trainer_model(l3d_trainer_t *t);
// The memory a trainer for `cfg` allocates, computed without allocating (for any preset,
// however large): world rank 0's, or (_stage) the first rank of pipeline stage `stage` (its
// tp and dp rank 0, whose figures bound the stage's other ranks). Equals l3d_trainer_memory
// of that rank's trainer created from the same config.
void l3d_train_config_memory(const l3d_train_config_t *cfg, l3d_mem_breakdown_t *mem);
void l3d_train_config_memory_stage(const l3d_train_config_t *cfg, int stage,
                                   l3d_mem_breakdown_t *mem);
// The pipeline stage world rank `rank` holds under cfg's layout and parallel.order. A bad
// order: L3D_ERR_CONFIG naming it.
l3d_status l3d_train_config_rank_stage(l3d_ctx_t *ctx, const l3d_train_config_t *cfg,
                                       int rank, int *stage);
void l3d_trainer_memory(const l3d_trainer_t *t, l3d_mem_breakdown_t *mem);
// The communication one step of `cfg` costs world rank 0, per group ([0] tp, [1] dp, [2] pp),
// from the analytic formulas of docs/parallel.md: equal to what l3d_trainer_step counts.
void l3d_train_config_comm(const l3d_train_config_t *cfg, l3d_comm_stats_t plan[3]);
// The MFU roof of one rank now, GFLOP/s (cfg->peak_flops, raised to what the run achieved if
// it beat it; 0: none given), and the model FLOPs per trained token.
double l3d_trainer_gemm_peak(const l3d_trainer_t *t);
double l3d_trainer_flops_per_token(const l3d_trainer_t *t);
int64_t l3d_trainer_data_tokens(const l3d_trainer_t *t);
// Tokens of the stream training reads (data.eval_fraction holds the rest out), and of the eval
// stream (0: none).
int64_t l3d_trainer_train_tokens(const l3d_trainer_t *t);
int64_t l3d_trainer_eval_tokens(const l3d_trainer_t *t);

// The sgemm peak of `device` with `threads` threads (0: all cores), FLOP/s: square products
// grown until one takes 50 ms (at most 4096), the first run of that size a warm-up, then the
// best of 5. Takes about half a second: callers cache it (l3d train does, per machine).
l3d_status l3d_gemm_peak_measure(l3d_ctx_t *ctx, const char *device, int threads,
                                 double *flops_p);
// The roof `device` states itself for GEMMs in `dt` (bf16 training: its bfloat16 tensor-core
// peak), FLOP/s: a GPU's datasheet table. 0 where the device has none (the CPU devices):
// measure instead (l3d_gemm_peak_measure). Creates the device for the question.
l3d_status l3d_device_peak_table(l3d_ctx_t *ctx, const char *device, l3d_dtype dt,
                                 double *flops_p);
// MFU of a rank that achieved `achieved_flops` FLOP/s against the roof *peak_flops. A run
// that beat its roof proves the roof wrong: *peak_flops is raised to achieved_flops, *raised
// set (may be NULL) and 1 returned. No roof (<= 0) or no work: 0.
double l3d_mfu_update(double achieved_flops, double *peak_flops, int *raised);

#ifdef __cplusplus
}
#endif
#endif
