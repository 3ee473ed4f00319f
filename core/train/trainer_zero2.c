// ZeRO stage 2: the gradients are sharded over dp too. No rank holds the full gradient
// arena: the backward of every micro-batch accumulates each bucket of gradient groups (a
// layer, the embedding, the final norm, the head: l3d_model_grad_group) in a window,
// reduce-scatters the window while the backward goes on, and adds this rank's piece to its
// gradient shard gshard. The optimizer then works on the shard exactly as ZeRO-1 does, and
// the updated pieces are all-gathered back through the windows.
//
//   memory per rank: shard (P / dp) + two windows (l3d_zero2_windows), instead of P
//   communication: the reduce-scatter happens for every micro-batch (DeepSpeed stage 2 with
//   gradient accumulation does the same), A x the bytes of ZeRO-1's once-per-step reduction.
//
// Buckets are whole groups merged from the arena's end up to reduce_bucket_size elements;
// the embedding and a separate head stay alone, so that a tied embedding split over the first
// and last pipeline stage has the same pieces on both (they sum the piece once reduced).
// Each bucket is padded to a multiple of dp: piece r = [off + r*q, off + (r+1)*q) clipped to
// the bucket's end; the window's pad floats are zero and reduce to zero.
//
// Windows: a bucket takes a free window when the backward first asks for one of its groups
// (zeroed), is started (reduce-scatter) when grad_ready says it is complete, and gives the
// window back once the reduction finished and its piece was added. Two windows, one as long
// as the longest bucket and one as long as the longest shorter member of two neighbours (which
// may fill at once), let one bucket reduce while the next fills (one window when a single
// bucket holds the whole stage); a tied head on a single stage writes the embedding's bucket
// at the start of the backward and it completes last, so that case keeps one more, of the
// embedding's size.
//
// communication_data_type bf16/fp16: a window is rounded into 16 bits in place when it starts
// (its first half then holds the 16-bit bucket) and reduce-scattered there; this rank's piece
// is widened back into float32 in the window before it is added to the shard. Each element is
// rounded and widened once, as through a separate 16-bit copy, which DeepSpeed's estimate
// does not count and which would cost half a window more.
//
// data_types.grad_accum_dtype bf16/fp16 (dp.gt): the windows themselves are 16-bit, the
// backward's ops round once into them, and they are reduced as they are (the reduction's
// dtype is theirs); this rank's piece is widened into pscratch (the longest piece, float32)
// and added to the float32 shard. Where each window element receives one op's result (no tied
// head beside the embedding, no tensor-parallel sum of replicated gradients) that is the
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
    if (f->b) f->b[k] = (l3d_dp_bucket_t){lo, hi, len, len / f->n, 0, NULL, -1};
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

size_t l3d_zero2_max_piece(const l3d_model_t *m, double reduce_bucket_size, int dp) {
    size_t mx = 0;
    scan_buckets(m, reduce_bucket_size, dp, piece_max, &mx);
    return mx / (size_t)dp;
}

// The lengths the shared windows need, from the buckets in backward order (scan order: the
// arena's end first). Buckets fill in that order and one completes before the one after the
// next starts (the head's and the final norm's fill together; then a layer at a time), so at
// most two neighbours fill at once: one window as long as the longest bucket and one as long
// as the longest shorter member of a neighbouring pair serve every pair. (The two longest
// buckets, an untied embedding and head, are the backward's first and last: they never fill
// together, and a second window of their length would hold nothing it needs to.)
typedef struct len_arg {
    size_t longest, pair;  // over the folded buckets
    size_t prev, last;     // the last folded bucket; the latest seen (folded once known not to
                           // be the reserved last one)
    int folded, seen;
} len_arg_t;
static void fold(len_arg_t *a, size_t len) {
    if (a->folded && L3D_MIN(a->prev, len) > a->pair) a->pair = L3D_MIN(a->prev, len);
    if (len > a->longest) a->longest = len;
    a->prev = len;
    a->folded++;
}
static void bucket_lens(void *arg, int k, size_t lo, size_t hi, size_t len) {
    len_arg_t *a = arg;
    (void)k, (void)lo, (void)hi;
    if (a->seen) fold(a, a->last);  // all but the last (the arena's start) for now
    a->last = len;
    a->seen = 1;
}

