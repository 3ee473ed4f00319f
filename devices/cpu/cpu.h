// Internals of the CPU device: its private state, the thread-pool helpers every kernel uses,
// and the op entry points the table in cpu_device.c points at.
// defines: l3d_cpu_t, l3d_cpu_run, l3d_cpu_scratch_*, l3d_cpu_<op>
//
// Threading model: the device owns one l3d_pool_t and is the only source of threads
// (OpenBLAS is pinned to one thread and called from inside our tasks). Every kernel splits its
// work into tasks whose boundaries depend only on the shapes, never on the thread count, and
// every reduction sums fixed-size partials in a fixed order, so the results are bit-identical
// for any number of threads.
#ifndef L3D_DEVICES_CPU_H
#define L3D_DEVICES_CPU_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/l3d_core.h"
#include "devices/device.h"
#include "platform/platform.h"

typedef struct l3d_cpu {
    l3d_allocator_t pool_alloc;  // routes the pool's own memory through the ctx
    l3d_pool_t *pool;
    int nthreads;
    // Per-thread scratch: at most `nthreads` tasks run at once, so a task takes a free slot
    // (atomic flag) for the duration of its run. The contents never leak into results.
    atomic_int *slot_busy;  // (nthreads)
    float *scratch;         // (nthreads, scratch_slot_floats)
    size_t scratch_bytes;   // allocated size of `scratch`
    size_t scratch_slot_floats;
    // The float32 copies of one op's 16-bit operands (l3d_cpu_wide): grown to the largest an
    // op has needed, kept until fini. Ops run one after another, so one serves them all.
    float *wide;
    size_t wide_bytes;
    // The CPU's 16-bit arithmetic bfloat16 x bfloat16 GEMMs use (cpu_gemm_bf16.c): one of
    // L3D_CPU_BF16_*, the best the CPU has unless L3D_CPU_BF16 asks for less.
    int bf16;
    int has_dp;  // the CPU has AVX512-BF16 dot products (gemm's round_a matrix-vector kernel)
} l3d_cpu_t;

// bfloat16 GEMM levels (cpu_gemm_bf16.c): OFF widens to float32 for sgemm.
enum { L3D_CPU_BF16_OFF = 0, L3D_CPU_BF16_AVX512 = 1, L3D_CPU_BF16_AMX = 2 };
int l3d_cpu_bf16_probe(void);  // the best level this CPU and kernel allow
const char *l3d_cpu_bf16_name(int level);  // "off", "avx512", "amx"
// Bytes of scratch one task needs for a tile of tile_m x tile_n over K.
size_t l3d_cpu_gemm_bf16_scratch(int tile_m, int tile_n, int K);
void l3d_cpu_gemm_bf16_tile(int level, const l3d_gemm_t *g, int i0, int m, int j0, int n,
                            void *scratch);
// gemm's round_a at the matrix-vector shape (M <= L3D_CPU_GEMV_MAX_M, !trans_a, trans_b,
// float32 A and C, bfloat16 B, K >= 1) on a CPU with has_dp: A's rows rounded to bfloat16,
// AVX512-BF16 dot products against B's rows as stored.
l3d_status l3d_cpu_gemv_round_a(l3d_device_t *dev, const l3d_gemm_t *g);

static inline l3d_cpu_t *l3d_cpu_priv(const l3d_device_t *dev) { return (l3d_cpu_t *)dev->priv; }

// Runs fn(arg, task, ntasks) for every task on the device's pool (the caller works too).
void l3d_cpu_run(l3d_device_t *dev, l3d_pool_fn fn, void *arg, int ntasks);

// Makes sure every slot has `slot_floats` floats (64-byte aligned). Call before l3d_cpu_run;
// inside tasks use acquire/release. The buffer is reused between ops (one stream per device).
l3d_status l3d_cpu_scratch_reserve(l3d_device_t *dev, size_t slot_floats);
float *l3d_cpu_scratch_acquire(l3d_cpu_t *cpu, int *slot_p);
void l3d_cpu_scratch_release(l3d_cpu_t *cpu, int slot);

