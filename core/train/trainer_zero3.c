// ZeRO stage 3: the parameters are sharded over dp as the gradients and optimizer state are.
// Every gradient group (the embedding, each layer, the final norm, the head) is a ZeRO-2
// bucket of its own (l3d_zero_bucket_size); rank r keeps piece r of each bucket's parameters
// in pshard, at the offsets its gradient piece has in gshard, and the optimizer updates the
// pieces in place. m->params is freed: a pass asks for each group through the activations'
// param_window hook (core/model/model_fwdbwd.c), which all-gathers the group into the pool just
// before its use, and param_release gives the space back. The gradients take ZeRO-2's path
// unchanged (reduce-scattered per micro-batch into gshard).
//
//   memory per rank: P/dp + persistent groups + the pool, instead of P
//   communication per micro-batch: every non-persistent group gathered once for the forward
//   and once for the backward (the embedding's backward reads no parameter and gathers
//   nothing); after the update, the persistent groups are all-gathered (DeepSpeed's
//   persistent parameters are never partitioned for use; their update is gathered as ZeRO-1's).
//
// DeepSpeed's keys, at the granularity of a group (DeepSpeed decides per tensor; a layer's
// norms travel with it here):
// - stage3_param_persistence_threshold: a group of fewer elements stays whole on every rank.
// - stage3_prefetch_bucket_size: after a group is asked for, the groups the same pass reads
//   next are gathered ahead, in order, while their elements sum to at most this; 0 gathers
//   nothing ahead (each group is gathered when asked for and waited on at once).
// - stage3_max_live_parameters: gathered elements at once; a group larger than it is
//   gathered alone.
// The pool is a FIFO ring: a pass asks for groups in order and releases each before asking for
// the next, so the gathered groups are always the one in use and a contiguous run after it. Its
// size is the most that run ever holds under the keys (pool_peak; never below the largest
// group). Every dp rank of a stage makes the same decisions, so the collectives are issued in
// the same order everywhere.
//
// Each pass starts with an empty pool: a rank runs one pass at a time (pipeline chunks too),
// releases every group it asked for, and never gathers ahead past its own chunk.
// With offload_param the shard lives in host memory (core/train/trainer_offload.c): each gather
// copies this rank's piece to the device first. With offload_optimizer alone under 16-bit
// weights the float32 shard lives there too (it is the offloaded master: DeepSpeed's device
// keeps the fp16 partition only), and its rounded copy on the device is refreshed through a
// host staging of its size after each update.
//
// 16-bit weights (bf16/fp16.enabled, m->wt): pshard stays the float32 master that AdamW
// updates; wshard, a copy of it rounded to wt (beside it: host memory with offload_param), is
// what the gathers send, and the pool and the persistent groups hold wt, so a gather moves 2
// bytes an element (DeepSpeed's ZeRO-3 keeps a 16-bit partition beside the float32 master
// too). wshard is refreshed after each update and each partition.
#include <stdint.h>
#include <string.h>

#include "core/train/trainer_internal.h"

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

typedef struct live {
    int k;               // bucket
    size_t at, len;      // elements from the pool's start; the bucket's length
    l3d_request_t *req;  // the all-gather in flight (NULL: complete)
} live_t;

typedef struct l3d_zero3 {
    float *pshard;        // dp.shard_len floats: this rank's pieces (gshard's layout)
    l3d_dtype wt;         // the dtype of wshard, pers and pool (m->wt)
    size_t ew;            // its bytes
    void *wshard;         // 16-bit wt: dp.shard_len elements, pshard rounded (NULL: float32)
    int stale;            // pshard changed since wshard was rounded from it
    void *pers;           // the persistent buckets whole (wt)
    size_t pers_len;
    size_t *pers_at;      // per bucket: its offset in pers, SIZE_MAX when not persistent
    void *pool;           // gathered buckets, a ring of pool_len elements (wt)
    size_t pool_len;
    live_t *live;         // FIFO, oldest first
    int nlive;
    size_t live_floats;   // sum of the live buckets' lengths (elements)
    int *grp_bucket;      // per gradient group: its bucket
    int *seq;             // scratch: a pass's groups
    // the pass asking last: its activations, direction and position in its sequence
    const l3d_acts_t *pass_acts;
    int pass_bwd, pass_pos;
    double prefetch, max_live;
} l3d_zero3_t;

