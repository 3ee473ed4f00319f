// The test devices (devices/cpu_test/cpu_test.h) behave like a GPU's memory and stream, or
// they prove nothing: cpu-opaque's memory faults when the host touches it, both refuse a
// pointer on the wrong side of a copy or an op, and cpu-async runs nothing until the host
// waits (so a missing sync reads stale memory every time) and keeps its streams apart.
// That they give the CPU device's results bit for bit: tests/test_parallel_devices.c.
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "devices/device.h"

static const char *k_devices[] = {"cpu-opaque", "cpu-async"};

typedef struct {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
} env_t;

static env_t env_open(const char *name) {
    env_t e;
    cr_assert_eq(l3d_ctx_create(NULL, &e.ctx), L3D_OK);
    l3d_device_params_t p = {.num_threads = 2};
    cr_assert_eq(l3d_device_create(e.ctx, name, &p, &e.dev), L3D_OK, "%s: %s", name,
                 l3d_ctx_last_error(e.ctx));
    cr_assert_str_eq(l3d_device_name(e.dev), name);
    return e;
}
static void env_close(env_t e) {
    l3d_device_destroy(e.dev);
    l3d_ctx_destroy(e.ctx);
}

// A child process reads `p`; returns its wait status.
static int child_reads(const void *p) {
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);  // not a handler's report (UCX, ASan): the fault itself
        signal(SIGBUS, SIG_DFL);
        volatile char c = *(const volatile char *)p;
        (void)c;
        _exit(0);  // the read went through: the device's memory is not opaque
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    return ws;
}

Test(device_test, memory_faults_on_host_access) {
    for (size_t d = 0; d < 2; d++) {
        env_t e = env_open(k_devices[d]);
        cr_assert_eq(l3d_dev_is_host(e.dev), 0, "%s claims host memory", k_devices[d]);
        float *p;
        cr_assert_eq(l3d_dev_alloc(e.dev, 4096, "acts", (void **)&p), L3D_OK);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 64, 0, "%s: alignment", k_devices[d]);
        // an element inside the allocation faults as its start does
        for (int k = 0; k < 2; k++) {
            int ws = child_reads(k ? (const void *)(p + 100) : (const void *)p);
            cr_assert(!(WIFEXITED(ws) && WEXITSTATUS(ws) == 0),
                      "%s: the host read device memory without a fault", k_devices[d]);
        }
        // the control: a host buffer reads fine in the same child
        float host = 1.0f;
        int ws = child_reads(&host);
        cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
        l3d_dev_free(e.dev, p, 4096, "acts");
        env_close(e);
    }
}

Test(device_test, pointers_on_the_wrong_side_are_refused) {
    for (size_t d = 0; d < 2; d++) {
        env_t e = env_open(k_devices[d]);
        float host[16] = {0}, *dv;
        cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(host), "acts", (void **)&dv), L3D_OK);
        // a host pointer where an op takes device memory: the op and the argument named
        cr_assert_eq(l3d_dev_add(e.dev, dv, host, dv, 16, L3D_FLOAT32), L3D_ERR_INVALID_ARG);
        const char *err = l3d_ctx_last_error(e.ctx);
        cr_assert(strstr(err, k_devices[d]) && strstr(err, "add") && strstr(err, "'a_'") &&
                  strstr(err, "not memory of this device"), "%s", err);
        cr_assert_eq(l3d_dev_copy(e.dev, host, host, sizeof(host), L3D_COPY_H2D),
                     L3D_ERR_INVALID_ARG);
        cr_assert(strstr(l3d_ctx_last_error(e.ctx), "copy H2D: 'dst'"), "%s",
                  l3d_ctx_last_error(e.ctx));
        // device memory where a copy takes host memory
        cr_assert_eq(l3d_dev_copy(e.dev, dv, dv, sizeof(host), L3D_COPY_D2H), L3D_ERR_INVALID_ARG);
        cr_assert(strstr(l3d_ctx_last_error(e.ctx), "copy D2H: 'dst'") &&
                  strstr(l3d_ctx_last_error(e.ctx), "is device memory"), "%s",
                  l3d_ctx_last_error(e.ctx));
        double ss;  // sumsq's result is device memory (ABI 7)
        cr_assert_eq(l3d_dev_sumsq(e.dev, host, 16, (double *)(void *)dv, L3D_FLOAT32),
                     L3D_ERR_INVALID_ARG);
        cr_assert(strstr(l3d_ctx_last_error(e.ctx), "'x[k]'"), "%s", l3d_ctx_last_error(e.ctx));
        cr_assert_eq(l3d_dev_sumsq(e.dev, dv, 16, &ss, L3D_FLOAT32), L3D_ERR_INVALID_ARG);
        cr_assert(strstr(l3d_ctx_last_error(e.ctx), "'out'"), "%s", l3d_ctx_last_error(e.ctx));
        cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);  // nothing refused was queued
        l3d_dev_free(e.dev, dv, sizeof(host), "acts");
        env_close(e);
    }
}

