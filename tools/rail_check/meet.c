/*
 * rail-check's rendezvous. Rank 0 (--server, or rank 0 of the launcher
 * with --rendezvous) is the hub: every other process connects to it and
 * sends its description; the hub answers each with its rank and every
 * description. Each process also listens on a pair control port (on the
 * address it reached the hub from): for a pair of ranks the higher one
 * connects to the lower one's, and both drive their device pairs over it.
 * Messages are framed {u32 "RCHK", u32 type, u32 length} + body, and every
 * wait is bounded by a deadline.
 */
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rail.h"
#include "check/check.h"
#include "sock.h"
#include "wire.h"

#define RAIL_CK_MAGIC 0x4b484352u /* "RCHK" */

uint64_t rail_ck_deadline(double seconds)
{
	return rail_now_ns() + (uint64_t)(seconds * 1e9);
}

static int wait_fd(int fd, short ev, uint64_t deadline)
{
	uint64_t now = rail_now_ns();
	struct pollfd p = { .fd = fd, .events = ev };
	int ms;

	if (now >= deadline)
		return -ETIMEDOUT;
	ms = (int)RAIL_MIN((deadline - now) / 1000000 + 1, 1000);
	if (poll(&p, 1, ms) < 0 && errno != EINTR)
		return -errno;
	return 0;
}

static int xfer(int fd, int is_send, void *buf, size_t len, uint64_t deadline)
{
	size_t off = 0;

	for (;;) {
		int err = is_send ? rail_sock_send_nb(fd, buf, len, &off)
				  : rail_sock_recv_nb(fd, buf, len, &off);

		if (err != -EAGAIN)
			return err;
		err = wait_fd(fd, is_send ? POLLOUT : POLLIN, deadline);
		if (err)
			return err;
	}
}

int rail_ck_msg_send(int fd, int type, const void *buf, size_t len, uint64_t deadline)
{
	uint8_t hdr[12];
	int err;

	rail_put_u32(hdr, RAIL_CK_MAGIC);
	rail_put_u32(hdr + 4, (uint32_t)type);
	rail_put_u32(hdr + 8, (uint32_t)len);
	err = xfer(fd, 1, hdr, sizeof(hdr), deadline);
	return err ? err : len ? xfer(fd, 1, (void *)buf, len, deadline) : 0;
}

int rail_ck_msg_recv(int fd, int type, char *buf, size_t len, size_t *got, uint64_t deadline)
{
	uint8_t hdr[12];
	uint32_t n;
	int err = xfer(fd, 0, hdr, sizeof(hdr), deadline);

	if (err)
		return err;
	n = rail_get_u32(hdr + 8);
	if (rail_get_u32(hdr) != RAIL_CK_MAGIC || rail_get_u32(hdr + 4) != (uint32_t)type)
		return -EPROTO;
	if (n >= len)
		return -EMSGSIZE;
	err = n ? xfer(fd, 0, buf, n, deadline) : 0;
	buf[n] = '\0';
	if (got)
		*got = n;
	return err;
}

/* ---- sockets -------------------------------------------------------------- */

/* Listen on host ("" every address) and port (0: any); 0 or -errno. */
static int listen_on(const char *host, int port, int backlog, int *fd, int *bound_port)
{
	union rail_sockaddr a, bound;
	int err;

	memset(&a, 0, sizeof(a));
	if (host[0] && rail_sockaddr_parse(host, &a))
		return -EADDRNOTAVAIL;
	if (!host[0])
		a.sin6.sin6_family = AF_INET6;
	rail_sockaddr_set_port(&a, port);
	err = rail_sock_listen(&a, backlog, fd, &bound);
	if (err == -EAFNOSUPPORT && !host[0]) {
		memset(&a, 0, sizeof(a));
		a.sin.sin_family = AF_INET;
		rail_sockaddr_set_port(&a, port);
		err = rail_sock_listen(&a, backlog, fd, &bound);
	}
	if (!err && bound_port)
		*bound_port = rail_sockaddr_port(&bound);
	if (!err)
		err = rail_sock_set_nonblocking(*fd, 1);
	return err;
}

