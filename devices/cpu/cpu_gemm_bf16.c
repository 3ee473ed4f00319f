// bfloat16 x bfloat16 products on the CPU's own 16-bit arithmetic: AMX tiles (Intel Xeon from
// Sapphire Rapids on) or AVX512-BF16 dot products (Cooper Lake, AMD Zen 4 on), chosen when the
// device is created (l3d_cpu_bf16_probe; L3D_CPU_BF16 forces a lower level). Without either,
// cpu_gemm.c widens the operands to float32 and runs sgemm.
// defines: l3d_cpu_bf16_probe, l3d_cpu_bf16_name, l3d_cpu_gemm_bf16_tile, l3d_cpu_gemv_round_a
//
// The contract is the float32 one (devices/device.h): every product of two bfloat16 values is
// exact in float32 and the sums are float32. Both instructions add the two products of a pair
// of k into the float32 accumulator, rounding to nearest even, so the bound of a float32 dot
// product holds; they treat subnormal inputs (|x| < 2^-126) as zero and flush subnormal sums,
// which sgemm on widened operands does not. K is never split and each output element is summed
// in one fixed order for its level, so the bits depend on the shape and level only, never on
// the thread count. AMX and AVX512-BF16 sum in different orders: their results differ in the
// last bits, as sgemm's kernel sets do from one another.
#define _GNU_SOURCE  // syscall(2)
#include <string.h>

#include "devices/cpu/cpu.h"
#include "devices/device_math.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && !defined(L3D_CPU_NO_BF16)
#define BF16_X86 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define BF16_X86 0
#endif

#define RND32(x) (((x) + 31) & ~31)  // rows, columns and K padded to whole blocks

#if BF16_X86
// ---- packed operands -------------------------------------------------------------------------
// op(A) (M,K), a task's rows: blocks of 16 rows x 32 k, stored [row block][k block][16][32], so
// that each block is one AMX A tile (16 rows of 64 bytes), zero past M and K.
// op(B) (K,N), a task's columns: blocks of 16 k-pairs x 16 columns in VNNI order, stored
// [column block][k block][16 pairs][16 columns][2]: element (k, n) of a block at
// (k/2)*32 + n*2 + k%2, one AMX B tile; an AVX512-BF16 step reads one pair row (64 bytes).
// Rows and columns are padded to 32 (two blocks), the AMX kernel's step.
#define BLK 512  // bfloat16 per block: 16 x 32


L3D_CPU_VECTORIZE

static uint32_t load32(const uint16_t *p) {
    uint32_t w;
    memcpy(&w, p, sizeof(w));
    return w;
}

// dst (16 rows of 16 words, dst_ld words apart) = the transpose of src (likewise, src_ld).
// Packing's one reshuffle: a bfloat16 pair is a word, and a block moves as 16 x 16 words.
static inline void transpose16(uint32_t *dst, int dst_ld, const uint32_t *src, int src_ld) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) dst[r * dst_ld + c] = src[c * src_ld + r];
}

// Row k of a k-major operand, 16 values from column c0 (zero past `cols` or past K) interleaved
// with row k + 1's into 16 pairs: words[c] = (row k + 1, c) << 16 | (row k, c).
static inline void pair_row(uint32_t *words, const uint16_t *X, int ld, int k, int K, int c0,
                            int cols) {
    const uint16_t *s0 = X + (size_t)k * (size_t)ld + c0, *s1 = s0 + ld;
    int n = L3D_MIN(16, cols - c0);
    if (n == 16 && k + 1 < K) {
        for (int c = 0; c < 16; c++) words[c] = (uint32_t)s0[c] | (uint32_t)s1[c] << 16;
        return;
    }
    for (int c = 0; c < 16; c++)
        words[c] = c >= n ? 0 : (uint32_t)s0[c] | (k + 1 < K ? (uint32_t)s1[c] << 16 : 0);
}

