// The llama3d context: the one object every other object hangs off.
// defines: l3d_ctx_t, l3d_allocator_t, l3d_log_fn, l3d_log_level, l3d_progress_fn
//
// llama3d keeps no global mutable state: allocation, logging, settings and the last error
// all live here. An embedding application can supply its own allocator and log callback.
#ifndef LLAMA3D_CTX_H
#define LLAMA3D_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "llama3d/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum l3d_log_level {
    L3D_LOG_NONE = 0,
    L3D_LOG_ERROR = 1,
    L3D_LOG_WARN = 2,
    L3D_LOG_INFO = 3,
    L3D_LOG_DEBUG = 4,
    L3D_LOG_TRACE = 5,
} l3d_log_level;

// Subsystems, a bitmask selected with L3D_LOG_SUBSYS=init,comm,... (default: all).
enum {
    L3D_SUBSYS_INIT = 1u << 0,
    L3D_SUBSYS_COMM = 1u << 1,
    L3D_SUBSYS_PP = 1u << 2,
    L3D_SUBSYS_DEV = 1u << 3,
    L3D_SUBSYS_TRAIN = 1u << 4,
    L3D_SUBSYS_CKPT = 1u << 5,
    L3D_SUBSYS_DATA = 1u << 6,
    L3D_SUBSYS_CFG = 1u << 7,
    L3D_SUBSYS_ALL = 0xffffffffu,
};

// Log callback. `msg` is one line without a trailing newline, valid only during the call.
// Called from any thread that logs; the callee serialises if it needs to.
typedef void (*l3d_log_fn)(l3d_log_level level, uint32_t subsys, const char *msg, void *user);

// Progress callback, for work that can take long: initialising a model's weights, loading and
// saving a checkpoint, reading and tokenizing a corpus. `what` names the operation and its
// object ("tokenizing data/big.txt"); done and total count bytes (total 0: not known).
// Each operation makes a first call with done 0, then at most one call every
// L3D_PROGRESS_INTERVAL_S seconds, then exactly one call with `last` nonzero (done == total
// when it completed, less when it failed part way). The library draws nothing itself: the
// callee decides what to show (l3d's renderer draws on a terminal only, after 1 s).
// Called from the thread doing the work; strings are valid only during the call.
#define L3D_PROGRESS_INTERVAL_S 0.1
typedef void (*l3d_progress_fn)(const char *what, uint64_t done, uint64_t total, int last,
                                void *user);

// Allocator. `alloc` returns memory aligned to `align` (a power of two, >= sizeof(void*)) or
// NULL; `tag` names the category ("params", "grads", "optim", "acts", ...) for accounting and
// is a static string. `free` gets the pointer and the size that was asked for. NULL `free`
// accepts NULL pointers.
typedef struct l3d_allocator {
    void *(*alloc)(size_t size, size_t align, const char *tag, void *user);
    void (*free)(void *ptr, size_t size, void *user);
    void *user;
} l3d_allocator_t;

typedef struct l3d_ctx_params {
    const l3d_allocator_t *allocator;  // NULL: aligned malloc/free
    l3d_log_fn log_fn;                 // NULL: write to stderr (or L3D_LOG_FILE)
    void *log_user;
    int read_env;                      // nonzero: read L3D_* environment settings once
    l3d_progress_fn progress_fn;       // NULL: no progress reports
    void *progress_user;
} l3d_ctx_params_t;

typedef struct l3d_ctx l3d_ctx_t;

// Fills `p` with defaults (malloc, stderr logging, read the environment).
void l3d_ctx_params_default(l3d_ctx_params_t *p);

// Creates a context. `params` may be NULL for the defaults. On failure *ctx_p is untouched.
l3d_status l3d_ctx_create(const l3d_ctx_params_t *params, l3d_ctx_t **ctx_p);
void l3d_ctx_destroy(l3d_ctx_t *ctx);

// The one-line detail of the most recent error recorded on this context ("" if none).
// Valid until the next failing call on the context.
const char *l3d_ctx_last_error(const l3d_ctx_t *ctx);

// Bytes currently allocated through the context, total and for one tag (tag NULL = total),
// and the peak of the total.
size_t l3d_ctx_mem_in_use(const l3d_ctx_t *ctx, const char *tag);
size_t l3d_ctx_mem_peak(const l3d_ctx_t *ctx);

#ifdef __cplusplus
}
#endif
#endif
