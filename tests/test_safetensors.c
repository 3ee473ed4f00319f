// safetensors: round trips, the reference writer's exact bytes, an independent Python
// reader, float conversions against bit patterns, and every malformed header rejected.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/l3d_core.h"
#include "core/checkpoint/safetensors.h"
#include "platform/platform.h"

static l3d_ctx_t *new_ctx(void) {
    l3d_ctx_params_t p;
    l3d_ctx_params_default(&p);
    p.read_env = 0;
    l3d_ctx_t *ctx = NULL;
    cr_assert_eq(l3d_ctx_create(&p, &ctx), L3D_OK);
    return ctx;
}

static void make_tmpdir(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/l3d_st_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// A safetensors image: 8-byte length, `header` verbatim, then `dlen` data bytes.
typedef struct {
    uint8_t *buf;
    size_t len;
} image_t;

static image_t make_image_n(const char *header, uint64_t declared, const void *data, size_t dlen) {
    size_t hl = strlen(header);
    image_t im = {malloc(8 + hl + dlen + 1), 8 + hl + dlen};
    for (int i = 0; i < 8; i++) im.buf[i] = (uint8_t)(declared >> (8 * i));
    memcpy(im.buf + 8, header, hl);
    if (dlen) {
        if (data) memcpy(im.buf + 8 + hl, data, dlen);
        else memset(im.buf + 8 + hl, 0, dlen);
    }
    return im;
}
static image_t make_image(const char *header, const void *data, size_t dlen) {
    return make_image_n(header, strlen(header), data, dlen);
}

static void write_file(const char *path, const void *buf, size_t len) {
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp);
    cr_assert_eq(fwrite(buf, 1, len, fp), len);
    fclose(fp);
}

// ---- round trip --------------------------------------------------------------------------

Test(safetensors, write_read_round_trip) {
    l3d_ctx_t *ctx = new_ctx();
    size_t base = l3d_ctx_mem_in_use(ctx, NULL);
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);

    float emb[12], norm[4], scalar = -0.0f;
    for (int i = 0; i < 12; i++) emb[i] = (float)i * 0.37f - 2.0f;
    emb[3] = u2f(0x7fc12345u);  // NaN with a payload: must survive bit for bit
    emb[4] = INFINITY;
    emb[5] = u2f(0x00000001u);  // smallest subnormal
    emb[6] = -0.0f;
    for (int i = 0; i < 4; i++) norm[i] = 1.0f + (float)i / 3.0f;
    l3d_st_entry_t e[4] = {
        {"tok_embeddings.weight", 2, {3, 4}, emb, L3D_ST_F32},
        {"norm.weight", 1, {4}, norm, L3D_ST_F32},
        {"scalar", 0, {0}, &scalar, L3D_ST_F32},
        {"empty", 2, {0, 5}, NULL, L3D_ST_F32},
    };
    const char *keys[] = {"format", "step", "odd \"key\""};
    const char *vals[] = {"pt", "12", "h\xc3\xa9llo\n\ttab \\ /"};
    cr_assert_eq(l3d_st_write(ctx, path, e, 4, keys, vals, 3), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));

    // Layout: header length a multiple of 8, file = 8 + header + 4 * (12 + 4 + 1) bytes.
    char *raw;
    size_t rawlen;
    cr_assert_eq(l3d_file_read_all(path, 0, &raw, &rawlen), 0);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (uint8_t)raw[i];
    cr_assert_eq(hl % 8, 0);
    cr_assert_eq(rawlen, 8 + hl + 4 * 17);
    free(raw);

    l3d_st_file_t *f;
    cr_assert_eq(l3d_st_open(ctx, path, &f), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_st_count(f), 4);
    // l3d_st_at is in data order, which is the order written ("empty" sits at the end).
    const char *names[] = {"tok_embeddings.weight", "norm.weight", "scalar", "empty"};
    for (size_t i = 0; i < 4; i++) {
        const l3d_st_tensor_t *t = l3d_st_at(f, i);
        cr_assert_str_eq(t->name, names[i]);
        cr_assert_eq(t->dtype, L3D_ST_F32);
        cr_assert_eq(t->ndim, e[i].ndim);
        for (int d = 0; d < t->ndim; d++) cr_assert_eq(t->shape[d], e[i].shape[d]);
        cr_assert_eq(l3d_st_find(f, names[i]), t);
    }
    cr_assert_null(l3d_st_at(f, 4));
    cr_assert_null(l3d_st_find(f, "nope"));
    const l3d_st_tensor_t *t = l3d_st_find(f, "tok_embeddings.weight");
    cr_assert_eq(memcmp(t->data, emb, sizeof(emb)), 0);
    float got[12];
    cr_assert_eq(l3d_st_read_f32(ctx, f, "tok_embeddings.weight", (int64_t[]){3, 4}, 2, got),
                 L3D_OK);
    for (int i = 0; i < 12; i++) cr_assert_eq(f2u(got[i]), f2u(emb[i]), "element %d", i);
    cr_assert_eq(l3d_st_read_f32(ctx, f, "norm.weight", (int64_t[]){4}, 1, got), L3D_OK);
    cr_assert_eq(memcmp(got, norm, sizeof(norm)), 0);
    float s = 1.0f;
    cr_assert_eq(l3d_st_read_f32(ctx, f, "scalar", NULL, 0, &s), L3D_OK);
    cr_assert_eq(f2u(s), 0x80000000u);
    cr_assert_eq(l3d_st_read_f32(ctx, f, "empty", (int64_t[]){0, 5}, 2, NULL), L3D_OK);
    for (int i = 0; i < 3; i++) cr_assert_str_eq(l3d_st_metadata(f, keys[i]), vals[i]);
    cr_assert_null(l3d_st_metadata(f, "missing"));
    l3d_st_close(f);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), base, "the file object leaked");

    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
    l3d_ctx_destroy(ctx);
}

