// The public collective entries: check arguments, pick the algorithm, build its schedule and
// start it as a request; the blocking forms wait on that request.
#include <stdio.h>
#include <string.h>

#include "core/comm/comm_internal.h"

typedef l3d_status (*build_fn)(l3d_sched_t *s, const l3d_coll_args_t *a);

static build_fn builder(l3d_coll op, l3d_algo al) {
    switch (op) {
    case L3D_COLL_ALLREDUCE:
        if (al == L3D_ALGO_RABENSEIFNER) return l3d_coll_allreduce_rabenseifner;
        if (al == L3D_ALGO_RECDOUBLING) return l3d_coll_allreduce_recdoubling;
        if (al == L3D_ALGO_TREE) return l3d_coll_allreduce_tree;
        return l3d_coll_allreduce_ring;
    case L3D_COLL_REDUCE_SCATTER:
        return l3d_coll_reduce_scatter_ring;
    case L3D_COLL_ALLGATHER:
        if (al == L3D_ALGO_RECDOUBLING) return l3d_coll_allgather_recdoubling;
        if (al == L3D_ALGO_BRUCK) return l3d_coll_allgather_bruck;
        return l3d_coll_allgather_ring;
    case L3D_COLL_BROADCAST:
        return al == L3D_ALGO_CHAIN ? l3d_coll_broadcast_chain : l3d_coll_broadcast_tree;
    case L3D_COLL_REDUCE:
        return al == L3D_ALGO_CHAIN ? l3d_coll_reduce_chain : l3d_coll_reduce_tree;
    case L3D_COLL_ALLTOALL:
        return l3d_coll_alltoall_pairwise;
    default:
        return l3d_coll_barrier_dissemination;
    }
}

static int reduces(l3d_coll op) {
    return op == L3D_COLL_ALLREDUCE || op == L3D_COLL_REDUCE_SCATTER || op == L3D_COLL_REDUCE;
}

// The transport's native entry for `op`, or NULL.
static l3d_tp_coll_fn native_fn(const l3d_comm_t *c, l3d_coll op) {
    const l3d_transport_t *t = &c->world->tp;
    const l3d_transport_caps_t *k = &c->world->caps;
    // (entries for device memory only: l3d_coll_start gives them device buffers, or none)
    if (k->coll_ptr_support && !(k->coll_ptr_support & L3D_PTR_HOST)) return NULL;
    return l3d_coll_native_any(t, op);
}

l3d_tp_coll_fn l3d_coll_native_any(const l3d_transport_t *t, l3d_coll op) {
    switch (op) {
    case L3D_COLL_ALLREDUCE: return L3D_TP_COLL(t, allreduce);
    case L3D_COLL_REDUCE_SCATTER: return L3D_TP_COLL(t, reduce_scatter);
    case L3D_COLL_ALLGATHER: return L3D_TP_COLL(t, allgather);
    case L3D_COLL_BROADCAST: return L3D_TP_COLL(t, broadcast);
    case L3D_COLL_REDUCE: return L3D_TP_COLL(t, reduce);
    case L3D_COLL_ALLTOALL: return L3D_TP_COLL(t, alltoall);
    case L3D_COLL_BARRIER: return L3D_TP_COLL(t, barrier);
    default: return NULL;
    }
}

// The bytes this rank's send and receive buffers of a call span (0: the buffer is not used).
static void coll_bytes(const l3d_comm_t *c, l3d_coll op, size_t count, size_t esz, int root,
                       size_t *sbytes, size_t *rbytes) {
    size_t blk = count * esz, all = blk * (size_t)c->size;
    *sbytes = op == L3D_COLL_REDUCE_SCATTER || op == L3D_COLL_ALLTOALL ? all : blk;
    *rbytes = op == L3D_COLL_ALLGATHER || op == L3D_COLL_ALLTOALL ? all : blk;
    if ((op == L3D_COLL_BROADCAST && c->rank != root) || op == L3D_COLL_BARRIER) *sbytes = 0;
    if ((op == L3D_COLL_REDUCE && c->rank != root) || op == L3D_COLL_BARRIER) *rbytes = 0;
}

