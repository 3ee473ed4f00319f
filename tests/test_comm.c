// Every collective on every built transport against a serial reference computed here:
// dtypes x ops x counts x rank counts, in place and out of place, each run twice (bit-identical
// repeat), replicated outputs bit-identical across ranks, and every algorithm forced through
// L3D_ALGO. Half types: the reference is the exact sum, the result must be within half an ulp
// of the half type (plus float32 summation error) -- rounding per hop would not be.
#define _DEFAULT_SOURCE  // MAP_ANONYMOUS
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "llama3d/comm.h"
#include "tests/harness/asan.h"
#include "tests/harness/world.h"
#include "tests/harness/world_params.h"

enum { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE, C_ALLTOALL, C_BARRIER };
static const char *cname[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                              "reduce",    "alltoall",       "barrier"};

typedef struct ccase {
    int coll, dt, op, inplace, root;
    size_t count;
} ccase_t;

#define MAX_CASES 2048
#define MAX_RANKS 16
typedef struct shared {
    uint64_t hash[MAX_RANKS];
    int nranks;
} shared_t;

typedef struct run_arg {
    ccase_t cases[MAX_CASES];
    int ncases;
    shared_t *sh;  // MAP_SHARED: visible from forked rank processes
} run_arg_t;

// ---- independent conversions and inputs --------------------------------------------------------
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static uint16_t to_bf16(float f) {
    uint32_t u = f2u(f);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) { return u2f((uint32_t)h << 16); }
