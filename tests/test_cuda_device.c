// The CUDA device's entries against the CPU device's on the same inputs (built only with the
// CUDA device). Without a GPU, creating it fails cleanly: L3D_ERR_UNSUPPORTED naming CUDA's
// reason, nothing left allocated; the comparisons then skip. On a GPU (tools/gpu-check.sh)
// every entry runs against the CPU device, each bound derived next to its assertion
// (u = 2^-24).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "devices/device_math.h"

static l3d_ctx_t *ctx;
static l3d_device_t *gpu, *cpu;
static const double u = 0x1p-24;

static void setup(void) {
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    cr_assert_eq(l3d_device_create(ctx, "cpu", NULL, &cpu), L3D_OK);
    if (l3d_device_create(ctx, "cuda", NULL, &gpu) != L3D_OK) gpu = NULL;
}
static void teardown(void) {
    l3d_device_destroy(gpu);
    l3d_device_destroy(cpu);
    l3d_ctx_destroy(ctx);
}
TestSuite(cuda, .init = setup, .fini = teardown);

#define NEED_GPU() \
    if (!gpu) cr_skip_test("no GPU: %s", l3d_ctx_last_error(ctx))

// No GPU (this machine, CI): the device refuses to exist, saying why in CUDA's words, and
// leaves no memory behind. With one, it reports itself and its memory.
Test(cuda, create_fails_cleanly_without_a_gpu) {
    l3d_ctx_t *c;
    cr_assert_eq(l3d_ctx_create(NULL, &c), L3D_OK);
    l3d_device_t *d = NULL;
    l3d_status st = l3d_device_create(c, "cuda", NULL, &d);
    if (st == L3D_OK) {
        uint64_t fr = 0, tot = 0;
        cr_assert_eq(l3d_dev_mem_info(d, &fr, &tot), L3D_OK);
        cr_assert(tot > 0 && fr <= tot);
        cr_assert(!l3d_dev_is_host(d));
        l3d_device_destroy(d);
    } else {
        cr_assert_eq(st, L3D_ERR_UNSUPPORTED, "%s", l3d_ctx_last_error(c));
        cr_assert(strstr(l3d_ctx_last_error(c), "cuda"), "%s", l3d_ctx_last_error(c));
        cr_assert_null(d);
    }
    cr_assert_eq(l3d_ctx_mem_in_use(c, NULL), 0, "bytes left: %zu", l3d_ctx_mem_in_use(c, NULL));
    l3d_ctx_destroy(c);
    // a GPU index beyond the visible ones is refused the same way
    cr_assert_eq(l3d_ctx_create(NULL, &c), L3D_OK);
    l3d_device_params_t p = {.device_index = 4096};
    cr_assert_eq(l3d_device_create(c, "cuda", &p, &d), L3D_ERR_UNSUPPORTED);
    l3d_ctx_destroy(c);
}

