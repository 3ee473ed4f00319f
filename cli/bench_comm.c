// l3d bench comm: an nccl-tests style benchmark of the collectives (same flags, same table),
// plus ucx_perftest/fi_pingpong style point-to-point rows, over thread ranks of this process
// (local transport, -t N) or over the process ranks of a launched job (l3d launch, mpirun,
// srun: l3d_comm_create_env).
//
// Per size and variant (out-of-place, then in-place where the op has one): fill the inputs,
// -w warmup calls, a barrier, -n timed calls; time = the slowest rank's elapsed / iters (p2p:
// per message, pingpong: half the round trip); before the first row, calls at the first size
// for 20 ms (bc_start_warm). With -c 1 one more call outside the timed loop
// runs on freshly filled inputs and every rank counts the output elements that differ from a
// reference computed here, element by element (#wrong, summed over ranks).
//
// Reference values: cli/bench_comm.h. With --device NAME the calls get buffers in that
// device's memory (the communicator stages them through host copies where the transport takes
// host memory, docs/comm.md "Device buffers"); inputs are filled and outputs checked on host
// images copied across outside the timed loop, so the time is the call's, staging included.
//
// Before the table every rank memcpy's MAXBYTES at once (best of 5): that bandwidth B bounds a
// shared-memory allreduce at busbw <= 2(n-1)/n * B/n, printed after an allreduce table.
//
// Testing hook: L3D_BENCH_CORRUPT=1 flips one output byte on every checking rank before the
// check, so tests can see that the check fails (tests/cli_bench.sh).
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/bench_comm.h"
#include "cli/cli.h"
#include "core/comm/bootstrap.h"
#include "devices/device.h"
#include "llama3d/comm.h"
#include "platform/platform.h"
#include "transports/transport.h"

#define BC_CMD "bench comm"
#define BC_ALIGN 64
#define BC_MEMCPY_REPS 5

typedef enum {
    OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_REDUCE, OP_ALLTOALL,
    OP_SENDRECV, OP_P2P, OP_PINGPONG, OP_COUNT
} bc_op;

typedef struct {
    const char *name;
    int reduces;   // takes -o
    int rooted;    // takes -r
    int split;     // size is the total over ranks: per-rank blocks of size / nranks
    int inplace;   // has an in-place form
    int min_ranks;
} bc_op_desc_t;

static const bc_op_desc_t bc_ops[OP_COUNT] = {
    {"allreduce", 1, 0, 0, 1, 1},  {"reduce_scatter", 1, 0, 1, 1, 1},
    {"allgather", 0, 0, 1, 1, 1},  {"broadcast", 0, 1, 0, 1, 1},
    {"reduce", 1, 1, 0, 1, 1},     {"alltoall", 0, 0, 1, 0, 1},
    {"sendrecv", 0, 0, 0, 0, 1},   {"p2p", 0, 0, 0, 0, 2},
    {"pingpong", 0, 0, 0, 0, 2},
};

// nccl-tests' type names, in l3d_dtype order.
static const char *const bc_type_names[L3D_DTYPE_COUNT] = {"float", "bfloat16", "half",
                                                           "int32", "int64",    "uint8"};
static const char *const bc_redop_names[L3D_REDOP_COUNT] = {"sum", "avg", "max", "min"};

typedef struct {
    bc_op op;
    size_t minb, maxb;
    long long factor, iters, warmup, check, root, nthreads, window;
    l3d_dtype dt;
    l3d_redop redop;
    const char *transport;  // NULL: default
    const char *json;       // --json FILE: rank 0 writes the out-of-place rows there (NULL: no)
    const char *device;     // --device NAME: the buffers are that device's memory (NULL: host)
    int corrupt;
} bc_opts_t;

// What the ranks share. Rank 0 alone prints and writes the totals.
typedef struct {
    bc_opts_t o;
    const bc_op_desc_t *op;
    size_t es;
    int nranks;
    int bind;  // thread ranks: bind rank r to block r of this many (0: no binding)
    l3d_ctx_t *ctx;
    pthread_mutex_t mu;
    int failed;
    l3d_status fail_st;
    char err[512];
} bc_bench_t;

typedef struct {
    bc_bench_t *b;
    l3d_comm_t *c;
    int rank;
    unsigned char *s, *r;  // MAXBYTES each, BC_ALIGN aligned
    // --device: the buffers the calls get, in its memory; s and r are their host images,
    // filled and checked on the host and copied across outside the timed loop
    l3d_device_t *dev;
    unsigned char *ds, *dr;
    l3d_status st;
    long long total_wrong;  // over all ranks (the same on every rank)
} bc_rank_t;

// One size: N elements in all, blocks of `blk` per rank for the split ops.
typedef struct {
    size_t bytes, n, blk;
} bc_geom_t;

// ---- flags -------------------------------------------------------------------------------

