// NCCL transport: lifetime, wiring, communicators, errors and the ops table.
// defines: l3d_nccl_transport_ops, l3d_nccl_fail, l3d_nccl_cuda_fail, l3d_nccl_settle,
//          l3d_nccl_group, l3d_nccl_abort_all, l3d_nccl_is_device
//
// nccl_internal.h draws the shape: NCCL for device memory, an inner ucx or ofi endpoint for
// host memory, one NCCL communicator per llama3d communicator plus one per direction for
// point-to-point. Which GPU: params.local_rank (the launcher's LOCAL_RANK), as the CUDA device
// picks its own, so a rank's transport and device agree. Settings are NCCL's own (NCCL_DEBUG,
// NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...), read by the library.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "platform/platform.h"
#include "transports/nccl/nccl_internal.h"

// ---- errors -------------------------------------------------------------------------------------
l3d_status l3d_nccl_fail(l3d_nccl_t *n, ncclResult_t r, ncclComm_t comm, const char *what) {
    const char *last = n->lib.ncclGetLastError ? n->lib.ncclGetLastError(comm) : "";
    snprintf(n->err, sizeof(n->err), "%s%s%s", n->lib.ncclGetErrorString(r),
             last && last[0] ? ": " : "", last ? last : "");
    // (remote: a peer's process or link gone; system: a socket or driver call failed under us)
    l3d_status st = r == ncclRemoteError || r == ncclSystemError ? L3D_ERR_PEER_FAILED
                    : r == ncclInvalidArgument || r == ncclInvalidUsage ? L3D_ERR_INVALID_ARG
                                                                         : L3D_ERR_SYSTEM;
    return l3d_error(n->ctx, st, "nccl %s: %s", what, n->err);
}

