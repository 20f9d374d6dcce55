/*
 * nccl-net-rail: the verbs progress engine, layer 3 of src/ib/ (ib.h):
 * what the send and the receive side (ib_send.c, ib_recv.c, ib_eager.c)
 * share on a comm -- the QP set of a message, posting with the error
 * logged, the small control writes (CTS, credits, want, eager) and the
 * send-queue room they take, the CQ poll and the dispatch of each
 * completion, the completion of requests, and the peer liveness check.
 * The protocol: ib_send.c's top comment.
 *
 * Dispatch: the engine completes what it owns itself (send-queue slots
 * retired, a send batch's or flush's CQEs, errors); a receive WR (an
 * answer to a CTS) and a loopback copy of an eager message belong to the
 * layer above, which put its handlers on the comm when it made it
 * (rail_ib_comm.on_answer, .on_loop): the engine never names them.
 */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"

#define SLOT_MASK ((uint64_t)RAIL_IB_SLOTS - 1)
#define CTL_SIGNAL_EVERY 16

void rail_ib_qp_set(const struct rail_ib_comm *c, uint64_t num, int *first, int *count)
{
	int per = rail_ib_qps_per_msg(c);

	*first = (int)(num % (uint64_t)(c->nqps / per)) * per;
	*count = per;
}

int rail_ib_post_send(struct rail_ib_comm *c, int qpi, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *bad = NULL;
	char where[160];
	int ret = rail_ibv.post_send(c->qps[qpi].qp, wr, &bad);

	if (rail_likely(!ret))
		return 0;
	ret = rail_verbs_err(ret);
	RAIL_WARN("ibv_post_send(%s) on %s failed: %s; the send queue is full or the QP is in "
		  "error", what, rail_ib_qp_where(c, qpi, where, sizeof(where)), RAIL_ERRSTR(-ret));
	c->error = -ret;
	return -ret;
}

int rail_ib_sq_room(struct rail_ib_comm *c, int qpi, int nwr, uint32_t limit)
{
	for (int pass = 0; pass < 2; pass++) {
		const struct rail_ib_qp *q = &c->qps[qpi];

		if (q->sq_posted - q->sq_retired + (uint32_t)nwr <= limit)
			return 1;
		if (pass == 0 && rail_ib_poll(c))
			return 0;
	}
	return 0;
}

int rail_ib_ctl_write(struct rail_ib_comm *c, int qpi, const void *src, uint32_t len,
		      uint64_t raddr, uint32_t rkey, const char *what)
{
	struct rail_ib_qp *q = &c->qps[qpi];
	struct ibv_sge sge = {
		.addr = (uintptr_t)src,
		.length = len,
		.lkey = c->res[q->member].scratch_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = len <= q->max_inline ? IBV_SEND_INLINE : 0,
	};

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	q->sq_posted++;
	/*
	 * Every 16th is signaled, and its completion retires the ones before
	 * (RC completes a QP's WRs in order): a CQE costs the provider and,
	 * on rxe, the kernel inside the post, on every small message's path.
	 * A sender closing posts one signaled write more (rail_ib_sq_mark).
	 */
	if (q->sq_posted % CTL_SIGNAL_EVERY == 0) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		wr.wr_id = rail_ib_wrid(RAIL_IB_WR_RETIRE, (uint32_t)qpi, q->sq_posted);
		q->sq_signaled = q->sq_posted;
	}
	return rail_ib_post_send(c, qpi, &wr, what);
}

int rail_ib_sq_mark(struct rail_ib_comm *c, int qpi)
{
	struct rail_ib_qp *q = &c->qps[qpi];
	struct ibv_send_wr wr = {
		.num_sge = 0,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
	};

	/* zero bytes: no memory is touched, but the address and key are the peer's own */
	if (c->base.kind == RAIL_COMM_SEND) {
		wr.wr.rdma.remote_addr = c->remote_cmpl_addr;
		wr.wr.rdma.rkey = c->remote_cmpl_rkey[q->remote_member];
	} else {
		wr.wr.rdma.remote_addr = c->remote_fifo_addr;
		wr.wr.rdma.rkey = c->remote_fifo_rkey[q->remote_member];
	}
	q->sq_signaled = ++q->sq_posted;
	wr.wr_id = rail_ib_wrid(RAIL_IB_WR_RETIRE, (uint32_t)qpi, q->sq_posted);
	return rail_ib_post_send(c, qpi, &wr, "zero-byte write that retires unsignaled ones");
}

