// Large data sets stream: a text over the in-memory limit is tokenized chunk by chunk into a
// token cache beside it (named by an FNV-1a 64 of its bytes computed here independently),
// which a second load maps again without rewriting, and a .bin is mapped, not copied into
// memory. Memory is judged by the ctx's accounting: the ids never pass through it.
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/train/data.h"
#include "core/l3d_core.h"

// Over the 4 MiB in-memory limit, and not a multiple of the reader's 1 MiB chunk.
#define BIG ((size_t)5 << 20)

static l3d_ctx_t *new_ctx(l3d_progress_fn fn, void *user) {
    l3d_ctx_t *ctx = NULL;
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.read_env = 0;
    p.progress_fn = fn;
    p.progress_user = user;
    cr_assert_eq(l3d_ctx_create(&p, &ctx), L3D_OK);
    return ctx;
}

static void temp_dir(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/l3d_test_stream_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

// "é€😀a" repeated: 10 bytes, so 1 MiB chunk boundaries fall inside 2-, 3- and 4-byte
// sequences.
static unsigned char *make_text(size_t len) {
    static const char pat[] = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80" "a";
    unsigned char *t = malloc(len);
    cr_assert_not_null(t);
    for (size_t i = 0; i < len; i++) t[i] = (unsigned char)pat[i % 10];
    // End on a whole sequence.
    size_t tail = len % 10;
    for (size_t i = len - tail; i < len; i++) t[i] = 'z';
    return t;
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static uint64_t fnv1a64(const unsigned char *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// Files in dir other than `keep` (a temporary left behind would show here).
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    char p[600];
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static void check_stream(const l3d_dataset_t *ds, const unsigned char *text, size_t len) {
    cr_assert_eq(ds->n_tokens, len + 2);
    cr_assert_eq(ds->tokens[0], 256);
    cr_assert_eq(ds->tokens[len + 1], 257);
    for (size_t i = 0; i < len; i++)
        if (ds->tokens[i + 1] != (int32_t)text[i])
            cr_assert_fail("token %zu is %d, byte is %d", i + 1, ds->tokens[i + 1], text[i]);
}

Test(stream, text_cached_then_mapped) {
    l3d_ctx_t *ctx = new_ctx(NULL, NULL);
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    char dir[64], path[128], cache[256];
    temp_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/big.txt", dir);
    unsigned char *text = make_text(BIG);
    write_file(path, text, BIG);
    snprintf(cache, sizeof(cache), "%s.l3d-bytes-%016llx.bin", path,
             (unsigned long long)fnv1a64(text, BIG));

    l3d_dataset_t *ds = NULL;
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    // The 20 MiB of ids are not held through the ctx: they are the mapped cache.
    cr_assert_lt(l3d_ctx_mem_in_use(ctx, "data"), (size_t)64 << 10, "%zu bytes of data held",
                 l3d_ctx_mem_in_use(ctx, "data"));
    cr_assert_str_eq(ds->path, path);
    check_stream(ds, text, BIG);
    l3d_dataset_free(ds);
    struct stat a, b;
    cr_assert_eq(stat(cache, &a), 0, "no token cache %s", cache);
    cr_assert_eq((size_t)a.st_size, (BIG + 2) * 4);
    cr_assert_eq(count_files(dir), 2, "a temporary was left in %s", dir);

    // A second load maps the same file: not rewritten, same inode and mtime.
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    check_stream(ds, text, BIG);
    l3d_dataset_free(ds);
    cr_assert_eq(stat(cache, &b), 0);
    cr_assert_eq(a.st_ino, b.st_ino);
    cr_assert_eq(a.st_mtim.tv_sec, b.st_mtim.tv_sec);
    cr_assert_eq(a.st_mtim.tv_nsec, b.st_mtim.tv_nsec);

    // Other bytes, another key: a new cache, the old one untouched.
    text[12349] = 'Q';  // an 'a' of the pattern
    write_file(path, text, BIG);
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    check_stream(ds, text, BIG);
    l3d_dataset_free(ds);
    cr_assert_eq(count_files(dir), 3);

    free(text);
    remove_dir(dir);
    l3d_tokenizer_destroy(tok);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    l3d_ctx_destroy(ctx);
}

Test(stream, invalid_utf8_past_first_chunk) {
    l3d_ctx_t *ctx = new_ctx(NULL, NULL);
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    char dir[64], path[128];
    temp_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/bad.txt", dir);
    unsigned char *text = make_text(BIG);
    // A 3-byte sequence's lead byte in place of an 'a' just before 3 MiB, followed by the
    // next pattern's lead byte.
    size_t at = ((size_t)3 << 20) - 9;
    cr_assert_eq(text[at], 'a');
    text[at] = 0xe2;
    write_file(path, text, BIG);
    l3d_dataset_t *ds = NULL;
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_ERR_FORMAT);
    cr_assert_null(ds);
    char want[64];
    snprintf(want, sizeof(want), "byte offset %zu (invalid continuation byte)", at);
    cr_assert(strstr(l3d_ctx_last_error(ctx), want), "%s", l3d_ctx_last_error(ctx));
    // Nothing published, no temporary left.
    cr_assert_eq(count_files(dir), 1);
    // Truncated at the very end of a large file.
    text[BIG - 1] = 0xf0;
    text[at] = 'a';
    write_file(path, text, BIG);
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_ERR_FORMAT);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "truncated at end of file"), "%s",
              l3d_ctx_last_error(ctx));
    cr_assert_eq(count_files(dir), 1);
    free(text);
    remove_dir(dir);
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
}

