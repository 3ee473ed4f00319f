// Checkpoints: a directory in Hugging Face layout (config.json + model.safetensors) that
// transformers loads as is, plus optimizer.safetensors and trainer_state.json for resuming.
// A parallel run writes a sharded directory instead (core/checkpoint/checkpoint_dist.c), unless
// train.save_consolidated asks for this layout; loading takes either.
// A save builds the whole directory beside the target and swaps it in, so a run killed while
// saving leaves the previous checkpoint whole. The trainer's save and resume
// (core/train/trainer_ckpt.c) gather its partitioned state and write it with the helpers of
// core/checkpoint/checkpoint_io.h; this file knows the files, not the trainer.
#include <jansson.h>
#include <stdio.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "core/checkpoint/checkpoint_check.h"
#include "core/checkpoint/checkpoint_dist.h"
#include "core/checkpoint/checkpoint_hf.h"
#include "core/checkpoint/checkpoint_io.h"
#include "core/checkpoint/checkpoint_open.h"
#include "core/checkpoint/checkpoint_publish.h"
#include "core/input.h"
#include "core/model/model_internal.h"
#include "core/checkpoint/safetensors.h"
#include "platform/platform.h"

static l3d_status sys_error(l3d_ctx_t *ctx, int rc, const char *what, const char *path) {
    return l3d_error(ctx, L3D_ERR_IO, "%s %s: %s", what, path, strerror(-rc));
}

