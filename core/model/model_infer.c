// Inference with a KV cache: the prompt in as few passes as the scratch bound allows, then one
// token at a time. The layer math is l3d_layer_forward (core/model/model_fwdbwd.c) with k/v rows
// written straight into the cache at the current position. A cache may hold several
// sequences; l3d_model_decode_spans advances several of them, each by its own number of tokens,
// in one pass (the weight GEMMs batched, attention per sequence at its own positions).
#include <string.h>

#include "core/model/model_internal.h"

// Rows per pass: as many as INFER_SCRATCH_BYTES of activations hold, between INFER_MIN_ROWS
// and INFER_MAX_ROWS (and at most the cache's capacity). Larger passes let the GEMMs pack
// each weight once for more rows; 64 MiB is 400 rows of a 1B model, 2048 of a 60M one.
#define INFER_MIN_ROWS 64
#define INFER_MAX_ROWS 2048
#define INFER_SCRATCH_BYTES ((size_t)64 << 20)
// Logit rows per head GEMM: l3d_model_logits wants every row, decoding only the last, so the
// (rows, V) logits buffer (32 MiB for 64 rows of a 128k vocabulary) is not kept.
#define INFER_LOGIT_ROWS 16

struct l3d_kv_cache {
    l3d_model_t *m;
    int cap;
    int n_seq, cur;  // cur: the sequence l3d_kv_pass works on
    int *lens;       // (n_seq) positions of each sequence
    l3d_decode_span_t *spans[2];  // (n_seq) each: a batch's spans, a pass's spans
    uint32_t *seen, stamp;  // (n_seq) seen[s] == stamp: sequence s is in the call being checked
    int rows, logit_rows;  // rows per pass, logit rows per head GEMM
    float *k, *v;  // (n_seq, L, cap, KVH*D)
    float *kt, *vt;  // (rows, KVH*D): a batch's new key/value rows before they are placed
    size_t kv_bytes;
    void *scratch;
    size_t scratch_bytes;
    l3d_layer_acts_t la;  // k, v, x_in set per layer
    float *xa, *xb, *sw, *rstdf, *lnf, *logits;  // rstdf, lnf, logits: logit_rows rows
    int32_t *tok;
};

static size_t scratch_layout(l3d_kv_cache_t *c, char *base) {
    const l3d_model_t *m = c->m;
    size_t n = (size_t)c->rows, nl = (size_t)c->logit_rows, f = sizeof(float), off = 0;
    size_t C = (size_t)m->C, F = (size_t)m->F, HD = (size_t)m->H * m->D, V = (size_t)m->V;
#define TAKE(ptr, bytes)                                    \
    do {                                                    \
        if (base) ptr = (void *)(base + off);               \
        off += ((bytes) + 63) & ~(size_t)63;                \
    } while (0)
    TAKE(c->la.rstd1, n * f);
    TAKE(c->la.ln1, n * C * f);
    TAKE(c->la.q, n * HD * f);
    TAKE(c->la.att, n * HD * f);
    TAKE(c->la.h, n * C * f);
    TAKE(c->la.rstd2, n * f);
    TAKE(c->la.ln2, n * C * f);
    TAKE(c->la.gate, n * F * f);
    TAKE(c->la.up, n * F * f);
    TAKE(c->xa, n * C * f);
    TAKE(c->xb, n * C * f);
    TAKE(c->sw, n * F * f);
    TAKE(c->rstdf, nl * f);
    TAKE(c->lnf, nl * C * f);
    TAKE(c->logits, nl * V * f);
    TAKE(c->tok, n * sizeof(int32_t));
    TAKE(c->kt, n * (size_t)(m->KVH * m->D) * f);
    TAKE(c->vt, n * (size_t)(m->KVH * m->D) * f);
#undef TAKE
    return off;
}

