// Folder core/train (docs/architecture.md): the trainer, dp and ZeRO-1/2/3, offload, pipeline
// execution, the loss scaler, LR schedules, evaluation, the data stream, the MFU roof, the
// trainer's checkpoints. May use every folder below it: core/checkpoint, core/model,
// core/config, core/text, core/comm, the core/ root, platform/, the device vtable.
//
// The trainer's state, shared by core/trainer*.c (core/train/trainer_ckpt.c: its checkpoints).
#ifndef L3D_TRAINER_INTERNAL_H
#define L3D_TRAINER_INTERNAL_H

#include <string.h>

#include "core/train/data.h"
#include "core/train/loss_scaler.h"
#include "core/comm/mesh.h"
#include "core/model/model_internal.h"
#include "core/config/pipeline.h"
#include "llama3d/comm.h"
#include "llama3d/train.h"

// One gradient bucket of the data-parallel reduction (core/train/trainer_dp.c): arena floats
// [off, end); it is reduced as len >= end - off floats (a multiple of dp: ZeRO-1 pads the
// arena's end, ZeRO-2 each bucket), so piece r = [off + r*q, off + (r+1)*q) clipped to end,
// held at shard offset sh.
typedef struct l3d_dp_bucket {
    size_t off, end, len, q, sh;
    l3d_request_t *req;
    // ZeRO-2: the bucket's window (trainer_zero2.c): L3D_WIN_NONE, L3D_WIN_FILL (the backward
    // accumulates this micro-batch's gradient there) or L3D_WIN_BUSY (its reduce-scatter, or
    // after the update its all-gather, is in flight); at: its offset in the ring
    int win;
    size_t at;
} l3d_dp_bucket_t;

enum { L3D_WIN_NONE, L3D_WIN_FILL, L3D_WIN_BUSY };

// Runs of the rings start at multiples of L3D_RING_ALIGN elements (256 bytes and more), as a
// separate allocation would: a GEMM reads and writes tensors at their offsets in a run, and
// cuBLASLt's algorithms assume 256-byte aligned operands unless told otherwise.
#define L3D_RING_ALIGN ((size_t)128)
static inline size_t l3d_ring_run(size_t len) {
    return (len + L3D_RING_ALIGN - 1) / L3D_RING_ALIGN * L3D_RING_ALIGN;
}
// A free run of len elements in a FIFO ring of ring_len elements holding n runs, the oldest
// at `first`, the newest [last_at, last_at + last_len): after the newest, else from the
// ring's start up to the oldest. 1 and *at when there is one (ZeRO-2's windows, ZeRO-3's pool).
int l3d_ring_fit(size_t ring_len, int n, size_t first, size_t last_at, size_t last_len,
                 size_t len, size_t *at);

