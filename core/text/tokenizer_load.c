// Reading byte-level BPE tokenizers: Hugging Face's tokenizer.json, Meta's tokenizer.model
// (tiktoken format) and the tokenizer_config.json beside them.
//
// What llama3d reads from tokenizer.json (anything else it refuses, naming the key):
//   model: {"type": "BPE", "vocab": {token: id}, "merges": ["a b", ...] or [["a", "b"], ...],
//           "ignore_merges": bool, byte_fallback false, no subword prefix/suffix}
//   added_tokens: [{"id", "content", "special", ...}] (lstrip/rstrip/single_word false)
//   normalizer: null
//   pre_tokenizer: Sequence[Split{Regex, "Isolated"}, ByteLevel{use_regex false}], or
//                  ByteLevel{use_regex true} alone (GPT-2's pattern), add_prefix_space false
//   decoder: ByteLevel (or null)
// post_processor is not applied: callers ask for BOS with L3D_TOKENIZE_BOS.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "core/input.h"
#include "core/l3d_core.h"
#include "core/text/tokenizer_bpe.h"
#include "core/text/tokenizer_internal.h"
#include "platform/platform.h"

#define TAG "tokenizer"
#define MAX_FILE ((size_t)1 << 30)

// GPT-2's pattern, ByteLevel's own when use_regex is true.
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ---- Hugging Face's byte-to-unicode alphabet ---------------------------------------------
// Bytes that print as themselves ('!'..'~', 0xa1..0xac, 0xae..0xff) keep their code point;
// the other 68 take 256, 257, ... in byte order. map[cp] = byte for cp < 324, else -1.
static void byte_alphabet(int16_t map[324]) {
    for (int i = 0; i < 324; i++) map[i] = -1;
    int n = 0;
    for (int c = 0; c < 256; c++) {
        int keeps = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
        map[keeps ? c : 256 + n++] = (int16_t)c;
    }
}

// Decodes a vocabulary string into the bytes it stands for; 0 if every character is in the
// alphabet, -1 otherwise (out then undefined). out holds at least strlen(s) bytes.
static int alphabet_decode(const int16_t map[324], const char *s, size_t n, char *out,
                           size_t *len_p) {
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        if (u[i] < 0x80) {
            cp = u[i++];
        } else if ((u[i] & 0xe0) == 0xc0 && i + 1 < n) {
            cp = ((u[i] & 0x1fu) << 6) | (u[i + 1] & 0x3fu);
            i += 2;
        } else {
            return -1;  // three-byte and longer characters are never in the alphabet
        }
        if (cp >= 324 || map[cp] < 0) return -1;
        out[o++] = (char)map[cp];
    }
    *len_p = o;
    return 0;
}

// ---- small JSON helpers ------------------------------------------------------------------
static l3d_status want_type(l3d_ctx_t *ctx, const char *origin, const char *key, json_t *v,
                            json_type t, const char *what) {
    if (v && json_typeof(v) == t) return L3D_OK;
    return l3d_error(ctx, L3D_ERR_FORMAT, "%s: %s %s", origin, key,
                     v ? (strcmp(what, "") ? what : "has the wrong type") : "is missing");
}

static int is_null_or_false(json_t *v) { return !v || json_is_null(v) || json_is_false(v); }

static int is_null_or_empty(json_t *v) {
    return !v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0);
}

static l3d_status read_json(l3d_ctx_t *ctx, const char *path, json_t **root_p, uint64_t *hash) {
    char *text = NULL;
    size_t len = 0;
    L3D_CHECK(ctx, l3d_input_read(ctx, path, NULL, MAX_FILE, &text, &len));
    *hash = l3d_fnv1a64(*hash, text, len);
    json_t *root;
    // tokenizer_config.json's model_max_length can be 1e30, beyond jansson's integers.
    l3d_status st = l3d_input_parse(ctx, path, NULL, text, len, JSON_DECODE_INT_AS_REAL, &root);
    free(text);
    L3D_CHECK(ctx, st);
    if (!json_is_object(root)) {
        json_decref(root);
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: not a JSON object", path);
    }
    *root_p = root;
    return L3D_OK;
}

