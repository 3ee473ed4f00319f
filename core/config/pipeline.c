// Pipeline schedules and their validation (see core/config/pipeline.h).
#include <string.h>

#include "core/config/pipeline.h"

// Megatron's interleaved order: the k-th forward (or backward) of a stage, k < A*v.
static l3d_pp_op_t interleaved_op(int pp, int v, int k, int backward) {
    int group = k % (pp * v), chunk = group / pp;
    l3d_pp_op_t o = {backward, (k / (pp * v)) * pp + k % pp, backward ? v - 1 - chunk : chunk};
    return o;
}

// Op i of stage's interleaved schedule: w warm-up forwards, 1F1B pairs, the last backwards.
static int interleaved_warmup(int pp, int v, int stage, int A) {
    int total = A * v;
    return A == pp ? total : L3D_MIN((pp - stage - 1) * 2 + (v - 1) * pp, total);
}
static l3d_pp_op_t interleaved_at(int pp, int v, int stage, int A, int i) {
    int total = A * v, w = interleaved_warmup(pp, v, stage, A), rem = total - w;
    if (i < w) return interleaved_op(pp, v, i, 0);
    if (i < w + 2 * rem) {
        int k = (i - w) / 2;
        return (i - w) % 2 ? interleaved_op(pp, v, k, 1) : interleaved_op(pp, v, w + k, 0);
    }
    return interleaved_op(pp, v, rem + (i - w - 2 * rem), 1);
}

// Op i of the stage's schedule (the orders in pipeline.h; 1F1B: w warm-up forwards, then F
// and B alternating, then the last w backwards).
static l3d_pp_op_t op_at(l3d_pp_kind kind, int pp, int v, int stage, int A, int i) {
    if (kind == L3D_PP_INTERLEAVED) return interleaved_at(pp, v, stage, A, i);
    if (kind == L3D_PP_GPIPE) return i < A ? (l3d_pp_op_t){0, i, 0} : (l3d_pp_op_t){1, i - A, 0};
    int w = L3D_MIN(pp - stage - 1, A);
    if (i < w) return (l3d_pp_op_t){0, i, 0};
    if (i < 2 * A - w) {
        int k = i - w;
        return k % 2 ? (l3d_pp_op_t){1, k / 2, 0} : (l3d_pp_op_t){0, w + k / 2, 0};
    }
    return (l3d_pp_op_t){1, A - w + (i - (2 * A - w)), 0};
}

int l3d_pp_schedule(l3d_pp_kind kind, int pp, int v, int stage, int A, l3d_pp_op_t *ops) {
    int n = 2 * A * (kind == L3D_PP_INTERLEAVED ? v : 1);
    for (int i = 0; i < n; i++) ops[i] = op_at(kind, pp, v, stage, A, i);
    return n;
}

int l3d_pp_slots(l3d_pp_kind kind, int pp, int v, int stage, int A, int chunk) {
    if (kind == L3D_PP_GPIPE) return A;
    if (kind != L3D_PP_INTERLEAVED) return L3D_MIN(pp - stage, A);
    // The peak of the chunk's forwarded-not-backwarded micro-batches along the schedule.
    int live = 0, peak = 0;
    for (int i = 0; i < 2 * A * v; i++) {
        l3d_pp_op_t o = interleaved_at(pp, v, stage, A, i);
        if (o.chunk != chunk) continue;
        live += o.backward ? -1 : 1;
        peak = live > peak ? live : peak;
    }
    return peak > 0 ? peak : 1;
}

int l3d_pp_layer_peak(l3d_pp_kind kind, int pp, int v, int stage, int A, const int *chunk_layers) {
    int live = 0, peak = 0, n = 2 * A * (kind == L3D_PP_INTERLEAVED ? v : 1);
    for (int i = 0; i < n; i++) {
        l3d_pp_op_t o = op_at(kind, pp, v, stage, A, i);
        live += o.backward ? -chunk_layers[o.chunk] : chunk_layers[o.chunk];
        peak = L3D_MAX(peak, live);
    }
    return peak;
}

