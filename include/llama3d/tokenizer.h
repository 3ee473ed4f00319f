// Tokenizers: text to token ids and back, and the Llama 3 chat format.
// defines: l3d_tokenizer_t, l3d_tokenizer_open, l3d_tokenizer_encode, l3d_tokenizer_decode,
//          l3d_tokenizer_token_to_piece, l3d_tokenizer_special_t, l3d_chat_message_t,
//          l3d_chat_template_t, l3d_chat_format, l3d_tokenizer_encode_chat
//
// Two kinds:
//  - the byte tokenizer (l3d_tokenizer_create_bytes): ids 0..255 are the bytes, then BOS 256,
//    EOS 257, PAD 258. What models trained by llama3d from scratch use.
//  - byte-level BPE (l3d_tokenizer_open), read from a Hugging Face tokenizer.json or Meta's
//    original tokenizer.model (tiktoken format): Llama 3's tokenizer. The pre-tokenizer regex
//    runs through PCRE2 (UTF + UCP, JIT where the platform has it), with \s and \S meaning
//    Unicode White_Space as in Hugging Face's tokenizers and tiktoken.
//
// Invalid UTF-8 (Hugging Face's tokenizers take only valid strings, so this is our rule):
// encode splits the text at every invalid byte; each such byte becomes the token of that
// single byte, and the valid runs on either side are encoded as separate texts. Decoding gives
// the exact input bytes back, so encode then decode is the identity on any input.
//
// A tokenizer is read-only once open: encode and decode may be called from several threads at
// once on one tokenizer. It keeps a pointer to its ctx, which must outlive it.
#ifndef LLAMA3D_TOKENIZER_H
#define LLAMA3D_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct l3d_tokenizer l3d_tokenizer_t;

// Opens a BPE tokenizer. `path` is a tokenizer.json, a tokenizer.model (tiktoken format: one
// "base64-token rank" per line, read with Llama 3's pattern and its 256 special tokens after
// the ranks), or a directory holding one of them (tokenizer.json first, then tokenizer.model,
// then original/tokenizer.model). A tokenizer_config.json beside the file names BOS, EOS, the
// special tokens' texts for a tokenizer.model, and the chat template. A file named *.json, or
// whose first non-space byte is '{' or '[', is read as JSON (whatever its name), any other as
// tiktoken. A file that is not what llama3d reads (malformed JSON or JSON that is not an
// object, missing or mistyped keys, bad base64, a model type other than byte-level BPE, a
// regex PCRE2 refuses) is L3D_ERR_FORMAT naming the file and what is wrong; a missing file
// L3D_ERR_NOT_FOUND; one that is not a regular file (a FIFO, a directory) L3D_ERR_CONFIG.
l3d_status l3d_tokenizer_open(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t **tok_p);
l3d_status l3d_tokenizer_create_bytes(l3d_ctx_t *ctx, l3d_tokenizer_t **tok_p);
// Whether directory `dir` holds a tokenizer l3d_tokenizer_open would find (a model directory
// that carries its tokenizer).
int l3d_tokenizer_dir_has(const char *dir);
void l3d_tokenizer_destroy(l3d_tokenizer_t *tok);  // NULL is fine

// "bytes" or "bpe".
const char *l3d_tokenizer_kind(const l3d_tokenizer_t *tok);
// Ids are in [0, vocab size). 0 for NULL.
int32_t l3d_tokenizer_vocab_size(const l3d_tokenizer_t *tok);

#define L3D_TOKENIZER_MAX_STOP 8
typedef struct l3d_tokenizer_special {
    int32_t bos_id;  // -1 where the tokenizer has none
    int32_t eos_id;  // tokenizer_config.json's eos_token (Llama 3: <|end_of_text|>)
    int32_t eot_id;  // <|eot_id|>, the end of a chat turn; -1 where absent
    int32_t pad_id;  // -1 where none
    // Every id that ends generation by default: eos, <|eot_id|>, <|eom_id|> where present.
    int n_stop;
    int32_t stop_ids[L3D_TOKENIZER_MAX_STOP];
} l3d_tokenizer_special_t;
l3d_status l3d_tokenizer_special_ids(const l3d_tokenizer_t *tok, l3d_tokenizer_special_t *out);
// Whether `id` is a special token (BOS, EOS, <|eot_id|>, ...); 0 for ids out of range.
int l3d_tokenizer_is_special(const l3d_tokenizer_t *tok, int32_t id);
// The id of the token whose text is exactly text[0..len) (a special token's text, or a
// vocabulary entry's bytes): L3D_ERR_NOT_FOUND where there is none.
l3d_status l3d_tokenizer_token_id(const l3d_tokenizer_t *tok, const char *text, size_t len,
                                  int32_t *id_p);

