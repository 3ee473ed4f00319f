// Schedules, the executor that advances them, requests and the memory registration cache
// (the failure notices are in core/comm_notice.c). One implementation serves blocking and
// non-blocking calls: a blocking collective is "build the schedule, start it, wait".
//
// A request advances only inside l3d_request_test/wait (and while starting): post the current
// round's sends and receives (at most caps.max_inflight per peer and direction), test them,
// run a local op as soon as the op it is attached to completes (pipelining), run the round's
// remaining local ops when every op is done, go to the next round. Waiting on one request
// advances every active request of the world, so requests may be completed in any order.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/comm_internal.h"
#include "platform/platform.h"

// ---- tags ---------------------------------------------------------------------------------------
void l3d_tag_layout_init(l3d_tag_layout_t *t, int tag_bits) {
    if (tag_bits > 64) tag_bits = 64;
    if (tag_bits < 32) tag_bits = 32;  // the transport contract promises at least 32
    t->bits = tag_bits;
    if (tag_bits >= 48) {
        t->id_bits = 16;
        t->seq_bits = 16;
    } else {
        t->id_bits = 10;
        t->seq_bits = 12;
    }
    t->step_bits = tag_bits - 2 - t->id_bits - t->seq_bits;
}

static uint64_t mask_bits(int b) { return b >= 64 ? ~0ull : ((1ull << b) - 1); }

uint64_t l3d_tag_make(const l3d_tag_layout_t *t, unsigned kind, uint32_t id, uint32_t seq,
                      uint32_t step) {
    uint64_t tag = (uint64_t)kind & 3u;
    tag = (tag << t->id_bits) | ((uint64_t)id & mask_bits(t->id_bits));
    tag = (tag << t->seq_bits) | ((uint64_t)seq & mask_bits(t->seq_bits));
    tag = (tag << t->step_bits) | ((uint64_t)step & mask_bits(t->step_bits));
    return tag;
}

uint64_t l3d_tag_step_mask(const l3d_tag_layout_t *t) { return mask_bits(t->step_bits); }

// ---- schedule builder ---------------------------------------------------------------------------
#define L3D_SPARE_SCHEDS 8  // schedules' arrays kept per world
#define L3D_SPARE_REQS 16   // finished requests kept per world

// Moves the arrays (and their capacities) of `from` into `to`, counts zero.
static void sched_take_arrays(l3d_sched_t *to, l3d_sched_t *from) {
    to->p2p = from->p2p;
    to->cap_p = from->cap_p;
    to->lop = from->lop;
    to->cap_l = from->cap_l;
    to->rd = from->rd;
    to->cap_r = from->cap_r;
    to->tmp = from->tmp;
    to->cap_t = from->cap_t;
    memset(from, 0, sizeof(*from));
}

void l3d_sched_init(l3d_sched_t *s, l3d_comm_t *c) {
    l3d_world_t *w = c->world;
    memset(s, 0, sizeof(*s));
    if (w->nspare) sched_take_arrays(s, &w->spare[--w->nspare]);
    s->ctx = c->ctx;
    s->world = w;
    s->max_msg = w->caps.max_msg ? w->caps.max_msg : SIZE_MAX;
}

#define SCRATCH_MIN (256u << 10)  // smaller temporaries come cheaply from the allocator
#define SCRATCH_MAX ((size_t)256 << 20)

static void tmp_free(l3d_sched_t *s, void *p, size_t n) {
    l3d_world_t *w = s->world;
    if (w && n >= SCRATCH_MIN && n <= SCRATCH_MAX) {
        int slot = -1;  // an empty slot, else the smallest (replaced if this one is larger)
        for (int i = 0; i < 4 && slot < 0; i++)
            if (!w->scratch[i].p) slot = i;
        if (slot < 0) {
            slot = 0;
            for (int i = 1; i < 4; i++)
                if (w->scratch[i].n < w->scratch[slot].n) slot = i;
        }
        struct l3d_scratch old = w->scratch[slot];
        if (!old.p || old.n < n) {
            w->scratch[slot] = (struct l3d_scratch){p, n};
            if (!old.p) return;
            p = old.p;
            n = old.n;
        }
    }
    if (w && w->caps.needs_mr) l3d_world_mr_purge(w, p, n);
    l3d_free(s->ctx, p, n, "comm");
}

static void sched_free_arrays(l3d_ctx_t *ctx, l3d_sched_t *s) {
    l3d_free(ctx, s->tmp, s->cap_t * sizeof(*s->tmp), "comm");
    l3d_free(ctx, s->p2p, s->cap_p * sizeof(*s->p2p), "comm");
    l3d_free(ctx, s->lop, s->cap_l * sizeof(*s->lop), "comm");
    l3d_free(ctx, s->rd, s->cap_r * sizeof(*s->rd), "comm");
    memset(s, 0, sizeof(*s));
}

