// Bootstrap: the launch environment, and the TCP key-value store through which the ranks swap
// transport addresses before any transport can talk.
//
// ---- store protocol, version 1 ------------------------------------------------------------
// Every message is a 12-byte header and a payload; all integers little-endian:
//   u32 magic 0x4244334c (the bytes "L3DB")  u16 version (1)  u16 type  u32 payload length
// Client -> store                                  Store -> client
//   1 HELLO  u32 rank, u32 size, u16 n, token[n]   2 OK     (empty): HELLO or PUT accepted
//   3 PUT    u16 n, key[n], value (the rest)       5 VALUE  value: answers a GET
//   4 GET    u16 n, key[n]                         7 ERROR  u16 code, text (why, then closes)
//   6 BYE    (empty): this rank is done
// Limits, checked on the header before anything is allocated: token <= 127 bytes, key 1..255
// bytes without NUL, value <= 1 MiB, and each type's payload at most what those allow
// (HELLO 137, PUT 2+255+1 MiB, GET 257, BYE 0; OK 0, VALUE 1 MiB, ERROR 2+1024).
// HELLO must come first and must carry the store's job token and world size, and a rank not
// yet seen; otherwise the store answers ERROR (code 1 token, 2 size, 3 rank) and closes. A GET
// for a key not yet PUT is held until the PUT arrives (one pending GET per connection); a PUT
// of an existing key replaces it. Any malformed message (bad magic, version or type, a length
// over its limit, an inconsistent payload, EOF inside a message, a message before HELLO) makes
// the store log a warning naming the peer, send ERROR code 4 if it can, and drop that
// connection only. Connections that never complete HELLO are dropped after the timeout.
//
// The store is a thread of rank 0's process (poll over every connection, non-blocking I/O,
// so one stalled or hostile peer cannot hold up the others). Rank 0's destroy keeps it
// serving until every rank has said BYE (or left), bounded by the timeout. Clients talk in
// strict request/reply; a timeout leaves the reply stream unknown, so after any failure the
// handle only accepts destroy.
#include "core/bootstrap.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/l3d_core.h"
#include "platform/net.h"
#include "platform/platform.h"

#define BS_MAGIC 0x4244334cu
#define BS_VERSION 1
#define BS_HDR 12
#define BS_TOKEN_MAX 127
#define BS_KEY_MAX 255
#define BS_VAL_MAX ((size_t)1 << 20)
#define BS_TEXT_MAX 1024
#define BS_OUTQ_MAX ((size_t)64 << 20)  // replies a peer may leave unread before it is dropped
#define BS_TAG "bootstrap"

enum { T_HELLO = 1, T_OK = 2, T_PUT = 3, T_GET = 4, T_VALUE = 5, T_BYE = 6, T_ERROR = 7 };
enum { E_TOKEN = 1, E_SIZE = 2, E_RANK = 3, E_PROTOCOL = 4 };

static const char *type_name(unsigned t) {
    static const char *names[] = {"?", "hello", "ok", "put", "get", "value", "bye", "error"};
    return t < L3D_ARRAY_LEN(names) ? names[t] : "?";
}

static size_t type_cap(unsigned t) {
    switch (t) {
    case T_HELLO: return 10 + BS_TOKEN_MAX;
    case T_PUT: return 2 + BS_KEY_MAX + BS_VAL_MAX;
    case T_GET: return 2 + BS_KEY_MAX;
    case T_VALUE: return BS_VAL_MAX;
    case T_ERROR: return 2 + BS_TEXT_MAX;
    default: return 0;  // OK, BYE
    }
}

static void put_u16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static unsigned get_u16(const uint8_t *p) { return (unsigned)p[0] | ((unsigned)p[1] << 8); }
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static void put_hdr(uint8_t *h, unsigned type, size_t len) {
    put_u32(h, BS_MAGIC);
    put_u16(h + 4, BS_VERSION);
    put_u16(h + 6, type);
    put_u32(h + 8, (uint32_t)len);
}

// ---- launch environment --------------------------------------------------------------------
typedef struct conv {
    const char *source, *rank, *size, *local_rank, *local_size;
} conv_t;

static const conv_t convs[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"explicit", "L3D_RANK", "L3D_WORLD_SIZE", "L3D_LOCAL_RANK", "L3D_LOCAL_WORLD_SIZE"},
};

static l3d_status env_int(l3d_ctx_t *ctx, const char *name, long lo, long hi, int *out) {
    const char *v = getenv(name);
    char *end = NULL;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: '%s' is not an integer in [%ld, %ld]", name,
                         v ? v : "", lo, hi);
    *out = (int)x;
    return L3D_OK;
}

static const char *env_first(const char *a, const char *b, const char **name) {
    const char *v = getenv(a);
    *name = a;
    if (!v) {
        v = getenv(b);
        *name = b;
    }
    return v;
}

