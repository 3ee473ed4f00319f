// Small collectives among the processes of one machine, through a segment they all map.
//
// Over a message transport the floor of a small allreduce is the provider's one-way latency
// (ucx_perftest tag_lat 8 B: 0.57 us here; libfabric shm 64 B: 1.4 us), paid at least once
// per call, where OpenMPI's shared-memory path pays one cache line crossing (~0.5 us on this
// project's VMs). So a communicator whose members all share a machine gets a segment (an
// anonymous memfd, platform/shm.c) at creation, and its small calls exchange data there:
//
//   per member   SH_RING slots (a 32-byte header and SH_DATA bytes; the header and the first
//                32 data bytes share a cache line) and a `done` counter on a line of its own.
//                Slots are 8 KiB of data (the in-process transport's 4064 bytes left 4 KiB
//                calls on the message path: 3.3 us over UCX where 1 KiB took 0.8).
//   publish      copy my contribution into my slot of call k (k mod SH_RING), then store its
//                seq = k + 1 (release).
//   complete     once every slot I read shows k + 1 (acquire) and my call k - 1 completed:
//                compute my output from the slots, store done = k + 1 (release).
//
// Members make the same calls in the same order, so call k is call k everywhere. A slot is
// written again (call k + SH_RING) only once every member's done is past k; a call that cannot
// publish yet does so from a later test (the core advances every active request on each wait,
// so a member blocked elsewhere still completes its earlier calls and frees the slot).
//
// Which calls (l3d_comm_shm_fits): allreduce, reduce_scatter, allgather, broadcast, reduce and
// barrier whose per-member contribution fits a slot and whose reads stay within SH_READ. The
// test uses only (op, n, count, dtype), which the members of a matching call share; a
// mismatched call on the same side of the limit fails at once naming both shapes.
//
// Reductions run in member order with the core's reduce helpers (half types widened to float32
// and rounded once), so every member computes the same bits.
//
// Failures: no message of the call goes through the transport, but the world's failure notices
// (a peer's connection lost, an abort, a blame) fail a waiting call through l3d_comm_check as
// for any request, and the core's timeout names the member not yet started. A call that fails
// or is cancelled leaves later calls on the communicator failing fast (its ring would never
// advance).
//
// Setup (l3d_comm_shm_setup, collective over a new communicator: two small calls through the
// transport, or two exchanges through the bootstrap store for the world): member 0 creates the
// segment and broadcasts (pid, fd, nonce); the others map
// /proc/<pid>/fd/<fd> and check the nonce; an allreduce(min) of "mapped" decides for all, so a
// member on another machine or in another pid namespace makes the whole communicator keep the
// message path. Member 0 then closes its descriptor: the mappings keep the memory, nothing is
// left in /dev/shm by any crash.
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/comm/bootstrap.h"
#include "core/comm/comm_internal.h"
#include "core/comm/reduce.h"
#include "platform/platform.h"

#define SH_RING 4             // calls in flight per communicator before one waits
#define SH_HDR 32             // the slot's header: the first 32 data bytes share its line
#define SH_DATA 8192          // a power of two: 4 KiB and 8 KiB calls are common
#define SH_SLOT (SH_HDR + SH_DATA + 32)  // a whole number of cache lines
#define SH_READ (16u << 10)   // slot bytes one member reads per call, at most
#define SH_HEAD 4096          // the segment's header page
#define SH_MAX_MEMBERS 256
#define SH_MAGIC UINT64_C(0x316d68732d643333)  // "33d-shm1"

typedef struct shslot {
    _Atomic uint64_t seq;  // 1 + k once the header and data below hold call k
    uint64_t count;
    int32_t op, dt, rop, root;
    unsigned char data[SH_DATA];
    unsigned char pad[SH_SLOT - SH_HDR - SH_DATA];
} shslot_t;
_Static_assert(offsetof(shslot_t, data) == SH_HDR && sizeof(shslot_t) == SH_SLOT, "slot");