// Through the device and back: the op's result is the CPU's, once the host has waited.
Test(device_test, ops_run_on_the_device) {
    for (size_t d = 0; d < 2; d++) {
        env_t e = env_open(k_devices[d]);
        float x[64], y[64], got[64];
        for (int i = 0; i < 64; i++) x[i] = (float)i * 0.5f - 3.0f, y[i] = 1.0f / (float)(i + 1);
        float *dx, *dy;
        cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(x), "acts", (void **)&dx), L3D_OK);
        cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(y), "acts", (void **)&dy), L3D_OK);
        cr_assert_eq(l3d_dev_copy(e.dev, dx, x, sizeof(x), L3D_COPY_H2D), L3D_OK);
        cr_assert_eq(l3d_dev_copy(e.dev, dy, y, sizeof(y), L3D_COPY_H2D), L3D_OK);
        cr_assert_eq(l3d_dev_add(e.dev, dx, dx, dy, 64, L3D_FLOAT32), L3D_OK);
        cr_assert_eq(l3d_dev_scale(e.dev, dx, 3.0f, 64, L3D_FLOAT32), L3D_OK);
        // the multi-tensor norm into device memory: y twice (weights 1 and 0.5) and x
        double ss = -1, *dss;
        cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(double), "other", (void **)&dss), L3D_OK);
        const void *xs[3] = {dy, dx, dy};
        size_t lens[3] = {64, 64, 64};
        double ws[3] = {1.0, 0.25, 0.5};
        cr_assert_eq(l3d_dev_sumsq_multi(e.dev, 3, xs, lens, ws, dss, L3D_FLOAT32), L3D_OK);
        cr_assert_eq(l3d_dev_copy(e.dev, &ss, dss, sizeof(double), L3D_COPY_D2H), L3D_OK);
        cr_assert_eq(l3d_dev_copy(e.dev, got, dx, sizeof(got), L3D_COPY_D2H), L3D_OK);
        cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
        // the CPU device's (its partial sums have their own order), on the same values
        double want_ss = -2, sy = 0, sx = 0;
        l3d_device_t *cpu;
        cr_assert_eq(l3d_device_create(e.ctx, "cpu", NULL, &cpu), L3D_OK);
        cr_assert_eq(l3d_dev_sumsq(cpu, y, 64, &sy, L3D_FLOAT32), L3D_OK);
        cr_assert_eq(l3d_dev_sumsq(cpu, got, 64, &sx, L3D_FLOAT32), L3D_OK);
        l3d_device_destroy(cpu);
        want_ss = 0.0 + 1.0 * sy, want_ss += 0.25 * sx, want_ss += 0.5 * sy;  // in k order
        cr_assert_eq(ss, want_ss, "%s: sumsq %.17g, want %.17g", k_devices[d], ss, want_ss);
        l3d_dev_free(e.dev, dss, sizeof(double), "other");
        for (int i = 0; i < 64; i++)  // float32: (x + y) rounded, times 3 rounded
            cr_assert_eq(got[i], (x[i] + y[i]) * 3.0f, "%s: element %d", k_devices[d], i);
        l3d_dev_free(e.dev, dx, sizeof(x), "acts");
        l3d_dev_free(e.dev, dy, sizeof(y), "acts");
        env_close(e);
    }
}

