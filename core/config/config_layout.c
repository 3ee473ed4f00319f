// The checks that need the whole run known: the batch identity (train = micro x accum x dp)
// and the layout against the model, the pipeline schedule and the device. They run once the
// file, the command-line flags and the launcher's world have all decided dp, tp and pp: from
// l3d_train_config_finalize (so `l3d train --dry-run` refuses what the run would) and again
// from l3d_trainer_create_parallel (for callers that skip finalize). One function, so both
// refuse the same things with the same message.
// defines: l3d_train_config_check_layout, l3d_train_config_check_layout_ex
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/config/config_layout.h"
#include "core/config/config_train_internal.h"
#include "core/l3d_core.h"
#include "core/config/pipeline.h"
#include "devices/device.h"
#include "llama3d/config.h"

// ---- batch identity ----------------------------------------------------------------------
// DeepSpeed's rules; 0 means "not given, infer it". train = micro * accum * dp.
static l3d_status resolve_batch(l3d_ctx_t *ctx, const char *origin, l3d_train_config_t *cfg) {
    // Values inferred by an earlier resolution are forgotten, so they follow a changed dp; the
    // ones the user gave stay and are checked.
    if (cfg->batch_inferred & L3D_BATCH_TRAIN) cfg->train_batch_size = 0;
    if (cfg->batch_inferred & L3D_BATCH_MICRO) cfg->micro_batch_size = 0;
    if (cfg->batch_inferred & L3D_BATCH_ACCUM) cfg->grad_accum_steps = 0;
    long long t = cfg->train_batch_size, m = cfg->micro_batch_size, a = cfg->grad_accum_steps;
    int given = (t ? L3D_BATCH_TRAIN : 0) | (m ? L3D_BATCH_MICRO : 0) | (a ? L3D_BATCH_ACCUM : 0);
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
            else
                snprintf(fix, sizeof(fix), "set train_batch_size to %lld, or ", m * a * dp);
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
    cfg->batch_inferred = (L3D_BATCH_TRAIN | L3D_BATCH_MICRO | L3D_BATCH_ACCUM) & ~given;
    return L3D_OK;
}

// ---- the layout ------------------------------------------------------------------------
static l3d_status check_device(l3d_ctx_t *ctx, const char *origin, const char *name) {
    char built[128] = "";
    size_t o = 0;
    for (int i = 0; l3d_device_backends[i]; i++) {
        if (!strcmp(l3d_device_backends[i]->name, name)) return L3D_OK;
        o += (size_t)snprintf(built + o, sizeof(built) - o, "%s%s", i ? ", " : "",
                              l3d_device_backends[i]->name);
        if (o >= sizeof(built)) o = sizeof(built) - 1;
    }
    return l3d_error(ctx, L3D_ERR_CONFIG, "%s: train.device: '%s' is not a device of this build "
                     "(built: %s)", origin, name, built);
}

// parallel.tp_mode "2d" / "3d": what the model's 2d and 3d paths take so far
// (core/config/config_layout.h). planning: a run l3d plan costs, not one this build runs: only the
// grid's or cube's shape matters.
static l3d_status check_grid_cube(l3d_ctx_t *ctx, const l3d_train_config_t *cfg,
                                  const char *origin, int planning) {
    int d = cfg->tp_mode, q = (int)lround(d == 3 ? cbrt((double)cfg->tp) : sqrt((double)cfg->tp));
    int slices = d == 3 ? q * q : q;  // the micro-batch's slices: grid rows, or q^2 in the cube
    const char *no = NULL;
    if (d == 2 && q * q != cfg->tp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: parallel.tp_mode \"2d\" needs a square tp "
                         "(a q x q grid: 4, 9, 16, ...), not %d", origin, cfg->tp);
    if (d == 3 && q * q * q != cfg->tp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: parallel.tp_mode \"3d\" needs a cube tp "
                         "(q x q x q: 8, 27, 64, ...), not %d", origin, cfg->tp);
    if (cfg->micro_batch_size % slices)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: parallel.tp_mode \"%dd\" splits each "
                         "micro-batch's %d sequences into %d slices: make "
                         "train_micro_batch_size_per_gpu a multiple of %d", origin, d,
                         cfg->micro_batch_size, slices, slices);
    if (planning) no = NULL;
    else if (cfg->sequence_parallel) no = "parallel.sequence_parallel";
    else if (cfg->activation_checkpointing && (cfg->partition_activations ||
                                               cfg->cpu_checkpointing))
        no = "partition_activations / cpu_checkpointing";
    if (no)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "%s: parallel.tp_mode \"%dd\" does not take "
                         "%s yet", origin, d, no);
    if (planning && cfg->sequence_parallel)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: tp_mode %dd splits the rows already: no "
                         "sequence parallelism", origin, d);
    return d == 3 ? l3d_tp3d_check(ctx, &cfg->model, q) : l3d_tp2d_check(ctx, &cfg->model, q);
}

