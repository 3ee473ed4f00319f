// bf16.enabled and fp16.enabled: activations and their gradients stored in bfloat16 / float16
// through every layout (weights, their gradients and the optimizer state stay float32). Layout harness:
// tests/harness/parallel.c.
//
// What is exact, and checked bit for bit: rebuilding a layer from its kept input repeats the
// same ops on the same bfloat16 values, so activation checkpointing (plain, partitioned over
// tp, in host memory) changes no bit of a bfloat16 run, as it changes none of a float32 one.
// What is planned, and checked exactly: the tp and pp traffic of activations halves (the
// counted bytes equal the plan), the activation memory is the estimate and less than float32's.
// What tracks: the bfloat16 run against the float64 trajectory, within the bound derived in
// bf16_tracks_float64 below.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/parallel.h"

static void same_run(const char *what, const result_t *a, const result_t *b, int nranks) {
    for (int s = 0; s < STEPS; s++)
        cr_assert(a->loss[s] == b->loss[s] && a->gnorm[s] == b->gnorm[s],
                  "%s: step %d loss %.17g vs %.17g", what, s, a->loss[s], b->loss[s]);
    for (int r = 0; r < nranks; r++) {
        size_t n = 0;
        for (int i = 0; i < a->nt[r]; i++)
            n = L3D_MAX(n, (size_t)(a->tensors[r][i].offset + a->tensors[r][i].numel));
        cr_assert(!memcmp(a->params[r], b->params[r], n * sizeof(float)),
                  "%s: rank %d weights differ", what, r);
    }
}

Test(parallel_bf16, checkpointing_changes_no_bit, .timeout = 600) {
    make_data();
    g_bf16 = 1;
    static const ckpt_knobs_t part = {1, 0}, cpu = {0, 1};
    const layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0},
                   one_rc = {1, 1, 1, 0, 1, 8, 0, 0.25f, 0, 0},
                   tp2_rc = {1, 2, 1, 0, 1, 8, 0, 0.25f, 0, 0};
    result_t a = {0}, b = {0}, c = {0}, d = {0};
    run_layout(&one, &a);
    run_layout(&one_rc, &b);
    same_run("bf16 (1,1,1) recompute", &a, &b, 1);
    g_ckpt = &cpu;
    run_layout(&one_rc, &c);
    g_ckpt = NULL;
    same_run("bf16 (1,1,1) cpu_checkpointing", &a, &c, 1);
    free_result(&b), free_result(&c);
    run_layout(&tp2_rc, &b);
    g_ckpt = &part;
    run_layout(&tp2_rc, &d);
    g_ckpt = NULL;
    same_run("bf16 tp 2 partition_activations", &b, &d, 2);
    g_bf16 = 0;
    free_result(&a), free_result(&b), free_result(&d);
    result_t e = {0}, f = {0};
    g_fp16 = 12;  // float16 likewise
    run_layout(&one, &e);
    run_layout(&one_rc, &f);
    same_run("fp16 (1,1,1) recompute", &e, &f, 1);
    g_fp16 = 0;
    free_result(&e), free_result(&f);
}

