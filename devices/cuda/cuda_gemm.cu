// The CUDA device's GEMM: cuBLASLt with float32 compute for every dtype mix the vtable allows,
// its heuristic's first algorithm cached per shape, a 32 MiB workspace. float32 operands stay
// float32 (CUBLAS_COMPUTE_32F: no TF32, as torch without allow_tf32) unless the device was
// created with allow_tf32, when an all-float32 product uses CUBLAS_COMPUTE_32F_FAST_TF32 (inputs
// rounded to TF32's 10-bit mantissa, float32 accumulation: torch's allow_tf32 = True).
// defines: l3d_cuda_gemm, l3d_cuda_gemm_init, l3d_cuda_gemm_fini
//
// Row-major to cuBLASLt's column-major: a row-major X (r,c) with row stride ld is the
// column-major X^T (c,r) with the same ld, so C = op(A) op(B) is computed as
// C^T (N,M) = op(B)^T op(A)^T: cuBLASLt's first operand is B, its second A, m = N, n = M.
// B not transposed is stored (K,N): column-major (N,K), op N; transposed it is stored (N,K):
// column-major (K,N), op T. A likewise with (K,M) / (M,K).
//
// cuBLASLt multiplies A and B of one type: bf16 x bf16 and f16 x f16 into C of their type or
// float32, and float32 x float32 into float32. Another mix (a float32 operand beside a 16-bit
// one, or a float32 product into a 16-bit C) runs on float32 copies of the 16-bit operands in
// scratch, C widened when beta reads it and rounded once at the end: the contract's float32
// arithmetic and one rounding, at the cost of the copies. Training never asks for one (its
// operands share the training dtype).
//
// cuBLASLt is opened when a device is created (dlopen, its soname, then the toolkit's library
// directory), not linked: its 540 MB library's load-time relocations made every l3d process
// over 200 MiB resident, on the CPU too (`l3d --help`: 7.5 MiB without it, 214 with it;
// tests/cli_data_mem.sh bounds a run's RSS). Each device keeps its own handle on the library.
#include <cublasLt.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "devices/cuda/cuda.h"

#define L3D_STR2(x) #x
#define L3D_STR(x) L3D_STR2(x)
#ifndef L3D_CUDA_LIBDIR
#define L3D_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

// The entries of cuBLASLt this file calls, as the library gives them.
#define LT_FNS(X)                                                                              \
    X(cublasLtCreate)                                                                          \
    X(cublasLtDestroy) X(cublasLtGetStatusName) X(cublasLtMatmulDescCreate)                    \
        X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                         \
            X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                       \
                X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatmulPreferenceCreate)          \
                    X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) \
                        X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)
struct l3d_cuda_lt {
    void *lib;
#define LT_MEMBER(f) decltype(&::f) f;
    LT_FNS(LT_MEMBER)
#undef LT_MEMBER
};
#define LT(f) (l3d_cuda_priv(dev)->lt_api->f)

#define WORKSPACE_BYTES ((size_t)32 << 20)

typedef struct l3d_cuda_plan {
    int key[14];
    size_t strides[3];
    cublasLtMatmulAlgo_t algo;
} l3d_cuda_plan_t;

static l3d_status lt_fail(l3d_device_t *dev, cublasStatus_t s, const char *what) {
    return l3d_error(dev->ctx,
                     s == CUBLAS_STATUS_NOT_SUPPORTED ? L3D_ERR_UNSUPPORTED : L3D_ERR_SYSTEM,
                     "cublasLt %s: %s (%d)", what, LT(cublasLtGetStatusName)(s), (int)s);
}
#define LT_CHECK(dev, call, what)            \
    do {                                     \
        cublasStatus_t s_ = (call);          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {   \
            st = lt_fail((dev), s_, (what)); \
            goto done;                       \
        }                                    \
    } while (0)

