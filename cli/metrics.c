// Per-step metrics: JSON lines, and an SVG chart beside them at the end of the run: the
// training loss, the eval loss (when the run evaluates) and the learning rate on a second
// axis, with ticks and values on every axis. Metrics are a side channel: a write that fails
// (a full disk) is one warning naming the file, the file is left ending in a whole line, and
// training and checkpoints go on.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "platform/platform.h"

// One series of (step, value) points.
typedef struct series {
    int n, cap;
    int *step;
    double *v;
} series_t;

struct l3d_metrics {
    int fd;  // the JSONL; -1 once a write failed
    char path[1100];
    char svg_path[1100];
    series_t loss, eval, lr;
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

// Out of memory: the chart misses the point; the JSONL is complete.
static void series_add(series_t *s, int step, double v) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        int *st = realloc(s->step, (size_t)cap * sizeof(int));
        if (st) s->step = st;
        double *vv = realloc(s->v, (size_t)cap * sizeof(double));
        if (vv) s->v = vv;
        if (!st || !vv) return;
        s->cap = cap;
    }
    s->step[s->n] = step;
    s->v[s->n] = v;
    s->n++;
}

static void series_free(series_t *s) {
    free(s->step);
    free(s->v);
}

void l3d_metrics_write(l3d_metrics_t *m, const l3d_step_stats_t *s) {
    char eval[64] = "";
    // Only the steps that evaluated carry "eval_loss" (JSON has no NaN).
    if (!isnan(s->eval_loss))
        snprintf(eval, sizeof(eval), "\"eval_loss\": %.17g, ", s->eval_loss);
    if (m->fd >= 0) {
        // An fp16 step that overflowed has an infinite gradient norm (and may have a NaN
        // loss): JSON has neither, so those are null.
        char loss[32] = "null", gnorm[32] = "null";
        if (isfinite(s->loss)) snprintf(loss, sizeof(loss), "%.17g", s->loss);
        if (isfinite(s->grad_norm)) snprintf(gnorm, sizeof(gnorm), "%.17g", s->grad_norm);
        char line[1280];
        int n = snprintf(
            line, sizeof(line),
            "{\"step\": %d, \"loss\": %s, %s\"lr\": %.9g, \"grad_norm\": %s, "
            "\"loss_scale\": %.17g, \"skipped\": %s, "
            "\"tokens_per_s\": %.6g, \"mfu\": %.6g, \"peak_flops\": %.6g, \"step_time_s\": %.6g, "
            "\"mem_peak_bytes\": %zu, \"comm_calls\": {\"tp\": %llu, \"dp\": %llu, \"pp\": %llu}, "
            "\"comm_bytes\": {\"tp\": %llu, \"dp\": %llu, \"pp\": %llu}}\n",
            s->step, loss, eval, (double)s->lr, gnorm, s->loss_scale,
            s->skipped ? "true" : "false", s->tokens_per_s, s->mfu,
            s->peak_flops, s->step_time_s, s->mem_peak, (unsigned long long)s->comm_calls[0],
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
    if (isfinite(s->loss)) series_add(&m->loss, s->step, s->loss);
    if (isfinite(s->eval_loss)) series_add(&m->eval, s->step, s->eval_loss);
    if (isfinite(s->lr)) series_add(&m->lr, s->step, (double)s->lr);
}

// ---- the chart ---------------------------------------------------------------------------
// An axis: [lo, hi] widened to multiples of a 1-2-5 tick step, about `want` ticks.
typedef struct axis {
    double lo, hi, step;
    int nticks;
} axis_t;

static axis_t nice_axis(double lo, double hi, int want, int integer) {
    axis_t a;
    if (!(hi > lo)) {  // one value (or none): a unit-wide range around it
        double mid = isfinite(lo) ? lo : 0.0, half = fabs(mid) > 0 ? fabs(mid) * 0.1 : 0.5;
        lo = mid - half;
        hi = mid + half;
    }
    double raw = (hi - lo) / want, mag = pow(10.0, floor(log10(raw))), f = raw / mag;
    a.step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    if (integer && a.step < 1) a.step = 1;
    a.lo = floor(lo / a.step + 1e-9) * a.step;
    a.hi = ceil(hi / a.step - 1e-9) * a.step;
    if (!(a.hi > a.lo)) a.hi = a.lo + a.step;
    a.nticks = (int)floor((a.hi - a.lo) / a.step + 0.5) + 1;
    return a;
}

// The tick value k of the axis, written with as many decimals as the step needs.
static void tick_label(const axis_t *a, int k, char *buf, size_t cap) {
    double v = a->lo + k * a->step;
    if (fabs(v) < a->step * 1e-6) {
        snprintf(buf, cap, "0");
        return;
    }
    int dec = (int)ceil(-log10(a->step) - 1e-9);
    if (dec < 0) dec = 0;
    if (a->step < 1e-3 && v != 0.0) snprintf(buf, cap, "%.1e", v);  // learning rates
    else snprintf(buf, cap, "%.*f", dec, v);
}

static void range(const series_t *s, double *lo, double *hi) {
    for (int i = 0; i < s->n; i++) {
        if (s->v[i] < *lo) *lo = s->v[i];
        if (s->v[i] > *hi) *hi = s->v[i];
    }
}

enum { W = 760, H = 420, ML = 72, MR = 84, MT = 44, MB = 56 };

static double px(const axis_t *x, double step) {
    return ML + (W - ML - MR) * (step - x->lo) / (x->hi - x->lo);
}
static double py(const axis_t *y, double v) {
    return (H - MB) - (H - MB - MT) * (v - y->lo) / (y->hi - y->lo);
}

static void polyline(FILE *f, const series_t *s, const axis_t *x, const axis_t *y,
                     const char *style) {
    if (s->n == 0) return;
    fprintf(f, "<polyline fill=\"none\" %s points=\"", style);
    for (int i = 0; i < s->n; i++) fprintf(f, "%.1f,%.1f ", px(x, s->step[i]), py(y, s->v[i]));
    fprintf(f, "\"/>\n");
}

// Draws the chart into memory, then writes it in one piece where svg_path points.
static int write_svg(const l3d_metrics_t *m) {
    char *buf = NULL;
    size_t buf_len = 0;
    FILE *f = open_memstream(&buf, &buf_len);
    if (!f) return -errno;
    const series_t *loss = &m->loss, *eval = &m->eval, *lr = &m->lr;
    double s0 = INFINITY, s1 = -INFINITY;
    const series_t *all[3] = {loss, eval, lr};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < all[k]->n; i++) {
            if (all[k]->step[i] < s0) s0 = all[k]->step[i];
            if (all[k]->step[i] > s1) s1 = all[k]->step[i];
        }
    if (!isfinite(s0)) s0 = s1 = 0;
    double llo = INFINITY, lhi = -INFINITY, rlo = 0.0, rhi = -INFINITY;
    range(loss, &llo, &lhi);
    range(eval, &llo, &lhi);
    range(lr, &rlo, &rhi);  // the lr axis starts at 0: schedules warm up from and decay to it
    if (!isfinite(llo)) llo = lhi = 0.0;
    if (!isfinite(rhi)) rhi = 0.0;
    axis_t x = nice_axis(s0, s1, 8, 1), y = nice_axis(llo, lhi, 6, 0),
           r = nice_axis(rlo, rhi, 6, 0);
    const char *font = "font-family=\"sans-serif\" font-size=\"12\"";
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\">\n", W, H, W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    // grid and ticks: steps below, loss on the left, learning rate on the right
    fprintf(f, "<g id=\"x-axis\" %s text-anchor=\"middle\">\n", font);
    for (int k = 0; k < x.nticks; k++) {
        char lab[32];
        tick_label(&x, k, lab, sizeof(lab));
        double xx = px(&x, x.lo + k * x.step);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e4e4e4\"/>"
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>"
                "<text x=\"%.1f\" y=\"%d\">%s</text>\n",
                xx, MT, xx, H - MB, xx, H - MB, xx, H - MB + 5, xx, H - MB + 19, lab);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"13\">step</text>\n</g>\n",
            ML + (W - ML - MR) / 2, H - 14);
    fprintf(f, "<g id=\"loss-axis\" %s text-anchor=\"end\">\n", font);
    for (int k = 0; k < y.nticks; k++) {
        char lab[32];
        tick_label(&y, k, lab, sizeof(lab));
        double yy = py(&y, y.lo + k * y.step);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"black\"/>"
                "<text x=\"%d\" y=\"%.1f\">%s</text>\n",
                ML, yy, W - MR, yy, ML - 5, yy, ML, yy, ML - 8, yy + 4, lab);
    }
    fprintf(f, "<text transform=\"translate(16,%d) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"13\">loss (cross-entropy)</text>\n</g>\n", MT + (H - MT - MB) / 2);
    if (lr->n) {
        fprintf(f, "<g id=\"lr-axis\" %s text-anchor=\"start\" fill=\"#d62728\">\n", font);
        for (int k = 0; k < r.nticks; k++) {
            char lab[32];
            tick_label(&r, k, lab, sizeof(lab));
            double yy = py(&r, r.lo + k * r.step);
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#d62728\"/>"
                    "<text x=\"%d\" y=\"%.1f\">%s</text>\n",
                    W - MR, yy, W - MR + 5, yy, W - MR + 8, yy + 4, lab);
        }
        fprintf(f, "<text transform=\"translate(%d,%d) rotate(90)\" text-anchor=\"middle\" "
                "font-size=\"13\">learning rate</text>\n</g>\n", W - 12, MT + (H - MT - MB) / 2);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
            "stroke=\"black\"/>\n", ML, MT, W - ML - MR, H - MT - MB);
    // the curves: lr under the losses
    fprintf(f, "<g id=\"lr\">\n");
    polyline(f, lr, &x, &r, "stroke=\"#d62728\" stroke-width=\"1.2\" stroke-dasharray=\"5,3\"");
    fprintf(f, "</g>\n<g id=\"train-loss\">\n");
    polyline(f, loss, &x, &y, "stroke=\"#1f77b4\" stroke-width=\"1.5\"");
    fprintf(f, "</g>\n");
    if (eval->n) {
        fprintf(f, "<g id=\"eval-loss\" fill=\"#2ca02c\">\n");
        polyline(f, eval, &x, &y, "stroke=\"#2ca02c\" stroke-width=\"2\"");
        for (int i = 0; i < eval->n; i++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", px(&x, eval->step[i]),
                    py(&y, eval->v[i]));
        fprintf(f, "</g>\n");
    }
    // the legend, above the plot
    fprintf(f, "<g id=\"legend\" %s>\n", font);
    int lx = ML;
    fprintf(f, "<line x1=\"%d\" y1=\"20\" x2=\"%d\" y2=\"20\" stroke=\"#1f77b4\" "
            "stroke-width=\"2\"/><text x=\"%d\" y=\"24\">training loss</text>\n",
            lx, lx + 24, lx + 30);
    lx += 140;
    if (eval->n) {
        fprintf(f, "<line x1=\"%d\" y1=\"20\" x2=\"%d\" y2=\"20\" stroke=\"#2ca02c\" "
                "stroke-width=\"2\"/><circle cx=\"%d\" cy=\"20\" r=\"3\" fill=\"#2ca02c\"/>"
                "<text x=\"%d\" y=\"24\">eval loss</text>\n", lx, lx + 24, lx + 12, lx + 30);
        lx += 120;
    }
    if (lr->n)
        fprintf(f, "<line x1=\"%d\" y1=\"20\" x2=\"%d\" y2=\"20\" stroke=\"#d62728\" "
                "stroke-dasharray=\"5,3\"/><text x=\"%d\" y=\"24\">learning rate (right "
                "axis)</text>\n", lx, lx + 24, lx + 30);
    fprintf(f, "</g>\n</svg>\n");
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
    series_free(&m->loss);
    series_free(&m->eval);
    series_free(&m->lr);
    free(m);
}
