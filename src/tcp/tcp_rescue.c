/*
 * nccl-net-rail: what a TCP comm needs to move to another interface
 * (docs/FAILOVER.md section 6), kept per process:
 *
 * - one "rescue" listener per interface, so a sender can reach its
 *   receiver again after NCCL closed the listen comm; its addresses travel
 *   in the handshake (tcp_conn.c);
 * - a netlink link watch: an interface that stops running (RTM_NEWLINK
 *   without IFF_RUNNING) bumps tcp_link_gen(), which every comm compares
 *   with its own at each call (one load); the state lives in tcp_link.c,
 *   which this watch writes;
 * - the registry of comms that can move, by connection id, so the rescue
 *   thread hands the sockets of a move to its receive comm and a receiver's
 *   request to move to its send comm.
 *
 * One thread serves all of it, in poll(), and never waits on a peer: every
 * accepted socket is non-blocking, with its handshake's state and a
 * deadline (tcp.h, TCP_RESCUE_*), so no stranger holds up the link watch,
 * the other listeners or finalize. Nothing changes before the mover proved
 * that it holds the comm's key (challenge-response, tcp.h). Started when
 * failover is on (NCCL_RAIL_FAILOVER) and the transport has two interfaces
 * or more; otherwise nothing here runs and comms behave as before.
 */
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "sha256.h"
#include "tcp/tcp.h"
#include "thread.h"

static pthread_mutex_t rs_lock = PTHREAD_MUTEX_INITIALIZER;
static int rs_running;
static pthread_t rs_thread;
static int rs_n;
static int rs_fds[TCP_RESCUE_MAX];
static union rail_sockaddr rs_addr[TCP_RESCUE_MAX];
static int rs_nl = -1;
static int rs_wake[2] = { -1, -1 };
static unsigned rs_ifindex[TCP_MAX_DEVS];
static struct tcp_comm *rs_comms;	/* under rs_lock */

void tcp_rescue_mine(struct tcp_rescue *r)
{
	memset(r, 0, sizeof(*r));
	pthread_mutex_lock(&rs_lock);
	if (rs_running) {
		r->count = rs_n;
		memcpy(r->addr, rs_addr, sizeof(rs_addr));
	}
	pthread_mutex_unlock(&rs_lock);
}

void tcp_rescue_register(struct tcp_comm *c)
{
	pthread_mutex_lock(&rs_lock);
	c->reg_next = rs_comms;
	rs_comms = c;
	pthread_mutex_unlock(&rs_lock);
}

void tcp_rescue_unregister(struct tcp_comm *c)
{
	pthread_mutex_lock(&rs_lock);
	for (struct tcp_comm **p = &rs_comms; *p; p = &(*p)->reg_next)
		if (*p == c) {
			*p = c->reg_next;
			break;
		}
	pthread_mutex_unlock(&rs_lock);
}

/* Hand one data socket of a lazy comm's open to its receive comm (c->rescue_lock held). */
static int deliver_open(struct tcp_comm *c, const struct tcp_move_hello *h, int fd)
{
	if (h->gen > c->open_gen) {
		/* A newer attempt (the last one was dropped for a move): the older sockets go. */
		for (int i = 0; i < TCP_MAX_SOCKS; i++) {
			if (c->open_fds[i] >= 0)
				close(c->open_fds[i]);
			c->open_fds[i] = -1;
		}
		c->open_gen = h->gen;
		c->open_nsocks = h->nsocks;
		c->open_n = 0;
		atomic_store(&c->open_ready, 0);
	}
	if (h->gen != c->open_gen || h->nsocks != c->open_nsocks || c->open_fds[h->index - 1] >= 0)
		return fd;
	c->open_fds[h->index - 1] = fd;
	if (++c->open_n == c->open_nsocks)
		atomic_store(&c->open_ready, 1);
	return -1;
}

