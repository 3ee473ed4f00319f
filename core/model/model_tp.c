// Tensor parallelism (Megatron 1D) for the forward/backward of core/model/model_fwdbwd.c, and the
// gathering/slicing of shards for checkpoints.
//
// Where the tp group talks, per layer (N = B*T rows, C hidden):
//   forward   h = x + all_reduce(att_local Wo_local^T)        (N,C)  row-parallel o_proj
//             x' = h + all_reduce(sw_local Wd_local^T)        (N,C)  row-parallel down_proj
//   backward  dln2 = all_reduce(dgate Wg_local + dup Wu_local) (N,C)  column-parallel gate/up
//             dln1 = all_reduce(dq Wq + dk Wk + dv Wv)         (N,C)  column-parallel q/k/v
// plus the vocabulary-parallel embedding (all-reduce of (N,C)), head (all-reduce of dlnf) and
// cross-entropy (all-reduce MAX of (N), SUM of (N,2)): the full logits never meet on one rank.
// Everything else (norms, rope, attention on this rank's heads, SwiGLU) is local.
#include <string.h>

#include "core/model/model_internal.h"
#include "core/model/tp2d.h"
#include "core/model/tp3d.h"

static l3d_status comm_fail(l3d_model_t *m, l3d_comm_t *c, l3d_status st, const char *what) {
    return l3d_error(m->ctx, st, "tensor parallel %s: %s", what,
                     l3d_ctx_last_error(l3d_comm_ctx(c)));
}

static l3d_status allreduce(l3d_model_t *m, l3d_comm_t *c, void *x, size_t n, l3d_dtype t,
                            l3d_redop op, const char *what) {
    L3D_CHECK(m->ctx, l3d_dev_sync(m->dev));  // host transports read device results
    l3d_status st = l3d_comm_allreduce(c, x, x, n, t, op);
    return st < 0 ? comm_fail(m, c, st, what) : L3D_OK;
}

// (2d, 3d: the block products leave every block complete; nothing to sum)
l3d_status l3d_tp_allreduce(l3d_model_t *m, void *x, size_t n, l3d_dtype t) {
    if (m->tp.size == 1 || m->tp.mode >= 2) return L3D_OK;
    return allreduce(m, m->tp.comm, x, n, t, L3D_SUM, "all-reduce");
}

l3d_status l3d_tp_residual_init(l3d_model_t *m, void *dst, const void *residual, size_t n,
                                l3d_dtype t) {
    if (m->tp.rank == 0 || m->tp.mode >= 2)  // (2d, 3d: every rank's block is its own)
        return l3d_dev_copy(m->dev, dst, residual, n * l3d_dtype_size(t), L3D_COPY_D2D);
    return l3d_dev_memset(m->dev, dst, 0, n * l3d_dtype_size(t));
}

l3d_status l3d_tp_embedding_fwd(l3d_model_t *m, void *out, const void *table,
                                const int32_t *tokens, int N, l3d_dtype at, l3d_dtype wt) {
    // (2d, 3d: the table's columns j (l) for this rank's tokens, the block itself)
    if (m->tp.size == 1 || m->tp.mode >= 2)
        return l3d_dev_embedding_fwd(m->dev, out, tokens, table, N, m->C, m->Vemb, at, wt);
    L3D_CHECK(m->ctx, l3d_dev_embedding_fwd_vp(m->dev, out, tokens, table, N, m->C, m->tp.v0,
                                               m->V, m->cfg.vocab_size, at, wt));
    return allreduce(m, m->tp.comm, out, (size_t)N * m->C, at, L3D_SUM, "embedding");
}

l3d_status l3d_tp_embedding_fwd_partial(l3d_model_t *m, void *out, const void *table,
                                        const int32_t *tokens, int N, l3d_dtype at,
                                        l3d_dtype wt) {
    return l3d_dev_embedding_fwd_vp(m->dev, out, tokens, table, N, m->C, m->tp.v0,
                                    m->V, m->cfg.vocab_size, at, wt);
}

l3d_status l3d_tp_embedding_bwd(l3d_model_t *m, void *dtable, const void *dout,
                                const int32_t *tokens, int N, l3d_dtype at) {
    if (m->tp.size == 1 || m->tp.mode >= 2)
        return l3d_dev_embedding_bwd(m->dev, dtable, dout, tokens, N, m->C, at, m->gt);
    return l3d_dev_embedding_bwd_vp(m->dev, dtable, dout, tokens, N, m->C, m->tp.v0, m->V, at,
                                    m->gt);
}

