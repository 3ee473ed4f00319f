// Communicators: creation (in-process and from the launch environment), split, destroy, abort,
// queries, point-to-point and groups. The collectives are in core/comm/coll_api.c.
//
// A world is one rank's transport endpoint plus what every communicator on it shares (tag
// layout, L3D_ALGO, the registration cache, failure knowledge). Communicators hold a counted
// reference to their world, so a split child may outlive its parent.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm/bootstrap.h"
#include "core/comm/comm_internal.h"
#include "platform/platform.h"

// ---- worlds -------------------------------------------------------------------------------------
static l3d_world_t *world_new(l3d_ctx_t *ctx, const l3d_transport_ops_t *ops) {
    l3d_world_t *w = l3d_calloc(ctx, 1, sizeof(*w), "comm");
    if (!w) return NULL;
    w->ctx = ctx;
    w->tp.ops = ops;
    w->tp.ctx = ctx;
    atomic_init(&w->refs, 0);
    w->first_dead = -1;
    w->next_comm_id = 1;  // 0 is the world communicator
    return w;
}

// After a successful init: capabilities, tags, overrides, failure notices.
static l3d_status world_setup(l3d_world_t *w, int rank, int size) {
    w->rank = rank;
    w->size = size;
    l3d_tp_caps(&w->tp, &w->caps);
    l3d_tag_layout_init(&w->tags, w->caps.tag_bits);
    if (w->caps.max_msg < 64) w->caps.max_msg = 64;
    const l3d_settings_t *set = l3d_ctx_settings(w->ctx);
    if (set->comm_max_msg > 0 && set->comm_max_msg < (double)w->caps.max_msg)
        w->caps.max_msg = (size_t)set->comm_max_msg;
    if (set->comm_max_inflight > 0 &&
        (w->caps.max_inflight <= 0 || set->comm_max_inflight < w->caps.max_inflight))
        w->caps.max_inflight = set->comm_max_inflight;
    L3D_CHECK(w->ctx, l3d_coll_parse_algo(w->ctx, l3d_ctx_settings(w->ctx)->algo, w->algo));
    L3D_CHECK(w->ctx, l3d_world_notices_start(w));
    return L3D_OK;
}

// Frees a world whose transport was initialised (inited) or not.
static void world_free(l3d_world_t *w, int inited) {
    // Failure notices still on their way out get a moment (bounded) before they are cancelled.
    if (inited) l3d_world_flush_notices(w, 0.1);
    l3d_world_notices_stop(w);
    l3d_world_scratch_release(w);
    l3d_world_mr_release(w);
    if (inited) w->tp.ops->fini(&w->tp);
    if (w->bootstrap && w->dead_epoch) l3d_bootstrap_set_drain(w->bootstrap, 0.25);
    if (w->bootstrap) l3d_bootstrap_destroy(w->bootstrap);
    l3d_free(w->ctx, w, sizeof(*w), "comm");
}

static void world_release(l3d_world_t *w) {
    if (atomic_fetch_sub(&w->refs, 1) == 1) world_free(w, 1);
}

static l3d_status comm_new(l3d_world_t *w, int *ranks, int size, int rank, uint32_t id,
                           l3d_comm_t **comm_p) {
    l3d_comm_t *c = l3d_calloc(w->ctx, 1, sizeof(*c), "comm");
    if (!c) return L3D_ERR_NOMEM;
    c->world = w;
    c->ctx = w->ctx;
    c->ranks = ranks;
    c->size = size;
    c->rank = rank;
    c->id = id;
    atomic_fetch_add(&w->refs, 1);
    *comm_p = c;
    return L3D_OK;
}

static int *identity_ranks(l3d_ctx_t *ctx, int n) {
    int *r = l3d_malloc(ctx, (size_t)n * sizeof(int), "comm");
    if (r)
        for (int i = 0; i < n; i++) r[i] = i;
    return r;
}

