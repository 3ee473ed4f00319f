// 2D tensor parallelism: the q x q grid and the SUMMA linear layer (core/model/tp2d.h has the
// layout and the algorithm). Every product runs on the device's GEMM; every exchange is a
// broadcast or a reduce on a row or column communicator, so their bytes are counted there.
#include <math.h>
#include <string.h>

#include "core/l3d_core.h"
#include "core/model/tp2d.h"
#include "devices/device.h"

l3d_status l3d_tp2d_create(l3d_comm_t *tp, l3d_device_t *dev, l3d_tp2d_t **g_p) {
    l3d_ctx_t *ctx = l3d_comm_ctx(tp);
    int n = l3d_comm_size(tp), me = l3d_comm_rank(tp), q = (int)lround(sqrt((double)n));
    if (q * q != n)
        return l3d_error(ctx, L3D_ERR_CONFIG, "tp_mode 2d: tp %d is not a square (q x q ranks: 4, "
                         "9, 16, ...)", n);
    l3d_tp2d_t *g = l3d_calloc(ctx, 1, sizeof(*g), "tp2d");
    if (!g) return L3D_ERR_NOMEM;
    g->ctx = ctx, g->dev = dev, g->q = q, g->i = me / q, g->j = me % q;
    l3d_status st = l3d_comm_split(tp, g->i, g->j, &g->row);
    if (st >= 0) st = l3d_comm_split(tp, g->j, g->i, &g->col);
    if (st < 0) {
        l3d_tp2d_destroy(g);
        return st;
    }
    *g_p = g;
    return L3D_OK;
}

void l3d_tp2d_destroy(l3d_tp2d_t *g) {
    if (!g) return;
    if (g->a) l3d_dev_free(g->dev, g->a, g->cap_a * sizeof(float), "tp2d");
    if (g->b) l3d_dev_free(g->dev, g->b, g->cap_b * sizeof(float), "tp2d");
    if (g->c) l3d_dev_free(g->dev, g->c, g->cap_c * sizeof(float), "tp2d");
    if (g->d) l3d_dev_free(g->dev, g->d, g->cap_d * sizeof(float), "tp2d");
    l3d_comm_destroy(g->row);
    l3d_comm_destroy(g->col);
    l3d_free(g->ctx, g, sizeof(*g), "tp2d");
}

// Scratch blocks live in the device's memory, where the GEMMs and the communicator read them.
l3d_status l3d_tp_scratch_grow(l3d_ctx_t *ctx, l3d_device_t *dev, float **p, size_t *cap,
                               size_t n, const char *tag) {
    if (*cap >= n) return L3D_OK;
    void *q = NULL;
    L3D_CHECK(ctx, l3d_dev_alloc(dev, n * sizeof(float), tag, &q));
    if (*p) l3d_dev_free(dev, *p, *cap * sizeof(float), tag);
    *p = q, *cap = n;
    return L3D_OK;
}

static l3d_status grow(l3d_tp2d_t *g, float **p, size_t *cap, size_t n) {
    return l3d_tp_scratch_grow(g->ctx, g->dev, p, cap, n, "tp2d");
}

// The block sizes, after checking that q divides every dimension.
static l3d_status blocks(l3d_tp2d_t *g, int N, int I, int O, int *Nq, int *Iq, int *Oq) {
    int q = g->q;
    if (N < q || I < q || O < q || N % q || I % q || O % q)
        return l3d_error(g->ctx, L3D_ERR_INVALID_ARG, "tp_mode 2d: linear layer (%d x %d -> %d) "
                         "does not split over a %d x %d grid: every size must be a multiple of "
                         "%d", N, I, O, q, q, q);
    *Nq = N / q, *Iq = I / q, *Oq = O / q;
    return L3D_OK;
}

