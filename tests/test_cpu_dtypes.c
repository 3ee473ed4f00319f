// The CPU device's dtype entries (device ABI 3): convert between float32, bfloat16 and float16,
// and gemm with 16-bit operands. Expected values come from the formats' definitions: every
// 16-bit value, the exact midpoints between neighbours (ties go to the even one) and the
// floats just beside them; products against a float64 reference on the rounded inputs with a
// bound derived from float32 accumulation plus one rounding of C.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"

static l3d_ctx_t *ctx;
static l3d_device_t *dev;
static void setup(void) {
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_device_params_t p = {.num_threads = 3};
    cr_assert_eq(l3d_device_create(ctx, "cpu", &p, &dev), L3D_OK);
}
static void teardown(void) {
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
}
TestSuite(cpu_dtypes, .init = setup, .fini = teardown);

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// The value of 16-bit pattern h, from the format's definition (not from llama3d's code):
// bfloat16 is the top half of a float32; float16 is sign, 5 exponent bits (bias 15), 10
// mantissa bits, subnormals below 2^-14.
static double half_value(l3d_dtype t, uint16_t h) {
    if (t == L3D_BFLOAT16) return (double)u2f((uint32_t)h << 16);
    int e = (h >> 10) & 31, m = h & 1023;
    double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 31) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp(m, -24);
    return s * ldexp(1024 + m, e - 25);
}
static int half_is_nan(l3d_dtype t, uint16_t h) {
    return t == L3D_BFLOAT16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}

// Every 16-bit value widens exactly and narrows back to itself (NaNs to a quiet NaN); the
// exact midpoint between two neighbours goes to the even one, the floats one ulp either side
// to the nearer; beyond the largest finite value lies inf. Both directions, one call each,
// so the chunked pool path runs too.
static void check_rounding(l3d_dtype t) {
    const size_t n16 = 65536;
    const uint16_t inf = t == L3D_BFLOAT16 ? 0x7f80 : 0x7c00;
    uint16_t *h = malloc(n16 * 2), *back = malloc(n16 * 2);
    float *w = malloc(n16 * 4);
    for (size_t i = 0; i < n16; i++) h[i] = (uint16_t)i;
    cr_assert_eq(l3d_dev_convert(dev, w, L3D_FLOAT32, h, t, n16), L3D_OK);
    cr_assert_eq(l3d_dev_convert(dev, back, t, w, L3D_FLOAT32, n16), L3D_OK);
    for (size_t i = 0; i < n16; i++) {
        if (half_is_nan(t, h[i])) {
            cr_assert(isnan(w[i]) && half_is_nan(t, back[i]), "%s NaN %04zx", l3d_dtype_name(t), i);
            continue;
        }
        cr_assert_eq((double)w[i], half_value(t, h[i]), "%s %04zx widens to %.9g",
                     l3d_dtype_name(t), i, (double)w[i]);
        cr_assert_eq(back[i], h[i], "%s %04zx -> %04x", l3d_dtype_name(t), i, back[i]);
    }
    // Positive neighbours lo < hi (the patterns are ordered for positive values), and their
    // negatives by symmetry: midpoint, and the floats just below and above it.
    size_t np = inf, m = 0;
    float *x = malloc(np * 2 * 3 * 4);
    uint16_t *want = malloc(np * 2 * 3 * 2), *got = malloc(np * 2 * 3 * 2);
    for (uint16_t lo = 0; lo < inf; lo++) {
        uint16_t hi = (uint16_t)(lo + 1);
        // Past the largest finite value the next step would be 2^16 (float16) or 2^128.
        double vhi = hi == inf ? (t == L3D_BFLOAT16 ? ldexp(1, 128) : 65536.0) : half_value(t, hi);
        float mid = (float)((half_value(t, lo) + vhi) / 2);  // exact: 1-2 more bits than the type
        uint16_t even = (lo & 1) ? hi : lo;
        float below = u2f(f2u(mid) - 1), above = u2f(f2u(mid) + 1);
        for (int sgn = 0; sgn < 2; sgn++) {
            uint16_t sbit = sgn ? 0x8000 : 0;
            float s = sgn ? -1.0f : 1.0f;
            x[m] = s * mid, want[m++] = even | sbit;
            x[m] = s * below, want[m++] = lo | sbit;
            x[m] = s * above, want[m++] = hi | sbit;
        }
    }
    cr_assert_eq(l3d_dev_convert(dev, got, t, x, L3D_FLOAT32, m), L3D_OK);
    for (size_t i = 0; i < m; i++)
        cr_assert_eq(got[i], want[i], "%s: %.9g (%08x) -> %04x, want %04x", l3d_dtype_name(t),
                     (double)x[i], f2u(x[i]), got[i], want[i]);
    free(h), free(back), free(w), free(x), free(want), free(got);
}

