/* nccl-net-rail: non-blocking TCP sockets. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rail.h"
#include "sock.h"

const char *rail_sockaddr_str(const union rail_sockaddr *a, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (a->sa.sa_family == AF_INET) {
		inet_ntop(AF_INET, &a->sin.sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%d", host, ntohs(a->sin.sin_port));
	} else if (a->sa.sa_family == AF_INET6) {
		char ifname[IF_NAMESIZE + 1] = "";

		inet_ntop(AF_INET6, &a->sin6.sin6_addr, host, sizeof(host));
		if (a->sin6.sin6_scope_id && if_indextoname(a->sin6.sin6_scope_id, ifname + 1))
			ifname[0] = '%';
		snprintf(buf, len, "[%s%s]:%d", host, ifname, ntohs(a->sin6.sin6_port));
	} else {
		snprintf(buf, len, "(no address)");
	}
	return buf;
}

socklen_t rail_sockaddr_len(const union rail_sockaddr *a)
{
	return a->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
					   : sizeof(struct sockaddr_in);
}

int rail_sockaddr_port(const union rail_sockaddr *a)
{
	return ntohs(a->sa.sa_family == AF_INET6 ? a->sin6.sin6_port : a->sin.sin_port);
}

void rail_sockaddr_set_port(union rail_sockaddr *a, int port)
{
	if (a->sa.sa_family == AF_INET6)
		a->sin6.sin6_port = htons((uint16_t)port);
	else
		a->sin.sin_port = htons((uint16_t)port);
}

int rail_sockaddr_parse(const char *text, union rail_sockaddr *out)
{
	char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
	const char *port = NULL;
	union rail_sockaddr a;
	char *pct;

	memset(&a, 0, sizeof(a));
	if (text[0] == '[') {
		const char *close = strchr(text, ']');

		if (!close || (size_t)(close - text - 1) >= sizeof(host))
			return -EINVAL;
		memcpy(host, text + 1, (size_t)(close - text - 1));
		host[close - text - 1] = '\0';
		if (close[1] == ':')
			port = close + 2;
		else if (close[1] != '\0')
			return -EINVAL;
	} else {
		const char *colon = strrchr(text, ':');

		rail_strlcpy(host, text, sizeof(host));
		if (colon && strchr(text, ':') == colon && (size_t)(colon - text) < sizeof(host)) {
			host[colon - text] = '\0';
			port = colon + 1;
		}
	}
	pct = strchr(host, '%');
	if (pct)
		*pct++ = '\0';
	if (inet_pton(AF_INET, host, &a.sin.sin_addr) == 1 && !pct) {
		a.sin.sin_family = AF_INET;
	} else if (inet_pton(AF_INET6, host, &a.sin6.sin6_addr) == 1) {
		a.sin6.sin6_family = AF_INET6;
		if (pct) {
			char *end;
			unsigned long idx = strtoul(pct, &end, 10);

			/* A scope is an interface name or index that exists. */
			a.sin6.sin6_scope_id = *pct && !*end ? (uint32_t)idx : if_nametoindex(pct);
			if (a.sin6.sin6_scope_id == 0)
				return -EINVAL;
		}
	} else {
		return -EINVAL;
	}
	if (port) {
		char *end;
		long p = strtol(port, &end, 10);

		if (*port == '\0' || *end != '\0' || p < 0 || p > 65535)
			return -EINVAL;
		rail_sockaddr_set_port(&a, (int)p);
	}
	*out = a;
	return 0;
}

int rail_hostport_split(const char *text, char *host, size_t host_len, int *port)
{
	const char *colon, *p;
	char *end;
	long v;

	if (text[0] == '[') {
		colon = strchr(text, ']');
		if (!colon || colon[1] != ':' || (size_t)(colon - text - 1) >= host_len)
			return -EINVAL;
		snprintf(host, host_len, "%.*s", (int)(colon - text - 1), text + 1);
		p = colon + 2;
	} else {
		colon = strrchr(text, ':');
		if (colon && strchr(text, ':') != colon)
			return -EDESTADDRREQ;
		if (colon && (size_t)(colon - text) >= host_len)
			return -EINVAL;
		snprintf(host, host_len, "%.*s", colon ? (int)(colon - text) : 0, text);
		p = colon ? colon + 1 : text;
	}
	v = strtol(p, &end, 10);
	if (!*p || *end || v < 1 || v > 65535)
		return -EINVAL;
	*port = (int)v;
	return 0;
}

int rail_sock_set_nonblocking(int fd, int on)
{
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0)
		return -errno;
	flags = on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK;
	return fcntl(fd, F_SETFL, flags) < 0 ? -errno : 0;
}

int rail_sock_set_nodelay(int fd)
{
	int one = 1;

	return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) ? -errno : 0;
}

