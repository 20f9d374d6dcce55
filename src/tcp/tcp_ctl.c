/*
 * nccl-net-rail: the TCP control socket's side of a comm's requests: their
 * FIFO in posting order (both sides), and the send side's writer. Each
 * send's frame header and inline bytes go out in that order without
 * blocking; with failover they go through the ring, which keeps them until
 * the peer's kernel acknowledged them, so that a move (tcp_move.c) can
 * rewind the stream and write them again. Below the data path and the move,
 * which both flush it.
 */
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <linux/sockios.h>

#include "rail.h"
#include "tcp/tcp.h"

void tcp_ctl_push(struct tcp_comm *c, struct tcp_req *r)
{
	if (c->ring && !c->ring_next)
		c->ring_next = r;
	r->next = NULL;
	if (c->fifo_tail)
		c->fifo_tail->next = r;
	else
		c->fifo_head = r;
	c->fifo_tail = r;
}

void tcp_ctl_pop(struct tcp_comm *c)
{
	c->fifo_head = c->fifo_head->next;
	if (!c->fifo_head)
		c->fifo_tail = NULL;
}

/* Send bytes [*off, hlen + plen) of header + payload without blocking. */
int tcp_ctl_write(int fd, const uint8_t *hdr, size_t hlen, const char *payload, size_t plen,
		  size_t *off)
{
	while (*off < hlen + plen) {
		struct iovec iov[2];
		struct msghdr msg = { .msg_iov = iov };
		ssize_t n;

		if (*off < hlen) {
			iov[0] = (struct iovec){ (void *)(hdr + *off), hlen - *off };
			iov[1] = (struct iovec){ (void *)payload, plen };
			msg.msg_iovlen = plen ? 2 : 1;
		} else {
			iov[0] = (struct iovec){ (void *)(payload + *off - hlen), hlen + plen - *off };
			msg.msg_iovlen = 1;
		}
		n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		*off += (size_t)n;
	}
	return 0;
}

/* The control stream's bytes the peer's kernel acknowledged leave the ring. */
static void ring_ack(struct tcp_comm *c)
{
	int outq = 0;

	/* Moving: the receiver takes its positions; what it acknowledges later is re-sent. */
	if (atomic_load_explicit(&c->moving, memory_order_relaxed))
		return;
	if (ioctl(c->ctrl_fd, SIOCOUTQ, &outq) == 0 && outq >= 0 &&
	    (uint64_t)outq <= c->ring_sent - c->ring_acked)
		c->ring_acked = c->ring_sent - (uint64_t)outq;
}

static void ring_put(struct tcp_comm *c, const void *p, size_t len)
{
	size_t at = (size_t)(c->ring_staged & (c->ring_size - 1));
	size_t first = RAIL_MIN(len, c->ring_size - at);

	memcpy(c->ring + at, p, first);
	memcpy(c->ring, (const char *)p + first, len - first);
	c->ring_staged += len;
}

/* Write [ring_sent, ring_staged) of the ring to the control socket. */
static int ring_flush(struct tcp_comm *c)
{
	while (c->ring_sent < c->ring_staged) {
		size_t at = (size_t)(c->ring_sent & (c->ring_size - 1));
		size_t left = (size_t)(c->ring_staged - c->ring_sent);
		struct iovec iov[2] = { { c->ring + at, RAIL_MIN(left, c->ring_size - at) },
					{ c->ring, 0 } };
		struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 1 };
		ssize_t n;

		if (iov[0].iov_len < left) {
			iov[1].iov_len = left - iov[0].iov_len;
			msg.msg_iovlen = 2;
		}
		n = sendmsg(c->ctrl_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		c->ring_sent += (uint64_t)n;
	}
	return 0;
}

/*
 * tcp_ctl_flush with failover: each request's frame and inline bytes are
 * copied into the ring (when they fit), the ring goes to the socket, and a
 * request is done with the control socket once its bytes are in the kernel,
 * as without the ring; the ring keeps them until the peer's kernel has them.
 */
static int progress_send_ring(struct tcp_comm *c)
{
	struct tcp_req *r;
	int err = 0;

	while ((r = c->ring_next)) {
		size_t inl = r->inl ? r->size[0] : 0;
		uint64_t need = TCP_FRAME_SIZE + inl;

		if (c->ring_staged + need - c->ring_acked > c->ring_size)
			ring_ack(c);
		if (c->ring_staged + need - c->ring_acked > c->ring_size)
			break;
		ring_put(c, r->frame, TCP_FRAME_SIZE);
		ring_put(c, r->data[0], inl);
		r->ctl_end = c->ring_staged;
		c->ring_next = r->next;
	}
	if (!atomic_load_explicit(&c->moving, memory_order_relaxed))
		err = ring_flush(c);
	while ((r = c->fifo_head) && r != c->ring_next && r->ctl_end <= c->ring_sent) {
		r->ctrl_done = 1;
		tcp_ctl_pop(c);
	}
	if (!err || err == -EAGAIN || tcp_path_failed(c, err))
		return 0;
	return tcp_comm_fail(c, err, "sending on the control socket failed: %s; the peer "
			     "process probably died", RAIL_ERRSTR(err));
}

int tcp_ctl_flush(struct tcp_comm *c)
{
	struct tcp_req *r;

	if (c->ring)
		return progress_send_ring(c);

	while ((r = c->fifo_head)) {
		size_t inl = r->inl ? r->size[0] : 0;
		int err = tcp_ctl_write(c->ctrl_fd, r->frame, TCP_FRAME_SIZE, r->data[0], inl,
					&r->sent);

		if (err == -EAGAIN)
			return 0;
		if (err)
			return tcp_comm_fail(c, err, "sending a %zu-byte message on the control "
					     "socket failed: %s; the peer process probably died",
					     r->size[0], RAIL_ERRSTR(err));
		r->ctrl_done = 1;
		tcp_ctl_pop(c);
	}
	return 0;
}
