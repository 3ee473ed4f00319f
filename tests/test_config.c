// Tests for the configuration layer: presets and parameter counts, DeepSpeed ds_config.json
// (the seed user's file, batch identity, key errors) and the learning-rate schedules against
// DeepSpeed's formulas. Hugging Face config.json: test_config_hf.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "llama3d/comm.h"
#include "llama3d/config.h"
#include "llama3d/ctx.h"
#include "tests/harness/config_env.h"

TestSuite(config, .init = setup, .fini = teardown);

// ---- presets -----------------------------------------------------------------------------
Test(config, presets_all_valid) {
    const char *const *names = l3d_model_config_preset_names();
    int n = 0;
    for (; names[n]; n++) {
        l3d_model_config_t m;
        cr_assert_eq(l3d_model_config_preset(ctx, names[n], &m), L3D_OK, "%s", names[n]);
        cr_assert_str_eq(m.name, names[n]);
        cr_assert_eq(l3d_model_config_validate(ctx, &m), L3D_OK, "%s: %s", names[n], err());
        cr_assert_eq(m.num_attention_heads % m.num_key_value_heads, 0);
    }
    cr_assert_eq(n, 6);
}

Test(config, preset_tiny_values) {
    l3d_model_config_t m;
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3-tiny", &m), L3D_OK);
    cr_assert_eq(m.hidden_size, 128);
    cr_assert_eq(m.intermediate_size, 384);
    cr_assert_eq(m.num_hidden_layers, 4);
    cr_assert_eq(m.num_attention_heads, 4);
    cr_assert_eq(m.num_key_value_heads, 2);
    cr_assert_eq(m.head_dim, 32);
    cr_assert_eq(m.vocab_size, 264);
    cr_assert_eq(m.vocab_size % 8, 0);
    cr_assert_eq(m.max_position_embeddings, 1024);
    cr_assert_float_eq(m.rms_norm_eps, 1e-5f, 1e-12);
    cr_assert_float_eq(m.rope_theta, 500000.0f, 1e-3);
    cr_assert_eq(m.rope_scaling_llama3, 0);
    cr_assert_eq(m.tie_word_embeddings, 1);
    cr_assert_eq(m.bos_token_id, 256);
    cr_assert_eq(m.eos_token_id, 257);
    cr_assert_float_eq(m.initializer_range, 0.02f, 1e-9);
}

Test(config, preset_8b_and_1b_rope) {
    l3d_model_config_t m;
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3-8b", &m), L3D_OK);
    cr_assert_eq(m.rope_scaling_llama3, 1);
    cr_assert_float_eq(m.rope_factor, 8.0f, 0);
    cr_assert_float_eq(m.rope_low_freq_factor, 1.0f, 0);
    cr_assert_float_eq(m.rope_high_freq_factor, 4.0f, 0);
    cr_assert_eq(m.rope_original_max_position_embeddings, 8192);
    cr_assert_eq(m.max_position_embeddings, 131072);
    cr_assert_eq(m.tie_word_embeddings, 0);
    cr_assert_eq(m.bos_token_id, 128000);
    cr_assert_eq(m.eos_token_id, 128001);
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3.2-1b", &m), L3D_OK);
    cr_assert_float_eq(m.rope_factor, 32.0f, 0);
    cr_assert_eq(m.tie_word_embeddings, 1);
    cr_assert_eq(m.head_dim, 64);
}

Test(config, preset_unknown) {
    l3d_model_config_t m;
    ASSERT_ERR_HAS(l3d_model_config_preset(ctx, "llama2-7b", &m), L3D_ERR_NOT_FOUND,
                   "llama3-8b");
}

// Published totals: Llama 3.1 8B 8,030,261,248; 3.2 1B 1,235,814,400; 3.2 3B 3,212,749,824;
// 3.1 70B 70,553,706,496; 3.1 405B 405,853,388,800.
Test(config, num_params_published) {
    struct {
        const char *name;
        uint64_t n;
    } want[] = {{"llama3-8b", 8030261248ull},     {"llama3.2-1b", 1235814400ull},
                {"llama3.2-3b", 3212749824ull},   {"llama3-70b", 70553706496ull},
                {"llama3-405b", 405853388800ull}, {"llama3-tiny", 821376ull}};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        l3d_model_config_t m;
        cr_assert_eq(l3d_model_config_preset(ctx, want[i].name, &m), L3D_OK);
        cr_assert_eq(l3d_model_config_num_params(&m), want[i].n, "%s: %llu", want[i].name,
                     (unsigned long long)l3d_model_config_num_params(&m));
    }
    // Untying the 1B adds exactly one more V x C matrix.
    l3d_model_config_t m;
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3.2-1b", &m), L3D_OK);
    m.tie_word_embeddings = 0;
    cr_assert_eq(l3d_model_config_num_params(&m), 1235814400ull + 128256ull * 2048ull);
}

