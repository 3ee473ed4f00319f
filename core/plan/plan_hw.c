// The hardware l3d plan knows: published GPUs and links, links measured by `l3d bench comm
// --json`, and the runtime constants fitted on the published A100 runs (docs/plan.md).
// defines: l3d_plan_gpu_named, l3d_plan_link_named, l3d_plan_gpu_names, l3d_plan_link_names,
//          l3d_plan_link_measured, l3d_plan_runtime_default, l3d_plan_request_default
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/config/config_json.h"
#include "core/input.h"
#include "core/l3d_core.h"
#include "llama3d/plan.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

// NVIDIA's data sheets: dense bf16 tensor-core peak (half the "with sparsity" figure), memory
// and its bandwidth (SXM parts).
// The share of that peak kernels reach is lower on Hopper than on the A100 the runtime
// constants were fitted on (l3d_plan_runtime_default), so each GPU scales them:
// - GEMM: the maximum achievable matmul FLOPS of bf16 matmuls over a search of shapes
//   (S. Bekman, "Machine Learning Engineering", compute/accelerator, MAMF table, CUDA 12):
//   A100 SXM 85.9% of peak, H100 SXM 80.1%, GH200 83.0%; H200 (the same GH100 die at the same
//   700 W, no row there) as the H100.
// - Attention: FlashAttention-2's best forward utilisation, 73% on the A100 (Dao 2023,
//   arXiv 2307.08691) and 35% on the H100 (Shah et al. 2024, FlashAttention-3, arXiv
//   2407.08608: FlashAttention-2 "achieving only 35% utilization on the H100"); every Hopper
//   part as the H100. (The runtime's attn_eff is FlashAttention-2 on the A100.)
#define H100_GEMM (80.1 / 85.9)
#define GH200_GEMM (83.0 / 85.9)
#define HOPPER_ATTN (35.0 / 73.0)
static const l3d_plan_gpu_t k_gpus[] = {
    {"h100-sxm", 989.4e12, 80 * GiB, 3.35e12, H100_GEMM, HOPPER_ATTN},
    {"h200-sxm", 989.4e12, 141e9, 4.8e12, H100_GEMM, HOPPER_ATTN},
    {"a100-80gb", 312e12, 80 * GiB, 2.039e12, 1, 1},
    {"a100-40gb", 312e12, 40 * GiB, 1.555e12, 1, 1},
    {"gh200", 989.4e12, 96 * GiB, 4.0e12, GH200_GEMM, HOPPER_ATTN},
};
static const char *const k_gpu_names[] = {"h100-sxm", "a100-80gb", "a100-40gb", "h200-sxm",
                                          "gh200", NULL};

// Per GPU, one direction: NVLink 3 (A100) 300 GB/s, NVLink 4 (H100/H200) 450 GB/s, one NIC per
// GPU of 200 or 400 Gb/s. beta is that times the share a ring collective reaches as bus
// bandwidth (an assumption, docs/plan.md: 0.8 on NVLink, 0.9 on InfiniBand, 0.85 on RoCE);
// alpha per ring step. The same for every op.
typedef struct {
    const char *name;
    double alpha, beta;
} link_spec_t;
static const link_spec_t k_links[] = {
    {"nvlink3", 1e-6, 300e9 * 0.8},   {"nvlink4", 1e-6, 450e9 * 0.8},
    {"ib-hdr200", 5e-6, 25e9 * 0.9},  {"ib-ndr400", 5e-6, 50e9 * 0.9},
    {"roce-400", 6e-6, 50e9 * 0.85},
};
static const char *const k_link_names[] = {"nvlink3", "nvlink4", "ib-hdr200", "ib-ndr400",
                                           "roce-400", NULL};

const char *const *l3d_plan_gpu_names(void) { return k_gpu_names; }
const char *const *l3d_plan_link_names(void) { return k_link_names; }

