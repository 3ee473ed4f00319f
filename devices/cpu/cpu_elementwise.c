// Elementwise kernels over flat arrays: SwiGLU, add, scale, the sum of squares (gradient
// clipping) and the AdamW step. Work is cut into fixed chunks of L3D_CPU_CHUNK elements.
// defines: l3d_cpu_swiglu_fwd/bwd, l3d_cpu_add, l3d_cpu_scale, l3d_cpu_sumsq, l3d_cpu_adamw
#include <math.h>

#include "devices/cpu/cpu.h"

L3D_CPU_VECTORIZE

typedef struct {
    float *out, *out2, *p, *m, *v;
    const float *a, *b, *c;
    double *partials;
    size_t n;
    float s, lr, beta1, beta2, eps, decay, step, bc2_sqrt, gscale;
} ew_t;

static int ew_tasks(size_t n) { return (int)((n + L3D_CPU_CHUNK - 1) / L3D_CPU_CHUNK); }
static void ew_range(const ew_t *e, int task, size_t *i0, size_t *i1) {
    *i0 = (size_t)task * L3D_CPU_CHUNK;
    *i1 = *i0 + L3D_CPU_CHUNK < e->n ? *i0 + L3D_CPU_CHUNK : e->n;
}

L3D_CPU_INLINE float sigmoidf(float x) { return 1.0f / (1.0f + l3d_cpu_expf(-x)); }

// ---- swiglu -------------------------------------------------------------------------------------
// out may alias gate or up, so no restrict: each element is read before it is written.
L3D_CPU_SIMD static void swiglu_fwd_task(void *arg, int task, int ntasks) {
    const ew_t *e = arg;
    size_t i0, i1;
    ew_range(e, task, &i0, &i1);
    for (size_t i = i0; i < i1; i++) {
        float g = e->a[i], u = e->b[i];
        e->out[i] = g * sigmoidf(g) * u;
    }
}

// out(n) = silu(gate) * up
l3d_status l3d_cpu_swiglu_fwd(l3d_device_t *dev, float *out, const float *gate, const float *up,
                              size_t n) {
    ew_t e = {.out = out, .a = gate, .b = up, .n = n};
    l3d_cpu_run(dev, swiglu_fwd_task, &e, ew_tasks(n));
    return L3D_OK;
}

// d silu(g)/dg = sig(g) * (1 + g * (1 - sig(g)))
L3D_CPU_SIMD static void swiglu_bwd_task(void *arg, int task, int ntasks) {
    const ew_t *e = arg;
    size_t i0, i1;
    ew_range(e, task, &i0, &i1);
    for (size_t i = i0; i < i1; i++) {
        float g = e->a[i], u = e->b[i], d = e->c[i];
        float sg = sigmoidf(g);
        float dg = d * u * sg * (1.0f + g * (1.0f - sg));
        float du = d * g * sg;
        e->out[i] = dg;
        e->out2[i] = du;
    }
}

// dgate(n), dup(n) from dout(n); dgate may alias gate, dup may alias up
l3d_status l3d_cpu_swiglu_bwd(l3d_device_t *dev, float *dgate, float *dup, const float *dout,
                              const float *gate, const float *up, size_t n) {
    ew_t e = {.out = dgate, .out2 = dup, .a = gate, .b = up, .c = dout, .n = n};
    l3d_cpu_run(dev, swiglu_bwd_task, &e, ew_tasks(n));
    return L3D_OK;
}

// ---- add, scale ---------------------------------------------------------------------------------
L3D_CPU_SIMD static void add_task(void *arg, int task, int ntasks) {
    const ew_t *e = arg;
    size_t i0, i1;
    ew_range(e, task, &i0, &i1);
    float *out = e->out;
    const float *a = e->a, *b = e->b;
    for (size_t i = i0; i < i1; i++) out[i] = a[i] + b[i];
}

// out(n) = a + b; out may alias a or b
l3d_status l3d_cpu_add(l3d_device_t *dev, float *out, const float *a, const float *b, size_t n) {
    ew_t e = {.out = out, .a = a, .b = b, .n = n};
    l3d_cpu_run(dev, add_task, &e, ew_tasks(n));
    return L3D_OK;
}

