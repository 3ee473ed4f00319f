// The tokenizer seam, the built-in byte tokenizer (ids 0..255 = bytes, BOS 256, EOS 257,
// PAD 258) and the public entry points of include/llama3d/tokenizer.h. Byte-level BPE lives in
// core/tokenizer_bpe*.c.
//
// Ownership: a tokenizer's struct is allocated by its create function with
// l3d_malloc(ctx, sizeof(l3d_tokenizer_t), "data"); l3d_tokenizer_destroy() first calls
// ops->destroy (which releases only `priv`; may be NULL) and then frees the struct itself.
//
// Id buffers from l3d_tokenizer_encode() are shrunk to exactly n ids before they are returned,
// so l3d_tokens_free(ctx, ids, n) can give the allocator the exact size (n * 4 bytes, tag
// "data"). An empty result is returned as NULL with n = 0.
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/text/tokenizer_internal.h"
#include "core/l3d_core.h"

#define BYTES_VOCAB 259
#define BYTES_BOS 256
#define BYTES_EOS 257
#define BYTES_PAD 258

uint64_t l3d_fnv1a64(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

// Grows an id buffer owned by the ctx (tag "data") so it holds at least `need` ids.
// Doubling keeps appends amortised O(1).
l3d_status l3d_tokens_reserve(l3d_ctx_t *ctx, int32_t **ids_p, size_t n, size_t *cap_p,
                              size_t need) {
    if (need <= *cap_p) return L3D_OK;
    if (need > SIZE_MAX / sizeof(int32_t) / 2)
        return l3d_error(ctx, L3D_ERR_NOMEM, "token buffer of %zu ids is too large", need);
    size_t cap = *cap_p * 2;
    if (cap < need) cap = need;
    if (cap < 64) cap = 64;
    int32_t *ids = l3d_malloc(ctx, cap * sizeof(int32_t), "data");
    if (!ids) return L3D_ERR_NOMEM;
    if (n) memcpy(ids, *ids_p, n * sizeof(int32_t));
    l3d_free(ctx, *ids_p, *cap_p * sizeof(int32_t), "data");
    *ids_p = ids;
    *cap_p = cap;
    return L3D_OK;
}

// ---- the byte tokenizer ------------------------------------------------------------------
// Byte-exact for any input: UTF-8 validity is the data set loader's business, not ours.
static l3d_status bytes_encode(l3d_tokenizer_t *tok, const char *text, size_t len,
                               unsigned flags, int32_t **ids_p, size_t *n_p, size_t *cap_p) {
    (void)flags;  // no special token has a text
    size_t n = *n_p;
    if (len == 0) return L3D_OK;  // *ids_p may still be NULL
    if (len > SIZE_MAX - n) return l3d_error(tok->ctx, L3D_ERR_NOMEM, "token count overflows");
    L3D_CHECK(tok->ctx, l3d_tokens_reserve(tok->ctx, ids_p, n, cap_p, n + len));
    const unsigned char *p = (const unsigned char *)text;
    int32_t *ids = *ids_p + n;
    for (size_t i = 0; i < len; i++) ids[i] = (int32_t)p[i];
    *n_p = n + len;
    return L3D_OK;
}

static l3d_status bytes_piece(l3d_tokenizer_t *tok, int32_t id, char *buf, size_t cap,
                              size_t *len_p) {
    if (id >= 256) {  // BOS, EOS, PAD carry no text
        *len_p = 0;
        return L3D_OK;
    }
    *len_p = 1;
    if (!buf && !cap) return L3D_OK;
    if (cap < 1)
        return l3d_error(tok->ctx, L3D_ERR_INVALID_ARG,
                         "decode of id %d needs 1 byte, buffer holds 0", (int)id);
    buf[0] = (char)(unsigned char)id;
    return L3D_OK;
}

static int32_t bytes_find(const l3d_tokenizer_t *tok, const char *text, size_t len) {
    (void)tok;
    return len == 1 ? (int32_t)(unsigned char)text[0] : -1;
}

static const l3d_tokenizer_ops_t bytes_ops = {
    .name = "bytes",
    .encode = bytes_encode,
    .piece = bytes_piece,
    .find = bytes_find,
    .destroy = NULL,  // no priv
};

l3d_status l3d_tokenizer_create_bytes(l3d_ctx_t *ctx, l3d_tokenizer_t **tok_p) {
    if (!ctx || !tok_p) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "tokenizer: null argument");
    l3d_tokenizer_t *tok = l3d_malloc(ctx, sizeof(*tok), "data");
    if (!tok) return L3D_ERR_NOMEM;
    memset(tok, 0, sizeof(*tok));
    tok->ops = &bytes_ops;
    tok->ctx = ctx;
    tok->priv = NULL;
    tok->vocab_size = BYTES_VOCAB;
    tok->bos_id = BYTES_BOS;
    tok->eos_id = BYTES_EOS;
    tok->pad_id = BYTES_PAD;
    tok->special = (l3d_tokenizer_special_t){.bos_id = BYTES_BOS, .eos_id = BYTES_EOS,
                                             .eot_id = -1, .pad_id = BYTES_PAD, .n_stop = 1,
                                             .stop_ids = {BYTES_EOS}};
    tok->is_special = NULL;
    tok->chat = L3D_CHAT_NONE;
    snprintf(tok->key, sizeof(tok->key), "bytes");
    *tok_p = tok;
    return L3D_OK;
}

