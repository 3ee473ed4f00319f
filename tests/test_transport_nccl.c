// The nccl transport through its vtable (built only with it). Everywhere: its table, the
// address blob refusing what is not its own, thread worlds refused, and without a GPU a
// one-rank endpoint that stops at connect naming the missing GPU with nothing left allocated.
// On a GPU (tools/gpu-check.sh): a one-rank endpoint runs every native collective in every
// dtype on device memory, on a user stream, each result checked on the host (one rank: the
// sums, averages, maxima and minima are the input; the others copy it), bit for bit, and an
// all-reduce captured in a CUDA graph and replayed.
#include <criterion/criterion.h>
#include <string.h>

#include "transports/nccl/nccl_internal.h"

static int have_gpu(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    return e == cudaSuccess && n > 0;
}

Test(nccl, table) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    const l3d_transport_ops_t *ops = NULL;
    cr_assert_eq(l3d_transport_find(ctx, "nccl", &ops), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cr_assert_str_eq(ops->name, "nccl");
    cr_assert_eq(ops->abi_version, L3D_TRANSPORT_ABI_VERSION);
    cr_assert(ops->set_stream && ops->group_split && ops->group_free && ops->waiting_on);
    cr_assert(ops->coll && ops->coll->allreduce && ops->coll->reduce_scatter &&
              ops->coll->allgather && ops->coll->broadcast && ops->coll->reduce &&
              ops->coll->alltoall && ops->coll->barrier);
    l3d_ctx_destroy(ctx);
}

// A blob of the given header with `inner` bytes of inner address after it.
static size_t blob(unsigned char *buf, uint32_t magic, uint32_t version, uint32_t has_id,
                   uint32_t inner_len, size_t inner) {
    l3d_nccl_blob_t h = {.magic = magic, .version = version, .has_id = has_id,
                         .inner_len = inner_len};
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h.id[i] = (unsigned char)(i * 7 + 1);
    memcpy(buf, &h, sizeof(h));
    for (size_t i = 0; i < inner; i++) buf[sizeof(h) + i] = (unsigned char)(0xa0 + i);
    return sizeof(h) + inner;
}

Test(nccl, blob_reads_its_own_and_refuses_the_rest) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    unsigned char b[sizeof(l3d_nccl_blob_t) + 16], id[NCCL_UNIQUE_ID_BYTES];
    const void *inner = NULL;
    size_t ilen = 0;
    int has_id = -1;
    size_t len = blob(b, L3D_NCCL_BLOB_MAGIC, L3D_NCCL_BLOB_VERSION, 1, 16, 16);
    cr_assert_eq(l3d_nccl_blob_read(ctx, 0, b, len, &inner, &ilen, &has_id, id), L3D_OK);
    cr_assert_eq(has_id, 1);
    cr_assert_eq(ilen, 16);
    cr_assert_eq(inner, b + sizeof(l3d_nccl_blob_t));
    cr_assert_eq(memcmp(id, ((l3d_nccl_blob_t *)b)->id, sizeof(id)), 0);
    struct {
        uint32_t magic, version, has_id, inner_len;
        size_t inner, cut;
        const char *says;
    } bad[] = {
        {0x12345678u, L3D_NCCL_BLOB_VERSION, 0, 16, 16, 0, "not an nccl address"},
        {L3D_NCCL_BLOB_MAGIC, 99, 0, 16, 16, 0, "not an nccl address of version"},
        {L3D_NCCL_BLOB_MAGIC, L3D_NCCL_BLOB_VERSION, 2, 16, 16, 0, "malformed"},
        {L3D_NCCL_BLOB_MAGIC, L3D_NCCL_BLOB_VERSION, 0, 17, 16, 0, "malformed"},
        {L3D_NCCL_BLOB_MAGIC, L3D_NCCL_BLOB_VERSION, 0, 16, 16, sizeof(l3d_nccl_blob_t) + 10,
         "malformed"},
        {L3D_NCCL_BLOB_MAGIC, L3D_NCCL_BLOB_VERSION, 0, 0, 0, 8, "8 bytes, not an nccl"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        len = blob(b, bad[i].magic, bad[i].version, bad[i].has_id, bad[i].inner_len, bad[i].inner);
        if (bad[i].cut) len = bad[i].cut;
        cr_assert_eq(l3d_nccl_blob_read(ctx, 3, b, len, &inner, &ilen, &has_id, id),
                     L3D_ERR_PEER_FAILED, "case %zu", i);
        cr_assert(strstr(l3d_ctx_last_error(ctx), "rank 3") &&
                  strstr(l3d_ctx_last_error(ctx), bad[i].says),
                  "case %zu: %s", i, l3d_ctx_last_error(ctx));
    }
    l3d_ctx_destroy(ctx);
}