Test(cpu_dtypes, bfloat16_every_value_and_every_tie) { check_rounding(L3D_BFLOAT16); }
Test(cpu_dtypes, float16_every_value_and_every_tie) { check_rounding(L3D_FLOAT16); }

Test(cpu_dtypes, convert_between_halves_and_bad_types) {
    // float16 -> bfloat16 goes through float32: 1 + 2^-10 lies below bfloat16's midpoint
    // 1 + 2^-8, so 1.0; 65504 = 2^16 - 2^5 rounds up to 2^16 (0x4780).
    uint16_t f16[2] = {0x3c01, 0x7bff}, bf[2], back[2];
    cr_assert_eq(l3d_dev_convert(dev, bf, L3D_BFLOAT16, f16, L3D_FLOAT16, 2), L3D_OK);
    cr_assert_eq(bf[0], 0x3f80);
    cr_assert_eq(bf[1], 0x4780);
    cr_assert_eq(l3d_dev_convert(dev, back, L3D_FLOAT16, bf, L3D_BFLOAT16, 2), L3D_OK);
    cr_assert_eq(back[0], 0x3c00);
    cr_assert_eq(back[1], 0x7c00);  // 65536 overflows float16
    cr_assert_eq(l3d_dev_convert(dev, bf, L3D_BFLOAT16, f16, L3D_INT32, 2), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "int32"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_dev_convert(dev, NULL, L3D_BFLOAT16, f16, L3D_FLOAT16, 2), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dev_convert(dev, bf, L3D_BFLOAT16, bf, L3D_BFLOAT16, 2), L3D_OK);  // in place
}

// ---- gemm with 16-bit operands ------------------------------------------------------------
static uint64_t rng = 88172645463325252ull;
static float frand(void) {  // xorshift64, uniform in [-1, 1)
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
static size_t esize(l3d_dtype t) { return t == L3D_FLOAT32 ? 4 : 2; }
// n random values stored as t (and their exact values as doubles).
static void *operand(l3d_dtype t, size_t n, double *val) {
    void *p = malloc(n * esize(t) + 4);
    for (size_t i = 0; i < n; i++) {
        float x = frand();
        cr_assert_eq(l3d_dev_convert(dev, (char *)p + i * esize(t), t, &x, L3D_FLOAT32, 1), L3D_OK);
        float back;
        cr_assert_eq(l3d_dev_convert(dev, &back, L3D_FLOAT32, (char *)p + i * esize(t), t, 1),
                     L3D_OK);
        val[i] = back;
    }
    return p;
}
static double value_at(l3d_dtype t, const void *p, size_t i) {
    float f;
    cr_assert_eq(l3d_dev_convert(dev, &f, L3D_FLOAT32, (const char *)p + i * esize(t), t, 1), L3D_OK);
    return f;
}

// C = alpha op(A) op(B) + beta C for each dtype mix, transposes, strides, the gemv shape
// (M <= 4) and a batch. Bound per element: float32 accumulation in any order (Higham 3.1:
// (K + 2) u32 times the magnitude sum, doubled as in test_cpu_ops), plus the one rounding of
// a 16-bit C: half an ulp, 2^-8 |c| (bfloat16) or 2^-11 |c| (float16), doubled; the inputs'
// rounding is not error (the reference uses the rounded values).
static void mixed_case(l3d_dtype ta_, l3d_dtype tb_, l3d_dtype tc_, int tra, int trb, int M,
                       int N, int K, float beta, int batch) {
    int lda = (tra ? M : K) + 3, ldb = (trb ? K : N) + 2, ldc = N + 1;
    size_t na = (size_t)(tra ? K : M) * lda, nb = (size_t)(trb ? N : K) * ldb,
           nc = (size_t)M * ldc;
    size_t sa = na, sb = nb, sc = nc;  // batch strides: one operand after another
    double *va = malloc(sizeof(double) * na * batch), *vb = malloc(sizeof(double) * nb * batch),
           *vc = malloc(sizeof(double) * nc * batch);
    void *A = operand(ta_, na * batch, va), *B = operand(tb_, nb * batch, vb),
         *C = operand(tc_, nc * batch, vc);
    l3d_gemm_t g = {.trans_a = tra, .trans_b = trb, .M = M, .N = N, .K = K, .alpha = 0.5f,
                    .beta = beta, .A = A, .lda = lda, .B = B, .ldb = ldb, .C = C, .ldc = ldc,
                    .batch = batch, .stride_a = sa, .stride_b = sb, .stride_c = sc,
                    .a_type = ta_, .b_type = tb_, .c_type = tc_};
    cr_assert_eq(l3d_dev_gemm(dev, &g), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    double uc = tc_ == L3D_BFLOAT16 ? 0x1p-8 : tc_ == L3D_FLOAT16 ? 0x1p-11 : 0x1p-24;
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < M; i++) {
            for (int j = 0; j < N; j++) {
                double s = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    double a = va[b * sa + (tra ? (size_t)k * lda + i : (size_t)i * lda + k)];
                    double bb = vb[b * sb + (trb ? (size_t)j * ldb + k : (size_t)k * ldb + j)];
                    s += a * bb, mag += fabs(a * bb);
                }
                size_t ci = b * sc + (size_t)i * ldc + j;
                double ref = 0.5 * s + (beta != 0 ? beta * vc[ci] : 0);
                mag = 0.5 * mag + fabs(beta * vc[ci]);
                double got = value_at(tc_, C, ci);
                double bound = 2.0 * (K + 2) * 0x1p-24 * mag + 2.0 * uc * fabs(ref);
                cr_assert_leq(fabs(got - ref), bound,
                              "%s x %s -> %s ta %d tb %d %dx%dx%d beta %g batch %d [%d][%d]: "
                              "%.9g vs %.9g", l3d_dtype_name(ta_), l3d_dtype_name(tb_),
                              l3d_dtype_name(tc_), tra, trb, M, N, K, beta, b, i, j, got, ref);
            }
            for (int j = N; j < ldc; j++)  // the padding is not touched
                cr_assert_eq(value_at(tc_, C, b * sc + (size_t)i * ldc + j),
                             vc[b * sc + (size_t)i * ldc + j]);
        }
    free(va), free(vb), free(vc), free(A), free(B), free(C);
}

