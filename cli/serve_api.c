// l3d serve's OpenAI API: requests into engine requests, the engine's token events into text
// (stop strings matched across token boundaries, UTF-8 kept whole), and the answers: plain
// JSON or server-sent events. Every client mistake is a 4xx with OpenAI's error body.
// defines: l3d_serve_dump, l3d_serve_fail, l3d_serve_generate, l3d_serve_finish_body,
//          l3d_serve_hreq_release, l3d_serve_count_status
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/serve.h"
#include "core/l3d_core.h"

// ---- small things --------------------------------------------------------------------------
char *l3d_serve_dump(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

void l3d_serve_count_status(srv_t *s, int status) {
    int k = status < 400 ? 0 : status == 400 ? 1 : status == 401 ? 2
            : status == 404 || status == 405 ? 3 : status < 500 ? 4 : 5;
    pthread_mutex_lock(&s->mu);
    s->http_status[k]++;
    pthread_mutex_unlock(&s->mu);
}

// Bytes [0, m) of p[0..n) that end on a whole UTF-8 character (a token may end inside one).
static size_t utf8_whole(const char *p, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)p[n - back];
        if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

// The length of the valid UTF-8 character at p[0..n), 0 if there is none (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF).
static size_t utf8_char(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                  : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!need || need > n) return 0;
    for (size_t i = 1; i < need; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if (need == 3 && ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F))) return 0;
    if (need == 4 && ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] > 0x8F))) return 0;
    return need;
}

// A JSON string of p[0..n), each byte that starts no valid UTF-8 character replaced by U+FFFD
// (jansson refuses invalid UTF-8, and a token or a stop cut can leave part of a character).
static json_t *jstr(const char *p, size_t n) {
    char *b = malloc(3 * n + 1);
    if (!b) return json_string("");
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char((const unsigned char *)p + i, n - i);
        if (k) {
            memcpy(b + o, p + i, k);
            o += k, i += k;
        } else {
            memcpy(b + o, "\xEF\xBF\xBD", 3);
            o += 3, i++;
        }
    }
    json_t *r = json_stringn(b, o);
    free(b);
    return r ? r : json_string("");
}

int l3d_serve_fail(char **out_p, int status, const char *param, const char *code, const char *fmt,
                   ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *type = status == 401 ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 408 ? "timeout_error"
                       : status == 429 ? "rate_limit_error"
                       : status == 503 ? "unavailable_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    // (the message may quote the request's bytes, cut anywhere by its %.Ns: jstr keeps it
    // valid UTF-8, which jansson requires; param and code are our own names)
    *out_p = l3d_serve_dump(json_pack("{s:{s:o, s:s, s:s?, s:s?}}", "error", "message",
                                      jstr(msg, strlen(msg)), "type", type, "param", param,
                                      "code", code));
    return status;
}

static int grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return -1;
    *p = q, *cap = c;
    return 0;
}

// ---- the request's lifetime ------------------------------------------------------------------
void l3d_serve_hreq_release(hreq_t *hr) {
    if (!hr) return;
    pthread_mutex_lock(&hr->mu);
    int last = --hr->refs == 0;
    pthread_mutex_unlock(&hr->mu);
    if (!last) return;
    for (int i = 0; i < hr->n_stop; i++) free(hr->stop[i]);
    free(hr->stop);
    free(hr->text);
    free(hr->out);
    json_decref(hr->lp);
    pthread_cond_destroy(&hr->cv);
    pthread_mutex_destroy(&hr->mu);
    free(hr);
}

