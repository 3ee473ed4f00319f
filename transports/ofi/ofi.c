// The libfabric (OFI) transport: lifetime, wiring and memory registration. Point-to-point and
// the completion queue are in ofi_p2p.c.
// defines: l3d_ofi_transport_ops, l3d_ofi_fail, l3d_ofi_status
//
// Provider choice. libfabric's own FI_PROVIDER filters fi_getinfo for the whole process, so we
// pass no provider name: with FI_PROVIDER unset the transport takes libfabric's first RDM +
// tagged match (here "tcp;ofi_rxm" on the first interface); FI_PROVIDER=shm for one node,
// FI_PROVIDER="tcp;ofi_rxm" across nodes. node is NULL: the tcp provider binds the first
// interface it lists unless FI_TCP_IFACE names one (FI_TCP_IFACE=lo keeps a one-node job on
// loopback). shm would name each endpoint's /dev/shm region "<pid>:<uid>:<index>", which a
// dead process's leftover blocks once its pid is reused (EBUSY): ofi_shm.c sets a name no
// other process can hold with fi_setname before fi_enable, and removes our dead processes'
// regions (a shared node name in fi_getinfo would collide: EBUSY).
//
// connect only inserts addresses (RDM needs no handshake, and a blocking one would deadlock a
// single thread driving several endpoints). Dead peers: see ofi_peer.c and ofi_p2p.c.
//
// Progress is driven by the caller: every isend/irecv retry, test, progress and cancel reads
// the CQ (libfabric's manual data progress needs both sides polling).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/ofi/ofi_internal.h"

#define OFI_BLOB_MAGIC "L3DO"
#define OFI_BLOB_VERSION 1
// magic(4) version(1) provlen(1) addrlen(2, little-endian), then the provider name, the
// fi_getname address and the process identity (L3D_OFI_IDENT_LEN, see ofi_peer.c).
#define OFI_BLOB_HDR 8

l3d_status l3d_ofi_status(int fi_err) {
    switch (fi_err) {
    case FI_ENOMEM:
        return L3D_ERR_NOMEM;
    case FI_ENODATA:
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
        return L3D_ERR_UNSUPPORTED;
    case FI_ETRUNC:
    case FI_EINVAL:
    case FI_EBADF:
        return L3D_ERR_INTERNAL;
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_ESHUTDOWN:
    case FI_ETIMEDOUT:
    case FI_EADDRNOTAVAIL:
    case FI_EIO:
    case FI_EREMOTEIO:
        return L3D_ERR_PEER_FAILED;
    default:
        return L3D_ERR_SYSTEM;
    }
}

l3d_status l3d_ofi_fail(l3d_ofi_t *o, ssize_t ret, const char *what, const char *file, int line) {
    int e = (int)(ret < 0 ? -ret : ret);
    l3d_status st = l3d_ofi_status(e);
    snprintf(o->errtext, sizeof(o->errtext), "%s", fi_strerror(e));
    l3d_check_trace(o->ctx, st, file, line);
    return l3d_error(o->ctx, st, "ofi: rank %d: %s failed: %s (provider %s)", o->rank, what,
                     o->errtext, o->prov[0] ? o->prov : "none");
}

// Cost-model hints per provider family (measured on the build machines for shm and tcp).
static void ofi_provider_hints(const char *prov, double *lat_us, double *bw_gbs) {
    *lat_us = 20.0;
    *bw_gbs = 1.0;
    if (!strncmp(prov, "shm", 3)) {
        *lat_us = 1.0;
        *bw_gbs = 4.0;
    } else if (strstr(prov, "tcp") || strstr(prov, "net")) {
        *lat_us = 20.0;
        *bw_gbs = 3.0;
    } else if (strstr(prov, "sockets") || strstr(prov, "udp")) {
        *lat_us = 30.0;
        *bw_gbs = 1.0;
    } else if (strstr(prov, "verbs") || strstr(prov, "efa") || strstr(prov, "psm") ||
               strstr(prov, "cxi") || strstr(prov, "opx")) {
        *lat_us = 2.0;
        *bw_gbs = 10.0;
    }
}

