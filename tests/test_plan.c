// l3d plan's model: its FLOP count against the published MFU figures, its error on the
// published runs it was calibrated on (the goals: mean |error| <= 5%, max <= 10%), the
// search's contract, and links measured by l3d bench comm --json. (Its bytes and memory
// against real runs: tests/test_parallel_plan.c.)
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "llama3d/llama3d.h"
#include "llama3d/plan.h"

static l3d_ctx_t *ctx;
static void setup(void) { cr_assert(l3d_ctx_create(NULL, &ctx) == L3D_OK); }
static void teardown(void) { l3d_ctx_destroy(ctx); }
TestSuite(plan, .init = setup, .fini = teardown, .timeout = 120);

// Korthikanti et al. 2022 Table 5 prints MFU from its equation 7, 72 B L s h^2 (1 + s/6h +
// V/12hL), per iteration; PaLM's 6N + 12 L H Q T per token is the same count when N holds the
// layers (12 L h^2) and the head (h V). Published time -> MFU with the planner's count must
// give the printed figures; each is printed to 0.1 points and its time to 0.01 s, so the
// bound is the rounding of both: 0.05 points + MFU * 0.005 s / time, plus the model shape's
// F = 8h/3 rounded to 64 (<= 0.05% of the FLOPs).
Test(plan, flops_reproduce_published_mfu) {
    struct {
        int heads, hidden, layers, gpus, batch;
        double time_s, mfu;
    } k[] = {{64, 6144, 48, 8, 4, 1.10, 41.5},
             {96, 12288, 96, 64, 64, 13.75, 51.4},
             {128, 20480, 105, 280, 280, 37.83, 56.0},
             {160, 25600, 128, 512, 512, 71.49, 56.3}};
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        l3d_model_config_t mc;
        cr_assert(l3d_model_config_preset(ctx, "llama3-8b", &mc) == L3D_OK);
        mc.hidden_size = k[i].hidden;
        mc.num_attention_heads = mc.num_key_value_heads = k[i].heads;
        mc.head_dim = k[i].hidden / k[i].heads;
        mc.num_hidden_layers = k[i].layers;
        mc.intermediate_size = (int)(8.0 * k[i].hidden / 3 / 64 + 0.5) * 64;
        mc.vocab_size = 51200;
        l3d_plan_request_t req;
        l3d_plan_request_default(&req);
        req.model = mc;
        req.gpus = k[i].gpus;
        req.seq_len = 2048;
        req.global_batch = k[i].batch;
        // the count alone: evaluate any valid layout and read its FLOPs back from its MFU
        l3d_plan_layout_t lay = {1, 8, k[i].gpus / 8, 1, 1, 1, 1, 0, L3D_RECOMPUTE_FULL, 0, 0};
        if (k[i].batch == 4) lay.micro_batch = 4;
        l3d_plan_result_t r;
        cr_assert(l3d_plan_evaluate(ctx, &req, &lay, &r) == L3D_OK, "%s", l3d_ctx_last_error(ctx));
        double flops_step = r.mfu * r.step_time_s * req.gpus * req.gpu.peak_flops;
        double mfu = 100 * flops_step / (k[i].time_s * k[i].gpus * 312e12);
        double bound = 0.05 + k[i].mfu * 0.005 / k[i].time_s + k[i].mfu * 5e-4;
        cr_assert(fabs(mfu - k[i].mfu) <= bound, "%d layers: MFU %.3f%% vs published %.1f%% "
                  "(bound %.3f)", k[i].layers, mfu, k[i].mfu, bound);
    }
}