l3d_status l3d_kv_cache_create(l3d_model_t *m, int capacity, l3d_kv_cache_t **cache_p) {
    return l3d_kv_cache_create_seqs(m, 1, capacity, cache_p);
}

l3d_status l3d_kv_cache_create_seqs(l3d_model_t *m, int n_seq, int capacity,
                                    l3d_kv_cache_t **cache_p) {
    if (!m || !cache_p)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_kv_cache_create: NULL %s",
                         !m ? "model" : "cache_p");
    L3D_CHECK(m->ctx, l3d_model_check_infer(m, "l3d_kv_cache_create"));
    l3d_ctx_t *ctx = m->ctx;
    if (n_seq < 1 || n_seq > L3D_KV_MAX_SEQS)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "kv cache: %d sequences, must be in [1, %d]",
                         n_seq, L3D_KV_MAX_SEQS);
    if (capacity < 1 || capacity > m->cfg.max_position_embeddings)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG,
                         "kv cache capacity %d must be in [1, max_position_embeddings %d]",
                         capacity, m->cfg.max_position_embeddings);
    L3D_CHECK(ctx, l3d_model_rope_reserve(m, capacity));
    l3d_kv_cache_t *c = l3d_calloc(ctx, 1, sizeof(*c), "acts");
    if (!c) return L3D_ERR_NOMEM;
    c->m = m;
    c->cap = capacity;
    c->n_seq = n_seq;
    c->kv_bytes = (size_t)n_seq * (size_t)m->L * (size_t)capacity * (size_t)(m->KVH * m->D) *
                  sizeof(float);
    c->lens = l3d_calloc(ctx, (size_t)n_seq, sizeof(int), "acts");
    for (int i = 0; i < 2; i++)
        c->spans[i] = l3d_calloc(ctx, (size_t)n_seq, sizeof(l3d_decode_span_t), "acts");
    c->seen = l3d_calloc(ctx, (size_t)n_seq, sizeof(uint32_t), "acts");
    if (!c->lens || !c->spans[0] || !c->spans[1] || !c->seen) {
        l3d_kv_cache_destroy(c);
        return L3D_ERR_NOMEM;
    }
    c->logit_rows = L3D_MIN(capacity, INFER_LOGIT_ROWS);
    c->rows = 1;
    size_t one = scratch_layout(c, NULL);
    c->rows = 2;
    size_t per_row = scratch_layout(c, NULL) - one;
    size_t fit = INFER_SCRATCH_BYTES / (per_row ? per_row : 1);
    c->rows = (int)L3D_MIN((size_t)capacity,
                           L3D_MAX((size_t)INFER_MIN_ROWS, L3D_MIN(fit, (size_t)INFER_MAX_ROWS)));
    c->scratch_bytes = scratch_layout(c, NULL);
    l3d_status st;
    L3D_CHECK_GOTO(ctx, l3d_dev_alloc(m->dev, c->kv_bytes, "acts", (void **)&c->k), st, err);
    L3D_CHECK_GOTO(ctx, l3d_dev_alloc(m->dev, c->kv_bytes, "acts", (void **)&c->v), st, err);
    L3D_CHECK_GOTO(ctx, l3d_dev_alloc(m->dev, c->scratch_bytes, "acts", &c->scratch), st, err);
    scratch_layout(c, c->scratch);
    *cache_p = c;
    return L3D_OK;
err:
    l3d_kv_cache_destroy(c);
    return st;
}

void l3d_kv_cache_destroy(l3d_kv_cache_t *c) {
    if (!c) return;
    l3d_device_t *dev = c->m->dev;
    l3d_dev_free(dev, c->scratch, c->scratch_bytes, "acts");
    l3d_dev_free(dev, c->v, c->kv_bytes, "acts");
    l3d_dev_free(dev, c->k, c->kv_bytes, "acts");
    for (int i = 0; i < 2; i++)
        l3d_free(c->m->ctx, c->spans[i], (size_t)c->n_seq * sizeof(l3d_decode_span_t), "acts");
    l3d_free(c->m->ctx, c->seen, (size_t)c->n_seq * sizeof(uint32_t), "acts");
    l3d_free(c->m->ctx, c->lens, (size_t)c->n_seq * sizeof(int), "acts");
    l3d_free(c->m->ctx, c, sizeof(*c), "acts");
}

