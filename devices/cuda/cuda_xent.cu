// The CUDA device's fused cross-entropy: softmax, loss and gradient written over the logits in
// place, one block per row, the exp sum in double (rows are up to 128k long) by a fixed tree;
// and its vocabulary-parallel passes (row max, the row's sums, the gradient). The CPU device's
// formulas (devices/cpu/cpu_xent.c, cpu_vocab.c): loss = log(sum) - (z_t - max) in double,
// gradient = exp(z - max) * (grad_scale / sum), minus grad_scale at the target.
// defines: l3d_cuda_xent_fwd_bwd, l3d_cuda_xent_vp_max, l3d_cuda_xent_vp_stats,
//          l3d_cuda_xent_vp_grad
#include "devices/cuda/cuda.h"

enum { XT = 512 };

// The row's sum of exp(z - mx) in double, each thread over its strided columns.
__device__ static double row_exp_sum(const void *z, int at, size_t row, int V, float mx) {
    double s = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        s += (double)l3d_expf(l3d_cu_ld(z, at, row + i) - mx);
    return l3d_cu_block_sum_d(s);
}

__device__ static float row_max(const void *z, int at, size_t row, int V) {
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, l3d_cu_ld(z, at, row + i));
    return l3d_cu_block_max(m);
}

// Row n in place: zero for an ignored row (target < 0); a target >= V raises the bad-input
// flag and leaves the row as it was (the CPU device refuses the call before touching any).
__global__ static void k_xent(void *z, float *losses, const int32_t *targets, int V,
                              float grad_scale, int at, int *bad) {
    size_t row = (size_t)blockIdx.x * (size_t)V;
    int t = targets[blockIdx.x];
    if (t >= V) {
        if (threadIdx.x == 0) *bad = 1;
        return;
    }
    if (t < 0) {
        for (int i = threadIdx.x; i < V; i += blockDim.x) l3d_cu_st(z, at, row + i, 0.0f);
        if (losses && threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        return;
    }
    float mx = row_max(z, at, row, V);
    float zt = l3d_cu_ld(z, at, row + t) - mx;  // (read before any thread overwrites it)
    double sum = row_exp_sum(z, at, row, V, mx);
    if (losses && threadIdx.x == 0) losses[blockIdx.x] = (float)(log(sum) - (double)zt);
    float k = (float)((double)grad_scale / sum);
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float g = l3d_expf(l3d_cu_ld(z, at, row + i) - mx) * k;
        if (i == t) g -= grad_scale;
        l3d_cu_st(z, at, row + i, g);
    }
}

extern "C" l3d_status l3d_cuda_xent_fwd_bwd(l3d_device_t *dev, void *logits, float *losses,
                                            const int32_t *targets, int N, int V, float grad_scale,
                                            l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "xent_fwd_bwd", "logits", at));
    if (N < 0 || V <= 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "xent: bad shape N %d V %d", N, V);
    if (!N) return L3D_OK;
    k_xent<<<N, XT, 0, l3d_cuda_stream(dev)>>>(logits, losses, targets, V, grad_scale, at,
                                               l3d_cuda_priv(dev)->bad);
    L3D_CU_LAUNCHED(dev, "xent_fwd_bwd");
    return L3D_OK;
}

// ---- vocabulary-parallel passes ----------------------------------------------------------------
// 1. rowmax(N): the max of this rank's columns (-inf with none)
__global__ static void k_vp_max(const void *z, float *rowmax, int Vl, int at) {
    float m = row_max(z, at, (size_t)blockIdx.x * (size_t)Vl, Vl);
    if (threadIdx.x == 0) rowmax[blockIdx.x] = m;
}

extern "C" l3d_status l3d_cuda_xent_vp_max(l3d_device_t *dev, const void *logits, float *rowmax,
                                           int N, int Vl, l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "xent_vp_max", "logits", at));
    if (N < 0 || Vl < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "xent_vp_max: bad shape N %d Vl %d", N, Vl);
    if (!N) return L3D_OK;
    k_vp_max<<<N, XT, 0, l3d_cuda_stream(dev)>>>(logits, rowmax, Vl, at);
    L3D_CU_LAUNCHED(dev, "xent_vp_max");
    return L3D_OK;
}

