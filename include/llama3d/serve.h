// The serving engine: generation requests scheduled over one model with continuous batching.
// Each running request owns a slot (a sequence of one KV cache of `ctx_size` positions); a
// request joins the running batch at the next token boundary, long prompts are fed in chunks
// between the running streams' tokens, a new request takes the free slot whose cached tokens
// share the longest prefix with its prompt (the previous turn of its conversation), the queue
// is bounded, and a request can be cancelled at any time. `l3d serve` is its HTTP front end;
// an application can drive it without HTTP.
// defines: l3d_engine_t, l3d_engine_params_t, l3d_gen_request_t, l3d_gen_event_t,
//          l3d_gen_finish_t, l3d_gen_callback_fn, l3d_engine_stats_t, l3d_engine_*
#ifndef LLAMA3D_SERVE_H
#define LLAMA3D_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/model.h"
#include "llama3d/sampler.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct l3d_engine l3d_engine_t;

typedef struct l3d_engine_params {
    int slots;          // requests generating at once (>= 1); each gets ctx_size positions
    int ctx_size;       // positions per slot, prompt and answer (<= max_position_embeddings)
    int queue_max;      // requests waiting for a slot; one more is L3D_ERR_BUSY (>= 0)
    int prefill_chunk;  // prompt tokens fed per step, in the running streams' pass
                        // (0: 256)
} l3d_engine_params_t;

// Why a request ended (its last event carries it).
typedef enum l3d_gen_finish {
    L3D_GEN_RUNNING = 0,    // not the last event
    L3D_GEN_STOP = 1,       // a stop token, or the callback said stop (a stop string)
    L3D_GEN_LENGTH = 2,     // max_tokens generated, or the slot's context is full
    L3D_GEN_CANCELLED = 3,  // l3d_engine_cancel, the callback, or the engine shutting down
    L3D_GEN_TIMEOUT = 4,    // the request's time limit passed
    L3D_GEN_ERROR = 5,      // the model failed (the engine's ctx holds the message)
} l3d_gen_finish_t;

#define L3D_GEN_TOP_MAX 20  // most alternatives a token event carries (OpenAI's top_logprobs)

// One token of a request, or its end. Valid only during the callback.
typedef struct l3d_gen_event {
    uint64_t id;              // the request's
    int32_t token;            // the new token; -1 on an end without one (a stop token is not
                              // delivered: it ends the request with L3D_GEN_STOP)
    float logprob;            // log softmax of the model's logits at `token` (before penalties
                              // and temperature: what the model said); 0 unless asked
    int n_top;                // alternatives below (the request's top_logprobs)
    const int32_t *top_ids;   // most likely first
    const float *top_logprobs;
    l3d_gen_finish_t finish;  // L3D_GEN_RUNNING, or why this is the last event
    int prompt_tokens;        // the prompt's length
    int cached_tokens;        // of those, taken from the slot's cache (not computed again)
    int generated;            // tokens generated so far, this one included (stop tokens too)
    double t_queued;          // seconds from submit to the slot
    double t_first;           // seconds from submit to the first token (0 before it)
} l3d_gen_event_t;

// What a callback returns: go on, end the request as stopped (the caller saw a stop string in
// the text), or cancel it (the client went away).
enum { L3D_GEN_CONTINUE = 0, L3D_GEN_SAY_STOP = 1, L3D_GEN_SAY_CANCEL = 2 };
// Called on the engine's thread, without the engine's lock held (it may submit or cancel).
// Every request gets exactly one event with finish != L3D_GEN_RUNNING, its last; after it
// returns the engine no longer uses `user`.
typedef int (*l3d_gen_callback_fn)(void *user, const l3d_gen_event_t *ev);

typedef struct l3d_gen_request {
    const int32_t *prompt;         // copied by submit
    int n_prompt;                  // >= 1, < ctx_size (room for one token at least)
    int max_tokens;                // >= 1; the slot's context also ends it
    l3d_sampler_params_t sampling;
    const int32_t *stop_tokens;    // ids that end the answer (eos, eot), copied; may be NULL
    int n_stop_tokens;
    int top_logprobs;              // -1: no logprobs; 0 .. L3D_GEN_TOP_MAX: the token's logprob
                                   // and that many alternatives
    double timeout_s;              // from submit; 0: none
    l3d_gen_callback_fn callback;  // required
    void *user;
} l3d_gen_request_t;