Test(stream, bin_mapped_and_checked) {
    l3d_ctx_t *ctx = new_ctx(NULL, NULL);
    char dir[64], path[128];
    temp_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/ids.bin", dir);
    size_t n = (size_t)9 << 20;  // 36 MiB: more than two 16 MiB check windows
    uint32_t *ids = malloc(n * 4);
    for (size_t i = 0; i < n; i++) ids[i] = (uint32_t)(i % 1000);  // little-endian host
    write_file(path, ids, n * 4);
    l3d_dataset_t *ds = NULL;
    cr_assert_eq(l3d_dataset_load(ctx, path, NULL, 1000, &ds), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert_lt(l3d_ctx_mem_in_use(ctx, "data"), (size_t)64 << 10);
    cr_assert_eq(ds->n_tokens, n);
    cr_assert_eq(ds->tokens[n - 1], (int32_t)((n - 1) % 1000));
    l3d_dataset_free(ds);
    // An id out of range in the last window is found and named.
    ids[n - 3] = 1000;
    write_file(path, ids, n * 4);
    cr_assert_eq(l3d_dataset_load(ctx, path, NULL, 1000, &ds), L3D_ERR_FORMAT);
    char want[96];
    snprintf(want, sizeof(want), "token %zu (byte offset %zu) is id 1000", n - 3, (n - 3) * 4);
    cr_assert(strstr(l3d_ctx_last_error(ctx), want), "%s", l3d_ctx_last_error(ctx));
    free(ids);
    remove_dir(dir);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, "data"), 0);
    l3d_ctx_destroy(ctx);
}

Test(stream, fifo_refused_without_waiting) {
    l3d_ctx_t *ctx = new_ctx(NULL, NULL);
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    char dir[64], path[128];
    temp_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/fifo", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    l3d_dataset_t *ds = NULL;
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "not a regular file"), "%s",
              l3d_ctx_last_error(ctx));
    remove_dir(dir);
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
}

// ---- progress ----------------------------------------------------------------------------
typedef struct seen {
    int begins, ends, calls;
    char ops[8][64];
    uint64_t last_done, last_total;
} seen_t;

static void record(const char *what, uint64_t done, uint64_t total, int last, void *user) {
    seen_t *s = user;
    s->calls++;
    if (done == 0 && !last && s->begins < 8) snprintf(s->ops[s->begins++], 64, "%s", what);
    if (last) {
        s->ends++;
        s->last_done = done;
        s->last_total = total;
    }
}

Test(stream, tokenizing_reports_progress) {
    seen_t s = {0};
    l3d_ctx_t *ctx = new_ctx(record, &s);
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    char dir[64], path[128];
    temp_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/big.txt", dir);
    unsigned char *text = make_text(BIG);
    write_file(path, text, BIG);
    l3d_dataset_t *ds = NULL;
    cr_assert_eq(l3d_dataset_load(ctx, path, tok, 259, &ds), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    // hashing, tokenizing, checking the cache: each begun and ended once, the last complete.
    cr_assert_eq(s.begins, 3);
    cr_assert_eq(s.ends, 3);
    cr_assert(strstr(s.ops[0], "hashing") && strstr(s.ops[0], path), "%s", s.ops[0]);
    cr_assert(strstr(s.ops[1], "tokenizing"), "%s", s.ops[1]);
    cr_assert(strstr(s.ops[2], "checking"), "%s", s.ops[2]);
    cr_assert_eq(s.last_done, s.last_total);
    cr_assert_eq(s.last_total, (uint64_t)(BIG + 2) * 4);
    l3d_dataset_free(ds);
    free(text);
    remove_dir(dir);
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
}
