// The configuration tests' shared fixture: a ctx per test (suite "config"), and the one-line
// parsers of Hugging Face and DeepSpeed JSON text they call.
#ifndef L3D_TEST_HARNESS_CONFIG_ENV_H
#define L3D_TEST_HARNESS_CONFIG_ENV_H

#include <criterion/criterion.h>
#include <string.h>

#include "llama3d/config.h"
#include "llama3d/ctx.h"

static l3d_ctx_t *ctx;

static inline void setup(void) { cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK); }
static inline void teardown(void) { l3d_ctx_destroy(ctx); }

static inline const char *err(void) { return l3d_ctx_last_error(ctx); }

static inline l3d_status hf(const char *text, l3d_model_config_t *m) {
    return l3d_model_config_from_json(ctx, text, strlen(text), "t.json", m);
}

static inline l3d_status ds(const char *text, l3d_train_config_t *c) {
    return l3d_train_config_from_json(ctx, text, strlen(text), "ds.json", c);
}

static inline l3d_status ds_fresh(const char *text, l3d_train_config_t *c) {
    l3d_train_config_default(ctx, c);
    return ds(text, c);
}

// A file, then the checks that wait for the flags and the world (the batch identity).
static inline l3d_status ds_final(const char *text, l3d_train_config_t *c) {
    l3d_status st = ds_fresh(text, c);
    return st < 0 ? st : l3d_train_config_finalize(ctx, c);
}

#define ASSERT_ERR_HAS(st, want, needle)                                                      \
    do {                                                                                      \
        l3d_status st_ = (st);                                                                \
        cr_assert_eq(st_, (want), "status %d, detail: %s", (int)st_, err());                  \
        cr_assert(strstr(err(), (needle)) != NULL, "'%s' not in: %s", (needle), err());       \
    } while (0)

static inline int has_note(const l3d_train_config_t *c, const char *needle) {
    for (int i = 0; i < c->n_notes; i++)
        if (strstr(c->notes[i], needle)) return 1;
    return 0;
}

#endif
