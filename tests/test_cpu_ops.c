// The CPU device's ops against naive double-precision references written here (materialised
// attention with an explicit softmax, textbook loops), plus argument errors and bit-identical
// results across thread counts.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "tests/harness/cpu_env.h"
#include "tests/harness/ref_ops.h"

// ---- gemm ---------------------------------------------------------------------------------------
static void ref_gemm(const l3d_gemm_t *g, const float *C0, double *out) {
    for (int i = 0; i < g->M; i++)
        for (int j = 0; j < g->N; j++) {
            double s = 0.0;
            for (int k = 0; k < g->K; k++) {
                const float *A = g->A, *B = g->B;
                double a = g->trans_a ? A[(size_t)k * g->lda + i] : A[(size_t)i * g->lda + k];
                double b = g->trans_b ? B[(size_t)j * g->ldb + k] : B[(size_t)k * g->ldb + j];
                s += a * b;
            }
            out[(size_t)i * g->N + j] = g->alpha * s + g->beta * (double)C0[(size_t)i * g->ldc + j];
        }
}

static void gemm_case(env_t e, int ta, int tb, int M, int N, int K, float alpha, float beta,
                      int pad) {
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = fvec(na, 1.0f), *B = fvec(nb, 1.0f), *C = fvec(nc, 1.0f), *C0 = fdup(C, nc);
    l3d_gemm_t g = {ta, tb, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, 1, 0, 0, 0, L3D_FLOAT32, L3D_FLOAT32, L3D_FLOAT32, 0};
    double *ref = dvec((size_t)M * N);
    ref_gemm(&g, C0, ref);
    cr_assert_eq(l3d_dev_gemm(e.dev, &g), L3D_OK);
    float *got = malloc(sizeof(float) * ((size_t)M * N + 1));
    for (int i = 0; i < M; i++) {
        memcpy(got + (size_t)i * N, C + (size_t)i * ldc, sizeof(float) * N);
        for (int j = N; j < ldc; j++)  // the padding is not touched
            cr_assert_eq(C[(size_t)i * ldc + j], C0[(size_t)i * ldc + j]);
    }
    char what[96];
    snprintf(what, sizeof(what), "gemm ta %d tb %d %dx%dx%d", ta, tb, M, N, K);
    check_close(what, got, ref, (size_t)M * N, 1e-5);
    free(A), free(B), free(C), free(C0), free(ref), free(got);
}

Test(cpu_gemm, transposes_strides_beta) {
    env_t e = env_open(2);
    rng_seed(11);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(e, ta, tb, 37, 29, 53, 0.7f, 0.3f, 3);  // one serial call
            gemm_case(e, ta, tb, 300, 700, 40, 1.0f, -0.5f, 5);  // tiled over M and N
            gemm_case(e, ta, tb, 3, 1100, 130, 1.5f, 0.0f, 1);   // decode-like: tiled over N
        }
    env_close(e);
}

// Batched: each product against the reference, including a shared (stride 0) B operand.
Test(cpu_gemm, batched_with_strides) {
    env_t e = env_open(2);
    rng_seed(5);
    const int M = 33, N = 70, K = 19, batch = 3;
    size_t sa = (size_t)M * K + 7, sc = (size_t)M * N + 3;
    float *A = fvec(sa * batch, 1.0f), *B = fvec((size_t)N * K, 1.0f);
    float *C = fvec(sc * batch, 1.0f), *C0 = fdup(C, sc * batch);
    l3d_gemm_t g = {.trans_b = 1, .M = M, .N = N, .K = K, .alpha = 1.0f, .beta = 0.5f, .A = A,
                    .lda = K, .B = B, .ldb = K, .C = C, .ldc = N, .batch = batch,
                    .stride_a = sa, .stride_b = 0, .stride_c = sc};
    cr_assert_eq(l3d_dev_gemm(e.dev, &g), L3D_OK);
    double *ref = dvec((size_t)M * N);
    for (int i = 0; i < batch; i++) {
        l3d_gemm_t one = g;
        one.A = A + i * sa;
        one.C = C + i * sc;
        ref_gemm(&one, C0 + i * sc, ref);
        char what[64];
        snprintf(what, sizeof(what), "batched gemm entry %d", i);
        check_close(what, C + i * sc, ref, (size_t)M * N, 1e-5);
        for (size_t k = (size_t)M * N; k < sc; k++)  // the gap between entries is untouched
            cr_assert_eq(C[i * sc + k], C0[i * sc + k]);
    }
    free(A), free(B), free(C), free(C0), free(ref);
    env_close(e);
}

