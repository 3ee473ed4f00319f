// The serving engine (include/llama3d/serve.h): continuous batching over one model's KV cache.
//
// A step, on the engine's thread: (1) under the lock, the cancelled and the late leave the
// queue and the slots, and queued requests take free slots; (2) one pass over the weights
// (l3d_model_decode_spans) feeds every slot holding a sampled token that token, and at most
// one chunk of prompt tokens over the prefilling slots in turn (round robin), so a long prompt
// costs the running streams one chunk's time per token, not the whole prompt, and short
// prompts that arrive together start together (vLLM's chunked prefill, llama-server's mixed
// batch); (3) each generating slot, and each whose prompt is now in, samples its next token
// from its row of logits. Events go out without the lock held. Only the engine's thread
// touches the cache, the slots' tokens and the samplers; other threads queue, cancel and read
// counters under the lock.
//
// Prefix reuse (llama-server's prompt cache): a free slot keeps the tokens its cache holds, and
// a new request takes the free slot sharing the longest prefix with its prompt, truncates the
// cache there and feeds only the rest (at least one token: the logits come from feeding).
// defines: l3d_engine_*, l3d_engine_hist_bounds
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/model/model_internal.h"
#include "llama3d/serve.h"
#include "platform/platform.h"

const double l3d_engine_hist_bounds[L3D_ENGINE_HIST_BUCKETS] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, INFINITY};

typedef struct req {
    struct req *next;  // the queue's link
    uint64_t id;
    int32_t *prompt, *stops;
    int n_prompt, n_stops, max_tokens, top_logprobs;
    l3d_sampler_t *sampler;
    double t_submit, deadline, t_start, t_first, t_last;  // deadline 0: none
    l3d_gen_callback_fn cb;
    void *user;
    int cancel;  // asked by l3d_engine_cancel (under the lock)
} req_t;

typedef struct slot {
    req_t *r;         // the running request (changed under the lock); NULL: free
    int32_t *toks;    // what the cache holds for this sequence (ctx_size)
    int n_toks;       // = l3d_kv_cache_seq_len(cache, slot)
    int fed;          // prompt tokens in the cache: prefilling while fed < n_prompt
    int cached;       // of those, reused from the previous request
    int generated;    // tokens sampled
    int32_t next;     // sampled, not yet fed (-1: none)
    uint64_t used;    // when it last finished (least recently used among equals)
} slot_t;

struct l3d_engine {
    l3d_ctx_t *ctx;
    l3d_engine_backend_t be;  // what decodes: the model and its cache (l3d_engine_create), or
    void *be_arg;             // a caller's layout (l3d_engine_create_backend)
    l3d_model_t *m;           // (l3d_engine_create's; NULL otherwise)
    l3d_kv_cache_t *cache;    // (l3d_engine_create's; NULL otherwise)
    int V, n_slots, ctx_size, queue_max, chunk;
    slot_t *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    req_t *qhead, *qtail;
    int nq, running, stopping, stop_cancel, prefill_next;
    uint64_t next_id, clock;
    float *logits;    // (n_slots, V)
    l3d_decode_span_t *spans;  // (n_slots) a step's spans: the slots and their token counts
    int32_t *batch;   // (n_slots + chunk) and their tokens
    int32_t top_ids[L3D_GEN_TOP_MAX];
    float top_lp[L3D_GEN_TOP_MAX];
    l3d_engine_stats_t st;  // counters (under the lock)
};