l3d_status l3d_launch_env_read(l3d_ctx_t *ctx, l3d_launch_env_t *env) {
    memset(env, 0, sizeof(*env));
    const conv_t *c = NULL, *partial = NULL;
    for (size_t i = 0; i < L3D_ARRAY_LEN(convs) && !c; i++) {
        int r = getenv(convs[i].rank) != NULL, s = getenv(convs[i].size) != NULL;
        if (r && s) c = &convs[i];
        else if ((r || s) && !partial) partial = &convs[i];
    }
    if (!c && partial)
        return l3d_error(ctx, L3D_ERR_CONFIG, "launch environment: %s is set but %s is not (%s "
                         "style needs both)", getenv(partial->rank) ? partial->rank : partial->size,
                         getenv(partial->rank) ? partial->size : partial->rank, partial->source);
    if (!c)
        return l3d_error(ctx, L3D_ERR_CONFIG, "launch environment: RANK and WORLD_SIZE are not "
                         "set (start the job with l3d launch -n N, torchrun, mpirun or srun; see "
                         "docs/launch.md)");
    L3D_CHECK(ctx, env_int(ctx, c->size, 1, INT_MAX, &env->size));
    L3D_CHECK(ctx, env_int(ctx, c->rank, 0, INT_MAX, &env->rank));
    if (env->rank >= env->size)
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s is %d but %s is %d (a rank is below the world "
                         "size)", c->rank, env->rank, c->size, env->size);
    if (getenv(c->local_size)) {
        L3D_CHECK(ctx, env_int(ctx, c->local_size, 1, env->size, &env->local_size));
    }
    if (getenv(c->local_rank)) {
        L3D_CHECK(ctx, env_int(ctx, c->local_rank, 0, env->size - 1, &env->local_rank));
        if (env->local_size && env->local_rank >= env->local_size)
            return l3d_error(ctx, L3D_ERR_CONFIG, "%s is %d but %s is %d", c->local_rank,
                             env->local_rank, c->local_size, env->local_size);
    } else {
        // No local rank given: block placement is the usual guess (one node: the rank).
        env->local_rank = env->local_size ? env->rank % env->local_size : env->rank;
    }
    snprintf(env->source, sizeof(env->source), "%s", c->source);

    const char *aname, *pname;
    const char *addr = env_first("L3D_MASTER_ADDR", "MASTER_ADDR", &aname);
    const char *port = env_first("L3D_MASTER_PORT", "MASTER_PORT", &pname);
    if (!addr && env->size == 1) {
        addr = "127.0.0.1";  // a world of one needs no rendezvous address: any local port does
    } else if (!addr) {
        return l3d_error(ctx, L3D_ERR_CONFIG, "MASTER_ADDR is not set: %s gives %s and %s but not "
                         "the store address; set MASTER_ADDR to rank 0's host and MASTER_PORT to "
                         "a free port (e.g. 29500) for every rank", c->source, c->rank, c->size);
    }
    if (!addr[0] || strlen(addr) >= sizeof(env->master_addr))
        return l3d_error(ctx, L3D_ERR_CONFIG, "%s: '%.64s' is not a host name or address", aname,
                         addr);
    snprintf(env->master_addr, sizeof(env->master_addr), "%s", addr);
    if (!port && env->size == 1) {
        env->master_port = 0;
    } else if (!port) {
        return l3d_error(ctx, L3D_ERR_CONFIG, "MASTER_PORT is not set (the store at %s needs a "
                         "port, e.g. 29500, the same for every rank)", env->master_addr);
    } else {
        L3D_CHECK(ctx, env_int(ctx, pname, env->size == 1 ? 0 : 1, 65535, &env->master_port));
    }
    const char *tok = getenv("L3D_JOB_TOKEN");
    if (tok && strlen(tok) > BS_TOKEN_MAX)
        return l3d_error(ctx, L3D_ERR_CONFIG, "L3D_JOB_TOKEN is %zu bytes long, at most %d are "
                         "allowed", strlen(tok), BS_TOKEN_MAX);
    snprintf(env->job_token, sizeof(env->job_token), "%s", tok ? tok : "");
    return L3D_OK;
}

// ---- the store (rank 0's thread) -------------------------------------------------------------
typedef struct bs_conn {
    int fd;  // -1 once closed
    char peer[64];
    int rank;  // -1 until HELLO
    int closing;  // close once the output queue is empty
    double hello_deadline;
    uint8_t hdr[BS_HDR];
    size_t hdr_got;
    unsigned type;
    uint8_t *body;
    size_t body_len, body_got;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    char *pending;  // the key of a GET waiting for its PUT
} bs_conn_t;

typedef struct bs_entry {
    char *key;  // NULL: empty slot
    uint8_t *val;
    size_t len;
} bs_entry_t;

typedef struct bs_server {
    l3d_ctx_t *ctx;
    int size;
    char token[BS_TOKEN_MAX + 1];
    double timeout_s;
    int lfd, wake[2];
    pthread_t thread;
    int started;
    bs_conn_t **conns;
    size_t nconns, capconns, maxconns;
    bs_entry_t *tab;  // open addressing, capacity a power of two, at most half full
    size_t ntab, captab;
    uint8_t *joined;  // per rank: 0 not yet, 1 connected, 2 gone (BYE or disconnected)
    int ngone;
    int draining;
    double drain_deadline;
} bs_server_t;

static uint64_t hash_key(const char *k) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (; *k; k++) h = (h ^ (uint8_t)*k) * 1099511628211ull;
    return h;
}

static bs_entry_t *tab_find(bs_server_t *s, const char *key) {
    for (size_t i = hash_key(key) & (s->captab - 1);; i = (i + 1) & (s->captab - 1))
        if (!s->tab[i].key || !strcmp(s->tab[i].key, key)) return &s->tab[i];
}

static int tab_grow(bs_server_t *s) {
    size_t ncap = s->captab ? s->captab * 2 : 64;
    bs_entry_t *old = s->tab;
    size_t ocap = s->captab;
    s->tab = l3d_calloc(s->ctx, ncap, sizeof(bs_entry_t), BS_TAG);
    if (!s->tab) {
        s->tab = old;
        return -1;
    }
    s->captab = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].key) *tab_find(s, old[i].key) = old[i];
    l3d_free(s->ctx, old, ocap * sizeof(bs_entry_t), BS_TAG);
    return 0;
}

