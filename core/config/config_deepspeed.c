// DeepSpeed's sections of a ds_config.json: the top-level scalars, optimizer, scheduler,
// fp16/bf16, zero_optimization, activation_checkpointing and the monitors. Each key is
// honoured, accepted with a note in cfg->notes (not yet effective here), or rejected naming
// the key and the nearest valid one. docs/config.md lists each key's status.
// defines: l3d_dsconfig_check_section, l3d_dsconfig_parse_sections
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "core/config/config_json.h"
#include "core/config/config_train_internal.h"
#include "core/l3d_core.h"
#include "llama3d/comm.h"
#include "llama3d/config.h"

// ---- notes -------------------------------------------------------------------------------
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

// ---- table-driven sections ---------------------------------------------------------------
l3d_status l3d_dsconfig_check_section(const l3d_dsparser_t *p, json_t *obj, const char *path,
                                      const l3d_dskey_t *specs, size_t n) {
    const l3d_cfgjson_t *j = &p->j;
    const char *names[40] = {0};
    for (size_t i = 0; i < n && i < L3D_ARRAY_LEN(names); i++) names[i] = specs[i].key;
    L3D_CHECK(j->ctx,
              l3d_cfgjson_check_keys(j, obj, path, names, L3D_MIN(n, L3D_ARRAY_LEN(names)), NULL));
    for (size_t i = 0; i < n; i++) {
        const l3d_dskey_t *k = &specs[i];
        json_t *v = json_object_get(obj, k->key);
        if (!v || k->kind == '*') continue;
        int b = 0;
        long long ll;
        double d;
        if (k->kind == 'b') L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, obj, path, k->key, &b, NULL));
        if (k->kind == 'i')
            L3D_CHECK(j->ctx,
                      l3d_cfgjson_get_ll(j, obj, path, k->key, -(1LL << 53), 1LL << 53, &ll, NULL));
        if (k->kind == 'n')
            L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, obj, path, k->key, L3D_NUM_ANY, &d, NULL));
        if (k->kind == 's' && !json_is_null(v) && !json_is_string(v))
            return l3d_cfgjson_type_error(j, path, k->key, v, "a string or null");
        if (b && k->note) {
            char full[256];
            note(p->cfg, "%s: accepted, not yet effective%s",
                 l3d_cfgjson_key_name(j, full, sizeof(full), path, k->key), k->note);
        }
    }
    return L3D_OK;
}

// A DeepSpeed dtype key of obj (path its section): "fp32", "bf16" or "fp16" into *out as an
// l3d_dtype; null sets -1 (unset); absent leaves *out; anything else is named in the error.
static l3d_status get_dtype(const l3d_cfgjson_t *j, json_t *obj, const char *path,
                            const char *key, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return L3D_OK;
    if (json_is_null(v)) {
        *out = -1;
        return L3D_OK;
    }
    char s[16];
    L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, obj, path, key, s, sizeof(s), NULL));
    if (!strcmp(s, "fp32")) *out = L3D_FLOAT32;
    else if (!strcmp(s, "bf16")) *out = L3D_BFLOAT16;
    else if (!strcmp(s, "fp16")) *out = L3D_FLOAT16;
    else
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s%s%s: '%s' must be fp32, fp16 or bf16",
                         j->origin, path, *path ? "." : "", key, s);
    return L3D_OK;
}

// ---- top-level scalars -------------------------------------------------------------------
static l3d_status parse_scalars(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    l3d_train_config_t *cfg = p->cfg;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, root, "", "gradient_clipping", L3D_NUM_GE0,
                                            &cfg->gradient_clipping, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, root, "", "steps_per_print", 1, 1 << 30,
                                          &cfg->steps_per_print, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, root, "", "wall_clock_breakdown",
                                           &cfg->wall_clock_breakdown, NULL));
    if (cfg->wall_clock_breakdown)
        note(cfg, "wall_clock_breakdown: accepted, not yet effective (step times are in the "
                  "JSONL metrics)");
    double f = 1.0;
    L3D_CHECK(j->ctx,
              l3d_cfgjson_get_num(j, root, "", "gradient_predivide_factor", L3D_NUM_GT0, &f, NULL));
    if (f != 1.0)
        note(cfg, "gradient_predivide_factor %g: without effect (each rank's gradient is "
                  "divided by the global batch's tokens before the reduction, as under "
                  "prescale_gradients)", f);
    // communication_data_type (null: the gradients' dtype) and fp32_allreduce: the dtype
    // data parallelism reduces gradients in (l3d_dp_comm_dtype, core/train/trainer_dp.c).
    L3D_CHECK(j->ctx, get_dtype(j, root, "", "communication_data_type", &cfg->comm_dtype));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, root, "", "fp32_allreduce", &cfg->fp32_allreduce,
                                           NULL));
    return L3D_OK;
}

