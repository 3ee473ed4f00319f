// The training data stream: mapping a token file, loading a UTF-8 text (core/train/data_text.c),
// and the exact batching rule every layout relies on.
//
// Token stores are never read into memory whole: a .bin is mapped read-only and its ids are
// used in place (little-endian uint32 is the host's int32 for ids below 2^31), a large text is
// tokenized into a .bin cache that is mapped the same way.
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/train/data_internal.h"
#include "core/l3d_core.h"
#include "platform/file_stream.h"
#include "platform/platform.h"

int l3d_dataset_is_bin(const char *path) {
    size_t n = strlen(path);
    return n >= 4 && !strcmp(path + n - 4, ".bin");
}

l3d_status l3d_dataset_file_error(l3d_ctx_t *ctx, const char *path, int rc) {
    if (rc == -ENOENT) return l3d_error(ctx, L3D_ERR_NOT_FOUND, "%s: no such file", path);
    if (rc == -ENOMEM) return l3d_error(ctx, L3D_ERR_NOMEM, "%s: out of memory reading it", path);
    if (rc == -EIO) return l3d_error(ctx, L3D_ERR_IO, "%s: %s", path, strerror(-rc));
    // The user named this file: a FIFO, directory or device (data is read more than once) and
    // an unreadable file are bad input, not I/O failures.
    if (rc == -EISDIR || rc == -EINVAL || rc == -ENODEV)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: it is %s, not a regular file; give a text "
                         "or .bin file", path, l3d_path_kind(path));
    return l3d_error(ctx, L3D_ERR_CONFIG, "%s: %s", path, strerror(-rc));
}

// Ids are checked in windows of this many bytes, each released once checked, so checking a
// token file of any size keeps no more than one window resident.
#define BIN_CHECK_WINDOW ((size_t)16 << 20)

// .bin: little-endian uint32 ids, each checked against the model's vocabulary.
l3d_status l3d_dataset_load_bin(l3d_ctx_t *ctx, const char *path, int vocab_size,
                                l3d_dataset_impl_t **ds_p) {
    *ds_p = NULL;
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "%s: token files are used in place, which needs "
                     "a little-endian host", path);
#endif
    const void *map = NULL;
    size_t len = 0;
    int rc = l3d_file_map(path, &map, &len);
    if (rc < 0) return l3d_dataset_file_error(ctx, path, rc);
    l3d_status st = L3D_OK;
    l3d_dataset_impl_t *ds = NULL;
    if (len == 0) {
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: empty token file", path);
        goto fail;
    }
    if (len % 4 != 0) {
        st = l3d_error(ctx, L3D_ERR_FORMAT,
                       "%s: size %zu bytes is not a multiple of 4 (a .bin holds little-endian "
                       "uint32 token ids)",
                       path, len);
        goto fail;
    }
    size_t n = len / 4;
    const uint32_t *ids = map;
    l3d_progress_t pr;
    l3d_progress_begin(ctx, &pr, len, "checking %s", path);
    for (size_t w = 0; w < n; w += BIN_CHECK_WINDOW / 4) {
        size_t end = n - w < BIN_CHECK_WINDOW / 4 ? n : w + BIN_CHECK_WINDOW / 4;
        uint32_t any = 0;
        for (size_t i = w; i < end; i++) any |= ids[i] >= (uint32_t)vocab_size;
        if (any) {
            size_t i = w;
            while (ids[i] < (uint32_t)vocab_size) i++;
            l3d_progress_end(&pr);
            st = l3d_error(ctx, L3D_ERR_FORMAT,
                           "%s: token %zu (byte offset %zu) is id %u, not below the vocab size "
                           "%d",
                           path, i, i * 4, (unsigned)ids[i], vocab_size);
            goto fail;
        }
        l3d_file_map_release(map, w * 4, (end - w) * 4);
        l3d_progress_update(&pr, (uint64_t)end * 4);
    }
    l3d_progress_end(&pr);
    ds = l3d_malloc(ctx, sizeof(*ds), "data");
    if (!ds) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    memset(ds, 0, sizeof(*ds));
    ds->pub.ctx = ctx;
    snprintf(ds->pub.path, sizeof(ds->pub.path), "%s", path);
    ds->pub.tokens = (const int32_t *)map;
    ds->pub.n_tokens = n;
    ds->map = map;
    ds->map_len = len;
    *ds_p = ds;
    return L3D_OK;
fail:
    l3d_file_unmap(map, len);
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
    l3d_dataset_impl_t *ds = NULL;
    if (l3d_dataset_is_bin(path)) L3D_CHECK(ctx, l3d_dataset_load_bin(ctx, path, vocab_size, &ds));
    else
        L3D_CHECK(ctx, l3d_dataset_load_text(ctx, path, tok, vocab_size, L3D_DATA_TEXT_INMEM_MAX,
                                             l3d_ctx_settings(ctx)->cache_dir, &ds));
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
    l3d_dataset_impl_t *ds = (l3d_dataset_impl_t *)pub;
    l3d_ctx_t *ctx = pub->ctx;
    l3d_file_unmap(ds->map, ds->map_len);
    l3d_free(ctx, ds->owned, ds->cap * sizeof(int32_t), "data");
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
