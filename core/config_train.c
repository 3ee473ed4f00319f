// Training configuration: DeepSpeed's ds_config.json plus llama3d's own sections.
// Every key is honoured, accepted with a note in cfg->notes (not yet effective here), or
// rejected naming the key and the nearest valid one. docs/config.md lists each key's status.
// defines: l3d_train_config_default, l3d_train_config_from_json, l3d_train_config_from_file,
//          l3d_train_config_finalize
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/l3d_core.h"
#include "llama3d/config.h"
#include "platform/platform.h"

// ---- defaults ----------------------------------------------------------------------------
void l3d_train_config_default(l3d_ctx_t *ctx, l3d_train_config_t *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof(*cfg));
    // The preset exists, so this cannot fail.
    (void)l3d_model_config_preset(ctx, "llama3-tiny", &cfg->model);
    snprintf(cfg->model_source, sizeof(cfg->model_source), "llama3-tiny");
    cfg->train_batch_size = 8;
    cfg->micro_batch_size = 8;
    cfg->grad_accum_steps = 1;
    cfg->gradient_clipping = 1.0f;
    cfg->steps_per_print = 10;
    cfg->lr = 1e-3f;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.95f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.1f;
    cfg->adam_w_mode = 1;
    cfg->sched = L3D_SCHED_CONSTANT;
    // DeepSpeed's scheduler defaults, used once a "scheduler" section names a type.
    cfg->warmup_min_lr = 0.0f;
    cfg->warmup_max_lr = 1e-3f;
    cfg->warmup_num_steps = 1000;
    cfg->warmup_type_log = 1;
    cfg->warmup_min_ratio = 0.0f;
    cfg->cos_min_ratio = 1e-4f;
    cfg->reduce_bucket_size = 5e8;  // DeepSpeed's default
    cfg->seq_len = 64;
    cfg->steps = 200;
    cfg->seed = 1;
    cfg->dp = cfg->tp = cfg->pp = 1;
    snprintf(cfg->device, sizeof(cfg->device), "cpu");
}

// ---- parser state and helpers ------------------------------------------------------------
typedef struct ds_parser {
    l3d_ctx_t *ctx;
    const char *origin;
    l3d_train_config_t *cfg;
} ds_t;

static void note(l3d_train_config_t *cfg, const char *fmt, ...) L3D_PRINTF(2, 3);
static void note(l3d_train_config_t *cfg, const char *fmt, ...) {
    char line[sizeof(cfg->notes[0])];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    for (int i = 0; i < cfg->n_notes; i++)
        if (strcmp(cfg->notes[i], line) == 0) return;
    if (cfg->n_notes >= L3D_MAX_NOTES) return;
    if (cfg->n_notes == L3D_MAX_NOTES - 1)
        snprintf(line, sizeof(line), "(further accepted-but-not-effective keys not listed)");
    snprintf(cfg->notes[cfg->n_notes++], sizeof(cfg->notes[0]), "%s", line);
}

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
    size_t limit = L3D_MAX((size_t)2, strlen(key) / 3);
    return best_d <= limit ? best : NULL;
}

// "path.key" (or "key" at the top level) for messages.
static const char *kname(char *buf, size_t cap, const char *path, const char *key) {
    if (path && *path)
        snprintf(buf, cap, "%s.%s", path, key);
    else
        snprintf(buf, cap, "%s", key);
    return buf;
}

// Rejects keys of `obj` that are not in `valid`, suggesting the nearest valid one.
static l3d_status check_keys(const ds_t *p, json_t *obj, const char *path,
                             const char *const *valid, size_t n, const char *hint) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        int ok = 0;
        for (size_t i = 0; i < n && !ok; i++) ok = strcmp(key, valid[i]) == 0;
        if (ok) continue;
        char full[256], sfull[256];
        kname(full, sizeof(full), path, key);
        const char *s = nearest(key, valid, n);
        if (s)
            return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: unknown key '%s' (did you mean '%s'?)%s",
                             p->origin, full, kname(sfull, sizeof(sfull), path, s),
                             hint ? hint : "");
        // No close match: list the valid keys when they fit on the line.
        char list[600] = "";
        size_t used = 0;
        for (size_t i = 0; i < n && used < sizeof(list) - 64; i++)
            used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "",
                                     valid[i]);
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: unknown key '%s' (valid keys%s%s: %s)%s",
                         p->origin, full, path && *path ? " of " : "", path ? path : "", list,
                         hint ? hint : "");
    }
    return L3D_OK;
}

static l3d_status type_err(const ds_t *p, const char *path, const char *key, const json_t *v,
                           const char *want) {
    char full[256];
    kname(full, sizeof(full), path, key);
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: %s: \"auto\" is a placeholder that the Hugging Face Trainer fills "
                         "in from its own arguments; llama3d reads ds_config.json directly, so "
                         "replace it by %s",
                         p->origin, full, want);
    return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: expected %s", p->origin, full, want);
}

static l3d_status get_ll(const ds_t *p, json_t *obj, const char *path, const char *key,
                         long long lo, long long hi, long long *out, int *present) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = 0;
    if (!v) return L3D_OK;
    double d;
    if (json_is_integer(v)) {
        d = (double)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) {
        d = json_real_value(v);  // DeepSpeed configs write sizes like 1e8
    } else {
        return type_err(p, path, key, v, "an integer");
    }
    if (d < (double)lo || d > (double)hi) {
        char full[256];
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: %.0f is out of range [%lld, %lld]",
                         p->origin, kname(full, sizeof(full), path, key), d, lo, hi);
    }
    *out = json_is_integer(v) ? (long long)json_integer_value(v) : (long long)d;
    if (present) *present = 1;
    return L3D_OK;
}

static l3d_status get_int(const ds_t *p, json_t *obj, const char *path, const char *key,
                          int lo, int hi, int *out, int *present) {
    long long v;
    int have = 0;
    L3D_CHECK(p->ctx, get_ll(p, obj, path, key, lo, hi, &v, &have));
    if (have) *out = (int)v;
    if (present) *present = have;
    return L3D_OK;
}