// ---- tokenizer.json ----------------------------------------------------------------------
static l3d_status check_pre_tokenizer(l3d_ctx_t *ctx, const char *origin, json_t *pre,
                                      const char **pattern_p) {
    if (!pre || json_is_null(pre))
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: pre_tokenizer is missing (llama3d reads byte-level BPE)", origin);
    L3D_CHECK(ctx, want_type(ctx, origin, "pre_tokenizer", pre, JSON_OBJECT, ""));
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (!type) return l3d_error(ctx, L3D_ERR_FORMAT, "%s: pre_tokenizer.type is missing", origin);
    json_t *split = NULL, *bl = NULL;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pre, "pretokenizers");
        L3D_CHECK(ctx, want_type(ctx, origin, "pre_tokenizer.pretokenizers", list, JSON_ARRAY,
                                 ""));
        size_t n = json_array_size(list);
        for (size_t i = 0; i < n; i++) {
            json_t *p = json_array_get(list, i);
            const char *t = json_is_object(p) ? json_string_value(json_object_get(p, "type"))
                                              : NULL;
            if (t && !strcmp(t, "Split") && i == 0 && n == 2) split = p;
            else if (t && !strcmp(t, "ByteLevel") && i == n - 1) bl = p;
            else
                return l3d_error(ctx, L3D_ERR_FORMAT,
                                 "%s: pre_tokenizer.pretokenizers[%zu] (%s) is not supported: "
                                 "llama3d reads [Split, ByteLevel] or ByteLevel alone",
                                 origin, i, t ? t : "no type");
        }
        if (!bl || (n == 2 && !split))
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: pre_tokenizer Sequence is not [Split, ByteLevel]", origin);
    } else if (!strcmp(type, "ByteLevel")) {
        bl = pre;
    } else {
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: pre_tokenizer %s is not supported (llama3d reads byte-level BPE)",
                         origin, type);
    }
    if (!is_null_or_false(json_object_get(bl, "add_prefix_space")))
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: ByteLevel add_prefix_space true is not supported", origin);
    json_t *use_regex = json_object_get(bl, "use_regex");
    int uses = !use_regex || json_is_true(use_regex);  // HF's default is true
    if (split) {
        if (uses)
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: a Split followed by ByteLevel with use_regex true is not "
                             "supported", origin);
        json_t *pat = json_object_get(split, "pattern");
        const char *re = json_is_object(pat) ? json_string_value(json_object_get(pat, "Regex"))
                                              : NULL;
        if (!re)
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: pre_tokenizer Split.pattern.Regex is missing (a String "
                             "pattern is not supported)", origin);
        const char *beh = json_string_value(json_object_get(split, "behavior"));
        if (!beh || strcmp(beh, "Isolated"))
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: pre_tokenizer Split.behavior %s is not supported (Isolated is)",
                             origin, beh ? beh : "is missing and");
        if (!is_null_or_false(json_object_get(split, "invert")))
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: pre_tokenizer Split.invert true is not supported", origin);
        *pattern_p = re;
    } else {
        if (!uses)
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: ByteLevel without a regex splits nothing; not supported",
                             origin);
        *pattern_p = gpt2_pattern;
    }
    return L3D_OK;
}

