// ZeRO stage 2: the gradients are sharded over dp too. No rank holds the full gradient
// arena: the backward of every micro-batch accumulates each bucket of gradient groups (a
// layer, the embedding, the final norm, the head: l3d_model_grad_group) in a window,
// reduce-scatters the window while the backward goes on, and adds this rank's piece to its
// gradient shard gshard. The optimizer then works on the shard exactly as ZeRO-1 does, and
// the updated pieces are all-gathered back through the windows.
//
//   memory per rank: shard (P / dp) + the windows' ring (l3d_zero2_windows), instead of P
//   communication: the reduce-scatter happens for every micro-batch (DeepSpeed stage 2 with
//   gradient accumulation does the same), A x the bytes of ZeRO-1's once-per-step reduction.
//
// Buckets are whole groups merged from the arena's end up to reduce_bucket_size elements;
// the embedding and a separate head stay alone, so that a tied embedding split over the first
// and last pipeline stage has the same pieces on both (they sum the piece once reduced).
// Each bucket is padded to a multiple of dp: piece r = [off + r*q, off + (r+1)*q) clipped to
// the bucket's end; the window's pad floats are zero and reduce to zero.
//
// Windows: a bucket takes a window when the backward first asks for one of its groups
// (zeroed), is started (reduce-scatter) when grad_ready says it is complete, and gives the
// window back once the reduction finished and its piece was added. The windows are runs of one
// ring, taken in backward order and given back in the same order (the order the reductions
// were started): a bucket that finds no room waits for the oldest reductions. The ring is as
// long as the longest bucket, so the backward's gradient memory is its largest group's
// (DeepSpeed's ZeRO-3 estimate counts the same: 2 bytes a parameter of the largest layer in
// 16 bits), and shorter buckets reduce while the next ones fill as far as the ring holds
// them (Llama 3 8B: two layers beside each other in the embedding's length). The head's and
// the final norm's windows are asked for together (core/model/model_fwdbwd.c) and take one
// run, which the ring's length includes; every other bucket is complete before the next
// one's window is asked for. A tied head on a single stage writes the embedding's bucket at
// the start of the backward and it completes last: that bucket keeps a window of its own, of
// its size, outside the ring. Runs start at multiples of L3D_RING_ALIGN elements.
// overlap_comm (DeepSpeed's key) lengthens the ring to hold any two neighbouring buckets, so
// that every reduction overlaps the next bucket's backward whatever the lengths.
//
// communication_data_type bf16/fp16: a window is rounded into 16 bits in place when it starts
// (its first half then holds the 16-bit bucket) and reduce-scattered there; this rank's piece
// is widened back into float32 in the window before it is added to the shard. Each element is
// rounded and widened once, as through a separate 16-bit copy, which DeepSpeed's estimate
// does not count and which would cost half a window more.
//
// data_types.grad_accum_dtype bf16/fp16 (dp.gt): the windows themselves are 16-bit, the
// backward's ops round once into them, and they are reduced as they are (the reduction's
// dtype is theirs); this rank's piece is widened into pscratch (float32) a chunk at a time
// and added to the float32 shard. Where each window element receives one op's result (no
// tied head beside the embedding, no tensor-parallel sum of replicated gradients) that is the
// rounding communication_data_type does, so the two give the same bits.
#include <string.h>

#include "core/train/trainer_internal.h"

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

// Visits the buckets from the arena's end (bucket 0 first): whole groups merged up to
// reduce_bucket_size floats, the embedding and a separate head alone, never across a model
// chunk (its backward alone writes a bucket: interleaved pipelines).
typedef void (*bucket_fn)(void *arg, int k, size_t lo, size_t hi, size_t len);
static int scan_buckets(const l3d_model_t *m, double reduce_bucket_size, int dp, bucket_fn fn,
                        void *arg) {
    double rbs = reduce_bucket_size > 0 ? reduce_bucket_size : 5e8;
    size_t n = (size_t)dp, lo = 0, hi = 0;
    int nb = 0, open = 0, open_alone = 0, open_chunk = 0;
    for (int i = l3d_model_grad_groups(m) - 1; i >= -1; i--) {
        size_t glo = 0, gn = 0;
        int alone = 0, chunk = i >= 0 ? l3d_model_grad_group_chunk(m, i) : 0;
        if (i >= 0) l3d_model_grad_group(m, i, &glo, &gn, &alone);
        // close the open bucket before a group that may not join it
        if (open && (i < 0 || alone || open_alone || chunk != open_chunk ||
                     (double)(hi - glo) > rbs)) {
            fn(arg, nb++, lo, hi, (hi - lo + n - 1) / n * n);
            open = 0;
        }
        if (i < 0) break;
        if (!open) {
            hi = glo + gn;
            open = 1;
            open_alone = alone;
            open_chunk = chunk;
        }
        lo = glo;
    }
    return nb;
}

