// Internals shared by the two parts of the in-process transport: local.c (point-to-point
// matching) and local_coll.c (native collectives over peers' buffers). Small collectives do
// not reach it: the core sends them through the communicator's shared segment (comm_shm.c).
// defines: lreq_t (struct l3d_tp_request), local_hub_t, local_ep_t, lrdv_t,
//          l3d_local_coll_ops, l3d_local_coll_test/cancel/waiting_on/fini
#ifndef L3D_TRANSPORT_LOCAL_H
#define L3D_TRANSPORT_LOCAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/l3d_core.h"
#include "transports/transport.h"

enum { ST_QUEUED = 0, ST_COPYING = 1, ST_DONE = 2 };
enum { GONE_NO = 0, GONE_ABORTED = 1, GONE_LEFT = 2 };
enum { LREQ_P2P = 0, LREQ_COLL = 1 };
enum { LC_ALLREDUCE, LC_REDUCE_SCATTER, LC_ALLGATHER, LC_BROADCAST };

typedef struct lrdv lrdv_t;

// One request: a point-to-point envelope (kind LREQ_P2P) or this rank's part of a native
// collective (LREQ_COLL: rdv, me, phase).
struct l3d_tp_request {
    struct l3d_tp_request *next;
    int kind;
    int send, src, dst;  // world ranks
    uint64_t tag;
    void *buf;
    size_t len, got;
    atomic_int state;
    l3d_status st;
    int why_rank, why;  // failure: which rank, GONE_* (or -1: truncation)
    // LREQ_COLL
    lrdv_t *rdv;
    int me, phase;
    struct l3d_tp_request *cnext;  // the endpoint's pending collectives
    // Device buffers (local_device.c): the host copy the call ran on (freed with the
    // request) and, for a receive, the device memory it goes to when the request is done.
    void *scratch;
    size_t scratch_len;
    int scratch_slot;  // 1 + its index in the endpoint's hcache, 0: its own allocation
    struct l3d_device *dev;
    void *stream;
    void *dev_out;  // NULL: nothing to copy in when done
    const void *host_out;
    size_t out_len;  // a collective's receive range (a message's length is `got`)
};
typedef struct l3d_tp_request lreq_t;

typedef struct lqueue {
    pthread_mutex_t mu;
    lreq_t *sends, *recvs;  // FIFO singly linked lists (append at tail)
} lqueue_t;

typedef struct local_hub {
    l3d_ctx_t *ctx;
    int n;
    atomic_int refs;
    atomic_int *gone;  // [n] GONE_*
    lqueue_t *q;       // [n] by receiver
    pthread_mutex_t cmu;  // guards rdvs
    lrdv_t *rdvs;         // collective calls some member has started and not all released
    lrdv_t *free_rdvs;    // released records kept for the next calls (under cmu)
    int nfree_rdvs;
} local_hub_t;

// Scratch for native reductions: one block of partial sums in the working type and one of
// widened or rounded elements, small enough to stay in L1/L2 while the block is reused.
#define L3D_LOCAL_BLOCK 4096

typedef struct local_ep {
    local_hub_t *hub;
    int rank;
    // L3D_LOCAL_DEVICE_BUFFERS: device buffers are taken (caps) and reached through `dev`'s
    // entries on `stream` (set_stream's)
    int devmode;
    struct l3d_device *dev;
    void *stream;
    // host copies kept for the next calls: a fresh block costs a page fault per 4 KiB
    // (64 MiB allreduces took 5x the staged path's time with a new block each)
    struct {
        void *p;
        size_t n;
        int busy;
    } hcache[4];
    char err[160];
    lreq_t *colls;  // pending native collectives of this endpoint
    lreq_t *free_reqs;  // finished request objects kept for the next calls
    int nfree_reqs;
    _Alignas(16) unsigned char acc[L3D_LOCAL_BLOCK * 8];  // partials (up to int64)
    _Alignas(16) unsigned char aux[L3D_LOCAL_BLOCK * 8];  // widened inputs / rounded outputs
} local_ep_t;

// Request objects are recycled per endpoint: a small collective costs less than the malloc and
// free of its envelopes. get returns a zeroed object (NULL: out of memory); put takes it back
// (the owner's thread only, once nobody else can touch it).
lreq_t *l3d_local_req_get(local_ep_t *ep, l3d_ctx_t *ctx);
void l3d_local_req_put(local_ep_t *ep, l3d_ctx_t *ctx, lreq_t *r);

extern const l3d_transport_coll_ops_t l3d_local_coll_ops;
// test/cancel of an LREQ_COLL request (local.c's entries dispatch on kind).
l3d_status l3d_local_coll_test(l3d_transport_t *tp, lreq_t *r, int *done_p);
void l3d_local_coll_cancel(l3d_transport_t *tp, lreq_t *r);
int l3d_local_coll_waiting_on(const l3d_transport_t *tp, const lreq_t *r, char *buf,
                               size_t len);
// Cancels every pending collective of the endpoint (fini).
void l3d_local_coll_fini(l3d_transport_t *tp);
// Frees the records left by members that never started their call (hub teardown).
void l3d_local_coll_hub_free(local_hub_t *h);

// ---- device buffers (local_device.c) ----------------------------------------------------------
// In device mode (ep->devmode): nonzero when `p` is memory of the device set_stream named.
int l3d_local_is_dev(const local_ep_t *ep, const void *p);
// isend/irecv of a device buffer: through a host copy (`send`: filled from it now; a receive:
// copied into it when the request is done).
l3d_status l3d_local_dev_p2p(l3d_transport_t *tp, int send, int peer, uint64_t tag, void *buf,
                             size_t len, l3d_tp_request_t **req_p);
// A native collective on device buffers: the same call on host copies (send ranges copied in
// now, the receive range out when it is done). kind is LC_*.
l3d_status l3d_local_dev_coll(l3d_transport_t *tp, int kind, const l3d_tp_coll_args_t *a,
                              l3d_tp_request_t **req_p);
// Gives back host copy p of len bytes from scratch slot `slot` (kept in the endpoint's cache;
// slot 0: freed).
void l3d_local_scratch_put(local_ep_t *ep, l3d_ctx_t *ctx, void *p, size_t len, int slot);
// Frees the endpoint's cached host copies (fini, after every request is gone).
void l3d_local_scratch_fini(local_ep_t *ep, l3d_ctx_t *ctx);
// A finished request's `bytes` received copied into its device buffer r->dev_out, waited for.
l3d_status l3d_local_dev_finish(l3d_transport_t *tp, lreq_t *r, size_t bytes);
void l3d_local_set_stream(l3d_transport_t *tp, struct l3d_device *dev, void *stream);
// The native collective entry for kind on host buffers (local_coll.c).
l3d_status l3d_local_coll_start(l3d_transport_t *tp, int kind, const l3d_tp_coll_args_t *a,
                                l3d_tp_request_t **req_p);
// The point-to-point post on host buffers (local.c).
l3d_status l3d_local_post(l3d_transport_t *tp, int send, int peer, uint64_t tag, void *buf,
                          size_t len, l3d_tp_request_t **req_p);

// Records the failure in ep->err and the context's last error; returns st.
l3d_status l3d_local_fail(l3d_transport_t *tp, l3d_status st, const char *fmt, ...)
    L3D_PRINTF(3, 4);
// If a member of ranks[0..n) (world ranks) is gone, writes why ("rank 2 aborted during the
// what") to cause and returns 1.
int l3d_local_gone_cause(const local_ep_t *ep, const int *ranks, int n, const char *what,
                         char *cause, size_t len);

#endif
