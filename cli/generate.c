// l3d generate: KV-cached sampling from a checkpoint, streamed, on one rank or a tensor- and
// pipeline-parallel layout (threads of this process, or processes under l3d launch).
//
// The checkpoint directory decides the text side: its tokenizer (tokenizer.json or
// tokenizer.model; the byte tokenizer for models trained by llama3d on it), its chat template
// (--chat), where generation stops (generation_config.json's eos ids, else config.json's, plus
// the tokenizer's end-of-turn ids) and the sampling defaults generation_config.json gives
// (do_sample, temperature, top_p, top_k), which flags override. Every rank computes the same
// logits and samples the same token from the same seed; rank 0 prints.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/ranks.h"
#include "core/checkpoint/checkpoint_open.h"
#include "core/model/infer_parallel.h"
#include "core/input.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

// What every rank runs, read-only once the ranks start.
typedef struct gen_job {
    const char *ckpt, *prompt, *chat, *tokenizer, *date;
    long long n_new;
    l3d_sampler_params_t sp;
    int set_temp, set_topp, set_topk;  // given on the command line (generation_config.json
                                       // supplies the others)
    int tp, pp, nthreads;  // nthreads: --threads (0: not given)
    const char *device;    // --device (NULL: L3D_DEVICE, else cpu)
    int weights, round16;  // --dtype (l3d_infer_open's `weights`, -1 auto; bfloat16 products)
    int local_ranks;       // ranks sharing this node's cores
} gen_job_t;

// Streams generated text: each piece is flushed at once, and a failed write (a full disk,
// a closed pipe with SIGPIPE ignored) stops the run instead of losing text silently. *last
// keeps the last byte written, so the text can be ended with a newline (0: nothing yet).
static l3d_status put_text(l3d_ctx_t *ctx, const char *p, size_t n, char *last) {
    if ((n && fwrite(p, 1, n, stdout) != n) || fflush(stdout) != 0)
        return l3d_error(ctx, L3D_ERR_IO, "writing the text to standard output: %s",
                         strerror(errno));
    if (n) *last = p[n - 1];
    return L3D_OK;
}

// The prompt's ids: --chat through the tokenizer's template, else the text with BOS (as
// transformers' tokenizer call adds it) and special-token texts parsed.
static l3d_status prompt_ids(l3d_ctx_t *ctx, const gen_job_t *job, l3d_tokenizer_t *tok,
                             int32_t **ids_p, size_t *n_p) {
    if (!job->chat)
        return l3d_tokenizer_encode(tok, job->prompt, strlen(job->prompt),
                                    L3D_TOKENIZE_BOS | L3D_TOKENIZE_SPECIAL, ids_p, n_p);
    json_t *root = NULL;
    l3d_chat_message_t *msgs = NULL;
    size_t nm = 0;
    l3d_status st = l3d_cli_read_chat(ctx, job->chat, &root, &msgs, &nm);
    if (st >= 0) st = l3d_tokenizer_encode_chat(tok, msgs, nm, job->date, ids_p, n_p);
    free(msgs);
    json_decref(root);
    return st;
}

