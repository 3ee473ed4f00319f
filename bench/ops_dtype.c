// The CPU device's ops on float32, bfloat16 and float16 tensors (device ABI 5), side by side:
// the same op and shape in each dtype, best of 5 runs, and the 16-bit times as ratios of the
// float32 one. The CPU device computes in float32 and widens 16-bit operands on the way in
// (devices/cpu/cpu.h says how per op), so the ratios price those conversions against the
// halved bytes; a device with 16-bit arithmetic (CUDA) is where 16-bit pays.
// Usage: bench_ops_dtype [threads] (default: all cores). Prints a markdown table (bench/README.md
// shows it; tests/cli_docs.sh compares its header and rows with a run).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "platform/platform.h"

#define REPS 5
enum { NT = 3 };
static const l3d_dtype T[NT] = {L3D_FLOAT32, L3D_BFLOAT16, L3D_FLOAT16};

// Model-like sizes (a 1B-class layer's width, a 512-token sequence).
enum { N = 1024, C = 1024, F = 2816, V = 32000, XN = 64, B = 1, TT = 512, H = 16, KVH = 8,
       D = 64 };

static l3d_device_t *dev;
static uint64_t rng = 88172645463325252ull;

// n random values in [-amp, amp) stored as t.
static void *tensor(l3d_dtype t, size_t n, float amp) {
    float *f = malloc(n * sizeof(float));
    void *p = malloc(n * l3d_dtype_size(t));
    if (!f || !p) exit(1);
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        f[i] = amp * (float)((double)(rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
    if (l3d_dev_convert(dev, p, t, f, L3D_FLOAT32, n) != L3D_OK) exit(1);
    free(f);
    return p;
}

// Every operand one op reads or writes, in dtype t (float32 side buffers apart).
typedef struct {
    l3d_dtype t;
    void *x, *y, *z, *w, *g, *q, *k, *v, *o, *dq, *dk, *dv, *table, *dtable, *logits, *gate, *up;
    void *big;
    float *rstd, *lse, *losses, *cos_tab, *sin_tab, *p, *m, *vv;
    int32_t *tok;
} ops_t;

typedef l3d_status (*op_fn)(ops_t *o);

static l3d_status op_emb_fwd(ops_t *o) {
    return l3d_dev_embedding_fwd(dev, o->x, o->tok, o->table, N, C, V, o->t, o->t);
}
static l3d_status op_emb_bwd(ops_t *o) {
    return l3d_dev_embedding_bwd(dev, o->dtable, o->x, o->tok, N, C, o->t, o->t);
}
static l3d_status op_rms_fwd(ops_t *o) {
    return l3d_dev_rmsnorm_fwd(dev, o->y, o->rstd, o->x, o->w, N, C, 1e-5f, o->t, o->t);
}
static l3d_status op_rms_bwd(ops_t *o) {
    return l3d_dev_rmsnorm_bwd(dev, o->z, o->g, o->y, o->x, o->w, o->rstd, N, C, o->t, o->t, o->t);
}
static l3d_status op_rope(ops_t *o) {
    return l3d_dev_rope(dev, o->q, o->cos_tab, o->sin_tab, B, TT, H, D, 0, 0, o->t);
}
static l3d_status op_att_fwd(ops_t *o) {
    l3d_attn_dims_t d = {B, TT, TT, H, KVH, D, 0};
    return l3d_dev_attention_fwd(dev, o->o, o->lse, o->q, o->k, o->v, &d, o->t);
}
static l3d_status op_att_bwd(ops_t *o) {
    l3d_attn_dims_t d = {B, TT, TT, H, KVH, D, 0};
    return l3d_dev_attention_bwd(dev, o->dq, o->dk, o->dv, o->o, o->q, o->k, o->v, o->o, o->lse,
                                 &d, o->t);
}
static l3d_status op_swi_fwd(ops_t *o) {
    return l3d_dev_swiglu_fwd(dev, o->big, o->gate, o->up, (size_t)N * F, o->t);
}
static l3d_status op_swi_bwd(ops_t *o) {
    return l3d_dev_swiglu_bwd(dev, o->gate, o->up, o->big, o->gate, o->up, (size_t)N * F, o->t);
}
static l3d_status op_add(ops_t *o) {
    return l3d_dev_add(dev, o->z, o->x, o->y, (size_t)N * C, o->t);
}
static l3d_status op_xent(ops_t *o) {
    return l3d_dev_xent_fwd_bwd(dev, o->logits, o->losses, o->tok, XN, V, 1.0f / XN, o->t);
}
static l3d_status op_sumsq(ops_t *o) {
    double s;
    return l3d_dev_sumsq(dev, o->big, (size_t)N * F, &s, o->t);
}
static l3d_status op_adamw(ops_t *o) {
    return l3d_dev_adamw(dev, o->p, o->big, o->m, o->vv, (size_t)N * F, 1e-4f, 0.9f, 0.95f, 1e-8f,
                         0.1f, 0.1f, 0.05f, 1.0f, NULL, 0.0f, o->t);
}
static l3d_status op_gemm(ops_t *o) {
    l3d_gemm_t g = {.trans_b = 1, .M = N, .N = F, .K = C, .alpha = 1.0f, .A = o->x, .lda = C,
                    .B = o->gate, .ldb = C, .C = o->big, .ldc = F, .a_type = o->t, .b_type = o->t,
                    .c_type = o->t};
    return l3d_dev_gemm(dev, &g);
}

static void ops_init(ops_t *o, l3d_dtype t) {
    memset(o, 0, sizeof(*o));
    o->t = t;
    size_t nc = (size_t)N * C, nf = (size_t)N * F, nq = (size_t)B * TT * H * D,
           nk = (size_t)B * TT * KVH * D;
    o->x = tensor(t, nc, 2), o->y = tensor(t, nc, 1), o->z = tensor(t, nc, 1);
    o->w = tensor(t, C, 1), o->g = tensor(t, C, 1);
    o->q = tensor(t, nq, 1.5f), o->k = tensor(t, nk, 1.5f), o->v = tensor(t, nk, 1);
    o->o = tensor(t, nq, 1), o->dq = tensor(t, nq, 1), o->dk = tensor(t, nk, 1);
    o->dv = tensor(t, nk, 1);
    o->table = tensor(t, (size_t)V * C, 1), o->dtable = tensor(t, (size_t)V * C, 1);
    o->logits = tensor(t, (size_t)XN * V, 8);
    o->gate = tensor(t, nf, 4), o->up = tensor(t, nf, 2), o->big = tensor(t, nf, 1);
    o->rstd = tensor(L3D_FLOAT32, N, 1), o->losses = tensor(L3D_FLOAT32, XN, 1);
    o->lse = tensor(L3D_FLOAT32, (size_t)B * H * TT, 1);
    o->cos_tab = tensor(L3D_FLOAT32, (size_t)TT * D / 2, 1);
    o->sin_tab = tensor(L3D_FLOAT32, (size_t)TT * D / 2, 1);
    o->p = tensor(L3D_FLOAT32, nf, 1), o->m = tensor(L3D_FLOAT32, nf, 0.01f);
    o->vv = tensor(L3D_FLOAT32, nf, 0.01f);
    for (size_t i = 0; i < (size_t)nf; i++) o->vv[i] = o->vv[i] * o->vv[i];  // v >= 0
    o->tok = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) o->tok[i] = (int32_t)((i * 7919u) % V);
}

static double best_of(op_fn fn, ops_t *o) {
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = l3d_time_now();
        if (fn(o) != L3D_OK) {
            fprintf(stderr, "op failed: %s\n", l3d_ctx_last_error(dev->ctx));
            exit(1);
        }
        double t = l3d_time_now() - t0;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : l3d_num_cores();
    l3d_ctx_t *ctx;
    l3d_device_params_t p = {.num_threads = nt < 1 ? 1 : nt};
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK || l3d_device_create(ctx, "cpu", &p, &dev) != L3D_OK) {
        fprintf(stderr, "device setup failed\n");
        return 1;
    }
    static const struct {
        const char *name, *shape;
        op_fn fn;
    } ops[] = {
        {"gemm x W^T", "1024x2816x1024", op_gemm},
        {"embedding_fwd", "1024 rows of 32000x1024", op_emb_fwd},
        {"embedding_bwd", "1024 rows into 32000x1024", op_emb_bwd},
        {"rmsnorm_fwd", "1024x1024", op_rms_fwd},
        {"rmsnorm_bwd", "1024x1024", op_rms_bwd},
        {"rope", "512 tokens, 16 heads of 64", op_rope},
        {"attention_fwd", "T 512, H 16, KVH 8, D 64", op_att_fwd},
        {"attention_bwd", "T 512, H 16, KVH 8, D 64", op_att_bwd},
        {"swiglu_fwd", "1024x2816", op_swi_fwd},
        {"swiglu_bwd", "1024x2816", op_swi_bwd},
        {"add", "1024x1024", op_add},
        {"xent_fwd_bwd", "64 rows of 32000", op_xent},
        {"sumsq", "2.9M", op_sumsq},
        {"adamw (16-bit grad)", "2.9M", op_adamw},
    };
    ops_t o[NT];
    for (int i = 0; i < NT; i++) ops_init(&o[i], T[i]);
    printf("ms, best of %d, %d threads; ratios: 16-bit time / float32 time\n\n", REPS,
           dev->num_threads);
    printf("| op | shape | float32 | bfloat16 | float16 | bf16 / fp32 | fp16 / fp32 |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
        double ms[NT];
        for (int i = 0; i < NT; i++) ms[i] = 1e3 * best_of(ops[k].fn, &o[i]);
        printf("| %s | %s | %.3f | %.3f | %.3f | %.2f | %.2f |\n", ops[k].name, ops[k].shape,
               ms[0], ms[1], ms[2], ms[1] / ms[0], ms[2] / ms[0]);
    }
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
    return 0;
}
