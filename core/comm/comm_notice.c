// Failure notices (docs/comm.md, "Failure model"): small control messages on the control tag,
// one receive pre-posted from every peer, by which a rank tells the others that a peer failed
// (or that it aborted itself, and why), that it blames a peer for no progress, or that it is
// alive. Ranks that never exchange a message with a dead rank still learn of it and name it.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "core/comm/comm_internal.h"
#include "platform/platform.h"

#define NOTICE_MAGIC 0x6c33644eu
#define NOTICE_SLOTS 8

static uint64_t notice_tag(const l3d_world_t *w) {
    return l3d_tag_make(&w->tags, L3D_TAG_CTRL, 0, 0, 0);
}

static void notice_post(l3d_world_t *w, int p) {
    w->notice_req[p] = NULL;
    if (w->dead[p]) return;
    void *mr = NULL;
    if (w->caps.needs_mr && l3d_world_mr(w, &w->notice_in[p], sizeof(l3d_notice_t), &mr) < 0)
        return;
    l3d_tp_request_t *tr = NULL;
    if (l3d_tp_irecv(&w->tp, p, notice_tag(w), &w->notice_in[p], sizeof(l3d_notice_t), mr, &tr) ==
        L3D_OK)
        w->notice_req[p] = tr;
}

l3d_status l3d_world_notices_start(l3d_world_t *w) {
    size_t n = (size_t)w->size;
    w->dead = l3d_calloc(w->ctx, 3, n, "comm");
    w->notice_in = l3d_calloc(w->ctx, n, sizeof(l3d_notice_t), "comm");
    w->notice_req = l3d_calloc(w->ctx, n, sizeof(*w->notice_req), "comm");
    w->notice_out = l3d_calloc(w->ctx, NOTICE_SLOTS, sizeof(l3d_notice_t), "comm");
    w->notice_sreq = l3d_calloc(w->ctx, n * NOTICE_SLOTS, sizeof(*w->notice_sreq), "comm");
    if (!w->dead || !w->notice_in || !w->notice_req || !w->notice_out || !w->notice_sreq) {
        l3d_world_notices_stop(w);
        return L3D_ERR_NOMEM;
    }
    w->alive = w->dead + n;
    w->blamed = w->dead + 2 * n;
    for (int p = 0; p < w->size; p++)
        if (p != w->rank) notice_post(w, p);
    return L3D_OK;
}

void l3d_world_notices_stop(l3d_world_t *w) {
    size_t n = (size_t)w->size;
    if (w->notice_req)
        for (size_t p = 0; p < n; p++)
            if (w->notice_req[p]) l3d_tp_cancel(&w->tp, w->notice_req[p]);
    if (w->notice_sreq)
        for (size_t i = 0; i < n * NOTICE_SLOTS; i++)
            if (w->notice_sreq[i]) l3d_tp_cancel(&w->tp, w->notice_sreq[i]);
    l3d_free(w->ctx, w->notice_sreq, n * NOTICE_SLOTS * sizeof(*w->notice_sreq), "comm");
    l3d_free(w->ctx, w->notice_out, NOTICE_SLOTS * sizeof(l3d_notice_t), "comm");
    l3d_free(w->ctx, w->notice_req, n * sizeof(*w->notice_req), "comm");
    l3d_free(w->ctx, w->notice_in, n * sizeof(l3d_notice_t), "comm");
    l3d_free(w->ctx, w->dead, 3 * n, "comm");
    w->notice_sreq = NULL;
    w->notice_out = NULL;
    w->notice_req = NULL;
    w->notice_in = NULL;
    w->dead = w->alive = w->blamed = NULL;
}

void l3d_world_mark_dead(l3d_world_t *w, int rank, const char *reason) {
    if (rank < 0 || rank >= w->size || w->dead[rank]) return;
    if (!w->dead_epoch) {
        snprintf(w->dead_reason, sizeof(w->dead_reason), "%s", reason);
        w->first_dead = rank;
    }
    w->dead[rank] = 1;
    w->dead_epoch++;
}

