// safetensors: a header validator at least as strict as the Rust reference reader, f32
// conversion of float tensors, and an atomic writer whose bytes match the reference writer.
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/input.h"
#include "core/l3d_core.h"
#include "core/checkpoint/safetensors.h"
#include "devices/device_math.h"
#include "platform/file_stream.h"
#include "platform/platform.h"

// Tensor bytes are copied to and from host floats as they are: safetensors is little-endian.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "core/checkpoint/safetensors.c assumes a little-endian host (add byte swaps to port it)"
#endif

#define ST_MAX_HEADER 100000000u  // the reference's MAX_HEADER_SIZE

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    [L3D_ST_F32] = {"F32", 4}, [L3D_ST_F16] = {"F16", 2},  [L3D_ST_BF16] = {"BF16", 2},
    [L3D_ST_F64] = {"F64", 8}, [L3D_ST_I32] = {"I32", 4},  [L3D_ST_I64] = {"I64", 8},
    [L3D_ST_U8] = {"U8", 1},   [L3D_ST_I8] = {"I8", 1},    [L3D_ST_I16] = {"I16", 2},
    [L3D_ST_U16] = {"U16", 2}, [L3D_ST_U32] = {"U32", 4},  [L3D_ST_U64] = {"U64", 8},
    [L3D_ST_BOOL] = {"BOOL", 1},
};

struct l3d_st_file {
    l3d_ctx_t *ctx;
    const void *map;  // set by l3d_st_open: the mapping to release
    size_t map_len;
    const uint8_t *data;  // the data section
    size_t data_len;
    size_t n;
    l3d_st_tensor_t *tensors;  // in data-offset order
    size_t *by_name;           // indices into tensors, sorted by name
    size_t n_meta;
    const char **meta;  // key, value, key, value, ...
    char *strings;      // names, metadata and origin in one block
    size_t strings_size;
    const char *origin;
};

// ---- small helpers -----------------------------------------------------------------------

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

// A name made safe for a one-line message: control bytes become '?', long names are cut.
static const char *clean(const char *s, char *out, size_t cap) {
    size_t i = 0;
    for (; s[i] && i + 4 < cap; i++) out[i] = ((unsigned char)s[i] < 0x20) ? '?' : s[i];
    if (s[i]) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
    return out;
}

static const char *fmt_shape(const int64_t *shape, int ndim, char *out, size_t cap) {
    size_t k = 0;
    k += (size_t)snprintf(out + k, cap - k, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
    return out;
}

static int dtype_from_name(const char *s, l3d_st_dtype *dt) {
    for (size_t i = 0; i < L3D_ARRAY_LEN(st_dtypes); i++) {
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *dt = (l3d_st_dtype)i;
            return 1;
        }
    }
    return 0;
}

// A JSON integer in [0, INT64_MAX].
static int get_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

// ---- reading the header ------------------------------------------------------------------

