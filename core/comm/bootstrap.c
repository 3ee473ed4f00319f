// Bootstrap: the client of the TCP key-value store through which the ranks swap transport
// addresses before any transport can talk (wire format in core/comm/bootstrap_wire.h; the store
// itself, which rank 0 runs, in core/comm/bootstrap_store.c; the launch environment in
// core/comm/bootstrap_env.c).
//
// Clients talk in strict request/reply; a timeout leaves the reply stream unknown, so after
// any failure the handle only accepts destroy. Values handed to the caller (get, allgather)
// come from the context's allocator under tag "comm".
#include "core/comm/bootstrap.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/comm/bootstrap_wire.h"
#include "core/l3d_core.h"
#include "platform/net.h"
#include "platform/platform.h"

struct l3d_bootstrap {
    l3d_ctx_t *ctx;
    int rank, size;
    double timeout_s;
    int fd;
    int failed;  // a request failed: only destroy is allowed now
    int dropped; // ... because the connection broke (not a refusal, a timeout or bad data)
    double drain_s;  // how long rank 0's destroy serves ranks that have not said goodbye
    char where[300];  // the store, "addr:port"
    l3d_bootstrap_store_t *srv;
};

// Reads one reply before the deadline. A VALUE payload goes into l3d_malloc memory of tag
// `vtag` (BS_OUT_TAG when it is handed to the caller, BS_TAG when it stays inside); every
// other payload is BS_TAG. Sizes are the payload length, or 1 for an empty one.
static l3d_status bs_reply(l3d_bootstrap_t *bs, double deadline, const char *what,
                           const char *vtag, unsigned *type_p, void **val_p, size_t *len_p) {
    l3d_ctx_t *ctx = bs->ctx;
    uint8_t h[BS_HDR];
    int rc = l3d_net_recv_all(bs->fd, h, BS_HDR, deadline);
    bs->failed = 1;  // until this reply is known to be whole
    if (rc == -ETIMEDOUT)
        return l3d_error(ctx, L3D_ERR_TIMEOUT, "bootstrap: timed out after %g s waiting for %s",
                         bs->timeout_s, what);
    if (rc) {
        bs->dropped = 1;
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "bootstrap: lost the store at %s while "
                         "waiting for %s: %s (did rank 0 exit?)", bs->where, what, strerror(-rc));
    }
    unsigned type = bs_get_u16(h + 6);
    uint32_t len = bs_get_u32(h + 8);
    if (bs_get_u32(h) != BS_MAGIC || bs_get_u16(h + 4) != BS_VERSION ||
        (type != BS_T_OK && type != BS_T_VALUE && type != BS_T_ERROR) || len > bs_type_cap(type))
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "bootstrap: %s sent a malformed reply (is "
                         "it a llama3d store of this version?)", bs->where);
    size_t asz = len ? len : 1;
    const char *btag = type == BS_T_VALUE ? vtag : BS_TAG;
    uint8_t *body = l3d_malloc(ctx, asz, btag);
    if (!body) return l3d_error(ctx, L3D_ERR_NOMEM, "bootstrap: no memory for %u bytes", len);
    rc = l3d_net_recv_all(bs->fd, body, len, deadline);
    if (rc) {
        l3d_free(ctx, body, asz, btag);
        return l3d_error(ctx, rc == -ETIMEDOUT ? L3D_ERR_TIMEOUT : L3D_ERR_PEER_FAILED,
                         "bootstrap: the reply from %s broke off: %s", bs->where, strerror(-rc));
    }
    if (type == BS_T_ERROR) {
        char text[BS_TEXT_MAX + 1] = "";
        unsigned code = len >= 2 ? bs_get_u16(body) : 0;
        if (len >= 2) memcpy(text, body + 2, len - 2);
        l3d_free(ctx, body, asz, BS_TAG);
        if (code == BS_E_TOKEN)
            return l3d_error(ctx, L3D_ERR_CONFIG, "job token mismatch: this process is not part "
                             "of the job served at %s (check L3D_JOB_TOKEN)", bs->where);
        if (code == BS_E_SIZE || code == BS_E_RANK)
            return l3d_error(ctx, L3D_ERR_CONFIG, "bootstrap: the store at %s refused rank %d: "
                             "%s", bs->where, bs->rank, text);
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "bootstrap: the store at %s dropped rank %d: "
                         "%s", bs->where, bs->rank, text);
    }
    bs->failed = 0;
    *type_p = type;
    if (val_p) {
        *val_p = body;
        *len_p = len;
    } else {
        l3d_free(ctx, body, asz, btag);
    }
    return L3D_OK;
}

