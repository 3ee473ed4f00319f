// JSON helpers shared by the config parsers: typed getters, key checks, "did you mean".
// defines: l3d_cfgjson_load, l3d_cfgjson_nearest,
//          l3d_cfgjson_key_name, l3d_cfgjson_type_error, l3d_cfgjson_check_keys,
//          l3d_cfgjson_get_ll, l3d_cfgjson_get_int, l3d_cfgjson_get_num,
//          l3d_cfgjson_get_float, l3d_cfgjson_get_bool, l3d_cfgjson_get_str,
//          l3d_cfgjson_get_obj
#include "core/config/config_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"

// Room for a key name in a message. An error detail holds 1023 bytes, so an HF name cut here
// shows exactly what the whole name would.
#define NAME_CAP 1024

// ---- documents ---------------------------------------------------------------------------
l3d_status l3d_cfgjson_load(l3d_ctx_t *ctx, const char *text, size_t len, const char *origin,
                            json_t **root_p) {
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    *root_p = NULL;
    if (!root)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s:%d:%d: invalid JSON: %s", origin, err.line,
                         err.column, err.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: expected a JSON object at the top level",
                         origin);
    }
    *root_p = root;
    return L3D_OK;
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

const char *l3d_cfgjson_nearest(const char *key, const char *const *valid, size_t n) {
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

// ---- messages ----------------------------------------------------------------------------
const char *l3d_cfgjson_key_name(const l3d_cfgjson_t *j, char *buf, size_t cap, const char *path,
                                 const char *key) {
    // ds_config.json messages have always cut names at 255 bytes (only an unknown key can be
    // that long); config.json ones never cut them.
    if (j->dialect == L3D_CFGJSON_DS && cap > 256) cap = 256;
    if (path && *path)
        snprintf(buf, cap, "%s.%s", path, key);
    else
        snprintf(buf, cap, "%s", key);
    return buf;
}

l3d_status l3d_cfgjson_type_error(const l3d_cfgjson_t *j, const char *path, const char *key,
                                  const json_t *v, const char *want) {
    char full[NAME_CAP];
    l3d_cfgjson_key_name(j, full, sizeof(full), path, key);
    if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) {
        if (j->dialect == L3D_CFGJSON_HF)
            return l3d_error(j->ctx, L3D_ERR_CONFIG,
                             "%s: %s: \"auto\" is a Hugging Face Trainer placeholder; replace it "
                             "by %s",
                             j->origin, full, want);
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: %s: \"auto\" is a placeholder that the Hugging Face Trainer fills "
                         "in from its own arguments; llama3d reads ds_config.json directly, so "
                         "replace it by %s",
                         j->origin, full, want);
    }
    return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: expected %s", j->origin, full, want);
}

l3d_status l3d_cfgjson_check_keys(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                                  const char *const *valid, size_t n, const char *hint) {
    const char *key;
    json_t *v;
    if (!hint) hint = "";
    json_object_foreach(obj, key, v) {
        int ok = 0;
        for (size_t i = 0; i < n && !ok; i++) ok = strcmp(key, valid[i]) == 0;
        if (ok) continue;
        char full[NAME_CAP], sfull[NAME_CAP];
        l3d_cfgjson_key_name(j, full, sizeof(full), path, key);
        const char *s = l3d_cfgjson_nearest(key, valid, n);
        if (s)
            return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: unknown key '%s' (did you mean '%s'?)%s",
                             j->origin, full,
                             l3d_cfgjson_key_name(j, sfull, sizeof(sfull), path, s), hint);
        if (j->dialect == L3D_CFGJSON_HF)
            return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: unknown key '%s'%s", j->origin, full,
                             hint);
        // No close match: list the valid keys when they fit on the line.
        char list[600] = "";
        size_t used = 0;
        for (size_t i = 0; i < n && used < sizeof(list) - 64; i++)
            used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "",
                                     valid[i]);
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: unknown key '%s' (valid keys%s%s: %s)%s",
                         j->origin, full, path && *path ? " of " : "", path ? path : "", list,
                         hint);
    }
    return L3D_OK;
}

