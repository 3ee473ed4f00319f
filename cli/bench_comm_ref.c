// l3d bench comm's reference values: what every rank sends and what every output must be
// (cli/bench_comm.h).
// defines: l3d_bc_pat, l3d_bc_encode, l3d_bc_fill, l3d_bc_expect_red
#include <string.h>

#include "cli/bench_comm.h"
#include "devices/device_math.h"

int64_t l3d_bc_pat(l3d_dtype dt, int rank, size_t i) {
    if (dt == L3D_UINT8) return (int64_t)((i * 37u + (size_t)rank * 101u + 7u) & 0xffu);
    return (int64_t)((i * 7u + (size_t)rank * 13u + 1u) % 11u);
}

// (16-bit values rounded as every device rounds: devices/device_math.h)

// Writes integer v as one element of dt; with avg, the reduced value v / n.
void l3d_bc_encode(l3d_dtype dt, int64_t v, int avg, int n, void *out) {
    float f = (float)v;
    if (avg) f /= (float)n;
    switch (dt) {
    case L3D_FLOAT32: memcpy(out, &f, 4); break;
    case L3D_BFLOAT16: {
        uint16_t h = l3d_f32_to_bf16(f);
        memcpy(out, &h, 2);
        break;
    }
    case L3D_FLOAT16: {
        uint16_t h = l3d_f32_to_f16(f);
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
