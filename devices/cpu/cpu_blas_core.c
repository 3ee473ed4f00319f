// Which OpenBLAS kernels run, and whether this CPU could run faster ones.
// defines: l3d_cpu_blas_core, l3d_cpu_blas_better_core
//
// A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernel set from the CPU model when it is loaded.
// A release older than the CPU does not know the model and falls back to its oldest x86-64 set:
// Debian 12's 0.3.21 on an Intel Xeon of family 6 model 207 (Emerald Rapids; Sapphire Rapids
// too) runs Prescott's SSE3 kernels, sgemm at 25.8 GFLOP/s on one core where its SkylakeX
// kernels give 157 (and Haswell's 83). OPENBLAS_CORETYPE overrides the choice, but OpenBLAS
// reads it only when it is loaded, before main: a program sets it and starts again (the l3d
// CLI does, cli/main.c) or sets it before it loads the library.
#include <cblas.h>
#include <stdlib.h>
#include <strings.h>

#include "llama3d/device.h"

char *openblas_get_corename(void);  // OpenBLAS's own (not in every release's cblas.h)

const char *l3d_cpu_blas_core(void) { return openblas_get_corename(); }

// The vector width a kernel set is written for: 3 AVX-512, 2 AVX2 + FMA, 1 AVX, 0 SSE only.
static int core_level(const char *name) {
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen", "Excavator"};
    static const char *const avx[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"};
    for (size_t i = 0; i < sizeof(avx512) / sizeof(*avx512); i++)
        if (!strcasecmp(name, avx512[i])) return 3;
    for (size_t i = 0; i < sizeof(avx2) / sizeof(*avx2); i++)
        if (!strcasecmp(name, avx2[i])) return 2;
    for (size_t i = 0; i < sizeof(avx) / sizeof(*avx); i++)
        if (!strcasecmp(name, avx[i])) return 1;
    return 0;
}

const char *l3d_cpu_blas_better_core(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    const char *forced = getenv("OPENBLAS_CORETYPE");
    if (forced && forced[0]) return NULL;  // the caller chose
    const char *name = openblas_get_corename();
    if (!name) return NULL;
    __builtin_cpu_init();
    // What SkylakeX's kernels use (OpenBLAS's own test for them), then Haswell's, Sandybridge's.
    int cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
                  ? 3
              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 2
              : __builtin_cpu_supports("avx")                                    ? 1
                                                                                 : 0;
    static const char *const best[] = {NULL, "Sandybridge", "Haswell", "SkylakeX"};
    return core_level(name) < cpu ? best[cpu] : NULL;
#else
    return NULL;
#endif
}