enum { NUM_ANY, NUM_GE0, NUM_GT0, NUM_UNIT, NUM_BETA };

static l3d_status get_num(const ds_t *p, json_t *obj, const char *path, const char *key,
                          int rule, double *out, int *present) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = 0;
    if (!v) return L3D_OK;
    if (!json_is_number(v)) return type_err(p, path, key, v, "a number");
    double d = json_number_value(v);
    static const char *const what[] = {"finite", ">= 0", "> 0", "in [0, 1]", "in [0, 1)"};
    int ok = isfinite(d);
    if (rule == NUM_GE0) ok = ok && d >= 0.0;
    if (rule == NUM_GT0) ok = ok && d > 0.0;
    if (rule == NUM_UNIT) ok = ok && d >= 0.0 && d <= 1.0;
    if (rule == NUM_BETA) ok = ok && d >= 0.0 && d < 1.0;
    if (!ok) {
        char full[256];
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: %g must be %s", p->origin,
                         kname(full, sizeof(full), path, key), d, what[rule]);
    }
    *out = d;
    if (present) *present = 1;
    return L3D_OK;
}

static l3d_status get_float(const ds_t *p, json_t *obj, const char *path, const char *key,
                            int rule, float *out, int *present) {
    double d;
    int have = 0;
    L3D_CHECK(p->ctx, get_num(p, obj, path, key, rule, &d, &have));
    if (have) *out = (float)d;
    if (present) *present = have;
    return L3D_OK;
}

static l3d_status get_bool(const ds_t *p, json_t *obj, const char *path, const char *key,
                           int *out, int *present) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = 0;
    if (!v) return L3D_OK;
    if (!json_is_boolean(v)) return type_err(p, path, key, v, "true or false");
    *out = json_is_true(v);
    if (present) *present = 1;
    return L3D_OK;
}

static l3d_status get_str(const ds_t *p, json_t *obj, const char *path, const char *key,
                          char *buf, size_t cap, int *present) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = 0;
    if (!v) return L3D_OK;
    if (!json_is_string(v)) return type_err(p, path, key, v, "a string");
    if (json_string_length(v) >= cap) {
        char full[256];
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s: longer than %zu characters", p->origin,
                         kname(full, sizeof(full), path, key), cap - 1);
    }
    snprintf(buf, cap, "%s", json_string_value(v));
    if (present) *present = 1;
    return L3D_OK;
}

// The section `key` of `obj` as an object (NULL and OK when absent).
static l3d_status get_obj(const ds_t *p, json_t *obj, const char *path, const char *key,
                          json_t **out) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v) return L3D_OK;
    if (!json_is_object(v)) return type_err(p, path, key, v, "an object");
    *out = v;
    return L3D_OK;
}

// ---- batch identity ----------------------------------------------------------------------
// DeepSpeed's rules; 0 means "not given, infer it". train = micro * accum * dp.
static l3d_status resolve_batch(l3d_ctx_t *ctx, const char *origin, l3d_train_config_t *cfg) {
    long long t = cfg->train_batch_size, m = cfg->micro_batch_size, a = cfg->grad_accum_steps;
    long long dp = cfg->dp;
    if (t < 0 || m < 0 || a < 0)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: batch sizes must be positive (train_batch_size %lld, "
                         "train_micro_batch_size_per_gpu %lld, gradient_accumulation_steps %lld)",
                         origin, t, m, a);
    if (t && m && a) {
        if (t != m * a * dp) {
            char fix[160] = "";
            if (t % (m * dp) == 0)
                snprintf(fix, sizeof(fix), "set gradient_accumulation_steps to %lld, or ",
                         t / (m * dp));
            else if (t % (a * dp) == 0)
                snprintf(fix, sizeof(fix), "set train_micro_batch_size_per_gpu to %lld, or ",
                         t / (a * dp));
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: train_batch_size %lld != train_micro_batch_size_per_gpu %lld * "
                             "gradient_accumulation_steps %lld * dp %lld (= %lld); %sgive only "
                             "two of the three and llama3d infers the third",
                             origin, t, m, a, dp, m * a * dp, fix);
        }
    } else if (t && m) {
        if (t % (m * dp) != 0)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: train_batch_size %lld is not divisible by "
                             "train_micro_batch_size_per_gpu %lld * dp %lld, so "
                             "gradient_accumulation_steps cannot be inferred; change one of them",
                             origin, t, m, dp);
        a = t / (m * dp);
    } else if (t && a) {
        if (t % (a * dp) != 0)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: train_batch_size %lld is not divisible by "
                             "gradient_accumulation_steps %lld * dp %lld, so "
                             "train_micro_batch_size_per_gpu cannot be inferred; change one of "
                             "them",
                             origin, t, a, dp);
        m = t / (a * dp);
    } else if (m && a) {
        t = m * a * dp;
    } else if (t) {
        if (t % dp != 0)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: train_batch_size %lld is not divisible by dp %lld; give "
                             "train_micro_batch_size_per_gpu too",
                             origin, t, dp);
        m = t / dp;
        a = 1;
    } else if (m) {
        a = 1;
        t = m * dp;
    } else {
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: give train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed "
                         "needs one of them)",
                         origin);
    }
    if (t > 2147483647LL)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: train_batch_size %lld is too large", origin, t);
    cfg->train_batch_size = (int)t;
    cfg->micro_batch_size = (int)m;
    cfg->grad_accum_steps = (int)a;
    return L3D_OK;
}

static l3d_status parse_batch(const ds_t *p, json_t *root) {
    l3d_train_config_t *cfg = p->cfg;
    int t = 0, m = 0, a = 0, gt, gm, ga;
    L3D_CHECK(p->ctx, get_int(p, root, "", "train_batch_size", 1, 1 << 30, &t, &gt));
    L3D_CHECK(p->ctx, get_int(p, root, "", "train_micro_batch_size_per_gpu", 1, 1 << 30, &m, &gm));
    L3D_CHECK(p->ctx, get_int(p, root, "", "gradient_accumulation_steps", 1, 1 << 30, &a, &ga));
    if (!gt && !gm) {
        // Only accumulation (or nothing) given: keep the per-rank micro batch we have and
        // re-derive the global batch, which also follows a changed dp.
        m = cfg->micro_batch_size;
        if (!ga) a = cfg->grad_accum_steps;
    }
    cfg->train_batch_size = t;
    cfg->micro_batch_size = m;
    cfg->grad_accum_steps = a;
    return L3D_OK;
}

