// The context: allocator with per-tag accounting, logging, settings and the last error.
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/l3d_core.h"

#define CTX_MAX_TAGS 16

struct l3d_ctx {
    l3d_allocator_t alloc;
    int have_alloc;
    l3d_log_fn log_fn;
    void *log_user;
    l3d_progress_fn progress_fn;
    void *progress_user;
    FILE *log_file;
    int log_file_failed;  // L3D_LOG_FILE could not be opened or written: stderr from then on
    int rank;
    l3d_settings_t settings;
    pthread_mutex_t mu;  // guards last_error, log output and adding an accounting tag
    // Accounting is lock-free: thread ranks sharing a context allocate on every collective
    // call, and a mutex there costs more than the collective (futex sleeps between the ranks).
    // A tag slot, once filled, keeps its pointer; the counters are atomic.
    struct {
        _Atomic(const char *) tag;
        atomic_size_t bytes;
    } tags[CTX_MAX_TAGS];
    atomic_size_t in_use, peak;
    char last_error[1024];
};

void l3d_ctx_params_default(l3d_ctx_params_t *p) {
    memset(p, 0, sizeof(*p));
    p->read_env = 1;
}

static void *default_alloc(size_t size, size_t align, const char *tag, void *user) {
    void *p = NULL;
    if (size == 0) size = 1;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size)) return NULL;
    return p;
}
static void default_free(void *ptr, size_t size, void *user) { free(ptr); }

l3d_status l3d_ctx_create(const l3d_ctx_params_t *params, l3d_ctx_t **ctx_p) {
    l3d_ctx_params_t defaults;
    if (!ctx_p) return L3D_ERR_INVALID_ARG;
    if (!params) {
        l3d_ctx_params_default(&defaults);
        params = &defaults;
    }
    l3d_allocator_t a = {default_alloc, default_free, NULL};
    if (params->allocator) a = *params->allocator;
    if (!a.alloc || !a.free) return L3D_ERR_INVALID_ARG;
    l3d_ctx_t *ctx = a.alloc(sizeof(*ctx), 64, "other", a.user);
    if (!ctx) return L3D_ERR_NOMEM;
    memset(ctx, 0, sizeof(*ctx));
    ctx->alloc = a;
    ctx->log_fn = params->log_fn;
    ctx->log_user = params->log_user;
    ctx->progress_fn = params->progress_fn;
    ctx->progress_user = params->progress_user;
    ctx->rank = -1;
    pthread_mutex_init(&ctx->mu, NULL);
    l3d_settings_default(&ctx->settings);
    if (params->read_env) {
        char err[512];
        l3d_status st = l3d_settings_from_env(&ctx->settings, err, sizeof(err));
        if (st < 0) {
            // Nowhere to record it but stderr: the context does not exist for the caller.
            fprintf(stderr, "llama3d: %s\n", err);
            pthread_mutex_destroy(&ctx->mu);
            a.free(ctx, sizeof(*ctx), a.user);
            return st;
        }
    }
    *ctx_p = ctx;
    return L3D_OK;
}

void l3d_ctx_destroy(l3d_ctx_t *ctx) {
    if (!ctx) return;
    if (ctx->log_file) fclose(ctx->log_file);
    pthread_mutex_destroy(&ctx->mu);
    l3d_allocator_t a = ctx->alloc;
    a.free(ctx, sizeof(*ctx), a.user);
}

const char *l3d_ctx_last_error(const l3d_ctx_t *ctx) { return ctx ? ctx->last_error : ""; }
const l3d_settings_t *l3d_ctx_settings(const l3d_ctx_t *ctx) { return &ctx->settings; }

void l3d_ctx_progress_fn(const l3d_ctx_t *ctx, l3d_progress_fn *fn_p, void **user_p) {
    *fn_p = ctx ? ctx->progress_fn : NULL;
    *user_p = ctx ? ctx->progress_user : NULL;
}

void l3d_ctx_set_rank(l3d_ctx_t *ctx, int rank) {
    pthread_mutex_lock(&ctx->mu);
    ctx->rank = rank;
    if (ctx->log_file) {
        fclose(ctx->log_file);
        ctx->log_file = NULL;
    }
    ctx->log_file_failed = 0;  // the rank's own file is tried afresh
    pthread_mutex_unlock(&ctx->mu);
}

