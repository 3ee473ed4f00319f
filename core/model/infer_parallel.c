// Inference on a tensor- and pipeline-parallel layout (core/model/infer_parallel.h).
//
// Per pass of k <= rows tokens: stage s > 0 receives the (k, C) rows of stage s - 1, runs its
// layers (tp collectives inside) and sends its rows to stage s + 1; the last stage's tp ranks
// each write their vocabulary slice into a zeroed row of the full vocabulary and an all-reduce
// (sum) over tp assembles it exactly (every element has one non-zero contributor); a broadcast
// over the pipeline group from the last stage gives every rank the row.
#include <string.h>

#include "core/model/infer_parallel.h"
#include "core/comm/mesh.h"
#include "core/model/model_internal.h"

struct l3d_infer {
    l3d_ctx_t *ctx;
    l3d_mesh_t *mesh;
    l3d_model_t *m;
    l3d_kv_cache_t *c;
    int tp, pp, stage;
    float *x;       // (rows, C) on the device: the rows between stages
    size_t x_bytes;
    int n_seq;
    float *rows;    // (n_seq, vocab_size) host: the assembled logits rows (one sequence: row 0)
};

static l3d_status comm_error(l3d_infer_t *g, l3d_comm_t *c, l3d_status st, const char *what) {
    return l3d_error(g->ctx, st, "generation %s: %s", what, l3d_ctx_last_error(l3d_comm_ctx(c)));
}

l3d_status l3d_infer_create(l3d_ctx_t *ctx, l3d_comm_t *world, int tp, int pp, l3d_device_t *dev,
                            const l3d_model_config_t *config, int capacity, l3d_infer_t **inf_p) {
    return l3d_infer_create_seqs(ctx, world, tp, pp, dev, config, 1, capacity, L3D_FLOAT32,
                                 inf_p);
}

l3d_status l3d_infer_create_seqs(l3d_ctx_t *ctx, l3d_comm_t *world, int tp, int pp,
                                 l3d_device_t *dev, const l3d_model_config_t *config, int n_seq,
                                 int capacity, l3d_dtype weights, l3d_infer_t **inf_p) {
    if (!ctx || !dev || !config || !inf_p || tp < 1 || pp < 1 || n_seq < 1)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_infer_create: NULL argument or tp %d / "
                         "pp %d < 1", tp, pp);
    l3d_model_config_t cfg = *config;
    if (pp > cfg.num_hidden_layers)
        return l3d_error(ctx, L3D_ERR_CONFIG, "pp %d: the model has %d layers", pp,
                         cfg.num_hidden_layers);
    l3d_infer_t *g = l3d_calloc(ctx, 1, sizeof(*g), "other");
    if (!g) return L3D_ERR_NOMEM;
    g->ctx = ctx;
    g->tp = tp;
    g->pp = pp;
    l3d_status st;
    L3D_CHECK_GOTO(ctx, l3d_mesh_create(ctx, world, 1, tp, pp, NULL, &g->mesh), st, err);
    L3D_CHECK_GOTO(ctx, l3d_mesh_set_device(g->mesh, dev), st, err);
    g->stage = g->mesh->coord[L3D_MESH_PP];
    if (weights == L3D_FLOAT32)
        L3D_CHECK_GOTO(ctx, l3d_model_create_part(ctx, dev, &cfg, g->mesh->group[L3D_MESH_TP], pp,
                                                  1, g->stage, NULL, &g->m), st, err);
    else
        L3D_CHECK_GOTO(ctx, l3d_model_create_part_w16(ctx, dev, &cfg, g->mesh->group[L3D_MESH_TP],
                                                      pp, g->stage, weights, &g->m), st, err);
    L3D_CHECK_GOTO(ctx, l3d_kv_cache_create_seqs(g->m, n_seq, capacity, &g->c), st, err);
    g->n_seq = n_seq;
    g->rows = l3d_malloc(ctx, (size_t)n_seq * (size_t)cfg.vocab_size * sizeof(float), "acts");
    if (!g->rows) {
        st = L3D_ERR_NOMEM;
        goto err;
    }
    g->x_bytes = (size_t)l3d_kv_cache_rows(g->c) * (size_t)cfg.hidden_size * sizeof(float);
    L3D_CHECK_GOTO(ctx, l3d_dev_alloc(dev, g->x_bytes, "acts", (void **)&g->x), st, err);
    *inf_p = g;
    return L3D_OK;
