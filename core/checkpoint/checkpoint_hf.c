// Hugging Face weight files: one model.safetensors or index + shards
// (core/checkpoint/checkpoint_hf.h).
#include <inttypes.h>
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint/checkpoint_check.h"
#include "core/checkpoint/checkpoint_hf.h"
#include "devices/device_math.h"
#include "core/input.h"
#include "platform/platform.h"

void l3d_hf_set_close(l3d_hf_set_t *set) {
    if (!set || !set->ctx) return;
    for (int i = 0; i < set->n; i++) {
        l3d_st_close(set->files[i]);
        if (set->paths[i]) l3d_free(set->ctx, set->paths[i], strlen(set->paths[i]) + 1, "staging");
    }
    l3d_free(set->ctx, set->files, (size_t)set->n * sizeof(*set->files), "staging");
    l3d_free(set->ctx, set->paths, (size_t)set->n * sizeof(*set->paths), "staging");
    memset(set, 0, sizeof(*set));
}

// Room for n files; opens path as file i.
static l3d_status set_init(l3d_ctx_t *ctx, l3d_hf_set_t *set, int n) {
    memset(set, 0, sizeof(*set));
    set->ctx = ctx;
    set->files = l3d_calloc(ctx, (size_t)n, sizeof(*set->files), "staging");
    set->paths = l3d_calloc(ctx, (size_t)n, sizeof(*set->paths), "staging");
    if (!set->files || !set->paths) {
        l3d_free(ctx, set->files, (size_t)n * sizeof(*set->files), "staging");
        l3d_free(ctx, set->paths, (size_t)n * sizeof(*set->paths), "staging");
        memset(set, 0, sizeof(*set));
        return L3D_ERR_NOMEM;
    }
    set->n = n;
    return L3D_OK;
}

static l3d_status set_open_at(l3d_hf_set_t *set, int i, const char *path) {
    size_t len = strlen(path) + 1;
    set->paths[i] = l3d_malloc(set->ctx, len, "staging");
    if (!set->paths[i]) return L3D_ERR_NOMEM;
    memcpy(set->paths[i], path, len);
    uint64_t size = 0;
    if (l3d_path_size(path, &size) == 0) set->bytes += size;
    return l3d_st_open(set->ctx, path, &set->files[i]);
}

// The common dtype of every tensor (or `mixed`).
static void set_dtype(l3d_hf_set_t *set) {
    int first = 1;
    set->dtype = L3D_ST_F32;
    for (int i = 0; i < set->n; i++)
        for (size_t j = 0; j < l3d_st_count(set->files[i]); j++) {
            l3d_st_dtype dt = l3d_st_at(set->files[i], j)->dtype;
            if (first) set->dtype = dt;
            else if (dt != set->dtype) set->mixed = 1;
            first = 0;
        }
}

l3d_status l3d_hf_set_open_file(l3d_ctx_t *ctx, const char *path, l3d_hf_set_t *set) {
    L3D_CHECK(ctx, set_init(ctx, set, 1));
    snprintf(set->origin, sizeof(set->origin), "%s", path);
    l3d_status st = set_open_at(set, 0, path);
    if (st < 0) {
        l3d_hf_set_close(set);
        return st;
    }
    set_dtype(set);
    return L3D_OK;
}

// A shard name in the index: a plain file name inside the directory.
static int plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

