// The CUDA device's elementwise entries and reductions: convert, add, scale, SwiGLU forward
// and backward, the multi-tensor sum of squares, the ordered double sum, and AdamW. The math is
// devices/device_math.h's (the CPU device computes the same lines); every 16-bit output is
// rounded once (l3d_cu_st). Reductions are deterministic: a fixed grid of blocks, each summing a
// fixed strided subset in double and folding it in a fixed tree, the block partials then added
// in index order by one thread. No floating-point atomics.
// defines: l3d_cuda_convert, l3d_cuda_add, l3d_cuda_scale, l3d_cuda_swiglu_fwd,
//          l3d_cuda_swiglu_bwd, l3d_cuda_sumsq, l3d_cuda_sum_f64, l3d_cuda_adamw
#include "devices/cuda/cuda.h"

enum { EW_THREADS = 256, SQ_BLOCKS = 256, SQ_THREADS = 256 };

#define GRID_STRIDE(i, n)                                                   \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

// ---- convert -----------------------------------------------------------------------------------
// dst(n) (dt) = src(n) (st): widening exact, narrowing to nearest even (device_math.h).
__global__ static void k_convert(void *dst, int dt, const void *src, int st, size_t n) {
    GRID_STRIDE(i, n) l3d_cu_st(dst, dt, i, l3d_cu_ld(src, st, i));
}

extern "C" l3d_status l3d_cuda_convert(l3d_device_t *dev, void *dst, l3d_dtype dst_type,
                                       const void *src, l3d_dtype src_type, size_t n) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "convert", "dst", dst_type));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "convert", "src", src_type));
    if (!n) return L3D_OK;
    cudaStream_t s = l3d_cuda_stream(dev);
    if (dst_type == src_type) {
        if (dst != src)
            L3D_CU_CHECK(dev,
                         cudaMemcpyAsync(dst, src, n * l3d_dtype_size(dst_type),
                                         cudaMemcpyDeviceToDevice, s),
                         "convert");
        return L3D_OK;
    }
    k_convert<<<l3d_cu_blocks(n, EW_THREADS), EW_THREADS, 0, s>>>(dst, dst_type, src, src_type, n);
    L3D_CU_LAUNCHED(dev, "convert");
    return L3D_OK;
}

// ---- add, scale --------------------------------------------------------------------------------
// out(n) = a + b; out may alias a or b (each element is read before it is written)
__global__ static void k_add(void *out, const void *a, const void *b, size_t n, int t) {
    GRID_STRIDE(i, n) l3d_cu_st(out, t, i, l3d_cu_ld(a, t, i) + l3d_cu_ld(b, t, i));
}

extern "C" l3d_status l3d_cuda_add(l3d_device_t *dev, void *out, const void *a, const void *b,
                                   size_t n, l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "add", "at", at));
    if (!n) return L3D_OK;
    k_add<<<l3d_cu_blocks(n, EW_THREADS), EW_THREADS, 0, l3d_cuda_stream(dev)>>>(out, a, b, n, at);
    L3D_CU_LAUNCHED(dev, "add");
    return L3D_OK;
}

// x(n) *= s
__global__ static void k_scale(void *x, float s, size_t n, int t) {
    GRID_STRIDE(i, n) l3d_cu_st(x, t, i, l3d_cu_ld(x, t, i) * s);
}

extern "C" l3d_status l3d_cuda_scale(l3d_device_t *dev, void *x, float s, size_t n, l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "scale", "at", at));
    if (!n) return L3D_OK;
    k_scale<<<l3d_cu_blocks(n, EW_THREADS), EW_THREADS, 0, l3d_cuda_stream(dev)>>>(x, s, n, at);
    L3D_CU_LAUNCHED(dev, "scale");
    return L3D_OK;
}

// ---- SwiGLU ------------------------------------------------------------------------------------
// out(n) = silu(gate) * up; out may alias gate or up
__global__ static void k_swiglu_fwd(void *out, const void *gate, const void *up, size_t n, int t) {
    GRID_STRIDE(i, n) l3d_cu_st(out, t, i, l3d_swiglu(l3d_cu_ld(gate, t, i), l3d_cu_ld(up, t, i)));
}

extern "C" l3d_status l3d_cuda_swiglu_fwd(l3d_device_t *dev, void *out, const void *gate,
                                          const void *up, size_t n, l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "swiglu_fwd", "at", at));
    if (!n) return L3D_OK;
    k_swiglu_fwd<<<l3d_cu_blocks(n, EW_THREADS), EW_THREADS, 0, l3d_cuda_stream(dev)>>>(out, gate,
                                                                                        up, n, at);
    L3D_CU_LAUNCHED(dev, "swiglu_fwd");
    return L3D_OK;
}

