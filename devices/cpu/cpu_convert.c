// Dtype conversion between float32, bfloat16 and float16, on the pool in fixed chunks, with
// core's conversions (core/reduce.c: the rules the collectives already round by, tested
// exhaustively in test_safetensors and test_cpu_ops). Also the 16-bit operands of gemm.
// defines: l3d_cpu_convert, l3d_cpu_convert_run, l3d_cpu_dtype_ok
#include <string.h>

#include "core/reduce.h"
#include "devices/cpu/cpu.h"

typedef struct {
    void *dst;
    const void *src;
    l3d_dtype dt, st;
    size_t n;
} conv_t;

int l3d_cpu_dtype_ok(l3d_dtype t) {
    return t == L3D_FLOAT32 || t == L3D_BFLOAT16 || t == L3D_FLOAT16;
}

// Elements [i0, i1): through float32, so every pair of types is one widening and one narrowing.
static void conv_range(const conv_t *c, size_t i0, size_t i1) {
    const float *sf = c->src;
    const uint16_t *sh = c->src;
    float *df = c->dst;
    uint16_t *dh = c->dst;
    for (size_t i = i0; i < i1; i++) {
        float x = c->st == L3D_FLOAT32    ? sf[i]
                  : c->st == L3D_BFLOAT16 ? l3d_bf16_to_f32(sh[i])
                                          : l3d_f16_to_f32(sh[i]);
        if (c->dt == L3D_FLOAT32) df[i] = x;
        else dh[i] = c->dt == L3D_BFLOAT16 ? l3d_f32_to_bf16(x) : l3d_f32_to_f16(x);
    }
}

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
