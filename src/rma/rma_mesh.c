/*
 * nccl-net-rail: the sockets between the ranks of an RMA group (rma_tcp.h):
 * the listener, links to a set of peers opened both ways at once, and
 * exchanges of one record per rank over the control mesh. Everything here
 * is collective and runs on NCCL's application thread; nothing blocks
 * without a deadline (NCCL_RAIL_CONNECT_TIMEOUT), and every rank connects
 * and accepts in the same loop, so no order of arrival can deadlock. The
 * verbs backend (rma_ib.h) uses the same mesh as its out-of-band channel.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fdlimit.h"
#include "handle.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "rma/rma_tcp.h"

const char *rma_mesh_peer(const struct rma_mesh *m, int peer, char *buf, size_t len)
{
	snprintf(buf, len, "rank %d (%s)", peer, peer >= 0 && peer < m->nranks
		 ? RAIL_ADDRSTR(&m->addr[peer]) : "?");
	return buf;
}

/* What to add to a socket or accept error: the descriptor limit when that is the cause. */
static const char *fd_hint(int err, const struct rma_mesh *m, char *buf, size_t len)
{
	int n;

	buf[0] = '\0';
	if (err != -EMFILE && err != -ENFILE)
		return buf;
	n = snprintf(buf, len, "; an RMA group of %d ranks takes 2 x %d sockets, and 2 x %d more "
		     "per context: ", m->nranks, m->nranks - 1, m->nranks - 1);
	if (n > 0 && (size_t)n < len)
		rail_nofile_hint(buf + n, len - (size_t)n);
	return buf;
}

static uint64_t deadline(void)
{
	int64_t s = rail_param_int(RAIL_P_CONNECT_TIMEOUT);

	return s > 0 ? rail_now_ns() + (uint64_t)s * 1000000000ull : UINT64_MAX;
}

/* Milliseconds to wait in poll, or -1 when the deadline passed. */
static int wait_ms(uint64_t until)
{
	uint64_t now = rail_now_ns();

	if (now >= until)
		return -1;
	return (int)RAIL_MIN((until - now) / 1000000 + 1, 1000);
}

int rma_mesh_listen(int dev, const union rail_sockaddr *addr, void *handle,
		    struct rma_tcp_listen **out)
{
	struct rma_tcp_listen *lc = calloc(1, sizeof(*lc));
	union rail_sockaddr a = *addr;
	struct rail_handle h = { .transport = RAIL_TRANSPORT_RMA_TCP };
	int err;

	if (!lc)
		return -ENOMEM;
	rail_sockaddr_set_port(&a, 0);
	err = rail_sock_listen(&a, 1024, &lc->fd, &lc->addr);
	if (err) {
		RAIL_WARN("RMA listen on device %d (%s): %s", dev, RAIL_ADDRSTR(&a), RAIL_ERRSTR(err));
		free(lc);
		return err;
	}
	lc->base.dev = dev;
	lc->nonce = rail_random64();
	h.nonce = lc->nonce;
	h.addr = lc->addr;
	err = rail_handle_encode(&h, handle, RAIL_HANDLE_SIZE);
	if (err) {
		RAIL_WARN("RMA listen on device %d (%s): encoding the handle: %s", dev,
			  RAIL_ADDRSTR(&lc->addr), RAIL_ERRSTR(err));
		close(lc->fd);
		free(lc);
		return err;
	}
	*out = lc;
	return 0;
}

void rma_mesh_close_listen(struct rma_tcp_listen *lc)
{
	close(lc->fd);
	free(lc);
}

static int mesh_alloc(struct rma_mesh *m, int nranks)
{
	m->addr = calloc((size_t)nranks, sizeof(*m->addr));
	m->nonces = calloc((size_t)nranks, sizeof(*m->nonces));
	m->ctrl_out = malloc((size_t)nranks * sizeof(int));
	m->ctrl_in = malloc((size_t)nranks * sizeof(int));
	if (!m->addr || !m->nonces || !m->ctrl_out || !m->ctrl_in)
		return -ENOMEM;
	for (int i = 0; i < nranks; i++)
		m->ctrl_out[i] = m->ctrl_in[i] = -1;
	return 0;
}

