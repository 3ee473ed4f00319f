// Row-wise kernels: token embedding, RMSNorm and rotary position embedding (RoPE).
// defines: l3d_cpu_embedding_fwd/bwd, l3d_cpu_rmsnorm_fwd/bwd, l3d_cpu_rmsnorm_rowdot,
//          l3d_cpu_rmsnorm_rows_fwd/bwd, l3d_cpu_rope
#include <limits.h>
#include <math.h>
#include <string.h>

#include "devices/cpu/cpu.h"

L3D_CPU_VECTORIZE

// Rows per task for row-wise kernels; also the chunk of rows behind each partial of the
// RMSNorm weight gradient, so that reduction's order is fixed by the shape alone.
#define ROWS_PER_TASK 32
// Columns per task when a task owns a slice of columns (embedding and dw reductions).
#define COLS_PER_TASK 64

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---- embedding ----------------------------------------------------------------------------------
typedef struct {
    void *out;
    const int32_t *tokens;
    const void *table;
    int N, C;
    l3d_dtype at, wt;
} emb_fwd_t;

// Each row is copied, or converted when the table's dtype is not the output's.
static void emb_fwd_task(void *arg, int task, int ntasks) {
    const emb_fwd_t *e = arg;
    size_t C = (size_t)e->C, ea = l3d_dtype_size(e->at), ew = l3d_dtype_size(e->wt);
    int n1 = L3D_MIN(e->N, (task + 1) * ROWS_PER_TASK);
    for (int n = task * ROWS_PER_TASK; n < n1; n++)
        l3d_cpu_convert_serial((char *)e->out + (size_t)n * C * ea, e->at,
                               (const char *)e->table + (size_t)e->tokens[n] * C * ew, e->wt, C);
}

// out(N,C) = table(V,C)[tokens(N)]
l3d_status l3d_cpu_embedding_fwd(l3d_device_t *dev, void *out, const int32_t *tokens,
                                 const void *table, int N, int C, int V, l3d_dtype at,
                                 l3d_dtype wt) {
    if (l3d_cpu_dtype_bad(dev, "embedding_fwd", "out", at) ||
        l3d_cpu_dtype_bad(dev, "embedding_fwd", "table", wt))
        return L3D_ERR_INVALID_ARG;
    if (N < 0 || C < 0 || V < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "embedding_fwd: bad shape N %d C %d V %d",
                         N, C, V);
    for (int n = 0; n < N; n++)  // checked up front: an error leaves `out` untouched
        if (tokens[n] < 0 || tokens[n] >= V)
            return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                             "embedding_fwd: token[%d] = %d is outside [0, %d)", n, tokens[n], V);
    emb_fwd_t e = {out, tokens, table, N, C, at, wt};
    l3d_cpu_run(dev, emb_fwd_task, &e, ceil_div(N, ROWS_PER_TASK));
    return L3D_OK;
}

typedef struct {
    float *dtable;
    const float *dout;
    const int32_t *tokens;
    int N, C;
} emb_bwd_t;

// A task owns a slice of columns of every table row and adds the rows in token order, so the
// sums are the serial ones and no two tasks touch the same element.
L3D_CPU_SIMD static void emb_bwd_task(void *arg, int task, int ntasks) {
    const emb_bwd_t *e = arg;
    int c0 = task * COLS_PER_TASK, c1 = L3D_MIN(e->C, c0 + COLS_PER_TASK);
    for (int n = 0; n < e->N; n++) {
        float *restrict dst = e->dtable + (size_t)e->tokens[n] * (size_t)e->C;
        const float *restrict src = e->dout + (size_t)n * (size_t)e->C;
        for (int c = c0; c < c1; c++) dst[c] += src[c];
    }
}

