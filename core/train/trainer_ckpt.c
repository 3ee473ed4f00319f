// The trainer's checkpoints: what a save writes and a resume reads of the trainer's state.
// The trainer knows how ZeRO-3, offload and dp partition that state: it materializes, gathers
// and scatters it here and hands whole arenas (or, for a sharded save, its pieces through
// l3d_ckpt_dist_src_t) to the checkpoint code, which knows only the files
// (core/checkpoint/checkpoint_io.h, core/checkpoint/checkpoint_dist.h). trainer_state.json is the
// trainer's own. defines: l3d_trainer_save, l3d_trainer_resume
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint/checkpoint_check.h"
#include "core/checkpoint/checkpoint_dist.h"
#include "core/checkpoint/checkpoint_io.h"
#include "core/checkpoint/checkpoint_publish.h"
#include "core/input.h"
#include "core/model/model_internal.h"
#include "core/train/trainer_internal.h"
#include "platform/platform.h"

#define TRAINER_STATE_FORMAT "llama3d-trainer-1"

static void join(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

// The optimizer state in the single-rank layout: a checkpoint of any layout resumes in any
// other. A ZeRO-sharded run gathers the shards into full arenas first.
typedef struct ckpt_state {
    l3d_trainer_t *t;
    float *m, *v;  // this rank's arenas with every dp shard (the trainer's own when unsharded)
    // tensor parallelism: the single-rank model and its optimizer arenas (else NULL)
    l3d_model_t *full;
    float *fm, *fv;
} ckpt_state_t;

static l3d_status write_state(const l3d_trainer_t *t, const char *tmp);

static l3d_status fill_trainer(void *arg, const char *tmp) {
    ckpt_state_t *cs = arg;
    l3d_trainer_t *t = cs->t;
    l3d_model_t *m = cs->full ? cs->full : t->model;
    // train.save_dtype and save_max_shard_size; by default the dtype the weights came in.
    m->save = t->model->save;
    // ZeRO-3's stage3_gather_16bit_weights_on_model_save under 16-bit training writes the
    // weights in the training dtype (DeepSpeed's save_16bit_model); save_dtype still wins.
    l3d_dtype wt = l3d_train_config_weight_dtype(&t->cfg);
    if (t->cfg.zero_stage == 3 && t->cfg.stage3_gather_16bit_weights_on_model_save &&
        wt != L3D_FLOAT32)
        m->save.dtype = wt == L3D_BFLOAT16 ? L3D_ST_BF16 : L3D_ST_F16;
    if (t->cfg.save_dtype == L3D_SAVE_DTYPE_F32) m->save.dtype = L3D_ST_F32;
    if (t->cfg.save_dtype == L3D_SAVE_DTYPE_BF16) m->save.dtype = L3D_ST_BF16;
    if (t->cfg.save_max_shard_size) m->save.max_shard_bytes = t->cfg.save_max_shard_size;
    char path[1200];  // a directory of up to 1100 bytes (tmp) and a file name
    L3D_CHECK(t->ctx, l3d_ckpt_write_model_files(m, tmp));
    // Weights saved narrower than float32: the float32 masters go beside them, and a resume
    // reads those (it continues the run exactly; the model files serve and fine-tune as HF's).
    join(path, sizeof(path), tmp, L3D_CKPT_MASTER_FILE);
    if (m->save.dtype != L3D_ST_F32)
        L3D_CHECK(t->ctx, l3d_ckpt_write_arena(m, m->params, path, ""));
    join(path, sizeof(path), tmp, "optimizer.safetensors");
    L3D_CHECK(t->ctx, l3d_ckpt_write_arena(m, cs->full ? cs->fm : cs->m, path, ".exp_avg"));
    // exp_avg_sq goes to its own file: each file holds one arena's worth of names.
    join(path, sizeof(path), tmp, "optimizer_sq.safetensors");
    L3D_CHECK(t->ctx, l3d_ckpt_write_arena(m, cs->full ? cs->fv : cs->v, path, ".exp_avg_sq"));
    return write_state(t, tmp);
}

static l3d_status write_state(const l3d_trainer_t *t, const char *tmp) {
    char path[1200];  // a directory of up to 1100 bytes (tmp) and a file name
    const l3d_train_config_t *c = &t->cfg;
    json_t *s = json_pack("{s:s, s:i, s:I, s:i, s:i, s:i, s:i, s:s, s:I, s:{s:i, s:i, s:i, s:i}}",
                          "format",
                          TRAINER_STATE_FORMAT, "step", t->step, "seed", (json_int_t)t->cfg.seed,
                          "train_batch_size", t->cfg.train_batch_size,
                          "train_micro_batch_size_per_gpu", t->cfg.micro_batch_size,
                          "gradient_accumulation_steps", t->cfg.grad_accum_steps, "seq_len",
                          t->cfg.seq_len, "data", t->data->path, "data_tokens",
                          (json_int_t)t->data->n_tokens, "layout", "dp", c->dp, "tp", c->tp,
                          "pp", c->pp, "virtual_stages", t->model->nchunks);
    if (!s) return l3d_error(t->ctx, L3D_ERR_NOMEM, "building trainer_state.json");
    // The loss scaler's counters: a resumed run continues the same scale sequence, and its
    // LR schedule and Adam step count skip what was skipped.
    const l3d_loss_scaler_t *ls = &t->scaler;
    json_t *lsj = json_pack("{s:b, s:f, s:I, s:I, s:i, s:I}", "dynamic", ls->dynamic, "scale",
                            ls->scale, "iter",
                            (json_int_t)ls->iter, "last_overflow", (json_int_t)ls->last_overflow,
                            "hysteresis_left", ls->hysteresis_left, "skipped",
                            (json_int_t)ls->skipped);
    if (!lsj || json_object_set_new(s, "loss_scaler", lsj)) {
        json_decref(s);
        return l3d_error(t->ctx, L3D_ERR_NOMEM, "building trainer_state.json");
    }
    char *text = json_dumps(s, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(s);
    if (!text) return l3d_error(t->ctx, L3D_ERR_NOMEM, "building trainer_state.json");
    join(path, sizeof(path), tmp, "trainer_state.json");
    l3d_status st = l3d_ckpt_write_text(t->ctx, path, text);
    free(text);
    return st;
}

// Full-arena views of the optimizer state: the trainer's arenas, or (sharded) the gradient
// arena (free between steps) and a temporary for exp_avg_sq.
static l3d_status full_optim(l3d_trainer_t *t, ckpt_state_t *cs) {
    memset(cs, 0, sizeof(*cs));
    cs->t = t;
    if (!t->dp.sharded) {
        cs->m = t->adam_m;
        cs->v = t->adam_v;
        return L3D_OK;
    }
    // ZeRO-2 has no gradient arena, and a 16-bit one is too short: a temporary too
    if (t->dp.gt == L3D_FLOAT32) cs->m = t->grads;
    if (!cs->m)
        L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, t->dp.Ppad * sizeof(float), "staging",
                                        (void **)&cs->m));
    return l3d_dev_alloc(t->dev, t->dp.Ppad * sizeof(float), "staging", (void **)&cs->v);
}