// ---- ds_config.json ----------------------------------------------------------------------
Test(config, defaults) {
    l3d_train_config_t c;
    l3d_train_config_default(ctx, &c);
    cr_assert_str_eq(c.model.name, "llama3-tiny");
    cr_assert_str_eq(c.model_source, "llama3-tiny");
    cr_assert_eq(c.train_batch_size, 8);
    cr_assert_eq(c.micro_batch_size, 8);
    cr_assert_eq(c.grad_accum_steps, 1);
    cr_assert_eq(c.seq_len, 64);
    cr_assert_float_eq(c.lr, 1e-3f, 0);
    cr_assert_float_eq(c.beta1, 0.9f, 0);
    cr_assert_float_eq(c.beta2, 0.95f, 0);
    cr_assert_float_eq(c.eps, 1e-8f, 0);
    cr_assert_float_eq(c.weight_decay, 0.1f, 0);
    cr_assert_eq(c.adam_w_mode, 1);
    cr_assert_float_eq(c.gradient_clipping, 1.0f, 0);
    cr_assert_eq(c.steps, 200);
    cr_assert_eq(c.steps_per_print, 10);
    cr_assert_eq(c.seed, 1);
    cr_assert_eq(c.dp, 1);
    cr_assert_eq(c.tp, 1);
    cr_assert_eq(c.pp, 1);
    cr_assert_str_eq(c.device, "cpu");
    cr_assert_eq(c.sched, L3D_SCHED_CONSTANT);
    cr_assert_eq(c.n_notes, 0);
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
    for (int s = 0; s < 500; s += 37) cr_assert_float_eq(l3d_train_config_lr(&c, s), 1e-3f, 0);
    // An empty file changes nothing.
    l3d_train_config_t d = c;
    cr_assert_eq(ds("{}", &d), L3D_OK, "%s", err());
    cr_assert_str_eq(d.origin, "ds.json");
    memset(d.origin, 0, sizeof(d.origin));
    cr_assert(memcmp(&c, &d, sizeof(c)) == 0);
}

Test(config, seed_file) {
    l3d_train_config_t c;
    l3d_train_config_default(ctx, &c);
    cr_assert_eq(l3d_train_config_from_file(ctx, L3D_TEST_DATA "/ds_config_seed.json", &c),
                 L3D_OK, "%s", err());
    cr_assert_eq(c.micro_batch_size, 4);
    cr_assert_eq(c.grad_accum_steps, 8);
    cr_assert_eq(c.train_batch_size, 32);
    cr_assert_float_eq(c.gradient_clipping, 1.0f, 0);
    cr_assert_eq(c.steps_per_print, 10);
    cr_assert_eq(c.zero_stage, 3);
    cr_assert_eq(c.fp16, 1);
    cr_assert_eq(c.bf16, 0);
    // Its loss scaling, parsed (DeepSpeed's names; min_loss_scale not given: the default 1).
    cr_assert_eq(c.fp16_loss_scale, 0.0);
    cr_assert_eq(c.fp16_initial_scale_power, 32);
    cr_assert_eq(c.fp16_loss_scale_window, 1000);
    cr_assert_eq(c.fp16_hysteresis, 2);
    cr_assert_eq(c.fp16_min_loss_scale, 1.0);
    cr_assert_eq(c.activation_checkpointing, 1);
    cr_assert_eq(c.overlap_comm, 1);
    cr_assert_eq(c.reduce_bucket_size, 1e8);
    cr_assert_eq(c.wall_clock_breakdown, 0);
    cr_assert(!has_note(&c, "fp16"));  // effective: float16 passes over float32 masters
    cr_assert(!has_note(&c, "stage 3"));  // effective: parameters sharded (trainer_zero3.c)
    cr_assert_eq(c.stage3_prefetch_bucket_size, 1e8);
    cr_assert_eq(c.stage3_param_persistence_threshold, 1e4);
    cr_assert_eq(c.stage3_max_live_parameters, 1e9);
    cr_assert_eq(c.stage3_gather_16bit_weights_on_model_save, 1);
    cr_assert(!has_note(&c, "stage3_gather_16bit_weights_on_model_save"));
    // offload effective (core/train/trainer_offload.c): no note, both on the cpu, pinned
    cr_assert(!has_note(&c, "offload_optimizer"));
    cr_assert(!has_note(&c, "offload_param"));
    cr_assert(c.offload_optimizer && c.offload_optimizer_pin && c.offload_param &&
              c.offload_param_pin);
    // The monitors are honoured: no note, DeepSpeed's output_path/job_name directory.
    cr_assert(!has_note(&c, "tensorboard"));
    cr_assert_eq(c.tensorboard, 1);
    cr_assert_str_eq(c.tensorboard_dir, "./tensorboard/llama3_3d_tp");
    cr_assert_eq(c.csv_monitor, 0);
    // partition_activations honoured (split over tp where tp > 1 without SP)
    cr_assert(!has_note(&c, "partition_activations"));
    cr_assert(c.partition_activations == 1 && c.cpu_checkpointing == 0);
    cr_assert(!has_note(&c, "contiguous_memory_optimization"));
    cr_assert(!has_note(&c, "wall_clock_breakdown"));
    for (int i = 0; i < c.n_notes; i++)
        cr_assert(strstr(c.notes[i], "not yet"), "%s", c.notes[i]);
    // Applying it twice does not duplicate the notes.
    int n = c.n_notes;
    cr_assert_eq(l3d_train_config_from_file(ctx, L3D_TEST_DATA "/ds_config_seed.json", &c),
                 L3D_OK);
    cr_assert_eq(c.n_notes, n);
}