// ---- sizes (shared with the dry run) -------------------------------------------------------
// Bucket k of stage 3 is group G-1-k (l3d_zero2_buckets from the arena's end), len its floats
// padded to a multiple of dp.
static int persistent(const l3d_train_config_t *cfg, size_t n) {
    return (double)n < cfg->stage3_param_persistence_threshold;
}

// The i-th group a pass over a chunk reads (core/model/model_fwdbwd.c), -1 past its end:
// forward, the embedding (first chunk of the first stage), the chunk's layers, the final norm
// and the head (last chunk of the last stage); backward, the head, the final norm and the
// layers from the last (the embedding's backward is a scatter-add that reads no parameter).
static int pass_group(const l3d_model_t *m, int chunk, int backward, int i) {
    int l_first = m->chunk_start[chunk], L = m->chunk_start[chunk + 1] - l_first;
    int embed = m->has_embed && chunk == 0, head = m->has_head && chunk == m->nchunks - 1;
    int gn = l3d_model_group_norm(m), gh = l3d_model_group_head(m);
    if (backward) {
        if (head && i < 2) return i == 0 ? gh : gn;
        i -= 2 * head;
        return i < L ? l3d_model_group_layer(m, l_first + L - 1 - i) : -1;
    }
    if (embed && i == 0) return 0;
    i -= embed;
    if (i < L) return l3d_model_group_layer(m, l_first + i);
    i -= L;
    return head && i < 2 ? (i == 0 ? gn : gh) : -1;
}

static size_t group_len(const l3d_model_t *m, int g, size_t n, size_t *raw) {
    size_t lo, gn;
    l3d_model_grad_group(m, g, &lo, &gn, NULL);
    if (raw) *raw = gn;
    return (gn + n - 1) / n * n;
}

// The most elements the pool holds at once: a group in use and the run after it in its pass
// that prefetch() gathers ahead (the groups that fit stage3_prefetch_bucket_size and
// stage3_max_live_parameters together, up to the first that does not), over both passes of
// every chunk; never below the largest group, which is all a pass needs. (The run is what the
// keys allow: a layer longer than the prefetch bucket is never gathered ahead, and no pool is
// kept for it.) Where the ring's wrapping leaves no contiguous room, prefetch() gathers that
// group when it is asked for instead: the same collectives, later.
static size_t pool_peak(const l3d_model_t *m, const l3d_train_config_t *cfg, size_t n) {
    size_t peak = 0, raw;
    for (int c = 0; c < m->nchunks; c++)
        for (int bwd = 0; bwd < 2; bwd++)
            for (int p = 0, g; (g = pass_group(m, c, bwd, p)) >= 0; p++) {
                size_t cur = group_len(m, g, n, &raw), ahead = 0, runs = l3d_ring_run(cur);
                if (persistent(cfg, raw)) continue;
                for (int i = p + 1, h; (h = pass_group(m, c, bwd, i)) >= 0; i++) {
                    size_t len = group_len(m, h, n, &raw);
                    if (persistent(cfg, raw) || h == g) continue;
                    if ((double)(ahead + len) > cfg->stage3_prefetch_bucket_size ||
                        (double)(cur + ahead + len) > cfg->stage3_max_live_parameters)
                        break;
                    ahead += len;
                    runs += l3d_ring_run(len);  // (the ring's runs start aligned)
                }
                peak = max_sz(peak, runs);
            }
    return peak;
}

size_t l3d_zero3_sizes(const l3d_model_t *m, const l3d_train_config_t *cfg, int dp,
                       size_t *shard, size_t *persist, size_t *pool) {
    size_t sh = 0, pers = 0, maxg = 0, n = (size_t)dp;
    for (int i = 0; i < l3d_model_grad_groups(m); i++) {
        size_t gn, len = group_len(m, i, n, &gn);
        sh += len / n;
        if (persistent(cfg, gn)) pers += len;
        else maxg = max_sz(maxg, len);
    }
    size_t pl = maxg ? max_sz(l3d_ring_run(maxg), pool_peak(m, cfg, n)) : 0;
    if (shard) *shard = sh;
    if (persist) *persist = pers;
    if (pool) *pool = pl;
    return sh + pers + pl;
}

