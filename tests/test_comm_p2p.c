// Point-to-point, groups, split and non-blocking collectives on every built transport.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llama3d/comm.h"
#include "tests/harness/world.h"
#include "tests/harness/world_params.h"

#define FAILF(...)                                 \
    do {                                           \
        snprintf(err, errlen, __VA_ARGS__);        \
        return 1;                                  \
    } while (0)
#define CHECK_OK(call)                                                                          \
    do {                                                                                        \
        l3d_status st_ = (call);                                                                \
        if (st_ != L3D_OK)                                                                      \
            FAILF("%s returned %d: %s", #call, (int)st_, l3d_ctx_last_error(l3d_comm_ctx(c))); \
    } while (0)


static void run_all(const char *tp, l3d_world_fn fn, const int *local_ranks, int nl) {
    static const int proc_ranks[] = {2, 3, 4};
    setenv("L3D_COMM_TIMEOUT", "60", 0);
    int local = !strcmp(tp, "local");
    for (int i = 0; i < (local ? nl : 3); i++) {
        int n = local ? local_ranks[i] : proc_ranks[i];
        char err[512] = "";
        cr_assert_eq(l3d_world_run(tp, n, fn, NULL, 120, err, sizeof(err)), 0, "%d ranks: %s", n,
                     err);
    }
}

static const int all_ranks[] = {1, 2, 3, 4, 5, 8};
static const int multi_ranks[] = {2, 3, 4, 5, 8};

static int32_t val(int from, int to, int i) { return from * 1000000 + to * 10000 + i; }

// ---- blocking send/recv: rank 0 sends three messages to every rank, which checks their order
// and echoes the last one back.
static int sendrecv_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    int n = l3d_comm_size(c), me = l3d_comm_rank(c);
    enum { N = 1000 };
    int32_t buf[N];
    if (me == 0) {
        for (int p = 1; p < n; p++)
            for (int m = 0; m < 3; m++) {
                for (int i = 0; i < N; i++) buf[i] = val(m, p, i);
                CHECK_OK(l3d_comm_send(c, buf, N - (size_t)m, L3D_INT32, p));
            }
        for (int p = 1; p < n; p++) {
            CHECK_OK(l3d_comm_recv(c, buf, N, L3D_INT32, p));
            for (int i = 0; i < N - 2; i++)
                if (buf[i] != val(2, p, i)) FAILF("echo from %d: [%d] = %d", p, i, buf[i]);
        }
    } else {
        for (int m = 0; m < 3; m++) {
            memset(buf, 0, sizeof(buf));
            CHECK_OK(l3d_comm_recv(c, buf, N - (size_t)m, L3D_INT32, 0));
            for (int i = 0; i < N - m; i++)
                if (buf[i] != val(m, me, i)) FAILF("message %d: [%d] = %d", m, i, buf[i]);
        }
        CHECK_OK(l3d_comm_send(c, buf, N, L3D_INT32, 0));
    }
    CHECK_OK(l3d_comm_send(c, buf, 0, L3D_INT32, (me + 1) % n));  // empty messages are no-ops
    return 0;
}

ParameterizedTestParameters(p2p, sendrecv) { return l3d_world_transport_params(); }
ParameterizedTest(l3d_tp_param_t *p, p2p, sendrecv, .timeout = 200) {
    run_all(p->name, sendrecv_fn, multi_ranks, 5);
}

// ---- isend/irecv with everyone, completed in reverse order ---------------------------------
static int nonblocking_p2p_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    int n = l3d_comm_size(c), me = l3d_comm_rank(c);
    enum { N = 4096 };
    int32_t *out = malloc((size_t)n * N * 4), *in = malloc((size_t)n * N * 4);
    l3d_request_t **rq = malloc(2 * (size_t)n * sizeof(*rq));
    for (int p = 0; p < n; p++)
        for (int i = 0; i < N; i++) out[(size_t)p * N + i] = val(me, p, i);
    memset(in, 0, (size_t)n * N * 4);
    for (int p = 0; p < n; p++)
        CHECK_OK(l3d_comm_irecv(c, in + (size_t)p * N, N, L3D_INT32, p, &rq[p]));
    for (int p = 0; p < n; p++)
        CHECK_OK(l3d_comm_isend(c, out + (size_t)p * N, N, L3D_INT32, p, &rq[n + p]));
    // Poll the last one with test, wait for the others from the back.
    int done = 0;
    while (!done) CHECK_OK(l3d_request_test(rq[2 * n - 1], &done));
    for (int i = 2 * n - 2; i >= 0; i--) CHECK_OK(l3d_request_wait(rq[i]));
    for (int p = 0; p < n; p++)
        for (int i = 0; i < N; i++)
            if (in[(size_t)p * N + i] != val(p, me, i)) FAILF("from %d: [%d] = %d", p, i, in[(size_t)p * N + i]);
    free(rq);
    free(in);
    free(out);
    return 0;
}