// Decode-sized products (M <= L3D_CPU_GEMV_MAX_M = 16 rows of x against W^T: a batch of
// sequences decoding together) take the matrix-vector kernel: each against the double
// reference, with strides, beta 0 not reading C (NaN there), and the same bits for 1, 2 and 3
// threads (each element is one dot product in a fixed order); 17 rows are sgemm's again.
Test(cpu_gemm, few_rows_matrix_vector) {
    env_t e[3] = {env_open(1), env_open(2), env_open(3)};
    rng_seed(17);
    const int Ks[] = {1, 15, 17, 130, 1000}, Ns[] = {1, 63, 64, 65, 700};
    const int Ms[] = {1, 2, 3, 4, 5, 16, 17};
    for (int mi = 0; mi < 7; mi++)
        for (int ki = 0; ki < 5; ki++)
            for (int ni = 0; ni < 5; ni++) {
                int M = Ms[mi], K = Ks[ki], N = Ns[ni], lda = K + 3, ldb = K + 1, ldc = N + 2;
                float beta = (ki + ni) % 2 ? 0.5f : 0.0f;
                float *A = fvec((size_t)M * lda, 1.0f), *B = fvec((size_t)N * ldb, 1.0f);
                float *C0 = fvec((size_t)M * ldc, 1.0f);
                float *Cr = fdup(C0, (size_t)M * ldc);  // the reference's C: no NaN
                if (beta == 0.0f) C0[0] = NAN;
                double *ref = dvec((size_t)M * N);
                float *got[3];
                for (int t = 0; t < 3; t++) {
                    got[t] = fdup(C0, (size_t)M * ldc);
                    l3d_gemm_t g = {.trans_b = 1, .M = M, .N = N, .K = K, .alpha = 0.75f,
                                    .beta = beta, .A = A, .lda = lda, .B = B, .ldb = ldb,
                                    .C = got[t], .ldc = ldc};
                    if (t == 0) ref_gemm(&g, Cr, ref);
                    cr_assert_eq(l3d_dev_gemm(e[t].dev, &g), L3D_OK);
                }
                char what[96];
                snprintf(what, sizeof(what), "gemm %dx%dx%d beta %g", M, N, K, beta);
                // Float32 error bound of a dot product summed in any order (Higham, 3.1):
                // |fl(sum) - sum| <= gamma_K sum |a_k b_k|, gamma_K = K u / (1 - K u) with
                // u = 2^-24; the alpha product and the beta term add 2 u more. (K + 2) u times
                // the magnitude sum, doubled, covers both.
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double mag = 0.0;
                        for (int k = 0; k < K; k++)
                            mag += fabs((double)A[(size_t)i * lda + k] * B[(size_t)j * ldb + k]);
                        mag = 0.75 * mag + fabs(beta * (double)Cr[(size_t)i * ldc + j]);
                        double err = fabs(got[0][(size_t)i * ldc + j] - ref[(size_t)i * N + j]);
                        cr_assert_leq(err, 2.0 * (K + 2) * 0x1p-24 * mag, "%s [%d][%d]: %.9g vs %.9g",
                                      what, i, j, got[0][(size_t)i * ldc + j], ref[(size_t)i * N + j]);
                    }
                for (int i = 0; i < M; i++)
                    for (int j = N; j < ldc; j++)  // the padding is not touched
                        cr_assert(memcmp(&got[0][(size_t)i * ldc + j], &C0[(size_t)i * ldc + j],
                                         sizeof(float)) == 0);
                for (int t = 1; t < 3; t++)
                    cr_assert(memcmp(got[0], got[t], sizeof(float) * (size_t)M * ldc) == 0,
                              "%s: %d threads changed bits", what, t + 1);
                for (int t = 0; t < 3; t++) free(got[t]);
                free(A), free(B), free(C0), free(Cr), free(ref);
            }
    for (int t = 0; t < 3; t++) env_close(e[t]);
}

Test(cpu_gemm, k_zero_scales_c) {
    env_t e = env_open(1);
    float C[6] = {1, 2, 3, 4, 5, 6}, A[1] = {0}, B[1] = {0};
    l3d_gemm_t g = {0, 0, 2, 3, 0, 1.0f, 2.0f, A, 1, B, 3, C, 3, 1, 0, 0, 0, L3D_FLOAT32, L3D_FLOAT32, L3D_FLOAT32, 0};
    cr_assert_eq(l3d_dev_gemm(e.dev, &g), L3D_OK);
    for (int i = 0; i < 6; i++) cr_assert_eq(C[i], 2.0f * (float)(i + 1));
    g.beta = 0.0f;
    C[0] = NAN;  // beta 0 must not read C
    cr_assert_eq(l3d_dev_gemm(e.dev, &g), L3D_OK);
    for (int i = 0; i < 6; i++) cr_assert_eq(C[i], 0.0f);
    env_close(e);
}

Test(cpu_gemm, bad_stride_is_invalid_arg) {
    env_t e = env_open(1);
    float A[16] = {0}, B[16] = {0}, C[16] = {0};
    l3d_gemm_t g = {0, 0, 4, 4, 4, 1.0f, 0.0f, A, 3, B, 4, C, 4, 1, 0, 0, 0, L3D_FLOAT32, L3D_FLOAT32, L3D_FLOAT32, 0};
    cr_assert_eq(l3d_dev_gemm(e.dev, &g), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(e.ctx), "gemm"));
    env_close(e);
}