static void join(char *buf, size_t cap, const char *const *names) {
    buf[0] = 0;
    for (size_t i = 0, o = 0; names[i] && o + 1 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", names[i]);
}

l3d_status l3d_plan_gpu_named(l3d_ctx_t *ctx, const char *name, l3d_plan_gpu_t *gpu) {
    for (size_t i = 0; name && i < L3D_ARRAY_LEN(k_gpus); i++)
        if (!strcmp(k_gpus[i].name, name)) {
            *gpu = k_gpus[i];
            return L3D_OK;
        }
    char known[256];
    join(known, sizeof(known), k_gpu_names);
    return l3d_error(ctx, L3D_ERR_INVALID_ARG, "unknown GPU type '%s' (known: %s, measured)",
                     name ? name : "(null)", known);
}

l3d_status l3d_plan_link_named(l3d_ctx_t *ctx, const char *name, l3d_plan_link_t *link) {
    for (size_t i = 0; name && i < L3D_ARRAY_LEN(k_links); i++)
        if (!strcmp(k_links[i].name, name)) {
            memset(link, 0, sizeof(*link));
            snprintf(link->name, sizeof(link->name), "%s", name);
            for (int op = 0; op < L3D_PLAN_OP_COUNT; op++) {
                link->alpha[op] = k_links[i].alpha;
                link->beta[op] = k_links[i].beta;
            }
            return L3D_OK;
        }
    char known[256];
    join(known, sizeof(known), k_link_names);
    return l3d_error(ctx, L3D_ERR_INVALID_ARG,
                     "unknown link '%s' (known: %s, or a file from l3d bench comm --json)",
                     name ? name : "(null)", known);
}

// ---- measured links --------------------------------------------------------------------

// The ring's steps and bus-bandwidth factor of op over n ranks (see l3d_plan_link_t).
static double op_steps(int op, int n) {
    return op == L3D_PLAN_OP_ALLREDUCE ? 2.0 * (n - 1) : op == L3D_PLAN_OP_GATHER ? n - 1 : 1;
}
static double op_factor(int op, int n) {
    return op == L3D_PLAN_OP_ALLREDUCE ? 2.0 * (n - 1) / n
           : op == L3D_PLAN_OP_GATHER  ? (double)(n - 1) / n
                                       : 1.0;
}

// time = a + c * S fitted to rows (S, t) with relative weights (1/t^2), so 8 B and 64 MiB
// count alike. A slope that is not positive (noise at small sizes only) falls back to the
// largest row's time per byte; a negative intercept to a fit through the origin.
static void fit_alpha_beta(const double *S, const double *t, int n, double *a, double *c) {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        double w = 1.0 / (t[i] * t[i]);
        sw += w, sx += w * S[i], sy += w * t[i], sxx += w * S[i] * S[i], sxy += w * S[i] * t[i];
    }
    double det = sw * sxx - sx * sx;
    *a = det != 0 ? (sy * sxx - sx * sxy) / det : 0;
    *c = det != 0 ? (sw * sxy - sx * sy) / det : 0;
    if (*c <= 0) {
        int big = 0;
        for (int i = 1; i < n; i++)
            if (S[i] > S[big]) big = i;
        *c = t[big] / S[big];
        *a = 0;
        for (int i = 0; i < n; i++) *a += (t[i] - *c * S[i]) / n;
    }
    if (*a < 0) {
        *a = 0;
        *c = sxx > 0 ? sxy / sxx : *c;
    }
}

static l3d_status read_measured(l3d_ctx_t *ctx, const char *path, l3d_plan_link_t *link,
                                int *have) {
    char *text = NULL;
    size_t len = 0;
    json_t *root = NULL;
    L3D_CHECK(ctx, l3d_input_read(ctx, path, "measured link", L3D_CFGJSON_FILE_MAX, &text, &len));
    l3d_status st = l3d_cfgjson_load(ctx, text, len, path, &root);
    free(text);
    if (st < 0) return st;
    const char *opname = json_string_value(json_object_get(root, "op"));
    json_t *rows = json_object_get(root, "rows"), *jr = json_object_get(root, "ranks");
    int ranks = json_is_integer(jr) ? (int)json_integer_value(jr) : 0;
    int op = -1;
    if (opname && !strcmp(opname, "allreduce")) op = L3D_PLAN_OP_ALLREDUCE;
    if (opname && (!strcmp(opname, "allgather") || !strcmp(opname, "reduce_scatter")))
        op = L3D_PLAN_OP_GATHER;
    if (opname && (!strcmp(opname, "p2p") || !strcmp(opname, "pingpong"))) op = L3D_PLAN_OP_P2P;
    size_t nrows = json_is_array(rows) ? json_array_size(rows) : 0;
    if (op < 0 || ranks < 2 || nrows < 2 || nrows > 64) {
        json_decref(root);
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: not an l3d bench comm --json file of allreduce, allgather, "
                         "reduce_scatter, p2p or pingpong over >= 2 ranks with 2 to 64 sizes "
                         "(op, ranks, rows)", path);
    }
    double S[64], t[64];
    for (size_t i = 0; i < nrows; i++) {
        json_t *r = json_array_get(rows, i);
        json_t *b = json_object_get(r, "bytes"), *us = json_object_get(r, "time_us");
        if (!json_is_integer(b) || !json_is_number(us) || json_integer_value(b) <= 0 ||
            !(json_number_value(us) > 0)) {
            json_decref(root);
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: rows[%zu] needs a positive integer \"bytes\" and a positive "
                             "\"time_us\"", path, i);
        }
        S[i] = (double)json_integer_value(b);
        t[i] = json_number_value(us) * 1e-6;
    }
    json_decref(root);
    if (link->ranks && link->ranks != ranks)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: measured over %d ranks, another file over %d "
                         "(measure every op at one size)", path, ranks, link->ranks);
    double a, c;
    fit_alpha_beta(S, t, (int)nrows, &a, &c);
    // beta as a bus bandwidth: the measured time per byte times the op's factor at `ranks`
    link->alpha[op] = a;
    link->beta[op] = op_factor(op, ranks) / c;
    link->ranks = ranks;
    have[op] = 1;
    return L3D_OK;
}