typedef struct fill_arg {
    l3d_dp_bucket_t *b;
    size_t n, sum;
} fill_arg_t;
static void fill_bucket(void *arg, int k, size_t lo, size_t hi, size_t len) {
    fill_arg_t *f = arg;
    if (f->b) f->b[k] = (l3d_dp_bucket_t){lo, hi, len, len / f->n, 0, NULL, L3D_WIN_NONE, 0};
    f->sum += len / f->n;
}

int l3d_zero2_buckets(const l3d_model_t *m, double reduce_bucket_size, int dp,
                      l3d_dp_bucket_t *b, size_t *shard_len) {
    fill_arg_t f = {b, (size_t)dp, 0};
    int nb = scan_buckets(m, reduce_bucket_size, dp, fill_bucket, &f);
    // Shard offsets in arena order (bucket 0 is the arena's end).
    for (int k = nb - 1, sh = 0; b && k >= 0; k--) {
        b[k].sh = (size_t)sh;
        sh += (int)b[k].q;
    }
    if (shard_len) *shard_len = f.sum;
    return nb;
}

static void piece_max(void *arg, int k, size_t lo, size_t hi, size_t len) {
    size_t *mx = arg;
    (void)k, (void)lo, (void)hi;
    if (len > mx[0]) mx[0] = len;
}

// A 16-bit piece is widened 64K floats at a time (256 KiB of scratch; the piece of Llama 3 8B's
// embedding on 8 ranks is 66M floats).
size_t l3d_zero2_pscratch_len(size_t piece) { return min_sz(piece, (size_t)1 << 16); }

size_t l3d_zero2_max_piece(const l3d_model_t *m, double reduce_bucket_size, int dp) {
    size_t mx = 0;
    scan_buckets(m, reduce_bucket_size, dp, piece_max, &mx);
    return mx / (size_t)dp;
}

// The bucket lengths in backward order (scan order: the arena's end first).
typedef struct len_arg {
    size_t longest, first, second, last;  // over the ring's buckets; the first two; the latest
    size_t neighbours, prev2;  // the longest two neighbours together (but the last bucket,
                               // which may be reserved); the one before the latest
    int nb;
} len_arg_t;
static void bucket_lens(void *arg, int k, size_t lo, size_t hi, size_t len) {
    len_arg_t *a = arg;
    (void)k, (void)lo, (void)hi;
    len = l3d_ring_run(len);  // (the reserved window takes the rounded length too)
    if (a->nb) a->longest = L3D_MAX(a->longest, a->last);  // (the last may be reserved)
    if (a->nb >= 2) a->neighbours = L3D_MAX(a->neighbours, a->prev2 + a->last);
    if (a->nb == 0) a->first = len;
    if (a->nb == 1) a->second = len;
    a->prev2 = a->last;
    a->last = len;
    a->nb++;
}

size_t l3d_zero2_windows(const l3d_model_t *m, double reduce_bucket_size, int dp, int overlap,
                         size_t *ring_len, size_t *own_len, int *reserved, int *pair) {
    size_t shard = 0;
    int nb = l3d_zero2_buckets(m, reduce_bucket_size, dp, NULL, &shard);
    len_arg_t a = {0};
    scan_buckets(m, reduce_bucket_size, dp, bucket_lens, &a);
    // The tied head on the embedding's stage writes the embedding's bucket (the last one, at
    // offset 0) first, and it completes last: it keeps a window of its own, of its size.
    int tied = m->cfg.tie_word_embeddings && m->has_embed && m->has_head;
    if (!tied) {
        a.longest = L3D_MAX(a.longest, a.last);
        if (a.nb >= 2) a.neighbours = L3D_MAX(a.neighbours, a.prev2 + a.last);
    }
    *reserved = tied ? nb - 1 : -1;
    *own_len = tied ? a.last : 0;
    // The head's bucket (0) and the next fill at once, in one run of the ring.
    *pair = m->has_head && !tied && nb >= 2 ? 0 : -1;
    *ring_len = *pair == 0 ? L3D_MAX(a.longest, a.first + a.second) : a.longest;
    // overlap_comm: room for any two neighbours, so that each bucket reduces while the next
    // fills (DeepSpeed's double reduction buckets), whatever the lengths
    if (overlap) *ring_len = L3D_MAX(*ring_len, a.neighbours);
    return shard + *ring_len + *own_len;
}

