// The test devices' lifetime, memory, copies, queues and their op tables (cpu_test.h says
// what each device is for).
// defines: l3d_cpu_opaque_device_ops, l3d_cpu_async_device_ops, l3d_ctest_*
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "devices/cpu_test/cpu_test.h"

// A queued op: its runner and a copy of its arguments.
struct l3d_ctest_job {
    l3d_ctest_job_t *next;
    l3d_ctest_run_fn run;
    size_t size;
    _Alignas(max_align_t) unsigned char args[];
};

// ---- pointers -----------------------------------------------------------------------------------
static int tagged(const void *p) { return ((uintptr_t)p & L3D_CTEST_TAG) == L3D_CTEST_TAG; }

void *l3d_ctest_untag(l3d_device_t *dev, int *bad, const char *op, const char *arg,
                      const void *p) {
    if (!p) return NULL;
    if (!tagged(p)) {
        if (!*bad)
            l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s %s: '%s' (%p) is not memory of this "
                      "device (a host pointer where the contract takes device memory)",
                      dev->ops->name, op, arg, p);
        *bad = 1;
        return NULL;
    }
    return (void *)((uintptr_t)p & ~L3D_CTEST_TAG);
}

void *l3d_ctest_host(l3d_device_t *dev, int *bad, const char *op, const char *arg,
                     const void *p) {
    if (p && tagged(p)) {
        if (!*bad)
            l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s %s: '%s' (%p) is device memory where "
                      "the contract takes host memory", dev->ops->name, op, arg, p);
        *bad = 1;
    }
    return (void *)p;
}

// ---- the queue (cpu-async) ----------------------------------------------------------------------
static l3d_ctest_queue_t *current_queue(l3d_device_t *dev) {
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    return dev->stream ? (l3d_ctest_queue_t *)dev->stream : &t->queue0;
}

// A queued wait on an event (a job with no runner): the queue it is in goes on only once
// queue `q` has run `seq` jobs.
typedef struct {
    l3d_ctest_queue_t *q;
    uint64_t seq;
} ev_wait_t;

