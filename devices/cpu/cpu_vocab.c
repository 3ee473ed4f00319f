// Vocabulary-parallel token embedding and cross-entropy (tensor parallelism): this rank holds
// the vocabulary rows [v0, v0+Vl) of the table and the matching logit columns; the tp group
// reduces between the passes (core/model_tp.c), nothing here communicates.
// defines: l3d_cpu_embedding_fwd_vp/bwd_vp, l3d_cpu_xent_vp_max/stats/grad
//
// The cross-entropy passes repeat cpu_xent.c's arithmetic step for step (same max, same
// exp, the exp sum in double in the same order, the same float scale of the gradient), so
// with one rank (v0 = 0, Vl = V) they give xent_fwd_bwd's numbers; the only extra rounding
// is the exp sum stored as float in stats(N,2), which the contract's float buffer imposes.
#include <math.h>
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
    float *out, *dtable;
    const int32_t *tokens;
    const float *table, *dout;
    int N, C, v0, Vl;
} emb_vp_t;

static void emb_fwd_vp_task(void *arg, int task, int ntasks) {
    const emb_vp_t *e = arg;
    size_t C = (size_t)e->C;
    int n1 = L3D_MIN(e->N, (task + 1) * EMB_ROWS_PER_TASK);
    for (int n = task * EMB_ROWS_PER_TASK; n < n1; n++) {
        int32_t t = e->tokens[n];
        if (owns(t, e->v0, e->Vl))
            memcpy(e->out + (size_t)n * C, e->table + (size_t)(t - e->v0) * C, sizeof(float) * C);
        else  // another rank's row: the sum over the group puts it here
            memset(e->out + (size_t)n * C, 0, sizeof(float) * C);
    }
}

// out(N,C) = table(Vl,C)[tokens - v0] for tokens in [v0, v0+Vl), else 0
l3d_status l3d_cpu_embedding_fwd_vp(l3d_device_t *dev, float *out, const int32_t *tokens,
                                    const float *table, int N, int C, int v0, int Vl, int V) {
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
                  .Vl = Vl};
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
l3d_status l3d_cpu_embedding_bwd_vp(l3d_device_t *dev, float *dtable, const float *dout,
                                    const int32_t *tokens, int N, int C, int v0, int Vl) {
    if (N < 0 || C < 0 || v0 < 0 || Vl < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "embedding_bwd_vp: bad shape N %d C %d v0 %d Vl %d", N, C, v0, Vl);
    emb_vp_t e = {.dtable = dtable, .dout = dout, .tokens = tokens, .N = N, .C = C, .v0 = v0,
                  .Vl = Vl};
    l3d_cpu_run(dev, emb_bwd_vp_task, &e, ceil_div(C, EMB_COLS_PER_TASK));
    return L3D_OK;
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
        for (int k = 0; k < 8; k++) acc[k] += (double)l3d_cpu_expf(z[i + k] - m);
    for (int w = 4; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) acc[k] += acc[k + w];
    double s = acc[0];
    for (; i < n; i++) s += (double)l3d_cpu_expf(z[i] - m);
    return s;
}

L3D_CPU_SIMD static void xvp_max_task(void *arg, int task, int ntasks) {
    const xvp_t *x = arg;
    int n1 = L3D_MIN(x->N, (task + 1) * XENT_ROWS_PER_TASK);
    for (int n = task * XENT_ROWS_PER_TASK; n < n1; n++)
        x->rowmax[n] = l3d_cpu_maxf(x->clogits + (size_t)n * (size_t)x->Vl, x->Vl, -INFINITY);
}

// rowmax(N) = max over this rank's logits(N,Vl) of each row (-inf when Vl == 0)
l3d_status l3d_cpu_xent_vp_max(l3d_device_t *dev, const float *logits, float *rowmax, int N,
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
l3d_status l3d_cpu_xent_vp_stats(l3d_device_t *dev, const float *logits, const float *gmax,
                                 const int32_t *targets, int N, int Vl, int v0, float *stats) {
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
        for (int i = 0; i < Vl; i++) z[i] = l3d_cpu_expf(z[i] - mx) * k;
        if (owns(t, x->v0, Vl)) z[t - x->v0] -= gs;
    }
}

// In place: logits(N,Vl) <- grad_scale * (softmax - onehot(target - v0)); losses(N) (or NULL)
// = log(gstats[n][0]) + gmax[n] - gstats[n][1]; rows with target < 0 get 0 and 0.
l3d_status l3d_cpu_xent_vp_grad(l3d_device_t *dev, float *logits, float *losses,
                                const float *gmax, const float *gstats, const int32_t *targets,
                                int N, int Vl, int v0, float grad_scale) {
    if (N < 0 || Vl < 0 || v0 < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "xent_vp_grad: bad shape N %d Vl %d v0 %d", N, Vl, v0);
    xvp_t x = {.logits = logits, .losses = losses, .gmax = gmax, .gstats = gstats,
               .targets = targets, .N = N, .Vl = Vl, .v0 = v0, .grad_scale = grad_scale};
    l3d_cpu_run(dev, xvp_grad_task, &x, ceil_div(N, XENT_ROWS_PER_TASK));
    return L3D_OK;
}