static void req_release_all(l3d_world_t *w);

void l3d_world_scratch_release(l3d_world_t *w) {
    for (int i = 0; i < 4; i++) {
        if (!w->scratch[i].p) continue;
        if (w->caps.needs_mr) l3d_world_mr_purge(w, w->scratch[i].p, w->scratch[i].n);
        l3d_free(w->ctx, w->scratch[i].p, w->scratch[i].n, "comm");
        w->scratch[i].p = NULL;
    }
    req_release_all(w);
    if (w->spare) {
        for (int i = 0; i < w->nspare; i++) sched_free_arrays(w->ctx, &w->spare[i]);
        l3d_free(w->ctx, w->spare, L3D_SPARE_SCHEDS * sizeof(*w->spare), "comm");
        w->spare = NULL;
        w->nspare = 0;
    }
}

void l3d_sched_fini(l3d_sched_t *s) {
    for (uint32_t i = 0; i < s->nt; i++) tmp_free(s, s->tmp[i].p, s->tmp[i].n);
    l3d_world_t *w = s->world;
    if (w && !w->spare) w->spare = l3d_calloc(s->ctx, L3D_SPARE_SCHEDS, sizeof(*w->spare), "comm");
    // Kept whenever it owns an array: a native or copy-only schedule has rounds but no p2p
    // ops, and freeing its arrays cost a malloc/free pair on every small call.
    if (w && w->spare && w->nspare < L3D_SPARE_SCHEDS &&
        (s->cap_p || s->cap_l || s->cap_r || s->cap_t)) {
        sched_take_arrays(&w->spare[w->nspare++], s);
        return;
    }
    sched_free_arrays(s->ctx, s);
}

// Grows an array of `esz`-byte elements to hold one more; 0 on success.
static int grow(l3d_sched_t *s, void **arr, uint32_t n, uint32_t *cap, size_t esz) {
    if (s->st < 0) return -1;
    if (n < *cap) return 0;
    uint32_t nc = *cap ? *cap * 2 : 16;
    void *p = l3d_malloc(s->ctx, nc * esz, "comm");
    if (!p) {
        s->st = L3D_ERR_NOMEM;
        return -1;
    }
    if (*arr) {
        memcpy(p, *arr, n * esz);
        l3d_free(s->ctx, *arr, *cap * esz, "comm");
    }
    *arr = p;
    *cap = nc;
    return 0;
}

void l3d_sched_round(l3d_sched_t *s) {
    if (grow(s, (void **)&s->rd, s->nr, &s->cap_r, sizeof(*s->rd))) return;
    s->rd[s->nr++] = (l3d_sched_round_t){s->np, 0, s->nl, 0};
}

static l3d_sched_round_t *cur_round(l3d_sched_t *s) {
    if (s->nr == 0) l3d_sched_round(s);
    return s->st < 0 ? NULL : &s->rd[s->nr - 1];
}

static int add_p2p(l3d_sched_t *s, int send, int peer, uint32_t step, void *buf, size_t len) {
    if (len == 0) return -1;
    int pieces = 0, idx = -1;
    for (size_t off = 0; off < len; off += s->max_msg, pieces++) {
        l3d_sched_round_t *rd = cur_round(s);
        if (!rd || grow(s, (void **)&s->p2p, s->np, &s->cap_p, sizeof(*s->p2p))) return -1;
        size_t n = L3D_MIN(s->max_msg, len - off);
        s->p2p[s->np++] = (l3d_sched_p2p_t){(char *)buf + off, n, peer, step, (uint8_t)send};
        idx = (int)rd->np++;
    }
    return pieces == 1 ? idx : -1;
}

int l3d_sched_send(l3d_sched_t *s, int peer, uint32_t step, const void *buf, size_t len) {
    return add_p2p(s, 1, peer, step, (void *)buf, len);
}
int l3d_sched_recv(l3d_sched_t *s, int peer, uint32_t step, void *buf, size_t len) {
    return add_p2p(s, 0, peer, step, buf, len);
}

void l3d_sched_native(l3d_sched_t *s, l3d_tp_coll_fn fn, const l3d_tp_coll_args_t *args) {
    l3d_sched_round_t *rd = cur_round(s);
    if (!rd || grow(s, (void **)&s->p2p, s->np, &s->cap_p, sizeof(*s->p2p))) return;
    s->p2p[s->np++] = (l3d_sched_p2p_t){NULL, 0, -1, 0, 2};
    rd->np++;
    s->native = fn;
    s->nargs = *args;
}