L3D_CPU_SIMD static void scale_task(void *arg, int task, int ntasks) {
    const ew_t *e = arg;
    size_t i0, i1;
    ew_range(e, task, &i0, &i1);
    float *restrict x = e->out;
    float s = e->s;
    for (size_t i = i0; i < i1; i++) x[i] *= s;
}

// x(n) *= s
l3d_status l3d_cpu_scale(l3d_device_t *dev, float *x, float s, size_t n) {
    ew_t e = {.out = x, .s = s, .n = n};
    l3d_cpu_run(dev, scale_task, &e, ew_tasks(n));
    return L3D_OK;
}

// ---- sumsq --------------------------------------------------------------------------------------
// Each chunk's partial is 8 interleaved double sums folded pairwise; the partials are then
// added in chunk order on the caller, so the result depends on n alone.
L3D_CPU_SIMD static void sumsq_task(void *arg, int task, int ntasks) {
    const ew_t *e = arg;
    size_t i0, i1;
    ew_range(e, task, &i0, &i1);
    const float *restrict x = e->a;
    double acc[8] = {0};
    size_t i = i0;
    for (; i + 8 <= i1; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * (double)x[i + k];
    for (; i < i1; i++) acc[0] += (double)x[i] * (double)x[i];
    for (int w = 4; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) acc[k] += acc[k + w];
    e->partials[task] = acc[0];
}

// *out_host = sum of x(n)^2 in double
l3d_status l3d_cpu_sumsq(l3d_device_t *dev, const float *x, size_t n, double *out_host) {
    int nt = ew_tasks(n);
    if (nt == 0) {
        *out_host = 0.0;
        return L3D_OK;
    }
    size_t bytes = sizeof(double) * (size_t)nt;
    double *part = l3d_malloc(dev->ctx, bytes, "scratch");
    if (!part) return L3D_ERR_NOMEM;
    ew_t e = {.a = x, .partials = part, .n = n};
    l3d_cpu_run(dev, sumsq_task, &e, nt);
    double s = 0.0;
    for (int t = 0; t < nt; t++) s += part[t];
    l3d_free(dev->ctx, part, bytes, "scratch");
    *out_host = s;
    return L3D_OK;
}

// ---- adamw --------------------------------------------------------------------------------------
L3D_CPU_SIMD static void adamw_task(void *arg, int task, int ntasks) {
    const ew_t *e = arg;
    size_t i0, i1;
    ew_range(e, task, &i0, &i1);
    float *restrict p = e->p, *restrict m = e->m, *restrict v = e->v;
    const float *restrict grad = e->a;
    float b1 = e->beta1, b2 = e->beta2, ob1 = 1.0f - e->beta1, ob2 = 1.0f - e->beta2;
    float decay = e->decay, nstep = -e->step, bc2s = e->bc2_sqrt, eps = e->eps, gs = e->gscale;
    for (size_t i = i0; i < i1; i++) {
        float g = grad[i] * gs;
        float pi = p[i] * decay;
        float mi = b1 * m[i] + ob1 * g;
        float vi = b2 * v[i] + ob2 * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + nstep * mi / (sqrtf(vi) / bc2s + eps);  // torch's addcdiv order
    }
}

// torch.optim.AdamW (decoupled decay first, then the moments, then the update)
l3d_status l3d_cpu_adamw(l3d_device_t *dev, float *param, const float *grad, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, float bc1, float bc2, float grad_scale) {
    if (!(bc1 > 0.0f) || !(bc2 > 0.0f))
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "adamw: bias corrections bc1 %g bc2 %g must be > 0", (double)bc1,
                         (double)bc2);
    ew_t e = {.p = param, .a = grad, .m = m, .v = v, .n = n, .beta1 = beta1, .beta2 = beta2,
              .eps = eps, .gscale = grad_scale,
              // scalars in double then rounded once, as torch does with its Python floats
              .decay = (float)(1.0 - (double)lr * (double)weight_decay),
              .step = (float)((double)lr / (double)bc1),
              .bc2_sqrt = (float)sqrt((double)bc2)};
    l3d_cpu_run(dev, adamw_task, &e, ew_tasks(n));
    return L3D_OK;
}