// ---- creation -----------------------------------------------------------------------------------
l3d_status l3d_comm_create_local(l3d_ctx_t *ctx, int nranks, l3d_comm_t **comms) {
    if (!ctx || !comms || nranks < 1)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_comm_create_local: %d ranks", nranks);
    const l3d_transport_ops_t *ops = NULL;
    L3D_CHECK(ctx, l3d_transport_find(ctx, "local", &ops));
    l3d_world_t **w = l3d_calloc(ctx, (size_t)nranks, sizeof(*w), "comm");
    if (!w) return L3D_ERR_NOMEM;
    void *hub = NULL;
    l3d_status st = L3D_OK;
    int inited = 0;
    for (; inited < nranks; inited++) {
        w[inited] = world_new(ctx, ops);
        if (!w[inited]) {
            st = L3D_ERR_NOMEM;
            goto fail;
        }
        l3d_transport_params_t p = {.rank = inited, .nranks = nranks, .local_rank = inited,
                                    .timeout_s = l3d_ctx_settings(ctx)->comm_timeout_s,
                                    .local_shared = &hub};
        st = ops->init(&w[inited]->tp, &p);
        if (st < 0) {
            world_free(w[inited], 0);
            w[inited] = NULL;
            goto fail;
        }
    }
    for (int i = 0; i < nranks; i++) L3D_CHECK_GOTO(ctx, world_setup(w[i], i, nranks), st, fail);
    for (int i = 0; i < nranks; i++) w[i]->oversubscribed = nranks > l3d_num_cores();
    for (int i = 0; i < nranks; i++) {
        int *ranks = identity_ranks(ctx, nranks);
        if (!ranks) {
            st = L3D_ERR_NOMEM;
            goto fail_comms;
        }
        st = comm_new(w[i], ranks, nranks, i, 0, &comms[i]);
        if (st < 0) {
            l3d_free(ctx, ranks, (size_t)nranks * sizeof(int), "comm");
            goto fail_comms;
        }
        continue;
    fail_comms:
        for (int j = 0; j < i; j++) l3d_comm_destroy(comms[j]);
        for (int j = i; j < nranks; j++) world_free(w[j], 1);
        l3d_free(ctx, w, (size_t)nranks * sizeof(*w), "comm");
        return st;
    }
    l3d_free(ctx, w, (size_t)nranks * sizeof(*w), "comm");
    if ((st = l3d_comm_shm_setup_local(comms, nranks)) < 0) {
        for (int i = 0; i < nranks; i++) {
            l3d_comm_destroy(comms[i]);
            comms[i] = NULL;
        }
        return st;
    }
    l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_COMM, "local world of %d ranks", nranks);
    return L3D_OK;
fail:
    for (int i = 0; i < inited; i++) world_free(w[i], 1);
    l3d_free(ctx, w, (size_t)nranks * sizeof(*w), "comm");
    return st;
}

// The transport for create_env: the argument, else L3D_TRANSPORT, else the first built one
// that is not "local".
static l3d_status pick_transport(l3d_ctx_t *ctx, const char *name, int size,
                                 const l3d_transport_ops_t **ops_p) {
    if (!name || !*name) name = l3d_ctx_settings(ctx)->transport;
    if (!name || !*name) {
        name = NULL;
        for (int i = 0; l3d_transport_backends[i]; i++)
            if (strcmp(l3d_transport_backends[i]->name, "local") != 0) {
                name = l3d_transport_backends[i]->name;
                break;
            }
        if (!name && size == 1) name = "local";
        if (!name)
            return l3d_error(ctx, L3D_ERR_UNSUPPORTED,
                             "no network transport is built in (only local, which is in-process); "
                             "rebuild with ucx or ofi (apt-get install libucx-dev libfabric-dev)");
    }
    if (!strcmp(name, "local") && size > 1)
        return l3d_error(ctx, L3D_ERR_UNSUPPORTED,
                         "transport local connects threads of one process, not a %d-process job; "
                         "use ucx or ofi (or l3d_comm_create_local)", size);
    return l3d_transport_find(ctx, name, ops_p);
}

