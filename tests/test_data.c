// The byte tokenizer, the data set loaders (text with UTF-8 validation, .bin token files) and
// the batching rule, each checked against values computed independently here.
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/train/data.h"
#include "core/l3d_core.h"

static l3d_ctx_t *new_ctx(void) {
    l3d_ctx_t *ctx = NULL;
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.read_env = 0;
    cr_assert_eq(l3d_ctx_create(&p, &ctx), L3D_OK);
    return ctx;
}

// A fresh directory per test: Criterion runs tests in parallel processes.
static void temp_dir(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/l3d_test_data_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void write_file(const char *dir, const char *name, const void *data, size_t len,
                       char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    if (len) cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static void write_ids(const char *dir, const char *name, const uint32_t *ids, size_t n, char *path,
                      size_t cap) {
    unsigned char *b = malloc(n * 4 + 1);
    for (size_t i = 0; i < n; i++) {
        b[4 * i + 0] = (unsigned char)(ids[i] & 0xff);
        b[4 * i + 1] = (unsigned char)((ids[i] >> 8) & 0xff);
        b[4 * i + 2] = (unsigned char)((ids[i] >> 16) & 0xff);
        b[4 * i + 3] = (unsigned char)((ids[i] >> 24) & 0xff);
    }
    write_file(dir, name, b, n * 4, path, cap);
    free(b);
}

static void cleanup(const char *dir, const char *path) {
    if (path) unlink(path);
    rmdir(dir);
}

#define ASSERT_MSG_HAS(ctx, needle)                                                    \
    cr_assert(strstr(l3d_ctx_last_error(ctx), (needle)) != NULL,                       \
              "error detail \"%s\" lacks \"%s\"", l3d_ctx_last_error(ctx), (needle))

// ---- tokenizer ---------------------------------------------------------------------------
Test(tokenizer, byte_round_trip_all_256) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    cr_assert_eq(tok->vocab_size, 259);
    cr_assert_eq(tok->bos_id, 256);
    cr_assert_eq(tok->eos_id, 257);
    cr_assert_eq(tok->pad_id, 258);
    char text[256];
    for (int i = 0; i < 256; i++) text[i] = (char)(unsigned char)i;
    int32_t *ids = NULL;
    size_t n = 0;
    cr_assert_eq(l3d_tokenizer_encode(tok, text, sizeof(text), 1, &ids, &n), L3D_OK);
    cr_assert_eq(n, 257);
    cr_assert_eq(ids[0], 256);
    for (int i = 0; i < 256; i++) {
        cr_assert_eq(ids[i + 1], i, "byte %d encoded as %d", i, ids[i + 1]);
        char buf[4] = {0};
        size_t len = 99;
        cr_assert_eq(l3d_tokenizer_token_to_piece(tok, ids[i + 1], buf, sizeof(buf), &len), L3D_OK);
        cr_assert_eq(len, 1);
        cr_assert_eq((unsigned char)buf[0], (unsigned)i);
    }
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), sizeof(l3d_tokenizer_t) + 257 * sizeof(int32_t));
    l3d_tokens_free(ctx, ids, n);

    // Without BOS the ids are the bytes alone; an empty text gives no buffer.
    cr_assert_eq(l3d_tokenizer_encode(tok, "hi\n", 3, 0, &ids, &n), L3D_OK);
    cr_assert_eq(n, 3);
    cr_assert(ids[0] == 'h' && ids[1] == 'i' && ids[2] == '\n');
    l3d_tokens_free(ctx, ids, n);
    cr_assert_eq(l3d_tokenizer_encode(tok, "", 0, 0, &ids, &n), L3D_OK);
    cr_assert_eq(n, 0);
    cr_assert_null(ids);
    l3d_tokens_free(ctx, ids, n);
    cr_assert_eq(l3d_tokenizer_encode(tok, NULL, 0, 1, &ids, &n), L3D_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(ids[0], 256);
    l3d_tokens_free(ctx, ids, n);

    l3d_tokenizer_destroy(tok);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0, "tokenizer leaks or misreports sizes");
    l3d_ctx_destroy(ctx);
}