int rma_mesh_init(struct rma_mesh *m, const struct rma_tcp_listen *lc, void *const *handles,
		  int nranks, int rank)
{
	char why[160];
	int err;

	memset(m, 0, sizeof(*m));
	m->dev = lc->base.dev;
	m->rank = rank;
	m->nranks = nranks;
	m->nonce = lc->nonce;
	m->listen_fd = -1;
	err = mesh_alloc(m, nranks);
	for (int i = 0; !err && i < nranks; i++) {
		struct rail_handle h;

		err = rail_handle_decode(handles[i], RAIL_HANDLE_SIZE, &h, why, sizeof(why));
		if (!err && h.transport != RAIL_TRANSPORT_RMA_TCP) {
			snprintf(why, sizeof(why), "a handle of the %s transport, not of RMA over TCP",
				 rail_transport_name(h.transport));
			err = -EPROTO;
		} else if (!err && i == rank && h.nonce != lc->nonce) {
			snprintf(why, sizeof(why), "this rank's handle is not its listen comm's");
			err = -EINVAL;
		}
		if (err) {
			RAIL_WARN("RMA connect (rank %d of %d, device %d): the handle of rank %d: %s",
				  rank, nranks, m->dev, i, why);
			break;
		}
		m->addr[i] = h.addr;
		m->nonces[i] = h.nonce;
	}
	if (!err && (m->listen_fd = dup(lc->fd)) < 0) {
		char hint[640];

		err = -errno;
		RAIL_WARN("RMA connect (rank %d of %d, device %d): keeping the listening socket: %s%s",
			  rank, nranks, m->dev, RAIL_ERRSTR(err), fd_hint(err, m, hint, sizeof(hint)));
	}
	if (err)
		rma_mesh_fini(m);
	return err;
}

void rma_mesh_fini(struct rma_mesh *m)
{
	for (int i = 0; m->ctrl_out && i < m->nranks; i++) {
		if (m->ctrl_out[i] >= 0)
			close(m->ctrl_out[i]);
		if (m->ctrl_in[i] >= 0)
			close(m->ctrl_in[i]);
	}
	for (int i = 0; i < m->nstash; i++)
		close(m->stash[i].fd);
	for (int i = 0; i < m->npend; i++)
		close(m->pend[i].fd);
	free(m->pend);
	if (m->listen_fd >= 0)
		close(m->listen_fd);
	free(m->stash);
	free(m->addr);
	free(m->nonces);
	free(m->ctrl_out);
	free(m->ctrl_in);
	memset(m, 0, sizeof(*m));
	m->listen_fd = -1;
}

/* ---- links ------------------------------------------------------------------ */

/* One call of rma_mesh_links: the links wanted, what is open, what is waiting. */
struct links {
	struct rma_mesh *m;
	enum rma_link_kind kind;
	uint32_t seq;
	int n;
	const struct rma_link *want;
	int *out, *in;
	const char *call;
	int *ofd;		/* [i]: connecting or sending its hello */
	uint8_t (*obuf)[RMA_HELLO_SIZE];
	size_t *ooff;
	int need_out, need_in;
};

/* A link is kept: the options of the TCP transport's data sockets. */
static void links_keep(int fd)
{
	int liveness = (int)rail_param_int(RAIL_P_PEER_TIMEOUT);

	rail_sock_set_nodelay(fd);
	rail_sock_set_liveness(fd, liveness / 2, liveness);
	rail_sock_set_bufs(fd, (long)rail_param_int(RAIL_P_SOCKET_SNDBUF),
			   (long)rail_param_int(RAIL_P_SOCKET_RCVBUF));
}

/* A hello for another call: kept for it (a faster rank), or refused as stale. */
static void links_stash(struct links *l, int fd, const struct rma_hello *h)
{
	struct rma_mesh *m = l->m;
	int later = h->kind == RMA_LINK_DATA && (l->kind == RMA_LINK_CTRL || h->seq > l->seq);
	struct rma_stashed *s;

	if (later && (s = realloc(m->stash, (size_t)(m->nstash + 1) * sizeof(*s)))) {
		m->stash = s;
		s[m->nstash].fd = fd;
		s[m->nstash++].hello = *h;
		return;
	}
	RAIL_WARN("RMA %s (rank %d of %d, device %d): refused a link from %s for context %u of "
		  "createContext #%u: %s", l->call, m->rank, m->nranks, m->dev,
		  RMA_PEER(m, (int)h->rank), h->index, h->seq,
		  later ? "out of memory" : "not one this rank expects (a stale or duplicate link)");
	close(fd);
}