static void add_lop(l3d_sched_t *s, l3d_sched_lop_t op) {
    l3d_sched_round_t *rd = cur_round(s);
    if (!rd || grow(s, (void **)&s->lop, s->nl, &s->cap_l, sizeof(*s->lop))) return;
    s->lop[s->nl++] = op;
    rd->nl++;
}

void l3d_sched_reduce(l3d_sched_t *s, int after, void *dst, const void *a, const void *b,
                      size_t count, l3d_dtype wdt, l3d_redop op) {
    if (!count) return;
    add_lop(s, (l3d_sched_lop_t){L3D_LOP_REDUCE, (uint8_t)wdt, (uint8_t)wdt, (uint8_t)op, after,
                                 dst, a, b, count, 0});
}
void l3d_sched_copy(l3d_sched_t *s, int after, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    add_lop(s, (l3d_sched_lop_t){L3D_LOP_COPY, 0, 0, 0, after, dst, src, NULL, bytes, 0});
}
void l3d_sched_towire(l3d_sched_t *s, int after, float *dst, const void *src, size_t count,
                      l3d_dtype dt) {
    if (!count) return;
    add_lop(s, (l3d_sched_lop_t){L3D_LOP_TOWIRE, (uint8_t)dt, L3D_FLOAT32, 0, after, dst, src,
                                 NULL, count, 0});
}
void l3d_sched_final(l3d_sched_t *s, int after, void *dst, const void *src, size_t count,
                     l3d_dtype dt, l3d_redop op, int n) {
    if (!count) return;
    if (dst == src && (op != L3D_AVG || n <= 1) && l3d_reduce_wire_type(dt) == dt) return;
    add_lop(s, (l3d_sched_lop_t){L3D_LOP_FINAL, (uint8_t)dt, (uint8_t)l3d_reduce_wire_type(dt),
                                 (uint8_t)op, after, dst, src, NULL, count, n});
}

void *l3d_sched_tmp(l3d_sched_t *s, size_t bytes) {
    if (grow(s, (void **)&s->tmp, s->nt, &s->cap_t, sizeof(*s->tmp))) return NULL;
    if (!bytes) bytes = 1;
    l3d_world_t *w = s->world;
    if (w && bytes >= SCRATCH_MIN)
        for (int i = 0; i < 4; i++)
            if (w->scratch[i].p && w->scratch[i].n >= bytes && w->scratch[i].n / 2 <= bytes) {
                s->tmp[s->nt++] = (struct l3d_sched_tmp){w->scratch[i].p, w->scratch[i].n};
                w->scratch[i].p = NULL;
                return s->tmp[s->nt - 1].p;
            }
    void *p = l3d_malloc(s->ctx, bytes, "comm");
    if (!p) {
        s->st = L3D_ERR_NOMEM;
        return NULL;
    }
    s->tmp[s->nt++] = (struct l3d_sched_tmp){p, bytes};
    return p;
}

static void run_lop(const l3d_sched_lop_t *o) {
    switch (o->kind) {
    case L3D_LOP_REDUCE:
        l3d_reduce_apply(o->dst, o->a, o->b, o->count, (l3d_dtype)o->wdt, (l3d_redop)o->op);
        break;
    case L3D_LOP_COPY:
        memmove(o->dst, o->a, o->count);
        break;
    case L3D_LOP_TOWIRE:
        l3d_reduce_to_f32(o->dst, o->a, o->count, (l3d_dtype)o->dt);
        break;
    case L3D_LOP_FINAL:
        l3d_reduce_final(o->dst, o->a, o->count, (l3d_dtype)o->dt, (l3d_redop)o->op, o->n);
        break;
    }
}

// ---- memory registration cache ------------------------------------------------------------------
l3d_status l3d_world_mr(l3d_world_t *w, void *buf, size_t len, void **mr_p) {
    char *p = buf;
    for (size_t i = 0; i < w->nmr; i++)
        if (w->mrs[i].ptr <= p && p + len <= w->mrs[i].ptr + w->mrs[i].len) {
            *mr_p = w->mrs[i].mr;
            return L3D_OK;
        }
    if (w->nmr == w->cap_mr) {
        size_t nc = w->cap_mr ? w->cap_mr * 2 : 16;
        l3d_mr_entry_t *e = l3d_malloc(w->ctx, nc * sizeof(*e), "comm");
        if (!e) return L3D_ERR_NOMEM;
        if (w->mrs) memcpy(e, w->mrs, w->nmr * sizeof(*e));
        l3d_free(w->ctx, w->mrs, w->cap_mr * sizeof(*e), "comm");
        w->mrs = e;
        w->cap_mr = nc;
    }
    void *mr = NULL;
    L3D_CHECK(w->ctx, l3d_tp_mr_reg(&w->tp, buf, len, &mr));
    w->mrs[w->nmr++] = (l3d_mr_entry_t){p, len, mr};
    *mr_p = mr;
    return L3D_OK;
}