// The byte streams the Rust reference's own tests expect from its serializer
// (safetensors/src/tensor.rs: test_serialization, ..._forced_alignement, test_empty).
static void check_bytes(const char *path, const uint8_t *want, size_t n) {
    char *raw;
    size_t len;
    cr_assert_eq(l3d_file_read_all(path, 0, &raw, &len), 0);
    cr_assert_eq(len, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq((uint8_t)raw[i], want[i], "byte %zu", i);
    free(raw);
}

Test(safetensors, writer_matches_reference_bytes) {
    l3d_ctx_t *ctx = new_ctx();
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/a.safetensors", dir);
    const float v[6] = {0, 1, 2, 3, 4, 5};
    static const uint8_t ser[] = {
        64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100,
        116, 121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34,
        58, 91, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115,
        101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63,
        0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64};
    l3d_st_entry_t e1 = {"attn.0", 3, {1, 2, 3}, v, L3D_ST_F32};
    cr_assert_eq(l3d_st_write(ctx, path, &e1, 1, NULL, NULL, 0), L3D_OK);
    check_bytes(path, ser, sizeof(ser));

    static const uint8_t aligned[] = {
        72, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 48, 34, 58, 123, 34, 100, 116,
        121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58,
        91, 49, 44, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102,
        115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 32, 32, 32, 32, 32,
        32, 32, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0,
        160, 64};
    l3d_st_entry_t e2 = {"attn0", 4, {1, 1, 2, 3}, v, L3D_ST_F32};
    cr_assert_eq(l3d_st_write(ctx, path, &e2, 1, NULL, NULL, 0), L3D_OK);
    check_bytes(path, aligned, sizeof(aligned));

    static const uint8_t empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
    cr_assert_eq(l3d_st_write(ctx, path, NULL, 0, NULL, NULL, 0), L3D_OK);
    check_bytes(path, empty, sizeof(empty));

    static const uint8_t meta[] = {
        40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95,
        95, 34, 58, 123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112,
        116, 34, 125, 125, 32, 32, 32, 32, 32};
    const char *k = "framework", *val = "pt";
    cr_assert_eq(l3d_st_write(ctx, path, NULL, 0, &k, &val, 1), L3D_OK);
    check_bytes(path, meta, sizeof(meta));

    // And the reference's doc example parses (an I32 tensor, 16 zero bytes).
    l3d_st_file_t *f;
    image_t im = make_image(
        "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", NULL, 16);
    cr_assert_eq(im.buf[0], '<');
    cr_assert_eq(l3d_st_parse(ctx, im.buf, im.len, "doc", &f), L3D_OK);
    cr_assert_eq(l3d_st_find(f, "test")->dtype, L3D_ST_I32);
    l3d_st_close(f);
    free(im.buf);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
    l3d_ctx_destroy(ctx);
}

// ---- an independent reader ---------------------------------------------------------------

static const char *py_reader =
    "import json, struct, sys\n"
    "import numpy as np\n"
    "b = open(sys.argv[1], 'rb').read()\n"
    "n = struct.unpack('<Q', b[:8])[0]\n"
    "assert n % 8 == 0, 'header not padded'\n"
    "h = b[8:8 + n].decode('utf-8')\n"
    "assert h == h.rstrip(' ') + ' ' * (len(h) - len(h.rstrip(' ')))\n"
    "hdr = json.loads(h)\n"
    "data = b[8 + n:]\n"
    "out, end = {}, 0\n"
    "for k, v in hdr.items():\n"
    "    if k == '__metadata__':\n"
    "        out[k] = v\n"
    "        continue\n"
    "    s, e = v['data_offsets']\n"
    "    assert s == end, 'not contiguous'\n"
    "    end = e\n"
    "    assert v['dtype'] == 'F32'\n"
    "    a = np.frombuffer(data[s:e], dtype='<f4').reshape(v['shape'])\n"
    "    out[k] = {'shape': list(a.shape), 'values': [float(x) for x in a.ravel()]}\n"
    "assert end == len(data), 'data not covered'\n"
    "print(json.dumps(out))\n";

Test(safetensors, python_numpy_reads_our_file) {
    if (access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        cr_skip_test("/usr/bin/python3 with numpy is not available");
    }
    l3d_ctx_t *ctx = new_ctx();
    char dir[64], path[128], script[128], cmd[400];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/m.safetensors", dir);
    snprintf(script, sizeof(script), "%s/reader.py", dir);
    write_file(script, py_reader, strlen(py_reader));

    float a[2 * 3 * 5], b[7];
    for (int i = 0; i < 30; i++) a[i] = sinf((float)i) * 1e3f;
    for (int i = 0; i < 7; i++) b[i] = 1.0f / (float)(i + 1);
    b[6] = 1e-40f;  // subnormal
    l3d_st_entry_t e[2] = {{"layers.0.attn.wq", 3, {2, 3, 5}, a, L3D_ST_F32}, {"b", 1, {7}, b, L3D_ST_F32}};
    const char *k = "note", *v = "\xe2\x9c\x93 \"quoted\"";
    cr_assert_eq(l3d_st_write(ctx, path, e, 2, &k, &v, 1), L3D_OK);

    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s %s", script, path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char *out = malloc(1 << 16);
    size_t n = fread(out, 1, (1 << 16) - 1, p);
    out[n] = '\0';
    cr_assert_eq(pclose(p), 0, "python reader failed: %s", out);
    json_error_t jerr;
    json_t *root = json_loads(out, 0, &jerr);
    cr_assert_not_null(root, "bad python output: %s", out);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "__metadata__"),
                                                       "note")), v);
    for (int t = 0; t < 2; t++) {
        json_t *jt = json_object_get(root, e[t].name);
        cr_assert_not_null(jt, "python did not see %s", e[t].name);
        json_t *js = json_object_get(jt, "shape"), *jv = json_object_get(jt, "values");
        cr_assert_eq((int)json_array_size(js), e[t].ndim);
        size_t count = 1;
        for (int d = 0; d < e[t].ndim; d++) {
            cr_assert_eq(json_integer_value(json_array_get(js, (size_t)d)), e[t].shape[d]);
            count *= (size_t)e[t].shape[d];
        }
        cr_assert_eq(json_array_size(jv), count);
        for (size_t i = 0; i < count; i++)
            cr_assert_eq(json_number_value(json_array_get(jv, i)), (double)e[t].data[i],
                         "%s[%zu]", e[t].name, i);
    }
    json_decref(root);
    free(out);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
    l3d_ctx_destroy(ctx);
}

