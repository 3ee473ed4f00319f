#define _GNU_SOURCE  // mkdtemp
// Layout equivalence, the central proof of the parallel trainer: from the same initial
// weights and data, 20 fp32 steps on a parallel layout follow the same float64 trajectory as
// the single-rank run, as closely as any float32 run does (per-step losses and gradient norms,
// final weights; the harness and the tolerance's derivation: tests/harness/parallel.c).
// Ranks are threads over the in-process transport (l3d_comm_create_local), each with its own
// context and trainer, as a user embedding llama3d would run them. ZeRO-3, offload and the
// checkpointing options: tests/test_parallel_zero.c.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/checkpoint/safetensors.h"
#include "tests/harness/parallel.h"

// The layouts this build trains; tp and pp join as they are built.
static layout_t k_layouts[] = {
    {2, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0},     {2, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0},
    {4, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0},     {4, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0},
    {2, 1, 1, 1, 1, 8, 0, 0.25f, 0, 0},     {2, 1, 1, 2, 0, 8, 0, 0.25f, 0, 0},
    {4, 1, 1, 1, 0, 8, 3000, 0.25f, 0, 0},  {2, 1, 1, 0, 1, 8, 777, 0.25f, 0, 0},
    {8, 1, 1, 1, 0, 8, 5000, 0.25f, 0, 0},
    // ZeRO-2: gradients sharded, reduced every micro-batch through windows; bucket 777 puts
    // every group in a bucket of its own, 3000 merges some; tied embedding over two stages
    {4, 1, 1, 2, 0, 8, 3000, 0.25f, 0, 0},  {8, 1, 1, 2, 0, 8, 777, 0.25f, 0, 0},
    {2, 4, 1, 2, 1, 8, 0, 0.25f, 0, 0},     {2, 1, 2, 2, 0, 8, 0, 0.25f, 0, 0},
    {2, 2, 2, 2, 1, 8, 3000, 0.25f, 0, 0},  {2, 2, 1, 2, 0, 8, 0, 0.25f, 0, 1},
    {2, 2, 2, 2, 0, 8, 777, 0.25f, 1, 1},
    // tensor parallelism: heads, ffn and vocabulary split; tp 4 > 2 kv heads replicates them
    {1, 2, 1, 0, 0, 8, 0, 0.25f, 0, 0},     {1, 2, 1, 0, 1, 8, 0, 0.25f, 0, 0},
    {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0},     {2, 2, 1, 0, 0, 8, 0, 0.25f, 0, 0},
    {2, 2, 1, 1, 0, 8, 2000, 0.25f, 0, 0},  {2, 4, 1, 1, 1, 8, 0, 0.25f, 0, 0},
    // pipeline parallelism (1F1B unless noted): 3 layers over 2 and 3 stages, tied embedding
    // split between the first and last stage
    {1, 1, 2, 0, 0, 8, 0, 0.25f, 0, 0},     {1, 1, 3, 0, 0, 8, 0, 0.25f, 0, 0},
    {2, 1, 2, 1, 0, 8, 0, 0.25f, 0, 0},     {1, 2, 2, 0, 1, 8, 0, 0.25f, 0, 0},
    {2, 2, 2, 0, 0, 8, 0, 0.25f, 0, 0},     {2, 2, 2, 1, 1, 8, 3000, 0.25f, 0, 0},
    {1, 1, 2, 0, 0, 8, 0, 0.25f, 1, 0},  {1, 2, 2, 1, 0, 8, 0, 0.25f, 1, 0},
    {1, 4, 2, 0, 0, 8, 0, 0.25f, 1, 0},
    // sequence parallelism: norms and the residual stream split by rows over tp
    {1, 2, 1, 0, 0, 8, 0, 0.25f, 0, 1},  {1, 4, 1, 0, 1, 8, 0, 0.25f, 0, 1},
    {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 1},  {1, 2, 2, 0, 0, 8, 0, 0.25f, 0, 1},
    {2, 2, 2, 1, 1, 8, 3000, 0.25f, 0, 1}, {1, 2, 3, 0, 0, 8, 0, 0.25f, 1, 1},
    // ZeRO-3 with every group gathered (persistence 0) and DeepSpeed's prefetch: tp with
    // recompute, pp (a tied embedding over two stages), GPipe with SP, three stages with
    // recompute; zero3_knobs varies the keys
    {2, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0},     {2, 2, 1, 3, 1, 8, 0, 0.25f, 0, 0},
    {2, 1, 2, 3, 0, 8, 0, 0.25f, 0, 0},     {2, 2, 2, 3, 0, 8, 0, 0.25f, 1, 1},
    {2, 1, 3, 3, 1, 8, 0, 0.25f, 0, 0},
};

