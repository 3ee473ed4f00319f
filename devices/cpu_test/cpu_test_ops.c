// The test devices' op entries: each checks and untags its pointers on the caller's thread,
// captures its arguments by value (a struct the caller passes by pointer, like the GEMM
// descriptor, included: it may live on the caller's stack) and submits a runner that calls the
// CPU device's entry. cpu-opaque runs it at once, cpu-async when the host next waits.
#include <string.h>

#include "devices/cpu_test/cpu_test.h"

#define CPU l3d_cpu_device_ops
// The checks of one entry: DEV(p) for a device pointer, then CHECKED() returns on a bad one.
#define DEV(p) ((p) = l3d_ctest_untag(dev, &bad_, __func__ + 10, #p, (p)))
#define CHECKED()                                \
    do {                                         \
        if (bad_) return L3D_ERR_INVALID_ARG;    \
    } while (0)
#define SUBMIT(run, a) l3d_ctest_submit(dev, (run), &(a), sizeof(a))

// ---- gemm, convert --------------------------------------------------------------------------
static l3d_status run_gemm(l3d_device_t *cpu, const void *p) {
    return CPU.gemm(cpu, (const l3d_gemm_t *)p);
}
l3d_status l3d_ctest_gemm(l3d_device_t *dev, const l3d_gemm_t *g) {
    int bad_ = 0;
    l3d_gemm_t a = *g;
    DEV(a.A), DEV(a.B), DEV(a.C);
    CHECKED();
    return SUBMIT(run_gemm, a);
}

typedef struct {
    void *dst;
    const void *src;
    l3d_dtype dt, st;
    size_t n;
} convert_t;
static l3d_status run_convert(l3d_device_t *cpu, const void *p) {
    const convert_t *a = p;
    return CPU.convert(cpu, a->dst, a->dt, a->src, a->st, a->n);
}
l3d_status l3d_ctest_convert(l3d_device_t *dev, void *dst, l3d_dtype dst_type, const void *src,
                             l3d_dtype src_type, size_t n) {
    int bad_ = 0;
    DEV(dst), DEV(src);
    CHECKED();
    convert_t a = {dst, src, dst_type, src_type, n};
    return SUBMIT(run_convert, a);
}

// ---- embedding ------------------------------------------------------------------------------
typedef struct {
    void *out;
    const int32_t *tokens;
    const void *table;
    int N, C, V, v0, Vl;
    l3d_dtype at, wt;
} emb_fwd_t;
static l3d_status run_emb_fwd(l3d_device_t *cpu, const void *p) {
    const emb_fwd_t *a = p;
    return CPU.embedding_fwd(cpu, a->out, a->tokens, a->table, a->N, a->C, a->V, a->at, a->wt);
}
static l3d_status run_emb_fwd_vp(l3d_device_t *cpu, const void *p) {
    const emb_fwd_t *a = p;
    return CPU.embedding_fwd_vp(cpu, a->out, a->tokens, a->table, a->N, a->C, a->v0, a->Vl,
                                a->V, a->at, a->wt);
}
l3d_status l3d_ctest_embedding_fwd(l3d_device_t *dev, void *out, const int32_t *tokens,
                                   const void *table, int N, int C, int V, l3d_dtype at,
                                   l3d_dtype wt) {
    int bad_ = 0;
    DEV(out), DEV(tokens), DEV(table);
    CHECKED();
    emb_fwd_t a = {out, tokens, table, N, C, V, 0, 0, at, wt};
    return SUBMIT(run_emb_fwd, a);
}
l3d_status l3d_ctest_embedding_fwd_vp(l3d_device_t *dev, void *out, const int32_t *tokens,
                                      const void *table, int N, int C, int v0, int Vl, int V,
                                      l3d_dtype at, l3d_dtype wt) {
    int bad_ = 0;
    DEV(out), DEV(tokens), DEV(table);
    CHECKED();
    emb_fwd_t a = {out, tokens, table, N, C, V, v0, Vl, at, wt};
    return SUBMIT(run_emb_fwd_vp, a);
}