// The compiler's IEEE half conversion is the reference: _Float16, or where clang has no
// _Float16 on x86 (before clang 15: the sanitizer build) its storage-only __fp16, which
// converts with the same round-to-nearest-even.
#if defined(__clang__) && __clang_major__ < 15
typedef __fp16 ref_half;
#else
typedef _Float16 ref_half;
#endif
static uint16_t to_f16(float f) {
    ref_half h = (ref_half)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static float from_f16(uint16_t u) {
    ref_half h;
    memcpy(&h, &u, 2);
    return (float)h;
}

static size_t dsize(int dt) { return l3d_dtype_size((l3d_dtype)dt); }

// The input element idx of rank r, written to p; returns its exact value.
static double gen(int dt, int r, size_t idx, void *p) {
    uint32_t h = (uint32_t)((uint64_t)(r * 1000003u + 12345u + idx) * 2654435761u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float f = (float)(h >> 8) / 8388608.0f - 1.0f;  // [-1, 1)
    switch (dt) {
    case L3D_FLOAT32:
        memcpy(p, &f, 4);
        return f;
    case L3D_BFLOAT16: {
        uint16_t b = to_bf16(f);
        memcpy(p, &b, 2);
        return from_bf16(b);
    }
    case L3D_FLOAT16: {
        uint16_t b = to_f16(f);
        memcpy(p, &b, 2);
        return from_f16(b);
    }
    case L3D_INT32: {
        int32_t v = (int32_t)(h % 2001u) - 1000;
        memcpy(p, &v, 4);
        return v;
    }
    case L3D_INT64: {
        int64_t v = (int64_t)(h % 200001u) - 100000 + ((int64_t)(h & 7) << 36);
        memcpy(p, &v, 8);
        return (double)v;
    }
    default: {
        uint8_t v = (uint8_t)(h % 8u);  // sums of 16 ranks stay below 256
        memcpy(p, &v, 1);
        return v;
    }
    }
}

static double value_of(int dt, const void *p) {
    switch (dt) {
    case L3D_FLOAT32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case L3D_BFLOAT16: {
        uint16_t b;
        memcpy(&b, p, 2);
        return from_bf16(b);
    }
    case L3D_FLOAT16: {
        uint16_t b;
        memcpy(&b, p, 2);
        return from_f16(b);
    }
    case L3D_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case L3D_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    default:
        return *(const uint8_t *)p;
    }
}

static double half_ulp(int dt, double x) {
    x = fabs(x);
    int e = x > 0 ? (int)floor(log2(x)) : -126;
    if (dt == L3D_FLOAT16 && e < -14) e = -14;
    return ldexp(1.0, e - (dt == L3D_BFLOAT16 ? 7 : 10));
}

// Checks out (dt) against the reduction over ranks of input element idx; 0 if it matches.
static int check_reduced(const ccase_t *k, int n, size_t idx, const void *out, char *msg,
                         size_t len) {
    unsigned char tmp[8];
    double got = value_of(k->dt, out), d = 0, sabs = 0, mx = -INFINITY, mn = INFINITY;
    int64_t isum = 0;
    for (int r = 0; r < n; r++) {
        double v = gen(k->dt, r, idx, tmp);
        d += v;
        sabs += fabs(v);
        mx = v > mx ? v : mx;
        mn = v < mn ? v : mn;
        isum += (int64_t)v;
    }
    int isint = k->dt == L3D_INT32 || k->dt == L3D_INT64 || k->dt == L3D_UINT8;
    double want, tol = 0;
    if (k->op == L3D_MAX) want = mx;
    else if (k->op == L3D_MIN) want = mn;
    else if (isint) want = (double)(k->op == L3D_AVG ? isum / n : isum);
    else {
        want = k->op == L3D_AVG ? d / n : d;
        double s = k->op == L3D_AVG ? sabs / n : sabs;
        tol = (n + 1) * 1.2e-7 * s + 1e-30;
        if (k->dt != L3D_FLOAT32) tol += 0.5 * half_ulp(k->dt, fmax(fabs(want), fabs(got)));
    }
    if (fabs(got - want) <= tol) return 0;
    snprintf(msg, len, "element %zu: got %.9g want %.9g (tolerance %.3g)", idx, got, want, tol);
    return 1;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

// ---- one case on one rank -----------------------------------------------------------------------
static l3d_status call(l3d_comm_t *c, const ccase_t *k, const void *sb, void *rb) {
    switch (k->coll) {
    case C_ALLREDUCE:
        return l3d_comm_allreduce(c, sb, rb, k->count, k->dt, k->op);
    case C_REDUCE_SCATTER:
        return l3d_comm_reduce_scatter(c, sb, rb, k->count, k->dt, k->op);
    case C_ALLGATHER:
        return l3d_comm_allgather(c, sb, rb, k->count, k->dt);
    case C_BROADCAST:
        return l3d_comm_broadcast(c, sb, rb, k->count, k->dt, k->root);
    case C_REDUCE:
        return l3d_comm_reduce(c, sb, rb, k->count, k->dt, k->op, k->root);
    case C_ALLTOALL:
        return l3d_comm_alltoall(c, sb, rb, k->count, k->dt);
    default:
        return l3d_comm_barrier(c);
    }
}

// Input elements of one rank: a block per rank for reduce_scatter and alltoall.
static size_t in_elems(const ccase_t *k, int n) {
    return (k->coll == C_REDUCE_SCATTER || k->coll == C_ALLTOALL) ? k->count * (size_t)n
                                                                   : k->count;
}

// Runs the case once on this rank's input `in`; *res_p points at the result (out elements)
// inside *mem_p (freed by caller). The buffer is exactly as large as the collective may touch
// (+1 so that count 0 allocates), so the sanitizer build catches a write past it.
static int run_once(l3d_comm_t *c, const ccase_t *k, const unsigned char *in,
                    unsigned char **mem_p, unsigned char **res_p, char *err, size_t errlen) {
    int n = l3d_comm_size(c), me = l3d_comm_rank(c);
    size_t es = dsize(k->dt), cnt = k->count, in_n = in_elems(k, n);
    size_t big = (k->coll == C_ALLGATHER || k->coll == C_ALLTOALL) ? cnt * (size_t)n : in_n;
    big += 1;
    unsigned char *out = malloc(big * es);
    memset(out, 0xa5, big * es);
    const void *sb = in;
    void *rb = out;
    unsigned char *res = out;
    if (k->inplace) {
        switch (k->coll) {
        case C_REDUCE_SCATTER:  // recvbuf is block `me` of sendbuf
            memcpy(out, in, in_n * es);
            sb = out;
            rb = res = out + (size_t)me * cnt * es;
            break;
        case C_ALLGATHER:
            memcpy(out + (size_t)me * cnt * es, in, cnt * es);
            sb = out + (size_t)me * cnt * es;
            break;
        case C_BROADCAST:
            if (me == k->root) memcpy(out, in, cnt * es);
            sb = out;
            break;
        default:
            memcpy(out, in, in_n * es);
            sb = out;
            break;
        }
    }
    if (k->coll == C_REDUCE && me != k->root && !k->inplace) rb = NULL;
    if (k->coll == C_BROADCAST && me != k->root && !k->inplace) sb = NULL;
    l3d_status st = call(c, k, sb, rb);
    *mem_p = out;
    *res_p = res;
    if (st != L3D_OK) {
        snprintf(err, errlen, "returned %d: %s", (int)st, l3d_ctx_last_error(l3d_comm_ctx(c)));
        return 1;
    }
    return 0;
}

static size_t out_elems(const ccase_t *k, int n, int me) {
    switch (k->coll) {
    case C_ALLGATHER:
    case C_ALLTOALL:
        return k->count * (size_t)n;
    case C_REDUCE:
        return me == k->root ? k->count : 0;
    case C_BARRIER:
        return 0;
    default:
        return k->count;
    }
}

static int replicated(int coll) {
    return coll == C_ALLREDUCE || coll == C_ALLGATHER || coll == C_BROADCAST;
}

// Checks this rank's result against the reference. A replicated output is checked by each rank
// on the elements j = me (mod n) only: rank_fn hashes the whole output and run_world requires
// every rank's hash to equal rank 0's, so between them the ranks check every element of every
// rank without computing the same n-rank reference n times.
static int check(const ccase_t *k, int n, int me, const unsigned char *res, char *msg,
                 size_t len) {
    size_t es = dsize(k->dt), cnt = k->count, m = out_elems(k, n, me);
    size_t j0 = replicated(k->coll) ? (size_t)me : 0, step = replicated(k->coll) ? (size_t)n : 1;
    unsigned char want[8];
    for (size_t j = j0; j < m; j += step) {
        const unsigned char *g = res + j * es;
        switch (k->coll) {
        case C_ALLREDUCE:
        case C_REDUCE:
            if (check_reduced(k, n, j, g, msg, len)) return 1;
            break;
        case C_REDUCE_SCATTER:
            if (check_reduced(k, n, (size_t)me * cnt + j, g, msg, len)) return 1;
            break;
        case C_ALLGATHER:
            gen(k->dt, (int)(j / cnt), j % cnt, want);
            break;
        case C_BROADCAST:
            gen(k->dt, k->root, j, want);
            break;
        case C_ALLTOALL:
            gen(k->dt, (int)(j / cnt), (size_t)me * cnt + j % cnt, want);
            break;
        }
        if ((k->coll == C_ALLGATHER || k->coll == C_BROADCAST || k->coll == C_ALLTOALL) &&
            memcmp(g, want, es)) {
            snprintf(msg, len, "element %zu: got %.9g want %.9g", j, value_of(k->dt, g),
                     value_of(k->dt, want));
            return 1;
        }
    }
    return 0;
}

static int rank_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    run_arg_t *ra = arg;
    int n = l3d_comm_size(c), me = l3d_comm_rank(c);
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < ra->ncases; i++) {
        ccase_t k = ra->cases[i];
        k.root = k.root % n;
        char msg[200] = "";
        unsigned char *m1 = NULL, *r1 = NULL, *m2 = NULL, *r2 = NULL;
        size_t es = dsize(k.dt), in_n = in_elems(&k, n);
        unsigned char *in = malloc(in_n * es + 1);
        for (size_t j = 0; j < in_n; j++) gen(k.dt, me, j, in + j * es);
        int bad = run_once(c, &k, in, &m1, &r1, msg, sizeof(msg));
        if (!bad) bad = run_once(c, &k, in, &m2, &r2, msg, sizeof(msg));
        free(in);
        size_t bytes = out_elems(&k, n, me) * dsize(k.dt);
        if (!bad && memcmp(r1, r2, bytes)) {
            snprintf(msg, sizeof(msg), "two runs differ");
            bad = 1;
        }
        if (!bad) bad = check(&k, n, me, r1, msg, sizeof(msg));
        if (!bad && replicated(k.coll)) h = fnv(h, r1, bytes);
        free(m1);
        free(m2);
        if (bad) {
            l3d_comm_abort(c);  // the other ranks fail fast instead of waiting for us
            snprintf(err, errlen, "%s %s %s count %zu%s root %d: %s", cname[k.coll],
                     l3d_dtype_name(k.dt), l3d_redop_name(k.op), k.count,
                     k.inplace ? " in place" : "", k.root, msg);
            return 1;
        }
    }
    ra->sh->hash[me] = h;
    return 0;
}

// ---- case lists ---------------------------------------------------------------------------------
static int reducing(int coll) {
    return coll == C_ALLREDUCE || coll == C_REDUCE_SCATTER || coll == C_REDUCE;
}

static void add(run_arg_t *ra, int coll, int dt, int op, size_t count, int inplace, int root) {
    cr_assert_lt(ra->ncases, MAX_CASES);
    ra->cases[ra->ncases++] = (ccase_t){coll, dt, op, inplace, root, count};
}

// Every dtype x op x count x in-place form of one collective.
static void add_matrix(run_arg_t *ra, int coll, const size_t *counts, int ncounts, int ndt) {
    static const int dts[] = {L3D_FLOAT32, L3D_BFLOAT16, L3D_FLOAT16,
                              L3D_INT32,   L3D_INT64,    L3D_UINT8};
    if (coll == C_BARRIER) {
        add(ra, coll, L3D_UINT8, L3D_SUM, 0, 0, 0);
        return;
    }
    for (int d = 0; d < ndt; d++)
        for (int op = 0; op < (reducing(coll) ? 4 : 1); op++)
            for (int ci = 0; ci < ncounts; ci++)
                for (int ip = 0; ip < 2; ip++)
                    add(ra, coll, dts[d], op, counts[ci], ip, (int)(counts[ci] + (size_t)ip));
}

static run_arg_t *new_arg(void) {
    run_arg_t *ra = calloc(1, sizeof(*ra));
    ra->sh = mmap(NULL, sizeof(shared_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                  0);
    cr_assert_neq(ra->sh, MAP_FAILED);
    return ra;
}

static void free_arg(run_arg_t *ra) {
    munmap(ra->sh, sizeof(shared_t));
    free(ra);
}

// Runs the cases on n ranks of transport tp; the world fails after limit_s seconds. A collective
// that hangs fails sooner, after L3D_COMM_TIMEOUT.
static void run_world_limit(const char *tp, int n, run_arg_t *ra, int limit_s) {
    char err[512] = "";
    setenv("L3D_COMM_TIMEOUT", "60", 0);  // a broken build fails instead of hanging 300 s
    memset(ra->sh, 0, sizeof(shared_t));
    int rc = l3d_world_run(tp, n, rank_fn, ra, limit_s, err, sizeof(err));
    cr_assert_eq(rc, 0, "%s", err);
    for (int r = 1; r < n; r++)
        cr_assert_eq(ra->sh->hash[r], ra->sh->hash[0],
                     "%s, %d ranks: rank %d's replicated outputs differ from rank 0's", tp, n, r);
}

static void run_world(const char *tp, int n, run_arg_t *ra) { run_world_limit(tp, n, ra, 120); }

static int is_local(const char *tp) { return !strcmp(tp, "local"); }

// ---- counts and rank counts of the matrix ------------------------------------------------------

// Threads (local) and processes (ucx, ofi) run the same matrix: every dtype x op x count x
// in/out of place on {1, 2, 3, 4, 5, 8} ranks; the 1M+3 count is the `large` test below.
static const size_t small_counts[] = {0, 1, 7, 1000};
static const int rank_counts[] = {1, 2, 3, 4, 5, 8};

static void matrix_test(const char *tp, int coll) {
    run_arg_t *ra = new_arg();
    add_matrix(ra, coll, small_counts, 4, 6);
    for (int i = 0; i < 6; i++) run_world(tp, rank_counts[i], ra);
    free_arg(ra);
}

#define MATRIX_TEST(tname, coll)                                                  \
    ParameterizedTestParameters(comm, tname) { return l3d_world_transport_params(); }       \
    ParameterizedTest(l3d_tp_param_t *p, comm, tname, .timeout = 300) { matrix_test(p->name, coll); }

MATRIX_TEST(allreduce, C_ALLREDUCE)
MATRIX_TEST(reduce_scatter, C_REDUCE_SCATTER)
MATRIX_TEST(allgather, C_ALLGATHER)
MATRIX_TEST(broadcast, C_BROADCAST)
MATRIX_TEST(reduce, C_REDUCE)
MATRIX_TEST(alltoall, C_ALLTOALL)
MATRIX_TEST(barrier, C_BARRIER)

// The 1M+3 count for every collective (several pipeline segments, blocks of unequal size) on
// every rank count, threads and processes alike. One test per (transport, rank count): the
// sanitizer build under a loaded CI machine takes minutes for the 8-rank worlds, and each
// deserves its own time limit rather than sharing one with the other five.
typedef struct large_param {
    char tp[16];
    int nranks;
} large_param_t;

// Under AddressSanitizer (CI's sanitizer build) on the in-process transport only: every
// collective's large-count paths are the core's, and the process transports' large transfers
// are test_transport_ucx's and test_transport_ofi's 64 MiB messages, in that build too.

static struct criterion_test_params large_params(void) {
    static large_param_t ps[8 * 6];  // Criterion keeps a pointer to the array: static storage
    const char *names[8];
    int nt = l3d_world_transports(names, 8);
#ifdef L3D_TEST_ASAN
    for (int t = 0; t < nt; t++)
        if (is_local(names[t])) names[0] = names[t];
    nt = 1;
#endif
    size_t n = 0;
    for (int t = 0; t < nt; t++)
        for (int i = 0; i < 6; i++) {
            snprintf(ps[n].tp, sizeof(ps[n].tp), "%s", names[t]);
            ps[n++].nranks = rank_counts[i];
        }
    return cr_make_param_array(large_param_t, ps, n);
}

ParameterizedTestParameters(comm, large) { return large_params(); }
ParameterizedTest(large_param_t *p, comm, large, .timeout = 300) {
    enum { BIG = 1000003 };
    run_arg_t *ra = new_arg();
    add(ra, C_ALLREDUCE, L3D_FLOAT32, L3D_SUM, BIG, 0, 0);
    add(ra, C_ALLREDUCE, L3D_BFLOAT16, L3D_SUM, BIG, 1, 0);
    add(ra, C_REDUCE_SCATTER, L3D_FLOAT32, L3D_SUM, BIG, 0, 0);
    add(ra, C_REDUCE_SCATTER, L3D_INT32, L3D_MAX, BIG, 1, 0);
    add(ra, C_ALLGATHER, L3D_FLOAT32, L3D_SUM, BIG, 0, 0);
    add(ra, C_ALLGATHER, L3D_UINT8, L3D_SUM, BIG, 1, 0);
    add(ra, C_BROADCAST, L3D_FLOAT32, L3D_SUM, BIG, 0, 1);
    add(ra, C_REDUCE, L3D_FLOAT16, L3D_AVG, BIG, 0, 1);
    add(ra, C_ALLTOALL, L3D_FLOAT32, L3D_SUM, BIG, 0, 0);
    run_world_limit(p->tp, p->nranks, ra, 240);
    free_arg(ra);
}

// Every algorithm forced with L3D_ALGO (read when each rank's context is created; forked rank
// processes inherit it).
typedef struct algo_param {
    char tp[16];
    char algo[40];
    int coll;
} algo_param_t;

static struct criterion_test_params algo_params(void) {
    static const struct {
        const char *algo;
        int coll;
    } algos[] = {{"allreduce:ring", C_ALLREDUCE},       {"allreduce:rabenseifner", C_ALLREDUCE},
                 {"allreduce:recdoubling", C_ALLREDUCE}, {"allreduce:tree", C_ALLREDUCE},
                 {"allgather:ring", C_ALLGATHER},       {"allgather:recdoubling", C_ALLGATHER},
                 {"allgather:bruck", C_ALLGATHER},      {"broadcast:tree", C_BROADCAST},
                 {"broadcast:chain", C_BROADCAST},      {"reduce:tree", C_REDUCE},
                 {"reduce:chain", C_REDUCE},            {"reduce_scatter:ring", C_REDUCE_SCATTER}};
    static algo_param_t ps[8 * 12];
    const char *names[8];
    int nt = l3d_world_transports(names, 8);
    size_t n = 0;
    for (int t = 0; t < nt; t++)
        for (size_t a = 0; a < sizeof(algos) / sizeof(algos[0]); a++) {
            snprintf(ps[n].tp, sizeof(ps[n].tp), "%s", names[t]);
            snprintf(ps[n].algo, sizeof(ps[n].algo), "%s", algos[a].algo);
            ps[n].coll = algos[a].coll;
            n++;
        }
    return cr_make_param_array(algo_param_t, ps, n);
}

ParameterizedTestParameters(comm, forced_algo) { return algo_params(); }
ParameterizedTest(algo_param_t *p, comm, forced_algo, .timeout = 300) {
    static const int local_ranks[] = {2, 3, 4, 5, 8}, proc_ranks[] = {3, 4};
    static const size_t counts[] = {1, 7, 1000, 300007};
    static const int dts[] = {L3D_FLOAT32, L3D_BFLOAT16, L3D_FLOAT16, L3D_INT32, L3D_UINT8};
    setenv("L3D_ALGO", p->algo, 1);
    int local = is_local(p->tp);
    run_arg_t *ra = new_arg();
    for (int d = 0; d < 5; d++)
        for (int op = 0; op < (reducing(p->coll) ? 4 : 1); op++)
            for (int ci = 0; ci < (local ? 3 : 2); ci++)
                for (int ip = 0; ip < 2; ip++)
                    add(ra, p->coll, dts[d], op, counts[ci], ip, ci + ip);
    add(ra, p->coll, L3D_FLOAT32, L3D_SUM, counts[3], 0, 1);
    add(ra, p->coll, L3D_BFLOAT16, reducing(p->coll) ? L3D_AVG : L3D_SUM, counts[3], 1, 0);
    // Processes cost a launch each: 3 ranks, plus 4 where power-of-two paths differ.
    int pow2_paths = strstr(p->algo, "recdoubling") || strstr(p->algo, "rabenseifner");
    for (int i = 0; i < (local ? 5 : 1 + pow2_paths); i++)
        run_world(p->tp, (local ? local_ranks : proc_ranks)[i], ra);
    free_arg(ra);
}

// An invalid L3D_ALGO is a configuration error naming the valid algorithms.
Test(comm, algo_invalid) {
    setenv("L3D_ALGO", "allreduce:bogus", 1);
    l3d_ctx_t *ctx = NULL;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_comm_t *comms[2];
    cr_assert_eq(l3d_comm_create_local(ctx, 2, comms), L3D_ERR_CONFIG);
    const char *e = l3d_ctx_last_error(ctx);
    cr_assert(strstr(e, "bogus") && strstr(e, "ring") && strstr(e, "rabenseifner"), "%s", e);
    setenv("L3D_ALGO", "allreduc:ring", 1);
    l3d_ctx_destroy(ctx);
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    cr_assert_eq(l3d_comm_create_local(ctx, 2, comms), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "allreduce"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "comm"), 0);
    l3d_ctx_destroy(ctx);
}

// Tiny messages and at most two in flight per peer (L3D_COMM_MAX_MSG/_INFLIGHT): every
// algorithm's segmenting, piece splitting and posting limits, against the same reference.
ParameterizedTestParameters(comm, segmented_algo) { return algo_params(); }
ParameterizedTest(algo_param_t *p, comm, segmented_algo, .timeout = 300) {
    static const int local_ranks[] = {3, 4, 5}, proc_ranks[] = {3};
    static const size_t counts[] = {7, 1000, 30011};
    static const struct {
        int dt, op;
    } kinds[] = {{L3D_FLOAT32, L3D_SUM}, {L3D_BFLOAT16, L3D_AVG}, {L3D_INT32, L3D_MAX},
                 {L3D_UINT8, L3D_SUM}};
    setenv("L3D_ALGO", p->algo, 1);
    setenv("L3D_COMM_MAX_MSG", "4096", 1);
    setenv("L3D_COMM_MAX_INFLIGHT", "2", 1);
    int local = is_local(p->tp);
    run_arg_t *ra = new_arg();
    for (int k = 0; k < 4; k++)
        for (int ci = 0; ci < 3; ci++)
            for (int ip = 0; ip < 2; ip++)
                add(ra, p->coll, kinds[k].dt, reducing(p->coll) ? kinds[k].op : L3D_SUM,
                    counts[ci], ip, ci + k);
    for (int i = 0; i < (local ? 3 : 1); i++)
        run_world(p->tp, (local ? local_ranks : proc_ranks)[i], ra);
    free_arg(ra);
}
