#define _GNU_SOURCE  // mkstemps
// Evaluation, shuffling and the MFU roof (issue 10, section 4).
// - The shuffled batching rule (core/train/data.h): a permutation per epoch, slices that compose,
//   the same order for every seed/step/index asked in any order.
// - l3d_trainer_eval: the single-rank eval loss equals a forward computed independently
//   (l3d_model_logits, the inference path, plus cross-entropy in double here), and every
//   layout (dp, tp, pp, interleaved, sequence parallel; ranks as threads over the in-process
//   transport, as tests/test_parallel.c runs them) gives the single rank's eval loss.
// - data.shuffle: every layout trains on the same shuffled batches (the same losses as the
//   single rank, different from the in-order ones), and a resumed run continues bit-identically.
// - l3d_mfu_update: the clamp, without timing; l3d_device_peak_table on the CPU devices.
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/train/data.h"
#include "llama3d/llama3d.h"

// ---- the shuffled rule -------------------------------------------------------------------
Test(shuffle, permute_is_a_permutation) {
    const uint64_t sizes[] = {1, 2, 3, 4, 5, 7, 16, 17, 64, 1000, 4097};
    for (size_t a = 0; a < sizeof(sizes) / sizeof(sizes[0]); a++) {
        uint64_t n = sizes[a];
        for (uint64_t key = 0; key < 3; key++) {
            char *seen = calloc(n, 1);
            for (uint64_t i = 0; i < n; i++) {
                uint64_t p = l3d_data_permute(i, n, l3d_data_epoch_key(key, 0));
                cr_assert_lt(p, n, "n %llu: perm(%llu) = %llu", (unsigned long long)n,
                             (unsigned long long)i, (unsigned long long)p);
                cr_assert_eq(seen[p], 0, "n %llu: %llu twice", (unsigned long long)n,
                             (unsigned long long)p);
                seen[p] = 1;
            }
            free(seen);
        }
    }
}

Test(shuffle, order_depends_on_seed_and_epoch_only) {
    const uint64_t n = 1000;
    int same_seed = 0, same_epoch = 0, fixed = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = l3d_data_permute(i, n, l3d_data_epoch_key(7, 3));
        cr_assert_eq(p, l3d_data_permute(i, n, l3d_data_epoch_key(7, 3)));  // no state
        same_seed += p == l3d_data_permute(i, n, l3d_data_epoch_key(8, 3));
        same_epoch += p == l3d_data_permute(i, n, l3d_data_epoch_key(7, 4));
        fixed += p == i;
    }
    // A random permutation agrees with another in about 1 place of n: far from all of them.
    cr_assert_lt(same_seed, 20);
    cr_assert_lt(same_epoch, 20);
    cr_assert_lt(fixed, 20, "the shuffle leaves %d of %llu sequences in place", fixed,
                 (unsigned long long)n);
}

static l3d_dataset_t make_stream(int32_t *buf, size_t n) {
    l3d_dataset_t ds;
    memset(&ds, 0, sizeof(ds));
    for (size_t i = 0; i < n; i++) buf[i] = (int32_t)(i * 7 + 3);  // distinct, not the index
    ds.tokens = buf;
    ds.n_tokens = n;
    snprintf(ds.path, sizeof(ds.path), "synthetic");
    return ds;
}

Test(shuffle, each_epoch_reads_every_sequence_once) {
    // n = 12 * 8 + 5: N = floor(100 / 8) = 12 sequences per epoch; batch 4 -> 3 steps an epoch.
    static int32_t buf[101];
    l3d_dataset_t ds = make_stream(buf, 101);
    enum { T = 8, B = 4, N = 12 };
    int32_t in[B * T], tg[B * T];
    int order[2][N];
    for (int e = 0; e < 2; e++) {
        int seen[N] = {0};
        for (int s = 3 * e; s < 3 * e + 3; s++) {
            l3d_dataset_batch_shuffled(&ds, 42, s, B, T, 0, B, in, tg);
            for (int i = 0; i < B; i++) {
                int o = (in[i * T] - 3) / 7;  // the token's index in the stream
                cr_assert_eq(o % T, 0, "sequence starts at %d, not a multiple of T", o);
                cr_assert_lt(o / T, N);
                seen[o / T]++;
                order[e][(s - 3 * e) * B + i] = o / T;
                cr_assert_eq((uint64_t)o, l3d_dataset_shuffled_offset(&ds, 42, s, B, T, i));
                for (int t = 0; t < T; t++) {
                    cr_assert_eq(in[i * T + t], buf[o + t]);
                    cr_assert_eq(tg[i * T + t], buf[o + t + 1]);  // never wraps
                }
            }
        }
        for (int p = 0; p < N; p++) cr_assert_eq(seen[p], 1, "epoch %d: sequence %d read %d times", e, p, seen[p]);
    }
    cr_assert(memcmp(order[0], order[1], sizeof(order[0])), "both epochs in the same order");
}

