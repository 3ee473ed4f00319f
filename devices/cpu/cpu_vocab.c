// Vocabulary-parallel token embedding and cross-entropy (tensor parallelism): this rank holds
// the vocabulary rows [v0, v0+Vl) of the table and the matching logit columns; the tp group
// reduces between the passes (core/model/model_tp.c), nothing here communicates.
// defines: l3d_cpu_embedding_fwd_vp/bwd_vp, l3d_cpu_xent_vp_max/stats/grad
//
// The cross-entropy passes repeat cpu_xent.c's arithmetic step for step (same max, same
// exp, the exp sum in double in the same order, the same float scale of the gradient), so
// with one rank (v0 = 0, Vl = V) they give xent_fwd_bwd's numbers; the only extra rounding
// is the exp sum stored as float in stats(N,2), which the contract's float buffer imposes.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devices/cpu/cpu.h"

L3D_CPU_VECTORIZE

// Rows per task, as in cpu_norm.c (embedding) and cpu_xent.c (logit rows can be 128k long).
#define EMB_ROWS_PER_TASK 32
#define EMB_COLS_PER_TASK 64
#define XENT_ROWS_PER_TASK 4

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Nonzero when this rank owns token/target t, i.e. v0 <= t < v0 + Vl (no int overflow).
static inline int owns(int32_t t, int v0, int Vl) { return t >= v0 && t - v0 < Vl; }

// ---- embedding ----------------------------------------------------------------------------------
typedef struct {
    void *out;
    float *dtable;
    const int32_t *tokens;
    const void *table;
    const float *dout;
    int N, C, v0, Vl;
    l3d_dtype at, wt;
} emb_vp_t;

static void emb_fwd_vp_task(void *arg, int task, int ntasks) {
    const emb_vp_t *e = arg;
    size_t C = (size_t)e->C, ea = l3d_dtype_size(e->at), ew = l3d_dtype_size(e->wt);
    int n1 = L3D_MIN(e->N, (task + 1) * EMB_ROWS_PER_TASK);
    for (int n = task * EMB_ROWS_PER_TASK; n < n1; n++) {
        int32_t t = e->tokens[n];
        char *row = (char *)e->out + (size_t)n * C * ea;
        if (owns(t, e->v0, e->Vl))
            l3d_cpu_convert_serial(row, e->at,
                                   (const char *)e->table + (size_t)(t - e->v0) * C * ew,
                                   e->wt, C);
        else  // another rank's row: the sum over the group puts it here (0 in every dtype)
            memset(row, 0, C * ea);
    }
}

// out(N,C) = table(Vl,C)[tokens - v0] for tokens in [v0, v0+Vl), else 0
l3d_status l3d_cpu_embedding_fwd_vp(l3d_device_t *dev, void *out, const int32_t *tokens,
                                    const void *table, int N, int C, int v0, int Vl, int V,
                                    l3d_dtype at, l3d_dtype wt) {
    if (l3d_cpu_dtype_bad(dev, "embedding_fwd_vp", "out", at) ||
        l3d_cpu_dtype_bad(dev, "embedding_fwd_vp", "table", wt))
        return L3D_ERR_INVALID_ARG;
    if (N < 0 || C < 0 || v0 < 0 || Vl < 0 || V < 0 || (long long)v0 + Vl > V)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "embedding_fwd_vp: bad shape N %d C %d v0 %d Vl %d V %d", N, C, v0, Vl,
                         V);
    for (int n = 0; n < N; n++)  // checked up front: an error leaves `out` untouched
        if (tokens[n] < 0 || tokens[n] >= V)
            return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                             "embedding_fwd_vp: token[%d] = %d is outside [0, %d)", n, tokens[n],
                             V);
    emb_vp_t e = {.out = out, .tokens = tokens, .table = table, .N = N, .C = C, .v0 = v0,
                  .Vl = Vl, .at = at, .wt = wt};
    l3d_cpu_run(dev, emb_fwd_vp_task, &e, ceil_div(N, EMB_ROWS_PER_TASK));
    return L3D_OK;
}

// As cpu_norm.c's embedding_bwd: a task owns a slice of columns of every table row and adds
// the rows in token order, so the sums are the serial ones and no two tasks share an element.
L3D_CPU_SIMD static void emb_bwd_vp_task(void *arg, int task, int ntasks) {
    const emb_vp_t *e = arg;
    int c0 = task * EMB_COLS_PER_TASK, c1 = L3D_MIN(e->C, c0 + EMB_COLS_PER_TASK);
    for (int n = 0; n < e->N; n++) {
        int32_t t = e->tokens[n];
        if (!owns(t, e->v0, e->Vl)) continue;
        float *restrict dst = e->dtable + (size_t)(t - e->v0) * (size_t)e->C;
        const float *restrict src = e->dout + (size_t)n * (size_t)e->C;
        for (int c = c0; c < c1; c++) dst[c] += src[c];
    }
}