// ---- the pool --------------------------------------------------------------------------------
// Where the shards live (core/train/trainer_offload.c): the float32 pieces in host memory with
// offload_param, and with offload_optimizer under 16-bit weights; their rounded copy in host
// memory with offload_param only.
int l3d_zero3_shard_on_host(const l3d_train_config_t *cfg) {
    return cfg->offload_param ||
           (cfg->offload_optimizer &&
            l3d_dtype_size(l3d_train_config_weight_dtype(cfg)) < sizeof(float));
}
static int shard_host(const l3d_trainer_t *t) { return l3d_zero3_shard_on_host(&t->cfg); }
// what the gathers send (the rounded copy, else the pieces) to the device
static l3d_copy_kind send_to_device(const l3d_trainer_t *t) {
    int host = t->dp.z3->wshard ? t->cfg.offload_param : shard_host(t);
    return host ? L3D_COPY_H2D : L3D_COPY_D2D;
}
static l3d_copy_kind device_to_shard(const l3d_trainer_t *t) {
    return shard_host(t) ? L3D_COPY_D2H : L3D_COPY_D2D;
}

static l3d_status comm_fail(l3d_trainer_t *t, l3d_status st, const char *what) {
    return l3d_error(t->ctx, st, "ZeRO-3 %s: %s", what,
                     l3d_ctx_last_error(l3d_comm_ctx(t->dp.comm)));
}

// A free run of len elements in the ring (live buckets sit in FIFO order around it).
static int ring_alloc(const l3d_zero3_t *z, size_t len, size_t *at) {
    const live_t *last = z->nlive ? &z->live[z->nlive - 1] : NULL;
    return l3d_ring_fit(z->pool_len, z->nlive, z->nlive ? z->live[0].at : 0,
                        last ? last->at : 0, last ? l3d_ring_run(last->len) : 0,
                        l3d_ring_run(len), at);
}

static int live_find(const l3d_zero3_t *z, int k) {
    for (int i = 0; i < z->nlive; i++)
        if (z->live[i].k == k) return i;
    return -1;
}

static l3d_status live_wait(l3d_trainer_t *t, live_t *e) {
    if (!e->req) return L3D_OK;
    l3d_status st = l3d_request_wait(e->req);
    e->req = NULL;
    return st < 0 ? comm_fail(t, st, "parameter all-gather") : L3D_OK;
}

// Waits for live bucket i and takes it out of the ring.
static l3d_status live_drop(l3d_trainer_t *t, int i) {
    l3d_zero3_t *z = t->dp.z3;
    l3d_status st = live_wait(t, &z->live[i]);
    z->live_floats -= z->live[i].len;
    memmove(&z->live[i], &z->live[i + 1], (size_t)(z->nlive - i - 1) * sizeof(live_t));
    z->nlive--;
    return st;
}

// wshard = pshard rounded to wt when pshard changed since: on the device; on the host's own
// device when both are host memory (the offload's, which exists from the first gather on, not
// at the first partition); through the offload's host staging when pshard is host memory and
// wshard the device's.
static l3d_status refresh_wshard(l3d_trainer_t *t) {
    l3d_zero3_t *z = t->dp.z3;
    if (!z->wshard || !z->stale) return L3D_OK;
    size_t n = t->dp.shard_len;
    if (shard_host(t) && !t->cfg.offload_param) {
        L3D_CHECK(t->ctx, l3d_offload_round(t, 0, n, z->wshard));
    } else {
        l3d_device_t *dev = shard_host(t) ? t->off.hdev : t->dev;
        if (!dev)
            return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-3: a host parameter shard without "
                             "the host device of offload_optimizer");
        L3D_CHECK(t->ctx, l3d_dev_convert(dev, z->wshard, z->wt, z->pshard, L3D_FLOAT32, n));
        L3D_CHECK(t->ctx, l3d_dev_sync(dev));
    }
    z->stale = 0;
    return L3D_OK;
}

// What the gathers send: this rank's piece of bucket b in wt.
static const void *send_piece(const l3d_zero3_t *z, const l3d_dp_bucket_t *b) {
    return z->wshard ? l3d_elem(z->wshard, z->wt, b->sh) : (const void *)(z->pshard + b->sh);
}

