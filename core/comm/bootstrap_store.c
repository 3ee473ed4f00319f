// Bootstrap: the TCP key-value store rank 0 serves (wire format in core/comm/bootstrap_wire.h).
//
// The store is a thread of rank 0's process (poll over every connection, non-blocking I/O,
// so one stalled or hostile peer cannot hold up the others). Rank 0's destroy keeps it
// serving until every rank has said BYE (or left), bounded by the timeout. Each connection
// runs a header/payload state machine; every length is checked against its type's cap
// before anything is allocated, and a violation drops that connection only.
//
// The port needs no token to connect, so connections that have not said a valid HELLO are
// kept on a short leash: they must send one within BS_HELLO_S, at most BS_UNAUTH_MAX of them
// are kept (a new one evicts the oldest, so a real rank always gets in), and the warnings about
// them are rate-limited (the first BS_WARN_FIRST one by one, then one summary line per
// BS_WARN_EVERY_S). Before, 72 idle connections filled every slot and the ranks could not
// join, and 200 flooders logged 25,000 lines.
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm/bootstrap.h"
#include "core/comm/bootstrap_wire.h"
#include "core/l3d_core.h"
#include "platform/net.h"
#include "platform/platform.h"

#define BS_OUTQ_MAX ((size_t)64 << 20)  // replies a peer may leave unread before it is dropped
#define BS_HELLO_S 2.0        // a new connection's time to send HELLO (a rank sends it at once)
#define BS_UNAUTH_MAX 64      // connections kept that have not sent a valid HELLO yet
#define BS_WARN_FIRST 8       // warnings about such connections logged one by one
#define BS_WARN_EVERY_S 10.0  // then one summary line per this interval

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

typedef struct l3d_bootstrap_store bs_server_t;

struct l3d_bootstrap_store {
    l3d_ctx_t *ctx;
    int size;
    char token[BS_TOKEN_MAX + 1];
    double timeout_s;
    int lfd, wake[2];
    pthread_t thread;
    int started;
    bs_conn_t **conns;
    size_t nconns, capconns, maxconns;
    int warn_left;        // individual warnings left about connections without a valid HELLO
    unsigned long nquiet; // ... closed without a warning since the last summary line
    char quiet_last[64];  // the last of those
    double next_summary;
    bs_entry_t *tab;  // open addressing, capacity a power of two, at most half full
    size_t ntab, captab;
    uint8_t *joined;  // per rank: 0 not yet, 1 connected, 2 gone (BYE or disconnected)
    int ngone;
    int draining;
    double drain_deadline;
};

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

// Whether to log a warning about connection c: always for a rank, the first BS_WARN_FIRST
// times for connections that never sent a valid HELLO; the rest are counted for the summary.
static int conn_warn_ok(bs_server_t *s, bs_conn_t *c) {
    if (c->rank >= 0) return 1;
    if (s->warn_left > 0) {
        if (--s->warn_left == 0)
            l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: further connections "
                    "without a valid hello are summarised every %g s", BS_WARN_EVERY_S);
        return 1;
    }
    if (!s->nquiet) s->next_summary = L3D_MAX(s->next_summary, l3d_time_now());
    s->nquiet++;
    snprintf(s->quiet_last, sizeof(s->quiet_last), "%s", c->peer);
    return 0;
}

static void quiet_summary(bs_server_t *s, double now, int final) {
    if (!s->nquiet || (!final && now < s->next_summary)) return;
    l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: closed %lu connections that sent "
            "no valid hello (the last from %s)", s->nquiet, s->quiet_last);
    s->nquiet = 0;
    s->next_summary = now + BS_WARN_EVERY_S;
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
    bs_put_hdr(c->out + c->out_len, type, alen + blen);
    if (alen) memcpy(c->out + c->out_len + BS_HDR, a, alen);
    if (blen) memcpy(c->out + c->out_len + BS_HDR + alen, b, blen);
    c->out_len = need;
    conn_flush(s, c);
    return 0;
}

