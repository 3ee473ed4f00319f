// l3d serve: an OpenAI-compatible HTTP server over the serving engine (include/llama3d/serve.h).
// The HTTP daemon starts first (GET /health says 503 while the model loads), then the model,
// then the engine on its own thread; "listening on http://HOST:PORT" is printed once requests
// are taken. SIGINT or SIGTERM: no new connections, requests in flight get --grace seconds to
// finish, the rest are cancelled, and the program exits 0.
//
// A tensor- and pipeline-parallel layout (--tp, --pp: threads of this process, or processes
// under l3d launch) serves the same way: rank 0 runs HTTP and the engine, whose decoding is
// collective -- each call is broadcast to the other ranks (an op and its tokens), which follow
// it on their parts of the model (core/model/infer_parallel.h) until rank 0 says stop.
// defines: l3d_cmd_serve
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <stdint.h>
#include <unistd.h>

#include "cli/ranks.h"
#include "cli/serve.h"
#include "core/checkpoint/checkpoint_open.h"
#include "core/input.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

// ---- the layout's decoding, led by rank 0 -------------------------------------------------------
enum { OP_QUIT = 0, OP_SPANS = 1, OP_TRUNCATE = 3, OP_ALIVE = 4 };

// What rank 0's engine decodes with, and what the other ranks follow: an op header (op, seq or
// spans, tokens, keep) and, for a decode, its spans (seq, n, logits each) then its tokens,
// broadcast over the world.
typedef struct lead {
    l3d_infer_t *inf;
    l3d_comm_t *world;  // NULL: one rank
    int32_t *buf;       // the broadcast payload (cap int32)
    size_t cap, slots;
} lead_t;

static l3d_status lead_send(lead_t *L, int op, int seq, int n, int keep,
                            const l3d_decode_span_t *sp, const int32_t *tokens) {
    if (!L->world) return L3D_OK;
    int32_t h[4] = {op, seq, n, keep};
    L3D_CHECK(l3d_comm_ctx(L->world), l3d_comm_broadcast(L->world, h, h, 4, L3D_INT32, 0));
    size_t k = 0;
    if (op == OP_SPANS) {  // (seq: the spans, n: the tokens)
        for (int j = 0; j < seq; j++) {
            L->buf[k++] = sp[j].seq;
            L->buf[k++] = sp[j].n;
            L->buf[k++] = sp[j].logits;
        }
        for (int i = 0; i < n; i++) L->buf[k++] = tokens[i];
    }
    return k ? l3d_comm_broadcast(L->world, L->buf, L->buf, k, L3D_INT32, 0) : L3D_OK;
}
static l3d_status lead_spans(void *arg, const l3d_decode_span_t *sp, int ns, const int32_t *t,
                             float *lg) {
    lead_t *L = arg;
    int n = 0;
    for (int j = 0; j < ns; j++) n += sp[j].n;
    if (ns < 1 || 3 * (size_t)ns + (size_t)n > L->cap) return L3D_ERR_INVALID_ARG;
    L3D_CHECK(NULL, lead_send(L, OP_SPANS, ns, n, 0, sp, t));
    return l3d_infer_decode_spans(L->inf, sp, ns, t, lg);
}
static l3d_status lead_truncate(void *arg, int seq, int keep) {
    lead_t *L = arg;
    L3D_CHECK(NULL, lead_send(L, OP_TRUNCATE, seq, 0, keep, NULL, NULL));
    return l3d_infer_truncate(L->inf, seq, keep);
}
// (an idle server: the followers' broadcast waits would otherwise reach L3D_COMM_TIMEOUT)
static l3d_status lead_alive(void *arg) {
    return lead_send(arg, OP_ALIVE, 0, 0, 0, NULL, NULL);
}