typedef struct {
    void *dtable;
    const void *dout;
    const int32_t *tokens;
    int N, C, v0, Vl;
    l3d_dtype at, gt;
} emb_bwd_t;
static l3d_status run_emb_bwd(l3d_device_t *cpu, const void *p) {
    const emb_bwd_t *a = p;
    return CPU.embedding_bwd(cpu, a->dtable, a->dout, a->tokens, a->N, a->C, a->at, a->gt);
}
static l3d_status run_emb_bwd_vp(l3d_device_t *cpu, const void *p) {
    const emb_bwd_t *a = p;
    return CPU.embedding_bwd_vp(cpu, a->dtable, a->dout, a->tokens, a->N, a->C, a->v0, a->Vl,
                                a->at, a->gt);
}
l3d_status l3d_ctest_embedding_bwd(l3d_device_t *dev, void *dtable, const void *dout,
                                   const int32_t *tokens, int N, int C, l3d_dtype at,
                                   l3d_dtype gt) {
    int bad_ = 0;
    DEV(dtable), DEV(dout), DEV(tokens);
    CHECKED();
    emb_bwd_t a = {dtable, dout, tokens, N, C, 0, 0, at, gt};
    return SUBMIT(run_emb_bwd, a);
}
l3d_status l3d_ctest_embedding_bwd_vp(l3d_device_t *dev, void *dtable, const void *dout,
                                      const int32_t *tokens, int N, int C, int v0, int Vl,
                                      l3d_dtype at, l3d_dtype gt) {
    int bad_ = 0;
    DEV(dtable), DEV(dout), DEV(tokens);
    CHECKED();
    emb_bwd_t a = {dtable, dout, tokens, N, C, v0, Vl, at, gt};
    return SUBMIT(run_emb_bwd_vp, a);
}

