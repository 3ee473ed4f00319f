// The sampler chain against a brute force (every id sorted, probabilities in double), its
// draws against the exact distribution (chi-square), penalties against hand-computed values,
// determinism, misuse, and the stop-string helper.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model/sampler_internal.h"
#include "llama3d/llama3d.h"

#define L3D_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static l3d_ctx_t *new_ctx(void) {
    l3d_ctx_t *ctx = NULL;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    return ctx;
}

static l3d_sampler_params_t plain(float t, int k, float top_p, float min_p) {
    l3d_sampler_params_t p;
    l3d_sampler_params_default(&p);
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.penalty_last_n = 0;
    return p;
}

static uint64_t rng_state;
static double urand(void) {  // the test's own stream (xorshift64*), independent of the sampler's
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}

// ---- the brute force: the contract of include/llama3d/sampler.h, step by step --------------
static const float *g_l;
static int cmp_desc(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (g_l[x] != g_l[y]) return g_l[x] > g_l[y] ? -1 : 1;
    return x - y;
}
// Kept ids (in descending order) and their probabilities renormalised over the kept set.
static int reference(const float *l, int V, const l3d_sampler_params_t *p, int *ids, double *q) {
    int *ord = malloc(sizeof(int) * (size_t)V);
    for (int i = 0; i < V; i++) ord[i] = i;
    g_l = l;
    qsort(ord, (size_t)V, sizeof(int), cmp_desc);
    double mx = l[ord[0]];
    int n = V;
    if (p->temperature == 0.0f) {
        n = 1;
    } else {
        double *e = malloc(sizeof(double) * (size_t)V);
        for (int i = 0; i < V; i++) e[i] = exp(((double)l[ord[i]] - mx) / p->temperature);
        if (p->top_k > 0 && p->top_k < n) n = p->top_k;
        if (p->top_p < 1.0f) {
            double tot = 0, acc = 0;
            for (int i = 0; i < n; i++) tot += e[i];
            for (int i = 0; i < n; i++) {
                acc += e[i];
                if (acc >= p->top_p * tot) {
                    n = i + 1;
                    break;
                }
            }
        }
        if (p->min_p > 0.0f) {
            int i = 1;
            while (i < n && e[i] >= p->min_p * e[0]) i++;
            n = i;
        }
        double tot = 0;
        for (int i = 0; i < n; i++) tot += e[i];
        for (int i = 0; i < n; i++) q[i] = e[i] / tot;
        free(e);
    }
    if (p->temperature == 0.0f) q[0] = 1.0;
    for (int i = 0; i < n; i++) ids[i] = ord[i];
    free(ord);
    return n;
}

// The sampler's kept set equals the brute force's, member for member, and the probabilities
// agree: float expf of a float argument (|arg| <= 88) against double exp is within 88 * 2^-24
// (argument rounding) + 2^-23 (expf) ~ 6e-6 relative; renormalising adds sums of n floats,
// float-rounded each, 2^-24 relative. 2e-5 leaves a factor of 3.
static void check_kept(l3d_ctx_t *ctx, const float *l, int V, const l3d_sampler_params_t *p,
                       const char *what) {
    l3d_sampler_t *s = NULL;
    cr_assert_eq(l3d_sampler_create(ctx, V, p, &s), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)V);
    float *pr = malloc(sizeof(float) * (size_t)V);
    int *rid = malloc(sizeof(int) * (size_t)V);
    double *rq = malloc(sizeof(double) * (size_t)V);
    int n = 0;
    cr_assert_eq(l3d_sampler_kept(s, l, ids, pr, &n), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    int rn = reference(l, V, p, rid, rq);
    cr_assert_eq(n, rn, "%s (V %d T %g k %d top_p %g min_p %g): kept %d ids, brute force %d", what,
                 V, p->temperature, p->top_k, p->top_p, p->min_p, n, rn);
    // The sampler lists ids in id order when nothing filters: compare as sets by id.
    int unordered = n == V && p->temperature > 0;
    double tot = 0;
    for (int i = 0; i < n; i++) tot += pr[i];
    for (int i = 0; i < n; i++) {
        int j = i;
        if (unordered) {
            for (j = 0; j < n && rid[j] != ids[i]; j++) {}
            cr_assert_lt(j, n, "%s: id %d kept but not by the brute force", what, ids[i]);
        } else {
            cr_assert_eq(ids[i], rid[i], "%s: kept[%d] is %d, brute force %d", what, i, ids[i],
                         rid[i]);
        }
        double got = pr[i] / tot;
        cr_assert_leq(fabs(got - rq[j]), 2e-5 * rq[j] + 1e-300, "%s: id %d p %.9g, want %.9g",
                      what, ids[i], got, rq[j]);
    }
    free(rq);
    free(rid);
    free(pr);
    free(ids);
    l3d_sampler_destroy(s);
}

