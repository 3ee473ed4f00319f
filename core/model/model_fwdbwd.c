// Llama 3 forward and backward for training, one micro-batch at a time.
//
// Per layer (N = B*T rows, C hidden, F ffn, HD = H*D, KD = KVH*D):
//   ln1 = rmsnorm(x_in)                         (N,C)
//   q = ln1 Wq^T, k = ln1 Wk^T, v = ln1 Wv^T     (N,HD) (N,KD) (N,KD); rope on q and k
//   att = causal_gqa_attention(q, k, v)          (N,HD)
//   h = x_in + att Wo^T                          (N,C)
//   ln2 = rmsnorm(h); gate = ln2 Wg^T; up = ln2 Wu^T          (N,F)
//   x_out = h + (silu(gate) * up) Wd^T           (N,C)
// The backward runs the same steps in reverse; `dres` carries dL/d(residual stream).
#include <string.h>

#include "core/model/model_internal.h"
#include "core/comm/reduce.h"
#include "core/model/tp2d.h"
#include "core/model/tp3d.h"

// ---- linear layers: y = x W^T with W (out,in) as Hugging Face stores it -------------------
// Activations (x, y, dy, dx) in at, weights in wt; their gradients float32. Under tensor
// parallelism "2d" the sizes are this rank's blocks and each product is a SUMMA over the grid
// (core/model/tp2d.h); under "3d" a cube product (core/model/tp3d.h) whose orientation is the
// layer's kind: COL for the layers Megatron splits by output columns (q, k, v, gate, up, the head),
// which take the residual stream's layout to attention's, ROW for o and down, which take it
// back. Both float32, contiguous rows.
enum { COL = L3D_TP3D_A, ROW = L3D_TP3D_B };

// 2d and 3d products write dense blocks (k and v land in a cache only when decoding, which
// 2d and 3d do not do).
static l3d_status check_block_ld(l3d_model_t *m, int ld, int cols) {
    if (ld == cols) return L3D_OK;
    return l3d_error(m->ctx, L3D_ERR_UNSUPPORTED, "tp_mode %dd: a strided output (%d of %d "
                     "columns)", m->tp.mode, cols, ld);
}

// A 2d or 3d product's status on the model's context: the grids write their errors on the tp
// communicator's (the world's, shared by thread ranks).
static l3d_status block_status(l3d_model_t *m, l3d_status st) {
    if (st >= 0) return st;
    return l3d_error(m->ctx, st, "tensor parallel %dd product: %s", m->tp.mode,
                     l3d_ctx_last_error(l3d_comm_ctx(m->tp.comm)));
}

// y(N,O) = x(N,I) W(O,I)^T, beta = 0 overwrites, 1 accumulates. ldy lets k/v land in a cache.
static l3d_status linear_fwd(l3d_model_t *m, int kind, void *y, int ldy, const void *x,
                             const void *W, int N, int I, int O, float beta, l3d_dtype at,
                             l3d_dtype wt) {
    if (m->tp.mode == 2) {
        L3D_CHECK(m->ctx, check_block_ld(m, ldy, O));
        return block_status(m, l3d_tp2d_block_fwd(m->tp.g, y, x, W, N, I, O, beta, at, wt));
    }
    if (m->tp.mode == 3) {
        L3D_CHECK(m->ctx, check_block_ld(m, ldy, O));
        return block_status(m,
                            l3d_tp3d_block_fwd(m->tp.g3, kind, y, x, W, N, I, O, beta, at, wt));
    }
    l3d_gemm_t g = {.trans_a = 0, .trans_b = 1, .M = N, .N = O, .K = I, .alpha = 1.0f,
                    .beta = beta, .A = x, .lda = I, .B = W, .ldb = I, .C = y, .ldc = ldy,
                    .a_type = at, .b_type = wt, .c_type = at, .round_a = m->round_a16};
    return l3d_dev_gemm(m->dev, &g);
}
// dW(O,I) += dy(N,O)^T x(N,I), then dx(N,I) = dy(N,O) W(O,I) (beta as above). dx may be x's
// buffer: the weight gradient reads x first.
static l3d_status linear_bwd(l3d_model_t *m, int kind, void *dx, float beta, void *dW,
                             const void *dy, const void *x, const void *W, int N, int I, int O,
                             l3d_dtype at, l3d_dtype wt) {
    // (2d and 3d: float32 gradients, l3d_model_set_grad_dtype)
    if (m->tp.mode == 2) {
        l3d_status st = l3d_tp2d_block_bwd_w(m->tp.g, (float *)dW, dy, x, N, I, O, at);
        if (st >= 0) st = l3d_tp2d_block_bwd_x(m->tp.g, dx, dy, W, N, I, O, beta, at, wt);
        return block_status(m, st);
    }
    if (m->tp.mode == 3)
        return block_status(m, l3d_tp3d_block_bwd(m->tp.g3, kind, dx, beta, (float *)dW, dy, x,
                                                  W, N, I, O, at, wt));
    l3d_gemm_t gw = {.trans_a = 1, .trans_b = 0, .M = O, .N = I, .K = N, .alpha = 1.0f,
                     .beta = 1.0f, .A = dy, .lda = O, .B = x, .ldb = I, .C = dW, .ldc = I,
                     .a_type = at, .b_type = at, .c_type = m->gt};
    L3D_CHECK(m->ctx, l3d_dev_gemm(m->dev, &gw));
    l3d_gemm_t gx = {.trans_a = 0, .trans_b = 0, .M = N, .N = I, .K = O, .alpha = 1.0f,
                     .beta = beta, .A = dy, .lda = O, .B = W, .ldb = I, .C = dx, .ldc = I,
                     .a_type = at, .b_type = wt, .c_type = at};
    return l3d_dev_gemm(m->dev, &gx);
}

// ---- activations -------------------------------------------------------------------------
// A bump allocator over one arena: first pass (base NULL) measures, second assigns.
typedef struct arena {
    char *base;
    size_t off;
} arena_t;
static void *take(arena_t *a, size_t bytes) {
    void *p = a->base ? a->base + a->off : NULL;
    a->off += (bytes + 63) & ~(size_t)63;
    return p;
}

