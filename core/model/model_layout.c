// The Llama 3 model's parameter layout: the named tensors of the arena and their offsets, the
// gradient groups data parallelism reduces, the dimensions of a tensor-parallel rank (1d, 2d,
// 3d) and of a pipeline stage, and the arena's size computed without allocating.
// Creation, initialisation and RoPE are in core/model/model.c.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/model/model_internal.h"

// ---- parameter layout --------------------------------------------------------------------
// The arena holds the tensors in Hugging Face order: embed, then per layer input_layernorm,
// q, k, v, o, post_attention_layernorm, gate, up, down; then model.norm, then lm_head when
// the embeddings are not tied. Gradients and optimizer state use the same offsets.
// With m->tensors NULL (and m->layer NULL) it only counts: l3d_model_arena_floats uses that.
//
// Tensor parallelism (Megatron 1D) keeps the same order with each rank's shard:
//   column-parallel (rows split): q, k, v (by heads), gate, up (by ffn), embed and lm_head
//     (by vocabulary: rank r holds the rows of block r of V, uneven when tp does not divide V)
//   row-parallel (columns split): o (by heads), down (by ffn)
//   replicated: the norms (every tp rank), k and v when there are fewer kv heads than tp
//     (tp / KVH ranks share each head and sum its gradients)
typedef struct slice {
    int64_t full_r, full_c, r0, c0;
    int repl;
    int pp_copy;  // the last stage's copy of a tied embedding
} slice_t;

static void add_param(l3d_model_t *m, size_t *off, const char *name, int64_t rows, int64_t cols,
                      int decay, size_t *slot, slice_t sl) {
    size_t numel = (size_t)rows * (size_t)(cols ? cols : 1);
    if (m->tensors) {
        l3d_param_t *p = &m->tensors[m->n_tensors];
        snprintf(p->name, sizeof(p->name), "%s", name);
        p->ndim = cols ? 2 : 1;
        p->shape[0] = rows;
        p->shape[1] = cols;
        p->numel = numel;
        p->offset = *off;
        p->decay = decay;
        p->full[0] = sl.full_r;
        p->full[1] = sl.full_c;
        p->r0 = sl.r0;
        p->c0 = sl.c0;
        p->repl = sl.repl;
        p->pp_copy = sl.pp_copy;
    }
    m->n_tensors++;
    if (slot) *slot = *off;
    // Keep every tensor 16-float (64-byte) aligned so kernels can vectorise.
    *off += (numel + 15) & ~(size_t)15;
}

// Under 3d every weight's rows are cut once more, by the cube's i (core/model/tp3d.h): the divisor
// of their row counts (1 otherwise).
static int64_t weight_rows_div(const l3d_model_t *m) { return m->tp.mode == 3 ? m->tp.q : 1; }

