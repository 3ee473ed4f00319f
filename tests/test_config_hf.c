// The configuration layer's Hugging Face side: config.json in and out (round trip, bad
// values, the dimension bounds) and generation_config.json. Split from test_config.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "llama3d/comm.h"
#include "llama3d/config.h"
#include "llama3d/ctx.h"
#include "tests/harness/config_env.h"

TestSuite(config, .init = setup, .fini = teardown);

// ---- Hugging Face config.json ------------------------------------------------------------
Test(config, hf_file_matches_preset) {
    l3d_model_config_t f, p;
    cr_assert_eq(l3d_model_config_from_file(ctx, L3D_TEST_DATA "/hf_llama3.2-1b_config.json", &f),
                 L3D_OK, "%s", err());
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3.2-1b", &p), L3D_OK);
    cr_assert_str_eq(f.name, "custom");
    memcpy(f.name, p.name, sizeof(f.name));
    cr_assert(memcmp(&f, &p, sizeof(f)) == 0, "parsed 1B config differs from the preset");
}

Test(config, hf_eos_list_and_defaults) {
    l3d_model_config_t f, p;
    cr_assert_eq(l3d_model_config_from_file(
                     ctx, L3D_TEST_DATA "/hf_llama3.1-8b-instruct/config.json", &f),
                 L3D_OK, "%s", err());
    cr_assert_eq(f.eos_token_id, 128001);
    // The whole list is kept (it used to keep only its first entry) and written back as one.
    cr_assert_eq(f.n_eos, 3);
    cr_assert(f.eos_token_ids[0] == 128001 && f.eos_token_ids[1] == 128008 &&
              f.eos_token_ids[2] == 128009);
    char *json = NULL;
    cr_assert_eq(l3d_model_config_to_json(ctx, &f, &json), L3D_OK);
    l3d_model_config_t back;
    cr_assert_eq(l3d_model_config_from_json(ctx, json, strlen(json), "back", &back), L3D_OK);
    cr_assert(strstr(json, "128008"), "%s", json);
    free(json);
    cr_assert(back.n_eos == 3 && back.eos_token_ids[2] == 128009);
    cr_assert_eq(f.head_dim, 128);  // absent: hidden / heads
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3-8b", &p), L3D_OK);
    memcpy(f.name, p.name, sizeof(f.name));
    f.n_eos = p.n_eos;  // the base model's preset ends at 128001 only
    memcpy(f.eos_token_ids, p.eos_token_ids, sizeof(f.eos_token_ids));
    cr_assert(memcmp(&f, &p, sizeof(f)) == 0, "parsed 8B config differs from the preset");

    // Minimal file: LlamaConfig's defaults for the rest, kv heads = heads.
    cr_assert_eq(hf("{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
                    " \"num_attention_heads\": 4, \"vocab_size\": 100}",
                    &f),
                 L3D_OK, "%s", err());
    cr_assert_eq(f.num_key_value_heads, 4);
    cr_assert_eq(f.head_dim, 16);
    cr_assert_eq(f.rope_scaling_llama3, 0);
    cr_assert_eq(f.tie_word_embeddings, 0);
    cr_assert_eq(f.max_position_embeddings, 2048);
    cr_assert_float_eq(f.rms_norm_eps, 1e-6f, 1e-12);
    cr_assert_float_eq(f.rope_theta, 10000.0f, 0);

    // Explicit head_dim that differs from hidden / heads, legacy "type" key, null bos.
    cr_assert_eq(hf("{\"hidden_size\": 60, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
                    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
                    " \"vocab_size\": 100, \"bos_token_id\": null, \"rope_scaling\": {\"type\":"
                    " \"llama3\", \"factor\": 2, \"low_freq_factor\": 1, \"high_freq_factor\": 2,"
                    " \"original_max_position_embeddings\": 512}}",
                    &f),
                 L3D_OK, "%s", err());
    cr_assert_eq(f.head_dim, 16);
    cr_assert_eq(f.bos_token_id, -1);
    cr_assert_eq(f.rope_scaling_llama3, 1);
    cr_assert_float_eq(f.rope_factor, 2.0f, 0);
    cr_assert_eq(f.rope_original_max_position_embeddings, 512);
}

#define BASE "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1, " \
             "\"vocab_size\": 100, "

