// Planning: which dp x tp x pp (x cp) layout to train a model with on a given cluster, and
// why. An analytic model, not a simulator: per layout the memory per GPU (the estimator of
// `l3d train --dry-run`, which equals the trainer's allocations), the communication per group
// (the formulas of docs/parallel.md, which equal what a step counts) and a step time from
// compute at a GEMM-size-dependent efficiency, alpha-beta collectives over the intra- and
// inter-node links, and the pipeline bubble. docs/plan.md derives every term and states the
// model's error against published runs (l3d_plan_published).
// defines: l3d_plan_gpu_t, l3d_plan_link_t, l3d_plan_runtime_t, l3d_plan_layout_t,
// l3d_plan_request_t, l3d_plan_result_t, l3d_plan_*
#ifndef LLAMA3D_PLAN_H
#define LLAMA3D_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/config.h"
#include "llama3d/ctx.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// One accelerator: dense 16-bit peak, memory and its bandwidth, and how close kernels come to
// that peak on it compared with the A100 that l3d_plan_runtime_t's efficiencies were fitted
// on (published measurements, core/plan/plan_hw.c; 0 means 1, as on an A100 or a measured
// peak).
typedef struct l3d_plan_gpu {
    char name[32];
    double peak_flops;  // FLOP/s, bf16/fp16 dense (the MFU roof)
    double mem_bytes;   // device memory, bytes
    double mem_bw;      // device memory bandwidth, bytes/s
    double gemm_rel;    // a GEMM's best share of peak_flops over the A100's
    double attn_rel;    // flash attention's best share of peak_flops over the A100's
} l3d_plan_gpu_t;

// The operations a link is measured or modelled for (l3d_plan_link_t.alpha/beta index).
typedef enum {
    L3D_PLAN_OP_ALLREDUCE,
    L3D_PLAN_OP_GATHER,  // all-gather or reduce-scatter
    L3D_PLAN_OP_P2P,
    L3D_PLAN_OP_COUNT
} l3d_plan_op;

// A link between the GPUs of one group. A collective of S bytes over n ranks on it takes
// steps(n) * alpha + S * factor(n) / beta, with ring steps and factors (docs/plan.md):
// all-reduce 2(n-1) and 2(n-1)/n, all-gather/reduce-scatter (n-1) and (n-1)/n, point to point
// 1 and 1; `ranks` (> 0 for a measured link) is the group size it was measured at, and alpha
// is then per call at that size, scaled by steps(n) / steps(ranks).
typedef struct l3d_plan_link {
    char name[64];
    double alpha[L3D_PLAN_OP_COUNT];  // seconds per ring step (measured: per call)
    double beta[L3D_PLAN_OP_COUNT];   // bytes/s per GPU, one direction, as a bus bandwidth
    int ranks;                        // 0: a published link; > 0: measured over this many ranks
} l3d_plan_link_t;

// How the software being planned runs. l3d_plan_runtime_default is llama3d's: flash-style
// attention (no (T,T) scores are stored or moved, causal blocks skipped) and data-parallel
// reductions overlapping the last micro-batch's backward. The published calibration runs
// (Megatron-LM 2021-22) stored the scores and did not overlap.
typedef struct l3d_plan_runtime {
    int flash_attention;   // 1: causal attention does half the score FLOPs, no (T,T) traffic
    int dp_overlap;        // 1: gradient reductions overlap the last backward
    int dp_fp32_grads;     // 1: gradients are reduced in float32 (else in bf16); without a
                           // base configuration (a base's own keys decide)
    int pp_scatter_gather; // 1: without sequence parallelism a stage still sends 1/tp of
                           // an activation per rank and all-gathers it on the far side
                           // (Megatron's scatter/gather); llama3d sends it whole
    // Fitted once on A100 (docs/plan.md, bench/plan_fit.c) and not refitted per GPU:
    double gemm_eff;       // GEMM efficiency, fraction of peak_flops
    double attn_eff;       // flash attention kernels' efficiency, fraction of peak_flops
    double mem_traffic;    // elementwise bytes moved per byte of stored activation
} l3d_plan_runtime_t;

enum { L3D_RECOMPUTE_NONE = 0, L3D_RECOMPUTE_SELECTIVE = 1, L3D_RECOMPUTE_FULL = 2 };

// One layout. In a request's `fixed`, 0 (-1 for zero_stage, recompute, sp, ends) means
// "search".
typedef struct l3d_plan_layout {
    int dp, tp, pp, cp;  // data, tensor, pipeline, context parallel sizes
    int tp_mode;         // 1 ("1d", Megatron), 2 ("2d" SUMMA grid), 3 ("3d" cube); a
                         // search tries 2d at square tp, 3d at cubes
    int v;               // model chunks per pipeline rank (> 1: interleaved 1F1B)
    int micro_batch;     // sequences per micro-batch
    int zero_stage;      // 0..3
    int recompute;       // L3D_RECOMPUTE_*
    int sp;              // sequence parallelism (tp > 1)
    int ends;            // pp > 1: 1 = the embedding and the head each take a layer's place in
                         // the split over the pp x v virtual stages (parallel.layers_per_stage;
                         // Llama 3's balancing), 0 = the layers split evenly
} l3d_plan_layout_t;

typedef struct l3d_plan_request {
    l3d_model_config_t model;
    l3d_plan_gpu_t gpu;
    l3d_plan_link_t intra, inter;  // within a node, between nodes
    l3d_plan_runtime_t runtime;
    int gpus, gpus_per_node;
    int seq_len, global_batch;     // tokens per sequence, sequences per step
    double mem_reserve;            // bytes per GPU kept free (runtime, communicator buffers)
    int ignore_fit;                // rank by step time alone (planning a run another
                                   // framework made, whose memory is not llama3d's)
    // The training configuration a layout is applied to: its precision, bucket sizes, ZeRO-3
    // knobs (a ds_config.json read with l3d_train_config_from_file). NULL: the defaults with
    // bf16. Borrowed; the layout's keys and the batch, seq and model above override it.
    const l3d_train_config_t *base;
    l3d_plan_layout_t fixed;
} l3d_plan_request_t;