l3d_status l3d_tp_xent(l3d_model_t *m, l3d_acts_t *a, int N, float grad_scale) {
    l3d_dtype at = a->at;
    if (m->tp.size == 1)
        return l3d_dev_xent_fwd_bwd(m->dev, a->logits, a->losses, a->targets, N, m->V,
                                    grad_scale, at);
    l3d_device_t *dev = m->dev;
    int Vl = m->V, v0 = m->tp.v0;
    // the ranks holding the other vocabulary columns of these rows
    l3d_comm_t *vc = m->tp.mode >= 2 ? m->tp.vocab_comm : m->tp.comm;
    L3D_CHECK(m->ctx, l3d_dev_xent_vp_max(dev, a->logits, a->vp_max, N, Vl, at));
    L3D_CHECK(m->ctx, allreduce(m, vc, a->vp_max, (size_t)N, L3D_FLOAT32, L3D_MAX,
                                "cross-entropy max"));
    L3D_CHECK(m->ctx, l3d_dev_xent_vp_stats(dev, a->logits, a->vp_max, a->targets, N, Vl, v0,
                                            a->vp_stats, at));
    L3D_CHECK(m->ctx, allreduce(m, vc, a->vp_stats, 2 * (size_t)N, L3D_FLOAT32, L3D_SUM,
                                "cross-entropy sums"));
    return l3d_dev_xent_vp_grad(dev, a->logits, a->losses, a->vp_max, a->vp_stats, a->targets, N,
                                Vl, v0, grad_scale, at);
}

// (in m->gt: a 16-bit gradient's partials are summed in float32 and rounded once)
l3d_status l3d_tp_sum_kv_grads(l3d_model_t *m, void *gk, void *gv) {
    if (!m->tp.kv_comm) return L3D_OK;
    size_t n = (size_t)m->KVH * m->D * m->C;
    L3D_CHECK(m->ctx, allreduce(m, m->tp.kv_comm, gk, n, m->gt, L3D_SUM, "k_proj gradient"));
    return allreduce(m, m->tp.kv_comm, gv, n, m->gt, L3D_SUM, "v_proj gradient");
}

l3d_status l3d_tp_sum_norm_grad(l3d_model_t *m, void *g) {
    if (m->tp.mode >= 2)
        return allreduce(m, m->tp.repl_comm, g, (size_t)m->C, m->gt, L3D_SUM, "norm gradient");
    if (!m->tp.sp) return L3D_OK;
    return allreduce(m, m->tp.comm, g, (size_t)m->C, m->gt, L3D_SUM, "norm gradient");
}

l3d_status l3d_tp_sum_embed_grad(l3d_model_t *m, void *g) {
    if (m->tp.mode < 2) return L3D_OK;
    return allreduce(m, m->tp.repl_comm, g, (size_t)m->Vemb * (size_t)m->C, m->gt, L3D_SUM,
                     "embedding gradient");
}

// ---- tied embeddings under 2d and 3d ------------------------------------------------------
// The table E (Vemb x C) lies as the embedding needs it: every row, this rank's columns (2d:
// j, 3d: l). The head's block is 3d's rows (j*q + i)*V/q^2.. of those columns, so it reads E
// in place; 2d's is rows j*V/q.. of columns i, held by the transposed grid rank (j, i).

// 2d: rank (i, j)'s partner (j, i) on the grid communicator; the diagonal is its own.
static int tied_partner(const l3d_model_t *m) {
    int q = m->tp.q, i = m->tp.rank / q, j = m->tp.rank % q;
    return j * q + i;
}

// Sends n elements of `send` to the partner and receives n into `recv` (grouped, so the two
// directions cannot deadlock); the diagonal copies.
static l3d_status tied_swap(l3d_model_t *m, const void *send, void *recv, size_t n,
                            l3d_dtype t, const char *what) {
    int peer = tied_partner(m);
    if (peer == m->tp.rank)
        return l3d_dev_copy(m->dev, recv, send, n * l3d_dtype_size(t), L3D_COPY_D2D);
    L3D_CHECK(m->ctx, l3d_dev_sync(m->dev));  // host transports read device results
    l3d_comm_t *c = m->tp.comm;
    l3d_status st = l3d_comm_group_start(c);
    if (st >= 0) {
        l3d_status s1 = l3d_comm_send(c, send, n, t, peer);
        l3d_status s2 = l3d_comm_recv(c, recv, n, t, peer);
        st = l3d_comm_group_end(c);  // (ends the group even when a post failed)
        if (st >= 0) st = s1 < 0 ? s1 : s2;
    }
    return st < 0 ? comm_fail(m, c, st, what) : L3D_OK;
}