// A byte count with an optional K/M/G suffix (powers of 1024).
static int bc_parse_size(const char *flag, const char *v, size_t *out) {
    char *end = NULL;
    unsigned long long x = 0;
    int ok = v[0] >= '0' && v[0] <= '9';
    if (ok) x = strtoull(v, &end, 10);
    unsigned shift = 0;
    if (ok && *end) {
        switch (*end) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        default: ok = 0;
        }
        if (ok && end[1]) ok = 0;
    }
    const unsigned long long max = 64ull << 30;
    if (!ok || x > (max >> shift)) {
        fprintf(stderr, "l3d " BC_CMD ": %s: '%s' is not a size in bytes (N, NK, NM or NG, at "
                "most 64G)\n", flag, v);
        return -1;
    }
    *out = (size_t)(x << shift);
    return 0;
}

static int bc_lookup(const char *flag, const char *v, const char *const *names, int n, int *out) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) {
            *out = i;
            return 0;
        }
    char list[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? "|" : "", names[i]);
    fprintf(stderr, "l3d " BC_CMD ": %s: '%s' is not one of %s\n", flag, v, list);
    return -1;
}

static void bc_usage(FILE *f, const l3d_cli_flag_t *flags, int nflags) {
    l3d_cli_usage(f, BC_CMD, "[OP] [FLAGS]", flags, nflags);
    fprintf(f, "\nOP: allreduce (default), reduce_scatter, allgather, broadcast, reduce, "
               "alltoall,\n"
               "    sendrecv (rank r sends to r+1, receives from r-1), p2p (rank 0 streams -W\n"
               "    messages per iteration to rank 1), pingpong (rank 0 <-> rank 1, half the "
               "round trip)\n"
               "Thread ranks of this process unless launched: l3d launch -n N -- l3d bench comm\n");
}

// Returns -1 on success (run), else the exit code.
static int bc_parse(int argc, char **argv, int first, bc_opts_t *o) {
    const char *b = "8", *e = "64M", *f = "2", *n = "20", *w = "5", *c = "1", *op = "sum",
               *d = "float", *r = "0", *t = "2", *W = "1", *tp = NULL, *help = NULL, *help2 = NULL,
               *json = NULL, *dev = NULL;
    const l3d_cli_flag_t flags[] = {
        {"-b", "MINBYTES", "smallest size (default 8; K/M/G suffixes)", &b, 0},
        {"-e", "MAXBYTES", "largest size (default 64M)", &e, 0},
        {"-f", "STEPFACTOR", "size multiplier between rows (default 2)", &f, 0},
        {"-n", "ITERS", "timed iterations per size (default 20)", &n, 0},
        {"-w", "WARMUP", "untimed iterations per size before them (default 5)", &w, 0},
        {"-c", "CHECK", "1: verify results once per size outside the timed loop (default 1)", &c,
         0},
        {"-o", "OP", "reduction: sum|avg|max|min (default sum)", &op, 0},
        {"-d", "TYPE", "float|half|bfloat16|int32|int64|uint8 (default float)", &d, 0},
        {"-r", "ROOT", "root of broadcast and reduce (default 0)", &r, 0},
        {"-t", "NTHREADS", "thread ranks on the local transport (default 2; not when launched)",
         &t, 0},
        {"-W", "WINDOW", "p2p: messages in flight per iteration (default 1)", &W, 0},
        {"--transport", "NAME", "local|ucx|ofi|nccl, as built (default: local, or the launched "
         "job's)", &tp, 0},
        {"--device", "NAME", "buffers in this device's memory (cpu-opaque, cpu-async: staged "
         "through host copies; default: host memory)", &dev, 0},
        {"--json", "FILE", "also write the out-of-place rows as JSON (op, ranks, rows of bytes, "
         "time_us, algbw, busbw): l3d plan --intra/--inter read it", &json, 0},
        {"-h", NULL, "this help", &help, 1},
        {"--help", NULL, "this help", &help2, 1},
    };
    const int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    memset(o, 0, sizeof(*o));
    o->op = OP_ALLREDUCE;
    if (first < argc && argv[first][0] != '-') {
        int k = 0;
        const char *names[OP_COUNT];
        for (int i = 0; i < OP_COUNT; i++) names[i] = bc_ops[i].name;
        if (!strcmp(argv[first], "help")) help = "1";
        else if (bc_lookup("OP", argv[first], names, OP_COUNT, &k) < 0) return L3D_EXIT_USAGE;
        o->op = (bc_op)k;
        first++;
    }
    if (l3d_cli_parse(BC_CMD, argc, argv, first, flags, nflags) < 0) return L3D_EXIT_USAGE;
    if (help || help2) {
        bc_usage(stdout, flags, nflags);
        return L3D_EXIT_OK;
    }
    int k = 0;
    if (bc_parse_size("-b", b, &o->minb) < 0 || bc_parse_size("-e", e, &o->maxb) < 0 ||
        l3d_cli_int(BC_CMD, "-f", f, 2, 1024, &o->factor) < 0 ||
        l3d_cli_int(BC_CMD, "-n", n, 1, 1000000000, &o->iters) < 0 ||
        l3d_cli_int(BC_CMD, "-w", w, 0, 1000000000, &o->warmup) < 0 ||
        l3d_cli_int(BC_CMD, "-c", c, 0, 1, &o->check) < 0 ||
        l3d_cli_int(BC_CMD, "-r", r, 0, INT_MAX, &o->root) < 0 ||
        l3d_cli_int(BC_CMD, "-t", t, 1, 1024, &o->nthreads) < 0 ||
        l3d_cli_int(BC_CMD, "-W", W, 1, 1024, &o->window) < 0)
        return L3D_EXIT_USAGE;
    if (bc_lookup("-o", op, bc_redop_names, L3D_REDOP_COUNT, &k) < 0) return L3D_EXIT_USAGE;
    o->redop = (l3d_redop)k;
    if (bc_lookup("-d", d, bc_type_names, L3D_DTYPE_COUNT, &k) < 0) return L3D_EXIT_USAGE;
    o->dt = (l3d_dtype)k;
    if (tp) {  // one of the built transports (the generated registry)
        const char *tps[16];
        int ntp = 0;
        for (int i = 0; l3d_transport_backends[i] && ntp < 16; i++)
            tps[ntp++] = l3d_transport_backends[i]->name;
        if (bc_lookup("--transport", tp, tps, ntp, &k) < 0) return L3D_EXIT_USAGE;
        o->transport = tp;
    }
    if (o->minb == 0) {
        fprintf(stderr, "l3d " BC_CMD ": -b: MINBYTES must be at least 1\n");
        return L3D_EXIT_USAGE;
    }
    if (o->minb > o->maxb) {
        fprintf(stderr, "l3d " BC_CMD ": -b: %s is larger than -e %s\n", b, e);
        return L3D_EXIT_USAGE;
    }
    if (json && !json[0]) {
        fprintf(stderr, "l3d " BC_CMD ": --json needs a file name\n");
        return L3D_EXIT_USAGE;
    }
    o->json = json;
    if (dev) {  // one of the built devices (the generated registry)
        char built[256] = "";
        int found = 0;
        for (int i = 0; l3d_device_backends[i]; i++) {
            found |= !strcmp(dev, l3d_device_backends[i]->name);
            size_t at = strlen(built);
            snprintf(built + at, sizeof(built) - at, "%s%s", i ? ", " : "",
                     l3d_device_backends[i]->name);
        }
        if (!found) {
            fprintf(stderr, "l3d " BC_CMD ": --device: '%s' is not a built device (built: %s)\n",
                    dev, built);
            return L3D_EXIT_USAGE;
        }
    }
    o->device = dev;
    const char *cor = getenv("L3D_BENCH_CORRUPT");
    o->corrupt = cor && !strcmp(cor, "1");
    return -1;
}