Test(tokenizer, ops_encode_appends) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    char chunk[100];
    for (int i = 0; i < 100; i++) chunk[i] = (char)(i + 1);
    for (int r = 0; r < 5; r++)
        cr_assert_eq(tok->ops->encode(tok, chunk, sizeof(chunk), 0, &ids, &n, &cap), L3D_OK);
    cr_assert_eq(n, 500);
    cr_assert_geq(cap, 500);
    for (size_t i = 0; i < n; i++) cr_assert_eq(ids[i], (int32_t)(i % 100 + 1));
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), sizeof(l3d_tokenizer_t) + cap * sizeof(int32_t));
    l3d_free(ctx, ids, cap * sizeof(int32_t), "data");
    l3d_tokenizer_destroy(tok);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    l3d_ctx_destroy(ctx);
}

Test(tokenizer, specials_decode_empty) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    int32_t specials[] = {256, 257, 258};
    for (size_t i = 0; i < L3D_ARRAY_LEN(specials); i++) {
        char buf[8];
        size_t len = 99;
        cr_assert_eq(l3d_tokenizer_token_to_piece(tok, specials[i], buf, sizeof(buf), &len),
                     L3D_OK);
        cr_assert_eq(len, 0, "special %d decoded to %zu bytes", specials[i], len);
        len = 99;
        cr_assert_eq(l3d_tokenizer_token_to_piece(tok, specials[i], NULL, 0, &len), L3D_OK);
        cr_assert_eq(len, 0);
    }
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
}

Test(tokenizer, out_of_range_ids) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    int32_t bad[] = {-1, 259, 260, 1 << 20, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < L3D_ARRAY_LEN(bad); i++) {
        char buf[8];
        size_t len = 0;
        cr_assert_eq(l3d_tokenizer_token_to_piece(tok, bad[i], buf, sizeof(buf), &len),
                     L3D_ERR_INVALID_ARG, "id %d accepted", bad[i]);
        char want[32];
        snprintf(want, sizeof(want), "token id %d ", (int)bad[i]);
        ASSERT_MSG_HAS(ctx, want);
    }
    // A byte id into a zero-capacity buffer is the caller's mistake, not a silent truncation;
    // only NULL with capacity 0 asks for the length.
    size_t len = 0;
    char one[1];
    cr_assert_eq(l3d_tokenizer_token_to_piece(tok, 65, one, 0, &len), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_token_to_piece(tok, 65, NULL, 0, &len), L3D_OK);
    cr_assert_eq(len, 1);
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
}

// ---- text data sets ----------------------------------------------------------------------
Test(dataset, text_valid_multibyte) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    // 1-, 2-, 3- and 4-byte sequences, the edges of each range, U+FEFF and U+10FFFF.
    static const char text[] = "a\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc2\x80 \xdf\xbf "
                               "\xe0\xa0\x80 \xed\x9f\xbf \xee\x80\x80 \xef\xbb\xbf "
                               "\xf0\x90\x80\x80 \xf4\x8f\xbf\xbf\n";
    size_t len = sizeof(text) - 1;
    char dir[64], path[512];
    temp_dir(dir, sizeof(dir));
    write_file(dir, "ok.txt", text, len, path, sizeof(path));
    l3d_dataset_t *ds = NULL;
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert_eq(ds->n_tokens, len + 2);
    cr_assert_eq(ds->tokens[0], 256);
    cr_assert_eq(ds->tokens[len + 1], 257);
    for (size_t i = 0; i < len; i++)
        cr_assert_eq(ds->tokens[i + 1], (int32_t)(unsigned char)text[i]);
    cr_assert_str_eq(ds->path, path);
    cr_assert_eq(ds->ctx, ctx);
    l3d_dataset_free(ds);
    cleanup(dir, path);
    l3d_tokenizer_destroy(tok);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    l3d_ctx_destroy(ctx);
}

