// Schedules and the memory registration cache: what a collective builds (rounds of sends,
// receives and local ops, libNBC style) before a request runs it (core/comm/comm_request.c), and
// the registrations that transports needing them keep per buffer. Failure notices are in
// core/comm/comm_notice.c.
#include <stdio.h>
#include <string.h>

#include "core/comm/comm_internal.h"
#include "platform/platform.h"

// ---- tags ---------------------------------------------------------------------------------------
void l3d_tag_layout_init(l3d_tag_layout_t *t, int tag_bits) {
    if (tag_bits > 64) tag_bits = 64;
    if (tag_bits < 32) tag_bits = 32;  // the transport contract promises at least 32
    t->bits = tag_bits;
    if (tag_bits >= 48) {
        t->id_bits = 16;
        t->seq_bits = 16;
    } else {
        t->id_bits = 10;
        t->seq_bits = 12;
    }
    t->step_bits = tag_bits - 2 - t->id_bits - t->seq_bits;
}

static uint64_t mask_bits(int b) { return b >= 64 ? ~0ull : ((1ull << b) - 1); }

uint64_t l3d_tag_make(const l3d_tag_layout_t *t, unsigned kind, uint32_t id, uint32_t seq,
                      uint32_t step) {
    uint64_t tag = (uint64_t)kind & 3u;
    tag = (tag << t->id_bits) | ((uint64_t)id & mask_bits(t->id_bits));
    tag = (tag << t->seq_bits) | ((uint64_t)seq & mask_bits(t->seq_bits));
    tag = (tag << t->step_bits) | ((uint64_t)step & mask_bits(t->step_bits));
    return tag;
}

uint64_t l3d_tag_step_mask(const l3d_tag_layout_t *t) { return mask_bits(t->step_bits); }

// ---- schedule builder ---------------------------------------------------------------------------
#define L3D_SPARE_SCHEDS 8  // schedules' arrays kept per world

// Moves the arrays (and their capacities) of `from` into `to`, counts zero.
static void sched_take_arrays(l3d_sched_t *to, l3d_sched_t *from) {
    to->p2p = from->p2p;
    to->cap_p = from->cap_p;
    to->lop = from->lop;
    to->cap_l = from->cap_l;
    to->rd = from->rd;
    to->cap_r = from->cap_r;
    to->tmp = from->tmp;
    to->cap_t = from->cap_t;
    memset(from, 0, sizeof(*from));
}

void l3d_sched_init(l3d_sched_t *s, l3d_comm_t *c) {
    l3d_world_t *w = c->world;
    memset(s, 0, sizeof(*s));
    if (w->nspare) sched_take_arrays(s, &w->spare[--w->nspare]);
    s->ctx = c->ctx;
    s->world = w;
    s->max_msg = w->caps.max_msg ? w->caps.max_msg : SIZE_MAX;
}

#define SCRATCH_MIN (256u << 10)  // smaller temporaries come cheaply from the allocator
#define SCRATCH_MAX ((size_t)256 << 20)

static void tmp_free(l3d_sched_t *s, void *p, size_t n) {
    l3d_world_t *w = s->world;
    if (w && n >= SCRATCH_MIN && n <= SCRATCH_MAX) {
        int slot = -1;  // an empty slot, else the smallest (replaced if this one is larger)
        for (int i = 0; i < 4 && slot < 0; i++)
            if (!w->scratch[i].p) slot = i;
        if (slot < 0) {
            slot = 0;
            for (int i = 1; i < 4; i++)
                if (w->scratch[i].n < w->scratch[slot].n) slot = i;
        }
        struct l3d_scratch old = w->scratch[slot];
        if (!old.p || old.n < n) {
            w->scratch[slot] = (struct l3d_scratch){p, n};
            if (!old.p) return;
            p = old.p;
            n = old.n;
        }
    }
    if (w && w->caps.needs_mr) l3d_world_mr_purge(w, p, n);
    l3d_free(s->ctx, p, n, "comm");
}

static void sched_free_arrays(l3d_ctx_t *ctx, l3d_sched_t *s) {
    l3d_free(ctx, s->tmp, s->cap_t * sizeof(*s->tmp), "comm");
    l3d_free(ctx, s->p2p, s->cap_p * sizeof(*s->p2p), "comm");
    l3d_free(ctx, s->lop, s->cap_l * sizeof(*s->lop), "comm");
    l3d_free(ctx, s->rd, s->cap_r * sizeof(*s->rd), "comm");
    memset(s, 0, sizeof(*s));
}

