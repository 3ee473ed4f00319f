// 2D tensor parallelism (parallel.tp_mode "2d", being built): the tp group as a q x q grid and
// the SUMMA linear layer of Optimus (Xu et al. 2021, arXiv 2104.05343) on it.
//
// Rank (i, j) of the grid (tp rank i*q + j) holds one block of every matrix of a linear layer
// y(N,O) = x(N,I) W(O,I)^T (W as Hugging Face stores it):
//
//   x block (i, j):  rows i*N/q .. of x, columns j*I/q ..       // (N/q, I/q)
//   W block (i, j):  rows j*O/q .. of W, columns i*I/q ..       // (O/q, I/q): W^T's block (i, j)
//   y block (i, j):  rows i*N/q .. of y, columns j*O/q ..       // (N/q, O/q)
//
// so y's layout is x's: a layer's output feeds the next layer's input with no exchange.
// Forward, q steps k: row i broadcasts x(i,k), column j broadcasts W(k,j), and
// y(i,j) += x(i,k) W(k,j)^T. Backward: dx(i,k) = sum_j dy(i,j) W(k,j), column j
// broadcasting W(k,j) and row i reducing to (i,k); dW(k,j) += sum_i dy(i,j)^T x(i,k), row i
// broadcasting x(i,k) and column j reducing to (k,j).
// defines: l3d_tp2d_t, l3d_tp2d_create, l3d_tp2d_destroy, l3d_tp2d_linear_fwd,
//          l3d_tp2d_linear_bwd, l3d_tp2d_block_*, l3d_tp2d_linear_bytes,
//          l3d_tp_scratch_grow
#ifndef L3D_TP2D_H
#define L3D_TP2D_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/comm.h"
#include "llama3d/device.h"

typedef struct l3d_tp2d {
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
    int q, i, j;          // grid side; this rank's row and column
    l3d_comm_t *row;      // the q ranks of row i, ordered by column (owned)
    l3d_comm_t *col;      // the q ranks of column j, ordered by row (owned)
    float *a, *b, *c, *d;  // received x block, received W block, float32 product, its
                           // 16-bit rounding
    size_t cap_a, cap_b, cap_c, cap_d;  // their lengths in floats
} l3d_tp2d_t;

// Collective over tp (size q^2; otherwise L3D_ERR_CONFIG naming the size): splits it into
// rows and columns. dev runs the block products; tp and dev are borrowed.
l3d_status l3d_tp2d_create(l3d_comm_t *tp, l3d_device_t *dev, l3d_tp2d_t **g_p);
void l3d_tp2d_destroy(l3d_tp2d_t *g);

// N, I, O are the layer's full sizes, each a multiple of q (else L3D_ERR_INVALID_ARG).
// Collective over the grid; float32 blocks as laid out above.
// y (N/q, O/q) = this rank's block of x W^T.
l3d_status l3d_tp2d_linear_fwd(l3d_tp2d_t *g, float *y, const float *x, const float *w, int N,
                               int I, int O);
// dx (N/q, I/q) = this rank's block of dy W (overwritten); dw (O/q, I/q) += its block of
// dy^T x.
l3d_status l3d_tp2d_linear_bwd(l3d_tp2d_t *g, float *dx, float *dw, const float *dy,
                               const float *x, const float *w, int N, int I, int O);
// The same on this rank's blocks, sizes per rank (Nq = N/q, ...), as the model's layers call
// them: y += (beta 1) or = (beta 0) the block of x W^T; dx likewise the block of dy W;
// dw += the block of dy^T x. Collective over the grid. x, y, dx, dy are of dtype at, w of wt,
// dw float32 (the training dtypes: 16-bit blocks are broadcast and reduced as they are, the
// products summed in float32 and rounded once; dw's partials are reduced in float32).
l3d_status l3d_tp2d_block_fwd(l3d_tp2d_t *g, void *y, const void *x, const void *w, int Nq,
                              int Iq, int Oq, float beta, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_tp2d_block_bwd_x(l3d_tp2d_t *g, void *dx, const void *dy, const void *w, int Nq,
                                int Iq, int Oq, float beta, l3d_dtype at, l3d_dtype wt);
l3d_status l3d_tp2d_block_bwd_w(l3d_tp2d_t *g, float *dw, const void *dy, const void *x, int Nq,
                                int Iq, int Oq, l3d_dtype at);
// Shared with 3d (core/model/tp3d.c) and the model's split-row RMSNorm (core/model/model_tp.c):
// grows a float32 scratch in dev's memory to at least n floats (its contents are not kept).
l3d_status l3d_tp_scratch_grow(l3d_ctx_t *ctx, l3d_device_t *dev, float **p, size_t *cap,
                               size_t n, const char *tag);
// Bytes one rank counts (l3d_comm_get_stats) in a forward and a backward, on its row [0] and
// column [1] communicator, and calls, with es bytes an activation and weight element.
void l3d_tp2d_linear_bytes(int q, int N, int I, int O, int es, uint64_t fwd[2], uint64_t bwd[2],
                           uint64_t calls_fwd[2], uint64_t calls_bwd[2]);

#endif
