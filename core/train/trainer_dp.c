// Data parallelism for the trainer: gradient reduction over the dp group in buckets started
// while the backward runs, and ZeRO stage 1 (optimizer state sharded over dp).
//
// Buckets cut the gradient arena (padded to Ppad, a multiple of dp) from the end, because the
// backward completes it from the end (core/model/model_fwdbwd.c grad_ready): bucket 0 is the last
// `reduce_bucket_size` elements, bucket 1 the ones before, ... Every bucket length is a
// multiple of dp, so bucket b splits into dp pieces of q_b elements and rank r owns piece r:
//   arena [off_b + r*q_b, off_b + (r+1)*q_b)  <->  shard [sh_b, sh_b + q_b)
//
// Stage 0: each bucket is all-reduced (sum) in place; every rank then holds the full gradient
// and runs AdamW on all parameters. Stage 1: each bucket is
// reduce-scattered in place, so rank r's piece of the arena holds the summed gradient; AdamW
// runs on the pieces only, with exp_avg/exp_avg_sq of shard size (1/dp of the model), and the
// updated pieces are all-gathered back into every rank's parameters.
//
// The gradients are scaled by 1 / (global batch tokens) in the backward, so the reduction is a
// sum: the update equals the single-rank one up to float summation order.
// communication_data_type bf16/fp16: each bucket is rounded into 16 bits in place when it
// starts (the first half of its float32 bytes), reduced there (the comm core adds in float32
// and rounds once), and the part this rank uses (all of it at stage 0, its piece at stage 1)
// widened back into the arena, as DeepSpeed's allreduce_bucket casts to
// communication_data_type and copies back; not through a 16-bit copy of the arena, which
// would cost 2 bytes a parameter more.
// Reductions start on the last micro-batch of a step only (gradient accumulation boundary),
// as in DeepSpeed stage 0/1. Stage 2 has buckets of its own and no gradient arena
// (core/train/trainer_zero2.c); the optimizer below serves both sharded stages.
#include <string.h>

#include "core/comm/reduce.h"
#include "core/train/trainer_internal.h"

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

// reduce_bucket_size is in elements (DeepSpeed's default 5e8); rounded down to a multiple of
// dp (at least dp), at most the whole arena.
size_t l3d_dp_bucket_floats(double reduce_bucket_size, size_t Ppad, int dp) {
    double rbs = reduce_bucket_size > 0 ? reduce_bucket_size : 5e8;
    size_t n = (size_t)dp, S = rbs >= (double)Ppad ? Ppad : (size_t)rbs;
    return S < n ? n : S / n * n;
}

l3d_status l3d_dp_init(l3d_trainer_t *t, l3d_comm_t *comm) {
    l3d_dp_t *d = &t->dp;
    memset(d, 0, sizeof(*d));
    d->comm = comm;
    d->n = comm ? l3d_comm_size(comm) : 1;
    d->rank = comm ? l3d_comm_rank(comm) : 0;
    d->sharded = d->n > 1 && t->cfg.zero_stage >= 1;
    d->zero2 = l3d_train_config_zero2(&t->cfg, d->n);
    d->zero3 = d->n > 1 && t->cfg.zero_stage >= 3;  // (l3d_zero3_init, after this)
    d->master16 = l3d_master16(&t->cfg, d->n);        // (l3d_master_init, after offload's)
    d->P = t->model->n_params;
    d->cdt = l3d_dp_comm_dtype(&t->cfg);
    d->gt = l3d_train_config_grad_dtype(&t->cfg);
    if (d->zero2) return l3d_zero2_init(t);
    size_t n = (size_t)d->n;
    d->Ppad = (d->P + n - 1) / n * n;
    size_t S = l3d_dp_bucket_floats(t->cfg.reduce_bucket_size, d->Ppad, d->n);
    d->nb = (int)((d->Ppad + S - 1) / S);
    d->b = l3d_calloc(t->ctx, (size_t)d->nb, sizeof(*d->b), "other");
    if (!d->b) return L3D_ERR_NOMEM;
    size_t end = d->Ppad;
    for (int i = 0; i < d->nb; i++) {
        l3d_dp_bucket_t *b = &d->b[i];
        b->len = min_sz(S, end);
        b->off = end - b->len;
        b->end = end;
        b->q = b->len / n;
        b->win = L3D_WIN_NONE;
        end = b->off;
    }
    // Shard offsets in arena order (the last bucket is first in the arena).
    size_t sh = 0;
    for (int i = d->nb - 1; i >= 0; i--) {
        d->b[i].sh = sh;
        sh += d->b[i].q;
    }
    d->shard_len = d->sharded ? sh : d->P;
    return l3d_dp_cscratch_alloc(t, S);
}

