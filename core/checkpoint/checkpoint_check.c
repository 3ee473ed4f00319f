// Checkpoint validation before allocation: tensor indexes against config.json, exact coverage
// of sharded checkpoints, the manifest and the layout. Reading headers only (the data is
// memory-mapped and untouched), so a lying checkpoint costs nothing to refuse.
#include "core/checkpoint/checkpoint_check.h"
#include "core/checkpoint/checkpoint_hf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint/checkpoint_dist.h"
#include "core/input.h"
#include "core/l3d_core.h"

const char *const l3d_ckpt_suffix[3] = {"", ".exp_avg", ".exp_avg_sq"};

// ---- the model's tensors -----------------------------------------------------------------
static const char *const k_kinds[9] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight",         "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight",         "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",              "mlp.down_proj.weight",
};

static void kind_shape(const l3d_model_config_t *c, int k, int *ndim, int64_t s[2]) {
    int64_t C = c->hidden_size, F = c->intermediate_size;
    int64_t HD = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t KD = (int64_t)c->num_key_value_heads * c->head_dim;
    const int64_t rows[9] = {C, HD, KD, KD, C, C, F, F, C}, cols[9] = {0, C, C, C, HD, 0, C, C, F};
    *ndim = cols[k] ? 2 : 1;
    s[0] = rows[k];
    s[1] = cols[k];
}

static size_t n_ids(const l3d_model_config_t *cfg) { return 3 + 9 * (size_t)cfg->num_hidden_layers; }
static size_t id_head(const l3d_model_config_t *cfg) { return n_ids(cfg) - 1; }
// The ids a checkpoint must hold: all but lm_head when the embeddings are tied.
static int id_required(const l3d_model_config_t *cfg, size_t id) {
    return !(id == id_head(cfg) && cfg->tie_word_embeddings);
}

static void id_name(const l3d_model_config_t *cfg, size_t id, char *out, size_t cap) {
    size_t L = (size_t)cfg->num_hidden_layers;
    if (id == 0) snprintf(out, cap, "model.embed_tokens.weight");
    else if (id <= 9 * L) snprintf(out, cap, "model.layers.%zu.%s", (id - 1) / 9, k_kinds[(id - 1) % 9]);
    else if (id == 9 * L + 1) snprintf(out, cap, "model.norm.weight");
    else snprintf(out, cap, "lm_head.weight");
}

static void id_shape(const l3d_model_config_t *cfg, size_t id, int *ndim, int64_t s[2]) {
    size_t L = (size_t)cfg->num_hidden_layers;
    if (id >= 1 && id <= 9 * L) {
        kind_shape(cfg, (int)((id - 1) % 9), ndim, s);
        return;
    }
    *ndim = id == 9 * L + 1 ? 1 : 2;
    s[0] = *ndim == 1 ? cfg->hidden_size : cfg->vocab_size;
    s[1] = *ndim == 1 ? 0 : cfg->hidden_size;
}

int l3d_ckpt_tensor_of(const l3d_model_config_t *cfg, const char *name, int *ndim,
                       int64_t shape[2]) {
    int64_t V = cfg->vocab_size, C = cfg->hidden_size;
    int L = cfg->num_hidden_layers;
    if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "lm_head.weight")) {
        *ndim = 2;
        shape[0] = V;
        shape[1] = C;
        return name[0] == 'l' ? (int)id_head(cfg) : 0;
    }
    if (!strcmp(name, "model.norm.weight")) {
        *ndim = 1;
        shape[0] = C;
        shape[1] = 0;
        return 1 + 9 * L;
    }
    static const char pre[] = "model.layers.";
    if (strncmp(name, pre, sizeof(pre) - 1)) return -1;
    const char *p = name + sizeof(pre) - 1;
    // a plain decimal below L: no sign, no leading zero ("model.layers.01" is not layer 1)
    long l = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 7; p++, digits++) l = l * 10 + (*p - '0');
    if (!digits || *p != '.' || (digits > 1 && p[-digits] == '0') || l >= L) return -1;
    for (int k = 0; k < 9; k++)
        if (!strcmp(p + 1, k_kinds[k])) {
            kind_shape(cfg, k, ndim, shape);
            return 1 + 9 * (int)l + k;
        }
    return -1;
}

