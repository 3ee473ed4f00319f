// The layout-equivalence harness shared by tests/test_parallel*.c: runs a dp x tp x pp layout
// as threads over the in-process transport, each rank with its own context and trainer, and
// compares it with the single-rank run's float64 trajectory (the tolerance and its derivation
// are above check_run in tests/harness/parallel.c).
#ifndef L3D_TEST_HARNESS_PARALLEL_H
#define L3D_TEST_HARNESS_PARALLEL_H

#include "core/train/trainer_internal.h"
#include "llama3d/llama3d.h"

enum { STEPS = 20, MAXR = 16 };  // (3d: a 2 x 2 x 2 cube times dp or pp 2)

typedef struct layout {
    int dp, tp, pp, zero, recompute, accum_total;
    double bucket;  // reduce_bucket_size (0: default, one bucket)
    float clip;
    int gpipe;      // pipeline schedule: 0 1F1B, 1 GPipe, v >= 2 interleaved with v chunks
    int sp;         // sequence parallelism
} layout_t;

// ZeRO-3's keys for the layouts run while g_z3 is set: stage3_param_persistence_threshold,
// stage3_prefetch_bucket_size (0: DeepSpeed's 5e7, -1: none), stage3_max_live_parameters (0:
// DeepSpeed's 1e9). Unset: persistence 0 (every group gathered), the other two DeepSpeed's.
typedef struct z3_knobs {
    double persist, prefetch, live;
    int gather16;  // stage3_gather_16bit_weights_on_model_save
} z3_knobs_t;
extern const z3_knobs_t *g_z3;
// ZeRO offload for the layouts run while g_off is set: offload_optimizer, offload_param.
typedef struct off_knobs {
    int optim, param;
} off_knobs_t;
extern const off_knobs_t *g_off;
// activation_checkpointing's partition_activations and cpu_checkpointing while g_ckpt is set.
typedef struct ckpt_knobs {
    int partition, cpu;
} ckpt_knobs_t;
extern const ckpt_knobs_t *g_ckpt;
// The knob globals of one side of a resume case (NULL: unset).
typedef struct knobs {
    const z3_knobs_t *z3;
    const off_knobs_t *off;
    int tp_mode;  // g_tp_mode
    int micro;    // g_micro
} knobs_t;

typedef struct result {
    double loss[STEPS], gnorm[STEPS];  // rank 0's per-step loss and gradient norm
    l3d_step_stats_t last;     // rank 0's last step
    l3d_comm_stats_t plan[3];  // and its predicted communication
    // every rank's final parameters (its shard) and their layout
    int nranks;
    float *params[MAXR];
    l3d_param_t *tensors[MAXR];
    int nt[MAXR];
    size_t grads_in_use[MAXR];                   // every rank's "grads" allocations
    size_t params_in_use[MAXR];                  // and "params" (rope tables included)
    int refused[MAXR];  // l3d_model_save of the trainer's model refused (ZeRO-3 partitioned)
    size_t optim_in_use[MAXR], host_in_use[MAXR][3];  // "optim"; "host_params/grads/optim"
    size_t acts_in_use[MAXR], host_acts_in_use[MAXR];  // "acts", "host_acts"
    l3d_mem_breakdown_t mem[MAXR], estimate;     // l3d_trainer_memory; rank 0's prediction
    // the first rank of each pipeline stage (tp and dp rank 0): its stage's prediction
    l3d_mem_breakdown_t stage_estimate[MAXR];
    int has_stage_estimate[MAXR];
    // single-rank references only (reference_run): the float64 trajectory's final weights in
    // params[0]'s layout, losses and gradient norms, and the spread of float32 runs around it
    double *w64, loss64[STEPS], gnorm64[STEPS];
    double sigma[4];  // root-mean-square of the float32 runs' rms, max, loss and gnorm errors
    char err[256];
} result_t;

// Knobs for the layouts run while set (NULL / 0: unset).
extern char g_data[64];
extern const int *g_lps;        // parallel.layers_per_stage (pp x virtual stages entries)
extern int g_layers;            // num_hidden_layers (else 3)
extern int g_consolidated;      // train.save_consolidated
extern int g_comm_dtype;        // communication_data_type (an l3d_dtype; -1: unset)
extern int g_grad_dtype;        // data_types.grad_accum_dtype (an l3d_dtype; -1: unset)
extern int g_overlap;           // zero_optimization.overlap_comm
extern int g_bf16;              // bf16.enabled
extern int g_tp_mode;           // parallel.tp_mode: 0 (1d, the default), 2 ("2d") or 3 ("3d")
extern int g_micro;             // train_micro_batch_size_per_gpu (0: 2; train_batch_size is
                                // it times accum_total)
extern int g_untied;            // tie_word_embeddings false (the default model ties them)
extern const char *g_device;   // the device the ranks train on (NULL: L3D_DEVICE's)
extern int g_fp16;              // fp16.enabled with the static loss scale 2^g_fp16 (0: off)
extern const char *g_init_dir;  // the single-rank reference saves its initial weights there
extern result_t g_ref;          // the 3-layer single-rank reference (reference())

void make_data(void);
void config(l3d_ctx_t *ctx, const layout_t *L, l3d_train_config_t *cfg);
// Runs every rank of L; save after step STEPS/2 to `save`, or resume from `resume` (NULL: no).
void run_layout_ckpt(const layout_t *L, result_t *res, const char *save, const char *resume);
void run_layout(const layout_t *L, result_t *res);
// Runs every rank; fills err[r] ("" when rank r succeeded) and returns the failed ranks.
int run_ranks(const layout_t *L, result_t *res, const char *save, const char *resume,
              char err[][256]);
void free_result(result_t *r);
// The single-rank reference with its float64 trajectory and the float32 runs' spread.
void reference_run(const layout_t *one, result_t *ref);
void reference(void);
// reference_run of the model with untied embeddings (sets g_untied; 2d and 3d take no tied
// ones yet) into *ref.
void reference_untied(result_t *ref);
// Steps from s0 on and the final weights of `got` against ref's float64 trajectory.
void check_run(const char *name, const result_t *got, const result_t *ref, int s0);
// A 16-bit run's loss stays within tracks_bound(fp16) float32 sigmas of the float64
// trajectory (derived above its definition).
double tracks_bound(int fp16);
// 16-bit runs of n layouts (bf16, fp16 alternating) against their float32 runs, the plan and
// the float64 reference g_ref
void check_16bit(const layout_t *ls, int n);
// The counted communication of rank 0's last step equals the plan per group, and its
// allocations the memory estimate, category by category.
void check_plan_memory(const char *name, const result_t *got);
// L against g_ref / ref: trajectory, counted = predicted communication, memory = estimate;
// compare_keep hands the run's result to *keep (NULL: freed).
void compare(const layout_t *L);
void compare_to(const layout_t *L, const result_t *ref);
void compare_keep(const layout_t *L, const result_t *ref, result_t *keep);
// Saves at step STEPS/2 on `from` under knobs kf, checks the saved directory with the shell
// test `dir_test` (%s: the directory, twice; NULL: none), resumes on `to` under kt.
void resume_knobs(const layout_t *from, knobs_t kf, const layout_t *to, knobs_t kt,
                  const result_t *ref, const char *dir_test);
void resume_case_to(const layout_t *from, const layout_t *to, const result_t *ref);
void resume_case(const layout_t *from, const layout_t *to);

#endif
