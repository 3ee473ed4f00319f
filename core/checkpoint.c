// Checkpoints: a directory in Hugging Face layout (config.json + model.safetensors) that
// transformers loads as is, plus optimizer.safetensors and trainer_state.json for resuming.
// A parallel run writes a sharded directory instead (core/checkpoint_dist.c), unless
// train.save_consolidated asks for this layout; loading takes either.
// A save builds the whole directory beside the target and swaps it in, so a run killed while
// saving leaves the previous checkpoint whole.
#include <jansson.h>
#include <stdio.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "core/checkpoint_check.h"
#include "core/checkpoint_dist.h"
#include "core/checkpoint_hf.h"
#include "core/checkpoint_open.h"
#include "core/checkpoint_publish.h"
#include "core/input.h"
#include "core/model_internal.h"
#include "core/safetensors.h"
#include "core/trainer_internal.h"
#include "platform/platform.h"

#define TRAINER_STATE_FORMAT "llama3d-trainer-1"

static l3d_status sys_error(l3d_ctx_t *ctx, int rc, const char *what, const char *path) {
    return l3d_error(ctx, L3D_ERR_IO, "%s %s: %s", what, path, strerror(-rc));
}

static void join(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

// Host view of a device arena (the arena itself on host devices, a copy otherwise).
static l3d_status host_view(l3d_model_t *m, const float *dev_arena, float **host_p) {
    if (l3d_dev_is_host(m->dev)) {
        *host_p = (float *)dev_arena;
        return L3D_OK;
    }
    size_t bytes = m->n_params * sizeof(float);
    float *h = l3d_malloc(m->ctx, bytes, "staging");
    if (!h) return L3D_ERR_NOMEM;
    l3d_status st = l3d_dev_copy(m->dev, h, dev_arena, bytes, L3D_COPY_D2H);
    if (st >= 0) st = l3d_dev_sync(m->dev);
    if (st < 0) {
        l3d_free(m->ctx, h, bytes, "staging");
        return st;
    }
    *host_p = h;
    return L3D_OK;
}
static void host_view_release(l3d_model_t *m, const float *dev_arena, float *h) {
    if (h && h != dev_arena) l3d_free(m->ctx, h, m->n_params * sizeof(float), "staging");
}

// Writes arena `a` as safetensors with the model's tensor names plus `suffix`.
static l3d_status write_arena(l3d_model_t *m, const float *a, const char *path, const char *suffix) {
    l3d_ctx_t *ctx = m->ctx;
    float *h = NULL;
    L3D_CHECK(ctx, host_view(m, a, &h));
    size_t n = (size_t)m->n_tensors;
    l3d_st_entry_t *e = l3d_calloc(ctx, n, sizeof(*e), "staging");
    char(*names)[80] = l3d_calloc(ctx, n, sizeof(*names), "staging");
    l3d_status st = L3D_ERR_NOMEM;
    if (e && names) {
        for (size_t i = 0; i < n; i++) {
            const l3d_param_t *p = &m->tensors[i];
            snprintf(names[i], sizeof(names[i]), "%s%s", p->name, suffix);
            e[i].name = names[i];
            e[i].ndim = p->ndim;
            e[i].shape[0] = p->shape[0];
            e[i].shape[1] = p->shape[1];
            e[i].data = h + p->offset;
        }
        const char *k[] = {"format"}, *v[] = {"pt"};
        st = l3d_st_write(ctx, path, e, n, k, v, 1);
    }
    l3d_free(ctx, names, n * sizeof(*names), "staging");
    l3d_free(ctx, e, n * sizeof(*e), "staging");
    host_view_release(m, a, h);
    return st;
}

// Reads a file set's tensors (m's names + suffix; this rank's shards only) into device arena
// `a`, through a host staging copy on devices without host memory.
static l3d_status read_set(l3d_model_t *m, const l3d_hf_set_t *set, float *a, const char *suffix) {
    l3d_ctx_t *ctx = m->ctx;
    int host = l3d_dev_is_host(m->dev);
    size_t bytes = m->n_params * sizeof(float);
    float *h = host ? a : l3d_malloc(ctx, bytes, "staging");
    l3d_status st = h ? L3D_OK : L3D_ERR_NOMEM;
    // The set's index was checked against the config (l3d_ckpt_check) before the model was
    // allocated; what is left to check is the values.
    if (st >= 0) st = l3d_hf_set_read(m, set, suffix, h);
    if (st >= 0 && !host) {
        st = l3d_dev_copy(m->dev, a, h, bytes, L3D_COPY_H2D);
        if (st >= 0) st = l3d_dev_sync(m->dev);
    }
    if (!host) l3d_free(ctx, h, bytes, "staging");
    return st;
}

// One safetensors file (an optimizer moment) into arena `a`.
static l3d_status read_file(l3d_model_t *m, float *a, const char *path, const char *suffix) {
    l3d_hf_set_t set;
    L3D_CHECK(m->ctx, l3d_hf_set_open_file(m->ctx, path, &set));
    l3d_status st = read_set(m, &set, a, suffix);
    l3d_hf_set_close(&set);
    return st;
}

static l3d_status write_text(l3d_ctx_t *ctx, const char *path, const char *text) {
    l3d_iovec_t io = {text, strlen(text)};
    int rc = l3d_file_write_atomic(path, &io, 1);
    return rc ? sys_error(ctx, rc, "writing", path) : L3D_OK;
}

// config.json and the weights as m->save says (core/checkpoint_hf.h), plus the tokenizer
// and generation files of the directory the weights came from.
static l3d_status write_model_files(l3d_model_t *m, const char *dir) {
    L3D_CHECK(m->ctx, l3d_ckpt_write_config(m, dir));
    float *h = NULL;
    L3D_CHECK(m->ctx, host_view(m, m->params, &h));
    l3d_status st = l3d_hf_save_weights(m, h, dir, (l3d_st_dtype)m->save.dtype,
                                        m->save.max_shard_bytes);
    host_view_release(m, m->params, h);
    if (st >= 0 && m->save.carry_from[0]) st = l3d_ckpt_carry_files(m->ctx, m->save.carry_from, dir);
    return st;
}

// Builds the directory in "<target>.tmp.<pid>" (`fill` writes into it) and swaps it in for
// the target: a directory llama3d wrote, or none (core/checkpoint_publish.h says which).
typedef l3d_status (*fill_fn)(void *arg, const char *tmpdir);
static l3d_status publish_dir(l3d_ctx_t *ctx, const char *dir, fill_fn fill, void *arg) {
    char target[1024], tmp[1100];
    L3D_CHECK(ctx, l3d_ckpt_target_resolve(ctx, dir, target, sizeof(target)));
    L3D_CHECK(ctx, l3d_ckpt_tmp_create(ctx, target, (int64_t)getpid(), tmp, sizeof(tmp)));
    l3d_status st = fill(arg, tmp);
    if (st >= 0) st = l3d_ckpt_tmp_publish(ctx, tmp, target);
    if (st < 0) l3d_ckpt_tmp_remove(tmp);
    return st;
}

static l3d_status fill_model(void *arg, const char *tmp) { return write_model_files(arg, tmp); }

l3d_status l3d_model_save(l3d_model_t *m, const char *dir) {
    if (!m || !dir)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_model_save: NULL %s",
                         !m ? "model" : "dir");
    L3D_CHECK(m->ctx, l3d_model_check_params(m, "l3d_model_save"));
    L3D_CHECK(m->ctx, publish_dir(m->ctx, dir, fill_model, m));
    l3d_log(m->ctx, L3D_LOG_INFO, L3D_SUBSYS_CKPT, "saved model to %s", dir);
    return L3D_OK;
}

