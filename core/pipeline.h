// Pipeline schedules: the order in which a stage runs the forward (F) and backward (B) of the
// micro-batches of one step, built ahead of time and checked to complete.
// defines: l3d_pp_kind, l3d_pp_op_t, l3d_pp_schedule, l3d_pp_slots, l3d_pp_validate
//
// Messages: F(j) on stage s > 0 receives micro-batch j's activations from s-1, and on
// s < pp-1 sends its output to s+1; B(j) on s < pp-1 receives the gradient from s+1 and on
// s > 0 sends dL/dinput to s-1. Sends never block (isend, waited before the buffer is reused),
// receives do. Both schedules run B in micro-batch order, so every pair of neighbours sees
// the messages in the same order on both sides.
//   GPipe: F(0..A-1), then B(0..A-1): A activation sets in flight.
//   1F1B (PipeDream-flush, Megatron's default): w = min(pp-s-1, A) warm-up forwards, then
//   F and B alternating, then the remaining B: at most w+1 sets in flight.
#ifndef L3D_PIPELINE_H
#define L3D_PIPELINE_H

#include "core/l3d_core.h"

typedef enum l3d_pp_kind { L3D_PP_1F1B = 0, L3D_PP_GPIPE = 1 } l3d_pp_kind;

typedef struct l3d_pp_op {
    int backward;  // 0: F, 1: B
    int micro;
} l3d_pp_op_t;

// Fills ops[0 .. 2A) for `stage`; returns the count (2A).
int l3d_pp_schedule(l3d_pp_kind kind, int pp, int stage, int A, l3d_pp_op_t *ops);
// Activation sets the stage needs (micro-batches forwarded and not yet backwarded, at most).
int l3d_pp_slots(l3d_pp_kind kind, int pp, int stage, int A);
// Runs every stage's schedule against the message rules above and the slot bound. L3D_OK when
// all stages finish; else L3D_ERR_INTERNAL naming the stuck stages (a schedule bug).
l3d_status l3d_pp_validate(l3d_ctx_t *ctx, l3d_pp_kind kind, int pp, int A);
// "1f1b" / "gpipe" -> kind; L3D_ERR_CONFIG naming the valid ones otherwise.
l3d_status l3d_pp_kind_parse(l3d_ctx_t *ctx, const char *name, l3d_pp_kind *kind);

#endif
