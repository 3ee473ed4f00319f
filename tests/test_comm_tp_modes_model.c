// Tensor parallelism "2d" and "3d" on the whole model: a 2 x 2 grid (4 ranks) and a 2 x 2 x 2
// cube (8 ranks), in-process, each run one training micro-batch -- embedding, two layers
// (SUMMA or cube linear layers, split-row RMSNorm, local attention and SwiGLU), final norm,
// head and the vocabulary-split cross-entropy -- and its loss and every rank's gradient blocks
// must equal the single-rank model's on the same weights and tokens; the bytes and calls each
// rank counts on its grid row and column (2d) or its three axes and two planes (3d) equal
// l3d_tp2d_micro_bytes / l3d_tp3d_micro_bytes exactly.
//
// Tolerance, derived: both runs evaluate the same function in float32 and differ only in the
// order of their sums (a SUMMA or cube product adds K in q blocks, the norms add each row's
// squares in q parts, the cross-entropy its row in q parts). A sum of K terms carries at most
// gamma_K ~ K u of its terms' magnitude (u = 2^-24, Higham 3.1), and an error entering one
// step reaches the gradients through the chain of later steps: forward about 7 sums per layer
// (2 norms, q/k/v, attention's two, o, gate/up, down), backward twice that, plus the final
// norm, the head and the cross-entropy: d = 21 L + 4 steps. At this random initialisation the
// steps neither amplify nor cancel much (the weights' scale keeps activations O(1)), so each
// tensor's difference stays below d * K_max * u of its largest element, K_max the longest sum.
// Measured (AMD Zen, Haswell, Sandybridge and SkylakeX kernels): about 1/100 of that in 2d,
// 0.8-1.2/100 in 3d. A real fault is O(1): the checks below that unsummed replica gradients are
// caught show it, and a 3d logits block on the wrong vocabulary columns was tried and caught.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model/model_internal.h"
#include "core/model/tp2d.h"
#include "core/model/tp3d.h"
#include "llama3d/llama3d.h"
#include "tests/harness/world.h"

enum { B = 4, T = 9, L = 2 };

static l3d_model_config_t config(void) {
    l3d_model_config_t c;
    memset(&c, 0, sizeof(c));
    c.hidden_size = 16;
    c.intermediate_size = 32;
    c.num_hidden_layers = L;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 4;
    c.vocab_size = 40;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.initializer_range = 0.2f;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    return c;
}

static int32_t token(int b, int t) { return (int32_t)((b * 131 + t * 17 + 5) % 40); }

typedef struct run_arg {
    int mode;       // 2 or 3
    int tied;       // tie_word_embeddings: the head reads the embedding's table
    int recompute;
    int sync;       // tp_sync_grads: 0 leaves the replicated norms' gradients partial
    double worst;   // out: the largest error / tolerance over every rank and tensor (rank 0)
} run_arg_t;

#define FAILF(...)                                  \
    do {                                            \
        snprintf(err, errlen, __VA_ARGS__);         \
        rc = 1;                                     \
        goto out;                                   \
    } while (0)