static void say(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t cap, const char *fmt, ...) {
    if (!why || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}

static void hist_add(uint64_t *count, double *sum, double v) {
    int b = 0;
    while (b < L3D_ENGINE_HIST_BUCKETS - 1 && v > l3d_engine_hist_bounds[b]) b++;
    count[b]++;
    *sum += v;
}

static void req_free(l3d_engine_t *e, req_t *r) {
    if (!r) return;
    l3d_sampler_destroy(r->sampler);
    l3d_free(e->ctx, r->prompt, (size_t)r->n_prompt * sizeof(int32_t), "other");
    if (r->stops) l3d_free(e->ctx, r->stops, (size_t)r->n_stops * sizeof(int32_t), "other");
    l3d_free(e->ctx, r, sizeof(*r), "other");
}

// ---- lifetime ----------------------------------------------------------------------------------
// The backend of l3d_engine_create: the whole model and the engine's own cache.
static l3d_status model_decode_spans(void *arg, const l3d_decode_span_t *sp, int n,
                                     const int32_t *t, float *lg) {
    l3d_engine_t *e = arg;
    return l3d_model_decode_spans(e->m, e->cache, sp, n, t, lg);
}
static l3d_status model_truncate(void *arg, int seq, int keep) {
    l3d_engine_t *e = arg;
    return l3d_kv_cache_seq_truncate(e->cache, seq, keep);
}

l3d_status l3d_engine_create(l3d_model_t *m, const l3d_engine_params_t *p, l3d_engine_t **e_p) {
    if (!m || !p || !e_p)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_engine_create: NULL %s",
                         !m ? "model" : !p ? "params" : "engine_p");
    const l3d_model_config_t *cfg = l3d_model_config(m);
    l3d_engine_backend_t be = {model_decode_spans, model_truncate, NULL,
                               cfg->vocab_size, cfg->max_position_embeddings};
    L3D_CHECK(m->ctx, l3d_engine_create_backend(m->ctx, &be, NULL, p, e_p));
    l3d_engine_t *e = *e_p;
    e->m = m;
    e->be_arg = e;
    l3d_status st = l3d_kv_cache_create_seqs(m, e->n_slots, e->ctx_size, &e->cache);
    if (st < 0) {
        l3d_engine_destroy(e);
        *e_p = NULL;
    }
    return st;
}

l3d_status l3d_engine_create_backend(l3d_ctx_t *ctx, const l3d_engine_backend_t *be, void *arg,
                                     const l3d_engine_params_t *p, l3d_engine_t **e_p) {
    if (!ctx || !be || !p || !e_p || !be->decode_spans || !be->truncate ||
        be->vocab_size < 1)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_engine_create: NULL argument or an "
                         "incomplete backend");
    *e_p = NULL;
    if (p->slots < 1 || p->slots > L3D_KV_MAX_SEQS)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "engine: slots %d must be in [1, %d]",
                         p->slots, L3D_KV_MAX_SEQS);
    if (p->ctx_size < 2 || p->ctx_size > be->max_positions)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "engine: ctx_size %d must be in [2, %d] "
                         "(the model's max_position_embeddings)", p->ctx_size,
                         be->max_positions);
    if (p->queue_max < 0 || p->prefill_chunk < 0)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "engine: queue_max %d and prefill_chunk %d "
                         "must be >= 0", p->queue_max, p->prefill_chunk);
    l3d_engine_t *e = l3d_calloc(ctx, 1, sizeof(*e), "other");
    if (!e) return L3D_ERR_NOMEM;
    e->ctx = ctx, e->be = *be, e->be_arg = arg, e->V = be->vocab_size, e->n_slots = p->slots;
    e->ctx_size = p->ctx_size, e->queue_max = p->queue_max;
    e->chunk = p->prefill_chunk ? p->prefill_chunk : 256;
    e->next_id = 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->st.slots = e->n_slots, e->st.ctx_size = e->ctx_size;
    e->st.kv_capacity = (int64_t)e->n_slots * e->ctx_size;
    e->slots = l3d_calloc(ctx, (size_t)e->n_slots, sizeof(slot_t), "other");
    e->logits = l3d_malloc(ctx, (size_t)e->n_slots * (size_t)e->V * sizeof(float), "other");
    e->spans = l3d_malloc(ctx, (size_t)e->n_slots * sizeof(l3d_decode_span_t), "other");
    e->batch = l3d_malloc(ctx, (size_t)(e->n_slots + e->chunk) * sizeof(int32_t), "other");
    l3d_status st = e->slots && e->logits && e->spans && e->batch ? L3D_OK : L3D_ERR_NOMEM;
    for (int i = 0; st >= 0 && i < e->n_slots; i++) {
        e->slots[i].next = -1;
        e->slots[i].toks = l3d_malloc(ctx, (size_t)e->ctx_size * sizeof(int32_t), "other");
        if (!e->slots[i].toks) st = L3D_ERR_NOMEM;
    }
    if (st < 0) {
        l3d_engine_destroy(e);
        return st;
    }
    *e_p = e;
    return L3D_OK;
}