// The rows of the residual stream (x_in, h, x_out, x_final, dres) a rank holds: all N, or
// with sequence parallelism its N/tp (Korthikanti et al.'s sbh/t; the layers read and write
// no others, and the pipeline sends those).
static size_t resid_rows(const l3d_model_t *m, size_t N) {
    return m->tp.sp ? N / (size_t)m->tp.size : N;
}

// Activations take es bytes an element (their dtype), row statistics f.
// A kept layer (with_x_in) under sequence parallelism keeps its norms' rows only (ln_part);
// the layer rebuilt under recomputation keeps them all (it is one set, and its backward
// follows at once).
static void layout_layer(arena_t *ar, l3d_layer_acts_t *la, const l3d_model_t *m, size_t N,
                         int B, int T, int with_x_in, size_t es) {
    size_t C = (size_t)m->C, F = (size_t)m->F, HD = (size_t)m->H * m->D;
    size_t KD = (size_t)m->KVH * m->D, f = sizeof(float), xr = resid_rows(m, N);
    la->ln_part = with_x_in && m->tp.sp;
    size_t lr = la->ln_part ? xr : N;
    if (with_x_in) la->x_in = take(ar, xr * C * es);
    la->rstd1 = take(ar, N * f);
    la->ln1 = take(ar, lr * C * es);
    la->q = take(ar, N * HD * es);
    la->k = take(ar, N * KD * es);
    la->v = take(ar, N * KD * es);
    la->att = take(ar, N * HD * es);
    la->lse = take(ar, (size_t)B * (size_t)m->H * (size_t)T * f);
    la->h = take(ar, xr * C * es);
    la->rstd2 = take(ar, N * f);
    la->ln2 = take(ar, lr * C * es);
    la->gate = take(ar, N * F * es);
    la->up = take(ar, N * F * es);
}

// The rows of x_in a checkpoint keeps and where they sit in it: all N; 1/tp of them at this
// rank's place (partition_activations); with sequence parallelism x_in holds this rank's rows
// at its start.
static int ckpt_partitioned(const l3d_model_t *m, const l3d_acts_t *a) {
    return (a->recompute & L3D_CKPT_PARTITION) && m->tp.size > 1 && !m->tp.sp;
}

static void ckpt_span(const l3d_model_t *m, const l3d_acts_t *a, size_t *rows, size_t *off) {
    size_t N = (size_t)a->B * (size_t)a->T, tp = (size_t)m->tp.size;
    *rows = m->tp.sp || ckpt_partitioned(m, a) ? N / tp : N;
    *off = ckpt_partitioned(m, a) ? (size_t)m->tp.rank * *rows : 0;
}

// The kept inputs in host memory (L3D_CKPT_CPU): a->L of them, side by side.
static void layout_host_ckpt(arena_t *ar, l3d_acts_t *a, const l3d_model_t *m) {
    size_t rows, off;
    ckpt_span(m, a, &rows, &off);
    for (int l = 0; l < a->L; l++) {
        void *p = take(ar, rows * (size_t)m->C * l3d_dtype_size(a->at));
        if (a->layers) a->layers[l].ckpt = p;
    }
}

// One layer's own storage, what it keeps from its forward to its backward: everything
// (no recomputation), its input (recomputation), or its checkpoint rows apart from it
// (L3D_CKPT_PARTITION; with L3D_CKPT_CPU they are host memory: nothing here). A set's layers
// take it from the set's memory, or, in a pooled set, from blocks bound per micro-batch
// (l3d_acts_bind). The other fields of a layer are the set's (shared by its layers).
static void layout_own_layer(arena_t *ar, l3d_layer_acts_t *la, const l3d_model_t *m,
                             const l3d_acts_t *a) {
    size_t N = (size_t)a->B * (size_t)a->T, es = l3d_dtype_size(a->at), C = (size_t)m->C;
    if (a->recompute & (L3D_CKPT_PARTITION | L3D_CKPT_CPU)) {
        size_t rows, off;
        ckpt_span(m, a, &rows, &off);
        if (!(a->recompute & L3D_CKPT_CPU)) la->ckpt = take(ar, rows * C * es);
    } else if (a->recompute) {
        la->x_in = take(ar, resid_rows(m, N) * C * es);
    } else {
        layout_layer(ar, la, m, N, a->B, a->T, 1, es);
    }
}