// dgate(n), dup(n) from dout(n); dgate may alias gate, dup up (each thread reads its element
// of all three before writing either)
__global__ static void k_swiglu_bwd(void *dgate, void *dup, const void *dout, const void *gate,
                                    const void *up, size_t n, int t) {
    GRID_STRIDE(i, n) {
        float dg, du;
        l3d_swiglu_grad(l3d_cu_ld(gate, t, i), l3d_cu_ld(up, t, i), l3d_cu_ld(dout, t, i), &dg,
                        &du);
        l3d_cu_st(dgate, t, i, dg);
        l3d_cu_st(dup, t, i, du);
    }
}

extern "C" l3d_status l3d_cuda_swiglu_bwd(l3d_device_t *dev, void *dgate, void *dup,
                                          const void *dout, const void *gate, const void *up,
                                          size_t n, l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "swiglu_bwd", "at", at));
    if (!n) return L3D_OK;
    k_swiglu_bwd<<<l3d_cu_blocks(n, EW_THREADS), EW_THREADS, 0, l3d_cuda_stream(dev)>>>(
        dgate, dup, dout, gate, up, n, at);
    L3D_CU_LAUNCHED(dev, "swiglu_bwd");
    return L3D_OK;
}

// ---- sums of squares ---------------------------------------------------------------------------
// Block b of SQ_BLOCKS sums x[i]^2 in double for i = b*SQ_THREADS + t + j*SQ_BLOCKS*SQ_THREADS,
// each thread in j order, the block's threads folded pairwise (a fixed tree): part[b]. The
// partition depends on n alone, so the result does too.
__global__ static void k_sumsq_part(const void *x, size_t n, int t, double *part) {
    __shared__ double acc[SQ_THREADS];
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * SQ_THREADS + threadIdx.x; i < n;
         i += (size_t)SQ_BLOCKS * SQ_THREADS) {
        double v = (double)l3d_cu_ld(x, t, i);
        s += v * v;
    }
    acc[threadIdx.x] = s;
    __syncthreads();
    for (int w = SQ_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = acc[0];
}

// out = sum over k < n of w[k] * (part[k][0] + ... + part[k][SQ_BLOCKS-1]), every sum in
// index order (one thread).
__global__ static void k_sumsq_final(const double *part, const double *w, int n, double *out) {
    double acc = 0.0;
    for (int k = 0; k < n; k++) {
        double s = l3d_sum_f64_ordered(part + (size_t)k * SQ_BLOCKS, SQ_BLOCKS);
        acc += (w ? w[k] : 1.0) * s;
    }
    *out = acc;
}

extern "C" l3d_status l3d_cuda_sumsq(l3d_device_t *dev, int n, const void *const *x,
                                     const size_t *len, const double *w, double *out,
                                     l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "sumsq", "x", at));
    if (n < 0) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "sumsq: %d tensors", n);
    cudaStream_t s = l3d_cuda_stream(dev);
    // scratch: n x SQ_BLOCKS partials, then the n weights (copied from the host array, which
    // the contract lets the caller reuse once this returns: a pageable copy is staged before
    // cudaMemcpyAsync returns)
    void *scr;
    size_t nparts = (size_t)(n ? n : 1) * SQ_BLOCKS;
    L3D_CHECK(dev->ctx,
              l3d_cuda_scratch(dev, (nparts + (size_t)(n ? n : 1)) * sizeof(double), &scr));
    double *part = (double *)scr, *wd = part + nparts;
    for (int k = 0; k < n; k++) {
        if (!len[k]) {
            L3D_CU_CHECK(
                dev,
                cudaMemsetAsync(part + (size_t)k * SQ_BLOCKS, 0, SQ_BLOCKS * sizeof(double), s),
                "sumsq");
            continue;
        }
        k_sumsq_part<<<SQ_BLOCKS, SQ_THREADS, 0, s>>>(x[k], len[k], at,
                                                      part + (size_t)k * SQ_BLOCKS);
        L3D_CU_LAUNCHED(dev, "sumsq");
    }
    if (w && n)
        L3D_CU_CHECK(dev,
                     cudaMemcpyAsync(wd, w, (size_t)n * sizeof(double), cudaMemcpyHostToDevice, s),
                     "sumsq");
    k_sumsq_final<<<1, 1, 0, s>>>(part, w ? wd : NULL, n, out);
    L3D_CU_LAUNCHED(dev, "sumsq");
    return L3D_OK;
}

// *out = x[0] + ... + x[n-1] in index order (out may be one of the x: read first)
__global__ static void k_sum_f64(double *out, const double *x, int n) {
    *out = l3d_sum_f64_ordered(x, n);
}

extern "C" l3d_status l3d_cuda_sum_f64(l3d_device_t *dev, double *out, const double *x, int n) {
    if (n < 0) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "sum_f64: %d values", n);
    k_sum_f64<<<1, 1, 0, l3d_cuda_stream(dev)>>>(out, x, n);
    L3D_CU_LAUNCHED(dev, "sum_f64");
    return L3D_OK;
}

