// Byte-level BPE: the tables shared by the encoder (core/text/tokenizer_bpe.c) and the readers of
// tokenizer.json and tokenizer.model (core/text/tokenizer_load.c).
// defines: l3d_bpe_t, l3d_bpe_new, l3d_bpe_set_token, l3d_bpe_add_pair, l3d_bpe_set_regex,
//          l3d_bpe_finish, l3d_bpe_free, l3d_bpe_lookup, l3d_bpe_tokenizer
//
// Every token is a byte string. Encoding never looks at Hugging Face's byte-to-unicode
// alphabet: the reader maps vocabulary entries back to bytes once, and merges become pairs of
// ids. A merge (a, b) -> c with priority `rank` (lower first) covers both formats:
// tokenizer.json's merge list (rank = position in the list) and tiktoken's ranks (every split
// of a token t into two tokens a + b gets rank(t)).
#ifndef L3D_TOKENIZER_BPE_H
#define L3D_TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/text/tokenizer_internal.h"

enum {
    L3D_BPE_SPECIAL = 1,  // a special token (matched only with L3D_TOKENIZE_SPECIAL)
    L3D_BPE_ADDED = 2,    // an added token: matched in the text before pre-tokenization
    L3D_BPE_VOCAB = 4,    // reachable by BPE (its bytes are looked up while merging)
};

typedef struct l3d_bpe_pair {
    uint64_t key;  // (a << 32) | b, ~0 when the slot is empty
    int32_t rank;
    int32_t id;
} l3d_bpe_pair_t;

// Added tokens as a trie over their bytes (first child / next sibling): few, short tokens.
typedef struct l3d_bpe_trie {
    int32_t child, sibling;
    int32_t id;  // the token ending here, or -1
    uint8_t byte;
} l3d_bpe_trie_t;

typedef struct l3d_bpe {
    l3d_ctx_t *ctx;
    int32_t n_ids;
    char *blob;  // token bytes, tok_off/tok_len index it
    size_t blob_len, blob_cap;
    uint32_t *tok_off, *tok_len;
    uint8_t *flags;  // L3D_BPE_* per id
    int32_t *vmap;   // bytes -> id (L3D_BPE_VOCAB tokens), open addressing, -1 empty
    uint32_t vmap_mask;
    l3d_bpe_pair_t *pairs;
    uint32_t pair_mask;
    size_t n_pairs, pair_cap;
    int32_t byte_id[256];
    int ignore_merges;  // a piece that is itself a token is that token (tiktoken; HF's flag)
    l3d_bpe_trie_t *trie;  // node 0 is the root
    int32_t n_nodes, cap_nodes;
    uint8_t first_byte[256];  // bytes that start an added token
    void *re;                 // pcre2_code *
    int jit;                  // pcre2_jit_compile succeeded
} l3d_bpe_t;

// Tables for ids [0, n_ids) with no tokens yet; expects about n_pairs merges.
l3d_status l3d_bpe_new(l3d_ctx_t *ctx, int32_t n_ids, size_t n_pairs, l3d_bpe_t **b_p);
void l3d_bpe_free(l3d_bpe_t *b);
// Sets id's bytes (a later call for the same id replaces them) and L3D_BPE_* flags.
l3d_status l3d_bpe_set_token(l3d_bpe_t *b, int32_t id, const char *bytes, size_t len,
                             unsigned flags);
// Records merge (a, b) -> id at priority rank; the first of two merges of one pair wins.
l3d_status l3d_bpe_add_pair(l3d_bpe_t *b, int32_t a, int32_t bb, int32_t rank, int32_t id);
// Compiles the pre-tokenizer pattern (\s and \S as Unicode White_Space); a pattern PCRE2
// refuses is L3D_ERR_FORMAT naming `origin`.
l3d_status l3d_bpe_set_regex(l3d_bpe_t *b, const char *pattern, const char *origin);
// Builds the byte -> id map and the added-token trie; every single byte must be a token.
l3d_status l3d_bpe_finish(l3d_bpe_t *b, const char *origin);
// The id of a L3D_BPE_VOCAB token with these bytes, or -1 (valid after l3d_bpe_finish).
int32_t l3d_bpe_lookup(const l3d_bpe_t *b, const char *s, size_t len);
// The pair table's entry for (a, b), or NULL.
const l3d_bpe_pair_t *l3d_bpe_pair(const l3d_bpe_t *b, int32_t a, int32_t bb);

// Wraps finished tables into a tokenizer (which then owns them).
l3d_status l3d_bpe_tokenizer(l3d_ctx_t *ctx, l3d_bpe_t *b, l3d_tokenizer_t **tok_p);

// Llama 3's pre-tokenizer pattern (tokenizer.json's Split regex; Meta's tiktoken pat_str).
extern const char l3d_llama3_pattern[];

#endif
