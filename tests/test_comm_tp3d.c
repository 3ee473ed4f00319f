// The 3D linear layer of core/model/tp3d.h on q x q x q rank cubes (q = 2: 8 ranks over every built
// transport; q = 3: 27 ranks as threads) in both orientations: each rank's blocks of
// y = x W^T, dx = dy W and dW += dy^T x against a float64 product of the whole matrices, and
// the bytes and calls each rank counts on its three axis communicators against
// l3d_tp3d_linear_bytes. A chain of an "A" layer feeding a "B" layer checks that y's layout is
// the next layer's x layout.
//
// Tolerance: gamma_K of the product's terms (gamma_{K+1} for +=), derived in
// tests/harness/dense_ref.h; the chain's is derived at its check.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm/reduce.h"
#include "core/model/tp3d.h"
#include "llama3d/llama3d.h"
#include "tests/harness/dense_ref.h"
#include "tests/harness/world.h"

#define F L3D_FLOAT32
enum { N = 36, I = 18, O = 36, O2 = 36 };  // for q = 2 and 3: N, O, O2 multiples of q^2, I of q

// rows [r0, r0+nr), columns [c0, c0+nc) of a matrix with `cols` columns
static float *sub(const float *m, int cols, int r0, int nr, int c0, int nc) {
    float *b = malloc((size_t)nr * nc * sizeof(float) + 1);
    for (int r = 0; r < nr; r++)
        memcpy(b + (size_t)r * nc, m + (size_t)(r0 + r) * cols + c0, (size_t)nc * sizeof(float));
    return b;
}

// This rank's coordinates on the contracted (sa) and output (sb) axes of an orientation.
static void coords(const l3d_tp3d_t *g, int orient, int *sa, int *sb) {
    *sa = orient == L3D_TP3D_A ? g->c[2] : g->c[1];
    *sb = orient == L3D_TP3D_A ? g->c[1] : g->c[2];
}

static int stats_match(l3d_tp3d_t *g, const l3d_comm_stats_t *s0, const l3d_comm_stats_t *s1,
                       const l3d_comm_stats_t *s2, int orient, int es, char *err, size_t errlen) {
    uint64_t bf[3], bb[3], cf[3], cb[3];
    l3d_tp3d_linear_bytes(g->q, orient, N, I, O, es, bf, bb, cf, cb);
    for (int ax = 0; ax < 3; ax++) {
        uint64_t fb = s1[ax].bytes - s0[ax].bytes, fc = s1[ax].calls - s0[ax].calls;
        uint64_t wb = s2[ax].bytes - s1[ax].bytes, wc = s2[ax].calls - s1[ax].calls;
        if (fb != bf[ax] || fc != cf[ax] || wb != bb[ax] || wc != cb[ax]) {
            snprintf(err, errlen, "orientation %d, axis %d: counted fwd %llu B / %llu calls, "
                     "bwd %llu / %llu; formula %llu / %llu, %llu / %llu", orient, ax,
                     (unsigned long long)fb, (unsigned long long)fc, (unsigned long long)wb,
                     (unsigned long long)wc, (unsigned long long)bf[ax],
                     (unsigned long long)cf[ax], (unsigned long long)bb[ax],
                     (unsigned long long)cb[ax]);
            return 1;
        }
    }
    return 0;
}

static void snap(l3d_tp3d_t *g, l3d_comm_stats_t s[3]) {
    for (int ax = 0; ax < 3; ax++) l3d_comm_get_stats(g->axis[ax], &s[ax]);
}

// 16-bit blocks: a matrix rounded to bfloat16 in place (the float64 reference then multiplies
// exactly the values the ranks hold), a block packed as bfloat16 and widened back
static void round_bf16(float *m, size_t n) {
    for (size_t k = 0; k < n; k++) m[k] = l3d_bf16_to_f32(l3d_f32_to_bf16(m[k]));
}
static void *pack(const float *m, size_t n, int b16) {
    if (!b16) return (void *)m;
    uint16_t *h = malloc(n * sizeof(uint16_t) + 1);
    for (size_t k = 0; k < n; k++) h[k] = l3d_f32_to_bf16(m[k]);
    return h;
}
static void unpack(void *h, float *m, size_t n, int b16) {
    if (!b16) return;
    for (size_t k = 0; k < n; k++) m[k] = l3d_bf16_to_f32(((uint16_t *)h)[k]);
    free(h);
}