// Bucket b gathered at dst (wt), in place: this rank's piece at its place, every rank's
// piece around it (as ZeRO-2 gathers its windows). The piece is copied and the device synced
// before the (possibly host-side) transport reads it.
static l3d_status gather_into(l3d_trainer_t *t, const l3d_dp_bucket_t *b, void *dst,
                              l3d_request_t **req) {
    l3d_dp_t *d = &t->dp;
    l3d_zero3_t *z = d->z3;
    void *mine = l3d_elem(dst, z->wt, (size_t)d->rank * b->q);
    L3D_CHECK(t->ctx, refresh_wshard(t));
    L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, mine, send_piece(z, b), b->q * z->ew,
                                   send_to_device(t)));
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    return l3d_comm_iallgather(d->comm, mine, dst, b->q, z->wt, req);
}

// Starts bucket k's all-gather into the ring at `at`.
static l3d_status gather_start(l3d_trainer_t *t, int k, size_t at) {
    l3d_dp_t *d = &t->dp;
    l3d_zero3_t *z = d->z3;
    l3d_dp_bucket_t *b = &d->b[k];
    live_t *e = &z->live[z->nlive];
    *e = (live_t){k, at, b->len, NULL};
    l3d_status st = gather_into(t, b, l3d_elem(z->pool, z->wt, at), &e->req);
    if (st < 0) return comm_fail(t, st, "parameter all-gather");
    z->nlive++;
    z->live_floats += b->len;
    return L3D_OK;
}

// ---- the hooks ---------------------------------------------------------------------------------
static int bucket_of(const l3d_dp_t *d, size_t lo, size_t hi) {
    for (int k = 0; k < d->nb; k++)
        if (d->b[k].off <= lo && hi <= d->b[k].end) return k;
    return -1;
}

// The groups a pass over a's chunk reads, in order (pass_group).
static int pass_groups(const l3d_model_t *m, int chunk, int backward, int *seq) {
    int n = 0;
    for (int g; (g = pass_group(m, chunk, backward, n)) >= 0;) seq[n++] = g;
    return n;
}

// One group's gather, when it is not persistent.
static void count_gather(const l3d_model_t *m, const l3d_train_config_t *cfg, size_t n, int g,
                         uint64_t *calls, uint64_t *floats) {
    size_t lo, gn;
    l3d_model_grad_group(m, g, &lo, &gn, NULL);
    if (persistent(cfg, gn)) return;
    *calls += 1;
    *floats += (gn + n - 1) / n * n;
}

// Per micro-batch: the forward reads the embedding once, every layer, the final norm and the
// head; the backward the head, the final norm and every layer (pass_groups). Per step: every
// persistent group once.
void l3d_zero3_gathers(const l3d_model_t *m, const l3d_train_config_t *cfg, int dp,
                       uint64_t *calls, uint64_t *floats, uint64_t *pcalls, uint64_t *pfloats) {
    size_t n = (size_t)dp;
    int gn = l3d_model_group_norm(m), gh = l3d_model_group_head(m);
    *calls = *floats = *pcalls = *pfloats = 0;
    for (int i = 0; i < l3d_model_grad_groups(m); i++) {
        size_t lo, len;
        l3d_model_grad_group(m, i, &lo, &len, NULL);
        if (!persistent(cfg, len)) continue;
        *pcalls += 1;
        *pfloats += (len + n - 1) / n * n;
    }
    if (m->has_embed) count_gather(m, cfg, n, 0, calls, floats);
    for (int l = 0; l < m->L; l++)
        for (int pass = 0; pass < 2; pass++)
            count_gather(m, cfg, n, l3d_model_group_layer(m, l), calls, floats);
    for (int pass = 0; m->has_head && pass < 2; pass++) {
        count_gather(m, cfg, n, gn, calls, floats);
        count_gather(m, cfg, n, gh, calls, floats);
    }
}

// Gathers ahead the groups the pass reads after position p of its sequence, in order, while
// their elements fit stage3_prefetch_bucket_size, stage3_max_live_parameters and the ring.
static l3d_status prefetch(l3d_trainer_t *t, const int *seq, int n, int p, int k_cur) {
    l3d_dp_t *d = &t->dp;
    l3d_zero3_t *z = d->z3;
    int cur = live_find(z, k_cur);
    size_t ahead = z->live_floats - (cur >= 0 ? z->live[cur].len : 0);
    for (int i = p + 1; i < n; i++) {
        int k = z->grp_bucket[seq[i]];
        if (z->pers_at[k] != SIZE_MAX || live_find(z, k) >= 0) continue;
        size_t len = d->b[k].len, at;
        if ((double)(ahead + len) > z->prefetch ||
            (double)(z->live_floats + len) > z->max_live || !ring_alloc(z, len, &at))
            break;
        L3D_CHECK(t->ctx, gather_start(t, k, at));
        ahead += len;
    }
    return L3D_OK;
}

