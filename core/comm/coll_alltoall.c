// Pairwise-exchange alltoall and dissemination barrier.
#include <string.h>

#include "core/comm/comm_internal.h"

// Step k (1..n-1) sends block me+k to rank me+k and receives block me-k from rank me-k: every
// rank has one peer to send to and one to receive from per step, for any n. In place
// (sendbuf == recvbuf) the send blocks are copied aside first.
l3d_status l3d_coll_alltoall_pairwise(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, me = a->me;
    size_t bb = a->count * a->esz;
    const char *src = a->sendbuf;
    char *r = a->recvbuf;
    l3d_sched_round(s);
    if (src == r) {
        char *t = l3d_sched_tmp(s, (size_t)n * bb);
        if (!t) return s->st;
        l3d_sched_copy(s, -1, t, src, (size_t)n * bb);
        src = t;
        l3d_sched_round(s);
    }
    l3d_sched_copy(s, -1, r + (size_t)me * bb, src + (size_t)me * bb, bb);
    for (int k = 1; k < n; k++) {
        int to = (me + k) % n, from = (me - k + n) % n;
        l3d_sched_round(s);
        l3d_coll_send_segs(s, a, to, (uint32_t)k, src + (size_t)to * bb, bb);
        l3d_coll_recv_segs(s, a, from, (uint32_t)k, r + (size_t)from * bb, bb);
    }
    return s->st;
}

// Dissemination (Hensgen, Finkel, Manber): in round k every rank signals rank me + 2^k and
// waits for rank me - 2^k; after ceil(log2 n) rounds everyone has transitively heard from all.
// The token is one byte (some transports dislike empty messages).
l3d_status l3d_coll_barrier_dissemination(l3d_sched_t *s, const l3d_coll_args_t *a) {
    int n = a->n, me = a->me, rounds = 0;
    for (int d = 1; d < n; d *= 2) rounds++;
    uint8_t *tok = l3d_sched_tmp(s, (size_t)rounds + 1);
    if (!tok) return s->st;
    tok[0] = 1;
    int k = 0;
    for (int d = 1; d < n; d *= 2, k++) {
        l3d_sched_round(s);
        l3d_sched_send(s, (me + d) % n, (uint32_t)k, tok, 1);
        l3d_sched_recv(s, (me - d + n) % n, (uint32_t)k, tok + 1 + k, 1);
    }
    return s->st;
}
