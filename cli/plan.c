// l3d plan: which layout to train a model with on a cluster, ranked, with the reasons (memory
// per GPU, step time and its parts, MFU, bytes per group); or, with --published, the model's
// error against the published runs it was calibrated and checked on. docs/plan.md.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "llama3d/plan.h"
#include "platform/platform.h"

#define GiB (1024.0 * 1024.0 * 1024.0)

static const char *const k_rc[] = {"none", "selective", "full"};
static const char *const k_groups[L3D_PLAN_GROUPS] = {"tp", "dp", "pp", "cp"};

// --model: a preset, a config.json, or a directory holding one.
static l3d_status load_model(l3d_ctx_t *ctx, const char *v, l3d_model_config_t *mc) {
    for (const char *const *p = l3d_model_config_preset_names(); *p; p++)
        if (!strcmp(*p, v)) return l3d_model_config_preset(ctx, v, mc);
    if (l3d_path_is_dir(v)) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/config.json", v);
        return l3d_model_config_from_file(ctx, path, mc);
    }
    if (l3d_path_present(v)) return l3d_model_config_from_file(ctx, v, mc);
    return l3d_model_config_preset(ctx, v, mc);  // reports the preset names
}

// --layout K=V,...: the keys fixed; the rest searched. Returns 0 or prints why and -1.
// Every item counts: an empty one (",,", a trailing comma) or a key given twice is refused,
// not skipped or silently won by the last (tp=8,tp=4 would plan tp 4).
static int parse_layout(const char *spec, l3d_plan_layout_t *f) {
    static const char *const keys[] = {"dp", "tp", "pp", "cp", "v", "mb", "zero", "sp",
                                       "ends", "recompute", "tp_mode"};
    char buf[512];
    if (strlen(spec) >= sizeof(buf)) {
        fprintf(stderr, "l3d plan: --layout: longer than %zu characters\n", sizeof(buf) - 1);
        return -1;
    }
    snprintf(buf, sizeof(buf), "%s", spec);
    int seen[sizeof(keys) / sizeof(keys[0])] = {0};
    for (char *kv = buf, *next; kv; kv = next) {
        char *comma = strchr(kv, ',');
        next = comma ? comma + 1 : NULL;
        if (comma) *comma = 0;
        if (!kv[0]) {
            fprintf(stderr, "l3d plan: --layout '%s': an empty item (KEY=VALUE items separated "
                    "by single commas, e.g. tp=8,pp=16)\n", spec);
            return -1;
        }
        char *eq = strchr(kv, '=');
        if (!eq) {
            fprintf(stderr, "l3d plan: --layout: '%s' is not KEY=VALUE (e.g. tp=8,pp=16)\n", kv);
            return -1;
        }
        *eq = 0;
        const char *k = kv, *v = eq + 1;
        int ki = 0;
        while (ki < (int)(sizeof(keys) / sizeof(keys[0])) && strcmp(k, keys[ki])) ki++;
        if (ki == (int)(sizeof(keys) / sizeof(keys[0]))) {
            fprintf(stderr, "l3d plan: --layout: unknown key '%s' (keys: dp, tp, pp, cp, v, mb, "
                    "zero, recompute, sp, ends, tp_mode)\n", k);
            return -1;
        }
        if (seen[ki]++) {
            fprintf(stderr, "l3d plan: --layout '%s': key '%s' given twice; give it once\n",
                    spec, k);
            return -1;
        }
        long long x = 0;
        int *ints[] = {&f->dp, &f->tp, &f->pp, &f->cp, &f->v, &f->micro_batch, &f->zero_stage,
                       &f->sp, &f->ends};
        const long long hi[] = {1 << 24, 4096, 4096, 4096, 64, 1 << 20, 3, 1, 1};
        if (ki < 9) {
            char flag[32];
            snprintf(flag, sizeof(flag), "--layout %s", keys[ki]);
            if (l3d_cli_int("plan", flag, v, ki >= 6 ? 0 : 1, hi[ki], &x)) return -1;
            *ints[ki] = (int)x;
        } else if (!strcmp(k, "recompute")) {
            int done = 0;
            for (int i = 0; i < 3; i++)
                if (!strcmp(v, k_rc[i])) f->recompute = i, done = 1;
            if (!done) {
                fprintf(stderr, "l3d plan: --layout recompute: '%s' is not none, selective or "
                        "full\n", v);
                return -1;
            }
        } else {  // tp_mode
            if (strcmp(v, "1d") && strcmp(v, "2d") && strcmp(v, "3d")) {
                fprintf(stderr, "l3d plan: --layout tp_mode: '%s' is not 1d, 2d or 3d\n", v);
                return -1;
            }
            f->tp_mode = v[0] - '0';
        }
    }
    return 0;
}