// ---- vectorisation ---------------------------------------------------------------------------
// Kernel files compile their loops with the full vectoriser (-O2's "very cheap" model skips
// every loop with a remainder) and, on x86-64 ELF with GCC, hot functions are cloned for
// AVX2 and AVX-512 and picked at load time from the CPU (ifunc), with the baseline (SSE2)
// version as the fallback, so no machine-specific flag is needed at build time. The build is
// ISO C (-std=c11, hence -ffp-contract=off): elementwise results are identical in every clone.
// no-trapping-math: l3d_expf's selects (`x < lo ? 0 : p * scale`) evaluate both sides in
// a vector; under the default -ftrapping-math GCC will not compute a float product the scalar
// code might skip, so every loop calling it (swiglu, softmax, cross-entropy) stayed scalar:
// swiglu was 7.5% of a prompt pass. Nothing here reads the floating-point exception flags,
// and each lane computes what the scalar code did: the same bits.
#if defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)  // not in -O0 builds
#define L3D_CPU_VECTORIZE _Pragma("GCC optimize(\"O3\", \"no-math-errno\", \"no-trapping-math\")")
#else
#define L3D_CPU_VECTORIZE
#endif
// Helpers are always_inline: GCC does not inline across differing optimize/target options,
// and they must be compiled inside each clone to vectorise for it.
#if defined(__GNUC__)
#define L3D_CPU_INLINE static inline __attribute__((always_inline))
#else
#define L3D_CPU_INLINE static inline
#endif
// ThreadSanitizer instruments the ifunc resolvers, which run before its runtime is up: no
// clones under -fsanitize=thread.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) && \
    !defined(__SANITIZE_THREAD__) && !defined(L3D_CPU_NO_CLONES)
#define L3D_CPU_SIMD __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define L3D_CPU_SIMD
#endif