// cpu-async: nothing runs before the host waits. A D2H copy read without a sync is stale,
// and the host memory a copy was given is read at the wait, not at the call.
Test(device_test, async_ops_finish_at_the_wait) {
    env_t e = env_open("cpu-async");
    int32_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8] = {0};
    int32_t *dv;
    cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(src), "acts", (void **)&dv), L3D_OK);
    cr_assert_eq(l3d_dev_copy(e.dev, dv, src, sizeof(src), L3D_COPY_H2D), L3D_OK);
    cr_assert_eq(l3d_dev_copy(e.dev, dst, dv, sizeof(dst), L3D_COPY_D2H), L3D_OK);
    nanosleep(&(struct timespec){0, 20000000}, NULL);  // a worker that ran ops early would have run these by now
    for (int i = 0; i < 8; i++) cr_assert_eq(dst[i], 0, "element %d arrived before the sync", i);
    src[0] = 42;  // still the caller's until the wait
    cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
    cr_assert_eq(dst[0], 42);
    for (int i = 1; i < 8; i++) cr_assert_eq(dst[i], i + 1);
    l3d_dev_free(e.dev, dv, sizeof(src), "acts");
    env_close(e);
}

// cpu-async: each stream is its own queue; syncing one leaves another's ops queued; a device
// sync runs them all.
Test(device_test, async_streams_are_separate_queues) {
    env_t e = env_open("cpu-async");
    int32_t a[4] = {1, 2, 3, 4}, got_a[4] = {0}, got_b[4] = {0};
    int32_t *dv;
    cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(a), "acts", (void **)&dv), L3D_OK);
    cr_assert_eq(l3d_dev_copy(e.dev, dv, a, sizeof(a), L3D_COPY_H2D), L3D_OK);
    cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
    void *s;
    cr_assert_eq(l3d_dev_stream_create(e.dev, &s), L3D_OK);
    cr_assert_not_null(s);
    l3d_dev_set_stream(e.dev, s);
    cr_assert_eq(l3d_dev_copy(e.dev, got_b, dv, sizeof(a), L3D_COPY_D2H), L3D_OK);
    l3d_dev_set_stream(e.dev, NULL);
    cr_assert_eq(l3d_dev_copy(e.dev, got_a, dv, sizeof(a), L3D_COPY_D2H), L3D_OK);
    cr_assert_eq(l3d_dev_stream_sync(e.dev, NULL), L3D_OK);  // the default stream only
    cr_assert_eq(got_a[3], 4);
    cr_assert_eq(got_b[3], 0, "the other stream's copy ran with the default stream's");
    cr_assert_eq(l3d_dev_stream_sync(e.dev, s), L3D_OK);
    cr_assert_eq(got_b[3], 4);
    memset(got_b, 0, sizeof(got_b));
    l3d_dev_set_stream(e.dev, s);
    cr_assert_eq(l3d_dev_copy(e.dev, got_b, dv, sizeof(a), L3D_COPY_D2H), L3D_OK);
    l3d_dev_set_stream(e.dev, NULL);
    cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);  // every stream
    cr_assert_eq(got_b[3], 4);
    l3d_dev_stream_destroy(e.dev, s);
    l3d_dev_free(e.dev, dv, sizeof(a), "acts");
    env_close(e);
}

