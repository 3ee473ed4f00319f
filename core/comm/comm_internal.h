// Folder core/comm (docs/architecture.md): communicators, schedules and requests, collective
// algorithms and their selection, the shared-memory path, bootstrap and rendezvous, reduction
// kernels, the process mesh, the transport registry. May use: core/ root, platform/, the
// transport vtable (transports/transport.h) and include/llama3d/.
//
// Communicator internals shared by core/comm*.c and core/coll_*.c: the world (one transport
// endpoint per rank), communicators, schedules (libNBC style) and requests.
// defines: l3d_world_t, struct l3d_comm, l3d_sched_t, struct l3d_request, l3d_coll_args_t,
//          l3d_tag_*, l3d_sched_*, l3d_coll_* algorithm builders
//
// Layering: a collective call builds a schedule (rounds of point-to-point ops, each round
// followed by local ops), wraps it in a request and advances the request inside
// l3d_request_test/wait. Blocking calls are build + wait. See docs/comm.md.
#ifndef L3D_COMM_INTERNAL_H
#define L3D_COMM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/l3d_core.h"
#include "core/comm/reduce.h"
#include "devices/device.h"
#include "llama3d/comm.h"
#include "transports/transport.h"

// ---- tags -------------------------------------------------------------------------------------
// A tag packs (kind, communicator id, collective sequence number, step) into the low
// caps.tag_bits bits, kind in the top two. With 32 usable bits: 2 kind | 10 id | 12 seq | 8 step;
// with 48 or more: 2 | 16 | 16 | rest. Fields wrap (id mod 2^idb, seq mod 2^seqb, step mod
// 2^stepb): that is safe because messages with the same (source, tag) match in posting order,
// and every algorithm posts its messages to one peer in the same order on both sides.
enum { L3D_TAG_COLL = 0, L3D_TAG_P2P = 1, L3D_TAG_CTRL = 2 };

typedef struct l3d_tag_layout {
    int bits, id_bits, seq_bits, step_bits;
} l3d_tag_layout_t;

void l3d_tag_layout_init(l3d_tag_layout_t *t, int tag_bits);
uint64_t l3d_tag_make(const l3d_tag_layout_t *t, unsigned kind, uint32_t id, uint32_t seq,
                      uint32_t step);
uint64_t l3d_tag_step_mask(const l3d_tag_layout_t *t);

// ---- collective identifiers (selection, L3D_ALGO, logging) ------------------------------------
typedef enum l3d_coll {
    L3D_COLL_ALLREDUCE,
    L3D_COLL_REDUCE_SCATTER,
    L3D_COLL_ALLGATHER,
    L3D_COLL_BROADCAST,
    L3D_COLL_REDUCE,
    L3D_COLL_ALLTOALL,
    L3D_COLL_BARRIER,
    L3D_COLL_COUNT
} l3d_coll;

typedef enum l3d_algo {
    L3D_ALGO_AUTO = 0,   // cost model decides
    L3D_ALGO_NATIVE,     // the transport's coll table entry
    L3D_ALGO_RING,
    L3D_ALGO_RABENSEIFNER,
    L3D_ALGO_RECDOUBLING,
    L3D_ALGO_TREE,       // allreduce: binomial reduce + binomial broadcast
    L3D_ALGO_BRUCK,
    L3D_ALGO_CHAIN,      // pipelined chain (broadcast, reduce)
    L3D_ALGO_PAIRWISE,
    L3D_ALGO_DISSEMINATION,
    L3D_ALGO_COUNT
} l3d_algo;

const char *l3d_coll_name(l3d_coll op);
const char *l3d_algo_name(l3d_algo a);

// ---- the world: one rank's transport endpoint, shared by every communicator split from it ----
typedef struct l3d_mr_entry {
    char *ptr;
    size_t len;
    void *mr;
} l3d_mr_entry_t;