// The worker: runs the jobs of every queue the host waits on, in each queue's order. Nothing
// runs before a wait asks for it. A queue whose next job waits on an event that another queue
// has not reached yet is passed over, and that other queue is made to run up to the event.
static void *worker_main(void *arg) {
    l3d_device_t *dev = arg;
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    pthread_mutex_lock(&t->mu);
    for (;;) {
        l3d_ctest_queue_t *q = NULL;
        int raised = 0;
        for (l3d_ctest_queue_t *it = &t->queue0; it && !q; it = it->next) {
            if (it->done >= it->flush_to) continue;
            const ev_wait_t *w = it->head->run ? NULL : (const ev_wait_t *)it->head->args;
            if (w && w->q->done < w->seq) {
                if (w->q->flush_to < w->seq) w->q->flush_to = w->seq, raised = 1;
                continue;
            }
            q = it;
        }
        if (!q) {
            if (raised) continue;  // a queue before this one now has work
            if (t->stop) break;
            pthread_cond_wait(&t->wake, &t->mu);
            continue;
        }
        l3d_ctest_job_t *j = q->head;
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        l3d_status st = L3D_OK;
        if (j->run) {
            pthread_mutex_unlock(&t->mu);
            st = j->run(&t->cpu, j->args);
            pthread_mutex_lock(&t->mu);
        }
        l3d_free(dev->ctx, j, sizeof(*j) + j->size, "other");
        if (st < 0 && t->failed == L3D_OK) t->failed = st;
        // Only a queue's last job of the flush wakes the host: waking it for every job
        // doubled the test suites' time on this device with nothing to show for it.
        if (++q->done >= q->flush_to) pthread_cond_broadcast(&t->done_cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

l3d_status l3d_ctest_submit(l3d_device_t *dev, l3d_ctest_run_fn run, const void *args,
                            size_t size) {
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    if (!t->async) return run(&t->cpu, args);
    l3d_ctest_job_t *j = l3d_malloc(dev->ctx, sizeof(*j) + size, "other");
    if (!j) return L3D_ERR_NOMEM;
    j->next = NULL;
    j->run = run;
    j->size = size;
    memcpy(j->args, args, size);
    l3d_ctest_queue_t *q = current_queue(dev);
    pthread_mutex_lock(&t->mu);
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    q->issued++;
    pthread_mutex_unlock(&t->mu);
    return L3D_OK;
}

// Waits for the ops issued so far on `only` (NULL: every queue). Returns the first failure of
// an op since the last wait (and forgets it, as the next wait has its own ops).
static l3d_status wait_queues(l3d_device_t *dev, l3d_ctest_queue_t *only) {
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    if (!t->async) return L3D_OK;
    pthread_mutex_lock(&t->mu);
    int pending = 0;
    for (l3d_ctest_queue_t *q = only ? only : &t->queue0; q; q = only ? NULL : q->next) {
        q->flush_to = q->issued;
        pending |= q->done < q->flush_to;
    }
    if (pending) pthread_cond_signal(&t->wake);  // (not for nothing: two context switches)
    for (l3d_ctest_queue_t *q = only ? only : &t->queue0; q; q = only ? NULL : q->next)
        while (q->done < q->flush_to) pthread_cond_wait(&t->done_cv, &t->mu);
    l3d_status st = t->failed;
    t->failed = L3D_OK;
    pthread_mutex_unlock(&t->mu);
    return st;
}

l3d_status l3d_ctest_sync(l3d_device_t *dev) { return wait_queues(dev, NULL); }
static l3d_status ctest_sync(l3d_device_t *dev) { return l3d_ctest_sync(dev); }

// ---- lifetime -----------------------------------------------------------------------------------
static l3d_status ctest_init(l3d_device_t *dev, const l3d_device_params_t *params, int async) {
    l3d_ctest_t *t = l3d_calloc(dev->ctx, 1, sizeof(*t), "other");
    if (!t) return L3D_ERR_NOMEM;
    t->async = async;
    t->mem_total = l3d_ctx_settings(dev->ctx)->device_memory;
    if (!t->mem_total) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        t->mem_total = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    }
    t->cpu.ops = &l3d_cpu_device_ops;
    t->cpu.ctx = dev->ctx;
    l3d_status st = l3d_cpu_device_ops.init(&t->cpu, params);
    if (st < 0) {
        l3d_free(dev->ctx, t, sizeof(*t), "other");
        return st;
    }
    dev->priv = t;
    dev->num_threads = t->cpu.num_threads;
    if (!async) return L3D_OK;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    int rc = pthread_create(&t->worker, NULL, worker_main, dev);
    if (rc) {
        l3d_cpu_device_ops.fini(&t->cpu);
        l3d_free(dev->ctx, t, sizeof(*t), "other");
        dev->priv = NULL;
        return l3d_error(dev->ctx, L3D_ERR_SYSTEM, "cpu-async: starting its worker thread "
                         "failed: %s", strerror(rc));
    }
    t->worker_started = 1;
    return L3D_OK;
}
static l3d_status opaque_init(l3d_device_t *dev, const l3d_device_params_t *params) {
    return ctest_init(dev, params, 0);
}
static l3d_status async_init(l3d_device_t *dev, const l3d_device_params_t *params) {
    return ctest_init(dev, params, 1);
}

static void ctest_fini(l3d_device_t *dev) {
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    if (!t) return;
    if (t->worker_started) {
        (void)wait_queues(dev, NULL);  // ops issued and never waited for still run
        pthread_mutex_lock(&t->mu);
        t->stop = 1;
        pthread_cond_signal(&t->wake);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->worker, NULL);
        pthread_cond_destroy(&t->wake);
        pthread_cond_destroy(&t->done_cv);
        pthread_mutex_destroy(&t->mu);
    }
    l3d_cpu_device_ops.fini(&t->cpu);
    l3d_free(dev->ctx, t, sizeof(*t), "other");
    dev->priv = NULL;
}

// ---- memory ---------------------------------------------------------------------------------
static l3d_status ctest_alloc(l3d_device_t *dev, size_t bytes, const char *tag, void **ptr_p) {
    if (!ptr_p) return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s alloc: NULL ptr_p",
                                 dev->ops->name);
    void *p = NULL;
    L3D_CHECK(dev->ctx, l3d_cpu_device_ops.alloc(&l3d_ctest_priv(dev)->cpu, bytes, tag, &p));
    *ptr_p = p ? (void *)((uintptr_t)p | L3D_CTEST_TAG) : NULL;
    if (p) l3d_ctest_priv(dev)->mem_used += bytes;
    return L3D_OK;
}