typedef struct shdone {
    _Alignas(64) _Atomic uint64_t v;  // calls this member has completed (all of 0..v-1)
} shdone_t;

typedef struct shhead {
    uint64_t magic, nonce;
    int64_t n;
} shhead_t;
_Static_assert(sizeof(shhead_t) <= SH_HEAD, "header page");

struct l3d_comm_shm {
    void *mem;
    size_t bytes;
    shslot_t *slot;  // [n * SH_RING]: member j's slot of call k at j * SH_RING + k % SH_RING
    shdone_t *done;  // [n]
    int n, me;
    uint64_t started, done_k;  // calls started, calls completed (in order) by this member
    uint64_t min_done;         // every member's done was at least this when last looked at
    int broken;                // a call failed or was cancelled: the ring may be stuck
    const void *src[SH_MAX_MEMBERS];
    float acc[SH_DATA / 2], aux[SH_DATA / 2];  // reduction scratch (half types widen to f32)
};

static size_t seg_bytes(int n) {
    return SH_HEAD + (size_t)n * SH_RING * sizeof(shslot_t) + (size_t)n * sizeof(shdone_t);
}

static shslot_t *slot_of(const l3d_comm_shm_t *sh, int j, uint64_t k) {
    return &sh->slot[(size_t)j * SH_RING + k % SH_RING];
}

// Bytes a member publishes for a call (reduce_scatter: all n blocks; broadcast: the root's).
static size_t pub_bytes(int op, size_t bytes, int n, int is_root) {
    if (op == L3D_COLL_REDUCE_SCATTER) return (size_t)n * bytes;
    if ((op == L3D_COLL_BROADCAST && !is_root) || op == L3D_COLL_BARRIER) return 0;
    return bytes;
}

// Whether member `me` reads member j's slot of a call (broadcast: the root's; reduce: the root
// reads all, the others none).
static int reads(int op, int me, int root, int j) {
    if (op == L3D_COLL_BROADCAST) return j == root;
    if (op == L3D_COLL_REDUCE) return me == root;
    return 1;
}

int l3d_comm_shm_fits(const l3d_comm_t *c, l3d_coll op, size_t count, l3d_dtype dt) {
    if (!c->shm) return 0;
    switch (op) {
    case L3D_COLL_ALLREDUCE:
    case L3D_COLL_REDUCE_SCATTER:
    case L3D_COLL_ALLGATHER:
    case L3D_COLL_BROADCAST:
    case L3D_COLL_REDUCE:
    case L3D_COLL_BARRIER:
        break;
    default:
        return 0;
    }
    size_t b = count * l3d_dtype_size(dt);
    if (b > SH_DATA) return 0;
    size_t read = op == L3D_COLL_BROADCAST ? b : (size_t)c->size * b;
    return pub_bytes(op, b, c->size, 1) <= SH_DATA && read <= SH_READ;
}

// ---- setup ---------------------------------------------------------------------------------
static void shm_release(l3d_ctx_t *ctx, l3d_comm_shm_t *sh) {
    if (!sh) return;
    l3d_shm_unmap(sh->mem, sh->bytes);
    l3d_free(ctx, sh, sizeof(*sh), "comm");
}

void l3d_comm_shm_free(l3d_comm_t *c) {
    shm_release(c->ctx, c->shm);
    c->shm = NULL;
}

// Writes the header of a fresh segment; returns its nonce.
static uint64_t head_init(void *mem, const void *salt, int n) {
    shhead_t *h = mem;
    h->magic = SH_MAGIC;
    h->nonce = (uint64_t)(l3d_time_wall() * 1e9) ^ ((uint64_t)(uintptr_t)salt << 16) ^
               (uint64_t)l3d_process_id();
    h->n = n;
    return h->nonce;
}

// Gives c the mapping mem (taken over: unmapped on failure).
static l3d_status adopt(l3d_comm_t *c, void *mem, size_t bytes) {
    l3d_comm_shm_t *sh = l3d_calloc(c->ctx, 1, sizeof(*sh), "comm");
    if (!sh) {
        l3d_shm_unmap(mem, bytes);
        return L3D_ERR_NOMEM;
    }
    int n = c->size;
    sh->mem = mem;
    sh->bytes = bytes;
    sh->slot = (shslot_t *)((char *)mem + SH_HEAD);
    sh->done = (shdone_t *)((char *)mem + SH_HEAD + (size_t)n * SH_RING * sizeof(shslot_t));
    sh->n = n;
    sh->me = c->rank;
    c->shm = sh;
    l3d_log(c->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM,
            "communicator %u: %d members share a %zu-byte segment for small calls", c->id, n,
            bytes);
    return L3D_OK;
}

// How the members agree at setup: `share` gives every member member 0's info, `all_min` every
// member the minimum of v. Over the communicator's own collectives, or over the bootstrap store
// for the world communicator: there every member returns from l3d_comm_create_env only once all
// have answered, so a rank that aborts right after creation cannot break a peer's creation
// (test_comm_fail early_abort) as it could in the middle of a collective.
typedef struct shm_xchg {
    l3d_status (*share)(void *arg, int64_t info[4]);
    l3d_status (*all_min)(void *arg, int32_t *v);
    void *arg;
} shm_xchg_t;

static l3d_status setup(l3d_comm_t *c, const shm_xchg_t *x) {
    int n = c->size, me = c->rank;
    // Both exchanges run whatever this process's L3D_COMM_SHM says (another's may differ).
    int want = l3d_ctx_settings(c->ctx)->comm_shm;
    size_t bytes = seg_bytes(n);
    int fd = -1;
    void *mem = NULL;
    // info: the creator's pid, its descriptor, the nonce, and whether it made one.
    int64_t info[4] = {0, -1, 0, 0};
    if (me == 0 && want && l3d_shm_create(bytes, &fd, &mem) == 0) {
        info[0] = l3d_process_id();
        info[1] = fd;
        info[2] = (int64_t)head_init(mem, c, n);
        info[3] = 1;
    }
    l3d_status st = x->share(x->arg, info);
    int32_t ok = st == L3D_OK && want && info[3] == 1;
    if (ok && me != 0) {
        if (l3d_shm_attach(info[0], (int)info[1], bytes, &mem) != 0) {
            ok = 0;
        } else {
            const shhead_t *h = mem;
            ok = h->magic == SH_MAGIC && h->nonce == (uint64_t)info[2] && h->n == n;
        }
    }
    if (st == L3D_OK) st = x->all_min(x->arg, &ok);
    l3d_shm_close_fd(fd);  // every member has mapped it or given up
    if (st < 0 || ok != 1) {
        l3d_shm_unmap(mem, bytes);
        if (st == L3D_OK && want)
            l3d_log(c->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM,
                    "communicator %u: no shared segment (members on other machines or in "
                    "other pid namespaces); small calls use %s messages",
                    c->id, c->world->tp.ops->name);
        return st;
    }
    return adopt(c, mem, bytes);
}

static l3d_status comm_share(void *arg, int64_t info[4]) {
    return l3d_comm_broadcast(arg, info, info, 4, L3D_INT64, 0);
}
static l3d_status comm_all_min(void *arg, int32_t *v) {
    int32_t mine = *v;
    return l3d_comm_allreduce(arg, &mine, v, 1, L3D_INT32, L3D_MIN);
}

l3d_status l3d_comm_shm_setup(l3d_comm_t *c) {
    if (c->size < 2 || c->size > SH_MAX_MEMBERS) return L3D_OK;  // one member: copies
    shm_xchg_t x = {comm_share, comm_all_min, c};
    l3d_comm_stats_t keep = c->stats;  // the setup's two calls are not the caller's traffic
    l3d_status st = setup(c, &x);
    c->stats = keep;
    return st;
}