typedef struct l3d_dp {
    l3d_comm_t *comm;  // the dp group (NULL: dp 1)
    int n, rank;
    int sharded;       // ZeRO >= 1 with dp > 1: optimizer state holds this rank's pieces only
    size_t P, Ppad;    // parameters, and the gradient arena padded to a multiple of dp
    l3d_dp_bucket_t *b;
    int nb, next;      // buckets (0 = the arena's end), next one to start
    size_t shard_len;  // floats of exp_avg / exp_avg_sq on this rank
    // ZeRO-2 (core/train/trainer_zero2.c; stage 2 with dp > 1): no full gradient arena. Buckets are
    // whole gradient groups; each micro-batch's backward accumulates a bucket in a window,
    // reduce-scatters it and adds this rank's piece to gshard (shard_len floats).
    // The gradient norm's sum of squares (l3d_dp_grad_sumsq): [0] the sum, then room for a
    // group's per-rank parts; in memory of norm_on (the device that sums the gradients: the
    // host's with an offloaded ZeRO-2/3 shard), made on first use. norm_host: its host copy.
    double *norm_dev, norm_host;
    l3d_device_t *norm_on;
    size_t norm_len;
    int zero2;
    float *gshard;
    // Windows (trainer_zero2.c): the buckets take runs of the ring (ring_len elements of gt) in
    // backward order and give them back in the same order once reduced; ring_q lists the
    // buckets in it, oldest first (ring_n of them). The reserved bucket (the embedding that a
    // tied head on the same stage writes first and completes last; -1: none) has a window of
    // its own, own (own_len elements). pair: the bucket whose window the backward asks for
    // together with the next one's (the head's and the final norm's; -1: none).
    void *ring, *own;
    size_t ring_len, own_len;
    int *ring_q, ring_n;
    int reserved, pair;
    // offload_optimizer: gshard is host memory; each reduced piece is copied through stage
    // (stage_len floats, the longest piece) and added on the host (NULL: no offload)
    float *stage;
    size_t stage_len;
    // 16-bit windows (gt): this rank's reduced piece widened into pscratch (pscratch_len floats
    // on the device: l3d_zero2_pscratch_len) a chunk at a time before it is added to gshard
    // (NULL: float32 windows)
    float *pscratch;
    size_t pscratch_len;
    // ZeRO-3 (core/train/trainer_zero3.c; stage 3 with dp > 1, zero2 set too): the parameters are
    // sharded like the gradients, one bucket per gradient group.
    int zero3;
    struct l3d_zero3 *z3;
    // ZeRO-1/2 with 16-bit weights (core/train/trainer_master.c; l3d_master16): the float32
    // master is this rank's pieces (master, shard_len floats; NULL with offload_optimizer, whose
    // host master it is then), m->params freed.
    int master16;
    float *master;
    // The dtype gradients travel in (l3d_dp_comm_dtype). Other than float32, a bucket is
    // converted into 16 bits before its reduction, and the reduced part this rank uses back
    // into float32 after it, in place (in the arena at stages 0-1, in its window at 2-3: the
    // first half of the bucket's float32 bytes holds it), through cscratch (cscratch_len
    // 16-bit elements: l3d_dp_cscratch_len). NULL when float32.
    // With 16-bit gradients (gt, below) cdt is gt and nothing converts.
    l3d_dtype cdt;
    void *cscratch;
    size_t cscratch_len;
    // The dtype of the gradient arena (stages 0-1) and of the windows (2-3):
    // l3d_train_config_grad_dtype. gshard, the reduced pieces AdamW reads at stages 2-3,
    // stays float32.
    l3d_dtype gt;
} l3d_dp_t;

// Pipeline state (core/train/trainer_pp.c). With pp 1 there is one slot and no communicator.
typedef struct l3d_pp {
    l3d_comm_t *comm;       // the pp group (mesh-owned; NULL when pp 1)
    l3d_comm_t *emb_comm;   // first + last stage of one (dp, tp) place, tied embeddings (owned)
    int kind, nslots, v;    // v: model chunks of this stage (interleaved 1F1B; else 1)
    // activation sets: micro-batch j of chunk c uses slots[slot0[c] + j % (slot0[c+1] - slot0[c])]
    l3d_acts_t **slots;
    int slot0[L3D_MAX_CHUNKS + 1];
    // the send ring (core/config/pipeline.h): each buffer's pending send of x_final / dres,
    // and the buffers handed out so far
    l3d_request_t *fsend[L3D_PP_RING], *bsend[L3D_PP_RING];
    unsigned nf, nb;
    // The layers' activations: a pool of nblocks blocks (block_bytes each) bound to a slot's
    // layers at its forward and returned at its backward; nblocks is the schedule's peak of
    // live layers (l3d_pp_layer_peak). free_blk holds the free ones' indices (nfree of them),
    // held[slot * maxL + l] the block of a slot's layer l.
    void *pool;
    size_t block_bytes;
    int nblocks, nfree, maxL;
    int *free_blk, *held;
    l3d_pp_op_t *ops;
    int nops;
} l3d_pp_t;

// ZeRO offload (core/train/trainer_offload.c).
typedef struct l3d_offload {
    int optim, param;     // offload_optimizer; offload_param (ZeRO-3 with dp > 1 only)
    l3d_device_t *hdev;   // a CPU device for the host's AdamW (NULL without optim)
    float *master;        // shard floats in host memory: this rank's parameter pieces (NULL
                          // with param: the host parameter shard is the master)
    float *grad;          // shard floats in host memory: the reduced gradient pieces
    // 16-bit weights with a host master and 16-bit parameters on the device (ZeRO-1/2's
    // sharded master; ZeRO-3 without offload_param): the master's pieces rounded on the host
    // (shard elements of the weights' dtype), then copied over (l3d_offload_round); else NULL
    void *stage16;
} l3d_offload_t;

