// The libfabric (OFI) transport's private state, shared by ofi.c (lifetime, wiring, memory
// registration) and ofi_p2p.c (tagged point-to-point, completion queue, cancel, abort).
// defines: l3d_ofi_t, l3d_ofi_mr_t, struct l3d_tp_request, L3D_FI_CHECK, L3D_FI_CHECK_GOTO,
//          the tag layout (L3D_OFI_TAG_*), l3d_ofi_* internal helpers
//
// Tag layout (64-bit libfabric tag):
//   bits  0..39  the caller's tag (caps.tag_bits = 40)
//   bits 40..61  the sender's world rank (22 bits: worlds up to 4M ranks)
//   bit  62      control message (abort notice); never set by isend
//   bit  63      zero
// The sender writes its own rank, the receiver asks for the peer's, so matching is exact per
// (source, tag) even on providers without FI_DIRECTED_RECV. With FI_DIRECTED_RECV the source
// fi_addr is passed to fi_trecv as well.
#ifndef L3D_OFI_INTERNAL_H
#define L3D_OFI_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "core/l3d_core.h"
#include "platform/platform.h"
#include "transports/transport.h"

#define L3D_OFI_TAG_BITS 40
#define L3D_OFI_TAG_USER_MASK ((UINT64_C(1) << L3D_OFI_TAG_BITS) - 1)
#define L3D_OFI_TAG_RANK_SHIFT 40
#define L3D_OFI_TAG_RANK_BITS 22
#define L3D_OFI_TAG_RANK_MASK \
    (((UINT64_C(1) << L3D_OFI_TAG_RANK_BITS) - 1) << L3D_OFI_TAG_RANK_SHIFT)
#define L3D_OFI_TAG_CTRL (UINT64_C(1) << 62)
#define L3D_OFI_CTRL_ABORT UINT64_C(1)  // low bits of a control tag: what the notice says
#define L3D_OFI_CTRL_BYE UINT64_C(2)    // the sender is closing cleanly (see l3d_ofi_goodbye)

#define L3D_OFI_ALLOC_TAG "comm"
#define L3D_OFI_WHY_LEN 192

typedef enum l3d_ofi_req_kind {
    L3D_OFI_REQ_SEND,
    L3D_OFI_REQ_RECV,
    L3D_OFI_REQ_CTRL_RECV,  // the always-posted receive for peers' abort notices
    L3D_OFI_REQ_CTRL_SEND,  // an abort notice this rank sends
} l3d_ofi_req_kind;

// One posted operation. The fi_context2 comes first: with FI_CONTEXT/FI_CONTEXT2 the provider
// owns that space while the operation is posted, and the completion's op_context points here.
struct l3d_tp_request {
    struct fi_context2 fictx;
    struct l3d_tp_request *prev, *next;  // in l3d_ofi_t.live from allocation until freed
    l3d_ofi_req_kind kind;
    int peer;
    int done;       // the provider has released it; `st` and `len` are the result
    int orphan;     // the caller gave it up (cancel could not finish): free on completion
    l3d_status st;
    size_t len;          // posted length; on completion the sent/received size
    size_t olen;         // truncation: bytes that did not fit
    int fi_err;          // the completion's libfabric error (positive), 0 if none
    int detached;        // failed for a dead peer while the provider still holds the context
    int cancelled;       // we called fi_cancel on it (any other FI_ECANCELED is the provider's)
    uint64_t tag;        // the wire tag
};

typedef struct l3d_ofi_mr {
    struct fid_mr *mr;  // NULL once closed early (abort with FI_MR_ENDPOINT)
    struct l3d_ofi_mr *prev, *next;
    void *buf;
    size_t len;
} l3d_ofi_mr_t;

// Who a rank's process is, so a peer on this node can be checked for having exited (libfabric
// does not report it: shm never, tcp;ofi_rxm only logs the refused reconnect).
typedef struct l3d_ofi_ident {
    char boot_id[40];    // /proc/sys/kernel/random/boot_id ("" unknown)
    uint64_t pidns;      // inode of /proc/self/ns/pid
    uint64_t starttime;  // /proc/<pid>/stat field 22: tells a reused pid apart
    uint32_t pid;
} l3d_ofi_ident_t;
#define L3D_OFI_IDENT_LEN 64  // bytes in the address blob

typedef struct l3d_ofi_peer {
    l3d_ofi_ident_t id;
    int local;       // same kernel and pid namespace: the pid can be checked
    int want_check;  // a post to it was refused with EAGAIN since the last check
    int said_bye;    // its goodbye arrived: it takes no more messages and sends none
    int sent_bye;    // ours to it is posted
    int exited;      // seen exited by the last check, not yet failed: its last messages may
                     // still sit in the provider and are drained first (l3d_ofi_drain)
} l3d_ofi_peer_t;

