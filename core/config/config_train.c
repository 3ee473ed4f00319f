// Training configuration: DeepSpeed's ds_config.json plus llama3d's own sections.
// Every key is honoured, accepted with a note in cfg->notes (not yet effective here), or
// rejected naming the key and the nearest valid one. docs/config.md lists each key's status.
// This file: the defaults, the top level, llama3d's own sections and finalize; DeepSpeed's
// sections are in config_deepspeed.c, the batch identity and the layout in config_layout.c.
// defines: l3d_train_config_default, l3d_train_config_job_defaults,
//          l3d_train_config_from_json, l3d_train_config_from_file, l3d_train_config_finalize
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/config/config_json.h"
#include "core/config/config_model_dir.h"
#include "core/config/config_train_internal.h"
#include "core/input.h"
#include "core/comm/mesh.h"
#include "core/config/pipeline.h"
#include "core/l3d_core.h"
#include "llama3d/config.h"
#include "llama3d/tokenizer.h"
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
    cfg->batch_inferred = L3D_BATCH_TRAIN;  // 8 = micro 8 x accum 1 x dp: follows dp
    cfg->dp = cfg->tp = cfg->pp = 1;
    cfg->dp_auto = 1;
    cfg->save_max_shard_size = L3D_SAVE_MAX_SHARD_DEFAULT;
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
    cfg->grad_dtype = -1;           // data_types.grad_accum_dtype unset: float32
    cfg->comm_dtype = -1;           // communication_data_type unset: the gradients' dtype
    cfg->stage3_prefetch_bucket_size = 5e7;  // DeepSpeed's defaults (zero/config.py)
    cfg->stage3_param_persistence_threshold = 1e5;
    cfg->stage3_max_live_parameters = 1e9;
    // DeepSpeed's fp16 defaults (runtime/fp16 constants).
    cfg->fp16_initial_scale_power = 16;
    cfg->fp16_loss_scale_window = 1000;
    cfg->fp16_hysteresis = 2;
    cfg->fp16_min_loss_scale = 1.0;
    cfg->seq_len = 64;
    cfg->steps = 200;
    cfg->seed = 1;
    cfg->dp = cfg->tp = cfg->pp = 1;
    cfg->eval_iters = 10;
    // L3D_DEVICE: the device when the config does not say (checked when the context read it).
    snprintf(cfg->device, sizeof(cfg->device), "%s", ctx ? l3d_ctx_settings(ctx)->device : "cpu");
}

// The main job's defaults (llama3d/config.h says what and when), chosen by running the
// 200-step main job (docs/config.md, "Without a config file", has the figures): a peak of
// 2e-3 or 3e-3 ended higher, a 5% warm-up about the same as 10%; 4 batches every 50 steps
// cost 2-3% of the run.
void l3d_train_config_job_defaults(l3d_train_config_t *cfg) {
    if (!cfg) return;
    int steps = cfg->steps;
    cfg->sched = L3D_SCHED_WARMUP_COSINE_LR;
    cfg->warmup_type_log = 0;  // linear, as Megatron's and most recipes' warm-up
    cfg->warmup_min_ratio = 0.0f;
    int warmup = (steps + 5) / 10;  // 10%, rounded
    if (warmup < 5) warmup = 5;
    // A short run still warms up and decays: the warm-up takes at most half of it (and at least
    // 2 steps, DeepSpeed's own minimum).
    if (warmup > steps / 2) warmup = steps / 2 < 2 ? 2 : steps / 2;
    cfg->warmup_num_steps = warmup;
    // finalize wants >= 1; a 0-step run (--steps 0 --save) never asks for an lr.
    cfg->total_num_steps = steps > 0 ? steps : 1;
    cfg->cos_min_ratio = 0.1f;
    cfg->eval_fraction = 0.1;
    cfg->eval_interval = 50;
    cfg->eval_iters = 4;
    cfg->eval_optional = 1;
}

