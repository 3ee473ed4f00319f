// Device buffers in the in-process transport (L3D_LOCAL_DEVICE_BUFFERS=1): the local transport
// takes device memory as NCCL takes a GPU's, so that the core's path for such a transport
// (core/comm/comm_stage.c, "a transport that takes device buffers": device pointers handed over
// as they are, host buffers mirrored into device temporaries for the native collectives, the
// work ordered after the compute through the communication stream) runs, and is checked, on
// the test devices, where no GPU is needed: cpu-opaque's memory faults if anything but the
// device's own entries reads it, and cpu-async runs a copy only when its stream is waited for,
// so a call the core did not order after the compute that wrote its buffer reads stale data.
//
// NCCL's kernels read device memory where it is. A thread of this process cannot, so every
// device buffer goes through a host copy made by the device's own entries on the stream
// set_stream named: the send ranges copied out (and waited for) when the call is posted, the
// receive range copied in (and waited for) when `test` finds the call done, before reporting
// it. The host copies are what the host-memory paths of local.c and local_coll.c then run on,
// so a call on device memory reduces exactly as the same call on host memory.
// defines: l3d_local_is_dev, l3d_local_dev_p2p, l3d_local_dev_coll, l3d_local_dev_finish,
//          l3d_local_set_stream, l3d_local_scratch_put, l3d_local_scratch_fini
#include <stdio.h>
#include <string.h>

#include "devices/device.h"
#include "transports/local/local.h"

static local_ep_t *ep_of(const l3d_transport_t *tp) { return tp->priv; }

void l3d_local_set_stream(l3d_transport_t *tp, struct l3d_device *dev, void *stream) {
    local_ep_t *ep = ep_of(tp);
    ep->dev = dev;
    ep->stream = stream;
}

int l3d_local_is_dev(const local_ep_t *ep, const void *p) {
    return ep->dev && p && l3d_dev_is_device_ptr(ep->dev, p);
}

// A copy between device memory and host memory on `stream` of `dev`, waited for.
static l3d_status copy_on(l3d_device_t *dev, void *stream, void *dst, const void *src,
                          size_t bytes, l3d_copy_kind kind) {
    void *saved = dev->stream;
    l3d_dev_set_stream(dev, stream);
    l3d_status st = l3d_dev_copy(dev, dst, src, bytes, kind);
    l3d_dev_set_stream(dev, saved);
    if (st >= 0) st = l3d_dev_stream_sync(dev, stream);
    return st;
}

// ---- host copies -------------------------------------------------------------------------------
// A host block of len bytes: a free cached one large enough, else a new one that replaces a
// free cached one (or fills an empty slot), else one of its own (*slot 0).
static void *scratch_get(l3d_transport_t *tp, size_t len, int *slot) {
    local_ep_t *ep = ep_of(tp);
    int n = (int)L3D_ARRAY_LEN(ep->hcache), spare = -1;
    for (int i = 0; i < n; i++) {
        if (ep->hcache[i].busy) continue;
        if (ep->hcache[i].p && ep->hcache[i].n >= len) {
            ep->hcache[i].busy = 1;
            *slot = i + 1;
            return ep->hcache[i].p;
        }
        if (spare < 0 || !ep->hcache[i].p) spare = i;
    }
    void *p = l3d_malloc(tp->ctx, len, "comm");
    *slot = 0;
    if (!p || spare < 0) return p;
    if (ep->hcache[spare].p) l3d_free(tp->ctx, ep->hcache[spare].p, ep->hcache[spare].n, "comm");
    ep->hcache[spare].p = p;
    ep->hcache[spare].n = len;
    ep->hcache[spare].busy = 1;
    *slot = spare + 1;
    return p;
}

void l3d_local_scratch_put(local_ep_t *ep, l3d_ctx_t *ctx, void *p, size_t len, int slot) {
    if (slot) ep->hcache[slot - 1].busy = 0;
    else l3d_free(ctx, p, len, "comm");
}
static void scratch_drop(l3d_transport_t *tp, void *p, size_t len, int slot) {
    l3d_local_scratch_put(ep_of(tp), tp->ctx, p, len, slot);
}

void l3d_local_scratch_fini(local_ep_t *ep, l3d_ctx_t *ctx) {
    for (size_t i = 0; i < L3D_ARRAY_LEN(ep->hcache); i++) {
        if (ep->hcache[i].p) l3d_free(ctx, ep->hcache[i].p, ep->hcache[i].n, "comm");
        ep->hcache[i].p = NULL;
    }
}

// Records where a finished receive goes: the host copy `h` into device memory `d`.
static void keep(l3d_transport_t *tp, lreq_t *r, void *scratch, size_t len, int slot, void *d,
                 const void *h, size_t out_len) {
    local_ep_t *ep = ep_of(tp);
    r->scratch = scratch;
    r->scratch_len = len;
    r->scratch_slot = slot;
    r->dev = ep->dev;
    r->stream = ep->stream;
    r->dev_out = d;
    r->host_out = h;
    r->out_len = out_len;
}

