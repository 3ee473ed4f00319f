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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/parallel.h"

static void same_weights(const char *what, const result_t *a, const result_t *b, int nranks) {
    for (int r = 0; r < nranks; r++) {
        size_t n = 0;
        for (int i = 0; i < a->nt[r]; i++)
            n = L3D_MAX(n, (size_t)(a->tensors[r][i].offset + a->tensors[r][i].numel));
        cr_assert(!memcmp(a->params[r], b->params[r], n * sizeof(float)),
                  "%s: rank %d weights differ", what, r);
    }
}

static void same_run(const char *what, const result_t *a, const result_t *b, int nranks) {
    for (int s = 0; s < STEPS; s++)
        cr_assert(a->loss[s] == b->loss[s] && a->gnorm[s] == b->gnorm[s],
                  "%s: step %d loss %.17g vs %.17g", what, s, a->loss[s], b->loss[s]);
    same_weights(what, a, b, nranks);
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

// ZeRO-1/2 under 16-bit weights keep 1/dp of the float32 master and gather their pieces
// rounded (core/train/trainer_master.c): the weights the passes read are the whole updated
// master rounded, as at ZeRO-0, so with the gradients reduced alike (float32: two addends,
// one order; one micro-batch a rank) every loss and weight is ZeRO-0's bit for bit, offloaded
// or not, bf16 and fp16.
// (Without clipping: the sharded gradient norm sums its squares in another order, so it is
// equal only to float64 rounding, 1e-12 relative for these few thousand terms, and a clip
// factor taken from it could differ in its last bit.)
static const off_knobs_t k_optim = {1, 0};

Test(parallel_bf16, sharded_master_changes_no_bit, .timeout = 600) {
    make_data();
    g_comm_dtype = L3D_FLOAT32;
    // one micro-batch a rank: ZeRO-2 reduces each micro-batch's gradient, ZeRO-0 the step's sum
    const layout_t z0 = {2, 1, 1, 0, 0, 2, 0, 0, 0, 0}, z1 = {2, 1, 1, 1, 0, 2, 0, 0, 0, 0},
                   z2 = {2, 1, 1, 2, 0, 2, 3000, 0, 0, 0};
    for (int fp16 = 0; fp16 < 2; fp16++) {
        *(fp16 ? &g_fp16 : &g_bf16) = fp16 ? 12 : 1;
        result_t a = {0}, b = {0};
        run_layout(&z0, &a);
        const layout_t *ls[2] = {&z1, &z2};
        for (int i = 0; i < 4; i++) {
            g_off = i >= 2 ? &k_optim : NULL;
            run_layout(ls[i % 2], &b);
            char what[64];
            snprintf(what, sizeof(what), "%s ZeRO-%d%s", fp16 ? "fp16" : "bf16", ls[i % 2]->zero,
                     i >= 2 ? " offloaded" : "");
            for (int st = 0; st < STEPS; st++)
                cr_assert(a.loss[st] == b.loss[st] &&
                              fabs(a.gnorm[st] - b.gnorm[st]) <= 1e-12 * a.gnorm[st],
                          "%s: step %d loss %.17g vs %.17g, norm %.17g vs %.17g", what, st,
                          a.loss[st], b.loss[st], a.gnorm[st], b.gnorm[st]);
            same_weights(what, &a, &b, 2);
            // 2 bytes a parameter and 4 a shard float (the optimizer's shard: 8 bytes a float)
            size_t P = a.mem[0].params / 6, shard = (b.mem[0].optim + b.mem[0].host_optim) / 8;
            cr_assert_eq(b.mem[0].params, 2 * P + (i >= 2 ? 0 : 4 * shard), "%s", what);
            free_result(&b);
        }
        g_off = NULL;
        g_bf16 = g_fp16 = 0;
        free_result(&a);
    }
    // ZeRO-3 with the optimizer offloaded keeps its float32 shard on the host only (the master)
    // and the rounded copy on the device: the same steps as without offload
    const layout_t z3 = {2, 1, 1, 3, 0, 2, 0, 0, 0, 0};
    for (int fp16 = 0; fp16 < 2; fp16++) {
        *(fp16 ? &g_fp16 : &g_bf16) = fp16 ? 12 : 1;
        result_t a = {0}, b = {0};
        run_layout(&z3, &a);
        g_off = &k_optim;
        run_layout(&z3, &b);
        g_off = NULL;
        const char *what = fp16 ? "fp16 ZeRO-3 offloaded" : "bf16 ZeRO-3 offloaded";
        same_run(what, &a, &b, 2);
        // the device keeps the float32 shard's rounded copy (2 bytes a shard float), not it
        size_t shard = b.mem[0].host_optim / 8;
        cr_assert_eq(a.mem[0].params - b.mem[0].params, 4 * shard, "%s", what);
        cr_assert_eq(b.mem[0].host_params, 6 * shard, "%s", what);
        g_bf16 = g_fp16 = 0;
        free_result(&a), free_result(&b);
    }
    g_comm_dtype = -1;
}

// 16-bit training through the layouts: traffic and memory exactly as planned (activations and
// the tp/pp traffic of activations half of float32's; the 16-bit weight copies and ZeRO-3's
// 16-bit pool, persistent groups and gathers counted in their dtype; every allocation as
// reported), and the loss on the float64 trajectory within the 16-bit bound (tracks_bound
// below). The cases alternate bfloat16 and float16 (the same element size; each through a
// pipeline layout and ZeRO-3).
static const z3_knobs_t k_persist = {5000, 0, 0, 0};  // the norms stay whole (< 5000 elements)
static const off_knobs_t k_offload = {1, 1};

Test(parallel_bf16, layouts_match_plan_and_estimate, .timeout = 900) {
    static const layout_t cases[] = {
        {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 1},  // dp 2 x tp 2 with sequence parallelism, ZeRO-1
        {1, 2, 2, 0, 1, 8, 0, 0.25f, 0, 0},  // tp 2 x pp 2 1F1B, recompute
        {2, 1, 2, 2, 0, 8, 0, 0.25f, 1, 0},  // dp 2 x pp 2 GPipe, ZeRO-2
        {2, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0},  // ZeRO-3
        {2, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0},  // ZeRO-3, persistent norms, optimizer and
                                             // parameters offloaded
        {2, 1, 2, 3, 0, 8, 0, 0.25f, 0, 0},  // ZeRO-3 x pp 2 (bfloat16: the ZeRO-3 cases alternate)
    };
    reference();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        result_t f32 = {0}, b16 = {0};
        int fp16 = i % 2 == 1;
        if (i == 4) g_z3 = &k_persist, g_off = &k_offload;
        run_layout(&cases[i], &f32);
        int *knob = fp16 ? &g_fp16 : &g_bf16;
        *knob = fp16 ? 12 : 1;
        run_layout(&cases[i], &b16);
        *knob = 0;
        g_z3 = NULL, g_off = NULL;
        char name[64];
        snprintf(name, sizeof(name), "case %zu (%s)", i, fp16 ? "fp16" : "bf16");
        check_plan_memory(name, &b16);
        for (int r = 0; r < b16.nranks; r++) {
            size_t rope = f32.params_in_use[r] - f32.mem[r].params;  // the tables, float32
            cr_assert_eq(b16.params_in_use[r] - rope, b16.mem[r].params, "%s rank %d: params "
                         "%zu in use, %zu reported", name, r, b16.params_in_use[r] - rope,
                         b16.mem[r].params);
            cr_assert_eq(b16.host_in_use[r][0], b16.mem[r].host_params, "%s rank %d", name, r);
            cr_assert_eq(b16.grads_in_use[r], b16.mem[r].grads, "%s rank %d", name, r);
        }
        // below ZeRO-3 a 2-byte copy beside each float32 master: 6 bytes a parameter; under
        // ZeRO-1/2 (dp > 1) the master is this rank's shard, as exp_avg is: 2 bytes a
        // parameter + 4 a shard float (float32 keeps its 4 bytes a parameter)
        size_t P = f32.mem[0].params / 4, shard = b16.mem[0].optim / 8;
        int master16 = cases[i].dp > 1 && (cases[i].zero == 1 || cases[i].zero == 2);
        cr_assert(cases[i].zero == 3 || b16.mem[0].params == (master16 ? 2 * P + 4 * shard
                                                                        : 6 * P),
                  "%s: params %zu, float32 %zu", name, b16.mem[0].params, f32.mem[0].params);
        cr_assert(!master16 || b16.mem[0].params < f32.mem[0].params + f32.mem[0].params / 8,
                  "%s: params %zu, float32 %zu", name, b16.mem[0].params, f32.mem[0].params);
        int tpp = cases[i].tp > 1 || cases[i].pp > 1;
        cr_assert(!tpp || b16.plan[L3D_MESH_TP].bytes + b16.plan[L3D_MESH_PP].bytes <
                              f32.plan[L3D_MESH_TP].bytes + f32.plan[L3D_MESH_PP].bytes,
                  "%s: activation traffic did not shrink", name);
        cr_assert(cases[i].zero != 3 || b16.plan[L3D_MESH_DP].bytes < f32.plan[L3D_MESH_DP].bytes,
                  "%s: ZeRO-3's gathers did not shrink", name);
        cr_assert_lt(b16.mem[0].acts, f32.mem[0].acts, "%s", name);
        cr_assert_gt(2 * b16.mem[0].acts, f32.mem[0].acts, "%s: the row statistics stay "
                     "float32", name);
        double dl = 0, bound = tracks_bound(fp16) * g_ref.sigma[2];
        for (int s = 0; s < STEPS; s++) dl = fmax(dl, fabs(b16.loss[s] - g_ref.loss64[s]));
        cr_assert(dl <= bound, "%s: loss error %.3g, bound %.3g", name, dl, bound);
        cr_log_info("%s: loss error %.0f sigma", name, dl / g_ref.sigma[2]);
        free_result(&f32), free_result(&b16);
    }
}

