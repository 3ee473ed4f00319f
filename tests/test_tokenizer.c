// Byte-level BPE (core/text/tokenizer_bpe.c, core/text/tokenizer_load.c) on small tokenizer.json /
// tokenizer.model files written here (chat formats: tests/test_chat.c):
// merges by rank, added and special tokens, the pre-tokenizer split, invalid UTF-8, decode,
// misuse, and every kind of bad file. The comparison with Hugging Face on Meta's real
// tokenizer is tests/reference/tokenizer_ref.py.
#include "tests/tokenizer_fixtures.h"

TestSuite(bpe, .init = make_dir, .fini = remove_dir);

// Lower rank first, whatever the order of the pairs in the text; the leftmost of equal pairs.
Test(bpe, merges_by_rank) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json("\\S+|\\s+", 0);
    int bc = add_merge(root, "b", "c");   // rank 0
    int ab = add_merge(root, "a", "b");   // rank 1
    int aa = add_merge(root, "a", "a");   // rank 2
    int abc = add_merge(root, "a", "bc"); // rank 3
    l3d_tokenizer_t *tok = open_json(ctx, root);
    expect_ids(tok, "abc", 3, 0, IDS(abc));          // b c first, then a bc
    expect_ids(tok, "abd", 3, 0, IDS(ab, 'd'));
    expect_ids(tok, "aaa", 3, 0, IDS(aa, 'a'));      // leftmost pair of equal rank
    expect_ids(tok, "aabc", 4, 0, IDS(aa, bc));      // b c (0), then a a (2) before a bc (3)
    l3d_tokenizer_destroy(tok);
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// Merges as ["a", "b"] pairs (newer tokenizers library) mean the same as "a b" strings.
Test(bpe, merges_as_pairs) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json("\\S+|\\s+", 0);
    int he = add_merge(root, "h", "e");
    int hel = add_merge(root, "he", "l");
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    json_t *pairs = json_array();
    json_array_append_new(pairs, json_pack("[s,s]", "h", "e"));
    json_array_append_new(pairs, json_pack("[s,s]", "he", "l"));
    (void)merges;
    json_object_set_new(json_object_get(root, "model"), "merges", pairs);
    l3d_tokenizer_t *tok = open_json(ctx, root);
    expect_ids(tok, "help", 4, 0, IDS(hel, 'p'));
    expect_ids(tok, "he", 2, 0, IDS(he));
    l3d_tokenizer_destroy(tok);
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// ignore_merges: a piece that is a vocabulary token is that token, even where merges could
// not reach it (Llama 3 sets it; tiktoken always does this).
Test(bpe, ignore_merges) {
    l3d_ctx_t *ctx = new_ctx();
    for (int ignore = 0; ignore < 2; ignore++) {
        json_t *root = base_json("\\S+|\\s+", ignore);
        int xy = add_merge(root, "x", "y");
        json_object_set_new(json_object_get(json_object_get(root, "model"), "vocab"), "xyz",
                            json_integer(400));
        l3d_tokenizer_t *tok = open_json(ctx, root);
        cr_assert_eq(l3d_tokenizer_vocab_size(tok), 401);
        if (ignore) expect_ids(tok, "xyz xyzz", 8, 0, IDS(400, ' ', xy, 'z', 'z'));
        else expect_ids(tok, "xyz", 3, 0, IDS(xy, 'z'));
        l3d_tokenizer_destroy(tok);
        json_decref(root);
    }
    l3d_ctx_destroy(ctx);
}