typedef struct boot_arg {
    l3d_bootstrap_t *bs;
    int n;
} boot_arg_t;

static l3d_status boot_share(void *arg, int64_t info[4]) {
    boot_arg_t *b = arg;
    void **all = NULL;
    size_t *lens = NULL;
    L3D_CHECK(NULL, l3d_bootstrap_allgather(b->bs, "l3d.comm.shm.info", info, 4 * sizeof(int64_t),
                                            &all, &lens));
    l3d_status st = lens[0] == 4 * sizeof(int64_t) ? L3D_OK : L3D_ERR_INTERNAL;
    if (st == L3D_OK) memcpy(info, all[0], 4 * sizeof(int64_t));
    l3d_bootstrap_free_all(b->bs, all, lens);
    return st;
}
static l3d_status boot_all_min(void *arg, int32_t *v) {
    boot_arg_t *b = arg;
    void **all = NULL;
    size_t *lens = NULL;
    L3D_CHECK(NULL, l3d_bootstrap_allgather(b->bs, "l3d.comm.shm.ok", v, sizeof(*v), &all, &lens));
    for (int i = 0; i < b->n; i++) {
        int32_t x = 0;
        if (lens[i] == sizeof(x)) memcpy(&x, all[i], sizeof(x));
        *v = x < *v ? x : *v;
    }
    l3d_bootstrap_free_all(b->bs, all, lens);
    return L3D_OK;
}

l3d_status l3d_comm_shm_setup_boot(l3d_comm_t *c, l3d_bootstrap_t *bs) {
    if (c->size < 2 || c->size > SH_MAX_MEMBERS) return L3D_OK;
    boot_arg_t b = {bs, c->size};
    shm_xchg_t x = {boot_share, boot_all_min, &b};
    return setup(c, &x);
}

l3d_status l3d_comm_shm_setup_local(l3d_comm_t *const *comms, int n) {
    if (n < 2 || n > SH_MAX_MEMBERS || !l3d_ctx_settings(comms[0]->ctx)->comm_shm)
        return L3D_OK;
    size_t bytes = seg_bytes(n);
    int fd = -1;
    void *mem = NULL;
    l3d_status st = L3D_OK;
    if (l3d_shm_create(bytes, &fd, &mem) != 0) return L3D_OK;  // native calls serve
    head_init(mem, comms, n);
    l3d_shm_unmap(mem, bytes);
    for (int i = 0; i < n && st == L3D_OK; i++) {
        if (l3d_shm_attach(l3d_process_id(), fd, bytes, &mem) != 0) {
            for (int j = 0; j < i; j++) l3d_comm_shm_free(comms[j]);
            break;
        }
        st = adopt(comms[i], mem, bytes);  // each rank its own mapping, unmapped at destroy
    }
    l3d_shm_close_fd(fd);
    return st;
}

// ---- one call ------------------------------------------------------------------------------
void l3d_sched_shm(l3d_sched_t *s, l3d_comm_t *c, l3d_coll op, const l3d_tp_coll_args_t *args) {
    l3d_sched_round(s);
    l3d_sched_native(s, NULL, args);
    if (s->st < 0) return;
    s->p2p[s->np - 1].send = 3;
    s->shm_op = (uint8_t)op;
    s->shm_k = c->shm->started++;  // in call order, which every member shares
}

