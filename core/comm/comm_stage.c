// Device buffers in communicator calls: the communicator knows its device, and a buffer in
// that device's memory reaches a transport, which takes host memory, through a host copy
// (comm_internal.h, "device buffers"). A host buffer in the same call goes as it is.
// defines: l3d_comm_set_device, l3d_stage_needed, l3d_stage_in, l3d_stage_call, l3d_stage_h2d,
//          l3d_stage_d2h, and for a transport that takes device buffers l3d_stage_device_p2p,
//          l3d_stage_device_coll, l3d_stage_dtmp, l3d_stage_call_device, l3d_stage_order
#include "core/comm/comm_internal.h"

l3d_status l3d_comm_set_device(l3d_comm_t *c, l3d_device_t *dev) {
    if (!c) return L3D_ERR_INVALID_ARG;
    if (c->in_group)
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "l3d_comm_set_device inside a group");
    // The old device's idle bounce buffers go, with any registration a transport cached for
    // them (a later buffer at the same address must not find it).
    l3d_device_t *old = c->dev;
    for (int i = 0; old && old != dev && i < L3D_DEVICE_BOUNCE; i++)
        if (!old->bounce[i].busy) l3d_stage_bounce_drop(c->world, old, &old->bounce[i]);
    c->dev = dev;
    return L3D_OK;
}

void l3d_stage_bounce_drop(l3d_world_t *w, l3d_device_t *d, struct l3d_bounce *b) {
    if (!b->p) return;
    if (w && w->caps.needs_mr) l3d_world_mr_purge(w, b->p, b->n);
    l3d_dev_free_host(d, b->p, b->n, 1, "comm");
    b->p = NULL;
    b->n = 0;
}

int l3d_stage_needed(const l3d_comm_t *c, const void *p) {
    return c->dev && p && l3d_dev_is_device_ptr(c->dev, p);
}

// The device's communication stream, made on first use: copies for the communicator run
// there, so waiting for one waits for the compute it depends on and nothing issued after it
// (or on other streams). On a device without streams it is NULL, the one queue.
static l3d_status comm_stream(l3d_device_t *d) {
    if (d->comm_stream || !d->ops->stream_create) return L3D_OK;
    L3D_CHECK(d->ctx, l3d_dev_stream_create(d, &d->comm_stream));
    return l3d_dev_event_create(d, &d->comm_ready);
}

// Orders what is issued next on the communication stream after the ops issued so far on the
// current one (through an event, not a wait for the whole device: the compute that wrote a
// buffer being sent, or that zeroed or last read a buffer being received into).
static l3d_status comm_after_compute(l3d_device_t *d) {
    L3D_CHECK(d->ctx, comm_stream(d));
    L3D_CHECK(d->ctx, l3d_dev_event_record(d, d->comm_ready, d->stream));
    return l3d_dev_stream_wait_event(d, d->comm_stream, d->comm_ready);
}

// Issues a copy on the communication stream without waiting for it.
static l3d_status copy_async(l3d_device_t *d, void *dst, const void *src, size_t bytes,
                             l3d_copy_kind kind) {
    void *compute = d->stream;
    l3d_dev_set_stream(d, d->comm_stream);
    l3d_status st = l3d_dev_copy(d, dst, src, bytes, kind);
    l3d_dev_set_stream(d, compute);
    return st;
}

// Copies bytes between device memory and host memory on the communication stream, after the
// compute issued so far, and waits for the copy: the host reads it next, or the temporary goes.
static l3d_status copy_on_comm(l3d_device_t *d, void *dst, const void *src, size_t bytes,
                               l3d_copy_kind kind) {
    L3D_CHECK(d->ctx, comm_after_compute(d));
    L3D_CHECK(d->ctx, copy_async(d, dst, src, bytes, kind));
    return l3d_dev_stream_sync(d, d->comm_stream);
}

static void d2h_now(l3d_sched_t *s, l3d_comm_t *c, void *h, const void *src, size_t bytes) {
    l3d_status st = copy_on_comm(c->dev, h, src, bytes, L3D_COPY_D2H);
    if (st < 0) s->st = st;
}

l3d_status l3d_stage_h2d(l3d_device_t *d, void *dst, const void *h, size_t bytes) {
    return copy_on_comm(d, dst, h, bytes, L3D_COPY_H2D);
}

