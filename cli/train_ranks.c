// l3d train's ranks: one rank's run (create the trainer, resume, print, step, save), as this
// process or as threads of it. A layout without a launcher runs its ranks as threads over the
// in-process transport, each with its own context and trainer, as tests/test_parallel.c and an
// embedding program do; rank 0 prints what a launched rank 0 prints.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/ranks.h"
#include "cli/train.h"
#include "core/input.h"
#include "core/l3d_core.h"
#include "platform/platform.h"


// "resumed DIR: step N, saved by dp x tp x pp" from the checkpoint's trainer_state.json, so
// the user sees what the run continues (and from which layout it was resharded).
// Resuming has read and checked the file; should it have changed since, only the layout note
// is lost.
static void print_resumed(l3d_ctx_t *ctx, const char *dir, l3d_trainer_t *t,
                          const l3d_train_config_t *cfg) {
    char path[1100], layout[96] = "";
    snprintf(path, sizeof(path), "%s/trainer_state.json", dir);
    json_t *s = NULL;
    if (l3d_input_json(ctx, path, NULL, 0, &s) < 0) s = NULL;
    json_t *l = json_object_get(s, "layout");
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

static void print_step(const l3d_step_stats_t *s, int steps, int world, int fp16) {
    char comm[96] = "", eval[48] = "", scale[80] = "";
    if (!isnan(s->eval_loss)) snprintf(eval, sizeof(eval), " | eval %.4f", s->eval_loss);
    // fp16: the scale this step ran with, and the overflow skips (DeepSpeed's "OVERFLOW!").
    if (fp16)
        snprintf(scale, sizeof(scale), " | loss-scale %g%s | skipped %lld", s->loss_scale,
                 s->skipped ? " OVERFLOW, skipped" : "", s->skipped_total);
    if (world > 1)
        snprintf(comm, sizeof(comm), " | comm MiB tp %.2f dp %.2f pp %.2f",
                 s->comm_bytes[0] / 1048576.0, s->comm_bytes[1] / 1048576.0,
                 s->comm_bytes[2] / 1048576.0);
    printf("step %6d/%d | loss %.4f%s | lr %.3e | grad-norm %.4f%s | %.0f tok/s | mfu %.1f%%%s\n",
           s->step, steps, s->loss, eval, (double)s->lr, s->grad_norm, scale, s->tokens_per_s,
           100.0 * s->mfu, comm);
    fflush(stdout);
}

// n with a comma every three digits ("102,400"): a token count read at a glance.
static void group_digits(long long n, char *buf, size_t cap) {
    char d[32];
    int len = snprintf(d, sizeof(d), "%lld", n < 0 ? 0 : n), o = 0;
    for (int k = 0; k < len && o + 2 < (int)cap; k++) {
        if (k > 0 && (len - k) % 3 == 0) buf[o++] = ',';
        buf[o++] = d[k];
    }
    buf[o] = 0;
}

// What the run did, for the summary line it ends on.
typedef struct run_summary {
    int from, to;              // steps done before this run (a resumed one) and after it
    double first, last, eval;  // losses: this run's first and last step, its last evaluation
} run_summary_t;

// The run's last line (rank 0, once every rank has finished and saved): steps and tokens
// trained, the wall time since l3d train started, where the loss went, and where the
// results are. The parts that do not apply are left out.
static void print_summary(const l3d_train_job_t *job, const run_summary_t *s) {
    const l3d_train_config_t *cfg = job->cfg;
    int n = s->to - s->from;
    char tokens[40], resumed[48] = "";
    group_digits((long long)n * cfg->train_batch_size * cfg->seq_len, tokens, sizeof(tokens));
    if (s->from > 0) snprintf(resumed, sizeof(resumed), " (resumed at %d)", s->from);
    printf("done: %d step%s%s, %s tokens in %.1f s", n, n == 1 ? "" : "s", resumed, tokens,
           l3d_time_now() - job->t0);
    if (n > 0) printf(" | train loss %.4f -> %.4f", s->first, s->last);
    if (!isnan(s->eval)) printf(" | eval loss %.4f", s->eval);
    if (cfg->metrics_path[0]) printf(" | metrics: %s", cfg->metrics_path);
    if (cfg->tensorboard) printf(" | tensorboard: %s", cfg->tensorboard_dir);
    if (cfg->csv_monitor) printf(" | csv: %s", cfg->csv_monitor_dir);
    if (cfg->save_dir[0]) printf(" | checkpoint: %s", cfg->save_dir);
    printf("\n");
    fflush(stdout);
}

static void run_rank(l3d_cli_rank_t *r, l3d_ctx_t *ctx) {
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
        job->mems[rank] = mem;
        if ((st = l3d_comm_barrier(r->comm)) < 0) goto fail;
        if (rank == 0) {
            l3d_train_print_config(cfg, t, job->nthreads);
            for (int k = 0; k < job->world; k++)
                l3d_train_print_memory(cfg, &job->mems[k], 0, k, job->world);
        }
    } else {
        if (rank == 0) l3d_train_print_config(cfg, t, job->nthreads);
        l3d_train_print_memory(cfg, &mem, 0, rank, job->world);
    }
    if (rank == 0 && job->resume) print_resumed(ctx, job->resume, t, cfg);
    // --steps counts the resumed steps too, so one at or below the checkpoint's trains nothing.
    // As HF Trainer's max_steps, that is no error (rerunning a finished job is a no-op, and a
    // resume with --save reshards a checkpoint), but it is said, not left to an empty log.
    if (rank == 0 && job->resume && l3d_trainer_steps_done(t) >= cfg->steps) {
        fprintf(stderr, "l3d train: checkpoint %s is at step %d and steps is %d (--steps or "
                "train.steps, counting the resumed ones): nothing to train\n", job->resume,
                l3d_trainer_steps_done(t), cfg->steps);
        fflush(stderr);
    }
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
    run_summary_t sum = {.from = l3d_trainer_steps_done(t), .eval = NAN};
    while (l3d_trainer_steps_done(t) < cfg->steps) {
        l3d_step_stats_t s;
        if ((st = l3d_trainer_step(t, &s)) < 0) goto fail;
        if (l3d_trainer_steps_done(t) == sum.from + 1) sum.first = s.loss;
        sum.last = s.loss;
        if (!isnan(s.eval_loss)) sum.eval = s.eval_loss;
        if (mx) l3d_metrics_write(mx, &s);
        l3d_monitor_write_step(mon, &s);
        if (rank == 0 && s.peak_raised && !said_roof) {
            // Once: later raises only move the roof up to the run's new best.
            printf("note: step %d ran at %.1f GFLOP/s per rank, above the MFU roof; the roof is "
                   "now that (set train.peak_flops to choose it)\n", s.step, s.peak_flops / 1e9);
            said_roof = 1;
        }
        // Overflow skips always print (DeepSpeed logs each one).
        if (rank == 0 && (s.step == 1 || s.step % print_every == 0 || s.step == cfg->steps ||
                          !isnan(s.eval_loss) || s.skipped))
            print_step(&s, cfg->steps, job->world, cfg->fp16);
        if (cfg->save_dir[0] && cfg->save_interval > 0 && s.step % cfg->save_interval == 0 &&
            s.step < cfg->steps && (st = l3d_trainer_save(t, cfg->save_dir)) < 0)
            goto fail;
    }
    if (cfg->save_dir[0]) {
        if ((st = l3d_trainer_save(t, cfg->save_dir)) < 0) goto fail;
        if (rank == 0) printf("saved %s (step %d)\n", cfg->save_dir, l3d_trainer_steps_done(t));
    }
    // Every rank trained and saved before rank 0 says the run is done: a rank that failed
    // aborted the world, so the barrier fails and no summary claims a finished run.
    if (r->comm && (st = l3d_comm_barrier(r->comm)) < 0) goto fail;
    // The metrics files are whole (the SVG drawn, a failed write warned about) before the
    // line that names them.
    l3d_metrics_close(mx);
    l3d_monitor_destroy(mon);
    mx = NULL;
    mon = NULL;
    sum.to = l3d_trainer_steps_done(t);
    if (rank == 0) print_summary(job, &sum);
    goto out;
fail:
    l3d_cli_rank_failed(r, ctx, st);
out:
    l3d_metrics_close(mx);  // a side channel: a failed write was a warning, not the exit code
    l3d_monitor_destroy(mon);
    l3d_trainer_destroy(t);
}

int l3d_train_run_process(const l3d_train_job_t *job) {
    return l3d_cli_run_process("train", (void *)job, job->rank, job->world, run_rank);
}

int l3d_train_run_threads(const l3d_train_job_t *job) {
    l3d_train_job_t j = *job;
    j.mems = calloc((size_t)job->world, sizeof(*j.mems));
    if (!j.mems) {
        fprintf(stderr, "l3d train: out of memory for %d ranks\n", job->world);
        return L3D_EXIT_FAIL;
    }
    int rc = l3d_cli_run_threads("train", &j, job->world, run_rank);
    free(j.mems);
    return rc;
}
