// UCX transport, point-to-point: isend/irecv/test/progress/cancel, the control receive that
// carries abort notices, and the sweep that fails requests of dead peers.
//
// Requests: UCX allocates its own request (nbx without UCP_OP_ATTR_FIELD_REQUEST) and calls
// our callback with user_data = our l3d_tp_request_t, which frees the UCX request right there.
// An operation that completes inside the nbx call gets no callback, so our request is simply
// born done: the core always has an object to test.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "transports/ucx/ucx_internal.h"

double l3d_ucx_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- request objects ----------------------------------------------------------------------------
static l3d_tp_request_t *req_get(l3d_ucx_t *u) {
    l3d_tp_request_t *r = u->free_reqs;
    if (r) {
        u->free_reqs = r->next;
    } else {
        r = l3d_malloc(u->ctx, sizeof(*r), L3D_UCX_MEM_TAG);
        if (!r) return NULL;
    }
    memset(r, 0, sizeof(*r));
    r->u = u;
    r->peer = -1;
    return r;
}

static void req_link(l3d_ucx_t *u, l3d_tp_request_t *r) {
    r->next = &u->pending;
    r->prev = u->pending.prev;
    u->pending.prev->next = r;
    u->pending.prev = r;
}

// Unlinks (if linked) and returns the request to the free list.
static void req_put(l3d_ucx_t *u, l3d_tp_request_t *r) {
    if (r->prev) {
        r->prev->next = r->next;
        r->next->prev = r->prev;
        r->prev = NULL;
    }
    r->next = u->free_reqs;
    u->free_reqs = r;
}

static void req_finish(l3d_tp_request_t *r, ucs_status_t s) {
    l3d_ucx_t *u = r->u;
    r->status = s;
    r->done = 1;
    r->ucx = NULL;
    u->peers[r->peer].npending--;
    if (r->orphan) req_put(u, r);
}

static void send_cb(void *request, ucs_status_t s, void *user) {
    ucp_request_free(request);
    req_finish(user, s);
}

static void recv_cb(void *request, ucs_status_t s, const ucp_tag_recv_info_t *info, void *user) {
    l3d_tp_request_t *r = user;
    if (s == UCS_OK) r->len = info->length;
    ucp_request_free(request);
    req_finish(r, s);
}

int l3d_ucx_reqs_busy(const l3d_ucx_t *u) {
    for (const l3d_tp_request_t *r = u->pending.next; r != &u->pending; r = r->next)
        if (r->ucx && !r->abandoned) return 1;
    return 0;  // the control receive stays posted until fini's very end
}

void l3d_ucx_reqs_cancel_recvs(l3d_ucx_t *u) {
    for (l3d_tp_request_t *r = u->pending.next, *nx; r != &u->pending; r = nx) {
        nx = r->next;  // an orphan leaves the ring inside the cancel's callback
        if (r->ucx && !r->is_send && !r->cancelling) {
            r->cancelling = 1;
            ucp_request_cancel(u->worker, r->ucx);
        }
    }
}

void l3d_ucx_ctrl_cancel(l3d_ucx_t *u) {
    u->ctrl_stop = 1;
    if (u->ctrl_req) ucp_request_cancel(u->worker, u->ctrl_req);
    double deadline = l3d_ucx_now() + 0.1;
    while (u->ctrl_req && l3d_ucx_now() < deadline) l3d_ucx_progress_all(u);
}

void l3d_ucx_reqs_free_all(l3d_ucx_t *u) {
    while (u->pending.next != &u->pending) req_put(u, u->pending.next);
    for (l3d_tp_request_t *r = u->free_reqs, *nx; r; r = nx) {
        nx = r->next;
        l3d_free(u->ctx, r, sizeof(*r), L3D_UCX_MEM_TAG);
    }
    u->free_reqs = NULL;
}

// ---- control receive ----------------------------------------------------------------------------
static void ctrl_cb(void *request, ucs_status_t s, const ucp_tag_recv_info_t *info, void *user) {
    l3d_ucx_t *u = user;
    u->ctrl_status = s;
    if (s == UCS_OK) u->ctrl_sender_tag = info->sender_tag;
    u->ctrl_done = 1;
    u->ctrl_req = NULL;
    ucp_request_free(request);
}

