// The transport registry: looks a name up in the CMake-generated table of built transports.
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"
#include "transports/transport.h"

l3d_status l3d_transport_find(l3d_ctx_t *ctx, const char *name,
                              const l3d_transport_ops_t **ops_p) {
    const l3d_transport_ops_t *ops = NULL;
    char built[128] = "";
    size_t o = 0;
    for (int i = 0; l3d_transport_backends[i]; i++) {
        if (name && !strcmp(l3d_transport_backends[i]->name, name)) ops = l3d_transport_backends[i];
        o += (size_t)snprintf(built + o, sizeof(built) - o, "%s%s", i ? ", " : "",
                              l3d_transport_backends[i]->name);
        if (o >= sizeof(built)) o = sizeof(built) - 1;
    }
    if (!ops)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "transport '%s' is not built in (built: %s)",
                         name ? name : "(null)", built);
    // Required entries are checked here, once, so core never tests them again (STYLE.md 4).
    if (ops->abi_version != L3D_TRANSPORT_ABI_VERSION || ops->size != sizeof(l3d_transport_ops_t))
        return l3d_error(ctx, L3D_ERR_INTERNAL,
                         "transport '%s' has abi %u size %u, expected %u %zu", name,
                         ops->abi_version, ops->size, L3D_TRANSPORT_ABI_VERSION,
                         sizeof(l3d_transport_ops_t));
    if (!ops->init || !ops->fini || !ops->caps || !ops->addr_get || !ops->connect || !ops->isend ||
        !ops->irecv || !ops->test || !ops->progress || !ops->cancel || !ops->abort ||
        !ops->strerror)
        return l3d_error(ctx, L3D_ERR_INTERNAL, "transport '%s' lacks a required entry", name);
    *ops_p = ops;
    return L3D_OK;
}
