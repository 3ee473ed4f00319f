// The libfabric transport's tagged point-to-point: posting, the completion queue, cancel and
// abort. The tag layout is in ofi_internal.h.
// defines: l3d_ofi_isend, l3d_ofi_irecv, l3d_ofi_test, l3d_ofi_progress, l3d_ofi_cancel,
//          l3d_ofi_abort, l3d_ofi_drain and the request helpers
//
// Request life: allocated and linked into o->live, posted (the provider owns its fi_context2),
// completed by the CQ (done = 1, result in st/len), then freed when test reports it or cancel
// drops it. A request is never freed while the provider may still write its context: a
// receive from a dead peer that cannot be cancelled quickly becomes an orphan, freed by its
// completion or at fini after the endpoint is closed; a send, or a receive from a live peer,
// that can be neither cancelled nor completed closes the endpoint (its buffer is the caller's
// again once cancel returns).
//
// Failure of a peer. libfabric reports a peer's death only as error completions of operations
// with it, and 1.17 rarely does even that (shm never; tcp;ofi_rxm logs the refused reconnect
// and answers -FI_EAGAIN). So a peer is marked dead on the first such error, on an abort notice
// from it (a 0-byte control message, see l3d_ofi_abort), or when ofi_peer.c sees that a peer
// process on this node has exited; every pending operation with it then fails with
// L3D_ERR_PEER_FAILED naming it. A peer on another node that dies silently is left to the core's
// timeout.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "transports/ofi/ofi_internal.h"

#define OFI_FREE_LIST_MAX 256
#define OFI_CQ_BATCH 16
#define OFI_CQ_ROUNDS 64       // batches per drain: bounded work per call
#define OFI_CANCEL_BUDGET_S 0.1  // how long cancel drives the CQ for a send's completion
// ... for a matched receive's, from a live peer. Short: cancel runs on failure paths, where the
// peer may be stopped (SIGSTOP) without being known dead here, and every second counts against
// the core's failure bound; a live peer's message completes in milliseconds.
#define OFI_CANCEL_RECV_BUDGET_S 0.5
#define OFI_ABORT_BUDGET_S 0.1   // how long abort drives the CQ to push its notices out
#define OFI_EXITED_DRAIN_S 0.02 // progress after a peer is seen exited, before failing it

static uint64_t ofi_wire_tag(int rank, uint64_t tag) {
    return ((uint64_t)rank << L3D_OFI_TAG_RANK_SHIFT) | (tag & L3D_OFI_TAG_USER_MASK);
}

static int ofi_tag_rank(uint64_t tag) {
    return (int)((tag & L3D_OFI_TAG_RANK_MASK) >> L3D_OFI_TAG_RANK_SHIFT);
}

static const char *ofi_kind_name(l3d_ofi_req_kind k) {
    return k == L3D_OFI_REQ_RECV ? "receive from" : "send to";
}

l3d_tp_request_t *l3d_ofi_req_alloc(l3d_ofi_t *o, l3d_ofi_req_kind kind, int peer) {
    l3d_tp_request_t *r = o->free_list;
    if (r) {
        o->free_list = r->next;
        o->nfree--;
    } else {
        r = l3d_malloc(o->ctx, sizeof(*r), L3D_OFI_ALLOC_TAG);
        if (!r) return NULL;
    }
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->peer = peer;
    r->next = o->live.next;
    r->prev = &o->live;
    o->live.next->prev = r;
    o->live.next = r;
    return r;
}

void l3d_ofi_req_free(l3d_ofi_t *o, l3d_tp_request_t *r) {
    r->prev->next = r->next;
    r->next->prev = r->prev;
    if (o->ctrl_recv == r) o->ctrl_recv = NULL;
    if (o->nfree < OFI_FREE_LIST_MAX) {
        r->next = o->free_list;
        o->free_list = r;
        o->nfree++;
    } else {
        l3d_free(o->ctx, r, sizeof(*r), L3D_OFI_ALLOC_TAG);
    }
}

void l3d_ofi_free_all(l3d_ofi_t *o) {
    while (o->live.next != &o->live) l3d_ofi_req_free(o, o->live.next);
    while (o->free_list) {
        l3d_tp_request_t *r = o->free_list;
        o->free_list = r->next;
        l3d_free(o->ctx, r, sizeof(*r), L3D_OFI_ALLOC_TAG);
    }
    o->nfree = 0;
}