static void conn_close(bs_server_t *s, bs_conn_t *c) {
    if (c->fd < 0) return;
    l3d_net_close(c->fd);
    c->fd = -1;
    if (c->rank >= 0 && s->joined[c->rank] == 1) {
        s->joined[c->rank] = 2;
        s->ngone++;
        l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM,
                "bootstrap: rank %d (%s) disconnected without saying goodbye", c->rank, c->peer);
    }
}

static void conn_free(bs_server_t *s, bs_conn_t *c) {
    conn_close(s, c);
    l3d_free(s->ctx, c->body, c->body_len ? c->body_len : 1, BS_TAG);
    l3d_free(s->ctx, c->out, c->out_cap, BS_TAG);
    l3d_strfree(s->ctx, c->pending);
    l3d_free(s->ctx, c, sizeof(*c), BS_TAG);
}

static void conn_flush(bs_server_t *s, bs_conn_t *c);

// Appends one message (header, then up to two payload pieces) to the output queue.
static int conn_queue(bs_server_t *s, bs_conn_t *c, unsigned type, const void *a, size_t alen,
                      const void *b, size_t blen) {
    size_t need = c->out_len + BS_HDR + alen + blen;
    if (need > BS_OUTQ_MAX) return -1;
    if (need > c->out_cap) {
        size_t ncap = L3D_MAX(need, c->out_cap * 2);
        uint8_t *n = l3d_malloc(s->ctx, ncap, BS_TAG);
        if (!n) return -1;
        if (c->out_len > c->out_off) memcpy(n, c->out + c->out_off, c->out_len - c->out_off);
        l3d_free(s->ctx, c->out, c->out_cap, BS_TAG);
        c->out = n;
        c->out_cap = ncap;
        c->out_len -= c->out_off;
        c->out_off = 0;
        need = c->out_len + BS_HDR + alen + blen;
    }
    put_hdr(c->out + c->out_len, type, alen + blen);
    if (alen) memcpy(c->out + c->out_len + BS_HDR, a, alen);
    if (blen) memcpy(c->out + c->out_len + BS_HDR + alen, b, blen);
    c->out_len = need;
    conn_flush(s, c);
    return 0;
}

static void send_error(bs_server_t *s, bs_conn_t *c, unsigned code, const char *text) {
    uint8_t p[2];
    put_u16(p, code);
    if (conn_queue(s, c, T_ERROR, p, 2, text, L3D_MIN(strlen(text), (size_t)BS_TEXT_MAX)) == 0)
        c->closing = 1;
    else
        conn_close(s, c);
}

// A protocol violation: warn naming the peer, tell it why if the socket takes it, drop it.
static void conn_drop(bs_server_t *s, bs_conn_t *c, const char *fmt, ...) L3D_PRINTF(3, 4);
static void conn_drop(bs_server_t *s, bs_conn_t *c, const char *fmt, ...) {
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (c->fd < 0) return;
    char who[32] = "";
    if (c->rank >= 0) snprintf(who, sizeof(who), " (rank %d)", c->rank);
    l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: dropping the connection from "
            "%s%s: %s", c->peer, who, why);
    uint8_t msg[BS_HDR + 2 + sizeof(why)];
    size_t n = strlen(why);
    put_hdr(msg, T_ERROR, 2 + n);
    put_u16(msg + BS_HDR, E_PROTOCOL);
    memcpy(msg + BS_HDR + 2, why, n);
    size_t sent;
    l3d_net_send_some(c->fd, msg, BS_HDR + 2 + n, &sent);  // best effort: it may not read
    conn_close(s, c);
}

static void conn_flush(bs_server_t *s, bs_conn_t *c) {
    while (c->fd >= 0 && c->out_off < c->out_len) {
        size_t n = 0;
        int rc = l3d_net_send_some(c->fd, c->out + c->out_off, c->out_len - c->out_off, &n);
        if (rc) {
            l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: cannot write to %s: %s",
                    c->peer, strerror(-rc));
            conn_close(s, c);
            return;
        }
        if (n == 0) return;  // socket full: poll for POLLOUT
        c->out_off += n;
    }
    c->out_off = c->out_len = 0;
    if (c->closing) conn_close(s, c);
}

// Parses "u16 n, key[n]" at the start of a payload; 0 and the key (NUL-terminated in `key`).
static int parse_key(const uint8_t *p, size_t len, char *key, size_t *used) {
    if (len < 2) return -1;
    size_t n = get_u16(p);
    if (n < 1 || n > BS_KEY_MAX || 2 + n > len || memchr(p + 2, 0, n)) return -1;
    memcpy(key, p + 2, n);
    key[n] = 0;
    *used = 2 + n;
    return 0;
}