ParameterizedTestParameters(p2p, nonblocking) { return l3d_world_transport_params(); }
ParameterizedTest(l3d_tp_param_t *p, p2p, nonblocking, .timeout = 200) {
    run_all(p->name, nonblocking_p2p_fn, all_ranks, 6);
}

// ---- group: every rank sends to rank+1 and receives from rank-1 (a pipeline shift) ---------
static int group_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    int n = l3d_comm_size(c), me = l3d_comm_rank(c), next = (me + 1) % n, prev = (me - 1 + n) % n;
    size_t sizes[] = {1, 1000, 1 << 20};  // the large one would deadlock without batching
    for (int s = 0; s < 3; s++) {
        size_t N = sizes[s];
        int32_t *out = malloc(N * 4), *in = calloc(N, 4);
        for (size_t i = 0; i < N; i++) out[i] = val(me, next, (int)i);
        CHECK_OK(l3d_comm_group_start(c));
        if (l3d_comm_group_start(c) != L3D_ERR_INVALID_ARG) FAILF("nested group accepted");
        CHECK_OK(l3d_comm_send(c, out, N, L3D_INT32, next));
        CHECK_OK(l3d_comm_recv(c, in, N, L3D_INT32, prev));
        CHECK_OK(l3d_comm_group_end(c));
        for (size_t i = 0; i < N; i++)
            if (in[i] != val(prev, me, (int)i)) FAILF("size %zu: [%zu] = %d", N, i, in[i]);
        free(out);
        free(in);
    }
    if (l3d_comm_group_end(c) != L3D_ERR_INVALID_ARG) FAILF("group_end without start accepted");
    return 0;
}

ParameterizedTestParameters(p2p, group_ring) { return l3d_world_transport_params(); }
ParameterizedTest(l3d_tp_param_t *p, p2p, group_ring, .timeout = 200) {
    run_all(p->name, group_fn, all_ranks, 6);
}

// ---- split ------------------------------------------------------------------------------------
static int split_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    int n = l3d_comm_size(c), me = l3d_comm_rank(c);
    // Colors by parity, keys reversed: the child orders ranks by descending parent rank.
    l3d_comm_t *child = NULL, *grand = NULL, *none = (l3d_comm_t *)1;
    CHECK_OK(l3d_comm_split(c, me % 2, -me, &child));
    int members = (n - me % 2 + 1) / 2;
    if (!child || l3d_comm_size(child) != members) FAILF("child size");
    int want_rank = 0;
    for (int r = me + 2; r < n; r += 2) want_rank++;
    if (l3d_comm_rank(child) != want_rank)
        FAILF("child rank %d, want %d", l3d_comm_rank(child), want_rank);
    int64_t x = me, sum = 0, want = 0;
    for (int r = me % 2; r < n; r += 2) want += r;
    CHECK_OK(l3d_comm_allreduce(child, &x, &sum, 1, L3D_INT64, L3D_SUM));
    if (sum != want) FAILF("child allreduce %lld want %lld", (long long)sum, (long long)want);
    // The parent still works, interleaved with the child.
    CHECK_OK(l3d_comm_allreduce(c, &x, &sum, 1, L3D_INT64, L3D_SUM));
    if (sum != (int64_t)n * (n - 1) / 2) FAILF("parent allreduce %lld", (long long)sum);
    // Nested split: halves of the child; color < 0 for the child's rank 0 of odd ranks.
    int cr = l3d_comm_rank(child), color = (me % 2 && cr == 0) ? -1 : cr / 2;
    CHECK_OK(l3d_comm_split(child, color, 0, &grand));
    if (color < 0 && grand) FAILF("color -1 gave a communicator");
    // Destroy the child before its own child is used.
    l3d_comm_destroy(child);
    if (grand) {
        int gs = l3d_comm_size(grand);
        int32_t *all = calloc((size_t)gs, 4), mine = me;
        CHECK_OK(l3d_comm_allgather(grand, &mine, all, 1, L3D_INT32));
        for (int i = 1; i < gs; i++)
            if (all[i] >= all[i - 1]) FAILF("grandchild order (keys -me kept in the child)");
        CHECK_OK(l3d_comm_barrier(grand));
        free(all);
        l3d_comm_destroy(grand);
    }
    CHECK_OK(l3d_comm_split(c, -1, 0, &none));
    if (none) FAILF("color -1 must give NULL");
    CHECK_OK(l3d_comm_barrier(c));
    return 0;
}

