// Model configuration: the built-in Llama 3 presets, Hugging Face config.json in and out,
// consistency checks and the parameter count.
// defines: l3d_model_config_preset, l3d_model_config_preset_names, l3d_model_config_from_json,
//          l3d_model_config_from_file, l3d_model_config_validate, l3d_model_config_to_json,
//          l3d_model_config_num_params
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/l3d_core.h"
#include "llama3d/config.h"
#include "platform/platform.h"

// ---- presets -----------------------------------------------------------------------------
// Values from the released Hugging Face config.json files (Llama 3.1 for 8B/70B/405B, whose
// llama3 rope scaling extends the context to 128K) and the paper's Table 3.
typedef struct preset {
    const char *name;
    int C, F, L, H, KVH, D, V, max_pos;
    float rope_factor;  // 0: no rope scaling
    int tied, bos, eos;
} preset_t;

static const preset_t k_presets[] = {
    // vocab 264: the byte tokenizer uses ids 0..258; 264 divides by 8 for tensor parallelism.
    {"llama3-tiny", 128, 384, 4, 4, 2, 32, 264, 1024, 0.0f, 1, 256, 257},
    {"llama3.2-1b", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 32.0f, 1, 128000, 128001},
    {"llama3.2-3b", 3072, 8192, 28, 24, 8, 128, 128256, 131072, 32.0f, 1, 128000, 128001},
    {"llama3-8b", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 8.0f, 0, 128000, 128001},
    {"llama3-70b", 8192, 28672, 80, 64, 8, 128, 128256, 131072, 8.0f, 0, 128000, 128001},
    {"llama3-405b", 16384, 53248, 126, 128, 8, 128, 128256, 131072, 8.0f, 0, 128000, 128001},
};

static const char *const k_preset_names[] = {"llama3-tiny", "llama3.2-1b", "llama3.2-3b",
                                             "llama3-8b",   "llama3-70b",  "llama3-405b", NULL};

const char *const *l3d_model_config_preset_names(void) { return k_preset_names; }

l3d_status l3d_model_config_preset(l3d_ctx_t *ctx, const char *name, l3d_model_config_t *cfg) {
    if (!name || !cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "model preset: NULL argument");
    for (size_t i = 0; i < L3D_ARRAY_LEN(k_presets); i++) {
        const preset_t *p = &k_presets[i];
        if (strcmp(p->name, name) != 0) continue;
        // Zero everything (including the tail of name[]) so configs compare with memcmp.
        memset(cfg, 0, sizeof(*cfg));
        snprintf(cfg->name, sizeof(cfg->name), "%s", p->name);
        cfg->hidden_size = p->C;
        cfg->intermediate_size = p->F;
        cfg->num_hidden_layers = p->L;
        cfg->num_attention_heads = p->H;
        cfg->num_key_value_heads = p->KVH;
        cfg->head_dim = p->D;
        cfg->vocab_size = p->V;
        cfg->max_position_embeddings = p->max_pos;
        cfg->rms_norm_eps = 1e-5f;
        cfg->rope_theta = 500000.0f;
        if (p->rope_factor > 0.0f) {
            cfg->rope_scaling_llama3 = 1;
            cfg->rope_factor = p->rope_factor;
            cfg->rope_low_freq_factor = 1.0f;
            cfg->rope_high_freq_factor = 4.0f;
            cfg->rope_original_max_position_embeddings = 8192;
        }
        cfg->tie_word_embeddings = p->tied;
        cfg->bos_token_id = p->bos;
        cfg->eos_token_id = p->eos;
        cfg->initializer_range = 0.02f;
        return L3D_OK;
    }
    return l3d_error(ctx, L3D_ERR_NOT_FOUND,
                     "unknown model preset '%s' (presets: llama3-tiny, llama3.2-1b, llama3.2-3b, "
                     "llama3-8b, llama3-70b, llama3-405b)",
                     name);
}