err:
    l3d_infer_destroy(g);
    return st;
}

l3d_status l3d_infer_round_products(l3d_infer_t *g, int on) {
    l3d_model_t *m = g->m;
    if (on && (!m->w16_only || m->wt != L3D_BFLOAT16))
        return l3d_error(g->ctx, L3D_ERR_INVALID_ARG, "bfloat16 products: the model's weights "
                         "are %s, not bfloat16 alone", m->w16_only ? l3d_dtype_name(m->wt)
                                                                   : "float32");
    m->round_a16 = on != 0;
    return L3D_OK;
}

void l3d_infer_destroy(l3d_infer_t *g) {
    if (!g) return;
    if (g->rows)
        l3d_free(g->ctx, g->rows, (size_t)g->n_seq * (size_t)g->m->cfg.vocab_size * sizeof(float),
                 "acts");
    if (g->x) l3d_dev_free(g->m->dev, g->x, g->x_bytes, "acts");
    l3d_kv_cache_destroy(g->c);
    l3d_model_destroy(g->m);
    l3d_mesh_destroy(g->mesh);
    l3d_free(g->ctx, g, sizeof(*g), "other");
}

const l3d_model_config_t *l3d_infer_config(const l3d_infer_t *g) { return &g->m->cfg; }
l3d_model_t *l3d_infer_model(l3d_infer_t *g) { return g->m; }
int l3d_infer_len(const l3d_infer_t *g) { return l3d_kv_cache_len(g->c); }

l3d_status l3d_infer_decode(l3d_infer_t *g, const int32_t *tokens, int n, float *logits) {
    return l3d_infer_decode_seq(g, 0, tokens, n, logits);
}

l3d_status l3d_infer_decode_seq(l3d_infer_t *g, int seq, const int32_t *tokens, int n,
                                float *logits) {
    if (!g || !tokens || !logits || n < 1 || seq < 0 || seq >= g->n_seq)
        return l3d_error(g ? g->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_infer_decode: NULL "
                         "argument, n %d < 1 or sequence %d of %d", n, seq, g ? g->n_seq : 0);
    l3d_model_t *m = g->m;
    int V = m->cfg.vocab_size, C = m->C, last = g->stage == g->pp - 1;
    int rows = l3d_kv_cache_rows(g->c), len = l3d_kv_cache_seq_len(g->c, seq);
    l3d_kv_cache_select(g->c, seq);
    if (len + n > l3d_kv_cache_capacity(g->c))
        return l3d_error(g->ctx, L3D_ERR_INVALID_ARG, "decoding %d tokens at position %d exceeds "
                         "the kv cache capacity %d", n, len, l3d_kv_cache_capacity(g->c));
    l3d_comm_t *ppc = g->mesh->group[L3D_MESH_PP], *tpc = g->mesh->group[L3D_MESH_TP];
    l3d_status st;
    // Under tp each rank writes its vocabulary slice and the sum assembles the row: the rest
    // must be zero. One rank's head writes the whole row.
    if (last && g->tp > 1) memset(g->rows, 0, (size_t)V * sizeof(float));
    for (int done = 0; done < n;) {
        int k = L3D_MIN(rows, n - done);
        // Only the last pass's last row is wanted: earlier passes skip the head.
        int first_row = done + k < n ? k : k - 1;
        size_t count = (size_t)k * C;
        if (g->stage > 0 && (st = l3d_comm_recv(ppc, g->x, count, L3D_FLOAT32, g->stage - 1)) < 0)
            return comm_error(g, ppc, st, "receiving the previous stage's rows");
        st = l3d_kv_pass(g->c, tokens + done, k, first_row, g->rows + m->tp.v0, (size_t)V, g->x,
                         g->x);
        if (st < 0) {
            l3d_kv_cache_select(g->c, 0);
            return st;
        }
        if (!last && (st = l3d_comm_send(ppc, g->x, count, L3D_FLOAT32, g->stage + 1)) < 0)
            return comm_error(g, ppc, st, "sending rows to the next stage");
        done += k;
    }
    l3d_kv_cache_select(g->c, 0);
    if (last && tpc && (st = l3d_comm_allreduce(tpc, g->rows, g->rows, (size_t)V, L3D_FLOAT32,
                                                L3D_SUM)) < 0)
        return comm_error(g, tpc, st, "assembling the logits over tp");
    if (ppc && (st = l3d_comm_broadcast(ppc, g->rows, g->rows, (size_t)V, L3D_FLOAT32,
                                        g->pp - 1)) < 0)
        return comm_error(g, ppc, st, "sending the logits to every stage");
    memcpy(logits, g->rows, (size_t)V * sizeof(float));
    return L3D_OK;
}