l3d_status l3d_tp_tied_head_w(l3d_model_t *m, l3d_acts_t *a, const void *E, void *gE,
                              const void **w, void **gw) {
    *w = E, *gw = gE;
    if (!m->cfg.tie_word_embeddings || m->tp.mode < 2) return L3D_OK;
    size_t C = (size_t)m->C, V = (size_t)m->V, es = l3d_dtype_size(m->wt);
    int q = m->tp.q, r = m->tp.rank;
    if (m->tp.mode == 3) {
        size_t row = (size_t)(r / q % q) * V + (size_t)(r / (q * q)) * (V / (size_t)q);
        *w = (const char *)E + row * C * es;
        if (gE) *gw = l3d_elem(gE, m->gt, row * C);
        return L3D_OK;
    }
    *w = a->tied_w, *gw = a->tied_g;
    if (gE)  // the backward: the forward of these activations fetched the block
        return l3d_dev_memset(m->dev, a->tied_g, 0, V * C * sizeof(float));
    size_t i = (size_t)(r / q);
    return tied_swap(m, (const char *)E + i * V * C * es, a->tied_w, V * C, m->wt,
                     "tied head weights");
}

l3d_status l3d_tp_tied_head_g(l3d_model_t *m, l3d_acts_t *a, void *gE) {
    if (!m->cfg.tie_word_embeddings || m->tp.mode != 2) return L3D_OK;
    size_t C = (size_t)m->C, V = (size_t)m->V, i = (size_t)(m->tp.rank / m->tp.q);
    L3D_CHECK(m->ctx, tied_swap(m, a->tied_g, a->tied_r, V * C, L3D_FLOAT32,
                                "tied head gradient"));
    float *rows = (float *)gE + i * V * C;  // (2d: float32 gradients, l3d_model_set_grad_dtype)
    return l3d_dev_add(m->dev, rows, rows, a->tied_r, V * C, L3D_FLOAT32);
}

void l3d_tp2d_tied_bytes(const l3d_model_config_t *cfg, int q, int i, int j, int wes,
                         uint64_t *bytes, uint64_t *calls) {
    uint64_t blk = (uint64_t)(cfg->vocab_size / q) * (uint64_t)(cfg->hidden_size / q);
    int off = cfg->tie_word_embeddings && i != j;
    // forward: send + recv of the weight block; backward: of its float32 gradient
    *bytes = off ? blk * ((uint64_t)wes + sizeof(float)) : 0;
    *calls = off ? 4 : 0;
}

// SUMMA products (core/model/tp2d.h) of N rows from I to O (per rank): fwd forwards and one
// backward (dx and dW), into bytes/calls (l3d_tp2d_linear_bytes's).
static void summa_bytes(int q, uint64_t N, uint64_t I, uint64_t O, int fwd, uint64_t es,
                        uint64_t b[2], uint64_t c[2]) {
    uint64_t fb[2], bb[2], fc[2], bc[2];
    l3d_tp2d_linear_bytes(q, (int)(N * q), (int)(I * q), (int)(O * q), (int)es, fb, bb, fc, bc);
    for (int k = 0; k < 2; k++) {
        b[k] += (uint64_t)fwd * fb[k] + bb[k];
        c[k] += (uint64_t)fwd * fc[k] + bc[k];
    }
}