typedef struct bad_utf8 {
    const char *bytes;
    size_t len;
    size_t offset;
    const char *why;
} bad_utf8;

#define BAD(s, off, why) {s, sizeof(s) - 1, off, why}

Test(dataset, text_invalid_utf8_offsets) {
    static const bad_utf8 cases[] = {
        BAD("ab\xc3\x28zz", 2, "invalid continuation"),
        BAD("\xc3\xa9\xe2\x82\xac\xe2\x28\xa1", 5, "invalid continuation"),  // é € then bad
        BAD("xy\xf0\x9f\x41\x80", 2, "invalid continuation"),              // bad 3rd byte
        BAD("abc\xc0\xaf", 3, "overlong"),
        BAD("\xc1\xbf", 0, "overlong"),
        BAD("x\xe0\x80\xaf", 1, "overlong"),
        BAD("xy\xf0\x80\x80\xaf", 2, "overlong"),
        BAD("hello\xed\xa0\x80", 5, "surrogate"),
        BAD("ok\xed\xbf\xbf!", 2, "surrogate"),
        BAD("\xf4\x90\x80\x80", 0, "above U+10FFFF"),
        BAD("1234\xf5\x80\x80\x80", 4, "never valid"),
        BAD("ab\xff", 2, "never valid"),
        BAD("ab\x80", 2, "unexpected continuation"),
        BAD("abcd\xe2\x82", 4, "truncated"),
        BAD("ok \xf0\x9f\x98", 3, "truncated"),
        BAD("\xc3", 0, "truncated"),
        BAD("abc\xe2\x28", 3, "invalid continuation"),  // short tail, but already bad
    };
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    char dir[64], path[512];
    temp_dir(dir, sizeof(dir));
    for (size_t c = 0; c < L3D_ARRAY_LEN(cases); c++) {
        char name[32];
        snprintf(name, sizeof(name), "bad%zu.txt", c);
        write_file(dir, name, cases[c].bytes, cases[c].len, path, sizeof(path));
        l3d_dataset_t *ds = NULL;
        cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_ERR_FORMAT,
                     "case %zu accepted", c);
        cr_assert_null(ds);
        char want[64];
        snprintf(want, sizeof(want), "byte offset %zu (", cases[c].offset);
        ASSERT_MSG_HAS(ctx, want);
        ASSERT_MSG_HAS(ctx, path);
        ASSERT_MSG_HAS(ctx, cases[c].why);
        unlink(path);
    }
    cleanup(dir, NULL);
    l3d_tokenizer_destroy(tok);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    l3d_ctx_destroy(ctx);
}

Test(dataset, missing_empty_and_small_vocab) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    char dir[64], path[512], want[600];
    temp_dir(dir, sizeof(dir));
    l3d_dataset_t *ds = NULL;

    const char *names[] = {"nope.txt", "nope.bin"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_ERR_NOT_FOUND);
        snprintf(want, sizeof(want), "%s: no such file", path);
        ASSERT_MSG_HAS(ctx, want);
    }

    write_file(dir, "empty.txt", "", 0, path, sizeof(path));
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_ERR_FORMAT);
    ASSERT_MSG_HAS(ctx, path);
    unlink(path);
    write_file(dir, "empty.bin", "", 0, path, sizeof(path));
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_ERR_FORMAT);
    ASSERT_MSG_HAS(ctx, path);
    unlink(path);

    // BOS (256) does not fit a 256-id model: both vocab sizes are named.
    write_file(dir, "t.txt", "abc", 3, path, sizeof(path));
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 256, &ds), L3D_ERR_CONFIG);
    ASSERT_MSG_HAS(ctx, "259");
    ASSERT_MSG_HAS(ctx, "256");
    cr_assert_eq(l3d_dataset_load(ctx, path, NULL, 259, &ds), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 0, &ds), L3D_ERR_INVALID_ARG);
    // A larger model vocabulary is fine.
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 128256, &ds), L3D_OK);
    cr_assert_eq(ds->n_tokens, 5);
    l3d_dataset_free(ds);
    cleanup(dir, path);
    l3d_tokenizer_destroy(tok);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    l3d_ctx_destroy(ctx);
}