// The architecture fields must agree; the name and init std may differ.
static l3d_status check_same_arch(l3d_ctx_t *ctx, const char *origin, const l3d_model_config_t *a,
                                  const l3d_model_config_t *b) {
#define SAME(field)                                                                        \
    if (a->field != b->field)                                                              \
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: %s is %g in the checkpoint but %g in the " \
                         "model", origin, #field, (double)a->field, (double)b->field)
    SAME(hidden_size);
    SAME(intermediate_size);
    SAME(num_hidden_layers);
    SAME(num_attention_heads);
    SAME(num_key_value_heads);
    SAME(head_dim);
    SAME(vocab_size);
    SAME(tie_word_embeddings);
    SAME(rms_norm_eps);
    SAME(rope_theta);
    SAME(rope_scaling_llama3);
#undef SAME
    return L3D_OK;
}

// The weights of a checkpoint whose index l3d_ckpt_check has accepted for m's config.
// Saves default to the dtype loaded and carry the source's tokenizer files.
static l3d_status load_weights(l3d_model_t *m, const char *dir) {
    if (l3d_ckpt_dist_is(dir)) {
        L3D_CHECK(m->ctx, l3d_ckpt_dist_read(m, dir, m->params, NULL, NULL));
        m->loaded.dtype = -1;  // float32, llama3d's own layout (l3d_model_weights_desc)
        m->loaded.files = 0;
    } else {
        l3d_hf_set_t set;
        L3D_CHECK(m->ctx, l3d_hf_set_open(m->ctx, dir, &set));
        l3d_status st = read_set(m, &set, m->params, "");
        m->loaded.dtype = set.mixed ? L3D_ST_F32 : set.dtype;
        m->loaded.mixed = set.mixed;
        m->loaded.files = set.n;
        l3d_hf_set_close(&set);
        L3D_CHECK(m->ctx, st);
    }
    // Saved as loaded; F64, mixed and llama3d's own float32 layout as float32.
    int dt = m->loaded.dtype;
    m->save.dtype = dt == L3D_ST_BF16 || dt == L3D_ST_F16 ? dt : L3D_ST_F32;
    snprintf(m->save.carry_from, sizeof(m->save.carry_from), "%s", dir);
    return L3D_OK;
}

