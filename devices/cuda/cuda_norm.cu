// The CUDA device's RMSNorm (forward and backward, whole rows and rows split by columns for
// tensor parallelism 2d), RoPE and embedding entries (one-rank and vocabulary-parallel).
// Float32 arithmetic, one rounding per 16-bit store, and determinism: row statistics are a
// fixed tree over a fixed block; the weight gradients of RMSNorm are per-chunk partials added
// in chunk order; the embedding's scatter-add walks each token's occurrences in order (no
// atomics).
// defines: l3d_cuda_rmsnorm_fwd, l3d_cuda_rmsnorm_bwd, l3d_cuda_rmsnorm_rowdot,
//          l3d_cuda_rmsnorm_rows_fwd, l3d_cuda_rmsnorm_rows_bwd, l3d_cuda_rope,
//          l3d_cuda_embedding_fwd, l3d_cuda_embedding_bwd, l3d_cuda_embedding_fwd_vp,
//          l3d_cuda_embedding_bwd_vp
#include "devices/cuda/cuda.h"

enum { ROW_THREADS = 256, ROWS_PER_CHUNK = 64, COL_THREADS = 256 };

// ---- RMSNorm -----------------------------------------------------------------------------------
// The whole-row entries are the split-row ones with the row's own statistic (ss / dot NULL)
// and C_full = C, as on the CPU device: one body each, so rowdot(x, x) into rows_fwd is
// rmsnorm_fwd's arithmetic, and rowdot(dout, x, w) into rows_bwd is rmsnorm_bwd's.

// sum_c a(row, c) * w(c) * b(row, c) (w NULL: a * b) over the C columns of one row, in float32:
// thread t adds columns t, t + blockDim, ... in order, then the block's fixed tree (every
// thread gets the sum; called by every thread of the block).
__device__ static float row_dot(const void *a, const void *b, const void *w, size_t row, int C,
                                int at, int wt) {
    float s = 0.0f;
    if (w)  // (a * w) first, then * b: the order the CPU device takes dout * w * x in
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            s += l3d_cu_ld(a, at, row + c) * l3d_cu_ld(w, wt, c) * l3d_cu_ld(b, at, row + c);
    else
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            s += l3d_cu_ld(a, at, row + c) * l3d_cu_ld(b, at, row + c);
    return l3d_cu_block_sum(s);
}

// out(N) = row_dot of each row of a(N,C), b(N,C), w(C) or NULL: one block per row.
__global__ static void k_rmsnorm_rowdot(float *out, const void *a, const void *b, const void *w,
                                        int C, int at, int wt) {
    float s = row_dot(a, b, w, (size_t)blockIdx.x * (size_t)C, C, at, wt);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// out(N,C) = x * rstd * w, rstd(N) = 1 / sqrt(ss / C_full + eps), ss(N) given (the all-reduced
// rowdot(x, x)) or, when NULL, the row's own sum of x^2: one block per row.
__global__ static void k_rmsnorm_fwd(void *out, float *rstd, const void *x, const void *w,
                                     const float *ss_in, int C, int C_full, float eps, int at,
                                     int wt) {
    size_t row = (size_t)blockIdx.x * (size_t)C;
    float ss = ss_in ? ss_in[blockIdx.x] : row_dot(x, x, NULL, row, C, at, wt);
    float rs = 1.0f / sqrtf(ss / (float)C_full + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        l3d_cu_st(out, at, row + c, l3d_cu_ld(x, at, row + c) * rs * l3d_cu_ld(w, wt, c));
    if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

static l3d_status rmsnorm_fwd(l3d_device_t *dev, const char *op, void *out, float *rstd,
                              const void *x, const void *w, const float *ss, int N, int C,
                              int C_full, float eps, l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "x", at));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "w", wt));
    if (N < 0 || C <= 0 || C_full < C)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s: bad shape N %d C %d (of %d)", op, N,
                         C, C_full);
    if (!N) return L3D_OK;
    k_rmsnorm_fwd<<<N, ROW_THREADS, 0, l3d_cuda_stream(dev)>>>(out, rstd, x, w, ss, C, C_full, eps,
                                                              at, wt);
    L3D_CU_LAUNCHED(dev, op);
    return L3D_OK;
}