static void send_error(bs_server_t *s, bs_conn_t *c, unsigned code, const char *text) {
    uint8_t p[2];
    bs_put_u16(p, code);
    if (conn_queue(s, c, BS_T_ERROR, p, 2, text, L3D_MIN(strlen(text), (size_t)BS_TEXT_MAX)) == 0)
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
    if (conn_warn_ok(s, c))
        l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: dropping the connection from "
                "%s%s: %s", c->peer, who, why);
    uint8_t msg[BS_HDR + 2 + sizeof(why)];
    size_t n = strlen(why);
    bs_put_hdr(msg, BS_T_ERROR, 2 + n);
    bs_put_u16(msg + BS_HDR, BS_E_PROTOCOL);
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
    size_t n = bs_get_u16(p);
    if (n < 1 || n > BS_KEY_MAX || 2 + n > len || memchr(p + 2, 0, n)) return -1;
    memcpy(key, p + 2, n);
    key[n] = 0;
    *used = 2 + n;
    return 0;
}

static void on_hello(bs_server_t *s, bs_conn_t *c, const uint8_t *p, size_t len) {
    if (len < 10 || 10 + bs_get_u16(p + 8) != len) {
        conn_drop(s, c, "malformed hello (%zu bytes)", len);
        return;
    }
    uint32_t rank = bs_get_u32(p), size = bs_get_u32(p + 4);
    size_t tlen = bs_get_u16(p + 8);
    char why[160];
    unsigned code = 0;
    if (tlen != strlen(s->token) || memcmp(p + 10, s->token, tlen)) {
        code = BS_E_TOKEN;
        snprintf(why, sizeof(why), "job token mismatch");
    } else if (size != (uint32_t)s->size) {
        code = BS_E_SIZE;
        snprintf(why, sizeof(why), "world size mismatch: it says %u ranks, this job has %d", size,
                 s->size);
    } else if (rank >= size) {
        code = BS_E_RANK;
        snprintf(why, sizeof(why), "rank %u is out of range for a world of %d", rank, s->size);
    } else if (s->joined[rank]) {
        code = BS_E_RANK;
        snprintf(why, sizeof(why), "rank %u has already joined (two processes with one rank?)",
                 rank);
    }
    if (code) {
        if (conn_warn_ok(s, c))
            l3d_log(s->ctx, L3D_LOG_WARN, L3D_SUBSYS_COMM, "bootstrap: refused %s (claims rank "
                    "%u of %u): %s%s", c->peer, rank, size, why, code == BS_E_TOKEN ? "; it "
                    "belongs to another job or its L3D_JOB_TOKEN differs" : "");
        send_error(s, c, code, why);
        return;
    }
    c->rank = (int)rank;
    s->joined[rank] = 1;
    l3d_log(s->ctx, L3D_LOG_DEBUG, L3D_SUBSYS_COMM, "bootstrap: rank %u joined from %s", rank,
            c->peer);
    if (conn_queue(s, c, BS_T_OK, NULL, 0, NULL, 0)) conn_drop(s, c, "cannot queue a reply");
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
    if (conn_queue(s, c, BS_T_OK, NULL, 0, NULL, 0)) conn_drop(s, c, "cannot queue a reply");
    for (size_t i = 0; i < s->nconns; i++) {
        bs_conn_t *w = s->conns[i];
        if (w->fd < 0 || !w->pending || strcmp(w->pending, key)) continue;
        l3d_strfree(s->ctx, w->pending);
        w->pending = NULL;
        if (conn_queue(s, w, BS_T_VALUE, e->val, e->len, NULL, 0))
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
        if (conn_queue(s, c, BS_T_VALUE, e->val, e->len, NULL, 0))
            conn_drop(s, c, "does not read its replies");
    } else if (!(c->pending = l3d_strdup(s->ctx, key))) {
        conn_drop(s, c, "out of memory for key '%s'", key);
    }
}

