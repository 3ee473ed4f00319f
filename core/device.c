// The device registry: looks a name up in the CMake-generated table of built devices.
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"
#include "devices/device.h"

l3d_status l3d_device_create(l3d_ctx_t *ctx, const char *name, const l3d_device_params_t *params,
                             l3d_device_t **dev_p) {
    if (!ctx || !dev_p)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_device_create: NULL %s",
                         !ctx ? "ctx" : "dev_p");
    if (!name) name = "cpu";
    if (params && (params->num_threads < 0 || params->device_index < 0))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_device_create: num_threads %d and "
                         "device_index %d must be >= 0", params->num_threads,
                         params->device_index);
    const l3d_device_ops_t *ops = NULL;
    char built[128] = "";
    size_t o = 0;
    for (int i = 0; l3d_device_backends[i]; i++) {
        if (!strcmp(l3d_device_backends[i]->name, name)) ops = l3d_device_backends[i];
        o += (size_t)snprintf(built + o, sizeof(built) - o, "%s%s", i ? ", " : "",
                              l3d_device_backends[i]->name);
        if (o >= sizeof(built)) o = sizeof(built) - 1;
    }
    if (!ops)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "device '%s' is not built in (built: %s)", name,
                         built);
    if (ops->abi_version != L3D_DEVICE_ABI_VERSION || ops->size != sizeof(l3d_device_ops_t))
        return l3d_error(ctx, L3D_ERR_INTERNAL, "device '%s' has abi %u size %u, expected %u %zu",
                         name, ops->abi_version, ops->size, L3D_DEVICE_ABI_VERSION,
                         sizeof(l3d_device_ops_t));
    l3d_device_t *dev = l3d_calloc(ctx, 1, sizeof(*dev), "other");
    if (!dev) return L3D_ERR_NOMEM;
    dev->ops = ops;
    dev->ctx = ctx;
    l3d_device_params_t defaults = {0, 0, 0};
    l3d_status st = ops->init(dev, params ? params : &defaults);
    if (st < 0) {
        l3d_free(ctx, dev, sizeof(*dev), "other");
        return st;
    }
    int nev = !!ops->event_create + !!ops->event_destroy + !!ops->event_record +
              !!ops->stream_wait_event;
    if (nev % 4 || !ops->sum_f64) {
        ops->fini(dev);
        l3d_free(ctx, dev, sizeof(*dev), "other");
        return l3d_error(ctx, L3D_ERR_INTERNAL, "device '%s' has %s (devices/device.h)", name,
                         nev % 4 ? "some of the four event entries but not all"
                                 : "no sum_f64");
    }
    if (!ops->is_host(dev) && !ops->is_device_ptr) {  // the communicator could not stage
        ops->fini(dev);
        l3d_free(ctx, dev, sizeof(*dev), "other");
        return l3d_error(ctx, L3D_ERR_INTERNAL, "device '%s' keeps memory the host cannot read "
                         "but has no is_device_ptr (devices/device.h)", name);
    }
    l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_DEV, "device %s with %d threads", name, dev->num_threads);
    *dev_p = dev;
    return L3D_OK;
}

void l3d_device_destroy(l3d_device_t *dev) {
    if (!dev) return;
    for (int i = 0; i < L3D_DEVICE_BOUNCE; i++)
        if (dev->bounce[i].p)
            l3d_dev_free_host(dev, dev->bounce[i].p, dev->bounce[i].n, 1, "comm");
    l3d_dev_event_destroy(dev, dev->comm_ready);
    l3d_dev_stream_destroy(dev, dev->comm_stream);
    dev->ops->fini(dev);
    l3d_free(dev->ctx, dev, sizeof(*dev), "other");
}

// Chunk k (of c elements, the last maybe shorter) of n converted where it lies.
static l3d_status convert_chunk(l3d_device_t *dev, char *b, l3d_dtype dst_t, l3d_dtype src_t,
                                size_t n, size_t c, size_t k) {
    size_t ds = l3d_dtype_size(dst_t), ss = l3d_dtype_size(src_t);
    return l3d_dev_convert(dev, b + k * c * ds, dst_t, b + k * c * ss, src_t,
                           L3D_MIN(c, n - k * c));
}

// Front to back when narrowing (chunk k's output lies in the input of chunks < k), back to
// front when widening (in that of chunks > k); the first chunk, whose output overlaps its own
// input, goes through the scratch.
l3d_status l3d_dev_convert_in_place(l3d_device_t *dev, void *p, l3d_dtype dst_t,
                                    l3d_dtype src_t, size_t n, void *scratch, size_t chunk) {
    size_t ds = l3d_dtype_size(dst_t), ss = l3d_dtype_size(src_t), c = chunk;
    if (!n || dst_t == src_t) return L3D_OK;
    if (!c || !scratch || ds == ss)
        return l3d_error(dev->ctx, L3D_ERR_INVALID_ARG, "convert in place: %s to %s with a "
                         "scratch of %zu", l3d_dtype_name(src_t), l3d_dtype_name(dst_t), c);
    size_t nk = (n + c - 1) / c, c0 = L3D_MIN(n, c);
    char *b = p;
    if (ds < ss) {
        L3D_CHECK(dev->ctx, l3d_dev_convert(dev, scratch, dst_t, b, src_t, c0));
        for (size_t k = 1; k < nk; k++)
            L3D_CHECK(dev->ctx, convert_chunk(dev, b, dst_t, src_t, n, c, k));
        return l3d_dev_copy(dev, b, scratch, c0 * ds, L3D_COPY_D2D);
    }
    for (size_t k = nk; k-- > 1;)
        L3D_CHECK(dev->ctx, convert_chunk(dev, b, dst_t, src_t, n, c, k));
    L3D_CHECK(dev->ctx, l3d_dev_copy(dev, scratch, b, c0 * ss, L3D_COPY_D2D));
    return l3d_dev_convert(dev, b, dst_t, scratch, src_t, c0);
}

const char *l3d_device_name(const l3d_device_t *dev) { return dev ? dev->ops->name : "(none)"; }
int l3d_device_threads(const l3d_device_t *dev) { return dev ? dev->num_threads : 0; }