struct l3d_trainer {
    l3d_ctx_t *ctx;
    l3d_train_config_t cfg;
    l3d_device_t *dev;
    l3d_model_t *model;
    l3d_tokenizer_t *tok;
    l3d_dataset_t *data;             // the training file as loaded (checkpoints name it)
    // What the steps and the evaluations read (core/train/trainer_eval.c): views of `data` (its
    // head when data.eval_fraction holds out its tail) and of eval_data (data.eval_path).
    l3d_dataset_t train_view, eval_view;
    l3d_dataset_t *eval_data;
    int have_eval;
    l3d_mesh_t *mesh;
    l3d_dp_t dp;
    void *grads;                     // Ppad elements of dp.gt, the parameters' layout
    float *adam_m, *adam_v;          // dp.shard_len floats (the full layout unless sharded);
                                     // host memory with offload_optimizer
    l3d_offload_t off;
    l3d_acts_t *acts;               // == pp.slots[0]
    l3d_pp_t pp;
    int32_t *h_tokens, *h_targets;  // (micro, T) host staging
    int step;                       // optimizer steps done (skipped fp16 steps included)
    l3d_loss_scaler_t scaler;       // fp16 loss scaling (a static 1 otherwise)
    double peak_flops;              // the MFU roof of one rank, FLOP/s (0: none)
    double flops_per_token;
};

// torch.nn.utils.clip_grad_norm_: the factor applied to every gradient for a global norm
// `norm` and limit `max_norm` (<= 0: no clipping): max_norm / (norm + 1e-6) when below 1.
float l3d_clip_scale(double norm, float max_norm);

// Model chunks per pipeline stage: parallel.virtual_stages, by default 2 when interleaved.
static inline int l3d_train_config_v(const l3d_train_config_t *cfg) {
    if (cfg->virtual_stages > 0) return cfg->virtual_stages;
    return !strcmp(cfg->pp_schedule, "interleaved") ? 2 : 1;
}

// The activation checkpointing the activation sets get (L3D_CKPT_*): partition_activations
// only where it splits something (tp > 1 without sequence parallelism, which splits the rows
// already).
static inline int l3d_train_config_ckpt(const l3d_train_config_t *cfg) {
    if (!cfg->activation_checkpointing) return 0;
    int sp = cfg->sequence_parallel && cfg->tp > 1;
    return L3D_CKPT_ON | (cfg->partition_activations && cfg->tp > 1 && !sp ? L3D_CKPT_PARTITION : 0) |
           (cfg->cpu_checkpointing ? L3D_CKPT_CPU : 0);
}

// parallel.layers_per_stage when given for this pp and v (pp x v entries, virtual stage u =
// chunk * pp + stage), else NULL (balanced virtual stages).
static inline const int *l3d_train_config_lps(const l3d_train_config_t *cfg) {
    return cfg->pp > 1 && cfg->n_layers_per_stage == cfg->pp * l3d_train_config_v(cfg)
               ? cfg->layers_per_stage
               : NULL;
}