l3d_status l3d_ofi_ctrl_post(l3d_ofi_t *o) {
    l3d_tp_request_t *r = o->ctrl_recv;
    if (!r) {
        r = l3d_ofi_req_alloc(o, L3D_OFI_REQ_CTRL_RECV, -1);
        if (!r) return L3D_ERR_NOMEM;
        o->ctrl_recv = r;
    }
    r->done = 0;
    // Any sender, any control kind: the completion's tag says who and what.
    ssize_t ret = fi_trecv(o->ep, &o->ctrl_buf, sizeof(o->ctrl_buf), NULL, FI_ADDR_UNSPEC,
                           L3D_OFI_TAG_CTRL, L3D_OFI_TAG_RANK_MASK | L3D_OFI_TAG_USER_MASK,
                           &r->fictx);
    if (ret < 0) {
        l3d_ofi_req_free(o, r);
        return l3d_ofi_fail(o, ret, "posting the control receive", __FILE__, __LINE__);
    }
    return L3D_OK;
}

static void ofi_finish(l3d_ofi_t *o, l3d_tp_request_t *r) {
    r->done = 1;
    if (r->orphan || r->kind == L3D_OFI_REQ_CTRL_SEND) l3d_ofi_req_free(o, r);
}

// A completion for a request already failed by l3d_ofi_fail_peer: the provider lets go of it;
// its reported result stays PEER_FAILED.
static int ofi_release_detached(l3d_ofi_t *o, l3d_tp_request_t *r) {
    if (!r->detached) return 0;
    r->detached = 0;
    if (r->orphan) l3d_ofi_req_free(o, r);
    return 1;
}

static void ofi_complete(l3d_ofi_t *o, const struct fi_cq_tagged_entry *e) {
    l3d_tp_request_t *r = e->op_context;
    if (!r) return;
    if (r->kind == L3D_OFI_REQ_CTRL_RECV) {
        int from = ofi_tag_rank(e->tag);
        uint64_t what = e->tag & L3D_OFI_TAG_USER_MASK;
        if (what == L3D_OFI_CTRL_ABORT && from != o->rank) {
            char why[L3D_OFI_WHY_LEN];
            snprintf(why, sizeof(why), "rank %d aborted", from);
            l3d_ofi_fail_peer(o, from, why);
        } else if (what == L3D_OFI_CTRL_BYE && from >= 0 && from < o->nranks) {
            o->peers[from].said_bye = 1;
        }
        if (l3d_ofi_ctrl_post(o) < 0)
            l3d_log(o->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM,
                    "ofi: rank %d: abort notices can no longer be received", o->rank);
        return;
    }
    if (ofi_release_detached(o, r)) return;
    r->st = L3D_OK;
    if (r->kind == L3D_OFI_REQ_RECV) r->len = e->len;
    ofi_finish(o, r);
}

