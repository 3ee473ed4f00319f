// Dtype conversion between float32, bfloat16 and float16, on the pool in fixed chunks, with
// the conversions of devices/device_math.h (which core's collectives and checkpoints round by
// too), written without branches so the loops vectorise (tests/test_cpu_dtypes.c checks every
// 16-bit value, every midpoint and the floats beside them against the formats' definitions).
// Also the 16-bit operands of gemm and of every other op (l3d_cpu_args_widen,
// l3d_cpu_rows_widened).
// defines: l3d_cpu_convert, l3d_cpu_convert_run, l3d_cpu_convert_serial, l3d_cpu_dtype_ok,
//          l3d_cpu_dtype_bad, l3d_cpu_args_widen/narrow, l3d_cpu_rows_widened
#include <string.h>

#include "devices/cpu/cpu.h"

L3D_CPU_VECTORIZE

typedef struct {
    void *dst;
    const void *src;
    l3d_dtype dt, st;
    size_t n;
} conv_t;

int l3d_cpu_dtype_ok(l3d_dtype t) {
    return t == L3D_FLOAT32 || t == L3D_BFLOAT16 || t == L3D_FLOAT16;
}

// The conversions themselves: devices/device_math.h (one copy for every device and core).

// One loop per (source, destination) pair, each vectorised for the clone's ISA.
L3D_CPU_SIMD static void conv_loops(const conv_t *c, size_t i0, size_t i1) {
    const float *restrict sf = c->src;
    const uint16_t *restrict sh = c->src;
    float *restrict df = c->dst;
    uint16_t *restrict dh = c->dst;
    if (c->st == L3D_FLOAT32 && c->dt == L3D_BFLOAT16)
        for (size_t i = i0; i < i1; i++) dh[i] = l3d_f32_to_bf16(sf[i]);
    else if (c->st == L3D_FLOAT32)  // to float16
        for (size_t i = i0; i < i1; i++) dh[i] = l3d_f32_to_f16(sf[i]);
    else if (c->st == L3D_BFLOAT16 && c->dt == L3D_FLOAT32)
        for (size_t i = i0; i < i1; i++) df[i] = l3d_bf16_to_f32(sh[i]);
    else if (c->st == L3D_FLOAT16 && c->dt == L3D_FLOAT32)
        for (size_t i = i0; i < i1; i++) df[i] = l3d_f16_to_f32(sh[i]);
    else if (c->st == L3D_BFLOAT16)  // to float16, through float32 (exact)
        for (size_t i = i0; i < i1; i++) dh[i] = l3d_f32_to_f16(l3d_bf16_to_f32(sh[i]));
    else  // float16 to bfloat16
        for (size_t i = i0; i < i1; i++) dh[i] = l3d_f32_to_bf16(l3d_f16_to_f32(sh[i]));
}

// Elements [i0, i1): every pair of distinct types is one widening and one narrowing.
static void conv_range(const conv_t *c, size_t i0, size_t i1) { conv_loops(c, i0, i1); }

static void conv_task(void *arg, int task, int ntasks) {
    const conv_t *c = arg;
    size_t i0 = (size_t)task * L3D_CPU_CHUNK;
    conv_range(c, i0, L3D_MIN(c->n, i0 + L3D_CPU_CHUNK));
}

// The caller has checked both dtypes.
void l3d_cpu_convert_run(l3d_device_t *dev, void *dst, l3d_dtype dst_type, const void *src,
                         l3d_dtype src_type, size_t n) {
    if (n == 0) return;
    if (dst_type == src_type) {
        if (dst != src) memmove(dst, src, n * l3d_dtype_size(dst_type));
        return;
    }
    conv_t c = {dst, src, dst_type, src_type, n};
    if (n <= L3D_CPU_CHUNK) conv_range(&c, 0, n);
    else l3d_cpu_run(dev, conv_task, &c, (int)((n + L3D_CPU_CHUNK - 1) / L3D_CPU_CHUNK));
}

l3d_status l3d_cpu_convert(l3d_device_t *dev, void *dst, l3d_dtype dst_type, const void *src,
                           l3d_dtype src_type, size_t n) {
    if (!l3d_cpu_dtype_ok(dst_type) || !l3d_cpu_dtype_ok(src_type))
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                         "convert: %s to %s (float32, bfloat16 and float16 only)",
                         l3d_dtype_name(src_type), l3d_dtype_name(dst_type));
    if (n && (!dst || !src))
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "convert: NULL %s", !dst ? "dst" : "src");
    l3d_cpu_convert_run(dev, dst, dst_type, src, src_type, n);
    return L3D_OK;
}

void l3d_cpu_convert_serial(void *dst, l3d_dtype dst_type, const void *src, l3d_dtype src_type,
                            size_t n) {
    if (dst_type == src_type) {
        if (n && dst != src) memmove(dst, src, n * l3d_dtype_size(dst_type));
        return;
    }
    conv_t c = {dst, src, dst_type, src_type, n};
    conv_range(&c, 0, n);
}