Test(config, full_file) {
    l3d_train_config_t c;
    l3d_train_config_default(ctx, &c);
    cr_assert_eq(l3d_train_config_from_file(ctx, L3D_TEST_DATA "/ds_full.json", &c), L3D_OK,
                 "%s", err());
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
    cr_assert_eq(c.dp, 2);
    cr_assert_eq(c.grad_accum_steps, 4);  // 16 / (2 * dp 2)
    cr_assert_float_eq(c.gradient_clipping, 0.5f, 0);
    cr_assert_eq(c.steps_per_print, 5);
    cr_assert_float_eq(c.lr, 3e-4f, 0);
    cr_assert_float_eq(c.beta2, 0.95f, 0);
    cr_assert_float_eq(c.weight_decay, 0.1f, 0);
    cr_assert_eq(c.sched, L3D_SCHED_WARMUP_COSINE_LR);
    cr_assert_eq(c.warmup_type_log, 0);
    cr_assert_eq(c.zero_stage, 1);
    cr_assert_eq(c.overlap_comm, 1);
    cr_assert_eq(c.reduce_bucket_size, 2e7);
    cr_assert_eq(c.model.hidden_size, 64);
    cr_assert_eq(c.model.head_dim, 16);
    cr_assert_str_eq(c.model.name, "custom");
    // relative to the config file (tests/data), like "model"
    cr_assert_str_eq(c.data_path, L3D_TEST_DATA "/data/tiny.txt");
    cr_assert_eq(c.seq_len, 32);
    cr_assert_eq(c.steps, 100);
    cr_assert_eq(c.seed, 42);
    cr_assert_str_eq(c.save_dir, "ckpt");
    cr_assert_eq(c.save_interval, 50);
    cr_assert_str_eq(c.metrics_path, "metrics.jsonl");
    cr_assert_eq(c.num_threads, 2);
    cr_assert_eq(c.activation_checkpointing, 0);
    cr_assert_eq(c.allow_tf32, 1);
    cr_assert_eq(c.n_notes, 0, "unexpected note: %s", c.notes[0]);
}

Test(config, model_sources) {
    l3d_train_config_t c;
    l3d_model_config_t p;
    // A path relative to the config file's directory.
    l3d_train_config_default(ctx, &c);
    cr_assert_eq(l3d_train_config_from_file(ctx, L3D_TEST_DATA "/ds_model_path.json", &c), L3D_OK,
                 "%s", err());
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3.2-1b", &p), L3D_OK);
    cr_assert_eq(c.model.hidden_size, p.hidden_size);
    cr_assert_eq(l3d_model_config_num_params(&c.model), 1235814400ull);
    cr_assert_str_eq(c.model_source, "hf_llama3.2-1b_config.json");
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
    cr_assert_eq(c.train_batch_size, 6);
    cr_assert_eq(c.seq_len, 128);
    // A directory holding config.json.
    l3d_train_config_default(ctx, &c);
    cr_assert_eq(l3d_train_config_from_file(ctx, L3D_TEST_DATA "/ds_model_dir.json", &c), L3D_OK,
                 "%s", err());
    cr_assert_eq(l3d_model_config_num_params(&c.model), 8030261248ull);
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
    cr_assert_eq(c.micro_batch_size, 16);
    // A preset name.
    cr_assert_eq(ds_fresh("{\"model\": \"llama3-70b\"}", &c), L3D_OK, "%s", err());
    cr_assert_str_eq(c.model.name, "llama3-70b");
    cr_assert_str_eq(c.model_source, "llama3-70b");
    // A typo of a preset.
    ASSERT_ERR_HAS(ds_fresh("{\"model\": \"llama3-8B\"}", &c), L3D_ERR_CONFIG,
                   "did you mean 'llama3-8b'");
    ASSERT_ERR_HAS(ds_fresh("{\"model\": 8}", &c), L3D_ERR_CONFIG, "model: expected");
    // Inline: errors carry the file and section.
    ASSERT_ERR_HAS(ds_fresh("{\"model\": {\"hidden_size\": 64}}", &c), L3D_ERR_CONFIG,
                   "ds.json: model: intermediate_size: missing");
    // seq_len beyond the model's context: once the flags are read too (finalize).
    ASSERT_ERR_HAS(ds_final("{\"data\": {\"seq_len\": 2048}}", &c), L3D_ERR_CONFIG,
                   "data.seq_len");
}

typedef struct batch_case {
    const char *json;
    int t, m, a;
} batch_case_t;

Test(config, batch_identity) {
    batch_case_t ok[] = {
        {"{\"train_batch_size\": 24, \"train_micro_batch_size_per_gpu\": 3,"
         " \"gradient_accumulation_steps\": 8}",
         24, 3, 8},
        {"{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4}", 32, 4, 8},
        {"{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 4}", 32, 8, 4},
        {"{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2}", 8, 4, 2},
        {"{\"train_batch_size\": 16}", 16, 16, 1},
        {"{\"train_micro_batch_size_per_gpu\": 4}", 4, 4, 1},
        {"{\"gradient_accumulation_steps\": 3}", 24, 8, 3},  // default micro 8 kept
        {"{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4,"
         " \"parallel\": {\"dp\": 2}}",
         32, 4, 4},
        {"{\"train_batch_size\": 32, \"parallel\": {\"dp\": 4}}", 32, 8, 1},
        {"{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,"
         " \"parallel\": {\"dp\": 3}}",
         12, 2, 2},
        {"{\"train_batch_size\": 8.0, \"train_micro_batch_size_per_gpu\": 2}", 8, 2, 4},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        l3d_train_config_t c;
        cr_assert_eq(ds_final(ok[i].json, &c), L3D_OK, "%s: %s", ok[i].json, err());
        cr_assert_eq(c.train_batch_size, ok[i].t, "%s", ok[i].json);
        cr_assert_eq(c.micro_batch_size, ok[i].m, "%s", ok[i].json);
        cr_assert_eq(c.grad_accum_steps, ok[i].a, "%s", ok[i].json);
        cr_assert_eq(c.train_batch_size, c.micro_batch_size * c.grad_accum_steps * c.dp);
    }
}

