// Where a checkpoint save may write, and how it is published (docs/checkpoints.md,
// "Where a save may write"). Shared by the single-rank (core/checkpoint/checkpoint.c) and sharded
// (core/checkpoint/checkpoint_dist.c) saves.
//
// A save replaces only a directory llama3d wrote: every entry one of the files a checkpoint
// holds (l3d_ckpt_is_own_file), a regular file each, or an empty or missing directory. A
// symlink is followed: the save goes to what it points at, the link stays. Anything else is
// refused with L3D_ERR_CONFIG naming the path and the entry, and nothing is deleted.
//
// The new version is built in "<target>.tmp.<pid>", which holds a marker (MARKER_NAME in
// the .c) recording the owner's pid and host; a later save to the same target removes such
// temporaries whose owner is provably dead (same host and pid namespace, kill(pid, 0) says
// ESRCH), and never one whose owner may be alive or whose marker it cannot read.
#ifndef L3D_CHECKPOINT_PUBLISH_H
#define L3D_CHECKPOINT_PUBLISH_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

// The float32 master weights a save writes beside weights saved narrower
// (core/checkpoint/checkpoint.c).
#define L3D_CKPT_MASTER_FILE "master.safetensors"
// 1 when `name` is a file llama3d writes into a checkpoint directory: its own files, Hugging
// Face weight shards and index, and l3d_ckpt_carried_files. A save that wrote any other name
// could not be replaced by the next one: l3d_ckpt_tmp_publish refuses to publish it.
int l3d_ckpt_is_own_file(const char *name);
// What a Hugging Face model directory carries beside its weights, which a save copies from the
// directory the weights came from (NULL-terminated): tokenizer.json, tokenizer.model,
// tokenizer_config.json, special_tokens_map.json, generation_config.json.
extern const char *const l3d_ckpt_carried_files[];
// Vets `dir` as a save target and writes into out[cap] the directory to build beside and
// replace (dir with symlinks followed). Creates nothing.
l3d_status l3d_ckpt_target_resolve(l3d_ctx_t *ctx, const char *dir, char *out, size_t cap);
// Removes stale temporaries of `target`, then creates "<target>.tmp.<pid>" (parents too)
// with the owner marker; its path goes to tmp[cap].
l3d_status l3d_ckpt_tmp_create(l3d_ctx_t *ctx, const char *target, int64_t pid, char *tmp,
                               size_t cap);
// Vets `target` again (it may have changed while the files were written), swaps tmp in for
// target and removes the previous version (marked as this save's, its marker last). A tmp
// holding a file that l3d_ckpt_is_own_file does not name is L3D_ERR_INTERNAL (the next save
// would refuse the directory). On failure the caller removes tmp with l3d_ckpt_tmp_remove.
l3d_status l3d_ckpt_tmp_publish(l3d_ctx_t *ctx, const char *tmp, const char *target);
// Removes a temporary, its marker last (a kill midway leaves it recognisably ours).
void l3d_ckpt_tmp_remove(const char *tmp);

#endif
