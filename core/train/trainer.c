// The training loop: micro-batches with gradient accumulation, global-norm clipping with
// torch.nn.utils.clip_grad_norm_ semantics, AdamW with torch.optim.AdamW semantics.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/config/config_train_internal.h"
#include "core/train/data.h"
#include "core/model/model_internal.h"
#include "core/train/trainer_internal.h"
#include "platform/platform.h"

// Model FLOPs per trained token of the whole model (PaLM's convention, as llm.c): 6 per
// matrix parameter for forward + backward, plus 12 * L * H * D * T for attention scores and
// values. The embedding is a lookup, not a matmul; the head is counted once.
static double flops_per_token(const l3d_model_config_t *c, int T) {
    double C = c->hidden_size, D = c->head_dim, HD = c->num_attention_heads * D;
    double KD = c->num_key_value_heads * D, F = c->intermediate_size;
    double layer = C * HD * 2 + C * KD * 2 + 3 * C * F;
    double mat = layer * c->num_hidden_layers + (double)c->vocab_size * C;
    return 6.0 * mat + 12.0 * c->num_hidden_layers * HD * (double)T;
}

static void mib_or_gib(char *out, size_t cap, uint64_t b) {
    if (b >= ((uint64_t)1 << 30)) snprintf(out, cap, "%.1f GiB", (double)b / (1 << 30));
    else snprintf(out, cap, "%.1f MiB", (double)b / (1 << 20));
}

// The whole training footprint against the memory it will come from, before anything is
// allocated: with overcommit a run that cannot fit is otherwise OOM-killed part way through
// filling its weights or optimizer state, and a GPU fails at an arbitrary allocation. A device
// with memory of its own (mem_info) is checked for the device part and the machine for the
// host part (offload); on the CPU devices both are the machine's. Ranks that are threads of
// this process (the in-process transport) share its memory, and for now its device too
// (device_index 0), so they count together; every rank checks before the mesh is built,
// which no rank passes until all have checked, so no rank has allocated when another one
// compares.
static uint64_t mem_dev(const l3d_mem_breakdown_t *m) {
    return (uint64_t)m->params + m->grads + m->optim + m->acts;
}
static uint64_t mem_host(const l3d_mem_breakdown_t *m) {
    return (uint64_t)m->host_params + m->host_grads + m->host_optim + m->host_acts;
}

l3d_status l3d_train_config_rank_stage(l3d_ctx_t *ctx, const l3d_train_config_t *cfg,
                                       int rank, int *stage) {
    int perm[3], size[3] = {cfg->tp, cfg->dp, cfg->pp}, coord[3];
    L3D_CHECK(ctx, l3d_mesh_order_parse(ctx, cfg->parallel_order, perm));
    l3d_mesh_coords(rank, size, perm, coord);
    *stage = coord[L3D_MESH_PP];
    return L3D_OK;
}

