// l3d-chat: chat with a Llama 3 model directory through llama3d's public API only (no
// trainer): a device, the model, its tokenizer and chat template, a KV cache, a sampler.
//
//   l3d-chat MODEL_DIR [MAX_TOKENS]
//
// Each line on standard input is a user turn; the reply streams to standard output. The
// conversation is formatted by the model's own chat template every turn and only the tokens
// the cache does not hold yet are decoded. A model without a chat template (llama3d's byte
// tokenizer) continues each line as plain text instead.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llama3d/llama3d.h>

#define MAX_TURNS 64

static int fail(l3d_ctx_t *ctx, l3d_status st, const char *what) {
    fprintf(stderr, "l3d-chat: %s: %s (%s)\n", what, l3d_ctx_last_error(ctx), l3d_strerror(st));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: l3d-chat MODEL_DIR [MAX_TOKENS]\n");
        return 2;
    }
    const char *dir = argv[1];
    int max_new = argc > 2 ? atoi(argv[2]) : 256;
    l3d_ctx_t *ctx = NULL;
    if (l3d_ctx_create(NULL, &ctx) != L3D_OK) return 1;
    l3d_device_t *dev = NULL;
    l3d_model_t *m = NULL;
    l3d_tokenizer_t *tok = NULL;
    l3d_kv_cache_t *cache = NULL;
    l3d_sampler_t *sampler = NULL;
    l3d_status st;
    int rc = 1;
    if ((st = l3d_device_create(ctx, NULL, NULL, &dev)) != L3D_OK) return fail(ctx, st, "device");
    if ((st = l3d_model_open(ctx, dev, dir, &m)) != L3D_OK) return fail(ctx, st, dir);
    const l3d_model_config_t *cfg = l3d_model_config(m);
    st = l3d_tokenizer_dir_has(dir) ? l3d_tokenizer_open(ctx, dir, &tok)
                                    : l3d_tokenizer_create_bytes(ctx, &tok);
    if (st != L3D_OK) return fail(ctx, st, "tokenizer");
    int chat = l3d_tokenizer_chat_template(tok) != L3D_CHAT_NONE;
    int cap = cfg->max_position_embeddings < 4096 ? cfg->max_position_embeddings : 4096;
    l3d_sampler_params_t sp;
    l3d_sampler_params_default(&sp);
    sp.temperature = 0.6f;  // Meta's generation_config.json for the Instruct models
    sp.top_p = 0.9f;
    l3d_tokenizer_special_t special;
    l3d_tokenizer_special_ids(tok, &special);
    float *logits = malloc(sizeof(float) * (size_t)cfg->vocab_size);
    int32_t *held = malloc(sizeof(int32_t) * (size_t)cap);  // the ids the cache holds
    char *reply = NULL;
    size_t reply_len = 0, reply_cap = 0;
    l3d_chat_message_t msgs[2 * MAX_TURNS];
    char *texts[2 * MAX_TURNS] = {0};
    size_t nmsg = 0;
    int nheld = 0;
    if (!logits || !held) goto out;
    if ((st = l3d_kv_cache_create(m, cap, &cache)) != L3D_OK ||
        (st = l3d_sampler_create(ctx, cfg->vocab_size, &sp, &sampler)) != L3D_OK) {
        rc = fail(ctx, st, "cache and sampler");
        goto out;
    }
    char line[4096];
    while (nmsg + 2 <= 2 * MAX_TURNS && fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = 0;
        texts[nmsg] = strdup(line);
        msgs[nmsg] = (l3d_chat_message_t){"user", texts[nmsg]};
        nmsg++;
        // The prompt: the whole conversation formatted by the template (or this line as text).
        int32_t *ids = NULL;
        size_t n = 0;
        st = chat ? l3d_tokenizer_encode_chat(tok, msgs, nmsg, NULL, &ids, &n)
                  : l3d_tokenizer_encode(tok, line, strlen(line), L3D_TOKENIZE_BOS, &ids, &n);
        if (st != L3D_OK) {
            rc = fail(ctx, st, "encoding the prompt");
            goto out;
        }
        // Keep the cache's common prefix with it (the earlier turns) and decode the rest.
        int same = 0;
        while (chat && same < nheld && (size_t)same < n && held[same] == ids[same]) same++;
        if ((size_t)same == n) same--;  // at least one token is decoded, for its logits
        if (same < nheld) l3d_kv_cache_seq_truncate(cache, 0, same);
        if (n + (size_t)max_new > (size_t)cap) {
            fprintf(stderr, "l3d-chat: the conversation outgrew the context (%d)\n", cap);
            l3d_tokens_free(ctx, ids, n);
            break;
        }
        st = l3d_model_decode(m, cache, ids + same, (int)n - same, logits);
        memcpy(held + same, ids + same, (n - (size_t)same) * sizeof(int32_t));
        nheld = (int)n;
        l3d_tokens_free(ctx, ids, n);
        if (st != L3D_OK) {
            rc = fail(ctx, st, "decoding the prompt");
            goto out;
        }
        reply_len = 0;
        for (int k = 0; k < max_new; k++) {
            int32_t next;
            if ((st = l3d_sampler_sample(sampler, logits, &next)) != L3D_OK) {
                rc = fail(ctx, st, "sampling");
                goto out;
            }
            int stop = 0;
            for (int i = 0; i < special.n_stop; i++) stop |= next == special.stop_ids[i];
            if (stop || next == cfg->eos_token_id) break;
            char piece[256];
            size_t len = 0;
            if (!l3d_tokenizer_is_special(tok, next) &&
                l3d_tokenizer_token_to_piece(tok, next, piece, sizeof(piece), &len) == L3D_OK) {
                fwrite(piece, 1, len, stdout);
                fflush(stdout);
                if (reply_len + len + 1 > reply_cap) {
                    reply_cap = 2 * (reply_len + len + 1);
                    char *r = realloc(reply, reply_cap);
                    if (!r) goto out;
                    reply = r;
                }
                memcpy(reply + reply_len, piece, len);
                reply_len += len;
            }
            if (nheld >= cap) break;
            held[nheld++] = next;
            if ((st = l3d_model_decode(m, cache, &next, 1, logits)) != L3D_OK) {
                rc = fail(ctx, st, "decoding");
                goto out;
            }
        }
        printf("\n");
        if (reply) reply[reply_len] = 0;
        texts[nmsg] = strdup(reply ? reply : "");
        msgs[nmsg] = (l3d_chat_message_t){"assistant", texts[nmsg]};
        nmsg++;
    }
    rc = 0;
out:
    for (size_t i = 0; i < nmsg; i++) free(texts[i]);
    free(reply);
    free(held);
    free(logits);
    l3d_sampler_destroy(sampler);
    l3d_kv_cache_destroy(cache);
    l3d_tokenizer_destroy(tok);
    l3d_model_destroy(m);
    l3d_device_destroy(dev);
    l3d_ctx_destroy(ctx);
    return rc;
}