// Backward, pass 1: block b takes rows [b*ROWS_PER_CHUNK, ...) one after another; for each,
// dot = the given dot(n) (the all-reduced rowdot(dout, x, w)) or, when NULL, the row's own
// sum_c dout*w*x; dx += rstd*(dout*w) - dot*rstd^3/C_full * x, and thread c's column partial
// of dw, sum over the chunk's rows of dout*x*rstd in row order, goes to part[b][c] (each
// thread owns its columns: no race, a fixed order).
__global__ static void k_rmsnorm_bwd_rows(void *dx, float *part, const void *dout, const void *x,
                                          const void *w, const float *rstd, const float *dot,
                                          int N, int C, int C_full, int at, int wt) {
    int n0 = blockIdx.x * ROWS_PER_CHUNK, n1 = min(N, n0 + ROWS_PER_CHUNK);
    float *pb = part + (size_t)blockIdx.x * (size_t)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) pb[c] = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t row = (size_t)n * (size_t)C;
        float rs = rstd[n], d = dot ? dot[n] : row_dot(dout, x, w, row, C, at, wt);
        float k = d * rs * rs * rs / (float)C_full;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float g = l3d_cu_ld(dout, at, row + c), xv = l3d_cu_ld(x, at, row + c);
            float gw = g * l3d_cu_ld(w, wt, c);
            l3d_cu_st(dx, at, row + c, l3d_cu_ld(dx, at, row + c) + (rs * gw - k * xv));
            pb[c] += g * xv * rs;
        }
    }
}

// Pass 2: dw(C) (gt) += the chunks' partials, in chunk order, rounded once.
__global__ static void k_rmsnorm_bwd_dw(void *dw, const float *part, int nchunks, int C, int gt) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        float s = l3d_cu_ld(dw, gt, c);
        for (int p = 0; p < nchunks; p++) s += part[(size_t)p * (size_t)C + c];
        l3d_cu_st(dw, gt, c, s);
    }
}

static l3d_status rmsnorm_bwd(l3d_device_t *dev, const char *op, void *dx, void *dw,
                              const void *dout, const void *x, const void *w, const float *rstd,
                              const float *dot, int N, int C, int C_full, l3d_dtype at,
                              l3d_dtype wt, l3d_dtype gt) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "x", at));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "w", wt));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "dw", gt));
    if (N < 0 || C <= 0 || C_full < C)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s: bad shape N %d C %d (of %d)", op, N,
                         C, C_full);
    if (!N) return L3D_OK;
    int nchunks = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
    void *part;
    L3D_CHECK(dev->ctx, l3d_cuda_scratch(dev, (size_t)nchunks * (size_t)C * sizeof(float), &part));
    cudaStream_t s = l3d_cuda_stream(dev);
    k_rmsnorm_bwd_rows<<<nchunks, ROW_THREADS, 0, s>>>(dx, (float *)part, dout, x, w, rstd, dot, N,
                                                       C, C_full, at, wt);
    L3D_CU_LAUNCHED(dev, op);
    k_rmsnorm_bwd_dw<<<l3d_cu_blocks((size_t)C, COL_THREADS), COL_THREADS, 0, s>>>(
        dw, (const float *)part, nchunks, C, gt);
    L3D_CU_LAUNCHED(dev, op);
    return L3D_OK;
}

extern "C" l3d_status l3d_cuda_rmsnorm_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                           const void *w, int N, int C, float eps, l3d_dtype at,
                                           l3d_dtype wt) {
    return rmsnorm_fwd(dev, "rmsnorm_fwd", out, rstd, x, w, NULL, N, C, C, eps, at, wt);
}

extern "C" l3d_status l3d_cuda_rmsnorm_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                           const void *x, const void *w, const float *rstd, int N,
                                           int C, l3d_dtype at, l3d_dtype wt, l3d_dtype gt) {
    return rmsnorm_bwd(dev, "rmsnorm_bwd", dx, dw, dout, x, w, rstd, NULL, N, C, C, at, wt, gt);
}

// out(N) (float32) = sum_c a(N,C) * b(N,C) * (w(C) or 1); w may be NULL (its dtype is checked
// all the same, as on the CPU device).
extern "C" l3d_status l3d_cuda_rmsnorm_rowdot(l3d_device_t *dev, float *out, const void *a,
                                              const void *b, const void *w, int N, int C,
                                              l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "rmsnorm_rowdot", "a", at));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "rmsnorm_rowdot", "w", wt));
    if (N < 0 || C <= 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "rmsnorm_rowdot: bad shape N %d C %d", N,
                         C);
    if (!N) return L3D_OK;
    k_rmsnorm_rowdot<<<N, ROW_THREADS, 0, l3d_cuda_stream(dev)>>>(out, a, b, w, C, at, wt);
    L3D_CU_LAUNCHED(dev, "rmsnorm_rowdot");
    return L3D_OK;
}

// out(N,C) = x * rstd * w, rstd(N) = 1 / sqrt(ss(N) / C_full + eps); rstd may be NULL.
extern "C" l3d_status l3d_cuda_rmsnorm_rows_fwd(l3d_device_t *dev, void *out, float *rstd,
                                                const void *x, const void *w, const float *ss,
                                                int N, int C, int C_full, float eps,
                                                l3d_dtype at, l3d_dtype wt) {
    return rmsnorm_fwd(dev, "rmsnorm_rows_fwd", out, rstd, x, w, ss, N, C, C_full, eps, at, wt);
}