// Traffic and memory as planned, across layouts; activations half of float32's. The cases
// alternate bfloat16 and float16 (the same element size; each through a pipeline layout).
Test(parallel_bf16, layouts_match_plan_and_estimate, .timeout = 900) {
    static const layout_t cases[] = {
        {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 1},  // dp 2 x tp 2 with sequence parallelism, ZeRO-1
        {1, 2, 2, 0, 1, 8, 0, 0.25f, 0, 0},  // tp 2 x pp 2 1F1B, recompute
        {2, 1, 2, 2, 0, 8, 0, 0.25f, 1, 0},  // dp 2 x pp 2 GPipe, ZeRO-2
        {2, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0},  // ZeRO-3
    };
    make_data();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        result_t f32 = {0}, b16 = {0};
        run_layout(&cases[i], &f32);
        int *knob = i % 2 ? &g_fp16 : &g_bf16;
        *knob = i % 2 ? 12 : 1;
        run_layout(&cases[i], &b16);
        *knob = 0;
        for (int g = 0; g < 3; g++)
            cr_assert(b16.last.comm_calls[g] == b16.plan[g].calls &&
                      b16.last.comm_bytes[g] == b16.plan[g].bytes,
                      "case %zu group %d: counted %llu calls %llu bytes, planned %llu %llu", i, g,
                      (unsigned long long)b16.last.comm_calls[g],
                      (unsigned long long)b16.last.comm_bytes[g],
                      (unsigned long long)b16.plan[g].calls, (unsigned long long)b16.plan[g].bytes);
        int tpp = cases[i].tp > 1 || cases[i].pp > 1;
        cr_assert(!tpp || b16.plan[L3D_MESH_TP].bytes + b16.plan[L3D_MESH_PP].bytes <
                              f32.plan[L3D_MESH_TP].bytes + f32.plan[L3D_MESH_PP].bytes,
                  "case %zu: activation traffic did not shrink", i);
        cr_assert_eq(b16.mem[0].acts, b16.estimate.acts, "case %zu: acts %zu, estimated %zu", i,
                     b16.mem[0].acts, b16.estimate.acts);
        cr_assert_lt(b16.mem[0].acts, f32.mem[0].acts, "case %zu", i);
        cr_assert_gt(2 * b16.mem[0].acts, f32.mem[0].acts, "case %zu: the row statistics stay "
                     "float32", i);
        cr_assert_eq(b16.loss[0] == f32.loss[0], 0, "case %zu: the first loss did not move", i);
        for (int k = 0; k < STEPS; k++) cr_assert(isfinite(b16.loss[k]), "case %zu step %d", i, k);
        free_result(&f32), free_result(&b16);
    }
}

// The bound. check_run's argument (tests/harness/parallel.c): a run is the float64 trajectory
// plus rounding errors amplified by the training dynamics, and sigma is the size float32's
// rounding gives. A 16-bit run adds one rounding to each stored activation and activation
// gradient, of at most 2^-8 (bfloat16) or 2^-11 (float16) relative where float32's roundings
// are 2^-24: to first order the trajectory's error scales with the rounding, so a bfloat16 run
// stays within 2^16 sigma of the float64 trajectory and a float16 one within 2^13, with T_BOUND
// (10) on top as for every layout; checked on the loss over all steps. Measured: bfloat16 about
// 1200-1500 sigma (3e-4), float16 200-700 (5e-5 to 1.8e-4; loss scales 2^4 to 2^20 alike),
// one rank and dp 2 x tp 2 with SP. A wrong element size or offset anywhere gives a loss off
// by O(1) or NaN, far outside.
// float16 runs under a static loss scale of 2^12 (fp16.loss_scale): every gradient this small
// model makes stays inside float16's normal range with it (no overflow: each loss is finite
// and every step applies; 2^-14 smallest normal), so only rounding is measured.
static void tracks_float64(const char *kind, int *knob, int value, double ratio) {
    reference();
    *knob = value;
    const layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0},
                   tp2 = {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 1};
    const layout_t *ls[2] = {&one, &tp2};
    for (int i = 0; i < 2; i++) {
        result_t got = {0};
        run_layout(ls[i], &got);
        double scale = ratio * 10;  // the rounding's ratio to float32's, T_BOUND 10
        double dl = 0;
        for (int s = 0; s < STEPS; s++) dl = fmax(dl, fabs(got.loss[s] - g_ref.loss64[s]));
        cr_assert(dl <= scale * g_ref.sigma[2], "layout %d: %s loss error %.3g, bound %.3g", i,
                  kind, dl, scale * g_ref.sigma[2]);
        cr_log_info("layout %d: %s loss error %.3g = %.0f sigma (float32 sigma %.3g)", i, kind,
                    dl, dl / g_ref.sigma[2], g_ref.sigma[2]);
        cr_assert(got.loss[STEPS - 1] < got.loss[0] - 0.1, "layout %d: the %s run does not learn",
                  i, kind);
        free_result(&got);
    }
    *knob = 0;
}

Test(parallel_bf16, bf16_tracks_float64, .timeout = 600) {
    tracks_float64("bf16", &g_bf16, 1, 65536.0);  // 2^-8 / 2^-24
}

Test(parallel_bf16, fp16_tracks_float64, .timeout = 600) {
    tracks_float64("fp16", &g_fp16, 12, 8192.0);  // 2^-11 / 2^-24
}