// dtable(V,C) += dout(N,C) scattered by tokens(N). With 16-bit operands it is the
// vocabulary-parallel form over the whole vocabulary (v0 0, every id owned), which adds in
// the same order and widens only the table rows the tokens touch.
l3d_status l3d_cpu_embedding_bwd(l3d_device_t *dev, void *dtable, const void *dout,
                                 const int32_t *tokens, int N, int C, l3d_dtype at, l3d_dtype gt) {
    if (l3d_cpu_dtype_bad(dev, "embedding_bwd", "dout", at) ||
        l3d_cpu_dtype_bad(dev, "embedding_bwd", "dtable", gt))
        return L3D_ERR_INVALID_ARG;
    if (N < 0 || C < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "embedding_bwd: bad shape N %d C %d", N,
                         C);
    // The contract gives no V, so only negative ids can be caught here (the forward checked
    // the same tokens against V).
    for (int n = 0; n < N; n++)
        if (tokens[n] < 0)
            return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                             "embedding_bwd: token[%d] = %d is negative", n, tokens[n]);
    if (at != L3D_FLOAT32 || gt != L3D_FLOAT32)
        return l3d_cpu_embedding_bwd_vp(dev, dtable, dout, tokens, N, C, 0, INT_MAX, at, gt);
    emb_bwd_t e = {dtable, dout, tokens, N, C};
    l3d_cpu_run(dev, emb_bwd_task, &e, ceil_div(C, COLS_PER_TASK));
    return L3D_OK;
}

// ---- rmsnorm ------------------------------------------------------------------------------------
// A row's statistic (sum of x^2 forward, of dout*w*x backward) comes from the row itself, or,
// when the row's columns are split over ranks (tp_mode 2d), from `stat_in`: the all-reduced
// sum of every block's rowdot; C_full is then the whole row's length.
typedef struct {
    float *out, *rstd, *dx, *dw, *dw_part;
    const float *x, *w, *dout, *rstd_in, *stat_in;
    int N, C, C_full, nchunks;
    float eps;
} rms_t;

L3D_CPU_SIMD static void rms_fwd_task(void *arg, int task, int ntasks) {
    const rms_t *r = arg;
    int C = r->C, n1 = L3D_MIN(r->N, (task + 1) * ROWS_PER_TASK);
    for (int n = task * ROWS_PER_TASK; n < n1; n++) {
        const float *restrict x = r->x + (size_t)n * (size_t)C;
        float *restrict y = r->out + (size_t)n * (size_t)C;
        const float *restrict w = r->w;
        float ss = r->stat_in ? r->stat_in[n] : l3d_cpu_dotf(x, x, C);
        float rs = 1.0f / sqrtf(ss / (float)r->C_full + r->eps);
        for (int c = 0; c < C; c++) y[c] = x[c] * rs * w[c];
        if (r->rstd) r->rstd[n] = rs;
    }
}

// out(N,C) = x / sqrt(mean(x^2) + eps) * w(C); rstd(N)
static l3d_status rmsnorm_fwd_f32(l3d_device_t *dev, float *out, float *rstd, const float *x,
                                  const float *w, const float *ss, int N, int C, int C_full,
                                  float eps) {
    if (N < 0 || C <= 0 || C_full < C)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "rmsnorm_fwd: bad shape N %d C %d (of %d)", N, C, C_full);
    rms_t r = {.out = out, .rstd = rstd, .x = x, .w = w, .stat_in = ss, .N = N, .C = C,
               .C_full = C_full, .eps = eps};
    l3d_cpu_run(dev, rms_fwd_task, &r, ceil_div(N, ROWS_PER_TASK));
    return L3D_OK;
}

// Pass 1, per chunk of rows: dx += rstd*(dout*w) - rstd^3/C * x * sum(dout*w*x), and the
// chunk's partial of dw(C) = sum over its rows of dout * x * rstd.
L3D_CPU_SIMD static void rms_bwd_rows_task(void *arg, int task, int ntasks) {
    const rms_t *r = arg;
    int C = r->C, n0 = task * ROWS_PER_TASK, n1 = L3D_MIN(r->N, n0 + ROWS_PER_TASK);
    float *restrict part = r->dw_part + (size_t)task * 2 * (size_t)C;
    float *restrict gw = part + C;  // dout * w of the current row
    memset(part, 0, sizeof(float) * (size_t)C);
    const float *restrict w = r->w;
    for (int n = n0; n < n1; n++) {
        const float *restrict x = r->x + (size_t)n * (size_t)C;
        const float *restrict g = r->dout + (size_t)n * (size_t)C;
        float *restrict dx = r->dx + (size_t)n * (size_t)C;
        float rs = r->rstd_in[n];
        for (int c = 0; c < C; c++) gw[c] = g[c] * w[c];
        float dot = r->stat_in ? r->stat_in[n] : l3d_cpu_dotf(gw, x, C);
        float k = dot * rs * rs * rs / (float)r->C_full;
        for (int c = 0; c < C; c++) {
            dx[c] += rs * gw[c] - k * x[c];
            part[c] += g[c] * x[c] * rs;
        }
    }
}