// Failure notices: small control messages a rank broadcasts when it sees a peer fail or times
// out (docs/comm.md "failure model"), so ranks that never talk to the dead rank directly can
// still name it.
// ALIVE answers a BLAME about the sender: a rank that is itself waiting (on the rank that
// really stopped) must not be mistaken for the unresponsive one by ranks whose timeout came
// first.
enum { L3D_NOTICE_DEAD = 1, L3D_NOTICE_BLAME = 2, L3D_NOTICE_ALIVE = 3 };
typedef struct l3d_notice {
    uint32_t magic;
    int32_t kind;      // L3D_NOTICE_*
    int32_t reporter;  // world rank that sent it
    int32_t rank;      // world rank it is about
    int32_t cause;     // DEAD: the first failure the reporter knows of, when another rank
                       // (-1: none), e.g. the one that made the reporter abort, so receivers
                       // name that one even if the separate notice about it is late or was
                       // dropped, not the rank that stopped after it
    char reason[112];
    char cause_reason[112];  // the reporter's detail for `cause`
} l3d_notice_t;

typedef struct l3d_request l3d_request_t;

typedef struct l3d_world {
    l3d_ctx_t *ctx;
    atomic_int refs;  // communicators holding this world
    l3d_transport_t tp;
    l3d_transport_caps_t caps;
    l3d_tag_layout_t tags;
    int rank, size;
    void *bootstrap;          // l3d_bootstrap_t of a multi-process world (NULL: local)
    uint32_t next_comm_id;    // the next id this rank would propose for a split
    l3d_algo algo[L3D_COLL_COUNT];  // L3D_ALGO overrides

    l3d_mr_entry_t *mrs;
    size_t nmr, cap_mr;

    l3d_request_t *active;    // requests started and not yet freed (all communicators)
    // More ranks on this node than cores: idle waits may sleep instead of only yielding
    // (spinning would starve the very peer being waited for; sleeping otherwise costs
    // bandwidth: a transport moving a large message needs its progress called continuously).
    int oversubscribed;

    // Large schedule temporaries kept for the next collective: fresh ones cost a page fault
    // per 4 KiB, a quarter of a big in-process allreduce. Bounded (L3D_SCRATCH_*).
    struct l3d_scratch {
        void *p;
        size_t n;
    } scratch[4];
    // Finished requests and schedules' arrays kept for the next calls: a small collective
    // costs less than the dozen allocations it would otherwise make (L3D_SPARE_*).
    l3d_request_t *free_reqs;
    int nfree_reqs;
    struct l3d_sched *spare;  // [L3D_SPARE_SCHEDS]
    int nspare;

    // failure knowledge
    uint8_t *dead;            // [size] known failed (notice or transport error)
    uint8_t *alive;           // [size] sent us a blame notice, so alive
    uint8_t *blamed;          // [size] named in a blame notice (ours or a peer's)
    int dead_epoch;           // bumps whenever dead[] grows
    int blame_seen;           // blame notices received so far
    int alive_due;            // a peer blamed this rank: answer with an ALIVE notice
    int alive_sent;           // ... which is sent once (the peers' alive flags are sticky)
    int first_dead;           // world rank of the first known failure (-1: none)
    char dead_reason[192];    // detail for the first dead rank
    l3d_notice_t *notice_in;  // [size] receive buffers
    l3d_tp_request_t **notice_req;     // [size] pre-posted receives (NULL: none)
    l3d_notice_t *notice_out;          // [slots] send buffers (a ring)
    l3d_tp_request_t **notice_sreq;    // [slots * size]
    int notice_next;
    int poll_tick;
} l3d_world_t;

struct l3d_comm {
    l3d_world_t *world;
    l3d_ctx_t *ctx;
    int *ranks;           // [size] world ranks in communicator order
    int size, rank;
    uint32_t id;
    uint32_t seq;         // collective sequence number
    int failed;
    l3d_status fail_st;
    char fail_detail[256];
    int dead_epoch_seen;
    int in_group;
    struct l3d_sched *group;
    l3d_comm_stats_t stats;  // l3d_comm_get_stats
    struct l3d_comm_shm *shm;  // the segment of small calls (comm_shm.c), or NULL
    // The device whose memory the calls' buffers may be (l3d_comm_set_device; NULL: host
    // memory only). Its buffers are staged through host memory (comm_stage.c).
    l3d_device_t *dev;
};

