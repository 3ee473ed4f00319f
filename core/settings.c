// The one settings table: every L3D_* environment variable is a row here, read once into the
// context, and listed by `l3d --help-env`.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/l3d_core.h"
#include "devices/device.h"
#include "transports/transport.h"

static const l3d_setting_row_t settings_rows[] = {
    {"L3D_LOG", "warn", "log level: none, error, warn, info, debug, trace"},
    {"L3D_LOG_SUBSYS", "all",
     "comma list of subsystems to log: init,comm,pp,dev,train,ckpt,data,cfg (^ negates)"},
    {"L3D_LOG_FILE", "", "write logs to this file instead of stderr; %r becomes the rank"},
    {"L3D_NUM_THREADS", "0", "CPU device threads per rank (0 = number of cores)"},
    {"L3D_COMM_TIMEOUT", "300", "seconds any communication wait may take before failing"},
    {"L3D_ALGO", "",
     "collective algorithm overrides, op:algo[,op:algo] (e.g. allreduce:ring,broadcast:tree; "
     "docs/comm.md lists them)"},
    {"L3D_TRANSPORT", "",
     "transport of multi-process jobs: ucx, ofi or nccl (empty: the first built)"},
    {"L3D_COMM_MAX_MSG", "0",
     "largest message collectives send, in bytes (0 = the transport's limit; for debugging)"},
    {"L3D_COMM_MAX_INFLIGHT", "0",
     "messages in flight per peer and direction (0 = the transport's limit; for debugging)"},
    {"L3D_COMM_SHM", "1",
     "0: small collectives among the processes of one machine go through the transport's "
     "messages, not a shared-memory segment (for comparison and debugging)"},
    {"L3D_DEVICE", "cpu",
     "device to run on when the config does not say: cpu; cpu-opaque and cpu-async (the CPU "
     "behind memory the host cannot read, and with ops that finish at the next wait: they "
     "check that a build keeps device memory behind the device vtable)"},
    {"L3D_CACHE_DIR", "$XDG_CACHE_HOME/llama3d",
     "where token caches of text data sets go when the text's own directory cannot take one "
     "(not writable, full) (default ~/.cache/llama3d)"},
    {"L3D_MEM_LIMIT", "",
     "bytes (suffix K, M, G, T: binary) to treat as the most memory available, when it is less "
     "than the kernel and the cgroup report; runs that would need more are refused up front"},
    {"L3D_DEVICE_MEMORY", "",
     "bytes (suffix K, M, G, T) of device memory cpu-opaque and cpu-async report as their own, "
     "as a GPU's (default: the machine's), so that a run on them is refused up front as on a "
     "GPU of that size"},
    {"L3D_STAGE_CHUNK", "4M",
     "bytes per chunk when an allreduce, reduce or broadcast larger than this is staged "
     "through host memory from a device the host cannot read (suffix K, M, G; 0: whole); the "
     "copy of one chunk overlaps the collective of the previous; the same on every rank"},
    {"L3D_LOCAL_DEVICE_BUFFERS", "0",
     "1: the local transport (ranks as threads) takes device buffers as NCCL takes a GPU's: "
     "collectives and sends on a device the host cannot read get the device's memory, not "
     "host copies, and reach it through the device's entries after the communicator's "
     "stream (it checks the core's path for such transports on cpu-opaque and cpu-async)"},
    {"L3D_PROGRESS_AFTER", "1",
     "seconds an operation (loading, saving, tokenizing) runs before l3d draws its progress "
     "line on a terminal (0: at once)"},
    {"L3D_CPU_BF16", "auto",
     "the CPU device's bfloat16 x bfloat16 products: auto (AMX where the CPU has it, else "
     "off), amx (AMX tiles), avx512 (AVX512-BF16 dot products) or off (widened to float32 for "
     "sgemm); a level the CPU lacks is refused"},
    // Read by the bootstrap at l3d_comm_create_env (core/comm/bootstrap.c), per process:
    {"L3D_JOB_TOKEN", "", "job token every rank must present to the rendezvous store"},
    {"L3D_MASTER_ADDR", "", "rendezvous store address (overrides MASTER_ADDR)"},
    {"L3D_MASTER_PORT", "", "rendezvous store port (overrides MASTER_PORT)"},
    {"L3D_RANK", "", "this process's rank when no launcher convention is set"},
    {"L3D_WORLD_SIZE", "", "the world size when no launcher convention is set"},
};

const l3d_setting_row_t *l3d_settings_table(size_t *n_p) {
    *n_p = L3D_ARRAY_LEN(settings_rows);
    return settings_rows;
}

void l3d_settings_default(l3d_settings_t *s) {
    memset(s, 0, sizeof(*s));
    s->log_level = L3D_LOG_WARN;
    s->log_subsys = L3D_SUBSYS_ALL;
    s->comm_timeout_s = 300.0;
    s->comm_shm = 1;
    s->progress_after_s = 1.0;
    s->stage_chunk = (uint64_t)4 << 20;
    s->cpu_bf16 = -1;
    snprintf(s->device, sizeof(s->device), "cpu");
}

