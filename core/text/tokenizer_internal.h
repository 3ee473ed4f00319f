// Folder core/text (docs/architecture.md): tokenizers (bytes, byte-level BPE and its readers)
// and chat templates. May use: core/ root, platform/, include/llama3d/.
//
// The tokenizer seam its kinds plug into, and what the tokenizer's files and the data's token
// caches share. The public API is include/llama3d/tokenizer.h.
// defines: l3d_tokenizer_ops_t, struct l3d_tokenizer, l3d_tokens_reserve, l3d_fnv1a64
#ifndef L3D_TOKENIZER_INTERNAL_H
#define L3D_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"
#include "llama3d/tokenizer.h"

// The kinds: the byte tokenizer (core/text/tokenizer.c) and byte-level BPE (core/tokenizer_bpe*.c).
typedef struct l3d_tokenizer_ops {
    const char *name;  // "bytes", "bpe"
    // Appends the ids of text[0..len) to *ids_p (realloc'd through the ctx, capacity *cap_p,
    // count *n_p). No BOS/EOS is added. flags: L3D_TOKENIZE_SPECIAL.
    l3d_status (*encode)(l3d_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                         int32_t **ids_p, size_t *n_p, size_t *cap_p);
    // The bytes of one id (in range) as l3d_tokenizer_token_to_piece: buf NULL and cap 0
    // measure; a short buffer is L3D_ERR_INVALID_ARG.
    l3d_status (*piece)(l3d_tokenizer_t *tok, int32_t id, char *buf, size_t cap, size_t *len_p);
    // Text of a token -> id, or -1 (NULL: only the byte tokenizer's bytes).
    int32_t (*find)(const l3d_tokenizer_t *tok, const char *text, size_t len);
    void (*destroy)(l3d_tokenizer_t *tok);
} l3d_tokenizer_ops_t;

struct l3d_tokenizer {
    const l3d_tokenizer_ops_t *ops;
    l3d_ctx_t *ctx;
    void *priv;
    int vocab_size;  // ids in [0, vocab_size)
    int bos_id, eos_id, pad_id;  // -1 where none (the data loader needs bos and eos)
    l3d_tokenizer_special_t special;
    const uint8_t *is_special;  // vocab_size flags (bit 0: special), or NULL: ids >= 256
    l3d_chat_template_t chat;
    char chat_error[320];  // why tokenizer_config.json's chat_template was not recognised
    // A name for caches keyed by tokenizer: "bytes", or "bpe-" + 16 hex digits of the FNV-1a
    // 64 of the tokenizer's files.
    char key[32];
};

// Grows an id buffer owned by the ctx (tag "data") so it holds at least `need` ids.
l3d_status l3d_tokens_reserve(l3d_ctx_t *ctx, int32_t **ids_p, size_t n, size_t *cap_p,
                              size_t need);

// FNV-1a 64 of bytes, continued from h (start with L3D_FNV64_INIT): the tokenizer's key and
// the data's token cache names.
#define L3D_FNV64_INIT 0xcbf29ce484222325ull
uint64_t l3d_fnv1a64(uint64_t h, const void *data, size_t len);

#endif