// ---- optimizer and scheduler -------------------------------------------------------------
// A section of "type" and "params" (optimizer, scheduler): *sec NULL (and OK) when absent;
// else its keys are checked and its type read into type[cap] (*have: whether it is given).
static l3d_status get_typed_section(const l3d_dsparser_t *p, json_t *root, const char *name,
                                    json_t **sec, char *type, size_t cap, int *have) {
    const l3d_cfgjson_t *j = &p->j;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", name, sec));
    if (!*sec) return L3D_OK;
    static const char *const keys[] = {"type", "params"};
    L3D_CHECK(j->ctx, l3d_cfgjson_check_keys(j, *sec, name, keys, 2, NULL));
    return l3d_cfgjson_get_str(j, *sec, name, "type", type, cap, have);
}

static l3d_status parse_optimizer(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    l3d_train_config_t *cfg = p->cfg;
    json_t *o, *params = NULL;
    char type[64], lower[64];
    int have = 0;
    L3D_CHECK(j->ctx, get_typed_section(p, root, "optimizer", &o, type, sizeof(type), &have));
    if (!o) return L3D_OK;
    if (!have)
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: optimizer.type: missing (Adam or AdamW)",
                         j->origin);
    size_t i = 0;
    for (; type[i]; i++) lower[i] = (char)tolower((unsigned char)type[i]);
    lower[i] = 0;
    // DeepSpeed lowercases the name before matching.
    int is_adamw = strcmp(lower, "adamw") == 0;
    if (!is_adamw && strcmp(lower, "adam") != 0)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: optimizer.type: '%s' is not supported (llama3d implements Adam and "
                         "AdamW)",
                         j->origin, type);
    // A DeepSpeed optimizer section means DeepSpeed's (FusedAdam's) defaults for what it
    // leaves out, not llama3d's.
    cfg->lr = 1e-3f;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.0f;
    cfg->adam_w_mode = 1;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, o, "optimizer", "params", &params));
    if (!params) return L3D_OK;
    static const char *const pkeys[] = {"lr",          "betas",      "eps",
                                        "weight_decay", "adam_w_mode", "torch_adam",
                                        "bias_correction", "amsgrad"};
    const char *pp = "optimizer.params";
    L3D_CHECK(j->ctx, l3d_cfgjson_check_keys(j, params, pp, pkeys, L3D_ARRAY_LEN(pkeys), NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, params, pp, "lr", L3D_NUM_GE0, &cfg->lr, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, params, pp, "eps", L3D_NUM_GT0, &cfg->eps, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, params, pp, "weight_decay", L3D_NUM_GE0,
                                            &cfg->weight_decay, NULL));
    json_t *b = json_object_get(params, "betas");
    if (b) {
        if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_number(json_array_get(b, 0)) ||
            !json_is_number(json_array_get(b, 1)))
            return l3d_cfgjson_type_error(j, pp, "betas", b,
                                          "a list of two numbers [beta1, beta2]");
        double b1 = json_number_value(json_array_get(b, 0));
        double b2 = json_number_value(json_array_get(b, 1));
        if (!(b1 >= 0.0 && b1 < 1.0 && b2 >= 0.0 && b2 < 1.0))
            return l3d_error(j->ctx, L3D_ERR_CONFIG,
                             "%s: optimizer.params.betas: [%g, %g] must both be in [0, 1)",
                             j->origin, b1, b2);
        cfg->beta1 = (float)b1;
        cfg->beta2 = (float)b2;
    }
    int wmode = 1, torch_adam = 0, bc = 1, ams = 0;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, params, pp, "adam_w_mode", &wmode, NULL));
    // torch_adam picks torch's implementation over the fused one: the same update.
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, params, pp, "torch_adam", &torch_adam, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, params, pp, "bias_correction", &bc, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, params, pp, "amsgrad", &ams, NULL));
    if (!bc)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: optimizer.params.bias_correction: false is not supported (llama3d "
                         "always applies Adam's bias correction)",
                         j->origin);
    if (ams)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: optimizer.params.amsgrad: true is not supported", j->origin);
    // As DeepSpeed: type AdamW is always decoupled; "Adam" follows adam_w_mode (default true).
    cfg->adam_w_mode = is_adamw ? 1 : wmode;
    return L3D_OK;
}