// Row reductions in a fixed order that vectorises without reassociation: 16 interleaved
// partials, folded pairwise, then the tail. Deterministic for a given n.
// The max is exact, so its order does not matter; the vectoriser will not turn `a > m ? a : m`
// into a vector max (NaN rules), hence GCC vector types, which lower to whatever the clone has.
#if defined(__GNUC__)
typedef float l3d_cpu_v16f __attribute__((vector_size(64)));
typedef int32_t l3d_cpu_v16i __attribute__((vector_size(64)));
#endif
L3D_CPU_INLINE float l3d_cpu_maxf(const float *restrict x, int n, float init) {
    float m = init;
    int i = 0;
#if defined(__GNUC__)
    if (n >= 16) {
        l3d_cpu_v16f acc;
        memcpy(&acc, x, sizeof(acc));
        for (i = 16; i + 16 <= n; i += 16) {
            l3d_cpu_v16f v;
            memcpy(&v, x + i, sizeof(v));
            l3d_cpu_v16i gt = v > acc;
            acc = (l3d_cpu_v16f)(((l3d_cpu_v16i)v & gt) | ((l3d_cpu_v16i)acc & ~gt));
        }
        float lanes[16];
        memcpy(lanes, &acc, sizeof(lanes));
        for (int k = 0; k < 16; k++) m = lanes[k] > m ? lanes[k] : m;
    }
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}
L3D_CPU_INLINE float l3d_cpu_sumf(const float *restrict x, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += x[i + k];
    for (int w = 8; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) acc[k] += acc[k + w];
    float s = acc[0];
    for (; i < n; i++) s += x[i];
    return s;
}
L3D_CPU_INLINE double l3d_cpu_sumd(const float *restrict x, int n) {
    double acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k];
    for (int w = 4; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) acc[k] += acc[k + w];
    double s = acc[0];
    for (; i < n; i++) s += (double)x[i];
    return s;
}
// The dot product in the same order as the reductions above (16 partials, folded 8, 4, 2, 1,
// then the tail), the partials one 16-lane vector so the fold stays in registers (the array
// form spilled them and reloaded lane by lane: ~8% of decode's matrix-vector products at
// K = 384) and the AVX-512 clone runs one instruction where two 8-lane halves took two (the
// matrix-vector product was issue-bound: 23 GB/s a core against 31 for the same loop in
// zmm). Lane k of the vector is partial k: the same bits as the array form in every clone.
#if defined(__GNUC__) && (defined(__clang__) || __GNUC__ >= 12)
#define L3D_CPU_HAVE_V8F 1
typedef float l3d_cpu_v8f __attribute__((vector_size(32)));
typedef float l3d_cpu_v4f __attribute__((vector_size(16)));
typedef uint16_t l3d_cpu_v16u16 __attribute__((vector_size(32)));
typedef uint32_t l3d_cpu_v16u32 __attribute__((vector_size(64)));
// 16 partials folded as the array reductions fold them. By pointer: a vector passed by value
// draws GCC's psABI note in the baseline (SSE) clone.
L3D_CPU_INLINE float l3d_cpu_fold16(const l3d_cpu_v16f *acc) {
    l3d_cpu_v8f h8 = __builtin_shufflevector(*acc, *acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                     __builtin_shufflevector(*acc, *acc, 8, 9, 10, 11, 12, 13, 14, 15);
    l3d_cpu_v4f h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) +
                     __builtin_shufflevector(h8, h8, 4, 5, 6, 7);  // acc[k] += acc[k + 4]
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);                      // then + 2, + 1
}
// 16 elements of row b from i: float32, or bfloat16 (the top halves of float32s) widened
// exactly in registers, so a bfloat16 row gives the bits of its widened float32 row and
// streams at half the bytes. `bf16` is a constant at every call site.
L3D_CPU_INLINE void l3d_cpu_row16(l3d_cpu_v16f *v, const void *b, int bf16, int i) {
    if (bf16) {
        l3d_cpu_v16u16 h;  // one load widened straight from memory (vpmovzxwd)
        memcpy(&h, (const uint16_t *)b + i, sizeof(h));
        l3d_cpu_v16u32 w = __builtin_convertvector(h, l3d_cpu_v16u32) << 16;
        memcpy(v, &w, sizeof(*v));
    } else {
        memcpy(v, (const float *)b + i, sizeof(*v));
    }
}
L3D_CPU_INLINE float l3d_cpu_elem(const void *b, int bf16, int i) {
    if (!bf16) return ((const float *)b)[i];
    uint32_t u = (uint32_t)((const uint16_t *)b)[i] << 16;
    float w;
    memcpy(&w, &u, sizeof(w));
    return w;
}
L3D_CPU_INLINE float l3d_cpu_dot_any(const float *restrict a, const void *restrict b, int bf16,
                                     int n) {
    l3d_cpu_v16f acc = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        l3d_cpu_v16f x, w;
        memcpy(&x, a + i, sizeof(x));
        l3d_cpu_row16(&w, b, bf16, i);
        acc += x * w;
    }
    float s = l3d_cpu_fold16(&acc);
    for (; i < n; i++) s += a[i] * l3d_cpu_elem(b, bf16, i);
    return s;
}
L3D_CPU_INLINE float l3d_cpu_dotf(const float *restrict a, const float *restrict b, int n) {
    return l3d_cpu_dot_any(a, b, 0, n);
}
// Four dot products of one a with rows b[0..3], each in l3d_cpu_dotf's order (the same bits
// as four calls): four weight rows stream at once, more loads in flight than one row's short
// loop and fold allow.
L3D_CPU_INLINE void l3d_cpu_dotf4(const float *restrict a, const void *const b[4], int bf16,
                                  int n, float out[4]) {
    l3d_cpu_v16f acc[4] = {{0}};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        l3d_cpu_v16f x;
        memcpy(&x, a + i, sizeof(x));
        for (int r = 0; r < 4; r++) {
            l3d_cpu_v16f w;
            l3d_cpu_row16(&w, b[r], bf16, i);
            acc[r] += x * w;
        }
    }
    for (int r = 0; r < 4; r++) {
        float s = l3d_cpu_fold16(&acc[r]);
        for (int k = i; k < n; k++) s += a[k] * l3d_cpu_elem(b[r], bf16, k);
        out[r] = s;
    }
}
// l3d_cpu_dot_any with the 16 partials in two 8-lane halves (lo: 0-7, hi: 8-15), for CPUs
// without AVX-512, one weight row at a time. There a 16-lane vector is two registers: four
// rows of them at once (l3d_cpu_dotf4) kept the accumulators on the stack, and even in
// registers four interleaved rows streamed at half the speed of one (2-core Zen EPYC, a
// 128256 x 384 matrix: bfloat16 5 against 10-11 GB/s, float32 7 against 9.7). The same bits:
// lo + hi is fold16's first step.
typedef uint16_t l3d_cpu_v8u16 __attribute__((vector_size(16)));
typedef uint32_t l3d_cpu_v8u32 __attribute__((vector_size(32)));
L3D_CPU_INLINE void l3d_cpu_row8(l3d_cpu_v8f *v, const void *b, int bf16, int i) {
    if (bf16) {
        l3d_cpu_v8u16 h;
        memcpy(&h, (const uint16_t *)b + i, sizeof(h));
        l3d_cpu_v8u32 w = __builtin_convertvector(h, l3d_cpu_v8u32) << 16;
        memcpy(v, &w, sizeof(*v));
    } else {
        memcpy(v, (const float *)b + i, sizeof(*v));
    }
}
L3D_CPU_INLINE float l3d_cpu_dot_halves(const float *restrict a, const void *restrict b,
                                        int bf16, int n) {
    l3d_cpu_v8f lo = {0}, hi = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        l3d_cpu_v8f x0, x1, w0, w1;
        memcpy(&x0, a + i, sizeof(x0));
        memcpy(&x1, a + i + 8, sizeof(x1));
        l3d_cpu_row8(&w0, b, bf16, i);
        l3d_cpu_row8(&w1, b, bf16, i + 8);
        lo += x0 * w0;
        hi += x1 * w1;
    }
    l3d_cpu_v8f h8 = lo + hi;  // acc[k] += acc[k + 8]
    l3d_cpu_v4f h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) +
                     __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
    float s = (h4[0] + h4[2]) + (h4[1] + h4[3]);
    for (; i < n; i++) s += a[i] * l3d_cpu_elem(b, bf16, i);
    return s;
}
#else
#define L3D_CPU_HAVE_V8F 0
L3D_CPU_INLINE float l3d_cpu_dotf(const float *restrict a, const float *restrict b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += a[i + k] * b[i + k];
    for (int w = 8; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) acc[k] += acc[k + w];
    float s = acc[0];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
#endif

// Fixed chunk for elementwise ops and for the partials of reductions.
#define L3D_CPU_CHUNK 16384

// ---- ops (the contracts are in devices/device.h) -------------------------------------------
l3d_status l3d_cpu_gemm(l3d_device_t *dev, const l3d_gemm_t *g);
l3d_status l3d_cpu_convert(l3d_device_t *dev, void *dst, l3d_dtype dst_type, const void *src,
                           l3d_dtype src_type, size_t n);
// The conversion itself, dtypes already checked (cpu_convert.c); gemm widens with it.
void l3d_cpu_convert_run(l3d_device_t *dev, void *dst, l3d_dtype dst_type, const void *src,
                         l3d_dtype src_type, size_t n);
int l3d_cpu_dtype_ok(l3d_dtype t);  // float32, bfloat16 or float16
// The few-row form of gemm (cpu_gemv.c): !trans_a, trans_b, 1 <= M <= L3D_CPU_GEMV_MAX_M,
// K >= 1, strides already checked. l3d_cpu_gemm picks it by shape alone. 16: a batch of up to
// 16 decoding sequences streams each weight once (sgemm packed every weight matrix per call:
// l3d serve at 16 streams 0.79 -> 1.02x llama-server's tokens/s, bench/README.md).
#define L3D_CPU_GEMV_MAX_M 16
void l3d_cpu_gemv(l3d_device_t *dev, const l3d_gemm_t *g);
// Whether the matrix-vector kernel reads these dtypes directly: A and C float32, B float32
// or bfloat16 (a bfloat16 weight streams at half the bytes). Others go through widened copies.
int l3d_cpu_gemv_takes(const l3d_gemm_t *g);
// The entries below take the dtypes of devices/device.h (ABI 5). Each float32 kernel is the
// arithmetic; a 16-bit tensor reaches it widened (exact) and leaves it rounded once, by one of
// three means, chosen per op so no op makes a float32 copy of something model-sized:
// - elementwise ops (swiglu, add, scale, sumsq, adamw) widen each L3D_CPU_CHUNK of their
//   operands into the running thread's scratch slot (the chunks are the tasks' own);
// - cross-entropy widens blocks of logit rows (the rows are independent), the embedding
//   converts the rows it copies and, backward, widens only the table rows its tokens touch;
// - norms, rope and attention widen their (activation-sized) operands whole for the op's
//   duration (l3d_cpu_args_widen below), as gemm does its 16-bit operands.
// Every path gives the bits of the float32 kernel on the widened inputs, rounded once.
l3d_status l3d_cpu_embedding_fwd(l3d_device_t *dev, void *out, const int32_t *tokens,
                                 const void *table, int N, int C, int V, l3d_dtype at,
                                 l3d_dtype wt);
l3d_status l3d_cpu_embedding_bwd(l3d_device_t *dev, void *dtable, const void *dout,
                                 const int32_t *tokens, int N, int C, l3d_dtype at, l3d_dtype gt);
l3d_status l3d_cpu_rmsnorm_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                               const void *w, int N, int C, float eps, l3d_dtype at,
                               l3d_dtype wt);