// Sends header + (u16 n, key) + data, then waits for the reply of type `want` (a VALUE lands
// in memory of tag `vtag`, see bs_reply).
static l3d_status bs_request(l3d_bootstrap_t *bs, unsigned type, const char *key,
                             const void *data, size_t dlen, double deadline, const char *what,
                             const char *vtag, unsigned want, void **val_p, size_t *len_p) {
    l3d_ctx_t *ctx = bs->ctx;
    if (bs->failed)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "bootstrap: an earlier request to %s failed; "
                         "the handle can only be destroyed", bs->where);
    uint8_t h[BS_HDR + 2 + BS_KEY_MAX];
    size_t klen = key ? strlen(key) : 0, n = BS_HDR;
    if (key) {
        bs_put_u16(h + BS_HDR, (unsigned)klen);
        memcpy(h + BS_HDR + 2, key, klen);
        n += 2 + klen;
    }
    bs_put_hdr(h, type, n - BS_HDR + dlen);
    int rc = l3d_net_send_all(bs->fd, h, n, deadline);
    if (!rc && dlen) rc = l3d_net_send_all(bs->fd, data, dlen, deadline);
    if (rc) {
        bs->failed = 1;
        bs->dropped = rc != -ETIMEDOUT;
        return l3d_error(ctx, rc == -ETIMEDOUT ? L3D_ERR_TIMEOUT : L3D_ERR_PEER_FAILED,
                         "bootstrap: cannot send to the store at %s: %s", bs->where,
                         strerror(-rc));
    }
    unsigned got = 0;
    L3D_CHECK(ctx, bs_reply(bs, deadline, what, vtag, &got, val_p, len_p));
    if (got != want) {
        if (val_p) {  // and forget it: allgather's clean-up frees what is left in all[]
            l3d_free(ctx, *val_p, *len_p ? *len_p : 1, got == BS_T_VALUE ? vtag : BS_TAG);
            *val_p = NULL;
        }
        bs->failed = 1;
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "bootstrap: %s answered %s with %s",
                         bs->where, bs_type_name(type), bs_type_name(got));
    }
    return L3D_OK;
}

static l3d_status check_key(l3d_bootstrap_t *bs, const char *key) {
    if (!key || !key[0] || strlen(key) > BS_KEY_MAX)
        return l3d_error(bs->ctx, L3D_ERR_INVALID_ARG, "bootstrap: key '%.40s' must be 1 to %d "
                         "bytes", key ? key : "", BS_KEY_MAX);
    return L3D_OK;
}

// Says hello (rank, size, token) on the connected bs->fd, until the store's OK.
static l3d_status say_hello(l3d_bootstrap_t *bs, const l3d_launch_env_t *env, double deadline) {
    uint8_t hello[10 + BS_TOKEN_MAX];
    size_t tlen = strlen(env->job_token);
    bs_put_u32(hello, (uint32_t)env->rank);
    bs_put_u32(hello + 4, (uint32_t)env->size);
    bs_put_u16(hello + 8, (unsigned)tlen);
    memcpy(hello + 10, env->job_token, tlen);
    char what[400];
    snprintf(what, sizeof(what), "the store at %s to accept rank %d", bs->where, env->rank);
    return bs_request(bs, BS_T_HELLO, NULL, hello, 10 + tlen, deadline, what, BS_TAG, BS_T_OK,
                      NULL, NULL);
}

