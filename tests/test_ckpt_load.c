// Loading hostile checkpoints: a config.json that lies about the files, sharded checkpoints
// whose entries overlap, stray or misnumbered, non-finite weights, model sizes the machine
// cannot hold. Each is refused with an error naming the file (and the tensor), before the
// model is allocated where the config is what lies. docs/checkpoints.md, "Validation".
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checkpoint/checkpoint_check.h"
#include "core/checkpoint/checkpoint_open.h"
#include "core/checkpoint/checkpoint_dist.h"
#include "core/model/model_internal.h"
#include "core/checkpoint/safetensors.h"
#include "devices/device_math.h"
#include "platform/mem.h"
#include "platform/platform.h"
#include "tests/harness/asan.h"

// ---- an allocator that remembers the largest request --------------------------------------
typedef struct alloc_stats {
    size_t largest;
} alloc_stats_t;

static void *count_alloc(size_t size, size_t align, const char *tag, void *user) {
    (void)tag;
    alloc_stats_t *s = user;
    if (size > s->largest) s->largest = size;
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    return posix_memalign(&p, align, size ? size : 1) ? NULL : p;
}
static void count_free(void *p, size_t size, void *user) {
    (void)size;
    (void)user;
    free(p);
}

typedef struct fixture {
    alloc_stats_t stats;
    l3d_allocator_t alloc;
    l3d_ctx_t *ctx;
    l3d_device_t *dev;
    l3d_model_t *m;
    char tmp[64];
} fixture_t;

static l3d_model_config_t small_config(void) {
    l3d_model_config_t c;
    memset(&c, 0, sizeof(c));
    snprintf(c.name, sizeof(c.name), "test");
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.vocab_size = 40;
    c.max_position_embeddings = 128;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 500000.0f;
    c.tie_word_embeddings = 0;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.initializer_range = 0.2f;
    return c;
}

static void setup(fixture_t *f) {
    memset(f, 0, sizeof(*f));
    f->alloc = (l3d_allocator_t){count_alloc, count_free, &f->stats};
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.allocator = &f->alloc;
    cr_assert_eq(l3d_ctx_create(&p, &f->ctx), L3D_OK);
    l3d_device_params_t dp = {.num_threads = 1};
    cr_assert_eq(l3d_device_create(f->ctx, "cpu", &dp, &f->dev), L3D_OK);
    l3d_model_config_t c = small_config();
    cr_assert_eq(l3d_model_create(f->ctx, f->dev, &c, &f->m), L3D_OK, "%s",
                 l3d_ctx_last_error(f->ctx));
    cr_assert_eq(l3d_model_init_weights(f->m, 7), L3D_OK);
    snprintf(f->tmp, sizeof(f->tmp), "/tmp/l3d_test_ckload_XXXXXX");
    cr_assert_not_null(mkdtemp(f->tmp));
}

static void teardown(fixture_t *f) {
    l3d_model_destroy(f->m);
    l3d_device_destroy(f->dev);
    l3d_ctx_destroy(f->ctx);
    l3d_dir_remove_tree(f->tmp);
}

static const char *err(const fixture_t *f) { return l3d_ctx_last_error(f->ctx); }

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    cr_assert_not_null(fp, "%s", path);
    fputs(text, fp);
    cr_assert_eq(fclose(fp), 0);
}

// Opening `dir` fails with L3D_ERR_FORMAT (or `want`), the detail holding every needle.
static void expect_open_error(fixture_t *f, const char *dir, l3d_status want, const char *n1,
                              const char *n2) {
    l3d_model_t *m = NULL;
    l3d_status st = l3d_model_open(f->ctx, f->dev, dir, &m);
    cr_assert_eq(st, want, "status %d, detail: %s", (int)st, err(f));
    cr_assert_null(m);
    cr_assert(strstr(err(f), n1), "'%s' not in: %s", n1, err(f));
    if (n2) cr_assert(strstr(err(f), n2), "'%s' not in: %s", n2, err(f));
}