// ---- accounting --------------------------------------------------------------------------
// The slot of `tag` (the same literal is the same pointer: compared first), -1 when the table
// is full. A new tag takes the first empty slot under the mutex.
static int tag_slot(l3d_ctx_t *ctx, const char *tag) {
    int i = 0;
    for (; i < CTX_MAX_TAGS; i++) {
        const char *t = atomic_load_explicit(&ctx->tags[i].tag, memory_order_acquire);
        if (!t) break;
        if (t == tag || !strcmp(t, tag)) return i;
    }
    if (i == CTX_MAX_TAGS) return -1;
    pthread_mutex_lock(&ctx->mu);
    for (i = 0; i < CTX_MAX_TAGS; i++) {  // again: another thread may have added it
        const char *t = atomic_load_explicit(&ctx->tags[i].tag, memory_order_relaxed);
        if (!t) {
            atomic_store_explicit(&ctx->tags[i].tag, tag, memory_order_release);
            break;
        }
        if (t == tag || !strcmp(t, tag)) break;
    }
    pthread_mutex_unlock(&ctx->mu);
    return i < CTX_MAX_TAGS ? i : -1;
}

static void account(l3d_ctx_t *ctx, const char *tag, size_t bytes, int sign) {
    int i = tag_slot(ctx, tag);
    if (sign > 0) {
        if (i >= 0) atomic_fetch_add_explicit(&ctx->tags[i].bytes, bytes, memory_order_relaxed);
        size_t now = atomic_fetch_add_explicit(&ctx->in_use, bytes, memory_order_relaxed) + bytes;
        size_t peak = atomic_load_explicit(&ctx->peak, memory_order_relaxed);
        while (now > peak && !atomic_compare_exchange_weak_explicit(
                                 &ctx->peak, &peak, now, memory_order_relaxed, memory_order_relaxed))
            ;
    } else {
        if (i >= 0) atomic_fetch_sub_explicit(&ctx->tags[i].bytes, bytes, memory_order_relaxed);
        atomic_fetch_sub_explicit(&ctx->in_use, bytes, memory_order_relaxed);
    }
}

void *l3d_malloc(l3d_ctx_t *ctx, size_t size, const char *tag) {
    if (!tag) tag = "other";
    void *p = ctx->alloc.alloc(size, L3D_ALIGN, tag, ctx->alloc.user);
    if (!p) {
        l3d_error(ctx, L3D_ERR_NOMEM, "allocating %zu bytes for %s failed", size, tag);
        return NULL;
    }
    account(ctx, tag, size, +1);
    return p;
}