// ---- .bin token files --------------------------------------------------------------------
Test(dataset, bin_load) {
    l3d_ctx_t *ctx = new_ctx();
    // Ids wider than one byte catch a wrong byte order; no tokenizer is needed.
    const uint32_t ids[] = {0, 1, 258, 0x0a0b0c, 0xfffff, 77, 65536, 255};
    char dir[64], path[512];
    temp_dir(dir, sizeof(dir));
    write_ids(dir, "tok.bin", ids, L3D_ARRAY_LEN(ids), path, sizeof(path));
    l3d_dataset_t *ds = NULL;
    cr_assert_eq(l3d_dataset_load(ctx, path, NULL, 1 << 20, &ds), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert_eq(ds->n_tokens, L3D_ARRAY_LEN(ids));
    for (size_t i = 0; i < L3D_ARRAY_LEN(ids); i++)
        cr_assert_eq(ds->tokens[i], (int32_t)ids[i], "token %zu: %d", i, ds->tokens[i]);
    l3d_dataset_free(ds);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);

    // The same file against the byte vocabulary: 0x0a0b0c at index 3 is the first too large.
    cr_assert_eq(l3d_dataset_load(ctx, path, NULL, 259, &ds), L3D_ERR_FORMAT);
    cr_assert_null(ds);
    ASSERT_MSG_HAS(ctx, path);
    ASSERT_MSG_HAS(ctx, "token 3 ");
    char want[64];
    snprintf(want, sizeof(want), "id %u,", 0x0a0b0cu);
    ASSERT_MSG_HAS(ctx, want);
    ASSERT_MSG_HAS(ctx, "vocab size 259");
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    unlink(path);

    // The boundary: id == vocab_size - 1 loads, id == vocab_size does not.
    const uint32_t edge[] = {5, 258, 259};
    write_ids(dir, "edge.bin", edge, 2, path, sizeof(path));
    cr_assert_eq(l3d_dataset_load(ctx, path, NULL, 259, &ds), L3D_OK);
    l3d_dataset_free(ds);
    unlink(path);
    write_ids(dir, "edge.bin", edge, 3, path, sizeof(path));
    cr_assert_eq(l3d_dataset_load(ctx, path, NULL, 259, &ds), L3D_ERR_FORMAT);
    ASSERT_MSG_HAS(ctx, "token 2 ");
    ASSERT_MSG_HAS(ctx, "id 259,");
    unlink(path);

    // A length that is not a multiple of 4 names the file and its size.
    write_file(dir, "odd.bin", "0123456789", 10, path, sizeof(path));
    cr_assert_eq(l3d_dataset_load(ctx, path, NULL, 1 << 20, &ds), L3D_ERR_FORMAT);
    ASSERT_MSG_HAS(ctx, path);
    ASSERT_MSG_HAS(ctx, "10 bytes");
    cleanup(dir, path);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    l3d_ctx_destroy(ctx);
}

// ---- batching ----------------------------------------------------------------------------
// The rule written the obvious way, in 128-bit arithmetic where available.
static uint64_t ref_offset(int64_t s, int B, int T, int i, uint64_t n) {
#ifdef __SIZEOF_INT128__
    if (s >= 0 && i >= 0) {
        unsigned __int128 v = ((unsigned __int128)s * (unsigned)B + (unsigned)i) * (unsigned)T;
        return (uint64_t)(v % n);
    }
#endif
    // Small values only (checked by the caller): plain signed 64-bit, then a true residue.
    int64_t v = (s * B + i) * T;
    int64_t r = v % (int64_t)n;
    return (uint64_t)(r < 0 ? r + (int64_t)n : r);
}