// The pre-tokenizer splits first: no merge crosses a piece boundary (Llama 3's pattern:
// "a b" is "a" + " b").
Test(bpe, pretokenizer_splits) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json(NULL, 1);
    int a_sp = add_merge(root, "a", " ");
    int sp_b = add_merge(root, " ", "b");
    (void)a_sp;
    int d12 = add_merge(root, "1", "2");
    int d123 = add_merge(root, "12", "3");
    int d1234 = add_merge(root, "123", "4");
    l3d_tokenizer_t *tok = open_json(ctx, root);
    expect_ids(tok, "a b", 3, 0, IDS('a', sp_b));
    // \p{N}{1,3}: digits go by threes, so 1234 never becomes one token.
    expect_ids(tok, "1234", 4, 0, IDS(d123, '4'));
    expect_ids(tok, "12", 2, 0, IDS(d12));
    cr_assert_neq(d1234, d123);
    l3d_tokenizer_destroy(tok);
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// \s is Unicode White_Space, as in HF's tokenizers (Oniguruma) and tiktoken: U+180E MONGOLIAN
// VOWEL SEPARATOR is not (PCRE2's own \s takes it). With White_Space "\u180E\u180Eb" is the
// pieces [U+180E U+180E][b]; PCRE2's \s would give [U+180E][U+180E b].
Test(bpe, whitespace_is_white_space_property) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json(NULL, 1);
    add_merge(root, "\xe1", "\xa0");
    int mvs = add_merge(root, "\xe1\xa0", "\x8e");
    int two = add_merge(root, "\xe1\xa0\x8e", "\xe1\xa0\x8e");
    int mvs_b = add_merge(root, "\xe1\xa0\x8e", "b");
    (void)mvs;
    (void)mvs_b;
    l3d_tokenizer_t *tok = open_json(ctx, root);
    expect_ids(tok, "\xe1\xa0\x8e\xe1\xa0\x8e" "b", 7, 0, IDS(two, 'b'));
    // A real White_Space character (U+3000) does split that way.
    json_decref(root);
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
}

// Long pieces take the heap path; short ones the scan. Both must give what a naive BPE
// (leftmost lowest-rank pair, merged until none is left) gives, on random words over {a,b,c}.
typedef struct naive {
    char tok[64][16];
    int n;
} naive_t;