static void end_all(l3d_engine_t *e, l3d_gen_finish_t why);

void l3d_engine_destroy(l3d_engine_t *e) {
    if (!e) return;
    if (e->slots) end_all(e, L3D_GEN_CANCELLED);
    l3d_ctx_t *ctx = e->ctx;
    for (int i = 0; e->slots && i < e->n_slots; i++)
        if (e->slots[i].toks)
            l3d_free(ctx, e->slots[i].toks, (size_t)e->ctx_size * sizeof(int32_t), "other");
    if (e->slots) l3d_free(ctx, e->slots, (size_t)e->n_slots * sizeof(slot_t), "other");
    if (e->logits) l3d_free(ctx, e->logits, (size_t)e->n_slots * (size_t)e->V * sizeof(float), "other");
    if (e->spans) l3d_free(ctx, e->spans, (size_t)e->n_slots * sizeof(l3d_decode_span_t), "other");
    if (e->batch)
        l3d_free(ctx, e->batch, (size_t)(e->n_slots + e->chunk) * sizeof(int32_t), "other");
    l3d_kv_cache_destroy(e->cache);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    l3d_free(ctx, e, sizeof(*e), "other");
}

// ---- submit, cancel ----------------------------------------------------------------------------
static int32_t *copy_ids(l3d_ctx_t *ctx, const int32_t *ids, int n) {
    int32_t *c = l3d_malloc(ctx, (size_t)(n ? n : 1) * sizeof(int32_t), "other");
    if (c && n) memcpy(c, ids, (size_t)n * sizeof(int32_t));
    return c;
}

l3d_status l3d_engine_submit(l3d_engine_t *e, const l3d_gen_request_t *q, uint64_t *id_p,
                             char *why, size_t why_cap) {
    if (why && why_cap) why[0] = 0;
    if (!e || !q || !q->callback || (!q->prompt && q->n_prompt)) {
        say(why, why_cap, "l3d_engine_submit: NULL %s",
            !e ? "engine" : !q ? "request" : !q->callback ? "callback" : "prompt");
        return L3D_ERR_INVALID_ARG;
    }
    if (q->n_prompt < 1 || q->n_prompt > e->ctx_size - 1) {
        say(why, why_cap, "the prompt has %d tokens; a slot holds %d (prompt and answer: at "
            "most %d prompt tokens)", q->n_prompt, e->ctx_size, e->ctx_size - 1);
        return L3D_ERR_INVALID_ARG;
    }
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= e->V) {
            say(why, why_cap, "prompt token %d is %d, outside the vocabulary [0, %d)", i,
                (int)q->prompt[i], e->V);
            return L3D_ERR_INVALID_ARG;
        }
    if (q->max_tokens < 1 || q->top_logprobs < -1 || q->top_logprobs > L3D_GEN_TOP_MAX ||
        q->n_stop_tokens < 0 || (q->n_stop_tokens && !q->stop_tokens) || !(q->timeout_s >= 0)) {
        say(why, why_cap, "max_tokens %d must be >= 1, top_logprobs %d in [-1, %d], timeout "
            "%g >= 0", q->max_tokens, q->top_logprobs, L3D_GEN_TOP_MAX, q->timeout_s);
        return L3D_ERR_INVALID_ARG;
    }
    req_t *r = l3d_calloc(e->ctx, 1, sizeof(*r), "other");
    if (!r) return L3D_ERR_NOMEM;
    r->n_prompt = q->n_prompt, r->n_stops = q->n_stop_tokens, r->max_tokens = q->max_tokens;
    r->top_logprobs = q->top_logprobs, r->cb = q->callback, r->user = q->user;
    r->prompt = copy_ids(e->ctx, q->prompt, q->n_prompt);
    r->stops = q->n_stop_tokens ? copy_ids(e->ctx, q->stop_tokens, q->n_stop_tokens) : NULL;
    l3d_status st = !r->prompt || (q->n_stop_tokens && !r->stops) ? L3D_ERR_NOMEM : L3D_OK;
    if (st >= 0) st = l3d_sampler_create(e->ctx, e->V, &q->sampling, &r->sampler);
    if (st < 0) {
        if (st == L3D_ERR_INVALID_ARG) say(why, why_cap, "sampling: %s", l3d_ctx_last_error(e->ctx));
        req_free(e, r);
        return st;
    }
    r->t_submit = l3d_time_now();
    r->deadline = q->timeout_s > 0 ? r->t_submit + q->timeout_s : 0;
    pthread_mutex_lock(&e->mu);
    if (e->stopping) st = L3D_ERR_CANCELLED;
    // (waiting beyond the free slots: queue_max at most)
    else if (e->nq >= e->n_slots - e->running + e->queue_max) st = L3D_ERR_BUSY;
    if (st >= 0) {
        r->id = e->next_id++;
        if (e->qtail) e->qtail->next = r;
        else e->qhead = r;
        e->qtail = r;
        e->nq++;
        e->st.queued = e->nq;
        e->st.prompt_tokens += (uint64_t)r->n_prompt;
        if (id_p) *id_p = r->id;
        pthread_cond_signal(&e->cv);
    }
    int nq = e->nq;
    pthread_mutex_unlock(&e->mu);
    if (st < 0) {
        if (st == L3D_ERR_BUSY)
            say(why, why_cap, "the queue is full (%d waiting, %d slots busy)", nq, e->n_slots);
        else
            say(why, why_cap, "the engine is shutting down");
        req_free(e, r);
    }
    return st;
}

