// Failure model: a rank that stops participating (aborts, goes silent, or its process exits)
// makes every other rank's collective fail with L3D_ERR_PEER_FAILED or L3D_ERR_TIMEOUT within
// about L3D_COMM_TIMEOUT, with a detail naming the dead rank; later calls fail at once.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/comm/comm_internal.h"
#include "llama3d/comm.h"
#include "tests/harness/world.h"

#define TIMEOUT_S 5.0  // above the scheduling stalls of 5 busy ranks beside another test on 2 cores
#define BOUND_S (3 * TIMEOUT_S + 2)  // timeout + grace + generous scheduling slack
#define DEAD 2

enum { MODE_ABORT, MODE_SILENT, MODE_EXIT };
static const char *mode_name[] = {"abort", "silent", "exit"};

typedef struct fail_param {
    char tp[16];
    int mode;
    char algo[32];
    int small;  // 8 floats: the process transports' shared segment, the local eager slots
} fail_param_t;

typedef struct fail_arg {
    int mode;
    int n;
} fail_arg_t;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    const fail_arg_t *fa = arg;
    int me = l3d_comm_rank(c);
    const int N = fa->n;
    float *x = malloc((size_t)N * 4), *y = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) x[i] = (float)me;
    // One healthy collective first: the failure happens in the middle of the job. Rank 2 may
    // finish its part of it and die while the others are still completing it, so the
    // survivors' failure may come in this first call already.
    l3d_status st = L3D_OK;
    double t0 = now(), dt = 0;
    for (int it = 0; it < (me == DEAD ? 1 : 3) && st == L3D_OK; it++) {
        t0 = now();
        st = l3d_comm_allreduce(c, x, y, N, L3D_FLOAT32, L3D_SUM);
        dt = now() - t0;
    }
    if (me == DEAD) {
        free(x);
        free(y);
        if (st != L3D_OK) {
            snprintf(err, errlen, "first allreduce: %s", l3d_ctx_last_error(l3d_comm_ctx(c)));
            return 1;
        }
        if (fa->mode == MODE_ABORT) l3d_comm_abort(c);
        if (fa->mode == MODE_EXIT) _exit(0);
        return 0;  // silent: just stop taking part
    }
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", l3d_ctx_last_error(l3d_comm_ctx(c)));
    int rc = 0;
    if (st != L3D_ERR_PEER_FAILED && st != L3D_ERR_TIMEOUT) {
        snprintf(err, errlen, "allreduce returned %d (%s)", (int)st, detail);
        rc = 1;
    } else if (dt > BOUND_S) {
        snprintf(err, errlen, "failed only after %.1f s (bound %.1f s): %s", dt, BOUND_S, detail);
        rc = 1;
    } else if (!strstr(detail, "rank 2")) {
        snprintf(err, errlen, "detail does not name rank 2: %s", detail);
        rc = 1;
    } else {
        // The communicator is failed now: later calls return at once.
        t0 = now();
        st = l3d_comm_allreduce(c, x, y, N, L3D_FLOAT32, L3D_SUM);
        if (st != L3D_ERR_PEER_FAILED || now() - t0 > 1.0) {
            snprintf(err, errlen, "call after the failure returned %d after %.1f s", (int)st,
                     now() - t0);
            rc = 1;
        }
    }
    free(x);
    free(y);
    return rc;
}

static struct criterion_test_params fail_params(void) {
    static const char *algos[] = {"", "allreduce:ring", "allreduce:rabenseifner", ""};
    static fail_param_t ps[8 * 2 * 4];
    const char *names[8];
    int nt = l3d_world_transports(names, 8);
    size_t n = 0;
    for (int t = 0; t < nt; t++) {
        int local = !strcmp(names[t], "local");
        int modes[2] = {MODE_ABORT, local ? MODE_SILENT : MODE_EXIT};
        for (int m = 0; m < 2; m++)
            for (int a = 0; a < 4; a++) {
                snprintf(ps[n].tp, sizeof(ps[n].tp), "%s", names[t]);
                ps[n].mode = modes[m];
                snprintf(ps[n].algo, sizeof(ps[n].algo), "%s", algos[a]);
                ps[n].small = a == 3;
                n++;
            }
    }
    return cr_make_param_array(fail_param_t, ps, n);
}