static void check_batch(const l3d_dataset_t *ds, int64_t s, int B, int T, int first, int count) {
    size_t m = (size_t)count * (size_t)T;
    int32_t *in = malloc(m * sizeof(int32_t)), *tg = malloc(m * sizeof(int32_t));
    l3d_dataset_batch(ds, s, B, T, first, count, in, tg);
    uint64_t n = ds->n_tokens;
    for (int j = 0; j < count; j++) {
        uint64_t o = ref_offset(s, B, T, first + j, n);
        for (int t = 0; t < T; t++) {
            int32_t want_in = ds->tokens[(o + (uint64_t)t) % n];
            int32_t want_tg = ds->tokens[(o + (uint64_t)t + 1) % n];
            cr_assert_eq(in[(size_t)j * T + t], want_in,
                         "s=%lld B=%d T=%d first=%d seq %d pos %d: input %d want %d",
                         (long long)s, B, T, first, j, t, in[(size_t)j * T + t], want_in);
            cr_assert_eq(tg[(size_t)j * T + t], want_tg,
                         "s=%lld B=%d T=%d first=%d seq %d pos %d: target %d want %d",
                         (long long)s, B, T, first, j, t, tg[(size_t)j * T + t], want_tg);
            // Targets are the inputs shifted by one.
            if (t + 1 < T) cr_assert_eq(tg[(size_t)j * T + t], in[(size_t)j * T + t + 1]);
        }
    }
    free(in);
    free(tg);
}

static l3d_dataset_t make_stream(int32_t *buf, size_t n) {
    l3d_dataset_t ds;
    memset(&ds, 0, sizeof(ds));
    for (size_t i = 0; i < n; i++) buf[i] = (int32_t)(i * 7 + 3);  // distinct, not the index
    ds.tokens = buf;
    ds.n_tokens = n;
    snprintf(ds.path, sizeof(ds.path), "synthetic");
    return ds;
}

Test(batch, rule_matches_reference) {
    static int32_t buf[1000];
    const size_t sizes[] = {1000, 97, 5, 2, 1};
    const int64_t steps[] = {0, 1, 2, 3, 17, 1000003, 1000000000000LL};
    const struct {
        int B, T, first, count;
    } shapes[] = {
        {1, 1, 0, 1}, {4, 8, 0, 4}, {4, 8, 1, 2}, {8, 16, 5, 3}, {3, 13, 0, 3}, {16, 64, 12, 4},
    };
    for (size_t a = 0; a < L3D_ARRAY_LEN(sizes); a++) {
        l3d_dataset_t ds = make_stream(buf, sizes[a]);
        for (size_t b = 0; b < L3D_ARRAY_LEN(steps); b++)
            for (size_t c = 0; c < L3D_ARRAY_LEN(shapes); c++)
                check_batch(&ds, steps[b], shapes[c].B, shapes[c].T, shapes[c].first,
                            shapes[c].count);
    }
}

Test(batch, wraps_around_stream_end) {
    static int32_t buf[10];
    l3d_dataset_t ds = make_stream(buf, 10);
    int32_t in[4 * 6], tg[4 * 6];
    // s=1, B=4, T=6, i=1: o = (4 + 1) * 6 mod 10 = 0; i=0: o = 24 mod 10 = 4, crossing the end.
    l3d_dataset_batch(&ds, 1, 4, 6, 0, 2, in, tg);
    const int32_t want_in0[6] = {buf[4], buf[5], buf[6], buf[7], buf[8], buf[9]};
    const int32_t want_tg0[6] = {buf[5], buf[6], buf[7], buf[8], buf[9], buf[0]};
    const int32_t want_in1[6] = {buf[0], buf[1], buf[2], buf[3], buf[4], buf[5]};
    cr_assert_arr_eq(in, want_in0, sizeof(want_in0));
    cr_assert_arr_eq(tg, want_tg0, sizeof(want_tg0));
    cr_assert_arr_eq(in + 6, want_in1, sizeof(want_in1));
    // T longer than the stream wraps more than once.
    check_batch(&ds, 3, 2, 25, 0, 2);
}

