// The progress callback's contract (include/llama3d/ctx.h): a first call with done 0, at most
// one call per L3D_PROGRESS_INTERVAL_S however often the work reports, and exactly one last
// call. The clock is given to the tracker here, so the counts are exact, not timed.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"

typedef struct calls {
    int n, lasts;
    uint64_t done[64];
    char what[64];
} calls_t;

static void record(const char *what, uint64_t done, uint64_t total, int last, void *user) {
    calls_t *c = user;
    cr_assert_eq(total, 1000000);
    if (c->n < 64) c->done[c->n] = done;
    c->n++;
    c->lasts += last != 0;
    snprintf(c->what, sizeof(c->what), "%s", what);
}

static l3d_ctx_t *ctx_with(l3d_progress_fn fn, void *user) {
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.read_env = 0;
    p.progress_fn = fn;
    p.progress_user = user;
    l3d_ctx_t *ctx = NULL;
    cr_assert_eq(l3d_ctx_create(&p, &ctx), L3D_OK);
    return ctx;
}

Test(progress, rate_limited) {
    calls_t c = {0};
    l3d_ctx_t *ctx = ctx_with(record, &c);
    l3d_progress_t p;
    l3d_progress_begin(ctx, &p, 1000000, "loading %s", "x.bin");
    cr_assert_eq(c.n, 1);
    cr_assert_eq(c.done[0], 0);
    cr_assert_str_eq(c.what, "loading x.bin");
    // 1,000,000 reports over 2.55 s of (given) time, 2.55 us apart: a call each time 0.1 s has
    // passed since the last, so 25 calls (the 25th by 2.50007 s; a 26th would need 2.6 s).
    double t0 = p.last_t;
    for (uint64_t k = 1; k <= 1000000; k++) l3d_progress_update_at(&p, k, t0 + 2.55 * k / 1e6);
    cr_assert_eq(c.n, 1 + 25, "%d calls", c.n);
    for (int i = 2; i < c.n; i++) {
        cr_assert_gt(c.done[i], c.done[i - 1]);
        // a call as soon as 0.1 s passed: 0.1 / 2.55e-6 = 39,216 reports apart
        cr_assert_leq(c.done[i] - c.done[i - 1], 39217);
        cr_assert_geq(c.done[i] - c.done[i - 1], 39215);
    }
    cr_assert_eq(c.lasts, 0);
    l3d_progress_end(&p);
    cr_assert_eq(c.n, 27);
    cr_assert_eq(c.lasts, 1);
    cr_assert_eq(c.done[26], 1000000);
    l3d_progress_end(&p);  // a second end calls nothing
    cr_assert_eq(c.n, 27);
    l3d_ctx_destroy(ctx);
}

Test(progress, real_clock_bounded) {
    calls_t c = {0};
    l3d_ctx_t *ctx = ctx_with(record, &c);
    l3d_progress_t p;
    l3d_progress_begin(ctx, &p, 1000000, "x");
    double t0 = p.last_t;
    for (uint64_t k = 1; k <= 1000000; k++) l3d_progress_update(&p, k);
    double dt = p.last_t - t0;  // when the last call was made
    l3d_progress_end(&p);
    // However fast or slow this machine is: no more calls than intervals that passed.
    cr_assert_leq(c.n, 2 + (int)(dt / L3D_PROGRESS_INTERVAL_S) + 1, "%d calls in %.3f s", c.n, dt);
    cr_assert_eq(c.lasts, 1);
    l3d_ctx_destroy(ctx);
}

Test(progress, no_callback_no_calls) {
    l3d_ctx_t *ctx = ctx_with(NULL, NULL);
    l3d_progress_t p;
    l3d_progress_begin(ctx, &p, 10, "x");
    l3d_progress_update(&p, 5);
    cr_assert_eq(p.done, 5);
    l3d_progress_end(&p);
    l3d_ctx_destroy(ctx);
}
