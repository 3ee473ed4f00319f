// The trainer's streams and its evaluation. Training reads train_view (the whole file, or its
// head when data.eval_fraction holds out the tail, which training then never reads), in order
// or shuffled; evaluation reads eval_view (that tail, or data.eval_path).
//
// Evaluation (l3d_trainer_eval) is a forward pass only -- no backward, no gradient, no
// optimizer state touched -- over train.eval_iters global batches of the eval stream: batch b
// is the in-order rule of core/train/data.h at step b over the eval stream with the training
// batch's shape (train_batch_size sequences of seq_len), split over dp ranks and micro-batches
// exactly as a training step splits its batch. Every evaluation reads the same batches
// 0 .. eval_iters-1 (unlike Megatron, whose validation iterator moves on), so successive eval
// losses measure the model, not the sample. The loss is the mean cross-entropy over all
// eval_iters * train_batch_size * seq_len target tokens, summed over the pipeline's last stage
// and the dp ranks as a step's loss is: the same on every rank and, up to float32 rounding,
// on every layout.
#include <math.h>
#include <string.h>

#include "core/train/data.h"
#include "core/train/trainer_internal.h"
#include "platform/platform.h"

l3d_status l3d_eval_init(l3d_trainer_t *t) {
    l3d_ctx_t *ctx = t->ctx;
    const l3d_train_config_t *cfg = &t->cfg;
    int T = cfg->seq_len;
    t->train_view = *t->data;
    if (cfg->eval_path[0]) {
        L3D_CHECK(ctx, l3d_dataset_load(ctx, cfg->eval_path, t->tok, cfg->model.vocab_size,
                                        &t->eval_data));
        L3D_CHECK(ctx, l3d_dataset_check(ctx, t->eval_data, T));
        t->eval_view = *t->eval_data;
        t->have_eval = 1;
    } else if (cfg->eval_fraction > 0.0) {
        size_t n = t->data->n_tokens;
        size_t tail = (size_t)floor((double)n * cfg->eval_fraction);
        int fits = tail >= (size_t)T + 1 && n - tail >= (size_t)T + 1;
        // A tail nobody asked for (the main job's default) gives way to a short data set:
        // training on all of it beats refusing it (l3d train prints that it did).
        if (!fits && cfg->eval_optional) return L3D_OK;
        if (!fits)
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s: data.eval_fraction %g of %zu tokens holds "
                             "out %zu and leaves %zu to train on; each needs at least seq_len + 1 "
                             "= %d", t->data->path, cfg->eval_fraction, n, tail, n - tail, T + 1);
        t->train_view.n_tokens = n - tail;
        t->eval_view = *t->data;
        t->eval_view.tokens = t->data->tokens + (n - tail);
        t->eval_view.n_tokens = tail;
        t->have_eval = 1;
    }
    return L3D_OK;
}

void l3d_eval_fini(l3d_trainer_t *t) {
    l3d_dataset_free(t->eval_data);
    t->eval_data = NULL;
}

static void load_rows(l3d_trainer_t *t, const l3d_dataset_t *ds, int shuffle, int64_t step,
                      int j) {
    const l3d_train_config_t *cfg = &t->cfg;
    int mb = cfg->micro_batch_size, T = cfg->seq_len;
    // dp rank r takes the global batch's micro-batches r*A .. r*A + A-1 (A = accumulation).
    int first = (t->dp.rank * cfg->grad_accum_steps + j) * mb;
    if (shuffle)
        l3d_dataset_batch_shuffled(ds, cfg->data_seed_set ? cfg->data_seed : cfg->seed, step,
                                   cfg->train_batch_size, T, first, mb, t->h_tokens,
                                   t->h_targets);
    else
        l3d_dataset_batch(ds, step, cfg->train_batch_size, T, first, mb, t->h_tokens,
                          t->h_targets);
}

void l3d_train_load_batch(l3d_trainer_t *t, int64_t step, int j) {
    load_rows(t, &t->train_view, t->cfg.shuffle, step, j);
}

static l3d_status eval_err(l3d_trainer_t *t, l3d_comm_t *c, l3d_status st, const char *what) {
    return l3d_error(t->ctx, st, "evaluation: pipeline %s: %s", what,
                     l3d_ctx_last_error(l3d_comm_ctx(c)));
}