// ---- optimizer and scheduler -------------------------------------------------------------
static l3d_status parse_optimizer(const ds_t *p, json_t *root) {
    l3d_train_config_t *cfg = p->cfg;
    json_t *o, *params = NULL;
    L3D_CHECK(p->ctx, get_obj(p, root, "", "optimizer", &o));
    if (!o) return L3D_OK;
    static const char *const keys[] = {"type", "params"};
    L3D_CHECK(p->ctx, check_keys(p, o, "optimizer", keys, 2, NULL));
    char type[64], lower[64];
    int have;
    L3D_CHECK(p->ctx, get_str(p, o, "optimizer", "type", type, sizeof(type), &have));
    if (!have)
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: optimizer.type: missing (Adam or AdamW)",
                         p->origin);
    size_t i = 0;
    for (; type[i]; i++) lower[i] = (char)tolower((unsigned char)type[i]);
    lower[i] = 0;
    // DeepSpeed lowercases the name before matching.
    int is_adamw = strcmp(lower, "adamw") == 0;
    if (!is_adamw && strcmp(lower, "adam") != 0)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: optimizer.type: '%s' is not supported (llama3d implements Adam and "
                         "AdamW)",
                         p->origin, type);
    // A DeepSpeed optimizer section means DeepSpeed's (FusedAdam's) defaults for what it
    // leaves out, not llama3d's.
    cfg->lr = 1e-3f;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.0f;
    cfg->adam_w_mode = 1;
    L3D_CHECK(p->ctx, get_obj(p, o, "optimizer", "params", &params));
    if (!params) return L3D_OK;
    static const char *const pkeys[] = {"lr",          "betas",      "eps",
                                        "weight_decay", "adam_w_mode", "torch_adam",
                                        "bias_correction", "amsgrad"};
    const char *pp = "optimizer.params";
    L3D_CHECK(p->ctx, check_keys(p, params, pp, pkeys, L3D_ARRAY_LEN(pkeys), NULL));
    L3D_CHECK(p->ctx, get_float(p, params, pp, "lr", NUM_GE0, &cfg->lr, NULL));
    L3D_CHECK(p->ctx, get_float(p, params, pp, "eps", NUM_GT0, &cfg->eps, NULL));
    L3D_CHECK(p->ctx, get_float(p, params, pp, "weight_decay", NUM_GE0, &cfg->weight_decay, NULL));
    json_t *b = json_object_get(params, "betas");
    if (b) {
        if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_number(json_array_get(b, 0)) ||
            !json_is_number(json_array_get(b, 1)))
            return type_err(p, pp, "betas", b, "a list of two numbers [beta1, beta2]");
        double b1 = json_number_value(json_array_get(b, 0));
        double b2 = json_number_value(json_array_get(b, 1));
        if (!(b1 >= 0.0 && b1 < 1.0 && b2 >= 0.0 && b2 < 1.0))
            return l3d_error(p->ctx, L3D_ERR_CONFIG,
                             "%s: optimizer.params.betas: [%g, %g] must both be in [0, 1)",
                             p->origin, b1, b2);
        cfg->beta1 = (float)b1;
        cfg->beta2 = (float)b2;
    }
    int wmode = 1, torch_adam = 0, bc = 1, ams = 0;
    L3D_CHECK(p->ctx, get_bool(p, params, pp, "adam_w_mode", &wmode, NULL));
    // torch_adam picks torch's implementation over the fused one: the same update.
    L3D_CHECK(p->ctx, get_bool(p, params, pp, "torch_adam", &torch_adam, NULL));
    L3D_CHECK(p->ctx, get_bool(p, params, pp, "bias_correction", &bc, NULL));
    L3D_CHECK(p->ctx, get_bool(p, params, pp, "amsgrad", &ams, NULL));
    if (!bc)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: optimizer.params.bias_correction: false is not supported (llama3d "
                         "always applies Adam's bias correction)",
                         p->origin);
    if (ams)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: optimizer.params.amsgrad: true is not supported", p->origin);
    // As DeepSpeed: type AdamW is always decoupled; "Adam" follows adam_w_mode (default true).
    cfg->adam_w_mode = is_adamw ? 1 : wmode;
    return L3D_OK;
}