Test(config, batch_mismatch) {
    l3d_train_config_t c;
    ASSERT_ERR_HAS(ds_final("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4,"
                            " \"gradient_accumulation_steps\": 4}",
                            &c),
                   L3D_ERR_CONFIG, "ds.json: train_batch_size 32");
    cr_assert(strstr(err(), "train_micro_batch_size_per_gpu 4"), "%s", err());
    cr_assert(strstr(err(), "gradient_accumulation_steps 4"), "%s", err());
    cr_assert(strstr(err(), "dp 1"), "%s", err());
    cr_assert(strstr(err(), "gradient_accumulation_steps to 8"), "no fix in: %s", err());
    // No whole micro or accumulation fits: the fix is the global batch.
    ASSERT_ERR_HAS(ds_final("{\"train_batch_size\": 30, \"train_micro_batch_size_per_gpu\": 4,"
                            " \"gradient_accumulation_steps\": 4}",
                            &c),
                   L3D_ERR_CONFIG, "set train_batch_size to 16");

    ASSERT_ERR_HAS(ds_final("{\"train_batch_size\": 30, \"train_micro_batch_size_per_gpu\": 4}",
                            &c),
                   L3D_ERR_CONFIG, "30");
    cr_assert(strstr(err(), "divisible"), "%s", err());
    ASSERT_ERR_HAS(ds_final("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2,"
                            " \"gradient_accumulation_steps\": 4, \"parallel\": {\"dp\": 2}}",
                            &c),
                   L3D_ERR_CONFIG, "dp 2");
    ASSERT_ERR_HAS(ds_fresh("{\"train_batch_size\": 0}", &c), L3D_ERR_CONFIG,
                   "train_batch_size");
}

// The identity involves dp, which command-line flags (--dp) and a launcher's world set after
// the file: checked once, when all are known, so its message and its fix are about the final
// dp (issue 10: the file was checked at dp 1 first, and the fix it gave failed at dp 8).
Test(config, batch_checked_once_with_final_dp) {
    l3d_train_config_t c;
    const char *for_dp2 = "{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4,"
                          " \"gradient_accumulation_steps\": 4}";
    cr_assert_eq(ds_fresh(for_dp2, &c), L3D_OK, "reading the file checked dp 1: %s", err());
    c.dp = 2;  // --dp 2
    c.dp_auto = 0;
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
    cr_assert_eq(c.train_batch_size, 32);
    cr_assert_eq(c.grad_accum_steps, 4);

    // The seed file on a world of 8: one message, about dp 8, whose fix then works.
    l3d_train_config_default(ctx, &c);
    cr_assert_eq(l3d_train_config_from_file(ctx, L3D_TEST_DATA "/ds_config_seed.json", &c),
                 L3D_OK, "%s", err());
    c.dp = 8;  // the launcher's world, dp not given
    ASSERT_ERR_HAS(l3d_train_config_finalize(ctx, &c), L3D_ERR_CONFIG,
                   "ds_config_seed.json: train_batch_size 32 != train_micro_batch_size_per_gpu 4 "
                   "* gradient_accumulation_steps 8 * dp 8 (= 256); set "
                   "gradient_accumulation_steps to 1");
    l3d_train_config_default(ctx, &c);
    cr_assert_eq(ds("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4,"
                    " \"gradient_accumulation_steps\": 1}",
                    &c),
                 L3D_OK, "the fix is refused on reading: %s", err());
    c.dp = 8;
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
}

Test(config, finalize_after_override) {
    l3d_train_config_t c;
    l3d_train_config_default(ctx, &c);
    // A command-line override sets one number and zeroes the one to infer.
    c.micro_batch_size = 2;
    c.train_batch_size = 0;
    c.grad_accum_steps = 4;
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
    cr_assert_eq(c.train_batch_size, 8);
    cr_assert_eq(c.batch_inferred, L3D_BATCH_TRAIN);
    c.micro_batch_size = 3;  // the inferred train_batch_size follows (as it follows dp)
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
    cr_assert_eq(c.train_batch_size, 12);
    c.dp = 2;
    cr_assert_eq(l3d_train_config_finalize(ctx, &c), L3D_OK, "%s", err());
    cr_assert_eq(c.train_batch_size, 24);
    c.train_batch_size = 8;  // given now, and inconsistent
    c.batch_inferred = 0;
    ASSERT_ERR_HAS(l3d_train_config_finalize(ctx, &c), L3D_ERR_CONFIG, "train_batch_size 8");
    l3d_train_config_default(ctx, &c);
    c.seq_len = 4096;
    ASSERT_ERR_HAS(l3d_train_config_finalize(ctx, &c), L3D_ERR_CONFIG, "seq_len");
    l3d_train_config_default(ctx, &c);
    c.model.num_key_value_heads = 3;
    ASSERT_ERR_HAS(l3d_train_config_finalize(ctx, &c), L3D_ERR_CONFIG, "num_key_value_heads");
}

