// SGEMM throughput: l3d_dev_gemm on the CPU device with 1 and N threads (our pool, OpenBLAS
// single-threaded inside each tile) next to cblas_sgemm with OpenBLAS's own N threads.
// Best of 5 runs per cell; "ratio" is l3d Nt / OpenBLAS Nt.
// Usage: bench_gemm [threads] (default: all cores).
// Prints a markdown table, so bench/README.md shows exactly what this prints (tests/cli_docs.sh
// compares the README's header and rows with a run of this program).
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "devices/device.h"
#include "platform/platform.h"

#define REPS 5

typedef struct {
    const char *name;
    int M, N, K, trans_a, trans_b;
} shape_t;

static double best_of(l3d_device_t *dev, const l3d_gemm_t *g, int use_blas) {
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = l3d_time_now();
        if (use_blas)
            cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                        g->trans_b ? CblasTrans : CblasNoTrans, g->M, g->N, g->K, g->alpha, g->A,
                        g->lda, g->B, g->ldb, g->beta, g->C, g->ldc);
        else if (l3d_dev_gemm(dev, g) != L3D_OK) {
            fprintf(stderr, "gemm failed\n");
            exit(1);
        }
        double t = l3d_time_now() - t0;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : l3d_num_cores();
    if (nt < 1) nt = 1;
    l3d_ctx_t *ctx;
    l3d_device_t *d1, *dn;
    l3d_device_params_t p1 = {.num_threads = 1}, pn = {.num_threads = nt};
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK || l3d_device_create(ctx, "cpu", &p1, &d1) != L3D_OK ||
        l3d_device_create(ctx, "cpu", &pn, &dn) != L3D_OK) {
        fprintf(stderr, "device setup failed\n");
        return 1;
    }
    const shape_t shapes[] = {
        {"square 512", 512, 512, 512, 0, 0},
        {"square 1024", 1024, 1024, 1024, 0, 0},
        {"linear 4096x384x128 (x W^T)", 4096, 384, 128, 0, 1},
        {"linear 4096x1536x384", 4096, 1536, 384, 0, 1},
        {"dW 384x1536x4096 (dy^T x)", 384, 1536, 4096, 1, 0},
        {"decode 4x4096x1024", 4, 4096, 1024, 0, 1},
    };
    printf("GFLOP/s, best of %d; Nt = %d threads\n\n", REPS, nt);
    printf("| shape M x N x K | l3d 1t | blas 1t | l3d Nt | blas Nt | ratio (Nt) |\n");
    printf("|---|---|---|---|---|---|\n");
    double peak = 0.0;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const shape_t *sh = &shapes[s];
        int lda = sh->trans_a ? sh->M : sh->K, ldb = sh->trans_b ? sh->K : sh->N;
        size_t na = (size_t)sh->M * sh->K, nb = (size_t)sh->K * sh->N, nc = (size_t)sh->M * sh->N;
        float *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
        float *C = calloc(nc, sizeof(float));
        for (size_t i = 0; i < na; i++) A[i] = (float)((i * 7) % 13) * 0.01f;
        for (size_t i = 0; i < nb; i++) B[i] = (float)((i * 5) % 11) * 0.01f;
        l3d_gemm_t g = {.trans_a = sh->trans_a, .trans_b = sh->trans_b, .M = sh->M, .N = sh->N,
                        .K = sh->K, .alpha = 1.0f, .A = A, .lda = lda, .B = B, .ldb = ldb,
                        .C = C, .ldc = sh->N, .batch = 1};
        double flop = 2.0 * sh->M * sh->N * sh->K;
        double g1 = flop / best_of(d1, &g, 0) * 1e-9;
        double gn = flop / best_of(dn, &g, 0) * 1e-9;
        double gb1 = flop / best_of(NULL, &g, 1) * 1e-9;
        openblas_set_num_threads(nt);
        double gb = flop / best_of(NULL, &g, 1) * 1e-9;
        openblas_set_num_threads(1);  // back to what the device expects
        printf("| %s | %.1f | %.1f | %.1f | %.1f | %.2f |\n", sh->name, g1, gb1, gn, gb, gn / gb);
        if (gn > peak) peak = gn;
        if (g1 > peak) peak = g1;
        free(A), free(B), free(C);
    }
    printf("\ngemm peak: %.1f GFLOP/s (the best cell)\n", peak);
    l3d_device_destroy(dn);
    l3d_device_destroy(d1);
    l3d_ctx_destroy(ctx);
    return 0;
}
