// SGEMM on the device's pool: the output is cut into fixed tiles (their size depends only on
// M, N and K), and each task calls single-threaded OpenBLAS on its tile. K is never split,
// so every output element is one OpenBLAS dot product whatever the thread count. Products
// with a few rows of A against a transposed B go to the matrix-vector kernel (cpu_gemv.c),
// bfloat16 x bfloat16 ones to the CPU's 16-bit arithmetic where it has some (cpu_gemm_bf16.c).
// defines: l3d_cpu_gemm
#include <cblas.h>
#include <string.h>

#include "devices/cpu/cpu.h"

// Below this many multiply-adds the pool's wake-up costs more than it saves.
#define GEMM_SERIAL_MACS ((size_t)1 << 20)
// Target tile: large enough that each task's packing of its A rows and B columns is a small
// fraction of its work (the cost goes as 1/TILE_M + 1/TILE_N), halved (down to the minimums)
// until there are GEMM_MIN_TASKS tiles so that mid-sized products still spread over cores.
// All of it depends on the shape only.
#define GEMM_TILE_M 256
#define GEMM_TILE_N 768
#define GEMM_MIN_TILE_M 64
#define GEMM_MIN_TILE_N 128
#define GEMM_MIN_TASKS 8

typedef struct {
    const l3d_gemm_t *g;
    int tile_m, tile_n;  // rows and columns per tile (the last one may be smaller)
    int ntm, ntn;        // tiles along M and N
    l3d_cpu_t *cpu;      // bfloat16 x bfloat16 on the CPU's own arithmetic: its level
    int bf16;            // (cpu_gemm_bf16.c), the tile's packed operands in scratch slots
    int widen_b;         // float32 A and C, 16-bit B: each task widens its columns of B
} gemm_job_t;

static void gemm_tile(const l3d_gemm_t *g, int i0, int m, int j0, int n) {
    // op(A) rows i0.. : A(M,K) row i0, or A(K,M) column i0. op(B) columns j0.. likewise.
    const float *A = g->A, *B = g->B;  // float32 here (gemm_widened converted the others)
    const float *a = g->trans_a ? A + i0 : A + (size_t)i0 * (size_t)g->lda;
    const float *b = g->trans_b ? B + (size_t)j0 * (size_t)g->ldb : B + j0;
    float *c = (float *)g->C + (size_t)i0 * (size_t)g->ldc + j0;
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, m, n, g->K, g->alpha, a, g->lda, b,
                g->ldb, g->beta, c, g->ldc);
}

// C(m tile) = A op(B) with the task's n columns of op(B) widened (exactly) into `panel` first:
// float32 activations against 16-bit weights (a prompt on a bfloat16 checkpoint) never hold a
// whole weight in float32, and each B element is widened once per row tile.
static void gemm_tile_widen_b(const l3d_gemm_t *g, int i0, int m, int j0, int n, float *panel) {
    size_t es = l3d_dtype_size(g->b_type);
    int ldp;
    if (g->trans_b) {  // columns j0.. of op(B) are rows j0.. of B: n rows of K
        for (int j = 0; j < n; j++)
            l3d_cpu_convert_serial(panel + (size_t)j * (size_t)g->K, L3D_FLOAT32,
                                   (const char *)g->B + (size_t)(j0 + j) * (size_t)g->ldb * es,
                                   g->b_type, (size_t)g->K);
        ldp = g->K;
    } else {  // K rows of n
        for (int k = 0; k < g->K; k++)
            l3d_cpu_convert_serial(panel + (size_t)k * (size_t)n, L3D_FLOAT32,
                                   (const char *)g->B + ((size_t)k * (size_t)g->ldb + j0) * es,
                                   g->b_type, (size_t)n);
        ldp = n;
    }
    const float *A = g->A;
    const float *a = g->trans_a ? A + i0 : A + (size_t)i0 * (size_t)g->lda;
    float *c = (float *)g->C + (size_t)i0 * (size_t)g->ldc + j0;
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, m, n, g->K, g->alpha, a, g->lda, panel,
                ldp, g->beta, c, g->ldc);
}

static void gemm_task(void *arg, int task, int ntasks) {
    const gemm_job_t *j = arg;
    int ti = task / j->ntn, tj = task % j->ntn;
    int i0 = ti * j->tile_m, j0 = tj * j->tile_n;
    int m = L3D_MIN(j->tile_m, j->g->M - i0), n = L3D_MIN(j->tile_n, j->g->N - j0);
    if (!j->bf16 && !j->widen_b) {
        gemm_tile(j->g, i0, m, j0, n);
        return;
    }
    int slot;
    float *scratch = l3d_cpu_scratch_acquire(j->cpu, &slot);
    if (j->bf16) l3d_cpu_gemm_bf16_tile(j->bf16, j->g, i0, m, j0, n, scratch);
    else gemm_tile_widen_b(j->g, i0, m, j0, n, scratch);
    l3d_cpu_scratch_release(j->cpu, slot);
}

