// Model configuration: the built-in Llama 3 presets, Hugging Face config.json in and out,
// consistency checks and the parameter count.
// defines: l3d_model_config_preset, l3d_model_config_preset_names, l3d_model_config_from_json,
//          l3d_model_config_from_file, l3d_model_config_validate, l3d_model_config_to_json,
//          l3d_model_config_num_params
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/config/config_json.h"
#include "core/config/config_model_dir.h"
#include "core/input.h"
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
        cfg->n_eos = 1;
        cfg->eos_token_ids[0] = p->eos;
        cfg->initializer_range = 0.02f;
        return L3D_OK;
    }
    return l3d_error(ctx, L3D_ERR_NOT_FOUND,
                     "unknown model preset '%s' (presets: llama3-tiny, llama3.2-1b, llama3.2-3b, "
                     "llama3-8b, llama3-70b, llama3-405b)",
                     name);
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

// A token id: an integer, null (no such token: -1), or for eos a list of up to L3D_MAX_EOS ids
// (Llama 3.1 Instruct lists 128001, 128008, 128009). ids[0..*n) get every id (n 0 for null).
static l3d_status hf_token(const l3d_cfgjson_t *j, json_t *root, const char *key, int allow_list,
                           int *ids, int *n) {
    json_t *v = json_object_get(root, key);
    if (!v) return L3D_OK;
    if (json_is_null(v)) {
        ids[0] = -1;
        *n = 0;
        return L3D_OK;
    }
    size_t count = 1;
    if (allow_list && json_is_array(v)) {
        count = json_array_size(v);
        if (count == 0)
            return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: the list is empty", j->origin, key);
        if (count > L3D_MAX_EOS)
            return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: %zu ids, llama3d keeps at most %d",
                             j->origin, key, count, L3D_MAX_EOS);
    }
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 2147483647)
            return l3d_cfgjson_type_error(j, NULL, key, v,
                                          allow_list ? "a token id, a list of token ids or null"
                                                     : "a token id or null");
        ids[i] = (int)json_integer_value(e);
    }
    *n = (int)count;
    return L3D_OK;
}

static l3d_status hf_rope_scaling(const l3d_cfgjson_t *j, json_t *root,
                                  l3d_model_config_t *cfg) {
    json_t *rs = json_object_get(root, "rope_scaling");
    cfg->rope_scaling_llama3 = 0;
    cfg->rope_factor = cfg->rope_low_freq_factor = cfg->rope_high_freq_factor = 0.0f;
    cfg->rope_original_max_position_embeddings = 0;
    if (!rs || json_is_null(rs)) return L3D_OK;
    if (!json_is_object(rs))
        return l3d_cfgjson_type_error(j, NULL, "rope_scaling", rs,
                                      "null or an object with rope_type \"llama3\"");
    // transformers writes "rope_type"; configs from before 4.43 spell it "type".
    json_t *t = json_object_get(rs, "rope_type");
    const char *tkey = "rope_scaling.rope_type";
    if (!t) {
        t = json_object_get(rs, "type");
        tkey = "rope_scaling.type";
    }
    if (!t || !json_is_string(t))
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: rope_scaling.rope_type: missing or not a string (llama3d supports "
                         "\"llama3\")",
                         j->origin);
    const char *type = json_string_value(t);
    if (strcmp(type, "default") == 0) {
        // HF's name for plain RoPE: the same as rope_scaling null.
        const char *k;
        json_t *kv;
        json_object_foreach(rs, k, kv) {
            if (strcmp(k, "rope_type") != 0 && strcmp(k, "type") != 0)
                return l3d_error(j->ctx, L3D_ERR_CONFIG,
                                 "%s: rope_scaling.%s: not used with rope_type \"default\"",
                                 j->origin, k);
        }
        return L3D_OK;
    }
    if (strcmp(type, "llama3") != 0)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: %s: \"%s\" is not supported (llama3d supports \"llama3\" or "
                         "rope_scaling null)",
                         j->origin, tkey, type);
    static const char *const valid[] = {"rope_type", "type", "factor", "low_freq_factor",
                                        "high_freq_factor", "original_max_position_embeddings"};
    L3D_CHECK(j->ctx,
              l3d_cfgjson_check_keys(j, rs, "rope_scaling", valid, L3D_ARRAY_LEN(valid), NULL));
    static const char *const need[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    for (size_t i = 0; i < L3D_ARRAY_LEN(need); i++)
        if (!json_object_get(rs, need[i]))
            return l3d_error(j->ctx, L3D_ERR_CONFIG,
                             "%s: rope_scaling.%s: missing (rope_type \"llama3\" needs factor, "
                             "low_freq_factor, high_freq_factor, original_max_position_embeddings)",
                             j->origin, need[i]);
    const char *rp = "rope_scaling";
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, rs, rp, "factor", L3D_NUM_F32, &cfg->rope_factor,
                                            NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, rs, rp, "low_freq_factor", L3D_NUM_F32,
                                            &cfg->rope_low_freq_factor, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, rs, rp, "high_freq_factor", L3D_NUM_F32,
                                            &cfg->rope_high_freq_factor, NULL));
    json_t *orig = json_object_get(rs, "original_max_position_embeddings");
    if (!json_is_integer(orig) || json_integer_value(orig) <= 0 ||
        json_integer_value(orig) > 2147483647)
        return l3d_cfgjson_type_error(j, rp, "original_max_position_embeddings", orig,
                                      "a positive integer");
    cfg->rope_original_max_position_embeddings = (int)json_integer_value(orig);
    cfg->rope_scaling_llama3 = 1;
    return L3D_OK;
}

