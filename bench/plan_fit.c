// plan_fit: the fit of l3d plan's runtime constants (l3d_plan_runtime_default) on the
// published A100 runs (l3d_plan_published's calibration rows): a grid over the GEMM
// efficiency and the elementwise traffic factor, refined three times, scored by the larger
// of mean |error| / 5% and max |error| / 10% (the goals); then every row at the best point.
// The flash-attention efficiency does not enter (the calibration runs stored their scores).
//
//   build/bench/bench_plan_fit        the fit: its passes, the best point and its rows
//   build/bench/bench_plan_fit E M    the rows at gemm_eff E, mem_traffic M
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "llama3d/llama3d.h"
#include "llama3d/plan.h"

typedef struct {
    double score, mean, max, hmean, hmax;
    l3d_plan_runtime_t rt;
} point_t;

static int eval(l3d_ctx_t *ctx, const l3d_plan_runtime_t *rt, point_t *p) {
    l3d_plan_published_t rows[32];
    int n = 0;
    if (l3d_plan_published(ctx, rt, rows, 32, &n, &p->mean, &p->max, &p->hmean, &p->hmax) < 0)
        return -1;
    p->score = fmax(p->mean / 0.05, p->max / 0.10);
    p->rt = *rt;
    return 0;
}

static void show(const char *what, const point_t *p) {
    printf("%-9s gemm_eff %.3f mem_traffic %.2f: calibration mean %.2f%% max %.2f%% (score "
           "%.3f); held out mean %.1f%% max %.1f%%\n",
           what, p->rt.gemm_eff, p->rt.mem_traffic, 100 * p->mean, 100 * p->max,
           p->score, 100 * p->hmean, 100 * p->hmax);
}

int main(int argc, char **argv) {
    l3d_ctx_t *ctx = NULL;
    if (l3d_ctx_create(NULL, &ctx) < 0) return 1;
    l3d_plan_runtime_t rt;
    l3d_plan_runtime_default(&rt);
    point_t cur, best = {.score = 1e30};
    if (eval(ctx, &rt, &cur) < 0) {
        fprintf(stderr, "plan_fit: %s\n", l3d_ctx_last_error(ctx));
        return 1;
    }
    show("default", &cur);
    // plan_fit E M: only show the rows at that point
    if (argc == 3) {
        rt.gemm_eff = atof(argv[1]), rt.mem_traffic = atof(argv[2]);
        eval(ctx, &rt, &best);
        show("given", &best);
        goto rows;
    }
    // coarse grid, then finer ones around the best point
    double e0 = 0.40, e1 = 1.00, m0 = 0, m1 = 6;
    for (int pass = 0; pass < 3; pass++) {
        int steps = 24;
        point_t pb = best;
        for (int i = 0; i <= steps; i++)
            for (int k = 0; k <= steps; k++) {
                rt.gemm_eff = e0 + (e1 - e0) * i / steps;
                rt.mem_traffic = m0 + (m1 - m0) * k / steps;
                point_t p;
                if (eval(ctx, &rt, &p) == 0 && p.score < pb.score) pb = p;
            }
        best = pb;
        show(pass == 2 ? "best" : "pass", &best);
        double de = (e1 - e0) / steps * 2, dm = (m1 - m0) / steps * 2;
        e0 = fmax(0.3, best.rt.gemm_eff - de), e1 = fmin(1.0, best.rt.gemm_eff + de);
        m0 = fmax(0, best.rt.mem_traffic - dm), m1 = best.rt.mem_traffic + dm;
    }
rows:;
    l3d_plan_published_t rows[32];
    int n = 0;
    if (l3d_plan_published(ctx, &best.rt, rows, 32, &n, NULL, NULL, NULL, NULL) == 0)
        for (int i = 0; i < n; i++)
            printf("  %-20s %-18s %8.3f s published, %8.3f s planned, %+6.1f%%\n",
                   rows[i].source, rows[i].name, rows[i].published_s, rows[i].predicted_s,
                   100 * rows[i].error);
    l3d_ctx_destroy(ctx);
    return 0;
}
