// The CPU device: lifetime, host memory, copies, and the exported op table.
// defines: l3d_cpu_device_ops, l3d_cpu_run, l3d_cpu_scratch_*
#include <cblas.h>
#include <errno.h>
#include <string.h>

#include "devices/cpu/cpu.h"
#include "platform/mem.h"

// Weight-like buffers from this size up are advised onto transparent huge pages (two at least).
#define CPU_HUGE_MIN_BYTES ((size_t)4 << 20)

// The pool's allocations go through the ctx so they show up in its accounting.
static void *cpu_pool_alloc(size_t size, size_t align, const char *tag, void *user) {
    (void)align;  // l3d_malloc already aligns to L3D_ALIGN (64), all the pool asks for
    return l3d_malloc((l3d_ctx_t *)user, size, tag);
}
static void cpu_pool_free(void *ptr, size_t size, void *user) {
    l3d_free((l3d_ctx_t *)user, ptr, size, "other");
}

void l3d_cpu_run(l3d_device_t *dev, l3d_pool_fn fn, void *arg, int ntasks) {
    l3d_pool_run(l3d_cpu_priv(dev)->pool, fn, arg, ntasks);
}

l3d_status l3d_cpu_scratch_reserve(l3d_device_t *dev, size_t slot_floats) {
    l3d_cpu_t *cpu = l3d_cpu_priv(dev);
    slot_floats = (slot_floats + 15) & ~(size_t)15;  // keep every slot 64-byte aligned
    size_t bytes = slot_floats * sizeof(float) * (size_t)cpu->nthreads;
    if (bytes > cpu->scratch_bytes) {
        l3d_free(dev->ctx, cpu->scratch, cpu->scratch_bytes, "scratch");
        cpu->scratch_bytes = 0;
        cpu->scratch = l3d_malloc(dev->ctx, bytes, "scratch");
        if (!cpu->scratch) return L3D_ERR_NOMEM;
        cpu->scratch_bytes = bytes;
    }
    cpu->scratch_slot_floats = slot_floats;
    return L3D_OK;
}

float *l3d_cpu_wide(l3d_device_t *dev, size_t floats) {
    l3d_cpu_t *cpu = l3d_cpu_priv(dev);
    size_t bytes = (floats ? floats : 1) * sizeof(float);
    if (bytes > cpu->wide_bytes) {
        l3d_free(dev->ctx, cpu->wide, cpu->wide_bytes, "scratch");
        cpu->wide_bytes = 0;
        if (!(cpu->wide = l3d_malloc(dev->ctx, bytes, "scratch"))) return NULL;
        cpu->wide_bytes = bytes;
    }
    return cpu->wide;
}

float *l3d_cpu_scratch_acquire(l3d_cpu_t *cpu, int *slot_p) {
    // No more than nthreads tasks run at once, so one pass always finds a free slot; the
    // loop only guards against a stale read.
    for (;;) {
        for (int s = 0; s < cpu->nthreads; s++) {
            if (!atomic_exchange_explicit(&cpu->slot_busy[s], 1, memory_order_acquire)) {
                *slot_p = s;
                return cpu->scratch + (size_t)s * cpu->scratch_slot_floats;
            }
        }
    }
}

void l3d_cpu_scratch_release(l3d_cpu_t *cpu, int slot) {
    atomic_store_explicit(&cpu->slot_busy[slot], 0, memory_order_release);
}

// ---- lifetime ---------------------------------------------------------------------------------
static l3d_status cpu_init(l3d_device_t *dev, const l3d_device_params_t *params) {
    int n = params ? params->num_threads : 0;
    if (n < 0) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "cpu: num_threads %d < 0", n);
    if (n == 0) n = l3d_num_cores();
    int have = l3d_cpu_bf16_probe(), want = l3d_ctx_settings(dev->ctx)->cpu_bf16;
    if (want > have)
        return l3d_error(dev->ctx, L3D_ERR_UNSUPPORTED, "cpu: L3D_CPU_BF16=%s: this CPU's best "
                         "is %s", l3d_cpu_bf16_name(want), l3d_cpu_bf16_name(have));
    l3d_cpu_t *cpu = l3d_calloc(dev->ctx, 1, sizeof(*cpu), "other");
    if (!cpu) return L3D_ERR_NOMEM;
    cpu->pool_alloc = (l3d_allocator_t){cpu_pool_alloc, cpu_pool_free, dev->ctx};
    cpu->nthreads = n;
    cpu->slot_busy = l3d_malloc(dev->ctx, sizeof(atomic_int) * (size_t)n, "other");
    if (!cpu->slot_busy) {
        l3d_free(dev->ctx, cpu, sizeof(*cpu), "other");
        return L3D_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) atomic_init(&cpu->slot_busy[i], 0);
    int rc = l3d_pool_create(n, &cpu->pool_alloc, &cpu->pool);
    if (rc < 0) {
        l3d_free(dev->ctx, cpu->slot_busy, sizeof(atomic_int) * (size_t)n, "other");
        l3d_free(dev->ctx, cpu, sizeof(*cpu), "other");
        return l3d_error(dev->ctx, rc == -ENOMEM ? L3D_ERR_NOMEM : L3D_ERR_SYSTEM,
                         "cpu: creating a pool of %d threads failed: %s", n, strerror(-rc));
    }
    // Our pool is the only threading: OpenBLAS runs single-threaded inside our tasks.
    openblas_set_num_threads(1);
    // auto takes AMX only: on Emerald Rapids the AVX512-BF16 kernel ran a 1024x2816x1024
    // product at 0.56x the widened sgemm's speed (bench_ops_dtype), AMX at 3.6x.
    cpu->bf16 = want >= 0 ? want : have == L3D_CPU_BF16_AMX ? have : L3D_CPU_BF16_OFF;
    cpu->has_dp = have >= L3D_CPU_BF16_AVX512 && want != L3D_CPU_BF16_OFF;
    const char *better = l3d_cpu_blas_better_core();
    if (better)
        l3d_log(dev->ctx, L3D_LOG_WARN, L3D_SUBSYS_DEV, "cpu: OpenBLAS runs its %s kernels, "
                "older than this CPU runs (the release does not know the CPU); "
                "OPENBLAS_CORETYPE=%s set before the program starts runs faster ones",
                l3d_cpu_blas_core(), better);
    dev->priv = cpu;
    dev->num_threads = n;
    return L3D_OK;
}