// The keys whose only allowed value is what llama3d computes.
static l3d_status hf_fixed(const l3d_cfgjson_t *j, json_t *root) {
    json_t *v;
    if ((v = json_object_get(root, "model_type")) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "llama") == 0))
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: model_type: must be \"llama\" (llama3d implements LlamaForCausalLM)",
                         j->origin);
    if ((v = json_object_get(root, "hidden_act")) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "silu") == 0))
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: hidden_act: only \"silu\" (SwiGLU) is implemented", j->origin);
    if ((v = json_object_get(root, "pretraining_tp")) &&
        !(json_is_integer(v) && json_integer_value(v) == 1))
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: pretraining_tp: must be 1 (sliced-matmul emulation is not "
                         "implemented)",
                         j->origin);
    if ((v = json_object_get(root, "attention_dropout")) &&
        !(json_is_number(v) && json_number_value(v) == 0.0))
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: attention_dropout: must be 0 (llama3d trains without dropout, "
                         "as Llama 3 does)",
                         j->origin);
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++)
        if ((v = json_object_get(root, no_bias[i])) && !json_is_false(v))
            return l3d_error(j->ctx, L3D_ERR_CONFIG,
                             "%s: %s: must be false (Llama 3 has no bias terms; biases are not "
                             "implemented)",
                             j->origin, no_bias[i]);
    return L3D_OK;
}

static l3d_status hf_parse(const l3d_cfgjson_t *j, json_t *root, l3d_model_config_t *cfg) {
    L3D_CHECK(j->ctx, l3d_cfgjson_check_keys(j, root, NULL, k_hf_keys, L3D_ARRAY_LEN(k_hf_keys),
                                             " (llama3d rejects keys it does not implement "
                                             "rather than ignore them)"));
    L3D_CHECK(j->ctx, hf_fixed(j, root));

    // Sizes have no sensible default: a config.json without them is not a Llama config.
    static const char *const required[] = {"hidden_size", "intermediate_size",
                                           "num_hidden_layers", "num_attention_heads",
                                           "vocab_size"};
    int *dst[] = {&cfg->hidden_size, &cfg->intermediate_size, &cfg->num_hidden_layers,
                  &cfg->num_attention_heads, &cfg->vocab_size};
    int present;
    for (size_t i = 0; i < L3D_ARRAY_LEN(required); i++) {
        L3D_CHECK(j->ctx,
                  l3d_cfgjson_get_int(j, root, NULL, required[i], 1, INT_MAX, dst[i], &present));
        if (!present)
            return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: missing (required)", j->origin,
                             required[i]);
    }
    // The rest default as in transformers' LlamaConfig.
    cfg->num_key_value_heads = cfg->num_attention_heads;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, root, NULL, "num_key_value_heads", 1, INT_MAX,
                                          &cfg->num_key_value_heads, &present));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, root, NULL, "head_dim", 1, INT_MAX, &cfg->head_dim,
                                          &present));
    if (!present) {
        if (cfg->hidden_size % cfg->num_attention_heads != 0)
            return l3d_error(j->ctx, L3D_ERR_CONFIG,
                             "%s: hidden_size: %d is not divisible by num_attention_heads %d "
                             "(or give head_dim)",
                             j->origin, cfg->hidden_size, cfg->num_attention_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    }
    cfg->max_position_embeddings = 2048;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, root, NULL, "max_position_embeddings", 1, INT_MAX,
                                          &cfg->max_position_embeddings, &present));
    cfg->rms_norm_eps = 1e-6f;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, root, NULL, "rms_norm_eps", L3D_NUM_F32,
                                            &cfg->rms_norm_eps, NULL));
    cfg->rope_theta = 10000.0f;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, root, NULL, "rope_theta", L3D_NUM_F32,
                                            &cfg->rope_theta, NULL));
    L3D_CHECK(j->ctx, hf_rope_scaling(j, root, cfg));
    cfg->tie_word_embeddings = 0;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, root, NULL, "tie_word_embeddings",
                                           &cfg->tie_word_embeddings, NULL));
    cfg->bos_token_id = 1;
    cfg->eos_token_id = 2;
    cfg->n_eos = 1;
    cfg->eos_token_ids[0] = 2;
    int nb = 1;
    L3D_CHECK(j->ctx, hf_token(j, root, "bos_token_id", 0, &cfg->bos_token_id, &nb));
    L3D_CHECK(j->ctx, hf_token(j, root, "eos_token_id", 1, cfg->eos_token_ids, &cfg->n_eos));
    cfg->eos_token_id = cfg->n_eos ? cfg->eos_token_ids[0] : -1;
    cfg->initializer_range = 0.02f;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, root, NULL, "initializer_range", L3D_NUM_F32,
                                            &cfg->initializer_range, NULL));

    // We write the preset name to _name_or_path, so reading it back restores the name.
    json_t *nm = json_object_get(root, "_name_or_path");
    if (json_is_string(nm) && json_string_length(nm) > 0 &&
        json_string_length(nm) < sizeof(cfg->name))
        snprintf(cfg->name, sizeof(cfg->name), "%s", json_string_value(nm));
    return L3D_OK;
}