// ---- schedules ---------------------------------------------------------------------------------
enum {
    L3D_LOP_REDUCE,  // dst = a op b (count elements of wdt; dst may alias a or b)
    L3D_LOP_COPY,    // memcpy(dst, a, count bytes)
    L3D_LOP_TOWIRE,  // dst (float32) = a (dt: bf16/f16) widened
    L3D_LOP_FINAL,   // dst (dt) = a (wdt) / n for AVG, rounded to dt once for half types
    L3D_LOP_H2D,     // device dst = host a (count bytes) through dev, then wait for it
    L3D_LOP_D2H,     // host dst = device a (count bytes) through dev, then wait for it
};

typedef struct l3d_sched_p2p {
    void *buf;
    size_t len;
    int peer;  // communicator rank (-1: the native collective)
    uint32_t step;
    uint8_t send;  // 0 recv, 1 send, 2 the transport's native collective (s->native),
                   // 3 a call through the communicator's shared segment (comm_shm.c)
} l3d_sched_p2p_t;

typedef struct l3d_sched_lop {
    uint8_t kind, dt, wdt, op;
    int32_t after;  // index of the p2p op of the round it waits for (-1: the whole round)
    void *dst;
    const void *a, *b;
    size_t count;
    int n;
    l3d_device_t *dev;  // L3D_LOP_H2D's and L3D_LOP_D2H's device
} l3d_sched_lop_t;

typedef struct l3d_sched_round {
    uint32_t p0, np, l0, nl;
} l3d_sched_round_t;

typedef struct l3d_sched {
    l3d_ctx_t *ctx;
    l3d_world_t *world;
    size_t max_msg;
    l3d_sched_p2p_t *p2p;
    uint32_t np, cap_p;
    l3d_sched_lop_t *lop;
    uint32_t nl, cap_l;
    l3d_sched_round_t *rd;
    uint32_t nr, cap_r;
    struct l3d_sched_tmp {
        void *p;
        size_t n;
        l3d_device_t *bounce;  // a device's bounce buffer (given back to it), or NULL
        l3d_device_t *dev;     // memory of this device (freed through it), or NULL
    } *tmp;
    uint32_t nt, cap_t;
    l3d_tp_coll_fn native;        // the transport entry of the one native op (if any)
    l3d_tp_coll_args_t nargs;     // its arguments (nargs.ranks points at comm->ranks)
    uint8_t shm_op, shm_pub;      // the shared-segment op: its l3d_coll, published yet
    uint64_t shm_k;               // its index among the communicator's segment calls
    l3d_status st;  // sticky build error (allocation)
} l3d_sched_t;

void l3d_sched_init(l3d_sched_t *s, l3d_comm_t *c);
void l3d_sched_fini(l3d_sched_t *s);
// Opens a new round; ops added after this belong to it.
void l3d_sched_round(l3d_sched_t *s);
// Adds a send/recv (split above caps.max_msg). Returns the round-relative index of the op to
// attach local ops to, or -1 when there is none (len 0 or split into pieces: attach to the
// whole round).
int l3d_sched_send(l3d_sched_t *s, int peer, uint32_t step, const void *buf, size_t len);
int l3d_sched_recv(l3d_sched_t *s, int peer, uint32_t step, void *buf, size_t len);
// Adds the transport's native collective `fn` as the round's only op (a request the transport
// completes through test/cancel like a p2p op).
void l3d_sched_native(l3d_sched_t *s, l3d_tp_coll_fn fn, const l3d_tp_coll_args_t *args);
void l3d_sched_reduce(l3d_sched_t *s, int after, void *dst, const void *a, const void *b,
                      size_t count, l3d_dtype wdt, l3d_redop op);