Test(config, unknown_keys_suggest) {
    l3d_train_config_t c;
    ASSERT_ERR_HAS(ds_fresh("{\"train_batch_sise\": 8}", &c), L3D_ERR_CONFIG,
                   "unknown key 'train_batch_sise' (did you mean 'train_batch_size'?)");
    cr_assert(strncmp(err(), "ds.json: ", 9) == 0, "%s", err());
    ASSERT_ERR_HAS(ds_fresh("{\"zero_optimization\": {\"stag\": 2}}", &c), L3D_ERR_CONFIG,
                   "'zero_optimization.stag' (did you mean 'zero_optimization.stage'?)");
    ASSERT_ERR_HAS(ds_fresh("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3,"
                            " \"weight_decai\": 0.1}}}",
                            &c),
                   L3D_ERR_CONFIG, "did you mean 'optimizer.params.weight_decay'");
    ASSERT_ERR_HAS(ds_fresh("{\"zero_optimization\": {\"offload_optimizer\": {\"devce\": "
                            "\"cpu\"}}}",
                            &c),
                   L3D_ERR_CONFIG, "zero_optimization.offload_optimizer.device");
    ASSERT_ERR_HAS(ds_fresh("{\"train\": {\"step\": 10}}", &c), L3D_ERR_CONFIG,
                   "did you mean 'train.steps'");
    ASSERT_ERR_HAS(ds_fresh("{\"fp16\": {\"enable\": true}}", &c), L3D_ERR_CONFIG,
                   "did you mean 'fp16.enabled'");
    // Nothing close: list the valid keys instead.
    ASSERT_ERR_HAS(ds_fresh("{\"parallel\": {\"zzzzzzz\": 2}}", &c), L3D_ERR_CONFIG,
                   "unknown key 'parallel.zzzzzzz' (valid keys of parallel: dp, tp, pp, order, schedule, sequence_parallel, layers_per_stage, virtual_stages, tp_mode)");
    ASSERT_ERR_HAS(ds_fresh("{\"amp\": {\"enabled\": true}}", &c), L3D_ERR_CONFIG,
                   "unknown key 'amp'");
    // A WarmupLR parameter under WarmupCosineLR.
    ASSERT_ERR_HAS(ds_fresh("{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\":"
                            " {\"total_num_steps\": 10, \"warmup_max_lr\": 0.1}}}",
                            &c),
                   L3D_ERR_CONFIG, "parameters of WarmupCosineLR");
}

Test(config, json_errors) {
    l3d_train_config_t c;
    ASSERT_ERR_HAS(ds_fresh("{\"train_batch_size\": 8, \"train_batch_size\": 8}", &c),
                   L3D_ERR_CONFIG, "duplicate");
    ASSERT_ERR_HAS(ds_fresh("{\"zero_optimization\": {\"stage\": 1, \"stage\": 2}}", &c),
                   L3D_ERR_CONFIG, "duplicate");
    ASSERT_ERR_HAS(ds_fresh("{\n  \"train_batch_size\": 8,\n  \"fp16\": {,}\n}", &c),
                   L3D_ERR_CONFIG, "ds.json:3:");
    ASSERT_ERR_HAS(ds_fresh("", &c), L3D_ERR_CONFIG, "invalid JSON");
    ASSERT_ERR_HAS(ds_fresh("[]", &c), L3D_ERR_CONFIG, "object");
    ASSERT_ERR_HAS(l3d_train_config_from_file(ctx, L3D_TEST_DATA "/no_such_file.json", &c),
                   L3D_ERR_NOT_FOUND, "no_such_file.json");
}

Test(config, auto_rejected) {
    l3d_train_config_t c;
    const char *cases[] = {
        "{\"train_micro_batch_size_per_gpu\": \"auto\"}",
        "{\"gradient_clipping\": \"auto\"}",
        "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}}",
        "{\"fp16\": {\"enabled\": \"auto\"}}",
        "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": \"auto\"}}}",
        "{\"zero_optimization\": {\"reduce_bucket_size\": \"auto\"}}",
        "{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": \"auto\"}}",
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ASSERT_ERR_HAS(ds_fresh(cases[i], &c), L3D_ERR_CONFIG, "\"auto\"");
        cr_assert(strstr(err(), "Hugging Face"), "%s", err());
    }
}

Test(config, wrong_types_and_values) {
    l3d_train_config_t c;
    struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"gradient_clipping\": \"1.0\"}", "gradient_clipping: expected a number"},
        {"{\"gradient_clipping\": -1}", "gradient_clipping"},
        {"{\"steps_per_print\": true}", "steps_per_print: expected an integer"},
        {"{\"train_micro_batch_size_per_gpu\": 2.5}", "expected an integer"},
        {"{\"wall_clock_breakdown\": 1}", "wall_clock_breakdown: expected true or false"},
        {"{\"train\": {\"allow_tf32\": 1}}", "allow_tf32: expected true or false"},
        {"{\"zero_optimization\": {\"stage\": 4}}", "zero_optimization.stage"},
        {"{\"zero_optimization\": 3}", "zero_optimization: expected an object"},
        {"{\"zero_optimization\": {\"offload_param\": {\"device\": \"gpu\"}}}", "device"},
        {"{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", "both"},
        {"{\"fp16\": {\"initial_scale_power\": 128}}", "fp16.initial_scale_power"},
        {"{\"fp16\": {\"hysteresis\": 0}}", "fp16.hysteresis"},
        {"{\"fp16\": {\"loss_scale_window\": 0}}", "fp16.loss_scale_window"},
        {"{\"fp16\": {\"min_loss_scale\": 0}}", "fp16.min_loss_scale"},
        {"{\"fp16\": {\"loss_scale\": -1}}", "fp16.loss_scale"},
        {"{\"fp16\": {\"loss_scale\": 1e39}}", "fp16.loss_scale 1e+39 is beyond"},
        {"{\"fp16\": {\"consecutive_hysteresis\": 1}}", "fp16.consecutive_hysteresis"},
        {"{\"optimizer\": {\"type\": \"Lamb\"}}", "Adam and AdamW"},
        {"{\"optimizer\": {\"type\": \"OneBitAdam\"}}", "OneBitAdam"},
        {"{\"optimizer\": {\"params\": {}}}", "optimizer.type"},
        {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9]}}}", "betas"},
        {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, 1.0]}}}", "betas"},
        {"{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"amsgrad\": true}}}", "amsgrad"},
        {"{\"scheduler\": {\"type\": \"OneCycle\"}}", "WarmupLR"},
        {"{\"scheduler\": {\"type\": \"WarmupCosinLR\"}}", "did you mean 'WarmupCosineLR'"},
        {"{\"scheduler\": {\"type\": \"WarmupDecayLR\"}}", "total_num_steps"},
        {"{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_type\": \"exp\"}}}",
         "warmup_type"},
        {"{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 0}}}",
         "warmup_num_steps"},
        {"{\"communication_data_type\": \"int8\"}", "communication_data_type"},
        {"{\"data_types\": {\"grad_accum_dtype\": \"fp8\"}}", "must be fp32, fp16 or bf16"},
        {"{\"data_types\": {\"grad_accum_dtype\": \"bf16\"}}", "needs bf16.enabled"},
        {"{\"fp16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": \"bf16\"}}",
         "needs bf16.enabled"},
        {"{\"bf16\": {\"enabled\": true}, \"communication_data_type\": \"fp32\", "
         "\"data_types\": {\"grad_accum_dtype\": \"bf16\"}}", "communication_data_type asks"},
        {"{\"fp16\": {\"enabled\": true}, \"fp32_allreduce\": true, "
         "\"data_types\": {\"grad_accum_dtype\": \"fp16\"}}", "fp32_allreduce asks"},
        {"{\"data_types\": {\"grad_dtype\": \"fp32\"}}", "data_types.grad_dtype"},
        {"{\"parallel\": {\"dp\": 0}}", "parallel.dp"},
        {"{\"train\": {\"device\": 3}}", "train.device: expected a string"},
        {"{\"data\": {\"seq_len\": -5}}", "data.seq_len"},
        {"{\"tensorboard\": {\"enabled\": true, \"output_path\": 5}}", "tensorboard.output_path"},
        {"{\"csv_monitor\": {\"enabled\": 1}}", "csv_monitor.enabled"},
        // No network here: wandb is refused, pointing at the file monitors.
        {"{\"wandb\": {\"enabled\": true, \"project\": \"p\"}}",
         "wandb.enabled: llama3d sends nothing over the network; use tensorboard or csv_monitor"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ASSERT_ERR_HAS(ds_fresh(bad[i].json, &c), L3D_ERR_CONFIG, bad[i].needle);
}