int rail_ib_protocol_error(struct rail_ib_comm *c, int m, const char *what)
{
	RAIL_WARN("connection to peer %s on %s: protocol error: %s", c->peer,
		  c->res[m].dev->name, what);
	c->error = -EPROTO;
	return -EPROTO;
}

/* ---- completions -------------------------------------------------------- */

static const char *wc_hint(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_RETRY_EXC_ERR:
		return "peer unreachable or dead; check the GID (NCCL_IB_GID_INDEX) and the link";
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return "the peer posted no receive in time; is it still running?";
	case IBV_WC_REM_ACCESS_ERR:
		return "the peer refused the access: buffer deregistered or freed on the peer?";
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		return "a local buffer is not (or no longer) registered";
	case IBV_WC_REM_INV_REQ_ERR:
	case IBV_WC_REM_OP_ERR:
		return "the peer rejected the request (size beyond its buffer?)";
	case IBV_WC_WR_FLUSH_ERR:
		return "the QP went to error earlier";
	default:
		return "check dmesg and the link on both sides";
	}
}

static int wc_error(struct rail_ib_comm *c, int m, const struct ibv_wc *wc)
{
	const struct rail_ib_dev *d = c->res[m].dev;
	int err = wc->status == IBV_WC_RETRY_EXC_ERR || wc->status == IBV_WC_RNR_RETRY_EXC_ERR ||
			  wc->status == IBV_WC_REM_ACCESS_ERR || wc->status == IBV_WC_REM_OP_ERR ||
			  wc->status == IBV_WC_REM_INV_REQ_ERR
		  ? -EREMOTEIO : -EIO;

	if (!c->error || wc->status != IBV_WC_WR_FLUSH_ERR)
		RAIL_WARN("completion error on %s:%d qp 0x%x, connection to peer %s: %s (status "
			  "%d, vendor error 0x%x, opcode %d); %s", d->hca->name, d->port, wc->qp_num,
			  c->peer, rail_ibv_wc_status_str(wc->status), wc->status, wc->vendor_err,
			  wc->opcode, wc_hint(wc->status));
	if (!c->error) {
		c->error = err;
		rail_flight_note(&c->base.fl, RAIL_FEV_WC_ERROR, wc->qp_num, (int)wc->status,
				 rail_ibv_wc_status_str(wc->status));
	}
	if (wc->wr_id && RAIL_IB_WRID_KIND(wc->wr_id) == RAIL_IB_WR_REQ)
		((struct rail_ib_req *)(uintptr_t)wc->wr_id)->error = c->error;
	return c->error;
}

