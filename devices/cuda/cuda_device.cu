// The CUDA device: lifetime, memory (a caching, stream-ordered allocator over cudaMalloc, never
// managed memory), pinned host memory, copies, streams and events, the datasheet roof, and the
// exported op table.
// defines: l3d_cuda_device_ops, l3d_cuda_fail, l3d_cuda_scratch, l3d_cuda_dtype_check
//
// Which GPU: params->device_index (l3d launch, torchrun, mpirun and srun give each rank its
// LOCAL_RANK there). With no GPU (no driver, or none visible) init fails with
// L3D_ERR_UNSUPPORTED carrying CUDA's own words, and nothing is left allocated.

#include <stdio.h>
#include <string.h>

#include "devices/cuda/cuda.h"

extern "C" {
#include "platform/platform.h"
}

l3d_status l3d_cuda_fail(l3d_device_t *dev, cudaError_t e, const char *what) {
    l3d_status st = e == cudaErrorMemoryAllocation ? L3D_ERR_NOMEM
                    : e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
                            e == cudaErrorStubLibrary || e == cudaErrorInvalidDevice
                        ? L3D_ERR_UNSUPPORTED
                        : L3D_ERR_SYSTEM;
    return l3d_error(dev->ctx, st, "cuda %s: %s (%s)", what, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

l3d_status l3d_cuda_dtype_check(l3d_device_t *dev, const char *op, const char *arg, l3d_dtype t) {
    if (t == L3D_FLOAT32 || t == L3D_BFLOAT16 || t == L3D_FLOAT16) return L3D_OK;
    return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                     "%s: %s is %s (float32, bfloat16 and "
                     "float16 only)",
                     op, arg, l3d_dtype_name(t));
}

// ---- the caching allocator -------------------------------------------------------------------
// Sizes round up to a power of two from 512 bytes (class k holds 2^(k+9) bytes), so a freed
// block serves any later request of its class; blocks go back to CUDA only at fini or when
// cudaMalloc fails (then every cached block is released and the call retried once). Reuse is
// stream-ordered: a block freed after ops that used it on the device's stream is handed to the
// next allocation, whose ops are ordered after those on the same stream (as PyTorch's caching
// allocator assumes for one stream). The accounting counts what the caller asked for.
static int size_class(size_t bytes) {
    int k = 0;
    while (k < 31 && ((size_t)512 << k) < bytes) k++;
    return k;
}

static void release_cached(l3d_device_t *dev, l3d_cuda_t *c) {
    for (int k = 0; k < 32; k++) {
        while (c->free_list[k]) {
            l3d_cuda_block_t *b = c->free_list[k];
            c->free_list[k] = b->next;
            cudaFree(b->p);
            l3d_free(dev->ctx, b, sizeof(*b), "other");
        }
    }
    c->cached = 0;
}

static l3d_status cuda_alloc(l3d_device_t *dev, size_t bytes, const char *tag, void **ptr_p) {
    if (!ptr_p) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "cuda alloc: NULL ptr_p");
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    if (bytes == 0) {
        *ptr_p = NULL;
        return L3D_OK;
    }
    int k = size_class(bytes);
    if (k == 31 && bytes > ((size_t)512 << 31))
        return l3d_error(dev->ctx, L3D_ERR_NOMEM, "cuda alloc: %zu bytes for %s", bytes, tag);
    size_t cls = (size_t)512 << k;
    void *p = NULL;
    if (c->free_list[k]) {
        l3d_cuda_block_t *b = c->free_list[k];
        c->free_list[k] = b->next;
        p = b->p;
        c->cached -= cls;
        l3d_free(dev->ctx, b, sizeof(*b), "other");
    } else {
        cudaError_t e = cudaMalloc(&p, cls);
        if (e == cudaErrorMemoryAllocation && c->cached) {  // give the cache back, once
            (void)cudaGetLastError();
            release_cached(dev, c);
            e = cudaMalloc(&p, cls);
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return l3d_error(dev->ctx,
                             e == cudaErrorMemoryAllocation ? L3D_ERR_NOMEM : L3D_ERR_SYSTEM,
                             "cuda alloc: %zu bytes for %s on GPU %d: %s", bytes, tag, c->index,
                             cudaGetErrorString(e));
        }
    }
    l3d_mem_account(dev->ctx, tag, bytes, +1);
    *ptr_p = p;
    return L3D_OK;
}