l3d_status l3d_comm_create_env(l3d_ctx_t *ctx, const char *transport, l3d_comm_t **comm_p) {
    if (!ctx || !comm_p) return l3d_error(ctx, L3D_ERR_INVALID_ARG, "l3d_comm_create_env: NULL");
    double timeout = l3d_ctx_settings(ctx)->comm_timeout_s;
    l3d_launch_env_t env;
    L3D_CHECK(ctx, l3d_launch_env_read(ctx, &env));
    l3d_ctx_set_rank(ctx, env.rank);
    const l3d_transport_ops_t *ops = NULL;
    L3D_CHECK(ctx, pick_transport(ctx, transport, env.size, &ops));
    l3d_status st;
    l3d_world_t *w = world_new(ctx, ops);
    if (!w) return L3D_ERR_NOMEM;
    l3d_bootstrap_t *bs = NULL;
    L3D_CHECK_GOTO(ctx, l3d_bootstrap_create(ctx, &env, timeout, &bs), st, fail_world);
    w->bootstrap = bs;
    void *hub = NULL;  // a one-rank "local" world still needs a hub
    l3d_transport_params_t p = {.rank = env.rank, .nranks = env.size,
                                .local_rank = env.local_rank, .timeout_s = timeout,
                                .local_shared = strcmp(ops->name, "local") ? NULL : &hub};
    L3D_CHECK_GOTO(ctx, ops->init(&w->tp, &p), st, fail_world);
    char small[256];
    size_t len = sizeof(small);
    void *addr = small;
    st = l3d_tp_addr_get(&w->tp, small, &len);
    if (st == L3D_ERR_INVALID_ARG && len > sizeof(small)) {
        addr = l3d_malloc(ctx, len, "comm");
        if (!addr) {
            st = L3D_ERR_NOMEM;
            goto fail_tp;
        }
        st = l3d_tp_addr_get(&w->tp, addr, &len);
    }
    if (st < 0) goto fail_addr;
    void **all = NULL;
    size_t *lens = NULL;
    L3D_CHECK_GOTO(ctx, l3d_bootstrap_allgather(bs, "l3d.comm.addr", addr, len, &all, &lens), st,
                   fail_addr);
    st = l3d_tp_connect(&w->tp, (const void *const *)all, lens);
    l3d_bootstrap_free_all(bs, all, lens);
    if (st < 0) goto fail_addr;
    // Every endpoint is connected before anyone posts (the failure-notice receives).
    L3D_CHECK_GOTO(ctx, l3d_bootstrap_barrier(bs, "l3d.comm.connected"), st, fail_addr);
    if (addr != small) l3d_free(ctx, addr, len, "comm");
    addr = small;
    L3D_CHECK_GOTO(ctx, world_setup(w, env.rank, env.size), st, fail_tp);
    // Ranks on this node: the launcher's count, else (unknown) all of them.
    w->oversubscribed = (env.local_size > 0 ? env.local_size : env.size) > l3d_num_cores();
    int *ranks = identity_ranks(ctx, env.size);
    if (!ranks) {
        st = L3D_ERR_NOMEM;
        goto fail_tp;
    }
    st = comm_new(w, ranks, env.size, env.rank, 0, comm_p);
    if (st < 0) {
        l3d_free(ctx, ranks, (size_t)env.size * sizeof(int), "comm");
        goto fail_tp;
    }
    if ((st = l3d_comm_shm_setup_boot(*comm_p, bs)) < 0) {
        l3d_comm_destroy(*comm_p);  // releases the world too
        *comm_p = NULL;
        return st;
    }
    l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_COMM, "rank %d of %d over %s (launched by %s)", env.rank,
            env.size, ops->name, env.source);
    return L3D_OK;
fail_addr:
    if (addr != small) l3d_free(ctx, addr, len, "comm");
fail_tp:
    world_free(w, 1);
    return st;
fail_world:
    world_free(w, 0);
    return st;
}

// ---- split --------------------------------------------------------------------------------------
typedef struct split_row {
    int32_t color, key, next_id, rank;
} split_row_t;