l3d_status l3d_stage_d2h(l3d_device_t *d, void *h, const void *src, size_t bytes) {
    return copy_on_comm(d, h, src, bytes, L3D_COPY_D2H);
}

static void *stage_temp(l3d_sched_t *s, l3d_comm_t *c, int to_device, size_t bytes) {
    return to_device ? l3d_stage_dtmp(s, c, bytes) : l3d_stage_tmp(s, c->dev, bytes);
}

// A call's ranges in the memory the transport does not take replaced by schedule temporaries
// in the memory it does (to_device 0: device ranges by host copies, l3d_stage_call; 1: host
// ranges by device temporaries, l3d_stage_call_device): the send range copied in now, the
// receive range's own address in *moved_recv (NULL: none) for a copy back after the op.
// Ranges that overlap (in place, or an allgather's own block inside its output) share one
// temporary of their union, so the algorithm or transport sees the same aliasing. Failures
// set s->st.
static void stage_ranges(l3d_sched_t *s, l3d_comm_t *c, int to_device, const void **send,
                         size_t sbytes, void **recv, size_t rbytes, void **moved_recv) {
    *moved_recv = NULL;
    uintptr_t sp = (uintptr_t)*send, rp = (uintptr_t)*recv;
    int ms = sbytes && (to_device ? !l3d_dev_is_device_ptr(c->dev, *send)
                                  : l3d_stage_needed(c, *send));
    int mr = rbytes && (to_device ? !l3d_dev_is_device_ptr(c->dev, *recv)
                                  : l3d_stage_needed(c, *recv));
    l3d_copy_kind in = to_device ? L3D_COPY_H2D : L3D_COPY_D2H;
    if (ms && mr && sp < rp + rbytes && rp < sp + sbytes) {
        uintptr_t lo = L3D_MIN(sp, rp), hi = L3D_MAX(sp + sbytes, rp + rbytes);
        char *t = stage_temp(s, c, to_device, hi - lo);
        if (!t) return;
        l3d_status st = copy_on_comm(c->dev, t + (sp - lo), *send, sbytes, in);
        if (st < 0) s->st = st;
        *moved_recv = *recv;
        *send = t + (sp - lo);
        *recv = t + (rp - lo);
        return;
    }
    if (ms) {
        void *t = stage_temp(s, c, to_device, sbytes);
        if (!t) return;
        l3d_status st = copy_on_comm(c->dev, t, *send, sbytes, in);
        if (st < 0) s->st = st;
        *send = t;
    }
    if (mr) {
        *moved_recv = *recv;
        *recv = stage_temp(s, c, to_device, rbytes);
    }
}

// ---- a transport that takes device buffers ---------------------------------------------------
static int device_comm(const l3d_comm_t *c, uint32_t ptr_bits) {
    return c->dev && !l3d_dev_is_host(c->dev) && (ptr_bits & L3D_PTR_DEVICE);
}

int l3d_stage_device_p2p(const l3d_comm_t *c) {
    return device_comm(c, c->world->caps.ptr_support);
}

int l3d_stage_device_coll(const l3d_comm_t *c) {
    const l3d_transport_caps_t *k = &c->world->caps;
    return device_comm(c, k->coll_ptr_support ? k->coll_ptr_support : k->ptr_support);
}

void *l3d_stage_dtmp(l3d_sched_t *s, l3d_comm_t *c, size_t bytes) {
    if (s->st < 0) return NULL;
    void *p = NULL;
    l3d_status st = l3d_dev_alloc(c->dev, bytes ? bytes : 1, "comm", &p);
    if (st >= 0) st = l3d_sched_tmp_keep(s, p, bytes ? bytes : 1, c->dev);
    if (st < 0) {
        if (p) l3d_dev_free(c->dev, p, bytes ? bytes : 1, "comm");
        s->st = st;
        return NULL;
    }
    return p;
}

void l3d_stage_call_device(l3d_sched_t *s, l3d_comm_t *c, const void **send, size_t sbytes,
                           void **recv, size_t rbytes, void **host_recv) {
    stage_ranges(s, c, 1, send, sbytes, recv, rbytes, host_recv);
}

l3d_status l3d_stage_order(l3d_comm_t *c) {
    l3d_device_t *d = c->dev;
    L3D_CHECK(d->ctx, comm_after_compute(d));
    l3d_tp_set_stream(&c->world->tp, d, d->comm_stream);
    return L3D_OK;
}