static int connect_to(const char *host, int port, uint64_t deadline, int *fd)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
	char ports[16];
	int err = -EHOSTUNREACH, rc;

	snprintf(ports, sizeof(ports), "%d", port);
	rc = getaddrinfo(host, ports, &hints, &res);
	if (rc)
		return -EADDRNOTAVAIL;
	for (ai = res; ai && err; ai = ai->ai_next) {
		union rail_sockaddr a;

		memset(&a, 0, sizeof(a));
		memcpy(&a, ai->ai_addr, RAIL_MIN((size_t)ai->ai_addrlen, sizeof(a)));
		err = rail_sock_connect_by(&a, deadline, 1, fd);
	}
	freeaddrinfo(res);
	if (!err) {
		rail_sock_set_liveness(*fd, 30, 0);
		err = rail_sock_set_nonblocking(*fd, 1);
	}
	return err;
}

/* The local address of a connected socket, as text without the port. */
static void local_host(int fd, char *out, size_t len)
{
	union rail_sockaddr a;
	socklen_t l = sizeof(a);
	char *colon;

	out[0] = '\0';
	if (getsockname(fd, &a.sa, &l))
		return;
	if (a.sa.sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&a.sin6.sin6_addr)) {
		union rail_sockaddr v4 = { .sin = { .sin_family = AF_INET } };

		memcpy(&v4.sin.sin_addr, &a.sin6.sin6_addr.s6_addr[12], 4);
		a = v4;
	}
	rail_sockaddr_str(&a, out, len);
	if (out[0] == '[') {	/* "[v6]:port" -> "v6" */
		memmove(out, out + 1, strlen(out));
		colon = strrchr(out, ']');
	} else {
		colon = strrchr(out, ':');
	}
	if (colon)
		*colon = '\0';
}

/* ---- the hub ---------------------------------------------------------------- */

static int hub_collect(const struct rail_ck_opts *o, int lfd, struct rail_ck_meet *m, char **texts)
{
	uint64_t deadline = rail_ck_deadline(o->meet_timeout);
	char *buf = malloc(RAIL_CK_MSG_MAX);

	if (!buf)
		return -1;
	for (int r = 1; r < m->nranks; r++) {
		union rail_sockaddr peer;
		size_t got;
		int fd, err;
		uint64_t now = rail_now_ns();

		err = now < deadline ? rail_sock_accept_wait(lfd, (int)((deadline - now) / 1000000),
							     &fd, &peer) : -ETIMEDOUT;
		if (err) {
			fprintf(stderr, "rail-check: only %d of the %d processes arrived within %.0f s "
				"(start `rail-check --connect THIS_HOST:PORT` on each other host, or "
				"fix --ranks; --meet-timeout waits longer)\n", r, m->nranks,
				o->meet_timeout);
			free(buf);
			return -1;
		}
		rail_sock_set_nonblocking(fd, 1);
		rail_sock_set_liveness(fd, 30, 0);
		err = rail_ck_msg_recv(fd, RAIL_CK_MSG_INFO, buf, RAIL_CK_MSG_MAX, &got,
				       rail_ck_deadline(o->timeout));
		if (err) {
			fprintf(stderr, "rail-check: %s connected but is not a rail-check of this "
				"version (%s); ignored\n", RAIL_ADDRSTR(&peer), RAIL_ERRSTR(err));
			close(fd);
			r--;
			continue;
		}
		m->fds[r] = fd;
		texts[r] = strdup(buf);
	}
	free(buf);
	return 0;
}

