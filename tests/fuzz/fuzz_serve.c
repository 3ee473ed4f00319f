// libFuzzer target: l3d serve's request handling (cli/serve_routes.c, cli/serve_api.c) on a
// real engine over a tiny random model, without the HTTP socket. The first byte picks the
// route (low 3 bits: chat, completions, tokenize, detokenize, models, metrics, health, a
// wrong method or path) and whether an accepted request is cancelled after two steps (bit
// 3); the rest is the body. Checked for every input (issue 29: "every client mistake is a
// 4xx ..., never a 500, a crash or a hang"):
//   - the status is 2xx or 4xx, and a JSON answer parses; a 4xx is OpenAI's error object
//     {"error": {"message": string, "type": string, ...}};
//   - an accepted request ends within its context's steps (no hang), and its answer parses:
//     the whole body, or every server-sent event `data: {json}` up to `data: [DONE]`;
//   - the engine is idle afterwards (nothing queued or running) and every reference is
//     dropped (libFuzzer's leak check covers hreq_t and the answers).
// Each input gets a fresh engine and the server a fixed sampling seed, so that an input's
// answer is the same every run and a failing input repeats (BUILD/tests/fuzz/fuzz_serve FILE).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/serve.h"
#include "core/l3d_core.h"
#include "llama3d/serve.h"
#include "tests/fuzz/fuzz_fixed_tokenizer.h"

static void quiet(l3d_log_level level, uint32_t subsys, const char *msg, void *user) {}

// Harness state, not library state: one server over one engine for every input.
static srv_t srv;
static l3d_device_t *dev;
static l3d_model_t *model;