// The single-rank model (its parameters arena) and two optimizer arenas of its size.
static l3d_status full_model(l3d_trainer_t *t, ckpt_state_t *cs) {
    L3D_CHECK(t->ctx, l3d_model_create(t->ctx, t->dev, &t->model->cfg, &cs->full));
    size_t bytes = cs->full->n_params * sizeof(float);
    L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, bytes, "staging", (void **)&cs->fm));
    return l3d_dev_alloc(t->dev, bytes, "staging", (void **)&cs->fv);
}

static void full_optim_release(l3d_trainer_t *t, ckpt_state_t *cs) {
    if (t->dp.sharded) l3d_dev_free(t->dev, cs->v, t->dp.Ppad * sizeof(float), "staging");
    if (t->dp.sharded && cs->m && cs->m != t->grads)
        l3d_dev_free(t->dev, cs->m, t->dp.Ppad * sizeof(float), "staging");
    if (cs->full) {
        size_t bytes = cs->full->n_params * sizeof(float);
        l3d_dev_free(t->dev, cs->fv, bytes, "staging");
        l3d_dev_free(t->dev, cs->fm, bytes, "staging");
        l3d_model_destroy(cs->full);
    }
}

// One pipeline stage's tensors in the tp-1 layout: parameters, exp_avg, exp_avg_sq.
typedef struct stage_arrays {
    l3d_model_t *model;  // owned when `own`
    float *p, *m, *v;
    int own;
} stage_arrays_t;