ParameterizedTestParameters(p2p, split) { return l3d_world_transport_params(); }
ParameterizedTest(l3d_tp_param_t *p, p2p, split, .timeout = 200) {
    run_all(p->name, split_fn, all_ranks, 6);
}

// ---- non-blocking collectives started back to back, completed in reverse order ---------------
static int icoll_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    int n = l3d_comm_size(c), me = l3d_comm_rank(c);
    enum { N = 3001 };
    // a feeds the iallreduce and a2 the in-place ireduce: a pending operation's send buffer
    // must not be written (MPI's rule; the local transport reads peers' buffers directly).
    float *a = malloc(N * 4), *ar = malloc(N * 4), *a2 = malloc(N * 4);
    int32_t *g = malloc((size_t)n * N * 4), mine[N];
    int64_t *b = malloc(N * 8);
    int32_t *rs_in = malloc((size_t)n * N * 4), *rs = malloc(N * 4);
    int32_t *at_in = malloc((size_t)n * 5 * 4), *at = malloc((size_t)n * 5 * 4);
    for (int i = 0; i < N; i++) {
        a[i] = a2[i] = (float)(me + 1) * 0.5f;
        mine[i] = val(me, 0, i);
        b[i] = me == n - 1 ? (int64_t)i * 3 : -1;
    }
    for (int i = 0; i < n * N; i++) rs_in[i] = i + me;
    for (int i = 0; i < n * 5; i++) at_in[i] = me * 100 + i;
    l3d_request_t *r[6];
    CHECK_OK(l3d_comm_iallreduce(c, a, ar, N, L3D_FLOAT32, L3D_SUM, &r[0]));
    CHECK_OK(l3d_comm_iallgather(c, mine, g, N, L3D_INT32, &r[1]));
    CHECK_OK(l3d_comm_ibroadcast(c, b, b, N, L3D_INT64, n - 1, &r[2]));
    CHECK_OK(l3d_comm_ireduce_scatter(c, rs_in, rs, N, L3D_INT32, L3D_MAX, &r[3]));
    CHECK_OK(l3d_comm_ialltoall(c, at_in, at, 5, L3D_INT32, &r[4]));
    CHECK_OK(l3d_comm_ireduce(c, a2, a2, N, L3D_FLOAT32, L3D_MAX, 0, &r[5]));
    for (int i = 5; i >= 0; i--) CHECK_OK(l3d_request_wait(r[i]));
    float want = 0.5f * (float)n * (float)(n + 1) / 2;
    for (int i = 0; i < N; i++) {
        if (ar[i] != want) FAILF("iallreduce [%d] = %g want %g", i, ar[i], want);
        if (b[i] != (int64_t)i * 3) FAILF("ibroadcast [%d] = %lld", i, (long long)b[i]);
        if (rs[i] != me * N + i + n - 1) FAILF("ireduce_scatter [%d] = %d", i, rs[i]);
        if (me == 0 && a2[i] != 0.5f * (float)n) FAILF("ireduce [%d] = %g", i, a2[i]);
    }
    for (int p = 0; p < n; p++)
        for (int i = 0; i < N; i++)
            if (g[(size_t)p * N + i] != val(p, 0, i)) FAILF("iallgather [%d][%d]", p, i);
    for (int p = 0; p < n; p++)
        for (int i = 0; i < 5; i++)
            if (at[p * 5 + i] != p * 100 + me * 5 + i) FAILF("ialltoall [%d][%d]", p, i);
    free(a);
    free(a2);
    free(ar);
    free(g);
    free(b);
    free(rs_in);
    free(rs);
    free(at_in);
    free(at);
    return 0;
}