l3d_status l3d_bootstrap_create(l3d_ctx_t *ctx, const l3d_launch_env_t *env, double timeout_s,
                                l3d_bootstrap_t **bs_p) {
    if (!env || !bs_p || !(timeout_s > 0) || env->size < 1 || env->rank < 0 ||
        env->rank >= env->size || env->master_port < 0 || env->master_port > 65535 ||
        (env->master_port == 0 && env->size > 1) || strlen(env->job_token) > BS_TOKEN_MAX)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "bootstrap: bad arguments (rank %d of %d, "
                         "port %d, timeout %g s)", env ? env->rank : -1, env ? env->size : -1,
                         env ? env->master_port : -1, timeout_s);
    l3d_bootstrap_t *bs = l3d_calloc(ctx, 1, sizeof(*bs), BS_TAG);
    if (!bs) return L3D_ERR_NOMEM;
    *bs = (l3d_bootstrap_t){.ctx = ctx, .rank = env->rank, .size = env->size,
                            .timeout_s = timeout_s, .fd = -1};
    double deadline = l3d_time_now() + timeout_s;
    int port = env->master_port;
    l3d_status st = L3D_OK;
    if (env->rank == 0)
        L3D_CHECK_GOTO(ctx, l3d_bootstrap_store_start(ctx, env, timeout_s, &bs->srv, &port), st,
                       fail);
    l3d_net_format_hostport(env->master_addr, port, bs->where, sizeof(bs->where));
    int last = 0, rc = l3d_net_connect(env->master_addr, port, deadline, &bs->fd, &last);
    if (rc == -ETIMEDOUT) {
        st = l3d_error(ctx, L3D_ERR_TIMEOUT, "bootstrap: timed out after %g s connecting to the "
                       "store at %s (last error: %s; is rank 0 running, and are MASTER_ADDR and "
                       "MASTER_PORT the same for every rank?)", timeout_s, bs->where,
                       strerror(last));
        goto fail;
    } else if (rc) {
        st = l3d_error(ctx, L3D_ERR_CONFIG, "bootstrap: cannot connect to the store at %s: %s",
                       bs->where, rc == -ENXIO ? "the host name does not resolve (check "
                       "MASTER_ADDR)" : strerror(-rc));
        goto fail;
    }
    // The store may close a connection that has not said hello yet when its port is crowded
    // (it makes room by closing the oldest such one: cli_store_flood.sh). A rank whose
    // connection broke before the store's answer connects again, up to 7 times within the
    // deadline, as long as the store accepts a connection within a second (a store that is
    // gone refuses at once, and the first error stands). A refusal (token, size, rank) is final.
    st = say_hello(bs, env, deadline);
    for (int attempt = 2; st < 0 && bs->dropped && attempt <= 8; attempt++) {
        l3d_log(ctx, L3D_LOG_INFO, L3D_SUBSYS_COMM, "bootstrap: the store at %s closed rank "
                "%d's connection before accepting it; connecting again (attempt %d)",
                bs->where, env->rank, attempt);
        l3d_net_close(bs->fd);
        bs->fd = -1;
        struct timespec ts = {0, 20000000L * (attempt - 1)};  // 20 ms, 40 ms, ...
        nanosleep(&ts, NULL);
        double now = l3d_time_now();
        if (now >= deadline ||
            l3d_net_connect(env->master_addr, port, now + 1.0 < deadline ? now + 1.0 : deadline,
                            &bs->fd, &last)) {
            bs->fd = -1;
            break;
        }
        bs->failed = bs->dropped = 0;
        st = say_hello(bs, env, deadline);
    }
    if (st < 0) goto fail;
    l3d_log(ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM, "bootstrap: rank %d of %d joined the store at "
            "%s", env->rank, env->size, bs->where);
    *bs_p = bs;
    return L3D_OK;
fail:
    l3d_net_close(bs->fd);
    if (bs->srv) l3d_bootstrap_store_stop(bs->srv, 0);
    l3d_free(ctx, bs, sizeof(*bs), BS_TAG);
    return st;
}

void l3d_bootstrap_destroy(l3d_bootstrap_t *bs) {
    if (!bs) return;
    double deadline = l3d_time_now() + (bs->drain_s > 0 ? bs->drain_s : bs->timeout_s);
    if (bs->fd >= 0) {
        uint8_t h[BS_HDR];
        bs_put_hdr(h, BS_T_BYE, 0);
        l3d_net_send_all(bs->fd, h, BS_HDR, deadline);  // best effort: the store may be gone
        l3d_net_close(bs->fd);
    }
    if (bs->srv) l3d_bootstrap_store_stop(bs->srv, deadline);
    l3d_free(bs->ctx, bs, sizeof(*bs), BS_TAG);
}

void l3d_bootstrap_set_drain(l3d_bootstrap_t *bs, double seconds) {
    if (bs && seconds > 0 && seconds < bs->timeout_s) bs->drain_s = seconds;
}

int l3d_bootstrap_rank(const l3d_bootstrap_t *bs) { return bs->rank; }
int l3d_bootstrap_size(const l3d_bootstrap_t *bs) { return bs->size; }

l3d_status l3d_bootstrap_put(l3d_bootstrap_t *bs, const char *key, const void *val, size_t len) {
    L3D_CHECK(bs->ctx, check_key(bs, key));
    if (len > BS_VAL_MAX || (len && !val))
        return l3d_error(bs->ctx, L3D_ERR_INVALID_ARG, "bootstrap: value of '%s' is %zu bytes "
                         "(at most %zu)", key, len, BS_VAL_MAX);
    char what[300];
    snprintf(what, sizeof(what), "the store to take key '%s'", key);
    return bs_request(bs, BS_T_PUT, key, val, len, l3d_time_now() + bs->timeout_s, what, BS_TAG,
                      BS_T_OK, NULL, NULL);
}

static l3d_status get_wait(l3d_bootstrap_t *bs, const char *key, double deadline,
                           const char *why, const char *vtag, void **val_p, size_t *len_p) {
    L3D_CHECK(bs->ctx, check_key(bs, key));
    char what[400];
    snprintf(what, sizeof(what), "key '%s' (%s)", key, why);
    return bs_request(bs, BS_T_GET, key, NULL, 0, deadline, what, vtag, BS_T_VALUE, val_p,
                      len_p);
}

