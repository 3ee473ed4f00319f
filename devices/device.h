// The device vtable: memory and every op the Llama 3 model needs, forward and backward.
// defines: l3d_device_t, l3d_device_ops_t, l3d_dev_* wrappers, l3d_device_create/destroy
//
// Shaped like ggml's backend interface and NCCL's net plugin: a const table of function
// pointers with an ABI version, its size and a name; each entry's contract is written above
// it. core/ calls only the l3d_dev_* wrappers below, never `ops->` directly.
//
// Conventions for every op entry:
// - Pointers are device memory returned by `alloc` (for the CPU device, host memory), never
//   owned by the op. Shapes are row-major, written as comments: // (B,T,C).
// - Ops are ordered on the device's one stream and may return before they finish (CUDA);
//   `sync` waits for all of them. The CPU device finishes each op before returning.
// - Every op is deterministic: the same inputs give bit-identical outputs for a given device
//   and thread count (reductions have a fixed order that does not depend on scheduling).
// - "+=" in a contract means the op accumulates into the output; otherwise it overwrites.
// - Token ids and targets are int32 in device memory. A target < 0 is ignored.
// - Dtypes (ABI 5): an op's tensors are stored in the dtypes it is given, each one of
//   L3D_FLOAT32, L3D_BFLOAT16 or L3D_FLOAT16 (any other is L3D_ERR_INVALID_ARG):
//     at  activations and their gradients: x, out, dout, dx, q/k/v, gate/up, logits
//     wt  a parameter the op reads: the norm weight, the embedding table
//     gt  a parameter's gradient the op writes: dw, dtable; AdamW's grad
//   Pointers to such tensors are void *. The row statistics (rstd, lse, rowmax, stats, losses),
//   the RoPE tables and AdamW's parameter and moments are always float32 (float *). Every op
//   reads 16-bit values exactly (widening is exact), does all its arithmetic in float32, and
//   rounds each 16-bit output element once, to nearest even, when it stores it; a "+=" output
//   is read, added to in float32 and rounded once. So a 16-bit op's result is its float32
//   result on the same (16-bit) inputs, rounded once.
#ifndef L3D_DEVICE_H
#define L3D_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "core/l3d_core.h"  // l3d_malloc (the host-memory wrappers' fallback)
#include "devices/device_math.h"
#include "llama3d/comm.h"    // l3d_dtype
#include "llama3d/ctx.h"
#include "llama3d/device.h"
#include "llama3d/status.h"

// 2: vocabulary-parallel embedding and cross-entropy entries (tensor parallelism).
// 3: per-operand dtypes in gemm (float32 compute), and convert.
// 4: host memory for offloading (alloc_host / free_host).
// 5: every op takes the dtypes of its tensors (16-bit storage, float32 arithmetic).
// 6: RMSNorm over rows split by columns across ranks (rmsnorm_rowdot, rmsnorm_rows_fwd/bwd;
//    optional, for tensor parallelism "2d").
// 7: is_device_ptr (which memory a buffer is: the communicator stages device buffers);
//    sumsq over many tensors into device memory, not blocking.
// 8: events (record on one stream, wait on another: a collective on the communication stream
//    after the compute that made its buffer, with no host wait); sum_f64 (the norm's
//    per-rank parts summed on the device); adamw reads the norm from device memory, clips
//    and skips a non-finite step itself, so the update needs no host read of the norm;
//    peak_flops (the MFU roof from the device's datasheet, not a CPU-style measurement).
// 9: mem_info (a device with memory of its own says how much: a run that cannot fit is
//    refused before it allocates, as one that cannot fit the host's memory is).
// 10: adamw over many tensors in one call, refreshing each one's 16-bit copy in the same pass.
// 11: gemm's round_a (a float32 A against 16-bit weights multiplied in 16-bit arithmetic).
#define L3D_DEVICE_ABI_VERSION 11

typedef struct l3d_device_ops l3d_device_ops_t;

// Bounce buffers a device keeps for staging (l3d_device_t.bounce): a staged call holds two
// (send and receive), and a few calls may be in flight (gradient buckets).
#define L3D_DEVICE_BOUNCE 8

// Object shape { ops, parent, priv } (STYLE.md point 5).
typedef struct l3d_device {
    const l3d_device_ops_t *ops;
    l3d_ctx_t *ctx;
    void *priv;
    int num_threads;  // as resolved by init (CPU); informational for others
    // The stream ops are issued on: an opaque handle from stream_create, or NULL for the
    // device's default stream. Set with l3d_dev_set_stream.
    void *stream;
    // The communicator's stream and the event that orders it after the compute stream
    // (core/comm/comm_stage.c makes them when a device buffer is first staged; NULL on a
    // device without streams or events). l3d_device_destroy frees them.
    void *comm_stream, *comm_ready;
    // Host bounce buffers the communicator stages through (comm_stage.c): page-locked where
    // the device pins (alloc_host), kept for the next call so that a staged collective does
    // not fault in fresh pages every time; `busy` while a schedule holds one. Used by the
    // thread that makes this device's communicator calls; l3d_device_destroy frees them.
    struct l3d_bounce {
        void *p;
        size_t n;
        int busy;
    } bounce[L3D_DEVICE_BOUNCE];
} l3d_device_t;