// Row r of a k-contiguous operand, 32 values from k = kb * 32 (zero past K; none when r is
// past `rows`) as 16 pairs.
static inline void k_row(uint32_t *words, const uint16_t *X, int ld, int r, int rows, int kb,
                         int K) {
    int n = r < rows ? L3D_MIN(32, K - kb * 32) : 0;
    const uint16_t *s = X + (size_t)r * (size_t)ld + (size_t)kb * 32;
    if (n == 32) {
        memcpy(words, s, 64);
        return;
    }
    uint16_t h[32];
    for (int k = 0; k < 32; k++) h[k] = k < n ? s[k] : 0;
    memcpy(words, h, 64);
}

static void pack_a(uint16_t *dst, const l3d_gemm_t *g, int i0, int m, int nkb) {
    const uint16_t *A = g->A;
    const int K = g->K;
    size_t step = (size_t)nkb * BLK;  // one row block over the whole K
    memset(dst, 0, (size_t)RND32(m) * (size_t)nkb * 32 * sizeof(uint16_t));
    if (g->a_type == L3D_FLOAT32) {  // round_a: each row of float32 A rounded as it is packed
        for (int i = 0; i < m; i++) {
            const float *s = (const float *)g->A + (size_t)(i0 + i) * (size_t)g->lda;
            uint16_t *d = dst + (size_t)(i / 16) * step + (size_t)(i % 16) * 32;
            for (int k = 0; k < K; k++) d[(size_t)(k / 32) * BLK + k % 32] = l3d_f32_to_bf16(s[k]);
        }
        return;
    }
    if (!g->trans_a) {  // row i of op(A) is row i0 + i of A, contiguous in k: blocks as stored
        for (int i = 0; i < m; i++) {
            const uint16_t *s = A + (size_t)(i0 + i) * (size_t)g->lda;
            uint16_t *d = dst + (size_t)(i / 16) * step + (size_t)(i % 16) * 32;
            for (int kb = 0; kb < nkb; kb++)
                memcpy(d + (size_t)kb * BLK, s + kb * 32,
                       (size_t)L3D_MIN(32, K - kb * 32) * sizeof(uint16_t));
        }
        return;
    }
    // op(A)(i, k) = A[k][i0 + i]: pairs of A's rows k, k + 1 over 16 columns, transposed.
    uint32_t u[16 * 16];
    for (int rb = 0; rb < (m + 15) / 16; rb++)
        for (int kb = 0; kb < nkb; kb++) {
            for (int p = 0; p < 16; p++) {
                int k = kb * 32 + 2 * p;
                if (k < K) pair_row(u + p * 16, A + i0, g->lda, k, K, rb * 16, m);
                else memset(u + p * 16, 0, 64);
            }
            transpose16((uint32_t *)(dst + (size_t)rb * step + (size_t)kb * BLK), 16, u, 16);
        }
}

static void pack_b(uint16_t *dst, const l3d_gemm_t *g, int j0, int n, int nkb) {
    const uint16_t *B = g->B;
    const int K = g->K;
    size_t step = (size_t)nkb * BLK;  // one column block over the whole K
    memset(dst, 0, (size_t)RND32(n) * (size_t)nkb * 32 * sizeof(uint16_t));
    uint32_t u[16 * 16];
    for (int cb = 0; cb < (n + 15) / 16; cb++)
        for (int kb = 0; kb < nkb; kb++) {
            uint32_t *t = (uint32_t *)(dst + (size_t)cb * step + (size_t)kb * BLK);
            if (g->trans_b) {  // column j of op(B) is row j0 + j of B, contiguous in k
                for (int j = 0; j < 16; j++)
                    k_row(u + j * 16, B + (size_t)j0 * (size_t)g->ldb, g->ldb, cb * 16 + j, n,
                          kb, K);
                transpose16(t, 16, u, 16);
            } else {  // op(B)(k, j) = B[k][j0 + j]: pairs of rows are the block's rows
                for (int p = 0; p < 16; p++) {
                    int k = kb * 32 + 2 * p;
                    if (k < K) pair_row(t + p * 16, B + j0, g->ldb, k, K, cb * 16, n);
                }
            }
        }
}