// ---- key suggestions ---------------------------------------------------------------------
// Edit distance, for "did you mean" hints. Keys are short; longer ones count as far away.
static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return (size_t)-1;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = (a[i - 1] == b[j - 1]) ? 0 : 1;
            size_t best = L3D_MIN(row[j] + 1, row[j - 1] + 1);
            row[j] = L3D_MIN(best, diag + cost);
            diag = up;
        }
    }
    return row[lb];
}

static const char *nearest(const char *key, const char *const *valid, size_t n) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(key, valid[i]);
        if (d < best_d) {
            best_d = d;
            best = valid[i];
        }
    }
    // Only suggest what looks like a typo, not an unrelated key.
    size_t limit = L3D_MAX((size_t)2, strlen(key) / 3);
    return best_d <= limit ? best : NULL;
}

static l3d_status validate(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, const char *n);

// ---- Hugging Face config.json ------------------------------------------------------------
// Keys that set a field of l3d_model_config_t.
static const char *const k_hf_keys[] = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
    "rope_scaling", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
    "eos_token_id", "initializer_range",
    // checked against what llama3d computes
    "model_type", "hidden_act", "pretraining_tp", "attention_dropout", "attention_bias",
    "mlp_bias",
    // bookkeeping that HF writes and that does not change the math: ignored
    "_name_or_path", "architectures", "torch_dtype", "dtype", "transformers_version",
    "pad_token_id", "use_cache", "output_attentions", "output_hidden_states", "return_dict",
    "tokenizer_class", "id2label", "label2id", "auto_map", "_attn_implementation",
};

typedef struct hf_parser {
    l3d_ctx_t *ctx;
    const char *origin;
    json_t *root;
} hf_parser_t;

static l3d_status hf_type_error(const hf_parser_t *p, const char *key, const json_t *v,
                                const char *want) {
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: %s: \"auto\" is a Hugging Face Trainer placeholder; replace it by %s",
                         p->origin, key, want);
    return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: expected %s", p->origin, key, want);
}

// Reads an integer key (integral reals such as 8192.0 accepted). *present = 0 if absent.
static l3d_status hf_int(const hf_parser_t *p, const char *key, int lo, int *out, int *present) {
    json_t *v = json_object_get(p->root, key);
    *present = 0;
    if (!v) return L3D_OK;
    double d;
    if (json_is_integer(v)) {
        d = (double)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) {
        d = json_real_value(v);
    } else {
        return hf_type_error(p, key, v, "an integer");
    }
    if (d < lo || d > 2147483647.0)
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: %.0f is out of range (minimum %d)",
                         p->origin, key, d, lo);
    *out = (int)d;
    *present = 1;
    return L3D_OK;
}

static l3d_status hf_num_value(const hf_parser_t *p, const char *key, const json_t *v,
                               float *out) {
    if (!json_is_number(v)) return hf_type_error(p, key, v, "a number");
    double d = json_number_value(v);
    if (!isfinite(d) || fabs(d) > 3.0e38)
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: %g does not fit a float", p->origin,
                         key, d);
    *out = (float)d;
    return L3D_OK;
}

static l3d_status hf_num(const hf_parser_t *p, const char *key, float *out) {
    json_t *v = json_object_get(p->root, key);
    if (!v) return L3D_OK;
    return hf_num_value(p, key, v, out);
}

static l3d_status hf_bool(const hf_parser_t *p, const char *key, int *out) {
    json_t *v = json_object_get(p->root, key);
    if (!v) return L3D_OK;
    if (!json_is_boolean(v)) return hf_type_error(p, key, v, "true or false");
    *out = json_is_true(v);
    return L3D_OK;
}