// ---- helpers: host data to either device and back -----------------------------------------
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(float lo, float hi) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 40) * 0x1p-24);
}
static void *to_dev(l3d_device_t *d, const void *h, size_t bytes) {
    void *p = NULL;
    cr_assert_eq(l3d_dev_alloc(d, bytes ? bytes : 1, "other", &p), L3D_OK);
    cr_assert_eq(l3d_dev_copy(d, p, h, bytes, L3D_COPY_H2D), L3D_OK);
    return p;
}
static void from_dev(l3d_device_t *d, void *h, const void *p, size_t bytes) {
    cr_assert_eq(l3d_dev_copy(d, h, p, bytes, L3D_COPY_D2H), L3D_OK);
    cr_assert_eq(l3d_dev_sync(d), L3D_OK, "%s", l3d_ctx_last_error(ctx));
}
// n values in dtype t, random in [lo, hi), as stored bytes
static void *rand_vals(l3d_dtype t, size_t n, float lo, float hi) {
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = frand(lo, hi);
    if (t == L3D_FLOAT32) return f;
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = t == L3D_BFLOAT16 ? l3d_f32_to_bf16(f[i]) : l3d_f32_to_f16(f[i]);
    free(f);
    return h;
}
static float val(const void *p, l3d_dtype t, size_t i) {
    if (t == L3D_FLOAT32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == L3D_BFLOAT16 ? l3d_bf16_to_f32(h) : l3d_f16_to_f32(h);
}
// one 16-bit ulp at |x|'s scale (half of it is a store's rounding), 0 for float32
static double ulp16(l3d_dtype t, double x) {
    return t == L3D_BFLOAT16 ? 0x1p-7 * fabs(x) : t == L3D_FLOAT16 ? 0x1p-10 * fabs(x) : 0;
}
static const l3d_dtype k_types[3] = {L3D_FLOAT32, L3D_BFLOAT16, L3D_FLOAT16};

// convert: both directions, every 16-bit value and random floats: the same bits as the CPU
// device (both run device_math.h's conversions).
Test(cuda, convert_same_bits_as_cpu) {
    NEED_GPU();
    size_t n = 65536 * 4;
    uint32_t *bits = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {  // every bfloat16 value's float, then random bit patterns
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        bits[i] = i < 65536 ? (uint32_t)i << 16 : (uint32_t)(rng >> 32);
    }
    for (int k = 1; k < 3; k++) {
        l3d_dtype t = k_types[k];
        uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
        cr_assert_eq(l3d_dev_convert(cpu, want, t, bits, L3D_FLOAT32, n), L3D_OK);
        void *ds = to_dev(gpu, bits, n * 4), *dd;
        cr_assert_eq(l3d_dev_alloc(gpu, n * 2, "other", &dd), L3D_OK);
        cr_assert_eq(l3d_dev_convert(gpu, dd, t, ds, L3D_FLOAT32, n), L3D_OK);
        from_dev(gpu, got, dd, n * 2);
        cr_assert(!memcmp(got, want, n * 2), "%s narrowing differs", l3d_dtype_name(t));
        float *w32 = malloc(n * 4), *g32 = malloc(n * 4);
        cr_assert_eq(l3d_dev_convert(cpu, w32, L3D_FLOAT32, want, t, n), L3D_OK);
        cr_assert_eq(l3d_dev_convert(gpu, ds, L3D_FLOAT32, dd, t, n), L3D_OK);
        from_dev(gpu, g32, ds, n * 4);
        cr_assert(!memcmp(g32, w32, n * 4), "%s widening differs", l3d_dtype_name(t));
        l3d_dev_free(gpu, ds, n * 4, "other");
        l3d_dev_free(gpu, dd, n * 2, "other");
        free(want), free(got), free(w32), free(g32);
    }
    free(bits);
}

// add, scale, SwiGLU forward and backward in each dtype against the CPU device. The formulas
// are the same lines; the GPU may contract a product and a sum into one FMA (one rounding
// fewer), so each float32 result is within 4 u of the CPU's per operation involved (add 1,
// scale 1, swiglu: exp 1e-6 relative both, 6 roundings; its gradient 10), plus one 16-bit ulp
// where a 16-bit store may round the other way.
Test(cuda, elementwise_match_cpu) {
    NEED_GPU();
    size_t n = 100003;
    for (int k = 0; k < 3; k++) {
        l3d_dtype t = k_types[k];
        size_t es = l3d_dtype_size(t), bytes = n * es;
        void *a = rand_vals(t, n, -6, 6), *b = rand_vals(t, n, -3, 3), *c = rand_vals(t, n, -2, 2);
        void *ca = malloc(bytes), *cb = malloc(bytes), *got = malloc(bytes), *got2 = malloc(bytes);
        void *ga = to_dev(gpu, a, bytes), *gb = to_dev(gpu, b, bytes), *gc = to_dev(gpu, c, bytes);
        // swiglu forward into a copy of a (out aliases gate)
        memcpy(ca, a, bytes);
        cr_assert_eq(l3d_dev_swiglu_fwd(cpu, ca, ca, b, n, t), L3D_OK);
        cr_assert_eq(l3d_dev_swiglu_fwd(gpu, ga, ga, gb, n, t), L3D_OK);
        from_dev(gpu, got, ga, bytes);
        for (size_t i = 0; i < n; i++) {
            double w = val(ca, t, i), g = val(got, t, i);
            cr_assert(fabs(g - w) <= 8e-6 * fabs(w) + ulp16(t, w) + 1e-30,
                      "%s swiglu[%zu] %.9g vs %.9g", l3d_dtype_name(t), i, g, w);
        }
        // swiglu backward: dgate into c's copy, dup into b's (aliasing as the model does)
        cr_assert_eq(l3d_dev_copy(gpu, ga, a, bytes, L3D_COPY_H2D), L3D_OK);
        memcpy(ca, a, bytes), memcpy(cb, b, bytes);
        cr_assert_eq(l3d_dev_swiglu_bwd(cpu, ca, cb, c, ca, cb, n, t), L3D_OK);
        cr_assert_eq(l3d_dev_swiglu_bwd(gpu, ga, gb, gc, ga, gb, n, t), L3D_OK);
        from_dev(gpu, got, ga, bytes);
        from_dev(gpu, got2, gb, bytes);
        for (size_t i = 0; i < n; i++) {
            double w = val(ca, t, i), g = val(got, t, i), w2 = val(cb, t, i), g2 = val(got2, t, i);
            // (dgate's terms reach |d u| (1 + |g|), so its bound scales with that, not with it)
            double mag = fabs(val(c, t, i) * val(b, t, i)) * (1 + fabs(val(a, t, i)));
            cr_assert(fabs(g - w) <= 1e-5 * mag + ulp16(t, w) + 1e-30, "%s dgate[%zu]",
                      l3d_dtype_name(t), i);
            cr_assert(fabs(g2 - w2) <= 8e-6 * fabs(w2) + ulp16(t, w2) + 1e-30, "%s dup[%zu]",
                      l3d_dtype_name(t), i);
        }
        // add and scale: one float32 operation each, exactly rounded on both: the same bits
        cr_assert_eq(l3d_dev_copy(gpu, ga, a, bytes, L3D_COPY_H2D), L3D_OK);
        cr_assert_eq(l3d_dev_copy(gpu, gb, b, bytes, L3D_COPY_H2D), L3D_OK);
        memcpy(ca, a, bytes);
        cr_assert_eq(l3d_dev_add(cpu, ca, ca, b, n, t), L3D_OK);
        cr_assert_eq(l3d_dev_scale(cpu, ca, 0.37f, n, t), L3D_OK);
        cr_assert_eq(l3d_dev_add(gpu, ga, ga, gb, n, t), L3D_OK);
        cr_assert_eq(l3d_dev_scale(gpu, ga, 0.37f, n, t), L3D_OK);
        from_dev(gpu, got, ga, bytes);
        cr_assert(!memcmp(got, ca, bytes), "%s add + scale differ", l3d_dtype_name(t));
        l3d_dev_free(gpu, ga, bytes, "other");
        l3d_dev_free(gpu, gb, bytes, "other");
        l3d_dev_free(gpu, gc, bytes, "other");
        free(a), free(b), free(c), free(ca), free(cb), free(got), free(got2);
    }
}

// The multi-tensor sum of squares (weights, an empty tensor, 16-bit tensors) and the ordered
// double sum: double accumulation in another order than the CPU's, n terms of magnitude up to
// the sum: n 2^-53 relative. AdamW on the same inputs, clipped by that norm: within the
// element update's bound (tests/test_device_math.c: 3 u |p| + 15 u |step|) doubled, as
// either side may be off that much from the exact value.
Test(cuda, sumsq_sum_f64_adamw_match_cpu) {
    NEED_GPU();
    for (int k = 0; k < 3; k++) {
        l3d_dtype t = k_types[k];
        size_t es = l3d_dtype_size(t), len[3] = {70001, 0, 513};
        double w[3] = {0.5, 1.0, 1.0};
        void *h[3], *gx[3];
        for (int j = 0; j < 3; j++) {
            h[j] = rand_vals(t, len[j] ? len[j] : 1, -1, 1);
            gx[j] = to_dev(gpu, h[j], (len[j] ? len[j] : 1) * es);
        }
        double want = 0, got = 0, *gout;
        cr_assert_eq(l3d_dev_sumsq_multi(cpu, 3, (const void *const *)h, len, w, &want, t), L3D_OK);
        cr_assert_eq(l3d_dev_alloc(gpu, 2 * sizeof(double), "other", (void **)&gout), L3D_OK);
        cr_assert_eq(l3d_dev_sumsq_multi(gpu, 3, (const void *const *)gx, len, w, gout, t), L3D_OK);
        cr_assert_eq(l3d_dev_sum_f64(gpu, gout, gout, 1), L3D_OK);
        from_dev(gpu, &got, gout, sizeof(double));
        cr_assert(fabs(got - want) <= 71000 * 0x1p-53 * want, "%s sumsq %.17g vs %.17g",
                  l3d_dtype_name(t), got, want);
        // AdamW over tensor 0 with its gradient, clipped by the norm (max_norm 0.5)
        size_t n = len[0];
        float *p = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4), *pg = malloc(n * 4);
        float *p0 = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            p[i] = p0[i] = frand(-1, 1), m[i] = frand(-1e-2f, 1e-2f), v[i] = frand(0, 1e-4f);
        float *dp = to_dev(gpu, p, n * 4), *dm = to_dev(gpu, m, n * 4), *dv = to_dev(gpu, v, n * 4);
        cr_assert_eq(l3d_dev_adamw(cpu, p, h[0], m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f,
                                   0.0975f, 1.0f, &want, 0.5f, t),
                     L3D_OK);
        cr_assert_eq(l3d_dev_adamw(gpu, dp, gx[0], dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                   0.19f, 0.0975f, 1.0f, gout, 0.5f, t),
                     L3D_OK);
        from_dev(gpu, pg, dp, n * 4);
        for (size_t i = 0; i < n; i++) {
            // the step's size, from the CPU's result: |p0 (1 - lr wd) - p|
            double step = fabs(p0[i] * (1.0 - 1e-3 * 0.1) - p[i]);
            cr_assert(fabs(pg[i] - p[i]) <= 2 * (3 * u * fabs(p0[i]) + 15 * u * step),
                      "%s adamw p[%zu] %.9g vs %.9g", l3d_dtype_name(t), i, pg[i], p[i]);
        }
        l3d_dev_free(gpu, dp, n * 4, "other");
        l3d_dev_free(gpu, dm, n * 4, "other");
        l3d_dev_free(gpu, dv, n * 4, "other");
        l3d_dev_free(gpu, gout, 2 * sizeof(double), "other");
        for (int j = 0; j < 3; j++) {
            l3d_dev_free(gpu, gx[j], (len[j] ? len[j] : 1) * es, "other");
            free(h[j]);
        }
        free(p), free(p0), free(m), free(v), free(pg);
    }
}

// AdamW over several tensors in one call with bf16 copies refreshed in the same pass: each
// master within the one-tensor bound above of the CPU's, and each param16 exactly the GPU's own
// updated master rounded (one rounding: the CPU device's convert of the GPU's values).
Test(cuda, adamw_many_tensors_refresh_16bit) {
    NEED_GPU();
    enum { NT = 3 };
    const size_t len[NT] = {0, 70001, 5003};
    float *hp[NT], *hp0[NT], *hm[NT], *hv[NT], *hg[NT];
    void *d16[NT];
    l3d_adamw_tensor_t tc[NT], tg[NT];
    for (int k = 0; k < NT; k++) {
        size_t n = len[k] ? len[k] : 1;
        hp[k] = malloc(n * 4), hp0[k] = malloc(n * 4), hm[k] = malloc(n * 4);
        hv[k] = malloc(n * 4), hg[k] = malloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            hp[k][i] = hp0[k][i] = frand(-1, 1), hm[k][i] = frand(-1e-2f, 1e-2f);
            hv[k][i] = frand(0, 1e-4f), hg[k][i] = frand(-1, 1);
        }
        tg[k] = (l3d_adamw_tensor_t){to_dev(gpu, hp[k], n * 4), to_dev(gpu, hm[k], n * 4),
                                     to_dev(gpu, hv[k], n * 4), to_dev(gpu, hg[k], n * 4),
                                     to_dev(gpu, hg[k], n * 2), len[k], k == 2 ? 0.0f : 0.1f};
        d16[k] = tg[k].param16;
        tc[k] = (l3d_adamw_tensor_t){hp[k], hm[k], hv[k], hg[k], NULL, len[k], tg[k].weight_decay};
    }
    l3d_adamw_step_t st = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.19f, 0.0975f, 1.0f, 0.0f, NULL,
                           L3D_FLOAT32, L3D_BFLOAT16};
    cr_assert_eq(l3d_dev_adamw_multi(cpu, tc, NT, &st), L3D_OK);
    cr_assert_eq(l3d_dev_adamw_multi(gpu, tg, NT, &st), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    for (int k = 1; k < NT; k++) {
        size_t n = len[k];
        float *pg = malloc(n * 4);
        uint16_t *g16 = malloc(n * 2), *want16 = malloc(n * 2);
        from_dev(gpu, pg, tg[k].param, n * 4);
        from_dev(gpu, g16, d16[k], n * 2);
        cr_assert_eq(l3d_dev_convert(cpu, want16, L3D_BFLOAT16, pg, L3D_FLOAT32, n), L3D_OK);
        for (size_t i = 0; i < n; i++) {
            double step = fabs(hp0[k][i] * (1.0 - 1e-3 * tc[k].weight_decay) - hp[k][i]);
            cr_assert(fabs(pg[i] - hp[k][i]) <= 2 * (3 * u * fabs(hp0[k][i]) + 15 * u * step),
                      "tensor %d p[%zu] %.9g vs %.9g", k, i, pg[i], hp[k][i]);
            cr_assert_eq(g16[i], want16[i], "tensor %d param16[%zu]", k, i);
        }
        free(pg), free(g16), free(want16);
    }
    for (int k = 0; k < NT; k++) {
        size_t n = len[k] ? len[k] : 1;
        l3d_dev_free(gpu, tg[k].param, n * 4, "other");
        l3d_dev_free(gpu, tg[k].m, n * 4, "other");
        l3d_dev_free(gpu, tg[k].v, n * 4, "other");
        l3d_dev_free(gpu, (void *)tg[k].grad, n * 4, "other");
        l3d_dev_free(gpu, d16[k], n * 2, "other");
        free(hp[k]), free(hp0[k]), free(hm[k]), free(hv[k]), free(hg[k]);
    }
}