void l3d_world_mr_purge(l3d_world_t *w, void *buf, size_t len) {
    char *p = buf;
    for (size_t i = 0; i < w->nmr;) {
        l3d_mr_entry_t *e = &w->mrs[i];
        if (e->ptr < p + len && p < e->ptr + e->len) {
            l3d_tp_mr_dereg(&w->tp, e->mr);
            *e = w->mrs[--w->nmr];
        } else {
            i++;
        }
    }
}

void l3d_world_mr_release(l3d_world_t *w) {
    for (size_t i = 0; i < w->nmr; i++) l3d_tp_mr_dereg(&w->tp, w->mrs[i].mr);
    l3d_free(w->ctx, w->mrs, w->cap_mr * sizeof(*w->mrs), "comm");
    w->mrs = NULL;
    w->nmr = w->cap_mr = 0;
}

// ---- requests -----------------------------------------------------------------------------------
static const char *peer_name(const l3d_comm_t *c, int peer, char *buf, size_t len) {
    int wr = c->ranks[peer];
    if (wr == peer) snprintf(buf, len, "rank %d", peer);
    else snprintf(buf, len, "rank %d (world rank %d)", peer, wr);
    return buf;
}

l3d_status l3d_comm_fail(l3d_comm_t *c, l3d_status st, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!c->failed) {
        c->failed = 1;
        c->fail_st = st;
        snprintf(c->fail_detail, sizeof(c->fail_detail), "%s", msg);
    }
    return l3d_error(c->ctx, st, "%s", msg);
}

l3d_status l3d_comm_check(l3d_comm_t *c, const char *what) {
    if (c->failed)
        return l3d_error(c->ctx, L3D_ERR_PEER_FAILED, "%s: communicator failed earlier: %s", what,
                         c->fail_detail);
    l3d_world_t *w = c->world;
    if (w->dead_epoch != c->dead_epoch_seen) {
        c->dead_epoch_seen = w->dead_epoch;
        int pick = -1;  // the first failure the world learned of, if it is a member
        for (int i = 0; i < c->size; i++)
            if (w->dead[c->ranks[i]] && (pick < 0 || c->ranks[i] == w->first_dead)) pick = i;
        if (pick >= 0) {
            int wr = c->ranks[pick];
            char pn[64];
            if (wr == w->rank)
                return l3d_comm_fail(c, L3D_ERR_PEER_FAILED, "%s: this rank aborted", what);
            peer_name(c, pick, pn, sizeof(pn));
            l3d_world_declare_dead(w, wr, "reported by a peer");
            // The first failure is not a member (pick prefers it): a member that stopped after it
            // (aborting, as a failed rank's peers do) is the messenger, not the cause to name.
            if (wr != w->first_dead)
                return l3d_comm_fail(c, L3D_ERR_PEER_FAILED, "%s: world rank %d failed: %s "
                                     "(then %s stopped)", what, w->first_dead, w->dead_reason, pn);
            return l3d_comm_fail(c, L3D_ERR_PEER_FAILED, "%s: %s failed: %s", what, pn,
                                 w->dead_reason);
        }
    }
    return L3D_OK;
}

static void req_cancel_posted(l3d_request_t *r) {
    if (r->round >= r->s.nr) return;
    l3d_sched_round_t *rd = &r->s.rd[r->round];
    for (uint32_t i = 0; i < rd->np; i++)
        if (r->state[i] == 1) {
            if (r->s.p2p[rd->p0 + i].send == 3) l3d_comm_shm_cancel(r->comm);
            else l3d_tp_cancel(&r->comm->world->tp, r->treq[i]);
            r->state[i] = 0;
        }
}

static l3d_status req_finish(l3d_request_t *r, l3d_status st) {
    if (st < 0) req_cancel_posted(r);
    r->complete = 1;
    r->st = st;
    return st;
}

