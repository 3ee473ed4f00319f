// Byte-level BPE encoding and decoding (Llama 3's tokenizer), over the tables of
// core/text/tokenizer_bpe.h.
//
// encode(text):
//   1. added tokens are cut out of the text first (leftmost, then longest match; special ones
//      only with L3D_TOKENIZE_SPECIAL), as Hugging Face's AddedVocabulary does;
//   2. each stretch between them is split at invalid UTF-8 bytes, each of which becomes its
//      single-byte token (our rule: HF's tokenizers only take valid strings);
//   3. valid runs are cut into pieces by the pre-tokenizer regex (matches and the gaps between
//      them, HF's Split "Isolated");
//   4. a piece that is a token is that token (ignore_merges / tiktoken); otherwise its bytes
//      are merged pair by pair, always the lowest-ranked adjacent pair, leftmost first.
// The tokenizer is not modified by encoding: every scratch buffer belongs to the call.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "core/l3d_core.h"
#include "core/text/tokenizer_bpe.h"

#define TAG "tokenizer"

const char l3d_llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// ---- hashing -----------------------------------------------------------------------------
static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

static uint32_t hash_pair(uint64_t key) {
    key *= 0x9e3779b97f4a7c15ull;
    return (uint32_t)(key >> 32) ^ (uint32_t)key;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

// ---- building the tables -----------------------------------------------------------------
l3d_status l3d_bpe_new(l3d_ctx_t *ctx, int32_t n_ids, size_t n_pairs, l3d_bpe_t **b_p) {
    if (n_ids <= 0 || n_ids > (1 << 30))
        return l3d_error(ctx, L3D_ERR_FORMAT, "a vocabulary of %d tokens", (int)n_ids);
    l3d_bpe_t *b = l3d_calloc(ctx, 1, sizeof(*b), TAG);
    if (!b) return L3D_ERR_NOMEM;
    b->ctx = ctx;
    b->n_ids = n_ids;
    b->tok_off = l3d_calloc(ctx, (size_t)n_ids, sizeof(uint32_t), TAG);
    b->tok_len = l3d_calloc(ctx, (size_t)n_ids, sizeof(uint32_t), TAG);
    b->flags = l3d_calloc(ctx, (size_t)n_ids, 1, TAG);
    // Load factor <= 1/2 keeps probe chains short.
    b->pair_cap = pow2_at_least(2 * (n_pairs + 1));
    b->pair_mask = (uint32_t)(b->pair_cap - 1);
    b->pairs = l3d_malloc(ctx, b->pair_cap * sizeof(l3d_bpe_pair_t), TAG);
    b->cap_nodes = 64;
    b->trie = l3d_malloc(ctx, (size_t)b->cap_nodes * sizeof(l3d_bpe_trie_t), TAG);
    if (!b->tok_off || !b->tok_len || !b->flags || !b->pairs || !b->trie) {
        l3d_bpe_free(b);
        return L3D_ERR_NOMEM;
    }
    memset(b->pairs, 0xff, b->pair_cap * sizeof(l3d_bpe_pair_t));
    b->trie[0] = (l3d_bpe_trie_t){.child = -1, .sibling = -1, .id = -1};
    b->n_nodes = 1;
    for (int i = 0; i < 256; i++) b->byte_id[i] = -1;
    *b_p = b;
    return L3D_OK;
}

void l3d_bpe_free(l3d_bpe_t *b) {
    if (!b) return;
    l3d_ctx_t *ctx = b->ctx;
    size_t n = (size_t)b->n_ids;
    if (b->re) pcre2_code_free((pcre2_code *)b->re);
    l3d_free(ctx, b->blob, b->blob_cap, TAG);
    l3d_free(ctx, b->tok_off, n * sizeof(uint32_t), TAG);
    l3d_free(ctx, b->tok_len, n * sizeof(uint32_t), TAG);
    l3d_free(ctx, b->flags, n, TAG);
    if (b->vmap) l3d_free(ctx, b->vmap, ((size_t)b->vmap_mask + 1) * sizeof(int32_t), TAG);
    l3d_free(ctx, b->pairs, b->pair_cap * sizeof(l3d_bpe_pair_t), TAG);
    l3d_free(ctx, b->trie, (size_t)b->cap_nodes * sizeof(l3d_bpe_trie_t), TAG);
    l3d_free(ctx, b, sizeof(*b), TAG);
}

l3d_status l3d_bpe_set_token(l3d_bpe_t *b, int32_t id, const char *bytes, size_t len,
                             unsigned flags) {
    if (id < 0 || id >= b->n_ids)
        return l3d_error(b->ctx, L3D_ERR_INTERNAL, "bpe token id %d out of range", (int)id);
    if (len > UINT32_MAX / 2 || b->blob_len + len > UINT32_MAX)
        return l3d_error(b->ctx, L3D_ERR_FORMAT, "token %d: %zu bytes is too long", (int)id,
                         len);
    if (b->blob_len + len > b->blob_cap) {
        size_t cap = b->blob_cap ? b->blob_cap * 2 : 1 << 16;
        while (cap < b->blob_len + len) cap *= 2;
        char *nb = l3d_malloc(b->ctx, cap, TAG);
        if (!nb) return L3D_ERR_NOMEM;
        if (b->blob_len) memcpy(nb, b->blob, b->blob_len);
        l3d_free(b->ctx, b->blob, b->blob_cap, TAG);
        b->blob = nb;
        b->blob_cap = cap;
    }
    if (len) memcpy(b->blob + b->blob_len, bytes, len);
    b->tok_off[id] = (uint32_t)b->blob_len;
    b->tok_len[id] = (uint32_t)len;
    b->blob_len += len;
    b->flags[id] = (uint8_t)flags;
    return L3D_OK;
}

l3d_status l3d_bpe_add_pair(l3d_bpe_t *b, int32_t a, int32_t bb, int32_t rank, int32_t id) {
    if (b->n_pairs + 1 > b->pair_cap / 2) {  // more merges than announced: grow
        size_t cap = b->pair_cap * 2;
        l3d_bpe_pair_t *np = l3d_malloc(b->ctx, cap * sizeof(*np), TAG);
        if (!np) return L3D_ERR_NOMEM;
        memset(np, 0xff, cap * sizeof(*np));
        uint32_t mask = (uint32_t)(cap - 1);
        for (size_t i = 0; i < b->pair_cap; i++) {
            if (b->pairs[i].key == UINT64_MAX) continue;
            uint32_t h = hash_pair(b->pairs[i].key) & mask;
            while (np[h].key != UINT64_MAX) h = (h + 1) & mask;
            np[h] = b->pairs[i];
        }
        l3d_free(b->ctx, b->pairs, b->pair_cap * sizeof(*np), TAG);
        b->pairs = np;
        b->pair_cap = cap;
        b->pair_mask = mask;
    }
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)bb;
    uint32_t h = hash_pair(key) & b->pair_mask;
    while (b->pairs[h].key != UINT64_MAX) {
        if (b->pairs[h].key == key) return L3D_OK;  // HF keeps the first rank of a pair
        h = (h + 1) & b->pair_mask;
    }
    b->pairs[h] = (l3d_bpe_pair_t){.key = key, .rank = rank, .id = id};
    b->n_pairs++;
    return L3D_OK;
}