static struct fi_info *ofi_hints(int directed) {
    struct fi_info *h = fi_allocinfo();
    if (!h) return NULL;
    h->caps = FI_TAGGED | FI_SEND | FI_RECV | (directed ? FI_DIRECTED_RECV : 0);
    // Every op carries a struct fi_context2, which also satisfies FI_CONTEXT.
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    // What we can honour; the provider's answer decides what we do (needs_mr, bind, keys).
    h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                              FI_MR_ENDPOINT;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->domain_attr->av_type = FI_AV_TABLE;
    // Same (source, tag) messages must match in posting order.
    h->tx_attr->msg_order = FI_ORDER_SAS;
    h->rx_attr->msg_order = FI_ORDER_SAS;
    return h;
}

static void ofi_close_fid(l3d_ofi_t *o, struct fid *f, const char *what) {
    if (!f) return;
    int ret = fi_close(f);
    if (ret)
        l3d_log(o->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "ofi: rank %d: closing the %s: %s", o->rank,
                what, fi_strerror(-ret));
}

// Closes what init opened, in reverse order; safe on a partly built endpoint.
static void ofi_teardown(l3d_ofi_t *o) {
    for (l3d_ofi_mr_t *m = o->mrs.next; m != &o->mrs;) {
        l3d_ofi_mr_t *n = m->next;
        if (m->mr) ofi_close_fid(o, &m->mr->fid, "memory registration");
        l3d_free(o->ctx, m, sizeof(*m), L3D_OFI_ALLOC_TAG);
        m = n;
    }
    o->mrs.next = o->mrs.prev = &o->mrs;
    if (o->ep && !o->ep_closed) ofi_close_fid(o, &o->ep->fid, "endpoint");
    o->ep_closed = 1;
    o->ep = NULL;
    // The endpoint is gone, so the provider holds no request any more.
    l3d_ofi_free_all(o);
    ofi_close_fid(o, o->av ? &o->av->fid : NULL, "address vector");
    ofi_close_fid(o, o->cq ? &o->cq->fid : NULL, "completion queue");
    ofi_close_fid(o, o->domain ? &o->domain->fid : NULL, "domain");
    ofi_close_fid(o, o->fabric ? &o->fabric->fid : NULL, "fabric");
    if (o->info) fi_freeinfo(o->info);
    size_t n = (size_t)o->nranks;
    if (o->addrs) l3d_free(o->ctx, o->addrs, n * sizeof(*o->addrs), L3D_OFI_ALLOC_TAG);
    if (o->peer_dead) l3d_free(o->ctx, o->peer_dead, n, L3D_OFI_ALLOC_TAG);
    if (o->peer_why) l3d_free(o->ctx, o->peer_why, n * sizeof(*o->peer_why), L3D_OFI_ALLOC_TAG);
    if (o->peers) l3d_free(o->ctx, o->peers, n * sizeof(*o->peers), L3D_OFI_ALLOC_TAG);
    l3d_free(o->ctx, o, sizeof(*o), L3D_OFI_ALLOC_TAG);
}

static l3d_status ofi_getinfo(l3d_ofi_t *o) {
    // First with FI_DIRECTED_RECV; the tag carries the source rank, so it is only a bonus.
    for (int directed = 1; directed >= 0; directed--) {
        struct fi_info *hints = ofi_hints(directed);
        if (!hints) return l3d_error(o->ctx, L3D_ERR_NOMEM, "ofi: fi_allocinfo failed");
        int ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &o->info);
        fi_freeinfo(hints);
        if (ret == 0) return L3D_OK;
        if (ret != -FI_ENODATA || !directed) {
            const char *fp = getenv("FI_PROVIDER");
            snprintf(o->errtext, sizeof(o->errtext), "%s", fi_strerror(-ret));
            return l3d_error(o->ctx, l3d_ofi_status(-ret),
                             "ofi: rank %d: no libfabric provider offers reliable tagged "
                             "messages (FI_PROVIDER %s): fi_getinfo: %s; try FI_PROVIDER=shm "
                             "or FI_PROVIDER=\"tcp;ofi_rxm\" (fi_info -l lists them)",
                             o->rank, fp ? fp : "unset", o->errtext);
        }
    }
    return L3D_ERR_INTERNAL;
}