l3d_status l3d_engine_cancel(l3d_engine_t *e, uint64_t id) {
    if (!e) return L3D_ERR_INVALID_ARG;
    l3d_status st = L3D_ERR_NOT_FOUND;
    pthread_mutex_lock(&e->mu);
    for (req_t *r = e->qhead; r && st < 0; r = r->next)
        if (r->id == id) r->cancel = 1, st = L3D_OK;
    for (int i = 0; i < e->n_slots && st < 0; i++)
        if (e->slots[i].r && e->slots[i].r->id == id) e->slots[i].r->cancel = 1, st = L3D_OK;
    if (st >= 0) pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return st;
}

void l3d_engine_stop(l3d_engine_t *e, int cancel) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    if (cancel) e->stop_cancel = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void l3d_engine_get_stats(l3d_engine_t *e, l3d_engine_stats_t *out) {
    if (!e || !out) return;
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    int64_t used = 0;
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].r) used += e->slots[i].n_toks;
    out->kv_used = used;
    out->queued = e->nq, out->running = e->running;
    pthread_mutex_unlock(&e->mu);
}

// ---- events ------------------------------------------------------------------------------------
// The token's log-probability under the model's own logits (log softmax, in double), and the n
// likeliest tokens' (ties: the lower id first), into the engine's top arrays.
static float logprobs(l3d_engine_t *e, const float *row, int32_t tok, int n) {
    int V = e->V;
    float mx = row[0];
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - mx);
    double lse = mx + log(sum);
    int k = 0;
    for (int i = 0; i < V && n > 0; i++) {
        if (k == n && !(row[i] > row[e->top_ids[k - 1]])) continue;
        int j = k < n ? k++ : n - 1;  // insertion: shift the smaller ones down
        while (j > 0 && row[i] > row[e->top_ids[j - 1]]) {
            e->top_ids[j] = e->top_ids[j - 1];
            j--;
        }
        e->top_ids[j] = i;
    }
    for (int j = 0; j < k; j++) e->top_lp[j] = (float)(row[e->top_ids[j]] - lse);
    return (float)(row[tok] - lse);
}