int l3d_kv_cache_len(const l3d_kv_cache_t *c) { return c ? c->lens[0] : 0; }

l3d_status l3d_kv_pass(l3d_kv_cache_t *c, const int32_t *tokens, int n, int first_row,
                       float *out, size_t ldo, const float *x_prev, float *x_next) {
    l3d_model_t *m = c->m;
    l3d_device_t *dev = m->dev;
    l3d_ctx_t *ctx = m->ctx;
    const l3d_dtype wt = l3d_model_infer_wt(m);
    int C = m->C, V = m->V, KD = m->KVH * m->D, pos0 = c->lens[c->cur];
    size_t seq_off = (size_t)c->cur * (size_t)m->L * (size_t)c->cap * (size_t)KD;
    if (m->has_embed) {
        for (int i = 0; i < n; i++)
            if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
                return l3d_error(ctx, L3D_ERR_INVALID_ARG, "token %d at position %d is outside "
                                 "the vocabulary [0, %d)", tokens[i], pos0 + i,
                                 m->cfg.vocab_size);
        L3D_CHECK(ctx, l3d_dev_copy(dev, c->tok, tokens, (size_t)n * sizeof(int32_t),
                                    L3D_COPY_H2D));
        // (vocab-parallel under tp: each rank looks up its rows, an all-reduce sums them)
        L3D_CHECK(ctx, l3d_tp_embedding_fwd(m, c->xa, l3d_model_infer_w(m, m->embed), c->tok, n,
                                            L3D_FLOAT32, wt));
    } else {  // a later pipeline stage: the previous stage's output rows
        L3D_CHECK(ctx, l3d_dev_copy(dev, c->xa, x_prev, (size_t)n * C * sizeof(float),
                                    L3D_COPY_D2D));
    }
    float *x = c->xa, *y = c->xb;
    for (int l = 0; l < m->L; l++) {
        l3d_layer_acts_t la = c->la;
        la.x_in = x;
        la.k = c->k + seq_off + (size_t)l * c->cap * KD;
        la.v = c->v + seq_off + (size_t)l * c->cap * KD;
        la.lse = NULL;
        L3D_CHECK(ctx, l3d_layer_forward(m, l, l3d_model_infer_w(m, m->layer[l].ln1), &la, y,
                                         c->sw, 1, n, pos0, pos0 + n, 0, L3D_FLOAT32, wt));
        float *t = x;
        x = y;
        y = t;
    }
    if (!m->has_head) {  // the rows go on to the next stage
        L3D_CHECK(ctx, l3d_dev_copy(dev, x_next, x, (size_t)n * C * sizeof(float), L3D_COPY_D2D));
        L3D_CHECK(ctx, l3d_dev_sync(dev));
        c->lens[c->cur] += n;
        return L3D_OK;
    }
    // The head for rows [first_row, n) (none when first_row == n), logit_rows at a time; under
    // tp this rank's vocabulary slice (V columns).
    for (int r0 = first_row; r0 < n; r0 += c->logit_rows) {
        int rows = L3D_MIN(c->logit_rows, n - r0);
        L3D_CHECK(ctx, l3d_dev_rmsnorm_fwd(dev, c->lnf, c->rstdf, x + (size_t)r0 * C,
                                           l3d_model_infer_w(m, m->norm), rows, C,
                                           m->cfg.rms_norm_eps, L3D_FLOAT32, wt));
        l3d_gemm_t g = {.trans_a = 0, .trans_b = 1, .M = rows, .N = V, .K = C, .alpha = 1.0f,
                        .beta = 0.0f, .A = c->lnf, .lda = C, .B = l3d_model_infer_w(m, m->head),
                        .ldb = C, .C = c->logits, .ldc = V, .b_type = wt,
                        .round_a = m->round_a16};
        L3D_CHECK(ctx, l3d_dev_gemm(dev, &g));
        float *o = out + (size_t)(r0 - first_row) * ldo;
        if (ldo == (size_t)V)
            L3D_CHECK(ctx, l3d_dev_copy(dev, o, c->logits, (size_t)rows * V * sizeof(float),
                                        L3D_COPY_D2H));
        else
            for (int r = 0; r < rows; r++)
                L3D_CHECK(ctx, l3d_dev_copy(dev, o + (size_t)r * ldo, c->logits + (size_t)r * V,
                                            (size_t)V * sizeof(float), L3D_COPY_D2H));
    }
    L3D_CHECK(ctx, l3d_dev_sync(dev));
    c->lens[c->cur] += n;
    return L3D_OK;
}

