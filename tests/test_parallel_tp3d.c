// parallel.tp_mode "3d" in the trainer: 20 steps of every 3d layout that fits here (a 2 x 2 x 2
// cube, alone and with dp 2 or pp 2: 16 threads) reproduce the single-rank run's float64
// trajectory to the standard of the 1D layouts (tests/harness/parallel.c, above check_run),
// and checkpoints move between the modes. Most run the harness's model with untied
// embeddings (the head a cube product of its own); tied_embeddings runs the default, tied
// one. Micro-batches are 4 sequences (the cube splits them into q^2 = 4 slices) with half the
// accumulation steps, so each step sees the same 16 sequences as the single-rank reference's
// 8 micro-batches of 2.
#include <criterion/criterion.h>

#include "tests/harness/parallel.h"

static result_t ref;

static void untied_reference(void) { reference_untied(&ref); }

// {dp, tp, pp, zero, recompute, accum_total, bucket, clip, gpipe, sp}
Test(parallel_tp3d, layouts_reproduce_one_rank, .timeout = 600) {
    layout_t ls[] = {
        {1, 8, 1, 0, 0, 4, 0, 0.25f, 0, 0},     // one 2 x 2 x 2 cube
        {1, 8, 1, 0, 1, 4, 0, 0.25f, 0, 0},     // recompute
        {2, 8, 1, 1, 0, 4, 3000, 0.25f, 0, 0},  // dp 2 x 3d, ZeRO-1 in buckets
        {2, 8, 1, 2, 0, 4, 0, 0.25f, 0, 0},     // dp 2 x 3d, ZeRO-2
        {1, 8, 2, 0, 0, 4, 0, 0.25f, 0, 0},     // 3d x pp 2, 1F1B
        {1, 8, 2, 0, 1, 4, 0, 0.25f, 1, 0},     // 3d x pp 2, GPipe, recompute
    };
    untied_reference();
    g_tp_mode = 3, g_micro = 4;
    for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++) compare_to(&ls[i], &ref);
    g_tp_mode = 0, g_micro = 0;
}

// Tied embeddings (the harness's default model): the head reads a row range of the table's
// columns in place, on one stage and as the last stage's copy of the table.
Test(parallel_tp3d, tied_embeddings, .timeout = 600) {
    layout_t ls[] = {
        {1, 8, 1, 0, 0, 4, 0, 0.25f, 0, 0},  // one 2 x 2 x 2 cube
        {1, 8, 2, 0, 0, 4, 0, 0.25f, 0, 0},  // 3d x pp 2, 1F1B: the table on both stages
    };
    reference();
    g_tp_mode = 3, g_micro = 4;
    for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++) compare_to(&ls[i], &g_ref);
    g_tp_mode = 0, g_micro = 0;
}

// 16-bit training on the cube (check_16bit, tests/harness/parallel.c): bf16 on one cube, fp16
// with pp 2 (tied model).
Test(parallel_tp3d, bf16_fp16, .timeout = 600) {
    layout_t ls[] = {
        {1, 8, 1, 0, 0, 4, 0, 0.25f, 0, 0},  // one 2 x 2 x 2 cube, bf16
        {1, 8, 2, 0, 0, 4, 0, 0.25f, 0, 0},  // 3d x pp 2, fp16
    };
    reference();
    g_tp_mode = 3, g_micro = 4;
    check_16bit(ls, 2);
    g_tp_mode = 0, g_micro = 0;
}

// ZeRO-3 on the cube (16 threads), with the optimizer and the parameters offloaded.
Test(parallel_tp3d, zero3_and_offload, .timeout = 600) {
    static const off_knobs_t both = {1, 1};
    layout_t z3 = {2, 8, 1, 3, 0, 4, 0, 0.25f, 0, 0};  // dp 2 x 3d, ZeRO-3
    reference();
    g_tp_mode = 3, g_micro = 4;
    g_off = &both;
    compare_to(&z3, &g_ref);
    g_off = NULL;
    g_tp_mode = 0, g_micro = 0;
}

// A checkpoint holds the single-rank layout, so it resumes under any mode.
Test(parallel_tp3d, resume_across_modes, .timeout = 600) {
    layout_t t8 = {1, 8, 1, 0, 0, 4, 0, 0.25f, 0, 0}, t4 = {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    untied_reference();
    knobs_t d1 = {NULL, NULL, 0, 0}, d2 = {NULL, NULL, 2, 0}, d3 = {NULL, NULL, 3, 4};
    resume_knobs(&t8, d3, &one, d1, &ref, NULL);  // 3d -> single rank
    resume_knobs(&t4, d2, &t8, d3, &ref, NULL);   // 2d -> 3d
}

// Interleaved 1F1B needs pp x chunks <= layers: a 4-layer model, its own reference.
Test(parallel_tp3d, interleaved_pipeline, .timeout = 600) {
    g_layers = 4;
    untied_reference();
    layout_t il = {1, 8, 2, 0, 0, 4, 0, 0.25f, 2, 0};  // 3d x pp 2, 2 chunks per stage
    g_tp_mode = 3, g_micro = 4;
    compare_to(&il, &ref);
    g_tp_mode = 0, g_micro = 0, g_layers = 0;
}
