// l3d serve's HTTP, on libmicrohttpd (linked dynamically: LGPL): a thread per connection,
// which may wait for its answer; the API key; bodies held to a limit (413); answers plain or
// streamed as server-sent events (chunked); and a client that goes away cancels its
// generation at once: while a connection waits for tokens it watches its socket for the
// hangup (POLLRDHUP) and cancels the engine's request.
// defines: l3d_serve_http_start, l3d_serve_http_quiesce, l3d_serve_http_stop
#define _GNU_SOURCE  // POLLRDHUP
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/serve.h"

typedef struct conn {
    char *body;
    size_t len, cap;
    int too_big;
    int answered;  // 413 went out with the headers: the body is not read
} conn_t;

static int hung_up(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

// Waits (hr->mu held) up to 100 ms for news; a hung-up client cancels the request.
static void wait_news(hreq_t *hr) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&hr->cv, &hr->mu, &ts);
    if (!hr->finished && !hr->gone && hung_up(hr->fd)) {
        hr->gone = 1;
        pthread_mutex_unlock(&hr->mu);
        (void)l3d_engine_cancel(hr->s->engine, hr->engine_id);
        pthread_mutex_lock(&hr->mu);
    }
}

static enum MHD_Result reply(srv_t *s, struct MHD_Connection *c, int status, char *body,
                             const char *ctype) {
    if (!body)
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    size_t n = body ? strlen(body) : 0;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 429) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    l3d_serve_count_status(s, status);
    return ok;
}

static enum MHD_Result reply_error(srv_t *s, struct MHD_Connection *c, int status, const char *msg,
                                   const char *code) {
    char *body = NULL;
    l3d_serve_fail(&body, status, NULL, code, "%s", msg);
    return reply(s, c, status, body, "application/json");
}

// ---- streaming ---------------------------------------------------------------------------------
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    hreq_t *hr = cls;
    pthread_mutex_lock(&hr->mu);
    while (hr->osent == hr->olen && !hr->finished && !hr->gone) wait_news(hr);
    ssize_t n;
    if (hr->osent < hr->olen) {
        size_t k = hr->olen - hr->osent < max ? hr->olen - hr->osent : max;
        memcpy(buf, hr->out + hr->osent, k);
        hr->osent += k;
        n = (ssize_t)k;
    } else {
        n = hr->gone ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_unlock(&hr->mu);
    return n;
}

// The response is gone (sent, or the client went away): a request still running is cancelled.
static void stream_free(void *cls) {
    hreq_t *hr = cls;
    pthread_mutex_lock(&hr->mu);
    int running = !hr->finished;
    hr->gone |= running;
    pthread_mutex_unlock(&hr->mu);
    if (running) (void)l3d_engine_cancel(hr->s->engine, hr->engine_id);
    l3d_serve_hreq_release(hr);
}

// ---- a request ---------------------------------------------------------------------------------
static int key_ok(srv_t *s, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    const char *k = h + 7;
    size_t a = strlen(k), b = strlen(s->api_key);
    unsigned diff = a != b;
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(k[i] ^ s->api_key[i]);
    return diff == 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    srv_t *s = cls;
    conn_t *k = *con_cls;
    if (!k) {  // the headers: a body announced over the limit is refused before it is read
        k = calloc(1, sizeof(*k));
        if (!k) return MHD_NO;
        *con_cls = k;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->body_max) {
            k->too_big = k->answered = 1;
            char msg[160];
            snprintf(msg, sizeof(msg), "the body (%s bytes) is over the limit of %zu bytes", cl,
                     s->body_max);
            return reply_error(s, c, 413, msg, "body_too_large");
        }
        return MHD_YES;
    }
    if (k->answered) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!k->too_big && k->len + *upload_size > s->body_max) k->too_big = 1;
        if (!k->too_big) {
            if (k->len + *upload_size + 1 > k->cap) {
                size_t cap = k->cap ? k->cap : 4096;
                while (cap < k->len + *upload_size + 1) cap *= 2;
                char *b = realloc(k->body, cap);
                if (!b) return MHD_NO;
                k->body = b, k->cap = cap;
            }
            memcpy(k->body + k->len, upload, *upload_size);
            k->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (s->api_key && strcmp(url, "/health") && !key_ok(s, c))
        return reply_error(s, c, 401, "a valid API key is required: Authorization: Bearer KEY",
                           "invalid_api_key");
    if (k->too_big) {
        char msg[120];
        snprintf(msg, sizeof(msg), "the body is over the limit of %zu bytes", s->body_max);
        return reply_error(s, c, 413, msg, "body_too_large");
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    char *out = NULL;
    const char *ctype = "application/json";
    hreq_t *hr = NULL;
    int status = l3d_serve_handle(s, method, url, k->body ? k->body : "", k->len, fd, &out,
                                  &ctype, &hr);
    if (status) return reply(s, c, status, out, ctype);
    if (hr->stream) {  // the stream holds the connection's reference from here
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                   stream_read, hr, stream_free);
        if (!r) {
            stream_free(hr);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        l3d_serve_count_status(s, 200);
        return ok;
    }
    pthread_mutex_lock(&hr->mu);
    while (!hr->finished) wait_news(hr);
    int gone = hr->gone, fin = hr->finish;
    pthread_mutex_unlock(&hr->mu);
    enum MHD_Result ok;
    if (gone) ok = MHD_NO;  // (nobody to answer)
    else if (fin == L3D_GEN_TIMEOUT)
        ok = reply_error(s, c, 408, "the request's time limit passed (--timeout)", "timeout");
    else if (fin == L3D_GEN_CANCELLED)
        ok = reply_error(s, c, 503, "cancelled: the server is shutting down", "shutting_down");
    else if (fin == L3D_GEN_ERROR)
        ok = reply_error(s, c, 500, "the model failed; see the server's log", NULL);
    else
        ok = reply(s, c, 200, l3d_serve_finish_body(hr), "application/json");
    l3d_serve_hreq_release(hr);
    return ok;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    conn_t *k = *con_cls;
    if (!k) return;
    free(k->body);
    free(k);
    *con_cls = NULL;
}

struct MHD_Daemon *l3d_serve_http_start(srv_t *s, const char *host, int port, int conns,
                                        int *port_p) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc) {
        fprintf(stderr, "l3d serve: --host %s: %s\n", host, gai_strerror(rc));
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)conns, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)120, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "l3d serve: cannot listen on %s:%d (in use, or not an address of this "
                "machine)\n", host, port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port_p = di ? di->port : port;
    return d;
}

void l3d_serve_http_quiesce(struct MHD_Daemon *d) {
    MHD_socket fd = MHD_quiesce_daemon(d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void l3d_serve_http_stop(struct MHD_Daemon *d) { MHD_stop_daemon(d); }