// dtable(Vl,C) += dout(N,C) scattered by tokens in [v0, v0+Vl); other tokens are ignored
// (the contract: they belong to other ranks, or were rejected by the forward).
static void emb_bwd_vp_f32(l3d_device_t *dev, float *dtable, const float *dout,
                           const int32_t *tokens, int N, int C, int v0, int Vl) {
    emb_vp_t e = {.dtable = dtable, .dout = dout, .tokens = tokens, .N = N, .C = C, .v0 = v0,
                  .Vl = Vl};
    l3d_cpu_run(dev, emb_bwd_vp_task, &e, ceil_div(C, EMB_COLS_PER_TASK));
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// A 16-bit table gradient: the U distinct rows the tokens touch are widened into a (U,C)
// block, the float32 kernel adds into it with the tokens renumbered 0..U-1 (the same sums in
// the same order), and those rows alone are rounded back, once each.
static l3d_status emb_bwd_vp_rows(l3d_device_t *dev, void *dtable, const float *dout,
                                  const int32_t *tokens, int N, int C, int v0, int Vl,
                                  l3d_dtype gt) {
    size_t ibytes = sizeof(int32_t) * (size_t)(N ? N : 1), es = l3d_dtype_size(gt);
    int32_t *rows = l3d_malloc(dev->ctx, 2 * ibytes, "scratch");
    if (!rows) return L3D_ERR_NOMEM;
    int32_t *renum = rows + (N ? N : 1);
    int U = 0;
    for (int n = 0; n < N; n++)
        if (owns(tokens[n], v0, Vl)) rows[U++] = tokens[n] - v0;
    qsort(rows, (size_t)U, sizeof(int32_t), cmp_i32);
    int u = 0;
    for (int i = 0; i < U; i++)
        if (!u || rows[i] != rows[u - 1]) rows[u++] = rows[i];
    U = u;
    for (int n = 0; n < N; n++) {
        renum[n] = -1;  // not this rank's: the kernel ignores it
        if (!owns(tokens[n], v0, Vl)) continue;
        int32_t key = tokens[n] - v0, *hit = bsearch(&key, rows, (size_t)U, sizeof(int32_t),
                                                      cmp_i32);
        renum[n] = (int32_t)(hit - rows);
    }
    size_t bbytes = sizeof(float) * l3d_cpu_elems(U, C);
    float *blk = l3d_malloc(dev->ctx, bbytes ? bbytes : 1, "scratch");
    if (!blk) {
        l3d_free(dev->ctx, rows, 2 * ibytes, "scratch");
        return L3D_ERR_NOMEM;
    }
    for (int i = 0; i < U; i++)
        l3d_cpu_convert_run(dev, blk + (size_t)i * (size_t)C, L3D_FLOAT32,
                            (const char *)dtable + (size_t)rows[i] * (size_t)C * es, gt,
                            (size_t)C);
    emb_bwd_vp_f32(dev, blk, dout, renum, N, C, 0, U);
    for (int i = 0; i < U; i++)
        l3d_cpu_convert_run(dev, (char *)dtable + (size_t)rows[i] * (size_t)C * es, gt,
                            blk + (size_t)i * (size_t)C, L3D_FLOAT32, (size_t)C);
    l3d_free(dev->ctx, blk, bbytes ? bbytes : 1, "scratch");
    l3d_free(dev->ctx, rows, 2 * ibytes, "scratch");
    return L3D_OK;
}

l3d_status l3d_cpu_embedding_bwd_vp(l3d_device_t *dev, void *dtable, const void *dout,
                                    const int32_t *tokens, int N, int C, int v0, int Vl,
                                    l3d_dtype at, l3d_dtype gt) {
    if (N < 0 || C < 0 || v0 < 0 || Vl < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "embedding_bwd_vp: bad shape N %d C %d v0 %d Vl %d", N, C, v0, Vl);
    l3d_cpu_arg_t a[] = {l3d_cpu_arg("dout", dout, at, l3d_cpu_elems(N, C), L3D_CPU_IN)};
    if (l3d_cpu_dtype_bad(dev, "embedding_bwd_vp", "dtable", gt)) return L3D_ERR_INVALID_ARG;
    L3D_CHECK(dev->ctx, l3d_cpu_args_widen(dev, "embedding_bwd_vp", a, 1));
    l3d_status st = L3D_OK;
    if (gt == L3D_FLOAT32) emb_bwd_vp_f32(dev, dtable, a[0].f, tokens, N, C, v0, Vl);
    else st = emb_bwd_vp_rows(dev, dtable, a[0].f, tokens, N, C, v0, Vl, gt);
    l3d_cpu_args_narrow(dev, a, 1, 0);
    return st;
}

// ---- cross-entropy ------------------------------------------------------------------------------
typedef struct {
    float *logits, *losses, *rowmax, *stats;
    const float *clogits, *gmax, *gstats;
    const int32_t *targets;
    int N, Vl, v0;
    float grad_scale;
} xvp_t;

// sum_i exp(z[i] - m) in double, in l3d_cpu_sumd's order over the float exps: cpu_xent.c
// stores the exps and sums them with l3d_cpu_sumd, so with one rank the sums are identical.
L3D_CPU_INLINE double sum_exp_d(const float *restrict z, int n, float m) {
    double acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)l3d_expf(z[i + k] - m);
    for (int w = 4; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) acc[k] += acc[k + w];
    double s = acc[0];
    for (; i < n; i++) s += (double)l3d_expf(z[i] - m);
    return s;
}