// ---- Hugging Face layout -----------------------------------------------------------------
// config.json rewritten with `key` set to `value` (a JSON number).
static void lie_about(fixture_t *f, const char *dir, const char *key, long long value) {
    l3d_model_config_t c = f->m->cfg;
    char *json = NULL, path[256];
    cr_assert_eq(l3d_model_config_to_json(f->ctx, &c, &json), L3D_OK);
    char needle[96], *at;
    snprintf(needle, sizeof(needle), "\"%s\": ", key);
    cr_assert_not_null(at = strstr(json, needle));
    char *end = at + strlen(needle);
    while (*end >= '0' && *end <= '9') end++;
    char out[8192];
    snprintf(out, sizeof(out), "%.*s%lld%s", (int)(at + strlen(needle) - json), json, value, end);
    free(json);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    write_text(path, out);
}

Test(ckpt_load, lying_config_is_refused_before_allocation) {
    fixture_t f;
    setup(&f);
    char ck[128];
    snprintf(ck, sizeof(ck), "%s/ck", f.tmp);
    cr_assert_eq(l3d_model_save(f.m, ck), L3D_OK, "%s", err(&f));
    // 10,000 layers of this size are 400 MB of weights; the file holds 2 layers.
    lie_about(&f, ck, "num_hidden_layers", 10000);
    f.stats.largest = 0;
    expect_open_error(&f, ck, L3D_ERR_FORMAT, "model.safetensors",
                      "'model.layers.2.input_layernorm.weight' is missing");
    cr_assert(f.stats.largest < ((size_t)1 << 20), "allocated %zu bytes before refusing",
              f.stats.largest);
    // Fewer layers than the file: the first stray tensor is named.
    lie_about(&f, ck, "num_hidden_layers", 1);
    expect_open_error(&f, ck, L3D_ERR_FORMAT, "'model.layers.1.input_layernorm.weight' is not "
                      "part of the model", "config.json");
    // A wider model than the file: the shape and both sides of it.
    lie_about(&f, ck, "vocab_size", 4000);
    f.stats.largest = 0;
    // (the first such tensor in the file: lm_head, as the file is laid out by name)
    expect_open_error(&f, ck, L3D_ERR_FORMAT, "'lm_head.weight' has shape [40, 32]",
                      "[4000, 32]");
    cr_assert(f.stats.largest < ((size_t)1 << 16), "allocated %zu bytes", f.stats.largest);
    teardown(&f);
}

Test(ckpt_load, huge_dimension_is_refused_naming_the_key) {
    fixture_t f;
    setup(&f);
    l3d_model_config_t c = small_config();
    c.num_hidden_layers = 1000000000;  // 9 x 1e9 tensors overflowed an int in model_create
    l3d_model_t *m = NULL;
    cr_assert_eq(l3d_model_create(f.ctx, f.dev, &c, &m), L3D_ERR_CONFIG, "%s", err(&f));
    cr_assert(strstr(err(&f), "num_hidden_layers"), "%s", err(&f));
    teardown(&f);
}

// A NaN written into model.safetensors' q_proj of layer 1.
static void poison_hf(fixture_t *f, const char *ck, float value) {
    char path[256];
    snprintf(path, sizeof(path), "%s/model.safetensors", ck);
    char *buf = NULL;
    size_t len = 0;
    cr_assert_eq(l3d_file_read_all(path, 0, &buf, &len), 0);
    l3d_st_file_t *st = NULL;
    cr_assert_eq(l3d_st_parse(f->ctx, buf, len, path, &st), L3D_OK);
    const l3d_st_tensor_t *t = l3d_st_find(st, "model.layers.1.self_attn.q_proj.weight");
    cr_assert_not_null(t);
    size_t off = (size_t)((const char *)t->data - buf) + 4 * (3 * 32 + 5);
    l3d_st_close(st);
    memcpy(buf + off, &value, 4);
    FILE *fp = fopen(path, "wb");
    cr_assert_eq(fwrite(buf, 1, len, fp), len);
    cr_assert_eq(fclose(fp), 0);
    free(buf);
}

Test(ckpt_load, non_finite_weights_are_refused_with_their_place) {
    fixture_t f;
    setup(&f);
    char ck[128];
    snprintf(ck, sizeof(ck), "%s/ck", f.tmp);
    cr_assert_eq(l3d_model_save(f.m, ck), L3D_OK, "%s", err(&f));
    poison_hf(&f, ck, NAN);
    expect_open_error(&f, ck, L3D_ERR_FORMAT, "model.safetensors: tensor "
                      "'model.layers.1.self_attn.q_proj.weight' holds nan at element 101",
                      "row 3, column 5");
    poison_hf(&f, ck, -INFINITY);
    expect_open_error(&f, ck, L3D_ERR_FORMAT, "holds -inf at element 101", NULL);
    // l3d_model_load into an existing model refuses too, whatever it leaves behind
    cr_assert_eq(l3d_model_load(f.m, ck), L3D_ERR_FORMAT);
    teardown(&f);
}