ParameterizedTestParameters(comm_fail, dead_rank) { return fail_params(); }
ParameterizedTest(fail_param_t *p, comm_fail, dead_rank, .timeout = 120) {
    char v[16];
    snprintf(v, sizeof(v), "%g", TIMEOUT_S);
    setenv("L3D_COMM_TIMEOUT", v, 1);
    setenv("L3D_ALGO", p->algo, 1);
    fail_arg_t fa = {p->mode, p->small ? 8 : 4099};
    for (int n = 4; n <= 5; n++) {
        int rcs[8];
        char errs[8][256];
        cr_assert_eq(l3d_world_run_all(p->tp, n, fail_fn, &fa, 60, rcs, errs), 0);
        for (int r = 0; r < n; r++)
            cr_expect_eq(rcs[r], 0, "%s %s [%s]%s %d ranks: rank %d: rc %d: %s", p->tp,
                         mode_name[p->mode], p->algo, p->small ? " small" : "", n, r, rcs[r],
                         errs[r]);
    }
}

// Abort before anyone else even starts: the others fail fast, without waiting for the timeout.
static int early_abort_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    int me = l3d_comm_rank(c), x = me, y = 0;
    if (me == DEAD) {
        l3d_comm_abort(c);
        l3d_comm_abort(c);  // idempotent
        if (l3d_comm_barrier(c) != L3D_ERR_PEER_FAILED) {
            snprintf(err, errlen, "the aborted rank's own barrier did not fail");
            return 1;
        }
        return 0;
    }
    l3d_status st = L3D_OK;
    // Some iterations may complete among the survivors only if they do not involve rank 2;
    // the barrier involves everyone.
    for (int i = 0; i < 3 && st == L3D_OK; i++)
        st = l3d_comm_allreduce(c, &x, &y, 1, L3D_INT32, L3D_MAX);
    if (st != L3D_ERR_PEER_FAILED && st != L3D_ERR_TIMEOUT) {
        snprintf(err, errlen, "allreduce returned %d", (int)st);
        return 1;
    }
    return 0;
}

ParameterizedTestParameters(comm_fail, early_abort) {
    static fail_param_t ps[8];
    const char *names[8];
    int nt = l3d_world_transports(names, 8);
    for (int t = 0; t < nt; t++) snprintf(ps[t].tp, sizeof(ps[t].tp), "%s", names[t]);
    return cr_make_param_array(fail_param_t, ps, (size_t)nt);
}
ParameterizedTest(fail_param_t *p, comm_fail, early_abort, .timeout = 60) {
    setenv("L3D_COMM_TIMEOUT", "2", 1);
    char err[512] = "";
    cr_assert_eq(l3d_world_run(p->tp, 3, early_abort_fn, NULL, 30, err, sizeof(err)), 0, "%s",
                 err);
}

// Mismatched calls (a rank asks for a different count) of small collectives (the local
// transport's eager slots, the process transports' shared segment): every rank fails at once
// with L3D_ERR_INVALID_ARG or PEER_FAILED and a detail naming both shapes, instead of reading
// past a peer's buffer or waiting for the timeout.
static int mismatch_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    int me = l3d_comm_rank(c);
    float x[64] = {0}, y[64];
    size_t count = me == 1 ? 64 : 32;
    double t0 = now();
    l3d_status st = l3d_comm_allreduce(c, x, y, count, L3D_FLOAT32, L3D_SUM);
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", l3d_ctx_last_error(l3d_comm_ctx(c)));
    if (st != L3D_ERR_INVALID_ARG && st != L3D_ERR_PEER_FAILED) {
        snprintf(err, errlen, "allreduce returned %d (%s)", (int)st, detail);
        return 1;
    }
    if (now() - t0 > 1.0 || !strstr(detail, "count 64") || !strstr(detail, "count 32")) {
        snprintf(err, errlen, "after %.1f s: detail does not show both counts: %s", now() - t0,
                 detail);
        return 1;
    }
    return 0;
}