// a->L layers (a->chunk's); the head's buffers only where the head runs. The set's own
// buffers come from ar (its layers' too unless a->pooled), the working set
// (l3d_acts_t.work) from wk.
static void layout_acts(arena_t *ar, arena_t *wk, l3d_acts_t *a, const l3d_model_t *m) {
    size_t N = (size_t)a->B * (size_t)a->T, f = sizeof(float), es = l3d_dtype_size(a->at);
    size_t C = (size_t)m->C, F = (size_t)m->F, HD = (size_t)m->H * m->D;
    size_t KD = (size_t)m->KVH * m->D, V = (size_t)m->V;
    int L = a->L, head = m->has_head && a->chunk == m->nchunks - 1;
    size_t xr = resid_rows(m, N);
    // What the layers share. Recomputation: one rebuilt layer, in the working set.
    // Checkpoints apart from the working input: the layers' inputs also pass through two
    // working buffers in turn (a layer reads one, writes its output to the other), and each
    // layer's kept rows are copied out of it in the forward and back in for the rebuild.
    l3d_layer_acts_t shared = {0};
    void *w[2] = {NULL, NULL};
    if (a->recompute & (L3D_CKPT_PARTITION | L3D_CKPT_CPU))
        for (int i = 0; i < 2; i++) w[i] = take(wk, xr * C * es);
    if (a->recompute) layout_layer(wk, &shared, m, N, a->B, a->T, 0, es);
    // a->layers is NULL when only counting (l3d_acts_bytes).
    for (int l = 0; l < L; l++) {
        l3d_layer_acts_t dummy, *la = a->layers ? &a->layers[l] : &dummy;
        *la = shared;
        if (w[0]) la->x_in = w[l % 2];
        if (!a->pooled) layout_own_layer(ar, la, m, a);
    }
    // Kept from the forward to the backward: the head's, and the tokens. What a stage sends
    // (x_final elsewhere, every dres) lives in the working set: L3D_PP_RING of each, which the
    // pipeline hands out in turn (a buffer is rewritten once its send completed), as Megatron
    // frees an output tensor once sent.
    // (One stage sends nothing: one dres. Every set of a rank has the same working set, so
    // the head's set has x buffers it does not use.)
    for (int i = 0; i < L3D_PP_RING; i++) {
        a->xring[i] = m->pp_size > 1 ? take(wk, xr * C * es) : NULL;
        a->dring[i] = m->pp_size > 1 || !i ? take(wk, xr * C * es) : NULL;
    }
    a->x_final = head || m->pp_size == 1 ? take(ar, xr * C * es) : a->xring[0];
    a->dres = a->dring[0];
    a->rstdf = take(ar, (head ? N : 0) * f);  // the final norm and the head: last stage only
    a->lnf = take(ar, (head ? N * C : 0) * es);
    a->logits = take(ar, (head ? N * V : 0) * es);
    // 2d with tied embeddings: the head's block of the table and its gradient (model_tp.c)
    size_t tb = head && m->tp.mode == 2 && m->cfg.tie_word_embeddings ? V * C : 0;
    a->tied_w = take(ar, tb * l3d_dtype_size(m->wt));
    a->tied_g = take(ar, tb * f);
    a->tied_r = take(ar, tb * f);
    a->tokens = take(ar, N * sizeof(int32_t));
    a->targets = take(ar, N * sizeof(int32_t));
    // The working set.
    a->losses = take(wk, N * f);
    a->vp_max = take(wk, N * f);
    a->vp_stats = take(wk, 2 * N * f);
    a->sw = take(wk, N * F * es);
    void *sp_tmp = take(wk, N * C * es);  // sequence parallelism's (N,C) partial sums
    // (a chunk of no layers has layers[0] for it too: its embedding or head passes read it)
    for (int l = 0; a->layers && l < (L ? L : 1); l++) a->layers[l].sp_tmp = sp_tmp;
    a->dln = take(wk, N * C * es);
    a->datt = take(wk, N * HD * es);
    a->dq = take(wk, N * HD * es);
    a->dk = take(wk, N * KD * es);
    a->dv = take(wk, N * KD * es);
    a->dgate = take(wk, N * F * es);
    a->dup = take(wk, N * F * es);
}

size_t l3d_acts_bytes(const l3d_model_config_t *cfg, int B, int T, int recompute) {
    size_t work = 0;
    return l3d_acts_bytes_part(cfg, 1, 1, 1, 1, 0, NULL, 0, B, T, recompute, 0, L3D_FLOAT32,
                               L3D_FLOAT32, 0, NULL, &work, NULL) + work;
}

size_t l3d_acts_bytes_part(const l3d_model_config_t *cfg, int tp, int tp_mode, int pp, int v,
                           int stage, const int *lps, int chunk, int B, int T, int recompute,
                           int sp, l3d_dtype at, l3d_dtype wt, int pooled,
                           size_t *block_bytes, size_t *work_bytes, size_t *host_bytes) {
    l3d_model_t m;
    memset(&m, 0, sizeof(m));
    l3d_model_set_dims_mode(&m, cfg, tp, tp_mode, 0);
    m.wt = wt;
    l3d_model_set_stage(&m, pp, v, stage, lps);
    int b0;
    l3d_model_batch_slice(&m, B, &b0, &B);  // (2d: the grid row's sequences)
    m.tp.sp = sp && tp > 1;
    l3d_acts_t a = {.B = B, .T = T, .at = at, .recompute = recompute, .chunk = chunk,
                    .L = m.chunk_start[chunk + 1] - m.chunk_start[chunk], .pooled = pooled};
    arena_t ar = {NULL, 0}, wk = {NULL, 0}, host = {NULL, 0}, blk = {NULL, 0};
    layout_acts(&ar, &wk, &a, &m);
    l3d_layer_acts_t dummy = {0};
    layout_own_layer(&blk, &dummy, &m, &a);
    if (block_bytes) *block_bytes = blk.off;
    if (recompute & L3D_CKPT_CPU) layout_host_ckpt(&host, &a, &m);
    if (host_bytes) *host_bytes = host.off;
    if (work_bytes) *work_bytes = wk.off;
    return ar.off;
}

l3d_status l3d_acts_create(l3d_model_t *m, int B, int T, int recompute, l3d_acts_t **acts_p) {
    if (m->nchunks > 1)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "activations: the model has %d chunks; "
                         "create them per chunk", m->nchunks);
    return l3d_acts_create_chunk(m, 0, B, T, recompute, L3D_FLOAT32, NULL, 0, acts_p);
}

size_t l3d_acts_block_bytes(const l3d_model_t *m, const l3d_acts_t *a) {
    arena_t blk = {NULL, 0};
    l3d_layer_acts_t dummy = {0};
    layout_own_layer(&blk, &dummy, m, a);
    return blk.off;
}

void l3d_acts_bind(const l3d_model_t *m, l3d_acts_t *a, int l, void *block) {
    arena_t blk = {block, 0};
    layout_own_layer(&blk, &a->layers[l], m, a);
}

