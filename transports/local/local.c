// The in-process transport: the ranks of a world are threads of one process sharing a hub.
// This file is the point-to-point half; local_coll.c has the native collectives that read
// peers' buffers directly.
//
// Matching: every receiver has a queue of unmatched sends addressed to it and a queue of its
// unmatched receives, under one mutex. isend looks for a matching receive in the receiver's
// queue, irecv for a matching send in its own; whichever comes second takes both envelopes out
// of the queues and does the single memcpy from the sender's buffer into the receiver's, outside
// the lock, then marks both done. Rendezvous: a send completes when it is matched (core
// schedules always post the receives they need). Same (source, tag) matches in posting order
// because queues are FIFO and the first match wins.
//
// Failure: abort (or fini) marks the rank gone in the hub; queued envelopes involving it fail
// with L3D_ERR_PEER_FAILED "rank N aborted", and so does any later isend/irecv towards it.
#define _GNU_SOURCE  // PTHREAD_MUTEX_ADAPTIVE_NP
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "transports/local/local.h"

static local_ep_t *ep_of(const l3d_transport_t *tp) { return tp->priv; }

static void list_append(lreq_t **head, lreq_t *r) {
    r->next = NULL;
    while (*head) head = &(*head)->next;
    *head = r;
}

static int list_remove(lreq_t **head, lreq_t *r) {
    for (; *head; head = &(*head)->next)
        if (*head == r) {
            *head = r->next;
            return 1;
        }
    return 0;
}

static void complete(lreq_t *r, l3d_status st, size_t got) {
    r->st = st;
    r->got = got;
    atomic_store_explicit(&r->state, ST_DONE, memory_order_release);
}

static void fail_req(lreq_t *r, int rank, int why) {
    r->why_rank = rank;
    r->why = why;
    complete(r, L3D_ERR_PEER_FAILED, 0);
}

// Copies a matched pair (both already out of the queues) and completes them.
static void deliver(lreq_t *s, lreq_t *r) {
    if (s->len > r->len) {
        s->why = r->why = -1;
        s->why_rank = r->why_rank = -1;
        complete(s, L3D_ERR_INTERNAL, 0);
        complete(r, L3D_ERR_INTERNAL, 0);
        return;
    }
    size_t len = s->len;  // once complete, the owner may free the envelope at any moment
    if (len) memcpy(r->buf, s->buf, len);
    complete(s, L3D_OK, len);
    complete(r, L3D_OK, len);
}

static l3d_status gone_error(l3d_transport_t *tp, int rank, int why) {
    local_ep_t *ep = ep_of(tp);
    if (rank == ep->rank) snprintf(ep->err, sizeof(ep->err), "this rank aborted");
    else if (why == GONE_LEFT)
        snprintf(ep->err, sizeof(ep->err), "rank %d left (its endpoint was finalized)", rank);
    else snprintf(ep->err, sizeof(ep->err), "rank %d aborted", rank);
    return l3d_error(tp->ctx, L3D_ERR_PEER_FAILED, "%s", ep->err);
}

#define LOCAL_FREE_REQS 64

lreq_t *l3d_local_req_get(local_ep_t *ep, l3d_ctx_t *ctx) {
    lreq_t *r = ep->free_reqs;
    if (!r) return l3d_calloc(ctx, 1, sizeof(*r), "comm");
    ep->free_reqs = r->next;
    ep->nfree_reqs--;
    memset(r, 0, sizeof(*r));
    return r;
}

void l3d_local_req_put(local_ep_t *ep, l3d_ctx_t *ctx, lreq_t *r) {
    if (r->scratch) l3d_local_scratch_put(ep, ctx, r->scratch, r->scratch_len, r->scratch_slot);
    if (ep->nfree_reqs >= LOCAL_FREE_REQS) {
        l3d_free(ctx, r, sizeof(*r), "comm");
        return;
    }
    r->next = ep->free_reqs;
    ep->free_reqs = r;
    ep->nfree_reqs++;
}

