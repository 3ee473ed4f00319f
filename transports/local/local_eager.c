// Small native collectives of the in-process transport: members exchange the data, not
// pointers to it.
//
// The rendezvous path (local_coll.c) lets a peer read my sendbuf and write my recvbuf, so a
// call costs a mutex, a shared record, and a wait until every member has finished with my
// buffers: a handful of cache lines that each cross between cores. Where a line takes ~0.5 us
// to move (this project's 2-core VMs: a two-thread ping-pong on one atomic is ~1 us round
// trip) an 8-byte allreduce took 4 us, against 0.5 us for OpenMPI's shared-memory path.
//
// Here every communicator that makes an eager call has a legroup_t: per member, LE_RING slots
// (a header and up to LE_DATA bytes; the header and the first LE_DATA_IN_LINE bytes share one
// cache line) and a `done` counter on a line of its own. Members make the same calls in the
// same order, so call k of the communicator's eager calls is call k on every member, and uses
// slot k mod LE_RING of each:
//
//   publish   copy my contribution into my slot, then store its seq = k + 1 (release);
//   complete  once every slot I read shows seq k + 1 (acquire) and my call k - 1 completed:
//             compute my output from the slots, store done = k + 1 (release).
//
// A member writes slot k mod LE_RING again (call k + LE_RING) only once every member's done
// is past k, so nobody still reads it. In a loop of blocking calls that already holds when a
// call starts (every member published call k + 1 only after completing call k), so the check
// usually reads only this member's cached bound. The critical path of a small allreduce is
// one line from each peer: its header, with the data in the same line up to 32 bytes.
//
// Which calls (l3d_local_eager_fits): the per-member contribution fits a slot and a member
// reads at most LE_READ bytes of slots. The test depends only on (kind, n, count, dt), which
// the members of a matching call share, so they all take the same path. A mismatched call on
// the same side of the limit fails at once naming both shapes; one whose sizes fall on both
// sides meets nobody and ends by the core's timeout, naming the rank that has not started it.
//
// Reductions run in member order over the slots, exactly as the rendezvous path runs over the
// sendbufs (l3d_local_reduce): the same bits whatever the path.
//
// Lifetime: a group stays until the hub goes (the transport is not told when a communicator
// is destroyed): LE_RING * LE_SLOT bytes per member of every communicator that made a call.
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "transports/local/local.h"

#define LE_RING 4             // eager calls in flight per communicator before one waits
#define LE_SLOT 4096          // bytes of one slot: header and data
#define LE_HDR 32
#define LE_DATA (LE_SLOT - LE_HDR)
#define LE_DATA_IN_LINE (64 - LE_HDR)
#define LE_READ (16u << 10)   // slot bytes one member reads per call, at most

typedef struct leslot {
    _Atomic uint64_t seq;  // 1 + k once the header and data below hold call k
    uint64_t count;
    int32_t kind, dt, op, root;
    unsigned char data[LE_DATA];
} leslot_t;
_Static_assert(offsetof(leslot_t, data) == LE_HDR && sizeof(leslot_t) == LE_SLOT, "slot");

typedef struct ledone {
    _Alignas(64) _Atomic uint64_t v;  // calls this member has completed (all of 0..v-1)
} ledone_t;

struct legroup {
    legroup_t *next;
    uint32_t id;
    int first, n;
    int *ranks;       // [n] world ranks
    void *mem;        // the allocation the arrays below live in (memlen bytes)
    size_t memlen;
    leslot_t *slot;   // [n * LE_RING]: member j's slot of call k at j * LE_RING + k % LE_RING
    ledone_t *done;   // [n]
};

// This member's view of one communicator's group.
struct lestate {
    lestate_t *next;
    legroup_t *g;
    uint32_t id;
    int first;
    uint64_t started, done;  // calls started, calls completed (in order) by this member
    uint64_t min_done;    // every member's done was at least this when last looked at
    int broken;           // a call failed or was cancelled: the ring may be stuck
    const void **src;     // [g->n] scratch: the slots a reduction reads
};

static void state_free(l3d_ctx_t *ctx, lestate_t *s) {
    if (s->g) l3d_free(ctx, s->src, (size_t)s->g->n * sizeof(*s->src), "comm");
    l3d_free(ctx, s, sizeof(*s), "comm");
}

