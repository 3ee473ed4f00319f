// What a checkpoint directory says about generating text, shared by l3d generate and l3d serve:
// its tokenizer, the ids that end generation and generation_config.json's sampling defaults.
// defines: l3d_cli_open_tokenizer, l3d_cli_gen_defaults, l3d_cli_stops_has,
//          l3d_cli_weights_dtype (--dtype: what the weights are kept in)
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

// --tokenizer, else the directory's tokenizer.json / tokenizer.model, else the byte tokenizer
// (what llama3d's own models are trained on); one with more ids than the model is refused.
l3d_status l3d_cli_open_tokenizer(l3d_ctx_t *ctx, const char *ckpt, const char *tokenizer,
                                  int vocab, l3d_tokenizer_t **tok_p) {
    static const char *const files[] = {"tokenizer.json", "tokenizer.model",
                                        "original/tokenizer.model"};
    const char *from = tokenizer;
    char path[1200];
    for (size_t i = 0; !from && i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", ckpt, files[i]);
        if (l3d_path_present(path)) from = ckpt;
    }
    if (from) L3D_CHECK(ctx, l3d_tokenizer_open(ctx, from, tok_p));
    else L3D_CHECK(ctx, l3d_tokenizer_create_bytes(ctx, tok_p));
    if (l3d_tokenizer_vocab_size(*tok_p) > vocab) {
        l3d_status st = l3d_error(ctx, L3D_ERR_CONFIG, "the tokenizer (%s) has %d ids but the "
                                  "model's vocabulary is %d: not this model's tokenizer",
                                  from ? from : "bytes", (int)l3d_tokenizer_vocab_size(*tok_p),
                                  vocab);
        l3d_tokenizer_destroy(*tok_p);
        *tok_p = NULL;
        return st;
    }
    return L3D_OK;
}

static void stop_add(l3d_cli_stops_t *s, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < s->n; i++)
        if (s->ids[i] == id) return;
    if (s->n < (int)(sizeof(s->ids) / sizeof(s->ids[0]))) s->ids[s->n++] = id;
}

int l3d_cli_stops_has(const l3d_cli_stops_t *s, int32_t id) {
    for (int i = 0; i < s->n; i++)
        if (s->ids[i] == id) return 1;
    return 0;
}

// generation_config.json (its defaults where absent) and the ids that end generation: its
// eos ids, else config.json's, and the tokenizer's end-of-text / end-of-turn ids (llama.cpp's
// end-of-generation set).
l3d_status l3d_cli_gen_defaults(l3d_ctx_t *ctx, const char *ckpt, const l3d_model_config_t *cfg,
                                const l3d_tokenizer_t *tok, l3d_generation_config_t *gc,
                                l3d_cli_stops_t *stops) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/generation_config.json", ckpt);
    l3d_generation_config_default(gc);
    if (l3d_path_present(path)) L3D_CHECK(ctx, l3d_generation_config_from_file(ctx, path, gc));
    stops->n = 0;
    if (gc->n_eos)
        for (int i = 0; i < gc->n_eos; i++) stop_add(stops, gc->eos_token_ids[i]);
    else if (cfg->n_eos)
        for (int i = 0; i < cfg->n_eos; i++) stop_add(stops, cfg->eos_token_ids[i]);
    else
        stop_add(stops, cfg->eos_token_id);
    l3d_tokenizer_special_t sp;
    L3D_CHECK(ctx, l3d_tokenizer_special_ids(tok, &sp));
    for (int i = 0; i < sp.n_stop; i++) stop_add(stops, sp.stop_ids[i]);
    return L3D_OK;
}

int l3d_cli_weights_dtype(const char *cmd, const char *v, int *out, int *round_p) {
    static const struct {
        const char *name;
        int dt;
    } names[] = {{"auto", -1},           {"float32", L3D_FLOAT32}, {"f32", L3D_FLOAT32},
                 {"bfloat16", L3D_BFLOAT16}, {"bf16", L3D_BFLOAT16}, {"float16", L3D_FLOAT16},
                 {"f16", L3D_FLOAT16}};
    *out = -1;
    *round_p = 0;
    if (!v) return 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(v, names[i].name)) {
            *out = names[i].dt;
            *round_p = names[i].dt == L3D_BFLOAT16;  // a bfloat16 model computes in bfloat16
            return 0;
        }
    fprintf(stderr, "l3d %s: --dtype: '%s' is not auto, float32, bfloat16 or float16\n", cmd, v);
    return 1;
}
