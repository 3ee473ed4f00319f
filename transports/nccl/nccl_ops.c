// NCCL transport: requests, point-to-point and the native collectives.
// defines: l3d_nccl_isend, l3d_nccl_irecv, l3d_nccl_test, l3d_nccl_cancel, l3d_nccl_waiting_on,
//          l3d_nccl_events_free, l3d_nccl_coll_ops
//
// A device request is NCCL work on one of this transport's streams, made to wait for the work
// queued on the user's stream (set_stream) and followed by a completion event; `test` queries
// that event, and while it is pending asks the communicator for an asynchronous error (a
// peer gone). A host request is the inner transport's, wrapped.
#include <stdio.h>
#include <string.h>

#include "transports/nccl/nccl_internal.h"

// ---- completion events: a pool, as a request per message would otherwise create one ----------
static l3d_status event_take(l3d_nccl_t *n, cudaEvent_t *e) {
    if (n->nevents) {
        *e = n->events[--n->nevents];
        return L3D_OK;
    }
    cudaError_t ce = cudaEventCreateWithFlags(e, cudaEventDisableTiming);
    return ce == cudaSuccess ? L3D_OK : l3d_nccl_cuda_fail(n, ce, "creating an event");
}

// Back to the pool once it has completed; an event that may still be pending is destroyed
// (legal: CUDA releases it when it completes).
static void event_give(l3d_nccl_t *n, cudaEvent_t e, int completed) {
    if (completed && n->nevents == n->cap_events) {
        int cap = n->cap_events ? 2 * n->cap_events : 16;
        cudaEvent_t *a = l3d_calloc(n->ctx, (size_t)cap, sizeof(*a), L3D_NCCL_MEM_TAG);
        if (a) {
            if (n->events) {
                memcpy(a, n->events, (size_t)n->nevents * sizeof(*a));
                l3d_free(n->ctx, n->events, (size_t)n->cap_events * sizeof(*a), L3D_NCCL_MEM_TAG);
            }
            n->events = a;
            n->cap_events = cap;
        }
    }
    if (completed && n->nevents < n->cap_events) n->events[n->nevents++] = e;
    else cudaEventDestroy(e);
}

void l3d_nccl_events_free(l3d_nccl_t *n) {
    for (int i = 0; i < n->nevents; i++) cudaEventDestroy(n->events[i]);
    if (n->events)
        l3d_free(n->ctx, n->events, (size_t)n->cap_events * sizeof(*n->events), L3D_NCCL_MEM_TAG);
    n->events = NULL;
    n->nevents = n->cap_events = 0;
}

// ---- requests -----------------------------------------------------------------------------------
static l3d_tp_request_t *req_new(l3d_nccl_t *n) {
    return l3d_calloc(n->ctx, 1, sizeof(l3d_tp_request_t), L3D_NCCL_MEM_TAG);
}

static void req_free(l3d_nccl_t *n, l3d_tp_request_t *r, int completed) {
    if (r->done) event_give(n, r->done, completed);
    l3d_free(n->ctx, r, sizeof(*r), L3D_NCCL_MEM_TAG);
}

// Orders stream s after the work queued so far on the user's stream.
static l3d_status order_after_user(l3d_nccl_t *n, cudaStream_t s) {
    cudaError_t e = cudaEventRecord(n->ordered, n->user);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, n->ordered, 0);
    return e == cudaSuccess ? L3D_OK : l3d_nccl_cuda_fail(n, e, "ordering after the compute");
}

// The NCCL call that returned r was issued on comm and stream s: settle its launch and record
// the request's completion event after it. Under a CUDA graph capture of the user's stream
// (which s joined through order_after_user) the work is a node of the graph, not something
// that runs now: the user's stream waits for it (so s rejoins the capture before it ends) and
// the request is done at once, its work ordered before whatever the stream captures next.
static l3d_status launched(l3d_nccl_t *n, ncclResult_t r, ncclComm_t comm, cudaStream_t s,
                           l3d_tp_request_t *req) {
    if (r != ncclSuccess && r != ncclInProgress) return l3d_nccl_fail(n, r, comm, req->what);
    L3D_CHECK(n->ctx, l3d_nccl_settle(n, comm, req->what));
    L3D_CHECK(n->ctx, event_take(n, &req->done));
    cudaError_t e = cudaEventRecord(req->done, s);
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (e == cudaSuccess && cudaStreamIsCapturing(n->user, &cs) == cudaSuccess &&
        cs == cudaStreamCaptureStatusActive) {
        e = cudaStreamWaitEvent(n->user, req->done, 0);
        req->captured = 1;
    }
    return e == cudaSuccess ? L3D_OK : l3d_nccl_cuda_fail(n, e, req->what);
}