static void ctrl_handle(l3d_ucx_t *u) {
    u->ctrl_done = 0;
    if (u->ctrl_status != UCS_OK) return;
    int from = l3d_ucx_tag_sender(u->ctrl_sender_tag);
    if (from < 0 || from >= u->nranks) return;
    if (u->ctrl_buf == L3D_UCX_CTRL_ABORT)
        l3d_ucx_peer_fail(u, from, "the peer aborted", L3D_LOG_WARN);
    if (u->ctrl_buf == L3D_UCX_CTRL_BYE)
        // The normal end of a job: worth a line only when a request fails because of it.
        l3d_ucx_peer_fail(u, from, "the peer closed its endpoint (it finished or left)",
                          L3D_LOG_DEBUG);
}

void l3d_ucx_ctrl_post(l3d_ucx_t *u) {
    while (!u->ctrl_req && !u->ctrl_stop) {
        // NO_IMM_CMPL: the sender's tag arrives only through the callback (see irecv).
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
            .cb.recv = ctrl_cb,
            .user_data = u,
        };
        u->ctrl_buf = 0;
        u->ctrl_done = 0;
        ucs_status_ptr_t sp = ucp_tag_recv_nbx(u->worker, &u->ctrl_buf, sizeof(u->ctrl_buf),
                                               L3D_UCX_CTRL_BIT, L3D_UCX_CTRL_BIT, &prm);
        if (UCS_PTR_IS_ERR(sp)) {
            // Without it aborts are noticed only through UCX's own error detection.
            snprintf(u->last_ucs, sizeof(u->last_ucs), "%s",
                     ucs_status_string(UCS_PTR_STATUS(sp)));
            l3d_log(u->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM,
                    "ucx: posting the control receive failed: %s", u->last_ucs);
            return;
        }
        if (u->ctrl_done) {  // a notice was already waiting; the callback ran inside the call
            ctrl_handle(u);
            continue;
        }
        u->ctrl_req = sp;
    }
}

// ---- failure sweep ------------------------------------------------------------------------------
// UCX fails sends on a broken endpoint by itself (UCP_ERR_HANDLING_MODE_PEER), but a tag receive
// belongs to the worker, not to an endpoint, and would wait forever: cancel those, and the
// completion status is turned into L3D_ERR_PEER_FAILED because the peer is marked failed.
static void sweep(l3d_ucx_t *u) {
    u->need_sweep = 0;
    for (int i = 0; i < u->nranks; i++)
        if (u->peers[i].failed && u->peers[i].ep) l3d_ucx_peer_close(u, i, 1);
    for (l3d_tp_request_t *r = u->pending.next, *nx; r != &u->pending; r = nx) {
        nx = r->next;
        l3d_ucx_peer_t *pp = &u->peers[r->peer];
        if (!r->ucx || r->abandoned || !pp->failed) continue;
        if (!r->is_send && !r->cancelling) {
            r->cancelling = 1;
            ucp_request_cancel(u->worker, r->ucx);
        }
        // Still open: a receive matched to a rendezvous of the dead peer, or a send on a NONE-
        // mode endpoint, whose requests UCX 1.13 does not track per endpoint and so never
        // completes on close. Nobody will touch the buffer again; report the request failed.
        if (!r->done && (!r->is_send || !pp->err_mode_peer)) {
            r->abandoned = 1;
            r->status = UCS_ERR_CANCELED;
        }
    }
}

static void collect_closes(l3d_ucx_t *u) {
    for (int i = 0; i < u->nranks && u->nclosing > 0; i++) {
        l3d_ucx_peer_t *pp = &u->peers[i];
        if (pp->close_req && ucp_request_check_status(pp->close_req) != UCS_INPROGRESS) {
            ucp_request_free(pp->close_req);
            pp->close_req = NULL;
            u->nclosing--;
        }
    }
}

void l3d_ucx_progress_all(l3d_ucx_t *u) {
    // Drain what is ready now, bounded so one call stays short under a flood.
    for (int i = 0; i < 64 && ucp_worker_progress(u->worker); i++) {
    }
    if (u->ctrl_done) {
        ctrl_handle(u);
        l3d_ucx_ctrl_post(u);
    }
    if (u->nwatch) l3d_ucx_watch(u);
    if (u->need_sweep) sweep(u);
    if (u->nclosing) collect_closes(u);
}