// Groups of comm_bytes: tensor, data, pipeline (the mesh's) and context parallel.
enum { L3D_PLAN_GROUPS = 4 };

typedef struct l3d_plan_result {
    l3d_plan_layout_t layout;
    double mem_bytes;          // per GPU: the pipeline stage needing the most (its tp rank 0)
    double mem_params, mem_grads, mem_optim, mem_acts;
    int fits;                  // mem_bytes <= gpu.mem_bytes - mem_reserve
    double step_time_s;
    double compute_s;          // the busiest stage's compute over the step (no bubble)
    double bubble_s;           // the pipeline's fill and drain
    double comm_s[L3D_PLAN_GROUPS];  // exposed communication per group over the step
    double mfu;                // PaLM's: (6N + 12 L H Q T) per token / (time * gpus * peak)
    double tokens_per_s_per_gpu;
    uint64_t comm_bytes[L3D_PLAN_GROUPS];  // bytes world rank 0 sends per step, per group
    uint64_t comm_calls[L3D_PLAN_GROUPS];
} l3d_plan_result_t;

// Published GPUs (h100-sxm, h200-sxm, a100-80gb, a100-40gb, gh200) and links (nvlink3,
// nvlink4, ib-hdr200, ib-ndr400, roce-400). Unknown name: L3D_ERR_INVALID_ARG listing the
// known ones.
l3d_status l3d_plan_gpu_named(l3d_ctx_t *ctx, const char *name, l3d_plan_gpu_t *gpu);
l3d_status l3d_plan_link_named(l3d_ctx_t *ctx, const char *name, l3d_plan_link_t *link);
const char *const *l3d_plan_gpu_names(void);
const char *const *l3d_plan_link_names(void);
// A link measured by `l3d bench comm --json FILE`: `paths` is a comma-separated list of such
// files (all-reduce, all-gather/reduce-scatter and p2p/pingpong runs; an op without a file
// is derived from the all-reduce). alpha and beta are a least-squares fit of time = a + S/b
// per op. Bad or unreadable file: L3D_ERR_IO / L3D_ERR_FORMAT naming it.
l3d_status l3d_plan_link_measured(l3d_ctx_t *ctx, const char *paths, l3d_plan_link_t *link);
void l3d_plan_runtime_default(l3d_plan_runtime_t *rt);
// A request with a100-80gb, nvlink3 + ib-hdr200, 8 GPUs per node, the default runtime, 2 GiB
// reserved, nothing fixed (fixed.tp_mode 1); the caller sets model, gpus, seq_len,
// global_batch.
void l3d_plan_request_default(l3d_plan_request_t *req);

// Evaluates one complete layout (every key set; dp*tp*pp*cp == gpus). A layout the trainer
// would refuse (tp against the heads, pp against the layers, the batch identity):
// L3D_ERR_CONFIG with the trainer's message.
l3d_status l3d_plan_evaluate(l3d_ctx_t *ctx, const l3d_plan_request_t *req,
                             const l3d_plan_layout_t *layout, l3d_plan_result_t *res);
// The parallel.layers_per_stage a layout trains with: with ends (and pp > 1) its pp x v counts
// into lps[0 ..) and their number; 0 for an even split (no list); -1 when they would not fit
// in max entries or the virtual stages outnumber the layers, the embedding and the head.
int l3d_plan_layers_per_stage(const l3d_model_config_t *mc, const l3d_plan_layout_t *layout,
                              int *lps, int max);
// Searches every layout the request leaves open and writes the best `max` (fitting layouts
// by step time, then the rest by memory) to res; *n_p: how many were written, *searched_p
// (may be NULL): how many valid layouts were evaluated. None valid: L3D_ERR_CONFIG saying why.
l3d_status l3d_plan_search(l3d_ctx_t *ctx, const l3d_plan_request_t *req, l3d_plan_result_t *res,
                           int max, int *n_p, long *searched_p);

// The published runs the model is checked against (Korthikanti et al. 2022 Table 5, Narayanan
// et al. 2021 Table 1: calibration; Dubey et al. 2024 Table 4: held out), each planned with
// its published layout and software (the keys a paper does not state are searched).
typedef struct l3d_plan_published {
    const char *source;    // "korthikanti2022-t5", "narayanan2021-t1", "llama3-t4"
    const char *name;      // the row
    int calibration;       // 1: used to fit l3d_plan_runtime_default's constants
    double published_s;    // step time, seconds (derived from TFLOP/s where the paper gives that)
    double predicted_s;
    double error;          // predicted / published - 1
    l3d_plan_result_t plan;
    l3d_model_config_t model;  // the model planned (a GPT run's as a Llama shape)
} l3d_plan_published_t;
// Plans every published run with `rt` (NULL: the default runtime) and fills up to max rows;
// *n_p: rows written. Mean and max |error| of the calibration rows in *cal_mean, *cal_max,
// of the held-out rows in *held_mean, *held_max (any may be NULL).
l3d_status l3d_plan_published(l3d_ctx_t *ctx, const l3d_plan_runtime_t *rt,
                              l3d_plan_published_t *rows, int max, int *n_p, double *cal_mean,
                              double *cal_max, double *held_mean, double *held_max);

#ifdef __cplusplus
}
#endif
#endif