void l3d_sched_copy(l3d_sched_t *s, int after, void *dst, const void *src, size_t bytes);
// Runs one local op (a reduction, copy or conversion) of a schedule: the request executor
// calls it as the op it is attached to completes (core/comm/comm_request.c). Fails only
// where a device copy does (L3D_LOP_H2D).
l3d_status l3d_sched_run_lop(const l3d_sched_lop_t *o);
void l3d_sched_towire(l3d_sched_t *s, int after, float *dst, const void *src, size_t count,
                      l3d_dtype dt);
void l3d_sched_final(l3d_sched_t *s, int after, void *dst, const void *src, size_t count,
                     l3d_dtype dt, l3d_redop op, int n);
// A temporary buffer owned by the schedule (ctx tag "comm"); NULL on failure (s->st set).
void *l3d_sched_tmp(l3d_sched_t *s, size_t bytes);
// Hands memory p (n bytes) of device d to the schedule, freed through d by l3d_sched_fini.
l3d_status l3d_sched_tmp_keep(l3d_sched_t *s, void *p, size_t n, l3d_device_t *d);

// ---- device buffers (comm_stage.c) --------------------------------------------------------------
// A call's buffers may be memory of the communicator's device. Transports take host memory,
// so such a buffer is staged: its bytes are copied to a schedule temporary before the first
// round, and a temporary receives what lands in a device buffer, copied to it when the op it
// belongs to completes (an H2D local op, waited for before the request completes: the
// temporary goes with the schedule). Both copies run on the device's communication stream
// (device->comm_stream), the D2H after an event recorded on the current stream: it waits for
// the compute that produced the buffer, not for the whole device.
// Nonzero when `p` is memory of c's device that needs staging.
int l3d_stage_needed(const l3d_comm_t *c, const void *p);
// Host copy of device [src, src + bytes): a schedule temporary, copied and waited for now.
// NULL (s->st set) on failure.
void *l3d_stage_in(l3d_sched_t *s, l3d_comm_t *c, const void *src, size_t bytes);
// A collective's buffers: a device send range is replaced by its host copy, a device receive
// range by a temporary whose device destination goes to *dev_recv (NULL: none); ranges that
// overlap share one copy. Failures set s->st.
void l3d_stage_call(l3d_sched_t *s, l3d_comm_t *c, const void **send, size_t sbytes,
                    void **recv, size_t rbytes, void **dev_recv);
// An H2D local op of the current round: device dst <- host src (bytes), run after op `after`
// of the round (-1: at the round's end).
void l3d_sched_h2d(l3d_sched_t *s, l3d_comm_t *c, int after, void *dst, const void *src,
                   size_t bytes);
// The transport's native entry for op, whatever memory it takes (NULL: none).
l3d_tp_coll_fn l3d_coll_native_any(const l3d_transport_t *t, l3d_coll op);
// Starts any collective (coll_api.c; the public entries and the pipe's chunks).
l3d_status l3d_coll_start(l3d_comm_t *c, l3d_coll op, const void *sendbuf, void *recvbuf,
                          size_t count, l3d_dtype dt, l3d_redop rop, int root,
                          l3d_request_t **req_p);
// Chunked, pipelined staging (L3D_STAGE_CHUNK): nonzero when a call of `bytes` on c is run
// as chunks. Decided from the communicator's device, the op and the size only, never from
// this rank's buffers, so every rank decides alike (a host buffer on one rank and a device
// buffer on another still make the same chunks).
int l3d_stage_chunked(const l3d_comm_t *c, l3d_coll op, size_t bytes);
l3d_status l3d_stage_pipe_start(l3d_comm_t *c, l3d_coll op, const void *sendbuf, void *recvbuf,
                                size_t count, l3d_dtype dt, l3d_redop rop, int root,
                                l3d_request_t **req_p);
l3d_status l3d_stage_pipe_advance(l3d_request_t *r, int *progressed);
void l3d_stage_pipe_free(l3d_request_t *r);
// What the H2D local op runs: the copy on the communication stream, waited for.
l3d_status l3d_stage_h2d(l3d_device_t *d, void *dst, const void *h, size_t bytes);
// What the D2H local op runs: the same the other way.
l3d_status l3d_stage_d2h(l3d_device_t *d, void *h, const void *src, size_t bytes);
void l3d_sched_d2h(l3d_sched_t *s, l3d_comm_t *c, int after, void *dst, const void *src,
                   size_t bytes);

