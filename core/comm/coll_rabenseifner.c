// Recursive algorithms: Rabenseifner allreduce (recursive-halving reduce-scatter + recursive-
// doubling allgather), recursive-doubling allreduce, recursive-doubling allgather (power of
// two ranks) and Bruck allgather (any rank count).
//
// Non-power-of-two rank counts use the standard fix-up (Rabenseifner 2004, MPICH): with p2 the
// largest power of two <= n and rem = n - p2, among the first 2*rem ranks every even rank sends
// its whole vector to the odd rank above it and sits out; the p2 remaining ranks run the
// power-of-two algorithm as "new ranks"; at the end each odd rank sends the result back down.
#include <string.h>

#include "core/comm/comm_internal.h"

typedef struct fold {
    int p2, rem, L;  // power of two, extra ranks, log2(p2)
    int v;           // new rank, -1 for a rank that sits out
} fold_t;

static fold_t fold_of(int n, int me) {
    fold_t f = {1, 0, 0, -1};
    while (f.p2 * 2 <= n) {
        f.p2 *= 2;
        f.L++;
    }
    f.rem = n - f.p2;
    if (me < 2 * f.rem) f.v = (me & 1) ? me / 2 : -1;
    else f.v = me - f.rem;
    return f;
}

static int real_rank(const fold_t *f, int v) { return v < f->rem ? 2 * v + 1 : v + f->rem; }

// The fold round: even ranks below 2*rem send w; odd ones reduce it into w (lower rank first).
static void fold_in(l3d_sched_t *s, const l3d_coll_args_t *a, const fold_t *f, char *w, char *t) {
    if (a->me >= 2 * f->rem) return;
    l3d_sched_round(s);
    if (f->v < 0) l3d_coll_send_segs(s, a, a->me + 1, 0, w, a->count * a->wsz);
    else l3d_coll_recv_reduce(s, a, a->me - 1, 0, t, w, w, a->count, 1);
}

// The unfold round: odd ranks below 2*rem send the result (recvbuf, user type) down.
static void fold_out(l3d_sched_t *s, const l3d_coll_args_t *a, const fold_t *f, uint32_t step) {
    if (a->me >= 2 * f->rem) return;
    l3d_sched_round(s);
    if (f->v < 0) l3d_coll_recv_segs(s, a, a->me + 1, step, a->recvbuf, a->count * a->esz);
    else l3d_coll_send_segs(s, a, a->me - 1, step, a->recvbuf, a->count * a->esz);
}

// Offset (elements) of block b of the p2-way split.
static size_t boff(size_t count, int p2, int b) {
    size_t off, cnt;
    if (b >= p2) return count;
    l3d_coll_block(count, p2, b, &off, &cnt);
    return off;
}

l3d_status l3d_coll_allreduce_rabenseifner(l3d_sched_t *s, const l3d_coll_args_t *a) {
    fold_t f = fold_of(a->n, a->me);
    char *w = l3d_coll_work_buffer(s, a);
    char *t = l3d_sched_tmp(s, a->count * a->wsz);
    if (!w || !t) return s->st;
    fold_in(s, a, &f, w, t);
    if (f.v >= 0) {
        // Recursive halving: keep the half of the current block range selected by each bit of
        // the new rank, from the top bit down; new rank v ends owning block v.
        int lo = 0, hi = f.p2, k = 1;
        for (int mask = f.p2 / 2; mask >= 1; mask /= 2, k++) {
            int pv = f.v ^ mask, peer = real_rank(&f, pv), mid = lo + (hi - lo) / 2;
            int klo = (f.v & mask) ? mid : lo, khi = (f.v & mask) ? hi : mid;
            int slo = (f.v & mask) ? lo : mid, shi = (f.v & mask) ? mid : hi;
            size_t ko = boff(a->count, f.p2, klo), kn = boff(a->count, f.p2, khi) - ko;
            size_t so = boff(a->count, f.p2, slo), sn = boff(a->count, f.p2, shi) - so;
            l3d_sched_round(s);
            l3d_coll_send_segs(s, a, peer, (uint32_t)k, w + so * a->wsz, sn * a->wsz);
            l3d_coll_recv_reduce(s, a, peer, (uint32_t)k, t, w + ko * a->wsz, w + ko * a->wsz,
                                 kn, pv < f.v);
            lo = klo;
            hi = khi;
        }
        size_t o = boff(a->count, f.p2, f.v), c = boff(a->count, f.p2, f.v + 1) - o;
        l3d_sched_final(s, -1, (char *)a->recvbuf + o * a->esz, w + o * a->wsz, c, a->dt, a->op,
                        a->n);
        // Recursive doubling allgather of the finished blocks, in the user type.
        char *r = a->recvbuf;
        for (int mask = 1; mask < f.p2; mask *= 2, k++) {
            int pv = f.v ^ mask, peer = real_rank(&f, pv);
            int mlo = f.v & ~(mask - 1), plo = pv & ~(mask - 1);
            size_t mo = boff(a->count, f.p2, mlo), mn = boff(a->count, f.p2, mlo + mask) - mo;
            size_t po = boff(a->count, f.p2, plo), pn = boff(a->count, f.p2, plo + mask) - po;
            l3d_sched_round(s);
            l3d_coll_send_segs(s, a, peer, (uint32_t)k, r + mo * a->esz, mn * a->esz);
            l3d_coll_recv_segs(s, a, peer, (uint32_t)k, r + po * a->esz, pn * a->esz);
        }
    }
    fold_out(s, a, &f, (uint32_t)(2 * f.L + 1));
    return s->st;
}