const l3d_bpe_pair_t *l3d_bpe_pair(const l3d_bpe_t *b, int32_t a, int32_t bb) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)bb;
    uint32_t h = hash_pair(key) & b->pair_mask;
    for (;;) {
        const l3d_bpe_pair_t *p = &b->pairs[h];
        if (p->key == key) return p;
        if (p->key == UINT64_MAX) return NULL;
        h = (h + 1) & b->pair_mask;
    }
}

int32_t l3d_bpe_lookup(const l3d_bpe_t *b, const char *s, size_t len) {
    uint32_t h = (uint32_t)hash_bytes((const unsigned char *)s, len) & b->vmap_mask;
    for (;;) {
        int32_t id = b->vmap[h];
        if (id < 0) return -1;
        if (b->tok_len[id] == len && !memcmp(b->blob + b->tok_off[id], s, len)) return id;
        h = (h + 1) & b->vmap_mask;
    }
}

static l3d_status trie_add(l3d_bpe_t *b, int32_t id) {
    const unsigned char *s = (const unsigned char *)b->blob + b->tok_off[id];
    size_t len = b->tok_len[id];
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t c = b->trie[node].child;
        while (c >= 0 && b->trie[c].byte != s[i]) c = b->trie[c].sibling;
        if (c < 0) {
            if (b->n_nodes == b->cap_nodes) {
                int32_t cap = b->cap_nodes * 2;
                l3d_bpe_trie_t *nt = l3d_malloc(b->ctx, (size_t)cap * sizeof(*nt), TAG);
                if (!nt) return L3D_ERR_NOMEM;
                memcpy(nt, b->trie, (size_t)b->n_nodes * sizeof(*nt));
                l3d_free(b->ctx, b->trie, (size_t)b->cap_nodes * sizeof(*nt), TAG);
                b->trie = nt;
                b->cap_nodes = cap;
            }
            c = b->n_nodes++;
            b->trie[c] = (l3d_bpe_trie_t){.child = -1, .sibling = b->trie[node].child,
                                          .id = -1, .byte = s[i]};
            b->trie[node].child = c;
        }
        node = c;
    }
    if (b->trie[node].id < 0) b->trie[node].id = id;  // two added tokens, one text: the first
    b->first_byte[s[0]] = 1;
    return L3D_OK;
}