int l3d_pp_peaks(l3d_pp_kind kind, int pp, int v, int stage, int A, const int *chunk_layers,
                 int *slots) {
    int live = 0, peak = 0, n = 2 * A * v, cl[64] = {0};  // (v <= 64: the config's bound)
    if (kind != L3D_PP_INTERLEAVED || v > 64) {
        for (int c = 0; c < v; c++) slots[c] = l3d_pp_slots(kind, pp, v, stage, A, c);
        return l3d_pp_layer_peak(kind, pp, v, stage, A, chunk_layers);
    }
    for (int c = 0; c < v; c++) slots[c] = 0;
    for (int i = 0; i < n; i++) {
        l3d_pp_op_t o = interleaved_at(pp, v, stage, A, i);
        int d = o.backward ? -1 : 1;
        live += d * chunk_layers[o.chunk];
        peak = L3D_MAX(peak, live);
        cl[o.chunk] += d;
        slots[o.chunk] = L3D_MAX(slots[o.chunk], cl[o.chunk]);
    }
    for (int c = 0; c < v; c++) slots[c] = L3D_MAX(slots[c], 1);
    return peak;
}

l3d_status l3d_pp_kind_parse(l3d_ctx_t *ctx, const char *name, l3d_pp_kind *kind) {
    if (!name || !name[0] || !strcmp(name, "1f1b")) *kind = L3D_PP_1F1B;
    else if (!strcmp(name, "gpipe")) *kind = L3D_PP_GPIPE;
    else if (!strcmp(name, "interleaved")) *kind = L3D_PP_INTERLEAVED;
    else
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.schedule '%s': must be 1f1b, gpipe or "
                         "interleaved", name);
    return L3D_OK;
}

l3d_status l3d_pp_check(l3d_ctx_t *ctx, l3d_pp_kind kind, int pp, int v, int A) {
    if (kind != L3D_PP_INTERLEAVED) {
        if (v != 1)
            return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.virtual_stages %d needs "
                             "parallel.schedule 'interleaved'", v);
        return L3D_OK;
    }
    if (pp < 2)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.schedule 'interleaved' needs "
                         "parallel.pp >= 2 (it has %d)", pp);
    if (v < 2)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.schedule 'interleaved' needs "
                         "parallel.virtual_stages >= 2 (it has %d)", v);
    if (A % pp)
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.schedule 'interleaved' needs "
                         "gradient_accumulation_steps (%d) to be a multiple of parallel.pp (%d)",
                         A, pp);
    return L3D_OK;
}

// Simulation. Each ordered pair of neighbouring stages is a FIFO channel of message ids
// (direction, micro-batch, receiving virtual stage); with pp 2 both neighbours are one stage
// and share a channel. A stage advances while its next op's message is at the head of its
// channel; another message there means the transport would deliver the wrong data. A send
// completes when its message leaves the channel, and a stage waits for that before it reuses
// the send's ring buffer (L3D_PP_RING).
typedef struct sim {
    int pp, U, A;
    int *q, *head, *tail;  // channel c holds q[c * cap + head .. tail)
    size_t cap;
} sim_t;

static int channel(const sim_t *s, int src, int dst) {
    return src * 2 + (dst == (src + 1) % s->pp ? 0 : 1);
}
static int msg_id(const sim_t *s, int backward, int micro, int u) {
    return (backward * s->A + micro) * s->U + u;
}