// Inputs where the op reads, the sentinel where it writes (the values: cli/bench_comm_ref.c).
static void bc_fill(const bc_bench_t *b, void *buf, int rank, size_t off, size_t count) {
    l3d_bc_fill(b->o.dt, b->es, buf, rank, off, count);
}
static void bc_sentinel(void *buf, size_t bytes) { memset(buf, 0xa5, bytes); }
static void bc_expect_red(const bc_bench_t *b, size_t g, void *out) {
    l3d_bc_expect_red(b->o.dt, b->o.redop, b->nranks, g, out);
}

// ---- one rank ----------------------------------------------------------------------------

static int64_t bc_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// Records the first failure (its detail) and aborts this rank's communicator so the peers
// fail at once instead of waiting for their timeout.
static l3d_status bc_fail(bc_rank_t *rk, l3d_status st, const char *fmt, ...) {
    bc_bench_t *b = rk->b;
    pthread_mutex_lock(&b->mu);
    if (!b->failed) {
        b->failed = 1;
        b->fail_st = st;
        if (fmt) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(b->err, sizeof(b->err), fmt, ap);
            va_end(ap);
        } else {
            const char *d = l3d_ctx_last_error(b->ctx);
            snprintf(b->err, sizeof(b->err), "%s", d[0] ? d : l3d_strerror(st));
        }
    }
    pthread_mutex_unlock(&b->mu);
    if (rk->c) l3d_comm_abort(rk->c);
    rk->st = st;
    return st;
}

#define BC_TRY(rk, call)                                        \
    do {                                                        \
        l3d_status st_ = (call);                                \
        if (st_ != L3D_OK) return bc_fail((rk), st_, NULL);     \
    } while (0)

// The slowest rank's value (int64: doubles are not a dtype).
static l3d_status bc_max_i64(bc_rank_t *rk, int64_t *v) {
    int64_t in = *v;
    return l3d_comm_allreduce(rk->c, &in, v, 1, L3D_INT64, L3D_MAX);
}

