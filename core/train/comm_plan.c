// The communication of one training step, predicted from the layout and the model's shapes
// (docs/parallel.md derives each term). l3d_trainer_step counts the same quantities with
// l3d_comm_get_stats, and the two agree exactly: tests/test_parallel.c checks it per layout.
#include "core/train/trainer_internal.h"

// The terms being written: each names its group, its kind (which sets its cost to l3d plan)
// and whether it runs once per micro-batch.
typedef struct terms {
    l3d_comm_term_t *t;
    int n, max;
    int group, per_mb;
    int ranks, stride;  // the sub-group of the next terms (l3d_comm_term_t)
} terms_t;

enum { GRAD = 0, AFTER = 1 };
enum { AR = L3D_COMM_OP_ALLREDUCE, GA = L3D_COMM_OP_GATHER };

static void add_when(terms_t *s, int op, int after, uint64_t calls, uint64_t bytes) {
    if (!calls && !bytes) return;
    if (s->n < s->max)
        s->t[s->n] = (l3d_comm_term_t){s->group, (l3d_comm_op_kind)op, s->per_mb, after, calls,
                                       bytes, s->ranks, s->stride};
    s->n++;
}

static void add_op(terms_t *s, int op, uint64_t calls, uint64_t bytes) {
    add_when(s, op, GRAD, calls, bytes);
}

void l3d_train_config_comm(const l3d_train_config_t *cfg, l3d_comm_stats_t plan[3]) {
    for (int g = 0; g < 3; g++) plan[g] = (l3d_comm_stats_t){0, 0};
    l3d_comm_term_t t[L3D_COMM_TERMS_MAX];
    int n = l3d_train_config_comm_terms(cfg, t, L3D_COMM_TERMS_MAX);
    for (int i = 0; i < n && i < L3D_COMM_TERMS_MAX; i++) {
        plan[t[i].group].calls += t[i].calls;
        plan[t[i].group].bytes += t[i].bytes;
    }
}