// Names the ops of the current round still pending ("rank 3 (recv of 4096 bytes)", ...).
static void req_pending(l3d_request_t *r, char *buf, size_t len) {
    size_t o = 0;
    int shown = 0;
    buf[0] = 0;
    l3d_sched_round_t *rd = &r->s.rd[r->round];
    for (uint32_t i = 0; i < rd->np && shown < 4; i++) {
        if (r->state[i] == 2) continue;
        const l3d_sched_p2p_t *p = &r->s.p2p[rd->p0 + i];
        char pn[64];
        if (p->peer < 0) {
            const l3d_transport_t *t = &r->comm->world->tp;
            char why[128] = "";
            int shm = p->send == 3;
            if (shm) (void)l3d_comm_shm_waiting_on(r->comm, &r->s, why, sizeof(why));
            else if (t->ops->waiting_on && r->state[i] == 1)
                t->ops->waiting_on(t, r->treq[i], why, sizeof(why));
            o += (size_t)snprintf(buf + o, len - o, "%sthe %s %s%s%s%s%s", shown ? ", " : "",
                                  shm ? "shared-memory" : "native", r->what,
                                  shm ? "" : " of transport ", shm ? "" : t->ops->name,
                                  why[0] ? " (" : "", why);
            if (o < len && why[0]) o += (size_t)snprintf(buf + o, len - o, ")");
            if (o >= len) break;
            shown++;
            continue;
        }
        o += (size_t)snprintf(buf + o, len - o, "%s%s (%s of %zu bytes)", shown ? ", " : "",
                              peer_name(r->comm, p->peer, pn, sizeof(pn)),
                              p->send ? "send" : "recv", p->len);
        if (o >= len) break;
        shown++;
    }
}

static void req_blame(l3d_request_t *r) {
    l3d_world_t *w = r->comm->world;
    l3d_sched_round_t *rd = &r->s.rd[r->round];
    for (uint32_t i = 0; i < rd->np; i++) {
        if (r->state[i] == 2) continue;
        int wr;
        if (r->s.p2p[rd->p0 + i].peer < 0) {  // native: the transport may know whom it awaits
            const l3d_transport_t *t = &w->tp;
            char why[8];
            if (r->s.p2p[rd->p0 + i].send == 3)
                wr = l3d_comm_shm_waiting_on(r->comm, &r->s, why, sizeof(why));
            else
                wr = t->ops->waiting_on && r->state[i] == 1
                         ? t->ops->waiting_on(t, r->treq[i], why, sizeof(why))
                         : -1;
            if (wr < 0 || wr == w->rank) continue;
        } else {
            wr = r->comm->ranks[r->s.p2p[rd->p0 + i].peer];
        }
        if (w->blamed[wr] & 2) continue;  // bit 1: we blamed it ourselves already
        w->blamed[wr] |= 3;
        l3d_world_notify(w, L3D_NOTICE_BLAME, wr, "no progress");
    }
}

// Timeout resolution: the ranks blamed by anyone (us included) that never sent a notice of
// their own are the unresponsive ones.
static l3d_status req_timeout(l3d_request_t *r, double now) {
    l3d_comm_t *c = r->comm;
    l3d_world_t *w = c->world;
    char pend[192], dead[160] = "";
    req_pending(r, pend, sizeof(pend));
    size_t o = 0;
    for (int p = 0; p < w->size && o < sizeof(dead) - 24; p++)
        if (p != w->rank && w->blamed[p] && !w->alive[p]) {
            o += (size_t)snprintf(dead + o, sizeof(dead) - o, "%srank %d", o ? ", " : "", p);
            l3d_world_declare_dead(w, p, "unresponsive");
        }
    return l3d_comm_fail(c, L3D_ERR_TIMEOUT, "%s: timed out after %.1f s waiting for %s%s%s",
                         r->what, now - r->t_start, pend, o ? "; unresponsive: " : "", dead);
}

static int member_blamed(const l3d_comm_t *c) {
    for (int i = 0; i < c->size; i++) {
        int wr = c->ranks[i];
        if (wr != c->world->rank && (c->world->blamed[wr] & 1)) return 1;
    }
    return 0;
}

static l3d_status post_op(l3d_request_t *r, const l3d_sched_p2p_t *p, l3d_tp_request_t **tr) {
    l3d_world_t *w = r->comm->world;
    if (p->send == 2) return r->s.native(&w->tp, &r->s.nargs, tr);
    if (p->send == 3) {
        *tr = NULL;
        l3d_comm_shm_post(r->comm, &r->s);
        return L3D_OK;
    }
    void *mr = NULL;
    if (w->caps.needs_mr) L3D_CHECK(w->ctx, l3d_world_mr(w, p->buf, p->len, &mr));
    uint64_t tag = r->tag | ((uint64_t)p->step & l3d_tag_step_mask(&w->tags));
    int wr = r->comm->ranks[p->peer];
    return p->send ? l3d_tp_isend(&w->tp, wr, tag, p->buf, p->len, mr, tr)
                   : l3d_tp_irecv(&w->tp, wr, tag, p->buf, p->len, mr, tr);
}