// C rows i0.., columns j0.. (m x n of the 32 x 32 block c) = alpha c + beta C, rounded once
// into a 16-bit C. beta 0 never reads C (BLAS semantics: it may hold NaN).
static void store_c(const l3d_gemm_t *g, const float *c, int i0, int m, int j0, int n) {
    for (int r = 0; r < m; r++) {
        size_t row = (size_t)(i0 + r) * (size_t)g->ldc + (size_t)j0;
        const float *cr = c + r * 32;
        if (g->c_type == L3D_FLOAT32) {
            float *o = (float *)g->C + row;
            for (int j = 0; j < n; j++)
                o[j] = g->beta == 0.0f ? g->alpha * cr[j] : g->alpha * cr[j] + g->beta * o[j];
        } else if (g->c_type == L3D_BFLOAT16) {
            uint16_t *o = (uint16_t *)g->C + row;
            for (int j = 0; j < n; j++)
                o[j] = l3d_f32_to_bf16(g->beta == 0.0f ? g->alpha * cr[j]
                                                       : g->alpha * cr[j] +
                                                             g->beta * l3d_bf16_to_f32(o[j]));
        } else {
            uint16_t *o = (uint16_t *)g->C + row;
            for (int j = 0; j < n; j++)
                o[j] = l3d_f32_to_f16(g->beta == 0.0f ? g->alpha * cr[j]
                                                      : g->alpha * cr[j] +
                                                            g->beta * l3d_f16_to_f32(o[j]));
        }
    }
}

// ---- AMX: a 32 x 32 block of C in four tiles ------------------------------------------------
// tmm0-3 accumulate C's quadrants, tmm4-5 hold two A tiles (rows 0-15, 16-31), tmm6-7 two B
// tiles (columns 0-15, 16-31); every tile 16 rows of 64 bytes.
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg_t;

__attribute__((target("amx-tile"))) static void amx_begin(void) {
    amx_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    // Not _tile_loadconfig: GCC 12's declares an 8-byte read, and the stores of the rows and
    // columns above were dropped as dead (ldtilecfg then faulted on palette 1 with no tiles).
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}
__attribute__((target("amx-tile"))) static void amx_end(void) { _tile_release(); }

// a0, a1: the two row blocks of packed A; b0, b1: the two column blocks of packed B; c (32,32).
__attribute__((target("amx-tile,amx-bf16"))) static void amx_block(const uint16_t *a0,
                                                                   const uint16_t *a1,
                                                                   const uint16_t *b0,
                                                                   const uint16_t *b1, int nkb,
                                                                   float *c) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int kb = 0; kb < nkb; kb++) {
        size_t o = (size_t)kb * BLK;
        _tile_loadd(4, a0 + o, 64);
        _tile_loadd(5, a1 + o, 64);
        _tile_loadd(6, b0 + o, 64);
        _tile_loadd(7, b1 + o, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 128);
    _tile_stored(1, c + 16, 128);
    _tile_stored(2, c + 16 * 32, 128);
    _tile_stored(3, c + 16 * 32 + 16, 128);
}