static void shape_str(char *out, size_t cap, int ndim, const int64_t *s) {
    if (ndim == 1) snprintf(out, cap, "[%lld]", (long long)s[0]);
    else if (ndim == 2) snprintf(out, cap, "[%lld, %lld]", (long long)s[0], (long long)s[1]);
    else snprintf(out, cap, "%d dimensions", ndim);
}

static int is_float(l3d_st_dtype d) {
    return d == L3D_ST_F32 || d == L3D_ST_F16 || d == L3D_ST_BF16 || d == L3D_ST_F64;
}

// ---- Hugging Face layout -----------------------------------------------------------------
int l3d_ckpt_tensor_name(const l3d_model_config_t *cfg, size_t id, char *out, size_t cap) {
    if (id >= n_ids(cfg)) return -1;
    id_name(cfg, id, out, cap);
    return 0;
}
int l3d_ckpt_tensor_required(const l3d_model_config_t *cfg, size_t id) {
    return id < n_ids(cfg) && id_required(cfg, id);
}
size_t l3d_ckpt_tensor_count(const l3d_model_config_t *cfg) {
    return n_ids(cfg) - !id_required(cfg, id_head(cfg));
}

l3d_status l3d_ckpt_check_file_tensors(l3d_ctx_t *ctx, const l3d_model_config_t *cfg,
                                       const char *cfg_origin, const l3d_st_file_t *f,
                                       const char *path, const char *suffix) {
    size_t sl = strlen(suffix);
    for (size_t i = 0; i < l3d_st_count(f); i++) {
        const l3d_st_tensor_t *e = l3d_st_at(f, i);
        size_t nl = strlen(e->name);
        char base[128];
        int id = -1, nd = 0;
        int64_t s[2];
        if (nl > sl && nl - sl < sizeof(base) && !strcmp(e->name + nl - sl, suffix)) {
            memcpy(base, e->name, nl - sl);
            base[nl - sl] = 0;
            id = l3d_ckpt_tensor_of(cfg, base, &nd, s);
        }
        if (id < 0)
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' is not part of the model %s "
                             "describes (%d layers)", path, e->name, cfg_origin,
                             cfg->num_hidden_layers);
        int same = e->ndim == nd && e->shape[0] == s[0] && (nd == 1 || e->shape[1] == s[1]);
        if (!same) {
            char got[64], want[64];
            shape_str(got, sizeof(got), e->ndim, e->shape);
            shape_str(want, sizeof(want), nd, s);
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' has shape %s but %s implies "
                             "%s", path, e->name, got, cfg_origin, want);
        }
        if (!is_float(e->dtype))
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' is not floating point "
                             "(llama3d reads F32, F16, BF16 and F64)", path, e->name);
    }
    return L3D_OK;
}

// ---- sharded layout ----------------------------------------------------------------------
int l3d_ckpt_rect_name_parse(const char *ename, char *base, size_t cap, int *suffix, int64_t *R,
                             int64_t *C) {
    const char *at = strrchr(ename, '@');
    size_t len = at ? (size_t)(at - ename) : 0;
    if (!at || len == 0 || len >= cap) return -1;
    int64_t v[2] = {0, 0};
    const char *p = at + 1;
    for (int k = 0; k < 2; k++) {
        int digits = 0;
        for (; *p >= '0' && *p <= '9'; p++, digits++) {
            if (digits == 15) return -1;  // far beyond any tensor; keeps R + h in range
            v[k] = v[k] * 10 + (*p - '0');
        }
        if (!digits || *p != (k == 0 ? ',' : '\0')) return -1;
        p++;
    }
    memcpy(base, ename, len);
    base[len] = 0;
    *suffix = 0;
    for (int s = 2; s >= 1 && !*suffix; s--) {
        size_t sl = strlen(l3d_ckpt_suffix[s]);
        if (len > sl && !strcmp(base + len - sl, l3d_ckpt_suffix[s])) {
            base[len - sl] = 0;
            *suffix = s;
        }
    }
    *R = v[0];
    *C = v[1];
    return 0;
}