// ---- --gpu measured ------------------------------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// This machine as a GPU: its sgemm peak with the threads one rank gets
// (l3d_gemm_peak_measure), memcpy bandwidth (one thread, 256 MiB, best of 5, read + write
// bytes) and physical memory.
static l3d_status measure_gpu(l3d_ctx_t *ctx, int threads, l3d_plan_gpu_t *g) {
    memset(g, 0, sizeof(*g));
    snprintf(g->name, sizeof(g->name), "measured (%d threads)", threads);
    l3d_status st = l3d_gemm_peak_measure(ctx, "cpu", threads, &g->peak_flops);
    if (st < 0) return st;
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return L3D_ERR_NOMEM;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = now_s();
        memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
        best = fmin(best, now_s() - t0);
    }
    free(a);
    free(b);
    g->mem_bw = 2.0 * (double)n / best;
    g->mem_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    return L3D_OK;
}

static l3d_status get_link(l3d_ctx_t *ctx, const char *v, l3d_plan_link_t *link) {
    for (const char *const *p = l3d_plan_link_names(); *p; p++)
        if (!strcmp(*p, v)) return l3d_plan_link_named(ctx, v, link);
    if (strchr(v, '/') || strstr(v, ".json")) return l3d_plan_link_measured(ctx, v, link);
    return l3d_plan_link_named(ctx, v, link);  // lists the names
}

// ---- output ------------------------------------------------------------------------------

static json_t *result_json(const l3d_model_config_t *mc, const l3d_plan_result_t *r) {
    const l3d_plan_layout_t *l = &r->layout;
    char mode[8];
    snprintf(mode, sizeof(mode), "%dd", l->tp_mode);
    json_t *lay = json_pack("{s:i, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:s, s:b, s:b}", "dp",
                            l->dp, "tp", l->tp, "pp", l->pp, "cp", l->cp, "tp_mode", mode, "v",
                            l->v, "mb", l->micro_batch, "zero", l->zero_stage, "recompute",
                            k_rc[l->recompute], "sp", l->sp, "ends", l->ends == 1);
    // the config key that trains it (ds_config's "parallel": {"layers_per_stage": [...]})
    int lps[512], n = l3d_plan_layers_per_stage(mc, l, lps, 512);
    if (n > 0) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(lps[i]));
        json_object_set_new(lay, "layers_per_stage", arr);
    }
    json_t *bytes = json_object(), *secs = json_object();
    for (int g = 0; g < L3D_PLAN_GROUPS; g++) {
        json_object_set_new(bytes, k_groups[g], json_integer((json_int_t)r->comm_bytes[g]));
        json_object_set_new(secs, k_groups[g], json_real(r->comm_s[g]));
    }
    return json_pack("{s:o, s:f, s:{s:f, s:f, s:f, s:f}, s:b, s:f, s:f, s:f, s:f, s:f, s:o, "
                     "s:o}",
                     "layout", lay, "mem_gib_per_gpu", r->mem_bytes / GiB, "mem_gib", "params",
                     r->mem_params / GiB, "grads", r->mem_grads / GiB, "optim",
                     r->mem_optim / GiB, "acts", r->mem_acts / GiB, "fits", r->fits,
                     "step_time_s", r->step_time_s, "compute_s", r->compute_s, "bubble_s",
                     r->bubble_s, "mfu", r->mfu, "tokens_per_s_per_gpu", r->tokens_per_s_per_gpu,
                     "comm_bytes", bytes, "comm_s", secs);
}

