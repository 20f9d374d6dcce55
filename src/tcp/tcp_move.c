/*
 * nccl-net-rail: a TCP comm moves to another interface (docs/FAILOVER.md
 * section 6). Runs on NCCL's progress thread, inside isend/irecv/test.
 *
 * The sender moves: it dials a rescue listener of the receiver on another
 * interface (tcp_rescue.c) with nsocks + 1 new sockets, proves on each that
 * it holds the comm's key and checks that the listener does (tcp.h: hello,
 * challenge, proof), pauses its streams before its proofs go out, and waits,
 * without blocking, for the receiver's state: per stream, the
 * byte offset it consumed plus what its old socket's kernel buffer still
 * holds (it reads those first). The sender resumes every stream exactly
 * there with the same chunk plan: the control stream from its ring, the
 * data streams from NCCL's buffers, which it still holds because a send
 * completes only once the peer's kernel acknowledged it (tcp_pool.c).
 * A receiver that sees its interface fail first asks the sender to move
 * (a KICK on the sender's rescue listener, with the same handshake) and
 * waits.
 *
 * End of file and ECONNRESET still mean the peer process exited: the comm
 * fails as before. So does a move with no interface left.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "sha256.h"
#include "tcp/tcp.h"

/* How long one candidate address may take to connect. */
#define TCP_MOVE_CONNECT_NS (2ull * 1000000000ull)
/* A move back that failed is tried again after the hold-down, but not sooner than this. */
#define TCP_MOVE_RETRY_MIN_NS 1000000000ull

struct tcp_move {
	uint64_t t0;			/* the fault was seen (a move back: it was decided) */
	uint32_t gen;			/* the attempt's number, set when its hellos go out */
	int back;			/* send: back to the home interface, which runs again */
	int open;			/* send: a lazy comm's data sockets, not a move */
	uint32_t up_s;			/* back: how long the home interface has been running */
	int n;				/* sockets to dial: nsocks + 1 (send), 1 (a receiver's KICK),
					 * the data sockets to open (open) */
	int hellos_out;			/* connected, hellos sent: reading the challenges */
	int dialed;			/* every listener proved itself, and every proof went out */
	int cand;			/* the next of the peer's rescue addresses to look at */
	uint64_t deadline;		/* of the connects, then the challenges, of the candidate */
	char reason[200];
	char tried[512];		/* each candidate address tried and why it failed */
	size_t tried_off;
	int fds[TCP_MAX_SOCKS + 1];	/* the new sockets */
	struct tcp_move_hello hello;	/* what the hellos say, but their index */
	uint8_t chal[TCP_MAX_SOCKS + 1][TCP_MOVE_CHALLENGE_SIZE];
	size_t chal_off[TCP_MAX_SOCKS + 1];
	union rail_sockaddr to;
	uint8_t state[TCP_STATE_SIZE(TCP_MAX_SOCKS)];
	size_t off;
};

static void dial_close(struct tcp_move *mv)
{
	for (int i = 0; i <= TCP_MAX_SOCKS; i++) {
		if (mv->fds[i] >= 0)
			close(mv->fds[i]);
		mv->fds[i] = -1;
	}
}

void tcp_move_free(struct tcp_comm *c)
{
	if (!c->mv)
		return;
	dial_close(c->mv);
	free(c->mv);
	c->mv = NULL;
}

static const char *dev_name(int dev)
{
	const struct tcp_dev *d = tcp_dev_get(dev);

	return d ? d->name : "?";
}

/*
 * Send side, away from home: 1 when the home interface has run for the
 * hold-down (NCCL_RAIL_FAILOVER_HOLDDOWN) and the last move or failed move
 * back is that long ago. An interface that stops again restarts the count.
 */
static int back_due(struct tcp_comm *c, char *why, size_t len, uint32_t *up_s)
{
	uint64_t hold = (uint64_t)rail_param_int(RAIL_P_FAILOVER_HOLDDOWN) * 1000000000ull;
	uint64_t now = rail_now_ns(), since = tcp_link_up_since(c->base.dev);

	if (!since || now < c->back_after || now - since < hold)
		return 0;
	*up_s = (uint32_t)((now - since) / 1000000000ull);
	snprintf(why, len, "%s up for %u s", dev_name(c->base.dev), *up_s);
	return 1;
}

