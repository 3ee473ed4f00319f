// Causal grouped-query attention, flash-attention style: queries and keys are walked in tiles,
// scores live only in one (BQ,BK) tile, and the softmax is computed online (running max and
// sum per query row), so the extra memory is O(BQ*(BK+D)) per thread plus the lse (B,H,Tq).
// Tile products are single-threaded OpenBLAS calls on strided views of q, k, v (no copies),
// or plain loops for tiles of a few query rows.
// defines: l3d_cpu_attention_fwd, l3d_cpu_attention_bwd
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "devices/cpu/cpu.h"

L3D_CPU_VECTORIZE

#define BQ 64  // query rows per tile
#define BK 64  // keys per tile
// Tiles of up to this many query rows (decoding: one per sequence) take their two products as
// dot products and row updates here: sgemm packed both operands of every (1,64)x(64,D) tile
// product, ~3% of a decode step.
#define DOT_ROWS 4

typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *o, *lse_in;
    int B, Tq, Tk, H, KVH, D, off, nqb;
    size_t kvbs;
    float scale;
    l3d_cpu_t *cpu;
} attn_t;

static l3d_status attn_setup(l3d_device_t *dev, const char *op, const l3d_attn_dims_t *d,
                             attn_t *a) {
    if (d->B < 0 || d->Tq < 0 || d->Tk < 0 || d->H <= 0 || d->KVH <= 0 || d->D <= 0 ||
        d->H % d->KVH || d->Tq > d->Tk)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "%s: bad dims B %d Tq %d Tk %d H %d KVH %d D %d (need H %% KVH == 0, "
                         "Tq <= Tk)", op, d->B, d->Tq, d->Tk, d->H, d->KVH, d->D);
    size_t dense = (size_t)d->Tk * (size_t)d->KVH * (size_t)d->D;
    if (d->kv_bstride && d->kv_bstride < dense)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "%s: kv_bstride %zu is below Tk*KVH*D = %zu", op, d->kv_bstride, dense);
    a->B = d->B, a->Tq = d->Tq, a->Tk = d->Tk, a->H = d->H, a->KVH = d->KVH, a->D = d->D;
    a->off = d->Tk - d->Tq;
    a->nqb = (d->Tq + BQ - 1) / BQ;
    a->kvbs = d->kv_bstride ? d->kv_bstride : dense;
    a->scale = 1.0f / sqrtf((float)d->D);
    return L3D_OK;
}

// Row i of q or out for (b, h): (B,Tq,H,D).
static size_t q_at(const attn_t *a, int b, int h, int i) {
    return (((size_t)b * (size_t)a->Tq + (size_t)i) * (size_t)a->H + (size_t)h) * (size_t)a->D;
}
// Row j of k or v for (b, kvh): batch stride kvbs, then (Tk,KVH,D).
static size_t kv_at(const attn_t *a, int b, int g, int j) {
    return (size_t)b * a->kvbs + ((size_t)j * (size_t)a->KVH + (size_t)g) * (size_t)a->D;
}
// Row j of the dense dk/dv (B,Tk,KVH,D).
static size_t dkv_at(const attn_t *a, int b, int g, int j) {
    return (((size_t)b * (size_t)a->Tk + (size_t)j) * (size_t)a->KVH + (size_t)g) * (size_t)a->D;
}

// ---- forward ------------------------------------------------------------------------------------
// o(D) += sum_c p[c] v[c](D) over nk rows of v (stride ldv), 16 columns at a time in two
// 8-lane vectors, so the partial sums stay in registers across the rows (an array here was
// kept in memory: a store and reload per row).
L3D_CPU_INLINE void pv_row(float *restrict o, const float *restrict p, const float *restrict v,
                           int nk, int ldv, int D) {
    int e0 = 0;
#if L3D_CPU_HAVE_V8F
    for (; e0 + 16 <= D; e0 += 16) {
        l3d_cpu_v8f lo, hi;
        memcpy(&lo, o + e0, sizeof(lo));
        memcpy(&hi, o + e0 + 8, sizeof(hi));
        for (int c = 0; c < nk; c++) {
            const float *restrict vr = v + (size_t)c * (size_t)ldv + e0;
            l3d_cpu_v8f v0, v1;
            memcpy(&v0, vr, sizeof(v0));
            memcpy(&v1, vr + 8, sizeof(v1));
            lo += p[c] * v0;
            hi += p[c] * v1;
        }
        memcpy(o + e0, &lo, sizeof(lo));
        memcpy(o + e0 + 8, &hi, sizeof(hi));
    }
#endif
    for (int c = 0; c < nk; c++)
        for (int e = e0; e < D; e++) o[e] += p[c] * v[(size_t)c * (size_t)ldv + e];
}

