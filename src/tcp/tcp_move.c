/*
 * nccl-net-rail: a TCP comm moves to another interface (docs/FAILOVER.md
 * section 6). Runs on NCCL's progress thread, inside isend/irecv/test.
 *
 * The sender moves: it pauses its streams, dials a rescue listener of the
 * receiver on another interface (tcp_rescue.c) with nsocks + 1 new sockets,
 * and waits, without blocking, for the receiver's state: per stream, the
 * byte offset it consumed plus what its old socket's kernel buffer still
 * holds (it reads those first). The sender resumes every stream exactly
 * there with the same chunk plan: the control stream from its ring, the
 * data streams from NCCL's buffers, which it still holds because a send
 * completes only once the peer's kernel acknowledged it (tcp_pool.c).
 * A receiver that sees its interface fail first asks the sender to move
 * (a KICK on the sender's rescue listener) and waits.
 *
 * End of file and ECONNRESET still mean the peer process exited: the comm
 * fails as before. So does a move with no interface left.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

/* How long one candidate address may take to connect. */
#define TCP_MOVE_CONNECT_NS (2ull * 1000000000ull)

struct tcp_move {
	uint64_t t0;			/* the fault was seen */
	int back;			/* send: back to the interfaces the comm was made on */
	uint32_t gen;
	int kicked;			/* receive: the sender was asked */
	char reason[200];
	int fds[TCP_MAX_SOCKS + 1];	/* send: the new sockets */
	union rail_sockaddr to;
	uint8_t state[TCP_STATE_SIZE(TCP_MAX_SOCKS)];
	size_t off;
};

int tcp_path_error(int err)
{
	return err == -EHOSTUNREACH || err == -ENETUNREACH || err == -ENETDOWN ||
	       err == -ETIMEDOUT || err == -EHOSTDOWN;
}

int tcp_path_failed(struct tcp_comm *c, int err)
{
	int none = 0;

	if (!c->fo || !tcp_path_error(err))
		return 0;
	atomic_compare_exchange_strong(&c->path_err, &none, err);
	return 1;
}

void tcp_move_free(struct tcp_comm *c)
{
	if (!c->mv)
		return;
	for (int i = 0; i <= TCP_MAX_SOCKS; i++)
		if (c->mv->fds[i] >= 0)
			close(c->mv->fds[i]);
	free(c->mv);
	c->mv = NULL;
}

static int same_ip(const union rail_sockaddr *a, const union rail_sockaddr *b)
{
	if (a->sa.sa_family != b->sa.sa_family)
		return 0;
	return a->sa.sa_family == AF_INET ? a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr
					  : !memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, 16);
}

static const char *dev_name(int dev)
{
	const struct tcp_dev *d = tcp_dev_get(dev);

	return d ? d->name : "?";
}

/*
 * Send side, away from home: home has been running again (the link watch
 * saw it come back) for NCCL_RAIL_FAILOVER_HOLDDOWN seconds, so a flapping
 * link is not used; after a failed move back, not before back_retry_ns.
 */
static int move_back_due(struct tcp_comm *c, char *why, size_t len)
{
	uint64_t up, now, hold = (uint64_t)rail_param_int(RAIL_P_FAILOVER_HOLDDOWN) * 1000000000ull;

	if (!c->is_send || c->cur_dev == c->home_dev || tcp_link_down(c->home_dev))
		return 0;
	up = tcp_link_up_ns(c->home_dev);
	now = rail_now_ns();
	if (!up || now - up < hold || now < c->back_retry_ns)
		return 0;
	snprintf(why, len, "%s running again for %llu s", dev_name(c->home_dev),
		 (unsigned long long)((now - up) / 1000000000ull));
	return 1;
}