// ---- point-to-point -----------------------------------------------------------------------------
static l3d_status check_post(l3d_ucx_t *u, int peer, const char *what) {
    if (!u->connected)
        return l3d_error(u->ctx, L3D_ERR_INVALID_ARG, "ucx: %s before connect", what);
    if (peer < 0 || peer >= u->nranks)
        return l3d_error(u->ctx, L3D_ERR_INVALID_ARG, "ucx: %s: rank %d is not in a world of %d",
                         what, peer, u->nranks);
    if (u->aborted)
        return l3d_error(u->ctx, L3D_ERR_PEER_FAILED, "ucx: %s with rank %d after this rank "
                         "(rank %d) aborted", what, peer, u->rank);
    if (u->peers[peer].npending >= L3D_UCX_PEER_MAX_PENDING) {
        l3d_ucx_progress_all(u);
        if (u->peers[peer].npending >= L3D_UCX_PEER_MAX_PENDING) return L3D_INPROGRESS;
    }
    return L3D_OK;
}

l3d_status l3d_ucx_isend(l3d_transport_t *tp, int peer, uint64_t tag, const void *buf,
                         size_t len, void *mr, l3d_tp_request_t **req_p) {
    l3d_ucx_t *u = tp->priv;
    l3d_status st = check_post(u, peer, "send");
    if (st != L3D_OK) return st;
    l3d_ucx_peer_t *pp = &u->peers[peer];
    if (pp->failed || !pp->ep)
        return l3d_error(u->ctx, L3D_ERR_PEER_FAILED, "ucx: rank %d failed: %s (send tag %llu)",
                         peer, pp->why, (unsigned long long)tag);
    l3d_tp_request_t *r = req_get(u);
    if (!r) return L3D_ERR_NOMEM;
    r->peer = peer;
    r->is_send = 1;
    r->tag = tag;
    r->len = len;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = send_cb,
        .user_data = r,
    };
    ucs_status_ptr_t sp = ucp_tag_send_nbx(pp->ep, buf, len, l3d_ucx_tag(u->rank, tag), &prm);
    if (UCS_PTR_IS_ERR(sp)) {
        ucs_status_t s = UCS_PTR_STATUS(sp);
        req_put(u, r);
        if (s == UCS_ERR_NO_RESOURCE) return L3D_INPROGRESS;
        char what[64];
        snprintf(what, sizeof(what), "send tag %llu", (unsigned long long)tag);
        return l3d_ucx_error(u, peer, s, what);
    }
    if (sp == NULL) {
        r->done = 1;
        r->status = UCS_OK;
    } else {
        r->ucx = sp;
        pp->npending++;
    }
    pp->sent = 1;
    req_link(u, r);
    *req_p = r;
    return L3D_OK;
}

l3d_status l3d_ucx_irecv(l3d_transport_t *tp, int peer, uint64_t tag, void *buf, size_t len,
                         void *mr, l3d_tp_request_t **req_p) {
    l3d_ucx_t *u = tp->priv;
    l3d_status st = check_post(u, peer, "recv");
    if (st != L3D_OK) return st;
    l3d_tp_request_t *r = req_get(u);
    if (!r) return L3D_ERR_NOMEM;
    r->peer = peer;
    r->tag = tag;
    r->len = len;
    // UCX 1.13 leaves recv_info unwritten when a receive completes inside the call (seen with
    // posix and tcp), so the length would be lost: ask for the callback every time. It may run
    // before ucp_tag_recv_nbx returns, hence the count is taken first and r->ucx set only if
    // the request is still open afterwards.
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = recv_cb,
        .user_data = r,
    };
    u->peers[peer].npending++;
    // Posted even when the peer is already marked failed: what it sent before dying may be
    // waiting in the unexpected queue and is still delivered.
    ucs_status_ptr_t sp = ucp_tag_recv_nbx(u->worker, buf, len, l3d_ucx_tag(peer, tag),
                                           UINT64_MAX, &prm);
    if (UCS_PTR_IS_ERR(sp)) {
        ucs_status_t s = UCS_PTR_STATUS(sp);
        u->peers[peer].npending--;
        req_put(u, r);
        if (s == UCS_ERR_NO_RESOURCE) return L3D_INPROGRESS;
        char what[64];
        snprintf(what, sizeof(what), "recv tag %llu", (unsigned long long)tag);
        return l3d_ucx_error(u, peer, s, what);
    }
    if (!r->done) r->ucx = sp;  // else the callback already ran and freed the UCX request
    req_link(u, r);
    if (r->ucx && u->peers[peer].failed) {
        r->cancelling = 1;
        ucp_request_cancel(u->worker, r->ucx);
    }
    *req_p = r;
    return L3D_OK;
}