/* Why this comm should move now (1, or 2 for a move back home), or 0. */
static int move_reason(struct tcp_comm *c, char *why, size_t len, uint32_t *up_s)
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
	if (c->away && back_due(c, why, len, up_s))
		return 2;
	return 0;
}

static struct tcp_move *move_new(struct tcp_comm *c, const char *why, int back, uint32_t up_s)
{
	struct tcp_move *mv = calloc(1, sizeof(*mv));

	if (!mv)
		return NULL;
	for (int i = 0; i <= TCP_MAX_SOCKS; i++)
		mv->fds[i] = -1;
	mv->t0 = rail_now_ns();
	mv->back = back;
	mv->up_s = up_s;
	mv->n = c->is_send ? c->nsocks + 1 : 1;
	rail_strlcpy(mv->reason, why, sizeof(mv->reason));
	return mv;
}

static void dial_note(struct tcp_move *mv, int err)
{
	const char *why = err == -EACCES ? "it could not prove that it holds this connection's key"
			  : err == -RAIL_ECLOSED ? "it closed the connection before its challenge (no "
						   "such connection there)"
						 : RAIL_ERRSTR(err);

	if (mv->tried_off < sizeof(mv->tried))
		mv->tried_off += (size_t)snprintf(mv->tried + mv->tried_off,
						  sizeof(mv->tried) - mv->tried_off, "%s%s: %s",
						  mv->tried_off ? ", " : "", RAIL_ADDRSTR(&mv->to), why);
}

/* How long a candidate may take to connect, then to answer the hellos. */
static uint64_t dial_limit(const struct tcp_move *mv)
{
	return mv->open ? TCP_RESCUE_OPEN_NS : TCP_MOVE_CONNECT_NS;
}

/*
 * Start non-blocking connects of all sockets to the next candidate: the
 * peer's home address for a move back, else any of its rescue addresses
 * but the current one. 0, or -errno when none is left.
 */
static int dial_next(struct tcp_comm *c, struct tcp_move *mv)
{
	int err = -ENETDOWN;

	/* An open tries the listener on the peer's current address, then any other. */
	while (mv->cand < c->peer_rescue.count * (mv->open ? 2 : 1)) {
		int k = mv->cand % c->peer_rescue.count, first = mv->cand++ < c->peer_rescue.count;
		const union rail_sockaddr *to = &c->peer_rescue.addr[k];
		int same = tcp_same_ip(to, &c->peer_addr);

		if (mv->open ? same != first : mv->back ? !tcp_same_ip(to, &c->home_peer) : same)
			continue;
		mv->to = *to;
		mv->deadline = rail_now_ns() + dial_limit(mv);
		err = 0;
		for (int i = 0; i < mv->n && !err; i++)
			err = rail_sock_connect_start(to, &mv->fds[i]);
		if (!err)
			return 0;
		dial_note(mv, err);
		dial_close(mv);
	}
	if (!mv->tried_off)
		snprintf(mv->tried, sizeof(mv->tried), "%s", mv->open ? "the peer has no listener "
			 "for data sockets" : mv->back ? "the peer has no rescue listener on its "
			 "first address" : "no rescue address of the peer on another interface");
	return err;
}

/* Whether the connects to the candidate finished: 0 all connected, -EAGAIN, -errno. */
static int dial_done(struct tcp_move *mv)
{
	struct pollfd p[TCP_MAX_SOCKS + 1];
	int pending = 0, err = 0;
	socklen_t len = sizeof(err);

	for (int i = 0; i < mv->n; i++)
		p[i] = (struct pollfd){ .fd = mv->fds[i], .events = POLLOUT };
	if (poll(p, (nfds_t)mv->n, 0) < 0)
		return -errno;
	for (int i = 0; i < mv->n; i++) {
		if (!(p[i].revents & (POLLOUT | POLLERR | POLLHUP))) {
			pending = 1;
			continue;
		}
		if (getsockopt(mv->fds[i], SOL_SOCKET, SO_ERROR, &err, &len))
			return -errno;
		if (err)
			return -err;
	}
	if (!pending)
		return 0;
	return rail_now_ns() < mv->deadline ? -EAGAIN : -ETIMEDOUT;
}