static l3d_status parse_scheduler(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    l3d_train_config_t *cfg = p->cfg;
    json_t *s, *params = NULL;
    char type[64];
    int have = 0;
    L3D_CHECK(j->ctx, get_typed_section(p, root, "scheduler", &s, type, sizeof(type), &have));
    if (!s) return L3D_OK;
    static const char *const types[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    if (!have)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: scheduler.type: missing (WarmupLR, WarmupDecayLR or WarmupCosineLR)",
                         j->origin);
    l3d_sched_type st;
    if (strcmp(type, "WarmupLR") == 0) {
        st = L3D_SCHED_WARMUP_LR;
    } else if (strcmp(type, "WarmupDecayLR") == 0) {
        st = L3D_SCHED_WARMUP_DECAY_LR;
    } else if (strcmp(type, "WarmupCosineLR") == 0) {
        st = L3D_SCHED_WARMUP_COSINE_LR;
    } else {
        const char *near = l3d_cfgjson_nearest(type, types, 3);
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: scheduler.type: '%s' is not supported%s%s%s (llama3d implements "
                         "WarmupLR, WarmupDecayLR and WarmupCosineLR)",
                         j->origin, type, near ? " (did you mean '" : "", near ? near : "",
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
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, s, "scheduler", "params", &params));
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
    size_t n_warm = L3D_ARRAY_LEN(k_warm) - (st == L3D_SCHED_WARMUP_LR);
    if (st == L3D_SCHED_WARMUP_COSINE_LR)
        L3D_CHECK(j->ctx, l3d_cfgjson_check_keys(j, params, pp, k_cos, L3D_ARRAY_LEN(k_cos), hint));
    else
        L3D_CHECK(j->ctx, l3d_cfgjson_check_keys(j, params, pp, k_warm, n_warm, hint));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, params, pp, "warmup_min_lr", L3D_NUM_GE0,
                                            &cfg->warmup_min_lr, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, params, pp, "warmup_max_lr", L3D_NUM_GE0,
                                            &cfg->warmup_max_lr, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, params, pp, "warmup_num_steps", 1, 1 << 30,
                                          &cfg->warmup_num_steps, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, params, pp, "warmup_min_ratio", L3D_NUM_UNIT,
                                            &cfg->warmup_min_ratio, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_float(j, params, pp, "cos_min_ratio", L3D_NUM_UNIT,
                                            &cfg->cos_min_ratio, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, params, pp, "total_num_steps", 1, 1 << 30,
                                          &cfg->total_num_steps, &have));
    if (!have && st != L3D_SCHED_WARMUP_LR)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: scheduler.params.total_num_steps: missing (%s needs it; usually "
                         "the same as train.steps)",
                         j->origin, type);
    char wt[16];
    L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, params, pp, "warmup_type", wt, sizeof(wt), &have));
    if (have && strcmp(wt, "log") != 0 && strcmp(wt, "linear") != 0)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: scheduler.params.warmup_type: '%s' must be \"log\" or \"linear\"",
                         j->origin, wt);
    if (have) cfg->warmup_type_log = strcmp(wt, "log") == 0;
    int lbi = -1;
    L3D_CHECK(j->ctx,
              l3d_cfgjson_get_int(j, params, pp, "last_batch_iteration", -1, 1 << 30, &lbi, NULL));
    if (lbi != -1)
        note(cfg, "scheduler.params.last_batch_iteration: accepted, not yet effective (the step "
                  "comes from the checkpoint)");
    return L3D_OK;
}

