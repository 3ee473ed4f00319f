// UCX transport (UCP tag API): lifetime, wiring, errors and the ops table.
// defines: l3d_ucx_transport_ops
//
// One UCP context and one single-threaded worker per rank; one endpoint per peer (self
// included). The sender's rank travels in the tag (see ucx_internal.h).
//
// Error modes. Endpoints to other hosts use UCP_ERR_HANDLING_MODE_PEER, whose error handler
// marks the peer failed. UCX 1.13 refuses that mode on shared memory and self, so endpoints to
// this host (when UCX_TLS allows shared memory) and to self use mode NONE, and the peer's
// liveness is checked by pid instead (ucx_addr.c). Same-host tcp peers do the same: PEER mode
// would work there but slows UCX 1.13's tcp rendezvous by a third.
//
// Settings are UCX's own (UCX_TLS, UCX_NET_DEVICES, ...), read by ucp_config_read; two defaults
// are adjusted on the config object (never with setenv) when the user has not set them:
//   UCX_NET_DEVICES=lo          when tcp may be used (UCX_TLS unset, "all", or naming tcp) and
//                               the job is on one host (MASTER_ADDR / L3D_MASTER_ADDR unset or
//                               a loopback address). UCX otherwise opens every interface, and
//                               a single-host job gains nothing from them.
//   UCX_KEEPALIVE_INTERVAL=2s   so a tcp peer whose host hangs is noticed in seconds rather than
//                               UCX's default 20 s (a killed process closes its sockets and is
//                               noticed at once anyway).
//   UCX_TLS                     when unset: posix,sysv,self for a single-host job (as above),
//                               ^cma otherwise. Same-host endpoints are in mode NONE (see
//                               below), and in that mode UCX 1.13's cma transport treats a failed
//                               process_vm_readv as fatal: a rank whose rendezvous peer was
//                               killed mid-transfer aborted with "process_vm_readv ... No such
//                               process" and a backtrace, and the others then blamed that live
//                               rank. Without cma, shared memory and tcp see a dead peer only as
//                               silence, and the pid watch (ucx_addr.c) reports it. Without cma
//                               UCX 1.13 gives a same-host rendezvous to tcp when tcp is allowed:
//                               2-3x slower than posix/sysv at 1-64 MiB here, and its flush at
//                               close fails with "Endpoint timeout" when the peer's worker is
//                               already gone, so a single-host job leaves tcp out.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/ucx/ucx_internal.h"

// ---- errors -------------------------------------------------------------------------------------
int l3d_ucx_is_peer_error(ucs_status_t s) {
    switch (s) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT:
        return 1;
    default:
        return 0;
    }
}

static l3d_status map_ucs(ucs_status_t s) {
    switch (s) {
    case UCS_OK:
        return L3D_OK;
    case UCS_INPROGRESS:
    case UCS_ERR_NO_RESOURCE:
        return L3D_INPROGRESS;
    case UCS_ERR_NO_MEMORY:
        return L3D_ERR_NOMEM;
    case UCS_ERR_INVALID_PARAM:
        return L3D_ERR_INVALID_ARG;
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
        return L3D_ERR_UNSUPPORTED;
    case UCS_ERR_MESSAGE_TRUNCATED:
        return L3D_ERR_INTERNAL;
    default:
        return L3D_ERR_SYSTEM;
    }
}

l3d_status l3d_ucx_error(l3d_ucx_t *u, int peer, ucs_status_t s, const char *what) {
    snprintf(u->last_ucs, sizeof(u->last_ucs), "%s", ucs_status_string(s));
    if (peer >= 0 && peer < u->nranks && (u->peers[peer].failed || l3d_ucx_is_peer_error(s))) {
        l3d_ucx_peer_fail(u, peer, ucs_status_string(s), L3D_LOG_WARN);
        snprintf(u->last_ucs, sizeof(u->last_ucs), "%s", u->peers[peer].why);
        return l3d_error(u->ctx, L3D_ERR_PEER_FAILED, "ucx: rank %d failed: %s (%s)", peer,
                         u->peers[peer].why, what);
    }
    l3d_status st = map_ucs(s);
    if (st == L3D_INPROGRESS || st == L3D_OK) st = L3D_ERR_INTERNAL;  // not an error: a bug here
    return l3d_error(u->ctx, st, "ucx: %s: %s", what, ucs_status_string(s));
}

