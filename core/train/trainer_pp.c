// Pipeline parallelism for the trainer: this stage's micro-batches in the order of the
// schedule (core/config/pipeline.h), activations and their gradients moving between neighbouring
// stages with point-to-point messages on the pp group.
//
// Per micro-batch j (of chunk c when interleaved), a slot holds the activations from F(j) to
// B(j); with v chunks the stage is virtual stages c * pp + stage, and "previous stage" / "next
// stage" below are the neighbours in that virtual order (stage 0's chunk c > 0 receives from
// the last stage's chunk c-1):
//   F(j)  first stage: embed the tokens; others: receive (N,C) from stage-1 into the first
//         layer's input (l3d_acts_input). Run this stage's layers. Last stage: loss; others:
//         isend x_final.
//   B(j)  last stage: from the loss; others: receive dL/dx_final (N,C) from stage+1 into dres.
//         Backward through this stage's layers; first stage: embedding; others: isend dres.
// What a stage sends comes from the working set's ring (L3D_PP_RING buffers per direction):
// a pass takes the next buffer once that buffer's previous send has completed, so a slot keeps
// only what its backward reads (the schedule's validation proves no wait can deadlock).
// With tied embeddings the first and last stages each hold the table (the last as the head)
// and sum its gradient once the backward of the step is done (Megatron's embedding group).
#include <string.h>

#include "core/train/trainer_internal.h"

static l3d_status comm_err(l3d_trainer_t *t, l3d_comm_t *c, l3d_status st, const char *what) {
    return l3d_error(t->ctx, st, "pipeline %s: %s", what, l3d_ctx_last_error(l3d_comm_ctx(c)));
}

void l3d_pp_pool_reset(l3d_pp_t *p) {
    for (int i = 0; i < p->nblocks; i++) p->free_blk[i] = p->nblocks - 1 - i;
    p->nfree = p->nblocks;
}

l3d_status l3d_pp_init(l3d_trainer_t *t) {
    l3d_pp_t *p = &t->pp;
    const l3d_train_config_t *cfg = &t->cfg;
    l3d_mesh_t *mesh = t->mesh;
    int pp = cfg->pp, stage = mesh->coord[L3D_MESH_PP], A = cfg->grad_accum_steps;
    p->comm = mesh->group[L3D_MESH_PP];
    l3d_pp_kind kind;
    L3D_CHECK(t->ctx, l3d_pp_kind_parse(t->ctx, cfg->pp_schedule, &kind));
    // One stage runs F(j), B(j) in turn: 1F1B with no warm-up, whatever the schedule says.
    if (pp == 1) kind = L3D_PP_1F1B;
    p->kind = kind;
    p->v = t->model->nchunks;
    size_t nops = 2 * (size_t)A * (size_t)p->v;
    int chunk_layers[L3D_MAX_CHUNKS], slots[L3D_MAX_CHUNKS];
    p->maxL = 1;
    for (int c = 0; c < p->v; c++) {
        chunk_layers[c] = t->model->chunk_start[c + 1] - t->model->chunk_start[c];
        p->maxL = L3D_MAX(p->maxL, chunk_layers[c]);
    }
    // (the schedule's peaks, as l3d_train_config_memory_stage counts them)
    p->nblocks = l3d_pp_peaks(kind, pp, p->v, stage, A, chunk_layers, slots);
    p->nslots = 0;
    for (int c = 0; c < p->v; c++) {
        p->slot0[c] = p->nslots;
        p->nslots += pp > 1 ? slots[c] : 1;
    }
    p->slot0[p->v] = p->nslots;
    p->slots = l3d_calloc(t->ctx, (size_t)p->nslots, sizeof(*p->slots), "other");
    p->ops = l3d_calloc(t->ctx, nops, sizeof(*p->ops), "other");
    p->free_blk = l3d_calloc(t->ctx, (size_t)p->nblocks + 1, sizeof(int), "other");
    p->held = l3d_calloc(t->ctx, (size_t)p->nslots * (size_t)p->maxL, sizeof(int), "other");
    if (!p->slots || !p->ops || !p->free_blk || !p->held) return L3D_ERR_NOMEM;
    int b0, nb;  // (2d: this grid row's sequences of each micro-batch)
    l3d_model_batch_slice(t->model, cfg->micro_batch_size, &b0, &nb);
    for (int c = 0; c < p->v; c++)
        for (int i = p->slot0[c]; i < p->slot0[c + 1]; i++)
            L3D_CHECK(t->ctx, l3d_acts_create_chunk(t->model, c, nb,
                                                    cfg->seq_len, l3d_train_config_ckpt(cfg),
                                                    l3d_train_config_act_dtype(cfg),
                                                    i ? p->slots[0] : NULL, 1, &p->slots[i]));
    t->acts = p->slots[0];
    p->block_bytes = l3d_acts_block_bytes(t->model, p->slots[0]);
    if (p->nblocks > 0 && p->block_bytes > 0)
        L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, (size_t)p->nblocks * p->block_bytes, "acts",
                                        &p->pool));
    l3d_pp_pool_reset(p);
    p->nops = l3d_pp_schedule(kind, pp, p->v, stage, A, p->ops);
    if (pp > 1 && cfg->model.tie_word_embeddings) {
        // Collective over the world: the first and last stage of each (dp, tp) place.
        int ends = stage == 0 || stage == pp - 1;
        int color = mesh->coord[L3D_MESH_DP] * cfg->tp + mesh->coord[L3D_MESH_TP];
        l3d_status st = l3d_comm_split(mesh->world, ends ? color : -1, stage, &p->emb_comm);
        if (st < 0) return comm_err(t, mesh->world, st, "embedding group");
        if (p->emb_comm) L3D_CHECK(t->ctx, l3d_comm_set_device(p->emb_comm, t->dev));
    }
    return L3D_OK;
}

