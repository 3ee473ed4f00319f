// The Llama 3 model: creation and destruction, deterministic initialisation, RoPE tables.
// The parameter layout is in core/model/model_layout.c, the forward/backward math in
// core/model/model_fwdbwd.c, inference in core/model/model_infer.c.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/model/model_internal.h"
#include "core/model/tp2d.h"
#include "core/model/tp3d.h"

static l3d_status model_create(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                               l3d_comm_t *tp_comm, int mode, int pp, int v, int stage,
                               const int *lps, l3d_dtype w16, l3d_model_t **model_p);

l3d_status l3d_model_create_tp(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                               l3d_comm_t *tp_comm, l3d_model_t **model_p) {
    return model_create(ctx, dev, cfg, tp_comm, 1, 1, 1, 0, NULL, L3D_FLOAT32, model_p);
}

l3d_status l3d_model_create_part(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                                 l3d_comm_t *tp_comm, int pp, int v, int stage, const int *lps,
                                 l3d_model_t **model_p) {
    return model_create(ctx, dev, cfg, tp_comm, 1, pp, v, stage, lps, L3D_FLOAT32, model_p);
}

l3d_status l3d_model_create_part_w16(l3d_ctx_t *ctx, l3d_device_t *dev,
                                     const l3d_model_config_t *cfg, l3d_comm_t *tp_comm, int pp,
                                     int stage, l3d_dtype wt, l3d_model_t **model_p) {
    if (wt != L3D_BFLOAT16 && wt != L3D_FLOAT16)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "16-bit weights: dtype %s is not bfloat16 or "
                         "float16", l3d_dtype_name(wt));
    return model_create(ctx, dev, cfg, tp_comm, 1, pp, 1, stage, NULL, wt, model_p);
}

l3d_status l3d_model_create(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                            l3d_model_t **model_p) {
    return model_create(ctx, dev, cfg, NULL, 1, 1, 1, 0, NULL, L3D_FLOAT32, model_p);
}

l3d_status l3d_model_create_2d(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                               l3d_comm_t *tp_comm, int pp, int v, int stage, const int *lps,
                               l3d_model_t **model_p) {
    return model_create(ctx, dev, cfg, tp_comm, 2, pp, v, stage, lps, L3D_FLOAT32, model_p);
}

l3d_status l3d_model_create_3d(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                               l3d_comm_t *tp_comm, int pp, int v, int stage, const int *lps,
                               l3d_model_t **model_p) {
    return model_create(ctx, dev, cfg, tp_comm, 3, pp, v, stage, lps, L3D_FLOAT32, model_p);
}

