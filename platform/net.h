// TCP sockets for the bootstrap store: listen, connect with retry, and deadline-bounded
// transfers. Knows nothing of llama3d's objects.
// defines: l3d_net_*
//
// Every socket made here is non-blocking, close-on-exec and TCP_NODELAY; the *_all calls wait
// with poll() until their deadline, so no call can hang past it. Deadlines are absolute
// l3d_time_now() seconds. Functions return 0 or a negative errno value, like the rest of
// platform/; a host name that does not resolve is -ENXIO. Sends never raise SIGPIPE.
#ifndef L3D_NET_H
#define L3D_NET_H

#include <stddef.h>

// Listens on exactly host:port (an IPv4 or IPv6 literal, or a host name, whose first
// resolved address that can be bound is used; "0.0.0.0" or "::" mean every interface only when
// written so). port 0 picks a free port (see l3d_net_local_port). SO_REUSEADDR is set so a
// restarted job can reuse a port in TIME_WAIT.
int l3d_net_listen(const char *host, int port, int *fd_p);
// The port a bound socket has.
int l3d_net_local_port(int fd, int *port_p);
// A port that is free on `host` right now (bind to port 0, read it, close). Another process
// may take it before the caller binds it; launchers accept that race, as torchrun does.
int l3d_net_free_port(const char *host, int *port_p);
// Accepts one pending connection: 0 with *fd_p and the peer as "addr:port" ("[v6]:port") in
// peer, or -EAGAIN when none is pending.
int l3d_net_accept(int lfd, int *fd_p, char *peer, size_t peerlen);
// Connects to host:port, retrying while the peer is not there yet (refused, unreachable,
// name not yet resolvable) until the deadline. -ETIMEDOUT at the deadline, with the last
// attempt's errno in *last_err_p (may be NULL); other errors return at once.
int l3d_net_connect(const char *host, int port, double deadline, int *fd_p, int *last_err_p);

// Sends / receives exactly len bytes before the deadline (-ETIMEDOUT after it). recv_all
// returns -ECONNRESET when the peer closes before len bytes arrived.
int l3d_net_send_all(int fd, const void *buf, size_t len, double deadline);
int l3d_net_recv_all(int fd, void *buf, size_t len, double deadline);
// One non-blocking attempt. send_some: 0 with *n_p bytes sent (0 when the socket is full).
// recv_some: 0 with *n_p > 0 bytes, 0 with *n_p == 0 at end of stream, -EAGAIN when nothing
// is there yet.
int l3d_net_send_some(int fd, const void *buf, size_t len, size_t *n_p);
int l3d_net_recv_some(int fd, void *buf, size_t len, size_t *n_p);

// The remote end of a connected socket as "addr:port".
int l3d_net_peer_name(int fd, char *buf, size_t len);
// Formats host and port the way peers are shown ("h:p", IPv6 literals as "[h]:p").
void l3d_net_format_hostport(const char *host, int port, char *buf, size_t len);
void l3d_net_close(int fd);

#endif