void *l3d_stage_in(l3d_sched_t *s, l3d_comm_t *c, const void *src, size_t bytes) {
    void *h = l3d_stage_tmp(s, c->dev, bytes);
    if (!h) return NULL;
    d2h_now(s, c, h, src, bytes);
    return s->st < 0 ? NULL : h;
}

void l3d_stage_call(l3d_sched_t *s, l3d_comm_t *c, const void **send, size_t sbytes,
                    void **recv, size_t rbytes, void **dev_recv) {
    stage_ranges(s, c, 0, send, sbytes, recv, rbytes, dev_recv);
}

// ---- chunked, pipelined staging --------------------------------------------------------------
// An allreduce, reduce or broadcast larger than L3D_STAGE_CHUNK on a communicator whose device
// the host cannot read runs as chunks of that size, each a collective of its own on host
// memory (any algorithm, the transport's native ones included), with the copies on the
// communication stream overlapping them: while chunk k is reduced, chunk k+1's D2H runs and
// chunk k-1's H2D; two bounce buffers each way alternate. Each element is reduced exactly as
// in a call of its chunk's size, so the result is the unchunked call's wherever the algorithm
// reduces every element in the same order whatever the size (the local transport's native
// allreduce, integer types); otherwise it is another fixed order: deterministic, and within
// the same float bound (docs/comm.md).
typedef struct l3d_stage_pipe {
    l3d_coll op;
    l3d_dtype dt;
    l3d_redop rop;
    int root;
    const char *send;  // the caller's buffers (device memory where ds / dr)
    char *recv;
    int ds, dr;
    size_t count, chunk, esz;  // elements: in all, per chunk
    size_t k, nk;              // the chunk being reduced, the number of chunks
    char *hs[2], *hr[2];       // bounce buffers of chunk bytes (hr == hs in place)
    l3d_request_t *sub;        // chunk k's collective
} l3d_stage_pipe_t;

int l3d_stage_chunked(const l3d_comm_t *c, l3d_coll op, size_t bytes) {
    uint64_t chunk = l3d_ctx_settings(c->ctx)->stage_chunk;
    return c->dev && !l3d_dev_is_host(c->dev) && chunk && bytes > chunk &&
           (op == L3D_COLL_ALLREDUCE || op == L3D_COLL_REDUCE || op == L3D_COLL_BROADCAST);
}

static size_t chunk_len(const l3d_stage_pipe_t *p, size_t k) {
    size_t off = k * p->chunk;
    return L3D_MIN(p->chunk, p->count - off);
}

// D2H of chunk k's input into its bounce buffer (issued, not waited for).
static l3d_status pipe_d2h(l3d_comm_t *c, l3d_stage_pipe_t *p, size_t k) {
    if (!p->ds || k >= p->nk) return L3D_OK;
    return copy_async(c->dev, p->hs[k % 2], p->send + k * p->chunk * p->esz,
                      chunk_len(p, k) * p->esz, L3D_COPY_D2H);
}

// Starts chunk k's collective on host memory (its bounce buffers, or the caller's host
// buffers at the chunk's offset). It is the pipe's, off the world's active list, and counts
// as part of the caller's one call in the statistics.
static l3d_status pipe_start_chunk(l3d_comm_t *c, l3d_stage_pipe_t *p, size_t k) {
    size_t off = k * p->chunk * p->esz;
    const void *s = p->ds ? p->hs[k % 2] : p->send ? p->send + off : NULL;
    void *r = p->dr ? p->hr[k % 2] : p->recv ? p->recv + off : NULL;
    l3d_comm_stats_t keep = c->stats;
    l3d_status st = l3d_coll_start(c, p->op, s, r, chunk_len(p, k), p->dt, p->rop, p->root,
                                   &p->sub);
    c->stats = keep;
    if (st < 0) {
        p->sub = NULL;
        return st;
    }
    l3d_request_unlink(p->sub);
    return L3D_OK;
}