void l3d_tp2d_micro_bytes(const l3d_model_config_t *cfg, int q, int L, int embed, int head,
                          int B, int T, int recompute, int sync, int es, uint64_t bytes[2],
                          uint64_t calls[2]) {
    uint64_t N = (uint64_t)B * T, C = cfg->hidden_size / q, F = cfg->intermediate_size / q;
    uint64_t HD = (uint64_t)cfg->num_attention_heads / q * cfg->head_dim;
    uint64_t KD = (uint64_t)cfg->num_key_value_heads / q * cfg->head_dim;
    uint64_t V = cfg->vocab_size / q, Ve = cfg->vocab_size, h = head != 0;
    uint64_t b[2] = {0, 0}, c[2] = {0, 0};
    // a layer's products: q, k, v, o, gate, up, down
    uint64_t prod[7][2] = {{C, HD}, {C, KD}, {C, KD}, {HD, C}, {C, F}, {C, F}, {F, C}};
    int fwd_passes = recompute ? 2 : 1;  // the rebuild repeats the forward
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < 7; k++)
            summa_bytes(q, N, prod[k][0], prod[k][1], fwd_passes, (uint64_t)es, b, c);
        // two norms: an all-reduce of N row statistics per forward and per backward
        b[0] += (uint64_t)(2 * fwd_passes + 2) * N * 4, c[0] += (uint64_t)(2 * fwd_passes + 2);
    }
    if (head) {
        b[0] += 2 * N * 4, c[0] += 2;        // the final norm, forward and backward
        summa_bytes(q, N, C, V, 1, (uint64_t)es, b, c);  // the head
        b[0] += 3 * N * 4, c[0] += 2;        // cross-entropy: max (N), sums (2N)
        b[1] += 8 * (uint64_t)q, c[1] += 1;  // the loss: an all-gather of one double
    }
    if (sync) {  // replicated norms and the embedding
        b[1] += ((2 * (uint64_t)L + h) * C + (embed ? Ve * C : 0)) * 4;
        c[1] += 2 * (uint64_t)L + h + (embed != 0);
    }
    bytes[0] = b[0], bytes[1] = b[1], calls[0] = c[0], calls[1] = c[1];
}

// 3d: cube products (core/model/tp3d.h) of N rows from I to O (per rank) of orientation `kind`,
// forward (passes 1) or backward (2: dx and dW with one gather of dy), into bytes/calls per
// axis, elements of es bytes.
static void cube_bytes(int q, uint64_t N, uint64_t I, uint64_t O, int kind, int passes,
                       uint64_t es, uint64_t *b, uint64_t *c) {
    uint64_t fb[3], bb[3], fc[3], bc[3];
    l3d_tp3d_linear_bytes(q, kind, (int)(N * q * q), (int)(I * q), (int)(O * q), (int)es, fb, bb,
                          fc, bc);
    for (int k = 0; k < 3; k++) {
        b[k] += passes == 1 ? fb[k] : bb[k];
        c[k] += passes == 1 ? fc[k] : bc[k];
    }
}

void l3d_tp3d_micro_bytes(const l3d_model_config_t *cfg, int q, int L, int embed, int head,
                          int B, int T, int recompute, int sync, int es,
                          uint64_t bytes[L3D_TP3D_COMMS], uint64_t calls[L3D_TP3D_COMMS]) {
    uint64_t N = (uint64_t)B * T, C = cfg->hidden_size / q, F = cfg->intermediate_size / q;
    uint64_t HD = (uint64_t)cfg->num_attention_heads / q * cfg->head_dim;
    uint64_t KD = (uint64_t)cfg->num_key_value_heads / q * cfg->head_dim;
    uint64_t V = cfg->vocab_size / q, Ve = cfg->vocab_size, h = head != 0, e = es;
    uint64_t b[L3D_TP3D_COMMS] = {0}, c[L3D_TP3D_COMMS] = {0};
    // a layer's products: q, k, v, o, gate, up, down
    static const int kinds[7] = {L3D_TP3D_A, L3D_TP3D_A, L3D_TP3D_A, L3D_TP3D_B,
                                 L3D_TP3D_A, L3D_TP3D_A, L3D_TP3D_B};
    uint64_t prod[7][2] = {{C, HD}, {C, KD}, {C, KD}, {HD, C}, {C, F}, {C, F}, {F, C}};
    int fwd_passes = recompute ? 2 : 1;  // the rebuild repeats the forward
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < 7; k++) {
            for (int p = 0; p < fwd_passes; p++)
                cube_bytes(q, N, prod[k][0], prod[k][1], kinds[k], 1, e, b, c);
            cube_bytes(q, N, prod[k][0], prod[k][1], kinds[k], 2, e, b, c);
        }
        // two norms: an all-reduce of N row statistics along l per forward and per backward
        b[2] += (uint64_t)(2 * fwd_passes + 2) * N * 4, c[2] += (uint64_t)(2 * fwd_passes + 2);
    }
    if (head) {
        b[2] += 2 * N * 4, c[2] += 2;  // the final norm, forward and backward
        cube_bytes(q, N, C, V, L3D_TP3D_A, 1, e, b, c);  // the head
        cube_bytes(q, N, C, V, L3D_TP3D_A, 2, e, b, c);
        b[1] += 3 * N * 4, c[1] += 2;                // cross-entropy: max (N), sums (2N)
        b[3] += 8 * (uint64_t)q * q, c[3] += 1;      // the loss: an all-gather of one double
    }
    if (sync) {  // replicated norms and the embedding, over plane l
        b[4] += ((2 * (uint64_t)L + h) * C + (embed ? Ve * C : 0)) * 4;
        c[4] += 2 * (uint64_t)L + h + (embed != 0);
    }
    for (int k = 0; k < L3D_TP3D_COMMS; k++) bytes[k] = b[k], calls[k] = c[k];
}