// dx(N,C) += rstd*(dout*w) - rstd^3/C_full * x * dot, dw(C) += sum_n dout*x*rstd.
extern "C" l3d_status l3d_cuda_rmsnorm_rows_bwd(l3d_device_t *dev, void *dx, void *dw,
                                                const void *dout, const void *x, const void *w,
                                                const float *rstd, const float *dot, int N, int C,
                                                int C_full, l3d_dtype at, l3d_dtype wt,
                                                l3d_dtype gt) {
    return rmsnorm_bwd(dev, "rmsnorm_rows_bwd", dx, dw, dout, x, w, rstd, dot, N, C, C_full, at,
                       wt, gt);
}

// ---- RoPE --------------------------------------------------------------------------------------
// In place on x(B,T,NH,D): the pair (i, i + D/2) of each (b, t, head) turned by position
// pos0 + t's angle (tables (Tmax, D/2)); the inverse turns back (the backward).
__global__ static void k_rope(void *x, const float *cos_tab, const float *sin_tab, size_t pairs,
                              int T, int NH, int D, int pos0, float sign, int at) {
    int half = D / 2;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < pairs;
         j += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(j % (size_t)half);
        size_t bth = j / (size_t)half;  // (b*T + t)*NH + h
        int t = (int)(bth / (size_t)NH % (size_t)T);
        size_t base = bth * (size_t)D;
        size_t tab = (size_t)(pos0 + t) * (size_t)half + (size_t)i;
        float a = l3d_cu_ld(x, at, base + i), b = l3d_cu_ld(x, at, base + i + half);
        l3d_rope_rotate(&a, &b, cos_tab[tab], sign * sin_tab[tab]);
        l3d_cu_st(x, at, base + i, a);
        l3d_cu_st(x, at, base + i + half, b);
    }
}

extern "C" l3d_status l3d_cuda_rope(l3d_device_t *dev, void *x, const float *cos_tab,
                                    const float *sin_tab, int B, int T, int NH, int D, int pos0,
                                    int inverse, l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "rope", "x", at));
    if (B < 0 || T < 0 || NH < 0 || D <= 0 || (D & 1) || pos0 < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "rope: bad shape B %d T %d NH %d D %d pos0 %d (D must be even)", B, T, NH,
                         D, pos0);
    size_t pairs = (size_t)B * (size_t)T * (size_t)NH * (size_t)(D / 2);
    if (!pairs) return L3D_OK;
    k_rope<<<l3d_cu_blocks(pairs, 256), 256, 0, l3d_cuda_stream(dev)>>>(
        x, cos_tab, sin_tab, pairs, T, NH, D, pos0, inverse ? -1.0f : 1.0f, at);
    L3D_CU_LAUNCHED(dev, "rope");
    return L3D_OK;
}

// ---- embedding ---------------------------------------------------------------------------------
// out(N,C) = table[tokens - v0] for tokens in [v0, v0+Vl), 0 for the others; a token outside
// [0, V) writes 0 and raises the device's bad-input flag (reported at the next sync).
__global__ static void k_embedding_fwd(void *out, const int32_t *tok, const void *table, int N,
                                       int C, int v0, int Vl, int V, int at, int wt, int *bad) {
    size_t n_all = (size_t)N * (size_t)C;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n_all;
         j += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(j / (size_t)C), c = (int)(j % (size_t)C), t = tok[n];
        if (t < 0 || t >= V) {
            if (c == 0) *bad = 1;
            l3d_cu_st(out, at, j, 0.0f);
            continue;
        }
        int r = t - v0;
        float v = r >= 0 && r < Vl ? l3d_cu_ld(table, wt, (size_t)r * (size_t)C + c) : 0.0f;
        l3d_cu_st(out, at, j, v);
    }
}

static l3d_status embedding_fwd(l3d_device_t *dev, const char *op, void *out, const int32_t *tokens,
                                const void *table, int N, int C, int v0, int Vl, int V,
                                l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "out", at));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "table", wt));
    if (N < 0 || C <= 0 || V <= 0 || v0 < 0 || Vl < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s: bad shape N %d C %d V %d v0 %d Vl %d",
                         op, N, C, V, v0, Vl);
    size_t n_all = (size_t)N * (size_t)C;
    if (!n_all) return L3D_OK;
    k_embedding_fwd<<<l3d_cu_blocks(n_all, 256), 256, 0, l3d_cuda_stream(dev)>>>(
        out, tokens, table, N, C, v0, Vl, V, at, wt, l3d_cuda_priv(dev)->bad);
    L3D_CU_LAUNCHED(dev, op);
    return L3D_OK;
}