// cpu-async: an op that fails when it runs reports at the wait, as CUDA's launch errors do.
Test(device_test, async_failure_is_reported_at_the_wait) {
    env_t e = env_open("cpu-async");
    int32_t tok[2] = {0, 99};  // 99 is outside a vocabulary of 4
    int32_t *dtok;
    float *table, *out;
    cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(tok), "acts", (void **)&dtok), L3D_OK);
    cr_assert_eq(l3d_dev_alloc(e.dev, 4 * 8 * sizeof(float), "params", (void **)&table), L3D_OK);
    cr_assert_eq(l3d_dev_alloc(e.dev, 2 * 8 * sizeof(float), "acts", (void **)&out), L3D_OK);
    cr_assert_eq(l3d_dev_memset(e.dev, table, 0, 4 * 8 * sizeof(float)), L3D_OK);
    cr_assert_eq(l3d_dev_copy(e.dev, dtok, tok, sizeof(tok), L3D_COPY_H2D), L3D_OK);
    cr_assert_eq(l3d_dev_embedding_fwd(e.dev, out, dtok, table, 2, 8, 4, L3D_FLOAT32,
                                       L3D_FLOAT32), L3D_OK, "queued, not run");
    cr_assert_eq(l3d_dev_sync(e.dev), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK, "a wait reports the failures of its own ops");
    l3d_dev_free(e.dev, dtok, sizeof(tok), "acts");
    l3d_dev_free(e.dev, table, 4 * 8 * sizeof(float), "params");
    l3d_dev_free(e.dev, out, 2 * 8 * sizeof(float), "acts");
    env_close(e);
}

// Selectable wherever a device is named: the registry lists them with the CPU.
Test(device_test, listed_with_the_built_devices) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_device_t *dev;
    cr_assert_eq(l3d_device_create(ctx, "cpu-nonesuch", NULL, &dev), L3D_ERR_UNSUPPORTED);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "cpu, cpu-opaque, cpu-async"), "%s",
              l3d_ctx_last_error(ctx));
    l3d_ctx_destroy(ctx);
}

// cpu-async: an event orders a second stream after the first without a host wait. Without
// the wait, syncing the second stream runs none of the first's ops (a stale read, the bug a
// missing event is on a GPU); with it, that sync runs the first up to the recorded point and
// no further.
Test(device_test, async_events_order_streams) {
    env_t e = env_open("cpu-async");
    float one[4] = {1, 1, 1, 1}, two[4] = {2, 2, 2, 2}, got[4];
    float *buf;
    void *s2, *ev;
    cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(one), "acts", (void **)&buf), L3D_OK);
    cr_assert_eq(l3d_dev_memset(e.dev, buf, 0, sizeof(one)), L3D_OK);
    cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
    cr_assert_eq(l3d_dev_stream_create(e.dev, &s2), L3D_OK);
    cr_assert_eq(l3d_dev_event_create(e.dev, &ev), L3D_OK);
    cr_assert_not_null(ev);
    for (int wait = 0; wait < 2; wait++) {
        cr_assert_eq(l3d_dev_copy(e.dev, buf, wait ? two : one, sizeof(one), L3D_COPY_H2D),
                     L3D_OK);  // on the default stream
        cr_assert_eq(l3d_dev_event_record(e.dev, ev, NULL), L3D_OK);
        cr_assert_eq(l3d_dev_scale(e.dev, buf, 10.0f, 4, L3D_FLOAT32), L3D_OK);  // after it
        if (wait) cr_assert_eq(l3d_dev_stream_wait_event(e.dev, s2, ev), L3D_OK);
        memset(got, 0xff, sizeof(got));
        l3d_dev_set_stream(e.dev, s2);
        cr_assert_eq(l3d_dev_copy(e.dev, got, buf, sizeof(got), L3D_COPY_D2H), L3D_OK);
        l3d_dev_set_stream(e.dev, NULL);
        cr_assert_eq(l3d_dev_stream_sync(e.dev, s2), L3D_OK);
        // no wait: the copy ran before either default-stream op (the memset's zeros);
        // with it: after the H2D of twos, before the scale recorded after the event
        for (int i = 0; i < 4; i++)
            cr_assert_eq(got[i], wait ? 2.0f : 0.0f, "wait %d: got[%d] %g", wait, i,
                         (double)got[i]);
        cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
        if (!wait) cr_assert_eq(l3d_dev_memset(e.dev, buf, 0, sizeof(one)), L3D_OK);
    }
    cr_assert_eq(l3d_dev_copy(e.dev, got, buf, sizeof(got), L3D_COPY_D2H), L3D_OK);
    cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
    cr_assert_eq(got[0], 20.0f, "the scale ran at the full sync");
    l3d_dev_event_destroy(e.dev, ev);
    l3d_dev_stream_destroy(e.dev, s2);
    l3d_dev_free(e.dev, buf, sizeof(one), "acts");
    env_close(e);
}

