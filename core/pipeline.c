// Pipeline schedules and their validation (see core/pipeline.h).
#include <string.h>

#include "core/pipeline.h"

int l3d_pp_schedule(l3d_pp_kind kind, int pp, int stage, int A, l3d_pp_op_t *ops) {
    int n = 0;
    if (kind == L3D_PP_GPIPE) {
        for (int j = 0; j < A; j++) ops[n++] = (l3d_pp_op_t){0, j};
        for (int j = 0; j < A; j++) ops[n++] = (l3d_pp_op_t){1, j};
        return n;
    }
    int w = L3D_MIN(pp - stage - 1, A);
    for (int j = 0; j < w; j++) ops[n++] = (l3d_pp_op_t){0, j};
    for (int i = 0; i < A - w; i++) {
        ops[n++] = (l3d_pp_op_t){0, w + i};
        ops[n++] = (l3d_pp_op_t){1, i};
    }
    for (int j = A - w; j < A; j++) ops[n++] = (l3d_pp_op_t){1, j};
    return n;
}

int l3d_pp_slots(l3d_pp_kind kind, int pp, int stage, int A) {
    if (kind == L3D_PP_GPIPE) return A;
    return L3D_MIN(pp - stage, A);
}

l3d_status l3d_pp_kind_parse(l3d_ctx_t *ctx, const char *name, l3d_pp_kind *kind) {
    if (!name || !name[0] || !strcmp(name, "1f1b")) *kind = L3D_PP_1F1B;
    else if (!strcmp(name, "gpipe")) *kind = L3D_PP_GPIPE;
    else
        return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.schedule '%s': must be 1f1b or gpipe "
                         "(interleaved 1F1B is not built yet)", name);
    return L3D_OK;
}

// Simulation: fwd_sent[s][j] / bwd_sent[s][j] say stage s has sent micro-batch j's activation
// (to s+1) / gradient (to s-1). A stage advances while its next op's input has arrived.
l3d_status l3d_pp_validate(l3d_ctx_t *ctx, l3d_pp_kind kind, int pp, int A) {
    if (pp < 1 || A < 1 || pp > 4096 || A > (1 << 20))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "pipeline validation: pp %d, A %d", pp, A);
    size_t P = (size_t)pp, M = (size_t)A;
    size_t bytes = P * 2 * M * sizeof(l3d_pp_op_t) + 4 * P * sizeof(int) + 2 * P * M;
    char *mem = l3d_calloc(ctx, 1, bytes, "other");
    if (!mem) return L3D_ERR_NOMEM;
    l3d_pp_op_t *ops = (l3d_pp_op_t *)mem;
    int *nops = (int *)(ops + P * 2 * M), *pc = nops + P, *live = pc + P, *maxlive = live + P;
    unsigned char *fsent = (unsigned char *)(maxlive + P), *bsent = fsent + P * M;
    for (int s = 0; s < pp; s++) nops[s] = l3d_pp_schedule(kind, pp, s, A, ops + (size_t)s * 2 * M);
    for (int moved = 1; moved;) {
        moved = 0;
        for (int s = 0; s < pp; s++) {
            while (pc[s] < nops[s]) {
                l3d_pp_op_t o = ops[(size_t)s * 2 * M + (size_t)pc[s]];
                size_t j = (size_t)o.micro;
                if (!o.backward && s > 0 && !fsent[(size_t)(s - 1) * M + j]) break;
                if (o.backward && s < pp - 1 && !bsent[(size_t)(s + 1) * M + j]) break;
                if (!o.backward) {
                    fsent[(size_t)s * M + j] = 1;
                    live[s]++;
                    if (live[s] > maxlive[s]) maxlive[s] = live[s];
                } else {
                    bsent[(size_t)s * M + j] = 1;
                    live[s]--;
                }
                pc[s]++;
                moved = 1;
            }
        }
    }
    l3d_status st = L3D_OK;
    for (int s = 0; s < pp && st >= 0; s++) {
        if (pc[s] < nops[s])
            st = l3d_error(ctx, L3D_ERR_INTERNAL, "pipeline schedule (pp %d, %d micro-batches) "
                           "deadlocks: stage %d stops at op %d of %d", pp, A, s, pc[s], nops[s]);
        else if (maxlive[s] > l3d_pp_slots(kind, pp, s, A))
            st = l3d_error(ctx, L3D_ERR_INTERNAL, "pipeline schedule (pp %d, %d micro-batches): "
                           "stage %d holds %d activation sets, more than its %d", pp, A, s,
                           maxlive[s], l3d_pp_slots(kind, pp, s, A));
    }
    l3d_free(ctx, mem, bytes, "other");
    return st;
}