/* Connecting, never blocking: 0 when every socket is connected, -EAGAIN, or -errno (none left). */
static int dial_poll(struct tcp_comm *c, struct tcp_move *mv)
{
	for (;;) {
		int err = mv->fds[0] < 0 ? dial_next(c, mv) : 0;

		if (err)
			return err;
		err = dial_done(mv);
		if (!err || err == -EAGAIN)
			return err;
		dial_note(mv, err);
		dial_close(mv);
	}
}

/* The index in the hello of dialed socket i: an open's are data sockets 1..n. */
static uint16_t hello_index(const struct tcp_move *mv, int i)
{
	return (uint16_t)(mv->open ? i + 1 : i);
}

/* Each new socket's hello: which move and which socket it is, and a fresh random. */
static int send_hellos(struct tcp_comm *c, struct tcp_move *mv)
{
	struct tcp_move_hello *h = &mv->hello;
	uint8_t buf[TCP_MOVE_HELLO_SIZE];
	int err;

	*h = (struct tcp_move_hello){ .nsocks = (uint16_t)(mv->open ? mv->n : c->nsocks),
				      .gen = mv->gen, .up_s = mv->up_s, .nonce = c->nonce,
				      .conn_id = c->conn_id };
	h->kind = !c->is_send ? TCP_MOVE_KICK : mv->open ? TCP_MOVE_OPEN
		  : mv->back ? TCP_MOVE_BACK : TCP_MOVE_SOCKET;
	err = rail_random_bytes(h->rand, sizeof(h->rand));
	if (err)
		return err;
	for (int i = 0; i < mv->n; i++) {
		ssize_t n;

		h->index = hello_index(mv, i);
		tcp_move_hello_encode(h, buf);
		n = send(mv->fds[i], buf, sizeof(buf), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n != (ssize_t)sizeof(buf))
			return n < 0 ? -errno : -EIO; /* a new socket has room for 56 bytes */
		mv->chal_off[i] = 0;
	}
	mv->deadline = rail_now_ns() + dial_limit(mv);
	return 0;
}

/*
 * Every listener's challenge, with its MAC checked (it holds the comm's key):
 * 0, -EAGAIN while some are missing, or -errno (-EACCES: a wrong MAC).
 */
static int read_challenges(struct tcp_comm *c, struct tcp_move *mv)
{
	uint8_t hello[TCP_MOVE_HELLO_SIZE], rnd[TCP_MOVE_RAND_SIZE], mac[TCP_MAC_SIZE];
	uint8_t want[TCP_MAC_SIZE];
	int missing = 0;

	for (int i = 0; i < mv->n; i++) {
		int err = rail_sock_recv_nb(mv->fds[i], mv->chal[i], TCP_MOVE_CHALLENGE_SIZE,
					    &mv->chal_off[i]);

		if (err == -EAGAIN)
			missing = 1;
		else if (err)
			return err;
	}
	if (missing)
		return rail_now_ns() < mv->deadline ? -EAGAIN : -ETIMEDOUT;
	for (int i = 0; i < mv->n; i++) {
		mv->hello.index = hello_index(mv, i);
		tcp_move_hello_encode(&mv->hello, hello);
		if (tcp_move_challenge_decode(mv->chal[i], rnd, mac))
			return -EPROTO;
		tcp_move_mac(c->key, TCP_ROLE_LISTENER, hello, rnd, want);
		if (!rail_equal_ct(mac, want, sizeof(want)))
			return -EACCES;
	}
	return 0;
}

/* Answer every challenge: this side holds the comm's key. */
static int send_proofs(struct tcp_comm *c, struct tcp_move *mv)
{
	uint8_t hello[TCP_MOVE_HELLO_SIZE], rnd[TCP_MOVE_RAND_SIZE], mac[TCP_MAC_SIZE];
	uint8_t proof[TCP_MOVE_PROOF_SIZE];

	for (int i = 0; i < mv->n; i++) {
		ssize_t n;

		mv->hello.index = hello_index(mv, i);
		tcp_move_hello_encode(&mv->hello, hello);
		tcp_move_challenge_decode(mv->chal[i], rnd, mac);
		tcp_move_mac(c->key, TCP_ROLE_MOVER, hello, rnd, mac);
		tcp_move_proof_encode(mac, proof);
		n = send(mv->fds[i], proof, sizeof(proof), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n != (ssize_t)sizeof(proof))
			return n < 0 ? -errno : -EIO; /* the socket holds 96 bytes at most */
	}
	return 0;
}

