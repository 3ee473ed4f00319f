// Text data sets, streamed: the text is read in chunks, validated as UTF-8 and tokenized chunk
// by chunk, so no step holds the whole text or all of its ids.
//
// A small text (at most L3D_DATA_TEXT_INMEM_MAX bytes) is tokenized into memory. A larger one
// is tokenized into a token cache, a plain .bin of little-endian uint32 ids (BOS, the text's
// ids, EOS) that is then mapped like any .bin. The cache is keyed by the text's content and the
// tokenizer, both in its name:
//     <dir>/<text file name>.l3d-<tokenizer name>-<FNV-1a 64 of the text's bytes, 16 hex>.bin
// Content, not size and mtime: a text rewritten in place with the same size within the
// file system's timestamp granularity would otherwise reuse stale ids, and hashing reads the
// text at disk speed with bounded memory. A text that changes while it is tokenized is caught
// by hashing it again on the way. <dir> is the text's own directory, or the cache directory
// (L3D_CACHE_DIR, ~/.cache/llama3d) when the cache cannot be written there (not writable,
// full, a quota); a cache is looked for in both. Where neither can take it, the ids are held in
// memory like a small text's, with a warning: a cache only saves time. It is written to a
// unique temporary and renamed into place, so ranks tokenizing the same text at once each
// publish a whole, identical file and a crash leaves no partial one; the temporary a killed
// run left is removed by the next run that looks for the cache on the same machine.
// A cache of an edited text stays behind under its old hash; deleting any of them is safe.
//
// A BPE tokenizer merges across characters, so the text is cut only where its pre-tokenizer
// would split anyway (bpe_safe_cut); each read is cut into one piece per core at such places
// and the pieces are encoded at once on a thread pool, their ids written in order: the ids
// are those of encoding the whole text in one call.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/train/data_internal.h"
#include "core/l3d_core.h"
#include "platform/file_stream.h"
#include "platform/platform.h"

#define TEXT_CHUNK ((size_t)4 << 20)  // bytes read at a time
// A BPE read grows (doubling) until it holds a safe cut; a "line" longer than this is cut at
// a character boundary instead (its ids near the cut may then differ from one-call encoding).
#define TEXT_MAX_LINE ((size_t)64 << 20)
#define TEXT_MAX_PIECES 64

// ---- UTF-8 validation (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF) -------
enum { UTF8_OK = 0, UTF8_BAD = 1, UTF8_TRUNCATED = 2 };

// UTF8_OK if buf is valid; otherwise *bad_p = offset of the first byte of the first invalid
// sequence and *why_p a short reason; UTF8_TRUNCATED when that sequence is only cut short by
// the end of buf (the next chunk may complete it).
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
            return UTF8_BAD;
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
                return UTF8_BAD;
            }
            if (k > 1 && (b < 0x80 || b > 0xBF)) {
                *bad_p = i;
                *why_p = "invalid continuation byte";
                return UTF8_BAD;
            }
        }
        if (avail < need) {
            *bad_p = i;
            *why_p = "sequence truncated at end of file";
            return UTF8_TRUNCATED;
        }
        i += need + 1;
    }
    return UTF8_OK;
}

void l3d_dataset_cache_name(const char *dir, const char *text_path, uint64_t hash,
                            const l3d_tokenizer_t *tok, char *out, size_t cap) {
    const char *slash = strrchr(text_path, '/');
    const char *base = slash ? slash + 1 : text_path;
    // tok->key: "bytes", or "bpe-" + the hash of the tokenizer's files
    if (dir)
        snprintf(out, cap, "%s/%s.l3d-%s-%016llx.bin", dir, base, tok->key,
                 (unsigned long long)hash);
    else  // beside the text: its own directory part, as given
        snprintf(out, cap, "%.*s%s.l3d-%s-%016llx.bin", (int)(base - text_path), text_path,
                 base, tok->key, (unsigned long long)hash);
}

// ---- one pass over the text --------------------------------------------------------------
// Where the ids of a pass go: memory (a small text) or the cache file being written.
typedef struct sink {
    l3d_ctx_t *ctx;
    l3d_dataset_impl_t *ds;  // memory: append to ds->owned
    l3d_file_out_t *out;     // file: append little-endian uint32
    int out_rc;              // the file's write failed: -errno (the caller falls back)
    size_t n;                // ids so far
} sink_t;