static int split_cmp(const void *pa, const void *pb) {
    const split_row_t *a = pa, *b = pb;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

// The transport's part of a split (its entry is optional), on every member of the parent.
static l3d_status group_split(l3d_comm_t *parent, const l3d_tp_group_t *child) {
    l3d_transport_t *tp = &parent->world->tp;
    if (!tp->ops->group_split) return L3D_OK;
    l3d_tp_group_t pg = {parent->ranks, parent->size, parent->rank, parent->id};
    l3d_status st = tp->ops->group_split(tp, &pg, child);
    if (st < 0)
        return l3d_error(parent->ctx, st, "split: transport %s: %s", tp->ops->name,
                         l3d_ctx_last_error(tp->ctx));
    return L3D_OK;
}

l3d_status l3d_comm_split(l3d_comm_t *comm, int color, int key, l3d_comm_t **newcomm_p) {
    if (!comm || !newcomm_p) return L3D_ERR_INVALID_ARG;
    l3d_ctx_t *ctx = comm->ctx;
    l3d_world_t *w = comm->world;
    int n = comm->size;
    split_row_t mine = {color < 0 ? -1 : color, key, (int32_t)w->next_comm_id, comm->rank};
    split_row_t *all = l3d_malloc(ctx, (size_t)n * sizeof(*all), "comm");
    if (!all) return L3D_ERR_NOMEM;
    l3d_status st = l3d_comm_allgather(comm, &mine, all, 4, L3D_INT32);
    if (st < 0) {
        l3d_free(ctx, all, (size_t)n * sizeof(*all), "comm");
        return st;
    }
    // The new id is the largest next free id of any parent rank, so it is free everywhere.
    uint32_t id = 0;
    for (int i = 0; i < n; i++) id = L3D_MAX(id, (uint32_t)all[i].next_id);
    w->next_comm_id = id + 1;
    if (color < 0) {
        l3d_free(ctx, all, (size_t)n * sizeof(*all), "comm");
        *newcomm_p = NULL;
        // (a transport's own split is collective over the parent: this rank takes part)
        return group_split(comm, NULL);
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (all[i].color == mine.color) all[m++] = all[i];
    qsort(all, (size_t)m, sizeof(*all), split_cmp);
    int *ranks = l3d_malloc(ctx, (size_t)m * sizeof(int), "comm");
    if (!ranks) {
        l3d_free(ctx, all, (size_t)n * sizeof(*all), "comm");
        return L3D_ERR_NOMEM;
    }
    int me = -1;
    for (int i = 0; i < m; i++) {
        ranks[i] = comm->ranks[all[i].rank];
        if (all[i].rank == comm->rank) me = i;
    }
    l3d_free(ctx, all, (size_t)n * sizeof(*all), "comm");
    l3d_tp_group_t child = {ranks, m, me, id};
    if ((st = group_split(comm, &child)) < 0) {
        l3d_free(ctx, ranks, (size_t)m * sizeof(int), "comm");
        return st;
    }
    st = comm_new(w, ranks, m, me, id, newcomm_p);
    if (st < 0) {
        if (w->tp.ops->group_free) w->tp.ops->group_free(&w->tp, id);
        l3d_free(ctx, ranks, (size_t)m * sizeof(int), "comm");
        return st;
    }
    (*newcomm_p)->dev = comm->dev;  // a split's buffers live where its parent's do
    if ((st = l3d_comm_shm_setup(*newcomm_p)) < 0) {
        l3d_comm_destroy(*newcomm_p);
        *newcomm_p = NULL;
        return st;
    }
    l3d_log(ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM, "split: color %d key %d -> rank %d of %d, id %u",
            color, key, me, m, id);
    return L3D_OK;
}

// ---- queries, destroy, abort --------------------------------------------------------------------
int l3d_comm_rank(const l3d_comm_t *c) { return c ? c->rank : -1; }
int l3d_comm_size(const l3d_comm_t *c) { return c ? c->size : 0; }
const char *l3d_comm_transport_name(const l3d_comm_t *c) { return c ? c->world->tp.ops->name : ""; }
l3d_ctx_t *l3d_comm_ctx(const l3d_comm_t *c) { return c ? c->ctx : NULL; }

int l3d_comm_failure(const l3d_comm_t *c, char *buf, size_t len) {
    if (len) buf[0] = 0;
    if (!c || !len || !c->world->dead_epoch || c->world->first_dead < 0) return 0;
    snprintf(buf, len, "rank %d failed: %s", c->world->first_dead, c->world->dead_reason);
    return 1;
}

void l3d_comm_destroy(l3d_comm_t *c) {
    if (!c) return;
    l3d_comm_drop_requests(c);
    l3d_comm_shm_free(c);
    if (c->group) {
        l3d_sched_fini(c->group);
        l3d_free(c->ctx, c->group, sizeof(*c->group), "comm");
    }
    l3d_world_t *w = c->world;
    if (c->id && w->tp.ops->group_free) w->tp.ops->group_free(&w->tp, c->id);
    l3d_free(c->ctx, c->ranks, (size_t)c->size * sizeof(int), "comm");
    l3d_free(c->ctx, c, sizeof(*c), "comm");
    world_release(w);
}

void l3d_comm_abort(l3d_comm_t *c) {
    if (!c) return;
    l3d_world_t *w = c->world;
    char why[64];
    snprintf(why, sizeof(why), "rank %d aborted", w->rank);
    // If this rank is aborting because another one failed, say so first (notices to a peer
    // arrive in order): the peers must name the rank that failed, not the one that gave up.
    if (w->dead_epoch && w->first_dead >= 0 && w->first_dead != w->rank) {
        l3d_world_declare_dead(w, w->first_dead, w->dead_reason);
        snprintf(why, sizeof(why), "rank %d aborted after rank %d failed", w->rank,
                 w->first_dead);
    }
    l3d_world_notify(w, L3D_NOTICE_DEAD, w->rank, why);
    // Give the notices a moment to leave (bounded, ~20 ms): the transport abort may drop them.
    l3d_world_flush_notices(w, 0.02);
    l3d_tp_abort(&w->tp);
    l3d_world_mark_dead(w, w->rank, why);
    if (!c->failed) {
        c->failed = 1;
        c->fail_st = L3D_ERR_PEER_FAILED;
        snprintf(c->fail_detail, sizeof(c->fail_detail), "this rank aborted");
    }
}

// ---- point-to-point and groups ------------------------------------------------------------------
static l3d_status p2p_check(l3d_comm_t *c, const char *what, const void *buf, size_t count,
                            l3d_dtype dt, int peer) {
    if (!c) return L3D_ERR_INVALID_ARG;
    if ((unsigned)dt >= L3D_DTYPE_COUNT || peer < 0 || peer >= c->size || (count && !buf))
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "%s: peer %d of %d, dtype %d, count %zu",
                         what, peer, c->size, (int)dt, count);
    if (count > SIZE_MAX / 8)
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "%s: count %zu", what, count);
    return l3d_comm_check(c, what);
}