// Checks the index's shape and opens every distinct shard it names (in first-mention order).
static l3d_status open_index(l3d_ctx_t *ctx, const char *dir, const char *ipath, json_t *root,
                             l3d_hf_set_t *set) {
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm) || json_object_size(wm) == 0)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: needs a non-empty object \"weight_map\" "
                         "(tensor name -> shard file)", ipath);
    json_t *names = json_array();  // distinct shard names
    if (!names) return L3D_ERR_NOMEM;
    l3d_status st = L3D_OK;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v) || !plain_name(json_string_value(v))) {
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: weight_map[\"%.100s\"] is not a file name "
                           "in %s", ipath, key, dir);
            break;
        }
        size_t k = 0;
        for (; k < json_array_size(names); k++)
            if (!strcmp(json_string_value(json_array_get(names, k)), json_string_value(v))) break;
        if (k == json_array_size(names)) {
            if (k == L3D_HF_MAX_FILES) {
                st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: more than %d shard files", ipath,
                               L3D_HF_MAX_FILES);
                break;
            }
            json_array_append(names, v);
        }
    }
    if (st >= 0) st = set_init(ctx, set, (int)json_array_size(names));
    if (st >= 0) snprintf(set->origin, sizeof(set->origin), "%s", ipath);
    char path[1400];
    for (int i = 0; st >= 0 && i < set->n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, json_string_value(json_array_get(names, (size_t)i)));
        if (!l3d_path_present(path))
            st = l3d_error(ctx, L3D_ERR_NOT_FOUND, "%s names shard %s, which does not exist",
                           ipath, path);
        else
            st = set_open_at(set, i, path);
    }
    // Every mapped tensor is in its shard, and every shard's tensor is mapped to that shard.
    json_object_foreach(wm, key, v) {
        if (st < 0) break;
        const char *file = json_string_value(v);
        for (int i = 0; i < set->n; i++) {
            if (strcmp(json_string_value(json_array_get(names, (size_t)i)), file)) continue;
            if (!l3d_st_find(set->files[i], key))
                st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%.100s' is mapped to %s, which "
                               "does not hold it", ipath, key, set->paths[i]);
        }
    }
    for (int i = 0; st >= 0 && i < set->n; i++)
        for (size_t j = 0; st >= 0 && j < l3d_st_count(set->files[i]); j++) {
            const char *name = l3d_st_at(set->files[i], j)->name;
            json_t *to = json_object_get(wm, name);
            if (!to || strcmp(json_string_value(to), json_string_value(json_array_get(names, (size_t)i))))
                st = l3d_error(ctx, L3D_ERR_FORMAT, "%s holds tensor '%.100s', which %s %s",
                               set->paths[i], name, ipath,
                               to ? "maps to another shard" : "does not list");
        }
    json_decref(names);
    return st;
}

l3d_status l3d_hf_set_open(l3d_ctx_t *ctx, const char *dir, l3d_hf_set_t *set) {
    char path[1200];
    memset(set, 0, sizeof(*set));
    snprintf(path, sizeof(path), "%s/%s", dir, L3D_HF_WEIGHTS);
    if (l3d_path_present(path)) return l3d_hf_set_open_file(ctx, path, set);
    snprintf(path, sizeof(path), "%s/%s", dir, L3D_HF_INDEX);
    if (!l3d_path_present(path))
        return l3d_error(ctx, L3D_ERR_NOT_FOUND, "%s holds no model weights (%s, or %s and its "
                         "shards)", dir, L3D_HF_WEIGHTS, L3D_HF_INDEX);
    json_t *root;
    L3D_CHECK(ctx, l3d_input_json(ctx, path, NULL, 0, &root));
    l3d_status st = open_index(ctx, dir, path, root, set);
    json_decref(root);
    if (st < 0) {
        if (set->ctx) l3d_hf_set_close(set);
        return st;
    }
    set_dtype(set);
    return L3D_OK;
}

static const l3d_st_tensor_t *set_find(const l3d_hf_set_t *set, const char *name,
                                       const char **path_p, int *file_p) {
    for (int i = 0; i < set->n; i++) {
        const l3d_st_tensor_t *t = l3d_st_find(set->files[i], name);
        if (!t) continue;
        if (path_p) *path_p = set->paths[i];
        if (file_p) *file_p = i;
        return t;
    }
    return NULL;
}

const l3d_st_tensor_t *l3d_hf_set_find(const l3d_hf_set_t *set, const char *name,
                                       const char **path_p) {
    return set_find(set, name, path_p, NULL);
}

