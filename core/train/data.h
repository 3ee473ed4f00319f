// The training data stream (the tokenizer it reads text with: core/text/tokenizer_internal.h).
// defines: l3d_dataset_t, l3d_dataset_load, l3d_dataset_batch
#ifndef L3D_DATA_H
#define L3D_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"
#include "core/text/tokenizer_internal.h"
#include "llama3d/tokenizer.h"

// ---- data set ----------------------------------------------------------------------------
// Whether `path` names token ids (".bin") rather than text to tokenize.
int l3d_dataset_is_bin(const char *path);

// A token stream, read-only. Loaded from:
//  - a file ending in ".bin": little-endian uint32 token ids (length a multiple of 4, every id
//    < vocab_size: otherwise L3D_ERR_FORMAT naming the file, the offset and the id), mapped
//    in place, never read into memory whole;
//  - anything else: UTF-8 text, tokenized with `tok` as BOS + text + EOS (invalid UTF-8 is an
//    error naming the byte offset), read in chunks. A text over 4 MiB is tokenized once into
//    a token cache "<text>.l3d-<tokenizer>-<FNV-1a 64 of its bytes, hex>.bin" beside it (or,
//    when its directory is not writable, in L3D_CACHE_DIR / ~/.cache/llama3d), written
//    atomically and then mapped; a later load whose text has the same bytes maps the cache.
//    Memory stays bounded whatever the size of the corpus.
typedef struct l3d_dataset {
    l3d_ctx_t *ctx;
    const int32_t *tokens;
    size_t n_tokens;
    char path[512];
} l3d_dataset_t;

// The default data set: real text that every Debian system has after set-up.
#define L3D_DEFAULT_DATA "/usr/share/common-licenses/GPL-3"

l3d_status l3d_dataset_load(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t *tok,
                            int vocab_size, l3d_dataset_t **ds_p);
// Fewer than T + 1 tokens cannot make one sequence: L3D_ERR_FORMAT naming the counts.
l3d_status l3d_dataset_check(l3d_ctx_t *ctx, const l3d_dataset_t *ds, int T);
void l3d_dataset_free(l3d_dataset_t *ds);

// The batching rule (exact; layout equivalence relies on it): at step s, sequence i of the
// global batch of `global_batch` sequences starts at token offset
//   o = ((s * global_batch + i) * T) mod n_tokens
// its inputs are the T tokens at o, o+1, ... and its targets the next T (o+1 ...), each index
// taken mod n_tokens (the stream wraps around). This fills sequences [first, first + count)
// into inputs (count,T) and targets (count,T).
void l3d_dataset_batch(const l3d_dataset_t *ds, int64_t step, int global_batch, int T, int first,
                       int count, int32_t *inputs, int32_t *targets);

// The shuffled rule (data.shuffle, core/train/data_order.c; exact, and as layout-independent as the
// in-order one): the stream holds N = floor((n_tokens - 1) / T) whole sequences, the p-th
// starting at p * T (inputs tokens p*T .. p*T+T-1, targets one further; none wraps, the last
// (n_tokens - 1) mod T tokens are never read). Sequence i of step s's global batch is global
// sequence k = s * global_batch + i (step >= 0, k < 2^64), of epoch e = k / N at position
// p = k mod N, and starts at token
//   o = perm_e(p) * T,   perm_e = l3d_data_permute(., N, l3d_data_epoch_key(seed, e))
// so every epoch reads each sequence exactly once, in an order that depends only on the seed
// and the epoch. A global batch that crosses an epoch boundary takes the end of one
// permutation and the start of the next. Requires n_tokens >= T + 1 (l3d_dataset_check).
void l3d_dataset_batch_shuffled(const l3d_dataset_t *ds, uint64_t seed, int64_t step,
                                int global_batch, int T, int first, int count, int32_t *inputs,
                                int32_t *targets);
// The start offset o of sequence i of step `step` under the shuffled rule.
uint64_t l3d_dataset_shuffled_offset(const l3d_dataset_t *ds, uint64_t seed, int64_t step,
                                     int global_batch, int T, int i);
// perm(i) for a pseudo-random permutation of [0, n) named by key: a 4-round Feistel network
// over the smallest power of 4 >= n whose round function is SplitMix64 of (key, round, half),
// cycle-walked onto [0, n). Stateless: any index in O(1) expected time. n <= 1 gives 0.
uint64_t l3d_data_permute(uint64_t i, uint64_t n, uint64_t key);
// The key of epoch e's permutation: SplitMix64(SplitMix64(seed) ^ SplitMix64(e ^ 0x5DEECE66D)).
uint64_t l3d_data_epoch_key(uint64_t seed, uint64_t epoch);
uint64_t l3d_splitmix64(uint64_t x);

#endif