Test(sampler, kept_sets_match_the_brute_force) {
    l3d_ctx_t *ctx = new_ctx();
    const int sizes[] = {1, 2, 7, 300, 5000};
    const float temps[] = {0.0f, 0.3f, 1.0f, 2.5f};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 1e-6f};
    const float min_ps[] = {0.0f, 0.05f, 0.5f, 1.0f};
    rng_state = 0x1234567;
    char what[128];
    for (size_t vi = 0; vi < L3D_ARRAY_LEN(sizes); vi++) {
        int V = sizes[vi];
        float *l = malloc(sizeof(float) * (size_t)V);
        for (int rep = 0; rep < 3; rep++) {
            // rep 0: spread-out logits; 1: quantised to 0.5 (many ties); 2: a few -inf masks.
            for (int i = 0; i < V; i++) {
                double g = sqrt(-2 * log(urand() + 1e-300)) * cos(6.283185307 * urand());
                l[i] = (float)(3.0 * g);
                if (rep == 1) l[i] = roundf(l[i] * 2.0f) / 2.0f;
                if (rep == 2 && i % 3 == 1) l[i] = -INFINITY;
            }
            for (size_t t = 0; t < L3D_ARRAY_LEN(temps); t++)
                for (size_t a = 0; a < L3D_ARRAY_LEN(top_ps); a++)
                    for (size_t b = 0; b < L3D_ARRAY_LEN(min_ps); b++) {
                        const int ks[] = {0, 1, 5, V - 1, V, V + 5};
                        for (size_t k = 0; k < L3D_ARRAY_LEN(ks); k++) {
                            if (ks[k] < 0) continue;
                            l3d_sampler_params_t p = plain(temps[t], ks[k], top_ps[a], min_ps[b]);
                            snprintf(what, sizeof(what), "case %zu.%d", vi, rep);
                            check_kept(ctx, l, V, &p, what);
                        }
                    }
        }
        free(l);
    }
    l3d_ctx_destroy(ctx);
}

// Llama 3's vocabulary size with the default chain and with top-p alone (the case the old
// argmax-per-kept-token selection made 0.1 tokens/s).
Test(sampler, kept_sets_at_llama3_vocabulary) {
    l3d_ctx_t *ctx = new_ctx();
    const int V = 128256;
    float *l = malloc(sizeof(float) * V);
    rng_state = 99;
    for (int i = 0; i < V; i++)
        l[i] = (float)(2.0 * sqrt(-2 * log(urand() + 1e-300)) * cos(6.283185307 * urand()));
    l3d_sampler_params_t p;
    l3d_sampler_params_default(&p);
    check_kept(ctx, l, V, &p, "defaults");
    p = plain(1.0f, 0, 0.9f, 0.0f);
    check_kept(ctx, l, V, &p, "top_p 0.9");
    p = plain(0.7f, 0, 1.0f, 0.01f);
    check_kept(ctx, l, V, &p, "min_p 0.01");
    p = plain(1.0f, 1000, 0.99f, 0.0f);
    check_kept(ctx, l, V, &p, "top_k 1000, top_p 0.99");
    free(l);
    l3d_ctx_destroy(ctx);
}