// ---- memory -------------------------------------------------------------------------------------
Test(cpu_memory, alloc_copy_memset) {
    env_t e = env_open(1);
    cr_assert(l3d_dev_is_host(e.dev));
    cr_assert_eq(e.dev->ops->abi_version, L3D_DEVICE_ABI_VERSION);
    cr_assert_eq(e.dev->ops->size, sizeof(l3d_device_ops_t));
    cr_assert_str_eq(e.dev->ops->name, "cpu");
    void *p = NULL, *q = NULL, *z = (void *)1;
    cr_assert_eq(l3d_dev_alloc(e.dev, 1000, "acts", &p), L3D_OK);
    cr_assert_eq(l3d_dev_alloc(e.dev, 1000, "acts", &q), L3D_OK);
    cr_assert_eq(((uintptr_t)p) % 64, 0);
    cr_assert_geq(l3d_ctx_mem_in_use(e.ctx, "acts"), 2000);
    cr_assert_eq(l3d_dev_alloc(e.dev, 0, "acts", &z), L3D_OK);
    cr_assert_eq(l3d_dev_memset(e.dev, p, 0x5a, 1000), L3D_OK);
    cr_assert_eq(l3d_dev_copy(e.dev, q, p, 1000, L3D_COPY_D2D), L3D_OK);
    cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
    for (int i = 0; i < 1000; i++) cr_assert_eq(((unsigned char *)q)[i], 0x5a);
    l3d_dev_free(e.dev, z, 0, "acts");
    l3d_dev_free(e.dev, p, 1000, "acts");
    l3d_dev_free(e.dev, q, 1000, "acts");
    l3d_dev_free(e.dev, NULL, 0, "acts");
    cr_assert_eq(l3d_ctx_mem_in_use(e.ctx, "acts"), 0);
    env_close(e);
}

// The THP mode the kernel runs in: 'a'lways, 'm'advise, 'n'ever, or 0 where it has none.
static char thp_mode(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (!f) return 0;
    char *ok = fgets(line, sizeof(line), f);
    fclose(f);
    if (!ok) return 0;
    return strstr(line, "[always]") ? 'a' : strstr(line, "[madvise]") ? 'm' : 'n';
}
// THPeligible of the mapping holding p in /proc/self/smaps: 1, 0, or -1 when not reported.
static int thp_eligible(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, v = -1;
    while (fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, ' ') > strchr(line, '-'))
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (in && sscanf(line, "THPeligible: %d", &v) == 1)
            break;
    }
    fclose(f);
    return v;
}

// Large buffers are streamed whole (decode reads every weight per token): the device asks for
// transparent huge pages on them. In the kernel's "madvise" mode (Debian's default) only an
// advised mapping is eligible, so this failed before the advice was given.
Test(cpu_memory, large_buffers_are_advised_onto_huge_pages) {
    char mode = thp_mode();
    if (mode != 'm' && mode != 'a') cr_skip_test("transparent huge pages are off or absent here");
    env_t e = env_open(1);
    size_t bytes = (size_t)16 << 20;
    void *p = NULL;
    cr_assert_eq(l3d_dev_alloc(e.dev, bytes, "params", &p), L3D_OK);
    cr_assert_eq(l3d_dev_memset(e.dev, p, 0, bytes), L3D_OK);
    // The middle of the buffer: its 2 MiB-aligned interior is what the advice covers.
    int v = thp_eligible((char *)p + bytes / 2);
    if (v < 0) cr_skip_test("this kernel's smaps has no THPeligible");
    cr_assert_eq(v, 1, "a 16 MiB device buffer is not eligible for huge pages (THP mode %c)", mode);
    l3d_dev_free(e.dev, p, bytes, "params");
    env_close(e);
}

Test(cpu_memory, default_threads_is_cores) {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    cr_assert_eq(l3d_device_create(ctx, "cpu", NULL, &dev), L3D_OK);
    cr_assert_geq(dev->num_threads, 1);
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
}