// The fitted constants (l3d_plan_runtime_default, bench/plan_fit.c) on the runs they were
// fitted to. A change to the model that breaks the goals fails here, not in a benchmark.
Test(plan, calibration_error_within_goals) {
    l3d_plan_published_t rows[32];
    int n = 0;
    double cm, cx, hm, hx;
    cr_assert(l3d_plan_published(ctx, NULL, rows, 32, &n, &cm, &cx, &hm, &hx) == L3D_OK, "%s",
              l3d_ctx_last_error(ctx));
    int cal = 0, held = 0;
    for (int i = 0; i < n; i++) {
        cal += rows[i].calibration, held += !rows[i].calibration;
        cr_assert(rows[i].published_s > 0 && rows[i].predicted_s > 0, "%s", rows[i].name);
        // They ran on 80 GB GPUs: their layouts fit llama3d's memory too (issue 27).
        cr_assert(rows[i].plan.fits, "%s %s: %.1f GiB per GPU does not fit", rows[i].source,
                  rows[i].name, rows[i].plan.mem_bytes / 1073741824.0);
    }
    cr_assert(cal == 19 && held == 3, "rows: %d calibration, %d held out", cal, held);
    cr_assert(cm <= 0.05 && cx <= 0.10, "calibration: mean |error| %.2f%%, max %.2f%%", 100 * cm,
              100 * cx);
    // The held-out Llama 3 rows (never fitted on; issue 27's goal: each within 10% once Meta's
    // layouts fit), the 8K ones without recomputation as the paper ran them.
    cr_assert(hx <= 0.10, "held out: max |error| %.2f%% (mean %.2f%%)", 100 * hx, 100 * hm);
    for (int i = 0; i < n; i++)
        if (!rows[i].calibration && !strstr(rows[i].name, "128K"))
            cr_assert(rows[i].plan.layout.recompute == L3D_RECOMPUTE_NONE &&
                      rows[i].plan.layout.ends == 1, "%s: planned with recomputation %d, "
                      "ends %d", rows[i].name, rows[i].plan.layout.recompute,
                      rows[i].plan.layout.ends);
    // Narayanan et al. 2021 Table 1, 1T row: 96 B s l h^2 (1 + s/6h + V/16lh) at 163 TFLOP/s
    // on 3072 GPUs is the time the row is compared with.
    double B = 3072, s = 2048, l = 128, h = 25600, V = 51200;
    double t = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)) / (3072 * 163e12);
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].name, "1008.0B"))
            cr_assert(fabs(rows[i].published_s / t - 1) < 1e-12, "%.6f vs %.6f",
                      rows[i].published_s, t);
}

static l3d_plan_request_t request_70b(void) {
    l3d_plan_request_t req;
    l3d_plan_request_default(&req);
    cr_assert(l3d_model_config_preset(ctx, "llama3-70b", &req.model) == L3D_OK);
    cr_assert(l3d_plan_gpu_named(ctx, "h100-sxm", &req.gpu) == L3D_OK);
    cr_assert(l3d_plan_link_named(ctx, "nvlink4", &req.intra) == L3D_OK);
    cr_assert(l3d_plan_link_named(ctx, "ib-ndr400", &req.inter) == L3D_OK);
    req.gpus = 64;
    req.seq_len = 4096;
    req.global_batch = 256;
    return req;
}

