/*
 * nccl-net-rail: the TCP data path. isend/irecv/test run on NCCL's progress
 * thread; they move frame headers and inline messages on the non-blocking
 * control socket (the send side's writer: tcp_ctl.c) and hand chunks of
 * large messages to the helper threads (tcp_pool.c). See tcp.h for the
 * protocol.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

static uint32_t next_pow2(uint32_t v)
{
	uint32_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

static void comm_free(struct tcp_comm *c)
{
	if (c->fo || c->lazy)
		tcp_rescue_unregister(c);
	tcp_move_free(c);
	if (c->counted)
		tcp_data_comms_add(-1);
	for (int i = 0; i < TCP_MAX_SOCKS; i++)
		if (c->open_fds[i] >= 0)
			close(c->open_fds[i]);
	if (c->ctrl_fd >= 0)
		close(c->ctrl_fd);
	if (c->ctl_old_fd >= 0)
		close(c->ctl_old_fd);
	for (int i = 0; i < c->nsocks; i++) {
		if (c->fds[i] >= 0)
			close(c->fds[i]);
		if (c->streams[i].old_fd >= 0)
			close(c->streams[i].old_fd);
	}
	for (int i = 0; i <= TCP_MAX_SOCKS; i++)
		if (c->rescue_fds[i] >= 0)
			close(c->rescue_fds[i]);
	free(c->ring);
	pthread_mutex_destroy(&c->rescue_lock);
	pthread_mutex_destroy(&c->mr_lock);
	free(c->mrs);
	memset(c->key, 0, sizeof(c->key));
	rail_comm_fini(&c->base);
	free(c);
}

/* Before the comm owns fds[]: close them, as tcp_comm_create promises. */
static void fds_close(const int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/*
 * Failover for this comm: on (NCCL_RAIL_FAILOVER), rescue listeners on both
 * sides (so each has two interfaces or more). Then sends keep their bytes
 * until the peer's kernel acknowledged them: the control stream in a copy
 * (the ring), the chunks of large messages in NCCL's buffer (the request
 * completes at the acknowledgement).
 */
static int failover_setup(struct tcp_comm *c, const struct tcp_hello *layout,
			  const union rail_sockaddr *peer, const struct tcp_rescue *rescue,
			  const uint8_t key[TCP_KEY_SIZE])
{
	struct tcp_rescue mine;

	c->ctl_old_fd = -1;
	for (int i = 0; i <= TCP_MAX_SOCKS; i++)
		c->rescue_fds[i] = -1;
	for (int i = 0; i < TCP_MAX_SOCKS; i++)
		c->open_fds[i] = -1;
	for (int i = 0; i < TCP_MAX_SOCKS; i++)
		c->streams[i].old_fd = -1;
	pthread_mutex_init(&c->rescue_lock, NULL);
	c->cur_dev = c->base.dev;
	c->peer_addr = *peer;
	c->home_peer = *peer;
	c->conn_id = layout->conn_id;
	c->nonce = layout->nonce;
	memcpy(c->key, key, TCP_KEY_SIZE);
	tcp_rescue_mine(&mine);
	if (rescue)
		c->peer_rescue = *rescue;
	/* Lazy: the data sockets come to the receiver's listener; none there, none come. */
	if (c->lazy && (c->is_send ? !rescue || !rescue->count : !mine.count)) {
		c->lazy = 0;
		c->inline_max = SIZE_MAX;	/* every message on the control socket */
	}
	if (c->lazy && !c->is_send)
		tcp_rescue_register(c);
	if (!rail_param_int(RAIL_P_FAILOVER) || mine.count < 2 || !rescue || rescue->count < 2)
		return 0;
	if (c->is_send) {
		c->ring_size = 1;
		size_t most = RAIL_MAX(c->inline_max, c->direct_max);	/* control-socket bytes */

		while (c->ring_size < RAIL_MAX((size_t)256 << 10, 2 * (most + TCP_FRAME_SIZE)))
			c->ring_size <<= 1;
		c->ring = malloc(c->ring_size);
		if (!c->ring)
			return -ENOMEM;
		c->ack = 1;
	}
	c->fo = 1;
	c->link_gen = tcp_link_gen();
	if (!c->lazy || c->is_send)
		tcp_rescue_register(c);
	return 0;
}

int tcp_comm_create(int dev, int is_send, const int *fds, const struct tcp_hello *layout,
		    const union rail_sockaddr *peer, const struct tcp_rescue *rescue,
		    const uint8_t key[TCP_KEY_SIZE], struct tcp_comm **out)
{
	long sndbuf = (long)rail_param_int(RAIL_P_SOCKET_SNDBUF);
	long rcvbuf = (long)rail_param_int(RAIL_P_SOCKET_RCVBUF);
	struct tcp_comm *c = calloc(1, sizeof(*c));
	int lazy = (layout->flags & TCP_HELLO_LAZY) != 0, nfds = lazy ? 1 : layout->nsocks + 1;
	uint32_t per_sock;
	int err, liveness;

	err = c ? rail_comm_init(&c->base, is_send ? RAIL_COMM_SEND : RAIL_COMM_RECV, dev,
				 tcp_comm_ops()) : -ENOMEM;
	if (err) {
		RAIL_WARN("setting up the %s comm to %s on %s failed: %s", is_send ? "send"
			  : "receive", RAIL_ADDRSTR(peer), tcp_dev_get(dev)->name, RAIL_ERRSTR(err));
		free(c);
		fds_close(fds, nfds);
		return err;
	}
	pthread_mutex_init(&c->mr_lock, NULL);
	c->is_send = is_send;
	c->ctrl_fd = fds[0];
	c->nsocks = nfds - 1;
	c->nthreads = lazy ? 0 : layout->nthreads;
	c->lazy = lazy;
	c->lazy_max = layout->nsocks;
	c->lazy_threads = layout->nthreads;
	c->inline_max = layout->inline_max;
	c->help = (int)rail_param_int(RAIL_P_TCP_HELP);
	c->direct_max = c->help ? (size_t)rail_param_int(RAIL_P_TCP_DIRECT) : 0;
	for (int i = 0; i < c->nsocks; i++)
		c->fds[i] = fds[i + 1];
	err = failover_setup(c, layout, peer, rescue, key);
	if (err) {
		RAIL_WARN("setting up the %s comm to %s on %s failed: %s", is_send ? "send"
			  : "receive", RAIL_ADDRSTR(peer), tcp_dev_get(dev)->name, RAIL_ERRSTR(err));
		comm_free(c);
		return err;
	}
	c->min_chunk = layout->min_chunk;
	rail_sockaddr_str(peer, c->peer, sizeof(c->peer));
	c->stall_ns = (uint64_t)rail_param_int(RAIL_P_STALL_TIMEOUT) * 1000000000ull;
	liveness = (int)rail_param_int(RAIL_P_PEER_TIMEOUT);
	rail_sock_set_liveness(c->ctrl_fd, liveness / 2, liveness);
	for (int i = 0; i < c->nsocks; i++) {
		rail_sock_set_nonblocking(c->fds[i], 1);
		rail_sock_set_bufs(c->fds[i], sndbuf, rcvbuf);
		rail_sock_set_liveness(c->fds[i], liveness / 2, liveness);
	}
	/* Worst case: every request of the pool has a chunk (x8 entries on a
	 * grouped receive) on the socket. */
	per_sock = c->base.reqs.capacity * (is_send ? 1 : RAIL_MAX_RECVS);
	c->stream_ring = next_pow2(per_sock);
	if (c->nsocks) {
		c->counted = 1;
		tcp_data_comms_add(1);
	}
	err = tcp_pool_attach(c, c->stream_ring);
	if (err) {
		RAIL_WARN("%s comm on %s, peer %s: handing its %d data sockets to the TCP helper "
			  "threads failed: %s (no helper thread runs and pthread_create failed, or "
			  "epoll_ctl or memory); check the process and thread limits (ulimit -u, "
			  "RLIMIT_NPROC, the pids cgroup's pids.max)", is_send ? "send" : "receive",
			  tcp_comm_dev_name(c), c->peer, c->nsocks, RAIL_ERRSTR(err));
		comm_free(c);
		/* Not -EAGAIN: to the connect and accept state machines that means "call again". */
		return err == -EAGAIN ? -ENOMEM : err;
	}
	*out = c;
	return 0;
}

/*
 * Give the chunks of one large message (buffer e of r) to the helper
 * threads; with the profiler, each chunk is one socket operation event.
 * A message of one chunk up to NCCL_RAIL_TCP_DIRECT, while no chunk of any
 * comm of the process is queued, is moved by this (NCCL's progress) thread
 * instead (on the send side only one that waited for the lazy open, or met
 * a queue that emptied since isend: an idle send went inline): waking a
 * helper on each side costs more than the copy, and with nothing else in
 * flight there is nothing a helper would move in parallel.
 * (With several channels or both directions busy, as in an all-reduce, the
 * helpers move them: the progress thread's own copies would delay the other
 * comms it serves. The bound is small for the same reason: at 512 KiB,
 * 2-rank all-reduces of 1-8 MiB ran up to 2.3x slower on the GPU machine.)
 */
static void dispatch(struct tcp_comm *c, struct tcp_req *r, int e, uint64_t seq, char *buf,
		     size_t size)
{
	struct tcp_plan p;
	int direct;

	tcp_plan_message(size, seq, c->nsocks, c->min_chunk, &p);
	direct = p.nchunks == 1 && size <= c->direct_max && tcp_pool_idle();
	atomic_fetch_add_explicit(&r->pending, p.nchunks, memory_order_relaxed);
	for (int i = 0; i < p.nchunks; i++) {
		size_t off = (size_t)i * p.chunk, len = RAIL_MIN(p.chunk, size - off);
		int sock = (p.first + i) % c->nsocks;
		void *ev = NULL;

		if (rail_unlikely(r->base.prof != NULL))
			ev = rail_prof_sock(r->base.prof, e, 0, c->fds[sock],
					    c->is_send ? RAIL_PROF_SOCK_SEND : RAIL_PROF_SOCK_RECV,
					    len);
		tcp_pool_push(c, sock, buf + off, len, r, ev, direct);
	}
}

/* An inline message on the control socket: one event, ended when the request completes. */
static void inline_event(struct tcp_comm *c, struct tcp_req *r, int e, size_t size)
{
	if (rail_unlikely(r->base.prof != NULL))
		rail_prof_sock(r->base.prof, e, 1, c->ctrl_fd,
			       c->is_send ? RAIL_PROF_SOCK_SEND : RAIL_PROF_SOCK_RECV, size);
}

/*
 * Send side: read a refusal from the receiver, if one came, and fail the
 * comm with its reason (both sizes, or both tags). Called now and then
 * from isend and while a send is in flight; a syscall that finds nothing.
 */
static int poll_refusal(struct tcp_comm *c)
{
	struct tcp_refusal f;
	int err;

	if (c->ctrl_quiet)
		return 0;
	err = rail_sock_recv_nb(c->ctrl_fd, c->rx_refusal, TCP_REFUSAL_SIZE, &c->rx_refusal_off);
	if (err == -EAGAIN)
		return 0;
	c->ctrl_quiet = 1;
	if (err)
		return 0; /* end of file or an error: the send path reports it */
	if (tcp_refusal_decode(c->rx_refusal, &f))
		return tcp_comm_fail(c, -EPROTO, "the receiver sent bytes that are not a refusal on "
				     "the control socket; use the same plugin build on both nodes");
	if (f.reason == TCP_REFUSE_SIZE)
		return tcp_comm_fail(c, -EMSGSIZE, "the receiver refused message %llu of %llu bytes "
				     "(tag %d): its posted receive has only %llu bytes; a send larger "
				     "than its receive is an error (both sides must agree on sizes)",
				     (unsigned long long)f.seq, (unsigned long long)f.size, f.tag,
				     (unsigned long long)f.posted);
	return tcp_comm_fail(c, -EINVAL, "the receiver refused message %llu of %llu bytes (tag %d): "
			     "its posted receive expects tag %d; the two sides' calls are out of step",
			     (unsigned long long)f.seq, (unsigned long long)f.size, f.tag, f.want_tag);
}

/*
 * Send, lazy: once the data sockets are open, dispatch the large messages
 * that waited for them, in order. Their frames went out at once (so the
 * receiver sees the message begun, and bounds a stall); a held request
 * counts one pending chunk until then, so it does not complete.
 */
static void release_held(struct tcp_comm *c)
{
	if (!c->nsocks)
		return;
	while (c->held_head) {
		struct tcp_req *r = c->held_head;

		c->held_head = r->held_next;
		dispatch(c, r, 0, r->seq, r->data[0], r->size[0]);
		r->held = 0;
		c->held--;
		atomic_fetch_sub_explicit(&r->pending, 1, memory_order_release);
	}
	c->held_tail = NULL;
}

/* Messages above the inline limit sent inline (tcp_isend), for tests. */
static _Atomic uint64_t idle_inline;

uint64_t tcp_data_idle_inline(void)
{
	return atomic_load_explicit(&idle_inline, memory_order_relaxed);
}

/*
 * Send: a message goes on the control socket, after its frame, up to the
 * inline limit; and up to NCCL_RAIL_TCP_DIRECT (with the frame's INLINE
 * flag) while no chunk of any comm of the process is queued: with nothing
 * else in flight, one socket costs less than a frame on one and the bytes
 * on another (on 2 CPUs, a 32 KiB message's half round trip went from 20.5
 * to 10.7 us: docs/PERFORMANCE.md, R4), and the data sockets need not be
 * open. Busy, it is cut into chunks for the data sockets as any larger one.
 */
static int send_inline(struct tcp_comm *c, size_t size, struct tcp_frame *f)
{
	if (size <= c->inline_max)
		return 1;
	if (size > c->direct_max || !tcp_pool_idle())
		return 0;
	f->flags = TCP_FRAME_INLINE;
	atomic_fetch_add_explicit(&idle_inline, 1, memory_order_relaxed);
	return 1;
}

int tcp_isend(struct rail_comm *send_comm, struct rail_req *req, void *data, size_t size,
	      int tag, void *mhandle)
{
	struct tcp_comm *c = (struct tcp_comm *)send_comm;
	struct tcp_req *r = (struct tcp_req *)req;
	struct tcp_frame f = { .seq = c->seq, .tag = tag, .size = size };
	int err;

	(void)mhandle;
	/* A refusal of an earlier message (which may have completed here) fails this one. */
	if (rail_unlikely((c->seq & 15) == 0))
		poll_refusal(c);
	if (rail_unlikely(tcp_move_due(c)))
		tcp_move_send(c);
	/* The open may have completed just now: the messages that waited for it go first. */
	if (rail_unlikely(c->held))
		release_held(c);
	err = atomic_load(&c->error);
	if (err)
		return err;
	r->data[0] = data;
	r->size[0] = size;
	r->got[0] = size;
	r->tag[0] = tag;
	r->inl = send_inline(c, size, &f);
	tcp_frame_encode(&f, r->frame);
	r->seq = c->seq;
	r->held = 0;
	if (r->inl)
		inline_event(c, r, 0, size);
	else if (c->nsocks && !c->held)
		dispatch(c, r, 0, c->seq, data, size);
	else
		r->held = 1;	/* after the data sockets are open and the earlier held ones */
	if (rail_unlikely(r->held)) {
		atomic_fetch_add_explicit(&r->pending, 1, memory_order_relaxed);
		r->held_next = NULL;
		if (c->held_tail)
			c->held_tail->held_next = r;
		else
			c->held_head = r;
		c->held_tail = r;
		c->held++;
	}
	c->seq++;
	tcp_ctl_push(c, r);
	if (rail_unlikely(r->held) && !c->mv)
		tcp_move_open(c);
	if (rail_unlikely(c->held))
		release_held(c);
	return tcp_ctl_flush(c);
}

static void entry_done(struct tcp_comm *c, struct tcp_req *r)
{
	if (++r->nmatched == r->base.n) {
		r->ctrl_done = 1;
		tcp_ctl_pop(c);
	}
}

/*
 * Receive side: read [*off, len) of the control stream: after a move, first
 * the bytes the old socket still held, then the new socket.
 */
static int ctl_recv(struct tcp_comm *c, void *buf, size_t len, size_t *off)
{
	size_t before = *off;
	int err;

	if (rail_unlikely(c->ctl_old_left > 0)) {
		size_t lim = (size_t)RAIL_MIN((uint64_t)len, *off + c->ctl_old_left);

		err = rail_sock_recv_nb(c->ctl_old_fd, buf, lim, off);
		c->ctl_old_left -= *off - before;
		c->ctl_rx += *off - before;
		if (!c->ctl_old_left) {
			close(c->ctl_old_fd);
			c->ctl_old_fd = -1;
		}
		if (err || *off == len)
			return err;
		before = *off;
	}
	err = rail_sock_recv_nb(c->ctrl_fd, buf, len, off);
	c->ctl_rx += *off - before;
	return err;
}

/* Read the next frame header; 1 when one is available. */
static int read_frame(struct tcp_comm *c)
{
	int err;

	size_t before = c->rx_frame_off;

	if (c->rx_have_frame)
		return 1;
	err = ctl_recv(c, c->rx_frame, TCP_FRAME_SIZE, &c->rx_frame_off);
	atomic_fetch_add_explicit(&c->rx_moved, c->rx_frame_off - before, memory_order_relaxed);
	if (err == -EAGAIN || (err && tcp_path_failed(c, err)))
		return 0;
	if (err)
		return tcp_comm_fail(c, err, "the control socket failed while waiting for message "
				     "%llu (%s); the peer process probably exited or crashed",
				     (unsigned long long)c->seq, RAIL_ERRSTR(err));
	if (tcp_frame_decode(c->rx_frame, &c->rx) || c->rx.seq != c->seq)
		return tcp_comm_fail(c, -EPROTO, "malformed frame header for message %llu "
				     "(stream out of sync); use the same plugin build on both "
				     "nodes", (unsigned long long)c->seq);
	c->rx_have_frame = 1;
	c->rx_frame_off = 0;
	return 1;
}

/* Tell the sender why the current message is refused (once; best effort, the comm fails). */
static void refuse(struct tcp_comm *c, int reason, int want_tag, uint64_t posted)
{
	struct tcp_refusal f = { .reason = reason, .tag = c->rx.tag, .want_tag = want_tag,
				 .seq = c->seq, .size = c->rx.size, .posted = posted };
	uint8_t b[TCP_REFUSAL_SIZE];
	size_t off = 0;

	if (c->refused)
		return;
	c->refused = 1;
	tcp_refusal_encode(&f, b);
	tcp_ctl_write(c->ctrl_fd, b, sizeof(b), NULL, 0, &off);
}

/* The entry of the head receive that the current frame fills, or an error. */
static int match_entry(struct tcp_comm *c, struct tcp_req *r)
{
	int e = -1;

	if (r->base.n == 1) {
		/* A single receive takes only its tag, as a group's entries do. */
		if (r->tag[0] != c->rx.tag)
			refuse(c, TCP_REFUSE_TAG, r->tag[0], 0);
		if (r->tag[0] != c->rx.tag)
			return tcp_comm_fail(c, -EINVAL, "message %llu has tag %d, the posted receive "
					     "expects tag %d; the two sides' calls are out of step",
					     (unsigned long long)c->seq, c->rx.tag, r->tag[0]);
		e = 0;
	} else {
		for (int i = 0; i < r->base.n && e < 0; i++)
			if (!r->matched[i] && r->tag[i] == c->rx.tag)
				e = i;
	}
	if (e < 0)
		refuse(c, TCP_REFUSE_TAG, r->tag[0], 0);
	if (e < 0)
		return tcp_comm_fail(c, -EINVAL, "message %llu has tag %d, which no pending entry "
				     "of the posted grouped receive (%d entries) expects",
				     (unsigned long long)c->seq, c->rx.tag, r->base.n);
	if (c->rx.size > r->size[e])
		refuse(c, TCP_REFUSE_SIZE, r->tag[e], r->size[e]);
	if (c->rx.size > r->size[e])
		return tcp_comm_fail(c, -EMSGSIZE, "message %llu of %llu bytes (tag %d) is larger "
				     "than the posted receive of %zu bytes; the sender is told",
				     (unsigned long long)c->seq, (unsigned long long)c->rx.size,
				     c->rx.tag, r->size[e]);
	return e;
}

static int progress_recv(struct tcp_comm *c)
{
	for (;;) {
		struct tcp_req *r = c->rx_req ? c->rx_req : c->fifo_head;
		int e, err, inl;

		if (c->rx_req) {
			size_t before = c->rx_off;

			err = ctl_recv(c, (char *)r->data[c->rx_entry], r->got[c->rx_entry],
				       &c->rx_off);
			atomic_fetch_add_explicit(&c->rx_moved, c->rx_off - before,
						  memory_order_relaxed);
			atomic_fetch_add_explicit(&r->moved, c->rx_off - before,
						  memory_order_relaxed);
			if (err == -EAGAIN || (err && tcp_path_failed(c, err)))
				return 0;
			if (err)
				return tcp_comm_fail(c, err, "the control socket failed while "
						     "receiving a %zu-byte message (%s); the peer "
						     "process probably died", r->got[c->rx_entry],
						     RAIL_ERRSTR(err));
			c->rx_req = NULL;
			entry_done(c, r);
			continue;
		}
		if (!r)
			return 0;
		err = read_frame(c);
		if (err <= 0)
			return err;
		inl = c->rx.size <= c->inline_max || (c->rx.flags & TCP_FRAME_INLINE);
		/* Lazy: a large message needs the data sockets the sender opened for it. */
		if (rail_unlikely(!inl && !c->nsocks) &&
		    !tcp_move_take_open(c))
			return atomic_load(&c->error);
		e = match_entry(c, r);
		if (e < 0)
			return e;
		if (r->first_seq == UINT64_MAX)
			r->first_seq = c->seq;
		r->matched[e] = 1;
		r->got[e] = c->rx.size;
		c->rx_have_frame = 0;
		if (!inl) {
			dispatch(c, r, e, c->seq, r->data[e], c->rx.size);
		} else {
			inline_event(c, r, e, c->rx.size);
			if (c->rx.size > 0) {
				c->rx_req = r;
				c->rx_entry = e;
				c->rx_off = 0;
			}
		}
		c->seq++;
		if (!c->rx_req)
			entry_done(c, r);
	}
}

int tcp_irecv(struct rail_comm *recv_comm, struct rail_req *req, int n, void **data,
	      const size_t *sizes, const int *tags, void **mhandles)
{
	struct tcp_comm *c = (struct tcp_comm *)recv_comm;
	struct tcp_req *r = (struct tcp_req *)req;
	int err = atomic_load(&c->error);

	(void)mhandles;
	if (!err && rail_unlikely(tcp_move_due(c)))
		err = tcp_move_recv(c);
	if (err)
		return err;
	for (int i = 0; i < n; i++) {
		r->data[i] = data[i];
		r->size[i] = sizes[i];
		r->tag[i] = tags ? tags[i] : 0;
	}
	r->first_seq = UINT64_MAX;
	tcp_ctl_push(c, r);
	return progress_recv(c);
}

/*
 * Receive side, NCCL_RAIL_STALL_TIMEOUT: a message already started (part of
 * its header, its inline bytes or chunks still to come) while no byte
 * arrived on the comm for the bound fails the comm. The peer's host still
 * answers (a dead host fails the sockets after NCCL_RAIL_PEER_TIMEOUT), so
 * its process stopped. Between messages, waiting is normal: no bound.
 */
static int check_stall(struct tcp_comm *c, struct tcp_req *r)
{
	uint64_t moved, now, msg;
	size_t expect = 0, got;

	if (!c->stall_ns || (++c->polls & 63))
		return 0;
	/* A frame read and held (its data sockets not open yet) is a message begun too. */
	if (!c->rx_frame_off && !c->rx_have_frame && !c->rx_req &&
	    !atomic_load_explicit(&r->pending, memory_order_relaxed))
		return 0;
	moved = atomic_load_explicit(&c->rx_moved, memory_order_relaxed);
	now = rail_now_ns();
	if (moved != c->stall_seen || !c->stall_since) {
		c->stall_seen = moved;
		c->stall_since = now;
		return 0;
	}
	if (now - c->stall_since < c->stall_ns)
		return 0;
	if (c->rx_have_frame) {
		msg = c->seq;
		expect = c->rx.size;
		got = 0;
	} else if (c->rx_frame_off && !c->rx_req && !atomic_load(&r->pending)) {
		msg = c->seq;
		expect = TCP_FRAME_SIZE;
		got = c->rx_frame_off;
	} else {
		msg = r->first_seq == UINT64_MAX ? c->seq : r->first_seq;
		for (int i = 0; i < r->base.n; i++)
			expect += r->matched[i] ? r->got[i] : 0;
		got = atomic_load(&r->moved);
	}
	return tcp_comm_fail(c, -ETIMEDOUT, "message %llu: %zu of %zu bytes received, then nothing "
			     "for %llu s while the peer's host still answers; the peer process "
			     "is probably stopped (SIGSTOP, a debugger) or hung. "
			     "NCCL_RAIL_STALL_TIMEOUT=%llu bounds a message already started "
			     "(0: wait forever)", (unsigned long long)msg, got, expect,
			     (unsigned long long)((now - c->stall_since) / 1000000000ull),
			     (unsigned long long)(c->stall_ns / 1000000000ull));
}

int tcp_test(struct rail_req *req, int *done, size_t *sizes)
{
	struct tcp_req *r = (struct tcp_req *)req;
	struct tcp_comm *c = (struct tcp_comm *)req->comm;
	int err = 0;

	if (rail_unlikely(tcp_move_due(c))) {
		if (c->is_send)
			tcp_move_send(c);
		else
			tcp_move_recv(c);
	}
	if (rail_unlikely(c->held)) {
		if (!c->mv)
			tcp_move_open(c);	/* again, after a move that dropped it */
		release_held(c);
	}
	/* Requests match in posting order, so only the oldest one needs to
	 * poll the control socket (saving a syscall per test); a later one
	 * still polls now and then in case the caller tests out of order. */
	if (!r->ctrl_done && (r == c->fifo_head || r == c->rx_req || (++c->test_skips & 7) == 0))
		err = c->is_send ? tcp_ctl_flush(c) : progress_recv(c);
	else if (rail_unlikely(c->ring && c->ring_sent != c->ring_staged))
		err = tcp_ctl_flush(c); /* after a move: control bytes of completed sends, again */
	if (err)
		return err;
	if (r->ctrl_done && atomic_load_explicit(&r->pending, memory_order_acquire) == 0) {
		if (atomic_load(&r->failed))
			return atomic_load(&c->error);
		for (int i = 0; i < r->base.n; i++)
			sizes[i] = r->got[i];
		*done = 1;
		if (rail_unlikely(c->recover_t0))
			tcp_move_first_done(c);
		return 0;
	}
	/* Chunks still queued: move some here rather than wait for a helper. */
	if (c->help && atomic_load_explicit(&r->pending, memory_order_relaxed))
		tcp_pool_help(c);
	/* Chunks written, waiting for the peer's kernel to acknowledge them. */
	if (c->ack && r->ctrl_done && atomic_load_explicit(&r->pending, memory_order_relaxed))
		tcp_pool_ack(c);
	/* A large send waiting on its helpers: has the receiver refused it? */
	if (c->is_send && (++c->polls & 7) == 0)
		poll_refusal(c);
	else if (!c->is_send)
		check_stall(c, r);
	err = atomic_load(&c->error);
	if (err)
		return err;
	*done = 0;
	return 0;
}

int tcp_close(struct rail_comm *comm)
{
	struct tcp_comm *c = (struct tcp_comm *)comm;

	atomic_store(&c->closing, 1);
	tcp_pool_detach(c);
	comm_free(c);
	return 0;
}