// One call of the op. ip: the in-place form.
static l3d_status bc_call(bc_rank_t *rk, const bc_geom_t *g, int ip) {
    const bc_bench_t *b = rk->b;
    l3d_comm_t *c = rk->c;
    l3d_dtype dt = b->o.dt;
    l3d_redop op = b->o.redop;
    int root = (int)b->o.root, n = b->nranks, me = rk->rank;
    unsigned char *S = rk->dev ? rk->ds : rk->s, *R = rk->dev ? rk->dr : rk->r;
    size_t blkb = g->blk * b->es;
    switch (b->o.op) {
    case OP_ALLREDUCE: return l3d_comm_allreduce(c, ip ? R : S, R, g->n, dt, op);
    case OP_REDUCE_SCATTER:
        return ip ? l3d_comm_reduce_scatter(c, R, R + (size_t)me * blkb, g->blk, dt, op)
                  : l3d_comm_reduce_scatter(c, S, R, g->blk, dt, op);
    case OP_ALLGATHER:
        return l3d_comm_allgather(c, ip ? R + (size_t)me * blkb : S, R, g->blk, dt);
    case OP_BROADCAST: return l3d_comm_broadcast(c, ip ? R : S, R, g->n, dt, root);
    case OP_REDUCE: return l3d_comm_reduce(c, ip ? R : S, R, g->n, dt, op, root);
    case OP_ALLTOALL: return l3d_comm_alltoall(c, S, R, g->blk, dt);
    case OP_SENDRECV: {
        l3d_status st = l3d_comm_group_start(c);
        if (st != L3D_OK) return st;
        l3d_status s1 = l3d_comm_send(c, S, g->n, dt, (me + 1) % n);
        l3d_status s2 = l3d_comm_recv(c, R, g->n, dt, (me + n - 1) % n);
        st = l3d_comm_group_end(c);
        return s1 != L3D_OK ? s1 : s2 != L3D_OK ? s2 : st;
    }
    case OP_P2P: {
        // The window's receives share one buffer, as in ucx_perftest (the bytes are the same).
        if (me > 1) return L3D_OK;
        l3d_status st = l3d_comm_group_start(c), st2 = L3D_OK;
        if (st != L3D_OK) return st;
        for (long long i = 0; i < b->o.window && st2 == L3D_OK; i++)
            st2 = me == 0 ? l3d_comm_send(c, S, g->n, dt, 1) : l3d_comm_recv(c, R, g->n, dt, 0);
        st = l3d_comm_group_end(c);
        return st2 != L3D_OK ? st2 : st;
    }
    case OP_PINGPONG:
        if (me == 0) {
            l3d_status st = l3d_comm_send(c, S, g->n, dt, 1);
            return st != L3D_OK ? st : l3d_comm_recv(c, R, g->n, dt, 1);
        }
        if (me == 1) {
            l3d_status st = l3d_comm_recv(c, R, g->n, dt, 0);
            return st != L3D_OK ? st : l3d_comm_send(c, R, g->n, dt, 0);
        }
        return L3D_OK;
    default: return L3D_ERR_INTERNAL;
    }
}

// Inputs for a call: the pattern where the op reads, the sentinel where it writes.
static void bc_prepare(bc_rank_t *rk, const bc_geom_t *g, int ip) {
    const bc_bench_t *b = rk->b;
    int me = rk->rank, root = (int)b->o.root;
    unsigned char *S = rk->s, *R = rk->r, *in = ip ? R : S;
    size_t es = b->es;
    switch (b->o.op) {
    case OP_ALLREDUCE:
    case OP_REDUCE_SCATTER:
    case OP_REDUCE:
        if (!ip) bc_sentinel(R, g->bytes);
        bc_fill(b, in, me, 0, g->n);
        break;
    case OP_ALLGATHER:
        bc_sentinel(R, g->bytes);
        bc_fill(b, ip ? R + (size_t)me * g->blk * es : S, me, (size_t)me * g->blk, g->blk);
        break;
    case OP_BROADCAST:
        bc_sentinel(R, g->bytes);
        if (me == root || !ip) bc_fill(b, in, root, 0, g->n);
        break;
    case OP_ALLTOALL:
    case OP_SENDRECV:
    case OP_P2P:
    case OP_PINGPONG:
        bc_sentinel(R, g->bytes);
        bc_fill(b, S, me, 0, g->n);
        break;
    default: break;
    }
}

