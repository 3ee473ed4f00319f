// The MFU roof of l3d train: train.peak_flops when given, else the device's own figure for the
// training dtype where it has a table (a GPU), else the sgemm peak of this machine from a
// small cache, measured (l3d_gemm_peak_measure) and stored on a miss. Measuring well
// takes about half a second and is disturbed by whatever else runs, so a machine measures
// once per key and every later run reuses the figure. The cache is a convenience: a missing,
// unreadable, corrupt or unwritable cache is a warning, never a failure.
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/train.h"
#include "platform/platform.h"

// $XDG_CACHE_HOME/llama3d (an absolute XDG_CACHE_HOME only, as the XDG spec says), else
// ~/.cache/llama3d; "" when neither is known.
static void cache_path(char *out, size_t cap) {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    out[0] = 0;
    if (x && x[0] == '/') snprintf(out, cap, "%s/llama3d/gemm_peak.json", x);
    else if (home && home[0] == '/') snprintf(out, cap, "%s/.cache/llama3d/gemm_peak.json", home);
}

// What decides the figure: the CPU model, the cores, the threads one rank uses, the OpenBLAS
// kernels (OPENBLAS_CORETYPE forces a kernel set other than the CPU's own) and the device.
static void cache_key(const char *device, int threads, char *out, size_t cap) {
    char model[160] = "unknown", *buf = NULL;
    size_t len = 0;
    if (l3d_file_read_all("/proc/cpuinfo", 1 << 22, &buf, &len) == 0) {
        // x86: "model name"; arm64: "CPU implementer"/"CPU part" name the core.
        const char *keys[] = {"model name", "CPU part"};
        for (int k = 0; k < 2 && !strcmp(model, "unknown"); k++) {
            char *p = strstr(buf, keys[k]);
            char *colon = p ? strchr(p, ':') : NULL;
            if (!colon) continue;
            colon++;
            while (*colon == ' ' || *colon == '\t') colon++;
            size_t n = strcspn(colon, "\n");
            if (n >= sizeof(model)) n = sizeof(model) - 1;
            memcpy(model, colon, n);
            model[n] = 0;
        }
        free(buf);
    }
    const char *core = getenv("OPENBLAS_CORETYPE");
    snprintf(out, cap, "device=%s; cpu=%s; cores=%d; threads=%d; openblas=%s", device, model,
             l3d_num_cores(), threads, core && core[0] ? core : "auto");
}

static void warn_cache(const char *path, const char *why) {
    fprintf(stderr, "l3d train: warning: GEMM peak cache %s: %s; ignoring it\n", path, why);
}

// The cached figure for key, or 0. *root_p: the file's entries to keep when storing (a fresh
// object when the file is missing or corrupt).
static double cache_load(const char *path, const char *key, json_t **root_p) {
    *root_p = NULL;
    if (!path[0] || l3d_path_exists(path) <= 0) return 0.0;
    char *buf = NULL;
    size_t len = 0;
    int e = l3d_file_read_all(path, 1 << 20, &buf, &len);
    if (e) {
        warn_cache(path, strerror(-e));
        return 0.0;
    }
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, 0, &jerr);
    free(buf);
    json_t *entries = json_object_get(root, "entries");
    if (!json_is_object(root) || json_integer_value(json_object_get(root, "version")) != 1 ||
        !json_is_object(entries)) {
        warn_cache(path, root ? "not a version 1 cache" : jerr.text);
        json_decref(root);
        return 0.0;
    }
    *root_p = root;
    json_t *v = json_object_get(json_object_get(entries, key), "peak_flops");
    if (!v) return 0.0;
    double f = json_is_number(v) ? json_number_value(v) : -1.0;
    if (!(f > 0.0 && f < 1e20)) {
        warn_cache(path, "its entry for this machine is not a positive FLOP/s figure");
        return 0.0;
    }
    return f;
}

static void cache_store(const char *path, const char *key, json_t *root, double flops) {
    if (!path[0]) return;
    if (!root) root = json_pack("{s:i, s:{}}", "version", 1, "entries");
    json_t *entries = json_object_get(root, "entries");
    json_object_set_new(entries, key, json_pack("{s:f}", "peak_flops", flops));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    int e = text ? l3d_dir_create(dir) : -ENOMEM;
    if (!e) {
        l3d_iovec_t piece = {text, strlen(text)};
        e = l3d_file_write_atomic(path, &piece, 1);
    }
    if (e) fprintf(stderr, "l3d train: warning: GEMM peak cache %s: not written: %s\n", path,
                   strerror(-e));
    free(text);
}

l3d_status l3d_train_resolve_peak(l3d_ctx_t *ctx, l3d_train_config_t *cfg, int threads,
                                  char *source, size_t cap) {
    if (cfg->peak_flops > 0.0) {
        snprintf(source, cap, "train.peak_flops");
        return L3D_OK;
    }
    // A device that knows its peak (a GPU's table, in the training dtype) is not measured: a
    // GPU's sgemm is not the roof of bf16 training.
    l3d_dtype dt = cfg->bf16 ? L3D_BFLOAT16 : cfg->fp16 ? L3D_FLOAT16 : L3D_FLOAT32;
    double table = 0.0;
    l3d_status st = l3d_device_peak_table(ctx, cfg->device, dt, &table);
    if (st < 0) return st;
    if (table > 0.0) {
        cfg->peak_flops = table;
        snprintf(source, cap, "device %s's %s peak", cfg->device, l3d_dtype_name(dt));
        return L3D_OK;
    }
    char path[1024], key[320];
    cache_path(path, sizeof(path));
    cache_key(cfg->device, threads, key, sizeof(key));
    json_t *root = NULL;
    double f = cache_load(path, key, &root);
    if (f > 0.0) {
        json_decref(root);
        cfg->peak_flops = f;
        snprintf(source, cap, "cached in %s", path);
        return L3D_OK;
    }
    st = l3d_gemm_peak_measure(ctx, cfg->device, threads, &f);
    if (st < 0) {
        json_decref(root);
        return st;
    }
    cfg->peak_flops = f;
    cache_store(path, key, root, f);
    snprintf(source, cap, "measured now%s%s", path[0] ? ", cached in " : "", path);
    return L3D_OK;
}