// A rank other than 0: its part of the layout, following rank 0's ops until OP_QUIT.
static l3d_status follow(lead_t *L, int V) {
    float *logits = malloc(L->slots * (size_t)V * sizeof(float));
    l3d_decode_span_t *sp = malloc(L->slots * sizeof(l3d_decode_span_t));
    l3d_status st = logits && sp ? L3D_OK : L3D_ERR_NOMEM;
    while (st >= 0) {
        int32_t h[4];
        st = l3d_comm_broadcast(L->world, h, h, 4, L3D_INT32, 0);
        if (st < 0 || h[0] == OP_QUIT) break;
        int op = h[0], seq = h[1], n = h[2], keep = h[3];
        size_t k = op == OP_SPANS ? 3 * (size_t)seq + (size_t)n : 0;
        if (k > L->cap || n < 0 || seq < 0 || (op == OP_SPANS && (size_t)seq > L->slots)) {
            st = L3D_ERR_PEER_FAILED;
            break;
        }
        if (k) st = l3d_comm_broadcast(L->world, L->buf, L->buf, k, L3D_INT32, 0);
        if (st < 0) break;
        if (op == OP_SPANS) {
            for (int j = 0; j < seq; j++)
                sp[j] = (l3d_decode_span_t){L->buf[3 * j], L->buf[3 * j + 1], L->buf[3 * j + 2]};
            st = l3d_infer_decode_spans(L->inf, sp, seq, L->buf + 3 * (size_t)seq, logits);
        } else if (op == OP_TRUNCATE) {
            st = l3d_infer_truncate(L->inf, seq, keep);
        }  // (OP_ALIVE: nothing)
    }
    free(logits);
    free(sp);
    return st;
}

static void *engine_main(void *arg) {
    l3d_engine_t *e = arg;
    l3d_status st = l3d_engine_run(e);
    if (st < 0) {  // (the layout failed: the server stops, exiting non-zero)
        fprintf(stderr, "l3d serve: the engine stopped: %s\n", l3d_strerror(st));
        kill(getpid(), SIGTERM);
    }
    return (void *)(intptr_t)(st < 0);
}

static const char *base_name(const char *path, char *buf, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(buf, cap, "%.*s", (int)(n - b), path + b);
    return buf;
}

// What every rank runs, read-only once the ranks start.
typedef struct serve_job {
    const char *ckpt, *host, *key, *name, *device, *tokp;
    long long port, slots, ctx_size, qmax, tp, pp, nthreads, body_max, pchunk, seed;
    double tmo, grace_s;
    int weights, round16;  // --dtype (l3d_infer_open's `weights`, -1 auto; bfloat16 products)
} serve_job_t;

// SIGINT and SIGTERM, once serving: the handler writes the signal to a pipe that rank 0 reads.
// Installed late on purpose: libraries the transports load install handlers of their own
// (libinfinipath's calls exit() from whichever thread takes the signal), and a handler set
// after them is the one that runs. (The program's, not the library's: a static is fine here.)
static int sig_pipe[2] = {-1, -1};
static void on_signal(int sig) {
    unsigned char b = (unsigned char)sig;
    ssize_t w = write(sig_pipe[1], &b, 1);
    (void)w;
}
static int wait_signal(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (pipe(sig_pipe) != 0 || sigaction(SIGINT, &sa, NULL) != 0 ||
        sigaction(SIGTERM, &sa, NULL) != 0)
        return -1;
    unsigned char b = 0;
    while (read(sig_pipe[0], &b, 1) != 1) {
    }
    return b;
}

// The slot size: --ctx-size, else the model's context up to 4096 (every rank the same).
static l3d_status slot_size(l3d_ctx_t *ctx, const serve_job_t *job, const l3d_model_config_t *cfg,
                            int *ctx_size) {
    long long t = job->ctx_size;
    if (!t) t = cfg->max_position_embeddings < 4096 ? cfg->max_position_embeddings : 4096;
    if (t > cfg->max_position_embeddings)
        return l3d_error(ctx, L3D_ERR_CONFIG, "--ctx-size %lld is over the model's context of %d "
                         "tokens", t, cfg->max_position_embeddings);
    *ctx_size = (int)t;
    return L3D_OK;
}

