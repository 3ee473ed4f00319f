// bench_tokenizer: single-thread encode speed of a tokenizer on a text file.
//   bench_tokenizer TOKENIZER TEXT [REPEATS]
// Prints one line: "l3d <ids> ids <bytes> bytes best <s> s <tokens/s> tokens/s <MB/s> MB/s", the
// best of REPEATS (default 5) encodes of the whole text (special tokens parsed, no BOS).
// bench/tokenizer.sh runs it beside tiktoken.
#include <stdio.h>
#include <stdlib.h>

#include "core/l3d_core.h"
#include "llama3d/tokenizer.h"
#include "platform/platform.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER TEXT [REPEATS]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (reps < 1) reps = 1;
    char *text = NULL;
    size_t len = 0;
    int rc = l3d_file_read_all(argv[2], 0, &text, &len);
    if (rc < 0) {
        fprintf(stderr, "bench_tokenizer: %s: cannot read\n", argv[2]);
        return 2;
    }
    l3d_ctx_t *ctx = NULL;
    l3d_tokenizer_t *tok = NULL;
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK) return 1;
    double t0 = l3d_time_now();
    if (l3d_tokenizer_open(ctx, argv[1], &tok) != L3D_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", l3d_ctx_last_error(ctx));
        return 2;
    }
    double t_open = l3d_time_now() - t0, best = 1e30;
    size_t n = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids = NULL;
        t0 = l3d_time_now();
        if (l3d_tokenizer_encode(tok, text, len, L3D_TOKENIZE_SPECIAL, &ids, &n) != L3D_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", l3d_ctx_last_error(ctx));
            return 1;
        }
        double dt = l3d_time_now() - t0;
        if (dt < best) best = dt;
        l3d_tokens_free(ctx, ids, n);
    }
    printf("l3d %zu ids %zu bytes best %.4f s %.0f tokens/s %.2f MB/s (open %.2f s)\n", n, len,
           best, n / best, len / best / 1e6, t_open);
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
    free(text);
    return 0;
}