// tensorboard/csv_monitor directories are DeepSpeed's os.path.join(output_path, job_name)
// with its defaults ("" and "DeepSpeedJobName").
Test(config, monitor_dirs) {
    l3d_train_config_t c;
    static const struct {
        const char *json, *tb, *csv;
    } cases[] = {
        {"{\"tensorboard\": {\"enabled\": true}}", "DeepSpeedJobName", ""},
        {"{\"tensorboard\": {\"enabled\": true, \"output_path\": \"out/ds_logs/\","
         " \"job_name\": \"bert\"}, \"csv_monitor\": {\"enabled\": true, \"output_path\":"
         " \"/tmp/c\", \"job_name\": \"j\"}}",
         "out/ds_logs/bert", "/tmp/c/j"},
        {"{\"csv_monitor\": {\"enabled\": true, \"output_path\": \"o\", \"job_name\": \"/abs\"}}",
         "", "/abs"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cr_assert_eq(ds_fresh(cases[i].json, &c), L3D_OK, "%s", err());
        cr_assert_eq(c.tensorboard, cases[i].tb[0] != 0);
        cr_assert_eq(c.csv_monitor, cases[i].csv[0] != 0);
        if (c.tensorboard) cr_assert_str_eq(c.tensorboard_dir, cases[i].tb);
        if (c.csv_monitor) cr_assert_str_eq(c.csv_monitor_dir, cases[i].csv);
        cr_assert_eq(c.n_notes, 0, "unexpected: %s", c.notes[0]);
    }
}

Test(config, optimizer_modes) {
    l3d_train_config_t c;
    cr_assert_eq(ds_fresh("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 2e-4,"
                          " \"adam_w_mode\": false, \"weight_decay\": 0.01}}}",
                          &c),
                 L3D_OK, "%s", err());
    cr_assert_eq(c.adam_w_mode, 0);
    cr_assert_float_eq(c.lr, 2e-4f, 0);
    cr_assert_float_eq(c.weight_decay, 0.01f, 0);
    // DeepSpeed's FusedAdam defaults for what the section leaves out.
    cr_assert_float_eq(c.beta1, 0.9f, 0);
    cr_assert_float_eq(c.beta2, 0.999f, 0);
    cr_assert_float_eq(c.eps, 1e-8f, 0);
    // "Adam" is AdamW by default; "AdamW" always is; names are case-insensitive.
    cr_assert_eq(ds_fresh("{\"optimizer\": {\"type\": \"adam\"}}", &c), L3D_OK, "%s", err());
    cr_assert_eq(c.adam_w_mode, 1);
    cr_assert_float_eq(c.weight_decay, 0.0f, 0);
    cr_assert_eq(ds_fresh("{\"optimizer\": {\"type\": \"ADAMW\", \"params\": {\"adam_w_mode\":"
                          " false, \"torch_adam\": true}}}",
                          &c),
                 L3D_OK, "%s", err());
    cr_assert_eq(c.adam_w_mode, 1);
}

Test(config, notes) {
    l3d_train_config_t c;
    cr_assert_eq(ds_fresh("{\"fp16\": {\"enabled\": false, \"loss_scale\": 0},"
                          " \"tensorboard\": {\"enabled\": false},"
                          " \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\":"
                          " {\"device\": \"none\"}}}",
                          &c),
                 L3D_OK, "%s", err());
    cr_assert_eq(c.n_notes, 0, "unexpected: %s", c.notes[0]);
    cr_assert_eq(c.zero_stage, 1);
    // Stages 2 and 3 are effective (gradients, then parameters sharded): no note. DeepSpeed's
    // stage-3 defaults unless given; bad values name the key.
    cr_assert_eq(ds_fresh("{\"zero_optimization\": {\"stage\": 2}}", &c), L3D_OK, "%s", err());
    cr_assert_eq(c.n_notes, 0, "unexpected: %s", c.notes[0]);
    cr_assert_eq(ds_fresh("{\"zero_optimization\": {\"stage\": 3}}", &c), L3D_OK, "%s", err());
    cr_assert_eq(c.n_notes, 0, "unexpected: %s", c.notes[0]);
    cr_assert_eq(c.stage3_prefetch_bucket_size, 5e7);
    cr_assert_eq(c.stage3_param_persistence_threshold, 1e5);
    cr_assert_eq(c.stage3_max_live_parameters, 1e9);
    cr_assert_eq(c.stage3_gather_16bit_weights_on_model_save, 0);
    // Offload: DeepSpeed's stage rules (no effect outside them, said), nvme noted, parameter
    // offload only beside optimizer offload (the update runs where the pieces live).
    cr_assert_eq(ds_fresh("{\"zero_optimization\": {\"stage\": 0, \"offload_optimizer\": "
                          "{\"device\": \"cpu\"}}}", &c), L3D_OK, "%s", err());
    cr_assert(c.offload_optimizer == 0 && has_note(&c, "no effect at stage 0"));
    cr_assert_eq(ds_fresh("{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
                          "{\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}}}",
                          &c), L3D_OK, "%s", err());
    cr_assert(c.offload_optimizer == 1 && c.offload_optimizer_pin == 0 && c.offload_param == 0);
    cr_assert(has_note(&c, "offload_param: no effect below stage 3"));
    cr_assert_eq(ds_fresh("{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": "
                          "{\"device\": \"nvme\"}}}", &c), L3D_OK, "%s", err());
    cr_assert(c.offload_optimizer == 0 && has_note(&c, "device nvme"));
    ASSERT_ERR_HAS(ds_fresh("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": "
                            "{\"device\": \"cpu\"}}}", &c), L3D_ERR_CONFIG,
                   "offload_param needs offload_optimizer");
    ASSERT_ERR_HAS(ds_fresh("{\"zero_optimization\": {\"stage3_max_live_parameters\": 0}}", &c),
                   L3D_ERR_CONFIG, "stage3_max_live_parameters");
    ASSERT_ERR_HAS(ds_fresh("{\"zero_optimization\": {\"stage3_prefetch_bucket_size\": -1}}",
                            &c), L3D_ERR_CONFIG, "stage3_prefetch_bucket_size");
    cr_assert_eq(ds_fresh("{\"bf16\": {\"enabled\": true}, \"wall_clock_breakdown\": true,"
                          " \"activation_checkpointing\": {}, \"wandb\": {\"enabled\": false},"
                          " \"communication_data_type\": \"bf16\", \"prescale_gradients\": true}",
                          &c),
                 L3D_OK, "%s", err());
    cr_assert_eq(c.bf16, 1);
    cr_assert_eq(c.wall_clock_breakdown, 1);
    cr_assert_eq(c.activation_checkpointing, 1);
    cr_assert(!has_note(&c, "bf16"));  // effective: bfloat16 passes over float32 masters
    cr_assert(has_note(&c, "wall_clock_breakdown"));
    cr_assert_eq(c.n_notes, 1);  // prescale_gradients is what llama3d always does
    // communication_data_type is effective (trainer_dp.c): recorded, no note; null unsets it;
    // fp32_allreduce is read beside it (it wins, l3d_dp_comm_dtype).
    cr_assert_eq(c.comm_dtype, L3D_BFLOAT16);
    cr_assert_eq(c.fp32_allreduce, 0);
    cr_assert_eq(ds_fresh("{\"communication_data_type\": \"fp16\", \"fp32_allreduce\": true}", &c),
                 L3D_OK, "%s", err());
    cr_assert(c.comm_dtype == L3D_FLOAT16 && c.fp32_allreduce == 1 && c.n_notes == 0);
    cr_assert_eq(ds_fresh("{\"communication_data_type\": null}", &c), L3D_OK, "%s", err());
    cr_assert_eq(c.comm_dtype, -1);
    cr_assert_eq(ds_fresh("{\"communication_data_type\": \"fp32\"}", &c), L3D_OK, "%s", err());
    cr_assert_eq(c.comm_dtype, L3D_FLOAT32);
    ASSERT_ERR_HAS(ds_fresh("{\"fp32_allreduce\": 1}", &c), L3D_ERR_CONFIG, "fp32_allreduce");
    // data_types.grad_accum_dtype (DeepSpeed's key): fp32, or the training dtype
    cr_assert_eq(c.grad_dtype, -1);
    cr_assert_eq(ds_fresh("{\"bf16\": {\"enabled\": true}, \"data_types\": "
                          "{\"grad_accum_dtype\": \"bf16\"}}", &c), L3D_OK, "%s", err());
    cr_assert(c.grad_dtype == L3D_BFLOAT16 && c.n_notes == 0);
    cr_assert_eq(ds_fresh("{\"data_types\": {\"grad_accum_dtype\": \"fp32\"}}", &c), L3D_OK,
                 "%s", err());
    cr_assert_eq(c.grad_dtype, L3D_FLOAT32);
    cr_assert_eq(ds_fresh("{\"gradient_predivide_factor\": 8}", &c), L3D_OK, "%s", err());
    cr_assert(has_note(&c, "gradient_predivide_factor 8: without effect"));
}

// ---- learning-rate schedules -------------------------------------------------------------
// DeepSpeed's formulas written out independently, in double.
static double ref_gamma(int log_type, int step, int w) {
    return log_type ? log(step + 1.0) / log((double)w) : (double)step / w;
}

// `step` here is DeepSpeed's last_batch_iteration; the engine uses iteration s-1 for the
// 0-based optimizer step s, so the value at iteration `step` is that of optimizer step+1.
static void check_lr(const l3d_train_config_t *c, int step, double want) {
    float got = l3d_train_config_lr(c, step + 1);
    cr_assert(fabs((double)got - want) <= 1e-6 * fabs(want) + 1e-12,
              "step %d: got %.9g want %.9g", step, (double)got, want);
}

Test(config, lr_warmup) {
    l3d_train_config_t c;
    cr_assert_eq(ds_fresh("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                          "{\"warmup_min_lr\": 1e-5, \"warmup_max_lr\": 1e-3,"
                          " \"warmup_num_steps\": 10}}}",
                          &c),
                 L3D_OK, "%s", err());
    cr_assert_eq(c.sched, L3D_SCHED_WARMUP_LR);
    cr_assert_eq(c.warmup_type_log, 1);
    int steps[] = {0, 1, 4, 9, 10, 11, 500};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        int s = steps[i];
        double g = s < 10 ? ref_gamma(1, s, 10) : 1.0;
        check_lr(&c, s, 1e-5 + (1e-3 - 1e-5) * g);
    }
    check_lr(&c, 0, 1e-5);                                 // log(1) = 0
    check_lr(&c, 4, 1e-5 + (1e-3 - 1e-5) * 0.698970004);  // log(5)/log(10)

    cr_assert_eq(ds_fresh("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 4e-4}},"
                          " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                          "{\"warmup_num_steps\": 8, \"warmup_type\": \"linear\"}}}",
                          &c),
                 L3D_OK, "%s", err());
    // warmup_max_lr defaults to the optimizer's lr, warmup_min_lr to 0.
    cr_assert_float_eq(c.warmup_max_lr, 4e-4f, 0);
    for (int s = 0; s < 12; s++) check_lr(&c, s, 4e-4 * (s < 8 ? s / 8.0 : 1.0));
    check_lr(&c, 2, 1e-4);
    // The scheduler, not the optimizer's lr, sets the value (DeepSpeed overrides it).
    cr_assert(l3d_train_config_lr(&c, 0) != c.lr);
}

Test(config, lr_warmup_decay) {
    l3d_train_config_t c;
    cr_assert_eq(ds_fresh("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                          "{\"warmup_min_lr\": 0, \"warmup_max_lr\": 6e-4,"
                          " \"warmup_num_steps\": 20, \"total_num_steps\": 100}}}",
                          &c),
                 L3D_OK, "%s", err());
    cr_assert_eq(c.sched, L3D_SCHED_WARMUP_DECAY_LR);
    int steps[] = {0, 3, 19, 20, 21, 50, 99, 100, 150};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        int s = steps[i];
        double g = s < 20 ? ref_gamma(1, s, 20) : fmax(0.0, (100.0 - s) / (100.0 - 20.0));
        check_lr(&c, s, 6e-4 * g);
    }
    check_lr(&c, 20, 6e-4);
    check_lr(&c, 60, 3e-4);
    check_lr(&c, 100, 0.0);
    check_lr(&c, 120, 0.0);
    // warmup_max_lr defaults to 0.001 here (DeepSpeed's constructor default).
    cr_assert_eq(ds_fresh("{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                          "{\"total_num_steps\": 10, \"warmup_num_steps\": 1,"
                          " \"warmup_type\": \"linear\"}}}",
                          &c),
                 L3D_OK, "%s", err());
    cr_assert_float_eq(c.warmup_max_lr, 1e-3f, 0);
    // warmup_num_steps 1 is clamped to 2, as in DeepSpeed.
    check_lr(&c, 0, 0.0);
    check_lr(&c, 1, 1e-3 * 0.5);
    check_lr(&c, 2, 1e-3);
    check_lr(&c, 6, 1e-3 * 4.0 / 8.0);
}

Test(config, lr_warmup_cosine) {
    l3d_train_config_t c;
    l3d_train_config_default(ctx, &c);
    cr_assert_eq(l3d_train_config_from_file(ctx, L3D_TEST_DATA "/ds_full.json", &c), L3D_OK,
                 "%s", err());
    // lr 3e-4, total 100, warmup 10 linear, warmup_min_ratio 0.1, cos_min_ratio 0.01.
    int steps[] = {0, 1, 5, 9, 10, 11, 40, 55, 99, 100, 109, 110, 300};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        int s = steps[i];
        double ratio;
        if (s < 10) {
            ratio = 0.1 + ref_gamma(0, s, 10) * (1.0 - 0.1);
        } else {
            double prog = fmin(1.0, (s - 10 + 1.0) / (100.0 - 10.0));
            ratio = 0.01 + (1.0 - 0.01) * (1.0 + cos(3.14159265358979323846 * prog)) / 2.0;
        }
        check_lr(&c, s, 3e-4 * ratio);
    }
    check_lr(&c, 0, 3e-5);
    check_lr(&c, 5, 3e-4 * 0.55);
    check_lr(&c, 54, 3e-4 * (0.01 + 0.99 * 0.5));  // halfway through the cosine
    check_lr(&c, 99, 3e-4 * 0.01);
    check_lr(&c, 1000, 3e-4 * 0.01);                // stays at the floor
}