ParameterizedTestParameters(parallel, layout_equivalence) {
    return cr_make_param_array(layout_t, k_layouts, sizeof(k_layouts) / sizeof(k_layouts[0]));
}

ParameterizedTest(layout_t *L, parallel, layout_equivalence, .timeout = 240) { compare(L); }

// Shapes that do not split are refused naming the dimension; the vocabulary splits unevenly.
Test(parallel, tp_shape_errors) {
    make_data();
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    layout_t L = {1, 1, 1, 0, 0, 8, 0, 0, 0, 0};
    l3d_train_config_t cfg;
    config(ctx, &L, &cfg);
    l3d_model_config_t m = cfg.model;  // 4 heads, 2 kv heads, ffn 160, vocab 264
    cr_assert_eq(l3d_tp_check(ctx, &m, 3), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "num_attention_heads 4"), "%s",
              l3d_ctx_last_error(ctx));
    m.num_attention_heads = 6;
    cr_assert_eq(l3d_tp_check(ctx, &m, 3), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "num_key_value_heads 2"), "%s",
              l3d_ctx_last_error(ctx));
    m = cfg.model;
    m.intermediate_size = 162;
    cr_assert_eq(l3d_tp_check(ctx, &m, 4), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "intermediate_size 162"), "%s",
              l3d_ctx_last_error(ctx));
    m = cfg.model;
    m.vocab_size = 263;  // 263 = 66 + 66 + 66 + 65 rows: no padding needed
    cr_assert_eq(l3d_tp_check(ctx, &m, 4), L3D_OK);
    size_t total = 0;
    for (int r = 0; r < 4; r++) total += l3d_model_arena_floats_tp(&m, 4, r);
    cr_assert(total > l3d_model_arena_floats(&m), "shards hold at least the model");
    l3d_ctx_destroy(ctx);
}

// The world must have exactly dp*tp*pp ranks; the error shows the product and the world.
Test(parallel, world_size_mismatch) {
    make_data();
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    layout_t L = {2, 1, 1, 0, 0, 8, 0, 0, 0, 0};
    l3d_train_config_t cfg;
    config(ctx, &L, &cfg);
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    l3d_trainer_t *t = NULL;
    cr_assert_eq(l3d_trainer_create_parallel(ctx, &cfg, NULL, &t), L3D_ERR_CONFIG);
    const char *e = l3d_ctx_last_error(ctx);
    cr_assert(strstr(e, "dp 2 x tp 1 x pp 1 = 2 ranks") && strstr(e, "the world has 1"), "%s", e);
    l3d_ctx_destroy(ctx);
}

