// The tokenizer seam and the built-in byte tokenizer (ids 0..255 = bytes, BOS 256, EOS 257,
// PAD 258).
//
// Ownership: a tokenizer's struct is allocated by its create function with
// l3d_malloc(ctx, sizeof(l3d_tokenizer_t), "data"); l3d_tokenizer_destroy() first calls
// ops->destroy (which releases only `priv`; may be NULL) and then frees the struct itself.
//
// Id buffers from l3d_tokenizer_encode() are shrunk to exactly n ids before they are returned,
// so l3d_tokens_free(ctx, ids, n) can give the allocator the exact size (n * 4 bytes, tag
// "data"). An empty result is returned as NULL with n = 0.
#include <stdint.h>
#include <string.h>

#include "core/data.h"
#include "core/l3d_core.h"

#define BYTES_VOCAB 259
#define BYTES_BOS 256
#define BYTES_EOS 257
#define BYTES_PAD 258

// Grows an id buffer owned by the ctx (tag "data") so it holds at least `need` ids.
// Doubling keeps appends amortised O(1).
static l3d_status tokens_reserve(l3d_ctx_t *ctx, int32_t **ids_p, size_t n, size_t *cap_p,
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
                               int32_t **ids_p, size_t *n_p, size_t *cap_p) {
    size_t n = *n_p;
    if (len > SIZE_MAX - n) return l3d_error(tok->ctx, L3D_ERR_NOMEM, "token count overflows");
    L3D_CHECK(tok->ctx, tokens_reserve(tok->ctx, ids_p, n, cap_p, n + len));
    const unsigned char *p = (const unsigned char *)text;
    int32_t *ids = *ids_p + n;
    for (size_t i = 0; i < len; i++) ids[i] = (int32_t)p[i];
    *n_p = n + len;
    return L3D_OK;
}

static l3d_status bytes_decode(l3d_tokenizer_t *tok, int32_t id, char *buf, size_t cap,
                               size_t *len_p) {
    if (id >= 256) {  // BOS, EOS, PAD carry no text
        *len_p = 0;
        return L3D_OK;
    }
    if (cap < 1)
        return l3d_error(tok->ctx, L3D_ERR_INVALID_ARG,
                         "decode of id %d needs 1 byte, buffer holds 0", (int)id);
    buf[0] = (char)(unsigned char)id;
    *len_p = 1;
    return L3D_OK;
}

static const l3d_tokenizer_ops_t bytes_ops = {
    .name = "bytes",
    .encode = bytes_encode,
    .decode = bytes_decode,
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
    *tok_p = tok;
    return L3D_OK;
}

void l3d_tokenizer_destroy(l3d_tokenizer_t *tok) {
    if (!tok) return;
    if (tok->ops && tok->ops->destroy) tok->ops->destroy(tok);
    l3d_free(tok->ctx, tok, sizeof(*tok), "data");
}

// ---- the generic entry points ------------------------------------------------------------
l3d_status l3d_tokenizer_encode(l3d_tokenizer_t *tok, const char *text, size_t len, int add_bos,
                                int32_t **ids_p, size_t *n_p) {
    if (!tok || !ids_p || !n_p || (!text && len))
        return l3d_error(tok ? tok->ctx : NULL, L3D_ERR_INVALID_ARG,
                         "tokenizer encode: null argument");
    l3d_ctx_t *ctx = tok->ctx;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    l3d_status st = L3D_OK;
    // One id per byte is exact for the byte tokenizer and an upper bound for BPE, so the
    // common case never reallocates.
    size_t guess = len + (add_bos ? 1 : 0);
    if (guess < len) guess = len;
    if (guess) L3D_CHECK_GOTO(ctx, tokens_reserve(ctx, &ids, n, &cap, guess), st, fail);
    if (add_bos) ids[n++] = tok->bos_id;
    L3D_CHECK_GOTO(ctx, tok->ops->encode(tok, text, len, &ids, &n, &cap), st, fail);
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

l3d_status l3d_tokenizer_decode(l3d_tokenizer_t *tok, int32_t id, char *buf, size_t cap,
                                size_t *len_p) {
    if (!tok || !len_p || (!buf && cap))
        return l3d_error(tok ? tok->ctx : NULL, L3D_ERR_INVALID_ARG,
                         "tokenizer decode: null argument");
    if (id < 0 || id >= tok->vocab_size)
        return l3d_error(tok->ctx, L3D_ERR_INVALID_ARG,
                         "token id %d is outside the vocabulary [0, %d) of tokenizer %s",
                         (int)id, tok->vocab_size, tok->ops->name);
    return tok->ops->decode(tok, id, buf, cap, len_p);
}
