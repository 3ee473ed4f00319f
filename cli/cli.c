// Flag parsing and error reporting shared by every l3d command.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

size_t l3d_cli_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return 99;
    size_t prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(prev));
    }
    return prev[lb];
}

int l3d_cli_parse(const char *cmd, int argc, char **argv, int first, const l3d_cli_flag_t *flags,
                  int nflags) {
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        const l3d_cli_flag_t *f = NULL;
        for (int k = 0; k < nflags; k++)
            if (strlen(flags[k].name) == nlen && !strncmp(flags[k].name, arg, nlen)) f = &flags[k];
        if (!f) {
            if (strncmp(arg, "--", 2)) {
                fprintf(stderr, "l3d %s: unexpected argument '%s'\n", cmd, arg);
                return -1;
            }
            const char *best = NULL;
            size_t bestd = 99;
            for (int k = 0; k < nflags; k++) {
                char name[64];
                snprintf(name, sizeof(name), "%.*s", (int)nlen, arg);
                size_t d = l3d_cli_edit_distance(name, flags[k].name);
                if (d < bestd) {
                    bestd = d;
                    best = flags[k].name;
                }
            }
            if (best && bestd <= 3)
                fprintf(stderr, "l3d %s: unknown flag '%.*s' (did you mean '%s'?)\n", cmd,
                        (int)nlen, arg, best);
            else
                fprintf(stderr, "l3d %s: unknown flag '%.*s' (see l3d %s --help)\n", cmd,
                        (int)nlen, arg, cmd);
            return -1;
        }
        if (f->is_switch) {
            if (eq) {
                fprintf(stderr, "l3d %s: %s takes no value\n", cmd, f->name);
                return -1;
            }
            *f->value = "1";
        } else if (eq) {
            *f->value = eq + 1;
        } else {
            if (i + 1 >= argc) {
                fprintf(stderr, "l3d %s: %s needs a value (%s)\n", cmd, f->name, f->meta);
                return -1;
            }
            *f->value = argv[++i];
        }
    }
    return 0;
}

void l3d_cli_usage(FILE *out, const char *cmd, const char *synopsis, const l3d_cli_flag_t *flags,
                   int nflags) {
    fprintf(out, "usage: l3d %s %s\n\n", cmd, synopsis);
    for (int k = 0; k < nflags; k++) {
        char left[64];
        snprintf(left, sizeof(left), "%s%s%s", flags[k].name, flags[k].meta ? " " : "",
                 flags[k].meta ? flags[k].meta : "");
        fprintf(out, "  %-26s %s\n", left, flags[k].help);
    }
}

int l3d_cli_int(const char *cmd, const char *flag, const char *v, long long lo, long long hi,
                long long *out) {
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "l3d %s: %s: '%s' is not an integer in [%lld, %lld]\n", cmd, flag, v, lo,
                hi);
        return -1;
    }
    *out = x;
    return 0;
}

int l3d_cli_float(const char *cmd, const char *flag, const char *v, double lo, double hi,
                  double *out) {
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "l3d %s: %s: '%s' is not a number in [%g, %g]\n", cmd, flag, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int l3d_cli_fail(const char *cmd, l3d_ctx_t *ctx, l3d_status st) {
    const char *detail = ctx ? l3d_ctx_last_error(ctx) : "";
    // Without a context the failure is l3d_ctx_create's, and a bad L3D_* value is the only
    // configuration error it has: it printed the line naming the variable already.
    if (ctx || st != L3D_ERR_CONFIG)
        fprintf(stderr, "l3d %s: %s\n", cmd, detail[0] ? detail : l3d_strerror(st));
    return l3d_cli_exit_code(st);
}

int l3d_cli_exit_code(l3d_status st) {
    switch (st) {
    case L3D_OK: return L3D_EXIT_OK;
    case L3D_ERR_CONFIG:
    case L3D_ERR_FORMAT:
    case L3D_ERR_NOT_FOUND:
    case L3D_ERR_INVALID_ARG:
    case L3D_ERR_UNSUPPORTED: return L3D_EXIT_USAGE;
    default: return L3D_EXIT_FAIL;
    }
}

int l3d_cli_launched(void) {
    static const char *const vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                                       "PMI_RANK", "L3D_RANK"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

// Every command's stdout (progress lines, tables) reaches its destination or the run fails:
// `l3d ... > /dev/full` must not exit 0. Flushing and closing here catches what buffered
// printf calls could not report.
int l3d_cli_finish_stdout(int rc) {
    int failed_before = ferror(stdout), e = 0;
    if (fflush(stdout) != 0) e = errno;
    // A closed stdout (`l3d ... >&-`) that nothing was written to is fine.
    if (fclose(stdout) != 0 && !e && errno != EBADF) e = errno;
    if (!e && !failed_before) return rc;
    if (e) fprintf(stderr, "l3d: writing standard output: %s\n", strerror(e));
    else fprintf(stderr, "l3d: writing standard output failed\n");
    return rc == L3D_EXIT_OK ? L3D_EXIT_FAIL : rc;
}