// ---- conversions -------------------------------------------------------------------------

// Reads one tensor of `dtype` with the given raw little-endian elements as f32.
static void convert(const char *dtype, size_t esize, const void *raw, size_t count, float *out) {
    l3d_ctx_t *ctx = new_ctx();
    char hdr[256];
    snprintf(hdr, sizeof(hdr),
             "{\"t\":{\"dtype\":\"%s\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", dtype,
             count, count * esize);
    image_t im = make_image(hdr, raw, count * esize);
    l3d_st_file_t *f;
    cr_assert_eq(l3d_st_parse(ctx, im.buf, im.len, "conv", &f), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_st_read_f32(ctx, f, "t", (int64_t[]){(int64_t)count}, 1, out), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    l3d_st_close(f);
    free(im.buf);
    l3d_ctx_destroy(ctx);
}

Test(safetensors, f16_known_bit_patterns) {
    static const uint16_t h[] = {0x0000, 0x8000, 0x3c00, 0xc000, 0x7bff, 0x0400, 0x0001,
                                 0x03ff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x3555, 0x8001};
    static const uint32_t want[] = {0x00000000, 0x80000000, 0x3f800000, 0xc0000000, 0x477fe000,
                                    0x38800000, 0x33800000, 0x387fc000, 0x7f800000, 0xff800000,
                                    0x7fc00000, 0x7f802000, 0x3eaaa000, 0xb3800000};
    float out[L3D_ARRAY_LEN(h)];
    convert("F16", 2, h, L3D_ARRAY_LEN(h), out);
    for (size_t i = 0; i < L3D_ARRAY_LEN(h); i++)
        cr_assert_eq(f2u(out[i]), want[i], "half 0x%04x -> 0x%08x, want 0x%08x", h[i],
                     f2u(out[i]), want[i]);
}

// Every finite half against the formula (-1)^s * m * 2^e evaluated in double.
Test(safetensors, f16_all_values) {
    uint16_t *h = malloc(65536 * 2);
    float *out = malloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    convert("F16", 2, h, 65536, out);
    for (uint32_t i = 0; i < 65536; i++) {
        int s = (int)(i >> 15), e = (int)((i >> 10) & 31), m = (int)(i & 1023);
        if (e == 31) {
            cr_assert(m ? isnan(out[i]) : isinf(out[i]), "half 0x%04x", i);
            continue;
        }
        double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        if (s) v = -v;
        cr_assert_eq((double)out[i], v, "half 0x%04x", i);
        cr_assert_eq(!!signbit(out[i]), s, "half 0x%04x sign", i);
    }
    free(h);
    free(out);
}

Test(safetensors, bf16_and_f64) {
    static const uint16_t b[] = {0x3f80, 0xc049, 0x7f80, 0x0001, 0x7fc1, 0x8000};
    static const uint32_t want[] = {0x3f800000, 0xc0490000, 0x7f800000,
                                    0x00010000, 0x7fc10000, 0x80000000};
    float out[6];
    convert("BF16", 2, b, 6, out);
    for (int i = 0; i < 6; i++) cr_assert_eq(f2u(out[i]), want[i], "bf16 0x%04x", b[i]);

    static const double d[] = {1.5, -2.25, 1e-50, 1e300, 0.1, -0.0};
    convert("F64", 8, d, 6, out);
    cr_assert_eq(out[0], 1.5f);
    cr_assert_eq(out[1], -2.25f);
    cr_assert_eq(f2u(out[2]), 0);
    cr_assert(isinf(out[3]) && out[3] > 0);
    cr_assert_eq(out[4], 0.1f);
    cr_assert_eq(f2u(out[5]), 0x80000000u);
}

// ---- malformed files ---------------------------------------------------------------------

static void expect_format(const image_t *im, const char *what, const char *needle) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_st_file_t *f = (l3d_st_file_t *)1;
    l3d_status st = l3d_st_parse(ctx, im->buf, im->len, "bad.safetensors", &f);
    const char *msg = l3d_ctx_last_error(ctx);
    cr_expect_eq(st, L3D_ERR_FORMAT, "%s: got %d (%s)", what, st, msg);
    cr_expect_null(f, "%s: *f_p not cleared", what);
    cr_expect(strncmp(msg, "bad.safetensors: ", 17) == 0, "%s: message '%s'", what, msg);
    cr_expect(!strchr(msg, '\n'), "%s: multi-line message", what);
    if (needle) cr_expect(strstr(msg, needle), "%s: '%s' lacks '%s'", what, msg, needle);
    cr_expect_eq(l3d_ctx_mem_in_use(ctx, NULL), 0, "%s: leaked", what);
    l3d_ctx_destroy(ctx);
}

