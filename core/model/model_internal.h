// Folder core/model (docs/architecture.md): parameters and their layout, forward/backward,
// tensor parallelism 1d/2d/3d, inference and the KV cache (one rank or tp x pp), the sampler,
// the memory check. May use: core/config, core/comm, the core/ root, platform/, the device
// vtable, include/llama3d/.
//
// The model's internals shared by core/model*.c, core/train/trainer.c and
// core/checkpoint/checkpoint.c.
// defines: l3d_model (struct), l3d_param_t, l3d_layer_acts_t, l3d_acts_t
#ifndef L3D_MODEL_INTERNAL_H
#define L3D_MODEL_INTERNAL_H

#include "core/config/config_layout.h"
#include "core/config/pipeline.h"
#include "core/l3d_core.h"
#include "devices/device.h"
#include "llama3d/comm.h"
#include "llama3d/model.h"

// One named parameter tensor: a slice of the parameter arena (and of the gradient arena,
// at the same offset). Names are Hugging Face's.
typedef struct l3d_param {
    char name[64];
    int ndim;
    int64_t shape[2];  // this rank's shard
    size_t offset;     // floats from the arena start
    size_t numel;
    int decay;         // weight decay applies (matrices and embeddings, not norms)
    // Tensor parallelism: the shard is rows [r0, r0+shape[0]) and columns [c0, c0+shape[1])
    // of the full tensor (full[0], full[1]); `repl` tp ranks hold identical copies of it
    // (norms: all tp ranks; key/value heads when there are fewer than tp; else 1).
    int64_t full[2], r0, c0;
    int repl;
    int pp_copy;  // pipeline: the last stage's copy of a tied embedding (not in the norm twice)
} l3d_param_t;

// One inference pass over n <= l3d_kv_cache_rows(c) new tokens at the cache's position on
// this rank's part of the model: the embedding (the first stage; vocabulary-parallel under tp)
// or, on a later pipeline stage, rows (n, C) from device memory `x_prev`; the stage's layers;
// then a stage without the head copies its rows (n, C) to device memory `x_next`, and the last
// stage writes the logits of rows [first_row, n) -- under tp this rank's vocabulary slice
// [tp.v0, tp.v0 + V) -- to host `out` with row stride ldo floats. Collective over the tp group.
typedef struct l3d_kv_cache l3d_kv_cache_t;
l3d_status l3d_kv_pass(l3d_kv_cache_t *c, const int32_t *tokens, int n, int first_row,
                       float *out, size_t ldo, const float *x_prev, float *x_next);
// One pass of spans[0..ns) (their tokens, k <= l3d_kv_cache_rows in all, laid out span
// after span; sequences distinct, checked by the caller): as l3d_kv_pass, the first stage
// embeds, a later one takes the (k, C) rows x_prev; a stage without the head writes its rows
// to x_next, the last writes the logits of each span asking for them (its vocabulary slice
// under tp) at out + j * ldo, j counting those spans.
l3d_status l3d_kv_pass_spans(l3d_kv_cache_t *c, const l3d_decode_span_t *spans, int ns,
                             const int32_t *tokens, float *out, size_t ldo, const float *x_prev,
                             float *x_next);
// A spans call's arguments, as l3d_model_decode_spans takes them: each sequence in range,
// once, n >= 1 tokens that fit, each token in the vocabulary (NULL tokens: not checked, for a
// stage without the embedding); L3D_ERR_INVALID_ARG naming `what` otherwise. *n_tokens_p and
// *n_logits_p: the tokens in all and the spans asking for logits.
l3d_status l3d_kv_check_spans(l3d_kv_cache_t *c, const l3d_decode_span_t *spans, int ns,
                              const int32_t *tokens, const char *what, int *n_tokens_p,
                              int *n_logits_p);
// The next pass of a spans call: from the cursor (*span_i, *off: the span and the tokens of
// it already fed), at most `rows` tokens, written as spans to out (a span cut at the pass's
// end asks no logits) whose count is returned, *k_p their tokens; the cursor moves past them.
int l3d_kv_spans_next(const l3d_decode_span_t *spans, int ns, int *span_i, int *off, int rows,
                      l3d_decode_span_t *out, int *k_p);
// The cache's spans buffers (n_seq entries each): a batch's spans and a pass's.
l3d_decode_span_t *l3d_kv_cache_spans(l3d_kv_cache_t *c, int which);
int l3d_kv_cache_rows(const l3d_kv_cache_t *c);
// The sequence l3d_kv_pass appends to (0 unless set; < the cache's sequences).
void l3d_kv_cache_select(l3d_kv_cache_t *c, int seq);
int l3d_kv_cache_capacity(const l3d_kv_cache_t *c);

// Refuses (L3D_ERR_CONFIG, saying how much `what` needs and how much is available) an
// allocation of `need` bytes that the machine and the process's cgroup cannot give.
// l3d_mem_check_with takes the available amount (tests); l3d_mem_check asks the OS.
l3d_status l3d_mem_check(l3d_ctx_t *ctx, uint64_t need, const char *what);
l3d_status l3d_mem_check_with(l3d_ctx_t *ctx, uint64_t need, uint64_t avail, const char *src,
                              const char *what);

