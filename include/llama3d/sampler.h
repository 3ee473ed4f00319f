// Choosing the next token from logits: a sampler chain with penalties, temperature, top-k,
// top-p and min-p, and a helper that finds stop strings in streamed text.
// defines: l3d_sampler_t, l3d_sampler_params_t, l3d_sampler_*, l3d_stop_strings_find
#ifndef LLAMA3D_SAMPLER_H
#define LLAMA3D_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// The chain, applied in this order to a copy of the logits (the caller's are never changed):
//  1. penalties over the last `penalty_last_n` accepted tokens, per distinct token t seen c
//     times there (llama.cpp's semantics): a positive logit is divided by repeat_penalty and
//     a negative one multiplied by it; then logit -= c * frequency_penalty + presence_penalty
//     (OpenAI's definitions).
//  2. temperature 0: greedy, the largest penalised logit (lowest id on ties); nothing below.
//  3. p = softmax(logits / temperature).
//  4. top_k: keep the k largest logits (lowest id first on ties); 0 keeps all.
//  5. top_p: of those, in descending order, keep the shortest prefix whose probability,
//     renormalised over the kept ids, reaches top_p; 1 keeps all.
//  6. min_p: keep the ids whose probability is >= min_p times the largest; 0 keeps all.
//  7. draw from what is left, renormalised, with the sampler's random stream.
// The stream is a pure function of `seed`: the same seed, logits and accepted tokens give the
// same tokens. The order in 3..6 is Hugging Face's (temperature first, as top_p has always
// meant here); llama.cpp applies its temperature after the filters.
typedef struct l3d_sampler_params {
    float temperature;        // >= 0; 0 = greedy
    int top_k;                // >= 0; 0 = off
    float top_p;              // (0, 1]; 1 = off
    float min_p;              // [0, 1]; 0 = off
    float repeat_penalty;     // > 0; 1 = off
    float frequency_penalty;  // any finite value; 0 = off
    float presence_penalty;   // any finite value; 0 = off
    int penalty_last_n;       // >= 0: how many recent accepted tokens the penalties see; 0 = off
    uint64_t seed;
} l3d_sampler_params_t;

// llama.cpp's defaults (common/common.h): temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
// repeat_penalty 1 (off), frequency and presence 0 (off), penalty_last_n 64; seed 1.
void l3d_sampler_params_default(l3d_sampler_params_t *p);

typedef struct l3d_sampler l3d_sampler_t;
// A sampler for a vocabulary of `vocab_size` (>= 1). A parameter out of its range above, or
// NaN, is L3D_ERR_INVALID_ARG naming it. It keeps `ctx` for errors; ctx must outlive it.
l3d_status l3d_sampler_create(l3d_ctx_t *ctx, int vocab_size, const l3d_sampler_params_t *params,
                              l3d_sampler_t **sampler_p);
void l3d_sampler_destroy(l3d_sampler_t *s);
// Records `token` as the newest token of the context (the penalty window). Call it for the
// prompt's tokens; l3d_sampler_sample accepts the tokens it returns itself. A token outside
// [0, vocab_size) is L3D_ERR_INVALID_ARG.
l3d_status l3d_sampler_accept(l3d_sampler_t *s, int32_t token);
// Picks the next token from logits[0..vocab_size) (host memory) and accepts it. A NaN or
// +inf logit, or every logit -inf, is L3D_ERR_INVALID_ARG (-inf masks a token out).
l3d_status l3d_sampler_sample(l3d_sampler_t *s, const float *logits, int32_t *token_p);
// Forgets the accepted tokens and restarts the random stream from the seed: the sampler then
// behaves exactly as a new one.
l3d_status l3d_sampler_reset(l3d_sampler_t *s);

// Stop strings over streamed text. `text[0..len)` is everything generated so far (decoded);
// on return *stop_at_p is the offset of the earliest complete stop string in it (the text
// before it is the answer), or `len` when there is none, and *safe_len_p is how much of the
// text can be shown now: all of it but the longest tail that could still grow into a stop
// string split across tokens (<= *stop_at_p). stops[0..n_stops) are non-empty NUL-terminated
// strings; n_stops 0 is allowed.
l3d_status l3d_stop_strings_find(const char *const *stops, int n_stops, const char *text,
                                 size_t len, size_t *stop_at_p, size_t *safe_len_p);

#ifdef __cplusplus
}
#endif
#endif