l3d_status l3d_cpu_rmsnorm_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                               const void *x, const void *w, const float *rstd, int N, int C,
                               l3d_dtype at, l3d_dtype wt, l3d_dtype gt);
l3d_status l3d_cpu_rmsnorm_rowdot(l3d_device_t *dev, float *out, const void *a, const void *b,
                                  const void *w, int N, int C, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_cpu_rmsnorm_rows_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                    const void *w, const float *ss, int N, int C, int C_full,
                                    float eps, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_cpu_rmsnorm_rows_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                    const void *x, const void *w, const float *rstd,
                                    const float *dot, int N, int C, int C_full, l3d_dtype at,
                                    l3d_dtype wt, l3d_dtype gt);
l3d_status l3d_cpu_rope(l3d_device_t *dev, void *x, const float *cos_tab, const float *sin_tab,
                        int B, int T, int NH, int D, int pos0, int inverse, l3d_dtype at);
l3d_status l3d_cpu_attention_fwd(l3d_device_t *dev, void *out, float *lse, const void *q,
                                 const void *k, const void *v, const l3d_attn_dims_t *d,
                                 l3d_dtype at);
l3d_status l3d_cpu_attention_bwd(l3d_device_t *dev, void *dq, void *dk, void *dv,
                                 const void *dout, const void *q, const void *k, const void *v,
                                 const void *out, const float *lse, const l3d_attn_dims_t *d,
                                 l3d_dtype at);