void l3d_world_scratch_release(l3d_world_t *w) {
    for (int i = 0; i < 4; i++) {
        if (!w->scratch[i].p) continue;
        if (w->caps.needs_mr) l3d_world_mr_purge(w, w->scratch[i].p, w->scratch[i].n);
        l3d_free(w->ctx, w->scratch[i].p, w->scratch[i].n, "comm");
        w->scratch[i].p = NULL;
    }
    l3d_world_requests_release(w);
    if (w->spare) {
        for (int i = 0; i < w->nspare; i++) sched_free_arrays(w->ctx, &w->spare[i]);
        l3d_free(w->ctx, w->spare, L3D_SPARE_SCHEDS * sizeof(*w->spare), "comm");
        w->spare = NULL;
        w->nspare = 0;
    }
}

void l3d_sched_fini(l3d_sched_t *s) {
    for (uint32_t i = 0; i < s->nt; i++) {
        if (s->tmp[i].bounce) l3d_stage_bounce_put(s->tmp[i].bounce, s->tmp[i].p);
        else if (s->tmp[i].dev) l3d_dev_free(s->tmp[i].dev, s->tmp[i].p, s->tmp[i].n, "comm");
        else tmp_free(s, s->tmp[i].p, s->tmp[i].n);
    }
    l3d_world_t *w = s->world;
    if (w && !w->spare) w->spare = l3d_calloc(s->ctx, L3D_SPARE_SCHEDS, sizeof(*w->spare), "comm");
    // Kept whenever it owns an array: a native or copy-only schedule has rounds but no p2p
    // ops, and freeing its arrays cost a malloc/free pair on every small call.
    if (w && w->spare && w->nspare < L3D_SPARE_SCHEDS &&
        (s->cap_p || s->cap_l || s->cap_r || s->cap_t)) {
        sched_take_arrays(&w->spare[w->nspare++], s);
        return;
    }
    sched_free_arrays(s->ctx, s);
}

// Grows an array of `esz`-byte elements to hold one more; 0 on success.
static int grow(l3d_sched_t *s, void **arr, uint32_t n, uint32_t *cap, size_t esz) {
    if (s->st < 0) return -1;
    if (n < *cap) return 0;
    uint32_t nc = *cap ? *cap * 2 : 16;
    void *p = l3d_malloc(s->ctx, nc * esz, "comm");
    if (!p) {
        s->st = L3D_ERR_NOMEM;
        return -1;
    }
    if (*arr) {
        memcpy(p, *arr, n * esz);
        l3d_free(s->ctx, *arr, *cap * esz, "comm");
    }
    *arr = p;
    *cap = nc;
    return 0;
}

void l3d_sched_round(l3d_sched_t *s) {
    if (grow(s, (void **)&s->rd, s->nr, &s->cap_r, sizeof(*s->rd))) return;
    s->rd[s->nr++] = (l3d_sched_round_t){s->np, 0, s->nl, 0};
}

static l3d_sched_round_t *cur_round(l3d_sched_t *s) {
    if (s->nr == 0) l3d_sched_round(s);
    return s->st < 0 ? NULL : &s->rd[s->nr - 1];
}

static int add_p2p(l3d_sched_t *s, int send, int peer, uint32_t step, void *buf, size_t len) {
    if (len == 0) return -1;
    int pieces = 0, idx = -1;
    for (size_t off = 0; off < len; off += s->max_msg, pieces++) {
        l3d_sched_round_t *rd = cur_round(s);
        if (!rd || grow(s, (void **)&s->p2p, s->np, &s->cap_p, sizeof(*s->p2p))) return -1;
        size_t n = L3D_MIN(s->max_msg, len - off);
        s->p2p[s->np++] = (l3d_sched_p2p_t){(char *)buf + off, n, peer, step, (uint8_t)send};
        idx = (int)rd->np++;
    }
    return pieces == 1 ? idx : -1;
}

int l3d_sched_send(l3d_sched_t *s, int peer, uint32_t step, const void *buf, size_t len) {
    return add_p2p(s, 1, peer, step, (void *)buf, len);
}
int l3d_sched_recv(l3d_sched_t *s, int peer, uint32_t step, void *buf, size_t len) {
    return add_p2p(s, 0, peer, step, buf, len);
}

void l3d_sched_native(l3d_sched_t *s, l3d_tp_coll_fn fn, const l3d_tp_coll_args_t *args) {
    l3d_sched_round_t *rd = cur_round(s);
    if (!rd || grow(s, (void **)&s->p2p, s->np, &s->cap_p, sizeof(*s->p2p))) return;
    s->p2p[s->np++] = (l3d_sched_p2p_t){NULL, 0, -1, 0, 2};
    rd->np++;
    s->native = fn;
    s->nargs = *args;
}