static void on_message(bs_server_t *s, bs_conn_t *c) {
    const uint8_t *p = c->body;
    size_t len = c->body_len;
    if (c->rank < 0 && c->type != BS_T_HELLO)
        conn_drop(s, c, "%s before hello", bs_type_name(c->type));
    else if (c->rank >= 0 && c->type == BS_T_HELLO) conn_drop(s, c, "a second hello");
    else if (c->type == BS_T_HELLO) on_hello(s, c, p, len);
    else if (c->type == BS_T_PUT) on_put(s, c, p, len);
    else if (c->type == BS_T_GET) on_get(s, c, p, len);
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
            uint32_t magic = bs_get_u32(c->hdr), len = bs_get_u32(c->hdr + 8);
            unsigned ver = bs_get_u16(c->hdr + 4);
            c->type = bs_get_u16(c->hdr + 6);
            int known = c->type == BS_T_HELLO || c->type == BS_T_PUT || c->type == BS_T_GET ||
                        c->type == BS_T_BYE;
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
            if (len > bs_type_cap(c->type)) {
                conn_drop(s, c, "a %s message of %u bytes (the limit is %zu)",
                          bs_type_name(c->type), len, bs_type_cap(c->type));
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
        if (conn_warn_ok(s, c))
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
        // At the cap of connections without a valid HELLO, the oldest one makes room: a
        // flood of idle connections then cannot keep a real rank out.
        size_t unauth = 0;
        bs_conn_t *oldest = NULL;
        for (size_t i = 0; i < s->nconns; i++) {
            bs_conn_t *o = s->conns[i];
            if (o->fd < 0 || o->rank >= 0) continue;
            unauth++;
            if (!oldest || o->hello_deadline < oldest->hello_deadline) oldest = o;
        }
        if (unauth >= BS_UNAUTH_MAX && oldest) {
            if (oldest->closing) conn_close(s, oldest);
            else conn_drop(s, oldest, "%d connections without a hello are open; the oldest "
                           "makes room", BS_UNAUTH_MAX);
        }
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
        c->hello_deadline = l3d_time_now() + L3D_MIN(s->timeout_s, BS_HELLO_S);
        snprintf(c->peer, sizeof(c->peer), "%s", peer);
        s->conns[s->nconns++] = c;
    }
}

// Bytes wait on fd now. A connection past its hello deadline with its hello already there
// (the server thread ran late: a loaded machine) is read, not dropped; it is judged again
// once its bytes are consumed, so a peer trickling bytes gains nothing.
static int has_input(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
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
            if (c->fd >= 0 && c->rank < 0 && now >= c->hello_deadline &&
                (c->closing || !has_input(c->fd))) {
                if (c->closing) conn_close(s, c);  // refused, and it does not read the reason
                else conn_drop(s, c, "no hello within %g s", L3D_MIN(s->timeout_s, BS_HELLO_S));
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
        quiet_summary(s, now, 0);
        if (s->nquiet && (!wake_at || s->next_summary < wake_at)) wake_at = s->next_summary;
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
    quiet_summary(s, l3d_time_now(), 1);
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

void l3d_bootstrap_store_stop(bs_server_t *s, double deadline) {
    if (s->started) {
        ssize_t w = write(s->wake[1], &deadline, sizeof(deadline));
        (void)w;  // a pipe write of 8 bytes into an empty pipe cannot be short
        pthread_join(s->thread, NULL);
    }
    server_free(s);
}

l3d_status l3d_bootstrap_store_start(l3d_ctx_t *ctx, const l3d_launch_env_t *env,
                                     double timeout_s, bs_server_t **s_p, int *port_p) {
    bs_server_t *s = l3d_calloc(ctx, 1, sizeof(*s), BS_TAG);
    if (!s) return L3D_ERR_NOMEM;
    s->ctx = ctx;
    s->size = env->size;
    s->timeout_s = timeout_s;
    s->maxconns = (size_t)env->size + BS_UNAUTH_MAX + 16;  // + closing ones awaiting cleanup
    s->warn_left = BS_WARN_FIRST;
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