int l3d_kv_cache_rows(const l3d_kv_cache_t *c) { return c->rows; }
l3d_decode_span_t *l3d_kv_cache_spans(l3d_kv_cache_t *c, int which) { return c->spans[which]; }
void l3d_kv_cache_select(l3d_kv_cache_t *c, int seq) { c->cur = seq; }
int l3d_kv_cache_capacity(const l3d_kv_cache_t *c) { return c->cap; }

// The public single-model entry points serve a whole model; a tensor- or pipeline-parallel
// part is served by core/model/infer_parallel.c.
static l3d_status whole_model(l3d_model_t *m, const char *what) {
    L3D_CHECK(m->ctx, l3d_model_check_infer(m, what));
    if (m->tp.size > 1 || m->pp_size > 1)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "%s: the model is one part of a tensor- "
                         "or pipeline-parallel layout (tp %d, pp %d); decode it with "
                         "l3d_infer_decode", what, m->tp.size, m->pp_size);
    return L3D_OK;
}

static l3d_status decode_chunk(l3d_kv_cache_t *c, const int32_t *tokens, int n, int first_row,
                               float *out) {
    return l3d_kv_pass(c, tokens, n, first_row, out, (size_t)c->m->V, NULL, NULL);
}

static l3d_status check_cache(l3d_model_t *m, l3d_kv_cache_t *c, const char *what) {
    if (c->m != m)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "%s: the kv cache belongs to another "
                         "model", what);
    return whole_model(m, what);
}

l3d_status l3d_model_decode_seq(l3d_model_t *m, l3d_kv_cache_t *c, int seq, const int32_t *tokens,
                                int n, float *last_logits) {
    if (!m || !c || !tokens || !last_logits)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_model_decode: NULL argument");
    L3D_CHECK(m->ctx, check_cache(m, c, "l3d_model_decode"));
    if (seq < 0 || seq >= c->n_seq)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "l3d_model_decode: sequence %d of a cache "
                         "of %d", seq, c->n_seq);
    if (n < 1 || c->lens[seq] + n > c->cap)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "decoding %d tokens at position %d "
                         "exceeds the kv cache capacity %d", n, c->lens[seq], c->cap);
    c->cur = seq;
    l3d_status st = L3D_OK;
    for (int done = 0; done < n && st >= 0;) {
        int k = L3D_MIN(c->rows, n - done);
        // Only the last pass's last row is wanted: earlier passes skip the head.
        st = decode_chunk(c, tokens + done, k, done + k < n ? k : k - 1, last_logits);
        done += k;
    }
    c->cur = 0;
    return st;
}

l3d_status l3d_model_decode(l3d_model_t *m, l3d_kv_cache_t *c, const int32_t *tokens, int n,
                            float *last_logits) {
    return l3d_model_decode_seq(m, c, 0, tokens, n, last_logits);
}

