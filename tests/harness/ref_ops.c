// Float64 references the CPU device's tests share (test_cpu_ops, test_cpu_dtypes).
#include "tests/harness/ref_ops.h"

#include <math.h>
#include <stdlib.h>

void l3d_ref_xent(const float *z, const int32_t *t, int N, int V, double gs, double *rg,
                  double *rl) {
    for (int n = 0; n < N; n++) {
        const float *zr = z + (size_t)n * V;
        if (t[n] < 0) continue;
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < V; i++) mx = fmax(mx, zr[i]);
        for (int i = 0; i < V; i++) s += exp(zr[i] - mx);
        rl[n] = log(s) + mx - zr[t[n]];
        for (int i = 0; i < V; i++)
            rg[(size_t)n * V + i] = gs * (exp(zr[i] - mx) / s - (i == t[n] ? 1.0 : 0.0));
    }
}

size_t l3d_ref_qi(const shape_t *s, int b, int i, int h) {
    return (((size_t)b * s->Tq + i) * s->H + h) * s->D;
}
size_t l3d_ref_ki(const shape_t *s, int b, int j, int g) {
    return (size_t)b * s->Tmax * s->KVH * s->D + ((size_t)j * s->KVH + g) * s->D;
}
size_t l3d_ref_dki(const shape_t *s, int b, int j, int g) {
    return (((size_t)b * s->Tk + j) * s->KVH + g) * s->D;
}

void l3d_ref_attention(const shape_t *s, const float *q, const float *k, const float *v,
                          const float *dout, double *out, double *lse, double *dq, double *dk,
                          double *dv) {
    int off = s->Tk - s->Tq, grp = s->H / s->KVH, D = s->D;
    double scale = 1.0 / sqrt((double)D);
    double *p = calloc((size_t)s->Tk, sizeof(double)), *dp = calloc((size_t)s->Tk, sizeof(double));
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->H; h++)
            for (int i = 0; i < s->Tq; i++) {
                int g = h / grp, nj = i + off + 1;
                const float *qr = q + l3d_ref_qi(s, b, i, h), *gr = dout + l3d_ref_qi(s, b, i, h);
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < nj; j++) {
                    double d = 0;
                    for (int c = 0; c < D; c++) d += (double)qr[c] * k[l3d_ref_ki(s, b, j, g) + c];
                    p[j] = d * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j < nj; j++) sum += exp(p[j] - mx);
                lse[((size_t)b * s->H + h) * s->Tq + i] = mx + log(sum);
                for (int j = 0; j < nj; j++) p[j] = exp(p[j] - mx) / sum;
                double *o = out + l3d_ref_qi(s, b, i, h);
                for (int c = 0; c < D; c++) {
                    o[c] = 0;
                    for (int j = 0; j < nj; j++) o[c] += p[j] * v[l3d_ref_ki(s, b, j, g) + c];
                }
                if (!dq) continue;
                double pdp = 0.0;
                for (int j = 0; j < nj; j++) {
                    dp[j] = 0;
                    for (int c = 0; c < D; c++) dp[j] += (double)gr[c] * v[l3d_ref_ki(s, b, j, g) + c];
                    pdp += p[j] * dp[j];
                }
                for (int j = 0; j < nj; j++) {
                    double ds = p[j] * (dp[j] - pdp) * scale;
                    for (int c = 0; c < D; c++) {
                        dq[l3d_ref_qi(s, b, i, h) + c] += ds * k[l3d_ref_ki(s, b, j, g) + c];
                        dk[l3d_ref_dki(s, b, j, g) + c] += ds * qr[c];
                        dv[l3d_ref_dki(s, b, j, g) + c] += p[j] * gr[c];
                    }
                }
            }
    free(p), free(dp);
}

