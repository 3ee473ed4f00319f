// OSU-style MPI_Allreduce bandwidth, the OpenMPI peer of `l3d bench comm allreduce` in
// bench/compare_comm.sh (compiled there with mpicc; deliberately outside bench/*.c so CMake's
// glob does not build it without MPI).
//
// Usage: mpirun -np N mpi_allreduce [ITERS [WARMUP [SIZE_BYTES...]]]
// For each size: WARMUP untimed calls, a barrier, ITERS timed MPI_Allreduce(MPI_FLOAT, MPI_SUM)
// out of place; time = the slowest rank's elapsed / ITERS. Rank 0 prints one line per size:
// `SIZE BUSBW_GBs TIME_us` with busbw = SIZE / time * 2(n-1)/n in 1e9 bytes/s (nccl-tests'
// definition) and time in microseconds (the latency of small sizes).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    int warmup = argc > 2 ? atoi(argv[2]) : 5;
    static const long long defaults[] = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
    int nsizes = argc > 3 ? argc - 3 : 4;
    long long maxb = 0;
    for (int i = 0; i < nsizes; i++) {
        long long b = argc > 3 ? atoll(argv[3 + i]) : defaults[i];
        if (b > maxb) maxb = b;
    }
    size_t maxcount = (size_t)maxb / sizeof(float);
    float *src = malloc(maxcount * sizeof(float) + 1);
    float *dst = malloc(maxcount * sizeof(float) + 1);
    if (!src || !dst || iters <= 0 || warmup < 0) {
        fprintf(stderr, "mpi_allreduce: bad arguments or out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    // Small integers: sums stay exact, and every page is touched before timing.
    for (size_t i = 0; i < maxcount; i++) src[i] = (float)((i + (size_t)rank) % 7);
    for (size_t i = 0; i < maxcount; i++) dst[i] = 0.0f;

    int bad = 0;
    for (int s = 0; s < nsizes; s++) {
        long long bytes = argc > 3 ? atoll(argv[3 + s]) : defaults[s];
        int count = (int)(bytes / (long long)sizeof(float));
        for (int w = 0; w < warmup; w++)
            MPI_Allreduce(src, dst, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++)
            MPI_Allreduce(src, dst, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double el = MPI_Wtime() - t0, maxel = 0.0;
        MPI_Reduce(&el, &maxel, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        // Sanity: element i sums (i + r) % 7 over ranks r.
        for (int i = 0; i < count && i < 1024; i++) {
            float want = 0.0f;
            for (int r = 0; r < n; r++) want += (float)((i + r) % 7);
            if (dst[i] != want) bad = 1;
        }
        if (rank == 0) {
            double t = maxel / iters;
            double busbw = (double)bytes / t * 2.0 * (n - 1) / n / 1e9;
            printf("%lld %.4f %.3f\n", bytes, busbw, t * 1e6);
            fflush(stdout);
        }
    }
    int anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && anybad) fprintf(stderr, "mpi_allreduce: wrong results\n");
    free(src);
    free(dst);
    MPI_Finalize();
    return anybad ? 1 : 0;
}