// parallel.layers_per_stage: one count per virtual stage in model order (u = chunk * pp +
// stage; v = 1: one per stage) summing to the model's layers. The first may be 0 (its chunk
// holds the embedding alone) and so may the last (the final norm and the head alone): Llama 3's
// balancing (Dubey et al. 2024, section 3.3.2), Megatron's account_for_embedding_in_pipeline_split
// and account_for_loss_in_pipeline_split. A chunk between them with no layer would only relay.
static l3d_status check_lps(l3d_ctx_t *ctx, const l3d_train_config_t *cfg, const char *origin,
                            int v) {
    int n = cfg->n_layers_per_stage, U = cfg->pp * v, sum = 0;
    if (!n) return L3D_OK;
    for (int i = 0; i < n; i++) sum += cfg->layers_per_stage[i];
    if (n != U || sum != cfg->model.num_hidden_layers)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: parallel.layers_per_stage has %d entries "
                         "summing to %d; it needs pp x virtual_stages = %d entries (one per "
                         "virtual stage, in model order) summing to num_hidden_layers %d",
                         origin, n, sum, U, cfg->model.num_hidden_layers);
    for (int u = 1; u + 1 < U; u++)
        if (!cfg->layers_per_stage[u])
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s: parallel.layers_per_stage[%d] is 0: only "
                             "the first entry (the embedding alone) and the last (the head "
                             "alone) may hold no layer", origin, u);
    return L3D_OK;
}

l3d_status l3d_train_config_check_layout(l3d_ctx_t *ctx, l3d_train_config_t *cfg,
                                         const char *origin) {
    return l3d_train_config_check_layout_ex(ctx, cfg, origin, 0);
}

l3d_status l3d_train_config_check_layout_ex(l3d_ctx_t *ctx, l3d_train_config_t *cfg,
                                            const char *origin, int planning) {
    if (cfg->dp < 1 || cfg->tp < 1 || cfg->pp < 1)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: parallel: dp %d, tp %d, pp %d must be >= 1",
                         origin, cfg->dp, cfg->tp, cfg->pp);
    if (!planning && cfg->tp_mode >= 2 && cfg->tp > 1 && cfg->grad_dtype > 0)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "%s: data_types.grad_accum_dtype %s with "
                         "parallel.tp_mode \"%dd\": its products sum partial gradients in "
                         "float32; use fp32 or tp_mode \"1d\"", origin,
                         cfg->grad_dtype == L3D_BFLOAT16 ? "bf16" : "fp16", cfg->tp_mode);
    L3D_CHECK(ctx, resolve_batch(ctx, origin, cfg));
    l3d_pp_kind kind;
    L3D_CHECK(ctx, l3d_pp_kind_parse(ctx, cfg->pp_schedule, &kind));
    int v = cfg->virtual_stages > 0 ? cfg->virtual_stages : kind == L3D_PP_INTERLEAVED ? 2 : 1;
    L3D_CHECK(ctx, check_lps(ctx, cfg, origin, v));
    L3D_CHECK(ctx, l3d_pp_check(ctx, kind, cfg->pp, v, cfg->grad_accum_steps));
    if (cfg->pp > cfg->model.num_hidden_layers)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.pp %d is more stages than "
                         "num_hidden_layers %d; lower parallel.pp", cfg->pp,
                         cfg->model.num_hidden_layers);
    if ((long)cfg->pp * v > cfg->model.num_hidden_layers && !cfg->n_layers_per_stage)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.pp %d x parallel.virtual_stages %d is "
                         "more virtual stages than num_hidden_layers %d; lower one of them",
                         cfg->pp, v, cfg->model.num_hidden_layers);
    if (cfg->pp > 1 && !planning)
        L3D_CHECK(ctx, l3d_pp_validate(ctx, kind, cfg->pp, v, cfg->grad_accum_steps));
    if (cfg->tp_mode >= 2) L3D_CHECK(ctx, check_grid_cube(ctx, cfg, origin, planning));
    else L3D_CHECK(ctx, l3d_tp_check(ctx, &cfg->model, cfg->tp));
    if (cfg->sequence_parallel && cfg->tp > 1) {
        long long N = (long long)cfg->micro_batch_size * cfg->seq_len;
        if (N % cfg->tp)
            return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.sequence_parallel splits the %lld "
                             "tokens of a micro-batch (train_micro_batch_size_per_gpu x seq_len) "
                             "over tp %d: make them divisible", N, cfg->tp);
    }
    if (cfg->activation_checkpointing && cfg->partition_activations && cfg->tp > 1) {
        long long N = (long long)cfg->micro_batch_size * cfg->seq_len;
        if (N % cfg->tp)
            return l3d_error(ctx, L3D_ERR_CONFIG, "activation_checkpointing.partition_activations "
                             "splits the %lld tokens of a micro-batch (train_micro_batch_size_per_gpu"
                             " x seq_len) over tp %d: make them divisible", N, cfg->tp);
    }
    if (!cfg->adam_w_mode && cfg->weight_decay != 0.0f)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "optimizer: Adam with L2 weight decay "
                         "(adam_w_mode false) is not supported; use AdamW or weight_decay 0");
    return check_device(ctx, origin, cfg->device);
}

