#define _GNU_SOURCE  // mkstemps
// Trainer-level checks: the memory estimate (used by --dry-run for presets that cannot be
// allocated here) equals what a real trainer allocates, per category.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/train/trainer_internal.h"
#include "llama3d/llama3d.h"

static void write_tokens(const char *path, int n, int V) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++) {
        uint32_t id = (uint32_t)((i * 7919u) % (unsigned)V);
        fwrite(&id, 4, 1, f);
    }
    fclose(f);
}

static void check_estimate(int recompute, int micro, int accum, int T) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    l3d_train_config_default(ctx, &cfg);
    char path[] = "/tmp/l3d_test_trainer_XXXXXX.bin";
    int fd = mkstemps(path, 4);
    cr_assert(fd >= 0);
    close(fd);
    write_tokens(path, 4096, cfg.model.vocab_size);
    snprintf(cfg.data_path, sizeof(cfg.data_path), "%s", path);
    cfg.micro_batch_size = micro;
    cfg.grad_accum_steps = accum;
    cfg.train_batch_size = micro * accum;
    cfg.seq_len = T;
    cfg.activation_checkpointing = recompute;
    cfg.num_threads = 1;
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    l3d_mem_breakdown_t est, real;
    l3d_train_config_memory(&cfg, &est);
    l3d_trainer_t *t = NULL;
    cr_assert_eq(l3d_trainer_create(ctx, &cfg, &t), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    l3d_trainer_memory(t, &real);
    cr_assert_eq(est.params, real.params);
    cr_assert_eq(est.grads, real.grads);
    cr_assert_eq(est.optim, real.optim);
    cr_assert_eq(est.acts, real.acts, "activations: estimate %zu, allocated %zu", est.acts,
                 real.acts);
    // and the allocator's own accounting agrees for the arenas
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "grads"), est.grads);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "optim"), est.optim);
    l3d_step_stats_t s;
    cr_assert_eq(l3d_trainer_step(t, &s), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert(s.loss > 0 && s.grad_norm > 0 && s.step == 1);
    l3d_trainer_destroy(t);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), 0, "%zu bytes leaked", l3d_ctx_mem_in_use(ctx, NULL));
    l3d_ctx_destroy(ctx);
    unlink(path);
}

Test(trainer, memory_estimate_equals_allocation) { check_estimate(0, 4, 2, 32); }
Test(trainer, memory_estimate_equals_allocation_with_recompute) { check_estimate(1, 2, 1, 48); }

// clip_grad_norm_ semantics, values worked by hand: coef = max / (norm + 1e-6), only if < 1.
Test(trainer, clip_scale_by_hand) {
    cr_assert_eq(l3d_clip_scale(0.5, 1.0f), 1.0f);                // below the limit
    cr_assert_eq(l3d_clip_scale(0.999998, 1.0f), 1.0f);           // 1 / 0.999999 > 1: kept
    cr_assert_float_eq(l3d_clip_scale(1.0, 1.0f), 0.999999f, 1e-7f);     // 1 / 1.000001 < 1
    cr_assert_float_eq(l3d_clip_scale(4.0, 1.0f), 0.24999994f, 1e-8f);   // 1 / 4.000001
    cr_assert_float_eq(l3d_clip_scale(10.0, 2.5f), 0.24999997f, 1e-8f);  // 2.5 / 10.000001
    cr_assert_eq(l3d_clip_scale(1e9, 0.0f), 1.0f);                // 0 turns clipping off
    cr_assert_eq(l3d_clip_scale(3.0, -1.0f), 1.0f);
}

// Korthikanti et al. 2022 (arXiv 2205.05198), the reference for activation memory:
// per layer sbh(10 + 24/t + 5as/(ht)) bytes with tensor parallelism (their equation 2; the
// last term the stored attention scores), 34sbh/t with sequence parallelism and selective
// recomputation (equation 5), 16-bit activations, GPT shapes. What llama3d keeps of a layer
// (one block of the pipeline's layer pool) must not exceed it for their Table 3 models at
// tp 8, s 2048, b 1: flash attention stores no scores, Llama has no dropout masks, and
// SwiGLU's gate and up are kept where GPT keeps its MLP's 4h input and GELU output (the GPT
// model as plan_published.c builds it: F = 8h/3, heads = kv heads).
Test(trainer, layer_activations_within_korthikanti) {
    static const int shapes[][2] = {{6144, 64}, {12288, 96}, {20480, 128}, {25600, 160}};
    const double s = 2048, b = 1, t = 8;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        l3d_model_config_t mc;
        cr_assert_eq(l3d_model_config_preset(NULL, "llama3-8b", &mc), L3D_OK);
        double h = shapes[i][0], a = shapes[i][1];
        mc.hidden_size = shapes[i][0];
        mc.num_attention_heads = mc.num_key_value_heads = shapes[i][1];
        mc.head_dim = shapes[i][0] / shapes[i][1];
        mc.num_hidden_layers = 8;
        mc.intermediate_size = (int)(8.0 * h / 3 / 64 + 0.5) * 64;
        mc.vocab_size = 51200;
        mc.max_position_embeddings = 2048;
        mc.tie_word_embeddings = 1;
        for (int sp = 0; sp < 2; sp++) {
            size_t block = 0, work = 0;
            (void)l3d_acts_bytes_part(&mc, 8, 1, 1, 1, 0, NULL, 0, 1, 2048, 0, sp,
                                      L3D_BFLOAT16, L3D_BFLOAT16, 1, &block, &work, NULL);
            double ref = sp ? 34 * s * b * h / t : s * b * h * (10 + 24 / t);
            double ref_scores = ref + 5 * a * s * s * b / t;  // (stored scores, without SP)
            cr_assert(block > 0 && block <= ref, "h %g sp %d: a layer keeps %zu bytes, "
                      "Korthikanti %.0f", h, sp, block, ref);
            cr_assert(block < ref_scores);
            cr_log_info("h %g sp %d: %.2f of Korthikanti's", h, sp, block / ref);
        }
    }
}