// Chi-square upper quantile by Wilson-Hilferty: X ~ df (1 - 2/(9df) + z sqrt(2/(9df)))^3, z the
// standard normal quantile. z = 4.753 is the 1 - 1e-6 point: a correct sampler exceeds the
// bound with probability about 1e-6 (the seed is fixed, so the outcome is too; the bound is
// what makes it a fair check rather than a tuned one). Its error at df >= 3 is below 1%.
static double chi2_bound(int df) {
    double a = 2.0 / (9.0 * df);
    double c = 1.0 - a + 4.753 * sqrt(a);
    return df * c * c * c;
}

static void check_distribution(const float *l, int V, const l3d_sampler_params_t *p, int draws) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_sampler_t *s = NULL;
    cr_assert_eq(l3d_sampler_create(ctx, V, p, &s), L3D_OK);
    int *rid = malloc(sizeof(int) * (size_t)V);
    double *rq = malloc(sizeof(double) * (size_t)V);
    long *count = calloc((size_t)V, sizeof(long));
    int n = reference(l, V, p, rid, rq);
    for (int d = 0; d < draws; d++) {
        int32_t t = -1;
        cr_assert_eq(l3d_sampler_sample(s, l, &t), L3D_OK);
        cr_assert(t >= 0 && t < V);
        count[t]++;
    }
    long inside = 0;
    double chi2 = 0;
    for (int i = 0; i < n; i++) {
        double e = rq[i] * draws, o = (double)count[rid[i]];
        inside += count[rid[i]];
        chi2 += (o - e) * (o - e) / e;
    }
    cr_assert_eq(inside, draws, "%ld of %d draws fell outside the kept set", draws - inside, draws);
    // Every expected count is >= 5 here (the textbook condition for the chi-square law).
    for (int i = 0; i < n; i++) cr_assert_geq(rq[i] * draws, 5.0);
    double bound = chi2_bound(n - 1);
    cr_assert_lt(chi2, bound, "chi-square %g over %d categories, bound %g", chi2, n, bound);
    free(count);
    free(rq);
    free(rid);
    l3d_sampler_destroy(s);
    l3d_ctx_destroy(ctx);
}

static const float k_logits[12] = {1.0f, 2.5f, 0.3f, -1.0f, 2.0f, 1.7f,
                                   0.0f, 3.0f, -0.5f, 1.2f, 2.2f, 0.8f};

Test(sampler, draws_follow_the_softmax) {
    l3d_sampler_params_t p = plain(1.0f, 0, 1.0f, 0.0f);
    check_distribution(k_logits, 12, &p, 40000);
}
Test(sampler, draws_follow_the_filtered_softmax) {
    l3d_sampler_params_t p = plain(0.7f, 8, 0.9f, 0.0f);
    check_distribution(k_logits, 12, &p, 40000);
    p = plain(1.5f, 0, 0.8f, 0.0f);
    check_distribution(k_logits, 12, &p, 40000);
    p = plain(1.0f, 0, 1.0f, 0.2f);
    check_distribution(k_logits, 12, &p, 40000);
}

Test(sampler, greedy_takes_the_lowest_id_of_the_largest) {
    l3d_ctx_t *ctx = new_ctx();
    float l[6] = {1, 4, 2, 4, -INFINITY, 0};
    l3d_sampler_params_t p = plain(0.0f, 40, 0.95f, 0.05f);
    l3d_sampler_t *s = NULL;
    cr_assert_eq(l3d_sampler_create(ctx, 6, &p, &s), L3D_OK);
    for (int i = 0; i < 3; i++) {
        int32_t t = -1;
        cr_assert_eq(l3d_sampler_sample(s, l, &t), L3D_OK);
        cr_assert_eq(t, 1);
    }
    l3d_sampler_destroy(s);
    l3d_ctx_destroy(ctx);
}