// Pass 2, per slice of columns: dw += the partials in chunk order.
L3D_CPU_SIMD static void rms_bwd_dw_task(void *arg, int task, int ntasks) {
    const rms_t *r = arg;
    int c0 = task * COLS_PER_TASK, c1 = L3D_MIN(r->C, c0 + COLS_PER_TASK);
    for (int p = 0; p < r->nchunks; p++) {
        const float *restrict part = r->dw_part + (size_t)p * 2 * (size_t)r->C;
        float *restrict dw = r->dw;
        for (int c = c0; c < c1; c++) dw[c] += part[c];
    }
}

// dx(N,C) += d/dx, dw(C) += d/dw
static l3d_status rmsnorm_bwd_f32(l3d_device_t *dev, float *dx, float *dw, const float *dout,
                                  const float *x, const float *w, const float *rstd,
                                  const float *dot, int N, int C, int C_full) {
    if (N < 0 || C <= 0 || C_full < C)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "rmsnorm_bwd: bad shape N %d C %d (of %d)", N, C, C_full);
    if (N == 0) return L3D_OK;
    int nchunks = ceil_div(N, ROWS_PER_TASK);
    size_t part_bytes = sizeof(float) * (size_t)nchunks * 2 * (size_t)C;  // dw partial, dout*w
    float *part = l3d_malloc(dev->ctx, part_bytes, "scratch");
    if (!part) return L3D_ERR_NOMEM;
    rms_t r = {.dx = dx, .dw = dw, .dw_part = part, .x = x, .w = w, .dout = dout,
               .rstd_in = rstd, .stat_in = dot, .N = N, .C = C, .C_full = C_full,
               .nchunks = nchunks};
    l3d_cpu_run(dev, rms_bwd_rows_task, &r, nchunks);
    l3d_cpu_run(dev, rms_bwd_dw_task, &r, ceil_div(C, COLS_PER_TASK));
    l3d_free(dev->ctx, part, part_bytes, "scratch");
    return L3D_OK;
}

// out(N) = sum_c a * b * (w or 1), per row in column order (the dot rmsnorm_fwd/bwd take of a
// whole row, so a block holding every column gives their statistic bit for bit).
typedef struct {
    float *out, *scratch;  // scratch: C floats per task
    const float *a, *b, *w;
    int N, C;
} rowdot_t;

L3D_CPU_SIMD static void rowdot_task(void *arg, int task, int ntasks) {
    const rowdot_t *r = arg;
    int C = r->C, n1 = L3D_MIN(r->N, (task + 1) * ROWS_PER_TASK);
    // No scratch without w (NULL: no offset may be applied to it).
    float *restrict gw = r->w ? r->scratch + (size_t)task * (size_t)C : NULL;
    for (int n = task * ROWS_PER_TASK; n < n1; n++) {
        const float *a = r->a + (size_t)n * (size_t)C, *b = r->b + (size_t)n * (size_t)C;
        if (!r->w) {
            r->out[n] = l3d_cpu_dotf(a, b, C);
            continue;
        }
        // (a * w) first, then its dot with b: the order rmsnorm_bwd takes dout * w * x in
        for (int c = 0; c < C; c++) gw[c] = a[c] * r->w[c];
        r->out[n] = l3d_cpu_dotf(gw, b, C);
    }
}

// ---- rope ---------------------------------------------------------------------------------------
typedef struct {
    float *x;
    const float *cos_tab, *sin_tab;
    int BT, T, NH, D, pos0;
    float sign;  // +1 forward, -1 inverse
} rope_t;

