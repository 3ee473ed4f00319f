// What the sampler keeps before its draw, for tests that compare it with a brute force.
// defines: l3d_sampler_kept
#ifndef L3D_SAMPLER_INTERNAL_H
#define L3D_SAMPLER_INTERNAL_H

#include "llama3d/sampler.h"

// Runs the chain of l3d_sampler_sample on `logits` without drawing or accepting: ids and
// probs (room for vocab_size each) receive the kept ids with their unnormalised
// probabilities, largest first (in id order when no filter is on), *n_p how many.
// The random stream and the penalty window are left as they were.
l3d_status l3d_sampler_kept(l3d_sampler_t *s, const float *logits, int32_t *ids, float *probs,
                            int *n_p);

#endif