static l3d_status model_create(l3d_ctx_t *ctx, l3d_device_t *dev, const l3d_model_config_t *cfg,
                               l3d_comm_t *tp_comm, int mode, int pp, int v, int stage,
                               const int *lps, l3d_dtype w16, l3d_model_t **model_p) {
    if (!ctx || !dev || !cfg || !model_p)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "creating a model: NULL %s",
                         !ctx ? "ctx" : !dev ? "device (make one with l3d_device_create)"
                         : !cfg ? "config" : "model_p");
    L3D_CHECK(ctx, l3d_model_config_validate(ctx, cfg));
    int tp = tp_comm ? l3d_comm_size(tp_comm) : 1, rank = tp_comm ? l3d_comm_rank(tp_comm) : 0;
    int q = (int)lround(mode == 3 ? cbrt((double)tp) : sqrt((double)tp));
    if (mode == 2 && q * q != tp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "tp_mode 2d: tp %d is not a square (q x q ranks: "
                         "4, 9, 16, ...)", tp);
    if (mode == 3 && q * q * q != tp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "tp_mode 3d: tp %d is not a cube (q x q x q "
                         "ranks: 8, 27, 64, ...)", tp);
    L3D_CHECK(ctx, mode == 2   ? l3d_tp2d_check(ctx, cfg, q)
                   : mode == 3 ? l3d_tp3d_check(ctx, cfg, q)
                               : l3d_tp_check(ctx, cfg, tp));
    if (v < 1 || v > L3D_MAX_CHUNKS || pp < 1 || (long)pp * v > cfg->num_hidden_layers)
        return l3d_error(ctx, L3D_ERR_CONFIG, "pipeline: pp %d x virtual stages %d must be "
                         "between 1 and num_hidden_layers %d (virtual stages at most %d)", pp, v,
                         cfg->num_hidden_layers, L3D_MAX_CHUNKS);
    l3d_status st = L3D_OK;
    l3d_model_t *m = l3d_calloc(ctx, 1, sizeof(*m), "other");
    if (!m) return L3D_ERR_NOMEM;
    m->ctx = ctx;
    m->dev = dev;
    m->save.max_shard_bytes = L3D_SAVE_MAX_SHARD_DEFAULT;  // dtype 0: F32
    l3d_model_set_dims_mode(m, cfg, tp, mode, rank);
    l3d_model_set_stage(m, pp, v, stage, lps);
    m->tp.comm = tp > 1 ? tp_comm : NULL;
    if (mode >= 2) {
        st = mode == 2 ? l3d_tp2d_create(tp_comm, dev, &m->tp.g)
                       : l3d_tp3d_create(tp_comm, dev, &m->tp.g3);
        if (st < 0) {  // (the grid's reason is on the communicator's context)
            l3d_free(ctx, m, sizeof(*m), "other");
            return l3d_error(ctx, st, "tp_mode %dd: building the grid: %s", mode,
                             l3d_ctx_last_error(l3d_comm_ctx(tp_comm)));
        }
        l3d_tp_t *t = &m->tp;
        if (mode == 2) {
            t->norm_comm = t->vocab_comm = t->g->row;
            t->repl_comm = t->loss_comm = t->g->col;
        } else {
            t->norm_comm = t->g3->axis[2], t->vocab_comm = t->g3->axis[1];
            t->repl_comm = t->g3->plane[2], t->loss_comm = t->g3->plane[1];
        }
    }
    if (m->tp.kv_rep > 1) {
        // Ranks sharing a key/value head: r / kv_rep names the head.
        st = l3d_comm_split(tp_comm, rank / m->tp.kv_rep, rank, &m->tp.kv_comm);
        if (st < 0) {
            l3d_free(ctx, m, sizeof(*m), "other");
            return st;
        }
    }
    size_t max_tensors = 3 + 9 * (size_t)m->L;  // L is bounded by config validation
    m->tensors = l3d_calloc(ctx, max_tensors, sizeof(l3d_param_t), "other");
    m->layer = l3d_calloc(ctx, (size_t)m->L, sizeof(l3d_layer_params_t), "other");
    if (!m->tensors || !m->layer) {
        st = L3D_ERR_NOMEM;
        goto err_free;
    }
    l3d_model_layout(m);
    size_t next = 0;  // the gradient groups tile the arena in order
    for (int i = 0; i < l3d_model_grad_groups(m) && next != (size_t)-1; i++) {
        size_t lo, len;
        l3d_model_grad_group(m, i, &lo, &len, NULL);
        next = lo == next ? lo + len : (size_t)-1;
    }
    if (next != m->n_params) {
        st = l3d_error(ctx, L3D_ERR_INTERNAL, "model layout: gradient groups do not tile the "
                       "%zu-float parameter arena", m->n_params);
        goto err_free;
    }
    size_t wbytes = m->n_params * (w16 == L3D_FLOAT32 ? sizeof(float) : l3d_dtype_size(w16));
    if (l3d_dev_is_host(dev)) {
        char what[96];
        snprintf(what, sizeof(what), "the model's weights (%zu parameters)", m->n_params);
        L3D_CHECK_GOTO(ctx, l3d_mem_check(ctx, (uint64_t)wbytes, what), st, err_free);
    }
    // The float32 arena, or the 16-bit weights alone (l3d_model_create_part_w16).
    m->w16_only = w16 != L3D_FLOAT32;
    if (m->w16_only) m->wt = w16;
    void **arena = m->w16_only ? &m->wp : (void **)&m->params;
    L3D_CHECK_GOTO(ctx, l3d_dev_alloc(dev, wbytes, "params", arena), st, err_free);
    L3D_CHECK_GOTO(ctx, l3d_dev_memset(dev, *arena, 0, wbytes), st, err_free_params);
    *model_p = m;
    return L3D_OK;