// As cudaMemGetInfo, for the memory this device reports (the caller's figures, not the OS's).
static l3d_status ctest_mem_info(const l3d_device_t *dev, uint64_t *free_bytes,
                                 uint64_t *total_bytes) {
    const l3d_ctest_t *t = l3d_ctest_priv(dev);
    *total_bytes = t->mem_total;
    *free_bytes = t->mem_used < t->mem_total ? t->mem_total - t->mem_used : 0;
    return L3D_OK;
}

// As cudaFree: waits for the ops that may still use the memory.
static void ctest_free(l3d_device_t *dev, void *ptr, size_t bytes, const char *tag) {
    if (!ptr) return;
    int bad = 0;
    void *p = l3d_ctest_untag(dev, &bad, "free", "ptr", ptr);
    if (bad) {  // freeing host memory here is a bug of the caller: say so, leak it
        l3d_log(dev->ctx, L3D_LOG_ERROR, L3D_SUBSYS_DEV, "%s", l3d_ctx_last_error(dev->ctx));
        return;
    }
    (void)wait_queues(dev, NULL);
    l3d_cpu_device_ops.free(&l3d_ctest_priv(dev)->cpu, p, bytes, tag);
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    t->mem_used -= bytes < t->mem_used ? bytes : t->mem_used;
}

static int ctest_is_host(const l3d_device_t *dev) {
    (void)dev;
    return 0;
}

static int ctest_is_device_ptr(const l3d_device_t *dev, const void *ptr) {
    (void)dev;
    return ptr && tagged(ptr);
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    int value;
} mem_t;
static l3d_status run_copy(l3d_device_t *cpu, const void *p) {
    const mem_t *a = p;
    if (a->bytes && a->dst != a->src) memmove(a->dst, a->src, a->bytes);
    (void)cpu;
    return L3D_OK;
}
static l3d_status run_memset(l3d_device_t *cpu, const void *p) {
    const mem_t *a = p;
    if (a->bytes) memset(a->dst, a->value, a->bytes);
    (void)cpu;
    return L3D_OK;
}

static l3d_status ctest_copy(l3d_device_t *dev, void *dst, const void *src, size_t bytes,
                             l3d_copy_kind kind) {
    int bad = 0;
    mem_t a = {.bytes = bytes};
    switch (kind) {
    case L3D_COPY_H2D:
        a.dst = l3d_ctest_untag(dev, &bad, "copy H2D", "dst", dst);
        a.src = l3d_ctest_host(dev, &bad, "copy H2D", "src", src);
        break;
    case L3D_COPY_D2H:
        a.dst = l3d_ctest_host(dev, &bad, "copy D2H", "dst", dst);
        a.src = l3d_ctest_untag(dev, &bad, "copy D2H", "src", src);
        break;
    case L3D_COPY_D2D:
        a.dst = l3d_ctest_untag(dev, &bad, "copy D2D", "dst", dst);
        a.src = l3d_ctest_untag(dev, &bad, "copy D2D", "src", src);
        break;
    default:
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s copy: bad kind %d", dev->ops->name,
                         (int)kind);
    }
    if (bad) return L3D_ERR_INVALID_ARG;
    if (bytes && (!a.dst || !a.src))
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "%s copy: NULL pointer for %zu bytes",
                         dev->ops->name, bytes);
    return l3d_ctest_submit(dev, run_copy, &a, sizeof(a));
}

static l3d_status ctest_memset(l3d_device_t *dev, void *dst, int value, size_t bytes) {
    int bad = 0;
    mem_t a = {.dst = l3d_ctest_untag(dev, &bad, "memset", "dst", dst), .bytes = bytes,
               .value = value};
    if (bad) return L3D_ERR_INVALID_ARG;
    return l3d_ctest_submit(dev, run_memset, &a, sizeof(a));
}