l3d_status l3d_plan_link_measured(l3d_ctx_t *ctx, const char *paths, l3d_plan_link_t *link) {
    memset(link, 0, sizeof(*link));
    int have[L3D_PLAN_OP_COUNT] = {0};
    char buf[2048];
    if (!paths || strlen(paths) >= sizeof(buf))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "measured link: no file names, or too long");
    snprintf(buf, sizeof(buf), "%s", paths);
    for (char *save = NULL, *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
        L3D_CHECK(ctx, read_measured(ctx, p, link, have));
    if (!have[L3D_PLAN_OP_ALLREDUCE])
        return l3d_error(ctx, L3D_ERR_FORMAT, "measured link %s: no allreduce file among them",
                         paths);
    // An op not measured: the all-reduce's bus bandwidth, half its per-call latency (a ring
    // all-gather or a message takes half the steps at two ranks).
    for (int op = 0; op < L3D_PLAN_OP_COUNT; op++)
        if (!have[op]) {
            link->alpha[op] = link->alpha[L3D_PLAN_OP_ALLREDUCE] / 2;
            link->beta[op] = link->beta[L3D_PLAN_OP_ALLREDUCE];
        }
    snprintf(link->name, sizeof(link->name), "measured (%d ranks)", link->ranks);
    return L3D_OK;
}

// Time of one op of S bytes over n ranks on link (l3d_plan_link_t's contract).
double l3d_plan_link_time(const l3d_plan_link_t *link, int op, int n, double S) {
    if (n < 2 && op != L3D_PLAN_OP_P2P) return 0;
    double steps = op_steps(op, n);
    if (link->ranks > 0) steps /= op_steps(op, link->ranks);
    return steps * link->alpha[op] + S * op_factor(op, n) / link->beta[op];
}

// ---- defaults ----------------------------------------------------------------------------

void l3d_plan_runtime_default(l3d_plan_runtime_t *rt) {
    // Fitted by bench/plan_fit.c on Korthikanti et al. 2022 Table 5 and Narayanan et al. 2021
    // Table 1 (A100); docs/plan.md gives the fit and its error.
    // attn_eff is not fitted (the calibration runs stored their scores): FlashAttention-2's
    // causal forward + backward at head dim 128 reaches about this share of an A100's peak.
    *rt = (l3d_plan_runtime_t){.flash_attention = 1,
                               .dp_overlap = 1,
                               .gemm_eff = 0.703,
                               .attn_eff = 0.55,
                               .mem_traffic = 2.38};
}

void l3d_plan_request_default(l3d_plan_request_t *req) {
    memset(req, 0, sizeof(*req));
    (void)l3d_plan_gpu_named(NULL, "a100-80gb", &req->gpu);
    (void)l3d_plan_link_named(NULL, "nvlink3", &req->intra);
    (void)l3d_plan_link_named(NULL, "ib-hdr200", &req->inter);
    l3d_plan_runtime_default(&req->runtime);
    req->gpus_per_node = 8;
    req->mem_reserve = 2 * GiB;
    req->fixed.zero_stage = req->fixed.recompute = req->fixed.sp = req->fixed.ends = -1;
}
