// l3d serve: the pieces shared by its files. cli/serve.c is the command (load, threads,
// signals), cli/serve_http.c the HTTP glue over libmicrohttpd (routing, keys, bodies,
// streaming, client disconnects), cli/serve_api.c the OpenAI API (requests into engine
// requests, events into text, responses and errors).
#ifndef L3D_CLI_SERVE_H
#define L3D_CLI_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "cli/cli.h"

// The server, shared by every connection thread and the engine's thread.
typedef struct srv {
    l3d_ctx_t *ctx;
    l3d_tokenizer_t *tok;
    pthread_mutex_t tok_mu;  // the tokenizer is used by one thread at a time
    l3d_engine_t *engine;
    l3d_model_config_t cfg;
    l3d_generation_config_t gc;
    l3d_cli_stops_t stops;
    char model_name[256];
    const char *api_key;  // NULL: no key
    size_t body_max;      // bytes of a request body (413 above)
    int ctx_size, slots;
    double timeout_s;     // per request (0: none)
    // --seed: the sampler's seed of a request that names none, if seeded (else the clock's);
    // tests/fuzz/fuzz_serve.c fixes it so that a failing input repeats
    uint64_t seed;
    int seeded;
    long created;         // when the model was loaded (Unix seconds)
    volatile int ready;   // /health 200 (else 503: loading, or stopping)
    pthread_mutex_t mu;   // guards the counters below
    uint64_t next_id;
    uint64_t http_status[6];  // requests answered 2xx, 400, 401, 404/405, 413/429, 5xx
} srv_t;

// One HTTP request of the API, shared by its connection's thread and the engine's callback
// (refs: both drop theirs; the last frees it).
typedef struct hreq {
    srv_t *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int chat;           // /v1/chat/completions (else /v1/completions)
    int stream, include_usage, logprobs, top_logprobs;
    char **stop;        // stop strings
    int n_stop;
    char id[48];
    long created;
    uint64_t engine_id;
    // the answer: all generated text, how much was sent (streaming) and where a stop string
    // begins (SIZE_MAX: none yet)
    char *text;
    size_t tlen, tcap, shown;
    json_t *lp;         // logprobs entries (the OpenAI shapes), NULL unless asked
    // streaming: server-sent-event bytes waiting for the client
    char *out;
    size_t olen, ocap, osent;
    int role_sent;
    int finished;       // the engine's last event came
    int finish;         // its l3d_gen_finish_t
    int prompt_tokens, cached_tokens, generated;
    int gone;           // the client went away
    int fd;             // the connection's socket (hangups are watched while waiting)
} hreq_t;

// A compact JSON string of j (steals j; free() the result).
char *l3d_serve_dump(json_t *j);
// An error answer: *out_p gets OpenAI's body {"error": {message, type, param, code}} (type from
// the status: invalid_request_error, authentication_error, not_found_error, ...; param and code
// may be NULL), and the status is returned.
int l3d_serve_fail(char **out_p, int status, const char *param, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
// The status and body (new, free()) for a request to `path` with JSON body[0..len): the
// non-generating endpoints (/tokenize, /detokenize, /v1/models, /health, /metrics) answer
// here; the generating ones return 0 and fill *hr_p, a request submitted to the engine (its
// answer comes from l3d_serve_finish_body or the stream).
int l3d_serve_handle(srv_t *s, const char *method, const char *path, const char *body,
                     size_t len, int fd, char **out_p, const char **ctype_p, hreq_t **hr_p);
// Parses a generating request (/v1/chat/completions with `chat`, else /v1/completions) and
// submits it: 0 and *hr_p (two references: the caller's and the engine's), or the status
// with its body in *out_p.
int l3d_serve_generate(srv_t *s, int chat, const char *body, size_t len, int fd, char **out_p,
                       hreq_t **hr_p);
// The whole answer of a finished non-streaming request (new string).
char *l3d_serve_finish_body(hreq_t *hr);
// Drops one reference (the last frees hr).
void l3d_serve_hreq_release(hreq_t *hr);
void l3d_serve_count_status(srv_t *s, int status);

// cli/serve_http.c: the daemon over `s` on host:port (port 0: any free one, *port_p says
// which). NULL on failure (message on stderr).
struct MHD_Daemon;
struct MHD_Daemon *l3d_serve_http_start(srv_t *s, const char *host, int port, int conns,
                                        int *port_p);
void l3d_serve_http_quiesce(struct MHD_Daemon *d);
void l3d_serve_http_stop(struct MHD_Daemon *d);

#endif