// ---- events into text ----------------------------------------------------------------------
// One server-sent event with a chunk of the answer (delta text, logprobs, finish reason).
static void sse_chunk(hreq_t *hr, const char *text, size_t n, json_t *lp, const char *finish) {
    srv_t *s = hr->s;
    json_t *choice;
    if (hr->chat) {
        json_t *delta = json_object();
        if (!hr->role_sent) json_object_set_new(delta, "role", json_string("assistant"));
        if (n || !hr->role_sent) json_object_set_new(delta, "content", jstr(text, n));
        hr->role_sent = 1;
        choice = json_pack("{s:i, s:o}", "index", 0, "delta", delta);
        json_object_set_new(choice, "logprobs",
                            lp ? json_pack("{s:o}", "content", lp) : json_null());
    } else {
        choice = json_pack("{s:i, s:o}", "index", 0, "text", jstr(text, n));
        json_object_set_new(choice, "logprobs", lp ? lp : json_null());
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *c = json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", hr->id, "object",
                          hr->chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)hr->created, "model", s->model_name, "choices", choice);
    char *d = l3d_serve_dump(c);
    if (!d) return;
    size_t dl = strlen(d);
    if (grow(&hr->out, &hr->ocap, hr->olen + dl + 9) == 0) {
        memcpy(hr->out + hr->olen, "data: ", 6);
        memcpy(hr->out + hr->olen + 6, d, dl);
        memcpy(hr->out + hr->olen + 6 + dl, "\n\n", 2);
        hr->olen += dl + 8;
    }
    free(d);
}

static json_t *usage(const hreq_t *hr) {
    int completion = hr->generated;
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", hr->prompt_tokens,
                     "completion_tokens", completion, "total_tokens",
                     hr->prompt_tokens + completion, "prompt_tokens_details", "cached_tokens",
                     hr->cached_tokens);
}

static void sse_raw(hreq_t *hr, const char *line) {
    size_t n = strlen(line);
    if (grow(&hr->out, &hr->ocap, hr->olen + n + 1) == 0) {
        memcpy(hr->out + hr->olen, line, n);
        hr->olen += n;
    }
}

static const char *finish_reason(int f) {
    return f == L3D_GEN_LENGTH ? "length" : "stop";  // (cancelled and late end the stream)
}

// A token's logprobs entry, in the endpoint's shape.
static json_t *lp_entry(hreq_t *hr, const char *piece, size_t n, const l3d_gen_event_t *ev) {
    srv_t *s = hr->s;
    json_t *top = hr->chat ? json_array() : json_object();
    char buf[256];
    for (int i = 0; i < ev->n_top; i++) {
        size_t len = 0;
        pthread_mutex_lock(&s->tok_mu);  // (lock order: hr->mu, then tok_mu)
        if (l3d_tokenizer_token_to_piece(s->tok, ev->top_ids[i], buf, sizeof(buf), &len) < 0)
            len = 0;
        pthread_mutex_unlock(&s->tok_mu);
        json_t *t = jstr(buf, len);
        if (hr->chat) {
            json_array_append_new(top, json_pack("{s:o, s:f}", "token", t, "logprob",
                                                 (double)ev->top_logprobs[i]));
        } else {
            json_object_set_new(top, json_string_value(t), json_real(ev->top_logprobs[i]));
            json_decref(t);
        }
    }
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(bytes, json_integer((unsigned char)piece[i]));
    if (hr->chat)
        return json_pack("{s:o, s:f, s:o, s:o}", "token", jstr(piece, n), "logprob",
                         (double)ev->logprob, "bytes", bytes, "top_logprobs", top);
    json_decref(bytes);
    return json_pack("{s:o, s:f, s:o}", "token", jstr(piece, n), "logprob", (double)ev->logprob,
                     "top_logprobs", top);
}