void l3d_ucx_peer_fail(l3d_ucx_t *u, int peer, const char *why, l3d_log_level lvl) {
    l3d_ucx_peer_t *pp = &u->peers[peer];
    if (pp->failed) return;
    pp->failed = 1;
    snprintf(pp->why, sizeof(pp->why), "%s", why);
    u->need_sweep = 1;
    // In fini, peers closing their side first is the normal order of things.
    l3d_log(u->ctx, u->ctrl_off ? L3D_LOG_DEBUG : lvl, L3D_SUBSYS_COMM, "ucx: rank %d failed: %s",
            peer, why);
}

void l3d_ucx_peer_close(l3d_ucx_t *u, int peer, int force) {
    l3d_ucx_peer_t *pp = &u->peers[peer];
    if (!pp->ep) return;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    ucs_status_ptr_t sp = ucp_ep_close_nbx(pp->ep, &prm);
    pp->ep = NULL;
    // An error return still released the endpoint; nothing more to do for it.
    if (UCS_PTR_IS_PTR(sp)) {
        pp->close_req = sp;
        u->nclosing++;
    }
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t s) {
    l3d_ucx_peer_t *pp = arg;
    snprintf(pp->u->last_ucs, sizeof(pp->u->last_ucs), "%s", ucs_status_string(s));
    l3d_ucx_peer_fail(pp->u, pp->rank, ucs_status_string(s), L3D_LOG_WARN);
}

// ---- configuration ------------------------------------------------------------------------------
static int tls_may_use_tcp(const char *tls) {
    if (!tls || !*tls || strstr(tls, "all")) return 1;
    if (tls[0] == '^') return strstr(tls, "tcp") == NULL;  // "^a,b": everything except a, b
    return strstr(tls, "tcp") != NULL;
}

static int is_loopback_host(const char *h) {
    return !h || !*h || !strncmp(h, "127.", 4) || !strcmp(h, "localhost") || !strcmp(h, "::1");
}

// Whether every rank is on this host: the rendezvous address is a loopback one (or unset).
static int single_host_job(void) {
    const char *master = getenv("L3D_MASTER_ADDR");
    if (!master || !*master) master = getenv("MASTER_ADDR");
    return is_loopback_host(master);
}

// UCX_TLS as the user set it, else the default config_tune gives it.
static const char *effective_tls(void) {
    const char *tls = getenv("UCX_TLS");
    return tls ? tls : single_host_job() ? "posix,sysv,self" : "^cma";
}

static l3d_status config_tune(l3d_ucx_t *u, ucp_config_t *cfg) {
    const char *tls = getenv("UCX_TLS");
    if (!getenv("UCX_NET_DEVICES") && tls_may_use_tcp(effective_tls()) && single_host_job()) {
        L3D_UCS_CHECK(u, ucp_config_modify(cfg, "NET_DEVICES", "lo"),
                      "setting NET_DEVICES to lo");
        l3d_log(u->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM,
                "ucx: single-host job, tcp pinned to the loopback interface");
    }
    if (!tls) {
        L3D_UCS_CHECK(u, ucp_config_modify(cfg, "TLS", effective_tls()), "setting TLS");
    } else if (l3d_ucx_tls_allows(tls, "cma")) {
        l3d_log(u->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "ucx: UCX_TLS=%s allows cma, which "
                "aborts this process if a same-host peer dies during a transfer (UCX 1.13); "
                "leave UCX_TLS unset or exclude cma", tls);
    }
    if (!getenv("UCX_KEEPALIVE_INTERVAL"))
        L3D_UCS_CHECK(u, ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "2s"),
                      "setting KEEPALIVE_INTERVAL");
    return L3D_OK;
}

// Rough alpha/beta of the transports (see the brief's figures for this machine class).
static void hints_set(l3d_ucx_t *u, int tcp) {
    u->latency_us = tcp ? 15.0 : 0.5;
    u->bandwidth_gbs = tcp ? 3.0 : 5.0;
}

// Before connect: guess from UCX_TLS (tcp unless only shared-memory transports are allowed).
static void hints_from_env(l3d_ucx_t *u) { hints_set(u, tls_may_use_tcp(effective_tls())); }