// GEMM through cuBLASLt against the CPU device for each dtype mix, transposes, a batch and a
// mix cuBLASLt does not take (a float32 A beside a bfloat16 B). Both accumulate in float32 in
// their own orders: each within (K + 2) u of sum |a||b| from the exact product (Higham 3.1),
// so within twice that of each other, plus a 16-bit C's rounding (one ulp either side).
static void gemm_case(l3d_dtype ta, l3d_dtype tb, l3d_dtype tc, int tra, int trb, int M, int N,
                      int K, float beta, int batch) {
    size_t na = (size_t)M * K * batch, nb = (size_t)K * N * batch, nc = (size_t)M * N * batch;
    void *a = rand_vals(ta, na, -1, 1), *b = rand_vals(tb, nb, -1, 1),
         *c = rand_vals(tc, nc, -1, 1);
    size_t ea = l3d_dtype_size(ta), eb = l3d_dtype_size(tb), ec = l3d_dtype_size(tc);
    void *want = malloc(nc * ec), *got = malloc(nc * ec);
    memcpy(want, c, nc * ec);
    void *ga = to_dev(gpu, a, na * ea), *gb = to_dev(gpu, b, nb * eb),
         *gc = to_dev(gpu, c, nc * ec);
    l3d_gemm_t g = {.trans_a = tra,
                    .trans_b = trb,
                    .M = M,
                    .N = N,
                    .K = K,
                    .alpha = 1.0f,
                    .beta = beta,
                    .lda = tra ? M : K,
                    .ldb = trb ? K : N,
                    .ldc = N,
                    .batch = batch,
                    .stride_a = (size_t)M * K,
                    .stride_b = (size_t)K * N,
                    .stride_c = (size_t)M * N,
                    .a_type = ta,
                    .b_type = tb,
                    .c_type = tc};
    l3d_gemm_t gc_ = g, gg = g;
    gc_.A = a, gc_.B = b, gc_.C = want;
    gg.A = ga, gg.B = gb, gg.C = gc;
    cr_assert_eq(l3d_dev_gemm(cpu, &gc_), L3D_OK);
    cr_assert_eq(l3d_dev_gemm(gpu, &gg), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    from_dev(gpu, got, gc, nc * ec);
    for (size_t i = 0; i < nc; i++) {
        // sum |a||b| <= K for operands in [-1, 1]; beta C adds |beta| more
        double mag = K + fabs(beta), w = val(want, tc, i), x = val(got, tc, i);
        double bound = 2 * (K + 2) * u * mag + 2 * ulp16(tc, w);
        cr_assert(fabs(x - w) <= bound,
                  "gemm %s x %s -> %s (%d,%d) %dx%dx%d b%d: C[%zu] %.9g vs "
                  "%.9g",
                  l3d_dtype_name(ta), l3d_dtype_name(tb), l3d_dtype_name(tc), tra, trb, M, N, K,
                  batch, i, x, w);
    }
    l3d_dev_free(gpu, ga, na * ea, "other");
    l3d_dev_free(gpu, gb, nb * eb, "other");
    l3d_dev_free(gpu, gc, nc * ec, "other");
    free(a), free(b), free(c), free(want), free(got);
}

Test(cuda, gemm_matches_cpu) {
    NEED_GPU();
    for (int k = 0; k < 3; k++)
        for (int tr = 0; tr < 4; tr++) {
            l3d_dtype t = k_types[k];
            gemm_case(t, t, t, tr & 1, tr >> 1, 37, 53, 129, 0.0f, 1);
            gemm_case(t, t, L3D_FLOAT32, tr & 1, tr >> 1, 64, 48, 256, 1.0f, 1);
        }
    gemm_case(L3D_BFLOAT16, L3D_BFLOAT16, L3D_BFLOAT16, 0, 1, 17, 33, 64, 0.5f, 3);
    gemm_case(L3D_FLOAT32, L3D_BFLOAT16, L3D_FLOAT16, 1, 0, 19, 23, 31, 1.0f, 2);
}

// train.allow_tf32: a float32 GEMM on a device created with allow_tf32 may round each input
// to TF32 (11 significant bits: relative error 2^-11 each, so 2^-10 + 2^-22 per product) and
// accumulates in float32: within (2^-10 + 2^-22) K + 2 (K + 2) u K of the CPU's exact-float32
// product for operands in [-1, 1]. 16-bit operands are unaffected (gemm_matches_cpu's bound).
Test(cuda, gemm_tf32_on_request) {
    NEED_GPU();
    l3d_device_params_t p = {.allow_tf32 = 1};
    l3d_device_t *tf = NULL;
    cr_assert_eq(l3d_device_create(ctx, "cuda", &p, &tf), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    const int M = 64, N = 48, K = 256;
    float *a = rand_vals(L3D_FLOAT32, (size_t)M * K, -1, 1);
    float *b = rand_vals(L3D_FLOAT32, (size_t)K * N, -1, 1);
    float *want = calloc((size_t)M * N, 4), *got = calloc((size_t)M * N, 4);
    void *ga = to_dev(tf, a, (size_t)M * K * 4), *gb = to_dev(tf, b, (size_t)K * N * 4),
         *gc = to_dev(tf, want, (size_t)M * N * 4);
    l3d_gemm_t g = {.M = M, .N = N, .K = K, .alpha = 1.0f, .lda = K, .ldb = N, .ldc = N};
    l3d_gemm_t gh = g, gd = g;
    gh.A = a, gh.B = b, gh.C = want;
    gd.A = ga, gd.B = gb, gd.C = gc;
    cr_assert_eq(l3d_dev_gemm(cpu, &gh), L3D_OK);
    cr_assert_eq(l3d_dev_gemm(tf, &gd), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    from_dev(tf, got, gc, (size_t)M * N * 4);
    double bound = (0x1p-10 + 0x1p-22) * K + 2.0 * (K + 2) * u * K;
    for (int i = 0; i < M * N; i++)
        cr_assert(fabs((double)got[i] - want[i]) <= bound, "tf32 C[%d] %.9g vs %.9g", i, got[i],
                  want[i]);
    l3d_dev_free(tf, ga, (size_t)M * K * 4, "other");
    l3d_dev_free(tf, gb, (size_t)K * N * 4, "other");
    l3d_dev_free(tf, gc, (size_t)M * N * 4, "other");
    l3d_device_destroy(tf);
    free(a), free(b), free(want), free(got);
}

// gemm's round_a (device ABI 11): a float32 A against bfloat16 weights is rounded and multiplied
// as a bfloat16 pair. The CPU device's product of the explicitly rounded A (a bfloat16 operand)
// with the same B is the reference: both sum exact products in float32, each within
// (K + 2) u sum |a||b| of the exact result, so within twice that of each other.
Test(cuda, gemm_round_a_multiplies_the_rounded_rows) {
    NEED_GPU();
    const int M = 37, N = 53, K = 200;
    float *a = rand_vals(L3D_FLOAT32, (size_t)M * K, -1, 1);
    uint16_t *b = rand_vals(L3D_BFLOAT16, (size_t)N * K, -1, 1);
    uint16_t *a16 = malloc((size_t)M * K * 2);
    for (int i = 0; i < M * K; i++) a16[i] = l3d_f32_to_bf16(a[i]);
    float *want = calloc((size_t)M * N, 4), *got = calloc((size_t)M * N, 4);
    void *ga = to_dev(gpu, a, (size_t)M * K * 4), *gb = to_dev(gpu, b, (size_t)N * K * 2),
         *gc = to_dev(gpu, want, (size_t)M * N * 4);
    l3d_gemm_t g = {.trans_b = 1, .M = M, .N = N, .K = K, .alpha = 1.0f, .lda = K, .ldb = K,
                    .ldc = N, .b_type = L3D_BFLOAT16};
    l3d_gemm_t gh = g, gd = g;
    gh.A = a16, gh.a_type = L3D_BFLOAT16, gh.B = b, gh.C = want;
    gd.A = ga, gd.B = gb, gd.C = gc, gd.round_a = 1;
    cr_assert_eq(l3d_dev_gemm(cpu, &gh), L3D_OK);
    cr_assert_eq(l3d_dev_gemm(gpu, &gd), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    from_dev(gpu, got, gc, (size_t)M * N * 4);
    double bound = 2.0 * (K + 2) * u * K;  // sum |a||b| <= K for operands in [-1, 1]
    for (int i = 0; i < M * N; i++)
        cr_assert(fabs((double)got[i] - want[i]) <= bound, "round_a C[%d] %.9g vs %.9g", i,
                  got[i], want[i]);
    l3d_dev_free(gpu, ga, (size_t)M * K * 4, "other");
    l3d_dev_free(gpu, gb, (size_t)N * K * 2, "other");
    l3d_dev_free(gpu, gc, (size_t)M * N * 4, "other");
    free(a), free(b), free(a16), free(want), free(got);
}

// ---- the model's ops ---------------------------------------------------------------------------
// Copies of a host array for both devices (the CPU device takes host pointers).
typedef struct {
    void *h, *g;
    size_t bytes;
} pair_t;
static pair_t pair_of(const void *h, size_t bytes) {
    pair_t p = {malloc(bytes ? bytes : 1), to_dev(gpu, h, bytes), bytes};
    memcpy(p.h, h, bytes);
    return p;
}
static void *pair_got(pair_t *p) {
    void *out = malloc(p->bytes ? p->bytes : 1);
    from_dev(gpu, out, p->g, p->bytes);
    return out;
}
static void pair_free(pair_t *p) {
    free(p->h);
    l3d_dev_free(gpu, p->g, p->bytes ? p->bytes : 1, "other");
}

// RMSNorm: the row statistic is a sum of C squares in another order than the CPU's (C u of
// it, rstd then within (C/2 + 2) u), the output two more products; the backward's dot the same
// C u, dx's two terms 4 u each of their magnitudes; dw's sum over N rows in other chunks within
// (N + 2) u of sum |dout x rstd|. Each doubled (both sides' errors), plus a 16-bit ulp.
Test(cuda, rmsnorm_matches_cpu) {
    NEED_GPU();
    int N = 67, C = 1000;
    for (int k = 0; k < 3; k++) {
        l3d_dtype t = k_types[k];
        size_t es = l3d_dtype_size(t), nb = (size_t)N * C * es;
        void *x = rand_vals(t, (size_t)N * C, -2, 2), *w = rand_vals(t, (size_t)C, 0.5f, 1.5f);
        void *dout = rand_vals(t, (size_t)N * C, -1, 1), *dx0 = rand_vals(t, (size_t)N * C, -1, 1);
        void *dw0 = rand_vals(t, (size_t)C, -1, 1);
        pair_t px = pair_of(x, nb), pw = pair_of(w, C * es), pd = pair_of(dout, nb);
        pair_t pdx = pair_of(dx0, nb), pdw = pair_of(dw0, C * es), po = pair_of(x, nb);
        float *rs_c = malloc((size_t)N * 4), *rs_g_h = malloc((size_t)N * 4), *rs_g;
        cr_assert_eq(l3d_dev_alloc(gpu, (size_t)N * 4, "other", (void **)&rs_g), L3D_OK);
        cr_assert_eq(l3d_dev_rmsnorm_fwd(cpu, po.h, rs_c, px.h, pw.h, N, C, 1e-5f, t, t), L3D_OK);
        cr_assert_eq(l3d_dev_rmsnorm_fwd(gpu, po.g, rs_g, px.g, pw.g, N, C, 1e-5f, t, t), L3D_OK);
        void *out = pair_got(&po);
        from_dev(gpu, rs_g_h, rs_g, (size_t)N * 4);
        for (int n = 0; n < N; n++) {
            cr_assert(fabs(rs_g_h[n] - rs_c[n]) <= 2 * (C / 2 + 2) * u * rs_c[n], "rstd[%d]", n);
            for (int c = 0; c < C; c++) {
                size_t i = (size_t)n * C + c;
                double wv = val(po.h, t, i), g = val(out, t, i);
                cr_assert(fabs(g - wv) <= 2 * (C / 2 + 4) * u * fabs(wv) + ulp16(t, wv) + 1e-30,
                          "%s rmsnorm out[%d][%d] %.9g vs %.9g", l3d_dtype_name(t), n, c, g, wv);
            }
        }
        cr_assert_eq(l3d_dev_rmsnorm_bwd(cpu, pdx.h, pdw.h, pd.h, px.h, pw.h, rs_c, N, C, t, t, t),
                     L3D_OK);
        cr_assert_eq(l3d_dev_rmsnorm_bwd(gpu, pdx.g, pdw.g, pd.g, px.g, pw.g, rs_g, N, C, t, t, t),
                     L3D_OK);
        void *dx = pair_got(&pdx), *dw = pair_got(&pdw);
        for (int n = 0; n < N; n++) {
            // the dot's magnitude: sum |dout w x|, and the two terms' sizes
            double dmag = 0;
            for (int c = 0; c < C; c++)
                dmag += fabs(val(dout, t, (size_t)n * C + c) * val(w, t, c) *
                             val(x, t, (size_t)n * C + c));
            double r3 = pow(rs_c[n], 3) / C;
            for (int c = 0; c < C; c++) {
                size_t i = (size_t)n * C + c;
                double xv = val(x, t, i),
                       term = rs_c[n] * fabs(val(dout, t, i) * val(w, t, c)) + r3 * dmag * fabs(xv);
                double wv = val(pdx.h, t, i), g = val(dx, t, i);
                double bound = 2 * ((C + 8) * u * term + u * fabs(val(dx0, t, i))) + ulp16(t, wv);
                cr_assert(fabs(g - wv) <= bound + 1e-30, "%s dx[%d][%d] %.9g vs %.9g",
                          l3d_dtype_name(t), n, c, g, wv);
            }
        }
        for (int c = 0; c < C; c++) {
            double mag = fabs(val(dw0, t, c));
            for (int n = 0; n < N; n++)
                mag +=
                    fabs(val(dout, t, (size_t)n * C + c) * val(x, t, (size_t)n * C + c)) * rs_c[n];
            double wv = val(pdw.h, t, c), g = val(dw, t, c);
            cr_assert(fabs(g - wv) <= 2 * (N + 4) * u * mag + ulp16(t, wv) + 1e-30,
                      "%s dw[%d] %.9g vs %.9g", l3d_dtype_name(t), c, g, wv);
        }
        pair_free(&px), pair_free(&pw), pair_free(&pd), pair_free(&pdx), pair_free(&pdw);
        pair_free(&po);
        l3d_dev_free(gpu, rs_g, (size_t)N * 4, "other");
        free(x), free(w), free(dout), free(dx0), free(dw0), free(out), free(dx), free(dw);
        free(rs_c), free(rs_g_h);
    }
}

// ---- RMSNorm of rows split by columns (tensor parallelism 2d) --------------------------------
// A block of C columns of rows of C_full = 3 C; the other blocks' parts of each row's
// statistics are fixed host values added to each device's own rowdot (the caller's
// all-reduce). Bounds, each side's worst case doubled for the two (u = 2^-24), plus ulp16 on a
// 16-bit output (each side rounds its float32 value once: half an ulp each):
// - rowdot: C products (a * w rounded, then * b) summed in another order: (C + 2) u of
//   sum |a w b| each side; a float32 output, no 16-bit rounding.
// - rstd: its statistic within (C + 1) u relative (positive terms, then the add of the other
//   blocks' part), halved by the square root, then /C_full, +eps, sqrt, 1/x: ((C + 1) / 2 + 3) u
//   relative each side, (C + 7) u for the two.
// - out = x * rstd * w: two products more: (C + 11) u relative.
// - dx: the dot within (C + 3) u of D = sum |dout w x| + |the other blocks' part|; rstd^3
//   three times rstd's error; dot rstd^3 / C_full * x five roundings: (5 C / 2 + 19) u of each
//   term's size (rstd |dout w| and rstd^3 / C_full D |x|), the difference and the += two more
//   roundings, and u of |dx0|: (5 C + 42) u term + 2 u |dx0| for the two.
// - dw: N rows' dout x rstd (two products and rstd's error) and dw0 summed in other chunks:
//   (N + C / 2 + 6) u of |dw0| + sum |dout x rstd| each side.
typedef struct {
    l3d_dtype t;
    int N, C, C_full;
    const void *x, *w, *dout, *dx0, *dw0;  // the inputs (host, dtype t)
    const float *odot;                     // the other blocks' part of each dot, or NULL
} rows_in_t;

// rowdot's bound for row n: 2 (C + 2) u sum |a w b| (w NULL: 1)
static double rowdot_bound(const rows_in_t *r, const void *a, const void *b, const void *w,
                           int n) {
    double mag = 0;
    for (int c = 0; c < r->C; c++) {
        size_t i = (size_t)n * r->C + c;
        mag += fabs((double)val(a, r->t, i) * val(b, r->t, i) * (w ? val(w, r->t, c) : 1.0f));
    }
    return 2 * (r->C + 2) * u * mag;
}

// rowdot(a, b, w) (w NULL: none) into p on both devices, each row within rowdot_bound of the
// CPU's; then `other` (the other blocks' part, the all-reduce's stand-in; NULL: none) added on
// both sides and the GPU's sum written back. Returns the GPU's result (host memory).
static float *rowdot_both(const rows_in_t *r, pair_t *p, const pair_t *a, const pair_t *b,
                          const pair_t *w, const float *other, const char *what) {
    l3d_dtype t = r->t;
    cr_assert_eq(l3d_dev_rmsnorm_rowdot(cpu, p->h, a->h, b->h, w ? w->h : NULL, r->N, r->C, t,
                                        t), L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_rowdot(gpu, p->g, a->g, b->g, w ? w->g : NULL, r->N, r->C, t,
                                        t), L3D_OK);
    float *want = p->h, *got = pair_got(p);
    for (int n = 0; n < r->N; n++) {
        cr_assert(fabs(got[n] - want[n]) <= rowdot_bound(r, a->h, b->h, w ? w->h : NULL, n),
                  "%s %s[%d] %.9g vs %.9g", l3d_dtype_name(t), what, n, got[n], want[n]);
        if (other) want[n] += other[n], got[n] += other[n];
    }
    if (other) cr_assert_eq(l3d_dev_copy(gpu, p->g, got, p->bytes, L3D_COPY_H2D), L3D_OK);
    return got;
}

// rstd(N) and out(N,C) of rows_fwd (or rmsnorm_fwd) against the reference's
static void check_rows_fwd(const rows_in_t *r, const float *rs_want, const float *rs_got,
                           const void *out_want, const void *out_got, const char *what) {
    int C = r->C;
    for (int n = 0; n < r->N; n++) {
        cr_assert(fabs(rs_got[n] - rs_want[n]) <= (C + 7) * u * rs_want[n],
                  "%s %s rstd[%d] %.9g vs %.9g", what, l3d_dtype_name(r->t), n, rs_got[n],
                  rs_want[n]);
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)n * C + c;
            double wv = val(out_want, r->t, i), g = val(out_got, r->t, i);
            cr_assert(fabs(g - wv) <= (C + 11) * u * fabs(wv) + ulp16(r->t, wv) + 1e-30,
                      "%s %s out[%d][%d] %.9g vs %.9g", what, l3d_dtype_name(r->t), n, c, g, wv);
        }
    }
}

// dx(N,C) and dw(C) of rows_bwd (or rmsnorm_bwd) from dx0, dw0 against the reference's; rs
// the reference's rstd
static void check_rows_bwd(const rows_in_t *r, const float *rs, const void *dx_want,
                           const void *dx_got, const void *dw_want, const void *dw_got,
                           const char *what) {
    int N = r->N, C = r->C;
    l3d_dtype t = r->t;
    for (int n = 0; n < N; n++) {
        double D = r->odot ? fabs(r->odot[n]) : 0, r3 = pow(rs[n], 3) / r->C_full;
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)n * C + c;
            D += fabs((double)val(r->dout, t, i) * val(r->w, t, c) * val(r->x, t, i));
        }
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)n * C + c;
            double term = rs[n] * fabs((double)val(r->dout, t, i) * val(r->w, t, c)) +
                          r3 * D * fabs(val(r->x, t, i));
            double wv = val(dx_want, t, i), g = val(dx_got, t, i);
            double bound = (5.0 * C + 42) * u * term + 2 * u * fabs(val(r->dx0, t, i));
            cr_assert(fabs(g - wv) <= bound + ulp16(t, wv) + 1e-30, "%s %s dx[%d][%d] %.9g vs %.9g",
                      what, l3d_dtype_name(t), n, c, g, wv);
        }
    }
    for (int c = 0; c < C; c++) {
        double mag = fabs(val(r->dw0, t, c));
        for (int n = 0; n < N; n++)
            mag += fabs((double)val(r->dout, t, (size_t)n * C + c) *
                        val(r->x, t, (size_t)n * C + c)) * rs[n];
        double wv = val(dw_want, t, c), g = val(dw_got, t, c);
        cr_assert(fabs(g - wv) <= 2 * (N + C / 2.0 + 6) * u * mag + ulp16(t, wv) + 1e-30,
                  "%s %s dw[%d] %.9g vs %.9g", what, l3d_dtype_name(t), c, g, wv);
    }
}

