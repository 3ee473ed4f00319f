// safetensors reading and writing (https://github.com/huggingface/safetensors format):
// 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// optional "__metadata__" {str: str}, then the raw little-endian tensor bytes.
// defines: l3d_st_file_t, l3d_st_tensor_t, l3d_st_open/parse/find/read_f32/close, l3d_st_write
//
// Every header is validated before any tensor is touched: header length within the file,
// valid UTF-8 JSON object, known dtypes, shapes whose element count times the dtype size
// equals end - begin, offsets inside the data section, no two tensors overlapping, no
// duplicate names. A violation is L3D_ERR_FORMAT with a detail naming the file and tensor.
#ifndef L3D_SAFETENSORS_H
#define L3D_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

typedef enum l3d_st_dtype {
    L3D_ST_F32 = 0,
    L3D_ST_F16,
    L3D_ST_BF16,
    L3D_ST_F64,
    L3D_ST_I32,
    L3D_ST_I64,
    L3D_ST_U8,
    L3D_ST_I8,
    L3D_ST_I16,
    L3D_ST_U16,
    L3D_ST_U32,
    L3D_ST_U64,
    L3D_ST_BOOL,
} l3d_st_dtype;

#define L3D_ST_MAX_DIMS 8

typedef struct l3d_st_tensor {
    const char *name;            // NUL-terminated, owned by the file object
    l3d_st_dtype dtype;
    int ndim;
    int64_t shape[L3D_ST_MAX_DIMS];
    size_t begin, end;           // byte offsets in the data section
    const void *data;            // points into the mapped/parsed buffer
} l3d_st_tensor_t;

typedef struct l3d_st_file l3d_st_file_t;

// Maps `path` (l3d_input_map: a file that is not a regular one is refused, never blocked on)
// and validates its header. The mapping lives until l3d_st_close.
l3d_status l3d_st_open(l3d_ctx_t *ctx, const char *path, l3d_st_file_t **f_p);
// Validates an in-memory buffer (not copied: it must outlive the file object). `origin`
// names it in errors. Used by l3d_st_open and the fuzz target.
l3d_status l3d_st_parse(l3d_ctx_t *ctx, const void *buf, size_t len, const char *origin,
                        l3d_st_file_t **f_p);
void l3d_st_close(l3d_st_file_t *f);

size_t l3d_st_count(const l3d_st_file_t *f);
const l3d_st_tensor_t *l3d_st_at(const l3d_st_file_t *f, size_t i);
const l3d_st_tensor_t *l3d_st_find(const l3d_st_file_t *f, const char *name);
// Drops tensor t's pages of a mapped file from the process's memory once it has been read
// (a no-op for parsed buffers); reading t again maps them back in.
void l3d_st_drop(const l3d_st_file_t *f, const l3d_st_tensor_t *t);
// The same for bytes [data, data + len) of the file's data (whole pages inside it).
void l3d_st_drop_range(const l3d_st_file_t *f, const void *data, size_t len);
// A __metadata__ value, or NULL.
const char *l3d_st_metadata(const l3d_st_file_t *f, const char *key);

int l3d_st_dtype_is_float(l3d_st_dtype dt);  // F32, F16, BF16, F64
size_t l3d_st_dtype_size(l3d_st_dtype dt);   // bytes per element (0: not a dtype)
const char *l3d_st_dtype_name(l3d_st_dtype dt);  // "F32", "BF16", ...
// count elements of float dtype `dt` at `src` (any alignment, little-endian) to float32.
void l3d_st_to_f32(l3d_st_dtype dt, const void *src, size_t count, float *dst);
// count float32 to BF16 or F16 (2 bytes each, little-endian) at `dst`, rounding to nearest
// even as torch does.
void l3d_st_from_f32(l3d_st_dtype dt, const float *src, size_t count, void *dst);

// Copies tensor `name` into dst as float32 (converting F16/BF16/F64), after checking that it
// exists (L3D_ERR_NOT_FOUND otherwise) and that its shape is exactly shape[0..ndim)
// (L3D_ERR_FORMAT naming the tensor, the found and the expected shape otherwise).
l3d_status l3d_st_read_f32(l3d_ctx_t *ctx, const l3d_st_file_t *f, const char *name,
                           const int64_t *shape, int ndim, float *dst);

// One tensor to write: float32 data in host memory, row-major, stored as `dtype` (F32 -- the
// zero value --, BF16 or F16; converted while writing, rounding to nearest even).
typedef struct l3d_st_entry {
    const char *name;
    int ndim;
    int64_t shape[L3D_ST_MAX_DIMS];
    const float *data;
    l3d_st_dtype dtype;
} l3d_st_entry_t;

// Writes a safetensors file atomically (temp + fsync + rename). Tensors are laid out in the
// given order, the header padded with spaces to a multiple of 8 bytes (as the reference
// implementation does). metadata is n_meta key/value string pairs (may be 0).
l3d_status l3d_st_write(l3d_ctx_t *ctx, const char *path, const l3d_st_entry_t *entries, size_t n,
                        const char *const *meta_keys, const char *const *meta_vals,
                        size_t n_meta);

#endif
