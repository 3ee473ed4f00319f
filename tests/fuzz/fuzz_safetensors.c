// libFuzzer target: any byte string through the safetensors validator, then every tensor of
// an accepted file read back. Invariants checked beyond "no sanitizer report": accepted files
// read cleanly, lookups find what l3d_st_at lists, and nothing allocated stays allocated.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/l3d_core.h"
#include "core/checkpoint/safetensors.h"

static void quiet(l3d_log_level level, uint32_t subsys, const char *msg, void *user) {}

// One context for the whole run: harness state, not library state.
static l3d_ctx_t *fuzz_ctx(void) {
    static l3d_ctx_t *ctx;
    if (!ctx) {
        l3d_ctx_params_t p;
        l3d_ctx_params_default(&p);
        p.read_env = 0;
        p.log_fn = quiet;
        if (l3d_ctx_create(&p, &ctx) != L3D_OK) __builtin_trap();
    }
    return ctx;
}

static int is_float(l3d_st_dtype dt) {
    return dt == L3D_ST_F32 || dt == L3D_ST_F16 || dt == L3D_ST_BF16 || dt == L3D_ST_F64;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    l3d_ctx_t *ctx = fuzz_ctx();
    l3d_st_file_t *f = NULL;
    if (l3d_st_parse(ctx, data, size, "fuzz", &f) == L3D_OK) {
        for (size_t i = 0; i < l3d_st_count(f); i++) {
            const l3d_st_tensor_t *t = l3d_st_at(f, i);
            if (l3d_st_find(f, t->name) != t) __builtin_trap();
            if (t->begin > t->end || t->ndim < 0 || t->ndim > L3D_ST_MAX_DIMS) __builtin_trap();
            size_t count = 1;
            for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
            // The validator guarantees count * elem size == end - begin <= size.
            float *dst = malloc(count * sizeof(float) + 1);
            l3d_status st = l3d_st_read_f32(ctx, f, t->name, t->shape, t->ndim, dst);
            if (is_float(t->dtype) ? st != L3D_OK : st != L3D_ERR_FORMAT) __builtin_trap();
            // One dimension too many is always a shape mismatch.
            if (t->ndim < L3D_ST_MAX_DIMS) {
                int64_t shape[L3D_ST_MAX_DIMS + 1];
                memcpy(shape, t->shape, sizeof(t->shape));
                shape[t->ndim] = 1;
                if (l3d_st_read_f32(ctx, f, t->name, shape, t->ndim + 1, dst) != L3D_ERR_FORMAT)
                    __builtin_trap();
            }
            free(dst);
        }
        (void)l3d_st_metadata(f, "format");
        l3d_st_close(f);
    } else if (f != NULL) {
        __builtin_trap();
    }
    if (l3d_ctx_mem_in_use(ctx, NULL) != 0) __builtin_trap();
    return 0;
}