// The payload the ops broadcast: a step's spans (3 ints each, one per slot at most) and tokens
// (one per generating slot and a prompt chunk).
static size_t payload_cap(const serve_job_t *job) {
    return (size_t)(4 * job->slots + job->pchunk);
}

// Ranks other than 0: their part of the layout, following rank 0.
static void follower(l3d_cli_rank_t *r, l3d_ctx_t *ctx, const serve_job_t *job) {
    // A rank of its own process (l3d launch forwards SIGTERM to every rank) stops when rank 0
    // says so, after the requests in flight; threads share rank 0's handler.
    if (!r->threaded) {
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
    }
    l3d_device_t *dev = NULL;
    lead_t L = {.world = r->comm, .cap = payload_cap(job), .slots = (size_t)job->slots};
    l3d_model_config_t cfg;
    char path[1200];
    int ctx_size = 0;
    l3d_status st;
    l3d_device_params_t dp = {.num_threads = (int)job->nthreads};
    snprintf(path, sizeof(path), "%s/config.json", job->ckpt);
    L3D_CHECK_GOTO(ctx, l3d_model_config_from_file(ctx, path, &cfg), st, fail);
    L3D_CHECK_GOTO(ctx, slot_size(ctx, job, &cfg, &ctx_size), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_device_create(ctx, job->device ? job->device
                                                           : l3d_ctx_settings(ctx)->device,
                                          &dp, &dev), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_infer_open(ctx, r->comm, (int)job->tp, (int)job->pp, dev, job->ckpt,
                                       (int)job->slots, ctx_size, job->weights, &L.inf), st,
                   fail);
    L3D_CHECK_GOTO(ctx, l3d_infer_round_products(L.inf, (int)job->round16), st, fail);
    L.buf = malloc(L.cap * sizeof(int32_t));
    st = L.buf ? follow(&L, cfg.vocab_size) : L3D_ERR_NOMEM;
    if (st >= 0) goto out;
fail:
    l3d_cli_rank_failed(r, ctx, st);
out:
    free(L.buf);
    l3d_infer_destroy(L.inf);
    l3d_device_destroy(dev);
}