const char *l3d_model_weights_desc(const l3d_model_t *m, char *buf, size_t cap) {
    if (!buf || !cap) return buf;
    if (!m || !m->loaded.files) {
        snprintf(buf, cap, "%s", m && m->loaded.dtype < 0 ? "f32, llama3d sharded checkpoint"
                                                            : "new");
        return buf;
    }
    const char *dt = m->loaded.mixed ? "mixed dtypes" : m->loaded.dtype == L3D_ST_BF16 ? "bf16"
                     : m->loaded.dtype == L3D_ST_F16 ? "f16" : "f32";
    if (m->loaded.files == 1) snprintf(buf, cap, "%s, 1 file", dt);
    else snprintf(buf, cap, "%s, %d shards", dt, m->loaded.files);
    return buf;
}

l3d_status l3d_model_load(l3d_model_t *m, const char *dir) {
    if (!m || !dir)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_model_load: NULL %s",
                         !m ? "model" : "dir");
    L3D_CHECK(m->ctx, l3d_model_check_params(m, "l3d_model_load"));
    char path[1200];  // a directory of up to 1100 bytes (tmp) and a file name
    l3d_model_config_t cfg;
    join(path, sizeof(path), dir, "config.json");
    L3D_CHECK(m->ctx, l3d_model_config_from_file(m->ctx, path, &cfg));
    L3D_CHECK(m->ctx, check_same_arch(m->ctx, path, &cfg, &m->cfg));
    L3D_CHECK(m->ctx, l3d_ckpt_check(m->ctx, dir, &m->cfg, 0));
    return load_weights(m, dir);
}

l3d_status l3d_model_open(l3d_ctx_t *ctx, l3d_device_t *dev, const char *dir,
                          l3d_model_t **model_p) {
    char path[1200];  // a directory of up to 1100 bytes (tmp) and a file name
    l3d_model_config_t cfg;
    if (!ctx || !dev || !dir || !model_p)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_model_open: NULL %s",
                         !ctx ? "ctx" : !dev ? "device (make one with l3d_device_create)"
                         : !dir ? "dir" : "model_p");
    L3D_CHECK(ctx, l3d_input_dir(ctx, dir, "checkpoint"));
    join(path, sizeof(path), dir, "config.json");
    L3D_CHECK(ctx, l3d_model_config_from_file(ctx, path, &cfg));
    // The files must hold what the config says before the config sizes an allocation.
    L3D_CHECK(ctx, l3d_ckpt_check(ctx, dir, &cfg, 0));
    l3d_model_t *m = NULL;
    L3D_CHECK(ctx, l3d_model_create(ctx, dev, &cfg, &m));
    l3d_status st = load_weights(m, dir);
    if (st < 0) {
        l3d_model_destroy(m);
        return st;
    }
    *model_p = m;
    return L3D_OK;
}

l3d_status l3d_infer_open(l3d_ctx_t *ctx, l3d_comm_t *world, int tp, int pp, l3d_device_t *dev,
                          const char *dir, int capacity, l3d_infer_t **inf_p) {
    if (!ctx || !dev || !dir || !inf_p || tp < 1 || pp < 1)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_infer_open: NULL argument or tp %d / "
                         "pp %d < 1", tp, pp);
    char path[1200];
    l3d_model_config_t cfg;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    L3D_CHECK(ctx, l3d_model_config_from_file(ctx, path, &cfg));
    // The files must hold what the config says before the config sizes an allocation.
    L3D_CHECK(ctx, l3d_ckpt_check(ctx, dir, &cfg, 0));
    l3d_infer_t *inf;
    L3D_CHECK(ctx, l3d_infer_create(ctx, world, tp, pp, dev, &cfg, capacity, &inf));
    l3d_status st = l3d_model_load(l3d_infer_model(inf), dir);  // this rank's slices only
    if (st < 0) {
        l3d_infer_destroy(inf);
        return st;
    }
    *inf_p = inf;
    return L3D_OK;
}

