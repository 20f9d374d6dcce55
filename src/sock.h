/*
 * nccl-net-rail: non-blocking TCP sockets, shared by the TCP transport and
 * the verbs transport's out-of-band handshake.
 */
#ifndef RAIL_SOCK_H
#define RAIL_SOCK_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

union rail_sockaddr {
	struct sockaddr sa;
	struct sockaddr_in sin;
	struct sockaddr_in6 sin6;
};

#define RAIL_ADDR_STRLEN (INET6_ADDRSTRLEN + 16)

/* "1.2.3.4:5" or "[fe80::1%eth0]:5". */
const char *rail_sockaddr_str(const union rail_sockaddr *a, char *buf, size_t len);
#define RAIL_ADDRSTR(a) rail_sockaddr_str((a), (char[RAIL_ADDR_STRLEN]){0}, RAIL_ADDR_STRLEN)
socklen_t rail_sockaddr_len(const union rail_sockaddr *a);
int rail_sockaddr_port(const union rail_sockaddr *a);
void rail_sockaddr_set_port(union rail_sockaddr *a, int port);
/* Parse "ip", "ip:port", "[ipv6]:port". */
int rail_sockaddr_parse(const char *text, union rail_sockaddr *out);

/*
 * "PORT", "HOST:PORT" or "[IPv6]:PORT": host gets HOST ("" when absent, no
 * brackets). -EINVAL unless the port is 1..65535 or a bracket is missing;
 * -EDESTADDRREQ for an IPv6 address without brackets.
 */
int rail_hostport_split(const char *text, char *host, size_t host_len, int *port);

/* Listening socket on addr (port 0: any); *bound gets the real address. */
int rail_sock_listen(const union rail_sockaddr *addr, int backlog, int *fd_out,
		     union rail_sockaddr *bound);
/* Starts a non-blocking connect; poll completion with rail_sock_connect_done. */
int rail_sock_connect_start(const union rail_sockaddr *addr, int *fd_out);
/* 0 when connected, -EAGAIN while in progress, -errno on failure. */
int rail_sock_connect_done(int fd);
/*
 * A blocking-style connect that gives up at deadline_ns (rail_now_ns()):
 * -ETIMEDOUT then. With retry_refused, a refusal is retried every 200 ms
 * until the deadline (a server that is not up yet); the last error is returned.
 */
int rail_sock_connect_by(const union rail_sockaddr *addr, uint64_t deadline_ns, int retry_refused,
			 int *fd_out);
/* Wait up to timeout_ms for one connection: -ETIMEDOUT when none came. */
int rail_sock_accept_wait(int listen_fd, int timeout_ms, int *fd_out, union rail_sockaddr *peer);
/* -EAGAIN when nothing is pending. */
int rail_sock_accept(int listen_fd, int *fd_out, union rail_sockaddr *peer);

/*
 * Move bytes [*off, len) on a non-blocking socket. 0 when all len bytes are
 * done, -EAGAIN when more remain, -RAIL_ECLOSED when the peer closed (end of
 * file), or -errno.
 */
int rail_sock_send_nb(int fd, const void *buf, size_t len, size_t *off);
int rail_sock_recv_nb(int fd, void *buf, size_t len, size_t *off);
/* Blocking versions for helper threads: loop until done or error. */
int rail_sock_send_all(int fd, const void *buf, size_t len);
int rail_sock_recv_all(int fd, void *buf, size_t len);

int rail_sock_set_nonblocking(int fd, int on);
int rail_sock_set_nodelay(int fd);
/*
 * Detect a peer host that vanished without closing its sockets: keepalive
 * probes after idle_s seconds, and unacknowledged data fails after
 * user_timeout_s seconds (both 0: leave the kernel defaults).
 */
void rail_sock_set_liveness(int fd, int idle_s, int user_timeout_s);
/* Applies SO_SNDBUF/SO_RCVBUF when > 0. */
void rail_sock_set_bufs(int fd, long sndbuf, long rcvbuf);

#endif
