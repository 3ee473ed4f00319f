// The l3d program's shared pieces: flag parsing, exit codes, metrics output.
#ifndef L3D_CLI_H
#define L3D_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "llama3d/llama3d.h"

// Exit codes: 0 success, 1 a runtime failure, 2 bad input (flags, config, files).
#define L3D_EXIT_OK 0
#define L3D_EXIT_FAIL 1
#define L3D_EXIT_USAGE 2

// A flag table row. Flags take one value unless `is_switch`.
typedef struct l3d_cli_flag {
    const char *name;  // "--steps"
    const char *meta;  // "N" (NULL for switches)
    const char *help;
    const char **value;  // receives the value (or "1" for a switch)
    int is_switch;
} l3d_cli_flag_t;

// Parses argv[first..argc) against flags. On an unknown flag, a missing value or a stray
// positional argument, prints a one-line error (with the nearest flag) and returns -1.
int l3d_cli_parse(const char *cmd, int argc, char **argv, int first, const l3d_cli_flag_t *flags,
                  int nflags);
void l3d_cli_usage(FILE *f, const char *cmd, const char *synopsis, const l3d_cli_flag_t *flags,
                   int nflags);
// Strict integer/float parsing: on failure prints "l3d CMD: FLAG: 'V' is not ..." and
// returns -1.
int l3d_cli_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi,
                long long *out);
int l3d_cli_float(const char *cmd, const char *flag, const char *v, double lo, double hi,
                  double *out);
// Flushes and closes stdout at exit: a failed write turns exit code rc 0 into 1 (with the
// reason on stderr), so `l3d ... > /dev/full` never exits 0. Returns the exit code.
int l3d_cli_finish_stdout(int rc);
// Prints "l3d CMD: <detail or strerror>" and returns the exit code for `st`.
int l3d_cli_fail(const char *cmd, l3d_ctx_t *ctx, l3d_status st);
// The exit code for `st`: 2 for bad input (config, format, not found, invalid, unsupported),
// 1 for any other failure, 0 for L3D_OK.
int l3d_cli_exit_code(l3d_status st);
size_t l3d_cli_edit_distance(const char *a, const char *b);

int l3d_cmd_train(int argc, char **argv);
int l3d_cmd_generate(int argc, char **argv);
int l3d_cmd_forward(int argc, char **argv);
int l3d_cmd_tokenize(int argc, char **argv);  // cli/tokenize.c
// --chat FILE: [{"role": "...", "content": "..."}, ...] -> messages pointing into *root_p
// (json_decref it; free() *msgs_p). Anything else is L3D_ERR_CONFIG naming the file.
struct json_t;
l3d_status l3d_cli_read_chat(l3d_ctx_t *ctx, const char *path, struct json_t **root_p,
                             l3d_chat_message_t **msgs_p, size_t *n_p);
// cli/gen_text.c: what a checkpoint says about generating text (l3d generate, l3d serve).
l3d_status l3d_cli_open_tokenizer(l3d_ctx_t *ctx, const char *ckpt, const char *tokenizer,
                                  int vocab, l3d_tokenizer_t **tok_p);
typedef struct l3d_cli_stops {
    int n;
    int32_t ids[2 * L3D_MAX_EOS + L3D_TOKENIZER_MAX_STOP];
} l3d_cli_stops_t;
l3d_status l3d_cli_gen_defaults(l3d_ctx_t *ctx, const char *ckpt, const l3d_model_config_t *cfg,
                                const l3d_tokenizer_t *tok, l3d_generation_config_t *gc,
                                l3d_cli_stops_t *stops);
int l3d_cli_stops_has(const l3d_cli_stops_t *s, int32_t id);
// --dtype of generate and serve: the dtype the weights are kept in (l3d_infer_open's
// `weights`: -1 auto, the checkpoint's 16-bit BF16 or else float32) and, for bfloat16,
// *round_p = 1: products in bfloat16 (l3d_infer_round_products). Nonzero (and a message
// naming cmd and the value) when it is none of auto, float32, bfloat16, float16 (f32, bf16,
// f16). NULL: auto.
#define L3D_CLI_DTYPE_HELP                                                                   \
    "auto: a BF16 checkpoint's weights kept in bfloat16 and read exactly (the float32 "        \
    "logits); bfloat16: bfloat16 weights and products, the activations rounded (torch's and " \
    "llama.cpp's bfloat16; AVX512-BF16 and AMX where the CPU has them); float32; float16 "    \
    "(weights; default auto)"
int l3d_cli_weights_dtype(const char *cmd, const char *v, int *out, int *round_p);
int l3d_cmd_serve(int argc, char **argv);   // cli/serve.c
int l3d_cmd_launch(int argc, char **argv);  // cli/launch.c
int l3d_cmd_bench(int argc, char **argv);   // cli/bench_comm.c
int l3d_cmd_plan(int argc, char **argv);    // cli/plan.c
// `l3d bench comm` from argv[first] on; also the whole of the standalone bench_comm.
int l3d_bench_comm_main(int argc, char **argv, int first);
// Started as one rank of a job (l3d launch, torchrun, mpirun, srun, PMI, L3D_RANK)? The
// rank variable decides; a missing size then fails in l3d_comm_create_env naming it. An
// allocation shell that sets only sizes (SLURM_NTASKS) is a single run.
int l3d_cli_launched(void);

// A context for a command (l3d_ctx_create's defaults); `progress` nonzero and stderr a
// terminal: with the progress renderer of cli/progress.c, which draws an operation's line
// only once it has taken a second.
l3d_status l3d_cli_ctx_create(int progress, l3d_ctx_t **ctx_p);
void l3d_cli_progress_render(const char *what, uint64_t done, uint64_t total, int last,
                             void *user);

// Metrics: one JSON object per step, and an SVG loss curve written beside the JSONL file.
// A side channel: after open, a failed write of either file is one warning on stderr naming
// the file; the JSONL then ends in a whole line and the run goes on.
typedef struct l3d_metrics l3d_metrics_t;
int l3d_metrics_open(const char *path, int append, l3d_metrics_t **m_p);  // 0 or -errno
void l3d_metrics_write(l3d_metrics_t *m, const l3d_step_stats_t *s);
// Writes <path without .jsonl>.svg from every step recorded so far; NULL is fine.
void l3d_metrics_close(l3d_metrics_t *m);

#endif
