// bench_sampler: tokens/s of the sampler at Llama 3's vocabulary (128256), the chain of
// core/model/sampler.c against the sampler it replaced (top-p by one argmax pass per kept id).
// Usage: bench_sampler [SECONDS per cell, default 1]
//
// The logits are N(0, sigma^2) draws: sigma 2 gives a flat, high-entropy distribution (a
// nucleus of tens of thousands of ids, the old sampler's worst case), sigma 5 a peaked one.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama3d/llama3d.h"
#include "platform/platform.h"

#define V 128256

// ---- the old sampler, verbatim in its logic (core/model/sampler.c before the chain) -------------
typedef struct {
    float temperature, top_p;
    uint64_t state;
    float *prob;
    int32_t *order;
} old_t;

static double old_uniform(old_t *s) {
    uint64_t x = (s->state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (double)(x >> 11) * 0x1.0p-53;
}

static int32_t old_sample(old_t *s, const float *logits) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (s->temperature == 0.0f) return best;
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        s->prob[i] = expf((logits[i] - logits[best]) / s->temperature);
        sum += s->prob[i];
    }
    for (int i = 0; i < V; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (s->top_p < 1.0f) {
        double mass = 0.0;
        int n = 0;
        while (mass < s->top_p && n < V) {
            int arg = -1;
            for (int i = 0; i < V; i++) {
                if (s->prob[i] < 0.0f) continue;
                if (arg < 0 || s->prob[i] > s->prob[arg]) arg = i;
            }
            s->order[n++] = arg;
            mass += s->prob[arg];
            s->prob[arg] = -s->prob[arg] - 1.0f;
        }
        double total = 0.0;
        for (int k = 0; k < n; k++) total += -(s->prob[s->order[k]] + 1.0f);
        double u = old_uniform(s) * total, acc = 0.0;
        for (int k = 0; k < n; k++) {
            acc += -(s->prob[s->order[k]] + 1.0f);
            if (u < acc) return s->order[k];
        }
        return s->order[n - 1];
    }
    double u = old_uniform(s), acc = 0.0;
    for (int i = 0; i < V; i++) {
        acc += s->prob[i];
        if (u < acc) return i;
    }
    return V - 1;
}

// ---- timing ---------------------------------------------------------------------------------
static float *make_logits(double sigma, uint64_t seed) {
    float *l = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) {  // Box-Muller on a splitmix stream
        old_t r = {.state = seed + (uint64_t)i * 2};
        double u1 = old_uniform(&r) + 1e-300, u2 = old_uniform(&r);
        l[i] = (float)(sigma * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    return l;
}

// Tokens per second over at least `secs` (and at least one token).
static double time_old(const float *l, float t, float top_p, double secs) {
    old_t s = {.temperature = t, .top_p = top_p, .state = 1};
    s.prob = malloc(sizeof(float) * V);
    s.order = malloc(sizeof(int32_t) * V);
    int n = 0;
    double t0 = l3d_time_now(), dt;
    volatile int32_t sink = 0;
    do {
        sink += old_sample(&s, l);
        n++;
        dt = l3d_time_now() - t0;
    } while (dt < secs);
    (void)sink;
    free(s.prob);
    free(s.order);
    return n / dt;
}

static double time_new(l3d_ctx_t *ctx, const float *l, const l3d_sampler_params_t *p,
                       double secs) {
    l3d_sampler_t *s = NULL;
    if (l3d_sampler_create(ctx, V, p, &s) < 0) {
        fprintf(stderr, "bench_sampler: %s\n", l3d_ctx_last_error(ctx));
        exit(1);
    }
    int n = 0;
    double t0 = l3d_time_now(), dt;
    do {
        int32_t tok;
        if (l3d_sampler_sample(s, l, &tok) < 0) {
            fprintf(stderr, "bench_sampler: %s\n", l3d_ctx_last_error(ctx));
            exit(1);
        }
        n++;
        dt = l3d_time_now() - t0;
    } while (dt < secs);
    l3d_sampler_destroy(s);
    return n / dt;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    if (!(secs > 0)) {
        fprintf(stderr, "usage: bench_sampler [SECONDS per cell]\n");
        return 2;
    }
    l3d_ctx_t *ctx = NULL;
    if (l3d_ctx_create(NULL, &ctx) < 0) return 1;
    printf("vocabulary %d, at least %.2f s per cell, tokens/s\n\n", V, secs);
    printf("| logits | chain | old tok/s | new tok/s | ratio |\n|---|---|---|---|---|\n");
    const double sigmas[] = {2.0, 5.0};
    for (int si = 0; si < 2; si++) {
        float *l = make_logits(sigmas[si], 42);
        l3d_sampler_params_t p;
        // The old sampler's chains: greedy, and temperature 0.8 + top-p 0.95.
        l3d_sampler_params_default(&p);
        p.temperature = 0.0f;
        double o = time_old(l, 0.0f, 1.0f, secs), n = time_new(ctx, l, &p, secs);
        printf("| N(0,%g) | greedy | %.1f | %.1f | %.2f |\n", sigmas[si], o, n, n / o);
        l3d_sampler_params_default(&p);
        p.top_k = 0;
        p.min_p = 0.0f;
        o = time_old(l, 0.8f, 0.95f, secs);
        n = time_new(ctx, l, &p, secs);
        printf("| N(0,%g) | T 0.8, top-p 0.95 | %.2f | %.1f | %.0f |\n", sigmas[si], o, n, n / o);
        l3d_sampler_params_default(&p);  // the new default chain has no old counterpart
        n = time_new(ctx, l, &p, secs);
        printf("| N(0,%g) | defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05) | - | %.1f | - |\n",
               sigmas[si], n);
        free(l);
    }
    l3d_ctx_destroy(ctx);
    return 0;
}