static void add_lop(l3d_sched_t *s, l3d_sched_lop_t op) {
    l3d_sched_round_t *rd = cur_round(s);
    if (!rd || grow(s, (void **)&s->lop, s->nl, &s->cap_l, sizeof(*s->lop))) return;
    s->lop[s->nl++] = op;
    rd->nl++;
}

void l3d_sched_reduce(l3d_sched_t *s, int after, void *dst, const void *a, const void *b,
                      size_t count, l3d_dtype wdt, l3d_redop op) {
    if (!count) return;
    add_lop(s, (l3d_sched_lop_t){L3D_LOP_REDUCE, (uint8_t)wdt, (uint8_t)wdt, (uint8_t)op, after,
                                 dst, a, b, count, 0, NULL});
}
void l3d_sched_copy(l3d_sched_t *s, int after, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    add_lop(s, (l3d_sched_lop_t){L3D_LOP_COPY, 0, 0, 0, after, dst, src, NULL, bytes, 0, NULL});
}
void l3d_sched_h2d(l3d_sched_t *s, l3d_comm_t *c, int after, void *dst, const void *src,
                   size_t bytes) {
    if (!bytes) return;
    l3d_sched_lop_t op = {.kind = L3D_LOP_H2D, .after = after, .dst = dst, .a = src,
                          .count = bytes, .dev = c->dev};
    add_lop(s, op);
}
void l3d_sched_d2h(l3d_sched_t *s, l3d_comm_t *c, int after, void *dst, const void *src,
                   size_t bytes) {
    if (!bytes) return;
    l3d_sched_lop_t op = {.kind = L3D_LOP_D2H, .after = after, .dst = dst, .a = src,
                          .count = bytes, .dev = c->dev};
    add_lop(s, op);
}
void l3d_sched_towire(l3d_sched_t *s, int after, float *dst, const void *src, size_t count,
                      l3d_dtype dt) {
    if (!count) return;
    add_lop(s, (l3d_sched_lop_t){L3D_LOP_TOWIRE, (uint8_t)dt, L3D_FLOAT32, 0, after, dst, src,
                                 NULL, count, 0, NULL});
}
void l3d_sched_final(l3d_sched_t *s, int after, void *dst, const void *src, size_t count,
                     l3d_dtype dt, l3d_redop op, int n) {
    if (!count) return;
    if (dst == src && (op != L3D_AVG || n <= 1) && l3d_reduce_wire_type(dt) == dt) return;
    add_lop(s, (l3d_sched_lop_t){L3D_LOP_FINAL, (uint8_t)dt, (uint8_t)l3d_reduce_wire_type(dt),
                                 (uint8_t)op, after, dst, src, NULL, count, n, NULL});
}

l3d_status l3d_sched_tmp_keep(l3d_sched_t *s, void *p, size_t n, l3d_device_t *d) {
    if (grow(s, (void **)&s->tmp, s->nt, &s->cap_t, sizeof(*s->tmp))) return s->st;
    s->tmp[s->nt++] = (struct l3d_sched_tmp){p, n, NULL, d};
    return L3D_OK;
}

void *l3d_sched_tmp(l3d_sched_t *s, size_t bytes) {
    if (grow(s, (void **)&s->tmp, s->nt, &s->cap_t, sizeof(*s->tmp))) return NULL;
    if (!bytes) bytes = 1;
    l3d_world_t *w = s->world;
    if (w && bytes >= SCRATCH_MIN)
        for (int i = 0; i < 4; i++)
            if (w->scratch[i].p && w->scratch[i].n >= bytes && w->scratch[i].n / 2 <= bytes) {
                s->tmp[s->nt++] =
                    (struct l3d_sched_tmp){w->scratch[i].p, w->scratch[i].n, NULL, NULL};
                w->scratch[i].p = NULL;
                return s->tmp[s->nt - 1].p;
            }
    void *p = l3d_malloc(s->ctx, bytes, "comm");
    if (!p) {
        s->st = L3D_ERR_NOMEM;
        return NULL;
    }
    s->tmp[s->nt++] = (struct l3d_sched_tmp){p, bytes, NULL, NULL};
    return p;
}

