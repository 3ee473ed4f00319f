// The NCCL transport's private state: the library's entries, the communicators, the requests.
// defines: l3d_nccl_t, l3d_nccl_lib_t, l3d_nccl_group_t, struct l3d_tp_request,
//          l3d_nccl_blob_t and the helpers the transport's files share
//
// Shape (docs/comm.md, "nccl"). NCCL moves device memory; host memory (the communicator's
// failure notices, the core's algorithms for the calls NCCL has no entry for, a rank's calls
// before it has a device) goes over an inner host transport, ucx or ofi, created beside it.
// One NCCL communicator per llama3d communicator: the world's made at connect from the
// unique id rank 0 ships in its address blob, each split's by ncclCommSplit of its parent's.
// Point-to-point runs on two more splits of the world, one per direction (to a higher world
// rank, to a lower one), each on a stream of its own: NCCL serialises a communicator's work,
// and a send waits for its receive, so one communicator (or one stream) for both directions
// deadlocks as soon as two neighbours send to each other at once (1F1B). Messages between two
// ranks in one direction match in posting order; the tag is not carried (the core's device
// messages are the pipeline's, posted in the same order on both sides).
//
// Communicators are non-blocking (ncclConfig_t.blocking = 0): creation is polled under the
// communicator timeout, and a launch NCCL reports in progress is settled (polled) before the
// completion event is recorded. A peer that dies shows as an asynchronous error of the
// communicator, or as the core's notice over the host transport; either way the NCCL
// communicators are aborted (ncclCommAbort), so no kernel waits on a dead rank.
#ifndef L3D_NCCL_INTERNAL_H
#define L3D_NCCL_INTERNAL_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#include "core/l3d_core.h"
#include "transports/transport.h"

#define L3D_NCCL_MEM_TAG "comm"

// The entries of libnccl this transport calls, as the library gives them.
#define L3D_NCCL_FNS(X)          \
    X(ncclGetVersion)            \
    X(ncclGetUniqueId)           \
    X(ncclGetErrorString)        \
    X(ncclGetLastError)          \
    X(ncclCommInitRankConfig)    \
    X(ncclCommSplit)             \
    X(ncclCommGetAsyncError)     \
    X(ncclCommUserRank)          \
    X(ncclCommCount)             \
    X(ncclCommAbort)             \
    X(ncclCommDestroy)           \
    X(ncclAllReduce)             \
    X(ncclReduceScatter)         \
    X(ncclAllGather)             \
    X(ncclBroadcast)             \
    X(ncclReduce)                \
    X(ncclSend)                  \
    X(ncclRecv)                  \
    X(ncclGroupStart)            \
    X(ncclGroupEnd)

typedef struct l3d_nccl_lib {
    void *so;
    int version;  // ncclGetVersion: 22809 for 2.28.9
#define L3D_NCCL_FIELD(f) __typeof__(&f) f;
    L3D_NCCL_FNS(L3D_NCCL_FIELD)
#undef L3D_NCCL_FIELD
} l3d_nccl_lib_t;

// Opens libnccl (its soname, then the toolkit's library directory) and resolves the entries.
// L3D_ERR_UNSUPPORTED naming what is missing; nothing left open on failure.
l3d_status l3d_nccl_lib_open(l3d_ctx_t *ctx, l3d_nccl_lib_t *lib);
void l3d_nccl_lib_close(l3d_nccl_lib_t *lib);

// The address blob: the inner host transport's address and, from rank 0, the unique id.
#define L3D_NCCL_BLOB_MAGIC 0x4e44334cu  // "L3DN"
#define L3D_NCCL_BLOB_VERSION 1u
typedef struct l3d_nccl_blob {
    uint32_t magic, version;
    uint32_t has_id;     // 1 on rank 0
    uint32_t inner_len;  // bytes of the inner transport's address after this header
    unsigned char id[NCCL_UNIQUE_ID_BYTES];
} l3d_nccl_blob_t;

// Reads rank `from`'s blob (len bytes): the inner address at *inner (its length *inner_len)
// and, when the blob has one, the unique id into id (else *has_id = 0). A blob that is not
// this transport's, or is cut short, is L3D_ERR_PEER_FAILED naming the rank (a rank started
// with another transport, or a corrupted rendezvous).
l3d_status l3d_nccl_blob_read(l3d_ctx_t *ctx, int from, const void *blob, size_t len,
                              const void **inner, size_t *inner_len, int *has_id,
                              unsigned char id[NCCL_UNIQUE_ID_BYTES]);