static void ofi_complete_err(l3d_ofi_t *o) {
    struct fi_cq_err_entry e;
    memset(&e, 0, sizeof(e));  // err_data_size 0: the provider lends its own buffer
    ssize_t ret = fi_cq_readerr(o->cq, &e, 0);
    if (ret < 0) return;
    // shm 1.17 reports truncation as -FI_ETRUNC; the documented sign is positive.
    if (e.err < 0) e.err = -e.err;
    char prov[128];
    const char *pt = fi_cq_strerror(o->cq, e.prov_errno, e.err_data, prov, sizeof(prov));
    snprintf(o->errtext, sizeof(o->errtext), "%s (provider: %s)", fi_strerror(e.err),
             pt ? pt : "");
    l3d_tp_request_t *r = e.op_context;
    if (!r) {
        l3d_log(o->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM,
                "ofi: rank %d: error completion without a request: %s", o->rank, o->errtext);
        return;
    }
    if (r->kind == L3D_OFI_REQ_CTRL_RECV) {
        // Cancelled at fini, or the provider gave up on it: either way it is ours again.
        if (e.err != FI_ECANCELED && !o->ep_closed) (void)l3d_ofi_ctrl_post(o);
        else l3d_ofi_req_free(o, r);
        return;
    }
    if (ofi_release_detached(o, r)) return;
    r->fi_err = e.err;
    int peer = r->peer;
    // A cancel we did not ask for: tcp;ofi_rxm cancels the receives posted for a peer whose
    // connection it tore down, i.e. the peer is gone (reported as the peer's failure; before,
    // "Operation canceled" made this rank abort and the others blame it instead of the peer).
    int lost = e.err == FI_ECANCELED && !r->cancelled;
    if (lost) {
        r->st = L3D_ERR_PEER_FAILED;
        snprintf(o->errtext, sizeof(o->errtext), "the provider cancelled it (connection lost)");
    } else if (e.err == FI_ECANCELED) {
        r->st = L3D_ERR_INTERNAL;  // only cancel() and fini cancel; they never report it
    } else if (e.err == FI_ETRUNC) {
        r->st = L3D_ERR_INTERNAL;  // r->len stays the posted length
        r->olen = e.olen;  // the excess; shm 1.17 reports 0 (and len 0)
    } else {
        r->st = l3d_ofi_status(e.err);
        if (r->kind == L3D_OFI_REQ_CTRL_SEND) r->st = L3D_ERR_PEER_FAILED;
    }
    l3d_ofi_req_kind kind = r->kind;
    ofi_finish(o, r);  // before failing the peer, which must not detach this one
    if (lost || l3d_ofi_status(e.err) == L3D_ERR_PEER_FAILED) {
        char why[L3D_OFI_WHY_LEN];
        snprintf(why, sizeof(why), "%s rank %d failed: %.150s", ofi_kind_name(kind), peer,
                 o->errtext);
        l3d_ofi_fail_peer(o, peer, why);
    }
}

// One bounded pass over the CQ: completes what the provider has.
static l3d_status ofi_cq_poll(l3d_ofi_t *o) {
    struct fi_cq_tagged_entry ent[OFI_CQ_BATCH];
    for (int round = 0; round < OFI_CQ_ROUNDS; round++) {
        ssize_t n = fi_cq_read(o->cq, ent, OFI_CQ_BATCH);
        if (n == -FI_EAGAIN) break;
        if (n == -FI_EAVAIL) {
            ofi_complete_err(o);
            continue;
        }
        if (n < 0) return l3d_ofi_fail(o, n, "fi_cq_read", __FILE__, __LINE__);
        for (ssize_t i = 0; i < n; i++) ofi_complete(o, &ent[i]);
        if (n < OFI_CQ_BATCH) break;
    }
    return L3D_OK;
}

l3d_status l3d_ofi_drain(l3d_ofi_t *o) {
    if (o->ep_closed) return L3D_OK;
    L3D_CHECK(o->ctx, ofi_cq_poll(o));
    if (l3d_ofi_check_peers(o) > 0) {
        // A peer exited: nothing more can come, but what it sent before may still be handed
        // over (an abort or failure notice naming the rank that really failed; rxm may need
        // several passes over a closed socket). Progress for a short grace, then fail what is
        // left. shm does not always keep an exited sender's messages (a 0.5 s grace did not
        // bring back a completed 4000-byte send): the goodbye at fini is what protects them.
        double until = l3d_time_now() + OFI_EXITED_DRAIN_S;
        do {
            L3D_CHECK(o->ctx, ofi_cq_poll(o));
        } while (!o->ep_closed && l3d_time_now() < until);
        l3d_ofi_fail_exited(o);
    }
    return L3D_OK;
}

// Checks shared by isend and irecv; the detail names the peer.
static l3d_status ofi_post_check(l3d_ofi_t *o, int peer, const void *buf, size_t len, void *mr,
                                 l3d_tp_request_t **req_p) {
    if (!req_p || peer < 0 || peer >= o->nranks || (!buf && len))
        return l3d_error(o->ctx, L3D_ERR_INVALID_ARG,
                         "ofi: rank %d: bad operation with rank %d (%zu bytes)", o->rank, peer,
                         len);
    if (o->ep_closed)
        return l3d_error(o->ctx, L3D_ERR_PEER_FAILED,
                         "ofi: rank %d aborted its endpoint; no operation with rank %d", o->rank,
                         peer);
    if (!o->connected)
        return l3d_error(o->ctx, L3D_ERR_INVALID_ARG, "ofi: rank %d is not connected", o->rank);
    if (o->peer_dead[peer])
        return l3d_error(o->ctx, L3D_ERR_PEER_FAILED, "ofi: rank %d: peer rank %d failed: %s",
                         o->rank, peer, o->peer_why[peer]);
    if (len > o->max_msg)
        return l3d_error(o->ctx, L3D_ERR_INVALID_ARG,
                         "ofi: rank %d: %zu bytes with rank %d exceed the %zu-byte maximum",
                         o->rank, len, peer, o->max_msg);
    if (o->needs_mr && len && !mr)
        return l3d_error(o->ctx, L3D_ERR_INVALID_ARG,
                         "ofi: rank %d: provider %s needs registered buffers (mr is NULL)",
                         o->rank, o->prov);
    return L3D_OK;
}