// ---- fp16 and bf16 -----------------------------------------------------------------------
// The loss-scaling keys, checked whether or not fp16 is enabled (a typo'd value is wrong in
// either case). Bounds: every scale is a finite float32 (2^127 is the largest power of two).
static l3d_status parse_loss_scaling(const l3d_cfgjson_t *j, json_t *f16, l3d_train_config_t *cfg) {
    L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, f16, "fp16", "loss_scale", L3D_NUM_GE0,
                                          &cfg->fp16_loss_scale, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, f16, "fp16", "initial_scale_power", 0, 127,
                                          &cfg->fp16_initial_scale_power, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, f16, "fp16", "loss_scale_window", 1, 1 << 30,
                                          &cfg->fp16_loss_scale_window, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, f16, "fp16", "hysteresis", 1, 1 << 30,
                                          &cfg->fp16_hysteresis, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, f16, "fp16", "consecutive_hysteresis",
                                           &cfg->fp16_consecutive_hysteresis, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, f16, "fp16", "min_loss_scale", L3D_NUM_GT0,
                                          &cfg->fp16_min_loss_scale, NULL));
    const double fmax = 3.4028234663852886e38;
    if (cfg->fp16_loss_scale > fmax || cfg->fp16_min_loss_scale > fmax)
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: fp16.%s %g is beyond a float32's range",
                         j->origin, cfg->fp16_loss_scale > fmax ? "loss_scale" : "min_loss_scale",
                         cfg->fp16_loss_scale > fmax ? cfg->fp16_loss_scale
                                                     : cfg->fp16_min_loss_scale);
    return L3D_OK;
}

// data_types.grad_accum_dtype: fp32, or the training dtype (a 16-bit gradient of another kind
// would round the 16-bit products twice). With a 16-bit one the gradients are reduced in it
// (communication_data_type, if given, must agree). After fp16 / bf16 and the scalars.
static l3d_status parse_data_types(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    static const l3d_dskey_t k_dt[] = {{"grad_accum_dtype", '*', NULL}};
    l3d_train_config_t *cfg = p->cfg;
    json_t *dt;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", "data_types", &dt));
    if (!dt) return L3D_OK;
    L3D_CHECK(j->ctx, l3d_dsconfig_check_section(p, dt, "data_types", k_dt, L3D_ARRAY_LEN(k_dt)));
    L3D_CHECK(j->ctx, get_dtype(j, dt, "data_types", "grad_accum_dtype", &cfg->grad_dtype));
    if (cfg->grad_dtype <= L3D_FLOAT32) return L3D_OK;  // (unset or fp32)
    const char *s = cfg->grad_dtype == L3D_BFLOAT16 ? "bf16" : "fp16";
    int want = cfg->grad_dtype == L3D_BFLOAT16 ? cfg->bf16 : cfg->fp16;
    if (!want)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: data_types.grad_accum_dtype '%s' needs %s.enabled: gradients "
                         "accumulate in fp32 or in the training dtype", j->origin, s, s);
    if (cfg->fp32_allreduce || (cfg->comm_dtype >= 0 && cfg->comm_dtype != cfg->grad_dtype))
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: data_types.grad_accum_dtype '%s' reduces the gradients in %s; "
                         "%s asks for another dtype: drop it, or accumulate in fp32",
                         j->origin, s, s,
                         cfg->fp32_allreduce ? "fp32_allreduce" : "communication_data_type");
    return L3D_OK;
}

static l3d_status parse_precision(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    static const l3d_dskey_t k_fp16[] = {
        {"enabled", '*', NULL},           {"auto_cast", 'b', NULL},
        {"loss_scale", '*', NULL},        {"initial_scale_power", '*', NULL},
        {"loss_scale_window", '*', NULL}, {"hysteresis", '*', NULL},
        {"consecutive_hysteresis", '*', NULL}, {"min_loss_scale", '*', NULL},
        {"fp16_master_weights_and_grads", 'b', NULL}};
    static const l3d_dskey_t k_bf16[] = {{"enabled", '*', NULL},
                                        {"immediate_grad_update", 'b', NULL}};
    l3d_train_config_t *cfg = p->cfg;
    json_t *f16, *b16;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", "fp16", &f16));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", "bf16", &b16));
    if (f16) {
        L3D_CHECK(j->ctx,
                  l3d_dsconfig_check_section(p, f16, "fp16", k_fp16, L3D_ARRAY_LEN(k_fp16)));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, f16, "fp16", "enabled", &cfg->fp16, NULL));
        L3D_CHECK(j->ctx, parse_loss_scaling(j, f16, cfg));
        int half_master = 0;
        L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, f16, "fp16", "fp16_master_weights_and_grads",
                                               &half_master, NULL));
        if (half_master && cfg->fp16)
            note(cfg, "fp16.fp16_master_weights_and_grads: accepted, not yet effective (master "
                      "weights and their gradients stay float32)");
    }
    if (b16) {
        L3D_CHECK(j->ctx,
                  l3d_dsconfig_check_section(p, b16, "bf16", k_bf16, L3D_ARRAY_LEN(k_bf16)));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, b16, "bf16", "enabled", &cfg->bf16, NULL));
    }
    if (cfg->fp16 && cfg->bf16)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: fp16.enabled and bf16.enabled are both true; pick one (DeepSpeed "
                         "rejects this too)",
                         j->origin);
    // Both effective (docs/precision.md): the passes' weights, activations and their
    // gradients in the 16-bit dtype over float32 masters, weight gradients (unless
    // data_types says otherwise) and optimizer state.
    return parse_data_types(p, root);
}

