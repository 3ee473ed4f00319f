// The sampler chain (include/llama3d/sampler.h): penalties, greedy or temperature, top-k,
// top-p, min-p, then a draw.
//
// Speed at a 128k vocabulary: one pass over the logits validates and copies them, one more
// puts each id into a bucket by its distance below the largest logit (and, for top-p without
// top-k, sums each bucket's probability mass). Walking the buckets from the top tells how
// many buckets hold every id the filters can keep, those ids are gathered, and they alone
// are sorted: one sort per token, of tens to a few thousand ids rather than the vocabulary.
// The bucket of a logit is a monotone function of it, so the gathered set is always a prefix
// of the full descending order (ties share a bucket).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/l3d_core.h"
#include "core/model/sampler_internal.h"

#define BUCKETS 1024
#define BUCKETS_PER_UNIT 32.0f  // of (max - logit) / T: the buckets cover exp() down to e^-32

typedef struct cand {
    float logit;  // penalised
    float p;      // exp((logit - max) / T), unnormalised (the top one is 1)
    int32_t id;
} cand_t;

struct l3d_sampler {
    l3d_ctx_t *ctx;
    int V;
    l3d_sampler_params_t p;
    uint64_t state;
    float *logit;   // (V) the penalised copy
    cand_t *cand;   // (V) gathered candidates
    int32_t *ring;  // (penalty_last_n) accepted tokens, oldest overwritten first
    int32_t *tmp;   // (penalty_last_n) sorted copy of the ring
    int n_ring, ring_next;
    double bmass[BUCKETS];
    int bcount[BUCKETS];
};

void l3d_sampler_params_default(l3d_sampler_params_t *p) {
    if (!p) return;
    *p = (l3d_sampler_params_t){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                .repeat_penalty = 1.0f, .frequency_penalty = 0.0f,
                                .presence_penalty = 0.0f, .penalty_last_n = 64, .seed = 1};
}

static l3d_status check_params(l3d_ctx_t *ctx, int V, const l3d_sampler_params_t *p) {
    const char *what = NULL;
    double v = 0;
    if (!(p->temperature >= 0.0f && p->temperature <= 1e30f)) what = "temperature (>= 0)", v = p->temperature;
    else if (p->top_k < 0) what = "top_k (>= 0)", v = p->top_k;
    else if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) what = "top_p (in (0, 1])", v = p->top_p;
    else if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) what = "min_p (in [0, 1])", v = p->min_p;
    else if (!(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty)))
        what = "repeat_penalty (> 0)", v = p->repeat_penalty;
    else if (!isfinite(p->frequency_penalty))
        what = "frequency_penalty (finite)", v = p->frequency_penalty;
    else if (!isfinite(p->presence_penalty))
        what = "presence_penalty (finite)", v = p->presence_penalty;
    else if (p->penalty_last_n < 0) what = "penalty_last_n (>= 0)", v = p->penalty_last_n;
    if (what) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "sampler: %s is %g", what, v);
    if (V < 1) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "sampler: vocab_size %d < 1", V);
    return L3D_OK;
}

l3d_status l3d_sampler_create(l3d_ctx_t *ctx, int V, const l3d_sampler_params_t *params,
                              l3d_sampler_t **s_p) {
    if (!ctx || !params || !s_p)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_sampler_create: NULL %s",
                         !ctx ? "ctx" : !params ? "params" : "sampler_p");
    *s_p = NULL;
    L3D_CHECK(ctx, check_params(ctx, V, params));
    l3d_sampler_t *s = l3d_calloc(ctx, 1, sizeof(*s), "other");
    if (!s) return L3D_ERR_NOMEM;
    s->ctx = ctx;
    s->V = V;
    s->p = *params;
    s->state = params->seed;
    size_t n = (size_t)params->penalty_last_n;
    s->logit = l3d_malloc(ctx, (size_t)V * sizeof(float), "other");
    s->cand = l3d_malloc(ctx, (size_t)V * sizeof(cand_t), "other");
    if (n) {
        s->ring = l3d_malloc(ctx, n * sizeof(int32_t), "other");
        s->tmp = l3d_malloc(ctx, n * sizeof(int32_t), "other");
    }
    if (!s->logit || !s->cand || (n && (!s->ring || !s->tmp))) {
        l3d_sampler_destroy(s);
        return L3D_ERR_NOMEM;
    }
    *s_p = s;
    return L3D_OK;
}