static void setup(void) {
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.read_env = 0;
    p.log_fn = quiet;
    if (l3d_ctx_create(&p, &srv.ctx) != L3D_OK) __builtin_trap();
    // The tokenizer: the fuzz targets' fixed one (Llama 3's specials and chat template).
    char dir[64], path[128];
    snprintf(dir, sizeof(dir), "/tmp/l3d_fuzz_serve_%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(path, sizeof(path), "%s/tokenizer.model", dir);
    if (fuzz_fixed_tokenizer_write(path) ||
        l3d_tokenizer_open(srv.ctx, path, &srv.tok) != L3D_OK)
        __builtin_trap();
    unlink(path);
    rmdir(dir);
    l3d_tokenizer_special_t sp;
    if (l3d_tokenizer_special_ids(srv.tok, &sp) != L3D_OK) __builtin_trap();
    // The model: every id of the tokenizer, small enough for a step of microseconds.
    l3d_model_config_t *c = &srv.cfg;
    snprintf(c->name, sizeof(c->name), "fuzz");
    c->hidden_size = 32;
    c->intermediate_size = 48;
    c->num_hidden_layers = 1;
    c->num_attention_heads = 2;
    c->num_key_value_heads = 1;
    c->head_dim = 16;
    c->vocab_size = l3d_tokenizer_vocab_size(srv.tok);
    c->max_position_embeddings = 64;
    c->rms_norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->bos_token_id = sp.bos_id;
    c->eos_token_id = sp.eos_id;
    c->initializer_range = 0.3f;
    l3d_device_params_t dp = {.num_threads = 1};
    if (l3d_device_create(srv.ctx, "cpu", &dp, &dev) != L3D_OK ||
        l3d_model_create(srv.ctx, dev, c, &model) != L3D_OK ||
        l3d_model_init_weights(model, 7) != L3D_OK)
        __builtin_trap();
    srv.ctx_size = 48;
    srv.slots = 2;
    srv.seed = 1, srv.seeded = 1;
    l3d_generation_config_default(&srv.gc);
    for (int i = 0; i < sp.n_stop; i++) srv.stops.ids[srv.stops.n++] = sp.stop_ids[i];
    snprintf(srv.model_name, sizeof(srv.model_name), "fuzz");
    srv.body_max = 1 << 20;
    srv.ready = 1;
    pthread_mutex_init(&srv.tok_mu, NULL);
    pthread_mutex_init(&srv.mu, NULL);
}

// Says which check failed and on what, then stops (libFuzzer keeps the input).
static void fail(const char *why, int status, const char *text, size_t len) {
    fprintf(stderr, "fuzz_serve: %s (status %d): %.*s\n", why, status,
            (int)(len < 2000 ? len : 2000), text ? text : "(none)");
    __builtin_trap();
}

// A 4xx answer is OpenAI's error object; any JSON answer parses.
static void check_answer(int status, const char *out, const char *ctype) {
    size_t n = out ? strlen(out) : 0;
    if (status < 200 || status >= 500 || (status >= 300 && status < 400) || !out)
        fail("not a 2xx or 4xx answer", status, out, n);
    if (strcmp(ctype, "application/json")) return;  // (/metrics: Prometheus text)
    json_error_t je;
    json_t *j = json_loads(out, JSON_ALLOW_NUL, &je);  // (a generated 0 byte is "\u0000")
    if (!j) fail(je.text, status, out, n);
    if (status >= 400) {
        json_t *e = json_object_get(j, "error");
        if (!json_is_string(json_object_get(e, "message")) ||
            !json_is_string(json_object_get(e, "type")))
            fail("a 4xx without OpenAI's error object", status, out, n);
    }
    json_decref(j);
}

// Every event of a stream is `data: ` and a JSON object or [DONE], the last being [DONE].
static void check_stream(const char *p, size_t n) {
    int done = 0;
    while (n) {
        const char *end = NULL;
        for (size_t i = 0; i + 1 < n && !end; i++)
            if (p[i] == '\n' && p[i + 1] == '\n') end = p + i;
        if (!end || done || n < 6 || memcmp(p, "data: ", 6))
            fail("not an event `data: ...` before [DONE]", 200, p, n);
        size_t len = (size_t)(end - p) - 6;
        if (len == 6 && !memcmp(p + 6, "[DONE]", 6)) done = 1;
        else {
            json_t *j = json_loadb(p + 6, len, JSON_ALLOW_NUL, NULL);
            if (!json_is_object(j)) fail("an event that is not a JSON object", 200, p, len + 6);
            json_decref(j);
        }
        n -= (size_t)(end - p) + 2;
        p = end + 2;
    }
    if (!done) fail("a stream without data: [DONE]", 200, p, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!srv.ctx) setup();
    if (size < 1) return 0;
    // A fresh engine each input (no cached prefix from an earlier one): with the fixed seed an
    // input gives the same answer every time it runs, so a failing one repeats.
    l3d_engine_params_t ep = {.slots = srv.slots, .ctx_size = srv.ctx_size, .queue_max = 2};
    if (l3d_engine_create(model, &ep, &srv.engine) != L3D_OK) __builtin_trap();
    static const char *const routes[8][2] = {
        {"POST", "/v1/chat/completions"}, {"POST", "/v1/completions"}, {"POST", "/tokenize"},
        {"POST", "/detokenize"},          {"GET", "/v1/models"},       {"GET", "/metrics"},
        {"GET", "/health"},               {"GET", "/v1/chat/completions"}};
    const char *method = routes[data[0] & 7][0], *path = routes[data[0] & 7][1];
    if ((data[0] & 7) == 7 && (data[0] & 16)) path = "/v1/nowhere";
    char *out = NULL;
    const char *ctype = NULL;
    hreq_t *hr = NULL;
    int status = l3d_serve_handle(&srv, method, path, (const char *)data + 1, size - 1, -1, &out,
                                  &ctype, &hr);
    if (status) check_answer(status, out, ctype);
    free(out);
    if (hr) {
        // Accepted: the engine runs it to its end (at most a context of steps; the prompt in
        // chunks of 256), or cancels it after two steps.
        int cancel = data[0] & 8, busy = 1, steps = 0;
        while (busy) {
            if (cancel && steps == 2) l3d_engine_cancel(srv.engine, hr->engine_id);
            if (l3d_engine_step(srv.engine, &busy) < 0 || ++steps > 4 * srv.ctx_size)
                fail("the engine failed or did not finish", 0, l3d_ctx_last_error(srv.ctx), 300);
        }
        pthread_mutex_lock(&hr->mu);
        int finished = hr->finished, fin = hr->finish;
        pthread_mutex_unlock(&hr->mu);
        if (!finished || fin == L3D_GEN_ERROR || fin == L3D_GEN_TIMEOUT)
            fail("a request that did not end well", fin, hr->text, hr->tlen);
        if (hr->stream) {
            check_stream(hr->out, hr->olen);
        } else if (fin != L3D_GEN_CANCELLED) {  // (a cancelled request has no answer)
            char *body = l3d_serve_finish_body(hr);
            check_answer(200, body, "application/json");
            free(body);
        }
        l3d_serve_hreq_release(hr);  // (the engine dropped its reference at the last event)
    }
    l3d_engine_stats_t st;
    l3d_engine_get_stats(srv.engine, &st);
    if (st.queued || st.running) fail("the engine is not idle", st.queued + st.running, "", 0);
    l3d_engine_destroy(srv.engine);
    srv.engine = NULL;
    return 0;
}