// One layer of orientation `orient`, forward (beta 0 and 1) and backward, against float64;
// b16: bfloat16 activations and weights (float32 dW). Their roundings (u = 2^-8, the rel of
// l3d_ref_check_rel): each rank's partial y or dx is rounded before the reduce-scatter, which
// sums in float32 and rounds once more (2u); += rounds its add (3u).
static int one_layer(l3d_tp3d_t *g, int orient, int b16, char *err, size_t errlen) {
    int q = g->q, i = g->c[0], sa, sb, Nr = N / (q * q), Iq = I / q, Oq = O / q, Ow = Oq / q;
    coords(g, orient, &sa, &sb);
    l3d_dtype t = b16 ? L3D_BFLOAT16 : F;
    double u = b16 ? ldexp(1.0, -8) : 0.0;
    float *X = l3d_ref_full(1, N, I), *W = l3d_ref_full(2, O, I);
    float *dY = l3d_ref_full(3, N, O), *dW0 = l3d_ref_full(4, O, I);
    float *Y0 = l3d_ref_full(5, N, O), *dX0 = l3d_ref_full(6, N, I);
    if (b16) {
        round_bf16(X, (size_t)N * I), round_bf16(W, (size_t)O * I), round_bf16(dY, (size_t)N * O);
        round_bf16(Y0, (size_t)N * O), round_bf16(dX0, (size_t)N * I);
    }
    int xr = (i * q + sb) * Nr, yr = (i * q + sa) * Nr, wr = sb * Oq + i * Ow;
    size_t xs = (size_t)Nr * Iq, ws = (size_t)Ow * Iq, ys = (size_t)Nr * Oq;
    float *x = sub(X, I, xr, Nr, sa * Iq, Iq), *w = sub(W, I, wr, Ow, sa * Iq, Iq);
    float *dy = sub(dY, O, yr, Nr, sb * Oq, Oq), *dw = sub(dW0, I, wr, Ow, sa * Iq, Iq);
    float *y = sub(Y0, O, yr, Nr, sb * Oq, Oq), *dx = sub(dX0, I, xr, Nr, sa * Iq, Iq);
    float *y1 = calloc(ys, sizeof(float));
    float *dx1 = calloc(xs, sizeof(float));
    void *xv = pack(x, xs, b16), *wv = pack(w, ws, b16), *dyv = pack(dy, ys, b16);
    void *yv = pack(y, ys, b16), *dxv = pack(dx, xs, b16);
    void *y1v = pack(y1, ys, b16), *dx1v = pack(dx1, xs, b16);
    l3d_comm_stats_t s0[3], s1[3], s2[3];
    int rc = 1;
    l3d_ctx_t *ctx = g->ctx;
    snap(g, s0);
    if (l3d_tp3d_block_fwd(g, orient, y1v, xv, wv, Nr, Iq, Oq, 0.0f, t, t) < 0) goto fail;
    snap(g, s1);
    if (l3d_tp3d_block_bwd(g, orient, dx1v, 0.0f, dw, dyv, xv, wv, Nr, Iq, Oq, t, t) < 0)
        goto fail;
    snap(g, s2);
    if (l3d_tp3d_block_fwd(g, orient, yv, xv, wv, Nr, Iq, Oq, 1.0f, t, t) < 0 ||
        l3d_tp3d_block_bwd(g, orient, dxv, 1.0f, NULL, dyv, xv, wv, Nr, Iq, Oq, t, t) < 0)
        goto fail;
    unpack(y1v, y1, ys, b16), unpack(dx1v, dx1, xs, b16), unpack(yv, y, ys, b16);
    unpack(dxv, dx, xs, b16);
    y1v = dx1v = yv = dxv = NULL;
    // y's block: rows yr.., columns sb*Oq.. of X W^T; dx: rows xr.., columns sa*Iq.. of dY W;
    // dW: rows wr.., columns sa*Iq.. of dW0 + dY^T X
    if (l3d_ref_check_rel("y", y1, Nr, Oq, yr, sb * Oq, I, X, I, 1, W, 1, I, NULL, 0, 2 * u,
                          err, errlen) ||
        l3d_ref_check_rel("y+=", y, Nr, Oq, yr, sb * Oq, I, X, I, 1, W, 1, I, Y0, O, 3 * u, err,
                          errlen) ||
        l3d_ref_check_rel("dx", dx1, Nr, Iq, xr, sa * Iq, O, dY, O, 1, W, I, 1, NULL, 0, 2 * u,
                          err, errlen) ||
        l3d_ref_check_rel("dx+=", dx, Nr, Iq, xr, sa * Iq, O, dY, O, 1, W, I, 1, dX0, I, 3 * u,
                          err, errlen) ||
        l3d_ref_check("dW", dw, Ow, Iq, wr, sa * Iq, N, dY, 1, O, X, I, 1, dW0, I, err,
                      errlen) ||
        stats_match(g, s0, s1, s2, orient, (int)l3d_dtype_size(t), err, errlen))
        goto out;
    rc = 0;
    goto out;
fail:
    snprintf(err, errlen, "orientation %d%s: %s", orient, b16 ? " bf16" : "",
             l3d_ctx_last_error(ctx));
out:
    if (b16) {
        free(xv), free(wv), free(dyv), free(yv), free(dxv), free(y1v), free(dx1v);
    }
    free(X), free(W), free(dY), free(dW0), free(Y0), free(dX0);
    free(x), free(w), free(dy), free(dw), free(y), free(dx), free(y1), free(dx1);
    return rc;
}

