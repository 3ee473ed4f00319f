// l3d serve's endpoints that do not generate (/health, /v1/models, /tokenize, /detokenize,
// /metrics) and the routing of every path.
// defines: l3d_serve_handle
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/serve.h"
#include "core/l3d_core.h"

// (an error answer of a plain message: l3d_serve_fail's type from the status)
static int err(char **out_p, int status, const char *param, const char *code, const char *msg) {
    return l3d_serve_fail(out_p, status, param, code, "%s", msg);
}

// POST /tokenize {"content": text, "add_special": bool, "parse_special": bool} -> {"tokens"}
// (llama-server's; add_special adds BOS, parse_special reads special-token texts as their ids)
static int tokenize(srv_t *s, json_t *root, char **out_p) {
    json_t *c = json_object_get(root, "content");
    if (!json_is_string(c))
        return err(out_p, 400, "content", "invalid_type", "'content' must be a string");
    json_t *as = json_object_get(root, "add_special"), *ps = json_object_get(root, "parse_special");
    if ((as && !json_is_boolean(as)) || (ps && !json_is_boolean(ps)))
        return err(out_p, 400, as && !json_is_boolean(as) ? "add_special" : "parse_special",
                   "invalid_type", "must be true or false");
    unsigned flags = (json_is_true(as) ? L3D_TOKENIZE_BOS : 0) |
                     (!ps || json_is_true(ps) ? L3D_TOKENIZE_SPECIAL : 0);
    int32_t *ids = NULL;
    size_t n = 0;
    pthread_mutex_lock(&s->tok_mu);
    l3d_status st = l3d_tokenizer_encode(s->tok, json_string_value(c), json_string_length(c),
                                         flags, &ids, &n);
    pthread_mutex_unlock(&s->tok_mu);
    if (st < 0) return err(out_p, 400, "content", "invalid_value", l3d_strerror(st));
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    l3d_tokens_free(s->ctx, ids, n);
    *out_p = l3d_serve_dump(json_pack("{s:o}", "tokens", arr));
    return 200;
}

// POST /detokenize {"tokens": [ids]} -> {"content": text}
static int detokenize(srv_t *s, json_t *root, char **out_p) {
    json_t *t = json_object_get(root, "tokens");
    if (!json_is_array(t))
        return err(out_p, 400, "tokens", "invalid_type", "'tokens' must be an array of token ids");
    size_t n = json_array_size(t), i;
    int32_t *ids = malloc((n ? n : 1) * sizeof(int32_t));
    if (!ids) return err(out_p, 500, NULL, NULL, "out of memory");
    json_t *e;
    json_array_foreach(t, i, e) {
        json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
        if (v < 0 || v >= l3d_tokenizer_vocab_size(s->tok)) {
            free(ids);
            char msg[120];
            snprintf(msg, sizeof(msg), "tokens[%zu] is not a token id in [0, %d)", i,
                     (int)l3d_tokenizer_vocab_size(s->tok));
            return err(out_p, 400, "tokens", "invalid_value", msg);
        }
        ids[i] = (int32_t)v;
    }
    size_t len = 0;
    pthread_mutex_lock(&s->tok_mu);
    l3d_status st = l3d_tokenizer_decode(s->tok, ids, n, 0, NULL, 0, &len);
    char *text = st >= 0 ? malloc(len + 1) : NULL;
    if (text) st = l3d_tokenizer_decode(s->tok, ids, n, 0, text, len + 1, &len);
    pthread_mutex_unlock(&s->tok_mu);
    free(ids);
    if (st < 0 || !text) {
        free(text);
        return err(out_p, 500, NULL, NULL, "decoding failed");
    }
    // (bytes that are not UTF-8 cannot be a JSON string: an error, not a silent change)
    json_t *str = json_stringn(text, len);
    free(text);
    if (!str)
        return err(out_p, 400, "tokens", "invalid_value",
                   "these tokens' bytes are not valid UTF-8 text");
    *out_p = l3d_serve_dump(json_pack("{s:o}", "content", str));
    return 200;
}