l3d_status l3d_model_config_from_json(l3d_ctx_t *ctx, const char *text, size_t len,
                                      const char *origin, l3d_model_config_t *cfg) {
    if (!text || !cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "model config: NULL argument");
    if (!origin) origin = "config.json";
    json_t *root;
    L3D_CHECK(ctx, l3d_cfgjson_load(ctx, text, len, origin, &root));
    l3d_status st = L3D_OK;
    l3d_model_config_t tmp;
    memset(&tmp, 0, sizeof(tmp));
    snprintf(tmp.name, sizeof(tmp.name), "custom");
    const l3d_cfgjson_t j = {ctx, origin, L3D_CFGJSON_HF};
    L3D_CHECK_GOTO(ctx, hf_parse(&j, root, &tmp), st, done);
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
    L3D_CHECK(ctx, l3d_input_read(ctx, path, "model config", L3D_CFGJSON_FILE_MAX, &buf, &len));
    l3d_status st = l3d_model_config_from_json(ctx, buf, len, path, cfg);
    free(buf);
    return st;
}

// ---- generation_config.json --------------------------------------------------------------
void l3d_generation_config_default(l3d_generation_config_t *g) {
    memset(g, 0, sizeof(*g));
    g->bos_token_id = -1;
    g->do_sample = -1;
    g->temperature = g->top_p = g->min_p = g->repetition_penalty = -1.0f;
    g->top_k = -1;
}

l3d_status l3d_generation_config_from_file(l3d_ctx_t *ctx, const char *path,
                                           l3d_generation_config_t *g) {
    if (!path || !g) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "generation config: NULL argument");
    l3d_generation_config_default(g);
    char *buf = NULL;
    size_t len = 0;
    L3D_CHECK(ctx, l3d_input_read(ctx, path, "generation config",
                                  L3D_CFGJSON_FILE_MAX, &buf, &len));
    json_t *root = NULL;
    l3d_status st = l3d_cfgjson_load(ctx, buf, len, path, &root);
    free(buf);
    L3D_CHECK(ctx, st);
    // transformers' GenerationConfig has dozens of keys; these are the ones generation here
    // follows. Others are ignored, as transformers ignores what a model does not use.
    l3d_cfgjson_t j = {ctx, path, L3D_CFGJSON_HF};
    int nb = 0;
    st = hf_token(&j, root, "bos_token_id", 0, &g->bos_token_id, &nb);
    if (st >= 0) st = hf_token(&j, root, "eos_token_id", 1, g->eos_token_ids, &g->n_eos);
    if (st >= 0) st = l3d_cfgjson_get_bool(&j, root, NULL, "do_sample", &g->do_sample, NULL);
    if (st >= 0) st = l3d_cfgjson_get_float(&j, root, NULL, "temperature", L3D_NUM_GE0,
                                            &g->temperature, NULL);
    if (st >= 0) st = l3d_cfgjson_get_float(&j, root, NULL, "top_p", L3D_NUM_UNIT, &g->top_p, NULL);
    if (st >= 0) st = l3d_cfgjson_get_float(&j, root, NULL, "min_p", L3D_NUM_UNIT, &g->min_p, NULL);
    if (st >= 0) st = l3d_cfgjson_get_int(&j, root, NULL, "top_k", 0, INT_MAX, &g->top_k, NULL);
    if (st >= 0) st = l3d_cfgjson_get_float(&j, root, NULL, "repetition_penalty", L3D_NUM_GT0,
                                            &g->repetition_penalty, NULL);
    json_decref(root);
    return st;
}