void l3d_pp_fini(l3d_trainer_t *t) {
    l3d_pp_t *p = &t->pp;
    for (int i = 0; i < L3D_PP_RING; i++) {
        if (p->fsend[i]) (void)l3d_request_wait(p->fsend[i]);
        if (p->bsend[i]) (void)l3d_request_wait(p->bsend[i]);
    }
    for (int i = 0; p->slots && i < p->nslots; i++)
        if (t->model) l3d_acts_destroy(t->model, p->slots[i]);
    if (p->pool) l3d_dev_free(t->dev, p->pool, (size_t)p->nblocks * p->block_bytes, "acts");
    l3d_free(t->ctx, p->free_blk, ((size_t)p->nblocks + 1) * sizeof(int), "other");
    l3d_free(t->ctx, p->held, (size_t)p->nslots * (size_t)p->maxL * sizeof(int), "other");
    l3d_free(t->ctx, p->ops, 2 * (size_t)t->cfg.grad_accum_steps * (size_t)p->v * sizeof(*p->ops),
             "other");
    l3d_free(t->ctx, p->slots, (size_t)p->nslots * sizeof(*p->slots), "other");
    l3d_comm_destroy(p->emb_comm);
    memset(p, 0, sizeof(*p));
    t->acts = NULL;
}

static l3d_status wait_send(l3d_trainer_t *t, l3d_request_t **r) {
    if (!*r) return L3D_OK;
    l3d_status st = l3d_request_wait(*r);
    *r = NULL;
    return st < 0 ? comm_err(t, t->pp.comm, st, "send") : L3D_OK;
}

l3d_status l3d_pp_take_x(l3d_trainer_t *t, l3d_acts_t *a, l3d_request_t ***send) {
    l3d_pp_t *p = &t->pp;
    unsigned k = p->nf++ % L3D_PP_RING;
    L3D_CHECK(t->ctx, wait_send(t, &p->fsend[k]));
    a->x_final = a->xring[k];
    *send = &p->fsend[k];
    return L3D_OK;
}

static l3d_status take_dres(l3d_trainer_t *t, l3d_acts_t *a, l3d_request_t ***send) {
    l3d_pp_t *p = &t->pp;
    unsigned k = p->nb++ % L3D_PP_RING;
    L3D_CHECK(t->ctx, wait_send(t, &p->bsend[k]));
    a->dres = a->dring[k] ? a->dring[k] : a->dring[0];
    *send = &p->bsend[k];
    return L3D_OK;
}

l3d_status l3d_pp_bind(l3d_trainer_t *t, int slot) {
    l3d_pp_t *p = &t->pp;
    l3d_acts_t *a = p->slots[slot];
    if (p->nfree < a->L)  // (the schedule's peak says it cannot happen)
        return l3d_error(t->ctx, L3D_ERR_INTERNAL, "pipeline: %d layer blocks free, %d needed",
                         p->nfree, a->L);
    for (int l = 0; l < a->L; l++) {
        int b = p->free_blk[--p->nfree];
        p->held[(size_t)slot * (size_t)p->maxL + (size_t)l] = b;
        // (blocks of 0 bytes, where recomputation keeps nothing per layer: no pool)
        l3d_acts_bind(t->model, a, l, p->pool ? (char *)p->pool + (size_t)b * p->block_bytes
                                              : NULL);
    }
    return L3D_OK;
}

void l3d_pp_unbind(l3d_trainer_t *t, int slot) {
    l3d_pp_t *p = &t->pp;
    for (int l = p->slots[slot]->L - 1; l >= 0; l--)
        p->free_blk[p->nfree++] = p->held[(size_t)slot * (size_t)p->maxL + (size_t)l];
}

l3d_status l3d_pp_wait_sends(l3d_trainer_t *t) {
    l3d_pp_t *p = &t->pp;
    l3d_status st = L3D_OK;
    for (int i = 0; i < L3D_PP_RING; i++) {
        l3d_status s1 = wait_send(t, &p->fsend[i]), s2 = wait_send(t, &p->bsend[i]);
        if (st >= 0) st = s1 < 0 ? s1 : s2;
    }
    return st;
}