int l3d_train_config_comm_terms(const l3d_train_config_t *cfg, l3d_comm_term_t *out, int max) {
    terms_t terms = {out, 0, max, 0, 0, 0, 0}, *s = &terms;
    const l3d_model_config_t *mc = &cfg->model;
    // f: float32 (gradients, row statistics); e: an activation element (bf16/fp16 training).
    uint64_t f = sizeof(float), A = (uint64_t)cfg->grad_accum_steps;
    uint64_t e = l3d_dtype_size(l3d_train_config_act_dtype(cfg));
    uint64_t N = (uint64_t)cfg->micro_batch_size * (uint64_t)cfg->seq_len;
    uint64_t C = (uint64_t)mc->hidden_size, L = (uint64_t)mc->num_hidden_layers;
    int tp = cfg->tp, dp = cfg->dp, pp = cfg->pp;
    // World rank 0 is on stage 0: its layers (of all its chunks), and the head only without
    // a pipeline.
    const int *lps = l3d_train_config_lps(cfg);
    int v = l3d_train_config_v(cfg);
    l3d_model_t m0 = {0};
    l3d_model_set_dims_mode(&m0, mc, tp, cfg->tp_mode, 0);
    l3d_model_set_stage(&m0, pp, v, 0, lps);
    L = (uint64_t)m0.L;
    // The (rows, columns) of the residual stream a rank holds: 2d's block, else all of it.
    int b0, mbl;
    l3d_model_batch_slice(&m0, cfg->micro_batch_size, &b0, &mbl);
    uint64_t Nl = (uint64_t)mbl * (uint64_t)cfg->seq_len, Cl = (uint64_t)m0.C;
    int last = pp == 1;
    int sp = cfg->sequence_parallel && tp > 1;
    // ZeRO-2 reduces every micro-batch's gradient, so the tp sums of gradients run per
    // micro-batch too (else once per step).
    int zero2 = l3d_train_config_zero2(cfg, dp);
    uint64_t Ag = zero2 ? A : 1;
    if (cfg->tp_mode == 2 && tp > 1) {
        // 2d (docs/parallel.md): the grid's rows and columns, counted with the tp group. Per
        // micro-batch the SUMMA products, the norms' and the cross-entropy's row statistics
        // and the loss; the replicated gradients' sums once per step (ZeRO-2: every
        // micro-batch); the gradient norm.
        s->group = L3D_MESH_TP;
        int q = (int)(Cl ? (uint64_t)mc->hidden_size / Cl : 1);
        uint64_t b[2], c[2], bs[2], cs[2];
        int rc = cfg->activation_checkpointing != 0;
        l3d_tp2d_micro_bytes(mc, q, (int)L, m0.has_embed, last, mbl, cfg->seq_len, rc, 0,
                             (int)e, b, c);
        l3d_tp2d_micro_bytes(mc, q, (int)L, m0.has_embed, last, mbl, cfg->seq_len, rc, 1,
                             (int)e, bs, cs);
        s->per_mb = 1;
        s->ranks = q, s->stride = 1;  // the grid's rows
        add_op(s, L3D_COMM_OP_BCAST, A * c[0], A * b[0]);
        s->stride = q;  // its columns
        add_op(s, L3D_COMM_OP_BCAST, A * c[1], A * b[1]);
        s->per_mb = zero2;
        add_op(s, AR, Ag * (cs[1] - c[1]), Ag * (bs[1] - b[1]));
        s->per_mb = 0;
        s->ranks = s->stride = 0;
        add_when(s, AR, AFTER, 1, 8 * (uint64_t)tp);  // global gradient norm (a double per rank)
    } else if (cfg->tp_mode == 3 && tp > 1) {
        // 3d (docs/parallel.md): the cube's axes and planes, counted with the tp group. Per
        // micro-batch the cube products and the loss (all-gathers and reduce-scatters), the
        // norms' statistics along l and the cross-entropy's along j (all-reduces); the
        // replicated gradients' sums over plane l once per step (ZeRO-2: every micro-batch).
        s->group = L3D_MESH_TP;
        int q = (int)(Cl ? (uint64_t)mc->hidden_size / Cl : 1);
        uint64_t b[L3D_TP3D_COMMS], c[L3D_TP3D_COMMS], bs[L3D_TP3D_COMMS], cs[L3D_TP3D_COMMS];
        int rc = cfg->activation_checkpointing != 0;
        l3d_tp3d_micro_bytes(mc, q, (int)L, m0.has_embed, last, mbl, cfg->seq_len, rc, 0,
                             (int)e, b, c);
        l3d_tp3d_micro_bytes(mc, q, (int)L, m0.has_embed, last, mbl, cfg->seq_len, rc, 1,
                             (int)e, bs, cs);
        // Row statistics: the norms' along l (axis 2), the cross-entropy's along j (axis 1).
        uint64_t lst = (uint64_t)last, fp = rc ? 2 : 1;
        uint64_t st_c[3] = {0, 2 * lst, (2 * fp + 2) * L + 2 * lst};
        uint64_t st_b[3] = {0, 3 * Nl * f * lst, st_c[2] * Nl * f};
        s->per_mb = 1;
        for (int k = 0; k < 3; k++) {  // axis k: q ranks q^(2-k) apart
            s->ranks = q, s->stride = k == 0 ? q * q : k == 1 ? q : 1;
            add_op(s, GA, A * (c[k] - st_c[k]), A * (b[k] - st_b[k]));
            add_op(s, AR, A * st_c[k], A * st_b[k]);
        }
        s->ranks = q * q, s->stride = q;  // the planes (their ranks q apart at most)
        add_op(s, GA, A * c[3], A * b[3]);
        s->per_mb = zero2;
        add_op(s, AR, Ag * (cs[4] - c[4]), Ag * (bs[4] - b[4]));
        s->per_mb = 0;
        s->ranks = s->stride = 0;
        add_when(s, AR, AFTER, 1, 8 * (uint64_t)tp);  // global gradient norm (a double per rank)
    } else if (sp) {
        // Sequence parallelism: per micro-batch the embedding's reduce-scatter, per layer 2
        // all-gathers + 2 reduce-scatters forward (again when recomputed) and backward, where
        // kept layers (no recomputation) gather their norms' outputs again (ln_part), the
        // embedding gradient's all-gather; the last stage adds lnf's all-gather and the head's
        // reduce-scatter and the cross-entropy's max and sums. Once per step the norm weight
        // gradients (partial over rows) are summed: 2 per layer, + the final norm.
        s->group = L3D_MESH_TP;
        uint64_t lst = (uint64_t)last, ck = cfg->activation_checkpointing ? 2 : 1;
        uint64_t nc = 2 + 4 * L * ck + 4 * L + 2 * (ck == 1) * L + 2 * lst;
        s->per_mb = 1;
        add_op(s, GA, A * nc, A * nc * N * C * e);
        add_op(s, AR, A * 2 * lst, A * lst * 3 * N * f);
        s->per_mb = zero2;
        add_op(s, AR, Ag * (2 * L + lst), Ag * (2 * L + lst) * C * f);
        int K = mc->num_key_value_heads;
        if (K < tp) add_op(s, AR, Ag * 2 * L, Ag * 2 * L * (uint64_t)mc->head_dim * C * f);
        s->per_mb = 0;
        add_when(s, AR, AFTER, 1, 8 * (uint64_t)tp);
    } else if (tp > 1) {
        s->group = L3D_MESH_TP;
        // per micro-batch: embedding, 2 per layer forward (+2 recomputed), 2 per layer
        // backward: all (N,C); on the last stage the head gradient (N,C) and the
        // cross-entropy max (N) and sums (N,2)
        uint64_t nc = 1 + 2 * L * (cfg->activation_checkpointing ? 2 : 1) + 2 * L + last;
        // partition_activations: each layer's kept input is all-gathered for its rebuild
        if (l3d_train_config_ckpt(cfg) & L3D_CKPT_PARTITION) nc += L;
        s->per_mb = 1;
        add_op(s, AR, A * (nc + 2 * last), A * (nc * N * C * e + (uint64_t)last * 3 * N * f));
        // once per step: replicated kv heads sum their k and v gradients (kv_rep ranks)
        int K = mc->num_key_value_heads;
        s->per_mb = zero2;
        if (K < tp) add_op(s, AR, Ag * 2 * L, Ag * 2 * L * (uint64_t)mc->head_dim * C * f);
        s->per_mb = 0;
        add_when(s, AR, AFTER, 1, 8 * (uint64_t)tp);  // global gradient norm (a double per rank)
    }
    if (pp > 1) {
        s->group = L3D_MESH_PP;
        // per micro-batch: send activations, receive gradients (this rank's rows with SP)
        // (interleaved: chunk c sends forward, and backward unless c = 0; receives likewise
        // with the roles swapped: 2v - 1 sends and as many receives)
        uint64_t nv = 2 * (uint64_t)v - 1;
        s->per_mb = 1;
        add_op(s, L3D_COMM_OP_P2P, 2 * nv * A, nv * A * Nl * Cl * e / (sp ? (uint64_t)tp : 1));
        s->per_mb = 0;
        add_when(s, AR, AFTER, 2, 16 * (uint64_t)pp);  // the loss and the gradient norm, a double
                                                       // per stage
        if (mc->tie_word_embeddings) {  // embedding + tied head gradients, first + last stage
            // rank 0's table: 1d its vocabulary rows, 2d/3d every row of its columns
            // ZeRO-2: this rank's piece of the table's bucket (16-float aligned, padded to dp)
            uint64_t n = (uint64_t)m0.Vemb * Cl, a = (n + 15) / 16 * 16, q = (a + (uint64_t)dp - 1) / (uint64_t)dp;
            add_op(s, AR, 1, (zero2 ? q : n) * f);
        }
    }
    if (dp > 1) {
        s->group = L3D_MESH_DP;
        l3d_model_layout(&m0);  // (counts only: no tensors)
        size_t P = m0.n_params;
        size_t n = (size_t)dp;
        size_t Ppad = (P + n - 1) / n * n;
        uint64_t nb = (Ppad + l3d_dp_bucket_floats(cfg->reduce_bucket_size, Ppad, dp) - 1) /
                      l3d_dp_bucket_floats(cfg->reduce_bucket_size, Ppad, dp);
        // Gradients are reduced in communication_data_type (else float32); ZeRO-1/2 gather
        // parameters in the weights' dtype under 16-bit weights (trainer_master.c).
        uint64_t gb = l3d_dtype_size(l3d_dp_comm_dtype(cfg));  // bytes per element
        uint64_t pb = l3d_master16(cfg, dp) ? l3d_dtype_size(l3d_train_config_weight_dtype(cfg)) : f;
        if (zero2) {
            size_t shard = 0;
            uint64_t nb2 = (uint64_t)l3d_zero2_buckets(&m0, l3d_zero_bucket_size(cfg), dp, NULL,
                                                       &shard);
            uint64_t all = (uint64_t)shard * (uint64_t)dp * f;
            s->per_mb = 1;  // every micro-batch: reduce-scatter of each bucket
            add_op(s, GA, A * nb2, A * all / f * gb);
            if (cfg->zero_stage >= 3) {
                // ZeRO-3: each micro-batch gathers the groups its passes read; after the
                // update only the persistent groups are gathered (trainer_zero3.c), in the
                // weights' dtype
                uint64_t gc, gf, pc, pf;
                uint64_t wb = l3d_dtype_size(l3d_train_config_weight_dtype(cfg));
                l3d_zero3_gathers(&m0, cfg, dp, &gc, &gf, &pc, &pf);
                add_op(s, GA, A * gc, A * gf * wb);
                s->per_mb = 0;
                add_when(s, GA, AFTER, pc, pf * wb);
            } else {
                s->per_mb = 0;
                // all-gather of the updated parameters (rounded pieces of the master under
                // 16-bit weights, trainer_master.c)
                add_when(s, GA, AFTER, nb2, all / f * pb);
            }
            add_when(s, AR, AFTER, 1, 8 * (uint64_t)dp);  // gradient norm of the shards
        } else if (cfg->zero_stage >= 1) {
            add_op(s, GA, nb, Ppad * gb);            // reduce-scatter of every bucket
            add_when(s, GA, AFTER, nb, Ppad * pb);   // all-gather of the updated parameters
            add_when(s, AR, AFTER, 1, 8 * (uint64_t)dp);  // gradient norm of the shards
        } else {
            add_op(s, AR, nb, Ppad * gb);  // all-reduce of every bucket
        }
        add_when(s, AR, AFTER, 1, 8 * (uint64_t)dp);  // the loss
    }
    return s->n;
}