void rail_sock_set_liveness(int fd, int idle_s, int user_timeout_s)
{
	int one = 1, intvl = 5, cnt = 6;
	unsigned int ms = (unsigned int)user_timeout_s * 1000u;

	if (idle_s > 0) {
		setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	}
	if (user_timeout_s > 0)
		setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
}

void rail_sock_set_bufs(int fd, long sndbuf, long rcvbuf)
{
	int v;

	if (sndbuf > 0) {
		v = (int)sndbuf;
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
	}
	if (rcvbuf > 0) {
		v = (int)rcvbuf;
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
	}
}

int rail_sock_listen(const union rail_sockaddr *addr, int backlog, int *fd_out,
		     union rail_sockaddr *bound)
{
	union rail_sockaddr b = *addr;
	socklen_t blen = sizeof(b);
	int one = 1;
	int fd, err;

	fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, &addr->sa, rail_sockaddr_len(addr)) || listen(fd, backlog) ||
	    getsockname(fd, &b.sa, &blen)) {
		err = -errno;
		close(fd);
		return err;
	}
	*fd_out = fd;
	*bound = b;
	return 0;
}

int rail_sock_connect_start(const union rail_sockaddr *addr, int *fd_out)
{
	int fd, err;

	fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	rail_sock_set_nodelay(fd);
	if (connect(fd, &addr->sa, rail_sockaddr_len(addr)) && errno != EINPROGRESS) {
		err = -errno;
		close(fd);
		return err;
	}
	*fd_out = fd;
	return 0;
}

int rail_sock_connect_done(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	int err = 0;
	socklen_t len = sizeof(err);

	if (poll(&p, 1, 0) < 0)
		return -errno;
	if (!(p.revents & (POLLOUT | POLLERR | POLLHUP)))
		return -EAGAIN;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len))
		return -errno;
	return err ? -err : 0;
}

int rail_sock_connect_by(const union rail_sockaddr *addr, uint64_t deadline_ns, int retry_refused,
			 int *fd_out)
{
	for (;;) {
		struct pollfd p = { .events = POLLOUT };
		int64_t left_ms = ((int64_t)deadline_ns - (int64_t)rail_now_ns()) / 1000000;
		int err = rail_sock_connect_start(addr, &p.fd);

		if (err)
			return err;
		if (left_ms > 0 && poll(&p, 1, (int)left_ms) < 0)
			err = -errno;
		if (!err)
			err = rail_sock_connect_done(p.fd);
		if (err == -EAGAIN)
			err = -ETIMEDOUT;
		if (!err) {
			*fd_out = p.fd;
			return 0;
		}
		close(p.fd);
		if (err != -ECONNREFUSED || !retry_refused ||
		    rail_now_ns() + 200000000ull > deadline_ns)
			return err;
		usleep(200000);
	}
}

int rail_sock_accept_wait(int listen_fd, int timeout_ms, int *fd_out, union rail_sockaddr *peer)
{
	struct pollfd p = { .fd = listen_fd, .events = POLLIN };
	int n = poll(&p, 1, timeout_ms);

	if (n < 0)
		return -errno;
	return n == 0 ? -ETIMEDOUT : rail_sock_accept(listen_fd, fd_out, peer);
}

int rail_sock_accept(int listen_fd, int *fd_out, union rail_sockaddr *peer)
{
	socklen_t len = sizeof(*peer);
	int fd = accept4(listen_fd, &peer->sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	rail_sock_set_nodelay(fd);
	*fd_out = fd;
	return 0;
}

int rail_sock_send_nb(int fd, const void *buf, size_t len, size_t *off)
{
	while (*off < len) {
		ssize_t n = send(fd, (const char *)buf + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		*off += (size_t)n;
	}
	return 0;
}

int rail_sock_recv_nb(int fd, void *buf, size_t len, size_t *off)
{
	while (*off < len) {
		ssize_t n = recv(fd, (char *)buf + *off, len - *off, MSG_DONTWAIT);

		if (n == 0)
			return -RAIL_ECLOSED;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		*off += (size_t)n;
	}
	return 0;
}

static int wait_fd(int fd, short events)
{
	struct pollfd p = { .fd = fd, .events = events };

	if (poll(&p, 1, -1) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

int rail_sock_send_all(int fd, const void *buf, size_t len)
{
	size_t off = 0;

	for (;;) {
		int err = rail_sock_send_nb(fd, buf, len, &off);

		if (err != -EAGAIN)
			return err;
		err = wait_fd(fd, POLLOUT);
		if (err)
			return err;
	}
}

int rail_sock_recv_all(int fd, void *buf, size_t len)
{
	size_t off = 0;

	for (;;) {
		int err = rail_sock_recv_nb(fd, buf, len, &off);

		if (err != -EAGAIN)
			return err;
		err = wait_fd(fd, POLLIN);
		if (err)
			return err;
	}
}
