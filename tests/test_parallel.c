#define _GNU_SOURCE  // mkstemps
// Layout equivalence, the central proof of the parallel trainer: from the same initial
// weights and data, 20 fp32 steps on a parallel layout follow the same float64 trajectory as
// the single-rank run, as closely as any float32 run does (per-step losses and gradient norms,
// final weights; the tolerance and its derivation are above check_run).
// Ranks are threads over the in-process transport (l3d_comm_create_local), each with its own
// context and trainer, as a user embedding llama3d would run them.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "core/trainer_internal.h"
#include "llama3d/llama3d.h"

enum { STEPS = 20, MAXR = 8 };

typedef struct layout {
    int dp, tp, pp, zero, recompute, accum_total;
    double bucket;  // reduce_bucket_size (0: default, one bucket)
    float clip;
    int gpipe;      // pipeline schedule: 0 1F1B, 1 GPipe, v >= 2 interleaved with v chunks
    int sp;         // sequence parallelism
} layout_t;

// ZeRO-3's keys for the layouts run while g_z3 is set: stage3_param_persistence_threshold,
// stage3_prefetch_bucket_size (0: DeepSpeed's 5e7, -1: none), stage3_max_live_parameters (0:
// DeepSpeed's 1e9). Unset: persistence 0 (every group gathered), the other two DeepSpeed's.
typedef struct z3_knobs {
    double persist, prefetch, live;
    int gather16;  // stage3_gather_16bit_weights_on_model_save
} z3_knobs_t;
static const z3_knobs_t *g_z3;
// ZeRO offload for the layouts run while g_off is set: offload_optimizer, offload_param.
typedef struct off_knobs {
    int optim, param;
} off_knobs_t;
static const off_knobs_t *g_off;
// activation_checkpointing's partition_activations and cpu_checkpointing while g_ckpt is set.
typedef struct ckpt_knobs {
    int partition, cpu;
} ckpt_knobs_t;
static const ckpt_knobs_t *g_ckpt;
// The knob globals of one side of a resume case (NULL: unset).
typedef struct knobs {
    const z3_knobs_t *z3;
    const off_knobs_t *off;
} knobs_t;
typedef struct result result_t;
static void resume_knobs(const layout_t *from, knobs_t kf, const layout_t *to, knobs_t kt,
                         const result_t *ref, const char *dir_test);

static char g_data[64];
static const int *g_lps;  // parallel.layers_per_stage for the layouts run while it is set
static int g_layers;      // num_hidden_layers while set (else 3)
static int g_consolidated;  // train.save_consolidated
static const char *g_init_dir;  // the single-rank reference saves its initial weights there

static void make_data(void) {
    if (g_data[0]) return;
    snprintf(g_data, sizeof(g_data), "/tmp/l3d_test_parallel_XXXXXX.bin");
    int fd = mkstemps(g_data, 4);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    // A stream with structure (so the loss falls) and every id in range.
    for (int i = 0; i < 20000; i++) {
        uint32_t id = (uint32_t)((i * 31u + (i / 7) * 17u) % 251u);
        fwrite(&id, 4, 1, f);
    }
    fclose(f);
}

static void config(l3d_ctx_t *ctx, const layout_t *L, l3d_train_config_t *cfg) {
    l3d_train_config_default(ctx, cfg);
    l3d_model_config_t *m = &cfg->model;
    m->hidden_size = 64;
    m->intermediate_size = 160;
    m->num_hidden_layers = g_layers ? g_layers : 3;
    m->num_attention_heads = 4;
    m->num_key_value_heads = 2;
    m->head_dim = 16;
    snprintf(cfg->data_path, sizeof(cfg->data_path), "%s", g_data);
    cfg->seq_len = 32;
    cfg->micro_batch_size = 2;
    cfg->dp = L->dp;
    cfg->tp = L->tp;
    cfg->pp = L->pp;
    cfg->grad_accum_steps = L->accum_total / L->dp;
    cfg->train_batch_size = cfg->micro_batch_size * L->accum_total;
    cfg->zero_stage = L->zero;
    cfg->reduce_bucket_size = L->bucket;
    cfg->activation_checkpointing = L->recompute;
    snprintf(cfg->pp_schedule, sizeof(cfg->pp_schedule), "%s",
             L->gpipe >= 2 ? "interleaved" : L->gpipe ? "gpipe" : "1f1b");
    cfg->virtual_stages = L->gpipe >= 2 ? L->gpipe : 0;
    cfg->sequence_parallel = L->sp;
    if (g_lps && L->pp > 1) {
        cfg->n_layers_per_stage = L->pp;
        memcpy(cfg->layers_per_stage, g_lps, (size_t)L->pp * sizeof(int));
    }
    cfg->stage3_param_persistence_threshold = g_z3 ? g_z3->persist : 0;
    if (g_z3 && g_z3->prefetch)
        cfg->stage3_prefetch_bucket_size = g_z3->prefetch < 0 ? 0 : g_z3->prefetch;
    if (g_z3 && g_z3->live > 0) cfg->stage3_max_live_parameters = g_z3->live;
    cfg->stage3_gather_16bit_weights_on_model_save = g_z3 ? g_z3->gather16 : 0;
    cfg->offload_optimizer = g_off ? g_off->optim : 0;
    cfg->offload_param = g_off ? g_off->param : 0;
    cfg->partition_activations = g_ckpt ? g_ckpt->partition : 0;
    cfg->cpu_checkpointing = g_ckpt ? g_ckpt->cpu : 0;
    cfg->save_consolidated = g_consolidated;
    cfg->gradient_clipping = L->clip;
    cfg->lr = 1e-3f;
    cfg->weight_decay = 0.1f;
    cfg->num_threads = 1;
    cfg->seed = 7;
}

typedef struct result {
    double loss[STEPS], gnorm[STEPS];  // rank 0's per-step loss and gradient norm
    l3d_step_stats_t last;     // rank 0's last step
    l3d_comm_stats_t plan[3];  // and its predicted communication
    // every rank's final parameters (its shard) and their layout
    int nranks;
    float *params[MAXR];
    l3d_param_t *tensors[MAXR];
    int nt[MAXR];
    size_t grads_in_use[MAXR];                   // every rank's "grads" allocations
    size_t params_in_use[MAXR];                  // and "params" (rope tables included)
    int refused[MAXR];  // l3d_model_save of the trainer's model refused (ZeRO-3 partitioned)
    size_t optim_in_use[MAXR], host_in_use[MAXR][3];  // "optim"; "host_params/grads/optim"
    size_t acts_in_use[MAXR], host_acts_in_use[MAXR];  // "acts", "host_acts"
    l3d_mem_breakdown_t mem[MAXR], estimate;     // l3d_trainer_memory; rank 0's prediction
    // single-rank references only (reference_run): the float64 trajectory's final weights in
    // params[0]'s layout, losses and gradient norms, and the spread of float32 runs around it
    double *w64, loss64[STEPS], gnorm64[STEPS];
    double sigma[4];  // root-mean-square of the float32 runs' rms, max, loss and gnorm errors
    char err[256];
} result_t;

typedef struct rank_arg {
    const layout_t *L;
    const char *save_dir;    // save after step STEPS/2 (then stop)
    const char *resume_dir;  // resume from it (steps STEPS/2+1 .. STEPS)
    const char *init_dir;    // save the initial weights there before the first step
    l3d_comm_t *comm;
    result_t *res;  // rank 0 fills the losses and stats, every rank its parameters
    int r;
    int rc;
    char err[256];
} rank_arg_t;

