// The serving engine (include/llama3d/serve.h) on a small random model: requests batched
// together give the tokens each gives alone, a conversation's next turn reuses its prefix,
// prompts longer than a chunk are fed in pieces, and cancel, time limits, a full queue, stop
// tokens and the callback's verdicts end requests with exactly one last event each.
//
// "Alone" is the model decoding one sequence in a cache of its own, greedily (argmax, the
// lowest id on ties, as the sampler's temperature 0). The engine's batched decode computes the
// same logits up to float32 rounding of its GEMMs (tests/test_model.c derives the bound per
// logit, head_tolerance below), so a greedy token may differ only where the alone run's best
// two logits are within twice that bound; the comparison of a request stops there.
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/model/model_internal.h"
#include "llama3d/serve.h"

static l3d_ctx_t *ctx;
static l3d_device_t *dev;
static l3d_model_t *m;

static void setup(void) {
    l3d_model_config_t c;
    memset(&c, 0, sizeof(c));
    snprintf(c.name, sizeof(c.name), "test");
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 50;
    c.max_position_embeddings = 96;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.initializer_range = 0.3f;  // peaked logits: few near-ties
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_device_params_t dp = {.num_threads = 2};
    cr_assert_eq(l3d_device_create(ctx, "cpu", &dp, &dev), L3D_OK);
    cr_assert_eq(l3d_model_create(ctx, dev, &c, &m), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_model_init_weights(m, 21), L3D_OK);
}
static void teardown(void) {
    l3d_model_destroy(m);
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
}
TestSuite(engine, .init = setup, .fini = teardown);

// tests/test_model.c's bound on |batched - alone| for logit v, attention over <= T keys
static double head_tol(int T) {
    const int V = m->V, C = m->C, F = m->F, L = m->L;
    const float *W = m->params + (m->cfg.tie_word_embeddings ? m->embed : m->head);
    double worst = 0;
    for (int v = 0; v < V; v++) {
        double w2 = 0.0;
        for (int k = 0; k < C; k++) w2 += (double)W[(size_t)v * C + k] * W[(size_t)v * C + k];
        worst = fmax(worst, 2.0 * (L * (2.0 * C + F + T) + C) * 0x1p-24 * sqrt((double)C) *
                                sqrt(w2));
    }
    return worst;
}

// A request's events, as a callback sees them.
#define MAXT 96
typedef struct {
    int32_t tok[MAXT];
    float lp[MAXT];
    int n, finals, finish, cached, prompt, generated;
    int stop_after;    // the callback says `verdict` after this many tokens (0: never)
    int verdict;
    pthread_mutex_t *mu;  // (run on another thread: guarded)
} seen_t;

static int on_event(void *user, const l3d_gen_event_t *ev) {
    seen_t *s = user;
    if (s->mu) pthread_mutex_lock(s->mu);
    if (ev->token >= 0) {
        cr_assert_lt(s->n, MAXT);
        s->lp[s->n] = ev->logprob;
        s->tok[s->n++] = ev->token;
    }
    if (ev->finish != L3D_GEN_RUNNING) {
        s->finals++;
        s->finish = ev->finish;
        s->cached = ev->cached_tokens;
        s->prompt = ev->prompt_tokens;
        s->generated = ev->generated;
    }
    int v = s->stop_after && s->n >= s->stop_after && ev->finish == L3D_GEN_RUNNING ? s->verdict
                                                                                   : 0;
    if (s->mu) pthread_mutex_unlock(s->mu);
    return v;
}

static l3d_gen_request_t greedy(const int32_t *p, int n, int max_tokens, seen_t *s) {
    l3d_gen_request_t q = {.prompt = p, .n_prompt = n, .max_tokens = max_tokens,
                           .top_logprobs = -1, .callback = on_event, .user = s};
    l3d_sampler_params_default(&q.sampling);
    q.sampling.temperature = 0.0f;
    return q;
}

static void fill(int32_t *t, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)(3 + (seed >> 8) % (uint32_t)(m->V - 3));
    }
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

