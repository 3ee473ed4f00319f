// Helpers shared by tests/test_tokenizer.c and tests/test_chat.c: a temporary directory per
// test, and small byte-level BPE tokenizer.json files built with jansson.
#ifndef L3D_TEST_TOKENIZER_FIXTURES_H
#define L3D_TEST_TOKENIZER_FIXTURES_H
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/train/data.h"
#include "core/l3d_core.h"
#include "llama3d/tokenizer.h"

static inline l3d_ctx_t *new_ctx(void) {
    l3d_ctx_t *ctx = NULL;
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.read_env = 0;
    cr_assert_eq(l3d_ctx_create(&p, &ctx), L3D_OK);
    return ctx;
}

#define ASSERT_MSG_HAS(ctx, needle)                                                    \
    cr_assert(strstr(l3d_ctx_last_error(ctx), (needle)) != NULL,                       \
              "error detail \"%s\" lacks \"%s\"", l3d_ctx_last_error(ctx), (needle))

static char g_dir[64] __attribute__((unused));

static inline void make_dir(void) {
    snprintf(g_dir, sizeof(g_dir), "/tmp/l3d_test_tok_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static inline void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    cr_assert_eq(system(cmd), 0);
}

static inline const char *write_file(const char *name, const void *data, size_t len) {
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    if (len) cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
    return path;
}

// ---- building tokenizer.json files --------------------------------------------------------
// Hugging Face's byte-to-unicode alphabet, written independently of core/text/tokenizer_load.c.
static inline unsigned alphabet_cp(unsigned char c) {
    if ((c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae) return c;
    unsigned n = 0;
    for (unsigned b = 0; b < c; b++)
        if (!((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae)) n++;
    return 256 + n;
}

// bytes -> the alphabet's UTF-8 spelling (static buffer).
static inline const char *spell(const char *bytes, size_t n) {
    static char out[4][1024];
    static int which;
    char *o = out[which++ & 3];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned cp = alphabet_cp((unsigned char)bytes[i]);
        if (cp < 0x80) {
            o[k++] = (char)cp;
        } else {
            o[k++] = (char)(0xc0 | (cp >> 6));
            o[k++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    o[k] = 0;
    return o;
}

static const char *llama3_re __attribute__((unused)) =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// A byte-level BPE with the 256 byte tokens as ids 0..255 (id = byte), no merges yet.
static inline json_t *base_json(const char *pattern, int ignore_merges) {
    json_t *vocab = json_object();
    for (int c = 0; c < 256; c++) {
        char b = (char)c;
        json_object_set_new(vocab, spell(&b, 1), json_integer(c));
    }
    json_t *model = json_pack("{s:s, s:o, s:[], s:b, s:n, s:n, s:b}", "type", "BPE", "vocab",
                              vocab, "merges", "ignore_merges", ignore_merges,
                              "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback",
                              0);
    json_t *pre = json_pack(
        "{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
        "pretokenizers", "type", "Split", "pattern", "Regex", pattern ? pattern : llama3_re,
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 1, "use_regex", 0);
    json_t *root = json_pack("{s:s, s:[], s:n, s:o, s:{s:s}, s:o}", "version", "1.0",
                             "added_tokens", "normalizer", "pre_tokenizer", pre, "decoder",
                             "type", "ByteLevel", "model", model);
    cr_assert_not_null(root);
    return root;
}

// Adds merge (a, b) (raw bytes) as the next rank and a+b to the vocabulary; returns its id.
static inline int add_merge(json_t *root, const char *a, const char *b) {
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    char both[512], line[1100];
    snprintf(both, sizeof(both), "%s%s", a, b);
    const char *sb = spell(both, strlen(both));
    json_t *have = json_object_get(vocab, sb);
    int id = have ? (int)json_integer_value(have) : (int)json_object_size(vocab);
    if (!have) json_object_set_new(vocab, sb, json_integer(id));
    snprintf(line, sizeof(line), "%s %s", spell(a, strlen(a)), spell(b, strlen(b)));
    json_array_append_new(json_object_get(model, "merges"), json_string(line));
    return id;
}

static inline void add_added(json_t *root, int id, const char *content, int special) {
    json_array_append_new(json_object_get(root, "added_tokens"),
                          json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content",
                                    content, "single_word", 0, "lstrip", 0, "rstrip", 0,
                                    "normalized", 0, "special", special));
}

static inline const char *save_json(json_t *root, const char *name) {
    char *s = json_dumps(root, JSON_COMPACT);
    const char *p = write_file(name, s, strlen(s));
    free(s);
    return p;
}

static inline l3d_tokenizer_t *open_json(l3d_ctx_t *ctx, json_t *root) {
    const char *p = save_json(root, "tokenizer.json");
    l3d_tokenizer_t *tok = NULL;
    l3d_status st = l3d_tokenizer_open(ctx, p, &tok);
    cr_assert_eq(st, L3D_OK, "open: %s", l3d_ctx_last_error(ctx));
    return tok;
}

// Encodes and compares with the expected ids (terminated by -1).
static inline void expect_ids(l3d_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                       const int32_t *want) {
    int32_t *ids = NULL;
    size_t n = 0, nw = 0;
    cr_assert_eq(l3d_tokenizer_encode(tok, text, len, flags, &ids, &n), L3D_OK);
    while (want[nw] >= 0) nw++;
    char got[512] = "";
    for (size_t i = 0; i < n && strlen(got) < 480; i++)
        snprintf(got + strlen(got), sizeof(got) - strlen(got), "%d ", (int)ids[i]);
    cr_assert_eq(n, nw, "'%.*s': %zu ids (%s), want %zu", (int)len, text, n, got, nw);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "'%.*s': id %zu is %d, want %d (got %s)", (int)len, text,
                     i, ids[i], want[i], got);
    l3d_tokens_free(tok->ctx, ids, n);
}


#define IDS(...) ((const int32_t[]){__VA_ARGS__, -1})

#endif