static void print_table(const l3d_plan_result_t *res, int n) {
    printf("%-4s %-58s %8s %4s %9s %6s %9s %8s %8s %8s %8s  %s\n", "#", "layout", "mem GiB",
           "fits", "step s", "MFU", "tok/s/GPU", "compute", "bubble", "tp s", "dp s",
           "pp s, cp s");
    for (int i = 0; i < n; i++) {
        const l3d_plan_result_t *r = &res[i];
        const l3d_plan_layout_t *l = &r->layout;
        char lay[160];
        snprintf(lay, sizeof(lay), "dp=%d tp=%d%s pp=%d cp=%d v=%d mb=%d zero=%d rc=%s sp=%d%s",
                 l->dp, l->tp, l->tp_mode == 2 ? "(2d)" : l->tp_mode == 3 ? "(3d)" : "", l->pp,
                 l->cp, l->v, l->micro_batch, l->zero_stage, k_rc[l->recompute], l->sp,
                 l->ends == 1 ? " ends" : "");
        printf("%-4d %-58s %8.2f %4s %9.3f %5.1f%% %9.0f %8.3f %8.3f %8.3f %8.3f  %.3f, %.3f\n",
               i + 1, lay, r->mem_bytes / GiB, r->fits ? "yes" : "no", r->step_time_s,
               100 * r->mfu, r->tokens_per_s_per_gpu, r->compute_s, r->bubble_s, r->comm_s[0],
               r->comm_s[1], r->comm_s[2], r->comm_s[3]);
    }
}

static int published(l3d_ctx_t *ctx, int as_json) {
    l3d_plan_published_t rows[32];
    int n = 0;
    double cm, cx, hm, hx;
    l3d_status st = l3d_plan_published(ctx, NULL, rows, 32, &n, &cm, &cx, &hm, &hx);
    if (st < 0) return l3d_cli_fail("plan", ctx, st);
    if (as_json) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++) {
            json_t *o = result_json(&rows[i].model, &rows[i].plan);
            json_object_set_new(o, "source", json_string(rows[i].source));
            json_object_set_new(o, "run", json_string(rows[i].name));
            json_object_set_new(o, "calibration", json_boolean(rows[i].calibration));
            json_object_set_new(o, "published_s", json_real(rows[i].published_s));
            json_object_set_new(o, "error", json_real(rows[i].error));
            json_array_append_new(arr, o);
        }
        char *s = json_dumps(arr, JSON_INDENT(1));
        json_decref(arr);
        if (s) printf("%s\n", s);
        free(s);
        return s ? L3D_EXIT_OK : L3D_EXIT_FAIL;
    }
    // "fitted": a calibration row (the runtime constants were fitted on it); "no": held out
    printf("%-20s %-18s %-6s %10s %10s %8s  %s\n", "source", "run", "fitted", "published s",
           "planned s", "error", "planned layout");
    for (int i = 0; i < n; i++) {
        const l3d_plan_layout_t *l = &rows[i].plan.layout;
        printf("%-20s %-18s %-6s %10.3f %10.3f %+7.1f%%  dp=%d tp=%d pp=%d cp=%d v=%d mb=%d "
               "zero=%d rc=%s sp=%d%s%s\n",
               rows[i].source, rows[i].name, rows[i].calibration ? "yes" : "no",
               rows[i].published_s, rows[i].predicted_s, 100 * rows[i].error, l->dp, l->tp,
               l->pp, l->cp, l->v, l->micro_batch, l->zero_stage, k_rc[l->recompute], l->sp,
               l->ends == 1 ? " ends" : "", rows[i].plan.fits ? "" : " (does not fit)");
    }
    printf("calibration rows: mean |error| %.1f%%, max %.1f%%; held-out rows: mean %.1f%%, "
           "max %.1f%%\n", 100 * cm, 100 * cx, 100 * hm, 100 * hx);
    return L3D_EXIT_OK;
}