// Fixed keys stay fixed; the ranking is fitting layouts by step time, then the rest by
// memory; each result's time is the sum of its parts.
Test(plan, search_contract) {
    l3d_plan_request_t req = request_70b();
    req.fixed.tp = 8;
    req.fixed.zero_stage = 1;
    l3d_plan_result_t res[40];
    int n = 0;
    long searched = 0;
    cr_assert(l3d_plan_search(ctx, &req, res, 40, &n, &searched) == L3D_OK, "%s",
              l3d_ctx_last_error(ctx));
    cr_assert(n == 40 && searched >= n, "%d of %ld", n, searched);
    for (int i = 0; i < n; i++) {
        const l3d_plan_result_t *r = &res[i];
        cr_assert(r->layout.tp == 8 && r->layout.zero_stage == 1);
        cr_assert((long)r->layout.dp * r->layout.tp * r->layout.pp * r->layout.cp == req.gpus);
        double sum = r->compute_s + r->bubble_s;
        for (int g = 0; g < L3D_PLAN_GROUPS; g++) sum += r->comm_s[g];
        cr_assert(fabs(sum - r->step_time_s) <= 1e-12 * r->step_time_s);
        cr_assert(r->fits == (r->mem_bytes <= req.gpu.mem_bytes - req.mem_reserve));
        if (i) {
            const l3d_plan_result_t *p = &res[i - 1];
            cr_assert(p->fits >= r->fits, "a fitting layout after one that does not");
            if (p->fits && r->fits) cr_assert(p->step_time_s <= r->step_time_s);
            if (!p->fits && !r->fits) cr_assert(p->mem_bytes <= r->mem_bytes);
        }
    }
    cr_assert(res[0].fits, "70B on 64 H100 at tp 8 and ZeRO-1: nothing fits?");
    // 2d: only q x q grids without sequence parallelism, with the grid's traffic on the tp
    // group; 3d likewise with q^3 cubes
    req.fixed.tp_mode = 2;
    req.fixed.tp = 0;  // (8 is no square)
    cr_assert_eq(l3d_plan_search(ctx, &req, res, 8, &n, NULL), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert(n > 0);
    for (int i = 0; i < n; i++) {
        const l3d_plan_layout_t *l = &res[i].layout;
        cr_assert(l->tp_mode == 2 && (l->tp == 4 || l->tp == 16 || l->tp == 64) && !l->sp,
                  "2d layout tp %d sp %d", l->tp, l->sp);
        const l3d_plan_result_t *r = &res[i];
        double sum = r->compute_s + r->bubble_s;
        for (int g = 0; g < L3D_PLAN_GROUPS; g++) sum += r->comm_s[g];
        cr_assert(fabs(sum - r->step_time_s) <= 1e-9 * r->step_time_s);
        cr_assert(r->comm_bytes[0] > 0 && r->comm_s[0] > 0);  // (group 0: tp)
    }
    req.fixed.tp_mode = 3;
    cr_assert_eq(l3d_plan_search(ctx, &req, res, 8, &n, NULL), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert(n > 0);
    for (int i = 0; i < n; i++) {
        const l3d_plan_layout_t *l = &res[i].layout;
        cr_assert(l->tp_mode == 3 && (l->tp == 8 || l->tp == 64) && !l->sp,
                  "3d layout tp %d sp %d", l->tp, l->sp);
        const l3d_plan_result_t *r = &res[i];
        double sum = r->compute_s + r->bubble_s;
        for (int g = 0; g < L3D_PLAN_GROUPS; g++) sum += r->comm_s[g];
        cr_assert(fabs(sum - r->step_time_s) <= 1e-9 * r->step_time_s);
        cr_assert(r->comm_bytes[0] > 0 && r->comm_s[0] > 0);
    }
    // tp_mode left open (0): the search is the three modes' searches together, its best the
    // best of theirs (tp 64 is a 64-head 1d split, an 8 x 8 grid and a 4^3 cube)
    req.fixed.tp = 64;
    long cnt[4];
    l3d_plan_result_t best[4];
    for (int mode = 0; mode <= 3; mode++) {
        req.fixed.tp_mode = mode;
        cr_assert_eq(l3d_plan_search(ctx, &req, res, 1, &n, &cnt[mode]), L3D_OK, "%s",
                     l3d_ctx_last_error(ctx));
        cr_assert(n == 1 && cnt[mode] > 0 && (!mode || res[0].layout.tp_mode == mode));
        best[mode] = res[0];
    }
    cr_assert_eq(cnt[0], cnt[1] + cnt[2] + cnt[3]);
    int m0 = best[0].layout.tp_mode;
    cr_assert(best[0].step_time_s == best[m0].step_time_s && best[0].fits == best[m0].fits);
    for (int mode = 1; mode <= 3; mode++)
        if (best[mode].fits == best[0].fits)
            cr_assert(best[0].fits ? best[0].step_time_s <= best[mode].step_time_s
                                   : best[0].mem_bytes <= best[mode].mem_bytes);
        else
            cr_assert(best[0].fits, "a mode's fitting layout ranked below one that does not");
    req.fixed.tp_mode = 4;
    cr_assert(l3d_plan_search(ctx, &req, res, 1, &n, NULL) == L3D_ERR_INVALID_ARG);
    req.fixed.tp_mode = 1;
    req.fixed.tp = 8;
    l3d_plan_layout_t bad = {3, 8, 1, 1, 1, 1, 1, 1, 0, 0, 0};
    cr_assert(l3d_plan_evaluate(ctx, &req, &bad, res) == L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "does not make 64 GPUs"), "%s",
              l3d_ctx_last_error(ctx));
    // tp 3 does not divide the 64 heads: the trainer's own check says so
    l3d_plan_layout_t tp3 = {1, 3, 1, 1, 1, 1, 1, 0, 0, 0, 0};
    req.gpus = 3;
    cr_assert(l3d_plan_evaluate(ctx, &req, &tp3, res) == L3D_ERR_CONFIG);
}

// A ring all-reduce of S bytes over n ranks: 2(n-1) steps of alpha and 2(n-1)/n S / beta.
Test(plan, link_costs) {
    l3d_plan_link_t nv;
    cr_assert(l3d_plan_link_named(ctx, "nvlink3", &nv) == L3D_OK);
    cr_assert(l3d_plan_link_named(ctx, "nvlink5", &nv) == L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "nvlink3, nvlink4"), "%s", l3d_ctx_last_error(ctx));
    l3d_plan_gpu_t g;
    cr_assert(l3d_plan_gpu_named(ctx, "b200", &g) == L3D_ERR_INVALID_ARG);
    cr_assert(l3d_plan_gpu_named(ctx, "a100-40gb", &g) == L3D_OK && g.peak_flops == 312e12);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

// Rows on an exact alpha-beta line give back alpha and beta (the bus bandwidth at the measured
// rank count); an op without a file is derived from the all-reduce; bad files name themselves.
Test(plan, measured_link) {
    char dir[] = "/tmp/l3d_plan_XXXXXX";
    cr_assert(mkdtemp(dir));
    char ar[256], p2p[256], bad[256], both[600];
    snprintf(ar, sizeof(ar), "%s/ar.json", dir);
    snprintf(p2p, sizeof(p2p), "%s/p2p.json", dir);
    snprintf(bad, sizeof(bad), "%s/bad.json", dir);
    // all-reduce over 4 ranks: t = 20 us + S / 5 GB/s (algorithm bandwidth) -> bus bandwidth
    // 5 * 2(n-1)/n = 7.5 GB/s
    char text[2048];
    int o = snprintf(text, sizeof(text), "{\"op\": \"allreduce\", \"ranks\": 4, \"rows\": [");
    for (int i = 0; i < 6; i++) {
        double S = 8.0 * pow(16, i);
        o += snprintf(text + o, sizeof(text) - (size_t)o, "%s{\"bytes\": %.0f, \"time_us\": %.17g}",
                      i ? ", " : "", S, 20 + S / 5e9 * 1e6);
    }
    snprintf(text + o, sizeof(text) - (size_t)o, "]}");
    write_file(ar, text);
    write_file(p2p, "{\"op\": \"p2p\", \"ranks\": 2, \"rows\": [{\"bytes\": 1000, \"time_us\": 2}, "
                    "{\"bytes\": 1000000, \"time_us\": 101}]}");
    write_file(bad, "{\"op\": \"allreduce\", \"ranks\": 2, \"rows\": [{\"bytes\": 8}]}");
    l3d_plan_link_t link;
    cr_assert(l3d_plan_link_measured(ctx, ar, &link) == L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert(fabs(link.alpha[L3D_PLAN_OP_ALLREDUCE] - 20e-6) < 1e-12);
    cr_assert(fabs(link.beta[L3D_PLAN_OP_ALLREDUCE] / 7.5e9 - 1) < 1e-9, "%g",
              link.beta[L3D_PLAN_OP_ALLREDUCE]);
    cr_assert(link.ranks == 4 && fabs(link.alpha[L3D_PLAN_OP_GATHER] - 10e-6) < 1e-12);
    // mixed rank counts are refused; a file with one row names itself
    snprintf(both, sizeof(both), "%s,%s", ar, p2p);
    cr_assert(l3d_plan_link_measured(ctx, both, &link) == L3D_ERR_FORMAT);
    cr_assert(l3d_plan_link_measured(ctx, bad, &link) == L3D_ERR_FORMAT);
    cr_assert(strstr(l3d_ctx_last_error(ctx), bad), "%s", l3d_ctx_last_error(ctx));
    // p2p alone (2 ranks): 1 us + S / 10 GB/s; no all-reduce file is an error
    cr_assert(l3d_plan_link_measured(ctx, p2p, &link) == L3D_ERR_FORMAT);
    unlink(ar);
    unlink(p2p);
    unlink(bad);
    rmdir(dir);
}