// The l3d_status of a finished request, with the detail recorded.
static l3d_status finish_status(l3d_ucx_t *u, const l3d_tp_request_t *r) {
    if (r->status == UCS_OK) return L3D_OK;
    char what[64];
    snprintf(what, sizeof(what), "%s tag %llu", r->is_send ? "send" : "recv",
             (unsigned long long)r->tag);
    if (r->status == UCS_ERR_MESSAGE_TRUNCATED) {
        snprintf(u->last_ucs, sizeof(u->last_ucs), "%s", ucs_status_string(r->status));
        return l3d_error(u->ctx, L3D_ERR_INTERNAL, "ucx: %s from rank %d: the message is longer "
                         "than the %zu-byte buffer (%s)", what, r->peer, r->len, u->last_ucs);
    }
    if (u->aborted)
        return l3d_error(u->ctx, L3D_ERR_PEER_FAILED, "ucx: %s with rank %d ended because this "
                         "rank (rank %d) aborted", what, r->peer, u->rank);
    return l3d_ucx_error(u, r->peer, r->status, what);
}

l3d_status l3d_ucx_test(l3d_transport_t *tp, l3d_tp_request_t *req, int *done_p,
                        size_t *len_p) {
    l3d_ucx_t *u = tp->priv;
    if (!req->done && !req->abandoned) l3d_ucx_progress_all(u);
    if (!req->done && !req->abandoned) {
        *done_p = 0;
        return L3D_OK;
    }
    *done_p = 1;
    if (len_p) *len_p = req->len;
    l3d_status st = finish_status(u, req);
    if (req->done) req_put(u, req);
    else req->orphan = 1;
    return st;
}

l3d_status l3d_ucx_progress(l3d_transport_t *tp) {
    l3d_ucx_progress_all(tp->priv);
    return L3D_OK;
}

// Waits (progressing) until the request is done or `secs` pass.
static void wait_done(l3d_ucx_t *u, l3d_tp_request_t *r, double secs) {
    double deadline = l3d_ucx_now() + secs;
    while (!r->done && !r->abandoned && l3d_ucx_now() < deadline) l3d_ucx_progress_all(u);
}

void l3d_ucx_cancel(l3d_transport_t *tp, l3d_tp_request_t *req) {
    l3d_ucx_t *u = tp->priv;
    if (!req->done && !req->abandoned && req->ucx) {
        if (!req->cancelling) {
            req->cancelling = 1;
            ucp_request_cancel(u->worker, req->ucx);  // a receive not yet matched ends now
        }
        if (req->is_send && !req->done) {
            // UCP 1.13 cannot take back a send in flight (ucp_request_cancel ignores sends).
            // Give it a moment to finish; otherwise the only way to get the buffer back is to
            // close the endpoint, which ends the link to that peer for good.
            wait_done(u, req, 0.05);
            if (!req->done) {
                l3d_ucx_peer_fail(u, req->peer, "a send to it was cancelled", L3D_LOG_WARN);
                l3d_ucx_progress_all(u);  // the sweep closes the endpoint
            }
        }
        // A receive matched to a rendezvous in progress finishes by itself shortly. A peer
        // that let one cancel wait its second (stopped, not dead) gets no second wait: a
        // failing rank cancels all its requests with it, one after the other.
        l3d_ucx_peer_t *p = req->peer >= 0 && req->peer < u->nranks ? &u->peers[req->peer] : NULL;
        wait_done(u, req, p && p->stuck ? 0.0 : 1.0);
        if (!req->done && !req->abandoned && !(p && p->stuck)) {
            l3d_log(u->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM,
                    "ucx: cancelling a %s with rank %d did not finish within 1 s; its request "
                    "(and any later one with it) is released when ucx completes it",
                    req->is_send ? "send" : "recv", req->peer);
            if (p) p->stuck = 1;
        }
    }
    if (req->done) {
        req_put(u, req);
    } else {
        req->abandoned = 1;
        req->orphan = 1;
    }
}