// Counts the output elements of this rank that differ from the reference.
static long long bc_verify(bc_rank_t *rk, const bc_geom_t *g, int ip) {
    const bc_bench_t *b = rk->b;
    int me = rk->rank, n = b->nranks, root = (int)b->o.root;
    size_t es = b->es, cnt = g->n, blk = g->blk;
    unsigned char *out = rk->r;
    bc_op op = b->o.op;
    if ((op == OP_REDUCE && me != root) || (op == OP_P2P && me != 1) ||
        (op == OP_PINGPONG && me > 1))
        return 0;
    if (op == OP_REDUCE_SCATTER) {
        cnt = blk;
        if (ip) out += (size_t)me * blk * es;
    }
    if (b->o.corrupt && cnt > 0) out[0] ^= 0x40;
    long long wrong = 0;
    unsigned char want[8];
    for (size_t j = 0; j < cnt; j++) {
        switch (op) {
        case OP_ALLREDUCE:
        case OP_REDUCE: bc_expect_red(b, j, want); break;
        case OP_REDUCE_SCATTER: bc_expect_red(b, (size_t)me * blk + j, want); break;
        case OP_ALLGATHER: l3d_bc_encode(b->o.dt, l3d_bc_pat(b->o.dt, (int)(j / blk), j), 0, 1, want);
            break;
        case OP_BROADCAST: l3d_bc_encode(b->o.dt, l3d_bc_pat(b->o.dt, root, j), 0, 1, want); break;
        case OP_ALLTOALL:
            l3d_bc_encode(b->o.dt, l3d_bc_pat(b->o.dt, (int)(j / blk), (size_t)me * blk + j % blk), 0, 1,
                      want);
            break;
        case OP_SENDRECV: l3d_bc_encode(b->o.dt, l3d_bc_pat(b->o.dt, (me + n - 1) % n, j), 0, 1, want);
            break;
        default: l3d_bc_encode(b->o.dt, l3d_bc_pat(b->o.dt, 0, j), 0, 1, want); break;  // p2p, pingpong
        }
        wrong += memcmp(out + j * es, want, es) != 0;
    }
    return wrong;
}

// Times one variant and checks it: *ns (the slowest rank, per call) and *wrong (all ranks).
// --device: the host images to the device buffers (to = 1) or back, and waits.
static l3d_status bc_copy(bc_rank_t *rk, const bc_geom_t *g, int to) {
    if (!rk->dev || !g->bytes) return L3D_OK;
    l3d_device_t *d = rk->dev;
    l3d_copy_kind k = to ? L3D_COPY_H2D : L3D_COPY_D2H;
    l3d_status st = L3D_OK;
    if (to) st = l3d_dev_copy(d, rk->ds, rk->s, g->bytes, k);
    if (st == L3D_OK) st = to ? l3d_dev_copy(d, rk->dr, rk->r, g->bytes, k)
                              : l3d_dev_copy(d, rk->r, rk->dr, g->bytes, k);
    return st == L3D_OK ? l3d_dev_sync(d) : st;
}

static l3d_status bc_variant(bc_rank_t *rk, const bc_geom_t *g, int ip, int64_t *ns,
                             long long *wrong) {
    const bc_bench_t *b = rk->b;
    bc_prepare(rk, g, ip);
    BC_TRY(rk, bc_copy(rk, g, 1));
    for (long long i = 0; i < b->o.warmup; i++) BC_TRY(rk, bc_call(rk, g, ip));
    BC_TRY(rk, l3d_comm_barrier(rk->c));
    int64_t t0 = bc_now_ns();
    for (long long i = 0; i < b->o.iters; i++) BC_TRY(rk, bc_call(rk, g, ip));
    int64_t div = b->o.iters;
    if (b->o.op == OP_P2P) div *= b->o.window;
    if (b->o.op == OP_PINGPONG) div *= 2;
    *ns = (bc_now_ns() - t0) / div;
    BC_TRY(rk, bc_max_i64(rk, ns));
    *wrong = -1;
    if (b->o.check) {
        bc_prepare(rk, g, ip);
        BC_TRY(rk, bc_copy(rk, g, 1));
        BC_TRY(rk, bc_call(rk, g, ip));
        BC_TRY(rk, bc_copy(rk, g, 0));
        int64_t w = bc_verify(rk, g, ip), all = 0;
        BC_TRY(rk, l3d_comm_allreduce(rk->c, &w, &all, 1, L3D_INT64, L3D_SUM));
        *wrong = (long long)all;
    }
    return L3D_OK;
}

// Before the first row (when -w > 0): calls at the first size until every rank has spent
// BC_START_MS in them. A fresh job's first few hundred small calls run 2x slower (libfabric's
// shm provider: an 8-byte allreduce took 2.8-3.8 us for -w 200 and 1.7 us for -w 2000, the
// next size 1.5 us either way); like nccl-tests' up-front warm-up, this keeps that out of the
// first row. The ranks agree on when to stop, so they make the same calls.
#define BC_START_MS 20
static l3d_status bc_start_warm(bc_rank_t *rk, const bc_geom_t *g) {
    bc_prepare(rk, g, 0);
    BC_TRY(rk, bc_copy(rk, g, 1));
    int64_t t0 = bc_now_ns(), t;
    do {
        for (int i = 0; i < 64; i++) BC_TRY(rk, bc_call(rk, g, 0));
        t = bc_now_ns() - t0;
        BC_TRY(rk, bc_max_i64(rk, &t));
    } while (t < (int64_t)BC_START_MS * 1000000);
    return L3D_OK;
}

