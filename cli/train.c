// l3d train: the main job. Builds the configuration (the file, the flags, the launcher's world)
// and checks it once; cli/train_ranks.c then runs the ranks, which print the effective
// configuration and memory once, then a progress line every steps_per_print steps, and write
// metrics and checkpoints as asked.
#include <stdlib.h>
#include <string.h>

#include "cli/ranks.h"
#include "cli/train.h"
#include "core/comm/bootstrap.h"
#include "core/checkpoint/checkpoint_dist.h"
#include "core/checkpoint/checkpoint_hf.h"
#include "core/train/data.h"
#include "core/input.h"
#include "core/l3d_core.h"
#include "core/comm/mesh.h"
#include "platform/platform.h"

// A layout without a launcher runs as threads of this process: at most this many (l3d launch's
// limit on processes).

// --model: a preset, a config.json, or a directory (a checkpoint with weights: training starts
// from them).
static int resolve_model(l3d_ctx_t *ctx, const char *v, l3d_train_config_t *cfg) {
    l3d_status st;
    l3d_model_config_t *out = &cfg->model;
    snprintf(cfg->model_source, sizeof(cfg->model_source), "%s", v);
    cfg->weights_dir[0] = cfg->model_dir[0] = 0;
    for (const char *const *p = l3d_model_config_preset_names(); *p; p++)
        if (!strcmp(*p, v)) return l3d_model_config_preset(ctx, v, out);
    if (l3d_path_is_dir(v)) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/config.json", v);
        st = l3d_model_config_from_file(ctx, path, out);
        snprintf(cfg->model_dir, sizeof(cfg->model_dir), "%s", v);
        if (st >= 0 && (l3d_hf_is_weights_dir(v) || l3d_ckpt_dist_is(v)))
            snprintf(cfg->weights_dir, sizeof(cfg->weights_dir), "%s", v);
    } else if (l3d_path_present(v)) {
        st = l3d_model_config_from_file(ctx, v, out);
    } else {
        st = l3d_model_config_preset(ctx, v, out);  // reports the preset names
    }
    return st;
}

void l3d_train_print_memory(const l3d_train_config_t *c, const l3d_mem_breakdown_t *mem,
                            int estimate, int rank, int world) {
    double MiB = 1024.0 * 1024.0;
    char who[32] = "";
    if (world > 1) snprintf(who, sizeof(who), " rank %d", rank);
    size_t host = mem->host_params + mem->host_grads + mem->host_optim + mem->host_acts;
    printf("memory%s%s: parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB, "
           "activations %.2f MiB, total %.2f MiB on device %s",
           who, estimate ? " (estimate, nothing allocated)" : "", mem->params / MiB,
           mem->grads / MiB, mem->optim / MiB, mem->acts / MiB,
           (mem->params + mem->grads + mem->optim + mem->acts) / MiB, c->device);
    // ZeRO offload: what sits in host memory instead, on its own (device memory above)
    if (host)
        printf("; host memory (offload): parameters %.2f MiB, gradients %.2f MiB, optimizer %.2f MiB, "
               "activations %.2f MiB, total %.2f MiB", mem->host_params / MiB,
               mem->host_grads / MiB, mem->host_optim / MiB, mem->host_acts / MiB, host / MiB);
    printf("\n");
    fflush(stdout);
}

void l3d_train_print_largest_stage(const l3d_train_config_t *c, const l3d_mem_breakdown_t *m0) {
    double MiB = 1024.0 * 1024.0, top = (double)m0->params + m0->grads + m0->optim + m0->acts;
    int best = 0;
    l3d_mem_breakdown_t e, b = *m0;
    for (int s = 1; s < c->pp; s++) {
        l3d_train_config_memory_stage(c, s, &e);
        double t = (double)e.params + e.grads + e.optim + e.acts;
        if (t > top) top = t, best = s, b = e;
    }
    if (!best) return;  // (rank 0's stage needs the most: the line above says it)
    printf("memory of pipeline stage %d, the largest: parameters %.2f MiB, gradients %.2f MiB, "
           "optimizer %.2f MiB, activations %.2f MiB, total %.2f MiB on device %s\n", best,
           b.params / MiB, b.grads / MiB, b.optim / MiB, b.acts / MiB, top / MiB, c->device);
    fflush(stdout);
}

