/*
 * nccl-net-rail: TCP connection setup. Nothing here blocks: connect() and
 * accept() advance a small state machine and return a NULL comm until the
 * connection is complete; NCCL calls them again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fdlimit.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

#define TCP_STAGE_MAGIC 0x47545354u /* "TSTG" */
/*
 * Accepted sockets whose hello has not arrived, at most. One that has sent
 * no hello for TCP_STRAY_GRACE_NS is a stray (a port scanner, a health
 * check, a confused client): beyond the bound the oldest such one is
 * dropped. A younger one may be a real connector whose hello is late (a
 * loaded host, NCCL opening many connections at once), so it is never
 * dropped for room: when every pending socket is younger, the newcomer is
 * closed instead (the verbs listener uses the same grace, ib_conn.c).
 */
#define TCP_MAX_PENDING 128
#define TCP_STRAY_GRACE_NS (2ull * 1000000000ull)
/* How long a refused connect is retried (listener backlog full, or not yet there). */
#define TCP_REFUSED_RETRY_NS (5ull * 1000000000ull)

/* A socket accepted by the listener whose hello is still being read. */
struct tcp_pending {
	int fd;
	union rail_sockaddr peer;
	uint8_t buf[TCP_HELLO_SIZE + TCP_RESCUE_SIZE];
	size_t off, want;	/* want: the hello, then for socket 0 the rescue addresses too */
	uint64_t t0;
};

/* The sockets of one connection, grouped by conn_id until all arrived. */
struct tcp_group {
	uint64_t conn_id;
	struct tcp_hello layout;
	struct tcp_rescue rescue;	/* the connector's */
	union rail_sockaddr peer;
	int nfds;
	int fds[TCP_MAX_SOCKS + 1];
	uint64_t t0;
};

struct tcp_listen_comm {
	struct rail_comm base;
	int fd;
	uint64_t nonce;
	union rail_sockaddr addr;
	struct tcp_pending *pend;
	int npend, cap_pend;
	struct tcp_group *groups;
	int ngroups, cap_groups;
	unsigned long dropped;	/* strays dropped to make room (the first is a WARN) */
	struct rail_log_flood turned;	/* newcomers closed: every pending one was young */
};

/* Connector state, kept in the handle across NCCL's connect() retries. */
struct tcp_stage {
	uint32_t magic;
	int dev;
	struct rail_handle h;
	struct tcp_hello layout;
	int nfds;
	int fds[TCP_MAX_SOCKS + 1];
	uint8_t state[TCP_MAX_SOCKS + 1]; /* 0 connecting, 1 sending hello, 2 sent */
	size_t off[TCP_MAX_SOCKS + 1];
	uint8_t hello[TCP_MAX_SOCKS + 1][TCP_HELLO_SIZE + TCP_RESCUE_SIZE];
	uint8_t reply[TCP_REPLY_SIZE + TCP_RESCUE_SIZE];
	struct tcp_rescue peer_rescue;
	uint8_t share[TCP_SHARE_SIZE];	/* this side's part of the comm's key */
	size_t reply_off;
	int warned;
	uint64_t t0;
};

static uint64_t tcp_timeout_ns(void)
{
	return (uint64_t)rail_param_int(RAIL_P_CONNECT_TIMEOUT) * 1000000000ull;
}

static int tcp_timed_out(uint64_t t0)
{
	uint64_t limit = tcp_timeout_ns();

	return limit && rail_now_ns() - t0 > limit;
}

int tcp_listen(int dev, void *handle, struct rail_comm **out)
{
	const struct tcp_dev *d = tcp_dev_get(dev);
	struct tcp_listen_comm *lc;
	struct rail_handle h;
	union rail_sockaddr addr = d->addr;
	int err;

	lc = calloc(1, sizeof(*lc));
	if (!lc)
		return -ENOMEM;
	tcp_pool_reserve();
	tcp_rescue_start();
	rail_sockaddr_set_port(&addr, 0);
	err = rail_sock_listen(&addr, 16384, &lc->fd, &lc->addr);
	if (err) {
		RAIL_WARN("listen on %s (%s) failed: %s", d->name, RAIL_ADDRSTR(&addr),
			  RAIL_ERRSTR(err));
		free(lc);
		return err;
	}
	rail_comm_init(&lc->base, RAIL_COMM_LISTEN, dev, tcp_comm_ops());
	lc->nonce = rail_random64();
	memset(&h, 0, sizeof(h));
	h.transport = RAIL_TRANSPORT_TCP;
	h.nonce = lc->nonce;
	h.addr = lc->addr;
	rail_handle_encode(&h, handle, RAIL_HANDLE_SIZE);
	*out = &lc->base;
	return 0;
}