static void gen_rank(l3d_cli_rank_t *r, l3d_ctx_t *ctx) {
    const gen_job_t *job = r->job;
    int rank = r->rank;
    l3d_device_t *dev = NULL;
    l3d_infer_t *inf = NULL;
    l3d_tokenizer_t *tok = NULL;
    l3d_sampler_t *sampler = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    char *piece = NULL;
    size_t piece_cap = 256;
    l3d_status st;
    // --threads, else L3D_NUM_THREADS, else the cores shared by this node's ranks.
    int nt = job->nthreads ? job->nthreads : l3d_ctx_settings(ctx)->num_threads;
    if (!nt && r->world > 1) nt = L3D_MAX(1, l3d_num_cores() / L3D_MAX(1, job->local_ranks));
    l3d_device_params_t dp = {.num_threads = nt};
    const char *dname = job->device ? job->device : l3d_ctx_settings(ctx)->device;
    L3D_CHECK_GOTO(ctx, l3d_device_create(ctx, dname, &dp, &dev), st, fail);
    // The model's config first: the tokenizer is checked against its vocabulary and the
    // prompt against its context before any weight is read.
    char path[1200];
    l3d_model_config_t cfg;
    snprintf(path, sizeof(path), "%s/config.json", job->ckpt);
    st = l3d_input_dir(ctx, job->ckpt, "checkpoint");
    if (st < 0) {
        goto fail;
    }
    L3D_CHECK_GOTO(ctx, l3d_model_config_from_file(ctx, path, &cfg), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_cli_open_tokenizer(ctx, job->ckpt, job->tokenizer, cfg.vocab_size,
                                               &tok), st, fail);
    L3D_CHECK_GOTO(ctx, prompt_ids(ctx, job, tok, &ids, &n_ids), st, fail);
    if (n_ids == 0) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "the prompt encodes to no tokens");
        goto fail;
    }
    int cap = (int)L3D_MIN((long long)cfg.max_position_embeddings, (long long)n_ids + job->n_new);
    if ((int)n_ids >= cap) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "the prompt has %zu tokens; the model's context is "
                       "%d", n_ids, cfg.max_position_embeddings);
        goto fail;
    }
    // Stops and sampling defaults from the checkpoint; the command line wins.
    l3d_generation_config_t gc;
    l3d_cli_stops_t stops;
    L3D_CHECK_GOTO(ctx, l3d_cli_gen_defaults(ctx, job->ckpt, &cfg, tok, &gc, &stops), st, fail);
    l3d_sampler_params_t sp = job->sp;
    if (!job->set_temp && gc.do_sample == 0) sp.temperature = 0.0f;
    else if (!job->set_temp && gc.temperature >= 0.0f) sp.temperature = gc.temperature;
    if (!job->set_topp && gc.top_p > 0.0f) sp.top_p = gc.top_p;
    if (!job->set_topk && gc.top_k >= 0) sp.top_k = gc.top_k;

    double t_load = l3d_time_now();
    L3D_CHECK_GOTO(ctx, l3d_infer_open(ctx, r->comm, job->tp, job->pp, dev, job->ckpt, 1, cap,
                                       job->weights, &inf), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_infer_round_products(inf, job->round16), st, fail);
    t_load = l3d_time_now() - t_load;
    L3D_CHECK_GOTO(ctx, l3d_sampler_create(ctx, cfg.vocab_size, &sp, &sampler), st, fail);
    logits = malloc((size_t)cfg.vocab_size * sizeof(float));
    piece = malloc(piece_cap);
    if (!logits || !piece) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    char last = 0;
    if (rank == 0 && !job->chat)
        L3D_CHECK_GOTO(ctx, put_text(ctx, job->prompt, strlen(job->prompt), &last), st, fail);
    double t0 = l3d_time_now();
    L3D_CHECK_GOTO(ctx, l3d_infer_decode(inf, ids, (int)n_ids, logits), st, fail);
    double t_prefill = l3d_time_now() - t0;
    for (size_t i = 0; i < n_ids; i++)  // the prompt counts for the penalties, as in llama.cpp
        L3D_CHECK_GOTO(ctx, l3d_sampler_accept(sampler, ids[i]), st, fail);
    int produced = 0, stopped = 0;
    double t1 = l3d_time_now();
    while (produced < job->n_new && l3d_infer_len(inf) < cap) {
        int32_t next = 0;
        L3D_CHECK_GOTO(ctx, l3d_sampler_sample(sampler, logits, &next), st, fail);
        produced++;
        if (l3d_cli_stops_has(&stops, next)) {
            stopped = 1;
            break;
        }
        // Special tokens (a header, a reserved id) carry no text to show.
        if (rank == 0 && next < l3d_tokenizer_vocab_size(tok) && !l3d_tokenizer_is_special(tok, next)) {
            size_t len = 0;
            L3D_CHECK_GOTO(ctx, l3d_tokenizer_token_to_piece(tok, next, NULL, 0, &len), st, fail);
            if (len > piece_cap) {
                char *p = realloc(piece, len);
                if (!p) {
                    st = L3D_ERR_NOMEM;
                    goto fail;
                }
                piece = p;
                piece_cap = len;
            }
            L3D_CHECK_GOTO(ctx, l3d_tokenizer_token_to_piece(tok, next, piece, piece_cap, &len),
                           st, fail);
            L3D_CHECK_GOTO(ctx, put_text(ctx, piece, len, &last), st, fail);
        }
        if (l3d_infer_len(inf) >= cap) break;
        L3D_CHECK_GOTO(ctx, l3d_infer_decode(inf, &next, 1, logits), st, fail);
    }
    double dt = l3d_time_now() - t1;
    if (rank == 0) {
        // The text ends in a newline, so a shell prompt or the next line does not continue it.
        if (last && last != '\n') L3D_CHECK_GOTO(ctx, put_text(ctx, "\n", 1, &last), st, fail);
        // Neither an end-of-text id nor --max-tokens ended it: the model's context did (the
        // KV cache holds max_position_embeddings tokens). Said, as llama.cpp says it.
        if (!stopped && produced < job->n_new)
            fprintf(stderr, "l3d generate: stopped: the context of %d tokens is full (%d of "
                    "--max-tokens %lld generated)\n", cfg.max_position_embeddings, produced,
                    job->n_new);
        char layout[64] = "";
        if (job->tp > 1 || job->pp > 1)
            snprintf(layout, sizeof(layout), ", tp %d x pp %d", job->tp, job->pp);
        fprintf(stderr, "l3d generate: loaded in %.2f s%s; prompt %zu tokens in %.3f s (%.1f "
                "tokens/s), %d tokens in %.3f s (%.1f tokens/s)%s\n", t_load, layout, n_ids,
                t_prefill, t_prefill > 0 ? n_ids / t_prefill : 0.0, produced, dt,
                dt > 0 ? produced / dt : 0.0, stopped ? ", stopped at an end-of-text id" : "");
    }
    goto out;