// Delivers one event of slot s's request; returns the callback's verdict.
static int deliver(l3d_engine_t *e, slot_t *s, int32_t tok, float lp, int n_top,
                   l3d_gen_finish_t fin) {
    req_t *r = s->r;
    l3d_gen_event_t ev = {.id = r->id,
                          .token = tok,
                          .logprob = lp,
                          .n_top = n_top,
                          .top_ids = e->top_ids,
                          .top_logprobs = e->top_lp,
                          .finish = fin,
                          .prompt_tokens = r->n_prompt,
                          .cached_tokens = s->cached,
                          .generated = s->generated,
                          .t_queued = r->t_start > 0 ? r->t_start - r->t_submit : 0,
                          .t_first = r->t_first > 0 ? r->t_first - r->t_submit : 0};
    return r->cb(r->user, &ev);
}

// Ends slot s's request with its last event (unless `delivered`: that event went out with the
// token) and frees the slot, which keeps its tokens for the next request's prefix.
static void finish_slot(l3d_engine_t *e, slot_t *s, l3d_gen_finish_t fin, int delivered) {
    req_t *r = s->r;
    if (!delivered) (void)deliver(e, s, -1, 0.0f, 0, fin);
    pthread_mutex_lock(&e->mu);
    s->r = NULL;
    s->next = -1;
    s->used = ++e->clock;
    e->running--;
    e->st.finished[fin]++;
    pthread_mutex_unlock(&e->mu);
    req_free(e, r);
}

// A queued request that never ran: its one event.
static void finish_queued(l3d_engine_t *e, req_t *r, l3d_gen_finish_t fin) {
    l3d_gen_event_t ev = {.id = r->id, .token = -1, .finish = fin, .prompt_tokens = r->n_prompt};
    (void)r->cb(r->user, &ev);
    pthread_mutex_lock(&e->mu);
    e->st.finished[fin]++;
    pthread_mutex_unlock(&e->mu);
    req_free(e, r);
}

static int is_stop(const req_t *r, int32_t t) {
    for (int i = 0; i < r->n_stops; i++)
        if (r->stops[i] == t) return 1;
    return 0;
}

// Slot s's next token from its logits row: sampled, delivered, and either kept to be fed or
// the request's end.
static l3d_status take_token(l3d_engine_t *e, slot_t *s, const float *row) {
    req_t *r = s->r;
    int32_t t;
    L3D_CHECK(e->ctx, l3d_sampler_sample(r->sampler, row, &t));
    s->generated++;
    double now = l3d_time_now();
    pthread_mutex_lock(&e->mu);
    e->st.generated_tokens++;
    if (r->t_first == 0) {
        r->t_first = now;
        hist_add(e->st.ttft_count, &e->st.ttft_sum, now - r->t_submit);
    } else {
        hist_add(e->st.itl_count, &e->st.itl_sum, now - r->t_last);
    }
    pthread_mutex_unlock(&e->mu);
    r->t_last = now;
    if (is_stop(r, t)) {
        finish_slot(e, s, L3D_GEN_STOP, 0);
        return L3D_OK;
    }
    int n_top = r->top_logprobs > 0 ? r->top_logprobs : 0;
    float lp = r->top_logprobs >= 0 ? logprobs(e, row, t, n_top) : 0.0f;
    // (the token needs a position of its own only if another one follows it)
    int full = s->generated >= r->max_tokens || s->n_toks >= e->ctx_size;
    int v = deliver(e, s, t, lp, n_top, full ? L3D_GEN_LENGTH : L3D_GEN_RUNNING);
    if (full) finish_slot(e, s, L3D_GEN_LENGTH, 1);
    else if (v == L3D_GEN_SAY_STOP) finish_slot(e, s, L3D_GEN_STOP, 0);
    else if (v != L3D_GEN_CONTINUE) finish_slot(e, s, L3D_GEN_CANCELLED, 0);
    else s->next = t;
    return L3D_OK;
}

// Every running request ends with `why` (a model failure, a cancelling stop, destroy), and
// every queued one.
static void end_all(l3d_engine_t *e, l3d_gen_finish_t why) {
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].r) {
            finish_slot(e, &e->slots[i], why, 0);
            // (a failed pass leaves the cache's contents unknown: nothing is reused)
            if (why == L3D_GEN_ERROR) {
                e->slots[i].n_toks = 0;
                (void)e->be.truncate(e->be_arg, i, 0);
            }
        }
    pthread_mutex_lock(&e->mu);
    req_t *q = e->qhead;
    e->qhead = e->qtail = NULL;
    e->nq = 0;
    e->st.queued = 0;
    pthread_mutex_unlock(&e->mu);
    while (q) {
        req_t *n = q->next;
        finish_queued(e, q, why == L3D_GEN_ERROR ? L3D_GEN_CANCELLED : why);
        q = n;
    }
}