void l3d_model_layout(l3d_model_t *m) {
    size_t off = 0;
    char name[64] = "";
    m->n_tensors = 0;
    const l3d_model_config_t *c = &m->cfg;
    int tp = m->tp.size, r = m->tp.rank, D = m->D;
    int64_t C = m->C, F = m->F, HD = (int64_t)m->H * D, KD = (int64_t)m->KVH * D;
    int64_t Hf = (int64_t)c->num_attention_heads * D, Kf = (int64_t)c->num_key_value_heads * D;
    int64_t Ff = c->intermediate_size, Vf = c->vocab_size;
    int kv_rep = m->tp.kv_rep > 0 ? m->tp.kv_rep : 1;
    slice_t vocab = {Vf, C, m->tp.v0, 0, 1, 0}, norm = {C, 0, 0, 0, tp, 0};
    slice_t q = {Hf, C, r * HD, 0, 1, 0}, kv = {Kf, C, (int64_t)(r / kv_rep) * KD, 0, kv_rep, 0};
    slice_t o = {C, Hf, 0, r * HD, 1, 0}, gu = {Ff, C, r * F, 0, 1, 0};
    slice_t dn = {C, Ff, 0, r * F, 1, 0}, head = vocab;
    if (m->tp.mode == 2) {
        // block (i, j) of each W^T (core/model/tp2d.h): W's rows j*O/q.., columns i*I/q..; the
        // norms and the embedding's columns j, replicated down grid column j
        int64_t Cf = c->hidden_size, qq = Cf / C, i = r / qq, j = r % qq;
        vocab = (slice_t){Vf, Cf, 0, j * C, (int)qq, 0};
        norm = (slice_t){Cf, 0, j * C, 0, (int)qq, 0};
        q = (slice_t){Hf, Cf, j * HD, i * C, 1, 0};
        kv = (slice_t){Kf, Cf, j * KD, i * C, 1, 0};
        o = (slice_t){Cf, Hf, j * C, i * HD, 1, 0};
        gu = (slice_t){Ff, Cf, j * F, i * C, 1, 0};
        dn = (slice_t){Cf, Ff, j * C, i * F, 1, 0};
        head = (slice_t){Vf, Cf, j * m->V, i * C, 1, 0};
    }
    // 3d: an "A" product's W rows j*O/q + i*O/q^2.., columns l*I/q..; a "B" product's (o,
    // down) rows l*O/q + i*O/q^2.., columns j*I/q..
    int64_t wr = weight_rows_div(m);
    if (m->tp.mode == 3) {
        int64_t qq = wr, Cf = c->hidden_size, i = r / (qq * qq), j = r / qq % qq, l = r % qq;
        vocab = (slice_t){Vf, Cf, 0, l * C, (int)(qq * qq), 0};
        norm = (slice_t){Cf, 0, l * C, 0, (int)(qq * qq), 0};
        q = (slice_t){Hf, Cf, j * HD + i * (HD / qq), l * C, 1, 0};
        kv = (slice_t){Kf, Cf, j * KD + i * (KD / qq), l * C, 1, 0};
        o = (slice_t){Cf, Hf, l * C + i * (C / qq), j * HD, 1, 0};
        gu = (slice_t){Ff, Cf, j * F + i * (F / qq), l * C, 1, 0};
        dn = (slice_t){Cf, Ff, l * C + i * (C / qq), j * F, 1, 0};
        head = (slice_t){Vf, Cf, j * m->V + i * (m->V / qq), l * C, 1, 0};
    }
    // Pipeline stages hold their layers only: the embedding on the first, the final norm and
    // the head on the last. A tied head on a last stage that is not also the first is a copy
    // of the embedding under its name (same initialisation; the two stages sum its gradient).
    // 2d and 3d tie the head to the embedding's columns as they lie: 3d's head block is a row
    // range of them, 2d's comes from the transposed grid rank (core/model/model_tp.c).
    if (m->has_embed)
        add_param(m, &off, "model.embed_tokens.weight", m->Vemb, C, 1, &m->embed, vocab);
    for (int l = 0; l < m->L; l++) {
        l3d_layer_params_t scratch, *lp = m->layer ? &m->layer[l] : &scratch;
// (names only where tensors are listed: counting, as the memory estimates do per layout of a
// plan, formats none)
#define LP(suffix, rr, cc, decay, slot, sl)                                                  \
    if (m->tensors)                                                                          \
        snprintf(name, sizeof(name), "model.layers.%d.%s", l3d_model_layer_index(m, l),      \
                 suffix);                                                                    \
    add_param(m, &off, name, rr, cc, decay, slot, sl)
        LP("input_layernorm.weight", C, 0, 0, &lp->ln1, norm);
        LP("self_attn.q_proj.weight", HD / wr, C, 1, &lp->wq, q);
        LP("self_attn.k_proj.weight", KD / wr, C, 1, &lp->wk, kv);
        LP("self_attn.v_proj.weight", KD / wr, C, 1, &lp->wv, kv);
        LP("self_attn.o_proj.weight", C / wr, HD, 1, &lp->wo, o);
        LP("post_attention_layernorm.weight", C, 0, 0, &lp->ln2, norm);
        LP("mlp.gate_proj.weight", F / wr, C, 1, &lp->wg, gu);
        LP("mlp.up_proj.weight", F / wr, C, 1, &lp->wu, gu);
        LP("mlp.down_proj.weight", C / wr, F, 1, &lp->wd, dn);
#undef LP
    }
    if (m->has_head) {
        add_param(m, &off, "model.norm.weight", C, 0, 0, &m->norm, norm);
        if (m->cfg.tie_word_embeddings && m->has_embed) {
            m->head = m->embed;
        } else if (m->cfg.tie_word_embeddings) {
            slice_t copy = vocab;
            copy.pp_copy = 1;
            add_param(m, &off, "model.embed_tokens.weight", m->Vemb, C, 1, &m->head, copy);
        } else {
            add_param(m, &off, "lm_head.weight", m->V / wr, C, 1, &m->head, head);
        }
    }
    m->n_params = off;
}

