// libnccl, opened when an NCCL endpoint is created; the address blob.
// defines: l3d_nccl_lib_open, l3d_nccl_lib_close, l3d_nccl_blob_read
//
// Opened (dlopen, its soname, then the toolkit's library directory), not linked, as the CUDA
// device opens cuBLASLt (devices/cuda/cuda_gemm.cu): libnccl is 200+ MB whose load-time
// relocations every l3d process would pay, on the CPU too, and a build with CUDA runs where
// NCCL is not installed until this transport is chosen.
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "transports/nccl/nccl_internal.h"

#ifndef L3D_NCCL_LIBDIR
#define L3D_NCCL_LIBDIR "/usr/local/cuda/lib64"
#endif

l3d_status l3d_nccl_lib_open(l3d_ctx_t *ctx, l3d_nccl_lib_t *lib) {
    memset(lib, 0, sizeof(*lib));
    const char *names[] = {"libnccl.so.2", L3D_NCCL_LIBDIR "/libnccl.so.2"};
    char why[256] = "";
    // RTLD_NODELETE: ncclGetUniqueId starts NCCL's bootstrap root thread, which outlives any
    // communicator (it waits for ranks that, after an error, never come). Unmapping the
    // library under it crashed the process in that thread's next step (l3d bench comm
    // without a GPU, 1 run in 60 under load: SIGSEGV in start_thread's callee after dlclose).
    for (int i = 0; i < 2 && !lib->so; i++) {
        lib->so = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!lib->so && i == 1) snprintf(why, sizeof(why), "%s", dlerror());
    }
    if (!lib->so)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "nccl: libnccl.so.2 not found (%s; NCCL 2.18 "
                         "or newer, in the CUDA toolkit's lib64 or on LD_LIBRARY_PATH)", why);
    const char *missing = NULL;
#define L3D_NCCL_LOAD(f)                                   \
    if (!missing && !(*(void **)&lib->f = dlsym(lib->so, #f))) missing = #f;
    L3D_NCCL_FNS(L3D_NCCL_LOAD)
#undef L3D_NCCL_LOAD
    if (!missing && lib->ncclGetVersion(&lib->version) != ncclSuccess) missing = "ncclGetVersion";
    if (missing) {
        l3d_nccl_lib_close(lib);
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "nccl: the library has no %s (NCCL 2.18 or "
                         "newer is needed)", missing);
    }
    return L3D_OK;
}

void l3d_nccl_lib_close(l3d_nccl_lib_t *lib) {
    if (lib->so) dlclose(lib->so);
    memset(lib, 0, sizeof(*lib));
}

l3d_status l3d_nccl_blob_read(l3d_ctx_t *ctx, int from, const void *blob, size_t len,
                              const void **inner, size_t *inner_len, int *has_id,
                              unsigned char id[NCCL_UNIQUE_ID_BYTES]) {
    l3d_nccl_blob_t h;
    if (!blob || len < sizeof(h))
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "nccl: rank %d's address is %zu bytes, not an "
                         "nccl address (is every rank on --transport nccl?)", from, len);
    memcpy(&h, blob, sizeof(h));
    if (h.magic != L3D_NCCL_BLOB_MAGIC || h.version != L3D_NCCL_BLOB_VERSION)
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "nccl: rank %d's address is not an nccl "
                         "address of version %u (is every rank on --transport nccl, from the "
                         "same build?)", from, L3D_NCCL_BLOB_VERSION);
    if (h.has_id > 1 || h.inner_len != len - sizeof(h))
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "nccl: rank %d's address is malformed (id "
                         "flag %u, host address %u of %zu bytes)", from, h.has_id, h.inner_len,
                         len - sizeof(h));
    *inner = (const char *)blob + sizeof(h);
    *inner_len = h.inner_len;
    *has_id = (int)h.has_id;
    if (h.has_id) memcpy(id, h.id, NCCL_UNIQUE_ID_BYTES);
    return L3D_OK;
}