// core/train/trainer_dp.c: data parallelism and ZeRO-1.
l3d_status l3d_dp_init(l3d_trainer_t *t, l3d_comm_t *dp_comm);
size_t l3d_dp_bucket_floats(double reduce_bucket_size, size_t Ppad, int dp);
void l3d_dp_fini(l3d_trainer_t *t);
// Before each micro-batch: hooks the bucket reductions into the backward of the last one.
void l3d_dp_arm(l3d_trainer_t *t, l3d_acts_t *a, int last_micro);
// Starts the buckets not started yet and waits for all of them.
l3d_status l3d_dp_reduce_finish(l3d_trainer_t *t);
l3d_status l3d_dp_sum_double(l3d_trainer_t *t, l3d_comm_t *c, double *x);
// st from a call on c, on t's context with c's reason: a collective's error is written on the
// communicator's context (the world's, shared by thread ranks), not the caller's.
l3d_status l3d_dp_comm_err(l3d_trainer_t *t, l3d_comm_t *c, l3d_status st, const char *what);
l3d_status l3d_dp_grad_sumsq(l3d_trainer_t *t);
// A 16-bit communication_data_type: the elements of the scratch that converts buckets of at
// most `longest` floats in place (at most a fixed chunk).
size_t l3d_dp_cscratch_len(size_t longest);
// Allocates it (nothing to do without dp or when gradients are reduced in their own dtype);
// l3d_dp_fini frees it.
l3d_status l3d_dp_cscratch_alloc(l3d_trainer_t *t, size_t longest);
// The 16-bit copy of bucket b's first elements (the bucket's own float32 bytes, converted in
// place) and back: stage 0-1 buckets in the arena, stage 2-3 ones in their window at p.
l3d_status l3d_dp_narrow(l3d_trainer_t *t, void *p, size_t len);
// This rank's reduced piece (q elements from element `first` of the 16-bit copy at p) back
// to float32 at p + first: stage 1-3's piece, or the whole bucket (first 0, q its length).
l3d_status l3d_dp_widen(l3d_trainer_t *t, void *p, size_t first, size_t q);
l3d_status l3d_dp_update(l3d_trainer_t *t, float lr, float bc1, float bc2, float grad_scale);
l3d_status l3d_dp_norm_read(l3d_trainer_t *t, double *sumsq);
// This rank's pieces under ZeRO (dp.sharded): piece k (0 <= k < dp.nb) is arena floats
// [*lo, *hi) (may be empty; never beyond the parameters' n_params) whose optimizer state sits
// at adam_m/adam_v + *sh. Every arena float below n_params is in exactly one piece of one dp
// rank. Not sharded: one piece, the whole arena at shard offset 0 (returns 1 either way: the
// count of pieces).
int l3d_dp_pieces(const l3d_trainer_t *t);
void l3d_dp_piece(const l3d_trainer_t *t, int k, size_t *lo, size_t *hi, size_t *sh);
// Optimizer state: full arena (Ppad floats) <-> this rank's shard. gather is collective.
l3d_status l3d_dp_optim_gather(l3d_trainer_t *t, const float *shard, float *full);
l3d_status l3d_dp_optim_scatter(l3d_trainer_t *t, const float *full, float *shard);

// core/train/trainer_zero2.c: ZeRO stage 2. buckets: the buckets of model part m (dims set) for dp
// ranks and reduce_bucket_size, whole gradient groups cut from the arena's end (b may be NULL:
// count only); *shard_len (may be NULL) gets the sum of len/dp. Returns the count
// (<= l3d_model_grad_groups(m)).
int l3d_zero2_buckets(const l3d_model_t *m, double reduce_bucket_size, int dp,
                      l3d_dp_bucket_t *b, size_t *shard_len);
// The windows m's buckets need: the ring's elements (*ring_len; with overlap, room for any two
// neighbouring buckets at once), the reserved bucket (*reserved, -1: none) and its own
// window's (*own_len), the bucket asked for together with the next (*pair, -1: none). Returns
// the elements of gradient memory (shard + ring + own).
size_t l3d_zero2_windows(const l3d_model_t *m, double reduce_bucket_size, int dp, int overlap,
                         size_t *ring_len, size_t *own_len, int *reserved, int *pair);
// The floats of the scratch a 16-bit window's reduced piece is widened through, a chunk at a
// time, for pieces of at most `piece` floats.
size_t l3d_zero2_pscratch_len(size_t piece);
// The longest piece (bucket length / dp) of m's buckets.
size_t l3d_zero2_max_piece(const l3d_model_t *m, double reduce_bucket_size, int dp);
l3d_status l3d_zero2_init(l3d_trainer_t *t);
void l3d_zero2_fini(l3d_trainer_t *t);
// Hooks the windows into a micro-batch's backward (every micro-batch reduces its gradient).
void l3d_zero2_arm(l3d_trainer_t *t, l3d_acts_t *a);
// End of the step's backward: completes every reduction (and sums a tied embedding's piece
// over the embedding group). Then gshard holds this rank's summed gradient pieces.
l3d_status l3d_zero2_finish(l3d_trainer_t *t);
// After AdamW updated this rank's pieces: all-gathers every bucket into the parameters.
l3d_status l3d_zero2_gather_params(l3d_trainer_t *t);