static l3d_status aborted(l3d_nccl_t *n, const char *what, int peer) {
    if (peer >= 0)
        return l3d_error(n->ctx, L3D_ERR_PEER_FAILED, "nccl %s with rank %d: the communicators "
                         "were aborted after a failure", what, peer);
    return l3d_error(n->ctx, L3D_ERR_PEER_FAILED, "nccl %s: the communicator was aborted after "
                     "a failure", what);
}

// ---- point-to-point -----------------------------------------------------------------------------
// Host memory goes over the inner transport, tag and all. Device memory goes to NCCL on the
// communicator and stream of its direction (nccl_internal.h): to a higher world rank on `up`,
// to a lower one on `down`, and a receive on the direction its sender sends on.
static l3d_status p2p(l3d_transport_t *tp, int send, int peer, uint64_t tag, void *buf,
                      size_t len, void *mr, l3d_tp_request_t **req_p) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    const char *what = send ? "send" : "recv";
    l3d_tp_request_t *r = req_new(n);
    if (!r) return L3D_ERR_NOMEM;
    r->what = what;
    r->peer = peer;
    r->len = len;
    l3d_status st;
    if (!len || !l3d_nccl_is_device(buf)) {
        st = send ? n->host.ops->isend(&n->host, peer, tag, buf, len, mr, &r->host)
                  : n->host.ops->irecv(&n->host, peer, tag, buf, len, mr, &r->host);
        if (st != L3D_OK) {  // (L3D_INPROGRESS: the caller progresses and posts again)
            req_free(n, r, 1);
            return st;
        }
        *req_p = r;
        return L3D_OK;
    }
    if (peer == n->rank) {
        req_free(n, r, 1);
        return l3d_error(n->ctx, L3D_ERR_UNSUPPORTED, "nccl %s of device memory to this rank "
                         "itself", what);
    }
    int upward = send ? peer > n->rank : peer < n->rank;
    ncclComm_t comm = upward ? n->up : n->down;
    cudaStream_t s = upward ? n->s_up : n->s_down;
    if (n->aborted || !comm) {
        req_free(n, r, 1);
        return aborted(n, what, peer);
    }
    r->comm = comm;
    st = order_after_user(n, s);
    if (st >= 0) {
        ncclResult_t rr = send ? n->lib.ncclSend(buf, len, ncclUint8, peer, comm, s)
                               : n->lib.ncclRecv(buf, len, ncclUint8, peer, comm, s);
        st = launched(n, rr, comm, s, r);
    }
    if (st < 0) {
        req_free(n, r, 0);
        return l3d_error(n->ctx, st, "nccl %s with rank %d: %s", what, peer, n->err);
    }
    *req_p = r;
    return L3D_OK;
}

l3d_status l3d_nccl_isend(l3d_transport_t *tp, int peer, uint64_t tag, const void *buf,
                          size_t len, void *mr, l3d_tp_request_t **req_p) {
    return p2p(tp, 1, peer, tag, (void *)buf, len, mr, req_p);
}

l3d_status l3d_nccl_irecv(l3d_transport_t *tp, int peer, uint64_t tag, void *buf, size_t len,
                          void *mr, l3d_tp_request_t **req_p) {
    return p2p(tp, 0, peer, tag, buf, len, mr, req_p);
}

// ---- completion ---------------------------------------------------------------------------------
l3d_status l3d_nccl_test(l3d_transport_t *tp, l3d_tp_request_t *req, int *done_p,
                         size_t *len_p) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    *done_p = 0;
    if (req->host) {
        l3d_status st = n->host.ops->test(&n->host, req->host, done_p, len_p);
        if (st < 0 || *done_p) req_free(n, req, 1);  // (the inner request is freed by its test)
        return st;
    }
    if (req->captured) {  // (a node of the graph being captured: launched())
        *done_p = 1;
        if (len_p) *len_p = req->len;
        req_free(n, req, 1);
        return L3D_OK;
    }
    l3d_nccl_group_t *g = req->peer < 0 ? l3d_nccl_group(n, req->gid) : NULL;
    if (n->aborted || (req->peer < 0 && (!g || g->dead))) {
        l3d_status st = aborted(n, req->what, req->peer);
        req_free(n, req, 0);
        return st;
    }
    cudaError_t e = cudaEventQuery(req->done);
    if (e == cudaSuccess) {
        *done_p = 1;
        if (len_p) *len_p = req->len;
        req_free(n, req, 1);
        return L3D_OK;
    }
    if (e != cudaErrorNotReady) {
        l3d_status st = l3d_nccl_cuda_fail(n, e, req->what);
        req_free(n, req, 0);
        return st;
    }
    // Still running: has its communicator failed under it (a peer's process or link gone)?
    ncclResult_t ar = ncclSuccess;
    ncclResult_t q = n->lib.ncclCommGetAsyncError(req->comm, &ar);
    if (q == ncclSuccess && (ar == ncclSuccess || ar == ncclInProgress)) return L3D_OK;
    l3d_status st = l3d_nccl_fail(n, q != ncclSuccess ? q : ar, req->comm, req->what);
    if (req->peer >= 0)
        st = l3d_error(n->ctx, L3D_ERR_PEER_FAILED, "nccl %s with rank %d: %s", req->what,
                       req->peer, n->err);
    l3d_nccl_abort_all(n);  // (no kernel of this rank may keep waiting on the failed peer)
    req_free(n, req, 0);
    return st < 0 ? st : L3D_ERR_PEER_FAILED;
}