static l3d_status op_failed(l3d_request_t *r, const l3d_sched_p2p_t *p, l3d_status st) {
    l3d_comm_t *c = r->comm;
    char detail[192], pn[64];
    snprintf(detail, sizeof(detail), "%s", l3d_ctx_last_error(c->ctx));
    if (p->peer < 0) {
        // The native collective: the transport's own text for this endpoint names the peer
        // (the context may be shared by the thread ranks of an in-process world, so its last
        // error can be another rank's).
        const char *te = l3d_tp_strerror(&c->world->tp);
        return req_finish(r, l3d_comm_fail(c, st, "%s (native %s): %s", r->what,
                                           c->world->tp.ops->name, te && te[0] ? te : detail));
    }
    peer_name(c, p->peer, pn, sizeof(pn));
    // A peer that failed because of an earlier failure (and exited) is not the cause: take in
    // the notices that have arrived and name the first failed rank if it is another one.
    l3d_world_t *w = c->world;
    l3d_world_poll_notices(w);
    int wp = c->ranks[p->peer];
    // A peer that aborted sends its notices (naming the failure that made it give up) before
    // its transport says goodbye, but they may arrive a little after: wait briefly for them
    // (bit 4: it told us itself), so that a survivor is not blamed for a dead rank.
    double until = l3d_time_now() + 0.1;
    while (st == L3D_ERR_PEER_FAILED && (!w->dead_epoch || w->first_dead == wp) &&
           !(w->dead[wp] & 4) && l3d_time_now() < until) {
        (void)l3d_tp_progress(&w->tp);
        l3d_world_poll_notices(w);
    }
    if (st == L3D_ERR_PEER_FAILED && w->dead_epoch && w->first_dead != wp &&
        w->first_dead != w->rank) {
        char why[192];
        snprintf(why, sizeof(why), "%s", w->dead_reason);
        l3d_world_declare_dead(w, w->first_dead, w->dead_reason);
        l3d_world_mark_dead(w, wp, detail);
        return req_finish(r, l3d_comm_fail(c, st, "%s: rank %d failed: %s (then %s of %zu bytes "
                                                  "with %s failed: %s)",
                                           r->what, w->first_dead, why,
                                           p->send ? "send" : "recv", p->len, pn, detail));
    }
    if (st == L3D_ERR_PEER_FAILED) l3d_world_declare_dead(w, wp, detail);
    return req_finish(r, l3d_comm_fail(c, st, "%s: %s (%s of %zu bytes with %s)", r->what, detail,
                                       p->send ? "send" : "recv", p->len, pn));
}