void l3d_tokenizer_destroy(l3d_tokenizer_t *tok) {
    if (!tok) return;
    if (tok->ops && tok->ops->destroy) tok->ops->destroy(tok);
    l3d_free(tok->ctx, tok, sizeof(*tok), "data");
}

// ---- the generic entry points ------------------------------------------------------------
l3d_status l3d_tokenizer_encode(l3d_tokenizer_t *tok, const char *text, size_t len,
                                unsigned flags, int32_t **ids_p, size_t *n_p) {
    if (!tok || !ids_p || !n_p || (!text && len))
        return l3d_error(tok ? tok->ctx : NULL, L3D_ERR_INVALID_ARG,
                         "tokenizer encode: null argument");
    l3d_ctx_t *ctx = tok->ctx;
    if (flags & ~(unsigned)(L3D_TOKENIZE_BOS | L3D_TOKENIZE_SPECIAL))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "tokenizer encode: unknown flags 0x%x",
                         flags);
    int add_bos = (flags & L3D_TOKENIZE_BOS) != 0;
    if (add_bos && tok->bos_id < 0)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG,
                         "tokenizer encode: BOS asked for, but the tokenizer has no BOS token");
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    l3d_status st = L3D_OK;
    // One id per byte is exact for the byte tokenizer and an upper bound for BPE, so the
    // common case never reallocates.
    size_t guess = len + (add_bos ? 1 : 0);
    if (guess < len) guess = len;
    if (guess) L3D_CHECK_GOTO(ctx, l3d_tokens_reserve(ctx, &ids, n, &cap, guess), st, fail);
    if (add_bos) ids[n++] = tok->bos_id;
    L3D_CHECK_GOTO(ctx, tok->ops->encode(tok, text, len, flags, &ids, &n, &cap), st, fail);
    if (n == 0) {
        l3d_free(ctx, ids, cap * sizeof(int32_t), "data");
        ids = NULL;
    } else if (n < cap) {
        // Shrink so that the size l3d_tokens_free() reports is the size that was allocated.
        int32_t *exact = l3d_malloc(ctx, n * sizeof(int32_t), "data");
        if (!exact) {
            st = L3D_ERR_NOMEM;
            goto fail;
        }
        memcpy(exact, ids, n * sizeof(int32_t));
        l3d_free(ctx, ids, cap * sizeof(int32_t), "data");
        ids = exact;
    }
    *ids_p = ids;
    *n_p = n;
    return L3D_OK;
fail:
    l3d_free(ctx, ids, cap * sizeof(int32_t), "data");
    return st;
}

void l3d_tokens_free(l3d_ctx_t *ctx, int32_t *ids, size_t n) {
    if (ids) l3d_free(ctx, ids, n * sizeof(int32_t), "data");
}

static l3d_status check_id(const l3d_tokenizer_t *tok, int32_t id) {
    if (id < 0 || id >= tok->vocab_size)
        return l3d_error(tok->ctx, L3D_ERR_INVALID_ARG,
                         "token id %d is outside the vocabulary [0, %d) of tokenizer %s",
                         (int)id, tok->vocab_size, tok->ops->name);
    return L3D_OK;
}

