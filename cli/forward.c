// l3d forward: the logits of one token sequence, for cross-checks against a reference.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

// device: --device, else L3D_DEVICE (the settings' default, cpu)
static l3d_status open_model(l3d_ctx_t *ctx, const char *dir, const char *device,
                             l3d_device_t **dev_p, l3d_model_t **model_p) {
    l3d_device_params_t p = {.num_threads = l3d_ctx_settings(ctx)->num_threads};
    if (!device) device = l3d_ctx_settings(ctx)->device;
    L3D_CHECK(ctx, l3d_device_create(ctx, device, &p, dev_p));
    l3d_status st = l3d_model_open(ctx, *dev_p, dir, model_p);
    if (st < 0) {
        l3d_device_destroy(*dev_p);
        *dev_p = NULL;
    }
    return st;
}

// "1,2,3" -> ids; every entry a non-negative integer.
static int parse_tokens(const char *s, int32_t **ids_p, int *n_p) {
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "l3d forward: --tokens: entry %d of '%s' is not a token id\n", n + 1, s);
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *g = realloc(ids, (size_t)cap * sizeof(int32_t));
            if (!g) {
                free(ids);
                return -1;
            }
            ids = g;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!n) {
        fprintf(stderr, "l3d forward: --tokens is empty\n");
        free(ids);
        return -1;
    }
    *ids_p = ids;
    *n_p = n;
    return 0;
}

int l3d_cmd_forward(int argc, char **argv) {
    const char *ckpt = NULL, *tokens = NULL, *outp = NULL, *device = NULL, *help = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--checkpoint", "DIR", "checkpoint directory (Hugging Face or sharded layout)", &ckpt, 0},
        {"--tokens", "ID,ID,...", "token ids of one sequence", &tokens, 0},
        {"--out", "FILE", "float32 little-endian logits (T x vocab), row-major", &outp, 0},
        {"--device", "NAME", "cpu, cuda, cpu-opaque, cpu-async (default: L3D_DEVICE or cpu)",
         &device, 0},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    if (l3d_cli_parse("forward", argc, argv, 2, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, "forward", "--checkpoint DIR --tokens IDS --out FILE", flags, nflags);
        return L3D_EXIT_OK;
    }
    if (!ckpt || !tokens || !outp) {
        fprintf(stderr, "l3d forward: --checkpoint, --tokens and --out are required\n");
        return L3D_EXIT_USAGE;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (parse_tokens(tokens, &ids, &n)) return L3D_EXIT_USAGE;
    l3d_ctx_t *ctx = NULL;
    l3d_status st = l3d_cli_ctx_create(1, &ctx);
    if (st < 0) {
        free(ids);
        return l3d_cli_fail("forward", NULL, st);
    }
    l3d_device_t *dev = NULL;
    l3d_model_t *m = NULL;
    float *logits = NULL;
    int rc = L3D_EXIT_OK;
    L3D_CHECK_GOTO(ctx, open_model(ctx, ckpt, device, &dev, &m), st, fail);
    const l3d_model_config_t *cfg = l3d_model_config(m);
    if (n > cfg->max_position_embeddings) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "--tokens has %d ids; the model's context is %d", n,
                       cfg->max_position_embeddings);
        goto fail;
    }
    size_t bytes = (size_t)n * (size_t)cfg->vocab_size * sizeof(float);
    logits = malloc(bytes);
    if (!logits) {
        st = l3d_error(ctx, L3D_ERR_NOMEM, "allocating %zu bytes of logits", bytes);
        goto fail;
    }
    L3D_CHECK_GOTO(ctx, l3d_model_logits(m, ids, n, logits), st, fail);
    l3d_iovec_t io = {logits, bytes};
    int e = l3d_file_write(outp, &io, 1);
    if (e) {
        // A path that cannot name an output file is bad input; a full or failing disk is not.
        int bad_path = e == -ENOENT || e == -ENOTDIR || e == -EISDIR || e == -EACCES ||
                       e == -EPERM || e == -ELOOP || e == -ENAMETOOLONG;
        st = l3d_error(ctx, bad_path ? L3D_ERR_CONFIG : L3D_ERR_IO, "--out %s: %s", outp,
                       strerror(-e));
        goto fail;
    }
    goto out;
fail:
    rc = l3d_cli_fail("forward", ctx, st);
out:
    free(logits);
    free(ids);
    l3d_model_destroy(m);
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
    return rc;
}
