/*
 * nccl-net-rail: closing a verbs send or receive comm (closeSend,
 * closeRecv): a sender's last writes reach the peer first, and a move
 * that is running or due is finished, on the move thread when there is
 * one, so that NCCL's thread never waits for a move's RTR. Connection
 * setup, and the listen comm's close: ib_conn.c.
 */
#include <stdio.h>

#include "ib/ib.h"
#include "log.h"
#include "rail.h"

/*
 * Sends completed early (inline or eager) may still sit in the send queue:
 * let them reach the peer before the QPs go, or the receiver would wait
 * forever for a message the sender already reported done. Bounded, since a
 * dead peer never acknowledges, and over as soon as the receiver has closed:
 * its QP is gone, so the hardware retries our writes for seconds, and NCCL
 * closes hundreds of comms at teardown. 1 when a move came due meanwhile
 * (the path failed under those writes, or the peer moves): the caller
 * finishes it, then drains again.
 */
static int send_drain(struct rail_ib_comm *c)
{
	uint64_t deadline = rail_now_ns() + 1000000000ull;
	unsigned turns = 0;

	/* The last writes may have gone unsignaled (rail_ib_ctl_write): one signaled write each. */
	for (int i = 0; i < c->nqps && !c->error; i++)
		if (c->qps[i].sq_posted != c->qps[i].sq_retired && rail_ib_sq_mark(c, i))
			return 0;
	while (!c->error) {
		int left = 0;

		for (int i = 0; i < c->nqps && !left; i++)
			left = c->qps[i].sq_posted != c->qps[i].sq_retired;
		if (!left)
			return 0;
		if ((++turns & 63) == 0 && rail_ib_oob_peek(c))
			return 0;
		/* the path failed under these writes, or the peer moves: a move first */
		if (c->path_failed || ((turns & 63) == 0 && rail_ib_move_close_due(c)))
			return 1;
		if (rail_now_ns() > deadline) {
			RAIL_INFO(RAIL_LOG_NET, "closing the connection to peer %s with inline sends "
				  "still unacknowledged after 1 s", c->peer);
			return 0;
		}
		if (rail_ib_poll(c))
			return 0;
	}
	return 0;
}

/* The move thread's end of a close (or without it, here): drained, a move the drain found first. */
static void send_finish(struct rail_ib_comm *c)
{
	for (int i = 0; i < 3 && !c->mv && send_drain(c); i++)
		(void)rail_ib_move_settle(c, "closeSend");
	rail_ib_comm_free(c);
}

/*
 * A comm closed during a move, or with one due, or with lost pieces still
 * to write (sends NCCL was told were done may sit in the failed path; the
 * peer's move needs this side): the move thread finishes it, then finish
 * frees it; close returns at once (NCCL's proxy thread never waits for a
 * move's RTR). Without the thread, here, bounded. 0: the caller frees.
 */
static int close_settle(struct rail_ib_comm *c, const char *call,
			void (*finish)(struct rail_ib_comm *c))
{
	if (rail_ib_move_settle_step(c, call))
		return 0;
	if (rail_ib_move_close(c, finish)) {
		rail_comm_closed(&c->base);	/* closed to NCCL (finalize): freed by the thread */
		rail_guard_owner_out(&c->base);	/* close held it: the thread takes it now */
		return 1;
	}
	(void)rail_ib_move_settle(c, call);
	return 0;
}

int rail_ib_close_send(struct rail_comm *comm)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;

	if (close_settle(c, "closeSend", send_finish))
		return 0;
	if (c->mv || !send_drain(c))
		rail_ib_comm_free(c);
	else if (!close_settle(c, "closeSend", send_finish))
		send_finish(c);
	return 0;
}

int rail_ib_close_recv(struct rail_comm *comm)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;

	if (!close_settle(c, "closeRecv", rail_ib_comm_free))
		rail_ib_comm_free(c);
	return 0;
}