static void stage_free(struct tcp_stage *s, void *handle)
{
	for (int i = 0; i < s->nfds; i++)
		if (s->fds[i] >= 0)
			close(s->fds[i]);
	s->magic = 0;
	memset(s->share, 0, sizeof(s->share));
	free(s);
	rail_handle_set_stage(handle, NULL);
}

static void stage_layout(struct tcp_stage *s)
{
	int nt = (int)rail_param_int(RAIL_P_SOCKET_NTHREADS);
	int spt = (int)rail_param_int(RAIL_P_NSOCKS_PERTHREAD);
	char why[128];

	if (nt <= 0)
		nt = TCP_DEFAULT_THREADS;
	if (spt <= 0)
		spt = TCP_DEFAULT_SOCKS_PER_THREAD;
	s->layout.nthreads = (uint8_t)RAIL_MIN(nt, TCP_MAX_THREADS);
	s->layout.nsocks = (uint16_t)RAIL_MIN(s->layout.nthreads * spt, TCP_MAX_SOCKS);
	s->layout.inline_max = tcp_inline_max(why, sizeof(why));
	s->layout.min_chunk = (uint32_t)rail_param_int(RAIL_P_TCP_MIN_CHUNK);
	s->layout.nonce = s->h.nonce;
	s->layout.conn_id = rail_random64();
	s->layout.flags = rail_param_int(RAIL_P_TCP_LAZY) ? TCP_HELLO_LAZY : 0;
}

/* The sockets opened at connect: the control socket, and the data sockets unless lazy. */
static int layout_fds(const struct tcp_hello *l)
{
	return (l->flags & TCP_HELLO_LAZY) ? 1 : l->nsocks + 1;
}

/* The listener's handle names another release (a wire mismatch is then the likely cause). */
static int tcp_release_differs(const struct rail_handle *h)
{
	return h->release[0] && strcmp(h->release, RAIL_VERSION_STRING);
}

static int stage_create(int dev, void *handle, struct tcp_stage **out)
{
	struct tcp_rescue mine;
	struct tcp_stage *s;
	char why[256];
	int err;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	err = rail_handle_decode(handle, RAIL_HANDLE_SIZE, &s->h, why, sizeof(why));
	if (!err && s->h.transport != RAIL_TRANSPORT_TCP) {
		snprintf(why, sizeof(why), "the handle is for the %s transport, this node uses tcp: "
			 "set the same NCCL_RAIL_TRANSPORT on every node",
			 rail_transport_name(s->h.transport));
		err = -EPROTO;
	}
	if (err) {
		RAIL_WARN("connect on %s: refusing the connection handle: %s",
			  tcp_dev_get(dev)->name, why);
		free(s);
		return err;
	}
	s->magic = TCP_STAGE_MAGIC;
	s->dev = dev;
	s->t0 = rail_now_ns();
	stage_layout(s);
	s->nfds = layout_fds(&s->layout);
	for (int i = 0; i < s->nfds; i++) {
		struct tcp_hello hh = s->layout;

		s->fds[i] = -1;
		hh.index = (uint16_t)i;
		tcp_hello_encode(&hh, s->hello[i]);
	}
	/* Socket 0 carries this process's rescue addresses and key share after its hello. */
	tcp_rescue_mine(&mine);
	err = rail_random_bytes(s->share, sizeof(s->share));
	if (err) {
		RAIL_WARN("connect on %s to %s: getrandom for the connection's key failed: %s; "
			  "the TCP transport needs the kernel's random source", tcp_dev_get(dev)->name,
			  RAIL_ADDRSTR(&s->h.addr), RAIL_ERRSTR(err));
		free(s);
		return err;
	}
	memcpy(mine.share, s->share, sizeof(mine.share));
	tcp_rescue_encode(&mine, s->hello[0] + TCP_HELLO_SIZE);
	memset(mine.share, 0, sizeof(mine.share));
	err = rail_handle_set_stage(handle, s);
	if (err) {
		RAIL_WARN("connect on %s to %s: recording the connection in progress failed: %s; "
			  "too many connects in progress at once?", tcp_dev_get(dev)->name,
			  RAIL_ADDRSTR(&s->h.addr), RAIL_ERRSTR(err));
		free(s);
		return err;
	}
	*out = s;
	return 0;
}