static void cuda_free(l3d_device_t *dev, void *ptr, size_t bytes, const char *tag) {
    if (!ptr) return;
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    l3d_mem_account(dev->ctx, tag, bytes, -1);
    int k = size_class(bytes);
    l3d_cuda_block_t *b = (l3d_cuda_block_t *)l3d_malloc(dev->ctx, sizeof(*b), "other");
    if (!b) {  // no room to remember it: give it back (after the stream's pending ops)
        cudaStreamSynchronize(c->stream);
        cudaFree(ptr);
        return;
    }
    b->p = ptr;
    b->next = c->free_list[k];
    c->free_list[k] = b;
    c->cached += (size_t)512 << k;
}

l3d_status l3d_cuda_scratch(l3d_device_t *dev, size_t bytes, void **p) {
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    if (bytes > c->scratch_bytes) {
        cuda_free(dev, c->scratch, c->scratch_bytes, "scratch");
        c->scratch = NULL;
        c->scratch_bytes = 0;
        L3D_CHECK(dev->ctx, cuda_alloc(dev, bytes, "scratch", &c->scratch));
        c->scratch_bytes = bytes;
    }
    *p = c->scratch;
    return L3D_OK;
}

// ---- lifetime ----------------------------------------------------------------------------------
static void cuda_fini(l3d_device_t *dev);

static l3d_status cuda_init(l3d_device_t *dev, const l3d_device_params_t *params) {
    int n = 0, index = params ? params->device_index : 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return l3d_error(dev->ctx, L3D_ERR_UNSUPPORTED, "cuda: no GPU: %s (%s)",
                         cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (index < 0 || index >= n)
        return l3d_error(dev->ctx, L3D_ERR_UNSUPPORTED,
                         "cuda: GPU %d requested, %d visible "
                         "(CUDA_VISIBLE_DEVICES, LOCAL_RANK)",
                         index, n);
    l3d_cuda_t *c = (l3d_cuda_t *)l3d_calloc(dev->ctx, 1, sizeof(*c), "other");
    if (!c) return L3D_ERR_NOMEM;
    c->index = index;
    c->tf32 = params && params->allow_tf32;
    dev->priv = c;
    // (host threads for what runs beside the GPU: the offloaded optimizer's CPU device)
    dev->num_threads = params && params->num_threads > 0 ? params->num_threads : l3d_num_cores();
    l3d_status st = L3D_OK;
    if ((e = cudaSetDevice(index)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&c->prop, index)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMalloc((void **)&c->bad, sizeof(int))) != cudaSuccess ||
        (e = cudaMemset(c->bad, 0, sizeof(int))) != cudaSuccess)
        st = l3d_cuda_fail(dev, e, "init");
    if (st >= 0) st = l3d_cuda_gemm_init(dev);
    if (st < 0) {
        cuda_fini(dev);
        return st;
    }
    l3d_log(dev->ctx, L3D_LOG_INFO, L3D_SUBSYS_DEV, "cuda: GPU %d %s, sm_%d%d, %d SMs, %.1f GiB",
            index, c->prop.name, c->prop.major, c->prop.minor, c->prop.multiProcessorCount,
            (double)c->prop.totalGlobalMem / 1073741824.0);
    return L3D_OK;
}

static void cuda_fini(l3d_device_t *dev) {
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    l3d_cuda_gemm_fini(dev);
    cuda_free(dev, c->scratch, c->scratch_bytes, "scratch");
    release_cached(dev, c);
    if (c->bad) cudaFree(c->bad);
    if (c->stream) cudaStreamDestroy(c->stream);
    l3d_free(dev->ctx, c, sizeof(*c), "other");
    dev->priv = NULL;
}

// ---- memory, copies ----------------------------------------------------------------------------
static int cuda_is_host(const l3d_device_t *dev) {
    return 0;
}

