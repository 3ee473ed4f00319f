// The 3D process mesh (see core/comm/mesh.h).
#include <stdio.h>
#include <string.h>

#include "core/comm/mesh.h"

static const char *dim_name[3] = {"tp", "dp", "pp"};

l3d_status l3d_mesh_order_parse(l3d_ctx_t *ctx, const char *order, int perm[3]) {
    int seen[3] = {0, 0, 0}, n = 0;
    const char *s = order && order[0] ? order : "tp-dp-pp";
    for (const char *p = s; *p;) {
        const char *e = strchr(p, '-');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int d = -1;
        for (int i = 0; i < 3; i++)
            if (len == 2 && !strncmp(p, dim_name[i], 2)) d = i;
        if (d < 0 && !(len == 2 && (!strncmp(p, "cp", 2) || !strncmp(p, "ep", 2))))
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "parallel.order '%s': '%.*s' is not one of tp, dp, pp (cp, ep)", s,
                             (int)len, p);
        if (d >= 0) {
            if (seen[d])
                return l3d_error(ctx, L3D_ERR_CONFIG, "parallel.order '%s': %s appears twice", s,
                                 dim_name[d]);
            seen[d] = 1;
            perm[n++] = d;
        }
        p += len;
        if (*p == '-') p++;
    }
    if (n != 3)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "parallel.order '%s': must name tp, dp and pp (fastest first, e.g. "
                         "tp-dp-pp)", s);
    return L3D_OK;
}

void l3d_mesh_coords(int rank, const int size[3], const int perm[3], int coord[3]) {
    for (int i = 0; i < 3; i++) {
        int d = perm[i];
        coord[d] = rank % size[d];
        rank /= size[d];
    }
}

int l3d_mesh_rank_of(const int size[3], const int perm[3], const int coord[3]) {
    int r = 0;
    for (int i = 2; i >= 0; i--) r = r * size[perm[i]] + coord[perm[i]];
    return r;
}

l3d_status l3d_mesh_set_device(l3d_mesh_t *m, l3d_device_t *dev) {
    for (int d = 0; d < 3; d++)
        if (m->group[d]) L3D_CHECK(m->ctx, l3d_comm_set_device(m->group[d], dev));
    return L3D_OK;
}

void l3d_mesh_destroy(l3d_mesh_t *m) {
    if (!m) return;
    for (int d = 0; d < 3; d++) l3d_comm_destroy(m->group[d]);
    l3d_free(m->ctx, m, sizeof(*m), "other");
}

l3d_status l3d_mesh_check_world(l3d_ctx_t *ctx, int dp, int tp, int pp, int nworld) {
    if (dp < 1 || tp < 1 || pp < 1 || (long long)dp * tp * pp != nworld)
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "parallel: dp %d x tp %d x pp %d = %lld ranks, but the world has %d; "
                         "launch %lld ranks or change parallel.{dp,tp,pp}",
                         dp, tp, pp, (long long)dp * tp * pp, nworld, (long long)dp * tp * pp);
    return L3D_OK;
}

l3d_status l3d_mesh_create(l3d_ctx_t *ctx, l3d_comm_t *world, int dp, int tp, int pp,
                           const char *order, l3d_mesh_t **mesh_p) {
    int perm[3];
    L3D_CHECK(ctx, l3d_mesh_order_parse(ctx, order, perm));
    L3D_CHECK(ctx, l3d_mesh_check_world(ctx, dp, tp, pp, world ? l3d_comm_size(world) : 1));
    l3d_mesh_t *m = l3d_calloc(ctx, 1, sizeof(*m), "other");
    if (!m) return L3D_ERR_NOMEM;
    m->ctx = ctx;
    m->world = world;
    m->size[L3D_MESH_TP] = tp;
    m->size[L3D_MESH_DP] = dp;
    m->size[L3D_MESH_PP] = pp;
    memcpy(m->perm, perm, sizeof(perm));
    m->rank = world ? l3d_comm_rank(world) : 0;
    l3d_mesh_coords(m->rank, m->size, perm, m->coord);
    // One split per dimension, in a fixed order on every rank (splits are collective). The
    // color is the rank with this dimension's coordinate zeroed: equal for exactly the ranks
    // that differ only along it; the key orders the group by that coordinate.
    for (int d = 0; d < 3 && world; d++) {
        if (m->size[d] == 1) continue;
        int c[3] = {m->coord[0], m->coord[1], m->coord[2]};
        c[d] = 0;
        l3d_status st = l3d_comm_split(world, l3d_mesh_rank_of(m->size, perm, c), m->coord[d],
                                       &m->group[d]);
        if (st < 0) {
            l3d_mesh_destroy(m);
            return l3d_error(ctx, st, "parallel: creating the %s group failed: %s", dim_name[d],
                             l3d_ctx_last_error(ctx));
        }
    }
    *mesh_p = m;
    return L3D_OK;
}