/* Advance socket i: connect, then send its hello. */
static int stage_step(struct tcp_stage *s, int i)
{
	int err;

	if (s->fds[i] < 0) {
		err = rail_sock_connect_start(&s->h.addr, &s->fds[i]);
		if (err)
			return err;
		s->state[i] = 0;
	}
	if (s->state[i] == 0) {
		err = rail_sock_connect_done(s->fds[i]);
		if (err == -ECONNREFUSED && rail_now_ns() - s->t0 < TCP_REFUSED_RETRY_NS) {
			/* Listener backlog full or not yet there: retry this socket. */
			close(s->fds[i]);
			s->fds[i] = -1;
			return -EAGAIN;
		}
		if (err)
			return err;
		s->state[i] = 1;
	}
	if (s->state[i] == 1) {
		err = rail_sock_send_nb(s->fds[i], s->hello[i],
					TCP_HELLO_SIZE + (i ? 0 : TCP_RESCUE_SIZE), &s->off[i]);
		if (err)
			return err;
		s->state[i] = 2;
	}
	return 0;
}

static int stage_reply(struct tcp_stage *s)
{
	int err = rail_sock_recv_nb(s->fds[0], s->reply, TCP_REPLY_SIZE, &s->reply_off);
	int status;

	/* An accepting reply is followed by the listener's rescue addresses. */
	if (!err && tcp_reply_decode(s->reply) == 0)
		err = rail_sock_recv_nb(s->fds[0], s->reply, TCP_REPLY_SIZE + TCP_RESCUE_SIZE,
					&s->reply_off);
	if (err == -EAGAIN)
		return err;
	s->warned = 1;
	if (err) {
		RAIL_WARN("connect to %s: the listener closed the connection before accepting "
			  "it (%s); its own log says why (a failed accept names the cause there); "
			  "is the peer process alive and using the same plugin?",
			  RAIL_ADDRSTR(&s->h.addr), RAIL_ERRSTR(err));
		return -ECONNRESET;
	}
	status = tcp_reply_decode(s->reply);
	if (status == 0 && tcp_rescue_decode(s->reply + TCP_REPLY_SIZE, &s->peer_rescue) == 0) {
		s->warned = 0;
		return 0;
	}
	RAIL_WARN("connect to %s: the listener refused the connection: %s%s%s%s%s",
		  RAIL_ADDRSTR(&s->h.addr), status <= 0 ? "malformed reply"
		  : status == EPROTONOSUPPORT ? "it speaks another TCP wire version (this node "
						"speaks version " TCP_WIRE_VERSION_STR "): use "
						"the same nccl-net-rail build on every node"
		  : status == EPERM ? "the handle's nonce does not match its listen comm (a stale "
				      "handle from a closed listen?)"
				    : RAIL_ERRSTR(-status),
		  tcp_release_differs(&s->h) ? " (the listener runs nccl-net-rail " : "",
		  tcp_release_differs(&s->h) ? s->h.release : "",
		  tcp_release_differs(&s->h) ? ", this node " RAIL_VERSION_STRING : "",
		  tcp_release_differs(&s->h) ? ": use one release on every node)" : "");
	return -ECONNREFUSED;
}

static int stage_finish(struct tcp_stage *s, struct rail_comm **out)
{
	uint8_t key[TCP_KEY_SIZE];
	struct tcp_comm *c;
	int err;

	tcp_move_key(s->share, s->peer_rescue.share, s->layout.conn_id, s->layout.nonce, key);
	err = tcp_comm_create(s->dev, 1, s->fds, &s->layout, &s->h.addr, &s->peer_rescue, key, &c);
	memset(key, 0, sizeof(key));

	for (int i = 0; i < s->nfds; i++)
		s->fds[i] = -1; /* the comm's now, closed by it if it failed */
	if (err) {
		s->warned = 1; /* tcp_comm_create said why */
		return err;
	}
	*out = &c->base;
	return 0;
}