static void *rank_main(void *p) {
    rank_arg_t *a = p;
    l3d_ctx_t *ctx;
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK) {
        a->rc = 1;
        return NULL;
    }
    l3d_train_config_t cfg;
    config(ctx, a->L, &cfg);
    l3d_trainer_t *t = NULL;
    l3d_status st = l3d_train_config_finalize(ctx, &cfg);
    if (st == L3D_OK) st = l3d_trainer_create_parallel(ctx, &cfg, a->comm, &t);
    int s0 = 0, s1 = a->save_dir ? STEPS / 2 : STEPS;
    if (st == L3D_OK && a->init_dir) st = l3d_trainer_save(t, a->init_dir);
    if (st == L3D_OK && a->resume_dir) {
        st = l3d_trainer_resume(t, a->resume_dir);
        s0 = STEPS / 2;
    }
    for (int s = s0; s < s1 && st == L3D_OK; s++) {
        l3d_step_stats_t stats;
        st = l3d_trainer_step(t, &stats);
        if (st == L3D_OK && a->res && a->r == 0) {
            a->res->loss[s] = stats.loss;
            a->res->gnorm[s] = stats.grad_norm;
            a->res->last = stats;
        }
    }
    if (st == L3D_OK && a->save_dir) st = l3d_trainer_save(t, a->save_dir);
    if (st == L3D_OK && a->res) {
        a->res->params_in_use[a->r] = l3d_ctx_mem_in_use(ctx, "params");
        // ZeRO-3 keeps a piece: the model's own entry points refuse, naming why (before
        // writing anything)
        if (a->L->zero == 3 && a->L->dp > 1)
            a->res->refused[a->r] =
                l3d_model_save(l3d_trainer_model(t), "/tmp/l3d_test_never_written") ==
                    L3D_ERR_INVALID_ARG &&
                strstr(l3d_ctx_last_error(ctx), "ZeRO-3") != NULL;
        a->res->optim_in_use[a->r] = l3d_ctx_mem_in_use(ctx, "optim");
        static const char *host[3] = {"host_params", "host_grads", "host_optim"};
        for (int h = 0; h < 3; h++) a->res->host_in_use[a->r][h] = l3d_ctx_mem_in_use(ctx, host[h]);
        a->res->acts_in_use[a->r] = l3d_ctx_mem_in_use(ctx, "acts");
        a->res->host_acts_in_use[a->r] = l3d_ctx_mem_in_use(ctx, "host_acts");
        st = l3d_zero3_materialize(t);  // ZeRO-3 keeps a 1/dp piece: the weights whole again
    }
    if (st == L3D_OK && a->res) {
        if (a->r == 0) l3d_train_config_comm(&cfg, a->res->plan);
        l3d_model_t *m = l3d_trainer_model(t);
        a->res->params[a->r] = malloc(m->n_params * sizeof(float));
        memcpy(a->res->params[a->r], m->params, m->n_params * sizeof(float));
        a->res->tensors[a->r] = malloc((size_t)m->n_tensors * sizeof(l3d_param_t));
        memcpy(a->res->tensors[a->r], m->tensors, (size_t)m->n_tensors * sizeof(l3d_param_t));
        a->res->nt[a->r] = m->n_tensors;
        a->res->grads_in_use[a->r] = l3d_ctx_mem_in_use(ctx, "grads");
        l3d_trainer_memory(t, &a->res->mem[a->r]);
        if (a->r == 0) l3d_train_config_memory(&cfg, &a->res->estimate);
    }
    if (st != L3D_OK) {
        snprintf(a->err, sizeof(a->err), "%s", l3d_ctx_last_error(ctx));
        a->rc = 1;
        l3d_comm_abort(a->comm);  // as l3d train does: the peers fail fast, naming this rank
    }
    l3d_trainer_destroy(t);
    l3d_ctx_destroy(ctx);
    return NULL;
}

// Runs every rank; fills err[r] ("" when rank r succeeded) and returns the failed ranks.
static int run_ranks(const layout_t *L, result_t *res, const char *save, const char *resume,
                     char err[][256]) {
    int n = L->dp * L->tp * L->pp, failed = 0;
    l3d_ctx_t *wctx;
    cr_assert_eq(l3d_ctx_create(NULL, &wctx), L3D_OK);
    l3d_comm_t *comms[MAXR] = {0};
    int threaded = n > 1;
    if (threaded)
        cr_assert_eq(l3d_comm_create_local(wctx, n, comms), L3D_OK, "%s",
                     l3d_ctx_last_error(wctx));
    rank_arg_t args[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg_t){.L = L, .comm = threaded ? comms[r] : NULL, .res = res, .r = r,
                               .save_dir = save, .resume_dir = resume,
                               .init_dir = g_init_dir};
        cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) l3d_comm_destroy(comms[r]);
    l3d_ctx_destroy(wctx);
    for (int r = 0; r < n; r++) {
        snprintf(err[r], 256, "%s", args[r].rc ? args[r].err : "");
        failed += args[r].rc != 0;
    }
    return failed;
}

static void run_layout_ckpt(const layout_t *L, result_t *res, const char *save,
                            const char *resume) {
    char err[MAXR][256];
    run_ranks(L, res, save, resume, err);
    for (int r = 0; r < L->dp * L->tp * L->pp; r++)
        cr_assert_eq(err[r][0], 0, "layout (%d,%d,%d) zero %d: rank %d: %s", L->dp, L->tp, L->pp,
                     L->zero, r, err[r]);
}

static void run_layout(const layout_t *L, result_t *res) { run_layout_ckpt(L, res, NULL, NULL); }

static void free_result(result_t *r) {
    for (int i = 0; i < MAXR; i++) {
        free(r->params[i]);
        free(r->tensors[i]);
    }
    free(r->w64);
}

// Distance of every rank's shard of every tensor from a trajectory in the single-rank layout
// (`w`, or ref's own fp32 weights when NULL), each element compared with its slice of the
// single-rank tensor: the root-mean-square and the max of |w_got - w|.
typedef struct wdist {
    double rms, max;
} wdist_t;

static wdist_t weights_dist(const result_t *got, const result_t *ref, const double *w) {
    double ss = 0, mx = 0;
    size_t n = 0;
    const float *R = ref->params[0];
    for (int r = 0; r < MAXR && got->params[r]; r++)
        for (int i = 0; i < got->nt[r]; i++) {
            // pipeline stages hold a subset of the tensors: match by name
            const l3d_param_t *p = &got->tensors[r][i], *q = NULL;
            for (int k = 0; k < ref->nt[0] && !q; k++)
                if (!strcmp(ref->tensors[0][k].name, p->name)) q = &ref->tensors[0][k];
            cr_assert_not_null(q, "%s is not in the single-rank model", p->name);
            size_t rows = (size_t)p->shape[0], cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
            size_t fcols = p->ndim == 2 ? (size_t)q->shape[1] : 1;
            for (size_t y = 0; y < rows; y++)
                for (size_t x = 0; x < cols; x++) {
                    size_t at = q->offset + ((size_t)p->r0 + y) * fcols + (size_t)p->c0 + x;
                    double d = fabs(got->params[r][p->offset + y * cols + x] -
                                    (w ? w[at] : (double)R[at]));
                    if (getenv("L3D_TEST_WHERE") && d > mx)
                        fprintf(stderr, "max so far: %s [%zu,%zu] diff %.3g\n", p->name,
                                (size_t)p->r0 + y, (size_t)p->c0 + x, d);
                    mx = fmax(mx, d);
                    ss += d * d;
                    n++;
                }
        }
    return (wdist_t){sqrt(ss / (double)n), mx};
}

// Max over steps s0..STEPS-1 of |x[s] - y[s]|.
static double steps_dist(const double *x, const double *y, int s0) {
    double m = 0;
    for (int s = s0; s < STEPS; s++) m = fmax(m, fabs(x[s] - y[s]));
    return m;
}

// Reads DIR/<tensor>.bin (raw float64) for every tensor of the single-rank run into its layout.
static double *read_trajectory(const result_t *ref, const char *dir) {
    size_t n = 0;
    for (int i = 0; i < ref->nt[0]; i++)
        n = ref->tensors[0][i].offset + ref->tensors[0][i].numel > n
                ? ref->tensors[0][i].offset + ref->tensors[0][i].numel : n;
    double *w = calloc(n, sizeof(double));
    cr_assert_not_null(w);
    for (int i = 0; i < ref->nt[0]; i++) {
        const l3d_param_t *q = &ref->tensors[0][i];
        char path[512];
        snprintf(path, sizeof(path), "%s/%s.bin", dir, q->name);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s is missing", path);
        cr_assert_eq(fread(w + q->offset, sizeof(double), q->numel, f), q->numel, "%s", path);
        fclose(f);
    }
    return w;
}

// A single-rank reference run, then the same run (same initial weights, data and
// hyper-parameters, mirrored from config()) by tests/reference/f64_train.py: its float64
// trajectory, and torch's float32 run of it. This run and torch's are two float32
// realizations of the float64 trajectory by different code (GEMM kernels, attention,
// reductions); sigma[] is the root-mean-square of their errors (see check_run).
enum { T_BOUND = 10 };  // see check_run

