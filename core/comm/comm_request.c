// Requests: the executor that advances a schedule (core/comm/comm_sched.c builds it). One
// implementation serves blocking and non-blocking calls: a blocking collective is "build the
// schedule, start it, wait".
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

#include "core/comm/comm_internal.h"
#include "platform/platform.h"

#define L3D_SPARE_REQS 16  // finished requests kept per world

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
    if (r->pipe) {
        l3d_status st = l3d_stage_pipe_advance(r, progressed);
        return st == L3D_INPROGRESS ? st : req_finish(r, st);
    }
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
                if (lops[j].after == (int32_t)i && (st = l3d_sched_run_lop(&lops[j])) < 0)
                    return req_finish(r, l3d_error(c->ctx, st, "%s: copying into a device "
                                                   "buffer failed", r->what));
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
            if (lops[j].after < 0 && (st = l3d_sched_run_lop(&lops[j])) < 0)
                return req_finish(r, l3d_error(c->ctx, st, "%s: copying into a device buffer "
                                               "failed", r->what));
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
    l3d_request_unlink(r);
    if (r->pipe) l3d_stage_pipe_free(r);
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

void l3d_world_requests_release(l3d_world_t *w) {
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
        return l3d_error(c->ctx, st, st == L3D_ERR_NOMEM ? "%s: out of memory building the "
                         "schedule" : "%s: staging a device buffer through host memory failed",
                         what);
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

l3d_status l3d_request_start_pipe(l3d_comm_t *c, l3d_sched_t *s, const char *what,
                                  struct l3d_stage_pipe *pipe, l3d_request_t **req_p) {
    l3d_request_t *r = req_new(c, what, 1);
    if (!r) {
        l3d_sched_fini(s);
        return L3D_ERR_NOMEM;
    }
    r->s = *s;
    memset(s, 0, sizeof(*s));
    r->pipe = pipe;
    *req_p = r;
    return L3D_OK;
}

void l3d_request_unlink(l3d_request_t *r) {
    l3d_world_t *w = r->comm->world;
    if (r->prev) r->prev->next = r->next;
    else if (w->active == r) w->active = r->next;
    if (r->next) r->next->prev = r->prev;
    r->next = r->prev = NULL;
}

l3d_status l3d_request_advance(l3d_request_t *r, int *progressed) {
    if (!r->complete) (void)req_advance(r, progressed);
    return r->complete ? r->st : L3D_INPROGRESS;
}

void l3d_request_free(l3d_request_t *r) { req_free(r); }

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