#define OK(call)                                                                       \
    do {                                                                               \
        l3d_status st_ = (call);                                                       \
        if (st_ != L3D_OK) FAILF("%s: %s", #call, l3d_ctx_last_error(ctx));            \
    } while (0)

// One micro-batch on model m with activations for nb sequences, tokens of [b0, b0 + nb),
// targets of [t0, t0 + nb): its loss and its gradients (calloc'd, n_params floats).
static l3d_status micro(l3d_model_t *m, int b0, int t0, int nb, int recompute, int sync,
                        double *loss, float **g) {
    l3d_acts_t *a = NULL;
    L3D_CHECK(m->ctx, l3d_acts_create(m, nb, T, recompute, &a));
    for (int b = 0; b < nb; b++)
        for (int t = 0; t < T; t++) {
            a->tokens[b * T + t] = token(b0 + b, t);
            a->targets[b * T + t] = token(t0 + b, t + 1);
        }
    a->tp_sync_grads = sync;
    *g = calloc(m->n_params, sizeof(float));
    l3d_status st = l3d_model_train_micro(m, a, *g, 1.0f / (B * T), loss);
    l3d_acts_destroy(m, a);
    return st;
}

static int run(l3d_comm_t *c, void *argp, char *err, size_t errlen) {
    run_arg_t *arg = argp;
    l3d_ctx_t *ctx = l3d_comm_ctx(c);
    l3d_device_t *dev = NULL;
    l3d_model_t *full = NULL, *m = NULL;
    float *g1 = NULL, *g2 = NULL, *want = NULL;
    int rc = 0;
    l3d_model_config_t cfg = config();
    cfg.tie_word_embeddings = arg->tied;
    l3d_device_params_t dp = {.num_threads = 1};
    OK(l3d_device_create(ctx, "cpu", &dp, &dev));
    OK(l3d_model_create(ctx, dev, &cfg, &full));
    OK(l3d_model_init_weights(full, 7));
    double loss1, loss2;
    OK(micro(full, 0, 0, B, 0, 1, &loss1, &g1));

    // the mode's communicators and what it moves per micro-batch (docs/parallel.md)
    enum { MAXC = L3D_TP3D_COMMS + 1 };
    l3d_comm_t *comms[MAXC] = {0};
    const char *cname[MAXC] = {0};
    uint64_t wb[MAXC], wc[MAXC];
    int ncomm, b0, nb;
    if (arg->mode == 2) {
        OK(l3d_model_create_2d(ctx, dev, &cfg, c, 1, 1, 0, NULL, &m));
        l3d_tp2d_t *g = m->tp.g;
        int q = g->q;
        l3d_model_batch_slice(m, B, &b0, &nb);
        if (nb != B / q || b0 != g->i * nb || l3d_model_target_first(m, B) != b0)
            FAILF("slices: tokens from %d (%d), targets from %d", b0, nb,
                  l3d_model_target_first(m, B));
        ncomm = 3;
        comms[0] = g->row, comms[1] = g->col, cname[0] = "grid row", cname[1] = "grid column";
        l3d_tp2d_micro_bytes(&cfg, q, L, 1, 1, nb, T, arg->recompute, arg->sync, 4, wb, wc);
        // the grid itself: a tied head's block off the diagonal, else nothing
        comms[2] = c, cname[2] = "grid";
        l3d_tp2d_tied_bytes(&cfg, q, g->i, g->j, 4, &wb[2], &wc[2]);
        if (arg->tied && g->i != g->j && !wb[2]) FAILF("no tied exchange at (%d, %d)", g->i, g->j);
    } else {
        OK(l3d_model_create_3d(ctx, dev, &cfg, c, 1, 1, 0, NULL, &m));
        l3d_tp3d_t *g3 = m->tp.g3;
        int q = g3->q;
        l3d_model_batch_slice(m, B, &b0, &nb);
        if (nb != B / (q * q) || b0 != (g3->c[0] * q + g3->c[1]) * nb ||
            l3d_model_target_first(m, B) != (g3->c[0] * q + g3->c[2]) * nb)
            FAILF("slices: tokens from %d (%d), targets from %d", b0, nb,
                  l3d_model_target_first(m, B));
        ncomm = L3D_TP3D_COMMS + 1;
        l3d_comm_t *cs[L3D_TP3D_COMMS + 1] = {g3->axis[0], g3->axis[1], g3->axis[2],
                                              g3->plane[1], g3->plane[2], c};
        static const char *names[L3D_TP3D_COMMS + 1] = {"axis i", "axis j", "axis l",
                                                        "plane j", "plane l", "cube"};
        for (int k = 0; k < ncomm; k++) comms[k] = cs[k], cname[k] = names[k];
        l3d_tp3d_micro_bytes(&cfg, q, L, 1, 1, nb, T, arg->recompute, arg->sync, 4, wb, wc);
        wb[L3D_TP3D_COMMS] = wc[L3D_TP3D_COMMS] = 0;  // (a tied head reads its own columns)
    }
    OK(l3d_model_tp_slice(m, full, full->params, m->params));
    for (int k = 0; k < ncomm; k++) l3d_comm_reset_stats(comms[k]);
    OK(micro(m, b0, l3d_model_target_first(m, B), nb, arg->recompute, arg->sync, &loss2, &g2));
    for (int k = 0; k < ncomm; k++) {
        l3d_comm_stats_t cs;
        l3d_comm_get_stats(comms[k], &cs);
        if (cs.bytes != wb[k] || cs.calls != wc[k])
            FAILF("%dd %s: counted %llu bytes in %llu calls, the formula %llu in %llu",
                  arg->mode, cname[k], (unsigned long long)cs.bytes,
                  (unsigned long long)cs.calls, (unsigned long long)wb[k],
                  (unsigned long long)wc[k]);
    }
    want = calloc(m->n_params, sizeof(float));
    OK(l3d_model_tp_slice(m, full, g1, want));

    double u = ldexp(1.0, -24), d = 21.0 * L + 4;
    int kmax = cfg.intermediate_size;  // the longest sum: F (> V/q, C, HD, T, and the weight
                                       // gradients' rows per rank)
    if (cfg.vocab_size > kmax) kmax = cfg.vocab_size;
    double tol = d * kmax * u, worst = 0;
    // the loss: a sum of B*T per-token losses, each O(log V)
    double lt = tol * B * T * log(cfg.vocab_size);
    if (!(fabs(loss2 - loss1) <= lt))
        FAILF("loss %.9g, single rank %.9g (tol %.3g)", loss2, loss1, lt);
    for (int k = 0; k < m->n_tensors; k++) {
        const l3d_param_t *p = &m->tensors[k];
        double scale = 0, e = 0;
        size_t at = 0;
        for (size_t x = 0; x < p->numel; x++) scale = fmax(scale, fabs(want[p->offset + x]));
        for (size_t x = 0; x < p->numel; x++) {
            double ex = fabs((double)g2[p->offset + x] - want[p->offset + x]);
            if (ex > e) e = ex, at = x;
        }
        double r = e / (tol * (scale > 0 ? scale : 1));
        if (r > worst) worst = r;
        if (r > 1)
            FAILF("tp rank %d: %s [%zu] = %.9g, single rank %.9g (max error %.3g, tol %.3g)",
                  l3d_comm_rank(c), p->name, at, (double)g2[p->offset + at],
                  (double)want[p->offset + at], e, tol * scale);
    }
    if (l3d_comm_rank(c) == 0) arg->worst = worst;
out:
    free(g1), free(g2), free(want);
    l3d_model_destroy(m);
    l3d_model_destroy(full);
    l3d_device_destroy(dev);
    return rc;
}

static void matches(int mode, int ranks, int tied) {
    for (int rc = 0; rc <= 1; rc++) {
        run_arg_t arg = {mode, tied, rc, 1, 0};
        char err[512] = "";
        cr_assert_eq(l3d_world_run("local", ranks, run, &arg, 120, err, sizeof(err)), 0,
                     "%dd, tied %d, recompute %d: %s", mode, tied, rc, err);
        cr_log_info("%dd, tied %d, recompute %d: largest error %.3g of the tolerance", mode,
                    tied, rc, arg.worst);
    }
}

Test(tp_modes_model, micro_batch_2d_matches_one_rank) { matches(2, 4, 0); }
Test(tp_modes_model, micro_batch_3d_matches_one_rank) { matches(3, 8, 0); }
// Tied embeddings: the table's gradient gathers the head's blocks (2d: from the transposed
// grid rank) as well as the embedding's rows.
Test(tp_modes_model, micro_batch_2d_tied_matches_one_rank) { matches(2, 4, 1); }
Test(tp_modes_model, micro_batch_3d_tied_matches_one_rank) { matches(3, 8, 1); }

// The negative control: without summing the replicated norm and embedding gradients over the
// grid column (2d) or plane l (3d), each block holds only its micro-batch slice's part, and
// the check fails.
static void unsummed(int mode, int ranks) {
    run_arg_t arg = {mode, 0, 0, 0, 0};
    char err[512] = "";
    cr_assert_neq(l3d_world_run("local", ranks, run, &arg, 120, err, sizeof(err)), 0);
    cr_assert(strstr(err, "layernorm") || strstr(err, "embed") || strstr(err, "norm"),
              "%s", err);
}

Test(tp_modes_model, unsummed_replica_gradients_are_caught) {
    unsummed(2, 4);
    unsummed(3, 8);
}

// Shapes 2d and 3d cannot split are refused with the reason.
Test(tp_modes_model, unsupported_shapes_are_refused) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_model_config_t cfg = config();
    cfg.num_key_value_heads = 1;
    cr_assert_eq(l3d_tp2d_check(ctx, &cfg, 2), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "num_key_value_heads 1"), "%s",
              l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_tp3d_check(ctx, &cfg, 2), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "num_key_value_heads 1"), "%s",
              l3d_ctx_last_error(ctx));
    cfg = config();
    cfg.hidden_size = 18;  // even, but not a multiple of q^2 = 4
    cr_assert_eq(l3d_tp3d_check(ctx, &cfg, 2), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "hidden_size 18"), "%s", l3d_ctx_last_error(ctx));
    l3d_ctx_destroy(ctx);
}
