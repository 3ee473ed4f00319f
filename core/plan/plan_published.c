// The published training runs l3d plan is checked against, each planned with its published
// layout and software. Calibration (the runtime constants were fitted on these, A100):
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
// arXiv 2205.05198) Table 3 configurations and Table 5 iteration times, and the 530B run
// with 8-way data parallelism of its section 6.3; Narayanan et al. 2021 ("Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", arXiv 2104.04473)
// Table 1. Held out (never fitted on, H100): Dubey et al. 2024 ("The Llama 3 Herd of Models",
// arXiv 2407.21783) Table 4.
// defines: l3d_plan_published
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"
#include "core/plan/plan_internal.h"

typedef struct {
    const char *source, *name;
    int heads, hidden, layers;  // a GPT model; 0: Llama 3 405B (the llama3-405b preset)
    int tp, pp, dp, cp, v, mb;  // v, mb 0: not published, searched
    int recompute, sp;
    int seq, batch;             // tokens per sequence, sequences per step
    double time_s;              // published iteration time (0: derive from tflops)
    double tflops;              // published model TFLOP/s per GPU (see row_time)
} pub_t;

enum { FULL = L3D_RECOMPUTE_FULL, SEL = L3D_RECOMPUTE_SELECTIVE };
#define K22 "korthikanti2022-t5"
#define N21 "narayanan2021-t1"
#define L3 "llama3-t4"

static const pub_t k_runs[] = {
    // Table 5: "Present Work" is sequence parallelism + selective recomputation, "Full
    // Recompute" is full recomputation without sequence parallelism; interleaved with 3
    // chunks for 175B and 530B (section 6); no data parallelism, except the 530B row of
    // section 6.3 (8-way, the batch per model instance kept).
    {K22, "22B present", 64, 6144, 48, 8, 1, 1, 1, 1, 4, SEL, 1, 2048, 4, 1.10, 0},
    {K22, "22B full", 64, 6144, 48, 8, 1, 1, 1, 1, 4, FULL, 0, 2048, 4, 1.42, 0},
    {K22, "175B present", 96, 12288, 96, 8, 8, 1, 1, 3, 1, SEL, 1, 2048, 64, 13.75, 0},
    {K22, "175B full", 96, 12288, 96, 8, 8, 1, 1, 3, 1, FULL, 0, 2048, 64, 18.13, 0},
    {K22, "530B present", 128, 20480, 105, 8, 35, 1, 1, 3, 1, SEL, 1, 2048, 280, 37.83, 0},
    {K22, "530B full", 128, 20480, 105, 8, 35, 1, 1, 3, 1, FULL, 0, 2048, 280, 49.05, 0},
    {K22, "1T present", 160, 25600, 128, 8, 64, 1, 1, 1, 1, SEL, 1, 2048, 512, 71.49, 0},
    {K22, "1T full", 160, 25600, 128, 8, 64, 1, 1, 1, 1, FULL, 0, 2048, 512, 94.42, 0},
    {K22, "530B present dp8", 128, 20480, 105, 8, 35, 8, 1, 3, 1, SEL, 1, 2048, 2240, 39.15, 0},
    // Table 1: full recomputation (equation 3 assumes it), interleaved schedule (section
    // 5.1), micro-batch and chunk count not stated.
    {N21, "1.7B", 24, 2304, 24, 1, 1, 32, 1, 1, 0, FULL, 0, 2048, 512, 0, 137},
    {N21, "3.6B", 32, 3072, 30, 2, 1, 32, 1, 1, 0, FULL, 0, 2048, 512, 0, 138},
    {N21, "7.5B", 32, 4096, 36, 4, 1, 32, 1, 1, 0, FULL, 0, 2048, 512, 0, 142},
    {N21, "18.4B", 48, 6144, 40, 8, 1, 32, 1, 1, 0, FULL, 0, 2048, 1024, 0, 135},
    {N21, "39.1B", 64, 8192, 48, 8, 2, 32, 1, 0, 0, FULL, 0, 2048, 1536, 0, 138},
    {N21, "76.1B", 80, 10240, 60, 8, 4, 32, 1, 0, 0, FULL, 0, 2048, 1792, 0, 140},
    {N21, "145.6B", 96, 12288, 80, 8, 8, 24, 1, 0, 0, FULL, 0, 2048, 2304, 0, 148},
    {N21, "310.1B", 128, 16384, 96, 8, 16, 15, 1, 0, 0, FULL, 0, 2048, 2160, 0, 155},
    {N21, "529.6B", 128, 20480, 105, 8, 35, 9, 1, 0, 0, FULL, 0, 2048, 2520, 0, 163},
    {N21, "1008.0B", 160, 25600, 128, 8, 64, 6, 1, 0, 0, FULL, 0, 2048, 3072, 0, 163},
    // Table 4 (H100, RoCE): the published layout; micro-batch, chunks, ZeRO stage and
    // sequence parallelism searched, and recomputation at 128K. Batch = DP x batch size per
    // DP. Section 3.3.2: "we could pre-train Llama 3 on sequences of 8K tokens without
    // activation checkpointing".
    {L3, "8192 GPUs", 0, 0, 0, 8, 16, 64, 1, 0, 0, 0, -1, 8192, 2048, 0, 430},
    {L3, "16384 GPUs", 0, 0, 0, 8, 16, 128, 1, 0, 0, 0, -1, 8192, 2048, 0, 400},
    {L3, "16384 GPUs, 128K", 0, 0, 0, 8, 16, 8, 16, 0, 0, -1, -1, 131072, 128, 0, 380},
};

