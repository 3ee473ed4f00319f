// Elementwise kernels over flat arrays: SwiGLU, add, scale, the sum of squares (gradient
// clipping) and the AdamW step. Work is cut into fixed chunks of L3D_CPU_CHUNK elements; with
// 16-bit operands each task widens its chunk into its scratch slot, runs the same float32
// body on it and rounds its outputs back, so the results are the float32 ones rounded once.
// defines: l3d_cpu_swiglu_fwd/bwd, l3d_cpu_add, l3d_cpu_scale, l3d_cpu_sumsq, l3d_cpu_sum_f64,
//          l3d_cpu_adamw
#include <math.h>

#include "devices/cpu/cpu.h"

L3D_CPU_VECTORIZE

// The operands: a, b, c are read; out, out2 are written (out is also read by scale). Those
// named in `typed` hold the op's dtype `t` (the caller's pointers, cast); p, m, v, partials are
// always float32 (AdamW's master weights and moments, sumsq's partial sums). p16, when set,
// receives p rounded to p16t after the body (AdamW's 16-bit copy).
typedef struct {
    float *out, *out2, *p, *m, *v;
    void *p16;
    l3d_dtype p16t;
    const float *a, *b, *c;
    double *partials;
    size_t n;
    float s;
    l3d_adamw_k_t adam;  // (devices/device_math.h)
} ew_t;

enum { EW_A = 1, EW_B = 2, EW_C = 4, EW_OUT = 8, EW_OUT2 = 16 };

// A body runs elements [0, len) of its operands (already offset to the chunk); `task` is
// the chunk's index (sumsq's partial).
typedef void (*ew_body_fn)(const ew_t *e, size_t len, int task);

typedef struct {
    ew_t e;
    ew_body_fn body;
    l3d_dtype t;
    unsigned typed;
    int out_read;  // out is read before it is written (scale)
    l3d_cpu_t *cpu;
} ew_job_t;

static int ew_tasks(size_t n) { return (int)((n + L3D_CPU_CHUNK - 1) / L3D_CPU_CHUNK); }

// A typed operand's chunk [i0, i0+len) widened into the slot buffer *s (advanced past it).
static const float *ew_in(const void *p, l3d_dtype t, size_t i0, size_t len, float **s) {
    float *f = *s;
    *s += L3D_CPU_CHUNK;
    l3d_cpu_convert_serial(f, L3D_FLOAT32, (const char *)p + i0 * l3d_dtype_size(t), t, len);
    return f;
}

// The chunk's p (l->p, already offset) rounded into p16 (one rounding per element)
static void ew_round_p(const ew_t *e, const ew_t *l, size_t i0, size_t len) {
    if (e->p16)
        l3d_cpu_convert_serial((char *)e->p16 + i0 * l3d_dtype_size(e->p16t), e->p16t, l->p,
                               L3D_FLOAT32, len);
}

static void ew_task(void *arg, int task, int ntasks) {
    const ew_job_t *j = arg;
    const ew_t *e = &j->e;
    size_t i0 = (size_t)task * L3D_CPU_CHUNK, len = L3D_MIN(e->n - i0, (size_t)L3D_CPU_CHUNK);
    ew_t l = *e;  // the chunk's view
    if (l.p) l.p += i0;
    if (l.m) l.m += i0;
    if (l.v) l.v += i0;
    if (!j->typed) {
        if (l.a) l.a += i0;
        if (l.b) l.b += i0;
        if (l.c) l.c += i0;
        if (l.out) l.out += i0;
        if (l.out2) l.out2 += i0;
        j->body(&l, len, task);
        ew_round_p(e, &l, i0, len);
        return;
    }
    int slot;
    float *s = l3d_cpu_scratch_acquire(j->cpu, &slot);
    size_t es = l3d_dtype_size(j->t);
    // An operand not named in `typed` is float32 and only offset (as above).
    if (j->typed & EW_A) l.a = ew_in(e->a, j->t, i0, len, &s);
    else if (l.a) l.a += i0;
    if (j->typed & EW_B) l.b = ew_in(e->b, j->t, i0, len, &s);
    else if (l.b) l.b += i0;
    if (j->typed & EW_C) l.c = ew_in(e->c, j->t, i0, len, &s);
    else if (l.c) l.c += i0;
    // Outputs get buffers of their own: an input they alias is fully read before the store.
    if (j->typed & EW_OUT) {
        l.out = s;
        if (j->out_read) ew_in(e->out, j->t, i0, len, &s);
        else s += L3D_CPU_CHUNK;
    } else if (l.out) {
        l.out += i0;
    }
    if (j->typed & EW_OUT2) l.out2 = s;
    else if (l.out2) l.out2 += i0;
    j->body(&l, len, task);
    if (j->typed & EW_OUT)
        l3d_cpu_convert_serial((char *)e->out + i0 * es, j->t, l.out, L3D_FLOAT32, len);
    if (j->typed & EW_OUT2)
        l3d_cpu_convert_serial((char *)e->out2 + i0 * es, j->t, l.out2, L3D_FLOAT32, len);
    ew_round_p(e, &l, i0, len);
    l3d_cpu_scratch_release(j->cpu, slot);
}