l3d_status l3d_hf_set_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, const char *cfg_origin,
                            const l3d_hf_set_t *set, const char *suffix) {
    // Each file's own tensors must be the model's; then every required tensor must be in one.
    for (int i = 0; i < set->n; i++)
        L3D_CHECK(ctx, l3d_ckpt_check_file_tensors(ctx, cfg, cfg_origin, set->files[i],
                                                   set->paths[i], suffix));
    char name[128], full[160];
    size_t have = 0;
    for (int i = 0; i < set->n; i++) have += l3d_st_count(set->files[i]);
    for (size_t id = 0; l3d_ckpt_tensor_name(cfg, id, name, sizeof(name)) == 0; id++) {
        if (!l3d_ckpt_tensor_required(cfg, id)) continue;
        snprintf(full, sizeof(full), "%s%s", name, suffix);
        if (!l3d_hf_set_find(set, full, NULL))
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' is missing (%s implies %zu "
                             "tensors, %s %zu)", set->origin, full, cfg_origin,
                             l3d_ckpt_tensor_count(cfg), set->n > 1 ? "the shards hold" :
                             "the file has", have);
    }
    return L3D_OK;
}

// 2 MiB: the window of file pages mapped beside the converted floats is part of the peak
// (16 MiB here made loading, not decoding, the peak of `l3d generate`); a madvise per 2 MiB
// costs nothing beside the conversion.
#define PLACE_DROP ((size_t)2 << 20)

l3d_status l3d_ckpt_place(l3d_ctx_t *ctx, const char *path, const l3d_st_tensor_t *e,
                          const l3d_param_t *p, long long R, long long C, void *dst, l3d_dtype dt,
                          float *row_buf, size_t *n, const l3d_st_file_t *f) {
    // A 1-D tensor is one row; its tp shard is a column range.
    int64_t rows = p->ndim == 2 ? p->shape[0] : 1, cols = p->ndim == 2 ? p->shape[1] : p->shape[0];
    int64_t row0 = p->ndim == 2 ? p->r0 : 0, col0 = p->ndim == 2 ? p->c0 : p->r0;
    int64_t h = e->ndim == 2 ? e->shape[0] : 1, w = e->ndim == 2 ? e->shape[1] : e->shape[0];
    int64_t frows = p->ndim == 2 ? p->full[0] : 1, fcols = p->ndim == 2 ? p->full[1] : p->full[0];
    // R and C are below 10^15 (the name parser's bound): R > frows - h cannot overflow.
    if (!l3d_st_dtype_is_float(e->dtype) || e->ndim != p->ndim || h < 1 || w < 1 ||
        R > frows - h || C > fcols - w)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' (%lld x %lld %s at %lld,%lld) "
                         "does not fit %s (%lld x %lld, a float)", path, e->name, (long long)h,
                         (long long)w, l3d_st_dtype_name(e->dtype), R, C, p->name,
                         (long long)frows, (long long)fcols);
    size_t es = l3d_st_dtype_size(e->dtype);
    int64_t y0 = R > row0 ? R : row0, y1 = R + h < row0 + rows ? R + h : row0 + rows;
    int64_t x0 = C > col0 ? C : col0, x1 = C + w < col0 + cols ? C + w : col0 + cols;
    *n = 0;
    // The source rows already converted leave the process every PLACE_DROP bytes (a 2 GB
    // embedding must not sit in memory twice, as file pages and as float32).
    const char *dropped = (const char *)e->data;
    for (int64_t y = y0; y < y1 && x0 < x1; y++) {
        const char *src = (const char *)e->data + ((size_t)(y - R) * (size_t)w + (size_t)(x0 - C)) * es;
        if (f && (size_t)(src - dropped) >= PLACE_DROP) {
            l3d_st_drop_range(f, dropped, (size_t)(src - dropped));
            dropped = src;
        }
        size_t at = p->offset + (size_t)(y - row0) * (size_t)cols + (size_t)(x0 - col0);
        float *d = dt == L3D_FLOAT32 ? (float *)dst + at : row_buf;  // 16-bit: through it
        l3d_st_to_f32(e->dtype, src, (size_t)(x1 - x0), d);
        size_t bad = l3d_ckpt_nonfinite(d, (size_t)(x1 - x0));
        if (bad < (size_t)(x1 - x0)) {
            long long col = (long long)(x0 + (int64_t)bad), row = (long long)y;
            if (h != frows || w != fcols)  // a rectangle of a sharded save: full-tensor place
                return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' holds %s at row %lld, "
                                 "column %lld of %s: the checkpoint is damaged or training "
                                 "diverged before it was saved", path, e->name,
                                 l3d_ckpt_nonfinite_name(d[bad]), row, col, p->name);
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' holds %s at element %lld "
                             "(row %lld, column %lld): the checkpoint is damaged or training "
                             "diverged before it was saved", path, e->name,
                             l3d_ckpt_nonfinite_name(d[bad]), row * (long long)w + col, row, col);
        }
        if (dt != L3D_FLOAT32) {  // rounded once (exact for a source of the same dtype)
            uint16_t *o = (uint16_t *)dst + at;
            for (int64_t i = 0; i < x1 - x0; i++)
                o[i] = dt == L3D_BFLOAT16 ? l3d_f32_to_bf16(d[i]) : l3d_f32_to_f16(d[i]);
        }
        *n += (size_t)(x1 - x0);
    }
    return L3D_OK;
}