Test(config, hf_bad_values) {
    l3d_model_config_t m;
    struct {
        const char *json;
        const char *needle;
    } bad[] = {
        {"{" BASE "\"num_attention_heads\": 4, \"attention_bias\": true}", "attention_bias"},
        {"{" BASE "\"num_attention_heads\": 4, \"mlp_bias\": true}", "mlp_bias"},
        {"{" BASE "\"num_attention_heads\": 4, \"hidden_act\": \"gelu\"}", "hidden_act"},
        {"{" BASE "\"num_attention_heads\": 4, \"model_type\": \"mistral\"}", "model_type"},
        {"{" BASE "\"num_attention_heads\": 4, \"pretraining_tp\": 2}", "pretraining_tp"},
        {"{" BASE "\"num_attention_heads\": 4, \"attention_dropout\": 0.1}", "attention_dropout"},
        {"{" BASE "\"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"dynamic\","
         " \"factor\": 2.0}}",
         "rope_scaling.rope_type"},
        {"{" BASE "\"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"llama3\","
         " \"factor\": 8.0}}",
         "rope_scaling.low_freq_factor"},
        {"{" BASE "\"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"llama3\","
         " \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1,"
         " \"original_max_position_embeddings\": 8192}}",
         "high_freq_factor"},
        {"{" BASE "\"num_attention_heads\": \"4\"}", "num_attention_heads: expected an integer"},
        {"{" BASE "\"num_attention_heads\": 4.5}", "num_attention_heads"},
        {"{" BASE "\"num_attention_heads\": 0}", "num_attention_heads"},
        {"{" BASE "\"num_attention_heads\": 4, \"num_key_value_heads\": 3}",
         "num_key_value_heads"},
        {"{" BASE "\"num_attention_heads\": 6}", "hidden_size"},  // 64 % 6
        {"{" BASE "\"num_attention_heads\": 4, \"head_dim\": 15}", "head_dim"},
        {"{" BASE "\"num_attention_heads\": 4, \"rms_norm_eps\": 0}", "rms_norm_eps"},
        {"{" BASE "\"num_attention_heads\": 4, \"rope_theta\": -1}", "rope_theta"},
        {"{" BASE "\"num_attention_heads\": 4, \"tie_word_embeddings\": 1}",
         "tie_word_embeddings"},
        {"{" BASE "\"num_attention_heads\": 4, \"eos_token_id\": []}", "eos_token_id"},
        {"{" BASE "\"num_attention_heads\": 4, \"eos_token_id\": 100}", "eos_token_id"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 4}",
         "vocab_size: missing"},
        {"{" BASE "\"num_attention_heads\": 4, \"hiden_size\": 64}", "did you mean 'hidden_size'"},
        {"{" BASE "\"num_attention_heads\": 4, \"sliding_window\": 4096}", "sliding_window"},
        {"{" BASE "\"num_attention_heads\": 4, \"quantization_config\": {}}",
         "quantization_config"},
        {"[1, 2]", "object"},
        {"{" BASE "\"num_attention_heads\": 4, \"vocab_size\": 100}", "duplicate"},
        {"{" BASE "\"num_attention_heads\": 4,\n\"x\": }", "t.json:2:"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&m, 0x5a, sizeof(m));
        l3d_model_config_t before = m;
        ASSERT_ERR_HAS(hf(bad[i].json, &m), L3D_ERR_CONFIG, bad[i].needle);
        cr_assert(strncmp(err(), "t.json", 6) == 0, "no origin in: %s", err());
        cr_assert(memcmp(&m, &before, sizeof(m)) == 0, "case %zu changed the output", i);
    }
}

Test(config, hf_ignores_bookkeeping) {
    l3d_model_config_t m;
    cr_assert_eq(hf("{" BASE "\"num_attention_heads\": 4, \"architectures\": [\"X\"],"
                    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.45\","
                    " \"pad_token_id\": null, \"use_cache\": false, \"model_type\": \"llama\","
                    " \"hidden_act\": \"silu\", \"pretraining_tp\": 1}",
                    &m),
                 L3D_OK, "%s", err());
}

Test(config, to_json_round_trip) {
    const char *const *names = l3d_model_config_preset_names();
    for (int i = 0; names[i]; i++) {
        l3d_model_config_t a, b;
        cr_assert_eq(l3d_model_config_preset(ctx, names[i], &a), L3D_OK);
        char *js = NULL;
        cr_assert_eq(l3d_model_config_to_json(ctx, &a, &js), L3D_OK, "%s", err());
        cr_assert_eq(l3d_model_config_from_json(ctx, js, strlen(js), "rt", &b), L3D_OK, "%s: %s",
                     names[i], err());
        cr_assert(memcmp(&a, &b, sizeof(a)) == 0, "%s does not round-trip:\n%s", names[i], js);

        // What transformers' LlamaConfig needs, checked with an independent parser.
        json_error_t je;
        json_t *o = json_loads(js, 0, &je);
        cr_assert_not_null(o);
        cr_assert_str_eq(json_string_value(json_array_get(json_object_get(o, "architectures"), 0)),
                         "LlamaForCausalLM");
        cr_assert_str_eq(json_string_value(json_object_get(o, "model_type")), "llama");
        cr_assert_str_eq(json_string_value(json_object_get(o, "hidden_act")), "silu");
        cr_assert_str_eq(json_string_value(json_object_get(o, "torch_dtype")), "float32");
        cr_assert(json_is_false(json_object_get(o, "attention_bias")));
        cr_assert(json_is_false(json_object_get(o, "mlp_bias")));
        cr_assert_eq(json_integer_value(json_object_get(o, "hidden_size")), a.hidden_size);
        cr_assert_eq(json_integer_value(json_object_get(o, "num_key_value_heads")),
                     a.num_key_value_heads);
        json_t *rs = json_object_get(o, "rope_scaling");
        if (a.rope_scaling_llama3) {
            cr_assert_str_eq(json_string_value(json_object_get(rs, "rope_type")), "llama3");
            cr_assert_float_eq(json_number_value(json_object_get(rs, "factor")), a.rope_factor,
                               0);
        } else {
            cr_assert(json_is_null(rs));
        }
        cr_assert(json_boolean_value(json_object_get(o, "tie_word_embeddings")) ==
                  (a.tie_word_embeddings != 0));
        // Written as a short decimal, so HF loads 1e-05 and not 9.99999974737875e-06.
        cr_assert(strstr(js, "\"rms_norm_eps\": 1e-5") != NULL, "%s", js);
        json_decref(o);
        free(js);
    }
}

