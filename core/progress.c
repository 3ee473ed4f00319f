// Progress reports through the ctx's callback, rate-limited here so that a loop may report
// after every chunk it processes and the callee is still called at most ~10 times a second.
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"
#include "platform/platform.h"

void l3d_progress_begin(l3d_ctx_t *ctx, l3d_progress_t *p, uint64_t total, const char *fmt,
                        ...) {
    memset(p, 0, sizeof(*p));
    l3d_ctx_progress_fn(ctx, &p->fn, &p->user);
    p->total = total;
    if (!p->fn) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->what, sizeof(p->what), fmt, ap);
    va_end(ap);
    p->last_t = l3d_time_now();
    p->fn(p->what, 0, total, 0, p->user);
}

void l3d_progress_update_at(l3d_progress_t *p, uint64_t done, double now) {
    p->done = done;
    if (!p->fn || now - p->last_t < L3D_PROGRESS_INTERVAL_S) return;
    p->last_t = now;
    p->fn(p->what, done, p->total, 0, p->user);
}

void l3d_progress_update(l3d_progress_t *p, uint64_t done) {
    if (!p->fn) {
        p->done = done;
        return;
    }
    l3d_progress_update_at(p, done, l3d_time_now());
}

void l3d_progress_end(l3d_progress_t *p) {
    if (p->fn) p->fn(p->what, p->done, p->total, 1, p->user);
    p->fn = NULL;  // a second end is harmless
}