typedef struct l3d_ofi {
    l3d_transport_t *tp;
    l3d_ctx_t *ctx;
    int rank, nranks;
    double timeout_s;

    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    int ep_closed;  // abort closed the endpoint: nothing more is posted or completed

    int directed;     // FI_DIRECTED_RECV granted
    int needs_mr;     // FI_MR_LOCAL granted
    int mr_endpoint;  // FI_MR_ENDPOINT granted: bind + enable each MR
    int mr_prov_key;  // FI_MR_PROV_KEY granted: the provider picks keys
    uint64_t next_key;
    size_t max_msg;
    size_t tx_size, rx_size;

    char prov[64];        // fabric_attr->prov_name, e.g. "shm" or "tcp;ofi_rxm"
    unsigned char name[128];  // this endpoint's fi_getname address
    size_t namelen;

    int connected;
    fi_addr_t *addrs;            // (nranks) AV entries
    unsigned char *peer_dead;    // (nranks) 1 once a peer failed or aborted
    char (*peer_why)[L3D_OFI_WHY_LEN];  // (nranks) why, for the error detail
    l3d_ofi_peer_t *peers;               // (nranks)
    l3d_ofi_ident_t self;
    double next_check;  // l3d_time_now() of the next liveness check

    int aborted;    // this rank called abort
    struct l3d_tp_request live;  // sentinel of every allocated request (posted or done)
    struct l3d_tp_request *free_list;
    int nfree;
    struct l3d_tp_request *ctrl_recv;
    uint64_t ctrl_buf;
    l3d_ofi_mr_t mrs;  // sentinel of the registrations

    char errtext[256];  // provider text of the last failure (strerror entry)
} l3d_ofi_t;

// Records a libfabric failure: fi_strerror(-ret) into o->errtext and an l3d_error detail
// "ofi: <what> failed: <text>" on the context; returns the mapped status.
l3d_status l3d_ofi_fail(l3d_ofi_t *o, ssize_t ret, const char *what, const char *file, int line);
// Maps a positive libfabric errno to a status (connection errors -> L3D_ERR_PEER_FAILED).
l3d_status l3d_ofi_status(int fi_err);

// Converts a libfabric return code at the boundary (STYLE.md point 10).
#define L3D_FI_CHECK(o, call, what)                                                    \
    do {                                                                               \
        ssize_t l3d_fi_ret_ = (call);                                                  \
        if (l3d_fi_ret_ < 0) return l3d_ofi_fail((o), l3d_fi_ret_, (what), __FILE__, __LINE__); \
    } while (0)
#define L3D_FI_CHECK_GOTO(o, call, what, st, label)                                    \
    do {                                                                               \
        ssize_t l3d_fi_ret_ = (call);                                                  \
        if (l3d_fi_ret_ < 0) {                                                         \
            (st) = l3d_ofi_fail((o), l3d_fi_ret_, (what), __FILE__, __LINE__);         \
            goto label;                                                                \
        }                                                                              \
    } while (0)

// ---- ofi_peer.c -----------------------------------------------------------------------------
void l3d_ofi_ident_self(l3d_ofi_ident_t *id);
void l3d_ofi_ident_pack(const l3d_ofi_ident_t *id, unsigned char *b);
void l3d_ofi_ident_unpack(l3d_ofi_ident_t *id, const unsigned char *b);
// Nonzero if the process `id` names has exited (gone, zombie, or its pid reused).
int l3d_ofi_ident_exited(const l3d_ofi_ident_t *id);
// Marks `peer` dead and fails its pending operations with L3D_ERR_PEER_FAILED.
void l3d_ofi_fail_peer(l3d_ofi_t *o, int peer, const char *why);
// At most every 0.5 s: checks the local peers that have pending work for having exited, and
// marks them (peer->exited). Returns how many it marked; the caller drains the CQ once more
// and then fails them with l3d_ofi_fail_exited.
int l3d_ofi_check_peers(l3d_ofi_t *o);

// Fails every peer marked exited whose pending operations the last drain did not complete.
void l3d_ofi_fail_exited(l3d_ofi_t *o);

// ---- ofi_shm.c ------------------------------------------------------------------------------
// Before fi_enable on the shm provider: removes /dev/shm regions that exited processes of ours
// left, and gives o->ep a name no other process can hold (fi_setname).
l3d_status l3d_ofi_shm_prepare(l3d_ofi_t *o);

// ---- ofi_p2p.c ------------------------------------------------------------------------------
l3d_tp_request_t *l3d_ofi_req_alloc(l3d_ofi_t *o, l3d_ofi_req_kind kind, int peer);
void l3d_ofi_req_free(l3d_ofi_t *o, l3d_tp_request_t *r);
// Posts the control receive that catches peers' abort notices.
l3d_status l3d_ofi_ctrl_post(l3d_ofi_t *o);
// Reads the CQ until it is empty (bounded), completing requests. Manual progress happens here.
l3d_status l3d_ofi_drain(l3d_ofi_t *o);
// Cancels every provider-owned request and drains for at most `budget_s` seconds.
void l3d_ofi_cancel_all(l3d_ofi_t *o, double budget_s);
// Frees every request still tracked (after the endpoint is closed).
void l3d_ofi_free_all(l3d_ofi_t *o);


l3d_status l3d_ofi_isend(l3d_transport_t *tp, int peer, uint64_t tag, const void *buf, size_t len,
                         void *mr, l3d_tp_request_t **req_p);
l3d_status l3d_ofi_irecv(l3d_transport_t *tp, int peer, uint64_t tag, void *buf, size_t len,
                         void *mr, l3d_tp_request_t **req_p);
l3d_status l3d_ofi_test(l3d_transport_t *tp, l3d_tp_request_t *req, int *done_p, size_t *len_p);
l3d_status l3d_ofi_progress(l3d_transport_t *tp);
void l3d_ofi_cancel(l3d_transport_t *tp, l3d_tp_request_t *req);
void l3d_ofi_abort(l3d_transport_t *tp);
// The clean close's handshake (fini): says goodbye to every live peer and waits until each one
// has said goodbye too, died, or exited, at most the communicator timeout.
void l3d_ofi_goodbye(l3d_ofi_t *o);

#endif