int l3d_ring_fit(size_t ring_len, int n, size_t first, size_t last_at, size_t last_len,
                 size_t len, size_t *at) {
    if (n == 0) {
        *at = 0;
        return len <= ring_len;
    }
    size_t end = last_at + last_len;
    if (last_at >= first) {  // not wrapped: [end, ring end), else [0, first)
        if (end + len <= ring_len) {
            *at = end;
            return 1;
        }
        *at = 0;
        return len <= first;
    }
    *at = end;  // wrapped: [end, first)
    return end + len <= first;
}

#define CONV_CHUNK ((size_t)1 << 20)

size_t l3d_dp_cscratch_len(size_t longest) { return min_sz(longest, CONV_CHUNK); }

l3d_status l3d_dp_cscratch_alloc(l3d_trainer_t *t, size_t longest) {
    l3d_dp_t *d = &t->dp;
    if (d->n == 1 || d->cdt == d->gt) return L3D_OK;
    d->cscratch_len = l3d_dp_cscratch_len(longest);
    return l3d_dev_alloc(t->dev, d->cscratch_len * l3d_dtype_size(d->cdt), "grads",
                         &d->cscratch);
}

l3d_status l3d_dp_narrow(l3d_trainer_t *t, void *p, size_t len) {
    l3d_dp_t *d = &t->dp;
    return l3d_dev_convert_in_place(t->dev, p, d->cdt, L3D_FLOAT32, len, d->cscratch,
                                    d->cscratch_len);
}

l3d_status l3d_dp_widen(l3d_trainer_t *t, void *p, size_t first, size_t q) {
    l3d_dp_t *d = &t->dp;
    // 16-bit element `first` sits at 2 first bytes, its float32 place at 4 first: apart but for
    // first 0, where the two overlap from the start
    if (first == 0)
        return l3d_dev_convert_in_place(t->dev, p, L3D_FLOAT32, d->cdt, q, d->cscratch,
                                        d->cscratch_len);
    return l3d_dev_convert(t->dev, (float *)p + first, L3D_FLOAT32,
                           (char *)p + first * l3d_dtype_size(d->cdt), d->cdt, q);
}

void l3d_dp_fini(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    for (int i = 0; d->b && i < d->nb; i++)
        if (d->b[i].req) (void)l3d_request_wait(d->b[i].req);
    if (d->zero3) l3d_zero3_fini(t);
    if (d->zero2) l3d_zero2_fini(t);
    l3d_master_fini(t);
    if (d->cscratch)
        l3d_dev_free(t->dev, d->cscratch, d->cscratch_len * l3d_dtype_size(d->cdt), "grads");
    d->cscratch = NULL;
    if (d->norm_dev) l3d_dev_free(d->norm_on, d->norm_dev, d->norm_len * sizeof(double), "other");
    d->norm_dev = NULL;
    size_t nalloc = d->zero2 ? (size_t)l3d_model_grad_groups(t->model) : (size_t)d->nb;
    l3d_free(t->ctx, d->b, nalloc * sizeof(*d->b), "other");
    d->b = NULL;
}

l3d_status l3d_dp_comm_err(l3d_trainer_t *t, l3d_comm_t *c, l3d_status st, const char *what) {
    return l3d_error(t->ctx, st, "%s: %s", what, l3d_ctx_last_error(l3d_comm_ctx(c)));
}

static l3d_status bucket_start(l3d_trainer_t *t, l3d_dp_bucket_t *b) {
    l3d_dp_t *d = &t->dp;
    void *g = l3d_elem(t->grads, d->gt, b->off);
    l3d_dtype dt = d->gt;  // (gradients in their own dtype: float32, or a 16-bit gt)
    if (d->cscratch) {     // reduced in cdt: the bucket rounded in place
        L3D_CHECK(t->ctx, l3d_dp_narrow(t, g, b->len));
        L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
        dt = d->cdt;
    }
    l3d_status st =
        d->sharded ? l3d_comm_ireduce_scatter(d->comm, g, l3d_elem(g, dt, (size_t)d->rank * b->q),
                                              b->q, dt, L3D_SUM, &b->req)
                   : l3d_comm_iallreduce(d->comm, g, g, b->len, dt, L3D_SUM, &b->req);
    // (a peer that failed before this launch fails it at once: its reason comes with it)
    return st < 0 ? l3d_dp_comm_err(t, d->comm, st, "data-parallel gradient reduction") : L3D_OK;
}