// ---- zero_optimization -------------------------------------------------------------------
static l3d_status parse_offload(const l3d_dsparser_t *p, json_t *zero, const char *key,
                                int *on, int *pin) {
    const l3d_cfgjson_t *j = &p->j;
    static const l3d_dskey_t k_off[] = {
        {"device", '*', NULL},       {"pin_memory", 'b', NULL},  {"nvme_path", 's', NULL},
        {"buffer_count", 'n', NULL}, {"buffer_size", 'n', NULL}, {"max_in_cpu", 'n', NULL},
        {"fast_init", 'b', NULL},    {"ratio", 'n', NULL}};
    json_t *o;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, zero, "zero_optimization", key, &o));
    if (!o) return L3D_OK;
    char path[64];
    snprintf(path, sizeof(path), "zero_optimization.%s", key);
    L3D_CHECK(j->ctx, l3d_dsconfig_check_section(p, o, path, k_off, L3D_ARRAY_LEN(k_off)));
    char dev[16] = "none";
    json_t *d = json_object_get(o, "device");
    if (d && !json_is_null(d))
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, o, path, "device", dev, sizeof(dev), NULL));
    if (strcmp(dev, "none") != 0 && strcmp(dev, "cpu") != 0 && strcmp(dev, "nvme") != 0)
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s.device: '%s' must be none, cpu or nvme",
                         j->origin, path, dev);
    if (!strcmp(dev, "nvme"))
        note(p->cfg, "%s: accepted, not yet effective (device nvme; state stays where it trains)",
             path);
    *on = !strcmp(dev, "cpu");
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, o, path, "pin_memory", pin, NULL));
    return L3D_OK;
}

