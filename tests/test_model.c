// Model-level properties that the op tests cannot see: the KV-cached decode path agrees with
// the full forward, activation checkpointing changes no bit of the gradients, results do not
// depend on the thread count, initialisation is a pure function of the seed, and a saved
// checkpoint reloads to the same logits.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/model/model_internal.h"
#include "platform/platform.h"

static l3d_model_config_t small_config(int tied) {
    l3d_model_config_t c;
    memset(&c, 0, sizeof(c));
    snprintf(c.name, sizeof(c.name), "test");
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.vocab_size = 40;
    c.max_position_embeddings = 128;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 500000.0f;
    c.rope_scaling_llama3 = 1;
    c.rope_factor = 8;
    c.rope_low_freq_factor = 1;
    c.rope_high_freq_factor = 4;
    c.rope_original_max_position_embeddings = 16;
    c.tie_word_embeddings = tied;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.initializer_range = 0.2f;  // large enough that attention is far from uniform
    return c;
}

typedef struct fixture {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
    l3d_model_t *m;
} fixture_t;

static fixture_t open_model(int threads, int tied, uint64_t seed) {
    fixture_t f;
    cr_assert_eq(l3d_ctx_create(NULL, &f.ctx), L3D_OK);
    l3d_device_params_t p = {.num_threads = threads};
    cr_assert_eq(l3d_device_create(f.ctx, "cpu", &p, &f.dev), L3D_OK);
    l3d_model_config_t c = small_config(tied);
    cr_assert_eq(l3d_model_create(f.ctx, f.dev, &c, &f.m), L3D_OK, "%s", l3d_ctx_last_error(f.ctx));
    cr_assert_eq(l3d_model_init_weights(f.m, seed), L3D_OK);
    return f;
}
static void close_model(fixture_t *f) {
    l3d_model_destroy(f->m);
    l3d_device_destroy(f->dev);
    l3d_ctx_destroy(f->ctx);
}

static void fill_tokens(int32_t *t, int n, int V, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)((seed >> 8) % (uint32_t)V);
    }
}

Test(model, decode_matches_full_forward) {
    fixture_t f = open_model(2, 0, 7);
    const int n = 70;  // more than one prefill chunk of 64
    int V = f.m->V;
    int32_t tok[70];
    fill_tokens(tok, n, V, 3);
    float *full = malloc(sizeof(float) * n * V), *last = malloc(sizeof(float) * V);
    cr_assert_eq(l3d_model_logits(f.m, tok, n, full), L3D_OK);
    l3d_kv_cache_t *c = NULL;
    cr_assert_eq(l3d_kv_cache_create(f.m, n, &c), L3D_OK);
    // prefill 5 tokens, then one at a time
    cr_assert_eq(l3d_model_decode(f.m, c, tok, 5, last), L3D_OK);
    for (int i = 5; i <= n; i++) {
        const float *want = full + (size_t)(i - 1) * V;
        for (int v = 0; v < V; v++)
            cr_assert(fabsf(last[v] - want[v]) <= 1e-5f * (1.0f + fabsf(want[v])),
                      "position %d logit %d: decode %g, full %g", i - 1, v, last[v], want[v]);
        if (i < n) cr_assert_eq(l3d_model_decode(f.m, c, &tok[i], 1, last), L3D_OK);
    }
    cr_assert_eq(l3d_kv_cache_len(c), n);
    int32_t one = 0;
    cr_assert_eq(l3d_model_decode(f.m, c, &one, 1, last), L3D_ERR_INVALID_ARG,
                 "decoding past the capacity must fail");
    l3d_kv_cache_destroy(c);
    free(full);
    free(last);
    close_model(&f);
}

