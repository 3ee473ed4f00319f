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

// ---- half conversions ------------------------------------------------------------------------
static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float l3d_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t l3d_f32_to_bf16(float f) {
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest, ties to even
    return (uint16_t)(x >> 16);
}

float l3d_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        // zero or subnormal: man * 2^-24 is exact in float32
        float v = (float)man * 5.9604644775390625e-8f;
        return u2f(f2u(v) | sign);
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (man << 13));
    return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t l3d_f32_to_f16(float f) {
    uint32_t x = f2u(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        uint32_t m = man | 0x800000u;
        int shift = 14 - e;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // a carry may make it inf: right
    return (uint16_t)(sign | h);
}

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
        else r = u2f(op == L3D_MAX ? (f2u(x) & f2u(y)) : (f2u(x) | f2u(y)));
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