int l3d_kv_cache_seq_len(const l3d_kv_cache_t *c, int seq) {
    return c && seq >= 0 && seq < c->n_seq ? c->lens[seq] : 0;
}

l3d_status l3d_kv_cache_seq_truncate(l3d_kv_cache_t *c, int seq, int keep) {
    if (!c || seq < 0 || seq >= c->n_seq || keep < 0 || keep > c->lens[seq])
        return l3d_error(c ? c->m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_kv_cache_seq_truncate: "
                         "sequence %d of a cache of %d, keeping %d of its %d positions", seq,
                         c ? c->n_seq : 0, keep, c && seq >= 0 && seq < c->n_seq ? c->lens[seq] : 0);
    c->lens[seq] = keep;  // the rows past it are overwritten as it grows again
    return L3D_OK;
}

// One layer over the pass's n rows, span j's n_j rows the new tokens of sequence seq_j at
// positions lens[seq_j] ..: the norms and weight GEMMs over all rows at once (each weight read
// once for the pass), rope, the cache write and attention per span (its rows attend causally
// to its cache). The same math as l3d_layer_forward (no sequence parallelism; tp collectives
// as there).
static l3d_status spans_layer(l3d_kv_cache_t *c, int l, const l3d_decode_span_t *sp, int ns,
                              int n, const float *x, float *y) {
    l3d_model_t *m = c->m;
    l3d_device_t *dev = m->dev;
    l3d_ctx_t *ctx = m->ctx;
    const l3d_dtype wt = l3d_model_infer_wt(m);
    const l3d_layer_params_t *lp = &m->layer[l];
    l3d_layer_acts_t *a = &c->la;
    int C = m->C, F = m->F, HD = m->H * m->D, KD = m->KVH * m->D;
    float eps = m->cfg.rms_norm_eps;
#define GEMM(out_, ldo_, in_, w_, k_, n_, beta_)                                               \
    L3D_CHECK(ctx, l3d_dev_gemm(dev, &(l3d_gemm_t){.trans_a = 0, .trans_b = 1, .M = n,         \
                                                   .N = (n_), .K = (k_), .alpha = 1.0f,        \
                                                   .beta = (beta_), .A = (in_), .lda = (k_),   \
                                                   .B = (w_), .ldb = (k_), .C = (out_),        \
                                                   .ldc = (ldo_), .b_type = wt,                \
                                                   .round_a = m->round_a16}))
    L3D_CHECK(ctx, l3d_dev_rmsnorm_fwd(dev, a->ln1, a->rstd1, x, l3d_model_infer_w(m, lp->ln1), n,
                                       C, eps, L3D_FLOAT32, wt));
    GEMM(a->q, HD, a->ln1, l3d_model_infer_w(m, lp->wq), C, HD, 0.0f);
    GEMM(c->kt, KD, a->ln1, l3d_model_infer_w(m, lp->wk), C, KD, 0.0f);
    GEMM(c->vt, KD, a->ln1, l3d_model_infer_w(m, lp->wv), C, KD, 0.0f);
    for (int j = 0, r = 0; j < ns; r += sp[j++].n) {
        int s = sp[j].seq, t = sp[j].n, pos = c->lens[s];
        size_t base = ((size_t)s * (size_t)m->L + (size_t)l) * (size_t)c->cap * (size_t)KD;
        float *q = (float *)a->q + (size_t)r * HD, *kc = c->k + base, *vc = c->v + base;
        float *kn = c->kt + (size_t)r * KD, *vn = c->vt + (size_t)r * KD;
        L3D_CHECK(ctx, l3d_dev_rope(dev, q, m->cos_tab, m->sin_tab, 1, t, m->H, m->D, pos, 0,
                                    L3D_FLOAT32));
        L3D_CHECK(ctx, l3d_dev_rope(dev, kn, m->cos_tab, m->sin_tab, 1, t, m->KVH, m->D, pos, 0,
                                    L3D_FLOAT32));
        L3D_CHECK(ctx, l3d_dev_copy(dev, kc + (size_t)pos * KD, kn, (size_t)t * KD * sizeof(float),
                                    L3D_COPY_D2D));
        L3D_CHECK(ctx, l3d_dev_copy(dev, vc + (size_t)pos * KD, vn, (size_t)t * KD * sizeof(float),
                                    L3D_COPY_D2D));
        l3d_attn_dims_t dims = {1, t, pos + t, m->H, m->KVH, m->D, 0};
        L3D_CHECK(ctx, l3d_dev_attention_fwd(dev, (float *)a->att + (size_t)r * HD, NULL, q, kc, vc,
                                             &dims, L3D_FLOAT32));
    }
    // h = x + att Wo^T, x_out = h + swiglu(ln2 Wg^T, ln2 Wu^T) Wd^T (row-parallel under tp:
    // rank 0 adds the residual, the all-reduce completes the sums).
    L3D_CHECK(ctx, l3d_tp_residual_init(m, a->h, x, (size_t)n * C, L3D_FLOAT32));
    GEMM(a->h, C, a->att, l3d_model_infer_w(m, lp->wo), HD, C, 1.0f);
    L3D_CHECK(ctx, l3d_tp_allreduce(m, a->h, (size_t)n * C, L3D_FLOAT32));
    L3D_CHECK(ctx, l3d_dev_rmsnorm_fwd(dev, a->ln2, a->rstd2, a->h, l3d_model_infer_w(m, lp->ln2),
                                       n, C, eps, L3D_FLOAT32, wt));
    GEMM(a->gate, F, a->ln2, l3d_model_infer_w(m, lp->wg), C, F, 0.0f);
    GEMM(a->up, F, a->ln2, l3d_model_infer_w(m, lp->wu), C, F, 0.0f);
    L3D_CHECK(ctx, l3d_dev_swiglu_fwd(dev, c->sw, a->gate, a->up, (size_t)n * F, L3D_FLOAT32));
    L3D_CHECK(ctx, l3d_tp_residual_init(m, y, a->h, (size_t)n * C, L3D_FLOAT32));
    GEMM(y, C, c->sw, l3d_model_infer_w(m, lp->wd), F, C, 1.0f);
#undef GEMM
    return l3d_tp_allreduce(m, y, (size_t)n * C, L3D_FLOAT32);
}