static l3d_status parse_batch(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    l3d_train_config_t *cfg = p->cfg;
    int t = 0, m = 0, a = 0, gt, gm, ga;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, root, "", "train_batch_size", 1, 1 << 30, &t, &gt));
    L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, root, "", "train_micro_batch_size_per_gpu", 1, 1 << 30,
                                          &m, &gm));
    L3D_CHECK(j->ctx,
              l3d_cfgjson_get_int(j, root, "", "gradient_accumulation_steps", 1, 1 << 30, &a, &ga));
    if (!gt && !gm && !ga) return L3D_OK;  // the batch we have stands
    if (!gt && !gm) {
        // Only accumulation given: keep the per-rank micro batch we have (or, when that was
        // inferred, the global batch) and re-derive the other, which also follows dp.
        if (!(cfg->batch_inferred & L3D_BATCH_MICRO)) m = cfg->micro_batch_size;
        else if (!(cfg->batch_inferred & L3D_BATCH_TRAIN)) t = cfg->train_batch_size;
    }
    // Only recorded here: the identity involves dp, which command-line flags and the
    // launcher's world may still change, so l3d_train_config_finalize resolves it once.
    cfg->train_batch_size = t;
    cfg->micro_batch_size = m;
    cfg->grad_accum_steps = a;
    cfg->batch_inferred = (t ? 0 : L3D_BATCH_TRAIN) | (m ? 0 : L3D_BATCH_MICRO) |
                          (a ? 0 : L3D_BATCH_ACCUM);
    return L3D_OK;
}

// Top-level keys other than the sections.
static const l3d_dskey_t k_top[] = {
    {"train_batch_size", '*', NULL}, {"train_micro_batch_size_per_gpu", '*', NULL},
    {"gradient_accumulation_steps", '*', NULL}, {"gradient_clipping", '*', NULL},
    {"steps_per_print", '*', NULL}, {"wall_clock_breakdown", '*', NULL},
    // Gradients are always divided before the reduction (by the global batch's tokens): what
    // prescale_gradients true asks for, so the key needs nothing.
    {"prescale_gradients", 'b', NULL},
    {"gradient_predivide_factor", '*', NULL}, {"communication_data_type", '*', NULL},
    {"fp32_allreduce", '*', NULL}, {"data_types", '*', NULL},
    // llama3d only has Adam/AdamW, which DeepSpeed supports with ZeRO: nothing to allow.
    {"zero_allow_untested_optimizer", 'b', NULL}, {"memory_breakdown", 'b', ""},
    {"dump_state", 'b', ""},
    {"optimizer", '*', NULL}, {"scheduler", '*', NULL}, {"fp16", '*', NULL}, {"bf16", '*', NULL},
    {"zero_optimization", '*', NULL}, {"activation_checkpointing", '*', NULL},
    {"tensorboard", '*', NULL}, {"csv_monitor", '*', NULL}, {"wandb", '*', NULL},
    {"flops_profiler", '*', NULL},
    // llama3d's own sections
    {"model", '*', NULL}, {"data", '*', NULL}, {"train", '*', NULL}, {"parallel", '*', NULL}};