static void rows_case(l3d_dtype t, int N, int C) {
    int Cf = 3 * C;
    float eps = 1e-5f;
    size_t es = l3d_dtype_size(t), nx = (size_t)N * C, nb = nx * es, wb = (size_t)C * es;
    size_t fb = (size_t)N * 4;
    void *x = rand_vals(t, nx, -2, 2), *w = rand_vals(t, (size_t)C, 0.5f, 1.5f);
    void *dout = rand_vals(t, nx, -1, 1), *dx0 = rand_vals(t, nx, -1, 1);
    void *dw0 = rand_vals(t, (size_t)C, -1, 1);
    // the other two blocks' parts (2 C squares of values in [-2, 2): about 8 C / 3; the dots
    // of either sign)
    float *oss = rand_vals(L3D_FLOAT32, (size_t)N, (float)C, 4.0f * C);
    float *odot = rand_vals(L3D_FLOAT32, (size_t)N, -0.25f * C, 0.25f * C);
    float *zero = calloc((size_t)N, 4);
    pair_t px = pair_of(x, nb), pw = pair_of(w, wb), pd = pair_of(dout, nb);
    pair_t pdx = pair_of(dx0, nb), pdw = pair_of(dw0, wb), po = pair_of(x, nb);
    pair_t pss = pair_of(zero, fb), prs = pair_of(zero, fb), pdot = pair_of(zero, fb);
    pair_t pnw = pair_of(zero, fb);
    rows_in_t r = {t, N, C, Cf, x, w, dout, dx0, dw0, odot};

    // rowdot(x, x): the block's part of sum x^2; then the other blocks' part added
    float *ss_g = rowdot_both(&r, &pss, &px, &px, NULL, oss, "ss");
    // rows_fwd of the block with the whole row's statistic
    cr_assert_eq(l3d_dev_rmsnorm_rows_fwd(cpu, po.h, prs.h, px.h, pw.h, pss.h, N, C, Cf, eps, t,
                                          t), L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_rows_fwd(gpu, po.g, prs.g, px.g, pw.g, pss.g, N, C, Cf, eps, t,
                                          t), L3D_OK);
    void *out = pair_got(&po);
    float *rs_g = pair_got(&prs);
    check_rows_fwd(&r, prs.h, rs_g, po.h, out, "2d");
    // rowdot(dout, x, w), the other blocks' part added, into rows_bwd (dx, dw += on dx0, dw0)
    float *dot_g = rowdot_both(&r, &pdot, &pd, &px, &pw, odot, "dot");
    cr_assert_eq(l3d_dev_rmsnorm_rows_bwd(cpu, pdx.h, pdw.h, pd.h, px.h, pw.h, prs.h, pdot.h, N,
                                          C, Cf, t, t, t), L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_rows_bwd(gpu, pdx.g, pdw.g, pd.g, px.g, pw.g, prs.g, pdot.g, N,
                                          C, Cf, t, t, t), L3D_OK);
    void *dx = pair_got(&pdx), *dw = pair_got(&pdw);
    check_rows_bwd(&r, prs.h, pdx.h, dx, pdw.h, dw, "2d");
    // rowdot without w (of terms of either sign)
    float *nw_g = rowdot_both(&r, &pnw, &pd, &px, NULL, NULL, "rowdot without w");

    // One block holding every column (C_full = C), on the GPU alone: rowdot(x, x) into
    // rows_fwd is rmsnorm_fwd, rowdot(dout, x, w) into rows_bwd is rmsnorm_bwd (the contract's
    // same math; here the same kernels' code, asserted within the bounds above).
    rows_in_t r1 = r;
    r1.C_full = C, r1.odot = NULL;
    pair_t o1 = pair_of(x, nb), o2 = pair_of(x, nb), dx1 = pair_of(dx0, nb);
    pair_t dx2 = pair_of(dx0, nb), dw1 = pair_of(dw0, wb), dw2 = pair_of(dw0, wb);
    pair_t rs1 = pair_of(zero, fb), rs2 = pair_of(zero, fb), ss1 = pair_of(zero, fb);
    pair_t dot1 = pair_of(zero, fb);
    cr_assert_eq(l3d_dev_rmsnorm_fwd(gpu, o1.g, rs1.g, px.g, pw.g, N, C, eps, t, t), L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_rowdot(gpu, ss1.g, px.g, px.g, NULL, N, C, t, t), L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_rows_fwd(gpu, o2.g, rs2.g, px.g, pw.g, ss1.g, N, C, C, eps, t,
                                          t), L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_bwd(gpu, dx1.g, dw1.g, pd.g, px.g, pw.g, rs1.g, N, C, t, t, t),
                 L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_rowdot(gpu, dot1.g, pd.g, px.g, pw.g, N, C, t, t), L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_rows_bwd(gpu, dx2.g, dw2.g, pd.g, px.g, pw.g, rs2.g, dot1.g, N,
                                          C, C, t, t, t), L3D_OK);
    void *oa = pair_got(&o1), *ob = pair_got(&o2), *dxa = pair_got(&dx1), *dxb = pair_got(&dx2);
    void *dwa = pair_got(&dw1), *dwb = pair_got(&dw2);
    float *rsa = pair_got(&rs1), *rsb = pair_got(&rs2);
    check_rows_fwd(&r1, rsa, rsb, oa, ob, "one block");
    check_rows_bwd(&r1, rsa, dxa, dxb, dwa, dwb, "one block");

    pair_t *pairs[] = {&px, &pw, &pd, &pdx, &pdw, &po, &pss, &prs, &pdot, &pnw,
                       &o1, &o2, &dx1, &dx2, &dw1, &dw2, &rs1, &rs2, &ss1, &dot1};
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) pair_free(pairs[i]);
    void *bufs[] = {x, w, dout, dx0, dw0, oss, odot, zero, ss_g, out, rs_g, dot_g, dx, dw, nw_g,
                    oa, ob, dxa, dxb, dwa, dwb, rsa, rsb};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
}