/* Hand one socket of a move (or of an open) to its receive comm (rs_lock held). */
static void deliver(struct tcp_comm *c, const struct tcp_move_hello *h, int fd)
{
	pthread_mutex_lock(&c->rescue_lock);
	if (h->kind == TCP_MOVE_OPEN) {
		fd = deliver_open(c, h, fd);
		pthread_mutex_unlock(&c->rescue_lock);
		if (fd >= 0)
			close(fd);
		return;
	}
	if (h->gen > c->rescue_gen) {
		/* A newer attempt: the sockets of an older one are stale. */
		for (int i = 0; i <= TCP_MAX_SOCKS; i++)
			if (c->rescue_fds[i] >= 0)
				close(c->rescue_fds[i]);
		for (int i = 0; i <= TCP_MAX_SOCKS; i++)
			c->rescue_fds[i] = -1;
		c->rescue_gen = h->gen;
		c->rescue_hello = *h;
		c->rescue_n = 0;
		atomic_store(&c->rescue_ready, 0);
	}
	if (h->gen == c->rescue_gen && h->nsocks == c->rescue_hello.nsocks &&
	    c->rescue_fds[h->index] < 0) {
		c->rescue_fds[h->index] = fd;
		fd = -1;
		if (++c->rescue_n == h->nsocks + 1)
			atomic_store(&c->rescue_ready, 1);
	}
	pthread_mutex_unlock(&c->rescue_lock);
	if (fd >= 0)
		close(fd);
}

/*
 * A connection on a rescue listener until its handshake is done (tcp.h: the
 * hello, the challenge, the proof). Nothing here waits on it: its socket is
 * non-blocking and in the thread's poll set, and it is closed unless the
 * handshake is done within TCP_RESCUE_HELLO_NS.
 */
struct rs_conn {
	int fd;
	int named;			/* its hello is in and valid (h) */
	int proving;			/* the challenge went out: reading the proof */
	int lst;			/* the listener it came in on */
	union rail_sockaddr peer;
	uint64_t t0;			/* accepted */
	size_t off;
	uint8_t hello[TCP_MOVE_HELLO_SIZE];
	uint8_t proof[TCP_MOVE_PROOF_SIZE];
	uint8_t expect[TCP_MAC_SIZE];	/* the right proof */
	struct tcp_move_hello h;
};

static struct rs_conn *rs_pend;		/* TCP_RESCUE_PENDING; the rescue thread's */
static int rs_npend;
static uint64_t rs_accept_at;		/* out of fds: accept again from this time */
/* Out of fds: how long the listeners are left alone (the pending ones expire meanwhile). */
#define RS_FDS_WAIT_NS (100ull * 1000000ull)

/*
 * Lines about strangers: one per attempt (the sockets of a move but its
 * socket 0 are counted, not logged), at most RS_LOG_BURST per
 * RS_LOG_WINDOW_NS, of which one WARN (a forged move, or out of fds), the
 * rest INFO; the next line counts what was left out. A flood of strangers
 * is a few lines, not one per connection.
 */
#define RS_LOG_WINDOW_NS (10ull * 1000000000ull)
#define RS_LOG_BURST 8
static struct {
	uint64_t since;
	unsigned n, quiet;
	int warned;
} rs_lim;