// ---- the step ----------------------------------------------------------------------------------
// The free slot whose tokens share the longest prefix with r's prompt (ties: least recently
// used); -1 when none is free. *keep_p: the prefix to keep (at least one prompt token is fed).
static int pick_slot(const l3d_engine_t *e, const req_t *r, int *keep_p) {
    int best = -1, best_lcp = -1;
    for (int i = 0; i < e->n_slots; i++) {
        const slot_t *s = &e->slots[i];
        if (s->r) continue;
        int n = s->n_toks < r->n_prompt ? s->n_toks : r->n_prompt, lcp = 0;
        while (lcp < n && s->toks[lcp] == r->prompt[lcp]) lcp++;
        if (lcp > best_lcp || (lcp == best_lcp && s->used < e->slots[best].used))
            best = i, best_lcp = lcp;
    }
    if (best >= 0) *keep_p = best_lcp < r->n_prompt ? best_lcp : r->n_prompt - 1;
    return best;
}

static l3d_status admit(l3d_engine_t *e, slot_t *s, int keep) {
    req_t *r = s->r;
    L3D_CHECK(e->ctx, e->be.truncate(e->be_arg, (int)(s - e->slots), keep));
    s->n_toks = keep;
    s->fed = keep;
    s->cached = keep;
    s->generated = 0;
    s->next = -1;
    r->t_start = l3d_time_now();
    for (int i = 0; i < r->n_prompt; i++)  // the prompt counts for the penalties (llama.cpp)
        L3D_CHECK(e->ctx, l3d_sampler_accept(r->sampler, r->prompt[i]));
    return L3D_OK;
}