Test(cuda, rmsnorm_rows_match_cpu) {
    NEED_GPU();
    // (37 rows: one GPU chunk of dw partials, C < the block's threads; 137 rows of 300: three
    // chunks, threads taking two columns)
    int shapes[2][2] = {{37, 96}, {137, 300}};
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 2; k++) rows_case(k_types[k], shapes[s][0], shapes[s][1]);
}

// RoPE: a * c - b * s per element on both; a contracted product-sum rounds once less: within
// 2 u (|a| + |b|) of each other, plus a 16-bit ulp. Forward and inverse, pos0 > 0.
Test(cuda, rope_matches_cpu) {
    NEED_GPU();
    int B = 2, T = 9, NH = 3, D = 16, Tmax = 32, half = D / 2;
    float *cs = malloc((size_t)Tmax * half * 4), *sn = malloc((size_t)Tmax * half * 4);
    for (int p = 0; p < Tmax; p++)
        for (int i = 0; i < half; i++) {
            double ang = p * pow(500000.0, -2.0 * i / D);
            cs[p * half + i] = (float)cos(ang), sn[p * half + i] = (float)sin(ang);
        }
    pair_t pc = pair_of(cs, (size_t)Tmax * half * 4), ps = pair_of(sn, (size_t)Tmax * half * 4);
    for (int k = 0; k < 3; k++)
        for (int inv = 0; inv < 2; inv++) {
            l3d_dtype t = k_types[k];
            size_t n = (size_t)B * T * NH * D, es = l3d_dtype_size(t);
            void *x = rand_vals(t, n, -3, 3);
            pair_t px = pair_of(x, n * es);
            cr_assert_eq(l3d_dev_rope(cpu, px.h, pc.h, ps.h, B, T, NH, D, 5, inv, t), L3D_OK);
            cr_assert_eq(l3d_dev_rope(gpu, px.g, pc.g, ps.g, B, T, NH, D, 5, inv, t), L3D_OK);
            void *got = pair_got(&px);
            for (size_t e = 0; e < n; e++) {
                size_t r = e / D * D, i = e % D % half;
                double mag = fabs(val(x, t, r + i)) + fabs(val(x, t, r + i + half));
                double wv = val(px.h, t, e), g = val(got, t, e);
                cr_assert(fabs(g - wv) <= 2 * u * mag + ulp16(t, wv) + 1e-30, "%s rope[%zu]",
                          l3d_dtype_name(t), e);
            }
            pair_free(&px);
            free(x), free(got);
        }
    pair_free(&pc), pair_free(&ps);
    free(cs), free(sn);
}

