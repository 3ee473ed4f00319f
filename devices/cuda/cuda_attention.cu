// The CUDA device's causal grouped-query attention, forward and backward, flash style: no
// (Tq, Tk) matrix is stored, the softmax runs online over key tiles (devices/device_math.h's
// merge), key/value heads are shared inside the kernels (query head h reads kv head
// h / (H/KVH) in place, no copies), and the backward recomputes the scores from the forward's
// log-sum-exp. Deterministic: every sum has a fixed order (warp shuffles in a fixed tree, keys
// and query rows in index order, the query heads of a group in head order); no atomics.
// defines: l3d_cuda_attention_fwd, l3d_cuda_attention_bwd
//
// Shape of the work: a warp per row (a query row forward and for dq, a key row for dk/dv);
// a tile of 32 rows of the other side in shared memory, lane l taking the tile's row l for its
// score, then every lane its own dimensions d = lane + 32 r of the output, the tile's 32
// weights passed by shuffles. Head dimensions up to 128 (every Llama 3). This is the
// correct-first form; the tensor-core version replaces it where it wins (issue 28's speed
// goals are measured by tools/gpu-check.sh).
#include "devices/cuda/cuda.h"

enum { WARPS = 4, TILE = 32, DMAX = 128, DR = DMAX / 32 };
// A tile's rows are read one per lane (lane l, row l): padded by a float so that the 32 lanes'
// reads of one column fall in 32 different shared-memory banks.
enum { DPAD = DMAX + 1 };

struct attn_args {
    const void *q, *k, *v, *o, *dout;
    void *out, *dq, *dk, *dv;
    float *lse;
    const float *lse_in, *drow;
    int B, Tq, Tk, H, KVH, D, at;
    size_t kvbs;  // elements between batches of k and v
    float scale;
};

__device__ static inline size_t q_at(const attn_args &a, int b, int i, int h) {
    return (((size_t)b * a.Tq + i) * a.H + h) * a.D;
}
__device__ static inline size_t kv_at(const attn_args &a, int b, int j, int g) {
    return (size_t)b * a.kvbs + ((size_t)j * a.KVH + g) * a.D;
}
__device__ static inline float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ static inline float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// acc(d) += sum over the tile's rows t < n of w_t * tile[t][d] for this lane's dimensions
// d = lane + 32 r, w_t being lane t's w (passed by shuffles), in row order.
__device__ static inline void accumulate_rows(float acc[DR], float w, const float (*tile)[DPAD],
                                              int n, int D, int lane) {
    for (int t = 0; t < TILE; t++) {
        float wt = __shfl_sync(0xffffffffu, w, t);
        if (t >= n) break;  // (warp-uniform)
        for (int r = 0; r < DR; r++) {
            int d = lane + 32 * r;
            if (d < D) acc[r] += wt * tile[t][d];
        }
    }
}

// Keys and values j0 .. j0 + n - 1 of kv head g into the tile, by the whole block.
__device__ static inline void load_kv_tile(const attn_args &a, int b, int g, int j0, int n,
                                           float (*sk)[DPAD], float (*sv)[DPAD]) {
    for (int e = threadIdx.x; e < n * a.D; e += blockDim.x) {
        int jj = e / a.D, d = e % a.D;
        size_t at = kv_at(a, b, j0 + jj, g) + d;
        sk[jj][d] = l3d_cu_ld(a.k, a.at, at);
        sv[jj][d] = l3d_cu_ld(a.v, a.at, at);
    }
}