static int cuda_is_device_ptr(const l3d_device_t *dev, const void *ptr) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        (void)cudaGetLastError();  // (an unregistered host pointer, on old drivers)
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static l3d_status cuda_copy(l3d_device_t *dev, void *dst, const void *src, size_t bytes,
                            l3d_copy_kind kind) {
    static const cudaMemcpyKind k[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                        cudaMemcpyDeviceToDevice};
    if ((unsigned)kind > 2)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "cuda copy: bad kind %d", (int)kind);
    if (!bytes || dst == src) return L3D_OK;
    L3D_CU_CHECK(dev, cudaMemcpyAsync(dst, src, bytes, k[kind], l3d_cuda_stream(dev)), "copy");
    return L3D_OK;
}

static l3d_status cuda_memset(l3d_device_t *dev, void *dst, int value, size_t bytes) {
    if (!bytes) return L3D_OK;
    L3D_CU_CHECK(dev, cudaMemsetAsync(dst, value, bytes, l3d_cuda_stream(dev)), "memset");
    return L3D_OK;
}

static l3d_status cuda_sync(l3d_device_t *dev) {
    l3d_cuda_t *c = l3d_cuda_priv(dev);
    L3D_CU_CHECK(dev, cudaDeviceSynchronize(), "sync");
    int bad = 0;
    L3D_CU_CHECK(dev, cudaMemcpy(&bad, c->bad, sizeof(int), cudaMemcpyDeviceToHost), "sync");
    if (!bad) return L3D_OK;
    L3D_CU_CHECK(dev, cudaMemset(c->bad, 0, sizeof(int)), "sync");
    return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG,
                     "cuda: an op since the last sync read a "
                     "token id outside its vocabulary");
}

static l3d_status cuda_alloc_host(l3d_device_t *dev, size_t bytes, int pinned, const char *tag,
                                  void **ptr_p) {
    if (!pinned) {
        *ptr_p = l3d_malloc(dev->ctx, bytes ? bytes : 1, tag);
        return *ptr_p ? L3D_OK : L3D_ERR_NOMEM;
    }
    L3D_CU_CHECK(dev, cudaHostAlloc(ptr_p, bytes ? bytes : 1, cudaHostAllocPortable),
                 "pinned host memory");
    l3d_mem_account(dev->ctx, tag, bytes ? bytes : 1, +1);
    return L3D_OK;
}

static void cuda_free_host(l3d_device_t *dev, void *ptr, size_t bytes, int pinned,
                           const char *tag) {
    if (!ptr) return;
    if (!pinned) {
        l3d_free(dev->ctx, ptr, bytes ? bytes : 1, tag);
        return;
    }
    cudaFreeHost(ptr);
    l3d_mem_account(dev->ctx, tag, bytes ? bytes : 1, -1);
}

