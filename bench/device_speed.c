// A device's speed where issue 28 sets goals, in bfloat16 at Llama 3.2 1B's shapes: cuBLASLt
// (or OpenBLAS) GEMM TFLOP/s for the layer's and the head's products; causal attention forward
// and backward TFLOP/s at head dims 64 and 128 and 2K / 4K tokens; each memory-bound kernel's
// bandwidth as a fraction of a device-to-device copy timed in the same run; and the chip's
// 16-bit roof from the device's table when it has one. Best of REPS after a warm-up, each run
// waited for (sync), timed on the host.
// Usage: bench_device_speed [--device NAME] [--small]
//   --device  cuda (default when built and a GPU answers), cpu, ...
//   --small   shapes 16x smaller per dimension (the CPU, or a smoke run)
// Goals (issue 28): GEMM >= 600 TFLOP/s; attention forward >= 250, backward >= 180 at head
// dim 128; memory-bound kernels >= 70% of the copy; tools/gpu-check.sh runs it.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "platform/platform.h"

#define REPS 5
static l3d_device_t *dev;
static const l3d_dtype BF = L3D_BFLOAT16;

static void *dalloc(size_t bytes) {
    void *p = NULL;
    if (l3d_dev_alloc(dev, bytes, "other", &p) != L3D_OK) {
        fprintf(stderr, "bench_device_speed: allocating %zu bytes failed\n", bytes);
        exit(1);
    }
    // (a defined pattern: small bfloat16 values, no NaN, for ops that read what they time)
    if (l3d_dev_memset(dev, p, 0x3c, bytes) != L3D_OK) exit(1);
    return p;
}

typedef l3d_status (*run_fn)(void *arg);

// Best seconds of REPS runs after one warm-up.
static double best_of(run_fn f, void *arg) {
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = l3d_time_now();
        if (f(arg) != L3D_OK || l3d_dev_sync(dev) != L3D_OK) {
            fprintf(stderr, "bench_device_speed: %s\n", l3d_ctx_last_error(dev->ctx));
            exit(1);
        }
        double t = l3d_time_now() - t0;
        if (r && t < best) best = t;
    }
    return best;
}

// ---- GEMM -------------------------------------------------------------------------------------
typedef struct {
    l3d_gemm_t g;
} gemm_arg_t;
static l3d_status run_gemm(void *a) { return l3d_dev_gemm(dev, &((gemm_arg_t *)a)->g); }

// y(M,N) = x(M,K) W(N,K)^T, bfloat16 in and out
static void gemm_row(const char *what, int M, int N, int K) {
    gemm_arg_t a = {{.trans_b = 1, .M = M, .N = N, .K = K, .alpha = 1.0f, .lda = K, .ldb = K,
                     .ldc = N, .a_type = BF, .b_type = BF, .c_type = BF}};
    a.g.A = dalloc((size_t)M * K * 2), a.g.B = dalloc((size_t)N * K * 2);
    a.g.C = dalloc((size_t)M * N * 2);
    double t = best_of(run_gemm, &a);
    printf("| gemm %s | %dx%dx%d | %.3f ms | %.4g TFLOP/s |\n", what, M, N, K, t * 1e3,
           2.0 * M * N * K / t / 1e12);
    l3d_dev_free(dev, (void *)a.g.A, (size_t)M * K * 2, "other");
    l3d_dev_free(dev, (void *)a.g.B, (size_t)N * K * 2, "other");
    l3d_dev_free(dev, a.g.C, (size_t)M * N * 2, "other");
}

// ---- attention --------------------------------------------------------------------------------
typedef struct {
    l3d_attn_dims_t d;
    void *q, *k, *v, *o, *dq, *dk, *dv;
    float *lse;
} attn_arg_t;
static l3d_status run_fwd(void *p) {
    attn_arg_t *a = p;
    return l3d_dev_attention_fwd(dev, a->o, a->lse, a->q, a->k, a->v, &a->d, BF);
}
static l3d_status run_bwd(void *p) {
    attn_arg_t *a = p;
    return l3d_dev_attention_bwd(dev, a->dq, a->dk, a->dv, a->o, a->q, a->k, a->v, a->o, a->lse,
                                 &a->d, BF);
}

// Causal FLOPs (FlashAttention's count): forward 2 products of B H T^2 D multiply-adds, half
// of them masked: 2 B H T^2 D; backward 2.5 times that.
static void attn_rows(int B, int T, int H, int KVH, int D) {
    attn_arg_t a = {.d = {B, T, T, H, KVH, D, 0}};
    size_t nq = (size_t)B * T * H * D * 2, nkv = (size_t)B * T * KVH * D * 2;
    a.q = dalloc(nq), a.o = dalloc(nq), a.dq = dalloc(nq);
    a.k = dalloc(nkv), a.v = dalloc(nkv), a.dk = dalloc(nkv), a.dv = dalloc(nkv);
    a.lse = dalloc((size_t)B * H * T * 4);
    double flops = 2.0 * B * H * (double)T * T * D;
    double tf = best_of(run_fwd, &a), tb = best_of(run_bwd, &a);
    printf("| attention fwd | B %d T %d H %d/%d D %d | %.3f ms | %.4g TFLOP/s |\n", B, T, H, KVH,
           D, tf * 1e3, flops / tf / 1e12);
    printf("| attention bwd | B %d T %d H %d/%d D %d | %.3f ms | %.4g TFLOP/s |\n", B, T, H, KVH,
           D, tb * 1e3, 2.5 * flops / tb / 1e12);
    void *ps[7] = {a.q, a.o, a.dq, a.k, a.v, a.dk, a.dv};
    size_t sz[7] = {nq, nq, nq, nkv, nkv, nkv, nkv};
    for (int i = 0; i < 7; i++) l3d_dev_free(dev, ps[i], sz[i], "other");
    l3d_dev_free(dev, a.lse, (size_t)B * H * T * 4, "other");
}