static void bad_header(const char *header, size_t dlen, const char *what, const char *needle) {
    image_t im = make_image(header, NULL, dlen);
    expect_format(&im, what, needle);
    free(im.buf);
}

#define T1(name, off) "\"" name "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":" off "}"

Test(safetensors, rejects_malformed) {
    image_t im = {(uint8_t *)"\x08\0\0\0\0\0\0", 7};
    expect_format(&im, "truncated header length", "too short");
    im = make_image_n("{}", 100, NULL, 10);
    expect_format(&im, "N > file size", "runs past the end");
    free(im.buf);
    im = make_image_n("{}", 100000001, NULL, 0);
    expect_format(&im, "N over 100 MB", "over the limit");
    free(im.buf);
    im = make_image_n("{}", UINT64_MAX, NULL, 0);
    expect_format(&im, "N = 2^64-1", "over the limit");
    free(im.buf);
    im = make_image_n("", 0, NULL, 0);
    expect_format(&im, "empty header", NULL);
    free(im.buf);

    bad_header("{abc", 0, "not JSON", "not valid JSON");
    bad_header("[1,2]", 0, "JSON array", NULL);
    bad_header(" {}", 0, "leading space", "'{'");
    bad_header("{} x", 0, "trailing text in the header", "not valid JSON");
    bad_header("{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "dtype unknown", "unknown dtype 'Q7'");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
               "shape negative", "shape entry 0");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
               "shape non-integer", "shape entry 0");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
               "shape string", "shape entry 0");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
               "shape not an array", "not an array");
    bad_header("{" T1("a", "[8,0]") "}", 8, "offsets reversed", "reversed");
    bad_header("{" T1("a", "[0,8]") "}", 4, "offsets past end", "run past the data section");
    bad_header("{" T1("a", "[0,8]") "," T1("b", "[4,12]") "}", 12, "overlap", "overlap");
    bad_header("{" T1("a", "[0,8]") "," T1("b", "[0,8]") "}", 8, "same range", "overlap");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
               12, "gap", "belong to no tensor");
    bad_header("{" T1("a", "[4,12]") "}", 12, "gap at the start", "[0, 4)");
    bad_header("{" T1("a", "[0,8]") "}", 16, "trailing bytes after the last tensor",
               "has 16 bytes but the tensors cover 8");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
               "size mismatch", "tensor 'a' data_offsets [0, 4] do not match shape [2] of F32 "
               "(8 bytes)");
    bad_header("{" T1("a", "[0,8]") "," T1("a", "[8,16]") "}", 16, "duplicate names",
               "duplicate");
    bad_header("{\"__metadata__\":{\"k\":1}}", 0, "metadata value not a string", "'k'");
    bad_header("{\"__metadata__\":\"x\"}", 0, "metadata not an object", "__metadata__");
    bad_header("{\"__metadata__\":null}", 0, "metadata null", "__metadata__");
    bad_header("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0, "duplicate metadata",
               "duplicate");
    bad_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,0],"
               "\"data_offsets\":[0,0]}}",
               0, "shape product overflow before a 0", "overflows");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952,4],"
               "\"data_offsets\":[0,0]}}",
               0, "byte size overflow", "overflows");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
               4, "9 dimensions", "9 dimensions");
    bad_header("{\"a\":[1]}", 0, "tensor not an object", "not an object");
    bad_header("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "no dtype", "dtype");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "no shape", "shape");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "no offsets", "data_offsets");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
               "unknown key", "unknown key 'x'");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8,
               "three offsets", "data_offsets");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1e1]}}", 8,
               "real offset", "data_offsets");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
               "\"data_offsets\":[0,18446744073709551615]}}",
               8, "offset beyond int64", "not valid JSON");
    bad_header("{\"\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "invalid UTF-8 name", "not valid JSON");
    bad_header("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "NUL in a name", "not valid JSON");
    bad_header("{\"a\\nb\":{\"dtype\":\"Q\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "newline in a name stays one line", "'a?b'");
    bad_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}\n", 9,
               "one byte too many", "has 9 bytes but the tensors cover 8");
}