// Device work cannot be recalled once queued: cancelling one that has not finished aborts the
// NCCL communicators (the job is failing: the core cancels on a peer's failure or a timeout),
// and the peers' calls then fail as the core's notices reach them.
void l3d_nccl_cancel(l3d_transport_t *tp, l3d_tp_request_t *req) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    if (req->host) {
        n->host.ops->cancel(&n->host, req->host);
        req_free(n, req, 1);
        return;
    }
    int completed = !n->aborted && cudaEventQuery(req->done) == cudaSuccess;
    (void)cudaGetLastError();
    if (!completed) l3d_nccl_abort_all(n);
    req_free(n, req, completed);
}

int l3d_nccl_waiting_on(const l3d_transport_t *tp, const l3d_tp_request_t *req, char *buf,
                        size_t len) {
    const l3d_nccl_t *n = l3d_nccl_priv(tp);
    if (req->host)
        return n->host.ops->waiting_on ? n->host.ops->waiting_on(&n->host, req->host, buf, len)
                                       : -1;
    if (req->peer < 0) return -1;
    snprintf(buf, len, "rank %d has not matched the %s", req->peer, req->what);
    return req->peer;
}

// ---- native collectives -------------------------------------------------------------------------
// NCCL's types and operations for ours (every l3d_dtype and l3d_redop has one; AVG is NCCL's
// ncclAvg, a sum divided by the rank count, as ours).
static ncclDataType_t nccl_type(l3d_dtype t) {
    switch (t) {
    case L3D_BFLOAT16: return ncclBfloat16;
    case L3D_FLOAT16: return ncclFloat16;
    case L3D_INT32: return ncclInt32;
    case L3D_INT64: return ncclInt64;
    case L3D_UINT8: return ncclUint8;
    default: return ncclFloat32;
    }
}

static ncclRedOp_t nccl_op(l3d_redop op) {
    switch (op) {
    case L3D_AVG: return ncclAvg;
    case L3D_MAX: return ncclMax;
    case L3D_MIN: return ncclMin;
    default: return ncclSum;
    }
}

enum { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE, C_ALLTOALL, C_BARRIER };
static const char *const coll_name[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                        "reduce",    "alltoall",       "barrier"};

// Device scratch of at least `bytes` (grown, kept for the next call): an in-place all-to-all's
// send blocks, the barrier's word. Only the collective stream uses it, in order.
static l3d_status scratch(l3d_nccl_t *n, size_t bytes, void **p) {
    if (n->scratch_bytes < bytes) {
        if (n->scratch) {
            cudaError_t e = cudaStreamSynchronize(n->s_coll);  // (the last user is done)
            if (e != cudaSuccess) return l3d_nccl_cuda_fail(n, e, "scratch");
            cudaFree(n->scratch);
        }
        n->scratch = NULL;
        n->scratch_bytes = 0;
        cudaError_t e = cudaMalloc(&n->scratch, bytes);
        if (e != cudaSuccess) return l3d_nccl_cuda_fail(n, e, "scratch");
        n->scratch_bytes = bytes;
    }
    *p = n->scratch;
    return L3D_OK;
}