ParameterizedTestParameters(p2p, icollectives_reverse) { return l3d_world_transport_params(); }
ParameterizedTest(l3d_tp_param_t *p, p2p, icollectives_reverse, .timeout = 200) {
    run_all(p->name, icoll_fn, all_ranks, 6);
}

// ---- many small non-blocking collectives in flight, one large among them -------------------
// More small calls than the in-process transport keeps slots for (its eager path has four per
// communicator, so later calls publish only once earlier ones completed), of every kind, in
// place and not, with a large call (the rendezvous path) in the middle, completed in reverse
// order. Integer sums: exact.
enum { NSMALL = 15, BIG = 5000 };

static int kind_of(int i) { return i % 4; }  // allreduce, allgather, broadcast, reduce_scatter

static int32_t small_in(int i, int me, int j) { return (int32_t)(i * 7919 + me * 131 + j); }

static int small_ring_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    int n = l3d_comm_size(c), me = l3d_comm_rank(c);
    int32_t in[NSMALL][64], out[NSMALL][64];
    int32_t *big = malloc(BIG * 4), *bigout = malloc(BIG * 4);
    l3d_request_t *r[NSMALL + 1];
    size_t cnt[NSMALL];
    for (int i = 0; i < NSMALL; i++) {
        cnt[i] = 1 + (size_t)i % 3;
        for (int j = 0; j < 64; j++) in[i][j] = out[i][j] = small_in(i, me, j);
        int inplace = i % 2;
        switch (kind_of(i)) {
        case 0:
            CHECK_OK(l3d_comm_iallreduce(c, inplace ? out[i] : in[i], out[i], cnt[i], L3D_INT32,
                                         L3D_SUM, &r[i]));
            break;
        case 1:
            CHECK_OK(l3d_comm_iallgather(c, in[i], out[i], cnt[i], L3D_INT32, &r[i]));
            break;
        case 2:
            CHECK_OK(l3d_comm_ibroadcast(c, in[i], out[i], cnt[i], L3D_INT32, i % n, &r[i]));
            break;
        default:
            CHECK_OK(l3d_comm_ireduce_scatter(c, in[i], out[i], cnt[i], L3D_INT32, L3D_SUM,
                                              &r[i]));
            break;
        }
        if (i == NSMALL / 2) {
            for (int j = 0; j < BIG; j++) big[j] = me + j;
            CHECK_OK(l3d_comm_iallreduce(c, big, bigout, BIG, L3D_INT32, L3D_SUM, &r[NSMALL]));
        }
    }
    CHECK_OK(l3d_request_wait(r[NSMALL]));
    for (int i = NSMALL - 1; i >= 0; i--) CHECK_OK(l3d_request_wait(r[i]));
    for (int j = 0; j < BIG; j++)
        if (bigout[j] != n * j + n * (n - 1) / 2) FAILF("large allreduce [%d] = %d", j, bigout[j]);
    for (int i = 0; i < NSMALL; i++)
        for (size_t j = 0; j < cnt[i]; j++) {
            int32_t want = 0;
            switch (kind_of(i)) {
            case 0:
                for (int p = 0; p < n; p++) want += small_in(i, p, (int)j);
                break;
            case 2:
                want = small_in(i, i % n, (int)j);
                break;
            case 3:
                for (int p = 0; p < n; p++) want += small_in(i, p, me * (int)cnt[i] + (int)j);
                break;
            }
            if (kind_of(i) == 1) {
                for (int p = 0; p < n; p++)
                    if (out[i][(size_t)p * cnt[i] + j] != small_in(i, p, (int)j))
                        FAILF("call %d allgather [%d][%zu] = %d", i, p, j,
                              out[i][(size_t)p * cnt[i] + j]);
            } else if (out[i][j] != want) {
                FAILF("call %d (kind %d) [%zu] = %d want %d", i, kind_of(i), j, out[i][j], want);
            }
        }
    free(big);
    free(bigout);
    return 0;
}

