// 3D tensor parallelism: the q x q x q cube and its linear layer (core/model/tp3d.h has the layout
// and the algorithm). Every product runs on the device's GEMM; every exchange is an all-gather
// or a reduce-scatter on one axis communicator, so their bytes are counted there.
#include <math.h>
#include <string.h>

#include "core/l3d_core.h"
#include "core/model/tp2d.h"
#include "core/model/tp3d.h"
#include "devices/device.h"

l3d_status l3d_tp3d_create(l3d_comm_t *tp, l3d_device_t *dev, l3d_tp3d_t **g_p) {
    l3d_ctx_t *ctx = l3d_comm_ctx(tp);
    int n = l3d_comm_size(tp), me = l3d_comm_rank(tp), q = (int)lround(cbrt((double)n));
    if (q * q * q != n)
        return l3d_error(ctx, L3D_ERR_CONFIG, "tp_mode 3d: tp %d is not a cube (q x q x q "
                         "ranks: 8, 27, 64, ...)", n);
    l3d_tp3d_t *g = l3d_calloc(ctx, 1, sizeof(*g), "tp3d");
    if (!g) return L3D_ERR_NOMEM;
    g->ctx = ctx, g->dev = dev, g->q = q;
    g->c[0] = me / (q * q), g->c[1] = me / q % q, g->c[2] = me % q;
    l3d_status st = L3D_OK;
    for (int ax = 0; ax < 3 && st >= 0; ax++) {
        // color: the other two coordinates; key: this one
        int o1 = g->c[(ax + 1) % 3], o2 = g->c[(ax + 2) % 3];
        st = l3d_comm_split(tp, o1 * q + o2, g->c[ax], &g->axis[ax]);
    }
    for (int ax = 1; ax < 3 && st >= 0; ax++) {
        // color: this coordinate; key: the other two
        int o1 = g->c[(ax + 1) % 3], o2 = g->c[(ax + 2) % 3];
        st = l3d_comm_split(tp, g->c[ax], ax == 1 ? o2 * q + o1 : o1 * q + o2, &g->plane[ax]);
    }
    if (st < 0) {
        l3d_tp3d_destroy(g);
        return st;
    }
    *g_p = g;
    return L3D_OK;
}

void l3d_tp3d_destroy(l3d_tp3d_t *g) {
    if (!g) return;
    float **bufs[] = {&g->a, &g->b, &g->c2, &g->d, &g->e};
    size_t caps[] = {g->cap_a, g->cap_b, g->cap_c, g->cap_d, g->cap_e};
    for (int k = 0; k < 5; k++)
        if (*bufs[k]) l3d_dev_free(g->dev, *bufs[k], caps[k] * sizeof(float), "tp3d");
    for (int ax = 0; ax < 3; ax++) l3d_comm_destroy(g->axis[ax]), l3d_comm_destroy(g->plane[ax]);
    l3d_free(g->ctx, g, sizeof(*g), "tp3d");
}

static l3d_status grow(l3d_tp3d_t *g, float **p, size_t *cap, size_t n) {
    return l3d_tp_scratch_grow(g->ctx, g->dev, p, cap, n, "tp3d");
}

// C(M,N) = op(A) op(B), row-major, dense; A and B of their dtypes, C float32.
static l3d_status gemm(l3d_tp3d_t *g, int ta, int tb, int M, int N, int K, const void *A,
                       l3d_dtype at, const void *B, l3d_dtype bt, float *C) {
    l3d_gemm_t p = {.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K, .alpha = 1.0f,
                    .beta = 0.0f, .A = A, .lda = ta ? M : K, .B = B, .ldb = tb ? K : N, .C = C,
                    .ldc = N, .a_type = at, .b_type = bt, .c_type = L3D_FLOAT32};
    return l3d_dev_gemm(g->dev, &p);
}