Test(shuffle, slices_compose) {
    // What lets each data-parallel rank fill only its own sequences of the same global batch.
    static int32_t buf[999];
    l3d_dataset_t ds = make_stream(buf, 999);
    enum { B = 8, T = 24 };
    int32_t in[B * T], tg[B * T], pin[3 * T], ptg[3 * T];
    for (int64_t s = 0; s < 40; s += 13) {
        l3d_dataset_batch_shuffled(&ds, 5, s, B, T, 0, B, in, tg);
        for (int first = 0; first + 3 <= B; first++) {
            l3d_dataset_batch_shuffled(&ds, 5, s, B, T, first, 3, pin, ptg);
            cr_assert_arr_eq(pin, in + first * T, sizeof(pin));
            cr_assert_arr_eq(ptg, tg + first * T, sizeof(ptg));
        }
    }
}

// ---- the MFU roof ------------------------------------------------------------------------
Test(mfu, clamp_raises_the_roof) {
    double peak = 100.0;
    int raised = -1;
    cr_assert_float_eq(l3d_mfu_update(25.0, &peak, &raised), 0.25, 1e-15);
    cr_assert_eq(raised, 0);
    cr_assert_eq(peak, 100.0);
    // A run that beats its roof: the roof becomes what it did, MFU 1, said once by the caller.
    cr_assert_eq(l3d_mfu_update(171.0, &peak, &raised), 1.0);
    cr_assert_eq(raised, 1);
    cr_assert_eq(peak, 171.0);
    cr_assert_float_eq(l3d_mfu_update(85.5, &peak, &raised), 0.5, 1e-15);
    cr_assert_eq(raised, 0);
    cr_assert_eq(peak, 171.0);
    // No roof, no work, or garbage: no MFU, the roof untouched.
    double none = 0.0;
    cr_assert_eq(l3d_mfu_update(50.0, &none, &raised), 0.0);
    cr_assert_eq(raised, 0);
    cr_assert_eq(none, 0.0);
    cr_assert_eq(l3d_mfu_update(0.0, &peak, &raised), 0.0);
    cr_assert_eq(l3d_mfu_update(NAN, &peak, &raised), 0.0);
    cr_assert_eq(l3d_mfu_update(INFINITY, &peak, &raised), 0.0);
    cr_assert_eq(peak, 171.0);
    cr_assert_eq(l3d_mfu_update(10.0, NULL, NULL), 0.0);
}

// The roof's source: a device with a table states it; the CPU devices have none, so l3d train
// measures their sgemm (cli/peak.c), and an unknown device is refused by name.
Test(mfu, cpu_devices_have_no_table) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    const char *devs[] = {"cpu", "cpu-opaque", "cpu-async"};
    for (int d = 0; d < 3; d++) {
        double f = -1.0;
        cr_assert_eq(l3d_device_peak_table(ctx, devs[d], L3D_BFLOAT16, &f), L3D_OK);
        cr_assert_eq(f, 0.0, "%s: %g", devs[d], f);
    }
    double f = -1.0;
    cr_assert_eq(l3d_device_peak_table(ctx, "gpu-nonesuch", L3D_FLOAT32, &f),
                 L3D_ERR_UNSUPPORTED);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "gpu-nonesuch"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(f, 0.0);
    l3d_ctx_destroy(ctx);
}

// ---- the trainer: eval and shuffle on every layout -----------------------------------------
enum { STEPS = 3, NTOK = 20000, MAXR = 8, EVAL_ITERS = 3 };

static char g_data[64];

static void make_data(void) {
    if (g_data[0]) return;
    snprintf(g_data, sizeof(g_data), "/tmp/l3d_test_eval_XXXXXX.bin");
    int fd = mkstemps(g_data, 4);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    // The stream of tests/test_parallel.c: structure the model learns, every id in range.
    for (int i = 0; i < NTOK; i++) {
        uint32_t id = (uint32_t)((i * 31u + (i / 7) * 17u) % 251u);
        fwrite(&id, 4, 1, f);
    }
    fclose(f);
}

