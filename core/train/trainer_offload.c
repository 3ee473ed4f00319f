// ZeRO offload (DeepSpeed's ZeRO-Offload and ZeRO-3 parameter offload), through the device
// vtable only: host memory from alloc_host (pinned with pin_memory), copies H2D/D2H, and the
// AdamW step on a CPU device of this rank's own (host threads), so that it is the same code on
// a GPU device and measurable on the CPU device, where the memory report tells the two apart.
//
// offload_optimizer: exp_avg and exp_avg_sq (this rank's shard) live in host memory with an
// fp32 master copy of this rank's parameter pieces and a host copy of its gradient pieces.
// Each step the reduced gradient pieces go D2H, AdamW updates the master on the host device,
// and the updated pieces go H2D into the device's parameters (ZeRO-1/2: into the whole
// parameters, then all-gathered as without offload; ZeRO-3: into the parameter shard;
// ZeRO-1/2 under 16-bit weights: rounded on the host, then gathered, trainer_master.c).
// offload_param (ZeRO-3, with offload_optimizer): the parameter shard itself lives in host
// memory and is the master; each gather copies this rank's piece H2D first. ZeRO-3 under
// 16-bit weights with offload_optimizer alone keeps its float32 shard there as the master
// too, and only the rounded copy on the device (trainer_zero3.c).
//
// Every host array has the optimizer shard's layout (l3d_dp_piece: piece k at shard offset
// sh), so the update is the device one with other pointers.
#include <string.h>

#include "core/train/trainer_internal.h"

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

// The device array holding piece k's parameters, at arena float lo of it.
static float *device_piece(l3d_trainer_t *t, size_t lo, size_t sh) {
    if (t->dp.zero3) return l3d_zero3_piece_at(t, sh);
    return t->model->params + lo;
}

// Whether the only float32 master is in host memory while the device keeps 16-bit parameters
// made from it (o->stage16): ZeRO-1/2's sharded master, ZeRO-3's shard without offload_param.
static int rounds_on_host(const l3d_train_config_t *cfg, int zero3, int master16) {
    if (!cfg->offload_optimizer) return 0;
    return master16 || (zero3 && l3d_zero3_shard_on_host(cfg) && !cfg->offload_param);
}

l3d_status l3d_offload_init(l3d_trainer_t *t) {
    l3d_offload_t *o = &t->off;
    const l3d_train_config_t *cfg = &t->cfg;
    o->optim = cfg->offload_optimizer;
    // (ZeRO-3 keeps its float32 shard in host memory with offload_param, and under 16-bit
    // weights with the optimizer alone: that shard is the master)
    o->param = t->dp.zero3 && l3d_zero3_shard_on_host(cfg);
    if (!o->optim) return L3D_OK;
    // The host's AdamW runs on threads of its own: a CPU device beside the training device.
    int threads = t->dev->num_threads > 0 ? t->dev->num_threads : 1;
    l3d_device_params_t hp = {.num_threads = threads, .device_index = 0};
    L3D_CHECK(t->ctx, l3d_device_create(t->ctx, "cpu", &hp, &o->hdev));
    size_t bytes = t->dp.shard_len * sizeof(float);
    int pin = cfg->offload_optimizer_pin;
    if (t->dp.zero2) {  // ZeRO-2/3 accumulate the gradient shard in host memory already
        o->grad = t->dp.gshard;
    } else {
        L3D_CHECK(t->ctx, l3d_dev_alloc_host(t->dev, bytes, pin, "host_grads",
                                             (void **)&o->grad));
        L3D_CHECK(t->ctx, l3d_dev_memset(o->hdev, o->grad, 0, bytes));
    }
    if (!o->param) {
        L3D_CHECK(t->ctx, l3d_dev_alloc_host(t->dev, bytes, pin, "host_params",
                                             (void **)&o->master));
        L3D_CHECK(t->ctx, l3d_dev_memset(o->hdev, o->master, 0, bytes));
    }
    if (rounds_on_host(cfg, t->dp.zero3, t->dp.master16))
        L3D_CHECK(t->ctx, l3d_dev_alloc_host(t->dev, t->dp.shard_len * l3d_dtype_size(t->model->wt),
                                             pin, "host_params", &o->stage16));
    return l3d_offload_pull(t);
}

l3d_status l3d_offload_round(l3d_trainer_t *t, size_t sh, size_t n, void *dst) {
    l3d_offload_t *o = &t->off;
    l3d_dtype wt = t->model->wt;
    void *h = l3d_elem(o->stage16, wt, sh);
    L3D_CHECK(t->ctx, l3d_dev_convert(o->hdev, h, wt, l3d_offload_master(t) + sh, L3D_FLOAT32,
                                      n));
    L3D_CHECK(t->ctx, l3d_dev_sync(o->hdev));
    L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, dst, h, n * l3d_dtype_size(wt), L3D_COPY_H2D));
    return l3d_dev_sync(t->dev);
}