// C(M,N) = op(A) op(B) (+ C when beta = 1), row-major; A and B of their dtypes, C float32.
static l3d_status gemm(l3d_tp2d_t *g, int ta, int tb, int M, int N, int K, const void *A,
                       l3d_dtype at, int lda, const void *B, l3d_dtype bt, int ldb, float *C,
                       float beta) {
    l3d_gemm_t p = {.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K, .alpha = 1.0f,
                    .beta = beta, .A = A, .lda = lda, .B = B, .ldb = ldb, .C = C, .ldc = N,
                    .a_type = at, .b_type = bt, .c_type = L3D_FLOAT32};
    return l3d_dev_gemm(g->dev, &p);
}

// Scratch for the blocks of a layer with per-rank sizes Nq, Iq, Oq, in floats (a 16-bit block
// uses half): received x, received W (and a float32 dW partial), the float32 product, and its
// 16-bit rounding to be reduced.
static l3d_status block_scratch(l3d_tp2d_t *g, int Nq, int Iq, int Oq) {
    size_t xs = (size_t)Nq * (size_t)Iq, ws = (size_t)Oq * (size_t)Iq, ys = (size_t)Nq * Oq;
    size_t cs = xs > ws ? xs : ws;
    L3D_CHECK(g->ctx, grow(g, &g->a, &g->cap_a, xs));
    L3D_CHECK(g->ctx, grow(g, &g->b, &g->cap_b, ws));
    L3D_CHECK(g->ctx, grow(g, &g->c, &g->cap_c, cs > ys ? cs : ys));
    return grow(g, &g->d, &g->cap_d, xs);
}

l3d_status l3d_tp2d_block_fwd(l3d_tp2d_t *g, void *y, const void *x, const void *w, int Nq,
                              int Iq, int Oq, float beta, l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(g->ctx, block_scratch(g, Nq, Iq, Oq));
    size_t xs = (size_t)Nq * (size_t)Iq, ws = (size_t)Oq * (size_t)Iq, ys = (size_t)Nq * Oq;
    // a 16-bit y is summed in float32 and rounded once
    float *acc = at == L3D_FLOAT32 ? y : g->c;
    if (acc != y && beta != 0.0f)
        L3D_CHECK(g->ctx, l3d_dev_convert(g->dev, acc, L3D_FLOAT32, y, at, ys));
    for (int k = 0; k < g->q; k++) {
        // x(i,k) along row i (its owner passes its own block), W(k,j) along column j
        const void *xa = g->j == k ? x : (const void *)g->a;
        const void *wb = g->i == k ? w : (const void *)g->b;
        L3D_CHECK(g->ctx, l3d_comm_broadcast(g->row, x, (void *)xa, xs, at, k));
        L3D_CHECK(g->ctx, l3d_comm_broadcast(g->col, w, (void *)wb, ws, wt, k));
        // y(i,j) += x(i,k) W(k,j)^T    (N/q, I/q) x (O/q, I/q)^T
        L3D_CHECK(g->ctx, gemm(g, 0, 1, Nq, Oq, Iq, xa, at, Iq, wb, wt, Iq, acc,
                               k || beta ? 1.0f : 0.0f));
    }
    return acc == y ? L3D_OK : l3d_dev_convert(g->dev, y, at, acc, L3D_FLOAT32, ys);
}

l3d_status l3d_tp2d_block_bwd_x(l3d_tp2d_t *g, void *dx, const void *dy, const void *w, int Nq,
                                int Iq, int Oq, float beta, l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(g->ctx, block_scratch(g, Nq, Iq, Oq));
    size_t xs = (size_t)Nq * (size_t)Iq, ws = (size_t)Oq * (size_t)Iq;
    for (int k = 0; k < g->q; k++) {
        // dx(i,k) = sum_j dy(i,j) W(k,j): W(k,j) along column j, partials reduced along row i
        // in the activations' dtype (into dx itself, or into a, free here, to be added to it)
        const void *wb = g->i == k ? w : (const void *)g->b;
        L3D_CHECK(g->ctx, l3d_comm_broadcast(g->col, w, (void *)wb, ws, wt, k));
        L3D_CHECK(g->ctx, gemm(g, 0, 0, Nq, Iq, Oq, dy, at, Oq, wb, wt, Iq, g->c, 0.0f));
        const void *part = g->c;  // (N/q, I/q)
        if (at != L3D_FLOAT32) {
            L3D_CHECK(g->ctx, l3d_dev_convert(g->dev, g->d, at, g->c, L3D_FLOAT32, xs));
            part = g->d;
        }
        void *to = beta != 0.0f ? (void *)g->a : dx;
        L3D_CHECK(g->ctx, l3d_comm_reduce(g->row, part, to, xs, at, L3D_SUM, k));
        if (beta != 0.0f && g->j == k) L3D_CHECK(g->ctx, l3d_dev_add(g->dev, dx, dx, g->a, xs, at));
    }
    return L3D_OK;
}