// Writes this member's slot of call k if every member is past the call that used it last;
// returns whether it did.
static int publish(l3d_comm_shm_t *sh, l3d_sched_t *s) {
    uint64_t k = s->shm_k;
    const l3d_tp_coll_args_t *a = &s->nargs;
    if (k + 1 > sh->min_done + SH_RING) {
        uint64_t m = UINT64_MAX;
        for (int j = 0; j < sh->n; j++) {
            uint64_t v = atomic_load_explicit(&sh->done[j].v, memory_order_acquire);
            m = v < m ? v : m;
        }
        sh->min_done = m;
        if (k + 1 > m + SH_RING) return 0;
    }
    shslot_t *sl = slot_of(sh, sh->me, k);
    size_t pub = pub_bytes(s->shm_op, a->count * l3d_dtype_size(a->dt), sh->n, sh->me == a->root);
    if (pub) memcpy(sl->data, a->sendbuf, pub);
    sl->count = a->count;
    sl->op = s->shm_op;
    sl->dt = a->dt;
    sl->rop = a->op;
    sl->root = a->root;
    atomic_store_explicit(&sl->seq, k + 1, memory_order_release);
    s->shm_pub = 1;
    return 1;
}

void l3d_comm_shm_post(l3d_comm_t *c, l3d_sched_t *s) {
    l3d_comm_shm_t *sh = c->shm;
    if (!sh->broken) (void)publish(sh, s);  // else a later test does
}

// out (dt) = member-order reduction of elements [boff/esz, +m) of every slot.
static void reduce_slots(l3d_comm_shm_t *sh, uint64_t k, l3d_dtype dt, l3d_redop op, size_t boff,
                         size_t m, void *out) {
    int n = sh->n;
    for (int j = 0; j < n; j++) sh->src[j] = slot_of(sh, j, k)->data + boff;
    l3d_dtype wdt = l3d_reduce_wire_type(dt);
    if (wdt == dt) {
        l3d_reduce_apply(sh->acc, sh->src[0], sh->src[1], m, wdt, op);
        for (int j = 2; j < n; j++) l3d_reduce_apply(sh->acc, sh->acc, sh->src[j], m, wdt, op);
    } else {
        l3d_reduce_to_f32(sh->acc, sh->src[0], m, dt);
        for (int j = 1; j < n; j++) {
            l3d_reduce_to_f32(sh->aux, sh->src[j], m, dt);
            l3d_reduce_apply(sh->acc, sh->acc, sh->aux, m, wdt, op);
        }
    }
    l3d_reduce_final(out, sh->acc, m, dt, op, n);
}

// The output of call k from the slots (all that this member reads hold the call).
static void compute(l3d_comm_shm_t *sh, const l3d_sched_t *s) {
    const l3d_tp_coll_args_t *a = &s->nargs;
    uint64_t k = s->shm_k;
    size_t b = a->count * l3d_dtype_size(a->dt);
    switch (s->shm_op) {
    case L3D_COLL_ALLREDUCE:
        reduce_slots(sh, k, a->dt, a->op, 0, a->count, a->recvbuf);
        break;
    case L3D_COLL_REDUCE_SCATTER:
        reduce_slots(sh, k, a->dt, a->op, (size_t)sh->me * b, a->count, a->recvbuf);
        break;
    case L3D_COLL_REDUCE:
        if (sh->me == a->root) reduce_slots(sh, k, a->dt, a->op, 0, a->count, a->recvbuf);
        break;
    case L3D_COLL_ALLGATHER:
        for (int j = 0; j < sh->n; j++)
            memcpy((char *)a->recvbuf + (size_t)j * b, slot_of(sh, j, k)->data, b);
        break;
    case L3D_COLL_BROADCAST:
        if (sh->me != a->root) memcpy(a->recvbuf, slot_of(sh, a->root, k)->data, b);
        else if (a->recvbuf != a->sendbuf) memcpy(a->recvbuf, a->sendbuf, b);
        break;
    default:  // barrier: nothing moves
        break;
    }
}