L3D_CPU_SIMD static void xvp_max_task(void *arg, int task, int ntasks) {
    const xvp_t *x = arg;
    int n1 = L3D_MIN(x->N, (task + 1) * XENT_ROWS_PER_TASK);
    for (int n = task * XENT_ROWS_PER_TASK; n < n1; n++)
        x->rowmax[n] = l3d_cpu_maxf(x->clogits + (size_t)n * (size_t)x->Vl, x->Vl, -INFINITY);
}

// rowmax(N) = max over this rank's logits(N,Vl) of each row (-inf when Vl == 0)
static l3d_status xent_vp_max_f32(l3d_device_t *dev, const float *logits, float *rowmax, int N,
                                  int Vl) {
    if (N < 0 || Vl < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "xent_vp_max: bad shape N %d Vl %d", N,
                         Vl);
    xvp_t x = {.clogits = logits, .rowmax = rowmax, .N = N, .Vl = Vl};
    l3d_cpu_run(dev, xvp_max_task, &x, ceil_div(N, XENT_ROWS_PER_TASK));
    return L3D_OK;
}

L3D_CPU_SIMD static void xvp_stats_task(void *arg, int task, int ntasks) {
    const xvp_t *x = arg;
    int Vl = x->Vl, n1 = L3D_MIN(x->N, (task + 1) * XENT_ROWS_PER_TASK);
    for (int n = task * XENT_ROWS_PER_TASK; n < n1; n++) {
        const float *restrict z = x->clogits + (size_t)n * (size_t)Vl;
        int32_t t = x->targets[n];
        float *st = x->stats + 2 * (size_t)n;
        if (t < 0) {  // ignored row: nothing to add
            st[0] = st[1] = 0.0f;
            continue;
        }
        st[0] = (float)sum_exp_d(z, Vl, x->gmax[n]);
        st[1] = owns(t, x->v0, Vl) ? z[t - x->v0] : 0.0f;
    }
}

// stats(N,2) = [sum_j exp(logits - gmax), owned target logit or 0]; (0, 0) for target < 0
static l3d_status xent_vp_stats_f32(l3d_device_t *dev, const float *logits, const float *gmax,
                                    const int32_t *targets, int N, int Vl, int v0,
                                    float *stats) {
    if (N < 0 || Vl < 0 || v0 < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "xent_vp_stats: bad shape N %d Vl %d v0 %d", N, Vl, v0);
    xvp_t x = {.clogits = logits, .gmax = gmax, .stats = stats, .targets = targets, .N = N,
               .Vl = Vl, .v0 = v0};
    l3d_cpu_run(dev, xvp_stats_task, &x, ceil_div(N, XENT_ROWS_PER_TASK));
    return L3D_OK;
}

L3D_CPU_SIMD static void xvp_grad_task(void *arg, int task, int ntasks) {
    const xvp_t *x = arg;
    int Vl = x->Vl, n1 = L3D_MIN(x->N, (task + 1) * XENT_ROWS_PER_TASK);
    float gs = x->grad_scale;
    for (int n = task * XENT_ROWS_PER_TASK; n < n1; n++) {
        float *restrict z = x->logits + (size_t)n * (size_t)Vl;
        int32_t t = x->targets[n];
        if (t < 0) {  // ignored: zero loss, zero gradient
            memset(z, 0, sizeof(float) * (size_t)Vl);
            if (x->losses) x->losses[n] = 0.0f;
            continue;
        }
        float mx = x->gmax[n];
        double sum = (double)x->gstats[2 * (size_t)n];
        // cpu_xent.c's loss: log(sum) - (z[t] - max), the difference taken in float.
        float zt = x->gstats[2 * (size_t)n + 1] - mx;
        if (x->losses) x->losses[n] = (float)(log(sum) - (double)zt);
        float k = (float)((double)gs / sum);
        for (int i = 0; i < Vl; i++) z[i] = l3d_expf(z[i] - mx) * k;
        if (owns(t, x->v0, Vl)) z[t - x->v0] -= gs;
    }
}