// Recursive doubling: log2(p2) exchanges of the whole vector. Both partners compute
// lower-rank-op-higher-rank, so they hold the same bits after every step.
l3d_status l3d_coll_allreduce_recdoubling(l3d_sched_t *s, const l3d_coll_args_t *a) {
    fold_t f = fold_of(a->n, a->me);
    char *w = l3d_coll_work_buffer(s, a);
    char *t = l3d_sched_tmp(s, a->count * a->wsz);
    if (!w || !t) return s->st;
    fold_in(s, a, &f, w, t);
    if (f.v >= 0) {
        int k = 1;
        for (int mask = 1; mask < f.p2; mask *= 2, k++) {
            int pv = f.v ^ mask, peer = real_rank(&f, pv);
            l3d_sched_round(s);
            l3d_coll_send_segs(s, a, peer, (uint32_t)k, w, a->count * a->wsz);
            l3d_coll_recv_segs(s, a, peer, (uint32_t)k, t, a->count * a->wsz);
            // w is being sent in this round: reduce only when the whole round is done
            if (pv < f.v) l3d_sched_reduce(s, -1, w, t, w, a->count, a->wdt, a->wop);
            else l3d_sched_reduce(s, -1, w, w, t, a->count, a->wdt, a->wop);
        }
        l3d_sched_round(s);
        l3d_sched_final(s, -1, a->recvbuf, w, a->count, a->dt, a->op, a->n);
    }
    fold_out(s, a, &f, (uint32_t)(f.L + 1));
    return s->st;
}

// Recursive doubling allgather (n a power of two): at distance mask the partners swap the
// contiguous mask blocks each has gathered so far.
l3d_status l3d_coll_allgather_recdoubling(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, me = a->me;
    if (n & (n - 1)) return l3d_coll_allgather_bruck(s, a);
    size_t bb = a->count * a->esz;
    char *r = a->recvbuf;
    l3d_sched_round(s);
    l3d_sched_copy(s, -1, r + (size_t)me * bb, a->sendbuf, bb);
    int k = 0;
    for (int mask = 1; mask < n; mask *= 2, k++) {
        int peer = me ^ mask, mlo = me & ~(mask - 1), plo = peer & ~(mask - 1);
        l3d_sched_round(s);
        l3d_coll_send_segs(s, a, peer, (uint32_t)k, r + (size_t)mlo * bb, (size_t)mask * bb);
        l3d_coll_recv_segs(s, a, peer, (uint32_t)k, r + (size_t)plo * bb, (size_t)mask * bb);
    }
    return s->st;
}

// Bruck: ceil(log2 n) steps on a rotated buffer b where b[i] is the block of rank me+i; step
// with distance d sends the first min(d, n-d) blocks to me-d and appends those of me+d. A final
// rotation puts the blocks in rank order.
l3d_status l3d_coll_allgather_bruck(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, me = a->me;
    size_t bb = a->count * a->esz;
    char *b = l3d_sched_tmp(s, (size_t)n * bb);
    if (!b) return s->st;
    l3d_sched_round(s);
    l3d_sched_copy(s, -1, b, a->sendbuf, bb);
    int k = 0;
    for (int d = 1; d < n; d *= 2, k++) {
        int cnt = L3D_MIN(d, n - d);
        l3d_sched_round(s);
        l3d_coll_send_segs(s, a, (me - d + n) % n, (uint32_t)k, b, (size_t)cnt * bb);
        l3d_coll_recv_segs(s, a, (me + d) % n, (uint32_t)k, b + (size_t)d * bb, (size_t)cnt * bb);
    }
    l3d_sched_round(s);
    char *r = a->recvbuf;
    l3d_sched_copy(s, -1, r + (size_t)me * bb, b, (size_t)(n - me) * bb);
    l3d_sched_copy(s, -1, r, b + (size_t)(n - me) * bb, (size_t)me * bb);
    return s->st;
}