static void on_hello(bs_server_t *s, bs_conn_t *c, const uint8_t *p, size_t len) {
    if (len < 10 || 10 + get_u16(p + 8) != len) {
        conn_drop(s, c, "malformed hello (%zu bytes)", len);
        return;
    }
    uint32_t rank = get_u32(p), size = get_u32(p + 4);
    size_t tlen = get_u16(p + 8);
    char why[160];
    unsigned code = 0;
    if (tlen != strlen(s->token) || memcmp(p + 10, s->token, tlen)) {
        code = E_TOKEN;
        snprintf(why, sizeof(why), "job token mismatch");
    } else if (size != (uint32_t)s->size) {
        code = E_SIZE;
        snprintf(why, sizeof(why), "world size mismatch: it says %u ranks, this job has %d", size,
                 s->size);
    } else if (rank >= size) {
        code = E_RANK;
        snprintf(why, sizeof(why), "rank %u is out of range for a world of %d", rank, s->size);
    } else if (s->joined[rank]) {
        code = E_RANK;
        snprintf(why, sizeof(why), "rank %u has already joined (two processes with one rank?)",
                 rank);
    }
    if (code) {
        l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: refused %s (claims rank %u of "
                "%u): %s%s", c->peer, rank, size, why, code == E_TOKEN ? "; it belongs to another "
                "job or its L3D_JOB_TOKEN differs" : "");
        send_error(s, c, code, why);
        return;
    }
    c->rank = (int)rank;
    s->joined[rank] = 1;
    l3d_log(s->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM, "bootstrap: rank %u joined from %s", rank,
            c->peer);
    if (conn_queue(s, c, T_OK, NULL, 0, NULL, 0)) conn_drop(s, c, "cannot queue a reply");
}

static void on_put(bs_server_t *s, bs_conn_t *c, const uint8_t *p, size_t len) {
    char key[BS_KEY_MAX + 1];
    size_t used;
    if (parse_key(p, len, key, &used) || len - used > BS_VAL_MAX) {
        conn_drop(s, c, "malformed put (%zu bytes)", len);
        return;
    }
    size_t vlen = len - used;
    if ((s->ntab + 1) * 2 > s->captab && tab_grow(s)) {
        conn_drop(s, c, "out of memory for key '%s'", key);
        return;
    }
    bs_entry_t *e = tab_find(s, key);
    uint8_t *val = l3d_malloc(s->ctx, vlen ? vlen : 1, BS_TAG);
    char *k = e->key ? e->key : l3d_strdup(s->ctx, key);
    if (!val || !k) {
        l3d_free(s->ctx, val, vlen ? vlen : 1, BS_TAG);
        if (!e->key) l3d_strfree(s->ctx, k);
        conn_drop(s, c, "out of memory for key '%s'", key);
        return;
    }
    if (vlen) memcpy(val, p + used, vlen);
    if (e->key) l3d_free(s->ctx, e->val, e->len ? e->len : 1, BS_TAG);
    else s->ntab++;
    *e = (bs_entry_t){.key = k, .val = val, .len = vlen};
    if (conn_queue(s, c, T_OK, NULL, 0, NULL, 0)) conn_drop(s, c, "cannot queue a reply");
    for (size_t i = 0; i < s->nconns; i++) {
        bs_conn_t *w = s->conns[i];
        if (w->fd < 0 || !w->pending || strcmp(w->pending, key)) continue;
        l3d_strfree(s->ctx, w->pending);
        w->pending = NULL;
        if (conn_queue(s, w, T_VALUE, e->val, e->len, NULL, 0))
            conn_drop(s, w, "does not read its replies");
    }
}

static void on_get(bs_server_t *s, bs_conn_t *c, const uint8_t *p, size_t len) {
    char key[BS_KEY_MAX + 1];
    size_t used;
    if (parse_key(p, len, key, &used) || used != len) {
        conn_drop(s, c, "malformed get (%zu bytes)", len);
        return;
    }
    if (c->pending) {
        conn_drop(s, c, "a second get while '%s' is pending", c->pending);
        return;
    }
    bs_entry_t *e = s->captab ? tab_find(s, key) : NULL;
    if (e && e->key) {
        if (conn_queue(s, c, T_VALUE, e->val, e->len, NULL, 0))
            conn_drop(s, c, "does not read its replies");
    } else if (!(c->pending = l3d_strdup(s->ctx, key))) {
        conn_drop(s, c, "out of memory for key '%s'", key);
    }
}

static void on_message(bs_server_t *s, bs_conn_t *c) {
    const uint8_t *p = c->body;
    size_t len = c->body_len;
    if (c->rank < 0 && c->type != T_HELLO)
        conn_drop(s, c, "%s before hello", type_name(c->type));
    else if (c->rank >= 0 && c->type == T_HELLO) conn_drop(s, c, "a second hello");
    else if (c->type == T_HELLO) on_hello(s, c, p, len);
    else if (c->type == T_PUT) on_put(s, c, p, len);
    else if (c->type == T_GET) on_get(s, c, p, len);
    else {  // BYE
        s->joined[c->rank] = 2;
        s->ngone++;
        l3d_log(s->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM, "bootstrap: rank %d said goodbye",
                c->rank);
        conn_close(s, c);
    }
    l3d_free(s->ctx, c->body, len ? len : 1, BS_TAG);
    c->body = NULL;
    c->body_len = c->body_got = c->hdr_got = 0;
}