/* Rank order: the launcher's ranks when every process has a distinct one, else arrival. */
static void hub_order(struct rail_ck_meet *m, struct rail_ck_info *all, int *order)
{
	int ok = 1;

	for (int r = 0; r < m->nranks; r++)
		order[r] = r;
	for (int r = 1; r < m->nranks && ok; r++)
		ok = all[r].want_rank >= 1 && all[r].want_rank < m->nranks;
	for (int a = 1; a < m->nranks && ok; a++)
		for (int b = a + 1; b < m->nranks && ok; b++)
			ok = all[a].want_rank != all[b].want_rank;
	if (!ok)
		return;
	for (int r = 1; r < m->nranks; r++)
		order[all[r].want_rank] = r;
}

static int hub_send_all(const struct rail_ck_opts *o, struct rail_ck_meet *m,
			struct rail_ck_info *all)
{
	char *buf = malloc(RAIL_CK_MSG_MAX);
	size_t off;

	if (!buf)
		return -1;
	for (int r = 1; r < m->nranks; r++) {
		off = (size_t)snprintf(buf, RAIL_CK_MSG_MAX, "self\t%d\t%d\n", r, m->nranks);
		for (int k = 0; k < m->nranks; k++) {
			int n;

			off += (size_t)snprintf(buf + off, RAIL_CK_MSG_MAX - off, "#\n");
			n = rail_ck_info_encode(&all[k], buf + off, RAIL_CK_MSG_MAX - off);
			if (n < 0) {
				free(buf);
				return -1;
			}
			off += (size_t)n;
		}
		if (rail_ck_msg_send(m->fds[r], RAIL_CK_MSG_ALL, buf, off, rail_ck_deadline(o->timeout))) {
			fprintf(stderr, "rail-check: rank %d (%s) left before the checks began\n", r,
				all[r].host);
			free(buf);
			return -1;
		}
	}
	free(buf);
	return 0;
}

static int hub_meet(const struct rail_ck_opts *o, struct rail_ck_info *me, struct rail_ck_meet *m)
{
	char host[256], *texts[RAIL_CK_MAX_RANKS] = { 0 }, why[160];
	struct rail_ck_info *in;
	int port, lfd, err, order[RAIL_CK_MAX_RANKS], fds[RAIL_CK_MAX_RANKS], rc = -1;

	if (rail_hostport_split(o->server, host, sizeof(host), &port))
		return fprintf(stderr, "rail-check: --server %s: expected PORT or ADDR:PORT\n",
			       o->server), -1;
	err = listen_on(host, port, RAIL_CK_MAX_RANKS, &lfd, NULL);
	if (err)
		return fprintf(stderr, "rail-check: cannot listen on %s port %d: %s%s\n",
			       host[0] ? host : "every address,", port, RAIL_ERRSTR(err),
			       err == -EADDRINUSE ? " (another rail-check there? pick another port)"
			       : ""), -1;
	if (!o->json)
		printf("# rail-check: waiting for %d more process(es) on port %d (run `rail-check "
		       "--connect THIS_HOST:%d` on each)\n", m->nranks - 1, port, port);
	fflush(stdout);
	rail_strlcpy(me->ctrl_host, "", sizeof(me->ctrl_host));
	m->all = calloc((size_t)m->nranks, sizeof(*m->all));
	in = calloc((size_t)m->nranks, sizeof(*in));
	if (!m->all || !in || hub_collect(o, lfd, m, texts))
		goto out;
	in[0] = *me;
	for (int r = 1; r < m->nranks; r++)
		if (rail_ck_info_decode(texts[r], strlen(texts[r]), &in[r], why, sizeof(why))) {
			fprintf(stderr, "rail-check: a process sent a description this rail-check "
				"cannot read (%s): run the same rail-check everywhere\n", why);
			goto out;
		}
	hub_order(m, in, order);
	for (int r = 0; r < m->nranks; r++) {
		m->all[r] = in[order[r]];
		m->all[r].rank = r;
		fds[r] = m->fds[order[r]];
	}
	memcpy(m->fds, fds, sizeof(int) * (size_t)m->nranks);
	if (o->hook && system(o->hook) != 0)
		fprintf(stderr, "rail-check: the --hook command failed: %s\n", o->hook);
	rc = hub_send_all(o, m, m->all);
out:
	for (int r = 0; r < RAIL_CK_MAX_RANKS; r++)
		free(texts[r]);
	free(in);
	close(lfd);
	return rc;
}