// ---- forward
// ------------------------------------------------------------------------------------- Block:
// WARPS query rows of one (b, h); grid (ceil(Tq / WARPS), H, B). Query row i sees keys j <= i + Tk
// - Tq.
__global__ static void k_attn_fwd(attn_args a) {
    __shared__ float sq[WARPS][DMAX], sk[TILE][DPAD], sv[TILE][DPAD];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.z, h = blockIdx.y, g = h / (a.H / a.KVH), D = a.D, off = a.Tk - a.Tq;
    int i0 = blockIdx.x * WARPS, i = i0 + warp;
    int nrows = min(WARPS, a.Tq - i0);
    int jend_block = min(a.Tk, i0 + nrows - 1 + off + 1);  // the block's last row's keys
    int jend = i < a.Tq ? min(a.Tk, i + off + 1) : 0;
    if (i < a.Tq)
        for (int d = lane; d < D; d += 32) sq[warp][d] = l3d_cu_ld(a.q, a.at, q_at(a, b, i, h) + d);
    float m = -INFINITY, l = 0.0f, o[DR];
    for (int r = 0; r < DR; r++) o[r] = 0.0f;
    for (int j0 = 0; j0 < jend_block; j0 += TILE) {
        int nk = min(TILE, jend_block - j0);
        __syncthreads();  // (the previous tile is read by every warp)
        load_kv_tile(a, b, g, j0, nk, sk, sv);
        __syncthreads();
        if (j0 >= jend) continue;  // (warp-uniform: this row sees none of the tile)
        float s = -INFINITY;
        if (j0 + lane < jend) {
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += sq[warp][d] * sk[lane][d];
            s = a.scale * dot;
        }
        float mx = fmaxf(m, warp_max(s));
        float p = l3d_expf(s - mx);  // (masked: exp(-inf) = 0)
        float sum = warp_sum(p), corr, one;
        l3d_softmax_merge(m, l, mx, sum, &m, &l, &corr, &one);
        for (int r = 0; r < DR; r++) o[r] *= corr;
        accumulate_rows(o, p, sv, nk, D, lane);
    }
    if (i >= a.Tq) return;
    float inv = 1.0f / l;
    for (int r = 0; r < DR; r++) {
        int d = lane + 32 * r;
        if (d < D) l3d_cu_st(a.out, a.at, q_at(a, b, i, h) + d, o[r] * inv);
    }
    if (a.lse && lane == 0) a.lse[((size_t)b * a.H + h) * a.Tq + i] = m + logf(l);
}

static l3d_status attn_check(l3d_device_t *dev, const char *op, const l3d_attn_dims_t *d,
                             l3d_dtype at) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, op, "q/k/v", at));
    if (d->B < 0 || d->Tq < 0 || d->Tk < d->Tq || d->H <= 0 || d->KVH <= 0 || d->H % d->KVH ||
        d->D <= 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "%s: bad dims B %d Tq %d Tk %d H %d KVH %d "
                         "D %d",
                         op, d->B, d->Tq, d->Tk, d->H, d->KVH, d->D);
    if (d->D > DMAX)
        return l3d_error(dev->ctx, L3D_ERR_UNSUPPORTED,
                         "%s: head dimension %d (the CUDA kernels "
                         "take up to %d)",
                         op, d->D, DMAX);
    return L3D_OK;
}

static attn_args args_of(const l3d_attn_dims_t *d, l3d_dtype at) {
    attn_args a = {};
    a.B = d->B, a.Tq = d->Tq, a.Tk = d->Tk, a.H = d->H, a.KVH = d->KVH, a.D = d->D, a.at = at;
    a.kvbs = d->kv_bstride ? d->kv_bstride : (size_t)d->Tk * d->KVH * d->D;
    a.scale = 1.0f / sqrtf((float)d->D);
    return a;
}

extern "C" l3d_status l3d_cuda_attention_fwd(l3d_device_t *dev, void *out, float *lse,
                                             const void *q, const void *k, const void *v,
                                             const l3d_attn_dims_t *d, l3d_dtype at) {
    L3D_CHECK(dev->ctx, attn_check(dev, "attention_fwd", d, at));
    if (!d->B || !d->Tq) return L3D_OK;
    attn_args a = args_of(d, at);
    a.q = q, a.k = k, a.v = v, a.out = out, a.lse = lse;
    dim3 grid((unsigned)((d->Tq + WARPS - 1) / WARPS), (unsigned)d->H, (unsigned)d->B);
    k_attn_fwd<<<grid, 32 * WARPS, 0, l3d_cuda_stream(dev)>>>(a);
    L3D_CU_LAUNCHED(dev, "attention_fwd");
    return L3D_OK;
}

