// The CPU device's dtype entries (device ABI 3): convert between float32, bfloat16 and float16,
// and gemm with 16-bit operands. Expected values come from the formats' definitions: every
// 16-bit value, the exact midpoints between neighbours (ties go to the even one) and the
// floats just beside them; products against a float64 reference on the rounded inputs with a
// bound derived from float32 accumulation plus one rounding of C.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm/reduce.h"
#include "devices/cpu/cpu.h"
#include "devices/device.h"
#include "tests/harness/ref_ops.h"

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

// The device's (vectorised, branch-free) narrowing against core's (core/comm/reduce.c, what the
// collectives round by) on 2^22 random float32 bit patterns: NaNs with payloads, infinities,
// float32 subnormals, the float16 subnormal range and overflow all occur.
// A second narrowing, written branch by branch from the formats (the one core's collectives
// used before they and every device took devices/device_math.h's branchless form): random
// float32 bit patterns must narrow alike through both, scalar and vectorised.
static uint16_t ref_f32_to_bf16(float f) {
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even
    return (uint16_t)(x >> 16);
}
static uint16_t ref_f32_to_f16(float f) {
    uint32_t x = f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        uint32_t m = man | 0x800000u;
        int shift = 14 - e;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // a carry may make it inf: right
    return (uint16_t)(sign | h);
}

Test(cpu_dtypes, narrowing_matches_a_branchy_reference_on_random_bits) {
    const size_t n = (size_t)1 << 22;
    uint32_t *u = malloc(n * 4);
    uint16_t *h = malloc(n * 2);
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t r = (uint32_t)(x >> 32);
        // a quarter near float16's range (exponents 100..150), the rest anywhere
        u[i] = (i & 3) ? r : (r & 0x807fffffu) | ((100u + (r >> 8) % 51u) << 23);
    }
    for (int k = 0; k < 2; k++) {
        l3d_dtype t = k ? L3D_FLOAT16 : L3D_BFLOAT16;
        cr_assert_eq(l3d_dev_convert(dev, h, t, u, L3D_FLOAT32, n), L3D_OK);
        for (size_t i = 0; i < n; i++) {
            float f = u2f(u[i]);
            uint16_t want = k ? ref_f32_to_f16(f) : ref_f32_to_bf16(f);
            uint16_t one = k ? l3d_f32_to_f16(f) : l3d_f32_to_bf16(f);
            cr_assert(h[i] == want && one == want, "%s of %08x: %04x (scalar %04x), the "
                      "reference gives %04x", l3d_dtype_name(t), u[i], h[i], one, want);
        }
    }
    free(u), free(h);
}