static l3d_status check_model_keys(l3d_ctx_t *ctx, const char *origin, json_t *root,
                                   json_t *model) {
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type) {
        // Old files leave the type out; a BPE model is recognised by its merges.
        if (!json_object_get(model, "merges"))
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: model.type is missing", origin);
    } else if (strcmp(type, "BPE")) {
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: model.type %s is not supported (llama3d reads byte-level BPE)",
                         origin, type);
    }
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: model.byte_fallback true is not supported",
                         origin);
    static const char *const empty_keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++)
        if (!is_null_or_empty(json_object_get(model, empty_keys[i])))
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: model.%s is not supported", origin,
                             empty_keys[i]);
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm))
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: normalizer %s is not supported (byte-level BPE has none)", origin,
                         json_is_object(norm) && json_string_value(json_object_get(norm, "type"))
                             ? json_string_value(json_object_get(norm, "type"))
                             : "(not null)");
    json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec)) {
        const char *dt = json_is_object(dec) ? json_string_value(json_object_get(dec, "type"))
                                             : NULL;
        if (!dt || strcmp(dt, "ByteLevel"))
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: decoder %s is not supported (ByteLevel is)", origin,
                             dt ? dt : "without a type");
    }
    return L3D_OK;
}

// The id of a vocabulary entry (the alphabet's spelling), or -1.
static int32_t vocab_id(json_t *vocab, const char *key, size_t len) {
    json_t *v = json_object_getn(vocab, key, len);
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
}

static l3d_status read_merges(l3d_ctx_t *ctx, const char *origin, json_t *vocab, json_t *merges,
                              l3d_bpe_t *b) {
    size_t n = json_array_size(merges);
    char buf[1024];
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a = NULL, *c = NULL;
        size_t la = 0, lc = 0;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1])
                return l3d_error(ctx, L3D_ERR_FORMAT,
                                 "%s: model.merges[%zu] '%.80s' is not two tokens split by one "
                                 "space", origin, i, s);
            a = s;
            la = (size_t)(sp - s);
            c = sp + 1;
            lc = strlen(c);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            la = json_string_length(json_array_get(m, 0));
            c = json_string_value(json_array_get(m, 1));
            lc = json_string_length(json_array_get(m, 1));
        } else {
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]",
                             origin, i);
        }
        if (la + lc > sizeof(buf))
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: model.merges[%zu] is too long", origin, i);
        memcpy(buf, a, la);
        memcpy(buf + la, c, lc);
        int32_t ia = vocab_id(vocab, a, la), ic = vocab_id(vocab, c, lc);
        int32_t im = vocab_id(vocab, buf, la + lc);
        if (ia < 0 || ic < 0 || im < 0)
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: model.merges[%zu] '%.*s %.*s': '%.*s' is not in model.vocab",
                             origin, i, (int)la, a, (int)lc, c,
                             ia < 0 ? (int)la : ic < 0 ? (int)lc : (int)(la + lc),
                             ia < 0 ? a : ic < 0 ? c : buf);
        L3D_CHECK(ctx, l3d_bpe_add_pair(b, ia, ic, (int32_t)i, im));
    }
    return L3D_OK;
}

static l3d_status read_added(l3d_ctx_t *ctx, const char *origin, json_t *added, l3d_bpe_t *b) {
    size_t n = json_array_size(added);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(added, i);
        json_t *id = json_object_get(t, "id"), *content = json_object_get(t, "content");
        if (!json_is_integer(id) || !json_is_string(content) || !json_string_length(content))
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: added_tokens[%zu] needs an integer id and a non-empty "
                             "string content", origin, i);
        static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (size_t k = 0; k < 3; k++)
            if (!is_null_or_false(json_object_get(t, flags[k])))
                return l3d_error(ctx, L3D_ERR_FORMAT,
                                 "%s: added_tokens[%zu] '%s': %s true is not supported", origin,
                                 i, json_string_value(content), flags[k]);
        int32_t tid = (int32_t)json_integer_value(id);
        const char *s = json_string_value(content);
        size_t len = json_string_length(content);
        unsigned f = L3D_BPE_ADDED | (json_is_true(json_object_get(t, "special")) ? L3D_BPE_SPECIAL
                                                                                   : 0);
        // The same token in model.vocab stays reachable by BPE (GPT-2's <|endoftext|>).
        if ((b->flags[tid] & L3D_BPE_VOCAB) && b->tok_len[tid] == len &&
            !memcmp(b->blob + b->tok_off[tid], s, len))
            f |= L3D_BPE_VOCAB;
        L3D_CHECK(ctx, l3d_bpe_set_token(b, tid, s, len, f));
    }
    return L3D_OK;
}