l3d_status l3d_bpe_finish(l3d_bpe_t *b, const char *origin) {
    size_t n_vocab = 0;
    for (int32_t id = 0; id < b->n_ids; id++) n_vocab += (b->flags[id] & L3D_BPE_VOCAB) != 0;
    size_t cap = pow2_at_least(2 * n_vocab + 2);
    b->vmap = l3d_malloc(b->ctx, cap * sizeof(int32_t), TAG);
    if (!b->vmap) return L3D_ERR_NOMEM;
    memset(b->vmap, 0xff, cap * sizeof(int32_t));
    b->vmap_mask = (uint32_t)(cap - 1);
    for (int32_t id = 0; id < b->n_ids; id++) {
        if (!(b->flags[id] & L3D_BPE_VOCAB)) continue;
        const char *s = b->blob + b->tok_off[id];
        size_t len = b->tok_len[id];
        if (len == 0)
            return l3d_error(b->ctx, L3D_ERR_FORMAT, "%s: token %d is empty", origin, (int)id);
        if (l3d_bpe_lookup(b, s, len) >= 0)
            return l3d_error(b->ctx, L3D_ERR_FORMAT, "%s: tokens %d and %d have the same bytes",
                             origin, (int)l3d_bpe_lookup(b, s, len), (int)id);
        uint32_t h = (uint32_t)hash_bytes((const unsigned char *)s, len) & b->vmap_mask;
        while (b->vmap[h] >= 0) h = (h + 1) & b->vmap_mask;
        b->vmap[h] = id;
    }
    for (int c = 0; c < 256; c++) {
        char byte = (char)c;
        b->byte_id[c] = l3d_bpe_lookup(b, &byte, 1);
        if (b->byte_id[c] < 0)
            return l3d_error(b->ctx, L3D_ERR_FORMAT,
                             "%s: no token for the single byte 0x%02x (byte-level BPE needs all "
                             "256)", origin, c);
    }
    for (int32_t id = 0; id < b->n_ids; id++) {
        if (!(b->flags[id] & L3D_BPE_ADDED)) continue;
        if (b->tok_len[id] == 0)
            return l3d_error(b->ctx, L3D_ERR_FORMAT, "%s: added token %d is empty", origin,
                             (int)id);
        L3D_CHECK(b->ctx, trie_add(b, id));
    }
    if (!b->re)
        return l3d_error(b->ctx, L3D_ERR_INTERNAL, "%s: no pre-tokenizer pattern", origin);
    return L3D_OK;
}