// A token id: an integer, null (no such token: -1), or for eos a list whose first entry is
// the end-of-text id (Llama 3.1 Instruct lists 128001, 128008, 128009).
static l3d_status hf_token(const hf_parser_t *p, const char *key, int allow_list, int *out) {
    json_t *v = json_object_get(p->root, key);
    if (!v) return L3D_OK;
    if (json_is_null(v)) {
        *out = -1;
        return L3D_OK;
    }
    if (allow_list && json_is_array(v)) {
        if (json_array_size(v) == 0)
            return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: the list is empty", p->origin, key);
        v = json_array_get(v, 0);
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 2147483647)
        return hf_type_error(p, key, v,
                             allow_list ? "a token id, a list of token ids or null"
                                        : "a token id or null");
    *out = (int)json_integer_value(v);
    return L3D_OK;
}

static l3d_status hf_rope_scaling(const hf_parser_t *p, l3d_model_config_t *cfg) {
    json_t *rs = json_object_get(p->root, "rope_scaling");
    cfg->rope_scaling_llama3 = 0;
    cfg->rope_factor = cfg->rope_low_freq_factor = cfg->rope_high_freq_factor = 0.0f;
    cfg->rope_original_max_position_embeddings = 0;
    if (!rs || json_is_null(rs)) return L3D_OK;
    if (!json_is_object(rs))
        return hf_type_error(p, "rope_scaling", rs, "null or an object with rope_type \"llama3\"");
    // transformers writes "rope_type"; configs from before 4.43 spell it "type".
    json_t *t = json_object_get(rs, "rope_type");
    const char *tkey = "rope_scaling.rope_type";
    if (!t) {
        t = json_object_get(rs, "type");
        tkey = "rope_scaling.type";
    }
    if (!t || !json_is_string(t))
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: rope_scaling.rope_type: missing or not a string (llama3d supports "
                         "\"llama3\")",
                         p->origin);
    const char *type = json_string_value(t);
    if (strcmp(type, "default") == 0) {
        // HF's name for plain RoPE: the same as rope_scaling null.
        const char *k;
        json_t *kv;
        json_object_foreach(rs, k, kv) {
            if (strcmp(k, "rope_type") != 0 && strcmp(k, "type") != 0)
                return l3d_error(p->ctx, L3D_ERR_CONFIG,
                                 "%s: rope_scaling.%s: not used with rope_type \"default\"",
                                 p->origin, k);
        }
        return L3D_OK;
    }
    if (strcmp(type, "llama3") != 0)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: %s: \"%s\" is not supported (llama3d supports \"llama3\" or "
                         "rope_scaling null)",
                         p->origin, tkey, type);
    static const char *const valid[] = {"rope_type", "type", "factor", "low_freq_factor",
                                        "high_freq_factor", "original_max_position_embeddings"};
    const char *k;
    json_t *kv;
    json_object_foreach(rs, k, kv) {
        int ok = 0;
        for (size_t i = 0; i < L3D_ARRAY_LEN(valid); i++) ok |= strcmp(k, valid[i]) == 0;
        if (!ok) {
            const char *s = nearest(k, valid, L3D_ARRAY_LEN(valid));
            return l3d_error(p->ctx, L3D_ERR_CONFIG,
                             "%s: unknown key 'rope_scaling.%s'%s%s%s", p->origin, k,
                             s ? " (did you mean 'rope_scaling." : "", s ? s : "", s ? "'?)" : "");
        }
    }
    static const char *const need[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    for (size_t i = 0; i < L3D_ARRAY_LEN(need); i++)
        if (!json_object_get(rs, need[i]))
            return l3d_error(p->ctx, L3D_ERR_CONFIG,
                             "%s: rope_scaling.%s: missing (rope_type \"llama3\" needs factor, "
                             "low_freq_factor, high_freq_factor, original_max_position_embeddings)",
                             p->origin, need[i]);
    L3D_CHECK(p->ctx, hf_num_value(p, "rope_scaling.factor", json_object_get(rs, "factor"),
                                   &cfg->rope_factor));
    L3D_CHECK(p->ctx, hf_num_value(p, "rope_scaling.low_freq_factor",
                                   json_object_get(rs, "low_freq_factor"),
                                   &cfg->rope_low_freq_factor));
    L3D_CHECK(p->ctx, hf_num_value(p, "rope_scaling.high_freq_factor",
                                   json_object_get(rs, "high_freq_factor"),
                                   &cfg->rope_high_freq_factor));
    json_t *orig = json_object_get(rs, "original_max_position_embeddings");
    if (!json_is_integer(orig) || json_integer_value(orig) <= 0 ||
        json_integer_value(orig) > 2147483647)
        return hf_type_error(p, "rope_scaling.original_max_position_embeddings", orig,
                             "a positive integer");
    cfg->rope_original_max_position_embeddings = (int)json_integer_value(orig);
    cfg->rope_scaling_llama3 = 1;
    return L3D_OK;
}