// A byte count: a number, optionally followed by K, M, G or T (binary), at least `min`.
static int parse_bytes(const char *v, double min, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    double b = strtod(v, &end);
    double mul = 1;
    if (end && *end && !end[1]) {
        const char *u = strchr("KMGT", *end == 'k' ? 'K' : *end);
        if (u && *u) {
            for (const char *q = "KMGT"; q <= u; q++) mul *= 1024;
            end++;
        }
    }
    b *= mul;
    if (errno || end == v || *end || !(b >= min && b < 1.8e19) || b != (double)(uint64_t)b)
        return -1;
    *out = (uint64_t)b;
    return 0;
}

static int parse_level(const char *v, int *out) {
    static const char *names[] = {"none", "error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < (int)L3D_ARRAY_LEN(names); i++)
        if (!strcasecmp(v, names[i])) {
            *out = i;
            return 0;
        }
    return -1;
}

static int parse_subsys(const char *v, uint32_t *out) {
    static const struct {
        const char *name;
        uint32_t bit;
    } names[] = {{"init", L3D_SUBSYS_INIT}, {"comm", L3D_SUBSYS_COMM}, {"pp", L3D_SUBSYS_PP},
                 {"dev", L3D_SUBSYS_DEV},   {"train", L3D_SUBSYS_TRAIN}, {"ckpt", L3D_SUBSYS_CKPT},
                 {"data", L3D_SUBSYS_DATA}, {"cfg", L3D_SUBSYS_CFG},   {"all", L3D_SUBSYS_ALL}};
    int negate = v[0] == '^';
    if (negate) v++;
    uint32_t mask = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", v);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        for (; i < L3D_ARRAY_LEN(names); i++)
            if (!strcasecmp(tok, names[i].name)) break;
        if (i == L3D_ARRAY_LEN(names)) return -1;
        mask |= names[i].bit;
    }
    *out = negate ? ~mask : mask;
    return 0;
}

static int parse_num(const char *v, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double d = strtod(v, &end);
    // Written so that NaN fails too (every comparison with it is false).
    if (errno || end == v || *end || !(d >= lo && d <= hi)) return -1;
    *out = d;
    return 0;
}

static const char *transport_name(int i) {
    return l3d_transport_backends[i] ? l3d_transport_backends[i]->name : NULL;
}
static const char *device_name(int i) {
    return l3d_device_backends[i] ? l3d_device_backends[i]->name : NULL;
}

// Whether `v` names one of the built backends name_at(0), name_at(1), ... (NULL-ended); if not,
// err says so naming the variable and the valid values. A name this build lacks would only
// fail later, or (L3D_DEVICE) be ignored, far from the variable that asked for it.
static int built_name(const char *v, const char *var, const char *what,
                      const char *(*name_at)(int), char *err, size_t errlen) {
    char list[128] = "";
    size_t o = 0;
    for (int i = 0; name_at(i); i++) {
        if (!strcmp(name_at(i), v)) return 1;
        o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", i ? ", " : "", name_at(i));
        if (o >= sizeof(list)) o = sizeof(list) - 1;
    }
    snprintf(err, errlen, "%s: '%s' is not a %s of this build (valid: %s)", var, v, what, list);
    return 0;
}