// One pass over the request. Returns L3D_OK when complete, L3D_INPROGRESS, or an error.
static l3d_status req_advance(l3d_request_t *r, int *progressed) {
    if (r->complete) return r->st;
    l3d_comm_t *c = r->comm;
    l3d_world_t *w = c->world;
    l3d_status st = l3d_comm_check(c, r->what);
    if (st < 0) return req_finish(r, st);
    int lim = w->caps.max_inflight > 0 ? w->caps.max_inflight : 1 << 30;
    while (r->round < r->s.nr) {
        const l3d_sched_round_t *rd = &r->s.rd[r->round];
        // A round without p2p or local ops may belong to a schedule whose array is NULL:
        // &NULL[0] is undefined behaviour (UBSan stops every multi-rank run on it).
        const l3d_sched_p2p_t *ops = rd->np ? &r->s.p2p[rd->p0] : NULL;
        const l3d_sched_lop_t *lops = rd->nl ? &r->s.lop[rd->l0] : NULL;
        for (uint32_t i = 0; i < rd->np; i++) {
            if (r->state[i] != 0) continue;
            int native = ops[i].peer < 0, dummy = 0;
            int *inf = native ? &dummy : &r->inflight[2 * ops[i].peer + ops[i].send];
            if (*inf >= lim) continue;
            st = post_op(r, &ops[i], &r->treq[i]);
            if (st == L3D_INPROGRESS) break;  // out of resources: retry on the next pass
            if (st < 0) return op_failed(r, &ops[i], st);
            r->state[i] = 1;
            (*inf)++;
        }
        for (uint32_t i = 0; i < rd->np; i++) {
            if (r->state[i] != 1) continue;
            int done = 0;
            if (ops[i].send == 3) {
                st = l3d_comm_shm_test(c, &r->s, r->what, &done);
                if (st < 0) {
                    r->state[i] = 2;
                    return req_finish(r, st);  // named by l3d_comm_shm_test
                }
            } else {
                st = l3d_tp_test(&w->tp, r->treq[i], &done, NULL);
            }
            if (st < 0) {
                r->state[i] = 2;  // the transport freed it
                return op_failed(r, &ops[i], st);
            }
            if (!done) continue;
            r->state[i] = 2;
            r->ndone++;
            if (ops[i].peer >= 0) r->inflight[2 * ops[i].peer + ops[i].send]--;
            *progressed = 1;
            for (uint32_t j = 0; j < rd->nl; j++)
                if (lops[j].after == (int32_t)i) run_lop(&lops[j]);
        }
        if (r->ndone < rd->np) {
            if (!r->blaming && !w->blame_seen && (r->polls++ & 63) != 0) return L3D_INPROGRESS;
            double now = l3d_time_now();
            if (r->t_start == 0) {  // the first pass that did not finish starts the clock
                // The blame round's grace comes out of the timeout, so no wait exceeds
                // L3D_COMM_TIMEOUT.
                double to = l3d_ctx_settings(c->ctx)->comm_timeout_s;
                r->t_start = now;
                r->deadline = now + to - L3D_MIN(0.25 * to, 1.0);
            }
            if (!r->blaming && (now > r->deadline ||
                                (w->blame_seen && member_blamed(c)))) {
                double to = l3d_ctx_settings(c->ctx)->comm_timeout_s;
                r->blaming = 1;
                r->grace_end = now + L3D_MIN(0.25 * to, 1.0);
                req_blame(r);
            } else if (r->blaming && now > r->grace_end) {
                return req_finish(r, req_timeout(r, now));
            }
            return L3D_INPROGRESS;
        }
        for (uint32_t j = 0; j < rd->nl; j++)
            if (lops[j].after < 0) run_lop(&lops[j]);
        r->round++;
        r->ndone = 0;
        memset(r->state, 0, r->max_np);
        memset(r->inflight, 0, 2 * (size_t)c->size * sizeof(int));
        *progressed = 1;
    }
    return req_finish(r, L3D_OK);
}

// Advances every active request of the world once; returns nonzero if anything moved.
static int world_progress(l3d_world_t *w) {
    int progressed = 0;
    if ((w->poll_tick++ & 7) == 0) l3d_world_poll_notices(w);
    (void)l3d_tp_progress(&w->tp);
    for (l3d_request_t *r = w->active; r; r = r->next)
        if (!r->complete) (void)req_advance(r, &progressed);
    return progressed;
}

static void req_free_arrays(l3d_ctx_t *ctx, l3d_request_t *r) {
    l3d_free(ctx, r->state, r->cap_np, "comm");
    l3d_free(ctx, r->treq, r->cap_np * sizeof(*r->treq), "comm");
    l3d_free(ctx, r->inflight, r->cap_inf * sizeof(int), "comm");
    r->state = NULL;
    r->treq = NULL;
    r->inflight = NULL;
    r->cap_np = r->cap_inf = 0;
}

static void req_free(l3d_request_t *r) {
    l3d_world_t *w = r->comm->world;
    l3d_ctx_t *ctx = r->comm->ctx;
    if (!r->complete) req_finish(r, L3D_ERR_INTERNAL);
    if (r->prev) r->prev->next = r->next;
    else if (w->active == r) w->active = r->next;
    if (r->next) r->next->prev = r->prev;
    l3d_sched_fini(&r->s);
    if (w->nfree_reqs < L3D_SPARE_REQS) {  // kept with its arrays for the next call
        r->next = w->free_reqs;
        w->free_reqs = r;
        w->nfree_reqs++;
        return;
    }
    req_free_arrays(ctx, r);
    l3d_free(ctx, r, sizeof(*r), "comm");
}

static void req_release_all(l3d_world_t *w) {
    while (w->free_reqs) {
        l3d_request_t *r = w->free_reqs;
        w->free_reqs = r->next;
        req_free_arrays(w->ctx, r);
        l3d_free(w->ctx, r, sizeof(*r), "comm");
    }
    w->nfree_reqs = 0;
}

