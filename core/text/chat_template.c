// The Llama 3 chat formats, without a Jinja engine: tokenizer_config.json's chat_template is
// recognised among the templates Meta shipped and each is reimplemented here for plain
// conversations (no tools).
//
// Recognition is exact: the template's length and the FNV-1a 64 of all its bytes. Whitespace
// outside a tag is text that Jinja renders (a trailing space is kept in the output), so a
// template that differs from a known one only by whitespace is another template, and is
// refused rather than formatted as the known one. The texts hashed are in
// tests/data/chat_templates/ (test_chat checks that each is recognised).
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/text/tokenizer_internal.h"  // l3d_fnv1a64
#include "core/l3d_core.h"

typedef struct known_template {
    l3d_chat_template_t kind;
    size_t len;
    uint64_t hash;
    const char *name;
} known_template_t;

static const known_template_t known[] = {
    {L3D_CHAT_LLAMA3, 348, 0x74891e390e614ae2ull, "Llama 3 Instruct"},
    {L3D_CHAT_LLAMA31, 4614, 0x60848a05837ce656ull, "Llama 3.1 / 3.3 Instruct"},
    {L3D_CHAT_LLAMA32, 3827, 0x0ac29b9538e2befaull, "Llama 3.2 Instruct"},
};

l3d_status l3d_chat_template_recognise(l3d_ctx_t *ctx, const char *text, size_t len,
                                       const char *origin, l3d_chat_template_t *kind_p) {
    if (!kind_p || (!text && len))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "chat template: null argument");
    uint64_t h = l3d_fnv1a64(0xcbf29ce484222325ull, text, len);
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (known[i].len == len && known[i].hash == h) {
            *kind_p = known[i].kind;
            return L3D_OK;
        }
    }
    *kind_p = L3D_CHAT_NONE;
    return l3d_error(ctx, L3D_ERR_UNSUPPORTED,
                     "%s: the chat_template is not one llama3d knows (it formats Meta's Llama 3, "
                     "3.1/3.3 and 3.2 Instruct templates, exactly as shipped, and has no general "
                     "Jinja engine)",
                     origin ? origin : "tokenizer");
}

// ---- formatting --------------------------------------------------------------------------
typedef struct buf {
    l3d_ctx_t *ctx;
    char *p;
    size_t n, cap;
} buf_t;

static l3d_status put(buf_t *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = l3d_malloc(b->ctx, cap, "tokenizer");
        if (!np) return L3D_ERR_NOMEM;
        if (b->n) memcpy(np, b->p, b->n);
        l3d_free(b->ctx, b->p, b->cap, "tokenizer");
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return L3D_OK;
}

static l3d_status puts_(buf_t *b, const char *s) { return put(b, s, strlen(s)); }

// Python's str.isspace(), which Jinja's trim filter strips with: Unicode White_Space plus the
// ASCII separators 0x1c..0x1f.
static int py_space(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// The code point at s (n bytes left) and its length; invalid bytes count as themselves.
static unsigned decode_at(const unsigned char *s, size_t n, size_t *len_p) {
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    if (len > n) len = 1;
    unsigned cp = len == 1 ? c : c & (0x7fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *len_p = 1;
            return c;
        }
        cp = (cp << 6) | (s[i] & 0x3fu);
    }
    *len_p = len;
    return cp;
}

static l3d_status put_trimmed(buf_t *b, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), start = 0, end = 0, i = 0;
    int seen = 0;
    while (i < n) {
        size_t len = 1;
        unsigned cp = decode_at(u + i, n - i, &len);
        if (!py_space(cp)) {
            if (!seen) start = i;
            seen = 1;
            end = i + len;
        }
        i += len;
    }
    return seen ? put(b, s + start, end - start) : L3D_OK;
}

static l3d_status put_turn(buf_t *b, const char *role, const char *content) {
    L3D_CHECK(b->ctx, puts_(b, "<|start_header_id|>"));
    L3D_CHECK(b->ctx, puts_(b, role));
    L3D_CHECK(b->ctx, puts_(b, "<|end_header_id|>\n\n"));
    L3D_CHECK(b->ctx, put_trimmed(b, content));
    return puts_(b, "<|eot_id|>");
}