// 2. stats(N,2) = [sum exp(z - gmax) (double, stored float), the owned target's logit or 0];
//    (0, 0) for an ignored row
__global__ static void k_vp_stats(const void *z, const float *gmax, const int32_t *targets, int Vl,
                                  int v0, float *stats, int at) {
    size_t row = (size_t)blockIdx.x * (size_t)Vl;
    int t = targets[blockIdx.x];
    float *st = stats + 2 * (size_t)blockIdx.x;
    if (t < 0) {
        if (threadIdx.x == 0) st[0] = st[1] = 0.0f;
        return;
    }
    double sum = row_exp_sum(z, at, row, Vl, gmax[blockIdx.x]);
    if (threadIdx.x == 0) {
        st[0] = (float)sum;
        st[1] = t >= v0 && t < v0 + Vl ? l3d_cu_ld(z, at, row + (t - v0)) : 0.0f;
    }
}

extern "C" l3d_status l3d_cuda_xent_vp_stats(l3d_device_t *dev, const void *logits,
                                             const float *gmax, const int32_t *targets, int N,
                                             int Vl, int v0, float *stats, l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "xent_vp_stats", "logits", at));
    if (N < 0 || Vl < 0 || v0 < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "xent_vp_stats: bad shape N %d Vl %d v0 %d",
                         N, Vl, v0);
    if (!N) return L3D_OK;
    k_vp_stats<<<N, XT, 0, l3d_cuda_stream(dev)>>>(logits, gmax, targets, Vl, v0, stats, at);
    L3D_CU_LAUNCHED(dev, "xent_vp_stats");
    return L3D_OK;
}

// 3. in place: grad_scale * (exp(z - gmax) / gstats[0] - onehot); losses from the sums
__global__ static void k_vp_grad(void *z, float *losses, const float *gmax, const float *gstats,
                                 const int32_t *targets, int Vl, int v0, float grad_scale, int at) {
    size_t row = (size_t)blockIdx.x * (size_t)Vl;
    int t = targets[blockIdx.x];
    if (t < 0) {
        for (int i = threadIdx.x; i < Vl; i += blockDim.x) l3d_cu_st(z, at, row + i, 0.0f);
        if (losses && threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        return;
    }
    float mx = gmax[blockIdx.x];
    double sum = (double)gstats[2 * (size_t)blockIdx.x];
    float zt = gstats[2 * (size_t)blockIdx.x + 1] - mx;
    if (losses && threadIdx.x == 0) losses[blockIdx.x] = (float)(log(sum) - (double)zt);
    float k = (float)((double)grad_scale / sum);
    int tl = t - v0;  // (owned when in [0, Vl))
    for (int i = threadIdx.x; i < Vl; i += blockDim.x) {
        float g = l3d_expf(l3d_cu_ld(z, at, row + i) - mx) * k;
        if (i == tl) g -= grad_scale;
        l3d_cu_st(z, at, row + i, g);
    }
}

extern "C" l3d_status l3d_cuda_xent_vp_grad(l3d_device_t *dev, void *logits, float *losses,
                                            const float *gmax, const float *gstats,
                                            const int32_t *targets, int N, int Vl, int v0,
                                            float grad_scale, l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "xent_vp_grad", "logits", at));
    if (N < 0 || Vl < 0 || v0 < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "xent_vp_grad: bad shape N %d Vl %d v0 %d",
                         N, Vl, v0);
    if (!N) return L3D_OK;
    k_vp_grad<<<N, XT, 0, l3d_cuda_stream(dev)>>>(logits, losses, gmax, gstats, targets, Vl, v0,
                                                  grad_scale, at);
    L3D_CU_LAUNCHED(dev, "xent_vp_grad");
    return L3D_OK;
}
