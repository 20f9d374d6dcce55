/*
 * fakeverbs: send work requests held in flight, and the flush of a QP that
 * goes to ERR, so that tests can fail a port with data in flight.
 *
 * Rules (fv.h has the calls):
 * - A send WR posted on a QP in RTS is held in that QP's queue, in posting
 *   order, when its device is held (fv_test_hold), when the QP's own port
 *   or its destination QP's port is not IBV_PORT_ACTIVE, when the
 *   destination QP is in ERR and the sender's device has retry_ms in its
 *   description (packets to a QP in ERR are dropped; without retry_ms such
 *   a WR fails with IBV_WC_RETRY_EXC_ERR at once, as before), or when
 *   earlier WRs of the QP are held. Receive WRs are never carried out on
 *   their own: they stay posted.
 * - At every entry into the provider (post_send, post_recv, poll_cq,
 *   modify_qp, query_qp, dereg_mr, destroy_qp), each QP in RTS carries out
 *   its held WRs in order while nothing stops them (a link that came back
 *   before the retry count ran out); if the head is still stopped after
 *   retry_ms (default FV_RETRY_MS) it completes with IBV_WC_RETRY_EXC_ERR
 *   and the QP goes to ERR. A device with retrying=yes, or one that is
 *   held, never times out; turning fv_test_hold off restarts the timers.
 * - A device that had DEVICE_FATAL injected (fv_test_event) is dead: its
 *   QPs' send WRs are held for good (dev_dead, never timed out), WRs to its
 *   QPs are held as to a port that is down (dest_dead: retry exceeded after
 *   retry_ms), and its QPs going to ERR complete nothing (dead_drop).
 * - A QP going to ERR (ibv_modify_qp, or an error completion) completes
 *   every held send WR with IBV_WC_WR_FLUSH_ERR on its send CQ, unsignaled
 *   ones too (hardware reports every outstanding WR when flushing), then
 *   every posted receive on its receive CQ, each queue in order.
 *
 * Logged: "hold dev= qpn= dest_qpn= wr_id= why=" (why: test_hold,
 * port_down, dest_port_down, dest_err, queued), "release qpn= wr_id=
 * held_ms=", "timeout qpn= wr_id= held_ms= retry_ms=" (then the usual "wc"
 * line), "flush qpn= queue=send|recv wr_id= status=5". Under fv_lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fv.h"

uint64_t fv_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Send WRs held on every QP of the process (fv_lock): none, no QP to walk. */
static long held_wrs;

static int port_active(const struct fv_dev *d, int port)
{
	if (port < 1 || port > d->nports)
		return 1;	/* no port set: nothing to go down */
	return d->ports[port - 1].state == IBV_PORT_ACTIVE;
}

/* Why q cannot send now, regardless of its queue; NULL if it can. */
static const char *stopped(const struct fv_qp *q)
{
	const struct fv_qp *d;

	if (q->dev->dead)
		return "dev_dead";
	if (q->dev->hold)
		return "test_hold";
	if (!port_active(q->dev, q->port))
		return "port_down";
	d = fv_qp_by_num(q->dest_qpn);
	if (d && (!port_active(d->dev, d->port) || d->dev->dead))
		return d->dev->dead ? "dest_dead" : "dest_port_down";
	if (d && d->state == IBV_QPS_ERR && q->dev->retry_ms >= 0)
		return "dest_err";
	return NULL;
}

const char *fv_hold_why(const struct fv_qp *q)
{
	const char *why = stopped(q);

	return why ? why : q->sq ? "queued" : NULL;
}

