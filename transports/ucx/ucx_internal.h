// Private to the UCX transport (transports/ucx/*.c): the endpoint, peer and request objects.
// defines: l3d_ucx_t, l3d_ucx_peer_t, struct l3d_tp_request, L3D_UCS_CHECK, l3d_ucx_* helpers
//
// Tag layout. UCP matches on the tag alone, never on the sender, so the sender's world rank is
// carried in the top bits of every UCP tag and receives use a full mask:
//   bit 63      control (an abort notice; user traffic never sets it)
//   bits 44..62 sender world rank (19 bits: up to 524288 ranks)
//   bits  0..43 the caller's tag (caps.tag_bits = 44)
#ifndef L3D_UCX_INTERNAL_H
#define L3D_UCX_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "core/l3d_core.h"
#include "transports/transport.h"

#define L3D_UCX_TAG_BITS 44
#define L3D_UCX_USER_MASK ((UINT64_C(1) << L3D_UCX_TAG_BITS) - 1)
#define L3D_UCX_RANK_BITS 19
#define L3D_UCX_MAX_RANKS (1 << L3D_UCX_RANK_BITS)
#define L3D_UCX_CTRL_BIT (UINT64_C(1) << 63)
// Payloads of the control notices: a peer aborted, or a peer closed its endpoint in fini (so
// a rank still waiting on it fails fast; over shared memory nothing else would tell it).
#define L3D_UCX_CTRL_ABORT UINT64_C(0x61626f7274)  // "abort"
#define L3D_UCX_CTRL_BYE UINT64_C(0x627965)        // "bye"
// Requests UCX may own per peer before isend/irecv answer L3D_INPROGRESS. Above what caps
// advertises (max_inflight 64) so a core that respects caps never sees it.
#define L3D_UCX_PEER_MAX_PENDING 256
#define L3D_UCX_MEM_TAG "comm"

static inline uint64_t l3d_ucx_tag(int sender, uint64_t tag) {
    return ((uint64_t)sender << L3D_UCX_TAG_BITS) | (tag & L3D_UCX_USER_MASK);
}
static inline int l3d_ucx_tag_sender(uint64_t ucp_tag) {
    return (int)((ucp_tag >> L3D_UCX_TAG_BITS) & (L3D_UCX_MAX_RANKS - 1));
}

typedef struct l3d_ucx l3d_ucx_t;

// Our address blob is this header followed by the UCP worker address. It says which process
// owns the endpoint, so peers on the same host can tell when it is gone: UCX 1.13's shared-
// memory transports (posix, sysv, cma, self) have no peer-failure support, and endpoints that
// use them must be created in UCP_ERR_HANDLING_MODE_NONE, where nothing reports a dead peer.
#define L3D_UCX_ADDR_MAGIC UINT32_C(0x4c334458)  // "L3DX"
typedef struct l3d_ucx_addr_hdr {
    uint32_t magic;
    uint32_t pid;
    uint64_t start_time;  // /proc/<pid>/stat field 22: tells a reused pid apart
    uint64_t pidns;       // inode of /proc/self/ns/pid: pids compare only within one namespace
    char boot_id[40];     // /proc/sys/kernel/random/boot_id: the same kernel, i.e. host
} l3d_ucx_addr_hdr_t;

typedef struct l3d_ucx_peer {
    l3d_ucx_t *u;       // back pointer for the error handler
    int rank;
    ucp_ep_h ep;        // NULL before connect and after close
    void *close_req;    // an unfinished ucp_ep_close_nbx
    int failed;         // error handler fired, the peer aborted, or a send to it was cancelled
    int npending;       // requests with this peer that UCX still owns
    int stuck;          // a cancel with it waited its second in vain: later ones do not wait
    int watch;          // same host, error mode NONE: liveness is checked by pid (see ucx_addr.c)
    int sent;           // a send was posted since the last flush (fini flushes only these)
    int err_mode_peer;  // the endpoint was created with UCP_ERR_HANDLING_MODE_PEER
    uint32_t pid;       // the peer's process (from its address header)
    uint64_t start_time;
    char why[96];       // why it failed (UCS text), for "ucx: rank N failed: <why>"
} l3d_ucx_peer_t;

// The core's opaque request. Owned by the transport from isend/irecv until test reports it.
struct l3d_tp_request {
    struct l3d_tp_request *prev, *next;  // u->pending (a ring with a sentinel), or free list
    l3d_ucx_t *u;
    void *ucx;             // the UCX request while UCX owns it; NULL once its callback ran
    uint64_t tag;          // the caller's tag, for error details
    size_t len;            // posted length; received length once a receive is done
    int peer;
    int is_send;
    int done;              // UCX is finished with it (status is final)
    int cancelling;        // ucp_request_cancel was called (peer failed or cancel)
    int abandoned;         // reported finished (failed) although UCX still holds it: UCX 1.13
                           // never completes some requests of a dead NONE-mode peer
    int orphan;            // the core let go of it while UCX holds it: the callback frees it
    ucs_status_t status;
};

