// l3d train's ranks: one rank's run (create the trainer, resume, print, step, save), as this
// process or as threads of it. A layout without a launcher runs its ranks as threads over the
// in-process transport, each with its own context and trainer, as tests/test_parallel.c and an
// embedding program do; rank 0 prints what a launched rank 0 prints.
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/train.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

// One rank's run and its outcome.
typedef struct rank_run {
    const l3d_train_job_t *job;
    l3d_comm_t *comm;           // this rank's world (NULL: a single rank)
    int rank;
    l3d_mem_breakdown_t *mems;  // threaded: every rank's memory, printed by rank 0 in order
    int rc;                     // exit code
    l3d_status st;              // the failure's status (L3D_OK when rc is from elsewhere)
    char err[1024];             // the failure's message
} rank_run_t;

// "resumed DIR: step N, saved by dp x tp x pp" from the checkpoint's trainer_state.json, so
// the user sees what the run continues (and from which layout it was resharded).
static void print_resumed(const char *dir, l3d_trainer_t *t, const l3d_train_config_t *cfg) {
    char path[1100], layout[96] = "";
    snprintf(path, sizeof(path), "%s/trainer_state.json", dir);
    json_t *s = json_load_file(path, 0, NULL), *l = s ? json_object_get(s, "layout") : NULL;
    json_t *dp = json_object_get(l, "dp"), *tp = json_object_get(l, "tp"),
           *pp = json_object_get(l, "pp");
    if (json_is_integer(dp) && json_is_integer(tp) && json_is_integer(pp))
        snprintf(layout, sizeof(layout), ", saved by dp %lld x tp %lld x pp %lld",
                 (long long)json_integer_value(dp), (long long)json_integer_value(tp),
                 (long long)json_integer_value(pp));
    json_decref(s);
    snprintf(path, sizeof(path), "%s/shards.json", dir);
    printf("resumed %s: step %d of %d%s%s; running dp %d x tp %d x pp %d\n", dir,
           l3d_trainer_steps_done(t), cfg->steps, layout,
           l3d_path_exists(path) > 0 ? " (sharded)" : "", cfg->dp, cfg->tp, cfg->pp);
    fflush(stdout);
}

static void print_step(const l3d_step_stats_t *s, int steps, int world) {
    char comm[96] = "", eval[48] = "";
    if (!isnan(s->eval_loss)) snprintf(eval, sizeof(eval), " | eval %.4f", s->eval_loss);
    if (world > 1)
        snprintf(comm, sizeof(comm), " | comm MiB tp %.2f dp %.2f pp %.2f",
                 s->comm_bytes[0] / 1048576.0, s->comm_bytes[1] / 1048576.0,
                 s->comm_bytes[2] / 1048576.0);
    printf("step %6d/%d | loss %.4f%s | lr %.3e | grad-norm %.4f | %.0f tok/s | mfu %.1f%%%s\n",
           s->step, steps, s->loss, eval, (double)s->lr, s->grad_norm, s->tokens_per_s,
           100.0 * s->mfu, comm);
    fflush(stdout);
}

static void failed(rank_run_t *r, l3d_ctx_t *ctx, l3d_status st) {
    const char *detail = l3d_ctx_last_error(ctx);
    r->st = st;
    r->rc = l3d_cli_exit_code(st);
    snprintf(r->err, sizeof(r->err), "%s", detail[0] ? detail : l3d_strerror(st));
}

