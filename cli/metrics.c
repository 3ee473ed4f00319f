// Per-step metrics: JSON lines, and an SVG loss curve beside them at the end of the run.
// Metrics are a side channel: a write that fails (a full disk) is one warning naming the file,
// the file is left ending in a whole line, and training and checkpoints go on.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "platform/platform.h"

struct l3d_metrics {
    int fd;  // the JSONL; -1 once a write failed
    char path[1100];
    char svg_path[1100];
    int n, cap;
    int *step;
    double *loss;
};

// The one warning a failed metrics file gets.
static void warn_failed(const char *path, int err) {
    fprintf(stderr, "l3d train: warning: cannot write %s: %s; metrics stop there, training "
                    "goes on\n", path, strerror(-err));
}

int l3d_metrics_open(const char *path, int append, l3d_metrics_t **m_p) {
    l3d_metrics_t *m = calloc(1, sizeof(*m));
    if (!m) return -ENOMEM;
    m->fd = l3d_outfile_open(path, append);
    if (m->fd < 0) {
        int e = m->fd;
        free(m);
        return e;
    }
    snprintf(m->path, sizeof(m->path), "%s", path);
    size_t len = strlen(path);
    if (len > 6 && !strcmp(path + len - 6, ".jsonl"))
        snprintf(m->svg_path, sizeof(m->svg_path), "%.*s.svg", (int)(len - 6), path);
    else
        snprintf(m->svg_path, sizeof(m->svg_path), "%s.svg", path);
    *m_p = m;
    return 0;
}

void l3d_metrics_write(l3d_metrics_t *m, const l3d_step_stats_t *s) {
    if (m->fd >= 0) {
        char line[1024];
        int n = snprintf(
            line, sizeof(line),
            "{\"step\": %d, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.17g, "
            "\"tokens_per_s\": %.6g, \"mfu\": %.6g, \"step_time_s\": %.6g, "
            "\"mem_peak_bytes\": %zu, \"comm_calls\": {\"tp\": %llu, \"dp\": %llu, \"pp\": %llu}, "
            "\"comm_bytes\": {\"tp\": %llu, \"dp\": %llu, \"pp\": %llu}}\n",
            s->step, s->loss, (double)s->lr, s->grad_norm, s->tokens_per_s, s->mfu,
            s->step_time_s, s->mem_peak, (unsigned long long)s->comm_calls[0],
            (unsigned long long)s->comm_calls[1], (unsigned long long)s->comm_calls[2],
            (unsigned long long)s->comm_bytes[0], (unsigned long long)s->comm_bytes[1],
            (unsigned long long)s->comm_bytes[2]);
        // One write per line: a failed one is cut off again, so the file ends in a whole line.
        int e = n > 0 && (size_t)n < sizeof(line) ? l3d_outfile_append(m->fd, line, (size_t)n)
                                                   : -EOVERFLOW;
        if (e < 0) {
            warn_failed(m->path, e);
            l3d_outfile_close(m->fd);
            m->fd = -1;
        }
    }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 256;
        int *st = realloc(m->step, (size_t)cap * sizeof(int));
        if (st) m->step = st;
        double *lo = realloc(m->loss, (size_t)cap * sizeof(double));
        if (lo) m->loss = lo;
        if (!st || !lo) return;  // the curve misses points; the JSONL is complete
        m->cap = cap;
    }
    m->step[m->n] = s->step;
    m->loss[m->n] = s->loss;
    m->n++;
}

// Draws the curve into memory, then writes it in one piece where svg_path points.
static int write_svg(const l3d_metrics_t *m) {
    char *buf = NULL;
    size_t buf_len = 0;
    FILE *f = open_memstream(&buf, &buf_len);
    if (!f) return -errno;
    const double W = 640, H = 360, L = 60, R = 20, T = 20, B = 40;
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < m->n; i++) {
        if (m->loss[i] < lo) lo = m->loss[i];
        if (m->loss[i] > hi) hi = m->loss[i];
    }
    if (!(hi > lo)) {
        lo -= 0.5;
        hi += 0.5;
    }
    int s0 = m->n ? m->step[0] : 0, s1 = m->n ? m->step[m->n - 1] : 1;
    if (s1 <= s0) s1 = s0 + 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", L, H - B,
            W - R, H - B);
    fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", L, T, L,
            H - B);
    fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\">%.3f</text>\n", 4.0, T + 4, hi);
    fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\">%.3f</text>\n", 4.0, H - B, lo);
    fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\">step %d</text>\n", L, H - 10, s0);
    fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\" text-anchor=\"end\">step %d</text>\n",
            W - R, H - 10, s1);
    fprintf(f, "<text x=\"%g\" y=\"%g\" font-size=\"12\" text-anchor=\"middle\">training loss"
            "</text>\n", W / 2, H - 10);
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
    for (int i = 0; i < m->n; i++) {
        double x = L + (W - L - R) * (m->step[i] - s0) / (double)(s1 - s0);
        double y = (H - B) - (H - B - T) * (m->loss[i] - lo) / (hi - lo);
        fprintf(f, "%.1f,%.1f ", x, y);
    }
    fprintf(f, "\"/>\n</svg>\n");
    if (fclose(f)) {
        free(buf);
        return -ENOMEM;
    }
    int fd = l3d_outfile_open(m->svg_path, 0);
    int e = fd < 0 ? fd : l3d_outfile_append(fd, buf, buf_len);
    int c = l3d_outfile_close(fd);
    free(buf);
    return e < 0 ? e : c;
}

void l3d_metrics_close(l3d_metrics_t *m) {
    if (!m) return;
    int e = write_svg(m);
    if (e < 0) warn_failed(m->svg_path, e);
    if (m->fd >= 0 && (e = l3d_outfile_close(m->fd)) < 0) warn_failed(m->path, e);
    free(m->step);
    free(m->loss);
    free(m);
}