l3d_status l3d_hf_set_read(l3d_model_t *m, const l3d_hf_set_t *set, const char *suffix,
                           void *dst, l3d_dtype dt) {
    l3d_ctx_t *ctx = m->ctx;
    // 16-bit: each row converts through a float32 row (checked for non-finite values there).
    size_t row_n = 0;
    for (int j = 0; dt != L3D_FLOAT32 && j < m->n_tensors; j++) {
        const l3d_param_t *p = &m->tensors[j];
        row_n = L3D_MAX(row_n, (size_t)(p->ndim == 2 ? p->shape[1] : p->shape[0]));
    }
    float *row = row_n ? l3d_malloc(ctx, row_n * sizeof(float), "staging") : NULL;
    if (row_n && !row) return L3D_ERR_NOMEM;
    // Progress in bytes of the tensors this rank reads from (its shards' full tensors).
    uint64_t total = 0, done = 0;
    char name[96];
    for (int j = 0; j < m->n_tensors; j++) {
        snprintf(name, sizeof(name), "%s%s", m->tensors[j].name, suffix);
        const l3d_st_tensor_t *e = l3d_hf_set_find(set, name, NULL);
        if (e) total += e->end - e->begin;
    }
    l3d_progress_t pr;
    l3d_progress_begin(ctx, &pr, total, "loading %s", set->origin);
    l3d_status st = L3D_OK;
    for (int j = 0; st >= 0 && j < m->n_tensors; j++) {
        const l3d_param_t *p = &m->tensors[j];
        const char *path = set->origin;
        snprintf(name, sizeof(name), "%s%s", p->name, suffix);
        int file = 0;
        const l3d_st_tensor_t *e = set_find(set, name, &path, &file);
        if (!e) {
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' is missing", set->origin, name);
            break;
        }
        size_t n = 0;
        st = l3d_ckpt_place(ctx, path, e, p, 0, 0, dst, dt, row, &n, set->files[file]);
        if (st >= 0 && (n != p->numel || (e->ndim == 2 && e->shape[0] * e->shape[1] !=
                                                              p->full[0] * p->full[1])))
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' does not have the shape of %s",
                           path, name, p->name);
        // Converted: its file pages leave this process (peak: the arena plus one tensor). A
        // tied model's last-stage copy rereads the embedding from the file.
        l3d_st_drop(set->files[file], e);
        done += e->end - e->begin;
        l3d_progress_update(&pr, done);
    }
    if (st >= 0) pr.done = total;
    l3d_progress_end(&pr);
    l3d_free(ctx, row, row_n * sizeof(float), "staging");
    return st;
}