static l3d_status z3_window(void *arg, const l3d_acts_t *a, int backward, size_t lo, size_t hi,
                            const void **w) {
    l3d_trainer_t *t = arg;
    l3d_dp_t *d = &t->dp;
    l3d_zero3_t *z = d->z3;
    int k = bucket_of(d, lo, hi);
    if (k < 0)
        return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-3: parameter range [%zu, %zu) is in "
                         "no bucket", lo, hi);
    const l3d_dp_bucket_t *b = &d->b[k];
    // where the pass is: the group's next place in its sequence after the last one asked for
    // (a tied head on the first stage is group 0 at both ends of the forward)
    int n = pass_groups(t->model, a->chunk, backward, z->seq), p = -1;
    int same = z->pass_acts == a && z->pass_bwd == backward;
    for (int i = same ? z->pass_pos + 1 : 0; i < n && p < 0; i++)
        if (z->grp_bucket[z->seq[i]] == k) p = i;
    for (int i = 0; i < n && p < 0; i++)
        if (z->grp_bucket[z->seq[i]] == k) p = i;
    z->pass_acts = a;
    z->pass_bwd = backward;
    z->pass_pos = p;
    if (z->pers_at[k] != SIZE_MAX) {
        *w = l3d_elem(z->pers, z->wt, z->pers_at[k] + (lo - b->off));
    } else {
        int e = live_find(z, k);
        if (e < 0) {
            // Not gathered ahead: the ring holds only buckets gathered for a pass that went
            // elsewhere (none, when the pass asks in its order); they make room.
            size_t at;
            while (!ring_alloc(z, b->len, &at)) {
                if (z->nlive == 0)  // (the pool holds the largest group: never)
                    return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-3: a group of %zu floats "
                                     "exceeds the %zu-float pool", b->len, z->pool_len);
                L3D_CHECK(t->ctx, live_drop(t, 0));
            }
            L3D_CHECK(t->ctx, gather_start(t, k, at));
            e = z->nlive - 1;
        }
        L3D_CHECK(t->ctx, live_wait(t, &z->live[e]));
        *w = l3d_elem(z->pool, z->wt, z->live[e].at + (lo - b->off));
    }
    if (p < 0 || z->prefetch <= 0) return L3D_OK;
    return prefetch(t, z->seq, n, p, k);
}

static l3d_status z3_release(void *arg, size_t lo, size_t hi) {
    l3d_trainer_t *t = arg;
    l3d_dp_t *d = &t->dp;
    int k = bucket_of(d, lo, hi);
    if (k < 0 || d->z3->pers_at[k] != SIZE_MAX) return L3D_OK;
    int e = live_find(d->z3, k);
    if (e < 0)
        return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-3: released parameters [%zu, %zu) "
                         "were not gathered", lo, hi);
    return live_drop(t, e);
}

// ---- lifetime --------------------------------------------------------------------------------
// pin_memory of the offload that put the shard in host memory
static int shard_pin(const l3d_trainer_t *t) {
    return t->cfg.offload_param ? t->cfg.offload_param_pin : t->cfg.offload_optimizer_pin;
}

// A shard-sized array of es-byte elements, in host memory or the device's.
static l3d_status shard_alloc(l3d_trainer_t *t, size_t es, int host, void **p) {
    size_t bytes = t->dp.shard_len * es;
    if (host)
        return l3d_dev_alloc_host(t->dev, bytes, shard_pin(t), "host_params", p);
    return l3d_dev_alloc(t->dev, bytes, "params", p);
}
static void shard_free(l3d_trainer_t *t, size_t es, int host, void *p) {
    size_t bytes = t->dp.shard_len * es;
    if (host)
        l3d_dev_free_host(t->dev, p, bytes, shard_pin(t), "host_params");
    else
        l3d_dev_free(t->dev, p, bytes, "params");
}