// A native collective on device memory: the host buffers through device temporaries, the
// transport's work ordered after the compute issued so far.
static l3d_status coll_device(l3d_comm_t *c, l3d_coll op, l3d_tp_coll_fn fn, const void *sendbuf,
                              void *recvbuf, size_t count, l3d_dtype dt, l3d_redop rop, int root,
                              l3d_request_t **req_p) {
    const char *what = l3d_coll_name(op);
    int n = c->size, me = c->rank;
    size_t sbytes, rbytes;
    coll_bytes(c, op, count, l3d_dtype_size(dt), root, &sbytes, &rbytes);
    l3d_sched_t s;
    l3d_sched_init(&s, c);
    void *host_recv = NULL, *dev_recv = recvbuf;
    l3d_stage_call_device(&s, c, &sendbuf, sbytes, &dev_recv, rbytes, &host_recv);
    l3d_status st = s.st;
    if (st >= 0) st = l3d_stage_order(c);
    if (st < 0) {
        l3d_sched_fini(&s);
        return l3d_error(c->ctx, st, "%s: device memory for the transport %s failed", what,
                         c->world->tp.ops->name);
    }
    uint32_t seq = c->seq++;
    l3d_tp_coll_args_t na = {.ranks = c->ranks, .n = n, .me = me,
                             .seq = ((uint64_t)c->id << 32) | seq, .sendbuf = sendbuf,
                             .recvbuf = dev_recv, .count = count, .dt = dt, .op = rop,
                             .root = root};
    l3d_sched_round(&s);
    l3d_sched_native(&s, fn, &na);
    if (host_recv) {
        l3d_sched_round(&s);
        l3d_sched_d2h(&s, c, -1, host_recv, dev_recv, rbytes);
    }
    uint64_t tag = l3d_tag_make(&c->world->tags, L3D_TAG_COLL, c->id, seq, 0);
    return l3d_request_start(c, &s, what, tag, req_p);
}