int fv_hold_push(struct fv_qp *q, const struct ibv_send_wr *wr, const char *why)
{
	size_t nsge = wr->num_sge > 0 ? (size_t)wr->num_sge : 0, inl = 0;
	struct fv_swr *h;
	char *p;

	if (wr->send_flags & IBV_SEND_INLINE)
		for (size_t i = 0; i < nsge; i++)
			inl += wr->sg_list[i].length;
	h = calloc(1, sizeof(*h) + nsge * sizeof(h->sge[0]) + inl);
	if (!h)
		return ENOMEM;
	h->wr = *wr;
	h->wr.next = NULL;
	h->wr.sg_list = nsge ? h->sge : NULL;
	if (nsge)
		memcpy(h->sge, wr->sg_list, nsge * sizeof(h->sge[0]));
	/* inline data belongs to the caller once post_send returns: keep a copy */
	p = (char *)&h->sge[nsge];
	for (size_t i = 0; inl && i < nsge; i++) {
		memcpy(p, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
		h->sge[i].addr = (uintptr_t)p;
		p += wr->sg_list[i].length;
	}
	h->since_ns = fv_now_ns();
	held_wrs++;
	if (!q->sq)
		q->sq_tail = &q->sq;
	*q->sq_tail = h;
	q->sq_tail = &h->next;
	fv_log("hold dev=%s qpn=0x%x dest_qpn=0x%x wr_id=0x%llx why=%s", q->dev->ibdev.name,
	       q->qp.qp_num, q->dest_qpn, (unsigned long long)wr->wr_id, why);
	return 0;
}

static struct fv_swr *pop(struct fv_qp *q)
{
	struct fv_swr *h = q->sq;

	held_wrs--;
	q->sq = h->next;
	if (!q->sq)
		q->sq_tail = &q->sq;
	return h;
}

static long long held_ms(const struct fv_swr *h, uint64_t now)
{
	return (long long)((now - h->since_ns) / 1000000u);
}

/* Release q's held WRs while nothing stops them; time the head out. */
static void run_queue(struct fv_qp *q, uint64_t now)
{
	while (q->sq && q->state == IBV_QPS_RTS) {
		int retry = q->dev->retry_ms >= 0 ? q->dev->retry_ms : FV_RETRY_MS;
		struct fv_swr *h;

		if (!stopped(q)) {
			h = pop(q);
			fv_log("release qpn=0x%x dest_qpn=0x%x wr_id=0x%llx held_ms=%lld",
			       q->qp.qp_num, q->dest_qpn, (unsigned long long)h->wr.wr_id,
			       held_ms(h, now));
			fv_send_run(q, &h->wr);
			free(h);
			continue;
		}
		if (q->dev->retrying || q->dev->hold || q->dev->dead ||
		    now - q->sq->since_ns < (uint64_t)retry * 1000000u)
			return;
		h = pop(q);
		fv_log("timeout qpn=0x%x dest_qpn=0x%x wr_id=0x%llx held_ms=%lld retry_ms=%d",
		       q->qp.qp_num, q->dest_qpn, (unsigned long long)h->wr.wr_id, held_ms(h, now),
		       retry);
		fv_send_complete(q, h->wr.wr_id, h->wr.opcode, 1, IBV_WC_RETRY_EXC_ERR, 0);
		free(h);
		fv_qp_error(q);
	}
}

void fv_progress(void)
{
	uint64_t now = 0;

	fv_place_held(NULL);
	for (struct fv_qp *q = held_wrs ? fv_qp_list() : NULL; q; q = q->next) {
		if (!q->sq)
			continue;
		if (!now)
			now = fv_now_ns();
		run_queue(q, now);
	}
}

void fv_flush_one(struct fv_qp *q, int recv, uint64_t wr_id, enum ibv_wc_opcode op)
{
	struct ibv_cq *cq = recv ? q->qp.recv_cq : q->qp.send_cq;
	struct ibv_wc wc;

	fv_log("flush qpn=0x%x queue=%s wr_id=0x%llx status=%d", q->qp.qp_num,
	       recv ? "recv" : "send", (unsigned long long)wr_id, (int)IBV_WC_WR_FLUSH_ERR);
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = IBV_WC_WR_FLUSH_ERR;
	wc.opcode = op;
	wc.qp_num = q->qp.qp_num;
	if (cq)
		fv_cq_push((struct fv_cq *)(void *)cq, &wc);
}

void fv_qp_error(struct fv_qp *q)
{
	q->state = IBV_QPS_ERR;
	q->qp.state = IBV_QPS_ERR;
	if (q->dev->dead) {
		/* a dead HCA reports nothing: what was queued is gone without a completion */
		fv_log("dead_drop qpn=0x%x posted_recvs=%d", q->qp.qp_num, q->rcount);
		fv_hold_drop(q);
		q->rcount = 0;
		return;
	}
	while (q->sq) {
		struct fv_swr *h = pop(q);

		fv_flush_one(q, 0, h->wr.wr_id, fv_wc_op(h->wr.opcode));
		free(h);
	}
	for (; q->rcount; q->rcount--) {
		uint64_t wr_id = q->rq[q->rhead].wr_id;

		q->rhead = (q->rhead + 1) % q->rcap;
		fv_flush_one(q, 1, wr_id, IBV_WC_RECV);
	}
}

void fv_hold_drop(struct fv_qp *q)
{
	while (q->sq)
		free(pop(q));
}

int fv_hold_count(const struct fv_dev *d, int restart)
{
	uint64_t now = fv_now_ns();
	int n = 0;

	for (struct fv_qp *q = fv_qp_list(); q; q = q->next) {
		if (q->dev != d)
			continue;
		for (struct fv_swr *h = q->sq; h; h = h->next, n++)
			if (restart)
				h->since_ns = now;
	}
	return n;
}
