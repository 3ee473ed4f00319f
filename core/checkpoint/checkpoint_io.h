// Folder core/checkpoint (docs/architecture.md): safetensors, Hugging Face weight files,
// sharded checkpoints, publishing, checks before allocation, opening a model from a
// directory. Knows files, not the trainer: state comes in through l3d_ckpt_dist_src_t and
// whole arenas. May use: core/model, core/config, core/text, core/comm, the core/ root,
// platform/, the device vtable, include/llama3d/.
//
// The checkpoint files a save or a resume of a whole model reads and writes, for the code that
// holds the state: l3d_model_save/load here, and the trainer's save and resume
// (core/train/trainer_ckpt.c), which gathers its partitioned state into whole arenas first.
// Arenas are device arrays of m->n_params floats in m's own layout (any tp/pp part).
// defines: l3d_ckpt_fill_fn, l3d_ckpt_publish_dir, l3d_ckpt_write_arena, l3d_ckpt_read_file,
//          l3d_ckpt_write_text, l3d_ckpt_write_model_files, l3d_ckpt_check_same_arch,
//          l3d_ckpt_load_weights
#ifndef L3D_CHECKPOINT_IO_H
#define L3D_CHECKPOINT_IO_H

#include "core/model/model_internal.h"

// Writes the files of a checkpoint into tmpdir.
typedef l3d_status (*l3d_ckpt_fill_fn)(void *arg, const char *tmpdir);
// Builds the directory in "<target>.tmp.<pid>" (`fill` writes into it) and swaps it in for
// the target: a directory llama3d wrote, or none (core/checkpoint/checkpoint_publish.h says which).
l3d_status l3d_ckpt_publish_dir(l3d_ctx_t *ctx, const char *dir, l3d_ckpt_fill_fn fill,
                                void *arg);
// Arena `a` as safetensors at path, with m's tensor names plus `suffix`.
l3d_status l3d_ckpt_write_arena(l3d_model_t *m, const float *a, const char *path,
                                const char *suffix);
// One safetensors file's tensors (m's names + suffix; this rank's shards only) into arena `a`.
l3d_status l3d_ckpt_read_file(l3d_model_t *m, float *a, const char *path, const char *suffix);
// A text file written atomically.
l3d_status l3d_ckpt_write_text(l3d_ctx_t *ctx, const char *path, const char *text);
// config.json and the weights as m->save says (core/checkpoint/checkpoint_hf.h), plus the tokenizer
// and generation files of the directory the weights came from.
l3d_status l3d_ckpt_write_model_files(l3d_model_t *m, const char *dir);
// L3D_ERR_CONFIG unless checkpoint config `a` (read from origin) has the architecture of `b`.
l3d_status l3d_ckpt_check_same_arch(l3d_ctx_t *ctx, const char *origin,
                                    const l3d_model_config_t *a, const l3d_model_config_t *b);
// m's weights (its own slices) from a Hugging Face or sharded directory whose index
// l3d_ckpt_check has accepted for m's config.
l3d_status l3d_ckpt_load_weights(l3d_model_t *m, const char *dir);

#endif
