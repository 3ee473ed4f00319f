// Folder core/plan (docs/architecture.md): l3d plan's search, cost model, hardware tables and
// published runs. May use core/train (its memory and communication estimators) and every
// folder below it; not core/monitor.
//
// Shared between the planner's files: core/plan/plan_hw.c (hardware), core/plan/plan_cost.c (one
// layout), core/plan/plan_search.c (the search) and core/plan/plan_published.c (published runs).
// defines: l3d_plan_scratch_t, l3d_plan_evaluate_in, l3d_plan_link_time,
//          l3d_plan_model_flops_per_token, l3d_plan_layout_str
#ifndef L3D_PLAN_INTERNAL_H
#define L3D_PLAN_INTERNAL_H

#include <stddef.h>

#include "llama3d/config.h"
#include "llama3d/plan.h"

// What one evaluation needs besides the request: a training configuration to fill (~30 KiB)
// and the pipeline schedules already simulated (l3d_pp_validate depends only on pp, v and the
// accumulation steps, and takes most of a search's time when run per layout).
enum { L3D_PLAN_MEMO = 512 };
typedef struct l3d_plan_scratch {
    l3d_train_config_t cfg;
    int n;
    struct {
        int pp, v, A;
        l3d_status st;
    } memo[L3D_PLAN_MEMO];
} l3d_plan_scratch_t;

// l3d_plan_evaluate with the caller's scratch (a search reuses one).
l3d_status l3d_plan_evaluate_in(l3d_ctx_t *ctx, const l3d_plan_request_t *r,
                                const l3d_plan_layout_t *l, l3d_plan_scratch_t *sc,
                                l3d_plan_result_t *res);
// Seconds for one op (L3D_PLAN_OP_*) of S bytes over n ranks on link.
double l3d_plan_link_time(const l3d_plan_link_t *link, int op, int n, double S);
// PaLM's model FLOPs per trained token: 6N + 12 L H Q T, N the parameters a matmul reads
// (the layers and the head; not the input embedding's lookup).
double l3d_plan_model_flops_per_token(const l3d_model_config_t *mc, int seq_len);
// "dp=8,tp=8,pp=16,cp=1,v=1,mb=1,zero=1,recompute=none,sp=1" into buf; returns buf.
const char *l3d_plan_layout_str(const l3d_plan_layout_t *l, char *buf, size_t cap);

#endif