// The keys whose only allowed value is what llama3d computes.
static l3d_status hf_fixed(const hf_parser_t *p) {
    json_t *v;
    if ((v = json_object_get(p->root, "model_type")) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "llama") == 0))
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: model_type: must be \"llama\" (llama3d implements LlamaForCausalLM)",
                         p->origin);
    if ((v = json_object_get(p->root, "hidden_act")) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "silu") == 0))
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: hidden_act: only \"silu\" (SwiGLU) is implemented", p->origin);
    if ((v = json_object_get(p->root, "pretraining_tp")) &&
        !(json_is_integer(v) && json_integer_value(v) == 1))
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: pretraining_tp: must be 1 (sliced-matmul emulation is not "
                         "implemented)",
                         p->origin);
    if ((v = json_object_get(p->root, "attention_dropout")) &&
        !(json_is_number(v) && json_number_value(v) == 0.0))
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: attention_dropout: must be 0 (dropout is not implemented)",
                         p->origin);
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++)
        if ((v = json_object_get(p->root, no_bias[i])) && !json_is_false(v))
            return l3d_error(p->ctx, L3D_ERR_CONFIG,
                             "%s: %s: must be false (Llama 3 has no bias terms; biases are not "
                             "implemented)",
                             p->origin, no_bias[i]);
    return L3D_OK;
}