Test(ckpt_load, nonfinite_scan) {
    float x[3000];
    for (int i = 0; i < 3000; i++) x[i] = (float)i - 1500.0f;
    cr_assert_eq(l3d_ckpt_nonfinite(x, 3000), 3000);
    x[2049] = INFINITY;
    x[2500] = NAN;
    cr_assert_eq(l3d_ckpt_nonfinite(x, 3000), 2049);
    cr_assert_eq(l3d_ckpt_nonfinite(x, 2049), 2049);
    cr_assert_str_eq(l3d_ckpt_nonfinite_name(x[2500]), "nan");
    cr_assert_str_eq(l3d_ckpt_nonfinite_name(-x[2049]), "-inf");
}

// ---- sharded layout ----------------------------------------------------------------------
// A hand-built sharded checkpoint of f->m by two "ranks": rank 0 holds the first half of
// every matrix's rows (and the 1-D tensors), rank 1 the rest, each with both moments.
typedef struct shard_opts {
    const char *rename_from, *rename_to;  // an entry name suffix to replace (in shard 1)
    const char *extra;                    // an extra entry in shard 1 (a copy of the norm)
    const char *drop;                     // leave out shard 1's entries with this in the name
    int nan_shard;                        // 1 + shard whose first q_proj entry gets a NaN
    const char *manifest, *state;         // replace shards.json / trainer_state.json
} shard_opts_t;

static void write_sharded(fixture_t *f, const char *dir, const shard_opts_t *o) {
    l3d_model_t *m = f->m;
    cr_assert_eq(l3d_dir_create(dir), 0);
    cr_assert_eq(l3d_ckpt_write_config(m, dir), L3D_OK);
    size_t cap = (size_t)m->n_tensors * 3 + 1;
    float *copy = malloc(m->n_params * sizeof(float));
    memcpy(copy, m->params, m->n_params * sizeof(float));
    for (int r = 0; r < 2; r++) {
        l3d_st_entry_t *e = calloc(cap, sizeof(*e));
        char(*names)[128] = calloc(cap, sizeof(*names));
        size_t n = 0;
        for (int i = 0; i < m->n_tensors; i++) {
            const l3d_param_t *p = &m->tensors[i];
            int64_t rows = p->ndim == 2 ? p->shape[0] : 1, cols = p->ndim == 2 ? p->shape[1] : p->shape[0];
            int64_t r0 = p->ndim == 2 ? (r == 0 ? 0 : rows / 2) : 0;
            int64_t r1 = p->ndim == 2 ? (r == 0 ? rows / 2 : rows) : (r == 0 ? 1 : 0);
            if (r1 <= r0) continue;
            for (int s = 0; s < 3; s++, n++) {
                snprintf(names[n], sizeof(names[n]), "%s%s@%lld,0", p->name, l3d_ckpt_suffix[s],
                         (long long)r0);
                if (r == 1 && o->drop && strstr(names[n], o->drop)) {
                    n--;
                    continue;
                }
                if (r == 1 && o->rename_from && s == 0 && strstr(names[n], o->rename_from))
                    snprintf(names[n], sizeof(names[n]), "%s%s", p->name, o->rename_to);
                e[n].name = names[n];
                e[n].ndim = p->ndim;
                e[n].shape[0] = p->ndim == 2 ? r1 - r0 : cols;
                e[n].shape[1] = cols;
                e[n].data = copy + p->offset + (size_t)(r0 * cols);
                if (o->nan_shard == r + 1 && s == 0 && strstr(p->name, "layers.0.self_attn.q_proj"))
                    copy[p->offset + (size_t)(r0 * cols) + 7] = NAN;
            }
        }
        if (r == 1 && o->extra) {
            e[n] = e[0];
            snprintf(names[n], sizeof(names[n]), "%s", o->extra);
            e[n].name = names[n];
            e[n].ndim = 1;
            e[n].shape[0] = 4;
            n++;
        }
        char path[256];
        snprintf(path, sizeof(path), "%s/shard-%05d-of-00002.safetensors", dir, r);
        cr_assert_eq(l3d_st_write(f->ctx, path, e, n, NULL, NULL, 0), L3D_OK, "%s", err(f));
        free(names);
        free(e);
    }
    free(copy);
    char path[256];
    snprintf(path, sizeof(path), "%s/shards.json", dir);
    write_text(path, o->manifest ? o->manifest
                                 : "{\"format\": \"llama3d-sharded-1\", \"world\": 2, \"files\": "
                                   "[\"shard-00000-of-00002.safetensors\", "
                                   "\"shard-00001-of-00002.safetensors\"]}");
    snprintf(path, sizeof(path), "%s/trainer_state.json", dir);
    write_text(path, o->state ? o->state
                              : "{\"format\": \"llama3d-trainer-1\", \"step\": 3, \"layout\": "
                                "{\"dp\": 2, \"tp\": 1, \"pp\": 1, \"virtual_stages\": 1}}");
}

