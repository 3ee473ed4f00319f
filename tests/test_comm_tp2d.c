// The 2D (SUMMA) linear layer of core/model/tp2d.h on q x q rank grids (q = 2: 4 ranks, q = 3: 9)
// over every built transport: each rank's blocks of y = x W^T, dx = dy W and dW += dy^T x
// against a float64 product of the whole matrices, and the bytes and calls each rank counts
// on its row and column communicators against l3d_tp2d_linear_bytes.
//
// Tolerance: gamma_K of the product's terms (gamma_{K+1} for dW's +=), derived in
// tests/harness/dense_ref.h; bfloat16 blocks add their roundings (rank_body).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm/reduce.h"
#include "core/model/tp2d.h"
#include "llama3d/llama3d.h"
#include "tests/harness/dense_ref.h"
#include "tests/harness/world.h"

enum { N = 24, I = 18, O = 30 };  // multiples of 2 and 3

// block (bi, bj) of a rows x cols matrix cut q x q
static float *block(const float *m, int rows, int cols, int q, int bi, int bj) {
    int br = rows / q, bc = cols / q;
    float *b = malloc((size_t)br * bc * sizeof(float));
    for (int r = 0; r < br; r++)
        memcpy(b + r * bc, m + (size_t)(bi * br + r) * cols + bj * bc, (size_t)bc * sizeof(float));
    return b;
}

// 16-bit blocks: a matrix rounded to bfloat16 in place (the float64 reference then multiplies
// exactly the values the ranks hold), and a block packed as bfloat16
static void round_bf16(float *m, size_t n) {
    for (size_t k = 0; k < n; k++) m[k] = l3d_bf16_to_f32(l3d_f32_to_bf16(m[k]));
}
static uint16_t *pack_bf16(const float *m, size_t n) {
    uint16_t *h = malloc(n * sizeof(uint16_t));
    for (size_t k = 0; k < n; k++) h[k] = l3d_f32_to_bf16(m[k]);
    return h;
}
static void unpack_bf16(const uint16_t *h, float *m, size_t n) {
    for (size_t k = 0; k < n; k++) m[k] = l3d_bf16_to_f32(h[k]);
}