err_free_params:
    l3d_dev_free(dev, *arena, wbytes, "params");
err_free:
    l3d_comm_destroy(m->tp.kv_comm);
    l3d_tp2d_destroy(m->tp.g);
    l3d_tp3d_destroy(m->tp.g3);
    if (m->tp.stat) l3d_dev_free(dev, m->tp.stat, m->tp.cap_stat * sizeof(float), "tp");
    l3d_free(ctx, m->layer, (size_t)m->L * sizeof(l3d_layer_params_t), "other");
    l3d_free(ctx, m->tensors, (size_t)max_tensors * sizeof(l3d_param_t), "other");
    l3d_free(ctx, m, sizeof(*m), "other");
    return st;
}

void l3d_model_destroy(l3d_model_t *m) {
    if (!m) return;
    l3d_device_t *dev = m->dev;
    size_t rope_bytes = (size_t)m->rope_len * (size_t)(m->D / 2) * sizeof(float);
    l3d_dev_free(dev, m->cos_tab, rope_bytes, "params");
    l3d_dev_free(dev, m->sin_tab, rope_bytes, "params");
    l3d_dev_free(dev, m->params, m->n_params * sizeof(float), "params");
    if (m->wp) l3d_dev_free(dev, m->wp, m->n_params * l3d_dtype_size(m->wt), "params");
    l3d_comm_destroy(m->tp.kv_comm);
    l3d_tp2d_destroy(m->tp.g);
    l3d_tp3d_destroy(m->tp.g3);
    if (m->tp.stat) l3d_dev_free(dev, m->tp.stat, m->tp.cap_stat * sizeof(float), "tp");
    l3d_free(m->ctx, m->layer, (size_t)m->L * sizeof(l3d_layer_params_t), "other");
    l3d_free(m->ctx, m->tensors, (size_t)(3 + 9 * m->L) * sizeof(l3d_param_t), "other");
    l3d_free(m->ctx, m, sizeof(*m), "other");
}

const l3d_model_config_t *l3d_model_config(const l3d_model_t *m) { return &m->cfg; }

l3d_status l3d_model_set_weight_dtype(l3d_model_t *m, l3d_dtype wt, int with_copy) {
    if (wt != L3D_FLOAT32 && wt != L3D_BFLOAT16 && wt != L3D_FLOAT16)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "l3d_model_set_weight_dtype: dtype %d is "
                         "not float32, bfloat16 or float16", (int)wt);
    if (m->w16_only) return l3d_model_check_params(m, "l3d_model_set_weight_dtype");
    if (m->wp) l3d_dev_free(m->dev, m->wp, m->n_params * l3d_dtype_size(m->wt), "params");
    m->wp = NULL;
    m->wp_fresh = 0;
    m->wt = wt;
    if (wt == L3D_FLOAT32 || !with_copy) return L3D_OK;
    L3D_CHECK(m->ctx, l3d_dev_alloc(m->dev, m->n_params * l3d_dtype_size(wt), "params", &m->wp));
    return l3d_model_refresh_weights(m);
}

l3d_status l3d_model_set_grad_dtype(l3d_model_t *m, l3d_dtype gt) {
    if (gt != L3D_FLOAT32 && gt != m->wt)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "gradients in %s: float32 or the weights' "
                         "dtype (%s) only", l3d_dtype_name(gt), l3d_dtype_name(m->wt));
    if (gt != L3D_FLOAT32 && m->tp.mode >= 2)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "gradients in %s under %dd tensor "
                         "parallelism: its products sum partial gradients in float32; 1d only",
                         l3d_dtype_name(gt), m->tp.mode);
    m->gt = gt;
    return L3D_OK;
}