typedef struct srect {
    size_t id;
    int s;
    int64_t R, C, h, w;
    uint32_t file, entry;
} srect_t;

static int srect_cmp(const void *a, const void *b) {
    const srect_t *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    if (x->R != y->R) return x->R < y->R ? -1 : 1;
    if (x->C != y->C) return x->C < y->C ? -1 : 1;
    return 0;
}

static l3d_status load_json(l3d_ctx_t *ctx, const char *path, json_t **root_p) {
    L3D_CHECK(ctx, l3d_input_json(ctx, path, NULL, 0, root_p));
    if (!json_is_object(*root_p)) {
        json_decref(*root_p);
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return L3D_OK;
}

l3d_status l3d_ckpt_check_layout(l3d_ctx_t *ctx, const char *path, json_t *state, int world) {
    json_t *lay = json_object_get(state, "layout");
    if (!json_is_object(lay))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: 'layout' is missing or not an object "
                         "{dp, tp, pp, virtual_stages}", path);
    static const char *const keys[] = {"dp", "tp", "pp", "virtual_stages"};
    long long v[4];
    for (int i = 0; i < 4; i++) {
        json_t *x = json_object_get(lay, keys[i]);
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > (1 << 20))
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: layout.%s is missing or not a positive "
                             "integer", path, keys[i]);
        v[i] = json_integer_value(x);
    }
    if (json_object_size(lay) != 4) {
        const char *k;
        json_t *x;
        json_object_foreach(lay, k, x) {
            if (strcmp(k, "dp") && strcmp(k, "tp") && strcmp(k, "pp") && strcmp(k, "virtual_stages"))
                return l3d_error(ctx, L3D_ERR_FORMAT, "%s: layout.%s is not a layout key (dp, "
                                 "tp, pp, virtual_stages)", path, k);
        }
    }
    if (world > 0 && v[0] * v[1] * v[2] != world)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: layout dp %lld x tp %lld x pp %lld is not the "
                         "%d ranks that wrote the shards", path, v[0], v[1], v[2], world);
    return L3D_OK;
}

// shards.json: the format, `world`, and exactly the files world ranks write, in rank order.
static l3d_status check_manifest(l3d_ctx_t *ctx, const char *dir, int *world_p) {
    char path[1100];
    snprintf(path, sizeof(path), "%s/shards.json", dir);
    json_t *root;
    L3D_CHECK(ctx, load_json(ctx, path, &root));
    json_t *fmt = json_object_get(root, "format"), *w = json_object_get(root, "world");
    json_t *files = json_object_get(root, "files");
    l3d_status st = L3D_OK;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), L3D_CKPT_DIST_FORMAT))
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: format is not '%s'", path, L3D_CKPT_DIST_FORMAT);
    else if (!json_is_integer(w) || json_integer_value(w) < 1 || json_integer_value(w) > 99999)
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: 'world' is missing or not a rank count", path);
    else if (!json_is_array(files) || json_array_size(files) != (size_t)json_integer_value(w))
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: 'files' must list the %lld shard files of "
                       "'world' %lld", path, (long long)json_integer_value(w),
                       (long long)json_integer_value(w));
    for (size_t i = 0; st >= 0 && i < json_array_size(files); i++) {
        char want[64];
        snprintf(want, sizeof(want), "shard-%05zu-of-%05lld.safetensors", i,
                 (long long)json_integer_value(w));
        json_t *f = json_array_get(files, i);
        if (!json_is_string(f) || strcmp(json_string_value(f), want))
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: files[%zu] is not '%s' (world %lld)", path,
                           i, want, (long long)json_integer_value(w));
    }
    if (st >= 0) *world_p = (int)json_integer_value(w);
    json_decref(root);
    return st;
}

