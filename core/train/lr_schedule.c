// Learning-rate schedules with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py).
// defines: l3d_train_config_lr
//
// schedule_at(cfg, it) is DeepSpeed's get_lr() at last_batch_iteration == it (it = -1: the
// value its constructor puts in the optimizer). The DeepSpeed engine calls scheduler.step()
// after each optimizer step, so update number s+1 (0-based optimizer step s) runs with
// iteration s-1: l3d_train_config_lr(cfg, s) = schedule_at(cfg, s - 1). That reproduces a
// DeepSpeed run's lr sequence exactly (tests/reference/test_train.py checks it).
#include <math.h>

#include "llama3d/config.h"

// Warm-up fraction in [0, 1]: log(step+1)/log(W) ("log", DeepSpeed's default) or step/W.
static double warmup_gamma(const l3d_train_config_t *cfg, int step, int w) {
    if (cfg->warmup_type_log) return log((double)step + 1.0) / log((double)w);
    return (double)step / (double)w;
}

static float schedule_at(const l3d_train_config_t *cfg, int step) {
    // DeepSpeed clamps the warm-up length to at least 2 so that log(W) is not 0.
    int w = cfg->warmup_num_steps < 2 ? 2 : cfg->warmup_num_steps;
    double min_lr = cfg->warmup_min_lr, max_lr = cfg->warmup_max_lr;
    double gamma;
    switch (cfg->sched) {
    case L3D_SCHED_WARMUP_LR:
        if (step < 0) return (float)min_lr;  // before the first step DeepSpeed reports min
        gamma = step < w ? warmup_gamma(cfg, step, w) : 1.0;
        return (float)(min_lr + (max_lr - min_lr) * gamma);
    case L3D_SCHED_WARMUP_DECAY_LR: {
        if (step < 0) return (float)min_lr;
        if (step < w) {
            gamma = warmup_gamma(cfg, step, w);
        } else {
            // Linear from max_lr at the end of warm-up to 0 at total_num_steps.
            double span = cfg->total_num_steps - w;
            gamma = (double)(cfg->total_num_steps - step) / (span < 1.0 ? 1.0 : span);
            if (gamma < 0.0) gamma = 0.0;
        }
        return (float)(min_lr + (max_lr - min_lr) * gamma);
    }
    case L3D_SCHED_WARMUP_COSINE_LR: {
        if (step < 0) return (float)((double)cfg->lr * cfg->warmup_min_ratio);  // warm-up start
        double ratio;
        if (step < w) {
            // From warmup_min_ratio to 1 of the optimizer's lr.
            double lo = cfg->warmup_min_ratio;
            ratio = lo + warmup_gamma(cfg, step, w) * (1.0 - lo);
        } else {
            // Cosine from 1 to cos_min_ratio; the progress is clamped to 1 past the end, as
            // current DeepSpeed does, so the lr stays at the floor instead of rising again.
            double real_step = (double)(step - w + 1);
            double real_total = cfg->total_num_steps - w;
            if (real_total < 1.0) real_total = 1.0;
            double prog = real_step / real_total;
            if (prog > 1.0) prog = 1.0;
            double c = (1.0 + cos(3.14159265358979323846 * prog)) / 2.0;
            ratio = cfg->cos_min_ratio + (1.0 - cfg->cos_min_ratio) * c;
            if (ratio < 0.0) ratio = 0.0;
        }
        return (float)((double)cfg->lr * ratio);
    }
    case L3D_SCHED_CONSTANT:
        break;
    }
    return cfg->lr;
}

float l3d_train_config_lr(const l3d_train_config_t *cfg, int step) {
    if (!cfg) return 0.0f;
    if (cfg->sched == L3D_SCHED_CONSTANT) return cfg->lr;
    return schedule_at(cfg, step - 1);
}
