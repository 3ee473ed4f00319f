// l3d train: the main job. Prints the effective configuration and memory once, then a
// progress line every steps_per_print steps; writes metrics and checkpoints as asked.
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/bootstrap.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

static int resolve_model(l3d_ctx_t *ctx, const char *v, l3d_model_config_t *out, char *src,
                         size_t srclen) {
    l3d_status st;
    snprintf(src, srclen, "%s", v);
    for (const char *const *p = l3d_model_config_preset_names(); *p; p++)
        if (!strcmp(*p, v)) return l3d_model_config_preset(ctx, v, out);
    if (l3d_path_is_dir(v)) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/config.json", v);
        st = l3d_model_config_from_file(ctx, path, out);
    } else if (l3d_path_exists(v)) {
        st = l3d_model_config_from_file(ctx, v, out);
    } else {
        st = l3d_model_config_preset(ctx, v, out);  // reports the preset names
    }
    return st;
}

static void print_memory(const l3d_train_config_t *c, l3d_trainer_t *t, int rank, int world) {
    l3d_mem_breakdown_t mem;
    if (t) l3d_trainer_memory(t, &mem);
    else l3d_train_config_memory(c, &mem);
    double MiB = 1024.0 * 1024.0;
    char who[32] = "";
    if (world > 1) snprintf(who, sizeof(who), " rank %d", rank);
    printf("memory%s%s: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB, "
           "activations %.2f MiB, total %.2f MiB\n",
           who, t ? "" : " (estimate, nothing allocated)", mem.params / MiB, mem.grads / MiB,
           mem.optim / MiB, mem.acts / MiB, (mem.params + mem.grads + mem.optim + mem.acts) / MiB);
    fflush(stdout);
}