l3d_status l3d_nccl_cuda_fail(l3d_nccl_t *n, cudaError_t e, const char *what) {
    (void)cudaGetLastError();
    snprintf(n->err, sizeof(n->err), "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    l3d_status st = e == cudaErrorMemoryAllocation ? L3D_ERR_NOMEM
                    : e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
                            e == cudaErrorStubLibrary || e == cudaErrorInvalidDevice
                        ? L3D_ERR_UNSUPPORTED
                        : L3D_ERR_SYSTEM;
    return l3d_error(n->ctx, st, "nccl %s: %s", what, n->err);
}

l3d_status l3d_nccl_settle(l3d_nccl_t *n, ncclComm_t comm, const char *what) {
    double t0 = l3d_time_now();
    for (;;) {
        ncclResult_t r = ncclInProgress;
        ncclResult_t q = n->lib.ncclCommGetAsyncError(comm, &r);
        if (q != ncclSuccess) return l3d_nccl_fail(n, q, comm, what);
        if (r == ncclSuccess) return L3D_OK;
        if (r != ncclInProgress) return l3d_nccl_fail(n, r, comm, what);
        if (l3d_time_now() - t0 > n->timeout_s) {
            n->lib.ncclCommAbort(comm);
            snprintf(n->err, sizeof(n->err), "still in progress after %.0f s", n->timeout_s);
            return l3d_error(n->ctx, L3D_ERR_TIMEOUT, "nccl %s: not done after %.0f s "
                             "(L3D_COMM_TIMEOUT): a rank is missing or stopped", what,
                             n->timeout_s);
        }
        struct timespec ts = {0, 100000};  // 100 us: a launch settles in microseconds
        nanosleep(&ts, NULL);
    }
}

// ---- communicators ------------------------------------------------------------------------------
// A non-blocking configuration: creation and launches are polled (l3d_nccl_settle).
static ncclConfig_t config(void) {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.blocking = 0;
    return c;
}

l3d_nccl_group_t *l3d_nccl_group(l3d_nccl_t *n, uint32_t id) {
    for (int i = 0; i < n->ngroups; i++)
        if (n->groups[i].id == id) return &n->groups[i];
    return NULL;
}

static l3d_status group_add(l3d_nccl_t *n, uint32_t id, ncclComm_t comm) {
    if (n->ngroups == n->cap_groups) {
        int cap = n->cap_groups ? 2 * n->cap_groups : 8;
        l3d_nccl_group_t *g = l3d_calloc(n->ctx, (size_t)cap, sizeof(*g), L3D_NCCL_MEM_TAG);
        if (!g) return L3D_ERR_NOMEM;
        if (n->groups) {
            memcpy(g, n->groups, (size_t)n->ngroups * sizeof(*g));
            l3d_free(n->ctx, n->groups, (size_t)n->cap_groups * sizeof(*g), L3D_NCCL_MEM_TAG);
        }
        n->groups = g;
        n->cap_groups = cap;
    }
    n->groups[n->ngroups++] = (l3d_nccl_group_t){id, comm, 0};
    return L3D_OK;
}

// Ends comm: destroyed when healthy (its work is done: the core waited or cancelled every
// call), aborted otherwise. Never waits on a peer.
static void comm_end(l3d_nccl_t *n, ncclComm_t comm, int dead) {
    if (!comm) return;
    if (dead || n->aborted) n->lib.ncclCommAbort(comm);
    else n->lib.ncclCommDestroy(comm);
}

void l3d_nccl_abort_all(l3d_nccl_t *n) {
    for (int i = 0; i < n->ngroups; i++)
        if (!n->groups[i].dead) {
            n->lib.ncclCommAbort(n->groups[i].comm);
            n->groups[i].dead = 1;
            n->groups[i].comm = NULL;
        }
    if (n->up) n->lib.ncclCommAbort(n->up);
    if (n->down) n->lib.ncclCommAbort(n->down);
    n->up = n->down = NULL;
    n->aborted = 1;
}

// A split of parent (color NCCL_SPLIT_NOCOLOR: this rank joins none), polled; *out is NULL
// for a rank that joins none. The new rank order is the key's: the member's place in child.
static l3d_status split(l3d_nccl_t *n, ncclComm_t parent, int color, int key, ncclComm_t *out,
                        const char *what) {
    ncclConfig_t c = config();
    *out = NULL;
    ncclResult_t r = n->lib.ncclCommSplit(parent, color, key, out, &c);
    if (r != ncclSuccess && r != ncclInProgress) return l3d_nccl_fail(n, r, parent, what);
    L3D_CHECK(n->ctx, l3d_nccl_settle(n, parent, what));
    if (*out) L3D_CHECK(n->ctx, l3d_nccl_settle(n, *out, what));
    return L3D_OK;
}

static l3d_status nccl_group_split(l3d_transport_t *tp, const l3d_tp_group_t *parent,
                                   const l3d_tp_group_t *child) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    l3d_nccl_group_t *pg = l3d_nccl_group(n, parent->id);
    if (!pg || pg->dead)
        return l3d_error(n->ctx, L3D_ERR_PEER_FAILED, "nccl: split of communicator %u, which "
                         "is %s", parent->id, pg ? "aborted" : "unknown to nccl");
    // The color only has to tell the new communicators apart: their first member's world rank.
    int color = child ? child->ranks[0] : NCCL_SPLIT_NOCOLOR, key = child ? child->me : 0;
    ncclComm_t comm = NULL;
    L3D_CHECK(n->ctx, split(n, pg->comm, color, key, &comm, "split"));
    if (!child) return L3D_OK;
    int rank = -1, count = 0;
    n->lib.ncclCommUserRank(comm, &rank);
    n->lib.ncclCommCount(comm, &count);
    if (rank != child->me || count != child->n) {
        n->lib.ncclCommAbort(comm);
        return l3d_error(n->ctx, L3D_ERR_INTERNAL, "nccl: split gave rank %d of %d, the "
                         "communicator has this rank at %d of %d", rank, count, child->me,
                         child->n);
    }
    l3d_status st = group_add(n, child->id, comm);
    if (st < 0) n->lib.ncclCommAbort(comm);
    return st;
}

static void nccl_group_free(l3d_transport_t *tp, uint32_t id) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    l3d_nccl_group_t *g = l3d_nccl_group(n, id);
    if (!g || id == 0) return;
    comm_end(n, g->comm, g->dead);
    *g = n->groups[--n->ngroups];
}