static l3d_status hf_parse(const hf_parser_t *p, l3d_model_config_t *cfg) {
    const char *key;
    json_t *val;
    json_object_foreach(p->root, key, val) {
        int ok = 0;
        for (size_t i = 0; i < L3D_ARRAY_LEN(k_hf_keys) && !ok; i++)
            ok = strcmp(key, k_hf_keys[i]) == 0;
        if (ok) continue;
        const char *s = nearest(key, k_hf_keys, L3D_ARRAY_LEN(k_hf_keys));
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: unknown key '%s'%s%s%s (llama3d rejects keys it does not "
                         "implement rather than ignore them)",
                         p->origin, key, s ? " (did you mean '" : "", s ? s : "",
                         s ? "'?)" : "");
    }
    L3D_CHECK(p->ctx, hf_fixed(p));

    // Sizes have no sensible default: a config.json without them is not a Llama config.
    static const char *const required[] = {"hidden_size", "intermediate_size",
                                           "num_hidden_layers", "num_attention_heads",
                                           "vocab_size"};
    int *dst[] = {&cfg->hidden_size, &cfg->intermediate_size, &cfg->num_hidden_layers,
                  &cfg->num_attention_heads, &cfg->vocab_size};
    int present;
    for (size_t i = 0; i < L3D_ARRAY_LEN(required); i++) {
        L3D_CHECK(p->ctx, hf_int(p, required[i], 1, dst[i], &present));
        if (!present)
            return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: missing (required)", p->origin,
                             required[i]);
    }
    // The rest default as in transformers' LlamaConfig.
    cfg->num_key_value_heads = cfg->num_attention_heads;
    L3D_CHECK(p->ctx, hf_int(p, "num_key_value_heads", 1, &cfg->num_key_value_heads, &present));
    L3D_CHECK(p->ctx, hf_int(p, "head_dim", 1, &cfg->head_dim, &present));
    if (!present) {
        if (cfg->hidden_size % cfg->num_attention_heads != 0)
            return l3d_error(p->ctx, L3D_ERR_CONFIG,
                             "%s: hidden_size: %d is not divisible by num_attention_heads %d "
                             "(or give head_dim)",
                             p->origin, cfg->hidden_size, cfg->num_attention_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    }
    cfg->max_position_embeddings = 2048;
    L3D_CHECK(p->ctx,
              hf_int(p, "max_position_embeddings", 1, &cfg->max_position_embeddings, &present));
    cfg->rms_norm_eps = 1e-6f;
    L3D_CHECK(p->ctx, hf_num(p, "rms_norm_eps", &cfg->rms_norm_eps));
    cfg->rope_theta = 10000.0f;
    L3D_CHECK(p->ctx, hf_num(p, "rope_theta", &cfg->rope_theta));
    L3D_CHECK(p->ctx, hf_rope_scaling(p, cfg));
    cfg->tie_word_embeddings = 0;
    L3D_CHECK(p->ctx, hf_bool(p, "tie_word_embeddings", &cfg->tie_word_embeddings));
    cfg->bos_token_id = 1;
    cfg->eos_token_id = 2;
    L3D_CHECK(p->ctx, hf_token(p, "bos_token_id", 0, &cfg->bos_token_id));
    L3D_CHECK(p->ctx, hf_token(p, "eos_token_id", 1, &cfg->eos_token_id));
    cfg->initializer_range = 0.02f;
    L3D_CHECK(p->ctx, hf_num(p, "initializer_range", &cfg->initializer_range));

    // We write the preset name to _name_or_path, so reading it back restores the name.
    json_t *nm = json_object_get(p->root, "_name_or_path");
    if (json_is_string(nm) && json_string_length(nm) > 0 &&
        json_string_length(nm) < sizeof(cfg->name))
        snprintf(cfg->name, sizeof(cfg->name), "%s", json_string_value(nm));
    return L3D_OK;
}

l3d_status l3d_model_config_from_json(l3d_ctx_t *ctx, const char *text, size_t len,
                                      const char *origin, l3d_model_config_t *cfg) {
    if (!text || !cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "model config: NULL argument");
    if (!origin) origin = "config.json";
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s:%d:%d: invalid JSON: %s", origin, err.line,
                         err.column, err.text);
    l3d_status st = L3D_OK;
    if (!json_is_object(root)) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "%s: expected a JSON object at the top level",
                       origin);
        goto done;
    }
    l3d_model_config_t tmp;
    memset(&tmp, 0, sizeof(tmp));
    snprintf(tmp.name, sizeof(tmp.name), "custom");
    hf_parser_t p = {ctx, origin, root};
    L3D_CHECK_GOTO(ctx, hf_parse(&p, &tmp), st, done);
    L3D_CHECK_GOTO(ctx, validate(ctx, &tmp, origin), st, done);
    *cfg = tmp;
done:
    json_decref(root);
    return st;
}

l3d_status l3d_model_config_from_file(l3d_ctx_t *ctx, const char *path, l3d_model_config_t *cfg) {
    if (!path || !cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "model config: NULL argument");
    char *buf = NULL;
    size_t len = 0;
    int rc = l3d_file_read_all(path, (size_t)16 << 20, &buf, &len);
    if (rc < 0)
        return l3d_error(ctx, rc == -ENOENT ? L3D_ERR_NOT_FOUND : L3D_ERR_IO,
                         "cannot read model config %s: %s", path, strerror(-rc));
    l3d_status st = l3d_model_config_from_json(ctx, buf, len, path, cfg);
    free(buf);
    return st;
}