static void rs_log(const struct rs_conn *p, int warn, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void rs_log(const struct rs_conn *p, int warn, const char *fmt, ...)
{
	uint64_t now = rail_now_ns();
	char msg[400], more[80] = "";
	va_list ap;

	if (!rs_lim.since || now - rs_lim.since > RS_LOG_WINDOW_NS) {
		rs_lim.since = now;
		rs_lim.n = 0;
		rs_lim.warned = 0;
	}
	if (rs_lim.n >= RS_LOG_BURST || (p && p->named && p->h.index)) {
		rs_lim.quiet++;
		return;
	}
	if (rs_lim.quiet)
		snprintf(more, sizeof(more), " (and %u such lines left out since the last one)",
			 rs_lim.quiet);
	rs_lim.quiet = 0;
	rs_lim.n++;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (warn && !rs_lim.warned) {
		rs_lim.warned = 1;
		RAIL_WARN("%s%s; further lines about strangers on the rescue listeners: at most %d "
			  "per %llu s, at INFO", msg, more, RS_LOG_BURST,
			  RS_LOG_WINDOW_NS / 1000000000ull);
	} else {
		RAIL_INFO(RAIL_LOG_NET, "%s%s", msg, more);
	}
}

#define RS_LST(p) RAIL_ADDRSTR(&rs_addr[(p)->lst])
#define RS_PEER(p) RAIL_ADDRSTR(&(p)->peer)

static void pend_close(int i)
{
	if (rs_pend[i].fd >= 0)
		close(rs_pend[i].fd);
	rs_pend[i] = rs_pend[--rs_npend];
}

/*
 * The registered comm a move hello names (rs_lock held), or NULL. Its data
 * sockets' count, which a lazy comm's open changes on NCCL's thread, is
 * checked there (tcp_move.c); an open's, against what the comm allows.
 */
static struct tcp_comm *comm_of_hello(const struct tcp_move_hello *h)
{
	for (struct tcp_comm *c = rs_comms; c; c = c->reg_next)
		if (c->conn_id == h->conn_id && c->nonce == h->nonce &&
		    c->is_send == (h->kind == TCP_MOVE_KICK) &&
		    (h->kind == TCP_MOVE_OPEN ? c->lazy && h->nsocks <= c->lazy_max : c->fo))
			return c;
	return NULL;
}

/* The hello is in: challenge the mover if it names a comm of this process. 0, or -1: drop. */
static int pend_challenge(struct rs_conn *p)
{
	uint8_t rnd[TCP_MOVE_RAND_SIZE], mac[TCP_MAC_SIZE], out[TCP_MOVE_CHALLENGE_SIZE];
	struct tcp_comm *c;
	int err;

	p->named = tcp_move_hello_decode(p->hello, &p->h) == 0;
	if (!p->named) {
		rs_log(p, 0, "rescue listener on %s: dropped the connection from %s: it sent no valid "
		       "move hello (another program, or another nccl-net-rail version?)", RS_LST(p),
		       RS_PEER(p));
		return -1;
	}
	err = rail_random_bytes(rnd, sizeof(rnd));
	if (err) {
		rs_log(p, 1, "rescue listener on %s: getrandom for a challenge failed: %s; dropped the "
		       "connection from %s", RS_LST(p), RAIL_ERRSTR(err), RS_PEER(p));
		return -1;
	}
	pthread_mutex_lock(&rs_lock);
	c = comm_of_hello(&p->h);
	if (c) {
		tcp_move_mac(c->key, TCP_ROLE_LISTENER, p->hello, rnd, mac);
		tcp_move_mac(c->key, TCP_ROLE_MOVER, p->hello, rnd, p->expect);
	}
	pthread_mutex_unlock(&rs_lock);
	if (!c) {
		rs_log(p, 0, "rescue listener on %s: connection %016llx, named by %s, is not one of this "
		       "process's (closed already, or a guess?); dropped", RS_LST(p),
		       (unsigned long long)p->h.conn_id, RS_PEER(p));
		return -1;
	}
	tcp_move_challenge_encode(rnd, mac, out);
	/* A new socket has room for it: no waiting. */
	if (send(p->fd, out, sizeof(out), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(out)) {
		rs_log(p, 0, "rescue listener on %s: sending the challenge to %s failed: %s; dropped",
		       RS_LST(p), RS_PEER(p), RAIL_ERRSTR(-errno));
		return -1;
	}
	p->proving = 1;
	p->off = 0;
	return 0;
}

/* The proof is in: if right, hand the socket to its comm (or take the request to move). */
static void pend_prove(struct rs_conn *p)
{
	uint8_t mac[TCP_MAC_SIZE];
	struct tcp_comm *c;

	if (tcp_move_proof_decode(p->proof, mac) || !rail_equal_ct(mac, p->expect, sizeof(mac))) {
		rs_log(p, 1, "rescue listener on %s: refused a %s of connection %016llx from %s: its "
		       "proof is wrong (whoever sent it does not hold the connection's key: a "
		       "forged or replayed move); nothing changed", RS_LST(p),
		       p->h.kind == TCP_MOVE_KICK ? "request to move" : "move",
		       (unsigned long long)p->h.conn_id, RS_PEER(p));
		return;
	}
	pthread_mutex_lock(&rs_lock);
	c = comm_of_hello(&p->h);
	if (c && p->h.kind == TCP_MOVE_KICK) {
		if (p->h.gen > atomic_load(&c->peer_kick))
			atomic_store(&c->peer_kick, p->h.gen);
	} else if (c) {
		deliver(c, &p->h, p->fd);
		p->fd = -1;
	}
	pthread_mutex_unlock(&rs_lock);
	if (!c)
		rs_log(p, 0, "rescue listener on %s: connection %016llx closed while the move from %s "
		       "was checked; dropped", RS_LST(p), (unsigned long long)p->h.conn_id,
		       RS_PEER(p));
}

/* Read what the connection sent; 1 when done with it (handed over, or to close), else 0. */
static int pend_step(struct rs_conn *p)
{
	int err = p->proving ? rail_sock_recv_nb(p->fd, p->proof, sizeof(p->proof), &p->off)
			     : rail_sock_recv_nb(p->fd, p->hello, sizeof(p->hello), &p->off);

	if (err == -EAGAIN)
		return 0;
	if (err) {
		rs_log(p, 0, "rescue listener on %s: the connection from %s ended before its %s: %s",
		       RS_LST(p), RS_PEER(p), p->proving ? "proof" : "move hello", RAIL_ERRSTR(err));
		return 1;
	}
	if (!p->proving)
		return pend_challenge(p) ? 1 : 0;
	pend_prove(p);
	return 1;
}

/*
 * A data socket of an open whose hello named a comm of this process (its
 * random connection id and nonce, known to the two ends only): its proof
 * comes at the sender's next progress call, which a loaded host or many
 * opens at once can delay, so it gets TCP_RESCUE_OPEN_NS and is never
 * closed to make room.
 */
static int pend_is_open(const struct rs_conn *p)
{
	return p->proving && p->h.kind == TCP_MOVE_OPEN;
}

static uint64_t pend_limit(const struct rs_conn *p)
{
	return pend_is_open(p) ? TCP_RESCUE_OPEN_NS : TCP_RESCUE_HELLO_NS;
}

/* Close the connections whose handshake is not done within their limit. */
static void pend_expire(uint64_t now)
{
	for (int i = rs_npend - 1; i >= 0; i--) {
		struct rs_conn *p = &rs_pend[i];

		if (now - p->t0 < pend_limit(p))
			continue;
		rs_log(p, 0, "rescue listener on %s: dropped the connection from %s: no %s within %llu s",
		       RS_LST(p), RS_PEER(p), p->proving ? "proof" : "move hello",
		       (unsigned long long)(pend_limit(p) / 1000000000ull));
		pend_close(i);
	}
}

/* The oldest connection that may be closed to make room, or -1. */
static int pend_oldest(void)
{
	int o = -1;

	for (int i = 0; i < rs_npend; i++)
		if (!pend_is_open(&rs_pend[i]) && (o < 0 || rs_pend[i].t0 < rs_pend[o].t0))
			o = i;
	return o;
}

/* Room for one more: at the bound, close the oldest if it waited TCP_RESCUE_MIN_AGE_NS. */
static int pend_room(uint64_t now)
{
	int o;

	if (rs_npend < TCP_RESCUE_PENDING)
		return 1;
	o = pend_oldest();
	if (o < 0 || now - rs_pend[o].t0 < TCP_RESCUE_MIN_AGE_NS)
		return 0;
	rs_log(&rs_pend[o], 0, "rescue listener on %s: dropped the connection from %s, without a "
	       "handshake for %llu ms, to make room (%d connections at once)", RS_LST(&rs_pend[o]),
	       RS_PEER(&rs_pend[o]), (unsigned long long)((now - rs_pend[o].t0) / 1000000),
	       TCP_RESCUE_PENDING);
	pend_close(o);
	return 1;
}

/* New connections on listener li, a bounded number per call. */
static void rs_accept(int li, uint64_t now)
{
	for (int k = 0; k < 64 && now >= rs_accept_at && pend_room(now); k++) {
		union rail_sockaddr peer;
		int fd = -1, err = rail_sock_accept(rs_fds[li], &fd, &peer);

		if (err == -EAGAIN)
			return;
		if (err == -EMFILE || err == -ENFILE || err == -ENOBUFS || err == -ENOMEM) {
			rs_accept_at = now + RS_FDS_WAIT_NS;
			rs_log(NULL, 1, "rescue listener on %s: accept failed: %s; the process is out of file "
			       "descriptors (raise ulimit -n); connections wait in the backlog",
			       RAIL_ADDRSTR(&rs_addr[li]), RAIL_ERRSTR(err));
			return;
		}
		if (err)
			continue; /* that connection is gone */
		rs_pend[rs_npend++] = (struct rs_conn){ .fd = fd, .lst = li, .peer = peer,
							.t0 = now };
	}
}

/* How long poll may wait (ms, -1: no bound); whether to accept now. */
static int rs_timeout_ms(uint64_t now, int *accepting)
{
	uint64_t next = UINT64_MAX;

	*accepting = now >= rs_accept_at;
	if (!*accepting)
		next = rs_accept_at;
	for (int i = 0; i < rs_npend; i++)
		next = RAIL_MIN(next, rs_pend[i].t0 + pend_limit(&rs_pend[i]));
	if (rs_npend == TCP_RESCUE_PENDING) {
		int o = pend_oldest();
		uint64_t room = o < 0 ? UINT64_MAX : rs_pend[o].t0 + TCP_RESCUE_MIN_AGE_NS;

		next = RAIL_MIN(next, room);
		if (now < room)
			*accepting = 0;
	}
	if (next == UINT64_MAX)
		return -1;
	return next <= now ? 0 : (int)RAIL_MIN((next - now + 999999) / 1000000, 60000ull);
}

static void link_state(unsigned ifindex, unsigned flags, int gone)
{
	int running = !gone && (flags & IFF_UP) && (flags & IFF_RUNNING);

	for (int i = 0; i < tcp_ndevs_now() && i < TCP_MAX_DEVS; i++) {
		if (rs_ifindex[i] != ifindex || !tcp_link_set(i, running))
			continue;
		RAIL_INFO(RAIL_LOG_NET, "link watch: %s is %s", tcp_dev_get(i)->name,
			  running ? "running again" : "down (not running)");
	}
}

static void netlink_read(void)
{
	char buf[16384];
	ssize_t n = recv(rs_nl, buf, sizeof(buf), MSG_DONTWAIT);

	for (struct nlmsghdr *m = (struct nlmsghdr *)buf; n > 0 && NLMSG_OK(m, (size_t)n);
	     m = NLMSG_NEXT(m, n)) {
		struct ifinfomsg *ifi = NLMSG_DATA(m);

		if (m->nlmsg_type == RTM_NEWLINK || m->nlmsg_type == RTM_DELLINK)
			link_state((unsigned)ifi->ifi_index, ifi->ifi_flags,
				   m->nlmsg_type == RTM_DELLINK);
	}
}

static void *rescue_main(void *arg)
{
	struct pollfd p[2 + TCP_RESCUE_MAX + TCP_RESCUE_PENDING];

	(void)arg;
	rail_thread_name("rail-tcp-rescue");
	for (;;) {
		uint64_t now = rail_now_ns();
		int accepting, timeout = rs_timeout_ms(now, &accepting), np = rs_npend, n = 0;

		p[n++] = (struct pollfd){ .fd = rs_wake[0], .events = POLLIN };
		p[n++] = (struct pollfd){ .fd = rs_nl, .events = POLLIN };
		for (int i = 0; i < rs_n; i++)
			p[n++] = (struct pollfd){ .fd = rs_fds[i], .events = accepting ? POLLIN : 0 };
		for (int j = 0; j < np; j++)
			p[n++] = (struct pollfd){ .fd = rs_pend[j].fd, .events = POLLIN };
		if (poll(p, (nfds_t)n, timeout) < 0)
			continue;
		if (p[0].revents)
			break;
		if (p[1].revents)
			netlink_read();
		/* Downwards: closing j moves the last entry, already looked at, into its place. */
		for (int j = np - 1; j >= 0; j--)
			if (p[2 + rs_n + j].revents && pend_step(&rs_pend[j]))
				pend_close(j);
		now = rail_now_ns();
		pend_expire(now);
		for (int i = 0; i < rs_n; i++)
			if (p[2 + i].revents)
				rs_accept(i, now);
	}
	while (rs_npend > 0)
		pend_close(rs_npend - 1);
	return NULL;
}

static int netlink_open(void)
{
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK, .nl_groups = RTMGRP_LINK };
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		int err = -errno;

		close(fd);
		return err;
	}
	return fd;
}