// The same at a width where float32 rounding shows: decode runs the head and every linear
// layer as matrix-vector products (M <= 16 rows: cpu_gemv.c), the full forward as sgemm tiles,
// so each dot product is summed in another order. Decoding 37 tokens, then 1, 3 and 5 at a
// time covers both kernels on the decode side.
//
// Tolerance, from float32 accumulation (u = 2^-24; Higham 3.1: a dot product of length K
// summed in any order is within K u sum|a_k b_k| of the exact one). Both paths compute the same
// function, so their logits differ by at most twice the error of either. Along the path to a
// logit, each layer adds a relative error of at most (2C + F + T) u (q/k/v and o projections,
// K = C; the MLP down projection, K = F; attention over T keys) and the head (K = C) one more
// C u, relative to the magnitude sum|h_k w_vk| of the final dot, which Cauchy-Schwarz bounds
// by |h| |w_v| = sqrt(C) |w_v| (RMSNorm output with unit weights has |h| = sqrt(C)). So
//   |decode - full| <= 2 (L (2C + F + T) + C) u sqrt(C) |w_v|.
// A worst case: real rounding errors are far smaller and cancel, but a wrong position, cache
// row or kernel bug moves logits by O(|w_v|), above it by orders of magnitude.
// A model of `cfg` on a 2-thread CPU device, weights from `seed`.
static fixture_t open_wide(l3d_model_config_t cfg, uint64_t seed) {
    fixture_t f;
    cr_assert_eq(l3d_ctx_create(NULL, &f.ctx), L3D_OK);
    l3d_device_params_t dp = {.num_threads = 2};
    cr_assert_eq(l3d_device_create(f.ctx, "cpu", &dp, &f.dev), L3D_OK);
    cr_assert_eq(l3d_model_create(f.ctx, f.dev, &cfg, &f.m), L3D_OK, "%s", l3d_ctx_last_error(f.ctx));
    cr_assert_eq(l3d_model_init_weights(f.m, seed), L3D_OK);
    return f;
}

// The bound derived above, per logit v, for attention over at most T keys.
static void head_tolerance(const l3d_model_t *m, int T, double *tol) {
    const int V = m->V, C = m->C, F = m->F, L = m->L;
    const float *W = m->params + m->head;
    for (int v = 0; v < V; v++) {
        double w2 = 0.0;
        for (int k = 0; k < C; k++) w2 += (double)W[(size_t)v * C + k] * W[(size_t)v * C + k];
        tol[v] = 2.0 * (L * (2.0 * C + F + T) + C) * 0x1p-24 * sqrt((double)C) * sqrt(w2);
    }
}

Test(model, decode_matches_full_forward_at_width) {
    l3d_model_config_t cfg = small_config(1);
    cfg.hidden_size = 256;
    cfg.intermediate_size = 512;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 64;
    cfg.vocab_size = 1000;
    cfg.initializer_range = 0.05f;
    fixture_t f = open_wide(cfg, 5);
    const int n = 100, V = f.m->V;
    int32_t tok[100];
    fill_tokens(tok, n, V, 9);
    float *full = malloc(sizeof(float) * n * V), *last = malloc(sizeof(float) * V);
    double *tol = malloc(sizeof(double) * V);
    cr_assert_eq(l3d_model_logits(f.m, tok, n, full), L3D_OK);
    head_tolerance(f.m, n, tol);
    l3d_kv_cache_t *c = NULL;
    cr_assert_eq(l3d_kv_cache_create(f.m, n, &c), L3D_OK);
    const int steps[] = {37, 1, 1, 3, 5, 1, 3};
    int pos = 0;
    double worst = 0.0;
    for (int s = 0; pos < n; s++) {
        int k = s < 7 ? steps[s] : 1;
        if (pos + k > n) k = n - pos;
        cr_assert_eq(l3d_model_decode(f.m, c, tok + pos, k, last), L3D_OK);
        pos += k;
        const float *want = full + (size_t)(pos - 1) * V;
        for (int v = 0; v < V; v++) {
            double d = fabs((double)last[v] - want[v]);
            worst = fmax(worst, d / tol[v]);
            cr_assert_leq(d, tol[v], "position %d logit %d: decode %.9g, full %.9g, bound %.3g",
                          pos - 1, v, last[v], want[v], tol[v]);
        }
    }
    cr_log_info("largest difference: %.3g of the bound", worst);
    l3d_kv_cache_destroy(c);
    free(tol);
    free(full);
    free(last);
    close_model(&f);
}