// Task (b, h, query tile). Scratch: S (BQ,BK), O (BQ,D), m (BQ), l (BQ).
L3D_CPU_SIMD static void attn_fwd_task(void *arg, int task, int ntasks) {
    const attn_t *a = arg;
    int qb = task % a->nqb, h = (task / a->nqb) % a->H, b = task / (a->nqb * a->H);
    int g = h / (a->H / a->KVH), D = a->D;
    int i0 = qb * BQ, mq = L3D_MIN(BQ, a->Tq - i0);
    int jend = i0 + mq - 1 + a->off + 1;  // keys [0, jend) are seen by some row of the tile
    int slot;
    float *S = l3d_cpu_scratch_acquire(a->cpu, &slot);
    float *O = S + BQ * BK, *mrow = O + (size_t)BQ * (size_t)D, *lrow = mrow + BQ;
    memset(O, 0, sizeof(float) * (size_t)mq * (size_t)D);
    for (int r = 0; r < mq; r++) mrow[r] = -INFINITY, lrow[r] = 0.0f;
    const float *Q = a->q + q_at(a, b, h, i0);
    int ldq = a->H * D, ldkv = a->KVH * D;
    for (int j0 = 0; j0 < jend; j0 += BK) {
        int nk = L3D_MIN(BK, jend - j0);
        const float *K = a->k + kv_at(a, b, g, j0), *V = a->v + kv_at(a, b, g, j0);
        // S(mq,nk) = scale * Q K^T
        if (mq <= DOT_ROWS)
            for (int r = 0; r < mq; r++)
                for (int c = 0; c < nk; c++)
                    S[(size_t)r * BK + c] = a->scale * l3d_cpu_dotf(Q + (size_t)r * (size_t)ldq,
                                                                    K + (size_t)c * (size_t)ldkv, D);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mq, nk, D, a->scale, Q, ldq, K,
                        ldkv, 0.0f, S, BK);
        for (int r = 0; r < mq; r++) {
            float *restrict s = S + (size_t)r * BK;
            int nv = L3D_MIN(nk, i0 + r + a->off + 1 - j0);  // visible keys in this tile
            if (nv < 0) nv = 0;
            // the tile's exps taken against the running max, then merged into the row so far
            // (its own factor exp(0) is 1; the row's is 0 on the first tile, m = -inf)
            float mx = l3d_cpu_maxf(s, nv, mrow[r]);
            for (int c = 0; c < nv; c++) s[c] = l3d_expf(s[c] - mx);
            for (int c = nv; c < nk; c++) s[c] = 0.0f;
            float sum = l3d_cpu_sumf(s, nv), corr, one;
            l3d_softmax_merge(mrow[r], lrow[r], mx, sum, &mrow[r], &lrow[r], &corr, &one);
            if (corr != 1.0f) {
                float *restrict o = O + (size_t)r * (size_t)D;
                for (int c = 0; c < D; c++) o[c] *= corr;
            }
        }
        // O(mq,D) += P V
        if (mq <= DOT_ROWS)
            for (int r = 0; r < mq; r++)
                pv_row(O + (size_t)r * (size_t)D, S + (size_t)r * BK, V, nk, ldkv, D);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mq, D, nk, 1.0f, S, BK, V,
                        ldkv, 1.0f, O, D);
    }
    for (int r = 0; r < mq; r++) {
        float *restrict out = a->out + q_at(a, b, h, i0 + r);
        const float *restrict o = O + (size_t)r * (size_t)D;
        float inv = 1.0f / lrow[r];
        for (int c = 0; c < D; c++) out[c] = o[c] * inv;
        size_t li = ((size_t)b * (size_t)a->H + (size_t)h) * (size_t)a->Tq + (size_t)(i0 + r);
        if (a->lse) a->lse[li] = mrow[r] + logf(lrow[r]);
    }
    l3d_cpu_scratch_release(a->cpu, slot);
}