// The training dtype: bfloat16 under bf16.enabled, float16 under fp16.enabled (its loss scaler
// keeps the scaled gradients in float16's range), else float32. Activations and their
// gradients are stored in it, and the weights the passes read (l3d_model_set_weight_dtype);
// the master weights, the weight gradients (accumulated over micro-batches) and the optimizer
// state stay float32.
static inline l3d_dtype l3d_train_config_act_dtype(const l3d_train_config_t *cfg) {
    return cfg->bf16 ? L3D_BFLOAT16 : cfg->fp16 ? L3D_FLOAT16 : L3D_FLOAT32;
}
static inline l3d_dtype l3d_train_config_weight_dtype(const l3d_train_config_t *cfg) {
    return l3d_train_config_act_dtype(cfg);
}

// The dtype weight gradients accumulate in: data_types.grad_accum_dtype, float32 unless
// given (the config allows a 16-bit one only with that training dtype, and then reduces in it).
static inline l3d_dtype l3d_train_config_grad_dtype(const l3d_train_config_t *cfg) {
    return cfg->grad_dtype < 0 ? L3D_FLOAT32 : (l3d_dtype)cfg->grad_dtype;
}

// The dtype data parallelism reduces gradients in: float32 under fp32_allreduce, else
// communication_data_type when set, else the training dtype (DeepSpeed's default).
static inline l3d_dtype l3d_dp_comm_dtype(const l3d_train_config_t *cfg) {
    if (cfg->fp32_allreduce) return L3D_FLOAT32;
    if (cfg->comm_dtype < 0) return l3d_train_config_act_dtype(cfg);
    return (l3d_dtype)cfg->comm_dtype;
}

// Whether a layout takes ZeRO-2's gradient path (per-micro-batch windows reduce-scattered
// into a gradient shard, no whole gradient arena): stage 2 and 3, and stage 1 with the
// optimizer offloaded, whose gradient pieces go to the host as they are reduced (DeepSpeed's
// cpu_offload copies each reduced partition out of the bucket: copy_grads_in_partition) so
// the device keeps no whole gradient. The updates equal stage 1's bit for bit (the same sums
// in the same order; test_parallel_bf16).
static inline int l3d_train_config_zero2(const l3d_train_config_t *cfg, int dp) {
    return dp > 1 && (cfg->zero_stage >= 2 || (cfg->zero_stage == 1 && cfg->offload_optimizer));
}

// The reduce_bucket_size the ZeRO-2 bucketing uses: stage 3 puts every gradient group in a
// bucket of its own (the unit its parameters are gathered in; 1 element merges nothing).
static inline double l3d_zero_bucket_size(const l3d_train_config_t *cfg) {
    return cfg->zero_stage >= 3 ? 1.0 : cfg->reduce_bucket_size;
}

// core/train/trainer_zero3.c: ZeRO stage 3 over the ZeRO-2 buckets (one per gradient group).
// sizes: for model part m (dims set) and the config's stage3_* keys, the floats this rank
// keeps for parameters: its pieces (*shard), the persistent groups whole (*persist), the
// gather pool (*pool); returns their sum. No allocation.
size_t l3d_zero3_sizes(const l3d_model_t *m, const l3d_train_config_t *cfg, int dp,
                       size_t *shard, size_t *persist, size_t *pool);
// The dp all-gathers on model part m: of one micro-batch's forward and backward (*calls,
// *floats) and of the persistent groups once per step (*pcalls, *pfloats); floats of each
// group padded to a multiple of dp.
void l3d_zero3_gathers(const l3d_model_t *m, const l3d_train_config_t *cfg, int dp,
                       uint64_t *calls, uint64_t *floats, uint64_t *pcalls, uint64_t *pfloats);
