// Hugging Face weight files as transformers writes them: one `model.safetensors`, or shards
// `model-00001-of-0000N.safetensors` listed by `model.safetensors.index.json`
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor: file}}), in F32, BF16 or F16.
// defines: l3d_hf_set_t, l3d_hf_set_open/open_file/close/find, l3d_hf_set_check,
//          l3d_hf_set_read, l3d_ckpt_place, l3d_hf_save_weights
//          (l3d_hf_is_weights_dir: core/config/config_model_dir.h)
//
// Files are memory-mapped; a rank converts only the rows and columns of its own shards
// (l3d_ckpt_place), so no rank materialises the whole model in float32.
#ifndef L3D_CHECKPOINT_HF_H
#define L3D_CHECKPOINT_HF_H

#include <stddef.h>
#include <stdint.h>

#include "core/checkpoint/checkpoint_publish.h"
#include "core/config/config_model_dir.h"
#include "core/model/model_internal.h"
#include "core/checkpoint/safetensors.h"

#define L3D_HF_MAX_FILES 4096

typedef struct l3d_hf_set {
    l3d_ctx_t *ctx;
    int n;                  // files
    l3d_st_file_t **files;  // mapped, validated headers
    char **paths;           // dir/name of each file
    char origin[1200];      // the index's path, or the single file's: named in errors
    uint64_t bytes;         // the files' total size
    // The floating dtype every tensor has (L3D_ST_F32 when the set is empty), and whether
    // they differ (then `dtype` is the first one's).
    l3d_st_dtype dtype;
    int mixed;
} l3d_hf_set_t;

// Opens dir's model weights: model.safetensors when present (transformers prefers it), else
// model.safetensors.index.json and every shard it names. The index must be an object with a
// "weight_map" of tensor -> file name in `dir` (no '/', not hidden), every mapped tensor must
// be in its file and every tensor of a shard mapped to that shard: L3D_ERR_FORMAT naming the
// file and the tensor otherwise; a missing file is L3D_ERR_NOT_FOUND naming it.
l3d_status l3d_hf_set_open(l3d_ctx_t *ctx, const char *dir, l3d_hf_set_t *set);
// One safetensors file as a set (the optimizer files).
l3d_status l3d_hf_set_open_file(l3d_ctx_t *ctx, const char *path, l3d_hf_set_t *set);
void l3d_hf_set_close(l3d_hf_set_t *set);
// The tensor `name` and the path of the file holding it, or NULL.
const l3d_st_tensor_t *l3d_hf_set_find(const l3d_hf_set_t *set, const char *name,
                                       const char **path_p);

// The set holds exactly the tensors cfg implies (names + suffix) with their shapes and a float
// dtype; a tied model may also carry lm_head.weight. L3D_ERR_FORMAT naming the file and the
// first missing, mismatched or extra tensor; `cfg_origin` (the config.json) is named too.
l3d_status l3d_hf_set_check(l3d_ctx_t *ctx, const l3d_model_config_t *cfg, const char *cfg_origin,
                            const l3d_hf_set_t *set, const char *suffix);

// Fills host arena `dst` (m's layout: this rank's shards of this stage's tensors) from the set's
// tensors named m's names + suffix, converting to dtype dt (float32, or bfloat16 / float16 for
// a 16-bit-only model, rounded once). Non-finite values are L3D_ERR_FORMAT naming file,
// tensor, row and column. Shows progress on a terminal.
l3d_status l3d_hf_set_read(l3d_model_t *m, const l3d_hf_set_t *set, const char *suffix,
                           void *dst, l3d_dtype dt);

// Copies the overlap of saved rectangle `e` (full-tensor rows [R, R+h), columns [C, C+w), any
// float dtype) with tensor p's local shard into arena `dst` of dtype dt; *n gets the elements
// copied. A 16-bit dt converts each row through `row_buf` (floats for p's widest row; NULL for
// float32). A rectangle that does not fit p is L3D_ERR_FORMAT naming `path`. With `f` (the
// mapped file holding e; may be NULL) the converted source rows are dropped from memory as it
// goes (l3d_st_drop_range).
l3d_status l3d_ckpt_place(l3d_ctx_t *ctx, const char *path, const l3d_st_tensor_t *e,
                          const l3d_param_t *p, long long R, long long C, void *dst, l3d_dtype dt,
                          float *row_buf, size_t *n, const l3d_st_file_t *f);

// Writes m's whole-model arena `host` (host memory, single-rank layout) into dir as transformers
// does: model.safetensors, or when the weights exceed max_shard_bytes (> 0) shards
// model-0000i-of-0000N.safetensors (tensors in order, a new shard when the next would overflow
// the current one, as huggingface_hub splits) plus model.safetensors.index.json; tensors stored
// as `dtype` (F32, BF16 or F16). Each file carries __metadata__ {"format": "pt"}.
l3d_status l3d_hf_save_weights(l3d_model_t *m, const float *host, const char *dir,
                               l3d_st_dtype dtype, uint64_t max_shard_bytes);

// Copies those of l3d_ckpt_carried_files (core/checkpoint/checkpoint_publish.h) present in `from`
// into `to` (regular files only).
l3d_status l3d_ckpt_carry_files(l3d_ctx_t *ctx, const char *from, const char *to);

#endif