// A prompt longer than one pass (2048 rows at most, core/model/model_infer.c): the full forward and
// a prefill both run two passes, the second reading the first's cache rows, and must agree
// with each other and with the single-token steps after them. Same kernels on both sides for
// the prefill (sgemm), matrix-vector for the steps: the tolerance is the one of
// decode_matches_full_forward.
Test(model, prompt_longer_than_one_pass) {
    fixture_t f;
    cr_assert_eq(l3d_ctx_create(NULL, &f.ctx), L3D_OK);
    l3d_device_params_t dp = {.num_threads = 2};
    cr_assert_eq(l3d_device_create(f.ctx, "cpu", &dp, &f.dev), L3D_OK);
    l3d_model_config_t cfg = small_config(0);
    cfg.max_position_embeddings = 2200;
    cr_assert_eq(l3d_model_create(f.ctx, f.dev, &cfg, &f.m), L3D_OK, "%s", l3d_ctx_last_error(f.ctx));
    cr_assert_eq(l3d_model_init_weights(f.m, 3), L3D_OK);
    const int n = 2100, V = f.m->V;
    int32_t *tok = malloc(sizeof(int32_t) * n);
    fill_tokens(tok, n, V, 5);
    float *full = malloc(sizeof(float) * (size_t)n * V), *last = malloc(sizeof(float) * V);
    cr_assert_eq(l3d_model_logits(f.m, tok, n, full), L3D_OK);
    l3d_kv_cache_t *c = NULL;
    cr_assert_eq(l3d_kv_cache_create(f.m, n, &c), L3D_OK);
    int pos = 2090;
    cr_assert_eq(l3d_model_decode(f.m, c, tok, pos, last), L3D_OK);
    for (;;) {
        const float *want = full + (size_t)(pos - 1) * V;
        for (int v = 0; v < V; v++)
            cr_assert(fabsf(last[v] - want[v]) <= 1e-5f * (1.0f + fabsf(want[v])),
                      "position %d logit %d: decode %g, full %g", pos - 1, v, last[v], want[v]);
        if (pos == n) break;
        cr_assert_eq(l3d_model_decode(f.m, c, &tok[pos], 1, last), L3D_OK);
        pos++;
    }
    l3d_kv_cache_destroy(c);
    free(tok);
    free(full);
    free(last);
    close_model(&f);
}

// Runs one micro-batch and returns the gradient arena (malloc'd) and the loss sum.
static float *grads_of(fixture_t *f, int recompute, double *loss) {
    const int B = 3, T = 17;
    l3d_acts_t *a = NULL;
    cr_assert_eq(l3d_acts_create(f->m, B, T, recompute, &a), L3D_OK);
    int32_t tok[3 * 18];
    fill_tokens(tok, B * (T + 1), f->m->V, 11);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            a->tokens[b * T + t] = tok[b * (T + 1) + t];
            a->targets[b * T + t] = tok[b * (T + 1) + t + 1];
        }
    size_t bytes = f->m->n_params * sizeof(float);
    float *g = calloc(1, bytes);
    cr_assert_eq(l3d_model_train_micro(f->m, a, g, 1.0f / (B * T), loss), L3D_OK);
    l3d_acts_destroy(f->m, a);
    return g;
}

Test(model, activation_checkpointing_is_bit_identical) {
    fixture_t f = open_model(2, 1, 5);
    double l0, l1;
    float *g0 = grads_of(&f, 0, &l0), *g1 = grads_of(&f, 1, &l1);
    cr_assert_eq(l0, l1, "loss with recompute %.17g vs %.17g", l1, l0);
    cr_assert(memcmp(g0, g1, f.m->n_params * sizeof(float)) == 0,
              "gradients differ with activation checkpointing");
    double s = 0;
    for (size_t i = 0; i < f.m->n_params; i++) s += fabs(g0[i]);
    cr_assert(s > 0, "gradients are all zero");
    free(g0);
    free(g1);
    close_model(&f);
}

Test(model, thread_count_does_not_change_results) {
    fixture_t f1 = open_model(1, 0, 9), f3 = open_model(3, 0, 9);
    double l1, l3;
    float *g1 = grads_of(&f1, 0, &l1), *g3 = grads_of(&f3, 0, &l3);
    cr_assert_eq(l1, l3, "loss 1 thread %.17g vs 3 threads %.17g", l1, l3);
    cr_assert(memcmp(g1, g3, f1.m->n_params * sizeof(float)) == 0,
              "gradients differ between 1 and 3 threads");
    free(g1);
    free(g3);
    close_model(&f1);
    close_model(&f3);
}

