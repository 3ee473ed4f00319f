// Thread pool: a fixed set of workers that sleep on a condition variable between runs,
// so they never compete for cores with anything else while idle (OpenBLAS runs single
// threaded inside our tasks; see devices/cpu/cpu_matmul.c). Between runs that follow each
// other closely (a decode step is ~40 runs in a few milliseconds) a worker first watches the
// run counter for a few microseconds (POOL_SPIN pauses) before it sleeps, and the caller
// watches the busy count likewise: a futex wake-up costs tens of microseconds per run.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "platform/platform.h"

struct l3d_pool {
    const l3d_allocator_t *alloc;
    int nthreads;  // including the caller
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start_cv;
    pthread_cond_t done_cv;
    _Atomic uint64_t generation;  // bumped per run (under mu); workers wait for a new one
    int shutdown;
    atomic_int busy;  // workers still inside the current run (changed under mu)
    // the current run
    l3d_pool_fn fn;
    void *arg;
    int ntasks;
    atomic_int next_task;
};

int l3d_num_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void *pool_mem(const l3d_allocator_t *a, size_t sz) {
    return a ? a->alloc(sz, 64, "other", a->user) : malloc(sz);
}
static void pool_unmem(const l3d_allocator_t *a, void *p, size_t sz) {
    if (a) a->free(p, sz, a->user);
    else free(p);
}

static void pool_drain(l3d_pool_t *p) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->ntasks) break;
        p->fn(p->arg, t, p->ntasks);
    }
}

// About 20 microseconds of watching before sleeping.
#define POOL_SPIN 2000
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *pool_worker(void *argp) {
    l3d_pool_t *p = argp;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (!p->shutdown && atomic_load(&p->generation) == seen) {
            pthread_mutex_unlock(&p->mu);
            for (int i = 0; i < POOL_SPIN && atomic_load(&p->generation) == seen; i++) cpu_relax();
            pthread_mutex_lock(&p->mu);
        }
        while (!p->shutdown && atomic_load(&p->generation) == seen)
            pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->shutdown) break;
        seen = atomic_load(&p->generation);
        pthread_mutex_unlock(&p->mu);
        pool_drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int l3d_pool_create(int nthreads, const l3d_allocator_t *alloc, l3d_pool_t **pool_p) {
    if (nthreads < 1) return -EINVAL;
    l3d_pool_t *p = pool_mem(alloc, sizeof(*p));
    if (!p) return -ENOMEM;
    *p = (l3d_pool_t){.alloc = alloc, .nthreads = nthreads};
    atomic_init(&p->next_task, 0);
    atomic_init(&p->generation, 0);
    atomic_init(&p->busy, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    int rc = 0;
    if (nthreads > 1) {
        p->threads = pool_mem(alloc, sizeof(pthread_t) * (size_t)(nthreads - 1));
        if (!p->threads) {
            rc = -ENOMEM;
            goto err_free_pool;
        }
        for (int i = 0; i < nthreads - 1; i++) {
            int e = pthread_create(&p->threads[i], NULL, pool_worker, p);
            if (e) {
                p->nthreads = i + 1;  // only i workers exist: shut those down
                l3d_pool_destroy(p);
                return -e;
            }
        }
    }
    *pool_p = p;
    return 0;
err_free_pool:
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->start_cv);
    pthread_mutex_destroy(&p->mu);
    pool_unmem(alloc, p, sizeof(*p));
    return rc;
}

void l3d_pool_destroy(l3d_pool_t *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->shutdown = 1;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->threads[i], NULL);
    if (p->threads) pool_unmem(p->alloc, p->threads, sizeof(pthread_t) * (size_t)(p->nthreads - 1));
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->start_cv);
    pthread_mutex_destroy(&p->mu);
    pool_unmem(p->alloc, p, sizeof(*p));
}

int l3d_pool_size(const l3d_pool_t *p) { return p ? p->nthreads : 1; }

void l3d_pool_run(l3d_pool_t *p, l3d_pool_fn fn, void *arg, int ntasks) {
    if (ntasks <= 0) return;
    if (!p || p->nthreads == 1 || ntasks == 1) {
        for (int t = 0; t < ntasks; t++) fn(arg, t, ntasks);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->ntasks = ntasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store(&p->busy, p->nthreads - 1);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    pool_drain(p);
    for (int i = 0; i < POOL_SPIN && atomic_load(&p->busy) > 0; i++) cpu_relax();
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