static l3d_status stage_alloc(l3d_trainer_t *t, int stage, stage_arrays_t *sa) {
    memset(sa, 0, sizeof(*sa));
    sa->own = 1;
    L3D_CHECK(t->ctx, l3d_model_create_part(t->ctx, t->dev, &t->model->cfg, NULL,
                                            t->model->pp_size, t->model->nchunks, stage,
                                            l3d_train_config_lps(&t->cfg), &sa->model));
    size_t bytes = sa->model->n_params * sizeof(float);
    sa->p = sa->model->params;
    L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, bytes, "staging", (void **)&sa->m));
    return l3d_dev_alloc(t->dev, bytes, "staging", (void **)&sa->v);
}

static void stage_release(l3d_trainer_t *t, stage_arrays_t *sa) {
    if (!sa->own || !sa->model) return;
    size_t bytes = sa->model->n_params * sizeof(float);
    l3d_dev_free(t->dev, sa->v, bytes, "staging");
    l3d_dev_free(t->dev, sa->m, bytes, "staging");
    l3d_model_destroy(sa->model);
    memset(sa, 0, sizeof(*sa));
}

// Stage writers send their three arrays to world rank 0 (stage 0's writer), which places them
// into the whole model by name.
static l3d_status pp_collect(l3d_trainer_t *t, ckpt_state_t *cs, const stage_arrays_t *own) {
    l3d_model_t *m = t->model;
    l3d_comm_t *c = t->pp.comm;
    l3d_status st = L3D_OK;
    if (m->pp_rank != 0) {
        size_t n = own->model->n_params;
        const float *arr[3] = {own->p, own->m, own->v};
        for (int k = 0; k < 3 && st >= 0; k++)
            st = l3d_comm_send(c, arr[k], n, L3D_FLOAT32, 0);
        return st;
    }
    L3D_CHECK(t->ctx, full_model(t, cs));
    float *dst[3] = {cs->full->params, cs->fm, cs->fv};
    const float *mine[3] = {own->p, own->m, own->v};
    for (int k = 0; k < 3; k++)
        L3D_CHECK(t->ctx, l3d_model_copy_named(own->model, mine[k], cs->full, dst[k]));
    for (int s = 1; s < m->pp_size && st >= 0; s++) {
        stage_arrays_t tmp;
        st = stage_alloc(t, s, &tmp);
        float *arr[3] = {tmp.p, tmp.m, tmp.v};
        for (int k = 0; k < 3 && st >= 0; k++) {
            st = l3d_comm_recv(c, arr[k], tmp.model->n_params, L3D_FLOAT32, s);
            if (st >= 0) st = l3d_model_copy_named(tmp.model, arr[k], cs->full, dst[k]);
        }
        stage_release(t, &tmp);
    }
    return st;
}

// ---- the sharded save's view of this rank's state (core/checkpoint/checkpoint_dist.h)
// ----------------
// This rank's pieces: the ZeRO pieces when sharded, else the arena split into dp ranges (the
// optimizer state then sits at the arena offset).
static void dist_piece(const void *arg, int k, size_t *lo, size_t *hi, size_t *sh) {
    const l3d_trainer_t *t = arg;
    if (t->dp.sharded) {
        l3d_dp_piece(t, k, lo, hi, sh);
        return;
    }
    size_t P = t->model->n_params, n = (size_t)t->dp.n, r = (size_t)t->dp.rank;
    *lo = P * r / n;
    *hi = P * (r + 1) / n;
    *sh = *lo;
}

static l3d_status dist_state(const void *arg, const char *tmpdir) {
    return write_state(arg, tmpdir);
}

static l3d_status dist_save(l3d_trainer_t *t, const char *dir) {
    l3d_ckpt_dist_src_t src = {
        .ctx = t->ctx,
        .model = t->model,
        .world = t->mesh->world,
        .exp_avg = t->adam_m,
        .exp_avg_sq = t->adam_v,
        .optim_len = t->dp.shard_len,
        .pieces = t->dp.sharded ? l3d_dp_pieces(t) : 1,
        .piece = dist_piece,
        .write_state = dist_state,
        .arg = t,
        .dp_rank = t->dp.rank,
    };
    return l3d_ckpt_dist_save(&src, dir);
}

