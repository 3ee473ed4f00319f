// Pipeline schedules: the order in which a stage runs the forward (F) and backward (B) of the
// micro-batches of one step, built ahead of time and checked to complete.
// defines: l3d_pp_kind, l3d_pp_op_t, l3d_pp_schedule, l3d_pp_slots, l3d_pp_peaks,
//          l3d_pp_validate
//
// A stage holds v model chunks (1 unless interleaved): chunk c of stage s is virtual stage
// u = c * pp + s of U = pp * v, and micro-batch j flows through u = 0 .. U-1. Messages:
// F(j, c) at u > 0 receives micro-batch j's activations from the stage of u-1 ((s-1) mod pp),
// and at u < U-1 sends its output to the stage of u+1; B(j, c) at u < U-1 receives the
// gradient from the stage of u+1, and at u > 0 sends dL/dinput to the stage of u-1. Receives
// block, and the messages from one stage to another arrive in the order sent (there are no
// tags): the validation checks that every receive finds its own message at the head of its
// channel. Sends are isends from a ring of L3D_PP_RING buffers per direction (x_final for F,
// dres for every B): an op waits for its buffer's previous send before it runs, and a send
// completes only once received (rendezvous, the strictest transport), which the validation
// models too.
//   GPipe: F(0..A-1), then B(0..A-1): A activation sets in flight.
//   1F1B (PipeDream-flush, Megatron's default): w = min(pp-s-1, A) warm-up forwards, then
//   F and B alternating, then the remaining B: at most w+1 sets in flight.
//   Interleaved 1F1B (Megatron's virtual pipeline): the step's A*v forwards go in groups of
//   pp micro-batches per chunk, chunk 0 first (k-th forward: chunk (k / pp) mod v, micro
//   (k / (pp v)) pp + k mod pp), the backwards in the same order with the chunks reversed;
//   (pp-s-1)*2 + (v-1)*pp warm-up forwards (all of them when A == pp), then 1F1B. Needs
//   A % pp == 0 (as Megatron) and pp >= 2. The bubble shrinks by v at the cost of v times the
//   point-to-point messages.
#ifndef L3D_PIPELINE_H
#define L3D_PIPELINE_H

#include "core/l3d_core.h"

typedef enum l3d_pp_kind { L3D_PP_1F1B = 0, L3D_PP_GPIPE = 1, L3D_PP_INTERLEAVED = 2 } l3d_pp_kind;

enum { L3D_PP_RING = 2 };  // buffers per direction: a send overlaps the next op

typedef struct l3d_pp_op {
    int backward;  // 0: F, 1: B
    int micro;
    int chunk;     // the stage's model chunk (0 unless interleaved)
} l3d_pp_op_t;

// Fills ops[0 .. 2Av) for `stage` (v chunks: 1 unless interleaved); returns the count.
int l3d_pp_schedule(l3d_pp_kind kind, int pp, int v, int stage, int A, l3d_pp_op_t *ops);
// Activation sets chunk `chunk` of the stage needs (its micro-batches forwarded and not yet
// backwarded, at most). They are consecutive micro-batches: j uses set j mod the count.
int l3d_pp_slots(l3d_pp_kind kind, int pp, int v, int stage, int A, int chunk);
// The stage's peak of live layers along its schedule: the sum over its forwarded-not-yet-
// backwarded micro-batches of their chunk's layer count (chunk_layers[c]), what a pool of
// layer activations shared by the chunks needs (Korthikanti's L (1 + (p-1)/(pv)) on stage 0
// when the chunks are even, where per-chunk peaks summed give more).
int l3d_pp_layer_peak(l3d_pp_kind kind, int pp, int v, int stage, int A, const int *chunk_layers);
// Both in one pass over the schedule (a plan asks for them per layout and stage): slots[c] =
// l3d_pp_slots of chunk c for each of the v chunks; returns l3d_pp_layer_peak.
int l3d_pp_peaks(l3d_pp_kind kind, int pp, int v, int stage, int A, const int *chunk_layers,
                 int *slots);
// The schedule's preconditions (interleaved: pp >= 2, v >= 2, A % pp == 0; others: v == 1):
// L3D_ERR_CONFIG naming the knob to change.
l3d_status l3d_pp_check(l3d_ctx_t *ctx, l3d_pp_kind kind, int pp, int v, int A);
// Runs every stage's schedule against the message rules above and the slot bound. L3D_OK when
// all stages finish; else L3D_ERR_INTERNAL naming the stuck stage or the message received out
// of order (a schedule bug).
l3d_status l3d_pp_validate(l3d_ctx_t *ctx, l3d_pp_kind kind, int pp, int v, int A);
// "1f1b" / "gpipe" / "interleaved" -> kind; L3D_ERR_CONFIG naming the valid ones otherwise.
l3d_status l3d_pp_kind_parse(l3d_ctx_t *ctx, const char *name, l3d_pp_kind *kind);

#endif