// ---- streams (cpu-async: a queue each) ------------------------------------------------------
static l3d_status async_stream_create(l3d_device_t *dev, void **stream_p) {
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    l3d_ctest_queue_t *q = l3d_calloc(dev->ctx, 1, sizeof(*q), "other");
    if (!q) return L3D_ERR_NOMEM;
    pthread_mutex_lock(&t->mu);
    q->next = t->queue0.next;
    t->queue0.next = q;
    pthread_mutex_unlock(&t->mu);
    *stream_p = q;
    return L3D_OK;
}

static l3d_status async_stream_sync(l3d_device_t *dev, void *stream) {
    return wait_queues(dev, stream ? (l3d_ctest_queue_t *)stream : &l3d_ctest_priv(dev)->queue0);
}

// Like cudaStreamDestroy: the stream's ops still run; then it is gone. (Every queue is waited
// for: a wait on one of this stream's events, queued elsewhere, may still name it.)
static void async_stream_destroy(l3d_device_t *dev, void *stream) {
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    l3d_ctest_queue_t *q = stream;
    (void)wait_queues(dev, NULL);
    pthread_mutex_lock(&t->mu);
    for (l3d_ctest_queue_t *it = &t->queue0; it; it = it->next)
        if (it->next == q) {
            it->next = q->next;
            break;
        }
    pthread_mutex_unlock(&t->mu);
    if (dev->stream == stream) dev->stream = NULL;
    l3d_free(dev->ctx, q, sizeof(*q), "other");
}

// ---- events (cpu-async: a queue and a count of its jobs) ------------------------------------
static l3d_status async_event_create(l3d_device_t *dev, void **event_p) {
    ev_wait_t *e = l3d_calloc(dev->ctx, 1, sizeof(*e), "other");
    if (!e) return L3D_ERR_NOMEM;
    *event_p = e;
    return L3D_OK;
}

static void async_event_destroy(l3d_device_t *dev, void *event) {
    l3d_free(dev->ctx, event, sizeof(ev_wait_t), "other");  // waits hold a copy
}

static l3d_status async_event_record(l3d_device_t *dev, void *event, void *stream) {
    l3d_ctest_t *t = l3d_ctest_priv(dev);
    ev_wait_t *e = event;
    pthread_mutex_lock(&t->mu);
    e->q = stream ? (l3d_ctest_queue_t *)stream : &t->queue0;
    e->seq = e->q->issued;
    pthread_mutex_unlock(&t->mu);
    return L3D_OK;
}

// Queues a job with no runner on `stream`: the worker passes it only once the event's queue
// has run to the recorded point.
static l3d_status async_stream_wait_event(l3d_device_t *dev, void *stream, void *event) {
    const ev_wait_t *e = event;
    if (!e->q) return L3D_OK;  // never recorded: already finished
    void *saved = dev->stream;
    dev->stream = stream;
    l3d_status st = l3d_ctest_submit(dev, NULL, e, sizeof(*e));
    dev->stream = saved;
    return st;
}

// ---- the tables -----------------------------------------------------------------------------
// What the two share: everything but the name, init and (cpu-async) the streams.
#define CTEST_COMMON_ENTRIES                                                                   \
    .abi_version = L3D_DEVICE_ABI_VERSION, .size = sizeof(l3d_device_ops_t),                  \
    .fini = ctest_fini, .alloc = ctest_alloc, .free = ctest_free, .is_host = ctest_is_host,     \
    .is_device_ptr = ctest_is_device_ptr, .copy = ctest_copy, .memset = ctest_memset,          \
    .sync = ctest_sync, .mem_info = ctest_mem_info, L3D_CTEST_OP_ENTRIES

const l3d_device_ops_t l3d_cpu_opaque_device_ops = {
    .name = "cpu-opaque",
    .init = opaque_init,
    CTEST_COMMON_ENTRIES,
};

const l3d_device_ops_t l3d_cpu_async_device_ops = {
    .name = "cpu-async",
    .init = async_init,
    .stream_create = async_stream_create,
    .stream_destroy = async_stream_destroy,
    .stream_sync = async_stream_sync,
    .event_create = async_event_create,
    .event_destroy = async_event_destroy,
    .event_record = async_event_record,
    .stream_wait_event = async_stream_wait_event,
    CTEST_COMMON_ENTRIES,
};
