// What core/train/data.c (token files, batching) and core/train/data_text.c (streaming text and its
// token cache) share.
#ifndef L3D_DATA_INTERNAL_H
#define L3D_DATA_INTERNAL_H

#include "core/train/data.h"

// The l3d_dataset_t handed out is the first member, so the two pointers convert. The tokens
// are either owned (a small text tokenized in memory) or a read-only map of a .bin file.
typedef struct l3d_dataset_impl {
    l3d_dataset_t pub;
    int32_t *owned;    // l3d_malloc'd ids (tag "data"), or NULL
    size_t cap;        // ids allocated for owned
    const void *map;   // the mapped .bin, or NULL
    size_t map_len;
} l3d_dataset_impl_t;

// Texts up to this size are tokenized in memory (4 bytes an id: 16 MiB); larger ones stream
// into a token cache file that is then mapped, so memory does not grow with the corpus.
#define L3D_DATA_TEXT_INMEM_MAX ((uint64_t)4 << 20)

// A .bin of little-endian uint32 ids, mapped (not read into memory) and checked against
// vocab_size in windows whose pages are released as the scan passes.
l3d_status l3d_dataset_load_bin(l3d_ctx_t *ctx, const char *path, int vocab_size,
                                l3d_dataset_impl_t **ds_p);
// UTF-8 text: BOS + tokens + EOS. Texts of at most inmem_max bytes are tokenized in memory;
// larger ones go through the token cache (core/train/data_text.c has the rules), in the text's
// directory or else in cache_dir ("" or NULL: none).
l3d_status l3d_dataset_load_text(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                                 int vocab_size, uint64_t inmem_max, const char *cache_dir,
                                 l3d_dataset_impl_t **ds_p);
// The cache file name a text with this content hash gets for tokenizer `tok`, in `dir`.
void l3d_dataset_cache_name(const char *dir, const char *text_path, uint64_t hash,
                            const l3d_tokenizer_t *tok, char *out, size_t cap);

// Turns a negative errno from platform/ into a status naming the path.
l3d_status l3d_dataset_file_error(l3d_ctx_t *ctx, const char *path, int rc);

#endif