static void run_rank(rank_run_t *r, l3d_ctx_t *ctx) {
    const l3d_train_job_t *job = r->job;
    const l3d_train_config_t *cfg = job->cfg;
    int rank = r->rank;
    l3d_trainer_t *t = NULL;
    l3d_metrics_t *mx = NULL;
    l3d_monitor_t *mon = NULL;
    l3d_status st;
    r->rc = L3D_EXIT_OK;
    if ((st = l3d_trainer_create_parallel(ctx, cfg, r->comm, &t)) < 0) goto fail;
    if (job->resume && (st = l3d_trainer_resume(t, job->resume)) < 0) goto fail;
    l3d_mem_breakdown_t mem;
    l3d_trainer_memory(t, &mem);
    if (job->threaded) {
        // Every rank's memory line once every rank started, in rank order: threads would
        // interleave them with rank 0's summary.
        r->mems[rank] = mem;
        if ((st = l3d_comm_barrier(r->comm)) < 0) goto fail;
        if (rank == 0) {
            l3d_train_print_config(cfg, t, job->nthreads);
            for (int k = 0; k < job->world; k++)
                l3d_train_print_memory(cfg, &r->mems[k], 0, k, job->world);
        }
    } else {
        if (rank == 0) l3d_train_print_config(cfg, t, job->nthreads);
        l3d_train_print_memory(cfg, &mem, 0, rank, job->world);
    }
    if (rank == 0 && job->resume) print_resumed(job->resume, t, cfg);
    if (cfg->metrics_path[0] && rank == 0) {
        int e = l3d_metrics_open(cfg->metrics_path, job->resume != NULL, &mx);
        if (e) {
            snprintf(r->err, sizeof(r->err), "opening %s: %s", cfg->metrics_path, strerror(-e));
            r->rc = L3D_EXIT_FAIL;
            goto out;
        }
    }
    // DeepSpeed's tensorboard and csv_monitor (rank 0 writes; the others get a no-op).
    if ((st = l3d_monitor_create(t, job->resume != NULL, &mon)) < 0) goto fail;
    int print_every = cfg->steps_per_print > 0 ? cfg->steps_per_print : 10, said_roof = 0;
    while (l3d_trainer_steps_done(t) < cfg->steps) {
        l3d_step_stats_t s;
        if ((st = l3d_trainer_step(t, &s)) < 0) goto fail;
        if (mx) l3d_metrics_write(mx, &s);
        l3d_monitor_write_step(mon, &s);
        if (rank == 0 && s.peak_raised && !said_roof) {
            // Once: later raises only move the roof up to the run's new best.
            printf("note: step %d ran at %.1f GFLOP/s per rank, above the MFU roof; the roof is "
                   "now that (set train.peak_flops to choose it)\n", s.step, s.peak_flops / 1e9);
            said_roof = 1;
        }
        if (rank == 0 && (s.step == 1 || s.step % print_every == 0 || s.step == cfg->steps ||
                          !isnan(s.eval_loss)))
            print_step(&s, cfg->steps, job->world);
        if (cfg->save_dir[0] && cfg->save_interval > 0 && s.step % cfg->save_interval == 0 &&
            s.step < cfg->steps && (st = l3d_trainer_save(t, cfg->save_dir)) < 0)
            goto fail;
    }
    if (cfg->save_dir[0]) {
        if ((st = l3d_trainer_save(t, cfg->save_dir)) < 0) goto fail;
        if (rank == 0) printf("saved %s (step %d)\n", cfg->save_dir, l3d_trainer_steps_done(t));
    }
    goto out;
fail:
    failed(r, ctx, st);
out:
    l3d_metrics_close(mx);  // a side channel: a failed write was a warning, not the exit code
    l3d_monitor_destroy(mon);
    l3d_trainer_destroy(t);
    if (r->comm && r->rc != L3D_EXIT_OK) l3d_comm_abort(r->comm);  // the peers fail fast, naming us
}

// ---- this process: a single rank, or one rank of a launched job ---------------------------
int l3d_train_run_process(const l3d_train_job_t *job) {
    l3d_ctx_t *ctx = NULL;
    // Progress on rank 0 only: the other ranks of a job share its terminal.
    l3d_status st = l3d_cli_ctx_create(job->rank == 0, &ctx);
    if (st < 0) return l3d_cli_fail("train", NULL, st);
    rank_run_t r = {.job = job, .rank = job->rank};
    if (job->world > 1 && (st = l3d_comm_create_env(ctx, NULL, &r.comm)) < 0) {
        failed(&r, ctx, st);
    } else {
        run_rank(&r, ctx);
    }
    if (r.rc != L3D_EXIT_OK) fprintf(stderr, "l3d train: %s\n", r.err);
    l3d_comm_destroy(r.comm);
    l3d_ctx_destroy(ctx);
    return r.rc;
}