/* ---- the other processes --------------------------------------------------- */

static int parse_all(char *buf, struct rail_ck_meet *m)
{
	char why[160], *p = buf, *next;
	int n = 0;

	if (sscanf(p, "self\t%d\t%d", &m->rank, &m->nranks) != 2 || m->nranks < 2 ||
	    m->nranks > RAIL_CK_MAX_RANKS || m->rank < 1 || m->rank >= m->nranks)
		return -1;
	m->all = calloc((size_t)m->nranks, sizeof(*m->all));
	if (!m->all)
		return -1;
	p = strstr(p, "#\n");
	while (p && n < m->nranks) {
		p += 2;
		next = strstr(p, "\n#\n");
		if (rail_ck_info_decode(p, next ? (size_t)(next - p) + 1 : strlen(p), &m->all[n], why,
				   sizeof(why)))
			return -1;
		m->all[n].rank = n;
		n++;
		p = next ? next + 1 : NULL;
	}
	return n == m->nranks ? 0 : -1;
}

static int peer_meet(const struct rail_ck_opts *o, struct rail_ck_info *me, struct rail_ck_meet *m)
{
	const char *spec = o->connect ? o->connect : o->rendezvous;
	char host[256], *buf;
	int port, err;
	size_t got;

	if (rail_hostport_split(spec, host, sizeof(host), &port) || !host[0])
		return fprintf(stderr, "rail-check: %s: expected HOST:PORT ([IPv6]:PORT)\n", spec), -1;
	rail_strlcpy(m->hub_host, host, sizeof(m->hub_host));
	err = connect_to(host, port, rail_ck_deadline(o->meet_timeout), &m->hub_fd);
	if (err)
		return fprintf(stderr, "rail-check: cannot reach the first process at %s: %s (is "
			       "`rail-check --server %d` running there? firewall? --meet-timeout "
			       "waits longer)\n", spec, RAIL_ERRSTR(err), port), -1;
	local_host(m->hub_fd, me->ctrl_host, sizeof(me->ctrl_host));
	err = listen_on(me->ctrl_host, 0, RAIL_CK_MAX_RANKS, &m->ctrl_lfd, &me->ctrl_port);
	if (err)
		return fprintf(stderr, "rail-check: cannot listen on %s for the pair checks: %s\n",
			       me->ctrl_host, RAIL_ERRSTR(err)), -1;
	buf = malloc(RAIL_CK_MSG_MAX);
	if (!buf)
		return -1;
	err = rail_ck_info_encode(me, buf, RAIL_CK_MSG_MAX) < 0 ? -EMSGSIZE
		: rail_ck_msg_send(m->hub_fd, RAIL_CK_MSG_INFO, buf, strlen(buf), rail_ck_deadline(o->timeout));
	if (!err)
		err = rail_ck_msg_recv(m->hub_fd, RAIL_CK_MSG_ALL, buf, RAIL_CK_MSG_MAX, &got,
				  rail_ck_deadline(o->meet_timeout + o->timeout));
	if (!err && parse_all(buf, m))
		err = -EPROTO;
	free(buf);
	if (err)
		fprintf(stderr, "rail-check: the first process at %s did not give the list of "
			"processes: %s (did all %s processes start? see its output)\n", spec,
			RAIL_ERRSTR(err), "the");
	return err ? -1 : 0;
}