l3d_status l3d_acts_create_chunk(l3d_model_t *m, int chunk, int B, int T, int recompute,
                                 l3d_dtype at, const l3d_acts_t *share, int pooled,
                                 l3d_acts_t **acts_p) {
    if (chunk < 0 || chunk >= m->nchunks)
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "activations: chunk %d of %d", chunk,
                         m->nchunks);
    if (B < 1 || T < 1 || T > m->cfg.max_position_embeddings)
        return l3d_error(m->ctx, L3D_ERR_CONFIG,
                         "sequence length %d must be in [1, max_position_embeddings %d]", T,
                         m->cfg.max_position_embeddings);
    if (share && (share->B != B || share->T != T || share->recompute != recompute ||
                  share->at != at))
        return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "activations: a working set is shared "
                         "only by sets of the same shape, recomputation and dtype");
    L3D_CHECK(m->ctx, l3d_model_rope_reserve(m, T));
    l3d_acts_t *a = l3d_calloc(m->ctx, 1, sizeof(*a), "acts");
    if (!a) return L3D_ERR_NOMEM;
    a->chunk = chunk;
    a->l_first = m->chunk_start[chunk];
    a->L = m->chunk_start[chunk + 1] - a->l_first;
    a->layers = l3d_calloc(m->ctx, (size_t)(a->L > 0 ? a->L : 1), sizeof(l3d_layer_acts_t), "acts");
    if (!a->layers) {
        l3d_free(m->ctx, a, sizeof(*a), "acts");
        return L3D_ERR_NOMEM;
    }
    a->B = B;
    a->T = T;
    a->at = at;  // every op, GEMM and collective on the activations takes it
    a->recompute = recompute;
    a->pooled = pooled;
    arena_t ar = {NULL, 0}, wk = {NULL, 0}, host = {NULL, 0};
    layout_acts(&ar, &wk, a, m);
    size_t own = ar.off;
    a->work_bytes = wk.off;
    l3d_status st = share && share->work_bytes != a->work_bytes
                        ? l3d_error(m->ctx, L3D_ERR_INTERNAL, "activations: working sets of "
                                    "%zu and %zu bytes", share->work_bytes, a->work_bytes)
                        : L3D_OK;
    a->bytes = own + (share ? 0 : a->work_bytes);
    if (st >= 0) st = l3d_dev_alloc(m->dev, a->bytes, "acts", &a->mem);
    if (st >= 0 && (recompute & L3D_CKPT_CPU)) {
        layout_host_ckpt(&host, a, m);
        a->host_bytes = host.off;
        st = l3d_dev_alloc_host(m->dev, a->host_bytes, 0, "host_acts", &a->host_mem);
        if (st < 0) l3d_dev_free(m->dev, a->mem, a->bytes, "acts");
    }
    if (st < 0) {
        l3d_free(m->ctx, a->layers, (size_t)(a->L > 0 ? a->L : 1) * sizeof(l3d_layer_acts_t), "acts");
        l3d_free(m->ctx, a, sizeof(*a), "acts");
        return st;
    }
    // (an offset of a device pointer: computed, never read by the host)
    a->work = share ? share->work : (char *)a->mem + own;
    ar = (arena_t){a->mem, 0};
    wk = (arena_t){a->work, 0};
    layout_acts(&ar, &wk, a, m);
    if (a->host_mem) {  // (after layout_acts, which leaves host checkpoints unset)
        host = (arena_t){a->host_mem, 0};
        layout_host_ckpt(&host, a, m);
    }
    *acts_p = a;
    return L3D_OK;
}

void l3d_acts_destroy(l3d_model_t *m, l3d_acts_t *a) {
    if (!a) return;
    l3d_dev_free(m->dev, a->mem, a->bytes, "acts");
    l3d_dev_free_host(m->dev, a->host_mem, a->host_bytes, 0, "host_acts");
    l3d_free(m->ctx, a->layers, (size_t)(a->L > 0 ? a->L : 1) * sizeof(l3d_layer_acts_t), "acts");
    l3d_free(m->ctx, a, sizeof(*a), "acts");
}

// ---- one layer ---------------------------------------------------------------------------
// A tensor of layer l's parameter group Wl (dtype wt; lp->f is its arena offset, ln1 the
// group's first).
#define LW(f) l3d_elem(Wl, wt, lp->f - lp->ln1)

