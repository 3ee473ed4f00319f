// The transport vtable: tagged, non-blocking point-to-point between the ranks of one world,
// plus an optional table of native collectives. Shaped like NCCL's ncclNet_v8_t.
// defines: l3d_transport_t, l3d_transport_ops_t, l3d_transport_caps_t, l3d_tp_* wrappers,
//          l3d_transport_coll_ops_t, l3d_transport_backends
//
// The collective algorithms live once in core/ (core/coll_*.c) on top of these entries;
// every point-to-point transport gets all of them for free. A backend whose hardware or
// library does collectives better (NCCL; the in-process transport reading peers' memory)
// fills the optional coll table, and core uses an entry when it is non-NULL.
//
// Threading: one transport object is driven by one thread at a time (its rank's thread).
// Nothing here may require a progress thread the caller did not ask for; a backend that needs
// one (none so far) owns it.
#ifndef L3D_TRANSPORT_H
#define L3D_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/comm.h"
#include "llama3d/ctx.h"
#include "llama3d/status.h"

// 2: native collectives became non-blocking (a request completed through test/cancel).
// 3: device buffers (set_stream, caps.coll_ptr_support, caps.half_sums_per_hop), groups
//    (group_split, group_free), params.local_rank: what NCCL needs.
// 4: set_stream names the stream's device (the local transport's device buffers reach the
//    memory through it).
#define L3D_TRANSPORT_ABI_VERSION 4

#define L3D_PTR_HOST 0x1u
#define L3D_PTR_DEVICE 0x2u

typedef struct l3d_transport_caps {
    // L3D_PTR_* bits the buffers of isend/irecv may be. With L3D_PTR_DEVICE the communicator
    // hands a device buffer (of its l3d_comm_set_device device) over as it is, after
    // set_stream; without it, through a host copy.
    uint32_t ptr_support;
    // The L3D_PTR_* bits the native collectives take (0: as ptr_support). A collective on
    // other memory runs the core's algorithm over isend/irecv.
    uint32_t coll_ptr_support;
    // Nonzero: a native sum of 16-bit values rounds at every hop (NCCL's bfloat16 and half),
    // not once as the collective contract below says; the communicator's callers reduce in
    // float32 where it matters (docs/comm.md).
    int half_sums_per_hop;
    int needs_mr;          // nonzero: buffers must be registered (mr_reg) before isend/irecv
    size_t max_msg;        // largest single message in bytes (core segments above this)
    int max_inflight;      // requests that may be outstanding per peer before core waits
    int tag_bits;          // usable low bits of the 64-bit tag
    double latency_us;     // alpha of the cost model (per message)
    double bandwidth_gbs;  // 1/beta of the cost model (GB/s per link)
} l3d_transport_caps_t;

typedef struct l3d_transport_ops l3d_transport_ops_t;
typedef struct l3d_transport_coll_ops l3d_transport_coll_ops_t;
struct l3d_device;  // devices/device.h

// Object shape { ops, parent, priv }. `world_rank`/`world_size` are this endpoint's place in
// the world it was created for.
typedef struct l3d_transport {
    const l3d_transport_ops_t *ops;
    l3d_ctx_t *ctx;
    void *priv;
    int world_rank, world_size;
} l3d_transport_t;

typedef struct l3d_transport_params {
    int rank, nranks;
    int local_rank;    // this rank's place on its node (the launcher's LOCAL_RANK): its GPU
    double timeout_s;  // for blocking entries (connect)
    // In-process worlds only: the object shared by all ranks of the world, created by the
    // first rank's init when *local_shared is NULL (the local transport); else NULL.
    void **local_shared;
} l3d_transport_params_t;

// An opaque in-flight operation owned by the transport until `test` reports it done.
typedef struct l3d_tp_request l3d_tp_request_t;

// A communicator as a transport sees it: its members as world ranks in communicator order.
typedef struct l3d_tp_group {
    const int *ranks;
    int n, me;
    uint32_t id;  // 0: the world
} l3d_tp_group_t;