static l3d_status parse_tensor(l3d_ctx_t *ctx, const char *origin, const char *name,
                               json_t *info, size_t data_len, l3d_st_tensor_t *t) {
    char qn[160], sh[256];
    clean(name, qn, sizeof(qn));
    if (!json_is_object(info))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' is not an object", origin, qn);
    const char *k;
    json_t *v;
    json_object_foreach(info, k, v) {
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets")) {
            char qk[64];
            return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' has unknown key '%s'", origin,
                             qn, clean(k, qk, sizeof(qk)));
        }
    }
    json_t *jd = json_object_get(info, "dtype"), *js = json_object_get(info, "shape");
    json_t *jo = json_object_get(info, "data_offsets");
    if (!jd || !js || !jo)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' lacks '%s'", origin, qn,
                         !jd ? "dtype" : !js ? "shape" : "data_offsets");
    if (!json_is_string(jd))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' dtype is not a string", origin, qn);
    if (!dtype_from_name(json_string_value(jd), &t->dtype)) {
        char qd[32];
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", origin,
                         qn, clean(json_string_value(jd), qd, sizeof(qd)));
    }
    if (!json_is_array(js))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' shape is not an array", origin, qn);
    size_t nd = json_array_size(js);
    if (nd > L3D_ST_MAX_DIMS)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: tensor '%s' has %zu dimensions, at most %d are supported", origin,
                         qn, nd, L3D_ST_MAX_DIMS);
    t->ndim = (int)nd;
    // The element count is multiplied in order and fails on the first overflow, like the
    // reference's checked_mul fold (even if a later dimension is 0).
    uint64_t count = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!get_uint(json_array_get(js, i), &d))
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: tensor '%s' shape entry %zu is not a non-negative integer",
                             origin, qn, i);
        t->shape[i] = (int64_t)d;
        if (d && count > UINT64_MAX / d) overflow = 1;
        if (!overflow) count *= d;
    }
    size_t esize = st_dtypes[t->dtype].size;
    if (overflow || count > UINT64_MAX / esize || count * esize > SIZE_MAX)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' shape %s overflows its byte size",
                         origin, qn, fmt_shape(t->shape, t->ndim, sh, sizeof(sh)));
    uint64_t bytes = count * esize;
    uint64_t b, e;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !get_uint(json_array_get(jo, 0), &b) ||
        !get_uint(json_array_get(jo, 1), &e))
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: tensor '%s' data_offsets is not two non-negative integers", origin,
                         qn);
    if (e < b)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 "] are reversed",
                         origin, qn, b, e);
    if (e > data_len)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                         "] run past the data section (%zu bytes)",
                         origin, qn, b, e, data_len);
    if (e - b != bytes)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                         "] do not match shape %s of %s (%" PRIu64 " bytes)",
                         origin, qn, b, e, fmt_shape(t->shape, t->ndim, sh, sizeof(sh)),
                         st_dtypes[t->dtype].name, bytes);
    t->begin = (size_t)b;
    t->end = (size_t)e;
    return L3D_OK;
}

static int cmp_offsets(const void *pa, const void *pb) {
    const l3d_st_tensor_t *a = pa, *b = pb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return strcmp(a->name, b->name);
}

// qsort has no context argument: sort (name, index) pairs instead of bare indices.
typedef struct {
    const char *name;
    size_t index;
} st_name_ix;

static int cmp_names(const void *pa, const void *pb) {
    return strcmp(((const st_name_ix *)pa)->name, ((const st_name_ix *)pb)->name);
}

static char *put_string(char **cursor, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = *cursor;
    memcpy(d, s, n);
    *cursor += n;
    return d;
}

// Checks that the tensors, in offset order, tile the data section exactly: the reference
// rejects gaps, overlaps and bytes after the last tensor.
static l3d_status check_tiling(l3d_ctx_t *ctx, const l3d_st_file_t *f) {
    char qa[160], qb[160];
    size_t pos = 0;
    for (size_t i = 0; i < f->n; i++) {
        const l3d_st_tensor_t *t = &f->tensors[i];
        if (t->begin < pos) {
            const l3d_st_tensor_t *p = &f->tensors[i - 1];
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: tensor '%s' data_offsets [%zu, %zu] overlap tensor '%s' "
                             "[%zu, %zu]",
                             f->origin, clean(t->name, qa, sizeof(qa)), t->begin, t->end,
                             clean(p->name, qb, sizeof(qb)), p->begin, p->end);
        }
        if (t->begin > pos)
            return l3d_error(ctx, L3D_ERR_FORMAT,
                             "%s: data bytes [%zu, %zu) before tensor '%s' belong to no tensor",
                             f->origin, pos, t->begin, clean(t->name, qa, sizeof(qa)));
        pos = t->end;
    }
    if (pos != f->data_len)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: the data section has %zu bytes but the tensors cover %zu", f->origin,
                         f->data_len, pos);
    return L3D_OK;
}