// C = alpha op(A) op(B) + beta C for each dtype mix, transposes, strides, the gemv shape
// (M <= 16) and a batch. Bound per element: float32 accumulation in any order (Higham 3.1:
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
                mixed_case(T[a], T[b], T[c], 0, 1, 16, 40, 99, 0.0f, 1);    // 16 streams: gemv
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
// exact and the sums run in the same order), with odd K for the tail, 1-4 and 16 rows, beta 0
// and not.
Test(cpu_dtypes, gemv_reads_bfloat16_weights_as_stored) {
    const int Ks[] = {1, 17, 384, 1001}, N = 300;
    for (int ki = 0; ki < 4; ki++)
        for (int M = 1; M <= 16; M = M < 4 ? M + 1 : M + 12) {
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

// The matrix-vector kernel's bits are its documented order, whichever form the CPU runs (four
// rows of 16-lane vectors with AVX-512, one row in two 8-lane halves otherwise, and every
// compiler clone): per output, 16 partials p[k] += a_i b_i over i = k (mod 16) in order, folded
// p[k] += p[k + w] for w = 8, 4, 2, 1, then the tail's products in order, then alpha and beta.
// A scalar loop written here is the reference, so a machine with the other form would fail
// the same assertion if the two forms ever disagreed.
static float dot_order(const float *a, const float *b, int K) {
    float p[16] = {0};
    int i = 0;
    for (; i + 16 <= K; i += 16)
        for (int k = 0; k < 16; k++) p[k] += a[i + k] * b[i + k];
    for (int w = 8; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) p[k] += p[k + w];
    float s = p[0];
    for (; i < K; i++) s += a[i] * b[i];
    return s;
}
Test(cpu_dtypes, gemv_bits_follow_the_documented_order) {
    const int Ks[] = {1, 17, 384, 1001}, Ms[] = {1, 3, 7, 16}, N = 37;
    for (int ki = 0; ki < 4; ki++)
        for (int mi = 0; mi < 4; mi++)
            for (int bt = 0; bt < 2; bt++) {
                int K = Ks[ki], M = Ms[mi], ldb = K + 5;
                l3d_dtype t = bt ? L3D_BFLOAT16 : L3D_FLOAT32;
                size_t nb = (size_t)N * ldb;
                double *vb = malloc(sizeof(double) * nb), *va = malloc(sizeof(double) * M * K);
                void *B = operand(t, nb, vb);
                float *A = operand(L3D_FLOAT32, (size_t)M * K, va), *C = malloc(4 * M * N);
                float *Bf = malloc(nb * 4), beta = ki % 2 ? 0.5f : 0.0f;
                cr_assert_eq(l3d_dev_convert(dev, Bf, L3D_FLOAT32, B, t, nb), L3D_OK);
                for (int i = 0; i < M * N; i++) C[i] = (float)i * 0.25f;
                l3d_gemm_t g = {.trans_b = 1, .M = M, .N = N, .K = K, .alpha = 0.75f,
                                .beta = beta, .A = A, .lda = K, .B = B, .ldb = ldb, .C = C,
                                .ldc = N, .b_type = t};
                cr_assert_eq(l3d_dev_gemm(dev, &g), L3D_OK);
                for (int m = 0; m < M; m++)
                    for (int j = 0; j < N; j++) {
                        float d = dot_order(A + (size_t)m * K, Bf + (size_t)j * ldb, K);
                        float c0 = (float)(m * N + j) * 0.25f;
                        float want = beta == 0.0f ? 0.75f * d : 0.75f * d + beta * c0;
                        cr_assert(memcmp(&want, &C[m * N + j], sizeof(float)) == 0,
                                  "K %d M %d %s: C[%d][%d] = %.9g, the order gives %.9g", K, M,
                                  l3d_dtype_name(t), m, j, C[m * N + j], want);
                    }
                free(vb), free(va), free(B), free(Bf), free(A), free(C);
            }
}

// Float32 activations against 16-bit weights past the matrix-vector shape (a prompt on a
// bfloat16 checkpoint): each task widens its columns of B, so no whole weight is held in
// float32, and the bits are those of the float32 product on the widened weights (the same
// tiles, the same sgemm on the same values).
Test(cpu_dtypes, float32_rows_against_16bit_weights_match_the_widened_product) {
    const int Ms[] = {37, 300}, N = 530, K = 1001;
    for (int t = 0; t < 4; t++) {
        int trb = t & 1, M = Ms[t >> 1];
        l3d_dtype bt = t == 2 ? L3D_FLOAT16 : L3D_BFLOAT16;
        size_t nb = (size_t)N * K, na = (size_t)M * K, nc = (size_t)M * N;
        double *vb = malloc(sizeof(double) * nb), *va = malloc(sizeof(double) * na);
        void *Bh = operand(bt, nb, vb);
        float *Bf = malloc(nb * 4), *A = operand(L3D_FLOAT32, na, va), *C[2];
        cr_assert_eq(l3d_dev_convert(dev, Bf, L3D_FLOAT32, Bh, bt, nb), L3D_OK);
        for (int r = 0; r < 2; r++) {
            C[r] = malloc(sizeof(float) * nc);
            for (size_t i = 0; i < nc; i++) C[r][i] = (float)(i % 13) * 0.25f;
            l3d_gemm_t g = {.trans_b = trb, .M = M, .N = N, .K = K, .alpha = 0.75f,
                            .beta = t == 3 ? 0.5f : 0.0f, .A = A, .lda = K,
                            .B = r ? (const void *)Bh : (const void *)Bf, .ldb = trb ? K : N,
                            .C = C[r], .ldc = N, .b_type = r ? bt : L3D_FLOAT32};
            cr_assert_eq(l3d_dev_gemm(dev, &g), L3D_OK, "%s", l3d_ctx_last_error(ctx));
        }
        cr_assert(memcmp(C[0], C[1], sizeof(float) * nc) == 0, "M %d tb %d %s: bits differ", M,
                  trb, l3d_dtype_name(bt));
        free(vb), free(va), free(Bh), free(Bf), free(A), free(C[0]), free(C[1]);
    }
}

// gemm's round_a (device ABI 11): float32 rows against bfloat16 weights in the CPU's 16-bit
// arithmetic. Where the device takes it (AVX512-BF16 at the matrix-vector shape, the AMX level
// for larger M) the result is the float64 product of A rounded to bfloat16 with B, within the
// float32 accumulation bound of mixed_case; elsewhere A is read exactly, within the same bound
// of the exact product. Each case also gives the same bits on one thread as on three.
static void round_a_case(l3d_device_t *one, int M, int N, int K, float beta) {
    l3d_cpu_t *cpu = l3d_cpu_priv(dev);
    int gemv = M <= L3D_CPU_GEMV_MAX_M;
    int rounds = gemv ? cpu->has_dp : cpu->bf16 != L3D_CPU_BF16_OFF;
    size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
    double *va = malloc(sizeof(double) * na), *vb = malloc(sizeof(double) * nb);
    float *A = operand(L3D_FLOAT32, na, va);
    uint16_t *B = operand(L3D_BFLOAT16, nb, vb);
    float *C[2];
    for (int r = 0; r < 2; r++) {
        C[r] = malloc(sizeof(float) * nc);
        for (size_t i = 0; i < nc; i++) C[r][i] = (float)(i % 7) * 0.5f;
        l3d_gemm_t g = {.trans_b = 1, .M = M, .N = N, .K = K, .alpha = 0.75f, .beta = beta,
                        .A = A, .lda = K, .B = B, .ldb = K, .C = C[r], .ldc = N,
                        .b_type = L3D_BFLOAT16, .round_a = 1};
        cr_assert_eq(l3d_dev_gemm(r ? one : dev, &g), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    }
    cr_assert(memcmp(C[0], C[1], sizeof(float) * nc) == 0, "%dx%dx%d: 1 and 3 threads differ",
              M, N, K);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                float a = A[(size_t)i * K + k];
                double av = rounds ? (double)l3d_bf16_to_f32(l3d_f32_to_bf16(a)) : (double)a;
                double p = av * vb[(size_t)j * K + k];
                sum += p, mag += fabs(p);
            }
            double c0 = (double)((i * N + j) % 7) * 0.5, ref = 0.75 * sum + beta * c0;
            double bound = 2.0 * (K + 2) * 0x1p-24 * (0.75 * mag + fabs(beta * c0));
            double got = C[0][(size_t)i * N + j];
            cr_assert_leq(fabs(got - ref), bound, "%dx%dx%d [%d][%d] (A %s): %.9g vs %.9g", M, N,
                          K, i, j, rounds ? "rounded" : "exact", got, ref);
        }
    free(va), free(vb), free(A), free(B), free(C[0]), free(C[1]);
}

Test(cpu_dtypes, round_a_multiplies_rounded_rows_in_16bit_arithmetic) {
    l3d_device_t *one = NULL;
    l3d_device_params_t p1 = {.num_threads = 1};
    cr_assert_eq(l3d_device_create(ctx, "cpu", &p1, &one), L3D_OK);
    round_a_case(one, 1, 300, 384, 0.0f);   // decode
    round_a_case(one, 3, 65, 200, 0.5f);    // a tail of K past the last 32
    round_a_case(one, 16, 301, 99, 0.0f);   // 16 streams; a tail of rows past the last 4
    round_a_case(one, 37, 70, 129, 0.5f);   // a prompt: tiles
    round_a_case(one, 300, 530, 1001, 0.0f);
    l3d_device_destroy(one);
}

// bfloat16 x bfloat16 products big enough for several tiles of the pool (on AMX or AVX512-BF16
// where the device uses them, L3D_CPU_BF16; tests/matrix.sh runs each level the CPU has):
// every transpose pair, a 16-bit and a float32 C, within the float32 bound of mixed_case, and
// the bits on one thread equal those on three (K is never split; the tiles are the shape's).
Test(cpu_dtypes, bfloat16_products_over_many_tiles_ignore_the_thread_count) {
    l3d_device_t *one = NULL;
    l3d_device_params_t p1 = {.num_threads = 1};
    cr_assert_eq(l3d_device_create(ctx, "cpu", &p1, &one), L3D_OK);
    for (int t = 0; t < 4; t++) {
        int tra = t & 1, trb = t >> 1, M = 300, N = 530, K = 1001;
        l3d_dtype tc = t == 3 ? L3D_BFLOAT16 : L3D_FLOAT32;
        mixed_case(L3D_BFLOAT16, L3D_BFLOAT16, tc, tra, trb, M, N, K, t == 1 ? 0.5f : 0.0f, 1);
        size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
        double *va = malloc(sizeof(double) * na), *vb = malloc(sizeof(double) * nb);
        void *A = operand(L3D_BFLOAT16, na, va), *B = operand(L3D_BFLOAT16, nb, vb);
        void *C[2];
        for (int r = 0; r < 2; r++) {
            C[r] = calloc(nc, 4);
            l3d_gemm_t g = {.trans_a = tra, .trans_b = trb, .M = M, .N = N, .K = K,
                            .alpha = 1.0f, .A = A, .lda = tra ? M : K, .B = B,
                            .ldb = trb ? K : N, .C = C[r], .ldc = N, .a_type = L3D_BFLOAT16,
                            .b_type = L3D_BFLOAT16, .c_type = tc};
            cr_assert_eq(l3d_dev_gemm(r ? one : dev, &g), L3D_OK, "%s", l3d_ctx_last_error(ctx));
        }
        cr_assert(memcmp(C[0], C[1], nc * esize(tc)) == 0, "ta %d tb %d: 1 and 3 threads differ",
                  tra, trb);
        free(va), free(vb), free(A), free(B), free(C[0]), free(C[1]);
    }
    l3d_device_destroy(one);
}

// ---- every op x dtype (device ABI 5) ----------------------------------------------------------
// Each op runs on 16-bit operands and is checked twice:
// 1. its contract, bit for bit: the outputs are the float32 op's outputs on the widened inputs,
//    rounded once (widening and rounding are the conversions proven above);
// 2. against float64 math on the exact input values (the references of test_cpu_ops), within
//    the float32 kernel's bound from test_cpu_ops (rtol32, relative to the output's largest
//    magnitude) plus the one rounding of a 16-bit output: half an ulp, u|ref| with u = 2^-8
//    (bfloat16) or 2^-11 (float16), and for float16 half its smallest subnormal, 2^-25. Each
//    term is taken with a factor 2 of slack for the float32 result sitting on either side.
static double unit(l3d_dtype t) {
    return t == L3D_BFLOAT16 ? 0x1p-8 : t == L3D_FLOAT16 ? 0x1p-11 : 0.0;
}

// A tensor stored as t (`h`, what the op sees) with its exact values widened to float32 (`f`).
typedef struct {
    l3d_dtype t;
    size_t n;
    void *h;
    float *f;
} tens_t;

static tens_t tens(l3d_dtype t, size_t n, float amp) {
    tens_t x = {t, n, malloc(n * esize(t) + 4), malloc(n * 4 + 4)};
    for (size_t i = 0; i < n; i++) x.f[i] = amp * frand();
    cr_assert_eq(l3d_dev_convert(dev, x.h, t, x.f, L3D_FLOAT32, n), L3D_OK);
    cr_assert_eq(l3d_dev_convert(dev, x.f, L3D_FLOAT32, x.h, t, n), L3D_OK);
    return x;
}
static float *fcopy(const tens_t *x) {  // the float32 run's own copy of the widened values
    float *f = malloc(x->n * 4 + 4);
    memcpy(f, x->f, x->n * 4);
    return f;
}
static void tens_free(tens_t *x) { free(x->h), free(x->f); }

// 1. got (stored as t) == f32 rounded to t, bit for bit.
static void same_as_rounded(const char *what, l3d_dtype t, const void *got, const float *f32,
                            size_t n) {
    char *want = malloc(n * esize(t) + 4);
    cr_assert_eq(l3d_dev_convert(dev, want, t, f32, L3D_FLOAT32, n), L3D_OK);
    for (size_t i = 0; i < n; i++)
        cr_assert(!memcmp(want + i * esize(t), (const char *)got + i * esize(t), esize(t)),
                  "%s (%s) [%zu]: %.9g, the float32 op rounded once gives %.9g", what,
                  l3d_dtype_name(t), i, value_at(t, got, i), (double)f32[i]);
    free(want);
}

// 2. |got - ref| <= 2 u |ref| + 2 rtol32 max|ref| + 2^-25 (float16).
static void close64(const char *what, l3d_dtype t, const void *got, const double *ref, size_t n,
                    double rtol32) {
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    double tiny = t == L3D_FLOAT16 ? 0x1p-25 : 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = value_at(t, got, i);
        double bound = 2 * unit(t) * fabs(ref[i]) + 2 * rtol32 * scale + tiny;
        cr_assert(fabs(g - ref[i]) <= bound, "%s (%s) [%zu]: %.9g vs float64 %.9g (bound %.3g)",
                  what, l3d_dtype_name(t), i, g, ref[i], bound);
    }
}