// This stage's forward of eval batch b, micro-batch by micro-batch and chunk by chunk in the
// order (micro-batch, chunk): every stage runs its part of (j, c) after the stage before it,
// so the receives follow the sends and nothing waits on a later item. Each chunk reuses its
// first activation slot and sends from the pipeline's ring (l3d_pp_take_x).
static l3d_status eval_batch(l3d_trainer_t *t, int64_t b, double *sum) {
    l3d_pp_t *p = &t->pp;
    l3d_model_t *m = t->model;
    const l3d_train_config_t *cfg = &t->cfg;
    int A = cfg->grad_accum_steps, stage = m->pp_rank, pp = m->pp_size, U = pp * p->v;
    int up = (stage + 1) % pp, down = (stage - 1 + pp) % pp;
    int b0, nb;  // (2d: this grid row's sequences, C/q columns)
    l3d_model_batch_slice(m, cfg->micro_batch_size, &b0, &nb);
    size_t nl = (size_t)nb * cfg->seq_len, o = (size_t)b0 * cfg->seq_len;
    size_t ot = (size_t)l3d_model_target_first(m, cfg->micro_batch_size) * cfg->seq_len;
    size_t nc = nl * (size_t)m->C;
    if (m->tp.sp) nc /= (size_t)m->tp.size;
    l3d_status st;
    for (int j = 0; j < A; j++) {
        load_rows(t, &t->eval_view, 0, b, j);
        for (int c = 0; c < p->v; c++) {
            int slot = p->slot0[c], u = c * pp + stage;
            l3d_acts_t *a = p->slots[slot];
            l3d_request_t **send = NULL;
            if (u < U - 1) L3D_CHECK(t->ctx, l3d_pp_take_x(t, a, &send));
            // (the layer blocks are the slot's from the receive to the end of the forward)
            L3D_CHECK(t->ctx, l3d_pp_bind(t, slot));
            st = l3d_dev_copy(t->dev, a->tokens, t->h_tokens + o, nl * sizeof(int32_t),
                              L3D_COPY_H2D);
            if (st >= 0)
                st = l3d_dev_copy(t->dev, a->targets, t->h_targets + ot, nl * sizeof(int32_t),
                                  L3D_COPY_H2D);
            if (st >= 0 && u > 0 &&
                (st = l3d_comm_recv(p->comm, l3d_acts_input(a), nc, a->at, down)) < 0)
                st = eval_err(t, p->comm, st, "receive of activations");
            double s = 0.0;
            // grad_scale 0: the fused cross-entropy's logit gradient is not used.
            if (st >= 0) st = l3d_model_stage_forward(m, a, 0.0f, &s);
            l3d_pp_unbind(t, slot);
            L3D_CHECK(t->ctx, st);
            *sum += s;
            if (u < U - 1 && (st = l3d_comm_isend(p->comm, a->x_final, nc, a->at, up, send)) < 0)
                return eval_err(t, p->comm, st, "send of activations");
        }
    }
    return L3D_OK;
}

l3d_status l3d_trainer_eval(l3d_trainer_t *t, double *loss) {
    if (!t || !loss) return L3D_ERR_INVALID_ARG;
    l3d_ctx_t *ctx = t->ctx;
    const l3d_train_config_t *cfg = &t->cfg;
    *loss = NAN;
    if (!t->have_eval)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "evaluation: no eval stream; set "
                         "data.eval_path or data.eval_fraction");
    double sum = 0.0;
    // 16-bit weights: the passes read the float32 master rounded as it is now
    l3d_pp_pool_reset(&t->pp);
    l3d_status st = l3d_model_refresh_weights(t->model);
    for (int b = 0; b < cfg->eval_iters && st >= 0; b++) st = eval_batch(t, b, &sum);
    l3d_status s2 = l3d_pp_wait_sends(t);
    L3D_CHECK(ctx, st < 0 ? st : s2);
    // The loss lives on the last stage and is split over the dp ranks: every rank gets the sum.
    if (t->pp.comm) L3D_CHECK(ctx, l3d_dp_sum_double(t, t->pp.comm, &sum));
    L3D_CHECK(ctx, l3d_dp_sum_double(t, t->dp.comm, &sum));
    *loss = sum / ((double)cfg->eval_iters * cfg->train_batch_size * cfg->seq_len);
    return L3D_OK;
}

int l3d_trainer_has_eval(const l3d_trainer_t *t) { return t && t->have_eval; }