l3d_status l3d_model_refresh_weights(l3d_model_t *m) {
    if (!m->wp || !m->params || m->wp_fresh) return L3D_OK;
    return l3d_dev_convert(m->dev, m->wp, m->wt, m->params, L3D_FLOAT32, m->n_params);
}

// ---- initialisation ----------------------------------------------------------------------
// A counter-based generator: the value of element i of a tensor is a pure function of
// (seed, tensor name, i), so sharded layouts reproduce the single-rank initialisation.
static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}
// Standard normal for (key, i) by Box-Muller on two counter-derived uniforms.
static float normal_at(uint64_t key, uint64_t i) {
    uint64_t a = splitmix64(key ^ splitmix64(2 * i));
    uint64_t b = splitmix64(key ^ splitmix64(2 * i + 1));
    double u1 = ((double)(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = (double)(b >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

l3d_status l3d_model_check_infer(const l3d_model_t *m, const char *what) {
    return m->w16_only ? L3D_OK : l3d_model_check_params(m, what);
}

l3d_status l3d_model_check_params(const l3d_model_t *m, const char *what) {
    if (m->params) return L3D_OK;
    if (m->w16_only)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "%s: the model holds only its %s weights "
                         "(opened for inference), not the float32 master", what,
                         l3d_dtype_name(m->wt));
    return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "%s: the model's parameters are partitioned "
                     "over data-parallel ranks (ZeRO-3, or ZeRO-1/2's float32 master under "
                     "16-bit weights); save them with l3d_trainer_save", what);
}

l3d_status l3d_model_init_weights(l3d_model_t *m, uint64_t seed) {
    if (!m) return l3d_error(NULL, L3D_ERR_INVALID_ARG, "l3d_model_init_weights: NULL model");
    m->wp_fresh = 0;  // (params change below)
    L3D_CHECK(m->ctx, l3d_model_check_params(m, "l3d_model_init_weights"));
    l3d_device_t *dev = m->dev;
    size_t bytes = m->n_params * sizeof(float);
    int host = !l3d_dev_is_device_ptr(dev, m->params);
    float *h = host ? m->params : l3d_malloc(m->ctx, bytes, "staging");
    if (!h) return L3D_ERR_NOMEM;
    float std = m->cfg.initializer_range;
    l3d_progress_t pr;
    l3d_progress_begin(m->ctx, &pr, bytes, "initialising %s", m->cfg.name);
    for (int t = 0; t < m->n_tensors; t++) {
        const l3d_param_t *p = &m->tensors[t];
        float *w = h + p->offset;
        l3d_progress_update(&pr, p->offset * sizeof(float));
        if (p->ndim == 1) {
            for (size_t i = 0; i < p->numel; i++) w[i] = 1.0f;
            continue;
        }
        // Element (r, c) of the shard is element (r0 + r, c0 + c) of the full tensor.
        uint64_t key = splitmix64(seed) ^ hash_name(p->name);
        size_t rows = (size_t)p->shape[0], cols = (size_t)p->shape[1];
        for (size_t r = 0; r < rows; r++) {
            uint64_t g = ((uint64_t)p->r0 + r) * (uint64_t)p->full[1] + (uint64_t)p->c0;
            for (size_t c = 0; c < cols; c++) w[r * cols + c] = std * normal_at(key, g + c);
            // A 4 GB embedding takes long: report within the tensor too (rate-limited).
            if ((r & 255) == 255) l3d_progress_update(&pr, (p->offset + r * cols) * sizeof(float));
        }
    }
    pr.done = bytes;
    l3d_progress_end(&pr);
    l3d_status st = L3D_OK;
    if (!host) {
        st = l3d_dev_copy(dev, m->params, h, bytes, L3D_COPY_H2D);
        if (st >= 0) st = l3d_dev_sync(dev);
        l3d_free(m->ctx, h, bytes, "staging");
    }
    return st;
}

// ---- RoPE --------------------------------------------------------------------------------
// inv_freq_i = theta^(-2i/D); with rope_scaling "llama3" (Llama 3.1) long wavelengths are
// divided by `factor`, short ones kept, and the band between blended smoothly.
void l3d_rope_inv_freq(const l3d_model_config_t *cfg, double *inv_freq) {
    int D = cfg->head_dim;
    for (int i = 0; i < D / 2; i++) {
        // HF computes this in float32; match it so logits agree to float precision.
        float f = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)D);
        double inv = f;
        if (cfg->rope_scaling_llama3) {
            double orig = cfg->rope_original_max_position_embeddings;
            double lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
            double factor = cfg->rope_factor;
            double wavelen = 6.283185307179586 / inv;  // 2 pi
            double low_wl = orig / lo, high_wl = orig / hi;
            if (wavelen > low_wl) {
                inv = inv / factor;
            } else if (wavelen >= high_wl) {
                double smooth = (orig / wavelen - lo) / (hi - lo);
                inv = (1.0 - smooth) * inv / factor + smooth * inv;
            }
        }
        inv_freq[i] = inv;
    }
}