l3d_status l3d_coll_start(l3d_comm_t *c, l3d_coll op, const void *sendbuf, void *recvbuf,
                          size_t count, l3d_dtype dt, l3d_redop rop, int root,
                          l3d_request_t **req_p) {
    if (!c || !req_p) return L3D_ERR_INVALID_ARG;
    const char *what = l3d_coll_name(op);
    int n = c->size, me = c->rank;
    if ((unsigned)dt >= L3D_DTYPE_COUNT || (reduces(op) && (unsigned)rop >= L3D_REDOP_COUNT))
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "%s: dtype %d, op %d", what, (int)dt,
                         (int)rop);
    if ((op == L3D_COLL_BROADCAST || op == L3D_COLL_REDUCE) && (root < 0 || root >= n))
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "%s: root %d of %d ranks", what, root, n);
    size_t esz = l3d_dtype_size(dt);
    if (count > SIZE_MAX / 8 / (size_t)n)
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "%s: count %zu too large", what, count);
    if (count && op != L3D_COLL_BARRIER) {
        int need_send = !(op == L3D_COLL_BROADCAST && me != root);
        int need_recv = !(op == L3D_COLL_REDUCE && me != root);
        if ((need_send && !sendbuf) || (need_recv && !recvbuf))
            return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "%s: NULL buffer", what);
    }
    if (c->in_group)
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG,
                         "%s inside l3d_comm_group_start/end (groups batch send/recv only)", what);
    L3D_CHECK(c->ctx, l3d_comm_check(c, what));
    size_t vol = count * esz;  // nccl-tests' size: the whole buffer for rs/ag/alltoall
    if (op == L3D_COLL_REDUCE_SCATTER || op == L3D_COLL_ALLGATHER || op == L3D_COLL_ALLTOALL)
        vol *= (size_t)n;
    c->stats.calls++;
    c->stats.bytes += vol;
    if (op != L3D_COLL_BARRIER && count == 0) return l3d_request_done(c, what, L3D_OK, req_p);
    // A transport that takes device buffers runs its native entries on them directly (no
    // chunks, no other algorithm: comm_internal.h, "a transport that takes device buffers").
    l3d_tp_coll_fn dnf = l3d_coll_native_any(&c->world->tp, op);
    if (dnf && n > 1 && l3d_stage_device_coll(c))
        return coll_device(c, op, dnf, sendbuf, recvbuf, count, dt, rop, root, req_p);
    // A large staged call goes in chunks, pipelined (comm_stage.c); every rank decides alike.
    if (l3d_stage_chunked(c, op, count * esz))
        return l3d_stage_pipe_start(c, op, sendbuf, recvbuf, count, dt, rop, root, req_p);

    // Device buffers through host copies (comm_internal.h, "device buffers"); the one that
    // receives is written back when the last round is done.
    l3d_sched_t s;
    l3d_sched_init(&s, c);
    void *dev_recv = NULL;
    size_t sbytes, rbytes;
    coll_bytes(c, op, count, esz, root, &sbytes, &rbytes);
    if (op != L3D_COLL_BARRIER) {
        l3d_stage_call(&s, c, &sendbuf, sbytes, &recvbuf, rbytes, &dev_recv);
        if (s.st < 0) {
            l3d_status st = s.st;
            l3d_sched_fini(&s);
            return l3d_error(c->ctx, st, "%s: staging a device buffer through host memory "
                             "failed", what);
        }
    }

    uint32_t seq = c->seq++;
    l3d_coll_args_t a = {.comm = c, .n = n, .me = me, .sendbuf = sendbuf, .recvbuf = recvbuf,
                         .count = count, .dt = dt, .wdt = l3d_reduce_wire_type(dt), .op = rop,
                         .wop = rop == L3D_AVG ? L3D_SUM : rop, .esz = esz, .root = root};
    if (!reduces(op)) {
        a.wdt = dt;
        a.op = a.wop = L3D_SUM;
    }
    a.wsz = l3d_dtype_size(a.wdt);
    size_t bytes = count * esz;
    if (op == L3D_COLL_REDUCE_SCATTER || op == L3D_COLL_ALLGATHER || op == L3D_COLL_ALLTOALL)
        bytes *= (size_t)n;
    a.seg = l3d_coll_segment(c, bytes);

    if (n == 1) {
        // One rank: every collective is a copy of the input (AVG over one rank is identity).
        l3d_sched_round(&s);
        if (op != L3D_COLL_BARRIER) l3d_sched_copy(&s, -1, recvbuf, sendbuf, count * esz);
    } else {
        // A small call on a communicator with a shared segment (members on one machine,
        // threads or processes) goes through it (comm_shm.c), chosen as a native entry would
        // be: unless L3D_ALGO names another algorithm.
        l3d_tp_coll_fn nf = native_fn(c, op);
        int shm = l3d_comm_shm_fits(c, op, count, dt);
        l3d_algo al = l3d_coll_select(c, op, bytes, dt, nf != NULL || shm);
        l3d_status st = L3D_OK;
        if (al == L3D_ALGO_NATIVE) {
            l3d_tp_coll_args_t na = {.ranks = c->ranks, .n = n, .me = me,
                                     .seq = ((uint64_t)c->id << 32) | seq, .sendbuf = sendbuf,
                                     .recvbuf = recvbuf, .count = count, .dt = dt, .op = rop,
                                     .root = root};
            if (shm) {
                l3d_sched_shm(&s, c, op, &na);
            } else {
                l3d_sched_round(&s);
                l3d_sched_native(&s, nf, &na);
            }
        } else {
            st = builder(op, al)(&s, &a);
        }
        if (st < 0) {
            l3d_sched_fini(&s);
            return l3d_error(c->ctx, st, "%s: building the %s schedule failed", what,
                             l3d_algo_name(al));
        }
    }
    if (dev_recv) {
        l3d_sched_round(&s);
        l3d_sched_h2d(&s, c, -1, dev_recv, recvbuf, rbytes);
    }
    uint64_t tag = l3d_tag_make(&c->world->tags, L3D_TAG_COLL, c->id, seq, 0);
    return l3d_request_start(c, &s, what, tag, req_p);
}

