// Scalar math every device computes the same way, so that a device's result is the CPU
// device's bit for bit: the gradient-clipping coefficient AdamW applies and the ordered sum of
// the norm's per-rank parts. Plain C11 here; a CUDA device compiles the same lines as
// __host__ __device__ functions (L3D_HD), so there is one copy of each formula.
// defines: L3D_HD, l3d_clip_coef, l3d_adamw_gscale, l3d_sum_f64_ordered
#ifndef L3D_DEVICE_MATH_H
#define L3D_DEVICE_MATH_H

#include <math.h>
#include <stddef.h>

#if defined(__CUDACC__)
#define L3D_HD __host__ __device__ static inline
#else
#define L3D_HD static inline
#endif

// torch.nn.utils.clip_grad_norm_'s coefficient for a global norm `norm`: max_norm / (norm +
// 1e-6), computed in double, used only when below 1; max_norm <= 0 turns clipping off.
L3D_HD float l3d_clip_coef(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double coef = (double)max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

// The factor AdamW multiplies a gradient by (device.h, adamw): grad_scale (1 / the loss scale)
// times the clipping coefficient of the unscaled norm sqrt(sumsq) * grad_scale. With a loss
// scale S that is a power of two, as DeepSpeed's dynamic scaler's always is, the two products
// by grad_scale are exact: the same float as clip(sqrt(sumsq) / S) / S.
L3D_HD float l3d_adamw_gscale(double sumsq, float grad_scale, float max_norm) {
    return l3d_clip_coef(sqrt(sumsq) * (double)grad_scale, max_norm) * grad_scale;
}

// x[0] + x[1] + ... + x[n-1], added in index order from 0.0 (the per-rank parts of a norm:
// every rank adds the same values in the same order, so every rank has the same sum).
L3D_HD double l3d_sum_f64_ordered(const double *x, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

#endif