Test(model, init_is_a_function_of_seed_and_name) {
    fixture_t a = open_model(1, 0, 42), b = open_model(2, 0, 42), c = open_model(1, 0, 43);
    size_t bytes = a.m->n_params * sizeof(float);
    cr_assert(memcmp(a.m->params, b.m->params, bytes) == 0, "same seed, different weights");
    cr_assert(memcmp(a.m->params, c.m->params, bytes) != 0, "different seeds, same weights");
    // statistics of a matrix: mean ~0, std ~ initializer_range; norms are exactly 1
    const l3d_param_t *q = &a.m->tensors[2];
    cr_assert_str_eq(q->name, "model.layers.0.self_attn.q_proj.weight");
    double s = 0, s2 = 0;
    for (size_t i = 0; i < q->numel; i++) {
        double x = a.m->params[q->offset + i];
        s += x;
        s2 += x * x;
    }
    double mean = s / q->numel, sd = sqrt(s2 / q->numel - mean * mean);
    cr_assert(fabs(mean) < 0.03 && fabs(sd - 0.2) < 0.03, "q_proj init mean %g sd %g", mean, sd);
    const l3d_param_t *ln = &a.m->tensors[1];
    for (size_t i = 0; i < ln->numel; i++) cr_assert_eq(a.m->params[ln->offset + i], 1.0f);
    close_model(&a);
    close_model(&b);
    close_model(&c);
}

Test(model, save_and_reload_give_the_same_logits) {
    fixture_t f = open_model(2, 0, 3);
    char dir[] = "/tmp/l3d_test_model_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char ck[300];
    snprintf(ck, sizeof(ck), "%s/ck", dir);
    cr_assert_eq(l3d_model_save(f.m, ck), L3D_OK, "%s", l3d_ctx_last_error(f.ctx));
    l3d_model_t *m2 = NULL;
    cr_assert_eq(l3d_model_open(f.ctx, f.dev, ck, &m2), L3D_OK, "%s", l3d_ctx_last_error(f.ctx));
    cr_assert(memcmp(f.m->params, m2->params, f.m->n_params * sizeof(float)) == 0);
    int32_t tok[9];
    fill_tokens(tok, 9, f.m->V, 1);
    int V = f.m->V;
    float *a = malloc(sizeof(float) * 9 * V), *b = malloc(sizeof(float) * 9 * V);
    cr_assert_eq(l3d_model_logits(f.m, tok, 9, a), L3D_OK);
    cr_assert_eq(l3d_model_logits(m2, tok, 9, b), L3D_OK);
    cr_assert(memcmp(a, b, sizeof(float) * 9 * V) == 0);
    free(a);
    free(b);
    l3d_model_destroy(m2);
    // saving again replaces the directory whole, with no temp directories left behind
    cr_assert_eq(l3d_model_save(f.m, ck), L3D_OK);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
    close_model(&f);
}

Test(model, rope_llama3_scaling_bands) {
    // HF _compute_llama3_parameters: wavelengths above orig/low are divided by factor,
    // below orig/high kept, and blended in between.
    l3d_model_config_t c = small_config(0);
    double inv[4];
    l3d_rope_inv_freq(&c, inv);
    for (int i = 0; i < 4; i++) {
        double base = 1.0 / pow(500000.0, 2.0 * i / 8.0);
        double wl = 6.283185307179586 / base, want;
        if (wl < 16.0 / 4) want = base;
        else if (wl > 16.0 / 1) want = base / 8;
        else {
            double sm = (16.0 / wl - 1) / (4 - 1);
            want = (1 - sm) * base / 8 + sm * base;
        }
        cr_assert(fabs(inv[i] - want) <= 1e-6 * want, "inv_freq[%d] %g want %g", i, inv[i], want);
    }
}

// The model of the several-sequence decode tests.
static l3d_model_config_t decode_config(void) {
    l3d_model_config_t cfg = small_config(1);
    cfg.hidden_size = 128;
    cfg.intermediate_size = 256;
    cfg.head_dim = 32;
    cfg.vocab_size = 300;
    cfg.initializer_range = 0.05f;
    return cfg;
}