// Embedding forward (a copy: the same bits) and backward with repeated tokens (each touched
// row summed in the tokens' order from its old value, as the CPU device does: the same bits),
// one-rank and vocabulary-parallel (rows [v0, v0 + Vl) of a vocabulary of V).
Test(cuda, embedding_same_bits_as_cpu) {
    NEED_GPU();
    int N = 300, C = 40, V = 50, v0 = 20, Vl = 17;
    int32_t tok[300];
    for (int n = 0; n < N; n++) tok[n] = (int32_t)((n * 7 + n / 13) % V);
    pair_t pt = pair_of(tok, sizeof(tok));
    for (int k = 0; k < 3; k++)
        for (int vp = 0; vp < 2; vp++) {
            l3d_dtype t = k_types[k];
            size_t es = l3d_dtype_size(t), rows = vp ? (size_t)Vl : (size_t)V;
            void *table = rand_vals(t, rows * C, -1, 1), *dout = rand_vals(t, (size_t)N * C, -1, 1);
            pair_t ptab = pair_of(table, rows * C * es), pd = pair_of(dout, (size_t)N * C * es);
            void *zero = calloc((size_t)N * C, es);
            pair_t po = pair_of(zero, (size_t)N * C * es);
            if (vp) {
                cr_assert_eq(
                    l3d_dev_embedding_fwd_vp(cpu, po.h, pt.h, ptab.h, N, C, v0, Vl, V, t, t),
                    L3D_OK);
                cr_assert_eq(
                    l3d_dev_embedding_fwd_vp(gpu, po.g, pt.g, ptab.g, N, C, v0, Vl, V, t, t),
                    L3D_OK);
            } else {
                cr_assert_eq(l3d_dev_embedding_fwd(cpu, po.h, pt.h, ptab.h, N, C, V, t, t), L3D_OK);
                cr_assert_eq(l3d_dev_embedding_fwd(gpu, po.g, pt.g, ptab.g, N, C, V, t, t), L3D_OK);
            }
            void *out = pair_got(&po);
            cr_assert(!memcmp(out, po.h, po.bytes), "%s embedding_fwd%s", l3d_dtype_name(t),
                      vp ? "_vp" : "");
            if (vp) {
                cr_assert_eq(l3d_dev_embedding_bwd_vp(cpu, ptab.h, pd.h, pt.h, N, C, v0, Vl, t, t),
                             L3D_OK);
                cr_assert_eq(l3d_dev_embedding_bwd_vp(gpu, ptab.g, pd.g, pt.g, N, C, v0, Vl, t, t),
                             L3D_OK);
            } else {
                cr_assert_eq(l3d_dev_embedding_bwd(cpu, ptab.h, pd.h, pt.h, N, C, t, t), L3D_OK);
                cr_assert_eq(l3d_dev_embedding_bwd(gpu, ptab.g, pd.g, pt.g, N, C, t, t), L3D_OK);
            }
            void *tab = pair_got(&ptab);
            cr_assert(!memcmp(tab, ptab.h, ptab.bytes), "%s embedding_bwd%s", l3d_dtype_name(t),
                      vp ? "_vp" : "");
            pair_free(&ptab), pair_free(&pd), pair_free(&po);
            free(table), free(dout), free(zero), free(out), free(tab);
        }
    // a token outside the vocabulary: refused at the next sync, as the CPU refuses the call
    int32_t bad[2] = {3, 99};
    pair_t pb = pair_of(bad, sizeof(bad));
    void *tab = rand_vals(L3D_FLOAT32, (size_t)V * C, -1, 1), *o;
    pair_t ptab = pair_of(tab, (size_t)V * C * 4);
    cr_assert_eq(l3d_dev_alloc(gpu, 2 * (size_t)C * 4, "other", &o), L3D_OK);
    cr_assert_eq(l3d_dev_embedding_fwd(gpu, o, pb.g, ptab.g, 2, C, V, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_OK);
    cr_assert_eq(l3d_dev_sync(gpu), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dev_sync(gpu), L3D_OK, "the flag is cleared once reported");
    l3d_dev_free(gpu, o, 2 * (size_t)C * 4, "other");
    pair_free(&pb), pair_free(&ptab), pair_free(&pt);
    free(tab);
}

// Cross-entropy: the exps are the same lines (a contracted step may round once less: 2 u
// each), the row sums in double in other orders: the sum within 3 u relative, so the loss
// within 4 u + the float rounding of itself; each gradient element e * k within 6 u of its
// size, grad_scale's subtraction one more u of it, plus a 16-bit ulp. Ignored rows (target
// -1) are zero on both. The vocabulary-parallel passes over three column blocks, summed on the
// host as the all-reduces would, against the one-rank op.
Test(cuda, xent_matches_cpu) {
    NEED_GPU();
    int N = 13, V = 5003;
    int32_t tg[13];
    for (int n = 0; n < N; n++) tg[n] = n == 4 ? -1 : (int32_t)((n * 977) % V);
    pair_t pt = pair_of(tg, sizeof(tg));
    float gs = 1.0f / 13;
    for (int k = 0; k < 3; k++) {
        l3d_dtype t = k_types[k];
        size_t es = l3d_dtype_size(t), nb = (size_t)N * V * es;
        void *z = rand_vals(t, (size_t)N * V, -8, 8);
        pair_t pz = pair_of(z, nb);
        float lc[13], lg[13], *dl;
        cr_assert_eq(l3d_dev_alloc(gpu, sizeof(lg), "other", (void **)&dl), L3D_OK);
        cr_assert_eq(l3d_dev_xent_fwd_bwd(cpu, pz.h, lc, pt.h, N, V, gs, t), L3D_OK);
        cr_assert_eq(l3d_dev_xent_fwd_bwd(gpu, pz.g, dl, pt.g, N, V, gs, t), L3D_OK);
        void *got = pair_got(&pz);
        from_dev(gpu, lg, dl, sizeof(lg));
        for (int n = 0; n < N; n++) {
            cr_assert(fabs(lg[n] - lc[n]) <= 4 * u + u * fabs(lc[n]), "%s loss[%d] %.9g vs %.9g",
                      l3d_dtype_name(t), n, lg[n], lc[n]);
            for (int c = 0; c < V; c++) {
                size_t i = (size_t)n * V + c;
                double wv = val(pz.h, t, i), g = val(got, t, i);
                cr_assert(fabs(g - wv) <=
                              6 * u * fabs(wv) + (c == tg[n] ? u * gs : 0) + ulp16(t, wv) + 1e-30,
                          "%s grad[%d][%d] %.9g vs %.9g", l3d_dtype_name(t), n, c, g, wv);
            }
        }
        l3d_dev_free(gpu, dl, sizeof(lg), "other");
        pair_free(&pz);
        free(z), free(got);
    }
    pair_free(&pt);
}

// Attention, causal with grouped kv heads (H 4 over KVH 2), head dimension 64, training
// (Tq = Tk = 37) and decode (Tq 3 of Tk 37, a KV cache of capacity 48: kv_bstride). Operands
// in [-1, 1]: a score scale q.k sums D products of size <= 1 in another order than the CPU's,
// within 2 D u D scale of each other (eps_s), its exp and the log-sum-exp 4 u more; the
// output, a p-weighted mean of v (sum p = 1), then within (eps_s + 4 u) 2 + 4 u of max |v| =
// 1, the lse within eps_s + 4 u. The backward's dp = dout.v the same 2 D u D, ds = p (dp - D)
// with |dp - D| <= 2 D; dq (normalised by the p's like the output) within
// scale (2 D (eps_s + 4 u) + 2 eps_dp) of each other; dk and dv sum over up to Tq query rows
// whose p's are not normalised over them: Tq times that. Plus a 16-bit ulp each.
static void attn_case(l3d_dtype t, int B, int Tq, int Tk, int cap) {
    int H = 4, KVH = 2, D = 64;
    size_t es = l3d_dtype_size(t), nq = (size_t)B * Tq * H * D, nkv = (size_t)B * cap * KVH * D;
    l3d_attn_dims_t d = {B, Tq, Tk, H, KVH, D, cap == Tk ? 0 : (size_t)cap * KVH * D};
    void *q = rand_vals(t, nq, -1, 1), *k = rand_vals(t, nkv, -1, 1), *v = rand_vals(t, nkv, -1, 1);
    void *dout = rand_vals(t, nq, -1, 1), *zq = calloc(nq, es);
    size_t nkc = (size_t)B * Tk * KVH * D;  // (dk, dv: contiguous)
    void *zk = calloc(nkc, es);
    pair_t pq = pair_of(q, nq * es), pk = pair_of(k, nkv * es), pv = pair_of(v, nkv * es);
    pair_t pd = pair_of(dout, nq * es), po = pair_of(zq, nq * es), pdq = pair_of(zq, nq * es);
    pair_t pdk = pair_of(zk, nkc * es), pdv = pair_of(zk, nkc * es);
    size_t nl = (size_t)B * H * Tq;
    float *lc = malloc(nl * 4), *lg = malloc(nl * 4), *dlse;
    cr_assert_eq(l3d_dev_alloc(gpu, nl * 4, "other", (void **)&dlse), L3D_OK);
    cr_assert_eq(l3d_dev_attention_fwd(cpu, po.h, lc, pq.h, pk.h, pv.h, &d, t), L3D_OK);
    cr_assert_eq(l3d_dev_attention_fwd(gpu, po.g, dlse, pq.g, pk.g, pv.g, &d, t), L3D_OK);
    void *out = pair_got(&po);
    from_dev(gpu, lg, dlse, nl * 4);
    double scale = 1 / sqrt((double)D), eps_s = 2.0 * D * u * D * scale, eps_dp = 2.0 * D * u * D;
    for (size_t i = 0; i < nl; i++)
        cr_assert(fabs(lg[i] - lc[i]) <= eps_s + 4 * u * (1 + fabs(lc[i])), "%s lse[%zu]",
                  l3d_dtype_name(t), i);
    for (size_t i = 0; i < nq; i++) {
        double wv = val(po.h, t, i), g = val(out, t, i);
        cr_assert(fabs(g - wv) <= 2 * (eps_s + 4 * u) + 4 * u + ulp16(t, wv) + 1e-30,
                  "%s attention out[%zu] %.9g vs %.9g (Tq %d Tk %d)", l3d_dtype_name(t), i, g, wv,
                  Tq, Tk);
    }
    if (Tq == Tk) {  // (the backward is the training shape)
        cr_assert_eq(l3d_dev_attention_bwd(cpu, pdq.h, pdk.h, pdv.h, pd.h, pq.h, pk.h, pv.h, po.h,
                                           lc, &d, t),
                     L3D_OK);
        cr_assert_eq(l3d_dev_attention_bwd(gpu, pdq.g, pdk.g, pdv.g, pd.g, pq.g, pk.g, pv.g, po.g,
                                           dlse, &d, t),
                     L3D_OK);
        void *dq = pair_got(&pdq), *dk = pair_got(&pdk), *dv = pair_got(&pdv);
        double bq = scale * (2.0 * D * (eps_s + 4 * u) + 2 * eps_dp);
        for (size_t i = 0; i < nq; i++) {
            double wv = val(pdq.h, t, i), g = val(dq, t, i);
            cr_assert(fabs(g - wv) <= bq + ulp16(t, wv) + 1e-30, "%s dq[%zu] %.9g vs %.9g",
                      l3d_dtype_name(t), i, g, wv);
        }
        for (size_t i = 0; i < nkc; i++) {
            double w1 = val(pdk.h, t, i), g1 = val(dk, t, i), w2 = val(pdv.h, t, i),
                   g2 = val(dv, t, i);
            double bkv = Tq * (H / KVH) * bq / scale;
            cr_assert(fabs(g1 - w1) <= bkv * scale + ulp16(t, w1) + 1e-30,
                      "%s dk[%zu] %.9g vs %.9g", l3d_dtype_name(t), i, g1, w1);
            cr_assert(fabs(g2 - w2) <= bkv + ulp16(t, w2) + 1e-30, "%s dv[%zu] %.9g vs %.9g",
                      l3d_dtype_name(t), i, g2, w2);
        }
        free(dq), free(dk), free(dv);
    }
    l3d_dev_free(gpu, dlse, nl * 4, "other");
    pair_free(&pq), pair_free(&pk), pair_free(&pv), pair_free(&pd), pair_free(&po);
    pair_free(&pdq), pair_free(&pdk), pair_free(&pdv);
    free(q), free(k), free(v), free(dout), free(zq), free(zk), free(out), free(lc), free(lg);
}

Test(cuda, attention_matches_cpu) {
    NEED_GPU();
    for (int kk = 0; kk < 3; kk++) {
        attn_case(k_types[kk], 2, 37, 37, 37);
        attn_case(k_types[kk], 2, 3, 37, 48);
    }
}

// ---- finite differences on the GPU alone -----------------------------------------------------
// Against something neither device's code wrote: the backward of attention and of RMSNorm as
// the central difference of the GPU's own float32 forward, on tiny shapes. The objective is
// L = sum_i r_i out_i for fixed random r (dL/dout = r), evaluated in double on the host; a
// coordinate x_j moved by +-h changes L by 2 h dL/dx_j + O(h^3). In float32 each L carries the
// outputs' rounding, at most n_out * (16 u) * max |r out| (16 u: the forward's few roundings
// per output, its dots of D terms included for D <= 16), so the difference quotient is within
// that / h of the exact one, plus h^2 / 6 |d^3 L / dx_j^3| (below 100 here for operands in
// [-1, 1]). With h = 1e-2: 16 u n_out / 1e-2 + 1e-4 * 100 / 6.
static double objective(const void *out_dev, const float *r, size_t n) {
    float *o = malloc(n * 4);
    from_dev(gpu, o, out_dev, n * 4);
    double L = 0;
    for (size_t i = 0; i < n; i++) L += (double)r[i] * o[i];
    free(o);
    return L;
}

// Each element j of one input (host copy x, device copy xd, the backward's gradient an) moved
// by +-h on the device, the forward rerun (fwd(arg), writing out_dev), the quotient of the
// objective's change against an[j] within `bound`; the element restored after.
typedef void (*fwd_fn)(void *arg);
static void check_fd(const char *name, const float *x, float *xd, const float *an, size_t len,
                     fwd_fn fwd, void *arg, const void *out_dev, const float *r, size_t n_out,
                     double h, double bound) {
    for (size_t j = 0; j < len; j++) {
        float x0 = x[j], xs[2] = {(float)(x0 + h), (float)(x0 - h)};
        double L[2];
        for (int s = 0; s < 2; s++) {
            cr_assert_eq(l3d_dev_copy(gpu, xd + j, &xs[s], 4, L3D_COPY_H2D), L3D_OK);
            fwd(arg);
            L[s] = objective(out_dev, r, n_out);
        }
        cr_assert_eq(l3d_dev_copy(gpu, xd + j, &x0, 4, L3D_COPY_H2D), L3D_OK);
        double fd = (L[0] - L[1]) / ((double)xs[0] - xs[1]);
        cr_assert(fabs(fd - an[j]) <= bound, "d%s[%zu]: backward %.7g, finite differences %.7g",
                  name, j, (double)an[j], fd);
    }
}

typedef struct {
    float *go, *gq, *gk, *gv, *gx, *gw;
    l3d_attn_dims_t d;
    int N, C;
} fd_args_t;
static void attention_fwd(void *arg) {
    fd_args_t *a = arg;
    cr_assert_eq(l3d_dev_attention_fwd(gpu, a->go, NULL, a->gq, a->gk, a->gv, &a->d,
                                       L3D_FLOAT32), L3D_OK);
}
static void rmsnorm_fwd(void *arg) {
    fd_args_t *a = arg;
    cr_assert_eq(l3d_dev_rmsnorm_fwd(gpu, a->go, NULL, a->gx, a->gw, a->N, a->C, 1e-5f,
                                     L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
}

Test(cuda, attention_backward_is_the_forwards_derivative) {
    NEED_GPU();
    int B = 1, T = 5, H = 2, KVH = 1, D = 8;
    size_t nq = (size_t)B * T * H * D, nkv = (size_t)B * T * KVH * D;
    l3d_attn_dims_t d = {B, T, T, H, KVH, D, 0};
    float *q = rand_vals(L3D_FLOAT32, nq, -1, 1), *k = rand_vals(L3D_FLOAT32, nkv, -1, 1);
    float *v = rand_vals(L3D_FLOAT32, nkv, -1, 1), *r = rand_vals(L3D_FLOAT32, nq, -1, 1);
    float *gq = to_dev(gpu, q, nq * 4), *gk = to_dev(gpu, k, nkv * 4), *gv = to_dev(gpu, v, nkv * 4);
    float *gr = to_dev(gpu, r, nq * 4), *go, *glse, *gdq, *gdk, *gdv;
    cr_assert_eq(l3d_dev_alloc(gpu, nq * 4, "other", (void **)&go), L3D_OK);
    cr_assert_eq(l3d_dev_alloc(gpu, (size_t)B * H * T * 4, "other", (void **)&glse), L3D_OK);
    cr_assert_eq(l3d_dev_alloc(gpu, nq * 4, "other", (void **)&gdq), L3D_OK);
    cr_assert_eq(l3d_dev_alloc(gpu, nkv * 4, "other", (void **)&gdk), L3D_OK);
    cr_assert_eq(l3d_dev_alloc(gpu, nkv * 4, "other", (void **)&gdv), L3D_OK);
    cr_assert_eq(l3d_dev_attention_fwd(gpu, go, glse, gq, gk, gv, &d, L3D_FLOAT32), L3D_OK);
    cr_assert_eq(l3d_dev_attention_bwd(gpu, gdq, gdk, gdv, gr, gq, gk, gv, go, glse, &d,
                                       L3D_FLOAT32), L3D_OK);
    float *an[3] = {malloc(nq * 4), malloc(nkv * 4), malloc(nkv * 4)};
    from_dev(gpu, an[0], gdq, nq * 4);
    from_dev(gpu, an[1], gdk, nkv * 4);
    from_dev(gpu, an[2], gdv, nkv * 4);
    const double h = 1e-2, bound = 16 * u * nq / h + 1e-4 * 100 / 6;
    fd_args_t fa = {.go = go, .gq = gq, .gk = gk, .gv = gv, .d = d};
    check_fd("q", q, gq, an[0], nq, attention_fwd, &fa, go, r, nq, h, bound);
    check_fd("k", k, gk, an[1], nkv, attention_fwd, &fa, go, r, nq, h, bound);
    check_fd("v", v, gv, an[2], nkv, attention_fwd, &fa, go, r, nq, h, bound);
    float *ptrs[8] = {gq, gk, gv, gr, go, gdq, gdk, gdv};
    size_t sz[8] = {nq, nkv, nkv, nq, nq, nq, nkv, nkv};
    for (int i = 0; i < 8; i++) l3d_dev_free(gpu, ptrs[i], sz[i] * 4, "other");
    l3d_dev_free(gpu, glse, (size_t)B * H * T * 4, "other");
    for (int i = 0; i < 3; i++) free(an[i]);
    free(q), free(k), free(v), free(r);
}

// RMSNorm: dx and dw from the backward (into zeroed buffers) against central differences of
// the forward, as above (C = 12 terms in a row's statistic).
Test(cuda, rmsnorm_backward_is_the_forwards_derivative) {
    NEED_GPU();
    int N = 3, C = 12;
    size_t n = (size_t)N * C;
    float *x = rand_vals(L3D_FLOAT32, n, -1, 1), *w = rand_vals(L3D_FLOAT32, (size_t)C, 0.5f, 1.5f);
    float *r = rand_vals(L3D_FLOAT32, n, -1, 1), *zero = calloc(n, 4);
    float *gx = to_dev(gpu, x, n * 4), *gw = to_dev(gpu, w, (size_t)C * 4), *gr = to_dev(gpu, r, n * 4);
    float *gdx = to_dev(gpu, zero, n * 4), *gdw = to_dev(gpu, zero, (size_t)C * 4), *go, *grs;
    cr_assert_eq(l3d_dev_alloc(gpu, n * 4, "other", (void **)&go), L3D_OK);
    cr_assert_eq(l3d_dev_alloc(gpu, (size_t)N * 4, "other", (void **)&grs), L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_fwd(gpu, go, grs, gx, gw, N, C, 1e-5f, L3D_FLOAT32, L3D_FLOAT32),
                 L3D_OK);
    cr_assert_eq(l3d_dev_rmsnorm_bwd(gpu, gdx, gdw, gr, gx, gw, grs, N, C, L3D_FLOAT32,
                                     L3D_FLOAT32, L3D_FLOAT32), L3D_OK);
    float *adx = malloc(n * 4), *adw = malloc((size_t)C * 4);
    from_dev(gpu, adx, gdx, n * 4);
    from_dev(gpu, adw, gdw, (size_t)C * 4);
    const double h = 1e-2, bound = 16 * u * n / h + 1e-4 * 100 / 6;
    fd_args_t fa = {.go = go, .gx = gx, .gw = gw, .N = N, .C = C};
    check_fd("x", x, gx, adx, n, rmsnorm_fwd, &fa, go, r, n, h, bound);
    check_fd("w", w, gw, adw, (size_t)C, rmsnorm_fwd, &fa, go, r, n, h, bound);
    float *ptrs[7] = {gx, gw, gr, gdx, gdw, go, grs};
    size_t sz[7] = {n, (size_t)C, n, n, (size_t)C, n, (size_t)N};
    for (int i = 0; i < 7; i++) l3d_dev_free(gpu, ptrs[i], sz[i] * 4, "other");
    free(x), free(w), free(r), free(zero), free(adx), free(adw);
}