static l3d_status check_train_memory(l3d_ctx_t *ctx, const l3d_train_config_t *cfg,
                                     l3d_comm_t *world, const l3d_device_t *dev) {
    int threads = world && !strcmp(l3d_comm_transport_name(world), "local") ? l3d_comm_size(world)
                                                                            : 1;
    // This rank's pipeline stage: stages differ in layers, embedding and head, and in the
    // micro-batches they keep. Ranks as threads: every stage's tp x dp ranks, together.
    int stage = 0;
    if (world && threads == 1)
        L3D_CHECK(ctx, l3d_train_config_rank_stage(ctx, cfg, l3d_comm_rank(world), &stage));
    l3d_mem_breakdown_t m;
    l3d_train_config_memory_stage(cfg, stage, &m);
    uint64_t on_dev = mem_dev(&m), on_host = mem_host(&m);
    if (threads > 1) {  // (m is stage 0's)
        uint64_t per = (uint64_t)cfg->tp * (uint64_t)cfg->dp;
        on_dev *= per, on_host *= per;
        for (int s = 1; s < cfg->pp; s++) {
            l3d_mem_breakdown_t e;
            l3d_train_config_memory_stage(cfg, s, &e);
            on_dev += mem_dev(&e) * per, on_host += mem_host(&e) * per;
        }
    }
    char p[32], g[32], o[32], a[32], what[320];
    mib_or_gib(p, sizeof(p), m.params);
    mib_or_gib(g, sizeof(g), m.grads);
    mib_or_gib(o, sizeof(o), m.optim);
    mib_or_gib(a, sizeof(a), m.acts);
    int n = snprintf(what, sizeof(what), "training %s", cfg->model_source[0] ? cfg->model_source
                                                                              : cfg->model.name);
    if (threads > 1)
        n += snprintf(what + n, sizeof(what) - (size_t)n, " as %d ranks in this process, %s",
                      threads, cfg->pp > 1 ? "rank 0" : "each");
    else if (stage)
        n += snprintf(what + n, sizeof(what) - (size_t)n, ", pipeline stage %d", stage);
    snprintf(what + n, sizeof(what) - (size_t)n, " (parameters %s, gradients %s, optimizer %s, "
             "activations %s)", p, g, o, a);
    uint64_t free_b, total_b;
    if (l3d_dev_mem_info(dev, &free_b, &total_b) < 0)
        return l3d_mem_check(ctx, on_dev + on_host, what);
    char src[96];
    snprintf(src, sizeof(src), "free memory of device %s", dev->ops->name);
    L3D_CHECK(ctx, l3d_mem_check_with(ctx, on_dev, free_b, src, what));
    if (!on_host) return L3D_OK;
    snprintf(what, sizeof(what), "its offloaded part (host memory)%s",
             threads > 1 ? ", for every rank in this process" : "");
    return l3d_mem_check(ctx, on_host, what);
}

l3d_status l3d_trainer_create(l3d_ctx_t *ctx, const l3d_train_config_t *cfg,
                              l3d_trainer_t **trainer_p) {
    return l3d_trainer_create_parallel(ctx, cfg, NULL, trainer_p);
}

