#define _POSIX_C_SOURCE 200809L  // posix_memalign
// The smallest embedding of llama3d: a custom allocator and log callback, a tiny model
// trained for a few steps through the public API only.
#include <stdio.h>
#include <stdlib.h>

#include <llama3d/llama3d.h>

static size_t live_bytes;

static void *my_alloc(size_t size, size_t align, const char *tag, void *user) {
    void *p = NULL;
    if (posix_memalign(&p, align, size ? size : 1)) return NULL;
    live_bytes += size;
    return p;
}
static void my_free(void *p, size_t size, void *user) {
    live_bytes -= size;
    free(p);
}
static void my_log(l3d_log_level lvl, uint32_t subsys, const char *msg, void *user) {
    fprintf(stderr, "[consumer log] %s\n", msg);
}

int main(void) {
    l3d_allocator_t alloc = {my_alloc, my_free, NULL};
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.allocator = &alloc;
    p.log_fn = my_log;
    l3d_ctx_t *ctx;
    if (l3d_ctx_create(&p, &ctx) != L3D_OK) return 1;
    l3d_train_config_t cfg;
    l3d_train_config_default(ctx, &cfg);
    cfg.seq_len = 32;
    cfg.steps = 30;
    cfg.lr = 3e-3f;
    cfg.train_batch_size = cfg.micro_batch_size = 4;
    cfg.grad_accum_steps = 1;
    l3d_trainer_t *t = NULL;
    l3d_status st = l3d_train_config_finalize(ctx, &cfg);
    if (st == L3D_OK) st = l3d_trainer_create(ctx, &cfg, &t);
    double first = 0, last = 0;
    for (int i = 0; st == L3D_OK && i < cfg.steps; i++) {
        l3d_step_stats_t s;
        st = l3d_trainer_step(t, &s);
        if (i == 0) first = s.loss;
        last = s.loss;
    }
    if (st != L3D_OK) {
        fprintf(stderr, "consumer: %s: %s\n", l3d_strerror(st), l3d_ctx_last_error(ctx));
        return 1;
    }
    l3d_trainer_destroy(t);
    l3d_ctx_destroy(ctx);
    printf("consumer: loss %.4f -> %.4f, bytes still allocated %zu\n", first, last, live_bytes);
    return live_bytes == 0 && last < first ? 0 : 1;
}
