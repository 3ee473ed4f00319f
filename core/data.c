// The training data stream: loading a token file or a UTF-8 text into memory, and the exact
// batching rule every layout relies on.
//
// The l3d_dataset_t handed out is the first member of a private struct that also records the
// capacity of the token buffer, so a tokenizer that over-allocates needs no shrinking copy.
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

// A text file is read whole; past this size, pre-tokenize it into a .bin.
#define DATA_TEXT_MAX ((size_t)1 << 31)

typedef struct dataset_impl {
    l3d_dataset_t pub;  // first: l3d_dataset_t * and dataset_impl * convert
    size_t cap;         // ids allocated for pub.tokens
} dataset_impl;

// ---- UTF-8 validation (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF) -------
// Returns 1 if buf is valid; otherwise 0 with *bad_p = offset of the first byte of the first
// invalid sequence and *why_p a short reason.
static int utf8_validate(const unsigned char *buf, size_t len, size_t *bad_p, const char **why_p) {
    size_t i = 0;
    while (i < len) {
        unsigned c = buf[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;  // below: overlong
            if (c == 0xED) hi = 0x9F;  // above: UTF-16 surrogates D800..DFFF
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;  // below: overlong
            if (c == 0xF4) hi = 0x8F;  // above: past U+10FFFF
        } else {
            *bad_p = i;
            *why_p = (c >= 0x80 && c <= 0xBF) ? "unexpected continuation byte"
                     : (c == 0xC0 || c == 0xC1) ? "overlong encoding"
                                                : "byte never valid in UTF-8";
            return 0;
        }
        // The bytes present must fit before a short tail is called truncated.
        size_t avail = len - i - 1 < need ? len - i - 1 : need;
        for (size_t k = 1; k <= avail; k++) {
            unsigned b = buf[i + k];
            if (k == 1 && (b < lo || b > hi)) {
                *bad_p = i;
                if (b < 0x80 || b > 0xBF) *why_p = "invalid continuation byte";
                else if (c == 0xED) *why_p = "utf-16 surrogate";
                else if (c == 0xF4) *why_p = "code point above U+10FFFF";
                else *why_p = "overlong encoding";  // E0 or F0 with a too-small second byte
                return 0;
            }
            if (k > 1 && (b < 0x80 || b > 0xBF)) {
                *bad_p = i;
                *why_p = "invalid continuation byte";
                return 0;
            }
        }
        if (avail < need) {
            *bad_p = i;
            *why_p = "sequence truncated at end of file";
            return 0;
        }
        i += need + 1;
    }
    return 1;
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

// Turns a negative errno from platform/ into a status with the path in the detail.
static l3d_status file_error(l3d_ctx_t *ctx, const char *path, int rc, int is_text) {
    if (rc == -ENOENT) return l3d_error(ctx, L3D_ERR_NOT_FOUND, "%s: no such file", path);
    if (rc == -EFBIG && is_text)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED,
                         "%s: text data sets are read whole and capped at %zu bytes; "
                         "pre-tokenize it into a .bin file",
                         path, DATA_TEXT_MAX);
    if (rc == -ENOMEM) return l3d_error(ctx, L3D_ERR_NOMEM, "%s: out of memory reading it", path);
    // The user named this file: a FIFO, directory or device is bad input, not an I/O failure.
    if (rc == -EISDIR || rc == -EINVAL)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: it is %s, not a regular file", path,
                         l3d_path_kind(path));
    if (rc == -EIO) return l3d_error(ctx, L3D_ERR_IO, "%s: %s", path, strerror(-rc));
    return l3d_error(ctx, L3D_ERR_CONFIG, "%s: %s", path, strerror(-rc));
}