int tcp_connect(int dev, const struct rail_conn_opts *opts, void *handle, struct rail_comm **out)
{
	struct tcp_stage *s = rail_handle_get_stage(handle);
	int err = 0, done = 1;

	(void)opts;
	/* s comes from the stage table (never from the handle's bytes). */
	if (s && s->magic != TCP_STAGE_MAGIC)
		s = NULL;
	if (!s) {
		tcp_pool_reserve();
		tcp_rescue_start();
		err = stage_create(dev, handle, &s);
		if (err)
			return err;
	}
	for (int i = 0; i < s->nfds && !err; i++) {
		err = stage_step(s, i);
		if (err == -EAGAIN) {
			done = 0;
			err = 0;
		}
	}
	if (!err && done) {
		err = stage_reply(s);
		if (!err)
			err = stage_finish(s, out);
	}
	if (err == -EAGAIN || (!err && !*out)) {
		if (!tcp_timed_out(s->t0))
			return 0;
		RAIL_WARN("connect on %s to %s: no answer within NCCL_RAIL_CONNECT_TIMEOUT=%lld s; "
			  "is the peer process alive and calling accept?", tcp_dev_get(dev)->name,
			  RAIL_ADDRSTR(&s->h.addr), (long long)rail_param_int(RAIL_P_CONNECT_TIMEOUT));
		err = -ETIMEDOUT;
	} else if (err && !s->warned) {
		char hint[384] = "";

		if (err == -EMFILE || err == -ENFILE)	/* this process's limit, not the peer */
			rail_nofile_hint(hint, sizeof(hint));
		RAIL_WARN("connect on %s to %s failed: %s%s%s (this connection needs %d)",
			  tcp_dev_get(dev)->name, RAIL_ADDRSTR(&s->h.addr), RAIL_ERRSTR(err),
			  hint[0] ? "; " : "", hint, s->nfds);
	}
	stage_free(s, handle);
	return err;
}

/* ---- listener side ---- */

static void refuse(struct tcp_pending *p, int status, const char *why)
{
	uint8_t reply[TCP_REPLY_SIZE];
	size_t off = 0;

	static struct rail_log_flood refused;
	unsigned long before;

	if (rail_log_flood(&refused, rail_now_ns(), &before) == RAIL_LOG_WARN)
		RAIL_WARN("accept: refusing a connection from %s: %s (%lu more refused in the "
			  "minute before, at INFO; further ones this minute are logged at INFO)",
			  RAIL_ADDRSTR(&p->peer), why, before);
	else
		RAIL_INFO(RAIL_LOG_NET, "accept: refusing a connection from %s: %s",
			  RAIL_ADDRSTR(&p->peer), why);
	tcp_reply_encode(status, reply);
	rail_sock_send_nb(p->fd, reply, sizeof(reply), &off);
	close(p->fd);
	p->fd = -1;
}

static int grow(void **arr, int *cap, int need, size_t elem)
{
	void *n;
	int ncap;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap * 2 : 16;
	while (ncap < need)
		ncap *= 2;
	n = realloc(*arr, (size_t)ncap * elem);
	if (!n)
		return -ENOMEM;
	*arr = n;
	*cap = ncap;
	return 0;
}

static int group_add(struct tcp_listen_comm *lc, struct tcp_pending *p, const struct tcp_hello *h)
{
	struct tcp_rescue rescue;
	struct tcp_group *g = NULL;
	int err;

	for (int i = 0; i < lc->ngroups; i++)
		if (lc->groups[i].conn_id == h->conn_id)
			g = &lc->groups[i];
	if (!g) {
		err = grow((void **)&lc->groups, &lc->cap_groups, lc->ngroups + 1, sizeof(*g));
		if (err)
			return err;
		g = &lc->groups[lc->ngroups++];
		memset(g, 0, sizeof(*g));
		g->conn_id = h->conn_id;
		g->layout = *h;
		g->t0 = p->t0;
		for (int i = 0; i <= TCP_MAX_SOCKS; i++)
			g->fds[i] = -1;
	}
	if (g->layout.nsocks != h->nsocks || g->layout.nthreads != h->nthreads ||
	    g->layout.flags != h->flags ||
	    g->layout.inline_max != h->inline_max || g->layout.min_chunk != h->min_chunk ||
	    g->fds[h->index] >= 0) {
		refuse(p, EBADMSG, "inconsistent hello within one connection");
		return 0;
	}
	if (h->index == 0 && tcp_rescue_decode(p->buf + TCP_HELLO_SIZE, &rescue)) {
		refuse(p, EBADMSG, "corrupt rescue addresses after the hello");
		return 0;
	}
	g->fds[h->index] = p->fd;
	if (h->index == 0) {
		g->peer = p->peer;
		g->rescue = rescue;
	}
	g->nfds++;
	p->fd = -1;
	return 0;
}