l3d_status l3d_zero3_init(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    int G = l3d_model_grad_groups(m);
    if (d->nb != G)
        return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-3: %d buckets for %d gradient groups",
                         d->nb, G);
    l3d_zero3_t *z = l3d_calloc(t->ctx, 1, sizeof(*z), "other");
    if (!z) return L3D_ERR_NOMEM;
    d->z3 = z;
    z->prefetch = t->cfg.stage3_prefetch_bucket_size;
    z->max_live = t->cfg.stage3_max_live_parameters;
    z->wt = m->wt;
    z->ew = l3d_dtype_size(m->wt);
    z->pass_pos = -1;
    size_t sh;
    (void)l3d_zero3_sizes(m, &t->cfg, d->n, &sh, &z->pers_len, &z->pool_len);
    if (sh != d->shard_len)
        return l3d_error(t->ctx, L3D_ERR_INTERNAL, "ZeRO-3: shard of %zu floats, buckets say %zu",
                         sh, d->shard_len);
    z->pers_at = l3d_calloc(t->ctx, (size_t)G, sizeof(size_t), "other");
    z->grp_bucket = l3d_calloc(t->ctx, (size_t)G, sizeof(int), "other");
    z->seq = l3d_calloc(t->ctx, (size_t)G + 1, sizeof(int), "other");
    z->live = l3d_calloc(t->ctx, (size_t)G, sizeof(live_t), "other");
    if (!z->pers_at || !z->grp_bucket || !z->seq || !z->live) return L3D_ERR_NOMEM;
    size_t pat = 0;
    for (int k = 0; k < d->nb; k++) {
        const l3d_dp_bucket_t *b = &d->b[k];
        z->pers_at[k] = persistent(&t->cfg, b->end - b->off) ? pat : SIZE_MAX;
        if (z->pers_at[k] != SIZE_MAX) pat += b->len;
    }
    for (int i = 0; i < G; i++) {
        size_t lo, n;
        l3d_model_grad_group(m, i, &lo, &n, NULL);
        z->grp_bucket[i] = bucket_of(d, lo, lo + n);
    }
    L3D_CHECK(t->ctx, shard_alloc(t, sizeof(float), shard_host(t), (void **)&z->pshard));
    if (z->wt != L3D_FLOAT32)
        L3D_CHECK(t->ctx, shard_alloc(t, z->ew, t->cfg.offload_param, &z->wshard));
    if (z->pers_len)
        L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, z->pers_len * z->ew, "params", &z->pers));
    L3D_CHECK(t->ctx, l3d_zero3_partition(t));  // the whole parameters freed before the pool
    if (z->pool_len)
        L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, z->pool_len * z->ew, "params", &z->pool));
    return L3D_OK;
}

void l3d_zero3_arm(l3d_trainer_t *t) {
    for (int i = 0; i < t->pp.nslots; i++) {
        l3d_acts_t *a = t->pp.slots[i];
        a->param_window = z3_window;
        a->param_release = z3_release;
        a->param_arg = t;
    }
}

void l3d_zero3_fini(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_zero3_t *z = d->z3;
    if (!z) return;
    while (z->nlive > 0) (void)live_drop(t, z->nlive - 1);
    int G = l3d_model_grad_groups(t->model);
    l3d_dev_free(t->dev, z->pool, z->pool_len * z->ew, "params");
    l3d_dev_free(t->dev, z->pers, z->pers_len * z->ew, "params");
    if (z->wshard) shard_free(t, z->ew, t->cfg.offload_param, z->wshard);
    if (z->pshard) shard_free(t, sizeof(float), shard_host(t), z->pshard);
    l3d_free(t->ctx, z->live, (size_t)G * sizeof(live_t), "other");
    l3d_free(t->ctx, z->seq, ((size_t)G + 1) * sizeof(int), "other");
    l3d_free(t->ctx, z->grp_bucket, (size_t)G * sizeof(int), "other");
    l3d_free(t->ctx, z->pers_at, (size_t)G * sizeof(size_t), "other");
    l3d_free(t->ctx, z, sizeof(*z), "other");
    d->z3 = NULL;
}

float *l3d_zero3_piece_at(l3d_trainer_t *t, size_t sh) { return t->dp.z3->pshard + sh; }

static int fused16(const l3d_trainer_t *t) {
    return t->dp.z3->wshard && !t->off.optim && !t->cfg.offload_param && !shard_host(t);
}
void *l3d_zero3_piece16_at(l3d_trainer_t *t, size_t sh) {
    return fused16(t) ? l3d_elem(t->dp.z3->wshard, t->dp.z3->wt, sh) : NULL;
}