// ---- streams and events ------------------------------------------------------------------------
static l3d_status cuda_stream_create(l3d_device_t *dev, void **stream_p) {
    cudaStream_t s;
    L3D_CU_CHECK(dev, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream_create");
    *stream_p = (void *)s;
    return L3D_OK;
}
static void cuda_stream_destroy(l3d_device_t *dev, void *stream) {
    if (stream) cudaStreamDestroy((cudaStream_t)stream);
}
static l3d_status cuda_stream_sync(l3d_device_t *dev, void *stream) {
    cudaStream_t s = stream ? (cudaStream_t)stream : l3d_cuda_priv(dev)->stream;
    L3D_CU_CHECK(dev, cudaStreamSynchronize(s), "stream_sync");
    return L3D_OK;
}
static l3d_status cuda_event_create(l3d_device_t *dev, void **event_p) {
    cudaEvent_t e;
    L3D_CU_CHECK(dev, cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event_create");
    *event_p = (void *)e;
    return L3D_OK;
}
static void cuda_event_destroy(l3d_device_t *dev, void *event) {
    if (event) cudaEventDestroy((cudaEvent_t)event);
}
static l3d_status cuda_event_record(l3d_device_t *dev, void *event, void *stream) {
    cudaStream_t s = stream ? (cudaStream_t)stream : l3d_cuda_priv(dev)->stream;
    L3D_CU_CHECK(dev, cudaEventRecord((cudaEvent_t)event, s), "event_record");
    return L3D_OK;
}
static l3d_status cuda_stream_wait_event(l3d_device_t *dev, void *stream, void *event) {
    cudaStream_t s = stream ? (cudaStream_t)stream : l3d_cuda_priv(dev)->stream;
    L3D_CU_CHECK(dev, cudaStreamWaitEvent(s, (cudaEvent_t)event, 0), "stream_wait_event");
    return L3D_OK;
}

// ---- the roof and the memory -------------------------------------------------------------------
// Dense tensor-core peaks without sparsity, FLOP/s, from NVIDIA's datasheets: H100 SXM and
// H200 989.4 T (bf16/fp16), A100 312 T; float32 operands stay float32 (no TF32): 67 T on
// H100/H200 SXM, 19.5 T on A100. PCIe and other parts: 0 (unknown; no MFU is reported).
static double cuda_peak_flops(const l3d_device_t *dev, l3d_dtype dt) {
    const cudaDeviceProp *p = &l3d_cuda_priv(dev)->prop;
    int half = dt == L3D_BFLOAT16 || dt == L3D_FLOAT16;
    int sxm9 =
        p->major == 9 && p->minor == 0 && (strstr(p->name, "SXM") || strstr(p->name, "H200"));
    if (sxm9) return half ? 989.4e12 : 66.9e12;
    if (p->major == 8 && p->minor == 0 && strstr(p->name, "A100")) return half ? 312e12 : 19.5e12;
    return 0.0;
}

static l3d_status cuda_mem_info(const l3d_device_t *dev, uint64_t *free_bytes,
                                uint64_t *total_bytes) {
    size_t f = 0, t = 0;
    L3D_CU_CHECK((l3d_device_t *)dev, cudaMemGetInfo(&f, &t), "mem_info");
    // (blocks this device caches are free for its own allocations)
    *free_bytes = (uint64_t)f + l3d_cuda_priv(dev)->cached;
    *total_bytes = (uint64_t)t;
    return L3D_OK;
}

// (C++20 designated initializers, in the struct's order)
extern "C" const l3d_device_ops_t l3d_cuda_device_ops = {
    .abi_version = L3D_DEVICE_ABI_VERSION,
    .size = sizeof(l3d_device_ops_t),
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .is_host = cuda_is_host,
    .is_device_ptr = cuda_is_device_ptr,
    .copy = cuda_copy,
    .memset = cuda_memset,
    .sync = cuda_sync,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .peak_flops = cuda_peak_flops,
    .mem_info = cuda_mem_info,
    .gemm = l3d_cuda_gemm,
    .convert = l3d_cuda_convert,
    .embedding_fwd = l3d_cuda_embedding_fwd,
    .embedding_bwd = l3d_cuda_embedding_bwd,
    .rmsnorm_fwd = l3d_cuda_rmsnorm_fwd,
    .rmsnorm_bwd = l3d_cuda_rmsnorm_bwd,
    .rope = l3d_cuda_rope,
    .attention_fwd = l3d_cuda_attention_fwd,
    .attention_bwd = l3d_cuda_attention_bwd,
    .swiglu_fwd = l3d_cuda_swiglu_fwd,
    .swiglu_bwd = l3d_cuda_swiglu_bwd,
    .add = l3d_cuda_add,
    .scale = l3d_cuda_scale,
    .xent_fwd_bwd = l3d_cuda_xent_fwd_bwd,
    .embedding_fwd_vp = l3d_cuda_embedding_fwd_vp,
    .embedding_bwd_vp = l3d_cuda_embedding_bwd_vp,
    .xent_vp_max = l3d_cuda_xent_vp_max,
    .xent_vp_stats = l3d_cuda_xent_vp_stats,
    .xent_vp_grad = l3d_cuda_xent_vp_grad,
    .sumsq = l3d_cuda_sumsq,
    .sum_f64 = l3d_cuda_sum_f64,
    .adamw = l3d_cuda_adamw,
    .rmsnorm_rowdot = l3d_cuda_rmsnorm_rowdot,  // (optional: tensor parallelism 2d)
    .rmsnorm_rows_fwd = l3d_cuda_rmsnorm_rows_fwd,
    .rmsnorm_rows_bwd = l3d_cuda_rmsnorm_rows_bwd,
};