l3d_status l3d_cpu_swiglu_fwd(l3d_device_t *dev, void *out, const void *gate, const void *up,
                              size_t n, l3d_dtype at);
l3d_status l3d_cpu_swiglu_bwd(l3d_device_t *dev, void *dgate, void *dup, const void *dout,
                              const void *gate, const void *up, size_t n, l3d_dtype at);
l3d_status l3d_cpu_add(l3d_device_t *dev, void *out, const void *a, const void *b, size_t n,
                       l3d_dtype at);
l3d_status l3d_cpu_scale(l3d_device_t *dev, void *x, float s, size_t n, l3d_dtype at);
l3d_status l3d_cpu_xent_fwd_bwd(l3d_device_t *dev, void *logits, float *losses,
                                const int32_t *targets, int N, int V, float grad_scale,
                                l3d_dtype at);
l3d_status l3d_cpu_embedding_fwd_vp(l3d_device_t *dev, void *out, const int32_t *tokens,
                                    const void *table, int N, int C, int v0, int Vl, int V,
                                    l3d_dtype at, l3d_dtype wt);
l3d_status l3d_cpu_embedding_bwd_vp(l3d_device_t *dev, void *dtable, const void *dout,
                                    const int32_t *tokens, int N, int C, int v0, int Vl,
                                    l3d_dtype at, l3d_dtype gt);
l3d_status l3d_cpu_xent_vp_max(l3d_device_t *dev, const void *logits, float *rowmax, int N,
                               int Vl, l3d_dtype at);
