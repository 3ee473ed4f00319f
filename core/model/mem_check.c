// Refusing an allocation the machine cannot give, before making it: with overcommit a huge
// malloc succeeds and the OOM killer ends the process while the memory is being filled (a
// checkpoint whose config.json claimed 10,000 layers was killed inside a 3 GiB cgroup).
#include <stdio.h>

#include "core/l3d_core.h"
#include "core/model/model_internal.h"
#include "platform/mem.h"

static void human(char *out, size_t cap, uint64_t b) {
    if (b >= ((uint64_t)1 << 30)) snprintf(out, cap, "%.1f GiB", (double)b / (1 << 30));
    else snprintf(out, cap, "%.1f MiB", (double)b / (1 << 20));
}

l3d_status l3d_mem_check_with(l3d_ctx_t *ctx, uint64_t need, uint64_t avail, const char *src,
                              const char *what) {
    if (need <= avail) return L3D_OK;
    char n[32], a[32];
    human(n, sizeof(n), need);
    human(a, sizeof(a), avail);
    return l3d_error(ctx, L3D_ERR_CONFIG, "%s needs %s but only %s is available (%s); nothing "
                     "was allocated", what, n, a, src);
}

l3d_status l3d_mem_check(l3d_ctx_t *ctx, uint64_t need, const char *what) {
    uint64_t avail;
    const char *src = NULL;
    uint64_t limit = l3d_ctx_settings(ctx)->mem_limit;
    if (l3d_mem_available(&avail, &src)) {
        if (!limit) return L3D_OK;  // not Linux and no L3D_MEM_LIMIT: nothing to compare with
        avail = UINT64_MAX;
    }
    if (limit && limit < avail) {
        avail = limit;
        src = "L3D_MEM_LIMIT";
    }
    return l3d_mem_check_with(ctx, need, avail, src, what);
}