l3d_status l3d_st_parse(l3d_ctx_t *ctx, const void *buf, size_t len, const char *origin,
                        l3d_st_file_t **f_p) {
    if (!ctx || !f_p || (!buf && len))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_st_parse: NULL argument");
    *f_p = NULL;
    if (!origin) origin = "<buffer>";
    const uint8_t *b = buf;
    if (len < 8)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: %zu bytes is too short for the 8-byte header length", origin, len);
    uint64_t hlen = le64(b);
    if (hlen > ST_MAX_HEADER)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: header length %" PRIu64 " is over the limit of %u bytes", origin,
                         hlen, ST_MAX_HEADER);
    if (hlen > len - 8)
        return l3d_error(ctx, L3D_ERR_FORMAT,
                         "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                         origin, hlen, len);
    // The reference is about to require this too (InvalidHeaderStart).
    if (hlen == 0 || b[8] != '{')
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: header does not start with '{'", origin);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: header is not valid JSON: %s (column %d)",
                         origin, jerr.text, jerr.column);
    l3d_status st = L3D_OK;
    l3d_st_file_t *f = NULL;
    st_name_ix *ix = NULL;
    if (!json_is_object(root)) {
        st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: header is not a JSON object", origin);
        goto fail;
    }

    // First pass: count tensors and metadata, size the string block, check metadata.
    size_t n = 0, n_meta = 0, str_bytes = strlen(origin) + 1;
    json_t *jmeta = NULL;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            jmeta = val;
            continue;
        }
        n++;
        str_bytes += strlen(key) + 1;
    }
    if (jmeta) {
        if (!json_is_object(jmeta)) {
            st = l3d_error(ctx, L3D_ERR_FORMAT, "%s: __metadata__ is not an object of strings",
                           origin);
            goto fail;
        }
        json_object_foreach(jmeta, key, val) {
            if (!json_is_string(val)) {
                char qk[160];
                st = l3d_error(ctx, L3D_ERR_FORMAT,
                               "%s: __metadata__ value of '%s' is not a string", origin,
                               clean(key, qk, sizeof(qk)));
                goto fail;
            }
            n_meta++;
            str_bytes += strlen(key) + 1 + strlen(json_string_value(val)) + 1;
        }
    }

    f = l3d_calloc(ctx, 1, sizeof(*f), "other");
    if (!f) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    f->ctx = ctx;
    f->n = n;
    f->n_meta = n_meta;
    f->strings_size = str_bytes;
    f->data = b + 8 + hlen;
    f->data_len = len - 8 - (size_t)hlen;
    f->strings = l3d_malloc(ctx, str_bytes, "other");
    f->tensors = n ? l3d_calloc(ctx, n, sizeof(*f->tensors), "other") : NULL;
    f->by_name = n ? l3d_malloc(ctx, n * sizeof(*f->by_name), "other") : NULL;
    f->meta = n_meta ? l3d_malloc(ctx, 2 * n_meta * sizeof(*f->meta), "other") : NULL;
    ix = n ? l3d_malloc(ctx, n * sizeof(*ix), "other") : NULL;
    if (!f->strings || (n && (!f->tensors || !f->by_name || !ix)) || (n_meta && !f->meta)) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    char *cursor = f->strings;
    f->origin = put_string(&cursor, origin);

    // Second pass: every tensor on its own, then how they tile the data section.
    size_t i = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        l3d_st_tensor_t *t = &f->tensors[i++];
        t->name = put_string(&cursor, key);
        L3D_CHECK_GOTO(ctx, parse_tensor(ctx, origin, key, val, f->data_len, t), st, fail);
        t->data = f->data + t->begin;
    }
    if (n) qsort(f->tensors, n, sizeof(*f->tensors), cmp_offsets);
    L3D_CHECK_GOTO(ctx, check_tiling(ctx, f), st, fail);
    for (i = 0; i < n; i++) ix[i] = (st_name_ix){f->tensors[i].name, i};
    if (n) qsort(ix, n, sizeof(*ix), cmp_names);
    for (i = 0; i < n; i++) f->by_name[i] = ix[i].index;
    i = 0;
    if (jmeta) {
        json_object_foreach(jmeta, key, val) {
            f->meta[2 * i] = put_string(&cursor, key);
            f->meta[2 * i + 1] = put_string(&cursor, json_string_value(val));
            i++;
        }
    }
    l3d_free(ctx, ix, n * sizeof(*ix), "other");
    json_decref(root);
    *f_p = f;
    return L3D_OK;
fail:
    if (ix) l3d_free(ctx, ix, n * sizeof(*ix), "other");
    l3d_st_close(f);
    json_decref(root);
    return st;
}

l3d_status l3d_st_open(l3d_ctx_t *ctx, const char *path, l3d_st_file_t **f_p) {
    if (!ctx || !path || !f_p)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_st_open: NULL argument");
    *f_p = NULL;
    const void *map;
    size_t map_len;
    L3D_CHECK(ctx, l3d_input_map(ctx, path, NULL, &map, &map_len));
    l3d_status st = l3d_st_parse(ctx, map, map_len, path, f_p);
    if (st < 0) {
        l3d_file_unmap(map, map_len);
        return st;
    }
    (*f_p)->map = map;
    (*f_p)->map_len = map_len;
    return L3D_OK;
}