// After connect: the lanes UCX chose for an endpoint to another rank tell which wire it uses.
static void hints_from_ep(l3d_ucx_t *u) {
    if (u->nranks < 2) return;
    ucp_ep_h ep = u->peers[(u->rank + 1) % u->nranks].ep;
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (!f) return;
    ucp_ep_print_info(ep, f);
    fclose(f);
    if (text) {
        if (strstr(text, "tcp/")) hints_set(u, 1);
        else if (strstr(text, "posix/") || strstr(text, "sysv/") || strstr(text, "cma/"))
            hints_set(u, 0);
        free(text);  // open_memstream's buffer comes from malloc
    }
}

// ---- lifetime -----------------------------------------------------------------------------------
static l3d_status ucx_init(l3d_transport_t *tp, const l3d_transport_params_t *p) {
    l3d_ctx_t *ctx = tp->ctx;
    if (!p || p->nranks < 1 || p->nranks > L3D_UCX_MAX_RANKS || p->rank < 0 ||
        p->rank >= p->nranks)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "ucx: rank %d of %d is not a valid place "
                         "(at most %d ranks)", p ? p->rank : -1, p ? p->nranks : 0,
                         L3D_UCX_MAX_RANKS);
    l3d_status st = L3D_OK;
    l3d_ucx_t *u = l3d_calloc(ctx, 1, sizeof(*u), L3D_UCX_MEM_TAG);
    if (!u) return L3D_ERR_NOMEM;
    u->ctx = ctx;
    u->rank = p->rank;
    u->nranks = p->nranks;
    u->timeout_s = p->timeout_s > 0 ? p->timeout_s : l3d_ctx_settings(ctx)->comm_timeout_s;
    u->pending.next = u->pending.prev = &u->pending;
    u->ctrl_msg[0] = L3D_UCX_CTRL_ABORT;
    u->ctrl_msg[1] = L3D_UCX_CTRL_BYE;
    u->peers = l3d_calloc(ctx, (size_t)p->nranks, sizeof(*u->peers), L3D_UCX_MEM_TAG);
    if (!u->peers) {
        st = L3D_ERR_NOMEM;
        goto undo_alloc;
    }
    for (int i = 0; i < p->nranks; i++) {
        u->peers[i].u = u;
        u->peers[i].rank = i;
        snprintf(u->peers[i].why, sizeof(u->peers[i].why), "not connected");
    }

    ucp_config_t *cfg = NULL;
    L3D_UCS_CHECK_GOTO(u, ucp_config_read(NULL, NULL, &cfg), "reading the ucx configuration",
                       st, undo_alloc);
    st = config_tune(u, cfg);
    if (st != L3D_OK) {
        ucp_config_release(cfg);
        goto undo_alloc;
    }
    ucp_params_t prm = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_TAG,
        .estimated_num_eps = (size_t)p->nranks,
        .mt_workers_shared = 0,
    };
    ucs_status_t s = ucp_init(&prm, cfg, &u->context);
    ucp_config_release(cfg);
    L3D_UCS_CHECK_GOTO(u, s, "ucp_init (check UCX_TLS and UCX_NET_DEVICES)", st, undo_alloc);

    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    L3D_UCS_CHECK_GOTO(u, ucp_worker_create(u->context, &wp, &u->worker),
                       "creating the ucx worker", st, undo_context);
    L3D_UCS_CHECK_GOTO(u, ucp_worker_get_address(u->worker, &u->addr, &u->addr_len),
                       "getting the worker address", st, undo_worker);
    hints_from_env(u);
    l3d_ucx_hdr_fill(&u->hdr);
    l3d_ucx_ctrl_post(u);
    tp->priv = u;
    return L3D_OK;

undo_worker:
    ucp_worker_destroy(u->worker);
undo_context:
    ucp_cleanup(u->context);
undo_alloc:
    if (u->peers) l3d_free(ctx, u->peers, (size_t)p->nranks * sizeof(*u->peers), L3D_UCX_MEM_TAG);
    l3d_free(ctx, u, sizeof(*u), L3D_UCX_MEM_TAG);
    return st;
}

