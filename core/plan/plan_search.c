// l3d plan's search: every layout the request leaves open, evaluated (core/plan/plan_cost.c) and
// ranked. Fitting layouts come first, fastest first; then the others, smallest first.
// defines: l3d_plan_search
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"
#include "core/plan/plan_internal.h"

// a before b in the ranking
static int better(const l3d_plan_result_t *a, const l3d_plan_result_t *b, int ignore_fit) {
    if (ignore_fit) return a->step_time_s < b->step_time_s;
    if (a->fits != b->fits) return a->fits;
    return a->fits ? a->step_time_s < b->step_time_s : a->mem_bytes < b->mem_bytes;
}

typedef struct {
    l3d_plan_result_t *best;
    int max, n, ignore_fit;
} top_t;

static void keep(top_t *top, const l3d_plan_result_t *r) {
    int i = top->n < top->max ? top->n : top->max - 1;
    if (top->n >= top->max && !better(r, &top->best[i], top->ignore_fit)) return;
    while (i > 0 && better(r, &top->best[i - 1], top->ignore_fit)) {
        top->best[i] = top->best[i - 1];
        i--;
    }
    top->best[i] = *r;
    if (top->n < top->max) top->n++;
}

// The values a key takes: the fixed one, or the candidates.
static int values(int fixed, int unset, const int *cand, int ncand, int *out) {
    if (fixed != unset) {
        out[0] = fixed;
        return 1;
    }
    memcpy(out, cand, (size_t)ncand * sizeof(int));
    return ncand;
}

static int divisors(int n, int *out, int max) {
    int k = 0;
    for (int d = 1; d <= n && k < max; d++)
        if (n % d == 0) out[k++] = d;
    return k;
}

l3d_status l3d_plan_search(l3d_ctx_t *ctx, const l3d_plan_request_t *req, l3d_plan_result_t *res,
                           int max, int *n_p, long *searched_p) {
    *n_p = 0;
    if (searched_p) *searched_p = 0;
    if (max < 1 || req->gpus < 1 || req->seq_len < 1 || req->global_batch < 1 ||
        req->gpus_per_node < 1)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "plan: need gpus, gpus per node, seq, "
                         "global batch >= 1 and room for one result");
    const l3d_plan_layout_t *f = &req->fixed;
    if (f->tp_mode > 3)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "plan: tp_mode %d: 1, 2 or 3", f->tp_mode);
    // tp_mode 0 searches all three; a mode is only tried at the sizes it can lay out
    int modes[3] = {1, 2, 3}, nmodes = 3;
    if (f->tp_mode) modes[0] = f->tp_mode, nmodes = 1;
    l3d_plan_scratch_t *sc = l3d_calloc(ctx, 1, sizeof(*sc), "plan");
    if (!sc) return L3D_ERR_NOMEM;
    enum { MAXD = 256 };
    int div[MAXD], nd = divisors(req->gpus, div, MAXD);
    int mbc[] = {1, 2, 4, 8, 16, 32}, vc[] = {1, 2, 3, 4, 6, 8}, zc[] = {0, 1, 2, 3};
    int rcc[] = {L3D_RECOMPUTE_NONE, L3D_RECOMPUTE_FULL, L3D_RECOMPUTE_SELECTIVE}, spc[] = {0, 1};
    int mbs[8], vs[8], zs[4], rcs[3], sps[2], ec[] = {0, 1}, es[2];
    int nmb = values(f->micro_batch, 0, mbc, 6, mbs), nv = values(f->v, 0, vc, 6, vs);
    int nz = values(f->zero_stage, -1, zc, 4, zs), nsp = values(f->sp, -1, spc, 2, sps);
    // Selective recomputation only recomputes stored scores: with flash attention it is "none".
    int nrc = values(f->recompute, -1, rcc, req->runtime.flash_attention ? 2 : 3, rcs);
    int ne = values(f->ends, -1, ec, 2, es);
    top_t top = {res, max, 0, req->ignore_fit};
    long searched = 0;
    char why[512] = "";
    for (int a = 0; a < nd * nmodes; a++) {
        int tp = div[a % nd], mode = modes[a / nd];
        if (f->tp && tp != f->tp) continue;
        int q = (int)lround(sqrt((double)tp)), c3 = (int)lround(cbrt((double)tp));
        if (mode == 2 && (tp < 4 || q * q != tp)) continue;  // 2d: a q x q grid
        if (mode == 3 && (tp < 8 || c3 * c3 * c3 != tp)) continue;  // 3d: a q^3 cube
        // the heads split over tp (1d), a grid's q, a cube's q (the config check has the rest)
        if (req->model.num_attention_heads % (mode == 1 ? tp : mode == 2 ? q : c3)) continue;
        for (int b = 0; b < nd; b++) {
            int cp = div[b];
            if ((f->cp && cp != f->cp) || (!f->cp && cp > 1 && cp > 64) ||
                (req->gpus / tp) % cp || req->seq_len % cp)
                continue;
            for (int c = 0; c < nd; c++) {
                int pp = div[c];
                long tcp = (long)tp * cp * pp;
                if ((f->pp && pp != f->pp) || req->gpus % tcp ||
                    pp > req->model.num_hidden_layers)
                    continue;
                int dp = (int)(req->gpus / tcp);
                if (f->dp && dp != f->dp) continue;
                for (int i = 0; i < nv * ne; i++) {
                    // chunks may be uneven (l3d_model_set_stage gives the first virtual
                    // stages one more layer); the trainer's checks refuse what it cannot run.
                    // The embedding and the head as layers (ends): a pipeline's choice.
                    int v = vs[i % nv], ends = es[i / nv];
                    if ((v > 1 && pp == 1) || (ends && pp == 1) ||
                        pp * v > req->model.num_hidden_layers + 2 * ends)
                        continue;
                    for (int j = 0; j < nmb; j++) {
                        if (req->global_batch % (dp * mbs[j])) continue;
                        for (int z = 0; z < nz; z++) {
                            if (zs[z] > 0 && dp == 1 && f->zero_stage < 0) continue;
                            for (int k = 0; k < nrc; k++)
                                for (int s = 0; s < nsp; s++) {
                                    if (sps[s] && (tp == 1 || mode >= 2) && f->sp < 0) continue;
                                    l3d_plan_layout_t l = {dp,     tp,     pp,     cp,
                                                           mode,   v,      mbs[j], zs[z],
                                                           rcs[k], sps[s] && tp > 1, ends};
                                    l3d_plan_result_t r;
                                    if (l3d_plan_evaluate_in(ctx, req, &l, sc, &r) < 0) {
                                        if (!why[0])
                                            snprintf(why, sizeof(why), "%s",
                                                     l3d_ctx_last_error(ctx));
                                        continue;
                                    }
                                    searched++;
                                    keep(&top, &r);
                                }
                        }
                    }
                }
            }
        }
    }
    l3d_free(ctx, sc, sizeof(*sc), "plan");
    if (searched_p) *searched_p = searched;
    *n_p = top.n;
    if (!top.n)
        return l3d_error(ctx, L3D_ERR_CONFIG, "plan: no valid layout of %d GPUs for this model "
                         "and batch%s%s", req->gpus, why[0] ? "; e.g. " : "", why);
    return L3D_OK;
}