// grad_ready hook: starts every bucket that lies wholly in [final_from, Ppad).
static l3d_status dp_ready(void *arg, size_t final_from) {
    l3d_trainer_t *t = arg;
    l3d_dp_t *d = &t->dp;
    // The device finishes the gradients before a host-side transport reads them.
    if (d->next < d->nb && d->b[d->next].off >= final_from) L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    while (d->next < d->nb && d->b[d->next].off >= final_from) {
        L3D_CHECK(t->ctx, bucket_start(t, &d->b[d->next]));
        d->next++;
    }
    return L3D_OK;
}

void l3d_dp_arm(l3d_trainer_t *t, l3d_acts_t *a, int last_micro) {
    l3d_dp_t *d = &t->dp;
    a->grad_window = NULL;
    if (d->zero2) {
        l3d_zero2_arm(t, a);
        return;
    }
    // A tied embedding split over the first and last pipeline stages is complete only after
    // the two have summed it (l3d_pp_run): those stages start their buckets at the end.
    a->grad_ready = d->n > 1 && last_micro && !t->pp.emb_comm ? dp_ready : NULL;
    a->grad_ready_arg = t;
    a->tp_sync_grads = last_micro;
}

l3d_status l3d_dp_reduce_finish(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    for (int i = 0; i < t->pp.nslots; i++) {
        t->pp.slots[i]->grad_ready = NULL;
        t->pp.slots[i]->grad_window = NULL;
    }
    if (d->n == 1) return L3D_OK;
    if (d->zero2) return l3d_zero2_finish(t);
    L3D_CHECK(t->ctx, dp_ready(t, 0));
    l3d_status st = L3D_OK;
    for (int i = 0; i < d->nb; i++) {
        if (!d->b[i].req) continue;
        l3d_status s = l3d_request_wait(d->b[i].req);
        d->b[i].req = NULL;
        if (s < 0 && st >= 0) st = s;
    }
    // Buckets start over next step. (Not per micro-batch: with interleaved chunks, each
    // chunk's last backward starts the buckets above it, in decreasing arena order.)
    d->next = 0;
    if (st < 0) return l3d_dp_comm_err(t, d->comm, st, "data-parallel gradient reduction");
    for (int i = 0; d->cscratch && i < d->nb; i++) {  // the reduced part back into float32
        const l3d_dp_bucket_t *b = &d->b[i];
        L3D_CHECK(t->ctx, l3d_dp_widen(t, (float *)t->grads + b->off,
                                       d->sharded ? (size_t)d->rank * b->q : 0,
                                       d->sharded ? b->q : b->len));
    }
    return L3D_OK;
}

// Sums one double per rank of c in rank order (bit-identical on every rank). Doubles travel as
// bytes: the reduction itself happens here, in a fixed order.
l3d_status l3d_dp_sum_double(l3d_trainer_t *t, l3d_comm_t *c, double *x) {
    l3d_status st = l3d_comm_sum_double(c, x);
    return st < 0 ? l3d_dp_comm_err(t, c, st, "loss sum") : L3D_OK;
}

// The gradient of arena element a0 of bucket b's piece on this rank: in the arena (ZeRO-1, in
// dp.gt) or in the float32 gradient shard (ZeRO-2; grad_read_dtype says which).
static void *piece_grad(l3d_trainer_t *t, const l3d_dp_bucket_t *b, size_t a0) {
    size_t lo = b->off + (size_t)t->dp.rank * b->q;
    return t->dp.zero2 ? (void *)(t->dp.gshard + b->sh + (a0 - lo))
                       : l3d_elem(t->grads, t->dp.gt, a0);
}

// The dtype of the gradients AdamW and the norm read: ZeRO-2/3's float32 shard, else the
// arena's.
static l3d_dtype grad_read_dtype(const l3d_trainer_t *t) {
    return t->dp.zero2 ? L3D_FLOAT32 : t->dp.gt;
}

