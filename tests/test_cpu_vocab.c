// The CPU device's vocabulary-parallel (tensor-parallel) embedding and cross-entropy: each
// shard against the one-rank ops, the three split passes against the fused one, argument
// errors, and bit-identical results across thread counts. Split from test_cpu_ops.c.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "tests/harness/cpu_env.h"
#include "tests/harness/ref_ops.h"

// Column (vocabulary) shard boundaries b[0..k] of V: uneven by design (weights per k), so a
// shard may have one column or none when V is small.
static void vp_bounds(int V, int k, int *b) {
    static const int w[5][4] = {{1}, {1}, {2, 3}, {1, 4, 2}, {3, 1, 4, 2}};
    int total = 0, cum = 0;
    for (int i = 0; i < k; i++) total += w[k][i];
    b[0] = 0;
    for (int i = 0; i < k; i++) {
        cum += w[k][i];
        b[i + 1] = (int)((long long)V * cum / total);
    }
}

// Each shard against the unsplit table: owned rows copied exactly, the others zero, so the sum
// over shards is the full embedding; the backward adds only owned rows, ignoring the others
// (negative or >= V tokens included, as the contract says).
Test(cpu_embedding_vp, fwd_bwd_per_shard) {
    env_t e = env_open(2);
    rng_seed(41);
    const int N = 45, C = 70, V = 13;  // several row tasks (32) and column slices (64)
    float *table = fvec((size_t)V * C, 1.0f), *out = malloc(sizeof(float) * N * C);
    float *sum = calloc((size_t)N * C, sizeof(float)), *dout = fvec((size_t)N * C, 1.0f);
    int32_t tok[45], btok[45];
    for (int n = 0; n < N; n++) tok[n] = (n * 7 + n / 3) % V;  // repeats: scatter must add
    for (int n = 0; n < N; n++) btok[n] = n % 9 == 4 ? -1 : (n % 9 == 7 ? V + 3 : tok[n]);
    for (int k = 1; k <= 4; k++) {
        int b[5];
        vp_bounds(V, k, b);
        memset(sum, 0, sizeof(float) * N * C);
        for (int s = 0; s < k; s++) {
            int v0 = b[s], Vl = b[s + 1] - b[s];
            const float *tab = table + (size_t)v0 * C;  // this rank's rows (Vl,C)
            for (size_t i = 0; i < (size_t)N * C; i++) out[i] = 99.0f;
            cr_assert_eq(l3d_dev_embedding_fwd_vp(e.dev, out, tok, tab, N, C, v0, Vl, V,
                                                  L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
            for (int n = 0; n < N; n++) {
                const float *row = out + (size_t)n * C;
                if (tok[n] >= v0 && tok[n] < v0 + Vl)
                    cr_assert_eq(memcmp(row, table + (size_t)tok[n] * C, sizeof(float) * C), 0,
                                 "k %d shard %d row %d", k, s, n);
                else
                    for (int c = 0; c < C; c++)
                        cr_assert_eq(row[c], 0.0f, "k %d shard %d row %d not zero", k, s, n);
            }
            for (size_t i = 0; i < (size_t)N * C; i++) sum[i] += out[i];

            float *dtab = fvec((size_t)(Vl ? Vl : 1) * C, 1.0f);
            double *ref = dvec((size_t)Vl * C);
            for (size_t i = 0; i < (size_t)Vl * C; i++) ref[i] = dtab[i];
            for (int n = 0; n < N; n++)
                if (btok[n] >= v0 && btok[n] < v0 + Vl)
                    for (int c = 0; c < C; c++)
                        ref[(size_t)(btok[n] - v0) * C + c] += dout[(size_t)n * C + c];
            cr_assert_eq(l3d_dev_embedding_bwd_vp(e.dev, dtab, dout, btok, N, C, v0, Vl,
                                                  L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
            check_close("embedding_bwd_vp", dtab, ref, (size_t)Vl * C, 1e-6);
            free(dtab), free(ref);
        }
        for (int n = 0; n < N; n++)
            cr_assert_eq(memcmp(sum + (size_t)n * C, table + (size_t)tok[n] * C,
                                sizeof(float) * C),
                         0, "k %d: the shards do not add up to row %d", k, n);
    }
    free(table), free(out), free(sum), free(dout);
    env_close(e);
}

Test(cpu_embedding_vp, bad_tokens_and_shapes) {
    env_t e = env_open(1);
    const int N = 5, C = 3, V = 11, v0 = 4, Vl = 4;
    float table[4 * 3] = {0}, out[5 * 3], dtab[4 * 3] = {0}, dout[5 * 3];
    for (int i = 0; i < N * C; i++) out[i] = 7.0f, dout[i] = 1.0f;
    int32_t tok[5] = {0, 5, 10, 4, 7};
    cr_assert_eq(l3d_dev_embedding_fwd_vp(e.dev, out, tok, table, N, C, v0, Vl, V, L3D_FLOAT32,
                                          L3D_FLOAT32), L3D_OK);
    tok[3] = V;  // outside the vocabulary, not merely outside the shard
    for (int i = 0; i < N * C; i++) out[i] = 7.0f;
    cr_assert_eq(l3d_dev_embedding_fwd_vp(e.dev, out, tok, table, N, C, v0, Vl, V, L3D_FLOAT32,
                                          L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    const char *msg = l3d_ctx_last_error(e.ctx);
    cr_assert(strstr(msg, "embedding") && strstr(msg, "token[3]") && strstr(msg, "11"), "%s",
              msg);
    for (int i = 0; i < N * C; i++) cr_assert_eq(out[i], 7.0f);  // untouched
    tok[3] = -1;
    cr_assert_eq(l3d_dev_embedding_fwd_vp(e.dev, out, tok, table, N, C, v0, Vl, V, L3D_FLOAT32,
                                          L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    // The backward ignores every token it does not own, -1 and V included.
    cr_assert_eq(l3d_dev_embedding_bwd_vp(e.dev, dtab, dout, tok, N, C, v0, Vl, L3D_FLOAT32,
                                          L3D_FLOAT32), L3D_OK);
    tok[3] = V;
    cr_assert_eq(l3d_dev_embedding_bwd_vp(e.dev, dtab, dout, tok, N, C, v0, Vl, L3D_FLOAT32,
                                          L3D_FLOAT32), L3D_OK);
    for (int i = 0; i < Vl * C; i++)  // only token 5 (row 1) and 7 (row 3) landed, twice each
        cr_assert_eq(dtab[i], i / C == 1 || i / C == 3 ? 2.0f : 0.0f, "dtable[%d]", i);
    // The shard must lie inside the vocabulary.
    tok[3] = 4;
    cr_assert_eq(l3d_dev_embedding_fwd_vp(e.dev, out, tok, table, N, C, 8, 4, V, L3D_FLOAT32,
                                          L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(e.ctx), "embedding_fwd_vp"));
    cr_assert_eq(l3d_dev_embedding_fwd_vp(e.dev, out, tok, table, N, C, -1, 4, V, L3D_FLOAT32,
                                          L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dev_embedding_bwd_vp(e.dev, dtab, dout, tok, N, C, 0, -1, L3D_FLOAT32,
                                          L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dev_embedding_bwd_vp(e.dev, dtab, dout, tok, -1, C, 0, 4, L3D_FLOAT32,
                                          L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    env_close(e);
}

// Targets: every 5th row ignored (-1); the others cycle through the shards of `b` so each
// non-empty shard owns some targets (b NULL: spread over [0, V)).
static void vp_targets(int32_t *t, int N, int V, int k, const int *b) {
    for (int n = 0; n < N; n++) {
        if (n % 5 == 3) {
            t[n] = -1;
            continue;
        }
        int s = b ? n % k : 0, lo = b ? b[s] : 0, w = b ? b[s + 1] - b[s] : V;
        if (w == 0) lo = 0, w = V;  // an empty shard owns nothing
        t[n] = lo + (int32_t)(((unsigned)n * 7919u) % (unsigned)w);
    }
}

// The three passes over the k shards of the logits with the group's reductions done here
// (max, then sum, over shards in shard order); grad(N,V) and loss(N) reassembled.
static void xent_vp_split(env_t e, const float *z, const int32_t *t, int N, int V, int k,
                          const int *b, float gs, float *grad, float *loss) {
    float *gmax = malloc(sizeof(float) * N), *mx = malloc(sizeof(float) * N);
    float *gst = calloc((size_t)2 * N, sizeof(float)), *st = malloc(sizeof(float) * 2 * N);
    float *ls = malloc(sizeof(float) * N), *part[4];
    for (int n = 0; n < N; n++) gmax[n] = -INFINITY;
    for (int s = 0; s < k; s++) {  // this rank's columns (N,Vl)
        int Vl = b[s + 1] - b[s];
        part[s] = malloc(sizeof(float) * ((size_t)N * Vl + 1));
        for (int n = 0; n < N; n++)
            memcpy(part[s] + (size_t)n * Vl, z + (size_t)n * V + b[s], sizeof(float) * Vl);
        cr_assert_eq(l3d_dev_xent_vp_max(e.dev, part[s], mx, N, Vl, L3D_FLOAT32), L3D_OK);
        for (int n = 0; n < N; n++) gmax[n] = fmaxf(gmax[n], mx[n]);
    }
    for (int s = 0; s < k; s++) {
        int Vl = b[s + 1] - b[s];
        cr_assert_eq(l3d_dev_xent_vp_stats(e.dev, part[s], gmax, t, N, Vl, b[s], st, L3D_FLOAT32),
                     L3D_OK);
        for (int n = 0; n < N; n++) {
            if (t[n] < 0) cr_assert(st[2 * n] == 0.0f && st[2 * n + 1] == 0.0f, "row %d", n);
            if (t[n] >= 0 && (t[n] < b[s] || t[n] >= b[s + 1]))
                cr_assert_eq(st[2 * n + 1], 0.0f, "shard %d row %d: target not owned", s, n);
            gst[2 * n] += st[2 * n], gst[2 * n + 1] += st[2 * n + 1];
        }
    }
    for (int s = 0; s < k; s++) {
        int Vl = b[s + 1] - b[s];
        cr_assert_eq(l3d_dev_xent_vp_grad(e.dev, part[s], ls, gmax, gst, t, N, Vl, b[s], gs,
                                          L3D_FLOAT32),
                     L3D_OK);
        for (int n = 0; n < N; n++) {
            memcpy(grad + (size_t)n * V + b[s], part[s] + (size_t)n * Vl, sizeof(float) * Vl);
            if (s == 0)
                loss[n] = ls[n];
            else  // every rank computes the same losses from the same reduced stats
                cr_assert_eq(ls[n], loss[n], "shard %d row %d loss", s, n);
        }
        free(part[s]);
    }
    free(gmax), free(mx), free(gst), free(st), free(ls);
}

// The fused kernel on a copy of z: the target of the vocabulary-parallel passes.
static void xent_fused(env_t e, const float *z, const int32_t *t, int N, int V, float gs,
                       double *rg, double *rl) {
    float *g = fdup(z, (size_t)N * V), *l = malloc(sizeof(float) * N);
    cr_assert_eq(l3d_dev_xent_fwd_bwd(e.dev, g, l, t, N, V, gs, L3D_FLOAT32), L3D_OK);
    for (size_t i = 0; i < (size_t)N * V; i++) rg[i] = g[i];
    for (int n = 0; n < N; n++) rl[n] = l[n];
    free(g), free(l);
}

// Row by row (each row's gradient relative to its own scale) and every loss relative.
static void xent_vp_check(const char *what, const float *grad, const float *loss,
                          const double *rg, const double *rl, const int32_t *t, int N, int V,
                          double rtol) {
    char w[96];
    for (int n = 0; n < N; n++) {
        snprintf(w, sizeof(w), "%s grad row %d", what, n);
        check_close(w, grad + (size_t)n * V, rg + (size_t)n * V, V, rtol);
        if (t[n] < 0) {
            cr_assert_eq(loss[n], 0.0f, "%s: ignored row %d has a loss", what, n);
            for (int i = 0; i < V; i++) cr_assert_eq(grad[(size_t)n * V + i], 0.0f);
        } else {
            cr_assert(fabs(loss[n] - rl[n]) <= rtol * fabs(rl[n]), "%s loss %d: %.9g vs %.9g",
                      what, n, (double)loss[n], rl[n]);
        }
    }
}

Test(cpu_xent_vp, one_shard_equals_fused) {
    env_t e = env_open(2);
    rng_seed(43);
    const int shapes[3][2] = {{1, 7}, {23, 1000}, {9, 33333}};
    const float scales[3] = {1.0f, 0.125f, 1.0f / 9.0f};
    for (int c = 0; c < 3; c++) {
        int N = shapes[c][0], V = shapes[c][1], b[2] = {0, V};
        float *z = fvec((size_t)N * V, 8.0f), *grad = malloc(sizeof(float) * N * V);
        float *loss = malloc(sizeof(float) * N);
        int32_t *t = malloc(sizeof(int32_t) * N);
        double *rg = dvec((size_t)N * V), *rl = dvec(N);
        vp_targets(t, N, V, 1, NULL);
        xent_fused(e, z, t, N, V, scales[c], rg, rl);
        xent_vp_split(e, z, t, N, V, 1, b, scales[c], grad, loss);
        xent_vp_check("xent_vp one shard", grad, loss, rg, rl, t, N, V, 1e-6);
        free(z), free(grad), free(loss), free(t), free(rg), free(rl);
    }
    env_close(e);
}

// k = 2, 3, 4 uneven shards (one of a single column, one empty when V = 7), targets in every
// shard and ignored rows: against the fused kernel and against a double reference.
Test(cpu_xent_vp, split_matches_fused) {
    env_t e = env_open(2);
    rng_seed(47);
    const int shapes[3][2] = {{6, 7}, {23, 1000}, {9, 33333}};
    for (int c = 0; c < 3; c++)
        for (int k = 2; k <= 4; k++) {
            int N = shapes[c][0], V = shapes[c][1], b[5];
            float gs = 1.0f / (float)N;
            vp_bounds(V, k, b);
            float *z = fvec((size_t)N * V, 8.0f), *grad = malloc(sizeof(float) * N * V);
            float *loss = malloc(sizeof(float) * N);
            int32_t *t = malloc(sizeof(int32_t) * N);
            double *rg = dvec((size_t)N * V), *rl = dvec(N), *dg = dvec((size_t)N * V),
                   *dl = dvec(N);
            vp_targets(t, N, V, k, b);
            l3d_ref_xent(z, t, N, V, gs, dg, dl);  // textbook softmax in double
            xent_fused(e, z, t, N, V, gs, rg, rl);
            xent_vp_split(e, z, t, N, V, k, b, gs, grad, loss);
            char what[64];
            snprintf(what, sizeof(what), "xent_vp V %d k %d vs fused", V, k);
            xent_vp_check(what, grad, loss, rg, rl, t, N, V, 2e-6);
            snprintf(what, sizeof(what), "xent_vp V %d k %d vs double", V, k);
            xent_vp_check(what, grad, loss, dg, dl, t, N, V, 2e-6);
            free(z), free(grad), free(loss), free(t), free(rg), free(rl), free(dg), free(dl);
        }
    env_close(e);
}

Test(cpu_xent_vp, null_losses_and_bad_shapes) {
    env_t e = env_open(1);
    rng_seed(53);
    float z[12], z2[12], gmax[2] = {1.0f, 1.0f}, gst[4] = {3.0f, 0.5f, 2.0f, 0.0f}, loss[2];
    for (int i = 0; i < 12; i++) z[i] = z2[i] = frand();
    int32_t t[2] = {7, 2};  // v0 = 4: row 0 owned here, row 1 elsewhere
    cr_assert_eq(l3d_dev_xent_vp_grad(e.dev, z, loss, gmax, gst, t, 2, 6, 4, 0.5f, L3D_FLOAT32),
                 L3D_OK);
    cr_assert_eq(l3d_dev_xent_vp_grad(e.dev, z2, NULL, gmax, gst, t, 2, 6, 4, 0.5f, L3D_FLOAT32),
                 L3D_OK);
    cr_assert_eq(memcmp(z, z2, sizeof(z)), 0);
    cr_assert(fabsf(loss[0] - (float)(log(3.0) + 0.5)) < 1e-6f, "%.9g", (double)loss[0]);
    cr_assert(fabsf(loss[1] - (float)(log(2.0) + 1.0)) < 1e-6f, "%.9g", (double)loss[1]);
    float st[4];
    cr_assert_eq(l3d_dev_xent_vp_max(e.dev, z, gmax, -1, 6, L3D_FLOAT32), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(e.ctx), "xent_vp_max"));
    cr_assert_eq(l3d_dev_xent_vp_max(e.dev, z, gmax, 2, -6, L3D_FLOAT32), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dev_xent_vp_stats(e.dev, z, gmax, t, 2, 6, -4, st, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(e.ctx), "xent_vp_stats"));
    cr_assert_eq(l3d_dev_xent_vp_grad(e.dev, z, loss, gmax, gst, t, 2, -1, 0, 1.0f, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(e.ctx), "xent_vp_grad"));
    env_close(e);
}

Test(cpu_determinism, vocab_parallel_one_vs_three_threads) {
    env_t e1 = env_open(1), e3 = env_open(3);
    env_t es[2] = {e1, e3};
    rng_seed(59);
    const int N = 301, V = 1500, C = 130, b[4] = {0, 600, 1100, V};
    float *z = fvec((size_t)N * V, 4.0f), *dout = fvec((size_t)N * C, 1.0f);
    int32_t *t = malloc(sizeof(int32_t) * N);
    vp_targets(t, N, V, 3, b);
    float *grad[2], *loss[2], *dt[2];
    for (int r = 0; r < 2; r++) {
        grad[r] = malloc(sizeof(float) * N * V), loss[r] = malloc(sizeof(float) * N);
        dt[r] = calloc((size_t)500 * C, sizeof(float));
        xent_vp_split(es[r], z, t, N, V, 3, b, 0.1f, grad[r], loss[r]);
        cr_assert_eq(l3d_dev_embedding_bwd_vp(es[r].dev, dt[r], dout, t, N, C, 600, 500,
                                              L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
    }
    same("xent_vp grad", grad[0], grad[1], sizeof(float) * N * V);
    same("xent_vp loss", loss[0], loss[1], sizeof(float) * N);
    same("embedding_bwd_vp", dt[0], dt[1], sizeof(float) * 500 * C);
    for (int r = 0; r < 2; r++) free(grad[r]), free(loss[r]), free(dt[r]);
    free(z), free(dout), free(t);
    env_close(e1);
    env_close(e3);
}
