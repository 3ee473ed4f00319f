// The trainer's state, shared by core/trainer.c and core/checkpoint.c.
#ifndef L3D_TRAINER_INTERNAL_H
#define L3D_TRAINER_INTERNAL_H

#include "core/data.h"
#include "core/mesh.h"
#include "core/model_internal.h"
#include "core/pipeline.h"
#include "llama3d/comm.h"
#include "llama3d/train.h"

// One gradient bucket of the data-parallel reduction (core/trainer_dp.c): arena floats
// [off, off+len), len a multiple of dp; piece r = [off + r*q, off + (r+1)*q) at shard offset sh.
typedef struct l3d_dp_bucket {
    size_t off, len, q, sh;
    l3d_request_t *req;
} l3d_dp_bucket_t;

typedef struct l3d_dp {
    l3d_comm_t *comm;  // the dp group (NULL: dp 1)
    int n, rank;
    int sharded;       // ZeRO >= 1 with dp > 1: optimizer state holds this rank's pieces only
    size_t P, Ppad;    // parameters, and the gradient arena padded to a multiple of dp
    l3d_dp_bucket_t *b;
    int nb, next;      // buckets (0 = the arena's end), next one to start
    size_t shard_len;  // floats of exp_avg / exp_avg_sq on this rank
} l3d_dp_t;

// Pipeline state (core/trainer_pp.c). With pp 1 there is one slot and no communicator.
typedef struct l3d_pp {
    l3d_comm_t *comm;       // the pp group (mesh-owned; NULL when pp 1)
    l3d_comm_t *emb_comm;   // first + last stage of one (dp, tp) place, tied embeddings (owned)
    int kind, nslots;
    l3d_acts_t **slots;     // activation sets, micro-batch j uses slots[j % nslots]
    l3d_request_t **fsend, **bsend;  // per slot: the pending send of x_final / dres
    l3d_pp_op_t *ops;
    int nops;
} l3d_pp_t;

struct l3d_trainer {
    l3d_ctx_t *ctx;
    l3d_train_config_t cfg;
    l3d_device_t *dev;
    l3d_model_t *model;
    l3d_tokenizer_t *tok;
    l3d_dataset_t *data;
    l3d_mesh_t *mesh;
    l3d_dp_t dp;
    float *grads;                    // Ppad floats, the parameters' layout
    float *adam_m, *adam_v;          // dp.shard_len floats (the full layout unless sharded)
    l3d_acts_t *acts;               // == pp.slots[0]
    l3d_pp_t pp;
    int32_t *h_tokens, *h_targets;  // (micro, T) host staging
    int step;                       // optimizer steps done
    double gemm_peak;               // GFLOP/s
    double flops_per_token;
};

// torch.nn.utils.clip_grad_norm_: the factor applied to every gradient for a global norm
// `norm` and limit `max_norm` (<= 0: no clipping): max_norm / (norm + 1e-6) when below 1.
float l3d_clip_scale(double norm, float max_norm);

// parallel.layers_per_stage when given for this pp, else NULL (balanced stages).
static inline const int *l3d_train_config_lps(const l3d_train_config_t *cfg) {
    return cfg->pp > 1 && cfg->n_layers_per_stage == cfg->pp ? cfg->layers_per_stage : NULL;
}

// core/trainer_dp.c: data parallelism and ZeRO-1.
l3d_status l3d_dp_init(l3d_trainer_t *t, l3d_comm_t *dp_comm);
size_t l3d_dp_bucket_floats(double reduce_bucket_size, size_t Ppad, int dp);
void l3d_dp_fini(l3d_trainer_t *t);
// Before each micro-batch: hooks the bucket reductions into the backward of the last one.
void l3d_dp_arm(l3d_trainer_t *t, l3d_acts_t *a, int last_micro);
// Starts the buckets not started yet and waits for all of them.
l3d_status l3d_dp_reduce_finish(l3d_trainer_t *t);
l3d_status l3d_dp_sum_double(l3d_trainer_t *t, l3d_comm_t *c, double *x);
l3d_status l3d_dp_grad_sumsq(l3d_trainer_t *t, double *sumsq);
l3d_status l3d_dp_update(l3d_trainer_t *t, float lr, float bc1, float bc2, float gscale);
// Optimizer state: full arena (Ppad floats) <-> this rank's shard. gather is collective.
l3d_status l3d_dp_optim_gather(l3d_trainer_t *t, const float *shard, float *full);
l3d_status l3d_dp_optim_scatter(l3d_trainer_t *t, const float *full, float *shard);

// core/trainer_pp.c: pipeline parallelism. init creates the slots (all layouts) and, when
// pp > 1, the schedule and the tied-embedding group (collective over the world).
l3d_status l3d_pp_init(l3d_trainer_t *t);
void l3d_pp_fini(l3d_trainer_t *t);
// Runs the step's micro-batches on this stage (all of them when pp 1); *loss_sum is the
// sum over the step's tokens of this dp rank, on every stage.
l3d_status l3d_pp_run(l3d_trainer_t *t, float grad_scale, double *loss_sum);

#endif
