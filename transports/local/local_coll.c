// Native collectives of the in-process transport: the ranks are threads of one process, so a
// rank can read its peers' send buffers and write their receive buffers directly. No message,
// no staging copy: the memory traffic is the floor of a shared-memory collective.
//
// A call meets in a rendezvous record (lrdv_t) keyed by (seq, first member). Each member
// publishes its buffer pointers and arrives; once all n have arrived, each member does its
// share of the work, then counts itself finished; a member's request completes when all n
// have finished (until then a peer may still read its sendbuf or write its recvbuf).
//
//   allreduce       rank i owns block i of the count: reads block i of every sendbuf, reduces
//                   them in member order (0, 1, ..., n-1; float32 partials for the half types,
//                   rounded once), writes the result to block i of every recvbuf. Each rank
//                   reads its share of the inputs once and writes its share of the outputs
//                   once: n·B read and n·B written in all, the bound of docs/comm.md.
//   reduce_scatter  rank i reduces block i of every sendbuf into its own recvbuf.
//   allgather       rank i copies every peer's sendbuf into its recvbuf (pull).
//   broadcast       every non-root copies the root's sendbuf into its recvbuf (pull).
//
// Every element is reduced by exactly one rank in a fixed order, so the bits depend only on
// (n, dt, op) and the values, never on timing or on how blocks are split.
//
// Failure: while waiting, a member that is gone (aborted or finalized) fails the request with
// L3D_ERR_PEER_FAILED naming it. A member that gives up (cancel, failure) marks the record
// abandoned, waits for members already working on its buffers to finish (they never block),
// and after that nobody starts work on the record; the others fail naming it.
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/comm/reduce.h"
#include "transports/local/local.h"

static const char *const lc_name[4] = {"allreduce", "reduce_scatter", "allgather",
                                           "broadcast"};

enum { PH_ARRIVED = 0, PH_WORKED = 1 };

struct lrdv {
    lrdv_t *next;
    int cap;             // the arrays' length (a record is reused for calls of n <= cap)
    uint64_t seq;
    int first, n, kind;
    size_t count;
    l3d_dtype dt;
    l3d_redop op;
    int root;
    int *ranks;          // [n] world ranks
    const void **send;   // [n]
    void **recv;         // [n]
    atomic_int *mst;     // [n] member state: 0 not arrived, 1 arrived, 2 finished its work
    atomic_int arrived, working, finished, refs;
    int joined;          // members that have started the call (mismatched ones too), under cmu
    atomic_int abandoned;  // 0, or 1 + the member index that gave up
    char why[96];          // abandon reason (mismatch detail), written before `abandoned`
};

static local_ep_t *ep_of(const l3d_transport_t *tp) { return tp->priv; }

l3d_status l3d_local_fail(l3d_transport_t *tp, l3d_status st, const char *fmt, ...) {
    local_ep_t *ep = ep_of(tp);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ep->err, sizeof(ep->err), fmt, ap);
    va_end(ap);
    return l3d_error(tp->ctx, st, "%s", ep->err);
}

static void rdv_free(l3d_ctx_t *ctx, lrdv_t *d) {
    size_t n = (size_t)d->cap;
    l3d_free(ctx, d->ranks, n * sizeof(*d->ranks), "comm");
    l3d_free(ctx, d->send, n * sizeof(*d->send), "comm");
    l3d_free(ctx, d->recv, n * sizeof(*d->recv), "comm");
    l3d_free(ctx, d->mst, n * sizeof(*d->mst), "comm");
    l3d_free(ctx, d, sizeof(*d), "comm");
}

#define LOCAL_FREE_RDVS 16

