// One layout of l3d plan: its memory per GPU, its communication per group and its step time.
// docs/plan.md derives each term; the shapes are one tensor-parallel rank's.
//
// Memory and communication are not modelled here but taken from the trainer's own
// estimators (l3d_train_config_memory, l3d_train_config_comm_terms), run on the
// ds_config.json the layout stands for: they equal what a run allocates and counts.
// defines: l3d_plan_evaluate, l3d_plan_model_flops_per_token, l3d_plan_layout_str
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/config/config_train_internal.h"
#include "core/l3d_core.h"
#include "core/config/pipeline.h"
#include "core/plan/plan_internal.h"
#include "core/train/trainer_internal.h"

const char *l3d_plan_layout_str(const l3d_plan_layout_t *l, char *buf, size_t cap) {
    static const char *const rc[] = {"none", "selective", "full"};
    snprintf(buf, cap, "dp=%d,tp=%d,pp=%d,cp=%d,v=%d,mb=%d,zero=%d,recompute=%s,sp=%d%s%s",
             l->dp, l->tp, l->pp, l->cp, l->v, l->micro_batch, l->zero_stage,
             rc[l->recompute >= 0 && l->recompute <= 2 ? l->recompute : 0], l->sp,
             l->tp_mode == 2 ? ",tp_mode=2d" : l->tp_mode == 3 ? ",tp_mode=3d" : "",
             l->ends == 1 ? ",ends=1" : "");
    return buf;
}

// Parameters of one layer that a matmul reads (q, k, v, o; gate, up, down).
static double layer_params(const l3d_model_config_t *mc) {
    double C = mc->hidden_size, F = mc->intermediate_size, H = mc->num_attention_heads;
    double K = mc->num_key_value_heads, D = mc->head_dim;
    return C * (H + 2 * K) * D + H * D * C + 3 * C * F;
}

double l3d_plan_model_flops_per_token(const l3d_model_config_t *mc, int seq_len) {
    double N = mc->num_hidden_layers * layer_params(mc) + (double)mc->vocab_size * mc->hidden_size;
    return 6 * N + 12.0 * mc->num_hidden_layers * mc->num_attention_heads * mc->head_dim * seq_len;
}

// ---- compute -----------------------------------------------------------------------------

// A GPU's kernel share over the A100's (l3d_plan_gpu_t; 0: 1).
static double rel(double x) { return x > 0 ? x : 1; }

// A (m,k) x (k,n) product: 2mnk FLOPs at gemm_eff of the peak, scaled to the GPU. (An
// efficiency rising with the smallest dimension, x / (x + x0), was fitted too: the published
// runs put x0 at 0.)
static double gemm_s(const l3d_plan_request_t *r, double m, double n, double k) {
    return 2 * m * n * k / (r->gpu.peak_flops * r->runtime.gemm_eff * rel(r->gpu.gemm_rel));
}

// One layer, one micro-batch, one tensor-parallel rank, seconds.
typedef struct {
    double fwd, bwd, rc;  // forward, backward, what recomputation adds
    double attn;          // the attention core's forward (context parallelism overlaps it)
} layer_time_t;