static l3d_status sink_put(sink_t *s, const int32_t *ids, size_t n) {
    if (s->out) {
        // ids are < 2^31 and the host is little-endian (l3d_dataset_load_bin refuses others):
        // the int32 bytes are the file's uint32 bytes.
        int rc = l3d_file_out_write(s->out, ids, n * sizeof(int32_t));
        if (rc < 0) {
            s->out_rc = rc;  // no error recorded: the caller tries elsewhere and warns
            return L3D_ERR_IO;
        }
        s->n += n;
        return L3D_OK;
    }
    l3d_dataset_impl_t *ds = s->ds;
    if (s->n + n > ds->cap) {
        size_t cap = ds->cap * 2 > s->n + n ? ds->cap * 2 : s->n + n;
        if (cap > SIZE_MAX / sizeof(int32_t))
            return l3d_error(s->ctx, L3D_ERR_NOMEM, "%s: %zu tokens do not fit in memory",
                             ds->pub.path, cap);
        int32_t *t = l3d_malloc(s->ctx, cap * sizeof(int32_t), "data");
        if (!t) return L3D_ERR_NOMEM;
        if (s->n) memcpy(t, ds->owned, s->n * sizeof(int32_t));
        l3d_free(s->ctx, ds->owned, ds->cap * sizeof(int32_t), "data");
        ds->owned = t;
        ds->cap = cap;
    }
    if (n) memcpy(ds->owned + s->n, ids, n * sizeof(int32_t));  // ids may be NULL when n is 0
    s->n += n;
    return L3D_OK;
}

// ---- cutting and encoding in parallel ----------------------------------------------------
// Where a BPE text may be cut without changing its ids: just after a '\n' followed by a
// printable, non-space ASCII byte. Llama 3's pre-tokenizer (and GPT-2's and GPT-4's) never joins
// a newline with a following non-space: its newline rules (\s*[\r\n]+, [^\s\p{L}\p{N}]+[\r\n]*)
// end at the newline run and its letter, number and punctuation rules cannot start with one,
// so the two sides encode as they do together. The last such place in (0, len], or 0.
static int safe_at(const unsigned char *buf, size_t i) {
    return buf[i - 1] == '\n' && buf[i] > ' ' && buf[i] < 0x7f;
}
static size_t bpe_safe_cut(const unsigned char *buf, size_t len) {
    for (size_t i = len; i > 0; i--)
        if (i < len && safe_at(buf, i)) return i;
    return 0;
}
// The first safe place in [from, len), or len.
static size_t bpe_next_cut(const unsigned char *buf, size_t from, size_t len) {
    for (size_t i = from > 0 ? from : 1; i < len; i++)
        if (safe_at(buf, i)) return i;
    return len;
}

typedef struct encoder {
    l3d_ctx_t *ctx;
    l3d_tokenizer_t *tok;
    l3d_pool_t *pool;       // NULL: one piece on this thread
    l3d_allocator_t alloc;  // the pool's, through the ctx
    int pieces;
    const char *text;
    size_t cut[TEXT_MAX_PIECES + 1];
    int32_t *ids[TEXT_MAX_PIECES];
    size_t n[TEXT_MAX_PIECES], cap[TEXT_MAX_PIECES];
    l3d_status st[TEXT_MAX_PIECES];
} encoder_t;

static void *enc_alloc(size_t size, size_t align, const char *tag, void *user) {
    (void)align;  // l3d_malloc aligns to L3D_ALIGN (64), all the pool asks for
    return l3d_malloc((l3d_ctx_t *)user, size, tag);
}
static void enc_free(void *p, size_t size, void *user) { l3d_free((l3d_ctx_t *)user, p, size, "other"); }

static void enc_task(void *arg, int t, int ntasks) {
    (void)ntasks;
    encoder_t *e = arg;
    e->n[t] = 0;
    e->st[t] = e->cut[t + 1] > e->cut[t]
                   ? e->tok->ops->encode(e->tok, e->text + e->cut[t], e->cut[t + 1] - e->cut[t],
                                         L3D_TOKENIZE_SPECIAL, &e->ids[t], &e->n[t], &e->cap[t])
                   : L3D_OK;
}