static void cpu_fini(l3d_device_t *dev) {
    l3d_cpu_t *cpu = l3d_cpu_priv(dev);
    if (!cpu) return;
    l3d_pool_destroy(cpu->pool);
    l3d_free(dev->ctx, cpu->scratch, cpu->scratch_bytes, "scratch");
    l3d_free(dev->ctx, cpu->wide, cpu->wide_bytes, "scratch");
    l3d_free(dev->ctx, cpu->slot_busy, sizeof(atomic_int) * (size_t)cpu->nthreads, "other");
    l3d_free(dev->ctx, cpu, sizeof(*cpu), "other");
    dev->priv = NULL;
}

// ---- memory -------------------------------------------------------------------------------------
static int streamed_whole(const char *tag) {
    return tag && (!strcmp(tag, "params") || !strcmp(tag, "grads") || !strcmp(tag, "optim"));
}

static l3d_status cpu_alloc(l3d_device_t *dev, size_t bytes, const char *tag, void **ptr_p) {
    if (!ptr_p) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "cpu alloc: NULL ptr_p");
    if (bytes == 0) {  // the contract allows NULL for 0 bytes; free(NULL) is a no-op
        *ptr_p = NULL;
        return L3D_OK;
    }
    void *p = l3d_malloc(dev->ctx, bytes, tag);
    if (!p) return L3D_ERR_NOMEM;
    // Weights, gradients and moments are streamed whole: huge pages cut the page walks
    // (decode +8-12% here). Not activations and scratch: they are touched in part (a decode
    // step writes one row of a prompt-sized buffer), and a huge page makes 2 MiB of each
    // touched part resident. Advice that fails (no THP) changes nothing.
    if (bytes >= CPU_HUGE_MIN_BYTES && streamed_whole(tag)) (void)l3d_mem_advise_huge(p, bytes);
    *ptr_p = p;
    return L3D_OK;
}

static void cpu_free(l3d_device_t *dev, void *ptr, size_t bytes, const char *tag) {
    if (ptr) l3d_free(dev->ctx, ptr, bytes, tag);
}

static int cpu_is_host(const l3d_device_t *dev) { return 1; }

static l3d_status cpu_copy(l3d_device_t *dev, void *dst, const void *src, size_t bytes,
                           l3d_copy_kind kind) {
    if (kind != L3D_COPY_H2D && kind != L3D_COPY_D2H && kind != L3D_COPY_D2D)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "cpu copy: bad kind %d", (int)kind);
    if (bytes && dst != src) memmove(dst, src, bytes);
    return L3D_OK;
}

static l3d_status cpu_memset(l3d_device_t *dev, void *dst, int value, size_t bytes) {
    if (bytes) memset(dst, value, bytes);
    return L3D_OK;
}

static l3d_status cpu_sync(l3d_device_t *dev) { return L3D_OK; }  // every op is synchronous

const l3d_device_ops_t l3d_cpu_device_ops = {
    .abi_version = L3D_DEVICE_ABI_VERSION,
    .size = sizeof(l3d_device_ops_t),
    .name = "cpu",
    .init = cpu_init,
    .fini = cpu_fini,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .is_host = cpu_is_host,
    .copy = cpu_copy,
    .memset = cpu_memset,
    .sync = cpu_sync,
    .gemm = l3d_cpu_gemm,
    .convert = l3d_cpu_convert,
    .embedding_fwd = l3d_cpu_embedding_fwd,
    .embedding_bwd = l3d_cpu_embedding_bwd,
    .rmsnorm_fwd = l3d_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = l3d_cpu_rmsnorm_bwd,
    .rmsnorm_rowdot = l3d_cpu_rmsnorm_rowdot,
    .rmsnorm_rows_fwd = l3d_cpu_rmsnorm_rows_fwd,
    .rmsnorm_rows_bwd = l3d_cpu_rmsnorm_rows_bwd,
    .rope = l3d_cpu_rope,
    .attention_fwd = l3d_cpu_attention_fwd,
    .attention_bwd = l3d_cpu_attention_bwd,
    .swiglu_fwd = l3d_cpu_swiglu_fwd,
    .swiglu_bwd = l3d_cpu_swiglu_bwd,
    .add = l3d_cpu_add,
    .scale = l3d_cpu_scale,
    .xent_fwd_bwd = l3d_cpu_xent_fwd_bwd,
    .embedding_fwd_vp = l3d_cpu_embedding_fwd_vp,
    .embedding_bwd_vp = l3d_cpu_embedding_bwd_vp,
    .xent_vp_max = l3d_cpu_xent_vp_max,
    .xent_vp_stats = l3d_cpu_xent_vp_stats,
    .xent_vp_grad = l3d_cpu_xent_vp_grad,
    .sumsq = l3d_cpu_sumsq,
    .sum_f64 = l3d_cpu_sum_f64,
    .adamw = l3d_cpu_adamw,
};