// es: bytes of an activation element (the counts below are for 2-byte ones).
static layer_time_t layer_time(const l3d_plan_request_t *r, const l3d_plan_layout_t *l,
                               double es) {
    const l3d_model_config_t *mc = &r->model;
    double C = mc->hidden_size, F = mc->intermediate_size, H = mc->num_attention_heads;
    double K = mc->num_key_value_heads, D = mc->head_dim, t = l->tp, T = r->seq_len;
    double n = (double)l->micro_batch * T / l->cp;  // tokens of this rank: (n, C)
    // q, k, v (n, (H+2K)D/t); o (n, C) from (n, HD/t); gate and up (n, 2F/t); down (n, C)
    double g = gemm_s(r, n, (H + 2 * K) * D / t, C) + gemm_s(r, n, C, H * D / t) +
               gemm_s(r, n, 2 * F / t, C) + gemm_s(r, n, C, F / t);
    // Attention core: QK^T and AV over all T keys, 4 n T (H/t) D FLOPs. Flash kernels skip
    // the causal half and run at attn_eff; stored scores run as batched GEMMs and move (T,T)
    // tensors.
    double af = 4 * n * T * (H / t) * D, attn, attn_bwd;
    int flash = r->runtime.flash_attention;
    if (flash) {
        attn = 0.5 * af / (r->gpu.peak_flops * r->runtime.attn_eff * rel(r->gpu.attn_rel));
        attn_bwd = 2.5 * attn;  // the backward recomputes the scores: 2.5x the forward's FLOPs
    } else {
        attn = gemm_s(r, n * H / t, T, D) * 2;  // QK^T and AV: af in all
        attn_bwd = 2 * attn;
    }
    // Elementwise work (norms, rotary, SwiGLU, softmax, residuals) is memory bound: the bytes
    // Korthikanti et al. 2022 count as stored activations per layer, 34 C bytes per token
    // (10 C + 24 C / t without sequence parallelism), and 5 (H/t) T bytes per token of stored
    // scores, times mem_traffic.
    // (2d and 3d keep a 1/t block of every activation, as sequence parallelism does)
    double tok = (l->sp || l->tp_mode >= 2) && l->tp > 1 ? 34 * C / t : 10 * C + 24 * C / t;
    double scores = flash ? 0 : 5 * (H / t) * T;
    double el = r->runtime.mem_traffic * es / 2 * n * (tok + scores) / r->gpu.mem_bw;
    double el_scores = r->runtime.mem_traffic * es / 2 * n * scores / r->gpu.mem_bw;
    layer_time_t lt = {.fwd = g + attn + el, .bwd = 2 * g + attn_bwd + 2 * el, .attn = attn};
    if (l->recompute == L3D_RECOMPUTE_FULL) lt.rc = lt.fwd;
    if (l->recompute == L3D_RECOMPUTE_SELECTIVE) lt.rc = flash ? 0 : attn + el_scores;
    return lt;
}

// The head on the last stage: (n, V/t) logits forward and backward, and the cross-entropy's
// passes over them (read, exp, write the gradient: 12 bytes per logit).
static double head_time(const l3d_plan_request_t *r, const l3d_plan_layout_t *l) {
    double n = (double)l->micro_batch * r->seq_len / l->cp, V = r->model.vocab_size / (double)l->tp;
    double C = r->model.hidden_size;
    return 3 * gemm_s(r, n, V, C) + r->runtime.mem_traffic * 12 * n * V / r->gpu.mem_bw;
}

// ---- communication -----------------------------------------------------------------------

// The link of a group of n ranks `stride` ranks apart (order tp-cp-dp-pp, fastest first):
// NVLink while the group fits in one node, else the network.
static const l3d_plan_link_t *group_link(const l3d_plan_request_t *r, long stride, int n) {
    return stride * n <= r->gpus_per_node ? &r->intra : &r->inter;
}

static double term_s(const l3d_plan_link_t *link, const l3d_comm_term_t *t, int n) {
    if (!t->calls) return 0;
    // A 2d grid's broadcast or reduce is one pipelined pass of its bytes over the link: a p2p
    // cost per call.
    int op = t->op == L3D_COMM_OP_ALLREDUCE ? L3D_PLAN_OP_ALLREDUCE
             : t->op == L3D_COMM_OP_GATHER  ? L3D_PLAN_OP_GATHER
                                            : L3D_PLAN_OP_P2P;
    // calls of bytes / calls each; a p2p term counts sends and receives as calls
    double calls = t->op == L3D_COMM_OP_P2P ? (double)t->calls / 2 : (double)t->calls;
    return calls * l3d_plan_link_time(link, op, n, (double)t->bytes / calls);
}

// ---- the layout as a trainer configuration -----------------------------------------------

int l3d_plan_layers_per_stage(const l3d_model_config_t *mc, const l3d_plan_layout_t *l,
                              int *lps, int max) {
    if (l->ends != 1 || l->pp < 2) return 0;
    // The embedding and the head count as a layer each: L + 2 places over U virtual stages
    // (the first (L + 2) % U one more, as l3d_model_set_stage balances), the first and the
    // last one less.
    int U = l->pp * l->v, places = mc->num_hidden_layers + 2;
    if (U > places || U > max) return -1;
    for (int u = 0; u < U; u++)
        lps[u] = places / U + (u < places % U) - (u == 0) - (u == U - 1);
    return U;
}