static void encoder_init(l3d_ctx_t *ctx, l3d_tokenizer_t *tok, encoder_t *e) {
    memset(e, 0, sizeof(*e));
    e->ctx = ctx;
    e->tok = tok;
    e->pieces = 1;
    int threads = l3d_ctx_settings(ctx)->num_threads;
    if (threads <= 0) threads = l3d_num_cores();
    if (threads > TEXT_MAX_PIECES) threads = TEXT_MAX_PIECES;
    // The byte tokenizer runs at memory speed: one piece.
    if (threads > 1 && strcmp(tok->ops->name, "bytes")) {
        e->alloc = (l3d_allocator_t){enc_alloc, enc_free, ctx};
        // Without a pool (no thread to be had) the text is encoded in one piece.
        if (l3d_pool_create(threads, &e->alloc, &e->pool) == 0) e->pieces = threads;
    }
}

static void encoder_fini(encoder_t *e) {
    for (int t = 0; t < TEXT_MAX_PIECES; t++)
        l3d_free(e->ctx, e->ids[t], e->cap[t] * sizeof(int32_t), "data");
    l3d_pool_destroy(e->pool);
}

// Encodes text[0..len) (cut only at safe places) into the sink, one piece per thread.
static l3d_status encode_into(encoder_t *e, const unsigned char *text, size_t len, sink_t *sink) {
    int p = e->pieces;
    e->text = (const char *)text;
    e->cut[0] = 0;
    for (int k = 1; k < p; k++) {
        size_t want = len / (size_t)p * (size_t)k;
        e->cut[k] = want <= e->cut[k - 1] ? e->cut[k - 1] : bpe_next_cut(text, want, len);
    }
    e->cut[p] = len;
    if (e->pool && p > 1) l3d_pool_run(e->pool, enc_task, e, p);
    else for (int t = 0; t < p; t++) enc_task(e, t, p);
    for (int t = 0; t < p; t++) L3D_CHECK(e->ctx, e->st[t]);
    for (int t = 0; t < p; t++) L3D_CHECK(e->ctx, sink_put(sink, e->ids[t], e->n[t]));
    return L3D_OK;
}

// Reads the whole text once in chunks, hashing it (*hash_p) and, with a sink, validating and
// tokenizing it into the sink as BOS + ids + EOS. `doing` names the pass for the progress line.
static l3d_status text_pass(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                            sink_t *sink, const char *doing, uint64_t *hash_p) {
    int fd = -1;
    uint64_t size = 0;
    int rc = l3d_file_in_open(path, &fd, &size);
    if (rc < 0) return l3d_dataset_file_error(ctx, path, rc);
    l3d_status st = L3D_OK;
    size_t carry = 0, bufcap = TEXT_CHUNK;
    uint64_t h = L3D_FNV64_INIT, off = 0;  // off: bytes of the text processed
    int bpe = sink && strcmp(tok->ops->name, "bytes") != 0;
    encoder_t enc;
    if (sink) encoder_init(ctx, tok, &enc);
    // +4: room for a sequence's first bytes carried over from the previous chunk.
    unsigned char *buf = l3d_malloc(ctx, bufcap + 4, "data");
    if (!buf) {
        if (sink) encoder_fini(&enc);
        l3d_file_in_close(fd);
        return L3D_ERR_NOMEM;
    }
    l3d_progress_t pr;
    l3d_progress_begin(ctx, &pr, size, "%s %s", doing, path);
    if (sink) L3D_CHECK_GOTO(ctx, sink_put(sink, &tok->bos_id, 1), st, out);
    for (;;) {
        size_t got = 0;
        rc = l3d_file_in_read(fd, buf + carry, bufcap - carry, &got);
        if (rc < 0) {
            st = l3d_error(ctx, L3D_ERR_IO, "reading %s: %s", path, strerror(-rc));
            goto out;
        }
        size_t len = carry + got, use = len, bad = 0;
        if (len == 0) break;
        if (sink) {
            const char *why = "";
            int v = utf8_validate(buf, len, &bad, &why);
            if (v == UTF8_BAD || (v == UTF8_TRUNCATED && got == 0)) {
                st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: invalid UTF-8 at byte offset %llu (%s)",
                               path, (unsigned long long)(off + bad), why);
                goto out;
            }
            // A sequence cut by the chunk's end waits for the next chunk (exact for the byte
            // tokenizer); BPE waits for a safe cut, growing the read until one is in it.
            if (v == UTF8_TRUNCATED) use = bad;
            if (bpe && got > 0) {
                size_t cut = bpe_safe_cut(buf, use);
                if (cut == 0 && bufcap < TEXT_MAX_LINE) {
                    unsigned char *bigger = l3d_malloc(ctx, 2 * bufcap + 4, "data");
                    if (!bigger) {
                        st = L3D_ERR_NOMEM;
                        goto out;
                    }
                    memcpy(bigger, buf, len);
                    l3d_free(ctx, buf, bufcap + 4, "data");
                    buf = bigger;
                    bufcap *= 2;
                    carry = len;
                    continue;
                }
                if (cut == 0)
                    l3d_log(ctx, L3D_LOG_WARN, L3D_SUBSYS_DATA, "%s: no line break in %zu MiB "
                            "at byte offset %llu: cut there (the ids at the cut may differ "
                            "from encoding the text in one piece)", path, TEXT_MAX_LINE >> 20,
                            (unsigned long long)off);
                else
                    use = cut;
            }
            L3D_CHECK_GOTO(ctx, encode_into(&enc, buf, use, sink), st, out);
        }
        h = l3d_fnv1a64(h, buf, use);
        off += use;
        carry = len - use;
        memmove(buf, buf + use, carry);
        l3d_progress_update(&pr, off);
        if (got == 0) break;  // only a carried tail was left (and it was not truncated)
    }
    if (off == 0) {
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: empty text file", path);
        goto out;
    }
    if (sink) L3D_CHECK_GOTO(ctx, sink_put(sink, &tok->eos_id, 1), st, out);
    pr.done = pr.total;
    *hash_p = h;