int l3d_cmd_plan(int argc, char **argv) {
    const char *model = NULL, *gpus = NULL, *gpu = "h100-sxm", *gpn = "8", *intra = NULL,
               *inter = NULL, *seq = NULL, *batch = NULL, *layout = NULL, *top = "5",
               *as_json = NULL, *pub = NULL, *help = NULL, *config = NULL, *gthreads = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--model", "PRESET|FILE", "preset name or HF config.json (or a directory with one); "
         "default: --config's model", &model, 0},
        {"--config", "FILE", "the ds_config.json the layouts are applied to (precision, "
         "buckets, ZeRO-3 knobs; default: defaults with bf16)", &config, 0},
        {"--gpus", "N", "GPUs in all", &gpus, 0},
        {"--gpu", "TYPE", "h100-sxm (default), h200-sxm, a100-80gb, a100-40gb, gh200, or "
         "measured (this machine: its GEMM peak, memcpy bandwidth, memory)", &gpu, 0},
        {"--gpu-threads", "K", "with --gpu measured: threads per rank (default: cores / gpus)",
         &gthreads, 0},
        {"--gpus-per-node", "K", "GPUs joined by the intra-node link (default 8)", &gpn, 0},
        {"--intra", "LINK", "nvlink3, nvlink4 (default: nvlink3 for a100, else nvlink4), or "
         "files of l3d bench comm --json, comma-separated", &intra, 0},
        {"--inter", "LINK", "ib-hdr200, ib-ndr400 (default; ib-hdr200 for a100), roce-400, or "
         "bench files", &inter, 0},
        {"--seq", "T", "tokens per sequence", &seq, 0},
        {"--global-batch", "B", "sequences per optimizer step", &batch, 0},
        {"--layout", "K=V,...", "fix keys (dp, tp, pp, cp, v, mb, zero, recompute, sp, ends, "
         "tp_mode); the rest are searched", &layout, 0},
        {"--top", "K", "layouts to print (default 5)", &top, 0},
        {"--json", NULL, "a JSON list instead of the table", &as_json, 1},
        {"--published", NULL, "plan the published runs and print the model's error on them",
         &pub, 1},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    if (l3d_cli_parse("plan", argc, argv, 2, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, "plan", "--model M --gpus N --seq T --global-batch B [FLAGS]",
                      flags, nflags);
        printf("\nRanks every dp x tp x pp x cp layout (and micro-batch, chunks, ZeRO stage,\n"
               "recomputation, sequence parallelism) by step time among those that fit.\n"
               "docs/plan.md has the model and its error against published runs.\n");
        return L3D_EXIT_OK;
    }
    l3d_ctx_t *ctx = NULL;
    l3d_status st = l3d_cli_ctx_create(0, &ctx);
    if (st < 0) return l3d_cli_fail("plan", ctx, st);
    int rc = L3D_EXIT_USAGE;
    l3d_plan_result_t *res = NULL;
    l3d_train_config_t *base = NULL;
    if (pub) {
        rc = published(ctx, as_json != NULL);
        goto out;
    }
    if ((!model && !config) || !gpus || !seq || !batch) {
        fprintf(stderr, "l3d plan: --model (or --config), --gpus, --seq and --global-batch are "
                "required (or --published)\n");
        goto out;
    }
    l3d_plan_request_t req;
    l3d_plan_request_default(&req);
    if (config) {
        base = calloc(1, sizeof(*base));
        if (!base) {
            st = L3D_ERR_NOMEM;
            goto fail;
        }
        l3d_train_config_default(ctx, base);
        if ((st = l3d_train_config_from_file(ctx, config, base)) < 0) goto fail;
        req.base = base;
        req.model = base->model;
    }
    long long v;
    if (l3d_cli_int("plan", "--gpus", gpus, 1, 1 << 24, &v)) goto out;
    req.gpus = (int)v;
    if (l3d_cli_int("plan", "--gpus-per-node", gpn, 1, 1024, &v)) goto out;
    req.gpus_per_node = (int)v;
    if (l3d_cli_int("plan", "--seq", seq, 1, 1 << 24, &v)) goto out;
    req.seq_len = (int)v;
    if (l3d_cli_int("plan", "--global-batch", batch, 1, 1 << 24, &v)) goto out;
    req.global_batch = (int)v;
    long long ntop;
    if (l3d_cli_int("plan", "--top", top, 1, 1000, &ntop)) goto out;
    if (layout && parse_layout(layout, &req.fixed)) goto out;
    if (model && (st = load_model(ctx, model, &req.model)) < 0) goto fail;
    if (!strcmp(gpu, "measured")) {
        long long th = l3d_num_cores() / req.gpus;
        if (th < 1) th = 1;
        if (gthreads && l3d_cli_int("plan", "--gpu-threads", gthreads, 1, 4096, &th)) goto out;
        if ((st = measure_gpu(ctx, (int)th, &req.gpu)) < 0) goto fail;
        // More threads in all than cores: the ranks time-share them (as l3d train's thread
        // or process ranks on this machine would), each getting cores / (gpus x threads).
        double share = (double)l3d_num_cores() / ((double)req.gpus * (double)th);
        if (share < 1) {
            req.gpu.peak_flops *= share;
            req.gpu.mem_bw *= share;
            snprintf(req.gpu.name, sizeof(req.gpu.name), "measured (%lld threads, %.2f core)",
                     th, share * (double)th);
        }
    } else if ((st = l3d_plan_gpu_named(ctx, gpu, &req.gpu)) < 0) {
        goto fail;
    }
    int a100 = !strncmp(gpu, "a100", 4);
    if ((st = get_link(ctx, intra ? intra : a100 ? "nvlink3" : "nvlink4", &req.intra)) < 0 ||
        (st = get_link(ctx, inter ? inter : a100 ? "ib-hdr200" : "ib-ndr400", &req.inter)) < 0)
        goto fail;
    res = calloc((size_t)ntop, sizeof(*res));
    if (!res) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    int n = 0;
    long searched = 0;
    double t0 = now_s();
    if ((st = l3d_plan_search(ctx, &req, res, (int)ntop, &n, &searched)) < 0) goto fail;
    if (as_json) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++) json_array_append_new(arr, result_json(&req.model, &res[i]));
        char *s = json_dumps(arr, JSON_INDENT(1));
        json_decref(arr);
        if (s) printf("%s\n", s);
        rc = s ? L3D_EXIT_OK : L3D_EXIT_FAIL;
        free(s);
        goto out;
    }
    printf("%s on %d x %s (%d per node; %s inside, %s between), seq %d, global batch %d: "
           "%ld layouts in %.2f s\n", req.model.name, req.gpus, req.gpu.name, req.gpus_per_node,
           req.intra.name, req.inter.name, req.seq_len, req.global_batch, searched,
           now_s() - t0);
    print_table(res, n);
    if (!res[0].fits)
        printf("none fits in %.1f GiB per GPU (less %.1f GiB reserved): listed by memory\n",
               req.gpu.mem_bytes / GiB, req.mem_reserve / GiB);
    rc = L3D_EXIT_OK;
    goto out;
fail:
    rc = l3d_cli_fail("plan", ctx, st);
out:
    free(res);
    free(base);
    l3d_ctx_destroy(ctx);
    return rc;
}