/* Why this comm should move now: 1, 2 (a move back), or 0. */
static int move_reason(struct tcp_comm *c, char *why, size_t len)
{
	uint32_t gen = tcp_link_gen();
	int err = atomic_load(&c->path_err);

	if (gen != c->link_gen) {
		c->link_gen = gen;
		if (tcp_link_down(c->cur_dev)) {
			snprintf(why, len, "%s stopped running (link watch)", dev_name(c->cur_dev));
			return 1;
		}
	}
	if (err) {
		snprintf(why, len, "a socket on %s failed: %s", dev_name(c->cur_dev),
			 RAIL_ERRSTR(err));
		return 1;
	}
	if (c->is_send && atomic_load(&c->peer_kick) > (uint32_t)c->moves) {
		snprintf(why, len, "the receiver asked (its path failed)");
		return 1;
	}
	return move_back_due(c, why, len) ? 2 : 0;
}

static struct tcp_move *move_new(struct tcp_comm *c, const char *why)
{
	struct tcp_move *mv = calloc(1, sizeof(*mv));

	if (!mv)
		return NULL;
	for (int i = 0; i <= TCP_MAX_SOCKS; i++)
		mv->fds[i] = -1;
	mv->t0 = rail_now_ns();
	mv->gen = (uint32_t)c->moves + 1;
	rail_strlcpy(mv->reason, why, sizeof(mv->reason));
	return mv;
}

/* Connect to a and send one move hello (blocking, bounded); the socket, or -errno. */
static int dial(struct tcp_comm *c, const union rail_sockaddr *a, int kind, int index,
		uint32_t gen)
{
	struct tcp_move_hello h = { .kind = kind, .index = (uint16_t)index,
				    .nsocks = (uint16_t)c->nsocks, .gen = gen, .nonce = c->nonce,
				    .conn_id = c->conn_id };
	uint8_t buf[TCP_MOVE_HELLO_SIZE];
	int fd, err = rail_sock_connect_by(a, rail_now_ns() + TCP_MOVE_CONNECT_NS, 0, &fd);

	if (err)
		return err;
	tcp_move_hello_encode(&h, buf);
	rail_sock_set_nonblocking(fd, 0);
	err = rail_sock_send_all(fd, buf, sizeof(buf));
	rail_sock_set_nonblocking(fd, 1);
	if (err) {
		close(fd);
		return err;
	}
	return fd;
}

/*
 * Reach the peer's rescue listeners on another interface: all sockets of a
 * move (send), or a request to move (receive). 0, or -errno with the
 * addresses tried in tried.
 */
static int dial_peer(struct tcp_comm *c, struct tcp_move *mv, char *tried, size_t len)
{
	size_t off = 0;
	int err = -ENETDOWN;

	tried[0] = '\0';
	for (int a = 0; a < c->peer_rescue.count; a++) {
		const union rail_sockaddr *to = &c->peer_rescue.addr[a];
		int n = c->is_send ? c->nsocks + 1 : 1, i;

		if (same_ip(to, &c->peer_addr) || (mv->back && !same_ip(to, &c->peer_home)))
			continue;
		for (i = 0; i < n; i++) {
			err = dial(c, to, c->is_send ? TCP_MOVE_SOCKET : TCP_MOVE_KICK, i, mv->gen);
			if (err < 0)
				break;
			if (c->is_send)
				mv->fds[i] = err;
			else
				close(err);
			err = 0;
		}
		if (!err) {
			mv->to = *to;
			return 0;
		}
		for (i = 0; i <= TCP_MAX_SOCKS; i++)
			if (mv->fds[i] >= 0)
				close(mv->fds[i]);
		for (i = 0; i <= TCP_MAX_SOCKS; i++)
			mv->fds[i] = -1;
		if (off < len)
			off += (size_t)snprintf(tried + off, len - off, "%s%s: %s", off ? ", " : "",
						RAIL_ADDRSTR(to), RAIL_ERRSTR(err));
	}
	if (!off)
		snprintf(tried, len, "no rescue address of the peer on another interface");
	return err;
}

static void new_socket_opts(int fd)
{
	int liveness = (int)rail_param_int(RAIL_P_PEER_TIMEOUT);

	rail_sock_set_nonblocking(fd, 1);
	rail_sock_set_bufs(fd, (long)rail_param_int(RAIL_P_SOCKET_SNDBUF),
			   (long)rail_param_int(RAIL_P_SOCKET_RCVBUF));
	rail_sock_set_liveness(fd, liveness / 2, liveness);
}