l3d_status l3d_settings_from_env(l3d_settings_t *s, char *err, size_t errlen) {
    const char *v;
    double d;
    if ((v = getenv("L3D_LOG")) && *v && parse_level(v, &s->log_level)) {
        snprintf(err, errlen, "L3D_LOG: '%s' is not one of none,error,warn,info,debug,trace", v);
        return L3D_ERR_CONFIG;
    }
    if ((v = getenv("L3D_LOG_SUBSYS")) && *v && parse_subsys(v, &s->log_subsys)) {
        snprintf(err, errlen, "L3D_LOG_SUBSYS: '%s' names an unknown subsystem", v);
        return L3D_ERR_CONFIG;
    }
    if ((v = getenv("L3D_LOG_FILE"))) snprintf(s->log_file, sizeof(s->log_file), "%s", v);
    if ((v = getenv("L3D_NUM_THREADS")) && *v) {
        if (parse_num(v, 0, 4096, &d) || d != (int)d) {
            snprintf(err, errlen, "L3D_NUM_THREADS: '%s' is not an integer in [0, 4096]", v);
            return L3D_ERR_CONFIG;
        }
        s->num_threads = (int)d;
    }
    if ((v = getenv("L3D_COMM_TIMEOUT")) && *v) {
        if (parse_num(v, 0.001, 1e9, &s->comm_timeout_s)) {
            snprintf(err, errlen, "L3D_COMM_TIMEOUT: '%s' is not a positive number of seconds", v);
            return L3D_ERR_CONFIG;
        }
    }
    if ((v = getenv("L3D_PROGRESS_AFTER")) && *v) {
        if (parse_num(v, 0, 1e9, &s->progress_after_s)) {
            snprintf(err, errlen, "L3D_PROGRESS_AFTER: '%s' is not a number of seconds >= 0", v);
            return L3D_ERR_CONFIG;
        }
    }
    if ((v = getenv("L3D_ALGO"))) snprintf(s->algo, sizeof(s->algo), "%s", v);
    if ((v = getenv("L3D_COMM_MAX_MSG")) && *v) {
        if (parse_num(v, 0, 1e18, &s->comm_max_msg) ||
            s->comm_max_msg != (double)(long long)s->comm_max_msg ||
            (s->comm_max_msg > 0 && s->comm_max_msg < 64)) {
            snprintf(err, errlen, "L3D_COMM_MAX_MSG: '%s' is not 0 or a byte count >= 64", v);
            return L3D_ERR_CONFIG;
        }
    }
    if ((v = getenv("L3D_COMM_MAX_INFLIGHT")) && *v) {
        if (parse_num(v, 0, 1 << 30, &d) || d != (int)d) {
            snprintf(err, errlen, "L3D_COMM_MAX_INFLIGHT: '%s' is not a count >= 0", v);
            return L3D_ERR_CONFIG;
        }
        s->comm_max_inflight = (int)d;
    }
    if ((v = getenv("L3D_LOCAL_DEVICE_BUFFERS")) && *v) {
        if (strcmp(v, "0") && strcmp(v, "1")) {
            snprintf(err, errlen, "L3D_LOCAL_DEVICE_BUFFERS: '%s' is not 0 or 1", v);
            return L3D_ERR_CONFIG;
        }
        s->local_device_buffers = v[0] == '1';
    }
    if ((v = getenv("L3D_COMM_SHM")) && *v) {
        if (strcmp(v, "0") && strcmp(v, "1")) {
            snprintf(err, errlen, "L3D_COMM_SHM: '%s' is not 0 or 1", v);
            return L3D_ERR_CONFIG;
        }
        s->comm_shm = v[0] == '1';
    }
    if ((v = getenv("L3D_TRANSPORT")) && *v) {
        if (!built_name(v, "L3D_TRANSPORT", "transport", transport_name, err, errlen))
            return L3D_ERR_CONFIG;
        snprintf(s->transport, sizeof(s->transport), "%s", v);
    }
    if ((v = getenv("L3D_DEVICE")) && *v) {
        if (!built_name(v, "L3D_DEVICE", "device", device_name, err, errlen))
            return L3D_ERR_CONFIG;
        snprintf(s->device, sizeof(s->device), "%s", v);
    }
    if ((v = getenv("L3D_CACHE_DIR")) && *v) {
        snprintf(s->cache_dir, sizeof(s->cache_dir), "%s", v);
    } else if ((v = getenv("XDG_CACHE_HOME")) && v[0] == '/') {
        snprintf(s->cache_dir, sizeof(s->cache_dir), "%s/llama3d", v);
    } else if ((v = getenv("HOME")) && v[0] == '/') {
        snprintf(s->cache_dir, sizeof(s->cache_dir), "%s/.cache/llama3d", v);
    }
    if ((v = getenv("L3D_MEM_LIMIT")) && *v) {
        if (parse_bytes(v, 1, &s->mem_limit)) {
            snprintf(err, errlen, "L3D_MEM_LIMIT: '%s' is not a byte count (a number, optionally "
                     "followed by K, M, G or T)", v);
            return L3D_ERR_CONFIG;
        }
    }
    if ((v = getenv("L3D_DEVICE_MEMORY")) && *v) {
        if (parse_bytes(v, 1, &s->device_memory)) {
            snprintf(err, errlen, "L3D_DEVICE_MEMORY: '%s' is not a byte count (a number, "
                     "optionally followed by K, M, G or T)", v);
            return L3D_ERR_CONFIG;
        }
    }
    if ((v = getenv("L3D_CPU_BF16")) && *v) {
        static const char *const levels[] = {"off", "avx512", "amx"};
        s->cpu_bf16 = -2;
        if (!strcmp(v, "auto")) s->cpu_bf16 = -1;
        for (int i = 0; i < 3; i++)
            if (!strcmp(v, levels[i])) s->cpu_bf16 = i;
        if (s->cpu_bf16 == -2) {
            snprintf(err, errlen, "L3D_CPU_BF16: '%s' is not auto, amx, avx512 or off", v);
            return L3D_ERR_CONFIG;
        }
    }
    if ((v = getenv("L3D_STAGE_CHUNK")) && *v) {
        if (parse_bytes(v, 0, &s->stage_chunk) || (s->stage_chunk && s->stage_chunk < 256)) {
            snprintf(err, errlen, "L3D_STAGE_CHUNK: '%s' is not 0 or a byte count >= 256 (a "
                     "number, optionally followed by K, M, G or T)", v);
            return L3D_ERR_CONFIG;
        }
    }
    return L3D_OK;
}
