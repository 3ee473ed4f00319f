// Fused softmax + cross-entropy, in place over the logits: one pass for the max, one that
// overwrites each logit by exp(logit - max) while summing, one that scales to the gradient.
// defines: l3d_cpu_xent_fwd_bwd
#include <math.h>
#include <string.h>

#include "devices/cpu/cpu.h"

L3D_CPU_VECTORIZE

typedef struct {
    float *logits, *losses;
    const int32_t *targets;
    int V;
    float grad_scale;
} xent_t;

L3D_CPU_SIMD static void xent_row(const xent_t *x, int n) {
    int V = x->V, t = x->targets[n];
    float *restrict z = x->logits + (size_t)n * (size_t)V;
    if (t < 0) {  // ignored: zero loss, zero gradient
        memset(z, 0, sizeof(float) * (size_t)V);
        if (x->losses) x->losses[n] = 0.0f;
        return;
    }
    float mx = l3d_cpu_maxf(z, V, -INFINITY);
    float zt = z[t] - mx;
    for (int i = 0; i < V; i++) z[i] = l3d_expf(z[i] - mx);
    // The sum is in double (V can be 128k) in a fixed order.
    double sum = l3d_cpu_sumd(z, V);
    if (x->losses) x->losses[n] = (float)(log(sum) - (double)zt);
    float k = (float)((double)x->grad_scale / sum);
    for (int i = 0; i < V; i++) z[i] *= k;
    z[t] -= x->grad_scale;
}

#define XENT_ROWS_PER_TASK 4

typedef struct {
    xent_t x;
    int N;
} xent_job_t;

static void xent_task(void *arg, int task, int ntasks) {
    const xent_job_t *j = arg;
    int n1 = L3D_MIN(j->N, (task + 1) * XENT_ROWS_PER_TASK);
    for (int n = task * XENT_ROWS_PER_TASK; n < n1; n++) xent_row(&j->x, n);
}

static l3d_status xent_check(l3d_device_t *dev, const int32_t *targets, int N, int V) {
    if (N < 0 || V <= 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "xent: bad shape N %d V %d", N, V);
    for (int n = 0; n < N; n++)  // checked up front: an error leaves the logits untouched
        if (targets[n] >= V)
            return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                             "xent: target[%d] = %d is outside [0, %d)", n, targets[n], V);
    return L3D_OK;
}

typedef struct {
    float *losses;
    const int32_t *targets;
    int V;
    float grad_scale;
} xent_rows_t;

// Rows [r0, r0+nrows) of the logits, in float32 at `rows` (the kernel itself).
static l3d_status xent_rows(l3d_device_t *dev, float *rows, int r0, int nrows, void *arg) {
    const xent_rows_t *r = arg;
    xent_job_t j = {{rows, r->losses ? r->losses + r0 : NULL, r->targets + r0, r->V,
                     r->grad_scale}, nrows};
    l3d_cpu_run(dev, xent_task, &j, (nrows + XENT_ROWS_PER_TASK - 1) / XENT_ROWS_PER_TASK);
    return L3D_OK;
}

// logits(N,V) -> grad_scale * (softmax - onehot(target)); losses(N) = -log p(target).
// 16-bit logits: a block of rows at a time in float32, each row rounded once at the end.
l3d_status l3d_cpu_xent_fwd_bwd(l3d_device_t *dev, void *logits, float *losses,
                                const int32_t *targets, int N, int V, float grad_scale,
                                l3d_dtype at) {
    if (l3d_cpu_dtype_bad(dev, "xent", "logits", at)) return L3D_ERR_INVALID_ARG;
    L3D_CHECK(dev->ctx, xent_check(dev, targets, N, V));
    xent_rows_t r = {losses, targets, V, grad_scale};
    if (at == L3D_FLOAT32) return xent_rows(dev, logits, 0, N, &r);
    return l3d_cpu_rows_widened(dev, "xent", logits, at, N, V, 1, xent_rows, &r);
}