static void print_config(const l3d_train_config_t *c, l3d_trainer_t *t, int threads) {
    const l3d_model_config_t *m = &c->model;
    double np = (double)l3d_model_config_num_params(m);
    printf("llama3d train: model %s (%.2fM parameters: hidden %d, ffn %d, layers %d, heads %d, "
           "kv heads %d, head dim %d, vocab %d%s)\n",
           c->model_source[0] ? c->model_source : m->name, np / 1e6, m->hidden_size,
           m->intermediate_size, m->num_hidden_layers, m->num_attention_heads,
           m->num_key_value_heads, m->head_dim, m->vocab_size,
           m->tie_word_embeddings ? ", tied embeddings" : "");
    printf("  parallel dp %d x tp %d x pp %d (order %s, zero stage %d", c->dp, c->tp, c->pp,
           c->parallel_order[0] ? c->parallel_order : "tp-dp-pp", c->zero_stage);
    if (c->pp > 1) {
        const char *ps = c->pp_schedule[0] ? c->pp_schedule : "1f1b";
        int v = c->virtual_stages > 0 ? c->virtual_stages : !strcmp(ps, "interleaved") ? 2 : 1;
        printf(", pipeline %s", ps);
        if (v > 1) printf(" with %d chunks per stage", v);
    }
    printf(")\n");
    printf("  batch %d = micro %d x accumulation %d x dp %d; seq_len %d -> %d tokens per step\n",
           c->train_batch_size, c->micro_batch_size, c->grad_accum_steps, c->dp, c->seq_len,
           c->train_batch_size * c->seq_len);
    printf("  optimizer AdamW lr %g betas (%g, %g) eps %g weight_decay %g; gradient_clipping "
           "%g\n",
           (double)c->lr, (double)c->beta1, (double)c->beta2, (double)c->eps,
           (double)c->weight_decay, (double)c->gradient_clipping);
    static const char *const sched[] = {"constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    printf("  schedule %s", sched[c->sched]);
    if (c->sched != L3D_SCHED_CONSTANT)
        printf(" (%g -> %g over %d warmup steps, %s, total %d)", (double)c->warmup_min_lr,
               (double)c->warmup_max_lr, c->warmup_num_steps, c->warmup_type_log ? "log" : "linear",
               c->total_num_steps);
    printf("; steps %d; seed %llu; activation checkpointing %s\n", c->steps,
           (unsigned long long)c->seed, c->activation_checkpointing ? "on" : "off");
    const char *data = c->data_path[0] ? c->data_path : "/usr/share/common-licenses/GPL-3 (default)";
    if (t)
        printf("  data %s (%lld tokens); device %s, %d threads; gemm peak %.1f GFLOP/s\n", data,
               (long long)l3d_trainer_data_tokens(t), c->device, threads,
               l3d_trainer_gemm_peak(t));
    else
        printf("  data %s; device %s, %d threads\n", data, c->device, threads);
    for (int i = 0; i < c->n_notes; i++) printf("  note: %s\n", c->notes[i]);
    if (c->dp * c->tp * c->pp > 1) {
        l3d_comm_stats_t plan[3];
        l3d_train_config_comm(c, plan);
        double MiB = 1024.0 * 1024.0;
        printf("  communication per step (rank 0, predicted): tp %llu calls %.3f MiB, dp %llu "
               "calls %.3f MiB, pp %llu calls %.3f MiB\n",
               (unsigned long long)plan[0].calls, plan[0].bytes / MiB,
               (unsigned long long)plan[1].calls, plan[1].bytes / MiB,
               (unsigned long long)plan[2].calls, plan[2].bytes / MiB);
    }
    fflush(stdout);
}

int l3d_cmd_train(int argc, char **argv) {
    const char *config = NULL, *model = NULL, *data = NULL, *steps = NULL, *seq = NULL,
               *seed = NULL, *save = NULL, *save_int = NULL, *resume = NULL, *metrics = NULL,
               *threads = NULL, *dp = NULL, *tp = NULL, *pp = NULL, *help = NULL, *dry = NULL,
               *consolidated = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--config", "FILE", "DeepSpeed ds_config.json plus llama3d sections", &config, 0},
        {"--model", "NAME|FILE|DIR", "preset name, HF config.json, or checkpoint dir", &model, 0},
        {"--data", "FILE", "UTF-8 text, or .bin of little-endian uint32 token ids", &data, 0},
        {"--steps", "N", "optimizer steps to run (total, counting resumed ones)", &steps, 0},
        {"--seq-len", "T", "tokens per sequence", &seq, 0},
        {"--seed", "S", "initialisation seed", &seed, 0},
        {"--save", "DIR", "checkpoint directory, written at the end (and every interval)", &save, 0},
        {"--save-interval", "N", "also save every N steps", &save_int, 0},
        {"--save-consolidated", NULL, "a parallel run saves one HF directory (default: every "
         "rank writes its shard in parallel)", &consolidated, 1},
        {"--resume", "DIR", "continue from a checkpoint written by --save", &resume, 0},
        {"--metrics", "FILE.jsonl", "one JSON object per step, and an SVG loss curve", &metrics, 0},
        {"--threads", "N", "CPU threads (default: L3D_NUM_THREADS or all cores)", &threads, 0},
        {"--dp", "N", "data-parallel size", &dp, 0},
        {"--tp", "N", "tensor-parallel size", &tp, 0},
        {"--pp", "N", "pipeline-parallel size", &pp, 0},
        {"--dry-run", NULL, "print the configuration and memory estimate, then stop", &dry, 1},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    int first = argc >= 2 && !strcmp(argv[1], "train") ? 2 : 1;
    if (l3d_cli_parse("train", argc, argv, first, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, "train", "[FLAGS]", flags, nflags);
        return L3D_EXIT_OK;
    }

    l3d_ctx_t *ctx = NULL;
    l3d_status st = l3d_ctx_create(NULL, &ctx);
    if (st < 0) return l3d_cli_fail("train", NULL, st);
    int rc = L3D_EXIT_USAGE;
    l3d_train_config_t *cfg = calloc(1, sizeof(*cfg));
    l3d_trainer_t *t = NULL;
    l3d_metrics_t *mx = NULL;
    l3d_comm_t *world = NULL;
    int rank = 0, nworld = 1;
    if (!cfg) goto out;
    l3d_train_config_default(ctx, cfg);
    if (config && (st = l3d_train_config_from_file(ctx, config, cfg)) < 0) goto fail;
    long long v;
    if (model && (st = resolve_model(ctx, model, &cfg->model, cfg->model_source,
                                     sizeof(cfg->model_source))) < 0)
        goto fail;
    if (data) snprintf(cfg->data_path, sizeof(cfg->data_path), "%s", data);
#define INT_FLAG(str, flag, lo, hi, field)                                   \
    if (str) {                                                               \
        if (l3d_cli_int("train", flag, str, lo, hi, &v)) goto out;           \
        cfg->field = v;                                                      \
    }
    INT_FLAG(steps, "--steps", 0, 1000000000, steps);
    INT_FLAG(seq, "--seq-len", 1, 1 << 20, seq_len);
    INT_FLAG(seed, "--seed", 0, INT64_MAX, seed);
    INT_FLAG(save_int, "--save-interval", 0, 1000000000, save_interval);
    INT_FLAG(threads, "--threads", 0, 4096, num_threads);
    INT_FLAG(dp, "--dp", 1, 1 << 20, dp);
    INT_FLAG(tp, "--tp", 1, 1 << 20, tp);
    INT_FLAG(pp, "--pp", 1, 1 << 20, pp);
#undef INT_FLAG
    if (save && !save[0]) {  // "--save ''" would otherwise save nothing, silently
        fprintf(stderr, "l3d train: --save needs a directory name (got an empty one)\n");
        goto out;
    }
    if (save) snprintf(cfg->save_dir, sizeof(cfg->save_dir), "%s", save);
    if (consolidated) cfg->save_consolidated = 1;
    if (metrics) snprintf(cfg->metrics_path, sizeof(cfg->metrics_path), "%s", metrics);
    if (dp) cfg->dp_auto = 0;
    // One rank of a job: as DeepSpeed, dp is whatever the world leaves after tp and pp unless
    // the config or --dp names it (then the mesh checks the product against the world).
    l3d_launch_env_t env = {0};
    if (l3d_cli_launched()) {
        if ((st = l3d_launch_env_read(ctx, &env)) < 0) goto fail;
        rank = env.rank;
        nworld = env.size;
    }
    if (cfg->dp_auto && nworld % (cfg->tp * cfg->pp) == 0) cfg->dp = nworld / (cfg->tp * cfg->pp);
    if ((st = l3d_train_config_finalize(ctx, cfg)) < 0) goto fail;
    // A save target that would be refused is refused now, not after the training.
    if (cfg->save_dir[0] && (st = l3d_checkpoint_check_target(ctx, cfg->save_dir)) < 0) goto fail;

    int nthreads = cfg->num_threads ? cfg->num_threads : l3d_ctx_settings(ctx)->num_threads;
    if (!nthreads) {
        // Ranks on one node share its cores.
        int local = env.local_size > 0 ? env.local_size : (nworld > 1 ? nworld : 1);
        nthreads = l3d_num_cores() / local;
        if (nthreads < 1) nthreads = 1;
        cfg->num_threads = nthreads;
    }
    if (dry) {
        if (rank == 0) print_config(cfg, NULL, nthreads);
        print_memory(cfg, NULL, rank, nworld);
        rc = L3D_EXIT_OK;
        goto out;
    }
    if (nworld > 1 && (st = l3d_comm_create_env(ctx, NULL, &world)) < 0) goto fail;
    if ((st = l3d_trainer_create_parallel(ctx, cfg, world, &t)) < 0) goto fail;
    if (resume && (st = l3d_trainer_resume(t, resume)) < 0) goto fail;
    if (rank == 0) print_config(cfg, t, nthreads);
    print_memory(cfg, t, rank, nworld);
    if (cfg->metrics_path[0] && rank == 0) {
        int e = l3d_metrics_open(cfg->metrics_path, resume != NULL, &mx);
        if (e) {
            fprintf(stderr, "l3d train: opening %s: %s\n", cfg->metrics_path, strerror(-e));
            rc = L3D_EXIT_FAIL;
            goto out;
        }
    }
    int print_every = cfg->steps_per_print > 0 ? cfg->steps_per_print : 10;
    while (l3d_trainer_steps_done(t) < cfg->steps) {
        l3d_step_stats_t s;
        if ((st = l3d_trainer_step(t, &s)) < 0) goto fail;
        if (mx) l3d_metrics_write(mx, &s);
        if (rank == 0 && (s.step == 1 || s.step % print_every == 0 || s.step == cfg->steps)) {
            char comm[96] = "";
            if (nworld > 1)
                snprintf(comm, sizeof(comm), " | comm MiB tp %.2f dp %.2f pp %.2f",
                         s.comm_bytes[0] / 1048576.0, s.comm_bytes[1] / 1048576.0,
                         s.comm_bytes[2] / 1048576.0);
            printf("step %6d/%d | loss %.4f | lr %.3e | grad-norm %.4f | %.0f tok/s | mfu %.1f%%"
                   "%s\n",
                   s.step, cfg->steps, s.loss, (double)s.lr, s.grad_norm, s.tokens_per_s,
                   100.0 * s.mfu, comm);
            fflush(stdout);
        }
        if (cfg->save_dir[0] && cfg->save_interval > 0 && s.step % cfg->save_interval == 0 &&
            s.step < cfg->steps && (st = l3d_trainer_save(t, cfg->save_dir)) < 0)
            goto fail;
    }
    if (cfg->save_dir[0]) {
        if ((st = l3d_trainer_save(t, cfg->save_dir)) < 0) goto fail;
        if (rank == 0) printf("saved %s (step %d)\n", cfg->save_dir, l3d_trainer_steps_done(t));
    }
    rc = L3D_EXIT_OK;
    goto out;
fail:
    rc = l3d_cli_fail("train", ctx, st);
out:
    if (mx) {
        int e = l3d_metrics_close(mx);
        if (e && rc == L3D_EXIT_OK) {
            fprintf(stderr, "l3d train: writing the loss curve: %s\n", strerror(-e));
            rc = L3D_EXIT_FAIL;
        }
    }
    l3d_trainer_destroy(t);
    if (world && rc != L3D_EXIT_OK) l3d_comm_abort(world);  // the peers fail fast, naming us
    l3d_comm_destroy(world);
    free(cfg);
    l3d_ctx_destroy(ctx);
    return rc;
}