struct l3d_transport_ops {
    uint32_t abi_version;  // L3D_TRANSPORT_ABI_VERSION
    uint32_t size;         // sizeof(l3d_transport_ops_t) the backend was built with
    const char *name;      // "local", "ucx", "ofi", "nccl"

    // ---- lifetime ---------------------------------------------------------------------------
    // Creates this rank's endpoint (tp->priv). Blocking, local only (no peers contacted).
    // Failure records the cause with l3d_error on tp->ctx and leaves nothing allocated.
    l3d_status (*init)(l3d_transport_t *tp, const l3d_transport_params_t *p);
    // Releases the endpoint. Pending requests are cancelled. Never blocks on peers.
    void (*fini)(l3d_transport_t *tp);
    // Fills the capabilities. Non-blocking, never fails.
    void (*caps)(const l3d_transport_t *tp, l3d_transport_caps_t *caps);

    // ---- wiring -----------------------------------------------------------------------------
    // Writes this endpoint's address blob (at most *len_p bytes; *len_p = actual length).
    // L3D_ERR_INVALID_ARG with *len_p = needed length when the buffer is too small.
    l3d_status (*addr_get)(l3d_transport_t *tp, void *buf, size_t *len_p);
    // Connects to every peer given all ranks' address blobs (addrs[i], lens[i] for rank i;
    // this rank's own entry included). Blocking, bounded by params.timeout_s (a backend whose
    // wiring is lazy, like libfabric RDM, may return at once). After success isend/irecv to
    // any rank work.
    l3d_status (*connect)(l3d_transport_t *tp, const void *const *addrs, const size_t *lens);

    // ---- memory registration (optional: NULL when caps.needs_mr is 0) ------------------------
    // Registers [buf, buf+len) and returns a handle for isend/irecv. The core keeps a cache
    // keyed by (buf, len), so this is not on the per-message path.
    l3d_status (*mr_reg)(l3d_transport_t *tp, void *buf, size_t len, void **mr_p);
    void (*mr_dereg)(l3d_transport_t *tp, void *mr);

    // ---- point-to-point ---------------------------------------------------------------------
    // Posts a send of len bytes to `peer` with `tag` (only the low caps.tag_bits bits are
    // used). Non-blocking: returns L3D_OK with *req_p set, L3D_INPROGRESS when the transport is
    // momentarily out of resources (call progress and retry; *req_p untouched), or an error.
    // The buffer must stay valid until the request is reported done. mr is NULL unless
    // caps.needs_mr. Messages with the same (source, tag) match in posting order.
    l3d_status (*isend)(l3d_transport_t *tp, int peer, uint64_t tag, const void *buf, size_t len,
                        void *mr, l3d_tp_request_t **req_p);
    // Posts a receive of at most len bytes from `peer` with `tag`. As isend. A longer message
    // completes the request with L3D_ERR_INTERNAL (truncation is a core bug).
    l3d_status (*irecv)(l3d_transport_t *tp, int peer, uint64_t tag, void *buf, size_t len,
                        void *mr, l3d_tp_request_t **req_p);
    // Drives progress and reports whether `req` finished: *done_p = 1 and the request is freed
    // (then *len_p, if not NULL, is the received/sent size). A request that failed is also
    // freed and its error returned, with a detail naming the peer (a dead peer is
    // L3D_ERR_PEER_FAILED). Non-blocking.
    l3d_status (*test)(l3d_transport_t *tp, l3d_tp_request_t *req, int *done_p, size_t *len_p);
    // Drives progress once for all requests (used while waiting on several). Non-blocking.
    l3d_status (*progress)(l3d_transport_t *tp);
    // Cancels and frees a pending request. Non-blocking. For a receive, the buffer is free
    // after it. A send already handed to the network may not be cancellable (UCX 1.13,
    // libfabric shm/rxm): the backend then treats the link to that peer as failed, so the
    // peer never matches a half-sent message, and keeps the buffer referenced until fini.
    void (*cancel)(l3d_transport_t *tp, l3d_tp_request_t *req);
    // Tells every peer this rank is giving up (best effort, non-blocking): their requests that
    // involve this rank should fail with L3D_ERR_PEER_FAILED rather than wait for the timeout.
    void (*abort)(l3d_transport_t *tp);

