// 3D tensor parallelism (parallel.tp_mode "3d", being built): the tp group as a q x q x q cube
// and the 3D matrix product of Agarwal et al. 1995 as Bian et al. 2021 (arXiv 2105.14450)
// place it for a transformer's linear layers.
//
// Rank (i, j, l) of the cube is tp rank (i*q + j)*q + l. A linear layer y(N,O) = x(N,I) W(O,I)^T
// (W as Hugging Face stores it) contracts I over one cube axis `a` and splits O over another
// `b`; i always splits the rows. With s_a, s_b this rank's coordinates on a and b:
//
//   x:  rows (i*q + s_b) * N/q^2 .., columns s_a * I/q ..            // (N/q^2, I/q)
//   W:  rows s_b * O/q + i * O/q^2 .., columns s_a * I/q ..          // (O/q^2, I/q)
//   y:  rows (i*q + s_a) * N/q^2 .., columns s_b * O/q ..            // (N/q^2, O/q)
//
// Forward: x's block (i, s_a) all-gathered along b (N/q, I/q); W's block (s_b, s_a) along i
// (O/q, I/q); their product, partial over a, reduce-scattered along a by rows. Backward:
// dy all-gathered along a; dx's partial (dy W) reduce-scattered along b; dW's partial
// (dy^T x, x gathered again) reduce-scattered along i. Every rank holds 1/q^3 of x, W and y.
//
// y's layout is x's with a and b swapped, so layers alternate: "A" = (a l, b j) takes the
// residual stream (rows i, j; columns l) to rows i, l and columns j (q, k, v, gate, up, the
// head); "B" = (a j, b l) takes that back (o, down). Attention and SwiGLU run in between on
// whole sequences (rows) and q's share of the heads (columns j) without exchange.
// defines: l3d_tp3d_t, l3d_tp3d_create, l3d_tp3d_destroy, l3d_tp3d_block_fwd,
//          l3d_tp3d_block_bwd, l3d_tp3d_linear_bytes
#ifndef L3D_TP3D_H
#define L3D_TP3D_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/comm.h"
#include "llama3d/device.h"

// The two orientations of a linear layer (see above).
enum { L3D_TP3D_A = 0, L3D_TP3D_B = 1 };

typedef struct l3d_tp3d {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
    int q, c[3];          // cube side; this rank's coordinates i, j, l
    l3d_comm_t *axis[3];  // the q ranks differing from this one only in coordinate 0, 1, 2,
                          // ordered by it (owned)
    l3d_comm_t *plane[3];  // the q^2 ranks sharing coordinate 1 (j) or 2 (l) with this one,
                           // ordered by (i, the other); [0] NULL (owned). Plane 2 holds the
                           // copies of what the residual stream's columns l replicate (norms,
                           // the embedding's columns), plane 1 every row block of the
                           // cross-entropy's vocabulary block j.
    float *a, *b, *c2, *d, *e;  // scratch: gathered x or dy, gathered W, partial y/dx,
                                // partial dW, a 16-bit partial or a block to add
    size_t cap_a, cap_b, cap_c, cap_d, cap_e;  // their lengths in floats
} l3d_tp3d_t;

// Collective over tp (size q^3; otherwise L3D_ERR_CONFIG naming the size): splits it into the
// three axes. dev runs the block products; tp and dev are borrowed.
l3d_status l3d_tp3d_create(l3d_comm_t *tp, l3d_device_t *dev, l3d_tp3d_t **g_p);
void l3d_tp3d_destroy(l3d_tp3d_t *g);

// This rank's blocks of a layer of orientation `orient` (L3D_TP3D_A or _B), per-rank sizes
// Nr = N/q^2 rows, Iq = I/q, Oq = O/q (W's block is (Oq/q, Iq); q divides Oq). Collective over
// the cube. x, y, dx, dy are of dtype at, w of wt, dw float32 (the training dtypes: 16-bit
// blocks are gathered as they are, products summed in float32 and rounded once to be
// reduce-scattered in at; dw's partials are reduce-scattered in float32).
// y (Nr, Oq) = (beta 0) or += (beta 1) this rank's block of x W^T.
l3d_status l3d_tp3d_block_fwd(l3d_tp3d_t *g, int orient, void *y, const void *x, const void *w,
                              int Nr, int Iq, int Oq, float beta, l3d_dtype at, l3d_dtype wt);
// dx (Nr, Iq) = (beta 0) or += (beta 1) the block of dy W (NULL: not wanted); dw (Oq/q, Iq) +=
// the block of dy^T x (NULL: not wanted). dy is gathered once for both; dx may be x (dw is
// computed first).
l3d_status l3d_tp3d_block_bwd(l3d_tp3d_t *g, int orient, void *dx, float beta, float *dw,
                              const void *dy, const void *x, const void *w, int Nr, int Iq,
                              int Oq, l3d_dtype at, l3d_dtype wt);
// Bytes one rank counts (l3d_comm_get_stats) in one forward and one backward (dx and dw) of
// a layer of full sizes N, I, O and orientation `orient`, on each axis communicator, and
// calls, with es bytes an activation and weight element.
void l3d_tp3d_linear_bytes(int q, int orient, int N, int I, int O, int es, uint64_t fwd[3],
                           uint64_t bwd[3], uint64_t calls_fwd[3], uint64_t calls_bwd[3]);

#endif