void l3d_offload_fini(l3d_trainer_t *t) {
    l3d_offload_t *o = &t->off;
    size_t bytes = t->dp.shard_len * sizeof(float);
    l3d_dev_free_host(t->dev, o->master, bytes, t->cfg.offload_optimizer_pin, "host_params");
    if (o->stage16)
        l3d_dev_free_host(t->dev, o->stage16, t->dp.shard_len * l3d_dtype_size(t->model->wt),
                          t->cfg.offload_optimizer_pin, "host_params");
    o->stage16 = NULL;
    if (!t->dp.zero2)
        l3d_dev_free_host(t->dev, o->grad, bytes, t->cfg.offload_optimizer_pin, "host_grads");
    o->master = o->grad = NULL;
    l3d_device_destroy(o->hdev);
    o->hdev = NULL;
}

float *l3d_offload_master(l3d_trainer_t *t) {
    return t->off.param ? l3d_zero3_piece_at(t, 0) : t->off.master;
}

l3d_status l3d_offload_pull(l3d_trainer_t *t) {
    l3d_offload_t *o = &t->off;
    if (!o->optim || o->param) return L3D_OK;  // (a host parameter shard is the master)
    // (ZeRO-1/2's sharded master: l3d_dp_params_part wrote it with the pieces)
    if (t->dp.master16 && !t->model->params) return L3D_OK;
    for (int k = 0; k < l3d_dp_pieces(t); k++) {
        size_t lo, hi, sh;
        l3d_dp_piece(t, k, &lo, &hi, &sh);
        if (hi > lo)
            L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, o->master + sh, device_piece(t, lo, sh),
                                           (hi - lo) * sizeof(float), L3D_COPY_D2H));
    }
    return l3d_dev_sync(t->dev);
}

l3d_status l3d_offload_grads_to_host(l3d_trainer_t *t) {
    l3d_offload_t *o = &t->off;
    const l3d_dp_t *d = &t->dp;
    if (d->zero2) return L3D_OK;  // the shard is in host memory (trainer_zero2.c)
    for (int k = 0; k < l3d_dp_pieces(t); k++) {
        size_t lo, hi, sh;
        l3d_dp_piece(t, k, &lo, &hi, &sh);
        // (in the arena's dtype: a 16-bit gradient's pieces fill part of the host floats)
        size_t es = l3d_dtype_size(d->gt);
        if (hi > lo)
            L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, l3d_elem(o->grad, d->gt, sh),
                                           l3d_elem(t->grads, d->gt, lo), (hi - lo) * es,
                                           L3D_COPY_D2H));
    }
    return l3d_dev_sync(t->dev);
}

l3d_status l3d_offload_params_to_device(l3d_trainer_t *t) {
    l3d_offload_t *o = &t->off;
    // the gathers copy the host shard's pieces themselves (ZeRO-3), or round them (ZeRO-1/2's
    // sharded master, l3d_master_piece16)
    if (o->param || t->dp.master16) return L3D_OK;
    for (int k = 0; k < l3d_dp_pieces(t); k++) {
        size_t lo, hi, sh;
        l3d_dp_piece(t, k, &lo, &hi, &sh);
        if (hi > lo)
            L3D_CHECK(t->ctx, l3d_dev_copy(t->dev, device_piece(t, lo, sh), o->master + sh,
                                           (hi - lo) * sizeof(float), L3D_COPY_H2D));
    }
    return l3d_dev_sync(t->dev);
}

void l3d_offload_memory(const l3d_train_config_t *cfg, int zero2, int zero3, int master16,
                        size_t shard_len, size_t stage_len, l3d_mem_breakdown_t *mem) {
    size_t shard = shard_len * sizeof(float);
    mem->host_params = mem->host_grads = mem->host_optim = 0;
    if (!cfg->offload_optimizer) return;
    mem->host_optim = mem->optim;
    mem->optim = 0;
    mem->host_grads = shard;
    if (zero2) {  // the gradient shard itself moves, plus the staging of one piece
        mem->grads -= min_sz(mem->grads, shard);
        mem->host_grads += stage_len * sizeof(float);
    }
    // The master (ZeRO-3: the float32 shard moves to the host when it is the master), and a
    // 16-bit copy of the shard: ZeRO-3's with offload_param (it moves too), or stage16.
    size_t ew = l3d_dtype_size(l3d_train_config_weight_dtype(cfg));
    size_t copy = ew < sizeof(float) ? shard_len * ew : 0;
    mem->host_params = shard;
    if (zero3 && l3d_zero3_shard_on_host(cfg))
        mem->params -= min_sz(mem->params, shard + (cfg->offload_param ? copy : 0));
    if ((zero3 && cfg->offload_param) || rounds_on_host(cfg, zero3, master16))
        mem->host_params += copy;
}