l3d_status l3d_zero2_init(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    int G = l3d_model_grad_groups(m);
    d->b = l3d_calloc(t->ctx, (size_t)G, sizeof(*d->b), "other");
    d->ring_q = l3d_calloc(t->ctx, (size_t)G, sizeof(int), "other");
    if (!d->b || !d->ring_q) return L3D_ERR_NOMEM;
    double rbs = l3d_zero_bucket_size(&t->cfg);
    d->nb = l3d_zero2_buckets(m, rbs, d->n, d->b, &d->shard_len);
    (void)l3d_zero2_windows(m, rbs, d->n, t->cfg.overlap_comm, &d->ring_len, &d->own_len,
                            &d->reserved, &d->pair);
    // The full-arena views (checkpoints' optimizer gather) reach the last bucket's padding.
    d->Ppad = d->b[0].off + d->b[0].len;
    size_t es = l3d_dtype_size(d->gt);
    L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, d->ring_len * es, "grads", &d->ring));
    if (d->own_len) L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, d->own_len * es, "grads", &d->own));
    L3D_CHECK(t->ctx, l3d_dp_cscratch_alloc(t, L3D_MAX(d->ring_len, d->own_len)));
    d->stage_len = l3d_zero2_max_piece(m, rbs, d->n);
    if (d->gt != L3D_FLOAT32) {
        d->pscratch_len = l3d_zero2_pscratch_len(d->stage_len);
        L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, d->pscratch_len * sizeof(float), "grads",
                                        (void **)&d->pscratch));
    }
    if (!t->cfg.offload_optimizer)
        return l3d_dev_alloc(t->dev, d->shard_len * sizeof(float), "grads", (void **)&d->gshard);
    // Offloaded optimizer: the shard accumulates in host memory, each reduced piece copied
    // there through a staging buffer of the longest piece (DeepSpeed keeps its fp32 gradient
    // partitions on the CPU likewise); the host device adds it (core/train/trainer_offload.c).
    int pin = t->cfg.offload_optimizer_pin;
    L3D_CHECK(t->ctx, l3d_dev_alloc_host(t->dev, d->stage_len * sizeof(float), pin, "host_grads",
                                         (void **)&d->stage));
    return l3d_dev_alloc_host(t->dev, d->shard_len * sizeof(float), pin, "host_grads",
                              (void **)&d->gshard);
}

void l3d_zero2_fini(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    size_t es = l3d_dtype_size(d->gt);
    l3d_dev_free(t->dev, d->ring, d->ring_len * es, "grads");
    if (d->own) l3d_dev_free(t->dev, d->own, d->own_len * es, "grads");
    d->ring = d->own = NULL;
    l3d_free(t->ctx, d->ring_q, (size_t)l3d_model_grad_groups(t->model) * sizeof(int), "other");
    d->ring_q = NULL;
    if (d->pscratch) l3d_dev_free(t->dev, d->pscratch, d->pscratch_len * sizeof(float), "grads");
    d->pscratch = NULL;
    if (t->cfg.offload_optimizer) {
        int pin = t->cfg.offload_optimizer_pin;
        l3d_dev_free_host(t->dev, d->gshard, d->shard_len * sizeof(float), pin, "host_grads");
        l3d_dev_free_host(t->dev, d->stage, d->stage_len * sizeof(float), pin, "host_grads");
        d->stage = NULL;
    } else {
        l3d_dev_free(t->dev, d->gshard, d->shard_len * sizeof(float), "grads");
    }
    d->gshard = NULL;
}

static l3d_status comm_fail(l3d_trainer_t *t, l3d_status st, const char *what) {
    return l3d_error(t->ctx, st, "ZeRO-2 %s: %s", what,
                     l3d_ctx_last_error(l3d_comm_ctx(t->dp.comm)));
}

// ---- the windows -----------------------------------------------------------------------------
// Bucket k's window: its own for the reserved bucket, else its run of the ring.
static void *win_of(const l3d_dp_t *d, int k) {
    return k == d->reserved ? d->own : l3d_elem(d->ring, d->gt, d->b[k].at);
}

// Bucket k gives its window back (its run of the ring, unless k is reserved).
static void win_drop(l3d_dp_t *d, int k) {
    d->b[k].win = L3D_WIN_NONE;
    for (int i = 0; k != d->reserved && i < d->ring_n; i++) {
        if (d->ring_q[i] != k) continue;
        memmove(d->ring_q + i, d->ring_q + i + 1, (size_t)(d->ring_n - i - 1) * sizeof(int));
        d->ring_n--;
        break;
    }
}

typedef l3d_status (*win_done_fn)(l3d_trainer_t *t, int k);

// A run of the ring for bucket k (with room for the next bucket after it when k is the pair's
// first): the oldest busy buckets completed by done until there is one.
static l3d_status ring_take(l3d_trainer_t *t, int k, win_done_fn done) {
    l3d_dp_t *d = &t->dp;
    size_t len = l3d_ring_run(d->b[k].len), at;
    if (k == d->pair) len += l3d_ring_run(d->b[k + 1].len);
    for (;;) {
        const l3d_dp_bucket_t *last = d->ring_n ? &d->b[d->ring_q[d->ring_n - 1]] : NULL;
        if (l3d_ring_fit(d->ring_len, d->ring_n, d->ring_n ? d->b[d->ring_q[0]].at : 0,
                         last ? last->at : 0, last ? l3d_ring_run(last->len) : 0, len, &at))
            break;
        if (d->ring_n == 0 || d->b[d->ring_q[0]].win != L3D_WIN_BUSY)
            return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-2: no room for a window of %zu "
                             "elements in the %zu-element ring (%d windows, the oldest "
                             "filling)", len, d->ring_len, d->ring_n);
        L3D_CHECK(t->ctx, done(t, d->ring_q[0]));
    }
    d->b[k].at = at;
    d->ring_q[d->ring_n++] = k;
    return L3D_OK;
}

// Adds the n floats the host staging holds to the shard at g, on the host, once the device's
// copies into it are done (offloaded optimizer).
static l3d_status add_staged(l3d_trainer_t *t, float *g, size_t n) {
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    return l3d_dev_add(t->off.hdev, g, g, t->dp.stage, n, L3D_FLOAT32);
}

// Waits for bucket k's reduction and adds this rank's piece to the shard; frees its window.
static l3d_status win_complete(l3d_trainer_t *t, int k) {
    l3d_dp_t *d = &t->dp;
    l3d_dp_bucket_t *b = &d->b[k];
    l3d_status st = l3d_request_wait(b->req);
    b->req = NULL;
    void *win = win_of(d, k);
    win_drop(d, k);  // (its elements are read below, before any other bucket takes them)
    if (st < 0) return comm_fail(t, st, "gradient reduce-scatter");
    float *g = d->gshard + b->sh;
    if (d->pscratch) {  // 16-bit windows: the piece widened a chunk at a time, then added on
                        // the device, or gathered in the host staging (one wait for the lot)
        for (size_t o = 0; o < b->q; o += d->pscratch_len) {
            size_t n = min_sz(d->pscratch_len, b->q - o);
            L3D_CHECK(t->ctx, l3d_dev_convert(t->dev, d->pscratch, L3D_FLOAT32,
                                              l3d_elem(win, d->gt, (size_t)d->rank * b->q + o),
                                              d->gt, n));
            L3D_CHECK(t->ctx, d->stage ? l3d_dev_copy(t->dev, d->stage + o, d->pscratch,
                                                      n * sizeof(float), L3D_COPY_D2H)
                                       : l3d_dev_add(t->dev, g + o, g + o, d->pscratch, n,
                                                     L3D_FLOAT32));
        }
        return d->stage ? add_staged(t, g, b->q) : L3D_OK;
    }
    if (d->cscratch)  // reduced in cdt: this rank's piece widened back to float32
        L3D_CHECK(t->ctx, l3d_dp_widen(t, win, (size_t)d->rank * b->q, b->q));
    const float *piece = (const float *)win + (size_t)d->rank * b->q;
    if (!d->stage) return l3d_dev_add(t->dev, g, g, piece, b->q, L3D_FLOAT32);
    L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, d->stage, piece, b->q * sizeof(float), L3D_COPY_D2H));
    return add_staged(t, g, b->q);
}

// Starts bucket k's reduce-scatter (in place: piece r lands at its offset in the window).
static l3d_status win_start(l3d_trainer_t *t, int k) {
    l3d_dp_t *d = &t->dp;
    l3d_dp_bucket_t *b = &d->b[k];
    void *buf = win_of(d, k);
    size_t es = l3d_dtype_size(d->cdt);  // (cdt is gt unless cscratch converts)
    if (d->cscratch) {  // communication_data_type: the window rounded in place
        L3D_CHECK(t->ctx, l3d_dp_narrow(t, buf, b->len));
        L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    }
    b->win = L3D_WIN_BUSY;
    l3d_status st = l3d_comm_ireduce_scatter(d->comm, buf,
                                             (char *)buf + (size_t)d->rank * b->q * es,
                                             b->q, d->cdt, L3D_SUM, &b->req);
    return st < 0 ? comm_fail(t, st, "gradient reduce-scatter") : L3D_OK;
}

// Completes bucket k's reduction, with every ring bucket started before it (they complete in
// the order they were started).
static l3d_status win_settle(l3d_trainer_t *t, int k) {
    l3d_dp_t *d = &t->dp;
    if (k == d->reserved) return win_complete(t, k);
    while (d->b[k].win != L3D_WIN_NONE) {
        if (d->b[d->ring_q[0]].win != L3D_WIN_BUSY)  // (started buckets never pass a filling one)
            return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-2: bucket %d is reducing behind "
                             "bucket %d, which is still filling", k, d->ring_q[0]);
        L3D_CHECK(t->ctx, win_complete(t, d->ring_q[0]));
    }
    return L3D_OK;
}

// grad_window hook: the bucket holding [lo, hi), in a window of this backward.
static l3d_status zero2_window(void *arg, size_t lo, size_t hi, void **g) {
    l3d_trainer_t *t = arg;
    l3d_dp_t *d = &t->dp;
    int k = 0;
    while (k < d->nb && !(d->b[k].off <= lo && hi <= d->b[k].end)) k++;
    if (k == d->nb)
        return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-2: gradient range [%zu, %zu) is in "
                         "no bucket", lo, hi);
    l3d_dp_bucket_t *b = &d->b[k];
    // (the previous micro-batch's reduction of this bucket first)
    if (b->win == L3D_WIN_BUSY) L3D_CHECK(t->ctx, win_settle(t, k));
    if (b->win == L3D_WIN_NONE) {
        if (k != d->reserved) L3D_CHECK(t->ctx, ring_take(t, k, win_complete));
        L3D_CHECK(t->ctx, l3d_dev_memset(t->dev, win_of(d, k), 0,
                                         b->len * l3d_dtype_size(d->gt)));
        b->win = L3D_WIN_FILL;
    }
    *g = l3d_elem(win_of(d, k), d->gt, lo - b->off);
    return L3D_OK;
}

// Starts, in bucket order, every filling window whose bucket lies in [final_from, ...).
static l3d_status start_ready(l3d_trainer_t *t, size_t final_from) {
    l3d_dp_t *d = &t->dp;
    for (int k = 0; k < d->nb; k++) {
        if (d->b[k].win != L3D_WIN_FILL || d->b[k].off < final_from) continue;
        // the device finishes the gradients before a host-side transport reads them
        L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
        L3D_CHECK(t->ctx, win_start(t, k));
    }
    return L3D_OK;
}

static l3d_status zero2_ready(void *arg, size_t final_from) { return start_ready(arg, final_from); }

void l3d_zero2_arm(l3d_trainer_t *t, l3d_acts_t *a) {
    a->grad_window = zero2_window;
    a->grad_ready = zero2_ready;
    a->grad_ready_arg = t;
    // Each micro-batch's gradient leaves its window reduced: the tp sums happen every time.
    a->tp_sync_grads = 1;
}

l3d_status l3d_zero2_finish(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    L3D_CHECK(t->ctx, start_ready(t, 0));
    l3d_status st = L3D_OK;
    while (d->ring_n > 0) {  // in the order started, the reserved bucket (the embedding) last
        l3d_status s = win_complete(t, d->ring_q[0]);
        if (s < 0 && st >= 0) st = s;
    }
    if (d->reserved >= 0 && d->b[d->reserved].win != L3D_WIN_NONE) {
        l3d_status s = win_complete(t, d->reserved);
        if (s < 0 && st >= 0) st = s;
    }
    L3D_CHECK(t->ctx, st);
    l3d_comm_t *ec = t->pp.emb_comm;
    if (!ec) return L3D_OK;
    // The embedding (first stage) and the tied head (last stage) are one tensor: both are a
    // bucket of their own with the same pieces, summed here after the dp reduction.
    l3d_model_t *m = t->model;
    size_t at = m->has_embed ? m->embed : m->head;
    for (int k = 0; k < d->nb; k++) {
        l3d_dp_bucket_t *b = &d->b[k];
        if (b->off != at) continue;
        float *g = d->gshard + b->sh;
        L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
        st = l3d_comm_allreduce(ec, g, g, b->q, L3D_FLOAT32, L3D_SUM);
        if (st < 0)
            return l3d_error(t->ctx, st, "pipeline tied embedding gradient: %s",
                             l3d_ctx_last_error(l3d_comm_ctx(ec)));
    }
    return L3D_OK;
}

// Waits for bucket k's all-gather and copies it into the parameters; frees its window.
static l3d_status gather_complete(l3d_trainer_t *t, int k) {
    l3d_dp_t *d = &t->dp;
    l3d_dp_bucket_t *b = &d->b[k];
    l3d_status st = l3d_request_wait(b->req);
    b->req = NULL;
    const void *win = win_of(d, k);
    win_drop(d, k);
    if (st < 0) return comm_fail(t, st, "parameter all-gather");
    l3d_model_t *m = t->model;
    if (d->master16)  // (the 16-bit parameters: trainer_master.c)
        return l3d_dev_copy(t->dev, l3d_elem(m->wp, m->wt, b->off), win,
                            (b->end - b->off) * l3d_dtype_size(m->wt), L3D_COPY_D2D);
    return l3d_dev_copy(t->dev, m->params + b->off, win, (b->end - b->off) * sizeof(float),
                        L3D_COPY_D2D);
}

// Bucket k's window: this rank's updated piece in, every piece out, then into the parameters;
// the buckets go out in order through the ring, so one travels while the next is prepared.
l3d_status l3d_zero2_gather_params(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    l3d_status st = L3D_OK;
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    for (int k = 0; k < d->nb && st >= 0; k++) {
        l3d_dp_bucket_t *b = &d->b[k];
        // (every window is free here: l3d_zero2_finish completed the reductions)
        if (k != d->reserved) L3D_CHECK(t->ctx, ring_take(t, k, gather_complete));
        b->win = L3D_WIN_BUSY;
        size_t lo = b->off + (size_t)d->rank * b->q, hi = min_sz(lo + b->q, b->end);
        // (under 16-bit weights the master's piece, rounded: trainer_master.c)
        l3d_dtype gt = d->master16 ? m->wt : L3D_FLOAT32;
        void *win = win_of(d, k), *mine = l3d_elem(win, gt, (size_t)d->rank * b->q);
        if (d->master16)
            st = l3d_master_piece16(t, k, mine);
        else if (hi > lo)
            st = l3d_dev_copy(t->dev, mine, m->params + lo, (hi - lo) * sizeof(float),
                              L3D_COPY_D2D);
        if (st >= 0) st = l3d_dev_sync(t->dev);
        if (st < 0) {
            win_drop(d, k);  // (nothing in flight: the window given back as it is)
            return st;
        }
        st = l3d_comm_iallgather(d->comm, mine, win, b->q, gt, &b->req);
        if (st < 0) {
            win_drop(d, k);
            return comm_fail(t, st, "parameter all-gather");
        }
    }
    while (d->ring_n > 0) {
        l3d_status s2 = gather_complete(t, d->ring_q[0]);
        if (s2 < 0 && st >= 0) st = s2;
    }
    if (d->reserved >= 0 && d->b[d->reserved].win != L3D_WIN_NONE) {
        l3d_status s2 = gather_complete(t, d->reserved);
        if (s2 < 0 && st >= 0) st = s2;
    }
    return st;
}
