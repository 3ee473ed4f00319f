// l3d tokenize: text to token ids (printed, or uint32 little-endian), ids back to text, and
// chat conversations in the Llama 3 format.
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "core/input.h"
#include "core/l3d_core.h"
#include "platform/platform.h"

#define CMD "tokenize"

// Reads a file, or standard input for NULL / "-", into a malloc'd buffer.
static l3d_status read_input(l3d_ctx_t *ctx, const char *path, char **buf_p, size_t *len_p) {
    if (path && strcmp(path, "-")) {
        return l3d_input_read(ctx, path, "--in", 0, buf_p, len_p);
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return l3d_error(ctx, L3D_ERR_NOMEM, "reading standard input");
    for (;;) {
        if (n == cap) {
            char *g = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!g) {
                free(buf);
                return l3d_error(ctx, L3D_ERR_NOMEM, "reading standard input");
            }
            buf = g;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return l3d_error(ctx, L3D_ERR_IO, "reading standard input: %s", strerror(errno));
    }
    *buf_p = buf;
    *len_p = n;
    return L3D_OK;
}

static l3d_status write_output(l3d_ctx_t *ctx, const char *path, const void *data, size_t len) {
    if (!path || !strcmp(path, "-")) {
        if (len && fwrite(data, 1, len, stdout) != len)
            return l3d_error(ctx, L3D_ERR_IO, "writing standard output: %s", strerror(errno));
        return L3D_OK;
    }
    l3d_iovec_t io = {data, len};
    int e = l3d_file_write(path, &io, 1);
    if (!e) return L3D_OK;
    int bad_path = e == -ENOENT || e == -ENOTDIR || e == -EISDIR || e == -EACCES ||
                   e == -EPERM || e == -ELOOP || e == -ENAMETOOLONG;
    return l3d_error(ctx, bad_path ? L3D_ERR_CONFIG : L3D_ERR_IO, "--out %s: %s", path,
                     strerror(-e));
}

l3d_status l3d_cli_read_chat(l3d_ctx_t *ctx, const char *path, json_t **root_p,
                             l3d_chat_message_t **msgs_p, size_t *n_p) {
    json_t *root;
    L3D_CHECK(ctx, l3d_input_json(ctx, path, "--chat", 0, &root));
    *root_p = root;
    if (!json_is_array(root))
        return l3d_error(ctx, L3D_ERR_CONFIG,
                         "--chat %s: not a list of {\"role\", \"content\"} messages", path);
    size_t n = json_array_size(root);
    l3d_chat_message_t *msgs = calloc(n ? n : 1, sizeof(*msgs));
    if (!msgs) return l3d_error(ctx, L3D_ERR_NOMEM, "--chat %s", path);
    *msgs_p = msgs;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(root, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (!json_is_object(m) || !role || !content)
            return l3d_error(ctx, L3D_ERR_CONFIG,
                             "--chat %s: message %zu needs string \"role\" and \"content\"", path,
                             i + 1);
        if (strlen(content) != json_string_length(json_object_get(m, "content")))
            return l3d_error(ctx, L3D_ERR_CONFIG, "--chat %s: message %zu holds a NUL byte",
                             path, i + 1);
        msgs[i] = (l3d_chat_message_t){.role = role, .content = content};
    }
    *n_p = n;
    return L3D_OK;
}

static l3d_status put_ids(l3d_ctx_t *ctx, const char *out, const int32_t *ids, size_t n) {
    if (out) {
        unsigned char *le = malloc(n ? n * 4 : 1);
        if (!le) return l3d_error(ctx, L3D_ERR_NOMEM, "%zu ids", n);
        for (size_t i = 0; i < n; i++) {
            uint32_t v = (uint32_t)ids[i];
            le[4 * i] = (unsigned char)v;
            le[4 * i + 1] = (unsigned char)(v >> 8);
            le[4 * i + 2] = (unsigned char)(v >> 16);
            le[4 * i + 3] = (unsigned char)(v >> 24);
        }
        l3d_status st = write_output(ctx, out, le, n * 4);
        free(le);
        return st;
    }
    for (size_t i = 0; i < n; i++)
        if (printf(i ? " %d" : "%d", (int)ids[i]) < 0)
            return l3d_error(ctx, L3D_ERR_IO, "writing standard output: %s", strerror(errno));
    if (putchar('\n') == EOF)
        return l3d_error(ctx, L3D_ERR_IO, "writing standard output: %s", strerror(errno));
    return L3D_OK;
}

static l3d_status decode_ids(l3d_ctx_t *ctx, l3d_tokenizer_t *tok, const char *in,
                             const char *out) {
    char *bin = NULL, *text = NULL;
    size_t len = 0, tl = 0;
    int32_t *ids = NULL;
    l3d_status st = L3D_OK;
    L3D_CHECK(ctx, read_input(ctx, in, &bin, &len));
    if (len % 4) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "--in %s: %zu bytes is not a whole number of uint32 "
                       "ids", in ? in : "(stdin)", len);
        goto out;
    }
    size_t n = len / 4;
    ids = malloc(n ? n * sizeof(int32_t) : 1);
    if (!ids) {
        st = l3d_error(ctx, L3D_ERR_NOMEM, "%zu ids", n);
        goto out;
    }
    const unsigned char *u = (const unsigned char *)bin;
    int32_t vocab = l3d_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)u[4 * i] | (uint32_t)u[4 * i + 1] << 8 |
                     (uint32_t)u[4 * i + 2] << 16 | (uint32_t)u[4 * i + 3] << 24;
        if (v >= (uint32_t)vocab) {
            st = l3d_error(ctx, L3D_ERR_CONFIG, "--in %s: id %u at byte %zu is outside the "
                           "vocabulary [0, %d)", in ? in : "(stdin)", v, 4 * i, (int)vocab);
            goto out;
        }
        ids[i] = (int32_t)v;
    }
    L3D_CHECK_GOTO(ctx, l3d_tokenizer_decode(tok, ids, n, 0, NULL, 0, &tl), st, out);
    text = malloc(tl ? tl : 1);
    if (!text) {
        st = l3d_error(ctx, L3D_ERR_NOMEM, "%zu bytes of text", tl);
        goto out;
    }
    L3D_CHECK_GOTO(ctx, l3d_tokenizer_decode(tok, ids, n, 0, text, tl, &tl), st, out);
    st = write_output(ctx, out, text, tl);