size_t l3d_zero2_windows(const l3d_model_t *m, double reduce_bucket_size, int dp,
                         size_t win_len[L3D_ZERO2_MAX_WIN], int *nwin, int *nshared,
                         int *reserved) {
    size_t shard = 0;
    int nb = l3d_zero2_buckets(m, reduce_bucket_size, dp, NULL, &shard);
    len_arg_t a = {0};
    scan_buckets(m, reduce_bucket_size, dp, bucket_lens, &a);
    // The tied head on the embedding's stage writes the embedding's bucket (the last one, at
    // offset 0) first, and it completes last: it keeps a window of its own, of its size.
    int tied = m->cfg.tie_word_embeddings && m->has_embed && m->has_head;
    if (!tied) fold(&a, a.last);
    // One shared bucket overlaps with nothing: one window.
    int ns = nb - tied >= 2 ? 2 : 1;
    size_t total = shard;
    win_len[0] = a.longest;
    if (ns == 2) win_len[1] = a.pair;
    for (int w = 0; w < ns; w++) total += win_len[w];
    if (tied) total += win_len[ns] = a.last;
    *nshared = ns;
    *nwin = ns + tied;
    *reserved = tied ? nb - 1 : -1;
    return total;
}

l3d_status l3d_zero2_init(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    int G = l3d_model_grad_groups(m);
    d->b = l3d_calloc(t->ctx, (size_t)G, sizeof(*d->b), "other");
    if (!d->b) return L3D_ERR_NOMEM;
    double rbs = l3d_zero_bucket_size(&t->cfg);
    d->nb = l3d_zero2_buckets(m, rbs, d->n, d->b, &d->shard_len);
    (void)l3d_zero2_windows(m, rbs, d->n, d->win_len, &d->nwin,
                            &d->nshared, &d->win_reserved);
    // The full-arena views (checkpoints' optimizer gather) reach the last bucket's padding.
    d->Ppad = d->b[0].off + d->b[0].len;
    size_t longest = 0;  // (a tied embedding's own window may be the longest)
    for (int w = 0; w < d->nwin; w++) {
        d->win_bucket[w] = -1;
        longest = L3D_MAX(longest, d->win_len[w]);
        L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, d->win_len[w] * l3d_dtype_size(d->gt), "grads",
                                        &d->win[w]));
    }
    L3D_CHECK(t->ctx, l3d_dp_cscratch_alloc(t, longest));
    d->stage_len = l3d_zero2_max_piece(m, rbs, d->n);
    if (d->gt != L3D_FLOAT32)
        L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, d->stage_len * sizeof(float), "grads",
                                        (void **)&d->pscratch));
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
    for (int w = 0; w < d->nwin; w++) {
        l3d_dev_free(t->dev, d->win[w], d->win_len[w] * l3d_dtype_size(d->gt), "grads");
        d->win[w] = NULL;
    }
    if (d->pscratch) l3d_dev_free(t->dev, d->pscratch, d->stage_len * sizeof(float), "grads");
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

// Waits for window w's reduction and adds this rank's piece to the shard; frees w.
static l3d_status win_complete(l3d_trainer_t *t, int w) {
    l3d_dp_t *d = &t->dp;
    l3d_dp_bucket_t *b = &d->b[d->win_bucket[w]];
    l3d_status st = l3d_request_wait(b->req);
    b->req = NULL;
    b->win = -1;
    d->win_bucket[w] = -1;
    d->win_started[w] = 0;
    if (st < 0) return comm_fail(t, st, "gradient reduce-scatter");
    float *piece = (float *)d->win[w] + (size_t)d->rank * b->q, *g = d->gshard + b->sh;
    if (d->pscratch) {  // 16-bit windows: the piece widened into the scratch
        piece = d->pscratch;
        L3D_CHECK(t->ctx, l3d_dev_convert(t->dev, piece, L3D_FLOAT32,
                                          l3d_elem(d->win[w], d->gt, (size_t)d->rank * b->q),
                                          d->gt, b->q));
    } else if (d->cscratch) {  // reduced in cdt: this rank's piece widened back to float32
        L3D_CHECK(t->ctx, l3d_dp_widen(t, d->win[w], (size_t)d->rank * b->q, b->q));
    }
    if (!d->stage) return l3d_dev_add(t->dev, g, g, piece, b->q, L3D_FLOAT32);
    // offloaded: the piece goes to the host and is added there
    L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, d->stage, piece, b->q * sizeof(float), L3D_COPY_D2H));
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    return l3d_dev_add(t->off.hdev, g, g, d->stage, b->q, L3D_FLOAT32);
}