// Counters since create, and the state now (for /metrics).
#define L3D_ENGINE_HIST_BUCKETS 12
extern const double l3d_engine_hist_bounds[L3D_ENGINE_HIST_BUCKETS];  // seconds, last +inf
typedef struct l3d_engine_stats {
    uint64_t finished[6];             // by l3d_gen_finish_t (index 0 unused)
    uint64_t prompt_tokens;           // submitted prompts' tokens
    uint64_t prompt_tokens_cached;    // of those, reused from a slot's cache
    uint64_t generated_tokens;
    uint64_t ttft_count[L3D_ENGINE_HIST_BUCKETS], itl_count[L3D_ENGINE_HIST_BUCKETS];
    double ttft_sum, itl_sum;         // (Prometheus histograms: counts per bucket, not cumulative)
    int queued, running, slots, ctx_size;
    int64_t kv_used, kv_capacity;     // positions held by running requests, and in all
} l3d_engine_stats_t;

// An engine over `model` (which must outlive it), with a KV cache of params->slots sequences of
// params->ctx_size positions. Bad params are L3D_ERR_INVALID_ARG naming the field.
l3d_status l3d_engine_create(l3d_model_t *model, const l3d_engine_params_t *params,
                             l3d_engine_t **engine_p);

// What an engine decodes with, for a model it does not hold whole (a tensor- or
// pipeline-parallel layout whose ranks follow the engine's calls). Sequences are the slots
// 0 .. slots-1, each holding up to ctx_size positions; every entry is called from the engine's
// thread only, blocks until its result is in host memory, and returns a failure as a status.
typedef struct l3d_engine_backend {
    // Appends each span's tokens to its sequence (distinct; tokens laid out span after span)
    // and writes the logits of the last token of each span asking for them, rows in span
    // order (vocab floats each): l3d_model_decode_spans's contract. A step calls it once.
    l3d_status (*decode_spans)(void *arg, const l3d_decode_span_t *spans, int n_spans,
                               const int32_t *tokens, float *logits);
    // Keeps the first `keep` positions of sequence `seq`.
    l3d_status (*truncate)(void *arg, int seq, int keep);
    // Optional (NULL: none): called about once a second while l3d_engine_run waits with
    // nothing to do (ranks that follow the engine wait on a deadline: tell them it is alive).
    l3d_status (*keepalive)(void *arg);
    int vocab_size, max_positions;  // the model's
} l3d_engine_backend_t;
// An engine over `backend` (copied; `arg` must outlive the engine). `ctx` takes the errors and
// allocations. As l3d_engine_create otherwise.
l3d_status l3d_engine_create_backend(l3d_ctx_t *ctx, const l3d_engine_backend_t *backend,
                                     void *arg, const l3d_engine_params_t *params,
                                     l3d_engine_t **engine_p);
// Cancels whatever is queued or running (each gets its last event, L3D_GEN_CANCELLED), then
// frees the engine. Not while another thread is in l3d_engine_run or l3d_engine_step.
void l3d_engine_destroy(l3d_engine_t *e);
// Queues a request (thread-safe); *id_p (may be NULL) names it for cancel. A full queue is
// L3D_ERR_BUSY; a request the engine cannot take (a prompt longer than ctx_size - 1, a token
// outside the vocabulary, bad sampling) is L3D_ERR_INVALID_ARG; a stopping engine is
// L3D_ERR_CANCELLED. What was wrong is written to why[0..why_cap) (may be NULL; the engine's
// ctx is shared by every thread, so its last error is not this call's). On failure no event is
// ever delivered.
l3d_status l3d_engine_submit(l3d_engine_t *e, const l3d_gen_request_t *req, uint64_t *id_p,
                             char *why, size_t why_cap);
// Cancels request `id` (thread-safe): its last event, L3D_GEN_CANCELLED, comes from the
// engine's next step. An unknown or finished id is L3D_ERR_NOT_FOUND.
l3d_status l3d_engine_cancel(l3d_engine_t *e, uint64_t id);
// One scheduling step on the calling thread: admits queued requests to free slots, ends the
// cancelled and the late, feeds one token for every generating request and up to prefill_chunk
// prompt tokens (over the prefilling requests in turn) in one decode_spans call, delivering
// their events. *busy_p (may be NULL): whether anything is
// queued or running afterwards. A failure of the model ends the running requests with
// L3D_GEN_ERROR and is returned.
l3d_status l3d_engine_step(l3d_engine_t *e, int *busy_p);
// Steps until l3d_engine_stop, sleeping while there is nothing to do (the backend's keepalive
// about once a second meanwhile). Returns what ended it.
l3d_status l3d_engine_run(l3d_engine_t *e);
// Asks l3d_engine_run to return (thread-safe): with `cancel` the running and queued requests
// end L3D_GEN_CANCELLED first, else they are finished first; submit then refuses.
void l3d_engine_stop(l3d_engine_t *e, int cancel);
void l3d_engine_get_stats(l3d_engine_t *e, l3d_engine_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif
