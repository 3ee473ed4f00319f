// The scalar math every device shares (devices/device_math.h), against the functions'
// definitions computed in double: exp, SiLU and its derivative (central finite differences),
// the RoPE rotation, the AdamW element update (torch.optim.AdamW's algorithm as documented),
// the online-softmax merge. The 16-bit conversions: tests/test_cpu_dtypes.c. Each bound is
// derived next to its assertion; u = 2^-24, float32's unit roundoff.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>

#include "devices/device_math.h"

static const double u = 0x1p-24;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(double lo, double hi) {  // xorshift64*: the same sequence everywhere
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return lo + (hi - lo) * (double)((rng * 2685821657736338717ull) >> 11) * 0x1p-53;
}

// exp: Cephes' degree-6 polynomial is good to about 1.5e-7 relative on |r| <= ln2/2; the
// argument reduction with the two-part ln2 adds at most 2 u (the high part's product is exact,
// the low part's is tiny), Horner's 7 steps at most 7 u of a result near 1, and 2^n scales
// exactly: 1.5e-7 + 9 u = 6.9e-7 relative, rounded up to 1e-6. Over the whole normal range.
Test(device_math, expf_within_its_error_over_the_range) {
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        float x = (float)(-87.0 + 175.0 * i / 200000.0);
        double want = exp((double)x), got = l3d_expf(x);
        double rel = fabs(got - want) / want;
        worst = fmax(worst, rel);
        cr_assert(rel <= 1e-6, "exp(%.9g) = %.9g, want %.17g (relative %.3g)", (double)x, got,
                  want, rel);
    }
    cr_assert_eq(l3d_expf(0.0f), 1.0f);  // exact: the online softmax relies on exp(0) = 1
    cr_assert_eq(l3d_expf(-INFINITY), 0.0f);
    cr_log_info("expf: worst relative error %.3g", worst);
}

// SiLU product and its derivative. sigmoid = 1 / (1 + e): e's relative error 1e-6 reaches it
// scaled by e / (1 + e) < 1, plus 2 roundings; the product g sig u 2 more: 1e-6 + 4 u relative,
// rounded up to 1.5e-6. The derivative against central differences of the double function with
// step h = 1e-3: truncation h^2 / 6 |f'''| <= 1e-6 (|f'''| of g sigmoid(g) u is below 6 |u|
// here), plus the float formula's 1e-6 relative on each of its terms (bounded by 2 |d u| and
// |d g|): 1e-6 (|d u| (3 + |g|)) + 1e-6 |d| |u| + 8 u of the same magnitude.
static double silu64(double g) { return g / (1.0 + exp(-g)); }
Test(device_math, swiglu_and_its_gradient) {
    for (int i = 0; i < 20000; i++) {
        float g = (float)uniform(-12, 12), up = (float)uniform(-3, 3), d = (float)uniform(-2, 2);
        double want = silu64(g) * up, got = l3d_swiglu(g, up);
        cr_assert(fabs(got - want) <= 1.5e-6 * fabs(want) + 1e-30, "swiglu(%g, %g) = %.9g, want "
                  "%.17g", (double)g, (double)up, got, want);
        float dg, du;
        l3d_swiglu_grad(g, up, d, &dg, &du);
        const double h = 1e-3;
        double fd = d * up * (silu64(g + h) - silu64(g - h)) / (2 * h);
        double mag = fabs((double)d * up) * (3 + fabs(g));
        cr_assert(fabs(dg - fd) <= 1e-6 * mag + 1e-6 * fabs((double)d * up) + 8 * u * mag,
                  "dswiglu/dg at g %g: %.9g, finite differences %.9g", (double)g, (double)dg, fd);
        double du_want = d * silu64(g);
        cr_assert(fabs(du - du_want) <= 1.5e-6 * fabs(du_want) + 1e-30,
                  "dswiglu/du at g %g: %.9g, want %.9g", (double)g, (double)du, du_want);
    }
}

// RoPE: each output is a*c - b*s: two products and a difference, 3 roundings of magnitudes up
// to |a| + |b| (|c|, |s| <= 1): 3 u (|a| + |b|) from the double rotation by the same (c, s);
// the inverse rotation (s negated) brings the pair back within twice that.
Test(device_math, rope_rotation_and_its_inverse) {
    for (int i = 0; i < 20000; i++) {
        double ang = uniform(-100, 100);
        float c = (float)cos(ang), s = (float)sin(ang);
        float a = (float)uniform(-4, 4), b = (float)uniform(-4, 4), x1 = a, x2 = b;
        l3d_rope_rotate(&x1, &x2, c, s);
        double w1 = (double)a * c - (double)b * s, w2 = (double)b * c + (double)a * s;
        double bound = 3 * u * (fabs(a) + fabs(b));
        cr_assert(fabs(x1 - w1) <= bound && fabs(x2 - w2) <= bound, "rotate (%g, %g)", a, b);
        l3d_rope_rotate(&x1, &x2, c, -s);
        // back: the forward's error, rotated (|.| kept), plus the inverse's own; c^2 + s^2 is 1
        // to within 2 u of the rounded c and s
        double back = 2 * bound + 2 * u * (fabs(a) + fabs(b));
        cr_assert(fabs(x1 - a) <= back && fabs(x2 - b) <= back, "inverse of (%g, %g)", a, b);
    }
}

