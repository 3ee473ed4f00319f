// RMSNorm over rows split by columns (the device's rmsnorm_rowdot / rmsnorm_rows_fwd / _bwd,
// used by tensor parallelism "2d"): one block holding every column gives rmsnorm_fwd/bwd bit
// for bit, and rows cut into column blocks whose partial statistics are summed give the
// double-precision reference within a bound derived below.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"

typedef struct {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
} env_t;

static env_t env_open(int nthreads) {
    env_t e;
    cr_assert_eq(l3d_ctx_create(NULL, &e.ctx), L3D_OK);
    l3d_device_params_t p = {.num_threads = nthreads};
    cr_assert_eq(l3d_device_create(e.ctx, "cpu", &p, &e.dev), L3D_OK);
    return e;
}
static void env_close(env_t e) {
    l3d_device_destroy(e.dev);
    l3d_ctx_destroy(e.ctx);
}

static uint64_t rng = 1;
static float frand(void) {  // uniform in [-1, 1)
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *fvec(size_t n, float amp) {
    float *v = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = amp * frand();
    return v;
}
static float *fcopy(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}

Test(cpu_norm_rows, one_block_is_rmsnorm_bit_for_bit) {
    int shapes[][2] = {{1, 16}, {37, 100}, {70, 600}};
    for (int th = 1; th <= 3; th += 2) {
        env_t e = env_open(th);
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            int N = shapes[s][0], C = shapes[s][1];
            size_t NC = (size_t)N * C;
            float eps = 1e-5f;
            float *x = fvec(NC, 2.0f), *w = fvec(C, 1.0f), *dout = fvec(NC, 1.0f);
            float *dx0 = fvec(NC, 1.0f), *dw0 = fvec(C, 1.0f);
            float *dx1 = fcopy(dx0, NC), *dw1 = fcopy(dw0, C);
            float *o0 = fvec(NC, 1.0f), *o1 = fvec(NC, 1.0f), *r0 = fvec(N, 1.0f);
            float *r1 = fvec(N, 1.0f), *ss = fvec(N, 1.0f), *dot = fvec(N, 1.0f);
            l3d_dtype f = L3D_FLOAT32;
            cr_assert_eq(l3d_dev_rmsnorm_fwd(e.dev, o0, r0, x, w, N, C, eps, f, f), L3D_OK);
            cr_assert_eq(l3d_dev_rmsnorm_rowdot(e.dev, ss, x, x, NULL, N, C, f, f), L3D_OK);
            cr_assert_eq(l3d_dev_rmsnorm_rows_fwd(e.dev, o1, r1, x, w, ss, N, C, C, eps, f, f),
                         L3D_OK);
            cr_assert(!memcmp(o0, o1, NC * 4) && !memcmp(r0, r1, (size_t)N * 4),
                      "forward differs from rmsnorm_fwd (N %d C %d, %d threads)", N, C, th);
            cr_assert_eq(l3d_dev_rmsnorm_bwd(e.dev, dx0, dw0, dout, x, w, r0, N, C, f, f, f),
                         L3D_OK);
            cr_assert_eq(l3d_dev_rmsnorm_rowdot(e.dev, dot, dout, x, w, N, C, f, f), L3D_OK);
            cr_assert_eq(l3d_dev_rmsnorm_rows_bwd(e.dev, dx1, dw1, dout, x, w, r1, dot, N, C, C,
                                                  f, f, f), L3D_OK);
            cr_assert(!memcmp(dx0, dx1, NC * 4) && !memcmp(dw0, dw1, (size_t)C * 4),
                      "backward differs from rmsnorm_bwd (N %d C %d, %d threads)", N, C, th);
            free(x), free(w), free(dout), free(dx0), free(dw0), free(dx1), free(dw1);
            free(o0), free(o1), free(r0), free(r1), free(ss), free(dot);
        }
        env_close(e);
    }
}