// The norm's per-rank parts summed on the device, and AdamW clipping with that device scalar
// and skipping a non-finite one: the CPU device's numbers on every device, and the clipped
// step equal to the unclipped entry given the coefficient torch's clip_grad_norm_ computes
// (l3d_clip_coef) on the host.
Test(device_test, norm_and_adamw_read_device_memory) {
    const char *all[] = {"cpu", "cpu-opaque", "cpu-async"};
    enum { N = 40 };
    float ref_p[3][N];
    for (int d = 0; d < 3; d++) {
        env_t e = env_open(all[d]);
        double parts[3] = {1.5, 0.25e-3, 2.75}, *dn, s;
        float p0[N], g0[N], *p, *g, *m, *v;
        for (int i = 0; i < N; i++) p0[i] = 0.01f * (float)i - 0.2f, g0[i] = 0.5f - 0.03f * (float)i;
        size_t fb = sizeof(p0);
        cr_assert_eq(l3d_dev_alloc(e.dev, 4 * sizeof(double), "other", (void **)&dn), L3D_OK);
        cr_assert_eq(l3d_dev_alloc(e.dev, fb, "params", (void **)&p), L3D_OK);
        cr_assert_eq(l3d_dev_alloc(e.dev, fb, "grads", (void **)&g), L3D_OK);
        cr_assert_eq(l3d_dev_alloc(e.dev, fb, "optim", (void **)&m), L3D_OK);
        cr_assert_eq(l3d_dev_alloc(e.dev, fb, "optim", (void **)&v), L3D_OK);
        cr_assert_eq(l3d_dev_copy(e.dev, dn + 1, parts, sizeof(parts), L3D_COPY_H2D), L3D_OK);
        cr_assert_eq(l3d_dev_sum_f64(e.dev, dn, dn + 1, 3), L3D_OK);
        cr_assert_eq(l3d_dev_copy(e.dev, &s, dn, sizeof(s), L3D_COPY_D2H), L3D_OK);
        cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
        cr_assert(s == (1.5 + 0.25e-3) + 2.75, "%s: sum %.17g", all[d], s);
        // gradients scaled by S = 4: the norm is sqrt(s) / 4 = 0.5 > max_norm 0.25, so clipped
        float S = 4.0f, max_norm = 0.25f;
        // (host memory given to a copy stays valid until the wait: cpu-async reads it there)
        double inf = INFINITY;
        float coef = l3d_clip_coef(sqrt(s) / S, max_norm);
        cr_assert(coef < 1.0f);
        float hp[N], hm[N] = {0}, got[N];
        memcpy(hp, p0, fb);
        for (int run = 0; run < 3; run++) {
            cr_assert_eq(l3d_dev_copy(e.dev, p, p0, fb, L3D_COPY_H2D), L3D_OK);
            cr_assert_eq(l3d_dev_copy(e.dev, g, g0, fb, L3D_COPY_H2D), L3D_OK);
            cr_assert_eq(l3d_dev_memset(e.dev, m, 0, fb), L3D_OK);
            cr_assert_eq(l3d_dev_memset(e.dev, v, 0, fb), L3D_OK);
            if (run == 2)  // a non-finite norm: nothing moves
                cr_assert_eq(l3d_dev_copy(e.dev, dn, &inf, sizeof(inf), L3D_COPY_H2D), L3D_OK);
            // run 0: the coefficient from the device scalar; run 1: given by the host
            cr_assert_eq(l3d_dev_adamw(e.dev, p, g, m, v, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                                       0.1f, 0.05f, run == 1 ? coef * (1.0f / S) : 1.0f / S,
                                       run == 1 ? NULL : dn, max_norm, L3D_FLOAT32), L3D_OK);
            cr_assert_eq(l3d_dev_copy(e.dev, run ? got : hp, p, fb, L3D_COPY_D2H), L3D_OK);
            cr_assert_eq(l3d_dev_copy(e.dev, hm, m, fb, L3D_COPY_D2H), L3D_OK);
            cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
            if (run == 1) cr_assert(!memcmp(got, hp, fb), "%s: device clip != host clip", all[d]);
            if (run == 2)
                cr_assert(!memcmp(got, p0, fb) && hm[0] == 0.0f, "%s: a non-finite norm "
                          "updated the parameters", all[d]);
        }
        cr_assert(hp[3] != p0[3]);
        memcpy(ref_p[d], hp, fb);
        cr_assert(!memcmp(ref_p[d], ref_p[0], fb), "%s: not the cpu device's step", all[d]);
        l3d_dev_free(e.dev, dn, 4 * sizeof(double), "other");
        l3d_dev_free(e.dev, p, fb, "params");
        l3d_dev_free(e.dev, g, fb, "grads");
        l3d_dev_free(e.dev, m, fb, "optim");
        l3d_dev_free(e.dev, v, fb, "optim");
        env_close(e);
    }
}