// The bound: tracks_bound (tests/harness/parallel.c).

static void tracks_float64(const char *kind, int *knob, int value) {
    reference();
    *knob = value;
    const layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0},
                   tp2 = {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 1};
    const layout_t *ls[2] = {&one, &tp2};
    for (int i = 0; i < 2; i++) {
        result_t got = {0};
        run_layout(ls[i], &got);
        double bound = tracks_bound(knob == &g_fp16) * g_ref.sigma[2], dl = 0;
        for (int s = 0; s < STEPS; s++) dl = fmax(dl, fabs(got.loss[s] - g_ref.loss64[s]));
        cr_assert(dl <= bound, "layout %d: %s loss error %.3g, bound %.3g", i, kind, dl, bound);
        cr_log_info("layout %d: %s loss error %.3g = %.0f sigma (float32 sigma %.3g)", i, kind,
                    dl, dl / g_ref.sigma[2], g_ref.sigma[2]);
        cr_assert(got.loss[STEPS - 1] < got.loss[0] - 0.1, "layout %d: the %s run does not learn",
                  i, kind);
        free_result(&got);
    }
    *knob = 0;
}

Test(parallel_bf16, bf16_tracks_float64, .timeout = 600) {
    tracks_float64("bf16", &g_bf16, 1);
}