Test(bpe, long_and_short_pieces_agree_with_naive_bpe) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json("[abc]+|[^abc]+", 0);
    // A random merge table over short strings of a, b, c.
    char pa[200][16], pb[200][16];
    int ids[200], nm = 0;
    char known[600][16];
    int nk = 3;
    strcpy(known[0], "a");
    strcpy(known[1], "b");
    strcpy(known[2], "c");
    uint64_t r = 12345;
    while (nm < 150) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int x = (int)((r >> 33) % (uint64_t)nk), y = (int)((r >> 45) % (uint64_t)nk);
        if (strlen(known[x]) + strlen(known[y]) >= 15) continue;
        char both[32];
        snprintf(both, sizeof(both), "%s%s", known[x], known[y]);
        int dup = 0;
        for (int k = 0; k < nm; k++) dup |= !strcmp(pa[k], known[x]) && !strcmp(pb[k], known[y]);
        if (dup) continue;
        strcpy(pa[nm], known[x]);
        strcpy(pb[nm], known[y]);
        ids[nm] = add_merge(root, known[x], known[y]);
        int have = 0;
        for (int k = 0; k < nk; k++) have |= !strcmp(known[k], both);
        if (!have) strcpy(known[nk++], both);
        nm++;
    }
    l3d_tokenizer_t *tok = open_json(ctx, root);
    static char sym[400][16];
    static int32_t want[400];
    char word[400];
    for (int trial = 0; trial < 50; trial++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        size_t len = trial < 35 ? 1 + (r >> 40) % 48 : 49 + (r >> 40) % 300;
        for (size_t i = 0; i < len; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            word[i] = (char)('a' + (r >> 50) % 3);
            sym[i][0] = word[i];
            sym[i][1] = 0;
            want[i] = (unsigned char)word[i];
        }
        size_t n = len;
        for (;;) {  // naive: the lowest-rank pair, leftmost, until none
            int best_rank = 1 << 30;
            size_t best = 0;
            for (size_t i = 0; i + 1 < n; i++)
                for (int k = 0; k < nm && k < best_rank; k++)
                    if (!strcmp(pa[k], sym[i]) && !strcmp(pb[k], sym[i + 1])) {
                        best_rank = k;
                        best = i;
                    }
            if (best_rank == 1 << 30) break;
            size_t l0 = strlen(sym[best]), l1 = strlen(sym[best + 1]);
            cr_assert_lt(l0 + l1, sizeof(sym[best]));
            memcpy(sym[best] + l0, sym[best + 1], l1 + 1);
            want[best] = ids[best_rank];
            memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof(sym[0]));
            memmove(want + best + 1, want + best + 2, (n - best - 2) * sizeof(want[0]));
            n--;
        }
        want[n] = -1;
        expect_ids(tok, word, len, 0, want);
    }
    l3d_tokenizer_destroy(tok);
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// Added tokens are cut out before pre-tokenization; special ones only when asked. Longest
// match at the leftmost position.
Test(bpe, added_and_special_tokens) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json(NULL, 1);
    int sp_x = add_merge(root, " ", "x");
    add_added(root, 300, "<|eot|>", 1);
    add_added(root, 301, "<|eot|>x", 1);  // longer, same start
    add_added(root, 302, "[plain]", 0);   // added, not special
    l3d_tokenizer_t *tok = open_json(ctx, root);
    cr_assert_eq(l3d_tokenizer_vocab_size(tok), 303);
    expect_ids(tok, "a<|eot|> x", 10, L3D_TOKENIZE_SPECIAL, IDS('a', 300, sp_x));
    expect_ids(tok, "<|eot|>x", 8, L3D_TOKENIZE_SPECIAL, IDS(301));
    expect_ids(tok, "<|eot|", 6, L3D_TOKENIZE_SPECIAL, IDS('<', '|', 'e', 'o', 't', '|'));
    // Without the flag the special text is ordinary text; the non-special token still counts.
    expect_ids(tok, "<|eot|>[plain]", 14, 0,
               IDS('<', '|', 'e', 'o', 't', '|', '>', 302));
    // Decoding: a special token is its text, or nothing with L3D_DECODE_SKIP_SPECIAL.
    int32_t ids[] = {'a', 300, sp_x, 302};
    char buf[64];
    size_t len = 0;
    cr_assert_eq(l3d_tokenizer_decode(tok, ids, 4, 0, buf, sizeof(buf), &len), L3D_OK);
    cr_assert_eq(len, 17);
    cr_assert_eq(memcmp(buf, "a<|eot|> x[plain]", 17), 0);
    cr_assert_eq(l3d_tokenizer_decode(tok, ids, 4, L3D_DECODE_SKIP_SPECIAL, buf, sizeof(buf),
                                      &len), L3D_OK);
    cr_assert_eq(len, 10);
    cr_assert_eq(memcmp(buf, "a x[plain]", 10), 0);
    cr_assert(l3d_tokenizer_is_special(tok, 300));
    cr_assert(!l3d_tokenizer_is_special(tok, 302));
    cr_assert(!l3d_tokenizer_is_special(tok, 'a'));
    int32_t id = -1;
    cr_assert_eq(l3d_tokenizer_token_id(tok, "<|eot|>", 7, &id), L3D_OK);
    cr_assert_eq(id, 300);
    cr_assert_eq(l3d_tokenizer_token_id(tok, " x", 2, &id), L3D_OK);
    cr_assert_eq(id, sp_x);
    cr_assert_eq(l3d_tokenizer_token_id(tok, "<|nope|>", 8, &id), L3D_ERR_NOT_FOUND);
    l3d_tokenizer_destroy(tok);
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// Invalid UTF-8: each invalid byte is its own byte token and splits the text; decode gives
// every input back byte for byte.
Test(bpe, invalid_utf8_round_trips) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json(NULL, 1);
    int ab = add_merge(root, "a", "b");
    int b_c = add_merge(root, "b", "c");
    l3d_tokenizer_t *tok = open_json(ctx, root);
    // "ab" + 0xff + "bc": the bad byte cuts the text, so no merge reaches across it.
    expect_ids(tok, "ab\xff" "bc", 5, 0, IDS(ab, 0xff, b_c));
    // A cut sequence, an overlong form, a surrogate, a stray continuation byte.
    expect_ids(tok, "\xe2\x82" "ab", 4, 0, IDS(0xe2, 0x82, ab));
    expect_ids(tok, "\xc0\xaf", 2, 0, IDS(0xc0, 0xaf));
    expect_ids(tok, "\xed\xa0\x80", 3, 0, IDS(0xed, 0xa0, 0x80));
    uint64_t r = 99;
    char text[2048], back[4096];
    for (int trial = 0; trial < 200; trial++) {
        size_t len = (size_t)trial * 10 % 2000;
        for (size_t i = 0; i < len; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            text[i] = (char)(r >> 56);
        }
        int32_t *ids = NULL;
        size_t n = 0, bl = 0;
        cr_assert_eq(l3d_tokenizer_encode(tok, text, len, L3D_TOKENIZE_SPECIAL, &ids, &n),
                     L3D_OK);
        cr_assert_eq(l3d_tokenizer_decode(tok, ids, n, 0, back, sizeof(back), &bl), L3D_OK);
        cr_assert_eq(bl, len, "trial %d: %zu bytes back of %zu", trial, bl, len);
        cr_assert_eq(memcmp(back, text, len), 0, "trial %d: different bytes back", trial);
        l3d_tokens_free(ctx, ids, n);
    }
    l3d_tokenizer_destroy(tok);
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// Misuse is an error status with a detail, never a crash.
Test(bpe, misuse) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json(NULL, 1);
    add_added(root, 256, "<s>", 1);
    l3d_tokenizer_t *tok = open_json(ctx, root);
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    char buf[8];
    cr_assert_eq(l3d_tokenizer_open(NULL, "x", &tok), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_open(ctx, NULL, &tok), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_encode(NULL, "a", 1, 0, &ids, &n), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_encode(tok, NULL, 1, 0, &ids, &n), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_encode(tok, "a", 1, 0, NULL, &n), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_encode(tok, "a", 1, 0x80, &ids, &n), L3D_ERR_INVALID_ARG);
    // No BOS in this tokenizer: asking for one is refused, not a -1 id.
    cr_assert_eq(l3d_tokenizer_encode(tok, "a", 1, L3D_TOKENIZE_BOS, &ids, &n),
                 L3D_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(ctx, "no BOS");
    int32_t bad[] = {'a', 257};
    cr_assert_eq(l3d_tokenizer_decode(tok, bad, 2, 0, buf, sizeof(buf), &len),
                 L3D_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(ctx, "token id 257");
    int32_t neg[] = {-5};
    cr_assert_eq(l3d_tokenizer_decode(tok, neg, 1, 0, buf, sizeof(buf), &len),
                 L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_decode(tok, NULL, 1, 0, buf, sizeof(buf), &len),
                 L3D_ERR_INVALID_ARG);
    int32_t s3[] = {256, 256, 256};  // 9 bytes into 8: refused, nothing half written
    cr_assert_eq(l3d_tokenizer_decode(tok, s3, 3, 0, buf, sizeof(buf), &len),
                 L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_decode(tok, s3, 3, 0, NULL, 0, &len), L3D_OK);
    cr_assert_eq(len, 9);
    cr_assert_eq(l3d_tokenizer_token_to_piece(tok, 256, buf, 2, &len), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_token_to_piece(tok, 256, buf, 3, &len), L3D_OK);
    cr_assert_eq(l3d_tokenizer_token_to_piece(tok, 1 << 30, buf, 3, &len), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_special_ids(tok, NULL), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_vocab_size(NULL), 0);
    cr_assert_eq(l3d_tokenizer_is_special(NULL, 0), 0);
    int32_t one = 0;
    cr_assert_eq(l3d_tokenizer_token_id(tok, NULL, 3, &one), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_tokenizer_encode_chat(tok, NULL, 0, NULL, &ids, &n), L3D_ERR_UNSUPPORTED);
    ASSERT_MSG_HAS(ctx, "no chat template");
    l3d_tokenizer_destroy(NULL);
    l3d_tokenizer_destroy(tok);
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// ---- bad files: L3D_ERR_FORMAT (or NOT_FOUND) naming the file and what is wrong ----------
static void expect_bad_text(const char *name, const char *text, l3d_status want,
                            const char *needle) {
    l3d_ctx_t *ctx = new_ctx();
    const char *p = write_file(name, text, strlen(text));
    char path[256];
    snprintf(path, sizeof(path), "%s", p);
    l3d_tokenizer_t *tok = NULL;
    l3d_status st = l3d_tokenizer_open(ctx, path, &tok);
    cr_assert_eq(st, want, "%s: status %d, want %d (%s)", needle, st, want,
                 l3d_ctx_last_error(ctx));
    cr_assert_null(tok);
    ASSERT_MSG_HAS(ctx, needle);
    ASSERT_MSG_HAS(ctx, name);
    unlink(path);
    l3d_ctx_destroy(ctx);
}

static void expect_bad_json(json_t *root, const char *needle) {
    char *s = json_dumps(root, JSON_COMPACT);
    expect_bad_text("tokenizer.json", s, L3D_ERR_FORMAT, needle);
    free(s);
    json_decref(root);
}

Test(bpe, bad_tokenizer_json) {
    json_t *r;
    expect_bad_text("tokenizer.json", "{\"model\": ", L3D_ERR_FORMAT, "line 1");
    expect_bad_text("tokenizer.json", "{\"model\": 1, \"model\": 2}", L3D_ERR_FORMAT,
                    "duplicate");
    r = base_json(NULL, 1);
    json_object_del(r, "model");
    expect_bad_json(r, "model is missing");
    r = base_json(NULL, 1);
    json_object_set_new(json_object_get(r, "model"), "type", json_string("WordPiece"));
    expect_bad_json(r, "model.type WordPiece is not supported");
    r = base_json(NULL, 1);
    json_object_set_new(json_object_get(r, "model"), "vocab", json_array());
    expect_bad_json(r, "model.vocab is not an object");
    r = base_json(NULL, 1);
    json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), "zz",
                        json_string("7"));
    expect_bad_json(r, "model.vocab['zz'] is not an id");
    r = base_json(NULL, 1);
    json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), "zz",
                        json_integer(7));
    expect_bad_json(r, "gives id 7 to two tokens");
    r = base_json(NULL, 1);
    json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"),
                          json_string("a b"));
    expect_bad_json(r, "'ab' is not in model.vocab");
    r = base_json(NULL, 1);
    json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"),
                          json_string("ab"));
    expect_bad_json(r, "model.merges[0] 'ab' is not two tokens");
    r = base_json(NULL, 1);
    json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"),
                          json_integer(3));
    expect_bad_json(r, "model.merges[0] is neither");
    r = base_json(NULL, 1);
    json_object_del(json_object_get(json_object_get(r, "model"), "vocab"), "a");
    expect_bad_json(r, "no token for the single byte 0x61");
    r = base_json("(unclosed", 1);
    expect_bad_json(r, "regex is refused by PCRE2");
    r = base_json(NULL, 1);
    json_array_append_new(json_object_get(r, "added_tokens"), json_pack("{s:i}", "id", 300));
    expect_bad_json(r, "added_tokens[0] needs an integer id and a non-empty string content");
    r = base_json(NULL, 1);
    json_array_append_new(json_object_get(r, "added_tokens"),
                          json_pack("{s:i, s:s, s:b}", "id", 300, "content", "<x>", "lstrip", 1));
    expect_bad_json(r, "lstrip true is not supported");
    r = base_json(NULL, 1);
    json_object_set_new(r, "normalizer", json_pack("{s:s}", "type", "NFC"));
    expect_bad_json(r, "normalizer NFC is not supported");
    r = base_json(NULL, 1);
    json_object_set_new(r, "pre_tokenizer", json_pack("{s:s}", "type", "Whitespace"));
    expect_bad_json(r, "pre_tokenizer Whitespace is not supported");
    r = base_json(NULL, 1);
    json_object_set_new(r, "decoder", json_pack("{s:s}", "type", "WordPiece"));
    expect_bad_json(r, "decoder WordPiece is not supported");
    r = base_json(NULL, 1);
    json_object_set_new(json_object_get(r, "model"), "byte_fallback", json_true());
    expect_bad_json(r, "byte_fallback true is not supported");
    r = base_json(NULL, 1);
    json_object_set_new(json_object_get(r, "model"), "ignore_merges", json_string("yes"));
    expect_bad_json(r, "ignore_merges is not a boolean");
}