// Runs body over every chunk; `typed` names the operands stored in t (none for float32).
static l3d_status ew_run(l3d_device_t *dev, const char *op, const ew_t *e, ew_body_fn body,
                         l3d_dtype t, unsigned typed, int out_read) {
    if (l3d_cpu_dtype_bad(dev, op, "dtype", t)) return L3D_ERR_INVALID_ARG;
    ew_job_t j = {*e, body, t, t == L3D_FLOAT32 ? 0u : typed, out_read, l3d_cpu_priv(dev)};
    if (j.typed) L3D_CHECK(dev->ctx, l3d_cpu_scratch_reserve(dev, 5 * (size_t)L3D_CPU_CHUNK));
    l3d_cpu_run(dev, ew_task, &j, ew_tasks(e->n));
    return L3D_OK;
}

// ---- swiglu -------------------------------------------------------------------------------------
// out may alias gate or up, so no restrict: each element is read before it is written.
L3D_CPU_SIMD static void swiglu_fwd_body(const ew_t *e, size_t len, int task) {
    for (size_t i = 0; i < len; i++) e->out[i] = l3d_swiglu(e->a[i], e->b[i]);
}

// out(n) = silu(gate) * up
l3d_status l3d_cpu_swiglu_fwd(l3d_device_t *dev, void *out, const void *gate, const void *up,
                              size_t n, l3d_dtype at) {
    ew_t e = {.out = out, .a = gate, .b = up, .n = n};
    return ew_run(dev, "swiglu_fwd", &e, swiglu_fwd_body, at, EW_A | EW_B | EW_OUT, 0);
}

// (l3d_swiglu_grad: silu's derivative)
L3D_CPU_SIMD static void swiglu_bwd_body(const ew_t *e, size_t len, int task) {
    for (size_t i = 0; i < len; i++) {
        float dg, du;
        l3d_swiglu_grad(e->a[i], e->b[i], e->c[i], &dg, &du);
        e->out[i] = dg;
        e->out2[i] = du;
    }
}

// dgate(n), dup(n) from dout(n); dgate may alias gate, dup may alias up
l3d_status l3d_cpu_swiglu_bwd(l3d_device_t *dev, void *dgate, void *dup, const void *dout,
                              const void *gate, const void *up, size_t n, l3d_dtype at) {
    ew_t e = {.out = dgate, .out2 = dup, .a = gate, .b = up, .c = dout, .n = n};
    return ew_run(dev, "swiglu_bwd", &e, swiglu_bwd_body, at,
                  EW_A | EW_B | EW_C | EW_OUT | EW_OUT2, 0);
}

// ---- add, scale ---------------------------------------------------------------------------------
L3D_CPU_SIMD static void add_body(const ew_t *e, size_t len, int task) {
    float *out = e->out;
    const float *a = e->a, *b = e->b;
    for (size_t i = 0; i < len; i++) out[i] = a[i] + b[i];
}

// out(n) = a + b; out may alias a or b
l3d_status l3d_cpu_add(l3d_device_t *dev, void *out, const void *a, const void *b, size_t n,
                       l3d_dtype at) {
    ew_t e = {.out = out, .a = a, .b = b, .n = n};
    return ew_run(dev, "add", &e, add_body, at, EW_A | EW_B | EW_OUT, 0);
}

L3D_CPU_SIMD static void scale_body(const ew_t *e, size_t len, int task) {
    float *restrict x = e->out;
    float s = e->s;
    for (size_t i = 0; i < len; i++) x[i] *= s;
}

// x(n) *= s
l3d_status l3d_cpu_scale(l3d_device_t *dev, void *x, float s, size_t n, l3d_dtype at) {
    ew_t e = {.out = x, .s = s, .n = n};
    return ew_run(dev, "scale", &e, scale_body, at, EW_OUT, 1);
}

