// Algorithm selection: an alpha-beta(-gamma) cost model seeded from the transport's caps picks
// the algorithm per (collective, bytes, ranks); L3D_ALGO=op:algo[,op:algo] overrides it.
//
//   alpha = caps.latency_us (per message), beta = 1 / caps.bandwidth_gbs (per byte),
//   gamma = cost of reducing one byte locally (REDUCE_GBS), m = bytes, n = ranks,
//   w = wire bytes per user byte (2 for bf16/f16: partial sums travel as float32).
// The formulas are in docs/comm.md next to each algorithm.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/comm/comm_internal.h"

#define REDUCE_GBS 3.0          // ~ one add per element at memory speed on these machines
#define PIPE_SEG (512u << 10)   // pipeline segment for large messages

static const char *coll_names[L3D_COLL_COUNT] = {"allreduce", "reduce_scatter", "allgather",
                                                 "broadcast", "reduce",         "alltoall",
                                                 "barrier"};
static const char *algo_names[L3D_ALGO_COUNT] = {"auto",  "native", "ring",     "rabenseifner",
                                                 "recdoubling", "tree", "bruck", "chain",
                                                 "pairwise", "dissemination"};

// The algorithms each collective accepts in L3D_ALGO (AUTO-terminated).
static const l3d_algo valid[L3D_COLL_COUNT][6] = {
    [L3D_COLL_ALLREDUCE] = {L3D_ALGO_RING, L3D_ALGO_RABENSEIFNER, L3D_ALGO_RECDOUBLING,
                            L3D_ALGO_TREE, L3D_ALGO_NATIVE},
    [L3D_COLL_REDUCE_SCATTER] = {L3D_ALGO_RING, L3D_ALGO_NATIVE},
    [L3D_COLL_ALLGATHER] = {L3D_ALGO_RING, L3D_ALGO_RECDOUBLING, L3D_ALGO_BRUCK, L3D_ALGO_NATIVE},
    [L3D_COLL_BROADCAST] = {L3D_ALGO_TREE, L3D_ALGO_CHAIN, L3D_ALGO_NATIVE},
    [L3D_COLL_REDUCE] = {L3D_ALGO_TREE, L3D_ALGO_CHAIN},
    [L3D_COLL_ALLTOALL] = {L3D_ALGO_PAIRWISE},
    [L3D_COLL_BARRIER] = {L3D_ALGO_DISSEMINATION},
};

const char *l3d_coll_name(l3d_coll op) {
    return (unsigned)op < L3D_COLL_COUNT ? coll_names[op] : "?";
}
const char *l3d_algo_name(l3d_algo a) { return (unsigned)a < L3D_ALGO_COUNT ? algo_names[a] : "?"; }

static void list_valid(l3d_coll op, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < 6 && valid[op][i] != L3D_ALGO_AUTO && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", algo_names[valid[op][i]]);
}

l3d_status l3d_coll_parse_algo(l3d_ctx_t *ctx, const char *spec, l3d_algo *algo) {
    for (int i = 0; i < L3D_COLL_COUNT; i++) algo[i] = L3D_ALGO_AUTO;
    if (!spec || !*spec) return L3D_OK;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        char *colon = strchr(tok, ':');
        if (!colon)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "L3D_ALGO: '%s' is not op:algo (e.g. allreduce:ring,broadcast:tree)",
                             tok);
        *colon = 0;
        const char *an = colon + 1;
        int op = 0;
        for (; op < L3D_COLL_COUNT; op++)
            if (!strcmp(tok, coll_names[op])) break;
        if (op == L3D_COLL_COUNT)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "L3D_ALGO: unknown collective '%s' (valid: allreduce, reduce_scatter, "
                             "allgather, broadcast, reduce, alltoall, barrier)", tok);
        int i = 0;
        for (; i < 6 && valid[op][i] != L3D_ALGO_AUTO; i++)
            if (!strcmp(an, algo_names[valid[op][i]])) break;
        if (i == 6 || valid[op][i] == L3D_ALGO_AUTO) {
            char v[160];
            list_valid((l3d_coll)op, v, sizeof(v));
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "L3D_ALGO: unknown algorithm '%s' for %s (valid: %s)", an, tok, v);
        }
        algo[op] = valid[op][i];
    }
    return L3D_OK;
}

size_t l3d_coll_segment(const l3d_comm_t *c, size_t bytes) {
    size_t seg = PIPE_SEG, mx = c->world->caps.max_msg;
    if (mx < seg) seg = mx;
    seg &= ~(size_t)7;  // whole elements of every type
    return seg < 8 ? 8 : seg;
}

static double lg(int n) { return ceil(log2((double)n)); }