// ---- typed getters -----------------------------------------------------------------------
l3d_status l3d_cfgjson_get_ll(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                              const char *key, long long lo, long long hi, long long *out,
                              int *present) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = 0;
    if (!v) return L3D_OK;
    double d;
    if (json_is_integer(v)) {
        d = (double)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v))) {
        d = json_real_value(v);  // DeepSpeed configs write sizes like 1e8
    } else {
        return l3d_cfgjson_type_error(j, path, key, v, "an integer");
    }
    if (d < (double)lo || d > (double)hi) {
        char full[NAME_CAP];
        l3d_cfgjson_key_name(j, full, sizeof(full), path, key);
        if (j->dialect == L3D_CFGJSON_HF)
            return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: %.0f is out of range (minimum %lld)",
                             j->origin, full, d, lo);
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: %.0f is out of range [%lld, %lld]",
                         j->origin, full, d, lo, hi);
    }
    *out = json_is_integer(v) ? (long long)json_integer_value(v) : (long long)d;
    if (present) *present = 1;
    return L3D_OK;
}

l3d_status l3d_cfgjson_get_int(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                               const char *key, int lo, int hi, int *out, int *present) {
    long long v;
    int have = 0;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_ll(j, obj, path, key, lo, hi, &v, &have));
    if (have) *out = (int)v;
    if (present) *present = have;
    return L3D_OK;
}

l3d_status l3d_cfgjson_get_num(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                               const char *key, l3d_cfgjson_num_rule rule, double *out,
                               int *present) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = 0;
    if (!v) return L3D_OK;
    if (!json_is_number(v)) return l3d_cfgjson_type_error(j, path, key, v, "a number");
    double d = json_number_value(v);
    static const char *const what[] = {"must be finite",    "must be >= 0",
                                       "must be > 0",       "must be in [0, 1]",
                                       "must be in [0, 1)", "does not fit a float"};
    int ok = isfinite(d);
    if (rule == L3D_NUM_GE0) ok = ok && d >= 0.0;
    if (rule == L3D_NUM_GT0) ok = ok && d > 0.0;
    if (rule == L3D_NUM_UNIT) ok = ok && d >= 0.0 && d <= 1.0;
    if (rule == L3D_NUM_BETA) ok = ok && d >= 0.0 && d < 1.0;
    if (rule == L3D_NUM_F32) ok = ok && fabs(d) <= 3.0e38;
    if (!ok) {
        char full[NAME_CAP];
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: %g %s", j->origin,
                         l3d_cfgjson_key_name(j, full, sizeof(full), path, key), d, what[rule]);
    }
    *out = d;
    if (present) *present = 1;
    return L3D_OK;
}

l3d_status l3d_cfgjson_get_float(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                                 const char *key, l3d_cfgjson_num_rule rule, float *out,
                                 int *present) {
    double d;
    int have = 0;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, obj, path, key, rule, &d, &have));
    if (have) *out = (float)d;
    if (present) *present = have;
    return L3D_OK;
}

l3d_status l3d_cfgjson_get_bool(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                                const char *key, int *out, int *present) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = 0;
    if (!v) return L3D_OK;
    if (!json_is_boolean(v)) return l3d_cfgjson_type_error(j, path, key, v, "true or false");
    *out = json_is_true(v);
    if (present) *present = 1;
    return L3D_OK;
}

l3d_status l3d_cfgjson_get_str(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                               const char *key, char *buf, size_t cap, int *present) {
    json_t *v = json_object_get(obj, key);
    if (present) *present = 0;
    if (!v) return L3D_OK;
    if (!json_is_string(v)) return l3d_cfgjson_type_error(j, path, key, v, "a string");
    if (json_string_length(v) >= cap) {
        char full[NAME_CAP];
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: longer than %zu characters", j->origin,
                         l3d_cfgjson_key_name(j, full, sizeof(full), path, key), cap - 1);
    }
    snprintf(buf, cap, "%s", json_string_value(v));
    if (present) *present = 1;
    return L3D_OK;
}

l3d_status l3d_cfgjson_get_obj(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                               const char *key, json_t **out) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v) return L3D_OK;
    if (!json_is_object(v)) return l3d_cfgjson_type_error(j, path, key, v, "an object");
    *out = v;
    return L3D_OK;
}