typedef enum l3d_copy_kind {
    L3D_COPY_H2D = 0,
    L3D_COPY_D2H = 1,
    L3D_COPY_D2D = 2,
} l3d_copy_kind;

// A GEMM in row-major terms: C(M,N) = alpha * op(A) * op(B) + beta * C, where op(A) is
// (M,K) and op(B) is (K,N). A is stored (M,K) with row stride lda, or (K,M) if trans_a;
// B is stored (K,N) with row stride ldb, or (N,K) if trans_b. A Linear layer y = x W^T with
// W (out,in) is trans_b = 1.
// Batched: batch > 1 runs `batch` such products, the i-th on A + i*stride_a, B + i*stride_b,
// C + i*stride_c (strides in elements; a stride of 0 shares that operand). batch 0 or 1 is one
// product and ignores the strides, so designated initialisers may leave them out.
// Dtypes (the shape cuBLASLt takes): each operand is L3D_FLOAT32 (0, the default),
// L3D_BFLOAT16 or L3D_FLOAT16; products and sums are float32 whatever they are (alpha and
// beta too), and a 16-bit C is rounded once, to nearest even, when the result is stored.
// beta 0 never reads C. Any other dtype is L3D_ERR_INVALID_ARG.
typedef struct l3d_gemm {
    int trans_a, trans_b;
    int M, N, K;
    float alpha, beta;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    void *C;
    int ldc;
    int batch;
    size_t stride_a, stride_b, stride_c;
    l3d_dtype a_type, b_type, c_type;
    // Nonzero: with a float32 A and a 16-bit B the device may round A to B's dtype first and
    // multiply in the CPU's 16-bit arithmetic (AVX512-BF16 dot products, AMX tiles): each
    // product then exact in float32 on the rounded A, the sums float32 (a bfloat16 model's
    // precision in torch and vLLM, and llama.cpp's for BF16 weights). A device without such
    // arithmetic reads A exactly, as with 0 (ABI 11).
    int round_a;
} l3d_gemm_t;

// Causal grouped-query attention dimensions. Queries are the last Tq positions of a
// sequence of Tk keys (Tq == Tk in training; Tq < Tk when decoding with a KV cache):
// query i sees keys j <= i + (Tk - Tq). H % KVH == 0; query head h uses kv head h/(H/KVH).
// kv_bstride: elements between batch entries of k and v (0 means Tk*KVH*D), so a KV cache
// of capacity Tmax can be passed without copying.
typedef struct l3d_attn_dims {
    int B, Tq, Tk, H, KVH, D;
    size_t kv_bstride;
} l3d_attn_dims_t;

// One tensor of an AdamW step (the adamw entry): n elements each of the float32 master
// `param` and moments `m`, `v`, the gradient `grad` (the step's gt), and `param16`: NULL, or
// where the updated param is stored rounded to the step's wt.
typedef struct l3d_adamw_tensor {
    float *param, *m, *v;
    const void *grad;
    void *param16;
    size_t n;
    float weight_decay;
} l3d_adamw_tensor_t;

// The scalars an AdamW step shares across its tensors (torch.optim.AdamW's, bc1/bc2 its bias
// corrections), the global norm's sum of squares in device memory or NULL, and the dtypes of
// the gradients (gt) and of the param16 copies (wt: L3D_BFLOAT16 or L3D_FLOAT16; unread when
// no tensor has one).
typedef struct l3d_adamw_step {
    float lr, beta1, beta2, eps, bc1, bc2, grad_scale, max_norm;
    const double *sumsq;
    l3d_dtype gt, wt;
} l3d_adamw_step_t;

struct l3d_device_ops {
    uint32_t abi_version;  // L3D_DEVICE_ABI_VERSION
    uint32_t size;         // sizeof(l3d_device_ops_t) the backend was built with
    const char *name;      // "cpu", "cuda"

    // ---- lifetime -------------------------------------------------------------------------
    // Initialises dev->priv and dev->num_threads. Blocking. On failure leaves nothing
    // allocated and records the cause with l3d_error on dev->ctx.
    l3d_status (*init)(l3d_device_t *dev, const l3d_device_params_t *params);
    // Releases everything init made. Buffers still allocated are the caller's leak.
    void (*fini)(l3d_device_t *dev);