// arg: NULL for float32, non-NULL for bfloat16 activations and weights (float32 dW). The
// bfloat16 results carry their own roundings (rel of l3d_ref_check_rel, u = 2^-8): y is
// summed in float32 and rounded once (u); each rank's dx partial is rounded before the row's
// reduce, which sums in float32 and rounds once more (2u).
static int rank_body(l3d_comm_t *world, void *arg, char *err, size_t errlen) {
    int b16 = arg != NULL;
    l3d_dtype t = b16 ? L3D_BFLOAT16 : L3D_FLOAT32;
    double u = b16 ? ldexp(1.0, -8) : 0.0;
    l3d_ctx_t *ctx = l3d_comm_ctx(world);
    l3d_device_t *dev = NULL;
    l3d_device_params_t dp = {.num_threads = 1};
    l3d_tp2d_t *g = NULL;
    int rc = 1;
    float *X = l3d_ref_full(1, N, I), *W = l3d_ref_full(2, O, I);
    float *dY = l3d_ref_full(3, N, O), *dW0 = l3d_ref_full(4, O, I);
    float *x = NULL, *w = NULL, *dy = NULL, *dw = NULL, *y = NULL, *dx = NULL;
    uint16_t *xh = NULL, *wh = NULL, *dyh = NULL, *yh = NULL, *dxh = NULL;
    if (b16) {
        round_bf16(X, (size_t)N * I), round_bf16(W, (size_t)O * I);
        round_bf16(dY, (size_t)N * O);
    }
    if (l3d_device_create(ctx, "cpu", &dp, &dev) < 0 || l3d_tp2d_create(world, dev, &g) < 0) {
        snprintf(err, errlen, "setup: %s", l3d_ctx_last_error(ctx));
        goto out;
    }
    int q = g->q, i = g->i, j = g->j, Nq = N / q, Iq = I / q, Oq = O / q;
    size_t xs = (size_t)Nq * Iq, ws = (size_t)Oq * Iq, ys = (size_t)Nq * Oq;
    // this rank's blocks: x (i,j); W rows j, columns i; dy (i,j)
    x = block(X, N, I, q, i, j);
    w = block(W, O, I, q, j, i);
    dy = block(dY, N, O, q, i, j);
    dw = block(dW0, O, I, q, j, i);
    y = calloc(ys, sizeof(float));
    dx = calloc(xs, sizeof(float));
    if (b16) {
        xh = pack_bf16(x, xs), wh = pack_bf16(w, ws), dyh = pack_bf16(dy, ys);
        yh = calloc(ys, sizeof(uint16_t)), dxh = calloc(xs, sizeof(uint16_t));
    }
    void *yv = b16 ? (void *)yh : y, *dxv = b16 ? (void *)dxh : dx;
    const void *xv = b16 ? (const void *)xh : x, *wv = b16 ? (const void *)wh : w;
    const void *dyv = b16 ? (const void *)dyh : dy;
    l3d_comm_reset_stats(g->row);
    l3d_comm_reset_stats(g->col);
    l3d_comm_stats_t sf[2], sb[2];
    l3d_status st = b16 ? l3d_tp2d_block_fwd(g, yv, xv, wv, Nq, Iq, Oq, 0.0f, t, t)
                        : l3d_tp2d_linear_fwd(g, y, x, w, N, I, O);
    if (st < 0) {
        snprintf(err, errlen, "fwd: %s", l3d_ctx_last_error(ctx));
        goto out;
    }
    l3d_comm_get_stats(g->row, &sf[0]);
    l3d_comm_get_stats(g->col, &sf[1]);
    if (b16) {
        st = l3d_tp2d_block_bwd_x(g, dxv, dyv, wv, Nq, Iq, Oq, 0.0f, t, t);
        if (st >= 0) st = l3d_tp2d_block_bwd_w(g, dw, dyv, xv, Nq, Iq, Oq, t);
        unpack_bf16(yh, y, ys), unpack_bf16(dxh, dx, xs);
    } else {
        st = l3d_tp2d_linear_bwd(g, dx, dw, dy, x, w, N, I, O);
    }
    if (st < 0) {
        snprintf(err, errlen, "bwd: %s", l3d_ctx_last_error(ctx));
        goto out;
    }
    l3d_comm_get_stats(g->row, &sb[0]);
    l3d_comm_get_stats(g->col, &sb[1]);
    // y(i,j) of X W^T; dx(i,j) of dY W; dw: rows j*Oq.., columns i*Iq.. of dW0 + dY^T X
    if (l3d_ref_check_rel("y", y, Nq, Oq, i * Nq, j * Oq, I, X, I, 1, W, 1, I, NULL, 0, u, err,
                          errlen) ||
        l3d_ref_check_rel("dx", dx, Nq, Iq, i * Nq, j * Iq, O, dY, O, 1, W, I, 1, NULL, 0, 2 * u,
                          err, errlen) ||
        l3d_ref_check("dW", dw, Oq, Iq, j * Oq, i * Iq, N, dY, 1, O, X, I, 1, dW0, I, err,
                      errlen))
        goto out;
    uint64_t bf[2], bb[2], cf[2], cb[2];
    l3d_tp2d_linear_bytes(q, N, I, O, (int)l3d_dtype_size(t), bf, bb, cf, cb);
    for (int s = 0; s < 2; s++) {
        uint64_t bwd_bytes = sb[s].bytes - sf[s].bytes, bwd_calls = sb[s].calls - sf[s].calls;
        if (sf[s].bytes != bf[s] || sf[s].calls != cf[s] || bwd_bytes != bb[s] ||
            bwd_calls != cb[s]) {
            snprintf(err, errlen, "%s: counted fwd %llu B / %llu calls, bwd %llu / %llu; formula "
                     "%llu / %llu, %llu / %llu", s ? "column" : "row",
                     (unsigned long long)sf[s].bytes, (unsigned long long)sf[s].calls,
                     (unsigned long long)bwd_bytes, (unsigned long long)bwd_calls,
                     (unsigned long long)bf[s], (unsigned long long)cf[s],
                     (unsigned long long)bb[s], (unsigned long long)cb[s]);
            goto out;
        }
    }
    rc = 0;
out:
    l3d_tp2d_destroy(g);
    l3d_device_destroy(dev);
    free(X), free(W), free(dY), free(dW0);
    free(x), free(w), free(dy), free(dw), free(y), free(dx);
    free(xh), free(wh), free(dyh), free(yh), free(dxh);
    return rc;
}

static void grid(int nranks, int b16) {
    static int on = 1;
    const char *names[8];
    int nt = l3d_world_transports(names, 8);
    for (int t = 0; t < nt; t++) {
        char err[512];
        int rc = l3d_world_run(names[t], nranks, rank_body, b16 ? &on : NULL, 60, err,
                               sizeof(err));
        cr_assert(rc == 0, "%s, %d ranks%s: %s", names[t], nranks, b16 ? ", bf16" : "", err);
    }
}

Test(tp2d, summa_q2_matches_float64) { grid(4, 0); }
Test(tp2d, summa_q3_matches_float64) { grid(9, 0); }
// bfloat16 blocks (the 16-bit training dtypes): the same products within their roundings, and
// half the bytes for x, W and dx (dW's partials stay float32)
Test(tp2d, summa_bf16_matches_float64) {
    grid(4, 1);
    grid(9, 1);
}

static int not_square(l3d_comm_t *world, void *arg, char *err, size_t errlen) {
    (void)arg;
    l3d_tp2d_t *g = NULL;
    l3d_status st = l3d_tp2d_create(world, NULL, &g);
    if (st != L3D_ERR_CONFIG || !strstr(l3d_ctx_last_error(l3d_comm_ctx(world)), "not a square")) {
        snprintf(err, errlen, "tp 2: status %d, '%s'", st, l3d_ctx_last_error(l3d_comm_ctx(world)));
        l3d_tp2d_destroy(g);
        return 1;
    }
    return 0;
}

Test(tp2d, tp_not_square_is_refused) {
    char err[512];
    cr_assert(l3d_world_run("local", 2, not_square, NULL, 30, err, sizeof(err)) == 0, "%s", err);
}