static void join(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

// Host view of an arena (itself where it is host memory: a host device, or state ZeRO
// offload keeps on the host; a copy otherwise).
static l3d_status host_view(l3d_model_t *m, const float *dev_arena, float **host_p) {
    if (!l3d_dev_is_device_ptr(m->dev, dev_arena)) {
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
l3d_status l3d_ckpt_write_arena(l3d_model_t *m, const float *a, const char *path,
                                const char *suffix) {
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
static l3d_status read_set(l3d_model_t *m, const l3d_hf_set_t *set, void *a, l3d_dtype dt,
                           const char *suffix) {
    l3d_ctx_t *ctx = m->ctx;
    int host = !l3d_dev_is_device_ptr(m->dev, a);
    size_t bytes = m->n_params * l3d_dtype_size(dt);
    void *h = host ? a : l3d_malloc(ctx, bytes, "staging");
    l3d_status st = h ? L3D_OK : L3D_ERR_NOMEM;
    // The set's index was checked against the config (l3d_ckpt_check) before the model was
    // allocated; what is left to check is the values.
    if (st >= 0) st = l3d_hf_set_read(m, set, suffix, h, dt);
    if (st >= 0 && !host) {
        st = l3d_dev_copy(m->dev, a, h, bytes, L3D_COPY_H2D);
        if (st >= 0) st = l3d_dev_sync(m->dev);
    }
    if (!host) l3d_free(ctx, h, bytes, "staging");
    return st;
}

// One safetensors file (an optimizer moment) into arena `a`.
l3d_status l3d_ckpt_read_file(l3d_model_t *m, float *a, const char *path, const char *suffix) {
    l3d_hf_set_t set;
    L3D_CHECK(m->ctx, l3d_hf_set_open_file(m->ctx, path, &set));
    l3d_status st = read_set(m, &set, a, L3D_FLOAT32, suffix);
    l3d_hf_set_close(&set);
    return st;
}

l3d_status l3d_ckpt_write_text(l3d_ctx_t *ctx, const char *path, const char *text) {
    l3d_iovec_t io = {text, strlen(text)};
    int rc = l3d_file_write_atomic(path, &io, 1);
    return rc ? sys_error(ctx, rc, "writing", path) : L3D_OK;
}

// config.json and the weights as m->save says (core/checkpoint/checkpoint_hf.h), plus the tokenizer
// and generation files of the directory the weights came from.
l3d_status l3d_ckpt_write_model_files(l3d_model_t *m, const char *dir) {
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
// the target: a directory llama3d wrote, or none (core/checkpoint/checkpoint_publish.h says which).
l3d_status l3d_ckpt_publish_dir(l3d_ctx_t *ctx, const char *dir, l3d_ckpt_fill_fn fill, void *arg) {
    char target[1024], tmp[1100];
    L3D_CHECK(ctx, l3d_ckpt_target_resolve(ctx, dir, target, sizeof(target)));
    L3D_CHECK(ctx, l3d_ckpt_tmp_create(ctx, target, (int64_t)getpid(), tmp, sizeof(tmp)));
    l3d_status st = fill(arg, tmp);
    if (st >= 0) st = l3d_ckpt_tmp_publish(ctx, tmp, target);
    if (st < 0) l3d_ckpt_tmp_remove(tmp);
    return st;
}

static l3d_status fill_model(void *arg, const char *tmp) {
    return l3d_ckpt_write_model_files(arg, tmp);
}

l3d_status l3d_model_save(l3d_model_t *m, const char *dir) {
    if (!m || !dir)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_model_save: NULL %s",
                         !m ? "model" : "dir");
    L3D_CHECK(m->ctx, l3d_model_check_params(m, "l3d_model_save"));
    L3D_CHECK(m->ctx, l3d_ckpt_publish_dir(m->ctx, dir, fill_model, m));
    l3d_log(m->ctx, L3D_LOG_INFO, L3D_SUBSYS_CKPT, "saved model to %s", dir);
    return L3D_OK;
}

// The architecture fields must agree; the name and init std may differ.
l3d_status l3d_ckpt_check_same_arch(l3d_ctx_t *ctx, const char *origin,
                                    const l3d_model_config_t *a, const l3d_model_config_t *b) {
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
l3d_status l3d_ckpt_load_weights(l3d_model_t *m, const char *dir) {
    m->wp_fresh = 0;  // (params are about to change)
    if (m->w16_only && l3d_ckpt_dist_is(dir))
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "%s: a llama3d sharded checkpoint loads "
                         "as float32, not into %s weights", dir, l3d_dtype_name(m->wt));
    if (l3d_ckpt_dist_is(dir)) {
        L3D_CHECK(m->ctx, l3d_ckpt_dist_read(m, dir, m->params, NULL, NULL));
        m->loaded.dtype = -1;  // float32, llama3d's own layout (l3d_model_weights_desc)
        m->loaded.files = 0;
    } else {
        l3d_hf_set_t set;
        L3D_CHECK(m->ctx, l3d_hf_set_open(m->ctx, dir, &set));
        l3d_status st = m->w16_only ? read_set(m, &set, m->wp, m->wt, "")
                                    : read_set(m, &set, m->params, L3D_FLOAT32, "");
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
    L3D_CHECK(m->ctx, l3d_model_check_infer(m, "l3d_model_load"));
    char path[1200];  // a directory of up to 1100 bytes (tmp) and a file name
    l3d_model_config_t cfg;
    join(path, sizeof(path), dir, "config.json");
    L3D_CHECK(m->ctx, l3d_model_config_from_file(m->ctx, path, &cfg));
    L3D_CHECK(m->ctx, l3d_ckpt_check_same_arch(m->ctx, path, &cfg, &m->cfg));
    L3D_CHECK(m->ctx, l3d_ckpt_check(m->ctx, dir, &m->cfg, 0));
    return l3d_ckpt_load_weights(m, dir);
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
    l3d_status st = l3d_ckpt_load_weights(m, dir);
    if (st < 0) {
        l3d_model_destroy(m);
        return st;
    }
    *model_p = m;
    return L3D_OK;
}

// The dtype l3d_infer_open keeps weights in for `weights` < 0: bfloat16 for a checkpoint all in
// BF16 (read as stored: exact, half the memory), else float32.
static l3d_status infer_weights_auto(l3d_ctx_t *ctx, const char *dir, l3d_dtype *wt_p) {
    *wt_p = L3D_FLOAT32;
    if (l3d_ckpt_dist_is(dir)) return L3D_OK;
    l3d_hf_set_t set;
    L3D_CHECK(ctx, l3d_hf_set_open(ctx, dir, &set));
    if (!set.mixed && set.dtype == L3D_ST_BF16) *wt_p = L3D_BFLOAT16;
    l3d_hf_set_close(&set);
    return L3D_OK;
}

l3d_status l3d_infer_open(l3d_ctx_t *ctx, l3d_comm_t *world, int tp, int pp, l3d_device_t *dev,
                          const char *dir, int n_seq, int capacity, int weights,
                          l3d_infer_t **inf_p) {
    if (!ctx || !dev || !dir || !inf_p || tp < 1 || pp < 1)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_infer_open: NULL argument or tp %d / "
                         "pp %d < 1", tp, pp);
    char path[1200];
    l3d_model_config_t cfg;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    L3D_CHECK(ctx, l3d_model_config_from_file(ctx, path, &cfg));
    // The files must hold what the config says before the config sizes an allocation.
    L3D_CHECK(ctx, l3d_ckpt_check(ctx, dir, &cfg, 0));
    l3d_dtype wt = (l3d_dtype)weights;
    if (weights < 0) L3D_CHECK(ctx, infer_weights_auto(ctx, dir, &wt));
    l3d_infer_t *inf;
    L3D_CHECK(ctx, l3d_infer_create_seqs(ctx, world, tp, pp, dev, &cfg, n_seq, capacity, wt,
                                         &inf));
    l3d_status st = l3d_model_load(l3d_infer_model(inf), dir);  // this rank's slices only
    if (st < 0) {
        l3d_infer_destroy(inf);
        return st;
    }
    *inf_p = inf;
    return L3D_OK;
}

l3d_status l3d_ckpt_write_config(l3d_model_t *m, const char *dir) {
    char path[1200];  // a directory of up to 1100 bytes (tmp) and a file name
    char *json = NULL;
    L3D_CHECK(m->ctx, l3d_model_config_to_json(m->ctx, &m->cfg, &json));
    join(path, sizeof(path), dir, "config.json");
    l3d_status st = l3d_ckpt_write_text(m->ctx, path, json);
    free(json);
    return st;
}