// ---- AVX512-BF16: a 16 x 16 quadrant, one accumulator register per row ----------------------
// Per pair row of B (16 columns x 2 k), each row's pair of A is broadcast and dotted in.
__attribute__((target("avx512f,avx512bf16"))) static void dp_block(const uint16_t *a,
                                                                  const uint16_t *b, int nkb,
                                                                  float *c) {
    // The sixteen accumulators stay in registers only when the row loops are unrolled.
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    for (int kb = 0; kb < nkb; kb++) {
        const uint16_t *ak = a + (size_t)kb * BLK, *bk = b + (size_t)kb * BLK;
        for (int p = 0; p < 16; p++) {
            __m512bh bv = (__m512bh)_mm512_loadu_si512(bk + p * 32);
#pragma GCC unroll 16
            for (int r = 0; r < 16; r++) {
                __m512bh av = (__m512bh)_mm512_set1_epi32((int)load32(ak + r * 32 + p * 2));
                acc[r] = _mm512_dpbf16_ps(acc[r], av, bv);
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) _mm512_storeu_ps(c + r * 32, acc[r]);
}

// ---- AVX512-BF16 matrix-vector products on rounded rows (round_a, decode) ----------------------
// y(m, j) = alpha <a16_m, W_j> + beta y: a16 the rows of A rounded to bfloat16 (Kp = K rounded up
// to 32, zero past K), W_j bfloat16 rows of K read as stored (masked past K). 32 products a
// step per row, four weight rows at a time; each sum's order is fixed by K alone.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void dp_rows(
    const l3d_gemm_t *g, const uint16_t *a16, int Kp, int j0, int j1) {
    const int K = g->K, M = g->M;
    const uint16_t *B = g->B;
    int tail = K % 32;
    __mmask32 last = tail ? (__mmask32)((1u << tail) - 1u) : (__mmask32)0xffffffffu;
    int nk = Kp / 32;
    for (int j = j0; j < j1; j += 4) {
        int nr = L3D_MIN(4, j1 - j);
        const uint16_t *w[4];
        for (int r = 0; r < 4; r++) w[r] = B + (size_t)(j + L3D_MIN(r, nr - 1)) * (size_t)g->ldb;
        for (int m = 0; m < M; m++) {
            const uint16_t *a = a16 + (size_t)m * (size_t)Kp;
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                             _mm512_setzero_ps()};
            for (int kb = 0; kb < nk; kb++) {
                __m512bh av = (__m512bh)_mm512_loadu_si512(a + kb * 32);
                __mmask32 mk = kb == nk - 1 ? last : (__mmask32)0xffffffffu;
                for (int r = 0; r < 4; r++) {
                    __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mk, w[r] + kb * 32);
                    acc[r] = _mm512_dpbf16_ps(acc[r], av, wv);
                }
            }
            float *c = (float *)g->C + (size_t)m * (size_t)g->ldc + j;
            for (int r = 0; r < nr; r++) {
                float d = _mm512_reduce_add_ps(acc[r]);
                c[r] = g->beta == 0.0f ? g->alpha * d : g->alpha * d + g->beta * c[r];
            }
        }
    }
}

typedef struct {
    const l3d_gemm_t *g;
    const uint16_t *a16;
    int Kp;
} dp_job_t;

#define DP_ROWS 64  // weight rows per task, as the float32 matrix-vector kernel
static void dp_task(void *arg, int task, int ntasks) {
    const dp_job_t *j = arg;
    int j0 = task * DP_ROWS;
    dp_rows(j->g, j->a16, j->Kp, j0, L3D_MIN(j->g->N, j0 + DP_ROWS));
}

// ---- detection -------------------------------------------------------------------------------
#define ARCH_REQ_XCOMP_PERM 0x1023  // Linux: ask for a dynamically enabled state component
#define XFEATURE_XTILEDATA 18       // AMX's tile data (8 KiB of state per thread)