// Rows of C columns cut into P blocks of C/P; each block's rowdot summed in float (as the
// all-reduce does), then the block ops; assembled, against float64.
static void split_case(env_t e, int N, int C, int P) {
    float eps = 1e-5f;
    int Cb = C / P;
    size_t NC = (size_t)N * C, NB = (size_t)N * Cb;
    float *x = fvec(NC, 2.0f), *w = fvec(C, 1.0f), *dout = fvec(NC, 1.0f);
    float *out = calloc(NC, 4), *dx = calloc(NC, 4), *dw = calloc(C, 4);
    float *ss = calloc(N, 4), *dot = calloc(N, 4), *part = calloc(N, 4), *rstd = calloc(N, 4);
    float *bx = malloc(NB * 4), *bd = malloc(NB * 4), *bo = malloc(NB * 4), *bdx = calloc(NB, 4);
    l3d_dtype f = L3D_FLOAT32;
    // the blocks of column p, contiguous (N, Cb) as a rank holds them
#define BLOCK(dst, src, p)                                                                   \
    for (int n = 0; n < N; n++)                                                              \
        memcpy(dst + (size_t)n * Cb, src + (size_t)n * C + (size_t)(p) * Cb, (size_t)Cb * 4);
    for (int p = 0; p < P; p++) {
        BLOCK(bx, x, p);
        cr_assert_eq(l3d_dev_rmsnorm_rowdot(e.dev, part, bx, bx, NULL, N, Cb, f, f), L3D_OK);
        for (int n = 0; n < N; n++) ss[n] += part[n];
    }
    for (int p = 0; p < P; p++) {
        BLOCK(bx, x, p);
        BLOCK(bd, dout, p);
        cr_assert_eq(l3d_dev_rmsnorm_rows_fwd(e.dev, bo, rstd, bx, w + p * Cb, ss, N, Cb, C, eps,
                                              f, f), L3D_OK);
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * C + (size_t)p * Cb, bo + (size_t)n * Cb, (size_t)Cb * 4);
        cr_assert_eq(l3d_dev_rmsnorm_rowdot(e.dev, part, bd, bx, w + p * Cb, N, Cb, f, f),
                     L3D_OK);
        for (int n = 0; n < N; n++) dot[n] += part[n];
    }
    for (int p = 0; p < P; p++) {
        BLOCK(bx, x, p);
        BLOCK(bd, dout, p);
        memset(bdx, 0, NB * 4);
        cr_assert_eq(l3d_dev_rmsnorm_rows_bwd(e.dev, bdx, dw + p * Cb, bd, bx, w + p * Cb, rstd,
                                              dot, N, Cb, C, f, f, f), L3D_OK);
        for (int n = 0; n < N; n++)
            memcpy(dx + (size_t)n * C + (size_t)p * Cb, bdx + (size_t)n * Cb, (size_t)Cb * 4);
    }
#undef BLOCK
    // Bound: each row sum (of C products) carries at most C*u relative error (u = 2^-24,
    // summed in float32 in any order), rstd half of it plus a few roundings (sqrt, divide),
    // and dx's second term rstd^3 * dot three halves of it; out and dx are then within about
    // 2*(C + 8)*u of their scale, dw (a sum over N rows) within (N + C + 8)*u.
    double u = ldexp(1.0, -24), tol_x = 2.0 * (C + 8) * u, tol_w = (double)(N + C + 8) * u;
    double eo = 0, so = 0, ex = 0, sx = 0, ew = 0, sw = 0;
    double *rdw = calloc(C, sizeof(double));
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *g = dout + (size_t)n * C;
        double s2 = 0, d = 0;
        for (int c = 0; c < C; c++) s2 += (double)xr[c] * xr[c], d += (double)g[c] * w[c] * xr[c];
        double r = 1.0 / sqrt(s2 / C + eps);
        for (int c = 0; c < C; c++) {
            double o = xr[c] * r * w[c], dd = r * g[c] * w[c] - r * r * r / C * d * xr[c];
            so = fmax(so, fabs(o)), eo = fmax(eo, fabs(o - out[(size_t)n * C + c]));
            sx = fmax(sx, fabs(dd)), ex = fmax(ex, fabs(dd - dx[(size_t)n * C + c]));
            rdw[c] += (double)g[c] * xr[c] * r;
        }
    }
    for (int c = 0; c < C; c++) sw = fmax(sw, fabs(rdw[c])), ew = fmax(ew, fabs(rdw[c] - dw[c]));
    cr_assert(eo <= tol_x * so, "N %d C %d P %d: out error %.3g > %.3g", N, C, P, eo, tol_x * so);
    cr_assert(ex <= tol_x * sx, "N %d C %d P %d: dx error %.3g > %.3g", N, C, P, ex, tol_x * sx);
    cr_assert(ew <= tol_w * sw, "N %d C %d P %d: dw error %.3g > %.3g", N, C, P, ew, tol_w * sw);
    free(rdw), free(x), free(w), free(dout), free(out), free(dx), free(dw), free(ss), free(dot);
    free(part), free(rstd), free(bx), free(bd), free(bo), free(bdx);
}

Test(cpu_norm_rows, split_blocks_match_float64) {
    env_t e = env_open(2);
    split_case(e, 37, 96, 2);
    split_case(e, 64, 96, 3);
    split_case(e, 5, 512, 4);
    env_close(e);
}

Test(cpu_norm_rows, bad_shapes) {
    env_t e = env_open(1);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, w[4] = {1, 1, 1, 1}, ss[2] = {1, 1}, out[8], r[2];
    l3d_dtype f = L3D_FLOAT32;
    // a block wider than its row
    cr_assert_eq(l3d_dev_rmsnorm_rows_fwd(e.dev, out, r, x, w, ss, 2, 4, 3, 1e-5f, f, f),
                 L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dev_rmsnorm_rowdot(e.dev, ss, x, x, NULL, 2, 0, f, f), L3D_ERR_INVALID_ARG);
    env_close(e);
}