l3d_status l3d_local_dev_p2p(l3d_transport_t *tp, int send, int peer, uint64_t tag, void *buf,
                             size_t len, l3d_tp_request_t **req_p) {
    local_ep_t *ep = ep_of(tp);
    int slot;
    void *h = scratch_get(tp, len, &slot);
    if (!h) return L3D_ERR_NOMEM;
    l3d_status st = send ? copy_on(ep->dev, ep->stream, h, buf, len, L3D_COPY_D2H) : L3D_OK;
    if (st < 0) {
        scratch_drop(tp, h, len, slot);
        return l3d_local_fail(tp, st, "local send of %zu bytes of device memory: copying it "
                              "out failed: %s", len, l3d_ctx_last_error(tp->ctx));
    }
    if ((st = l3d_local_post(tp, send, peer, tag, h, len, req_p)) < 0) {
        scratch_drop(tp, h, len, slot);
        return st;
    }
    keep(tp, *req_p, h, len, slot, send ? NULL : buf, h, len);
    return L3D_OK;
}

l3d_status l3d_local_dev_coll(l3d_transport_t *tp, int kind, const l3d_tp_coll_args_t *a,
                              l3d_tp_request_t **req_p) {
    static const char *const what[4] = {"allreduce", "reduce_scatter", "allgather",
                                        "broadcast"};
    local_ep_t *ep = ep_of(tp);
    size_t blk = a->count * l3d_dtype_size(a->dt), all = blk * (size_t)a->n;
    size_t sb = kind == LC_REDUCE_SCATTER ? all : blk;
    size_t rb = kind == LC_ALLGATHER ? all : blk;
    if (kind == LC_BROADCAST && a->me != a->root) sb = 0;  // (its send buffer is not read)
    const char *s = sb ? a->sendbuf : NULL;
    char *rv = a->recvbuf;
    // caps.coll_ptr_support is device memory alone: the core mirrors a host buffer into a
    // device temporary, and one that reaches here is the core's mistake
    int bad_send = sb && !l3d_local_is_dev(ep, s);
    if (bad_send || !l3d_local_is_dev(ep, rv))
        return l3d_local_fail(tp, L3D_ERR_INTERNAL, "local %s with device buffers: the %s "
                              "buffer %p is not memory of the communicator's device%s",
                              what[kind], bad_send ? "send" : "receive",
                              bad_send ? (const void *)s : (void *)rv,
                              ep->dev ? "" : " (no set_stream named the device)");
    // One host block: the union of the two ranges when they overlap (in place, or an
    // allgather's own block inside its output), so the host call sees the same aliasing.
    uintptr_t sp = (uintptr_t)s, rp = (uintptr_t)rv;
    int overlap = sb && sp < rp + rb && rp < sp + sb;
    uintptr_t lo = overlap ? L3D_MIN(sp, rp) : rp;
    size_t len = overlap ? (size_t)(L3D_MAX(sp + sb, rp + rb) - lo) : rb + sb;
    int slot;
    char *h = scratch_get(tp, len, &slot);
    if (!h) return L3D_ERR_NOMEM;
    char *hr = h + (rp - lo);
    char *hs = !sb ? NULL : overlap ? h + (sp - lo) : h + rb;
    l3d_status st = sb ? copy_on(ep->dev, ep->stream, hs, s, sb, L3D_COPY_D2H) : L3D_OK;
    if (st < 0) {
        scratch_drop(tp, h, len, slot);
        return l3d_local_fail(tp, st, "local %s with device buffers: copying the send buffer "
                              "out failed: %s", what[kind], l3d_ctx_last_error(tp->ctx));
    }
    l3d_tp_coll_args_t ha = *a;
    ha.sendbuf = hs;
    ha.recvbuf = hr;
    if ((st = l3d_local_coll_start(tp, kind, &ha, req_p)) < 0) {
        scratch_drop(tp, h, len, slot);
        return st;
    }
    keep(tp, *req_p, h, len, slot, rv, hr, rb);
    return L3D_OK;
}

l3d_status l3d_local_dev_finish(l3d_transport_t *tp, lreq_t *r, size_t bytes) {
    if (!bytes) return L3D_OK;
    l3d_status st = copy_on(r->dev, r->stream, r->dev_out, r->host_out, bytes, L3D_COPY_H2D);
    if (st < 0)
        return l3d_local_fail(tp, st, "local transport: copying %zu received bytes into device "
                              "memory failed: %s", bytes, l3d_ctx_last_error(tp->ctx));
    return L3D_OK;
}