// AdamW, torch.optim.AdamW's documented algorithm in double on the same float inputs and
// scalars: p <- p (1 - lr wd); m <- b1 m + (1 - b1) g; v <- b2 v + (1 - b2) g^2;
// p <- p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps). The float update rounds each of about
// 12 operations; m and v come out within 4 u relative of their magnitudes (two products and a
// sum of non-negative terms for v; |b1 m| + |(1-b1) g| for m), the step's quotient within 8 u
// of |lr / bc1 * m / (...)|, the decayed parameter within 2 u of |p| (the decay factor
// rounded from double, the product), and the final sum rounds once more (u of |p| + |step|).
Test(device_math, adamw_element_matches_torchs_algorithm) {
    for (int i = 0; i < 20000; i++) {
        float lr = (float)uniform(1e-5, 1e-2), b1 = 0.9f, b2 = (float)uniform(0.95, 0.999);
        float eps = 1e-8f, wd = (float)uniform(0, 0.2), gs = (float)uniform(0.1, 1.0);
        int step = 1 + (int)uniform(0, 1000);
        float bc1 = (float)(1 - pow(b1, step)), bc2 = (float)(1 - pow(b2, step));
        float p = (float)uniform(-1, 1), m = (float)uniform(-1e-2, 1e-2);
        float v = (float)uniform(0, 1e-4), g = (float)uniform(-1e-1, 1e-1);
        double gd = (double)g * gs;
        double pd = p * (1 - (double)lr * wd);
        double md = b1 * (double)m + (1 - (double)b1) * gd;
        double vd = b2 * (double)v + (1 - (double)b2) * gd * gd;
        double stepd = (double)lr / bc1 * md / (sqrt(vd) / sqrt((double)bc2) + eps);
        double want = pd - stepd;
        l3d_adamw_k_t k = l3d_adamw_consts(lr, b1, b2, eps, wd, bc1, bc2, gs);
        float pp = p, mm = m, vv = v;
        l3d_adamw_elem(&k, g, &pp, &mm, &vv);
        cr_assert(fabs(mm - md) <= 4 * u * (fabs(b1 * (double)m) + fabs(gd)), "m: %.9g vs %.17g",
                  (double)mm, md);
        cr_assert(fabs(vv - vd) <= 4 * u * vd + 1e-45, "v: %.9g vs %.17g", (double)vv, vd);
        // m's and v's errors carry into the step: 4 u and half of 4 u (the square root)
        double bound = 3 * u * fabs(pd) + (8 + 4 + 2 + 1) * u * fabs(stepd);
        cr_assert(fabs(pp - want) <= bound, "p: %.9g vs %.17g (bound %.3g)", (double)pp, want,
                  bound);
    }
}

// Online softmax: a row of n scores split in two anywhere (an empty part included), each
// part's (max, sum of exp(x - max)) in float, merged: the max is exact; the sum against the
// double sum of exp(x - max) over the whole row. Each exp is within 1e-6 relative (above), a
// part's float sum of n terms within n u of its magnitude, the merge's factor one more exp
// and its products and sum 3 u: 1e-6 + (n + 3) u relative for positive terms, times 2 for the
// factor multiplying an already-inexact sum.
Test(device_math, softmax_merge_of_two_parts) {
    enum { N = 64 };
    float x[N];
    for (int trial = 0; trial < 5000; trial++) {
        int n = 1 + (int)uniform(0, N), cut = (int)uniform(0, n + 1);
        double spread = uniform(0.1, 30);
        for (int i = 0; i < n; i++) x[i] = (float)uniform(-spread, spread);
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
        for (int i = 0; i < n; i++) {
            int k = i >= cut;
            m[k] = fmaxf(m[k], x[i]);
        }
        for (int i = 0; i < n; i++) {
            int k = i >= cut;
            l[k] += l3d_expf(x[i] - m[k]);
        }
        float mm, ll, c1, c2;
        l3d_softmax_merge(m[0], l[0], m[1], l[1], &mm, &ll, &c1, &c2);
        double mx = -INFINITY, want = 0;
        for (int i = 0; i < n; i++) mx = fmax(mx, x[i]);
        for (int i = 0; i < n; i++) want += exp(x[i] - mx);
        cr_assert_eq((double)mm, mx, "the merged max");
        double bound = 2 * (1e-6 + (n + 3) * u) * want;
        cr_assert(fabs(ll - want) <= bound, "n %d cut %d: sum %.9g, want %.17g", n, cut,
                  (double)ll, want);
        cr_assert(cut == 0 ? c1 == 0.0f : cut == n ? c2 == 0.0f : c1 > 0 && c2 > 0);
    }
    // both empty: the empty row, no NaN
    float mm, ll, c1, c2;
    l3d_softmax_merge(-INFINITY, 0, -INFINITY, 0, &mm, &ll, &c1, &c2);
    cr_assert(mm == -INFINITY && ll == 0 && c1 == 0 && c2 == 0);
}