Test(safetensors, accepts_unusual_but_valid) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_st_file_t *f;
    // Header order differs from data order (the reference sorts by offsets); zero-size
    // tensors share an offset; whitespace padding; a scalar.
    image_t im = make_image("{\"z\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]},"
                            "\"e2\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
                            "\"e1\":{\"dtype\":\"BOOL\",\"shape\":[0],\"data_offsets\":[8,8]},"
                            "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}   ",
                            NULL, 12);
    cr_assert_eq(l3d_st_parse(ctx, im.buf, im.len, "ok", &f), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    cr_assert_eq(l3d_st_count(f), 4);
    const char *order[] = {"a", "e1", "e2", "z"};
    for (size_t i = 0; i < 4; i++) cr_assert_str_eq(l3d_st_at(f, i)->name, order[i]);
    cr_assert_eq(l3d_st_find(f, "z")->ndim, 0);
    cr_assert_eq(l3d_st_find(f, "a")->data, im.buf + im.len - 12);
    l3d_st_close(f);
    free(im.buf);

    // Many tensors: lookups go through the sorted name index.
    char *hdr = malloc(1 << 16);
    size_t k = (size_t)snprintf(hdr, 1 << 16, "{");
    for (int i = 0; i < 300; i++)
        k += (size_t)snprintf(hdr + k, (1 << 16) - k,
                              "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                              i ? "," : "", (i * 7919) % 300, i, i + 1);
    snprintf(hdr + k, (1 << 16) - k, "}");
    im = make_image(hdr, NULL, 300);
    cr_assert_eq(l3d_st_parse(ctx, im.buf, im.len, "many", &f), L3D_OK, "%s",
                 l3d_ctx_last_error(ctx));
    for (int i = 0; i < 300; i++) {
        char name[16];
        snprintf(name, sizeof(name), "t%d", (i * 7919) % 300);
        const l3d_st_tensor_t *t = l3d_st_find(f, name);
        cr_assert_not_null(t, "%s", name);
        cr_assert_eq(t->begin, (size_t)i);
    }
    l3d_st_close(f);
    free(im.buf);
    free(hdr);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), 0);
    l3d_ctx_destroy(ctx);
}

