// fp16 loss scaling with DeepSpeed's rules: the dynamic scaler of
// deepspeed/runtime/fp16/loss_scaler.py (DynamicLossScaler.update_scale) and a static scale as
// its fp16 optimizers treat one. docs/precision.md walks through an example.
// defines: l3d_loss_scaler_t, l3d_loss_scaler_init, l3d_loss_scaler_update
//
// A step with fp16 gradients: the loss is multiplied by `scale` before the backward; after it
// every rank checks its gradients for inf/NaN and the world agrees (one rank's overflow is
// everyone's); then l3d_loss_scaler_update(overflow) says whether to apply the step:
// - overflow: the step is skipped (no weight update, no LR-schedule step; `skipped` counts it).
//   Dynamic: when the hysteresis left is 1 (or `hysteresis` is 1) the scale halves, never
//   below min_scale; if the scale already IS min_scale the run fails (L3D_ERR_DIVERGED, as
//   DeepSpeed raises "Current loss scale already at minimum"). Otherwise the hysteresis left
//   drops by one and the scale stays. Either way last_overflow_iter = iter.
//   Static (fp16.loss_scale > 0): the scale stays.
// - clean step: with consecutive_hysteresis the hysteresis left refills. Then, with
//   stable = iter - last_overflow_iter - 1: if stable > 0 and stable % window == 0 the scale
//   doubles (and, without consecutive_hysteresis, the hysteresis left refills).
// - iter += 1.
// From a fresh start (last_overflow_iter = -1) the first doubling is decided at iteration
// `window`, i.e. after window + 1 clean steps; after an overflow at iteration j, at
// j + 1 + window. Without fp16 (float32 or bf16 training) the scaler is static at 1.
#ifndef L3D_CORE_LOSS_SCALER_H
#define L3D_CORE_LOSS_SCALER_H

#include "llama3d/config.h"
#include "llama3d/ctx.h"
#include "llama3d/status.h"

typedef struct l3d_loss_scaler {
    int dynamic;             // fp16 with loss_scale 0
    double scale;            // the current scale (a power of two when dynamic)
    double min_scale;        // fp16.min_loss_scale
    int window;              // fp16.loss_scale_window
    int hysteresis;          // fp16.hysteresis (DeepSpeed's delayed_shift)
    int hysteresis_left;     // DeepSpeed's cur_hysteresis
    int consecutive;         // fp16.consecutive_hysteresis
    long long iter;          // steps seen, skipped ones included (DeepSpeed's cur_iter)
    long long last_overflow; // the iteration of the last overflow (-1: none yet)
    long long skipped;       // steps skipped so far
} l3d_loss_scaler_t;

// From the config's fp16 keys (a static 1 when fp16 is off).
void l3d_loss_scaler_init(l3d_loss_scaler_t *s, const l3d_train_config_t *cfg);

// Records one step's outcome (overflow: any rank saw inf/NaN in a gradient). *apply_p (may be
// NULL) is 1 when the step's update is to be applied, 0 when it is skipped.
// L3D_ERR_DIVERGED, with a message naming the step and the scale, when a dynamic scale at its
// minimum overflows again; the scaler is then left as it was.
l3d_status l3d_loss_scaler_update(l3d_ctx_t *ctx, l3d_loss_scaler_t *s, int overflow,
                                  int *apply_p);

#endif
