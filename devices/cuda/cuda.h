// The CUDA device's private header: its state, the error plumbing from CUDA's and cuBLASLt's
// codes to l3d_status, the dtype loads and stores every kernel uses, and the entries each
// file exports to cuda_device.cu's table.
// defines: l3d_cuda_t, l3d_cuda_priv, L3D_CU_CHECK, l3d_cuda_fail, l3d_cu_ld, l3d_cu_st,
//          l3d_cuda_* entries
//
// Compiled by nvcc as C++ (the .cu files) against the C headers, whose declarations keep C
// linkage. Kernels are `static` (internal linkage), so the archive's global symbols stay the
// l3d_ ones (.ci/run's prefix check); nvcc's own registration symbols are the only others.
#ifndef L3D_CUDA_H
#define L3D_CUDA_H

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "devices/device.h"
}

// A freed block kept for reuse (the caching allocator, cuda_device.cu): free_list[k] holds
// blocks of 512 << k bytes, most recently freed first.
typedef struct l3d_cuda_block {
    void *p;
    struct l3d_cuda_block *next;
} l3d_cuda_block_t;

typedef struct l3d_cuda {
    int index;            // the GPU
    int tf32;             // float32 GEMMs on TF32 tensor cores (params->allow_tf32)
    cudaDeviceProp prop;  // its facts (name, SMs, memory)
    cudaStream_t stream;  // the device's own stream (dev->stream NULL means this one)
    // cuBLASLt (cuda_gemm.cu): the handle, a 32 MiB workspace, the heuristics cached per shape
    void *lt;
    struct l3d_cuda_lt *lt_api;  // the library's entries (opened with the device)
    void *workspace;
    size_t workspace_bytes;
    struct l3d_cuda_plan *plans;
    int nplans, cap_plans;
    // The caching allocator: freed blocks by size class (powers of two from 512 bytes up to
    // 2^40), reused before cudaMalloc is asked again; `cached` bytes held that way.
    l3d_cuda_block_t *free_list[32];
    size_t cached;
    // Per-op scratch on the device (partials of reductions), grown on demand, freed at fini.
    void *scratch;
    size_t scratch_bytes;
    // An op that finds bad input in device memory (a token outside the vocabulary) sets this
    // flag; sync reads it and reports L3D_ERR_INVALID_ARG, as the CPU device does at once.
    int *bad;
} l3d_cuda_t;

static inline l3d_cuda_t *l3d_cuda_priv(const l3d_device_t *dev) {
    return (l3d_cuda_t *)dev->priv;
}
static inline cudaStream_t l3d_cuda_stream(const l3d_device_t *dev) {
    return dev->stream ? (cudaStream_t)dev->stream : l3d_cuda_priv(dev)->stream;
}

extern "C" {
// CUDA's error in llama3d's words: the op, CUDA's name and message (which say "no CUDA-capable
// device is detected" or "driver version is insufficient" where there is no GPU).
l3d_status l3d_cuda_fail(l3d_device_t *dev, cudaError_t e, const char *what);
#define L3D_CU_CHECK(dev, call, what)                                   \
    do {                                                                \
        cudaError_t e_ = (call);                                        \
        if (e_ != cudaSuccess) return l3d_cuda_fail((dev), e_, (what)); \
    } while (0)
// After a kernel launch: a bad configuration is reported at once, a fault at the next sync.
#define L3D_CU_LAUNCHED(dev, what) L3D_CU_CHECK((dev), cudaGetLastError(), (what))

// Device scratch of at least `bytes` (grown, never shrunk; stream-ordered: an op that uses it
// is ordered after the previous user on the one stream).
l3d_status l3d_cuda_scratch(l3d_device_t *dev, size_t bytes, void **p);
// The dtype argument check every entry starts with (float32, bfloat16, float16).
l3d_status l3d_cuda_dtype_check(l3d_device_t *dev, const char *op, const char *arg, l3d_dtype t);
}

// ---- dtype loads and stores: float32 arithmetic, one rounding per 16-bit store ----------------
#ifdef __CUDACC__
__device__ static inline float l3d_cu_ld(const void *p, int t, size_t i) {
    if (t == L3D_FLOAT32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == L3D_BFLOAT16 ? l3d_bf16_to_f32(h) : l3d_f16_to_f32(h);
}
__device__ static inline void l3d_cu_st(void *p, int t, size_t i, float v) {
    if (t == L3D_FLOAT32) {
        ((float *)p)[i] = v;
        return;
    }
    ((uint16_t *)p)[i] = t == L3D_BFLOAT16 ? l3d_f32_to_bf16(v) : l3d_f32_to_f16(v);
}
// Block reductions in a fixed order (each warp by an xor tree of shuffles, then warp 0 over
// the warp values); every thread of the block gets the result. blockDim a multiple of 32.
template <typename T, typename Op>
__device__ static inline T l3d_cu_block_reduce(T v, Op op, T identity) {
    __shared__ T warp_vals[32];
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();  // (warp_vals may still be read by the previous call)
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    v = lane < nw ? warp_vals[lane] : identity;
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
struct l3d_cu_add_op {
    template <typename T>
    __device__ T operator()(T a, T b) const {
        return a + b;
    }
};
struct l3d_cu_max_op {  // (NaN-free inputs: a max is exact, so its order does not matter)
    __device__ float operator()(float a, float b) const {
        return fmaxf(a, b);
    }
};
__device__ static inline float l3d_cu_block_sum(float v) {
    return l3d_cu_block_reduce(v, l3d_cu_add_op(), 0.0f);
}
__device__ static inline double l3d_cu_block_sum_d(double v) {
    return l3d_cu_block_reduce(v, l3d_cu_add_op(), 0.0);
}
__device__ static inline float l3d_cu_block_max(float v) {
    return l3d_cu_block_reduce(v, l3d_cu_max_op(), -INFINITY);
}
// Blocks for n elements at `threads` per block, at most 65535 * 64 (grid-stride loops do the rest).
static inline unsigned l3d_cu_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 4194240 ? 4194240 : b);
}
#endif