void l3d_st_close(l3d_st_file_t *f) {
    if (!f) return;
    l3d_ctx_t *ctx = f->ctx;
    l3d_file_unmap(f->map, f->map_len);
    l3d_free(ctx, f->tensors, f->n * sizeof(*f->tensors), "other");
    l3d_free(ctx, f->by_name, f->n * sizeof(*f->by_name), "other");
    l3d_free(ctx, (void *)f->meta, 2 * f->n_meta * sizeof(*f->meta), "other");
    l3d_free(ctx, f->strings, f->strings_size, "other");
    l3d_free(ctx, f, sizeof(*f), "other");
}

size_t l3d_st_count(const l3d_st_file_t *f) { return f ? f->n : 0; }

const l3d_st_tensor_t *l3d_st_at(const l3d_st_file_t *f, size_t i) {
    return (f && i < f->n) ? &f->tensors[i] : NULL;
}

const l3d_st_tensor_t *l3d_st_find(const l3d_st_file_t *f, const char *name) {
    if (!f || !name) return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const l3d_st_tensor_t *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return NULL;
}

void l3d_st_drop(const l3d_st_file_t *f, const l3d_st_tensor_t *t) {
    if (f && t && f->map) l3d_file_map_drop(f->map, f->map_len, t->data, t->end - t->begin);
}

void l3d_st_drop_range(const l3d_st_file_t *f, const void *data, size_t len) {
    if (f && f->map) l3d_file_map_drop(f->map, f->map_len, data, len);
}

const char *l3d_st_metadata(const l3d_st_file_t *f, const char *key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

// ---- conversion --------------------------------------------------------------------------

// (16-bit conversions: devices/device_math.h, the same rounding as every device's)

int l3d_st_dtype_is_float(l3d_st_dtype dt) {
    return dt == L3D_ST_F32 || dt == L3D_ST_F16 || dt == L3D_ST_BF16 || dt == L3D_ST_F64;
}

size_t l3d_st_dtype_size(l3d_st_dtype dt) {
    return (unsigned)dt < sizeof(st_dtypes) / sizeof(st_dtypes[0]) ? st_dtypes[dt].size : 0;
}

const char *l3d_st_dtype_name(l3d_st_dtype dt) {
    return (unsigned)dt < sizeof(st_dtypes) / sizeof(st_dtypes[0]) ? st_dtypes[dt].name : "?";
}

void l3d_st_to_f32(l3d_st_dtype dt, const void *from, size_t count, float *dst) {
    const uint8_t *src = from;
    switch (dt) {
    case L3D_ST_F32:
        if (count) memcpy(dst, src, count * 4);  // the data need not be 4-aligned
        break;
    case L3D_ST_F16:
        for (size_t i = 0; i < count; i++)
            dst[i] = l3d_f16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        break;
    case L3D_ST_BF16:
        for (size_t i = 0; i < count; i++)
            dst[i] = l3d_bf16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        break;
    case L3D_ST_F64:
        for (size_t i = 0; i < count; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);  // the data section need not be 8-aligned
            dst[i] = (float)d;
        }
        break;
    default:
        break;
    }
}