out:
    l3d_progress_end(&pr);
    if (sink) encoder_fini(&enc);
    l3d_free(ctx, buf, bufcap + 4, "data");
    l3d_file_in_close(fd);
    return st;
}

// ---- loading -----------------------------------------------------------------------------
static l3d_status load_small(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                             l3d_dataset_impl_t **ds_p) {
    l3d_dataset_impl_t *ds = l3d_calloc(ctx, 1, sizeof(*ds), "data");
    if (!ds) return L3D_ERR_NOMEM;
    ds->pub.ctx = ctx;
    snprintf(ds->pub.path, sizeof(ds->pub.path), "%s", path);
    sink_t sink = {.ctx = ctx, .ds = ds};
    uint64_t h;
    l3d_status st = text_pass(ctx, path, tok, &sink, "tokenizing", &h);
    if (st < 0) {
        l3d_dataset_free(&ds->pub);
        return st;
    }
    ds->pub.tokens = ds->owned;
    ds->pub.n_tokens = sink.n;
    *ds_p = ds;
    return L3D_OK;
}

// Tokenizes `path` into the cache file `cache`: its bytes must hash to `hash` (the text did not
// change since it was hashed). A failure of the cache file itself (creating, writing or
// publishing it: no space, a quota, a read-only or unwritable directory, ...) comes back as
// its -errno in *cache_rc_p with nothing recorded and the temporary removed, so the caller can
// go elsewhere; a failure of the text (unreadable, invalid, changed) is an error as before.
static l3d_status write_cache(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                              uint64_t hash, const char *cache, int *cache_rc_p) {
    l3d_file_out_t *out = NULL;
    int rc = l3d_file_out_open(cache, &out);
    *cache_rc_p = rc < 0 ? rc : 0;
    if (rc < 0) return L3D_ERR_IO;
    sink_t sink = {.ctx = ctx, .out = out};
    uint64_t h2 = 0;
    l3d_status st = text_pass(ctx, path, tok, &sink, "tokenizing", &h2);
    if (st >= 0 && h2 != hash)
        st = l3d_error(ctx, L3D_ERR_IO, "%s changed while it was being tokenized; try again "
                       "once it is written", path);
    if (st < 0) {
        l3d_file_out_abort(out);
        *cache_rc_p = sink.out_rc;
        return st;
    }
    rc = l3d_file_out_commit(out);
    if (rc < 0) {
        *cache_rc_p = rc;
        return L3D_ERR_IO;
    }
    l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_DATA, "tokenized %s into the token cache %s (%zu "
            "tokens)", path, cache, sink.n);
    return L3D_OK;
}