// ---- validation --------------------------------------------------------------------------
// `n` starts each message: the file being parsed, or the config's name.
static l3d_status validate(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, const char *n) {
    // Upper bounds far above any released Llama (405B: hidden 16384, 126 layers, 128 heads)
    // that keep every size the code forms from them inside its type: tensor counts
    // (9 x layers) and row widths (heads x head_dim) in int, element counts in size_t.
    const struct {
        const char *key;
        int v, max;
    } pos[] = {
        {"hidden_size", cfg->hidden_size, 1 << 20},
        {"intermediate_size", cfg->intermediate_size, 1 << 22},
        {"num_hidden_layers", cfg->num_hidden_layers, 1 << 16},
        {"num_attention_heads", cfg->num_attention_heads, 1 << 14},
        {"num_key_value_heads", cfg->num_key_value_heads, 1 << 14},
        {"head_dim", cfg->head_dim, 1 << 14},
        {"vocab_size", cfg->vocab_size, 1 << 24},
        {"max_position_embeddings", cfg->max_position_embeddings, 1 << 24},
    };
    for (size_t i = 0; i < L3D_ARRAY_LEN(pos); i++) {
        if (pos[i].v <= 0)
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s: %s: must be positive, got %d", n,
                             pos[i].key, pos[i].v);
        if (pos[i].v > pos[i].max)
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s: %s: %d is more than llama3d supports "
                             "(at most %d)", n, pos[i].key, pos[i].v, pos[i].max);
    }
    if ((int64_t)cfg->num_attention_heads * cfg->head_dim > (1 << 20) ||
        (int64_t)cfg->num_key_value_heads * cfg->head_dim > (1 << 20))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: head_dim: num_attention_heads %d x head_dim %d "
                         "is more than llama3d supports (at most %d)", n,
                         cfg->num_attention_heads, cfg->head_dim, 1 << 20);
    // With the bounds above the count cannot overflow 64 bits; the cap keeps the trainer's
    // four arenas (weights, gradients, two AdamW moments) addressable in size_t.
    uint64_t np = l3d_model_config_num_params(cfg);
    if (np > ((uint64_t)1 << 48) || np > SIZE_MAX / 16)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: num_hidden_layers: %d layers of this size "
                         "make %llu parameters, more than llama3d can address", n,
                         cfg->num_hidden_layers, (unsigned long long)np);
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
    if (cfg->n_eos < 0 || cfg->n_eos > L3D_MAX_EOS)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: %d eos ids (at most %d)", n, cfg->n_eos,
                         L3D_MAX_EOS);
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_token_ids[i] < 0 || cfg->eos_token_ids[i] >= cfg->vocab_size)
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s: eos_token_id[%d]: %d is outside "
                             "vocab_size %d", n, i, cfg->eos_token_ids[i], cfg->vocab_size);
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
    json_t *eos = json_null();
    if (cfg->n_eos > 1) {  // a list stays a list
        eos = json_array();
        for (int i = 0; eos && i < cfg->n_eos; i++)
            bad |= json_array_append_new(eos, json_integer(cfg->eos_token_ids[i]));
    } else if (cfg->eos_token_id >= 0) {
        eos = json_integer(cfg->eos_token_id);
    }
    bad |= set_new(o, "eos_token_id", eos);
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

// ---- what a model directory holds (core/config/config_model_dir.h) ------------------------------
int l3d_hf_is_weights_dir(const char *dir) {
    char path[1200];
    // Present, not readable: a weights file that is a FIFO or a symlink loop is refused when
    // it is opened, not taken for a directory without weights (training from scratch).
    snprintf(path, sizeof(path), "%s/%s", dir, L3D_HF_WEIGHTS);
    if (l3d_path_present(path)) return 1;
    snprintf(path, sizeof(path), "%s/%s", dir, L3D_HF_INDEX);
    return l3d_path_present(path);
}

int l3d_ckpt_dist_is(const char *dir) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, L3D_CKPT_DIST_MANIFEST);
    return l3d_path_present(path);  // a shards.json that is a FIFO is read, and refused
}
