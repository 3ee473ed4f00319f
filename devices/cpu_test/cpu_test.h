// The test devices: the CPU device's kernels behind memory core cannot read and ops that
// finish late, so that a CPU run proves what a GPU run needs (issue 27).
// defines: l3d_ctest_t, l3d_ctest_untag, l3d_ctest_host, l3d_ctest_submit
//
// `cpu-opaque`  every pointer alloc returns is tagged so that it faults on any access from
//               outside this device's entries (bits 62 and 55 set: a non-canonical address
//               on x86-64, 4- and 5-level paging; the kernel half on arm64, whose top-byte
//               ignore would let bit 62 alone through). is_host is 0. Ops run at once.
// `cpu-async`   the same memory, and every op (copies and memsets included) is queued on its
//               stream and run by a worker thread only when the host waits: sync or
//               stream_sync. A missing sync is then a stale
//               result, every time, not a race that a fast machine hides; host memory given
//               to copy is read or written at the wait, so freeing it early is caught too.
// Both check every pointer an entry is given: a device argument that is not this device's
// (a host pointer) and a host argument that is (copy's host side) are L3D_ERR_INVALID_ARG
// naming the op and the argument, the way CUDA refuses an illegal address.
#ifndef L3D_DEVICES_CPU_TEST_H
#define L3D_DEVICES_CPU_TEST_H

#include <pthread.h>
#include <stdint.h>

#include "devices/device.h"

// The CPU device whose kernels the test devices run (devices/cpu/cpu_device.c).
extern const l3d_device_ops_t l3d_cpu_device_ops;

#define L3D_CTEST_TAG (((uintptr_t)1 << 62) | ((uintptr_t)1 << 55))

typedef struct l3d_ctest_job l3d_ctest_job_t;
typedef l3d_status (*l3d_ctest_run_fn)(l3d_device_t *cpu, const void *args);

// One queue of ops (a stream). Jobs run in order; `flush_to` is the sequence number the host
// waits for, `done` the last one run.
typedef struct l3d_ctest_queue {
    l3d_ctest_job_t *head, *tail;
    uint64_t issued, flush_to, done;
    struct l3d_ctest_queue *next;  // every queue of the device, for sync
} l3d_ctest_queue_t;

typedef struct l3d_ctest {
    l3d_device_t cpu;  // the CPU device the kernels run on (same ctx)
    int async;
    // mem_info: the memory the device reports as its own (L3D_DEVICE_MEMORY, else the
    // machine's) and the bytes its allocations hold (alloc and free run on the host thread
    // that owns the device)
    uint64_t mem_total, mem_used;
    // cpu-async: the worker and its queues (the default stream's first)
    pthread_mutex_t mu;
    pthread_cond_t wake, done_cv;
    pthread_t worker;
    int worker_started, stop;
    l3d_ctest_queue_t queue0;
    l3d_status failed;  // the first failure of a queued op, returned by the next wait
} l3d_ctest_t;

static inline l3d_ctest_t *l3d_ctest_priv(const l3d_device_t *dev) {
    return (l3d_ctest_t *)dev->priv;
}

// The address the kernels use for device pointer `p` (NULL stays NULL). A pointer that is not
// this device's records an error naming op and arg on the ctx, sets *bad and gives NULL.
void *l3d_ctest_untag(l3d_device_t *dev, int *bad, const char *op, const char *arg,
                      const void *p);
// Checks that host pointer `p` is not device memory (sets *bad as above); returns it.
void *l3d_ctest_host(l3d_device_t *dev, int *bad, const char *op, const char *arg,
                     const void *p);
// Runs `run(cpu, args)` now (cpu-opaque), or queues a copy of the `size` bytes of args on the
// device's current stream (cpu-async).
l3d_status l3d_ctest_submit(l3d_device_t *dev, l3d_ctest_run_fn run, const void *args,
                            size_t size);
// cpu-async: waits for every op queued so far on every stream (cpu-opaque: nothing to wait).
l3d_status l3d_ctest_sync(l3d_device_t *dev);

// The op entries both tables share (cpu_test_ops.c); the memory and lifetime entries are in
// cpu_test_device.c. Declared there through this macro so the two tables list one set.
#define L3D_CTEST_OP_ENTRIES                           \
    .gemm = l3d_ctest_gemm, .convert = l3d_ctest_convert, \
    .embedding_fwd = l3d_ctest_embedding_fwd, .embedding_bwd = l3d_ctest_embedding_bwd, \
    .rmsnorm_fwd = l3d_ctest_rmsnorm_fwd, .rmsnorm_bwd = l3d_ctest_rmsnorm_bwd, \
    .rmsnorm_rowdot = l3d_ctest_rmsnorm_rowdot, .rmsnorm_rows_fwd = l3d_ctest_rmsnorm_rows_fwd, \
    .rmsnorm_rows_bwd = l3d_ctest_rmsnorm_rows_bwd, .rope = l3d_ctest_rope, \
    .attention_fwd = l3d_ctest_attention_fwd, .attention_bwd = l3d_ctest_attention_bwd, \
    .swiglu_fwd = l3d_ctest_swiglu_fwd, .swiglu_bwd = l3d_ctest_swiglu_bwd, \
    .add = l3d_ctest_add, .scale = l3d_ctest_scale, .xent_fwd_bwd = l3d_ctest_xent_fwd_bwd, \
    .embedding_fwd_vp = l3d_ctest_embedding_fwd_vp, \
    .embedding_bwd_vp = l3d_ctest_embedding_bwd_vp, .xent_vp_max = l3d_ctest_xent_vp_max, \
    .xent_vp_stats = l3d_ctest_xent_vp_stats, .xent_vp_grad = l3d_ctest_xent_vp_grad, \
    .sumsq = l3d_ctest_sumsq, .sum_f64 = l3d_ctest_sum_f64, .adamw = l3d_ctest_adamw