// ---- llama3d's sections ------------------------------------------------------------------
// "model": a preset name, a path to a Hugging Face config.json (or its directory), relative
// to the directory of the config file, or an inline config.json object.
static l3d_status parse_model(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    l3d_train_config_t *cfg = p->cfg;
    json_t *m = json_object_get(root, "model");
    if (!m) return L3D_OK;
    if (json_is_object(m)) {
        char *text = json_dumps(m, 0);
        if (!text) return l3d_error(j->ctx, L3D_ERR_NOMEM, "%s: model: out of memory", j->origin);
        char origin[300];
        snprintf(origin, sizeof(origin), "%s: model", j->origin);
        l3d_status st = l3d_model_config_from_json(j->ctx, text, strlen(text), origin, &cfg->model);
        free(text);
        L3D_CHECK(j->ctx, st);
        snprintf(cfg->model_source, sizeof(cfg->model_source), "(inline)");
        cfg->weights_dir[0] = cfg->model_dir[0] = 0;
        return L3D_OK;
    }
    if (!json_is_string(m))
        return l3d_cfgjson_type_error(j, "", "model", m,
                                      "a preset name, a path to a config.json, or a "
                                      "config.json object");
    const char *s = json_string_value(m);
    if (json_string_length(m) >= sizeof(cfg->model_source))
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: model: path longer than %zu characters",
                         j->origin, sizeof(cfg->model_source) - 1);
    const char *const *names = l3d_model_config_preset_names();
    size_t n_names = 0;
    while (names[n_names]) n_names++;
    for (size_t i = 0; i < n_names; i++) {
        if (strcmp(s, names[i]) == 0) {
            L3D_CHECK(j->ctx, l3d_model_config_preset(j->ctx, s, &cfg->model));
            snprintf(cfg->model_source, sizeof(cfg->model_source), "%s", s);
            cfg->weights_dir[0] = cfg->model_dir[0] = 0;
            return L3D_OK;
        }
    }
    // A path. Relative ones are relative to the config file, as DeepSpeed users expect
    // for files that sit next to ds_config.json.
    char path[1100];
    const char *slash = strrchr(j->origin, '/');
    if (s[0] != '/' && slash)
        snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - j->origin), j->origin, s);
    else
        snprintf(path, sizeof(path), "%s", s);
    cfg->weights_dir[0] = 0;
    cfg->model_dir[0] = 0;
    if (l3d_path_is_dir(path) > 0) {
        if (strlen(path) >= sizeof(cfg->model_dir))
            return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: model: path longer than %zu "
                             "characters", j->origin, sizeof(cfg->model_dir) - 1);
        memcpy(cfg->model_dir, path, strlen(path) + 1);
        // A checkpoint directory with weights: training starts from them.
        if (l3d_hf_is_weights_dir(path) || l3d_ckpt_dist_is(path))
            memcpy(cfg->weights_dir, path, strlen(path) + 1);
        size_t len = strlen(path);
        snprintf(path + len, sizeof(path) - len, "/config.json");
    }
    if (!l3d_path_present(path)) {  // a FIFO or a symlink loop is read, and refused as such
        const char *near = l3d_cfgjson_nearest(s, names, n_names);
        return l3d_error(j->ctx, L3D_ERR_CONFIG,
                         "%s: model: '%s' is neither a preset%s%s%s nor an existing config.json "
                         "(looked for %s); presets: llama3-tiny, llama3.2-1b, llama3.2-3b, "
                         "llama3-8b, llama3-70b, llama3-405b",
                         j->origin, s, near ? " (did you mean '" : "", near ? near : "",
                         near ? "'?)" : "", path);
    }
    L3D_CHECK(j->ctx, l3d_model_config_from_file(j->ctx, path, &cfg->model));
    snprintf(cfg->model_source, sizeof(cfg->model_source), "%s", s);
    return L3D_OK;
}

// train.save_dtype: "float32" | "bfloat16" (torch's names; "fp32", "bf16" too).
static l3d_status parse_save_dtype(const l3d_cfgjson_t *j, json_t *sec, int *out) {
    char v[32] = "";
    int have = 0;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, "train", "save_dtype", v, sizeof(v), &have));
    if (!have) return L3D_OK;
    if (!strcmp(v, "float32") || !strcmp(v, "fp32")) *out = L3D_SAVE_DTYPE_F32;
    else if (!strcmp(v, "bfloat16") || !strcmp(v, "bf16")) *out = L3D_SAVE_DTYPE_BF16;
    else
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: train.save_dtype: '%s' is not a dtype "
                         "llama3d saves; use \"float32\" or \"bfloat16\"", j->origin, v);
    return L3D_OK;
}