// Operand dtypes (activations, parameter, parameter gradient) each op is run with: all 16-bit
// of one kind, 16-bit activations with float32 or mixed parameters, float32 activations with
// 16-bit parameters.
typedef struct {
    l3d_dtype at, wt, gt;
} mix_t;
static const mix_t mixes[] = {{L3D_BFLOAT16, L3D_BFLOAT16, L3D_BFLOAT16},
                              {L3D_FLOAT16, L3D_FLOAT16, L3D_FLOAT16},
                              {L3D_BFLOAT16, L3D_FLOAT32, L3D_FLOAT32},
                              {L3D_FLOAT16, L3D_BFLOAT16, L3D_FLOAT32},
                              {L3D_FLOAT32, L3D_BFLOAT16, L3D_FLOAT16}};
#define NMIX (sizeof(mixes) / sizeof(mixes[0]))
static const l3d_dtype F32 = L3D_FLOAT32;

// Embedding: forward copies (or rounds) rows, exactly (rtol32 0); backward sums each token's
// rows, at most 5 occurrences here: 5 float32 additions, 5 u32 of terms up to 2 x the scale
// (rtol32 1e-6 > 10 * 2^-24). The vocabulary-parallel forms over two shards likewise.
Test(cpu_dtypes, embedding_every_dtype) {
    const int V = 50, C = 37, N = 64;
    int32_t tok[64];
    for (int n = 0; n < N; n++) tok[n] = (int32_t)((n * 7) % 13 + (n % 3) * 17);  // repeats
    for (size_t m = 0; m < NMIX; m++) {
        mix_t x = mixes[m];
        tens_t table = tens(x.wt, (size_t)V * C, 1.0f), dout = tens(x.at, (size_t)N * C, 1.0f);
        tens_t out = tens(x.at, (size_t)N * C, 1.0f), dt = tens(x.gt, (size_t)V * C, 1.0f);
        float *out32 = fcopy(&out), *dt32 = fcopy(&dt);
        double *ref = calloc((size_t)V * C + (size_t)N * C, sizeof(double));
        cr_assert_eq(l3d_dev_embedding_fwd(dev, out.h, tok, table.h, N, C, V, x.at, x.wt), L3D_OK);
        cr_assert_eq(l3d_dev_embedding_fwd(dev, out32, tok, table.f, N, C, V, F32, F32), L3D_OK);
        same_as_rounded("embedding_fwd", x.at, out.h, out32, (size_t)N * C);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) ref[n * C + c] = table.f[tok[n] * C + c];
        close64("embedding_fwd", x.at, out.h, ref, (size_t)N * C, 0.0);
        cr_assert_eq(l3d_dev_embedding_bwd(dev, dt.h, dout.h, tok, N, C, x.at, x.gt), L3D_OK);
        cr_assert_eq(l3d_dev_embedding_bwd(dev, dt32, dout.f, tok, N, C, F32, F32), L3D_OK);
        same_as_rounded("embedding_bwd", x.gt, dt.h, dt32, (size_t)V * C);
        for (size_t i = 0; i < (size_t)V * C; i++) ref[i] = dt.f[i];
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) ref[tok[n] * C + c] += dout.f[n * C + c];
        close64("embedding_bwd", x.gt, dt.h, ref, (size_t)V * C, 1e-6);
        // Two vocabulary shards [0, 20) and [20, 50), each its own table and gradient.
        const int b[3] = {0, 20, 50};
        for (int s = 0; s < 2; s++) {
            int v0 = b[s], Vl = b[s + 1] - b[s];
            size_t es = esize(x.wt);
            tens_t dts = tens(x.gt, (size_t)Vl * C, 1.0f);
            float *dts32 = fcopy(&dts);
            cr_assert_eq(l3d_dev_embedding_fwd_vp(dev, out.h, tok, (char *)table.h + v0 * C * es,
                                                  N, C, v0, Vl, V, x.at, x.wt), L3D_OK);
            cr_assert_eq(l3d_dev_embedding_fwd_vp(dev, out32, tok, table.f + v0 * C, N, C, v0, Vl,
                                                  V, F32, F32), L3D_OK);
            same_as_rounded("embedding_fwd_vp", x.at, out.h, out32, (size_t)N * C);
            cr_assert_eq(l3d_dev_embedding_bwd_vp(dev, dts.h, dout.h, tok, N, C, v0, Vl, x.at,
                                                  x.gt), L3D_OK);
            cr_assert_eq(l3d_dev_embedding_bwd_vp(dev, dts32, dout.f, tok, N, C, v0, Vl, F32, F32),
                         L3D_OK);
            same_as_rounded("embedding_bwd_vp", x.gt, dts.h, dts32, (size_t)Vl * C);
            tens_free(&dts), free(dts32);
        }
        tens_free(&table), tens_free(&dout), tens_free(&out), tens_free(&dt);
        free(out32), free(dt32), free(ref);
    }
}

