// communication_data_type and fp32_allreduce: data parallelism reduces the gradients in the
// dtype DeepSpeed would. Two ranks as threads; each rank's gradient buckets are filled with
// known values through the trainer's own hooks (the arena at stages 0-1, the windows the
// backward asks for at stages 2-3), reduced by the trainer, and compared bit for bit with the
// rule written here from the formats' definitions: each rank's value rounded to the dtype
// (to nearest, ties to even), the two added in float32 (the comm core's accumulator; with two
// addends the order cannot matter) and the sum rounded once. Then whole runs: the counted
// traffic equals the plan (half the gradient bytes), the memory the estimate (the 16-bit
// copies), and the first step's loss is the float32 run's (the forward does not communicate
// gradients).
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/parallel.h"

// x rounded to t (to nearest, ties to even), from the definitions: bfloat16 keeps 8
// significant bits and float32's exponent range; float16 11 bits, normal from 2^-14, spaced
// 2^-24 below, largest finite 65504. rint rounds ties to even (the default rounding mode).
static float round_to(l3d_dtype t, float x) {
    if (t == L3D_FLOAT32 || x == 0.0f || !isfinite(x)) return x;
    int e;
    (void)frexp(x, &e);  // |x| in [2^(e-1), 2^e)
    int bits = t == L3D_BFLOAT16 ? 8 : 11, emin = t == L3D_BFLOAT16 ? -125 : -13;
    double quantum = ldexp(1.0, (e < emin ? emin : e) - bits);
    double r = rint((double)x / quantum) * quantum;
    if (t == L3D_FLOAT16 && fabs(r) > 65504.0) return copysignf(INFINITY, x);
    return (float)r;
}

// Rank r's gradient at arena element i: a spread of magnitudes (1e-4 to 1) with bits below
// the 16-bit formats' precision, and signs that make the two ranks cancel at times.
static float grad_value(int r, size_t i) {
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(r + 1) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    double u = (double)(h >> 11) / 9007199254740992.0;  // [0, 1)
    double mag = pow(10.0, -4.0 * ((h >> 3) % 1000) / 1000.0);
    return (float)((u < 0.5 ? -1.0 : 1.0) * mag * (1.0 + u));
}

static float expected(l3d_dtype t, size_t i) {
    float s = round_to(t, grad_value(0, i)) + round_to(t, grad_value(1, i));  // float32 add
    return round_to(t, s);
}

typedef struct {
    int zero, cdt, fp32_allreduce, r;
    l3d_comm_t *comm;
    size_t checked, wrong, first_bad;
    float got, want;
    char err[256];
} cdt_arg_t;

static void note_value(cdt_arg_t *a, size_t i, float got, float want) {
    a->checked++;
    if (memcmp(&got, &want, sizeof(got)) == 0) return;
    if (!a->wrong++) a->first_bad = i, a->got = got, a->want = want;
}

static l3d_status fill_and_reduce(cdt_arg_t *a, l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    l3d_acts_t *acts = t->pp.slots[0];
    l3d_dp_arm(t, acts, 1);
    if (!d->zero2) {
        float *g = t->grads;  // (float32 gradients here: grad_accum_dtype unset)
        for (size_t i = 0; i < d->Ppad; i++) g[i] = i < m->n_params ? grad_value(a->r, i) : 0;
        return l3d_dp_reduce_finish(t);  // starts every bucket, waits, widens back
    }
    memset(d->gshard, 0, d->shard_len * sizeof(float));
    for (int g = l3d_model_grad_groups(m) - 1; g >= 0; g--) {  // the backward's order
        size_t lo, n;
        void *wv;
        l3d_model_grad_group(m, g, &lo, &n, NULL);
        L3D_CHECK(t->ctx, acts->grad_window(acts->grad_ready_arg, lo, lo + n, &wv));
        float *w = wv;
        for (size_t i = 0; i < n; i++) w[i] = grad_value(a->r, lo + i);
        L3D_CHECK(t->ctx, acts->grad_ready(acts->grad_ready_arg, lo));
    }
    return l3d_dp_reduce_finish(t);
}

static void *cdt_rank(void *p) {
    cdt_arg_t *a = p;
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    layout_t L = {2, 1, 1, a->zero, 0, 2, 3000, 0, 0, 0};  // several buckets at stages 0-1
    l3d_train_config_t cfg;
    config(ctx, &L, &cfg);
    cfg.comm_dtype = a->cdt;
    cfg.fp32_allreduce = a->fp32_allreduce;
    // The gradients are written and read here, on the host: the CPU device whatever
    // L3D_DEVICE says (the reductions' math is what this test checks; the test devices run
    // the same collectives through host staging: test_parallel_devices.c).
    snprintf(cfg.device, sizeof(cfg.device), "cpu");
    l3d_trainer_t *t = NULL;
    l3d_status st = l3d_train_config_finalize(ctx, &cfg);
    if (st == L3D_OK) st = l3d_trainer_create_parallel(ctx, &cfg, a->comm, &t);
    if (st == L3D_OK) st = fill_and_reduce(a, t);
    l3d_dtype want_t = a->fp32_allreduce || a->cdt < 0 ? L3D_FLOAT32 : (l3d_dtype)a->cdt;
    for (int k = 0; st == L3D_OK && k < t->dp.nb; k++) {
        const l3d_dp_bucket_t *b = &t->dp.b[k];
        // Stage 0 holds every element reduced; the others this rank's piece (its shard).
        size_t lo = t->dp.sharded ? b->off + (size_t)a->r * b->q : b->off;
        size_t n = t->dp.sharded ? b->q : b->len;
        for (size_t j = 0; j < n; j++) {
            size_t i = lo + j;
            int real = i < t->model->n_params && (!t->dp.zero2 || i < b->end);
            float got = t->dp.zero2 ? t->dp.gshard[b->sh + j] : ((const float *)t->grads)[i];
            note_value(a, i, got, real ? expected(want_t, i) : 0.0f);
        }
    }
    if (st != L3D_OK) {
        snprintf(a->err, sizeof(a->err), "%s", l3d_ctx_last_error(ctx));
        l3d_comm_abort(a->comm);
    }
    l3d_trainer_destroy(t);
    l3d_ctx_destroy(ctx);
    return NULL;
}