out:
    free(bin);
    free(ids);
    free(text);
    return st;
}

int l3d_cmd_tokenize(int argc, char **argv) {
    const char *path = NULL, *in = NULL, *out = NULL, *decode = NULL, *bos = NULL, *chat = NULL,
               *date = NULL, *help = NULL;
    const l3d_cli_flag_t flags[] = {
        {"--tokenizer", "PATH", "tokenizer.json, tokenizer.model, or a directory holding one",
         &path, 0},
        {"--in", "FILE", "text to encode, or ids (.bin) with --decode (default: stdin)", &in, 0},
        {"--out", "FILE", "write uint32 little-endian ids (the text with --decode)", &out, 0},
        {"--decode", NULL, "read uint32 little-endian ids and write their text", &decode, 1},
        {"--bos", NULL, "start with the BOS token (none by default)", &bos, 1},
        {"--chat", "FILE", "encode a [{\"role\", \"content\"}] conversation with the chat "
         "template of tokenizer_config.json", &chat, 0},
        {"--date", "D", "\"Today Date\" of the Llama 3.1/3.2 chat templates (e.g. 26 Jul 2024)",
         &date, 0},
        {"--help", NULL, "this text", &help, 1},
    };
    int nflags = (int)(sizeof(flags) / sizeof(flags[0]));
    if (l3d_cli_parse(CMD, argc, argv, 2, flags, nflags)) return L3D_EXIT_USAGE;
    if (help) {
        l3d_cli_usage(stdout, CMD, "--tokenizer PATH [--in FILE] [--out FILE.bin] [--decode] "
                      "[--bos] [--chat MESSAGES.json]", flags, nflags);
        printf("\nSpecial-token texts in the input (<|eot_id|>) become their ids. Without --out "
               "the ids are printed\nseparated by spaces.\n");
        return L3D_EXIT_OK;
    }
    if (!path) {
        fprintf(stderr, "l3d %s: --tokenizer is required\n", CMD);
        return L3D_EXIT_USAGE;
    }
    if (chat && (in || decode || bos)) {
        fprintf(stderr, "l3d %s: --chat takes its messages from its file: no --in, --decode "
                "or --bos with it (the template adds BOS)\n", CMD);
        return L3D_EXIT_USAGE;
    }
    if (decode && bos) {
        fprintf(stderr, "l3d %s: --bos is for encoding, not with --decode\n", CMD);
        return L3D_EXIT_USAGE;
    }
    if (date && !chat) {
        fprintf(stderr, "l3d %s: --date is for --chat\n", CMD);
        return L3D_EXIT_USAGE;
    }
    l3d_ctx_t *ctx = NULL;
    l3d_status st = l3d_cli_ctx_create(0, &ctx);
    if (st < 0) return l3d_cli_fail(CMD, NULL, st);
    l3d_tokenizer_t *tok = NULL;
    char *text = NULL;
    size_t len = 0, n = 0;
    int32_t *ids = NULL;
    json_t *root = NULL;
    l3d_chat_message_t *msgs = NULL;
    int rc = L3D_EXIT_OK;
    L3D_CHECK_GOTO(ctx, l3d_tokenizer_open(ctx, path, &tok), st, fail);
    if (decode) {
        L3D_CHECK_GOTO(ctx, decode_ids(ctx, tok, in, out), st, fail);
    } else if (chat) {
        size_t nm = 0;
        L3D_CHECK_GOTO(ctx, l3d_cli_read_chat(ctx, chat, &root, &msgs, &nm), st, fail);
        L3D_CHECK_GOTO(ctx, l3d_tokenizer_encode_chat(tok, msgs, nm, date, &ids, &n), st, fail);
        L3D_CHECK_GOTO(ctx, put_ids(ctx, out, ids, n), st, fail);
    } else {
        L3D_CHECK_GOTO(ctx, read_input(ctx, in, &text, &len), st, fail);
        unsigned f = L3D_TOKENIZE_SPECIAL | (bos ? L3D_TOKENIZE_BOS : 0);
        L3D_CHECK_GOTO(ctx, l3d_tokenizer_encode(tok, text, len, f, &ids, &n), st, fail);
        L3D_CHECK_GOTO(ctx, put_ids(ctx, out, ids, n), st, fail);
    }
    goto done;
fail:
    rc = l3d_cli_fail(CMD, ctx, st);
done:
    free(msgs);
    json_decref(root);
    free(text);
    if (ids) l3d_tokens_free(ctx, ids, n);
    l3d_tokenizer_destroy(tok);
    l3d_ctx_destroy(ctx);
    return rc;
}
