// Scalar math every device computes the same way, so that a device's result follows the CPU
// device's: the 16-bit formats' conversions, exp, SiLU and its derivative, the RoPE rotation,
// the AdamW element update and its scalars, the online-softmax merge, the gradient-clipping
// coefficient and the ordered sum of the norm's per-rank parts. Plain C11 here; the CUDA
// device compiles the same lines as __host__ __device__ functions (L3D_HD), so there is one
// copy of each formula (core's collectives and checkpoints round by the same functions).
// Unit tests against the formats' and the functions' definitions: tests/test_cpu_dtypes.c,
// tests/test_device_math.c.
// defines: L3D_HD, l3d_f2u, l3d_u2f, l3d_bf16_to_f32, l3d_f32_to_bf16, l3d_f16_to_f32,
//          l3d_f32_to_f16, l3d_expf, l3d_sigmoidf, l3d_swiglu, l3d_swiglu_grad, l3d_rope_rotate,
//          l3d_adamw_k_t, l3d_adamw_consts, l3d_adamw_elem, l3d_softmax_merge, l3d_clip_coef,
//          l3d_adamw_gscale, l3d_sum_f64_ordered
#ifndef L3D_DEVICE_MATH_H
#define L3D_DEVICE_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Always inlined in C: the CPU device's loops are compiled per instruction set (target_clones)
// under their own optimisation options, and these must be compiled inside each to vectorise.
#if defined(__CUDACC__)
#define L3D_HD __host__ __device__ static inline
#elif defined(__GNUC__)
#define L3D_HD static inline __attribute__((always_inline))
#else
#define L3D_HD static inline
#endif