/* File an incoming socket by its hello. */
static void links_file(struct links *l, int fd, const struct rma_hello *h)
{
	struct rma_mesh *m = l->m;

	if (h->kind != l->kind || h->seq != l->seq) {
		links_stash(l, fd, h);
		return;
	}
	for (int i = 0; i < l->n; i++) {
		if (l->want[i].peer == (int)h->rank && l->want[i].index == h->index &&
		    l->in[i] < 0) {
			links_keep(fd);
			l->in[i] = fd;
			l->need_in--;
			return;
		}
	}
	RAIL_WARN("RMA %s (rank %d of %d, device %d): refused a second or unexpected link from "
		  "%s (context %u)", l->call, m->rank, m->nranks, m->dev, RMA_PEER(m, (int)h->rank),
		  h->index);
	close(fd);
}

static void links_hello(struct links *l, int fd, const uint8_t *buf)
{
	struct rma_mesh *m = l->m;
	struct rma_hello h;
	char why[160];
	int err = rma_hello_decode(buf, &h, why, sizeof(why));

	if (!err && (h.nonce != m->nonce || (int)h.nranks != m->nranks ||
		     (int)h.rank == m->rank)) {
		snprintf(why, sizeof(why), "rank %u of %u for listener nonce 0x%llx, this is rank "
			 "%d of %d with nonce 0x%llx (another group's or a stale handle)", h.rank,
			 h.nranks, (unsigned long long)h.nonce, m->rank, m->nranks,
			 (unsigned long long)m->nonce);
		err = -EPROTO;
	}
	if (err) {
		RAIL_WARN("RMA %s (rank %d of %d, device %d): refused a connection: %s", l->call,
			  m->rank, m->nranks, m->dev, why);
		close(fd);
		return;
	}
	links_file(l, fd, &h);
}

/* Links of this call that a faster rank opened before it began. */
static void links_take_stash(struct links *l)
{
	struct rma_mesh *m = l->m;
	int k = 0;

	for (int i = 0; i < m->nstash; i++) {
		const struct rma_hello *h = &m->stash[i].hello;

		if (h->kind == l->kind && h->seq == l->seq)
			links_file(l, m->stash[i].fd, h);
		else
			m->stash[k++] = m->stash[i];
	}
	m->nstash = k;
}

static int links_start(struct links *l)
{
	struct rma_mesh *m = l->m;

	for (int i = 0; i < l->n; i++) {
		struct rma_hello h = {
			.kind = (uint16_t)l->kind, .nonce = m->nonces[l->want[i].peer],
			.rank = (uint32_t)m->rank, .nranks = (uint32_t)m->nranks, .seq = l->seq,
			.index = l->want[i].index,
		};
		int err = rail_sock_connect_start(&m->addr[l->want[i].peer], &l->ofd[i]);
		char hint[640];

		if (err) {
			RAIL_WARN("RMA %s (rank %d of %d, device %d): connecting to %s: %s%s", l->call,
				  m->rank, m->nranks, m->dev, RMA_PEER(m, l->want[i].peer),
				  RAIL_ERRSTR(err), fd_hint(err, m, hint, sizeof(hint)));
			return err;
		}
		rma_hello_encode(&h, l->obuf[i]);
	}
	return 0;
}

/* An outgoing link made progress: connected, then its hello sent. */
static int links_out(struct links *l, int i)
{
	struct rma_mesh *m = l->m;
	int err = l->ooff[i] == 0 ? rail_sock_connect_done(l->ofd[i]) : 0;

	if (!err)
		err = rail_sock_send_nb(l->ofd[i], l->obuf[i], RMA_HELLO_SIZE, &l->ooff[i]);
	if (err == -EAGAIN)
		return 0;
	if (err) {
		RAIL_WARN("RMA %s (rank %d of %d, device %d): link to %s (context %u): %s", l->call,
			  m->rank, m->nranks, m->dev, RMA_PEER(m, l->want[i].peer),
			  l->want[i].index, RAIL_ERRSTR(err));
		return err;
	}
	links_keep(l->ofd[i]);
	l->out[i] = l->ofd[i];
	l->ofd[i] = -1;
	l->need_out--;
	return 0;
}

