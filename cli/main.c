// l3d: train and serve Llama 3 models. Dispatches to the commands in cli/*.c.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/l3d_core.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: l3d COMMAND [FLAGS]\n\n"
            "commands:\n"
            "  train      train a Llama 3 model (no flags: llama3-tiny on the default text)\n"
            "  generate   generate text from a checkpoint with a KV cache\n"
            "  serve      an OpenAI-compatible HTTP server with continuous batching\n"
            "  forward    write the logits of a token sequence (for cross-checks)\n"
            "  tokenize   text to token ids and back with a Llama 3 tokenizer, chat formatting\n"
            "  launch     start N ranks of a program on this machine (l3d launch -n N -- ...)\n"
            "  bench      benchmarks (l3d bench comm: collectives, nccl-tests style)\n"
            "  plan       the fastest layout for a model on a cluster (l3d plan --help)\n\n"
            "  l3d COMMAND --help    flags of a command\n"
            "  l3d --help-env        the L3D_* environment variables\n"
            "  l3d --version\n");
}

static void help_env(void) {
    size_t n = 0;
    const l3d_setting_row_t *rows = l3d_settings_table(&n);
    printf("environment variables (read once at start-up):\n");
    for (size_t i = 0; i < n; i++)
        printf("  %-18s default '%s'\n      %s\n", rows[i].name, rows[i].default_value,
               rows[i].help);
}

// One line: the nearest command, or, for a name that asks for what another command does
// (llama.cpp's and ollama's `chat`), that command with its flags.
static void unknown_command(const char *cmd) {
    static const struct {
        const char *name, *hint;
    } known[] = {
        {"train", "did you mean 'l3d train'?"}, {"generate", "did you mean 'l3d generate'?"},
        {"forward", "did you mean 'l3d forward'?"}, {"tokenize", "did you mean 'l3d tokenize'?"},
        {"launch", "did you mean 'l3d launch'?"}, {"bench", "did you mean 'l3d bench'?"},
        {"plan", "did you mean 'l3d plan'?"}, {"serve", "did you mean 'l3d serve'?"},
        {"chat", "to chat with a model: l3d generate --checkpoint DIR --chat M.json"},
    };
    if (cmd[0] == '-') {  // a command's flag first: `l3d --steps 5` for `l3d train --steps 5`
        fprintf(stderr, "l3d: unknown command '%s' (flags follow a command, e.g. 'l3d train "
                "%s'; l3d --help)\n", cmd, cmd);
        return;
    }
    const char *best = NULL;
    size_t bestd = 99;
    for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++) {
        size_t d = l3d_cli_edit_distance(cmd, known[k].name);
        if (d < bestd) {
            bestd = d;
            best = known[k].hint;
        }
    }
    // At most 2 edits, and at most half the name: "trian" is train, "caht" chat, "xy" nothing.
    if (best && bestd <= 2 && 2 * bestd <= strlen(cmd))
        fprintf(stderr, "l3d: unknown command '%s' (%s)\n", cmd, best);
    else
        fprintf(stderr, "l3d: unknown command '%s' (commands: train, generate, serve, "
                "forward, tokenize, launch, bench, plan; l3d --help)\n", cmd);
}

static int dispatch(int argc, char **argv) {
    if (argc < 2) return l3d_cmd_train(argc, argv);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return l3d_cmd_train(argc, argv);
    if (!strcmp(cmd, "generate")) return l3d_cmd_generate(argc, argv);
    if (!strcmp(cmd, "forward")) return l3d_cmd_forward(argc, argv);
    if (!strcmp(cmd, "tokenize")) return l3d_cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "launch")) return l3d_cmd_launch(argc, argv);
    if (!strcmp(cmd, "bench")) return l3d_cmd_bench(argc, argv);
    if (!strcmp(cmd, "plan")) return l3d_cmd_plan(argc, argv);
    if (!strcmp(cmd, "serve")) {
#ifdef L3D_WITH_SERVE
        return l3d_cmd_serve(argc, argv);
#else
        fprintf(stderr, "l3d serve: this build has no HTTP server: install libmicrohttpd-dev "
                "(apt) and build again\n");
        return L3D_EXIT_USAGE;
#endif
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return L3D_EXIT_OK;
    }
    if (!strcmp(cmd, "--help-env")) {
        help_env();
        return L3D_EXIT_OK;
    }
    if (!strcmp(cmd, "--version")) {
        printf("llama3d %d.%d.%d\n", LLAMA3D_VERSION_MAJOR, LLAMA3D_VERSION_MINOR,
               LLAMA3D_VERSION_PATCH);
        printf("cpu device: OpenBLAS %s kernels\n", l3d_cpu_blas_core());
        return L3D_EXIT_OK;
    }
    unknown_command(cmd);
    return L3D_EXIT_USAGE;
}

// OpenBLAS chose its kernels when it was loaded, before main. When it fell back to a set older
// than this CPU runs (a release that does not know the CPU: Debian 12's on Sapphire and Emerald
// Rapids runs SSE3 kernels, sgemm 6x slower), start again with OPENBLAS_CORETYPE naming the
// right set: same pid, same arguments. Once it is set l3d_cpu_blas_better_core says NULL, so
// this runs at most once; a failed exec carries on with the slow kernels (the device warns).
static void restart_for_blas(char **argv) {
    const char *better = l3d_cpu_blas_better_core();
    if (!better || setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");
}

int main(int argc, char **argv) {
    restart_for_blas(argv);
    return l3d_cli_finish_stdout(dispatch(argc, argv));
}