static l3d_status coll_blocking(l3d_comm_t *c, l3d_coll op, const void *sendbuf, void *recvbuf,
                                size_t count, l3d_dtype dt, l3d_redop rop, int root) {
    l3d_request_t *r = NULL;
    L3D_CHECK(c ? c->ctx : NULL, l3d_coll_start(c, op, sendbuf, recvbuf, count, dt, rop, root,
                                                &r));
    return l3d_request_wait(r);
}

// ---- blocking -----------------------------------------------------------------------------------
l3d_status l3d_comm_allreduce(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                              l3d_dtype dt, l3d_redop op) {
    return coll_blocking(c, L3D_COLL_ALLREDUCE, sendbuf, recvbuf, count, dt, op, 0);
}
l3d_status l3d_comm_reduce_scatter(l3d_comm_t *c, const void *sendbuf, void *recvbuf,
                                   size_t recvcount, l3d_dtype dt, l3d_redop op) {
    return coll_blocking(c, L3D_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dt, op, 0);
}
l3d_status l3d_comm_allgather(l3d_comm_t *c, const void *sendbuf, void *recvbuf,
                              size_t sendcount, l3d_dtype dt) {
    return coll_blocking(c, L3D_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, dt, L3D_SUM, 0);
}
l3d_status l3d_comm_broadcast(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                              l3d_dtype dt, int root) {
    return coll_blocking(c, L3D_COLL_BROADCAST, sendbuf, recvbuf, count, dt, L3D_SUM, root);
}
l3d_status l3d_comm_reduce(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                           l3d_dtype dt, l3d_redop op, int root) {
    return coll_blocking(c, L3D_COLL_REDUCE, sendbuf, recvbuf, count, dt, op, root);
}
l3d_status l3d_comm_alltoall(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                             l3d_dtype dt) {
    return coll_blocking(c, L3D_COLL_ALLTOALL, sendbuf, recvbuf, count, dt, L3D_SUM, 0);
}
l3d_status l3d_comm_barrier(l3d_comm_t *c) {
    return coll_blocking(c, L3D_COLL_BARRIER, NULL, NULL, 0, L3D_UINT8, L3D_SUM, 0);
}

// ---- non-blocking -------------------------------------------------------------------------------
l3d_status l3d_comm_iallreduce(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                               l3d_dtype dt, l3d_redop op, l3d_request_t **req_p) {
    return l3d_coll_start(c, L3D_COLL_ALLREDUCE, sendbuf, recvbuf, count, dt, op, 0, req_p);
}
l3d_status l3d_comm_ireduce_scatter(l3d_comm_t *c, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, l3d_dtype dt, l3d_redop op,
                                    l3d_request_t **req_p) {
    return l3d_coll_start(c, L3D_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dt, op, 0, req_p);
}
l3d_status l3d_comm_iallgather(l3d_comm_t *c, const void *sendbuf, void *recvbuf,
                               size_t sendcount, l3d_dtype dt, l3d_request_t **req_p) {
    return l3d_coll_start(c, L3D_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, dt, L3D_SUM, 0, req_p);
}
l3d_status l3d_comm_ibroadcast(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                               l3d_dtype dt, int root, l3d_request_t **req_p) {
    return l3d_coll_start(c, L3D_COLL_BROADCAST, sendbuf, recvbuf, count, dt, L3D_SUM, root, req_p);
}
l3d_status l3d_comm_ireduce(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                            l3d_dtype dt, l3d_redop op, int root, l3d_request_t **req_p) {
    return l3d_coll_start(c, L3D_COLL_REDUCE, sendbuf, recvbuf, count, dt, op, root, req_p);
}
l3d_status l3d_comm_ialltoall(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                              l3d_dtype dt, l3d_request_t **req_p) {
    return l3d_coll_start(c, L3D_COLL_ALLTOALL, sendbuf, recvbuf, count, dt, L3D_SUM, 0, req_p);
}