struct l3d_ucx {
    l3d_ctx_t *ctx;
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int rank, nranks;
    double timeout_s;
    int connected;
    int aborted;
    int need_sweep;             // a peer failed since the last sweep
    int nclosing;               // peers with an unfinished close_req
    int ctrl_off;               // fini started (peers leaving is normal: logged at debug)
    int ctrl_stop;              // the control receive is not posted again (just before the
                                // worker goes: until then a peer's BYE must find it, or UCX
                                // warns "unexpected tag-receive descriptor ... not matched")
    int nwatch;                 // peers whose liveness is checked by pid
    double next_watch;          // when to check them next
    l3d_ucx_addr_hdr_t hdr;     // ours
    uint64_t ctrl_msg[2];       // payloads of the notices we send (must outlive the sends)
    l3d_ucx_peer_t *peers;      // nranks entries, indexed by world rank
    l3d_tp_request_t pending;   // sentinel of the ring of live requests
    l3d_tp_request_t *free_reqs;
    // The always-posted receive for control notices from any rank.
    void *ctrl_req;
    uint64_t ctrl_buf;
    int ctrl_done;
    ucs_status_t ctrl_status;
    uint64_t ctrl_sender_tag;
    // Cost-model hints (caps), from UCX_TLS or the lanes of an endpoint after connect.
    double latency_us, bandwidth_gbs;
    char last_ucs[128];         // strerror: the last UCS status text
};

// Records the UCS text of `s` and converts it: `what` names the operation, `peer` the rank
// involved (-1: none). Connection-type errors, or any error with a failed peer, become
// L3D_ERR_PEER_FAILED "ucx: rank N failed: <text>" and mark the peer failed.
l3d_status l3d_ucx_error(l3d_ucx_t *u, int peer, ucs_status_t s, const char *what);
int l3d_ucx_is_peer_error(ucs_status_t s);
// Marks a peer failed (first reason wins), logs it at `lvl` (debug during fini) and schedules
// the sweep of its requests.
void l3d_ucx_peer_fail(l3d_ucx_t *u, int peer, const char *why, l3d_log_level lvl);
// Starts a forced close of the peer's endpoint (idempotent); completion is collected later.
void l3d_ucx_peer_close(l3d_ucx_t *u, int peer, int force);
// Progresses the worker once, then handles control notices and failed peers.
void l3d_ucx_progress_all(l3d_ucx_t *u);
// Posts the control receive (again). Safe to call when one is already posted.
void l3d_ucx_ctrl_post(l3d_ucx_t *u);
// Frees everything request-related; called by fini after the worker is gone.
void l3d_ucx_reqs_free_all(l3d_ucx_t *u);
// Whether any live request is still owned by UCX.
int l3d_ucx_reqs_busy(const l3d_ucx_t *u);
// Cancels every user receive UCX still owns (fini and abort); not the control receive.
void l3d_ucx_reqs_cancel_recvs(l3d_ucx_t *u);
// Cancels the control receive for good (fini, right before the worker is destroyed).
void l3d_ucx_ctrl_cancel(l3d_ucx_t *u);

l3d_status l3d_ucx_isend(l3d_transport_t *tp, int peer, uint64_t tag, const void *buf,
                         size_t len, void *mr, l3d_tp_request_t **req_p);
l3d_status l3d_ucx_irecv(l3d_transport_t *tp, int peer, uint64_t tag, void *buf, size_t len,
                         void *mr, l3d_tp_request_t **req_p);
l3d_status l3d_ucx_test(l3d_transport_t *tp, l3d_tp_request_t *req, int *done_p,
                        size_t *len_p);
l3d_status l3d_ucx_progress(l3d_transport_t *tp);
void l3d_ucx_cancel(l3d_transport_t *tp, l3d_tp_request_t *req);

double l3d_ucx_now(void);

// ucx_addr.c: fills our address header (pid, start time, namespace, boot id).
void l3d_ucx_hdr_fill(l3d_ucx_addr_hdr_t *h);
// Whether the peer described by `h` shares our host and pid namespace.
int l3d_ucx_hdr_same_host(const l3d_ucx_addr_hdr_t *mine, const l3d_ucx_addr_hdr_t *h);
// Whether UCX_TLS lets UCX pick a shared-memory transport.
int l3d_ucx_tls_may_use_shm(const char *tls);
// Whether UCX_TLS (NULL: unset) lets UCX use the transport `name` (e.g. "cma").
int l3d_ucx_tls_allows(const char *tls, const char *name);
// Checks watched peers (at most every 0.5 s) and fails those whose process is gone.
void l3d_ucx_watch(l3d_ucx_t *u);

// Converts a UCS status at the boundary: on failure records ucs_status_string() in the detail
// (via l3d_ucx_error) and returns the l3d_status from the enclosing function.
#define L3D_UCS_CHECK(u, call, what)                                         \
    do {                                                                     \
        ucs_status_t l3d_ucs_ = (call);                                      \
        if (l3d_ucs_ != UCS_OK) return l3d_ucx_error((u), -1, l3d_ucs_, (what)); \
    } while (0)
#define L3D_UCS_CHECK_GOTO(u, call, what, st, label)                         \
    do {                                                                     \
        ucs_status_t l3d_ucs_ = (call);                                      \
        if (l3d_ucs_ != UCS_OK) {                                            \
            (st) = l3d_ucx_error((u), -1, l3d_ucs_, (what));                 \
            goto label;                                                      \
        }                                                                    \
    } while (0)

#endif