/* Bytes wait on the handshake socket: after the handshake, only a move's messages. */
static int oob_has_bytes(const struct rail_ib_comm *c)
{
	char b;

	return recv(c->oob_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/*
 * With failover, a completion that says the path failed (retry exceeded, or
 * flushed because its QP went to error) is not the comm's error: the move
 * (ib_move.c) drains the old QPs, learns from the peer what arrived, and
 * posts again what the path lost. Such a request's completion is counted
 * but the request is not complete (flushed): the move decides.
 */
static int path_error(enum ibv_wc_status s)
{
	return s == IBV_WC_RETRY_EXC_ERR || s == IBV_WC_WR_FLUSH_ERR;
}

static int fence_wc(struct rail_ib_comm *c, int m, const struct ibv_wc *wc)
{
	const struct rail_ib_dev *d = c->res[m].dev;
	struct rail_ib_req *r;

	if (!c->fencing && !c->path_failed) {
		/* the peer's move message already here: its QPs went to error first */
		int peer_moves = oob_has_bytes(c);

		c->path_failed = RAIL_IB_TRIG_WC;
		rail_log(peer_moves ? RAIL_LOG_INFO : RAIL_LOG_WARN, RAIL_LOG_NET, __FILE__, __LINE__,
			 "completion error on %s:%d qp 0x%x, connection to peer %s: %s (status %d, "
			 "vendor error 0x%x): %s (NCCL_RAIL_FAILOVER)", d->hca->name, d->port,
			 wc->qp_num, c->peer, rail_ibv_wc_status_str(wc->status), wc->status,
			 wc->vendor_err, peer_moves ? "the peer is moving the connection"
						    : "the path failed; the connection moves to another");
		rail_flight_note(&c->base.fl, RAIL_FEV_WC_ERROR, wc->qp_num, (int)wc->status,
				 rail_ibv_wc_status_str(wc->status));
	}
	switch (RAIL_IB_WRID_KIND(wc->wr_id)) {
	case RAIL_IB_WR_MARK:
		c->marks_left--;
		c->rq_marks_left -= RAIL_IB_WRID_B(wc->wr_id) == 1;
		return 0;
	case RAIL_IB_WR_REQ:
		r = (struct rail_ib_req *)(uintptr_t)wc->wr_id;
		if (!r)
			return 0;	/* an unsignaled write (wr_id 0): errors complete them too */
		if (!r->events[m])
			return rail_ib_protocol_error(c, m, "flushed completion for no request");
		r->events[m]--;
		if (r->base.type == RAIL_REQ_FLUSH && !r->flushed &&
		    c->nreflush < RAIL_MAX_REQUESTS)
			c->reflush[c->nreflush++] = r;
		r->flushed = 1;
		return 0;
	default:
		return 0;	/* RETIRE, RECV, LOOP: the move counts from state, not WRs */
	}
}

static int events_left(const struct rail_ib_req *r, int ndevs)
{
	for (int m = 0; m < ndevs; m++)
		if (r->events[m])
			return 1;
	return 0;
}

/* A send batch's lead or a flush. */
static int on_req_cqe(struct rail_ib_comm *c, struct rail_ib_req *r, int m)
{
	if (r->base.type == RAIL_REQ_RECV || !r->events[m])
		return rail_ib_protocol_error(c, m, "completion for no request in flight");
	r->events[m]--;
	if (events_left(r, c->ndevs) || rail_unlikely(r->flushed))
		return 0;	/* flushed: a move completes it once it knows what arrived */
	if (r->base.type == RAIL_REQ_SEND)
		rail_ib_send_complete(c, r);
	else
		r->done = 1;
	return 0;
}

/* A receive whose buffers are all filled: complete it (and forget it). */
void rail_ib_recv_check_done(struct rail_ib_comm *c, struct rail_ib_req *r)
{
	if (r->done || r->pending || r->loops)
		return;
	r->done = 1;
	if (r->cts >= 0)
		c->cts[r->cts & SLOT_MASK].r = NULL;	/* its answer can only say EAGER */
	if (c->recvs[r->seq & SLOT_MASK] == r)
		c->recvs[r->seq & SLOT_MASK] = NULL;
	while (c->recv_lo < c->seq && !rail_ib_recv_at(c, c->recv_lo))
		c->recv_lo++;
}

static int handle_wc(struct rail_ib_comm *c, int m, const struct ibv_wc *wc)
{
	uint32_t a = RAIL_IB_WRID_A(wc->wr_id);

	if (rail_unlikely(wc->status != IBV_WC_SUCCESS))
		return c->failover && (c->fencing || path_error(wc->status)) ? fence_wc(c, m, wc)
									      : wc_error(c, m, wc);
	c->res[m].cqes++;
	switch (RAIL_IB_WRID_KIND(wc->wr_id)) {
	case RAIL_IB_WR_RETIRE:
		if (a < (uint32_t)c->nqps)
			c->qps[a].sq_retired = RAIL_IB_WRID_B(wc->wr_id);
		return 0;
	case RAIL_IB_WR_RECV:
		return c->on_answer(c, (int)a, m, wc);
	case RAIL_IB_WR_LOOP:
		return c->on_loop(c, a);
	case RAIL_IB_WR_REQ:
		if (wc->wr_id)
			return on_req_cqe(c, (struct rail_ib_req *)(uintptr_t)wc->wr_id, m);
		break;
	}
	return rail_ib_protocol_error(c, m, "completion of an unknown work request");
}

int rail_ib_poll(struct rail_ib_comm *c)
{
	struct ibv_wc wc[RAIL_IB_CQ_POLL];

	for (int m = 0; m < c->ndevs; m++) {
		int n;

		do {
			n = rail_ibv.poll_cq(c->res[m].cq, RAIL_IB_CQ_POLL, wc);
			if (rail_unlikely(n < 0)) {
				RAIL_WARN("ibv_poll_cq on %s for peer %s failed (%d)",
					  c->res[m].dev->name, c->peer, n);
				c->error = -EIO;
				return c->error;
			}
			for (int i = 0; i < n; i++) {
				int err = handle_wc(c, m, &wc[i]);

				if (err)
					return err;
			}
		} while (n == RAIL_IB_CQ_POLL);
	}
	return 0;
}

/* The watchdog found the peer gone: note it and log the flight record (once). */
static void watchdog_fired(struct rail_ib_comm *c, const char *call)
{
	char why[128];

	rail_flight_add(&c->base.fl, 0, RAIL_FEV_PEER_GONE, 0, 0, 0, c->error);
	snprintf(why, sizeof(why), "the watchdog in %s found the peer gone: %s", call,
		 RAIL_ERRSTR(c->error));
	rail_flight_dump(&c->base, why);
}

void rail_ib_describe_comm(struct rail_comm *base, int detail, char *buf, size_t len)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)base;
	size_t off = 0;

#define PUT(...) \
	do { \
		if (off < len) { \
			int w_ = snprintf(buf + off, len - off, __VA_ARGS__); \
			off += w_ > 0 ? (size_t)w_ : 0; \
		} \
	} while (0)
	PUT("peer %s,", c->peer[0] ? c->peer : "?");
	for (int m = 0; m < c->ndevs; m++)
		if (c->res[m].dev)
			PUT("%s%s:%d", m ? "+" : " ", c->res[m].dev->hca->name, c->res[m].dev->port);
	if (!detail) {
		PUT(", %d QPs", c->nqps);
		return;
	}
	PUT(", error %s", c->error ? RAIL_ERRSTR(c->error) : "none");
	for (int i = 0; i < c->nqps; i++) {
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		const char *st = "state unknown (no ibv_query_qp)";

		if (!c->qps[i].qp)
			continue;
		if (rail_ibv.query_qp) {
			memset(&a, 0, sizeof(a));
			st = rail_ibv.query_qp(c->qps[i].qp, &a, IBV_QP_STATE, &ia) == 0
				     ? rail_ibv_qp_state_str((int)a.qp_state) : "state query failed";
		}
		PUT("%s qp 0x%x->0x%x %s", i ? ";" : ",", c->qps[i].qp->qp_num,
		    c->qps[i].remote_qpn, st);
	}
#undef PUT
}