    // ---- memory ---------------------------------------------------------------------------
    // Allocates `bytes` (0 gives a valid unique pointer or NULL, both freeable) aligned to at
    // least 64 bytes, contents undefined. `tag` is the accounting category (static string).
    l3d_status (*alloc)(l3d_device_t *dev, size_t bytes, const char *tag, void **ptr_p);
    // Frees what alloc returned; NULL is a no-op. `bytes` and `tag` are those given to alloc.
    void (*free)(l3d_device_t *dev, void *ptr, size_t bytes, const char *tag);
    // Nonzero when device pointers are host pointers (the caller may read them directly).
    int (*is_host)(const l3d_device_t *dev);
    // Nonzero when `ptr` points into memory this device allocated (with alloc), zero for
    // host memory. Non-blocking. Required when is_host is 0 (the communicator stages device
    // buffers through host memory and passes host buffers as they are: one call may have one
    // of each); NULL when is_host is nonzero, where every pointer is host memory.
    int (*is_device_ptr)(const l3d_device_t *dev, const void *ptr);
    // Copies `bytes`; host memory must stay valid until `sync` (async devices).
    l3d_status (*copy)(l3d_device_t *dev, void *dst, const void *src, size_t bytes,
                       l3d_copy_kind kind);
    // Sets `bytes` of device memory to the byte `value`.
    l3d_status (*memset)(l3d_device_t *dev, void *dst, int value, size_t bytes);
    // Blocks until every op issued so far (on every stream) has finished.
    l3d_status (*sync)(l3d_device_t *dev);
    // Host memory this device copies to and from (ZeRO offload keeps optimizer state and
    // parameter pieces there): page-locked when `pinned` (asynchronous DMA; pin_memory),
    // pageable otherwise; contents undefined, aligned to at least 64 bytes, `tag` as alloc.
    // Optional: NULL where the context's allocator serves (the CPU, whose memory is host
    // memory, and its test devices): the wrapper takes it from there, pinning means nothing.
    l3d_status (*alloc_host)(l3d_device_t *dev, size_t bytes, int pinned, const char *tag,
                             void **ptr_p);
    // Frees what alloc_host returned (NULL: no-op); bytes, pinned and tag as given to it.
    // Optional: NULL exactly when alloc_host is.
    void (*free_host)(l3d_device_t *dev, void *ptr, size_t bytes, int pinned, const char *tag);

    // ---- streams (optional: NULL on devices that run every op in order, like the CPU) -------
    // Creates an independent queue of ops (CUDA stream). *stream_p is opaque.
    l3d_status (*stream_create)(l3d_device_t *dev, void **stream_p);
    void (*stream_destroy)(l3d_device_t *dev, void *stream);
    // Blocks until the ops issued on `stream` have finished.
    l3d_status (*stream_sync)(l3d_device_t *dev, void *stream);

    // ---- events (optional: all four or none; NULL on devices with one in-order queue) --------
    // An event marks a point in a stream (CUDA events without timing). *event_p is opaque.
    l3d_status (*event_create)(l3d_device_t *dev, void **event_p);
    // Frees it; an event still waited on by an unfinished op stays valid until that op runs.
    void (*event_destroy)(l3d_device_t *dev, void *event);
    // Marks the point after every op issued so far on `stream` (NULL: the default stream),
    // replacing what the event marked before. Non-blocking.
    l3d_status (*event_record)(l3d_device_t *dev, void *event, void *stream);
    // Ops issued on `stream` from now on start only after the recorded point has finished.
    // Non-blocking (the host does not wait); an event never recorded is already finished.
    l3d_status (*stream_wait_event)(l3d_device_t *dev, void *stream, void *event);

    // The dense GEMM peak in FLOP/s with `dt` operands and float32 accumulation, from the
    // device's table (a GPU's datasheet figure for its model, without sparsity), the roof
    // MFU is reported against; 0 for a dtype or model it does not know. Non-blocking.
    // Optional: NULL where the roof is measured instead (the CPU: its sgemm,
    // l3d_gemm_peak_measure), which on a GPU would be the wrong roof for 16-bit training.
    double (*peak_flops)(const l3d_device_t *dev, l3d_dtype dt);

    // The device's own memory: bytes free for its allocations now (*free_bytes) and in all
    // (*total_bytes). Blocking (a driver query), allocates nothing. Optional: NULL where the
    // device's memory is the machine's (the CPU device), which core checks against what the
    // OS and the cgroup give.
    l3d_status (*mem_info)(const l3d_device_t *dev, uint64_t *free_bytes, uint64_t *total_bytes);

    // ---- ops ------------------------------------------------------------------------------
    l3d_status (*gemm)(l3d_device_t *dev, const l3d_gemm_t *g);

    // dst(n) (dst_type) = src(n) (src_type), for float32, bfloat16 and float16: widening is
    // exact; narrowing rounds to nearest, ties to even, overflows to inf, keeps inf and makes
    // NaN a quiet NaN. dst and src do not overlap unless they are the same pointer and type.
    // Other dtypes are L3D_ERR_INVALID_ARG.
    l3d_status (*convert)(l3d_device_t *dev, void *dst, l3d_dtype dst_type, const void *src,
                          l3d_dtype src_type, size_t n);

    // out(N,C) = table(V,C)[tokens(N)]. A token outside [0,V) is L3D_ERR_INVALID_ARG.
    // out: at; table: wt (a 16-bit row copied to a 16-bit out of the other kind is rounded).
    l3d_status (*embedding_fwd)(l3d_device_t *dev, void *out, const int32_t *tokens,
                                const void *table, int N, int C, int V, l3d_dtype at,
                                l3d_dtype wt);
    // dtable(V,C) += dout(N,C) scattered by tokens(N). dout: at; dtable: gt (each touched
    // element is summed in float32 over every occurrence of its token, then rounded once).
    l3d_status (*embedding_bwd)(l3d_device_t *dev, void *dtable, const void *dout,
                                const int32_t *tokens, int N, int C, l3d_dtype at, l3d_dtype gt);