static l3d_status ofi_open(l3d_ofi_t *o) {
    struct fi_info *info = o->info;
    snprintf(o->prov, sizeof(o->prov), "%s", info->fabric_attr->prov_name);
    uint64_t mr_mode = (uint64_t)info->domain_attr->mr_mode;
    o->directed = (info->caps & FI_DIRECTED_RECV) != 0;
    o->needs_mr = (mr_mode & FI_MR_LOCAL) != 0;
    o->mr_endpoint = (mr_mode & FI_MR_ENDPOINT) != 0;
    o->mr_prov_key = (mr_mode & FI_MR_PROV_KEY) != 0;
    o->max_msg = info->ep_attr->max_msg_size;
    o->tx_size = info->tx_attr->size;
    o->rx_size = info->rx_attr->size;

    L3D_FI_CHECK(o, fi_fabric(info->fabric_attr, &o->fabric, NULL), "fi_fabric");
    L3D_FI_CHECK(o, fi_domain(o->fabric, info, &o->domain, NULL), "fi_domain");
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = (size_t)o->nranks};
    L3D_FI_CHECK(o, fi_av_open(o->domain, &av_attr, &o->av, NULL), "fi_av_open");
    struct fi_cq_attr cq_attr = {
        .format = FI_CQ_FORMAT_TAGGED,
        .wait_obj = FI_WAIT_NONE,
        .size = o->tx_size + o->rx_size,
    };
    L3D_FI_CHECK(o, fi_cq_open(o->domain, &cq_attr, &o->cq, NULL), "fi_cq_open");
    L3D_FI_CHECK(o, fi_endpoint(o->domain, info, &o->ep, NULL), "fi_endpoint");
    L3D_FI_CHECK(o, fi_ep_bind(o->ep, &o->av->fid, 0), "fi_ep_bind(av)");
    L3D_FI_CHECK(o, fi_ep_bind(o->ep, &o->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
    // shm creates its /dev/shm region at fi_enable, under the name set here (ofi_shm.c).
    if (!strcmp(o->prov, "shm")) L3D_CHECK(o->ctx, l3d_ofi_shm_prepare(o));
    L3D_FI_CHECK(o, fi_enable(o->ep), "fi_enable");
    o->namelen = sizeof(o->name);
    L3D_FI_CHECK(o, fi_getname(&o->ep->fid, o->name, &o->namelen), "fi_getname");
    if (strlen(o->prov) > 255 || o->namelen > 0xffff)
        return l3d_error(o->ctx, L3D_ERR_INTERNAL, "ofi: provider name or address too long");
    return l3d_ofi_ctrl_post(o);
}

static l3d_status ofi_init(l3d_transport_t *tp, const l3d_transport_params_t *p) {
    if (p->nranks < 1 || p->rank < 0 || p->rank >= p->nranks ||
        (uint64_t)p->nranks > (UINT64_C(1) << L3D_OFI_TAG_RANK_BITS))
        return l3d_error(tp->ctx, L3D_ERR_INVALID_ARG, "ofi: rank %d of %d is not a valid world",
                         p->rank, p->nranks);
    l3d_ofi_t *o = l3d_calloc(tp->ctx, 1, sizeof(*o), L3D_OFI_ALLOC_TAG);
    if (!o) return L3D_ERR_NOMEM;
    o->tp = tp;
    o->ctx = tp->ctx;
    o->rank = p->rank;
    o->nranks = p->nranks;
    o->timeout_s = p->timeout_s;
    o->live.next = o->live.prev = &o->live;
    o->mrs.next = o->mrs.prev = &o->mrs;
    o->next_key = 1;
    size_t n = (size_t)p->nranks;
    l3d_status st = L3D_ERR_NOMEM;
    o->addrs = l3d_calloc(tp->ctx, n, sizeof(*o->addrs), L3D_OFI_ALLOC_TAG);
    o->peer_dead = l3d_calloc(tp->ctx, n, 1, L3D_OFI_ALLOC_TAG);
    o->peer_why = l3d_calloc(tp->ctx, n, sizeof(*o->peer_why), L3D_OFI_ALLOC_TAG);
    o->peers = l3d_calloc(tp->ctx, n, sizeof(*o->peers), L3D_OFI_ALLOC_TAG);
    if (!o->addrs || !o->peer_dead || !o->peer_why || !o->peers) goto undo;
    l3d_ofi_ident_self(&o->self);
    L3D_CHECK_GOTO(tp->ctx, ofi_getinfo(o), st, undo);
    L3D_CHECK_GOTO(tp->ctx, ofi_open(o), st, undo);
    l3d_log(o->ctx, L3D_LOG_INFO, L3D_SUBSYS_COMM,
            "ofi: rank %d of %d on provider %s fabric %s domain %s (directed recv %s, mr_mode "
            "0x%llx, max message %zu, tx %zu rx %zu)",
            o->rank, o->nranks, o->prov, o->info->fabric_attr->name, o->info->domain_attr->name,
            o->directed ? "yes" : "no", (unsigned long long)o->info->domain_attr->mr_mode,
            o->max_msg, o->tx_size, o->rx_size);
    tp->priv = o;
    tp->world_rank = p->rank;
    tp->world_size = p->nranks;
    return L3D_OK;
undo:
    ofi_teardown(o);
    return st;
}

static void ofi_fini(l3d_transport_t *tp) {
    l3d_ofi_t *o = tp->priv;
    if (!o) return;
    // Wait until the peers have read what we sent (the goodbye handshake, bounded), then
    // cancel what can be cancelled; closing the endpoint releases the rest without asking any
    // peer, so a dead peer cannot make this wait.
    l3d_ofi_goodbye(o);
    l3d_ofi_cancel_all(o, 0.05);
    ofi_teardown(o);
    tp->priv = NULL;
}

static void ofi_caps(const l3d_transport_t *tp, l3d_transport_caps_t *c) {
    const l3d_ofi_t *o = tp->priv;
    memset(c, 0, sizeof(*c));
    c->ptr_support = L3D_PTR_HOST;
    c->needs_mr = o->needs_mr;
    c->max_msg = o->max_msg ? o->max_msg : SIZE_MAX;
    // tx_attr->size is per endpoint: share it among the peers, within [4, 256].
    size_t q = L3D_MIN(o->tx_size, o->rx_size);
    size_t per_peer = q / (size_t)L3D_MAX(1, o->nranks - 1);
    c->max_inflight = (int)L3D_MAX((size_t)4, L3D_MIN(per_peer, (size_t)256));
    c->tag_bits = L3D_OFI_TAG_BITS;
    ofi_provider_hints(o->prov, &c->latency_us, &c->bandwidth_gbs);
}

// The blob names the provider too, so ranks started with different FI_PROVIDER values get a
// clear error instead of an address the AV cannot parse.
static l3d_status ofi_addr_get(l3d_transport_t *tp, void *buf, size_t *len_p) {
    l3d_ofi_t *o = tp->priv;
    size_t provlen = strlen(o->prov);
    size_t need = OFI_BLOB_HDR + provlen + o->namelen + L3D_OFI_IDENT_LEN;
    if (!buf || *len_p < need) {
        size_t have = *len_p;
        *len_p = need;
        return l3d_error(o->ctx, L3D_ERR_INVALID_ARG,
                         "ofi: address buffer of %zu bytes is too small (%zu needed)", have, need);
    }
    unsigned char *b = buf;
    memcpy(b, OFI_BLOB_MAGIC, 4);
    b[4] = OFI_BLOB_VERSION;
    b[5] = (unsigned char)provlen;
    b[6] = (unsigned char)(o->namelen & 0xff);
    b[7] = (unsigned char)(o->namelen >> 8);
    memcpy(b + OFI_BLOB_HDR, o->prov, provlen);
    memcpy(b + OFI_BLOB_HDR + provlen, o->name, o->namelen);
    l3d_ofi_ident_pack(&o->self, b + OFI_BLOB_HDR + provlen + o->namelen);
    *len_p = need;
    return L3D_OK;
}

static l3d_status ofi_parse_blob(l3d_ofi_t *o, int r, const void *blob, size_t len,
                                 const void **addr_p) {
    const unsigned char *b = blob;
    if (!b || len < OFI_BLOB_HDR || memcmp(b, OFI_BLOB_MAGIC, 4) || b[4] != OFI_BLOB_VERSION)
        return l3d_error(o->ctx, L3D_ERR_PEER_FAILED,
                         "ofi: rank %d: the address of rank %d is not an ofi address (%zu bytes)",
                         o->rank, r, len);
    size_t provlen = b[5], addrlen = (size_t)b[6] | ((size_t)b[7] << 8);
    if (OFI_BLOB_HDR + provlen + addrlen + L3D_OFI_IDENT_LEN != len)
        return l3d_error(o->ctx, L3D_ERR_PEER_FAILED,
                         "ofi: rank %d: the address of rank %d is truncated (%zu bytes)", o->rank,
                         r, len);
    const char *prov = (const char *)b + OFI_BLOB_HDR;
    if (provlen != strlen(o->prov) || memcmp(prov, o->prov, provlen) || addrlen != o->namelen)
        return l3d_error(o->ctx, L3D_ERR_CONFIG,
                         "ofi: rank %d uses libfabric provider %.*s but rank %d uses %s: set "
                         "the same FI_PROVIDER on every rank",
                         r, (int)provlen, prov, o->rank, o->prov);
    *addr_p = b + OFI_BLOB_HDR + provlen;
    l3d_ofi_peer_t *pe = &o->peers[r];
    l3d_ofi_ident_unpack(&pe->id, b + OFI_BLOB_HDR + provlen + addrlen);
    pe->local = o->self.boot_id[0] && !strcmp(pe->id.boot_id, o->self.boot_id) &&
                pe->id.pidns == o->self.pidns && r != o->rank;
    return L3D_OK;
}

// RDM needs no handshake: inserting the addresses is the whole connect, and it never waits on
// a peer. An unreachable peer is not reported by libfabric 1.17 (tcp;ofi_rxm keeps answering
// -FI_EAGAIN after a refused connect): a peer process on this node that is gone is caught by
// ofi_peer.c, anything else by the core's timeout.
static l3d_status ofi_connect(l3d_transport_t *tp, const void *const *addrs, const size_t *lens) {
    l3d_ofi_t *o = tp->priv;
    if (o->connected)
        return l3d_error(o->ctx, L3D_ERR_INVALID_ARG, "ofi: rank %d is already connected",
                         o->rank);
    if (o->ep_closed)
        return l3d_error(o->ctx, L3D_ERR_INVALID_ARG, "ofi: rank %d aborted its endpoint",
                         o->rank);
    for (int r = 0; r < o->nranks; r++) {
        const void *a = NULL;
        L3D_CHECK(o->ctx, ofi_parse_blob(o, r, addrs[r], lens[r], &a));
        int ret = fi_av_insert(o->av, a, 1, &o->addrs[r], 0, NULL);
        if (ret != 1) {
            char what[64];
            snprintf(what, sizeof(what), "fi_av_insert of rank %d", r);
            return l3d_ofi_fail(o, ret < 0 ? ret : -FI_EADDRNOTAVAIL, what, __FILE__, __LINE__);
        }
    }
    o->connected = 1;
    return L3D_OK;
}

// Registers with the provider whenever asked (not only under FI_MR_LOCAL): the descriptor
// lets providers that do not require it skip their own registration (rxm rendezvous), and the
// core caches registrations, so this is off the per-message path.
static l3d_status ofi_mr_reg(l3d_transport_t *tp, void *buf, size_t len, void **mr_p) {
    l3d_ofi_t *o = tp->priv;
    if (o->ep_closed)
        return l3d_error(o->ctx, L3D_ERR_INVALID_ARG, "ofi: rank %d aborted its endpoint",
                         o->rank);
    if (!buf || !len) {  // nothing to register: 0-byte messages need no descriptor
        *mr_p = NULL;
        return L3D_OK;
    }
    l3d_ofi_mr_t *m = l3d_calloc(o->ctx, 1, sizeof(*m), L3D_OFI_ALLOC_TAG);
    if (!m) return L3D_ERR_NOMEM;
    m->buf = buf;
    m->len = len;
    uint64_t key = o->mr_prov_key ? 0 : o->next_key++;
    l3d_status st = L3D_OK;
    L3D_FI_CHECK_GOTO(o, fi_mr_reg(o->domain, buf, len, FI_SEND | FI_RECV, 0, key, 0, &m->mr, NULL),
                      "fi_mr_reg", st, undo_alloc);
    if (o->mr_endpoint) {
        L3D_FI_CHECK_GOTO(o, fi_mr_bind(m->mr, &o->ep->fid, 0), "fi_mr_bind", st, undo_mr);
        L3D_FI_CHECK_GOTO(o, fi_mr_enable(m->mr), "fi_mr_enable", st, undo_mr);
    }
    m->next = o->mrs.next;
    m->prev = &o->mrs;
    o->mrs.next->prev = m;
    o->mrs.next = m;
    *mr_p = m;
    return L3D_OK;
undo_mr:
    fi_close(&m->mr->fid);
undo_alloc:
    l3d_free(o->ctx, m, sizeof(*m), L3D_OFI_ALLOC_TAG);
    return st;
}

static void ofi_mr_dereg(l3d_transport_t *tp, void *mr) {
    l3d_ofi_t *o = tp->priv;
    l3d_ofi_mr_t *m = mr;
    if (!o || !m) return;
    if (m->mr) ofi_close_fid(o, &m->mr->fid, "memory registration");
    m->prev->next = m->next;
    m->next->prev = m->prev;
    l3d_free(o->ctx, m, sizeof(*m), L3D_OFI_ALLOC_TAG);
}

static const char *ofi_strerror(const l3d_transport_t *tp) {
    const l3d_ofi_t *o = tp->priv;
    return o ? o->errtext : "";
}

const l3d_transport_ops_t l3d_ofi_transport_ops = {
    .abi_version = L3D_TRANSPORT_ABI_VERSION,
    .size = sizeof(l3d_transport_ops_t),
    .name = "ofi",
    .init = ofi_init,
    .fini = ofi_fini,
    .caps = ofi_caps,
    .addr_get = ofi_addr_get,
    .connect = ofi_connect,
    .mr_reg = ofi_mr_reg,
    .mr_dereg = ofi_mr_dereg,
    .isend = l3d_ofi_isend,
    .irecv = l3d_ofi_irecv,
    .test = l3d_ofi_test,
    .progress = l3d_ofi_progress,
    .cancel = l3d_ofi_cancel,
    .abort = l3d_ofi_abort,
    .strerror = ofi_strerror,
    .coll = NULL,
};