void *l3d_calloc(l3d_ctx_t *ctx, size_t n, size_t size, const char *tag) {
    if (size && n > SIZE_MAX / size) {
        l3d_error(ctx, L3D_ERR_NOMEM, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    void *p = l3d_malloc(ctx, n * size, tag);
    if (p) memset(p, 0, n * size);
    return p;
}

void l3d_free(l3d_ctx_t *ctx, void *ptr, size_t size, const char *tag) {
    if (!ptr) return;
    account(ctx, tag ? tag : "other", size, -1);
    ctx->alloc.free(ptr, size, ctx->alloc.user);
}

char *l3d_strdup(l3d_ctx_t *ctx, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = l3d_malloc(ctx, n, "other");
    if (d) memcpy(d, s, n);
    return d;
}
void l3d_strfree(l3d_ctx_t *ctx, char *s) {
    if (s) l3d_free(ctx, s, strlen(s) + 1, "other");
}

void l3d_mem_account(l3d_ctx_t *ctx, const char *tag, size_t bytes, int sign) {
    account(ctx, tag ? tag : "other", bytes, sign);
}

size_t l3d_ctx_mem_in_use(const l3d_ctx_t *ctx, const char *tag) {
    l3d_ctx_t *c = (l3d_ctx_t *)ctx;  // (atomic loads take non-const pointers in C11)
    if (!tag) return atomic_load(&c->in_use);
    for (int i = 0; i < CTX_MAX_TAGS; i++) {
        const char *t = atomic_load(&c->tags[i].tag);
        if (!t) break;
        if (!strcmp(t, tag)) return atomic_load(&c->tags[i].bytes);
    }
    return 0;
}
size_t l3d_ctx_mem_peak(const l3d_ctx_t *ctx) {
    return atomic_load(&((l3d_ctx_t *)ctx)->peak);
}

// ---- logging and errors ------------------------------------------------------------------
static const char *level_names[] = {"none", "error", "warn", "info", "debug", "trace"};

int l3d_log_enabled(const l3d_ctx_t *ctx, l3d_log_level lvl, uint32_t subsys) {
    return ctx && (int)lvl <= ctx->settings.log_level && (ctx->settings.log_subsys & subsys);
}

static FILE *log_stream(l3d_ctx_t *ctx) {
    if (!ctx->settings.log_file[0] || ctx->log_file_failed) return stderr;
    if (!ctx->log_file) {
        char path[300];
        const char *f = ctx->settings.log_file;
        size_t o = 0;
        for (; *f && o + 12 < sizeof(path); f++) {
            if (f[0] == '%' && f[1] == 'r') {
                o += (size_t)snprintf(path + o, sizeof(path) - o, "%d", ctx->rank < 0 ? 0 : ctx->rank);
                f++;
            } else {
                path[o++] = *f;
            }
        }
        path[o] = 0;
        ctx->log_file = fopen(path, "a");
        if (!ctx->log_file) {
            // Said once, where it can be seen: logs silently lost are no logs.
            fprintf(stderr, "llama3d: cannot open the log file %s (L3D_LOG_FILE): %s; logging "
                    "to stderr\n", path, strerror(errno));
            ctx->log_file_failed = 1;
            return stderr;
        }
    }
    return ctx->log_file;
}

static void log_emit(l3d_ctx_t *ctx, l3d_log_level lvl, uint32_t subsys, const char *msg) {
    if (ctx->log_fn) {
        ctx->log_fn(lvl, subsys, msg, ctx->log_user);
        return;
    }
    pthread_mutex_lock(&ctx->mu);
    FILE *f = log_stream(ctx);
    for (;;) {
        if (ctx->rank >= 0) fprintf(f, "l3d[%d] %s: %s\n", ctx->rank, level_names[lvl], msg);
        else fprintf(f, "l3d %s: %s\n", level_names[lvl], msg);
        if (fflush(f) == 0 && !ferror(f)) break;
        if (f == stderr) break;  // nowhere left to say it
        // The log file failed (a full disk): say so once, and log to stderr from now on,
        // starting with this message.
        int e = errno;
        fprintf(stderr, "llama3d: writing the log file (L3D_LOG_FILE): %s; logging to stderr "
                "from now on\n", strerror(e));
        fclose(f);
        ctx->log_file = NULL;
        ctx->log_file_failed = 1;
        f = stderr;
    }
    pthread_mutex_unlock(&ctx->mu);
}

void l3d_log(l3d_ctx_t *ctx, l3d_log_level lvl, uint32_t subsys, const char *fmt, ...) {
    if (!l3d_log_enabled(ctx, lvl, subsys)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_emit(ctx, lvl, subsys, msg);
}

l3d_status l3d_error(l3d_ctx_t *ctx, l3d_status st, const char *fmt, ...) {
    if (!ctx) return st;
    char msg[sizeof(ctx->last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&ctx->mu);
    memcpy(ctx->last_error, msg, sizeof(msg));
    pthread_mutex_unlock(&ctx->mu);
    if (l3d_log_enabled(ctx, L3D_LOG_DEBUG, L3D_SUBSYS_ALL))
        l3d_log(ctx, L3D_LOG_DEBUG, L3D_SUBSYS_ALL, "error %d: %s", (int)st, msg);
    return st;
}

void l3d_check_trace(l3d_ctx_t *ctx, l3d_status st, const char *file, int line) {
    l3d_log(ctx, L3D_LOG_DEBUG, L3D_SUBSYS_ALL, "-> %s:%d (%s)", file, line, l3d_strerror(st));
}