    // out(N,C) = x / sqrt(mean(x^2) + eps) * w(C); rstd(N) = that 1/sqrt (rstd may be NULL).
    // out, x: at; w: wt.
    l3d_status (*rmsnorm_fwd)(l3d_device_t *dev, void *out, float *rstd, const void *x,
                              const void *w, int N, int C, float eps, l3d_dtype at, l3d_dtype wt);
    // dx(N,C) += d/dx, dw(C) += d/dw, given dout(N,C), x, w and rstd from the forward.
    // dx, dout, x: at; w: wt; dw: gt.
    l3d_status (*rmsnorm_bwd)(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                              const void *x, const void *w, const float *rstd, int N, int C,
                              l3d_dtype at, l3d_dtype wt, l3d_dtype gt);

    // In place on x(B,T,NH,D) (at), Hugging Face rotate-half convention: for i < D/2,
    // (x_i, x_{i+D/2}) is rotated by angle pos*inv_freq_i where pos = pos0 + t. cos/sin are
    // float32 tables (Tmax, D/2) with Tmax >= pos0 + T. inverse != 0 rotates by -angle (that
    // is the backward: the rotation is orthogonal).
    l3d_status (*rope)(l3d_device_t *dev, void *x, const float *cos_tab, const float *sin_tab,
                       int B, int T, int NH, int D, int pos0, int inverse, l3d_dtype at);

    // out(B,Tq,H,D) = softmax(q k^T / sqrt(D), causal) v, computed in O(Tq) extra memory
    // (online softmax). q (B,Tq,H,D), k and v (B,Tk,KVH,D) with batch stride kv_bstride.
    // lse(B,H,Tq) receives the log-sum-exp of each score row (scaled scores); may be NULL.
    // out, q, k, v: at; lse float32.
    l3d_status (*attention_fwd)(l3d_device_t *dev, void *out, float *lse, const void *q,
                                const void *k, const void *v, const l3d_attn_dims_t *d,
                                l3d_dtype at);
    // dq (B,Tq,H,D), dk and dv (B,Tk,KVH,D, contiguous) are overwritten, given dout, the
    // forward's inputs, its out and lse. Scores are recomputed from lse, not stored. Every
    // tensor but lse: at.
    l3d_status (*attention_bwd)(l3d_device_t *dev, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, const l3d_attn_dims_t *d,
                                l3d_dtype at);

    // out(n) = silu(gate) * up, silu(x) = x / (1 + exp(-x)). out may alias gate or up. All at.
    l3d_status (*swiglu_fwd)(l3d_device_t *dev, void *out, const void *gate, const void *up,
                             size_t n, l3d_dtype at);
    // dgate(n), dup(n) overwritten from dout(n). They may alias gate and up respectively. All at.
    l3d_status (*swiglu_bwd)(l3d_device_t *dev, void *dgate, void *dup, const void *dout,
                             const void *gate, const void *up, size_t n, l3d_dtype at);

    // out(n) = a + b. out may alias a or b. All at.
    l3d_status (*add)(l3d_device_t *dev, void *out, const void *a, const void *b, size_t n,
                      l3d_dtype at);
    // x(n) *= s; x: at.
    l3d_status (*scale)(l3d_device_t *dev, void *x, float s, size_t n, l3d_dtype at);

    // Fused softmax + cross-entropy over logits(N,V) (at), in place: on return logits holds
    // grad_scale * (softmax - onehot(target)) and losses(N) (float32) the per-row
    // -log p(target) (0 and a zero gradient row where target < 0). No second copy of the
    // logits is made in float32; a 16-bit row is widened one row at a time at most.
    // A target >= V is L3D_ERR_INVALID_ARG. losses may be NULL (gradient only).
    l3d_status (*xent_fwd_bwd)(l3d_device_t *dev, void *logits, float *losses,
                               const int32_t *targets, int N, int V, float grad_scale,
                               l3d_dtype at);