// Squared global gradient norm (clip_grad_norm_ over the whole model), left in device memory
// (d->norm_dev[0]) for AdamW to read: every tensor's part this rank is responsible for (all of
// its arena at stage 0, where the dp replicas agree; its pieces when sharded, summed over dp),
// weighted by 1/repl so that a tensor held by several tp ranks (norms, replicated kv heads)
// counts once, then summed over tp and pp. One multi-tensor call on the device, then for each
// group an all-gather of the parts and their sum in rank order on the device (sum_f64):
// bit-identical on every rank, and no host wait but the staging's where a transport takes
// host memory.
l3d_status l3d_dp_grad_sumsq(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    // the pieces: at most one per tensor and bucket
    size_t cap = (size_t)m->n_tensors * (size_t)(d->sharded ? d->nb : 1), n = 0;
    size_t bytes = cap * (sizeof(void *) + sizeof(size_t) + sizeof(double));
    char *mem = l3d_malloc(t->ctx, bytes ? bytes : 1, "other");
    if (!mem) return L3D_ERR_NOMEM;
    const void **x = (const void **)mem;
    size_t *len = (size_t *)(x + cap);
    double *w = (double *)(len + cap);
    for (int i = 0; i < m->n_tensors; i++) {
        const l3d_param_t *p = &m->tensors[i];
        double wi = p->pp_copy ? 0.0 : 1.0 / (p->repl > 0 ? p->repl : 1);
        if (wi == 0.0) continue;  // the first stage counts a tied embedding
        if (!d->sharded) {
            x[n] = l3d_elem(t->grads, d->gt, p->offset), len[n] = p->numel, w[n++] = wi;
            continue;
        }
        for (int k = 0; k < d->nb; k++) {
            const l3d_dp_bucket_t *b = &d->b[k];
            size_t lo = b->off + (size_t)d->rank * b->q, hi = min_sz(lo + b->q, b->end);
            size_t a0 = lo > p->offset ? lo : p->offset, a1 = min_sz(hi, p->offset + p->numel);
            if (a1 <= a0) continue;
            x[n] = piece_grad(t, b, a0), len[n] = a1 - a0, w[n++] = wi;
        }
    }
    // Offloaded gradient pieces are summed by the host device; its memory is the host's.
    l3d_device_t *dev = d->stage ? t->off.hdev : t->dev;
    l3d_comm_t *groups[3] = {d->sharded ? d->comm : NULL, m->tp.size > 1 ? m->tp.comm : NULL,
                             t->pp.comm};
    size_t need = 1;
    for (int g = 0; g < 3; g++)
        if (groups[g]) need = L3D_MAX(need, 1 + (size_t)l3d_comm_size(groups[g]));
    l3d_status st = L3D_OK;
    if (!d->norm_dev) {
        d->norm_on = dev, d->norm_len = need;
        st = l3d_dev_alloc(dev, need * sizeof(double), "other", (void **)&d->norm_dev);
    }
    if (st >= 0)
        st = l3d_dev_sumsq_multi(dev, (int)n, x, len, w, d->norm_dev, grad_read_dtype(t));
    l3d_free(t->ctx, mem, bytes ? bytes : 1, "other");
    L3D_CHECK(t->ctx, st);
    for (int g = 0; g < 3; g++) {
        if (!groups[g]) continue;
        int gn = l3d_comm_size(groups[g]);
        st = l3d_comm_allgather(groups[g], d->norm_dev, d->norm_dev + 1, sizeof(double),
                                L3D_UINT8);
        if (st < 0) return l3d_dp_comm_err(t, groups[g], st, "gradient norm all-gather");
        L3D_CHECK(t->ctx, l3d_dev_sum_f64(dev, d->norm_dev, d->norm_dev + 1, gn));
    }
    return L3D_OK;
}

// The norm's sum of squares on the host, after the update (a copy and a wait: once a step).
l3d_status l3d_dp_norm_read(l3d_trainer_t *t, double *sumsq) {
    l3d_dp_t *d = &t->dp;
    if (l3d_dev_is_host(d->norm_on)) {
        L3D_CHECK(t->ctx, l3d_dev_sync(d->norm_on));
        *sumsq = d->norm_dev[0];
        return L3D_OK;
    }
    L3D_CHECK(t->ctx, l3d_dev_copy(d->norm_on, sumsq, d->norm_dev, sizeof(double),
                                   L3D_COPY_D2H));
    return l3d_dev_sync(d->norm_on);
}