ParameterizedTestParameters(comm_fail, small_mismatch) {
    static fail_param_t ps[8];
    const char *names[8];
    int nt = l3d_world_transports(names, 8);
    for (int t = 0; t < nt; t++) snprintf(ps[t].tp, sizeof(ps[t].tp), "%s", names[t]);
    return cr_make_param_array(fail_param_t, ps, (size_t)nt);
}
ParameterizedTest(fail_param_t *p, comm_fail, small_mismatch, .timeout = 60) {
    setenv("L3D_COMM_TIMEOUT", "30", 1);
    setenv("L3D_ALGO", "", 1);
    int rcs[8];
    char errs[8][256];
    cr_assert_eq(l3d_world_run_all(p->tp, 3, mismatch_fn, NULL, 30, rcs, errs), 0);
    for (int r = 0; r < 3; r++) cr_expect_eq(rcs[r], 0, "%s: rank %d: %s", p->tp, r, errs[r]);
}

// A rank that learns of a failure through a rank that gave up because of it. 4 ranks, split
// into {0, 3} {1, 2} and {0, 1} {2, 3}: rank 3 dies; rank 0, waiting on it in {0, 3}, names it
// and aborts, as `l3d train` does after any failure; rank 1 is in a small allreduce on {0, 1}
// (the shared segment: no transport message tells it anything, only the notices do). Rank 1
// must name rank 3, the rank that failed, not rank 0, the messenger (before: "allreduce: rank 0
// failed: reported by a peer", every run). Rank 3 exits (the notice reaches rank 1 only
// through rank 0) or aborts (rank 1 also hears it from rank 3, and the member of {0, 1} that
// stopped is still not the rank to name). Process transports only: on the local one rank 0's
// notice of its own abort is dropped unless rank 1 takes it within abort's 20 ms, which a
// loaded machine does not guarantee (notice_carries_cause covers the local transport).
typedef struct relay_arg {
    int mode;
    char marker[64];  // created by rank 0 once it has aborted; rank 2 waits for it
} relay_arg_t;