// The contracted (a) and the output (b) axis of an orientation.
static void axes(int orient, int *a, int *b) {
    *a = orient == L3D_TP3D_A ? 2 : 1;
    *b = orient == L3D_TP3D_A ? 1 : 2;
}

static l3d_status sizes_ok(l3d_tp3d_t *g, int Nr, int Iq, int Oq) {
    if (Nr < 1 || Iq < 1 || Oq < g->q || Oq % g->q)
        return l3d_error(g->ctx, L3D_ERR_INVALID_ARG, "tp_mode 3d: linear layer block (%d rows, "
                         "%d -> %d) does not split over a %d-cube: the output block must be a "
                         "multiple of %d", Nr, Iq, Oq, g->q, g->q);
    return L3D_OK;
}

// The gathered blocks this layer's products read, sizes (q Nr, Iq) and (Oq, Iq); the partial
// products (q Nr, Oq) and (Oq, Iq), float32; e: a partial rounded to 16 bits, or a received
// block to add. In floats (a 16-bit block uses half).
static l3d_status scratch(l3d_tp3d_t *g, int Nr, int Iq, int Oq) {
    size_t xs = (size_t)g->q * Nr * Iq, ws = (size_t)Oq * Iq, ys = (size_t)g->q * Nr * Oq;
    size_t big = xs > ys ? xs : ys, all = big > ws ? big : ws;
    L3D_CHECK(g->ctx, grow(g, &g->a, &g->cap_a, big));
    L3D_CHECK(g->ctx, grow(g, &g->b, &g->cap_b, ws));
    L3D_CHECK(g->ctx, grow(g, &g->c2, &g->cap_c, big));
    L3D_CHECK(g->ctx, grow(g, &g->d, &g->cap_d, all));
    return grow(g, &g->e, &g->cap_e, all);
}

// Reduce-scatters the float32 partial `part` (q*cnt elements) along axis ax into out (dtype
// t: = when beta 0, += when 1), in out's dtype: a 16-bit partial is rounded into e first.
// `tmp` (not part's buffer) receives the block to add.
static l3d_status scatter_into(l3d_tp3d_t *g, int ax, void *out, const float *part, size_t cnt,
                               float beta, void *tmp, l3d_dtype t) {
    const void *send = part;
    if (t != L3D_FLOAT32) {
        L3D_CHECK(g->ctx, l3d_dev_convert(g->dev, g->e, t, part, L3D_FLOAT32, cnt * g->q));
        send = g->e;
    }
    if (beta == 0.0f) return l3d_comm_reduce_scatter(g->axis[ax], send, out, cnt, t, L3D_SUM);
    L3D_CHECK(g->ctx, l3d_comm_reduce_scatter(g->axis[ax], send, tmp, cnt, t, L3D_SUM));
    return l3d_dev_add(g->dev, out, out, tmp, cnt, t);
}

l3d_status l3d_tp3d_block_fwd(l3d_tp3d_t *g, int orient, void *y, const void *x, const void *w,
                              int Nr, int Iq, int Oq, float beta, l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(g->ctx, sizes_ok(g, Nr, Iq, Oq));
    L3D_CHECK(g->ctx, scratch(g, Nr, Iq, Oq));
    int a, b, q = g->q, M = q * Nr;
    axes(orient, &a, &b);
    size_t xs = (size_t)Nr * Iq, ws = (size_t)(Oq / q) * Iq, ys = (size_t)Nr * Oq;
    // X(i, s_a) along b: (q Nr, Iq); W^T's block (s_a, s_b) along i: (Oq, Iq)
    L3D_CHECK(g->ctx, l3d_comm_allgather(g->axis[b], x, g->a, xs, at));
    L3D_CHECK(g->ctx, l3d_comm_allgather(g->axis[0], w, g->b, ws, wt));
    // partial Y(i, s_b) = X W^T over this rank's columns s_a    (q Nr, Iq) x (Oq, Iq)^T
    L3D_CHECK(g->ctx, gemm(g, 0, 1, M, Oq, Iq, g->a, at, g->b, wt, g->c2));
    // summed along a, rows (i*q + s_a) to this rank
    return scatter_into(g, a, y, g->c2, ys, beta, g->d, at);
}