static l3d_status parse_scheduler(const ds_t *p, json_t *root) {
    l3d_train_config_t *cfg = p->cfg;
    json_t *s, *params = NULL;
    L3D_CHECK(p->ctx, get_obj(p, root, "", "scheduler", &s));
    if (!s) return L3D_OK;
    static const char *const keys[] = {"type", "params"};
    L3D_CHECK(p->ctx, check_keys(p, s, "scheduler", keys, 2, NULL));
    char type[64];
    int have;
    L3D_CHECK(p->ctx, get_str(p, s, "scheduler", "type", type, sizeof(type), &have));
    static const char *const types[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    if (!have)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: scheduler.type: missing (WarmupLR, WarmupDecayLR or WarmupCosineLR)",
                         p->origin);
    l3d_sched_type st;
    if (strcmp(type, "WarmupLR") == 0) {
        st = L3D_SCHED_WARMUP_LR;
    } else if (strcmp(type, "WarmupDecayLR") == 0) {
        st = L3D_SCHED_WARMUP_DECAY_LR;
    } else if (strcmp(type, "WarmupCosineLR") == 0) {
        st = L3D_SCHED_WARMUP_COSINE_LR;
    } else {
        const char *near = nearest(type, types, 3);
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: scheduler.type: '%s' is not supported%s%s%s (llama3d implements "
                         "WarmupLR, WarmupDecayLR and WarmupCosineLR)",
                         p->origin, type, near ? " (did you mean '" : "", near ? near : "",
                         near ? "'?)" : "");
    }
    cfg->sched = st;
    // DeepSpeed's constructor defaults. WarmupLR's max defaults to the optimizer's lr,
    // WarmupDecayLR's to 0.001; WarmupCosineLR scales the optimizer's lr by a ratio.
    cfg->warmup_min_lr = 0.0f;
    cfg->warmup_max_lr = st == L3D_SCHED_WARMUP_LR ? cfg->lr : 1e-3f;
    cfg->warmup_num_steps = 1000;
    cfg->warmup_type_log = 1;
    cfg->total_num_steps = 0;
    cfg->warmup_min_ratio = 0.0f;
    cfg->cos_min_ratio = 1e-4f;
    // Absent params: jansson treats a NULL object as empty, so the defaults stand.
    L3D_CHECK(p->ctx, get_obj(p, s, "scheduler", "params", &params));
    const char *pp = "scheduler.params";
    static const char *const k_warm[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                         "warmup_type", "last_batch_iteration",
                                         "total_num_steps"};
    static const char *const k_cos[] = {"total_num_steps", "warmup_min_ratio",
                                        "warmup_num_steps", "cos_min_ratio", "warmup_type",
                                        "last_batch_iteration"};
    char hint[96];
    snprintf(hint, sizeof(hint), " (parameters of %s)", type);
    // WarmupLR takes WarmupDecayLR's keys but total_num_steps.
    if (st == L3D_SCHED_WARMUP_COSINE_LR)
        L3D_CHECK(p->ctx, check_keys(p, params, pp, k_cos, L3D_ARRAY_LEN(k_cos), hint));
    else
        L3D_CHECK(p->ctx, check_keys(p, params, pp, k_warm,
                                     L3D_ARRAY_LEN(k_warm) - (st == L3D_SCHED_WARMUP_LR), hint));
    L3D_CHECK(p->ctx, get_float(p, params, pp, "warmup_min_lr", NUM_GE0, &cfg->warmup_min_lr,
                                NULL));
    L3D_CHECK(p->ctx, get_float(p, params, pp, "warmup_max_lr", NUM_GE0, &cfg->warmup_max_lr,
                                NULL));
    L3D_CHECK(p->ctx, get_int(p, params, pp, "warmup_num_steps", 1, 1 << 30,
                              &cfg->warmup_num_steps, NULL));
    L3D_CHECK(p->ctx, get_float(p, params, pp, "warmup_min_ratio", NUM_UNIT,
                                &cfg->warmup_min_ratio, NULL));
    L3D_CHECK(p->ctx, get_float(p, params, pp, "cos_min_ratio", NUM_UNIT, &cfg->cos_min_ratio,
                                NULL));
    L3D_CHECK(p->ctx, get_int(p, params, pp, "total_num_steps", 1, 1 << 30,
                              &cfg->total_num_steps, &have));
    if (!have && st != L3D_SCHED_WARMUP_LR)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: scheduler.params.total_num_steps: missing (%s needs it; usually "
                         "the same as train.steps)",
                         p->origin, type);
    char wt[16];
    L3D_CHECK(p->ctx, get_str(p, params, pp, "warmup_type", wt, sizeof(wt), &have));
    if (have && strcmp(wt, "log") != 0 && strcmp(wt, "linear") != 0)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: scheduler.params.warmup_type: '%s' must be \"log\" or \"linear\"",
                         p->origin, wt);
    if (have) cfg->warmup_type_log = strcmp(wt, "log") == 0;
    int lbi = -1;
    L3D_CHECK(p->ctx, get_int(p, params, pp, "last_batch_iteration", -1, 1 << 30, &lbi, NULL));
    if (lbi != -1)
        note(cfg, "scheduler.params.last_batch_iteration: accepted, not yet effective (the step "
                  "comes from the checkpoint)");
    return L3D_OK;
}

// ---- table-driven sections --------------------------------------------------------------
// An accepted key: its JSON kind, and for a boolean that asks for something llama3d does not
// do yet, the reason recorded as a note when it is true. Kind '*': read by the caller.
typedef struct key_spec {
    const char *key;
    char kind;         // 'b' boolean, 'n' number, 'i' integer, 's' string or null, '*' caller
    const char *note;  // NULL: honoured (or no effect on one rank)
} key_spec_t;

static l3d_status check_section(const ds_t *p, json_t *obj, const char *path,
                                const key_spec_t *specs, size_t n) {
    const char *names[40] = {0};
    for (size_t i = 0; i < n && i < L3D_ARRAY_LEN(names); i++) names[i] = specs[i].key;
    L3D_CHECK(p->ctx, check_keys(p, obj, path, names, L3D_MIN(n, L3D_ARRAY_LEN(names)), NULL));
    for (size_t i = 0; i < n; i++) {
        const key_spec_t *k = &specs[i];
        json_t *v = json_object_get(obj, k->key);
        if (!v || k->kind == '*') continue;
        int b = 0;
        long long ll;
        double d;
        if (k->kind == 'b') L3D_CHECK(p->ctx, get_bool(p, obj, path, k->key, &b, NULL));
        if (k->kind == 'i')
            L3D_CHECK(p->ctx, get_ll(p, obj, path, k->key, -(1LL << 53), 1LL << 53, &ll, NULL));
        if (k->kind == 'n') L3D_CHECK(p->ctx, get_num(p, obj, path, k->key, NUM_ANY, &d, NULL));
        if (k->kind == 's' && !json_is_null(v) && !json_is_string(v))
            return type_err(p, path, k->key, v, "a string or null");
        if (b && k->note) {
            char full[256];
            note(p->cfg, "%s: accepted, not yet effective%s", kname(full, sizeof(full), path,
                 k->key), k->note);
        }
    }
    return L3D_OK;
}