Test(ckpt_load, sharded_exact_coverage) {
    fixture_t f;
    setup(&f);
    char d[128];
    int k = 0;
#define NEXT() (snprintf(d, sizeof(d), "%s/s%d", f.tmp, k++), d)
    // The well-formed one loads, bit for bit.
    shard_opts_t good = {0};
    write_sharded(&f, NEXT(), &good);
    l3d_model_t *m2 = NULL;
    cr_assert_eq(l3d_model_open(f.ctx, f.dev, d, &m2), L3D_OK, "%s", err(&f));
    cr_assert(memcmp(m2->params, f.m->params, f.m->n_params * sizeof(float)) == 0);
    l3d_model_destroy(m2);

    // The second half of q_proj renamed onto the first: loaded with exit 0 before, half of
    // q_proj left at its random start.
    shard_opts_t renamed = {.rename_from = "layers.1.self_attn.q_proj.weight@16,0",
                            .rename_to = "@0,0"};
    write_sharded(&f, NEXT(), &renamed);
    expect_open_error(&f, d, L3D_ERR_FORMAT, "shard-00001-of-00002.safetensors: tensor "
                      "'model.layers.1.self_attn.q_proj.weight@0,0' overlaps", "shard-00000");
    // A rectangle that does not start where it should: a gap and an overlap at once.
    shard_opts_t shifted = {.rename_from = "layers.0.mlp.up_proj.weight@24,0", .rename_to = "@23,0"};
    write_sharded(&f, NEXT(), &shifted);
    expect_open_error(&f, d, L3D_ERR_FORMAT, "'model.layers.0.mlp.up_proj.weight@23,0' overlaps",
                      NULL);
    // Outside the tensor.
    shard_opts_t outside = {.rename_from = "layers.0.mlp.up_proj.weight@24,0", .rename_to = "@25,0"};
    write_sharded(&f, NEXT(), &outside);
    expect_open_error(&f, d, L3D_ERR_FORMAT, "shard-00001-of-00002.safetensors: tensor "
                      "'model.layers.0.mlp.up_proj.weight@25,0' (24 x 32 at 25,0) does not fit",
                      NULL);
    // A corner past any integer: undefined behaviour (R + h) in the reader before.
    shard_opts_t huge = {.rename_from = "layers.0.mlp.up_proj.weight@24,0",
                         .rename_to = "@9223372036854775807,0"};
    write_sharded(&f, NEXT(), &huge);
    expect_open_error(&f, d, L3D_ERR_FORMAT, "'model.layers.0.mlp.up_proj.weight@9223372036854775807,0'"
                      " is not named", NULL);
    // A gap: the second half of up_proj in no shard (the per-rank count caught this before).
    shard_opts_t gap = {.drop = "layers.0.mlp.up_proj.weight@24,0"};
    write_sharded(&f, NEXT(), &gap);
    expect_open_error(&f, d, L3D_ERR_FORMAT, "tensor 'model.layers.0.mlp.up_proj.weight' has 768 "
                      "of its 1536 elements", NULL);
    // A gap in a moment (read for --resume; checked for every load).
    shard_opts_t nomoment = {.drop = "layers.1.self_attn.q_proj.weight.exp_avg_sq@16,0"};
    write_sharded(&f, NEXT(), &nomoment);
    expect_open_error(&f, d, L3D_ERR_FORMAT, "'model.layers.1.self_attn.q_proj.weight.exp_avg_sq' "
                      "has", NULL);
    // A tensor the model does not have, in a shard.
    shard_opts_t extra = {.extra = "model.layers.7.input_layernorm.weight@0,0"};
    write_sharded(&f, NEXT(), &extra);
    expect_open_error(&f, d, L3D_ERR_FORMAT, "shard-00001-of-00002.safetensors: tensor "
                      "'model.layers.7.input_layernorm.weight@0,0' is not part of the model", NULL);
    teardown(&f);
}