// Tensor parallelism of one model (Megatron 1D; core/model/model_tp.c). size 1: not split.
typedef struct l3d_tp {
    int size, rank;
    l3d_comm_t *comm;     // the tp group (borrowed; NULL when size 1)
    l3d_comm_t *kv_comm;  // tp ranks holding the same key/value heads (owned; NULL if kv_rep 1)
    int kv_rep;           // tp ranks sharing each key/value head: tp / KVH when KVH < tp, else 1
    int v0;               // first vocabulary row of this rank (rows split unevenly, no padding)
    // Sequence parallelism (Megatron): the residual stream and the norms hold rows
    // [rank*N/tp, (rank+1)*N/tp) of the (N,C) activations; all-gathers before the column-
    // parallel GEMMs and reduce-scatters after the row-parallel ones replace the all-reduces.
    int sp;
    // Tensor parallelism "2d" (mode 2; being built, core/model/tp2d.h): the tp group is a q x q
    // grid and rank (i, j) holds block (i, j) of every activation -- rows of micro-batch slice i
    // (its own B/q sequences), columns j -- and of every weight as tp2d.h lays them out; the
    // norms and the embedding (columns j) are replicated down grid column j. Linear layers are
    // SUMMA products, RMSNorm sums its row statistic over grid row i, attention and SwiGLU
    // are local (q divides the heads and key/value heads), the head's vocabulary is split
    // over grid row i for the cross-entropy. 1: Megatron 1D (everything above).
    // Tensor parallelism "3d" (mode 3; being built, core/model/tp3d.h): the tp group is a q x q x q
    // cube; rank (i, j, l) holds the residual stream's rows of micro-batch slice i*q + j (B/q^2
    // sequences), columns l, and, between a layer's "A" and "B" products (attention, SwiGLU,
    // the logits), rows of slice i*q + l, columns j (heads j). Weights are tp3d.h's 1/q^3
    // blocks; the norms and the embedding (columns l) are replicated over the q^2 ranks of
    // plane l, the head's vocabulary split along j for the cross-entropy.
    int mode;
    int q;                // the grid's or the cube's side (1 in 1D)
    struct l3d_tp2d *g;   // the grid (owned; NULL unless 2d)
    struct l3d_tp3d *g3;  // the cube (owned; NULL unless 3d)
    // 2d and 3d: the part of the grid or cube each step talks over (borrowed from g or g3;
    // NULL in 1D). norm: the other columns of this rank's rows (2d's row, 3d's axis l);
    // vocab: the other vocabulary blocks of the logits' rows (2d's row, 3d's axis j); repl:
    // the replicas of the norms' and the embedding's blocks (2d's column, 3d's plane l); loss:
    // one rank per micro-batch slice and vocabulary block (2d's column, 3d's plane j).
    l3d_comm_t *norm_comm, *vocab_comm, *repl_comm, *loss_comm;
    float *stat;      // (rows) the split-row RMSNorm's statistic (owned scratch)
    size_t cap_stat;  // its length in floats
} l3d_tp_t;

// Offsets (in floats) of one layer's tensors in the arena.
typedef struct l3d_layer_params {
    size_t ln1, wq, wk, wv, wo, ln2, wg, wu, wd;
} l3d_layer_params_t;

// The activations one layer saves for its backward. // shapes with N = B*T rows
// Activations are stored in the dtype of their l3d_acts_t (`at`; void *), the row statistics
// (rstd, lse) in float32.
typedef struct l3d_layer_acts {
    void *x_in;    // (N,C) residual stream entering the layer
    float *rstd1;  // (N)
    void *ln1;     // (N,C); with ln_part this rank's (N/tp,C)
    void *q;       // (N,H*D) after rope
    void *k;       // (N,KVH*D) after rope (or the KV cache)
    void *v;       // (N,KVH*D)
    void *att;     // (N,H*D) attention output before o_proj
    float *lse;    // (B,H,T)
    void *h;       // (N,C) residual after attention
    float *rstd2;  // (N)
    void *ln2;     // (N,C); with ln_part this rank's (N/tp,C)
    void *gate;    // (N,F)
    void *up;      // (N,F)
    void *sp_tmp;  // (N,C) sequence-parallel scratch, shared by all layers (NULL: no SP)
    // Sequence parallelism, layers kept (no recomputation): ln1 and ln2 keep this rank's rows
    // only, and are all-gathered into sp_tmp for the GEMMs that read them, in the forward and
    // again in the backward (Megatron's sequence parallelism: 2sbh/tp bytes where all N rows
    // took 2sbh; two more all-gathers a layer).
    int ln_part;
    // Checkpointing with partition_activations or cpu_checkpointing (L3D_CKPT_*): the saved
    // input, x_in's rows this rank keeps, on the device or in host memory; x_in is then one of
    // two buffers shared by the layers (NULL: x_in is the saved input itself).
    void *ckpt;
} l3d_layer_acts_t;