// A file named *.json, or whose first non-space byte opens a JSON value, is read as JSON and
// errs as JSON, never as the tiktoken reader's lines.
Test(bpe, json_that_is_not_an_object) {
    expect_bad_text("tokenizer.json", "[1, 2]", L3D_ERR_FORMAT,
                    "tokenizer.json: not a JSON object");
    expect_bad_text("tokenizer.json", "  \"vocab\"\n", L3D_ERR_FORMAT,
                    "tokenizer.json: line 1 column 9: invalid JSON");
    expect_bad_text("tokenizer.json", "hello", L3D_ERR_FORMAT, "line 1 column 5: invalid JSON");
    expect_bad_text("tokenizer.json", "", L3D_ERR_FORMAT, "invalid JSON");
    expect_bad_text("tok.txt", "\n [{\"a\": 1}]", L3D_ERR_FORMAT, "tok.txt: not a JSON object");
    expect_bad_text("tok.txt", "[1, ", L3D_ERR_FORMAT, "tok.txt: line 1 column 4: invalid JSON");
}

Test(bpe, bad_tokenizer_model) {
    expect_bad_text("tokenizer.model", "YQ== 0\nYg== 0\n", L3D_ERR_FORMAT,
                    "line 2: the rank is not a number in [0, 2) given once");
    expect_bad_text("tokenizer.model", "YQ== 0\n!!!! 1\n", L3D_ERR_FORMAT,
                    "line 2: '!!!!' is not base64");
    expect_bad_text("tokenizer.model", "YQ== 0\nYg==\n", L3D_ERR_FORMAT,
                    "line 2 is not \"base64-token rank\"");
    expect_bad_text("tokenizer.model", "YQ== 5\n", L3D_ERR_FORMAT, "line 1: the rank");
    expect_bad_text("tokenizer.model", "YQ== x\n", L3D_ERR_FORMAT, "line 1: the rank");
    expect_bad_text("tokenizer.model", "YQ 0\n", L3D_ERR_FORMAT, "not base64");
    // Valid lines, but byte-level BPE needs every single byte as a token.
    expect_bad_text("tokenizer.model", "YQ== 0\nYg== 1\n", L3D_ERR_FORMAT,
                    "no token for the single byte 0x00");
    expect_bad_text("tokenizer.model", "", L3D_ERR_FORMAT, "no tokens");
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    char path[256];
    snprintf(path, sizeof(path), "%s/missing.json", g_dir);
    cr_assert_eq(l3d_tokenizer_open(ctx, path, &tok), L3D_ERR_NOT_FOUND);
    ASSERT_MSG_HAS(ctx, "missing.json");
    cr_assert_eq(l3d_tokenizer_open(ctx, g_dir, &tok), L3D_ERR_NOT_FOUND);
    ASSERT_MSG_HAS(ctx, "no tokenizer.json or tokenizer.model");
    // A bad tokenizer_config.json beside a good tokenizer is named too.
    json_t *root = base_json(NULL, 1);
    save_json(root, "tokenizer.json");
    write_file("tokenizer_config.json", "{\"bos_token\": 3", 15);
    cr_assert_eq(l3d_tokenizer_open(ctx, g_dir, &tok), L3D_ERR_FORMAT);
    ASSERT_MSG_HAS(ctx, "tokenizer_config.json: line 1");
    write_file("tokenizer_config.json", "{\"bos_token\": \"<nope>\"}", 23);
    cr_assert_eq(l3d_tokenizer_open(ctx, g_dir, &tok), L3D_ERR_FORMAT);
    ASSERT_MSG_HAS(ctx, "bos_token '<nope>' is not a token");
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// tiktoken format: every split of a token into two tokens merges at that token's rank, and a
// whole piece that is a token is that token. Written from a tokenizer.json, it must encode
// the same; Llama 3's 256 specials follow the ranks.
static const char b64chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64(const unsigned char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        out[o++] = b64chars[w >> 18];
        out[o++] = b64chars[(w >> 12) & 63];
        out[o++] = i + 1 < n ? b64chars[(w >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64chars[w & 63] : '=';
    }
    out[o] = 0;
}

Test(bpe, tiktoken_model) {
    l3d_ctx_t *ctx = new_ctx();
    // Tokens in rank order: bytes 0..255, then merges.
    const char *merged[] = {"he", "ll", "hell", "hello", " w", " wor", "or", "ld", " world"};
    char *model = malloc(64 * 300), line[64];
    size_t ml = 0;
    for (int c = 0; c < 256; c++) {
        unsigned char b = (unsigned char)c;
        char e[16];
        b64(&b, 1, e);
        ml += (size_t)sprintf(model + ml, "%s %d\n", e, c);
    }
    for (int i = 0; i < 9; i++) {
        char e[32];
        b64((const unsigned char *)merged[i], strlen(merged[i]), e);
        snprintf(line, sizeof(line), "%s %d\n", e, 256 + i);
        memcpy(model + ml, line, strlen(line));
        ml += strlen(line);
    }
    write_file("tokenizer.model", model, ml);
    free(model);
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_open(ctx, g_dir, &tok), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_tokenizer_vocab_size(tok), 265 + 256);
    // "hello": whole piece is rank 259. " worldx": " w"+"or" ... merges by the rank of the
    // concatenation: " w"(260) then " wor"(261), then "ld"(263); " world" (264) needs
    // " wor"+"ld": yes.
    expect_ids(tok, "hello worldx", 12, 0, IDS(259, 264, 'x'));
    expect_ids(tok, "hellx", 5, 0, IDS(258, 'x'));
    l3d_tokenizer_special_t sp;
    cr_assert_eq(l3d_tokenizer_special_ids(tok, &sp), L3D_OK);
    cr_assert_eq(sp.bos_id, 265);
    cr_assert_eq(sp.eos_id, 266);
    cr_assert_eq(sp.eot_id, 265 + 9);
    cr_assert_eq(sp.n_stop, 3);  // end_of_text, eot, eom
    expect_ids(tok, "<|start_header_id|>x<|reserved_special_token_247|>", 50,
               L3D_TOKENIZE_SPECIAL | L3D_TOKENIZE_BOS, IDS(265, 265 + 6, 'x', 265 + 255));
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
}