// Sends a notice to every peer not known dead (best effort: a send that does not complete is
// cancelled when its slot is reused or the world goes away).
void l3d_world_notify(l3d_world_t *w, int kind, int rank, const char *reason) {
    if (!w->notice_out || w->size < 2) return;
    // A slot whose sends have all completed. Pending sends are never cancelled here: a
    // transport may treat cancelling an in-flight send as a failed link (transport.h).
    l3d_world_poll_notices(w);
    int slot = -1;
    for (int k = 0; k < NOTICE_SLOTS && slot < 0; k++) {
        int cand = (w->notice_next + k) % NOTICE_SLOTS, busy = 0;
        for (int p = 0; p < w->size; p++)
            busy |= w->notice_sreq[(size_t)cand * (size_t)w->size + (size_t)p] != NULL;
        if (!busy) slot = cand;
    }
    if (slot < 0) {
        l3d_log(w->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM,
                "failure notice about rank %d dropped: all notice slots busy", rank);
        return;
    }
    w->notice_next = slot + 1;
    l3d_tp_request_t **sreq = &w->notice_sreq[(size_t)slot * (size_t)w->size];
    l3d_notice_t *m = &w->notice_out[slot];
    memset(m, 0, sizeof(*m));
    *m = (l3d_notice_t){NOTICE_MAGIC, kind, w->rank, rank, -1, "", ""};
    // Every DEAD notice, about this rank or one passed on, carries the first failure (when
    // another): without it a receiver that missed that notice named the rank passed on.
    if (kind == L3D_NOTICE_DEAD && w->dead_epoch && w->first_dead != rank &&
        w->first_dead != w->rank) {
        m->cause = w->first_dead;
        snprintf(m->cause_reason, sizeof(m->cause_reason), "%.111s", w->dead_reason);
    }
    snprintf(m->reason, sizeof(m->reason), "%s", reason);
    void *mr = NULL;
    if (w->caps.needs_mr && l3d_world_mr(w, m, sizeof(*m), &mr) < 0) return;
    for (int p = 0; p < w->size; p++) {
        if (p == w->rank || w->dead[p]) continue;
        l3d_tp_request_t *tr = NULL;
        // Out of send resources (a loaded tcp;ofi_rxm says EAGAIN): progress and retry for a
        // moment rather than drop the notice, which left a peer naming the wrong rank.
        double until = l3d_time_now() + 0.05;
        l3d_status st;
        while ((st = l3d_tp_isend(&w->tp, p, notice_tag(w), m, sizeof(*m), mr, &tr)) ==
                   L3D_INPROGRESS &&
               l3d_time_now() < until)
            (void)l3d_tp_progress(&w->tp);
        if (st == L3D_OK) sreq[p] = tr;
    }
}

// Marks `rank` failed and tells every peer once (relaying what a notice told us too: the
// rank that failed may never have been connected to some of them).
void l3d_world_declare_dead(l3d_world_t *w, int rank, const char *reason) {
    l3d_world_mark_dead(w, rank, reason);
    if (rank == w->rank || (w->dead[rank] & 2)) return;
    w->dead[rank] |= 2;
    l3d_world_notify(w, L3D_NOTICE_DEAD, rank, rank == w->first_dead ? w->dead_reason : reason);
}

static void notice_handle(l3d_world_t *w, const l3d_notice_t *m, int from) {
    if (m->magic != NOTICE_MAGIC || m->rank < 0 || m->rank >= w->size) return;
    w->alive[from] = 1;
    if (m->kind == L3D_NOTICE_DEAD && m->cause >= 0 && m->cause < w->size &&
        m->cause != w->rank && !w->dead[m->cause]) {
        // An earlier failure (the one the rank named stopped after): that one is the failure
        // to name, with the first reporter's detail.
        char why[192];
        snprintf(why, sizeof(why), "%.112s%sreported by rank %d%s", m->cause_reason,
                 m->cause_reason[0] ? " (" : "", from, m->cause_reason[0] ? ")" : "");
        l3d_world_mark_dead(w, m->cause, why);
    }
    if (m->kind == L3D_NOTICE_DEAD && m->rank != w->rank) {
        char why[192];
        if (from == m->rank) snprintf(why, sizeof(why), "%.112s", m->reason);
        else snprintf(why, sizeof(why), "%.112s (reported by rank %d)", m->reason, from);
        l3d_world_mark_dead(w, m->rank, why);
        if (m->rank == from) w->dead[from] |= 4;
        l3d_log(w->ctx, L3D_LOG_INFO, L3D_SUBSYS_COMM, "rank %d reports rank %d failed: %s", from,
                m->rank, m->reason);
    } else if (m->kind == L3D_NOTICE_BLAME) {
        if (m->rank != w->rank) w->blamed[m->rank] |= 1;
        else w->alive_due = !w->alive_sent;  // answered after the poll loop (no re-entry)
        w->blame_seen++;
    }
}

void l3d_world_poll_notices(l3d_world_t *w) {
    if (!w->notice_req) return;
    for (int p = 0; p < w->size; p++) {
        if (!w->notice_req[p]) continue;
        int done = 0;
        l3d_status st = l3d_tp_test(&w->tp, w->notice_req[p], &done, NULL);
        if (st < 0) {
            w->notice_req[p] = NULL;  // freed by the transport; the peer is gone for notices
        } else if (done) {
            notice_handle(w, &w->notice_in[p], p);
            notice_post(w, p);
        }
    }
    for (int i = 0; i < w->size * NOTICE_SLOTS; i++) {
        if (!w->notice_sreq[i]) continue;
        int done = 0;
        l3d_status st = l3d_tp_test(&w->tp, w->notice_sreq[i], &done, NULL);
        if (st < 0 || done) w->notice_sreq[i] = NULL;
    }
    if (w->alive_due) {
        w->alive_due = 0;
        w->alive_sent = 1;
        l3d_world_notify(w, L3D_NOTICE_ALIVE, w->rank, "alive");
    }
}

void l3d_world_flush_notices(l3d_world_t *w, double seconds) {
    if (!w->notice_sreq) return;
    double until = l3d_time_now() + seconds;
    for (;;) {
        l3d_world_poll_notices(w);
        int pending = 0;
        for (int i = 0; i < w->size * NOTICE_SLOTS; i++) pending |= w->notice_sreq[i] != NULL;
        if (!pending || l3d_time_now() > until) return;
        (void)l3d_tp_progress(&w->tp);
        sched_yield();
    }
}