// Whether this rank's copy of tensor p is the one that counts when copies are written or
// counted once: not the last pipeline stage's copy of a tied embedding, and of `repl` tp
// ranks with identical copies the first -- tp rank % repl == 0 in 1D (a kv head's ranks are
// consecutive), grid row 0 in 2d (the copies run down a grid column), the ranks (0, 0, l) in
// 3d (the copies fill plane l).
static inline int l3d_param_primary(const struct l3d_model *m, const l3d_param_t *p);

// Element i of a tensor of dtype t at p (activations: the dtype of their l3d_acts_t).
static inline void *l3d_elem(const void *p, l3d_dtype t, size_t i) {
    return (char *)p + i * l3d_dtype_size(t);
}

// Activation checkpointing, the `recompute` of l3d_acts_create: 0 keeps every activation;
// L3D_CKPT_ON keeps each layer's input and rebuilds the rest in its backward; with
// L3D_CKPT_PARTITION each rank keeps 1/tp of the input's rows (all-gathered over tp for the
// rebuild; tp > 1 without sequence parallelism, micro-batch tokens divisible by tp); with
// L3D_CKPT_CPU the kept inputs live in host memory (copied there in the forward, back in the
// backward).
enum { L3D_CKPT_ON = 1, L3D_CKPT_PARTITION = 2, L3D_CKPT_CPU = 4 };

// Training activations for micro-batches of B sequences of T tokens.
typedef struct l3d_acts {
    int B, T;
    l3d_dtype at;   // the dtype activations and their gradients are stored in
    int chunk, L;   // the model chunk these are for, and its layer count (layers[L])
    int l_first;    // m's local index of layers[0]
    int recompute;  // activation checkpointing (L3D_CKPT_*): layers share one buffer set, each
                    // layer's input kept
    int pooled;     // the layers' own storage is bound per micro-batch (l3d_acts_bind)
    void *mem;
    size_t bytes;
    // The working set: the buffers a forward or a backward uses and leaves nothing in for
    // the other (the rebuilt layer under recomputation and its working inputs, sw, sp_tmp,
    // the cross-entropy's losses and reductions, dln, datt, dq, dk, dv, dgate, dup). A rank
    // runs one pass at a time, so its activation sets share one (Megatron keeps one too): in
    // mem after the set's own buffers when it owns it, else the owner's (work_bytes each).
    void *work;
    size_t work_bytes;
    void *host_mem;     // L3D_CKPT_CPU: the kept inputs (host_bytes, from alloc_host)
    size_t host_bytes;
    l3d_layer_acts_t *layers;  // L entries
    void *x_final, *lnf, *logits;
    // The working set's send buffers (core/config/pipeline.h): x_final of a chunk without the
    // head (NULL with it: x_final is kept for the final norm's backward) and dres; x_final and
    // dres point at [0] until the pipeline picks one for a pass.
    void *xring[L3D_PP_RING], *dring[L3D_PP_RING];
    float *rstdf, *losses;
    void *sw;                  // (N,F) SwiGLU output scratch
    float *vp_max, *vp_stats;  // (N), (N,2): vocabulary-parallel cross-entropy reductions
    // 2d with tied embeddings (head only): the head's block of the table (V/q, C/q; weight
    // dtype) and its gradient, sent and received (float32)
    void *tied_w;
    float *tied_g, *tied_r;
    int tp_sync_grads;         // last micro-batch of a step: sum replicated kv-head gradients
    // backward scratch
    void *dres, *dln, *datt, *dq, *dk, *dv, *dgate, *dup;
    int32_t *tokens, *targets;  // (N) on the device
    // Optional hook (NULL: none), called during the backward each time the gradients of the
    // arena range [final_from, end) are complete for this micro-batch: final_from decreases
    // (head and final norm, then each layer from the last, then 0 after the embedding). Data
    // parallelism starts its bucket reductions from it while the backward goes on.
    l3d_status (*grad_ready)(void *arg, size_t final_from);
    void *grad_ready_arg;
    // Optional (NULL: the gradients are the arena G passed to the backward, accumulated +=):
    // where the backward accumulates the gradient group [lo, hi) (l3d_model_grad_group) of this
    // micro-batch. *g receives the address of arena float lo; the hi - lo floats after it are
    // zero when the group is first asked for in a backward. Called before the group's first
    // write, possibly again for the same group (a tied head and the embedding); may block
    // (ZeRO-2 waits for a free window). Shares grad_ready_arg.
    l3d_status (*grad_window)(void *arg, size_t lo, size_t hi, void **g);
    // Optional (NULL: the parameters are l3d_model_pass_params): where the forward (backward 0)
    // or the backward (1) of these activations' chunk reads parameter group [lo, hi)
    // (l3d_model_grad_group), stored in m->wt. *w receives the address of arena element lo,
    // valid until param_release of the same range; may block (ZeRO-3 gathers the group over
    // dp) and may start gathering the groups the pass reads next. Every param_window is
    // followed by its param_release before the pass asks for another group. Share param_arg.
    l3d_status (*param_window)(void *arg, const struct l3d_acts *a, int backward, size_t lo,
                               size_t hi, const void **w);
    l3d_status (*param_release)(void *arg, size_t lo, size_t hi);
    void *param_arg;
} l3d_acts_t;

