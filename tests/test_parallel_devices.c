// Every device reproduces the CPU device: training on cpu-opaque (memory the host cannot
// read) and cpu-async (ops that finish at the next wait) gives the CPU device's losses,
// gradient norms and final weights bit for bit: the same kernels in the same order, so any
// difference is a read of device memory before its op finished, or a host access the device
// would have refused. The devices themselves: tests/test_device_test.c.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness/parallel.h"

typedef struct {
    layout_t L;
    int bf16, fp16, tp_mode, offload, micro;
    int grad16;   // data_types.grad_accum_dtype: the training dtype
    layout_t to;  // dp 0: train the 20 steps on L; else save at step 10 on L, resume on `to`
} dev_case_t;

static const off_knobs_t k_offload = {1, 1};

// The case on the device g_device names: its result (the resumed run's, for a resume case).
static void run_case(const dev_case_t *c, result_t *res) {
    g_bf16 = c->bf16;
    g_fp16 = c->fp16;
    g_tp_mode = c->tp_mode;
    g_micro = c->micro;
    g_off = c->offload ? &k_offload : NULL;
    g_grad_dtype = !c->grad16 ? -1 : c->bf16 ? L3D_BFLOAT16 : L3D_FLOAT16;
    if (!c->to.dp) {
        run_layout(&c->L, res);
    } else {
        char dir[] = "/tmp/l3d_test_devices_XXXXXX", ck[64], cmd[96];
        cr_assert_not_null(mkdtemp(dir));
        snprintf(ck, sizeof(ck), "%s/ck", dir);
        result_t a = {0};
        run_layout_ckpt(&c->L, &a, ck, NULL);
        free_result(&a);
        run_layout_ckpt(&c->to, res, NULL, ck);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        cr_assert_eq(system(cmd), 0);
    }
    g_bf16 = g_fp16 = g_tp_mode = g_micro = 0;
    g_off = NULL;
    g_grad_dtype = -1;
}

// The test devices, and cpu-async again with the local transport taking device buffers as
// NCCL does (L3D_LOCAL_DEVICE_BUFFERS: the core's direct path, tests/test_comm_device.c),
// for the layouts with more than one rank.
static const char *k_devices[] = {"cpu-opaque", "cpu-async", "cpu-async"};
static const int k_direct[] = {0, 0, 1};
enum { NDEV = 3 };

static void same_as_cpu(const dev_case_t *c) {
    make_data();
    result_t ref = {0};
    g_device = "cpu";
    run_case(c, &ref);
    const layout_t *last = c->to.dp ? &c->to : &c->L;
    int n = last->dp * last->tp * last->pp;
    for (size_t d = 0; d < NDEV; d++) {
        if (k_direct[d] && n * c->L.dp * c->L.tp * c->L.pp == 1) continue;
        result_t got = {0};
        g_device = k_devices[d];
        setenv("L3D_LOCAL_DEVICE_BUFFERS", k_direct[d] ? "1" : "0", 1);
        run_case(c, &got);
        const char *how = k_direct[d] ? ", device buffers to the transport" : "";
        for (int s = c->to.dp ? STEPS / 2 : 0; s < STEPS; s++) {
            cr_assert(!memcmp(&got.loss[s], &ref.loss[s], sizeof(double)),
                      "%s%s: step %d loss %.17g, cpu %.17g", k_devices[d], how, s + 1,
                      got.loss[s], ref.loss[s]);
            cr_assert(!memcmp(&got.gnorm[s], &ref.gnorm[s], sizeof(double)),
                      "%s%s: step %d grad norm %.17g, cpu %.17g", k_devices[d], how, s + 1,
                      got.gnorm[s], ref.gnorm[s]);
        }
        for (int r = 0; r < n; r++) {
            cr_assert_eq(got.nt[r], ref.nt[r]);
            size_t np = 0;
            for (int i = 0; i < ref.nt[r]; i++) np += ref.tensors[r][i].numel;
            for (size_t i = 0; i < np; i++)
                cr_assert(!memcmp(&got.params[r][i], &ref.params[r][i], sizeof(float)),
                          "%s%s: rank %d parameter %zu: %.9g, cpu %.9g", k_devices[d], how,
                          r, i, got.params[r][i], ref.params[r][i]);
        }
        free_result(&got);
    }
    unsetenv("L3D_LOCAL_DEVICE_BUFFERS");
    free_result(&ref);
    g_device = NULL;
}