// ---- embedding ----------------------------------------------------------------------------------
Test(cpu_embedding, fwd_bwd_and_bad_tokens) {
    env_t e = env_open(2);
    rng_seed(3);
    int N = 45, C = 70, V = 11;
    float *table = fvec((size_t)V * C, 1.0f), *out = fvec((size_t)N * C, 1.0f);
    int32_t tok[45];
    for (int n = 0; n < N; n++) tok[n] = (n * 7 + n / 3) % V;  // repeats: scatter must add
    cr_assert_eq(l3d_dev_embedding_fwd(e.dev, out, tok, table, N, C, V, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_OK);
    for (int n = 0; n < N; n++)
        cr_assert_eq(memcmp(out + (size_t)n * C, table + (size_t)tok[n] * C, sizeof(float) * C), 0);

    float *dout = fvec((size_t)N * C, 1.0f), *dtab = fvec((size_t)V * C, 1.0f);
    double *ref = dvec((size_t)V * C);
    for (size_t i = 0; i < (size_t)V * C; i++) ref[i] = dtab[i];
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) ref[(size_t)tok[n] * C + c] += dout[(size_t)n * C + c];
    cr_assert_eq(l3d_dev_embedding_bwd(e.dev, dtab, dout, tok, N, C, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_OK);
    check_close("embedding_bwd", dtab, ref, (size_t)V * C, 1e-6);

    tok[17] = V;
    cr_assert_eq(l3d_dev_embedding_fwd(e.dev, out, tok, table, N, C, V, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    const char *msg = l3d_ctx_last_error(e.ctx);
    cr_assert(strstr(msg, "embedding") && strstr(msg, "17") && strstr(msg, "11"), "%s", msg);
    tok[17] = -1;
    cr_assert_eq(l3d_dev_embedding_fwd(e.dev, out, tok, table, N, C, V, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dev_embedding_bwd(e.dev, dtab, dout, tok, N, C, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    free(table), free(out), free(dout), free(dtab), free(ref);
    env_close(e);
}

// ---- rmsnorm ------------------------------------------------------------------------------------
static void rmsnorm_case(env_t e, int N, int C) {
    float eps = 1e-5f;
    float *x = fvec((size_t)N * C, 2.0f), *w = fvec(C, 1.0f), *out = fvec((size_t)N * C, 1.0f);
    float *rstd = fvec(N, 1.0f), *dout = fvec((size_t)N * C, 1.0f);
    float *dx = fvec((size_t)N * C, 1.0f), *dw = fvec(C, 1.0f);
    double *rout = dvec((size_t)N * C), *rrstd = dvec(N), *rdx = dvec((size_t)N * C),
           *rdw = dvec(C);
    for (int c = 0; c < C; c++) rdw[c] = dw[c];
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *g = dout + (size_t)n * C;
        double ss = 0.0, dot = 0.0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        double r = 1.0 / sqrt(ss / C + eps);
        rrstd[n] = r;
        for (int c = 0; c < C; c++) {
            rout[(size_t)n * C + c] = xr[c] * r * w[c];
            dot += (double)g[c] * w[c] * xr[c];
            rdw[c] += (double)g[c] * xr[c] * r;
        }
        for (int c = 0; c < C; c++)
            rdx[(size_t)n * C + c] =
                dx[(size_t)n * C + c] + r * g[c] * w[c] - r * r * r / C * dot * xr[c];
    }
    cr_assert_eq(l3d_dev_rmsnorm_fwd(e.dev, out, rstd, x, w, N, C, eps, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_OK);
    check_close("rmsnorm out", out, rout, (size_t)N * C, 1e-5);
    check_close("rmsnorm rstd", rstd, rrstd, N, 1e-5);
    cr_assert_eq(l3d_dev_rmsnorm_fwd(e.dev, out, NULL, x, w, N, C, eps, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_bwd(e.dev, dx, dw, dout, x, w, rstd, N, C, L3D_FLOAT32,
                                     L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
    check_close("rmsnorm dx", dx, rdx, (size_t)N * C, 1e-5);
    check_close("rmsnorm dw", dw, rdw, C, 1e-5);
    free(x), free(w), free(out), free(rstd), free(dout), free(dx), free(dw);
    free(rout), free(rrstd), free(rdx), free(rdw);
}

Test(cpu_rmsnorm, fwd_bwd) {
    env_t e = env_open(2);
    rng_seed(5);
    rmsnorm_case(e, 1, 16);
    rmsnorm_case(e, 37, 100);
    rmsnorm_case(e, 200, 67);
    env_close(e);
}

// ---- rope ---------------------------------------------------------------------------------------
static void rope_tables(int Tmax, int D, float **cs, float **sn) {
    int half = D / 2;
    *cs = malloc(sizeof(float) * (size_t)Tmax * half);
    *sn = malloc(sizeof(float) * (size_t)Tmax * half);
    for (int t = 0; t < Tmax; t++)
        for (int i = 0; i < half; i++) {
            double ang = t * pow(500000.0, -2.0 * i / D);
            (*cs)[(size_t)t * half + i] = (float)cos(ang);
            (*sn)[(size_t)t * half + i] = (float)sin(ang);
        }
}

Test(cpu_rope, rotate_half_and_inverse) {
    env_t e = env_open(2);
    rng_seed(7);
    int B = 2, T = 37, NH = 3, D = 32, pos0 = 5, half = D / 2;
    size_t n = (size_t)B * T * NH * D;
    float *cs, *sn;
    rope_tables(pos0 + T, D, &cs, &sn);
    float *x = fvec(n, 1.0f), *x0 = fdup(x, n);
    double *ref = dvec(n);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                size_t o = (((size_t)b * T + t) * NH + h) * D;
                for (int i = 0; i < D; i++) {
                    // out = x * cos + rotate_half(x) * sin, rotate_half = (-x2, x1)
                    int k = i % half;
                    size_t ti = (size_t)(pos0 + t) * half + k;
                    double c = cs[ti], s = sn[ti];
                    double rot = i < half ? -(double)x0[o + i + half] : (double)x0[o + i - half];
                    ref[o + i] = x0[o + i] * c + rot * s;
                }
            }
    cr_assert_eq(l3d_dev_rope(e.dev, x, cs, sn, B, T, NH, D, pos0, 0, L3D_FLOAT32), L3D_OK);
    check_close("rope", x, ref, n, 1e-6);
    cr_assert_eq(l3d_dev_rope(e.dev, x, cs, sn, B, T, NH, D, pos0, 1, L3D_FLOAT32), L3D_OK);
    double *orig = dvec(n);
    for (size_t i = 0; i < n; i++) orig[i] = x0[i];
    check_close("rope inverse", x, orig, n, 1e-6);
    cr_assert_eq(l3d_dev_rope(e.dev, x, cs, sn, B, T, NH, 7, pos0, 0, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    free(cs), free(sn), free(x), free(x0), free(ref), free(orig);
    env_close(e);
}

// ---- attention ----------------------------------------------------------------------------------
static void attention_case(env_t e, shape_t s, double tol) {
    size_t nq = (size_t)s.B * s.Tq * s.H * s.D, nkv = (size_t)s.B * s.Tmax * s.KVH * s.D;
    size_t ndk = (size_t)s.B * s.Tk * s.KVH * s.D, nl = (size_t)s.B * s.H * s.Tq;
    float *q = fvec(nq, 1.5f), *k = fvec(nkv, 1.5f), *v = fvec(nkv, 1.0f), *go = fvec(nq, 1.0f);
    float *out = fvec(nq, 1.0f), *lse = fvec(nl, 1.0f);
    float *dq = fvec(nq, 1.0f), *dk = fvec(ndk, 1.0f), *dv = fvec(ndk, 1.0f);
    double *rout = dvec(nq), *rlse = dvec(nl), *rdq = dvec(nq), *rdk = dvec(ndk), *rdv = dvec(ndk);
    l3d_ref_attention(&s, q, k, v, go, rout, rlse, rdq, rdk, rdv);
    l3d_attn_dims_t d = {s.B, s.Tq, s.Tk, s.H, s.KVH, s.D,
                         s.Tmax == s.Tk ? 0 : (size_t)s.Tmax * s.KVH * s.D};
    char what[128];
    snprintf(what, sizeof(what), "attention B%d Tq%d Tk%d H%d KVH%d D%d Tmax%d", s.B, s.Tq, s.Tk,
             s.H, s.KVH, s.D, s.Tmax);
    cr_assert_eq(l3d_dev_attention_fwd(e.dev, out, lse, q, k, v, &d, L3D_FLOAT32), L3D_OK, "%s",
                 what);
    check_close(what, out, rout, nq, tol);
    check_close(what, lse, rlse, nl, tol);
    float *out2 = fvec(nq, 1.0f);
    cr_assert_eq(l3d_dev_attention_fwd(e.dev, out2, NULL, q, k, v, &d, L3D_FLOAT32), L3D_OK);
    cr_assert_eq(memcmp(out, out2, sizeof(float) * nq), 0, "lse NULL changes out");
    cr_assert_eq(l3d_dev_attention_bwd(e.dev, dq, dk, dv, go, q, k, v, out, lse, &d, L3D_FLOAT32),
                 L3D_OK);
    check_close("attention dq", dq, rdq, nq, tol);
    check_close("attention dk", dk, rdk, ndk, tol);
    check_close("attention dv", dv, rdv, ndk, tol);
    free(q), free(k), free(v), free(go), free(out), free(out2), free(lse), free(dq), free(dk);
    free(dv), free(rout), free(rlse), free(rdq), free(rdk), free(rdv);
}

Test(cpu_attention, shapes) {
    env_t e = env_open(2);
    rng_seed(13);
    attention_case(e, (shape_t){2, 37, 37, 4, 2, 16, 37}, 2e-5);   // GQA, odd T
    attention_case(e, (shape_t){1, 1, 1, 4, 4, 32, 1}, 2e-5);      // T = 1, MHA
    attention_case(e, (shape_t){2, 150, 150, 2, 1, 32, 150}, 5e-5); // several tiles, MQA
    attention_case(e, (shape_t){2, 3, 70, 4, 2, 16, 81}, 2e-5);    // decode: Tq < Tk, strided
    attention_case(e, (shape_t){1, 1, 130, 6, 2, 64, 200}, 2e-5);  // decode one token
    attention_case(e, (shape_t){1, 70, 140, 2, 2, 16, 140}, 5e-5); // prefill with a prefix
    env_close(e);
}

Test(cpu_attention, bad_dims) {
    env_t e = env_open(1);
    float x[64] = {0};
    l3d_attn_dims_t d = {1, 2, 2, 3, 2, 4, 0};  // H % KVH != 0
    cr_assert_eq(l3d_dev_attention_fwd(e.dev, x, NULL, x, x, x, &d, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    d = (l3d_attn_dims_t){1, 3, 2, 2, 2, 4, 0};  // Tq > Tk
    cr_assert_eq(l3d_dev_attention_fwd(e.dev, x, NULL, x, x, x, &d, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    d = (l3d_attn_dims_t){1, 2, 2, 2, 2, 4, 8};  // kv_bstride < Tk*KVH*D
    cr_assert_eq(l3d_dev_attention_fwd(e.dev, x, NULL, x, x, x, &d, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    env_close(e);
}

// ---- swiglu, add, scale -------------------------------------------------------------------------
static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

Test(cpu_elementwise, swiglu_add_scale) {
    env_t e = env_open(2);
    rng_seed(17);
    size_t n = 40000;  // several chunks and a tail
    float *g = fvec(n, 6.0f), *u = fvec(n, 2.0f), *d = fvec(n, 1.0f), *out = fvec(n, 1.0f);
    double *r = dvec(n), *rg = dvec(n), *ru = dvec(n);
    for (size_t i = 0; i < n; i++) {
        double s = sig(g[i]);
        r[i] = g[i] * s * u[i];
        rg[i] = d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        ru[i] = d[i] * g[i] * s;
    }
    cr_assert_eq(l3d_dev_swiglu_fwd(e.dev, out, g, u, n, L3D_FLOAT32), L3D_OK);
    check_close("swiglu", out, r, n, 1e-6);
    float *g2 = fdup(g, n), *u2 = fdup(u, n);
    cr_assert_eq(l3d_dev_swiglu_fwd(e.dev, g2, g2, u2, n, L3D_FLOAT32),
                 L3D_OK);  // out aliases gate
    cr_assert_eq(memcmp(g2, out, sizeof(float) * n), 0);
    memcpy(g2, g, sizeof(float) * n);
    cr_assert_eq(l3d_dev_swiglu_bwd(e.dev, g2, u2, d, g2, u2, n, L3D_FLOAT32), L3D_OK);  // in place
    check_close("swiglu dgate", g2, rg, n, 1e-6);
    check_close("swiglu dup", u2, ru, n, 1e-6);

    for (size_t i = 0; i < n; i++) r[i] = (double)g[i] + u[i];
    cr_assert_eq(l3d_dev_add(e.dev, out, g, u, n, L3D_FLOAT32), L3D_OK);
    check_close("add", out, r, n, 1e-7);
    memcpy(g2, g, sizeof(float) * n);
    cr_assert_eq(l3d_dev_add(e.dev, g2, g2, u, n, L3D_FLOAT32), L3D_OK);
    cr_assert_eq(memcmp(g2, out, sizeof(float) * n), 0);
    for (size_t i = 0; i < n; i++) r[i] = (double)g[i] * 0.37f;
    cr_assert_eq(l3d_dev_scale(e.dev, g, 0.37f, n, L3D_FLOAT32), L3D_OK);
    check_close("scale", g, r, n, 1e-7);
    free(g), free(u), free(d), free(out), free(r), free(rg), free(ru), free(g2), free(u2);
    env_close(e);
}

Test(cpu_elementwise, sumsq) {
    env_t e = env_open(2);
    rng_seed(19);
    size_t sizes[] = {0, 1, 15, 16385, 100003};
    for (size_t t = 0; t < sizeof(sizes) / sizeof(sizes[0]); t++) {
        size_t n = sizes[t];
        float *x = fvec(n, 3.0f);
        double ref = 0.0, got = -1.0;
        for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
        cr_assert_eq(l3d_dev_sumsq(e.dev, x, n, &got, L3D_FLOAT32), L3D_OK);
        cr_assert(fabs(got - ref) <= 1e-12 * fmax(ref, 1.0), "n %zu got %.17g ref %.17g", n, got,
                  ref);
        free(x);
    }
    env_close(e);
}

// ---- xent ---------------------------------------------------------------------------------------
static void xent_case(env_t e, int N, int V, float gs) {
    float *z = fvec((size_t)N * V, 8.0f), *loss = fvec(N, 1.0f);
    int32_t *t = malloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) t[n] = n % 5 == 3 ? -1 : (int32_t)((n * 7919u) % (unsigned)V);
    double *rg = dvec((size_t)N * V), *rl = dvec(N);  // ignored rows stay 0
    l3d_ref_xent(z, t, N, V, gs, rg, rl);
    cr_assert_eq(l3d_dev_xent_fwd_bwd(e.dev, z, loss, t, N, V, gs, L3D_FLOAT32), L3D_OK);
    check_close("xent grad", z, rg, (size_t)N * V, 1e-6);
    check_close("xent loss", loss, rl, N, 1e-6);
    for (int n = 0; n < N; n++)
        if (t[n] < 0) {
            cr_assert_eq(loss[n], 0.0f);
            for (int i = 0; i < V; i++) cr_assert_eq(z[(size_t)n * V + i], 0.0f);
        }
    free(z), free(loss), free(t), free(rg), free(rl);
}

Test(cpu_xent, matches_reference_and_ignores) {
    env_t e = env_open(2);
    rng_seed(23);
    xent_case(e, 1, 7, 1.0f);
    xent_case(e, 23, 1000, 0.125f);
    xent_case(e, 9, 33333, 1.0f / 9.0f);
    // losses NULL gives the same gradient
    float z[12], z2[12];
    for (int i = 0; i < 12; i++) z[i] = z2[i] = frand();
    int32_t t[2] = {1, 4};
    float loss[2];
    cr_assert_eq(l3d_dev_xent_fwd_bwd(e.dev, z, loss, t, 2, 6, 0.5f, L3D_FLOAT32), L3D_OK);
    cr_assert_eq(l3d_dev_xent_fwd_bwd(e.dev, z2, NULL, t, 2, 6, 0.5f, L3D_FLOAT32), L3D_OK);
    cr_assert_eq(memcmp(z, z2, sizeof(z)), 0);
    env_close(e);
}

Test(cpu_xent, target_out_of_range) {
    env_t e = env_open(1);
    float z[12] = {0}, loss[2];
    int32_t t[2] = {1, 6};
    cr_assert_eq(l3d_dev_xent_fwd_bwd(e.dev, z, loss, t, 2, 6, 1.0f, L3D_FLOAT32),
                 L3D_ERR_INVALID_ARG);
    const char *msg = l3d_ctx_last_error(e.ctx);
    cr_assert(strstr(msg, "xent") && strstr(msg, "target[1]") && strstr(msg, "6"), "%s", msg);
    for (int i = 0; i < 12; i++) cr_assert_eq(z[i], 0.0f);  // untouched
    env_close(e);
}

// ---- adamw --------------------------------------------------------------------------------------
// Three steps on four elements, with the expected numbers computed step by step in double
// following torch.optim.AdamW: decay, moments, bias-corrected update.
Test(cpu_adamw, three_steps_by_hand) {
    env_t e = env_open(1);
    float p[4] = {0.5f, -1.0f, 2.0f, 0.0f}, m[4] = {0}, v[4] = {0};
    const float grads[3][4] = {{0.1f, -0.2f, 0.0f, 4.0f},
                               {0.3f, 0.1f, -0.5f, -4.0f},
                               {-0.2f, 0.0f, 0.25f, 1.0f}};
    double ep[4] = {0.5, -1.0, 2.0, 0.0}, em[4] = {0}, ev[4] = {0};
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    for (int t = 1; t <= 3; t++) {
        double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        for (int i = 0; i < 4; i++) {
            double g = grads[t - 1][i] * gs;
            ep[i] *= 1 - lr * wd;
            em[i] = b1 * em[i] + (1 - b1) * g;
            ev[i] = b2 * ev[i] + (1 - b2) * g * g;
            ep[i] -= lr / bc1 * em[i] / (sqrt(ev[i]) / sqrt(bc2) + eps);
        }
        cr_assert_eq(l3d_dev_adamw(e.dev, p, grads[t - 1], m, v, 4, (float)lr, (float)b1,
                                   (float)b2, (float)eps, (float)wd, (float)bc1, (float)bc2,
                                   (float)gs, NULL, 0.0f, L3D_FLOAT32),
                     L3D_OK);
        for (int i = 0; i < 4; i++) {
            cr_assert(fabs(p[i] - ep[i]) <= 1e-6 * fmax(1.0, fabs(ep[i])),
                      "step %d p[%d] %.9g %.9g", t, i, (double)p[i], ep[i]);
            cr_assert(fabs(m[i] - em[i]) <= 1e-6 * fmax(1e-3, fabs(em[i])));
            cr_assert(fabs(v[i] - ev[i]) <= 1e-6 * fmax(1e-6, fabs(ev[i])));
        }
    }
    // Step 1, element 0 by hand: g = 0.05; p = 0.5 * 0.999 = 0.4995; m = 0.005, v = 1.25e-4;
    // m/bc1 = 0.05, sqrt(v/bc2) = 0.05, so p = 0.4995 - 0.01 * 1 = 0.4895 (up to eps).
    float p1[1] = {0.5f}, m1[1] = {0}, v1[1] = {0}, g1[1] = {0.1f};
    cr_assert_eq(l3d_dev_adamw(e.dev, p1, g1, m1, v1, 1, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f,
                               0.05f, 0.5f, NULL, 0.0f, L3D_FLOAT32),
                 L3D_OK);
    cr_assert(fabsf(p1[0] - 0.4895f) < 1e-6f, "%.9g", (double)p1[0]);
    cr_assert(fabsf(m1[0] - 0.005f) < 1e-8f && fabsf(v1[0] - 1.25e-4f) < 1e-10f);
    env_close(e);
}

// ---- determinism across thread counts -----------------------------------------------------------
Test(cpu_determinism, one_vs_three_threads) {
    env_t e1 = env_open(1), e3 = env_open(3);
    env_t es[2] = {e1, e3};
    rng_seed(29);
    // gemm, tiled
    {
        int M = 333, N = 600, K = 77;
        float *A = fvec((size_t)M * K, 1), *B = fvec((size_t)N * K, 1), *C[2];
        for (int r = 0; r < 2; r++) {
            C[r] = calloc((size_t)M * N, sizeof(float));
            l3d_gemm_t g = {0, 1, M, N, K, 1.0f, 0.0f, A, K, B, K, C[r], N, 1, 0, 0, 0, L3D_FLOAT32, L3D_FLOAT32, L3D_FLOAT32, 0};
            cr_assert_eq(l3d_dev_gemm(es[r].dev, &g), L3D_OK);
        }
        same("gemm", C[0], C[1], sizeof(float) * M * N);
        free(A), free(B), free(C[0]), free(C[1]);
    }
    // rmsnorm bwd (dw reduction), embedding bwd (scatter), sumsq, xent
    {
        int N = 301, C = 130, V = 7;
        float *x = fvec((size_t)N * C, 1), *w = fvec(C, 1), *g = fvec((size_t)N * C, 1);
        float *rs = malloc(sizeof(float) * N), *o = malloc(sizeof(float) * N * C);
        float *dx[2], *dw[2], *dt[2];
        int32_t *tok = malloc(sizeof(int32_t) * N);
        for (int n = 0; n < N; n++) tok[n] = (n * 3) % V;
        double ss[2];
        float *z[2], *loss[2];
        for (int r = 0; r < 2; r++) {
            dx[r] = calloc((size_t)N * C, sizeof(float));
            dw[r] = calloc(C, sizeof(float));
            dt[r] = calloc((size_t)V * C, sizeof(float));
            cr_assert_eq(l3d_dev_rmsnorm_fwd(es[r].dev, o, rs, x, w, N, C, 1e-5f, L3D_FLOAT32,
                                             L3D_FLOAT32), L3D_OK);
            cr_assert_eq(l3d_dev_rmsnorm_bwd(es[r].dev, dx[r], dw[r], g, x, w, rs, N, C,
                                             L3D_FLOAT32, L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
            cr_assert_eq(l3d_dev_embedding_bwd(es[r].dev, dt[r], g, tok, N, C, L3D_FLOAT32,
                                               L3D_FLOAT32), L3D_OK);
            cr_assert_eq(l3d_dev_sumsq(es[r].dev, g, (size_t)N * C, &ss[r], L3D_FLOAT32), L3D_OK);
            z[r] = fdup(g, (size_t)N * C);
            loss[r] = malloc(sizeof(float) * N);
            cr_assert_eq(l3d_dev_xent_fwd_bwd(es[r].dev, z[r], loss[r], tok, N, C, 0.1f,
                                              L3D_FLOAT32), L3D_OK);
        }
        same("rmsnorm dx", dx[0], dx[1], sizeof(float) * N * C);
        same("rmsnorm dw", dw[0], dw[1], sizeof(float) * C);
        same("embedding_bwd", dt[0], dt[1], sizeof(float) * V * C);
        same("sumsq", &ss[0], &ss[1], sizeof(double));
        same("xent grad", z[0], z[1], sizeof(float) * N * C);
        same("xent loss", loss[0], loss[1], sizeof(float) * N);
        for (int r = 0; r < 2; r++)
            free(dx[r]), free(dw[r]), free(dt[r]), free(z[r]), free(loss[r]);
        free(x), free(w), free(g), free(rs), free(o), free(tok);
    }
    // attention fwd and bwd with GQA over several tiles
    {
        l3d_attn_dims_t d = {2, 130, 130, 4, 2, 32, 0};
        size_t nq = (size_t)2 * 130 * 4 * 32, nk = (size_t)2 * 130 * 2 * 32, nl = 2 * 4 * 130;
        float *q = fvec(nq, 1), *k = fvec(nk, 1), *v = fvec(nk, 1), *go = fvec(nq, 1);
        float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
        for (int r = 0; r < 2; r++) {
            out[r] = malloc(sizeof(float) * nq), lse[r] = malloc(sizeof(float) * nl);
            dq[r] = malloc(sizeof(float) * nq), dk[r] = malloc(sizeof(float) * nk);
            dv[r] = malloc(sizeof(float) * nk);
            cr_assert_eq(l3d_dev_attention_fwd(es[r].dev, out[r], lse[r], q, k, v, &d,
                                               L3D_FLOAT32), L3D_OK);
            cr_assert_eq(l3d_dev_attention_bwd(es[r].dev, dq[r], dk[r], dv[r], go, q, k, v, out[r],
                                               lse[r], &d, L3D_FLOAT32),
                         L3D_OK);
        }
        same("attention out", out[0], out[1], sizeof(float) * nq);
        same("attention lse", lse[0], lse[1], sizeof(float) * nl);
        same("attention dq", dq[0], dq[1], sizeof(float) * nq);
        same("attention dk", dk[0], dk[1], sizeof(float) * nk);
        same("attention dv", dv[0], dv[1], sizeof(float) * nk);
        for (int r = 0; r < 2; r++)
            free(out[r]), free(lse[r]), free(dq[r]), free(dk[r]), free(dv[r]);
        free(q), free(k), free(v), free(go);
    }
    env_close(e1);
    env_close(e3);
}

// exp of non-finite input: NaN propagates (a diverged run must show NaN, not a number) and
// +-inf saturate. A NaN used to reach a signed shift that overflowed (the sanitizer build
// reported undefined behaviour at devices/cpu/cpu.h:94).
#include "devices/cpu/cpu.h"
Test(cpu_exp, non_finite_input) {
    volatile float nan_ = NAN, inf_ = INFINITY;  // not folded at compile time
    cr_assert(isnan(l3d_expf(nan_)));
    cr_assert(isnan(l3d_expf(-nan_)));
    cr_assert_eq(l3d_expf(-inf_), 0.0f);
    cr_assert(isfinite(l3d_expf(inf_)) && l3d_expf(inf_) > 1e38f);
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (i % 3 == 0) ? nan_ : (float)i - 32.0f;
    for (int i = 0; i < 64; i++) y[i] = l3d_expf(x[i]);  // the vectorised form too
    for (int i = 0; i < 64; i++)
        cr_assert(i % 3 == 0 ? isnan(y[i]) : fabsf(y[i] - expf(x[i])) <= 1e-6f * expf(x[i]),
                  "x %g: %g", (double)x[i], (double)y[i]);
}