// Splits `len` into about len/target equal tiles, each a multiple of 16 (SIMD width).
static void gemm_split(int len, int target, int *tile_p, int *ntiles_p) {
    int nt = (len + target - 1) / target;
    if (nt < 1) nt = 1;
    int tile = (len + nt - 1) / nt;
    tile = (tile + 15) & ~15;
    if (tile > len) tile = len;
    *tile_p = tile;
    *ntiles_p = (len + tile - 1) / tile;
}

// C(M,N) = beta C without reading C when beta is 0 (BLAS semantics), for K == 0.
static void gemm_scale_c(const l3d_gemm_t *g) {
    for (int i = 0; i < g->M; i++) {
        float *c = (float *)g->C + (size_t)i * (size_t)g->ldc;
        if (g->beta == 0.0f) memset(c, 0, sizeof(float) * (size_t)g->N);
        else
            for (int jj = 0; jj < g->N; jj++) c[jj] *= g->beta;
    }
}

static l3d_status gemm_one(l3d_device_t *dev, const l3d_gemm_t *g);

// ---- 16-bit operands ------------------------------------------------------------------------
// Elements an operand of `rows` rows of `cols` (row stride ld) spans in memory.
static size_t span(int rows, int cols, int ld) {
    return rows > 0 && cols > 0 ? (size_t)(rows - 1) * (size_t)ld + (size_t)cols : 0;
}

// bfloat16/float16 operands are widened to float32 copies (exact, l3d_cpu_args_widen), the
// float32 product runs as for float32 operands, and a 16-bit C is rounded once as each of its
// rows is stored back (the padding between rows is not touched). Correct first: the copies
// cost memory traffic a kernel reading 16-bit operands directly would not.
static l3d_status gemm_widened(l3d_device_t *dev, const l3d_gemm_t *g) {
    size_t na = g->trans_a ? span(g->K, g->M, g->lda) : span(g->M, g->K, g->lda);
    size_t nb = g->trans_b ? span(g->N, g->K, g->ldb) : span(g->K, g->N, g->ldb);
    size_t nc = span(g->M, g->N, g->ldc);
    // C is read only for beta != 0 (beta 0 never reads it); its rows are stored below.
    l3d_cpu_arg_t x[] = {l3d_cpu_arg("A", g->A, g->a_type, na, L3D_CPU_IN),
                         l3d_cpu_arg("B", g->B, g->b_type, nb, L3D_CPU_IN),
                         l3d_cpu_arg("C", g->C, g->c_type, nc, g->beta != 0.0f ? L3D_CPU_IN : 0)};
    L3D_CHECK(dev->ctx, l3d_cpu_args_widen(dev, "gemm", x, 3));
    l3d_gemm_t f = *g;
    f.a_type = f.b_type = f.c_type = L3D_FLOAT32;
    f.A = x[0].f;
    f.B = x[1].f;
    f.C = x[2].f;
    l3d_status st = gemm_one(dev, &f);
    if (st >= 0 && g->c_type != L3D_FLOAT32) {
        size_t es = l3d_dtype_size(g->c_type);
        for (int i = 0; i < g->M; i++)
            l3d_cpu_convert_run(dev, (char *)g->C + (size_t)i * (size_t)g->ldc * es, g->c_type,
                                x[2].f + (size_t)i * (size_t)g->ldc, L3D_FLOAT32, (size_t)g->N);
    }
    l3d_cpu_args_narrow(dev, x, 3, 0);
    return st;
}

// A batch runs its products one after another, each spread over the pool: the same tiles,
// and so the same bits, as running them as separate calls.
l3d_status l3d_cpu_gemm(l3d_device_t *dev, const l3d_gemm_t *g) {
    if (!l3d_cpu_dtype_ok(g->a_type) || !l3d_cpu_dtype_ok(g->b_type) || !l3d_cpu_dtype_ok(g->c_type))
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "gemm: dtypes A %s B %s C %s (float32, "
                         "bfloat16 and float16 only)", l3d_dtype_name(g->a_type),
                         l3d_dtype_name(g->b_type), l3d_dtype_name(g->c_type));
    if (g->batch <= 1) return gemm_one(dev, g);
    size_t ea = l3d_dtype_size(g->a_type), eb = l3d_dtype_size(g->b_type),
           ec = l3d_dtype_size(g->c_type);
    for (int i = 0; i < g->batch; i++) {
        l3d_gemm_t one = *g;
        one.batch = 1;
        one.A = (const char *)g->A + (size_t)i * g->stride_a * ea;
        one.B = (const char *)g->B + (size_t)i * g->stride_b * eb;
        one.C = (char *)g->C + (size_t)i * g->stride_c * ec;
        L3D_CHECK(dev->ctx, gemm_one(dev, &one));
    }
    return L3D_OK;
}