Test(batch, huge_steps) {
    static int32_t buf[4099];
    l3d_dataset_t ds = make_stream(buf, 4099);
    check_batch(&ds, 1000000000000LL, 8, 64, 0, 8);
    check_batch(&ds, 1000000000000LL, 512, 8192, 100, 2);
#ifdef __SIZEOF_INT128__
    // (s * B + i) * T overflows 64 bits here; only the residue matters.
    check_batch(&ds, INT64_MAX, 1 << 20, 1 << 17, 7, 2);
    check_batch(&ds, INT64_MAX - 12345, 2147483647, 3, 2147483640, 7);
#endif
}

Test(batch, slices_compose) {
    // Filling [first, first + count) must equal the matching rows of the whole batch, which is
    // what lets each data-parallel rank fill only its own sequences.
    static int32_t buf[331];
    l3d_dataset_t ds = make_stream(buf, 331);
    enum { B = 8, T = 24 };
    int32_t in[B * T], tg[B * T], pin[3 * T], ptg[3 * T];
    for (int64_t s = 0; s < 40; s += 13) {
        l3d_dataset_batch(&ds, s, B, T, 0, B, in, tg);
        for (int first = 0; first + 3 <= B; first++) {
            l3d_dataset_batch(&ds, s, B, T, first, 3, pin, ptg);
            cr_assert_arr_eq(pin, in + first * T, sizeof(pin));
            cr_assert_arr_eq(ptg, tg + first * T, sizeof(ptg));
        }
    }
}

Test(dataset, check_lengths) {
    l3d_ctx_t *ctx = new_ctx();
    static int32_t buf[10];
    l3d_dataset_t ds = make_stream(buf, 10);
    cr_assert_eq(l3d_dataset_check(ctx, &ds, 9), L3D_OK);
    cr_assert_eq(l3d_dataset_check(ctx, &ds, 1), L3D_OK);
    cr_assert_eq(l3d_dataset_check(ctx, &ds, 10), L3D_ERR_FORMAT);
    ASSERT_MSG_HAS(ctx, "synthetic");
    ASSERT_MSG_HAS(ctx, " 10 tokens");
    ASSERT_MSG_HAS(ctx, " 11");
    cr_assert_eq(l3d_dataset_check(ctx, &ds, 4096), L3D_ERR_FORMAT);
    ASSERT_MSG_HAS(ctx, "4097");
    cr_assert_eq(l3d_dataset_check(ctx, &ds, 0), L3D_ERR_INVALID_ARG);
    l3d_ctx_destroy(ctx);
}

Test(dataset, default_data) {
    if (access(L3D_DEFAULT_DATA, R_OK) != 0) cr_skip_test("%s is not installed", L3D_DEFAULT_DATA);
    struct stat sb;
    cr_assert_eq(stat(L3D_DEFAULT_DATA, &sb), 0);
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    l3d_dataset_t *ds = NULL;
    cr_assert_eq(l3d_dataset_load(ctx, L3D_DEFAULT_DATA, tok, 259, &ds), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert_gt(ds->n_tokens, 10000);
    cr_assert_eq(ds->n_tokens, (size_t)sb.st_size + 2);
    cr_assert_eq(ds->tokens[0], 256);
    cr_assert_eq(ds->tokens[ds->n_tokens - 1], 257);
    // The GPL text starts with its title, centred by spaces.
    char head[64];
    size_t hl = 0;
    for (size_t i = 1; i < ds->n_tokens - 1 && hl + 1 < sizeof(head); i++) {
        size_t l = 0;
        cr_assert_eq(l3d_tokenizer_token_to_piece(tok, ds->tokens[i], head + hl,
                                                  sizeof(head) - hl, &l),
                     L3D_OK);
        hl += l;
    }
    head[hl] = 0;
    cr_assert(strstr(head, "GNU GENERAL PUBLIC LICENSE") != NULL, "head: %s", head);
    cr_assert_eq(l3d_dataset_check(ctx, ds, 1024), L3D_OK);
    check_batch(ds, 123456789, 16, 256, 0, 16);
    l3d_dataset_free(ds);
    l3d_tokenizer_destroy(tok);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    l3d_ctx_destroy(ctx);
}