// A communicator of this transport: NCCL's for llama3d communicator `id`.
typedef struct l3d_nccl_group {
    uint32_t id;
    ncclComm_t comm;
    int dead;  // aborted (a cancelled call, a failed peer): its calls fail
} l3d_nccl_group_t;

typedef struct l3d_nccl {
    l3d_ctx_t *ctx;
    l3d_nccl_lib_t lib;
    l3d_transport_t host;  // the inner transport for host memory
    int host_up;           // host.priv made
    int rank, nranks, local_rank, gpu;
    double timeout_s;
    unsigned char id[NCCL_UNIQUE_ID_BYTES];  // rank 0's
    ncclComm_t up, down;   // point-to-point to higher / lower world ranks
    cudaStream_t s_up, s_down, s_coll;
    cudaStream_t user;     // set_stream's
    cudaEvent_t ordered;   // recorded on `user`, waited for by the stream of the next work
    cudaEvent_t *events;   // idle completion events
    int nevents, cap_events;
    void *scratch;         // device scratch of the collective stream (nccl_ops.c)
    size_t scratch_bytes;
    l3d_nccl_group_t *groups;  // [0]: the world (id 0)
    int ngroups, cap_groups;
    int aborted;
    char err[256];         // the library's words for the last failure
} l3d_nccl_t;

struct l3d_tp_request {
    l3d_tp_request_t *host;  // a host-memory request of the inner transport, or NULL
    cudaEvent_t done;        // recorded after the NCCL work
    ncclComm_t comm;         // the communicator it runs on
    uint32_t gid;            // a collective's communicator id
    int peer;                // world rank (-1: a collective)
    int captured;            // issued while the user's stream was capturing a CUDA graph
    size_t len;
    const char *what;
};

static inline l3d_nccl_t *l3d_nccl_priv(const l3d_transport_t *tp) {
    return (l3d_nccl_t *)tp->priv;
}

// Records an NCCL failure: its words (and ncclGetLastError's) in n->err and on the context.
// A remote or system error (a peer's process gone, its link down) is L3D_ERR_PEER_FAILED.
l3d_status l3d_nccl_fail(l3d_nccl_t *n, ncclResult_t r, ncclComm_t comm, const char *what);
l3d_status l3d_nccl_cuda_fail(l3d_nccl_t *n, cudaError_t e, const char *what);
// Waits (bounded by the communicator timeout) until comm's pending launch or creation is no
// longer in progress; aborts it on timeout.
l3d_status l3d_nccl_settle(l3d_nccl_t *n, ncclComm_t comm, const char *what);
// The group of llama3d communicator id (NULL: none).
l3d_nccl_group_t *l3d_nccl_group(l3d_nccl_t *n, uint32_t id);
// Aborts every NCCL communicator (a failed peer, the rank giving up).
void l3d_nccl_abort_all(l3d_nccl_t *n);
// Nonzero when p is device (or managed) memory: NCCL's; host memory is the inner transport's.
int l3d_nccl_is_device(const void *p);

// The entries of nccl_ops.c.
l3d_status l3d_nccl_isend(l3d_transport_t *tp, int peer, uint64_t tag, const void *buf,
                          size_t len, void *mr, l3d_tp_request_t **req_p);
l3d_status l3d_nccl_irecv(l3d_transport_t *tp, int peer, uint64_t tag, void *buf, size_t len,
                          void *mr, l3d_tp_request_t **req_p);
l3d_status l3d_nccl_test(l3d_transport_t *tp, l3d_tp_request_t *req, int *done_p,
                         size_t *len_p);
void l3d_nccl_cancel(l3d_transport_t *tp, l3d_tp_request_t *req);
int l3d_nccl_waiting_on(const l3d_transport_t *tp, const l3d_tp_request_t *req, char *buf,
                        size_t len);
void l3d_nccl_events_free(l3d_nccl_t *n);
extern const l3d_transport_coll_ops_t l3d_nccl_coll_ops;

#endif