// Shared tail of isend/irecv: -FI_EAGAIN drives the CQ and asks the core to retry.
static l3d_status ofi_post_result(l3d_ofi_t *o, ssize_t ret, l3d_tp_request_t *r,
                                  l3d_tp_request_t **req_p) {
    if (ret == 0) {
        *req_p = r;
        return L3D_OK;
    }
    int peer = r->peer;
    l3d_ofi_req_kind kind = r->kind;
    l3d_ofi_req_free(o, r);
    if (ret == -FI_EAGAIN) {
        o->peers[peer].want_check = 1;  // rxm answers EAGAIN forever to an exited peer
        l3d_status st = l3d_ofi_drain(o);
        return st < 0 ? st : L3D_INPROGRESS;
    }
    char what[64];
    snprintf(what, sizeof(what), "posting a %s rank %d", ofi_kind_name(kind), peer);
    return l3d_ofi_fail(o, ret, what, __FILE__, __LINE__);
}

l3d_status l3d_ofi_isend(l3d_transport_t *tp, int peer, uint64_t tag, const void *buf, size_t len,
                         void *mr, l3d_tp_request_t **req_p) {
    l3d_ofi_t *o = tp->priv;
    L3D_CHECK(o->ctx, ofi_post_check(o, peer, buf, len, mr, req_p));
    l3d_tp_request_t *r = l3d_ofi_req_alloc(o, L3D_OFI_REQ_SEND, peer);
    if (!r) return L3D_ERR_NOMEM;
    r->len = len;
    r->tag = ofi_wire_tag(o->rank, tag);
    void *desc = mr ? fi_mr_desc(((l3d_ofi_mr_t *)mr)->mr) : NULL;
    ssize_t ret = fi_tsend(o->ep, buf, len, desc, o->addrs[peer], r->tag, &r->fictx);
    return ofi_post_result(o, ret, r, req_p);
}

l3d_status l3d_ofi_irecv(l3d_transport_t *tp, int peer, uint64_t tag, void *buf, size_t len,
                         void *mr, l3d_tp_request_t **req_p) {
    l3d_ofi_t *o = tp->priv;
    L3D_CHECK(o->ctx, ofi_post_check(o, peer, buf, len, mr, req_p));
    l3d_tp_request_t *r = l3d_ofi_req_alloc(o, L3D_OFI_REQ_RECV, peer);
    if (!r) return L3D_ERR_NOMEM;
    r->len = len;
    r->tag = ofi_wire_tag(peer, tag);
    void *desc = mr ? fi_mr_desc(((l3d_ofi_mr_t *)mr)->mr) : NULL;
    fi_addr_t src = o->directed ? o->addrs[peer] : FI_ADDR_UNSPEC;
    ssize_t ret = fi_trecv(o->ep, buf, len, desc, src, r->tag, 0, &r->fictx);
    return ofi_post_result(o, ret, r, req_p);
}

