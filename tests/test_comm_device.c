// Every collective and point-to-point call on device buffers of the test devices, thread
// ranks on the local transport, both ways the core has of handing device memory to a
// transport: staged through host memory (a transport that takes host memory: ucx, ofi, and
// local by default) and given as it is (a transport that takes device memory: nccl, and local
// under L3D_LOCAL_DEVICE_BUFFERS=1, which reaches it through the device's own entries). Each
// call mixes device and host buffers (send on one side, receive on the other, in place) and
// small, medium and chunk-sized counts, and its result is checked against the value worked out
// here: the inputs are small integers, exact in every dtype and every summation order.
// The inputs are written by a device copy that nobody waits for before the call, so on
// cpu-async a call the core does not order after the compute that wrote its buffer reads
// stale memory; on cpu-opaque any host read of device memory is a fault.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/device.h"
#include "llama3d/comm.h"
#include "tests/harness/world.h"
#include "transports/transport.h"

#define FAILF(...)                          \
    do {                                    \
        snprintf(err, errlen, __VA_ARGS__); \
        return 1;                           \
    } while (0)
#define CHECK_OK(call)                                                                         \
    do {                                                                                       \
        l3d_status st_ = (call);                                                               \
        if (st_ != L3D_OK) FAILF("%s: %s returned %d: %s", what, #call, (int)st_,             \
                                 l3d_ctx_last_error(l3d_comm_ctx(c)));                          \
    } while (0)

// (Criterion may run a case in a fresh process: parameters hold no pointers)
static const char *const k_devices[] = {"cpu-opaque", "cpu-async"};
typedef struct {
    int device;  // k_devices
    int direct;  // L3D_LOCAL_DEVICE_BUFFERS
    int n;
} dev_param_t;

// Where a call's buffers are: both on the device, the send buffer on the host, the receive
// buffer on the host, or one device buffer in place.
enum { DD, HD, DH, INPLACE, NPLACE };
enum { ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BROADCAST, REDUCE, ALLTOALL };
static const char *const k_op[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                   "reduce", "alltoall"};
static const char *const k_place[NPLACE] = {"device->device", "host->device", "device->host",
                                            "in place"};

typedef struct {
    l3d_comm_t *c;
    l3d_device_t *dev;
    int me, n;
} rank_t;

// An input: small integers, exact in float32, bfloat16 and int32 and in any summation order.
static int val(int r, size_t i) { return r + 1 + (int)(i % 29); }

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);  // exact: the values have at most 8 significant bits
}

// Fills count elements of dt into host memory h: rank r's inputs val(r, i), or with
// `to` >= 0 its all-to-all block for rank `to`, r * 1000 + to * 10 + i % 7.
static void fill(void *h, l3d_dtype dt, size_t count, int r, int to) {
    for (size_t i = 0; i < count; i++) {
        int v = to >= 0 ? r * 1000 + to * 10 + (int)(i % 7) : val(r, i);
        if (dt == L3D_FLOAT32) ((float *)h)[i] = (float)v;
        else if (dt == L3D_BFLOAT16) ((uint16_t *)h)[i] = bf16_of((float)v);
        else ((int32_t *)h)[i] = v;
    }
}