// ---- trainer state -----------------------------------------------------------------------
// The optimizer state in the single-rank layout: a checkpoint of any layout resumes in any
// other. A ZeRO-sharded run gathers the shards into full arenas first.
typedef struct ckpt_state {
    l3d_trainer_t *t;
    float *m, *v;  // this rank's arenas with every dp shard (the trainer's own when unsharded)
    // tensor parallelism: the single-rank model and its optimizer arenas (else NULL)
    l3d_model_t *full;
    float *fm, *fv;
} ckpt_state_t;

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
    L3D_CHECK(t->ctx, write_model_files(m, tmp));
    // Weights saved narrower than float32: the float32 masters go beside them, and a resume
    // reads those (it continues the run exactly; the model files serve and fine-tune as HF's).
    join(path, sizeof(path), tmp, L3D_CKPT_MASTER_FILE);
    if (m->save.dtype != L3D_ST_F32) L3D_CHECK(t->ctx, write_arena(m, m->params, path, ""));
    join(path, sizeof(path), tmp, "optimizer.safetensors");
    L3D_CHECK(t->ctx, write_arena(m, cs->full ? cs->fm : cs->m, path, ".exp_avg"));
    // exp_avg_sq goes to its own file: each file holds one arena's worth of names.
    join(path, sizeof(path), tmp, "optimizer_sq.safetensors");
    L3D_CHECK(t->ctx, write_arena(m, cs->full ? cs->fv : cs->v, path, ".exp_avg_sq"));
    return l3d_ckpt_write_state(t, tmp);
}

l3d_status l3d_ckpt_write_config(l3d_model_t *m, const char *dir) {
    char path[1200];  // a directory of up to 1100 bytes (tmp) and a file name
    char *json = NULL;
    L3D_CHECK(m->ctx, l3d_model_config_to_json(m->ctx, &m->cfg, &json));
    join(path, sizeof(path), dir, "config.json");
    l3d_status st = write_text(m->ctx, path, json);
    free(json);
    return st;
}

l3d_status l3d_ckpt_write_state(l3d_trainer_t *t, const char *tmp) {
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
    l3d_status st = write_text(t->ctx, path, text);
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
    cs->m = t->grads;  // ZeRO-2 has no gradient arena: a temporary too
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
    if (t->dp.zero2) l3d_dev_free(t->dev, cs->m, t->dp.Ppad * sizeof(float), "staging");
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
    for (int k = 0; k < 3; k++) l3d_model_copy_named(own->model, mine[k], cs->full, dst[k]);
    for (int s = 1; s < m->pp_size && st >= 0; s++) {
        stage_arrays_t tmp;
        st = stage_alloc(t, s, &tmp);
        float *arr[3] = {tmp.p, tmp.m, tmp.v};
        for (int k = 0; k < 3 && st >= 0; k++) {
            st = l3d_comm_recv(c, arr[k], tmp.model->n_params, L3D_FLOAT32, s);
            if (st >= 0) l3d_model_copy_named(tmp.model, arr[k], cs->full, dst[k]);
        }
        stage_release(t, &tmp);
    }
    return st;
}

static l3d_status save(l3d_trainer_t *t, const char *dir);

// ZeRO-3 keeps 1/dp of the parameters: a save (and a resume) works on them whole again for its
// duration (collective over dp), then they are partitioned back.
l3d_status l3d_trainer_save(l3d_trainer_t *t, const char *dir) {
    L3D_CHECK(t->ctx, l3d_zero3_materialize(t));
    l3d_status st = save(t, dir);
    l3d_status pst = l3d_zero3_partition(t);
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
        L3D_CHECK(t->ctx, l3d_ckpt_dist_save(t, dir));
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
    if (st >= 0 && writer) st = publish_dir(t->ctx, dir, fill_trainer, &cs);
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
    l3d_status st = l3d_zero3_materialize(t);
    if (st >= 0) st = resume(t, dir);
    l3d_status pst = l3d_zero3_partition(t);
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
    L3D_CHECK(ctx, check_same_arch(ctx, path, &ccfg, &m->cfg));
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
    st = load_weights(m, dir);
    join(path, sizeof(path), dir, L3D_CKPT_MASTER_FILE);
    if (st >= 0 && l3d_path_present(path)) st = read_file(m, m->params, path, "");
    join(path, sizeof(path), dir, "optimizer.safetensors");
    if (st >= 0) st = read_file(m, cs.m, path, ".exp_avg");
    join(path, sizeof(path), dir, "optimizer_sq.safetensors");
    if (st >= 0) st = read_file(m, cs.v, path, ".exp_avg_sq");
    if (st >= 0) st = l3d_dp_optim_scatter(t, cs.m, t->adam_m);
    if (st >= 0) st = l3d_dp_optim_scatter(t, cs.v, t->adam_v);
    full_optim_release(t, &cs);
    L3D_CHECK(ctx, st);
    t->step = nstep;
    t->scaler = ls;
    l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_CKPT, "resumed from %s at step %d", dir, nstep);
    return L3D_OK;
}