Test(config, to_json_rejects_invalid) {
    l3d_model_config_t a;
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3-tiny", &a), L3D_OK);
    a.num_key_value_heads = 3;
    char *js = NULL;
    ASSERT_ERR_HAS(l3d_model_config_to_json(ctx, &a, &js), L3D_ERR_CONFIG, "num_key_value_heads");
    cr_assert_null(js);
}

// Model dimensions are bounded when the file is read: a huge value (1e9 layers, a vocabulary
// of two billion) must be refused naming its key, before any size is formed from it (9 x
// 1e9 tensors overflowed an int in l3d_model_create).
Test(config, hf_dimension_bounds) {
    l3d_model_config_t m;
    struct {
        const char *json;
        const char *needle;
    } bad[] = {
        {"{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1e9,"
         " \"num_attention_heads\": 4, \"vocab_size\": 64}",
         "num_hidden_layers: 1000000000 is more than"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2147483647,"
         " \"num_attention_heads\": 4, \"vocab_size\": 64}",
         "num_hidden_layers"},
        {"{\"hidden_size\": 2147483600, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 4, \"vocab_size\": 64}",
         "hidden_size"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 2000000000, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 4, \"vocab_size\": 64}",
         "intermediate_size"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 4, \"vocab_size\": 2000000000}",
         "vocab_size"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 4, \"head_dim\": 100000, \"vocab_size\": 64}",
         "head_dim"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 8192, \"head_dim\": 8192, \"vocab_size\": 64}",
         "head_dim"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 4, \"vocab_size\": 64,"
         " \"max_position_embeddings\": 2000000000}",
         "max_position_embeddings"},
        // each dimension within its bound, the product too large to address
        {"{\"hidden_size\": 1048576, \"intermediate_size\": 4194304, \"num_hidden_layers\": "
         "65536, \"num_attention_heads\": 1024, \"vocab_size\": 64}",
         "num_hidden_layers"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ASSERT_ERR_HAS(hf(bad[i].json, &m), L3D_ERR_CONFIG, bad[i].needle);
    // the same bounds hold for a config built in code
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3-tiny", &m), L3D_OK);
    m.num_hidden_layers = 1000000000;
    ASSERT_ERR_HAS(l3d_model_config_validate(ctx, &m), L3D_ERR_CONFIG, "num_hidden_layers");
    cr_assert_eq(l3d_model_config_preset(ctx, "llama3-405b", &m), L3D_OK);
    cr_assert_eq(l3d_model_config_validate(ctx, &m), L3D_OK, "%s", err());
}

// generation_config.json as Llama 3.1 8B Instruct ships it: the eos list and the sampling
// defaults; a wrong type names the key.
Test(config, generation_config) {
    l3d_generation_config_t g;
    cr_assert_eq(l3d_generation_config_from_file(
                     ctx, L3D_TEST_DATA "/hf_llama3.1-8b-instruct/generation_config.json", &g),
                 L3D_OK, "%s", err());
    cr_assert_eq(g.bos_token_id, 128000);
    cr_assert_eq(g.n_eos, 3);
    cr_assert(g.eos_token_ids[0] == 128001 && g.eos_token_ids[1] == 128008 &&
              g.eos_token_ids[2] == 128009);
    cr_assert_eq(g.do_sample, 1);
    cr_assert_float_eq(g.temperature, 0.6f, 1e-7);
    cr_assert_float_eq(g.top_p, 0.9f, 1e-7);
    cr_assert_eq(g.top_k, -1);  // absent
    char path[256];
    snprintf(path, sizeof(path), "/tmp/l3d_gencfg_%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("{\"eos_token_id\": [1, \"two\"]}", f);
    fclose(f);
    cr_assert_eq(l3d_generation_config_from_file(ctx, path, &g), L3D_ERR_CONFIG);
    cr_assert(strstr(err(), "eos_token_id"), "%s", err());
    f = fopen(path, "w");
    fputs("{\"top_p\": 1.5}", f);
    fclose(f);
    cr_assert_eq(l3d_generation_config_from_file(ctx, path, &g), L3D_ERR_CONFIG);
    cr_assert(strstr(err(), "top_p"), "%s", err());
    unlink(path);
}