// ---- a transport that takes device buffers (caps.ptr_support has L3D_PTR_DEVICE: NCCL) ----
// On a communicator whose device the host cannot read, such a transport gets every buffer of
// a point-to-point call and of a collective it has a native entry for as device memory: a
// device buffer as it is, a host one through a device temporary (the mirror of staging). The
// choice depends on the communicator, never on this call's buffers, so a host buffer on one
// rank and a device buffer on its peer still take the same path; the core's own messages
// (notices, the algorithms' steps) stay host memory. The work is ordered after the compute
// issued so far through the device's communication stream (l3d_stage_order).
// Nonzero when c's point-to-point calls go as device memory.
int l3d_stage_device_p2p(const l3d_comm_t *c);
// Nonzero when c's native collectives go as device memory.
int l3d_stage_device_coll(const l3d_comm_t *c);
// A device temporary of `bytes` owned by the schedule (NULL, s->st set, on failure).
void *l3d_stage_dtmp(l3d_sched_t *s, l3d_comm_t *c, size_t bytes);
// A collective's host ranges replaced by device temporaries: the send range copied in now, the
// receive range's host destination in *host_recv (NULL: none) for an l3d_sched_d2h after the
// op; ranges that overlap share one temporary. Failures set s->st.
void l3d_stage_call_device(l3d_sched_t *s, l3d_comm_t *c, const void **send, size_t sbytes,
                           void **recv, size_t rbytes, void **host_recv);
// Tells the transport to order what it is given next after the compute issued so far on c's
// device (its communication stream, after an event on the current one).
l3d_status l3d_stage_order(l3d_comm_t *c);
// A host buffer of at least `bytes` for staging: one of the device's bounce buffers, owned by
// the schedule until l3d_sched_fini gives it back (a schedule temporary when all are held).
void *l3d_stage_tmp(l3d_sched_t *s, l3d_device_t *d, size_t bytes);
// Gives back bounce buffer p (l3d_sched_fini).
void l3d_stage_bounce_put(l3d_device_t *d, void *p);
// Frees bounce buffer b (if any) and any registration w's transport cached for it.
void l3d_stage_bounce_drop(l3d_world_t *w, l3d_device_t *d, struct l3d_bounce *b);

// ---- requests ----------------------------------------------------------------------------------
struct l3d_request {
    l3d_comm_t *comm;
    l3d_sched_t s;
    const char *what;     // "allreduce", "send", ...
    uint64_t tag;         // base tag; ops add their step
    uint32_t round;
    uint32_t ndone;       // p2p ops of the current round done
    uint8_t *state;       // [max ops per round] 0 unposted, 1 posted, 2 done
    l3d_tp_request_t **treq;
    int *inflight;        // [2 * comm size] sends, recvs posted per peer
    uint32_t max_np;
    uint32_t cap_np, cap_inf;  // the arrays' lengths (a recycled request keeps them)
    double t_start, deadline, grace_end;
    uint32_t polls;       // passes without completion: the clock is read every 64th (a read
                          // costs as much as a small message's whole pass)
    int blaming;          // in the failure grace period
    int complete;
    l3d_status st;
    l3d_request_t *next, *prev;  // world->active
    struct l3d_stage_pipe *pipe;  // a chunked staged call (comm_stage.c): no rounds of its own
};

// Takes the schedule (moved into the request) and starts it. On error the schedule is freed.
l3d_status l3d_request_start(l3d_comm_t *c, l3d_sched_t *s, const char *what, uint64_t tag,
                             l3d_request_t **req_p);
// A chunked staged call: a request with no rounds whose advance is l3d_stage_pipe_advance
// (pipe is freed with it by l3d_stage_pipe_free); takes the schedule (its bounce buffers).
l3d_status l3d_request_start_pipe(l3d_comm_t *c, l3d_sched_t *s, const char *what,
                                  struct l3d_stage_pipe *pipe, l3d_request_t **req_p);