// RMSNorm of rows whose columns are split (2d, 3d): each rank sums its C columns' squares
// (or, backward, dout.w.x) into the row statistic, the ranks holding the other columns
// (norm_comm) all-reduce it, and the device finishes the rows over the whole C_full.
static l3d_status row_stat(l3d_model_t *m, int rows, float **stat) {
    L3D_CHECK(m->ctx, l3d_tp_scratch_grow(m->ctx, m->dev, &m->tp.stat, &m->tp.cap_stat,
                                          (size_t)(rows > 0 ? rows : 1), "tp"));
    *stat = m->tp.stat;
    return L3D_OK;
}

static l3d_status sum_row_stat(l3d_model_t *m, float *stat, int rows) {
    return allreduce(m, m->tp.norm_comm, stat, (size_t)rows, L3D_FLOAT32, L3D_SUM,
                     "norm statistics");
}

l3d_status l3d_tp_rmsnorm_fwd(l3d_model_t *m, void *out, float *rstd, const void *x,
                              const void *w, int rows, l3d_dtype at, l3d_dtype wt) {
    float eps = m->cfg.rms_norm_eps, *ss;
    if (m->tp.mode < 2)
        return l3d_dev_rmsnorm_fwd(m->dev, out, rstd, x, w, rows, m->C, eps, at, wt);
    L3D_CHECK(m->ctx, row_stat(m, rows, &ss));
    L3D_CHECK(m->ctx, l3d_dev_rmsnorm_rowdot(m->dev, ss, x, x, NULL, rows, m->C, at, wt));
    L3D_CHECK(m->ctx, sum_row_stat(m, ss, rows));
    return l3d_dev_rmsnorm_rows_fwd(m->dev, out, rstd, x, w, ss, rows, m->C, m->cfg.hidden_size,
                                    eps, at, wt);
}

l3d_status l3d_tp_rmsnorm_bwd(l3d_model_t *m, void *dx, void *dw, const void *dout,
                              const void *x, const void *w, const float *rstd, int rows,
                              l3d_dtype at, l3d_dtype wt) {
    float *dot;
    if (m->tp.mode < 2)
        return l3d_dev_rmsnorm_bwd(m->dev, dx, dw, dout, x, w, rstd, rows, m->C, at, wt,
                                   m->gt);
    L3D_CHECK(m->ctx, row_stat(m, rows, &dot));
    L3D_CHECK(m->ctx, l3d_dev_rmsnorm_rowdot(m->dev, dot, dout, x, w, rows, m->C, at, wt));
    L3D_CHECK(m->ctx, sum_row_stat(m, dot, rows));
    return l3d_dev_rmsnorm_rows_bwd(m->dev, dx, dw, dout, x, w, rstd, dot, rows, m->C,
                                    m->cfg.hidden_size, at, wt, m->gt);
}

int l3d_tp_sub_comms(const l3d_model_t *m, l3d_comm_t *out[L3D_TP3D_COMMS]) {
    if (m->tp.g) {
        out[0] = m->tp.g->row, out[1] = m->tp.g->col;
        return 2;
    }
    if (!m->tp.g3) return 0;
    for (int k = 0; k < 3; k++) out[k] = m->tp.g3->axis[k];
    out[3] = m->tp.g3->plane[1], out[4] = m->tp.g3->plane[2];
    return L3D_TP3D_COMMS;
}