// train.save_max_shard_size: bytes, as an integer or as transformers spells sizes ("5GB" =
// 5 * 10^9, "5GiB" = 5 * 2^30; B, KB, MB, GB, TB and KiB .. TiB).
static l3d_status parse_shard_size(const l3d_cfgjson_t *j, json_t *sec, uint64_t *out) {
    json_t *v = json_object_get(sec, "save_max_shard_size");
    if (!v) return L3D_OK;
    if (json_is_integer(v) && json_integer_value(v) > 0) {
        *out = (uint64_t)json_integer_value(v);
        return L3D_OK;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end = NULL;
        errno = 0;
        double x = strtod(s, &end);
        static const struct { const char *u; double f; } units[] = {
            {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
            {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
            {"TiB", 1099511627776.0}};
        for (size_t i = 0; end != s && errno == 0 && i < L3D_ARRAY_LEN(units); i++)
            if (!strcmp(end, units[i].u) && x * units[i].f >= 1 && x * units[i].f < 1.8e19) {
                *out = (uint64_t)(x * units[i].f);
                return L3D_OK;
            }
    }
    return l3d_cfgjson_type_error(j, "train", "save_max_shard_size", v,
                                  "a positive number of bytes or a size such as \"5GB\"");
}

// Like "model", a relative data path is relative to the config file's directory.
static l3d_status relative_to_config(const l3d_cfgjson_t *j, const char *key, char path[512]) {
    const char *slash = strrchr(j->origin, '/');
    if (!path[0] || path[0] == '/' || !slash) return L3D_OK;
    char joined[512] = {0};
    int n = snprintf(joined, sizeof(joined), "%.*s/%s", (int)(slash - j->origin), j->origin, path);
    if (n < 0 || (size_t)n >= sizeof(joined))
        return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: %s: resolved path is longer than %zu bytes",
                         j->origin, key, sizeof(joined) - 1);
    memcpy(path, joined, sizeof(joined));
    return L3D_OK;
}

static l3d_status parse_llama3d(const l3d_dsparser_t *p, json_t *root) {
    const l3d_cfgjson_t *j = &p->j;
    l3d_train_config_t *cfg = p->cfg;
    json_t *sec;
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", "parallel", &sec));
    if (sec) {
        static const char *const keys[] = {"dp", "tp", "pp", "order", "schedule",
                                           "sequence_parallel", "layers_per_stage",
                                           "virtual_stages", "tp_mode"};
        L3D_CHECK(j->ctx, l3d_cfgjson_check_keys(j, sec, "parallel", keys, L3D_ARRAY_LEN(keys),
                                                 NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, sec, "parallel", "virtual_stages", 1, 64,
                                              &cfg->virtual_stages, NULL));
        json_t *lps = json_object_get(sec, "layers_per_stage");
        if (lps) {
            size_t n = json_is_array(lps) ? json_array_size(lps) : 0;
            if (!json_is_array(lps) || n < 1 || n > L3D_ARRAY_LEN(cfg->layers_per_stage))
                return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: parallel.layers_per_stage must be "
                                 "an array of 1..%zu layer counts, one per virtual pipeline "
                                 "stage",
                                 j->origin, L3D_ARRAY_LEN(cfg->layers_per_stage));
            for (size_t i = 0; i < n; i++) {
                json_t *v = json_array_get(lps, i);
                if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) > 1 << 20)
                    return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: parallel.layers_per_stage[%zu] "
                                     "must be an integer >= 0", j->origin, i);
                cfg->layers_per_stage[i] = (int)json_integer_value(v);
            }
            cfg->n_layers_per_stage = (int)n;
        }
        L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, sec, "parallel", "sequence_parallel",
                                               &cfg->sequence_parallel, NULL));
        char mode[16] = "";
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, "parallel", "tp_mode", mode, sizeof(mode),
                                              NULL));
        if (!strcmp(mode, "1d")) cfg->tp_mode = 1;
        else if (!strcmp(mode, "2d")) cfg->tp_mode = 2;
        else if (!strcmp(mode, "3d")) cfg->tp_mode = 3;
        else if (mode[0])
            return l3d_error(j->ctx, L3D_ERR_CONFIG, "%s: parallel.tp_mode \"%s\": expected "
                             "\"1d\" (Megatron, the default), \"2d\" or \"3d\"", j->origin,
                             mode);
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, "parallel", "schedule", cfg->pp_schedule,
                                              sizeof(cfg->pp_schedule), NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, "parallel", "order", cfg->parallel_order,
                                              sizeof(cfg->parallel_order), NULL));
        // The world size is checked against the launcher elsewhere.
        int have_dp = 0;
        L3D_CHECK(j->ctx,
                  l3d_cfgjson_get_int(j, sec, "parallel", "dp", 1, 1 << 20, &cfg->dp, &have_dp));
        if (have_dp) cfg->dp_auto = 0;
        L3D_CHECK(j->ctx,
                  l3d_cfgjson_get_int(j, sec, "parallel", "tp", 1, 1 << 20, &cfg->tp, NULL));
        L3D_CHECK(j->ctx,
                  l3d_cfgjson_get_int(j, sec, "parallel", "pp", 1, 1 << 20, &cfg->pp, NULL));
    }
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", "train", &sec));
    if (sec) {
        static const char *const keys[] = {"steps",   "seed",    "save_dir",
                                           "save_interval", "metrics", "device",
                                           "threads", "save_consolidated", "eval_interval",
                                           "eval_iters", "peak_flops", "save_dtype",
                                           "save_max_shard_size", "allow_tf32"};
        const char *tp = "train";
        L3D_CHECK(j->ctx, l3d_cfgjson_check_keys(j, sec, tp, keys, L3D_ARRAY_LEN(keys), NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, sec, tp, "steps", 0, 1 << 30, &cfg->steps, NULL));
        long long seed;
        int have;
        L3D_CHECK(j->ctx,
                  l3d_cfgjson_get_ll(j, sec, tp, "seed", 0, 9007199254740992LL, &seed, &have));
        if (have) cfg->seed = (uint64_t)seed;
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, tp, "save_dir", cfg->save_dir,
                                              sizeof(cfg->save_dir), NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, sec, tp, "save_interval", 0, 1 << 30,
                                              &cfg->save_interval, NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, sec, tp, "save_consolidated",
                                               &cfg->save_consolidated, NULL));
        L3D_CHECK(j->ctx, parse_save_dtype(j, sec, &cfg->save_dtype));
        L3D_CHECK(j->ctx, parse_shard_size(j, sec, &cfg->save_max_shard_size));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, tp, "metrics", cfg->metrics_path,
                                              sizeof(cfg->metrics_path), NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, tp, "device", cfg->device,
                                              sizeof(cfg->device), NULL));
        L3D_CHECK(j->ctx,
                  l3d_cfgjson_get_bool(j, sec, tp, "allow_tf32", &cfg->allow_tf32, NULL));
        L3D_CHECK(j->ctx,
                  l3d_cfgjson_get_int(j, sec, tp, "threads", 0, 4096, &cfg->num_threads, NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, sec, tp, "eval_interval", 0, 1 << 30,
                                              &cfg->eval_interval, NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_int(j, sec, tp, "eval_iters", 1, 1 << 30,
                                              &cfg->eval_iters, NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, sec, tp, "peak_flops", L3D_NUM_GE0,
                                              &cfg->peak_flops, NULL));
    }
    L3D_CHECK(j->ctx, l3d_cfgjson_get_obj(j, root, "", "data", &sec));
    if (sec) {
        static const char *const keys[] = {"path",          "seq_len", "eval_path",
                                           "eval_fraction", "shuffle", "seed", "tokenizer"};
        L3D_CHECK(j->ctx, l3d_cfgjson_check_keys(j, sec, "data", keys, L3D_ARRAY_LEN(keys), NULL));
        int have = 0;
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, "data", "path", cfg->data_path,
                                              sizeof(cfg->data_path), &have));
        if (have) L3D_CHECK(j->ctx, relative_to_config(j, "data.path", cfg->data_path));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, "data", "tokenizer", cfg->tokenizer_path,
                                              sizeof(cfg->tokenizer_path), &have));
        if (have) L3D_CHECK(j->ctx, relative_to_config(j, "data.tokenizer", cfg->tokenizer_path));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_str(j, sec, "data", "eval_path", cfg->eval_path,
                                              sizeof(cfg->eval_path), &have));
        if (have) L3D_CHECK(j->ctx, relative_to_config(j, "data.eval_path", cfg->eval_path));
        // [0, 1): a fraction of 1 would leave nothing to train on.
        L3D_CHECK(j->ctx, l3d_cfgjson_get_num(j, sec, "data", "eval_fraction", L3D_NUM_BETA,
                                              &cfg->eval_fraction, NULL));
        L3D_CHECK(j->ctx, l3d_cfgjson_get_bool(j, sec, "data", "shuffle", &cfg->shuffle, NULL));
        long long dseed;
        L3D_CHECK(j->ctx, l3d_cfgjson_get_ll(j, sec, "data", "seed", 0, 9007199254740992LL,
                                             &dseed, &have));
        if (have) {
            cfg->data_seed = (uint64_t)dseed;
            cfg->data_seed_set = 1;
        }
        L3D_CHECK(j->ctx,
                  l3d_cfgjson_get_int(j, sec, "data", "seq_len", 1, 1 << 24, &cfg->seq_len, NULL));
    }
    return parse_model(p, root);
}