/* An accept failed: 0 to go on (the connection went away), or the call fails now. */
static int links_accept_failed(struct links *l, int err)
{
	struct rma_mesh *m = l->m;
	char hint[640];

	if (err != -EMFILE && err != -ENFILE && err != -ENOBUFS && err != -ENOMEM)
		return 0;
	/* Waiting frees nothing: NCCL makes every connection before it closes any. */
	RAIL_WARN("RMA %s (rank %d of %d, device %d): accept on %s failed: %s%s", l->call, m->rank,
		  m->nranks, m->dev, RAIL_ADDRSTR(&m->addr[m->rank]), RAIL_ERRSTR(err),
		  fd_hint(err, m, hint, sizeof(hint)));
	return err;
}

/* New connections wait in the mesh for their hellos, across calls if need be. */
static int links_accept(struct links *l)
{
	struct rma_mesh *m = l->m;
	union rail_sockaddr peer;
	int fd, err;

	while ((err = rail_sock_accept(m->listen_fd, &fd, &peer)) != -EAGAIN) {
		if (err) {
			if ((err = links_accept_failed(l, err)))
				return err;
			continue;
		}
		if (m->npend == m->cappend) {
			int cap = m->cappend ? 2 * m->cappend : 16;
			void *p = realloc(m->pend, (size_t)cap * sizeof(*m->pend));

			if (!p) {
				close(fd);
				return 0;
			}
			m->pend = p;
			m->cappend = cap;
		}
		m->pend[m->npend].fd = fd;
		m->pend[m->npend++].got = 0;
	}
	return 0;
}

/* Incoming sockets: read their hellos (40 bytes at most each, never more). */
static void links_read(struct links *l, const struct pollfd *p, int np)
{
	struct rma_mesh *m = l->m;
	int k = 0, n = m->npend;

	for (int i = 0; i < n; i++) {
		struct rma_pending q = m->pend[i];
		int err = i >= np || p[i].revents
			  ? rail_sock_recv_nb(q.fd, q.buf, RMA_HELLO_SIZE, &q.got) : -EAGAIN;

		if (err == -EAGAIN)
			m->pend[k++] = q;
		else if (err)
			close(q.fd);	/* a connection that went away before its hello */
		else
			links_hello(l, q.fd, q.buf);
	}
	m->npend = k;
}

static void links_warn_timeout(const struct links *l)
{
	struct rma_mesh *m = l->m;

	for (int i = 0; i < l->n; i++) {
		if (l->out[i] < 0 || l->in[i] < 0) {
			RAIL_WARN("RMA %s (rank %d of %d, device %d): no %s link with %s (context %u) "
				  "within NCCL_RAIL_CONNECT_TIMEOUT=%lld s (%d links still missing); "
				  "is that rank alive and in the same call?", l->call, m->rank,
				  m->nranks, m->dev, l->out[i] < 0 ? "outgoing" : "incoming",
				  RMA_PEER(m, l->want[i].peer), l->want[i].index,
				  (long long)rail_param_int(RAIL_P_CONNECT_TIMEOUT),
				  l->need_out + l->need_in);
			return;
		}
	}
}

/* One poll round: 0 to go on, or -errno. */
static int links_round(struct links *l, struct pollfd *p, uint64_t until)
{
	int np = 0, npend = l->m->npend, ms = wait_ms(until), err;
	struct pollfd *pp;

	if (ms < 0) {
		links_warn_timeout(l);
		return -ETIMEDOUT;
	}
	for (int i = 0; i < l->n; i++)
		p[np++] = (struct pollfd){ .fd = l->ofd[i], .events = POLLOUT };
	p[np++] = (struct pollfd){ .fd = l->m->listen_fd, .events = POLLIN };
	pp = &p[np];
	for (int i = 0; i < npend; i++)
		p[np++] = (struct pollfd){ .fd = l->m->pend[i].fd, .events = POLLIN };
	if (poll(p, (nfds_t)np, ms) < 0 && errno != EINTR)
		return -errno;
	for (int i = 0; i < l->n; i++) {
		if (l->ofd[i] >= 0 && p[i].revents && (err = links_out(l, i)))
			return err;
	}
	links_read(l, pp, npend);
	return p[l->n].revents ? links_accept(l) : 0;
}