// Flushes every endpoint (only_sent: those with sends since their last flush) together,
// progressing until all finish or `deadline` passes. Returns the rank whose flush failed or
// did not finish (-1: all done), with its status.
static int flush_all(l3d_ucx_t *u, void **reqs, int only_sent, double deadline,
                     ucs_status_t *s_p) {
    int n = u->nranks;
    for (int i = 0; i < n; i++) {
        reqs[i] = NULL;
        if (!u->peers[i].ep || (only_sent && !u->peers[i].sent)) continue;
        u->peers[i].sent = 0;
        ucp_request_param_t prm = {.op_attr_mask = 0};
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(u->peers[i].ep, &prm);
        if (UCS_PTR_IS_ERR(sp)) {
            *s_p = UCS_PTR_STATUS(sp);
            for (int j = 0; j < i; j++)
                if (reqs[j]) ucp_request_free(reqs[j]);
            return i;
        }
        reqs[i] = sp;
    }
    int left = 0, bad = -1;
    *s_p = UCS_OK;
    do {
        l3d_ucx_progress_all(u);
        left = 0;
        for (int i = 0; i < n; i++) {
            if (!reqs[i]) continue;
            ucs_status_t s = ucp_request_check_status(reqs[i]);
            if (s == UCS_INPROGRESS) {
                left++;
                continue;
            }
            ucp_request_free(reqs[i]);
            reqs[i] = NULL;
            if (s != UCS_OK && bad < 0) {
                bad = i;
                *s_p = s;
            }
        }
        for (int i = 0; i < n && bad < 0; i++)
            if (u->peers[i].failed) {
                bad = i;
                *s_p = UCS_ERR_UNREACHABLE;
            }
    } while (left && bad < 0 && l3d_ucx_now() < deadline);
    for (int i = 0; i < n; i++) {
        if (!reqs[i]) continue;
        if (bad < 0) {
            bad = i;
            *s_p = UCS_ERR_TIMED_OUT;
        }
        ucp_request_free(reqs[i]);  // released by UCX when the endpoint closes
        reqs[i] = NULL;
    }
    return bad;
}

static l3d_status ucx_connect(l3d_transport_t *tp, const void *const *addrs,
                              const size_t *lens) {
    l3d_ucx_t *u = tp->priv;
    l3d_status st = L3D_OK;
    if (u->connected) return l3d_error(u->ctx, L3D_ERR_INVALID_ARG, "ucx: already connected");
    for (int i = 0; i < u->nranks; i++) {
        l3d_ucx_addr_hdr_t h;
        if (!addrs || !lens || !addrs[i] || lens[i] <= sizeof(h))
            return l3d_error(u->ctx, L3D_ERR_INVALID_ARG, "ucx: rank %d's address is too short "
                             "(%zu bytes)", i, lens && addrs && addrs[i] ? lens[i] : 0);
        memcpy(&h, addrs[i], sizeof(h));
        if (h.magic != L3D_UCX_ADDR_MAGIC)
            return l3d_error(u->ctx, L3D_ERR_INVALID_ARG, "ucx: rank %d's address is not a ucx "
                             "transport address (another transport or version?)", i);
    }
    u->nwatch = 0;
    for (int i = 0; i < u->nranks; i++) {
        l3d_ucx_peer_t *pp = &u->peers[i];
        l3d_ucx_addr_hdr_t h;
        memcpy(&h, addrs[i], sizeof(h));
        // Self and shared-memory peers cannot have PEER mode in UCX 1.13 (see the file top);
        // same-host tcp peers could, but PEER mode costs tcp about a third of its bandwidth
        // here (2.2 vs 3.3 GB/s at 64 MiB), and a same-host peer's death is seen by pid.
        int same_host = l3d_ucx_hdr_same_host(&u->hdr, &h);
        pp->err_mode_peer = i != u->rank && !same_host;
        pp->watch = i != u->rank && !pp->err_mode_peer;
        pp->pid = h.pid;
        pp->start_time = h.start_time;
        u->nwatch += pp->watch;
        ucp_ep_params_t ep = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
            .address = (const ucp_address_t *)((const char *)addrs[i] + sizeof(h)),
            .err_mode = pp->err_mode_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE,
        };
        if (pp->err_mode_peer) {
            ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep.err_handler = (ucp_err_handler_t){.cb = ep_err_cb, .arg = pp};
        }
        ucs_status_t s = ucp_ep_create(u->worker, &ep, &pp->ep);
        if (s != UCS_OK) {
            pp->ep = NULL;
            st = l3d_ucx_error(u, i, s, "creating the endpoint");
            goto undo_eps;
        }
        snprintf(pp->why, sizeof(pp->why), "unknown");
    }
    u->connected = 1;
    // Endpoints wire up lazily; flushing them now (every rank does so at the same time) does
    // the handshakes here, under the timeout, instead of inside the first collective.
    void **reqs = l3d_calloc(u->ctx, (size_t)u->nranks, sizeof(void *), L3D_UCX_MEM_TAG);
    if (!reqs) {
        st = L3D_ERR_NOMEM;
        goto undo_eps;
    }
    ucs_status_t s = UCS_OK;
    int bad = flush_all(u, reqs, 0, l3d_ucx_now() + u->timeout_s, &s);
    l3d_free(u->ctx, reqs, (size_t)u->nranks * sizeof(void *), L3D_UCX_MEM_TAG);
    if (bad >= 0) {
        if (s == UCS_ERR_TIMED_OUT)
            st = l3d_error(u->ctx, L3D_ERR_TIMEOUT, "ucx: connecting to rank %d did not finish "
                           "within %.0f s (is it running and connecting too?)", bad,
                           u->timeout_s);
        else
            st = l3d_ucx_error(u, bad, s, "connecting");
        goto undo_eps;
    }
    hints_from_ep(u);
    return L3D_OK;