/*
 * Send side: stop the streams (a flag the pool threads check, then one
 * pass over every stream's busy flag, so no pool thread still completes a
 * chunk from an acknowledgement): from here the receiver may take its
 * positions, and what arrives there later is read from the new sockets.
 */
static void streams_stop(struct tcp_comm *c)
{
	atomic_store(&c->moving, 1);
	tcp_pool_pause(c);
	tcp_pool_resume(c);
}

/*
 * Reach the peer's rescue listeners: all sockets of a move (send), or a
 * request to move (receive), each through the handshake of tcp.h. 0 once
 * every proof went out, -EAGAIN while connecting or waiting for the
 * challenges, -errno with the addresses tried in mv->tried.
 */
static int dial_peer(struct tcp_comm *c, struct tcp_move *mv)
{
	while (!mv->dialed) {
		int err = 0;

		if (!mv->hellos_out) {
			err = dial_poll(c, mv);
			if (err)
				return err;
			/* A number per attempt, so no socket of an earlier one is taken for this one. */
			mv->gen = c->is_send ? ++c->attempts : (uint32_t)c->moves + 1;
			err = send_hellos(c, mv);
			mv->hellos_out = !err;
		}
		if (!err) {
			err = read_challenges(c, mv);
			if (err == -EAGAIN)
				return err;
		}
		/* With the proofs the receiver may take its positions: the streams stop first. */
		if (!err && c->is_send && !mv->open && !atomic_load(&c->moving))
			streams_stop(c);
		if (!err)
			err = send_proofs(c, mv);
		if (!err) {
			mv->dialed = 1;
			break;
		}
		dial_note(mv, err);
		dial_close(mv);
		mv->hellos_out = 0;
	}
	return 0;
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
	/* Away from the peer's first address: the sender moves back once home runs again. */
	c->away = c->is_send && !tcp_same_ip(&c->peer_addr, &c->home_peer);
}

static uint64_t holddown_ns(void)
{
	return (uint64_t)rail_param_int(RAIL_P_FAILOVER_HOLDDOWN) * 1000000000ull;
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
	c->moves = (int)mv->gen;
	c->recover_t0 = mv->t0;
	c->back_after = rail_now_ns() + holddown_ns();
	rail_log(mv->back ? RAIL_LOG_INFO : RAIL_LOG_WARN, RAIL_LOG_NET, __FILE__, __LINE__,
		 "send comm to peer %s moved %sfrom %s to %s (peer now %s): %s; %.1f ms; re-sent "
		 "%llu bytes of the control stream and %llu bytes on %d data sockets", old_peer,
		 mv->back ? "back " : "", from, to, c->peer, mv->reason,
		 (double)(rail_now_ns() - mv->t0) / 1e6, (unsigned long long)ctl_resent,
		 (unsigned long long)resent, c->nsocks);
	/* The control bytes of sends that completed already: NCCL may not call again for them. */
	return tcp_ctl_flush(c);
}

static const char *busy_str(uint64_t why)
{
	return why == TCP_BUSY_LEFTOVERS ? "it still reads what the old sockets of the last move "
		"held" : why == TCP_BUSY_DOWN ? "its interface there is down" : "busy";
}

/*
 * Send side: no candidate reached, or the receiver declined. A move away
 * fails the comm, named; a move back leaves it where it runs and tries
 * again after the hold-down (at least TCP_MOVE_RETRY_MIN_NS).
 */
static int send_gave_up(struct tcp_comm *c, struct tcp_move *mv, int err, uint64_t busy)
{
	uint64_t wait = RAIL_MAX(holddown_ns(), TCP_MOVE_RETRY_MIN_NS);

	if (!mv->back && err == -EBUSY)
		return tcp_comm_fail(c, -EBUSY, "%s; the receiver declined the move to %s: %s (a "
				     "second move before the first one's leftovers were read)",
				     mv->reason, RAIL_ADDRSTR(&mv->to), busy_str(busy));
	if (!mv->back)
		return tcp_comm_fail(c, err == -ECONNREFUSED ? -ECONNRESET : -ENETDOWN,
				     "%s; no other interface reaches the peer (%s)%s", mv->reason,
				     mv->tried, err == -ECONNREFUSED ? "; its process has probably "
				     "exited" : "");
	if (err == -EBUSY)
		snprintf(mv->tried, sizeof(mv->tried), "the receiver declined: %s", busy_str(busy));
	c->back_after = rail_now_ns() + wait;
	RAIL_INFO(RAIL_LOG_NET, "send comm to peer %s: moving back to %s (%s) failed: %s; stays "
		  "on %s, tries again in %llu s", c->peer, dev_name(c->base.dev), mv->reason,
		  mv->tried, dev_name(c->cur_dev), (unsigned long long)(wait / 1000000000ull));
	dial_close(mv);
	if (atomic_load(&c->moving)) {
		atomic_store(&c->moving, 0);
		tcp_pool_pause(c);
		tcp_pool_resume(c); /* the pool threads look at the streams again */
	}
	tcp_move_free(c);
	return 0;
}