// After l3d_zero2_init: allocates the shard and the persistent groups, partitions (frees
// m->params), then allocates the pool. arm (after l3d_pp_init) hooks every activation slot.
l3d_status l3d_zero3_init(l3d_trainer_t *t);
void l3d_zero3_arm(l3d_trainer_t *t);
void l3d_zero3_fini(l3d_trainer_t *t);
// This rank's parameter shard at offset sh (a piece's parameters, l3d_dp_piece).
float *l3d_zero3_piece_at(l3d_trainer_t *t, size_t sh);
// Where the update rounds the piece at shard offset sh in the same pass: the 16-bit shard
// (wshard) when it is device memory beside a device-resident float32 shard; else NULL (float32
// weights, or offloaded: refresh_wshard rounds it before the next gather).
void *l3d_zero3_piece16_at(l3d_trainer_t *t, size_t sh);
// Before an update that rounds into wshard: every all-gather still sending from it finished.
l3d_status l3d_zero3_before_update(l3d_trainer_t *t);
// Whether ZeRO-3's float32 shard lives in host memory (offload_param; offload_optimizer under
// 16-bit weights): it is then the offloaded master.
int l3d_zero3_shard_on_host(const l3d_train_config_t *cfg);
// After AdamW updated the pieces: all-gathers the persistent groups (and marks the 16-bit
// copy of the pieces for rounding again before the next gather).
l3d_status l3d_zero3_gather_persistent(l3d_trainer_t *t);
// Checkpoints: materialize gives m->params the whole stage again (collective over dp);
// partition copies this rank's pieces back out of it and frees it. Both no-ops without ZeRO-3.
l3d_status l3d_zero3_materialize(l3d_trainer_t *t);
l3d_status l3d_zero3_partition(l3d_trainer_t *t);

// core/train/trainer_master.c: ZeRO-1/2's sharded float32 master under 16-bit weights.
// master16: whether a layout has it. init (after l3d_offload_init) allocates the master and
// partitions (frees m->params); at: the master at shard offset sh (device, or the offloaded
// host master); piece16: this rank's piece of bucket k rounded to the weights' dtype into dst
// (device, q elements), what the ZeRO-1/2 parameter gathers send.
int l3d_master16(const l3d_train_config_t *cfg, int dp);
l3d_status l3d_master_init(l3d_trainer_t *t);
void l3d_master_fini(l3d_trainer_t *t);
float *l3d_master_at(l3d_trainer_t *t, size_t sh);
l3d_status l3d_master_piece16(l3d_trainer_t *t, int k, void *dst);
// m->params <- the whole float32 parameters from a shard of pieces (shard layout; device or
// host memory), all-gathered over dp.
l3d_status l3d_dp_master_whole(l3d_trainer_t *t, const float *shard);
// Checkpoints and tests: whole gives m->params the whole stage again where the parameters are
// partitioned (ZeRO-3; ZeRO-1/2's master under 16-bit weights), collective over dp; part copies
// this rank's pieces back out of it (and the 16-bit copy from it) and frees it. No-ops where
// nothing is partitioned.
l3d_status l3d_dp_params_whole(l3d_trainer_t *t);
l3d_status l3d_dp_params_part(l3d_trainer_t *t);

// core/train/trainer_offload.c: ZeRO offload. init (after l3d_zero3_init, before the update's first
// use) creates the host device and the host arrays and pulls the master; pull refreshes the
// master from the device's parameters (after a resume); grads_to_host copies the reduced
// gradient pieces D2H; params_to_device copies the updated master pieces H2D. master: the
// host array AdamW updates (shard layout).
l3d_status l3d_offload_init(l3d_trainer_t *t);
void l3d_offload_fini(l3d_trainer_t *t);
l3d_status l3d_offload_pull(l3d_trainer_t *t);
l3d_status l3d_offload_grads_to_host(l3d_trainer_t *t);
l3d_status l3d_offload_params_to_device(l3d_trainer_t *t);
float *l3d_offload_master(l3d_trainer_t *t);
// The master's pieces [sh, sh + n) rounded to the weights' dtype on the host and copied to
// dst (device memory, n elements), waited for: what the device's 16-bit parameters are made
// from when the only master is in host memory (stage16).
l3d_status l3d_offload_round(l3d_trainer_t *t, size_t sh, size_t n, void *dst);
// Moves the bytes of `mem` (device figures of a shard of shard_len floats) that the offload
// switches put in host memory into its host_* fields (zero2: the gradient shard and a
// staging buffer of stage_len floats too; master16: the master's rounded pieces).
void l3d_offload_memory(const l3d_train_config_t *cfg, int zero2, int zero3, int master16,
                        size_t shard_len, size_t stage_len, l3d_mem_breakdown_t *mem);