/* "faa0 10.77.96.1:43211": the local interface and address of the control socket. */
static void path_str(const struct tcp_comm *c, char *buf, size_t len)
{
	union rail_sockaddr me;
	socklen_t sl = sizeof(me);

	if (getsockname(c->ctrl_fd, &me.sa, &sl) == 0)
		snprintf(buf, len, "%s %s", dev_name(c->cur_dev), RAIL_ADDRSTR(&me));
	else
		snprintf(buf, len, "%s", dev_name(c->cur_dev));
}

/* The local interface and the peer's address of the new control socket. */
static void new_path(struct tcp_comm *c, char *local, size_t len)
{
	union rail_sockaddr me, peer;
	socklen_t sl = sizeof(me), pl = sizeof(peer);

	if (getsockname(c->ctrl_fd, &me.sa, &sl) == 0) {
		int dev = tcp_dev_of_addr(&me);

		if (dev >= 0)
			c->cur_dev = dev;
		snprintf(local, len, "%s %s", dev_name(dev), RAIL_ADDRSTR(&me));
	} else {
		snprintf(local, len, "?");
	}
	if (getpeername(c->ctrl_fd, &peer.sa, &pl) == 0) {
		c->peer_addr = peer;
		rail_sockaddr_str(&peer, c->peer, sizeof(c->peer));
	}
}

/* Send side: the receiver's state arrived; resume every stream there. */
static int send_install(struct tcp_comm *c, struct tcp_move *mv, const uint64_t *pos)
{
	char from[RAIL_ADDR_STRLEN + IF_NAMESIZE + 2], to[sizeof(from)], old_peer[sizeof(c->peer)];
	uint64_t resent = 0, ctl_resent;
	int64_t r;

	if (pos[0] < c->ring_acked || pos[0] > c->ring_sent)
		return tcp_comm_fail(c, -EPROTO, "moving: the receiver's control stream offset %llu "
				     "is outside what this side holds (%llu..%llu)",
				     (unsigned long long)pos[0], (unsigned long long)c->ring_acked,
				     (unsigned long long)c->ring_sent);
	path_str(c, from, sizeof(from));
	rail_strlcpy(old_peer, c->peer, sizeof(old_peer));
	tcp_pool_pause(c);
	atomic_store(&c->path_err, 0);
	for (int i = 0; i < c->nsocks; i++) {
		r = tcp_pool_resume_send(c, i, pos[i + 1], mv->fds[i + 1]);
		if (r < 0) {
			tcp_pool_resume(c);
			return tcp_comm_fail(c, -EPROTO, "moving: the receiver's offset %llu on data "
					     "socket %d is outside what this side holds",
					     (unsigned long long)pos[i + 1], i + 1);
		}
		mv->fds[i + 1] = -1;
		resent += (uint64_t)r;
	}
	ctl_resent = c->ring_sent - pos[0];
	c->ring_sent = pos[0];
	close(c->ctrl_fd);
	c->ctrl_fd = mv->fds[0];
	mv->fds[0] = -1;
	c->ctrl_quiet = 0;
	c->rx_refusal_off = 0;
	atomic_store(&c->moving, 0);
	tcp_pool_resume(c);
	new_path(c, to, sizeof(to));
	c->moves++;
	c->recover_t0 = mv->t0;
	rail_log(mv->back ? RAIL_LOG_INFO : RAIL_LOG_WARN, RAIL_LOG_NET, __FILE__, __LINE__,
		 "send comm to peer %s moved%s from %s to %s (peer now %s): %s; %.1f ms; re-sent "
		 "%llu bytes of the control stream and %llu bytes on %d data sockets", old_peer,
		 mv->back ? " back" : "", from, to, c->peer, mv->reason,
		 (double)(rail_now_ns() - mv->t0) / 1e6, (unsigned long long)ctl_resent,
		 (unsigned long long)resent, c->nsocks);
	return 0;
}