extern "C" l3d_status l3d_cuda_embedding_fwd(l3d_device_t *dev, void *out, const int32_t *tokens,
                                             const void *table, int N, int C, int V, l3d_dtype at,
                                             l3d_dtype wt) {
    return embedding_fwd(dev, "embedding_fwd", out, tokens, table, N, C, 0, V, V, at, wt);
}

extern "C" l3d_status l3d_cuda_embedding_fwd_vp(l3d_device_t *dev, void *out, const int32_t *tokens,
                                                const void *table, int N, int C, int v0, int Vl,
                                                int V, l3d_dtype at, l3d_dtype wt) {
    return embedding_fwd(dev, "embedding_fwd_vp", out, tokens, table, N, C, v0, Vl, V, at, wt);
}

// The scatter-add without atomics: link each position to the next one holding the same token
// (nxt[n], -1 at the last; head[n] 1 at the first), then one thread per (first position,
// column) walks its token's positions in order: dtable[t][c] = ((dtable + d1) + d2) + ...,
// the CPU device's order, rounded once into a 16-bit table. N^2 / 2 comparisons to link:
// 0.13 G for 16K tokens, a fraction of a millisecond.
__global__ static void k_embedding_link(const int32_t *tok, int N, int *nxt, int *head) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        int t = tok[n], next = -1, first = 1;
        for (int m = 0; m < n && first; m++) first = tok[m] != t;
        for (int m = n + 1; m < N && next < 0; m++)
            if (tok[m] == t) next = m;
        nxt[n] = next;
        head[n] = first;
    }
}

__global__ static void k_embedding_bwd(void *dtable, const void *dout, const int32_t *tok,
                                       const int *nxt, const int *head, int N, int C, int v0,
                                       int Vl, int at, int gt) {
    size_t n_all = (size_t)N * (size_t)C;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n_all;
         j += (size_t)gridDim.x * blockDim.x) {
        int n = (int)(j / (size_t)C), c = (int)(j % (size_t)C), r = tok[n] - v0;
        if (!head[n] || r < 0 || r >= Vl) continue;
        size_t at_t = (size_t)r * (size_t)C + c;
        float s = l3d_cu_ld(dtable, gt, at_t);
        for (int m = n; m >= 0; m = nxt[m]) s += l3d_cu_ld(dout, at, (size_t)m * (size_t)C + c);
        l3d_cu_st(dtable, gt, at_t, s);
    }
}

static l3d_status embedding_bwd(l3d_device_t *dev, const char *op, void *dtable, const void *dout,
                                const int32_t *tokens, int N, int C, int v0, int Vl, l3d_dtype at,
                                l3d_dtype gt) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "dout", at));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "dtable", gt));
    if (N < 0 || C < 0 || v0 < 0 || Vl < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s: bad shape N %d C %d v0 %d Vl %d", op,
                         N, C, v0, Vl);
    if (!N || !C) return L3D_OK;
    void *scr;
    L3D_CHECK(dev->ctx, l3d_cuda_scratch(dev, 2 * (size_t)N * sizeof(int), &scr));
    int *nxt = (int *)scr, *head = nxt + N;
    cudaStream_t s = l3d_cuda_stream(dev);
    k_embedding_link<<<l3d_cu_blocks((size_t)N, 256), 256, 0, s>>>(tokens, N, nxt, head);
    L3D_CU_LAUNCHED(dev, op);
    size_t n_all = (size_t)N * (size_t)C;
    k_embedding_bwd<<<l3d_cu_blocks(n_all, 256), 256, 0, s>>>(dtable, dout, tokens, nxt, head, N, C,
                                                              v0, Vl, at, gt);
    L3D_CU_LAUNCHED(dev, op);
    return L3D_OK;
}

// (the one-rank form: every id owned; a negative id never matches a row, as on the CPU, whose
// forward refused it already)
extern "C" l3d_status l3d_cuda_embedding_bwd(l3d_device_t *dev, void *dtable, const void *dout,
                                             const int32_t *tokens, int N, int C, l3d_dtype at,
                                             l3d_dtype gt) {
    return embedding_bwd(dev, "embedding_bwd", dtable, dout, tokens, N, C, 0, 0x7fffffff, at, gt);
}

extern "C" l3d_status l3d_cuda_embedding_bwd_vp(l3d_device_t *dev, void *dtable, const void *dout,
                                                const int32_t *tokens, int N, int C, int v0, int Vl,
                                                l3d_dtype at, l3d_dtype gt) {
    return embedding_bwd(dev, "embedding_bwd_vp", dtable, dout, tokens, N, C, v0, Vl, at, gt);
}