l3d_status l3d_model_rope_reserve(l3d_model_t *m, int len) {
    if (len <= m->rope_len) return L3D_OK;
    int half = m->D / 2;
    size_t n = (size_t)len * (size_t)half;
    float *hc = l3d_malloc(m->ctx, n * sizeof(float), "staging");
    float *hs = l3d_malloc(m->ctx, n * sizeof(float), "staging");
    double *inv = l3d_malloc(m->ctx, (size_t)half * sizeof(double), "staging");
    float *dc = NULL, *ds = NULL;
    l3d_status st = L3D_ERR_NOMEM;
    if (!hc || !hs || !inv) goto out;
    l3d_rope_inv_freq(&m->cfg, inv);
    for (int t = 0; t < len; t++)
        for (int i = 0; i < half; i++) {
            // float32 angle, as HF's (inv_freq @ position_ids).float()
            float ang = (float)t * (float)inv[i];
            hc[(size_t)t * half + i] = cosf(ang);
            hs[(size_t)t * half + i] = sinf(ang);
        }
    L3D_CHECK_GOTO(m->ctx, l3d_dev_alloc(m->dev, n * sizeof(float), "params", (void **)&dc), st, out);
    L3D_CHECK_GOTO(m->ctx, l3d_dev_alloc(m->dev, n * sizeof(float), "params", (void **)&ds), st, out);
    L3D_CHECK_GOTO(m->ctx, l3d_dev_copy(m->dev, dc, hc, n * sizeof(float), L3D_COPY_H2D), st, out);
    L3D_CHECK_GOTO(m->ctx, l3d_dev_copy(m->dev, ds, hs, n * sizeof(float), L3D_COPY_H2D), st, out);
    L3D_CHECK_GOTO(m->ctx, l3d_dev_sync(m->dev), st, out);
    size_t old = (size_t)m->rope_len * (size_t)half * sizeof(float);
    l3d_dev_free(m->dev, m->cos_tab, old, "params");
    l3d_dev_free(m->dev, m->sin_tab, old, "params");
    m->cos_tab = dc;
    m->sin_tab = ds;
    m->rope_len = len;
    dc = ds = NULL;
    st = L3D_OK;
out:
    l3d_dev_free(m->dev, dc, n * sizeof(float), "params");
    l3d_dev_free(m->dev, ds, n * sizeof(float), "params");
    l3d_free(m->ctx, inv, (size_t)half * sizeof(double), "staging");
    l3d_free(m->ctx, hs, n * sizeof(float), "staging");
    l3d_free(m->ctx, hc, n * sizeof(float), "staging");
    return st;
}