int tcp_move_send(struct tcp_comm *c)
{
	uint64_t pos[TCP_MAX_SOCKS + 1];
	char why[200], tried[512];
	struct tcp_move *mv = c->mv;
	int err;

	if (atomic_load(&c->error))
		return atomic_load(&c->error);
	if (!mv) {
		int reason = move_reason(c, why, sizeof(why));

		if (!reason)
			return 0;
		mv = c->mv = move_new(c, why);
		if (!mv)
			return tcp_comm_fail(c, -ENOMEM, "moving to another interface: out of memory");
		mv->back = reason == 2;
		atomic_store(&c->moving, 1);
		err = dial_peer(c, mv, tried, sizeof(tried));
		if (err && mv->back) {
			/* stay where it works; try again after another hold-down */
			RAIL_INFO(RAIL_LOG_NET, "send comm to peer %s: moving back (%s) failed: %s; "
				  "staying on %s", c->peer, why, tried, dev_name(c->cur_dev));
			c->back_retry_ns = rail_now_ns() + (uint64_t)rail_param_int(
				RAIL_P_FAILOVER_HOLDDOWN) * 1000000000ull;
			atomic_store(&c->moving, 0);
			tcp_move_free(c);
			return 0;
		}
		if (err)
			return tcp_comm_fail(c, err == -ECONNREFUSED ? -ECONNRESET : -ENETDOWN,
					     "%s; no other interface reaches the peer (%s)%s", why,
					     tried, err == -ECONNREFUSED ? "; its process has probably "
					     "exited" : "");
		for (int i = 0; i <= c->nsocks; i++)
			new_socket_opts(mv->fds[i]);
	}
	err = rail_sock_recv_nb(mv->fds[0], mv->state, TCP_STATE_SIZE(c->nsocks), &mv->off);
	if (err == -EAGAIN)
		return 0;
	if (!err && tcp_state_decode(mv->state, mv->gen, c->nsocks, pos))
		err = -EPROTO;
	if (err)
		return tcp_comm_fail(c, err == -EPROTO ? err : -ECONNRESET, "moving to another "
				     "interface (%s): the receiver's answer on %s failed: %s",
				     mv->reason, RAIL_ADDRSTR(&mv->to), RAIL_ERRSTR(err));
	err = send_install(c, mv, pos);
	tcp_move_free(c);
	return err;
}

/* Receive side: take the sockets the rescue thread delivered; 0 when none are complete. */
static int take_rescue(struct tcp_comm *c, int *fds, uint32_t *gen)
{
	int got = 0;

	if (!atomic_load(&c->rescue_ready))
		return 0;
	pthread_mutex_lock(&c->rescue_lock);
	if (atomic_load(&c->rescue_ready)) {
		memcpy(fds, c->rescue_fds, sizeof(int) * ((size_t)c->nsocks + 1));
		for (int i = 0; i <= c->nsocks; i++)
			c->rescue_fds[i] = -1;
		c->rescue_n = 0;
		*gen = c->rescue_gen;
		atomic_store(&c->rescue_ready, 0);
		got = 1;
	}
	pthread_mutex_unlock(&c->rescue_lock);
	return got;
}

