// The CPU op tests' shared helpers: a ctx with a CPU device of N threads, a seeded LCG,
// vectors, and the relative-error check against a float64 reference.
#ifndef L3D_TEST_HARNESS_CPU_ENV_H
#define L3D_TEST_HARNESS_CPU_ENV_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"

typedef struct {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
} env_t;

static inline env_t env_open(int nthreads) {
    env_t e;
    cr_assert_eq(l3d_ctx_create(NULL, &e.ctx), L3D_OK);
    l3d_device_params_t p = {.num_threads = nthreads};
    cr_assert_eq(l3d_device_create(e.ctx, "cpu", &p, &e.dev), L3D_OK);
    cr_assert_eq(e.dev->num_threads, nthreads);
    return e;
}
static inline void env_close(env_t e) {
    l3d_device_destroy(e.dev);
    l3d_ctx_destroy(e.ctx);
}

// A 64-bit LCG (Knuth's MMIX constants): uniform in [-1, 1).
static uint64_t rng_state = 1;
static inline void rng_seed(uint64_t s) { rng_state = s * 2862933555777941757ull + 3037000493ull; }
static inline float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}
static inline float *fvec(size_t n, float amp) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = amp * frand();
    return x;
}
static inline double *dvec(size_t n) { return calloc(n ? n : 1, sizeof(double)); }
static inline float *fdup(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}

// max |got - ref| / max |ref|: the error relative to the output's scale.
static inline void check_close(const char *what, const float *got, const double *ref, size_t n,
                        double rtol) {
    double scale = 0.0, err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]);
        cr_assert(isfinite(got[i]), "%s: element %zu is %g", what, i, (double)got[i]);
        if (e > err) err = e, worst = i;
    }
    if (scale == 0.0) scale = 1.0;
    cr_assert(err <= rtol * scale, "%s: max error %.3g at %zu (got %.9g ref %.9g, scale %.3g)",
              what, err, worst, n ? (double)got[worst] : 0.0, n ? ref[worst] : 0.0, scale);
}

// Bit-identical results of two thread counts.
static inline void same(const char *what, const void *a, const void *b, size_t bytes) {
    cr_assert_eq(memcmp(a, b, bytes), 0, "%s differs between 1 and 3 threads", what);
}

#endif