// Every entry of every shard file as a rectangle of a whole-model tensor, checked to lie
// inside it. *rects_p is l3d_malloc'd (n_p entries); files stay open for the messages.
static l3d_status collect(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, const char *cfg_origin,
                          l3d_st_file_t **f, char (*paths)[1100], int world, srect_t **rects_p,
                          size_t *n_p) {
    size_t n = 0;
    for (int i = 0; i < world; i++) n += l3d_st_count(f[i]);
    srect_t *r = l3d_malloc(ctx, (n ? n : 1) * sizeof(*r), "staging");
    if (!r) return L3D_ERR_NOMEM;
    *rects_p = r;
    *n_p = n;
    size_t k = 0;
    for (int i = 0; i < world; i++)
        for (size_t j = 0; j < l3d_st_count(f[i]); j++, k++) {
            const l3d_st_tensor_t *e = l3d_st_at(f[i], j);
            char base[128];
            int s, nd = 0, id = -1;
            int64_t R, C, fs[2];
            if (l3d_ckpt_rect_name_parse(e->name, base, sizeof(base), &s, &R, &C))
                return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' is not named "
                                 "<tensor>[.exp_avg|.exp_avg_sq]@ROW,COL", paths[i], e->name);
            id = l3d_ckpt_tensor_of(cfg, base, &nd, fs);
            // A tied model's lm_head is its embedding: sharded saves never write it.
            if (id < 0 || !id_required(cfg, (size_t)id))
                return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' is not part of the model "
                                 "%s describes (%d layers)", paths[i], e->name, cfg_origin,
                                 cfg->num_hidden_layers);
            int64_t frows = nd == 2 ? fs[0] : 1, fcols = nd == 2 ? fs[1] : fs[0];
            int64_t h = e->ndim == 2 ? e->shape[0] : 1, w = e->ndim >= 1 ? e->shape[e->ndim - 1] : 0;
            if (e->dtype != L3D_ST_F32 || e->ndim != nd || h < 1 || w < 1 || R > frows - h ||
                C > fcols - w || (nd == 1 && R != 0))
                return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' (%lld x %lld at %lld,%lld)"
                                 " does not fit %s (%lld x %lld, float32)", paths[i], e->name,
                                 (long long)h, (long long)w, (long long)R, (long long)C, base,
                                 (long long)frows, (long long)fcols);
            r[k] = (srect_t){(size_t)id, s, R, C, h, w, (uint32_t)i, (uint32_t)j};
        }
    return L3D_OK;
}

// Sorted by (suffix, tensor, row, col): each tensor's rectangles must be disjoint and add up
// to its size; every required tensor must have some (parameters always, moments when asked
// for or present).
static l3d_status coverage(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, const char *dir,
                           l3d_st_file_t **f, char (*paths)[1100], srect_t *r, size_t n, int optim) {
    qsort(r, n, sizeof(*r), srect_cmp);
    int present[3] = {1, optim, optim};
    for (size_t i = 0; i < n; i++) present[r[i].s] = 1;
    size_t i = 0;
    for (int s = 0; s < 3; s++) {
        if (!present[s]) continue;
        for (size_t id = 0; id < n_ids(cfg); id++) {
            if (!id_required(cfg, id)) continue;
            char name[128];
            int nd;
            int64_t fs[2];
            id_shape(cfg, id, &nd, fs);
            uint64_t numel = (uint64_t)fs[0] * (uint64_t)(nd == 2 ? fs[1] : 1), got = 0;
            size_t g0 = i;
            for (; i < n && r[i].s == s && r[i].id == id; i++) {
                got += (uint64_t)r[i].h * (uint64_t)r[i].w;
                for (size_t j = i + 1; j < n && r[j].s == s && r[j].id == id &&
                                       r[j].R < r[i].R + r[i].h; j++)
                    if (r[j].C < r[i].C + r[i].w && r[i].C < r[j].C + r[j].w)
                        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' overlaps '%s' of "
                                         "%s (every element must be in exactly one shard entry)",
                                         paths[r[j].file], l3d_st_at(f[r[j].file], r[j].entry)->name,
                                         l3d_st_at(f[r[i].file], r[i].entry)->name,
                                         paths[r[i].file]);
            }
            if (got != numel) {
                id_name(cfg, id, name, sizeof(name));
                return l3d_error(ctx, L3D_ERR_FORMAT, "checkpoint %s: tensor '%s%s' has %llu of "
                                 "its %llu elements in the shards (%s)", dir, name,
                                 l3d_ckpt_suffix[s], (unsigned long long)got,
                                 (unsigned long long)numel,
                                 i == g0 ? "no shard has it" : "a shard entry is missing");
            }
        }
    }
    return L3D_OK;
}