// Several sequences in one cache: sequences at different positions advanced together by
// l3d_model_decode_batch give, row for row, the logits of decoding each alone in a cache of
// its own. Both take the matrix-vector kernel (up to 16 rows), but the batch's layers are not
// the lone decode's code (l3d_model_decode runs the training forward over one token), so the
// sums may differ in order: decode_matches_full_forward_at_width's bound applies (attention
// over at most T keys, T the longest sequence).
Test(model, batched_decode_matches_one_sequence_at_a_time) {
    l3d_model_config_t cfg = decode_config();
    fixture_t f = open_wide(cfg, 11);
    enum { S = 6, CAP = 40, STEPS = 4 };
    const int V = f.m->V;
    const int prompt[S] = {7, 1, 12, 3, 20, 5};  // each sequence at its own position
    int32_t tok[S][CAP];
    for (int s = 0; s < S; s++) fill_tokens(tok[s], CAP, V, 100 + s);
    l3d_kv_cache_t *batch = NULL, *alone[S];
    cr_assert_eq(l3d_kv_cache_create_seqs(f.m, S, CAP, &batch), L3D_OK);
    float *got = malloc(sizeof(float) * S * V), *want = malloc(sizeof(float) * V);
    double *tol = malloc(sizeof(double) * V);
    head_tolerance(f.m, CAP, tol);
    for (int s = 0; s < S; s++) {
        cr_assert_eq(l3d_kv_cache_create(f.m, CAP, &alone[s]), L3D_OK);
        cr_assert_eq(l3d_model_decode_seq(f.m, batch, s, tok[s], prompt[s], want), L3D_OK);
        cr_assert_eq(l3d_model_decode(f.m, alone[s], tok[s], prompt[s], want), L3D_OK);
        cr_assert_eq(l3d_kv_cache_seq_len(batch, s), prompt[s]);
    }
    // Rows in another order than the sequences, and a step with a subset of them.
    int seqs[S] = {3, 0, 5, 1, 4, 2};
    double worst = 0.0;
    for (int step = 0; step < STEPS; step++) {
        int n = step == 2 ? 3 : S;
        int32_t t[S];
        for (int i = 0; i < n; i++) t[i] = tok[seqs[i]][l3d_kv_cache_seq_len(batch, seqs[i])];
        cr_assert_eq(l3d_model_decode_batch(f.m, batch, seqs, t, n, got), L3D_OK, "%s",
                     l3d_ctx_last_error(f.ctx));
        for (int i = 0; i < n; i++) {
            cr_assert_eq(l3d_model_decode(f.m, alone[seqs[i]], &t[i], 1, want), L3D_OK);
            for (int v = 0; v < V; v++) {
                double d = fabs((double)got[(size_t)i * V + v] - want[v]);
                worst = fmax(worst, d / tol[v]);
                cr_assert_leq(d, tol[v], "step %d sequence %d logit %d: batched %.9g, alone %.9g",
                              step, seqs[i], v, got[(size_t)i * V + v], want[v]);
            }
        }
    }
    cr_log_info("largest difference: %.3g of the bound", worst);
    // Misuse is a status.
    int dup[2] = {1, 1};
    int32_t two[2] = {0, 0};
    cr_assert_eq(l3d_model_decode_batch(f.m, batch, dup, two, 2, got), L3D_ERR_INVALID_ARG);
    int out_of_range = S;
    cr_assert_eq(l3d_model_decode_batch(f.m, batch, &out_of_range, two, 1, got), L3D_ERR_INVALID_ARG);
    int32_t bad = V;
    cr_assert_eq(l3d_model_decode_batch(f.m, batch, seqs, &bad, 1, got), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_decode_batch(f.m, batch, NULL, two, 1, got), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_decode_seq(f.m, batch, -1, two, 1, want), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_kv_cache_create_seqs(f.m, 0, CAP, &alone[0]), L3D_ERR_INVALID_ARG);
    // A truncated sequence continues from its kept prefix: sequence 4 cut to nothing, then
    // fed tok[0][0..3), gives the logits of a fresh cache fed the same.
    cr_assert_eq(l3d_kv_cache_seq_truncate(batch, 4, l3d_kv_cache_seq_len(batch, 4) + 1),
                 L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_kv_cache_seq_truncate(batch, 4, 0), L3D_OK);
    cr_assert_eq(l3d_kv_cache_seq_len(batch, 4), 0);
    cr_assert_eq(l3d_model_decode_seq(f.m, batch, 4, tok[0], 3, got), L3D_OK);
    l3d_kv_cache_t *fresh = NULL;
    cr_assert_eq(l3d_kv_cache_create(f.m, CAP, &fresh), L3D_OK);
    cr_assert_eq(l3d_model_decode(f.m, fresh, tok[0], 3, want), L3D_OK);
    cr_assert(memcmp(got, want, sizeof(float) * V) == 0, "a truncated sequence differs from a fresh one");
    // ... and cut back to 1 position and fed tok[0][1..3) again, the same.
    cr_assert_eq(l3d_kv_cache_seq_truncate(batch, 4, 1), L3D_OK);
    cr_assert_eq(l3d_model_decode_seq(f.m, batch, 4, tok[0] + 1, 2, got), L3D_OK);
    cr_assert(memcmp(got, want, sizeof(float) * V) == 0, "a re-decoded suffix differs");
    l3d_kv_cache_destroy(fresh);
    for (int s = 0; s < S; s++) l3d_kv_cache_destroy(alone[s]);
    l3d_kv_cache_destroy(batch);
    free(tol);
    free(got);
    free(want);
    close_model(&f);
}