static l3d_status dataset_alloc(l3d_ctx_t *ctx, const char *path, size_t cap,
                                dataset_impl **ds_p) {
    if (cap > SIZE_MAX / sizeof(int32_t))
        return l3d_error(ctx, L3D_ERR_NOMEM, "%s: %zu tokens do not fit in memory", path, cap);
    dataset_impl *ds = l3d_malloc(ctx, sizeof(*ds), "data");
    if (!ds) return L3D_ERR_NOMEM;
    memset(ds, 0, sizeof(*ds));
    ds->pub.ctx = ctx;
    snprintf(ds->pub.path, sizeof(ds->pub.path), "%s", path);
    if (cap) {
        ds->pub.tokens = l3d_malloc(ctx, cap * sizeof(int32_t), "data");
        if (!ds->pub.tokens) {
            l3d_free(ctx, ds, sizeof(*ds), "data");
            return L3D_ERR_NOMEM;
        }
    }
    ds->cap = cap;
    *ds_p = ds;
    return L3D_OK;
}

// .bin: little-endian uint32 ids, each checked against the model's vocabulary.
static l3d_status load_bin(l3d_ctx_t *ctx, const char *path, int vocab_size,
                           dataset_impl **ds_p) {
    const void *map = NULL;
    size_t len = 0;
    int rc = l3d_file_map(path, &map, &len);
    if (rc < 0) return file_error(ctx, path, rc, 0);
    l3d_status st = L3D_OK;
    dataset_impl *ds = NULL;
    if (len == 0) {
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: empty token file", path);
        goto done;
    }
    if (len % 4 != 0) {
        st = l3d_error(ctx, L3D_ERR_FORMAT,
                       "%s: size %zu bytes is not a multiple of 4 (a .bin holds little-endian "
                       "uint32 token ids)",
                       path, len);
        goto done;
    }
    size_t n = len / 4;
    L3D_CHECK_GOTO(ctx, dataset_alloc(ctx, path, n, &ds), st, done);
    const unsigned char *p = map;
    for (size_t i = 0; i < n; i++, p += 4) {
        uint32_t id = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                      (uint32_t)p[3] << 24;
        if (id >= (uint32_t)vocab_size) {
            st = l3d_error(ctx, L3D_ERR_FORMAT,
                           "%s: token %zu (byte offset %zu) is id %u, not below the vocab size "
                           "%d",
                           path, i, i * 4, (unsigned)id, vocab_size);
            goto done;
        }
        ds->pub.tokens[i] = (int32_t)id;
    }
    ds->pub.n_tokens = n;
done:
    l3d_file_unmap(map, len);
    if (st < 0 && ds) {
        l3d_dataset_free(&ds->pub);
        ds = NULL;
    }
    *ds_p = ds;
    return st;
}

// Text: BOS + tokens of the whole file + EOS.
static l3d_status load_text(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                            int vocab_size, dataset_impl **ds_p) {
    if (!tok)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: a text data set needs a tokenizer",
                         path);
    if (tok->vocab_size > vocab_size)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: tokenizer %s has %d ids but the model vocab size is %d", path,
                         tok->ops->name, tok->vocab_size, vocab_size);
    char *buf = NULL;
    size_t len = 0;
    int rc = l3d_file_read_all(path, DATA_TEXT_MAX, &buf, &len);
    if (rc < 0) return file_error(ctx, path, rc, 1);
    l3d_status st = L3D_OK;
    dataset_impl *ds = NULL;
    size_t bad = 0;
    const char *why = "";
    if (len == 0) {
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: empty text file", path);
        goto done;
    }
    if (!utf8_validate((const unsigned char *)buf, len, &bad, &why)) {
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: invalid UTF-8 at byte offset %zu (%s)", path,
                       bad, why);
        goto done;
    }
    // One id per byte plus BOS and EOS is exact for the byte tokenizer.
    L3D_CHECK_GOTO(ctx, dataset_alloc(ctx, path, len + 2, &ds), st, done);
    size_t n = 0;
    ds->pub.tokens[n++] = tok->bos_id;
    L3D_CHECK_GOTO(ctx, tok->ops->encode(tok, buf, len, &ds->pub.tokens, &n, &ds->cap), st,
                   done);
    if (n == ds->cap) {
        // A tokenizer producing more ids than bytes: grow by one for EOS.
        int32_t *t = l3d_malloc(ctx, (n + 1) * sizeof(int32_t), "data");
        if (!t) {
            st = L3D_ERR_NOMEM;
            goto done;
        }
        memcpy(t, ds->pub.tokens, n * sizeof(int32_t));
        l3d_free(ctx, ds->pub.tokens, ds->cap * sizeof(int32_t), "data");
        ds->pub.tokens = t;
        ds->cap = n + 1;
    }
    ds->pub.tokens[n++] = tok->eos_id;
    ds->pub.n_tokens = n;