// Waits (60 s at most) until `path` exists; 0 when it does.
static int wait_file(const char *path) {
    for (int i = 0; i < 6000; i++) {
        if (access(path, F_OK) == 0) return 0;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    return -1;
}

// marker + suffix, e.g. "<marker>.ready1": rank 1 is past the set-up
static void marker_name(const relay_arg_t *ra, const char *suffix, int r, char *out, size_t cap) {
    snprintf(out, cap, "%s.%s%d", ra->marker, suffix, r);
}

static int relay_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    const relay_arg_t *ra = arg;
    int me = l3d_comm_rank(c), rc = 0;
    l3d_comm_t *a = NULL, *b = NULL;
    if (l3d_comm_split(c, me == 0 || me == 3 ? 0 : 1, me, &a) != L3D_OK ||
        l3d_comm_split(c, me < 2 ? 0 : 1, me, &b) != L3D_OK || l3d_comm_barrier(c) != L3D_OK) {
        snprintf(err, errlen, "set-up: %s", l3d_ctx_last_error(l3d_comm_ctx(c)));
        l3d_comm_destroy(b);
        l3d_comm_destroy(a);
        return 1;
    }
    // Rank 3 goes once every rank is past the set-up: its abort notice would fail the barrier
    // of a rank still finishing it.
    char name[96];
    marker_name(ra, "ready", me, name, sizeof(name));
    FILE *rf = fopen(name, "w");
    if (rf) fclose(rf);
    for (int r = 0; r < 3 && me == 3; r++) {
        marker_name(ra, "ready", r, name, sizeof(name));
        if (wait_file(name) < 0) rc = 1;
    }
    if (me == 3 && rc) snprintf(err, errlen, "the others never finished the set-up");
    else if (me == 3 && ra->mode == MODE_EXIT) _exit(0);
    else if (me == 3) l3d_comm_abort(c);
    float x[8] = {0}, y[8];
    if (me == 0) {
        l3d_status st = l3d_comm_recv(a, x, 8, L3D_FLOAT32, 1);
        const char *detail = l3d_ctx_last_error(l3d_comm_ctx(c));
        if (st >= 0 || !strstr(detail, "rank 3")) {
            snprintf(err, errlen, "rank 0's recv from rank 3 returned %d: %s", (int)st, detail);
            rc = 1;
        }
        l3d_comm_abort(c);
        FILE *f = fopen(ra->marker, "w");
        if (f) fclose(f);
    } else if (me == 1) {
        l3d_status st = l3d_comm_allreduce(b, x, y, 8, L3D_FLOAT32, L3D_SUM);
        const char *detail = l3d_ctx_last_error(l3d_comm_ctx(c));
        if (st != L3D_ERR_PEER_FAILED || !strstr(detail, "rank 3 failed") ||
            strstr(detail, "rank 0 failed")) {
            snprintf(err, errlen, "allreduce returned %d: %s", (int)st, detail);
            rc = 1;
        }
    } else if (me == 2) {  // out of the way until rank 0 is done
        (void)wait_file(ra->marker);
    }
    l3d_comm_destroy(b);
    l3d_comm_destroy(a);
    return rc;
}

ParameterizedTestParameters(comm_fail, relayed_cause) {
    static fail_param_t ps[16];
    const char *names[8];
    int nt = l3d_world_transports(names, 8);
    size_t n = 0;
    for (int t = 0; t < nt; t++)
        for (int m = 0; m < 2 && strcmp(names[t], "local"); m++) {
            snprintf(ps[n].tp, sizeof(ps[n].tp), "%s", names[t]);
            ps[n++].mode = m == 0 ? MODE_ABORT : MODE_EXIT;
        }
    return cr_make_param_array(fail_param_t, ps, n);
}
ParameterizedTest(fail_param_t *p, comm_fail, relayed_cause, .timeout = 90) {
    setenv("L3D_COMM_TIMEOUT", "20", 1);  // no wait should come near it
    setenv("L3D_ALGO", "", 1);
    relay_arg_t ra = {.mode = p->mode};
    snprintf(ra.marker, sizeof(ra.marker), "/tmp/l3d-relay-%d-%s", (int)getpid(), p->tp);
    char names[5][96];
    snprintf(names[0], sizeof(names[0]), "%s", ra.marker);
    for (int r = 0; r < 4; r++) marker_name(&ra, "ready", r, names[r + 1], sizeof(names[0]));
    for (int i = 0; i < 5; i++) unlink(names[i]);
    int rcs[8];
    char errs[8][256];
    cr_assert_eq(l3d_world_run_all(p->tp, 4, relay_fn, &ra, 60, rcs, errs), 0);
    for (int i = 0; i < 5; i++) unlink(names[i]);
    for (int r = 0; r < 4; r++)
        cr_expect_eq(rcs[r], 0, "%s %s: rank %d: %s", p->tp, mode_name[p->mode], r, errs[r]);
}