// Mixed spans (prompt chunks and generated tokens of several sequences in one call) give,
// span for span, the logits of feeding each sequence the same tokens alone; a call longer
// than the cache's rows per pass (here the capacity, 40) is cut into passes, one span across
// the cut. The bound is the batched decode's (same math, sums in another order).
Test(model, mixed_spans_match_each_sequence_alone) {
    l3d_model_config_t cfg = decode_config();
    fixture_t f = open_wide(cfg, 12);
    enum { S = 5, CAP = 40 };
    const int V = f.m->V;
    int32_t tok[S][CAP];
    for (int s = 0; s < S; s++) fill_tokens(tok[s], CAP, V, 200 + s);
    l3d_kv_cache_t *all = NULL, *alone[S];
    cr_assert_eq(l3d_kv_cache_create_seqs(f.m, S, CAP, &all), L3D_OK);
    for (int s = 0; s < S; s++) cr_assert_eq(l3d_kv_cache_create(f.m, CAP, &alone[s]), L3D_OK);
    float *got = malloc(sizeof(float) * S * V), *want = malloc(sizeof(float) * V);
    double *tol = malloc(sizeof(double) * V);
    head_tolerance(f.m, CAP, tol);
    // Step 1: 25 + 12 + 7 = 44 tokens, sequence 2's span cut after 3 of them; sequence 1's
    // prompt goes on in step 2, so it asks no logits. Step 2: generated tokens beside the rest
    // of a prompt and a new one (the spans in another order than the sequences).
    const l3d_decode_span_t step1[] = {{0, 25, 1}, {1, 12, 0}, {2, 7, 1}};
    const l3d_decode_span_t step2[] = {{3, 30, 1}, {0, 1, 1}, {1, 5, 1}, {2, 1, 1}, {4, 2, 0}};
    const l3d_decode_span_t *steps[2] = {step1, step2};
    const int n_spans[2] = {3, 5};
    double worst = 0.0;
    for (int st = 0; st < 2; st++) {
        int32_t t[CAP * S], nt = 0;
        const l3d_decode_span_t *sp = steps[st];
        for (int j = 0; j < n_spans[st]; j++) {
            int pos = l3d_kv_cache_seq_len(all, sp[j].seq);
            memcpy(t + nt, tok[sp[j].seq] + pos, sizeof(int32_t) * (size_t)sp[j].n);
            nt += sp[j].n;
        }
        cr_assert_eq(l3d_model_decode_spans(f.m, all, sp, n_spans[st], t, got), L3D_OK, "%s",
                     l3d_ctx_last_error(f.ctx));
        for (int j = 0, t0 = 0, row = 0; j < n_spans[st]; t0 += sp[j++].n) {
            cr_assert_eq(l3d_model_decode(f.m, alone[sp[j].seq], t + t0, sp[j].n, want), L3D_OK);
            cr_assert_eq(l3d_kv_cache_seq_len(all, sp[j].seq),
                         l3d_kv_cache_len(alone[sp[j].seq]));
            if (!sp[j].logits) continue;
            for (int v = 0; v < V; v++) {
                double d = fabs((double)got[(size_t)row * V + v] - want[v]);
                worst = fmax(worst, d / tol[v]);
                cr_assert_leq(d, tol[v], "step %d span %d logit %d: mixed %.9g, alone %.9g",
                              st + 1, j, v, got[(size_t)row * V + v], want[v]);
            }
            row++;
        }
    }
    cr_log_info("largest difference: %.3g of the bound", worst);
    // Misuse is a status, and feeds nothing.
    int32_t two[2] = {0, 0};
    const l3d_decode_span_t empty = {0, 0, 1}, dup[2] = {{1, 1, 1}, {1, 1, 1}},
                            over = {0, CAP, 1}, out = {S, 1, 1};
    cr_assert_eq(l3d_model_decode_spans(f.m, all, &empty, 1, two, got), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_decode_spans(f.m, all, dup, 2, two, got), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_decode_spans(f.m, all, &over, 1, tok[0], got), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_decode_spans(f.m, all, &out, 1, two, got), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_decode_spans(f.m, all, step1, 0, two, got), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_kv_cache_seq_len(all, 0), 26);
    for (int s = 0; s < S; s++) l3d_kv_cache_destroy(alone[s]);
    l3d_kv_cache_destroy(all);
    free(tol);
    free(got);
    free(want);
    close_model(&f);
}
