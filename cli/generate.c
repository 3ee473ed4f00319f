// l3d generate (KV-cached sampling, streamed) and l3d forward (logits for cross-checks).
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/data.h"
#include "core/l3d_core.h"
#include "devices/device.h"
#include "platform/platform.h"

static l3d_status open_model(l3d_ctx_t *ctx, const char *dir, l3d_device_t **dev_p,
                             l3d_model_t **model_p) {
    l3d_device_params_t p = {.num_threads = l3d_ctx_settings(ctx)->num_threads};
    L3D_CHECK(ctx, l3d_device_create(ctx, l3d_ctx_settings(ctx)->device, &p, dev_p));
    l3d_status st = l3d_model_open(ctx, *dev_p, dir, model_p);
    if (st < 0) {
        l3d_device_destroy(*dev_p);
        *dev_p = NULL;
    }
    return st;
}

// Streams generated text: each piece is flushed at once, and a failed write (a full disk,
// a closed pipe with SIGPIPE ignored) stops the run instead of losing text silently.
static l3d_status put_text(l3d_ctx_t *ctx, const char *p, size_t n) {
    if ((n && fwrite(p, 1, n, stdout) != n) || fflush(stdout) != 0)
        return l3d_error(ctx, L3D_ERR_IO, "writing the text to standard output: %s",
                         strerror(errno));
    return L3D_OK;
}