static l3d_status parse_zero(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    // With one data-parallel rank there is nothing to bucket, scatter or gather: the bucket
    // and overlap keys are honoured trivially, and still type-checked so bad values fail.
    static const l3d_dskey_t k_zero[] = {
        {"stage", '*', NULL}, {"overlap_comm", '*', NULL}, {"reduce_bucket_size", '*', NULL},
        {"offload_optimizer", '*', NULL}, {"offload_param", '*', NULL},
        {"contiguous_gradients", 'b', NULL}, {"allgather_bucket_size", 'n', NULL},
        {"reduce_scatter", 'b', NULL}, {"allgather_partitions", 'b', NULL},
        {"sub_group_size", 'n', NULL}, {"round_robin_gradients", 'b', NULL},
        {"stage3_max_live_parameters", '*', NULL}, {"stage3_max_reuse_distance", 'n', NULL},
        {"stage3_prefetch_bucket_size", '*', NULL},
        {"stage3_param_persistence_threshold", '*', NULL},
        {"stage3_gather_16bit_weights_on_model_save", '*', NULL},
        {"stage3_gather_fp16_weights_on_model_save", '*', NULL},
        {"elastic_checkpoint", 'b', NULL}, {"load_from_fp32_weights", 'b', NULL},
        {"ignore_unused_parameters", 'b', NULL}};
    l3d_train_config_t *cfg = p->cfg;
    json_t *z;
    const char *zp = "zero_optimization";
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", zp, &z));
    if (!z) return L3D_OK;
    L3D_CHECK(j->ctx, l3d_dsconfig_check_section(p, z, zp, k_zero, L3D_ARRAY_LEN(k_zero)));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, z, zp, "stage", 0, 3, &cfg->zero_stage, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, z, zp, "overlap_comm", &cfg->overlap_comm, NULL));
    double rbs;
    int have;
    L3D_CHECK(j->ctx,
              l3d_cfgjson_get_num(j, z, zp, "reduce_bucket_size", L3D_NUM_GT0, &rbs, &have));
    if (have) cfg->reduce_bucket_size = rbs;
    // ZeRO-3's keys, DeepSpeed's meanings (core/train/trainer_zero3.c): element counts.
    double v;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, z, zp, "stage3_prefetch_bucket_size", L3D_NUM_GE0,
                                          &v, &have));
    if (have) cfg->stage3_prefetch_bucket_size = v;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, z, zp, "stage3_param_persistence_threshold",
                                          L3D_NUM_GE0, &v, &have));
    if (have) cfg->stage3_param_persistence_threshold = v;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, z, zp, "stage3_max_live_parameters", L3D_NUM_GT0,
                                          &v, &have));
    if (have) cfg->stage3_max_live_parameters = v;
    // The fp16 spelling is DeepSpeed's older name for the same switch: both given must agree
    // (either value would otherwise win without a word).
    int g16 = 0, gfp16 = 0, have16 = 0, havefp16 = 0;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, z, zp, "stage3_gather_16bit_weights_on_model_save",
                                           &g16, &have16));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, z, zp, "stage3_gather_fp16_weights_on_model_save",
                                           &gfp16, &havefp16));
    if (have16 && havefp16 && g16 != gfp16)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: zero_optimization.stage3_gather_16bit_weights_on_model_save %s and "
                         "its old spelling stage3_gather_fp16_weights_on_model_save %s "
                         "contradict each other; give one", j->origin, g16 ? "true" : "false",
                         gfp16 ? "true" : "false");
    cfg->stage3_gather_16bit_weights_on_model_save = g16 || gfp16;
    L3D_CHECK(j->ctx, parse_offload(p, z, "offload_optimizer", &cfg->offload_optimizer,
                                    &cfg->offload_optimizer_pin));
    L3D_CHECK(j->ctx, parse_offload(p, z, "offload_param", &cfg->offload_param,
                                    &cfg->offload_param_pin));
    // DeepSpeed's rules: optimizer offload with a sharding stage, parameter offload with stage
    // 3; outside them the key has no effect there either. The update runs where the master
    // pieces live, so parameter offload takes the optimizer along.
    if (cfg->offload_optimizer && cfg->zero_stage == 0) {
        note(cfg, "zero_optimization.offload_optimizer: no effect at stage 0 (DeepSpeed: stages "
                  "1-3)");
        cfg->offload_optimizer = 0;
    }
    if (cfg->offload_param && cfg->zero_stage != 3) {
        note(cfg, "zero_optimization.offload_param: no effect below stage 3 (as in DeepSpeed)");
        cfg->offload_param = 0;
    }
    if (cfg->offload_param && !cfg->offload_optimizer)
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: zero_optimization.offload_param needs "
                         "offload_optimizer on the cpu too (the update runs where the parameter "
                         "pieces live)", j->origin);
    return L3D_OK;
}

// ---- monitors ----------------------------------------------------------------------------
// tensorboard / csv_monitor {enabled, output_path, job_name}: the directory is DeepSpeed's
// os.path.join(output_path, job_name), with its defaults "" and "DeepSpeedJobName", taken
// from the working directory as DeepSpeed does (not from the config file's directory).
static l3d_status parse_monitor(const l3d_dsparser_t *p, json_t *root, const char *name,
                                int *enabled, char *dir, size_t cap) {
    const l3d_cfgjson_t *j = &p->j;
    json_t *sec = json_object_get(root, name);
    if (!json_is_object(sec)) return L3D_OK;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, sec, name, "enabled", enabled, NULL));
    const char *out = json_string_value(json_object_get(sec, "output_path"));
    const char *job = json_string_value(json_object_get(sec, "job_name"));
    if (!out) out = "";
    if (!job) job = "DeepSpeedJobName";
    size_t n = strlen(out);
    int w;
    if (!n || job[0] == '/') w = snprintf(dir, cap, "%s", job);
    else if (!job[0]) w = snprintf(dir, cap, "%s", out);
    else w = snprintf(dir, cap, "%s%s%s", out, out[n - 1] == '/' ? "" : "/", job);
    if (w < 0 || (size_t)w >= cap)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: %s.output_path/job_name: the directory is longer than %zu bytes",
                         j->origin, name, cap - 1);
    return L3D_OK;
}