l3d_status l3d_layer_forward(l3d_model_t *m, int l, const void *Wl, const l3d_layer_acts_t *a,
                             void *x_out, void *sw, int B, int T, int pos0, int Tk,
                             size_t kv_bstride, l3d_dtype at, l3d_dtype wt) {
    l3d_device_t *dev = m->dev;
    l3d_ctx_t *ctx = m->ctx;
    const l3d_layer_params_t *lp = &m->layer[l];
    int N = B * T, C = m->C, F = m->F, HD = m->H * m->D, KD = m->KVH * m->D;
    void *k_new = l3d_elem(a->k, at, (size_t)pos0 * KD), *v_new = l3d_elem(a->v, at, (size_t)pos0 * KD);

    // Sequence parallelism: x_in, h, x_out and the norms are this rank's `rows` rows; ln1/ln2
    // are gathered to all N rows before the column-parallel GEMMs and the row-parallel
    // outputs reduce-scattered back to rows.
    int sp = m->tp.sp;
    size_t rows = sp ? (size_t)N / (size_t)m->tp.size : (size_t)N, roff = sp ? (size_t)m->tp.rank * rows * C : 0;
    // (ln_part: the norm's rows are kept in a->ln1 and gathered into sp_tmp, free until o_proj)
    void *ln = a->ln_part ? a->sp_tmp : a->ln1;
    size_t lo = a->ln_part ? 0 : roff;
    L3D_CHECK(ctx, l3d_tp_rmsnorm_fwd(m, l3d_elem(a->ln1, at, lo), a->rstd1, a->x_in, LW(ln1),
                                      (int)rows, at, wt));
    if (sp) L3D_CHECK(ctx, l3d_tp_gather_rows_from(m, l3d_elem(a->ln1, at, lo), ln, rows, at));
    L3D_CHECK(ctx, linear_fwd(m, COL, a->q, HD, ln, LW(wq), N, C, HD, 0.0f, at, wt));
    L3D_CHECK(ctx, linear_fwd(m, COL, k_new, KD, ln, LW(wk), N, C, KD, 0.0f, at, wt));
    L3D_CHECK(ctx, linear_fwd(m, COL, v_new, KD, ln, LW(wv), N, C, KD, 0.0f, at, wt));
    L3D_CHECK(ctx, l3d_dev_rope(dev, a->q, m->cos_tab, m->sin_tab, B, T, m->H, m->D, pos0, 0, at));
    L3D_CHECK(ctx, l3d_dev_rope(dev, k_new, m->cos_tab, m->sin_tab, B, T, m->KVH, m->D, pos0, 0,
                                at));
    l3d_attn_dims_t dims = {B, T, Tk, m->H, m->KVH, m->D, kv_bstride};
    L3D_CHECK(ctx, l3d_dev_attention_fwd(dev, a->att, a->lse, a->q, a->k, a->v, &dims, at));
    // h = x_in + att Wo^T. Row-parallel o_proj: each tp rank's heads give a partial sum; rank
    // 0 adds the residual and the all-reduce completes h on every rank (Megatron's g). With
    // sequence parallelism the partial sums are reduce-scattered and added to this rank's rows.
    if (sp) {
        L3D_CHECK(ctx, linear_fwd(m, ROW, a->sp_tmp, C, a->att, LW(wo), N, HD, C, 0.0f, at, wt));
        L3D_CHECK(ctx, l3d_tp_scatter_rows(m, a->sp_tmp, a->h, rows, at));
        L3D_CHECK(ctx, l3d_dev_add(dev, a->h, a->h, a->x_in, rows * C, at));
    } else {
        L3D_CHECK(ctx, l3d_tp_residual_init(m, a->h, a->x_in, (size_t)N * C, at));
        L3D_CHECK(ctx, linear_fwd(m, ROW, a->h, C, a->att, LW(wo), N, HD, C, 1.0f, at, wt));
        L3D_CHECK(ctx, l3d_tp_allreduce(m, a->h, (size_t)N * C, at));
    }
    ln = a->ln_part ? a->sp_tmp : a->ln2;  // (sp_tmp is free again until down_proj)
    L3D_CHECK(ctx, l3d_tp_rmsnorm_fwd(m, l3d_elem(a->ln2, at, lo), a->rstd2, a->h, LW(ln2),
                                      (int)rows, at, wt));
    if (sp) L3D_CHECK(ctx, l3d_tp_gather_rows_from(m, l3d_elem(a->ln2, at, lo), ln, rows, at));
    L3D_CHECK(ctx, linear_fwd(m, COL, a->gate, F, ln, LW(wg), N, C, F, 0.0f, at, wt));
    L3D_CHECK(ctx, linear_fwd(m, COL, a->up, F, ln, LW(wu), N, C, F, 0.0f, at, wt));
    L3D_CHECK(ctx, l3d_dev_swiglu_fwd(dev, sw, a->gate, a->up, (size_t)N * F, at));
    // x_out = h + swiglu Wd^T (row-parallel down_proj, as o_proj)
    if (sp) {
        L3D_CHECK(ctx, linear_fwd(m, ROW, a->sp_tmp, C, sw, LW(wd), N, F, C, 0.0f, at, wt));
        L3D_CHECK(ctx, l3d_tp_scatter_rows(m, a->sp_tmp, x_out, rows, at));
        return l3d_dev_add(dev, x_out, x_out, a->h, rows * C, at);
    }
    L3D_CHECK(ctx, l3d_tp_residual_init(m, x_out, a->h, (size_t)N * C, at));
    L3D_CHECK(ctx, linear_fwd(m, ROW, x_out, C, sw, LW(wd), N, F, C, 1.0f, at, wt));
    L3D_CHECK(ctx, l3d_tp_allreduce(m, x_out, (size_t)N * C, at));
    return L3D_OK;
}

