// TCP sockets: every wait is a poll() bounded by a deadline, so a silent peer can cost time
// but never hang a caller. Every function returns 0 or a negative errno value.
#define _GNU_SOURCE  // accept4, SOCK_NONBLOCK, SOCK_CLOEXEC
#include "platform/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"

// Milliseconds left until `deadline` for poll(), at least 0, capped so the int cannot wrap.
static int ms_until(double deadline) {
    double left = deadline - l3d_time_now();
    if (left <= 0) return 0;
    if (left > 86400.0) left = 86400.0;
    return (int)(left * 1000.0) + 1;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int resolve(const char *host, int port, struct addrinfo **res) {
    char serv[16];
    snprintf(serv, sizeof(serv), "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;  // no AI_ADDRCONFIG: it hides 127.0.0.1 on hosts with only lo
    int rc = getaddrinfo(host, serv, &hints, res);
    switch (rc) {
    case 0: return 0;
    case EAI_AGAIN: return -EAGAIN;
    case EAI_MEMORY: return -ENOMEM;
    case EAI_SYSTEM: return errno ? -errno : -EIO;
    default: return -ENXIO;
    }
}

static void format_sockaddr(const struct sockaddr *sa, char *buf, size_t len) {
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
    }
    l3d_net_format_hostport(host, port, buf, len);
}

void l3d_net_format_hostport(const char *host, int port, char *buf, size_t len) {
    if (strchr(host, ':') && host[0] != '[') snprintf(buf, len, "[%s]:%d", host, port);
    else snprintf(buf, len, "%s:%d", host, port);
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int l3d_net_listen(const char *host, int port, int *fd_p) {
    if (!host || !host[0] || port < 0 || port > 65535) return -EINVAL;
    struct addrinfo *res = NULL;
    int rc = resolve(host, port, &res);
    if (rc) return rc;
    rc = -EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        ai->ai_protocol);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            freeaddrinfo(res);
            *fd_p = fd;
            return 0;
        }
        rc = -errno;
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

int l3d_net_local_port(int fd, int *port_p) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -errno;
    if (ss.ss_family == AF_INET) *port_p = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6) *port_p = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    else return -EAFNOSUPPORT;
    return 0;
}

int l3d_net_free_port(const char *host, int *port_p) {
    int fd = -1;
    int rc = l3d_net_listen(host, 0, &fd);
    if (rc) return rc;
    rc = l3d_net_local_port(fd, port_p);
    close(fd);
    return rc;
}

int l3d_net_accept(int lfd, int *fd_p, char *peer, size_t peerlen) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd;
    do {
        fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return (errno == EWOULDBLOCK) ? -EAGAIN : -errno;
    set_nodelay(fd);
    if (peer && peerlen) format_sockaddr((struct sockaddr *)&ss, peer, peerlen);
    *fd_p = fd;
    return 0;
}

static int retryable(int err) {
    switch (err) {
    case ECONNREFUSED: case ETIMEDOUT: case EHOSTUNREACH: case ENETUNREACH: case ENETDOWN:
    case ECONNRESET: case ECONNABORTED: case EAGAIN: case EINTR: case EADDRNOTAVAIL:
        return 1;
    default: return 0;
    }
}

// One connection attempt to one address, bounded by the deadline (and 2 s, so that a
// black-holed address does not use up the whole budget before the next is tried).
static int connect_one(const struct addrinfo *ai, double deadline, int *fd_p) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) return -errno;
    int rc = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            rc = -errno;
        } else {
            double d = l3d_time_now() + 2.0;
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int n = poll(&p, 1, ms_until(d < deadline ? d : deadline));
            int err = 0;
            socklen_t el = sizeof(err);
            if (n == 0) rc = -ETIMEDOUT;
            else if (n < 0) rc = -errno;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) rc = -errno;
            else rc = -err;
        }
    }
    if (rc) {
        close(fd);
        return rc;
    }
    set_nodelay(fd);
    *fd_p = fd;
    return 0;
}

int l3d_net_connect(const char *host, int port, double deadline, int *fd_p, int *last_err_p) {
    if (!host || !host[0] || port <= 0 || port > 65535) return -EINVAL;
    double backoff = 0.01;
    int last = ETIMEDOUT;
    for (;;) {
        struct addrinfo *res = NULL;
        int rc = resolve(host, port, &res);
        if (rc == 0) {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                rc = connect_one(ai, deadline, fd_p);
                if (rc == 0) break;
                last = -rc;
            }
            freeaddrinfo(res);
            if (rc == 0) return 0;
        } else {
            last = -rc;
        }
        if (!retryable(last)) return -last;
        double left = deadline - l3d_time_now();
        if (left <= 0) {
            if (last_err_p) *last_err_p = last;
            return -ETIMEDOUT;
        }
        sleep_s(backoff < left ? backoff : left);
        backoff = backoff * 2 < 0.25 ? backoff * 2 : 0.25;
    }
}

static int wait_fd(int fd, short events, double deadline) {
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int n = poll(&p, 1, ms_until(deadline));
        if (n > 0) return 0;
        if (n == 0) return -ETIMEDOUT;
        if (errno != EINTR) return -errno;
    }
}

int l3d_net_send_all(int fd, const void *buf, size_t len, double deadline) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc) return rc;
        } else if (n < 0 && errno != EINTR) {
            return -errno;
        }
    }
    return 0;
}

int l3d_net_recv_all(int fd, void *buf, size_t len, double deadline) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return -ECONNRESET;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc) return rc;
        } else if (errno != EINTR) {
            return -errno;
        }
    }
    return 0;
}

int l3d_net_send_some(int fd, const void *buf, size_t len, size_t *n_p) {
    *n_p = 0;
    for (;;) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n >= 0) {
            *n_p = (size_t)n;
            return 0;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno != EINTR) return -errno;
    }
}

int l3d_net_recv_some(int fd, void *buf, size_t len, size_t *n_p) {
    *n_p = 0;
    for (;;) {
        ssize_t n = recv(fd, buf, len, 0);
        if (n >= 0) {
            *n_p = (size_t)n;
            return 0;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return -EAGAIN;
        if (errno != EINTR) return -errno;
    }
}

int l3d_net_peer_name(int fd, char *buf, size_t len) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) return -errno;
    format_sockaddr((struct sockaddr *)&ss, buf, len);
    return 0;
}

void l3d_net_close(int fd) {
    if (fd >= 0) close(fd);
}
