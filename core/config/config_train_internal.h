// Folder core/config (docs/architecture.md): JSON helpers, model configs and presets,
// DeepSpeed's keys, the training config, layout checks and pipeline schedules, what a model
// directory holds. May use: core/comm (the mesh order), core/text (tokenizer files), the
// core/ root, platform/, the device vtable, include/llama3d/.
//
// The ds_config.json parser's internals, shared by its two halves: core/config/config_train.c (the
// top level, llama3d's own sections, the batch identity, finalize) and
// core/config/config_deepspeed.c (DeepSpeed's sections and top-level scalars).
// defines: l3d_dsparser_t, l3d_dskey_t, l3d_dsconfig_check_section, l3d_dsconfig_parse_sections
#ifndef L3D_CONFIG_TRAIN_INTERNAL_H
#define L3D_CONFIG_TRAIN_INTERNAL_H

#include <stddef.h>

#include <jansson.h>

#include "core/config/config_json.h"
#include "llama3d/config.h"

// Parser state: the messages' context and origin (dialect L3D_CFGJSON_DS), and the config
// being filled in (a copy of the caller's until the whole file is accepted).
typedef struct l3d_dsparser {
    l3d_cfgjson_t j;
    l3d_train_config_t *cfg;
} l3d_dsparser_t;

// An accepted key: its JSON kind, and for a boolean that asks for something llama3d does not
// do yet, the reason recorded as a note when it is true. Kind '*': read by the caller.
typedef struct l3d_dskey {
    const char *key;
    char kind;         // 'b' boolean, 'n' number, 'i' integer, 's' string or null, '*' caller
    const char *note;  // NULL: honoured (or no effect on one rank)
} l3d_dskey_t;

// Rejects keys of `obj` not in specs[0..n), type-checks the ones of a known kind and records
// the notes of true booleans.
l3d_status l3d_dsconfig_check_section(const l3d_dsparser_t *p, json_t *obj, const char *path,
                                      const l3d_dskey_t *specs, size_t n);

// DeepSpeed's top-level scalars, then optimizer, scheduler, fp16/bf16, zero_optimization,
// activation_checkpointing and the monitors, in that order: the scheduler's defaults follow
// the optimizer's lr, the precision notes name train.device (so llama3d's sections go first).
l3d_status l3d_dsconfig_parse_sections(const l3d_dsparser_t *p, json_t *root);

// The batch identity (DeepSpeed's rules: any two of train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps give the third with dp) and
// the layout against the model, schedule and device; messages start with `origin`.
// core/config/config_layout.c; called by l3d_train_config_finalize and the trainer.
l3d_status l3d_train_config_check_layout(l3d_ctx_t *ctx, l3d_train_config_t *cfg,
                                         const char *origin);
// The same for l3d plan (planning 1), which costs runs rather than starts them: the pipeline
// schedule's simulation (l3d_pp_validate, which depends only on the schedule kind, pp, v and
// the accumulation steps) is left to it, as it has run it for those already across thousands
// of layouts, and tp_mode 2d is checked for its grid's shape only, not for what this build's
// 2d runs do not take yet.
l3d_status l3d_train_config_check_layout_ex(l3d_ctx_t *ctx, l3d_train_config_t *cfg,
                                            const char *origin, int planning);

#endif