// ---- RMSNorm --------------------------------------------------------------------------------
typedef struct {
    void *out;  // fwd: out; bwd: dx
    void *dw;
    float *rstd_out;
    const void *x, *w, *dout;
    const float *rstd, *ss;  // ss: rows_fwd's sums, rows_bwd's dots
    int N, C, C_full;
    float eps;
    l3d_dtype at, wt, gt;
} norm_t;
static l3d_status run_norm_fwd(l3d_device_t *cpu, const void *p) {
    const norm_t *a = p;
    return CPU.rmsnorm_fwd(cpu, a->out, a->rstd_out, a->x, a->w, a->N, a->C, a->eps, a->at,
                           a->wt);
}
static l3d_status run_norm_bwd(l3d_device_t *cpu, const void *p) {
    const norm_t *a = p;
    return CPU.rmsnorm_bwd(cpu, a->out, a->dw, a->dout, a->x, a->w, a->rstd, a->N, a->C, a->at,
                           a->wt, a->gt);
}
static l3d_status run_rows_fwd(l3d_device_t *cpu, const void *p) {
    const norm_t *a = p;
    return CPU.rmsnorm_rows_fwd(cpu, a->out, a->rstd_out, a->x, a->w, a->ss, a->N, a->C,
                                a->C_full, a->eps, a->at, a->wt);
}
static l3d_status run_rows_bwd(l3d_device_t *cpu, const void *p) {
    const norm_t *a = p;
    return CPU.rmsnorm_rows_bwd(cpu, a->out, a->dw, a->dout, a->x, a->w, a->rstd, a->ss, a->N,
                                a->C, a->C_full, a->at, a->wt, a->gt);
}
static l3d_status run_rowdot(l3d_device_t *cpu, const void *p) {
    const norm_t *a = p;  // out: rstd_out; a: x; b: dout
    return CPU.rmsnorm_rowdot(cpu, a->rstd_out, a->x, a->dout, a->w, a->N, a->C, a->at, a->wt);
}
l3d_status l3d_ctest_rmsnorm_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                 const void *w, int N, int C, float eps, l3d_dtype at,
                                 l3d_dtype wt) {
    int bad_ = 0;
    DEV(out), DEV(rstd), DEV(x), DEV(w);
    CHECKED();
    norm_t a = {.out = out, .rstd_out = rstd, .x = x, .w = w, .N = N, .C = C, .eps = eps,
                .at = at, .wt = wt};
    return SUBMIT(run_norm_fwd, a);
}
l3d_status l3d_ctest_rmsnorm_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                 const void *x, const void *w, const float *rstd, int N, int C,
                                 l3d_dtype at, l3d_dtype wt, l3d_dtype gt) {
    int bad_ = 0;
    DEV(dx), DEV(dw), DEV(dout), DEV(x), DEV(w), DEV(rstd);
    CHECKED();
    norm_t a = {.out = dx, .dw = dw, .dout = dout, .x = x, .w = w, .rstd = rstd, .N = N, .C = C,
                .at = at, .wt = wt, .gt = gt};
    return SUBMIT(run_norm_bwd, a);
}
l3d_status l3d_ctest_rmsnorm_rowdot(l3d_device_t *dev, float *out, const void *a_, const void *b,
                                    const void *w, int N, int C, l3d_dtype at, l3d_dtype wt) {
    int bad_ = 0;
    DEV(out), DEV(a_), DEV(b), DEV(w);
    CHECKED();
    norm_t a = {.rstd_out = out, .x = a_, .dout = b, .w = w, .N = N, .C = C, .at = at, .wt = wt};
    return SUBMIT(run_rowdot, a);
}
l3d_status l3d_ctest_rmsnorm_rows_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                      const void *w, const float *ss, int N, int C, int C_full,
                                      float eps, l3d_dtype at, l3d_dtype wt) {
    int bad_ = 0;
    DEV(out), DEV(rstd), DEV(x), DEV(w), DEV(ss);
    CHECKED();
    norm_t a = {.out = out, .rstd_out = rstd, .x = x, .w = w, .ss = ss, .N = N, .C = C,
                .C_full = C_full, .eps = eps, .at = at, .wt = wt};
    return SUBMIT(run_rows_fwd, a);
}
l3d_status l3d_ctest_rmsnorm_rows_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                      const void *x, const void *w, const float *rstd,
                                      const float *dot, int N, int C, int C_full, l3d_dtype at,
                                      l3d_dtype wt, l3d_dtype gt) {
    int bad_ = 0;
    DEV(dx), DEV(dw), DEV(dout), DEV(x), DEV(w), DEV(rstd), DEV(dot);
    CHECKED();
    norm_t a = {.out = dx, .dw = dw, .dout = dout, .x = x, .w = w, .rstd = rstd, .ss = dot,
                .N = N, .C = C, .C_full = C_full, .at = at, .wt = wt, .gt = gt};
    return SUBMIT(run_rows_bwd, a);
}

// ---- RoPE, attention ------------------------------------------------------------------------
typedef struct {
    void *x;
    const float *cos_tab, *sin_tab;
    int B, T, NH, D, pos0, inverse;
    l3d_dtype at;
} rope_t;
static l3d_status run_rope(l3d_device_t *cpu, const void *p) {
    const rope_t *a = p;
    return CPU.rope(cpu, a->x, a->cos_tab, a->sin_tab, a->B, a->T, a->NH, a->D, a->pos0,
                    a->inverse, a->at);
}
l3d_status l3d_ctest_rope(l3d_device_t *dev, void *x, const float *cos_tab, const float *sin_tab,
                          int B, int T, int NH, int D, int pos0, int inverse, l3d_dtype at) {
    int bad_ = 0;
    DEV(x), DEV(cos_tab), DEV(sin_tab);
    CHECKED();
    rope_t a = {x, cos_tab, sin_tab, B, T, NH, D, pos0, inverse, at};
    return SUBMIT(run_rope, a);
}