// The completions endpoint's logprobs object from the entries (legacy parallel arrays).
static json_t *legacy_logprobs(json_t *entries, size_t base_offset) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    size_t off = base_offset, i;
    json_t *e;
    json_array_foreach(entries, i, e) {
        json_t *t = json_object_get(e, "token");
        json_array_append(tokens, t);
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append(tops, json_object_get(e, "top_logprobs"));
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += strlen(json_string_value(t));
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

// The engine's callback (its thread): text, stop strings, stream chunks; the last event wakes
// the connection's thread.
static int on_event(void *user, const l3d_gen_event_t *ev) {
    hreq_t *hr = user;
    srv_t *s = hr->s;
    int verdict = L3D_GEN_CONTINUE;
    char piece[512];
    size_t n = 0;
    if (ev->token >= 0 && !l3d_tokenizer_is_special(s->tok, ev->token)) {
        pthread_mutex_lock(&s->tok_mu);
        if (l3d_tokenizer_token_to_piece(s->tok, ev->token, piece, sizeof(piece), &n) < 0) n = 0;
        pthread_mutex_unlock(&s->tok_mu);
    }
    pthread_mutex_lock(&hr->mu);
    size_t before = hr->tlen;
    if (n && grow(&hr->text, &hr->tcap, hr->tlen + n + 1) == 0) {
        memcpy(hr->text + hr->tlen, piece, n);
        hr->tlen += n;
    }
    size_t stop_at = hr->tlen, safe = hr->tlen;
    if (hr->n_stop) {
        (void)l3d_stop_strings_find((const char *const *)hr->stop, hr->n_stop, hr->text, hr->tlen,
                                    &stop_at, &safe);
        if (stop_at < hr->tlen) {
            hr->tlen = stop_at;  // the answer ends before the stop string
            verdict = L3D_GEN_SAY_STOP;
        }
    }
    json_t *entry = NULL;
    // (a token whose text lies wholly in a stop string is not part of the answer)
    if (ev->token >= 0 && hr->logprobs && !(verdict == L3D_GEN_SAY_STOP && stop_at <= before)) {
        entry = lp_entry(hr, piece, n, ev);
        if (!hr->lp) hr->lp = json_array();
        if (!hr->stream) json_array_append(hr->lp, entry);
    }
    int last = ev->finish != L3D_GEN_RUNNING;
    if (hr->stream) {
        size_t upto = last ? hr->tlen : utf8_whole(hr->text, safe < hr->tlen ? safe : hr->tlen);
        if (upto > hr->shown || entry || (!hr->role_sent && hr->chat)) {
            json_t *lpa = NULL;
            if (entry) {
                lpa = json_array();
                json_array_append(lpa, entry);
                if (!hr->chat) {
                    json_t *l = legacy_logprobs(lpa, hr->shown);
                    json_decref(lpa);
                    lpa = l;
                }
            }
            // (no text yet, before the first piece: hr->text is NULL)
            sse_chunk(hr, hr->text ? hr->text + hr->shown : "",
                      upto > hr->shown ? upto - hr->shown : 0, lpa, NULL);
            if (upto > hr->shown) hr->shown = upto;
        }
    }
    json_decref(entry);
    if (last && ev->finish == L3D_GEN_ERROR)  // (the client gets a 500; the log says why)
        fprintf(stderr, "l3d serve: %s failed: %s\n", hr->id, l3d_ctx_last_error(s->ctx));
    if (last) {
        hr->finished = 1;
        hr->finish = ev->finish;
        hr->prompt_tokens = ev->prompt_tokens;
        hr->cached_tokens = ev->cached_tokens;
        hr->generated = ev->generated;
        if (hr->stream && (ev->finish == L3D_GEN_STOP || ev->finish == L3D_GEN_LENGTH)) {
            sse_chunk(hr, "", 0, NULL, finish_reason(ev->finish));
            if (hr->include_usage) {
                json_t *c = json_pack("{s:s, s:s, s:i, s:s, s:[], s:o}", "id", hr->id, "object",
                                      hr->chat ? "chat.completion.chunk" : "text_completion",
                                      "created", (json_int_t)hr->created, "model",
                                      s->model_name, "choices", "usage", usage(hr));
                char *d = l3d_serve_dump(c);
                if (d) {
                    sse_raw(hr, "data: ");
                    sse_raw(hr, d);
                    sse_raw(hr, "\n\n");
                    free(d);
                }
            }
        }
        if (hr->stream) sse_raw(hr, "data: [DONE]\n\n");
    }
    if (hr->gone) verdict = L3D_GEN_SAY_CANCEL;
    pthread_cond_broadcast(&hr->cv);
    pthread_mutex_unlock(&hr->mu);
    if (last) l3d_serve_hreq_release(hr);  // the engine's reference
    return verdict;
}

char *l3d_serve_finish_body(hreq_t *hr) {
    srv_t *s = hr->s;
    json_t *choice =
        json_pack("{s:i, s:s}", "index", 0, "finish_reason", finish_reason(hr->finish));
    json_t *lp = hr->lp ? json_incref(hr->lp) : NULL;
    if (hr->chat) {
        json_object_set_new(choice, "message", json_pack("{s:s, s:o}", "role", "assistant",
                                                         "content", jstr(hr->text, hr->tlen)));
        json_object_set_new(choice, "logprobs",
                            lp ? json_pack("{s:o}", "content", lp) : json_null());
    } else {
        json_object_set_new(choice, "text", jstr(hr->text, hr->tlen));
        json_object_set_new(choice, "logprobs", lp ? legacy_logprobs(lp, 0) : json_null());
        if (lp && !hr->chat) json_decref(lp);
    }
    return l3d_serve_dump(json_pack("{s:s, s:s, s:i, s:s, s:[o], s:o}", "id", hr->id, "object",
                                    hr->chat ? "chat.completion" : "text_completion", "created",
                                    (json_int_t)hr->created, "model", s->model_name, "choices",
                                    choice, "usage", usage(hr)));
}

// ---- requests --------------------------------------------------------------------------------
// A number field of the request: absent keeps *v; present it must be a number in [lo, hi].
static int num_field(json_t *root, const char *key, double lo, double hi, double *v, char **out_p,
                     int *status) {
    json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_number(j)) {
        *status = l3d_serve_fail(out_p, 400, key, "invalid_type", "'%s' must be a number", key);
        return -1;
    }
    double x = json_number_value(j);
    if (!(x >= lo && x <= hi)) {
        *status = l3d_serve_fail(out_p, 400, key, "invalid_value",
                                 "'%s' is %g; it must be in [%g, %g]", key, x, lo, hi);
        return -1;
    }
    *v = x;
    return 1;
}

