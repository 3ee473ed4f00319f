// libFuzzer target: the tokenizer readers and the encoder. The first byte picks the mode:
//   0..63    the rest is a tokenizer.json;  64..127  the rest is a tokenizer.model (tiktoken);
//   128..255 the rest is text for a fixed small tokenizer, encoded with and without special
//            tokens; decoding must give the text back byte for byte (our invalid-UTF-8 rule).
// Files go to a per-process directory. Nothing allocated through the context may stay
// allocated (checked after each input).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/l3d_core.h"
#include "llama3d/tokenizer.h"
#include "tests/fuzz/fuzz_fixed_tokenizer.h"

static void quiet(l3d_log_level level, uint32_t subsys, const char *msg, void *user) {}

// Harness state, not library state: one context, one directory, one fixed tokenizer.
static l3d_ctx_t *ctx;
static char dir[64];
static l3d_tokenizer_t *fixed;

static void put_file(const char *name, const void *data, size_t len) {
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f)) __builtin_trap();
}

// The directory goes when the fuzzer exits (it wrote only these three).
static void remove_dir(void) {
    const char *names[] = {"tokenizer.model", "t.json", "t.model"};
    char path[128];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void setup(void) {
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.read_env = 0;
    p.log_fn = quiet;
    if (l3d_ctx_create(&p, &ctx) != L3D_OK) __builtin_trap();
    snprintf(dir, sizeof(dir), "/tmp/l3d_fuzz_tok_%d", (int)getpid());
    mkdir(dir, 0700);
    atexit(remove_dir);
    char path[128];
    snprintf(path, sizeof(path), "%s/tokenizer.model", dir);
    if (fuzz_fixed_tokenizer_write(path)) __builtin_trap();
    if (l3d_tokenizer_open(ctx, path, &fixed) != L3D_OK) __builtin_trap();
}

static void exercise(l3d_tokenizer_t *tok, const char *text, size_t len, int check) {
    for (unsigned flags = 0; flags < 4; flags++) {
        int32_t *ids = NULL;
        size_t n = 0, bl = 0;
        if (l3d_tokenizer_encode(tok, text, len, flags, &ids, &n) != L3D_OK) continue;
        if (l3d_tokenizer_decode(tok, ids, n, 0, NULL, 0, &bl) != L3D_OK) __builtin_trap();
        char *back = malloc(bl ? bl : 1);
        if (l3d_tokenizer_decode(tok, ids, n, 0, back, bl, &bl) != L3D_OK) __builtin_trap();
        // decode(encode(x)) must be x (after the BOS text where BOS was asked for)
        size_t pre = 0;
        if (flags & L3D_TOKENIZE_BOS) {
            if (n < 1 || l3d_tokenizer_token_to_piece(tok, ids[0], NULL, 0, &pre) != L3D_OK)
                __builtin_trap();
        }
        if (check && (bl != pre + len || (len && memcmp(back + pre, text, len))))
            __builtin_trap();
        free(back);
        l3d_tokens_free(ctx, ids, n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx) setup();
    if (size < 1) return 0;
    unsigned mode = data[0];
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    if (mode >= 128) {
        exercise(fixed, rest, len, 1);
    } else {
        const char *name = mode < 64 ? "t.json" : "t.model";
        put_file(name, rest, len);
        char path[128];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        l3d_tokenizer_t *tok = NULL;
        if (l3d_tokenizer_open(ctx, path, &tok) == L3D_OK) {
            exercise(tok, "Hello <|eot_id|> world 123 \xff!", 28, 0);
            l3d_tokenizer_destroy(tok);
        }
    }
    // Only the fixed tokenizer may hold memory between inputs.
    static size_t base;
    if (!base) base = l3d_ctx_mem_in_use(ctx, NULL);
    if (l3d_ctx_mem_in_use(ctx, NULL) != base) __builtin_trap();
    return 0;
}