// ZeRO-1, after the update: every bucket all-gathered through its own span of the gradient
// arena (free now; padded to Ppad where the parameters are not), all at once, into the
// parameters: this rank's float32 pieces into m->params, or under 16-bit weights the master's
// pieces rounded into m->wp (trainer_master.c; a span holds its bucket in the parameters'
// dtype: float32 gradients have room for twice its 16-bit elements).
static l3d_status zero1_gather(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    l3d_dtype pt = d->master16 ? m->wt : L3D_FLOAT32;
    void *whole = d->master16 ? m->wp : (void *)m->params;
    l3d_status st = l3d_dev_sync(t->dev);
    for (int k = 0; k < d->nb && st >= 0; k++) {
        l3d_dp_bucket_t *b = &d->b[k];
        size_t lo = b->off + (size_t)d->rank * b->q, hi = min_sz(lo + b->q, d->P);
        // (the arena's bytes as elements of pt: 16-bit gradients hold 16-bit parameters)
        void *span = l3d_elem(t->grads, d->gt, b->off);
        void *mine = l3d_elem(span, pt, (size_t)d->rank * b->q);
        if (d->master16) st = l3d_master_piece16(t, k, mine);
        else if (hi > lo)
            st = l3d_dev_copy(t->dev, mine, m->params + lo, (hi - lo) * sizeof(float),
                              L3D_COPY_D2D);
        if (st >= 0) st = l3d_dev_sync(t->dev);
        if (st >= 0) st = l3d_comm_iallgather(d->comm, mine, span, b->q, pt, &b->req);
    }
    for (int k = 0; k < d->nb; k++) {  // (every started gather is waited, failed or not)
        l3d_dp_bucket_t *b = &d->b[k];
        if (!b->req) continue;
        l3d_status s = l3d_request_wait(b->req);
        b->req = NULL;
        size_t end = min_sz(b->end, d->P);
        if (s >= 0 && st >= 0 && end > b->off)
            s = l3d_dev_copy(t->dev, l3d_elem(whole, pt, b->off),
                             l3d_elem(t->grads, d->gt, b->off),
                             (end - b->off) * l3d_dtype_size(pt), L3D_COPY_D2D);
        if (s < 0 && st >= 0) st = s;
    }
    if (st < 0) return l3d_dp_comm_err(t, d->comm, st, "ZeRO-1 parameter all-gather");
    return l3d_dev_sync(t->dev);
}

// AdamW over the parameters this rank updates, then (sharded) the all-gather of the updated
// pieces into every rank's parameters (ZeRO-3: the pieces are the parameters; only the
// persistent groups are gathered; ZeRO-1/2 under 16-bit weights: the pieces are the float32
// master, gathered rounded into the 16-bit parameters, core/train/trainer_master.c). With
// offload_optimizer the step runs on the host device over host copies of the pieces
// (core/train/trainer_offload.c), which go back to the device first.
l3d_status l3d_dp_update(l3d_trainer_t *t, float lr, float bc1, float bc2, float grad_scale) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    const l3d_train_config_t *cfg = &t->cfg;
    int off = t->off.optim;
    l3d_device_t *odev = off ? t->off.hdev : t->dev;
    // AdamW clips with the norm where it runs: the host device reads a host copy of it.
    const double *sumsq = d->norm_dev;
    if (odev != d->norm_on && !l3d_dev_is_host(d->norm_on)) {
        L3D_CHECK(t->ctx, l3d_dp_norm_read(t, &d->norm_host));
        sumsq = &d->norm_host;
    }
    if (off) L3D_CHECK(t->ctx, l3d_offload_grads_to_host(t));
    // One AdamW call over every tensor's part of every piece. The 16-bit weights the forward
    // reads are refreshed in the same pass where they are the update's own: unsharded, the
    // model's wp; ZeRO-3, the rounded shard (l3d_zero3_piece16_at). ZeRO-1/2 round their
    // pieces afterwards, into the spans of the gradient arena they all-gather through, which
    // the update is still reading (trainer_master.c), and the offloaded step rounds on the host.
    int fuse16 = !off && !d->sharded && m->wp;
    if (d->zero3) L3D_CHECK(t->ctx, l3d_zero3_before_update(t));
    m->wp_fresh = 0;
    size_t cap = (size_t)m->n_tensors * (size_t)l3d_dp_pieces(t), nt = 0;
    l3d_adamw_tensor_t *ts = l3d_malloc(t->ctx, cap * sizeof(*ts), "other");
    if (!ts) return L3D_ERR_NOMEM;
    for (int i = 0; i < m->n_tensors; i++) {
        const l3d_param_t *p = &m->tensors[i];
        float wd = p->decay ? cfg->weight_decay : 0.0f;
        // this tensor's part of each of this rank's pieces (one piece, the arena, unsharded)
        for (int k = 0; k < l3d_dp_pieces(t); k++) {
            size_t lo, hi, sh;
            l3d_dp_piece(t, k, &lo, &hi, &sh);
            size_t a0 = lo > p->offset ? lo : p->offset;
            size_t a1 = min_sz(hi, p->offset + p->numel);
            if (a1 <= a0) continue;
            size_t s = sh + (a0 - lo);
            float *param;
            void *grad;
            if (off) {  // (ZeRO-2's host shard is float32; else the arena's pieces, copied)
                param = l3d_offload_master(t) + s;
                grad = l3d_elem(t->off.grad, grad_read_dtype(t), s);
            } else {
                param = d->zero3      ? l3d_zero3_piece_at(t, s)
                        : d->master16 ? l3d_master_at(t, s)
                                      : m->params + a0;
                grad = d->sharded ? piece_grad(t, &d->b[k], a0) : l3d_elem(t->grads, d->gt, a0);
            }
            void *p16 = fuse16 ? l3d_elem(m->wp, m->wt, a0)
                        : d->zero3 ? l3d_zero3_piece16_at(t, s)
                                   : NULL;
            ts[nt++] = (l3d_adamw_tensor_t){param, t->adam_m + s, t->adam_v + s, grad, p16,
                                            a1 - a0, wd};
        }
    }
    l3d_adamw_step_t step = {lr, cfg->beta1, cfg->beta2, cfg->eps, bc1, bc2, grad_scale,
                             cfg->gradient_clipping, sumsq, grad_read_dtype(t), m->wt};
    l3d_status st = l3d_dev_adamw_multi(odev, ts, (int)nt, &step);
    l3d_free(t->ctx, ts, cap * sizeof(*ts), "other");
    L3D_CHECK(t->ctx, st);
    m->wp_fresh = fuse16;
    if (off) L3D_CHECK(t->ctx, l3d_offload_params_to_device(t));
    if (!d->sharded) return L3D_OK;
    if (d->zero3) return l3d_zero3_gather_persistent(t);
    if (d->zero2) return l3d_zero2_gather_params(t);
    return zero1_gather(t);
}