l3d_status l3d_bpe_set_regex(l3d_bpe_t *b, const char *pattern, const char *origin) {
    // Rewrite \s and \S as Unicode White_Space: PCRE2's \s under UCP also takes U+180E,
    // which Hugging Face's tokenizers (Oniguruma) and tiktoken (Rust regex) do not.
    size_t n = strlen(pattern), cap = n * 8 + 1;
    char *pat = l3d_malloc(b->ctx, cap, TAG);
    if (!pat) return L3D_ERR_NOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (pattern[i] == '\\' && i + 1 < n && (pattern[i + 1] == 's' || pattern[i + 1] == 'S')) {
            o += (size_t)snprintf(pat + o, cap - o, "\\%c{White_Space}",
                                  pattern[i + 1] == 's' ? 'p' : 'P');
            i++;
        } else if (pattern[i] == '\\' && i + 1 < n) {  // any other escape stays whole
            pat[o++] = pattern[i++];
            pat[o++] = pattern[i];
        } else {
            pat[o++] = pattern[i];
        }
    }
    pat[o] = 0;
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, o, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    l3d_free(b->ctx, pat, cap, TAG);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return l3d_error(b->ctx, L3D_ERR_FORMAT,
                         "%s: the pre-tokenizer regex is refused by PCRE2 (%s, near offset %zu)",
                         origin, (const char *)msg, (size_t)at);
    }
    if (b->re) pcre2_code_free((pcre2_code *)b->re);
    b->re = re;
    // JIT where the platform has it; the interpreter gives the same matches, slower.
    b->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    return L3D_OK;
}

// ---- encoding ----------------------------------------------------------------------------
typedef struct enc {
    const l3d_bpe_t *b;
    l3d_ctx_t *ctx;
    int32_t **ids_p;
    size_t *n_p, *cap_p;
    pcre2_match_data *md;
    // BPE scratch, grown per call: symbols of the piece being merged.
    int32_t *sym;    // ids
    int32_t *next;   // linked list for long pieces
    int32_t *prev;
    int32_t *rank;   // rank of (sym[i], sym[next]) for short pieces
    uint64_t *heap;  // (rank << 32 | position) for long pieces
    size_t scratch;  // capacity of each array
} enc_t;

static inline l3d_status put(enc_t *e, int32_t id) {
    if (*e->n_p == *e->cap_p)
        L3D_CHECK(e->ctx, l3d_tokens_reserve(e->ctx, e->ids_p, *e->n_p, e->cap_p, *e->n_p + 1));
    (*e->ids_p)[(*e->n_p)++] = id;
    return L3D_OK;
}

static void scratch_free(enc_t *e) {
    size_t n = e->scratch;
    if (!n) return;
    l3d_free(e->ctx, e->sym, n * sizeof(int32_t), TAG);
    l3d_free(e->ctx, e->next, n * sizeof(int32_t), TAG);
    l3d_free(e->ctx, e->prev, n * sizeof(int32_t), TAG);
    l3d_free(e->ctx, e->rank, n * sizeof(int32_t), TAG);
    l3d_free(e->ctx, e->heap, 3 * n * sizeof(uint64_t), TAG);
    e->scratch = 0;
}