// ---- saving ------------------------------------------------------------------------------
// A tensor's place in transformers' state_dict order (module registration order): the
// embedding; per layer q, k, v, o, gate, up, down, input_layernorm, post_attention_layernorm;
// model.norm; lm_head. The shard split follows this order.
static long long hf_order(const char *name) {
    static const char *const kinds[9] = {
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
        "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight"};
    if (!strcmp(name, "model.embed_tokens.weight")) return 0;
    if (!strcmp(name, "model.norm.weight")) return LLONG_MAX - 1;
    if (!strcmp(name, "lm_head.weight")) return LLONG_MAX;
    int layer = 0, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &layer, &used) == 1 && used > 0)
        for (int k = 0; k < 9; k++)
            if (!strcmp(name + used, kinds[k])) return 1 + 9LL * layer + k;
    return LLONG_MAX - 2;  // not a Llama tensor name: after the layers
}

typedef struct order_key {
    long long key;
    size_t i;
} order_key_t;

static int cmp_order(const void *a, const void *b) {
    const order_key_t *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key ? 1 : (x->i > y->i) - (x->i < y->i);
}

// Inside each file the safetensors library lays tensors out by name (same dtype).
static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const l3d_st_entry_t *)a)->name, ((const l3d_st_entry_t *)b)->name);
}