Test(ckpt_load, sharded_manifest_and_layout) {
    fixture_t f;
    setup(&f);
    char d[128];
    int k = 0;
    const char *files2 = "\"files\": [\"shard-00000-of-00002.safetensors\", "
                         "\"shard-00001-of-00002.safetensors\"]}";
    char man[512];
    struct {
        const char *manifest, *state, *n1, *n2;
    } bad[] = {
        {"{\"format\": \"llama3d-sharded-1\", \"world\": 3, %s", NULL, "shards.json", "world"},
        {"{\"format\": \"llama3d-sharded-1\", \"world\": \"two\", %s", NULL, "shards.json", "world"},
        {"{\"format\": \"llama3d-sharded-1\", %s", NULL, "shards.json", "world"},
        {"{\"format\": \"llama3d-sharded-1\", \"world\": 2, \"files\": "
         "[\"shard-00001-of-00002.safetensors\", \"shard-00000-of-00002.safetensors\"]}",
         NULL, "shards.json: files[0]", NULL},
        {NULL, "{\"format\": \"llama3d-trainer-1\", \"step\": 3, \"layout\": \"garbage\"}",
         "trainer_state.json", "layout"},
        {NULL, "{\"format\": \"llama3d-trainer-1\", \"step\": 3, \"layout\": {\"dp\": 4, \"tp\": 1,"
         " \"pp\": 1, \"virtual_stages\": 1}}", "trainer_state.json", "dp 4 x tp 1 x pp 1"},
        {NULL, "{\"format\": \"llama3d-trainer-1\", \"step\": 3, \"layout\": {\"dp\": 2, \"tp\": 1,"
         " \"pp\": -1, \"virtual_stages\": 1}}", "trainer_state.json", "layout.pp"},
        {NULL, "{\"format\": \"llama3d-trainer-1\", \"step\": 3, \"layout\": {\"dp\": 2, \"tp\": 1,"
         " \"pp\": 1, \"virtual_stages\": 1, \"zz\": 1}}", "trainer_state.json", "layout.zz"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(d, sizeof(d), "%s/m%d", f.tmp, k++);
        if (bad[i].manifest) snprintf(man, sizeof(man), bad[i].manifest, files2);
        shard_opts_t o = {.manifest = bad[i].manifest ? man : NULL, .state = bad[i].state};
        write_sharded(&f, d, &o);
        expect_open_error(&f, d, L3D_ERR_FORMAT, bad[i].n1, bad[i].n2);
    }
    teardown(&f);
}

Test(ckpt_load, sharded_non_finite) {
    fixture_t f;
    setup(&f);
    char d[128];
    snprintf(d, sizeof(d), "%s/nan", f.tmp);
    shard_opts_t o = {.nan_shard = 2};
    write_sharded(&f, d, &o);
    // rank 1 holds rows 16.. of q_proj (32 x 32): element 7 of its entry is row 16, column 7
    expect_open_error(&f, d, L3D_ERR_FORMAT, "shard-00001-of-00002.safetensors: tensor "
                      "'model.layers.0.self_attn.q_proj.weight@16,0' holds nan at row 16, column 7",
                      NULL);
    teardown(&f);
}

// ---- memory ------------------------------------------------------------------------------
static void put(const char *root, const char *rel, const char *text) {
    char path[512], dir[512];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    snprintf(dir, sizeof(dir), "%s", path);
    *strrchr(dir, '/') = 0;
    cr_assert_eq(l3d_dir_create(dir), 0, "%s", dir);
    write_text(path, text);
}

Test(ckpt_load, available_memory_from_meminfo_and_cgroups) {
    char root[] = "/tmp/l3d_test_mem_XXXXXX";
    cr_assert_not_null(mkdtemp(root));
    uint64_t b = 0;
    const char *src = NULL;
    cr_assert_eq(l3d_mem_available_at(root, &b, &src), -ENOENT);
    put(root, "proc/meminfo", "MemTotal:       32000000 kB\nMemFree:  100 kB\n"
                              "MemAvailable:    8000000 kB\n");
    cr_assert_eq(l3d_mem_available_at(root, &b, &src), 0);
    cr_assert_eq(b, (uint64_t)8000000 * 1024);
    cr_assert(strstr(src, "MemAvailable"));
    // cgroup v2: memory.max minus memory.current of the process's group; "max" is no bound
    put(root, "proc/self/cgroup", "0::/job/step\n");
    put(root, "sys/fs/cgroup/job/step/memory.max", "max\n");
    put(root, "sys/fs/cgroup/job/step/memory.current", "1000\n");
    cr_assert_eq(l3d_mem_available_at(root, &b, &src), 0);
    cr_assert_eq(b, (uint64_t)8000000 * 1024);
    // a parent's limit binds its children
    put(root, "sys/fs/cgroup/job/memory.max", "3221225472\n");
    put(root, "sys/fs/cgroup/job/memory.current", "1073741824\n");
    cr_assert_eq(l3d_mem_available_at(root, &b, &src), 0);
    cr_assert_eq(b, (uint64_t)2 << 30);
    cr_assert_str_eq(src, "cgroup memory.max");
    // cgroup v1 (hybrid hosts list the memory controller on its own line)
    put(root, "proc/self/cgroup", "4:memory:/box\n0::/\n");
    put(root, "sys/fs/cgroup/memory/box/memory.limit_in_bytes", "1073741824\n");
    put(root, "sys/fs/cgroup/memory/box/memory.usage_in_bytes", "536870912\n");
    put(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    cr_assert_eq(l3d_mem_available_at(root, &b, &src), 0);
    cr_assert_eq(b, (uint64_t)512 << 20);
    cr_assert_str_eq(src, "cgroup memory.limit_in_bytes");
    l3d_dir_remove_tree(root);
    // the real machine answers something on Linux
    cr_assert_eq(l3d_mem_available(&b, &src), 0);
    cr_assert_gt(b, 0);
}

Test(ckpt_load, memory_check_says_what_is_needed) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    cr_assert_eq(l3d_mem_check_with(ctx, 100, 200, "x", "it"), L3D_OK);
    cr_assert_eq(l3d_mem_check_with(ctx, (uint64_t)15 << 30, (uint64_t)3 << 30,
                                    "cgroup memory.max", "the model's weights"),
                 L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "the model's weights needs 15.0 GiB but only "
                                              "3.0 GiB is available (cgroup memory.max)"),
              "%s", l3d_ctx_last_error(ctx));
    l3d_ctx_destroy(ctx);
}