l3d_status l3d_model_decode_spans(l3d_model_t *m, l3d_kv_cache_t *c,
                                  const l3d_decode_span_t *spans, int ns, const int32_t *tokens,
                                  float *logits) {
    if (!m || !c || !spans || !tokens || !logits || ns < 1)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_model_decode_spans: NULL "
                         "argument or %d spans < 1", ns);
    L3D_CHECK(m->ctx, check_cache(m, c, "l3d_model_decode_spans"));
    int n_tok, n_lg;
    L3D_CHECK(m->ctx, l3d_kv_check_spans(c, spans, ns, tokens, "l3d_model_decode_spans", &n_tok,
                                         &n_lg));
    int i = 0, off = 0, k, t0 = 0, r0 = 0;
    while (i < ns) {  // passes of at most `rows` tokens, a span cut where one ends
        int np = l3d_kv_spans_next(spans, ns, &i, &off, c->rows, c->spans[1], &k);
        L3D_CHECK(m->ctx, l3d_kv_pass_spans(c, c->spans[1], np, tokens + t0,
                                            logits + (size_t)r0 * m->V, (size_t)m->V, NULL, NULL));
        for (int j = 0; j < np; j++) r0 += c->spans[1][j].logits != 0;
        t0 += k;
    }
    return L3D_OK;
}