// Group sizes follow add_param's rounding, so they add up to l3d_model_layout's n_params.
static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

int l3d_model_grad_groups(const l3d_model_t *m) {
    int sep_head = !m->cfg.tie_word_embeddings || !m->has_embed;
    return m->has_embed + m->L + (m->has_head ? 1 + sep_head : 0);
}

void l3d_model_grad_group(const l3d_model_t *m, int i, size_t *lo, size_t *n, int *alone) {
    size_t C = (size_t)m->C, HD = (size_t)m->H * m->D, KD = (size_t)m->KVH * m->D;
    size_t F = (size_t)m->F, wr = (size_t)weight_rows_div(m);
    size_t V = (size_t)m->V / wr;
    size_t emb = m->has_embed ? al16((size_t)m->Vemb * C) : 0;
    size_t layer = 2 * al16(C) + 2 * al16(HD / wr * C) + 2 * al16(KD / wr * C) +
                   3 * al16(F / wr * C);
    size_t layers_end = emb + (size_t)m->L * layer;
    int is_alone = 0;
    if (m->has_embed && i == 0) {
        *lo = 0;
        *n = emb;
        is_alone = 1;
    } else if (i < m->has_embed + m->L) {
        *lo = emb + (size_t)(i - m->has_embed) * layer;
        *n = layer;
    } else if (i == m->has_embed + m->L) {
        *lo = layers_end;  // the final norm
        *n = al16(C);
    } else {
        *lo = layers_end + al16(C);  // a head of its own (tied: the embedding's copy)
        *n = al16((m->cfg.tie_word_embeddings ? (size_t)m->Vemb : V) * C);
        is_alone = 1;
    }
    if (alone) *alone = is_alone;
}

int l3d_model_group_layer(const l3d_model_t *m, int l) { return m->has_embed + l; }
int l3d_model_group_norm(const l3d_model_t *m) { return m->has_embed + m->L; }
int l3d_model_group_head(const l3d_model_t *m) {
    return m->cfg.tie_word_embeddings && m->has_embed ? 0 : l3d_model_group_norm(m) + 1;
}

int l3d_model_grad_group_chunk(const l3d_model_t *m, int i) {
    if (m->has_embed && i == 0) return 0;
    int l = i - m->has_embed;
    return l < m->L ? l3d_model_layer_chunk(m, l) : m->nchunks - 1;
}

void l3d_model_set_dims_tp(l3d_model_t *m, const l3d_model_config_t *cfg, int tp, int rank) {
    m->cfg = *cfg;
    m->C = cfg->hidden_size;
    m->L = cfg->num_hidden_layers;
    m->D = cfg->head_dim;
    m->F = cfg->intermediate_size / tp;
    m->H = cfg->num_attention_heads / tp;
    int K = cfg->num_key_value_heads;
    m->KVH = K >= tp ? K / tp : 1;
    m->tp.size = tp;
    m->tp.rank = rank;
    m->tp.kv_rep = K >= tp ? 1 : tp / K;
    int V = cfg->vocab_size, q = V / tp, rem = V % tp;
    m->V = q + (rank < rem);
    m->tp.v0 = q * rank + (rank < rem ? rank : rem);
    m->Vemb = m->V;
    m->tp.mode = 1;
    m->tp.q = 1;
    l3d_model_set_stage(m, 1, 1, 0, NULL);
}

void l3d_model_set_dims_2d(l3d_model_t *m, const l3d_model_config_t *cfg, int q, int rank) {
    l3d_model_set_dims_tp(m, cfg, 1, 0);
    m->C = cfg->hidden_size / q;
    m->F = cfg->intermediate_size / q;
    m->H = cfg->num_attention_heads / q;
    m->KVH = cfg->num_key_value_heads / q;
    m->V = cfg->vocab_size / q;
    m->Vemb = cfg->vocab_size;
    m->tp.size = q * q;
    m->tp.rank = rank;
    m->tp.mode = 2;
    m->tp.q = q;
    m->tp.v0 = (rank % q) * m->V;  // the head's rows: block column j of the vocabulary
}