// Serving without a trainer: the public device constructor, and misuse as statuses (a NULL
// device used to crash l3d_model_open).
Test(ckpt_load, open_needs_a_device_and_misuse_is_a_status) {
    fixture_t f;
    setup(&f);
    char ck[128];
    snprintf(ck, sizeof(ck), "%s/ck", f.tmp);
    cr_assert_eq(l3d_model_save(f.m, ck), L3D_OK, "%s", err(&f));
    l3d_model_t *m = NULL;
    cr_assert_eq(l3d_model_open(f.ctx, NULL, ck, &m), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(err(&f), "l3d_device_create"), "%s", err(&f));
    cr_assert_null(m);
    cr_assert_eq(l3d_model_open(f.ctx, f.dev, NULL, &m), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_open(f.ctx, f.dev, ck, NULL), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_open(NULL, f.dev, ck, &m), L3D_ERR_INVALID_ARG);
    l3d_model_config_t c = small_config();
    cr_assert_eq(l3d_model_create(f.ctx, NULL, &c, &m), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_load(NULL, ck), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_save(f.m, NULL), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_model_init_weights(NULL, 1), L3D_ERR_INVALID_ARG);

    l3d_device_t *dev = NULL;
    cr_assert_eq(l3d_device_create(f.ctx, "no-such-device", NULL, &dev), L3D_ERR_UNSUPPORTED);
    cr_assert(strstr(err(&f), "cpu"), "the message lists the built devices: %s", err(&f));
    cr_assert_eq(l3d_device_create(f.ctx, NULL, NULL, NULL), L3D_ERR_INVALID_ARG);
    cr_assert_eq(l3d_device_create(f.ctx, NULL, &(l3d_device_params_t){.num_threads = -1}, &dev),
                 L3D_ERR_INVALID_ARG);
    // NULL name and params: the CPU with its defaults; the model opens on it and says what
    // its weights are.
    cr_assert_eq(l3d_device_create(f.ctx, NULL, NULL, &dev), L3D_OK, "%s", err(&f));
    cr_assert_str_eq(l3d_device_name(dev), "cpu");
    cr_assert_gt(l3d_device_threads(dev), 0);
    cr_assert_eq(l3d_model_open(f.ctx, dev, ck, &m), L3D_OK, "%s", err(&f));
    char desc[64];
    cr_assert_str_eq(l3d_model_weights_desc(m, desc, sizeof(desc)), "f32, 1 file");
    cr_assert_str_eq(l3d_model_weights_desc(f.m, desc, sizeof(desc)), "new");
    l3d_model_destroy(m);
    l3d_device_destroy(dev);
    teardown(&f);
}