// RMSNorm forward and backward ("+=" into 16-bit dx and dw), rtol32 1e-5 as test_cpu_ops;
// rstd stays float32 and equals the float32 run's.
Test(cpu_dtypes, rmsnorm_every_dtype) {
    const int N = 37, C = 100;
    const float eps = 1e-5f;
    const size_t nx = (size_t)N * C;
    for (size_t m = 0; m < NMIX; m++) {
        mix_t t = mixes[m];
        tens_t x = tens(t.at, nx, 2.0f), w = tens(t.wt, C, 1.0f), g = tens(t.at, nx, 1.0f);
        tens_t out = tens(t.at, nx, 1.0f), dx = tens(t.at, nx, 1.0f), dw = tens(t.gt, C, 1.0f);
        float *out32 = fcopy(&out), *dx32 = fcopy(&dx), *dw32 = fcopy(&dw);
        float rstd[37], rstd32[37];
        double *rout = calloc(nx, 8), *rdx = calloc(nx, 8), *rdw = calloc(C, 8);
        cr_assert_eq(l3d_dev_rmsnorm_fwd(dev, out.h, rstd, x.h, w.h, N, C, eps, t.at, t.wt),
                     L3D_OK);
        cr_assert_eq(l3d_dev_rmsnorm_fwd(dev, out32, rstd32, x.f, w.f, N, C, eps, F32, F32),
                     L3D_OK);
        same_as_rounded("rmsnorm out", t.at, out.h, out32, nx);
        cr_assert(!memcmp(rstd, rstd32, sizeof(rstd)), "rstd differs from the float32 run");
        cr_assert_eq(l3d_dev_rmsnorm_bwd(dev, dx.h, dw.h, g.h, x.h, w.h, rstd, N, C, t.at, t.wt,
                                         t.gt), L3D_OK);
        cr_assert_eq(l3d_dev_rmsnorm_bwd(dev, dx32, dw32, g.f, x.f, w.f, rstd32, N, C, F32, F32,
                                         F32), L3D_OK);
        same_as_rounded("rmsnorm dx", t.at, dx.h, dx32, nx);
        same_as_rounded("rmsnorm dw", t.gt, dw.h, dw32, C);
        for (int c = 0; c < C; c++) rdw[c] = dw.f[c];
        for (int n = 0; n < N; n++) {
            const float *xr = x.f + (size_t)n * C, *gr = g.f + (size_t)n * C;
            double ss = 0.0, dot = 0.0;
            for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
            double r = 1.0 / sqrt(ss / C + eps);
            for (int c = 0; c < C; c++) {
                rout[(size_t)n * C + c] = xr[c] * r * w.f[c];
                dot += (double)gr[c] * w.f[c] * xr[c];
                rdw[c] += (double)gr[c] * xr[c] * r;
            }
            for (int c = 0; c < C; c++)
                rdx[(size_t)n * C + c] =
                    dx.f[(size_t)n * C + c] + r * gr[c] * w.f[c] - r * r * r / C * dot * xr[c];
        }
        close64("rmsnorm out", t.at, out.h, rout, nx, 1e-5);
        close64("rmsnorm dx", t.at, dx.h, rdx, nx, 1e-5);
        close64("rmsnorm dw", t.gt, dw.h, rdw, C, 1e-5);
        tens_free(&x), tens_free(&w), tens_free(&g), tens_free(&out), tens_free(&dx);
        tens_free(&dw), free(out32), free(dx32), free(dw32), free(rout), free(rdx), free(rdw);
    }
}