// Feeds received bytes through the header/payload state machine.
static void conn_feed(bs_server_t *s, bs_conn_t *c, const uint8_t *buf, size_t n) {
    while (n > 0 && c->fd >= 0 && !c->closing) {
        if (c->hdr_got < BS_HDR) {
            size_t k = L3D_MIN(n, BS_HDR - c->hdr_got);
            memcpy(c->hdr + c->hdr_got, buf, k);
            c->hdr_got += k;
            buf += k;
            n -= k;
            if (c->hdr_got < BS_HDR) return;
            uint32_t magic = get_u32(c->hdr), len = get_u32(c->hdr + 8);
            unsigned ver = get_u16(c->hdr + 4);
            c->type = get_u16(c->hdr + 6);
            int known = c->type == T_HELLO || c->type == T_PUT || c->type == T_GET ||
                        c->type == T_BYE;
            if (magic != BS_MAGIC) {
                conn_drop(s, c, "bad magic 0x%08x (not a llama3d bootstrap client?)", magic);
                return;
            }
            if (ver != BS_VERSION) {
                conn_drop(s, c, "protocol version %u, this store speaks %d", ver, BS_VERSION);
                return;
            }
            if (!known) {
                conn_drop(s, c, "unexpected message type %u", c->type);
                return;
            }
            if (len > type_cap(c->type)) {
                conn_drop(s, c, "a %s message of %u bytes (the limit is %zu)",
                          type_name(c->type), len, type_cap(c->type));
                return;
            }
            c->body_len = len;
            c->body_got = 0;
            if (!(c->body = l3d_malloc(s->ctx, len ? len : 1, BS_TAG))) {
                conn_drop(s, c, "out of memory for a %u-byte message", len);
                return;
            }
        }
        size_t k = L3D_MIN(n, c->body_len - c->body_got);
        memcpy(c->body + c->body_got, buf, k);
        c->body_got += k;
        buf += k;
        n -= k;
        if (c->body_got == c->body_len) on_message(s, c);
    }
}

static void conn_read(bs_server_t *s, bs_conn_t *c) {
    uint8_t buf[65536];  // one read per poll round, so a chatty peer cannot starve the rest
    size_t n = 0;
    int rc = l3d_net_recv_some(c->fd, buf, sizeof(buf), &n);
    if (rc == -EAGAIN) return;
    if (rc) {
        l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: lost %s: %s", c->peer,
                strerror(-rc));
        conn_close(s, c);
    } else if (n == 0) {
        if (c->hdr_got)
            conn_drop(s, c, "disconnected inside a message (%zu of %zu bytes)",
                      c->hdr_got < BS_HDR ? c->hdr_got : BS_HDR + c->body_got,
                      c->hdr_got < BS_HDR ? (size_t)BS_HDR : BS_HDR + c->body_len);
        else
            conn_close(s, c);
    } else {
        conn_feed(s, c, buf, n);
    }
}

static void server_accept(bs_server_t *s) {
    for (int k = 0; k < 16; k++) {
        int fd;
        char peer[64];
        if (l3d_net_accept(s->lfd, &fd, peer, sizeof(peer))) return;
        bs_conn_t *c = NULL;
        if (s->nconns == s->capconns) {
            size_t ncap = s->capconns ? 2 * s->capconns : 16;
            bs_conn_t **n = l3d_calloc(s->ctx, ncap, sizeof(*n), BS_TAG);
            if (n) {
                if (s->nconns) memcpy(n, s->conns, s->nconns * sizeof(*n));
                l3d_free(s->ctx, s->conns, s->capconns * sizeof(*n), BS_TAG);
                s->conns = n;
                s->capconns = ncap;
            }
        }
        if (s->nconns < s->capconns && s->nconns < s->maxconns)
            c = l3d_calloc(s->ctx, 1, sizeof(*c), BS_TAG);
        if (!c) {
            l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: refusing %s: %zu "
                    "connections are open already", peer, s->nconns);
            l3d_net_close(fd);
            continue;
        }
        c->fd = fd;
        c->rank = -1;
        c->hello_deadline = l3d_time_now() + s->timeout_s;
        snprintf(c->peer, sizeof(c->peer), "%s", peer);
        s->conns[s->nconns++] = c;
    }
}

static void *server_main(void *arg) {
    bs_server_t *s = arg;
    struct pollfd *pf = NULL;
    size_t pcap = 0;
    for (;;) {
        double now = l3d_time_now(), wake_at = s->draining ? s->drain_deadline : 0;
        if (s->draining && (s->ngone >= s->size || now >= s->drain_deadline)) break;
        size_t keep = 0;
        for (size_t i = 0; i < s->nconns; i++) {
            bs_conn_t *c = s->conns[i];
            if (c->fd >= 0 && c->rank < 0 && now >= c->hello_deadline) {
                if (c->closing) conn_close(s, c);  // refused, and it does not read the reason
                else conn_drop(s, c, "no hello within %g s", s->timeout_s);
            }
            if (c->fd < 0) {
                conn_free(s, c);
                continue;
            }
            if (c->rank < 0 && (!wake_at || c->hello_deadline < wake_at))
                wake_at = c->hello_deadline;
            s->conns[keep++] = c;
        }
        s->nconns = keep;
        if (pcap < s->nconns + 2) {
            l3d_free(s->ctx, pf, pcap * sizeof(*pf), BS_TAG);
            pcap = 2 * (s->nconns + 2);
            if (!(pf = l3d_malloc(s->ctx, pcap * sizeof(*pf), BS_TAG))) {
                l3d_log(s->ctx, L3D_LOG_ERROR, L3D_SUBSYS_COMM, "bootstrap: out of memory");
                pcap = 0;
                break;
            }
        }
        pf[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pf[1] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
        size_t npoll = s->nconns;
        for (size_t i = 0; i < npoll; i++) {
            bs_conn_t *c = s->conns[i];
            short ev = c->closing ? 0 : POLLIN;
            if (c->out_off < c->out_len) ev |= POLLOUT;
            pf[2 + i] = (struct pollfd){.fd = c->fd, .events = ev};
        }
        int tmo = -1;
        if (wake_at) tmo = wake_at <= now ? 0 : (int)L3D_MIN((wake_at - now) * 1000 + 1, 6e7);
        int n = poll(pf, npoll + 2, tmo);
        if (n < 0 && errno != EINTR) {
            l3d_log(s->ctx, L3D_LOG_ERROR, L3D_SUBSYS_COMM, "bootstrap: poll: %s",
                    strerror(errno));
            break;
        }
        if (n <= 0) continue;
        if (pf[0].revents) {
            double dl;
            if (read(s->wake[0], &dl, sizeof(dl)) == (ssize_t)sizeof(dl)) {
                s->draining = 1;
                s->drain_deadline = dl;
            }
        }
        for (size_t i = 0; i < npoll; i++) {
            bs_conn_t *c = s->conns[i];
            short re = pf[2 + i].revents;
            if (c->fd >= 0 && (re & POLLOUT)) conn_flush(s, c);
            if (c->fd >= 0 && (re & (POLLIN | POLLHUP | POLLERR))) {
                if (c->closing) conn_close(s, c);  // refused peer hung up or errored
                else conn_read(s, c);
            }
        }
        if (pf[1].revents & POLLIN) server_accept(s);
    }
    if (s->ngone < s->size && s->drain_deadline > 0) {
        char missing[256] = "";
        size_t o = 0;
        for (int r = 0; r < s->size && o + 16 < sizeof(missing); r++)
            if (s->joined[r] != 2)
                o += (size_t)snprintf(missing + o, sizeof(missing) - o, " %d", r);
        l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: closing the store before "
                "every rank said goodbye (missing:%s)", missing);
    }
    l3d_free(s->ctx, pf, pcap * sizeof(*pf), BS_TAG);
    return NULL;
}

static void server_free(bs_server_t *s) {
    for (size_t i = 0; i < s->nconns; i++) conn_free(s, s->conns[i]);
    l3d_free(s->ctx, s->conns, s->capconns * sizeof(bs_conn_t *), BS_TAG);
    for (size_t i = 0; i < s->captab; i++) {
        if (!s->tab[i].key) continue;
        l3d_strfree(s->ctx, s->tab[i].key);
        l3d_free(s->ctx, s->tab[i].val, s->tab[i].len ? s->tab[i].len : 1, BS_TAG);
    }
    l3d_free(s->ctx, s->tab, s->captab * sizeof(bs_entry_t), BS_TAG);
    l3d_free(s->ctx, s->joined, (size_t)s->size, BS_TAG);
    l3d_net_close(s->lfd);
    l3d_net_close(s->wake[0]);
    l3d_net_close(s->wake[1]);
    l3d_free(s->ctx, s, sizeof(*s), BS_TAG);
}

// Stops serving at `deadline` or when every rank has left, whichever is first, and frees.
static void server_stop(bs_server_t *s, double deadline) {
    if (s->started) {
        ssize_t w = write(s->wake[1], &deadline, sizeof(deadline));
        (void)w;  // a pipe write of 8 bytes into an empty pipe cannot be short
        pthread_join(s->thread, NULL);
    }
    server_free(s);
}

static l3d_status server_start(l3d_ctx_t *ctx, const l3d_launch_env_t *env, double timeout_s,
                               bs_server_t **s_p, int *port_p) {
    bs_server_t *s = l3d_calloc(ctx, 1, sizeof(*s), BS_TAG);
    if (!s) return L3D_ERR_NOMEM;
    s->ctx = ctx;
    s->size = env->size;
    s->timeout_s = timeout_s;
    s->maxconns = 2 * (size_t)env->size + 64;
    s->lfd = s->wake[0] = s->wake[1] = -1;
    snprintf(s->token, sizeof(s->token), "%s", env->job_token);
    char where[300];
    l3d_net_format_hostport(env->master_addr, env->master_port, where, sizeof(where));
    if (!(s->joined = l3d_calloc(ctx, (size_t)env->size, 1, BS_TAG))) {
        server_free(s);
        return L3D_ERR_NOMEM;
    }
    int rc = l3d_net_listen(env->master_addr, env->master_port, &s->lfd);
    if (rc) {
        server_free(s);
        if (rc == -ENXIO)
            return l3d_error(ctx, L3D_ERR_CONFIG, "bootstrap: rank 0 cannot listen on %s: the "
                             "host name does not resolve (check MASTER_ADDR)", where);
        // torchrun's static rendezvous keeps its own store on MASTER_PORT.
        const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        const char *hint = rc == -EADDRNOTAVAIL ? " (is MASTER_ADDR an address of rank 0's host?)"
                           : rc != -EADDRINUSE ? ""
                           : agent && !strcmp(agent, "True")
                               ? " (torchrun's own store holds MASTER_PORT: set L3D_MASTER_PORT "
                                 "to another free port for every rank)"
                               : " (another job on this port? pick another MASTER_PORT or "
                                 "L3D_MASTER_PORT)";
        return l3d_error(ctx, L3D_ERR_SYSTEM, "bootstrap: rank 0 cannot listen on %s: %s%s",
                         where, strerror(-rc), hint);
    }
    if ((rc = l3d_net_local_port(s->lfd, port_p)) || pipe(s->wake)) {
        rc = rc ? rc : -errno;
        server_free(s);
        return l3d_error(ctx, L3D_ERR_SYSTEM, "bootstrap: store set-up: %s", strerror(-rc));
    }
    // The store thread takes no signals: they belong to the application's threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        server_free(s);
        return l3d_error(ctx, L3D_ERR_SYSTEM, "bootstrap: cannot start the store thread: %s",
                         strerror(rc));
    }
    s->started = 1;
    *s_p = s;
    return L3D_OK;
}