// ---- lifetime -----------------------------------------------------------------------------------
static void nccl_fini(l3d_transport_t *tp);

// The inner transport for host memory: the first of ucx, ofi this build has.
static l3d_status host_init(l3d_nccl_t *n, l3d_transport_t *tp, const l3d_transport_params_t *p) {
    const char *names[] = {"ucx", "ofi"};
    const l3d_transport_ops_t *ops = NULL;
    for (int i = 0; i < 2 && !ops; i++)
        for (int k = 0; l3d_transport_backends[k]; k++)
            if (!strcmp(l3d_transport_backends[k]->name, names[i])) ops = l3d_transport_backends[k];
    if (!ops)
        return l3d_error(n->ctx, L3D_ERR_UNSUPPORTED, "nccl: needs ucx or ofi built in for its "
                         "host messages (apt-get install libucx-dev, then rebuild)");
    L3D_CHECK(n->ctx, l3d_transport_find(n->ctx, ops->name, &ops));
    n->host = (l3d_transport_t){.ops = ops, .ctx = tp->ctx};
    L3D_CHECK(n->ctx, ops->init(&n->host, p));
    n->host_up = 1;
    return L3D_OK;
}

static l3d_status nccl_init(l3d_transport_t *tp, const l3d_transport_params_t *p) {
    l3d_ctx_t *ctx = tp->ctx;
    if (p->local_shared)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED, "nccl: connects processes, one GPU each; "
                         "ranks as threads of one process use the local transport");
    l3d_nccl_t *n = l3d_calloc(ctx, 1, sizeof(*n), L3D_NCCL_MEM_TAG);
    if (!n) return L3D_ERR_NOMEM;
    n->ctx = ctx;
    n->rank = p->rank;
    n->nranks = p->nranks;
    n->local_rank = p->local_rank;
    n->timeout_s = p->timeout_s > 0 ? p->timeout_s : 300.0;
    n->gpu = -1;
    tp->priv = n;
    tp->world_rank = p->rank;
    tp->world_size = p->nranks;
    l3d_status st = l3d_nccl_lib_open(ctx, &n->lib);
    if (st >= 0) st = host_init(n, tp, p);
    // (works without a GPU: the id is a socket address of this host)
    ncclResult_t r = ncclSuccess;
    if (st >= 0 && p->rank == 0 && (r = n->lib.ncclGetUniqueId((ncclUniqueId *)n->id)))
        st = l3d_nccl_fail(n, r, NULL, "unique id");
    if (st < 0) {
        nccl_fini(tp);
        return st;
    }
    return L3D_OK;
}

static void nccl_fini(l3d_transport_t *tp) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    if (!n) return;
    if (n->gpu >= 0) cudaSetDevice(n->gpu);
    for (int i = n->ngroups - 1; i >= 0; i--) comm_end(n, n->groups[i].comm, n->groups[i].dead);
    comm_end(n, n->up, 0);
    comm_end(n, n->down, 0);
    if (n->groups)
        l3d_free(n->ctx, n->groups, (size_t)n->cap_groups * sizeof(*n->groups), L3D_NCCL_MEM_TAG);
    l3d_nccl_events_free(n);
    if (n->scratch) cudaFree(n->scratch);
    if (n->ordered) cudaEventDestroy(n->ordered);
    cudaStream_t s[3] = {n->s_up, n->s_down, n->s_coll};
    for (int i = 0; i < 3; i++)
        if (s[i]) cudaStreamDestroy(s[i]);
    if (n->host_up) n->host.ops->fini(&n->host);
    l3d_nccl_lib_close(&n->lib);
    l3d_free(n->ctx, n, sizeof(*n), L3D_NCCL_MEM_TAG);
    tp->priv = NULL;
}

static void nccl_caps(const l3d_transport_t *tp, l3d_transport_caps_t *caps) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    // Host messages are the inner transport's: its limits are the ones the core must keep.
    n->host.ops->caps(&n->host, caps);
    caps->ptr_support = L3D_PTR_HOST | L3D_PTR_DEVICE;
    caps->coll_ptr_support = L3D_PTR_DEVICE;
    caps->half_sums_per_hop = 1;
}