// ---- validation --------------------------------------------------------------------------
// `n` starts each message: the file being parsed, or the config's name.
static l3d_status validate(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, const char *n) {
    const struct {
        const char *key;
        int v;
    } pos[] = {
        {"hidden_size", cfg->hidden_size},
        {"intermediate_size", cfg->intermediate_size},
        {"num_hidden_layers", cfg->num_hidden_layers},
        {"num_attention_heads", cfg->num_attention_heads},
        {"num_key_value_heads", cfg->num_key_value_heads},
        {"head_dim", cfg->head_dim},
        {"vocab_size", cfg->vocab_size},
        {"max_position_embeddings", cfg->max_position_embeddings},
    };
    for (size_t i = 0; i < L3D_ARRAY_LEN(pos); i++)
        if (pos[i].v <= 0)
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s: %s: must be positive, got %d", n,
                             pos[i].key, pos[i].v);
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: num_key_value_heads: num_attention_heads %d is not a multiple of "
                         "num_key_value_heads %d",
                         n, cfg->num_attention_heads, cfg->num_key_value_heads);
    if (cfg->head_dim % 2 != 0)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: head_dim: must be even for RoPE, got %d", n,
                         cfg->head_dim);
    if (!(cfg->rms_norm_eps > 0.0f) || !isfinite(cfg->rms_norm_eps))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: rms_norm_eps: must be positive, got %g", n,
                         (double)cfg->rms_norm_eps);
    if (!(cfg->rope_theta > 0.0f) || !isfinite(cfg->rope_theta))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: rope_theta: must be positive, got %g", n,
                         (double)cfg->rope_theta);
    if (!(cfg->initializer_range >= 0.0f) || !isfinite(cfg->initializer_range))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: initializer_range: must be >= 0, got %g", n,
                         (double)cfg->initializer_range);
    if (cfg->rope_scaling_llama3) {
        if (!(cfg->rope_factor >= 1.0f))
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s: rope_scaling.factor: must be >= 1, got %g",
                             n, (double)cfg->rope_factor);
        if (!(cfg->rope_low_freq_factor > 0.0f) ||
            !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: rope_scaling.high_freq_factor: need 0 < low_freq_factor < "
                             "high_freq_factor, got %g and %g",
                             n, (double)cfg->rope_low_freq_factor,
                             (double)cfg->rope_high_freq_factor);
        if (cfg->rope_original_max_position_embeddings <= 0)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: rope_scaling.original_max_position_embeddings: must be "
                             "positive, got %d",
                             n, cfg->rope_original_max_position_embeddings);
    }
    if (cfg->bos_token_id < -1 || cfg->bos_token_id >= cfg->vocab_size)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: bos_token_id: %d is outside vocab_size %d", n,
                         cfg->bos_token_id, cfg->vocab_size);
    if (cfg->eos_token_id < -1 || cfg->eos_token_id >= cfg->vocab_size)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: eos_token_id: %d is outside vocab_size %d", n,
                         cfg->eos_token_id, cfg->vocab_size);
    return L3D_OK;
}

l3d_status l3d_model_config_validate(l3d_ctx_t *ctx, const l3d_model_config_t *cfg) {
    if (!cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "model config: NULL argument");
    return validate(ctx, cfg, cfg->name[0] ? cfg->name : "model");
}