static int int_field(json_t *root, const char *key, long long lo, long long hi, long long *v,
                     char **out_p, int *status) {
    json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_integer(j)) {
        *status = l3d_serve_fail(out_p, 400, key, "invalid_type", "'%s' must be an integer", key);
        return -1;
    }
    long long x = json_integer_value(j);
    if (x < lo || x > hi) {
        *status = l3d_serve_fail(out_p, 400, key, "invalid_value",
                                 "'%s' is %lld; it must be in [%lld, %lld]", key, x, lo, hi);
        return -1;
    }
    *v = x;
    return 1;
}

static int bool_field(json_t *root, const char *key, int *v, char **out_p, int *status) {
    json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_boolean(j)) {
        *status =
            l3d_serve_fail(out_p, 400, key, "invalid_type", "'%s' must be true or false", key);
        return -1;
    }
    *v = json_is_true(j);
    return 1;
}

// The prompt's ids: the chat template over `messages`, or `prompt` (a string, with BOS and
// special-token texts parsed as l3d generate does, or an array of token ids).
static int prompt_ids(srv_t *s, hreq_t *hr, json_t *root, int32_t **ids_p, size_t *n_p,
                      char **out_p) {
    l3d_status st;
    if (hr->chat) {
        json_t *msgs = json_object_get(root, "messages");
        if (!json_is_array(msgs) || json_array_size(msgs) == 0)
            return l3d_serve_fail(out_p, 400, "messages", "invalid_type",
                                  "'messages' must be a non-empty array of {role, content}");
        size_t nm = json_array_size(msgs);
        l3d_chat_message_t *m = calloc(nm, sizeof(*m));
        char **owned = calloc(nm, sizeof(char *));
        int status = 0;
        for (size_t i = 0; i < nm && m && owned && !status; i++) {
            json_t *e = json_array_get(msgs, i), *role = json_object_get(e, "role"),
                   *content = json_object_get(e, "content");
            const char *r = json_string_value(role);
            if (!json_is_object(e) || !r)
                status = l3d_serve_fail(out_p, 400, "messages", "invalid_type",
                                        "messages[%zu] needs a string 'role'", i);
            else if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
                     strcmp(r, "developer"))
                status = l3d_serve_fail(
                    out_p, 400, "messages", "invalid_value",
                    "messages[%zu].role '%.40s' is not system, developer, user or assistant", i, r);
            else if (json_is_string(content))
                m[i].content = json_string_value(content);
            else if (json_is_array(content)) {  // text parts [{type: "text", text}, ...]
                size_t len = 0, k;
                json_t *part;
                json_array_foreach(content, k, part) {
                    const char *t = json_string_value(json_object_get(part, "text"));
                    const char *ty = json_string_value(json_object_get(part, "type"));
                    if (!t || !ty || strcmp(ty, "text")) {
                        status = l3d_serve_fail(
                            out_p, 400, "messages", "invalid_value",
                            "messages[%zu].content[%zu]: only {type: \"text\", text} parts", i, k);
                        break;
                    }
                    len += strlen(t);
                }
                if (!status && (owned[i] = malloc(len + 1))) {
                    owned[i][0] = 0;
                    json_array_foreach(content, k, part)
                        strcat(owned[i], json_string_value(json_object_get(part, "text")));
                    m[i].content = owned[i];
                }
            } else
                status = l3d_serve_fail(out_p, 400, "messages", "invalid_type",
                                        "messages[%zu].content must be a string or text parts", i);
            if (!status) m[i].role = strcmp(r, "developer") ? r : "system";
        }
        if (!status && (!m || !owned))
            status = l3d_serve_fail(out_p, 500, NULL, NULL, "out of memory");
        if (!status) {
            pthread_mutex_lock(&s->tok_mu);
            st = l3d_tokenizer_encode_chat(s->tok, m, nm, NULL, ids_p, n_p);
            pthread_mutex_unlock(&s->tok_mu);
            if (st == L3D_ERR_UNSUPPORTED)
                status = l3d_serve_fail(out_p, 400, "messages", "unsupported",
                                        "this model's tokenizer has no chat template llama3d "
                                        "knows; use /v1/completions");
            else if (st < 0)
                status = l3d_serve_fail(out_p, 400, "messages", "invalid_value",
                                        "the conversation cannot be encoded: %s", l3d_strerror(st));
        }
        for (size_t i = 0; owned && i < nm; i++) free(owned[i]);
        free(owned);
        free(m);
        return status;
    }
    json_t *p = json_object_get(root, "prompt");
    if (json_is_string(p)) {
        pthread_mutex_lock(&s->tok_mu);
        st = l3d_tokenizer_encode(s->tok, json_string_value(p), json_string_length(p),
                                  L3D_TOKENIZE_BOS | L3D_TOKENIZE_SPECIAL, ids_p, n_p);
        pthread_mutex_unlock(&s->tok_mu);
        return st < 0 ? l3d_serve_fail(out_p, 400, "prompt", "invalid_value",
                                       "the prompt cannot be encoded: %s", l3d_strerror(st))
                      : 0;
    }
    if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        size_t n = json_array_size(p), i;
        json_t *e;
        *ids_p = l3d_malloc(s->ctx, n * sizeof(int32_t), "data");  // (as l3d_tokens_free frees)
        if (!*ids_p) return l3d_serve_fail(out_p, 500, NULL, NULL, "out of memory");
        *n_p = n;
        json_array_foreach(p, i, e) {
            json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;
            if (v < 0 || v >= s->cfg.vocab_size)
                return l3d_serve_fail(out_p, 400, "prompt", "invalid_value",
                                      "prompt[%zu] is not a token id in [0, %d)", i,
                                      s->cfg.vocab_size);
            (*ids_p)[i] = (int32_t)v;
        }
        return 0;
    }
    return l3d_serve_fail(
        out_p, 400, "prompt", "invalid_type",
        "'prompt' must be a string or an array of token ids (one prompt per request)");
}

