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