static l3d_status gemm_one(l3d_device_t *dev, const l3d_gemm_t *g) {
    if (g->M < 0 || g->N < 0 || g->K < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "gemm: negative shape %dx%dx%d", g->M,
                         g->N, g->K);
    if (g->M == 0 || g->N == 0) return L3D_OK;
    int min_lda = g->trans_a ? g->M : g->K, min_ldb = g->trans_b ? g->K : g->N;
    if (g->lda < L3D_MAX(min_lda, 1) || g->ldb < L3D_MAX(min_ldb, 1) || g->ldc < g->N)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "gemm: strides lda %d ldb %d ldc %d too small for %dx%dx%d (ta %d tb %d)",
                         g->lda, g->ldb, g->ldc, g->M, g->N, g->K, g->trans_a, g->trans_b);
    // Decode-sized products (x W^T with a few rows of x): a matrix-vector pass that reads each
    // weight once, instead of sgemm packing all of W for so few rows. Chosen by shape (and
    // dtypes: a bfloat16 W is read as stored) alone.
    int gemv = g->M <= L3D_CPU_GEMV_MAX_M && !g->trans_a && g->trans_b && g->K > 0;
    // round_a (float32 rows against bfloat16 weights, in the CPU's 16-bit arithmetic where it
    // has some; else read exactly, as the contract allows).
    l3d_cpu_t *cpu = l3d_cpu_priv(dev);
    int round_a = g->round_a && g->a_type == L3D_FLOAT32 && g->b_type == L3D_BFLOAT16 &&
                  g->c_type == L3D_FLOAT32 && g->K > 0;
    if (round_a && gemv && cpu->has_dp) return l3d_cpu_gemv_round_a(dev, g);
    if (gemv && l3d_cpu_gemv_takes(g)) {
        l3d_cpu_gemv(dev, g);
        return L3D_OK;
    }
    // bfloat16 A and B multiply on the CPU's 16-bit arithmetic where it has some; the rest
    // widens its 16-bit operands (K 0 included: nothing to multiply, C scaled as for float32).
    int bf16 = ((g->a_type == L3D_BFLOAT16 && g->b_type == L3D_BFLOAT16) ||
                (round_a && !g->trans_a)) && g->K > 0
                   ? cpu->bf16
                   : L3D_CPU_BF16_OFF;
    int widen_b = !bf16 && g->a_type == L3D_FLOAT32 && g->c_type == L3D_FLOAT32 &&
                  g->b_type != L3D_FLOAT32 && g->K > 0;
    if (!bf16 && !widen_b && (g->a_type != L3D_FLOAT32 || g->b_type != L3D_FLOAT32 ||
                              g->c_type != L3D_FLOAT32))
        return gemm_widened(dev, g);
    if (g->K == 0) {
        gemm_scale_c(g);
        return L3D_OK;
    }
    size_t macs = (size_t)g->M * (size_t)g->N * (size_t)g->K;
    if (macs <= GEMM_SERIAL_MACS && !bf16 && !widen_b) {
        gemm_tile(g, 0, g->M, 0, g->N);
        return L3D_OK;
    }
    gemm_job_t j = {.g = g, .cpu = cpu, .bf16 = bf16, .widen_b = widen_b};
    int tm = GEMM_TILE_M, tn = GEMM_TILE_N;
    gemm_split(g->M, tm, &j.tile_m, &j.ntm);
    gemm_split(g->N, tn, &j.tile_n, &j.ntn);
    while (j.ntm * j.ntn < GEMM_MIN_TASKS) {
        int can_m = tm > GEMM_MIN_TILE_M && g->M > tm / 2;  // halving adds a tile
        int can_n = tn > GEMM_MIN_TILE_N && g->N > tn / 2;
        if (!can_m && !can_n) break;
        if (can_n && (!can_m || tn >= 3 * tm)) tn /= 2;  // keep tiles roughly 3:1 or squarer
        else tm /= 2;
        gemm_split(g->M, tm, &j.tile_m, &j.ntm);
        gemm_split(g->N, tn, &j.tile_n, &j.ntn);
    }
    if (bf16 || widen_b) {
        size_t bytes = bf16 ? l3d_cpu_gemm_bf16_scratch(j.tile_m, j.tile_n, g->K)
                            : (size_t)j.tile_n * (size_t)g->K * sizeof(float);
        L3D_CHECK(dev->ctx, l3d_cpu_scratch_reserve(dev, (bytes + sizeof(float) - 1) / sizeof(float)));
        if (macs <= GEMM_SERIAL_MACS) {  // one tile per task on the caller, in the same tiles
            for (int t = 0; t < j.ntm * j.ntn; t++) gemm_task(&j, t, j.ntm * j.ntn);
            return L3D_OK;
        }
    }
    l3d_cpu_run(dev, gemm_task, &j, j.ntm * j.ntn);
    return L3D_OK;
}