// Largest id in model.vocab and added_tokens, checking each one's type and range.
static l3d_status max_id(l3d_ctx_t *ctx, const char *origin, json_t *vocab, json_t *added,
                         int32_t *max_p) {
    int64_t mx = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= (1 << 30))
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: model.vocab['%.80s'] is not an id in [0, 2^30)", origin, key);
        if (json_integer_value(v) > mx) mx = json_integer_value(v);
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *t = json_array_get(added, i);
        json_t *id = json_is_object(t) ? json_object_get(t, "id") : NULL;
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (1 << 30))
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: added_tokens[%zu].id is not an id in "
                             "[0, 2^30)", origin, i);
        if (json_integer_value(id) > mx) mx = json_integer_value(id);
    }
    if (mx < 0) return l3d_error(ctx, L3D_ERR_FORMAT, "%s: model.vocab is empty", origin);
    *max_p = (int32_t)mx;
    return L3D_OK;
}

static l3d_status read_vocab(l3d_ctx_t *ctx, const char *origin, json_t *vocab, l3d_bpe_t *b) {
    int16_t map[324];
    byte_alphabet(map);
    uint8_t *seen = l3d_calloc(ctx, (size_t)b->n_ids, 1, TAG);
    char *buf = NULL;
    size_t buf_cap = 0;
    l3d_status st = L3D_OK;
    if (!seen) return L3D_ERR_NOMEM;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        size_t len = strlen(key), out = 0;
        if (seen[id]) {
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: model.vocab gives id %d to two tokens",
                           origin, (int)id);
            goto out;
        }
        seen[id] = 1;
        if (len + 1 > buf_cap) {
            l3d_free(ctx, buf, buf_cap, TAG);
            buf_cap = len + 64;
            buf = l3d_malloc(ctx, buf_cap, TAG);
            if (!buf) {
                buf_cap = 0;
                st = L3D_ERR_NOMEM;
                goto out;
            }
        }
        // A token outside the alphabet cannot come out of byte-level BPE: it only decodes,
        // to its own text.
        if (alphabet_decode(map, key, len, buf, &out) == 0)
            L3D_CHECK_GOTO(ctx, l3d_bpe_set_token(b, id, buf, out, L3D_BPE_VOCAB), st, out);
        else
            L3D_CHECK_GOTO(ctx, l3d_bpe_set_token(b, id, key, len, 0), st, out);
    }
out:
    l3d_free(ctx, buf, buf_cap, TAG);
    l3d_free(ctx, seen, (size_t)b->n_ids, TAG);
    return st;
}

static l3d_status load_hf_json(l3d_ctx_t *ctx, const char *path, json_t *root, l3d_bpe_t **b_p) {
    json_t *model = json_object_get(root, "model");
    L3D_CHECK(ctx, want_type(ctx, path, "model", model, JSON_OBJECT, ""));
    L3D_CHECK(ctx, check_model_keys(ctx, path, root, model));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    L3D_CHECK(ctx, want_type(ctx, path, "model.vocab", vocab, JSON_OBJECT, "is not an object"));
    L3D_CHECK(ctx, want_type(ctx, path, "model.merges", merges, JSON_ARRAY, "is not an array"));
    if (added && !json_is_null(added))
        L3D_CHECK(ctx, want_type(ctx, path, "added_tokens", added, JSON_ARRAY, "is not an array"));
    json_t *im = json_object_get(model, "ignore_merges");
    if (im && !json_is_boolean(im))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: model.ignore_merges is not a boolean", path);
    const char *pattern = NULL;
    L3D_CHECK(ctx, check_pre_tokenizer(ctx, path, json_object_get(root, "pre_tokenizer"),
                                       &pattern));
    int32_t mx = 0;
    L3D_CHECK(ctx, max_id(ctx, path, vocab, added, &mx));
    l3d_bpe_t *b = NULL;
    L3D_CHECK(ctx, l3d_bpe_new(ctx, mx + 1, json_array_size(merges), &b));
    l3d_status st = L3D_OK;
    b->ignore_merges = json_is_true(im);
    L3D_CHECK_GOTO(ctx, read_vocab(ctx, path, vocab, b), st, fail);
    L3D_CHECK_GOTO(ctx, read_merges(ctx, path, vocab, merges, b), st, fail);
    L3D_CHECK_GOTO(ctx, read_added(ctx, path, added, b), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_bpe_set_regex(b, pattern, path), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_bpe_finish(b, path), st, fail);
    *b_p = b;
    return L3D_OK;
fail:
    l3d_bpe_free(b);
    return st;
}