int l3d_dp_pieces(const l3d_trainer_t *t) { return t->dp.sharded ? t->dp.nb : 1; }

void l3d_dp_piece(const l3d_trainer_t *t, int k, size_t *lo, size_t *hi, size_t *sh) {
    const l3d_dp_t *d = &t->dp;
    if (!d->sharded) {
        *lo = 0;
        *hi = d->P;
        *sh = 0;
        return;
    }
    const l3d_dp_bucket_t *b = &d->b[k];
    size_t a = b->off + (size_t)d->rank * b->q, end = min_sz(b->end, d->P);
    *lo = min_sz(a, end);
    *hi = min_sz(a + b->q, end);
    *sh = b->sh;
}

// Optimizer state between the shard and a full arena (checkpoints use the single-rank layout,
// so any layout can resume any other). gather: full (Ppad floats, every rank) <- shards;
// scatter: shard <- full. Unsharded, the full arena is the trainer's own and both are no-ops.
l3d_status l3d_dp_optim_gather(l3d_trainer_t *t, const float *shard, float *full) {
    l3d_dp_t *d = &t->dp;
    if (!d->sharded) return L3D_OK;  // the caller's full arena is the trainer's own
    // In arena order: a ZeRO-2 bucket's padding lands on the next bucket, written after it.
    for (int k = d->nb - 1; k >= 0; k--) {
        l3d_dp_bucket_t *b = &d->b[k];
        l3d_status st = l3d_comm_allgather(d->comm, shard + b->sh, full + b->off, b->q,
                                           L3D_FLOAT32);
        if (st < 0) return l3d_dp_comm_err(t, d->comm, st, "optimizer state all-gather");
    }
    return L3D_OK;
}

l3d_status l3d_dp_optim_scatter(l3d_trainer_t *t, const float *full, float *shard) {
    l3d_dp_t *d = &t->dp;
    if (!d->sharded) return L3D_OK;
    for (int k = 0; k < d->nb; k++) {
        const l3d_dp_bucket_t *b = &d->b[k];
        // (an offloaded optimizer's shard is host memory)
        L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, shard + b->sh, full + b->off + (size_t)d->rank * b->q,
                                       b->q * sizeof(float),
                                       t->off.optim ? L3D_COPY_D2H : L3D_COPY_D2D));
    }
    return L3D_OK;
}
