// The shuffled batching rule (data.shuffle): an epoch-wise permutation of the stream's
// sequence start offsets, computed per index from a counter-based generator (SplitMix64
// rounds of a Feistel network, cycle-walked onto [0, N)). Nothing is stored: the order is a
// pure function of (seed, step, index), so every layout reads the same global batch and a
// resumed run continues the same order. The rule itself is written in core/train/data.h.
#include "core/train/data.h"

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
uint64_t l3d_splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

enum { FEISTEL_ROUNDS = 4 };  // Luby-Rackoff: 4 rounds of a random function give a strong PRP

// One pass of a balanced Feistel network on 2h-bit values: a bijection of [0, 4^h).
static uint64_t feistel(uint64_t x, int h, uint64_t key) {
    const uint64_t mask = (1ull << h) - 1;
    uint64_t l = x >> h, r = x & mask;
    for (int k = 0; k < FEISTEL_ROUNDS; k++) {
        uint64_t f = l3d_splitmix64(key ^ l3d_splitmix64(r + ((uint64_t)k << 56))) & mask;
        uint64_t nl = r;
        r = l ^ f;
        l = nl;
    }
    return (l << h) | r;
}

uint64_t l3d_data_permute(uint64_t i, uint64_t n, uint64_t key) {
    if (n <= 1) return 0;
    // h: half the bits of the smallest power of 4 >= n, so the domain is < 4n and cycle
    // walking takes fewer than 4 passes on average. Cycle walking restricts a permutation of
    // the domain to one of [0, n): following i's cycle until it re-enters [0, n).
    int bits = 0;
    while (bits < 64 && (n - 1) >> bits) bits++;
    int h = (bits + 1) / 2;
    if (h < 1) h = 1;
    uint64_t x = i % n;
    do x = feistel(x, h, key);
    while (x >= n);
    return x;
}

uint64_t l3d_data_epoch_key(uint64_t seed, uint64_t epoch) {
    return l3d_splitmix64(l3d_splitmix64(seed) ^ l3d_splitmix64(epoch ^ 0x5DEECE66Dull));
}

uint64_t l3d_dataset_shuffled_offset(const l3d_dataset_t *ds, uint64_t seed, int64_t step,
                                     int global_batch, int T, int i) {
    uint64_t N = (uint64_t)(ds->n_tokens - 1) / (uint64_t)T;  // sequences per epoch (>= 1)
    uint64_t k = (uint64_t)step * (uint64_t)global_batch + (uint64_t)i;
    uint64_t epoch = k / N, p = k % N;
    return l3d_data_permute(p, N, l3d_data_epoch_key(seed, epoch)) * (uint64_t)T;
}

void l3d_dataset_batch_shuffled(const l3d_dataset_t *ds, uint64_t seed, int64_t step,
                                int global_batch, int T, int first, int count, int32_t *inputs,
                                int32_t *targets) {
    if (!ds || T <= 0 || count <= 0 || step < 0 || first < 0 || ds->n_tokens < (size_t)T + 1)
        return;
    const int32_t *tok = ds->tokens;
    for (int j = 0; j < count; j++) {
        uint64_t o = l3d_dataset_shuffled_offset(ds, seed, step, global_batch, T, first + j);
        int32_t *in = inputs + (size_t)j * (size_t)T;   // (count,T)
        int32_t *tg = targets + (size_t)j * (size_t)T;  // (count,T)
        for (int t = 0; t < T; t++) {  // o + T <= n - 1: never wraps
            in[t] = tok[o + (uint64_t)t];
            tg[t] = tok[o + (uint64_t)t + 1];
        }
    }
}