void l3d_model_set_dims_3d(l3d_model_t *m, const l3d_model_config_t *cfg, int q, int rank) {
    l3d_model_set_dims_2d(m, cfg, q, rank);
    m->tp.size = q * q * q;
    m->tp.mode = 3;
    m->tp.v0 = (rank / q % q) * m->V;  // the logits' columns: vocabulary block j
}

void l3d_model_set_dims_mode(l3d_model_t *m, const l3d_model_config_t *cfg, int tp, int tp_mode,
                             int rank) {
    if (tp_mode == 2) l3d_model_set_dims_2d(m, cfg, (int)lround(sqrt((double)tp)), rank);
    else if (tp_mode == 3) l3d_model_set_dims_3d(m, cfg, (int)lround(cbrt((double)tp)), rank);
    else l3d_model_set_dims_tp(m, cfg, tp, rank);
}

void l3d_model_batch_slice(const l3d_model_t *m, int mb, int *b0, int *nb) {
    *b0 = 0, *nb = mb;
    int q = m->tp.q;
    if (m->tp.mode == 2) {
        *nb = mb / q;
        *b0 = (m->tp.rank / q) * *nb;  // grid row i
    } else if (m->tp.mode == 3) {
        *nb = mb / (q * q);
        *b0 = (m->tp.rank / q) * *nb;  // slice i*q + j
    }
}

int l3d_model_target_first(const l3d_model_t *m, int mb) {
    int b0, nb, q = m->tp.q;
    l3d_model_batch_slice(m, mb, &b0, &nb);
    if (m->tp.mode != 3) return b0;
    return (m->tp.rank / (q * q) * q + m->tp.rank % q) * nb;  // slice i*q + l
}

void l3d_model_set_stage(l3d_model_t *m, int pp, int v, int stage, const int *layers_per_stage) {
    int L = m->cfg.num_hidden_layers, U = pp * v, q = L / U, rem = L % U;
    const int *lps = pp > 1 ? layers_per_stage : NULL;
    m->L = 0;
    m->nchunks = v;
    // chunk c is virtual stage c * pp + stage; its first global layer is the sum of the
    // virtual stages' counts before it
    for (int c = 0, g0 = 0, u = 0; c < v; c++) {
        for (; u < c * pp + stage; u++) g0 += lps ? lps[u] : q + (u < rem);
        m->chunk_start[c] = m->L;
        m->chunk_g0[c] = g0;
        m->L += lps ? lps[u] : q + (u < rem);
    }
    m->chunk_start[v] = m->L;
    m->l0 = m->chunk_g0[0];
    m->has_embed = stage == 0;
    m->has_head = stage == pp - 1;
    m->pp_size = pp;
    m->pp_rank = stage;
}

int l3d_model_layer_chunk(const l3d_model_t *m, int l) {
    int c = 0;
    while (c + 1 < m->nchunks && l >= m->chunk_start[c + 1]) c++;
    return c;
}

int l3d_model_layer_index(const l3d_model_t *m, int l) {
    int c = l3d_model_layer_chunk(m, l);
    return m->chunk_g0[c] + l - m->chunk_start[c];
}

void l3d_model_set_dims(l3d_model_t *m, const l3d_model_config_t *cfg) {
    l3d_model_set_dims_tp(m, cfg, 1, 0);
}

size_t l3d_model_arena_floats_part(const l3d_model_config_t *cfg, int tp, int rank, int pp,
                                   int v, int stage, const int *lps) {
    l3d_model_t m;
    memset(&m, 0, sizeof(m));
    l3d_model_set_dims_tp(&m, cfg, tp, rank);
    l3d_model_set_stage(&m, pp, v, stage, lps);
    l3d_model_layout(&m);
    return m.n_params;
}

size_t l3d_model_arena_floats_tp(const l3d_model_config_t *cfg, int tp, int rank) {
    return l3d_model_arena_floats_part(cfg, tp, rank, 1, 1, 0, NULL);
}

size_t l3d_model_arena_floats(const l3d_model_config_t *cfg) {
    return l3d_model_arena_floats_tp(cfg, 1, 0);
}