static l3d_status parse_precision(const ds_t *p, json_t *root) {
    static const key_spec_t k_fp16[] = {
        {"enabled", '*', NULL},           {"auto_cast", 'b', NULL},
        {"loss_scale", 'n', NULL},        {"initial_scale_power", 'i', NULL},
        {"loss_scale_window", 'i', NULL}, {"hysteresis", 'i', NULL},
        {"consecutive_hysteresis", 'b', NULL}, {"min_loss_scale", 'n', NULL},
        {"fp16_master_weights_and_grads", 'b', NULL}};
    static const key_spec_t k_bf16[] = {{"enabled", '*', NULL},
                                        {"immediate_grad_update", 'b', NULL}};
    l3d_train_config_t *cfg = p->cfg;
    json_t *f16, *b16;
    L3D_CHECK(p->ctx, get_obj(p, root, "", "fp16", &f16));
    L3D_CHECK(p->ctx, get_obj(p, root, "", "bf16", &b16));
    if (f16) {
        L3D_CHECK(p->ctx, check_section(p, f16, "fp16", k_fp16, L3D_ARRAY_LEN(k_fp16)));
        L3D_CHECK(p->ctx, get_bool(p, f16, "fp16", "enabled", &cfg->fp16, NULL));
    }
    if (b16) {
        L3D_CHECK(p->ctx, check_section(p, b16, "bf16", k_bf16, L3D_ARRAY_LEN(k_bf16)));
        L3D_CHECK(p->ctx, get_bool(p, b16, "bf16", "enabled", &cfg->bf16, NULL));
    }
    if (cfg->fp16 && cfg->bf16)
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: fp16.enabled and bf16.enabled are both true; pick one (DeepSpeed "
                         "rejects this too)",
                         p->origin);
    // Loss scaling and the other fp16 keys only matter in fp16, so this note covers them.
    if (cfg->fp16)
        note(cfg, "fp16.enabled: accepted, not yet effective on the %s device (training runs in "
                  "fp32)", cfg->device);
    if (cfg->bf16)
        note(cfg, "bf16.enabled: accepted, not yet effective on the %s device (training runs in "
                  "fp32)", cfg->device);
    return L3D_OK;
}

static l3d_status parse_offload(const ds_t *p, json_t *zero, const char *key) {
    static const key_spec_t k_off[] = {
        {"device", '*', NULL},       {"pin_memory", 'b', NULL},  {"nvme_path", 's', NULL},
        {"buffer_count", 'n', NULL}, {"buffer_size", 'n', NULL}, {"max_in_cpu", 'n', NULL},
        {"fast_init", 'b', NULL},    {"ratio", 'n', NULL}};
    json_t *o;
    L3D_CHECK(p->ctx, get_obj(p, zero, "zero_optimization", key, &o));
    if (!o) return L3D_OK;
    char path[64];
    snprintf(path, sizeof(path), "zero_optimization.%s", key);
    L3D_CHECK(p->ctx, check_section(p, o, path, k_off, L3D_ARRAY_LEN(k_off)));
    char dev[16] = "none";
    json_t *d = json_object_get(o, "device");
    if (d && !json_is_null(d))
        L3D_CHECK(p->ctx, get_str(p, o, path, "device", dev, sizeof(dev), NULL));
    if (strcmp(dev, "none") != 0 && strcmp(dev, "cpu") != 0 && strcmp(dev, "nvme") != 0)
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: %s.device: '%s' must be none, cpu or nvme",
                         p->origin, path, dev);
    if (strcmp(dev, "none") != 0)
        note(p->cfg, "%s: accepted, not yet effective (device %s; state stays where it trains)",
             path, dev);
    return L3D_OK;
}

static l3d_status parse_zero(const ds_t *p, json_t *root) {
    // With one data-parallel rank there is nothing to bucket, scatter or gather: the bucket
    // and overlap keys are honoured trivially, and still type-checked so bad values fail.
    static const key_spec_t k_zero[] = {
        {"stage", '*', NULL}, {"overlap_comm", '*', NULL}, {"reduce_bucket_size", '*', NULL},
        {"offload_optimizer", '*', NULL}, {"offload_param", '*', NULL},
        {"contiguous_gradients", 'b', NULL}, {"allgather_bucket_size", 'n', NULL},
        {"reduce_scatter", 'b', NULL}, {"allgather_partitions", 'b', NULL},
        {"sub_group_size", 'n', NULL}, {"round_robin_gradients", 'b', NULL},
        {"stage3_max_live_parameters", 'n', NULL}, {"stage3_max_reuse_distance", 'n', NULL},
        {"stage3_prefetch_bucket_size", 'n', NULL},
        {"stage3_param_persistence_threshold", 'n', NULL},
        {"stage3_gather_16bit_weights_on_model_save", 'b', NULL},
        {"stage3_gather_fp16_weights_on_model_save", 'b', NULL},
        {"elastic_checkpoint", 'b', NULL}, {"load_from_fp32_weights", 'b', NULL},
        {"ignore_unused_parameters", 'b', NULL}};
    l3d_train_config_t *cfg = p->cfg;
    json_t *z;
    const char *zp = "zero_optimization";
    L3D_CHECK(p->ctx, get_obj(p, root, "", zp, &z));
    if (!z) return L3D_OK;
    L3D_CHECK(p->ctx, check_section(p, z, zp, k_zero, L3D_ARRAY_LEN(k_zero)));
    L3D_CHECK(p->ctx, get_int(p, z, zp, "stage", 0, 3, &cfg->zero_stage, NULL));
    L3D_CHECK(p->ctx, get_bool(p, z, zp, "overlap_comm", &cfg->overlap_comm, NULL));
    double rbs;
    int have;
    L3D_CHECK(p->ctx, get_num(p, z, zp, "reduce_bucket_size", NUM_GT0, &rbs, &have));
    if (have) cfg->reduce_bucket_size = rbs;
    if (cfg->zero_stage == 3)
        note(cfg, "zero_optimization.stage 3: accepted, not yet effective (parameters are not "
                  "sharded yet; stage3_* keys have no effect)");
    L3D_CHECK(p->ctx, parse_offload(p, z, "offload_optimizer"));
    L3D_CHECK(p->ctx, parse_offload(p, z, "offload_param"));
    return L3D_OK;
}