Test(nccl, thread_worlds_are_refused) {
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    const l3d_transport_ops_t *ops = NULL;
    cr_assert_eq(l3d_transport_find(ctx, "nccl", &ops), L3D_OK);
    void *hub = NULL;
    l3d_transport_params_t p = {.rank = 0, .nranks = 2, .timeout_s = 10.0, .local_shared = &hub};
    l3d_transport_t tp = {.ops = ops, .ctx = ctx};
    cr_assert_eq(ops->init(&tp, &p), L3D_ERR_UNSUPPORTED);
    cr_assert(strstr(l3d_ctx_last_error(ctx), "local transport"), "%s", l3d_ctx_last_error(ctx));
    cr_assert_null(tp.priv);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), 0);
    l3d_ctx_destroy(ctx);
}

// A one-rank endpoint: init, its address (asked for its size first), connect to itself.
static l3d_status one_rank(l3d_ctx_t *ctx, l3d_transport_t *tp) {
    const l3d_transport_ops_t *ops = NULL;
    cr_assert_eq(l3d_transport_find(ctx, "nccl", &ops), L3D_OK);
    l3d_transport_params_t p = {.rank = 0, .nranks = 1, .timeout_s = 60.0};
    *tp = (l3d_transport_t){.ops = ops, .ctx = ctx};
    cr_assert_eq(ops->init(tp, &p), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    size_t len = 4;
    unsigned char small[4], addr[1024];
    cr_assert_eq(ops->addr_get(tp, small, &len), L3D_ERR_INVALID_ARG);
    cr_assert(len > sizeof(l3d_nccl_blob_t) && len <= sizeof(addr), "needs %zu", len);
    size_t need = len;
    len = sizeof(addr);
    cr_assert_eq(ops->addr_get(tp, addr, &len), L3D_OK);
    cr_assert_eq(len, need);
    cr_assert_eq(((l3d_nccl_blob_t *)addr)->has_id, 1);
    const void *addrs[1] = {addr};
    return ops->connect(tp, addrs, &len);
}

Test(nccl, without_a_gpu_connect_names_it_and_leaves_nothing) {
    if (have_gpu()) cr_skip_test("this machine has a GPU");
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_transport_t tp;
    cr_assert_eq(one_rank(ctx, &tp), L3D_ERR_UNSUPPORTED, "%s", l3d_ctx_last_error(ctx));
    cr_assert(strstr(l3d_ctx_last_error(ctx), "nccl: rank 0 has no GPU: "), "%s",
              l3d_ctx_last_error(ctx));
    tp.ops->fini(&tp);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), 0, "%zu", l3d_ctx_mem_in_use(ctx, NULL));
    l3d_ctx_destroy(ctx);
}

// ---- on a GPU -----------------------------------------------------------------------------------
// Waits for a request through `test` (bounded: 10 s).
static void wait_req(l3d_transport_t *tp, l3d_tp_request_t *r) {
    int done = 0;
    for (long i = 0; !done && i < 10000000; i++)
        cr_assert_eq(tp->ops->test(tp, r, &done, NULL), L3D_OK, "%s",
                     l3d_ctx_last_error(tp->ctx));
    cr_assert(done);
}

// Finite values of every sign and size in dtype dt (integers: any bits).
static void fill(unsigned char *h, l3d_dtype dt, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t k = (uint32_t)(i * 2654435761u);
        if (dt == L3D_FLOAT32) {
            float v = ((float)(k % 20001) - 10000.0f) * 0x1p-7f;
            memcpy(h + 4 * i, &v, 4);
        } else if (dt == L3D_BFLOAT16 || dt == L3D_FLOAT16) {
            // below the all-ones exponent (0x7f80 / 0x7c00): finite, either sign
            uint16_t v = (uint16_t)((k % (dt == L3D_BFLOAT16 ? 0x7f80u : 0x7c00u)) |
                                    (k & 0x80000000u ? 0x8000u : 0));
            memcpy(h + 2 * i, &v, 2);
        } else {
            for (size_t b = 0; b < l3d_dtype_size(dt); b++)
                h[i * l3d_dtype_size(dt) + b] = (unsigned char)(k >> (8 * (b % 4)));
        }
    }
}