// Where a pass of a's chunk starts: its first layer's input, or, in a chunk of no layers
// (parallel.layers_per_stage 0: the embedding alone, or the head alone), x_final, which the
// embedding writes and the final norm reads. The pipeline receives activations there.
static inline void *l3d_acts_input(const l3d_acts_t *a) {
    return a->L ? a->layers[0].x_in : a->x_final;
}

#define L3D_MAX_CHUNKS 64  // parallel.virtual_stages at most

struct l3d_model {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
    l3d_model_config_t cfg;    // the full model
    int C, F, L, H, KVH, D, V; // this rank's shard: F, H, KVH and V are per tp rank, L per stage
                               // (2d: C, F, H, KVH and V are blocks, V the head's rows)
    int Vemb;                  // rows of this rank's embedding shard: V, or the whole
                               // vocabulary in 2d (it splits the columns)
    l3d_tp_t tp;
    // pipeline stage: layers l0 .. l0+L-1; the embedding (first stage), norm and head (last).
    // Interleaved 1F1B: the L local layers are nchunks model chunks, chunk c (virtual stage
    // c * pp + pp_rank) local layers [chunk_start[c], chunk_start[c+1]) = global layers
    // chunk_g0[c] ..; else one chunk of layers l0 ...
    int l0, has_embed, has_head, pp_size, pp_rank;
    int nchunks;
    int chunk_start[L3D_MAX_CHUNKS + 1], chunk_g0[L3D_MAX_CHUNKS];
    float *params;  // arena on the device
    size_t n_params;
    // What training passes read (core/model/model_fwdbwd.c): the parameters in dtype wt. float32:
    // params itself (wp NULL); bfloat16/float16 (l3d_model_set_weight_dtype): wp, a copy of
    // n_params elements of that dtype, which l3d_model_refresh_weights rounds params into (the
    // float32 arena stays the master; NULL under ZeRO-3, whose gathered groups are in wt).
    l3d_dtype wt;
    void *wp;
    // wp already holds params rounded: the trainer's AdamW wrote both in one pass (its adamw
    // entry's param16) and nothing has written params since, so l3d_model_refresh_weights has
    // nothing to do. Every other writer of params clears it (init, load, resume).
    int wp_fresh;
    // An inference model whose only weights are wp, in the 16-bit wt its checkpoint holds
    // (l3d_model_create_part_w16): no float32 arena (params NULL), half the memory; what
    // inference reads (l3d_model_infer_w). Training, saving and initialising refuse it.
    int w16_only;
    // Inference's weight products may round the float32 activations to wt and run in the
    // CPU's 16-bit arithmetic (the gemm's round_a; l3d_infer_round_products), as a bfloat16
    // model computes in torch, vLLM and llama.cpp. 0: activations read exactly.
    int round_a16;
    // The dtype weight gradients are written and accumulated in (l3d_model_set_grad_dtype):
    // float32 (the default), or wt under a 16-bit data_types.grad_accum_dtype. Every op adds
    // in float32 and rounds once into a 16-bit gradient (the device contract), so one
    // micro-batch's gradient equals the float32 one rounded, but for the sums that meet in
    // the gradient itself (a tied embedding's two uses, tensor-parallel sums of replicated
    // gradients, micro-batches accumulated): each rounds its partial first.
    l3d_dtype gt;
    l3d_param_t *tensors;
    int n_tensors;
    size_t embed;                  // offset of model.embed_tokens.weight
    size_t norm;                   // offset of model.norm.weight
    size_t head;                   // offset of lm_head.weight (== embed when tied)
    l3d_layer_params_t *layer;     // L entries
    float *cos_tab, *sin_tab;      // (rope_len, D/2) on the device
    int rope_len;
    // The weights read by l3d_model_load/open (l3d_st_dtype, whether the files' dtypes differ,
    // how many files; dtype F32 and files 0 for fresh weights), and how saves write them:
    // dtype (default: the dtype loaded), shard limit, the directory whose tokenizer and
    // generation files are carried along ("" = none).
    struct {
        int dtype, mixed, files;
    } loaded;
    struct {
        int dtype;
        uint64_t max_shard_bytes;
        char carry_from[1024];
    } save;
};

static inline int l3d_param_primary(const struct l3d_model *m, const l3d_param_t *p) {
    if (p->pp_copy) return 0;
    if (p->repl <= 1) return 1;
    // 2d: grid row 0 (rank < q); 3d: the ranks (0, 0, l) (rank < q)
    return m->tp.mode >= 2 ? m->tp.rank < m->tp.size / p->repl : m->tp.rank % p->repl == 0;
}