// A GPT model of the papers as a Llama shape: multi-head attention (kv heads = heads), the
// MLP's 2 x 4h^2 weights as SwiGLU's 3 x h x F with F = 8h/3 (to a multiple of 64: the FLOPs
// and parameters differ by < 0.05%), vocabulary 51200, tied embeddings (Megatron's GPT).
static void gpt_model(const pub_t *p, l3d_model_config_t *mc) {
    (void)l3d_model_config_preset(NULL, "llama3-8b", mc);
    snprintf(mc->name, sizeof(mc->name), "gpt-%s", p->name);
    mc->hidden_size = p->hidden;
    mc->num_attention_heads = mc->num_key_value_heads = p->heads;
    mc->head_dim = p->hidden / p->heads;
    mc->num_hidden_layers = p->layers;
    mc->intermediate_size = (int)(8.0 * p->hidden / 3 / 64 + 0.5) * 64;
    mc->vocab_size = 51200;
    mc->max_position_embeddings = p->seq;
    mc->tie_word_embeddings = 1;
}

// The published step time. Table 5 gives it; Table 1 gives model TFLOP/s per GPU with
// equation 3's FLOPs, 96 B s l h^2 (1 + s/6h + V/16lh) (full recomputation counted); Llama 3
// gives TFLOP/s per GPU without its convention: PaLM's (6N + 12 L H Q T per token) is taken.
static double row_time(const pub_t *p, const l3d_model_config_t *mc, int gpus) {
    if (p->time_s > 0) return p->time_s;
    double X = p->tflops * 1e12 * gpus;
    if (p->heads) {
        double B = p->batch, s = p->seq, l = p->layers, h = p->hidden, V = 51200;
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)) / X;
    }
    return (double)p->batch * p->seq * l3d_plan_model_flops_per_token(mc, p->seq) / X;
}

l3d_status l3d_plan_published(l3d_ctx_t *ctx, const l3d_plan_runtime_t *rt,
                              l3d_plan_published_t *rows, int max, int *n_p, double *cal_mean,
                              double *cal_max, double *held_mean, double *held_max) {
    double sum[2] = {0, 0}, mx[2] = {0, 0};
    int cnt[2] = {0, 0}, n = 0;
    for (size_t i = 0; i < L3D_ARRAY_LEN(k_runs) && n < max; i++) {
        const pub_t *p = &k_runs[i];
        l3d_plan_request_t req;
        l3d_plan_request_default(&req);
        int cal = p->heads > 0;
        if (cal) {
            // Megatron-LM 2021-22: stored attention scores, float32 gradient all-reduce not
            // overlapped with the backward ("no gradient all-reduce overlap", 2022 section
            // 6.3), on DGX A100 nodes (NVLink 3, 8 HDR InfiniBand NICs).
            gpt_model(p, &req.model);
            if (rt) req.runtime = *rt;
            req.runtime.flash_attention = 0;
            req.runtime.dp_overlap = 0;
            // Gradients all-reduced in float32 under bf16 (Megatron-LM forces it; the 2022
            // runs are taken as bf16, MT-NLG's precision), in fp16 under fp16 (its default;
            // the 2021 paper trains in fp16). Neither paper states it.
            req.runtime.dp_fp32_grads = !strcmp(p->source, K22);
        } else {
            // Llama 3: H100 80GB (the paper's 700 W HBM3 part), NVLink in the node, RoCE at
            // 400 Gb/s between nodes; float32 gradient reduce-scatter (its section 3.3.2,
            // "Numerical stability").
            L3D_CHECK(ctx, l3d_model_config_preset(ctx, "llama3-405b", &req.model));
            L3D_CHECK(ctx, l3d_plan_gpu_named(ctx, "h100-sxm", &req.gpu));
            L3D_CHECK(ctx, l3d_plan_link_named(ctx, "nvlink4", &req.intra));
            L3D_CHECK(ctx, l3d_plan_link_named(ctx, "roce-400", &req.inter));
            if (rt) req.runtime = *rt;
            req.runtime.dp_fp32_grads = 1;
        }
        req.runtime.pp_scatter_gather = cal;
        // These runs ran, so their layout must fit llama3d's memory too: the unstated keys
        // take the fastest fitting values, as for any plan.
        req.ignore_fit = 0;
        req.gpus = p->dp * p->tp * p->pp * p->cp;
        req.seq_len = p->seq;
        req.global_batch = p->batch;
        // Llama 3 counts the embedding and the head as layers of its pipeline split (its
        // section 3.3.2); Megatron-LM 2021-22 split the layers alone.
        req.fixed = (l3d_plan_layout_t){p->dp, p->tp, p->pp, p->cp, 1,          p->v,
                                        p->mb, cal ? 0 : -1, p->recompute, p->sp, !cal};
        l3d_plan_published_t *row = &rows[n];
        memset(row, 0, sizeof(*row));
        row->source = p->source;
        row->name = p->name;
        row->calibration = cal;
        row->model = req.model;
        int got = 0;
        L3D_CHECK(ctx, l3d_plan_search(ctx, &req, &row->plan, 1, &got, NULL));
        row->published_s = row_time(p, &req.model, req.gpus);
        row->predicted_s = row->plan.step_time_s;
        row->error = row->predicted_s / row->published_s - 1;
        int k = cal ? 0 : 1;
        sum[k] += fabs(row->error);
        mx[k] = fmax(mx[k], fabs(row->error));
        cnt[k]++;
        n++;
    }
    *n_p = n;
    if (cal_mean) *cal_mean = cnt[0] ? sum[0] / cnt[0] : 0;
    if (cal_max) *cal_max = mx[0];
    if (held_mean) *held_mean = cnt[1] ? sum[1] / cnt[1] : 0;
    if (held_max) *held_max = mx[1];
    return L3D_OK;
}