static l3d_status parse_monitors(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    l3d_train_config_t *cfg = p->cfg;
    L3D_CHECK(j->ctx, parse_monitor(p, root, "tensorboard", &cfg->tensorboard,
                                    cfg->tensorboard_dir, sizeof(cfg->tensorboard_dir)));
    L3D_CHECK(j->ctx, parse_monitor(p, root, "csv_monitor", &cfg->csv_monitor,
                                    cfg->csv_monitor_dir, sizeof(cfg->csv_monitor_dir)));
    json_t *wandb = json_object_get(root, "wandb");
    int on = 0;
    if (json_is_object(wandb))
        L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, wandb, "wandb", "enabled", &on, NULL));
    if (on)
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: wandb.enabled: llama3d sends nothing over the network; use "
                         "tensorboard or csv_monitor (files on this machine) instead",
                         j->origin);
    return L3D_OK;
}

// ---- activation checkpointing and monitors -----------------------------------------------
static l3d_status parse_misc_sections(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    static const char *const recompute = " (activations are recomputed per layer on the rank)";
    // partition_activations and cpu_checkpointing are honoured (core/model/model_fwdbwd.c);
    // contiguous_memory_optimization is what the activation arena always is (one allocation
    // per activation set, the checkpoints side by side), and number_checkpoints only sizes
    // that buffer in DeepSpeed, where llama3d sizes it from the model.
    static const l3d_dskey_t k_ac[] = {
        {"partition_activations", 'b', NULL},
        {"contiguous_memory_optimization", 'b', NULL},
        {"cpu_checkpointing", 'b', NULL},
        {"synchronize_checkpoint_boundary", 'b', recompute},
        {"profile", 'b', recompute}, {"number_checkpoints", '*', NULL}};
    // The monitors are honoured (parse_monitors), wandb.enabled refused.
    static const l3d_dskey_t k_tb[] = {
        {"enabled", 'b', NULL}, {"output_path", 's', NULL}, {"job_name", 's', NULL}};
    static const l3d_dskey_t k_wandb[] = {{"enabled", 'b', NULL}, {"group", 's', NULL},
                                         {"team", 's', NULL}, {"project", 's', NULL}};
    static const l3d_dskey_t k_flops[] = {
        {"enabled", 'b', ""}, {"recompute_fwd_factor", 'n', NULL}, {"profile_step", 'i', NULL},
        {"module_depth", 'i', NULL}, {"top_modules", 'i', NULL}, {"detailed", 'b', NULL},
        {"output_file", 's', NULL}};
    static const struct {
        const char *name;
        const l3d_dskey_t *specs;
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
        L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", secs[i].name, &o));
        if (o)
            L3D_CHECK(j->ctx,
                      l3d_dsconfig_check_section(p, o, secs[i].name, secs[i].specs, secs[i].n));
    }
    L3D_CHECK(j->ctx, parse_monitors(p, root));
    json_t *ac = json_object_get(root, "activation_checkpointing");
    if (!ac) return L3D_OK;
    // DeepSpeed's section configures the checkpointing that model code asks for; llama3d
    // reads its presence as "recompute activations in the backward pass".
    p->cfg->activation_checkpointing = 1;
    json_t *nc = json_object_get(ac, "number_checkpoints");
    if (nc && !json_is_null(nc)) {
        int n;
        L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, ac, "activation_checkpointing",
                                              "number_checkpoints", 1, 1 << 30, &n, NULL));
    }
    const char *acp = "activation_checkpointing";
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, ac, acp, "partition_activations",
                                           &p->cfg->partition_activations, NULL));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, ac, acp, "cpu_checkpointing",
                                           &p->cfg->cpu_checkpointing, NULL));
    return L3D_OK;
}

// ---- entry point -------------------------------------------------------------------------
l3d_status l3d_dsconfig_parse_sections(const l3d_dsparser_t *p, json_t *root) {
    L3D_CHECK(p->j.ctx, parse_scalars(p, root));
    L3D_CHECK(p->j.ctx, parse_optimizer(p, root));
    L3D_CHECK(p->j.ctx, parse_scheduler(p, root));
    L3D_CHECK(p->j.ctx, parse_precision(p, root));
    L3D_CHECK(p->j.ctx, parse_zero(p, root));
    return parse_misc_sections(p, root);
}