// out(B,Tq,H,D) = softmax(q k^T / sqrt(D), causal) v; lse(B,H,Tq) may be NULL
static l3d_status attention_fwd_f32(l3d_device_t *dev, float *out, float *lse, const float *q,
                                    const float *k, const float *v, const l3d_attn_dims_t *d) {
    attn_t a = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .cpu = l3d_cpu_priv(dev)};
    L3D_CHECK(dev->ctx, attn_setup(dev, "attention_fwd", d, &a));
    if (a.B == 0 || a.Tq == 0) return L3D_OK;
    L3D_CHECK(dev->ctx, l3d_cpu_scratch_reserve(dev, BQ * BK + (size_t)BQ * (size_t)a.D + 2 * BQ));
    l3d_cpu_run(dev, attn_fwd_task, &a, a.B * a.H * a.nqb);
    return L3D_OK;
}

// ---- backward -----------------------------------------------------------------------------------
// Task (b, kv head g): owns dk, dv of g and dq of the query heads of g, so nothing races and
// every sum runs in a fixed order (head, query tile, key tile). Scratch: P (BQ,BK),
// dP (BQ,BK), Drow (BQ).
L3D_CPU_SIMD static void attn_bwd_task(void *arg, int task, int ntasks) {
    const attn_t *a = arg;
    int g = task % a->KVH, b = task / a->KVH, D = a->D, grp = a->H / a->KVH;
    int ldq = a->H * D, ldkv = a->KVH * D;
    int slot;
    float *P = l3d_cpu_scratch_acquire(a->cpu, &slot);
    float *dP = P + BQ * BK, *Drow = dP + BQ * BK;
    for (int j = 0; j < a->Tk; j++) {
        memset(a->dk + dkv_at(a, b, g, j), 0, sizeof(float) * (size_t)D);
        memset(a->dv + dkv_at(a, b, g, j), 0, sizeof(float) * (size_t)D);
    }
    for (int h = g * grp; h < (g + 1) * grp; h++) {
        const float *lse = a->lse_in + ((size_t)b * (size_t)a->H + (size_t)h) * (size_t)a->Tq;
        for (int qb = 0; qb < a->nqb; qb++) {
            int i0 = qb * BQ, mq = L3D_MIN(BQ, a->Tq - i0);
            int jend = i0 + mq + a->off;
            const float *Q = a->q + q_at(a, b, h, i0), *dO = a->dout + q_at(a, b, h, i0);
            float *dQ = a->dq + q_at(a, b, h, i0);
            for (int r = 0; r < mq; r++) {
                const float *restrict o = a->o + q_at(a, b, h, i0 + r);
                const float *restrict go = dO + (size_t)r * (size_t)ldq;
                Drow[r] = l3d_cpu_dotf(go, o, D);
                memset(dQ + (size_t)r * (size_t)ldq, 0, sizeof(float) * (size_t)D);
            }
            for (int j0 = 0; j0 < jend; j0 += BK) {
                int nk = L3D_MIN(BK, jend - j0);
                const float *K = a->k + kv_at(a, b, g, j0), *V = a->v + kv_at(a, b, g, j0);
                float *dK = a->dk + dkv_at(a, b, g, j0), *dV = a->dv + dkv_at(a, b, g, j0);
                // P = exp(scale Q K^T - lse), dP = dO V^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mq, nk, D, a->scale, Q, ldq,
                            K, ldkv, 0.0f, P, BK);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mq, nk, D, 1.0f, dO, ldq, V,
                            ldkv, 0.0f, dP, BK);
                for (int r = 0; r < mq; r++) {
                    float *restrict p = P + (size_t)r * BK, *restrict dp = dP + (size_t)r * BK;
                    int nv = L3D_MIN(nk, i0 + r + a->off + 1 - j0);
                    if (nv < 0) nv = 0;
                    float l = lse[i0 + r], dr = Drow[r];
                    for (int c = 0; c < nv; c++) {
                        float pc = l3d_expf(p[c] - l);
                        p[c] = pc;
                        dp[c] = pc * (dp[c] - dr);  // dS
                    }
                    for (int c = nv; c < nk; c++) p[c] = 0.0f, dp[c] = 0.0f;
                }
                // dV += P^T dO;  dK += scale dS^T Q;  dQ += scale dS K
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, mq, 1.0f, P, BK, dO,
                            ldq, 1.0f, dV, ldkv);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, mq, a->scale, dP, BK,
                            Q, ldq, 1.0f, dK, ldkv);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mq, D, nk, a->scale, dP, BK,
                            K, ldkv, 1.0f, dQ, ldq);
            }
        }
    }
    l3d_cpu_scratch_release(a->cpu, slot);
}