static l3d_status save(l3d_trainer_t *t, const char *dir);

// ZeRO-3 keeps 1/dp of the parameters, ZeRO-1/2 under 16-bit weights 1/dp of the float32
// master: a save (and a resume) works on them whole again for its duration (collective over
// dp), then they are partitioned back.
l3d_status l3d_trainer_save(l3d_trainer_t *t, const char *dir) {
    L3D_CHECK(t->ctx, l3d_dp_params_whole(t));
    l3d_status st = save(t, dir);
    l3d_status pst = l3d_dp_params_part(t);
    return st < 0 ? st : pst;
}

static l3d_status save(l3d_trainer_t *t, const char *dir) {
    l3d_comm_t *w = t->mesh->world;
    // ZeRO-3's stage3_gather_16bit_weights_on_model_save gathers the partitioned weights into
    // one model directory on save, as train.save_consolidated does, in the weights' dtype
    // (DeepSpeed saves the module's state dict: float32 while training runs in float32).
    int consolidated = t->cfg.save_consolidated ||
                       (t->cfg.zero_stage == 3 && t->cfg.stage3_gather_16bit_weights_on_model_save);
    if (w && l3d_comm_size(w) > 1 && !consolidated) {
        L3D_CHECK(t->ctx, dist_save(t, dir));
        l3d_log(t->ctx, L3D_LOG_INFO, L3D_SUBSYS_CKPT, "saved sharded checkpoint at step %d to "
                "%s (%d ranks)", t->step, dir, l3d_comm_size(w));
        return L3D_OK;
    }
    ckpt_state_t cs;
    l3d_model_t *m = t->model;
    int stage_writer = t->dp.rank == 0 && m->tp.rank == 0, writer = stage_writer && m->pp_rank == 0;
    l3d_status st = full_optim(t, &cs);
    if (st >= 0) st = l3d_dp_optim_gather(t, t->adam_m, cs.m);
    if (st >= 0) st = l3d_dp_optim_gather(t, t->adam_v, cs.v);
    // This stage in the tp-1 layout on its writer: tensor-parallel shards are gathered by dp
    // rank 0's tp group (the other dp replicas hold the same shards).
    stage_arrays_t own = {m, m->params, cs.m, cs.v, 0};
    if (st >= 0 && m->tp.size > 1 && t->dp.rank == 0) {
        if (stage_writer) st = stage_alloc(t, m->pp_rank, &own);
        if (st >= 0) st = l3d_model_tp_gather(m, m->params, own.model, stage_writer ? own.p : NULL);
        if (st >= 0) st = l3d_model_tp_gather(m, cs.m, own.model, stage_writer ? own.m : NULL);
        if (st >= 0) st = l3d_model_tp_gather(m, cs.v, own.model, stage_writer ? own.v : NULL);
    }
    // The whole model on world rank 0: this stage is all of it, or the stages send theirs.
    if (st >= 0 && stage_writer) {
        if (m->pp_size > 1) {
            st = pp_collect(t, &cs, &own);
        } else if (own.own) {
            cs.full = own.model;  // released with cs
            cs.fm = own.m;
            cs.fv = own.v;
            own.own = 0;
        }
    }
    // One rank writes; the agreement below returns on every rank only once the directory is
    // published (or tells them all that it failed).
    if (st >= 0 && writer) st = l3d_ckpt_publish_dir(t->ctx, dir, fill_trainer, &cs);
    stage_release(t, &own);
    full_optim_release(t, &cs);
    l3d_comm_t *world = t->mesh->world;
    if (world && l3d_comm_size(world) > 1) {
        int32_t ok = st >= 0, all_ok = 0;
        l3d_status cst = l3d_comm_allreduce(world, &ok, &all_ok, 1, L3D_INT32, L3D_MIN);
        if (st >= 0 && cst < 0)
            st = l3d_error(t->ctx, cst, "save: %s", l3d_ctx_last_error(l3d_comm_ctx(world)));
        if (st >= 0 && cst >= 0 && !all_ok)
            st = l3d_error(t->ctx, L3D_ERR_IO, "save: another rank failed to write %s", dir);
    }
    L3D_CHECK(t->ctx, st);
    l3d_log(t->ctx, L3D_LOG_INFO, L3D_SUBSYS_CKPT, "saved checkpoint at step %d to %s", t->step,
            dir);
    return L3D_OK;
}