// ---- sumsq --------------------------------------------------------------------------------------
// Each chunk's partial is 8 interleaved double sums folded pairwise; the partials are then
// added in chunk order on the caller, so the result depends on n alone.
L3D_CPU_SIMD static void sumsq_body(const ew_t *e, size_t len, int task) {
    const float *restrict x = e->a;
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= len; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * (double)x[i + k];
    for (; i < len; i++) acc[0] += (double)x[i] * (double)x[i];
    for (int w = 4; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) acc[k] += acc[k + w];
    e->partials[task] = acc[0];
}

// sum of x(n)^2 in double
static l3d_status sumsq_one(l3d_device_t *dev, const void *x, size_t n, double *out,
                            l3d_dtype at) {
    int nt = ew_tasks(n);
    if (nt == 0) {
        *out = 0.0;
        return L3D_OK;
    }
    size_t bytes = sizeof(double) * (size_t)nt;
    double *part = l3d_malloc(dev->ctx, bytes, "scratch");
    if (!part) return L3D_ERR_NOMEM;
    ew_t e = {.a = x, .partials = part, .n = n};
    l3d_status st = ew_run(dev, "sumsq", &e, sumsq_body, at, EW_A, 0);
    double s = 0.0;
    for (int t = 0; t < nt; t++) s += part[t];
    l3d_free(dev->ctx, part, bytes, "scratch");
    if (st >= 0) *out = s;
    return st;
}

// *out = sum_k w[k] * sum of x[k](len[k])^2, in k order
l3d_status l3d_cpu_sumsq(l3d_device_t *dev, int n, const void *const *x, const size_t *len,
                         const double *w, double *out, l3d_dtype at) {
    if (l3d_cpu_dtype_bad(dev, "sumsq", "x", at)) return L3D_ERR_INVALID_ARG;
    if (n < 0) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "sumsq: %d tensors", n);
    double acc = 0.0;
    for (int k = 0; k < n; k++) {
        double s;
        L3D_CHECK(dev->ctx, sumsq_one(dev, x[k], len[k], &s, at));
        acc += (w ? w[k] : 1.0) * s;
    }
    *out = acc;
    return L3D_OK;
}

l3d_status l3d_cpu_sum_f64(l3d_device_t *dev, double *out, const double *x, int n) {
    if (n < 0) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "sum_f64: %d values", n);
    *out = l3d_sum_f64_ordered(x, n);
    return L3D_OK;
}

// ---- adamw --------------------------------------------------------------------------------------
L3D_CPU_SIMD static void adamw_body(const ew_t *e, size_t len, int task) {
    float *restrict p = e->p, *restrict m = e->m, *restrict v = e->v;
    const float *restrict grad = e->a;
    l3d_adamw_k_t k = e->adam;
    for (size_t i = 0; i < len; i++) l3d_adamw_elem(&k, grad[i], &p[i], &m[i], &v[i]);
}

// torch.optim.AdamW (decoupled decay first, then the moments, then the update), tensor by
// tensor, each one's chunks over the threads and its 16-bit copy rounded chunk by chunk.
l3d_status l3d_cpu_adamw(l3d_device_t *dev, const l3d_adamw_tensor_t *ts, int n,
                         const l3d_adamw_step_t *s) {
    if (n < 0 || (n && !ts) || !s)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "adamw: %d tensors (ts %p, step %p)", n,
                         (const void *)ts, (const void *)s);
    if (!(s->bc1 > 0.0f) || !(s->bc2 > 0.0f))
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "adamw: bias corrections bc1 %g bc2 %g must be > 0", (double)s->bc1,
                         (double)s->bc2);
    float grad_scale = s->grad_scale;
    if (s->sumsq) {  // clipping and the overflow skip from the norm (device.h)
        if (!isfinite(*s->sumsq)) return L3D_OK;
        grad_scale = l3d_adamw_gscale(*s->sumsq, grad_scale, s->max_norm);
    }
    for (int i = 0; i < n; i++) {
        const l3d_adamw_tensor_t *t = &ts[i];
        if (t->param16 && l3d_cpu_dtype_bad(dev, "adamw", "wt", s->wt))
            return L3D_ERR_INVALID_ARG;
        ew_t e = {.p = t->param, .a = t->grad, .m = t->m, .v = t->v, .n = t->n,
                  .p16 = t->param16, .p16t = s->wt,
                  .adam = l3d_adamw_consts(s->lr, s->beta1, s->beta2, s->eps, t->weight_decay,
                                           s->bc1, s->bc2, grad_scale)};
        L3D_CHECK(dev->ctx, ew_run(dev, "adamw", &e, adamw_body, s->gt, EW_A, 0));
    }
    return L3D_OK;
}
