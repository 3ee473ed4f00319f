// Every device reproduces the CPU device: training on cpu-opaque (memory the host cannot
// read) and cpu-async (ops that finish at the next wait) gives the CPU device's losses,
// gradient norms and final weights bit for bit: the same kernels in the same order, so any
// difference is a read of device memory before its op finished, or a host access the device
// would have refused. The devices themselves: tests/test_device_test.c.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/parallel.h"

typedef struct {
    layout_t L;
    int bf16, fp16, tp_mode;
} dev_case_t;

static const char *k_devices[] = {"cpu-opaque", "cpu-async"};

static void same_as_cpu(const dev_case_t *c) {
    make_data();
    g_bf16 = c->bf16;
    g_fp16 = c->fp16;
    g_tp_mode = c->tp_mode;
    result_t ref = {0};
    g_device = "cpu";
    run_layout(&c->L, &ref);
    int n = c->L.dp * c->L.tp * c->L.pp;
    for (size_t d = 0; d < 2; d++) {
        result_t got = {0};
        g_device = k_devices[d];
        run_layout(&c->L, &got);
        for (int s = 0; s < STEPS; s++) {
            cr_assert(!memcmp(&got.loss[s], &ref.loss[s], sizeof(double)),
                      "%s: step %d loss %.17g, cpu %.17g", k_devices[d], s + 1, got.loss[s],
                      ref.loss[s]);
            cr_assert(!memcmp(&got.gnorm[s], &ref.gnorm[s], sizeof(double)),
                      "%s: step %d grad norm %.17g, cpu %.17g", k_devices[d], s + 1,
                      got.gnorm[s], ref.gnorm[s]);
        }
        for (int r = 0; r < n; r++) {
            cr_assert_eq(got.nt[r], ref.nt[r]);
            size_t np = 0;
            for (int i = 0; i < ref.nt[r]; i++) np += ref.tensors[r][i].numel;
            for (size_t i = 0; i < np; i++)
                cr_assert(!memcmp(&got.params[r][i], &ref.params[r][i], sizeof(float)),
                          "%s: rank %d parameter %zu: %.9g, cpu %.9g", k_devices[d], r, i,
                          got.params[r][i], ref.params[r][i]);
        }
        free_result(&got);
    }
    free_result(&ref);
    g_device = NULL;
}

// One rank: every op of a training step (forward, backward, clipping, AdamW) in float32,
// with recomputation and accumulation, and in bf16 and fp16.
static dev_case_t k_cases[] = {
    {{1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, 0, 0, 0},
    {{1, 1, 1, 0, 1, 8, 0, 0.25f, 0, 0}, 0, 0, 0},
    {{1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, 1, 0, 0},
    {{1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, 0, 10, 0},
};

ParameterizedTestParameters(devices, same_as_cpu) {
    return cr_make_param_array(dev_case_t, k_cases, sizeof(k_cases) / sizeof(k_cases[0]));
}

ParameterizedTest(dev_case_t *c, devices, same_as_cpu, .timeout = 240) { same_as_cpu(c); }