// ---- peak memory of a load ----------------------------------------------------------------
// VmRSS or VmHWM of this process in KiB, -1 where /proc has none.
static long status_kib(const char *key) {
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (fp && fgets(line, sizeof(line), fp))
        if (!strncmp(line, key, n) && line[n] == ':') v = strtol(line + n + 1, NULL, 10);
    if (fp) fclose(fp);
    return v;
}

// A one-layer model with one big tied embedding (65536 x 256), saved as float32 or BF16, then
// opened from a reset peak (l3d_model_open, or l3d_infer_open keeping bfloat16 weights):
// returns how far the peak rose above the weights' bytes (KiB) and, in *mib_p, their size.
// Skips where the peak cannot be reset or read, or under AddressSanitizer (its shadow memory
// is part of the resident size).
static long peak_over_weights(int bf16, size_t *mib_p) {
#ifdef L3D_TEST_ASAN
    cr_skip_test("AddressSanitizer's shadow memory is part of the resident size");
#endif
    fixture_t f;
    setup(&f);
    l3d_model_config_t c = small_config();
    c.vocab_size = 65536, c.hidden_size = 256, c.num_attention_heads = 4, c.head_dim = 64;
    c.num_key_value_heads = 2, c.intermediate_size = 256, c.num_hidden_layers = 1;
    c.tie_word_embeddings = 1;  // one 64 MiB float32 (32 MiB bfloat16) embedding
    l3d_model_t *big = NULL;
    cr_assert_eq(l3d_model_create(f.ctx, f.dev, &c, &big), L3D_OK, "%s", err(&f));
    cr_assert_eq(l3d_model_init_weights(big, 3), L3D_OK);
    size_t params = big->n_params * (bf16 ? sizeof(uint16_t) : sizeof(float));
    char ck[128];
    snprintf(ck, sizeof(ck), "%s/big", f.tmp);
    if (bf16) big->save.dtype = L3D_ST_BF16;
    cr_assert_eq(l3d_model_save(big, ck), L3D_OK, "%s", err(&f));
    l3d_model_destroy(big);
    // "5" resets the peak to the current resident size (Linux 4.0+).
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    if (!cr || fputs("5", cr) < 0 || fclose(cr) != 0) {
        teardown(&f);
        cr_skip_test("cannot reset the peak RSS (/proc/self/clear_refs)");
    }
    long base = status_kib("VmRSS");
    if (base < 0 || status_kib("VmHWM") < 0) {
        teardown(&f);
        cr_skip_test("no VmRSS/VmHWM in /proc/self/status");
    }
    l3d_model_t *m = NULL;
    l3d_infer_t *inf = NULL;
    if (bf16) {
        cr_assert_eq(l3d_infer_open(f.ctx, NULL, 1, 1, f.dev, ck, 1, 16, -1, &inf), L3D_OK, "%s",
                     err(&f));
        cr_assert(l3d_infer_model(inf)->w16_only);
    } else {
        cr_assert_eq(l3d_model_open(f.ctx, f.dev, ck, &m), L3D_OK, "%s", err(&f));
    }
    long over = status_kib("VmHWM") - base - (long)(params / 1024);
    l3d_infer_destroy(inf);
    l3d_model_destroy(m);
    teardown(&f);
    *mib_p = params >> 20;
    return over;
}

