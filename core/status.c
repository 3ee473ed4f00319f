// l3d_strerror: what each status means and what to do about it.
#include "llama3d/status.h"

const char *l3d_strerror(l3d_status st) {
    switch (st) {
    case L3D_OK: return "success";
    case L3D_INPROGRESS: return "operation in progress";
    case L3D_ERR_INVALID_ARG: return "invalid argument (a caller bug; run with L3D_LOG=debug)";
    case L3D_ERR_NOMEM: return "out of memory (reduce batch, sequence length or model size)";
    case L3D_ERR_SYSTEM: return "system call failed (see the detail for errno)";
    case L3D_ERR_INTERNAL: return "internal error in llama3d (please report with L3D_LOG=debug)";
    case L3D_ERR_UNSUPPORTED: return "not supported by this build or device";
    case L3D_ERR_IO: return "file read or write failed";
    case L3D_ERR_FORMAT: return "malformed input file";
    case L3D_ERR_CONFIG: return "invalid configuration or command-line flag";
    case L3D_ERR_PEER_FAILED: return "a peer rank failed";
    case L3D_ERR_TIMEOUT: return "timed out (raise L3D_COMM_TIMEOUT if the job is just slow)";
    case L3D_ERR_NOT_FOUND: return "not found";
    case L3D_ERR_DIVERGED:
        return "training diverged (lower the learning rate, enable gradient_clipping, or use bf16)";
    case L3D_ERR_BUSY:
        return "busy: the queue is full (try again later)";
    case L3D_ERR_CANCELLED:
        return "cancelled (or shutting down)";
    }
    return "unknown status";
}
