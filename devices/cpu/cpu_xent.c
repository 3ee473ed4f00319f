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
    for (int i = 0; i < V; i++) z[i] = l3d_cpu_expf(z[i] - mx);
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

// logits(N,V) -> grad_scale * (softmax - onehot(target)); losses(N) = -log p(target)
l3d_status l3d_cpu_xent_fwd_bwd(l3d_device_t *dev, float *logits, float *losses,
                                const int32_t *targets, int N, int V, float grad_scale) {
    if (N < 0 || V <= 0)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "xent: bad shape N %d V %d", N, V);
    for (int n = 0; n < N; n++)  // checked up front: an error leaves the logits untouched
        if (targets[n] >= V)
            return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                             "xent: target[%d] = %d is outside [0, %d)", n, targets[n], V);
    xent_job_t j = {{logits, losses, targets, V, grad_scale}, N};
    l3d_cpu_run(dev, xent_task, &j, (N + XENT_ROWS_PER_TASK - 1) / XENT_ROWS_PER_TASK);
    return L3D_OK;
}
