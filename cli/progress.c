// l3d's progress renderer: a line on stderr, redrawn in place with \r, for any operation the
// library reports (ctx.h: l3d_progress_fn) once it has run for L3D_PROGRESS_AFTER seconds (1),
// and only when stderr is a terminal: logs and pipes get the step lines and nothing else.
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

// One renderer per process (threaded ranks install it on rank 0's ctx only).
static struct {
    pthread_mutex_t mu;
    char what[256];
    double t0;
    double show_after_s;  // L3D_PROGRESS_AFTER, set when the renderer is installed
    int drawn;  // a line of this operation is on the screen, without its newline yet
} g_bar = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void human(char *out, size_t cap, double b) {
    if (b >= 1024.0 * 1024 * 1024) snprintf(out, cap, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else snprintf(out, cap, "%.1f MiB", b / (1024.0 * 1024));
}

void l3d_cli_progress_render(const char *what, uint64_t done, uint64_t total, int last,
                             void *user) {
    (void)user;
    double now = l3d_time_now();
    pthread_mutex_lock(&g_bar.mu);
    if ((done == 0 && !last) || strcmp(what, g_bar.what)) {  // a new operation
        if (g_bar.drawn) fputc('\n', stderr);
        snprintf(g_bar.what, sizeof(g_bar.what), "%s", what);
        g_bar.t0 = now;
        g_bar.drawn = 0;
    }
    double dt = now - g_bar.t0;
    if (dt >= g_bar.show_after_s) {
        char d[32], t[32], r[32];
        human(d, sizeof(d), (double)done);
        human(r, sizeof(r), (double)done / dt);
        if (total) {
            human(t, sizeof(t), (double)total);
            fprintf(stderr, "\r\033[K%s: %s / %s (%.0f%%), %s/s", what, d, t,
                    100.0 * (double)done / (double)total, r);
        } else {
            fprintf(stderr, "\r\033[K%s: %s, %s/s", what, d, r);
        }
        g_bar.drawn = 1;
    }
    if (last) {
        if (g_bar.drawn) fprintf(stderr, "%s\n", done < total ? " (stopped)" : "");
        g_bar.drawn = 0;
        g_bar.what[0] = 0;
    }
    fflush(stderr);
    pthread_mutex_unlock(&g_bar.mu);
}

l3d_status l3d_cli_ctx_create(int progress, l3d_ctx_t **ctx_p) {
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    if (progress && isatty(STDERR_FILENO)) p.progress_fn = l3d_cli_progress_render;
    l3d_status st = l3d_ctx_create(&p, ctx_p);
    if (st < 0) return st;
    if (p.progress_fn) {
        pthread_mutex_lock(&g_bar.mu);
        g_bar.show_after_s = l3d_ctx_settings(*ctx_p)->progress_after_s;
        pthread_mutex_unlock(&g_bar.mu);
    }
    return L3D_OK;
}