Test(parallel, resume_across_layouts, .timeout = 240) {
    layout_t z1x4 = {4, 1, 1, 1, 0, 8, 3000, 0.25f, 0, 0}, one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t z1x2 = {2, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0}, z0x2 = {2, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    resume_case(&z1x4, &one);   // sharded -> single rank
    resume_case(&one, &z1x2);   // single rank -> sharded
    resume_case(&z1x2, &z0x2);  // sharded -> replicated
}

// Tensor-parallel shards are gathered into the single-rank layout and re-sliced on resume.
Test(parallel, resume_across_tp_layouts, .timeout = 240) {
    layout_t d2t2 = {2, 2, 1, 1, 0, 8, 2000, 0.25f, 0, 0}, t4 = {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, d2t4 = {2, 4, 1, 1, 1, 8, 0, 0.25f, 0, 0};
    resume_case(&d2t2, &t4);    // (2,2,1) ZeRO-1 -> (1,4,1)
    resume_case(&d2t2, &one);   // -> (1,1,1)
    resume_case(&t4, &d2t4);    // (1,4,1) -> (2,4,1) ZeRO-1 with recompute
}

// The issue's resharding case: save at step 10 on (2,2,2), resume on (1,4,2) and (1,1,1).
Test(parallel, resume_across_pipeline_layouts, .timeout = 240) {
    layout_t d2t2p2 = {2, 2, 2, 1, 0, 8, 0, 0.25f, 0, 0}, t4p2 = {1, 4, 2, 0, 0, 8, 0, 0.25f, 1, 0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, p3 = {1, 1, 3, 0, 1, 8, 0, 0.25f, 0, 0};
    resume_case(&d2t2p2, &t4p2);  // (2,2,2) ZeRO-1 -> (1,4,2) GPipe
    resume_case(&d2t2p2, &one);   // -> (1,1,1)
    resume_case(&one, &p3);       // (1,1,1) -> (1,1,3) with recompute
    layout_t z2 = {2, 2, 2, 2, 0, 8, 3000, 0.25f, 0, 0}, z2x4 = {4, 1, 1, 2, 0, 8, 777, 0.25f, 0, 0};
    resume_case(&z2, &one);       // ZeRO-2 (2,2,2) -> (1,1,1)
    resume_case(&d2t2p2, &z2x4);  // ZeRO-1 (2,2,2) -> ZeRO-2 (4,1,1)
    layout_t z3 = {2, 2, 2, 3, 0, 8, 0, 0.25f, 0, 0}, z3x4 = {4, 1, 1, 3, 1, 8, 0, 0.25f, 0, 0};
    resume_case(&z3, &z3x4);      // ZeRO-3 (2,2,2) -> ZeRO-3 (4,1,1) with recompute
    resume_case(&z3x4, &d2t2p2);  // ZeRO-3 (4,1,1) -> ZeRO-1 (2,2,2)
    resume_case(&one, &z3);       // (1,1,1) -> ZeRO-3 (2,2,2)
}

// ZeRO-2 holds the gradient as a 1/dp shard plus a ring of windows as long as the longest bucket
// instead of the whole arena (and, with a tied head on the embedding's stage, which fills the
// embedding's bucket from the start of the backward, a window of that bucket's size): the
// allocations say so, and the estimate printed before training agrees. Untied, the head's
// window and the final norm's are asked for together and the ring holds both.
Test(parallel, zero2_memory) {
    make_data();
    layout_t z1 = {4, 1, 1, 1, 0, 8, 3000, 0.25f, 0, 0}, z2 = z1;
    z2.zero = 2;
    result_t r1 = {0}, r2 = {0};
    run_layout(&z1, &r1);
    run_layout(&z2, &r2);
    size_t P = r1.mem[0].params / sizeof(float), f = sizeof(float);
    size_t layer = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64;  // the longest bucket
    size_t embed = 264 * 64;                                            // vocabulary x hidden
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(r1.grads_in_use[r], r1.mem[r].grads);
        cr_assert_geq(r1.mem[r].grads, P * f);
        cr_assert_eq(r2.grads_in_use[r], r2.mem[r].grads, "rank %d: %zu in use, %zu reported",
                     r, r2.grads_in_use[r], r2.mem[r].grads);
        size_t shard = r2.mem[r].optim / 2 / f;
        cr_assert_leq(shard, P / 4 + 4 * 8, "rank %d: shard %zu of %zu", r, shard, P);
        cr_assert_eq(r2.mem[r].grads, (shard + layer + embed) * f, "rank %d: %zu", r,
                     r2.mem[r].grads);
    }
    cr_assert_eq(r2.estimate.grads, r2.mem[0].grads);
    cr_assert_eq(r2.estimate.optim, r2.mem[0].optim);
    cr_assert_eq(r1.estimate.grads, r1.mem[0].grads);
    // overlap_comm: the ring holds two layers, so each layer reduces while the next fills; the
    // same reductions in the same order, so the same bits.
    result_t r3 = {0};
    g_overlap = 1;
    run_layout(&z2, &r3);
    g_overlap = 0;
    for (int r = 0; r < 4; r++) {
        size_t shard = r3.mem[r].optim / 2 / f;
        cr_assert_eq(r3.grads_in_use[r], r3.mem[r].grads);
        cr_assert_eq(r3.mem[r].grads, (shard + 2 * layer + embed) * f, "overlap, rank %d: %zu",
                     r, r3.mem[r].grads);
    }
    cr_assert_eq(r3.estimate.grads, r3.mem[0].grads);
    cr_assert(!memcmp(r3.loss, r2.loss, sizeof(r2.loss)) &&
              !memcmp(r3.gnorm, r2.gnorm, sizeof(r2.gnorm)), "overlap_comm changed a bit");
    free_result(&r3);
    // Three layers are mostly windows; at 16 layers the shard and windows are < 1/2 of P.
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    config(ctx, &z2, &cfg);
    cfg.model.num_hidden_layers = 16;
    l3d_mem_breakdown_t e1, e2;
    l3d_train_config_memory(&cfg, &e2);
    cfg.zero_stage = 1;
    l3d_train_config_memory(&cfg, &e1);
    cr_assert_lt(2 * e2.grads, e1.grads, "ZeRO-2 %zu vs ZeRO-1 %zu bytes", e2.grads, e1.grads);
    // Untied, with a vocabulary long enough that the head is the longest bucket: the ring holds
    // the head's bucket and the final norm's at once (64 floats: a run of L3D_RING_ALIGN).
    l3d_model_config_t tied = cfg.model;
    cfg.zero_stage = 2;
    cfg.model.tie_word_embeddings = 0;
    cfg.model.vocab_size = 1024;
    l3d_mem_breakdown_t eu;
    l3d_train_config_memory(&cfg, &eu);
    size_t shard_u = eu.optim / 2 / f, head = 1024 * 64;
    cr_assert_eq(eu.grads, (shard_u + head + L3D_RING_ALIGN) * f, "untied: %zu bytes, shard %zu floats",
                 eu.grads, shard_u);
    cfg.model = tied;
    // One bucket holding every layer (DeepSpeed's 5e8 default on a small model) needs a ring of
    // its length: shard + the layers' bucket + the embedding's (each padded to dp and rounded
    // up to L3D_RING_ALIGN elements).
    cfg.zero_stage = 2;
    cfg.reduce_bucket_size = 5e8;
    l3d_mem_breakdown_t e3;
    l3d_train_config_memory(&cfg, &e3);
    size_t P16 = e3.params / f, shard16 = e3.optim / 2 / f;
    cr_assert_leq(e3.grads, (shard16 + P16 + 2 * L3D_RING_ALIGN) * f, "one bucket: %zu bytes, P %zu floats",
                  e3.grads, P16);
    l3d_ctx_destroy(ctx);
    free_result(&r1);
    free_result(&r2);
}

// Parallel runs save sharded checkpoints: one file per rank, each element written once;
// train.save_consolidated writes the single-rank layout instead; a single-rank model reads
// either, bitwise alike; a missing or truncated shard and an unwritable target fail every
// rank, naming the file, without hanging and without touching an older checkpoint.
static size_t count_elements(const char *dir, const char *suffix) {
    size_t n = 0;
    char path[256];
    for (int r = 0; r < 8; r++) {
        snprintf(path, sizeof(path), "%s/shard-%05d-of-00008.safetensors", dir, r);
        l3d_ctx_t *ctx;
        cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
        l3d_st_file_t *f;
        cr_assert_eq(l3d_st_open(ctx, path, &f), L3D_OK, "%s", l3d_ctx_last_error(ctx));
        for (size_t i = 0; i < l3d_st_count(f); i++) {
            const l3d_st_tensor_t *e = l3d_st_at(f, i);
            char want[64];
            const char *at = strrchr(e->name, '@');
            snprintf(want, sizeof(want), "%s@", suffix);
            size_t wl = strlen(want);
            int match = suffix[0] ? (size_t)(at - e->name) + 1 >= wl &&
                                        !strncmp(at + 1 - wl, want, wl)
                                  : !strstr(e->name, ".exp_avg");
            if (match) n += (size_t)(e->end - e->begin) / sizeof(float);
        }
        l3d_st_close(f);
        l3d_ctx_destroy(ctx);
    }
    return n;
}

Test(parallel, sharded_checkpoints, .timeout = 120) {
    reference();
    char dir[] = "/tmp/l3d_test_sharded_XXXXXX", a[64], b[64], cmd[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(a, sizeof(a), "%s/sharded", dir);
    snprintf(b, sizeof(b), "%s/consolidated", dir);
    layout_t d2t2p2 = {2, 2, 2, 1, 0, 8, 0, 0.25f, 0, 0}, one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t d4p2 = {4, 1, 2, 1, 0, 8, 0, 0.25f, 0, 0}, d2 = {2, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    result_t r = {0};
    run_layout_ckpt(&d2t2p2, &r, a, NULL);
    free_result(&r);
    g_consolidated = 1;
    run_layout_ckpt(&d2t2p2, &r, b, NULL);
    free_result(&r);
    g_consolidated = 0;
    snprintf(cmd, sizeof(cmd), "test -f %s/shards.json -a -f %s/shard-00007-of-00008.safetensors"
             " -a ! -e %s/model.safetensors -a -f %s/model.safetensors -a ! -e %s/shards.json",
             a, a, a, b, b);
    cr_assert_eq(system(cmd), 0, "layouts of the two directories");
    // every element of the model once per array, whatever the ranks held twice
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_model_t *ma, *mb;
    l3d_device_t *dev;
    cr_assert_eq(l3d_device_create(ctx, "cpu", NULL, &dev), L3D_OK);
    cr_assert_eq(l3d_model_open(ctx, dev, a, &ma), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    size_t numel = 0;
    for (int i = 0; i < ma->n_tensors; i++) numel += ma->tensors[i].numel;
    cr_assert_eq(count_elements(a, ""), numel);
    cr_assert_eq(count_elements(a, ".exp_avg"), numel);
    cr_assert_eq(count_elements(a, ".exp_avg_sq"), numel);
    cr_assert_eq(l3d_model_open(ctx, dev, b, &mb), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(memcmp(ma->params, mb->params, ma->n_params * sizeof(float)), 0,
                 "sharded and consolidated weights differ");
    l3d_model_destroy(mb);
    l3d_model_destroy(ma);
    l3d_device_destroy(dev);
    // both resume elsewhere and continue the uninterrupted run
    const layout_t *to[] = {&one, &d4p2, &d2};
    for (int k = 0; k < 3; k++)
        for (int src = 0; src < 2; src++) {
            result_t c = {0};
            run_layout_ckpt(to[k], &c, NULL, src ? b : a);
            char name[64];
            snprintf(name, sizeof(name), "%s -> (%d,%d,%d)", src ? "consolidated" : "sharded",
                     to[k]->dp, to[k]->tp, to[k]->pp);
            check_run(name, &c, &g_ref, STEPS / 2);
            free_result(&c);
        }
    // a missing shard, then a truncated one: every rank fails naming it
    char err[MAXR][256], p3[160];
    snprintf(p3, sizeof(p3), "%s/shard-00003-of-00008.safetensors", a);
    snprintf(cmd, sizeof(cmd), "cp %s %s.keep && rm %s", p3, p3, p3);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(run_ranks(&d2, NULL, NULL, a, err), 2);
    cr_assert(strstr(err[0], "shard-00003-of-00008") || strstr(err[1], "shard-00003-of-00008"),
              "%s | %s", err[0], err[1]);
    snprintf(cmd, sizeof(cmd), "head -c 1000 %s.keep > %s", p3, p3);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(run_ranks(&d2, NULL, NULL, a, err), 2);
    cr_assert(strstr(err[0], "shard-00003-of-00008"), "%s", err[0]);
    // saving below a regular file fails on every rank; the older checkpoint stays
    char bad[160];
    snprintf(bad, sizeof(bad), "%s/plain/ck", dir);
    snprintf(cmd, sizeof(cmd), "touch %s/plain", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(run_ranks(&d2t2p2, NULL, bad, NULL, err), 8);
    cr_assert(strstr(err[0], "plain"), "%s", err[0]);
    snprintf(cmd, sizeof(cmd), "test -f %s/shards.json", a);
    cr_assert_eq(system(cmd), 0);
    l3d_ctx_destroy(ctx);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

// Every schedule for every pp and micro-batch count up to 8 (interleaved: 2..4 chunks, where
// its preconditions hold) completes within its slots with every message received in order,
// runs each micro-batch's F and B once per stage and chunk, and 1F1B keeps min(pp - stage, A)
// sets alive. Interleaving runs every virtual stage's forwards in micro-batch order.
Test(parallel, schedules_complete) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    int interleaved = 0;
    for (int kind = 0; kind < 3; kind++)
        for (int v = 1; v <= (kind == L3D_PP_INTERLEAVED ? 4 : 1); v++)
            for (int pp = 1; pp <= 8; pp++)
                for (int A = 1; A <= 8; A++) {
                    if (kind == L3D_PP_INTERLEAVED) {
                        if (l3d_pp_check(ctx, L3D_PP_INTERLEAVED, pp, v, A) != L3D_OK) continue;
                        interleaved++;
                    }
                    cr_assert_eq(l3d_pp_validate(ctx, (l3d_pp_kind)kind, pp, v, A), L3D_OK,
                                 "kind %d pp %d v %d A %d: %s", kind, pp, v, A,
                                 l3d_ctx_last_error(ctx));
                    for (int s = 0; s < pp; s++) {
                        l3d_pp_op_t ops[64];
                        int seen[2][4][8] = {{{0}}}, live[4] = {0}, peak[4] = {0}, next_f[4] = {0};
                        int n = l3d_pp_schedule((l3d_pp_kind)kind, pp, v, s, A, ops);
                        cr_assert_eq(n, 2 * A * v);
                        for (int i = 0; i < n; i++) {
                            l3d_pp_op_t o = ops[i];
                            cr_assert(o.chunk >= 0 && o.chunk < v && o.micro >= 0 && o.micro < A);
                            seen[o.backward][o.chunk][o.micro]++;
                            if (o.backward) cr_assert(seen[0][o.chunk][o.micro], "B before F");
                            else cr_assert_eq(o.micro, next_f[o.chunk]++, "forwards in order");
                            live[o.chunk] += o.backward ? -1 : 1;
                            if (live[o.chunk] > peak[o.chunk]) peak[o.chunk] = live[o.chunk];
                        }
                        for (int c = 0; c < v; c++) {
                            for (int j = 0; j < A; j++)
                                cr_assert(seen[0][c][j] == 1 && seen[1][c][j] == 1);
                            cr_assert_eq(peak[c], l3d_pp_slots((l3d_pp_kind)kind, pp, v, s, A, c));
                        }
                        // The layer pool: the peak of live layers along the ops (chunks of
                        // 1, 2, .. layers: uneven), never more than the per-chunk peaks summed.
                        int cl[4] = {1, 2, 3, 4}, lv = 0, lpeak = 0, summed = 0;
                        for (int i = 0; i < n; i++) {
                            lv += ops[i].backward ? -cl[ops[i].chunk] : cl[ops[i].chunk];
                            if (lv > lpeak) lpeak = lv;
                        }
                        for (int c = 0; c < v; c++) summed += peak[c] * cl[c];
                        cr_assert_eq(l3d_pp_layer_peak((l3d_pp_kind)kind, pp, v, s, A, cl), lpeak);
                        cr_assert_leq(lpeak, summed);
                        // Even chunks of k = 2 layers on stage 0 with the warm-up filled:
                        // Korthikanti et al.'s L (1 + (p-1)/(pv)), the model's L = pp v k
                        // (interleaved), and L = pp k (1F1B, A >= pp: pp micro-batches).
                        int k2[4] = {2, 2, 2, 2};
                        if (kind == L3D_PP_INTERLEAVED && s == 0 && A * v > 2 * (pp - 1) + (v - 1) * pp)
                            cr_assert_eq(l3d_pp_layer_peak(L3D_PP_INTERLEAVED, pp, v, 0, A, k2),
                                         2 * (v * pp + pp - 1), "pp %d v %d A %d", pp, v, A);
                        if (kind == L3D_PP_1F1B && s == 0 && A >= pp)
                            cr_assert_eq(l3d_pp_layer_peak(L3D_PP_1F1B, pp, 1, 0, A, k2), 2 * pp);
                        int want = kind == L3D_PP_GPIPE ? A : (pp - s < A ? pp - s : A);
                        if (kind != L3D_PP_INTERLEAVED)
                            cr_assert_eq(peak[0], want, "kind %d pp %d stage %d A %d: peak %d",
                                         kind, pp, s, A, peak[0]);
                    }
                }
    cr_assert_geq(interleaved, 30, "only %d interleaved cases", interleaved);
    // A channel delivering another message than the one a stage expects is caught: between
    // two stages forward activations and backward gradients share one channel (pp 2).
    cr_assert_eq(l3d_pp_check(ctx, L3D_PP_INTERLEAVED, 2, 2, 3), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "multiple of parallel.pp"), "%s",
              l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_pp_check(ctx, L3D_PP_1F1B, 2, 2, 4), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "virtual_stages 2 needs parallel.schedule"), "%s",
              l3d_ctx_last_error(ctx));
    l3d_ctx_destroy(ctx);
}

// Layouts that need more than the default 3 layers, against a 4-layer single-rank reference.
// Four pipeline stages of one layer each, 1F1B and GPipe, with dp and tp beside them. ZeRO-2
// windows of unequal length: with a bucket a little over a layer, the last stage's final norm
// joins its last layer (the longest bucket), the head stays alone, and the two fill at once
// at the start of every backward: the head must take the shorter window.
Test(parallel, four_layers, .timeout = 240) {
    static const layout_t cases[] = {
        {1, 1, 4, 0, 0, 8, 0, 0.25f, 0, 0},      {1, 1, 4, 0, 1, 8, 0, 0.25f, 1, 0},
        {2, 1, 4, 1, 0, 8, 3000, 0.25f, 0, 0},   {1, 2, 4, 0, 0, 8, 0, 0.25f, 0, 1},
        {2, 2, 2, 2, 0, 8, 21700, 0.25f, 0, 0},  // ZeRO-2: layer per tp rank 21632 floats
        {2, 1, 2, 2, 1, 8, 43200, 0.25f, 0, 0},  // layer 43136 floats, norm 64
        {2, 1, 2, 2, 0, 8, 43200, 0.25f, 2, 0},  // interleaved: a chunk per bucket run
    };
    make_data();
    g_layers = 4;
    result_t ref = {0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    reference_run(&one, &ref);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) compare_to(&cases[i], &ref);
    free_result(&ref);
    g_layers = 0;
}

// Interleaved 1F1B (virtual stages): more layers than the default 3, each count with its own
// single-rank reference; stage 0's later chunks receive from the last stage. Four tests of a
// few cases each, so that no one of them nears its limit: the whole list took 42 s alone
// (82 s under the sanitizers) and outgrew 240 s in the sanitizer stage of CI, with ctest and
// Criterion each running two at once on two cores.
typedef struct {
    int layers;
    layout_t L;
} interleaved_case_t;

static void interleaved_cases(const interleaved_case_t *cases, size_t n) {
    make_data();
    for (size_t i = 0; i < n; i++) {
        g_layers = cases[i].layers;
        result_t ref = {0};
        layout_t one = {1, 1, 1, 0, 0, cases[i].L.accum_total, 0, 0.25f, 0, 0};
        reference_run(&one, &ref);
        compare_to(&cases[i].L, &ref);
        free_result(&ref);
    }
    g_layers = 0;
}

Test(parallel, interleaved, .timeout = 240) {
    static const interleaved_case_t cases[] = {
        {4, {1, 1, 2, 0, 0, 8, 0, 0.25f, 2, 0}},  {4, {2, 1, 2, 1, 0, 8, 0, 0.25f, 2, 0}},
        {4, {1, 2, 2, 0, 1, 8, 0, 0.25f, 2, 1}},  {4, {2, 2, 2, 2, 1, 8, 777, 0.25f, 2, 0}},
        {4, {2, 1, 2, 3, 1, 8, 0, 0.25f, 2, 0}},
    };
    interleaved_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(parallel, interleaved_deeper, .timeout = 240) {
    static const interleaved_case_t cases[] = {
        {6, {1, 1, 3, 0, 0, 6, 0, 0.25f, 2, 0}},  {6, {2, 1, 3, 1, 1, 12, 0, 0.25f, 2, 0}},
        {6, {1, 1, 2, 0, 0, 8, 0, 0.25f, 3, 0}},
    };
    interleaved_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(parallel, interleaved_eight_layers, .timeout = 240) {
    static const interleaved_case_t cases[] = {
        {8, {1, 1, 4, 0, 0, 8, 0, 0.25f, 2, 0}},
        {8, {1, 2, 4, 2, 0, 8, 0, 0.25f, 2, 0}},
    };
    interleaved_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

// Checkpoints move between interleaved and plain pipelines (4 layers).
Test(parallel, interleaved_resume, .timeout = 240) {
    make_data();
    g_layers = 4;
    result_t ref = {0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, p2 = {1, 1, 2, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t d2t2p2v2 = {2, 2, 2, 1, 0, 8, 0, 0.25f, 2, 0};
    reference_run(&one, &ref);
    resume_case_to(&d2t2p2v2, &p2, &ref);   // interleaved (2,2,2) ZeRO-1 -> 1F1B (1,1,2)
    resume_case_to(&one, &d2t2p2v2, &ref);  // (1,1,1) -> interleaved (2,2,2)
    free_result(&ref);
    g_layers = 0;
}

// Layouts whose preconditions fail are refused before training, naming the knob.
Test(parallel, pipeline_preconditions) {
    make_data();
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    layout_t L = {1, 1, 1, 0, 0, 8, 0, 0, 0, 0};
    l3d_train_config_t cfg;
    config(ctx, &L, &cfg);
    snprintf(cfg.pp_schedule, sizeof(cfg.pp_schedule), "interleaved");
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "parallel.schedule 'interleaved'"), "%s",
              l3d_ctx_last_error(ctx));
    // interleaved 1F1B: A a multiple of pp, virtual stages only with it, a layers_per_stage
    // list of one count per virtual stage, and pp x virtual stages within the layers
    config(ctx, &L, &cfg);
    cfg.pp = 2;
    cfg.grad_accum_steps = 3;
    cfg.train_batch_size = 3 * cfg.micro_batch_size;
    snprintf(cfg.pp_schedule, sizeof(cfg.pp_schedule), "interleaved");
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "gradient_accumulation_steps (3) to be a multiple "
                                              "of parallel.pp (2)"), "%s", l3d_ctx_last_error(ctx));
    config(ctx, &L, &cfg);
    cfg.pp = 2;
    cfg.virtual_stages = 2;
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "parallel.virtual_stages 2 needs parallel.schedule "
                                              "'interleaved'"), "%s", l3d_ctx_last_error(ctx));
    snprintf(cfg.pp_schedule, sizeof(cfg.pp_schedule), "interleaved");
    cfg.n_layers_per_stage = 2;
    cfg.layers_per_stage[0] = 1;
    cfg.layers_per_stage[1] = 2;
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "layers_per_stage has 2 entries summing to 3; it "
                                              "needs pp x virtual_stages = 4 entries"), "%s",
              l3d_ctx_last_error(ctx));
    // 4 stages for 3 layers: finalize (what --dry-run runs) and every rank at creation (a
    // 4-rank in-process world) refuse with the same message.
    l3d_ctx_t *wctx;
    cr_assert_eq(l3d_ctx_create(NULL, &wctx), L3D_OK);
    l3d_comm_t *comms[4];
    cr_assert_eq(l3d_comm_create_local(wctx, 1, comms), L3D_OK);
    config(ctx, &L, &cfg);
    cfg.pp = 4;
    l3d_trainer_t *t = NULL;
    const char *more = "parallel.pp 4 is more stages than num_hidden_layers 3";
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), more), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_trainer_create_parallel(ctx, &cfg, comms[0], &t), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), more), "%s", l3d_ctx_last_error(ctx));
    cfg.pp = 2;  // 2 stages x 2 chunks = 4 virtual stages for 3 layers
    snprintf(cfg.pp_schedule, sizeof(cfg.pp_schedule), "interleaved");
    more = "parallel.pp 2 x parallel.virtual_stages 2 is more virtual stages than "
           "num_hidden_layers 3";
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), more), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_trainer_create_parallel(ctx, &cfg, comms[0], &t), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), more), "%s", l3d_ctx_last_error(ctx));
    l3d_comm_destroy(comms[0]);
    l3d_ctx_destroy(wctx);
    l3d_ctx_destroy(ctx);
}