// Removes the temporaries of `cache` left by runs killed while writing it.
static void sweep_cache_tmps(l3d_ctx_t *ctx, const char *cache) {
    int n = l3d_file_out_sweep(cache);
    if (n > 0)
        l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_DATA, "removed %d temporar%s of %s left by runs "
                "that were killed", n, n == 1 ? "y" : "ies", cache);
}

static l3d_status load_cached(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                              int vocab_size, const char *cache_dir, l3d_dataset_impl_t **ds_p) {
    uint64_t hash = 0;
    L3D_CHECK(ctx, text_pass(ctx, path, tok, NULL, "hashing", &hash));
    char beside[1100], other[1100] = "", *use = beside;
    l3d_dataset_cache_name(NULL, path, hash, tok, beside, sizeof(beside));
    if (cache_dir && cache_dir[0])
        l3d_dataset_cache_name(cache_dir, path, hash, tok, other, sizeof(other));
    sweep_cache_tmps(ctx, beside);
    if (other[0]) sweep_cache_tmps(ctx, other);
    if (l3d_path_exists(beside) > 0) {
        l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_DATA, "%s: using the token cache %s", path, beside);
    } else if (other[0] && l3d_path_exists(other) > 0) {
        use = other;
    } else {
        // Beside the text, else in the cache directory; a cache is an optimisation, so when
        // neither can take it (a full disk, a quota, no permission) the run goes on from the
        // ids in memory, said once.
        int crc = 0, orc = 0;
        l3d_status st = write_cache(ctx, path, tok, hash, beside, &crc);
        if (st < 0 && !crc) return st;  // the text's failure, not the cache's
        char why[1300] = "";
        if (st < 0 && !other[0]) {
            snprintf(why, sizeof(why), " (and no cache directory: set L3D_CACHE_DIR)");
        } else if (st < 0) {
            int drc = l3d_dir_create(cache_dir);
            if (drc < 0)
                snprintf(why, sizeof(why), "; nor create the cache directory %s: %s", cache_dir,
                         strerror(-drc));
            else if ((st = write_cache(ctx, path, tok, hash, other, &orc)) >= 0)
                use = other;
            else if (!orc)
                return st;
            else
                snprintf(why, sizeof(why), "; nor %s: %s", other, strerror(-orc));
        }
        if (st < 0) {
            l3d_log(ctx, L3D_LOG_WARN, L3D_SUBSYS_DATA, "cannot write the token cache %s: %s"
                    "%s; tokenizing %s into memory instead (4 bytes a token; every run will "
                    "tokenize it again)", beside, strerror(-crc), why, path);
            return load_small(ctx, path, tok, ds_p);
        }
    }
    if (use == other)
        l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_DATA, "%s: using the token cache %s", path, other);
    l3d_status st = l3d_dataset_load_bin(ctx, use, vocab_size, ds_p);
    if (st < 0)
        return l3d_error(ctx, st, "%s (the token cache of %s; delete it to tokenize again)",
                         l3d_ctx_last_error(ctx), path);
    // The data set is the text: checkpoints and messages name it, not its cache.
    snprintf((*ds_p)->pub.path, sizeof((*ds_p)->pub.path), "%s", path);
    return L3D_OK;
}

l3d_status l3d_dataset_load_text(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                                 int vocab_size, uint64_t inmem_max, const char *cache_dir,
                                 l3d_dataset_impl_t **ds_p) {
    *ds_p = NULL;
    if (!tok)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: a text data set needs a tokenizer",
                         path);
    if (tok->vocab_size > vocab_size)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "%s: tokenizer %s has %d ids but the model vocab size is %d", path,
                         tok->ops->name, tok->vocab_size, vocab_size);
    int fd = -1;
    uint64_t size = 0;
    int rc = l3d_file_in_open(path, &fd, &size);
    if (rc < 0) return l3d_dataset_file_error(ctx, path, rc);
    l3d_file_in_close(fd);
    if (size <= inmem_max) return load_small(ctx, path, tok, ds_p);
    return load_cached(ctx, path, tok, vocab_size, cache_dir, ds_p);
}