static void reduce_case(int zero, int cdt, int fp32_allreduce) {
    make_data();
    l3d_ctx_t *wctx;
    cr_assert_eq(l3d_ctx_create(NULL, &wctx), L3D_OK);
    l3d_comm_t *comms[2];
    cr_assert_eq(l3d_comm_create_local(wctx, 2, comms), L3D_OK);
    cdt_arg_t a[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        a[r] = (cdt_arg_t){.zero = zero, .cdt = cdt, .fp32_allreduce = fp32_allreduce, .r = r,
                           .comm = comms[r]};
        cr_assert_eq(pthread_create(&th[r], NULL, cdt_rank, &a[r]), 0);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        l3d_comm_destroy(comms[r]);
        cr_assert_eq(a[r].err[0], 0, "zero %d cdt %d rank %d: %s", zero, cdt, r, a[r].err);
        cr_assert(a[r].checked > 10000, "rank %d checked %zu", r, a[r].checked);
        cr_assert_eq(a[r].wrong, 0, "ZeRO-%d in %s%s, rank %d: %zu of %zu wrong, first [%zu] %.9g "
                     "vs %.9g", zero, cdt < 0 ? "default" : l3d_dtype_name((l3d_dtype)cdt),
                     fp32_allreduce ? " under fp32_allreduce" : "", r, a[r].wrong, a[r].checked,
                     a[r].first_bad, (double)a[r].got, (double)a[r].want);
    }
    l3d_ctx_destroy(wctx);
}

Test(parallel_cdt, reduction_in_each_dtype_every_stage, .timeout = 240) {
    for (int zero = 0; zero <= 3; zero++) {
        reduce_case(zero, L3D_BFLOAT16, 0);
        reduce_case(zero, L3D_FLOAT16, 0);
        reduce_case(zero, -1, 0);          // unset: the gradients' float32
        reduce_case(zero, L3D_BFLOAT16, 1);  // fp32_allreduce wins
    }
}

// Whole runs: traffic and memory as planned, the first loss untouched.
Test(parallel_cdt, runs_match_plan_and_estimate, .timeout = 600) {
    static const layout_t cases[] = {
        {2, 1, 1, 0, 0, 4, 0, 0.25f, 0, 0}, {2, 2, 1, 1, 0, 4, 0, 0.25f, 0, 0},
        {2, 1, 2, 2, 0, 4, 0, 0.25f, 0, 0}, {2, 1, 1, 3, 0, 4, 0, 0.25f, 0, 0}};
    make_data();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        result_t f32 = {0}, b16 = {0};
        run_layout(&cases[i], &f32);
        g_comm_dtype = L3D_BFLOAT16;
        run_layout(&cases[i], &b16);
        g_comm_dtype = -1;
        const l3d_step_stats_t *s = &b16.last;
        for (int g = 0; g < 3; g++)
            cr_assert(s->comm_calls[g] == b16.plan[g].calls && s->comm_bytes[g] == b16.plan[g].bytes,
                      "case %zu group %d: counted %llu calls %llu bytes, planned %llu %llu", i, g,
                      (unsigned long long)s->comm_calls[g], (unsigned long long)s->comm_bytes[g],
                      (unsigned long long)b16.plan[g].calls, (unsigned long long)b16.plan[g].bytes);
        cr_assert_lt(b16.plan[L3D_MESH_DP].bytes, f32.plan[L3D_MESH_DP].bytes, "case %zu", i);
        for (int r = 0; r < cases[i].dp * cases[i].tp * cases[i].pp; r++)
            cr_assert_eq(b16.grads_in_use[r], b16.mem[r].grads, "case %zu rank %d", i, r);
        cr_assert_eq(b16.mem[0].grads, b16.estimate.grads, "case %zu", i);
        cr_assert_gt(b16.mem[0].grads, f32.mem[0].grads, "case %zu: no conversion scratch", i);
        cr_assert_eq(b16.loss[0], f32.loss[0], "case %zu: the first loss", i);
        for (int k = 0; k < STEPS; k++) cr_assert(isfinite(b16.loss[k]), "case %zu step %d", i, k);
        free_result(&f32), free_result(&b16);
    }
}