// ---- client ----------------------------------------------------------------------------------
struct l3d_bootstrap {
    l3d_ctx_t *ctx;
    int rank, size;
    double timeout_s;
    int fd;
    int failed;  // a request failed: only destroy is allowed now
    char where[300];  // the store, "addr:port"
    bs_server_t *srv;
};

// Reads one reply before the deadline. VALUE payloads go into a buffer from malloc (libc
// nonzero: handed to the caller, who frees it with free()) or l3d_malloc (tag "bootstrap").
static l3d_status bs_reply(l3d_bootstrap_t *bs, double deadline, const char *what, int libc,
                           unsigned *type_p, void **val_p, size_t *len_p) {
    l3d_ctx_t *ctx = bs->ctx;
    uint8_t h[BS_HDR];
    int rc = l3d_net_recv_all(bs->fd, h, BS_HDR, deadline);
    bs->failed = 1;  // until this reply is known to be whole
    if (rc == -ETIMEDOUT)
        return l3d_error(ctx, L3D_ERR_TIMEOUT, "bootstrap: timed out after %g s waiting for %s",
                         bs->timeout_s, what);
    if (rc)
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "bootstrap: lost the store at %s while "
                         "waiting for %s: %s (did rank 0 exit?)", bs->where, what, strerror(-rc));
    unsigned type = get_u16(h + 6);
    uint32_t len = get_u32(h + 8);
    if (get_u32(h) != BS_MAGIC || get_u16(h + 4) != BS_VERSION ||
        (type != T_OK && type != T_VALUE && type != T_ERROR) || len > type_cap(type))
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "bootstrap: %s sent a malformed reply (is "
                         "it a llama3d store of this version?)", bs->where);
    size_t asz = len ? len : 1;
    uint8_t *body = libc && type == T_VALUE ? malloc(asz) : l3d_malloc(ctx, asz, BS_TAG);
    if (!body) return l3d_error(ctx, L3D_ERR_NOMEM, "bootstrap: no memory for %u bytes", len);
    rc = l3d_net_recv_all(bs->fd, body, len, deadline);
    int own = !(libc && type == T_VALUE);
    if (rc) {
        if (own) l3d_free(ctx, body, asz, BS_TAG);
        else free(body);
        return l3d_error(ctx, rc == -ETIMEDOUT ? L3D_ERR_TIMEOUT : L3D_ERR_PEER_FAILED,
                         "bootstrap: the reply from %s broke off: %s", bs->where, strerror(-rc));
    }
    if (type == T_ERROR) {
        char text[BS_TEXT_MAX + 1] = "";
        unsigned code = len >= 2 ? get_u16(body) : 0;
        if (len >= 2) memcpy(text, body + 2, len - 2);
        l3d_free(ctx, body, asz, BS_TAG);
        if (code == E_TOKEN)
            return l3d_error(ctx, L3D_ERR_CONFIG, "job token mismatch: this process is not part "
                             "of the job served at %s (check L3D_JOB_TOKEN)", bs->where);
        if (code == E_SIZE || code == E_RANK)
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
        l3d_free(ctx, body, asz, BS_TAG);
    }
    return L3D_OK;
}

// Sends header + (u16 n, key) + data, then waits for the reply of type `want`.
static l3d_status bs_request(l3d_bootstrap_t *bs, unsigned type, const char *key,
                             const void *data, size_t dlen, double deadline, const char *what,
                             int libc, unsigned want, void **val_p, size_t *len_p) {
    l3d_ctx_t *ctx = bs->ctx;
    if (bs->failed)
        return l3d_error(ctx, L3D_ERR_INVALID_ARG, "bootstrap: an earlier request to %s failed; "
                         "the handle can only be destroyed", bs->where);
    uint8_t h[BS_HDR + 2 + BS_KEY_MAX];
    size_t klen = key ? strlen(key) : 0, n = BS_HDR;
    if (key) {
        put_u16(h + BS_HDR, (unsigned)klen);
        memcpy(h + BS_HDR + 2, key, klen);
        n += 2 + klen;
    }
    put_hdr(h, type, n - BS_HDR + dlen);
    int rc = l3d_net_send_all(bs->fd, h, n, deadline);
    if (!rc && dlen) rc = l3d_net_send_all(bs->fd, data, dlen, deadline);
    if (rc) {
        bs->failed = 1;
        return l3d_error(ctx, rc == -ETIMEDOUT ? L3D_ERR_TIMEOUT : L3D_ERR_PEER_FAILED,
                         "bootstrap: cannot send to the store at %s: %s", bs->where,
                         strerror(-rc));
    }
    unsigned got = 0;
    L3D_CHECK(ctx, bs_reply(bs, deadline, what, libc, &got, val_p, len_p));
    if (got != want) {
        if (val_p) {
            if (libc && got == T_VALUE) free(*val_p);
            else l3d_free(ctx, *val_p, *len_p ? *len_p : 1, BS_TAG);
        }
        bs->failed = 1;
        return l3d_error(ctx, L3D_ERR_PEER_FAILED, "bootstrap: %s answered %s with %s",
                         bs->where, type_name(type), type_name(got));
    }
    return L3D_OK;
}