static uint64_t p2p_tag(const l3d_comm_t *c) {
    return l3d_tag_make(&c->world->tags, L3D_TAG_P2P, c->id, 0, 0);
}

// p2p_add on a communicator whose transport takes device buffers: a host buffer goes through
// a device temporary (comm_internal.h, "a transport that takes device buffers").
static void p2p_add_device(l3d_sched_t *s, l3d_comm_t *c, int send, void *buf, size_t bytes,
                           int peer) {
    const void *sbuf = send ? buf : NULL;
    void *rbuf = send ? NULL : buf, *host_recv = NULL;
    l3d_stage_call_device(s, c, &sbuf, send ? bytes : 0, &rbuf, send ? 0 : bytes, &host_recv);
    l3d_status st = s->st < 0 ? s->st : l3d_stage_order(c);
    if (st < 0) {
        s->st = st;
        return;
    }
    if (send) {
        l3d_sched_send(s, peer, 0, sbuf, bytes);
        return;
    }
    int op = l3d_sched_recv(s, peer, 0, rbuf, bytes);
    if (host_recv) l3d_sched_d2h(s, c, op, host_recv, rbuf, bytes);
}

// Adds one send or recv of `buf` to schedule s: a device buffer goes through a host copy
// (comm_internal.h, "device buffers"), unless the transport takes it as it is.
static void p2p_add(l3d_sched_t *s, l3d_comm_t *c, int send, void *buf, size_t bytes, int peer) {
    if (bytes && l3d_stage_device_p2p(c)) {
        p2p_add_device(s, c, send, buf, bytes, peer);
        return;
    }
    if (!bytes || !l3d_stage_needed(c, buf)) {
        if (send) l3d_sched_send(s, peer, 0, buf, bytes);
        else l3d_sched_recv(s, peer, 0, buf, bytes);
        return;
    }
    if (send) {
        void *h = l3d_stage_in(s, c, buf, bytes);
        if (h) l3d_sched_send(s, peer, 0, h, bytes);
        return;
    }
    void *h = l3d_stage_tmp(s, c->dev, bytes);
    if (!h) return;
    int op = l3d_sched_recv(s, peer, 0, h, bytes);
    l3d_sched_h2d(s, c, op, buf, h, bytes);
}