// ---- finalize ----------------------------------------------------------------------------
// Evaluation: one eval stream, an interval that has one, a batch count >= 1, and a roof that
// is a number. Both a file and overrides (a library caller's struct) pass through here.
static l3d_status check_eval(l3d_ctx_t *ctx, const l3d_train_config_t *cfg, const char *origin) {
    int have_eval = cfg->eval_path[0] || cfg->eval_fraction > 0.0;
    if (cfg->eval_path[0] && cfg->eval_fraction > 0.0)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: data.eval_path and data.eval_fraction %g both "
                         "name an eval stream; give one", origin, cfg->eval_fraction);
    if (!(cfg->eval_fraction >= 0.0 && cfg->eval_fraction < 1.0))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: data.eval_fraction: %g must be in [0, 1)",
                         origin, cfg->eval_fraction);
    if (cfg->eval_interval < 0 || cfg->eval_iters < 1)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: train: eval_interval %d must be >= 0 and "
                         "eval_iters %d >= 1", origin, cfg->eval_interval, cfg->eval_iters);
    if (cfg->eval_interval > 0 && !have_eval)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: train.eval_interval %d: no eval stream; set "
                         "data.eval_path or data.eval_fraction", origin, cfg->eval_interval);
    if (!(cfg->peak_flops >= 0.0) || !isfinite(cfg->peak_flops))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: train.peak_flops: %g must be a finite number "
                         ">= 0 (FLOP/s of one rank's device)", origin, cfg->peak_flops);
    return L3D_OK;
}