// B: bytes copied per second by every rank copying MAXBYTES at once (best of 5).
static l3d_status bc_memcpy_bw(bc_rank_t *rk, double *gbs) {
    size_t bytes = rk->b->o.maxb;
    memcpy(rk->r, rk->s, bytes);  // untimed first copy
    int64_t best = INT64_MAX;
    for (int rep = 0; rep < BC_MEMCPY_REPS; rep++) {
        BC_TRY(rk, l3d_comm_barrier(rk->c));
        int64_t t0 = bc_now_ns();
        memcpy(rk->r, rk->s, bytes);
        int64_t t = bc_now_ns() - t0;
        BC_TRY(rk, bc_max_i64(rk, &t));
        if (t < best) best = t;
    }
    *gbs = best > 0 ? (double)bytes * rk->b->nranks / (double)best : 0.0;
    return L3D_OK;
}

static void bc_print_time(int64_t ns, double bytes, double factor, long long wrong, double *bus) {
    double us = (double)ns / 1e3;
    double alg = ns > 0 ? bytes / (double)ns : 0.0;  // bytes per ns = GB/s
    *bus = alg * factor;
    printf(us < 100 ? "  %7.2f" : us < 1e4 ? "  %7.1f" : "  %7.0f", us);  // as nccl-tests
    printf("  %6.2f  %6.2f", alg, *bus);
    if (wrong < 0) printf("  %5s", "N/A");
    else printf("  %5lld", wrong);
}

static void bc_human(size_t b, char *out, size_t len) {
    if (b && !(b & ((1u << 30) - 1))) snprintf(out, len, "%zu GiB", b >> 30);
    else if (b && !(b & ((1u << 20) - 1))) snprintf(out, len, "%zu MiB", b >> 20);
    else if (b && !(b & ((1u << 10) - 1))) snprintf(out, len, "%zu KiB", b >> 10);
    else snprintf(out, len, "%zu B", b);
}

// --json FILE: the out-of-place rows of this run, for l3d plan's measured links.
static l3d_status bc_write_json(bc_rank_t *rk, const char *path, const size_t *bytes,
                                const double *us, const double *bus, int n) {
    bc_bench_t *b = rk->b;
    FILE *f = fopen(path, "w");
    if (!f) return bc_fail(rk, L3D_ERR_IO, "--json %s: %s", path, strerror(errno));
    fprintf(f, "{\"op\": \"%s\", \"ranks\": %d, \"transport\": \"%s\", \"dtype\": \"%s\", "
            "\"rows\": [", b->op->name, b->nranks, l3d_comm_transport_name(rk->c),
            bc_type_names[b->o.dt]);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\n  {\"bytes\": %zu, \"time_us\": %.4f, \"algbw\": %.6g, \"busbw\": %.6g}",
                i ? "," : "", bytes[i], us[i], us[i] > 0 ? (double)bytes[i] / (us[i] * 1e3) : 0.0,
                bus[i]);
    fprintf(f, "\n]}\n");
    if (ferror(f) | (fclose(f) != 0))
        return bc_fail(rk, L3D_ERR_IO, "--json %s: write failed", path);
    return L3D_OK;
}

