// Devices: where a model's tensors live and its kernels run ("cpu"; "cuda" when built).
// defines: l3d_device_t, l3d_device_params_t, l3d_device_create/destroy, l3d_device_name,
//          l3d_cpu_blas_core, l3d_cpu_blas_better_core
#ifndef LLAMA3D_DEVICE_H
#define LLAMA3D_DEVICE_H

#include "llama3d/ctx.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct l3d_device l3d_device_t;

typedef struct l3d_device_params {
    int num_threads;   // CPU: worker threads including the caller; 0 = number of cores
    int device_index;  // CUDA: which GPU; ignored by the CPU
    int allow_tf32;    // CUDA: float32 GEMMs may round their inputs to TF32 on tensor cores
                       // (torch.backends.cuda.matmul.allow_tf32); 0: exact float32 products.
                       // The CPU computes float32 exactly either way.
} l3d_device_params_t;

// Creates the device named `name` ("cpu"; NULL means "cpu"), with `params` (NULL: defaults).
// An unknown or unbuilt name is L3D_ERR_UNSUPPORTED listing the built ones; a NULL ctx or
// dev_p is L3D_ERR_INVALID_ARG. The device keeps a pointer to ctx, which must outlive it;
// models created on it must be destroyed before it.
l3d_status l3d_device_create(l3d_ctx_t *ctx, const char *name, const l3d_device_params_t *params,
                             l3d_device_t **dev_p);
void l3d_device_destroy(l3d_device_t *dev);
// The device's name ("cpu") and its worker threads.
const char *l3d_device_name(const l3d_device_t *dev);
int l3d_device_threads(const l3d_device_t *dev);

// The CPU device's OpenBLAS: the kernel set it chose when it was loaded ("SkylakeX", "Haswell",
// "Zen", ...), and, when that set is older than this CPU runs because the OpenBLAS release does
// not know the CPU (Debian 12's 0.3.21 on Intel Sapphire and Emerald Rapids falls back to
// "Prescott", SSE3: sgemm 6x slower), the set to name in OPENBLAS_CORETYPE; NULL when there is
// none better or OPENBLAS_CORETYPE is already set. OpenBLAS reads OPENBLAS_CORETYPE only when it
// is loaded, so a program sets it and restarts itself (the l3d CLI does) or sets it before.
const char *l3d_cpu_blas_core(void);
const char *l3d_cpu_blas_better_core(void);

#ifdef __cplusplus
}
#endif
#endif
