// ZeRO-1/2 with 16-bit weights (bf16 or fp16) and dp > 1: the float32 master is sharded as the
// optimizer state is. DeepSpeed's ZeRO-1/2 partition their fp32 parameter groups and Megatron's
// distributed optimizer its main parameters; the whole parameters a rank keeps are the 16-bit
// ones its passes read (m->wp), and m->params is freed.
//
// Rank r keeps its pieces (l3d_dp_piece: piece k at shard offset sh) in `master`, shard_len
// floats on the device, or, with offload_optimizer, the offloaded master in host memory and
// nothing float32 on the device. AdamW updates them in place; then each rank rounds its pieces
// to the weights' dtype and all-gathers them into m->wp (through the gradient arena at ZeRO-1,
// trainer_dp.c, the windows at ZeRO-2, trainer_zero2.c, both free after the update): 2 bytes
// an element where ZeRO-1/2 gathered the float32 pieces, and m->wp is bit for bit what
// rounding the whole updated master gave. Offloaded, the host rounds its pieces and copies
// them in (l3d_offload_round).
//
//   parameter memory per rank: P x 2 + (P/dp) x 4 bytes (no offload) or P x 2 (offload),
//   instead of P x (4 + 2)
//
// A checkpoint save or resume has the whole float32 parameters again for its duration
// (l3d_dp_params_whole, collective over dp) and puts them back (l3d_dp_params_part), as
// ZeRO-3 does.
// defines: l3d_master16, l3d_master_init, l3d_master_fini, l3d_master_at,
//          l3d_master_piece16, l3d_dp_master_whole, l3d_dp_params_whole,
//          l3d_dp_params_part
#include "core/train/trainer_internal.h"

int l3d_master16(const l3d_train_config_t *cfg, int dp) {
    return dp > 1 && cfg->zero_stage >= 1 && cfg->zero_stage < 3 &&
           l3d_dtype_size(l3d_train_config_weight_dtype(cfg)) < sizeof(float);
}

float *l3d_master_at(l3d_trainer_t *t, size_t sh) {
    return (t->off.optim ? t->off.master : t->dp.master) + sh;
}

// This rank's pieces out of the whole parameters into the master (device or host), the 16-bit
// copy refreshed from them, m->params freed.
static l3d_status partition(l3d_trainer_t *t) {
    l3d_model_t *m = t->model;
    L3D_CHECK(t->ctx, l3d_model_refresh_weights(m));
    for (int k = 0; k < l3d_dp_pieces(t); k++) {
        size_t lo, hi, sh;
        l3d_dp_piece(t, k, &lo, &hi, &sh);
        if (hi > lo)
            L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, l3d_master_at(t, sh), m->params + lo,
                                           (hi - lo) * sizeof(float),
                                           t->off.optim ? L3D_COPY_D2H : L3D_COPY_D2D));
    }
    L3D_CHECK(t->ctx, l3d_dev_sync(t->dev));
    l3d_dev_free(t->dev, m->params, m->n_params * sizeof(float), "params");
    m->params = NULL;
    return L3D_OK;
}

l3d_status l3d_master_init(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    if (!d->master16) return L3D_OK;
    size_t n = d->shard_len;
    if (!t->off.optim) {  // (else the host master, offload_init's, zeroed)
        // zeroed: a piece past the parameters' end is padding that every gather sends
        L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, n * sizeof(float), "params", (void **)&d->master));
        L3D_CHECK(t->ctx, l3d_dev_memset(t->dev, d->master, 0, n * sizeof(float)));
    }
    return partition(t);
}

void l3d_master_fini(l3d_trainer_t *t) {
    l3d_dp_t *d = &t->dp;
    if (d->master) l3d_dev_free(t->dev, d->master, d->shard_len * sizeof(float), "params");
    d->master = NULL;
}

l3d_status l3d_master_piece16(l3d_trainer_t *t, int k, void *dst) {
    l3d_dp_t *d = &t->dp;
    const l3d_dp_bucket_t *b = &d->b[k];
    l3d_dtype wt = t->model->wt;
    if (t->off.optim) return l3d_offload_round(t, b->sh, b->q, dst);
    return l3d_dev_convert(t->dev, dst, wt, d->master + b->sh, L3D_FLOAT32, b->q);
}

// ---- whole again, for checkpoints ---------------------------------------------------------
l3d_status l3d_dp_master_whole(l3d_trainer_t *t, const float *shard) {
    l3d_dp_t *d = &t->dp;
    l3d_model_t *m = t->model;
    float *full = NULL;
    size_t fbytes = d->Ppad * sizeof(float);
    // (into a padded arena first: the last bucket's padding runs past the parameters)
    L3D_CHECK(t->ctx, l3d_dev_alloc(t->dev, fbytes, "params", (void **)&full));
    l3d_status st = l3d_dp_optim_gather(t, shard, full);
    if (st >= 0)
        st = l3d_dev_alloc(t->dev, m->n_params * sizeof(float), "params", (void **)&m->params);
    if (st >= 0)
        st = l3d_dev_copy(t->dev, m->params, full, m->n_params * sizeof(float), L3D_COPY_D2D);
    if (st >= 0) st = l3d_dev_sync(t->dev);
    l3d_dev_free(t->dev, full, fbytes, "params");
    if (st < 0 && m->params) {
        l3d_dev_free(t->dev, m->params, m->n_params * sizeof(float), "params");
        m->params = NULL;
    }
    return st;
}

l3d_status l3d_dp_params_whole(l3d_trainer_t *t) {
    if (t->dp.zero3) return l3d_zero3_materialize(t);
    if (!t->dp.master16 || t->model->params) return L3D_OK;
    return l3d_dp_master_whole(t, l3d_master_at(t, 0));
}

l3d_status l3d_dp_params_part(l3d_trainer_t *t) {
    if (t->dp.zero3) return l3d_zero3_partition(t);
    if (!t->dp.master16 || !t->model->params) return L3D_OK;
    return partition(t);
}