// ---- lookups and read errors -------------------------------------------------------------

Test(safetensors, read_errors) {
    l3d_ctx_t *ctx = new_ctx();
    l3d_st_file_t *f;
    image_t im = make_image("{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[3,4],"
                            "\"data_offsets\":[0,48]},"
                            "\"ids\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[48,56]}}",
                            NULL, 56);
    cr_assert_eq(l3d_st_parse(ctx, im.buf, im.len, "m.safetensors", &f), L3D_OK);
    float out[12];
    cr_assert_eq(l3d_st_read_f32(ctx, f, "missing", (int64_t[]){3, 4}, 2, out),
                 L3D_ERR_NOT_FOUND);
    cr_assert_str_eq(l3d_ctx_last_error(ctx), "m.safetensors: no tensor 'missing'");
    cr_assert_eq(l3d_st_read_f32(ctx, f, "lm_head.weight", (int64_t[]){4, 3}, 2, out),
                 L3D_ERR_FORMAT);
    cr_assert_str_eq(l3d_ctx_last_error(ctx),
                     "m.safetensors: tensor 'lm_head.weight' has shape [3, 4], expected [4, 3]");
    cr_assert_eq(l3d_st_read_f32(ctx, f, "lm_head.weight", (int64_t[]){12}, 1, out),
                 L3D_ERR_FORMAT);
    cr_assert_eq(l3d_st_read_f32(ctx, f, "lm_head.weight", (int64_t[]){3, 4, 1}, 3, out),
                 L3D_ERR_FORMAT);
    cr_assert_eq(l3d_st_read_f32(ctx, f, "ids", (int64_t[]){2}, 1, out), L3D_ERR_FORMAT);
    cr_assert_str_eq(l3d_ctx_last_error(ctx),
                     "m.safetensors: tensor 'ids' has dtype I32, expected a float");
    cr_assert_eq(l3d_st_read_f32(ctx, f, "lm_head.weight", (int64_t[]){3, 4}, 2, out), L3D_OK);
    l3d_st_close(f);
    free(im.buf);

    char dir[64], path[160];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/none.safetensors", dir);
    cr_assert_eq(l3d_st_open(ctx, path, &f), L3D_ERR_NOT_FOUND);
    cr_assert(strstr(l3d_ctx_last_error(ctx), path));
    // Not a regular file: bad input naming what it is (exit 2), not an I/O failure.
    cr_assert_eq(l3d_st_open(ctx, dir, &f), L3D_ERR_CONFIG);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "it is a directory, not a regular file"), "%s",
              l3d_ctx_last_error(ctx));
    write_file(path, "", 0);
    cr_assert_eq(l3d_st_open(ctx, path, &f), L3D_ERR_FORMAT);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), 0);
    l3d_ctx_destroy(ctx);
}