int l3d_cpu_dtype_bad(l3d_device_t *dev, const char *op, const char *arg, l3d_dtype t) {
    if (l3d_cpu_dtype_ok(t)) return 0;
    l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s: %s is %s (float32, bfloat16 and float16 only)",
              op, arg, l3d_dtype_name(t));
    return 1;
}

// ---- whole operands widened for an op -----------------------------------------------------------
l3d_status l3d_cpu_args_widen(l3d_device_t *dev, const char *op, l3d_cpu_arg_t *a, int n) {
    for (int i = 0; i < n; i++) {
        a[i].f = NULL;
        a[i].owner = 0;
        if (l3d_cpu_dtype_bad(dev, op, a[i].name, a[i].t)) return L3D_ERR_INVALID_ARG;
    }
    // Operands with the same 16-bit tensor (an output aliasing an input) share the first one's
    // copy, read in if any of them is read: its reads and writes come first.
    for (int i = 0; i < n; i++) {
        if (!a[i].p || a[i].t == L3D_FLOAT32) continue;
        int j = 0;
        while (j < i && !(a[j].p == a[i].p && a[j].t == a[i].t)) j++;
        if (j == i) {
            a[i].owner = 1;
            continue;
        }
        while (!a[j].owner) j++;  // the first of the group
        if (a[i].n != a[j].n)
            return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s: %s and %s share memory but not "
                             "their size", op, a[i].name, a[j].name);
        a[j].io |= a[i].io;
    }
    // The owners' copies side by side in the device's workspace, each 64-byte aligned.
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (a[i].owner) total += (a[i].n + 15) & ~(size_t)15;
    float *w = total ? l3d_cpu_wide(dev, total) : NULL;
    if (total && !w) return L3D_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        l3d_cpu_arg_t *x = &a[i];
        if (x->t == L3D_FLOAT32) x->f = (float *)x->p;  // written only where the op may
        if (!x->owner || !x->n) continue;
        x->f = w;
        w += (x->n + 15) & ~(size_t)15;
        if (x->io & L3D_CPU_IN) l3d_cpu_convert_run(dev, x->f, L3D_FLOAT32, x->p, x->t, x->n);
    }
    for (int i = 0; i < n; i++)  // the sharers take the owner's copy
        if (!a[i].owner && a[i].p && a[i].t != L3D_FLOAT32)
            for (int j = 0; j < i; j++)
                if (a[j].owner && a[j].p == a[i].p && a[j].t == a[i].t) a[i].f = a[j].f;
    return L3D_OK;
}

void l3d_cpu_args_narrow(l3d_device_t *dev, l3d_cpu_arg_t *a, int n, int store) {
    for (int i = 0; i < n; i++) {
        l3d_cpu_arg_t *x = &a[i];
        if (!x->owner) continue;
        x->owner = 0;
        if (!x->f) continue;  // an empty operand
        if (store && (x->io & L3D_CPU_OUT))
            l3d_cpu_convert_run(dev, (void *)x->p, x->t, x->f, L3D_FLOAT32, x->n);
        x->f = NULL;  // the workspace stays the device's
    }
}

// ---- rows widened a block at a time -------------------------------------------------------------
// Blocks of 4 rows per thread: each task of the row kernels (cpu_xent.c, cpu_vocab.c) takes 4
// rows, so a block keeps every thread busy, and a (N, 128k) logit matrix costs a few MiB.
#define ROWS_PER_BLOCK_PER_THREAD 4

l3d_status l3d_cpu_rows_widened(l3d_device_t *dev, const char *op, void *m, l3d_dtype t, int N,
                                int V, int write, l3d_cpu_rows_fn fn, void *arg) {
    if (l3d_cpu_dtype_bad(dev, op, "logits", t)) return L3D_ERR_INVALID_ARG;
    // Nothing to widen: the kernel checks the shape, or has no element to read (Vl 0).
    if (N <= 0 || V <= 0) return fn(dev, (float *)m, 0, N, arg);
    int R = L3D_MIN(N, ROWS_PER_BLOCK_PER_THREAD * l3d_cpu_priv(dev)->nthreads);
    size_t es = l3d_dtype_size(t);
    float *buf = l3d_cpu_wide(dev, (size_t)R * (size_t)V);
    if (!buf) return L3D_ERR_NOMEM;
    l3d_status st = L3D_OK;
    for (int r0 = 0; r0 < N && st >= 0; r0 += R) {
        int r = L3D_MIN(R, N - r0);
        char *rows = (char *)m + (size_t)r0 * (size_t)V * es;
        l3d_cpu_convert_run(dev, buf, L3D_FLOAT32, rows, t, (size_t)r * (size_t)V);
        st = fn(dev, buf, r0, r, arg);
        if (st >= 0 && write)
            l3d_cpu_convert_run(dev, rows, t, buf, L3D_FLOAT32, (size_t)r * (size_t)V);
    }
    return st;
}