fail:
    l3d_cli_rank_failed(r, ctx, st);
out:
    free(piece);
    free(logits);
    l3d_sampler_destroy(sampler);
    if (ids) l3d_tokens_free(ctx, ids, n_ids);
    l3d_tokenizer_destroy(tok);
    l3d_infer_destroy(inf);
    l3d_device_destroy(dev);
}

int l3d_cmd_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL, *chat = NULL, *tokp = NULL, *date = NULL,
               *maxt = NULL, *temp = NULL, *topk = NULL, *topp = NULL, *minp = NULL,
               *rep = NULL, *freq = NULL, *pres = NULL, *lastn = NULL, *seed = NULL, *tps = NULL,
               *pps = NULL, *threads = NULL, *device = NULL, *dtype = NULL, *help = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--checkpoint", "DIR", "checkpoint directory (Hugging Face or sharded layout)", &ckpt, 0},
        {"--prompt", "TEXT", "text to continue", &prompt, 0},
        {"--chat", "FILE", "a conversation [{\"role\", \"content\"}, ...] to answer, formatted by "
         "the model's chat template", &chat, 0},
        {"--tokenizer", "PATH", "tokenizer.json, tokenizer.model or a directory (default: the "
         "checkpoint's, else bytes)", &tokp, 0},
        {"--date", "TEXT", "the \"Today Date\" of a Llama 3.1/3.2 chat (e.g. \"26 Jul 2024\")",
         &date, 0},
        {"--max-tokens", "N", "tokens to generate (default 128)", &maxt, 0},
        {"--temperature", "T", "sampling temperature, 0 = greedy (default: the checkpoint's "
         "generation_config.json, else 0.8)", &temp, 0},
        {"--top-k", "K", "keep the K most likely tokens, 0 = all (default 40)", &topk, 0},
        {"--top-p", "P", "nucleus sampling mass, 1 = off (default 0.95)", &topp, 0},
        {"--min-p", "P", "drop tokens below P times the likeliest, 0 = off (default 0.05)", &minp, 0},
        {"--repeat-penalty", "R", "divide recent tokens' logits by R, 1 = off (default 1)", &rep, 0},
        {"--frequency-penalty", "F", "subtract F per recent occurrence (default 0)", &freq, 0},
        {"--presence-penalty", "P", "subtract P from every recent token (default 0)", &pres, 0},
        {"--repeat-last-n", "N", "how many recent tokens the penalties see (default 64)", &lastn, 0},
        {"--seed", "S", "sampling seed (default 1)", &seed, 0},
        {"--tp", "N", "tensor-parallel ranks (default 1)", &tps, 0},
        {"--pp", "N", "pipeline stages (default 1)", &pps, 0},
        {"--threads", "N", "CPU threads per rank (default: the cores shared by the ranks)",
         &threads, 0},
        {"--device", "NAME", "cpu, cuda, cpu-opaque, cpu-async (default: L3D_DEVICE or cpu)",
         &device, 0},
        {"--dtype", "TYPE", L3D_CLI_DTYPE_HELP, &dtype, 0},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    if (l3d_cli_parse("generate", argc, argv, 2, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, "generate", "--checkpoint DIR (--prompt TEXT | --chat FILE) [FLAGS]",
                      flags, nflags);
        return L3D_EXIT_OK;
    }
    if (!ckpt || (!prompt && !chat) || (prompt && chat)) {
        fprintf(stderr, "l3d generate: --checkpoint and one of --prompt or --chat are required\n");
        return L3D_EXIT_USAGE;
    }
    gen_job_t job = {.ckpt = ckpt, .prompt = prompt, .chat = chat, .tokenizer = tokp,
                     .date = date, .n_new = 128, .tp = 1, .pp = 1};
    l3d_sampler_params_default(&job.sp);
    long long k = job.sp.top_k, n_last = job.sp.penalty_last_n, s = (long long)job.sp.seed, v;
    double T = job.sp.temperature, P = job.sp.top_p, MP = job.sp.min_p, R = job.sp.repeat_penalty,
           FP = job.sp.frequency_penalty, PP = job.sp.presence_penalty;
    if (maxt && l3d_cli_int("generate", "--max-tokens", maxt, 1, 1 << 20, &job.n_new)) return 2;
    if (temp && l3d_cli_float("generate", "--temperature", temp, 0.0, 100.0, &T)) return 2;
    if (topk && l3d_cli_int("generate", "--top-k", topk, 0, INT32_MAX, &k)) return 2;
    if (topp && l3d_cli_float("generate", "--top-p", topp, 1e-6, 1.0, &P)) return 2;
    if (minp && l3d_cli_float("generate", "--min-p", minp, 0.0, 1.0, &MP)) return 2;
    if (rep && l3d_cli_float("generate", "--repeat-penalty", rep, 1e-3, 1e3, &R)) return 2;
    if (freq && l3d_cli_float("generate", "--frequency-penalty", freq, -100.0, 100.0, &FP)) return 2;
    if (pres && l3d_cli_float("generate", "--presence-penalty", pres, -100.0, 100.0, &PP)) return 2;
    if (lastn && l3d_cli_int("generate", "--repeat-last-n", lastn, 0, 1 << 20, &n_last)) return 2;
    if (seed && l3d_cli_int("generate", "--seed", seed, 0, INT64_MAX, &s)) return 2;
    if (tps && l3d_cli_int("generate", "--tp", tps, 1, 1 << 16, &v)) return 2;
    job.tp = tps ? (int)v : 1;
    if (pps && l3d_cli_int("generate", "--pp", pps, 1, 1 << 16, &v)) return 2;
    job.pp = pps ? (int)v : 1;
    if (threads && l3d_cli_int("generate", "--threads", threads, 0, 4096, &v)) return 2;
    job.nthreads = threads ? (int)v : 0;
    job.device = device;
    if (l3d_cli_weights_dtype("generate", dtype, &job.weights, &job.round16))
        return L3D_EXIT_USAGE;
    job.sp.temperature = (float)T;
    job.sp.top_k = (int)k;
    job.sp.top_p = (float)P;
    job.sp.min_p = (float)MP;
    job.sp.repeat_penalty = (float)R;
    job.sp.frequency_penalty = (float)FP;
    job.sp.presence_penalty = (float)PP;
    job.sp.penalty_last_n = (int)n_last;
    job.sp.seed = (uint64_t)s;
    job.set_temp = temp != NULL;
    job.set_topp = topp != NULL;
    job.set_topk = topk != NULL;

    // The world: a launched job's (its size must be tp x pp), else tp x pp threads.
    int world = job.tp * job.pp, rank = 0;
    if (l3d_cli_launched()) {
        int rc = l3d_cli_launched_layout("generate", job.tp, job.pp, &rank, &world,
                                         &job.local_ranks);
        return rc ? rc : l3d_cli_run_process("generate", &job, rank, world, gen_rank);
    }
    if (world > L3D_CLI_MAX_THREADED_RANKS) {
        fprintf(stderr, "l3d generate: tp %d x pp %d = %d ranks is more than %d threads of one "
                "process; start them as processes (l3d launch -n %d)\n", job.tp, job.pp, world,
                L3D_CLI_MAX_THREADED_RANKS, world);
        return L3D_EXIT_USAGE;
    }
    job.local_ranks = world;
    if (world == 1) return l3d_cli_run_process("generate", &job, 0, 1, gen_rank);
    return l3d_cli_run_threads("generate", &job, world, gen_rank);
}