// parallel.layers_per_stage overrides the balanced split: 3 layers as 1 + 2 and 2 + 1, with
// the predicted bytes following the first stage's layer count; bad lists are refused.
Test(parallel, layers_per_stage, .timeout = 120) {
    static const int a[] = {1, 2}, b[] = {2, 1};
    layout_t p2 = {1, 1, 2, 0, 0, 8, 0, 0.25f, 0, 0}, d2t2p2 = {2, 2, 2, 1, 1, 8, 0, 0.25f, 1, 1};
    reference();
    g_lps = a;
    compare(&p2);
    compare(&d2t2p2);
    g_lps = b;
    compare(&p2);
    g_lps = NULL;
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    config(ctx, &p2, &cfg);
    cfg.pp = 2;
    cfg.n_layers_per_stage = 2;
    cfg.layers_per_stage[0] = 2;
    cfg.layers_per_stage[1] = 2;
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "2 entries summing to 4; it needs pp x "
                                              "virtual_stages = 2 entries (one per virtual "
                                              "stage, in model order) summing to "
                                              "num_hidden_layers 3"), "%s",
              l3d_ctx_last_error(ctx));
    // a stage between the first and the last with no layer would only relay
    cfg.pp = 3;
    cfg.grad_accum_steps = 3;
    cfg.train_batch_size = 3 * cfg.micro_batch_size;
    cfg.n_layers_per_stage = 3;
    cfg.layers_per_stage[0] = 2;
    cfg.layers_per_stage[1] = 0;
    cfg.layers_per_stage[2] = 1;
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "layers_per_stage[1] is 0: only the first entry "
                                              "(the embedding alone) and the last (the head "
                                              "alone) may hold no layer"), "%s",
              l3d_ctx_last_error(ctx));
    l3d_ctx_destroy(ctx);
}