l3d_status l3d_cpu_xent_vp_stats(l3d_device_t *dev, const void *logits, const float *gmax,
                                 const int32_t *targets, int N, int Vl, int v0, float *stats,
                                 l3d_dtype at);
l3d_status l3d_cpu_xent_vp_grad(l3d_device_t *dev, void *logits, float *losses,
                                const float *gmax, const float *gstats, const int32_t *targets,
                                int N, int Vl, int v0, float grad_scale, l3d_dtype at);
l3d_status l3d_cpu_sumsq(l3d_device_t *dev, int n, const void *const *x, const size_t *len,
                         const double *w, double *out, l3d_dtype at);
l3d_status l3d_cpu_sum_f64(l3d_device_t *dev, double *out, const double *x, int n);
l3d_status l3d_cpu_adamw(l3d_device_t *dev, const l3d_adamw_tensor_t *ts, int n,
                         const l3d_adamw_step_t *s);

// ---- 16-bit operands (cpu_convert.c) --------------------------------------------------------
// Elements [0, n) converted from src_type to dst_type on the calling thread (for use inside a
// task; l3d_cpu_convert_run spreads big conversions over the pool and must not be nested).
void l3d_cpu_convert_serial(void *dst, l3d_dtype dst_type, const void *src, l3d_dtype src_type,
                            size_t n);
// Nonzero (and an error naming op and arg recorded) unless t is float32, bfloat16 or float16.
int l3d_cpu_dtype_bad(l3d_device_t *dev, const char *op, const char *arg, l3d_dtype t);

// At least `floats` floats of the device's workspace (64-byte aligned; NULL and an error
// recorded when it cannot grow). Valid until the next call: one op's operands at a time.
float *l3d_cpu_wide(l3d_device_t *dev, size_t floats);

// One tensor operand of an op, seen as float32: `f` is `p` itself for a float32 tensor, else a
// float32 copy of its n elements, converted in when it is read (L3D_CPU_IN) and rounded back
// once when it is written (L3D_CPU_OUT) and the op succeeded. Two operands with the same p
// (an output aliasing an input) share one copy. p NULL: an absent operand, f NULL.
#define L3D_CPU_IN 1
#define L3D_CPU_OUT 2
typedef struct l3d_cpu_arg {
    const char *name;  // for the dtype error
    const void *p;
    l3d_dtype t;
    size_t n;
    int io;
    float *f;
    int owner;  // this entry allocated f (the first of the operands sharing it)
} l3d_cpu_arg_t;
static inline l3d_cpu_arg_t l3d_cpu_arg(const char *name, const void *p, l3d_dtype t, size_t n,
                                        int io) {
    l3d_cpu_arg_t a = {name, p, t, n, io, NULL, 0};
    return a;
}
l3d_status l3d_cpu_args_widen(l3d_device_t *dev, const char *op, l3d_cpu_arg_t *a, int n);
// Rounds the written operands back when `store`; the copies were the workspace's.
void l3d_cpu_args_narrow(l3d_device_t *dev, l3d_cpu_arg_t *a, int n, int store);
// A row kernel over a 16-bit (N,V) matrix m: rows are widened R at a time (R a few per
// thread), fn runs on the float32 block (rows [r0, r0+nrows) of m), and, when `write`, the
// block is rounded back. The caller checks what would make fn fail part way (targets) first,
// so an error leaves m untouched. N <= 0 or V <= 0: fn(dev, m, 0, N) alone, for the kernel's
// own shape checks (or its rows with no element).
typedef l3d_status (*l3d_cpu_rows_fn)(l3d_device_t *dev, float *rows, int r0, int nrows,
                                      void *arg);
l3d_status l3d_cpu_rows_widened(l3d_device_t *dev, const char *op, void *m, l3d_dtype t, int N,
                                int V, int write, l3d_cpu_rows_fn fn, void *arg);
// Element count of a (rows, cols) operand; 0 for a negative dimension (the kernel rejects it).
static inline size_t l3d_cpu_elems(long long rows, long long cols) {
    return rows > 0 && cols > 0 ? (size_t)rows * (size_t)cols : 0;
}

#endif