// A request with arrays for rounds of up to max_np ops (zeroed) on communicator c.
static l3d_request_t *req_new(l3d_comm_t *c, const char *what, uint32_t max_np) {
    l3d_world_t *w = c->world;
    l3d_request_t *r = w->free_reqs;
    if (r) {
        w->free_reqs = r->next;
        w->nfree_reqs--;
        l3d_request_t keep = *r;
        memset(r, 0, sizeof(*r));
        r->state = keep.state;
        r->treq = keep.treq;
        r->inflight = keep.inflight;
        r->cap_np = keep.cap_np;
        r->cap_inf = keep.cap_inf;
    } else if (!(r = l3d_calloc(c->ctx, 1, sizeof(*r), "comm"))) {
        return NULL;
    }
    uint32_t ninf = 2 * (uint32_t)c->size;
    if (r->cap_np < max_np || r->cap_inf < ninf) {
        req_free_arrays(c->ctx, r);
        r->state = l3d_malloc(c->ctx, max_np, "comm");
        r->treq = l3d_malloc(c->ctx, max_np * sizeof(*r->treq), "comm");
        r->inflight = l3d_malloc(c->ctx, ninf * sizeof(int), "comm");
        r->cap_np = max_np;
        r->cap_inf = ninf;
        if (!r->state || !r->treq || !r->inflight) {
            req_free_arrays(c->ctx, r);
            l3d_free(c->ctx, r, sizeof(*r), "comm");
            return NULL;
        }
    }
    memset(r->state, 0, max_np);
    memset(r->inflight, 0, ninf * sizeof(int));
    r->max_np = max_np;
    r->comm = c;
    r->what = what;
    // t_start and the deadline are set by the first pass that does not finish (req_advance):
    // most small calls never read the clock.
    r->next = w->active;
    if (w->active) w->active->prev = r;
    w->active = r;
    return r;
}

l3d_status l3d_request_done(l3d_comm_t *c, const char *what, l3d_status st,
                            l3d_request_t **req_p) {
    l3d_request_t *r = req_new(c, what, 1);
    if (!r) return L3D_ERR_NOMEM;
    r->complete = 1;
    r->st = st;
    *req_p = r;
    return L3D_OK;
}

l3d_status l3d_request_start(l3d_comm_t *c, l3d_sched_t *s, const char *what, uint64_t tag,
                             l3d_request_t **req_p) {
    if (s->st < 0) {
        l3d_status st = s->st;
        l3d_sched_fini(s);
        return l3d_error(c->ctx, st, "%s: out of memory building the schedule", what);
    }
    uint32_t max_np = 1;
    for (uint32_t i = 0; i < s->nr; i++) max_np = L3D_MAX(max_np, s->rd[i].np);
    l3d_request_t *r = req_new(c, what, max_np);
    if (!r) {
        l3d_sched_fini(s);
        return L3D_ERR_NOMEM;
    }
    r->s = *s;
    memset(s, 0, sizeof(*s));
    r->tag = tag;
    int progressed = 0;
    (void)req_advance(r, &progressed);  // post the first round now
    *req_p = r;
    return L3D_OK;
}

l3d_status l3d_request_test(l3d_request_t *req, int *done_p) {
    *done_p = 0;
    if (!req) return L3D_ERR_INVALID_ARG;
    if (!req->complete) world_progress(req->comm->world);
    if (!req->complete) return L3D_OK;
    l3d_status st = req->st;
    *done_p = 1;
    req_free(req);
    return st;
}

// Spin briefly, then yield, then sleep ~50 us: with more ranks than cores (threads of the
// local transport) spinning starves the very peer being waited for. (Spinning 2048 passes
// before the first yield when every rank has a core took ~1.5 us off the in-process 8-byte
// allreduce but starved UCX's own progress: its first messages took 25 us and 64 MiB p2p fell
// to 0.7x ucx_perftest; bench/compare_comm.sh.)
static void backoff(const l3d_world_t *w, int *idle) {
    int n = (*idle)++;
    if (n < 32) return;
    if (n < 256 || !w->oversubscribed) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

l3d_status l3d_request_wait(l3d_request_t *req) {
    if (!req) return L3D_ERR_INVALID_ARG;
    l3d_world_t *w = req->comm->world;
    int idle = 0;
    while (!req->complete) {
        if (world_progress(w)) idle = 0;
        else backoff(w, &idle);
    }
    l3d_status st = req->st;
    req_free(req);
    return st;
}

// Frees the requests of a communicator that is being destroyed (their buffers are the
// caller's problem; the transport forgets them).
void l3d_comm_drop_requests(l3d_comm_t *c) {
    l3d_world_t *w = c->world;
    for (l3d_request_t *r = w->active, *next; r; r = next) {
        next = r->next;
        if (r->comm != c) continue;
        if (!r->complete)
            l3d_log(c->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM,
                    "%s request still pending at communicator destroy: cancelled", r->what);
        req_free(r);
    }
}