// ---- the 16-bit formats -------------------------------------------------------------------------
// Written without branches so that loops over them vectorise; every 16-bit value, every
// midpoint and the floats beside them are checked against the formats' definitions
// (tests/test_cpu_dtypes.c).
L3D_HD uint32_t l3d_f2u(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
L3D_HD float l3d_u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

// bfloat16 is float32's top half: widening shifts; narrowing adds half an ulp minus one, plus
// the kept lowest bit (to nearest, ties to even), and keeps a NaN's top bits with the quiet
// bit set.
L3D_HD float l3d_bf16_to_f32(uint16_t h) { return l3d_u2f((uint32_t)h << 16); }
L3D_HD uint16_t l3d_f32_to_bf16(float f) {
    uint32_t x = l3d_f2u(f);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, q = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
}

// float16 -> float32: the exponent rebiased (+112); inf/NaN get 112 more (255); zero and
// subnormals are renormalised by subtracting 2^-14 from a value built with exponent -14 (exact).
L3D_HD float l3d_f16_to_f32(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13, e = em & 0x0f800000u;
    uint32_t o = em + (112u << 23);
    uint32_t big = o + (112u << 23);
    float sub = l3d_u2f(o + (1u << 23)) - 6.103515625e-05f;  // 2^-14
    uint32_t r = e == 0x0f800000u ? big : e == 0 ? l3d_f2u(sub) : o;
    return l3d_u2f(r | (uint32_t)(h & 0x8000u) << 16);
}

// float32 -> float16, to nearest, ties to even: |x| >= 65536 is inf (65520 up to it rounds to
// inf through the normal path's carry); below 2^-14 (subnormal or zero) adding 0.5 aligns the
// 10 kept bits at the bottom and float addition rounds them (to nearest even); otherwise the
// exponent is rebiased and the mantissa rounded as bfloat16's is. NaN keeps its top 10
// mantissa bits with the quiet bit set.
L3D_HD uint16_t l3d_f32_to_f16(float f) {
    uint32_t x = l3d_f2u(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    uint32_t nan = 0x7e00u | ((a & 0x7fffffu) >> 13), inf = 0x7c00u;
    uint32_t sub = l3d_f2u(l3d_u2f(a) + 0.5f) - 0x3f000000u;
    uint32_t nrm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;  // (15 - 127) << 23, wrapped
    uint32_t r = a > 0x7f800000u ? nan : a >= 0x47800000u ? inf : a < 0x38800000u ? sub : nrm;
    return (uint16_t)(sign | r);
}

// ---- exp, SiLU ----------------------------------------------------------------------------------
// exp(x) for float, written so loops calling it vectorise (no calls, no branches):
// x = n ln2 + r with |r| <= ln2/2 (two-part ln2), exp(r) by Cephes' degree-6 polynomial
// (relative error about 2e-7), times 2^n built in the exponent bits. Below -87.3 it returns
// 0 (masked scores are -inf); above 88 it saturates at exp(88) (1.65e38) instead of inf;
// NaN gives NaN. The same function serves forward and backward, so they agree exactly.
L3D_HD float l3d_expf(float x) {
    const float hi = 88.0f, lo = -87.3f;  // keeps 2^n a normal float
    float xc = x > hi ? hi : (x < lo ? lo : x);
    const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    float t = xc * 1.44269504088896341f + magic;
    float n = t - magic;
    float r = xc - n * 0.693359375f;  // ln2 split: exact high part, then the low part
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    // Unsigned: a NaN x leaves NaN bits in t, and the signed shift of those overflowed
    // (undefined behaviour). The bits are garbage then, but p is NaN, so NaN comes out.
    uint32_t bits = (l3d_f2u(t) - 0x4B400000u + 127u) << 23;  // the low bits of t hold n
    return x < lo ? 0.0f : p * l3d_u2f(bits);
}

L3D_HD float l3d_sigmoidf(float x) { return 1.0f / (1.0f + l3d_expf(-x)); }

// SwiGLU's product silu(g) * u, silu(g) = g * sigmoid(g).
L3D_HD float l3d_swiglu(float g, float u) { return g * l3d_sigmoidf(g) * u; }

// Its gradients from dout d: dg = d u sig(g) (1 + g (1 - sig(g))) (silu's derivative), du = d
// silu(g).
L3D_HD void l3d_swiglu_grad(float g, float u, float d, float *dg, float *du) {
    float sg = l3d_sigmoidf(g);
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
    *du = d * g * sg;
}

// ---- RoPE ---------------------------------------------------------------------------------------
// Hugging Face's rotate-half pair (x_i, x_{i+D/2}) turned by the angle whose cosine and sine
// (the latter negated for the inverse, the backward) are c and s.
L3D_HD void l3d_rope_rotate(float *x1, float *x2, float c, float s) {
    float a = *x1, b = *x2;
    *x1 = a * c - b * s;
    *x2 = b * c + a * s;
}

// ---- AdamW --------------------------------------------------------------------------------------
// torch.optim.AdamW's element update, decoupled decay first, then the moments, then the update
// in addcdiv's order. The step's scalars are computed in double and rounded once, as torch does
// with its Python floats (l3d_adamw_consts); gscale is what the gradient is multiplied by
// (l3d_adamw_gscale).
typedef struct {
    float b1, b2, ob1, ob2, decay, nstep, bc2s, eps, gscale;
} l3d_adamw_k_t;

L3D_HD l3d_adamw_k_t l3d_adamw_consts(float lr, float beta1, float beta2, float eps,
                                      float weight_decay, float bc1, float bc2, float gscale) {
    l3d_adamw_k_t k;
    k.b1 = beta1, k.b2 = beta2, k.ob1 = 1.0f - beta1, k.ob2 = 1.0f - beta2;
    k.decay = (float)(1.0 - (double)lr * (double)weight_decay);
    k.nstep = -(float)((double)lr / (double)bc1);
    k.bc2s = (float)sqrt((double)bc2);
    k.eps = eps, k.gscale = gscale;
    return k;
}

L3D_HD void l3d_adamw_elem(const l3d_adamw_k_t *k, float grad, float *p, float *m, float *v) {
    float g = grad * k->gscale;
    float pi = *p * k->decay;
    float mi = k->b1 * *m + k->ob1 * g;
    float vi = k->b2 * *v + k->ob2 * g * g;
    *m = mi;
    *v = vi;
    *p = pi + k->nstep * mi / (sqrtf(vi) / k->bc2s + k->eps);
}

// ---- online softmax -----------------------------------------------------------------------------
// Two parts of one softmax row, each as (max m, sum l of exp(x - m)), merge into the whole row's
// (*m, *l); *c1 and *c2 are the factors each part's exp-weighted accumulator is multiplied by
// before the two are added (exp(m_k - m); an empty part, m = -inf, gets 0). Flash attention's
// running update (a new key tile merged into the row so far) and the split-key decode's final
// merge are both this.
L3D_HD void l3d_softmax_merge(float m1, float l1, float m2, float l2, float *m, float *l,
                              float *c1, float *c2) {
    float mx = m1 > m2 ? m1 : m2;
    float a = l3d_expf(m1 - mx), b = l3d_expf(m2 - mx);
    if (mx == -INFINITY) a = b = 0.0f;  // (both empty: -inf - -inf is NaN)
    *m = mx;
    *l = l1 * a + l2 * b;
    *c1 = a, *c2 = b;
}

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