// RoPE in place, forward then inverse: two products and a sum per element in float32
// (rtol32 1e-6 > 3 * 2^-24 with |cos|, |sin| <= 1).
Test(cpu_dtypes, rope_every_dtype) {
    const int B = 2, T = 5, NH = 3, D = 8, pos0 = 3, Tmax = 16, half = D / 2;
    const size_t n = (size_t)B * T * NH * D;
    float cs[16 * 4], sn[16 * 4];
    for (int p = 0; p < Tmax; p++)
        for (int i = 0; i < half; i++) {
            double a = p * pow(500000.0, -2.0 * i / D);
            cs[p * half + i] = (float)cos(a), sn[p * half + i] = (float)sin(a);
        }
    for (size_t m = 0; m < NMIX; m++)
        for (int inv = 0; inv < 2; inv++) {
            l3d_dtype at = mixes[m].at;
            tens_t x = tens(at, n, 2.0f);
            float *x32 = fcopy(&x);
            double *ref = calloc(n, 8);
            for (int bt = 0; bt < B * T; bt++)
                for (int h = 0; h < NH; h++)
                    for (int i = 0; i < half; i++) {
                        size_t o = ((size_t)bt * NH + h) * D;
                        int p = pos0 + bt % T;
                        double c = cs[p * half + i], s = (inv ? -1.0 : 1.0) * sn[p * half + i];
                        ref[o + i] = x.f[o + i] * c - (double)x.f[o + i + half] * s;
                        ref[o + i + half] = x.f[o + i + half] * c + (double)x.f[o + i] * s;
                    }
            cr_assert_eq(l3d_dev_rope(dev, x.h, cs, sn, B, T, NH, D, pos0, inv, at), L3D_OK);
            cr_assert_eq(l3d_dev_rope(dev, x32, cs, sn, B, T, NH, D, pos0, inv, F32), L3D_OK);
            same_as_rounded("rope", at, x.h, x32, n);
            close64("rope", at, x.h, ref, n, 1e-6);
            tens_free(&x), free(x32), free(ref);
        }
}

