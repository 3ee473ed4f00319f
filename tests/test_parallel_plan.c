// l3d plan's figures for layouts this machine can run: the bytes per group and the memory per
// GPU the planner reports for a layout equal what a bfloat16 trainer of that layout counts
// (l3d_comm_get_stats, rank 0's last step) and allocates (l3d_trainer_memory, rank 0), for
// layouts over every group and ZeRO stage. Layout harness: tests/harness/parallel.c.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "llama3d/plan.h"
#include "tests/harness/parallel.h"

static void plan_equals_run(layout_t L, int v) {
    l3d_ctx_t *ctx = NULL;
    cr_assert(l3d_ctx_create(NULL, &ctx) == L3D_OK);
    L.bucket = 5e8;  // the trainer's default, which the planner's configurations keep
    L.gpipe = v > 1 ? v : 0;
    l3d_train_config_t *cfg = calloc(1, sizeof(*cfg));
    cr_assert(cfg);
    config(ctx, &L, cfg);
    l3d_plan_request_t req;
    l3d_plan_request_default(&req);
    req.model = cfg->model;
    req.gpus = L.dp * L.tp * L.pp;
    req.seq_len = cfg->seq_len;
    req.global_batch = cfg->train_batch_size;
    l3d_plan_layout_t lay = {L.dp, L.tp, L.pp, 1, 1, v, cfg->micro_batch_size, L.zero,
                             L.recompute ? L3D_RECOMPUTE_FULL : L3D_RECOMPUTE_NONE, L.sp, 0};
    l3d_plan_result_t pr;
    l3d_status st = l3d_plan_evaluate(ctx, &req, &lay, &pr);
    cr_assert(st == L3D_OK, "evaluate: %s", l3d_ctx_last_error(ctx));

    result_t res;
    memset(&res, 0, sizeof(res));
    run_layout(&L, &res);
    cr_assert(!res.err[0], "run: %s", res.err);
    char name[160];
    snprintf(name, sizeof(name), "dp %d tp %d pp %d v %d zero %d rc %d sp %d", L.dp, L.tp, L.pp,
             v, L.zero, L.recompute, L.sp);
    // groups: the planner's tp, dp, pp are the step stats' [0] tp, [1] dp, [2] pp
    for (int g = 0; g < 3; g++)
        cr_assert(pr.comm_bytes[g] == res.last.comm_bytes[g] &&
                      pr.comm_calls[g] == res.last.comm_calls[g],
                  "%s: group %d planned %llu bytes in %llu calls, counted %llu in %llu", name, g,
                  (unsigned long long)pr.comm_bytes[g], (unsigned long long)pr.comm_calls[g],
                  (unsigned long long)res.last.comm_bytes[g],
                  (unsigned long long)res.last.comm_calls[g]);
    const l3d_mem_breakdown_t *m = &res.mem[0];
    double got = (double)(m->params + m->grads + m->optim + m->acts);
    cr_assert(pr.mem_bytes == got, "%s: planned %.0f bytes per GPU, rank 0 allocated %.0f", name,
              pr.mem_bytes, got);
    cr_assert(pr.step_time_s > 0 && pr.mfu > 0, "%s: no step time", name);
    free_result(&res);
    free(cfg);
    l3d_ctx_destroy(ctx);
}

TestSuite(parallel_plan, .timeout = 600);

// One run per layout (no float64 reference: only the counts and the memory are compared).
Test(parallel_plan, bytes_and_memory_equal_the_run) {
    make_data();
    g_bf16 = 1;
    // dp, tp, pp, zero, recompute, accum_total, bucket, clip, gpipe, sp
    plan_equals_run((layout_t){2, 2, 2, 1, 0, 4, 0, 0, 0, 1}, 1);
    plan_equals_run((layout_t){1, 2, 2, 0, 1, 4, 0, 0, 0, 0}, 1);
    plan_equals_run((layout_t){4, 1, 1, 2, 0, 4, 0, 0, 0, 0}, 1);
    // ZeRO-3 with DeepSpeed's defaults, as the planner's configurations have them
    static const z3_knobs_t ds = {1e5, 5e7, 1e9, 0};
    g_z3 = &ds;
    plan_equals_run((layout_t){2, 2, 1, 3, 1, 2, 0, 0, 0, 1}, 1);
    g_z3 = NULL;
    g_layers = 4;
    plan_equals_run((layout_t){1, 1, 2, 0, 0, 4, 0, 0, 0, 0}, 2);
    g_layers = 0;
}