l3d_status l3d_hf_save_weights(l3d_model_t *m, const float *host, const char *dir,
                               l3d_st_dtype dtype, uint64_t max_shard_bytes) {
    l3d_ctx_t *ctx = m->ctx;
    size_t n = (size_t)m->n_tensors, es = l3d_st_dtype_size(dtype);
    if (dtype != L3D_ST_F32 && dtype != L3D_ST_BF16 && dtype != L3D_ST_F16)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "save: dtype %s (llama3d writes F32, BF16, "
                         "F16)", l3d_st_dtype_name(dtype));
    l3d_st_entry_t *e = l3d_calloc(ctx, n, sizeof(*e), "staging");
    int *shard = l3d_calloc(ctx, n, sizeof(int), "staging");
    order_key_t *ord = l3d_calloc(ctx, n, sizeof(*ord), "staging");
    l3d_status st = e && shard && ord ? L3D_OK : L3D_ERR_NOMEM;
    for (size_t i = 0; st >= 0 && i < n; i++) {
        const l3d_param_t *p = &m->tensors[i];
        e[i] = (l3d_st_entry_t){.name = p->name, .ndim = p->ndim, .data = host + p->offset,
                                .dtype = dtype};
        e[i].shape[0] = p->shape[0];
        e[i].shape[1] = p->shape[1];
        ord[i] = (order_key_t){hf_order(p->name), i};
    }
    if (st >= 0) qsort(ord, n, sizeof(*ord), cmp_order);
    // huggingface_hub's split, in state_dict order: a tensor larger than the limit gets a
    // shard of its own (numbered before the shard being filled); one that would overflow the
    // current shard closes it. Shards are numbered as they are closed.
    int nshards = 0, pending = 0;  // pending: tensors of the open shard (shard = -1)
    uint64_t cur_bytes = 0, total = 0;
    for (size_t k = 0; st >= 0 && k < n; k++) {
        size_t i = ord[k].i;
        uint64_t b = (uint64_t)m->tensors[i].numel * es;
        total += b;
        if (max_shard_bytes && b > max_shard_bytes) {
            shard[i] = nshards++;
            continue;
        }
        if (pending && max_shard_bytes && cur_bytes + b > max_shard_bytes) {
            for (size_t j = 0; j < n; j++)
                if (shard[j] == -1) shard[j] = nshards;
            nshards++;
            pending = 0;
            cur_bytes = 0;
        }
        shard[i] = -1;
        pending++;
        cur_bytes += b;
    }
    if (pending) {
        for (size_t j = 0; j < n; j++)
            if (shard[j] == -1) shard[j] = nshards;
        nshards++;
    }
    char path[1400], fname[64];
    const char *k[] = {"format"}, *v[] = {"pt"};
    if (st >= 0 && nshards <= 1) {
        qsort(e, n, sizeof(*e), cmp_entry_name);
        snprintf(path, sizeof(path), "%s/%s", dir, L3D_HF_WEIGHTS);
        st = l3d_st_write(ctx, path, e, n, k, v, 1);
    }
    json_t *index = NULL, *wm = NULL;
    if (st >= 0 && nshards > 1) {
        index = json_object();
        wm = json_object();
        json_t *meta = json_pack("{s:I}", "total_size", (json_int_t)total);
        if (!index || !wm || !meta || json_object_set_new(index, "metadata", meta) ||
            json_object_set(index, "weight_map", wm))
            st = l3d_error(ctx, L3D_ERR_NOMEM, "save: building %s", L3D_HF_INDEX);
    }
    l3d_st_entry_t *part = st >= 0 && nshards > 1 ? l3d_calloc(ctx, n, sizeof(*part), "staging")
                                                  : NULL;
    if (st >= 0 && nshards > 1 && !part) st = L3D_ERR_NOMEM;
    for (int s = 0; st >= 0 && nshards > 1 && s < nshards; s++) {
        size_t np = 0;
        for (size_t i = 0; i < n; i++)
            if (shard[i] == s) part[np++] = e[i];
        qsort(part, np, sizeof(*part), cmp_entry_name);
        snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", s + 1, nshards);
        snprintf(path, sizeof(path), "%s/%s", dir, fname);
        st = l3d_st_write(ctx, path, part, np, k, v, 1);
        for (size_t i = 0; st >= 0 && i < np; i++)
            if (json_object_set_new(wm, part[i].name, json_string(fname)))
                st = l3d_error(ctx, L3D_ERR_NOMEM, "save: building %s", L3D_HF_INDEX);
    }
    if (st >= 0 && index) {
        // As transformers writes it: json.dumps(index, indent=2, sort_keys=True) + "\n".
        char *text = json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS);
        snprintf(path, sizeof(path), "%s/%s", dir, L3D_HF_INDEX);
        if (!text) {
            st = l3d_error(ctx, L3D_ERR_NOMEM, "save: building %s", L3D_HF_INDEX);
        } else {
            l3d_iovec_t io[2] = {{text, strlen(text)}, {"\n", 1}};
            int rc = l3d_file_write_atomic(path, io, 2);
            if (rc) st = l3d_error(ctx, L3D_ERR_IO, "writing %s: %s", path, strerror(-rc));
            free(text);  // jansson's allocator: malloc by default
        }
    }
    json_decref(wm);
    json_decref(index);
    l3d_free(ctx, part, n * sizeof(*part), "staging");
    l3d_free(ctx, ord, n * sizeof(*ord), "staging");
    l3d_free(ctx, shard, n * sizeof(int), "staging");
    l3d_free(ctx, e, n * sizeof(*e), "staging");
    return st;
}

// ---- files carried beside the weights ----------------------------------------------------
l3d_status l3d_ckpt_carry_files(l3d_ctx_t *ctx, const char *from, const char *to) {
    char src[1200], dst[1400];
    for (const char *const *c = l3d_ckpt_carried_files; *c; c++) {
        snprintf(src, sizeof(src), "%s/%s", from, *c);
        if (!l3d_path_present(src)) continue;
        char *buf = NULL;
        size_t len = 0;
        // A tokenizer.json is a few MB; 1 GB bounds a wrong file without refusing a real one.
        L3D_CHECK(ctx, l3d_input_read(ctx, src, NULL, (size_t)1 << 30, &buf, &len));
        snprintf(dst, sizeof(dst), "%s/%s", to, *c);
        l3d_iovec_t io = {buf, len};
        int rc = l3d_file_write_atomic(dst, &io, 1);
        free(buf);
        if (rc) return l3d_error(ctx, L3D_ERR_IO, "writing %s: %s", dst, strerror(-rc));
    }
    return L3D_OK;
}