// Starts window w's reduce-scatter (in place: piece r lands at its offset in the window).
static l3d_status win_start(l3d_trainer_t *t, int w) {
    l3d_dp_t *d = &t->dp;
    l3d_dp_bucket_t *b = &d->b[d->win_bucket[w]];
    void *buf = d->win[w];
    size_t es = l3d_dtype_size(d->cdt);  // (cdt is gt unless cscratch converts)
    if (d->cscratch) {  // communication_data_type: the window rounded in place
        L3D_CHECK(t->ctx, l3d_dp_narrow(t, buf, b->len));
        L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    }
    d->win_started[w] = ++d->win_seq;
    l3d_status st = l3d_comm_ireduce_scatter(d->comm, buf,
                                             (char *)buf + (size_t)d->rank * b->q * es,
                                             b->q, d->cdt, L3D_SUM, &b->req);
    return st < 0 ? comm_fail(t, st, "gradient reduce-scatter") : L3D_OK;
}

// A shared window of at least len floats: the shortest one not filling, completed if it was
// reducing (with every reduction started before it: they complete in order). Best fit
// matters: the windows are as long as the longest bucket and the longest shorter member of a
// neighbouring pair (l3d_zero2_windows), so of two neighbours filling at once the shorter
// never takes the only window the longer fits.
static l3d_status win_take(l3d_trainer_t *t, size_t len, int *w_p) {
    l3d_dp_t *d = &t->dp;
    int best = -1;
    for (int w = 0; w < d->nshared; w++)
        if (d->win_len[w] >= len && (d->win_bucket[w] < 0 || d->win_started[w]) &&
            (best < 0 || d->win_len[w] < d->win_len[best]))
            best = w;
    if (best < 0)
        return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-2: no gradient window for a bucket "
                         "of %zu floats: every one that fits is filling", len);
    while (d->win_bucket[best] >= 0) {
        int oldest = best;
        for (int w = 0; w < d->nwin; w++)
            if (d->win_bucket[w] >= 0 && d->win_started[w] &&
                d->win_started[w] < d->win_started[oldest])
                oldest = w;
        L3D_CHECK(t->ctx, win_complete(t, oldest));
    }
    *w_p = best;
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
    if (b->win >= 0 && d->win_started[b->win]) L3D_CHECK(t->ctx, win_complete(t, b->win));
    if (b->win < 0) {
        int w = d->nshared;  // the reserved bucket's own window is free here (completed above)
        if (k != d->win_reserved) L3D_CHECK(t->ctx, win_take(t, b->len, &w));
        L3D_CHECK(t->ctx, l3d_dev_memset(t->dev, d->win[w], 0,
                                         b->len * l3d_dtype_size(d->gt)));
        d->win_bucket[w] = k;
        d->win_started[w] = 0;
        b->win = w;
    }
    *g = l3d_elem(d->win[b->win], d->gt, lo - b->off);
    return L3D_OK;
}