// Attention forward and backward, GQA with a strided KV cache (decode: Tq < Tk) and a square
// causal case; rtol32 2e-5 as test_cpu_ops for these sizes. lse stays float32.
static void attention_dtype_case(l3d_dtype at, shape_t s) {
    size_t nq = (size_t)s.B * s.Tq * s.H * s.D, nkv = (size_t)s.B * s.Tmax * s.KVH * s.D;
    size_t ndk = (size_t)s.B * s.Tk * s.KVH * s.D, nl = (size_t)s.B * s.H * s.Tq;
    tens_t q = tens(at, nq, 1.5f), k = tens(at, nkv, 1.5f), v = tens(at, nkv, 1.0f);
    tens_t go = tens(at, nq, 1.0f), out = tens(at, nq, 1.0f);
    tens_t dq = tens(at, nq, 1.0f), dk = tens(at, ndk, 1.0f), dv = tens(at, ndk, 1.0f);
    float *out32 = fcopy(&out), *dq32 = fcopy(&dq), *dk32 = fcopy(&dk), *dv32 = fcopy(&dv);
    float *lse = malloc(nl * 4), *lse32 = malloc(nl * 4);
    double *rout = calloc(nq, 8), *rlse = calloc(nl, 8), *rdq = calloc(nq, 8);
    double *rdk = calloc(ndk, 8), *rdv = calloc(ndk, 8);
    l3d_attn_dims_t d = {s.B, s.Tq, s.Tk, s.H, s.KVH, s.D,
                         s.Tmax == s.Tk ? 0 : (size_t)s.Tmax * s.KVH * s.D};
    cr_assert_eq(l3d_dev_attention_fwd(dev, out.h, lse, q.h, k.h, v.h, &d, at), L3D_OK);
    cr_assert_eq(l3d_dev_attention_fwd(dev, out32, lse32, q.f, k.f, v.f, &d, F32), L3D_OK);
    same_as_rounded("attention out", at, out.h, out32, nq);
    cr_assert(!memcmp(lse, lse32, nl * 4), "lse differs from the float32 run");
    // The backward reads the 16-bit out, as a 16-bit model keeps it.
    float *outw = malloc(nq * 4);
    cr_assert_eq(l3d_dev_convert(dev, outw, F32, out.h, at, nq), L3D_OK);
    cr_assert_eq(l3d_dev_attention_bwd(dev, dq.h, dk.h, dv.h, go.h, q.h, k.h, v.h, out.h, lse, &d,
                                       at), L3D_OK);
    cr_assert_eq(l3d_dev_attention_bwd(dev, dq32, dk32, dv32, go.f, q.f, k.f, v.f, outw, lse32,
                                       &d, F32), L3D_OK);
    same_as_rounded("attention dq", at, dq.h, dq32, nq);
    same_as_rounded("attention dk", at, dk.h, dk32, ndk);
    same_as_rounded("attention dv", at, dv.h, dv32, ndk);
    l3d_ref_attention(&s, q.f, k.f, v.f, go.f, rout, rlse, rdq, rdk, rdv);
    close64("attention out", at, out.h, rout, nq, 2e-5);
    // The backward's D_i = sum(dout * out) uses the rounded out: that costs u |out| |dout| per
    // term, D of them; rtol32 takes 2e-5 plus D u (relative to the gradients' scale, which is
    // of the order of dout's here).
    double rt = 2e-5 + s.D * unit(at);
    close64("attention dq", at, dq.h, rdq, nq, rt);
    close64("attention dk", at, dk.h, rdk, ndk, rt);
    close64("attention dv", at, dv.h, rdv, ndk, 2e-5);
    tens_free(&q), tens_free(&k), tens_free(&v), tens_free(&go), tens_free(&out);
    tens_free(&dq), tens_free(&dk), tens_free(&dv), free(out32), free(dq32), free(dk32);
    free(dv32), free(lse), free(lse32), free(outw), free(rout), free(rlse), free(rdq), free(rdk);
    free(rdv);
}

Test(cpu_dtypes, attention_every_dtype) {
    for (size_t m = 0; m < NMIX; m++) {
        attention_dtype_case(mixes[m].at, (shape_t){2, 37, 37, 4, 2, 16, 37});
        attention_dtype_case(mixes[m].at, (shape_t){2, 3, 70, 4, 2, 16, 81});
    }
}

static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

// SwiGLU (out aliasing gate; the backward in place), add (out aliasing a) and scale over
// several chunks and a tail; rtol32 1e-6 (swiglu) and 1e-7 (add, scale) as test_cpu_ops.
Test(cpu_dtypes, elementwise_every_dtype) {
    const size_t n = 40000;
    for (size_t m = 0; m < NMIX; m++) {
        l3d_dtype at = mixes[m].at;
        tens_t g = tens(at, n, 6.0f), u = tens(at, n, 2.0f), d = tens(at, n, 1.0f);
        float *g32 = fcopy(&g), *u32 = fcopy(&u);
        double *r = calloc(n, 8), *rg = calloc(n, 8), *ru = calloc(n, 8);
        char *gh = malloc(n * esize(at)), *uh = malloc(n * esize(at));
        for (size_t i = 0; i < n; i++) {
            double s = sig(g.f[i]);
            r[i] = g.f[i] * s * u.f[i];
            rg[i] = d.f[i] * u.f[i] * s * (1.0 + g.f[i] * (1.0 - s));
            ru[i] = d.f[i] * g.f[i] * s;
        }
        memcpy(gh, g.h, n * esize(at));
        cr_assert_eq(l3d_dev_swiglu_fwd(dev, gh, gh, u.h, n, at), L3D_OK);  // out aliases gate
        cr_assert_eq(l3d_dev_swiglu_fwd(dev, g32, g32, u32, n, F32), L3D_OK);
        same_as_rounded("swiglu", at, gh, g32, n);
        close64("swiglu", at, gh, r, n, 1e-6);
        memcpy(gh, g.h, n * esize(at)), memcpy(uh, u.h, n * esize(at));
        memcpy(g32, g.f, n * 4);
        cr_assert_eq(l3d_dev_swiglu_bwd(dev, gh, uh, d.h, gh, uh, n, at), L3D_OK);  // in place
        cr_assert_eq(l3d_dev_swiglu_bwd(dev, g32, u32, d.f, g32, u32, n, F32), L3D_OK);
        same_as_rounded("swiglu dgate", at, gh, g32, n);
        same_as_rounded("swiglu dup", at, uh, u32, n);
        close64("swiglu dgate", at, gh, rg, n, 1e-6);
        close64("swiglu dup", at, uh, ru, n, 1e-6);

        memcpy(gh, g.h, n * esize(at)), memcpy(g32, g.f, n * 4);
        for (size_t i = 0; i < n; i++) r[i] = (double)g.f[i] + u.f[i];
        cr_assert_eq(l3d_dev_add(dev, gh, gh, u.h, n, at), L3D_OK);  // out aliases a
        cr_assert_eq(l3d_dev_add(dev, g32, g32, u.f, n, F32), L3D_OK);
        same_as_rounded("add", at, gh, g32, n);
        close64("add", at, gh, r, n, 1e-7);
        memcpy(gh, g.h, n * esize(at)), memcpy(g32, g.f, n * 4);
        for (size_t i = 0; i < n; i++) r[i] = (double)g.f[i] * 0.37f;
        cr_assert_eq(l3d_dev_scale(dev, gh, 0.37f, n, at), L3D_OK);
        cr_assert_eq(l3d_dev_scale(dev, g32, 0.37f, n, F32), L3D_OK);
        same_as_rounded("scale", at, gh, g32, n);
        close64("scale", at, gh, r, n, 1e-7);
        tens_free(&g), tens_free(&u), tens_free(&d), free(g32), free(u32), free(r), free(rg);
        free(ru), free(gh), free(uh);
    }
}

