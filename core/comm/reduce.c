// Reduction kernels for the collectives and the dtype helpers of include/llama3d/comm.h.
// Half types never reach the kernels: schedules widen them to float32 first, keep every
// partial sum in float32 and round once per output element (l3d_reduce_final), so the result
// equals a float32 reduction rounded once, whatever the algorithm.
#include <string.h>

#include "core/comm/comm_internal.h"

// These loops are memory bound and run on every byte a collective reduces: let GCC vectorise
// them at -O2 too (its -O2 cost model refuses loops that need a runtime alias check, and dst
// may alias an operand here).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

size_t l3d_dtype_size(l3d_dtype dt) {
    static const size_t sizes[L3D_DTYPE_COUNT] = {4, 2, 2, 4, 8, 1};
    return (unsigned)dt < L3D_DTYPE_COUNT ? sizes[dt] : 0;
}

const char *l3d_dtype_name(l3d_dtype dt) {
    static const char *names[L3D_DTYPE_COUNT] = {"float32", "bfloat16", "float16",
                                                 "int32",   "int64",    "uint8"};
    return (unsigned)dt < L3D_DTYPE_COUNT ? names[dt] : "?";
}

const char *l3d_redop_name(l3d_redop op) {
    static const char *names[L3D_REDOP_COUNT] = {"sum", "avg", "max", "min"};
    return (unsigned)op < L3D_REDOP_COUNT ? names[op] : "?";
}

l3d_dtype l3d_reduce_wire_type(l3d_dtype dt) {
    return dt == L3D_BFLOAT16 || dt == L3D_FLOAT16 ? L3D_FLOAT32 : dt;
}

// ---- half conversions: devices/device_math.h -------------------------------------------------
void l3d_reduce_to_f32(float *dst, const void *src, size_t count, l3d_dtype dt) {
    const uint16_t *s = src;
    if (dt == L3D_BFLOAT16)
        for (size_t i = 0; i < count; i++) dst[i] = l3d_bf16_to_f32(s[i]);
    else if (dt == L3D_FLOAT16)
        for (size_t i = 0; i < count; i++) dst[i] = l3d_f16_to_f32(s[i]);
    else
        memmove(dst, src, count * 4);
}

// ---- kernels ------------------------------------------------------------------------------------
// Max and min pick by value and break ties (+0/-0) by bits, so every operand order gives the
// same bits; sums of integers use unsigned arithmetic (wrap, no undefined overflow).
#define REDUCE_LOOP(T, EXPR)                                   \
    do {                                                       \
        T *d_ = dst;                                           \
        const T *a_ = a, *b_ = b;                              \
        for (size_t i = 0; i < count; i++) {                   \
            T x = a_[i], y = b_[i];                            \
            d_[i] = (EXPR);                                    \
        }                                                      \
    } while (0)

static void reduce_f32(float *dst, const float *a, const float *b, size_t count, l3d_redop op) {
    if (op == L3D_SUM || op == L3D_AVG) {
        for (size_t i = 0; i < count; i++) dst[i] = a[i] + b[i];
        return;
    }
    for (size_t i = 0; i < count; i++) {
        float x = a[i], y = b[i];
        float r;
        if (x != y) r = (op == L3D_MAX) == (x > y) ? x : y;  // NaN compares unequal: picks y
        else r = l3d_u2f(op == L3D_MAX ? (l3d_f2u(x) & l3d_f2u(y)) : (l3d_f2u(x) | l3d_f2u(y)));
        dst[i] = r;
    }
}

void l3d_reduce_apply(void *dst, const void *a, const void *b, size_t count, l3d_dtype wdt,
                      l3d_redop op) {
    int sum = op == L3D_SUM || op == L3D_AVG, mx = op == L3D_MAX;
    switch (wdt) {
    case L3D_FLOAT32:
        reduce_f32(dst, a, b, count, op);
        break;
    case L3D_INT32:
        if (sum) REDUCE_LOOP(int32_t, (int32_t)((uint32_t)x + (uint32_t)y));
        else if (mx) REDUCE_LOOP(int32_t, x > y ? x : y);
        else REDUCE_LOOP(int32_t, x < y ? x : y);
        break;
    case L3D_INT64:
        if (sum) REDUCE_LOOP(int64_t, (int64_t)((uint64_t)x + (uint64_t)y));
        else if (mx) REDUCE_LOOP(int64_t, x > y ? x : y);
        else REDUCE_LOOP(int64_t, x < y ? x : y);
        break;
    case L3D_UINT8:
        if (sum) REDUCE_LOOP(uint8_t, (uint8_t)(x + y));
        else if (mx) REDUCE_LOOP(uint8_t, x > y ? x : y);
        else REDUCE_LOOP(uint8_t, x < y ? x : y);
        break;
    default:
        break;  // half types are widened before reduction (schedule invariant)
    }
}

void l3d_reduce_final(void *dst, const void *src, size_t count, l3d_dtype dt, l3d_redop op,
                      int n) {
    int avg = op == L3D_AVG && n > 1;
    if (dt == L3D_BFLOAT16 || dt == L3D_FLOAT16) {
        const float *s = src;
        uint16_t *d = dst;
        float fn = (float)n;
        for (size_t i = 0; i < count; i++) {
            float v = avg ? s[i] / fn : s[i];
            d[i] = dt == L3D_BFLOAT16 ? l3d_f32_to_bf16(v) : l3d_f32_to_f16(v);
        }
        return;
    }
    if (dst != src) memmove(dst, src, count * l3d_dtype_size(dt));
    if (!avg) return;
    switch (dt) {
    case L3D_FLOAT32: {
        float *d = dst, fn = (float)n;
        for (size_t i = 0; i < count; i++) d[i] /= fn;
        break;
    }
    case L3D_INT32: {
        int32_t *d = dst;
        for (size_t i = 0; i < count; i++) d[i] /= n;
        break;
    }
    case L3D_INT64: {
        int64_t *d = dst;
        for (size_t i = 0; i < count; i++) d[i] /= n;
        break;
    }
    case L3D_UINT8: {
        uint8_t *d = dst;
        for (size_t i = 0; i < count; i++) d[i] = (uint8_t)(d[i] / n);
        break;
    }
    default:
        break;
    }
}

l3d_status l3d_comm_sum_double(l3d_comm_t *c, double *x) {
    int n = c ? l3d_comm_size(c) : 1;
    if (n == 1) return L3D_OK;
    l3d_ctx_t *ctx = l3d_comm_ctx(c);
    double all[256], *buf = all;
    size_t bytes = (size_t)n * sizeof(double);
    if (n > 256 && !(buf = l3d_malloc(ctx, bytes, "other"))) return L3D_ERR_NOMEM;
    l3d_status st = l3d_comm_allgather(c, x, buf, sizeof(double), L3D_UINT8);
    if (st >= 0) {
        double s = 0;
        for (int i = 0; i < n; i++) s += buf[i];
        *x = s;
    }
    if (buf != all) l3d_free(ctx, buf, bytes, "other");
    return st;
}
