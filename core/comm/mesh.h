// The 3D process mesh: world rank <-> (dp, tp, pp) coordinates and the three groups.
// defines: l3d_mesh_t, l3d_mesh_check_world, l3d_mesh_create/destroy, l3d_mesh_order_parse,
// l3d_mesh_coords
//
// Rank order follows Megatron's `order` string: the dimensions listed fastest-varying first,
// default "tp-dp-pp" (tensor-parallel neighbours are adjacent ranks, so they share a node and
// its NVLink; pipeline stages are furthest apart and cross nodes). With order "tp-dp-pp":
//   rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// The groups are made once by l3d_comm_split: tp group = ranks differing only in tp_rank
// (ordered by tp_rank), likewise dp and pp.
#ifndef L3D_MESH_H
#define L3D_MESH_H

#include "core/l3d_core.h"
#include "llama3d/comm.h"

enum { L3D_MESH_TP = 0, L3D_MESH_DP = 1, L3D_MESH_PP = 2 };

typedef struct l3d_mesh {
    l3d_ctx_t *ctx;
    l3d_comm_t *world;  // not owned; NULL for a single-rank mesh
    int size[3];        // by L3D_MESH_*: tp, dp, pp
    int coord[3];       // this rank's tp_rank, dp_rank, pp_rank
    int perm[3];        // perm[0] is the fastest dimension (L3D_MESH_*)
    int rank;           // world rank
    l3d_comm_t *group[3];  // owned; NULL when that dimension has size 1
} l3d_mesh_t;

// Parses an order string naming tp, dp and pp once each, fastest first ("tp-dp-pp",
// "dp-tp-pp", ...; Megatron's "cp" and "ep" are accepted only as size-1 dimensions and
// skipped). Error: L3D_ERR_CONFIG naming the string and what is wrong.
l3d_status l3d_mesh_order_parse(l3d_ctx_t *ctx, const char *order, int perm[3]);
// Coordinates of world rank `rank` in a mesh of sizes size[3] (by L3D_MESH_*) and order perm.
void l3d_mesh_coords(int rank, const int size[3], const int perm[3], int coord[3]);
int l3d_mesh_rank_of(const int size[3], const int perm[3], const int coord[3]);

// Creates the mesh over `world` (NULL: a single rank) for dp x tp x pp ranks. The world size
// must equal dp * tp * pp: otherwise L3D_ERR_CONFIG showing the product and the world size.
// Collective over world.
// dp x tp x pp must be the world's size: else L3D_ERR_CONFIG showing the product and the
// world (l3d_mesh_create checks it; `l3d train --dry-run` under a launcher too).
l3d_status l3d_mesh_check_world(l3d_ctx_t *ctx, int dp, int tp, int pp, int nworld);
l3d_status l3d_mesh_create(l3d_ctx_t *ctx, l3d_comm_t *world, int dp, int tp, int pp,
                           const char *order, l3d_mesh_t **mesh_p);
// The device the groups' buffers live on (l3d_comm_set_device on each group).
l3d_status l3d_mesh_set_device(l3d_mesh_t *m, l3d_device_t *dev);
void l3d_mesh_destroy(l3d_mesh_t *m);

#endif