// Records the detail of a failed request (called just before it is freed).
static l3d_status ofi_req_error(l3d_ofi_t *o, const l3d_tp_request_t *r) {
    unsigned long long tag = (unsigned long long)(r->tag & L3D_OFI_TAG_USER_MASK);
    const char *k = ofi_kind_name(r->kind);
    if (r->fi_err == FI_ETRUNC && r->olen)
        return l3d_error(o->ctx, L3D_ERR_INTERNAL,
                         "ofi: rank %d: message from rank %d tag 0x%llx is %zu bytes longer "
                         "than the %zu-byte receive",
                         o->rank, r->peer, tag, r->olen, r->len);
    if (r->fi_err == FI_ETRUNC)
        return l3d_error(o->ctx, L3D_ERR_INTERNAL,
                         "ofi: rank %d: message from rank %d tag 0x%llx is longer than the "
                         "%zu-byte receive",
                         o->rank, r->peer, tag, r->len);
    if (r->st == L3D_ERR_PEER_FAILED && o->peer_dead[r->peer])
        return l3d_error(o->ctx, L3D_ERR_PEER_FAILED,
                         "ofi: rank %d: %s rank %d tag 0x%llx failed: peer rank %d failed: %s",
                         o->rank, k, r->peer, tag, r->peer, o->peer_why[r->peer]);
    if (o->aborted)
        return l3d_error(o->ctx, r->st,
                         "ofi: rank %d: %s rank %d tag 0x%llx dropped: this rank aborted",
                         o->rank, k, r->peer, tag);
    return l3d_error(o->ctx, r->st, "ofi: rank %d: %s rank %d tag 0x%llx failed: %s", o->rank,
                     k, r->peer, tag, r->fi_err ? fi_strerror(r->fi_err) : "unknown");
}

l3d_status l3d_ofi_test(l3d_transport_t *tp, l3d_tp_request_t *req, int *done_p, size_t *len_p) {
    l3d_ofi_t *o = tp->priv;
    *done_p = 0;
    if (!req->done) L3D_CHECK(o->ctx, l3d_ofi_drain(o));
    if (!req->done) return L3D_OK;
    *done_p = 1;
    if (len_p) *len_p = req->len;
    l3d_status st = req->st;
    if (st < 0) st = ofi_req_error(o, req);
    if (req->detached) req->orphan = 1;  // the provider still holds it: freed on release
    else l3d_ofi_req_free(o, req);
    return st;
}

l3d_status l3d_ofi_progress(l3d_transport_t *tp) { return l3d_ofi_drain(tp->priv); }

static void ofi_close_ep(l3d_ofi_t *o);

void l3d_ofi_cancel(l3d_transport_t *tp, l3d_tp_request_t *req) {
    l3d_ofi_t *o = tp->priv;
    if (!req) return;
    if (req->detached) {
        req->orphan = 1;
        return;
    }
    int recv = req->kind == L3D_OFI_REQ_RECV;
    if (!req->done && !o->ep_closed) {
        // Unmatched receives cancel at once. A receive the provider has already matched cannot
        // be cancelled: it completes when the rest of the message is in (shm copies a message
        // above its inject size in segments as both sides progress), and the contract gives the
        // buffer back to the caller, so drive the CQ until then while the peer lives. Sends
        // usually cannot be cancelled but may be about to finish: a short while for them.
        // A send to a dead peer is driven too: the provider may still be pushing it (tcp
        // retries the connection) and must fail or finish it while the buffer is the sender's.
        req->cancelled = 1;
        (void)fi_cancel(&o->ep->fid, &req->fictx);
        double t0 = l3d_time_now(), budget = recv ? OFI_CANCEL_RECV_BUDGET_S : OFI_CANCEL_BUDGET_S;
        while (!req->done && (!recv || !o->peer_dead[req->peer]) &&
               l3d_time_now() - t0 < budget)
            if (l3d_ofi_drain(o) < 0) break;
    }
    if (req->detached) {  // the peer failed meanwhile: the provider still holds the context
        req->orphan = 1;
        return;
    }
    if (req->done || o->ep_closed) {
        l3d_ofi_req_free(o, req);
        return;
    }
    if (!recv || !o->peer_dead[req->peer]) {
        // A live peer may still complete a receive into a buffer that is the caller's again,
        // and the provider may read a send's buffer on any later progress (seen under ASan: tcp
        // sending from a freed buffer at fini, after a peer aborted): only closing the endpoint
        // stops it. A receive gives up as abort does; a send (usually to a dead peer) closes
        // without notices, so that the peers keep blaming the rank that stopped.
        l3d_log(o->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM,
                "ofi: rank %d: a %s rank %d could be neither cancelled nor completed in %.1f s; "
                "closing the endpoint so that it cannot %s the caller's buffer",
                o->rank, recv ? "receive from" : "send to", req->peer,
                recv ? OFI_CANCEL_RECV_BUDGET_S : OFI_CANCEL_BUDGET_S, recv ? "write" : "read");
        if (recv) l3d_ofi_abort(tp);
        else ofi_close_ep(o);
        l3d_ofi_req_free(o, req);
        return;
    }
    l3d_log(o->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM,
            "ofi: rank %d: %s rank %d could not be cancelled; the provider keeps it until fini",
            o->rank, ofi_kind_name(req->kind), req->peer);
    req->orphan = 1;
}