// A notice passed on carries the first failure with it, and a communicator whose member
// stopped after a failure outside it names that failure. Rank 0 knows rank 3 failed (its own
// detail, never sent) and passes on that rank 2 is dead; rank 1 hears only that notice. Its
// call on {1, 2} must name rank 3 with rank 0's detail, not rank 2, and so must its call on the
// world (before: rank 2, "reported by a peer"; only a rank's notice about itself carried the
// failure it stopped after). The local transport: every notice here is the first from its
// sender, taken by the receive posted at creation, so none can be lost.
static int carry_fn(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    const relay_arg_t *ra = arg;
    l3d_world_t *w = c->world;
    int me = l3d_comm_rank(c), x = 1, y = 0;
    l3d_comm_t *sub = NULL;  // {1, 2} and {0, 3}
    if (l3d_comm_split(c, me == 1 || me == 2, me, &sub) != L3D_OK) {
        snprintf(err, errlen, "split: %s", l3d_ctx_last_error(l3d_comm_ctx(c)));
        return 1;
    }
    // Rank 0 starts once every rank is past the split: its notices would fail a split that
    // is still finishing.
    char name[96];
    marker_name(ra, "ready", me, name, sizeof(name));
    FILE *rf = fopen(name, "w");
    if (rf) fclose(rf);
    for (int r = 1; r < 4 && me == 0; r++) {
        marker_name(ra, "ready", r, name, sizeof(name));
        if (wait_file(name) < 0) {
            snprintf(err, errlen, "rank %d never finished the split", r);
            l3d_comm_destroy(sub);
            return 1;
        }
    }
    int rc = 0;
    if (me == 0) {
        l3d_world_mark_dead(w, 3, "rank 3's own detail");
        l3d_world_declare_dead(w, 2, "stopped after rank 3");
        l3d_world_flush_notices(w, 30);
    } else if (me == 1) {
        l3d_status st = l3d_comm_allreduce(sub, &x, &y, 1, L3D_INT32, L3D_SUM);
        char d1[512];
        snprintf(d1, sizeof(d1), "%s", l3d_ctx_last_error(l3d_comm_ctx(c)));
        l3d_status st2 = l3d_comm_allreduce(c, &x, &y, 1, L3D_INT32, L3D_SUM);
        const char *d2 = l3d_ctx_last_error(l3d_comm_ctx(c));
        if (st != L3D_ERR_PEER_FAILED ||
            !strstr(d1, "world rank 3 failed: rank 3's own detail (reported by rank 0) (then "
                        "rank 1 (world rank 2) stopped)")) {
            snprintf(err, errlen, "allreduce on {1, 2} returned %d: %s", (int)st, d1);
            rc = 1;
        } else if (st2 != L3D_ERR_PEER_FAILED ||
                   !strstr(d2, "rank 3 failed: rank 3's own detail")) {
            snprintf(err, errlen, "allreduce on the world returned %d: %s", (int)st2, d2);
            rc = 1;
        }
        // the world's record, for callers whose context did not get the words (cli/ranks.c)
        char why[256];
        if (!rc && (!l3d_comm_failure(sub, why, sizeof(why)) ||
                    strcmp(why, "rank 3 failed: rank 3's own detail (reported by rank 0)"))) {
            snprintf(err, errlen, "l3d_comm_failure: '%s'", why);
            rc = 1;
        }
    }
    l3d_comm_destroy(sub);
    return rc;
}

Test(comm_fail, notice_carries_cause, .timeout = 60) {
    setenv("L3D_COMM_TIMEOUT", "20", 1);  // no wait should come near it
    setenv("L3D_ALGO", "", 1);
    relay_arg_t ra = {.mode = MODE_ABORT};
    snprintf(ra.marker, sizeof(ra.marker), "/tmp/l3d-carry-%d", (int)getpid());
    char names[4][96];
    for (int r = 0; r < 4; r++) marker_name(&ra, "ready", r, names[r], sizeof(names[0]));
    for (int r = 0; r < 4; r++) unlink(names[r]);
    int rcs[4];
    char errs[4][256];
    cr_assert_eq(l3d_world_run_all("local", 4, carry_fn, &ra, 60, rcs, errs), 0);
    for (int r = 0; r < 4; r++) unlink(names[r]);
    for (int r = 0; r < 4; r++) cr_expect_eq(rcs[r], 0, "rank %d: %s", r, errs[r]);
}