// The schedule's simulation, once per (pp, v, A) in a scratch.
static l3d_status schedule_ok(l3d_ctx_t *ctx, l3d_plan_scratch_t *sc, int pp, int v, int A) {
    if (pp == 1) return L3D_OK;
    for (int i = 0; i < sc->n; i++)
        if (sc->memo[i].pp == pp && sc->memo[i].v == v && sc->memo[i].A == A) {
            if (sc->memo[i].st < 0)
                return l3d_error(ctx, sc->memo[i].st, "plan: pipeline schedule pp %d, v %d, %d "
                                 "micro-batches refused", pp, v, A);
            return L3D_OK;
        }
    l3d_status st = l3d_pp_validate(ctx, v > 1 ? L3D_PP_INTERLEAVED : L3D_PP_1F1B, pp, v, A);
    if (sc->n < L3D_PLAN_MEMO) {
        sc->memo[sc->n].pp = pp, sc->memo[sc->n].v = v, sc->memo[sc->n].A = A;
        sc->memo[sc->n++].st = st;
    }
    return st;
}

static l3d_status layout_config(l3d_ctx_t *ctx, const l3d_plan_request_t *r,
                                const l3d_plan_layout_t *l, l3d_plan_scratch_t *sc) {
    l3d_train_config_t *cfg = &sc->cfg;
    if (r->base) {
        *cfg = *r->base;
    } else {
        l3d_train_config_default(NULL, cfg);
        cfg->bf16 = 1, cfg->fp16 = 0;
        cfg->fp32_allreduce = r->runtime.dp_fp32_grads;
    }
    cfg->model = r->model;
    snprintf(cfg->origin, sizeof(cfg->origin), "plan");
    cfg->dp = l->dp, cfg->tp = l->tp, cfg->pp = l->pp, cfg->dp_auto = 0;
    cfg->train_batch_size = r->global_batch;
    cfg->micro_batch_size = l->micro_batch;
    cfg->grad_accum_steps = r->global_batch / (l->dp * l->micro_batch);
    cfg->batch_inferred = 0;
    cfg->seq_len = r->seq_len / l->cp;  // the tokens a rank holds (context parallelism)
    cfg->zero_stage = l->zero_stage;
    cfg->activation_checkpointing = l->recompute == L3D_RECOMPUTE_FULL;
    cfg->sequence_parallel = l->sp;
    cfg->tp_mode = l->tp_mode;
    cfg->virtual_stages = l->v;
    cfg->n_layers_per_stage = l3d_plan_layers_per_stage(&r->model, l, cfg->layers_per_stage,
                                                        (int)L3D_ARRAY_LEN(cfg->layers_per_stage));
    if (cfg->n_layers_per_stage < 0)
        return l3d_error(ctx, L3D_ERR_CONFIG, "plan: %d virtual stages for %d layers, the "
                         "embedding and the head", l->pp * l->v, r->model.num_hidden_layers);
    snprintf(cfg->pp_schedule, sizeof(cfg->pp_schedule), "%s", l->v > 1 ? "interleaved" : "1f1b");
    if (r->global_batch % (l->dp * l->micro_batch))
        return l3d_error(ctx, L3D_ERR_CONFIG, "plan: global batch %d is not a multiple of dp %d "
                         "x micro-batch %d", r->global_batch, l->dp, l->micro_batch);
    if (r->seq_len % l->cp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "plan: seq %d is not a multiple of cp %d",
                         r->seq_len, l->cp);
    L3D_CHECK(ctx, l3d_train_config_check_layout_ex(ctx, cfg, "plan", 1));
    return schedule_ok(ctx, sc, l->pp, l->v, cfg->grad_accum_steps);
}

