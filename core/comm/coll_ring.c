// Ring algorithms: allreduce (reduce-scatter + allgather), reduce_scatter, allgather, and the
// segment helpers every algorithm uses.
//
// Each ring step is one round; inside a step the block is cut into pipeline segments, each its
// own message, and the reduction of a segment runs as soon as that segment has arrived (while
// later segments are still in flight). Every block is reduced by exactly one rank in a fixed
// order and then copied, so results are bit-identical on all ranks.
#include <string.h>

#include "core/comm/comm_internal.h"

void l3d_coll_send_segs(l3d_sched_t *s, const l3d_coll_args_t *a, int peer, uint32_t step,
                        const void *buf, size_t bytes) {
    for (size_t o = 0; o < bytes; o += a->seg)
        l3d_sched_send(s, peer, step, (const char *)buf + o, L3D_MIN(a->seg, bytes - o));
}

void l3d_coll_recv_segs(l3d_sched_t *s, const l3d_coll_args_t *a, int peer, uint32_t step,
                        void *buf, size_t bytes) {
    for (size_t o = 0; o < bytes; o += a->seg)
        l3d_sched_recv(s, peer, step, (char *)buf + o, L3D_MIN(a->seg, bytes - o));
}

// Receives `count` wire elements from peer into tmp, segment by segment, and reduces each
// segment on arrival: dst = tmp op mine (tmp_first) or mine op tmp. The operand order is the
// caller's so that pairs of ranks computing the same value use the same order.
void l3d_coll_recv_reduce(l3d_sched_t *s, const l3d_coll_args_t *a, int peer, uint32_t step,
                          void *tmp, void *dst, const void *mine, size_t count, int tmp_first) {
    size_t segn = L3D_MAX(a->seg / a->wsz, 1);
    for (size_t o = 0; o < count; o += segn) {
        size_t n = L3D_MIN(segn, count - o);
        char *t = (char *)tmp + o * a->wsz;
        char *d = (char *)dst + o * a->wsz;
        const char *m = (const char *)mine + o * a->wsz;
        int idx = l3d_sched_recv(s, peer, step, t, n * a->wsz);
        if (tmp_first) l3d_sched_reduce(s, idx, d, t, m, n, a->wdt, a->wop);
        else l3d_sched_reduce(s, idx, d, m, t, n, a->wdt, a->wop);
    }
}

static int mod(int x, int n) { return ((x % n) + n) % n; }

// The working buffer of an allreduce: recvbuf itself, or a float32 copy for the half types.
// Opens the pre-round holding the copy/conversion.
void *l3d_coll_work_buffer(l3d_sched_t *s, const l3d_coll_args_t *a) {
    l3d_sched_round(s);
    if (a->wdt != a->dt) {
        float *w = l3d_sched_tmp(s, a->count * 4);
        if (w) l3d_sched_towire(s, -1, w, a->sendbuf, a->count, a->dt);
        return w;
    }
    l3d_sched_copy(s, -1, a->recvbuf, a->sendbuf, a->count * a->esz);
    return a->recvbuf;
}

// allreduce = ring reduce-scatter on the working buffer (rank r ends owning block r+1), the
// owner finalises its block into recvbuf (AVG divide, rounding to half), ring allgather of
// recvbuf blocks.
l3d_status l3d_coll_allreduce_ring(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, me = a->me, next = mod(me + 1, n), prev = mod(me - 1, n);
    char *w = l3d_coll_work_buffer(s, a);
    char *t = l3d_sched_tmp(s, (a->count / (size_t)n + 1) * a->wsz);
    if (!w || !t) return s->st;
    size_t off, cnt, roff, rcnt;
    for (int k = 0; k < n - 1; k++) {
        l3d_sched_round(s);
        l3d_coll_block(a->count, n, mod(me - k, n), &off, &cnt);
        l3d_coll_send_segs(s, a, next, (uint32_t)k, w + off * a->wsz, cnt * a->wsz);
        l3d_coll_block(a->count, n, mod(me - k - 1, n), &roff, &rcnt);
        l3d_coll_recv_reduce(s, a, prev, (uint32_t)k, t, w + roff * a->wsz, w + roff * a->wsz,
                             rcnt, 0);
    }
    int own = mod(me + 1, n);
    l3d_coll_block(a->count, n, own, &off, &cnt);
    l3d_sched_final(s, -1, (char *)a->recvbuf + off * a->esz, w + off * a->wsz, cnt, a->dt, a->op,
                    n);
    char *r = a->recvbuf;
    for (int k = 0; k < n - 1; k++) {
        l3d_sched_round(s);
        l3d_coll_block(a->count, n, mod(me + 1 - k, n), &off, &cnt);
        l3d_coll_send_segs(s, a, next, (uint32_t)(n - 1 + k), r + off * a->esz, cnt * a->esz);
        l3d_coll_block(a->count, n, mod(me - k, n), &roff, &rcnt);
        l3d_coll_recv_segs(s, a, prev, (uint32_t)(n - 1 + k), r + roff * a->esz, rcnt * a->esz);
    }
    return s->st;
}