l3d_status l3d_model_decode_batch(l3d_model_t *m, l3d_kv_cache_t *c, const int *seqs,
                                  const int32_t *tokens, int n, float *logits) {
    if (!m || !c || !seqs || n < 1 || n > c->n_seq)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_model_decode_batch: NULL "
                         "argument, or %d rows for %d sequences", n, c ? c->n_seq : 0);
    for (int i = 0; i < n; i++) c->spans[0][i] = (l3d_decode_span_t){seqs[i], 1, 1};
    return l3d_model_decode_spans(m, c, c->spans[0], n, tokens, logits);
}

l3d_status l3d_kv_check_spans(l3d_kv_cache_t *c, const l3d_decode_span_t *sp, int ns,
                              const int32_t *tokens, const char *what, int *n_tokens_p,
                              int *n_logits_p) {
    l3d_ctx_t *ctx = c->m->ctx;
    int V = c->m->cfg.vocab_size, t0 = 0, lg = 0;
    if (ns < 1 || ns > c->n_seq)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: %d spans for %d sequences", what, ns,
                         c->n_seq);
    // (a stamp per call marks the sequences seen: linear in the spans, where comparing every
    // pair cost 8M comparisons a step at 4096 slots; at the stamp's wrap every mark is reset)
    if (++c->stamp == 0) {
        memset(c->seen, 0, (size_t)c->n_seq * sizeof(uint32_t));
        c->stamp = 1;
    }
    for (int j = 0; j < ns; j++) {
        int s = sp[j].seq;
        if (s < 0 || s >= c->n_seq)
            return l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: sequence %d of a cache of %d", what,
                             s, c->n_seq);
        if (c->seen[s] == c->stamp)
            return l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: sequence %d appears twice (one "
                             "span per sequence)", what, s);
        c->seen[s] = c->stamp;
        if (sp[j].n < 1 || sp[j].n > c->cap - c->lens[s])
            return l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: %d tokens for sequence %d at "
                             "position %d (capacity %d)", what, sp[j].n, s, c->lens[s], c->cap);
        for (int i = 0; tokens && i < sp[j].n; i++)
            if (tokens[t0 + i] < 0 || tokens[t0 + i] >= V)
                return l3d_error(ctx, L3D_ERR_INVALID_ARG, "token %d of sequence %d is outside "
                                 "the vocabulary [0, %d)", tokens[t0 + i], s, V);
        t0 += sp[j].n;
        lg += sp[j].logits != 0;
    }
    *n_tokens_p = t0;
    *n_logits_p = lg;
    return L3D_OK;
}

int l3d_kv_spans_next(const l3d_decode_span_t *sp, int ns, int *span_i, int *off, int rows,
                      l3d_decode_span_t *out, int *k_p) {
    int np = 0, k = 0;
    while (*span_i < ns && k < rows) {
        const l3d_decode_span_t *s = &sp[*span_i];
        int take = L3D_MIN(s->n - *off, rows - k);
        out[np++] = (l3d_decode_span_t){s->seq, take, *off + take == s->n && s->logits};
        k += take;
        *off += take;
        if (*off == s->n) ++*span_i, *off = 0;
    }
    *k_p = k;
    return np;
}