// ---- writing config.json -----------------------------------------------------------------
// A float as the shortest decimal that reads back to the same float, so 1e-5f is written
// "1e-05" and not 9.99999974737875e-06 (which is what HF would then load).
static json_t *json_float(float f) {
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

static int set_new(json_t *obj, const char *key, json_t *v) {
    return v ? json_object_set_new(obj, key, v) : -1;
}

l3d_status l3d_model_config_to_json(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, char **json_p) {
    if (!cfg || !json_p) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "model config: NULL argument");
    L3D_CHECK(ctx, l3d_model_config_validate(ctx, cfg));
    json_t *o = json_object();
    json_t *arch = json_array();
    int bad = !o || !arch || json_array_append_new(arch, json_string("LlamaForCausalLM"));
    bad |= set_new(o, "architectures", arch);
    bad |= set_new(o, "model_type", json_string("llama"));
    bad |= set_new(o, "_name_or_path", json_string(cfg->name));
    bad |= set_new(o, "hidden_act", json_string("silu"));
    bad |= set_new(o, "torch_dtype", json_string("float32"));
    bad |= set_new(o, "attention_bias", json_false());
    bad |= set_new(o, "attention_dropout", json_real(0.0));
    bad |= set_new(o, "mlp_bias", json_false());
    bad |= set_new(o, "pretraining_tp", json_integer(1));
    bad |= set_new(o, "use_cache", json_true());
    bad |= set_new(o, "hidden_size", json_integer(cfg->hidden_size));
    bad |= set_new(o, "intermediate_size", json_integer(cfg->intermediate_size));
    bad |= set_new(o, "num_hidden_layers", json_integer(cfg->num_hidden_layers));
    bad |= set_new(o, "num_attention_heads", json_integer(cfg->num_attention_heads));
    bad |= set_new(o, "num_key_value_heads", json_integer(cfg->num_key_value_heads));
    bad |= set_new(o, "head_dim", json_integer(cfg->head_dim));
    bad |= set_new(o, "vocab_size", json_integer(cfg->vocab_size));
    bad |= set_new(o, "max_position_embeddings", json_integer(cfg->max_position_embeddings));
    bad |= set_new(o, "rms_norm_eps", json_float(cfg->rms_norm_eps));
    bad |= set_new(o, "rope_theta", json_float(cfg->rope_theta));
    if (cfg->rope_scaling_llama3) {
        json_t *rs = json_object();
        bad |= !rs;
        bad |= set_new(rs, "rope_type", json_string("llama3"));
        bad |= set_new(rs, "factor", json_float(cfg->rope_factor));
        bad |= set_new(rs, "low_freq_factor", json_float(cfg->rope_low_freq_factor));
        bad |= set_new(rs, "high_freq_factor", json_float(cfg->rope_high_freq_factor));
        bad |= set_new(rs, "original_max_position_embeddings",
                       json_integer(cfg->rope_original_max_position_embeddings));
        bad |= set_new(o, "rope_scaling", rs);
    } else {
        bad |= set_new(o, "rope_scaling", json_null());
    }
    bad |= set_new(o, "tie_word_embeddings", json_boolean(cfg->tie_word_embeddings));
    bad |= set_new(o, "bos_token_id",
                   cfg->bos_token_id >= 0 ? json_integer(cfg->bos_token_id) : json_null());
    bad |= set_new(o, "eos_token_id",
                   cfg->eos_token_id >= 0 ? json_integer(cfg->eos_token_id) : json_null());
    bad |= set_new(o, "initializer_range", json_float(cfg->initializer_range));
    // Sorted keys and 2-space indent, as transformers writes it; 9 digits keeps json_float's
    // short decimals short.
    char *s = bad ? NULL : json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!s) return l3d_error(ctx, L3D_ERR_NOMEM, "model config: building config.json failed");
    *json_p = s;
    return L3D_OK;
}

// ---- parameter count ---------------------------------------------------------------------
uint64_t l3d_model_config_num_params(const l3d_model_config_t *cfg) {
    if (!cfg) return 0;
    uint64_t C = (uint64_t)cfg->hidden_size, F = (uint64_t)cfg->intermediate_size;
    uint64_t H = (uint64_t)cfg->num_attention_heads, KVH = (uint64_t)cfg->num_key_value_heads;
    uint64_t D = (uint64_t)cfg->head_dim, V = (uint64_t)cfg->vocab_size;
    uint64_t L = (uint64_t)cfg->num_hidden_layers;
    uint64_t per_layer = C * H * D         // q_proj
                         + 2 * C * KVH * D // k_proj, v_proj
                         + H * D * C       // o_proj
                         + 3 * C * F       // gate, up, down
                         + 2 * C;          // input and post-attention RMSNorm
    return V * C + L * per_layer + C + (cfg->tie_word_embeddings ? 0 : V * C);
}