// ---- tokenizer.model (tiktoken) ----------------------------------------------------------
static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// Standard base64 with padding; returns the decoded length or -1.
static long b64_decode(const char *s, size_t n, char *out) {
    if (n == 0 || n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)s[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else {
                if (pad) return -1;  // data after '='
                v[k] = b64_value(c);
                if (v[k] < 0) return -1;
            }
        }
        uint32_t w = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) | ((uint32_t)v[2] << 6) |
                     (uint32_t)v[3];
        out[o++] = (char)(w >> 16);
        if (pad < 2) out[o++] = (char)(w >> 8);
        if (pad < 1) out[o++] = (char)w;
    }
    return (long)o;
}

// The special tokens after the ranks, as Hugging Face's Llama 3.1 tokenizer.json names them;
// tokenizer_config.json's added_tokens_decoder overrides the texts where present (Llama 3.0
// has reserved tokens where 3.1 has <|finetune_right_pad_id|>, <|eom_id|>, <|python_tag|>).
static void llama3_special_name(int i, char *out, size_t cap) {
    static const char *const first[] = {
        "<|begin_of_text|>",   "<|end_of_text|>",
        "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",    "<|reserved_special_token_2|>",
        "<|start_header_id|>", "<|end_header_id|>",
        "<|eom_id|>",          "<|eot_id|>",
        "<|python_tag|>",
    };
    if (i < 11) snprintf(out, cap, "%s", first[i]);
    else snprintf(out, cap, "<|reserved_special_token_%d|>", i - 11 + 3);
}

#define LLAMA3_N_SPECIAL 256

