// Reduction kernels and half-precision conversions shared by the core's collective schedules
// and by transports that reduce natively (the local transport reads peers' buffers directly).
// (The half conversions they round by are devices/device_math.h's, every device's.)
// defines: l3d_reduce_apply, l3d_reduce_to_f32, l3d_reduce_final, l3d_reduce_wire_type,
//          l3d_comm_sum_double
#ifndef L3D_REDUCE_H
#define L3D_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "devices/device_math.h"
#include "llama3d/comm.h"

// dst[i] = a[i] op b[i] for wdt in {float32, int32, int64, uint8}; op SUM (AVG), MAX or MIN.
// dst may alias a or b. Integer sums wrap.
void l3d_reduce_apply(void *dst, const void *a, const void *b, size_t count, l3d_dtype wdt,
                      l3d_redop op);
void l3d_reduce_to_f32(float *dst, const void *src, size_t count, l3d_dtype dt);
// dst (dt) = src (wdt) [/ n if AVG], half types rounded to nearest even once.
void l3d_reduce_final(void *dst, const void *src, size_t count, l3d_dtype dt, l3d_redop op,
                      int n);
// The type partial reductions are kept in: float32 for the half types, dt otherwise.
l3d_dtype l3d_reduce_wire_type(l3d_dtype dt);
// *x = the sum of every member's *x, in double, added in rank order on every member (so the
// same bits everywhere, whatever the algorithm): an all-gather of the 8-byte values. c NULL
// or of size 1: unchanged. Collective over c.
l3d_status l3d_comm_sum_double(l3d_comm_t *c, double *x);

#endif
