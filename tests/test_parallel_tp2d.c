// parallel.tp_mode "2d" in the trainer: 20 steps of every 2d layout that fits here reproduce
// the single-rank run's float64 trajectory to the standard of the 1D layouts
// (tests/harness/parallel.c, above check_run), and checkpoints move between the modes. Most
// run the harness's model with untied embeddings (its own single-rank reference), so that the
// head is a SUMMA product of its own; tied_embeddings runs the default, tied model.
#include <criterion/criterion.h>

#include "tests/harness/parallel.h"

static result_t ref;

static void untied_reference(void) { reference_untied(&ref); }

// {dp, tp, pp, zero, recompute, accum_total, bucket, clip, gpipe, sp}
Test(parallel_tp2d, layouts_reproduce_one_rank, .timeout = 300) {
    layout_t ls[] = {
        {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0},     // one 2 x 2 grid
        {1, 4, 1, 0, 1, 8, 0, 0.25f, 0, 0},     // recompute
        {2, 4, 1, 1, 0, 8, 3000, 0.25f, 0, 0},  // dp 2 x 2d, ZeRO-1 in buckets
        {2, 4, 1, 2, 0, 8, 0, 0.25f, 0, 0},     // dp 2 x 2d, ZeRO-2
        {1, 4, 2, 0, 0, 8, 0, 0.25f, 0, 0},     // 2d x pp 2, 1F1B
        {1, 4, 2, 0, 1, 8, 0, 0.25f, 1, 0},     // 2d x pp 2, GPipe, recompute
    };
    untied_reference();
    g_tp_mode = 2;
    for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++) compare_to(&ls[i], &ref);
    g_tp_mode = 0;
}

// Tied embeddings (the harness's default model): the head's block comes from the transposed
// grid rank and its gradient goes back there, on one stage and as the last stage's copy of
// the table; ZeRO-2 takes the head's gradient in the embedding's window.
Test(parallel_tp2d, tied_embeddings, .timeout = 300) {
    layout_t ls[] = {
        {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0},  // one 2 x 2 grid
        {2, 4, 1, 2, 0, 8, 0, 0.25f, 0, 0},  // dp 2 x 2d, ZeRO-2
        {1, 4, 2, 0, 0, 8, 0, 0.25f, 0, 0},  // 2d x pp 2, 1F1B: the table on both stages
    };
    reference();
    g_tp_mode = 2;
    for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++) compare_to(&ls[i], &g_ref);
    g_tp_mode = 0;
}

// 16-bit training on the grid: its blocks broadcast and reduced in the training dtype, the
// weight gradients' partials in float32; the counted bytes and the memory as planned, the loss
// on the float64 trajectory within the 16-bit bound (tracks_bound), and the tp traffic below
// float32's. bf16 and fp16 alternate over one grid, dp 2 with ZeRO-1, pp 2 and dp 2 with
// ZeRO-3 (tied model).
Test(parallel_tp2d, bf16_fp16, .timeout = 600) {
    layout_t ls[] = {
        {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0},  // one 2 x 2 grid, bf16
        {2, 4, 1, 1, 0, 8, 0, 0.25f, 0, 0},  // dp 2 x 2d, ZeRO-1, fp16
        {1, 4, 2, 0, 1, 8, 0, 0.25f, 0, 0},  // 2d x pp 2, recompute, bf16
        {2, 4, 1, 3, 0, 8, 0, 0.25f, 0, 0},  // dp 2 x 2d, ZeRO-3 (16-bit gathers), fp16
    };
    reference();
    g_tp_mode = 2;
    check_16bit(ls, 4);
    g_tp_mode = 0;
}

// ZeRO-3 (each rank's blocks partitioned over dp, gathered per layer) and ZeRO offload on the
// grid: the trajectory, the counted bytes and the memory as for 1D.
Test(parallel_tp2d, zero3_and_offload, .timeout = 300) {
    static const off_knobs_t both = {1, 1};
    layout_t z3 = {2, 4, 1, 3, 0, 8, 0, 0.25f, 0, 0};  // dp 2 x 2d, ZeRO-3
    reference();
    g_tp_mode = 2;
    compare_to(&z3, &g_ref);
    g_off = &both;  // the optimizer and the parameters in host memory
    compare_to(&z3, &g_ref);
    g_off = NULL;
    g_tp_mode = 0;
}

// A checkpoint holds the single-rank layout, so it resumes under either mode.
Test(parallel_tp2d, resume_across_modes, .timeout = 300) {
    layout_t t4 = {1, 4, 1, 0, 0, 8, 0, 0.25f, 0, 0}, d2t2 = {2, 2, 1, 1, 0, 8, 0, 0.25f, 0, 0};
    layout_t one = {1, 1, 1, 0, 0, 8, 0, 0.25f, 0, 0};
    untied_reference();
    knobs_t d1 = {NULL, NULL, 0, 0}, d2 = {NULL, NULL, 2, 0};
    resume_knobs(&t4, d2, &one, d1, &ref, NULL);   // 2d -> single rank
    resume_knobs(&d2t2, d1, &t4, d2, &ref, NULL);  // 1d (dp 2 x tp 2) -> 2d
}

// Interleaved 1F1B needs pp x chunks <= layers: a 4-layer model, its own reference.
Test(parallel_tp2d, interleaved_pipeline, .timeout = 300) {
    g_layers = 4;
    untied_reference();
    layout_t il = {1, 4, 2, 0, 0, 8, 0, 0.25f, 2, 0};  // 2d x pp 2, 2 chunks per stage
    g_tp_mode = 2;
    compare_to(&il, &ref);
    g_tp_mode = 0;
    g_layers = 0;
}