l3d_status l3d_tp3d_block_bwd(l3d_tp3d_t *g, int orient, void *dx, float beta, float *dw,
                              const void *dy, const void *x, const void *w, int Nr, int Iq,
                              int Oq, l3d_dtype at, l3d_dtype wt) {
    L3D_CHECK(g->ctx, sizes_ok(g, Nr, Iq, Oq));
    L3D_CHECK(g->ctx, scratch(g, Nr, Iq, Oq));
    int a, b, q = g->q, M = q * Nr;
    axes(orient, &a, &b);
    size_t xs = (size_t)Nr * Iq, ws = (size_t)(Oq / q) * Iq, ys = (size_t)Nr * Oq;
    // dY(i, s_b) along a: (q Nr, Oq), into c2
    L3D_CHECK(g->ctx, l3d_comm_allgather(g->axis[a], dy, g->c2, ys, at));
    // dW first: x is read before dx is written, so dx may be x's buffer (a layer's input
    // gradient overwriting the input it no longer needs)
    if (dw) {
        // partial dW's block (s_b, s_a) = dY^T X over row block i, summed along i (in float32,
        // as the gradient is kept); the slice i*Oq/q.. of it is this rank's
        L3D_CHECK(g->ctx, l3d_comm_allgather(g->axis[b], x, g->a, xs, at));
        L3D_CHECK(g->ctx, gemm(g, 1, 0, Oq, Iq, M, g->c2, at, g->a, at, g->d));  // (Oq, Iq)
        L3D_CHECK(g->ctx, scatter_into(g, 0, dw, g->d, ws, 1.0f, g->b, L3D_FLOAT32));
    }
    if (dx) {
        // partial dX(i, s_a) = dY W over this rank's output columns s_b, summed along b
        L3D_CHECK(g->ctx, l3d_comm_allgather(g->axis[0], w, g->b, ws, wt));
        L3D_CHECK(g->ctx, gemm(g, 0, 0, M, Iq, Oq, g->c2, at, g->b, wt, g->a));  // (q Nr, Iq)
        L3D_CHECK(g->ctx, scatter_into(g, b, dx, g->a, xs, beta, g->d, at));
    }
    return L3D_OK;
}

void l3d_tp3d_linear_bytes(int q, int orient, int N, int I, int O, int es, uint64_t fwd[3],
                           uint64_t bwd[3], uint64_t calls_fwd[3], uint64_t calls_bwd[3]) {
    int a, b;
    axes(orient, &a, &b);
    // every all-gather and reduce-scatter counts its whole buffer: a gathered or a partial
    // block, (N/q, I/q), (O/q, I/q) or (N/q, O/q), in es bytes an element; the weight
    // gradient's partials in float32
    uint64_t e = (uint64_t)es, xb = (uint64_t)(N / q) * (uint64_t)(I / q);
    uint64_t wb = (uint64_t)(O / q) * (uint64_t)(I / q), yb = (uint64_t)(N / q) * (uint64_t)(O / q);
    for (int k = 0; k < 3; k++) fwd[k] = bwd[k] = calls_fwd[k] = calls_bwd[k] = 0;
    fwd[b] += xb * e, fwd[0] += wb * e, fwd[a] += yb * e;  // gather x, gather W, scatter y
    calls_fwd[b]++, calls_fwd[0]++, calls_fwd[a]++;
    bwd[a] += yb * e, bwd[0] += wb * (e + sizeof(float)), bwd[b] += 2 * xb * e;
    calls_bwd[a]++, calls_bwd[0] += 2, calls_bwd[b] += 2;  // gather dy; gather W, scatter dW;
                                                            // scatter dx, gather x
}