// A record for a call of n members, from the free list if one is large enough (under cmu).
static lrdv_t *rdv_get(local_hub_t *h, l3d_ctx_t *ctx, int n) {
    for (lrdv_t **pp = &h->free_rdvs; *pp; pp = &(*pp)->next) {
        lrdv_t *d = *pp;
        if (d->cap < n) continue;
        *pp = d->next;
        h->nfree_rdvs--;
        int cap = d->cap;
        int *ranks = d->ranks;
        const void **send = d->send;
        void **recv = d->recv;
        atomic_int *mst = d->mst;
        memset(send, 0, (size_t)cap * sizeof(*send));
        memset(recv, 0, (size_t)cap * sizeof(*recv));
        for (int j = 0; j < cap; j++) atomic_init(&mst[j], 0);
        *d = (lrdv_t){.cap = cap, .ranks = ranks, .send = send, .recv = recv, .mst = mst};
        return d;
    }
    lrdv_t *d = l3d_calloc(ctx, 1, sizeof(*d), "comm");
    if (!d) return NULL;
    d->cap = n;
    d->ranks = l3d_calloc(ctx, (size_t)n, sizeof(*d->ranks), "comm");
    d->send = l3d_calloc(ctx, (size_t)n, sizeof(*d->send), "comm");
    d->recv = l3d_calloc(ctx, (size_t)n, sizeof(*d->recv), "comm");
    d->mst = l3d_calloc(ctx, (size_t)n, sizeof(*d->mst), "comm");
    if (!d->ranks || !d->send || !d->recv || !d->mst) {
        rdv_free(ctx, d);
        return NULL;
    }
    return d;
}

// Drops this member's reference. The record goes when no member holds it and all n have
// joined: until then it stays as a tombstone, so a member that starts an abandoned call late
// finds it and fails at once instead of waiting alone. (A member that never starts, because
// it died, leaves the record to hub teardown.)
static void rdv_release(local_hub_t *h, lrdv_t *d) {
    pthread_mutex_lock(&h->cmu);
    int last = atomic_fetch_sub(&d->refs, 1) == 1 && d->joined == d->n, keep = 0;
    if (last) {
        for (lrdv_t **pp = &h->rdvs; *pp; pp = &(*pp)->next)
            if (*pp == d) {
                *pp = d->next;
                break;
            }
        if ((keep = h->nfree_rdvs < LOCAL_FREE_RDVS)) {
            d->next = h->free_rdvs;
            h->free_rdvs = d;
            h->nfree_rdvs++;
        }
    }
    pthread_mutex_unlock(&h->cmu);
    if (last && !keep) rdv_free(h->ctx, d);
}

// Gives up on the record: no member starts work after this returns, and none is still
// working on it.
static void rdv_abandon(local_hub_t *h, lrdv_t *d, int me, const char *why) {
    int expect = 0;
    pthread_mutex_lock(&h->cmu);  // the first reason wins; readers take it under the lock
    if (atomic_compare_exchange_strong(&d->abandoned, &expect, 1 + me) && why)
        snprintf(d->why, sizeof(d->why), "%s", why);
    pthread_mutex_unlock(&h->cmu);
    while (atomic_load(&d->working) > 0) sched_yield();
}

static void ep_unlink(local_ep_t *ep, lreq_t *r) {
    for (lreq_t **pp = &ep->colls; *pp; pp = &(*pp)->cnext)
        if (*pp == r) {
            *pp = r->cnext;
            return;
        }
}

static void req_drop(l3d_transport_t *tp, lreq_t *r) {
    local_ep_t *ep = ep_of(tp);
    ep_unlink(ep, r);
    rdv_release(ep->hub, r->rdv);
    l3d_local_req_put(ep, tp->ctx, r);
}

// ---- the work of one member ------------------------------------------------------------------
// out (dt) = the reduction of m elements at byte offset boff of src[0], ..., src[n-1], in that
// order (partials in the wire type, half types rounded once), as the core's shared-segment
// path for small calls reduces its slots: the same bits whatever the size. out may be ep->acc
// or ep->aux only as the block the partials end in; m <= L3D_LOCAL_BLOCK.
static void local_reduce(local_ep_t *ep, const void *const *src, int n, l3d_dtype dt,
                         l3d_redop op, size_t boff, size_t m, void *out) {
    l3d_dtype wdt = l3d_reduce_wire_type(dt);
    void *acc = ep->acc;
    if (wdt == dt) {
        l3d_reduce_apply(acc, (const char *)src[0] + boff, (const char *)src[1] + boff, m, wdt,
                         op);
        for (int j = 2; j < n; j++)
            l3d_reduce_apply(acc, acc, (const char *)src[j] + boff, m, wdt, op);
    } else {
        float *facc = acc, *wid = (float *)ep->aux;
        l3d_reduce_to_f32(facc, (const char *)src[0] + boff, m, dt);
        for (int j = 1; j < n; j++) {
            l3d_reduce_to_f32(wid, (const char *)src[j] + boff, m, dt);
            l3d_reduce_apply(facc, facc, wid, m, wdt, op);
        }
    }
    l3d_reduce_final(out, acc, m, dt, op, n);
}

