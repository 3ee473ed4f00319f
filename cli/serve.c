// l3d serve: an OpenAI-compatible HTTP server over the serving engine (include/llama3d/serve.h).
// The HTTP daemon starts first (GET /health says 503 while the model loads), then the model,
// then the engine on its own thread; "listening on http://HOST:PORT" is printed once requests
// are taken. SIGINT or SIGTERM: no new connections, requests in flight get --grace seconds to
// finish, the rest are cancelled, and the program exits 0.
// defines: l3d_cmd_serve
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/serve.h"
#include "core/input.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

static void *engine_main(void *arg) {
    l3d_engine_t *e = arg;
    l3d_status st = l3d_engine_run(e);
    if (st < 0) fprintf(stderr, "l3d serve: the engine stopped: %s\n", l3d_strerror(st));
    return NULL;
}

static const char *base_name(const char *path, char *buf, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(buf, cap, "%.*s", (int)(n - b), path + b);
    return buf;
}

int l3d_cmd_serve(int argc, char **argv) {
    const char *ckpt = NULL, *host = "127.0.0.1", *ports = NULL, *par = NULL, *ctxs = NULL,
               *key = NULL, *name = NULL, *tps = NULL, *pps = NULL, *threads = NULL,
               *queue = NULL, *timeout = NULL, *bodymax = NULL, *device = NULL, *tokp = NULL,
               *chunk = NULL, *grace = NULL, *help = NULL;
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
        {"--prefill-chunk", "N", "prompt tokens fed between the running streams' tokens "
         "(default 256)", &chunk, 0},
        {"--grace", "S", "seconds requests in flight get to finish at SIGTERM (default 10)",
         &grace, 0},
        {"--tokenizer", "PATH", "tokenizer.json, tokenizer.model or a directory (default: the "
         "checkpoint's, else bytes)", &tokp, 0},
        {"--tp", "N", "tensor-parallel ranks (default 1)", &tps, 0},
        {"--pp", "N", "pipeline stages (default 1)", &pps, 0},
        {"--threads", "N", "CPU threads (default: L3D_NUM_THREADS or the cores)", &threads, 0},
        {"--device", "NAME", "cpu, cuda, cpu-opaque, cpu-async (default: L3D_DEVICE or cpu)",
         &device, 0},
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
              body_max = 8 << 20, pchunk = 256;
    double tmo = 600, grace_s = 10;
    if ((ports && l3d_cli_int("serve", "--port", ports, 0, 65535, &port)) ||
        (par && l3d_cli_int("serve", "--parallel", par, 1, L3D_KV_MAX_SEQS, &slots)) ||
        (ctxs && l3d_cli_int("serve", "--ctx-size", ctxs, 2, 1 << 24, &ctx_size)) ||
        (queue && l3d_cli_int("serve", "--queue", queue, 0, 1 << 20, &qmax)) ||
        (timeout && l3d_cli_float("serve", "--timeout", timeout, 0, 1e9, &tmo)) ||
        (grace && l3d_cli_float("serve", "--grace", grace, 0, 1e6, &grace_s)) ||
        (bodymax && l3d_cli_int("serve", "--body-max", bodymax, 1024, 1LL << 32, &body_max)) ||
        (chunk && l3d_cli_int("serve", "--prefill-chunk", chunk, 1, 1 << 20, &pchunk)) ||
        (tps && l3d_cli_int("serve", "--tp", tps, 1, 1024, &tp)) ||
        (pps && l3d_cli_int("serve", "--pp", pps, 1, 1024, &pp)) ||
        (threads && l3d_cli_int("serve", "--threads", threads, 1, 4096, &nthreads)))
        return L3D_EXIT_USAGE;
    if (tp > 1 || pp > 1) {
        fprintf(stderr, "l3d serve: --tp/--pp: serving a tensor- or pipeline-parallel layout is "
                "not built yet; serve on one rank (l3d generate takes --tp/--pp)\n");
        return L3D_EXIT_USAGE;
    }
    if (!key) key = getenv("L3D_API_KEY");
    if (key && !*key) {
        fprintf(stderr, "l3d serve: --api-key: empty\n");
        return L3D_EXIT_USAGE;
    }
    l3d_ctx_t *ctx = NULL;
    if (l3d_cli_ctx_create(1, &ctx) < 0) return L3D_EXIT_FAIL;

    // SIGINT and SIGTERM are taken by sigwait below: blocked here, before any thread starts,
    // so every thread inherits the mask. A client gone mid-write must not kill the server.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv_t s;
    memset(&s, 0, sizeof(s));
    s.ctx = ctx;
    s.api_key = key;
    s.body_max = (size_t)body_max;
    s.timeout_s = tmo;
    s.slots = (int)slots;
    pthread_mutex_init(&s.mu, NULL);
    pthread_mutex_init(&s.tok_mu, NULL);
    snprintf(s.model_name, sizeof(s.model_name), "%s",
             name ? name : base_name(ckpt, (char[256]){0}, 256));
    int bound = 0, rc = L3D_EXIT_OK;
    struct MHD_Daemon *d = l3d_serve_http_start(&s, host, (int)port,
                                                (int)(slots + qmax + 64), &bound);
    if (!d) {
        l3d_ctx_destroy(ctx);
        return L3D_EXIT_USAGE;
    }
    l3d_device_t *dev = NULL;
    pthread_t th;
    int started = 0;
    l3d_status st;
    char path[1200];
    l3d_device_params_t dp = {.num_threads = (int)nthreads};
    const char *dname = device ? device : l3d_ctx_settings(ctx)->device;
    snprintf(path, sizeof(path), "%s/config.json", ckpt);
    L3D_CHECK_GOTO(ctx, l3d_input_dir(ctx, ckpt, "checkpoint"), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_model_config_from_file(ctx, path, &s.cfg), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_cli_open_tokenizer(ctx, ckpt, tokp, s.cfg.vocab_size, &s.tok), st,
                   fail);
    L3D_CHECK_GOTO(ctx, l3d_cli_gen_defaults(ctx, ckpt, &s.cfg, s.tok, &s.gc, &s.stops), st, fail);
    if (!ctx_size) ctx_size = s.cfg.max_position_embeddings < 4096 ? s.cfg.max_position_embeddings : 4096;
    if (ctx_size > s.cfg.max_position_embeddings) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "--ctx-size %lld is over the model's context of %d "
                       "tokens", ctx_size, s.cfg.max_position_embeddings);
        goto fail;
    }
    s.ctx_size = (int)ctx_size;
    L3D_CHECK_GOTO(ctx, l3d_device_create(ctx, dname, &dp, &dev), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_model_open(ctx, dev, ckpt, &s.model), st, fail);
    l3d_engine_params_t ep = {.slots = (int)slots, .ctx_size = (int)ctx_size,
                              .queue_max = (int)qmax, .prefill_chunk = (int)pchunk};
    L3D_CHECK_GOTO(ctx, l3d_engine_create(s.model, &ep, &s.engine), st, fail);
    if (pthread_create(&th, NULL, engine_main, s.engine)) {
        st = l3d_error(ctx, L3D_ERR_SYSTEM, "cannot start the engine's thread");
        goto fail;
    }
    started = 1;
    s.created = (long)time(NULL);
    s.ready = 1;
    double kv_mib = 2.0 * slots * ctx_size * s.cfg.num_hidden_layers *
                    s.cfg.num_key_value_heads * s.cfg.head_dim * sizeof(float) / 1048576.0;
    fprintf(stderr, "l3d serve: model %s: %lld slots of %lld tokens each (KV cache %.1f MiB), "
            "%lld more may wait, %g s a request\n", s.model_name, slots, ctx_size, kv_mib, qmax,
            tmo);
    printf("listening on http://%s%s%s:%d\n", strchr(host, ':') ? "[" : "", host,
           strchr(host, ':') ? "]" : "", bound);
    fflush(stdout);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    fprintf(stderr, "l3d serve: %s: finishing the requests in flight (%g s at most)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", grace_s);
    s.ready = 0;
    l3d_serve_http_quiesce(d);
    l3d_engine_stop(s.engine, 0);
    double until = l3d_time_now() + grace_s;
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
    goto out;
fail:
    rc = l3d_cli_fail("serve", ctx, st);
out:
    if (started) {
        l3d_engine_stop(s.engine, 1);
        pthread_join(th, NULL);
    }
    l3d_serve_http_stop(d);  // (every connection has had its answer: the engine ended them all)
    l3d_engine_destroy(s.engine);
    l3d_model_destroy(s.model);
    l3d_tokenizer_destroy(s.tok);
    l3d_device_destroy(dev);
    pthread_mutex_destroy(&s.mu);
    pthread_mutex_destroy(&s.tok_mu);
    l3d_ctx_destroy(ctx);
    return l3d_cli_finish_stdout(rc);
}