l3d_status l3d_ctest_gemm(l3d_device_t *dev, const l3d_gemm_t *g);
l3d_status l3d_ctest_convert(l3d_device_t *dev, void *dst, l3d_dtype dst_type, const void *src,
                             l3d_dtype src_type, size_t n);
l3d_status l3d_ctest_embedding_fwd(l3d_device_t *dev, void *out, const int32_t *tokens,
                                   const void *table, int N, int C, int V, l3d_dtype at,
                                   l3d_dtype wt);
l3d_status l3d_ctest_embedding_bwd(l3d_device_t *dev, void *dtable, const void *dout,
                                   const int32_t *tokens, int N, int C, l3d_dtype at,
                                   l3d_dtype gt);
l3d_status l3d_ctest_rmsnorm_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                 const void *w, int N, int C, float eps, l3d_dtype at,
                                 l3d_dtype wt);
l3d_status l3d_ctest_rmsnorm_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                 const void *x, const void *w, const float *rstd, int N, int C,
                                 l3d_dtype at, l3d_dtype wt, l3d_dtype gt);
l3d_status l3d_ctest_rmsnorm_rowdot(l3d_device_t *dev, float *out, const void *a, const void *b,
                                    const void *w, int N, int C, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_ctest_rmsnorm_rows_fwd(l3d_device_t *dev, void *out, float *rstd, const void *x,
                                      const void *w, const float *ss, int N, int C, int C_full,
                                      float eps, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_ctest_rmsnorm_rows_bwd(l3d_device_t *dev, void *dx, void *dw, const void *dout,
                                      const void *x, const void *w, const float *rstd,
                                      const float *dot, int N, int C, int C_full, l3d_dtype at,
                                      l3d_dtype wt, l3d_dtype gt);
l3d_status l3d_ctest_rope(l3d_device_t *dev, void *x, const float *cos_tab, const float *sin_tab,
                          int B, int T, int NH, int D, int pos0, int inverse, l3d_dtype at);
l3d_status l3d_ctest_attention_fwd(l3d_device_t *dev, void *out, float *lse, const void *q,
                                   const void *k, const void *v, const l3d_attn_dims_t *d,
                                   l3d_dtype at);
l3d_status l3d_ctest_attention_bwd(l3d_device_t *dev, void *dq, void *dk, void *dv,
                                   const void *dout, const void *q, const void *k, const void *v,
                                   const void *out, const float *lse, const l3d_attn_dims_t *d,
                                   l3d_dtype at);
l3d_status l3d_ctest_swiglu_fwd(l3d_device_t *dev, void *out, const void *gate, const void *up,
                                size_t n, l3d_dtype at);
l3d_status l3d_ctest_swiglu_bwd(l3d_device_t *dev, void *dgate, void *dup, const void *dout,
                                const void *gate, const void *up, size_t n, l3d_dtype at);
l3d_status l3d_ctest_add(l3d_device_t *dev, void *out, const void *a, const void *b, size_t n,
                         l3d_dtype at);
l3d_status l3d_ctest_scale(l3d_device_t *dev, void *x, float s, size_t n, l3d_dtype at);
l3d_status l3d_ctest_xent_fwd_bwd(l3d_device_t *dev, void *logits, float *losses,
                                  const int32_t *targets, int N, int V, float grad_scale,
                                  l3d_dtype at);
l3d_status l3d_ctest_embedding_fwd_vp(l3d_device_t *dev, void *out, const int32_t *tokens,
                                      const void *table, int N, int C, int v0, int Vl, int V,
                                      l3d_dtype at, l3d_dtype wt);
l3d_status l3d_ctest_embedding_bwd_vp(l3d_device_t *dev, void *dtable, const void *dout,
                                      const int32_t *tokens, int N, int C, int v0, int Vl,
                                      l3d_dtype at, l3d_dtype gt);
l3d_status l3d_ctest_xent_vp_max(l3d_device_t *dev, const void *logits, float *rowmax, int N,
                                 int Vl, l3d_dtype at);
l3d_status l3d_ctest_xent_vp_stats(l3d_device_t *dev, const void *logits, const float *gmax,
                                   const int32_t *targets, int N, int Vl, int v0, float *stats,
                                   l3d_dtype at);
l3d_status l3d_ctest_xent_vp_grad(l3d_device_t *dev, void *logits, float *losses,
                                  const float *gmax, const float *gstats,
                                  const int32_t *targets, int N, int Vl, int v0,
                                  float grad_scale, l3d_dtype at);
l3d_status l3d_ctest_sumsq(l3d_device_t *dev, int n, const void *const *x, const size_t *len,
                           const double *w, double *out, l3d_dtype at);
l3d_status l3d_ctest_sum_f64(l3d_device_t *dev, double *out, const double *x, int n);
l3d_status l3d_ctest_adamw(l3d_device_t *dev, const l3d_adamw_tensor_t *ts, int n,
                           const l3d_adamw_step_t *s);

#endif