// ---- entries (each file's) -------------------------------------------------------------------
extern "C" {
// cuda_gemm.cu
l3d_status l3d_cuda_gemm(l3d_device_t *dev, const l3d_gemm_t *g);
l3d_status l3d_cuda_gemm_init(l3d_device_t *dev);
void l3d_cuda_gemm_fini(l3d_device_t *dev);
// cuda_elementwise.cu
l3d_status l3d_cuda_convert(l3d_device_t *dev, void *dst, l3d_dtype dst_type, const void *src,
                            l3d_dtype src_type, size_t n);
l3d_status l3d_cuda_add(l3d_device_t *dev, void *out, const void *a, const void *b, size_t n,
                        l3d_dtype at);
l3d_status l3d_cuda_scale(l3d_device_t *dev, void *x, float s, size_t n, l3d_dtype at);
l3d_status l3d_cuda_swiglu_fwd(l3d_device_t *dev, void *out, const void *gate, const void *up,
                               size_t n, l3d_dtype at);
l3d_status l3d_cuda_swiglu_bwd(l3d_device_t *dev, void *dgate, void *dup, const void *dout,
                               const void *gate, const void *up, size_t n, l3d_dtype at);
l3d_status l3d_cuda_sumsq(l3d_device_t *dev, int n, const void *const *x, const size_t *len,
                          const double *w, double *out, l3d_dtype at);
l3d_status l3d_cuda_sum_f64(l3d_device_t *dev, double *out, const double *x, int n);
l3d_status l3d_cuda_adamw(l3d_device_t *dev, const l3d_adamw_tensor_t *ts, int n,
                          const l3d_adamw_step_t *s);
// cuda_norm.cu
l3d_status l3d_cuda_rmsnorm_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                const void *w, int N, int C, float eps, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_cuda_rmsnorm_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                const void *x, const void *w, const float *rstd, int N, int C,
                                l3d_dtype at, l3d_dtype wt, l3d_dtype gt);
l3d_status l3d_cuda_rmsnorm_rowdot(l3d_device_t *dev, float *out, const void *a, const void *b,
                                   const void *w, int N, int C, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_cuda_rmsnorm_rows_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                     const void *w, const float *ss, int N, int C, int C_full,
                                     float eps, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_cuda_rmsnorm_rows_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                     const void *x, const void *w, const float *rstd,
                                     const float *dot, int N, int C, int C_full, l3d_dtype at,
                                     l3d_dtype wt, l3d_dtype gt);
l3d_status l3d_cuda_rope(l3d_device_t *dev, void *x, const float *cos_tab, const float *sin_tab,
                         int B, int T, int NH, int D, int pos0, int inverse, l3d_dtype at);
l3d_status l3d_cuda_embedding_fwd(l3d_device_t *dev, void *out, const int32_t *tokens,
                                  const void *table, int N, int C, int V, l3d_dtype at,
                                  l3d_dtype wt);
l3d_status l3d_cuda_embedding_bwd(l3d_device_t *dev, void *dtable, const void *dout,
                                  const int32_t *tokens, int N, int C, l3d_dtype at, l3d_dtype gt);
l3d_status l3d_cuda_embedding_fwd_vp(l3d_device_t *dev, void *out, const int32_t *tokens,
                                     const void *table, int N, int C, int v0, int Vl, int V,
                                     l3d_dtype at, l3d_dtype wt);
l3d_status l3d_cuda_embedding_bwd_vp(l3d_device_t *dev, void *dtable, const void *dout,
                                     const int32_t *tokens, int N, int C, int v0, int Vl,
                                     l3d_dtype at, l3d_dtype gt);
// cuda_attention.cu
l3d_status l3d_cuda_attention_fwd(l3d_device_t *dev, void *out, float *lse, const void *q,
                                  const void *k, const void *v, const l3d_attn_dims_t *d,
                                  l3d_dtype at);
l3d_status l3d_cuda_attention_bwd(l3d_device_t *dev, void *dq, void *dk, void *dv, const void *dout,
                                  const void *q, const void *k, const void *v, const void *out,
                                  const float *lse, const l3d_attn_dims_t *d, l3d_dtype at);
// cuda_xent.cu
l3d_status l3d_cuda_xent_fwd_bwd(l3d_device_t *dev, void *logits, float *losses,
                                 const int32_t *targets, int N, int V, float grad_scale,
                                 l3d_dtype at);
l3d_status l3d_cuda_xent_vp_max(l3d_device_t *dev, const void *logits, float *rowmax, int N, int Vl,
                                l3d_dtype at);
l3d_status l3d_cuda_xent_vp_stats(l3d_device_t *dev, const void *logits, const float *gmax,
                                  const int32_t *targets, int N, int Vl, int v0, float *stats,
                                  l3d_dtype at);
l3d_status l3d_cuda_xent_vp_grad(l3d_device_t *dev, void *logits, float *losses, const float *gmax,
                                 const float *gstats, const int32_t *targets, int N, int Vl, int v0,
                                 float grad_scale, l3d_dtype at);
}

#endif