void *l3d_stage_tmp(l3d_sched_t *s, l3d_device_t *d, size_t bytes) {
    if (grow(s, (void **)&s->tmp, s->nt, &s->cap_t, sizeof(*s->tmp))) return NULL;
    if (!bytes) bytes = 1;
    // the smallest free buffer that holds it; else a free slot, refilled at this size
    int fit = -1, slot = -1;
    for (int i = 0; i < L3D_DEVICE_BOUNCE; i++) {
        const struct l3d_bounce *b = &d->bounce[i];
        if (b->busy) continue;
        if (b->p && b->n >= bytes && (fit < 0 || b->n < d->bounce[fit].n)) fit = i;
        if (slot < 0 || (d->bounce[slot].p && (!b->p || b->n < d->bounce[slot].n))) slot = i;
    }
    if (fit < 0 && slot >= 0 && bytes <= SCRATCH_MAX) {
        struct l3d_bounce *b = &d->bounce[slot];
        l3d_stage_bounce_drop(s->world, d, b);
        if (l3d_dev_alloc_host(d, bytes, 1, "comm", &b->p) < 0) {
            b->p = NULL;
            return l3d_sched_tmp(s, bytes);
        }
        b->n = bytes;
        fit = slot;
    }
    if (fit < 0) return l3d_sched_tmp(s, bytes);  // all held, or larger than kept buffers
    d->bounce[fit].busy = 1;
    s->tmp[s->nt++] = (struct l3d_sched_tmp){d->bounce[fit].p, bytes, d, NULL};
    return d->bounce[fit].p;
}

void l3d_stage_bounce_put(l3d_device_t *d, void *p) {
    for (int i = 0; i < L3D_DEVICE_BOUNCE; i++)
        if (d->bounce[i].p == p) d->bounce[i].busy = 0;
}

l3d_status l3d_sched_run_lop(const l3d_sched_lop_t *o) {
    switch (o->kind) {
    case L3D_LOP_REDUCE:
        l3d_reduce_apply(o->dst, o->a, o->b, o->count, (l3d_dtype)o->wdt, (l3d_redop)o->op);
        break;
    case L3D_LOP_COPY:
        memmove(o->dst, o->a, o->count);
        break;
    case L3D_LOP_TOWIRE:
        l3d_reduce_to_f32(o->dst, o->a, o->count, (l3d_dtype)o->dt);
        break;
    case L3D_LOP_FINAL:
        l3d_reduce_final(o->dst, o->a, o->count, (l3d_dtype)o->dt, (l3d_redop)o->op, o->n);
        break;
    case L3D_LOP_H2D:
        return l3d_stage_h2d(o->dev, o->dst, o->a, o->count);
    case L3D_LOP_D2H:
        return l3d_stage_d2h(o->dev, o->dst, o->a, o->count);
    }
    return L3D_OK;
}

// ---- memory registration cache ------------------------------------------------------------------
l3d_status l3d_world_mr(l3d_world_t *w, void *buf, size_t len, void **mr_p) {
    char *p = buf;
    for (size_t i = 0; i < w->nmr; i++)
        if (w->mrs[i].ptr <= p && p + len <= w->mrs[i].ptr + w->mrs[i].len) {
            *mr_p = w->mrs[i].mr;
            return L3D_OK;
        }
    if (w->nmr == w->cap_mr) {
        size_t nc = w->cap_mr ? w->cap_mr * 2 : 16;
        l3d_mr_entry_t *e = l3d_malloc(w->ctx, nc * sizeof(*e), "comm");
        if (!e) return L3D_ERR_NOMEM;
        if (w->mrs) memcpy(e, w->mrs, w->nmr * sizeof(*e));
        l3d_free(w->ctx, w->mrs, w->cap_mr * sizeof(*e), "comm");
        w->mrs = e;
        w->cap_mr = nc;
    }
    void *mr = NULL;
    L3D_CHECK(w->ctx, l3d_tp_mr_reg(&w->tp, buf, len, &mr));
    w->mrs[w->nmr++] = (l3d_mr_entry_t){p, len, mr};
    *mr_p = mr;
    return L3D_OK;
}

void l3d_world_mr_purge(l3d_world_t *w, void *buf, size_t len) {
    char *p = buf;
    for (size_t i = 0; i < w->nmr;) {
        l3d_mr_entry_t *e = &w->mrs[i];
        if (e->ptr < p + len && p < e->ptr + e->len) {
            l3d_tp_mr_dereg(&w->tp, e->mr);
            *e = w->mrs[--w->nmr];
        } else {
            i++;
        }
    }
}

void l3d_world_mr_release(l3d_world_t *w) {
    for (size_t i = 0; i < w->nmr; i++) l3d_tp_mr_dereg(&w->tp, w->mrs[i].mr);
    l3d_free(w->ctx, w->mrs, w->cap_mr * sizeof(*w->mrs), "comm");
    w->mrs = NULL;
    w->nmr = w->cap_mr = 0;
}