Test(parallel_bf16, fp16_tracks_float64, .timeout = 600) {
    tracks_float64("fp16", &g_fp16, 12);
}

// A checkpoint of a 16-bit run holds the float32 masters: resuming it (same layout) continues
// the uninterrupted run bit for bit, the 16-bit copies rounded from the same masters. ZeRO-3
// gathers its float32 pieces for the save (not the 16-bit pool) and partitions them again;
// with stage3_gather_16bit_weights_on_model_save its one directory holds the weights in
// bfloat16 (DeepSpeed's 16-bit model save) and the masters in master.safetensors beside them.
Test(parallel_bf16, resume_continues_exactly, .timeout = 600) {
    make_data();
    static const z3_knobs_t gather16 = {0, 0, 0, 1};
    const layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0},
                   z3 = {2, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0},
                   z1 = {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 0};
    const layout_t *ls[4] = {&one, &z3, &z1, &z3};
    for (int i = 0; i < 4; i++) {
        char dir[] = "/tmp/l3d_test_bf16_ckpt_XXXXXX", ck[64], cmd[512];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(ck, sizeof(ck), "%s/ck", dir);
        result_t full = {0}, half = {0}, rest = {0};
        g_bf16 = 1;
        g_z3 = i == 3 ? &gather16 : NULL;
        run_layout(ls[i], &full);
        run_layout_ckpt(ls[i], &half, ck, NULL);
        if (i == 3) {  // one directory, bfloat16 weights, float32 masters beside them
            snprintf(cmd, sizeof(cmd), "test -f %s/model.safetensors -a -f %s/master.safetensors"
                     " && grep -aq '\"BF16\"' %s/model.safetensors && ! grep -aq '\"F32\"' "
                     "%s/model.safetensors && grep -aq '\"F32\"' %s/master.safetensors",
                     ck, ck, ck, ck, ck);
            cr_assert_eq(system(cmd), 0, "the 16-bit save: %s", cmd);
        }
        run_layout_ckpt(ls[i], &rest, NULL, ck);
        g_bf16 = 0;
        g_z3 = NULL;
        for (int s = STEPS / 2; s < STEPS; s++)
            cr_assert(rest.loss[s] == full.loss[s] && rest.gnorm[s] == full.gnorm[s],
                      "case %d step %d: loss %.17g resumed, %.17g uninterrupted", i, s,
                      rest.loss[s], full.loss[s]);
        same_weights("resumed", &full, &rest, ls[i]->dp * ls[i]->tp * ls[i]->pp);
        free_result(&full), free_result(&half), free_result(&rest);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
    }
}