void l3d_ofi_cancel_all(l3d_ofi_t *o, double budget_s) {
    if (o->ep_closed || !o->ep) return;
    int pending = 0;
    for (l3d_tp_request_t *r = o->live.next; r != &o->live; r = r->next) {
        if (r->done) continue;
        r->orphan = 1;
        r->cancelled = 1;
        (void)fi_cancel(&o->ep->fid, &r->fictx);
        pending++;
    }
    double t0 = l3d_time_now();
    while (pending && l3d_time_now() - t0 < budget_s) {
        if (l3d_ofi_drain(o) < 0) break;
        pending = 0;
        for (l3d_tp_request_t *r = o->live.next; r != &o->live; r = r->next) pending += !r->done;
    }
}

// Best effort, bounded: a 0-byte control message to every live peer (their CQ turns it into
// L3D_ERR_PEER_FAILED for everything pending with this rank), then the endpoint is closed, which
// on connection-based providers also resets the peers' connections to this rank.
// Posts a 0-byte control message (`what`: L3D_OFI_CTRL_*) to `peer`; its request frees itself
// on completion. `tries` posts, with a drain between, while the provider answers -FI_EAGAIN
// (a connection to a peer never talked to is being set up). Returns 1 if it was posted.
static int ofi_ctrl_send(l3d_ofi_t *o, int peer, uint64_t what, int tries) {
    uint64_t tag = L3D_OFI_TAG_CTRL | ofi_wire_tag(o->rank, what);
    l3d_tp_request_t *r = l3d_ofi_req_alloc(o, L3D_OFI_REQ_CTRL_SEND, peer);
    if (!r) return 0;
    ssize_t ret = -FI_EAGAIN;
    for (int i = 0; i < tries && ret == -FI_EAGAIN && !o->ep_closed; i++) {
        ret = fi_tsend(o->ep, &o->ctrl_buf, 0, NULL, o->addrs[peer], tag, &r->fictx);
        if (ret == -FI_EAGAIN) (void)l3d_ofi_drain(o);
    }
    if (ret) l3d_ofi_req_free(o, r);
    return ret == 0;
}

// Drives the CQ until no control message is left unsent, for at most budget_s.
static void ofi_ctrl_flush(l3d_ofi_t *o, double budget_s) {
    double t0 = l3d_time_now();
    for (;;) {
        int pending = 0;
        for (l3d_tp_request_t *r = o->live.next; r != &o->live; r = r->next)
            pending += r->kind == L3D_OFI_REQ_CTRL_SEND;
        if (!pending || o->ep_closed || l3d_time_now() - t0 >= budget_s) break;
        if (l3d_ofi_drain(o) < 0) break;
    }
}

// Why a handshake: a send's completion means the provider has our buffer, not that the peer
// has read it. shm loses what a peer has not yet taken from its queue once the sender closes
// its endpoint (seen: a 4000-byte echo, completed at the sender, never matched at a receiver
// that polled for 0.5 s after the sender exited), and so can rxm with a peer mid-reconnect.
// So a rank closes only after every peer has said goodbye too: a peer says it only from its
// own fini, after its last receive, and messages from one sender arrive in order. A peer that
// died or exited says nothing more and is not waited for (its exit is checked every
// OFI_BYE_CHECK_S here, not every 0.5 s); one that never reaches fini (a hung process on
// another node) holds us at most the communicator timeout, as MPI_Finalize would forever.
// The one message that can still be lost is a goodbye whose sender closed before we read it,
// and that sender has then exited: the exit check ends our wait. Ranks of one process (tests
// that drive several endpoints from one thread) are not waited for.
#define OFI_BYE_CHECK_S 0.01