// dq (B,Tq,H,D), dk, dv (B,Tk,KVH,D dense) overwritten
static l3d_status attention_bwd_f32(l3d_device_t *dev, float *dq, float *dk, float *dv,
                                    const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse,
                                    const l3d_attn_dims_t *d) {
    attn_t a = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .q = q, .k = k, .v = v, .o = out,
                .lse_in = lse, .cpu = l3d_cpu_priv(dev)};
    L3D_CHECK(dev->ctx, attn_setup(dev, "attention_bwd", d, &a));
    if (a.B == 0) return L3D_OK;
    if (!lse) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "attention_bwd: lse is NULL");
    L3D_CHECK(dev->ctx, l3d_cpu_scratch_reserve(dev, 2 * BQ * BK + BQ));
    l3d_cpu_run(dev, attn_bwd_task, &a, a.B * a.KVH);
    return L3D_OK;
}

// ---- the entries: 16-bit operands widened whole (cpu.h) -----------------------------------------
// Elements of q-shaped (B,Tq,H,D), k/v as passed (batch stride kv_bstride) and dk/dv (dense).
static void attn_sizes(const l3d_attn_dims_t *d, size_t *nq, size_t *nkv, size_t *ndkv) {
    size_t dense = l3d_cpu_elems(d->Tk, l3d_cpu_elems(d->KVH, d->D));
    size_t bs = d->kv_bstride ? d->kv_bstride : dense;
    *nq = l3d_cpu_elems(l3d_cpu_elems(d->B, d->Tq), l3d_cpu_elems(d->H, d->D));
    *nkv = d->B > 0 && dense ? (size_t)(d->B - 1) * bs + dense : 0;
    *ndkv = l3d_cpu_elems(d->B, dense);
}

l3d_status l3d_cpu_attention_fwd(l3d_device_t *dev, void *out, float *lse, const void *q,
                                 const void *k, const void *v, const l3d_attn_dims_t *d,
                                 l3d_dtype at) {
    size_t nq, nkv, ndkv;
    attn_sizes(d, &nq, &nkv, &ndkv);
    l3d_cpu_arg_t a[] = {l3d_cpu_arg("out", out, at, nq, L3D_CPU_OUT),
                         l3d_cpu_arg("q", q, at, nq, L3D_CPU_IN),
                         l3d_cpu_arg("k", k, at, nkv, L3D_CPU_IN),
                         l3d_cpu_arg("v", v, at, nkv, L3D_CPU_IN)};
    L3D_CHECK(dev->ctx, l3d_cpu_args_widen(dev, "attention_fwd", a, 4));
    l3d_status st = attention_fwd_f32(dev, a[0].f, lse, a[1].f, a[2].f, a[3].f, d);
    l3d_cpu_args_narrow(dev, a, 4, st >= 0);
    return st;
}

l3d_status l3d_cpu_attention_bwd(l3d_device_t *dev, void *dq, void *dk, void *dv,
                                 const void *dout, const void *q, const void *k, const void *v,
                                 const void *out, const float *lse, const l3d_attn_dims_t *d,
                                 l3d_dtype at) {
    size_t nq, nkv, ndkv;
    attn_sizes(d, &nq, &nkv, &ndkv);
    l3d_cpu_arg_t a[] = {l3d_cpu_arg("dq", dq, at, nq, L3D_CPU_OUT),
                         l3d_cpu_arg("dk", dk, at, ndkv, L3D_CPU_OUT),
                         l3d_cpu_arg("dv", dv, at, ndkv, L3D_CPU_OUT),
                         l3d_cpu_arg("dout", dout, at, nq, L3D_CPU_IN),
                         l3d_cpu_arg("q", q, at, nq, L3D_CPU_IN),
                         l3d_cpu_arg("k", k, at, nkv, L3D_CPU_IN),
                         l3d_cpu_arg("v", v, at, nkv, L3D_CPU_IN),
                         l3d_cpu_arg("out", out, at, nq, L3D_CPU_IN)};
    L3D_CHECK(dev->ctx, l3d_cpu_args_widen(dev, "attention_bwd", a, 8));
    l3d_status st = attention_bwd_f32(dev, a[0].f, a[1].f, a[2].f, a[3].f, a[4].f, a[5].f,
                                      a[6].f, a[7].f, lse, d);
    l3d_cpu_args_narrow(dev, a, 8, st >= 0);
    return st;
}
