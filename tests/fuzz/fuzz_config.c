// libFuzzer target: any byte string as a ds_config.json (on top of the defaults) and as a
// Hugging Face config.json. The texts are not NUL-terminated, so a parser that reads past
// `len` is caught by ASan. Nothing allocated through the context may stay allocated.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/l3d_core.h"
#include "llama3d/config.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    l3d_ctx_t *ctx = fuzz_ctx();
    // An exact-size copy: libFuzzer's buffer is exact too, this only drops the const.
    char *text = malloc(size ? size : 1);
    if (size) memcpy(text, data, size);

    l3d_train_config_t *tc = malloc(sizeof(*tc));
    l3d_train_config_default(ctx, tc);
    if (l3d_train_config_from_json(ctx, text, size, "fuzz", tc) == L3D_OK) {
        (void)l3d_train_config_finalize(ctx, tc);
        for (int s = 0; s < 3; s++) (void)l3d_train_config_lr(tc, s * 1000);
    }
    free(tc);

    l3d_model_config_t mc;
    memset(&mc, 0, sizeof(mc));
    if (l3d_model_config_from_json(ctx, text, size, "fuzz", &mc) == L3D_OK &&
        l3d_model_config_validate(ctx, &mc) == L3D_OK) {
        char *json = NULL;
        if (l3d_model_config_to_json(ctx, &mc, &json) == L3D_OK) {
            // What we write must read back.
            l3d_model_config_t again;
            memset(&again, 0, sizeof(again));
            if (l3d_model_config_from_json(ctx, json, strlen(json), "again", &again) != L3D_OK)
                __builtin_trap();
        }
        free(json);
    }
    free(text);
    if (l3d_ctx_mem_in_use(ctx, NULL) != 0) __builtin_trap();
    return 0;
}
