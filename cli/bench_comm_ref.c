// l3d bench comm's reference values: what every rank sends and what every output must be
// (cli/bench_comm.h).
// defines: l3d_bc_pat, l3d_bc_encode, l3d_bc_fill, l3d_bc_expect_red
#include <string.h>

#include "cli/bench_comm.h"

int64_t l3d_bc_pat(l3d_dtype dt, int rank, size_t i) {
    if (dt == L3D_UINT8) return (int64_t)((i * 37u + (size_t)rank * 101u + 7u) & 0xffu);
    return (int64_t)((i * 7u + (size_t)rank * 13u + 1u) % 11u);
}

static uint32_t bc_fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// Round-to-nearest-even float32 -> bfloat16 / float16 (finite inputs; ours are).
static uint16_t bc_to_bf16(float f) {
    uint32_t u = bc_fbits(f);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t bc_to_f16(float f) {
    uint32_t x = bc_fbits(f), sign = (x >> 16) & 0x8000u, m = x & 0x7fffffu;
    int e = (int)((x >> 23) & 0xffu) - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {  // subnormal half: units of 2^-24
        if (e < -10) return (uint16_t)sign;
        m |= 0x800000u;
        unsigned shift = (unsigned)(14 - e);
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // a carry bumps the exponent
    return (uint16_t)(sign | h);
}

// Writes integer v as one element of dt; with avg, the reduced value v / n.
void l3d_bc_encode(l3d_dtype dt, int64_t v, int avg, int n, void *out) {
    float f = (float)v;
    if (avg) f /= (float)n;
    switch (dt) {
    case L3D_FLOAT32: memcpy(out, &f, 4); break;
    case L3D_BFLOAT16: {
        uint16_t h = bc_to_bf16(f);
        memcpy(out, &h, 2);
        break;
    }
    case L3D_FLOAT16: {
        uint16_t h = bc_to_f16(f);
        memcpy(out, &h, 2);
        break;
    }
    case L3D_INT32: {
        int32_t x = (int32_t)(avg ? v / n : v);
        memcpy(out, &x, 4);
        break;
    }
    case L3D_INT64: {
        int64_t x = avg ? v / n : v;
        memcpy(out, &x, 8);
        break;
    }
    default: {
        uint8_t x = (uint8_t)(v & 0xff);  // sums wrap in uint8, then avg divides
        if (avg) x = (uint8_t)(x / n);
        memcpy(out, &x, 1);
        break;
    }
    }
}

void l3d_bc_fill(l3d_dtype dt, size_t es, void *buf, int rank, size_t off, size_t count) {
    unsigned char *p = buf;
    for (size_t j = 0; j < count; j++) l3d_bc_encode(dt, l3d_bc_pat(dt, rank, off + j), 0, 1, p + j * es);
}

void l3d_bc_expect_red(l3d_dtype dt, l3d_redop op, int nranks, size_t g, void *out) {
    int64_t acc = l3d_bc_pat(dt, 0, g);
    for (int r = 1; r < nranks; r++) {
        int64_t v = l3d_bc_pat(dt, r, g);
        if (op == L3D_MAX) acc = v > acc ? v : acc;
        else if (op == L3D_MIN) acc = v < acc ? v : acc;
        else acc += v;
    }
    l3d_bc_encode(dt, acc, op == L3D_AVG, nranks, out);
}