typedef struct layout {
    int dp, tp, pp, v, sp, shuffle, layers;
    const int *lps;  // parallel.layers_per_stage (pp x v entries), NULL: balanced
} layout_t;

static void config(l3d_ctx_t *ctx, const layout_t *L, l3d_train_config_t *cfg) {
    l3d_train_config_default(ctx, cfg);
    l3d_model_config_t *m = &cfg->model;
    m->hidden_size = 64;
    m->intermediate_size = 160;
    m->num_hidden_layers = L->layers ? L->layers : 4;
    m->num_attention_heads = 4;
    m->num_key_value_heads = 2;
    m->head_dim = 16;
    snprintf(cfg->data_path, sizeof(cfg->data_path), "%s", g_data);
    cfg->seq_len = 32;
    cfg->micro_batch_size = 2;
    cfg->train_batch_size = 8;
    cfg->dp = L->dp;
    cfg->tp = L->tp;
    cfg->pp = L->pp;
    cfg->grad_accum_steps = 8 / (2 * L->dp);
    snprintf(cfg->pp_schedule, sizeof(cfg->pp_schedule), "%s", L->v > 1 ? "interleaved" : "1f1b");
    cfg->virtual_stages = L->v > 1 ? L->v : 0;
    cfg->sequence_parallel = L->sp;
    for (int u = 0; L->lps && u < L->pp * (L->v > 1 ? L->v : 1); u++)
        cfg->layers_per_stage[cfg->n_layers_per_stage++] = L->lps[u];
    cfg->lr = 3e-3f;
    cfg->num_threads = 1;
    cfg->seed = 7;
    cfg->steps = STEPS;
    cfg->eval_fraction = 0.25;
    cfg->eval_interval = 1;
    cfg->eval_iters = EVAL_ITERS;
    cfg->shuffle = L->shuffle;
    cfg->data_seed = 11;
    cfg->data_seed_set = 1;
}

typedef struct result {
    double eval0;                      // before the first step
    double loss[2 * STEPS], eval[2 * STEPS];
    int has_eval;
    char err[256];
} result_t;

typedef struct rank_arg {
    const layout_t *L;
    l3d_comm_t *comm;
    result_t *res;
    int r, steps;
    const char *save, *resume;
} rank_arg_t;

static void *rank_main(void *p) {
    rank_arg_t *a = p;
    l3d_ctx_t *ctx;
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK) return NULL;
    l3d_train_config_t cfg;
    config(ctx, a->L, &cfg);
    cfg.steps = a->steps;
    l3d_trainer_t *t = NULL;
    l3d_status st = l3d_train_config_finalize(ctx, &cfg);
    if (st == L3D_OK) st = l3d_trainer_create_parallel(ctx, &cfg, a->comm, &t);
    if (st == L3D_OK && a->resume) st = l3d_trainer_resume(t, a->resume);
    double e0 = NAN;
    if (st == L3D_OK) st = l3d_trainer_eval(t, &e0);
    if (a->r == 0) {
        a->res->eval0 = e0;
        a->res->has_eval = t ? l3d_trainer_has_eval(t) : 0;
    }
    while (st == L3D_OK && l3d_trainer_steps_done(t) < a->steps) {
        l3d_step_stats_t s;
        st = l3d_trainer_step(t, &s);
        if (st == L3D_OK && a->r == 0) {
            a->res->loss[s.step - 1] = s.loss;
            a->res->eval[s.step - 1] = s.eval_loss;
        }
    }
    if (st == L3D_OK && a->save) st = l3d_trainer_save(t, a->save);
    if (st != L3D_OK) {
        if (a->r == 0 || !a->res->err[0])
            snprintf(a->res->err, sizeof(a->res->err), "rank %d: %s", a->r, l3d_ctx_last_error(ctx));
        if (a->comm) l3d_comm_abort(a->comm);
    }
    l3d_trainer_destroy(t);
    l3d_ctx_destroy(ctx);
    return NULL;
}