// z = (x W^T) V^T: an "A" layer's output fed to a "B" layer as it lies.
static int chain(l3d_tp3d_t *g, char *err, size_t errlen) {
    int q = g->q, i = g->c[0], j = g->c[1], l = g->c[2], Nr = N / (q * q), Iq = I / q;
    int Oq = O / q, O2q = O2 / q;
    float *X = l3d_ref_full(1, N, I), *W = l3d_ref_full(2, O, I), *V = l3d_ref_full(7, O2, O);
    // A: contracted l, output j. B: contracted j, output l.
    float *x = sub(X, I, (i * q + j) * Nr, Nr, l * Iq, Iq);
    float *w = sub(W, I, j * Oq + i * (Oq / q), Oq / q, l * Iq, Iq);
    float *v = sub(V, O, l * O2q + i * (O2q / q), O2q / q, j * Oq, Oq);
    float *y = calloc((size_t)Nr * Oq, sizeof(float));
    float *z = calloc((size_t)Nr * O2q, sizeof(float));
    float *Y = malloc((size_t)N * O * sizeof(float));
    int rc = 1;
    if (l3d_tp3d_block_fwd(g, L3D_TP3D_A, y, x, w, Nr, Iq, Oq, 0.0f, F, F) < 0 ||
        l3d_tp3d_block_fwd(g, L3D_TP3D_B, z, y, v, Nr, Oq, O2q, 0.0f, F, F) < 0) {
        snprintf(err, errlen, "chain: %s", l3d_ctx_last_error(g->ctx));
        goto out;
    }
    // Y = X W^T in float64 rounded to float32, as the first layer's output stands in for it
    for (int r = 0; r < N; r++)
        for (int c = 0; c < O; c++) {
            double e = 0;
            for (int k = 0; k < I; k++) e += (double)X[r * I + k] * W[c * I + k];
            Y[r * O + c] = (float)e;
        }
    // z's rows (i*q + j) (the residual stream's again), columns l*O2q... The computed y is
    // within (gamma_I + u) of Y's terms (its own error plus Y's rounding): that error through V
    // (sy), and the second product's gamma_O over |y V| <= s + that error.
    {
        double gI = l3d_ref_gamma(I) + ldexp(1.0, -24);
        for (int r = 0; r < Nr; r++)
            for (int c = 0; c < O2q; c++) {
                int R = (i * q + j) * Nr + r, Cc = l * O2q + c;
                double e = 0, s = 0, sy = 0;
                for (int k = 0; k < O; k++) {
                    double ay = 0;
                    for (int t = 0; t < I; t++) ay += fabs((double)X[R * I + t] * W[k * I + t]);
                    e += (double)Y[R * O + k] * V[Cc * O + k];
                    s += fabs((double)Y[R * O + k] * V[Cc * O + k]);
                    sy += ay * fabs((double)V[Cc * O + k]);
                }
                double bound = l3d_ref_gamma(O) * s + gI * sy * (1 + l3d_ref_gamma(O));
                if (fabs(z[r * O2q + c] - e) > bound) {
                    snprintf(err, errlen, "chain z[%d][%d] = %.9g, float64 %.9g (bound %.3g)", R,
                             Cc, z[r * O2q + c], e, bound);
                    goto out;
                }
            }
    }
    rc = 0;
out:
    free(X), free(W), free(V), free(x), free(w), free(v), free(y), free(z), free(Y);
    return rc;
}