// A chunk's request, driven by its pipe rather than by the world's progress: off the active
// list; advance returns L3D_INPROGRESS until it completes, then its status.
void l3d_request_unlink(l3d_request_t *r);
l3d_status l3d_request_advance(l3d_request_t *r, int *progressed);
void l3d_request_free(l3d_request_t *r);
// A request that is complete already (count 0, native collectives).
l3d_status l3d_request_done(l3d_comm_t *c, const char *what, l3d_status st,
                            l3d_request_t **req_p);
// Frees the requests of a communicator being destroyed (pending ones are cancelled).
void l3d_comm_drop_requests(l3d_comm_t *c);
// Returns L3D_ERR_PEER_FAILED with the stored detail if the communicator has failed.
l3d_status l3d_comm_check(l3d_comm_t *c, const char *what);
// Marks the communicator failed (first error wins) and records the detail on the ctx.
l3d_status l3d_comm_fail(l3d_comm_t *c, l3d_status st, const char *fmt, ...) L3D_PRINTF(3, 4);

// Failure notices (core/comm/comm_sched.c).
l3d_status l3d_world_notices_start(l3d_world_t *w);
void l3d_world_notices_stop(l3d_world_t *w);
void l3d_world_notify(l3d_world_t *w, int kind, int rank, const char *reason);
void l3d_world_poll_notices(l3d_world_t *w);
// Gives pending notice sends up to `seconds` to leave (progressing the transport).
void l3d_world_flush_notices(l3d_world_t *w, double seconds);
void l3d_world_mark_dead(l3d_world_t *w, int rank, const char *reason);
// Marks `rank` failed and tells every peer once (also relaying what a notice told us).
void l3d_world_declare_dead(l3d_world_t *w, int rank, const char *reason);
// Memory registration cache (core/comm/comm_sched.c).
l3d_status l3d_world_mr(l3d_world_t *w, void *buf, size_t len, void **mr_p);
void l3d_world_mr_purge(l3d_world_t *w, void *buf, size_t len);
void l3d_world_mr_release(l3d_world_t *w);
void l3d_world_scratch_release(l3d_world_t *w);
// Frees the finished requests a world keeps for reuse (core/comm/comm_request.c).
void l3d_world_requests_release(l3d_world_t *w);
// Frees the finished requests a world keeps for reuse (core/comm/comm_request.c).
void l3d_world_requests_release(l3d_world_t *w);

// ---- collective arguments and algorithm builders ---------------------------------------------
typedef struct l3d_coll_args {
    l3d_comm_t *comm;
    int n, me;
    const void *sendbuf;
    void *recvbuf;
    size_t count;      // allreduce/bcast/reduce: elements; reduce_scatter: recvcount;
                       // allgather: sendcount; alltoall: per-peer count
    l3d_dtype dt, wdt; // user type, working (wire) type of partial reductions
    l3d_redop op, wop; // user op, op applied to partials (AVG -> SUM)
    size_t esz, wsz;   // element sizes of dt and wdt
    int root;
    size_t seg;        // pipeline segment in bytes (multiple of 8, <= caps.max_msg)
} l3d_coll_args_t;

// Block i of `count` elements split into n near-equal blocks (the first count % n get one more).
static inline void l3d_coll_block(size_t count, int n, int i, size_t *off, size_t *cnt) {
    size_t q = count / (size_t)n, r = count % (size_t)n;
    *cnt = q + ((size_t)i < r);
    *off = q * (size_t)i + ((size_t)i < r ? (size_t)i : r);
}

// coll_ring.c: segment helpers shared by the algorithms. Messages are cut into a->seg pieces;
// recv_reduce reduces each piece on arrival: dst = tmp op mine (tmp_first) or mine op tmp.
void l3d_coll_send_segs(l3d_sched_t *s, const l3d_coll_args_t *a, int peer, uint32_t step,
                        const void *buf, size_t bytes);