l3d_status l3d_infer_decode_spans(l3d_infer_t *g, const l3d_decode_span_t *spans, int ns,
                                  const int32_t *tokens, float *logits) {
    if (!g || !spans || !tokens || !logits)
        return l3d_error(g ? g->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_infer_decode_spans: NULL "
                         "argument");
    int n_tok, n_lg;
    L3D_CHECK(g->ctx, l3d_kv_check_spans(g->c, spans, ns, tokens, "l3d_infer_decode_spans",
                                         &n_tok, &n_lg));
    l3d_model_t *m = g->m;
    int V = m->cfg.vocab_size, C = m->C, last = g->stage == g->pp - 1;
    l3d_comm_t *ppc = g->mesh->group[L3D_MESH_PP], *tpc = g->mesh->group[L3D_MESH_TP];
    size_t nv = (size_t)n_lg * (size_t)V;
    l3d_decode_span_t *pass = l3d_kv_cache_spans(g->c, 1);
    l3d_status st;
    // (under tp each rank writes its vocabulary slice of each row; the sum assembles them)
    if (last && g->tp > 1) memset(g->rows, 0, nv * sizeof(float));
    int i = 0, off = 0, k, t0 = 0, r0 = 0;
    while (i < ns) {  // the same passes on every stage: the same spans and rows everywhere
        int np = l3d_kv_spans_next(spans, ns, &i, &off, l3d_kv_cache_rows(g->c), pass, &k);
        size_t count = (size_t)k * C;
        if (g->stage > 0 && (st = l3d_comm_recv(ppc, g->x, count, L3D_FLOAT32, g->stage - 1)) < 0)
            return comm_error(g, ppc, st, "receiving the previous stage's rows");
        L3D_CHECK(g->ctx, l3d_kv_pass_spans(g->c, pass, np, tokens + t0,
                                            g->rows + (size_t)r0 * V + m->tp.v0, (size_t)V, g->x,
                                            g->x));
        if (!last && (st = l3d_comm_send(ppc, g->x, count, L3D_FLOAT32, g->stage + 1)) < 0)
            return comm_error(g, ppc, st, "sending rows to the next stage");
        for (int j = 0; j < np; j++) r0 += pass[j].logits != 0;
        t0 += k;
    }
    if (!nv) return L3D_OK;
    if (last && tpc && (st = l3d_comm_allreduce(tpc, g->rows, g->rows, nv, L3D_FLOAT32,
                                                L3D_SUM)) < 0)
        return comm_error(g, tpc, st, "assembling the logits over tp");
    if (ppc && (st = l3d_comm_broadcast(ppc, g->rows, g->rows, nv, L3D_FLOAT32, g->pp - 1)) < 0)
        return comm_error(g, ppc, st, "sending the logits to every stage");
    memcpy(logits, g->rows, nv * sizeof(float));
    return L3D_OK;
}

l3d_status l3d_infer_decode_batch(l3d_infer_t *g, const int *seqs, const int32_t *tokens, int n,
                                  float *logits) {
    if (!g || !seqs || n < 1 || n > g->n_seq)
        return l3d_error(g ? g->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_infer_decode_batch: NULL "
                         "argument, or %d rows for %d sequences", n, g ? g->n_seq : 0);
    l3d_decode_span_t *sp = l3d_kv_cache_spans(g->c, 0);
    for (int i = 0; i < n; i++) sp[i] = (l3d_decode_span_t){seqs[i], 1, 1};
    return l3d_infer_decode_spans(g, sp, n, tokens, logits);
}

l3d_status l3d_infer_truncate(l3d_infer_t *g, int seq, int keep) {
    if (!g) return L3D_ERR_INVALID_ARG;
    return l3d_kv_cache_seq_truncate(g->c, seq, keep);
}
