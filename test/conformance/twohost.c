/*
 * Conformance suite across two hosts: each host runs one role
 * (--ctl-listen [ADDR:]PORT on role A's host, --ctl-connect HOST:PORT on
 * role B's), and the control channel is one TCP connection per (scenario,
 * ABI) instead of a socketpair. Both hosts run the same list in the same
 * order; a hello line at the start of every connection checks it.
 *
 * The control channel is the suite's own, like NCCL's bootstrap; the plugin
 * still finds its own addresses (NCCL_SOCKET_IFNAME etc.).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conf.h"

#define HELLO_LEN 64

/* "host:port", "[v6]:port" or "port" into getaddrinfo results. */
static int resolve(const char *addr, int passive, struct addrinfo **res, char *why, size_t len)
{
	char host[256] = "", port[16];
	const char *colon = strrchr(addr, ':');
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC };
	int rc;

	if (colon) {
		size_t hl = (size_t)(colon - addr);

		if (hl >= sizeof(host)) {
			snprintf(why, len, "address too long: %s", addr);
			return -1;
		}
		memcpy(host, addr, hl);
		host[hl] = 0;
		if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {
			memmove(host, host + 1, hl - 2);
			host[hl - 2] = 0;
		}
	}
	snprintf(port, sizeof(port), "%s", colon ? colon + 1 : addr);
	if (!passive && !host[0]) {
		snprintf(why, len, "--ctl-connect wants HOST:PORT (got '%s')", addr);
		return -1;
	}
	hints.ai_flags = passive ? AI_PASSIVE : 0;
	rc = getaddrinfo(host[0] ? host : NULL, port, &hints, res);
	if (rc) {
		snprintf(why, len, "getaddrinfo(%s): %s", addr, gai_strerror(rc));
		return -1;
	}
	return 0;
}

int rail_conf_2h_listen(const char *addr, char *why, size_t len)
{
	struct addrinfo *res, *ai;
	int fd = -1, one = 1, err = 0;

	if (resolve(addr, 1, &res, why, len))
		return -1;
	for (ai = res; ai && fd < 0; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			err = errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 16)) {
			err = errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0)
		snprintf(why, len, "listening on %s for the peer host: %s", addr, strerror(err));
	return fd;
}

static int wait_fd(int fd, short ev, uint64_t deadline)
{
	struct pollfd p = { .fd = fd, .events = ev };
	uint64_t now = rail_conf_now_ns();
	int r;

	if (now >= deadline)
		return 0;
	do {
		r = poll(&p, 1, (int)((deadline - now) / 1000000) + 1);
	} while (r < 0 && errno == EINTR);
	return r > 0;
}

/* B: connect, retrying while the peer host is not listening yet. */
static int connect_retry(const char *addr, uint64_t deadline, char *why, size_t len)
{
	struct addrinfo *res;
	int fd = -1, err = 0;

	if (resolve(addr, 0, &res, why, len))
		return -1;
	while (fd < 0 && rail_conf_now_ns() < deadline) {
		fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			err = errno;
			break;
		}
		if (connect(fd, res->ai_addr, res->ai_addrlen) == 0)
			break;
		err = errno;
		close(fd);
		fd = -1;
		rail_conf_sleep_ms(200);
	}
	freeaddrinfo(res);
	if (fd < 0)
		snprintf(why, len, "connecting to the peer host at %s: %s", addr,
			 err ? strerror(err) : "timed out");
	return fd;
}

static int read_hello(int fd, char *buf, uint64_t deadline)
{
	size_t off = 0;

	while (off < HELLO_LEN) {
		ssize_t n;

		if (!wait_fd(fd, POLLIN, deadline))
			return -1;
		n = recv(fd, buf + off, HELLO_LEN - off, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		off += (size_t)n;
	}
	buf[HELLO_LEN - 1] = 0;
	return 0;
}

int rail_conf_2h_pair(const struct rail_conf_opts *o, int lfd, const char *scenario, int abi,
		      char *why, size_t len)
{
	/* The peer host may still be booting, or finishing its last scenario. */
	uint64_t deadline = rail_conf_now_ns() + (uint64_t)(o->timeout + 120) * 1000000000ull;
	char mine[HELLO_LEN] = "", theirs[HELLO_LEN];
	int fd, one = 1;

	snprintf(mine, sizeof(mine), "rail-conformance %s v%d", scenario, abi);
	if (o->host_role == RAIL_CONF_ROLE_A) {
		if (!wait_fd(lfd, POLLIN, deadline)) {
			snprintf(why, len, "no control connection from the peer host within %d s",
				 o->timeout + 120);
			return -1;
		}
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			snprintf(why, len, "accept (control connection): %s", strerror(errno));
			return -1;
		}
	} else {
		fd = connect_retry(o->ctl_addr, deadline, why, len);
		if (fd < 0)
			return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (send(fd, mine, sizeof(mine), MSG_NOSIGNAL) != (ssize_t)sizeof(mine) ||
	    read_hello(fd, theirs, deadline)) {
		snprintf(why, len, "control connection: no hello from the peer host");
		close(fd);
		return -1;
	}
	if (strcmp(mine, theirs)) {
		snprintf(why, len, "out of step with the peer host: here '%s', there '%s' (run "
			 "both with the same --scenario/--abi)", mine, theirs);
		close(fd);
		return -1;
	}
	return fd;
}

void rail_conf_event(struct rail_conf *cx, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n, fd;

	if (!cx->opts->event_file)
		return;
	n = snprintf(line, sizeof(line), "%c %.3f ", 'A' + cx->role,
		     (double)(rail_conf_now_ns() - cx->start_ns) / 1e9);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	fd = open(cx->opts->event_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, line, (size_t)n) != n)
		fprintf(stderr, "rail-conformance: --event-file %s: %s\n", cx->opts->event_file,
			strerror(errno));
	if (fd >= 0)
		close(fd);
}