static leslot_t *slot_of(const legroup_t *g, int j, uint64_t k) {
    return &g->slot[(size_t)j * LE_RING + k % LE_RING];
}

// Bytes a member publishes for a call (reduce_scatter: all n blocks; broadcast: the root's).
static size_t pub_bytes(int kind, size_t bytes, int n, int is_root) {
    if (kind == LC_REDUCE_SCATTER) return (size_t)n * bytes;
    if (kind == LC_BROADCAST && !is_root) return 0;
    return bytes;
}

int l3d_local_eager_fits(int kind, const l3d_tp_coll_args_t *a) {
    size_t b = a->count * l3d_dtype_size(a->dt);
    if (b > LE_DATA) return 0;
    size_t read = kind == LC_BROADCAST ? b : (size_t)a->n * b;
    return pub_bytes(kind, b, a->n, 1) <= LE_DATA && read <= LE_READ;
}

// ---- groups --------------------------------------------------------------------------------
static void group_free(l3d_ctx_t *ctx, legroup_t *g) {
    l3d_free(ctx, g->ranks, (size_t)g->n * sizeof(*g->ranks), "comm");
    l3d_free(ctx, g->mem, g->memlen, "comm");
    l3d_free(ctx, g, sizeof(*g), "comm");
}

static legroup_t *group_new(l3d_ctx_t *ctx, uint32_t id, const l3d_tp_coll_args_t *a) {
    legroup_t *g = l3d_calloc(ctx, 1, sizeof(*g), "comm");
    if (!g) return NULL;
    size_t n = (size_t)a->n;
    g->id = id;
    g->first = a->ranks[0];
    g->n = a->n;
    g->memlen = n * LE_RING * sizeof(leslot_t) + n * sizeof(ledone_t) + 64;
    g->ranks = l3d_calloc(ctx, n, sizeof(*g->ranks), "comm");
    g->mem = l3d_calloc(ctx, 1, g->memlen, "comm");  // zero: no slot holds a call yet
    if (!g->ranks || !g->mem) {
        group_free(ctx, g);
        return NULL;
    }
    memcpy(g->ranks, a->ranks, n * sizeof(*g->ranks));
    uintptr_t p = ((uintptr_t)g->mem + 63) & ~(uintptr_t)63;  // slots and counters on lines
    g->slot = (leslot_t *)p;
    g->done = (ledone_t *)(p + n * LE_RING * sizeof(leslot_t));
    return g;
}

// This member's state for the communicator of `a` (the group found or made under cmu).
static l3d_status state_of(l3d_transport_t *tp, const l3d_tp_coll_args_t *a, lestate_t **sp) {
    local_ep_t *ep = tp->priv;
    local_hub_t *h = ep->hub;
    uint32_t id = (uint32_t)(a->seq >> 32);
    int first = a->ranks[0];
    for (lestate_t **pp = &ep->es, *s; (s = *pp); pp = &s->next)
        if (s->id == id && s->first == first) {
            if (pp != &ep->es) {  // most recent first: a layer alternates between a few
                *pp = s->next;
                s->next = ep->es;
                ep->es = s;
            }
            *sp = s;
            return L3D_OK;
        }
    lestate_t *s = l3d_calloc(tp->ctx, 1, sizeof(*s), "comm");
    if (!s) return L3D_ERR_NOMEM;
    pthread_mutex_lock(&h->cmu);
    legroup_t *g = h->egroups;
    while (g && !(g->id == id && g->first == first)) g = g->next;
    if (!g && (g = group_new(h->ctx, id, a))) {
        g->next = h->egroups;
        h->egroups = g;
    }
    pthread_mutex_unlock(&h->cmu);
    if (!g) {
        state_free(tp->ctx, s);
        return L3D_ERR_NOMEM;
    }
    if (g->n != a->n) {
        state_free(tp->ctx, s);
        return l3d_local_fail(tp, L3D_ERR_INVALID_ARG,
                              "local transport: communicator %u of %d members has %d elsewhere",
                              id, a->n, g->n);
    }
    s->g = g;
    s->src = l3d_calloc(tp->ctx, (size_t)g->n, sizeof(*s->src), "comm");
    if (!s->src) {
        state_free(tp->ctx, s);
        return L3D_ERR_NOMEM;
    }
    s->id = id;
    s->first = first;
    s->next = ep->es;
    ep->es = s;
    *sp = s;
    return L3D_OK;
}