l3d_status l3d_trainer_create_parallel(l3d_ctx_t *ctx, const l3d_train_config_t *cfg,
                                       l3d_comm_t *world, l3d_trainer_t **trainer_p) {
    l3d_status st;
    l3d_trainer_t *t = l3d_calloc(ctx, 1, sizeof(*t), "other");
    if (!t) return L3D_ERR_NOMEM;
    t->ctx = ctx;
    t->cfg = *cfg;
    l3d_loss_scaler_init(&t->scaler, cfg);
    // The same checks as l3d_train_config_finalize (a no-op after it): `l3d train --dry-run`
    // and the run refuse the same layouts with the same message.
    L3D_CHECK_GOTO(ctx, l3d_train_config_check_layout(ctx, &t->cfg, t->cfg.origin[0] ?
                                                      t->cfg.origin : "train config"), st, err);
    cfg = &t->cfg;
    int v = l3d_train_config_v(cfg);
    int threads = cfg->num_threads ? cfg->num_threads : l3d_ctx_settings(ctx)->num_threads;
    l3d_device_params_t dp = {.num_threads = threads, .device_index = cfg->device_index,
                              .allow_tf32 = cfg->allow_tf32};
    L3D_CHECK_GOTO(ctx, l3d_device_create(ctx, cfg->device, &dp, &t->dev), st, err);
    L3D_CHECK_GOTO(ctx, check_train_memory(ctx, cfg, world, t->dev), st, err);
    L3D_CHECK_GOTO(ctx, l3d_mesh_create(ctx, world, cfg->dp, cfg->tp, cfg->pp,
                                        cfg->parallel_order, &t->mesh), st, err);
    L3D_CHECK_GOTO(ctx, l3d_mesh_set_device(t->mesh, t->dev), st, err);
    if (cfg->tp_mode == 2)
        L3D_CHECK_GOTO(ctx, l3d_model_create_2d(ctx, t->dev, &cfg->model,
                                                t->mesh->group[L3D_MESH_TP], cfg->pp, v,
                                                t->mesh->coord[L3D_MESH_PP],
                                                l3d_train_config_lps(cfg), &t->model), st, err);
    else if (cfg->tp_mode == 3)
        L3D_CHECK_GOTO(ctx, l3d_model_create_3d(ctx, t->dev, &cfg->model,
                                                t->mesh->group[L3D_MESH_TP], cfg->pp, v,
                                                t->mesh->coord[L3D_MESH_PP],
                                                l3d_train_config_lps(cfg), &t->model), st, err);
    else
        L3D_CHECK_GOTO(ctx, l3d_model_create_part(ctx, t->dev, &cfg->model,
                                                  t->mesh->group[L3D_MESH_TP], cfg->pp, v,
                                                  t->mesh->coord[L3D_MESH_PP],
                                                  l3d_train_config_lps(cfg), &t->model), st, err);
    // A model directory with weights: start from them (each rank reads its own shards).
    if (cfg->weights_dir[0])
        L3D_CHECK_GOTO(ctx, l3d_model_load(t->model, cfg->weights_dir), st, err);
    else
        L3D_CHECK_GOTO(ctx, l3d_model_init_weights(t->model, cfg->seed), st, err);
    if (cfg->sequence_parallel && cfg->tp > 1) t->model->tp.sp = 1;

    // The tokenizer is read only when some data is text (.bin holds ids already).
    const char *data = cfg->data_path[0] ? cfg->data_path : L3D_DEFAULT_DATA;
    int text = !l3d_dataset_is_bin(data) || (cfg->eval_path[0] && !l3d_dataset_is_bin(cfg->eval_path));
    if (cfg->tokenizer_path[0] && text)
        L3D_CHECK_GOTO(ctx, l3d_tokenizer_open(ctx, cfg->tokenizer_path, &t->tok), st, err);
    else
        L3D_CHECK_GOTO(ctx, l3d_tokenizer_create_bytes(ctx, &t->tok), st, err);
    L3D_CHECK_GOTO(ctx, l3d_dataset_load(ctx, data, t->tok, cfg->model.vocab_size, &t->data), st, err);
    L3D_CHECK_GOTO(ctx, l3d_dataset_check(ctx, t->data, cfg->seq_len), st, err);
    L3D_CHECK_GOTO(ctx, l3d_eval_init(t), st, err);

    L3D_CHECK_GOTO(ctx, l3d_dp_init(t, t->mesh->group[L3D_MESH_DP]), st, err);
    // 16-bit weights: the passes read a rounded copy of the float32 master (ZeRO-3: of its
    // pieces, core/train/trainer_zero3.c).
    L3D_CHECK_GOTO(ctx, l3d_model_set_weight_dtype(t->model, l3d_train_config_weight_dtype(cfg),
                                                   !t->dp.zero3), st, err);
    L3D_CHECK_GOTO(ctx, l3d_model_set_grad_dtype(t->model, t->dp.gt), st, err);
    // ZeRO-3 partitions the parameters now, before the optimizer state and the activations
    // exist: the whole model and all of those would otherwise be the run's peak.
    if (t->dp.zero3) L3D_CHECK_GOTO(ctx, l3d_zero3_init(t), st, err);
    // ZeRO-2 holds gradient shards and windows (l3d_zero2_init), no full arena.
    size_t gbytes = t->dp.zero2 ? 0 : t->dp.Ppad * l3d_dtype_size(t->dp.gt);
    size_t obytes = t->dp.shard_len * sizeof(float);
    if (gbytes) L3D_CHECK_GOTO(ctx, l3d_dev_alloc(t->dev, gbytes, "grads", &t->grads), st, err);
    // The optimizer state: on the device, or in host memory beside its master copy
    // (offload_optimizer; core/train/trainer_offload.c).
    L3D_CHECK_GOTO(ctx, l3d_offload_init(t), st, err);
    // ZeRO-1/2 under 16-bit weights keep the float32 master's pieces only (trainer_master.c).
    L3D_CHECK_GOTO(ctx, l3d_master_init(t), st, err);
    l3d_device_t *odev = t->off.optim ? t->off.hdev : t->dev;
    if (t->off.optim) {
        int pin = cfg->offload_optimizer_pin;
        L3D_CHECK_GOTO(ctx, l3d_dev_alloc_host(t->dev, obytes, pin, "host_optim",
                                               (void **)&t->adam_m), st, err);
        L3D_CHECK_GOTO(ctx, l3d_dev_alloc_host(t->dev, obytes, pin, "host_optim",
                                               (void **)&t->adam_v), st, err);
    } else {
        L3D_CHECK_GOTO(ctx, l3d_dev_alloc(t->dev, obytes, "optim", (void **)&t->adam_m), st, err);
        L3D_CHECK_GOTO(ctx, l3d_dev_alloc(t->dev, obytes, "optim", (void **)&t->adam_v), st, err);
    }
    L3D_CHECK_GOTO(ctx, l3d_dev_memset(odev, t->adam_m, 0, obytes), st, err);
    L3D_CHECK_GOTO(ctx, l3d_dev_memset(odev, t->adam_v, 0, obytes), st, err);
    L3D_CHECK_GOTO(ctx, l3d_pp_init(t), st, err);
    if (t->dp.zero3) l3d_zero3_arm(t);
    size_t n = (size_t)cfg->micro_batch_size * cfg->seq_len;
    t->h_tokens = l3d_malloc(ctx, n * sizeof(int32_t), "data");
    t->h_targets = l3d_malloc(ctx, n * sizeof(int32_t), "data");
    if (!t->h_tokens || !t->h_targets) {
        st = L3D_ERR_NOMEM;
        goto err;
    }
    // The roof is given, not measured here: measuring well takes half a second, which every
    // trainer (and every rank thread, contending for the same cores) would pay.
    t->peak_flops = cfg->peak_flops;
    t->flops_per_token = flops_per_token(&cfg->model, cfg->seq_len);
    *trainer_p = t;
    return L3D_OK;
err:
    l3d_trainer_destroy(t);
    return st;
}