l3d_status l3d_tokenizer_token_to_piece(l3d_tokenizer_t *tok, int32_t id, char *buf, size_t cap,
                                        size_t *len_p) {
    if (!tok || !len_p || (!buf && cap))
        return l3d_error(tok ? tok->ctx : NULL, L3D_ERR_INVALID_ARG,
                         "tokenizer decode: null argument");
    L3D_CHECK(tok->ctx, check_id(tok, id));
    return tok->ops->piece(tok, id, buf, cap, len_p);
}

l3d_status l3d_tokenizer_decode(l3d_tokenizer_t *tok, const int32_t *ids, size_t n,
                                unsigned flags, char *buf, size_t cap, size_t *len_p) {
    if (!tok || !len_p || (!buf && cap) || (!ids && n))
        return l3d_error(tok ? tok->ctx : NULL, L3D_ERR_INVALID_ARG,
                         "tokenizer decode: null argument");
    if (flags & ~(unsigned)L3D_DECODE_SKIP_SPECIAL)
        return l3d_error(tok->ctx, L3D_ERR_INVALID_ARG, "tokenizer decode: unknown flags 0x%x",
                         flags);
    // Measure first, so that a short buffer is refused before anything is written.
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        L3D_CHECK(tok->ctx, check_id(tok, ids[i]));
        if ((flags & L3D_DECODE_SKIP_SPECIAL) && l3d_tokenizer_is_special(tok, ids[i])) continue;
        size_t len = 0;
        L3D_CHECK(tok->ctx, tok->ops->piece(tok, ids[i], NULL, 0, &len));
        total += len;
    }
    *len_p = total;
    if (!buf && !cap) return L3D_OK;
    if (total > cap)
        return l3d_error(tok->ctx, L3D_ERR_INVALID_ARG,
                         "tokenizer decode: the text of %zu ids needs %zu bytes, the buffer "
                         "holds %zu", n, total, cap);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & L3D_DECODE_SKIP_SPECIAL) && l3d_tokenizer_is_special(tok, ids[i])) continue;
        size_t len = 0;
        L3D_CHECK(tok->ctx, tok->ops->piece(tok, ids[i], buf + at, cap - at, &len));
        at += len;
    }
    return L3D_OK;
}

const char *l3d_tokenizer_kind(const l3d_tokenizer_t *tok) {
    return tok ? tok->ops->name : "";
}

int32_t l3d_tokenizer_vocab_size(const l3d_tokenizer_t *tok) { return tok ? tok->vocab_size : 0; }

l3d_status l3d_tokenizer_special_ids(const l3d_tokenizer_t *tok, l3d_tokenizer_special_t *out) {
    if (!tok || !out)
        return l3d_error(tok ? tok->ctx : NULL, L3D_ERR_INVALID_ARG,
                         "tokenizer special ids: null argument");
    *out = tok->special;
    return L3D_OK;
}

int l3d_tokenizer_is_special(const l3d_tokenizer_t *tok, int32_t id) {
    if (!tok || id < 0 || id >= tok->vocab_size) return 0;
    return tok->is_special ? (tok->is_special[id] & 1) != 0 : id >= 256;
}

l3d_status l3d_tokenizer_token_id(const l3d_tokenizer_t *tok, const char *text, size_t len,
                                  int32_t *id_p) {
    if (!tok || !id_p || (!text && len))
        return l3d_error(tok ? tok->ctx : NULL, L3D_ERR_INVALID_ARG,
                         "tokenizer token id: null argument");
    int32_t id = len ? tok->ops->find(tok, text, len) : -1;
    if (id < 0)
        return l3d_error(tok->ctx, L3D_ERR_NOT_FOUND, "tokenizer %s has no token '%.*s'",
                         tok->ops->name, (int)(len > 64 ? 64 : len), text ? text : "");
    *id_p = id;
    return L3D_OK;
}

l3d_chat_template_t l3d_tokenizer_chat_template(const l3d_tokenizer_t *tok) {
    return tok ? tok->chat : L3D_CHAT_NONE;
}