static void links_free(struct links *l, int failed)
{
	for (int i = 0; i < l->n; i++) {
		if (l->ofd && l->ofd[i] >= 0)
			close(l->ofd[i]);
		if (failed && l->out[i] >= 0)
			close(l->out[i]);
		if (failed && l->in[i] >= 0)
			close(l->in[i]);
		if (failed)
			l->out[i] = l->in[i] = -1;
	}
	free(l->ofd);
	free(l->obuf);
	free(l->ooff);
}

int rma_mesh_links(struct rma_mesh *m, enum rma_link_kind kind, uint32_t seq, int n,
		   const struct rma_link *want, int *out, int *in, const char *call)
{
	struct links l = { .m = m, .kind = kind, .seq = seq, .n = n, .want = want, .out = out,
			   .in = in, .call = call, .need_out = n, .need_in = n };
	uint64_t until = deadline();
	struct pollfd *p = NULL;
	int err = -ENOMEM;

	for (int i = 0; i < n; i++)
		out[i] = in[i] = -1;
	l.ofd = malloc((size_t)(n + 1) * sizeof(int));
	l.obuf = malloc((size_t)(n + 1) * RMA_HELLO_SIZE);
	l.ooff = calloc((size_t)n + 1, sizeof(size_t));
	if (!l.ofd || !l.obuf || !l.ooff)
		goto out;
	for (int i = 0; i < n; i++)
		l.ofd[i] = -1;
	err = links_start(&l);
	links_take_stash(&l);
	while (!err && (l.need_out || l.need_in)) {
		struct pollfd *q = realloc(p, (size_t)(n + 1 + m->npend) * sizeof(*p));

		if (!q) {
			err = -ENOMEM;
			break;
		}
		p = q;
		err = links_round(&l, p, until);
	}
out:
	free(p);
	links_free(&l, err != 0);
	return err;
}

/* ---- the group ---------------------------------------------------------------- */

/* Every rank reached every other one, and all agree on the group (and on *agree: the lowest). */
static int group_check(struct rma_mesh *m, uint32_t *agree)
{
	struct rma_record mine = { .index = (uint32_t)m->rank, .nranks = (uint32_t)m->nranks,
				   .size = agree ? *agree : 0 };
	struct rma_record *all = calloc((size_t)m->nranks, sizeof(*all));
	int err = all ? rma_mesh_exchange(m, &mine, all, "connect") : -ENOMEM;

	for (int q = 0; !err && q < m->nranks; q++) {
		if (all[q].index != (uint32_t)q || all[q].nranks != (uint32_t)m->nranks) {
			RAIL_WARN("RMA connect (rank %d of %d, device %d): %s says it is rank %u of %u",
				  m->rank, m->nranks, m->dev, RMA_PEER(m, q), all[q].index,
				  all[q].nranks);
			err = -EPROTO;
		}
		if (agree)
			*agree = (uint32_t)RAIL_MIN(*agree, all[q].size);
	}
	free(all);
	return err;
}

/* The control mesh: one link each way with every other rank. */
static int group_links(struct rma_mesh *m)
{
	int n = 0, err;
	struct rma_link *want = malloc((size_t)m->nranks * sizeof(*want));
	int *out = malloc((size_t)m->nranks * sizeof(int));
	int *in = malloc((size_t)m->nranks * sizeof(int));

	err = want && out && in ? 0 : -ENOMEM;
	for (int q = 0; !err && q < m->nranks; q++) {
		if (q != m->rank)
			want[n++] = (struct rma_link){ .peer = q, .index = 0 };
	}
	if (!err)
		err = rma_mesh_links(m, RMA_LINK_CTRL, 0, n, want, out, in, "connect");
	for (int i = 0; !err && i < n; i++) {
		m->ctrl_out[want[i].peer] = out[i];
		m->ctrl_in[want[i].peer] = in[i];
	}
	free(want);
	free(out);
	free(in);
	return err;
}

int rma_mesh_group(struct rma_mesh *m, uint32_t *agree)
{
	int err = m->nranks > 1 ? group_links(m) : 0;

	return !err && m->nranks > 1 ? group_check(m, agree) : err;
}

/* ---- exchanges ---------------------------------------------------------------- */