void l3d_trainer_destroy(l3d_trainer_t *t) {
    if (!t) return;
    l3d_ctx_t *ctx = t->ctx;
    size_t n = (size_t)t->cfg.micro_batch_size * t->cfg.seq_len;
    l3d_free(ctx, t->h_targets, n * sizeof(int32_t), "data");
    l3d_free(ctx, t->h_tokens, n * sizeof(int32_t), "data");
    if (t->model) {
        size_t gbytes = t->dp.zero2 ? 0 : t->dp.Ppad * l3d_dtype_size(t->dp.gt);
        size_t obytes = t->dp.shard_len * sizeof(float);
        l3d_dp_fini(t);
        l3d_pp_fini(t);
        if (t->off.optim) {
            l3d_dev_free_host(t->dev, t->adam_v, obytes, t->cfg.offload_optimizer_pin, "host_optim");
            l3d_dev_free_host(t->dev, t->adam_m, obytes, t->cfg.offload_optimizer_pin, "host_optim");
        } else {
            l3d_dev_free(t->dev, t->adam_v, obytes, "optim");
            l3d_dev_free(t->dev, t->adam_m, obytes, "optim");
        }
        l3d_offload_fini(t);
        l3d_dev_free(t->dev, t->grads, gbytes, "grads");
    }
    l3d_mesh_destroy(t->mesh);
    l3d_eval_fini(t);
    l3d_dataset_free(t->data);
    l3d_tokenizer_destroy(t->tok);
    l3d_model_destroy(t->model);
    l3d_device_destroy(t->dev);
    l3d_free(ctx, t, sizeof(*t), "other");
}