int rail_ib_oob_peek(const struct rail_ib_comm *c)
{
	ssize_t n;
	char b;

	if (c->oob_fd < 0)
		return 0;
	n = recv(c->oob_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
		return 0;
	return n == 0 ? -RAIL_ECLOSED : -errno;
}

/*
 * Completions this side's own HCA owes: the CQEs of the writes (and
 * flushes) of requests in flight, and one per QP whose last signaled
 * control write has not retired (unsignaled ones produce none).
 */
static uint64_t cqes_owed(const struct rail_ib_comm *c)
{
	uint64_t owed = 0;

	for (uint32_t i = 0; rail_pool_in_use(&c->base.reqs) && i < c->base.reqs.capacity; i++) {
		const struct rail_ib_req *r = rail_pool_at(&c->base.reqs, i);

		if (r->base.magic != RAIL_REQ_MAGIC || r->done || r->error)
			continue;
		for (int m = 0; m < c->ndevs; m++)
			owed += (uint64_t)r->events[m];
	}
	for (int i = 0; i < c->nqps; i++)
		owed += c->qps[i].sq_signaled != c->qps[i].sq_retired;
	return owed;
}

static uint64_t cqes_polled(const struct rail_ib_comm *c)
{
	uint64_t n = 0;

	for (int m = 0; m < c->ndevs; m++)
		n += c->res[m].cqes;
	return n;
}

/* The most a connection's stall timeout grows: 2^4 x NCCL_RAIL_IB_STALL_TIMEOUT. */
#define STALL_SHIFT_MAX 4

/*
 * A path slower than the timeout is not a dead one (Soft-RoCE on a loaded
 * host takes seconds for a 64 MiB write, and a move writes it again): each
 * stall doubles the connection's own timeout, so the write that was taken
 * for stalled gets through after a move or two instead of moving for ever.
 */
static void stall_fire(struct rail_ib_comm *c, uint64_t now, uint64_t owed, const char *call)
{
	uint64_t t = (uint64_t)rail_param_int(RAIL_P_IB_STALL_TIMEOUT);

	c->path_failed = RAIL_IB_TRIG_STALL;
	if (c->stall_shift < STALL_SHIFT_MAX)
		c->stall_shift++;
	RAIL_WARN("%s on %s:%d qp 0x%x, connection to peer %s: %llu completions owed by this "
		  "HCA and none polled for %llu s (NCCL_RAIL_IB_STALL_TIMEOUT), with no port "
		  "event: the path stalled (a far-side cable or switch fault); the path moves "
		  "(NCCL_RAIL_FAILOVER), and this connection waits %llu s before its next stall",
		  call, c->res[0].dev->hca->name, c->res[0].dev->port, c->qps[0].qp->qp_num,
		  c->peer, (unsigned long long)owed,
		  (unsigned long long)((now - c->stall_ns) / 1000000000ull),
		  (unsigned long long)(t << c->stall_shift));
	rail_flight_note(&c->base.fl, RAIL_FEV_STATE, c->qps[0].qp->qp_num, (int32_t)c->epoch,
			 "stall: the path moves");
}

/*
 * Control writes go unsignaled but every 16th: a tail of them (a CTS
 * written again after a move, credits) owes no completion, so a path that
 * dropped them would never look stalled. With nothing else owed, one
 * signaled zero-byte write behind such a tail makes it owed (at most one
 * per idle spell: after its completion the tail is gone).
 */
static int stall_probe(struct rail_ib_comm *c, int watched)
{
	int peeked = 0;

	for (int i = 0; i < c->nqps; i++) {
		const struct rail_ib_qp *q = &c->qps[i];

		if (q->sq_posted == q->sq_signaled || q->sq_posted - q->sq_retired >= 16)
			continue;
		if (!peeked++ && !watched && rail_ib_oob_peek(c))
			return 0;	/* a peer that closed its socket is not probed */
		(void)rail_ib_sq_mark(c, i);	/* a failed post is the comm's error */
	}
	return peeked;
}

/*
 * The stall watchdog (failover): completions owed and none polled for
 * NCCL_RAIL_IB_STALL_TIMEOUT while NCCL keeps calling. The remote HCA
 * acknowledges an RC write in microseconds whatever the peer process does,
 * so the path is broken (a far-side cable or switch fault with no port
 * event; the HCA's retries would take ~30 s, or forever on Soft-RoCE):
 * the comm moves. A receiver waiting for data or a sender for a CTS owes
 * nothing. last: the previous look (longer than the timeout ago: NCCL did
 * not call, nothing was polled, the clock starts again). Before it fires it
 * polls: NCCL may be calling only isend or irecv, which need not poll.
 */
static int stall_check(struct rail_ib_comm *c, uint64_t now, uint64_t last, const char *call,
		       int watched)
{
	uint64_t t = ((uint64_t)rail_param_int(RAIL_P_IB_STALL_TIMEOUT) * 1000000000ull)
		     << c->stall_shift, owed;

	if (!t || !c->failover || c->mv || c->fencing || c->path_failed || c->error)
		return 0;
	owed = cqes_owed(c);
	if (c->stall_ns && now - last <= t && cqes_polled(c) == c->stall_cqes && owed) {
		if (now - c->stall_ns < t || rail_ib_poll(c) || c->path_failed)
			return 0;
		owed = cqes_owed(c);
		if (owed && cqes_polled(c) == c->stall_cqes) {
			if (!rail_ib_oob_peek(c))	/* a peer that closed is the watchdog's */
				stall_fire(c, now, owed, call);
			return 0;
		}
	}
	c->stall_cqes = cqes_polled(c);	/* progress, nothing owed, or not called: again */
	c->stall_ns = now;
	return owed ? 0 : stall_probe(c, watched);
}

int rail_ib_stall_look(struct rail_ib_comm *c, uint64_t last, int watched)
{
	uint64_t now = rail_now_ns();

	/*
	 * What completed is polled first: only a path that completes nothing
	 * looks stalled, and a comm whose last writes completed is quiet at once.
	 */
	if (!rail_ib_stall_quiet(c) && (rail_ib_poll(c) || c->path_failed))
		return 0;
	return stall_check(c, now, last, "the move thread", watched);
}

int rail_ib_stall_quiet(const struct rail_ib_comm *c)
{
	if (rail_pool_in_use(&c->base.reqs))
		return 0;
	for (int i = 0; i < c->nqps; i++)
		if (c->qps[i].sq_posted != c->qps[i].sq_retired)
			return 0;
	return 1;
}

int rail_ib_peer_check(struct rail_ib_comm *c, const char *call)
{
	uint64_t now, last;
	int err;

	if ((++c->idle & 255) != 0 || c->oob_fd < 0)
		return 0;
	now = rail_now_ns();
	if (now - c->oob_checked_ns < 100000000ull)
		return 0;
	last = c->oob_checked_ns;
	c->oob_checked_ns = now;
	err = rail_ib_oob_peek(c);
	if (!err)	/* a peer that closed its socket is reported as gone, not probed */
		stall_check(c, now, last, call, 0);
	if (!err && c->failover && !c->mv && oob_has_bytes(c)) {
		/* the peer's path failed: it moves, and this side joins */
		err = c->on_move(c, RAIL_IB_TRIG_OOB, call);
		return err == -EAGAIN ? 0 : err;
	}
	if (!err)
		return 0;
	if (err == -ETIMEDOUT) {
		/* keepalive with NCCL_RAIL_PEER_TIMEOUT (ib_conn.c): the host went silent */
		RAIL_WARN("%s on %s:%d qp 0x%x: peer %s stopped answering (its host sent nothing, "
			  "not even a TCP keepalive reply, for NCCL_RAIL_PEER_TIMEOUT=%lld s): the "
			  "peer host died or the network between is down (check the peer node and "
			  "both links); the connection is failed", call, c->res[0].dev->hca->name,
			  c->res[0].dev->port, c->qps[0].qp->qp_num, c->peer,
			  (long long)rail_param_int(RAIL_P_PEER_TIMEOUT));
		c->error = -ETIMEDOUT;
		watchdog_fired(c, call);
		return c->error;
	}
	/* End of file: the peer closed (its process exited), which "reset" would misreport. */
	c->error = err == -RAIL_ECLOSED ? -RAIL_ECLOSED : -ECONNRESET;
	RAIL_WARN("%s on %s:%d qp 0x%x: the connection to peer %s is gone (%s): the peer process "
		  "exited or crashed, or its side of the connection failed (its log says why), while "
		  "this side still waits", call, c->res[0].dev->hca->name,
		  c->res[0].dev->port, c->qps[0].qp->qp_num, c->peer,
		  err == -RAIL_ECLOSED ? "it closed its socket" : RAIL_ERRSTR(err));
	watchdog_fired(c, call);
	return c->error;
}