// The communicator stages device buffers through the device's bounce buffers: kept from one
// call to the next (the same host memory, not a new allocation), never shared by two calls in
// flight (more calls than buffers take schedule temporaries, with right results), and freed
// when the communicator's device changes.
Test(device_test, staging_keeps_its_bounce_buffers) {
    env_t e = env_open("cpu-async");
    l3d_comm_t *c;
    cr_assert_eq(l3d_comm_create_local(e.ctx, 1, &c), L3D_OK);
    cr_assert_eq(l3d_comm_set_device(c, e.dev), L3D_OK);
    enum { N = 1 << 16, K = 6 };  // 6 calls in flight hold 12 buffers: more than the device's 8
    float *src[K], *dst[K], host[N];
    l3d_request_t *req[K];
    for (int k = 0; k < K; k++) {
        cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(host), "acts", (void **)&src[k]), L3D_OK);
        cr_assert_eq(l3d_dev_alloc(e.dev, sizeof(host), "acts", (void **)&dst[k]), L3D_OK);
        for (int i = 0; i < N; i++) host[i] = (float)(k * N + i);
        cr_assert_eq(l3d_dev_copy(e.dev, src[k], host, sizeof(host), L3D_COPY_H2D), L3D_OK);
        cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
    }
    void *kept[L3D_DEVICE_BOUNCE];
    for (int round = 0; round < 3; round++) {
        int inflight = round == 2 ? K : 1;
        for (int k = 0; k < K; k += inflight) {
            for (int j = k; j < k + inflight; j++)
                cr_assert_eq(l3d_comm_iallreduce(c, src[j], dst[j], N, L3D_FLOAT32, L3D_SUM,
                                                 &req[j]), L3D_OK);
            for (int j = k; j < k + inflight; j++) cr_assert_eq(l3d_request_wait(req[j]), L3D_OK);
        }
        for (int k = 0; k < K; k++) {
            cr_assert_eq(l3d_dev_copy(e.dev, host, dst[k], sizeof(host), L3D_COPY_D2H), L3D_OK);
            cr_assert_eq(l3d_dev_sync(e.dev), L3D_OK);
            for (int i = 0; i < N; i += 997)
                cr_assert_eq(host[i], (float)(k * N + i), "round %d call %d [%d]", round, k, i);
        }
        int held = 0;
        for (int i = 0; i < L3D_DEVICE_BOUNCE; i++) {
            cr_assert_eq(e.dev->bounce[i].busy, 0, "round %d: buffer %d still held", round, i);
            held += e.dev->bounce[i].p != NULL;
            if (round == 1) cr_assert_eq(e.dev->bounce[i].p, kept[i], "round 1: buffer %d "
                                         "replaced", i);
            kept[i] = e.dev->bounce[i].p;
        }
        cr_assert_geq(held, 1, "round %d: no bounce buffer kept", round);
    }
    cr_assert_eq(l3d_comm_set_device(c, NULL), L3D_OK);
    for (int i = 0; i < L3D_DEVICE_BOUNCE; i++) cr_assert_null(e.dev->bounce[i].p);
    for (int k = 0; k < K; k++) {
        l3d_dev_free(e.dev, src[k], sizeof(host), "acts");
        l3d_dev_free(e.dev, dst[k], sizeof(host), "acts");
    }
    l3d_comm_destroy(c);
    env_close(e);
}