float l3d_clip_scale(double norm, float max_norm) { return l3d_clip_coef(norm, max_norm); }

l3d_status l3d_trainer_step(l3d_trainer_t *t, l3d_step_stats_t *stats) {
    l3d_ctx_t *ctx = t->ctx;
    l3d_device_t *dev = t->dev;
    l3d_model_t *m = t->model;
    const l3d_train_config_t *cfg = &t->cfg;
    int Bg = cfg->train_batch_size, T = cfg->seq_len;
    double t0 = l3d_time_now();

    // (2d: the grid's rows and columns carry the tensor-parallel traffic; 3d: the cube's axes
    // and planes)
    l3d_comm_t *groups[5 + L3D_TP3D_COMMS] = {t->mesh->group[L3D_MESH_TP],
                                              t->mesh->group[L3D_MESH_DP],
                                              t->mesh->group[L3D_MESH_PP], m->tp.kv_comm,
                                              t->pp.emb_comm};
    int ngroups = 5 + l3d_tp_sub_comms(m, groups + 5);
    for (int g = 0; g < ngroups; g++) l3d_comm_reset_stats(groups[g]);
    if (t->dp.zero2)  // (in host memory when the optimizer is offloaded)
        L3D_CHECK(ctx, l3d_dev_memset(t->dp.stage ? t->off.hdev : dev, t->dp.gshard, 0,
                                      t->dp.shard_len * sizeof(float)));
    else
        L3D_CHECK(ctx, l3d_dev_memset(dev, t->grads, 0, t->dp.Ppad * l3d_dtype_size(t->dp.gt)));
    // Loss = mean over every target token of the global batch, so each micro-batch's
    // gradient is scaled by 1 / (global batch tokens), not by 1 / (micro-batch tokens), and
    // the data-parallel reduction is a plain sum. dp rank r takes the global batch's
    // micro-batches r*A .. r*A + A-1 (A = accumulation steps), through this pipeline stage.
    // fp16 loss scaling (core/train/loss_scaler.h): the backward starts from the loss times S, and
    // the update divides S out again. S is 1 without fp16; a dynamic S is a power of two, so
    // scaling and unscaling are exact and, without an overflow, the update is bit for bit the
    // unscaled one.
    float S = (float)t->scaler.scale;
    float grad_scale = (float)(1.0 / ((double)Bg * T)) * S;
    double loss_sum = 0.0;
    // 16-bit weights: round the float32 master as the last update (or a load) left it
    L3D_CHECK(ctx, l3d_model_refresh_weights(m));
    L3D_CHECK(ctx, l3d_pp_run(t, grad_scale, &loss_sum));
    L3D_CHECK(ctx, l3d_dp_reduce_finish(t));
    L3D_CHECK(ctx, l3d_dp_sum_double(t, t->dp.comm, &loss_sum));
    double loss = loss_sum / ((double)Bg * T);
    // With dynamic loss scaling a non-finite loss is one more overflow (DeepSpeed skips it).
    if (!isfinite(loss) && !t->scaler.dynamic)
        return l3d_error(ctx, L3D_ERR_DIVERGED, "step %d: loss is %g; lower the learning rate "
                         "or enable gradient_clipping", t->step + 1, loss);

    // The global sum of squares, left on the device for AdamW (devices/device.h, adamw): it
    // clips with it and skips a step whose norm is not finite, the same on every rank (an inf
    // or NaN anywhere reaches all of them through the sum). So the update follows the backward
    // with no host read of the norm; the host reads it after, once, for the loss scaler and
    // the log. A non-finite loss (dynamic loss scaling only) skips the update here.
    L3D_CHECK(ctx, l3d_dp_grad_sumsq(t));
    // the update as if it is applied: skipped steps move neither the LR schedule nor Adam's
    // step count (DeepSpeed steps neither on an overflow)
    int done = t->step - (int)t->scaler.skipped;
    float lr = l3d_train_config_lr(cfg, done);
    if (isfinite(loss)) {
        int k = done + 1;
        float bc1 = (float)(1.0 - pow(cfg->beta1, k)), bc2 = (float)(1.0 - pow(cfg->beta2, k));
        L3D_CHECK(ctx, l3d_dp_update(t, lr, bc1, bc2, (float)(1.0 / S)));
    }
    double sumsq = 0.0;
    L3D_CHECK(ctx, l3d_dp_norm_read(t, &sumsq));
    L3D_CHECK(ctx, l3d_dev_sync(dev));
    double norm = sqrt(sumsq) / S;
    int apply = 1;
    L3D_CHECK(ctx, l3d_loss_scaler_update(ctx, &t->scaler, !isfinite(sumsq) || !isfinite(loss),
                                          &apply));
    t->step++;
    double dt = l3d_time_now() - t0;
    // Evaluation after the update, outside the step's time (Megatron: every eval_interval
    // iterations, and once more after the last).
    double eval_loss = NAN, eval_dt = 0.0;
    if (cfg->eval_interval > 0 && t->have_eval &&
        (t->step % cfg->eval_interval == 0 || t->step == cfg->steps)) {
        double e0 = l3d_time_now();
        L3D_CHECK(ctx, l3d_trainer_eval(t, &eval_loss));
        eval_dt = l3d_time_now() - e0;
    }
    if (stats) {
        stats->step = t->step;
        stats->loss = loss;
        stats->lr = lr;
        stats->grad_norm = norm;
        stats->loss_scale = S;
        stats->skipped = !apply;
        stats->skipped_total = t->scaler.skipped;
        stats->step_time_s = dt;
        stats->tokens_per_s = (double)Bg * T / dt;
        // The roof is one rank's: the job's is that times the ranks.
        double ranks = (double)cfg->dp * cfg->tp * cfg->pp;
        stats->mfu = l3d_mfu_update(stats->tokens_per_s * t->flops_per_token / ranks,
                                    &t->peak_flops, &stats->peak_raised);
        stats->peak_flops = t->peak_flops;
        stats->eval_loss = eval_loss;
        stats->eval_time_s = eval_dt;
        stats->mem_peak = l3d_ctx_mem_peak(ctx);
        for (int g = 0; g < ngroups; g++) {
            l3d_comm_stats_t cs;
            l3d_comm_get_stats(groups[g], &cs);
            // the kv replica group, the 2d grid's rows and columns and the 3d cube's axes and
            // planes are part of tp, the tied-embedding group part of pp
            int grp = g == 3 || g >= 5 ? L3D_MESH_TP : g == 4 ? L3D_MESH_PP : g;
            if (g < 3) stats->comm_calls[grp] = stats->comm_bytes[grp] = 0;
            stats->comm_calls[grp] += cs.calls;
            stats->comm_bytes[grp] += cs.bytes;
        }
    }
    return L3D_OK;
}