/*
 * Both sides, lazy: the data sockets are up (fds, n of them): hand them to
 * the pool. 0, or the comm's error (the comm owns the fds either way).
 */
static int open_install(struct tcp_comm *c, int *fds, int n)
{
	int err;

	for (int i = 0; i < n; i++) {
		new_socket_opts(fds[i]);
		c->fds[i] = fds[i];
		fds[i] = -1;
	}
	c->nsocks = n;
	c->nthreads = RAIL_MIN(c->lazy_threads, n);
	c->counted = 1;
	tcp_data_comms_add(1);
	err = tcp_pool_attach(c, c->stream_ring);
	if (err) {
		RAIL_WARN("%s comm on %s, peer %s: handing its %d new data sockets to the TCP helper "
			  "threads failed: %s; check the process and thread limits (ulimit -u, "
			  "RLIMIT_NPROC)", c->is_send ? "send" : "receive", tcp_comm_dev_name(c),
			  c->peer, n, RAIL_ERRSTR(err));
		atomic_store(&c->error, err == -EAGAIN ? -ENOMEM : err);
		return atomic_load(&c->error);
	}
	RAIL_INFO(RAIL_LOG_NET, "%s comm on %s, peer %s: %d data sockets open (%d comms of this "
		  "process hold data sockets)", c->is_send ? "send" : "receive",
		  tcp_comm_dev_name(c), c->peer, n, tcp_data_comms());
	return 0;
}

int tcp_move_open(struct tcp_comm *c)
{
	struct tcp_move *mv;

	if (c->mv || c->nsocks || !c->lazy || atomic_load(&c->error))
		return atomic_load(&c->error);
	mv = move_new(c, "opening the data sockets", 0, 0);
	if (!mv)
		return tcp_comm_fail(c, -ENOMEM, "opening the data sockets: out of memory");
	mv->open = 1;
	mv->n = tcp_lazy_socks(c->lazy_max);
	c->mv = mv;
	return tcp_move_send(c);
}

/* Send: drive the open of the data sockets; 0 (maybe not done yet) or the comm's error. */
static int open_step(struct tcp_comm *c, struct tcp_move *mv)
{
	int err = dial_peer(c, mv);

	if (err == -EAGAIN)
		return 0;
	if (err)
		return tcp_comm_fail(c, err == -ECONNREFUSED ? -ECONNRESET : err, "opening %d data "
				     "sockets to the receiver failed (%s)%s", mv->n, mv->tried,
				     err == -ECONNREFUSED ? "; its process has probably exited" : "");
	err = open_install(c, mv->fds, mv->n);
	tcp_move_free(c);
	return err;
}