static l3d_status parse_misc_sections(const ds_t *p, json_t *root) {
    static const char *const recompute = " (activations are recomputed per layer on the rank)";
    static const char *const jsonl = " (llama3d writes JSONL metrics: set train.metrics)";
    static const key_spec_t k_ac[] = {
        {"partition_activations", 'b', recompute},
        {"contiguous_memory_optimization", 'b', recompute},
        {"cpu_checkpointing", 'b', recompute},
        {"synchronize_checkpoint_boundary", 'b', recompute},
        {"profile", 'b', recompute}, {"number_checkpoints", '*', NULL}};
    static const key_spec_t k_tb[] = {
        {"enabled", 'b', jsonl}, {"output_path", 's', NULL}, {"job_name", 's', NULL}};
    static const key_spec_t k_wandb[] = {{"enabled", 'b', jsonl}, {"group", 's', NULL},
                                         {"team", 's', NULL}, {"project", 's', NULL}};
    static const key_spec_t k_flops[] = {
        {"enabled", 'b', ""}, {"recompute_fwd_factor", 'n', NULL}, {"profile_step", 'i', NULL},
        {"module_depth", 'i', NULL}, {"top_modules", 'i', NULL}, {"detailed", 'b', NULL},
        {"output_file", 's', NULL}};
    static const struct {
        const char *name;
        const key_spec_t *specs;
        size_t n;
    } secs[] = {
        {"activation_checkpointing", k_ac, L3D_ARRAY_LEN(k_ac)},
        {"tensorboard", k_tb, L3D_ARRAY_LEN(k_tb)},
        {"csv_monitor", k_tb, L3D_ARRAY_LEN(k_tb)},
        {"wandb", k_wandb, L3D_ARRAY_LEN(k_wandb)},
        {"flops_profiler", k_flops, L3D_ARRAY_LEN(k_flops)},
    };
    for (size_t i = 0; i < L3D_ARRAY_LEN(secs); i++) {
        json_t *o;
        L3D_CHECK(p->ctx, get_obj(p, root, "", secs[i].name, &o));
        if (o) L3D_CHECK(p->ctx, check_section(p, o, secs[i].name, secs[i].specs, secs[i].n));
    }
    json_t *ac = json_object_get(root, "activation_checkpointing");
    if (!ac) return L3D_OK;
    // DeepSpeed's section configures the checkpointing that model code asks for; llama3d
    // reads its presence as "recompute activations in the backward pass".
    p->cfg->activation_checkpointing = 1;
    json_t *nc = json_object_get(ac, "number_checkpoints");
    if (nc && !json_is_null(nc)) {
        int n;
        L3D_CHECK(p->ctx, get_int(p, ac, "activation_checkpointing", "number_checkpoints", 1,
                                  1 << 30, &n, NULL));
        note(p->cfg, "activation_checkpointing.number_checkpoints: accepted, not yet effective "
                     "(every layer is a checkpoint)");
    }
    return L3D_OK;
}

// Top-level keys other than the sections.
static const key_spec_t k_top[] = {
    {"train_batch_size", '*', NULL}, {"train_micro_batch_size_per_gpu", '*', NULL},
    {"gradient_accumulation_steps", '*', NULL}, {"gradient_clipping", '*', NULL},
    {"steps_per_print", '*', NULL}, {"wall_clock_breakdown", '*', NULL},
    {"prescale_gradients", 'b', " (gradients are averaged in fp32 after the reduction)"},
    {"gradient_predivide_factor", '*', NULL}, {"communication_data_type", '*', NULL},
    // llama3d only has Adam/AdamW, which DeepSpeed supports with ZeRO: nothing to allow.
    {"zero_allow_untested_optimizer", 'b', NULL}, {"memory_breakdown", 'b', ""},
    {"dump_state", 'b', ""},
    {"optimizer", '*', NULL}, {"scheduler", '*', NULL}, {"fp16", '*', NULL}, {"bf16", '*', NULL},
    {"zero_optimization", '*', NULL}, {"activation_checkpointing", '*', NULL},
    {"tensorboard", '*', NULL}, {"csv_monitor", '*', NULL}, {"wandb", '*', NULL},
    {"flops_profiler", '*', NULL},
    // llama3d's own sections
    {"model", '*', NULL}, {"data", '*', NULL}, {"train", '*', NULL}, {"parallel", '*', NULL}};

static l3d_status parse_scalars(const ds_t *p, json_t *root) {
    l3d_train_config_t *cfg = p->cfg;
    L3D_CHECK(p->ctx, get_float(p, root, "", "gradient_clipping", NUM_GE0,
                                &cfg->gradient_clipping, NULL));
    L3D_CHECK(p->ctx, get_int(p, root, "", "steps_per_print", 1, 1 << 30, &cfg->steps_per_print,
                              NULL));
    L3D_CHECK(p->ctx, get_bool(p, root, "", "wall_clock_breakdown", &cfg->wall_clock_breakdown,
                               NULL));
    if (cfg->wall_clock_breakdown)
        note(cfg, "wall_clock_breakdown: accepted, not yet effective (step times are in the "
                  "JSONL metrics)");
    double f = 1.0;
    L3D_CHECK(p->ctx, get_num(p, root, "", "gradient_predivide_factor", NUM_GT0, &f, NULL));
    if (f != 1.0)
        note(cfg, "gradient_predivide_factor: accepted, not yet effective (gradients are "
                  "averaged in fp32 after the reduction)");
    json_t *cdt = json_object_get(root, "communication_data_type");
    if (cdt && !json_is_null(cdt)) {
        char s[16];
        L3D_CHECK(p->ctx, get_str(p, root, "", "communication_data_type", s, sizeof(s), NULL));
        if (strcmp(s, "fp32") != 0 && strcmp(s, "fp16") != 0 && strcmp(s, "bf16") != 0)
            return l3d_error(p->ctx, L3D_ERR_CONFIG,
                             "%s: communication_data_type: '%s' must be fp32, fp16 or bf16",
                             p->origin, s);
        if (strcmp(s, "fp32") != 0)
            note(cfg, "communication_data_type %s: accepted, not yet effective (gradients are "
                      "reduced in fp32)", s);
    }
    return L3D_OK;
}