Test(safetensors, writer_rejects_bad_entries) {
    l3d_ctx_t *ctx = new_ctx();
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/w.safetensors", dir);
    float v[4] = {1, 2, 3, 4};
    l3d_st_entry_t dup[2] = {{"a", 1, {4}, v, L3D_ST_F32}, {"a", 1, {4}, v, L3D_ST_F32}};
    cr_assert_eq(l3d_st_write(ctx, path, dup, 2, NULL, NULL, 0), L3D_ERR_INVALID_ARG);
    l3d_st_entry_t res = {"__metadata__", 1, {4}, v, L3D_ST_F32};
    cr_assert_eq(l3d_st_write(ctx, path, &res, 1, NULL, NULL, 0), L3D_ERR_INVALID_ARG);
    l3d_st_entry_t neg = {"a", 2, {-1, 4}, v, L3D_ST_F32};
    cr_assert_eq(l3d_st_write(ctx, path, &neg, 1, NULL, NULL, 0), L3D_ERR_INVALID_ARG);
    l3d_st_entry_t big = {"a", 3, {1 << 30, 1 << 30, 1 << 30}, v, L3D_ST_F32};
    cr_assert_eq(l3d_st_write(ctx, path, &big, 1, NULL, NULL, 0), L3D_ERR_INVALID_ARG);
    l3d_st_entry_t utf = {"\xff", 1, {4}, v, L3D_ST_F32};
    cr_assert_eq(l3d_st_write(ctx, path, &utf, 1, NULL, NULL, 0), L3D_ERR_INVALID_ARG);
    const char *k[2] = {"x", "x"}, *val[2] = {"1", "2"};
    cr_assert_eq(l3d_st_write(ctx, path, NULL, 0, k, val, 2), L3D_ERR_INVALID_ARG);
    cr_assert(!l3d_path_exists(path), "a rejected write left a file");
    char nodir[160];
    snprintf(nodir, sizeof(nodir), "%s/missing/w.safetensors", dir);
    l3d_st_entry_t ok = {"a", 1, {4}, v, L3D_ST_F32};
    cr_assert_eq(l3d_st_write(ctx, nodir, &ok, 1, NULL, NULL, 0), L3D_ERR_IO);
    cr_assert(strstr(l3d_ctx_last_error(ctx), nodir));
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), 0);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
    l3d_ctx_destroy(ctx);
}

// 16-bit conversions, exhaustively: every BF16 and F16 value converts to float32 and back to
// the same bits (NaNs to a NaN), and float32 values between two neighbours round to nearest,
// ties to the even one, as torch's .to(bfloat16) and IEEE binary16 conversion do.
static uint16_t to16(l3d_st_dtype dt, float x) {
    uint8_t b[2];
    l3d_st_from_f32(dt, &x, 1, b);
    return (uint16_t)(b[0] | b[1] << 8);
}
static float from16(l3d_st_dtype dt, uint16_t h) {
    uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
    float x;
    l3d_st_to_f32(dt, b, 1, &x);
    return x;
}