// transformers' strftime_now("%d %b %Y"), in the C locale.
static void today(char *out, size_t cap) {
    static const char *const mon[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t t = time(NULL);
    struct tm tm;
    if (!localtime_r(&t, &tm)) {
        snprintf(out, cap, "26 Jul 2024");
        return;
    }
    snprintf(out, cap, "%02d %s %04d", tm.tm_mday, mon[tm.tm_mon % 12], tm.tm_year + 1900);
}

l3d_status l3d_chat_format(l3d_ctx_t *ctx, l3d_chat_template_t kind, const char *bos,
                           const l3d_chat_message_t *msgs, size_t n, const char *date,
                           char **text_p, size_t *len_p) {
    if (!text_p || !len_p || (!msgs && n))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "chat format: null argument");
    if (kind != L3D_CHAT_LLAMA3 && kind != L3D_CHAT_LLAMA31 && kind != L3D_CHAT_LLAMA32)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "chat format: no known template (%d)",
                         (int)kind);
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return l3d_error(ctx, L3D_ERR_INVALID_ARG, "chat message %zu: null role or content",
                             i + 1);
        if (kind != L3D_CHAT_LLAMA3 &&
            (!strcmp(msgs[i].role, "tool") || !strcmp(msgs[i].role, "ipython")))
            return l3d_error(ctx, L3D_ERR_UNSUPPORTED,
                             "chat message %zu: role '%s' (tool calls) is not supported", i + 1,
                             msgs[i].role);
    }
    if (!bos) bos = "";
    buf_t b = {.ctx = ctx};
    l3d_status st = L3D_OK;
    if (kind == L3D_CHAT_LLAMA3) {
        // BOS goes in front of the first message only: no messages, no BOS.
        for (size_t i = 0; i < n; i++) {
            if (i == 0) L3D_CHECK_GOTO(ctx, puts_(&b, bos), st, fail);
            L3D_CHECK_GOTO(ctx, put_turn(&b, msgs[i].role, msgs[i].content), st, fail);
        }
    } else {
        char day[32];
        if (date) snprintf(day, sizeof(day), "%s", date);
        else if (kind == L3D_CHAT_LLAMA32) today(day, sizeof(day));
        else snprintf(day, sizeof(day), "26 Jul 2024");
        size_t first = 0;
        const char *sys = "";
        if (n && !strcmp(msgs[0].role, "system")) {
            sys = msgs[0].content;
            first = 1;
        }
        L3D_CHECK_GOTO(ctx, puts_(&b, bos), st, fail);
        L3D_CHECK_GOTO(ctx, puts_(&b, "<|start_header_id|>system<|end_header_id|>\n\n"
                                      "Cutting Knowledge Date: December 2023\nToday Date: "),
                       st, fail);
        L3D_CHECK_GOTO(ctx, puts_(&b, day), st, fail);
        L3D_CHECK_GOTO(ctx, puts_(&b, "\n\n"), st, fail);
        L3D_CHECK_GOTO(ctx, put_trimmed(&b, sys), st, fail);
        L3D_CHECK_GOTO(ctx, puts_(&b, "<|eot_id|>"), st, fail);
        for (size_t i = first; i < n; i++)
            L3D_CHECK_GOTO(ctx, put_turn(&b, msgs[i].role, msgs[i].content), st, fail);
    }
    L3D_CHECK_GOTO(ctx, puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n"), st,
                   fail);
    // Hand back an exactly sized buffer, so that the caller frees it knowing only the length.
    char *out = l3d_malloc(ctx, b.n + 1, "tokenizer");
    if (!out) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    memcpy(out, b.p, b.n + 1);
    *text_p = out;
    *len_p = b.n;
fail:
    l3d_free(ctx, b.p, b.cap, "tokenizer");
    return st;
}

void l3d_chat_text_free(l3d_ctx_t *ctx, char *text, size_t len) {
    if (text) l3d_free(ctx, text, len + 1, "tokenizer");
}

l3d_status l3d_tokenizer_encode_chat(l3d_tokenizer_t *tok, const l3d_chat_message_t *msgs,
                                     size_t n, const char *date, int32_t **ids_p, size_t *n_p) {
    if (!tok || !ids_p || !n_p || (!msgs && n))
        return l3d_error(tok ? tok->ctx : NULL, L3D_ERR_INVALID_ARG,
                         "tokenizer chat: null argument");
    l3d_ctx_t *ctx = tok->ctx;
    if (tok->chat == L3D_CHAT_NONE)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "%s",
                         tok->chat_error[0] ? tok->chat_error
                                            : "the tokenizer has no chat template "
                                              "(tokenizer_config.json's chat_template)");
    char bos[64] = "";
    size_t bl = 0;
    if (tok->bos_id >= 0) {
        L3D_CHECK(ctx, l3d_tokenizer_token_to_piece(tok, tok->bos_id, NULL, 0, &bl));
        if (bl >= sizeof(bos))
            return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "tokenizer chat: BOS text of %zu bytes",
                             bl);
        L3D_CHECK(ctx, l3d_tokenizer_token_to_piece(tok, tok->bos_id, bos, sizeof(bos), &bl));
        bos[bl] = 0;
    }
    char *text = NULL;
    size_t len = 0;
    L3D_CHECK(ctx, l3d_chat_format(ctx, tok->chat, bos, msgs, n, date, &text, &len));
    l3d_status st = l3d_tokenizer_encode(tok, text, len, L3D_TOKENIZE_SPECIAL, ids_p, n_p);
    l3d_chat_text_free(ctx, text, len);
    return st;
}