// ---- one call ------------------------------------------------------------------------------
// Writes this member's slot of call r->k if every member is past the call that used it last;
// returns whether it did.
static int publish(lestate_t *s, lreq_t *r) {
    legroup_t *g = s->g;
    uint64_t k = r->k;
    if (k + 1 > s->min_done + LE_RING) {
        uint64_t m = UINT64_MAX;
        for (int j = 0; j < g->n; j++) {
            uint64_t v = atomic_load_explicit(&g->done[j].v, memory_order_acquire);
            m = v < m ? v : m;
        }
        s->min_done = m;
        if (k + 1 > m + LE_RING) return 0;
    }
    leslot_t *sl = slot_of(g, r->me, k);
    size_t b = r->len * l3d_dtype_size((l3d_dtype)r->dt);
    size_t pub = pub_bytes(r->ckind, b, g->n, r->me == r->root);
    if (pub) memcpy(sl->data, r->sbuf, pub);
    sl->count = r->len;
    sl->kind = r->ckind;
    sl->dt = r->dt;
    sl->op = r->op;
    sl->root = r->root;
    atomic_store_explicit(&sl->seq, k + 1, memory_order_release);
    r->phase = 1;
    return 1;
}

l3d_status l3d_local_eager_start(l3d_transport_t *tp, int kind, const l3d_tp_coll_args_t *a,
                                 l3d_tp_request_t **req_p) {
    local_ep_t *ep = tp->priv;
    lestate_t *s = NULL;
    L3D_CHECK(tp->ctx, state_of(tp, a, &s));
    if (s->broken)
        return l3d_local_fail(tp, L3D_ERR_PEER_FAILED,
                              "local %s: an earlier collective on this communicator failed or "
                              "was cancelled",
                              l3d_local_coll_name[kind]);
    lreq_t *r = l3d_local_req_get(ep, tp->ctx);
    if (!r) return L3D_ERR_NOMEM;
    r->kind = LREQ_EAGER;
    r->es = s;
    r->k = s->started++;
    r->ckind = kind;
    r->me = a->me;
    r->sbuf = a->sendbuf;
    r->buf = a->recvbuf;
    r->len = a->count;
    r->dt = a->dt;
    r->op = a->op;
    r->root = a->root;
    (void)publish(s, r);  // else when a test finds the slot free
    r->cnext = ep->colls;
    ep->colls = r;
    *req_p = r;
    return L3D_OK;
}

static void req_drop(l3d_transport_t *tp, lreq_t *r) {
    local_ep_t *ep = tp->priv;
    for (lreq_t **pp = &ep->colls; *pp; pp = &(*pp)->cnext)
        if (*pp == r) {
            *pp = r->cnext;
            break;
        }
    l3d_local_req_put(ep, tp->ctx, r);
}

static l3d_status fail_req(l3d_transport_t *tp, lreq_t *r, l3d_status st, const char *cause) {
    r->es->broken = 1;
    req_drop(tp, r);
    return l3d_local_fail(tp, st, "%s", cause);
}

// Whether member j's slot is read by this member (broadcast: the root's only).
static int reads(const lreq_t *r, int j) { return r->ckind != LC_BROADCAST || j == r->root; }

// The output of call r->k from the slots (all of which hold the call).
static void compute(local_ep_t *ep, lestate_t *s, const lreq_t *r) {
    const legroup_t *g = s->g;
    int n = g->n;
    l3d_dtype dt = (l3d_dtype)r->dt;
    size_t esz = l3d_dtype_size(dt), b = r->len * esz;
    const void **src = s->src;
    switch (r->ckind) {
    case LC_ALLREDUCE:
    case LC_REDUCE_SCATTER: {
        size_t boff = r->ckind == LC_REDUCE_SCATTER ? (size_t)r->me * b : 0;
        for (int j = 0; j < n; j++) src[j] = slot_of(g, j, r->k)->data;
        l3d_local_reduce(ep, src, n, dt, (l3d_redop)r->op, boff, r->len, r->buf);
        break;
    }
    case LC_ALLGATHER:
        for (int j = 0; j < n; j++)
            memcpy((char *)r->buf + (size_t)j * b, slot_of(g, j, r->k)->data, b);
        break;
    default:  // broadcast
        if (r->me == r->root) {
            if (r->buf != r->sbuf) memcpy(r->buf, r->sbuf, b);
        } else {
            memcpy(r->buf, slot_of(g, r->root, r->k)->data, b);
        }
        break;
    }
}