/* Read pending hellos; sockets whose hello is complete join their group. */
static int progress_pending(struct tcp_listen_comm *lc)
{
	int err = 0;

	for (int i = 0; i < lc->npend && !err; i++) {
		struct tcp_pending *p = &lc->pend[i];
		struct tcp_hello h;
		char why[200];
		int r = rail_sock_recv_nb(p->fd, p->buf, p->want ? p->want : TCP_HELLO_SIZE, &p->off);

		if (r == -EAGAIN) {
			if (tcp_timed_out(p->t0))
				refuse(p, ETIMEDOUT, "no hello within NCCL_RAIL_CONNECT_TIMEOUT");
			continue;
		}
		if (r) {
			close(p->fd);
			p->fd = -1;
			continue;
		}
		r = tcp_hello_decode(p->buf, &h, why, sizeof(why));
		if (!r && h.index == 0 && p->off < TCP_HELLO_SIZE + TCP_RESCUE_SIZE) {
			p->want = TCP_HELLO_SIZE + TCP_RESCUE_SIZE;	/* and the rescue block */
			i--;
			continue;
		}
		if (r)
			refuse(p, -r, why);
		else if (h.nonce != lc->nonce)
			refuse(p, EPERM, "the handle's nonce does not match this listen comm "
			       "(stale handle from a closed listen, or a foreign connection)");
		else
			err = group_add(lc, p, &h);
	}
	/* Compact: drop the entries whose fd moved or closed. */
	int j = 0;
	for (int i = 0; i < lc->npend; i++)
		if (lc->pend[i].fd >= 0)
			lc->pend[j++] = lc->pend[i];
	lc->npend = j;
	return err;
}

/* Close pending socket o, which sent no hello, to make room. */
static void drop_one(struct tcp_listen_comm *lc, int o, const char *why)
{
	uint64_t ms;

	ms = (rail_now_ns() - lc->pend[o].t0) / 1000000;
	if (lc->dropped++ == 0)
		RAIL_WARN("accept on %s (%s): dropping the connection from %s, which sent no hello "
			  "in %llu ms, to make room (%s); a port scanner or a client of another "
			  "program? Further drops are logged at INFO", tcp_dev_get(lc->base.dev)->name,
			  RAIL_ADDRSTR(&lc->addr), RAIL_ADDRSTR(&lc->pend[o].peer),
			  (unsigned long long)ms, why);
	else
		RAIL_INFO(RAIL_LOG_NET, "accept on %s: dropped the connection from %s (no hello in "
			  "%llu ms, %s; %lu dropped so far)", RAIL_ADDRSTR(&lc->addr),
			  RAIL_ADDRSTR(&lc->pend[o].peer), (unsigned long long)ms, why, lc->dropped);
	close(lc->pend[o].fd);
	lc->pend[o] = lc->pend[--lc->npend];
}

/* Close the pending socket that has waited longest for its hello, to make room. */
static void drop_oldest(struct tcp_listen_comm *lc, const char *why)
{
	int o = 0;

	for (int i = 1; i < lc->npend; i++)
		if (lc->pend[i].t0 < lc->pend[o].t0)
			o = i;
	drop_one(lc, o, why);
}

/* The oldest pending socket past the stray grace, or -1 when all are younger. */
static int oldest_stray(const struct tcp_listen_comm *lc)
{
	uint64_t now = rail_now_ns();
	int o = -1;

	for (int i = 0; i < lc->npend; i++)
		if (now - lc->pend[i].t0 >= TCP_STRAY_GRACE_NS &&
		    (o < 0 || lc->pend[i].t0 < lc->pend[o].t0))
			o = i;
	return o;
}

/*
 * The pending list is full: drop the oldest stray to make room (0), or
 * close the newcomer fd (1) when every pending socket is within its grace.
 */