// A peer's header that does not match this member's call, described (else 0).
static int mismatch(const l3d_sched_t *s, const shslot_t *sl, int peer, char *buf, size_t len) {
    const l3d_tp_coll_args_t *a = &s->nargs;
    int op = s->shm_op;
    int reduces = op == L3D_COLL_ALLREDUCE || op == L3D_COLL_REDUCE_SCATTER ||
                  op == L3D_COLL_REDUCE;
    int rooted = op == L3D_COLL_BROADCAST || op == L3D_COLL_REDUCE;
    if (sl->op == op && sl->count == a->count && sl->dt == (int32_t)a->dt &&
        (!reduces || sl->rop == (int32_t)a->op) && (!rooted || sl->root == a->root))
        return 0;
    const char *theirs = (unsigned)sl->op < L3D_COLL_COUNT ? l3d_coll_name((l3d_coll)sl->op) : "?";
    const char *their_dt = (unsigned)sl->dt < L3D_DTYPE_COUNT ? l3d_dtype_name((l3d_dtype)sl->dt)
                                                              : "?";
    snprintf(buf, len,
             "this rank called %s(count %zu, %s, root %d) where rank %d called %s(count %" PRIu64
             ", %s, root %d)",
             l3d_coll_name((l3d_coll)op), a->count, l3d_dtype_name(a->dt), a->root, peer, theirs,
             sl->count, their_dt, sl->root);
    return 1;
}

// The first member (communicator rank) this member's call k still waits for, or -1;
// `started` says whether it waits for that member to publish (else to finish an earlier call).
static int awaited(const l3d_comm_shm_t *sh, const l3d_sched_t *s, int *started) {
    const l3d_tp_coll_args_t *a = &s->nargs;
    for (int j = 0; j < sh->n; j++) {
        if (!s->shm_pub && atomic_load(&sh->done[j].v) + SH_RING < s->shm_k + 1) {
            *started = 0;
            return j;
        }
        if (s->shm_pub && reads(s->shm_op, sh->me, a->root, j) &&
            atomic_load(&slot_of(sh, j, s->shm_k)->seq) != s->shm_k + 1) {
            *started = 1;
            return j;
        }
    }
    return -1;
}

l3d_status l3d_comm_shm_test(l3d_comm_t *c, l3d_sched_t *s, const char *what, int *done_p) {
    l3d_comm_shm_t *sh = c->shm;
    const l3d_tp_coll_args_t *a = &s->nargs;
    uint64_t k = s->shm_k;
    *done_p = 0;
    if (sh->broken)
        return l3d_comm_fail(c, L3D_ERR_PEER_FAILED,
                             "%s: an earlier collective on this communicator failed or was "
                             "cancelled", what);
    int ready = (s->shm_pub || publish(sh, s)) && sh->done_k == k;
    for (int j = 0; ready && j < sh->n; j++)
        ready = !reads(s->shm_op, sh->me, a->root, j) ||
                atomic_load_explicit(&slot_of(sh, j, k)->seq, memory_order_acquire) == k + 1;
    if (!ready) return L3D_OK;
    for (int j = 0; j < sh->n; j++) {
        char d[224];
        if (j != sh->me && reads(s->shm_op, sh->me, a->root, j) &&
            mismatch(s, slot_of(sh, j, k), c->ranks[j], d, sizeof(d))) {
            sh->broken = 1;
            return l3d_comm_fail(c, L3D_ERR_INVALID_ARG, "%s: %s", what, d);
        }
    }
    compute(sh, s);
    sh->done_k = k + 1;
    atomic_store_explicit(&sh->done[sh->me].v, sh->done_k, memory_order_release);
    *done_p = 1;
    return L3D_OK;
}

int l3d_comm_shm_waiting_on(const l3d_comm_t *c, const l3d_sched_t *s, char *buf, size_t len) {
    int started = 0, j = awaited(c->shm, s, &started);
    if (j < 0) {
        if (len) buf[0] = 0;
        return -1;
    }
    snprintf(buf, len, "rank %d has not %s", c->ranks[j],
             started ? "started it" : "finished an earlier call");
    return c->ranks[j];
}

// Nothing to wait for: peers only read the slots. The call's slot and counter will not
// advance, so later calls on the communicator fail.
void l3d_comm_shm_cancel(l3d_comm_t *c) { c->shm->broken = 1; }