static l3d_status scratch_reserve(enc_t *e, size_t n) {
    if (n <= e->scratch) return L3D_OK;
    size_t cap = e->scratch ? e->scratch : 256;
    while (cap < n) cap *= 2;
    scratch_free(e);
    e->sym = l3d_malloc(e->ctx, cap * sizeof(int32_t), TAG);
    e->next = l3d_malloc(e->ctx, cap * sizeof(int32_t), TAG);
    e->prev = l3d_malloc(e->ctx, cap * sizeof(int32_t), TAG);
    e->rank = l3d_malloc(e->ctx, cap * sizeof(int32_t), TAG);
    // A merge pushes at most two pairs, so 3n entries always suffice.
    e->heap = l3d_malloc(e->ctx, 3 * cap * sizeof(uint64_t), TAG);
    e->scratch = cap;
    if (!e->sym || !e->next || !e->prev || !e->rank || !e->heap) {
        // Free what was allocated; the NULLs are fine for l3d_free.
        scratch_free(e);
        return L3D_ERR_NOMEM;
    }
    return L3D_OK;
}

static inline int32_t pair_rank(const l3d_bpe_t *b, int32_t x, int32_t y) {
    const l3d_bpe_pair_t *p = l3d_bpe_pair(b, x, y);
    return p ? p->rank : INT32_MAX;
}

// Short pieces (the usual case): arrays, the minimum found by a scan, as tiktoken does.
static l3d_status merge_short(enc_t *e, size_t n) {
    const l3d_bpe_t *b = e->b;
    int32_t *sym = e->sym, *rank = e->rank;
    for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(b, sym[i], sym[i + 1]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT32_MAX) break;
        sym[best] = l3d_bpe_pair(b, sym[best], sym[best + 1])->id;
        memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof(int32_t));
        memmove(rank + best + 1, rank + best + 2, (n > best + 3 ? n - best - 3 : 0) *
                                                       sizeof(int32_t));
        n--;
        if (best > 0) rank[best - 1] = pair_rank(b, sym[best - 1], sym[best]);
        if (best + 1 < n) rank[best] = pair_rank(b, sym[best], sym[best + 1]);
    }
    for (size_t i = 0; i < n; i++) L3D_CHECK(e->ctx, put(e, sym[i]));
    return L3D_OK;
}

// A binary min-heap of (rank << 32 | left position): lowest rank, then leftmost.
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

// Long pieces (whitespace runs, long words): a linked list and a heap, O(n log n). Entries
// are checked when popped: a pair whose left symbol changed, or whose right neighbour did,
// is stale (its rank is recomputed from the current symbols and compared).
static l3d_status merge_long(enc_t *e, size_t n) {
    const l3d_bpe_t *b = e->b;
    int32_t *sym = e->sym, *next = e->next, *prev = e->prev;
    uint64_t *heap = e->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = pair_rank(b, sym[i], sym[i + 1]);
        if (r != INT32_MAX) heap_push(heap, &hn, ((uint64_t)(uint32_t)r << 32) | i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        int32_t r = (int32_t)(top >> 32), i = (int32_t)(uint32_t)top;
        if (sym[i] < 0 || next[i] < 0) continue;  // merged away
        const l3d_bpe_pair_t *p = l3d_bpe_pair(b, sym[i], sym[next[i]]);
        if (!p || p->rank != r) continue;  // stale
        int32_t j = next[i];
        sym[i] = p->id;
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        if (prev[i] >= 0) {
            int32_t rl = pair_rank(b, sym[prev[i]], sym[i]);
            if (rl != INT32_MAX)
                heap_push(heap, &hn, ((uint64_t)(uint32_t)rl << 32) | (uint32_t)prev[i]);
        }
        if (next[i] >= 0) {
            int32_t rr = pair_rank(b, sym[i], sym[next[i]]);
            if (rr != INT32_MAX) heap_push(heap, &hn, ((uint64_t)(uint32_t)rr << 32) | (uint32_t)i);
        }
    }
    for (int32_t i = 0; i >= 0; i = next[i]) L3D_CHECK(e->ctx, put(e, sym[i]));
    return L3D_OK;
}