// The sum of squares of a 16-bit gradient (clipping): the float32 run's double on the widened
// values exactly, and the float64 sum within double rounding (1e-12 as test_cpu_ops). AdamW
// with a 16-bit gradient: widening is exact, so master weights and moments are bit for bit
// the float32 step's on the widened gradient (test_cpu_ops checks that step against torch's
// arithmetic by hand).
Test(cpu_dtypes, sumsq_and_adamw_every_dtype) {
    const size_t n = 100003;
    for (size_t m = 0; m < NMIX; m++) {
        l3d_dtype gt = mixes[m].gt;
        tens_t g = tens(gt, n, 3.0f);
        double got = -1, got32 = -2, ref = 0;
        for (size_t i = 0; i < n; i++) ref += (double)g.f[i] * g.f[i];
        cr_assert_eq(l3d_dev_sumsq(dev, g.h, n, &got, gt), L3D_OK);
        cr_assert_eq(l3d_dev_sumsq(dev, g.f, n, &got32, F32), L3D_OK);
        cr_assert_eq(got, got32, "sumsq %s: %.17g vs float32 run %.17g", l3d_dtype_name(gt), got,
                     got32);
        cr_assert(fabs(got - ref) <= 1e-12 * ref, "sumsq %.17g vs %.17g", got, ref);
        float *p[2], *mo[2], *v[2];
        for (int r = 0; r < 2; r++) {
            p[r] = malloc(n * 4), mo[r] = calloc(n, 4), v[r] = calloc(n, 4);
            for (size_t i = 0; i < n; i++) p[r][i] = (float)i / (float)n - 0.5f;
            for (int step = 1; step <= 2; step++)
                cr_assert_eq(l3d_dev_adamw(dev, p[r], r ? g.h : (void *)g.f, mo[r], v[r], n, 1e-2f,
                                           0.9f, 0.95f, 1e-8f, 0.1f, 1.0f - powf(0.9f, step),
                                           1.0f - powf(0.95f, step), 0.5f, NULL, 0.0f,
                                           r ? gt : F32),
                             L3D_OK);
        }
        cr_assert(!memcmp(p[0], p[1], n * 4) && !memcmp(mo[0], mo[1], n * 4) &&
                  !memcmp(v[0], v[1], n * 4), "adamw with a %s gradient", l3d_dtype_name(gt));
        for (int r = 0; r < 2; r++) free(p[r]), free(mo[r]), free(v[r]);
        tens_free(&g);
    }
}

// AdamW over many tensors in one call (the entry the trainer makes once a step): each tensor
// with its own weight decay and length (0, one element, several threads' chunks), bit for bit
// the one-tensor calls, and each param16 equal to its updated master rounded by convert (one
// rounding). A non-finite norm leaves everything, param16 too, untouched.
Test(cpu_dtypes, adamw_many_tensors_refreshes_16bit_copy) {
    enum { NT = 4 };
    const size_t len[NT] = {0, 1, 70001, 333};
    const float wd[NT] = {0.1f, 0.0f, 0.1f, 0.3f};
    for (int wi = 0; wi < 2; wi++) {
        l3d_dtype wt = wi ? L3D_FLOAT16 : L3D_BFLOAT16;
        float *p[2][NT], *mo[2][NT], *v[2][NT], *g[NT];
        void *h[NT], *conv[NT];
        l3d_adamw_tensor_t ts[NT];
        for (int k = 0; k < NT; k++) {
            size_t n = len[k] ? len[k] : 1;
            g[k] = malloc(n * 4), h[k] = calloc(n, 2), conv[k] = calloc(n, 2);
            for (int r = 0; r < 2; r++) {
                p[r][k] = malloc(n * 4), mo[r][k] = calloc(n, 4), v[r][k] = calloc(n, 4);
                for (size_t i = 0; i < n; i++) p[r][k][i] = frand();
                if (r) memcpy(p[1][k], p[0][k], n * 4);
            }
            for (size_t i = 0; i < n; i++) g[k][i] = frand();
            ts[k] = (l3d_adamw_tensor_t){p[1][k], mo[1][k], v[1][k], g[k], k == 1 ? NULL : h[k],
                                         len[k], wd[k]};
        }
        double sumsq = 7.0, inf = INFINITY;
        for (int step = 1; step <= 2; step++) {
            float bc1 = 1.0f - powf(0.9f, step), bc2 = 1.0f - powf(0.95f, step);
            for (int k = 0; k < NT; k++)
                cr_assert_eq(l3d_dev_adamw(dev, p[0][k], g[k], mo[0][k], v[0][k], len[k], 1e-2f,
                                           0.9f, 0.95f, 1e-8f, wd[k], bc1, bc2, 0.5f, &sumsq,
                                           1.0f, F32), L3D_OK);
            l3d_adamw_step_t st = {1e-2f, 0.9f, 0.95f, 1e-8f, bc1, bc2, 0.5f, 1.0f, &sumsq, F32,
                                   wt};
            cr_assert_eq(l3d_dev_adamw_multi(dev, ts, NT, &st), L3D_OK);
        }
        for (int k = 0; k < NT; k++) {
            size_t n = len[k];
            cr_assert(!memcmp(p[0][k], p[1][k], n * 4) && !memcmp(mo[0][k], mo[1][k], n * 4) &&
                      !memcmp(v[0][k], v[1][k], n * 4), "tensor %d of %zu", k, n);
            cr_assert_eq(l3d_dev_convert(dev, conv[k], wt, p[0][k], F32, n), L3D_OK);
            if (k != 1)
                cr_assert(!memcmp(conv[k], h[k], n * 2), "param16 of tensor %d (%s)", k,
                          l3d_dtype_name(wt));
        }
        // an overflow somewhere: nothing moves
        float *keep = malloc(len[2] * 4);
        memcpy(keep, p[1][2], len[2] * 4);
        memset(h[2], 0x55, len[2] * 2);
        l3d_adamw_step_t st = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, 0.5f, 0.5f, 1.0f, &inf, F32, wt};
        cr_assert_eq(l3d_dev_adamw_multi(dev, ts, NT, &st), L3D_OK);
        cr_assert(!memcmp(keep, p[1][2], len[2] * 4), "a non-finite norm moved a weight");
        for (size_t i = 0; i < len[2]; i++)
            cr_assert_eq(((uint16_t *)h[2])[i], 0x5555, "a non-finite norm wrote param16");
        free(keep);
        for (int k = 0; k < NT; k++) {
            free(g[k]), free(h[k]), free(conv[k]);
            for (int r = 0; r < 2; r++) free(p[r][k]), free(mo[r][k]), free(v[r][k]);
        }
    }
}