// ---- wiring -------------------------------------------------------------------------------------
static l3d_status nccl_addr_get(l3d_transport_t *tp, void *buf, size_t *len_p) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    l3d_nccl_blob_t h = {.magic = L3D_NCCL_BLOB_MAGIC, .version = L3D_NCCL_BLOB_VERSION,
                         .has_id = n->rank == 0};
    if (h.has_id) memcpy(h.id, n->id, sizeof(h.id));
    size_t room = *len_p > sizeof(h) ? *len_p - sizeof(h) : 0, inner = room;
    l3d_status st = n->host.ops->addr_get(&n->host, room ? (char *)buf + sizeof(h) : NULL, &inner);
    if (st == L3D_ERR_INVALID_ARG || *len_p < sizeof(h) + inner) {
        *len_p = sizeof(h) + inner;
        return L3D_ERR_INVALID_ARG;
    }
    L3D_CHECK(n->ctx, st);
    h.inner_len = (uint32_t)inner;
    memcpy(buf, &h, sizeof(h));
    *len_p = sizeof(h) + inner;
    return L3D_OK;
}

// An FNV-1a digest of the unique id, for the log line that shows every rank got rank 0's.
static uint64_t id_digest(const unsigned char *id) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h = (h ^ id[i]) * 1099511628211ull;
    return h;
}

// This rank's GPU, its streams and events.
static l3d_status gpu_open(l3d_nccl_t *n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(n->err, sizeof(n->err), "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        return l3d_error(n->ctx, L3D_ERR_UNSUPPORTED, "nccl: rank %d has no GPU: %s", n->rank,
                         n->err);
    }
    if (n->local_rank < 0 || n->local_rank >= count)
        return l3d_error(n->ctx, L3D_ERR_UNSUPPORTED, "nccl: rank %d is local rank %d, but %d "
                         "GPUs are visible (one GPU per rank of a node: CUDA_VISIBLE_DEVICES, "
                         "LOCAL_RANK)", n->rank, n->local_rank, count);
    n->gpu = n->local_rank;
    if ((e = cudaSetDevice(n->gpu)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&n->s_up, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&n->s_down, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&n->s_coll, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&n->ordered, cudaEventDisableTiming)) != cudaSuccess)
        return l3d_nccl_cuda_fail(n, e, "opening the GPU");
    return L3D_OK;
}

