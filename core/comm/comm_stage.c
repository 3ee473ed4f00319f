// Device buffers in communicator calls: the communicator knows its device, and a buffer in
// that device's memory reaches a transport, which takes host memory, through a host copy
// (comm_internal.h, "device buffers"). A host buffer in the same call goes as it is.
// defines: l3d_comm_set_device, l3d_stage_needed, l3d_stage_in, l3d_stage_call, l3d_stage_h2d
#include "core/comm/comm_internal.h"

l3d_status l3d_comm_set_device(l3d_comm_t *c, l3d_device_t *dev) {
    if (!c) return L3D_ERR_INVALID_ARG;
    if (c->in_group)
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "l3d_comm_set_device inside a group");
    // The old device's idle bounce buffers go, with any registration a transport cached for
    // them (a later buffer at the same address must not find it).
    l3d_device_t *old = c->dev;
    for (int i = 0; old && old != dev && i < L3D_DEVICE_BOUNCE; i++) {
        struct l3d_bounce *b = &old->bounce[i];
        if (!b->p || b->busy) continue;
        if (c->world->caps.needs_mr) l3d_world_mr_purge(c->world, b->p, b->n);
        l3d_dev_free_host(old, b->p, b->n, 1, "comm");
        b->p = NULL;
        b->n = 0;
    }
    c->dev = dev;
    return L3D_OK;
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

// Copies bytes between device memory and host `h` on the communication stream, after the ops
// issued so far on the current one (through an event, not a wait for the whole device: the
// compute that wrote a buffer being sent, or that zeroed or last read a buffer being
// received into), and waits for the copy: the host reads it next, or the temporary goes.
static l3d_status copy_on_comm(l3d_device_t *d, void *dst, const void *src, size_t bytes,
                               l3d_copy_kind kind) {
    void *compute = d->stream;
    l3d_status st = comm_stream(d);
    if (st >= 0) st = l3d_dev_event_record(d, d->comm_ready, compute);
    if (st >= 0) st = l3d_dev_stream_wait_event(d, d->comm_stream, d->comm_ready);
    if (st >= 0) {
        l3d_dev_set_stream(d, d->comm_stream);
        st = l3d_dev_copy(d, dst, src, bytes, kind);
        l3d_dev_set_stream(d, compute);
    }
    return st < 0 ? st : l3d_dev_stream_sync(d, d->comm_stream);
}

static void d2h_now(l3d_sched_t *s, l3d_comm_t *c, void *h, const void *src, size_t bytes) {
    l3d_status st = copy_on_comm(c->dev, h, src, bytes, L3D_COPY_D2H);
    if (st < 0) s->st = st;
}

l3d_status l3d_stage_h2d(l3d_device_t *d, void *dst, const void *h, size_t bytes) {
    return copy_on_comm(d, dst, h, bytes, L3D_COPY_H2D);
}

void *l3d_stage_in(l3d_sched_t *s, l3d_comm_t *c, const void *src, size_t bytes) {
    void *h = l3d_stage_tmp(s, c->dev, bytes);
    if (!h) return NULL;
    d2h_now(s, c, h, src, bytes);
    return s->st < 0 ? NULL : h;
}

void l3d_stage_call(l3d_sched_t *s, l3d_comm_t *c, const void **send, size_t sbytes,
                    void **recv, size_t rbytes, void **dev_recv) {
    *dev_recv = NULL;
    uintptr_t sp = (uintptr_t)*send, rp = (uintptr_t)*recv;
    int ds = sbytes && l3d_stage_needed(c, *send), dr = rbytes && l3d_stage_needed(c, *recv);
    if (ds && dr && sp < rp + rbytes && rp < sp + sbytes) {
        // in place, or one buffer inside the other (an allgather's own block): one host copy
        // of the union, so the algorithm sees the same overlap
        uintptr_t lo = L3D_MIN(sp, rp), hi = L3D_MAX(sp + sbytes, rp + rbytes);
        char *h = l3d_stage_tmp(s, c->dev, hi - lo);
        if (!h) return;
        d2h_now(s, c, h + (sp - lo), *send, sbytes);
        *dev_recv = *recv;
        *send = h + (sp - lo);
        *recv = h + (rp - lo);
        return;
    }
    if (ds) *send = l3d_stage_in(s, c, *send, sbytes);
    if (dr) {
        *dev_recv = *recv;
        *recv = l3d_stage_tmp(s, c->dev, rbytes);
    }
}