static void run(const layout_t *L, int steps, const char *save, const char *resume,
                result_t *res) {
    make_data();
    memset(res, 0, sizeof(*res));
    for (int i = 0; i < 2 * STEPS; i++) res->loss[i] = res->eval[i] = NAN;
    int n = L->dp * L->tp * L->pp;
    l3d_ctx_t *wctx;
    cr_assert_eq(l3d_ctx_create(NULL, &wctx), L3D_OK);
    l3d_comm_t *comms[MAXR] = {0};
    if (n > 1) cr_assert_eq(l3d_comm_create_local(wctx, n, comms), L3D_OK);
    rank_arg_t args[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg_t){.L = L, .comm = comms[r], .res = res, .r = r, .steps = steps,
                               .save = save, .resume = resume};
        cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) l3d_comm_destroy(comms[r]);
    l3d_ctx_destroy(wctx);
    cr_assert_eq(res->err[0], 0, "layout dp %d tp %d pp %d: %s", L->dp, L->tp, L->pp, res->err);
}

// Mean cross-entropy over the eval batches, computed here: the in-order rule of core/train/data.h
// on the held-out tail (the last NTOK/4 tokens of the file), logits from the inference path.
static double independent_eval(l3d_model_t *m, const l3d_train_config_t *cfg, int shift) {
    int T = cfg->seq_len, B = cfg->train_batch_size, V = cfg->model.vocab_size;
    size_t ne = (size_t)(NTOK * cfg->eval_fraction), base = NTOK - ne;
    int32_t *tok = malloc((size_t)(T + 1) * sizeof(int32_t));
    float *logits = malloc((size_t)T * V * sizeof(float));
    double sum = 0.0;
    for (int b = 0; b < cfg->eval_iters; b++)
        for (int i = 0; i < B; i++) {
            size_t o = ((size_t)(b * B + i) * T + (size_t)shift) % ne;
            for (int t = 0; t <= T; t++) {
                size_t k = base + (o + (size_t)t) % ne;
                tok[t] = (int32_t)((k * 31u + (k / 7) * 17u) % 251u);
            }
            cr_assert_eq(l3d_model_logits(m, tok, T, logits), L3D_OK);
            for (int t = 0; t < T; t++) {
                const float *z = logits + (size_t)t * V;
                double mx = z[0], se = 0.0;
                for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
                for (int v = 0; v < V; v++) se += exp((double)z[v] - mx);
                sum += mx + log(se) - z[tok[t + 1]];
            }
        }
    free(logits);
    free(tok);
    return sum / ((double)cfg->eval_iters * B * T);
}

// Two float32 computations of the same losses (layouts split the sums differently; the
// inference path uses other kernels) differ by rounding: about 1e-7 relative per token,
// up to 1e-6 on a loss near 5 after a few steps (tp splits the vocabulary's sums). 1e-4 is
// 100 times that, and over 10 times smaller than what other batches of this stream give
// (checked below each time: `shift`, and the other batch order in compare_layouts).
#define TOL 1e-4