// Penalties, by hand: logits {2, -1, 0.5, 3, -2, 0}, window of the last 5 accepted tokens
// [0 | 1 3 3 3 5] (token 0 left it), repeat 2, frequency 0.5, presence 0.25:
//   token 1 (c=1): -1 * 2 - (0.5 + 0.25)   = -2.75
//   token 3 (c=3):  3 / 2 - (1.5 + 0.25)   = -0.25
//   token 5 (c=1):  0 * 2 - (0.5 + 0.25)   = -0.75   (0 is not positive: multiplied)
//   tokens 0, 2, 4 unchanged: 2, 0.5, -2.
// The largest is then token 0 (2), not token 3: greedy picks 0.
Test(sampler, penalties_match_hand_computed_values) {
    l3d_ctx_t *ctx = new_ctx();
    const float l[6] = {2, -1, 0.5f, 3, -2, 0};
    const double want[6] = {2, -2.75, 0.5, -0.25, -2, -0.75};
    l3d_sampler_params_t p = plain(1.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.penalty_last_n = 5;
    l3d_sampler_t *s = NULL;
    cr_assert_eq(l3d_sampler_create(ctx, 6, &p, &s), L3D_OK);
    const int32_t acc[6] = {0, 1, 3, 3, 3, 5};
    for (int i = 0; i < 6; i++) cr_assert_eq(l3d_sampler_accept(s, acc[i]), L3D_OK);
    int32_t ids[6];
    float pr[6];
    int n = 0;
    cr_assert_eq(l3d_sampler_kept(s, l, ids, pr, &n), L3D_OK);
    cr_assert_eq(n, 6);
    // T = 1, no filter: p_i = exp(l_i - max) with max = 2 (token 0), in id order.
    for (int i = 0; i < 6; i++) {
        double e = exp(want[ids[i]] - 2.0);
        cr_assert_leq(fabs(pr[i] - e), 1e-6 * e, "token %d: p %.9g, want exp(%g - 2) = %.9g",
                      ids[i], pr[i], want[ids[i]], e);
    }
    l3d_sampler_destroy(s);
    // Greedy under the same penalties picks token 0; without them, token 3.
    p.temperature = 0.0f;
    cr_assert_eq(l3d_sampler_create(ctx, 6, &p, &s), L3D_OK);
    for (int i = 0; i < 6; i++) cr_assert_eq(l3d_sampler_accept(s, acc[i]), L3D_OK);
    int32_t t = -1;
    cr_assert_eq(l3d_sampler_sample(s, l, &t), L3D_OK);
    cr_assert_eq(t, 0);
    cr_assert_eq(l3d_sampler_reset(s), L3D_OK);  // the window is forgotten
    cr_assert_eq(l3d_sampler_sample(s, l, &t), L3D_OK);
    cr_assert_eq(t, 3);
    l3d_sampler_destroy(s);
    l3d_ctx_destroy(ctx);
}

// The sampled token enters the window by itself: with a strong presence penalty, greedy over
// flat logits walks through every id once before repeating one.
Test(sampler, sampled_tokens_are_accepted) {
    l3d_ctx_t *ctx = new_ctx();
    float l[4] = {0, 0, 0, 0};
    l3d_sampler_params_t p = plain(0.0f, 0, 1.0f, 0.0f);
    p.presence_penalty = 1.0f;
    p.penalty_last_n = 3;
    l3d_sampler_t *s = NULL;
    cr_assert_eq(l3d_sampler_create(ctx, 4, &p, &s), L3D_OK);
    const int32_t want[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    for (int i = 0; i < 8; i++) {
        int32_t t = -1;
        cr_assert_eq(l3d_sampler_sample(s, l, &t), L3D_OK);
        cr_assert_eq(t, want[i], "step %d: %d, want %d", i, t, want[i]);
    }
    l3d_sampler_destroy(s);
    l3d_ctx_destroy(ctx);
}

static void draw_run(uint64_t seed, int32_t *out, int n, l3d_sampler_t **keep) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_sampler_params_t p;
    l3d_sampler_params_default(&p);
    p.seed = seed;
    p.repeat_penalty = 1.3f;
    l3d_sampler_t *s = NULL;
    cr_assert_eq(l3d_sampler_create(ctx, 1000, &p, &s), L3D_OK);
    float *l = malloc(sizeof(float) * 1000);
    for (int i = 0; i < n; i++) {
        for (int v = 0; v < 1000; v++) l[v] = (float)((v * 7919 + i * 104729) % 1000) / 250.0f;
        cr_assert_eq(l3d_sampler_sample(s, l, &out[i]), L3D_OK);
    }
    free(l);
    if (keep) {
        *keep = s;
        return;
    }
    l3d_sampler_destroy(s);
    l3d_ctx_destroy(ctx);
}

Test(sampler, the_stream_is_a_function_of_the_seed) {
    int32_t a[200], b[200], c[200];
    draw_run(7, a, 200, NULL);
    draw_run(7, b, 200, NULL);
    draw_run(8, c, 200, NULL);
    cr_assert_arr_eq(a, b, sizeof(a), "the same seed gave different tokens");
    cr_assert(memcmp(a, c, sizeof(a)) != 0, "seeds 7 and 8 gave the same 200 tokens");
    // reset: the same sampler replays the stream.
    l3d_sampler_t *s = NULL;
    draw_run(7, c, 200, &s);
    cr_assert_eq(l3d_sampler_reset(s), L3D_OK);
    float *l = malloc(sizeof(float) * 1000);
    for (int i = 0; i < 200; i++) {
        for (int v = 0; v < 1000; v++) l[v] = (float)((v * 7919 + i * 104729) % 1000) / 250.0f;
        int32_t t = -1;
        cr_assert_eq(l3d_sampler_sample(s, l, &t), L3D_OK);
        cr_assert_eq(t, a[i], "after reset, step %d: %d, want %d", i, t, a[i]);
    }
    free(l);
    l3d_sampler_destroy(s);  // its ctx is leaked on purpose: the test process ends here
}

Test(sampler, misuse_is_a_status) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_sampler_params_t ok;
    l3d_sampler_params_default(&ok);
    l3d_sampler_t *s = NULL;
    cr_assert_eq(l3d_sampler_create(NULL, 10, &ok, &s), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_create(ctx, 10, NULL, &s), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_create(ctx, 10, &ok, NULL), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_create(ctx, 0, &ok, &s), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_create(ctx, -5, &ok, &s), L3D_ERR_INVALID_ARG);
    l3d_sampler_params_t bad[13];
    for (int i = 0; i < 13; i++) bad[i] = ok;
    bad[0].temperature = NAN;
    bad[1].temperature = -0.1f;
    bad[2].top_k = -1;
    bad[3].top_p = 0.0f;
    bad[4].top_p = 1.5f;
    bad[5].top_p = NAN;
    bad[6].min_p = -0.1f;
    bad[7].min_p = NAN;
    bad[8].repeat_penalty = 0.0f;
    bad[9].repeat_penalty = INFINITY;
    bad[10].frequency_penalty = NAN;
    bad[11].presence_penalty = -INFINITY;
    bad[12].penalty_last_n = -1;
    for (int i = 0; i < 13; i++) {
        s = NULL;
        cr_assert_eq(l3d_sampler_create(ctx, 10, &bad[i], &s), L3D_ERR_INVALID_ARG, "case %d", i);
        cr_assert_null(s);
        cr_assert(strstr(l3d_ctx_last_error(ctx), "sampler:"), "case %d: %s", i,
                  l3d_ctx_last_error(ctx));
    }
    cr_assert_eq(l3d_sampler_create(ctx, 4, &ok, &s), L3D_OK);
    float l[4] = {0, 1, 2, 3};
    int32_t t = 0;
    cr_assert_eq(l3d_sampler_sample(NULL, l, &t), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_sample(s, NULL, &t), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_sample(s, l, NULL), L3D_ERR_INVALID_ARG);
    float nan_l[4] = {0, NAN, 2, 3}, inf_l[4] = {0, 1, INFINITY, 3};
    float masked[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    cr_assert_eq(l3d_sampler_sample(s, nan_l, &t), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "logit 1"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_sampler_sample(s, inf_l, &t), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "logit 2"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_sampler_sample(s, masked, &t), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_accept(s, -1), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_accept(s, 4), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_accept(NULL, 0), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_reset(NULL), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_sampler_sample(s, l, &t), L3D_OK);  // still usable after the errors
    l3d_sampler_destroy(s);
    l3d_sampler_destroy(NULL);
    l3d_sampler_params_default(NULL);
    l3d_ctx_destroy(ctx);
}

// ---- stop strings ----------------------------------------------------------------------------
static void find(const char *const *stops, int n, const char *text, size_t want_at,
                 size_t want_safe) {
    size_t at = 99, safe = 99;
    cr_assert_eq(l3d_stop_strings_find(stops, n, text, strlen(text), &at, &safe), L3D_OK);
    cr_assert_eq(at, want_at, "'%s': stop at %zu, want %zu", text, at, want_at);
    cr_assert_eq(safe, want_safe, "'%s': safe %zu, want %zu", text, safe, want_safe);
}

Test(stop_strings, found_held_back_or_free) {
    const char *stops[] = {"</s>", "\n\nUser:", "ab"};
    find(stops, 3, "Hello</s> more", 5, 5);
    find(stops, 3, "Hello</", 7, 5);          // may still become "</s>"
    find(stops, 3, "Hello\n\nUs", 9, 5);      // may still become "\n\nUser:"
    find(stops, 3, "Hello world", 11, 11);
    find(stops, 3, "xxab</s>", 2, 2);         // the earliest stop wins
    find(stops, 3, "a", 1, 0);
    find(stops, 3, "", 0, 0);
    find(stops, 0, "anything</s>", 12, 12);
}

// Streaming: pieces arrive one by one; what is shown is never part of a stop string and, at
// the end, is exactly the text before it.
Test(stop_strings, a_stop_split_across_pieces) {
    const char *stops[] = {"<|eot_id|>"};
    const char *pieces[] = {"The answer", " is 4.", "<|e", "ot", "_id", "|>", "ignored"};
    char text[256] = "", shown[256] = "";
    size_t n_shown = 0, at = 0, safe = 0;
    for (size_t i = 0; i < L3D_ARRAY_LEN(pieces); i++) {
        strcat(text, pieces[i]);
        cr_assert_eq(l3d_stop_strings_find(stops, 1, text, strlen(text), &at, &safe), L3D_OK);
        memcpy(shown + n_shown, text + n_shown, safe - n_shown);
        n_shown = safe;
        shown[n_shown] = 0;
        cr_assert_null(strchr(shown, '<'), "piece %zu showed '%s'", i, shown);
        if (at < strlen(text)) break;
    }
    cr_assert_str_eq(shown, "The answer is 4.");
    cr_assert_eq(at, strlen("The answer is 4."));
}

Test(stop_strings, misuse_is_a_status) {
    const char *stops[] = {"x", ""}, *nul[] = {NULL};
    size_t at, safe;
    cr_assert_eq(l3d_stop_strings_find(stops, 2, "abc", 3, &at, &safe), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_stop_strings_find(nul, 1, "abc", 3, &at, &safe), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_stop_strings_find(NULL, 1, "abc", 3, &at, &safe), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_stop_strings_find(stops, -1, "abc", 3, &at, &safe), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_stop_strings_find(stops, 1, NULL, 3, &at, &safe), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_stop_strings_find(stops, 1, "abc", 3, NULL, &safe), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_stop_strings_find(stops, 1, "abc", 3, &at, NULL), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_stop_strings_find(stops, 1, NULL, 0, &at, &safe), L3D_OK);
}