// Resuming must see the same run: the batch shape decides which tokens each step reads.
static l3d_status check_state_int(l3d_ctx_t *ctx, const char *path, json_t *s, const char *key,
                                  long long want) {
    json_t *v = json_object_get(s, key);
    if (!json_is_integer(v))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: '%s' is missing or not an integer", path, key);
    if (json_integer_value(v) != want)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: the checkpoint was trained with %s %lld but "
                         "this run has %lld; resume with the same value", path, key,
                         (long long)json_integer_value(v), want);
    return L3D_OK;
}

static l3d_status resume(l3d_trainer_t *t, const char *dir);

// Every rank resumes or none does: a rank that cannot read the checkpoint must not leave the
// others waiting in their first step.
l3d_status l3d_trainer_resume(l3d_trainer_t *t, const char *dir) {
    t->model->wp_fresh = 0;  // (params are about to change)
    l3d_status st = l3d_dp_params_whole(t);
    if (st >= 0) st = resume(t, dir);
    l3d_status pst = l3d_dp_params_part(t);
    if (st >= 0) st = pst;
    if (st >= 0) st = l3d_offload_pull(t);  // the offloaded master follows the weights read
    l3d_comm_t *world = t->mesh->world;
    if (!world || l3d_comm_size(world) == 1) return st;
    int32_t ok = st >= 0, all_ok = 0;
    l3d_status cst = l3d_comm_allreduce(world, &ok, &all_ok, 1, L3D_INT32, L3D_MIN);
    if (st < 0) return st;
    if (cst < 0)
        return l3d_error(t->ctx, cst, "resume: %s", l3d_ctx_last_error(l3d_comm_ctx(world)));
    if (!all_ok)
        return l3d_error(t->ctx, L3D_ERR_IO, "resume: another rank failed to read %s", dir);
    return L3D_OK;
}

// trainer_state.json's "loss_scaler" (absent in checkpoints written before it existed: the
// scaler starts fresh and no step counts as skipped). The counters must fit the step count.
// A dynamic scale continues from a dynamic one; otherwise the run keeps its own scale, but
// always the checkpoint's skip count (the LR schedule's position depends on it).
static l3d_status read_scaler(l3d_ctx_t *ctx, const char *path, json_t *o, int nstep,
                              l3d_loss_scaler_t *ls) {
    if (!o) return L3D_OK;
    json_t *scale = json_object_get(o, "scale"), *iter = json_object_get(o, "iter"),
           *last = json_object_get(o, "last_overflow"), *hyst = json_object_get(o, "hysteresis_left"),
           *skip = json_object_get(o, "skipped");
    if (!json_is_number(scale) || !json_is_integer(iter) || !json_is_integer(last) ||
        !json_is_integer(hyst) || !json_is_integer(skip) || !(json_number_value(scale) > 0) ||
        !isfinite(json_number_value(scale)) || json_integer_value(skip) < 0 ||
        json_integer_value(skip) > nstep || json_integer_value(iter) < 0 ||
        json_integer_value(iter) > nstep || json_integer_value(last) < -1 ||
        json_integer_value(last) >= json_integer_value(iter) ||
        json_integer_value(hyst) < 1)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: 'loss_scaler' is malformed or does not fit "
                         "step %d", path, nstep);
    ls->skipped = json_integer_value(skip);
    if (!ls->dynamic || !json_is_true(json_object_get(o, "dynamic"))) return L3D_OK;
    ls->scale = json_number_value(scale);
    ls->iter = json_integer_value(iter);
    ls->last_overflow = json_integer_value(last);
    ls->hysteresis_left = (int)L3D_MIN(json_integer_value(hyst), (json_int_t)ls->hysteresis);
    return L3D_OK;
}