int rail_ck_meet(const struct rail_ck_opts *o, struct rail_ck_info *me, struct rail_ck_meet *m)
{
	int hub = o->server != NULL;	/* main makes launcher rank 0 the --server */

	m->hub_fd = -1;
	m->ctrl_lfd = -1;
	for (int r = 0; r < RAIL_CK_MAX_RANKS; r++)
		m->fds[r] = m->pair_fd[r] = -1;
	if (!hub)
		return peer_meet(o, me, m);
	m->rank = 0;
	m->nranks = o->ranks;
	if (listen_on("", 0, RAIL_CK_MAX_RANKS, &m->ctrl_lfd, &me->ctrl_port)) {
		fprintf(stderr, "rail-check: cannot open a listening socket for the pair checks\n");
		return -1;
	}
	return hub_meet(o, me, m);
}

/* ---- pair control connections ----------------------------------------------- */

int rail_ck_pair_fd(struct rail_ck_meet *m, int peer, uint64_t deadline)
{
	char buf[32];
	int fd, err;

	if (m->pair_fd[peer] >= 0)
		return m->pair_fd[peer];
	if (m->rank > peer) {
		const struct rail_ck_info *p = &m->all[peer];

		err = connect_to(p->ctrl_host[0] ? p->ctrl_host : m->hub_host, p->ctrl_port,
				 deadline, &fd);
		snprintf(buf, sizeof(buf), "%d", m->rank);
		if (!err)
			err = rail_ck_msg_send(fd, RAIL_CK_MSG_PAIR, buf, strlen(buf), deadline);
		if (err) {
			fprintf(stderr, "rail-check: cannot reach rank %d (%s) at %s port %d for the "
				"pair checks: %s\n", peer, p->host, p->ctrl_host[0] ? p->ctrl_host :
				m->hub_host, p->ctrl_port, RAIL_ERRSTR(err));
			return -1;
		}
		/* the peer answers when it comes to this pair (it may be busy with others) */
		if (rail_ck_msg_recv(fd, RAIL_CK_MSG_PAIR, buf, sizeof(buf), NULL, deadline)) {
			fprintf(stderr, "rail-check: rank %d (%s) did not come to the pair checks "
				"with this process in time\n", peer, p->host);
			close(fd);
			return -1;
		}
		return m->pair_fd[peer] = fd;
	}
	while (m->pair_fd[peer] < 0) {	/* others may come first: keep them */
		union rail_sockaddr a;
		uint64_t now = rail_now_ns();
		int r;

		err = now < deadline ? rail_sock_accept_wait(m->ctrl_lfd,
			(int)((deadline - now) / 1000000), &fd, &a) : -ETIMEDOUT;
		if (err) {
			fprintf(stderr, "rail-check: rank %d (%s) did not open its pair connection: "
				"%s\n", peer, m->all[peer].host, RAIL_ERRSTR(err));
			return -1;
		}
		rail_sock_set_nonblocking(fd, 1);
		if (rail_ck_msg_recv(fd, RAIL_CK_MSG_PAIR, buf, sizeof(buf), NULL, deadline) ||
		    (r = atoi(buf)) <= m->rank || r >= m->nranks || m->pair_fd[r] >= 0) {
			close(fd);
			continue;
		}
		m->pair_fd[r] = fd;
	}
	if (rail_ck_msg_send(m->pair_fd[peer], RAIL_CK_MSG_PAIR, "go", 2, deadline)) {
		fprintf(stderr, "rail-check: rank %d (%s) left before the pair checks\n", peer,
			m->all[peer].host);
		close(m->pair_fd[peer]);
		return m->pair_fd[peer] = -1;
	}
	return m->pair_fd[peer];
}

void rail_ck_meet_close(struct rail_ck_meet *m)
{
	for (int r = 0; r < RAIL_CK_MAX_RANKS; r++) {
		if (m->fds[r] >= 0)
			close(m->fds[r]);
		if (m->pair_fd[r] >= 0)
			close(m->pair_fd[r]);
	}
	if (m->hub_fd >= 0)
		close(m->hub_fd);
	if (m->ctrl_lfd >= 0)
		close(m->ctrl_lfd);
	free(m->all);
}