int tcp_move_send(struct tcp_comm *c)
{
	uint64_t pos[TCP_MAX_SOCKS + 1];
	struct tcp_move *mv = c->mv;
	uint32_t up_s = 0;
	char why[200];
	int err = 0;

	if (atomic_load(&c->error))
		return atomic_load(&c->error);
	/* A move due drops an open under way (its sockets dialed again after the move). */
	if (mv && mv->open) {
		err = c->fo ? move_reason(c, why, sizeof(why), &up_s) : 0;
		if (!err)
			return open_step(c, mv);
		tcp_move_free(c);
		mv = NULL;
	}
	if (!mv) {
		if (!err)
			err = move_reason(c, why, sizeof(why), &up_s);
		if (!err)
			return 0;
		mv = c->mv = move_new(c, why, err == 2, up_s);
		if (!mv)
			return tcp_comm_fail(c, -ENOMEM, "moving to another interface: out of memory");
	}
	if (!mv->dialed) {
		err = dial_peer(c, mv);
		if (err == -EAGAIN)
			return 0;
		if (err)
			return send_gave_up(c, mv, err, 0);
		for (int i = 0; i <= c->nsocks; i++)
			new_socket_opts(mv->fds[i]);
	}
	err = rail_sock_recv_nb(mv->fds[0], mv->state, TCP_STATE_SIZE(c->nsocks), &mv->off);
	if (err == -EAGAIN)
		return 0;
	if (!err)
		err = tcp_state_decode(mv->state, mv->gen, c->nsocks, pos);
	if (err == -EBUSY)
		return send_gave_up(c, mv, err, pos[0]);
	if (err)
		return tcp_comm_fail(c, err == -EPROTO ? err : -ECONNRESET, "moving to another "
				     "interface (%s): the receiver's answer on %s failed: %s",
				     mv->reason, RAIL_ADDRSTR(&mv->to), RAIL_ERRSTR(err));
	err = send_install(c, mv, pos);
	tcp_move_free(c);
	return err;
}

/* Receive side: take the sockets the rescue thread delivered; 0 when none are complete. */
static int take_rescue(struct tcp_comm *c, int *fds, struct tcp_move_hello *h)
{
	int got = 0;

	if (!atomic_load(&c->rescue_ready))
		return 0;
	pthread_mutex_lock(&c->rescue_lock);
	/* A move of data sockets this side has not taken from their open yet: wait for them. */
	if (atomic_load(&c->rescue_ready) && c->rescue_hello.nsocks == c->nsocks) {
		memcpy(fds, c->rescue_fds, sizeof(int) * ((size_t)c->nsocks + 1));
		for (int i = 0; i <= c->nsocks; i++)
			c->rescue_fds[i] = -1;
		c->rescue_n = 0;
		*h = c->rescue_hello;
		atomic_store(&c->rescue_ready, 0);
		got = 1;
	}
	pthread_mutex_unlock(&c->rescue_lock);
	return got;
}

/*
 * Receive side, with the streams paused: every stream's offset (consumed
 * plus what its socket holds) in pos, what the sockets hold in inq; 0, a
 * TCP_BUSY_* reason to decline (> 0), or -errno.
 */
static int recv_positions(struct tcp_comm *c, const struct tcp_move_hello *h, int fd,
			  uint64_t *pos, uint64_t *inq)
{
	union rail_sockaddr me;
	socklen_t sl = sizeof(me);
	int n = 0;
	int64_t p;

	if (c->ctl_old_left)
		return TCP_BUSY_LEFTOVERS;
	if (h->kind == TCP_MOVE_BACK && getsockname(fd, &me.sa, &sl) == 0 &&
	    tcp_link_down(tcp_dev_of_addr(&me)))
		return TCP_BUSY_DOWN;
	if (ioctl(c->ctrl_fd, FIONREAD, &n) || n < 0)
		return -errno;
	inq[0] = (uint64_t)n;
	pos[0] = c->ctl_rx + inq[0];
	for (int i = 0; i < c->nsocks; i++) {
		p = tcp_pool_recv_pos(c, i, &inq[i + 1]);
		if (p == -EBUSY)
			return TCP_BUSY_LEFTOVERS;
		if (p < 0)
			return (int)p;
		pos[i + 1] = (uint64_t)p;
	}
	return 0;
}