Test(eval, matches_independent_forward, .timeout = 120) {
    make_data();
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    layout_t one = {1, 1, 1, 0, 0, 0, 0, NULL};
    config(ctx, &one, &cfg);
    cr_assert_eq(l3d_train_config_finalize(ctx, &cfg), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    l3d_trainer_t *t;
    cr_assert_eq(l3d_trainer_create(ctx, &cfg, &t), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_trainer_train_tokens(t), NTOK - NTOK / 4);
    cr_assert_eq(l3d_trainer_eval_tokens(t), NTOK / 4);
    for (int s = 0; s <= STEPS; s++) {
        double e = NAN;
        if (s > 0) {
            l3d_step_stats_t st;
            cr_assert_eq(l3d_trainer_step(t, &st), L3D_OK, "%s", l3d_ctx_last_error(ctx));
            e = st.eval_loss;  // eval_interval 1: every step evaluates after its update
        } else {
            cr_assert_eq(l3d_trainer_eval(t, &e), L3D_OK, "%s", l3d_ctx_last_error(ctx));
        }
        double want = independent_eval(l3d_trainer_model(t), &cfg, 0);
        double other = independent_eval(l3d_trainer_model(t), &cfg, 5);
        cr_log_info("step %d: eval %.9f independent %.9f (other batches %.9f)", s, e, want, other);
        cr_assert(fabs(e - want) < TOL, "step %d: eval loss %.9f, independent forward %.9f", s, e,
                  want);
        cr_assert(fabs(other - want) > 10 * TOL, "step %d: other batches give %.9f, too close "
                  "to %.9f for the test to tell them apart", s, other, want);
        double again;
        cr_assert_eq(l3d_trainer_eval(t, &again), L3D_OK);
        cr_assert_eq(again, e, "evaluation changed the model or read other batches");
    }
    l3d_trainer_destroy(t);
    l3d_ctx_destroy(ctx);
}

// (the last: the embedding alone in the first virtual stage, the head alone in the last)
static const int k_ends[] = {0, 2, 2, 0};
static const layout_t k_layouts[] = {
    {2, 1, 1, 0, 0, 0, 0, NULL}, {1, 2, 1, 0, 0, 0, 0, NULL}, {1, 1, 2, 0, 0, 0, 0, NULL},
    {1, 1, 2, 2, 0, 0, 0, NULL}, {2, 2, 1, 0, 1, 0, 0, NULL}, {2, 1, 2, 0, 0, 0, 0, NULL},
    {1, 2, 2, 0, 0, 0, 0, NULL}, {2, 2, 2, 0, 0, 0, 0, NULL}, {1, 1, 2, 2, 0, 0, 0, k_ends},
};

static void compare_layouts(int shuffle) {
    layout_t one = {1, 1, 1, 0, 0, shuffle, 0, NULL}, other = one;
    other.shuffle = !shuffle;
    result_t ref, alt, got;
    run(&one, STEPS, NULL, NULL, &ref);
    run(&other, STEPS, NULL, NULL, &alt);
    // The batches matter: the other order trains on other sequences (the eval batches are the
    // same, the first eval precedes any training).
    cr_assert(fabs(ref.loss[0] - alt.loss[0]) > 100 * TOL, "shuffle %d: step 1 loss %.9f, "
              "the other order's %.9f", shuffle, ref.loss[0], alt.loss[0]);
    cr_assert_eq(ref.eval0, alt.eval0);
    for (size_t k = 0; k < sizeof(k_layouts) / sizeof(k_layouts[0]); k++) {
        layout_t L = k_layouts[k];
        L.shuffle = shuffle;
        run(&L, STEPS, NULL, NULL, &got);
        cr_assert(fabs(got.eval0 - ref.eval0) < TOL, "dp %d tp %d pp %d v %d: eval before "
                  "training %.9f, single rank %.9f", L.dp, L.tp, L.pp, L.v, got.eval0, ref.eval0);
        for (int s = 0; s < STEPS; s++) {
            cr_log_info("shuffle %d dp %d tp %d pp %d v %d step %d: loss %.3g eval %.3g apart",
                        shuffle, L.dp, L.tp, L.pp, L.v, s + 1, got.loss[s] - ref.loss[s],
                        got.eval[s] - ref.eval[s]);
            cr_assert(fabs(got.loss[s] - ref.loss[s]) < TOL, "shuffle %d dp %d tp %d pp %d v %d: "
                      "step %d loss %.9f, single rank %.9f", shuffle, L.dp, L.tp, L.pp, L.v,
                      s + 1, got.loss[s], ref.loss[s]);
            cr_assert(fabs(got.eval[s] - ref.eval[s]) < TOL, "shuffle %d dp %d tp %d pp %d v %d: "
                      "step %d eval loss %.9f, single rank %.9f", shuffle, L.dp, L.tp, L.pp, L.v,
                      s + 1, got.eval[s], ref.eval[s]);
        }
    }
}

Test(eval, same_on_every_layout, .timeout = 300) { compare_layouts(0); }
Test(shuffle, same_on_every_layout, .timeout = 300) { compare_layouts(1); }

// A resumed shuffled run continues the same order: bit-identical losses and eval losses.
static void resume_case(const layout_t *L) {
    char dir[] = "/tmp/l3d_test_eval_ckpt_XXXXXX";
    cr_assert_neq(mkdtemp(dir), NULL);
    char ckpt[96];
    snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
    result_t whole, first, second;
    run(L, 2 * STEPS, NULL, NULL, &whole);
    run(L, STEPS, ckpt, NULL, &first);
    run(L, 2 * STEPS, NULL, ckpt, &second);
    for (int s = 0; s < 2 * STEPS; s++) {
        const result_t *part = s < STEPS ? &first : &second;
        cr_assert_eq(memcmp(&part->loss[s], &whole.loss[s], sizeof(double)), 0,
                     "dp %d pp %d: step %d loss %.17g, uninterrupted %.17g", L->dp, L->pp, s + 1,
                     part->loss[s], whole.loss[s]);
        cr_assert_eq(memcmp(&part->eval[s], &whole.eval[s], sizeof(double)), 0,
                     "dp %d pp %d: step %d eval %.17g, uninterrupted %.17g", L->dp, L->pp, s + 1,
                     part->eval[s], whole.eval[s]);
    }
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(shuffle, resume_is_bit_identical, .timeout = 300) {
    const layout_t one = {1, 1, 1, 0, 0, 1, 0, NULL}, dp2pp2 = {2, 1, 2, 0, 0, 1, 0, NULL};
    resume_case(&one);
    resume_case(&dp2pp2);
}

// ---- the keys ----------------------------------------------------------------------------
static l3d_status parse(l3d_ctx_t *ctx, const char *json, l3d_train_config_t *cfg) {
    l3d_train_config_default(ctx, cfg);
    return l3d_train_config_from_json(ctx, json, strlen(json), "/cfg/ds.json", cfg);
}

Test(config, eval_shuffle_and_peak_keys) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    cr_assert_eq(parse(ctx, "{\"data\": {\"eval_path\": \"val.txt\", \"shuffle\": true, "
                            "\"seed\": 5}, \"train\": {\"eval_interval\": 50, \"eval_iters\": 4, "
                            "\"peak_flops\": 1.5e12}}", &cfg), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert_str_eq(cfg.eval_path, "/cfg/val.txt");  // relative to the config, as data.path
    cr_assert_eq(cfg.shuffle, 1);
    cr_assert_eq(cfg.data_seed_set, 1);
    cr_assert_eq(cfg.data_seed, 5);
    cr_assert_eq(cfg.eval_interval, 50);
    cr_assert_eq(cfg.eval_iters, 4);
    cr_assert_eq(cfg.peak_flops, 1.5e12);
    // defaults: in order, no evaluation, 10 batches when there is one, no roof
    l3d_train_config_default(ctx, &cfg);
    cr_assert_eq(cfg.shuffle, 0);
    cr_assert_eq(cfg.eval_interval, 0);
    cr_assert_eq(cfg.eval_iters, 10);
    cr_assert_eq(cfg.peak_flops, 0.0);
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"data\": {\"eval_path\": \"v\", \"eval_fraction\": 0.1}}", "give one"},
        {"{\"data\": {\"eval_fraction\": 1.0}}", "data.eval_fraction"},
        {"{\"data\": {\"eval_fraction\": -0.1}}", "data.eval_fraction"},
        {"{\"train\": {\"eval_interval\": 10}}", "no eval stream"},
        {"{\"train\": {\"eval_iters\": 0}}", "train.eval_iters"},
        {"{\"train\": {\"peak_flops\": -1}}", "train.peak_flops"},
        {"{\"data\": {\"shuffle\": 1}}", "data.shuffle"},
        {"{\"data\": {\"shufle\": true}}", "shuffle"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(parse(ctx, bad[i].json, &cfg), L3D_ERR_CONFIG, "%s accepted", bad[i].json);
        cr_assert(strstr(l3d_ctx_last_error(ctx), bad[i].msg), "%s: '%s' does not say '%s'",
                  bad[i].json, l3d_ctx_last_error(ctx), bad[i].msg);
    }
    l3d_ctx_destroy(ctx);
}

Test(eval, fraction_too_small_or_no_stream) {
    make_data();
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_train_config_t cfg;
    layout_t one = {1, 1, 1, 0, 0, 0, 0, NULL};
    config(ctx, &one, &cfg);
    cfg.eval_fraction = 0.001;  // 20 tokens: not one sequence of 33
    l3d_trainer_t *t = NULL;
    cr_assert_eq(l3d_trainer_create(ctx, &cfg, &t), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "data.eval_fraction"), "%s", l3d_ctx_last_error(ctx));
    cfg.eval_fraction = 0.0;
    cfg.eval_interval = 0;
    cr_assert_eq(l3d_trainer_create(ctx, &cfg, &t), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    double e;
    cr_assert_eq(l3d_trainer_eval(t, &e), L3D_ERR_INVALID_ARG);
    cr_assert(isnan(e));
    l3d_step_stats_t s;
    cr_assert_eq(l3d_trainer_step(t, &s), L3D_OK);
    cr_assert(isnan(s.eval_loss));
    cr_assert_eq(l3d_trainer_train_tokens(t), NTOK);
    l3d_trainer_destroy(t);
    l3d_ctx_destroy(ctx);
}
