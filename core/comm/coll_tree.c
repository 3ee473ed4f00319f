// Tree-shaped algorithms: binomial broadcast and reduce, the pipelined chain forms of both for
// large messages, and allreduce as binomial reduce + binomial broadcast.
//
// Ranks are renumbered relative to the root (v = me - root mod n). In the binomial tree the
// parent of v is v minus its lowest set bit; children are v + mask for the masks below it.
// Reductions add children in increasing mask order, a fixed order, so the result does not
// depend on timing.
#include <string.h>

#include "core/comm/comm_internal.h"

static int lowbit(int v) { return v & -v; }
static int log2i(int v) {
    int k = 0;
    while ((1 << (k + 1)) <= v) k++;
    return k;
}
static int ceil_pow2(int n) {
    int p = 1;
    while (p < n) p *= 2;
    return p;
}

// Binomial broadcast of `bytes` from root `root` out of `src` (root) into `dst` (everyone).
static void bcast_tree(l3d_sched_t *s, const l3d_coll_args_t *a, const void *src, void *dst,
                       size_t bytes, int root) {
    int n = a->n, v = (a->me - root + n) % n;
    int top = v ? lowbit(v) : ceil_pow2(n);
    if (v) {
        l3d_sched_round(s);
        l3d_coll_recv_segs(s, a, (v - lowbit(v) + root) % n, (uint32_t)log2i(lowbit(v)), dst,
                           bytes);
        src = dst;
    }
    l3d_sched_round(s);
    if (!v) l3d_sched_copy(s, -1, dst, src, bytes);
    for (int mask = top / 2; mask >= 1; mask /= 2)
        if (v + mask < n)
            l3d_coll_send_segs(s, a, (v + mask + root) % n, (uint32_t)log2i(mask), src, bytes);
}

l3d_status l3d_coll_broadcast_tree(l3d_sched_t *s, const l3d_coll_args_t *a) {
    bcast_tree(s, a, a->sendbuf, a->recvbuf, a->count * a->esz, a->root);
    return s->st;
}

// Chain: root -> v1 -> v2 -> ... ; round t of a middle rank receives segment t and forwards
// segment t-1, so segments flow down the chain in a wavefront.
l3d_status l3d_coll_broadcast_chain(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, v = (a->me - a->root + n) % n;
    int prev = (a->me - 1 + n) % n, next = (a->me + 1) % n;
    size_t bytes = a->count * a->esz, seg = a->seg;
    size_t nseg = (bytes + seg - 1) / seg;
    char *r = a->recvbuf;
    if (v == 0) {
        l3d_sched_round(s);
        l3d_sched_copy(s, -1, r, a->sendbuf, bytes);
        for (size_t t = 0; t < nseg; t++)
            l3d_sched_send(s, next, (uint32_t)t, (const char *)a->sendbuf + t * seg,
                           L3D_MIN(seg, bytes - t * seg));
        return s->st;
    }
    for (size_t t = 0; t <= nseg; t++) {
        l3d_sched_round(s);
        if (t < nseg)
            l3d_sched_recv(s, prev, (uint32_t)t, r + t * seg, L3D_MIN(seg, bytes - t * seg));
        if (t >= 1 && v < n - 1)
            l3d_sched_send(s, next, (uint32_t)(t - 1), r + (t - 1) * seg,
                           L3D_MIN(seg, bytes - (t - 1) * seg));
    }
    return s->st;
}

// The buffer a reducing rank accumulates into (count wire elements): recvbuf at the root
// (float32 temporary for half types), a temporary elsewhere, sendbuf itself for a leaf that
// only sends (no half conversion needed).
static char *reduce_work(l3d_sched_t *s, const l3d_coll_args_t *a, int is_root, int has_input,
                         void *rootbuf) {
    l3d_sched_round(s);
    if (a->wdt != a->dt) {
        float *w = l3d_sched_tmp(s, a->count * 4);
        if (w) l3d_sched_towire(s, -1, w, a->sendbuf, a->count, a->dt);
        return (char *)w;
    }
    if (is_root) {
        l3d_sched_copy(s, -1, rootbuf, a->sendbuf, a->count * a->esz);
        return rootbuf;
    }
    if (!has_input) return (char *)a->sendbuf;
    char *w = l3d_sched_tmp(s, a->count * a->wsz);
    if (w) l3d_sched_copy(s, -1, w, a->sendbuf, a->count * a->esz);
    return w;
}