// ---- memory-bound kernels against a copy ------------------------------------------------------
typedef struct {
    int op;
    size_t n;  // elements
    int rows, cols;
    void *a, *b, *c, *w;
    float *rstd;
} mem_arg_t;
static l3d_status run_mem(void *p) {
    mem_arg_t *m = p;
    switch (m->op) {
    case 0: return l3d_dev_copy(dev, m->c, m->a, m->n * 2, L3D_COPY_D2D);
    case 1: return l3d_dev_add(dev, m->c, m->a, m->b, m->n, BF);
    case 2: return l3d_dev_swiglu_fwd(dev, m->c, m->a, m->b, m->n, BF);
    case 3: return l3d_dev_rmsnorm_fwd(dev, m->c, m->rstd, m->a, m->w, m->rows, m->cols, 1e-5f, BF, BF);
    case 4: return l3d_dev_convert(dev, m->c, BF, m->a, L3D_FLOAT32, m->n / 2);
    default: return L3D_ERR_INVALID_ARG;
    }
}

int main(int argc, char **argv) {
    const char *name = NULL;
    int small = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) name = argv[++i];
        else if (!strcmp(argv[i], "--small")) small = 1;
        else {
            fprintf(stderr, "usage: bench_device_speed [--device NAME] [--small]\n");
            return 2;
        }
    }
    l3d_ctx_t *ctx;
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK) return 1;
    if (!name) name = l3d_device_create(ctx, "cuda", NULL, &dev) == L3D_OK ? "cuda" : "cpu";
    if (!dev && l3d_device_create(ctx, name, NULL, &dev) != L3D_OK) {
        fprintf(stderr, "bench_device_speed: device %s: %s\n", name, l3d_ctx_last_error(ctx));
        return 2;
    }
    int s = small ? 16 : 1;
    double roof = l3d_dev_peak_flops(dev, BF);
    printf("device %s, bfloat16%s; 16-bit roof %s\n\n", name, small ? " (--small shapes)" : "",
           roof > 0 ? "from the device's table" : "unknown");
    if (roof > 0) printf("roof: %.1f TFLOP/s\n\n", roof / 1e12);
    printf("| op | shape | best time | rate |\n|---|---|---|---|\n");
    // Llama 3.2 1B: hidden 2048, ffn 8192, 32 heads / 8 kv heads of 64, vocab 128256; a
    // micro-batch of 4096 tokens
    int tok = 4096 / s, Cm = 2048 / s, Fm = 8192 / s, Vm = 128256 / s;
    gemm_row("qo (x Wq^T)", tok, Cm, Cm);
    gemm_row("gate/up", tok, Fm, Cm);
    gemm_row("down", tok, Cm, Fm);
    gemm_row("head", tok, Vm, Cm);
    int H = 32 / (small ? 4 : 1), KVH = 8 / (small ? 4 : 1);
    for (int D = 64; D <= 128; D *= 2)
        for (int T = 2048; T <= 4096; T *= 2) attn_rows(1, T / s, D == 64 ? H : H / 2, KVH, D);
    // memory-bound, 64M bfloat16 elements (128 MiB per operand)
    size_t n = ((size_t)64 << 20) / (size_t)(s * s);
    mem_arg_t m = {.n = n, .rows = (int)(n / (size_t)Cm), .cols = Cm};
    m.a = dalloc(n * 2), m.b = dalloc(n * 2), m.c = dalloc(n * 2), m.w = dalloc((size_t)Cm * 2);
    m.rstd = dalloc((size_t)m.rows * 4);
    static const char *names[5] = {"copy D2D", "add", "swiglu_fwd", "rmsnorm_fwd",
                                   "convert f32->bf16"};
    // bytes moved: copy 2 (read, write), add and swiglu 3, rmsnorm 2 (w and rstd apart),
    // convert 4 + 2 per output element (n/2 of them)
    double bytes[5] = {2.0 * n * 2, 3.0 * n * 2, 3.0 * n * 2, 2.0 * n * 2, (4.0 + 2.0) * n / 2};
    double copy_bw = 0;
    for (int op = 0; op < 5; op++) {
        m.op = op;
        double t = best_of(run_mem, &m), bw = bytes[op] / t;
        if (!op) copy_bw = bw;
        printf("| %s | %zu elements | %.3f ms | %.1f GB/s = %.2f of the copy |\n", names[op], n,
               t * 1e3, bw / 1e9, bw / copy_bw);
    }
    l3d_dev_free(dev, m.a, n * 2, "other");
    l3d_dev_free(dev, m.b, n * 2, "other");
    l3d_dev_free(dev, m.c, n * 2, "other");
    l3d_dev_free(dev, m.w, (size_t)Cm * 2, "other");
    l3d_dev_free(dev, m.rstd, (size_t)m.rows * 4, "other");
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
    return 0;
}
