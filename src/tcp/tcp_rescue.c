/*
 * nccl-net-rail: what a TCP comm needs to move to another interface
 * (docs/FAILOVER.md section 6), kept per process:
 *
 * - one "rescue" listener per interface, so a sender can reach its
 *   receiver again after NCCL closed the listen comm; its addresses travel
 *   in the handshake (tcp_conn.c);
 * - a netlink link watch: an interface that stops running (RTM_NEWLINK
 *   without IFF_RUNNING) bumps tcp_link_gen(), which every comm compares
 *   with its own at each call (one load);
 * - the registry of comms that can move, by connection id, so the rescue
 *   thread hands the sockets of a move to its receive comm and a receiver's
 *   request to move to its send comm.
 *
 * One thread serves all of it, in poll(). Started when failover is on
 * (NCCL_RAIL_FAILOVER) and the transport has two interfaces or more;
 * otherwise nothing here runs and comms behave as before.
 */
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

static pthread_mutex_t rs_lock = PTHREAD_MUTEX_INITIALIZER;
static int rs_running;
static pthread_t rs_thread;
static int rs_n;
static int rs_fds[TCP_RESCUE_MAX];
static union rail_sockaddr rs_addr[TCP_RESCUE_MAX];
static int rs_nl = -1;
static int rs_wake[2] = { -1, -1 };
static unsigned rs_ifindex[TCP_MAX_DEVS];
static _Atomic int rs_down[TCP_MAX_DEVS];
static _Atomic uint64_t rs_up_since[TCP_MAX_DEVS];	/* when it last started running */
static _Atomic uint32_t rs_gen;
static struct tcp_comm *rs_comms;	/* under rs_lock */

uint32_t tcp_link_gen(void)
{
	return atomic_load_explicit(&rs_gen, memory_order_relaxed);
}

int tcp_link_down(int dev)
{
	return dev >= 0 && dev < TCP_MAX_DEVS && atomic_load(&rs_down[dev]);
}

uint64_t tcp_link_up_since(int dev)
{
	if (dev < 0 || dev >= TCP_MAX_DEVS || atomic_load(&rs_down[dev]))
		return 0;
	return atomic_load(&rs_up_since[dev]);
}

int tcp_dev_of_addr(const union rail_sockaddr *a)
{
	for (int i = 0; i < tcp_ndevs_now(); i++) {
		const struct tcp_dev *d = tcp_dev_get(i);

		if (d->addr.sa.sa_family != a->sa.sa_family)
			continue;
		if (a->sa.sa_family == AF_INET ? d->addr.sin.sin_addr.s_addr == a->sin.sin_addr.s_addr
		    : !memcmp(&d->addr.sin6.sin6_addr, &a->sin6.sin6_addr, 16))
			return i;
	}
	return -1;
}

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

/* Hand one socket of a move to its receive comm (rs_lock held). */
static void deliver(struct tcp_comm *c, const struct tcp_move_hello *h, int fd)
{
	pthread_mutex_lock(&c->rescue_lock);
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
	if (h->gen == c->rescue_gen && c->rescue_fds[h->index] < 0) {
		c->rescue_fds[h->index] = fd;
		fd = -1;
		if (++c->rescue_n == c->nsocks + 1)
			atomic_store(&c->rescue_ready, 1);
	}
	pthread_mutex_unlock(&c->rescue_lock);
	if (fd >= 0)
		close(fd);
}