void l3d_st_from_f32(l3d_st_dtype dt, const float *src, size_t count, void *to) {
    uint8_t *dst = to;
    for (size_t i = 0; i < count; i++) {
        uint16_t h = dt == L3D_ST_BF16 ? l3d_f32_to_bf16(src[i]) : l3d_f32_to_f16(src[i]);
        dst[2 * i] = (uint8_t)h;
        dst[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

l3d_status l3d_st_read_f32(l3d_ctx_t *ctx, const l3d_st_file_t *f, const char *name,
                           const int64_t *shape, int ndim, float *dst) {
    if (!f || !name || (ndim && !shape) || ndim < 0)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_st_read_f32: bad argument");
    char qn[160], s1[256], s2[256];
    const l3d_st_tensor_t *t = l3d_st_find(f, name);
    if (!t)
        return l3d_error(ctx, L3D_ERR_NOT_FOUND, "%s: no tensor '%s'", f->origin,
                         clean(name, qn, sizeof(qn)));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same)
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s",
                         f->origin, clean(name, qn, sizeof(qn)),
                         fmt_shape(t->shape, t->ndim, s1, sizeof(s1)),
                         fmt_shape(shape, ndim > L3D_ST_MAX_DIMS ? L3D_ST_MAX_DIMS : ndim, s2,
                                   sizeof(s2)));
    size_t count = (t->end - t->begin) / st_dtypes[t->dtype].size;
    if (count && !dst)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_st_read_f32: NULL destination");
    if (!l3d_st_dtype_is_float(t->dtype))
        return l3d_error(ctx, L3D_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a float",
                         f->origin, clean(name, qn, sizeof(qn)), st_dtypes[t->dtype].name);
    l3d_st_to_f32(t->dtype, t->data, count, dst);
    return L3D_OK;
}

// ---- writing -----------------------------------------------------------------------------

// The header in the reference writer's layout: __metadata__ first, then the tensors in
// data order, compact JSON, keys dtype/shape/data_offsets. *bytes_p gets each tensor's size.
static l3d_status build_header(l3d_ctx_t *ctx, const char *path, const l3d_st_entry_t *entries,
                               size_t n, const char *const *meta_keys,
                               const char *const *meta_vals, size_t n_meta, size_t *bytes,
                               char **text_p) {
    l3d_status st = L3D_OK;
    char qn[160];
    json_t *root = json_object();
    if (!root) return l3d_error(ctx, L3D_ERR_NOMEM, "%s: out of memory", path);
    if (n_meta) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m)) {
            st = l3d_error(ctx, L3D_ERR_NOMEM, "%s: out of memory", path);
            goto out;
        }
        for (size_t i = 0; i < n_meta; i++) {
            if (!meta_keys || !meta_vals || !meta_keys[i] || !meta_vals[i]) {
                st = l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: metadata %zu is NULL", path, i);
                goto out;
            }
            if (json_object_get(m, meta_keys[i])) {
                st = l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: metadata key '%s' given twice",
                               path, clean(meta_keys[i], qn, sizeof(qn)));
                goto out;
            }
            if (json_object_set_new(m, meta_keys[i], json_string(meta_vals[i]))) {
                st = l3d_error(ctx, L3D_ERR_INVALID_ARG,
                               "%s: metadata '%s' is not valid UTF-8", path,
                               clean(meta_keys[i], qn, sizeof(qn)));
                goto out;
            }
        }
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const l3d_st_entry_t *e = &entries[i];
        if (!e->name || e->ndim < 0 || e->ndim > L3D_ST_MAX_DIMS) {
            st = l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: entry %zu has no name or a bad ndim",
                           path, i);
            goto out;
        }
        clean(e->name, qn, sizeof(qn));
        if (strcmp(e->name, "__metadata__") == 0 || json_object_get(root, e->name)) {
            st = l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: tensor name '%s' is reserved or given "
                           "twice", path, qn);
            goto out;
        }
        if (e->dtype != L3D_ST_F32 && e->dtype != L3D_ST_BF16 && e->dtype != L3D_ST_F16) {
            st = l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: tensor '%s': llama3d writes F32, BF16 "
                           "or F16", path, qn);
            goto out;
        }
        uint64_t count = 1, esize = st_dtypes[e->dtype].size;
        json_t *shape = json_array();
        json_t *info = json_object();
        json_object_set_new(info, "dtype", json_string(st_dtypes[e->dtype].name));
        json_object_set_new(info, "shape", shape);
        if (json_object_set_new(root, e->name, info)) {
            st = l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: tensor name '%s' is not valid UTF-8",
                           path, qn);
            goto out;
        }
        for (int d = 0; d < e->ndim; d++) {
            int64_t v = e->shape[d];
            if (v < 0 || (v && count > (UINT64_MAX / esize) / (uint64_t)v)) {
                st = l3d_error(ctx, L3D_ERR_INVALID_ARG,
                               "%s: tensor '%s' dimension %d (%" PRId64 ") is negative or "
                               "overflows", path, qn, d, v);
                goto out;
            }
            count *= (uint64_t)v;
            json_array_append_new(shape, json_integer(v));
        }
        bytes[i] = (size_t)(count * esize);
        if (bytes[i] && !e->data) {
            st = l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: tensor '%s' has no data", path, qn);
            goto out;
        }
        if (off + bytes[i] > (uint64_t)INT64_MAX) {
            st = l3d_error(ctx, L3D_ERR_INVALID_ARG, "%s: tensors too large", path);
            goto out;
        }
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + bytes[i])));
        json_object_set_new(info, "data_offsets", offs);
        off += bytes[i];
    }
    *text_p = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!*text_p) st = l3d_error(ctx, L3D_ERR_NOMEM, "%s: cannot build the header", path);