static l3d_status bc_rank_run(bc_rank_t *rk) {
    bc_bench_t *b = rk->b;
    const bc_opts_t *o = &b->o;
    int n = b->nranks, me = rk->rank;
    void *s = NULL, *r = NULL;
    size_t alloc = (o->maxb + BC_ALIGN - 1) / BC_ALIGN * BC_ALIGN;
    if (!alloc) alloc = BC_ALIGN;
    if (posix_memalign(&s, BC_ALIGN, alloc) || posix_memalign(&r, BC_ALIGN, alloc)) {
        free(s);
        return bc_fail(rk, L3D_ERR_NOMEM, "rank %d: cannot allocate 2 x %zu bytes", me, alloc);
    }
    rk->s = s;
    rk->r = r;
    memset(s, 0, alloc);  // touch every page before timing
    memset(r, 0, alloc);
    double B = 0;
    l3d_status st = L3D_OK;
    if (o->device) {
        l3d_ctx_t *ctx = l3d_comm_ctx(rk->c);
        // (a launched rank's GPU is its LOCAL_RANK's, as l3d train's and the nccl transport's)
        l3d_launch_env_t env;
        int threads = !strcmp(l3d_comm_transport_name(rk->c), "local");
        int local_rank = threads || l3d_launch_env_read(ctx, &env) < 0 ? 0 : env.local_rank;
        l3d_device_params_t dp = {.num_threads = 1, .device_index = local_rank};
        if ((st = l3d_device_create(ctx, o->device, &dp, &rk->dev)) != L3D_OK ||
            (st = l3d_dev_alloc(rk->dev, alloc, "comm", (void **)&rk->ds)) != L3D_OK ||
            (st = l3d_dev_alloc(rk->dev, alloc, "comm", (void **)&rk->dr)) != L3D_OK ||
            (st = l3d_comm_set_device(rk->c, rk->dev)) != L3D_OK) {
            bc_fail(rk, st, "rank %d: --device %s: %s", me, o->device, l3d_ctx_last_error(ctx));
            goto done;
        }
    }
    st = bc_memcpy_bw(rk, &B);
    if (st != L3D_OK) goto done;
    double factor = 1.0;
    if (o->op == OP_ALLREDUCE) factor = 2.0 * (n - 1) / n;
    else if (b->op->split) factor = (double)(n - 1) / n;
    int print = me == 0;
    if (print) {
        printf("# l3d bench comm: %s, %d ranks (%s transport), %s, %s, iters %lld, warmup %lld, "
               "check %lld, buffers in %s%s\n", b->op->name, n, l3d_comm_transport_name(rk->c),
               bc_type_names[o->dt], b->op->reduces ? bc_redop_names[o->redop] : "none",
               o->iters, o->warmup, o->check, o->device ? "device " : "host memory",
               o->device ? o->device : "");
        printf("# memcpy bandwidth (%d ranks copying at once): %.2f GB/s\n", n, B);
        printf("#\n"
               "#                                                              out-of-place       "
               "                in-place\n"
               "#       size         count      type   redop    root     time   algbw   busbw "
               "#wrong     time   algbw   busbw #wrong\n"
               "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)     "
               "       (us)  (GB/s)  (GB/s)\n");
        fflush(stdout);
    }
    size_t unit = b->es * (b->op->split ? (size_t)n : 1);
    double sum_bus = 0, last_oop = 0, last_ip = 0;
    int rows = 0;
    // --json: written after the table; at most 64 rows are kept (the flags allow more)
    enum { JMAX = 64 };
    size_t jbytes[JMAX];
    double jus[JMAX], jbus[JMAX];
    size_t last_bytes = 0;
    for (size_t size = o->minb;;) {
        bc_geom_t g;
        g.bytes = size / unit * unit;
        g.n = g.bytes / b->es;
        g.blk = b->op->split ? g.n / (size_t)n : g.n;
        int64_t ns[2] = {0, 0};
        long long wrong[2] = {-1, -1};
        if (size == o->minb && o->warmup > 0 && (st = bc_start_warm(rk, &g)) != L3D_OK)
            goto done;
        for (int ip = 0; ip < 1 + b->op->inplace; ip++) {
            st = bc_variant(rk, &g, ip, &ns[ip], &wrong[ip]);
            if (st != L3D_OK) goto done;
            if (wrong[ip] > 0) rk->total_wrong += wrong[ip];
        }
        if (print) {
            printf("%12zu  %12zu  %8s  %6s  %6d", g.bytes, g.n, bc_type_names[o->dt],
                   b->op->reduces ? bc_redop_names[o->redop] : "none",
                   b->op->rooted ? (int)o->root : -1);
            bc_print_time(ns[0], (double)g.bytes, factor, wrong[0], &last_oop);
            if (b->op->inplace) bc_print_time(ns[1], (double)g.bytes, factor, wrong[1], &last_ip);
            else printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
            printf("\n");
            fflush(stdout);
        }
        sum_bus += last_oop;
        if (rows < JMAX)
            jbytes[rows] = g.bytes, jus[rows] = (double)ns[0] / 1e3, jbus[rows] = last_oop;
        rows++;
        last_bytes = g.bytes;
        if (size > o->maxb / (size_t)o->factor) break;  // size * factor > maxb
        size *= (size_t)o->factor;
    }
    if (print) {
        printf("# Out of bounds values : %lld %s\n", rk->total_wrong,
               rk->total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n", rows ? sum_bus / rows : 0.0);
        if (o->op == OP_ALLREDUCE) {
            double bound = 2.0 * (n - 1) / n * B / n;
            char hs[32];
            bc_human(last_bytes, hs, sizeof(hs));
            printf("# allreduce memory bound at %s: busbw <= 2(n-1)/n*B/n = %.2f GB/s; measured "
                   "out-of-place %.2f (%.0f%%), in-place %.2f (%.0f%%)\n", hs, bound, last_oop,
                   bound > 0 ? 100.0 * last_oop / bound : 0.0, last_ip,
                   bound > 0 ? 100.0 * last_ip / bound : 0.0);
        }
        printf("#\n");
        fflush(stdout);
        if (o->json) st = bc_write_json(rk, o->json, jbytes, jus, jbus, rows < JMAX ? rows : JMAX);
    }
done:
    if (rk->dev) {
        (void)l3d_comm_set_device(rk->c, NULL);
        l3d_dev_free(rk->dev, rk->ds, alloc, "comm");
        l3d_dev_free(rk->dev, rk->dr, alloc, "comm");
        l3d_device_destroy(rk->dev);
        rk->dev = NULL;
        rk->ds = rk->dr = NULL;
    }
    free(s);
    free(r);
    rk->s = rk->r = NULL;
    return st;
}

static void *bc_thread(void *arg) {
    bc_rank_t *rk = arg;
    // Thread ranks each on their block of the cores, as l3d launch binds process ranks: two
    // ranks polling each other on one core (where the scheduler may keep new threads for a
    // while) take microseconds per handoff instead of a cache line's transfer.
    if (rk->b->bind) (void)l3d_cpu_bind_block(rk->rank, rk->b->bind);
    rk->st = bc_rank_run(rk);
    return NULL;
}

// ---- entry -------------------------------------------------------------------------------

// A launcher named a world: some convention of docs/launch.md has both rank and size set.
// Runs the ranks (threads or this process's one) and returns the exit code.
static int bc_run(bc_bench_t *b, l3d_comm_t **comms, int nlocal) {
    b->nranks = l3d_comm_size(comms[0]);
    int first = l3d_comm_rank(comms[0]);
    if (b->nranks < b->op->min_ranks) {
        if (first == 0)
            fprintf(stderr, "l3d " BC_CMD ": %s needs at least %d ranks (got %d: use -t or l3d "
                    "launch -n)\n", b->op->name, b->op->min_ranks, b->nranks);
        return L3D_EXIT_USAGE;
    }
    if (b->o.root >= b->nranks) {
        if (first == 0)
            fprintf(stderr, "l3d " BC_CMD ": -r: root %lld is not below the %d ranks\n",
                    b->o.root, b->nranks);
        return L3D_EXIT_USAGE;
    }
    bc_rank_t *rks = calloc((size_t)nlocal, sizeof(*rks));
    pthread_t *th = calloc((size_t)nlocal, sizeof(*th));
    if (!rks || !th) {
        free(rks);
        free(th);
        fprintf(stderr, "l3d " BC_CMD ": out of memory\n");
        return L3D_EXIT_FAIL;
    }
    for (int i = 0; i < nlocal; i++) {
        rks[i].b = b;
        rks[i].c = comms[i];
        rks[i].rank = l3d_comm_rank(comms[i]);
    }
    int started = 0;
    b->bind = nlocal > 1 ? nlocal : 0;
    if (nlocal == 1) {
        bc_thread(&rks[0]);
    } else {
        for (; started < nlocal; started++)
            if (pthread_create(&th[started], NULL, bc_thread, &rks[started])) break;
        if (started < nlocal) {  // the started ranks fail at once on the aborted ones
            for (int i = started; i < nlocal; i++)
                bc_fail(&rks[i], L3D_ERR_SYSTEM, "cannot start the thread of rank %d", i);
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    }
    long long wrong = 0;
    for (int i = 0; i < nlocal; i++) wrong += rks[i].total_wrong;
    free(rks);
    free(th);
    if (b->failed) {
        fprintf(stderr, "l3d " BC_CMD ": %s\n", b->err);
        return L3D_EXIT_FAIL;
    }
    return wrong > 0 ? L3D_EXIT_FAIL : L3D_EXIT_OK;
}


int l3d_bench_comm_main(int argc, char **argv, int first) {
    bc_bench_t b;
    memset(&b, 0, sizeof(b));
    int rc = bc_parse(argc, argv, first, &b.o);
    if (rc >= 0) return rc;
    b.op = &bc_ops[b.o.op];
    b.es = l3d_dtype_size(b.o.dt);
    l3d_status st = l3d_ctx_create(NULL, &b.ctx);
    if (st != L3D_OK) {
        fprintf(stderr, "l3d " BC_CMD ": %s\n", l3d_strerror(st));
        return L3D_EXIT_FAIL;
    }
    pthread_mutex_init(&b.mu, NULL);
    int launched = l3d_cli_launched();
    int local = !launched && (!b.o.transport || !strcmp(b.o.transport, "local"));
    int nlocal = local ? (int)b.o.nthreads : 1;
    l3d_comm_t **comms = calloc((size_t)nlocal, sizeof(*comms));
    if (!comms) {
        rc = L3D_EXIT_FAIL;
        fprintf(stderr, "l3d " BC_CMD ": out of memory\n");
        goto out;
    }
    if (local) {
        st = l3d_comm_create_local(b.ctx, nlocal, comms);
    } else {
        // --transport ucx|ofi outside a launched job: a world of one, which at least shows
        // whether the transport is built and starts.
        if (!launched) {
            setenv("L3D_RANK", "0", 1);
            setenv("L3D_WORLD_SIZE", "1", 1);
        }
        st = l3d_comm_create_env(b.ctx, b.o.transport, &comms[0]);
    }
    if (st != L3D_OK) {
        rc = l3d_cli_fail(BC_CMD, b.ctx, st);  // an unbuilt transport or a bad environment: 2
        goto out;
    }
    rc = bc_run(&b, comms, nlocal);
    for (int i = 0; i < nlocal; i++) l3d_comm_destroy(comms[i]);
out:
    free(comms);
    pthread_mutex_destroy(&b.mu);
    l3d_ctx_destroy(b.ctx);
    return rc;
}

int l3d_cmd_bench(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[2], "comm")) return l3d_bench_comm_main(argc, argv, 3);
    int help = argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"));
    FILE *f = help ? stdout : stderr;
    if (argc >= 3 && !help)
        fprintf(f, "l3d bench: unknown benchmark '%s' (there is: comm; see l3d bench comm "
                "--help)\n", argv[2]);
    else
        fprintf(f, "usage: l3d bench comm [OP] [FLAGS]   collectives, nccl-tests style "
                   "(l3d bench comm --help)\n");
    return help ? L3D_EXIT_OK : L3D_EXIT_USAGE;
}