// out (dt) = reduction over members of elements [off, off+m) of every sendbuf (at byte offset
// base in each), m <= L3D_LOCAL_BLOCK. out must not overlap a range still to be read.
static void reduce_block(local_ep_t *ep, const lrdv_t *d, size_t base, size_t off, size_t m,
                         void *out) {
    size_t boff = base + off * l3d_dtype_size(d->dt);
    local_reduce(ep, (const void *const *)d->send, d->n, d->dt, d->op, boff, m, out);
}

static void block_of(size_t count, int n, int i, size_t *off, size_t *cnt) {
    size_t q = count / (size_t)n, r = count % (size_t)n;
    *cnt = q + ((size_t)i < r);
    *off = q * (size_t)i + ((size_t)i < r ? (size_t)i : r);
}

static void work(local_ep_t *ep, const lrdv_t *d, int me) {
    size_t esz = l3d_dtype_size(d->dt);
    int n = d->n;
    switch (d->kind) {
    case LC_ALLREDUCE: {
        size_t off, cnt;
        block_of(d->count, n, me, &off, &cnt);
        for (size_t o = off; o < off + cnt; o += L3D_LOCAL_BLOCK) {
            size_t m = L3D_MIN((size_t)L3D_LOCAL_BLOCK, off + cnt - o);
            // Reduced elements go to the L1 block first: in place, recvbuf j is sendbuf j and
            // the block of sendbuf j must be read by this rank before any recvbuf is written.
            void *blk = d->dt == l3d_reduce_wire_type(d->dt) ? (void *)ep->acc : (void *)ep->aux;
            reduce_block(ep, d, 0, o, m, blk);
            for (int j = 0; j < n; j++) memcpy((char *)d->recv[j] + o * esz, blk, m * esz);
        }
        break;
    }
    case LC_REDUCE_SCATTER: {
        size_t base = (size_t)me * d->count * esz;
        for (size_t o = 0; o < d->count; o += L3D_LOCAL_BLOCK) {
            size_t m = L3D_MIN((size_t)L3D_LOCAL_BLOCK, d->count - o);
            void *blk = d->dt == l3d_reduce_wire_type(d->dt) ? (void *)ep->acc : (void *)ep->aux;
            reduce_block(ep, d, base, o, m, blk);
            memcpy((char *)d->recv[me] + o * esz, blk, m * esz);
        }
        break;
    }
    case LC_ALLGATHER: {
        size_t bytes = d->count * esz;
        for (int j = 0; j < n; j++) {
            char *dst = (char *)d->recv[me] + (size_t)j * bytes;
            if (dst != d->send[j]) memcpy(dst, d->send[j], bytes);
        }
        break;
    }
    default: {  // broadcast
        const void *src = d->send[d->root];
        if (d->recv[me] != src) memcpy(d->recv[me], src, d->count * esz);
        break;
    }
    }
}