/* Receive side: answer the sender with every stream's offset, then switch sockets. */
static int recv_install(struct tcp_comm *c, int *fds, uint32_t gen, uint64_t t0,
			const char *reason)
{
	char from[RAIL_ADDR_STRLEN + IF_NAMESIZE + 2], to[sizeof(from)], old_peer[sizeof(c->peer)];
	uint64_t pos[TCP_MAX_SOCKS + 1], inq[TCP_MAX_SOCKS + 1], left = 0;
	uint8_t state[TCP_STATE_SIZE(TCP_MAX_SOCKS)];
	int n = 0, err = 0, back;
	int64_t p;

	tcp_pool_pause(c);
	if (c->ctl_old_left || ioctl(c->ctrl_fd, FIONREAD, &n) || n < 0)
		err = c->ctl_old_left ? -EBUSY : -errno;
	inq[0] = (uint64_t)n;
	pos[0] = c->ctl_rx + inq[0];
	for (int i = 0; i < c->nsocks && !err; i++) {
		p = tcp_pool_recv_pos(c, i, &inq[i + 1]);
		err = p < 0 ? (int)p : 0;
		pos[i + 1] = (uint64_t)p;
	}
	if (!err) {
		size_t len = (size_t)tcp_state_encode(gen, c->nsocks, pos, state);

		rail_sock_set_nonblocking(fds[0], 0);
		err = rail_sock_send_all(fds[0], state, len);
	}
	if (err) {
		tcp_pool_resume(c);
		for (int i = 0; i <= c->nsocks; i++)
			close(fds[i]);
		return tcp_comm_fail(c, err, "moving to another interface: answering the sender "
				     "failed: %s%s", RAIL_ERRSTR(err), err == -EBUSY ? " (a second "
				     "move before the first one's leftovers were read)" : "");
	}
	path_str(c, from, sizeof(from));
	rail_strlcpy(old_peer, c->peer, sizeof(old_peer));
	for (int i = 0; i <= c->nsocks; i++)
		new_socket_opts(fds[i]);
	for (int i = 0; i < c->nsocks; i++) {
		tcp_pool_switch_recv(c, i, inq[i + 1], fds[i + 1]);
		left += inq[i + 1];
	}
	if (inq[0]) {
		c->ctl_old_fd = c->ctrl_fd;
		c->ctl_old_left = inq[0];
	} else {
		close(c->ctrl_fd);
	}
	c->ctrl_fd = fds[0];
	atomic_store(&c->path_err, 0);
	tcp_pool_resume(c);
	new_path(c, to, sizeof(to));
	c->moves = (int)gen;
	back = c->cur_dev == c->home_dev;
	rail_log(back ? RAIL_LOG_INFO : RAIL_LOG_WARN, RAIL_LOG_NET, __FILE__, __LINE__,
		 "receive comm from peer %s moved%s from %s to %s (peer now %s): %s; %.1f ms; "
		 "the sender resumes at control offset %llu, %llu bytes still read from the old "
		 "sockets", old_peer, back ? " back" : "", from, to, c->peer, reason,
		 (double)(rail_now_ns() - t0) / 1e6, (unsigned long long)pos[0],
		 (unsigned long long)(left + inq[0]));
	return 0;
}

int tcp_move_recv(struct tcp_comm *c)
{
	int fds[TCP_MAX_SOCKS + 1], err;
	char why[200], tried[512];
	uint32_t gen;

	if (atomic_load(&c->error))
		return atomic_load(&c->error);
	if (take_rescue(c, fds, &gen)) {
		uint64_t t0 = c->mv ? c->mv->t0 : rail_now_ns();

		if (!c->mv)
			move_reason(c, why, sizeof(why)); /* note the link change as seen */
		snprintf(why, sizeof(why), "%s", c->mv ? c->mv->reason : "the sender moved");
		err = recv_install(c, fds, gen, t0, why);
		tcp_move_free(c);
		return err;
	}
	if (c->mv || !move_reason(c, why, sizeof(why)))
		return 0;
	c->mv = move_new(c, why);
	if (!c->mv)
		return tcp_comm_fail(c, -ENOMEM, "moving to another interface: out of memory");
	/* Ask the sender to move; it dials this side's rescue listeners. */
	err = dial_peer(c, c->mv, tried, sizeof(tried));
	if (err)
		return tcp_comm_fail(c, err == -ECONNREFUSED ? -ECONNRESET : -ENETDOWN,
				     "%s; no other interface reaches the sender (%s)%s", why, tried,
				     err == -ECONNREFUSED ? "; its process has probably exited" : "");
	RAIL_INFO(RAIL_LOG_NET, "receive comm from peer %s: %s; asked the sender to move (%s)",
		  c->peer, why, RAIL_ADDRSTR(&c->mv->to));
	return 0;
}

void tcp_move_first_done(struct tcp_comm *c)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	RAIL_INFO(RAIL_LOG_NET, "%s comm, peer %s: first message completed on the new path "
		  "%.1f ms after the fault was seen (at %lld.%06ld)", c->is_send ? "send" : "receive",
		  c->peer, (double)(rail_now_ns() - c->recover_t0) / 1e6, (long long)ts.tv_sec,
		  ts.tv_nsec / 1000);
	c->recover_t0 = 0;
}