    // ---- errors -----------------------------------------------------------------------------
    // The provider's own text for the last failure on this endpoint (e.g. the UCS or fi_strerror
    // string), or "" if none. Valid until the next call.
    const char *(*strerror)(const l3d_transport_t *tp);

    // Optional (NULL: the core names a request's peer itself). For a pending request, returns
    // the world rank it is waiting on (-1: none known) and writes a phrase for timeout
    // messages into buf ("rank 2 has not started it"). Non-blocking; the request stays pending.
    int (*waiting_on)(const l3d_transport_t *tp, const l3d_tp_request_t *req, char *buf,
                      size_t len);

    // ---- device buffers (optional: NULL unless caps.ptr_support has L3D_PTR_DEVICE) ---------
    // Orders the device-buffer work posted after this call (isend, irecv, native collectives)
    // after the work already queued on `stream`, a stream of `dev`, the communicator's device
    // (the handle l3d_dev_stream_create gave; NULL: the device's default stream). The
    // transport may run the work on streams of its own; completion is reported by `test` as
    // always. `dev` is borrowed until the next call (NCCL ignores it: CUDA names the device;
    // the local transport reaches device memory through its entries). Non-blocking, never
    // fails (an error surfaces at the next post).
    void (*set_stream)(l3d_transport_t *tp, struct l3d_device *dev, void *stream);

    // ---- groups (optional: NULL when the transport needs nothing per communicator) ---------
    // l3d_comm_split made communicator `child` from `parent` (world ranks in communicator
    // order, this rank at `me`, the communicator id that native calls' seq carries in its high
    // 32 bits). Called on every member of the parent once the members agreed, in the same
    // order everywhere; child is NULL on a member that joins none. Blocking, bounded by
    // params.timeout_s. Failure records the cause with l3d_error on tp->ctx.
    l3d_status (*group_split)(l3d_transport_t *tp, const l3d_tp_group_t *parent,
                              const l3d_tp_group_t *child);
    // Communicator `id` is destroyed (l3d_comm_destroy; not the world's, id 0, which fini
    // ends). Its calls are done or cancelled. Non-blocking, never fails.
    void (*group_free)(l3d_transport_t *tp, uint32_t id);

    // ---- native collectives (optional: NULL if the core's algorithms should be used) --------
    const l3d_transport_coll_ops_t *coll;
};

// Native collectives a backend may supply; each entry is optional (NULL: core algorithm).
//
// The arguments of one collective call on one rank. `ranks` are the communicator's members as
// world ranks in communicator order (n of them, this rank at index `me`); `seq` is the same on
// every member for the same call and distinct per call of that communicator (it carries the
// communicator id), so (seq, ranks[0]) names the call across the world. Buffers follow the
// public l3d_comm_* contract (comm.h): counts in elements of dt, in place when
// sendbuf == recvbuf (allgather: sendbuf == recvbuf + me * count * size).
typedef struct l3d_tp_coll_args {
    const int *ranks;
    int n, me;
    uint64_t seq;
    const void *sendbuf;
    void *recvbuf;
    size_t count;     // allreduce/broadcast/reduce: elements; reduce_scatter: recvcount;
                      // allgather: sendcount; alltoall: elements per rank; barrier: 0
    l3d_dtype dt;
    l3d_redop op;     // reducing entries only
    int root;         // broadcast and reduce only (communicator rank)
} l3d_tp_coll_args_t;