l3d_status l3d_engine_step(l3d_engine_t *e, int *busy_p) {
    if (!e) return L3D_ERR_INVALID_ARG;
    double now = l3d_time_now();
    // (what changes under the lock is told after it; at most STEP_MAX admissions and ends a
    // step, the rest the next)
    enum { STEP_MAX = 64 };
    req_t *gone = NULL;
    int newly[STEP_MAX], n_new = 0, keep[STEP_MAX];
    l3d_gen_finish_t slot_end[STEP_MAX];
    int n_end = 0, end_at[STEP_MAX];
    pthread_mutex_lock(&e->mu);
    int cancel_all = e->stop_cancel;
    // the queue: the cancelled and the late leave it; the head takes a free slot
    for (req_t **pp = &e->qhead; *pp;) {
        req_t *r = *pp;
        int late = r->deadline > 0 && now > r->deadline;
        if (r->cancel || late || cancel_all) {
            *pp = r->next;
            r->next = gone;
            r->cancel = late && !r->cancel && !cancel_all ? L3D_GEN_TIMEOUT : L3D_GEN_CANCELLED;
            gone = r;
            e->nq--;
        } else {
            pp = &r->next;
        }
    }
    e->qtail = NULL;
    for (req_t *r = e->qhead; r; r = r->next) e->qtail = r;
    while (e->qhead && n_new < STEP_MAX) {
        int k;
        int i = pick_slot(e, e->qhead, &k);
        if (i < 0) break;
        req_t *r = e->qhead;
        e->qhead = r->next;
        if (!e->qhead) e->qtail = NULL;
        r->next = NULL;
        e->nq--;
        e->slots[i].r = r;
        e->running++;
        e->st.prompt_tokens_cached += (uint64_t)k;
        newly[n_new] = i, keep[n_new++] = k;
    }
    e->st.queued = e->nq;
    // running requests cancelled or late
    for (int i = 0; i < e->n_slots && n_end < STEP_MAX; i++) {
        req_t *r = e->slots[i].r;
        if (!r) continue;
        int late = r->deadline > 0 && now > r->deadline;
        if (r->cancel || late || cancel_all) {
            end_at[n_end] = i;
            slot_end[n_end++] = r->cancel || cancel_all ? L3D_GEN_CANCELLED : L3D_GEN_TIMEOUT;
        }
    }
    pthread_mutex_unlock(&e->mu);

    while (gone) {
        req_t *n = gone->next;
        finish_queued(e, gone, (l3d_gen_finish_t)gone->cancel);
        gone = n;
    }
    l3d_status st = L3D_OK;
    for (int j = 0; j < n_new; j++) {
        slot_t *s = &e->slots[newly[j]];
        l3d_status a = admit(e, s, keep[j]);
        if (a < 0) {  // (only misuse or no memory: this request alone fails)
            s->n_toks = 0;
            finish_slot(e, s, L3D_GEN_ERROR, 0);
            if (st >= 0) st = a;
        }
    }
    for (int j = 0; j < n_end; j++)
        if (e->slots[end_at[j]].r) finish_slot(e, &e->slots[end_at[j]], slot_end[j], 0);

    // One pass: the generating slots' tokens, then up to one chunk of prompt tokens over the
    // prefilling slots in turn (short prompts arriving together share a step; a long one takes
    // the whole chunk). Only a span that ends its prompt asks for logits.
    int ns = 0, nt = 0;
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].r && e->slots[i].next >= 0) {
            e->spans[ns++] = (l3d_decode_span_t){i, 1, 1};
            e->batch[nt++] = e->slots[i].next;
        }
    int budget = e->chunk, first = e->prefill_next;
    for (int k = 0; k < e->n_slots && budget > 0; k++) {
        int i = (first + k) % e->n_slots;
        slot_t *s = &e->slots[i];
        if (!s->r || s->fed >= s->r->n_prompt) continue;
        int n = s->r->n_prompt - s->fed;
        n = n < budget ? n : budget;
        budget -= n;
        // (the next step starts after this slot, or with it while its prompt is not done)
        e->prefill_next = s->fed + n < s->r->n_prompt ? i : (i + 1) % e->n_slots;
        e->spans[ns++] = (l3d_decode_span_t){i, n, s->fed + n == s->r->n_prompt};
        memcpy(e->batch + nt, s->r->prompt + s->fed, (size_t)n * sizeof(int32_t));
        nt += n;
    }
    if (st >= 0 && ns > 0) st = e->be.decode_spans(e->be_arg, e->spans, ns, e->batch, e->logits);
    for (int j = 0, t = 0, row = 0; j < ns && st >= 0; t += e->spans[j++].n) {
        slot_t *s = &e->slots[e->spans[j].seq];
        memcpy(s->toks + s->n_toks, e->batch + t, (size_t)e->spans[j].n * sizeof(int32_t));
        s->n_toks += e->spans[j].n;
        if (s->next >= 0)
            s->next = -1;
        else
            s->fed += e->spans[j].n;
        if (e->spans[j].logits) st = take_token(e, s, e->logits + (size_t)row++ * e->V);
    }
    if (st < 0) end_all(e, L3D_GEN_ERROR);
    if (busy_p) {
        pthread_mutex_lock(&e->mu);
        *busy_p = e->nq > 0 || e->running > 0;
        pthread_mutex_unlock(&e->mu);
    }
    return st;
}

l3d_status l3d_engine_run(l3d_engine_t *e) {
    if (!e) return L3D_ERR_INVALID_ARG;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int idle = 0;
        while (!e->stopping && e->nq == 0 && e->running == 0 && !idle) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            idle = pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT;
        }
        int done = e->stopping && e->nq == 0 && e->running == 0;
        pthread_mutex_unlock(&e->mu);
        if (done) return L3D_OK;
        if (idle) {
            if (e->be.keepalive) L3D_CHECK(e->ctx, e->be.keepalive(e->be_arg));
            continue;
        }
        l3d_status st = l3d_engine_step(e, NULL);
        // (a failed pass ended its requests; the engine serves on)
        if (st < 0 && st != L3D_ERR_INVALID_ARG && st != L3D_ERR_NOMEM) return st;
    }
}