ParameterizedTestParameters(p2p, small_icollectives_ring) { return l3d_world_transport_params(); }
ParameterizedTest(l3d_tp_param_t *p, p2p, small_icollectives_ring, .timeout = 200) {
    run_all(p->name, small_ring_fn, multi_ranks, 5);
}

// ---- argument checks and queries ----------------------------------------------------------------
Test(p2p, queries_and_bad_args) {
    l3d_ctx_t *ctx = NULL;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_comm_t *comms[3];
    cr_assert_eq(l3d_comm_create_local(ctx, 3, comms), L3D_OK);
    cr_assert_eq(l3d_comm_size(comms[1]), 3);
    cr_assert_eq(l3d_comm_rank(comms[2]), 2);
    cr_assert_str_eq(l3d_comm_transport_name(comms[0]), "local");
    cr_assert_eq(l3d_comm_ctx(comms[0]), ctx);
    int x = 0;
    cr_assert_eq(l3d_comm_send(comms[0], &x, 1, L3D_INT32, 3), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_comm_broadcast(comms[0], &x, &x, 1, L3D_INT32, 5), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_comm_allreduce(comms[0], &x, &x, 1, L3D_DTYPE_COUNT, L3D_SUM),
                 L3D_ERR_INVALID_ARG);
    // count 0 completes without peers
    cr_assert_eq(l3d_comm_allreduce(comms[0], &x, &x, 0, L3D_INT32, L3D_SUM), L3D_OK);
    for (int i = 0; i < 3; i++) l3d_comm_destroy(comms[i]);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "comm"), 0, "%zu bytes of comm memory leaked",
                 l3d_ctx_mem_in_use(ctx, "comm"));
    cr_assert_str_eq(l3d_dtype_name(L3D_BFLOAT16), "bfloat16");
    cr_assert_eq(l3d_dtype_size(L3D_INT64), 8);
    cr_assert_str_eq(l3d_redop_name(L3D_AVG), "avg");
    l3d_ctx_destroy(ctx);
}

// create_env without a launch environment is a configuration error, not a hang.
Test(p2p, create_env_without_launcher) {
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("SLURM_PROCID");
    unsetenv("PMI_RANK");
    l3d_ctx_t *ctx = NULL;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_comm_t *c = NULL;
    cr_assert_neq(l3d_comm_create_env(ctx, NULL, &c), L3D_OK);
    cr_assert_null(c);
    l3d_ctx_destroy(ctx);
}

// A single-process "job" may use the local transport; a multi-process one may not.
Test(p2p, create_env_local_refused_for_processes) {
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "1", 1);
    l3d_ctx_t *ctx = NULL;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_comm_t *c = NULL;
    cr_assert_eq(l3d_comm_create_env(ctx, "local", &c), L3D_ERR_UNSUPPORTED,
                 "%s", l3d_ctx_last_error(ctx));
    cr_assert(strstr(l3d_ctx_last_error(ctx), "local"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_comm_create_env(ctx, "nosuch", &c), L3D_ERR_UNSUPPORTED);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "built"), "%s", l3d_ctx_last_error(ctx));
    l3d_ctx_destroy(ctx);
}