// Every entry has the same contract. Starts this rank's part of the collective and returns at
// once (non-blocking) with *req_p, which then behaves like a point-to-point request: `test`
// reports it done (this rank's recvbuf holds the result and its sendbuf may be reused) or
// failed (freed, error returned with a detail naming the peer), `cancel` abandons it (the
// peers' requests for the same call then fail with L3D_ERR_PEER_FAILED naming this rank).
// L3D_INPROGRESS means out of resources: progress and retry. The args struct is not kept;
// the buffers are, until the request is done. Members start the same calls in the same order.
// Sums of float32 must be deterministic: the same (n, count, dt) gives the same bits on every
// rank and every run; half types are reduced in float32 and rounded once.
typedef l3d_status (*l3d_tp_coll_fn)(l3d_transport_t *tp, const l3d_tp_coll_args_t *args,
                                     l3d_tp_request_t **req_p);

struct l3d_transport_coll_ops {
    l3d_tp_coll_fn allreduce;
    l3d_tp_coll_fn reduce_scatter;
    l3d_tp_coll_fn allgather;
    l3d_tp_coll_fn broadcast;
    // (ABI 3) reduce: recvbuf on the root only; alltoall: block i of sendbuf to rank i, block j
    // of recvbuf from rank j (in place when sendbuf == recvbuf); barrier: no buffers.
    l3d_tp_coll_fn reduce;
    l3d_tp_coll_fn alltoall;
    l3d_tp_coll_fn barrier;
};

// The built transports, NULL-terminated (generated l3d_backends.c).
extern const l3d_transport_ops_t *const l3d_transport_backends[];
// Looks a transport up by name; unknown or unbuilt: L3D_ERR_UNSUPPORTED listing the built ones.
l3d_status l3d_transport_find(l3d_ctx_t *ctx, const char *name, const l3d_transport_ops_t **ops_p);

// ---- wrappers: the only way core/ reaches a transport --------------------------------------
static inline void l3d_tp_caps(const l3d_transport_t *t, l3d_transport_caps_t *c) { t->ops->caps(t, c); }
static inline l3d_status l3d_tp_addr_get(l3d_transport_t *t, void *buf, size_t *len) {
    return t->ops->addr_get(t, buf, len);
}
static inline l3d_status l3d_tp_connect(l3d_transport_t *t, const void *const *addrs,
                                        const size_t *lens) {
    return t->ops->connect(t, addrs, lens);
}
static inline l3d_status l3d_tp_mr_reg(l3d_transport_t *t, void *buf, size_t len, void **mr) {
    if (!t->ops->mr_reg) {
        *mr = NULL;
        return L3D_OK;
    }
    return t->ops->mr_reg(t, buf, len, mr);
}
static inline void l3d_tp_mr_dereg(l3d_transport_t *t, void *mr) {
    if (t->ops->mr_dereg && mr) t->ops->mr_dereg(t, mr);
}
static inline l3d_status l3d_tp_isend(l3d_transport_t *t, int peer, uint64_t tag, const void *buf,
                                      size_t len, void *mr, l3d_tp_request_t **req) {
    return t->ops->isend(t, peer, tag, buf, len, mr, req);
}
static inline l3d_status l3d_tp_irecv(l3d_transport_t *t, int peer, uint64_t tag, void *buf,
                                      size_t len, void *mr, l3d_tp_request_t **req) {
    return t->ops->irecv(t, peer, tag, buf, len, mr, req);
}
static inline l3d_status l3d_tp_test(l3d_transport_t *t, l3d_tp_request_t *req, int *done,
                                     size_t *len) {
    return t->ops->test(t, req, done, len);
}
static inline l3d_status l3d_tp_progress(l3d_transport_t *t) { return t->ops->progress(t); }
static inline void l3d_tp_cancel(l3d_transport_t *t, l3d_tp_request_t *req) { t->ops->cancel(t, req); }
static inline void l3d_tp_abort(l3d_transport_t *t) { t->ops->abort(t); }
static inline const char *l3d_tp_strerror(const l3d_transport_t *t) { return t->ops->strerror(t); }
static inline void l3d_tp_set_stream(l3d_transport_t *t, struct l3d_device *dev, void *stream) {
    if (t->ops->set_stream) t->ops->set_stream(t, dev, stream);
}
// The native collective `op` if the backend has one (NULL otherwise).
#define L3D_TP_COLL(t, op) ((t)->ops->coll ? (t)->ops->coll->op : NULL)

#endif
