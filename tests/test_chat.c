// The Llama 3 chat formats (core/text/chat_template.c): template recognition, the formatted text,
// and a tokenizer directory whose tokenizer_config.json carries a template. The ids of real
// conversations against the reference are in tests/reference/tokenizer_ref.py.
#include "tests/tokenizer_fixtures.h"

// ---- chat templates ----------------------------------------------------------------------
static char *read_template(const char *name, size_t *len_p) {
    char path[512];
    snprintf(path, sizeof(path), "%s/chat_templates/%s", L3D_TEST_DATA, name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    char *buf = malloc(1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    buf[n] = 0;
    *len_p = n;
    return buf;
}

Test(chat, recognises_meta_templates_only) {
    l3d_ctx_t *ctx = new_ctx();
    const char *files[] = {"llama3.jinja", "llama3.1.jinja", "llama3.2.jinja"};
    l3d_chat_template_t kinds[] = {L3D_CHAT_LLAMA3, L3D_CHAT_LLAMA31, L3D_CHAT_LLAMA32};
    for (int i = 0; i < 3; i++) {
        size_t n = 0;
        char *t = read_template(files[i], &n);
        l3d_chat_template_t k = L3D_CHAT_NONE;
        cr_assert_eq(l3d_chat_template_recognise(ctx, t, n, files[i], &k), L3D_OK, "%s: %s",
                     files[i], l3d_ctx_last_error(ctx));
        cr_assert_eq(k, kinds[i], "%s", files[i]);
        // Whitespace is text to Jinja, which keeps it: a template that differs only by
        // whitespace (trailing, or re-indented) is not the known one, and is refused.
        char *wide = malloc(2 * n + 8);
        size_t w = 0;
        for (size_t j = 0; j < n; j++) {
            wide[w++] = t[j];
            if (t[j] == '}') wide[w++] = '\n';
        }
        k = kinds[i];
        cr_assert_eq(l3d_chat_template_recognise(ctx, wide, w, files[i], &k),
                     L3D_ERR_UNSUPPORTED, "%s re-indented", files[i]);
        cr_assert_eq(k, L3D_CHAT_NONE);
        static const char *const tails[] = {" ", "\n", "\t", "\n\n"};
        for (size_t j = 0; j < sizeof(tails) / sizeof(tails[0]); j++) {
            memcpy(wide, t, n);
            memcpy(wide + n, tails[j], strlen(tails[j]));
            cr_assert_eq(l3d_chat_template_recognise(ctx, wide, n + strlen(tails[j]), files[i],
                                                     &k),
                         L3D_ERR_UNSUPPORTED, "%s + trailing whitespace %zu", files[i], j);
        }
        // Without its last byte (the final newline of 3.1's and 3.2's): refused too.
        cr_assert_eq(l3d_chat_template_recognise(ctx, t, n - 1, files[i], &k),
                     L3D_ERR_UNSUPPORTED, "%s minus its last byte", files[i]);
        // One character different: refused, naming the origin.
        char *at = strstr(t, "eot_id");
        cr_assert_not_null(at);
        at[0] = 'E';
        cr_assert_eq(l3d_chat_template_recognise(ctx, t, n, "my/tokenizer_config.json", &k),
                     L3D_ERR_UNSUPPORTED);
        cr_assert_eq(k, L3D_CHAT_NONE);
        ASSERT_MSG_HAS(ctx, "my/tokenizer_config.json: the chat_template is not one llama3d "
                            "knows");
        free(wide);
        free(t);
    }
    l3d_ctx_destroy(ctx);
}

static void expect_format(l3d_chat_template_t kind, const l3d_chat_message_t *m, size_t n,
                          const char *date, const char *want) {
    l3d_ctx_t *ctx = new_ctx();
    char *text = NULL;
    size_t len = 0;
    cr_assert_eq(l3d_chat_format(ctx, kind, "<|begin_of_text|>", m, n, date, &text, &len),
                 L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(len, strlen(want));
    cr_assert_str_eq(text, want);
    l3d_chat_text_free(ctx, text, len);
    l3d_ctx_destroy(ctx);
}

Test(chat, formats) {
    // Contents are trimmed as Python's str.strip(): ASCII and Unicode white space, U+001C..F.
    l3d_chat_message_t m[] = {
        {"system", " Be brief.\n"},
        {"user", "\xe3\x80\x80Hi!\x1c\t"},
        {"assistant", "Hello."},
    };
    expect_format(L3D_CHAT_LLAMA3, m, 3, NULL,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief."
                  "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    // Llama 3: no messages, no BOS.
    expect_format(L3D_CHAT_LLAMA3, m, 0, NULL,
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    const char *sys31 = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                        "Cutting Knowledge Date: December 2023\nToday Date: %s\n\n%s<|eot_id|>";
    char want[1024];
    snprintf(want, sizeof(want), sys31, "05 Mar 2025", "Be brief.");
    strcat(want, "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_format(L3D_CHAT_LLAMA31, m, 2, "05 Mar 2025", want);
    expect_format(L3D_CHAT_LLAMA32, m, 2, "05 Mar 2025", want);
    // 3.1 without a system message still has the system turn, dated 26 Jul 2024.
    snprintf(want, sizeof(want), sys31, "26 Jul 2024", "");
    strcat(want, "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_format(L3D_CHAT_LLAMA31, m + 1, 1, NULL, want);
    l3d_ctx_t *ctx = new_ctx();
    char *text = NULL;
    size_t len = 0;
    l3d_chat_message_t tool[] = {{"user", "x"}, {"tool", "{}"}};
    cr_assert_eq(l3d_chat_format(ctx, L3D_CHAT_LLAMA31, "", tool, 2, NULL, &text, &len),
                 L3D_ERR_UNSUPPORTED);
    ASSERT_MSG_HAS(ctx, "role 'tool'");
    l3d_chat_message_t nul[] = {{"user", NULL}};
    cr_assert_eq(l3d_chat_format(ctx, L3D_CHAT_LLAMA3, "", nul, 1, NULL, &text, &len),
                 L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_chat_format(ctx, L3D_CHAT_NONE, "", m, 1, NULL, &text, &len),
                 L3D_ERR_UNSUPPORTED);
    l3d_ctx_destroy(ctx);
}

// A tokenizer directory with tokenizer_config.json: BOS/EOS by name, the template recognised,
// the conversation encoded with its special tokens.
Test(chat, tokenizer_encodes_chat, .init = make_dir, .fini = remove_dir) {
    l3d_ctx_t *ctx = new_ctx();
    json_t *root = base_json(NULL, 1);
    const char *names[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                           "<|end_header_id|>", "<|eot_id|>"};
    for (int i = 0; i < 5; i++) add_added(root, 300 + i, names[i], 1);
    save_json(root, "tokenizer.json");
    size_t tl = 0;
    char *tmpl = read_template("llama3.jinja", &tl);
    json_t *cfg = json_pack("{s:s, s:s, s:s%, s:f}", "bos_token", "<|begin_of_text|>",
                            "eos_token", "<|end_of_text|>", "chat_template", tmpl, tl,
                            "model_max_length", 1e30);
    char *cs = json_dumps(cfg, 0);
    write_file("tokenizer_config.json", cs, strlen(cs));
    free(cs);
    free(tmpl);
    json_decref(cfg);
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_open(ctx, g_dir, &tok), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_tokenizer_chat_template(tok), L3D_CHAT_LLAMA3);
    l3d_tokenizer_special_t sp;
    cr_assert_eq(l3d_tokenizer_special_ids(tok, &sp), L3D_OK);
    cr_assert_eq(sp.bos_id, 300);
    cr_assert_eq(sp.eos_id, 301);
    cr_assert_eq(sp.eot_id, 304);
    cr_assert_eq(sp.n_stop, 2);
    l3d_chat_message_t m[] = {{"user", " hi "}};
    int32_t *ids = NULL;
    size_t n = 0;
    cr_assert_eq(l3d_tokenizer_encode_chat(tok, m, 1, NULL, &ids, &n), L3D_OK);
    int32_t want[] = {300, 302, 'u', 's', 'e', 'r', 303, '\n', '\n', 'h', 'i', 304,
                      302, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', 303, '\n', '\n'};
    cr_assert_eq(n, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < n; i++) cr_assert_eq(ids[i], want[i], "id %zu", i);
    l3d_tokens_free(ctx, ids, n);
    l3d_tokenizer_destroy(tok);
    // An unknown template: the tokenizer opens (plain text still works), chat says why not.
    cfg = json_pack("{s:s}", "chat_template", "{{ messages }}");
    cs = json_dumps(cfg, 0);
    write_file("tokenizer_config.json", cs, strlen(cs));
    free(cs);
    json_decref(cfg);
    cr_assert_eq(l3d_tokenizer_open(ctx, g_dir, &tok), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_tokenizer_encode_chat(tok, m, 1, NULL, &ids, &n), L3D_ERR_UNSUPPORTED);
    ASSERT_MSG_HAS(ctx, "tokenizer_config.json: the chat_template is not one llama3d knows");
    l3d_tokenizer_destroy(tok);
    json_decref(root);
    l3d_ctx_destroy(ctx);
}

// The byte tokenizer through the same public API.
Test(chat, byte_tokenizer_api) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_tokenizer_t *tok = NULL;
    cr_assert_eq(l3d_tokenizer_create_bytes(ctx, &tok), L3D_OK);
    cr_assert_str_eq(l3d_tokenizer_kind(tok), "bytes");
    cr_assert_eq(l3d_tokenizer_vocab_size(tok), 259);
    int32_t *ids = NULL;
    size_t n = 0, len = 0;
    cr_assert_eq(l3d_tokenizer_encode(tok, "hi", 2, L3D_TOKENIZE_BOS | L3D_TOKENIZE_SPECIAL,
                                      &ids, &n), L3D_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(ids[0], 256);
    char buf[8];
    cr_assert_eq(l3d_tokenizer_decode(tok, ids, n, 0, buf, sizeof(buf), &len), L3D_OK);
    cr_assert_eq(len, 2);
    cr_assert_eq(memcmp(buf, "hi", 2), 0);
    l3d_tokens_free(ctx, ids, n);
    l3d_tokenizer_special_t sp;
    cr_assert_eq(l3d_tokenizer_special_ids(tok, &sp), L3D_OK);
    cr_assert_eq(sp.eos_id, 257);
    cr_assert_eq(sp.n_stop, 1);
    cr_assert(l3d_tokenizer_is_special(tok, 258));
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
}