// ---- llama3d's sections ------------------------------------------------------------------
// "model": a preset name, a path to a Hugging Face config.json (or its directory), relative
// to the directory of the config file, or an inline config.json object.
static l3d_status parse_model(const ds_t *p, json_t *root) {
    l3d_train_config_t *cfg = p->cfg;
    json_t *m = json_object_get(root, "model");
    if (!m) return L3D_OK;
    if (json_is_object(m)) {
        char *text = json_dumps(m, 0);
        if (!text) return l3d_error(p->ctx, L3D_ERR_NOMEM, "%s: model: out of memory", p->origin);
        char origin[300];
        snprintf(origin, sizeof(origin), "%s: model", p->origin);
        l3d_status st = l3d_model_config_from_json(p->ctx, text, strlen(text), origin, &cfg->model);
        free(text);
        L3D_CHECK(p->ctx, st);
        snprintf(cfg->model_source, sizeof(cfg->model_source), "(inline)");
        return L3D_OK;
    }
    if (!json_is_string(m))
        return type_err(p, "", "model", m,
                        "a preset name, a path to a config.json, or a config.json object");
    const char *s = json_string_value(m);
    if (json_string_length(m) >= sizeof(cfg->model_source))
        return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: model: path longer than %zu characters",
                         p->origin, sizeof(cfg->model_source) - 1);
    const char *const *names = l3d_model_config_preset_names();
    size_t n_names = 0;
    while (names[n_names]) n_names++;
    for (size_t i = 0; i < n_names; i++) {
        if (strcmp(s, names[i]) == 0) {
            L3D_CHECK(p->ctx, l3d_model_config_preset(p->ctx, s, &cfg->model));
            snprintf(cfg->model_source, sizeof(cfg->model_source), "%s", s);
            return L3D_OK;
        }
    }
    // A path. Relative ones are relative to the config file, as DeepSpeed users expect
    // for files that sit next to ds_config.json.
    char path[1100];
    const char *slash = strrchr(p->origin, '/');
    if (s[0] != '/' && slash)
        snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - p->origin), p->origin, s);
    else
        snprintf(path, sizeof(path), "%s", s);
    if (l3d_path_is_dir(path) > 0) {
        size_t len = strlen(path);
        snprintf(path + len, sizeof(path) - len, "/config.json");
    }
    if (l3d_path_exists(path) <= 0) {
        const char *near = nearest(s, names, n_names);
        return l3d_error(p->ctx, L3D_ERR_CONFIG,
                         "%s: model: '%s' is neither a preset%s%s%s nor an existing config.json "
                         "(looked for %s); presets: llama3-tiny, llama3.2-1b, llama3.2-3b, "
                         "llama3-8b, llama3-70b, llama3-405b",
                         p->origin, s, near ? " (did you mean '" : "", near ? near : "",
                         near ? "'?)" : "", path);
    }
    L3D_CHECK(p->ctx, l3d_model_config_from_file(p->ctx, path, &cfg->model));
    snprintf(cfg->model_source, sizeof(cfg->model_source), "%s", s);
    return L3D_OK;
}

static l3d_status parse_llama3d(const ds_t *p, json_t *root) {
    l3d_train_config_t *cfg = p->cfg;
    json_t *sec;
    L3D_CHECK(p->ctx, get_obj(p, root, "", "parallel", &sec));
    if (sec) {
        static const char *const keys[] = {"dp", "tp", "pp"};
        L3D_CHECK(p->ctx, check_keys(p, sec, "parallel", keys, 3, NULL));
        // The world size is checked against the launcher elsewhere.
        L3D_CHECK(p->ctx, get_int(p, sec, "parallel", "dp", 1, 1 << 20, &cfg->dp, NULL));
        L3D_CHECK(p->ctx, get_int(p, sec, "parallel", "tp", 1, 1 << 20, &cfg->tp, NULL));
        L3D_CHECK(p->ctx, get_int(p, sec, "parallel", "pp", 1, 1 << 20, &cfg->pp, NULL));
    }
    L3D_CHECK(p->ctx, get_obj(p, root, "", "train", &sec));
    if (sec) {
        static const char *const keys[] = {"steps",   "seed",   "save_dir", "save_interval",
                                           "metrics", "device", "threads"};
        const char *tp = "train";
        L3D_CHECK(p->ctx, check_keys(p, sec, tp, keys, L3D_ARRAY_LEN(keys), NULL));
        L3D_CHECK(p->ctx, get_int(p, sec, tp, "steps", 0, 1 << 30, &cfg->steps, NULL));
        long long seed;
        int have;
        L3D_CHECK(p->ctx, get_ll(p, sec, tp, "seed", 0, 9007199254740992LL, &seed, &have));
        if (have) cfg->seed = (uint64_t)seed;
        L3D_CHECK(p->ctx, get_str(p, sec, tp, "save_dir", cfg->save_dir, sizeof(cfg->save_dir),
                                  NULL));
        L3D_CHECK(p->ctx, get_int(p, sec, tp, "save_interval", 0, 1 << 30, &cfg->save_interval,
                                  NULL));
        L3D_CHECK(p->ctx, get_str(p, sec, tp, "metrics", cfg->metrics_path,
                                  sizeof(cfg->metrics_path), NULL));
        L3D_CHECK(p->ctx, get_str(p, sec, tp, "device", cfg->device, sizeof(cfg->device), NULL));
        L3D_CHECK(p->ctx, get_int(p, sec, tp, "threads", 0, 4096, &cfg->num_threads, NULL));
    }
    L3D_CHECK(p->ctx, get_obj(p, root, "", "data", &sec));
    if (sec) {
        static const char *const keys[] = {"path", "seq_len"};
        L3D_CHECK(p->ctx, check_keys(p, sec, "data", keys, 2, NULL));
        L3D_CHECK(p->ctx, get_str(p, sec, "data", "path", cfg->data_path, sizeof(cfg->data_path),
                                  NULL));
        // Like "model", a relative data path is relative to the config file's directory.
        const char *slash = strrchr(p->origin, '/');
        if (cfg->data_path[0] && cfg->data_path[0] != '/' && slash) {
            char joined[sizeof(cfg->data_path)];
            int n = snprintf(joined, sizeof(joined), "%.*s/%s", (int)(slash - p->origin),
                             p->origin, cfg->data_path);
            if (n < 0 || (size_t)n >= sizeof(joined))
                return l3d_error(p->ctx, L3D_ERR_CONFIG, "%s: data.path: resolved path is longer "
                                 "than %zu bytes", p->origin, sizeof(joined) - 1);
            memcpy(cfg->data_path, joined, sizeof(joined));
        }
        L3D_CHECK(p->ctx, get_int(p, sec, "data", "seq_len", 1, 1 << 24, &cfg->seq_len, NULL));
    }
    return parse_model(p, root);
}