int l3d_trainer_steps_done(const l3d_trainer_t *t) { return t->step; }
l3d_model_t *l3d_trainer_model(l3d_trainer_t *t) { return t->model; }
double l3d_trainer_gemm_peak(const l3d_trainer_t *t) { return t->peak_flops / 1e9; }
double l3d_trainer_flops_per_token(const l3d_trainer_t *t) { return t->flops_per_token; }
int64_t l3d_trainer_data_tokens(const l3d_trainer_t *t) { return (int64_t)t->data->n_tokens; }
int64_t l3d_trainer_train_tokens(const l3d_trainer_t *t) { return (int64_t)t->train_view.n_tokens; }
int64_t l3d_trainer_eval_tokens(const l3d_trainer_t *t) {
    return t->have_eval ? (int64_t)t->eval_view.n_tokens : 0;
}

// Parameter bytes per rank of model part m (dims set): the float32 arena and, under 16-bit
// weights, its rounded copy; ZeRO-1/2 under 16-bit weights (l3d_master16) the rounded
// parameters and the float32 master's shard floats (in host memory with offload_optimizer);
// ZeRO-3 (zero3: dp > 1) the float32 pieces, their rounded copy, and the persistent groups and
// the gather pool in the weights' dtype.
static size_t param_bytes(const l3d_model_t *m, const l3d_train_config_t *cfg, int dp,
                          int zero3, size_t shard) {
    size_t ew = l3d_dtype_size(l3d_train_config_weight_dtype(cfg));
    size_t copy = ew < sizeof(float) ? ew : 0;
    if (l3d_master16(cfg, dp))
        return m->n_params * ew + (cfg->offload_optimizer ? 0 : shard * sizeof(float));
    if (!zero3) return m->n_params * (sizeof(float) + copy);
    size_t sh, pers, pool;
    (void)l3d_zero3_sizes(m, cfg, dp, &sh, &pers, &pool);
    return sh * (sizeof(float) + copy) + (pers + pool) * ew;
}