static l3d_status resume(l3d_trainer_t *t, const char *dir) {
    l3d_ctx_t *ctx = t->ctx;
    char path[1200];  // a directory of up to 1100 bytes (tmp) and a file name
    L3D_CHECK(ctx, l3d_input_dir(ctx, dir, "resume:"));
    join(path, sizeof(path), dir, "trainer_state.json");
    json_t *s;
    L3D_CHECK(ctx, l3d_input_json(ctx, path, NULL, 0, &s));
    l3d_status st = L3D_OK;
    json_t *fmt = json_object_get(s, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), TRAINER_STATE_FORMAT))
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: format is not '%s'", path, TRAINER_STATE_FORMAT);
    if (st >= 0) st = check_state_int(ctx, path, s, "train_batch_size", t->cfg.train_batch_size);
    if (st >= 0) st = check_state_int(ctx, path, s, "seq_len", t->cfg.seq_len);
    if (st >= 0) st = check_state_int(ctx, path, s, "data_tokens", (long long)t->data->n_tokens);
    json_t *step = json_object_get(s, "step");
    if (st >= 0 && (!json_is_integer(step) || json_integer_value(step) < 0 ||
                    json_integer_value(step) > (1 << 30)))
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: 'step' is missing or out of range", path);
    if (st >= 0) st = l3d_ckpt_check_layout(ctx, path, s, 0);
    int nstep = st >= 0 ? (int)json_integer_value(step) : 0;
    l3d_loss_scaler_t ls = t->scaler;
    if (st >= 0) st = read_scaler(ctx, path, json_object_get(s, "loss_scaler"), nstep, &ls);
    json_decref(s);
    L3D_CHECK(ctx, st);
    // The checkpoint's model must be this run's, and its files must hold all of it (weights
    // and both moments), before anything is staged for it.
    l3d_model_t *m = t->model;
    l3d_model_config_t ccfg;
    join(path, sizeof(path), dir, "config.json");
    L3D_CHECK(ctx, l3d_model_config_from_file(ctx, path, &ccfg));
    L3D_CHECK(ctx, l3d_ckpt_check_same_arch(ctx, path, &ccfg, &m->cfg));
    L3D_CHECK(ctx, l3d_ckpt_check(ctx, dir, &m->cfg, 1));
    ckpt_state_t cs;
    L3D_CHECK(ctx, full_optim(t, &cs));
    if (l3d_ckpt_dist_is(dir)) {  // sharded: every rank picks its own parts
        st = l3d_ckpt_dist_read(m, dir, m->params, cs.m, cs.v);
        snprintf(m->save.carry_from, sizeof(m->save.carry_from), "%s", dir);
        if (st >= 0) st = l3d_dp_optim_scatter(t, cs.m, t->adam_m);
        if (st >= 0) st = l3d_dp_optim_scatter(t, cs.v, t->adam_v);
        full_optim_release(t, &cs);
        L3D_CHECK(ctx, st);
        t->step = nstep;
        t->scaler = ls;
        l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_CKPT, "resumed from sharded %s at step %d", dir,
                nstep);
        return L3D_OK;
    }
    // Any layout reads the single-rank layout: each rank converts only its own shards (the
    // float32 masters instead of narrower weights when the save kept them).
    st = l3d_ckpt_load_weights(m, dir);
    join(path, sizeof(path), dir, L3D_CKPT_MASTER_FILE);
    if (st >= 0 && l3d_path_present(path)) st = l3d_ckpt_read_file(m, m->params, path, "");
    join(path, sizeof(path), dir, "optimizer.safetensors");
    if (st >= 0) st = l3d_ckpt_read_file(m, cs.m, path, ".exp_avg");
    join(path, sizeof(path), dir, "optimizer_sq.safetensors");
    if (st >= 0) st = l3d_ckpt_read_file(m, cs.v, path, ".exp_avg_sq");
    if (st >= 0) st = l3d_dp_optim_scatter(t, cs.m, t->adam_m);
    if (st >= 0) st = l3d_dp_optim_scatter(t, cs.v, t->adam_v);
    full_optim_release(t, &cs);
    L3D_CHECK(ctx, st);
    t->step = nstep;
    t->scaler = ls;
    l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_CKPT, "resumed from %s at step %d", dir, nstep);
    return L3D_OK;
}
