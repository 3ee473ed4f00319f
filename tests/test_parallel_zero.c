#define _GNU_SOURCE  // mkdtemp
// ZeRO-3, ZeRO offload and activation checkpointing's options against the single-rank run
// (the layout-equivalence harness: tests/harness/parallel.c).
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/checkpoint/safetensors.h"
#include "tests/harness/parallel.h"

// ZeRO-3's keys (embedding 16896 floats, a layer 43136, a norm 64): the norm persistent and
// nothing gathered ahead; embedding and norm persistent and one layer ahead; at most two
// layers live with everything ahead allowed; every group persistent (ZeRO-2 with the whole
// parameters updated by gathers); dp 8 with one layer ahead.
Test(parallel, zero3_knobs, .timeout = 240) {
    static const struct {
        layout_t L;
        z3_knobs_t k;
    } cases[] = {
        {{4, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, {100, -1, 0, 0}},
        {{2, 2, 1, 3, 0, 8, 0, 0.25f, 0, 1}, {20000, 50000, 0, 0}},
        {{4, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, {0, 1e9, 100000, 0}},
        {{2, 1, 2, 3, 0, 8, 0, 0.25f, 1, 0}, {1e9, 0, 0, 0}},
        {{8, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, {0, 50000, 0, 0}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        g_z3 = &cases[i].k;
        compare(&cases[i].L);
    }
    // stage3_gather_16bit_weights_on_model_save: a ZeRO-3 save is one model directory (no
    // per-rank shards), from which one rank resumes the run.
    static const z3_knobs_t gather = {0, 0, 0, 1};
    layout_t z3 = {2, 2, 1, 3, 0, 8, 0, 0.25f, 0, 0}, one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    resume_knobs(&z3, (knobs_t){&gather, NULL, 0, 0}, &one, (knobs_t){NULL, NULL, 0, 0}, &g_ref,
                 "test -f %s/model.safetensors -a ! -e %s/shards.json");
}

// ZeRO offload: the optimizer state, its master pieces and the AdamW step on the host (the
// update on host copies, then copied back), and with ZeRO-3 the parameter shard in host memory
// too; every sharding stage, unsharded (dp 1), with tp, pp, SP and recompute. Each reproduces
// the single-rank run; what is allocated where equals the report and its estimate: no device
// optimizer state, the shard's master (or, offload_param, the shard itself), the gradient
// pieces and both moments in host memory. Checkpoints move to and from offloaded layouts.
Test(parallel, offload, .timeout = 240) {
    static const off_knobs_t opt = {1, 0}, both = {1, 1};
    static const struct {
        layout_t L;
        const off_knobs_t *k;
    } cases[] = {
        {{1, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0}, &opt},  {{2, 1, 1, 1, 0, 8, 3000, 0.25f, 0, 0}, &opt},
        {{2, 2, 1, 2, 1, 8, 0, 0.25f, 0, 1}, &opt},  {{4, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, &opt},
        {{2, 1, 2, 3, 0, 8, 0, 0.25f, 0, 0}, &both}, {{2, 2, 2, 3, 1, 8, 0, 0.25f, 1, 1}, &both},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const layout_t *L = &cases[i].L;
        g_off = cases[i].k;
        reference();
        result_t got = {0};
        compare_keep(L, &g_ref, &got);
        int n = L->dp * L->tp * L->pp;
        for (int r = 0; r < n; r++) {
            const l3d_mem_breakdown_t *mr = &got.mem[r];
            cr_expect_eq(got.optim_in_use[r], 0, "case %zu rank %d: device optimizer state", i, r);
            cr_expect_eq(got.host_in_use[r][0], mr->host_params, "case %zu rank %d", i, r);
            cr_expect_eq(got.host_in_use[r][1], mr->host_grads, "case %zu rank %d", i, r);
            cr_expect_eq(got.host_in_use[r][2], mr->host_optim, "case %zu rank %d", i, r);
            // one float per element of this rank's pieces: the master (or the parameter shard)
            // and the gradient pieces, two moments; sharded, the gradient shard accumulates on
            // the host through a staging buffer of one piece (ZeRO-1 offloaded takes ZeRO-2's
            // gradient path: l3d_train_config_zero2)
            size_t shard = mr->host_params;
            int staged = L->dp > 1 && L->zero >= 1;
            cr_expect_eq(mr->host_optim, 2 * shard, "case %zu rank %d", i, r);
            cr_expect(staged ? mr->host_grads > shard : mr->host_grads == shard,
                      "case %zu rank %d: host gradients %zu, shard %zu", i, r, mr->host_grads,
                      shard);
            cr_expect(shard > 0 && mr->optim == 0, "case %zu rank %d", i, r);
        }
        free_result(&got);
    }
    layout_t z3 = {2, 1, 2, 3, 0, 8, 0, 0.25f, 0, 0}, z1 = {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 0};
    g_off = NULL;
    resume_knobs(&z3, (knobs_t){NULL, &both, 0, 0}, &z1, (knobs_t){NULL, NULL, 0, 0}, &g_ref, NULL);
    resume_knobs(&z1, (knobs_t){NULL, NULL, 0, 0}, &z3, (knobs_t){NULL, &opt, 0, 0}, &g_ref, NULL);
}

// activation_checkpointing's partition_activations (each saved layer input keeps 1/tp of its
// rows, all-gathered for the rebuild) and cpu_checkpointing (the saved inputs in host
// memory): with tp 2 and 4 (replicated kv heads), pp, SP (where partitioning has nothing left
// to split), ZeRO-3, one rank. Each reproduces the single-rank run with the tp traffic the
// plan predicts (one all-gather per layer more); the allocations equal the report; the saved
// inputs shrink by tp, and move to host memory with cpu_checkpointing, for the price of two
// working inputs on the device (a saving from about 5 layers per stage at tp 2).
Test(parallel, checkpoint_options, .timeout = 240) {
    static const ckpt_knobs_t part = {1, 0}, cpu = {0, 1}, both = {1, 1};
    static const struct {
        layout_t L;
        const ckpt_knobs_t *k;
    } cases[] = {
        {{1, 2, 1, 0, 1, 8, 0, 0.25f, 0, 0}, &part}, {{2, 4, 1, 1, 1, 8, 0, 0.25f, 0, 0}, &part},
        {{1, 2, 2, 0, 1, 8, 0, 0.25f, 0, 0}, &both}, {{1, 1, 1, 0, 1, 8, 0, 0.25f, 0, 0}, &cpu},
        {{1, 2, 1, 0, 1, 8, 0, 0.25f, 0, 1}, &both}, {{2, 2, 1, 3, 1, 8, 0, 0.25f, 1, 0}, &both},
    };
    reference();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const layout_t *L = &cases[i].L;
        result_t plain = {0}, got = {0};
        g_ckpt = NULL;
        run_layout(L, &plain);
        g_ckpt = cases[i].k;
        compare_keep(L, &g_ref, &got);
        g_ckpt = NULL;
        int n = L->dp * L->tp * L->pp, split = cases[i].k->partition && L->tp > 1 && !L->sp;
        for (int r = 0; r < n; r++) {
            const l3d_mem_breakdown_t *mr = &got.mem[r];
            // (the "acts" tag also counts the activation structs: the same in both runs)
            cr_expect_eq(got.acts_in_use[r] - mr->acts, plain.acts_in_use[r] - plain.mem[r].acts,
                         "case %zu rank %d", i, r);
            cr_expect_eq(got.host_acts_in_use[r], mr->host_acts, "case %zu rank %d", i, r);
            cr_expect(cases[i].k->cpu ? mr->host_acts > 0 : mr->host_acts == 0, "case %zu rank %d",
                      i, r);
        }
        if (L->pp == 1) {
            // One activation set of 3 layers, N = 2 x 32 rows of 64: plain recompute keeps each
            // layer's input (N x 64 floats; with SP this rank's N/tp rows, all it holds of the
            // residual stream) on the device; the options keep this rank's rows of it (1/tp
            // when split, or with SP) on the device or the host, and add the two working
            // inputs the layers pass through (as long as a layer's input).
            size_t f = sizeof(float), NC = 64 * 64 * f, rows = NC / (size_t)(split || L->sp ? L->tp : 1);
            size_t xr = NC / (size_t)(L->sp ? L->tp : 1);
            size_t dev = plain.mem[0].acts - 3 * xr + 2 * xr + (cases[i].k->cpu ? 0 : 3 * rows);
            cr_expect_eq(got.mem[0].acts, dev, "case %zu: device %zu, expected %zu", i,
                         got.mem[0].acts, dev);
            cr_expect_eq(got.mem[0].host_acts, cases[i].k->cpu ? 3 * rows : 0, "case %zu", i);
        }
        free_result(&plain);
        free_result(&got);
    }
}

// ZeRO-3 keeps this rank's 1/dp piece of every group, the persistent groups whole and a pool
// of the largest group plus what is gathered ahead -- not the parameters (ZeRO-2 keeps them
// whole): the allocations say so (the rope tables are the rest of "params" in both) and the
// estimate printed before training agrees.
Test(parallel, zero3_memory) {
    make_data();
    layout_t z2 = {4, 1, 1, 2, 0, 8, 0, 0.25f, 0, 0}, z3 = z2;
    z3.zero = 3;
    static const z3_knobs_t none_ahead = {100, -1, 0, 0};  // the norm persistent
    result_t r2 = {0}, r3 = {0};
    run_layout(&z2, &r2);
    g_z3 = &none_ahead;
    run_layout(&z3, &r3);
    g_z3 = NULL;
    size_t P = r2.mem[0].params / sizeof(float), f = sizeof(float);
    size_t layer = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64, norm = 64;
    for (int r = 0; r < 4; r++) {
        size_t rope = r2.params_in_use[r] - r2.mem[r].params;
        cr_assert_eq(r3.params_in_use[r] - rope, r3.mem[r].params, "rank %d: %zu in use, %zu "
                     "reported", r, r3.params_in_use[r] - rope, r3.mem[r].params);
        size_t shard = r3.mem[r].optim / 2 / f;
        cr_assert_leq(shard, P / 4 + 5 * 4, "rank %d: shard %zu of %zu", r, shard, P);
        cr_assert_eq(r3.mem[r].params, (shard + norm + layer) * f, "rank %d: %zu", r,
                     r3.mem[r].params);
        cr_assert(r3.refused[r], "rank %d: l3d_model_save of a partitioned model is refused", r);
    }
    cr_assert_eq(r3.estimate.params, r3.mem[0].params);
    // At 16 layers with one layer gathered ahead (nothing persistent): the shard and two
    // layers, under half of ZeRO-2's whole parameters.
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    config(ctx, &z3, &cfg);
    cfg.model.num_hidden_layers = 16;
    cfg.stage3_prefetch_bucket_size = (double)layer;
    l3d_mem_breakdown_t e2, e3;
    l3d_train_config_memory(&cfg, &e3);
    cfg.zero_stage = 2;
    l3d_train_config_memory(&cfg, &e2);
    cr_assert_eq(e3.params, (e3.optim / 2 / f + 2 * layer) * f, "16 layers: %zu",
                 e3.params);
    cr_assert_lt(2 * e3.params, e2.params, "ZeRO-3 %zu vs ZeRO-2 %zu bytes", e3.params,
                 e2.params);
    l3d_ctx_destroy(ctx);
    free_result(&r2);
    free_result(&r3);
}