enum {
    L3D_TOKENIZE_BOS = 1u << 0,      // start with the BOS id
    L3D_TOKENIZE_SPECIAL = 1u << 1,  // special-token texts in the input become their ids
};
// Encodes text[0..len) (any bytes) into a new id array of *n_p ids, released with
// l3d_tokens_free(ctx, ids, n). An empty result is NULL with *n_p = 0. Without
// L3D_TOKENIZE_SPECIAL, "<|eot_id|>" in the text is encoded as ordinary text (Hugging Face's
// split_special_tokens); added tokens that are not special are always matched.
l3d_status l3d_tokenizer_encode(l3d_tokenizer_t *tok, const char *text, size_t len,
                                unsigned flags, int32_t **ids_p, size_t *n_p);
void l3d_tokens_free(l3d_ctx_t *ctx, int32_t *ids, size_t n);

// The bytes of one token, as it reads in running text: a special token gives its text
// ("<|eot_id|>"), the byte tokenizer's BOS/EOS/PAD give 0 bytes. A BPE token can be part of a
// UTF-8 character; join pieces before showing them. *len_p receives the length; a buffer
// smaller than that is L3D_ERR_INVALID_ARG, except that buf NULL with cap 0 only measures.
l3d_status l3d_tokenizer_token_to_piece(l3d_tokenizer_t *tok, int32_t id, char *buf, size_t cap,
                                        size_t *len_p);

enum {
    L3D_DECODE_SKIP_SPECIAL = 1u << 0,  // leave special tokens' texts out
};
// The text of ids[0..n): the pieces joined, as bytes (no replacement of invalid UTF-8, no
// "clean up of tokenization spaces"). Buffer rules as l3d_tokenizer_token_to_piece; an id out
// of range is L3D_ERR_INVALID_ARG naming it.
l3d_status l3d_tokenizer_decode(l3d_tokenizer_t *tok, const int32_t *ids, size_t n,
                                unsigned flags, char *buf, size_t cap, size_t *len_p);

// ---- chat --------------------------------------------------------------------------------
// llama3d has no Jinja engine: it recognises the chat templates Meta shipped with Llama 3
// (tokenizer_config.json's chat_template) and formats conversations as they do.
typedef enum l3d_chat_template {
    L3D_CHAT_NONE = 0,     // no template (or a tokenizer without one)
    L3D_CHAT_LLAMA3 = 1,   // Llama 3 (8B/70B Instruct)
    L3D_CHAT_LLAMA31 = 2,  // Llama 3.1 / 3.3: a system turn with "Cutting Knowledge Date"
    L3D_CHAT_LLAMA32 = 3,  // Llama 3.2: as 3.1, "Today Date" defaults to today
} l3d_chat_template_t;

typedef struct l3d_chat_message {
    const char *role;  // "system", "user", "assistant", ...
    const char *content;
} l3d_chat_message_t;

// Which known template `text` (len bytes) is, compared byte for byte: Jinja renders
// whitespace outside its tags, so a copy that differs only by whitespace (a trailing space,
// re-indentation) is another template. Anything else is L3D_ERR_UNSUPPORTED naming `origin`
// and the templates llama3d knows.
l3d_status l3d_chat_template_recognise(l3d_ctx_t *ctx, const char *text, size_t len,
                                       const char *origin, l3d_chat_template_t *kind_p);
// The template the tokenizer's tokenizer_config.json carries (L3D_CHAT_NONE where none).
l3d_chat_template_t l3d_tokenizer_chat_template(const l3d_tokenizer_t *tok);

// Formats a conversation as template `kind` does with add_generation_prompt: BOS text, each
// message's header, its content trimmed, <|eot_id|>, then the assistant header. `bos` is the
// BOS token's text; `date` the "Today Date" of 3.1/3.2 (NULL: "26 Jul 2024" for 3.1, today
// for 3.2, as transformers renders them). Tool calls and tool roles are
// L3D_ERR_UNSUPPORTED. *text_p (NUL-terminated, *len_p bytes) is freed with
// l3d_chat_text_free.
l3d_status l3d_chat_format(l3d_ctx_t *ctx, l3d_chat_template_t kind, const char *bos,
                           const l3d_chat_message_t *msgs, size_t n, const char *date,
                           char **text_p, size_t *len_p);
void l3d_chat_text_free(l3d_ctx_t *ctx, char *text, size_t len);
// The conversation formatted with the tokenizer's own template and encoded with special
// tokens parsed, as transformers' apply_chat_template(..., add_generation_prompt=True).
// A tokenizer without a recognised template is L3D_ERR_UNSUPPORTED.
l3d_status l3d_tokenizer_encode_chat(l3d_tokenizer_t *tok, const l3d_chat_message_t *msgs,
                                     size_t n, const char *date, int32_t **ids_p, size_t *n_p);

#ifdef __cplusplus
}
#endif
#endif