static l3d_status load_tiktoken(l3d_ctx_t *ctx, const char *path, const char *text, size_t len,
                                json_t *config, l3d_bpe_t **b_p) {
    size_t n_lines = 0;
    for (size_t i = 0; i < len; i++) n_lines += text[i] == '\n';
    if (len && text[len - 1] != '\n') n_lines++;
    if (n_lines == 0) return l3d_error(ctx, L3D_ERR_FORMAT, "%s: no tokens", path);
    if (n_lines >= (1u << 30) - LLAMA3_N_SPECIAL)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: %zu lines is too many", path, n_lines);
    l3d_bpe_t *b = NULL;
    L3D_CHECK(ctx, l3d_bpe_new(ctx, (int32_t)(n_lines + LLAMA3_N_SPECIAL), 4 * n_lines, &b));
    l3d_status st = L3D_OK;
    uint8_t *seen = l3d_calloc(ctx, n_lines, 1, TAG);
    if (!seen) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    b->ignore_merges = 1;  // tiktoken looks a piece up whole before merging
    size_t line = 0, n_ranks = 0;
    char tokbuf[768];
    for (size_t at = 0; at < len; line++) {
        const char *s = text + at;
        const char *nl = memchr(s, '\n', len - at);
        size_t ll = nl ? (size_t)(nl - s) : len - at;
        at += ll + (nl ? 1 : 0);
        if (ll && s[ll - 1] == '\r') ll--;
        if (ll == 0 && at >= len) break;  // a blank last line
        const char *sp = memchr(s, ' ', ll);
        if (!sp || sp == s) {
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: line %zu is not \"base64-token rank\"",
                           path, line + 1);
            goto fail;
        }
        size_t bl = (size_t)(sp - s);
        long tl = bl / 4 * 3 <= sizeof(tokbuf) ? b64_decode(s, bl, tokbuf) : -1;
        if (tl <= 0) {
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: line %zu: '%.*s' is not base64 of a token",
                           path, line + 1, (int)(bl > 60 ? 60 : bl), s);
            goto fail;
        }
        unsigned long long rank = 0;
        size_t k = bl + 1;
        if (k >= ll) rank = ~0ull;
        for (; k < ll && rank < n_lines; k++) {
            if (s[k] < '0' || s[k] > '9') {
                rank = ~0ull;
                break;
            }
            rank = rank * 10 + (unsigned)(s[k] - '0');
        }
        if (rank >= n_lines || seen[rank]) {
            st = l3d_error(ctx, L3D_ERR_FORMAT,
                           "%s: line %zu: the rank is not a number in [0, %zu) given once",
                           path, line + 1, n_lines);
            goto fail;
        }
        seen[rank] = 1;
        n_ranks++;
        L3D_CHECK_GOTO(ctx, l3d_bpe_set_token(b, (int32_t)rank, tokbuf, (size_t)tl, L3D_BPE_VOCAB),
                       st, fail);
    }
    if (n_ranks != n_lines) {
        // A blank line in the middle (or an empty file body): ranks must be 0..N-1.
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: %zu ranks on %zu lines; ranks must be 0..N-1",
                       path, n_ranks, n_lines);
        goto fail;
    }
    json_t *dec = config ? json_object_get(config, "added_tokens_decoder") : NULL;
    for (int i = 0; i < LLAMA3_N_SPECIAL; i++) {
        char name[64], key[24];
        llama3_special_name(i, name, sizeof(name));
        const char *text_i = name;
        snprintf(key, sizeof(key), "%zu", n_lines + (size_t)i);
        json_t *e = json_is_object(dec) ? json_object_get(dec, key) : NULL;
        if (e && json_is_string(json_object_get(e, "content")))
            text_i = json_string_value(json_object_get(e, "content"));
        L3D_CHECK_GOTO(ctx, l3d_bpe_set_token(b, (int32_t)(n_lines + (size_t)i), text_i,
                                              strlen(text_i), L3D_BPE_ADDED | L3D_BPE_SPECIAL),
                       st, fail);
    }
    L3D_CHECK_GOTO(ctx, l3d_bpe_set_regex(b, l3d_llama3_pattern, path), st, fail);
    L3D_CHECK_GOTO(ctx, l3d_bpe_finish(b, path), st, fail);
    // tiktoken merges the adjacent pair whose concatenation has the lowest rank: every split
    // of a token into two tokens is a merge at that token's rank.
    for (int32_t id = 0; id < (int32_t)n_lines; id++) {
        const char *t = b->blob + b->tok_off[id];
        size_t tl = b->tok_len[id];
        for (size_t k = 1; k < tl; k++) {
            int32_t x = l3d_bpe_lookup(b, t, k), y = l3d_bpe_lookup(b, t + k, tl - k);
            if (x >= 0 && y >= 0) L3D_CHECK_GOTO(ctx, l3d_bpe_add_pair(b, x, y, id, id), st, fail);
        }
    }
    l3d_free(ctx, seen, n_lines, TAG);
    *b_p = b;
    return L3D_OK;
fail:
    l3d_free(ctx, seen, n_lines, TAG);
    l3d_bpe_free(b);
    return st;
}