// GET /metrics: Prometheus' text format.
static int metrics(srv_t *s, char **out_p) {
    l3d_engine_stats_t st;
    l3d_engine_get_stats(s->engine, &st);
    uint64_t http[6];
    pthread_mutex_lock(&s->mu);
    memcpy(http, s->http_status, sizeof(http));
    pthread_mutex_unlock(&s->mu);
    size_t cap = 8192, n = 0;
    char *b = malloc(cap);
    if (!b) return err(out_p, 500, NULL, NULL, "out of memory");
#define P(...) n += (size_t)snprintf(b + n, n < cap ? cap - n : 0, __VA_ARGS__)
    static const char *const cls[6] = {"2xx", "400", "401", "404", "429_413", "5xx"};
    P("# HELP l3d_http_requests_total HTTP requests answered, by status class.\n"
      "# TYPE l3d_http_requests_total counter\n");
    for (int i = 0; i < 6; i++) P("l3d_http_requests_total{status=\"%s\"} %llu\n", cls[i],
                                  (unsigned long long)http[i]);
    static const char *const fin[6] = {"", "stop", "length", "cancelled", "timeout", "error"};
    P("# HELP l3d_requests_finished_total Generation requests ended, by reason.\n"
      "# TYPE l3d_requests_finished_total counter\n");
    for (int i = 1; i < 6; i++) P("l3d_requests_finished_total{reason=\"%s\"} %llu\n", fin[i],
                                  (unsigned long long)st.finished[i]);
    P("# TYPE l3d_prompt_tokens_total counter\nl3d_prompt_tokens_total %llu\n"
      "# HELP l3d_prompt_tokens_cached_total Prompt tokens reused from a slot's KV cache.\n"
      "# TYPE l3d_prompt_tokens_cached_total counter\nl3d_prompt_tokens_cached_total %llu\n"
      "# TYPE l3d_generated_tokens_total counter\nl3d_generated_tokens_total %llu\n",
      (unsigned long long)st.prompt_tokens, (unsigned long long)st.prompt_tokens_cached,
      (unsigned long long)st.generated_tokens);
    const char *hn[2] = {"l3d_time_to_first_token_seconds", "l3d_inter_token_latency_seconds"};
    const uint64_t *hc[2] = {st.ttft_count, st.itl_count};
    double hs[2] = {st.ttft_sum, st.itl_sum};
    for (int h = 0; h < 2; h++) {
        P("# TYPE %s histogram\n", hn[h]);
        uint64_t cum = 0;
        for (int k = 0; k < L3D_ENGINE_HIST_BUCKETS; k++) {
            cum += hc[h][k];
            if (k == L3D_ENGINE_HIST_BUCKETS - 1)
                P("%s_bucket{le=\"+Inf\"} %llu\n", hn[h], (unsigned long long)cum);
            else
                P("%s_bucket{le=\"%g\"} %llu\n", hn[h], l3d_engine_hist_bounds[k],
                  (unsigned long long)cum);
        }
        P("%s_sum %.6f\n%s_count %llu\n", hn[h], hs[h], hn[h], (unsigned long long)cum);
    }
    P("# TYPE l3d_queue_depth gauge\nl3d_queue_depth %d\n"
      "# TYPE l3d_requests_running gauge\nl3d_requests_running %d\n"
      "# TYPE l3d_slots gauge\nl3d_slots %d\n"
      "# HELP l3d_kv_cache_usage_ratio Positions of the KV cache held by running requests.\n"
      "# TYPE l3d_kv_cache_usage_ratio gauge\nl3d_kv_cache_usage_ratio %.6f\n",
      st.queued, st.running, st.slots,
      st.kv_capacity ? (double)st.kv_used / (double)st.kv_capacity : 0.0);
#undef P
    if (n >= cap) {
        free(b);
        return err(out_p, 500, NULL, NULL, "metrics overflow");
    }
    *out_p = b;
    return 200;
}

int l3d_serve_handle(srv_t *s, const char *method, const char *path, const char *body,
                     size_t len, int fd, char **out_p, const char **ctype_p, hreq_t **hr_p) {
    *ctype_p = "application/json";
    *hr_p = NULL;
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    static const char *const gets[] = {"/health", "/v1/health", "/v1/models", "/metrics"};
    static const char *const posts[] = {"/v1/chat/completions", "/v1/completions",
                                        "/chat/completions", "/completions", "/tokenize",
                                        "/detokenize"};
    int is_get = 0, is_post = 0;
    for (size_t i = 0; i < sizeof(gets) / sizeof(gets[0]); i++) is_get |= !strcmp(path, gets[i]);
    for (size_t i = 0; i < sizeof(posts) / sizeof(posts[0]); i++)
        is_post |= !strcmp(path, posts[i]);
    if (!is_get && !is_post) {
        char msg[300];
        snprintf(msg, sizeof(msg), "no route %.200s", path);
        return err(out_p, 404, NULL, "not_found", msg);
    }
    if ((is_get && !get) || (is_post && !post)) {
        char msg[300];
        snprintf(msg, sizeof(msg), "%.200s takes %s, not %.20s", path, is_get ? "GET" : "POST",
                 method);
        return err(out_p, 405, NULL, "method_not_allowed", msg);
    }
    if (!strcmp(path, "/health") || !strcmp(path, "/v1/health")) {
        if (!s->ready) return err(out_p, 503, NULL, "unavailable", "loading the model");
        *out_p = strdup("{\"status\":\"ok\"}");
        return 200;
    }
    if (!s->ready) return err(out_p, 503, NULL, "unavailable", "loading the model");
    if (!strcmp(path, "/v1/models")) {
        *out_p = l3d_serve_dump(json_pack(
            "{s:s, s:[{s:s, s:s, s:i, s:s, s:{s:i, s:i}}]}", "object", "list", "data", "id",
            s->model_name, "object", "model", "created", (json_int_t)s->created, "owned_by",
            "llama3d", "meta", "n_ctx_slot", s->ctx_size, "n_vocab", s->cfg.vocab_size));
        return 200;
    }
    if (!strcmp(path, "/metrics")) {
        *ctype_p = "text/plain; version=0.0.4";
        return metrics(s, out_p);
    }
    if (!strcmp(path, "/tokenize") || !strcmp(path, "/detokenize")) {
        json_error_t je;
        json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(root)) {
            json_decref(root);
            char msg[300];
            snprintf(msg, sizeof(msg), "invalid JSON: %s", root ? "not an object" : je.text);
            return err(out_p, 400, NULL, "invalid_json", msg);
        }
        int st = path[1] == 't' ? tokenize(s, root, out_p) : detokenize(s, root, out_p);
        json_decref(root);
        return st;
    }
    int chat = strstr(path, "chat") != NULL;
    int st = l3d_serve_generate(s, chat, body, len, fd, out_p, hr_p);
    return st ? st : 0;
}