// What the file alone decides; seq_len against the model, the batch identity and the layout
// wait for l3d_train_config_finalize (core/config/config_layout.c).
static l3d_status finalize(l3d_ctx_t *ctx, l3d_train_config_t *cfg, const char *origin) {
    int perm[3];
    L3D_CHECK(ctx, l3d_mesh_order_parse(ctx, cfg->parallel_order, perm));
    l3d_pp_kind kind;
    L3D_CHECK(ctx, l3d_pp_kind_parse(ctx, cfg->pp_schedule, &kind));
    L3D_CHECK(ctx, l3d_model_config_validate(ctx, &cfg->model));
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
    return check_eval(ctx, cfg, origin);
}

l3d_status l3d_train_config_finalize(l3d_ctx_t *ctx, l3d_train_config_t *cfg) {
    if (!cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "train config: NULL argument");
    const char *origin = cfg->origin[0] ? cfg->origin : "train config";
    L3D_CHECK(ctx, finalize(ctx, cfg, origin));
    // seq_len against the model's context waits for the flags too: --model or --seq-len may
    // replace either side of what the file gave (a file's data.seq_len 4096 was refused
    // against the default model before --model llama3-8b was read).
    if (cfg->seq_len < 1 || cfg->seq_len > cfg->model.max_position_embeddings)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: data.seq_len: %d must be in [1, max_position_embeddings %d]",
                         origin, cfg->seq_len, cfg->model.max_position_embeddings);
    // Text is tokenized with data.tokenizer, else the tokenizer the model's directory carries
    // (a Hugging Face model's own), else bytes.
    if (!cfg->tokenizer_path[0] && cfg->model_dir[0] && l3d_tokenizer_dir_has(cfg->model_dir))
        snprintf(cfg->tokenizer_path, sizeof(cfg->tokenizer_path), "%s", cfg->model_dir);
    // The batch identity and the layout involve dp, tp and pp, which command-line flags and
    // a launcher's world may change after the file: checked once, here.
    return l3d_train_config_check_layout(ctx, cfg, origin);
}

// ---- entry points ------------------------------------------------------------------------
l3d_status l3d_train_config_from_json(l3d_ctx_t *ctx, const char *text, size_t len,
                                      const char *origin, l3d_train_config_t *cfg) {
    if (!text || !cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "train config: NULL argument");
    if (!origin) origin = "ds_config.json";
    json_t *root;
    L3D_CHECK(ctx, l3d_cfgjson_load(ctx, text, len, origin, &root));
    l3d_status st = L3D_OK;
    // Work on a copy so that a rejected file leaves the caller's config as it was.
    l3d_train_config_t copy = *cfg, *tmp = &copy;
    const l3d_dsparser_t p = {{ctx, origin, L3D_CFGJSON_DS}, tmp};
    L3D_CHECK_GOTO(ctx, l3d_dsconfig_check_section(&p, root, "", k_top, L3D_ARRAY_LEN(k_top)), st,
                   done);
    // Order matters: train.device before the precision notes,
    // the optimizer's lr before the scheduler's defaults.
    L3D_CHECK_GOTO(ctx, parse_llama3d(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, parse_batch(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, l3d_dsconfig_parse_sections(&p, root), st, done);
    L3D_CHECK_GOTO(ctx, finalize(ctx, tmp, origin), st, done);
    snprintf(tmp->origin, sizeof(tmp->origin), "%s", origin);
    *cfg = *tmp;
done:
    json_decref(root);
    return st;
}

l3d_status l3d_train_config_from_file(l3d_ctx_t *ctx, const char *path, l3d_train_config_t *cfg) {
    if (!path || !cfg) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "train config: NULL argument");
    char *buf = NULL;
    size_t len = 0;
    L3D_CHECK(ctx, l3d_input_read(ctx, path, "config", L3D_CFGJSON_FILE_MAX, &buf, &len));
    l3d_status st = l3d_train_config_from_json(ctx, buf, len, path, cfg);
    free(buf);
    return st;
}