static double get(const void *h, l3d_dtype dt, size_t i) {
    if (dt == L3D_FLOAT32) return ((const float *)h)[i];
    if (dt == L3D_INT32) return ((const int32_t *)h)[i];
    uint32_t u = (uint32_t)((const uint16_t *)h)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// A buffer of `bytes` on the device (dev) or the host, holding `host`'s bytes when host is
// not NULL. The device copy is not waited for: the call that reads the buffer must be ordered
// after it.
static void *buf_new(const rank_t *k, int on_dev, const void *host, size_t bytes) {
    void *p = NULL;
    if (!on_dev) {
        p = malloc(bytes);
        if (p && host) memcpy(p, host, bytes);
        if (p && !host) memset(p, 0xEE, bytes);
        return p;
    }
    if (l3d_dev_alloc(k->dev, bytes, "acts", &p) != L3D_OK) return NULL;
    if (host) l3d_dev_copy(k->dev, p, host, bytes, L3D_COPY_H2D);
    else l3d_dev_memset(k->dev, p, 0xEE, bytes);
    return p;
}

static void buf_free(const rank_t *k, int on_dev, void *p, size_t bytes) {
    if (on_dev) l3d_dev_free(k->dev, p, bytes, "acts");
    else free(p);
}

// The bytes of `p` in host memory `out`.
static l3d_status buf_read(const rank_t *k, int on_dev, void *out, const void *p, size_t bytes) {
    if (!on_dev) {
        memcpy(out, p, bytes);
        return L3D_OK;
    }
    L3D_CHECK(NULL, l3d_dev_copy(k->dev, out, p, bytes, L3D_COPY_D2H));
    return l3d_dev_sync(k->dev);
}

// The expected element i of this rank's result of op (count per block as the API counts).
static double expect(int op, l3d_redop rop, const rank_t *k, size_t count, int root,
                     size_t i) {
    double s = 0, m = -1e300;
    switch (op) {
    case ALLREDUCE:
    case REDUCE:
        for (int r = 0; r < k->n; r++) {
            s += val(r, i);
            if (val(r, i) > m) m = val(r, i);
        }
        return rop == L3D_MAX ? m : s;
    case REDUCE_SCATTER:
        for (int r = 0; r < k->n; r++) s += val(r, (size_t)k->me * count + i);
        return s;
    case ALLGATHER:
        return val((int)(i / count), i % count);
    case BROADCAST:
        return val(root, i);
    default: {  // alltoall: block j came from rank j, its block me
        size_t j = i / count, e = i % count;
        return (double)(j * 1000 + (size_t)k->me * 10 + e % 7);
    }
    }
}

// One collective with buffers placed as `place`; 0 when its result is right.
static int one_coll(const rank_t *k, int op, l3d_dtype dt, l3d_redop rop, size_t count,
                    int place, char *err, size_t errlen) {
    l3d_comm_t *c = k->c;
    int n = k->n, me = k->me, root = op == REDUCE ? 0 : n - 1;
    char what[160];
    snprintf(what, sizeof(what), "%s %s count %zu, %s, rank %d of %d", k_op[op],
             l3d_dtype_name(dt), count, k_place[place], me, n);
    size_t esz = l3d_dtype_size(dt), blk = count * esz, all = blk * (size_t)n;
    size_t sb = op == REDUCE_SCATTER || op == ALLTOALL ? all : blk;
    size_t rb = op == ALLGATHER || op == ALLTOALL ? all : blk;
    int alltoall = op == ALLTOALL;
    unsigned char *hin = malloc(rb > sb ? rb : sb), *hout = malloc(rb);
    if (!hin || !hout) FAILF("%s: out of memory", what);
    fill(hin, dt, sb / esz, me, -1);
    if (alltoall)
        for (int j = 0; j < n; j++) fill(hin + (size_t)j * blk, dt, count, me, j);
    int sdev = place != HD, rdev = place != DH;
    void *sbuf, *rbuf;
    if (place == INPLACE) {
        // in place: allgather's input is this rank's block of the output
        size_t off = op == ALLGATHER ? (size_t)me * blk : 0;
        // (hin holds the whole buffer until the call: cpu-async copies it at the wait)
        memmove(hin + off, hin, sb);
        rbuf = buf_new(k, 1, hin, rb);
        sbuf = (char *)rbuf + off;
    } else {
        sbuf = buf_new(k, sdev, hin, sb);
        rbuf = buf_new(k, rdev, NULL, rb);
    }
    if (!sbuf || !rbuf) FAILF("%s: buffers", what);
    int got_result = !(op == REDUCE && me != root);
    switch (op) {
    case ALLREDUCE: CHECK_OK(l3d_comm_allreduce(c, sbuf, rbuf, count, dt, rop)); break;
    case REDUCE_SCATTER:
        CHECK_OK(l3d_comm_reduce_scatter(c, sbuf, rbuf, count, dt, rop));
        break;
    case ALLGATHER: CHECK_OK(l3d_comm_allgather(c, sbuf, rbuf, count, dt)); break;
    case BROADCAST: CHECK_OK(l3d_comm_broadcast(c, sbuf, rbuf, count, dt, root)); break;
    case REDUCE: CHECK_OK(l3d_comm_reduce(c, sbuf, rbuf, count, dt, rop, root)); break;
    default: CHECK_OK(l3d_comm_alltoall(c, sbuf, rbuf, count, dt)); break;
    }
    CHECK_OK(buf_read(k, place == INPLACE || rdev, hout, rbuf, rb));
    for (size_t i = 0; got_result && i < rb / esz; i++) {
        double want = expect(op, rop, k, count, root, i), have = get(hout, dt, i);
        if (have != want) FAILF("%s: element %zu is %.9g, expected %.9g", what, i, have, want);
    }
    if (place == INPLACE) {
        buf_free(k, 1, rbuf, rb);
    } else {
        buf_free(k, sdev, sbuf, sb);
        buf_free(k, rdev, rbuf, rb);
    }
    free(hin);
    free(hout);
    return 0;
}

// A ring of sends: this rank's values to the next rank, the previous rank's into `place`.
static int ring(const rank_t *k, size_t count, int place, char *err, size_t errlen) {
    l3d_comm_t *c = k->c;
    int n = k->n, me = k->me;
    char what[128];
    snprintf(what, sizeof(what), "send/recv ring, float32 count %zu, %s, rank %d of %d", count,
             k_place[place], me, n);
    size_t bytes = count * 4;
    float *hin = malloc(bytes), *hout = malloc(bytes);
    if (!hin || !hout) FAILF("%s: out of memory", what);
    fill(hin, L3D_FLOAT32, count, me, -1);
    int sdev = place != HD, rdev = place != DH;
    void *sbuf = buf_new(k, sdev, hin, bytes), *rbuf = buf_new(k, rdev, NULL, bytes);
    if (!sbuf || !rbuf) FAILF("%s: buffers", what);
    CHECK_OK(l3d_comm_group_start(c));
    CHECK_OK(l3d_comm_send(c, sbuf, count, L3D_FLOAT32, (me + 1) % n));
    CHECK_OK(l3d_comm_recv(c, rbuf, count, L3D_FLOAT32, (me + n - 1) % n));
    CHECK_OK(l3d_comm_group_end(c));
    CHECK_OK(buf_read(k, rdev, hout, rbuf, bytes));
    for (size_t i = 0; i < count; i++)
        if (hout[i] != (float)val((me + n - 1) % n, i))
            FAILF("%s: element %zu is %.9g, expected %d", what, i, hout[i],
                  val((me + n - 1) % n, i));
    buf_free(k, sdev, sbuf, bytes);
    buf_free(k, rdev, rbuf, bytes);
    free(hin);
    free(hout);
    return 0;
}

static int body(l3d_comm_t *c, void *arg, char *err, size_t errlen) {
    const dev_param_t *p = arg;
    rank_t k = {.c = c, .me = l3d_comm_rank(c), .n = l3d_comm_size(c)};
    const char *what = "setup";
    l3d_device_params_t dp = {.num_threads = 1};
    CHECK_OK(l3d_device_create(l3d_comm_ctx(c), k_devices[p->device], &dp, &k.dev));
    CHECK_OK(l3d_comm_set_device(c, k.dev));
    // 1M + 3 float32 is 4 MiB and more: the staged path takes it in chunks (L3D_STAGE_CHUNK)
    static const size_t counts[] = {5, 70001, (1u << 20) + 3};
    static const struct {
        int op;
        l3d_dtype dt;
        l3d_redop rop;
        int big;  // runs the chunk-sized count too
    } ops[] = {
        {ALLREDUCE, L3D_FLOAT32, L3D_SUM, 1},
        {ALLREDUCE, L3D_BFLOAT16, L3D_SUM, 0},
        {ALLREDUCE, L3D_INT32, L3D_MAX, 0},
        {REDUCE_SCATTER, L3D_FLOAT32, L3D_SUM, 0},
        {ALLGATHER, L3D_FLOAT32, L3D_SUM, 0},
        {BROADCAST, L3D_FLOAT32, L3D_SUM, 1},
        {REDUCE, L3D_FLOAT32, L3D_SUM, 1},
        {ALLTOALL, L3D_INT32, L3D_SUM, 0},
    };
    int rc = 0;
    for (size_t o = 0; !rc && o < sizeof(ops) / sizeof(ops[0]); o++)
        for (size_t ci = 0; !rc && ci < (ops[o].big ? 3u : 2u); ci++)
            for (int place = 0; !rc && place < NPLACE; place++) {
                int inplace_ok = ops[o].op == ALLREDUCE ||
                                 ops[o].op == ALLGATHER ||
                                 ops[o].op == BROADCAST;
                if (place == INPLACE && !inplace_ok) continue;
                rc = one_coll(&k, ops[o].op, ops[o].dt, ops[o].rop, counts[ci], place, err,
                              errlen);
            }
    for (int place = 0; !rc && place < INPLACE; place++)
        for (size_t ci = 0; !rc && ci < 2; ci++) rc = ring(&k, counts[ci], place, err, errlen);
    what = "barrier";
    if (!rc) CHECK_OK(l3d_comm_barrier(c));
    CHECK_OK(l3d_comm_set_device(c, NULL));
    l3d_device_destroy(k.dev);
    return rc;
}

static dev_param_t k_params[] = {
    {0, 0, 2}, {0, 0, 3}, {1, 0, 2}, {1, 0, 3}, {0, 1, 2}, {0, 1, 3}, {1, 1, 2}, {1, 1, 3},
};
ParameterizedTestParameters(comm_device, every_call) {
    return cr_make_param_array(dev_param_t, k_params, sizeof(k_params) / sizeof(k_params[0]));
}

ParameterizedTest(dev_param_t *p, comm_device, every_call, .timeout = 300) {
    setenv("L3D_COMM_TIMEOUT", "60", 0);
    setenv("L3D_LOCAL_DEVICE_BUFFERS", p->direct ? "1" : "0", 1);
    char err[512] = "";
    cr_assert_eq(l3d_world_run("local", p->n, body, p, 240, err, sizeof(err)), 0,
                 "%s, %s: %s", k_devices[p->device], p->direct ? "device buffers to the transport" :
                 "staged", err);
}

// The transport's side of the contract: under L3D_LOCAL_DEVICE_BUFFERS=1 the local transport
// declares device memory for its sends and device memory alone for its native collectives,
// and refuses a host buffer in one (the core mirrors those into device temporaries); by
// default it declares host memory only.
Test(comm_device, local_transport_declares_and_checks_device_buffers) {
    for (int direct = 0; direct < 2; direct++) {
        setenv("L3D_LOCAL_DEVICE_BUFFERS", direct ? "1" : "0", 1);
        l3d_ctx_t *ctx;
        cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
        const l3d_transport_ops_t *ops;
        cr_assert_eq(l3d_transport_find(ctx, "local", &ops), L3D_OK);
        void *hub = NULL;
        l3d_transport_t tp = {.ops = ops, .ctx = ctx};
        l3d_transport_params_t prm = {.rank = 0, .nranks = 2, .timeout_s = 5,
                                      .local_shared = &hub};
        cr_assert_eq(ops->init(&tp, &prm), L3D_OK, "%s", l3d_ctx_last_error(ctx));
        l3d_transport_caps_t caps;
        ops->caps(&tp, &caps);
        cr_assert_eq(caps.ptr_support, L3D_PTR_HOST | (direct ? L3D_PTR_DEVICE : 0u));
        cr_assert_eq(caps.coll_ptr_support, direct ? L3D_PTR_DEVICE : 0u);
        if (direct) {
            l3d_device_t *dev;
            l3d_device_params_t dp = {.num_threads = 1};
            cr_assert_eq(l3d_device_create(ctx, "cpu-opaque", &dp, &dev), L3D_OK);
            void *d = NULL;
            cr_assert_eq(l3d_dev_alloc(dev, 64, "acts", &d), L3D_OK);
            float host[16] = {0};
            ops->set_stream(&tp, dev, NULL);
            int ranks[2] = {0, 1};
            l3d_tp_coll_args_t a = {.ranks = ranks, .n = 2, .me = 0, .seq = 1, .sendbuf = d,
                                    .recvbuf = host, .count = 16, .dt = L3D_FLOAT32,
                                    .op = L3D_SUM};
            l3d_tp_request_t *req = NULL;
            cr_assert_eq(ops->coll->allreduce(&tp, &a, &req), L3D_ERR_INTERNAL);
            cr_assert(strstr(l3d_ctx_last_error(ctx), "the receive buffer") &&
                          strstr(l3d_ctx_last_error(ctx), "not memory of the communicator's "
                                 "device"), "%s", l3d_ctx_last_error(ctx));
            l3d_dev_free(dev, d, 64, "acts");
            l3d_device_destroy(dev);
        }
        ops->fini(&tp);
        l3d_ctx_destroy(ctx);
    }
}