// All-to-all as NCCL's grouped sends and receives (every NCCL since 2.7; ncclAlltoAll is 2.28's),
// from a copy of the send blocks when in place.
static ncclResult_t alltoall(l3d_nccl_t *n, const l3d_tp_coll_args_t *a, ncclDataType_t t,
                             ncclComm_t comm, cudaStream_t s, l3d_status *st) {
    size_t blk = a->count * l3d_dtype_size(a->dt);
    const char *src = a->sendbuf;
    if (a->sendbuf == a->recvbuf) {
        void *tmp = NULL;
        if ((*st = scratch(n, blk * (size_t)a->n, &tmp)) < 0) return ncclSuccess;
        cudaError_t e = cudaMemcpyAsync(tmp, a->sendbuf, blk * (size_t)a->n,
                                        cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess) {
            *st = l3d_nccl_cuda_fail(n, e, "alltoall");
            return ncclSuccess;
        }
        src = tmp;
    }
    ncclResult_t r = n->lib.ncclGroupStart();
    for (int i = 0; i < a->n && r == ncclSuccess; i++) {
        r = n->lib.ncclSend(src + (size_t)i * blk, a->count, t, i, comm, s);
        if (r == ncclSuccess)
            r = n->lib.ncclRecv((char *)a->recvbuf + (size_t)i * blk, a->count, t, i, comm, s);
    }
    ncclResult_t e = n->lib.ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

// One collective on the NCCL communicator of args' llama3d communicator (the id in seq's high
// 32 bits), on the collective stream. Its rank order is the communicator's (checked at split).
static l3d_status coll(l3d_transport_t *tp, int kind, const l3d_tp_coll_args_t *a,
                       l3d_tp_request_t **req_p) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    uint32_t gid = (uint32_t)(a->seq >> 32);
    l3d_nccl_group_t *g = l3d_nccl_group(n, gid);
    if (n->aborted || !g || g->dead) return aborted(n, coll_name[kind], -1);
    l3d_tp_request_t *r = req_new(n);
    if (!r) return L3D_ERR_NOMEM;
    r->what = coll_name[kind];
    r->peer = -1;
    r->gid = gid;
    r->comm = g->comm;
    size_t blk = a->count * l3d_dtype_size(a->dt);
    r->len = kind == C_ALLGATHER || kind == C_ALLTOALL ? blk * (size_t)a->n : blk;
    cudaStream_t s = n->s_coll;
    ncclDataType_t t = nccl_type(a->dt);
    l3d_status st = order_after_user(n, s);
    if (st >= 0) {
        ncclResult_t rr = ncclSuccess;
        switch (kind) {
        case C_ALLREDUCE:
            rr = n->lib.ncclAllReduce(a->sendbuf, a->recvbuf, a->count, t, nccl_op(a->op),
                                      g->comm, s);
            break;
        case C_REDUCE_SCATTER:
            rr = n->lib.ncclReduceScatter(a->sendbuf, a->recvbuf, a->count, t, nccl_op(a->op),
                                          g->comm, s);
            break;
        case C_ALLGATHER:
            rr = n->lib.ncclAllGather(a->sendbuf, a->recvbuf, a->count, t, g->comm, s);
            break;
        case C_BROADCAST:
            rr = n->lib.ncclBroadcast(a->sendbuf, a->recvbuf, a->count, t, a->root, g->comm, s);
            break;
        case C_REDUCE:
            rr = n->lib.ncclReduce(a->sendbuf, a->recvbuf, a->count, t, nccl_op(a->op), a->root,
                                   g->comm, s);
            break;
        case C_ALLTOALL:
            rr = alltoall(n, a, t, g->comm, s, &st);
            break;
        default: {  // barrier: a one-word all-reduce (its completion is every member's arrival)
            void *w = NULL;
            if ((st = scratch(n, sizeof(int32_t), &w)) >= 0)
                rr = n->lib.ncclAllReduce(w, w, 1, ncclInt32, ncclSum, g->comm, s);
            break;
        }
        }
        if (st >= 0) st = launched(n, rr, g->comm, s, r);
    }
    if (st < 0) {
        req_free(n, r, 0);
        return st;
    }
    *req_p = r;
    return L3D_OK;
}

static l3d_status nccl_allreduce(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                                 l3d_tp_request_t **req_p) {
    return coll(tp, C_ALLREDUCE, a, req_p);
}
static l3d_status nccl_reduce_scatter(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                                      l3d_tp_request_t **req_p) {
    return coll(tp, C_REDUCE_SCATTER, a, req_p);
}
static l3d_status nccl_allgather(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                                 l3d_tp_request_t **req_p) {
    return coll(tp, C_ALLGATHER, a, req_p);
}
static l3d_status nccl_broadcast(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                                 l3d_tp_request_t **req_p) {
    return coll(tp, C_BROADCAST, a, req_p);
}

static l3d_status nccl_reduce(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                              l3d_tp_request_t **req_p) {
    return coll(tp, C_REDUCE, a, req_p);
}
static l3d_status nccl_alltoall(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                                l3d_tp_request_t **req_p) {
    return coll(tp, C_ALLTOALL, a, req_p);
}
static l3d_status nccl_barrier(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                               l3d_tp_request_t **req_p) {
    return coll(tp, C_BARRIER, a, req_p);
}

const l3d_transport_coll_ops_t l3d_nccl_coll_ops = {
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .broadcast = nccl_broadcast,
    .reduce = nccl_reduce,
    .alltoall = nccl_alltoall,
    .barrier = nccl_barrier,
};