// A peer's header that does not match this member's call, described (else 0).
static int mismatch(const lreq_t *r, const leslot_t *sl, int peer, char *buf, size_t len) {
    int reduces = r->ckind == LC_ALLREDUCE || r->ckind == LC_REDUCE_SCATTER;
    if (sl->kind == r->ckind && sl->count == r->len && sl->dt == r->dt &&
        (!reduces || sl->op == r->op) && (r->ckind != LC_BROADCAST || sl->root == r->root))
        return 0;
    snprintf(buf, len, "this rank called %s(count %zu, %s) where rank %d called %s(count %zu, %s)",
             l3d_local_coll_name[r->ckind], r->len, l3d_dtype_name((l3d_dtype)r->dt), peer,
             l3d_local_coll_name[sl->kind & 3], (size_t)sl->count,
             l3d_dtype_name((l3d_dtype)sl->dt));
    return 1;
}

l3d_status l3d_local_eager_test(l3d_transport_t *tp, lreq_t *r, int *done_p) {
    local_ep_t *ep = tp->priv;
    lestate_t *s = r->es;
    legroup_t *g = s->g;
    *done_p = 0;
    int ready = (r->phase || publish(s, r)) && s->done == r->k;
    for (int j = 0; ready && j < g->n; j++)
        ready = !reads(r, j) ||
                atomic_load_explicit(&slot_of(g, j, r->k)->seq, memory_order_acquire) == r->k + 1;
    char cause[224];
    if (!ready) {  // still waiting: a member that is gone fails the call
        if (l3d_local_gone_cause(ep, g->ranks, g->n, l3d_local_coll_name[r->ckind], cause,
                                 sizeof(cause)))
            return fail_req(tp, r, L3D_ERR_PEER_FAILED, cause);
        return L3D_OK;
    }
    for (int j = 0; j < g->n; j++) {
        char what[160];
        if (j != r->me && reads(r, j) && mismatch(r, slot_of(g, j, r->k), g->ranks[j], what,
                                                   sizeof(what))) {
            snprintf(cause, sizeof(cause), "local %s: %s", l3d_local_coll_name[r->ckind], what);
            return fail_req(tp, r, L3D_ERR_INVALID_ARG, cause);
        }
    }
    compute(ep, s, r);
    s->done = r->k + 1;
    atomic_store_explicit(&g->done[r->me].v, s->done, memory_order_release);
    req_drop(tp, r);
    *done_p = 1;
    return L3D_OK;
}

int l3d_local_eager_waiting_on(const l3d_transport_t *tp, const lreq_t *r, char *buf,
                               size_t len) {
    const lestate_t *s = r->es;
    const legroup_t *g = s->g;
    for (int j = 0; j < g->n; j++) {
        if (!r->phase && atomic_load(&g->done[j].v) + LE_RING < r->k + 1) {
            snprintf(buf, len, "rank %d has not finished an earlier call", g->ranks[j]);
            return g->ranks[j];
        }
        if (r->phase && reads(r, j) && atomic_load(&slot_of(g, j, r->k)->seq) != r->k + 1) {
            snprintf(buf, len, "rank %d has not started it", g->ranks[j]);
            return g->ranks[j];
        }
    }
    if (len) buf[0] = 0;
    return -1;
}

// Nothing to wait for: peers read only the slots. Later calls on the communicator fail, since
// the call's slot and counter will not advance.
void l3d_local_eager_cancel(l3d_transport_t *tp, lreq_t *r) {
    r->es->broken = 1;
    req_drop(tp, r);
}

void l3d_local_eager_ep_fini(l3d_transport_t *tp) {
    local_ep_t *ep = tp->priv;
    for (lestate_t *s = ep->es, *next; s; s = next) {
        next = s->next;
        state_free(tp->ctx, s);
    }
    ep->es = NULL;
}

void l3d_local_eager_hub_free(local_hub_t *h) {
    for (legroup_t *g = h->egroups, *next; g; g = next) {
        next = g->next;
        group_free(h->ctx, g);
    }
    h->egroups = NULL;
}
