// The 3D linear layer of core/tp3d.h on q x q x q rank cubes (q = 2: 8 ranks over every built
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

#include "core/tp3d.h"
#include "llama3d/llama3d.h"
#include "tests/harness/dense_ref.h"
#include "tests/harness/world.h"

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
                       const l3d_comm_stats_t *s2, int orient, char *err, size_t errlen) {
    uint64_t bf[3], bb[3], cf[3], cb[3];
    l3d_tp3d_linear_bytes(g->q, orient, N, I, O, bf, bb, cf, cb);
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

// One layer of orientation `orient`, forward (beta 0 and 1) and backward, against float64.
static int one_layer(l3d_tp3d_t *g, int orient, char *err, size_t errlen) {
    int q = g->q, i = g->c[0], sa, sb, Nr = N / (q * q), Iq = I / q, Oq = O / q, Ow = Oq / q;
    coords(g, orient, &sa, &sb);
    float *X = l3d_ref_full(1, N, I), *W = l3d_ref_full(2, O, I);
    float *dY = l3d_ref_full(3, N, O), *dW0 = l3d_ref_full(4, O, I);
    float *Y0 = l3d_ref_full(5, N, O), *dX0 = l3d_ref_full(6, N, I);
    int xr = (i * q + sb) * Nr, yr = (i * q + sa) * Nr, wr = sb * Oq + i * Ow;
    float *x = sub(X, I, xr, Nr, sa * Iq, Iq), *w = sub(W, I, wr, Ow, sa * Iq, Iq);
    float *dy = sub(dY, O, yr, Nr, sb * Oq, Oq), *dw = sub(dW0, I, wr, Ow, sa * Iq, Iq);
    float *y = sub(Y0, O, yr, Nr, sb * Oq, Oq), *dx = sub(dX0, I, xr, Nr, sa * Iq, Iq);
    float *y1 = calloc((size_t)Nr * Oq, sizeof(float));
    float *dx1 = calloc((size_t)Nr * Iq, sizeof(float));
    l3d_comm_stats_t s0[3], s1[3], s2[3];
    int rc = 1;
    l3d_ctx_t *ctx = g->ctx;
    snap(g, s0);
    if (l3d_tp3d_block_fwd(g, orient, y1, x, w, Nr, Iq, Oq, 0.0f) < 0) goto fail;
    snap(g, s1);
    if (l3d_tp3d_block_bwd(g, orient, dx1, 0.0f, dw, dy, x, w, Nr, Iq, Oq) < 0) goto fail;
    snap(g, s2);
    if (l3d_tp3d_block_fwd(g, orient, y, x, w, Nr, Iq, Oq, 1.0f) < 0 ||
        l3d_tp3d_block_bwd(g, orient, dx, 1.0f, NULL, dy, x, w, Nr, Iq, Oq) < 0)
        goto fail;
    // y's block: rows yr.., columns sb*Oq.. of X W^T; dx: rows xr.., columns sa*Iq.. of dY W;
    // dW: rows wr.., columns sa*Iq.. of dW0 + dY^T X
    if (l3d_ref_check("y", y1, Nr, Oq, yr, sb * Oq, I, X, I, 1, W, 1, I, NULL, 0, err,
                      errlen) ||
        l3d_ref_check("y+=", y, Nr, Oq, yr, sb * Oq, I, X, I, 1, W, 1, I, Y0, O, err, errlen) ||
        l3d_ref_check("dx", dx1, Nr, Iq, xr, sa * Iq, O, dY, O, 1, W, I, 1, NULL, 0, err,
                      errlen) ||
        l3d_ref_check("dx+=", dx, Nr, Iq, xr, sa * Iq, O, dY, O, 1, W, I, 1, dX0, I, err,
                      errlen) ||
        l3d_ref_check("dW", dw, Ow, Iq, wr, sa * Iq, N, dY, 1, O, X, I, 1, dW0, I, err,
                      errlen) ||
        stats_match(g, s0, s1, s2, orient, err, errlen))
        goto out;
    rc = 0;
    goto out;
fail:
    snprintf(err, errlen, "orientation %d: %s", orient, l3d_ctx_last_error(ctx));
out:
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
    if (l3d_tp3d_block_fwd(g, L3D_TP3D_A, y, x, w, Nr, Iq, Oq, 0.0f) < 0 ||
        l3d_tp3d_block_fwd(g, L3D_TP3D_B, z, y, v, Nr, Oq, O2q, 0.0f) < 0) {
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

static int rank_body(l3d_comm_t *world, void *arg, char *err, size_t errlen) {
    (void)arg;
    l3d_ctx_t *ctx = l3d_comm_ctx(world);
    l3d_device_t *dev = NULL;
    l3d_device_params_t dp = {.num_threads = 1};
    l3d_tp3d_t *g = NULL;
    int rc = 1;
    if (l3d_device_create(ctx, "cpu", &dp, &dev) < 0 || l3d_tp3d_create(world, dev, &g) < 0) {
        snprintf(err, errlen, "setup: %s", l3d_ctx_last_error(ctx));
        goto out;
    }
    if (one_layer(g, L3D_TP3D_A, err, errlen) || one_layer(g, L3D_TP3D_B, err, errlen) ||
        chain(g, err, errlen))
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

Test(tp3d, tp_not_cube_is_refused) {
    char err[512];
    cr_assert(l3d_world_run("local", 4, not_cube, NULL, 30, err, sizeof(err)) == 0, "%s", err);
}