// ---- start ----------------------------------------------------------------------------------
l3d_status l3d_local_coll_start(l3d_transport_t *tp, int kind, const l3d_tp_coll_args_t *a,
                                l3d_tp_request_t **req_p) {
    local_ep_t *ep = ep_of(tp);
    local_hub_t *h = ep->hub;
    int n = a->n;
    if (n < 2 || a->me < 0 || a->me >= n || a->ranks[a->me] != ep->rank)
        return l3d_local_fail(tp, L3D_ERR_INVALID_ARG,
                              "local %s: member %d of %d is not rank %d", lc_name[kind], a->me,
                              n, ep->rank);
    lreq_t *r = l3d_local_req_get(ep, tp->ctx);
    if (!r) return L3D_ERR_NOMEM;
    pthread_mutex_lock(&h->cmu);
    lrdv_t *d = h->rdvs;
    while (d && !(d->seq == a->seq && d->first == a->ranks[0])) d = d->next;
    if (!d) {
        d = rdv_get(h, tp->ctx, n);
        if (!d) {
            pthread_mutex_unlock(&h->cmu);
            l3d_local_req_put(ep, tp->ctx, r);
            return L3D_ERR_NOMEM;
        }
        d->seq = a->seq;
        d->first = a->ranks[0];
        d->n = n;
        d->kind = kind;
        d->count = a->count;
        d->dt = a->dt;
        d->op = a->op;
        d->root = a->root;
        memcpy(d->ranks, a->ranks, (size_t)n * sizeof(*d->ranks));
        d->next = h->rdvs;
        h->rdvs = d;
    }
    atomic_fetch_add(&d->refs, 1);
    d->joined++;
    char mismatch[96] = "";
    if (d->n != n || d->kind != kind || d->count != a->count || d->dt != a->dt ||
        (kind != LC_ALLGATHER && kind != LC_BROADCAST && d->op != a->op) ||
        (kind == LC_BROADCAST && d->root != a->root))
        snprintf(mismatch, sizeof(mismatch),
                 "rank %d called %s(count %zu, %s) where a peer called %s(count %zu, %s)",
                 ep->rank, lc_name[kind], a->count, l3d_dtype_name(a->dt), lc_name[d->kind],
                 d->count, l3d_dtype_name(d->dt));
    else {
        d->send[a->me] = a->sendbuf;
        d->recv[a->me] = a->recvbuf;
        atomic_store(&d->mst[a->me], 1);
    }
    pthread_mutex_unlock(&h->cmu);
    r->kind = LREQ_COLL;
    r->rdv = d;
    r->me = a->me;
    r->phase = PH_ARRIVED;
    if (mismatch[0]) {
        rdv_abandon(h, d, a->me, mismatch);
        rdv_release(h, d);
        l3d_local_req_put(ep, tp->ctx, r);
        return l3d_local_fail(tp, L3D_ERR_INVALID_ARG, "local %s: %s", lc_name[kind], mismatch);
    }
    atomic_fetch_add(&d->arrived, 1);  // seq_cst, after the pointers (mutex released above)
    r->cnext = ep->colls;
    ep->colls = r;
    *req_p = r;
    return L3D_OK;
}

// Device buffers (L3D_LOCAL_DEVICE_BUFFERS) go through local_device.c, which calls back here.
static l3d_status start(l3d_transport_t *tp, int kind, const l3d_tp_coll_args_t *a,
                        l3d_tp_request_t **req_p) {
    if (ep_of(tp)->devmode) return l3d_local_dev_coll(tp, kind, a, req_p);
    return l3d_local_coll_start(tp, kind, a, req_p);
}

static l3d_status c_allreduce(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                              l3d_tp_request_t **req_p) {
    return start(tp, LC_ALLREDUCE, a, req_p);
}
static l3d_status c_reduce_scatter(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                                   l3d_tp_request_t **req_p) {
    return start(tp, LC_REDUCE_SCATTER, a, req_p);
}
static l3d_status c_allgather(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                              l3d_tp_request_t **req_p) {
    return start(tp, LC_ALLGATHER, a, req_p);
}
static l3d_status c_broadcast(l3d_transport_t *tp, const l3d_tp_coll_args_t *a,
                              l3d_tp_request_t **req_p) {
    return start(tp, LC_BROADCAST, a, req_p);
}

const l3d_transport_coll_ops_t l3d_local_coll_ops = {
    .allreduce = c_allreduce,
    .reduce_scatter = c_reduce_scatter,
    .allgather = c_allgather,
    .broadcast = c_broadcast,
};

