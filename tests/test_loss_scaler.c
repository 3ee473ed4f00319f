// The fp16 loss scaler against DeepSpeed's rules (core/train/loss_scaler.h): sequences of injected
// overflows and clean steps, with the scale and skip decision after each, worked out by hand
// from deepspeed/runtime/fp16/loss_scaler.py's update_scale.
#include <criterion/criterion.h>
#include <string.h>

#include "core/train/loss_scaler.h"

static l3d_ctx_t *ctx;
static void setup(void) { cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK); }
static void teardown(void) { l3d_ctx_destroy(ctx); }
TestSuite(loss_scaler, .init = setup, .fini = teardown);

static l3d_train_config_t fp16_cfg(int power, int window, int hysteresis, int consecutive,
                                   double min_scale) {
    l3d_train_config_t c;
    l3d_train_config_default(ctx, &c);
    c.fp16 = 1;
    c.fp16_initial_scale_power = power;
    c.fp16_loss_scale_window = window;
    c.fp16_hysteresis = hysteresis;
    c.fp16_consecutive_hysteresis = consecutive;
    c.fp16_min_loss_scale = min_scale;
    return c;
}

// Runs steps[i] ('o' overflow, '.' clean) and checks the scale after each update and whether
// the step was applied.
static void run(l3d_loss_scaler_t *s, const char *steps, const double *scales) {
    for (int i = 0; steps[i]; i++) {
        int apply = -1, overflow = steps[i] == 'o';
        cr_assert_eq(l3d_loss_scaler_update(ctx, s, overflow, &apply), L3D_OK, "step %d: %s", i,
                     l3d_ctx_last_error(ctx));
        cr_assert_eq(apply, !overflow, "step %d", i);
        cr_assert_eq(s->scale, scales[i], "step %d ('%c'): scale %g, want %g", i, steps[i],
                     s->scale, scales[i]);
    }
}

Test(loss_scaler, defaults_are_deepspeeds) {
    l3d_train_config_t c;
    l3d_train_config_default(ctx, &c);
    l3d_loss_scaler_t s;
    l3d_loss_scaler_init(&s, &c);  // fp16 off: a static 1
    cr_assert_eq(s.dynamic, 0);
    cr_assert_eq(s.scale, 1.0);
    c.fp16 = 1;
    l3d_loss_scaler_init(&s, &c);
    cr_assert_eq(s.dynamic, 1);
    cr_assert_eq(s.scale, 65536.0);  // 2^16
    cr_assert_eq(s.window, 1000);
    cr_assert_eq(s.hysteresis, 2);
    cr_assert_eq(s.min_scale, 1.0);
    cr_assert_eq(s.consecutive, 0);
}

// A static scale (and fp16 off) never moves; an overflow still skips the step.
Test(loss_scaler, static_scale_skips_and_stays) {
    l3d_train_config_t c = fp16_cfg(16, 2, 2, 0, 1.0);
    c.fp16_loss_scale = 128.0;
    l3d_loss_scaler_t s;
    l3d_loss_scaler_init(&s, &c);
    cr_assert_eq(s.dynamic, 0);
    const double want[] = {128, 128, 128, 128, 128, 128};
    run(&s, "..oo..", want);
    cr_assert_eq(s.skipped, 2);
}

// From a fresh start (last overflow -1) the scale doubles when iter - last - 1 is a positive
// multiple of the window: window 2 doubles at iterations 2 and 4, i.e. after 3 and 5 clean steps.
Test(loss_scaler, window_counting_from_a_fresh_start) {
    l3d_train_config_t c = fp16_cfg(4, 2, 1, 0, 1.0);
    l3d_loss_scaler_t s;
    l3d_loss_scaler_init(&s, &c);
    cr_assert_eq(s.scale, 16.0);
    const double want[] = {16, 16, 32, 32, 64, 64, 128};
    run(&s, ".......", want);
    cr_assert_eq(s.iter, 7);
    cr_assert_eq(s.skipped, 0);
}

// hysteresis 2, not consecutive: the first overflow only uses up hysteresis; the second halves;
// the hysteresis is not refilled by halving, so the third halves again. Clean steps refill it
// only when the scale doubles: after the overflow at iteration 2, the window of 3 doubles at
// iteration 2 + 1 + 3 = 6. Then one overflow is absorbed again.
Test(loss_scaler, hysteresis_then_halving_then_refill_on_doubling) {
    l3d_train_config_t c = fp16_cfg(10, 3, 2, 0, 1.0);
    l3d_loss_scaler_t s;
    l3d_loss_scaler_init(&s, &c);
    //                    o     o    o    .    .    .    .     o     o
    const double want[] = {1024, 512, 256, 256, 256, 256, 512, 512, 256};
    run(&s, "ooo....oo", want);
    cr_assert_eq(s.skipped, 5);
    cr_assert_eq(s.last_overflow, 8);
    cr_assert_eq(s.hysteresis_left, 1);
}

// consecutive_hysteresis: every clean step refills it, so overflows separated by clean steps
// never halve; without it the same pattern halves on the second overflow.
Test(loss_scaler, consecutive_hysteresis_refills_on_every_clean_step) {
    l3d_loss_scaler_t s;
    l3d_train_config_t c = fp16_cfg(8, 100, 2, 1, 1.0);
    l3d_loss_scaler_init(&s, &c);
    const double with[] = {256, 256, 256, 256, 256, 256, 256, 128};
    run(&s, "o.o.o.oo", with);  // two overflows in a row do halve
    l3d_loss_scaler_t t;
    c.fp16_consecutive_hysteresis = 0;
    l3d_loss_scaler_init(&t, &c);
    const double without[] = {256, 256, 128, 128, 64, 64, 32};
    run(&t, "o.o.o.o", without);
}

// The floor: halving stops at min_loss_scale (0.75 here: max(1/2, 0.75)); an overflow with the
// scale already at the floor fails the run (hysteresis still absorbs first), and the scaler is
// left as it was.
Test(loss_scaler, minimum_is_a_floor_then_a_failure) {
    l3d_train_config_t c = fp16_cfg(0, 1000, 1, 0, 0.75);
    l3d_loss_scaler_t s;
    l3d_loss_scaler_init(&s, &c);
    const double want[] = {0.75};
    run(&s, "o", want);
    int apply = -1;
    cr_assert_eq(l3d_loss_scaler_update(ctx, &s, 1, &apply), L3D_ERR_DIVERGED);
    cr_assert_eq(apply, 0);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "step 2"), "%s", l3d_ctx_last_error(ctx));
    cr_assert(strstr(l3d_ctx_last_error(ctx), "minimum 0.75 (fp16.min_loss_scale)"), "%s",
              l3d_ctx_last_error(ctx));
    cr_assert_eq(s.iter, 1);
    cr_assert_eq(s.scale, 0.75);

    // hysteresis 2 at the floor: one more overflow is absorbed, the next fails.
    l3d_train_config_t c2 = fp16_cfg(1, 1000, 2, 0, 1.0);
    l3d_loss_scaler_init(&s, &c2);
    const double want2[] = {2, 1, 1};
    run(&s, "oo.", want2);
    cr_assert_eq(s.hysteresis_left, 1);
    cr_assert_eq(l3d_loss_scaler_update(ctx, &s, 1, NULL), L3D_ERR_DIVERGED);

    cr_assert_eq(l3d_loss_scaler_update(ctx, NULL, 0, NULL), L3D_ERR_INVALID_ARG);
}