static l3d_status nccl_connect(l3d_transport_t *tp, const void *const *addrs, const size_t *lens) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    const void **inner = l3d_calloc(n->ctx, (size_t)n->nranks, sizeof(*inner), L3D_NCCL_MEM_TAG);
    size_t *ilens = l3d_calloc(n->ctx, (size_t)n->nranks, sizeof(*ilens), L3D_NCCL_MEM_TAG);
    l3d_status st = inner && ilens ? L3D_OK : L3D_ERR_NOMEM;
    for (int i = 0; i < n->nranks && st >= 0; i++) {
        int has_id = 0;
        st = l3d_nccl_blob_read(n->ctx, i, addrs[i], lens[i], &inner[i], &ilens[i], &has_id,
                                n->id);
        if (st >= 0 && has_id != (i == 0))
            st = l3d_error(n->ctx, L3D_ERR_PEER_FAILED, "nccl: rank %d's address %s the unique "
                           "id (rank 0 alone makes it)", i, has_id ? "carries" : "lacks");
    }
    if (st >= 0)
        l3d_log(n->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM, "nccl: rank %d has rank 0's unique id "
                "%016llx", n->rank, (unsigned long long)id_digest(n->id));
    // The GPU before any peer is contacted: without one every rank stops here alike, naming
    // it, and none is left connecting to a rank that has already gone.
    if (st >= 0) st = gpu_open(n);
    if (st >= 0) st = n->host.ops->connect(&n->host, inner, ilens);
    if (inner) l3d_free(n->ctx, inner, (size_t)n->nranks * sizeof(*inner), L3D_NCCL_MEM_TAG);
    if (ilens) l3d_free(n->ctx, ilens, (size_t)n->nranks * sizeof(*ilens), L3D_NCCL_MEM_TAG);
    L3D_CHECK(n->ctx, st);
    ncclConfig_t c = config();
    ncclComm_t world = NULL;
    ncclUniqueId id;
    memcpy(&id, n->id, sizeof(id));
    ncclResult_t r = n->lib.ncclCommInitRankConfig(&world, n->nranks, id, n->rank, &c);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (world) n->lib.ncclCommAbort(world);
        return l3d_nccl_fail(n, r, world, "communicator init");
    }
    if ((st = l3d_nccl_settle(n, world, "communicator init")) < 0) return st;
    if ((st = group_add(n, 0, world)) < 0) {
        n->lib.ncclCommAbort(world);
        return st;
    }
    // Point-to-point, one communicator per direction (same ranks: the key is the world rank).
    L3D_CHECK(n->ctx, split(n, world, 0, n->rank, &n->up, "point-to-point communicator"));
    L3D_CHECK(n->ctx, split(n, world, 0, n->rank, &n->down, "point-to-point communicator"));
    l3d_log(n->ctx, L3D_LOG_INFO, L3D_SUBSYS_COMM, "nccl %d.%d.%d: rank %d of %d on GPU %d",
            n->lib.version / 10000, n->lib.version / 100 % 100, n->lib.version % 100, n->rank,
            n->nranks, n->gpu);
    return L3D_OK;
}

// ---- memory registration: the inner transport's, for host memory ----------------------------
int l3d_nccl_is_device(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static l3d_status nccl_mr_reg(l3d_transport_t *tp, void *buf, size_t len, void **mr_p) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    *mr_p = NULL;
    if (l3d_nccl_is_device(buf) || !n->host.ops->mr_reg) return L3D_OK;
    return n->host.ops->mr_reg(&n->host, buf, len, mr_p);
}

static void nccl_mr_dereg(l3d_transport_t *tp, void *mr) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    if (mr && n->host.ops->mr_dereg) n->host.ops->mr_dereg(&n->host, mr);
}

// ---- progress, abort, errors, streams -----------------------------------------------------------
static l3d_status nccl_progress(l3d_transport_t *tp) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    return n->host.ops->progress(&n->host);
}

static void nccl_abort(l3d_transport_t *tp) {
    l3d_nccl_t *n = l3d_nccl_priv(tp);
    n->host.ops->abort(&n->host);
    l3d_nccl_abort_all(n);
}

static const char *nccl_strerror(const l3d_transport_t *tp) {
    const l3d_nccl_t *n = l3d_nccl_priv(tp);
    return n->err[0] ? n->err : n->host.ops->strerror(&n->host);
}

static void nccl_set_stream(l3d_transport_t *tp, struct l3d_device *dev, void *stream) {
    (void)dev;  // the CUDA stream names its device
    l3d_nccl_priv(tp)->user = (cudaStream_t)stream;
}

const l3d_transport_ops_t l3d_nccl_transport_ops = {
    .abi_version = L3D_TRANSPORT_ABI_VERSION,
    .size = sizeof(l3d_transport_ops_t),
    .name = "nccl",
    .init = nccl_init,
    .fini = nccl_fini,
    .caps = nccl_caps,
    .addr_get = nccl_addr_get,
    .connect = nccl_connect,
    .mr_reg = nccl_mr_reg,
    .mr_dereg = nccl_mr_dereg,
    .isend = l3d_nccl_isend,
    .irecv = l3d_nccl_irecv,
    .test = l3d_nccl_test,
    .progress = nccl_progress,
    .cancel = l3d_nccl_cancel,
    .abort = nccl_abort,
    .strerror = nccl_strerror,
    .waiting_on = l3d_nccl_waiting_on,
    .set_stream = nccl_set_stream,
    .group_split = nccl_group_split,
    .group_free = nccl_group_free,
    .coll = &l3d_nccl_coll_ops,
};
