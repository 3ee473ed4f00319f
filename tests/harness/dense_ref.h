// Dense float64 references for the block-distributed linear layers (tests/test_comm_tp2d.c,
// tests/test_comm_tp3d.c): deterministic matrices every rank builds whole, and a check of a
// rank's block of a product against float64 within gamma_K.
//
// Tolerance, derived: an element of a float32 product of length K is a sum of K products,
// each rounded once, added in some order (the block products, then the reduction over the
// ranks): |computed - exact| <= gamma_K * sum_k |a_k b_k|, gamma_K = K u / (1 - K u),
// u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1); an accumulating
// (+=) result adds one rounding: gamma_{K+1} over (sum |a_k b_k| + |start|). The float64
// reference's own error is below 2^-53 K of the same sum: negligible beside it.
#ifndef L3D_TESTS_DENSE_REF_H
#define L3D_TESTS_DENSE_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// Deterministic values in [-1, 1): element (r, c) of matrix `which`.
static inline float l3d_ref_val(int which, int r, int c) {
    uint32_t h = (uint32_t)(which * 7919 + r * 104729 + c * 1299709) * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)((double)(h & 0xffffff) / (double)(1 << 23) - 1.0);
}

static inline double l3d_ref_gamma(int k) {
    double u = ldexp(1.0, -24);
    return k * u / (1 - k * u);
}

// full[r*cols + c] of matrix `which` (rows x cols; malloc'd)
static inline float *l3d_ref_full(int which, int rows, int cols) {
    float *m = malloc((size_t)rows * cols * sizeof(float));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) m[r * cols + c] = l3d_ref_val(which, r, c);
    return m;
}

// got (nr x nc) against rows R0.., columns C0.. of A B (+ C0m, ldc0 columns):
// A[R*ar + k*ak], B[k*bk + C*bc], k < K; 0 if within the bound, else 1 with err set.
// rel: roundings to a narrower dtype on the way (a 16-bit partial product, a 16-bit result),
// each at most its unit roundoff of the same sum: the bound grows by rel * sum |a_k b_k|.
static inline int l3d_ref_check_rel(const char *what, const float *got, int nr, int nc, int R0,
                                    int C0, int K, const float *A, int ar, int ak,
                                    const float *B, int bk, int bc, const float *C0m, int ldc0,
                                    double rel, char *err, size_t errlen) {
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            int R = R0 + r, Cc = C0 + c;
            double e = C0m ? C0m[R * ldc0 + Cc] : 0, s = fabs(e);
            for (int k = 0; k < K; k++) {
                double p = (double)A[R * ar + k * ak] * B[k * bk + Cc * bc];
                e += p, s += fabs(p);
            }
            double v = got[r * nc + c], bound = (l3d_ref_gamma(K + (C0m != NULL)) + rel) * s;
            if (fabs(v - e) > bound) {
                snprintf(err, errlen, "%s[%d][%d] = %.9g, float64 %.9g (bound %.3g)", what, R, Cc,
                         v, e, bound);
                return 1;
            }
        }
    return 0;
}

static inline int l3d_ref_check(const char *what, const float *got, int nr, int nc, int R0,
                                int C0, int K, const float *A, int ar, int ak, const float *B,
                                int bk, int bc, const float *C0m, int ldc0, char *err,
                                size_t errlen) {
    return l3d_ref_check_rel(what, got, nr, nc, R0, C0, K, A, ar, ak, B, bk, bc, C0m, ldc0, 0.0,
                             err, errlen);
}

#endif