// ---- backward
// ------------------------------------------------------------------------------------ drow(B,H,Tq)
// = sum_d dout * out per query row (FlashAttention-2's D), a warp per row.
__global__ static void k_attn_drow(attn_args a, float *drow) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t row = (size_t)blockIdx.x * WARPS + warp, nrows = (size_t)a.B * a.Tq * a.H;
    if (row >= nrows) return;
    int h = (int)(row % a.H), i = (int)(row / a.H % a.Tq), b = (int)(row / a.H / a.Tq);
    size_t at = q_at(a, b, i, h);
    float s = 0.0f;
    for (int d = lane; d < a.D; d += 32)
        s += l3d_cu_ld(a.dout, a.at, at + d) * l3d_cu_ld(a.o, a.at, at + d);
    s = warp_sum(s);
    if (lane == 0) drow[((size_t)b * a.H + h) * a.Tq + i] = s;
}

// dq(i) = scale * sum_j ds_ij k_j, ds = p (dp - drow), p = exp(scale q.k - lse), dp = dout.v:
// a warp per query row (as the forward), key tiles in order.
__global__ static void k_attn_dq(attn_args a) {
    __shared__ float sq[WARPS][DMAX], sdo[WARPS][DMAX], sk[TILE][DPAD], sv[TILE][DPAD];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.z, h = blockIdx.y, g = h / (a.H / a.KVH), D = a.D, off = a.Tk - a.Tq;
    int i0 = blockIdx.x * WARPS, i = i0 + warp;
    int nrows = min(WARPS, a.Tq - i0);
    int jend_block = min(a.Tk, i0 + nrows - 1 + off + 1);
    int jend = i < a.Tq ? min(a.Tk, i + off + 1) : 0;
    float lse = 0.0f, dr = 0.0f, acc[DR];
    for (int r = 0; r < DR; r++) acc[r] = 0.0f;
    if (i < a.Tq) {
        size_t at = q_at(a, b, i, h);
        for (int d = lane; d < D; d += 32) {
            sq[warp][d] = l3d_cu_ld(a.q, a.at, at + d);
            sdo[warp][d] = l3d_cu_ld(a.dout, a.at, at + d);
        }
        size_t li = ((size_t)b * a.H + h) * a.Tq + i;
        lse = a.lse_in[li], dr = a.drow[li];
    }
    for (int j0 = 0; j0 < jend_block; j0 += TILE) {
        int nk = min(TILE, jend_block - j0);
        __syncthreads();
        load_kv_tile(a, b, g, j0, nk, sk, sv);
        __syncthreads();
        if (j0 >= jend) continue;
        float ds = 0.0f;
        if (j0 + lane < jend) {
            float qk = 0.0f, dp = 0.0f;
            for (int d = 0; d < D; d++)
                qk += sq[warp][d] * sk[lane][d], dp += sdo[warp][d] * sv[lane][d];
            float p = l3d_expf(a.scale * qk - lse);
            ds = p * (dp - dr);
        }
        accumulate_rows(acc, ds, sk, nk, D, lane);
    }
    if (i >= a.Tq) return;
    for (int r = 0; r < DR; r++) {
        int d = lane + 32 * r;
        if (d < D) l3d_cu_st(a.dq, a.at, q_at(a, b, i, h) + d, a.scale * acc[r]);
    }
}