done:
    free(buf);  // platform's read_all buffer is plain malloc
    if (st < 0 && ds) {
        l3d_dataset_free(&ds->pub);
        ds = NULL;
    }
    *ds_p = ds;
    return st;
}

l3d_status l3d_dataset_load(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                            int vocab_size, l3d_dataset_t **ds_p) {
    if (!ctx || !path || !ds_p)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "dataset load: null argument");
    *ds_p = NULL;  // a failed load never leaves a stale pointer for the caller to free
    if (vocab_size <= 0)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: vocab size %d must be positive", path,
                         vocab_size);
    dataset_impl *ds = NULL;
    if (has_suffix(path, ".bin")) L3D_CHECK(ctx, load_bin(ctx, path, vocab_size, &ds));
    else L3D_CHECK(ctx, load_text(ctx, path, tok, vocab_size, &ds));
    l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_DATA, "data set %s: %zu tokens", ds->pub.path,
            ds->pub.n_tokens);
    *ds_p = &ds->pub;
    return L3D_OK;
}

l3d_status l3d_dataset_check(l3d_ctx_t *ctx, const l3d_dataset_t *ds, int T) {
    if (!ds) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "dataset check: null data set");
    if (T <= 0)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: sequence length %d must be positive",
                         ds->path, T);
    if (ds->n_tokens < (size_t)T + 1)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: has %zu tokens, a sequence of length %d needs at least %zu", ds->path,
                         ds->n_tokens, T, (size_t)T + 1);
    return L3D_OK;
}

void l3d_dataset_free(l3d_dataset_t *pub) {
    if (!pub) return;
    dataset_impl *ds = (dataset_impl *)pub;
    l3d_ctx_t *ctx = pub->ctx;
    l3d_free(ctx, pub->tokens, ds->cap * sizeof(int32_t), "data");
    l3d_free(ctx, ds, sizeof(*ds), "data");
}

// ---- batching ----------------------------------------------------------------------------
// v mod n as a mathematical (non-negative) residue, for any int64 v.
static uint64_t mod_i64(int64_t v, uint64_t n) {
    if (v >= 0) return (uint64_t)v % n;
    uint64_t m = (uint64_t)(-(v + 1)) % n;  // v = -(m' + 1), no overflow at INT64_MIN
    return n - 1 - m;
}

// (a * b) mod n for a, b < n without overflow: direct when the product fits, otherwise
// double-and-add, each addition written so it cannot wrap for any n.
static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t n) {
    if (a == 0 || b <= UINT64_MAX / a) return (a * b) % n;
    uint64_t r = 0;
    while (b) {
        if (b & 1) r = r >= n - a ? r - (n - a) : r + a;
        a = a >= n - a ? a - (n - a) : a + a;
        b >>= 1;
    }
    return r;
}

void l3d_dataset_batch(const l3d_dataset_t *ds, int64_t step, int global_batch, int T, int first,
                       int count, int32_t *inputs, int32_t *targets) {
    if (!ds || ds->n_tokens == 0 || T <= 0 || count <= 0) return;
    const uint64_t n = (uint64_t)ds->n_tokens;
    const int32_t *tok = ds->tokens;
    // o = ((s * global_batch + i) * T) mod n, reduced stepwise so no step overflows.
    uint64_t sb = mulmod(mod_i64(step, n), mod_i64(global_batch, n), n);
    uint64_t tm = (uint64_t)T % n;
    for (int j = 0; j < count; j++) {
        uint64_t k = sb + mod_i64((int64_t)first + j, n);
        if (k >= n) k -= n;
        uint64_t o = mulmod(k, tm, n);
        int32_t *in = inputs + (size_t)j * (size_t)T;   // (count,T)
        int32_t *tg = targets + (size_t)j * (size_t)T;  // (count,T)
        for (int t = 0; t < T; t++) {
            in[t] = tok[o];
            if (++o == n) o = 0;
            tg[t] = tok[o];
        }
    }
}