l3d_status l3d_kv_pass_spans(l3d_kv_cache_t *c, const l3d_decode_span_t *sp, int ns,
                             const int32_t *tokens, float *out, size_t ldo, const float *x_prev,
                             float *x_next) {
    l3d_model_t *m = c->m;
    l3d_device_t *dev = m->dev;
    l3d_ctx_t *ctx = m->ctx;
    int C = m->C, V = m->V, k = 0;
    for (int j = 0; j < ns; j++) k += sp[j].n;
    if (m->has_embed) {
        L3D_CHECK(ctx, l3d_dev_copy(dev, c->tok, tokens, (size_t)k * sizeof(int32_t),
                                    L3D_COPY_H2D));
        L3D_CHECK(ctx, l3d_tp_embedding_fwd(m, c->xa, l3d_model_infer_w(m, m->embed), c->tok, k,
                                            L3D_FLOAT32, l3d_model_infer_wt(m)));
    } else {  // a later pipeline stage: the previous stage's output rows
        L3D_CHECK(ctx, l3d_dev_copy(dev, c->xa, x_prev, (size_t)k * C * sizeof(float),
                                    L3D_COPY_D2D));
    }
    float *x = c->xa, *y = c->xb;
    for (int l = 0; l < m->L; l++) {
        L3D_CHECK(ctx, spans_layer(c, l, sp, ns, k, x, y));
        float *t = x;
        x = y;
        y = t;
    }
    if (!m->has_head) {  // the rows go on to the next stage
        L3D_CHECK(ctx, l3d_dev_copy(dev, x_next, x, (size_t)k * C * sizeof(float), L3D_COPY_D2D));
    } else {
        // The head over the last row of each span asking for logits, logit_rows at a time
        // (their final norms gathered into lnf, one call per run of adjacent rows: a decode
        // step's rows are one run); under tp this rank's vocabulary slice (V columns) of
        // each, at out + j * ldo.
        const float *nw = l3d_model_infer_w(m, m->norm);
        int j = 0, r = 0, done = 0, at[INFER_LOGIT_ROWS];
        while (j < ns) {
            int rows = 0;
            for (; j < ns && rows < c->logit_rows; r += sp[j++].n)
                if (sp[j].logits) at[rows++] = r + sp[j].n - 1;
            if (!rows) continue;
            for (int a = 0, b; a < rows; a = b) {
                b = a + 1;
                while (b < rows && at[b] == at[b - 1] + 1) b++;
                L3D_CHECK(ctx, l3d_dev_rmsnorm_fwd(dev, c->lnf + (size_t)a * C, c->rstdf + a,
                                                   x + (size_t)at[a] * C, nw, b - a, C,
                                                   m->cfg.rms_norm_eps, L3D_FLOAT32,
                                                   l3d_model_infer_wt(m)));
            }
            l3d_gemm_t g = {.trans_a = 0, .trans_b = 1, .M = rows, .N = V, .K = C, .alpha = 1.0f,
                            .beta = 0.0f, .A = c->lnf, .lda = C,
                            .B = l3d_model_infer_w(m, m->head), .ldb = C, .C = c->logits,
                            .ldc = V, .b_type = l3d_model_infer_wt(m), .round_a = m->round_a16};
            L3D_CHECK(ctx, l3d_dev_gemm(dev, &g));
            for (int i = 0; i < rows; i++)
                L3D_CHECK(ctx, l3d_dev_copy(dev, out + (size_t)(done + i) * ldo,
                                            c->logits + (size_t)i * V, (size_t)V * sizeof(float),
                                            L3D_COPY_D2H));
            done += rows;
        }
    }
    L3D_CHECK(ctx, l3d_dev_sync(dev));
    for (int j = 0; j < ns; j++) c->lens[sp[j].seq] += sp[j].n;
    return L3D_OK;
}

l3d_status l3d_model_logits(l3d_model_t *m, const int32_t *tokens, int n, float *logits) {
    if (!m || !tokens || !logits || n < 1)
        return l3d_error(m ? m->ctx : NULL, L3D_ERR_INVALID_ARG, "l3d_model_logits: NULL "
                         "argument or n %d < 1", n);
    L3D_CHECK(m->ctx, whole_model(m, "l3d_model_logits"));
    l3d_kv_cache_t *c = NULL;
    L3D_CHECK(m->ctx, l3d_kv_cache_create(m, n, &c));
    l3d_status st = L3D_OK;
    for (int done = 0; done < n && st >= 0;) {
        int k = L3D_MIN(c->rows, n - done);
        st = decode_chunk(c, tokens + done, k, 0, logits + (size_t)done * m->V);
        done += k;
    }
    l3d_kv_cache_destroy(c);
    return st;
}