// ---- finalize ----------------------------------------------------------------------------
static l3d_status finalize(l3d_ctx_t *ctx, l3d_train_config_t *cfg, const char *origin) {
    if (cfg->dp < 1 || cfg->tp < 1 || cfg->pp < 1)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: parallel: dp %d, tp %d, pp %d must be >= 1",
                         origin, cfg->dp, cfg->tp, cfg->pp);
    L3D_CHECK(ctx, resolve_batch(ctx, origin, cfg));
    L3D_CHECK(ctx, l3d_model_config_validate(ctx, &cfg->model));
    if (cfg->seq_len < 1 || cfg->seq_len > cfg->model.max_position_embeddings)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: data.seq_len: %d must be in [1, max_position_embeddings %d]",
                         origin, cfg->seq_len, cfg->model.max_position_embeddings);
    if (cfg->steps < 0 || cfg->save_interval < 0 || cfg->num_threads < 0)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: train: steps %d, save_interval %d, threads %d must be >= 0", origin,
                         cfg->steps, cfg->save_interval, cfg->num_threads);
    if (cfg->steps_per_print < 1)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: steps_per_print: %d must be >= 1", origin,
                         cfg->steps_per_print);
    if (!(cfg->lr >= 0.0f) || !isfinite(cfg->lr) || !(cfg->eps > 0.0f) ||
        !(cfg->weight_decay >= 0.0f) || !(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) ||
        !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f))
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: optimizer.params: need lr >= 0, eps > 0, weight_decay >= 0, betas "
                         "in [0, 1); got lr %g eps %g weight_decay %g betas [%g, %g]",
                         origin, (double)cfg->lr, (double)cfg->eps, (double)cfg->weight_decay,
                         (double)cfg->beta1, (double)cfg->beta2);
    if (!(cfg->gradient_clipping >= 0.0f))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: gradient_clipping: %g must be >= 0", origin,
                         (double)cfg->gradient_clipping);
    if (cfg->sched != L3D_SCHED_CONSTANT) {
        if (cfg->warmup_num_steps < 1)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: scheduler.params.warmup_num_steps: %d must be >= 1", origin,
                             cfg->warmup_num_steps);
        if (cfg->sched != L3D_SCHED_WARMUP_LR && cfg->total_num_steps < 1)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: scheduler.params.total_num_steps: %d must be >= 1", origin,
                             cfg->total_num_steps);
        if (!(cfg->warmup_min_lr >= 0.0f) || !(cfg->warmup_max_lr >= 0.0f))
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "%s: scheduler.params: warmup_min_lr %g and warmup_max_lr %g must be "
                             ">= 0",
                             origin, (double)cfg->warmup_min_lr, (double)cfg->warmup_max_lr);
    }
    if (cfg->device[0] == 0)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: train.device: empty", origin);
    return L3D_OK;
}

l3d_status l3d_train_config_finalize(l3d_ctx_t *ctx, l3d_train_config_t *cfg) {
    if (!cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "train config: NULL argument");
    return finalize(ctx, cfg, "train config");
}

// ---- entry points ------------------------------------------------------------------------
l3d_status l3d_train_config_from_json(l3d_ctx_t *ctx, const char *text, size_t len,
                                      const char *origin, l3d_train_config_t *cfg) {
    if (!text || !cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "train config: NULL argument");
    if (!origin) origin = "ds_config.json";
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s:%d:%d: invalid JSON: %s", origin, err.line,
                         err.column, err.text);
    l3d_status st = L3D_OK;
    // Work on a copy so that a rejected file leaves the caller's config as it was.
    l3d_train_config_t copy = *cfg, *tmp = &copy;
    ds_t p = {ctx, origin, tmp};
    if (!json_is_object(root)) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "%s: expected a JSON object at the top level", origin);
        goto done;
    }
    L3D_CHECK_GOTO(ctx, check_section(&p, root, "", k_top, L3D_ARRAY_LEN(k_top)), st, done);
    // Order matters: dp before the batch identity, train.device before the precision notes,
    // the optimizer's lr before the scheduler's defaults.
    L3D_CHECK_GOTO(ctx, parse_llama3d(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, parse_batch(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, parse_scalars(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, parse_optimizer(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, parse_scheduler(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, parse_precision(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, parse_zero(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, parse_misc_sections(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, finalize(ctx, tmp, origin), st, done);
    *cfg = *tmp;
done:
    json_decref(root);
    return st;
}

l3d_status l3d_train_config_from_file(l3d_ctx_t *ctx, const char *path, l3d_train_config_t *cfg) {
    if (!path || !cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "train config: NULL argument");
    char *buf = NULL;
    size_t len = 0;
    int rc = l3d_file_read_all(path, (size_t)16 << 20, &buf, &len);
    if (rc < 0)
        return l3d_error(ctx, rc == -ENOENT ? L3D_ERR_NOT_FOUND : L3D_ERR_IO,
                         "cannot read config %s: %s", path, strerror(-rc));
    l3d_status st = l3d_train_config_from_json(ctx, buf, len, path, cfg);
    free(buf);
    return st;
}