Test(cpu_dtypes, gemm_with_16bit_operands) {
    const l3d_dtype T[3] = {L3D_FLOAT32, L3D_BFLOAT16, L3D_FLOAT16};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++) {
                mixed_case(T[a], T[b], T[c], 0, 1, 37, 70, 129, 0.0f, 1);   // x W^T, tiles
                mixed_case(T[a], T[b], T[c], 0, 1, 3, 65, 200, 0.5f, 1);    // decode: gemv
                mixed_case(T[a], T[b], T[c], 1, 0, 20, 33, 17, -1.0f, 2);   // dW shape, batch
            }
}

Test(cpu_dtypes, gemm_beta_zero_never_reads_a_16bit_c_and_bad_types_fail) {
    uint16_t C[4] = {0x7fc1, 0x7fc1, 0x7fc1, 0x7fc1};  // NaN in bfloat16
    float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1};
    l3d_gemm_t g = {.M = 2, .N = 2, .K = 2, .alpha = 1, .beta = 0, .A = A, .lda = 2, .B = B,
                    .ldb = 2, .C = C, .ldc = 2, .c_type = L3D_BFLOAT16};
    cr_assert_eq(l3d_dev_gemm(dev, &g), L3D_OK);
    for (int i = 0; i < 4; i++) cr_assert_eq(value_at(L3D_BFLOAT16, C, i), (double)A[i]);
    g.b_type = L3D_INT64;
    cr_assert_eq(l3d_dev_gemm(dev, &g), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "int64"), "%s", l3d_ctx_last_error(ctx));
}

// The matrix-vector kernel reads a bfloat16 B as stored (decode streams half the bytes): its
// results are bit for bit those of the float32 kernel on the widened weights (widening is
// exact and the sums run in the same order), with odd K for the tail, 1-4 rows, beta 0 and not.
Test(cpu_dtypes, gemv_reads_bfloat16_weights_as_stored) {
    const int Ks[] = {1, 17, 384, 1001}, N = 300;
    for (int ki = 0; ki < 4; ki++)
        for (int M = 1; M <= 4; M++) {
            int K = Ks[ki], ldb = K + 3;
            size_t nb = (size_t)N * ldb;
            double *vb = malloc(sizeof(double) * nb), *va = malloc(sizeof(double) * M * K);
            uint16_t *Bh = operand(L3D_BFLOAT16, nb, vb);
            float *Bf = malloc(nb * 4), *A = operand(L3D_FLOAT32, (size_t)M * K, va);
            cr_assert_eq(l3d_dev_convert(dev, Bf, L3D_FLOAT32, Bh, L3D_BFLOAT16, nb), L3D_OK);
            float *C[2];
            for (int r = 0; r < 2; r++) {
                C[r] = malloc(sizeof(float) * M * N);
                for (int i = 0; i < M * N; i++) C[r][i] = (float)i * 0.25f;
                l3d_gemm_t g = {.trans_b = 1, .M = M, .N = N, .K = K, .alpha = 0.75f,
                                .beta = ki % 2 ? 0.5f : 0.0f, .A = A, .lda = K,
                                .B = r ? (const void *)Bh : (const void *)Bf, .ldb = ldb,
                                .C = C[r], .ldc = N, .b_type = r ? L3D_BFLOAT16 : L3D_FLOAT32};
                cr_assert_eq(l3d_dev_gemm(dev, &g), L3D_OK);
            }
            cr_assert(memcmp(C[0], C[1], sizeof(float) * M * N) == 0, "K %d M %d: bits differ", K, M);
            free(vb), free(va), free(Bh), free(Bf), free(A), free(C[0]), free(C[1]);
        }
}