undo_eps:
    u->connected = 0;
    for (int i = 0; i < u->nranks; i++) l3d_ucx_peer_close(u, i, 1);
    double deadline = l3d_ucx_now() + 1.0;
    while (u->nclosing && l3d_ucx_now() < deadline) l3d_ucx_progress_all(u);
    for (int i = 0; i < u->nranks; i++) u->peers[i].failed = u->peers[i].watch = 0;
    u->nwatch = 0;
    return st;
}

// Sends the control notice `msg` (a tiny eager message to the peers' control receive) to every
// live peer and progresses until it left or `secs` passed (best effort).
static void notify_peers(l3d_ucx_t *u, const uint64_t *msg, double secs) {
    int n = u->nranks, left = 0;
    void **reqs = l3d_calloc(u->ctx, (size_t)n, sizeof(void *), L3D_UCX_MEM_TAG);
    if (!reqs) return;
    for (int i = 0; i < n; i++) {
        l3d_ucx_peer_t *pp = &u->peers[i];
        if (i == u->rank || !pp->ep || pp->failed) continue;
        ucp_request_param_t prm = {.op_attr_mask = 0};
        ucs_status_ptr_t sp = ucp_tag_send_nbx(pp->ep, msg, sizeof(*msg),
                                               L3D_UCX_CTRL_BIT | l3d_ucx_tag(u->rank, 0), &prm);
        pp->sent = 1;
        if (UCS_PTR_IS_PTR(sp)) {
            reqs[i] = sp;
            left++;
        }
    }
    double deadline = l3d_ucx_now() + secs;
    while (left && l3d_ucx_now() < deadline) {
        l3d_ucx_progress_all(u);
        left = 0;
        for (int i = 0; i < n; i++) {
            if (!reqs[i]) continue;
            if (ucp_request_check_status(reqs[i]) == UCS_INPROGRESS) {
                left++;
            } else {
                ucp_request_free(reqs[i]);
                reqs[i] = NULL;
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (reqs[i]) ucp_request_free(reqs[i]);  // released by UCX when the endpoint closes
    l3d_free(u->ctx, reqs, (size_t)n * sizeof(void *), L3D_UCX_MEM_TAG);
}

static void ucx_abort(l3d_transport_t *tp) {
    l3d_ucx_t *u = tp->priv;
    if (!u || u->aborted) return;
    u->aborted = 1;
    if (!u->connected) return;
    // Tell every live peer first, so it fails fast even over shared memory, where nothing
    // else reports a closed endpoint. Bounded: abort is non-blocking in spirit.
    notify_peers(u, &u->ctrl_msg[0], 0.1);
    int n = u->nranks;
    // Forced closes end our pending sends; the sweep cancels the receives.
    for (int i = 0; i < n; i++) {
        if (!u->peers[i].failed) {
            u->peers[i].failed = 1;
            snprintf(u->peers[i].why, sizeof(u->peers[i].why), "this rank aborted");
        }
        l3d_ucx_peer_close(u, i, 1);
    }
    l3d_ucx_reqs_cancel_recvs(u);
    l3d_ucx_progress_all(u);
}

static void ucx_fini(l3d_transport_t *tp) {
    l3d_ucx_t *u = tp->priv;
    if (!u) return;
    l3d_ctx_t *ctx = u->ctx;
    u->ctrl_off = 1;
    l3d_ucx_reqs_cancel_recvs(u);
    // Say goodbye (a peer still waiting on us then fails at once instead of at its timeout).
    // Sends reported done may still sit in a tcp send buffer: flush the endpoints that carried
    // sends briefly so the last message of a collective reaches its peer, then close (a
    // graceful close of a PEER-mode endpoint waits on the peer; fini must not block on a dead
    // one).
    if (u->connected && !u->aborted) {
        notify_peers(u, &u->ctrl_msg[1], 0.0);
        void **reqs = l3d_calloc(ctx, (size_t)u->nranks, sizeof(void *), L3D_UCX_MEM_TAG);
        if (reqs) {
            ucs_status_t s;
            double secs = u->timeout_s < 2.0 ? u->timeout_s : 2.0;
            (void)flush_all(u, reqs, 1, l3d_ucx_now() + secs, &s);
            l3d_free(ctx, reqs, (size_t)u->nranks * sizeof(void *), L3D_UCX_MEM_TAG);
        }
    }
    // A forced close needs PEER mode on both sides; a NONE-mode (shared memory, self) endpoint
    // to a live peer closes in flush mode, which for shared memory needs no answer.
    for (int i = 0; i < u->nranks; i++) {
        l3d_ucx_peer_t *pp = &u->peers[i];
        l3d_ucx_peer_close(u, i, pp->err_mode_peer || pp->failed);
    }
    double deadline = l3d_ucx_now() + 1.0;
    while ((u->nclosing || l3d_ucx_reqs_busy(u)) && l3d_ucx_now() < deadline)
        l3d_ucx_progress_all(u);
    // Only now: a peer's BYE that arrived while we flushed and closed was consumed above
    // instead of lingering as an unmatched message that UCX warns about at worker destroy.
    l3d_ucx_ctrl_cancel(u);
    for (int i = 0; i < u->nranks; i++)
        if (u->peers[i].close_req) ucp_request_free(u->peers[i].close_req);
    ucp_worker_release_address(u->worker, u->addr);
    ucp_worker_destroy(u->worker);
    ucp_cleanup(u->context);
    // Only now: a request UCX still held could have called back into ours until the worker went.
    l3d_ucx_reqs_free_all(u);
    l3d_free(ctx, u->peers, (size_t)u->nranks * sizeof(*u->peers), L3D_UCX_MEM_TAG);
    l3d_free(ctx, u, sizeof(*u), L3D_UCX_MEM_TAG);
    tp->priv = NULL;
}

static void ucx_caps(const l3d_transport_t *tp, l3d_transport_caps_t *caps) {
    const l3d_ucx_t *u = tp->priv;
    caps->ptr_support = L3D_PTR_HOST;
    caps->needs_mr = 0;
    caps->max_msg = (size_t)1 << 30;
    caps->max_inflight = 64;
    caps->tag_bits = L3D_UCX_TAG_BITS;
    caps->latency_us = u ? u->latency_us : 15.0;
    caps->bandwidth_gbs = u ? u->bandwidth_gbs : 3.0;
}

static l3d_status ucx_addr_get(l3d_transport_t *tp, void *buf, size_t *len_p) {
    l3d_ucx_t *u = tp->priv;
    size_t need = sizeof(u->hdr) + u->addr_len;
    if (!buf || *len_p < need) {
        size_t have = *len_p;
        *len_p = need;
        return l3d_error(u->ctx, L3D_ERR_INVALID_ARG, "ucx: the address needs %zu bytes, the "
                         "buffer has %zu", need, buf ? have : 0);
    }
    memcpy(buf, &u->hdr, sizeof(u->hdr));
    memcpy((char *)buf + sizeof(u->hdr), u->addr, u->addr_len);
    *len_p = need;
    return L3D_OK;
}

static const char *ucx_strerror(const l3d_transport_t *tp) {
    const l3d_ucx_t *u = tp->priv;
    return u ? u->last_ucs : "";
}

const l3d_transport_ops_t l3d_ucx_transport_ops = {
    .abi_version = L3D_TRANSPORT_ABI_VERSION,
    .size = sizeof(l3d_transport_ops_t),
    .name = "ucx",
    .init = ucx_init,
    .fini = ucx_fini,
    .caps = ucx_caps,
    .addr_get = ucx_addr_get,
    .connect = ucx_connect,
    .mr_reg = NULL,
    .mr_dereg = NULL,
    .isend = l3d_ucx_isend,
    .irecv = l3d_ucx_irecv,
    .test = l3d_ucx_test,
    .progress = l3d_ucx_progress,
    .cancel = l3d_ucx_cancel,
    .abort = ucx_abort,
    .strerror = ucx_strerror,
    .coll = NULL,
};