typedef struct {
    void *out, *dk, *dv;  // fwd: out; bwd: out = dq
    float *lse_out;
    const void *q, *k, *v, *dout, *fwd_out;
    const float *lse;
    l3d_attn_dims_t d;
    l3d_dtype at;
} attn_t;
static l3d_status run_attn_fwd(l3d_device_t *cpu, const void *p) {
    const attn_t *a = p;
    return CPU.attention_fwd(cpu, a->out, a->lse_out, a->q, a->k, a->v, &a->d, a->at);
}
static l3d_status run_attn_bwd(l3d_device_t *cpu, const void *p) {
    const attn_t *a = p;
    return CPU.attention_bwd(cpu, a->out, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->fwd_out,
                             a->lse, &a->d, a->at);
}
l3d_status l3d_ctest_attention_fwd(l3d_device_t *dev, void *out, float *lse, const void *q,
                                   const void *k, const void *v, const l3d_attn_dims_t *d,
                                   l3d_dtype at) {
    int bad_ = 0;
    DEV(out), DEV(lse), DEV(q), DEV(k), DEV(v);
    CHECKED();
    attn_t a = {.out = out, .lse_out = lse, .q = q, .k = k, .v = v, .d = *d, .at = at};
    return SUBMIT(run_attn_fwd, a);
}
l3d_status l3d_ctest_attention_bwd(l3d_device_t *dev, void *dq, void *dk, void *dv,
                                   const void *dout, const void *q, const void *k, const void *v,
                                   const void *out, const float *lse, const l3d_attn_dims_t *d,
                                   l3d_dtype at) {
    int bad_ = 0;
    DEV(dq), DEV(dk), DEV(dv), DEV(dout), DEV(q), DEV(k), DEV(v), DEV(out), DEV(lse);
    CHECKED();
    attn_t a = {.out = dq, .dk = dk, .dv = dv, .dout = dout, .q = q, .k = k, .v = v,
                .fwd_out = out, .lse = lse, .d = *d, .at = at};
    return SUBMIT(run_attn_bwd, a);
}

// ---- elementwise ----------------------------------------------------------------------------
typedef struct {
    void *out, *out2;  // swiglu_bwd: dgate, dup
    const void *a, *b, *c;
    size_t n;
    float s;
    l3d_dtype at;
} ew_t;
static l3d_status run_swiglu_fwd(l3d_device_t *cpu, const void *p) {
    const ew_t *e = p;
    return CPU.swiglu_fwd(cpu, e->out, e->a, e->b, e->n, e->at);
}
static l3d_status run_swiglu_bwd(l3d_device_t *cpu, const void *p) {
    const ew_t *e = p;  // a: dout, b: gate, c: up
    return CPU.swiglu_bwd(cpu, e->out, e->out2, e->a, e->b, e->c, e->n, e->at);
}
static l3d_status run_add(l3d_device_t *cpu, const void *p) {
    const ew_t *e = p;
    return CPU.add(cpu, e->out, e->a, e->b, e->n, e->at);
}
static l3d_status run_scale(l3d_device_t *cpu, const void *p) {
    const ew_t *e = p;
    return CPU.scale(cpu, e->out, e->s, e->n, e->at);
}
l3d_status l3d_ctest_swiglu_fwd(l3d_device_t *dev, void *out, const void *gate, const void *up,
                                size_t n, l3d_dtype at) {
    int bad_ = 0;
    DEV(out), DEV(gate), DEV(up);
    CHECKED();
    ew_t a = {.out = out, .a = gate, .b = up, .n = n, .at = at};
    return SUBMIT(run_swiglu_fwd, a);
}
l3d_status l3d_ctest_swiglu_bwd(l3d_device_t *dev, void *dgate, void *dup, const void *dout,
                                const void *gate, const void *up, size_t n, l3d_dtype at) {
    int bad_ = 0;
    DEV(dgate), DEV(dup), DEV(dout), DEV(gate), DEV(up);
    CHECKED();
    ew_t a = {.out = dgate, .out2 = dup, .a = dout, .b = gate, .c = up, .n = n, .at = at};
    return SUBMIT(run_swiglu_bwd, a);
}
l3d_status l3d_ctest_add(l3d_device_t *dev, void *out, const void *a_, const void *b, size_t n,
                         l3d_dtype at) {
    int bad_ = 0;
    DEV(out), DEV(a_), DEV(b);
    CHECKED();
    ew_t a = {.out = out, .a = a_, .b = b, .n = n, .at = at};
    return SUBMIT(run_add, a);
}
l3d_status l3d_ctest_scale(l3d_device_t *dev, void *x, float s, size_t n, l3d_dtype at) {
    int bad_ = 0;
    DEV(x);
    CHECKED();
    ew_t a = {.out = x, .s = s, .n = n, .at = at};
    return SUBMIT(run_scale, a);
}