// data_types.grad_accum_dtype bf16 / fp16: the weight gradients accumulate in the training
// dtype (2 bytes an element: the arena at stages 0-1, the windows at 2-3), every op adding
// in float32 and rounding once into them (the device contract), and reduced in that dtype.
// Where each gradient element receives one op's result (untied embeddings, tp 1, one
// micro-batch a rank), that is exactly the rounding a float32 gradient gets from the 16-bit
// communication_data_type before its reduction (the default under bf16 / fp16): the two runs
// agree bit for bit, every loss, norm and weight, at every ZeRO stage, offloaded too. The
// gradient memory is the estimate's (check_plan_memory) and below the float32 run's.
Test(parallel_bf16, grad_accum_16bit_changes_no_bit, .timeout = 600) {
    make_data();
    g_untied = 1;
    static const struct {
        layout_t L;
        int fp16;
        const off_knobs_t *off;
    } cases[] = {
        {{2, 1, 1, 0, 0, 2, 0, 0, 0, 0}, 0, NULL},     {{2, 1, 1, 1, 0, 2, 3000, 0, 0, 0}, 1, NULL},
        {{2, 1, 1, 2, 0, 2, 3000, 0, 0, 0}, 0, NULL},  {{2, 1, 1, 3, 0, 2, 0, 0, 0, 0}, 1, NULL},
        {{2, 1, 1, 1, 0, 2, 0, 0, 0, 0}, 0, &k_optim}, {{2, 1, 2, 2, 0, 2, 0, 0, 1, 0}, 1, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fp16 = cases[i].fp16, *knob = fp16 ? &g_fp16 : &g_bf16;
        *knob = fp16 ? 12 : 1;
        g_off = cases[i].off;
        result_t a = {0}, b = {0};
        run_layout(&cases[i].L, &a);
        g_grad_dtype = fp16 ? L3D_FLOAT16 : L3D_BFLOAT16;
        run_layout(&cases[i].L, &b);
        g_grad_dtype = -1;
        char what[80];
        snprintf(what, sizeof(what), "case %zu: %s ZeRO-%d%s, 16-bit gradients", i,
                 fp16 ? "fp16" : "bf16", cases[i].L.zero, cases[i].off ? " offloaded" : "");
        same_run(what, &a, &b, cases[i].L.dp * cases[i].L.pp);
        check_plan_memory(what, &b);
        cr_assert_lt(b.mem[0].grads, a.mem[0].grads, "%s", what);
        cr_log_info("%s: gradient memory %zu -> %zu bytes", what, a.mem[0].grads, b.mem[0].grads);
        *knob = 0;
        g_off = NULL;
        free_result(&a), free_result(&b);
    }
    g_untied = 0;
}

// Where the partials of one gradient element meet in the gradient itself - micro-batches
// accumulated (8 on one rank), a tied embedding's two uses, tensor-parallel sums of the
// norms' partial rows under SP - each partial is rounded before it is added, one more
// rounding of the 16-bit size per addition: the same first-order argument as for the stored
// activations, so the run stays within tracks_bound of the float64 trajectory and learns.
Test(parallel_bf16, grad_accum_16bit_tracks_float64, .timeout = 600) {
    reference();  // (float32, before the knob: it is kept for the runs below)
    g_grad_dtype = L3D_BFLOAT16;
    tracks_float64("bfloat16 with bfloat16 gradients", &g_bf16, 1);
    g_grad_dtype = L3D_FLOAT16;
    tracks_float64("float16 with float16 gradients", &g_fp16, 12);
    g_grad_dtype = -1;
}