l3d_status l3d_pp_validate(l3d_ctx_t *ctx, l3d_pp_kind kind, int pp, int v, int A) {
    if (pp < 1 || A < 1 || v < 1 || (size_t)pp * (size_t)A * (size_t)v > (1u << 24))
        return l3d_error(ctx, L3D_ERR_CONFIG, "pipeline validation: pp %d x micro-batches %d x "
                         "virtual stages %d is out of range (at most 2^24)", pp, A, v);
    L3D_CHECK(ctx, l3d_pp_check(ctx, kind, pp, v, A));
    size_t P = (size_t)pp, M = 2 * (size_t)A * (size_t)v, V = (size_t)v;
    // ring: per stage and direction, the buffers used so far and each buffer's last message
    // (channel, position; -1: none pending)
    size_t R = L3D_PP_RING, ring_ints = 2 * P * (1 + 2 * R);
    size_t bytes = P * M * sizeof(l3d_pp_op_t) + (2 * P + 2 * P * V) * sizeof(int) +
                   2 * P * (2 + M) * sizeof(int) + ring_ints * sizeof(int);
    char *mem = l3d_calloc(ctx, 1, bytes, "other");
    if (!mem) return L3D_ERR_NOMEM;
    l3d_pp_op_t *ops = (l3d_pp_op_t *)mem;
    int *nops = (int *)(ops + P * M), *pc = nops + P, *live = pc + P, *maxlive = live + P * V;
    sim_t sm = {pp, pp * v, A, maxlive + P * V, NULL, NULL, M};
    sm.head = sm.q + 2 * P * M;
    sm.tail = sm.head + 2 * P;
    int *ring = sm.tail + 2 * P;
    for (size_t i = 0; i < ring_ints; i++) ring[i] = i % (1 + 2 * R) ? -1 : 0;
    for (int s = 0; s < pp; s++) nops[s] = l3d_pp_schedule(kind, pp, v, s, A, ops + (size_t)s * M);
    l3d_status st = L3D_OK;
    for (int moved = 1; moved && st >= 0;) {
        moved = 0;
        for (int s = 0; s < pp && st >= 0; s++) {
            while (pc[s] < nops[s]) {
                l3d_pp_op_t o = ops[(size_t)s * M + (size_t)pc[s]];
                int u = o.chunk * pp + s, up = (s + 1) % pp, down = (s - 1 + pp) % pp;
                int recv = o.backward ? u < sm.U - 1 : u > 0;
                int send = o.backward ? u > 0 : u < sm.U - 1;
                // A B always writes a dres buffer, an F one only when it sends: the buffer's
                // previous send must have been received.
                int *rg = ring + ((size_t)s * 2 + (size_t)o.backward) * (1 + 2 * R);
                int *e = o.backward || send ? rg + 1 + 2 * ((size_t)rg[0] % R) : NULL;
                if (e && e[0] >= 0 && sm.head[e[0]] <= e[1]) break;
                if (recv) {
                    int c = channel(&sm, o.backward ? up : down, s);
                    if (sm.head[c] == sm.tail[c]) break;
                    int got = sm.q[(size_t)c * M + (size_t)sm.head[c]];
                    int want = msg_id(&sm, o.backward, o.micro, u);
                    if (got != want) {
                        st = l3d_error(ctx, L3D_ERR_INTERNAL, "pipeline schedule (pp %d, v %d, "
                                       "%d micro-batches): stage %d op %d receives message %d "
                                       "but %d is first in its channel", pp, v, A, s, pc[s],
                                       want, got);
                        break;
                    }
                    sm.head[c]++;
                }
                if (e) {
                    rg[0]++;
                    e[0] = -1;
                }
                if (send) {
                    int dst = o.backward ? down : up, c = channel(&sm, s, dst);
                    e[0] = c;
                    e[1] = sm.tail[c];
                    sm.q[(size_t)c * M + (size_t)sm.tail[c]++] =
                        msg_id(&sm, o.backward, o.micro, o.backward ? u - 1 : u + 1);
                }
                int *lv = &live[(size_t)s * V + (size_t)o.chunk];
                *lv += o.backward ? -1 : 1;
                if (*lv < 0) {
                    st = l3d_error(ctx, L3D_ERR_INTERNAL, "pipeline schedule: stage %d runs "
                                   "B(%d) of chunk %d before its F", s, o.micro, o.chunk);
                    break;
                }
                int *mx = &maxlive[(size_t)s * V + (size_t)o.chunk];
                if (*lv > *mx) *mx = *lv;
                pc[s]++;
                moved = 1;
            }
        }
    }
    for (int s = 0; s < pp && st >= 0; s++) {
        if (pc[s] < nops[s]) {
            st = l3d_error(ctx, L3D_ERR_INTERNAL, "pipeline schedule (pp %d, v %d, %d "
                           "micro-batches) deadlocks: stage %d stops at op %d of %d", pp, v, A,
                           s, pc[s], nops[s]);
            break;
        }
        for (int c = 0; c < v && st >= 0; c++) {
            int have = l3d_pp_slots(kind, pp, v, s, A, c), used = maxlive[(size_t)s * V + (size_t)c];
            if (used > have)
                st = l3d_error(ctx, L3D_ERR_INTERNAL, "pipeline schedule (pp %d, %d "
                               "micro-batches): stage %d chunk %d holds %d activation sets, "
                               "more than its %d", pp, A, s, c, used, have);
        }
    }
    l3d_free(ctx, mem, bytes, "other");
    return st;
}