static int make_room(struct tcp_listen_comm *lc, int fd, const union rail_sockaddr *peer)
{
	unsigned long before;
	int o = oldest_stray(lc);

	if (o >= 0) {
		drop_one(lc, o, "too many connections without a hello");
		return 0;
	}
	if (rail_log_flood(&lc->turned, rail_now_ns(), &before) == RAIL_LOG_WARN)
		RAIL_WARN("accept on %s (%s): closing the new connection from %s: %d connections "
			  "wait for their hello, all for less than %llu ms (%lu more closed in the "
			  "minute before, at INFO; further ones this minute are logged at INFO); a "
			  "flood of port scans or health checks?", tcp_dev_get(lc->base.dev)->name,
			  RAIL_ADDRSTR(&lc->addr), RAIL_ADDRSTR(peer), lc->npend,
			  TCP_STRAY_GRACE_NS / 1000000, before);
	else
		RAIL_INFO(RAIL_LOG_NET, "accept on %s: closed the new connection from %s (%d "
			  "younger than %llu ms wait for their hello)", RAIL_ADDRSTR(&lc->addr),
			  RAIL_ADDRSTR(peer), lc->npend, TCP_STRAY_GRACE_NS / 1000000);
	close(fd);
	return 1;
}

/*
 * accept4 found no free fd. Make room by dropping the oldest pending socket
 * (1: try again); with none to drop the process is at its limit, which
 * waiting does not change (NCCL opens every connection before it frees
 * any): fail at once, naming RLIMIT_NOFILE (-errno).
 */
static int out_of_fds(struct tcp_listen_comm *lc, int err)
{
	int perr = progress_pending(lc);
	char hint[384];

	if (perr)
		return perr;
	if (lc->npend > 0) {
		drop_oldest(lc, "the process is out of file descriptors");
		return 1;
	}
	if (err == -EMFILE || err == -ENFILE)
		rail_nofile_hint(hint, sizeof(hint));
	else
		snprintf(hint, sizeof(hint), "the kernel is short of memory for sockets");
	RAIL_WARN("accept on %s (%s) failed: %s; %s", tcp_dev_get(lc->base.dev)->name,
		  RAIL_ADDRSTR(&lc->addr), RAIL_ERRSTR(err), hint);
	return err;
}

static int accept_new(struct tcp_listen_comm *lc)
{
	for (;;) {
		union rail_sockaddr peer;
		int fd = -1, err = rail_sock_accept(lc->fd, &fd, &peer);

		if (err == -EAGAIN)
			return 0;
		if (err == -EMFILE || err == -ENFILE || err == -ENOBUFS || err == -ENOMEM) {
			err = out_of_fds(lc, err);
			if (err == 1)
				continue;
			return err;
		}
		if (err == -ECONNABORTED || err == -EPERM || err == -EINTR)
			continue; /* that connection is gone (or a firewall refused it) */
		if (err) {
			RAIL_WARN("accept on %s (%s) failed: %s", tcp_dev_get(lc->base.dev)->name,
				  RAIL_ADDRSTR(&lc->addr), RAIL_ERRSTR(err));
			return err;
		}
		if (lc->npend >= TCP_MAX_PENDING) {
			err = progress_pending(lc);
			if (err) {
				close(fd);
				return err;
			}
			if (lc->npend >= TCP_MAX_PENDING && make_room(lc, fd, &peer))
				continue;
		}
		err = grow((void **)&lc->pend, &lc->cap_pend, lc->npend + 1, sizeof(*lc->pend));
		if (err) {
			close(fd);
			return err;
		}
		lc->pend[lc->npend++] = (struct tcp_pending){ .fd = fd, .peer = peer,
							      .t0 = rail_now_ns() };
	}
}

static void group_drop(struct tcp_listen_comm *lc, int i)
{
	for (int k = 0; k <= TCP_MAX_SOCKS; k++)
		if (lc->groups[i].fds[k] >= 0)
			close(lc->groups[i].fds[k]);
	lc->groups[i] = lc->groups[--lc->ngroups];
}