l3d_status l3d_bootstrap_get(l3d_bootstrap_t *bs, const char *key, void **val_p, size_t *len_p) {
    return get_wait(bs, key, l3d_time_now() + bs->timeout_s, "no rank has put it yet",
                    BS_OUT_TAG, val_p, len_p);
}

void l3d_bootstrap_free(l3d_bootstrap_t *bs, void *val, size_t len) {
    if (val) l3d_free(bs->ctx, val, len ? len : 1, BS_OUT_TAG);  // empty values hold 1 byte
}

void l3d_bootstrap_free_all(l3d_bootstrap_t *bs, void **all, size_t *lens) {
    if (!all) return;
    for (int i = 0; i < bs->size; i++) l3d_bootstrap_free(bs, all[i], lens[i]);
    l3d_free(bs->ctx, all, (size_t)bs->size * sizeof(void *), BS_OUT_TAG);
    l3d_free(bs->ctx, lens, (size_t)bs->size * sizeof(size_t), BS_OUT_TAG);
}

l3d_status l3d_bootstrap_allgather(l3d_bootstrap_t *bs, const char *tag, const void *mine,
                                   size_t len, void ***all_p, size_t **lens_p) {
    l3d_ctx_t *ctx = bs->ctx;
    if (!tag || strlen(tag) > BS_KEY_MAX - 12)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "bootstrap: allgather tag too long");
    double deadline = l3d_time_now() + bs->timeout_s;
    char key[BS_KEY_MAX + 1];
    snprintf(key, sizeof(key), "%s/%d", tag, bs->rank);
    L3D_CHECK(ctx, l3d_bootstrap_put(bs, key, mine, len));
    void **all = l3d_calloc(ctx, (size_t)bs->size, sizeof(void *), BS_OUT_TAG);
    size_t *lens = l3d_calloc(ctx, (size_t)bs->size, sizeof(size_t), BS_OUT_TAG);
    l3d_status st = L3D_OK;
    if (!all || !lens) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < bs->size; i++) {
        if (i == bs->rank) {
            if (!(all[i] = l3d_malloc(ctx, len ? len : 1, BS_OUT_TAG))) {
                st = L3D_ERR_NOMEM;
                goto fail;
            }
            if (len) memcpy(all[i], mine, len);
            lens[i] = len;
            continue;
        }
        char why[64];
        snprintf(key, sizeof(key), "%s/%d", tag, i);
        snprintf(why, sizeof(why), "rank %d never joined?", i);
        L3D_CHECK_GOTO(ctx, get_wait(bs, key, deadline, why, BS_OUT_TAG, &all[i], &lens[i]), st,
                       fail);
    }
    *all_p = all;
    *lens_p = lens;
    return L3D_OK;
fail:
    if (all && lens) {
        l3d_bootstrap_free_all(bs, all, lens);
    } else {
        l3d_free(ctx, all, (size_t)bs->size * sizeof(void *), BS_OUT_TAG);
        l3d_free(ctx, lens, (size_t)bs->size * sizeof(size_t), BS_OUT_TAG);
    }
    return st;
}

// Rank 0 collects "barrier/<tag>/<r>" from every other rank, then releases them all with
// "barrier/<tag>/done": O(size) messages, and a timeout at rank 0 names the missing rank.
l3d_status l3d_bootstrap_barrier(l3d_bootstrap_t *bs, const char *tag) {
    l3d_ctx_t *ctx = bs->ctx;
    if (!tag || strlen(tag) > BS_KEY_MAX - 20)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "bootstrap: barrier tag too long");
    double deadline = l3d_time_now() + bs->timeout_s;
    char key[BS_KEY_MAX + 1], why[128];
    void *v;
    size_t n;
    if (bs->rank != 0) {
        snprintf(key, sizeof(key), "barrier/%s/%d", tag, bs->rank);
        L3D_CHECK(ctx, l3d_bootstrap_put(bs, key, NULL, 0));
        snprintf(key, sizeof(key), "barrier/%s/done", tag);
        snprintf(why, sizeof(why), "rank 0 sets it once every rank reached barrier '%s'", tag);
        L3D_CHECK(ctx, get_wait(bs, key, deadline, why, BS_TAG, &v, &n));
        l3d_free(ctx, v, n ? n : 1, BS_TAG);
        return L3D_OK;
    }
    for (int i = 1; i < bs->size; i++) {
        snprintf(key, sizeof(key), "barrier/%s/%d", tag, i);
        snprintf(why, sizeof(why), "rank %d never joined?", i);
        L3D_CHECK(ctx, get_wait(bs, key, deadline, why, BS_TAG, &v, &n));
        l3d_free(ctx, v, n ? n : 1, BS_TAG);
    }
    snprintf(key, sizeof(key), "barrier/%s/done", tag);
    return l3d_bootstrap_put(bs, key, NULL, 0);
}