// ---- AdamW -------------------------------------------------------------------------------------
// torch.optim.AdamW's step (device_math.h) over many tensors in one launch (apex's and
// torchtitan's multi-tensor apply): the tensors travel in the kernel's parameters, AW_TENSORS
// at a time (under the classic 4 KiB parameter limit), each cut into chunks of AW_CHUNK
// elements; block b finds its tensor from the chunk prefix `first`. The gradient factor comes
// from the norm in device memory when given (clipping; a non-finite norm skips the step, as
// torch's found_inf does), and each updated master weight is rounded once into the tensor's
// 16-bit copy where it has one, in the same pass.
enum { AW_TENSORS = 48, AW_CHUNK = EW_THREADS * 16 };

typedef struct {
    l3d_adamw_tensor_t t[AW_TENSORS];
    float decay[AW_TENSORS];           // 1 - lr * weight_decay, as l3d_adamw_consts rounds it
    unsigned first[AW_TENSORS + 1];    // the first chunk (block) of each tensor; first[n]: all
    int n;
} aw_batch_t;

__global__ static void k_adamw(const aw_batch_t b, l3d_adamw_k_t k, int gt, int wt,
                               const double *sumsq, float max_norm) {
    if (sumsq) {
        double ss = *sumsq;
        if (!isfinite(ss)) return;
        k.gscale = l3d_adamw_gscale(ss, k.gscale, max_norm);
    }
    unsigned blk = blockIdx.x;
    int lo = 0, hi = b.n - 1;  // the last tensor whose first chunk is <= blk
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b.first[mid] <= blk) lo = mid;
        else hi = mid - 1;
    }
    const l3d_adamw_tensor_t t = b.t[lo];
    k.decay = b.decay[lo];
    size_t i0 = (size_t)(blk - b.first[lo]) * AW_CHUNK;
    size_t i1 = i0 + AW_CHUNK < t.n ? i0 + AW_CHUNK : t.n;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        l3d_adamw_elem(&k, l3d_cu_ld(t.grad, gt, i), &t.param[i], &t.m[i], &t.v[i]);
        if (t.param16) l3d_cu_st(t.param16, wt, i, t.param[i]);
    }
}

// Launches the tensors gathered in *b (none: nothing) and empties it.
static l3d_status aw_launch(l3d_device_t *dev, aw_batch_t *b, l3d_adamw_k_t k,
                            const l3d_adamw_step_t *s) {
    unsigned blocks = b->first[b->n];
    b->n = 0;
    if (!blocks) return L3D_OK;
    k_adamw<<<blocks, EW_THREADS, 0, l3d_cuda_stream(dev)>>>(*b, k, s->gt, s->wt, s->sumsq,
                                                              s->max_norm);
    L3D_CU_LAUNCHED(dev, "adamw");
    return L3D_OK;
}

extern "C" l3d_status l3d_cuda_adamw(l3d_device_t *dev, const l3d_adamw_tensor_t *ts, int n,
                                     const l3d_adamw_step_t *s) {
    if (n < 0 || (n && !ts) || !s)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "adamw: %d tensors", n);
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "adamw", "grad", s->gt));
    if (!(s->bc1 > 0.0f) || !(s->bc2 > 0.0f))
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "adamw: bias corrections bc1 %g bc2 %g must be > 0", (double)s->bc1,
                         (double)s->bc2);
    const unsigned max_blocks = 0x7fffffffu;  // (a grid's x dimension)
    l3d_adamw_k_t k = l3d_adamw_consts(s->lr, s->beta1, s->beta2, s->eps, 0.0f, s->bc1, s->bc2,
                                       s->grad_scale);
    aw_batch_t b;
    b.n = 0;
    b.first[0] = 0;
    for (int i = 0; i < n; i++) {
        const l3d_adamw_tensor_t *t = &ts[i];
        if (!t->n) continue;
        if (t->param16) L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "adamw", "wt", s->wt));
        size_t chunks = (t->n + AW_CHUNK - 1) / AW_CHUNK;
        if (chunks > max_blocks)
            return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "adamw: tensor %d of %zu elements "
                             "exceeds one launch", i, t->n);
        if (b.n == AW_TENSORS || chunks > max_blocks - b.first[b.n])
            L3D_CHECK(dev->ctx, aw_launch(dev, &b, k, s));
        b.t[b.n] = *t;
        b.decay[b.n] = l3d_adamw_consts(s->lr, s->beta1, s->beta2, s->eps, t->weight_decay,
                                        s->bc1, s->bc2, s->grad_scale).decay;
        b.first[b.n + 1] = b.first[b.n] + (unsigned)chunks;
        b.n++;
    }
    return aw_launch(dev, &b, k, s);
}