// ---- the shared segment of small calls: the world and a split communicator each map one (the
// processes' debug logs say so) and their sums are exact; L3D_COMM_SHM=0 keeps the calls on the
// transport (messages; the local transport's native collectives) with the same sums. Every
// rank checks the sums of an allreduce, a reduce_scatter, an allgather, a broadcast, a reduce
// and a barrier.
static int shm_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    (void)arg;
    l3d_comm_t *half = NULL;
    CHECK_OK(l3d_comm_split(c, l3d_comm_rank(c) % 2, 0, &half));
    l3d_comm_t *cs[2] = {c, half};
    for (int w = 0; w < 2; w++) {
        l3d_comm_t *cc = cs[w];
        int n = l3d_comm_size(cc), me = l3d_comm_rank(cc);
        int32_t x[16 * 4], y[16 * 4];
        for (int i = 0; i < 16 * n; i++) x[i] = val(me, w, i);
        CHECK_OK(l3d_comm_allreduce(cc, x, y, 16, L3D_INT32, L3D_SUM));
        for (int i = 0; i < 16; i++) {
            int32_t want = 0;
            for (int r = 0; r < n; r++) want += val(r, w, i);
            if (y[i] != want) FAILF("comm %d allreduce [%d] = %d, want %d", w, i, y[i], want);
        }
        CHECK_OK(l3d_comm_reduce_scatter(cc, x, y, 16, L3D_INT32, L3D_SUM));
        for (int i = 0; i < 16; i++) {
            int32_t want = 0;
            for (int r = 0; r < n; r++) want += val(r, w, me * 16 + i);
            if (y[i] != want) FAILF("comm %d reduce_scatter [%d] = %d", w, i, y[i]);
        }
        CHECK_OK(l3d_comm_allgather(cc, x, y, 16, L3D_INT32));
        for (int i = 0; i < 16 * n; i++)
            if (y[i] != val(i / 16, w, i % 16)) FAILF("comm %d allgather [%d] = %d", w, i, y[i]);
        int root = n - 1;
        CHECK_OK(l3d_comm_broadcast(cc, x, y, 16, L3D_INT32, root));
        for (int i = 0; i < 16; i++)
            if (y[i] != val(root, w, i)) FAILF("comm %d broadcast [%d] = %d", w, i, y[i]);
        memset(y, 0, sizeof(y));
        CHECK_OK(l3d_comm_reduce(cc, x, y, 16, L3D_INT32, L3D_MAX, 0));
        for (int i = 0; i < 16 && me == 0; i++)
            if (y[i] != val(n - 1, w, i)) FAILF("comm %d reduce [%d] = %d", w, i, y[i]);
        CHECK_OK(l3d_comm_barrier(cc));
    }
    l3d_comm_destroy(half);
    return 0;
}

// The debug lines of a run's rank logs that say a communicator maps a segment.
static int shm_log_lines(const char *dir, int n) {
    int lines = 0;
    for (int r = 0; r < n; r++) {
        char path[256], line[512];
        snprintf(path, sizeof(path), "%s/rank%d.log", dir, r);
        FILE *f = fopen(path, "r");
        cr_assert(f, "no log %s", path);
        while (fgets(line, sizeof(line), f))
            if (strstr(line, "share a") && strstr(line, "segment for small calls")) lines++;
        fclose(f);
        remove(path);
    }
    return lines;
}

ParameterizedTestParameters(p2p, shm_segment) { return l3d_world_transport_params(); }
ParameterizedTest(l3d_tp_param_t *p, p2p, shm_segment, .timeout = 200) {
    int local = !strcmp(p->name, "local");  // thread ranks share one log: sums only
    char dir[] = "/tmp/l3d-shm-test.XXXXXX", file[64];
    cr_assert(mkdtemp(dir));
    snprintf(file, sizeof(file), "%s/rank%%r.log", dir);
    if (!local) {
        setenv("L3D_LOG", "debug", 1);
        setenv("L3D_LOG_SUBSYS", "comm", 1);
        setenv("L3D_LOG_FILE", file, 1);
    }
    for (int on = 1; on >= 0; on--) {
        setenv("L3D_COMM_SHM", on ? "1" : "0", 1);
        for (int n = 2; n <= 4; n++) {
            char err[512] = "";
            cr_assert_eq(l3d_world_run(p->name, n, shm_fn, NULL, 120, err, sizeof(err)), 0,
                         "%s %d ranks, L3D_COMM_SHM=%d: %s", p->name, n, on, err);
            // Per rank: the world, and its half when that has two members or more.
            int want = 0;
            for (int r = 0; r < n && on; r++) want += 1 + ((n + 1 - r % 2) / 2 >= 2);
            if (!local)
                cr_expect_eq(shm_log_lines(dir, n), want, "%s %d ranks, L3D_COMM_SHM=%d",
                             p->name, n, on);
        }
    }
    unsetenv("L3D_LOG");
    unsetenv("L3D_LOG_SUBSYS");
    unsetenv("L3D_LOG_FILE");
    unsetenv("L3D_COMM_SHM");
    rmdir(dir);
}