// Per rank: the gradient arena is padded to a multiple of dp; ZeRO >= 1 keeps AdamW's
// exp_avg and exp_avg_sq for 1/dp of it (the sum of the buckets' pieces is Ppad / dp);
// ZeRO-2 keeps the gradient as that shard plus its windows; a 16-bit communication_data_type
// adds the scratch that converts the buckets in place.
void l3d_train_config_memory_stage(const l3d_train_config_t *cfg, int stage,
                                    l3d_mem_breakdown_t *mem) {
    // tp rank 0 holds the largest vocabulary block: its figures bound every rank's.
    l3d_model_t m;
    memset(&m, 0, sizeof(m));
    l3d_model_set_dims_mode(&m, &cfg->model, cfg->tp, cfg->tp_mode, 0);
    int v = l3d_train_config_v(cfg);
    l3d_model_set_stage(&m, cfg->pp, v, stage, l3d_train_config_lps(cfg));
    l3d_model_layout(&m);
    size_t P = m.n_params;
    size_t n = (size_t)(cfg->dp > 0 ? cfg->dp : 1);
    size_t Ppad = (P + n - 1) / n * n, shard = n > 1 && cfg->zero_stage >= 1 ? Ppad / n : P;
    l3d_dtype gt = l3d_train_config_grad_dtype(cfg);
    size_t ge = l3d_dtype_size(gt);
    mem->grads = Ppad * ge;
    // a 16-bit communication_data_type converts each bucket in place, through a scratch
    size_t longest = l3d_dp_bucket_floats(cfg->reduce_bucket_size, Ppad, (int)n);
    int z2 = l3d_train_config_zero2(cfg, (int)n);
    // ZeRO-2's longest piece: the offload staging's floats, and 16-bit windows' widened piece
    size_t piece = z2 ? l3d_zero2_max_piece(&m, l3d_zero_bucket_size(cfg), (int)n) : 0;
    if (z2) {
        size_t ring, own;
        int reserved, pair;
        double rbs = l3d_zero_bucket_size(cfg);
        l3d_zero2_buckets(&m, rbs, (int)n, NULL, &shard);
        size_t all = l3d_zero2_windows(&m, rbs, (int)n, cfg->overlap_comm, &ring, &own,
                                       &reserved, &pair);
        // the float32 shard, the windows in gt, and (16-bit windows) the widened chunk
        mem->grads = shard * sizeof(float) + (all - shard) * ge;
        if (gt != L3D_FLOAT32) mem->grads += l3d_zero2_pscratch_len(piece) * sizeof(float);
        longest = L3D_MAX(ring, own);
    }
    l3d_dtype cdt = l3d_dp_comm_dtype(cfg);
    if (n > 1 && cdt != gt)
        mem->grads += l3d_dp_cscratch_len(longest) * l3d_dtype_size(cdt);
    mem->optim = 2 * shard * sizeof(float);
    mem->params = param_bytes(&m, cfg, (int)n, n > 1 && cfg->zero_stage >= 3, shard);
    size_t staging = cfg->offload_optimizer ? piece : 0;
    l3d_offload_memory(cfg, z2, n > 1 && cfg->zero_stage >= 3, l3d_master16(cfg, (int)n), shard,
                       staging, mem);
    // Pipeline: the stage keeps up to its schedule's number of activation sets, per chunk, one
    // working set that they share (model_internal.h, l3d_acts_t.work), and the pool of layer
    // blocks its schedule's peak of live layers needs (trainer_pp.c).
    l3d_pp_kind kind = L3D_PP_1F1B;
    (void)l3d_pp_kind_parse(NULL, cfg->pp_schedule, &kind);
    if (cfg->pp == 1) kind = L3D_PP_1F1B;
    mem->acts = mem->host_acts = 0;
    size_t work = 0, block = 0;  // (the same for every chunk)
    int A = cfg->grad_accum_steps, chunk_layers[L3D_MAX_CHUNKS], slots[L3D_MAX_CHUNKS];
    for (int c = 0; c < v; c++) chunk_layers[c] = m.chunk_start[c + 1] - m.chunk_start[c];
    int peak = l3d_pp_peaks(kind, cfg->pp, v, stage, A, chunk_layers, slots);
    if (cfg->pp == 1) slots[0] = 1;
    for (int c = 0; c < v; c++) {
        size_t host = 0;
        mem->acts += (size_t)slots[c] * l3d_acts_bytes_part(&cfg->model, cfg->tp, cfg->tp_mode,
                                                            cfg->pp, v, stage,
                                                            l3d_train_config_lps(cfg), c,
                                                            cfg->micro_batch_size, cfg->seq_len,
                                                            l3d_train_config_ckpt(cfg),
                                                            cfg->sequence_parallel,
                                                            l3d_train_config_act_dtype(cfg),
                                                            l3d_train_config_weight_dtype(cfg), 1,
                                                            &block, &work, &host);
        mem->host_acts += (size_t)slots[c] * host;
    }
    mem->acts += work + (size_t)peak * block;
}