static void reference_run(const layout_t *one, result_t *ref) {
    char dir[] = "/tmp/l3d_test_parallel_f64_XXXXXX", init[64], ds[64], sub[64], cmd[1024];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(init, sizeof(init), "%s/init", dir);
    snprintf(ds, sizeof(ds), "%s/ds.json", dir);
    g_init_dir = init;
    run_layout(one, ref);
    g_init_dir = NULL;
    FILE *f = fopen(ds, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": 2,"
            " \"gradient_accumulation_steps\": %d, \"gradient_clipping\": %.9g,"
            " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3,"
            " \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.1}},"
            " \"data\": {\"path\": \"%s\", \"seq_len\": 32}}\n",
            2 * one->accum_total, one->accum_total, (double)one->clip, g_data);
    cr_assert_eq(fclose(f), 0);
    // The references depend on nothing the build or the kernels change: builds may share them
    // (tests/kernels.sh points every build of a CI run at one cache).
    const char *cache = getenv("L3D_TEST_F64_CACHE");
    snprintf(cmd, sizeof(cmd), "%s %s/reference/f64_train.py %s %s %d %s %s%s",
             L3D_TORCH_PYTHON, L3D_TEST_SRC, init, ds, STEPS, dir,
             cache ? cache : L3D_BIN_DIR, cache ? "" : "/tests/f64-cache");
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    snprintf(sub, sizeof(sub), "%s/f64", dir);
    ref->w64 = read_trajectory(ref, sub);
    snprintf(sub, sizeof(sub), "%s/f64/steps.bin", dir);
    double steps[2 * STEPS];
    f = fopen(sub, "rb");
    cr_assert(f && fread(steps, sizeof(double), 2 * STEPS, f) == 2 * STEPS, "%s", sub);
    fclose(f);
    for (int s = 0; s < STEPS; s++) ref->loss64[s] = steps[2 * s], ref->gnorm64[s] = steps[2 * s + 1];
    // this run's own errors, then torch's
    wdist_t e = weights_dist(ref, ref, ref->w64);
    double e1[4] = {e.rms, e.max, steps_dist(ref->loss, ref->loss64, 0),
                    steps_dist(ref->gnorm, ref->gnorm64, 0)};
    snprintf(sub, sizeof(sub), "%s/f32.txt", dir);
    f = fopen(sub, "r");
    double et[4];
    cr_assert(f && fscanf(f, "%lf %lf %lf %lf", &et[0], &et[1], &et[2], &et[3]) == 4, "%s", sub);
    fclose(f);
    // This run must itself pass check_run's test against torch's: a config() that the mirror
    // above no longer matches fails here instead of widening the tolerance.
    for (int k = 0; k < 4; k++) {
        cr_assert(e1[k] <= T_BOUND * et[k], "single-rank run: error %.3g is %.1f times torch "
                  "float32's (%s: does config() match reference_run's JSON?)", e1[k],
                  e1[k] / et[k], k < 2 ? "weights" : k == 2 ? "loss" : "grad norm");
        ref->sigma[k] = sqrt((e1[k] * e1[k] + et[k] * et[k]) / 2);
    }
    if (getenv("L3D_TEST_SIGMA"))
        fprintf(stderr, "REF %d tensors: l3d/torch errors %.2f %.2f %.2f %.2f\n", ref->nt[0],
                e1[0] / et[0], e1[1] / et[1], e1[2] / et[2], e1[3] / et[3]);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

// The tolerance. A float32 run of any layout is the float64 trajectory plus rounding errors
// amplified by the training dynamics (AdamW divides by sqrt(v), so elements with gradients
// near zero turn small gradient errors into large update errors). The size of that error is a
// property of the trajectory, the precision and the machine's kernels, not of one
// implementation: l3d's single-rank run and torch's float32 run, which share no kernel, land
// at 0.2-3.4 times each other's distance from the float64 run across this test's references
// on Haswell and Sandybridge kernels. A layout only reorders l3d's float32 sums (a K-sum split
// over tp, micro-batches over dp), which has the same error bound as the serial sum, so its
// distance from the float64 run is an error of the same size: each of the four measures
// (weights rms and max, loss and gradient norm over the steps) must stay within T_BOUND sigma.
// Measured on AMD Zen with Haswell and Sandybridge kernels: at most 2.9 sigma (tp 2 over 8
// layers), every other layout under 1.4. A fault is far outside: a 1e-4 relative lr error on dp 2
// ranks scores 36 sigma on the weights and 318 on the loss, and a fault that only scales a
// gradient before its norm is taken (a missing 1/dp, a replica counted twice: nearly invisible
// in AdamW's weights) moves the gradient norm by that scale.
// Steps from s0 on (a resumed run) and the final weights of `got` against the float64
// trajectory of `ref`.
static void check_run(const char *name, const result_t *got, const result_t *ref, int s0) {
    wdist_t w = weights_dist(got, ref, ref->w64);
    double e[4] = {w.rms, w.max, steps_dist(got->loss, ref->loss64, s0),
                   steps_dist(got->gnorm, ref->gnorm64, s0)};
    static const char *what[4] = {"weights rms", "weights max", "loss", "grad norm"};
    for (int k = 0; k < 4; k++)
        cr_expect(e[k] <= T_BOUND * ref->sigma[k], "%s: %s error %.3g against float64 is %.1f "
                  "sigma (sigma %.3g over float32 runs; bound %d)", name, what[k], e[k],
                  e[k] / ref->sigma[k], ref->sigma[k], T_BOUND);
    cr_log_info("%s: errors/sigma weights rms %.2f max %.2f, loss %.2f, grad norm %.2f", name,
                e[0] / ref->sigma[0], e[1] / ref->sigma[1], e[2] / ref->sigma[2],
                e[3] / ref->sigma[3]);
    if (getenv("L3D_TEST_SIGMA"))
        fprintf(stderr, "SIGMA %s: %.2f %.2f %.2f %.2f\n", name, e[0] / ref->sigma[0],
                e[1] / ref->sigma[1], e[2] / ref->sigma[2], e[3] / ref->sigma[3]);
}

static result_t g_ref;

static void reference(void) {
    if (g_ref.params[0]) return;
    make_data();
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    reference_run(&one, &g_ref);
}

static void compare_to(const layout_t *L, const result_t *ref);
static void compare_keep(const layout_t *L, const result_t *ref, result_t *keep);
static void compare(const layout_t *L) {
    reference();
    compare_to(L, &g_ref);
}

static void compare_to(const layout_t *L, const result_t *ref) { compare_keep(L, ref, NULL); }

// compare_to, handing the run's result to *keep (NULL: freed).
static void compare_keep(const layout_t *L, const result_t *ref, result_t *keep) {
    result_t got = {0};
    run_layout(L, &got);
    char name[160];
    int n = snprintf(name, sizeof(name), "(dp %d, tp %d, pp %d) zero %d recompute %d bucket %g"
                     "%s%s%s", L->dp, L->tp, L->pp, L->zero, L->recompute, L->bucket,
                     L->gpipe == 1 ? " gpipe" : "", L->gpipe >= 2 ? " interleaved" : "",
                     L->sp ? " sp" : "");
    if (L->zero == 3 && g_z3)
        snprintf(name + n, sizeof(name) - (size_t)n, " persist %g prefetch %g live %g",
                 g_z3->persist, g_z3->prefetch, g_z3->live);
    cr_assert(ref->loss[STEPS - 1] < ref->loss[0] - 0.1, "the reference run does not learn");
    check_run(name, &got, ref, 0);
    // The counted communication of a step equals the analytic prediction, per group.
    static const char *gname[3] = {"tp", "dp", "pp"};
    for (int g = 0; g < 3; g++) {
        cr_expect_eq(got.last.comm_calls[g], got.plan[g].calls, "%s: %s calls %llu, predicted %llu",
                     name, gname[g], (unsigned long long)got.last.comm_calls[g],
                     (unsigned long long)got.plan[g].calls);
        cr_expect_eq(got.last.comm_bytes[g], got.plan[g].bytes, "%s: %s bytes %llu, predicted %llu",
                     name, gname[g], (unsigned long long)got.last.comm_bytes[g],
                     (unsigned long long)got.plan[g].bytes);
    }
    // The memory estimate printed before training describes world rank 0 exactly.
    cr_expect_eq(got.estimate.params, got.mem[0].params, "%s: params", name);
    cr_expect_eq(got.estimate.host_params, got.mem[0].host_params, "%s: host params", name);
    cr_expect_eq(got.estimate.host_grads, got.mem[0].host_grads, "%s: host grads", name);
    cr_expect_eq(got.estimate.host_optim, got.mem[0].host_optim, "%s: host optim", name);
    cr_expect_eq(got.estimate.host_acts, got.mem[0].host_acts, "%s: host acts", name);
    cr_expect_eq(got.estimate.grads, got.mem[0].grads, "%s: grads", name);
    cr_expect_eq(got.estimate.optim, got.mem[0].optim, "%s: optim", name);
    cr_expect_eq(got.estimate.acts, got.mem[0].acts, "%s: acts %zu, estimated %zu", name,
                 got.mem[0].acts, got.estimate.acts);
    cr_assert(L->tp == 1 || got.last.comm_bytes[0] > 0, "%s: no tp traffic counted", name);
    cr_assert(L->dp == 1 || got.last.comm_bytes[1] > 0, "%s: no dp traffic counted", name);
    cr_log_info("%s: bytes tp %llu dp %llu", name, (unsigned long long)got.last.comm_bytes[0],
                (unsigned long long)got.last.comm_bytes[1]);
    if (keep) *keep = got;
    else free_result(&got);
}

// The layouts this build trains; tp and pp join as they are built.
static layout_t k_layouts[] = {
    {2, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0},     {2, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0},
    {4, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0},     {4, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0},
    {2, 1, 1, 1, 1, 8, 0, 0.25f, 0, 0},     {2, 1, 1, 2, 0, 8, 0, 0.25f, 0, 0},
    {4, 1, 1, 1, 0, 8, 3000, 0.25f, 0, 0},  {2, 1, 1, 0, 1, 8, 777, 0.25f, 0, 0},
    {8, 1, 1, 1, 0, 8, 5000, 0.25f, 0, 0},
    // ZeRO-2: gradients sharded, reduced every micro-batch through windows; bucket 777 puts
    // every group in a bucket of its own, 3000 merges some; tied embedding over two stages
    {4, 1, 1, 2, 0, 8, 3000, 0.25f, 0, 0},  {8, 1, 1, 2, 0, 8, 777, 0.25f, 0, 0},
    {2, 4, 1, 2, 1, 8, 0, 0.25f, 0, 0},     {2, 1, 2, 2, 0, 8, 0, 0.25f, 0, 0},
    {2, 2, 2, 2, 1, 8, 3000, 0.25f, 0, 0},  {2, 2, 1, 2, 0, 8, 0, 0.25f, 0, 1},
    {2, 2, 2, 2, 0, 8, 777, 0.25f, 1, 1},
    // tensor parallelism: heads, ffn and vocabulary split; tp 4 > 2 kv heads replicates them
    {1, 2, 1, 0, 0, 8, 0, 0.25f, 0, 0},     {1, 2, 1, 0, 1, 8, 0, 0.25f, 0, 0},
    {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0},     {2, 2, 1, 0, 0, 8, 0, 0.25f, 0, 0},
    {2, 2, 1, 1, 0, 8, 2000, 0.25f, 0, 0},  {2, 4, 1, 1, 1, 8, 0, 0.25f, 0, 0},
    // pipeline parallelism (1F1B unless noted): 3 layers over 2 and 3 stages, tied embedding
    // split between the first and last stage
    {1, 1, 2, 0, 0, 8, 0, 0.25f, 0, 0},     {1, 1, 3, 0, 0, 8, 0, 0.25f, 0, 0},
    {2, 1, 2, 1, 0, 8, 0, 0.25f, 0, 0},     {1, 2, 2, 0, 1, 8, 0, 0.25f, 0, 0},
    {2, 2, 2, 0, 0, 8, 0, 0.25f, 0, 0},     {2, 2, 2, 1, 1, 8, 3000, 0.25f, 0, 0},
    {1, 1, 2, 0, 0, 8, 0, 0.25f, 1, 0},  {1, 2, 2, 1, 0, 8, 0, 0.25f, 1, 0},
    {1, 4, 2, 0, 0, 8, 0, 0.25f, 1, 0},
    // sequence parallelism: norms and the residual stream split by rows over tp
    {1, 2, 1, 0, 0, 8, 0, 0.25f, 0, 1},  {1, 4, 1, 0, 1, 8, 0, 0.25f, 0, 1},
    {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 1},  {1, 2, 2, 0, 0, 8, 0, 0.25f, 0, 1},
    {2, 2, 2, 1, 1, 8, 3000, 0.25f, 0, 1}, {1, 2, 3, 0, 0, 8, 0, 0.25f, 1, 1},
    // ZeRO-3 with every group gathered (persistence 0) and DeepSpeed's prefetch: tp with
    // recompute, pp (a tied embedding over two stages), GPipe with SP, three stages with
    // recompute; zero3_knobs varies the keys
    {2, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0},     {2, 2, 1, 3, 1, 8, 0, 0.25f, 0, 0},
    {2, 1, 2, 3, 0, 8, 0, 0.25f, 0, 0},     {2, 2, 2, 3, 0, 8, 0, 0.25f, 1, 1},
    {2, 1, 3, 3, 1, 8, 0, 0.25f, 0, 0},
};

ParameterizedTestParameters(parallel, layout_equivalence) {
    return cr_make_param_array(layout_t, k_layouts, sizeof(k_layouts) / sizeof(k_layouts[0]));
}
ParameterizedTest(layout_t *L, parallel, layout_equivalence, .timeout = 240) { compare(L); }

// ZeRO-3's keys (embedding 16896 floats, a layer 43136, a norm 64): the norm persistent and
// nothing gathered ahead; embedding and norm persistent and one layer ahead; at most two
// layers live with everything ahead allowed; every group persistent (ZeRO-2 with the whole
// parameters updated by gathers); dp 8 with one layer ahead.
Test(parallel, zero3_knobs, .timeout = 240) {
    static const struct {
        layout_t L;
        z3_knobs_t k;
    } cases[] = {
        {{4, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, {100, -1, 0, 0}},
        {{2, 2, 1, 3, 0, 8, 0, 0.25f, 0, 1}, {20000, 50000, 0, 0}},
        {{4, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, {0, 1e9, 100000, 0}},
        {{2, 1, 2, 3, 0, 8, 0, 0.25f, 1, 0}, {1e9, 0, 0, 0}},
        {{8, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, {0, 50000, 0, 0}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        g_z3 = &cases[i].k;
        compare(&cases[i].L);
    }
    // stage3_gather_16bit_weights_on_model_save: a ZeRO-3 save is one model directory (no
    // per-rank shards), from which one rank resumes the run.
    static const z3_knobs_t gather = {0, 0, 0, 1};
    layout_t z3 = {2, 2, 1, 3, 0, 8, 0, 0.25f, 0, 0}, one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    resume_knobs(&z3, (knobs_t){&gather, NULL}, &one, (knobs_t){NULL, NULL}, &g_ref,
                 "test -f %s/model.safetensors -a ! -e %s/shards.json");
}

// ZeRO offload: the optimizer state, its master pieces and the AdamW step on the host (the
// update on host copies, then copied back), and with ZeRO-3 the parameter shard in host memory
// too; every sharding stage, unsharded (dp 1), with tp, pp, SP and recompute. Each reproduces
// the single-rank run; what is allocated where equals the report and its estimate: no device
// optimizer state, the shard's master (or, offload_param, the shard itself), the gradient
// pieces and both moments in host memory. Checkpoints move to and from offloaded layouts.
Test(parallel, offload, .timeout = 240) {
    static const off_knobs_t opt = {1, 0}, both = {1, 1};
    static const struct {
        layout_t L;
        const off_knobs_t *k;
    } cases[] = {
        {{1, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0}, &opt},  {{2, 1, 1, 1, 0, 8, 3000, 0.25f, 0, 0}, &opt},
        {{2, 2, 1, 2, 1, 8, 0, 0.25f, 0, 1}, &opt},  {{4, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, &opt},
        {{2, 1, 2, 3, 0, 8, 0, 0.25f, 0, 0}, &both}, {{2, 2, 2, 3, 1, 8, 0, 0.25f, 1, 1}, &both},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const layout_t *L = &cases[i].L;
        g_off = cases[i].k;
        reference();
        result_t got = {0};
        compare_keep(L, &g_ref, &got);
        int n = L->dp * L->tp * L->pp;
        for (int r = 0; r < n; r++) {
            const l3d_mem_breakdown_t *mr = &got.mem[r];
            cr_expect_eq(got.optim_in_use[r], 0, "case %zu rank %d: device optimizer state", i, r);
            cr_expect_eq(got.host_in_use[r][0], mr->host_params, "case %zu rank %d", i, r);
            cr_expect_eq(got.host_in_use[r][1], mr->host_grads, "case %zu rank %d", i, r);
            cr_expect_eq(got.host_in_use[r][2], mr->host_optim, "case %zu rank %d", i, r);
            // one float per element of this rank's pieces: the master (or the parameter shard)
            // and the gradient pieces, two moments; ZeRO-2/3 accumulate the gradient shard on
            // the host, through a staging buffer of one piece
            size_t shard = mr->host_params;
            int staged = L->dp > 1 && L->zero >= 2;
            cr_expect_eq(mr->host_optim, 2 * shard, "case %zu rank %d", i, r);
            cr_expect(staged ? mr->host_grads > shard : mr->host_grads == shard,
                      "case %zu rank %d: host gradients %zu, shard %zu", i, r, mr->host_grads,
                      shard);
            cr_expect(shard > 0 && mr->optim == 0, "case %zu rank %d", i, r);
        }
        free_result(&got);
    }
    layout_t z3 = {2, 1, 2, 3, 0, 8, 0, 0.25f, 0, 0}, z1 = {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 0};
    g_off = NULL;
    resume_knobs(&z3, (knobs_t){NULL, &both}, &z1, (knobs_t){NULL, NULL}, &g_ref, NULL);
    resume_knobs(&z1, (knobs_t){NULL, NULL}, &z3, (knobs_t){NULL, &opt}, &g_ref, NULL);
}

// activation_checkpointing's partition_activations (each saved layer input keeps 1/tp of its
// rows, all-gathered for the rebuild) and cpu_checkpointing (the saved inputs in host
// memory): with tp 2 and 4 (replicated kv heads), pp, SP (where partitioning has nothing left
// to split), ZeRO-3, one rank. Each reproduces the single-rank run with the tp traffic the
// plan predicts (one all-gather per layer more); the allocations equal the report; the saved
// inputs shrink by tp, and move to host memory with cpu_checkpointing, for the price of two
// working inputs on the device (a saving from about 5 layers per stage at tp 2).
Test(parallel, checkpoint_options, .timeout = 240) {
    static const ckpt_knobs_t part = {1, 0}, cpu = {0, 1}, both = {1, 1};
    static const struct {
        layout_t L;
        const ckpt_knobs_t *k;
    } cases[] = {
        {{1, 2, 1, 0, 1, 8, 0, 0.25f, 0, 0}, &part}, {{2, 4, 1, 1, 1, 8, 0, 0.25f, 0, 0}, &part},
        {{1, 2, 2, 0, 1, 8, 0, 0.25f, 0, 0}, &both}, {{1, 1, 1, 0, 1, 8, 0, 0.25f, 0, 0}, &cpu},
        {{1, 2, 1, 0, 1, 8, 0, 0.25f, 0, 1}, &both}, {{2, 2, 1, 3, 1, 8, 0, 0.25f, 1, 0}, &both},
    };
    reference();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const layout_t *L = &cases[i].L;
        result_t plain = {0}, got = {0};
        g_ckpt = NULL;
        run_layout(L, &plain);
        g_ckpt = cases[i].k;
        compare_keep(L, &g_ref, &got);
        g_ckpt = NULL;
        int n = L->dp * L->tp * L->pp, split = cases[i].k->partition && L->tp > 1 && !L->sp;
        for (int r = 0; r < n; r++) {
            const l3d_mem_breakdown_t *mr = &got.mem[r];
            // (the "acts" tag also counts the activation structs: the same in both runs)
            cr_expect_eq(got.acts_in_use[r] - mr->acts, plain.acts_in_use[r] - plain.mem[r].acts,
                         "case %zu rank %d", i, r);
            cr_expect_eq(got.host_acts_in_use[r], mr->host_acts, "case %zu rank %d", i, r);
            cr_expect(cases[i].k->cpu ? mr->host_acts > 0 : mr->host_acts == 0, "case %zu rank %d",
                      i, r);
        }
        if (L->pp == 1) {
            // One activation set of 3 layers, N = 2 x 32 rows of 64: plain recompute keeps each
            // layer's whole input (N x 64 floats) on the device; the options keep this rank's
            // rows of it (1/tp when split, or with SP) on the device or the host, and add the
            // two working inputs the layers pass through.
            size_t f = sizeof(float), NC = 64 * 64 * f, rows = NC / (size_t)(split || L->sp ? L->tp : 1);
            size_t dev = plain.mem[0].acts - 3 * NC + 2 * NC + (cases[i].k->cpu ? 0 : 3 * rows);
            cr_expect_eq(got.mem[0].acts, dev, "case %zu: device %zu, expected %zu", i,
                         got.mem[0].acts, dev);
            cr_expect_eq(got.mem[0].host_acts, cases[i].k->cpu ? 3 * rows : 0, "case %zu", i);
        }
        free_result(&plain);
        free_result(&got);
    }
}

// Shapes that do not split are refused naming the dimension; the vocabulary splits unevenly.
Test(parallel, tp_shape_errors) {
    make_data();
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    layout_t L = {1, 1, 1, 0, 0, 8, 0, 0, 0, 0};
    l3d_train_config_t cfg;
    config(ctx, &L, &cfg);
    l3d_model_config_t m = cfg.model;  // 4 heads, 2 kv heads, ffn 160, vocab 264
    cr_assert_eq(l3d_tp_check(ctx, &m, 3), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "num_attention_heads 4"), "%s",
              l3d_ctx_last_error(ctx));
    m.num_attention_heads = 6;
    cr_assert_eq(l3d_tp_check(ctx, &m, 3), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "num_key_value_heads 2"), "%s",
              l3d_ctx_last_error(ctx));
    m = cfg.model;
    m.intermediate_size = 162;
    cr_assert_eq(l3d_tp_check(ctx, &m, 4), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "intermediate_size 162"), "%s",
              l3d_ctx_last_error(ctx));
    m = cfg.model;
    m.vocab_size = 263;  // 263 = 66 + 66 + 66 + 65 rows: no padding needed
    cr_assert_eq(l3d_tp_check(ctx, &m, 4), L3D_OK);
    size_t total = 0;
    for (int r = 0; r < 4; r++) total += l3d_model_arena_floats_tp(&m, 4, r);
    cr_assert(total > l3d_model_arena_floats(&m), "shards hold at least the model");
    l3d_ctx_destroy(ctx);
}

// The world must have exactly dp*tp*pp ranks; the error shows the product and the world.
Test(parallel, world_size_mismatch) {
    make_data();
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    layout_t L = {2, 1, 1, 0, 0, 8, 0, 0, 0, 0};
    l3d_train_config_t cfg;
    config(ctx, &L, &cfg);
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    l3d_trainer_t *t = NULL;
    cr_assert_eq(l3d_trainer_create_parallel(ctx, &cfg, NULL, &t), L3D_ERR_CONFIG);
    const char *e = l3d_ctx_last_error(ctx);
    cr_assert(strstr(e, "dp 2 x tp 1 x pp 1 = 2 ranks") && strstr(e, "the world has 1"), "%s", e);
    l3d_ctx_destroy(ctx);
}

// Checkpoints across layouts: save at step 10 on one layout, resume on others; steps 11..20
// continue as in the uninterrupted single-rank run (the checkpoint holds the single-rank
// layout, ZeRO shards gathered).
// Saves at step STEPS/2 on `from` under knobs kf, checks the saved directory with the shell
// test `dir_test` (%s: the directory; NULL: none), resumes on `to` under kt.
static void resume_knobs(const layout_t *from, knobs_t kf, const layout_t *to, knobs_t kt,
                         const result_t *ref, const char *dir_test) {
    char dir[] = "/tmp/l3d_test_parallel_ckpt_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char ck[128], cmd[512];
    snprintf(ck, sizeof(ck), "%s/ck", dir);
    result_t a = {0}, b = {0};
    g_z3 = kf.z3, g_off = kf.off;
    run_layout_ckpt(from, &a, ck, NULL);
    if (dir_test) {
        snprintf(cmd, sizeof(cmd), dir_test, ck, ck);
        cr_assert_eq(system(cmd), 0, "the saved directory fails: %s", cmd);
    }
    g_z3 = kt.z3, g_off = kt.off;
    run_layout_ckpt(to, &b, NULL, ck);
    g_z3 = NULL, g_off = NULL;
    char name[128];
    snprintf(name, sizeof(name), "(%d,%d,%d) zero %d%s -> (%d,%d,%d) zero %d%s", from->dp,
             from->tp, from->pp, from->zero, kf.off ? " offload" : "", to->dp, to->tp, to->pp,
             to->zero, kt.off ? " offload" : "");
    check_run(name, &b, ref, STEPS / 2);
    free_result(&a);
    free_result(&b);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static void resume_case_to(const layout_t *from, const layout_t *to, const result_t *ref) {
    resume_knobs(from, (knobs_t){NULL, NULL}, to, (knobs_t){NULL, NULL}, ref, NULL);
}

static void resume_case(const layout_t *from, const layout_t *to) {
    reference();
    resume_case_to(from, to, &g_ref);
}

Test(parallel, resume_across_layouts, .timeout = 240) {
    layout_t z1x4 = {4, 1, 1, 1, 0, 8, 3000, 0.25f, 0, 0}, one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t z1x2 = {2, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0}, z0x2 = {2, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    resume_case(&z1x4, &one);   // sharded -> single rank
    resume_case(&one, &z1x2);   // single rank -> sharded
    resume_case(&z1x2, &z0x2);  // sharded -> replicated
}

// Tensor-parallel shards are gathered into the single-rank layout and re-sliced on resume.
Test(parallel, resume_across_tp_layouts, .timeout = 240) {
    layout_t d2t2 = {2, 2, 1, 1, 0, 8, 2000, 0.25f, 0, 0}, t4 = {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, d2t4 = {2, 4, 1, 1, 1, 8, 0, 0.25f, 0, 0};
    resume_case(&d2t2, &t4);    // (2,2,1) ZeRO-1 -> (1,4,1)
    resume_case(&d2t2, &one);   // -> (1,1,1)
    resume_case(&t4, &d2t4);    // (1,4,1) -> (2,4,1) ZeRO-1 with recompute
}

// The issue's resharding case: save at step 10 on (2,2,2), resume on (1,4,2) and (1,1,1).
Test(parallel, resume_across_pipeline_layouts, .timeout = 240) {
    layout_t d2t2p2 = {2, 2, 2, 1, 0, 8, 0, 0.25f, 0, 0}, t4p2 = {1, 4, 2, 0, 0, 8, 0, 0.25f, 1, 0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, p3 = {1, 1, 3, 0, 1, 8, 0, 0.25f, 0, 0};
    resume_case(&d2t2p2, &t4p2);  // (2,2,2) ZeRO-1 -> (1,4,2) GPipe
    resume_case(&d2t2p2, &one);   // -> (1,1,1)
    resume_case(&one, &p3);       // (1,1,1) -> (1,1,3) with recompute
    layout_t z2 = {2, 2, 2, 2, 0, 8, 3000, 0.25f, 0, 0}, z2x4 = {4, 1, 1, 2, 0, 8, 777, 0.25f, 0, 0};
    resume_case(&z2, &one);       // ZeRO-2 (2,2,2) -> (1,1,1)
    resume_case(&d2t2p2, &z2x4);  // ZeRO-1 (2,2,2) -> ZeRO-2 (4,1,1)
    layout_t z3 = {2, 2, 2, 3, 0, 8, 0, 0.25f, 0, 0}, z3x4 = {4, 1, 1, 3, 1, 8, 0, 0.25f, 0, 0};
    resume_case(&z3, &z3x4);      // ZeRO-3 (2,2,2) -> ZeRO-3 (4,1,1) with recompute
    resume_case(&z3x4, &d2t2p2);  // ZeRO-3 (4,1,1) -> ZeRO-1 (2,2,2)
    resume_case(&one, &z3);       // (1,1,1) -> ZeRO-3 (2,2,2)
}

// ZeRO-2 holds the gradient as a 1/dp shard plus two windows of the longest bucket instead of
// the whole arena (and, with a tied head on the embedding's stage, which fills the embedding's
// bucket from the start of the backward, a window of that bucket's size): the allocations say
// so, and the estimate printed before training agrees.
Test(parallel, zero2_memory) {
    make_data();
    layout_t z1 = {4, 1, 1, 1, 0, 8, 3000, 0.25f, 0, 0}, z2 = z1;
    z2.zero = 2;
    result_t r1 = {0}, r2 = {0};
    run_layout(&z1, &r1);
    run_layout(&z2, &r2);
    size_t P = r1.mem[0].params / sizeof(float), f = sizeof(float);
    size_t layer = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64;  // the longest bucket
    size_t embed = 264 * 64;                                            // vocabulary x hidden
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(r1.grads_in_use[r], r1.mem[r].grads);
        cr_assert_geq(r1.mem[r].grads, P * f);
        cr_assert_eq(r2.grads_in_use[r], r2.mem[r].grads, "rank %d: %zu in use, %zu reported",
                     r, r2.grads_in_use[r], r2.mem[r].grads);
        size_t shard = r2.mem[r].optim / 2 / f;
        cr_assert_leq(shard, P / 4 + 4 * 8, "rank %d: shard %zu of %zu", r, shard, P);
        cr_assert_eq(r2.mem[r].grads, (shard + 2 * layer + embed) * f, "rank %d: %zu", r,
                     r2.mem[r].grads);
    }
    cr_assert_eq(r2.estimate.grads, r2.mem[0].grads);
    cr_assert_eq(r2.estimate.optim, r2.mem[0].optim);
    cr_assert_eq(r1.estimate.grads, r1.mem[0].grads);
    // Three layers are mostly windows; at 16 layers the shard and windows are < 1/2 of P.
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    config(ctx, &z2, &cfg);
    cfg.model.num_hidden_layers = 16;
    l3d_mem_breakdown_t e1, e2;
    l3d_train_config_memory(&cfg, &e2);
    cfg.zero_stage = 1;
    l3d_train_config_memory(&cfg, &e1);
    cr_assert_lt(2 * e2.grads, e1.grads, "ZeRO-2 %zu vs ZeRO-1 %zu bytes", e2.grads, e1.grads);
    // One bucket holding every layer (DeepSpeed's 5e8 default on a small model) overlaps with
    // nothing and needs one window, not two: shard + the layers' bucket + the embedding's.
    cfg.zero_stage = 2;
    cfg.reduce_bucket_size = 5e8;
    l3d_mem_breakdown_t e3;
    l3d_train_config_memory(&cfg, &e3);
    size_t P16 = e3.params / f, shard16 = e3.optim / 2 / f;
    cr_assert_leq(e3.grads, (shard16 + P16 + 2 * 4) * f, "one bucket: %zu bytes, P %zu floats",
                  e3.grads, P16);
    l3d_ctx_destroy(ctx);
    free_result(&r1);
    free_result(&r2);
}

// ZeRO-3 keeps this rank's 1/dp piece of every group, the persistent groups whole and a pool
// of the largest group plus what is gathered ahead -- not the parameters (ZeRO-2 keeps them
// whole): the allocations say so (the rope tables are the rest of "params" in both) and the
// estimate printed before training agrees.
Test(parallel, zero3_memory) {
    make_data();
    layout_t z2 = {4, 1, 1, 2, 0, 8, 0, 0.25f, 0, 0}, z3 = z2;
    z3.zero = 3;
    static const z3_knobs_t none_ahead = {100, -1, 0, 0};  // the norm persistent
    result_t r2 = {0}, r3 = {0};
    run_layout(&z2, &r2);
    g_z3 = &none_ahead;
    run_layout(&z3, &r3);
    g_z3 = NULL;
    size_t P = r2.mem[0].params / sizeof(float), f = sizeof(float);
    size_t layer = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64, norm = 64;
    for (int r = 0; r < 4; r++) {
        size_t rope = r2.params_in_use[r] - r2.mem[r].params;
        cr_assert_eq(r3.params_in_use[r] - rope, r3.mem[r].params, "rank %d: %zu in use, %zu "
                     "reported", r, r3.params_in_use[r] - rope, r3.mem[r].params);
        size_t shard = r3.mem[r].optim / 2 / f;
        cr_assert_leq(shard, P / 4 + 5 * 4, "rank %d: shard %zu of %zu", r, shard, P);
        cr_assert_eq(r3.mem[r].params, (shard + norm + layer) * f, "rank %d: %zu", r,
                     r3.mem[r].params);
        cr_assert(r3.refused[r], "rank %d: l3d_model_save of a partitioned model is refused", r);
    }
    cr_assert_eq(r3.estimate.params, r3.mem[0].params);
    // At 16 layers with one layer gathered ahead (nothing persistent): the shard and two
    // layers, under half of ZeRO-2's whole parameters.
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    config(ctx, &z3, &cfg);
    cfg.model.num_hidden_layers = 16;
    cfg.stage3_prefetch_bucket_size = (double)layer;
    l3d_mem_breakdown_t e2, e3;
    l3d_train_config_memory(&cfg, &e3);
    cfg.zero_stage = 2;
    l3d_train_config_memory(&cfg, &e2);
    cr_assert_eq(e3.params, (e3.optim / 2 / f + 2 * layer) * f, "16 layers: %zu",
                 e3.params);
    cr_assert_lt(2 * e3.params, e2.params, "ZeRO-3 %zu vs ZeRO-2 %zu bytes", e3.params,
                 e2.params);
    l3d_ctx_destroy(ctx);
    free_result(&r2);
    free_result(&r3);
}

// Parallel runs save sharded checkpoints: one file per rank, each element written once;
// train.save_consolidated writes the single-rank layout instead; a single-rank model reads
// either, bitwise alike; a missing or truncated shard and an unwritable target fail every
// rank, naming the file, without hanging and without touching an older checkpoint.
static size_t count_elements(const char *dir, const char *suffix) {
    size_t n = 0;
    char path[256];
    for (int r = 0; r < 8; r++) {
        snprintf(path, sizeof(path), "%s/shard-%05d-of-00008.safetensors", dir, r);
        l3d_ctx_t *ctx;
        cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
        l3d_st_file_t *f;
        cr_assert_eq(l3d_st_open(ctx, path, &f), L3D_OK, "%s", l3d_ctx_last_error(ctx));
        for (size_t i = 0; i < l3d_st_count(f); i++) {
            const l3d_st_tensor_t *e = l3d_st_at(f, i);
            char want[64];
            const char *at = strrchr(e->name, '@');
            snprintf(want, sizeof(want), "%s@", suffix);
            size_t wl = strlen(want);
            int match = suffix[0] ? (size_t)(at - e->name) + 1 >= wl &&
                                        !strncmp(at + 1 - wl, want, wl)
                                  : !strstr(e->name, ".exp_avg");
            if (match) n += (size_t)(e->end - e->begin) / sizeof(float);
        }
        l3d_st_close(f);
        l3d_ctx_destroy(ctx);
    }
    return n;
}

Test(parallel, sharded_checkpoints, .timeout = 120) {
    reference();
    char dir[] = "/tmp/l3d_test_sharded_XXXXXX", a[64], b[64], cmd[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(a, sizeof(a), "%s/sharded", dir);
    snprintf(b, sizeof(b), "%s/consolidated", dir);
    layout_t d2t2p2 = {2, 2, 2, 1, 0, 8, 0, 0.25f, 0, 0}, one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t d4p2 = {4, 1, 2, 1, 0, 8, 0, 0.25f, 0, 0}, d2 = {2, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    result_t r = {0};
    run_layout_ckpt(&d2t2p2, &r, a, NULL);
    free_result(&r);
    g_consolidated = 1;
    run_layout_ckpt(&d2t2p2, &r, b, NULL);
    free_result(&r);
    g_consolidated = 0;
    snprintf(cmd, sizeof(cmd), "test -f %s/shards.json -a -f %s/shard-00007-of-00008.safetensors"
             " -a ! -e %s/model.safetensors -a -f %s/model.safetensors -a ! -e %s/shards.json",
             a, a, a, b, b);
    cr_assert_eq(system(cmd), 0, "layouts of the two directories");
    // every element of the model once per array, whatever the ranks held twice
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_model_t *ma, *mb;
    l3d_device_t *dev;
    cr_assert_eq(l3d_device_create(ctx, "cpu", NULL, &dev), L3D_OK);
    cr_assert_eq(l3d_model_open(ctx, dev, a, &ma), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    size_t numel = 0;
    for (int i = 0; i < ma->n_tensors; i++) numel += ma->tensors[i].numel;
    cr_assert_eq(count_elements(a, ""), numel);
    cr_assert_eq(count_elements(a, ".exp_avg"), numel);
    cr_assert_eq(count_elements(a, ".exp_avg_sq"), numel);
    cr_assert_eq(l3d_model_open(ctx, dev, b, &mb), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(memcmp(ma->params, mb->params, ma->n_params * sizeof(float)), 0,
                 "sharded and consolidated weights differ");
    l3d_model_destroy(mb);
    l3d_model_destroy(ma);
    l3d_device_destroy(dev);
    // both resume elsewhere and continue the uninterrupted run
    const layout_t *to[] = {&one, &d4p2, &d2};
    for (int k = 0; k < 3; k++)
        for (int src = 0; src < 2; src++) {
            result_t c = {0};
            run_layout_ckpt(to[k], &c, NULL, src ? b : a);
            char name[64];
            snprintf(name, sizeof(name), "%s -> (%d,%d,%d)", src ? "consolidated" : "sharded",
                     to[k]->dp, to[k]->tp, to[k]->pp);
            check_run(name, &c, &g_ref, STEPS / 2);
            free_result(&c);
        }
    // a missing shard, then a truncated one: every rank fails naming it
    char err[MAXR][256], p3[160];
    snprintf(p3, sizeof(p3), "%s/shard-00003-of-00008.safetensors", a);
    snprintf(cmd, sizeof(cmd), "cp %s %s.keep && rm %s", p3, p3, p3);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(run_ranks(&d2, NULL, NULL, a, err), 2);
    cr_assert(strstr(err[0], "shard-00003-of-00008") || strstr(err[1], "shard-00003-of-00008"),
              "%s | %s", err[0], err[1]);
    snprintf(cmd, sizeof(cmd), "head -c 1000 %s.keep > %s", p3, p3);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(run_ranks(&d2, NULL, NULL, a, err), 2);
    cr_assert(strstr(err[0], "shard-00003-of-00008"), "%s", err[0]);
    // saving below a regular file fails on every rank; the older checkpoint stays
    char bad[160];
    snprintf(bad, sizeof(bad), "%s/plain/ck", dir);
    snprintf(cmd, sizeof(cmd), "touch %s/plain", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(run_ranks(&d2t2p2, NULL, bad, NULL, err), 8);
    cr_assert(strstr(err[0], "plain"), "%s", err[0]);
    snprintf(cmd, sizeof(cmd), "test -f %s/shards.json", a);
    cr_assert_eq(system(cmd), 0);
    l3d_ctx_destroy(ctx);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

// Every schedule for every pp and micro-batch count up to 8 (interleaved: 2..4 chunks, where
// its preconditions hold) completes within its slots with every message received in order,
// runs each micro-batch's F and B once per stage and chunk, and 1F1B keeps min(pp - stage, A)
// sets alive. Interleaving runs every virtual stage's forwards in micro-batch order.
Test(parallel, schedules_complete) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    int interleaved = 0;
    for (int kind = 0; kind < 3; kind++)
        for (int v = 1; v <= (kind == L3D_PP_INTERLEAVED ? 4 : 1); v++)
            for (int pp = 1; pp <= 8; pp++)
                for (int A = 1; A <= 8; A++) {
                    if (kind == L3D_PP_INTERLEAVED) {
                        if (l3d_pp_check(ctx, L3D_PP_INTERLEAVED, pp, v, A) != L3D_OK) continue;
                        interleaved++;
                    }
                    cr_assert_eq(l3d_pp_validate(ctx, (l3d_pp_kind)kind, pp, v, A), L3D_OK,
                                 "kind %d pp %d v %d A %d: %s", kind, pp, v, A,
                                 l3d_ctx_last_error(ctx));
                    for (int s = 0; s < pp; s++) {
                        l3d_pp_op_t ops[64];
                        int seen[2][4][8] = {{{0}}}, live[4] = {0}, peak[4] = {0}, next_f[4] = {0};
                        int n = l3d_pp_schedule((l3d_pp_kind)kind, pp, v, s, A, ops);
                        cr_assert_eq(n, 2 * A * v);
                        for (int i = 0; i < n; i++) {
                            l3d_pp_op_t o = ops[i];
                            cr_assert(o.chunk >= 0 && o.chunk < v && o.micro >= 0 && o.micro < A);
                            seen[o.backward][o.chunk][o.micro]++;
                            if (o.backward) cr_assert(seen[0][o.chunk][o.micro], "B before F");
                            else cr_assert_eq(o.micro, next_f[o.chunk]++, "forwards in order");
                            live[o.chunk] += o.backward ? -1 : 1;
                            if (live[o.chunk] > peak[o.chunk]) peak[o.chunk] = live[o.chunk];
                        }
                        for (int c = 0; c < v; c++) {
                            for (int j = 0; j < A; j++)
                                cr_assert(seen[0][c][j] == 1 && seen[1][c][j] == 1);
                            cr_assert_eq(peak[c], l3d_pp_slots((l3d_pp_kind)kind, pp, v, s, A, c));
                        }
                        int want = kind == L3D_PP_GPIPE ? A : (pp - s < A ? pp - s : A);
                        if (kind != L3D_PP_INTERLEAVED)
                            cr_assert_eq(peak[0], want, "kind %d pp %d stage %d A %d: peak %d",
                                         kind, pp, s, A, peak[0]);
                    }
                }
    cr_assert_geq(interleaved, 30, "only %d interleaved cases", interleaved);
    // A channel delivering another message than the one a stage expects is caught: between
    // two stages forward activations and backward gradients share one channel (pp 2).
    cr_assert_eq(l3d_pp_check(ctx, L3D_PP_INTERLEAVED, 2, 2, 3), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "multiple of parallel.pp"), "%s",
              l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_pp_check(ctx, L3D_PP_1F1B, 2, 2, 4), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "virtual_stages 2 needs parallel.schedule"), "%s",
              l3d_ctx_last_error(ctx));
    l3d_ctx_destroy(ctx);
}

// Layouts that need more than the default 3 layers, against a 4-layer single-rank reference.
// Four pipeline stages of one layer each, 1F1B and GPipe, with dp and tp beside them. ZeRO-2
// windows of unequal length: with a bucket a little over a layer, the last stage's final norm
// joins its last layer (the longest bucket), the head stays alone, and the two fill at once
// at the start of every backward: the head must take the shorter window.
Test(parallel, four_layers, .timeout = 240) {
    static const layout_t cases[] = {
        {1, 1, 4, 0, 0, 8, 0, 0.25f, 0, 0},      {1, 1, 4, 0, 1, 8, 0, 0.25f, 1, 0},
        {2, 1, 4, 1, 0, 8, 3000, 0.25f, 0, 0},   {1, 2, 4, 0, 0, 8, 0, 0.25f, 0, 1},
        {2, 2, 2, 2, 0, 8, 21700, 0.25f, 0, 0},  // ZeRO-2: layer per tp rank 21632 floats
        {2, 1, 2, 2, 1, 8, 43200, 0.25f, 0, 0},  // layer 43136 floats, norm 64
        {2, 1, 2, 2, 0, 8, 43200, 0.25f, 2, 0},  // interleaved: a chunk per bucket run
    };
    make_data();
    g_layers = 4;
    result_t ref = {0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    reference_run(&one, &ref);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) compare_to(&cases[i], &ref);
    free_result(&ref);
    g_layers = 0;
}

// Interleaved 1F1B (virtual stages): more layers than the default 3, each count with its own
// single-rank reference; stage 0's later chunks receive from the last stage.
Test(parallel, interleaved, .timeout = 240) {
    static const struct {
        int layers;
        layout_t L;
    } cases[] = {
        {4, {1, 1, 2, 0, 0, 8, 0, 0.25f, 2, 0}},  {4, {2, 1, 2, 1, 0, 8, 0, 0.25f, 2, 0}},
        {4, {1, 2, 2, 0, 1, 8, 0, 0.25f, 2, 1}},  {4, {2, 2, 2, 2, 1, 8, 777, 0.25f, 2, 0}},
        {6, {1, 1, 3, 0, 0, 6, 0, 0.25f, 2, 0}},  {6, {2, 1, 3, 1, 1, 12, 0, 0.25f, 2, 0}},
        {6, {1, 1, 2, 0, 0, 8, 0, 0.25f, 3, 0}},  {8, {1, 1, 4, 0, 0, 8, 0, 0.25f, 2, 0}},
        {8, {1, 2, 4, 2, 0, 8, 0, 0.25f, 2, 0}},  {4, {2, 1, 2, 3, 1, 8, 0, 0.25f, 2, 0}},
    };
    make_data();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        g_layers = cases[i].layers;
        result_t ref = {0};
        layout_t one = {1, 1, 1, 0, 0, cases[i].L.accum_total, 0, 0.25f, 0, 0};
        reference_run(&one, &ref);
        compare_to(&cases[i].L, &ref);
        free_result(&ref);
    }
    // Checkpoints move between interleaved and plain pipelines (4 layers).
    g_layers = 4;
    result_t ref = {0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, p2 = {1, 1, 2, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t d2t2p2v2 = {2, 2, 2, 1, 0, 8, 0, 0.25f, 2, 0};
    reference_run(&one, &ref);
    resume_case_to(&d2t2p2v2, &p2, &ref);   // interleaved (2,2,2) ZeRO-1 -> 1F1B (1,1,2)
    resume_case_to(&one, &d2t2p2v2, &ref);  // (1,1,1) -> interleaved (2,2,2)
    free_result(&ref);
    g_layers = 0;
}

// Layouts whose preconditions fail are refused before training, naming the knob.
Test(parallel, pipeline_preconditions) {
    make_data();
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    layout_t L = {1, 1, 1, 0, 0, 8, 0, 0, 0, 0};
    l3d_train_config_t cfg;
    config(ctx, &L, &cfg);
    snprintf(cfg.pp_schedule, sizeof(cfg.pp_schedule), "interleaved");
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "parallel.schedule 'interleaved'"), "%s",
              l3d_ctx_last_error(ctx));
    // interleaved 1F1B: A a multiple of pp, virtual stages only with it, not with a
    // layers_per_stage list, and pp x virtual stages within the layers
    config(ctx, &L, &cfg);
    cfg.pp = 2;
    cfg.grad_accum_steps = 3;
    cfg.train_batch_size = 3 * cfg.micro_batch_size;
    snprintf(cfg.pp_schedule, sizeof(cfg.pp_schedule), "interleaved");
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "gradient_accumulation_steps (3) to be a multiple "
                                              "of parallel.pp (2)"), "%s", l3d_ctx_last_error(ctx));
    config(ctx, &L, &cfg);
    cfg.pp = 2;
    cfg.virtual_stages = 2;
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "parallel.virtual_stages 2 needs parallel.schedule "
                                              "'interleaved'"), "%s", l3d_ctx_last_error(ctx));
    snprintf(cfg.pp_schedule, sizeof(cfg.pp_schedule), "interleaved");
    cfg.n_layers_per_stage = 2;
    cfg.layers_per_stage[0] = 1;
    cfg.layers_per_stage[1] = 2;
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "layers_per_stage cannot be combined"), "%s",
              l3d_ctx_last_error(ctx));
    // 4 stages for 3 layers: finalize (what --dry-run runs) and every rank at creation (a
    // 4-rank in-process world) refuse with the same message.
    l3d_ctx_t *wctx;
    cr_assert_eq(l3d_ctx_create(NULL, &wctx), L3D_OK);
    l3d_comm_t *comms[4];
    cr_assert_eq(l3d_comm_create_local(wctx, 1, comms), L3D_OK);
    config(ctx, &L, &cfg);
    cfg.pp = 4;
    l3d_trainer_t *t = NULL;
    const char *more = "parallel.pp 4 is more stages than num_hidden_layers 3";
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), more), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_trainer_create_parallel(ctx, &cfg, comms[0], &t), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), more), "%s", l3d_ctx_last_error(ctx));
    cfg.pp = 2;  // 2 stages x 2 chunks = 4 virtual stages for 3 layers
    snprintf(cfg.pp_schedule, sizeof(cfg.pp_schedule), "interleaved");
    more = "parallel.pp 2 x parallel.virtual_stages 2 is more virtual stages than "
           "num_hidden_layers 3";
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), more), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_trainer_create_parallel(ctx, &cfg, comms[0], &t), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), more), "%s", l3d_ctx_last_error(ctx));
    l3d_comm_destroy(comms[0]);
    l3d_ctx_destroy(wctx);
    l3d_ctx_destroy(ctx);
}

// parallel.layers_per_stage overrides the balanced split: 3 layers as 1 + 2 and 2 + 1, with
// the predicted bytes following the first stage's layer count; bad lists are refused.
Test(parallel, layers_per_stage, .timeout = 120) {
    static const int a[] = {1, 2}, b[] = {2, 1};
    layout_t p2 = {1, 1, 2, 0, 0, 8, 0, 0.25f, 0, 0}, d2t2p2 = {2, 2, 2, 1, 1, 8, 0, 0.25f, 1, 1};
    reference();
    g_lps = a;
    compare(&p2);
    compare(&d2t2p2);
    g_lps = b;
    compare(&p2);
    g_lps = NULL;
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    config(ctx, &p2, &cfg);
    cfg.pp = 2;
    cfg.n_layers_per_stage = 2;
    cfg.layers_per_stage[0] = 2;
    cfg.layers_per_stage[1] = 2;
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "2 entries summing to 4; it needs pp = 2 entries "
                                              "summing to num_hidden_layers 3"), "%s",
              l3d_ctx_last_error(ctx));
    l3d_ctx_destroy(ctx);
}
