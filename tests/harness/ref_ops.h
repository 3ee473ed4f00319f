// Float64 references the device tests share (test_cpu_ops, test_cpu_dtypes), written from the
// textbook definitions.
#ifndef L3D_TESTS_REF_OPS_H
#define L3D_TESTS_REF_OPS_H

#include <stddef.h>
#include <stdint.h>

// Softmax cross-entropy of logits z(N,V): rg(N,V) = gs * (softmax - onehot(t)) and rl(N) =
// -log p(t); rows with t < 0 are left untouched (the caller zeroes them).
void l3d_ref_xent(const float *z, const int32_t *t, int N, int V, double gs, double *rg,
                  double *rl);

// Attention, materialised: for every (b, h, i) the full score row, an explicit softmax, and
// the backward through it (dS = P * (dP - sum(P dP))).

typedef struct {
    int B, Tq, Tk, H, KVH, D, Tmax;  // Tmax: the kv capacity (kv_bstride = Tmax*KVH*D)
} shape_t;

// Offsets of q/out (B,Tq,H,D), of k/v (B,Tmax,KVH,D) and of dk/dv (B,Tk,KVH,D).
size_t l3d_ref_qi(const shape_t *s, int b, int i, int h);
size_t l3d_ref_ki(const shape_t *s, int b, int j, int g);
size_t l3d_ref_dki(const shape_t *s, int b, int j, int g);
// out and lse (B,H,Tq) overwritten; with dq non-NULL, dq/dk/dv (zeroed by the caller) += the
// gradients for the output gradient dout.
void l3d_ref_attention(const shape_t *s, const float *q, const float *k, const float *v,
                       const float *dout, double *out, double *lse, double *dq, double *dk,
                       double *dv);

#endif