static void rescue_close_all(void)
{
	for (int i = 0; i < rs_n; i++)
		close(rs_fds[i]);
	rs_n = 0;
	free(rs_pend);
	rs_pend = NULL;
	rs_npend = 0;
	rs_accept_at = 0;
	if (rs_nl >= 0)
		close(rs_nl);
	rs_nl = -1;
	for (int i = 0; i < 2; i++)
		if (rs_wake[i] >= 0)
			close(rs_wake[i]);
	rs_wake[0] = rs_wake[1] = -1;
}

/* Holds rs_lock; watch: the link watch too (failover). */
static int rescue_open(int watch)
{
	int n = RAIL_MIN(tcp_ndevs_now(), TCP_RESCUE_MAX), err;

	for (int i = 0; i < tcp_ndevs_now() && i < TCP_MAX_DEVS; i++) {
		rs_ifindex[i] = if_nametoindex(tcp_dev_get(i)->name);
		tcp_link_reset(i);
	}
	for (int i = 0; i < n; i++) {
		union rail_sockaddr a = tcp_dev_get(i)->addr;

		rail_sockaddr_set_port(&a, 0);
		err = rail_sock_listen(&a, 1024, &rs_fds[rs_n], &rs_addr[rs_n]);
		if (err) {
			RAIL_WARN("failover: the rescue listener on %s (%s) failed: %s; connections "
				  "will not move to it", tcp_dev_get(i)->name, RAIL_ADDRSTR(&a),
				  RAIL_ERRSTR(err));
			continue;
		}
		rs_n++;
	}
	rs_nl = watch ? netlink_open() : -1;
	if (watch && rs_nl < 0) {
		err = rs_nl;
		RAIL_WARN("failover: the link watch (netlink socket) failed: %s; TCP connections "
			  "will not move to another interface", RAIL_ERRSTR(err));
		return err;
	}
	if (pipe2(rs_wake, O_CLOEXEC))
		return -errno;
	rs_pend = calloc(TCP_RESCUE_PENDING, sizeof(*rs_pend));
	if (!rs_pend)
		return -ENOMEM;
	return rs_n >= (watch ? 2 : 1) ? 0 : -ENODEV;
}