static l3d_status lt_open(l3d_device_t *dev) {
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    const char *names[2] = {"libcublasLt.so." L3D_STR(CUBLAS_VER_MAJOR),
                            L3D_CUDA_LIBDIR "/libcublasLt.so." L3D_STR(CUBLAS_VER_MAJOR)};
    void *lib = NULL;
    // RTLD_NODELETE, as libnccl (transports/nccl/nccl_lib.c): a device closed and created
    // again in one process (the tests, an application's second model) finds the library
    // mapped instead of relocating its hundreds of MB once more.
    for (int i = 0; i < 2 && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!lib)
        return l3d_error(dev->ctx, L3D_ERR_UNSUPPORTED,
                         "cuda: cuBLASLt: %s (not in the loader's "
                         "path, nor in %s)",
                         dlerror(), L3D_CUDA_LIBDIR);
    struct l3d_cuda_lt *api = (struct l3d_cuda_lt *)l3d_calloc(dev->ctx, 1, sizeof(*api), "other");
    if (!api) {
        dlclose(lib);
        return L3D_ERR_NOMEM;
    }
    api->lib = lib;
    const char *missing = NULL;
#define LT_LOAD(f) \
    if (!(api->f = (decltype(api->f))dlsym(lib, #f)) && !missing) missing = #f;
    LT_FNS(LT_LOAD)
#undef LT_LOAD
    if (missing) {
        dlclose(lib);
        l3d_free(dev->ctx, api, sizeof(*api), "other");
        return l3d_error(dev->ctx, L3D_ERR_UNSUPPORTED, "cuda: cuBLASLt lacks %s", missing);
    }
    c->lt_api = api;
    return L3D_OK;
}

extern "C" l3d_status l3d_cuda_gemm_init(l3d_device_t *dev) {
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    L3D_CHECK(dev->ctx, lt_open(dev));
    cublasLtHandle_t h;
    cublasStatus_t s = LT(cublasLtCreate)(&h);
    if (s != CUBLAS_STATUS_SUCCESS)
        return l3d_error(dev->ctx, L3D_ERR_SYSTEM, "cublasLtCreate: %s",
                         LT(cublasLtGetStatusName)(s));
    c->lt = (void *)h;
    L3D_CU_CHECK(dev, cudaMalloc(&c->workspace, WORKSPACE_BYTES), "gemm workspace");
    c->workspace_bytes = WORKSPACE_BYTES;
    return L3D_OK;
}

extern "C" void l3d_cuda_gemm_fini(l3d_device_t *dev) {
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    if (!c->lt_api) return;
    if (c->lt) LT(cublasLtDestroy)((cublasLtHandle_t)c->lt);
    if (c->workspace) cudaFree(c->workspace);
    l3d_free(dev->ctx, c->plans, (size_t)c->cap_plans * sizeof(*c->plans), "other");
    c->lt = c->workspace = NULL;
    c->plans = NULL;
    c->nplans = c->cap_plans = 0;
    dlclose(c->lt_api->lib);
    l3d_free(dev->ctx, c->lt_api, sizeof(*c->lt_api), "other");
    c->lt_api = NULL;
}

static cudaDataType_t lt_type(l3d_dtype t) {
    return t == L3D_BFLOAT16 ? CUDA_R_16BF : t == L3D_FLOAT16 ? CUDA_R_16F : CUDA_R_32F;
}

// One cuBLASLt matmul for a supported mix (a_type == b_type; C float32 or that type).
static l3d_status lt_matmul(l3d_device_t *dev, const l3d_gemm_t *g) {
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    cublasLtHandle_t h = (cublasLtHandle_t)c->lt;
    int batch = g->batch > 1 ? g->batch : 1;
    cublasOperation_t opa = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
    cublasOperation_t opb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t ar = g->trans_b ? g->K : g->N, ac = g->trans_b ? g->N : g->K;
    uint64_t br = g->trans_a ? g->M : g->K, bc = g->trans_a ? g->K : g->M;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    l3d_status st = L3D_OK;
    int32_t bcount = batch;
    int64_t sa = (int64_t)g->stride_b, sb = (int64_t)g->stride_a, sc = (int64_t)g->stride_c;
    int f32 = g->a_type == L3D_FLOAT32 && g->b_type == L3D_FLOAT32;
    cublasComputeType_t ct = c->tf32 && f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    LT_CHECK(dev, LT(cublasLtMatmulDescCreate)(&op, ct, CUDA_R_32F), "desc");
    LT_CHECK(dev,
             LT(cublasLtMatmulDescSetAttribute)(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)),
             "transa");
    LT_CHECK(dev,
             LT(cublasLtMatmulDescSetAttribute)(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)),
             "transb");
    LT_CHECK(dev, LT(cublasLtMatrixLayoutCreate)(&la, lt_type(g->b_type), ar, ac, g->ldb),
             "layout B");
    LT_CHECK(dev, LT(cublasLtMatrixLayoutCreate)(&lb, lt_type(g->a_type), br, bc, g->lda),
             "layout A");
    LT_CHECK(dev, LT(cublasLtMatrixLayoutCreate)(&lc, lt_type(g->c_type), g->N, g->M, g->ldc),
             "layout C");
    if (batch > 1) {
        cublasLtMatrixLayout_t ls[3] = {la, lb, lc};
        int64_t str[3] = {sa, sb, sc};
        for (int i = 0; i < 3; i++) {
            LT_CHECK(dev,
                     LT(cublasLtMatrixLayoutSetAttribute)(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                          &bcount, sizeof(bcount)),
                     "batch");
            LT_CHECK(
                dev,
                LT(cublasLtMatrixLayoutSetAttribute)(
                    ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &str[i], sizeof(str[i])),
                "batch stride");
        }
    }
    {
        // the shape's algorithm: cached, or the heuristic's first
        int key[14] = {
            g->trans_a,      g->trans_b, g->M,  g->N,           g->K,           g->lda,
            g->ldb,          g->ldc,     batch, (int)g->a_type, (int)g->b_type, (int)g->c_type,
            g->beta != 0.0f, 0};
        size_t strides[3] = {g->stride_a, g->stride_b, g->stride_c};
        l3d_cuda_plan_t *plan = NULL;
        for (int i = 0; i < c->nplans && !plan; i++)
            if (!memcmp(c->plans[i].key, key, sizeof(key)) &&
                !memcmp(c->plans[i].strides, strides, sizeof(strides)))
                plan = &c->plans[i];
        if (!plan) {
            cublasLtMatmulPreference_t pref = NULL;
            cublasLtMatmulHeuristicResult_t res;
            int found = 0;
            size_t ws = c->workspace_bytes;
            LT_CHECK(dev, LT(cublasLtMatmulPreferenceCreate)(&pref), "preference");
            cublasStatus_t s1 = LT(cublasLtMatmulPreferenceSetAttribute)(
                pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
            cublasStatus_t s2 = s1 == CUBLAS_STATUS_SUCCESS
                                    ? LT(cublasLtMatmulAlgoGetHeuristic)(h, op, la, lb, lc, lc,
                                                                         pref, 1, &res, &found)
                                    : s1;
            LT(cublasLtMatmulPreferenceDestroy)(pref);
            LT_CHECK(dev, s2, "heuristic");
            if (!found) {
                st = l3d_error(dev->ctx, L3D_ERR_UNSUPPORTED,
                               "cublasLt: no algorithm for a %dx%dx%d "
                               "gemm of %s x %s -> %s",
                               g->M, g->N, g->K, l3d_dtype_name(g->a_type),
                               l3d_dtype_name(g->b_type), l3d_dtype_name(g->c_type));
                goto done;
            }
            if (c->nplans == c->cap_plans) {
                int cap = c->cap_plans ? 2 * c->cap_plans : 64;
                size_t sz = sizeof(*c->plans);
                void *p = l3d_malloc(dev->ctx, (size_t)cap * sz, "other");
                if (!p) {
                    st = L3D_ERR_NOMEM;
                    goto done;
                }
                if (c->nplans) memcpy(p, c->plans, (size_t)c->nplans * sz);
                l3d_free(dev->ctx, c->plans, (size_t)c->cap_plans * sz, "other");
                c->plans = (l3d_cuda_plan_t *)p;
                c->cap_plans = cap;
            }
            plan = &c->plans[c->nplans++];
            memcpy(plan->key, key, sizeof(key));
            memcpy(plan->strides, strides, sizeof(strides));
            plan->algo = res.algo;
        }
        // beta 0 never reads C (cuBLASLt does not, with beta 0)
        LT_CHECK(
            dev,
            LT(cublasLtMatmul)(h, op, &g->alpha, g->B, la, g->A, lb, &g->beta, g->C, lc, g->C, lc,
                               &plan->algo, c->workspace, c->workspace_bytes, l3d_cuda_stream(dev)),
            "matmul");
    }
done:
    if (lc) LT(cublasLtMatrixLayoutDestroy)(lc);
    if (lb) LT(cublasLtMatrixLayoutDestroy)(lb);
    if (la) LT(cublasLtMatrixLayoutDestroy)(la);
    if (op) LT(cublasLtMatmulDescDestroy)(op);
    return st;
}

// Elements an operand of `rows` x `cols` stored with row stride ld spans, over the batch.
static size_t span(int rows, int ld, int batch, size_t stride) {
    size_t one = rows ? (size_t)(rows - 1) * (size_t)ld + (size_t)ld : 0;
    return batch > 1 ? (size_t)(batch - 1) * stride + one : one;
}

extern "C" l3d_status l3d_cuda_gemm(l3d_device_t *dev, const l3d_gemm_t *g) {
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "gemm", "A", g->a_type));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "gemm", "B", g->b_type));
    L3D_CHECK(dev->ctx, l3d_cuda_dtype_check(dev, "gemm", "C", g->c_type));
    if (g->M < 0 || g->N < 0 || g->K < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "gemm: bad shape %d x %d x %d", g->M, g->N,
                         g->K);
    if (!g->M || !g->N) return L3D_OK;
    if (!g->K) {  // C = beta C
        int batch = g->batch > 1 ? g->batch : 1;
        for (int b = 0; b < batch; b++)
            for (int r = 0; r < g->M; r++) {
                void *row = (char *)g->C +
                            ((size_t)b * g->stride_c * (batch > 1) + (size_t)r * (size_t)g->ldc) *
                                l3d_dtype_size(g->c_type);
                if (g->beta == 0.0f)
                    L3D_CU_CHECK(dev,
                                 cudaMemsetAsync(row, 0, (size_t)g->N * l3d_dtype_size(g->c_type),
                                                 l3d_cuda_stream(dev)),
                                 "gemm");
                else
                    L3D_CHECK(dev->ctx, l3d_cuda_scale(dev, row, g->beta, (size_t)g->N, g->c_type));
            }
        return L3D_OK;
    }
    // round_a: a float32 A against 16-bit weights, rounded to their dtype (the same rounding
    // as every convert) and multiplied on the tensor cores as a 16-bit pair, as the CPU device
    // multiplies on AVX512-BF16 and AMX.
    if (g->round_a && g->a_type == L3D_FLOAT32 && g->b_type != L3D_FLOAT32 &&
        g->c_type == L3D_FLOAT32) {
        int nbatch = g->batch > 1 ? g->batch : 1;
        size_t na = span(g->trans_a ? g->K : g->M, g->lda, nbatch, g->stride_a);
        void *a16;
        L3D_CHECK(dev->ctx, l3d_cuda_scratch(dev, na * l3d_dtype_size(g->b_type), &a16));
        L3D_CHECK(dev->ctx, l3d_cuda_convert(dev, a16, g->b_type, g->A, L3D_FLOAT32, na));
        l3d_gemm_t r = *g;
        r.A = a16, r.a_type = g->b_type;
        return lt_matmul(dev, &r);
    }
    int same = g->a_type == g->b_type;
    int direct = same && (g->c_type == g->a_type || g->c_type == L3D_FLOAT32);
    if (direct) return lt_matmul(dev, g);
    // Another mix: float32 copies of the 16-bit operands (scratch), one float32 GEMM, C rounded
    // once into its dtype.
    int batch = g->batch > 1 ? g->batch : 1;
    size_t na = span(g->trans_a ? g->K : g->M, g->lda, batch, g->stride_a);
    size_t nb = span(g->trans_b ? g->N : g->K, g->ldb, batch, g->stride_b);
    size_t nc = span(g->M, g->ldc, batch, g->stride_c);
    size_t wa = g->a_type != L3D_FLOAT32 ? na : 0, wb = g->b_type != L3D_FLOAT32 ? nb : 0;
    size_t wc = g->c_type != L3D_FLOAT32 ? nc : 0;
    void *scr;
    L3D_CHECK(dev->ctx, l3d_cuda_scratch(dev, (wa + wb + wc) * sizeof(float), &scr));
    float *fa = (float *)scr, *fb = fa + wa, *fc = fb + wb;
    l3d_gemm_t w = *g;
    if (wa) L3D_CHECK(dev->ctx, l3d_cuda_convert(dev, fa, L3D_FLOAT32, g->A, g->a_type, na));
    if (wb) L3D_CHECK(dev->ctx, l3d_cuda_convert(dev, fb, L3D_FLOAT32, g->B, g->b_type, nb));
    // (C widened whole, beta 0 too: the span's elements outside the M x N product, other
    // columns of a wider matrix, go back with the same bits)
    if (wc) L3D_CHECK(dev->ctx, l3d_cuda_convert(dev, fc, L3D_FLOAT32, g->C, g->c_type, nc));
    if (wa) w.A = fa, w.a_type = L3D_FLOAT32;
    if (wb) w.B = fb, w.b_type = L3D_FLOAT32;
    if (wc) w.C = fc, w.c_type = L3D_FLOAT32;
    L3D_CHECK(dev->ctx, lt_matmul(dev, &w));
    if (wc) L3D_CHECK(dev->ctx, l3d_cuda_convert(dev, g->C, g->c_type, fc, L3D_FLOAT32, nc));
    return L3D_OK;
}