// Parses a generating request and submits it. 0 and *hr_p on success, else a status.
int l3d_serve_generate(srv_t *s, int chat, const char *body, size_t len, int fd, char **out_p,
                       hreq_t **hr_p) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return l3d_serve_fail(out_p, 400, NULL, "invalid_json", "invalid JSON: %s (line %d)",
                              jerr.text, jerr.line);
    int status = 0;
    hreq_t *hr = calloc(1, sizeof(*hr));
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!hr) {
        json_decref(root);
        return l3d_serve_fail(out_p, 500, NULL, NULL, "out of memory");
    }
    pthread_mutex_init(&hr->mu, NULL);
    pthread_cond_init(&hr->cv, NULL);
    hr->refs = 1, hr->s = s, hr->chat = chat, hr->fd = fd, hr->top_logprobs = -1;
    if (!json_is_object(root)) {
        status = l3d_serve_fail(out_p, 400, NULL, "invalid_type", "the body must be a JSON object");
        goto out;
    }
    const char *model = json_string_value(json_object_get(root, "model"));
    if (json_object_get(root, "model") && !model) {
        status = l3d_serve_fail(out_p, 400, "model", "invalid_type", "'model' must be a string");
        goto out;
    }
    if (model && strcmp(model, s->model_name)) {
        status = l3d_serve_fail(out_p, 404, "model", "model_not_found",
                                "the model '%.100s' does not exist here (this server has '%s')",
                                model, s->model_name);
        goto out;
    }
    // sampling: the checkpoint's generation_config.json, else llama.cpp's defaults; the request
    l3d_gen_request_t q = {.max_tokens = 0, .top_logprobs = -1, .timeout_s = s->timeout_s};
    l3d_sampler_params_default(&q.sampling);
    if (s->gc.do_sample == 0) q.sampling.temperature = 0.0f;
    else if (s->gc.temperature >= 0) q.sampling.temperature = s->gc.temperature;
    if (s->gc.top_p > 0) q.sampling.top_p = s->gc.top_p;
    if (s->gc.top_k >= 0) q.sampling.top_k = s->gc.top_k;
    q.sampling.seed = s->seeded ? s->seed
                                : (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)hr << 16);
    double d;
    long long ll;
    int b;