// Llama 3's balancing (Dubey et al. 2024, section 3.3.2): the first virtual stage holds the
// embedding alone, the last the head alone, with and without interleaving, through tensor,
// sequence and data parallelism, ZeRO-1 and ZeRO-3; every run matches the single rank, and
// its checkpoint resumes on a single rank and the single rank's on it.
Test(parallel, layers_per_virtual_stage, .timeout = 240) {
    static const int e3[] = {0, 3}, h3[] = {3, 0}, e4[] = {0, 2, 1, 1}, h4[] = {1, 1, 2, 0};
    static const int eh4[] = {0, 2, 2, 0};
    static const struct {
        int layers;
        const int *lps;
        layout_t L;
    } cases[] = {
        {3, e3, {1, 1, 2, 0, 0, 8, 0, 0.25f, 0, 0}},
        {3, h3, {2, 2, 2, 1, 0, 8, 0, 0.25f, 0, 1}},
        {4, e4, {1, 1, 2, 0, 0, 8, 0, 0.25f, 2, 0}},
        {4, h4, {2, 2, 2, 1, 1, 8, 0, 0.25f, 2, 1}},
        {4, eh4, {2, 1, 2, 3, 0, 8, 0, 0.25f, 2, 0}},
    };
    make_data();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        g_layers = cases[i].layers;
        result_t ref = {0};
        layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
        reference_run(&one, &ref);
        g_lps = cases[i].lps;
        compare_to(&cases[i].L, &ref);
        g_lps = NULL;
        if (cases[i].lps == eh4) {
            layout_t one_rank = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
            g_lps = eh4;  // (the side with one stage reads no list)
            resume_case_to(&cases[i].L, &one_rank, &ref);
            resume_case_to(&one_rank, &cases[i].L, &ref);
            g_lps = NULL;
        }
        free_result(&ref);
    }
    g_layers = 0;
}