/* Receive side: answer the sender (positions, or why not), then switch sockets; 1: declined. */
static int recv_install(struct tcp_comm *c, int *fds, const struct tcp_move_hello *h,
			uint64_t t0, const char *reason)
{
	char from[RAIL_ADDR_STRLEN + IF_NAMESIZE + 2], to[sizeof(from)], old_peer[sizeof(c->peer)];
	uint64_t pos[TCP_MAX_SOCKS + 1] = { 0 }, inq[TCP_MAX_SOCKS + 1] = { 0 }, left = 0;
	uint8_t state[TCP_STATE_SIZE(TCP_MAX_SOCKS)];
	int busy, err = 0, back = h->kind == TCP_MOVE_BACK;

	tcp_pool_pause(c);
	busy = recv_positions(c, h, fds[0], pos, inq);
	if (busy >= 0) {
		size_t len, off = 0;

		pos[0] = busy > 0 ? (uint64_t)busy : pos[0];
		len = (size_t)tcp_state_encode(h->gen, busy > 0, c->nsocks, pos, state);
		/* A new socket has room for it (at most 536 bytes): NCCL's thread never waits. */
		err = rail_sock_send_nb(fds[0], state, len, &off);
		if (err == -EAGAIN)
			err = -ENOBUFS;
	}
	if (busy || err) {
		tcp_pool_resume(c);
		for (int i = 0; i <= c->nsocks; i++)
			close(fds[i]);
		if (back && busy > 0) {
			RAIL_INFO(RAIL_LOG_NET, "receive comm from peer %s: declined the sender's move "
				  "back (%s): %s", c->peer, reason, busy_str((uint64_t)busy));
			return 1;
		}
		err = busy > 0 ? -EBUSY : busy < 0 ? busy : err;
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
	c->moves = (int)h->gen;
	rail_log(back ? RAIL_LOG_INFO : RAIL_LOG_WARN, RAIL_LOG_NET, __FILE__, __LINE__,
		 "receive comm from peer %s moved %sfrom %s to %s (peer now %s): %s; %.1f ms; "
		 "the sender resumes at control offset %llu, %llu bytes still read from the old "
		 "sockets", old_peer, back ? "back " : "", from, to, c->peer, reason,
		 (double)(rail_now_ns() - t0) / 1e6, (unsigned long long)pos[0],
		 (unsigned long long)(left + inq[0]));
	return 0;
}

int tcp_move_recv(struct tcp_comm *c)
{
	int fds[TCP_MAX_SOCKS + 1], err;
	struct tcp_move_hello h;
	uint32_t up_s = 0;
	char why[200];

	if (atomic_load(&c->error))
		return atomic_load(&c->error);
	if (c->lazy && !c->nsocks)
		tcp_move_take_open(c);
	if (take_rescue(c, fds, &h)) {
		uint64_t t0 = c->mv ? c->mv->t0 : rail_now_ns();

		if (!c->mv)
			move_reason(c, why, sizeof(why), &up_s); /* note the link change as seen */
		if (c->mv)
			snprintf(why, sizeof(why), "%s", c->mv->reason);
		else if (h.kind == TCP_MOVE_BACK)
			snprintf(why, sizeof(why), "the sender moved back (its interface up for %u s)",
				 h.up_s);
		else
			snprintf(why, sizeof(why), "the sender moved");
		err = recv_install(c, fds, &h, t0, why);
		if (err == 1)
			return 0; /* a move back declined: a request of this side's stays */
		tcp_move_free(c);
		return err;
	}
	if (!c->mv) {
		if (!move_reason(c, why, sizeof(why), &up_s))
			return 0;
		c->mv = move_new(c, why, 0, 0);
		if (!c->mv)
			return tcp_comm_fail(c, -ENOMEM, "moving to another interface: out of memory");
	}
	if (c->mv->dialed)
		return 0;
	/* Ask the sender to move; it dials this side's rescue listeners. */
	err = dial_peer(c, c->mv);
	if (err == -EAGAIN)
		return 0;
	if (err)
		return tcp_comm_fail(c, err == -ECONNREFUSED ? -ECONNRESET : -ENETDOWN,
				     "%s; no other interface reaches the sender (%s)%s", c->mv->reason,
				     c->mv->tried, err == -ECONNREFUSED ? "; its process has probably "
				     "exited" : "");
	dial_close(c->mv);
	RAIL_INFO(RAIL_LOG_NET, "receive comm from peer %s: %s; asked the sender to move (%s)",
		  c->peer, c->mv->reason, RAIL_ADDRSTR(&c->mv->to));
	return 0;
}

int tcp_move_take_open(struct tcp_comm *c)
{
	int fds[TCP_MAX_SOCKS], n = 0;

	if (c->nsocks)
		return 1;
	if (!atomic_load(&c->open_ready) || atomic_load(&c->error))
		return 0;
	pthread_mutex_lock(&c->rescue_lock);
	if (atomic_load(&c->open_ready)) {
		n = c->open_nsocks;
		for (int i = 0; i < n; i++) {
			fds[i] = c->open_fds[i];
			c->open_fds[i] = -1;
		}
		c->open_n = 0;
		atomic_store(&c->open_ready, 0);
	}
	pthread_mutex_unlock(&c->rescue_lock);
	return n && open_install(c, fds, n) == 0;
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
