// Matrix-vector products for the few-row GEMMs of decoding: y(M,N) = alpha x(M,K) W(N,K)^T
// + beta y with M <= L3D_CPU_GEMV_MAX_M. Each weight row is read from memory once and dotted
// with the M input rows while it sits in L1, so a decode step streams every weight once; the
// sgemm it replaces packed the whole weight matrix into panels first (for M = 1 that packing
// was two thirds of the time).
// defines: l3d_cpu_gemv, l3d_cpu_gemv_takes
//
// Tasks own fixed blocks of GEMV_ROWS output columns (weight rows), cut by the shape alone,
// and every output element is one dot product in the fixed order of l3d_cpu_dotf: the bits do
// not depend on the thread count.
#include "devices/cpu/cpu.h"

L3D_CPU_VECTORIZE

// Weight rows per task: 64 rows of K = 2048 are 512 KiB of streaming per task, enough to
// amortise the pool's hand-out; small products run on the caller alone.
#define GEMV_ROWS 64
#define GEMV_SERIAL_MACS ((size_t)1 << 16)

typedef struct {
    const l3d_gemm_t *g;
} gemv_job_t;

#if L3D_CPU_HAVE_V8F
// Four weight rows at a time (l3d_cpu_dotf4: the same bits as one row at a time); a last group
// of fewer repeats its last row and stores only its own. B float32, or bfloat16 read as stored
// (widened in registers).
L3D_CPU_SIMD static void rows4(const l3d_gemm_t *g, int j0, int j1) {
    const int M = g->M, K = g->K, bf16 = g->b_type == L3D_BFLOAT16;
    const float *A = g->A;
    size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int j = j0; j < j1; j += 4) {
        int nr = L3D_MIN(4, j1 - j);
        const void *w[4];
        for (int r = 0; r < 4; r++)
            w[r] = (const char *)g->B + (size_t)(j + L3D_MIN(r, nr - 1)) * (size_t)g->ldb * es;
        for (int m = 0; m < M; m++) {
            float d[4];
            if (bf16) l3d_cpu_dotf4(A + (size_t)m * (size_t)g->lda, w, 1, K, d);
            else l3d_cpu_dotf4(A + (size_t)m * (size_t)g->lda, w, 0, K, d);
            float *c = (float *)g->C + (size_t)m * (size_t)g->ldc + j;
            // beta 0 never reads C (BLAS semantics: it may hold NaN).
            for (int r = 0; r < nr; r++)
                c[r] = g->beta == 0.0f ? g->alpha * d[r] : g->alpha * d[r] + g->beta * c[r];
        }
    }
}
// One weight row at a time in 8-lane halves (l3d_cpu_dot_halves): the same bits.
L3D_CPU_SIMD static void rows1(const l3d_gemm_t *g, int j0, int j1) {
    const int M = g->M, K = g->K, bf16 = g->b_type == L3D_BFLOAT16;
    const float *A = g->A;
    size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int j = j0; j < j1; j++) {
        const void *w = (const char *)g->B + (size_t)j * (size_t)g->ldb * es;
        for (int m = 0; m < M; m++) {
            float d = l3d_cpu_dot_halves(A + (size_t)m * (size_t)g->lda, w, bf16, K);
            float *c = (float *)g->C + (size_t)m * (size_t)g->ldc + j;
            *c = g->beta == 0.0f ? g->alpha * d : g->alpha * d + g->beta * *c;
        }
    }
}
#if defined(__x86_64__)
#include <immintrin.h>
// l3d_cpu_dot_halves of one weight row (float32, or bfloat16 widened by vpmovzxwd straight
// from memory: GCC lowered the vector extension's conversion to four instructions, and decode
// in bfloat16 ran ~10% slower on Zen for it) with R input rows at once: each 16 weights are
// loaded and widened once for the R rows (at 16 streams the product was bound by the
// widening, not by memory: 81% of a step). The same arithmetic for each output: lo and hi
// partials, each product then its sum (no FMA in this target), the same fold and tail.
__attribute__((target("avx2"), always_inline)) static inline void dot_rows_avx2(
    const float *const *a, const void *w, int bf16, int K, float *d, const int R) {
    __m256 lo[4], hi[4];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= K; i += 16) {
        __m256 w0, w1;
        if (bf16) {
            const uint16_t *b = (const uint16_t *)w + i;
            __m256i u0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)b));
            __m256i u1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 8)));
            w0 = _mm256_castsi256_ps(_mm256_slli_epi32(u0, 16));
            w1 = _mm256_castsi256_ps(_mm256_slli_epi32(u1, 16));
        } else {
            w0 = _mm256_loadu_ps((const float *)w + i);
            w1 = _mm256_loadu_ps((const float *)w + i + 8);
        }
        for (int r = 0; r < R; r++) {
            lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(_mm256_loadu_ps(a[r] + i), w0));
            hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(_mm256_loadu_ps(a[r] + i + 8), w1));
        }
    }
    for (int r = 0; r < R; r++) {
        __m256 h8 = _mm256_add_ps(lo[r], hi[r]);  // acc[k] += acc[k + 8]
        __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
        float f[4];
        _mm_storeu_ps(f, h4);
        float s = (f[0] + f[2]) + (f[1] + f[3]);
        for (int t = i; t < K; t++) s += a[r][t] * l3d_cpu_elem(w, bf16, t);
        d[r] = s;
    }
}
// One weight row at a time, its M input rows four, then two, then one at a time.
__attribute__((target("avx2"))) static void rows1_avx2(const l3d_gemm_t *g, int j0, int j1) {
    const int M = g->M, K = g->K, bf16 = g->b_type == L3D_BFLOAT16;
    size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int j = j0; j < j1; j++) {
        const void *w = (const char *)g->B + (size_t)j * (size_t)g->ldb * es;
        for (int m = 0; m < M;) {
            const float *a[4];
            float d[4];
            int R = M - m >= 4 ? 4 : M - m >= 2 ? 2 : 1;
            for (int r = 0; r < R; r++) a[r] = (const float *)g->A + (size_t)(m + r) * g->lda;
            if (R == 4) dot_rows_avx2(a, w, bf16, K, d, 4);
            else if (R == 2) dot_rows_avx2(a, w, bf16, K, d, 2);
            else dot_rows_avx2(a, w, bf16, K, d, 1);
            for (int r = 0; r < R; r++, m++) {
                float *c = (float *)g->C + (size_t)m * (size_t)g->ldc + j;
                *c = g->beta == 0.0f ? g->alpha * d[r] : g->alpha * d[r] + g->beta * *c;
            }
        }
    }
}
#endif
// Four rows of one 16-lane vector each where AVX-512 holds such a vector in a register (the
// Intel figures of bench/README.md), one row in two halves elsewhere.
static void rows(const l3d_gemm_t *g, int j0, int j1) {
    if (__builtin_cpu_supports("avx512f")) rows4(g, j0, j1);
#if defined(__x86_64__)
    else if (__builtin_cpu_supports("avx2")) rows1_avx2(g, j0, j1);
#endif
    else rows1(g, j0, j1);
}
#else
L3D_CPU_SIMD static void rows(const l3d_gemm_t *g, int j0, int j1) {
    const int M = g->M, K = g->K;
    const float *A = g->A, *B = g->B;  // float32 (l3d_cpu_gemv_takes)
    for (int j = j0; j < j1; j++) {
        const float *w = B + (size_t)j * (size_t)g->ldb;
        for (int m = 0; m < M; m++) {
            float d = l3d_cpu_dotf(A + (size_t)m * (size_t)g->lda, w, K);
            float *c = (float *)g->C + (size_t)m * (size_t)g->ldc + j;
            *c = g->beta == 0.0f ? g->alpha * d : g->alpha * d + g->beta * *c;
        }
    }
}
#endif

static void gemv_task(void *arg, int task, int ntasks) {
    const gemv_job_t *j = arg;
    int j0 = task * GEMV_ROWS;
    rows(j->g, j0, L3D_MIN(j->g->N, j0 + GEMV_ROWS));
}

int l3d_cpu_gemv_takes(const l3d_gemm_t *g) {
    return g->a_type == L3D_FLOAT32 && g->c_type == L3D_FLOAT32 &&
           (g->b_type == L3D_FLOAT32 || (L3D_CPU_HAVE_V8F && g->b_type == L3D_BFLOAT16));
}

// The caller (cpu_gemm.c) has checked the shape and strides; M in [1, L3D_CPU_GEMV_MAX_M],
// K >= 1, !trans_a, trans_b, and l3d_cpu_gemv_takes(g).
void l3d_cpu_gemv(l3d_device_t *dev, const l3d_gemm_t *g) {
    size_t macs = (size_t)g->M * (size_t)g->N * (size_t)g->K;
    if (macs <= GEMV_SERIAL_MACS) {
        rows(g, 0, g->N);
        return;
    }
    gemv_job_t j = {g};
    l3d_cpu_run(dev, gemv_task, &j, (g->N + GEMV_ROWS - 1) / GEMV_ROWS);
}