void tcp_rescue_start(void)
{
	int watch = rail_param_int(RAIL_P_FAILOVER) && tcp_ndevs_now() >= 2;
	sigset_t all, old;

	/* Lazy data sockets need the listeners alone (one interface will do). */
	if (!watch && !rail_param_int(RAIL_P_TCP_LAZY))
		return;
	pthread_mutex_lock(&rs_lock);
	if (rs_running || rescue_open(watch)) {
		if (!rs_running)
			rescue_close_all();
		pthread_mutex_unlock(&rs_lock);
		return;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&rs_thread, NULL, rescue_main, NULL) == 0)
		rs_running = 1;
	else
		rescue_close_all();
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rs_running) {
		char list[256] = "";
		size_t off = 0;

		for (int i = 0; i < rs_n && off < sizeof(list); i++)
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", i ? ", " : "",
						RAIL_ADDRSTR(&rs_addr[i]));
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s listeners on %s%s", watch ? "failover: "
			  "rescue" : "TCP: data socket", list, watch ? "; link watch on" : "");
	}
	pthread_mutex_unlock(&rs_lock);
}

void tcp_rescue_stop(void)
{
	char one = 1;

	pthread_mutex_lock(&rs_lock);
	if (rs_running) {
		if (write(rs_wake[1], &one, 1) < 0)
			(void)0;
		pthread_mutex_unlock(&rs_lock);
		pthread_join(rs_thread, NULL);
		pthread_mutex_lock(&rs_lock);
		rs_running = 0;
		rescue_close_all();
	}
	pthread_mutex_unlock(&rs_lock);
}