// arg: NULL for float32, non-NULL for bfloat16 blocks
static int rank_body(l3d_comm_t *world, void *arg, char *err, size_t errlen) {
    int b16 = arg != NULL;
    l3d_ctx_t *ctx = l3d_comm_ctx(world);
    l3d_device_t *dev = NULL;
    l3d_device_params_t dp = {.num_threads = 1};
    l3d_tp3d_t *g = NULL;
    int rc = 1;
    if (l3d_device_create(ctx, "cpu", &dp, &dev) < 0 || l3d_tp3d_create(world, dev, &g) < 0) {
        snprintf(err, errlen, "setup: %s", l3d_ctx_last_error(ctx));
        goto out;
    }
    if (one_layer(g, L3D_TP3D_A, b16, err, errlen) || one_layer(g, L3D_TP3D_B, b16, err, errlen) ||
        (!b16 && chain(g, err, errlen)))
        goto out;
    rc = 0;
out:
    l3d_tp3d_destroy(g);
    l3d_device_destroy(dev);
    return rc;
}

Test(tp3d, cube_q2_matches_float64, .timeout = 300) {
    const char *names[8];
    int nt = l3d_world_transports(names, 8);
    for (int t = 0; t < nt; t++) {
        char err[512];
        int rc = l3d_world_run(names[t], 8, rank_body, NULL, 120, err, sizeof(err));
        cr_assert(rc == 0, "%s, 8 ranks: %s", names[t], err);
    }
}

Test(tp3d, cube_q3_matches_float64, .timeout = 300) {
    char err[512];
    int rc = l3d_world_run("local", 27, rank_body, NULL, 120, err, sizeof(err));
    cr_assert(rc == 0, "local, 27 ranks: %s", err);
}

static int not_cube(l3d_comm_t *world, void *arg, char *err, size_t errlen) {
    (void)arg;
    l3d_tp3d_t *g = NULL;
    l3d_status st = l3d_tp3d_create(world, NULL, &g);
    if (st != L3D_ERR_CONFIG || !strstr(l3d_ctx_last_error(l3d_comm_ctx(world)), "not a cube")) {
        snprintf(err, errlen, "tp 4: status %d, '%s'", st, l3d_ctx_last_error(l3d_comm_ctx(world)));
        l3d_tp3d_destroy(g);
        return 1;
    }
    return 0;
}

// bfloat16 blocks (the 16-bit training dtypes): the same products within their roundings,
// and half the bytes for x, W, y and dx (dW's partials stay float32)
Test(tp3d, cube_bf16_matches_float64, .timeout = 300) {
    static int on = 1;
    for (int n = 8; n <= 27; n += 19) {
        char err[512];
        int rc = l3d_world_run("local", n, rank_body, &on, 120, err, sizeof(err));
        cr_assert(rc == 0, "local, %d ranks, bf16: %s", n, err);
    }
}

Test(tp3d, tp_not_cube_is_refused) {
    char err[512];
    cr_assert(l3d_world_run("local", 4, not_cube, NULL, 30, err, sizeof(err)) == 0, "%s", err);
}