void l3d_coll_recv_segs(l3d_sched_t *s, const l3d_coll_args_t *a, int peer, uint32_t step,
                        void *buf, size_t bytes);
void l3d_coll_recv_reduce(l3d_sched_t *s, const l3d_coll_args_t *a, int peer, uint32_t step,
                          void *tmp, void *dst, const void *mine, size_t count, int tmp_first);
// Opens a round that copies sendbuf to recvbuf (or widens it to a float32 temporary for the
// half types) and returns that working buffer of count wire elements.
void *l3d_coll_work_buffer(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_allreduce_ring(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_reduce_scatter_ring(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_allgather_ring(l3d_sched_t *s, const l3d_coll_args_t *a);
// coll_rabenseifner.c
l3d_status l3d_coll_allreduce_rabenseifner(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_allreduce_recdoubling(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_allgather_recdoubling(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_allgather_bruck(l3d_sched_t *s, const l3d_coll_args_t *a);
// coll_tree.c
l3d_status l3d_coll_broadcast_tree(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_broadcast_chain(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_reduce_tree(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_reduce_chain(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_allreduce_tree(l3d_sched_t *s, const l3d_coll_args_t *a);
// coll_alltoall.c
l3d_status l3d_coll_alltoall_pairwise(l3d_sched_t *s, const l3d_coll_args_t *a);
l3d_status l3d_coll_barrier_dissemination(l3d_sched_t *s, const l3d_coll_args_t *a);

// comm_shm.c: small collectives through a segment the members' processes share.
typedef struct l3d_comm_shm l3d_comm_shm_t;
// Collective over c (two small calls through the transport): maps a shared segment when every
// member can (c->shm), else leaves c->shm NULL. Errors are those of the two calls.
l3d_status l3d_comm_shm_setup(l3d_comm_t *c);
// The same for a world communicator of l3d_comm_create_env, through the bootstrap store.
struct l3d_bootstrap;
l3d_status l3d_comm_shm_setup_boot(l3d_comm_t *c, struct l3d_bootstrap *bs);
// The same for the n world communicators of l3d_comm_create_local, made by one thread.
l3d_status l3d_comm_shm_setup_local(l3d_comm_t *const *comms, int n);
void l3d_comm_shm_free(l3d_comm_t *c);
// Whether the call (op, count per member, dt) takes the segment; the same on every member.
int l3d_comm_shm_fits(const l3d_comm_t *c, l3d_coll op, size_t count, l3d_dtype dt);
// Opens a round holding the segment call (args as for a native call); takes its call index.
void l3d_sched_shm(l3d_sched_t *s, l3d_comm_t *c, l3d_coll op, const l3d_tp_coll_args_t *args);
// The request machinery's entries for a send == 3 op: post (publishes when the slot is free),
// test (nonblocking; an error has gone through l3d_comm_fail), the member awaited (world rank
// or -1, described in buf), cancel.
void l3d_comm_shm_post(l3d_comm_t *c, l3d_sched_t *s);
l3d_status l3d_comm_shm_test(l3d_comm_t *c, l3d_sched_t *s, const char *what, int *done_p);
int l3d_comm_shm_waiting_on(const l3d_comm_t *c, const l3d_sched_t *s, char *buf, size_t len);
void l3d_comm_shm_cancel(l3d_comm_t *c);

// coll_select.c
// Parses L3D_ALGO into algo[] (L3D_ALGO_AUTO where not named).
l3d_status l3d_coll_parse_algo(l3d_ctx_t *ctx, const char *spec, l3d_algo *algo);
// The algorithm for (op, bytes) on communicator c: an L3D_ALGO override if any, else the
// native entry if the transport has one, else the cheapest core algorithm by the cost model.
l3d_algo l3d_coll_select(const l3d_comm_t *c, l3d_coll op, size_t bytes, l3d_dtype dt,
                         int native_ok);
// The pipeline segment size for messages of `bytes` (multiple of 8, <= caps.max_msg).
size_t l3d_coll_segment(const l3d_comm_t *c, size_t bytes);

#endif