l3d_status l3d_tp_gather_rows_from(l3d_model_t *m, const void *mine, void *full, size_t rows,
                                   l3d_dtype t) {
    L3D_CHECK(m->ctx, l3d_dev_sync(m->dev));
    l3d_status st = l3d_comm_allgather(m->tp.comm, mine, full, rows * (size_t)m->C, t);
    return st < 0 ? comm_fail(m, m->tp.comm, st, "sequence all-gather") : L3D_OK;
}

l3d_status l3d_tp_gather_rows(l3d_model_t *m, void *full, size_t rows, l3d_dtype t) {
    size_t n = rows * (size_t)m->C;
    return l3d_tp_gather_rows_from(m, l3d_elem(full, t, (size_t)m->tp.rank * n), full, rows, t);
}

l3d_status l3d_tp_scatter_rows(l3d_model_t *m, const void *partial, void *out, size_t rows,
                               l3d_dtype t) {
    L3D_CHECK(m->ctx, l3d_dev_sync(m->dev));
    l3d_status st = l3d_comm_reduce_scatter(m->tp.comm, partial, out, rows * (size_t)m->C, t,
                                            L3D_SUM);
    return st < 0 ? comm_fail(m, m->tp.comm, st, "sequence reduce-scatter") : L3D_OK;
}

// ---- checkpoints: shards <-> the full (single-rank) layout -------------------------------------
// Copies `bytes` between any two of: the model device's memory, host memory. Device copies
// are queued on the current stream: the caller syncs before the host reads what they wrote.
static l3d_status arena_copy(const l3d_model_t *m, void *dst, const void *src, size_t bytes) {
    int dd = l3d_dev_is_device_ptr(m->dev, dst), ds = l3d_dev_is_device_ptr(m->dev, src);
    if (!dd && !ds) {
        memcpy(dst, src, bytes);
        return L3D_OK;
    }
    return l3d_dev_copy(m->dev, dst, src, bytes,
                        dd && ds ? L3D_COPY_D2D : dd ? L3D_COPY_H2D : L3D_COPY_D2H);
}

// Copies the shard of tensor p between the local arena and the full tensor at `full`
// (full[0] x full[1] floats), row by row: either side may be device or host memory.
// to_full: local -> full.
static l3d_status copy_shard(const l3d_model_t *m, const l3d_param_t *p, float *local,
                             float *full, int to_full) {
    size_t rows = (size_t)p->shape[0], cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
    size_t fcols = p->ndim == 2 ? (size_t)p->full[1] : 1;
    if (cols == fcols)  // whole rows: one block
        return to_full ? arena_copy(m, full + (size_t)p->r0 * fcols, local,
                                    rows * cols * sizeof(float))
                       : arena_copy(m, local, full + (size_t)p->r0 * fcols,
                                    rows * cols * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        float *f = full + ((size_t)p->r0 + r) * fcols + (size_t)p->c0;
        float *s = local + r * cols;
        L3D_CHECK(m->ctx, to_full ? arena_copy(m, f, s, cols * sizeof(float))
                                  : arena_copy(m, s, f, cols * sizeof(float)));
    }
    return L3D_OK;
}

// The tensor of `full` named like p (pipeline stages hold a subset, in the same order).
static const l3d_param_t *find(const l3d_model_t *full, const char *name) {
    for (int i = 0; i < full->n_tensors; i++)
        if (!strcmp(full->tensors[i].name, name)) return &full->tensors[i];
    return NULL;
}

l3d_status l3d_model_copy_named(const l3d_model_t *m, const float *arena, const l3d_model_t *full,
                                float *full_arena) {
    for (int i = 0; i < m->n_tensors; i++) {
        const l3d_param_t *p = &m->tensors[i], *q = find(full, p->name);
        if (q) L3D_CHECK(m->ctx, copy_shard(m, p, (float *)arena + p->offset,
                                            full_arena + q->offset, 1));
    }
    return l3d_dev_sync(m->dev);
}

l3d_status l3d_model_tp_slice(const l3d_model_t *m, const l3d_model_t *full,
                              const float *full_arena, float *local_arena) {
    for (int i = 0; i < m->n_tensors; i++) {
        const l3d_param_t *p = &m->tensors[i], *q = find(full, p->name);
        if (q) L3D_CHECK(m->ctx, copy_shard(m, p, local_arena + p->offset,
                                            (float *)full_arena + q->offset, 0));
    }
    return l3d_dev_sync(m->dev);
}