// On entry acts->dres = dL/dx_out of layer l; on return dL/dx_in. Gradients += into Gl, the
// layer's gradient group (its first float is input_layernorm's).
static l3d_status layer_backward(l3d_model_t *m, int l, const void *Wl, l3d_dtype wt,
                                 l3d_acts_t *acts, void *Gl) {
    l3d_device_t *dev = m->dev;
    l3d_ctx_t *ctx = m->ctx;
    const l3d_layer_params_t *lp = &m->layer[l];
    const l3d_layer_acts_t *a = &acts->layers[l - acts->l_first];
    int B = acts->B, T = acts->T;
    int N = B * T, C = m->C, F = m->F, HD = m->H * m->D, KD = m->KVH * m->D;
    size_t NF = (size_t)N * F;
    l3d_dtype at = acts->at;
    size_t es = l3d_dtype_size(at);
    void *dres = acts->dres, *sw = acts->sw;
    // Sequence parallelism: dres is this rank's rows; D, the gradient the GEMMs need, is all N
    // rows gathered into sp_tmp, and dL/dln is reduce-scattered in place to this rank's rows.
    int sp = m->tp.sp;
    size_t rows = sp ? (size_t)N / (size_t)m->tp.size : (size_t)N, roff = sp ? (size_t)m->tp.rank * rows * C : 0;
    void *D = sp ? a->sp_tmp : dres, *dln = l3d_elem(acts->dln, at, roff);
#define GW(f) l3d_elem(Gl, m->gt, lp->f - lp->ln1)
#define GATHER_D()                                                                             \
    if (sp) {                                                                                  \
        L3D_CHECK(ctx, l3d_dev_copy(dev, l3d_elem(D, at, roff), dres, rows * C * es,           \
                                    L3D_COPY_D2D));                                            \
        L3D_CHECK(ctx, l3d_tp_gather_rows(m, D, rows, at));                                    \
    }
#define REDUCE_DLN()                                                                           \
    if (sp) L3D_CHECK(ctx, l3d_tp_scatter_rows(m, acts->dln, dln, rows, at));                  \
    else L3D_CHECK(ctx, l3d_tp_allreduce(m, acts->dln, (size_t)N * C, at));

    // MLP: x_out = h + sw Wd^T, sw = silu(gate) * up (recomputed: cheaper than storing it)
    GATHER_D();
    L3D_CHECK(ctx, l3d_dev_swiglu_fwd(dev, sw, a->gate, a->up, NF, at));
    // (sw <- dsw: the weight gradient reads sw first)
    L3D_CHECK(ctx, linear_bwd(m, ROW, sw, 0.0f, GW(wd), D, sw, LW(wd), N, F, C, at, wt));
    L3D_CHECK(ctx, l3d_dev_swiglu_bwd(dev, acts->dgate, acts->dup, sw, a->gate, a->up, NF, at));
    // the norm's output on all N rows (kept in part: gathered into sp_tmp, D having been read)
    const void *ln2g = a->ln_part ? a->sp_tmp : a->ln2;
    if (a->ln_part) L3D_CHECK(ctx, l3d_tp_gather_rows_from(m, a->ln2, a->sp_tmp, rows, at));
    L3D_CHECK(ctx, linear_bwd(m, COL, acts->dln, 0.0f, GW(wg), acts->dgate, ln2g, LW(wg), N, C,
                              F, at, wt));
    L3D_CHECK(ctx, linear_bwd(m, COL, acts->dln, 1.0f, GW(wu), acts->dup, ln2g, LW(wu), N, C,
                              F, at, wt));
    // Column-parallel gate/up: each tp rank's columns give part of dL/dln2 (Megatron's f).
    REDUCE_DLN();
    L3D_CHECK(ctx, l3d_tp_rmsnorm_bwd(m, dres, GW(ln2), dln, a->h, LW(ln2), a->rstd2, (int)rows,
                                      at, wt));
    // attention: h = x_in + att Wo^T
    GATHER_D();
    L3D_CHECK(ctx, linear_bwd(m, ROW, acts->datt, 0.0f, GW(wo), D, a->att, LW(wo), N, HD, C, at,
                              wt));
    l3d_attn_dims_t dims = {B, T, T, m->H, m->KVH, m->D, 0};
    L3D_CHECK(ctx, l3d_dev_attention_bwd(dev, acts->dq, acts->dk, acts->dv, acts->datt, a->q,
                                         a->k, a->v, a->att, a->lse, &dims, at));
    L3D_CHECK(ctx, l3d_dev_rope(dev, acts->dq, m->cos_tab, m->sin_tab, B, T, m->H, m->D, 0, 1, at));
    L3D_CHECK(ctx, l3d_dev_rope(dev, acts->dk, m->cos_tab, m->sin_tab, B, T, m->KVH, m->D, 0, 1,
                                at));
    const void *ln1g = a->ln_part ? a->sp_tmp : a->ln1;  // (as ln2's: D was read by o_proj's)
    if (a->ln_part) L3D_CHECK(ctx, l3d_tp_gather_rows_from(m, a->ln1, a->sp_tmp, rows, at));
    L3D_CHECK(ctx, linear_bwd(m, COL, acts->dln, 0.0f, GW(wq), acts->dq, ln1g, LW(wq), N, C,
                              HD, at, wt));
    L3D_CHECK(ctx, linear_bwd(m, COL, acts->dln, 1.0f, GW(wk), acts->dk, ln1g, LW(wk), N, C,
                              KD, at, wt));
    L3D_CHECK(ctx, linear_bwd(m, COL, acts->dln, 1.0f, GW(wv), acts->dv, ln1g, LW(wv), N, C,
                              KD, at, wt));
    REDUCE_DLN();
    L3D_CHECK(ctx, l3d_tp_rmsnorm_bwd(m, dres, GW(ln1), dln, a->x_in, LW(ln1), a->rstd1,
                                      (int)rows, at, wt));
    if (acts->tp_sync_grads) {  // replicated kv heads, and the norms' partial rows with SP
        L3D_CHECK(ctx, l3d_tp_sum_kv_grads(m, GW(wk), GW(wv)));
        L3D_CHECK(ctx, l3d_tp_sum_norm_grad(m, GW(ln1)));
        L3D_CHECK(ctx, l3d_tp_sum_norm_grad(m, GW(ln2)));
    }
#undef GW
#undef GATHER_D
#undef REDUCE_DLN
    return L3D_OK;
}
#undef LW

// ---- checkpoints kept apart (partition_activations, cpu_checkpointing) ----------------------
// Layer l's input to its checkpoint: the rows ckpt_span keeps, to host memory with
// L3D_CKPT_CPU. (Ordered on the device's stream before the next layer overwrites the buffer.)
static l3d_status ckpt_save(l3d_model_t *m, l3d_acts_t *a, int l) {
    const l3d_layer_acts_t *la = &a->layers[l];
    if (!la->ckpt) return L3D_OK;
    size_t rows, off, C = (size_t)m->C;
    ckpt_span(m, a, &rows, &off);
    return l3d_dev_copy(m->dev, la->ckpt, l3d_elem(la->x_in, a->at, off * C),
                        rows * C * l3d_dtype_size(a->at),
                        (a->recompute & L3D_CKPT_CPU) ? L3D_COPY_D2H : L3D_COPY_D2D);
}

// And back, before the layer is rebuilt: the kept rows to their place in x_in, then (partitioned)
// every tp rank's rows gathered around them.
static l3d_status ckpt_restore(l3d_model_t *m, l3d_acts_t *a, int l) {
    const l3d_layer_acts_t *la = &a->layers[l];
    if (!la->ckpt) return L3D_OK;
    size_t rows, off, C = (size_t)m->C;
    ckpt_span(m, a, &rows, &off);
    L3D_CHECK(m->ctx, l3d_dev_copy(m->dev, l3d_elem(la->x_in, a->at, off * C), la->ckpt,
                                   rows * C * l3d_dtype_size(a->at),
                                   (a->recompute & L3D_CKPT_CPU) ? L3D_COPY_H2D : L3D_COPY_D2D));
    if (ckpt_partitioned(m, a)) L3D_CHECK(m->ctx, l3d_tp_gather_rows(m, la->x_in, rows, a->at));
    return L3D_OK;
}

// ---- parameter groups ----------------------------------------------------------------------
// The parameters of group i (l3d_model_grad_group) for a forward (backward 0) or backward pass
// over a, in m->wt: m's arena (or its 16-bit copy), or where the param_window hook has them
// (ZeRO-3 gathers them over dp). *w is the address of the group's first element; param_done
// gives it back.
static l3d_status params_get(l3d_model_t *m, l3d_acts_t *a, int i, int backward,
                             const void **w) {
    size_t lo, n;
    l3d_model_grad_group(m, i, &lo, &n, NULL);
    if (!a->param_window) {
        const void *p = l3d_model_pass_params(m);
        if (!p)
            return l3d_error(m->ctx, L3D_ERR_INVALID_ARG, "a training pass without parameters "
                             "(ZeRO-3 partitioned them and no param_window is set)");
        *w = l3d_elem(p, m->wt, lo);
        return L3D_OK;
    }
    return a->param_window(a->param_arg, a, backward, lo, lo + n, w);
}