// ---- test / cancel ----------------------------------------------------------------------------
int l3d_local_gone_cause(const local_ep_t *ep, const int *ranks, int n, const char *what,
                         char *cause, size_t len) {
    for (int j = 0; j < n; j++) {
        int g = ranks[j], why = atomic_load(&ep->hub->gone[g]);
        if (!why) continue;
        if (g == ep->rank) snprintf(cause, len, "this rank aborted");
        else
            snprintf(cause, len, "rank %d %s during the %s", g,
                     why == GONE_LEFT ? "left (its endpoint was finalized)" : "aborted", what);
        return 1;
    }
    return 0;
}

// Fails this rank's part: the record is abandoned with `cause` (peers fail with it too).
static l3d_status fail_req(l3d_transport_t *tp, lreq_t *r, const char *cause) {
    local_ep_t *ep = ep_of(tp);
    snprintf(ep->err, sizeof(ep->err), "%s", cause);
    rdv_abandon(ep->hub, r->rdv, r->me, cause);
    req_drop(tp, r);
    return l3d_error(tp->ctx, L3D_ERR_PEER_FAILED, "%s", ep->err);
}

l3d_status l3d_local_coll_test(l3d_transport_t *tp, lreq_t *r, int *done_p) {
    local_ep_t *ep = ep_of(tp);
    lrdv_t *d = r->rdv;
    *done_p = 0;
    if (r->phase == PH_ARRIVED && atomic_load(&d->arrived) == d->n) {
        atomic_fetch_add(&d->working, 1);
        if (!atomic_load(&d->abandoned)) {
            work(ep, d, r->me);
            atomic_store(&d->mst[r->me], 2);
            atomic_fetch_add(&d->finished, 1);
            r->phase = PH_WORKED;
        }
        atomic_fetch_sub(&d->working, 1);
    }
    if (atomic_load(&d->finished) == d->n) {
        *done_p = 1;
        l3d_status st = r->dev_out ? l3d_local_dev_finish(tp, r, r->out_len) : L3D_OK;
        req_drop(tp, r);
        return st;
    }
    char cause[96];
    if (l3d_local_gone_cause(ep, d->ranks, d->n, lc_name[d->kind], cause, sizeof(cause)))
        return fail_req(tp, r, cause);
    // A member that abandoned with a reason (a mismatched call) fails the others now; one that
    // merely cancelled (its own timeout or failure) leaves them to their own timeout and the
    // core's failure notices, which name the rank that actually stopped.
    if (atomic_load(&d->abandoned)) {
        char why_s[sizeof(d->why)];
        pthread_mutex_lock(&ep->hub->cmu);
        memcpy(why_s, d->why, sizeof(why_s));
        pthread_mutex_unlock(&ep->hub->cmu);
        if (why_s[0]) return fail_req(tp, r, why_s);
    }
    return L3D_OK;
}

int l3d_local_coll_waiting_on(const l3d_transport_t *tp, const lreq_t *r, char *buf,
                               size_t len) {
    const lrdv_t *d = r->rdv;
    int lvl = atomic_load(&d->arrived) < d->n ? 1 : 2;  // waiting for arrivals, or for work
    for (int j = 0; j < d->n; j++)
        if (atomic_load(&d->mst[j]) < lvl) {
            snprintf(buf, len, "rank %d has not %s it", d->ranks[j],
                     lvl == 1 ? "started" : "finished");
            return d->ranks[j];
        }
    if (len) buf[0] = 0;
    return -1;
}

void l3d_local_coll_cancel(l3d_transport_t *tp, lreq_t *r) {
    rdv_abandon(ep_of(tp)->hub, r->rdv, r->me, NULL);
    req_drop(tp, r);
}

void l3d_local_coll_fini(l3d_transport_t *tp) {
    local_ep_t *ep = ep_of(tp);
    while (ep->colls) l3d_local_coll_cancel(tp, ep->colls);
}

void l3d_local_coll_hub_free(local_hub_t *h) {
    for (int list = 0; list < 2; list++)
        for (lrdv_t *d = list ? h->free_rdvs : h->rdvs, *next; d; d = next) {
            next = d->next;
            rdv_free(h->ctx, d);
        }
    h->rdvs = h->free_rdvs = NULL;
}
