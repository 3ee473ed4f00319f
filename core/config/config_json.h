// JSON helpers shared by the two config parsers: core/config/config_model.c (a Hugging Face
// config.json) and core/config/config_train.c + core/config/config_deepspeed.c (a DeepSpeed
// ds_config.json).
// Typed getters whose errors name the key, and the unknown-key check with its "did you mean".
// defines: l3d_cfgjson_t, l3d_cfgjson_dialect, l3d_cfgjson_num_rule, L3D_CFGJSON_FILE_MAX,
//          l3d_cfgjson_load, l3d_cfgjson_nearest, l3d_cfgjson_key_name,
//          l3d_cfgjson_type_error, l3d_cfgjson_check_keys, l3d_cfgjson_get_ll,
//          l3d_cfgjson_get_int, l3d_cfgjson_get_num, l3d_cfgjson_get_float,
//          l3d_cfgjson_get_bool, l3d_cfgjson_get_str, l3d_cfgjson_get_obj
#ifndef L3D_CONFIG_JSON_H
#define L3D_CONFIG_JSON_H

#include <stddef.h>

#include <jansson.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

// The two parsers were written apart and word a few messages differently; users and tests
// know those words, so each file keeps its own:
//   HF: a "did you mean"-less unknown key says nothing more; range errors give the minimum.
//   DS: an unknown key with no close match lists the valid keys; range errors give [lo, hi];
//       key names in messages are cut at 255 bytes; "auto" gets the longer explanation.
typedef enum l3d_cfgjson_dialect {
    L3D_CFGJSON_HF,  // config.json
    L3D_CFGJSON_DS,  // ds_config.json
} l3d_cfgjson_dialect;

typedef struct l3d_cfgjson {
    l3d_ctx_t *ctx;
    const char *origin;  // starts every message: the file, or "<file>: model" when inline
    l3d_cfgjson_dialect dialect;
} l3d_cfgjson_t;

// What a number must satisfy (l3d_cfgjson_get_num).
typedef enum l3d_cfgjson_num_rule {
    L3D_NUM_ANY,   // finite
    L3D_NUM_GE0,   // >= 0
    L3D_NUM_GT0,   // > 0
    L3D_NUM_UNIT,  // in [0, 1]
    L3D_NUM_BETA,  // in [0, 1)
    L3D_NUM_F32,   // finite and within a float's range
} l3d_cfgjson_num_rule;

// The most a config file may hold (read with l3d_input_read, core/input.h).
#define L3D_CFGJSON_FILE_MAX ((size_t)16 << 20)

// Parses text[0..len) (duplicate keys rejected) into *root_p, which must be a JSON object;
// the caller json_decref()s it. `origin` starts the messages.
l3d_status l3d_cfgjson_load(l3d_ctx_t *ctx, const char *text, size_t len, const char *origin,
                            json_t **root_p);

// The entry of valid[0..n) closest to `key` by edit distance, or NULL when none is close
// enough to be a typo of it.
const char *l3d_cfgjson_nearest(const char *key, const char *const *valid, size_t n);

// "path.key" (or "key" when path is NULL or empty) into buf, for messages; returns buf.
const char *l3d_cfgjson_key_name(const l3d_cfgjson_t *j, char *buf, size_t cap, const char *path,
                                 const char *key);

// The "expected <want>" error for path.key holding v (with a word on "auto" placeholders).
l3d_status l3d_cfgjson_type_error(const l3d_cfgjson_t *j, const char *path, const char *key,
                                  const json_t *v, const char *want);

// Rejects the first key of `obj` that is not in valid[0..n), suggesting the nearest valid one;
// `hint` (may be NULL) ends the message.
l3d_status l3d_cfgjson_check_keys(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                                  const char *const *valid, size_t n, const char *hint);

// Typed getters for obj[key] (whose name in messages is path.key). An absent key is OK and
// leaves *out alone; `present` (may be NULL) says whether it was there. A wrong type or value
// is an L3D_ERR_CONFIG naming the key.
// Integers: integral reals such as 1e8 count (DeepSpeed configs write sizes that way).
l3d_status l3d_cfgjson_get_ll(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                              const char *key, long long lo, long long hi, long long *out,
                              int *present);
l3d_status l3d_cfgjson_get_int(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                               const char *key, int lo, int hi, int *out, int *present);
l3d_status l3d_cfgjson_get_num(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                               const char *key, l3d_cfgjson_num_rule rule, double *out,
                               int *present);
l3d_status l3d_cfgjson_get_float(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                                 const char *key, l3d_cfgjson_num_rule rule, float *out,
                                 int *present);
l3d_status l3d_cfgjson_get_bool(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                                const char *key, int *out, int *present);
// A string that must fit buf (cap bytes with the NUL).
l3d_status l3d_cfgjson_get_str(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                               const char *key, char *buf, size_t cap, int *present);
// The section obj[key] as an object: *out NULL (and OK) when absent.
l3d_status l3d_cfgjson_get_obj(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                               const char *key, json_t **out);

#endif
