// Communicators and collectives: one transport-agnostic API over the in-process transport,
// UCX, libfabric (and NCCL later).
// defines: l3d_comm_t, l3d_request_t, l3d_dtype, l3d_redop, l3d_comm_*, l3d_request_*
//
// Semantics follow MPI and NCCL:
// - Collectives are called by every rank of the communicator in the same order with matching
//   arguments. Buffers are host pointers unless the transport says it takes device pointers.
// - In place: pass the same pointer as send and receive buffer. For reduce_scatter in place
//   means recvbuf == sendbuf + rank * recvcount, and for allgather sendbuf == recvbuf +
//   rank * sendcount, as in NCCL.
// - Counts are elements of `dtype`; 0 is allowed everywhere and is a no-op that still
//   synchronises nothing. Any rank count works, not only powers of two.
// - bfloat16 and float16 are reduced in float32 and rounded once per output element.
// - Results are deterministic: the same algorithm, count and rank count give bit-identical
//   output on every run and every rank (reductions happen in a fixed order).
// - Every wait is bounded by L3D_COMM_TIMEOUT (default 300 s). A dead or misbehaving peer
//   makes the call return L3D_ERR_PEER_FAILED or L3D_ERR_TIMEOUT with a detail naming the peer
//   rank (l3d_ctx_last_error). After an error the communicator can only be aborted/destroyed.
// - A communicator is used by one thread at a time.
#ifndef LLAMA3D_COMM_H
#define LLAMA3D_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/device.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum l3d_dtype {
    L3D_FLOAT32 = 0,
    L3D_BFLOAT16 = 1,
    L3D_FLOAT16 = 2,
    L3D_INT32 = 3,
    L3D_INT64 = 4,
    L3D_UINT8 = 5,
    L3D_DTYPE_COUNT
} l3d_dtype;

typedef enum l3d_redop {
    L3D_SUM = 0,
    L3D_AVG = 1,  // sum, then divided by the rank count (integers: truncating division)
    L3D_MAX = 2,
    L3D_MIN = 3,
    L3D_REDOP_COUNT
} l3d_redop;

size_t l3d_dtype_size(l3d_dtype dt);
const char *l3d_dtype_name(l3d_dtype dt);
const char *l3d_redop_name(l3d_redop op);

typedef struct l3d_comm l3d_comm_t;
typedef struct l3d_request l3d_request_t;

// ---- creation ----------------------------------------------------------------------------
// An in-process world of `nranks` ranks over the "local" transport: fills comms[0..nranks),
// one communicator per rank, each to be driven by its own thread (like ncclCommInitAll).
l3d_status l3d_comm_create_local(l3d_ctx_t *ctx, int nranks, l3d_comm_t **comms);

// One rank of a multi-process world. `transport` is "ucx", "ofi" or NULL (L3D_TRANSPORT or the
// first built network transport). Rank, size and the rendezvous address come from the launch
// environment (torchrun RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, mpirun OMPI_COMM_WORLD_*,
// srun SLURM_*, PMI_*; see docs/launch.md). Blocking until every rank has joined or the
// timeout passes. Asking for a transport that was not built is L3D_ERR_UNSUPPORTED naming
// the built ones.
l3d_status l3d_comm_create_env(l3d_ctx_t *ctx, const char *transport, l3d_comm_t **comm_p);

// Splits like MPI_Comm_split / ncclCommSplit: ranks with the same color form a communicator,
// ordered by (key, old rank). color < 0 gives *newcomm_p = NULL. Collective over `comm`.
l3d_status l3d_comm_split(l3d_comm_t *comm, int color, int key, l3d_comm_t **newcomm_p);

// The device whose memory this communicator's buffers may be (NULL, the default: host memory
// only). A buffer of a device whose memory the host cannot read (is_host 0: a GPU, or the
// test devices cpu-opaque and cpu-async) goes to the transport through a host copy: taken
// after the device's queued ops and waited for when the call starts, written back and waited
// for before the call completes. Host buffers in the same call go as they are. Splits inherit
// it. Not during a group (L3D_ERR_INVALID_ARG). The host copies are bounce buffers the device
// keeps for later calls (pinned where it pins); setting another device (or NULL) frees the
// old one's, so destroy a device after its communicators or set theirs to NULL first.
l3d_status l3d_comm_set_device(l3d_comm_t *comm, l3d_device_t *dev);

int l3d_comm_rank(const l3d_comm_t *comm);
int l3d_comm_size(const l3d_comm_t *comm);
const char *l3d_comm_transport_name(const l3d_comm_t *comm);
l3d_ctx_t *l3d_comm_ctx(const l3d_comm_t *comm);
// The first rank failure this rank's world has learned of, as "rank 3 failed: <its reason>",
// into buf (len bytes); returns 1, or 0 and "" when none is known. A caller whose call failed
// with L3D_ERR_PEER_FAILED can name the cause even where the error's own words were written
// on another context (the communicator's, l3d_comm_ctx).
int l3d_comm_failure(const l3d_comm_t *comm, char *buf, size_t len);