// Converting a buffer in place, in chunks through a small scratch (ZeRO-2/3 round a gradient
// window into 16 bits where it is): the same bits as one convert into another buffer, for
// narrowing and widening, whole chunks and a short last one, and a buffer shorter than a chunk.
// buf (n elements of src_t, device) converted to dst_t in place through scratch (chunk
// elements) gives the bytes of one convert of `from` (buf's contents, read first) into ref.
static void in_place_matches(l3d_device_t *dev, void *buf, const void *from, void *ref,
                             l3d_dtype dst_t, l3d_dtype src_t, size_t n, void *scratch,
                             size_t chunk, float *got, float *want, const char *what) {
    size_t bytes = n * l3d_dtype_size(dst_t);
    cr_assert_eq(l3d_dev_convert(dev, ref, dst_t, from, src_t, n), L3D_OK);
    cr_assert_eq(l3d_dev_convert_in_place(dev, buf, dst_t, src_t, n, scratch, chunk), L3D_OK);
    cr_assert_eq(l3d_dev_copy(dev, got, buf, bytes, L3D_COPY_D2H), L3D_OK);
    cr_assert_eq(l3d_dev_copy(dev, want, ref, bytes, L3D_COPY_D2H), L3D_OK);
    cr_assert_eq(l3d_dev_sync(dev), L3D_OK);
    cr_assert(!memcmp(got, want, bytes), "%s: %zu from %s to %s", what, n,
              l3d_dtype_name(src_t), l3d_dtype_name(dst_t));
}

Test(device_test, convert_in_place_equals_convert) {
    const char *all[] = {"cpu", "cpu-opaque", "cpu-async"};
    const size_t lens[] = {1000, 64 * 5, 40, 1};
    for (int d = 0; d < 3; d++) {
        env_t e = env_open(all[d]);
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            size_t n = lens[li], chunk = 64;
            float *src = malloc(n * 4), *got = malloc(n * 4), *want = malloc(n * 4);
            for (size_t i = 0; i < n; i++) src[i] = 1.0f / (float)(i + 3) - 0.01f * (float)i;
            for (l3d_dtype h = L3D_BFLOAT16; h <= L3D_FLOAT16; h++) {
                void *buf, *ref, *scratch, *h16;
                cr_assert_eq(l3d_dev_alloc(e.dev, n * 4, "acts", &buf), L3D_OK);
                cr_assert_eq(l3d_dev_alloc(e.dev, n * 4, "acts", &ref), L3D_OK);
                cr_assert_eq(l3d_dev_alloc(e.dev, chunk * 2, "acts", &scratch), L3D_OK);
                cr_assert_eq(l3d_dev_alloc(e.dev, n * 2, "acts", &h16), L3D_OK);
                cr_assert_eq(l3d_dev_copy(e.dev, buf, src, n * 4, L3D_COPY_H2D), L3D_OK);
                // narrowing, then widening back (from a copy of the 16-bit values)
                in_place_matches(e.dev, buf, buf, ref, h, L3D_FLOAT32, n, scratch, chunk, got,
                                 want, all[d]);
                cr_assert_eq(l3d_dev_copy(e.dev, h16, buf, n * 2, L3D_COPY_D2D), L3D_OK);
                in_place_matches(e.dev, buf, h16, ref, L3D_FLOAT32, h, n, scratch, chunk, got,
                                 want, all[d]);
                cr_assert(got[n / 2] != src[n / 2] || n == 1, "%s: nothing was rounded", all[d]);
                l3d_dev_free(e.dev, h16, n * 2, "acts");
                l3d_dev_free(e.dev, buf, n * 4, "acts");
                l3d_dev_free(e.dev, ref, n * 4, "acts");
                l3d_dev_free(e.dev, scratch, chunk * 2, "acts");
            }
            free(src), free(got), free(want);
        }
        env_close(e);
    }
}
