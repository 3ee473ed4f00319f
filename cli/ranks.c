// Running a command's ranks as this process or as threads of it (cli/ranks.h).
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli/ranks.h"
#include "core/comm/bootstrap.h"
#include "core/comm/mesh.h"
#include "core/l3d_core.h"

void l3d_cli_rank_failed(l3d_cli_rank_t *r, l3d_ctx_t *ctx, l3d_status st) {
    const char *detail = ctx ? l3d_ctx_last_error(ctx) : "";
    char why[256];
    // A peer's failure whose words stayed on the communicator's context (a path that did
    // not carry them over): the world's record of it names the rank.
    if (!detail[0] && st == L3D_ERR_PEER_FAILED && l3d_comm_failure(r->comm, why, sizeof(why)))
        detail = why;
    r->st = st;
    r->rc = l3d_cli_exit_code(st);
    snprintf(r->err, sizeof(r->err), "%s", detail[0] ? detail : l3d_strerror(st));
}

static void run(l3d_cli_rank_t *r, l3d_ctx_t *ctx, l3d_cli_rank_fn fn) {
    r->rc = L3D_EXIT_OK;
    fn(r, ctx);
    if (r->comm && r->rc != L3D_EXIT_OK) l3d_comm_abort(r->comm);  // peers fail fast, naming us
}

int l3d_cli_run_process(const char *cmd, void *job, int rank, int world, l3d_cli_rank_fn fn) {
    l3d_ctx_t *ctx = NULL;
    // Progress on rank 0 only: the other ranks of a job share its terminal.
    l3d_status st = l3d_cli_ctx_create(rank == 0, &ctx);
    if (st < 0) return l3d_cli_fail(cmd, NULL, st);
    l3d_cli_rank_t r = {.cmd = cmd, .job = job, .rank = rank, .world = world};
    if (world > 1 && (st = l3d_comm_create_env(ctx, NULL, &r.comm)) < 0)
        l3d_cli_rank_failed(&r, ctx, st);
    else
        run(&r, ctx, fn);
    if (r.rc != L3D_EXIT_OK) fprintf(stderr, "l3d %s: %s\n", cmd, r.err);
    l3d_comm_destroy(r.comm);
    l3d_ctx_destroy(ctx);
    return r.rc;
}

typedef struct thread_arg {
    l3d_cli_rank_t *r;
    l3d_cli_rank_fn fn;
} thread_arg_t;

static void *rank_thread(void *p) {
    thread_arg_t *a = p;
    l3d_cli_rank_t *r = a->r;
    l3d_ctx_t *ctx = NULL;
    // the environment was checked already; progress from rank 0 only
    l3d_status st = l3d_cli_ctx_create(r->rank == 0, &ctx);
    if (st < 0) {
        l3d_cli_rank_failed(r, NULL, st);
        l3d_comm_abort(r->comm);
        return NULL;
    }
    l3d_ctx_set_rank(ctx, r->rank);
    run(r, ctx, a->fn);
    l3d_ctx_destroy(ctx);
    return NULL;
}

// A rank's own failure, not its report of a peer's (those follow an l3d_comm_abort).
static int own_failure(const l3d_cli_rank_t *r) {
    return r->rc != L3D_EXIT_OK && r->st != L3D_ERR_PEER_FAILED;
}

static int report(const char *cmd, const l3d_cli_rank_t *runs, int n) {
    int rc = L3D_EXIT_OK, own = 0;
    for (int k = 0; k < n; k++) own += own_failure(&runs[k]);
    for (int k = 0; k < n; k++) {
        const l3d_cli_rank_t *r = &runs[k];
        if (!own_failure(r)) continue;
        if (rc == L3D_EXIT_OK) rc = r->rc;
        int seen = 0;
        for (int j = 0; j < k && !seen; j++) seen = own_failure(&runs[j]) && !strcmp(runs[j].err, r->err);
        if (seen) continue;
        if (own == n) fprintf(stderr, "l3d %s: %s\n", cmd, r->err);
        else fprintf(stderr, "l3d %s: rank %d: %s\n", cmd, k, r->err);
    }
    for (int k = 0; k < n; k++) {
        const l3d_cli_rank_t *r = &runs[k];
        if (r->rc == L3D_EXIT_OK || own_failure(r)) continue;
        if (rc == L3D_EXIT_OK) rc = r->rc;
        fprintf(stderr, "l3d %s: rank %d stopped: %s\n", cmd, k, r->err);
        break;
    }
    return rc;
}

int l3d_cli_run_threads(const char *cmd, void *job, int n, l3d_cli_rank_fn fn) {
    int rc = L3D_EXIT_FAIL;
    l3d_ctx_t *wctx = NULL;
    l3d_status st = l3d_ctx_create(NULL, &wctx);
    if (st < 0) return l3d_cli_fail(cmd, NULL, st);
    l3d_comm_t **comms = calloc((size_t)n, sizeof(*comms));
    l3d_cli_rank_t *runs = calloc((size_t)n, sizeof(*runs));
    thread_arg_t *args = calloc((size_t)n, sizeof(*args));
    pthread_t *th = calloc((size_t)n, sizeof(*th));
    int started = 0;
    if (!comms || !runs || !args || !th) {
        fprintf(stderr, "l3d %s: out of memory for %d ranks\n", cmd, n);
        goto out;
    }
    if ((st = l3d_comm_create_local(wctx, n, comms)) < 0) {
        rc = l3d_cli_fail(cmd, wctx, st);
        goto out;
    }
    for (; started < n; started++) {
        runs[started] = (l3d_cli_rank_t){.cmd = cmd, .job = job, .comm = comms[started],
                                         .rank = started, .world = n, .threaded = 1};
        args[started] = (thread_arg_t){&runs[started], fn};
        int e = pthread_create(&th[started], NULL, rank_thread, &args[started]);
        if (e) {
            fprintf(stderr, "l3d %s: starting rank %d of %d as a thread: %s\n", cmd, started, n,
                    strerror(e));
            // The started ranks wait on this one: tell them it will not come.
            for (int k = started; k < n; k++) l3d_comm_abort(comms[k]);
            break;
        }
    }
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    rc = started < n ? L3D_EXIT_FAIL : report(cmd, runs, n);
out:
    for (int k = 0; comms && k < n; k++) l3d_comm_destroy(comms[k]);
    free(th);
    free(args);
    free(runs);
    free(comms);
    l3d_ctx_destroy(wctx);
    return rc;
}

int l3d_cli_launched_layout(const char *cmd, int tp, int pp, int *rank, int *world, int *local) {
    l3d_ctx_t *ctx = NULL;
    l3d_launch_env_t env = {0};
    l3d_status st = l3d_cli_ctx_create(0, &ctx);
    if (st >= 0) st = l3d_launch_env_read(ctx, &env);
    if (st >= 0) st = l3d_mesh_check_world(ctx, 1, tp, pp, env.size);
    int rc = st < 0 ? l3d_cli_fail(cmd, ctx, st) : 0;
    l3d_ctx_destroy(ctx);
    *rank = env.rank;
    *world = env.size;
    *local = env.local_size > 0 ? env.local_size : 1;
    return rc;
}