// ---- cross-entropy --------------------------------------------------------------------------
typedef struct {
    void *logits;
    float *losses, *stats;  // stats: xent_vp_max's rowmax, xent_vp_stats's stats
    const int32_t *targets;
    const float *gmax, *gstats;
    int N, V, v0;  // V: the row length (Vl for the split forms)
    float grad_scale;
    l3d_dtype at;
} xent_t;
static l3d_status run_xent(l3d_device_t *cpu, const void *p) {
    const xent_t *a = p;
    return CPU.xent_fwd_bwd(cpu, a->logits, a->losses, a->targets, a->N, a->V, a->grad_scale,
                            a->at);
}
static l3d_status run_xent_max(l3d_device_t *cpu, const void *p) {
    const xent_t *a = p;
    return CPU.xent_vp_max(cpu, a->logits, a->stats, a->N, a->V, a->at);
}
static l3d_status run_xent_stats(l3d_device_t *cpu, const void *p) {
    const xent_t *a = p;
    return CPU.xent_vp_stats(cpu, a->logits, a->gmax, a->targets, a->N, a->V, a->v0, a->stats,
                             a->at);
}
static l3d_status run_xent_grad(l3d_device_t *cpu, const void *p) {
    const xent_t *a = p;
    return CPU.xent_vp_grad(cpu, a->logits, a->losses, a->gmax, a->gstats, a->targets, a->N,
                            a->V, a->v0, a->grad_scale, a->at);
}
l3d_status l3d_ctest_xent_fwd_bwd(l3d_device_t *dev, void *logits, float *losses,
                                  const int32_t *targets, int N, int V, float grad_scale,
                                  l3d_dtype at) {
    int bad_ = 0;
    DEV(logits), DEV(losses), DEV(targets);
    CHECKED();
    xent_t a = {.logits = logits, .losses = losses, .targets = targets, .N = N, .V = V,
                .grad_scale = grad_scale, .at = at};
    return SUBMIT(run_xent, a);
}
l3d_status l3d_ctest_xent_vp_max(l3d_device_t *dev, const void *logits, float *rowmax, int N,
                                 int Vl, l3d_dtype at) {
    int bad_ = 0;
    DEV(logits), DEV(rowmax);
    CHECKED();
    xent_t a = {.logits = (void *)logits, .stats = rowmax, .N = N, .V = Vl, .at = at};
    return SUBMIT(run_xent_max, a);
}
l3d_status l3d_ctest_xent_vp_stats(l3d_device_t *dev, const void *logits, const float *gmax,
                                   const int32_t *targets, int N, int Vl, int v0, float *stats,
                                   l3d_dtype at) {
    int bad_ = 0;
    DEV(logits), DEV(gmax), DEV(targets), DEV(stats);
    CHECKED();
    xent_t a = {.logits = (void *)logits, .stats = stats, .targets = targets, .gmax = gmax,
                .N = N, .V = Vl, .v0 = v0, .at = at};
    return SUBMIT(run_xent_stats, a);
}
l3d_status l3d_ctest_xent_vp_grad(l3d_device_t *dev, void *logits, float *losses,
                                  const float *gmax, const float *gstats,
                                  const int32_t *targets, int N, int Vl, int v0,
                                  float grad_scale, l3d_dtype at) {
    int bad_ = 0;
    DEV(logits), DEV(losses), DEV(gmax), DEV(gstats), DEV(targets);
    CHECKED();
    xent_t a = {.logits = logits, .losses = losses, .targets = targets, .gmax = gmax,
                .gstats = gstats, .N = N, .V = Vl, .v0 = v0, .grad_scale = grad_scale,
                .at = at};
    return SUBMIT(run_xent_grad, a);
}