// Binomial reduce into `out` at `root`; returns the root's working buffer (wire type) or NULL.
// `finalize`: the root writes the final (AVG, rounded) value to out.
static char *reduce_tree(l3d_sched_t *s, const l3d_coll_args_t *a, int root, void *out,
                         int finalize) {
    int n = a->n, v = (a->me - root + n) % n;
    int has_child = v + 1 < n && !(v & 1);
    char *w = reduce_work(s, a, v == 0, has_child, out);
    char *t = has_child ? l3d_sched_tmp(s, a->count * a->wsz) : NULL;
    if (!w || (has_child && !t)) return NULL;
    for (int mask = 1; mask < n; mask *= 2) {
        l3d_sched_round(s);
        if (v & mask) {
            l3d_coll_send_segs(s, a, (v - mask + root) % n, (uint32_t)log2i(mask), w,
                               a->count * a->wsz);
            break;
        }
        if (v + mask < n)
            l3d_coll_recv_reduce(s, a, (v + mask + root) % n, (uint32_t)log2i(mask), t, w, w,
                                 a->count, 0);
    }
    if (v == 0 && finalize) {
        l3d_sched_round(s);
        l3d_sched_final(s, -1, out, w, a->count, a->dt, a->op, n);
    }
    return w;
}

l3d_status l3d_coll_reduce_tree(l3d_sched_t *s, const l3d_coll_args_t *a) {
    reduce_tree(s, a, a->root, a->recvbuf, 1);
    return s->st;
}

// Chain reduce: the last rank of the chain sends its data segment by segment towards the root;
// each rank on the way adds its own segment on arrival and passes the partial on.
l3d_status l3d_coll_reduce_chain(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, v = (a->me - a->root + n) % n;
    int up = (a->me - 1 + n) % n, down = (a->me + 1) % n;
    char *w = reduce_work(s, a, v == 0, v < n - 1, a->recvbuf);
    if (!w) return s->st;
    size_t segn = L3D_MAX(a->seg / a->wsz, 1), nseg = (a->count + segn - 1) / segn;
    if (v == n - 1) {
        l3d_sched_round(s);
        l3d_coll_send_segs(s, a, up, 0, w, a->count * a->wsz);
        return s->st;
    }
    char *t[2] = {l3d_sched_tmp(s, segn * a->wsz), l3d_sched_tmp(s, segn * a->wsz)};
    if (!t[0] || !t[1]) return s->st;
    for (size_t k = 0; k <= nseg; k++) {
        l3d_sched_round(s);
        if (k < nseg) {
            size_t o = k * segn, m = L3D_MIN(segn, a->count - o);
            int idx = l3d_sched_recv(s, down, 0, t[k % 2], m * a->wsz);
            l3d_sched_reduce(s, idx, w + o * a->wsz, w + o * a->wsz, t[k % 2], m, a->wdt, a->wop);
        }
        if (k >= 1 && v > 0) {
            size_t o = (k - 1) * segn, m = L3D_MIN(segn, a->count - o);
            l3d_sched_send(s, up, 0, w + o * a->wsz, m * a->wsz);
        }
    }
    if (v == 0) {
        l3d_sched_round(s);
        l3d_sched_final(s, -1, a->recvbuf, w, a->count, a->dt, a->op, n);
    }
    return s->st;
}

// allreduce = binomial reduce to rank 0 (wire type, finalised there into recvbuf) + binomial
// broadcast of recvbuf.
l3d_status l3d_coll_allreduce_tree(l3d_sched_t *s, const l3d_coll_args_t *a) {
    if (!reduce_tree(s, a, 0, a->recvbuf, 1)) return s->st < 0 ? s->st : L3D_ERR_NOMEM;
    bcast_tree(s, a, a->recvbuf, a->recvbuf, a->count * a->esz, 0);
    return s->st;
}