// Checks `got` (n tokens) against greedy decoding of the prompt alone; returns how many agree
// before a legitimate near-tie (all of them when none).
static int check_alone(const int32_t *prompt, int np, const int32_t *got, int n, double tol) {
    l3d_kv_cache_t *c = NULL;
    cr_assert_eq(l3d_kv_cache_create(m, np + n + 1, &c), L3D_OK);
    float *lg = malloc(sizeof(float) * m->V);
    cr_assert_eq(l3d_model_decode(m, c, prompt, np, lg), L3D_OK);
    int k = 0;
    for (; k < n; k++) {
        int32_t want = argmax(lg, m->V);
        if (got[k] != want) {
            float gap = lg[want] - lg[got[k]];
            cr_assert_leq(gap, 2 * tol, "token %d: engine %d, alone %d, gap %.3g > 2 x %.3g", k,
                          got[k], want, gap, tol);
            break;
        }
        cr_assert_eq(l3d_model_decode(m, c, &got[k], 1, lg), L3D_OK);
    }
    free(lg);
    l3d_kv_cache_destroy(c);
    return k;
}

static void drain(l3d_engine_t *e) {
    int busy = 1;
    for (int i = 0; busy; i++) {
        cr_assert_lt(i, 10000, "the engine never went idle");
        cr_assert_eq(l3d_engine_step(e, &busy), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    }
}

// Six requests on four slots (two wait in the queue), prompts of 1 to 30 tokens with a chunk
// of 8 (a long prompt is fed over several steps while the others generate): each request's
// tokens are those it gives alone, it ends once with `length` after max_tokens.
Test(engine, batched_streams_equal_alone) {
    l3d_engine_t *e = NULL;
    l3d_engine_params_t p = {.slots = 4, .ctx_size = 64, .queue_max = 2, .prefill_chunk = 8};
    cr_assert_eq(l3d_engine_create(m, &p, &e), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    enum { R = 6, MAXNEW = 12 };
    const int np[R] = {1, 5, 30, 9, 17, 3};
    int32_t prompt[R][32];
    seen_t seen[R];
    memset(seen, 0, sizeof(seen));
    for (int r = 0; r < R; r++) {
        fill(prompt[r], np[r], 40 + (uint32_t)r);
        l3d_gen_request_t q = greedy(prompt[r], np[r], MAXNEW, &seen[r]);
        char why[200];
        cr_assert_eq(l3d_engine_submit(e, &q, NULL, why, sizeof(why)), L3D_OK, "%s", why);
    }
    drain(e);
    double tol = head_tol(64);
    int agreed = 0;
    for (int r = 0; r < R; r++) {
        cr_assert_eq(seen[r].finals, 1);
        cr_assert_eq(seen[r].finish, L3D_GEN_LENGTH);
        cr_assert_eq(seen[r].n, MAXNEW);
        cr_assert_eq(seen[r].generated, MAXNEW);
        cr_assert_eq(seen[r].prompt, np[r]);
        agreed += check_alone(prompt[r], np[r], seen[r].tok, seen[r].n, tol);
    }
    cr_log_info("%d of %d tokens compared before any near-tie", agreed, R * MAXNEW);
    l3d_engine_stats_t st;
    l3d_engine_get_stats(e, &st);
    cr_assert_eq(st.finished[L3D_GEN_LENGTH], R);
    cr_assert_eq(st.generated_tokens, R * MAXNEW);
    cr_assert_eq(st.running + st.queued, 0);
    uint64_t ttft = 0;
    for (int b = 0; b < L3D_ENGINE_HIST_BUCKETS; b++) ttft += st.ttft_count[b];
    cr_assert_eq(ttft, R);
    l3d_engine_destroy(e);
}

// A backend over the model that records what each call feeds.
typedef struct rec {
    l3d_kv_cache_t *c;
    int calls, spans[64], toks[64], logits[64];
} rec_t;
static l3d_status rec_spans(void *arg, const l3d_decode_span_t *sp, int ns, const int32_t *t,
                            float *lg) {
    rec_t *r = arg;
    cr_assert_lt(r->calls, 64);
    r->spans[r->calls] = ns;
    for (int j = 0; j < ns; j++) {
        r->toks[r->calls] += sp[j].n;
        r->logits[r->calls] += sp[j].logits != 0;
    }
    r->calls++;
    return l3d_model_decode_spans(m, r->c, sp, ns, t, lg);
}
static l3d_status rec_truncate(void *arg, int seq, int keep) {
    return l3d_kv_cache_seq_truncate(((rec_t *)arg)->c, seq, keep);
}

// A step is one pass over the weights: the generated tokens and a chunk of prompt tokens go
// to the backend in one call. Prompts of 5, 20 and 3 tokens with a chunk of 8, each request
// in its own slot: step 1 feeds 5 + 3 (the first prompt ends: one logits row), steps 2 and 3
// the first request's token and 8 more of the second prompt, step 4 the token, the second
// prompt's last one and the third prompt (three rows), then the three streams' tokens. The
// tokens are those each request gives alone.
Test(engine, a_step_is_one_pass) {
    rec_t rec;
    memset(&rec, 0, sizeof(rec));
    l3d_engine_params_t p = {.slots = 4, .ctx_size = 64, .queue_max = 0, .prefill_chunk = 8};
    cr_assert_eq(l3d_kv_cache_create_seqs(m, p.slots, p.ctx_size, &rec.c), L3D_OK);
    l3d_engine_backend_t be = {rec_spans, rec_truncate, NULL, m->cfg.vocab_size,
                               m->cfg.max_position_embeddings};
    l3d_engine_t *e = NULL;
    cr_assert_eq(l3d_engine_create_backend(ctx, &be, &rec, &p, &e), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    enum { R = 3, MAXNEW = 6 };
    const int np[R] = {5, 20, 3};
    int32_t prompt[R][20];
    seen_t seen[R];
    memset(seen, 0, sizeof(seen));
    for (int r = 0; r < R; r++) {
        fill(prompt[r], np[r], 70 + (uint32_t)r);
        l3d_gen_request_t q = greedy(prompt[r], np[r], MAXNEW, &seen[r]);
        char why[200];
        cr_assert_eq(l3d_engine_submit(e, &q, NULL, why, sizeof(why)), L3D_OK, "%s", why);
    }
    int steps = 0, busy = 1;
    while (busy) {
        cr_assert_eq(l3d_engine_step(e, &busy), L3D_OK, "%s", l3d_ctx_last_error(ctx));
        cr_assert_eq(rec.calls, ++steps, "step %d made %d calls", steps, rec.calls);
    }
    const int want_spans[5] = {2, 2, 2, 3, 3}, want_toks[5] = {8, 9, 9, 5, 3},
              want_logits[5] = {1, 1, 1, 3, 3};
    for (int k = 0; k < 5; k++)
        cr_assert(rec.spans[k] == want_spans[k] && rec.toks[k] == want_toks[k] &&
                  rec.logits[k] == want_logits[k], "step %d: %d spans, %d tokens, %d logits rows; "
                  "want %d, %d, %d", k + 1, rec.spans[k], rec.toks[k], rec.logits[k],
                  want_spans[k], want_toks[k], want_logits[k]);
    int fed = 0;
    for (int k = 0; k < rec.calls; k++) fed += rec.toks[k];
    // (each request's last token is delivered, never fed)
    cr_assert_eq(fed, 5 + 20 + 3 + R * (MAXNEW - 1));
    double tol = head_tol(64);
    for (int r = 0; r < R; r++) {
        cr_assert_eq(seen[r].n, MAXNEW);
        check_alone(prompt[r], np[r], seen[r].tok, seen[r].n, tol);
    }
    l3d_engine_destroy(e);
    l3d_kv_cache_destroy(rec.c);
}

// A conversation's second turn (its first prompt, the answer, and a new message) takes the
// slot holding the first turn and computes only what is new; its answer is what the whole
// prompt gives alone. Another slot that holds nothing of it is not chosen.
Test(engine, next_turn_reuses_the_prefix) {
    l3d_engine_t *e = NULL;
    l3d_engine_params_t p = {.slots = 2, .ctx_size = 80, .queue_max = 0};
    cr_assert_eq(l3d_engine_create(m, &p, &e), L3D_OK);
    int32_t first[20], second[60];
    fill(first, 20, 7);
    seen_t a = {0}, b = {0}, other = {0};
    int32_t unrelated[4] = {9, 9, 9, 9};
    l3d_gen_request_t q = greedy(unrelated, 4, 2, &other);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    drain(e);
    q = greedy(first, 20, 10, &a);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    drain(e);
    cr_assert_eq(a.cached, 0);
    // the next turn: the first prompt, its answer, four new tokens
    memcpy(second, first, sizeof(first));
    memcpy(second + 20, a.tok, (size_t)a.n * sizeof(int32_t));
    fill(second + 20 + a.n, 4, 99);
    int n2 = 20 + a.n + 4;
    q = greedy(second, n2, 8, &b);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    drain(e);
    // the slot held the prompt and every answer token but the last (sampled, never fed)
    cr_assert_eq(b.cached, 20 + a.n - 1, "cached %d", b.cached);
    cr_assert_eq(b.n, 8);
    check_alone(second, n2, b.tok, b.n, head_tol(80));
    l3d_engine_stats_t st;
    l3d_engine_get_stats(e, &st);
    cr_assert_eq(st.prompt_tokens_cached, (uint64_t)b.cached);
    cr_assert_eq(st.prompt_tokens, (uint64_t)(4 + 20 + n2));
    l3d_engine_destroy(e);
}

// The slot's context ends a request (prompt 10 in 16 positions: 7 tokens, the last one not
// fed), a stop token ends it without being delivered, the callback's stop and cancel end it at
// once, and logprobs are the model's log softmax.
Test(engine, every_way_a_request_ends) {
    l3d_engine_t *e = NULL;
    l3d_engine_params_t p = {.slots = 3, .ctx_size = 16, .queue_max = 4};
    cr_assert_eq(l3d_engine_create(m, &p, &e), L3D_OK);
    int32_t pr[10];
    fill(pr, 10, 3);
    seen_t full = {0}, stopped = {0}, says_stop = {.stop_after = 2, .verdict = L3D_GEN_SAY_STOP},
           says_cancel = {.stop_after = 3, .verdict = L3D_GEN_SAY_CANCEL};
    l3d_gen_request_t q = greedy(pr, 10, 100, &full);
    q.top_logprobs = 3;
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    drain(e);
    cr_assert_eq(full.n, 7);
    cr_assert_eq(full.finish, L3D_GEN_LENGTH);
    cr_assert_eq(full.finals, 1);
    // logprob of the first token: log softmax of the alone logits, in double
    {
        l3d_kv_cache_t *c = NULL;
        float *lg = malloc(sizeof(float) * m->V);
        cr_assert_eq(l3d_kv_cache_create(m, 16, &c), L3D_OK);
        cr_assert_eq(l3d_model_decode(m, c, pr, 10, lg), L3D_OK);
        double mx = lg[argmax(lg, m->V)], s = 0;
        for (int v = 0; v < m->V; v++) s += exp((double)lg[v] - mx);
        double want = lg[full.tok[0]] - mx - log(s);
        // the same prompt, fed alone both times: only the float32 rounding of the result
        cr_assert(fabs(full.lp[0] - want) <= 4 * 0x1p-24 * (1 + fabs(want)), "logprob %.9g vs %.9g",
                  full.lp[0], want);
        free(lg);
        l3d_kv_cache_destroy(c);
    }
    // a stop token: the third greedy token of the same prompt, in a fresh engine (the same
    // passes as the first request's, so the same tokens bit for bit)
    l3d_engine_destroy(e);
    cr_assert_eq(l3d_engine_create(m, &p, &e), L3D_OK);
    q = greedy(pr, 10, 100, &stopped);
    q.stop_tokens = &full.tok[2];
    q.n_stop_tokens = 1;
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    drain(e);
    q = greedy(pr, 10, 100, &says_stop);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    q = greedy(pr, 10, 100, &says_cancel);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    drain(e);
    int first_stop = 0;
    while (first_stop < 2 && full.tok[first_stop] != full.tok[2]) first_stop++;
    cr_assert_eq(stopped.n, first_stop, "stopped after %d", stopped.n);
    cr_assert_eq(stopped.finish, L3D_GEN_STOP);
    cr_assert_eq(says_stop.n, 2);
    cr_assert_eq(says_stop.finish, L3D_GEN_STOP);
    cr_assert_eq(says_cancel.n, 3);
    cr_assert_eq(says_cancel.finish, L3D_GEN_CANCELLED);
    cr_assert_eq(stopped.finals + says_stop.finals + says_cancel.finals, 3);
    l3d_engine_destroy(e);
}

// One slot and a queue of one: a third request is refused busy; the queued one cancelled
// ends without a token; a time limit ends the running one; a cancelled id is then unknown;
// requests the engine cannot take say why; a stopping engine refuses.
Test(engine, queue_cancel_timeout_and_refusals) {
    l3d_engine_t *e = NULL;
    l3d_engine_params_t p = {.slots = 1, .ctx_size = 64, .queue_max = 1};
    cr_assert_eq(l3d_engine_create(m, &p, &e), L3D_OK);
    int32_t pr[5] = {5, 6, 7, 8, 9};
    seen_t a = {0}, b = {0}, c = {0};
    uint64_t ida, idb;
    char why[200];
    l3d_gen_request_t q = greedy(pr, 5, 50, &a);
    q.timeout_s = 0.05;
    cr_assert_eq(l3d_engine_submit(e, &q, &ida, NULL, 0), L3D_OK);
    cr_assert_eq(l3d_engine_step(e, NULL), L3D_OK);  // a takes the slot
    q = greedy(pr, 5, 50, &b);
    cr_assert_eq(l3d_engine_submit(e, &q, &idb, NULL, 0), L3D_OK);
    q = greedy(pr, 5, 50, &c);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, why, sizeof(why)), L3D_ERR_BUSY);
    cr_assert(strstr(why, "queue is full"), "%s", why);
    cr_assert_eq(l3d_engine_cancel(e, idb), L3D_OK);
    cr_assert_eq(l3d_engine_step(e, NULL), L3D_OK);
    cr_assert_eq(b.finals, 1);
    cr_assert_eq(b.finish, L3D_GEN_CANCELLED);
    cr_assert_eq(b.n, 0);
    nanosleep(&(struct timespec){0, 60000000}, NULL);
    drain(e);
    cr_assert_eq(a.finish, L3D_GEN_TIMEOUT);
    cr_assert_eq(a.finals, 1);
    cr_assert_lt(a.n, 50);
    cr_assert_eq(l3d_engine_cancel(e, ida), L3D_ERR_NOT_FOUND);
    cr_assert_eq(c.finals, 0, "a refused request got an event");
    // what the engine cannot take
    int32_t longp[64] = {0}, bad[2] = {3, 50};
    q = greedy(longp, 64, 1, &c);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, why, sizeof(why)), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(why, "64 tokens"), "%s", why);
    q = greedy(bad, 2, 1, &c);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, why, sizeof(why)), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(why, "vocabulary"), "%s", why);
    q = greedy(pr, 5, 0, &c);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, why, sizeof(why)), L3D_ERR_INVALID_ARG);
    q = greedy(pr, 5, 4, &c);
    q.sampling.temperature = -1;
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, why, sizeof(why)), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(why, "temperature"), "%s", why);
    l3d_engine_stop(e, 0);
    q = greedy(pr, 5, 4, &c);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, why, sizeof(why)), L3D_ERR_CANCELLED);
    cr_assert_eq(c.finals, 0);
    l3d_engine_destroy(e);
}