// Floats in the parameter arena (and in each of the gradient and optimizer arenas) for cfg,
// and bytes of training activations for micro-batches of B x T: exactly what
// l3d_model_create and l3d_acts_create allocate, computed without allocating.
size_t l3d_model_arena_floats(const l3d_model_config_t *cfg);
// The same for tensor-parallel rank `rank` of `tp`.
size_t l3d_model_arena_floats_tp(const l3d_model_config_t *cfg, int tp, int rank);
// Copies cfg into m->cfg and the short dimension fields (C, F, L, H, KVH, D, V) of tp rank
// `rank` of `tp` (1, 0: the whole model). The shapes must divide (l3d_tp_check).
void l3d_model_set_dims(l3d_model_t *m, const l3d_model_config_t *cfg);
void l3d_model_set_dims_tp(l3d_model_t *m, const l3d_model_config_t *cfg, int tp, int rank);
// The same for rank `rank` of tensor parallelism "2d" on a q x q grid (l3d_tp2d_check).
void l3d_model_set_dims_2d(l3d_model_t *m, const l3d_model_config_t *cfg, int q, int rank);
// And of tensor parallelism "3d" on a q x q x q cube (l3d_tp3d_check).
void l3d_model_set_dims_3d(l3d_model_t *m, const l3d_model_config_t *cfg, int q, int rank);
// set_dims_tp or, tp_mode 2, set_dims_2d on the sqrt(tp) x sqrt(tp) grid, or, tp_mode 3,
// set_dims_3d on the cbrt(tp) cube.
void l3d_model_set_dims_mode(l3d_model_t *m, const l3d_model_config_t *cfg, int tp, int tp_mode,
                             int rank);
// The sequences of a micro-batch of mb this rank's activations hold: [*b0, *b0 + *nb) -- all
// of them, or under tensor parallelism "2d" grid row i's slice (mb / q from i * mb / q), or
// under "3d" slice i*q + j of q^2 (the tokens: the residual stream's rows).
void l3d_model_batch_slice(const l3d_model_t *m, int mb, int *b0, int *nb);
// The first sequence of the same number whose targets this rank's logits hold: *b0 of
// l3d_model_batch_slice, but under "3d" slice i*q + l.
int l3d_model_target_first(const l3d_model_t *m, int mb);
// A model holding block (i, j) of tensor parallelism "2d" (tp rank i*q + j of tp_comm, size
// q^2) of pipeline stage `stage` (as l3d_model_create_part); float32 only so far. Collective
// over tp_comm (it builds the grid). Training activations for it are created with the
// micro-batch slice's B (l3d_model_batch_slice), whose tokens and targets the caller puts in
// a->tokens / a->targets; a stage's boundary activations are its (B T, C/q) block.
l3d_status l3d_model_create_2d(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                               l3d_comm_t *tp_comm, int pp, int v, int stage,
                               const int *layers_per_stage, l3d_model_t **model_p);
// A model holding rank (i, j, l) of tensor parallelism "3d" (tp rank (i*q + j)*q + l, size
// q^3), as l3d_model_create_2d: activations for l3d_model_batch_slice's B, tokens from its
// slice, targets from l3d_model_target_first's; a stage's boundary activations are its
// (B T, C/q) block.
l3d_status l3d_model_create_3d(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                               l3d_comm_t *tp_comm, int pp, int v, int stage,
                               const int *layers_per_stage, l3d_model_t **model_p);
// Restricts m to pipeline stage `stage` of `pp` with v model chunks (virtual stages; 1: no
// interleaving): chunk c of stage s is virtual stage u = c * pp + s and holds
// layers_per_stage[u] layers (pp * v entries summing to the model's, checked by the config;
// the first and the last may be 0), or the layers are balanced over the pp * v virtual stages
// when NULL (the first L % (pp v) get one layer more). The embedding is on stage 0 (chunk 0),
// the norm and head on stage pp-1 (its last chunk).
// set_dims_tp sets stage 0 of 1.
void l3d_model_set_stage(l3d_model_t *m, int pp, int v, int stage, const int *layers_per_stage);
// Global index of local layer l.
int l3d_model_layer_index(const l3d_model_t *m, int l);
// The chunk holding local layer l.
int l3d_model_layer_chunk(const l3d_model_t *m, int l);
size_t l3d_model_arena_floats_part(const l3d_model_config_t *cfg, int tp, int rank, int pp,
                                   int v, int stage, const int *layers_per_stage);
l3d_status l3d_model_create_part(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                                 l3d_comm_t *tp_comm, int pp, int v, int stage,
                                 const int *layers_per_stage, l3d_model_t **model_p);
// The same with only 16-bit weights (wt bfloat16 or float16; float32 is l3d_model_create_part):
// an inference model that never holds the float32 arena (w16_only above).
l3d_status l3d_model_create_part_w16(l3d_ctx_t *ctx, l3d_device_t *dev,
                                     const l3d_model_config_t *cfg, l3d_comm_t *tp_comm, int pp,
                                     int stage, l3d_dtype wt, l3d_model_t **model_p);
// A model holding tp rank tp_rank's shard; tp_comm is the tp group (size tp). Collective over
// tp_comm (it splits off the key/value replica group when KVH < tp).
l3d_status l3d_model_create_tp(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                               l3d_comm_t *tp_comm, l3d_model_t **model_p);

// ---- tensor-parallel steps of the forward/backward (core/model/model_tp.c)
// ----------------------- Each is the plain single-rank operation when m->tp.size is 1.
// x(n) (dtype t) = sum over the tp group (blocking; syncs the device first).
l3d_status l3d_tp_allreduce(l3d_model_t *m, void *x, size_t n, l3d_dtype t);
// Start of a row-parallel output: dst = residual on tp rank 0, 0 on the others (the GEMM then
// accumulates each rank's partial product and l3d_tp_allreduce completes dst).
l3d_status l3d_tp_residual_init(l3d_model_t *m, void *dst, const void *residual, size_t n,
                                l3d_dtype t);