// One rank: every op of a training step (forward, backward, clipping, AdamW) in float32,
// with recomputation and accumulation, and in bf16 and fp16. Then the layouts: dp with ZeRO
// 1, 2 (bucketed) and 3, tp (1d with and without sequence parallelism, 2d, 3d), pp with 1F1B,
// GPipe and interleaving, and the 3D mixes, in float32 and 16-bit; ZeRO-3 with offload;
// ZeRO-1/2's sharded float32 master under 16-bit weights, offloaded and resumed; 16-bit
// weight gradients (accumulated over micro-batches with tp sums; in ZeRO-2 windows offloaded
// over a pipeline; in ZeRO-3 windows widened into their scratch).
// Checkpoints: saved sharded on one layout, resumed on another (the gathers and the
// resharding of model_tp.c and checkpoint*.c).
static dev_case_t k_cases[] = {
    {.L = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}},
    {.L = {1, 1, 1, 0, 1, 8, 0, 0.25f, 0, 0}},
    {.L = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, .bf16 = 1},
    {.L = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}, .fp16 = 10},
    {.L = {2, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}},
    {.L = {2, 1, 1, 1, 0, 8, 0, 0.25f, 0, 0}},
    {.L = {4, 1, 1, 2, 0, 8, 3000, 0.25f, 0, 0}},
    {.L = {2, 1, 1, 3, 1, 8, 0, 0.25f, 0, 0}},
    {.L = {1, 2, 1, 0, 0, 8, 0, 0.25f, 0, 0}},
    {.L = {1, 2, 1, 0, 1, 8, 0, 0.25f, 0, 1}},
    {.L = {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0}, .tp_mode = 2},
    {.L = {1, 1, 2, 0, 0, 8, 0, 0.25f, 0, 0}},
    {.L = {1, 1, 3, 0, 0, 8, 0, 0.25f, 1, 0}},
    {.L = {2, 2, 2, 1, 1, 8, 3000, 0.25f, 0, 0}},
    {.L = {2, 2, 2, 3, 0, 8, 0, 0.25f, 1, 1}},
    {.L = {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 0}, .bf16 = 1},
    {.L = {2, 1, 2, 2, 0, 8, 0, 0.25f, 0, 0}, .fp16 = 10},
    {.L = {1, 8, 1, 0, 0, 4, 0, 0.25f, 0, 0}, .tp_mode = 3, .micro = 4},
    {.L = {2, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, .offload = 1},
    {.L = {2, 1, 1, 2, 0, 8, 3000, 0.25f, 0, 0}, .bf16 = 1, .offload = 1},
    {.L = {2, 1, 2, 1, 0, 8, 0, 0.25f, 0, 0}, .fp16 = 10, .to = {2, 1, 1, 2, 0, 8, 0, 0.25f, 0, 0}},
    {.L = {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 1}, .bf16 = 1, .grad16 = 1},
    {.L = {2, 1, 2, 2, 0, 8, 3000, 0.25f, 0, 0}, .fp16 = 10, .offload = 1, .grad16 = 1},
    {.L = {2, 1, 1, 3, 0, 8, 0, 0.25f, 0, 0}, .bf16 = 1, .grad16 = 1},
    {.L = {2, 2, 2, 3, 0, 8, 0, 0.25f, 0, 0}, .to = {1, 2, 2, 0, 0, 8, 0, 0.25f, 0, 0}},
    {.L = {2, 2, 2, 1, 0, 8, 0, 0.25f, 0, 0}, .to = {1, 4, 2, 0, 0, 8, 0, 0.25f, 0, 0}},
    {.L = {1, 2, 2, 0, 0, 8, 0, 0.25f, 0, 0}, .to = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0}},
};
ParameterizedTestParameters(devices, same_as_cpu) {
    return cr_make_param_array(dev_case_t, k_cases, sizeof(k_cases) / sizeof(k_cases[0]));
}

ParameterizedTest(dev_case_t *c, devices, same_as_cpu, .timeout = 240) { same_as_cpu(c); }