// ---- tokenizer_config.json and the special ids -------------------------------------------
// A token named by tokenizer_config.json: a string, or an AddedToken object's "content".
static const char *config_token(json_t *config, const char *key) {
    json_t *v = config ? json_object_get(config, key) : NULL;
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

static l3d_status config_id(l3d_tokenizer_t *tok, json_t *config, const char *key,
                            const char *fallback, const char *origin, int32_t *id_p) {
    const char *name = config_token(config, key);
    json_t *v = config ? json_object_get(config, key) : NULL;
    if (v && !json_is_null(v) && !name)
        return l3d_error(tok->ctx, L3D_ERR_FORMAT, "%s: %s is neither a string nor a token",
                         origin, key);
    *id_p = -1;
    if (!name) name = fallback;
    if (!name) return L3D_OK;
    int32_t id = tok->ops->find(tok, name, strlen(name));
    if (id < 0 && v)
        return l3d_error(tok->ctx, L3D_ERR_FORMAT, "%s: %s '%s' is not a token of the tokenizer",
                         origin, key, name);
    *id_p = id;
    return L3D_OK;
}

static l3d_status set_specials(l3d_tokenizer_t *tok, json_t *config, const char *cfg_path) {
    l3d_tokenizer_special_t *sp = &tok->special;
    const char *origin = cfg_path ? cfg_path : "tokenizer";
    L3D_CHECK(tok->ctx, config_id(tok, config, "bos_token", "<|begin_of_text|>", origin,
                                  &sp->bos_id));
    L3D_CHECK(tok->ctx, config_id(tok, config, "eos_token", "<|end_of_text|>", origin,
                                  &sp->eos_id));
    L3D_CHECK(tok->ctx, config_id(tok, config, "pad_token", NULL, origin, &sp->pad_id));
    sp->eot_id = tok->ops->find(tok, "<|eot_id|>", 10);
    int32_t eom = tok->ops->find(tok, "<|eom_id|>", 10);
    int32_t stops[3] = {sp->eos_id, sp->eot_id, eom};
    sp->n_stop = 0;
    for (int i = 0; i < 3; i++) {
        int dup = stops[i] < 0;
        for (int k = 0; k < sp->n_stop; k++) dup |= sp->stop_ids[k] == stops[i];
        if (!dup) sp->stop_ids[sp->n_stop++] = stops[i];
    }
    tok->bos_id = sp->bos_id;
    tok->eos_id = sp->eos_id;
    tok->pad_id = sp->pad_id;
    tok->chat = L3D_CHAT_NONE;
    json_t *tmpl = config ? json_object_get(config, "chat_template") : NULL;
    if (json_is_array(tmpl)) {  // [{"name", "template"}]: the one named "default"
        json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(tmpl); i++) {
            json_t *e = json_array_get(tmpl, i);
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (nm && !strcmp(nm, "default")) pick = json_object_get(e, "template");
        }
        tmpl = pick;
    }
    if (tmpl && json_is_string(tmpl)) {
        // An unknown template is not an error until someone asks for chat: the tokenizer is
        // still good for plain text.
        l3d_chat_template_t kind = L3D_CHAT_NONE;
        l3d_status st = l3d_chat_template_recognise(tok->ctx, json_string_value(tmpl),
                                                    json_string_length(tmpl), origin, &kind);
        tok->chat = st == L3D_OK ? kind : L3D_CHAT_NONE;
        if (st != L3D_OK)
            snprintf(tok->chat_error, sizeof(tok->chat_error), "%s", l3d_ctx_last_error(tok->ctx));
    }
    return L3D_OK;
}

// ---- opening a path ----------------------------------------------------------------------
static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

// Whether there is an entry under this name, whatever it is: a tokenizer file that is a FIFO,
// a directory or a symlink loop is read, and refused as such, never taken for an absent file.
static int present(const char *p) { return l3d_path_present(p); }

int l3d_tokenizer_dir_has(const char *dir) {
    static const char *const names[] = {"tokenizer.json", "tokenizer.model",
                                        "original/tokenizer.model"};
    char file[4096];
    if (!dir || !is_dir(dir)) return 0;
    for (size_t k = 0; k < 3; k++) {
        snprintf(file, sizeof(file), "%s/%s", dir, names[k]);
        if (present(file)) return 1;
    }
    return 0;
}