Test(safetensors, bf16_and_f16_round_trip_and_round_to_nearest_even) {
    const l3d_st_dtype dts[2] = {L3D_ST_BF16, L3D_ST_F16};
    for (int d = 0; d < 2; d++) {
        l3d_st_dtype dt = dts[d];
        uint16_t exp_mask = dt == L3D_ST_BF16 ? 0x7f80 : 0x7c00;
        uint16_t man_mask = dt == L3D_ST_BF16 ? 0x007f : 0x03ff;
        for (uint32_t h = 0; h < 0x10000; h++) {
            float x = from16(dt, (uint16_t)h);
            int nan = (h & exp_mask) == exp_mask && (h & man_mask);
            if (nan) {
                cr_assert(isnan(x) && isnan(from16(dt, to16(dt, x))), "dtype %d: %04x", (int)dt, h);
                continue;
            }
            cr_assert_eq(to16(dt, x), h, "dtype %d: %04x -> %a -> %04x", (int)dt, h, (double)x,
                         to16(dt, x));
            // Midpoint to the next value up (same sign, finite, not the largest): the tie goes
            // to the even neighbour; a hair above it goes up, a hair below stays.
            uint16_t up = (uint16_t)(h + 1);
            if ((h & 0x7fff) == (uint32_t)(exp_mask - 1) || (h & 0x7fff) >= exp_mask) continue;
            double mid = ((double)x + (double)from16(dt, up)) / 2;
            float fm = (float)mid;
            if ((double)fm != mid) continue;  // not representable in float32 (subnormal F16 ok)
            cr_assert_eq(to16(dt, fm), (h & 1) ? up : h, "dtype %d tie at %a", (int)dt, mid);
            cr_assert_eq(to16(dt, nextafterf(fm, (h & 0x8000) ? -INFINITY : INFINITY)), up);
            cr_assert_eq(to16(dt, nextafterf(fm, 0.0f)), h);
        }
    }
    // Overflow: above F16's largest finite (65504) by half an ulp or more is infinity.
    cr_assert_eq(to16(L3D_ST_F16, 65519.0f), 0x7bff);
    cr_assert_eq(to16(L3D_ST_F16, 65520.0f), 0x7c00);
    cr_assert_eq(to16(L3D_ST_F16, -1e10f), 0xfc00);
    cr_assert_eq(to16(L3D_ST_BF16, INFINITY), 0x7f80);
}

// A BF16 entry is written as BF16 and reads back as the rounded values.
Test(safetensors, writes_bf16_and_f16) {
    l3d_ctx_t *ctx = new_ctx();
    char dir[64], path[128];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/h.safetensors", dir);
    float v[3] = {1.0f, 1.00390625f /* bf16 tie: to 1 */, 1.01171875f /* tie: up */};
    l3d_st_entry_t e[2] = {{"b", 1, {3}, v, L3D_ST_BF16}, {"h", 1, {3}, v, L3D_ST_F16}};
    cr_assert_eq(l3d_st_write(ctx, path, e, 2, NULL, NULL, 0), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    l3d_st_file_t *f = NULL;
    cr_assert_eq(l3d_st_open(ctx, path, &f), L3D_OK);
    cr_assert_eq(l3d_st_find(f, "b")->dtype, L3D_ST_BF16);
    cr_assert_eq(l3d_st_find(f, "h")->dtype, L3D_ST_F16);
    float got[3];
    cr_assert_eq(l3d_st_read_f32(ctx, f, "b", (int64_t[]){3}, 1, got), L3D_OK);
    cr_assert(got[0] == 1.0f && got[1] == 1.0f && got[2] == 1.015625f, "%a %a %a",
              (double)got[0], (double)got[1], (double)got[2]);
    cr_assert_eq(l3d_st_read_f32(ctx, f, "h", (int64_t[]){3}, 1, got), L3D_OK);
    cr_assert(got[0] == v[0] && got[1] == v[1] && got[2] == v[2]);  // exact in F16
    l3d_st_close(f);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), 0);
    cr_assert_eq(l3d_dir_remove_tree(dir), 0);
    l3d_ctx_destroy(ctx);
}