void l3d_sampler_destroy(l3d_sampler_t *s) {
    if (!s) return;
    size_t n = (size_t)s->p.penalty_last_n;
    l3d_free(s->ctx, s->tmp, n * sizeof(int32_t), "other");
    l3d_free(s->ctx, s->ring, n * sizeof(int32_t), "other");
    l3d_free(s->ctx, s->cand, (size_t)s->V * sizeof(cand_t), "other");
    l3d_free(s->ctx, s->logit, (size_t)s->V * sizeof(float), "other");
    l3d_free(s->ctx, s, sizeof(*s), "other");
}

l3d_status l3d_sampler_accept(l3d_sampler_t *s, int32_t token) {
    if (!s) return l3d_error(NULL, L3D_ERR_INVALID_ARG, "l3d_sampler_accept: NULL sampler");
    if (token < 0 || token >= s->V)
        return l3d_error(s->ctx, L3D_ERR_INVALID_ARG, "sampler: accepted token %d is outside "
                         "the vocabulary [0, %d)", (int)token, s->V);
    int n = s->p.penalty_last_n;
    if (!n) return L3D_OK;
    s->ring[s->ring_next] = token;
    s->ring_next = (s->ring_next + 1) % n;
    if (s->n_ring < n) s->n_ring++;
    return L3D_OK;
}

l3d_status l3d_sampler_reset(l3d_sampler_t *s) {
    if (!s) return l3d_error(NULL, L3D_ERR_INVALID_ARG, "l3d_sampler_reset: NULL sampler");
    s->n_ring = s->ring_next = 0;
    s->state = s->p.seed;
    return L3D_OK;
}