l3d_status l3d_tp2d_block_bwd_w(l3d_tp2d_t *g, float *dw, const void *dy, const void *x, int Nq,
                                int Iq, int Oq, l3d_dtype at) {
    L3D_CHECK(g->ctx, block_scratch(g, Nq, Iq, Oq));
    size_t xs = (size_t)Nq * (size_t)Iq, ws = (size_t)Oq * (size_t)Iq;
    for (int k = 0; k < g->q; k++) {
        // dW(k,j) += sum_i dy(i,j)^T x(i,k): x(i,k) along row i, partials reduced along
        // column j into b at (k,j), in float32 as the gradient is kept
        const void *xa = g->j == k ? x : (const void *)g->a;
        L3D_CHECK(g->ctx, l3d_comm_broadcast(g->row, x, (void *)xa, xs, at, k));
        L3D_CHECK(g->ctx, gemm(g, 1, 0, Oq, Iq, Nq, dy, at, Oq, xa, at, Iq, g->c, 0.0f));
        L3D_CHECK(g->ctx, l3d_comm_reduce(g->col, g->c, g->b, ws, L3D_FLOAT32, L3D_SUM, k));
        if (g->i == k) L3D_CHECK(g->ctx, l3d_dev_add(g->dev, dw, dw, g->b, ws, L3D_FLOAT32));
    }
    return L3D_OK;
}

l3d_status l3d_tp2d_linear_fwd(l3d_tp2d_t *g, float *y, const float *x, const float *w, int N,
                               int I, int O) {
    int Nq = 0, Iq = 0, Oq = 0;
    L3D_CHECK(g->ctx, blocks(g, N, I, O, &Nq, &Iq, &Oq));
    return l3d_tp2d_block_fwd(g, y, x, w, Nq, Iq, Oq, 0.0f, L3D_FLOAT32, L3D_FLOAT32);
}

l3d_status l3d_tp2d_linear_bwd(l3d_tp2d_t *g, float *dx, float *dw, const float *dy,
                               const float *x, const float *w, int N, int I, int O) {
    int Nq = 0, Iq = 0, Oq = 0;
    L3D_CHECK(g->ctx, blocks(g, N, I, O, &Nq, &Iq, &Oq));
    L3D_CHECK(g->ctx, l3d_tp2d_block_bwd_x(g, dx, dy, w, Nq, Iq, Oq, 0.0f, L3D_FLOAT32,
                                           L3D_FLOAT32));
    return l3d_tp2d_block_bwd_w(g, dw, dy, x, Nq, Iq, Oq, L3D_FLOAT32);
}

void l3d_tp2d_linear_bytes(int q, int N, int I, int O, int es, uint64_t fwd[2], uint64_t bwd[2],
                           uint64_t calls_fwd[2], uint64_t calls_bwd[2]) {
    uint64_t xs = (uint64_t)(N / q) * (uint64_t)(I / q), ws = (uint64_t)(O / q) * (uint64_t)(I / q);
    // every member counts every broadcast and reduce of its row or column: q steps; x, W and
    // dx move in es bytes an element, the weight gradient's partials in float32
    fwd[0] = (uint64_t)q * xs * es, fwd[1] = (uint64_t)q * ws * es;
    bwd[0] = 2 * (uint64_t)q * xs * es, bwd[1] = (uint64_t)q * ws * (es + sizeof(float));
    calls_fwd[0] = calls_fwd[1] = (uint64_t)q;
    calls_bwd[0] = calls_bwd[1] = 2 * (uint64_t)q;
}