// out(N,C) (dtype at) = embedding of tokens in table (dtype wt; this rank's rows of
// embed_tokens: m->params + m->embed unless gathered; vocabulary-parallel: each rank looks up
// its rows, summed).
l3d_status l3d_tp_embedding_fwd(l3d_model_t *m, void *out, const void *table,
                                const int32_t *tokens, int N, l3d_dtype at, l3d_dtype wt);
// This rank's vocabulary rows only (0 for other tokens), not summed: (N,C).
l3d_status l3d_tp_embedding_fwd_partial(l3d_model_t *m, void *out, const void *table,
                                        const int32_t *tokens, int N, l3d_dtype at,
                                        l3d_dtype wt);
l3d_status l3d_tp_embedding_bwd(l3d_model_t *m, void *dtable, const void *dout,
                                const int32_t *tokens, int N, l3d_dtype at);
// Softmax cross-entropy over a->logits (N, V local), in place as xent_fwd_bwd; vocabulary-
// parallel over tp with two all-reduces of (N) and (N,2) floats; a->losses on every rank.
l3d_status l3d_tp_xent(l3d_model_t *m, l3d_acts_t *a, int N, float grad_scale);
// Sums a layer's k/v gradients (gk, gv: KVH*D x C each) over the tp ranks that hold the
// same key/value heads.
l3d_status l3d_tp_sum_kv_grads(l3d_model_t *m, void *gk, void *gv);
// Sequence parallelism: rows of a norm's input are split, so its weight gradient g (C floats)
// is partial: sums it over tp. 2d: over the grid column (the replicas of the block); 3d: over
// plane l.
l3d_status l3d_tp_sum_norm_grad(l3d_model_t *m, void *g);
// 2d: what one rank counts (l3d_comm_get_stats) on its grid row [0] and column [1] in one
// training micro-batch of B sequences (its slice) of T tokens on a stage of L layers, with
// the embedding (embed) and the final norm, head and loss (head): bytes and calls. recompute:
// every layer's forward runs again in the backward; sync: the micro-batch sums the replicated
// gradients (a->tp_sync_grads). es: bytes of an activation / weight block element (4 in the
// float32 runs here; the planner's bf16 runs 2). docs/parallel.md has the table this adds up.
void l3d_tp2d_micro_bytes(const l3d_model_config_t *cfg, int q, int L, int embed, int head,
                          int B, int T, int recompute, int sync, int es, uint64_t bytes[2],
                          uint64_t calls[2]);
// 3d: the same on the cube, per communicator: axes i, j, l [0..2], planes j [3] and l [4]
// (l3d_tp3d_t). B is the slice's sequences (B/q^2 of the micro-batch).
enum { L3D_TP3D_COMMS = 5 };
void l3d_tp3d_micro_bytes(const l3d_model_config_t *cfg, int q, int L, int embed, int head,
                          int B, int T, int recompute, int sync, int es,
                          uint64_t bytes[L3D_TP3D_COMMS], uint64_t calls[L3D_TP3D_COMMS]);
// The grid's or the cube's communicators (2d: row, column; 3d: axes i, j, l, planes j, l)
// into out (up to L3D_TP3D_COMMS); how many (0 in 1D).
int l3d_tp_sub_comms(const l3d_model_t *m, l3d_comm_t *out[L3D_TP3D_COMMS]);
// 2d: sums the embedding's gradient (Vemb x C) over the grid column, 3d over plane l; a no-op
// in 1D.
l3d_status l3d_tp_sum_embed_grad(l3d_model_t *m, void *g);
// Tied embeddings under 2d and 3d: the head's weight block from the table E (Vemb x C, this
// rank's columns; weight dtype) and its gradient back into E's gradient gE. 3d: the block is
// rows (j*q + i)*V/q^2.. of E itself (*w and *gw point there; nothing moves). 2d: rank (i, j)
// needs rows j*V/q.. of columns i, which rank (j, i) holds: in the forward (gE NULL)
// l3d_tp_tied_head_w sends rows i*V/q.. of E to it and receives its own block into a->tied_w;
// in the backward it reuses that block (*w = a->tied_w) and zeroes *gw = a->tied_g;
// l3d_tp_tied_head_g sends a->tied_g back and adds what rank (j, i) sent
// to rows i*V/q.. of gE. The diagonal copies. 1D, or untied: *w = E, *gw = gE, no-op.
l3d_status l3d_tp_tied_head_w(l3d_model_t *m, l3d_acts_t *a, const void *E, void *gE,
                              const void **w, void **gw);
l3d_status l3d_tp_tied_head_g(l3d_model_t *m, l3d_acts_t *a, void *gE);
// 2d with tied embeddings: what l3d_tp_tied_head_w + _g count on the grid's communicator per
// micro-batch at grid rank (i, j) (weights of wes bytes): 0 on the diagonal.
void l3d_tp2d_tied_bytes(const l3d_model_config_t *cfg, int q, int i, int j, int wes,
                         uint64_t *bytes, uint64_t *calls);