static double next_uniform(l3d_sampler_t *s) {  // splitmix64 -> [0, 1)
    uint64_t x = (s->state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (double)(x >> 11) * 0x1.0p-53;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// Descending logit, then ascending id: a total order, so the sort is deterministic.
static int cmp_cand(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

// Penalties over the window, once per distinct token (the window is sorted, then run-length
// counted: at most penalty_last_n entries, so it costs nothing next to the vocabulary pass).
static int apply_penalties(l3d_sampler_t *s) {
    const l3d_sampler_params_t *p = &s->p;
    if (!s->n_ring ||
        (p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f))
        return 0;
    memcpy(s->tmp, s->ring, (size_t)s->n_ring * sizeof(int32_t));
    qsort(s->tmp, (size_t)s->n_ring, sizeof(int32_t), cmp_i32);
    for (int i = 0; i < s->n_ring;) {
        int j = i;
        while (j < s->n_ring && s->tmp[j] == s->tmp[i]) j++;
        float *l = &s->logit[s->tmp[i]];
        if (*l > 0.0f) *l /= p->repeat_penalty;
        else *l *= p->repeat_penalty;
        *l -= (float)(j - i) * p->frequency_penalty + p->presence_penalty;
        i = j;
    }
    return 1;
}

static float max_logit(const float *l, int V) {
    float m = -INFINITY;
    for (int i = 0; i < V; i++) m = l[i] > m ? l[i] : m;
    return m;
}

static inline int bucket_of(float l, float max, float scale) {
    float b = (max - l) * scale;  // monotone in l; -inf logits give +inf, the last bucket
    return b < (float)(BUCKETS - 1) ? (int)b : BUCKETS - 1;
}

// Runs the chain up to the draw: s->cand[0..*n_p) are then the kept ids with their
// unnormalised probabilities, in descending order (in id order when nothing filters).
static l3d_status run_chain(l3d_sampler_t *s, const float *logits, int *n_p) {
    const int V = s->V;
    const l3d_sampler_params_t *p = &s->p;
    // Copy and validate: NaN and +inf fail `x <= FLT_MAX`; -inf is a masked token.
    int bad = 0;
    float max = -INFINITY;
    for (int i = 0; i < V; i++) {
        float x = logits[i];
        s->logit[i] = x;
        bad |= !(x <= 3.40282347e38f);
        max = x > max ? x : max;
    }
    if (bad) {
        int i = 0;
        while (logits[i] <= 3.40282347e38f) i++;
        return l3d_error(s->ctx, L3D_ERR_INVALID_ARG, "sampler: logit %d is %g", i,
                         (double)logits[i]);
    }
    if (apply_penalties(s)) max = max_logit(s->logit, V);
    if (max == -INFINITY)
        return l3d_error(s->ctx, L3D_ERR_INVALID_ARG, "sampler: every logit is -inf");
    const float inv_t = 1.0f / p->temperature;
    if (p->temperature == 0.0f || !isfinite(inv_t)) {  // greedy (a denormal T is too)
        int i = 0;
        while (s->logit[i] != max) i++;
        s->cand[0] = (cand_t){.logit = max, .p = 1.0f, .id = i};
        *n_p = 1;
        return L3D_OK;
    }
    const int top_k = p->top_k > 0 && p->top_k < V ? p->top_k : 0;
    const int by_mass = !top_k && p->top_p < 1.0f;
    if (!top_k && !by_mass && p->min_p == 0.0f) {  // no filter: the whole softmax, no sort
        for (int i = 0; i < V; i++)
            s->cand[i] = (cand_t){.logit = s->logit[i],
                                  .p = expf((s->logit[i] - max) * inv_t), .id = i};
        *n_p = V;
        return L3D_OK;
    }
    // Bucket pass: counts, and masses when top-p decides the cut.
    const float scale = inv_t * BUCKETS_PER_UNIT;
    memset(s->bcount, 0, sizeof(s->bcount));
    double z = 0.0;
    if (by_mass) {
        memset(s->bmass, 0, sizeof(s->bmass));
        for (int i = 0; i < V; i++) {
            int b = bucket_of(s->logit[i], max, scale);
            double e = expf((s->logit[i] - max) * inv_t);
            s->bcount[b]++;
            s->bmass[b] += e;
            z += e;
        }
    } else {
        for (int i = 0; i < V; i++) s->bcount[bucket_of(s->logit[i], max, scale)]++;
    }
    // The last bucket to gather: enough ids for top-k, or enough mass for top-p, and never a
    // bucket whose largest possible probability (e^(-b / BUCKETS_PER_UNIT)) is below min_p
    // (one bucket of margin for rounding). That last cut is not made when top-p follows top-k:
    // top-p renormalises over all k ids, so all of them must be gathered.
    const int cut_min_p = p->min_p > 0.0f && !(top_k && p->top_p < 1.0f);
    int last = 0, count = 0;
    double mass = 0.0;
    for (; last < BUCKETS; last++) {
        if (cut_min_p && last > 1 && expf(-(float)(last - 1) / BUCKETS_PER_UNIT) < p->min_p) {
            last--;
            break;
        }
        count += s->bcount[last];
        mass += s->bmass[last];
        if (top_k && count >= top_k) break;
        // One bucket more than the sums say: their order of addition differs from the
        // sorted prefix below, and that rounding must not lose the last id.
        if (by_mass && mass >= (double)p->top_p * z) {
            if (last + 1 < BUCKETS) last++;
            break;
        }
    }
    if (last >= BUCKETS) last = BUCKETS - 1;
    int n = 0;
    for (int i = 0; i < V; i++) {
        float l = s->logit[i];
        if (bucket_of(l, max, scale) <= last)
            s->cand[n++] = (cand_t){.logit = l, .p = expf((l - max) * inv_t), .id = i};
    }
    qsort(s->cand, (size_t)n, sizeof(cand_t), cmp_cand);
    if (top_k && n > top_k) n = top_k;
    if (p->top_p < 1.0f) {
        double kept = 0.0, acc = 0.0;
        for (int i = 0; i < n; i++) kept += s->cand[i].p;
        // With top-k off the gathered set is a prefix of the whole order: renormalise by the
        // whole vocabulary's mass z, as the full softmax would.
        double total = top_k ? kept : z;
        for (int i = 0; i < n; i++) {
            acc += s->cand[i].p;
            if (acc >= (double)p->top_p * total) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        float floor_p = p->min_p * s->cand[0].p;
        int i = 1;
        while (i < n && s->cand[i].p >= floor_p) i++;
        n = i;
    }
    *n_p = n;
    return L3D_OK;
}

l3d_status l3d_sampler_sample(l3d_sampler_t *s, const float *logits, int32_t *token_p) {
    if (!s || !logits || !token_p)
        return l3d_error(s ? s->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_sampler_sample: NULL %s",
                         !s ? "sampler" : !logits ? "logits" : "token_p");
    int n = 0;
    L3D_CHECK(s->ctx, run_chain(s, logits, &n));
    int32_t pick = s->cand[n - 1].id;
    if (n > 1) {  // greedy draws nothing: the stream is the same with or without it
        double total = 0.0;
        for (int i = 0; i < n; i++) total += s->cand[i].p;
        double u = next_uniform(s) * total, acc = 0.0;
        for (int i = 0; i < n; i++) {
            acc += s->cand[i].p;
            if (u < acc) {
                pick = s->cand[i].id;
                break;
            }
        }
    }
    *token_p = pick;
    return l3d_sampler_accept(s, pick);
}

l3d_status l3d_sampler_kept(l3d_sampler_t *s, const float *logits, int32_t *ids, float *probs,
                            int *n_p) {
    if (!s || !logits || !ids || !probs || !n_p)
        return l3d_error(s ? s->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_sampler_kept: NULL");
    int n = 0;
    L3D_CHECK(s->ctx, run_chain(s, logits, &n));
    for (int i = 0; i < n; i++) {
        ids[i] = s->cand[i].id;
        probs[i] = s->cand[i].p;
    }
    *n_p = n;
    return L3D_OK;
}

// ---- stop strings ------------------------------------------------------------------------
l3d_status l3d_stop_strings_find(const char *const *stops, int n_stops, const char *text,
                                 size_t len, size_t *stop_at_p, size_t *safe_len_p) {
    if (n_stops < 0 || (n_stops && !stops) || (len && !text) || !stop_at_p || !safe_len_p)
        return l3d_error(NULL, L3D_ERR_INVALID_ARG, "l3d_stop_strings_find: NULL argument or "
                         "n_stops %d < 0", n_stops);
    for (int k = 0; k < n_stops; k++)
        if (!stops[k] || !stops[k][0])
            return l3d_error(NULL, L3D_ERR_INVALID_ARG, "l3d_stop_strings_find: stop string %d "
                             "is %s", k, stops[k] ? "empty" : "NULL");
    size_t stop_at = len;
    for (int k = 0; k < n_stops; k++) {
        size_t sl = strlen(stops[k]);
        for (size_t i = 0; i + sl <= len && i < stop_at; i++)
            if (text[i] == stops[k][0] && memcmp(text + i, stops[k], sl) == 0) {
                stop_at = i;
                break;
            }
    }
    // Hold back the longest tail of text[0..stop_at) that is a proper prefix of a stop string.
    size_t safe = stop_at;
    for (int k = 0; k < n_stops && stop_at == len; k++) {
        size_t sl = strlen(stops[k]);
        for (size_t t = L3D_MIN(sl - 1, len); t > 0; t--) {
            if (memcmp(text + len - t, stops[k], t) == 0) {  // the longest such tail
                safe = L3D_MIN(safe, len - t);
                break;
            }
        }
    }
    *stop_at_p = stop_at;
    *safe_len_p = safe;
    return L3D_OK;
}