static l3d_status params_done(l3d_model_t *m, l3d_acts_t *a, int i) {
    if (!a->param_release) return L3D_OK;
    size_t lo, n;
    l3d_model_grad_group(m, i, &lo, &n, NULL);
    return a->param_release(a->param_arg, lo, lo + n);
}


// ---- a micro-batch -----------------------------------------------------------------------
// A pipeline stage runs its part: the first stage embeds a->tokens, the others start from the
// activations received into l3d_acts_input(a); the last stage ends with the loss, the others
// with a->x_final to send on. The backward mirrors it: the last stage starts from the loss,
// the others from dL/dx_final received into a->dres, and all but the first leave dL/dx_in of
// their first layer in a->dres to send back.
l3d_status l3d_model_stage_forward(l3d_model_t *m, l3d_acts_t *a, float grad_scale,
                                   double *loss_sum_p) {
    l3d_device_t *dev = m->dev;
    l3d_ctx_t *ctx = m->ctx;
    int B = a->B, T = a->T, N = B * T, C = m->C, V = m->V, L = a->L;
    int embed = m->has_embed && a->chunk == 0, head = m->has_head && a->chunk == m->nchunks - 1;
    *loss_sum_p = 0.0;
    int sp = m->tp.sp;
    size_t rows = sp ? (size_t)N / (size_t)m->tp.size : (size_t)N, roff = sp ? (size_t)m->tp.rank * rows * C : 0;
    void *sp_tmp = a->layers[0].sp_tmp;
    l3d_dtype at = a->at, wt = m->wt;
    const void *w;

    if (embed) {
        L3D_CHECK(ctx, params_get(m, a, 0, 0, &w));
        if (sp) {  // each rank's vocabulary rows, summed onto this rank's tokens
            L3D_CHECK(ctx, l3d_tp_embedding_fwd_partial(m, sp_tmp, w, a->tokens, N, at, wt));
            L3D_CHECK(ctx, l3d_tp_scatter_rows(m, sp_tmp, l3d_acts_input(a), rows, at));
        } else {
            L3D_CHECK(ctx, l3d_tp_embedding_fwd(m, l3d_acts_input(a), w, a->tokens, N, at, wt));
        }
        L3D_CHECK(ctx, params_done(m, a, 0));
    }
    for (int l = 0; l < L; l++) {
        void *x_out = l + 1 < L ? a->layers[l + 1].x_in : a->x_final;
        int g = l3d_model_group_layer(m, a->l_first + l);
        L3D_CHECK(ctx, ckpt_save(m, a, l));
        L3D_CHECK(ctx, params_get(m, a, g, 0, &w));
        L3D_CHECK(ctx, l3d_layer_forward(m, a->l_first + l, w, &a->layers[l], x_out, a->sw, B, T,
                                         0, T, 0, at, wt));
        L3D_CHECK(ctx, params_done(m, a, g));
    }
    if (!head) return l3d_dev_sync(dev);
    L3D_CHECK(ctx, params_get(m, a, l3d_model_group_norm(m), 0, &w));
    L3D_CHECK(ctx, l3d_tp_rmsnorm_fwd(m, l3d_elem(a->lnf, at, roff), a->rstdf, a->x_final, w,
                                      (int)rows, at, wt));
    L3D_CHECK(ctx, params_done(m, a, l3d_model_group_norm(m)));
    if (sp) L3D_CHECK(ctx, l3d_tp_gather_rows(m, a->lnf, rows, at));
    L3D_CHECK(ctx, params_get(m, a, l3d_model_group_head(m), 0, &w));
    void *unused;
    L3D_CHECK(ctx, l3d_tp_tied_head_w(m, a, w, NULL, &w, &unused));
    L3D_CHECK(ctx, linear_fwd(m, COL, a->logits, V, a->lnf, w, N, C, V, 0.0f, at, wt));
    L3D_CHECK(ctx, params_done(m, a, l3d_model_group_head(m)));
    L3D_CHECK(ctx, l3d_tp_xent(m, a, N, grad_scale));

    // The loss is summed on the host in double, in row order: deterministic for any layout.
    size_t lbytes = (size_t)N * sizeof(float);
    const float *losses = a->losses;
    float *staged = NULL;
    if (!l3d_dev_is_host(dev)) {
        staged = l3d_malloc(ctx, lbytes, "staging");
        if (!staged) return L3D_ERR_NOMEM;
        l3d_status st = l3d_dev_copy(dev, staged, a->losses, lbytes, L3D_COPY_D2H);
        if (st >= 0) st = l3d_dev_sync(dev);
        if (st < 0) {
            l3d_free(ctx, staged, lbytes, "staging");
            return st;
        }
        losses = staged;
    } else {
        L3D_CHECK(ctx, l3d_dev_sync(dev));
    }
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += losses[i];
    l3d_free(ctx, staged, lbytes, "staging");
    // 2d: these are micro-batch slice i's rows; the grid column holds the other slices.
    // 3d: slice i*q + l's; plane j holds every slice once.
    l3d_comm_t *lc = m->tp.loss_comm;
    if (lc) {
        l3d_status st = l3d_comm_sum_double(lc, &sum);
        if (st < 0) return l3d_error(ctx, st, "tensor parallel loss sum: %s",
                                     l3d_ctx_last_error(l3d_comm_ctx(lc)));
    }
    *loss_sum_p = sum;
    return L3D_OK;
}