// The engine on its own thread (l3d_engine_run) while another thread submits: every request
// finishes once; stop without cancel lets them finish, then run returns. Destroying an engine
// with requests queued ends each with `cancelled`.
typedef struct {
    l3d_engine_t *e;
    l3d_status st;
} runner_t;
static void *runner(void *arg) {
    runner_t *r = arg;
    r->st = l3d_engine_run(r->e);
    return NULL;
}
Test(engine, runs_on_its_own_thread) {
    l3d_engine_t *e = NULL;
    l3d_engine_params_t p = {.slots = 3, .ctx_size = 48, .queue_max = 16};
    cr_assert_eq(l3d_engine_create(m, &p, &e), L3D_OK);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    runner_t r = {e, L3D_ERR_INTERNAL};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, runner, &r), 0);
    enum { R = 10 };
    seen_t seen[R];
    memset(seen, 0, sizeof(seen));
    int32_t pr[R][8];
    for (int i = 0; i < R; i++) {
        seen[i].mu = &mu;
        fill(pr[i], 8, 500 + (uint32_t)i);
        l3d_gen_request_t q = greedy(pr[i], 1 + i % 8, 6, &seen[i]);
        cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    }
    l3d_engine_stop(e, 0);
    pthread_join(th, NULL);
    cr_assert_eq(r.st, L3D_OK);
    for (int i = 0; i < R; i++) {
        cr_assert_eq(seen[i].finals, 1, "request %d", i);
        cr_assert_eq(seen[i].finish, L3D_GEN_LENGTH);
        cr_assert_eq(seen[i].n, 6);
    }
    l3d_engine_destroy(e);
    // destroy with work queued
    cr_assert_eq(l3d_engine_create(m, &p, &e), L3D_OK);
    seen_t left = {0};
    l3d_gen_request_t q = greedy(pr[0], 4, 6, &left);
    cr_assert_eq(l3d_engine_submit(e, &q, NULL, NULL, 0), L3D_OK);
    l3d_engine_destroy(e);
    cr_assert_eq(left.finals, 1);
    cr_assert_eq(left.finish, L3D_GEN_CANCELLED);
}