// Cross-entropy over 16-bit logits, fused and vocabulary-parallel over two shards (the tp
// group's max and sum done here): more rows than one widened block (4 per thread, 3 threads),
// ignored rows; rtol32 1e-6 as test_cpu_ops. Losses are float32 and equal the float32 run's.
Test(cpu_dtypes, xent_every_dtype) {
    const int N = 23, V = 3001, b[3] = {0, 1200, 3001};
    const float gs = 0.125f;
    int32_t t[23];
    for (int n = 0; n < N; n++) t[n] = n % 5 == 3 ? -1 : (int32_t)((n * 7919u) % (unsigned)V);
    for (size_t m = 0; m < NMIX; m++) {
        l3d_dtype at = mixes[m].at;
        size_t nz = (size_t)N * V, es = esize(at);
        tens_t z = tens(at, nz, 8.0f);
        float *z32 = fcopy(&z), loss[23], loss32[23];
        double *rg = calloc(nz, 8), rl[23] = {0};
        l3d_ref_xent(z.f, t, N, V, gs, rg, rl);
        char *zh = malloc(nz * es);
        memcpy(zh, z.h, nz * es);
        cr_assert_eq(l3d_dev_xent_fwd_bwd(dev, zh, loss, t, N, V, gs, at), L3D_OK);
        cr_assert_eq(l3d_dev_xent_fwd_bwd(dev, z32, loss32, t, N, V, gs, F32), L3D_OK);
        same_as_rounded("xent grad", at, zh, z32, nz);
        cr_assert(!memcmp(loss, loss32, sizeof(loss)), "xent losses differ from float32's");
        close64("xent grad", at, zh, rg, nz, 1e-6);
        for (int n = 0; n < N; n++)
            cr_assert(fabs(loss[n] - rl[n]) <= 1e-6 * fmax(1.0, fabs(rl[n])), "loss %d", n);
        // Vocabulary-parallel: each shard's columns in a (N, Vl) matrix of its own.
        char *sh[2];
        float mx[2][23], st[2][46], gmax[23], gst[46], vl[23];
        for (int s = 0; s < 2; s++) {
            int Vl = b[s + 1] - b[s];
            sh[s] = malloc((size_t)N * Vl * es);
            for (int n = 0; n < N; n++)
                memcpy(sh[s] + (size_t)n * Vl * es, (char *)z.h + ((size_t)n * V + b[s]) * es,
                       (size_t)Vl * es);
            cr_assert_eq(l3d_dev_xent_vp_max(dev, sh[s], mx[s], N, Vl, at), L3D_OK);
        }
        for (int n = 0; n < N; n++) gmax[n] = fmaxf(mx[0][n], mx[1][n]);
        for (int s = 0; s < 2; s++)
            cr_assert_eq(l3d_dev_xent_vp_stats(dev, sh[s], gmax, t, N, b[s + 1] - b[s], b[s],
                                               st[s], at), L3D_OK);
        for (int i = 0; i < 2 * N; i++) gst[i] = st[0][i] + st[1][i];
        for (int s = 0; s < 2; s++) {
            int Vl = b[s + 1] - b[s];
            cr_assert_eq(l3d_dev_xent_vp_grad(dev, sh[s], vl, gmax, gst, t, N, Vl, b[s], gs, at),
                         L3D_OK);
            double *rs = calloc((size_t)N * Vl, 8);
            for (int n = 0; n < N; n++)
                for (int i = 0; i < Vl; i++) rs[(size_t)n * Vl + i] = rg[(size_t)n * V + b[s] + i];
            close64("xent_vp grad", at, sh[s], rs, (size_t)N * Vl, 1e-6);
            free(rs), free(sh[s]);
        }
        for (int n = 0; n < N; n++)
            cr_assert(fabs(vl[n] - rl[n]) <= 1e-6 * fmax(1.0, fabs(rl[n])), "vp loss %d", n);
        tens_free(&z), free(z32), free(rg), free(zh);
    }
}

// A dtype an op does not store is refused, naming the op, the operand and the dtype, and
// nothing is written.
Test(cpu_dtypes, other_dtypes_are_refused_by_every_op) {
    float x[64] = {0}, r[8];
    cr_assert_eq(l3d_dev_rmsnorm_fwd(dev, x, r, x, x, 2, 4, 1e-5f, L3D_INT32, F32),
                 L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "rmsnorm_fwd") &&
              strstr(l3d_ctx_last_error(ctx), "int32"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_dev_swiglu_fwd(dev, x, x, x, 8, L3D_INT64), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "swiglu_fwd"), "%s", l3d_ctx_last_error(ctx));
    int32_t tok[2] = {0, 1};
    cr_assert_eq(l3d_dev_embedding_bwd(dev, x, x, tok, 2, 4, F32, L3D_INT32), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "dtable"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_dev_xent_fwd_bwd(dev, x, r, tok, 2, 4, 1.0f, L3D_INT32), L3D_ERR_INVALID_ARG);
    double s;
    cr_assert_eq(l3d_dev_sumsq(dev, x, 8, &s, L3D_INT64), L3D_ERR_INVALID_ARG);
    l3d_attn_dims_t d = {1, 2, 2, 2, 2, 4, 0};
    cr_assert_eq(l3d_dev_attention_fwd(dev, x, NULL, x, x, x, &d, L3D_INT32), L3D_ERR_INVALID_ARG);
    for (int i = 0; i < 64; i++) cr_assert_eq(x[i], 0.0f);
}