// ---- threads of this process: a layout without a launcher --------------------------------
static void *rank_thread(void *p) {
    rank_run_t *r = p;
    l3d_ctx_t *ctx = NULL;
    // the environment was checked already; progress from rank 0 only
    l3d_status st = l3d_cli_ctx_create(r->rank == 0, &ctx);
    if (st < 0) {
        r->st = st;
        r->rc = l3d_cli_exit_code(st);
        snprintf(r->err, sizeof(r->err), "%s", l3d_strerror(st));
        l3d_comm_abort(r->comm);
        return NULL;
    }
    l3d_ctx_set_rank(ctx, r->rank);
    run_rank(r, ctx);
    l3d_ctx_destroy(ctx);
    return NULL;
}

// A rank's own failure, not its report of a peer's (those follow an l3d_comm_abort).
static int own_failure(const rank_run_t *r) {
    return r->rc != L3D_EXIT_OK && r->st != L3D_ERR_PEER_FAILED;
}

// Prints each distinct own failure once (without a rank when every rank had it, as a single
// rank would print it), then the first peer's report; returns the lowest failed rank's code.
static int report(const rank_run_t *runs, int n) {
    int rc = L3D_EXIT_OK, own = 0;
    for (int k = 0; k < n; k++) own += own_failure(&runs[k]);
    for (int k = 0; k < n; k++) {
        const rank_run_t *r = &runs[k];
        if (!own_failure(r)) continue;
        if (rc == L3D_EXIT_OK) rc = r->rc;
        int seen = 0;
        for (int j = 0; j < k && !seen; j++) seen = own_failure(&runs[j]) && !strcmp(runs[j].err, r->err);
        if (seen) continue;
        if (own == n) fprintf(stderr, "l3d train: %s\n", r->err);
        else fprintf(stderr, "l3d train: rank %d: %s\n", k, r->err);
    }
    for (int k = 0; k < n; k++) {
        const rank_run_t *r = &runs[k];
        if (r->rc == L3D_EXIT_OK || own_failure(r)) continue;
        if (rc == L3D_EXIT_OK) rc = r->rc;
        fprintf(stderr, "l3d train: rank %d stopped: %s\n", k, r->err);
        break;
    }
    return rc;
}

int l3d_train_run_threads(const l3d_train_job_t *job) {
    int n = job->world, rc = L3D_EXIT_FAIL;
    l3d_ctx_t *wctx = NULL;
    l3d_status st = l3d_ctx_create(NULL, &wctx);
    if (st < 0) return l3d_cli_fail("train", NULL, st);
    l3d_comm_t **comms = calloc((size_t)n, sizeof(*comms));
    rank_run_t *runs = calloc((size_t)n, sizeof(*runs));
    pthread_t *th = calloc((size_t)n, sizeof(*th));
    l3d_mem_breakdown_t *mems = calloc((size_t)n, sizeof(*mems));
    int started = 0;
    if (!comms || !runs || !th || !mems) {
        fprintf(stderr, "l3d train: out of memory for %d ranks\n", n);
        goto out;
    }
    if ((st = l3d_comm_create_local(wctx, n, comms)) < 0) {
        rc = l3d_cli_fail("train", wctx, st);
        goto out;
    }
    for (; started < n; started++) {
        runs[started] = (rank_run_t){.job = job, .comm = comms[started], .rank = started,
                                     .mems = mems};
        int e = pthread_create(&th[started], NULL, rank_thread, &runs[started]);
        if (e) {
            fprintf(stderr, "l3d train: starting rank %d of %d as a thread: %s\n", started, n,
                    strerror(e));
            // The started ranks wait on this one: tell them it will not come.
            for (int k = started; k < n; k++) l3d_comm_abort(comms[k]);
            break;
        }
    }
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    rc = started < n ? L3D_EXIT_FAIL : report(runs, n);
out:
    for (int k = 0; comms && k < n; k++) l3d_comm_destroy(comms[k]);
    free(mems);
    free(th);
    free(runs);
    free(comms);
    l3d_ctx_destroy(wctx);
    return rc;
}