static l3d_status check_key(l3d_bootstrap_t *bs, const char *key) {
    if (!key || !key[0] || strlen(key) > BS_KEY_MAX)
        return l3d_error(bs->ctx, L3D_ERR_INVALID_ARG, "bootstrap: key '%.40s' must be 1 to %d "
                         "bytes", key ? key : "", BS_KEY_MAX);
    return L3D_OK;
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
    if (env->rank == 0) L3D_CHECK_GOTO(ctx, server_start(ctx, env, timeout_s, &bs->srv, &port),
                                       st, fail);
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
    uint8_t hello[10 + BS_TOKEN_MAX];
    size_t tlen = strlen(env->job_token);
    put_u32(hello, (uint32_t)env->rank);
    put_u32(hello + 4, (uint32_t)env->size);
    put_u16(hello + 8, (unsigned)tlen);
    memcpy(hello + 10, env->job_token, tlen);
    char what[400];
    snprintf(what, sizeof(what), "the store at %s to accept rank %d", bs->where, env->rank);
    L3D_CHECK_GOTO(ctx, bs_request(bs, T_HELLO, NULL, hello, 10 + tlen, deadline, what, 0, T_OK,
                                   NULL, NULL), st, fail);
    l3d_log(ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM, "bootstrap: rank %d of %d joined the store at "
            "%s", env->rank, env->size, bs->where);
    *bs_p = bs;
    return L3D_OK;
fail:
    l3d_net_close(bs->fd);
    if (bs->srv) server_stop(bs->srv, 0);
    l3d_free(ctx, bs, sizeof(*bs), BS_TAG);
    return st;
}

void l3d_bootstrap_destroy(l3d_bootstrap_t *bs) {
    if (!bs) return;
    double deadline = l3d_time_now() + bs->timeout_s;
    if (bs->fd >= 0) {
        uint8_t h[BS_HDR];
        put_hdr(h, T_BYE, 0);
        l3d_net_send_all(bs->fd, h, BS_HDR, deadline);  // best effort: the store may be gone
        l3d_net_close(bs->fd);
    }
    if (bs->srv) server_stop(bs->srv, deadline);
    l3d_free(bs->ctx, bs, sizeof(*bs), BS_TAG);
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
    return bs_request(bs, T_PUT, key, val, len, l3d_time_now() + bs->timeout_s, what, 0, T_OK,
                      NULL, NULL);
}

static l3d_status get_wait(l3d_bootstrap_t *bs, const char *key, double deadline,
                           const char *why, int libc, void **val_p, size_t *len_p) {
    L3D_CHECK(bs->ctx, check_key(bs, key));
    char what[400];
    snprintf(what, sizeof(what), "key '%s' (%s)", key, why);
    return bs_request(bs, T_GET, key, NULL, 0, deadline, what, libc, T_VALUE, val_p, len_p);
}

l3d_status l3d_bootstrap_get(l3d_bootstrap_t *bs, const char *key, void **val_p, size_t *len_p) {
    return get_wait(bs, key, l3d_time_now() + bs->timeout_s, "no rank has put it yet", 1, val_p,
                    len_p);
}

void l3d_bootstrap_free_all(l3d_bootstrap_t *bs, void **all, size_t *lens) {
    if (!all) return;
    for (int i = 0; i < bs->size; i++)
        if (all[i]) l3d_free(bs->ctx, all[i], lens[i] ? lens[i] : 1, BS_TAG);
    l3d_free(bs->ctx, all, (size_t)bs->size * sizeof(void *), BS_TAG);
    l3d_free(bs->ctx, lens, (size_t)bs->size * sizeof(size_t), BS_TAG);
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
    void **all = l3d_calloc(ctx, (size_t)bs->size, sizeof(void *), BS_TAG);
    size_t *lens = l3d_calloc(ctx, (size_t)bs->size, sizeof(size_t), BS_TAG);
    l3d_status st = L3D_OK;
    if (!all || !lens) {
        st = L3D_ERR_NOMEM;
        goto fail;
    }
    for (int i = 0; i < bs->size; i++) {
        if (i == bs->rank) {
            if (!(all[i] = l3d_malloc(ctx, len ? len : 1, BS_TAG))) {
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
        L3D_CHECK_GOTO(ctx, get_wait(bs, key, deadline, why, 0, &all[i], &lens[i]), st, fail);
    }
    *all_p = all;
    *lens_p = lens;
    return L3D_OK;
fail:
    if (all && lens) {
        l3d_bootstrap_free_all(bs, all, lens);
    } else {
        l3d_free(ctx, all, (size_t)bs->size * sizeof(void *), BS_TAG);
        l3d_free(ctx, lens, (size_t)bs->size * sizeof(size_t), BS_TAG);
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
        L3D_CHECK(ctx, get_wait(bs, key, deadline, why, 0, &v, &n));
        l3d_free(ctx, v, n ? n : 1, BS_TAG);
        return L3D_OK;
    }
    for (int i = 1; i < bs->size; i++) {
        snprintf(key, sizeof(key), "barrier/%s/%d", tag, i);
        snprintf(why, sizeof(why), "rank %d never joined?", i);
        L3D_CHECK(ctx, get_wait(bs, key, deadline, why, 0, &v, &n));
        l3d_free(ctx, v, n ? n : 1, BS_TAG);
    }
    snprintf(key, sizeof(key), "barrier/%s/done", tag);
    return l3d_bootstrap_put(bs, key, NULL, 0);
}