// Collective over the tp group. Every rank sends its shard of each tensor; tp rank 0 places
// them into full_arena (the others pass NULL). Shards of one tensor differ in size only by
// the uneven vocabulary split, so each travels padded to the largest.
l3d_status l3d_model_tp_gather(l3d_model_t *m, const float *local_arena, const l3d_model_t *full,
                               float *full_arena) {
    if (m->tp.size == 1) return full_arena ? l3d_model_copy_named(m, local_arena, full, full_arena)
                                           : L3D_OK;
    int tp = m->tp.size;
    // Every rank's layout, to know where its shards go and the largest shard of each tensor.
    l3d_model_t *peer = l3d_calloc(m->ctx, (size_t)tp, sizeof(*peer), "other");
    l3d_param_t *pt = l3d_calloc(m->ctx, (size_t)tp * (size_t)m->n_tensors, sizeof(*pt), "other");
    l3d_layer_params_t *pl = l3d_calloc(m->ctx, (size_t)tp * (size_t)m->L, sizeof(*pl), "other");
    float *send = NULL, *recv = NULL;
    size_t maxn = 0;
    l3d_status st = peer && pt && pl ? L3D_OK : L3D_ERR_NOMEM;
    for (int j = 0; j < tp && st >= 0; j++) {
        peer[j].tensors = pt + (size_t)j * m->n_tensors;
        peer[j].layer = pl + (size_t)j * m->L;
        l3d_model_set_dims_mode(&peer[j], &m->cfg, tp, m->tp.mode, j);
        // the same stage, chunks and layers as this rank
        l3d_model_set_stage(&peer[j], m->pp_size, m->nchunks, m->pp_rank, NULL);
        peer[j].l0 = m->l0;
        peer[j].L = m->L;
        memcpy(peer[j].chunk_start, m->chunk_start, sizeof(m->chunk_start));
        memcpy(peer[j].chunk_g0, m->chunk_g0, sizeof(m->chunk_g0));
        l3d_model_layout(&peer[j]);
        for (int i = 0; i < m->n_tensors; i++) maxn = L3D_MAX(maxn, peer[j].tensors[i].numel);
    }
    if (st >= 0) {
        send = l3d_malloc(m->ctx, maxn * sizeof(float), "staging");
        recv = l3d_malloc(m->ctx, (size_t)tp * maxn * sizeof(float), "staging");
        if (!send || !recv) st = L3D_ERR_NOMEM;
    }
    if (st < 0) goto out;
    L3D_CHECK_GOTO(m->ctx, l3d_dev_sync(m->dev), st, out);
    for (int i = 0; i < m->n_tensors && st >= 0; i++) {
        const l3d_param_t *p = &m->tensors[i];
        memset(send, 0, maxn * sizeof(float));
        st = arena_copy(m, send, local_arena + p->offset, p->numel * sizeof(float));
        if (st >= 0) st = l3d_dev_sync(m->dev);
        if (st >= 0) st = l3d_comm_allgather(m->tp.comm, send, recv, maxn, L3D_FLOAT32);
        if (st < 0) {
            st = comm_fail(m, m->tp.comm, st, "checkpoint gather");
            break;
        }
        const l3d_param_t *q = full_arena ? find(full, p->name) : NULL;
        if (!q) continue;
        for (int j = 0; j < tp && st >= 0; j++)
            st = copy_shard(m, &peer[j].tensors[i], recv + (size_t)j * maxn,
                            full_arena + q->offset, 1);
        if (st >= 0) st = l3d_dev_sync(m->dev);  // before recv is reused
    }
out:
    l3d_free(m->ctx, recv, (size_t)tp * maxn * sizeof(float), "staging");
    l3d_free(m->ctx, send, maxn * sizeof(float), "staging");
    l3d_free(m->ctx, pl, (size_t)tp * (size_t)m->L * sizeof(*pl), "other");
    l3d_free(m->ctx, pt, (size_t)tp * (size_t)m->n_tensors * sizeof(*pt), "other");
    l3d_free(m->ctx, peer, (size_t)tp * sizeof(*peer), "other");
    return st;
}