void l3d_train_print_config(const l3d_train_config_t *c, l3d_trainer_t *t, int threads) {
    const l3d_model_config_t *m = &c->model;
    double np = (double)l3d_model_config_num_params(m);
    printf("llama3d train: model %s (%.2fM parameters: hidden %d, ffn %d, layers %d, heads %d, "
           "kv heads %d, head dim %d, vocab %d%s)\n",
           c->model_source[0] ? c->model_source : m->name, np / 1e6, m->hidden_size,
           m->intermediate_size, m->num_hidden_layers, m->num_attention_heads,
           m->num_key_value_heads, m->head_dim, m->vocab_size,
           m->tie_word_embeddings ? ", tied embeddings" : "");
    // Where the weights came from (a resumed run says so on its own line).
    char wdesc[64];
    if (t) l3d_model_weights_desc(l3d_trainer_model(t), wdesc, sizeof(wdesc));
    if (t && c->weights_dir[0])
        printf("  weights: %s (%s)\n", c->weights_dir, wdesc);
    else if (t && !strcmp(wdesc, "new"))
        printf("  weights: new, initialised from seed %llu\n", (unsigned long long)c->seed);
    printf("  parallel dp %d x tp %d x pp %d (order %s, zero stage %d", c->dp, c->tp, c->pp,
           c->parallel_order[0] ? c->parallel_order : "tp-dp-pp", c->zero_stage);
    if (c->pp > 1) {
        const char *ps = c->pp_schedule[0] ? c->pp_schedule : "1f1b";
        int v = c->virtual_stages > 0 ? c->virtual_stages : !strcmp(ps, "interleaved") ? 2 : 1;
        printf(", pipeline %s", ps);
        if (v > 1) printf(" with %d chunks per stage", v);
    }
    if (c->tp_mode == 2) printf(", tensor 2d on a grid of tp %d", c->tp);
    if (c->tp_mode == 3) printf(", tensor 3d on a cube of tp %d", c->tp);
    printf(")\n");

    printf("  batch %d = micro %d x accumulation %d x dp %d; seq_len %d -> %d tokens per step\n",
           c->train_batch_size, c->micro_batch_size, c->grad_accum_steps, c->dp, c->seq_len,
           c->train_batch_size * c->seq_len);
    printf("  optimizer AdamW lr %g betas (%g, %g) eps %g weight_decay %g; gradient_clipping "
           "%g\n",
           (double)c->lr, (double)c->beta1, (double)c->beta2, (double)c->eps,
           (double)c->weight_decay, (double)c->gradient_clipping);
    // (data_types.grad_accum_dtype: docs/precision.md)
    const char *prec = c->bf16 ? "bf16" : c->fp16 ? "fp16" : "fp32";
    printf("  precision %s; weight gradients accumulate in %s\n", prec,
           c->grad_dtype > 0 ? prec : "fp32");
    static const char *const sched[] = {"constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    printf("  schedule %s", sched[c->sched]);
    // The lr values each schedule really runs through: WarmupCosineLR scales the optimizer's
    // lr by its ratios (warmup_min_lr/max_lr are not its parameters).
    const char *wt = c->warmup_type_log ? "log" : "linear";
    if (c->sched == L3D_SCHED_WARMUP_COSINE_LR)
        printf(" (%g -> %g over %d warmup steps, %s, then cosine to %g at step %d)",
               (double)c->lr * c->warmup_min_ratio, (double)c->lr, c->warmup_num_steps, wt,
               (double)c->lr * c->cos_min_ratio, c->total_num_steps);
    else if (c->sched == L3D_SCHED_WARMUP_DECAY_LR)
        printf(" (%g -> %g over %d warmup steps, %s, then linear to 0 at step %d)",
               (double)c->warmup_min_lr, (double)c->warmup_max_lr, c->warmup_num_steps, wt,
               c->total_num_steps);
    else if (c->sched == L3D_SCHED_WARMUP_LR)
        printf(" (%g -> %g over %d warmup steps, %s, then constant)", (double)c->warmup_min_lr,
               (double)c->warmup_max_lr, c->warmup_num_steps, wt);
    // No file was read: the schedule (and the eval below) are llama3d's choice, not the user's.
    if (!c->origin[0] && c->sched != L3D_SCHED_CONSTANT)
        printf(", llama3d's default without --config");
    printf("; steps %d; seed %llu; activation checkpointing %s\n", c->steps,
           (unsigned long long)c->seed, c->activation_checkpointing ? "on" : "off");
    const char *data = c->data_path[0] ? c->data_path : L3D_DEFAULT_DATA " (default)";
    char order[64] = "in order";
    if (c->shuffle)
        snprintf(order, sizeof(order), "shuffled, seed %llu",
                 (unsigned long long)(c->data_seed_set ? c->data_seed : c->seed));
    if (c->tokenizer_path[0]) printf("  tokenizer %s\n", c->tokenizer_path);
    if (t && c->eval_fraction > 0.0 && l3d_trainer_has_eval(t))
        printf("  data %s (%lld tokens, training on the first %lld, %s); device %s, %d threads\n",
               data, (long long)l3d_trainer_data_tokens(t), (long long)l3d_trainer_train_tokens(t),
               order, c->device, threads);
    else if (t)
        printf("  data %s (%lld tokens, %s); device %s, %d threads\n", data,
               (long long)l3d_trainer_data_tokens(t), order, c->device, threads);
    else
        printf("  data %s (%s); device %s, %d threads\n", data, order, c->device, threads);
    if (c->eval_path[0] || c->eval_fraction > 0.0) {
        char stream[600];
        if (c->eval_path[0]) snprintf(stream, sizeof(stream), "%s", c->eval_path);
        else snprintf(stream, sizeof(stream), "the last %g of the data", c->eval_fraction);
        if (t) {
            size_t len = strlen(stream);
            snprintf(stream + len, sizeof(stream) - len, " (%lld tokens)",
                     (long long)l3d_trainer_eval_tokens(t));
        }
        if (t && c->eval_fraction > 0.0 && !l3d_trainer_has_eval(t))
            // The optional default tail gave way to a short data set (core/trainer_eval.c).
            printf("  no eval: %lld tokens are too few to hold out %g (each part needs seq_len "
                   "+ 1 = %d)\n", (long long)l3d_trainer_data_tokens(t), c->eval_fraction,
                   c->seq_len + 1);
        else if (c->eval_interval > 0)
            printf("  eval every %d steps and at the end: %d batches of %s\n", c->eval_interval,
                   c->eval_iters, stream);
        else
            printf("  eval stream %s unused: train.eval_interval is 0\n", stream);
    }
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
    double t0 = l3d_time_now();
    const char *config = NULL, *model = NULL, *data = NULL, *steps = NULL, *seq = NULL,
               *seed = NULL, *save = NULL, *save_int = NULL, *resume = NULL, *metrics = NULL,
               *threads = NULL, *device = NULL, *dp = NULL, *tp = NULL, *pp = NULL, *help = NULL,
               *dry = NULL, *consolidated = NULL, *ds_config = NULL, *tokp = NULL, *world = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--config", "FILE", "DeepSpeed ds_config.json plus llama3d sections", &config, 0},
        {"--deepspeed_config", "FILE", "the same as --config (DeepSpeed's spelling)", &ds_config,
         0},
        {"--model", "NAME|FILE|DIR", "preset name, HF config.json, or checkpoint dir", &model, 0},
        {"--data", "FILE", "UTF-8 text, or .bin of little-endian uint32 token ids", &data, 0},
        {"--tokenizer", "PATH", "tokenizer.json, tokenizer.model or a directory for text data "
         "(default: the model directory's, else bytes)", &tokp, 0},
        {"--steps", "N", "optimizer steps to run (total, counting resumed ones)", &steps, 0},
        {"--seq-len", "T", "tokens per sequence", &seq, 0},
        {"--seed", "S", "initialisation seed", &seed, 0},
        {"--save", "DIR", "checkpoint directory, written at the end (and every interval)", &save, 0},
        {"--save-interval", "N", "also save every N steps", &save_int, 0},
        {"--save-consolidated", NULL, "a parallel run saves one HF directory (default: every "
         "rank writes its shard in parallel)", &consolidated, 1},
        {"--resume", "DIR", "continue from a checkpoint written by --save (its model unless "
         "--model or the config names one)", &resume, 0},
        {"--metrics", "FILE.jsonl", "one JSON object per step, and an SVG loss curve", &metrics, 0},
        {"--threads", "N", "CPU threads (default: L3D_NUM_THREADS or all cores)", &threads, 0},
        {"--device", "NAME", "the device the ranks train on: cpu, cuda (a GPU), cpu-opaque, "
                             "cpu-async (default: train.device, L3D_DEVICE or cpu)", &device, 0},
        {"--dp", "N", "data-parallel size", &dp, 0},
        {"--tp", "N", "tensor-parallel size", &tp, 0},
        {"--pp", "N", "pipeline-parallel size", &pp, 0},
        {"--dry-run", NULL, "print the configuration and memory estimate, then stop", &dry, 1},
        {"--world", "N", "with --dry-run: the job's world size, as l3d launch -n N would give it "
         "(dp = N / (tp x pp) unless set); nothing is launched", &world, 0},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    int first = argc >= 2 && !strcmp(argv[1], "train") ? 2 : 1;
    if (l3d_cli_parse("train", argc, argv, first, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, "train", "[FLAGS]", flags, nflags);
        // What a run without a file trains with (llama3d/config.h, l3d_train_config_job_defaults):
        // the schedule and evaluation are llama3d's, which a file replaces by DeepSpeed's.
        printf("\nWithout --config, llama3d's main job: llama3-tiny on %s,\n"
               "batch 8 x seq_len 64, 200 steps, AdamW lr 1e-3 with a linear warm-up over 10%%\n"
               "of --steps (at least 5, at most half) and cosine decay to 1e-4 at the last step\n"
               "(DeepSpeed's WarmupCosineLR); the data's last 10%% held out and evaluated every\n"
               "50 steps and after the last (4 batches). With --config, DeepSpeed's meaning: a\n"
               "file without a scheduler section is a constant lr, and nothing is evaluated\n"
               "unless data.eval_* and train.eval_interval ask for it. Every run ends on one\n"
               "line: steps, tokens, time, first and last loss, eval loss, and where the\n"
               "metrics and checkpoint went.\n",
               L3D_DEFAULT_DATA);
        return L3D_EXIT_OK;
    }

    if (ds_config) {
        if (config && strcmp(config, ds_config)) {
            fprintf(stderr, "l3d train: --config %s and --deepspeed_config %s name different "
                    "files; give one\n", config, ds_config);
            return L3D_EXIT_USAGE;
        }
        config = ds_config;
    }

    l3d_ctx_t *ctx = NULL;
    l3d_status st = l3d_ctx_create(NULL, &ctx);
    if (st < 0) return l3d_cli_fail("train", NULL, st);
    int rc = L3D_EXIT_USAGE;
    l3d_train_config_t *cfg = calloc(1, sizeof(*cfg));
    int rank = 0, nworld = 1;
    if (!cfg) goto out;
    l3d_train_config_default(ctx, cfg);
    char default_source[sizeof(cfg->model_source)];
    snprintf(default_source, sizeof(default_source), "%s", cfg->model_source);
    if (config && (st = l3d_train_config_from_file(ctx, config, cfg)) < 0) goto fail;
    long long v;
    // The model: --model, else the config file's "model", else (resuming) the checkpoint's
    // own config.json, which is the only model the checkpoint can resume into.
    if (!model && resume && !strcmp(cfg->model_source, default_source)) {
        if ((st = l3d_input_dir(ctx, resume, "--resume")) < 0) goto fail;
        model = resume;
    }
    if (model && (st = resolve_model(ctx, model, cfg)) < 0) goto fail;
    // Resuming restores the checkpoint's own weights (and optimizer state).
    if (resume) cfg->weights_dir[0] = 0;
    if (data) snprintf(cfg->data_path, sizeof(cfg->data_path), "%s", data);
    if (device) snprintf(cfg->device, sizeof(cfg->device), "%s", device);
    if (tokp) snprintf(cfg->tokenizer_path, sizeof(cfg->tokenizer_path), "%s", tokp);
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
    // No file: llama3d's own schedule (over the --steps just read) and an eval tail. A file
    // keeps DeepSpeed's meaning: no scheduler section is a constant lr.
    if (!config) l3d_train_config_job_defaults(cfg);
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
    // Without a launcher the layout's ranks are threads of this process: the world is
    // dp x tp x pp.
    int launched = l3d_cli_launched();
    l3d_launch_env_t env = {0};
    if (world) {
        // A dry run of a launched job: rank 0 of a world of N (the largest vocabulary block,
        // so its figures bound every rank's), and the world checked as the run checks it.
        if (!dry) {
            fprintf(stderr, "l3d train: --world is for --dry-run (a run's world is l3d launch "
                    "-n N, or dp x tp x pp threads)\n");
            goto out;
        }
        if (launched) {
            fprintf(stderr, "l3d train: --world under l3d launch: the launcher gives the world\n");
            goto out;
        }
        if (l3d_cli_int("train", "--world", world, 1, 1 << 24, &v)) goto out;
        nworld = (int)v;
        if (cfg->dp_auto && nworld % (cfg->tp * cfg->pp) == 0)
            cfg->dp = nworld / (cfg->tp * cfg->pp);
        if ((st = l3d_mesh_check_world(ctx, cfg->dp, cfg->tp, cfg->pp, nworld)) < 0) goto fail;
    }
    if (launched) {
        if ((st = l3d_launch_env_read(ctx, &env)) < 0) goto fail;
        rank = env.rank;
        nworld = env.size;
        cfg->device_index = env.local_rank;  // (one GPU per rank of a node, as torchrun's)
        if (cfg->dp_auto && nworld % (cfg->tp * cfg->pp) == 0)
            cfg->dp = nworld / (cfg->tp * cfg->pp);
    }
    // Once, now that the file, the flags and the world are known: the world against the
    // layout, then the batch identity and the layout's checks (the run's, so --dry-run refuses
    // what the run would).
    if (launched && (st = l3d_mesh_check_world(ctx, cfg->dp, cfg->tp, cfg->pp, nworld)) < 0)
        goto fail;
    if ((st = l3d_train_config_finalize(ctx, cfg)) < 0) goto fail;
    // A resumed run reads its text with the tokenizer its checkpoint carries.
    if (resume && !cfg->tokenizer_path[0] && l3d_tokenizer_dir_has(resume))
        snprintf(cfg->tokenizer_path, sizeof(cfg->tokenizer_path), "%s", resume);
    if (!launched && !world) {
        long long n = (long long)cfg->dp * cfg->tp * cfg->pp;
        if (n > L3D_CLI_MAX_THREADED_RANKS) {
            fprintf(stderr, "l3d train: dp %d x tp %d x pp %d = %lld ranks is more than %d "
                    "threads of one process; start them as processes (l3d launch -n %lld)\n",
                    cfg->dp, cfg->tp, cfg->pp, n, L3D_CLI_MAX_THREADED_RANKS, n);
            goto out;
        }
        nworld = (int)n;
    }
    // A save target that would be refused is refused now, not after the training.
    if (cfg->save_dir[0] && (st = l3d_checkpoint_check_target(ctx, cfg->save_dir)) < 0) goto fail;

    int nthreads = cfg->num_threads ? cfg->num_threads : l3d_ctx_settings(ctx)->num_threads;
    if (!nthreads) {
        // Ranks on one node share its cores (threads of this process too).
        int local = env.local_size > 0 ? env.local_size : (nworld > 1 ? nworld : 1);
        nthreads = l3d_num_cores() / local;
        if (nthreads < 1) nthreads = 1;
        cfg->num_threads = nthreads;
    }
    if (dry) {
        // A launched rank prints its own stage's; otherwise rank 0's and the largest stage's.
        int stage = 0, many = launched || world;
        if (many && (st = l3d_train_config_rank_stage(ctx, cfg, rank, &stage)) < 0) goto fail;
        l3d_mem_breakdown_t mem;
        l3d_train_config_memory_stage(cfg, stage, &mem);
        if (rank == 0) l3d_train_print_config(cfg, NULL, nthreads);
        l3d_train_print_memory(cfg, &mem, 1, rank, many ? nworld : 1);
        if (!launched && cfg->pp > 1) l3d_train_print_largest_stage(cfg, &mem);
        rc = L3D_EXIT_OK;
        goto out;
    }
    // The MFU roof, before any rank starts: measured (on a cache miss) while nothing else of
    // this job runs, with the threads one rank has.
    char peak_source[1200];
    if ((st = l3d_train_resolve_peak(ctx, cfg, nthreads, peak_source, sizeof(peak_source))) < 0)
        goto fail;
    if (rank == 0)
        printf("MFU roof %.1f GFLOP/s per rank (%s)\n", cfg->peak_flops / 1e9, peak_source);
    l3d_train_job_t job = {.cfg = cfg, .resume = resume, .nthreads = nthreads, .rank = rank,
                           .world = nworld, .threaded = !launched && nworld > 1, .t0 = t0};
    // The ranks make their own contexts: this one's part (reading the configuration) is done.
    l3d_ctx_destroy(ctx);
    ctx = NULL;
    rc = job.threaded ? l3d_train_run_threads(&job) : l3d_train_run_process(&job);
    goto out;
fail:
    rc = l3d_cli_fail("train", ctx, st);
out:
    free(cfg);
    l3d_ctx_destroy(ctx);
    return rc;
}