// reduce_scatter: block b of every rank's sendbuf reduced into rank b's recvbuf. Step k sends
// the partial of block me-k-1 (own data at k = 0) and receives block me-k-2, adding own data;
// the last step receives block me and writes straight into recvbuf. Two accumulators in the
// wire type alternate (the one sent in step k is free again in step k+1), so no full-size copy
// of sendbuf is made and the in-place form (recvbuf inside sendbuf) is safe: block me of
// sendbuf is read only in the last step.
l3d_status l3d_coll_reduce_scatter_ring(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, me = a->me, next = mod(me + 1, n), prev = mod(me - 1, n);
    size_t c = a->count, wb = c * a->wsz;
    const char *sb = a->sendbuf;
    int half = a->wdt != a->dt;
    char *acc[2] = {l3d_sched_tmp(s, wb), l3d_sched_tmp(s, wb)};
    char *t = l3d_sched_tmp(s, wb);
    if (!acc[0] || !acc[1] || !t) return s->st;
    l3d_sched_round(s);
    const void *first = sb + (size_t)mod(me - 1, n) * c * a->esz;
    if (half) {
        l3d_sched_towire(s, -1, (float *)acc[1], first, c, a->dt);
        first = acc[1];
    }
    for (int k = 0; k < n - 1; k++) {
        l3d_sched_round(s);
        const void *out = k == 0 ? first : acc[(k + 1) % 2];
        l3d_coll_send_segs(s, a, next, (uint32_t)k, out, wb);
        int blk = mod(me - k - 2, n);
        const char *mine = sb + (size_t)blk * c * a->esz;
        int last = k == n - 2;
        char *dst = last && !half ? (char *)a->recvbuf : acc[k % 2];
        size_t segn = L3D_MAX(a->seg / a->wsz, 1);
        for (size_t o = 0; o < c; o += segn) {
            size_t m = L3D_MIN(segn, c - o);
            char *ts = t + o * a->wsz, *ds = dst + o * a->wsz;
            int idx = l3d_sched_recv(s, prev, (uint32_t)k, ts, m * a->wsz);
            if (half) {
                l3d_sched_towire(s, idx, (float *)ds, mine + o * a->esz, m, a->dt);
                l3d_sched_reduce(s, idx, ds, ds, ts, m, a->wdt, a->wop);
            } else {
                l3d_sched_reduce(s, idx, ds, mine + o * a->esz, ts, m, a->wdt, a->wop);
            }
            if (last) l3d_sched_final(s, idx, (char *)a->recvbuf + o * a->esz, ds, m, a->dt,
                                      a->op, n);
        }
    }
    return s->st;
}

// allgather ring: step k forwards block me-k to the next rank and receives block me-k-1.
l3d_status l3d_coll_allgather_ring(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, me = a->me, next = mod(me + 1, n), prev = mod(me - 1, n);
    size_t bb = a->count * a->esz;
    char *r = a->recvbuf;
    l3d_sched_round(s);
    l3d_sched_copy(s, -1, r + (size_t)me * bb, a->sendbuf, bb);
    for (int k = 0; k < n - 1; k++) {
        l3d_sched_round(s);
        l3d_coll_send_segs(s, a, next, (uint32_t)k, r + (size_t)mod(me - k, n) * bb, bb);
        l3d_coll_recv_segs(s, a, prev, (uint32_t)k, r + (size_t)mod(me - k - 1, n) * bb, bb);
    }
    return s->st;
}