// ---- the model's shapes against tp (core/config/config_layout.h)
// ---------------------------------
l3d_status l3d_tp_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, int tp) {
    int H = cfg->num_attention_heads, K = cfg->num_key_value_heads;
    if (tp < 1) return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.tp %d must be >= 1", tp);
    if (H % tp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.tp %d does not divide "
                         "num_attention_heads %d (tensor parallelism splits heads)", tp, H);
    if (K >= tp ? K % tp : tp % K)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.tp %d and num_key_value_heads %d: one "
                         "must divide the other (kv heads are split, or replicated when fewer)",
                         tp, K);
    if (cfg->intermediate_size % tp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.tp %d does not divide "
                         "intermediate_size %d (the MLP is split by columns)", tp,
                         cfg->intermediate_size);
    if (cfg->vocab_size < tp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.tp %d exceeds vocab_size %d", tp,
                         cfg->vocab_size);
    return L3D_OK;
}


l3d_status l3d_tp2d_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, int q) {
    struct {
        const char *name;
        int v;
    } dims[] = {{"hidden_size", cfg->hidden_size},
                {"num_attention_heads", cfg->num_attention_heads},
                {"num_key_value_heads", cfg->num_key_value_heads},
                {"intermediate_size", cfg->intermediate_size},
                {"vocab_size", cfg->vocab_size}};
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].v % q)
            return l3d_error(ctx, L3D_ERR_CONFIG, "tp_mode 2d on a %d x %d grid: %s %d is not a "
                             "multiple of %d", q, q, dims[i].name, dims[i].v, q);
    return L3D_OK;
}


l3d_status l3d_tp3d_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, int q) {
    long D = cfg->head_dim;
    struct {
        const char *name;
        long v, by;
    } dims[] = {{"num_attention_heads", cfg->num_attention_heads, q},
                {"num_key_value_heads", cfg->num_key_value_heads, q},
                {"hidden_size", cfg->hidden_size, (long)q * q},
                {"intermediate_size", cfg->intermediate_size, (long)q * q},
                {"vocab_size", cfg->vocab_size, (long)q * q},
                {"num_attention_heads x head_dim", cfg->num_attention_heads * D, (long)q * q},
                {"num_key_value_heads x head_dim", cfg->num_key_value_heads * D, (long)q * q}};
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].v % dims[i].by)
            return l3d_error(ctx, L3D_ERR_CONFIG, "tp_mode 3d on a %d x %d x %d cube: %s %ld is "
                             "not a multiple of %ld", q, q, q, dims[i].name, dims[i].v,
                             dims[i].by);
    return L3D_OK;
}