l3d_status l3d_plan_evaluate_in(l3d_ctx_t *ctx, const l3d_plan_request_t *r,
                                const l3d_plan_layout_t *l, l3d_plan_scratch_t *sc,
                                l3d_plan_result_t *res) {
    char ls[160];
    if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->cp < 1 || l->v < 1 || l->micro_batch < 1 ||
        l->zero_stage < 0 || l->zero_stage > 3 || l->recompute < 0 || l->recompute > 2 ||
        l->sp < 0 || l->sp > 1 || l->ends < 0 || l->ends > 1 ||
        (long)l->dp * l->tp * l->pp * l->cp != r->gpus)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "plan: layout %s does not make %d GPUs",
                         l3d_plan_layout_str(l, ls, sizeof(ls)), r->gpus);
    if (l->tp_mode < 1 || l->tp_mode > 3)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "plan: tp_mode %d: 1, 2 or 3", l->tp_mode);
    l3d_train_config_t *cfg = &sc->cfg;
    L3D_CHECK(ctx, layout_config(ctx, r, l, sc));
    memset(res, 0, sizeof(*res));
    res->layout = *l;

    // Memory: the stage that needs the most. Stage 0 has the embedding, the last the head and
    // its logits; between them a stage holds no more layers (the split gives the first ones
    // more; ends takes one from stage 0 alone) and no more micro-batches in flight (the
    // warm-up shrinks with the stage) than stage 1, so stages 0, 1 and pp - 1 decide.
    int cand[3] = {0, 1, l->pp - 1};
    for (int i = 0; i < (l->pp < 3 ? l->pp : 3); i++) {
        int s = cand[i];
        l3d_mem_breakdown_t mem;
        l3d_train_config_memory_stage(cfg, s, &mem);
        double total = (double)mem.params + (double)mem.grads + (double)mem.optim +
                       (double)mem.acts;
        if (s && total <= res->mem_bytes) continue;
        res->mem_params = (double)mem.params, res->mem_grads = (double)mem.grads;
        res->mem_optim = (double)mem.optim, res->mem_acts = (double)mem.acts;
        res->mem_bytes = total;
    }
    res->fits = res->mem_bytes <= r->gpu.mem_bytes - r->mem_reserve;

    // Compute of one micro-batch on a stage: its layers (an uneven split gives the first
    // stages one more), the last stage adds the head. The busiest stage sets the pace.
    double es = (double)l3d_dtype_size(l3d_train_config_act_dtype(cfg));
    layer_time_t lt = layer_time(r, l, es);
    double per_layer = lt.fwd + lt.bwd + lt.rc, c_first = 0, c_max = 0;
    int Ls = 0;
    for (int s = 0; s < l->pp; s++) {
        l3d_model_t ms = {0};
        l3d_model_set_dims_tp(&ms, &r->model, l->tp, 0);
        l3d_model_set_stage(&ms, l->pp, l->v, s, l3d_train_config_lps(cfg));
        double c = ms.L * per_layer + (s == l->pp - 1 ? head_time(r, l) : 0);
        if (!s) c_first = ms.L * per_layer, Ls = ms.L;
        c_max = fmax(c_max, c);
    }
    // the average stage: L layers over pp, and the head once
    double c_stage = (r->model.num_hidden_layers * per_layer + head_time(r, l)) / l->pp;

    // Communication: the trainer's terms for world rank 0, each on its group's link.
    l3d_comm_term_t terms[L3D_COMM_TERMS_MAX];
    int nt = l3d_train_config_comm_terms(cfg, terms, L3D_COMM_TERMS_MAX);
    int A = cfg->grad_accum_steps, size[3] = {l->tp, l->dp, l->pp};
    long stride[3] = {1, (long)l->tp * l->cp, (long)l->tp * l->cp * l->dp};
    double tp_mb = 0, pp_mb = 0, pp_after = 0, dp_grad = 0, dp_after = 0, dp_mb = 0;
    for (int i = 0; i < nt; i++) {
        const l3d_comm_term_t *t = &terms[i];
        int g = t->group;
        res->comm_bytes[g] += t->bytes;  // L3D_MESH_* is the result's group index (cp: 3)
        res->comm_calls[g] += t->calls;
        l3d_comm_term_t tt = *t;
        if (g == L3D_MESH_PP && t->per_mb && r->runtime.pp_scatter_gather && !l->sp &&
            l->tp_mode < 2)  // (2d and 3d send their block already)
            tt.bytes /= (uint64_t)l->tp;  // each rank sends its 1/tp over the network
        // a term on part of its group (a grid's row, a cube's axis): its ranks, on the link
        // their span needs
        int n = t->ranks ? t->ranks : size[g];
        long st = stride[g] * (t->stride ? t->stride : 1);
        double s = term_s(group_link(r, st, n), &tt, n);
        if (g == L3D_MESH_TP) tp_mb += s / A;  // per micro-batch, inside its compute
        else if (g == L3D_MESH_PP && t->per_mb) pp_mb += s / A;
        else if (g == L3D_MESH_PP) pp_after += s;
        else if (t->per_mb) dp_mb += s;
        else if (t->after) dp_after += s;
        else dp_grad += s;
    }
    // Context parallelism: each layer all-gathers k and v over the cp group in the forward
    // (again when recomputed) and reduce-scatters their gradients, overlapped with the
    // attention it feeds.
    double cp_mb = 0;
    if (l->cp > 1) {
        const l3d_model_config_t *mc = &r->model;
        double kv = 2.0 * l->micro_batch * r->seq_len * mc->num_key_value_heads / l->tp *
                    mc->head_dim * es;  // bytes of the full k and v
        int passes = 2 + (l->recompute == L3D_RECOMPUTE_FULL);
        uint64_t calls = (uint64_t)Ls * passes * (uint64_t)A;
        res->comm_bytes[3] = (uint64_t)(kv * (double)calls);
        res->comm_calls[3] = calls;
        const l3d_plan_link_t *cl = group_link(r, l->tp, l->cp);
        double one = l3d_plan_link_time(cl, L3D_PLAN_OP_GATHER, l->cp, kv);
        cp_mb = Ls * passes * fmax(0, one - lt.attn);
    }

    // The pipeline: m micro-batches at the busiest stage's pace, plus the fill and drain of
    // (pp - 1) / v slots of an average stage, each with its tp, cp and pipeline traffic.
    int m = A;
    double slot_avg = c_stage + tp_mb + cp_mb + pp_mb;
    res->compute_s = m * c_max;
    res->bubble_s = (double)(l->pp - 1) / l->v * slot_avg;
    res->comm_s[0] = m * tp_mb;
    res->comm_s[2] = m * pp_mb + pp_after;
    res->comm_s[3] = m * cp_mb;
    // Data parallelism: reductions of every micro-batch (ZeRO-2/3) hide behind its backward
    // (or its forward and backward, ZeRO-3's gathers); the last micro-batch's reductions
    // behind its backward; what runs after the update does not hide.
    double bwd_mb = Ls * (lt.bwd + lt.rc);
    if (r->runtime.dp_overlap) {
        dp_mb = m * fmax(0, dp_mb / m - (l->zero_stage >= 3 ? c_first : bwd_mb));
        dp_grad = fmax(0, dp_grad - bwd_mb);
    }
    res->comm_s[1] = dp_mb + dp_grad + dp_after;
    // AdamW over this rank's parameters: float32 master, exp_avg, exp_avg_sq read and written,
    // the gradient read, the bf16 copy written (30 bytes each), memory bound.
    double shard = res->mem_optim / 8;
    res->compute_s += 30 * shard / r->gpu.mem_bw;
    res->step_time_s = res->compute_s + res->bubble_s;
    for (int g = 0; g < L3D_PLAN_GROUPS; g++) res->step_time_s += res->comm_s[g];
    double tokens = (double)r->global_batch * r->seq_len;
    res->tokens_per_s_per_gpu = tokens / res->step_time_s / r->gpus;
    res->mfu = res->tokens_per_s_per_gpu * l3d_plan_model_flops_per_token(&r->model, r->seq_len) /
               r->gpu.peak_flops;
    return L3D_OK;
}

l3d_status l3d_plan_evaluate(l3d_ctx_t *ctx, const l3d_plan_request_t *r,
                             const l3d_plan_layout_t *l, l3d_plan_result_t *res) {
    l3d_plan_scratch_t *sc = l3d_calloc(ctx, 1, sizeof(*sc), "plan");
    if (!sc) return L3D_ERR_NOMEM;
    l3d_status st = l3d_plan_evaluate_in(ctx, r, l, sc, res);
    l3d_free(ctx, sc, sizeof(*sc), "plan");
    return st;
}
