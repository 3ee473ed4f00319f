// l3d bench comm's reference values (cli/bench_comm_ref.c): small non-negative integers
// depending on (rank, element index), exact in every dtype (uint8 takes the full byte range so
// sums wrap). Reductions are exact integer sums, then AVG is a float32 division (truncating for
// integers) and half/bfloat16 round once to nearest-even: the library's contract
// (docs/comm.md).
// defines: l3d_bc_pat, l3d_bc_encode, l3d_bc_fill, l3d_bc_expect_red
#ifndef L3D_CLI_BENCH_COMM_H
#define L3D_CLI_BENCH_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/comm.h"

// Rank's value at element index i.
int64_t l3d_bc_pat(l3d_dtype dt, int rank, size_t i);
// Writes integer v as one element of dt; with avg, the reduced value v / n.
void l3d_bc_encode(l3d_dtype dt, int64_t v, int avg, int n, void *out);
// Fills elements [0, count) of buf (es bytes each) with rank's values at indices off + j.
void l3d_bc_fill(l3d_dtype dt, size_t es, void *buf, int rank, size_t off, size_t count);
// The reduction `op` over nranks ranks of element g, encoded.
void l3d_bc_expect_red(l3d_dtype dt, l3d_redop op, int nranks, size_t g, void *out);

#endif