void l3d_train_config_memory(const l3d_train_config_t *cfg, l3d_mem_breakdown_t *mem) {
    l3d_train_config_memory_stage(cfg, 0, mem);
}

void l3d_trainer_memory(const l3d_trainer_t *t, l3d_mem_breakdown_t *mem) {
    const l3d_dp_t *d = &t->dp;
    mem->params = param_bytes(t->model, &t->cfg, d->n, d->zero3, d->shard_len);
    size_t c = d->cscratch ? d->cscratch_len : 0;  // c: 16-bit scratch elements
    size_t g = d->zero2 ? 0 : d->Ppad, f = 0;     // g: elements in gt; f: floats
    if (d->zero2) {
        f = d->shard_len + (d->pscratch ? d->pscratch_len : 0);
        g += d->ring_len + d->own_len;
    }
    mem->grads = g * l3d_dtype_size(d->gt) + f * sizeof(float) + c * l3d_dtype_size(d->cdt);
    mem->optim = 2 * t->dp.shard_len * sizeof(float);
    l3d_offload_memory(&t->cfg, d->zero2, d->zero3, d->master16, d->shard_len, d->stage_len, mem);
    mem->acts = mem->host_acts = 0;
    for (int i = 0; i < t->pp.nslots; i++) {
        mem->acts += t->pp.slots[i]->bytes;
        mem->host_acts += t->pp.slots[i]->host_bytes;
    }
    mem->acts += (size_t)t->pp.nblocks * t->pp.block_bytes;
}