void l3d_ofi_goodbye(l3d_ofi_t *o) {
    if (!o->connected || o->ep_closed || o->aborted) return;
    // Operations still in the provider (a failed collective's, left as orphans) may read or
    // write buffers the caller has freed since: progressing them here would touch freed
    // memory (ASan caught it). A run that ends with such leftovers has failed already; it
    // closes as before, without the handshake (its peers see it exit).
    for (l3d_tp_request_t *r = o->live.next; r != &o->live; r = r->next)
        if (!r->done && (r->kind == L3D_OFI_REQ_SEND || r->kind == L3D_OFI_REQ_RECV)) return;
    for (int p = 0; p < o->nranks; p++)
        if (p != o->rank && o->peer_dead[p]) return;
    double t0 = l3d_time_now(), next_check = t0 + OFI_BYE_CHECK_S;
    double limit = o->timeout_s > 0 ? o->timeout_s : 300.0;
    for (int idle = 0;; idle++) {
        // A rank done with its work must not starve the peers still at theirs (ranks may
        // outnumber cores): after a short spin, poll every 0.2 ms.
        if (idle > 64) nanosleep(&(struct timespec){0, 200000}, NULL);
        if (l3d_ofi_drain(o) < 0 || o->ep_closed) return;
        double t = l3d_time_now();
        int check = t >= next_check, waiting = -1, nwait = 0;
        if (check) next_check = t + OFI_BYE_CHECK_S;
        for (int p = 0; p < o->nranks; p++) {
            l3d_ofi_peer_t *pe = &o->peers[p];
            if (p == o->rank || o->peer_dead[p]) continue;
            // A peer in this very process is closed by the same caller, who orders the two
            // (it may be this thread, after we return): it cannot be waited for.
            if (pe->local && pe->id.pid == o->self.pid && pe->id.starttime == o->self.starttime)
                continue;
            if (!pe->said_bye && check && pe->local && o->self.boot_id[0] &&
                l3d_ofi_ident_exited(&pe->id)) {
                pe->said_bye = pe->sent_bye = 1;  // gone: it reads nothing more of ours
                continue;
            }
            // Posting may take several passes (EAGAIN while rxm or shm connects): retried
            // here, and owed even to a peer that has already said goodbye.
            if (!pe->sent_bye) pe->sent_bye = ofi_ctrl_send(o, p, L3D_OFI_CTRL_BYE, 1);
            if (pe->sent_bye && pe->said_bye) continue;
            if (waiting < 0) waiting = p;
            nwait++;
        }
        if (!nwait) break;
        if (t - t0 >= limit) {
            l3d_log(o->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM,
                    "ofi: rank %d: closing without the goodbye of %d peer(s) (rank %d first) "
                    "after %.0f s; what they had not read of ours is lost",
                    o->rank, nwait, waiting, limit);
            break;
        }
    }
    ofi_ctrl_flush(o, OFI_ABORT_BUDGET_S);
}

void l3d_ofi_abort(l3d_transport_t *tp) {
    l3d_ofi_t *o = tp->priv;
    if (o->ep_closed) return;
    o->aborted = 1;
    if (o->connected) {
        for (int p = 0; p < o->nranks; p++)
            if (p != o->rank && !o->peer_dead[p]) (void)ofi_ctrl_send(o, p, L3D_OFI_CTRL_ABORT, 100);
        ofi_ctrl_flush(o, OFI_ABORT_BUDGET_S);
    }
    ofi_close_ep(o);
}

// Closes the endpoint: the provider holds nothing after this; what was pending fails.
static void ofi_close_ep(l3d_ofi_t *o) {
    // Endpoint-bound registrations must go before their endpoint.
    if (o->mr_endpoint)
        for (l3d_ofi_mr_t *m = o->mrs.next; m != &o->mrs; m = m->next)
            if (m->mr) {
                (void)fi_close(&m->mr->fid);
                m->mr = NULL;
            }
    int ret = fi_close(&o->ep->fid);
    if (ret)
        l3d_log(o->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "ofi: rank %d: closing the endpoint: %s",
                o->rank, fi_strerror(-ret));
    o->ep_closed = 1;
    o->ep = NULL;
    // The provider holds nothing now: what was pending fails, orphans and notices go.
    for (l3d_tp_request_t *r = o->live.next; r != &o->live;) {
        l3d_tp_request_t *n = r->next;
        r->detached = 0;
        if (r->orphan || r->kind == L3D_OFI_REQ_CTRL_SEND || r->kind == L3D_OFI_REQ_CTRL_RECV) {
            l3d_ofi_req_free(o, r);
        } else if (!r->done) {
            r->done = 1;
            r->st = L3D_ERR_PEER_FAILED;
        }
        r = n;
    }
}