out:
    json_decref(root);
    return st;
}

#define ST_WRITE_SLICE ((size_t)64 << 20)

l3d_status l3d_st_write(l3d_ctx_t *ctx, const char *path, const l3d_st_entry_t *entries, size_t n,
                        const char *const *meta_keys, const char *const *meta_vals,
                        size_t n_meta) {
    if (!ctx || !path || (n && !entries))
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_st_write: NULL argument");
    l3d_status st = L3D_OK;
    char *text = NULL, *hdr = NULL, *conv = NULL;
    size_t hlen = 0;
    size_t *bytes = l3d_malloc(ctx, (n + 1) * sizeof(*bytes), "other");
    l3d_iovec_t *iov = l3d_malloc(ctx, (n + 2) * sizeof(*iov), "other");
    if (!bytes || !iov) {
        st = L3D_ERR_NOMEM;
        goto out;
    }
    L3D_CHECK_GOTO(ctx, build_header(ctx, path, entries, n, meta_keys, meta_vals, n_meta, bytes,
                                     &text),
                   st, out);
    size_t tlen = strlen(text);
    hlen = (tlen + 7) / 8 * 8;  // the reference pads with spaces to align the data to 8
    if (hlen > ST_MAX_HEADER) {
        st = l3d_error(ctx, L3D_ERR_INVALID_ARG,
                       "%s: the header would be %zu bytes, over the limit of %u", path, hlen,
                       ST_MAX_HEADER);
        goto out;
    }
    hdr = l3d_malloc(ctx, hlen, "other");
    if (!hdr) {
        st = L3D_ERR_NOMEM;
        goto out;
    }
    memcpy(hdr, text, tlen);
    memset(hdr + tlen, ' ', hlen - tlen);
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    iov[0] = (l3d_iovec_t){lenbuf, 8};
    iov[1] = (l3d_iovec_t){hdr, hlen};
    for (size_t i = 0; i < n; i++) iov[2 + i] = (l3d_iovec_t){entries[i].data, bytes[i]};
    // Written piece by piece (in slices, so one 4 GB embedding still moves the progress line)
    // to a temporary renamed into place once whole. 16-bit tensors are converted a slice at a
    // time into `conv`.
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < n + 2; i++) total += iov[i].len;
    int narrow = 0;
    for (size_t i = 0; i < n; i++) narrow |= entries[i].dtype != L3D_ST_F32;
    if (narrow && !(conv = l3d_malloc(ctx, ST_WRITE_SLICE, "other"))) {
        st = L3D_ERR_NOMEM;
        goto out;
    }
    l3d_file_out_t *out = NULL;
    int rc = l3d_file_out_open(path, &out);
    l3d_progress_t pr;
    l3d_progress_begin(ctx, &pr, total, "saving %s", path);
    for (size_t i = 0; rc == 0 && i < n + 2; i++)
        for (size_t o = 0; rc == 0 && o < iov[i].len; o += ST_WRITE_SLICE) {
            size_t len = iov[i].len - o < ST_WRITE_SLICE ? iov[i].len - o : ST_WRITE_SLICE;
            const char *from = (const char *)iov[i].data + o;
            if (i >= 2 && entries[i - 2].dtype != L3D_ST_F32) {  // o, len: 2 bytes per value
                l3d_st_from_f32(entries[i - 2].dtype, entries[i - 2].data + o / 2, len / 2, conv);
                from = conv;
            }
            rc = l3d_file_out_write(out, from, len);
            done += len;
            l3d_progress_update(&pr, done);
        }
    if (out) {
        if (rc == 0) rc = l3d_file_out_commit(out);
        else l3d_file_out_abort(out);
    }
    l3d_progress_end(&pr);
    if (rc != 0)
        st = l3d_error(ctx, L3D_ERR_IO, "%s: cannot write: %s", path, strerror(-rc));
out:
    free(text);  // json_dumps allocates with jansson's allocator: malloc by default
    l3d_free(ctx, conv, ST_WRITE_SLICE, "other");
    l3d_free(ctx, hdr, hlen, "other");
    l3d_free(ctx, iov, (n + 2) * sizeof(*iov), "other");
    l3d_free(ctx, bytes, (n + 1) * sizeof(*bytes), "other");
    return st;
}