static l3d_status load_micro(l3d_trainer_t *t, l3d_acts_t *a, int j) {
    const l3d_train_config_t *cfg = &t->cfg;
    int b0, nb, T = cfg->seq_len;
    l3d_model_batch_slice(t->model, cfg->micro_batch_size, &b0, &nb);
    // (3d: the logits' rows are another slice than the tokens')
    size_t n = (size_t)nb * T, o = (size_t)b0 * T;
    size_t ot = (size_t)l3d_model_target_first(t->model, cfg->micro_batch_size) * T;
    l3d_train_load_batch(t, t->step, j);
    L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, a->tokens, t->h_tokens + o, n * sizeof(int32_t),
                                   L3D_COPY_H2D));
    return l3d_dev_copy(t->dev, a->targets, t->h_targets + ot, n * sizeof(int32_t),
                        L3D_COPY_H2D);
}

l3d_status l3d_pp_run(l3d_trainer_t *t, float grad_scale, double *loss_sum) {
    l3d_pp_t *p = &t->pp;
    l3d_model_t *m = t->model;
    int A = t->cfg.grad_accum_steps, stage = m->pp_rank, pp = m->pp_size;
    // Between stages the residual stream travels: this rank's rows with sequence parallelism.
    // (2d: this grid row's sequences, C/q columns)
    int b0, nb;
    l3d_model_batch_slice(m, t->cfg.micro_batch_size, &b0, &nb);
    size_t nc = (size_t)nb * t->cfg.seq_len * (size_t)m->C;
    if (m->tp.sp) nc /= (size_t)m->tp.size;
    double sum = 0.0;
    l3d_status st;
    // Chunk c of this stage is virtual stage u = c pp + stage of U: its input comes from the
    // stage before (stage 0's later chunks: from the last stage), its output goes to the next.
    int U = pp * p->v, up = (stage + 1) % pp, down = (stage - 1 + pp) % pp;
    l3d_pp_pool_reset(p);
    for (int k = 0; k < p->nops; k++) {
        l3d_pp_op_t o = p->ops[k];
        int c = o.chunk, u = c * pp + stage;
        int slot = p->slot0[c] + o.micro % (p->slot0[c + 1] - p->slot0[c]);
        l3d_acts_t *a = p->slots[slot];
        l3d_request_t **send = NULL;
        if (!o.backward) {
            if (u < U - 1) L3D_CHECK(t->ctx, l3d_pp_take_x(t, a, &send));
            L3D_CHECK(t->ctx, l3d_pp_bind(t, slot));
            L3D_CHECK(t->ctx, load_micro(t, a, o.micro));
            if (u > 0 && (st = l3d_comm_recv(p->comm, l3d_acts_input(a), nc, a->at, down)) < 0)
                return comm_err(t, p->comm, st, "receive of activations");
            double s = 0.0;
            L3D_CHECK(t->ctx, l3d_model_stage_forward(m, a, grad_scale, &s));
            sum += s;
            if (u < U - 1 && (st = l3d_comm_isend(p->comm, a->x_final, nc, a->at, up, send)) < 0)
                return comm_err(t, p->comm, st, "send of activations");
        } else {
            L3D_CHECK(t->ctx, take_dres(t, a, &send));
            l3d_dp_arm(t, a, o.micro == A - 1);
            if (u < U - 1 && (st = l3d_comm_recv(p->comm, a->dres, nc, a->at, up)) < 0)
                return comm_err(t, p->comm, st, "receive of gradients");
            L3D_CHECK(t->ctx, l3d_model_stage_backward(m, a, t->grads));
            l3d_pp_unbind(t, slot);  // (the device's stream orders the blocks' next writes)
            if (u > 0 && (st = l3d_comm_isend(p->comm, a->dres, nc, a->at, down, send)) < 0)
                return comm_err(t, p->comm, st, "send of gradients");
        }
    }
    L3D_CHECK(t->ctx, l3d_pp_wait_sends(t));
    if (p->emb_comm && !t->dp.zero2) {  // (ZeRO-2 sums the reduced pieces: trainer_zero2.c)
        // the embedding (first stage) and the tied head (last stage): one gradient
        const l3d_param_t *e = NULL;
        for (int i = 0; i < m->n_tensors && !e; i++)
            if (!strcmp(m->tensors[i].name, "model.embed_tokens.weight")) e = &m->tensors[i];
        void *g = e ? l3d_elem(t->grads, t->dp.gt, e->offset) : NULL;
        if (e && (st = l3d_comm_allreduce(p->emb_comm, g, g, e->numel, t->dp.gt, L3D_SUM)) < 0)
            return comm_err(t, p->emb_comm, st, "tied embedding gradient");
    }
    // The loss lives on the last stage: every stage gets the sum.
    if (p->comm) L3D_CHECK(t->ctx, l3d_dp_sum_double(t, p->comm, &sum));
    *loss_sum = sum;
    return L3D_OK;
}