// ---- norms and the optimizer ----------------------------------------------------------------
// The arrays travel with the job: a header, then n pointers, lengths and (w) weights.
typedef struct {
    int n, has_w;
    double *out;
    l3d_dtype at;
} sumsq_t;
static l3d_status run_sumsq(l3d_device_t *cpu, const void *p) {
    const sumsq_t *a = p;
    const void *const *x = (const void *const *)(a + 1);
    const size_t *len = (const size_t *)(x + a->n);
    const double *w = a->has_w ? (const double *)(len + a->n) : NULL;
    return CPU.sumsq(cpu, a->n, x, len, w, a->out, a->at);
}
l3d_status l3d_ctest_sumsq(l3d_device_t *dev, int n, const void *const *x, const size_t *len,
                           const double *w, double *out, l3d_dtype at) {
    int bad_ = 0;
    DEV(out);
    if (n < 0) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "sumsq: %d tensors", n);
    size_t un = (size_t)n, bytes = sizeof(sumsq_t) + un * (sizeof(void *) + sizeof(size_t)) +
                                   (w ? un * sizeof(double) : 0);
    sumsq_t *a = l3d_malloc(dev->ctx, bytes, "other");
    if (!a) return L3D_ERR_NOMEM;
    *a = (sumsq_t){n, w != NULL, out, at};
    const void **ax = (const void **)(a + 1);
    size_t *alen = (size_t *)(ax + n);
    for (int k = 0; k < n; k++) {
        ax[k] = l3d_ctest_untag(dev, &bad_, "sumsq", "x[k]", x[k]);
        alen[k] = len[k];
    }
    if (w) memcpy(alen + n, w, un * sizeof(double));
    l3d_status st = bad_ ? L3D_ERR_INVALID_ARG : l3d_ctest_submit(dev, run_sumsq, a, bytes);
    l3d_free(dev->ctx, a, bytes, "other");
    return st;
}

typedef struct {
    double *out;
    const double *x;
    int n;
} sum_f64_t;
static l3d_status run_sum_f64(l3d_device_t *cpu, const void *p) {
    const sum_f64_t *a = p;
    return CPU.sum_f64(cpu, a->out, a->x, a->n);
}
l3d_status l3d_ctest_sum_f64(l3d_device_t *dev, double *out, const double *x, int n) {
    int bad_ = 0;
    DEV(out), DEV(x);
    CHECKED();
    sum_f64_t a = {out, x, n};
    return SUBMIT(run_sum_f64, a);
}

// (the step, then its n tensors, copied: ts is read during the call, the op runs later)
typedef struct {
    l3d_adamw_step_t s;
    int n;
} adamw_t;
static l3d_status run_adamw(l3d_device_t *cpu, const void *p) {
    const adamw_t *a = p;
    return CPU.adamw(cpu, (const l3d_adamw_tensor_t *)(a + 1), a->n, &a->s);
}
l3d_status l3d_ctest_adamw(l3d_device_t *dev, const l3d_adamw_tensor_t *ts, int n,
                           const l3d_adamw_step_t *s) {
    int bad_ = 0;
    if (n < 0 || (n && !ts) || !s)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "adamw: %d tensors", n);
    size_t bytes = sizeof(adamw_t) + (size_t)n * sizeof(l3d_adamw_tensor_t);
    adamw_t *a = l3d_malloc(dev->ctx, bytes, "other");
    if (!a) return L3D_ERR_NOMEM;
    a->s = *s;
    a->n = n;
    a->s.sumsq = l3d_ctest_untag(dev, &bad_, "adamw", "sumsq", s->sumsq);
    l3d_adamw_tensor_t *at = (l3d_adamw_tensor_t *)(a + 1);
    for (int k = 0; k < n; k++) {
        at[k] = ts[k];
        at[k].param = l3d_ctest_untag(dev, &bad_, "adamw", "param", ts[k].param);
        at[k].m = l3d_ctest_untag(dev, &bad_, "adamw", "m", ts[k].m);
        at[k].v = l3d_ctest_untag(dev, &bad_, "adamw", "v", ts[k].v);
        at[k].grad = l3d_ctest_untag(dev, &bad_, "adamw", "grad", ts[k].grad);
        at[k].param16 = l3d_ctest_untag(dev, &bad_, "adamw", "param16", ts[k].param16);
    }
    l3d_status st = bad_ ? L3D_ERR_INVALID_ARG : l3d_ctest_submit(dev, run_adamw, a, bytes);
    l3d_free(dev->ctx, a, bytes, "other");
    return st;
}