// Estimated seconds of algorithm `al` for `op` on m bytes (user type) with wire factor wf.
static double cost(const l3d_comm_t *c, l3d_coll op, l3d_algo al, double m, double wf) {
    const l3d_transport_caps_t *k = &c->world->caps;
    int n = c->size;
    double A = (k->latency_us > 0 ? k->latency_us : 1.0) * 1e-6;
    double B = 1.0 / ((k->bandwidth_gbs > 0 ? k->bandwidth_gbs : 1.0) * 1e9);
    double G = 1.0 / (REDUCE_GBS * 1e9);
    int p2 = 1;
    while (p2 * 2 <= n) p2 *= 2;
    int rem = n - p2;
    double L = log2((double)p2), f = (double)(n - 1) / n, f2 = (double)(p2 - 1) / p2;
    double fix = rem ? 2 * A + m * wf * (B + G) + m * B : 0;
    double seg = (double)l3d_coll_segment(c, (size_t)m), S = ceil(m / seg);
    if (S < 1) S = 1;
    switch (op) {
    case L3D_COLL_ALLREDUCE:
        if (al == L3D_ALGO_RING) return 2 * (n - 1) * A + f * m * (wf + 1) * B + f * m * wf * G;
        if (al == L3D_ALGO_RABENSEIFNER)
            return 2 * L * A + f2 * m * (wf + 1) * B + f2 * m * wf * G + fix;
        if (al == L3D_ALGO_RECDOUBLING) return L * (A + m * wf * (B + G)) + fix;
        if (al == L3D_ALGO_TREE) return lg(n) * (2 * A + m * wf * (B + G) + m * B);
        break;
    case L3D_COLL_ALLGATHER:  // m = the gathered total
        if (al == L3D_ALGO_RING) return (n - 1) * A + f * m * B;
        if (al == L3D_ALGO_RECDOUBLING) return (n & (n - 1)) ? INFINITY : L * A + f * m * B;
        if (al == L3D_ALGO_BRUCK) return lg(n) * A + f * m * B + m * B / 4;  // + rotation copy
        break;
    case L3D_COLL_BROADCAST:
        if (al == L3D_ALGO_TREE) return lg(n) * (A + m * B);
        if (al == L3D_ALGO_CHAIN) return (n - 2 + S) * (A + m / S * B);
        break;
    case L3D_COLL_REDUCE:
        if (al == L3D_ALGO_TREE) return lg(n) * (A + m * wf * (B + G));
        if (al == L3D_ALGO_CHAIN) return (n - 2 + S) * (A + m / S * wf * (B + G));
        break;
    default:
        return 0;  // one algorithm only
    }
    return INFINITY;
}

l3d_algo l3d_coll_select(const l3d_comm_t *c, l3d_coll op, size_t bytes, l3d_dtype dt,
                         int native_ok) {
    l3d_algo forced = c->world->algo[op], best = valid[op][0];
    const char *why = "L3D_ALGO";
    double best_cost = 0;
    if (forced == L3D_ALGO_NATIVE && !native_ok) {
        l3d_log(c->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM,
                "%s: L3D_ALGO asks for native but transport %s has none; using the cost model",
                coll_names[op], c->world->tp.ops->name);
        forced = L3D_ALGO_AUTO;
    }
    if (forced == L3D_ALGO_RECDOUBLING && op == L3D_COLL_ALLGATHER && (c->size & (c->size - 1)))
        forced = L3D_ALGO_BRUCK;  // recursive doubling allgather needs a power of two
    if (forced != L3D_ALGO_AUTO) {
        best = forced;
    } else if (native_ok) {
        best = L3D_ALGO_NATIVE;
        why = "transport";
    } else {
        why = "cost model";
        best_cost = INFINITY;
        // Wire factor: partial sums of half types travel as float32.
        int reduces = op == L3D_COLL_ALLREDUCE || op == L3D_COLL_REDUCE ||
                      op == L3D_COLL_REDUCE_SCATTER;
        double wf = reduces ? (double)l3d_dtype_size(l3d_reduce_wire_type(dt)) /
                                  (double)l3d_dtype_size(dt)
                            : 1.0;
        for (int i = 0; i < 6 && valid[op][i] != L3D_ALGO_AUTO; i++) {
            if (valid[op][i] == L3D_ALGO_NATIVE) continue;
            double t = cost(c, op, valid[op][i], (double)bytes, wf);
            if (t < best_cost) {
                best_cost = t;
                best = valid[op][i];
            }
        }
    }
    if (l3d_log_enabled(c->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM))
        l3d_log(c->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM,
                "%s of %zu bytes on %d ranks: %s (%s, est. %.1f us)", coll_names[op], bytes,
                c->size, algo_names[best], why, best_cost * 1e6);
    return best;
}
