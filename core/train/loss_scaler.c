// fp16 loss scaling: DeepSpeed's counting, rule by rule (core/train/loss_scaler.h).
#include "core/train/loss_scaler.h"

#include <math.h>
#include <string.h>

#include "core/l3d_core.h"

void l3d_loss_scaler_init(l3d_loss_scaler_t *s, const l3d_train_config_t *cfg) {
    memset(s, 0, sizeof(*s));
    s->scale = 1.0;
    s->last_overflow = -1;
    s->window = 1;
    s->hysteresis = s->hysteresis_left = 1;
    s->min_scale = 1.0;
    if (!cfg || !cfg->fp16) return;  // float32 and bf16: nothing to scale
    if (cfg->fp16_loss_scale > 0.0) {
        s->scale = cfg->fp16_loss_scale;
        return;
    }
    s->dynamic = 1;
    s->scale = ldexp(1.0, cfg->fp16_initial_scale_power);
    s->min_scale = cfg->fp16_min_loss_scale;
    s->window = cfg->fp16_loss_scale_window;
    s->hysteresis = s->hysteresis_left = cfg->fp16_hysteresis;
    s->consecutive = cfg->fp16_consecutive_hysteresis;
}

l3d_status l3d_loss_scaler_update(l3d_ctx_t *ctx, l3d_loss_scaler_t *s, int overflow,
                                  int *apply_p) {
    if (!s) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_loss_scaler_update: NULL scaler");
    if (apply_p) *apply_p = !overflow;
    if (overflow) {
        if (s->dynamic) {
            if (s->hysteresis == 1 || s->hysteresis_left == 1) {
                if (s->scale == s->min_scale)
                    return l3d_error(ctx, L3D_ERR_DIVERGED,
                                     "step %lld: gradients overflowed in fp16 with the loss scale "
                                     "already at its minimum %g (fp16.min_loss_scale): the run "
                                     "diverged; lower the learning rate or train in bf16",
                                     s->iter + 1, s->scale);
                s->scale = fmax(s->scale / 2.0, s->min_scale);
            } else {
                s->hysteresis_left--;
            }
            s->last_overflow = s->iter;
        }
        s->skipped++;
    } else if (s->dynamic) {
        if (s->consecutive) s->hysteresis_left = s->hysteresis;
        long long stable = s->iter - s->last_overflow - 1;
        if (stable > 0 && stable % s->window == 0) {
            if (!s->consecutive) s->hysteresis_left = s->hysteresis;
            s->scale *= 2.0;
        }
    }
    s->iter++;
    return L3D_OK;
}