int l3d_cpu_bf16_probe(void) {
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return 0;  // AVX512-BF16
    int level = L3D_CPU_BF16_AVX512;
    // AMX-BF16 (leaf 7 EDX bit 22) with AMX-TILE (bit 24), and the kernel's permission for
    // the tile state (Linux 5.16 on); a kernel that refuses leaves AVX512-BF16.
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && (d & (1u << 24)) &&
        syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
        level = L3D_CPU_BF16_AMX;
    return level;
}
l3d_status l3d_cpu_gemv_round_a(l3d_device_t *dev, const l3d_gemm_t *g) {
    int Kp = RND32(g->K);
    // The rounded rows sit in the device's widening buffer (ops run one after another).
    uint16_t *a16 = (uint16_t *)l3d_cpu_wide(dev, ((size_t)g->M * (size_t)Kp + 1) / 2);
    if (!a16) return L3D_ERR_NOMEM;
    for (int m = 0; m < g->M; m++) {
        const float *s = (const float *)g->A + (size_t)m * (size_t)g->lda;
        uint16_t *d = a16 + (size_t)m * (size_t)Kp;
        for (int k = 0; k < g->K; k++) d[k] = l3d_f32_to_bf16(s[k]);
        for (int k = g->K; k < Kp; k++) d[k] = 0;
    }
    dp_job_t j = {g, a16, Kp};
    int ntasks = (g->N + DP_ROWS - 1) / DP_ROWS;
    if ((size_t)g->M * (size_t)g->N * (size_t)g->K <= ((size_t)1 << 16))
        for (int t = 0; t < ntasks; t++) dp_task(&j, t, ntasks);
    else
        l3d_cpu_run(dev, dp_task, &j, ntasks);
    return L3D_OK;
}
#else
int l3d_cpu_bf16_probe(void) { return 0; }
l3d_status l3d_cpu_gemv_round_a(l3d_device_t *dev, const l3d_gemm_t *g) {
    return l3d_error(dev->ctx, L3D_ERR_INTERNAL, "gemm: no AVX512-BF16 kernel in this build");
}

#endif

size_t l3d_cpu_gemm_bf16_scratch(int tile_m, int tile_n, int K) {
    size_t nkb = (size_t)(K + 31) / 32;
    return (size_t)(RND32(tile_m) + RND32(tile_n)) * nkb * 32 * sizeof(uint16_t) +
           32 * 32 * sizeof(float);
}

const char *l3d_cpu_bf16_name(int level) {
    return level == L3D_CPU_BF16_AMX ? "amx" : level == L3D_CPU_BF16_AVX512 ? "avx512" : "off";
}

// C rows i0..i0+m-1, columns j0..j0+n-1 of a bfloat16 x bfloat16 product at `level` (not off):
// packs this tile's A rows and B columns into `scratch` (l3d_cpu_gemm_bf16_scratch floats'
// worth of bytes for the job's tile size), then runs 32 x 32 blocks over the whole K.
void l3d_cpu_gemm_bf16_tile(int level, const l3d_gemm_t *g, int i0, int m, int j0, int n,
                            void *scratch) {
#if BF16_X86
    int nkb = (g->K + 31) / 32;
    uint16_t *pa = scratch;
    uint16_t *pb = pa + (size_t)RND32(m) * (size_t)nkb * 32;
    float *c = (float *)(pb + (size_t)RND32(n) * (size_t)nkb * 32);
    pack_a(pa, g, i0, m, nkb);
    pack_b(pb, g, j0, n, nkb);
    size_t step = (size_t)nkb * BLK;  // one 16-row (16-column) block over the whole K
    // GCC's tile loads name their addresses, not the memory behind them: a compiler barrier
    // keeps the packing's stores before them.
    __asm__ volatile("" ::: "memory");
    if (level == L3D_CPU_BF16_AMX) amx_begin();
    for (int ib = 0; ib < m; ib += 32) {
        const uint16_t *a = pa + (size_t)(ib / 16) * step;
        for (int jb = 0; jb < n; jb += 32) {
            const uint16_t *b = pb + (size_t)(jb / 16) * step;
            if (level == L3D_CPU_BF16_AMX) {
                amx_block(a, a + step, b, b + step, nkb, c);
            } else {
                dp_block(a, b, nkb, c);
                dp_block(a, b + step, nkb, c + 16);
                dp_block(a + step, b, nkb, c + 16 * 32);
                dp_block(a + step, b + step, nkb, c + 16 * 32 + 16);
            }
            store_c(g, c, i0 + ib, L3D_MIN(32, m - ib), j0 + jb, L3D_MIN(32, n - jb));
        }
    }
    if (level == L3D_CPU_BF16_AMX) amx_end();
#else
    (void)level, (void)g, (void)i0, (void)m, (void)j0, (void)n, (void)scratch;
#endif
}