// A task does ROWS_PER_TASK (b, t) rows of NH heads of D.
L3D_CPU_SIMD static void rope_task(void *arg, int task, int ntasks) {
    const rope_t *r = arg;
    int half = r->D / 2, n1 = L3D_MIN(r->BT, (task + 1) * ROWS_PER_TASK);
    float sign = r->sign;
    for (int bt = task * ROWS_PER_TASK; bt < n1; bt++) {
        int pos = r->pos0 + bt % r->T;
        const float *restrict cs = r->cos_tab + (size_t)pos * (size_t)half;
        const float *restrict sn = r->sin_tab + (size_t)pos * (size_t)half;
        for (int h = 0; h < r->NH; h++) {
            float *restrict x1 = r->x + ((size_t)bt * (size_t)r->NH + (size_t)h) * (size_t)r->D;
            float *restrict x2 = x1 + half;
            for (int i = 0; i < half; i++) l3d_rope_rotate(&x1[i], &x2[i], cs[i], sign * sn[i]);
        }
    }
}

// In place on x(B,T,NH,D), rotate-half convention; cos/sin (Tmax, D/2)
static l3d_status rope_f32(l3d_device_t *dev, float *x, const float *cos_tab,
                           const float *sin_tab, int B, int T, int NH, int D, int pos0,
                           int inverse) {
    if (B < 0 || T < 0 || NH < 0 || D <= 0 || (D & 1) || pos0 < 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "rope: bad shape B %d T %d NH %d D %d pos0 %d (D must be even)", B, T, NH,
                         D, pos0);
    rope_t r = {x, cos_tab, sin_tab, B * T, T, NH, D, pos0, inverse ? -1.0f : 1.0f};
    l3d_cpu_run(dev, rope_task, &r, ceil_div(B * T, ROWS_PER_TASK));
    return L3D_OK;
}

// ---- the entries: 16-bit operands widened whole (cpu.h) -----------------------------------------
// The entries share one body each: the whole-row ops are the split-row ones with the row's
// own statistic (ss / dot NULL) and C_full = C.
static l3d_status rmsnorm_fwd_entry(l3d_device_t *dev, const char *op, void *out, float *rstd,
                                    const void *x, const void *w, const float *ss, int N, int C,
                                    int C_full, float eps, l3d_dtype at, l3d_dtype wt) {
    size_t nx = l3d_cpu_elems(N, C);
    l3d_cpu_arg_t a[] = {l3d_cpu_arg("out", out, at, nx, L3D_CPU_OUT),
                         l3d_cpu_arg("x", x, at, nx, L3D_CPU_IN),
                         l3d_cpu_arg("w", w, wt, l3d_cpu_elems(1, C), L3D_CPU_IN)};
    L3D_CHECK(dev->ctx, l3d_cpu_args_widen(dev, op, a, 3));
    l3d_status st = rmsnorm_fwd_f32(dev, a[0].f, rstd, a[1].f, a[2].f, ss, N, C, C_full, eps);
    l3d_cpu_args_narrow(dev, a, 3, st >= 0);
    return st;
}

static l3d_status rmsnorm_bwd_entry(l3d_device_t *dev, const char *op, void *dx, void *dw,
                                    const void *dout, const void *x, const void *w,
                                    const float *rstd, const float *dot, int N, int C,
                                    int C_full, l3d_dtype at, l3d_dtype wt, l3d_dtype gt) {
    size_t nx = l3d_cpu_elems(N, C), nw = l3d_cpu_elems(1, C);
    l3d_cpu_arg_t a[] = {l3d_cpu_arg("dx", dx, at, nx, L3D_CPU_IN | L3D_CPU_OUT),
                         l3d_cpu_arg("dw", dw, gt, nw, L3D_CPU_IN | L3D_CPU_OUT),
                         l3d_cpu_arg("dout", dout, at, nx, L3D_CPU_IN),
                         l3d_cpu_arg("x", x, at, nx, L3D_CPU_IN),
                         l3d_cpu_arg("w", w, wt, nw, L3D_CPU_IN)};
    L3D_CHECK(dev->ctx, l3d_cpu_args_widen(dev, op, a, 5));
    l3d_status st = rmsnorm_bwd_f32(dev, a[0].f, a[1].f, a[2].f, a[3].f, a[4].f, rstd, dot, N, C,
                                    C_full);
    l3d_cpu_args_narrow(dev, a, 5, st >= 0);
    return st;
}

