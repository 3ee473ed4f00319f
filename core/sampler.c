// Token sampling for generation: greedy, temperature, nucleus (top-p).
#include <math.h>

#include "core/l3d_core.h"
#include "llama3d/model.h"

struct l3d_sampler {
    l3d_ctx_t *ctx;
    int V;
    float temperature, top_p;
    uint64_t state;
    float *prob;    // (V)
    int32_t *order; // (V) ids sorted by probability
};

l3d_status l3d_sampler_create(l3d_ctx_t *ctx, int V, float temperature, float top_p,
                              uint64_t seed, l3d_sampler_t **s_p) {
    if (V < 1 || !(temperature >= 0.0f) || !(top_p > 0.0f && top_p <= 1.0f))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "sampler: temperature %g must be >= 0 and "
                         "top_p %g in (0, 1]", temperature, top_p);
    l3d_sampler_t *s = l3d_calloc(ctx, 1, sizeof(*s), "other");
    if (!s) return L3D_ERR_NOMEM;
    s->ctx = ctx;
    s->V = V;
    s->temperature = temperature;
    s->top_p = top_p;
    s->state = seed;
    s->prob = l3d_malloc(ctx, (size_t)V * sizeof(float), "other");
    s->order = l3d_malloc(ctx, (size_t)V * sizeof(int32_t), "other");
    if (!s->prob || !s->order) {
        l3d_sampler_destroy(s);
        return L3D_ERR_NOMEM;
    }
    *s_p = s;
    return L3D_OK;
}

void l3d_sampler_destroy(l3d_sampler_t *s) {
    if (!s) return;
    l3d_free(s->ctx, s->order, (size_t)s->V * sizeof(int32_t), "other");
    l3d_free(s->ctx, s->prob, (size_t)s->V * sizeof(float), "other");
    l3d_free(s->ctx, s, sizeof(*s), "other");
}

static double next_uniform(l3d_sampler_t *s) {  // splitmix64 -> [0, 1)
    uint64_t x = (s->state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (double)(x >> 11) * 0x1.0p-53;
}

int32_t l3d_sampler_sample(l3d_sampler_t *s, const float *logits) {
    int V = s->V;
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
    int n = V;
    if (s->top_p < 1.0f) {
        // Take ids in descending probability (lowest id first on ties) until their mass
        // reaches top_p: selection is O(V k) for the k kept ids, small for a useful top_p.
        double mass = 0.0;
        n = 0;
        while (mass < s->top_p && n < V) {
            int arg = -1;
            for (int i = 0; i < V; i++) {
                if (s->prob[i] < 0.0f) continue;  // already taken
                if (arg < 0 || s->prob[i] > s->prob[arg]) arg = i;
            }
            s->order[n++] = arg;
            mass += s->prob[arg];
            s->prob[arg] = -s->prob[arg] - 1.0f;  // mark taken, keep the value recoverable
        }
        double total = 0.0;
        for (int k = 0; k < n; k++) total += -(s->prob[s->order[k]] + 1.0f);
        double u = next_uniform(s) * total, acc = 0.0;
        int32_t pick = s->order[n - 1];
        for (int k = 0; k < n; k++) {
            acc += -(s->prob[s->order[k]] + 1.0f);
            if (u < acc) {
                pick = s->order[k];
                break;
            }
        }
        return pick;
    }
    double u = next_uniform(s), acc = 0.0;
    for (int i = 0; i < V; i++) {
        acc += s->prob[i];
        if (u < acc) return i;
    }
    return V - 1;
}