    // ---- vocabulary-parallel forms (tensor parallelism, Megatron) ----------------------------
    // This rank holds rows [v0, v0+Vl) of a vocabulary of V: of the embedding table (Vl,C)
    // and of the head, so its logits are the columns [v0, v0+Vl) (N,Vl). The tp group sums
    // or maxes the partial results in between (core/model/model_tp.c); nothing here communicates.
    // Dtypes as in the one-rank forms above.
    //
    // out(N,C) = table[tokens - v0] for tokens in [v0, v0+Vl), 0 for the others. A token
    // outside [0, V) is L3D_ERR_INVALID_ARG.
    l3d_status (*embedding_fwd_vp)(l3d_device_t *dev, void *out, const int32_t *tokens,
                                   const void *table, int N, int C, int v0, int Vl, int V,
                                   l3d_dtype at, l3d_dtype wt);
    // dtable(Vl,C) += dout(N,C) rows scattered by tokens in [v0, v0+Vl); others ignored.
    l3d_status (*embedding_bwd_vp)(l3d_device_t *dev, void *dtable, const void *dout,
                                   const int32_t *tokens, int N, int C, int v0, int Vl,
                                   l3d_dtype at, l3d_dtype gt);
    // Cross-entropy over logits split by columns, in three passes around two all-reduces
    // (rowmax, gmax, stats, gstats and losses float32; logits at):
    // 1. rowmax(N) = max of each row of this rank's logits(N,Vl).        -> all-reduce MAX
    l3d_status (*xent_vp_max)(l3d_device_t *dev, const void *logits, float *rowmax, int N,
                              int Vl, l3d_dtype at);
    // 2. stats(N,2): [n][0] = sum_j exp(logits[n][j] - gmax[n]); [n][1] = logits[n][target-v0]
    //    if this rank owns target[n] (v0 <= target < v0+Vl), else 0.  -> all-reduce SUM
    //    (targets < 0 give 0, 0). gmax is the all-reduced rowmax.
    l3d_status (*xent_vp_stats)(l3d_device_t *dev, const void *logits, const float *gmax,
                                const int32_t *targets, int N, int Vl, int v0, float *stats,
                                l3d_dtype at);
    // 3. In place: logits <- grad_scale * (exp(logits - gmax) / gstats[n][0] - onehot(target -
    //    v0)), and losses(N) = log(gstats[n][0]) + gmax[n] - gstats[n][1] (every rank computes
    //    the same losses; may be NULL). A row with target < 0 gets loss 0 and a zero gradient.
    //    With one rank (v0 = 0, Vl = V) the three passes equal xent_fwd_bwd.
    l3d_status (*xent_vp_grad)(l3d_device_t *dev, void *logits, float *losses, const float *gmax,
                               const float *gstats, const int32_t *targets, int N, int Vl, int v0,
                               float grad_scale, l3d_dtype at);

    // A multi-tensor norm (the gradient clipping norm in one call): *out = sum over k < n of
    // w[k] * sum of x[k](len[k])^2 (every x[k]: at), each tensor's sum accumulated in double
    // as a one-tensor call would, then the weighted sums added in k order (w NULL: weights 1).
    // out is device memory (one double); x, len and w are host arrays, read during the call.
    // Ordered on the stream like any op: the caller copies *out to the host (or a later op
    // reads it) after a wait. (ABI 7: was one blocking call per tensor with a host result,
    // which cost a device sync per tensor, 146 a step for a 1B model.)
    l3d_status (*sumsq)(l3d_device_t *dev, int n, const void *const *x, const size_t *len,
                        const double *w, double *out, l3d_dtype at);
    // *out = x[0] + ... + x[n-1] (doubles, device memory), added in index order from 0.0
    // (l3d_sum_f64_ordered): the per-rank parts of the norm, all-gathered, summed alike on
    // every rank. out may be one of the x. Ordered on the stream like any op.
    l3d_status (*sum_f64)(l3d_device_t *dev, double *out, const double *x, int n);

    // AdamW with torch.optim.AdamW semantics, one step over every element of n tensors:
    //   g = grad * grad_scale;  p *= 1 - lr * weight_decay
    //   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
    //   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
    // where bc1 = 1 - beta1^t and bc2 = 1 - beta2^t are given by the caller (s). Each tensor
    // (ts[i]) has its own weight decay; param, m and v are float32 (the master weights and
    // moments), grad is s->gt (a 16-bit model's gradients), and a non-NULL param16 receives
    // the new param rounded once to s->wt in the same pass (the 16-bit weights the next
    // forward reads: no separate convert over the whole model). param16 must not overlap any
    // tensor's param, m, v or grad. ts is a host array read during the call; tensors of 0
    // elements are skipped. One call per step, however many tensors (ABI 10: was one call per
    // tensor, 146 launches a step for a 1B model, and a convert after).
    // Gradient clipping on the device (ABI 8): with `sumsq` (one double in device memory, the
    // global sum of squares of the scaled gradients, as sumsq and sum_f64 leave it) the factor
    // is l3d_adamw_gscale(*sumsq, grad_scale, max_norm): grad_scale times
    // clip_grad_norm_'s coefficient for the norm sqrt(*sumsq) * grad_scale; and a non-finite
    // *sumsq (an overflow on some rank) leaves every param, m, v and param16 untouched, as
    // torch's fused AdamW does with found_inf. So no host read of the norm comes between the
    // backward and the update. sumsq NULL: the factor is grad_scale (max_norm unused).
    l3d_status (*adamw)(l3d_device_t *dev, const l3d_adamw_tensor_t *ts, int n,
                        const l3d_adamw_step_t *s);