l3d_status l3d_cpu_rmsnorm_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                               const void *w, int N, int C, float eps, l3d_dtype at,
                               l3d_dtype wt) {
    return rmsnorm_fwd_entry(dev, "rmsnorm_fwd", out, rstd, x, w, NULL, N, C, C, eps, at, wt);
}

l3d_status l3d_cpu_rmsnorm_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                               const void *x, const void *w, const float *rstd, int N, int C,
                               l3d_dtype at, l3d_dtype wt, l3d_dtype gt) {
    return rmsnorm_bwd_entry(dev, "rmsnorm_bwd", dx, dw, dout, x, w, rstd, NULL, N, C, C, at, wt,
                             gt);
}

l3d_status l3d_cpu_rope(l3d_device_t *dev, void *x, const float *cos_tab, const float *sin_tab,
                        int B, int T, int NH, int D, int pos0, int inverse, l3d_dtype at) {
    size_t n = l3d_cpu_elems(l3d_cpu_elems(B, T), l3d_cpu_elems(NH, D));
    l3d_cpu_arg_t a[] = {l3d_cpu_arg("x", x, at, n, L3D_CPU_IN | L3D_CPU_OUT)};
    L3D_CHECK(dev->ctx, l3d_cpu_args_widen(dev, "rope", a, 1));
    l3d_status st = rope_f32(dev, a[0].f, cos_tab, sin_tab, B, T, NH, D, pos0, inverse);
    l3d_cpu_args_narrow(dev, a, 1, st >= 0);
    return st;
}

l3d_status l3d_cpu_rmsnorm_rowdot(l3d_device_t *dev, float *out, const void *a, const void *b,
                                  const void *w, int N, int C, l3d_dtype at, l3d_dtype wt) {
    if (N < 0 || C <= 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "rmsnorm_rowdot: bad shape N %d C %d", N,
                         C);
    size_t nx = l3d_cpu_elems(N, C);
    l3d_cpu_arg_t v[] = {l3d_cpu_arg("a", a, at, nx, L3D_CPU_IN),
                         l3d_cpu_arg("b", b, at, nx, L3D_CPU_IN),
                         l3d_cpu_arg("w", w, wt, w ? l3d_cpu_elems(1, C) : 0, L3D_CPU_IN)};
    L3D_CHECK(dev->ctx, l3d_cpu_args_widen(dev, "rmsnorm_rowdot", v, 3));
    int ntasks = ceil_div(N, ROWS_PER_TASK);
    size_t sbytes = w ? sizeof(float) * (size_t)ntasks * (size_t)C : 0;
    float *scratch = sbytes ? l3d_malloc(dev->ctx, sbytes, "scratch") : NULL;
    if (sbytes && !scratch) {
        l3d_cpu_args_narrow(dev, v, 3, 0);
        return L3D_ERR_NOMEM;
    }
    rowdot_t r = {out, scratch, v[0].f, v[1].f, w ? v[2].f : NULL, N, C};
    l3d_cpu_run(dev, rowdot_task, &r, ntasks);
    l3d_free(dev->ctx, scratch, sbytes, "scratch");
    l3d_cpu_args_narrow(dev, v, 3, 1);
    return L3D_OK;
}

l3d_status l3d_cpu_rmsnorm_rows_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                    const void *w, const float *ss, int N, int C, int C_full,
                                    float eps, l3d_dtype at, l3d_dtype wt) {
    return rmsnorm_fwd_entry(dev, "rmsnorm_rows_fwd", out, rstd, x, w, ss, N, C, C_full, eps, at,
                             wt);
}

l3d_status l3d_cpu_rmsnorm_rows_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                    const void *x, const void *w, const float *rstd,
                                    const float *dot, int N, int C, int C_full, l3d_dtype at,
                                    l3d_dtype wt, l3d_dtype gt) {
    return rmsnorm_bwd_entry(dev, "rmsnorm_rows_bwd", dx, dw, dout, x, w, rstd, dot, N, C,
                             C_full, at, wt, gt);
}