l3d_status l3d_tokenizer_open(l3d_ctx_t *ctx, const char *path, l3d_tokenizer_t **tok_p) {
    if (!ctx || !path || !tok_p)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "tokenizer open: null argument");
    char file[4096], cfg[4096];
    if (is_dir(path)) {
        static const char *const names[] = {"tokenizer.json", "tokenizer.model",
                                            "original/tokenizer.model"};
        size_t k = 0;
        for (; k < 3; k++) {
            snprintf(file, sizeof(file), "%s/%s", path, names[k]);
            if (present(file)) break;
        }
        if (k == 3)
            return l3d_error(ctx, L3D_ERR_NOT_FOUND,
                             "%s: no tokenizer.json or tokenizer.model in the directory", path);
        snprintf(cfg, sizeof(cfg), "%s/tokenizer_config.json", path);
    } else {
        if (snprintf(file, sizeof(file), "%s", path) >= (int)sizeof(file))
            return l3d_error(ctx, L3D_ERR_INVALID_ARG, "tokenizer path is too long");
        const char *slash = strrchr(path, '/');
        snprintf(cfg, sizeof(cfg), "%.*stokenizer_config.json",
                 slash ? (int)(slash - path + 1) : 0, path);
        if (!present(cfg) && slash && slash - path >= 9 && !strncmp(slash - 9, "/original", 9))
            snprintf(cfg, sizeof(cfg), "%.*stokenizer_config.json", (int)(slash - path - 8),
                     path);  // Meta's original/tokenizer.model: the config is one level up
    }
    uint64_t hash = 0xcbf29ce484222325ull;
    json_t *config = NULL, *root = NULL;
    l3d_bpe_t *b = NULL;
    l3d_tokenizer_t *tok = NULL;
    l3d_status st = L3D_OK;
    int have_cfg = present(cfg);
    if (have_cfg) L3D_CHECK(ctx, read_json(ctx, cfg, &config, &hash));
    char *text = NULL;
    size_t len = 0;
    L3D_CHECK_GOTO(ctx, l3d_input_read(ctx, file, NULL, MAX_FILE, &text, &len), st, out);
    hash = l3d_fnv1a64(hash, text, len);
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
        i++;
    // JSON when it is named so or opens like JSON (whatever its name): its errors are then
    // JSON's, never the tiktoken reader's "line 1 is not base64-token rank". A tiktoken line
    // starts with base64, which has neither brace nor bracket.
    size_t fl = strlen(file);
    int json = (fl >= 5 && !strcmp(file + fl - 5, ".json")) ||
               (i < len && (text[i] == '{' || text[i] == '['));
    if (json) {
        st = l3d_input_parse(ctx, file, NULL, text, len, 0, &root);
        free(text);
        text = NULL;
        if (st < 0) goto out;
        if (!json_is_object(root)) {
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: not a JSON object (a tokenizer.json is "
                           "{\"model\": ..., \"added_tokens\": ...})", file);
            goto out;
        }
        L3D_CHECK_GOTO(ctx, load_hf_json(ctx, file, root, &b), st, out);
    } else {
        L3D_CHECK_GOTO(ctx, load_tiktoken(ctx, file, text, len, config, &b), st, out);
    }
    L3D_CHECK_GOTO(ctx, l3d_bpe_tokenizer(ctx, b, &tok), st, out);
    b = NULL;  // the tokenizer owns it now
    snprintf(tok->key, sizeof(tok->key), "bpe-%016llx", (unsigned long long)hash);
    L3D_CHECK_GOTO(ctx, set_specials(tok, config, have_cfg ? cfg : NULL), st, out);
    *tok_p = tok;
    tok = NULL;
out:
    free(text);
    json_decref(root);
    json_decref(config);
    l3d_bpe_free(b);
    l3d_tokenizer_destroy(tok);
    return st;
}