// Loading converts the file's tensors into the arena and unmaps the converted file pages as it
// goes: at its peak the process holds the arena plus a window of at most 2 MiB of file pages,
// not the file twice. With a 16 MiB window, loading (not decoding) was the peak of
// `l3d generate` and put it above llama.cpp's (bench/README.md); this saw 16 MiB over.
// The bound: the 2 MiB window, 2 MiB for the huge page of the arena being filled, 2 MiB for
// the model's small allocations and the loader's bookkeeping, 2 to spare (4 MiB seen; 18 with
// the old window).
Test(ckpt_load, peak_is_the_weights_plus_a_small_window) {
    size_t mib;
    long over = peak_over_weights(0, &mib);
    cr_assert_leq(over, 8 * 1024, "loading a %zu MiB model peaked %ld KiB above its weights",
                  mib, over);
}

// Opened for inference in bfloat16, a BF16 checkpoint's peak is its 2-byte weights plus the
// same window (the cache of 16 positions and the activations are kilobytes): never a float32
// arena, which would be 32 MiB more.
Test(ckpt_load, bf16_peak_is_the_16bit_weights_plus_a_small_window) {
    size_t mib;
    long over = peak_over_weights(1, &mib);
    cr_assert_leq(over, 8 * 1024, "loading a %zu MiB bfloat16 model peaked %ld KiB above its "
                  "weights", mib, over);
}

// A BF16 checkpoint opened for inference keeps its weights in bfloat16 (-1: the checkpoint's
// dtype): no float32 arena, every weight the checkpoint's value, and the logits of a prompt
// longer than the matrix-vector shape and of batched decode steps bit for bit those of the
// model opened in float32 (the kernels read bfloat16 exactly and sum in the same order).
Test(ckpt_load, bf16_checkpoint_kept_in_bf16_decodes_as_float32) {
    fixture_t f;
    setup(&f);
    char ck[128];
    snprintf(ck, sizeof(ck), "%s/bf16", f.tmp);
    f.m->save.dtype = L3D_ST_BF16;
    cr_assert_eq(l3d_model_save(f.m, ck), L3D_OK, "%s", err(&f));
    l3d_infer_t *inf[2] = {NULL, NULL};
    cr_assert_eq(l3d_infer_open(f.ctx, NULL, 1, 1, f.dev, ck, 2, 64, L3D_FLOAT32, &inf[0]),
                 L3D_OK, "%s", err(&f));
    cr_assert_eq(l3d_infer_open(f.ctx, NULL, 1, 1, f.dev, ck, 2, 64, -1, &inf[1]), L3D_OK, "%s",
                 err(&f));
    l3d_model_t *a = l3d_infer_model(inf[0]), *b = l3d_infer_model(inf[1]);
    cr_assert(!a->w16_only && a->params && b->w16_only && !b->params && b->wt == L3D_BFLOAT16);
    for (size_t i = 0; i < a->n_params; i++)
        cr_assert_eq(((const uint16_t *)b->wp)[i], l3d_f32_to_bf16(a->params[i]), "weight %zu", i);
    // A 16-bit-only model refuses what needs the float32 master, naming why.
    cr_assert_eq(l3d_model_save(b, ck), L3D_ERR_INVALID_ARG);
    cr_assert(strstr(err(&f), "only its bfloat16 weights"), "%s", err(&f));
    int V = a->cfg.vocab_size;
    float *lg[2] = {malloc(sizeof(float) * 2 * V), malloc(sizeof(float) * 2 * V)};
    int32_t prompt[37];
    for (int i = 0; i < 37; i++) prompt[i] = (i * 7 + 3) % V;
    for (int r = 0; r < 2; r++)
        cr_assert_eq(l3d_infer_decode_seq(inf[r], 0, prompt, 37, lg[r]), L3D_OK, "%s", err(&f));
    cr_assert(memcmp(lg[0], lg[1], sizeof(float) * V) == 0, "prompt logits differ");
    for (int step = 0; step < 3; step++) {
        int seqs[2] = {0, 1};
        int32_t tok[2] = {(step * 5 + 1) % V, (step * 11 + 2) % V};
        for (int r = 0; r < 2; r++)
            cr_assert_eq(l3d_infer_decode_batch(inf[r], seqs, tok, 2, lg[r]), L3D_OK, "%s",
                         err(&f));
        cr_assert(memcmp(lg[0], lg[1], sizeof(float) * 2 * V) == 0, "step %d logits differ", step);
    }
    free(lg[0]), free(lg[1]);
    l3d_infer_destroy(inf[0]);
    l3d_infer_destroy(inf[1]);
    teardown(&f);
}