#define SHORT_PIECE 48

static l3d_status encode_piece(enc_t *e, const char *s, size_t n) {
    const l3d_bpe_t *b = e->b;
    if (n == 1) return put(e, b->byte_id[(unsigned char)s[0]]);
    if (b->ignore_merges) {
        int32_t id = l3d_bpe_lookup(b, s, n);
        if (id >= 0) return put(e, id);
    }
    L3D_CHECK(e->ctx, scratch_reserve(e, n));
    for (size_t i = 0; i < n; i++) e->sym[i] = b->byte_id[(unsigned char)s[i]];
    return n <= SHORT_PIECE ? merge_short(e, n) : merge_long(e, n);
}

static size_t utf8_char_len(unsigned char c) {
    return c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
}

// Pre-tokenizes a valid UTF-8 run and encodes each piece.
static l3d_status encode_valid(enc_t *e, const char *s, size_t n) {
    const l3d_bpe_t *b = e->b;
    const pcre2_code *re = b->re;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    size_t gap = 0, from = 0;
    while (from < n) {
        int rc = b->jit ? pcre2_jit_match(re, (PCRE2_SPTR)s, n, from, 0, e->md, NULL)
                        : PCRE2_ERROR_JIT_BADOPTION;
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // no JIT, or its stack ran out: interpret
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return l3d_error(e->ctx, L3D_ERR_UNSUPPORTED,
                             "tokenizer: the pre-tokenizer regex failed on the text at byte %zu: "
                             "%s", from, (const char *)msg);
        }
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {  // an empty match splits nothing: look again one character on
            if (ms >= n) break;
            from = ms + utf8_char_len((unsigned char)s[ms]);
            continue;
        }
        if (ms > gap) L3D_CHECK(e->ctx, encode_piece(e, s + gap, ms - gap));
        L3D_CHECK(e->ctx, encode_piece(e, s + ms, me - ms));
        gap = from = me;
    }
    if (gap < n) L3D_CHECK(e->ctx, encode_piece(e, s + gap, n - gap));
    return L3D_OK;
}

// Length of the valid UTF-8 sequence at s (1..4), or 0 if s starts an invalid one: overlong
// forms, surrogates, code points above U+10FFFF and cut sequences are invalid, as for PCRE2.
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xc2 || c > 0xf4) return 0;
    size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (c == 0xe0 && s[1] < 0xa0) return 0;   // overlong
    if (c == 0xed && s[1] >= 0xa0) return 0;  // surrogates
    if (c == 0xf0 && s[1] < 0x90) return 0;   // overlong
    if (c == 0xf4 && s[1] >= 0x90) return 0;  // > U+10FFFF
    return len;
}

// Text between added tokens: valid runs through the regex, invalid bytes one token each.
static l3d_status encode_text(enc_t *e, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t run = 0, i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(u + i, n - i);
        if (k) {
            i += k;
            continue;
        }
        if (i > run) L3D_CHECK(e->ctx, encode_valid(e, s + run, i - run));
        L3D_CHECK(e->ctx, put(e, e->b->byte_id[u[i]]));
        run = ++i;
    }
    if (n > run) L3D_CHECK(e->ctx, encode_valid(e, s + run, n - run));
    return L3D_OK;
}

// The longest allowed added token starting at s, or -1 (*len_p its length).
static int32_t match_added(const l3d_bpe_t *b, const unsigned char *s, size_t n, int special,
                           size_t *len_p) {
    int32_t node = 0, best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t c = b->trie[node].child;
        while (c >= 0 && b->trie[c].byte != s[i]) c = b->trie[c].sibling;
        if (c < 0) break;
        node = c;
        int32_t id = b->trie[node].id;
        if (id >= 0 && (special || !(b->flags[id] & L3D_BPE_SPECIAL))) {
            best = id;
            *len_p = i + 1;
        }
    }
    return best;
}

