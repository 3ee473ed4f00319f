// Every backward of the CPU device against central finite differences of a double-precision
// reimplementation of the forward. The scalar loss is L = sum(out * R) for a random R, so the
// backward is fed dout = R; the check is our float backward vs the FD of the double forward.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
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

static uint64_t rng_state = 1;
static void rng_seed(uint64_t s) { rng_state = s * 2862933555777941757ull + 3037000493ull; }
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
static float *fvec(size_t n, float amp) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = amp * frand();
    return x;
}
static double *todouble(const float *x, size_t n) {
    double *y = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

// A forward in double: returns L = sum(out * R) given the (perturbed) double inputs.
typedef double (*loss_fn)(void *ctx);

// Central differences of `loss` with respect to every `stride`-th element of x (double, in
// place perturbed and restored), compared to `grad` (float, from the device's backward).
static void check_fd(const char *what, loss_fn loss, void *lctx, double *x, size_t n,
                     const float *grad, size_t stride, double rtol) {
    double scale = 0.0, err = 0.0;
    size_t worst = 0, checked = 0;
    double worst_fd = 0.0;
    for (size_t i = 0; i < n; i += stride) {
        double x0 = x[i], h = 1e-5 * fmax(1.0, fabs(x0));
        x[i] = x0 + h;
        double lp = loss(lctx);
        x[i] = x0 - h;
        double lm = loss(lctx);
        x[i] = x0;
        double fd = (lp - lm) / (2.0 * h);
        scale = fmax(scale, fabs(fd));
        double e = fabs(fd - (double)grad[i]);
        if (e > err) err = e, worst = i, worst_fd = fd;
        checked++;
    }
    cr_assert_gt(checked, 0);
    if (scale == 0.0) {  // e.g. dq with a single key: the backward must be zero too
        cr_assert(err <= 1e-6, "%s: fd is zero but backward[%zu] = %g", what, worst,
                  (double)grad[worst]);
        return;
    }
    cr_assert(err <= rtol * scale, "%s: max error %.3g at %zu (backward %.9g, fd %.9g, scale %.3g)",
              what, err, worst, (double)grad[worst], worst_fd, scale);
}

// ---- embedding ----------------------------------------------------------------------------------
typedef struct {
    const int32_t *tok;
    double *table;
    const float *R;
    int N, C;
} emb_t;

static double emb_loss(void *p) {
    emb_t *e = p;
    double L = 0;
    for (int n = 0; n < e->N; n++)
        for (int c = 0; c < e->C; c++)
            L += e->table[(size_t)e->tok[n] * e->C + c] * e->R[(size_t)n * e->C + c];
    return L;
}

Test(cpu_grad, embedding) {
    env_t e = env_open(2);
    rng_seed(41);
    int N = 20, C = 24, V = 6;
    int32_t tok[20];
    for (int n = 0; n < N; n++) tok[n] = (n * 5 + 1) % V;
    float *table = fvec((size_t)V * C, 1), *R = fvec((size_t)N * C, 1);
    float *dt = calloc((size_t)V * C, sizeof(float));
    cr_assert_eq(l3d_dev_embedding_bwd(e.dev, dt, R, tok, N, C, L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
    emb_t ec = {tok, todouble(table, (size_t)V * C), R, N, C};
    check_fd("embedding dtable", emb_loss, &ec, ec.table, (size_t)V * C, dt, 1, 1e-4);
    free(table), free(R), free(dt), free(ec.table);
    env_close(e);
}

// ---- rmsnorm ------------------------------------------------------------------------------------
typedef struct {
    double *x, *w;
    const float *R;
    int N, C;
    double eps;
} rms_t;

static double rms_loss(void *p) {
    rms_t *r = p;
    double L = 0;
    for (int n = 0; n < r->N; n++) {
        const double *x = r->x + (size_t)n * r->C;
        double ss = 0;
        for (int c = 0; c < r->C; c++) ss += x[c] * x[c];
        double rs = 1.0 / sqrt(ss / r->C + r->eps);
        for (int c = 0; c < r->C; c++) L += x[c] * rs * r->w[c] * r->R[(size_t)n * r->C + c];
    }
    return L;
}

Test(cpu_grad, rmsnorm) {
    env_t e = env_open(2);
    rng_seed(43);
    int shapes[][2] = {{1, 16}, {5, 37}, {70, 24}};
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t n = (size_t)N * C;
        float *x = fvec(n, 2), *w = fvec(C, 1), *R = fvec(n, 1), *out = malloc(sizeof(float) * n);
        float *rstd = malloc(sizeof(float) * N), *dx = calloc(n, sizeof(float));
        float *dw = calloc(C, sizeof(float));
        cr_assert_eq(l3d_dev_rmsnorm_fwd(e.dev, out, rstd, x, w, N, C, 1e-5f, L3D_FLOAT32,
                                         L3D_FLOAT32), L3D_OK);
        cr_assert_eq(l3d_dev_rmsnorm_bwd(e.dev, dx, dw, R, x, w, rstd, N, C, L3D_FLOAT32,
                                         L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
        rms_t rc = {todouble(x, n), todouble(w, C), R, N, C, 1e-5};
        check_fd("rmsnorm dx", rms_loss, &rc, rc.x, n, dx, 1, 1e-3);
        check_fd("rmsnorm dw", rms_loss, &rc, rc.w, C, dw, 1, 1e-3);
        free(x), free(w), free(R), free(out), free(rstd), free(dx), free(dw), free(rc.x);
        free(rc.w);
    }
    env_close(e);
}

// ---- rope ---------------------------------------------------------------------------------------
typedef struct {
    double *x;
    const float *R, *cs, *sn;
    int B, T, NH, D, pos0;
} rope_t;

static double rope_loss(void *p) {
    rope_t *r = p;
    int half = r->D / 2;
    double L = 0;
    for (int b = 0; b < r->B; b++)
        for (int t = 0; t < r->T; t++)
            for (int h = 0; h < r->NH; h++) {
                size_t o = (((size_t)b * r->T + t) * r->NH + h) * r->D;
                for (int i = 0; i < half; i++) {
                    double c = r->cs[(size_t)(r->pos0 + t) * half + i];
                    double s = r->sn[(size_t)(r->pos0 + t) * half + i];
                    double x1 = r->x[o + i], x2 = r->x[o + i + half];
                    L += (x1 * c - x2 * s) * r->R[o + i] + (x2 * c + x1 * s) * r->R[o + i + half];
                }
            }
    return L;
}

Test(cpu_grad, rope_inverse_is_backward) {
    env_t e = env_open(2);
    rng_seed(47);
    int B = 2, T = 5, NH = 3, D = 16, pos0 = 3, half = D / 2, Tmax = pos0 + T;
    size_t n = (size_t)B * T * NH * D;
    float *cs = malloc(sizeof(float) * Tmax * half), *sn = malloc(sizeof(float) * Tmax * half);
    for (int t = 0; t < Tmax; t++)
        for (int i = 0; i < half; i++) {
            double a = t * pow(10000.0, -2.0 * i / D);
            cs[t * half + i] = (float)cos(a), sn[t * half + i] = (float)sin(a);
        }
    float *x = fvec(n, 1), *R = fvec(n, 1), *dx = malloc(sizeof(float) * n);
    memcpy(dx, R, sizeof(float) * n);
    cr_assert_eq(l3d_dev_rope(e.dev, dx, cs, sn, B, T, NH, D, pos0, 1, L3D_FLOAT32), L3D_OK);
    rope_t rc = {todouble(x, n), R, cs, sn, B, T, NH, D, pos0};
    check_fd("rope dx", rope_loss, &rc, rc.x, n, dx, 1, 1e-4);
    free(cs), free(sn), free(x), free(R), free(dx), free(rc.x);
    env_close(e);
}

// ---- attention ----------------------------------------------------------------------------------
typedef struct {
    double *q, *k, *v;
    const float *R;
    int B, Tq, Tk, H, KVH, D, Tmax;
} att_t;

static double att_loss(void *p) {
    att_t *a = p;
    int off = a->Tk - a->Tq, grp = a->H / a->KVH, D = a->D;
    double scale = 1.0 / sqrt((double)D), L = 0;
    double *s = malloc(sizeof(double) * a->Tk);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->H; h++)
            for (int i = 0; i < a->Tq; i++) {
                int g = h / grp, nj = i + off + 1;
                size_t qo = (((size_t)b * a->Tq + i) * a->H + h) * D;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < nj; j++) {
                    size_t ko = (size_t)b * a->Tmax * a->KVH * D + ((size_t)j * a->KVH + g) * D;
                    double d = 0;
                    for (int c = 0; c < D; c++) d += a->q[qo + c] * a->k[ko + c];
                    s[j] = d * scale;
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j < nj; j++) sum += exp(s[j] - mx);
                for (int j = 0; j < nj; j++) {
                    size_t vo = (size_t)b * a->Tmax * a->KVH * D + ((size_t)j * a->KVH + g) * D;
                    double pj = exp(s[j] - mx) / sum, dot = 0;
                    for (int c = 0; c < D; c++) dot += a->v[vo + c] * a->R[qo + c];
                    L += pj * dot;
                }
            }
    free(s);
    return L;
}

// dk/dv come back dense (B,Tk,KVH,D); the FD runs over k/v with capacity Tmax, so compare
// through a copy of the gradient laid out like k.
static float *spread_kv(const float *g, const att_t *a) {
    size_t n = (size_t)a->B * a->Tmax * a->KVH * a->D, row = (size_t)a->Tk * a->KVH * a->D;
    float *out = calloc(n, sizeof(float));
    for (int b = 0; b < a->B; b++)
        memcpy(out + (size_t)b * a->Tmax * a->KVH * a->D, g + (size_t)b * row, sizeof(float) * row);
    return out;
}

static void att_case(env_t e, int B, int Tq, int Tk, int H, int KVH, int D, int Tmax,
                     size_t stride) {
    size_t nq = (size_t)B * Tq * H * D, nkv = (size_t)B * Tmax * KVH * D;
    size_t ndk = (size_t)B * Tk * KVH * D;
    float *q = fvec(nq, 1.5f), *k = fvec(nkv, 1.5f), *v = fvec(nkv, 1), *R = fvec(nq, 1);
    float *out = malloc(sizeof(float) * nq), *lse = malloc(sizeof(float) * B * H * Tq);
    float *dq = malloc(sizeof(float) * nq), *dk = malloc(sizeof(float) * ndk);
    float *dv = malloc(sizeof(float) * ndk);
    l3d_attn_dims_t d = {B, Tq, Tk, H, KVH, D, Tmax == Tk ? 0 : (size_t)Tmax * KVH * D};
    cr_assert_eq(l3d_dev_attention_fwd(e.dev, out, lse, q, k, v, &d, L3D_FLOAT32), L3D_OK);
    cr_assert_eq(l3d_dev_attention_bwd(e.dev, dq, dk, dv, R, q, k, v, out, lse, &d, L3D_FLOAT32),
                 L3D_OK);
    att_t a = {todouble(q, nq), todouble(k, nkv), todouble(v, nkv), R, B, Tq, Tk, H, KVH, D, Tmax};
    float *dks = spread_kv(dk, &a), *dvs = spread_kv(dv, &a);
    char w[96];
    snprintf(w, sizeof(w), "attention B%d Tq%d Tk%d H%d KVH%d D%d", B, Tq, Tk, H, KVH, D);
    cr_log_info("%s", w);
    check_fd("attention dq", att_loss, &a, a.q, nq, dq, stride, 1e-3);
    check_fd("attention dk", att_loss, &a, a.k, nkv, dks, stride, 1e-3);
    check_fd("attention dv", att_loss, &a, a.v, nkv, dvs, stride, 1e-3);
    free(q), free(k), free(v), free(R), free(out), free(lse), free(dq), free(dk), free(dv);
    free(a.q), free(a.k), free(a.v), free(dks), free(dvs);
}

Test(cpu_grad, attention) {
    env_t e = env_open(2);
    rng_seed(53);
    att_case(e, 2, 7, 7, 4, 2, 8, 7, 1);      // GQA
    att_case(e, 1, 1, 1, 2, 2, 16, 1, 1);     // T = 1
    att_case(e, 1, 5, 5, 2, 2, 16, 5, 1);     // MHA
    att_case(e, 2, 3, 9, 4, 1, 8, 12, 1);     // decode with a prefix, strided kv
    att_case(e, 1, 70, 70, 2, 1, 8, 70, 7);   // two key tiles, MQA (every 7th element)
    env_close(e);
}

// ---- swiglu -------------------------------------------------------------------------------------
typedef struct {
    double *g, *u;
    const float *R;
    size_t n;
} swi_t;

static double swi_loss(void *p) {
    swi_t *s = p;
    double L = 0;
    for (size_t i = 0; i < s->n; i++) L += s->g[i] / (1.0 + exp(-s->g[i])) * s->u[i] * s->R[i];
    return L;
}

Test(cpu_grad, swiglu) {
    env_t e = env_open(2);
    rng_seed(59);
    size_t n = 300;
    float *g = fvec(n, 6), *u = fvec(n, 2), *R = fvec(n, 1);
    float *dg = malloc(sizeof(float) * n), *du = malloc(sizeof(float) * n);
    cr_assert_eq(l3d_dev_swiglu_bwd(e.dev, dg, du, R, g, u, n, L3D_FLOAT32), L3D_OK);
    swi_t s = {todouble(g, n), todouble(u, n), R, n};
    check_fd("swiglu dgate", swi_loss, &s, s.g, n, dg, 1, 1e-4);
    check_fd("swiglu dup", swi_loss, &s, s.u, n, du, 1, 1e-4);
    free(g), free(u), free(R), free(dg), free(du), free(s.g), free(s.u);
    env_close(e);
}

// ---- xent ---------------------------------------------------------------------------------------
// The gradient the op leaves in the logits is d(grad_scale * sum of losses)/dlogits.
typedef struct {
    double *z;
    const int32_t *t;
    int N, V;
    double gs;
} xent_t;

static double xent_loss(void *p) {
    xent_t *x = p;
    double L = 0;
    for (int n = 0; n < x->N; n++) {
        if (x->t[n] < 0) continue;
        const double *z = x->z + (size_t)n * x->V;
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < x->V; i++) mx = fmax(mx, z[i]);
        for (int i = 0; i < x->V; i++) s += exp(z[i] - mx);
        L += x->gs * (log(s) + mx - z[x->t[n]]);
    }
    return L;
}

Test(cpu_grad, xent) {
    env_t e = env_open(2);
    rng_seed(61);
    int N = 6, V = 50;
    int32_t t[6] = {3, -1, 49, 0, 17, -5};
    float *z = fvec((size_t)N * V, 4), *loss = malloc(sizeof(float) * N);
    xent_t x = {todouble(z, (size_t)N * V), t, N, V, 0.25};
    cr_assert_eq(l3d_dev_xent_fwd_bwd(e.dev, z, loss, t, N, V, 0.25f, L3D_FLOAT32), L3D_OK);
    check_fd("xent dlogits", xent_loss, &x, x.z, (size_t)N * V, z, 1, 1e-4);
    free(z), free(loss), free(x.z);
    env_close(e);
}