struct xchg {
	const uint8_t *out;			/* [peer][len] */
	uint8_t *in;				/* [peer][len] */
	size_t len;
	size_t *sent, *got;			/* [peer] */
};

/* One poll round over the control mesh: 1 when everything moved, 0 to go on, or -errno. */
static int xchg_round(struct rma_mesh *m, struct xchg *x, struct pollfd *p, int ms,
		      const char *call)
{
	int np = 0, busy = 0;

	for (int q = 0; q < m->nranks; q++) {
		if (q == m->rank)
			continue;
		p[np++] = (struct pollfd){ .fd = m->ctrl_out[q],
					   .events = x->sent[q] < x->len ? POLLOUT : 0 };
		p[np++] = (struct pollfd){ .fd = m->ctrl_in[q],
					   .events = x->got[q] < x->len ? POLLIN : 0 };
	}
	if (np && poll(p, (nfds_t)np, ms) < 0 && errno != EINTR)
		return -errno;
	for (int q = 0; q < m->nranks; q++) {
		size_t at = (size_t)q * x->len;
		int e1, e2;

		if (q == m->rank)
			continue;
		e1 = rail_sock_send_nb(m->ctrl_out[q], x->out + at, x->len, &x->sent[q]);
		e2 = rail_sock_recv_nb(m->ctrl_in[q], x->in + at, x->len, &x->got[q]);
		if ((e1 && e1 != -EAGAIN) || (e2 && e2 != -EAGAIN)) {
			int err = e1 && e1 != -EAGAIN ? e1 : e2;

			RAIL_WARN("RMA %s (rank %d of %d, device %d): exchange with %s: %s", call,
				  m->rank, m->nranks, m->dev, RMA_PEER(m, q), RAIL_ERRSTR(err));
			return err;
		}
		busy |= e1 || e2;
	}
	return !busy;
}

int rma_mesh_alltoall(struct rma_mesh *m, const void *out, void *in, size_t len,
		      const char *call)
{
	struct xchg x = { .out = out, .in = in, .len = len };
	struct pollfd *p = malloc((size_t)(2 * m->nranks) * sizeof(*p));
	uint64_t until = deadline();
	int err = 0;

	x.sent = calloc((size_t)m->nranks, sizeof(size_t));
	x.got = calloc((size_t)m->nranks, sizeof(size_t));
	if (!p || !x.sent || !x.got)
		err = -ENOMEM;
	memcpy(x.in + (size_t)m->rank * len, x.out + (size_t)m->rank * len, len);
	while (!err) {
		int ms = wait_ms(until);

		if (ms < 0) {
			RAIL_WARN("RMA %s (rank %d of %d, device %d): not every rank answered within "
				  "NCCL_RAIL_CONNECT_TIMEOUT=%lld s (every rank must make this call, "
				  "in the same order)", call, m->rank, m->nranks, m->dev,
				  (long long)rail_param_int(RAIL_P_CONNECT_TIMEOUT));
			err = -ETIMEDOUT;
			break;
		}
		err = xchg_round(m, &x, p, ms, call);
		if (err == 1)
			err = 0;
		else if (!err)
			continue;
		break;
	}
	free(p);
	free(x.sent);
	free(x.got);
	return err;
}

int rma_mesh_exchange(struct rma_mesh *m, const struct rma_record *mine,
		      struct rma_record *all, const char *call)
{
	size_t n = (size_t)m->nranks;
	uint8_t *out = malloc(n * RMA_RECORD_SIZE), *in = malloc(n * RMA_RECORD_SIZE);
	int err = out && in ? 0 : -ENOMEM;

	for (size_t q = 0; !err && q < n; q++)
		rma_record_encode(mine, out + q * RMA_RECORD_SIZE);
	if (!err)
		err = rma_mesh_alltoall(m, out, in, RMA_RECORD_SIZE, call);
	for (int q = 0; !err && q < m->nranks; q++) {
		if (q == m->rank) {
			all[q] = *mine;
		} else if (rma_record_decode(in + (size_t)q * RMA_RECORD_SIZE, &all[q])) {
			RAIL_WARN("RMA %s (rank %d of %d, device %d): %s sent a malformed record",
				  call, m->rank, m->nranks, m->dev, RMA_PEER(m, q));
			err = -EPROTO;
		}
	}
	free(out);
	free(in);
	return err;
}