// core/train/trainer_eval.c: the streams the trainer reads. init loads data.eval_path or splits
// off data.eval_fraction's tail; load_batch fills this rank's micro-batch j of step `step` from
// the training stream (in order or shuffled, core/train/data.h).
l3d_status l3d_eval_init(l3d_trainer_t *t);
void l3d_eval_fini(l3d_trainer_t *t);
void l3d_train_load_batch(l3d_trainer_t *t, int64_t step, int j);

// core/train/trainer_pp.c: pipeline parallelism. init creates the slots (all layouts) and, when
// pp > 1, the schedule and the tied-embedding group (collective over the world).
l3d_status l3d_pp_init(l3d_trainer_t *t);
void l3d_pp_fini(l3d_trainer_t *t);
// Runs the step's micro-batches on this stage (all of them when pp 1); *loss_sum is the
// sum over the step's tokens of this dp rank, on every stage.
l3d_status l3d_pp_run(l3d_trainer_t *t, float grad_scale, double *loss_sum);
// The send ring: points a->x_final at the next x buffer once its previous send completed;
// *send receives the place for the new send's request. wait_sends completes them all.
l3d_status l3d_pp_take_x(l3d_trainer_t *t, l3d_acts_t *a, l3d_request_t ***send);
l3d_status l3d_pp_wait_sends(l3d_trainer_t *t);
// The layer pool: binds free blocks to the slot's layers (before its forward), and returns
// them (after its backward).
l3d_status l3d_pp_bind(l3d_trainer_t *t, int slot);
void l3d_pp_unbind(l3d_trainer_t *t, int slot);
// Every block free (a pass that failed half-way may have left some bound).
void l3d_pp_pool_reset(l3d_pp_t *p);

// core/train/comm_plan.c: the communication of one step of world rank 0, as terms. The kind sets a
// term's cost in l3d plan (core/plan/plan_cost.c): an all-reduce moves 2(n-1)/n of its buffer per
// rank, an all-gather or reduce-scatter (n-1)/n of the full buffer, a point-to-point term
// counts sends and receives as calls and the sent bytes once. Bytes are those
// l3d_comm_get_stats counts; per_mb terms run once per micro-batch (calls and bytes are the
// step's totals), the others once per step: during the last backward (gradient reductions),
// or after it (`after`: the loss, norms, the updated parameters' all-gathers).
typedef enum {
    L3D_COMM_OP_ALLREDUCE,
    L3D_COMM_OP_GATHER,  // all-gather or reduce-scatter: the same cost
    L3D_COMM_OP_P2P,
    L3D_COMM_OP_BCAST,  // broadcasts and reduces within rows or columns of the 2d grid (and
                        // their small row-statistic all-reduces): one pipelined pass each
} l3d_comm_op_kind;
typedef struct l3d_comm_term {
    int group;  // L3D_MESH_*
    l3d_comm_op_kind op;
    int per_mb, after;
    uint64_t calls, bytes;
    // The part of the group it runs on: `ranks` members `stride` group ranks apart (a 2d
    // grid's row or column, a 3d cube's axis or plane); 0, 0: the whole group.
    int ranks, stride;
} l3d_comm_term_t;
enum { L3D_COMM_TERMS_MAX = 24 };
// Writes up to max terms, returns how many there are (at most L3D_COMM_TERMS_MAX).
int l3d_train_config_comm_terms(const l3d_train_config_t *cfg, l3d_comm_term_t *t, int max);

#endif