// dk(j), dv(j) of kv head g: a warp per key row; for each query head of the group in order,
// the query rows that see key j (i + Tk - Tq >= j) in tiles: dv += p dout_i,
// dk += scale ds q_i. Grid (ceil(Tk / WARPS), KVH, B).
__global__ static void k_attn_dkv(attn_args a) {
    __shared__ float sk[WARPS][DMAX], sv[WARPS][DMAX], sq[TILE][DPAD], sdo[TILE][DPAD];
    __shared__ float slse[TILE], sdr[TILE];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.z, g = blockIdx.y, D = a.D, off = a.Tk - a.Tq, gs = a.H / a.KVH;
    int j0b = blockIdx.x * WARPS, j = j0b + warp;
    // query rows i that see key j: i >= j - off; the block's first key starts the earliest
    int istart_block = max(0, j0b - off), istart = max(0, j - off);
    if (j < a.Tk) {
        size_t at = kv_at(a, b, j, g);
        for (int d = lane; d < D; d += 32) {
            sk[warp][d] = l3d_cu_ld(a.k, a.at, at + d);
            sv[warp][d] = l3d_cu_ld(a.v, a.at, at + d);
        }
    }
    float dk[DR], dv[DR];
    for (int r = 0; r < DR; r++) dk[r] = dv[r] = 0.0f;
    for (int hh = 0; hh < gs; hh++) {
        int h = g * gs + hh;
        for (int i0 = istart_block; i0 < a.Tq; i0 += TILE) {
            int ni = min(TILE, a.Tq - i0);
            __syncthreads();
            for (int e = threadIdx.x; e < ni * D; e += blockDim.x) {
                int ii = e / D, d = e % D;
                size_t at = q_at(a, b, i0 + ii, h) + d;
                sq[ii][d] = l3d_cu_ld(a.q, a.at, at);
                sdo[ii][d] = l3d_cu_ld(a.dout, a.at, at);
            }
            for (int e = threadIdx.x; e < ni; e += blockDim.x) {
                size_t li = ((size_t)b * a.H + h) * a.Tq + i0 + e;
                slse[e] = a.lse_in[li], sdr[e] = a.drow[li];
            }
            __syncthreads();
            if (j >= a.Tk || i0 + TILE <= istart) continue;  // (warp-uniform)
            float p = 0.0f, ds = 0.0f;
            int ii = lane, i = i0 + ii;
            if (ii < ni && i >= istart) {
                float qk = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; d++)
                    qk += sq[ii][d] * sk[warp][d], dp += sdo[ii][d] * sv[warp][d];
                p = l3d_expf(a.scale * qk - slse[ii]);
                ds = p * (dp - sdr[ii]);
            }
            accumulate_rows(dv, p, sdo, ni, D, lane);
            accumulate_rows(dk, ds, sq, ni, D, lane);
        }
    }
    if (j >= a.Tk) return;
    size_t at = ((size_t)b * a.Tk + j) * a.KVH * a.D + (size_t)g * a.D;  // (contiguous)
    for (int r = 0; r < DR; r++) {
        int d = lane + 32 * r;
        if (d < D) {
            l3d_cu_st(a.dk, a.at, at + d, a.scale * dk[r]);
            l3d_cu_st(a.dv, a.at, at + d, dv[r]);
        }
    }
}

extern "C" l3d_status l3d_cuda_attention_bwd(l3d_device_t *dev, void *dq, void *dk, void *dv,
                                             const void *dout, const void *q, const void *k,
                                             const void *v, const void *out, const float *lse,
                                             const l3d_attn_dims_t *d, l3d_dtype at) {
    L3D_CHECK(dev->ctx, attn_check(dev, "attention_bwd", d, at));
    if (!lse) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "attention_bwd: lse is NULL");
    if (!d->B) return L3D_OK;
    attn_args a = args_of(d, at);
    a.q = q, a.k = k, a.v = v, a.o = out, a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
    a.lse_in = lse;
    cudaStream_t s = l3d_cuda_stream(dev);
    size_t nrows = (size_t)d->B * d->Tq * d->H;
    void *scr;
    L3D_CHECK(dev->ctx, l3d_cuda_scratch(dev, (nrows ? nrows : 1) * sizeof(float), &scr));
    a.drow = (const float *)scr;
    if (nrows) {
        k_attn_drow<<<(unsigned)((nrows + WARPS - 1) / WARPS), 32 * WARPS, 0, s>>>(a, (float *)scr);
        L3D_CU_LAUNCHED(dev, "attention_bwd");
        dim3 gq((unsigned)((d->Tq + WARPS - 1) / WARPS), (unsigned)d->H, (unsigned)d->B);
        k_attn_dq<<<gq, 32 * WARPS, 0, s>>>(a);
        L3D_CU_LAUNCHED(dev, "attention_bwd");
    }
    if (d->Tk) {
        dim3 gk((unsigned)((d->Tk + WARPS - 1) / WARPS), (unsigned)d->KVH, (unsigned)d->B);
        k_attn_dkv<<<gk, 32 * WARPS, 0, s>>>(a);
        L3D_CU_LAUNCHED(dev, "attention_bwd");
    }
    return L3D_OK;
}