    // ---- RMSNorm of rows split by columns (optional, all three or none) ---------------------
    // Tensor parallelism "2d" holds a block of columns of each row, so the row statistics are
    // a sum over ranks: rowdot gives this block's part, the caller all-reduces it over the
    // ranks sharing the rows, and the _rows ops finish with the sum. With one block holding
    // every column they are rmsnorm_fwd/bwd: rowdot(x, x) into rows_fwd (C_full = C) is
    // rmsnorm_fwd, rowdot(dout * w, x) into rows_bwd is rmsnorm_bwd.
    // out(N) (float32) = sum_c a(N,C) * b(N,C) * (w ? w(C) : 1), each row accumulated in
    // float32 in column order. a, b: at; w: wt (may be NULL).
    l3d_status (*rmsnorm_rowdot)(l3d_device_t *dev, float *out, const void *a, const void *b,
                                 const void *w, int N, int C, l3d_dtype at, l3d_dtype wt);
    // rstd(N) = 1 / sqrt(ss(N) / C_full + eps), out(N,C) = x * rstd * w(C); ss is the
    // all-reduced rowdot(x, x). out, x: at; w: wt; rstd may be NULL.
    l3d_status (*rmsnorm_rows_fwd)(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                   const void *w, const float *ss, int N, int C, int C_full,
                                   float eps, l3d_dtype at, l3d_dtype wt);
    // dx(N,C) += rstd*(dout*w) - rstd^3/C_full * x * dot, dw(C) += sum_n dout*x*rstd, where
    // dot(N) is the all-reduced rowdot(dout, x, w) and rstd the forward's.
    // dx, dout, x: at; w: wt; dw: gt.
    l3d_status (*rmsnorm_rows_bwd)(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                   const void *x, const void *w, const float *rstd,
                                   const float *dot, int N, int C, int C_full, l3d_dtype at,
                                   l3d_dtype wt, l3d_dtype gt);
};

// ---- registry (core/device.c, table generated by CMake) ---------------------------------
// The built devices, NULL-terminated (generated l3d_backends.c).
extern const l3d_device_ops_t *const l3d_device_backends[];
// l3d_device_create / l3d_device_destroy: include/llama3d/device.h.

// Converts n elements where they are (convert takes no overlapping ranges): p holds n src_t
// values and receives n dst_t values, both from its start, in chunks of `chunk` elements, the
// first through `scratch` (device memory for `chunk` elements of the narrower type). Each
// element is converted once, as by one convert into another buffer. core/device.c.
l3d_status l3d_dev_convert_in_place(l3d_device_t *dev, void *p, l3d_dtype dst_t,
                                    l3d_dtype src_t, size_t n, void *scratch, size_t chunk);