l3d_status l3d_ckpt_dist_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg,
                               const char *cfg_origin, const char *dir, int optim) {
    int world = 0;
    L3D_CHECK(ctx, check_manifest(ctx, dir, &world));
    char state_path[1100];
    snprintf(state_path, sizeof(state_path), "%s/trainer_state.json", dir);
    json_t *state;
    L3D_CHECK(ctx, load_json(ctx, state_path, &state));
    l3d_status st = l3d_ckpt_check_layout(ctx, state_path, state, world);
    json_decref(state);
    L3D_CHECK(ctx, st);
    l3d_st_file_t **f = l3d_calloc(ctx, (size_t)world, sizeof(*f), "staging");
    char(*paths)[1100] = l3d_calloc(ctx, (size_t)world, sizeof(*paths), "staging");
    srect_t *r = NULL;
    size_t n = 0;
    st = f && paths ? L3D_OK : L3D_ERR_NOMEM;
    for (int i = 0; st >= 0 && i < world; i++) {
        snprintf(paths[i], sizeof(paths[i]), "%s/shard-%05d-of-%05d.safetensors", dir, i, world);
        st = l3d_st_open(ctx, paths[i], &f[i]);
    }
    if (st >= 0) st = collect(ctx, cfg, cfg_origin, f, paths, world, &r, &n);
    if (st >= 0) st = coverage(ctx, cfg, dir, f, paths, r, n, optim);
    if (r) l3d_free(ctx, r, (n ? n : 1) * sizeof(*r), "staging");
    for (int i = 0; f && i < world; i++) l3d_st_close(f[i]);
    l3d_free(ctx, paths, (size_t)world * sizeof(*paths), "staging");
    l3d_free(ctx, f, (size_t)world * sizeof(*f), "staging");
    return st;
}

// ---- either layout -----------------------------------------------------------------------
l3d_status l3d_ckpt_check(l3d_ctx_t *ctx, const char *dir, const l3d_model_config_t *cfg,
                          int optim) {
    char cfg_path[1100], path[1100];
    snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", dir);
    if (l3d_ckpt_dist_is(dir)) return l3d_ckpt_dist_check(ctx, cfg, cfg_path, dir, optim);
    // The weights: one file or index + shards; the moments: one file each.
    l3d_hf_set_t set;
    static const char *const files[3] = {NULL, "optimizer.safetensors", "optimizer_sq.safetensors"};
    for (int s = 0; s < (optim ? 3 : 1); s++) {
        if (s == 0) {
            L3D_CHECK(ctx, l3d_hf_set_open(ctx, dir, &set));
        } else {
            snprintf(path, sizeof(path), "%s/%s", dir, files[s]);
            L3D_CHECK(ctx, l3d_hf_set_open_file(ctx, path, &set));
        }
        l3d_status st = l3d_hf_set_check(ctx, cfg, cfg_path, &set, l3d_ckpt_suffix[s]);
        l3d_hf_set_close(&set);
        L3D_CHECK(ctx, st);
    }
    return L3D_OK;
}

// ---- values ------------------------------------------------------------------------------
size_t l3d_ckpt_nonfinite(const float *x, size_t n) {
    // Exponent all ones is NaN or infinity. Blocks keep the scan vectorisable.
    size_t i = 0;
    for (; i < n; i += 1024) {
        size_t end = n - i < 1024 ? n : i + 1024;
        uint32_t bad = 0;
        for (size_t j = i; j < end; j++) {
            uint32_t u;
            memcpy(&u, &x[j], sizeof(u));
            bad |= (uint32_t)((u & 0x7F800000u) == 0x7F800000u);
        }
        if (!bad) continue;
        for (size_t j = i; j < end; j++) {
            uint32_t u;
            memcpy(&u, &x[j], sizeof(u));
            if ((u & 0x7F800000u) == 0x7F800000u) return j;
        }
    }
    return n;
}

const char *l3d_ckpt_nonfinite_name(float v) { return v != v ? "nan" : v > 0 ? "inf" : "-inf"; }