/* Hand out the first complete group as a receive comm. */
static int take_group(struct tcp_listen_comm *lc, struct rail_comm **out)
{
	for (int i = 0; i < lc->ngroups; i++) {
		struct tcp_group *g = &lc->groups[i];
		uint8_t reply[TCP_REPLY_SIZE + TCP_RESCUE_SIZE], key[TCP_KEY_SIZE];
		struct tcp_rescue mine;
		struct tcp_comm *c;
		size_t off = 0;
		int err;

		if (g->nfds < layout_fds(&g->layout)) {
			if (tcp_timed_out(g->t0)) {
				RAIL_WARN("accept: connection %016llx from %s never completed (%d of "
					  "%d sockets arrived); dropped",
					  (unsigned long long)g->conn_id, RAIL_ADDRSTR(&g->peer),
					  g->nfds, layout_fds(&g->layout));
				group_drop(lc, i--);
			}
			continue;
		}
		tcp_reply_encode(0, reply);
		tcp_rescue_mine(&mine);
		err = rail_random_bytes(mine.share, sizeof(mine.share));
		if (err) {
			RAIL_WARN("accept: getrandom for the key of the connection from %s failed: "
				  "%s; the TCP transport needs the kernel's random source",
				  RAIL_ADDRSTR(&g->peer), RAIL_ERRSTR(err));
			group_drop(lc, i);
			return err;
		}
		tcp_rescue_encode(&mine, reply + TCP_REPLY_SIZE);
		tcp_move_key(g->rescue.share, mine.share, g->conn_id, g->layout.nonce, key);
		memset(mine.share, 0, sizeof(mine.share));
		/*
		 * The comm first, then the reply: once the sender has the reply it
		 * may send at once, and a large message opens the lazy data sockets
		 * to this process's listener, which refuses a connection no comm
		 * here is registered for. The fds are the comm's from here on,
		 * also when it fails (it closed them).
		 */
		err = tcp_comm_create(lc->base.dev, 0, g->fds, &g->layout, &g->peer, &g->rescue, key,
				      &c);
		memset(key, 0, sizeof(key));
		lc->groups[i] = lc->groups[--lc->ngroups];
		if (err)
			return err;
		err = tcp_fault_accept_reply();
		if (!err)
			err = rail_sock_send_nb(c->ctrl_fd, reply, sizeof(reply), &off);
		if (err) {
			RAIL_WARN("accept: sending the reply to %s failed: %s",
				  RAIL_ADDRSTR(&c->peer_addr), RAIL_ERRSTR(err));
			tcp_close(&c->base);
			return err == -EAGAIN ? -EIO : err;
		}
		*out = &c->base;
		return 0;
	}
	return 0;
}

int tcp_accept(struct rail_comm *listen_comm, struct rail_comm **out)
{
	struct tcp_listen_comm *lc = (struct tcp_listen_comm *)listen_comm;
	/* Reap closed and timed-out pending sockets first: they free fds for accept4. */
	int err = progress_pending(lc);

	if (!err)
		err = accept_new(lc);
	if (!err)
		err = progress_pending(lc);
	if (!err)
		err = take_group(lc, out);
	return err;
}

int tcp_close_listen(struct rail_comm *listen_comm)
{
	struct tcp_listen_comm *lc = (struct tcp_listen_comm *)listen_comm;

	for (int i = 0; i < lc->npend; i++)
		close(lc->pend[i].fd);
	while (lc->ngroups > 0)
		group_drop(lc, 0);
	free(lc->pend);
	free(lc->groups);
	close(lc->fd);
	rail_comm_fini(&lc->base);
	free(lc);
	return 0;
}

/*
 * The describe_comm of the ops table: peer and local interface; with detail
 * the sockets (control first) and the next message number.
 */
void tcp_describe_comm(struct rail_comm *comm, int detail, char *buf, size_t len)
{
	const struct tcp_comm *c = (const struct tcp_comm *)comm;
	const struct tcp_dev *d = tcp_dev_get(comm->dev);
	size_t off;
	int w;

	w = snprintf(buf, len, "peer %s, %s %s, %d data sockets", c->peer[0] ? c->peer : "?",
		     d ? d->name : "?", d ? RAIL_ADDRSTR(&d->addr) : "?", c->nsocks);
	off = w > 0 ? (size_t)w : 0;
	if (!detail)
		return;
	for (int i = 0; i <= c->nsocks && off < len; i++) {
		w = snprintf(buf + off, len - off, "%s%d", i ? "," : "; fds ", i ? c->fds[i - 1]
									 : c->ctrl_fd);
		off += w > 0 ? (size_t)w : 0;
	}
	if (off < len)
		snprintf(buf + off, len - off, "; next message %llu", (unsigned long long)c->seq);
}