// Starts, in bucket order, every filling window whose bucket lies in [final_from, ...).
static l3d_status start_ready(l3d_trainer_t *t, size_t final_from) {
    l3d_dp_t *d = &t->dp;
    for (;;) {
        int best = -1;
        for (int w = 0; w < d->nwin; w++)
            if (d->win_bucket[w] >= 0 && !d->win_started[w] &&
                d->b[d->win_bucket[w]].off >= final_from &&
                (best < 0 || d->win_bucket[w] < d->win_bucket[best]))
                best = w;
        if (best < 0) return L3D_OK;
        // the device finishes the gradients before a host-side transport reads them
        L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
        L3D_CHECK(t->ctx, win_start(t, best));
    }
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
    for (;;) {  // in the order started
        int w = -1;
        for (int i = 0; i < d->nwin; i++)
            if (d->win_bucket[i] >= 0 && (w < 0 || d->win_started[i] < d->win_started[w])) w = i;
        if (w < 0) break;
        l3d_status s = win_complete(t, w);
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

// Waits for window w's all-gather and copies its bucket into the parameters.
static l3d_status gather_complete(l3d_trainer_t *t, int w) {
    l3d_dp_t *d = &t->dp;
    l3d_dp_bucket_t *b = &d->b[d->win_bucket[w]];
    l3d_status st = l3d_request_wait(b->req);
    b->req = NULL;
    d->win_bucket[w] = -1;
    if (st < 0) return comm_fail(t, st, "parameter all-gather");
    l3d_model_t *m = t->model;
    if (d->master16)  // (the 16-bit parameters: trainer_master.c)
        return l3d_dev_copy(t->dev, l3d_elem(m->wp, m->wt, b->off), d->win[w],
                            (b->end - b->off) * l3d_dtype_size(m->wt), L3D_COPY_D2D);
    return l3d_dev_copy(t->dev, m->params + b->off, d->win[w],
                        (b->end - b->off) * sizeof(float), L3D_COPY_D2D);
}

// The window bucket k gathers through: the reserved bucket's own, else a shared one that
// fits, free or, completed, the one holding the earliest bucket (buckets go out in order).
static l3d_status gather_window(l3d_trainer_t *t, int k, int *w_p) {
    l3d_dp_t *d = &t->dp;
    int w = -1;
    if (k == d->win_reserved) {
        w = d->nshared;
    } else {
        for (int i = 0; i < d->nshared; i++) {
            if (d->win_len[i] < d->b[k].len) continue;
            if (d->win_bucket[i] < 0) {
                w = i;
                break;
            }
            if (w < 0 || d->win_bucket[i] < d->win_bucket[w]) w = i;
        }
    }
    if (d->win_bucket[w] >= 0) L3D_CHECK(t->ctx, gather_complete(t, w));
    *w_p = w;
    return L3D_OK;
}

// Bucket k's window: this rank's updated piece in, every piece out, then into the parameters;
// the shared windows alternate so that one bucket travels while the next is prepared.
l3d_status l3d_zero2_gather_params(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    l3d_status st = L3D_OK;
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    for (int k = 0; k < d->nb && st >= 0; k++) {
        int w;
        L3D_CHECK(t->ctx, gather_window(t, k, &w));
        l3d_dp_bucket_t *b = &d->b[k];
        size_t lo = b->off + (size_t)d->rank * b->q, hi = min_sz(lo + b->q, b->end);
        // (under 16-bit weights the master's piece, rounded: trainer_master.c)
        l3d_dtype gt = d->master16 ? m->wt : L3D_FLOAT32;
        void *mine = l3d_elem(d->win[w], gt, (size_t)d->rank * b->q);
        if (d->master16)
            L3D_CHECK(t->ctx, l3d_master_piece16(t, k, mine));
        else if (hi > lo)
            L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, mine, m->params + lo,
                                           (hi - lo) * sizeof(float), L3D_COPY_D2D));
        L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
        d->win_bucket[w] = k;
        st = l3d_comm_iallgather(d->comm, mine, d->win[w], b->q, gt, &b->req);
        if (st < 0) {
            d->win_bucket[w] = -1;
            return comm_fail(t, st, "parameter all-gather");
        }
    }
    for (int w = 0; w < d->nwin; w++) {
        if (d->win_bucket[w] < 0) continue;
        l3d_status s2 = gather_complete(t, w);
        if (s2 < 0 && st >= 0) st = s2;
    }
    return st;
}
