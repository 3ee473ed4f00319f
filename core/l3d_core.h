// The root of core/ (docs/architecture.md): the context, settings, progress reports, input
// (core/input.h), status strings and the device registry. May use platform/, the device and transport vtables and
// include/llama3d/; every folder of core/ uses it.
//
// Internal helpers every layer above platform/ uses: error propagation, logging, allocation.
// defines: L3D_CHECK, L3D_CHECK_GOTO, l3d_log, l3d_error, l3d_malloc, l3d_free, l3d_settings_t
//
// Deliberate deviation from STYLE.md point 10: the check macros take the context explicitly,
// because there is no global logger to write the "-> file:line" trace to.
#ifndef L3D_CORE_H
#define L3D_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "llama3d/ctx.h"
#include "llama3d/status.h"

#if defined(__GNUC__)
#define L3D_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define L3D_PRINTF(a, b)
#endif

// Settings read once from the environment into the context (one table: core/settings.c).
typedef struct l3d_settings {
    int log_level;           // L3D_LOG
    uint32_t log_subsys;     // L3D_LOG_SUBSYS
    char log_file[256];      // L3D_LOG_FILE ("%r" -> rank)
    int num_threads;         // L3D_NUM_THREADS (0 = number of cores)
    double comm_timeout_s;   // L3D_COMM_TIMEOUT
    char algo[256];          // L3D_ALGO
    char transport[32];      // L3D_TRANSPORT (l3d_comm_create_env's default)
    double comm_max_msg;     // L3D_COMM_MAX_MSG (bytes; 0 = the transport's limit)
    int comm_max_inflight;   // L3D_COMM_MAX_INFLIGHT (0 = the transport's limit)
    int comm_shm;            // L3D_COMM_SHM (1: small collectives through shared memory)
    int local_device_buffers;  // L3D_LOCAL_DEVICE_BUFFERS (1: the local transport takes them)
    char device[32];         // L3D_DEVICE
    char cache_dir[512];     // L3D_CACHE_DIR, else $XDG_CACHE_HOME/llama3d, ~/.cache/llama3d
    uint64_t mem_limit;      // L3D_MEM_LIMIT (bytes; 0 = none)
    double progress_after_s; // L3D_PROGRESS_AFTER (a front end's delay before drawing progress)
    uint64_t stage_chunk;    // L3D_STAGE_CHUNK (bytes; 0 = staged collectives are not chunked)
    uint64_t device_memory;  // L3D_DEVICE_MEMORY (bytes the test devices report; 0 = the machine's)
    int cpu_bf16;            // L3D_CPU_BF16: -1 auto, 0 off, 1 avx512, 2 amx (cpu_gemm_bf16.c)
} l3d_settings_t;

// The rows of the settings table, for `l3d --help-env`.
typedef struct l3d_setting_row {
    const char *name;
    const char *default_value;
    const char *help;
} l3d_setting_row_t;
// Returns the table and its length.
const l3d_setting_row_t *l3d_settings_table(size_t *n_p);
void l3d_settings_default(l3d_settings_t *s);
// Parses the environment into `s`; an invalid value is an error naming the variable.
l3d_status l3d_settings_from_env(l3d_settings_t *s, char *err, size_t errlen);

const l3d_settings_t *l3d_ctx_settings(const l3d_ctx_t *ctx);
// The rank shown in log lines and substituted for %r in L3D_LOG_FILE (-1: none).
void l3d_ctx_set_rank(l3d_ctx_t *ctx, int rank);

// Logging. Lines are lowercase, no '=' signs, and name peers and errno text where relevant.
void l3d_log(l3d_ctx_t *ctx, l3d_log_level lvl, uint32_t subsys, const char *fmt, ...)
    L3D_PRINTF(4, 5);
int l3d_log_enabled(const l3d_ctx_t *ctx, l3d_log_level lvl, uint32_t subsys);

// Records the detail of an error on the context (retrievable with l3d_ctx_last_error) and
// returns `st` so callers can write `return l3d_error(ctx, L3D_ERR_CONFIG, "...")`.
l3d_status l3d_error(l3d_ctx_t *ctx, l3d_status st, const char *fmt, ...) L3D_PRINTF(3, 4);

// Propagates an error, leaving a "-> file:line" trace at debug level.
void l3d_check_trace(l3d_ctx_t *ctx, l3d_status st, const char *file, int line);
#define L3D_CHECK(ctx, call)                                       \
    do {                                                           \
        l3d_status l3d_st_ = (call);                               \
        if (l3d_st_ < 0) {                                         \
            l3d_check_trace((ctx), l3d_st_, __FILE__, __LINE__);   \
            return l3d_st_;                                        \
        }                                                          \
    } while (0)
#define L3D_CHECK_GOTO(ctx, call, st, label)                       \
    do {                                                           \
        (st) = (call);                                             \
        if ((st) < 0) {                                            \
            l3d_check_trace((ctx), (st), __FILE__, __LINE__);      \
            goto label;                                            \
        }                                                          \
    } while (0)

// Allocation through the context's allocator, accounted by tag (a static string).
// l3d_malloc/l3d_calloc return NULL on failure and record an L3D_ERR_NOMEM detail.
#define L3D_ALIGN 64
void *l3d_malloc(l3d_ctx_t *ctx, size_t size, const char *tag);
void *l3d_calloc(l3d_ctx_t *ctx, size_t n, size_t size, const char *tag);
void l3d_free(l3d_ctx_t *ctx, void *ptr, size_t size, const char *tag);
// Memory a device allocates itself (a GPU's): counted by tag as l3d_malloc counts, so the
// accounting and the memory report see it; sign +1 when allocated, -1 when freed.
void l3d_mem_account(l3d_ctx_t *ctx, const char *tag, size_t bytes, int sign);
char *l3d_strdup(l3d_ctx_t *ctx, const char *s);  // tag "other"; free with l3d_strfree
void l3d_strfree(l3d_ctx_t *ctx, char *s);

// Progress of one long operation, reported through the ctx's progress callback (ctx.h) at
// most every L3D_PROGRESS_INTERVAL_S: begin, any number of updates, then end exactly once.
// Without a callback every call is a few instructions. The struct lives on the caller's stack.
typedef struct l3d_progress {
    l3d_progress_fn fn;
    void *user;
    char what[256];
    uint64_t done, total;
    double last_t;  // when the callback was last called
} l3d_progress_t;
void l3d_ctx_progress_fn(const l3d_ctx_t *ctx, l3d_progress_fn *fn_p, void **user_p);
// `what` is printf-formatted ("loading %s").
void l3d_progress_begin(l3d_ctx_t *ctx, l3d_progress_t *p, uint64_t total, const char *fmt, ...)
    L3D_PRINTF(4, 5);
void l3d_progress_update(l3d_progress_t *p, uint64_t done);
// The same with the clock given (tests; `now` in seconds, non-decreasing).
void l3d_progress_update_at(l3d_progress_t *p, uint64_t done, double now);
// Ends the operation: one last call with the done count so far (set it to total first when
// the operation completed).
void l3d_progress_end(l3d_progress_t *p);

#define L3D_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define L3D_MIN(a, b) ((a) < (b) ? (a) : (b))
#define L3D_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