/* A connection on a rescue listener: read its hello (bounded) and hand it over. */
static void rescue_accept(int lfd)
{
	struct timeval tv = { .tv_sec = 2 };
	uint8_t buf[TCP_MOVE_HELLO_SIZE];
	union rail_sockaddr peer;
	struct tcp_move_hello h;
	struct tcp_comm *c;
	int fd = -1;

	if (rail_sock_accept(lfd, &fd, &peer))
		return;
	rail_sock_set_nonblocking(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (rail_sock_recv_all(fd, buf, sizeof(buf)) || tcp_move_hello_decode(buf, &h)) {
		RAIL_INFO(RAIL_LOG_NET, "rescue listener: dropping a connection from %s that sent "
			  "no valid move hello", RAIL_ADDRSTR(&peer));
		close(fd);
		return;
	}
	rail_sock_set_nonblocking(fd, 1);
	pthread_mutex_lock(&rs_lock);
	for (c = rs_comms; c; c = c->reg_next)
		if (c->conn_id == h.conn_id && c->nonce == h.nonce &&
		    c->is_send == (h.kind == TCP_MOVE_KICK) && h.nsocks == c->nsocks)
			break;
	if (c && h.kind == TCP_MOVE_KICK) {
		if (h.gen > atomic_load(&c->peer_kick))
			atomic_store(&c->peer_kick, h.gen);
		close(fd);
	} else if (c) {
		deliver(c, &h, fd);
	} else {
		close(fd);
	}
	pthread_mutex_unlock(&rs_lock);
	if (!c)
		RAIL_INFO(RAIL_LOG_NET, "rescue listener: connection %016llx from %s is not one "
			  "of this process's (closed already?); dropped",
			  (unsigned long long)h.conn_id, RAIL_ADDRSTR(&peer));
}

static void link_state(unsigned ifindex, unsigned flags, int gone)
{
	int running = !gone && (flags & IFF_UP) && (flags & IFF_RUNNING);

	for (int i = 0; i < tcp_ndevs_now() && i < TCP_MAX_DEVS; i++) {
		if (rs_ifindex[i] != ifindex || atomic_load(&rs_down[i]) == !running)
			continue;
		if (running)
			atomic_store(&rs_up_since[i], rail_now_ns());
		atomic_store(&rs_down[i], !running);
		atomic_fetch_add(&rs_gen, 1);
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
	(void)arg;
	for (;;) {
		struct pollfd p[TCP_RESCUE_MAX + 2];
		int n = 0;

		p[n++] = (struct pollfd){ .fd = rs_wake[0], .events = POLLIN };
		p[n++] = (struct pollfd){ .fd = rs_nl, .events = POLLIN };
		for (int i = 0; i < rs_n; i++)
			p[n++] = (struct pollfd){ .fd = rs_fds[i], .events = POLLIN };
		if (poll(p, (nfds_t)n, -1) < 0)
			continue;
		if (p[0].revents)
			return NULL;
		if (p[1].revents)
			netlink_read();
		for (int i = 2; i < n; i++)
			if (p[i].revents)
				rescue_accept(p[i].fd);
	}
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
	if (rs_nl >= 0)
		close(rs_nl);
	rs_nl = -1;
	for (int i = 0; i < 2; i++)
		if (rs_wake[i] >= 0)
			close(rs_wake[i]);
	rs_wake[0] = rs_wake[1] = -1;
}

/* Holds rs_lock. */
static int rescue_open(void)
{
	int n = RAIL_MIN(tcp_ndevs_now(), TCP_RESCUE_MAX), err;

	for (int i = 0; i < tcp_ndevs_now() && i < TCP_MAX_DEVS; i++) {
		rs_ifindex[i] = if_nametoindex(tcp_dev_get(i)->name);
		atomic_store(&rs_down[i], 0);
		atomic_store(&rs_up_since[i], rail_now_ns());
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
	rs_nl = netlink_open();
	if (rs_nl < 0) {
		err = rs_nl;
		RAIL_WARN("failover: the link watch (netlink socket) failed: %s; TCP connections "
			  "will not move to another interface", RAIL_ERRSTR(err));
		return err;
	}
	if (pipe2(rs_wake, O_CLOEXEC))
		return -errno;
	return rs_n >= 2 ? 0 : -ENODEV;
}

void tcp_rescue_start(void)
{
	sigset_t all, old;

	if (!rail_param_int(RAIL_P_FAILOVER) || tcp_ndevs_now() < 2)
		return;
	pthread_mutex_lock(&rs_lock);
	if (rs_running || rescue_open()) {
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
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "failover: rescue listeners on %s; link "
			  "watch on", list);
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