static l3d_status p2p_start(l3d_comm_t *c, int send, void *buf, size_t count, l3d_dtype dt,
                            int peer, l3d_request_t **req_p) {
    const char *what = send ? "send" : "recv";
    L3D_CHECK(c->ctx, p2p_check(c, what, buf, count, dt, peer));
    l3d_sched_t s;
    l3d_sched_init(&s, c);
    size_t bytes = count * l3d_dtype_size(dt);
    c->stats.calls++;
    if (send) c->stats.bytes += bytes;
    p2p_add(&s, c, send, buf, bytes, peer);
    return l3d_request_start(c, &s, what, p2p_tag(c), req_p);
}

l3d_status l3d_comm_isend(l3d_comm_t *c, const void *buf, size_t count, l3d_dtype dt, int peer,
                          l3d_request_t **req_p) {
    return p2p_start(c, 1, (void *)buf, count, dt, peer, req_p);
}

l3d_status l3d_comm_irecv(l3d_comm_t *c, void *buf, size_t count, l3d_dtype dt, int peer,
                          l3d_request_t **req_p) {
    return p2p_start(c, 0, buf, count, dt, peer, req_p);
}

static l3d_status p2p_blocking(l3d_comm_t *c, int send, void *buf, size_t count, l3d_dtype dt,
                               int peer) {
    if (c && c->in_group) {
        L3D_CHECK(c->ctx, p2p_check(c, send ? "send" : "recv", buf, count, dt, peer));
        size_t bytes = count * l3d_dtype_size(dt);
        c->stats.calls++;
        if (send) c->stats.bytes += bytes;
        p2p_add(c->group, c, send, buf, bytes, peer);
        return c->group->st;
    }
    l3d_request_t *r = NULL;
    L3D_CHECK(c ? c->ctx : NULL, p2p_start(c, send, buf, count, dt, peer, &r));
    return l3d_request_wait(r);
}

l3d_status l3d_comm_send(l3d_comm_t *c, const void *buf, size_t count, l3d_dtype dt, int peer) {
    return p2p_blocking(c, 1, (void *)buf, count, dt, peer);
}

l3d_status l3d_comm_recv(l3d_comm_t *c, void *buf, size_t count, l3d_dtype dt, int peer) {
    return p2p_blocking(c, 0, buf, count, dt, peer);
}

l3d_status l3d_comm_group_start(l3d_comm_t *c) {
    if (!c) return L3D_ERR_INVALID_ARG;
    if (c->in_group)
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "l3d_comm_group_start: groups do not nest");
    c->group = l3d_malloc(c->ctx, sizeof(*c->group), "comm");
    if (!c->group) return L3D_ERR_NOMEM;
    l3d_sched_init(c->group, c);
    l3d_sched_round(c->group);  // every op of the group runs concurrently in one round
    c->in_group = 1;
    return L3D_OK;
}

l3d_status l3d_comm_group_end(l3d_comm_t *c) {
    if (!c) return L3D_ERR_INVALID_ARG;
    if (!c->in_group)
        return l3d_error(c->ctx, L3D_ERR_INVALID_ARG, "l3d_comm_group_end without group_start");
    l3d_sched_t *s = c->group;
    c->group = NULL;
    c->in_group = 0;
    l3d_request_t *r = NULL;
    l3d_status st = l3d_comm_check(c, "group");
    if (st < 0) l3d_sched_fini(s);
    else st = l3d_request_start(c, s, "group", p2p_tag(c), &r);
    l3d_free(c->ctx, s, sizeof(*s), "comm");
    L3D_CHECK(c->ctx, st);
    return l3d_request_wait(r);
}

void l3d_comm_get_stats(const l3d_comm_t *c, l3d_comm_stats_t *s) {
    if (!s) return;
    if (!c) {
        memset(s, 0, sizeof(*s));
        return;
    }
    *s = c->stats;
}

void l3d_comm_reset_stats(l3d_comm_t *c) {
    if (c) memset(&c->stats, 0, sizeof(c->stats));
}