l3d_status l3d_zero3_before_update(l3d_trainer_t *t) {
    l3d_zero3_t *z = t->dp.z3;
    if (!fused16(t)) return L3D_OK;
    for (int i = 0; i < z->nlive; i++) L3D_CHECK(t->ctx, live_wait(t, &z->live[i]));
    return L3D_OK;
}

l3d_status l3d_zero3_gather_persistent(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_zero3_t *z = d->z3;
    l3d_status st = L3D_OK;
    z->stale = !fused16(t);  // AdamW updated the master pieces (and rounded them, fused)
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    for (int k = 0; k < d->nb && st >= 0; k++) {
        l3d_dp_bucket_t *b = &d->b[k];
        if (z->pers_at[k] == SIZE_MAX) continue;
        if ((st = gather_into(t, b, l3d_elem(z->pers, z->wt, z->pers_at[k]), &b->req)) < 0)
            st = comm_fail(t, st, "persistent parameter all-gather");
    }
    for (int k = 0; k < d->nb; k++) {
        l3d_dp_bucket_t *b = &d->b[k];
        if (!b->req) continue;
        l3d_status s = l3d_request_wait(b->req);
        b->req = NULL;
        if (s < 0 && st >= 0) st = comm_fail(t, s, "persistent parameter all-gather");
    }
    return st;
}

// ---- whole again, for checkpoints --------------------------------------------------------------
// With 16-bit weights the pool and the persistent groups are rounded copies: the whole float32
// parameters come from the master pieces (l3d_dp_master_whole).
l3d_status l3d_zero3_materialize(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    l3d_zero3_t *z = d->z3;
    if (!d->zero3 || !z || m->params) return L3D_OK;
    while (z->nlive > 0) L3D_CHECK(t->ctx, live_drop(t, 0));
    if (z->wshard) return l3d_dp_master_whole(t, z->pshard);
    L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, m->n_params * sizeof(float), "params",
                                    (void **)&m->params));
    l3d_status st = L3D_OK;
    for (int k = 0; k < d->nb && st >= 0; k++) {
        const l3d_dp_bucket_t *b = &d->b[k];
        const float *src = z->pers_at[k] != SIZE_MAX ? (const float *)z->pers + z->pers_at[k]
                                                      : (const float *)z->pool;
        if (z->pers_at[k] == SIZE_MAX) {  // through the pool's start (it is empty)
            st = gather_start(t, k, 0);
            if (st >= 0) st = live_drop(t, 0);
        }
        if (st >= 0)
            st = l3d_dev_copy(t->dev, m->params + b->off, src, (b->end - b->off) * sizeof(float),
                              L3D_COPY_D2D);
    }
    if (st < 0) {
        l3d_dev_free(t->dev, m->params, m->n_params * sizeof(float), "params");
        m->params = NULL;
    }
    return st;
}

l3d_status l3d_zero3_partition(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    l3d_zero3_t *z = d->z3;
    if (!d->zero3 || !z || !m->params) return L3D_OK;
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    for (int k = 0; k < d->nb; k++) {
        const l3d_dp_bucket_t *b = &d->b[k];
        size_t lo = min_sz(b->off + (size_t)d->rank * b->q, b->end);
        size_t hi = min_sz(lo + b->q, b->end), n = hi - lo;
        float *piece = z->pshard + b->sh;
        // the piece past the bucket's end is padding: zero, as every rank's gather expects
        // (host memory: written through the host's own memset)
        if (shard_host(t)) memset(piece + n, 0, (b->q - n) * sizeof(float));
        else L3D_CHECK(t->ctx, l3d_dev_memset(t->dev, piece + n, 0, (b->q - n) * sizeof(float)));
        if (n)
            L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, piece, m->params + lo, n * sizeof(float),
                                           device_to_shard(t)));
        if (z->pers_at[k] == SIZE_MAX) continue;
        void *whole = l3d_elem(z->pers, z->wt, z->pers_at[k]);
        size_t len = b->end - b->off;
        L3D_CHECK(t->ctx, l3d_dev_convert(t->dev, whole, z->wt, m->params + b->off, L3D_FLOAT32,
                                          len));
        L3D_CHECK(t->ctx, l3d_dev_memset(t->dev, l3d_elem(whole, z->wt, len), 0,
                                         (b->len - len) * z->ew));
    }
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    l3d_dev_free(t->dev, m->params, m->n_params * sizeof(float), "params");
    m->params = NULL;
    z->stale = 1;
    return L3D_OK;
}