l3d_status l3d_stage_pipe_start(l3d_comm_t *c, l3d_coll op, const void *sendbuf, void *recvbuf,
                                size_t count, l3d_dtype dt, l3d_redop rop, int root,
                                l3d_request_t **req_p) {
    l3d_device_t *d = c->dev;
    const char *what = l3d_coll_name(op);
    l3d_stage_pipe_t *p = l3d_calloc(c->ctx, 1, sizeof(*p), "comm");
    if (!p) return L3D_ERR_NOMEM;
    int me = c->rank;
    if (op == L3D_COLL_BROADCAST && me != root) sendbuf = NULL;  // not read
    if (op == L3D_COLL_REDUCE && me != root) recvbuf = NULL;     // not written
    *p = (l3d_stage_pipe_t){.op = op, .dt = dt, .rop = rop, .root = root, .send = sendbuf,
                            .recv = recvbuf, .count = count, .esz = l3d_dtype_size(dt)};
    p->chunk = L3D_MAX((size_t)1, (size_t)(l3d_ctx_settings(c->ctx)->stage_chunk / p->esz));
    p->nk = (count + p->chunk - 1) / p->chunk;
    p->ds = l3d_stage_needed(c, sendbuf);
    p->dr = l3d_stage_needed(c, recvbuf);
    int inplace = p->ds && p->dr && (const void *)sendbuf == recvbuf;
    l3d_sched_t s;
    l3d_sched_init(&s, c);
    size_t cb = p->chunk * p->esz;
    for (int i = 0; i < 2; i++) {
        if (p->ds) p->hs[i] = l3d_stage_tmp(&s, d, cb);
        if (p->dr) p->hr[i] = inplace ? p->hs[i] : l3d_stage_tmp(&s, d, cb);
    }
    // Every copy of the call comes after the compute issued before it (one event); chunk 0
    // is in host memory before its collective starts, chunk 1 on its way.
    l3d_status st = s.st;
    if (st >= 0) st = comm_after_compute(d);
    if (st >= 0) st = pipe_d2h(c, p, 0);
    if (st >= 0) st = l3d_dev_stream_sync(d, d->comm_stream);
    if (st >= 0) st = pipe_d2h(c, p, 1);
    if (st < 0) {
        l3d_sched_fini(&s);
        l3d_free(c->ctx, p, sizeof(*p), "comm");
        return l3d_error(c->ctx, st, "%s: staging a device buffer through host memory failed",
                         what);
    }
    l3d_request_t *r = NULL;
    if ((st = l3d_request_start_pipe(c, &s, what, p, &r)) < 0) {  // frees s on failure
        l3d_free(c->ctx, p, sizeof(*p), "comm");
        return st;
    }
    st = pipe_start_chunk(c, p, 0);
    if (st < 0) {
        l3d_request_free(r);  // frees p
        return st;
    }
    l3d_log(c->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM, "%s of %zu bytes staged in %zu chunks of "
            "%zu", what, count * p->esz, p->nk, cb);
    *req_p = r;
    return L3D_OK;
}

// Chunk k done: its H2D goes out, the next chunk's input is waited for (with that H2D's
// predecessor), the one after it starts on its way, and the next collective starts.
l3d_status l3d_stage_pipe_advance(l3d_request_t *r, int *progressed) {
    l3d_stage_pipe_t *p = r->pipe;
    l3d_comm_t *c = r->comm;
    l3d_device_t *d = c->dev;
    for (;;) {
        l3d_status st = l3d_request_advance(p->sub, progressed);
        if (st == L3D_INPROGRESS) return st;
        l3d_request_free(p->sub);
        p->sub = NULL;
        if (st < 0) return st;
        *progressed = 1;
        size_t k = p->k;
        if (p->dr)
            L3D_CHECK(c->ctx, copy_async(d, p->recv + k * p->chunk * p->esz, p->hr[k % 2],
                                         chunk_len(p, k) * p->esz, L3D_COPY_H2D));
        p->k = ++k;
        // the next chunk's D2H and this chunk's H2D are done after this wait: buffers k % 2
        // hold chunk k's input, and (k + 1) % 2 are free for chunk k + 1
        L3D_CHECK(c->ctx, l3d_dev_stream_sync(d, d->comm_stream));
        if (k == p->nk) return L3D_OK;
        L3D_CHECK(c->ctx, pipe_d2h(c, p, k + 1));
        L3D_CHECK(c->ctx, pipe_start_chunk(c, p, k));
    }
}

void l3d_stage_pipe_free(l3d_request_t *r) {
    l3d_stage_pipe_t *p = r->pipe;
    if (p->sub) l3d_request_free(p->sub);
    l3d_free(r->comm->ctx, p, sizeof(*p), "comm");
    r->pipe = NULL;
}