Test(nccl, one_rank_collectives_on_device_memory) {
    if (!have_gpu()) cr_skip_test("no GPU");
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_transport_t tp;
    cr_assert_eq(one_rank(ctx, &tp), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    int version = l3d_nccl_priv(&tp)->lib.version;
    cr_log_info("NCCL %d.%d.%d", version / 10000, version / 100 % 100, version % 100);
    cudaStream_t user;
    cr_assert_eq(cudaStreamCreate(&user), cudaSuccess);
    tp.ops->set_stream(&tp, NULL, user);
    enum { N = 4099 };  // (not a multiple of any vector width)
    static unsigned char host[8 * N], back[8 * N];
    void *d_in, *d_out;
    cr_assert_eq(cudaMalloc(&d_in, sizeof(host)), cudaSuccess);
    cr_assert_eq(cudaMalloc(&d_out, sizeof(host)), cudaSuccess);
    int ranks[1] = {0};
    // (the reducing entries first: every op; alltoall twice, the second in place)
    l3d_tp_coll_fn fns[8] = {tp.ops->coll->allreduce, tp.ops->coll->reduce_scatter,
                             tp.ops->coll->reduce,    tp.ops->coll->allgather,
                             tp.ops->coll->broadcast, tp.ops->coll->alltoall,
                             tp.ops->coll->alltoall,  tp.ops->coll->barrier};
    for (int dt = 0; dt < L3D_DTYPE_COUNT; dt++)
        for (int f = 0; f < 8; f++)
            for (int op = 0; op < (f < 3 ? L3D_REDOP_COUNT : 1); op++) {
                size_t bytes = N * l3d_dtype_size((l3d_dtype)dt);
                fill(host, (l3d_dtype)dt, N);
                cr_assert_eq(cudaMemcpyAsync(d_in, host, bytes, cudaMemcpyHostToDevice, user),
                             cudaSuccess);
                cr_assert_eq(cudaMemsetAsync(d_out, 0xff, bytes, user), cudaSuccess);
                int in_place = f == 6, barrier = f == 7;
                l3d_tp_coll_args_t a = {.ranks = ranks, .n = 1, .me = 0, .seq = (uint64_t)f,
                                        .sendbuf = in_place ? d_out : d_in, .recvbuf = d_out,
                                        .count = barrier ? 0 : N, .dt = (l3d_dtype)dt,
                                        .op = (l3d_redop)op};
                if (in_place)
                    cr_assert_eq(cudaMemcpyAsync(d_out, host, bytes, cudaMemcpyHostToDevice, user),
                                 cudaSuccess);
                l3d_tp_request_t *r = NULL;
                cr_assert_eq(fns[f](&tp, &a, &r), L3D_OK, "%s", l3d_ctx_last_error(ctx));
                wait_req(&tp, r);
                if (barrier) continue;
                cr_assert_eq(cudaMemcpy(back, d_out, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
                cr_assert_eq(memcmp(back, host, bytes), 0, "dtype %d entry %d op %d", dt, f, op);
            }
    cudaFree(d_in);
    cudaFree(d_out);
    tp.ops->fini(&tp);
    cudaStreamDestroy(user);
    cr_assert_eq(l3d_ctx_mem_in_use(ctx, NULL), 0);
    l3d_ctx_destroy(ctx);
}

// An all-reduce captured in a CUDA graph on the user's stream: done at once when issued (its
// work is a node of the graph), then the graph replayed twice on new inputs, each result the
// input (one rank), bit for bit.
Test(nccl, one_rank_allreduce_in_a_cuda_graph) {
    if (!have_gpu()) cr_skip_test("no GPU");
    l3d_ctx_t *ctx;
    cr_assert_eq(l3d_ctx_create(NULL, &ctx), L3D_OK);
    l3d_transport_t tp;
    cr_assert_eq(one_rank(ctx, &tp), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    cudaStream_t user;
    cr_assert_eq(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
    tp.ops->set_stream(&tp, NULL, user);
    enum { N = 1 << 16 };
    static float host[N], back[N];
    float *d_in, *d_out;
    cr_assert_eq(cudaMalloc((void **)&d_in, sizeof(host)), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&d_out, sizeof(host)), cudaSuccess);
    int ranks[1] = {0};
    l3d_tp_coll_args_t a = {.ranks = ranks, .n = 1, .me = 0, .seq = 0, .sendbuf = d_in,
                            .recvbuf = d_out, .count = N, .dt = L3D_FLOAT32, .op = L3D_SUM};
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cr_assert_eq(cudaStreamBeginCapture(user, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    l3d_tp_request_t *r = NULL;
    cr_assert_eq(tp.ops->coll->allreduce(&tp, &a, &r), L3D_OK, "%s", l3d_ctx_last_error(ctx));
    int done = 0;
    cr_assert_eq(tp.ops->test(&tp, r, &done, NULL), L3D_OK);
    cr_assert(done, "a captured call is done when issued");
    cr_assert_eq(cudaStreamEndCapture(user, &graph), cudaSuccess);
    cr_assert_eq(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < N; i++) host[i] = (float)(i % 977) * 0.25f - (float)rep * 3.0f;
        cr_assert_eq(cudaMemcpy(d_in, host, sizeof(host), cudaMemcpyHostToDevice), cudaSuccess);
        cr_assert_eq(cudaMemset(d_out, 0xff, sizeof(host)), cudaSuccess);
        cr_assert_eq(cudaGraphLaunch(exec, user), cudaSuccess);
        cr_assert_eq(cudaStreamSynchronize(user), cudaSuccess);
        cr_assert_eq(cudaMemcpy(back, d_out, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
        cr_assert_eq(memcmp(back, host, sizeof(host)), 0, "replay %d", rep);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(d_in);
    cudaFree(d_out);
    tp.ops->fini(&tp);
    cudaStreamDestroy(user);
    l3d_ctx_destroy(ctx);
}