// The gradient of group i (l3d_model_grad_group) for this micro-batch: in G, or where the
// grad_window hook puts it.
static l3d_status group_grads(l3d_model_t *m, l3d_acts_t *a, void *G, int i, void **g) {
    size_t lo, n;
    l3d_model_grad_group(m, i, &lo, &n, NULL);
    if (!a->grad_window) {
        *g = l3d_elem(G, m->gt, lo);
        return L3D_OK;
    }
    return a->grad_window(a->grad_ready_arg, lo, lo + n, g);
}

l3d_status l3d_model_stage_backward(l3d_model_t *m, l3d_acts_t *a, void *G) {
    l3d_device_t *dev = m->dev;
    l3d_ctx_t *ctx = m->ctx;
    int B = a->B, T = a->T, N = B * T, C = m->C, V = m->V, L = a->L;
    int embed = m->has_embed && a->chunk == 0, head = m->has_head && a->chunk == m->nchunks - 1;
    int sp = m->tp.sp;
    size_t rows = sp ? (size_t)N / (size_t)m->tp.size : (size_t)N, roff = sp ? (size_t)m->tp.rank * rows * C : 0;
    void *sp_tmp = a->layers[0].sp_tmp;
    l3d_dtype at = a->at, wt = m->wt;
    size_t es = l3d_dtype_size(at);
    const void *w;
    if (head) {
        // head and final norm: logits hold dL/dlogits since the forward. A tied head on the
        // first stage is the embedding: its group, which completes last.
        void *gh, *gn;
        int gi_head = l3d_model_group_head(m), gi_norm = l3d_model_group_norm(m);
        L3D_CHECK(ctx, group_grads(m, a, G, gi_head, &gh));
        L3D_CHECK(ctx, group_grads(m, a, G, gi_norm, &gn));
        L3D_CHECK(ctx, params_get(m, a, gi_head, 1, &w));
        void *ghb;  // (tied under 2d/3d: the head's block of the table's gradient)
        L3D_CHECK(ctx, l3d_tp_tied_head_w(m, a, w, gh, &w, &ghb));
        L3D_CHECK(ctx, linear_bwd(m, COL, a->dln, 0.0f, ghb, a->logits, a->lnf, w, N, C, V, at,
                                  wt));
        L3D_CHECK(ctx, l3d_tp_tied_head_g(m, a, gh));
        L3D_CHECK(ctx, params_done(m, a, gi_head));
        // vocabulary-parallel head: the partial dL/dlnf summed (onto this rank's rows with SP)
        void *dln = l3d_elem(a->dln, at, roff);
        if (sp) L3D_CHECK(ctx, l3d_tp_scatter_rows(m, a->dln, dln, rows, at));
        else L3D_CHECK(ctx, l3d_tp_allreduce(m, a->dln, (size_t)N * C, at));
        L3D_CHECK(ctx, l3d_dev_memset(dev, a->dres, 0, rows * C * es));
        L3D_CHECK(ctx, params_get(m, a, gi_norm, 1, &w));
        L3D_CHECK(ctx, l3d_tp_rmsnorm_bwd(m, a->dres, gn, dln, a->x_final, w, a->rstdf,
                                          (int)rows, at, wt));
        L3D_CHECK(ctx, params_done(m, a, gi_norm));
        if (a->tp_sync_grads) L3D_CHECK(ctx, l3d_tp_sum_norm_grad(m, gn));
        // a tied head's copy of the table (no embedding here) is replicated as the table is
        if (a->tp_sync_grads && m->cfg.tie_word_embeddings && !embed)
            L3D_CHECK(ctx, l3d_tp_sum_embed_grad(m, gh));
        // Arena order is embed, layers, norm, head (HF): the backward completes it from the
        // end. A tied head shares offset 0 with the embedding, which completes last.
        if (a->grad_ready) L3D_CHECK(ctx, a->grad_ready(a->grad_ready_arg, m->norm));
    }
    for (int l = L - 1; l >= 0; l--) {
        int lm = a->l_first + l;  // the model's local layer
        int g = l3d_model_group_layer(m, lm);
        L3D_CHECK(ctx, params_get(m, a, g, 1, &w));
        if (a->recompute) {
            // Rebuild this layer's activations from its saved input. x_out is written to a
            // scratch that is free now (dln), not to the next layer's saved input.
            L3D_CHECK(ctx, ckpt_restore(m, a, l));
            L3D_CHECK(ctx, l3d_layer_forward(m, lm, w, &a->layers[l], a->dln, a->sw, B, T, 0, T,
                                             0, at, wt));
        }
        void *gl;
        L3D_CHECK(ctx, group_grads(m, a, G, g, &gl));
        L3D_CHECK(ctx, layer_backward(m, lm, w, wt, a, gl));
        L3D_CHECK(ctx, params_done(m, a, g));
        if (a->grad_ready) L3D_CHECK(ctx, a->grad_ready(a->grad_ready_arg, m->layer[lm].ln1));
    }
    if (embed) {
        const void *dx = a->dres;
        if (sp) {  // every token's gradient, for this rank's vocabulary rows
            L3D_CHECK(ctx, l3d_dev_copy(dev, l3d_elem(sp_tmp, at, roff), a->dres, rows * C * es,
                                        L3D_COPY_D2D));
            L3D_CHECK(ctx, l3d_tp_gather_rows(m, sp_tmp, rows, at));
            dx = sp_tmp;
        }
        // (the embedding's backward is a scatter-add of dx: it reads no parameter)
        void *ge;
        L3D_CHECK(ctx, group_grads(m, a, G, 0, &ge));
        L3D_CHECK(ctx, l3d_tp_embedding_bwd(m, ge, dx, a->tokens, N, at));
        if (a->tp_sync_grads) L3D_CHECK(ctx, l3d_tp_sum_embed_grad(m, ge));
        if (a->grad_ready) L3D_CHECK(ctx, a->grad_ready(a->grad_ready_arg, 0));
    }
    return l3d_dev_sync(dev);
}

l3d_status l3d_model_train_micro(l3d_model_t *m, l3d_acts_t *a, void *G, float grad_scale,
                                 double *loss_sum_p) {
    L3D_CHECK(m->ctx, l3d_model_stage_forward(m, a, grad_scale, loss_sum_p));
    return l3d_model_stage_backward(m, a, G);
}
