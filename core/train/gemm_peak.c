// The MFU roof: a device's own table (a GPU) or its measured sgemm peak (the CPU), and never
// reporting MFU against a roof the run itself beat.
#include <math.h>

#include "core/l3d_core.h"
#include "devices/device.h"
#include "llama3d/train.h"
#include "platform/platform.h"

// One n x n x n sgemm, timed to completion.
static l3d_status time_gemm(l3d_device_t *dev, l3d_gemm_t *g, double *dt) {
    double t0 = l3d_time_now();
    L3D_CHECK(dev->ctx, l3d_dev_gemm(dev, g));
    L3D_CHECK(dev->ctx, l3d_dev_sync(dev));
    *dt = l3d_time_now() - t0;
    return L3D_OK;
}

// The size grows until one product takes long enough that the timer and the threads'
// start-up are noise (and large enough to leave the caches, like a model's matmuls), then
// the best of several runs after that warm-up: the least disturbed by other work on the
// machine. A busy machine can only lower the figure, never raise it.
enum { PEAK_MIN_N = 256, PEAK_MAX_N = 4096, PEAK_RUNS = 5 };
#define PEAK_MIN_SECONDS 0.05

static void free3(l3d_device_t *dev, float *m[3], size_t bytes) {
    for (int i = 2; i >= 0; i--) l3d_dev_free(dev, m[i], bytes, "staging");
    m[0] = m[1] = m[2] = NULL;
}

l3d_status l3d_gemm_peak_measure(l3d_ctx_t *ctx, const char *device, int threads,
                                 double *flops_p) {
    if (!ctx || !flops_p) return L3D_ERR_INVALID_ARG;
    *flops_p = 0.0;
    l3d_device_t *dev = NULL;
    l3d_device_params_t dp = {.num_threads = threads, .device_index = 0};
    L3D_CHECK(ctx, l3d_device_create(ctx, device ? device : "cpu", &dp, &dev));
    float *m[3] = {NULL, NULL, NULL};
    size_t bytes = 0;
    l3d_status st = L3D_OK;
    l3d_gemm_t g;
    for (int n = PEAK_MIN_N;; n *= 2) {
        free3(dev, m, bytes);
        bytes = (size_t)n * n * sizeof(float);
        for (int i = 0; i < 3; i++)
            L3D_CHECK_GOTO(ctx, l3d_dev_alloc(dev, bytes, "staging", (void **)&m[i]), st, out);
        // Small non-zero values: zeros could take a fast path on some devices.
        L3D_CHECK_GOTO(ctx, l3d_dev_memset(dev, m[0], 0x3c, bytes), st, out);
        L3D_CHECK_GOTO(ctx, l3d_dev_memset(dev, m[1], 0x3c, bytes), st, out);
        g = (l3d_gemm_t){.M = n, .N = n, .K = n, .alpha = 1, .beta = 0, .A = m[0], .lda = n,
                         .B = m[1], .ldb = n, .C = m[2], .ldc = n};
        double dt;
        L3D_CHECK_GOTO(ctx, time_gemm(dev, &g, &dt), st, out);  // also the warm-up
        if (dt >= PEAK_MIN_SECONDS || n >= PEAK_MAX_N) break;
    }
    double best = INFINITY;
    for (int i = 0; i < PEAK_RUNS; i++) {
        double dt;
        L3D_CHECK_GOTO(ctx, time_gemm(dev, &g, &dt), st, out);
        if (dt < best) best = dt;
    }
    double n = g.M;
    if (best > 0) *flops_p = 2.0 * n * n * n / best;
    l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_DEV, "sgemm peak %.1f GFLOP/s (n %d, best of %d, %d "
            "threads)", *flops_p / 1e9, g.M, PEAK_RUNS, dev->num_threads);
out:
    free3(dev, m, bytes);
    l3d_device_destroy(dev);
    return st;
}

l3d_status l3d_device_peak_table(l3d_ctx_t *ctx, const char *device, l3d_dtype dt,
                                 double *flops_p) {
    if (!ctx || !flops_p) return L3D_ERR_INVALID_ARG;
    *flops_p = 0.0;
    l3d_device_t *dev = NULL;
    l3d_device_params_t dp = {.num_threads = 1, .device_index = 0};
    L3D_CHECK(ctx, l3d_device_create(ctx, device ? device : "cpu", &dp, &dev));
    double f = l3d_dev_peak_flops(dev, dt);
    l3d_device_destroy(dev);
    *flops_p = f > 0.0 && isfinite(f) ? f : 0.0;
    return L3D_OK;
}

double l3d_mfu_update(double achieved_flops, double *peak_flops, int *raised) {
    if (raised) *raised = 0;
    if (!peak_flops || !(*peak_flops > 0.0) || !(achieved_flops > 0.0) ||
        !isfinite(achieved_flops))
        return 0.0;
    if (achieved_flops > *peak_flops) {
        // The run did this much: the roof was wrong (measured on a busy machine, or set too
        // low). Raise it rather than print a utilisation above 100%.
        *peak_flops = achieved_flops;
        if (raised) *raised = 1;
        return 1.0;
    }
    return achieved_flops / *peak_flops;
}