int l3d_cmd_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL, *maxt = NULL, *temp = NULL, *topp = NULL,
               *topk = NULL, *minp = NULL, *rep = NULL, *freq = NULL, *pres = NULL,
               *lastn = NULL, *seed = NULL, *help = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--checkpoint", "DIR", "checkpoint directory (Hugging Face or sharded layout)", &ckpt, 0},
        {"--prompt", "TEXT", "text to continue", &prompt, 0},
        {"--max-tokens", "N", "tokens to generate (default 128)", &maxt, 0},
        {"--temperature", "T", "sampling temperature, 0 = greedy (default 0.8)", &temp, 0},
        {"--top-k", "K", "keep the K most likely tokens, 0 = all (default 40)", &topk, 0},
        {"--top-p", "P", "nucleus sampling mass, 1 = off (default 0.95)", &topp, 0},
        {"--min-p", "P", "drop tokens below P times the likeliest, 0 = off (default 0.05)", &minp, 0},
        {"--repeat-penalty", "R", "divide recent tokens' logits by R, 1 = off (default 1)", &rep, 0},
        {"--frequency-penalty", "F", "subtract F per recent occurrence (default 0)", &freq, 0},
        {"--presence-penalty", "P", "subtract P from every recent token (default 0)", &pres, 0},
        {"--repeat-last-n", "N", "how many recent tokens the penalties see (default 64)", &lastn, 0},
        {"--seed", "S", "sampling seed (default 1)", &seed, 0},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    if (l3d_cli_parse("generate", argc, argv, 2, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, "generate", "--checkpoint DIR --prompt TEXT [FLAGS]", flags, nflags);
        return L3D_EXIT_OK;
    }
    if (!ckpt || !prompt) {
        fprintf(stderr, "l3d generate: --checkpoint and --prompt are required\n");
        return L3D_EXIT_USAGE;
    }
    l3d_sampler_params_t sp;
    l3d_sampler_params_default(&sp);
    long long n_new = 128, s = (long long)sp.seed, k = sp.top_k, n_last = sp.penalty_last_n;
    double T = sp.temperature, P = sp.top_p, MP = sp.min_p, R = sp.repeat_penalty,
           FP = sp.frequency_penalty, PP = sp.presence_penalty;
    if (maxt && l3d_cli_int("generate", "--max-tokens", maxt, 1, 1 << 20, &n_new)) return 2;
    if (temp && l3d_cli_float("generate", "--temperature", temp, 0.0, 100.0, &T)) return 2;
    if (topk && l3d_cli_int("generate", "--top-k", topk, 0, INT32_MAX, &k)) return 2;
    if (topp && l3d_cli_float("generate", "--top-p", topp, 1e-6, 1.0, &P)) return 2;
    if (minp && l3d_cli_float("generate", "--min-p", minp, 0.0, 1.0, &MP)) return 2;
    if (rep && l3d_cli_float("generate", "--repeat-penalty", rep, 1e-3, 1e3, &R)) return 2;
    if (freq && l3d_cli_float("generate", "--frequency-penalty", freq, -100.0, 100.0, &FP)) return 2;
    if (pres && l3d_cli_float("generate", "--presence-penalty", pres, -100.0, 100.0, &PP)) return 2;
    if (lastn && l3d_cli_int("generate", "--repeat-last-n", lastn, 0, 1 << 20, &n_last)) return 2;
    if (seed && l3d_cli_int("generate", "--seed", seed, 0, INT64_MAX, &s)) return 2;
    sp.temperature = (float)T;
    sp.top_k = (int)k;
    sp.top_p = (float)P;
    sp.min_p = (float)MP;
    sp.repeat_penalty = (float)R;
    sp.frequency_penalty = (float)FP;
    sp.presence_penalty = (float)PP;
    sp.penalty_last_n = (int)n_last;
    sp.seed = (uint64_t)s;

    l3d_ctx_t *ctx = NULL;
    l3d_status st = l3d_cli_ctx_create(1, &ctx);
    if (st < 0) return l3d_cli_fail("generate", NULL, st);
    l3d_device_t *dev = NULL;
    l3d_model_t *m = NULL;
    l3d_tokenizer_t *tok = NULL;
    l3d_kv_cache_t *cache = NULL;
    l3d_sampler_t *sampler = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    int rc = L3D_EXIT_OK;
    L3D_CHECK_GOTO(ctx, open_model(ctx, ckpt, &dev, &m), st, fail);
    const l3d_model_config_t *cfg = l3d_model_config(m);
    L3D_CHECK_GOTO(ctx, l3d_tokenizer_create_bytes(ctx, &tok), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n_ids), st, fail);
    int cap = (int)L3D_MIN((long long)cfg->max_position_embeddings, (long long)n_ids + n_new);
    if ((int)n_ids >= cap) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "the prompt has %zu tokens; the model's context is "
                       "%d", n_ids, cfg->max_position_embeddings);
        goto fail;
    }
    L3D_CHECK_GOTO(ctx, l3d_kv_cache_create(m, cap, &cache), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_sampler_create(ctx, cfg->vocab_size, &sp, &sampler), st, fail);
    logits = malloc((size_t)cfg->vocab_size * sizeof(float));
    if (!logits) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    L3D_CHECK_GOTO(ctx, put_text(ctx, prompt, strlen(prompt)), st, fail);
    double t0 = l3d_time_now();
    L3D_CHECK_GOTO(ctx, l3d_model_decode(m, cache, ids, (int)n_ids, logits), st, fail);
    double t_prefill = l3d_time_now() - t0;
    for (size_t i = 0; i < n_ids; i++)  // the prompt counts for the penalties, as in llama.cpp
        L3D_CHECK_GOTO(ctx, l3d_sampler_accept(sampler, ids[i]), st, fail);
    int produced = 0;
    double t1 = l3d_time_now();
    while (produced < n_new && l3d_kv_cache_len(cache) < cap) {
        int32_t next = 0;
        L3D_CHECK_GOTO(ctx, l3d_sampler_sample(sampler, logits, &next), st, fail);
        produced++;
        if (next == tok->eos_id) break;
        char buf[16];
        size_t len = 0;
        if (next < tok->vocab_size) {
            L3D_CHECK_GOTO(ctx, l3d_tokenizer_token_to_piece(tok, next, buf, sizeof(buf), &len),
                           st, fail);
            L3D_CHECK_GOTO(ctx, put_text(ctx, buf, len), st, fail);
        }
        if (l3d_kv_cache_len(cache) >= cap) break;
        L3D_CHECK_GOTO(ctx, l3d_model_decode(m, cache, &next, 1, logits), st, fail);
    }
    double dt = l3d_time_now() - t1;
    fprintf(stderr, "\nl3d generate: prompt %zu tokens in %.3f s (%.1f tokens/s), %d tokens in "
            "%.3f s (%.1f tokens/s)\n", n_ids, t_prefill, t_prefill > 0 ? n_ids / t_prefill : 0.0,
            produced, dt, dt > 0 ? produced / dt : 0.0);
    goto out;
fail:
    rc = l3d_cli_fail("generate", ctx, st);
out:
    free(logits);
    l3d_sampler_destroy(sampler);
    l3d_kv_cache_destroy(cache);
    if (ids) l3d_tokens_free(ctx, ids, n_ids);
    l3d_tokenizer_destroy(tok);
    l3d_model_destroy(m);
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
    return rc;
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
    const char *ckpt = NULL, *tokens = NULL, *outp = NULL, *help = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--checkpoint", "DIR", "checkpoint directory (Hugging Face or sharded layout)", &ckpt, 0},
        {"--tokens", "ID,ID,...", "token ids of one sequence", &tokens, 0},
        {"--out", "FILE", "float32 little-endian logits (T x vocab), row-major", &outp, 0},
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
    L3D_CHECK_GOTO(ctx, open_model(ctx, ckpt, &dev, &m), st, fail);
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