// ---- wrappers: the only way core/ reaches a device -----------------------------------------
static inline l3d_status l3d_dev_alloc(l3d_device_t *d, size_t bytes, const char *tag, void **p) {
    return d->ops->alloc(d, bytes, tag, p);
}
static inline void l3d_dev_free(l3d_device_t *d, void *p, size_t bytes, const char *tag) {
    d->ops->free(d, p, bytes, tag);
}
static inline int l3d_dev_is_host(const l3d_device_t *d) { return d->ops->is_host(d); }
static inline int l3d_dev_is_device_ptr(const l3d_device_t *d, const void *p) {
    return d->ops->is_device_ptr ? d->ops->is_device_ptr(d, p) : 0;
}
static inline l3d_status l3d_dev_alloc_host(l3d_device_t *d, size_t bytes, int pinned,
                                            const char *tag, void **p) {
    if (d->ops->alloc_host) return d->ops->alloc_host(d, bytes, pinned, tag, p);
    *p = l3d_malloc(d->ctx, bytes ? bytes : 1, tag);
    return *p ? L3D_OK : L3D_ERR_NOMEM;
}
static inline void l3d_dev_free_host(l3d_device_t *d, void *p, size_t bytes, int pinned,
                                     const char *tag) {
    if (d->ops->free_host) d->ops->free_host(d, p, bytes, pinned, tag);
    else if (p) l3d_free(d->ctx, p, bytes ? bytes : 1, tag);
}
static inline l3d_status l3d_dev_copy(l3d_device_t *d, void *dst, const void *src, size_t n,
                                      l3d_copy_kind k) {
    return d->ops->copy(d, dst, src, n, k);
}
static inline l3d_status l3d_dev_memset(l3d_device_t *d, void *dst, int v, size_t n) {
    return d->ops->memset(d, dst, v, n);
}
static inline l3d_status l3d_dev_sync(l3d_device_t *d) { return d->ops->sync(d); }
// Streams: on a device without them (NULL entries) there is one in-order queue, so creating
// a stream gives NULL and syncing one is a full sync.
static inline l3d_status l3d_dev_stream_create(l3d_device_t *d, void **s) {
    *s = NULL;
    return d->ops->stream_create ? d->ops->stream_create(d, s) : L3D_OK;
}
static inline void l3d_dev_stream_destroy(l3d_device_t *d, void *s) {
    if (d->ops->stream_destroy && s) d->ops->stream_destroy(d, s);
}
static inline l3d_status l3d_dev_stream_sync(l3d_device_t *d, void *s) {
    return d->ops->stream_sync ? d->ops->stream_sync(d, s) : d->ops->sync(d);
}
static inline void l3d_dev_set_stream(l3d_device_t *d, void *s) { d->stream = s; }
// Events: on a device without them every op runs in one order, so recording and waiting are
// nothing to do and creating one gives NULL.
static inline l3d_status l3d_dev_event_create(l3d_device_t *d, void **e) {
    *e = NULL;
    return d->ops->event_create ? d->ops->event_create(d, e) : L3D_OK;
}
static inline void l3d_dev_event_destroy(l3d_device_t *d, void *e) {
    if (d->ops->event_destroy && e) d->ops->event_destroy(d, e);
}
static inline l3d_status l3d_dev_event_record(l3d_device_t *d, void *e, void *stream) {
    return d->ops->event_record && e ? d->ops->event_record(d, e, stream) : L3D_OK;
}
static inline l3d_status l3d_dev_stream_wait_event(l3d_device_t *d, void *stream, void *e) {
    return d->ops->stream_wait_event && e ? d->ops->stream_wait_event(d, stream, e) : L3D_OK;
}
static inline double l3d_dev_peak_flops(const l3d_device_t *d, l3d_dtype dt) {
    return d->ops->peak_flops ? d->ops->peak_flops(d, dt) : 0.0;
}
// L3D_ERR_UNSUPPORTED when the device's memory is the machine's (mem_info NULL).
static inline l3d_status l3d_dev_mem_info(const l3d_device_t *d, uint64_t *free_bytes,
                                          uint64_t *total_bytes) {
    if (!d->ops->mem_info) return L3D_ERR_UNSUPPORTED;
    return d->ops->mem_info(d, free_bytes, total_bytes);
}
static inline l3d_status l3d_dev_convert(l3d_device_t *d, void *dst, l3d_dtype dst_type,
                                         const void *src, l3d_dtype src_type, size_t n) {
    return d->ops->convert(d, dst, dst_type, src, src_type, n);
}
static inline l3d_status l3d_dev_gemm(l3d_device_t *d, const l3d_gemm_t *g) {
    return d->ops->gemm(d, g);
}
static inline l3d_status l3d_dev_embedding_fwd(l3d_device_t *d, void *out, const int32_t *tok,
                                               const void *table, int N, int C, int V,
                                               l3d_dtype at, l3d_dtype wt) {
    return d->ops->embedding_fwd(d, out, tok, table, N, C, V, at, wt);
}
static inline l3d_status l3d_dev_embedding_bwd(l3d_device_t *d, void *dtable, const void *dout,
                                               const int32_t *tok, int N, int C, l3d_dtype at,
                                               l3d_dtype gt) {
    return d->ops->embedding_bwd(d, dtable, dout, tok, N, C, at, gt);
}
static inline l3d_status l3d_dev_rmsnorm_fwd(l3d_device_t *d, void *out, float *rstd,
                                             const void *x, const void *w, int N, int C,
                                             float eps, l3d_dtype at, l3d_dtype wt) {
    return d->ops->rmsnorm_fwd(d, out, rstd, x, w, N, C, eps, at, wt);
}
static inline l3d_status l3d_dev_rmsnorm_bwd(l3d_device_t *d, void *dx, void *dw,
                                             const void *dout, const void *x, const void *w,
                                             const float *rstd, int N, int C, l3d_dtype at,
                                             l3d_dtype wt, l3d_dtype gt) {
    return d->ops->rmsnorm_bwd(d, dx, dw, dout, x, w, rstd, N, C, at, wt, gt);
}
// The split-row RMSNorm entries are optional: one check, naming the device.
static inline l3d_status l3d_dev_rows_check(l3d_device_t *d) {
    if (d->ops->rmsnorm_rowdot && d->ops->rmsnorm_rows_fwd && d->ops->rmsnorm_rows_bwd)
        return L3D_OK;
    return l3d_error(d->ctx, L3D_ERR_UNSUPPORTED, "device '%s' has no RMSNorm over split rows "
                     "(needed by tp_mode 2d)", d->ops->name);
}
static inline l3d_status l3d_dev_rmsnorm_rowdot(l3d_device_t *d, float *out, const void *a,
                                                const void *b, const void *w, int N, int C,
                                                l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(d->ctx, l3d_dev_rows_check(d));
    return d->ops->rmsnorm_rowdot(d, out, a, b, w, N, C, at, wt);
}
static inline l3d_status l3d_dev_rmsnorm_rows_fwd(l3d_device_t *d, void *out, float *rstd,
                                                  const void *x, const void *w, const float *ss,
                                                  int N, int C, int C_full, float eps,
                                                  l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(d->ctx, l3d_dev_rows_check(d));
    return d->ops->rmsnorm_rows_fwd(d, out, rstd, x, w, ss, N, C, C_full, eps, at, wt);
}
static inline l3d_status l3d_dev_rmsnorm_rows_bwd(l3d_device_t *d, void *dx, void *dw,
                                                  const void *dout, const void *x, const void *w,
                                                  const float *rstd, const float *dot, int N,
                                                  int C, int C_full, l3d_dtype at, l3d_dtype wt,
                                                  l3d_dtype gt) {
    L3D_CHECK(d->ctx, l3d_dev_rows_check(d));
    return d->ops->rmsnorm_rows_bwd(d, dx, dw, dout, x, w, rstd, dot, N, C, C_full, at, wt, gt);
}
static inline l3d_status l3d_dev_rope(l3d_device_t *d, void *x, const float *cos_tab,
                                      const float *sin_tab, int B, int T, int NH, int D, int pos0,
                                      int inverse, l3d_dtype at) {
    return d->ops->rope(d, x, cos_tab, sin_tab, B, T, NH, D, pos0, inverse, at);
}
static inline l3d_status l3d_dev_attention_fwd(l3d_device_t *d, void *out, float *lse,
                                               const void *q, const void *k, const void *v,
                                               const l3d_attn_dims_t *dims, l3d_dtype at) {
    return d->ops->attention_fwd(d, out, lse, q, k, v, dims, at);
}
static inline l3d_status l3d_dev_attention_bwd(l3d_device_t *d, void *dq, void *dk, void *dv,
                                               const void *dout, const void *q, const void *k,
                                               const void *v, const void *out, const float *lse,
                                               const l3d_attn_dims_t *dims, l3d_dtype at) {
    return d->ops->attention_bwd(d, dq, dk, dv, dout, q, k, v, out, lse, dims, at);
}
static inline l3d_status l3d_dev_swiglu_fwd(l3d_device_t *d, void *out, const void *gate,
                                            const void *up, size_t n, l3d_dtype at) {
    return d->ops->swiglu_fwd(d, out, gate, up, n, at);
}
static inline l3d_status l3d_dev_swiglu_bwd(l3d_device_t *d, void *dgate, void *dup,
                                            const void *dout, const void *gate, const void *up,
                                            size_t n, l3d_dtype at) {
    return d->ops->swiglu_bwd(d, dgate, dup, dout, gate, up, n, at);
}
static inline l3d_status l3d_dev_add(l3d_device_t *d, void *out, const void *a, const void *b,
                                     size_t n, l3d_dtype at) {
    return d->ops->add(d, out, a, b, n, at);
}
static inline l3d_status l3d_dev_scale(l3d_device_t *d, void *x, float s, size_t n,
                                       l3d_dtype at) {
    return d->ops->scale(d, x, s, n, at);
}
static inline l3d_status l3d_dev_embedding_fwd_vp(l3d_device_t *d, void *out, const int32_t *tok,
                                                  const void *table, int N, int C, int v0, int Vl,
                                                  int V, l3d_dtype at, l3d_dtype wt) {
    return d->ops->embedding_fwd_vp(d, out, tok, table, N, C, v0, Vl, V, at, wt);
}
static inline l3d_status l3d_dev_embedding_bwd_vp(l3d_device_t *d, void *dtable,
                                                  const void *dout, const int32_t *tok, int N,
                                                  int C, int v0, int Vl, l3d_dtype at,
                                                  l3d_dtype gt) {
    return d->ops->embedding_bwd_vp(d, dtable, dout, tok, N, C, v0, Vl, at, gt);
}
static inline l3d_status l3d_dev_xent_vp_max(l3d_device_t *d, const void *logits, float *rowmax,
                                             int N, int Vl, l3d_dtype at) {
    return d->ops->xent_vp_max(d, logits, rowmax, N, Vl, at);
}
static inline l3d_status l3d_dev_xent_vp_stats(l3d_device_t *d, const void *logits,
                                               const float *gmax, const int32_t *targets, int N,
                                               int Vl, int v0, float *stats, l3d_dtype at) {
    return d->ops->xent_vp_stats(d, logits, gmax, targets, N, Vl, v0, stats, at);
}
static inline l3d_status l3d_dev_xent_vp_grad(l3d_device_t *d, void *logits, float *losses,
                                              const float *gmax, const float *gstats,
                                              const int32_t *targets, int N, int Vl, int v0,
                                              float grad_scale, l3d_dtype at) {
    return d->ops->xent_vp_grad(d, logits, losses, gmax, gstats, targets, N, Vl, v0, grad_scale,
                                at);
}
static inline l3d_status l3d_dev_xent_fwd_bwd(l3d_device_t *d, void *logits, float *losses,
                                              const int32_t *targets, int N, int V,
                                              float grad_scale, l3d_dtype at) {
    return d->ops->xent_fwd_bwd(d, logits, losses, targets, N, V, grad_scale, at);
}
static inline l3d_status l3d_dev_sumsq_multi(l3d_device_t *d, int n, const void *const *x,
                                             const size_t *len, const double *w, double *out,
                                             l3d_dtype at) {
    return d->ops->sumsq(d, n, x, len, w, out, at);
}
// One tensor: *out (device memory) = sum of x(n)^2.
static inline l3d_status l3d_dev_sumsq(l3d_device_t *d, const void *x, size_t n, double *out,
                                       l3d_dtype at) {
    return d->ops->sumsq(d, 1, &x, &n, NULL, out, at);
}
static inline l3d_status l3d_dev_sum_f64(l3d_device_t *d, double *out, const double *x, int n) {
    return d->ops->sum_f64(d, out, x, n);
}
static inline l3d_status l3d_dev_adamw_multi(l3d_device_t *d, const l3d_adamw_tensor_t *ts,
                                             int n, const l3d_adamw_step_t *s) {
    return d->ops->adamw(d, ts, n, s);
}
// One tensor, no 16-bit copy.
static inline l3d_status l3d_dev_adamw(l3d_device_t *d, float *p, const void *g, float *m,
                                       float *v, size_t n, float lr, float b1, float b2,
                                       float eps, float wd, float bc1, float bc2, float gscale,
                                       const double *sumsq, float max_norm, l3d_dtype gt) {
    l3d_adamw_tensor_t t = {p, m, v, g, NULL, n, wd};
    l3d_adamw_step_t s = {lr, b1, b2, eps, bc1, bc2, gscale, max_norm, sumsq, gt, L3D_FLOAT32};
    return d->ops->adamw(d, &t, 1, &s);
}

#endif
