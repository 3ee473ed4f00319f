// llama3d status codes: one enum for the whole library.
// defines: l3d_status, l3d_strerror
#ifndef LLAMA3D_STATUS_H
#define LLAMA3D_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

// Every fallible call returns an l3d_status. 0 is success, 1 means "still in progress"
// (non-blocking calls), negative values are errors grouped like NCCL's categories.
// The one-line detail of the last error (what, where) is l3d_ctx_last_error(ctx).
typedef enum l3d_status {
    L3D_OK = 0,
    L3D_INPROGRESS = 1,
    L3D_ERR_INVALID_ARG = -1,  // the caller passed something wrong (a bug in the caller)
    L3D_ERR_NOMEM = -2,        // an allocation failed
    L3D_ERR_SYSTEM = -3,       // an OS call failed (errno text in the detail)
    L3D_ERR_INTERNAL = -4,     // a bug in llama3d
    L3D_ERR_UNSUPPORTED = -5,  // asked for something this build or device does not do
    L3D_ERR_IO = -6,           // reading or writing a file failed
    L3D_ERR_FORMAT = -7,       // a file (checkpoint, data, tokenizer) is malformed
    L3D_ERR_CONFIG = -8,       // a config key or CLI flag is wrong
    L3D_ERR_PEER_FAILED = -9,  // a remote rank died or sent garbage
    L3D_ERR_TIMEOUT = -10,     // a wait ran past its deadline
    L3D_ERR_NOT_FOUND = -11,   // a named thing (file, preset, tensor) does not exist
    L3D_ERR_DIVERGED = -12,    // training diverged: the loss or the gradients are not finite
                               // (and fp16 loss scaling cannot go lower)
    L3D_ERR_BUSY = -13,        // a bounded queue is full: try again later
    L3D_ERR_CANCELLED = -14,   // the work was cancelled, or its owner is shutting down
} l3d_status;

// Static text for a status, saying what to do next. Never NULL.
const char *l3d_strerror(l3d_status st);

#ifdef __cplusplus
}
#endif
#endif