static l3d_status bpe_encode(l3d_tokenizer_t *tok, const char *text, size_t len, unsigned flags,
                             int32_t **ids_p, size_t *n_p, size_t *cap_p) {
    const l3d_bpe_t *b = tok->priv;
    enc_t e = {.b = b, .ctx = tok->ctx, .ids_p = ids_p, .n_p = n_p, .cap_p = cap_p};
    e.md = pcre2_match_data_create_from_pattern((const pcre2_code *)b->re, NULL);
    if (!e.md) return l3d_error(tok->ctx, L3D_ERR_NOMEM, "tokenizer: regex match data");
    l3d_status st = L3D_OK;
    const unsigned char *u = (const unsigned char *)text;
    int special = (flags & L3D_TOKENIZE_SPECIAL) != 0;
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (!b->first_byte[u[i]]) continue;
        size_t mlen = 0;
        int32_t id = match_added(b, u + i, len - i, special, &mlen);
        if (id < 0) continue;
        if (i > start) L3D_CHECK_GOTO(tok->ctx, encode_text(&e, text + start, i - start), st, out);
        L3D_CHECK_GOTO(tok->ctx, put(&e, id), st, out);
        i += mlen - 1;
        start = i + 1;
    }
    if (len > start) L3D_CHECK_GOTO(tok->ctx, encode_text(&e, text + start, len - start), st, out);
out:
    scratch_free(&e);
    pcre2_match_data_free(e.md);
    return st;
}

// ---- decoding and the rest of the ops ----------------------------------------------------
static l3d_status bpe_piece(l3d_tokenizer_t *tok, int32_t id, char *buf, size_t cap,
                            size_t *len_p) {
    const l3d_bpe_t *b = tok->priv;
    size_t len = b->tok_len[id];
    *len_p = len;
    if (!buf && !cap) return L3D_OK;
    if (len > cap)
        return l3d_error(tok->ctx, L3D_ERR_INVALID_ARG,
                         "decode of id %d needs %zu bytes, buffer holds %zu", (int)id, len, cap);
    memcpy(buf, b->blob + b->tok_off[id], len);
    return L3D_OK;
}

static int32_t bpe_find(const l3d_tokenizer_t *tok, const char *text, size_t len) {
    const l3d_bpe_t *b = tok->priv;
    size_t mlen = 0;
    int32_t id = match_added(b, (const unsigned char *)text, len, 1, &mlen);
    if (id >= 0 && mlen == len) return id;
    return l3d_bpe_lookup(b, text, len);
}

static void bpe_destroy(l3d_tokenizer_t *tok) { l3d_bpe_free(tok->priv); }

static const l3d_tokenizer_ops_t bpe_ops = {
    .name = "bpe",
    .encode = bpe_encode,
    .piece = bpe_piece,
    .find = bpe_find,
    .destroy = bpe_destroy,
};

l3d_status l3d_bpe_tokenizer(l3d_ctx_t *ctx, l3d_bpe_t *b, l3d_tokenizer_t **tok_p) {
    l3d_tokenizer_t *tok = l3d_calloc(ctx, 1, sizeof(*tok), "data");
    if (!tok) {
        l3d_bpe_free(b);
        return L3D_ERR_NOMEM;
    }
    tok->ops = &bpe_ops;
    tok->ctx = ctx;
    tok->priv = b;
    tok->vocab_size = b->n_ids;
    tok->bos_id = tok->eos_id = tok->pad_id = -1;
    tok->special = (l3d_tokenizer_special_t){.bos_id = -1, .eos_id = -1, .eot_id = -1,
                                             .pad_id = -1};
    tok->is_special = b->flags;  // L3D_BPE_SPECIAL is bit 0
    tok->chat = L3D_CHAT_NONE;
    snprintf(tok->key, sizeof(tok->key), "bpe");
    *tok_p = tok;
    return L3D_OK;
}