// Marks the communicator failed and tells the peers (their pending and future calls fail with
// L3D_ERR_PEER_FAILED naming this rank, where the transport can carry that). Non-blocking.
void l3d_comm_abort(l3d_comm_t *comm);
// Frees the communicator. Communicators made by split hold their own reference to the
// transport, so they may be destroyed in any order relative to their parent.
void l3d_comm_destroy(l3d_comm_t *comm);

// ---- blocking collectives ----------------------------------------------------------------
l3d_status l3d_comm_allreduce(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                              l3d_dtype dt, l3d_redop op);
// recvbuf gets `recvcount` elements: this rank's block of the reduction of
// sendbuf (size * recvcount elements).
l3d_status l3d_comm_reduce_scatter(l3d_comm_t *c, const void *sendbuf, void *recvbuf,
                                   size_t recvcount, l3d_dtype dt, l3d_redop op);
// recvbuf (size * sendcount) gets every rank's sendbuf in rank order.
l3d_status l3d_comm_allgather(l3d_comm_t *c, const void *sendbuf, void *recvbuf,
                              size_t sendcount, l3d_dtype dt);
// root's sendbuf to every rank's recvbuf (sendbuf ignored elsewhere; may equal recvbuf).
l3d_status l3d_comm_broadcast(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                              l3d_dtype dt, int root);
// The reduction lands in root's recvbuf (recvbuf ignored elsewhere).
l3d_status l3d_comm_reduce(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                           l3d_dtype dt, l3d_redop op, int root);
// Block j of sendbuf (count elements) goes to rank j, landing as block i of its recvbuf.
l3d_status l3d_comm_alltoall(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                             l3d_dtype dt);
l3d_status l3d_comm_barrier(l3d_comm_t *c);
// Point-to-point, matched in order per (sender, receiver) pair and communicator.
l3d_status l3d_comm_send(l3d_comm_t *c, const void *buf, size_t count, l3d_dtype dt, int peer);
l3d_status l3d_comm_recv(l3d_comm_t *c, void *buf, size_t count, l3d_dtype dt, int peer);

// ---- non-blocking forms --------------------------------------------------------------------
// Each returns a request that completes the operation; progress happens inside l3d_request_test
// and l3d_request_wait calls on this communicator (no hidden progress thread). Buffers must
// stay valid and untouched until completion. Requests of one communicator complete in any
// order; collectives must still be started in the same order on every rank.
l3d_status l3d_comm_iallreduce(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                               l3d_dtype dt, l3d_redop op, l3d_request_t **req_p);
l3d_status l3d_comm_ireduce_scatter(l3d_comm_t *c, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, l3d_dtype dt, l3d_redop op,
                                    l3d_request_t **req_p);
l3d_status l3d_comm_iallgather(l3d_comm_t *c, const void *sendbuf, void *recvbuf,
                               size_t sendcount, l3d_dtype dt, l3d_request_t **req_p);
l3d_status l3d_comm_ibroadcast(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                               l3d_dtype dt, int root, l3d_request_t **req_p);
l3d_status l3d_comm_ireduce(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                            l3d_dtype dt, l3d_redop op, int root, l3d_request_t **req_p);
l3d_status l3d_comm_ialltoall(l3d_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                              l3d_dtype dt, l3d_request_t **req_p);
l3d_status l3d_comm_isend(l3d_comm_t *c, const void *buf, size_t count, l3d_dtype dt, int peer,
                          l3d_request_t **req_p);
l3d_status l3d_comm_irecv(l3d_comm_t *c, void *buf, size_t count, l3d_dtype dt, int peer,
                          l3d_request_t **req_p);

// Non-blocking. Returns L3D_OK with *done_p = 0 while pending, L3D_OK with *done_p = 1 when
// complete (the request is then freed and must not be used again), or the operation's error
// if it failed (also freeing the request).
l3d_status l3d_request_test(l3d_request_t *req, int *done_p);
// Blocks until complete (bounded by L3D_COMM_TIMEOUT) and frees the request.
l3d_status l3d_request_wait(l3d_request_t *req);

// ---- accounting ---------------------------------------------------------------------------
// What this rank started on the communicator since creation or the last reset: calls (every
// collective, send and recv, count 0 included) and bytes, counted as nccl-tests' "size" so
// the figure does not depend on the algorithm or transport: allreduce, broadcast, reduce:
// count * elemsize; reduce_scatter, allgather, alltoall: the whole buffer (count * elemsize *
// ranks); send: the bytes sent; recv and barrier: 0. Formulas per training step built on
// these are in docs/parallel.md.
typedef struct l3d_comm_stats {
    uint64_t calls, bytes;
} l3d_comm_stats_t;
void l3d_comm_get_stats(const l3d_comm_t *comm, l3d_comm_stats_t *stats);
void l3d_comm_reset_stats(l3d_comm_t *comm);

// Batches point-to-point calls like ncclGroupStart/End: l3d_comm_send/recv between start and
// end are only posted, and end waits for all of them together, so a pipeline stage can send
// to its successor and receive from its predecessor without deadlock. Groups do not nest.
l3d_status l3d_comm_group_start(l3d_comm_t *c);
l3d_status l3d_comm_group_end(l3d_comm_t *c);

#ifdef __cplusplus
}
#endif
#endif
