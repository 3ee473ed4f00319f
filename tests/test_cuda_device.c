// The CUDA device's entries against the CPU device's on the same inputs (built only with the
// CUDA device; its table is created directly while it is not yet in the registry). Without a
// GPU, creating it fails cleanly: L3D_ERR_UNSUPPORTED naming CUDA's reason, nothing left
// allocated; the comparisons then skip. On a GPU (tools/gpu-check.sh) every entry built so far
// runs against the CPU device, each bound derived next to its assertion (u = 2^-24).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"

extern const l3d_device_ops_t l3d_cuda_device_ops;

static l3d_ctx_t *ctx;
static l3d_device_t *gpu, *cpu;
static const double u = 0x1p-24;

static void setup(void) {
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    cr_assert_eq(l3d_device_create(ctx, "cpu", NULL, &cpu), L3D_OK);
    if (l3d_device_create_from(ctx, &l3d_cuda_device_ops, NULL, &gpu) != L3D_OK) gpu = NULL;
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
    l3d_status st = l3d_device_create_from(c, &l3d_cuda_device_ops, NULL, &d);
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
    l3d_device_params_t p = {0, 4096};
    cr_assert_eq(l3d_device_create_from(c, &l3d_cuda_device_ops, &p, &d), L3D_ERR_UNSUPPORTED);
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
            cr_assert(fabs(g - w) <= 8e-6 * fabs(w) + ulp16(t, w) + 1e-30, "%s swiglu[%zu] %.9g vs %.9g",
                      l3d_dtype_name(t), i, g, w);
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
                                   0.0975f, 1.0f, &want, 0.5f, t), L3D_OK);
        cr_assert_eq(l3d_dev_adamw(gpu, dp, gx[0], dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                   0.19f, 0.0975f, 1.0f, gout, 0.5f, t), L3D_OK);
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

// GEMM through cuBLASLt against the CPU device for each dtype mix, transposes, a batch and a
// mix cuBLASLt does not take (a float32 A beside a bfloat16 B). Both accumulate in float32 in
// their own orders: each within (K + 2) u of sum |a||b| from the exact product (Higham 3.1),
// so within twice that of each other, plus a 16-bit C's rounding (one ulp either side).
static void gemm_case(l3d_dtype ta, l3d_dtype tb, l3d_dtype tc, int tra, int trb, int M, int N,
                      int K, float beta, int batch) {
    size_t na = (size_t)M * K * batch, nb = (size_t)K * N * batch, nc = (size_t)M * N * batch;
    void *a = rand_vals(ta, na, -1, 1), *b = rand_vals(tb, nb, -1, 1), *c = rand_vals(tc, nc, -1, 1);
    size_t ea = l3d_dtype_size(ta), eb = l3d_dtype_size(tb), ec = l3d_dtype_size(tc);
    void *want = malloc(nc * ec), *got = malloc(nc * ec);
    memcpy(want, c, nc * ec);
    void *ga = to_dev(gpu, a, na * ea), *gb = to_dev(gpu, b, nb * eb), *gc = to_dev(gpu, c, nc * ec);
    l3d_gemm_t g = {.trans_a = tra, .trans_b = trb, .M = M, .N = N, .K = K, .alpha = 1.0f,
                    .beta = beta, .lda = tra ? M : K, .ldb = trb ? K : N, .ldc = N, .batch = batch,
                    .stride_a = (size_t)M * K, .stride_b = (size_t)K * N, .stride_c = (size_t)M * N,
                    .a_type = ta, .b_type = tb, .c_type = tc};
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
        cr_assert(fabs(x - w) <= bound, "gemm %s x %s -> %s (%d,%d) %dx%dx%d b%d: C[%zu] %.9g vs "
                  "%.9g", l3d_dtype_name(ta), l3d_dtype_name(tb), l3d_dtype_name(tc), tra, trb, M,
                  N, K, batch, i, x, w);
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