// RMSNorm of `rows` rows (rmsnorm_fwd/bwd's contracts): the device op, or in 2d the split-row
// form (row statistics summed over the grid row; 3d: along axis l).
l3d_status l3d_tp_rmsnorm_fwd(l3d_model_t *m, void *out, float *rstd, const void *x,
                              const void *w, int rows, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_tp_rmsnorm_bwd(l3d_model_t *m, void *dx, void *dw, const void *dout,
                              const void *x, const void *w, const float *rstd, int rows,
                              l3d_dtype at, l3d_dtype wt);
// full (N,C) <- every rank's rows (this rank's already at full + rank*rows*C): in place.
l3d_status l3d_tp_gather_rows(l3d_model_t *m, void *full, size_t rows, l3d_dtype t);
// The same from this rank's rows elsewhere (mine: rows x C).
l3d_status l3d_tp_gather_rows_from(l3d_model_t *m, const void *mine, void *full, size_t rows,
                                   l3d_dtype t);
// out (rows,C) = this rank's rows of the sum over tp of partial (N,C).
l3d_status l3d_tp_scatter_rows(l3d_model_t *m, const void *partial, void *out, size_t rows,
                               l3d_dtype t);

// Gradient groups: the arena ranges the backward completes one at a time, from the last:
// in arena order the embedding (first stage), each layer, the final norm, and the head when
// it is a tensor of its own (last stage; a tied head on the first stage is the embedding).
// Needs only the dims (l3d_model_set_dims_tp + set_stage). group_count <= L + 3; group i is
// [*lo, *lo + *n); *alone (may be NULL) is 1 for the embedding and head groups, which ZeRO-2
// keeps in buckets of their own (a tied pair on two stages must split the same way).
int l3d_model_grad_groups(const l3d_model_t *m);
void l3d_model_grad_group(const l3d_model_t *m, int i, size_t *lo, size_t *n, int *alone);
// The group of local layer l, of the final norm, of the head (last stage; a tied head on the
// first stage is the embedding's group 0).
int l3d_model_group_layer(const l3d_model_t *m, int l);
int l3d_model_group_norm(const l3d_model_t *m);
int l3d_model_group_head(const l3d_model_t *m);
// The model chunk whose backward writes group i (the embedding: 0, norm and head: the last).
int l3d_model_grad_group_chunk(const l3d_model_t *m, int i);

// Training passes read the parameters in wt (above): float32 drops the 16-bit copy; bfloat16
// or float16 allocates it (n_params elements, "params") unless with_copy is 0 (ZeRO-3: the
// passes read gathered groups; no copy). refresh rounds params into the copy (a no-op without
// one); call it after every change of params that a pass should see.
l3d_status l3d_model_set_weight_dtype(l3d_model_t *m, l3d_dtype wt, int with_copy);
l3d_status l3d_model_refresh_weights(l3d_model_t *m);
// Weight gradients in gt (m->gt above): float32, or the weights' dtype where tensor
// parallelism is 1D (the 2d and 3d products sum their partial gradients in float32
// scratch). Anything else is L3D_ERR_INVALID_ARG naming the combination.
l3d_status l3d_model_set_grad_dtype(l3d_model_t *m, l3d_dtype gt);
// The arena training passes read, in m->wt (NULL when neither exists: ZeRO-3).
static inline const void *l3d_model_pass_params(const l3d_model_t *m) {
    return m->wt == L3D_FLOAT32 ? (const void *)m->params : m->wp;
}
// What inference reads (core/model/model_infer.c): the float32 master (a training model's wp
// may be stale or absent between steps), or a 16-bit-only model's weights; the tensor at
// element offset `off`, and the dtype.
static inline l3d_dtype l3d_model_infer_wt(const l3d_model_t *m) {
    return m->w16_only ? m->wt : L3D_FLOAT32;
}
static inline const void *l3d_model_infer_w(const l3d_model_t *m, size_t off) {
    if (!m->w16_only) return m->params + off;
    return (const char *)m->wp + off * l3d_dtype_size(m->wt);
}

// L3D_ERR_INVALID_ARG naming `what` when m's parameters are not in m->params: a ZeRO-3 trainer
// keeps 1/dp of them (core/train/trainer_zero3.c) and saves through l3d_trainer_save.
l3d_status l3d_model_check_params(const l3d_model_t *m, const char *what);
// The same for what inference reads (l3d_model_infer_w): a 16-bit-only model passes too.
l3d_status l3d_model_check_infer(const l3d_model_t *m, const char *what);

// Fills m->tensors/m->layer/offsets for the dims set by l3d_model_set_dims_tp (m->tensors NULL:
// only counts m->n_params). n_tensors restarts at 0.
void l3d_model_layout(l3d_model_t *m);
// Checkpoints in the single-rank layout: `full` is a tp-1 model of the same config (its
// layout, and an arena of its size). slice: this rank's shard of every tensor from the full
// arena; gather (collective over tp): tp rank 0's full_arena receives every rank's shards,
// the others pass NULL. Either arena may be device or host memory (waited for on return).
l3d_status l3d_model_tp_slice(const l3d_model_t *m, const l3d_model_t *full,
                              const float *full_arena, float *local_arena);
l3d_status l3d_model_tp_gather(l3d_model_t *m, const float *local_arena, const l3d_model_t *full,
                               float *full_arena);
// Copies every tensor of m (a tp-1 layout, e.g. a pipeline stage) into full's arena by name
// (device or host memory either side; waited for on return).
l3d_status l3d_model_copy_named(const l3d_model_t *m, const float *arena,
                                const l3d_model_t *full, float *full_arena);
size_t l3d_acts_bytes(const l3d_model_config_t *cfg, int B, int T, int recompute);
// The same for chunk `chunk` of tp rank 0 of `tp` (tp_mode 2: of the 2d grid, micro-batches
// of B split over its rows) on pipeline stage `stage` of `pp` (v chunks), sequence-parallel
// when sp, activations in at, weights read in wt; *host_bytes (may be NULL) gets the host
// part (L3D_CKPT_CPU).
// Returns the set's own bytes; *work_bytes (may be NULL) gets its working set's, which the
// sets of a rank share (l3d_acts_t.work).
// pooled: as l3d_acts_create_chunk's (the layers' own storage left out); *block_bytes (may
// be NULL) gets one layer's own storage, pooled or not.
size_t l3d_acts_bytes_part(const l3d_model_config_t *cfg, int tp, int tp_mode, int pp, int v,
                           int stage, const int *layers_per_stage, int chunk, int B, int T,
                           int recompute, int sp, l3d_dtype at, l3d_dtype wt, int pooled,
                           size_t *block_bytes, size_t *work_bytes, size_t *host_bytes);

// Grows the rope tables to cover positions [0, len).
l3d_status l3d_model_rope_reserve(l3d_model_t *m, int len);
// inv_freq (D/2) with the Llama 3.1 scaling applied, in double (exposed for tests).
void l3d_rope_inv_freq(const l3d_model_config_t *cfg, double *inv_freq);

// Activations for all of m's layers (one chunk, float32), or for chunk `chunk` of them only,
// stored in at. With `share` (another set of m with the same B, T, recompute and at, which
// must outlive this one) the working set is share's, else this set has its own.
l3d_status l3d_acts_create(l3d_model_t *m, int B, int T, int recompute, l3d_acts_t **acts_p);
// pooled: the layers keep nothing of their own (what they keep from forward to backward is
// a block of l3d_acts_block_bytes, the same for every layer of m, bound to layer l of the
// set by l3d_acts_bind before the forward that fills it; the pipeline's pool).
l3d_status l3d_acts_create_chunk(l3d_model_t *m, int chunk, int B, int T, int recompute,
                                 l3d_dtype at, const l3d_acts_t *share, int pooled,
                                 l3d_acts_t **acts_p);
size_t l3d_acts_block_bytes(const l3d_model_t *m, const l3d_acts_t *a);
// Points layer l's own activations at block (device memory, l3d_acts_block_bytes; computed
// addresses, nothing is read or written).
void l3d_acts_bind(const l3d_model_t *m, l3d_acts_t *a, int l, void *block);
void l3d_acts_destroy(l3d_model_t *m, l3d_acts_t *a);

// One layer forward. x_out (N,C) receives the residual stream leaving the layer.
// pos0/Tk: the new rows sit at positions pos0.. of a sequence of Tk keys (training: 0 and T;
// then B may be > 1). a->k and a->v point at position 0 of the key/value rows; kv_bstride as
// in l3d_attn_dims_t (0 = contiguous). sw is (N,F) scratch. Wl: the layer's parameter group
// (its first element is input_layernorm's; m->params + m->layer[l].ln1 unless gathered),
// stored in wt. Activations (a's, x_out, sw) are stored in at.
l3d_status l3d_layer_forward(l3d_model_t *m, int l, const void *Wl, const l3d_layer_acts_t *a,
                             void *x_out, void *sw, int B, int T, int pos0, int Tk,
                             size_t kv_bstride, l3d_dtype at, l3d_dtype wt);

// Training forward + loss + backward of one micro-batch whose tokens/targets are already in
// a->tokens / a->targets. Gradients are accumulated (+=) into grads (same layout as params, m->gt),
// scaled by grad_scale (1 / target tokens in the global batch). *loss_sum_p receives the sum
// of the per-token losses (not scaled).
l3d_status l3d_model_train_micro(l3d_model_t *m, l3d_acts_t *a, void *grads, float grad_scale,
                                 double *loss_sum_p);
// The two halves of train_micro for a pipeline stage (see core/model/model_fwdbwd.c): forward
// (loss on the last stage, 0 elsewhere) and backward, of the chunk `a` was created for. Both
// return with the device synced.
l3d_status l3d_model_stage_forward(l3d_model_t *m, l3d_acts_t *a, float grad_scale,
                                   double *loss_sum_p);
l3d_status l3d_model_stage_backward(l3d_model_t *m, l3d_acts_t *a, void *grads);

#endif