static void serve_rank(l3d_cli_rank_t *r, l3d_ctx_t *ctx) {
    const serve_job_t *job = r->job;
    if (r->rank != 0) {
        follower(r, ctx, job);
        return;
    }
    srv_t s;
    memset(&s, 0, sizeof(s));
    s.ctx = ctx;
    s.api_key = job->key;
    s.body_max = (size_t)job->body_max;
    s.timeout_s = job->tmo;
    s.seed = (uint64_t)job->seed, s.seeded = job->seed >= 0;
    s.slots = (int)job->slots;
    pthread_mutex_init(&s.mu, NULL);
    pthread_mutex_init(&s.tok_mu, NULL);
    snprintf(s.model_name, sizeof(s.model_name), "%s",
             job->name ? job->name : base_name(job->ckpt, (char[256]){0}, 256));
    lead_t L = {.world = r->comm, .cap = payload_cap(job), .slots = (size_t)job->slots};
    l3d_device_t *dev = NULL;
    pthread_t th;
    int started = 0, bound = 0;
    void *engine_failed = NULL;
    l3d_status st;
    char path[1200];
    struct MHD_Daemon *d = l3d_serve_http_start(&s, job->host, (int)job->port,
                                                (int)(job->slots + job->qmax + 64), &bound);
    if (!d) {  // (the others are told by the runner, as for any rank's failure)
        st = l3d_error(ctx, L3D_ERR_CONFIG, "cannot listen on %s:%lld", job->host, job->port);
        goto fail;
    }
    l3d_device_params_t dp = {.num_threads = (int)job->nthreads};
    snprintf(path, sizeof(path), "%s/config.json", job->ckpt);
    L3D_CHECK_GOTO(ctx, l3d_input_dir(ctx, job->ckpt, "checkpoint"), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_model_config_from_file(ctx, path, &s.cfg), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_cli_open_tokenizer(ctx, job->ckpt, job->tokp, s.cfg.vocab_size,
                                               &s.tok), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_cli_gen_defaults(ctx, job->ckpt, &s.cfg, s.tok, &s.gc, &s.stops), st,
                   fail);
    L3D_CHECK_GOTO(ctx, slot_size(ctx, job, &s.cfg, &s.ctx_size), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_device_create(ctx, job->device ? job->device
                                                           : l3d_ctx_settings(ctx)->device,
                                          &dp, &dev), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_infer_open(ctx, r->comm, (int)job->tp, (int)job->pp, dev, job->ckpt,
                                       (int)job->slots, s.ctx_size, job->weights, &L.inf),
                   st, fail);
    L3D_CHECK_GOTO(ctx, l3d_infer_round_products(L.inf, (int)job->round16), st, fail);
    L.buf = malloc(L.cap * sizeof(int32_t));
    if (!L.buf) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    l3d_engine_backend_t be = {lead_spans, lead_truncate, lead_alive,
                               s.cfg.vocab_size, s.cfg.max_position_embeddings};
    l3d_engine_params_t ep = {.slots = (int)job->slots, .ctx_size = s.ctx_size,
                              .queue_max = (int)job->qmax, .prefill_chunk = (int)job->pchunk};
    L3D_CHECK_GOTO(ctx, l3d_engine_create_backend(ctx, &be, &L, &ep, &s.engine), st, fail);
    if (pthread_create(&th, NULL, engine_main, s.engine)) {
        st = l3d_error(ctx, L3D_ERR_SYSTEM, "cannot start the engine's thread");
        goto fail;
    }
    started = 1;
    s.created = (long)time(NULL);
    s.ready = 1;
    double kv_mib = 2.0 * (double)job->slots * s.ctx_size * s.cfg.num_hidden_layers *
                    s.cfg.num_key_value_heads * s.cfg.head_dim * sizeof(float) / 1048576.0;
    char layout[64] = "";
    if (job->tp > 1 || job->pp > 1)
        snprintf(layout, sizeof(layout), " on tp %lld x pp %lld", job->tp, job->pp);
    fprintf(stderr, "l3d serve: model %s%s: %lld slots of %d tokens each (KV cache %.1f MiB), "
            "%lld more may wait, %g s a request\n", s.model_name, layout, job->slots,
            s.ctx_size, kv_mib, job->qmax, job->tmo);
    printf("listening on http://%s%s%s:%d\n", strchr(job->host, ':') ? "[" : "", job->host,
           strchr(job->host, ':') ? "]" : "", bound);
    fflush(stdout);

    int sig = wait_signal();
    if (sig < 0) {
        st = l3d_error(ctx, L3D_ERR_SYSTEM, "cannot take SIGTERM/SIGINT");
        goto fail;
    }
    fprintf(stderr, "l3d serve: %s: finishing the requests in flight (%g s at most)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", job->grace_s);
    s.ready = 0;
    l3d_serve_http_quiesce(d);
    l3d_engine_stop(s.engine, 0);
    double until = l3d_time_now() + job->grace_s;
    for (;;) {
        l3d_engine_stats_t es;
        l3d_engine_get_stats(s.engine, &es);
        if (es.running + es.queued == 0) break;
        if (l3d_time_now() >= until) {
            fprintf(stderr, "l3d serve: cancelling %d requests\n", es.running + es.queued);
            l3d_engine_stop(s.engine, 1);
            break;
        }
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    st = L3D_OK;
    goto out;
fail:
    l3d_cli_rank_failed(r, ctx, st);
out:
    if (started) {
        l3d_engine_stop(s.engine, 1);
        pthread_join(th, &engine_failed);
        // (after a failed engine thread, requests may still wait: a cancelling step ends each
        // one, with no decoding, so that no connection waits for an event that cannot come)
        for (int busy = 1; busy && l3d_engine_step(s.engine, &busy) >= 0;) {
        }
    }
    if (d) l3d_serve_http_stop(d);  // (every connection has had its answer)
    l3d_engine_destroy(s.engine);
    if (engine_failed && st >= 0)
        l3d_cli_rank_failed(r, ctx, l3d_error(ctx, L3D_ERR_PEER_FAILED, "the model's layout "
                                              "failed while serving"));
    else if (L.inf && st >= 0)  // the other ranks stop following
        (void)lead_send(&L, OP_QUIT, 0, 0, 0, NULL, NULL);
    free(L.buf);
    l3d_infer_destroy(L.inf);
    l3d_tokenizer_destroy(s.tok);
    l3d_device_destroy(dev);
    pthread_mutex_destroy(&s.mu);
    pthread_mutex_destroy(&s.tok_mu);
}

int l3d_cmd_serve(int argc, char **argv) {
    const char *ckpt = NULL, *host = "127.0.0.1", *ports = NULL, *par = NULL, *ctxs = NULL,
               *key = NULL, *name = NULL, *tps = NULL, *pps = NULL, *threads = NULL, *queue = NULL,
               *timeout = NULL, *bodymax = NULL, *device = NULL, *dtype = NULL, *tokp = NULL,
               *chunk = NULL, *grace = NULL, *seeds = NULL, *help = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--checkpoint", "DIR", "checkpoint directory (Hugging Face or sharded layout)", &ckpt, 0},
        {"--host", "ADDR", "address to listen on (default 127.0.0.1: this machine only)", &host, 0},
        {"--port", "N", "port (default 8080; 0: any free one, printed)", &ports, 0},
        {"--parallel", "N", "requests generated at once, each in a slot of its own (default 4)",
         &par, 0},
        {"--ctx-size", "T", "tokens per slot, prompt and answer (default: the model's context, "
         "at most 4096); each slot gets all of them", &ctxs, 0},
        {"--queue", "N", "requests waiting for a slot before 429 (default 64)", &queue, 0},
        {"--timeout", "S", "seconds a request may take, queued and generating (default 600; 0: "
         "none)", &timeout, 0},
        {"--api-key", "KEY", "require Authorization: Bearer KEY (default: L3D_API_KEY if set)",
         &key, 0},
        {"--model-name", "NAME", "the model's id in the API (default: the directory's name)",
         &name, 0},
        {"--body-max", "BYTES", "largest request body (default 8388608)", &bodymax, 0},
        {"--prefill-chunk", "N", "prompt tokens fed per step beside the running streams' tokens "
         "(default 256)", &chunk, 0},
        {"--grace", "S", "seconds requests in flight get to finish at SIGTERM (default 10)",
         &grace, 0},
        {"--seed", "N", "the sampler's seed of a request that names none: the same request, the "
         "same answer (default -1: a new seed each request)", &seeds, 0},
        {"--tokenizer", "PATH", "tokenizer.json, tokenizer.model or a directory (default: the "
         "checkpoint's, else bytes)", &tokp, 0},
        {"--tp", "N", "tensor-parallel ranks (default 1)", &tps, 0},
        {"--pp", "N", "pipeline stages (default 1)", &pps, 0},
        {"--threads", "N", "CPU threads (default: L3D_NUM_THREADS or the cores)", &threads, 0},
        {"--device", "NAME", "cpu, cuda, cpu-opaque, cpu-async (default: L3D_DEVICE or cpu)",
         &device, 0},
        {"--dtype", "TYPE", L3D_CLI_DTYPE_HELP, &dtype, 0},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    if (l3d_cli_parse("serve", argc, argv, 2, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, "serve", "--checkpoint DIR [FLAGS]", flags, nflags);
        return L3D_EXIT_OK;
    }
    if (!ckpt) {
        fprintf(stderr, "l3d serve: --checkpoint DIR is required\n");
        return L3D_EXIT_USAGE;
    }
    long long port = 8080, slots = 4, ctx_size = 0, qmax = 64, tp = 1, pp = 1, nthreads = 0,
              body_max = 8 << 20, pchunk = 256, seed = -1;
    double tmo = 600, grace_s = 10;
    if ((ports && l3d_cli_int("serve", "--port", ports, 0, 65535, &port)) ||
        (par && l3d_cli_int("serve", "--parallel", par, 1, L3D_KV_MAX_SEQS, &slots)) ||
        (ctxs && l3d_cli_int("serve", "--ctx-size", ctxs, 2, 1 << 24, &ctx_size)) ||
        (queue && l3d_cli_int("serve", "--queue", queue, 0, 1 << 20, &qmax)) ||
        (timeout && l3d_cli_float("serve", "--timeout", timeout, 0, 1e9, &tmo)) ||
        (grace && l3d_cli_float("serve", "--grace", grace, 0, 1e6, &grace_s)) ||
        (bodymax && l3d_cli_int("serve", "--body-max", bodymax, 1024, 1LL << 32, &body_max)) ||
        (chunk && l3d_cli_int("serve", "--prefill-chunk", chunk, 1, 1 << 20, &pchunk)) ||
        (seeds && l3d_cli_int("serve", "--seed", seeds, -1, LLONG_MAX, &seed)) ||
        (tps && l3d_cli_int("serve", "--tp", tps, 1, 1024, &tp)) ||
        (pps && l3d_cli_int("serve", "--pp", pps, 1, 1024, &pp)) ||
        (threads && l3d_cli_int("serve", "--threads", threads, 1, 4096, &nthreads)))
        return L3D_EXIT_USAGE;
    int weights = -1, round16 = 0;
    if (l3d_cli_weights_dtype("serve", dtype, &weights, &round16)) return L3D_EXIT_USAGE;
    if (!key) key = getenv("L3D_API_KEY");
    if (key && !*key) {
        fprintf(stderr, "l3d serve: --api-key: empty\n");
        return L3D_EXIT_USAGE;
    }
    // (the id is a JSON string in every answer: UTF-8, and whole in model_name's bytes)
    char dflt[256];
    const char *id = name ? name : base_name(ckpt, dflt, sizeof(dflt));
    json_t *idj = strlen(id) < sizeof(dflt) ? json_string(id) : NULL;
    json_decref(idj);
    if (!*id || !idj) {
        fprintf(stderr, "l3d serve: %s: the model's id must be 1-255 bytes of UTF-8 text%s\n",
                name ? "--model-name" : "the checkpoint directory's name",
                name ? "" : " (name it with --model-name)");
        return L3D_EXIT_USAGE;
    }
    serve_job_t job = {.ckpt = ckpt, .host = host, .key = key, .name = name, .device = device,
                       .tokp = tokp, .port = port, .slots = slots, .ctx_size = ctx_size,
                       .qmax = qmax, .tp = tp, .pp = pp, .nthreads = nthreads,
                       .body_max = body_max, .pchunk = pchunk, .seed = seed, .tmo = tmo,
                       .grace_s = grace_s, .weights = weights, .round16 = round16};
    signal(SIGPIPE, SIG_IGN);  // (a client gone mid-write must not kill the server)
    // The world: a launched job's (its size must be tp x pp), else tp x pp threads.
    int world = (int)(tp * pp);
    if (l3d_cli_launched()) {
        int rank = 0, local = 1, rc = l3d_cli_launched_layout("serve", (int)tp, (int)pp, &rank,
                                                              &world, &local);
        return rc ? rc : l3d_cli_run_process("serve", &job, rank, world, serve_rank);
    }
    if (world > L3D_CLI_MAX_THREADED_RANKS) {
        fprintf(stderr, "l3d serve: tp %lld x pp %lld is more than %d threads of one process; "
                "start them as processes (l3d launch)\n", tp, pp, L3D_CLI_MAX_THREADED_RANKS);
        return L3D_EXIT_USAGE;
    }
    if (world == 1) return l3d_cli_run_process("serve", &job, 0, 1, serve_rank);
    return l3d_cli_run_threads("serve", &job, world, serve_rank);
}