// ---- lifetime -----------------------------------------------------------------------------------
static void hub_free(local_hub_t *h) {
    for (int i = 0; i < h->n; i++) pthread_mutex_destroy(&h->q[i].mu);
    l3d_local_coll_hub_free(h);
    pthread_mutex_destroy(&h->cmu);
    l3d_ctx_t *ctx = h->ctx;
    l3d_free(ctx, h->q, (size_t)h->n * sizeof(*h->q), "comm");
    l3d_free(ctx, h->gone, (size_t)h->n * sizeof(*h->gone), "comm");
    l3d_free(ctx, h, sizeof(*h), "comm");
}

static l3d_status local_init(l3d_transport_t *tp, const l3d_transport_params_t *p) {
    if (!p->local_shared)
        return l3d_error(tp->ctx, L3D_ERR_UNSUPPORTED,
                         "the local transport only connects ranks of one process "
                         "(use l3d_comm_create_local)");
    local_hub_t *h = *p->local_shared;
    if (!h) {
        h = l3d_calloc(tp->ctx, 1, sizeof(*h), "comm");
        if (!h) return L3D_ERR_NOMEM;
        h->ctx = tp->ctx;
        h->n = p->nranks;
        h->gone = l3d_calloc(tp->ctx, (size_t)p->nranks, sizeof(*h->gone), "comm");
        h->q = l3d_calloc(tp->ctx, (size_t)p->nranks, sizeof(*h->q), "comm");
        if (!h->gone || !h->q) {
            l3d_free(tp->ctx, h->gone, (size_t)p->nranks * sizeof(*h->gone), "comm");
            l3d_free(tp->ctx, h->q, (size_t)p->nranks * sizeof(*h->q), "comm");
            l3d_free(tp->ctx, h, sizeof(*h), "comm");
            return L3D_ERR_NOMEM;
        }
        // Adaptive: the critical sections are a few list operations, and a contended default
        // mutex puts the waiter to sleep in the kernel (a futex wait and wake cost several
        // times a small collective). It spins briefly first, then sleeps.
        pthread_mutexattr_t ma;
        pthread_mutexattr_init(&ma);
        (void)pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
        for (int i = 0; i < h->n; i++) pthread_mutex_init(&h->q[i].mu, &ma);
        pthread_mutex_init(&h->cmu, &ma);
        pthread_mutexattr_destroy(&ma);
        *p->local_shared = h;
    }
    if (p->nranks != h->n || p->rank < 0 || p->rank >= h->n)
        return l3d_error(tp->ctx, L3D_ERR_INVALID_ARG,
                         "local transport: rank %d of %d in a hub of %d",
                         p->rank, p->nranks, h->n);
    local_ep_t *ep = l3d_calloc(tp->ctx, 1, sizeof(*ep), "comm");
    if (!ep) return L3D_ERR_NOMEM;
    ep->hub = h;
    ep->rank = p->rank;
    ep->devmode = l3d_ctx_settings(tp->ctx)->local_device_buffers;
    atomic_fetch_add(&h->refs, 1);
    tp->priv = ep;
    tp->world_rank = p->rank;
    tp->world_size = p->nranks;
    return L3D_OK;
}

static void wait_copy(lreq_t *r) {
    while (atomic_load_explicit(&r->state, memory_order_acquire) == ST_COPYING) sched_yield();
}

// Marks `me` gone and fails every queued envelope involving it. At fini (`free_own`), the
// envelopes `me` owns are cancelled and freed instead: nobody will test them again.
static void mark_gone(l3d_ctx_t *ctx, local_hub_t *h, int me, int why, int free_own) {
    int expect = GONE_NO;
    if (!atomic_compare_exchange_strong(&h->gone[me], &expect, why) && !free_own) return;
    why = atomic_load(&h->gone[me]);
    for (int q = 0; q < h->n; q++) {
        lqueue_t *Q = &h->q[q];
        pthread_mutex_lock(&Q->mu);
        for (int list = 0; list < 2; list++)
            for (lreq_t **pp = list ? &Q->recvs : &Q->sends; *pp;) {
                lreq_t *r = *pp;
                if (q != me && r->src != me) {
                    pp = &r->next;
                    continue;
                }
                *pp = r->next;
                int mine = r->send ? r->src == me : r->dst == me;
                if (free_own && mine) {
                    if (r->scratch && !r->scratch_slot)  // (cached ones: scratch_fini)
                        l3d_free(ctx, r->scratch, r->scratch_len, "comm");
                    l3d_free(ctx, r, sizeof(*r), "comm");
                } else {
                    fail_req(r, me, why);
                }
            }
        pthread_mutex_unlock(&Q->mu);
    }
}

static void local_fini(l3d_transport_t *tp) {
    local_ep_t *ep = ep_of(tp);
    if (!ep) return;
    local_hub_t *h = ep->hub;
    l3d_local_coll_fini(tp);
    mark_gone(tp->ctx, h, ep->rank, GONE_LEFT, 1);
    l3d_local_scratch_fini(ep, tp->ctx);
    for (lreq_t *r = ep->free_reqs, *next; r; r = next) {
        next = r->next;
        l3d_free(tp->ctx, r, sizeof(*r), "comm");
    }
    l3d_free(tp->ctx, ep, sizeof(*ep), "comm");
    tp->priv = NULL;
    if (atomic_fetch_sub(&h->refs, 1) == 1) hub_free(h);
}

static void local_caps(const l3d_transport_t *tp, l3d_transport_caps_t *c) {
    int dev = ep_of(tp)->devmode;
    // (device buffers: native collectives take device memory only, so the core mirrors a
    // host buffer into a device temporary for them, as for NCCL)
    *c = (l3d_transport_caps_t){.ptr_support = L3D_PTR_HOST | (dev ? L3D_PTR_DEVICE : 0),
                                .coll_ptr_support = dev ? L3D_PTR_DEVICE : 0,
                                .needs_mr = 0,
                                .max_msg = SIZE_MAX,
                                .max_inflight = 1 << 20,
                                .tag_bits = 64,
                                .latency_us = 0.3,
                                .bandwidth_gbs = 8.0};
}

static l3d_status local_addr_get(l3d_transport_t *tp, void *buf, size_t *len_p) {
    int32_t r = ep_of(tp)->rank;
    if (*len_p < sizeof(r)) {
        *len_p = sizeof(r);
        return L3D_ERR_INVALID_ARG;
    }
    memcpy(buf, &r, sizeof(r));
    *len_p = sizeof(r);
    return L3D_OK;
}

static l3d_status local_connect(l3d_transport_t *tp, const void *const *addrs, const size_t *lens) {
    return L3D_OK;  // the hub already joins every rank
}

// ---- point-to-point -----------------------------------------------------------------------------
l3d_status l3d_local_post(l3d_transport_t *tp, int send, int peer, uint64_t tag, void *buf,
                          size_t len, l3d_tp_request_t **req_p) {
    local_ep_t *ep = ep_of(tp);
    local_hub_t *h = ep->hub;
    if (peer < 0 || peer >= h->n)
        return l3d_error(tp->ctx, L3D_ERR_INVALID_ARG, "local transport: peer %d of %d", peer,
                         h->n);
    lreq_t *r = l3d_local_req_get(ep, tp->ctx);
    if (!r) return L3D_ERR_NOMEM;
    r->send = send;
    r->src = send ? ep->rank : peer;
    r->dst = send ? peer : ep->rank;
    r->tag = tag;
    r->buf = buf;
    r->len = len;
    lqueue_t *Q = &h->q[r->dst];
    lreq_t *match = NULL;
    pthread_mutex_lock(&Q->mu);
    int g_me = atomic_load(&h->gone[ep->rank]), g_peer = atomic_load(&h->gone[peer]);
    if (g_me || g_peer) {
        pthread_mutex_unlock(&Q->mu);
        l3d_local_req_put(ep, tp->ctx, r);
        return g_me ? gone_error(tp, ep->rank, g_me) : gone_error(tp, peer, g_peer);
    }
    lreq_t **other = send ? &Q->recvs : &Q->sends;
    for (lreq_t *m = *other; m; m = m->next)
        if (m->src == r->src && m->tag == tag) {
            match = m;
            break;
        }
    if (match) {
        list_remove(other, match);
        atomic_store(&match->state, ST_COPYING);
        atomic_store(&r->state, ST_COPYING);
    } else {
        list_append(send ? &Q->sends : &Q->recvs, r);
    }
    pthread_mutex_unlock(&Q->mu);
    if (match) {
        if (send) deliver(r, match);
        else deliver(match, r);
    }
    *req_p = r;
    return L3D_OK;
}

static l3d_status local_isend(l3d_transport_t *tp, int peer, uint64_t tag, const void *buf,
                              size_t len, void *mr, l3d_tp_request_t **req_p) {
    if (ep_of(tp)->devmode && len && l3d_local_is_dev(ep_of(tp), buf))
        return l3d_local_dev_p2p(tp, 1, peer, tag, (void *)buf, len, req_p);
    return l3d_local_post(tp, 1, peer, tag, (void *)buf, len, req_p);
}

static l3d_status local_irecv(l3d_transport_t *tp, int peer, uint64_t tag, void *buf, size_t len,
                              void *mr, l3d_tp_request_t **req_p) {
    if (ep_of(tp)->devmode && len && l3d_local_is_dev(ep_of(tp), buf))
        return l3d_local_dev_p2p(tp, 0, peer, tag, buf, len, req_p);
    return l3d_local_post(tp, 0, peer, tag, buf, len, req_p);
}

static l3d_status local_test(l3d_transport_t *tp, l3d_tp_request_t *r, int *done_p, size_t *len_p) {
    if (r->kind != LREQ_P2P) {
        if (len_p) *len_p = 0;
        return l3d_local_coll_test(tp, r, done_p);
    }
    if (atomic_load_explicit(&r->state, memory_order_acquire) != ST_DONE) {
        *done_p = 0;
        return L3D_OK;
    }
    *done_p = 1;
    l3d_status st = r->st;
    if (len_p) *len_p = r->got;
    if (st == L3D_ERR_INTERNAL)
        st = l3d_error(tp->ctx, st, "local transport: message truncated between rank %d and %d",
                       r->src, r->dst);
    else if (st < 0)
        st = gone_error(tp, r->why_rank, r->why);
    else if (r->dev_out)
        st = l3d_local_dev_finish(tp, r, r->got);
    l3d_local_req_put(ep_of(tp), tp->ctx, r);
    return st;
}

static l3d_status local_progress(l3d_transport_t *tp) { return L3D_OK; }

static void local_cancel(l3d_transport_t *tp, l3d_tp_request_t *r) {
    if (r->kind != LREQ_P2P) {
        l3d_local_coll_cancel(tp, r);
        return;
    }
    local_hub_t *h = ep_of(tp)->hub;
    lqueue_t *Q = &h->q[r->dst];
    pthread_mutex_lock(&Q->mu);
    if (atomic_load(&r->state) == ST_QUEUED) list_remove(r->send ? &Q->sends : &Q->recvs, r);
    pthread_mutex_unlock(&Q->mu);
    wait_copy(r);  // a peer copying from/into the buffer finishes first
    l3d_local_req_put(ep_of(tp), tp->ctx, r);
}

static void local_abort(l3d_transport_t *tp) {
    local_ep_t *ep = ep_of(tp);
    if (ep) mark_gone(tp->ctx, ep->hub, ep->rank, GONE_ABORTED, 0);
}

static int local_waiting_on(const l3d_transport_t *tp, const l3d_tp_request_t *r, char *buf,
                            size_t len) {
    if (r->kind != LREQ_P2P) return l3d_local_coll_waiting_on(tp, r, buf, len);
    int peer = r->send ? r->dst : r->src;
    snprintf(buf, len, "rank %d has not matched the %s", peer, r->send ? "send" : "recv");
    return peer;
}

static const char *local_strerror(const l3d_transport_t *tp) {
    const local_ep_t *ep = ep_of(tp);
    return ep ? ep->err : "";
}

const l3d_transport_ops_t l3d_local_transport_ops = {
    .abi_version = L3D_TRANSPORT_ABI_VERSION,
    .size = sizeof(l3d_transport_ops_t),
    .name = "local",
    .init = local_init,
    .fini = local_fini,
    .caps = local_caps,
    .addr_get = local_addr_get,
    .connect = local_connect,
    .mr_reg = NULL,
    .mr_dereg = NULL,
    .isend = local_isend,
    .irecv = local_irecv,
    .test = local_test,
    .progress = local_progress,
    .cancel = local_cancel,
    .abort = local_abort,
    .strerror = local_strerror,
    .waiting_on = local_waiting_on,
    .set_stream = l3d_local_set_stream,
    .coll = &l3d_local_coll_ops,
};