#define NUM(key, lo, hi, dst)                                                 \
    if ((b = num_field(root, key, lo, hi, &d, out_p, &status)) < 0) goto out; \
    if (b) dst = (float)d;
#define INT(key, lo, hi, dst)                                                 \
    if ((b = int_field(root, key, lo, hi, &ll, out_p, &status)) < 0) goto out; \
    if (b) dst = ll;
    NUM("temperature", 0, 2, q.sampling.temperature);
    NUM("top_p", 0, 1, q.sampling.top_p);
    NUM("min_p", 0, 1, q.sampling.min_p);
    NUM("frequency_penalty", -2, 2, q.sampling.frequency_penalty);
    NUM("presence_penalty", -2, 2, q.sampling.presence_penalty);
    NUM("repeat_penalty", 0, 100, q.sampling.repeat_penalty);
    if (q.sampling.top_p == 0) q.sampling.top_p = 1e-9f;  // (0: only the likeliest, as OpenAI)
    if (q.sampling.repeat_penalty == 0) q.sampling.repeat_penalty = 1;
    long long top_k = q.sampling.top_k, seed = -1, max_tokens = -1, n = 1;
    INT("top_k", 0, 1 << 30, top_k);
    INT("seed", LLONG_MIN, LLONG_MAX, seed);
    INT("max_tokens", 1, 1 << 30, max_tokens);
    INT("max_completion_tokens", 1, 1 << 30, max_tokens);
    INT("n", 1, 1, n);  // (one choice per request)
    (void)n;
    q.sampling.top_k = (int)top_k;
    if (seed != -1) q.sampling.seed = (uint64_t)seed;
    if (bool_field(root, "stream", &hr->stream, out_p, &status) < 0) goto out;
    int ignore_eos = 0;  // (llama-server's: generate past the end-of-text ids)
    if (bool_field(root, "ignore_eos", &ignore_eos, out_p, &status) < 0) goto out;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            status = l3d_serve_fail(out_p, 400, "stream_options", "invalid_type",
                                    "'stream_options' must be an object");
            goto out;
        }
        if (bool_field(so, "include_usage", &hr->include_usage, out_p, &status) < 0) goto out;
    }
    // logprobs: chat {logprobs: bool, top_logprobs: 0..20}; completions {logprobs: 0..5}
    if (chat) {
        if (bool_field(root, "logprobs", &hr->logprobs, out_p, &status) < 0) goto out;
        long long tl = 0;
        INT("top_logprobs", 0, L3D_GEN_TOP_MAX, tl);
        if (json_object_get(root, "top_logprobs") && !hr->logprobs) {
            status = l3d_serve_fail(out_p, 400, "top_logprobs", "invalid_value",
                                    "'top_logprobs' needs 'logprobs': true");
            goto out;
        }
        hr->top_logprobs = (int)tl;
    } else {
        long long lp = -1;
        INT("logprobs", 0, 5, lp);
        hr->logprobs = lp >= 0;
        hr->top_logprobs = (int)(lp > 0 ? lp : 0);
    }
    // stop: a string or strings (matched in the text, across tokens)
    json_t *stop = json_object_get(root, "stop");
    if (stop && !json_is_null(stop)) {
        size_t ns = json_is_string(stop) ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
        if (!ns && !json_is_array(stop)) {
            status = l3d_serve_fail(out_p, 400, "stop", "invalid_type",
                                    "'stop' must be a string or an array of strings");
            goto out;
        }
        hr->stop = calloc(ns ? ns : 1, sizeof(char *));
        for (size_t i = 0; i < ns && hr->stop; i++) {
            json_t *e = json_is_string(stop) ? stop : json_array_get(stop, i);
            if (!json_is_string(e) || json_string_length(e) == 0) {
                status = l3d_serve_fail(out_p, 400, "stop", "invalid_value",
                                        "stop[%zu] must be a non-empty string", i);
                goto out;
            }
            hr->stop[hr->n_stop++] = strdup(json_string_value(e));
        }
    }
    status = prompt_ids(s, hr, root, &ids, &n_ids, out_p);
    if (status) goto out;
    if (n_ids == 0 || (int)n_ids > s->ctx_size - 1) {
        status = l3d_serve_fail(
            out_p, 400, chat ? "messages" : "prompt", "context_length_exceeded",
            "the prompt has %zu tokens; a slot's context is %d tokens (at most %d for the prompt)",
            n_ids, s->ctx_size, s->ctx_size - 1);
        goto out;
    }
    q.prompt = ids;
    q.n_prompt = (int)n_ids;
    q.max_tokens = max_tokens > 0 ? (int)max_tokens : s->ctx_size - (int)n_ids;
    q.stop_tokens = s->stops.ids;
    q.n_stop_tokens = ignore_eos ? 0 : s->stops.n;
    q.top_logprobs = hr->logprobs ? hr->top_logprobs : -1;
    q.callback = on_event;
    q.user = hr;
    pthread_mutex_lock(&s->mu);
    uint64_t id = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(hr->id, sizeof(hr->id), "%s-%llx%06llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)time(NULL), (unsigned long long)id);
    hr->created = (long)time(NULL);
    hr->refs = 2;  // the connection's and the engine's
    char why[300];
    l3d_status st = l3d_engine_submit(s->engine, &q, &hr->engine_id, why, sizeof(why));
    if (st < 0) {
        hr->refs = 1;
        status = st == L3D_ERR_BUSY ? l3d_serve_fail(out_p, 429, NULL, "queue_full", "%s", why)
                 : st == L3D_ERR_CANCELLED
                     ? l3d_serve_fail(out_p, 503, NULL, "shutting_down", "%s", why)
                 : st == L3D_ERR_INVALID_ARG
                     ? l3d_serve_fail(out_p, 400, NULL, "invalid_value", "%s", why)
                     : l3d_serve_fail(out_p, 500, NULL, NULL, "%s", why);
    }
#undef NUM
#undef INT
out:
    if (ids) l3d_tokens_free(s->ctx, ids, n_ids);
    json_decref(root);
    if (status) {
        l3d_serve_hreq_release(hr);
        return status;
    }
    *hr_p = hr;
    return 0;
}