// In place: logits(N,Vl) <- grad_scale * (softmax - onehot(target - v0)); losses(N) (or NULL)
// = log(gstats[n][0]) + gmax[n] - gstats[n][1]; rows with target < 0 get 0 and 0.
static l3d_status xent_vp_grad_f32(l3d_device_t *dev, float *logits, float *losses,
                                   const float *gmax, const float *gstats,
                                   const int32_t *targets, int N, int Vl, int v0,
                                   float grad_scale) {
    if (N < 0 || Vl < 0 || v0 < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "xent_vp_grad: bad shape N %d Vl %d v0 %d", N, Vl, v0);
    xvp_t x = {.logits = logits, .losses = losses, .gmax = gmax, .gstats = gstats,
               .targets = targets, .N = N, .Vl = Vl, .v0 = v0, .grad_scale = grad_scale};
    l3d_cpu_run(dev, xvp_grad_task, &x, ceil_div(N, XENT_ROWS_PER_TASK));
    return L3D_OK;
}

// ---- the cross-entropy entries: 16-bit logits a block of rows at a time (cpu.h) -----------------
typedef struct {
    float *out, *losses;  // rowmax or stats; losses
    const float *gmax, *gstats;
    const int32_t *targets;
    int Vl, v0;
    float grad_scale;
} xvp_rows_t;

static l3d_status vp_max_rows(l3d_device_t *dev, float *rows, int r0, int nrows, void *arg) {
    const xvp_rows_t *r = arg;
    return xent_vp_max_f32(dev, rows, r->out + r0, nrows, r->Vl);
}
static l3d_status vp_stats_rows(l3d_device_t *dev, float *rows, int r0, int nrows, void *arg) {
    const xvp_rows_t *r = arg;
    return xent_vp_stats_f32(dev, rows, r->gmax + r0, r->targets + r0, nrows, r->Vl, r->v0,
                             r->out + 2 * (size_t)r0);
}
static l3d_status vp_grad_rows(l3d_device_t *dev, float *rows, int r0, int nrows, void *arg) {
    const xvp_rows_t *r = arg;
    return xent_vp_grad_f32(dev, rows, r->losses ? r->losses + r0 : NULL, r->gmax + r0,
                            r->gstats + 2 * (size_t)r0, r->targets + r0, nrows, r->Vl, r->v0,
                            r->grad_scale);
}

l3d_status l3d_cpu_xent_vp_max(l3d_device_t *dev, const void *logits, float *rowmax, int N,
                               int Vl, l3d_dtype at) {
    if (at == L3D_FLOAT32) return xent_vp_max_f32(dev, logits, rowmax, N, Vl);
    xvp_rows_t r = {.out = rowmax, .Vl = Vl};
    return l3d_cpu_rows_widened(dev, "xent_vp_max", (void *)logits, at, N, Vl, 0, vp_max_rows, &r);
}

l3d_status l3d_cpu_xent_vp_stats(l3d_device_t *dev, const void *logits, const float *gmax,
                                 const int32_t *targets, int N, int Vl, int v0, float *stats,
                                 l3d_dtype at) {
    if (at == L3D_FLOAT32) return xent_vp_stats_f32(dev, logits, gmax, targets, N, Vl, v0, stats);
    if (v0 < 0)  // the only failure, checked before any block
        return xent_vp_stats_f32(dev, NULL, gmax, targets, N, Vl, v0, stats);
    xvp_rows_t r = {.out = stats, .gmax = gmax, .targets = targets, .Vl = Vl, .v0 = v0};
    return l3d_cpu_rows_widened(dev, "xent_vp_stats", (void *)logits, at, N, Vl, 0, vp_stats_rows,
                                &r);
}

l3d_status l3d_cpu_xent_vp_grad(l3d_device_t *dev, void *logits, float *losses,
                                const float *gmax, const float *gstats, const int32_t *targets,
                                int N, int Vl, int v0, float grad_scale, l3d_dtype at) {
    if (at == L3D_FLOAT32)
        return xent_vp_grad_f32(dev, logits, losses, gmax, gstats, targets, N, Vl, v0,
                                grad_scale);
    if (v0 < 0)  // the only failure, checked before any block
        return xent_vp_grad_f32(dev, NULL, losses, gmax, gstats, targets, N, Vl, v0, grad_scale);
    xvp_rows_t r = {.losses = losses, .gmax = gmax, .gstats = gstats, .targets = targets,
                    .Vl = Vl, .v0 = v0, .grad_scale = grad_scale};
    return l3d_cpu_rows_widened(dev, "xent_vp_grad", logits, at, N, Vl, 1, vp_grad_rows, &r);
}
