// Device buffers in communicator calls: the communicator knows its device, and a buffer in
// that device's memory reaches a transport, which takes host memory, through a host copy
// (comm_internal.h, "device buffers"). A host buffer in the same call goes as it is.
// defines: l3d_comm_set_device, l3d_stage_needed, l3d_stage_in, l3d_stage_call
#include "core/comm/comm_internal.h"

l3d_status l3d_comm_set_device(l3d_comm_t *c, l3d_device_t *dev) {
    if (!c) return L3D_ERR_INVALID_ARG;
    if (c->in_group)
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "l3d_comm_set_device inside a group");
    c->dev = dev;
    return L3D_OK;
}

int l3d_stage_needed(const l3d_comm_t *c, const void *p) {
    return c->dev && p && l3d_dev_is_device_ptr(c->dev, p);
}

// Copies [src, src + bytes) of device memory to host `h` and waits for it.
static void d2h_now(l3d_sched_t *s, l3d_comm_t *c, void *h, const void *src, size_t bytes) {
    l3d_status st = l3d_dev_copy(c->dev, h, src, bytes, L3D_COPY_D2H);
    if (st >= 0) st = l3d_dev_stream_sync(c->dev, c->dev->stream);
    if (st < 0) s->st = st;
}

void *l3d_stage_in(l3d_sched_t *s, l3d_comm_t *c, const void *src, size_t bytes) {
    void *h = l3d_sched_tmp(s, bytes);
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
        char *h = l3d_sched_tmp(s, hi - lo);
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
        *recv = l3d_sched_tmp(s, rbytes);
    }
}
