/*
 * nccl-net-rail: the probe of a verbs comm's way home (layer 2.3 of
 * src/ib/, ib.h; docs/FAILOVER.md, "Move back by probe").
 *
 * A comm that left a device whose port stayed up (a path that failed
 * twice: ib_move.c's "avoid", on either side) gets no port event when the
 * fault behind the port is repaired, so the move back waits for an
 * end-to-end check instead: the sender, a hold-down after the move and
 * then less and less often, asks the receiver over the handshake socket
 * for a probe, and both build a tiny RC QP pair on the devices they would
 * move back to (their homes), with a 64-byte buffer each. The sender reads
 * 8 bytes of the receiver's buffer (RDMA READ, as NCCL's resiliency
 * probes) and compares them with what the receiver said they hold:
 *
 *   sender (home mlx5_0)                     receiver (home mlx5_2)
 *   CQ, MR, QP in INIT on mlx5_0
 *   PROBE {number, mlx5_0, qpn}  ------->    CQ, MR (8 bytes of token), QP
 *                                            on mlx5_2, RTR+RTS to the sender's
 *                                <-------    PROBE_ACK {number, mlx5_2, qpn,
 *                                            buffer, rkey, token}
 *   RTR+RTS, RDMA READ of the buffer
 *   completion within PROBE_READ_NS, bytes == token: passed
 *   PROBE_DONE {number, result}  ------->    tears its QP down
 *   both tear down; passed: both mark home verified and the side(s) away
 *   move back (ib_move.c, reason BACK)
 *
 * The probe's QPs have a short transport timer (PROBE_TIMEOUT,
 * PROBE_RETRY) and their own CQs: the data QPs see nothing of it. It never
 * waits: each step is taken from NCCL's calls on the comm (every 256th,
 * rail_ib_comm_check) and from the move thread, like a move's. A move tears
 * a probe down on both sides (each side's move starts with it), as does
 * close. Failures are logged once per streak, at INFO.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"

#define PROBE_ANSWER_NS (10ull * 1000000000ull)	/* the receiver answers within this */
#define PROBE_READ_NS (1000000000ull)		/* the READ completes within this */
#define PROBE_POLL_NS (10ull * 1000000ull)	/* a READ in flight wants a look this often */
#define PROBE_WAIT_MAX_NS (300ull * 1000000000ull)	/* the wait after failures doubles to this */
#define PROBE_TIMEOUT 14	/* QP transport timer: 4.096 us x 2^14 = 67 ms per try, */
#define PROBE_RETRY 3		/* 4 tries: retry exceeded ~0.3 s after a dead path */
#define PROBE_BYTES 64
#define PROBE_READ 8

enum pr_state { PR_ASKED, PR_READING, PR_ANSWERED };

struct rail_ib_probe {
	enum pr_state state;
	uint64_t number;
	struct rail_ib_dev *dev;	/* this side's home */
	struct rail_ib_gid_choice gid;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint64_t token;			/* what the receiver's buffer holds */
	uint64_t start_ns, deadline_ns;
	unsigned peer_port;
	uint32_t peer_qpn;
	uint8_t buf[PROBE_BYTES];
};

static int is_send(const struct rail_ib_comm *c)
{
	return c->base.kind == RAIL_COMM_SEND;
}

static uint64_t first_wait_ns(void)
{
	int64_t s = rail_param_int(RAIL_P_FAILOVER_HOLDDOWN);

	return (uint64_t)(s > 0 ? s : 1) * 1000000000ull;
}

void rail_ib_probe_stop(struct rail_ib_comm *c)
{
	struct rail_ib_probe *p = c->back.p;
	struct ibv_qp_attr a;
	int ret;

	if (!p)
		return;
	if (p->qp) {	/* to the error state first: a READ still retrying ends at once */
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_ERR;
		(void)rail_ibv.modify_qp(p->qp, &a, IBV_QP_STATE);
		ret = rail_ibv.destroy_qp(p->qp);
		if (ret)
			RAIL_WARN("ibv_destroy_qp(probe qp 0x%x) on %s:%d, connection to peer %s, "
				  "failed: %s", p->qp->qp_num, p->dev->hca->name, p->dev->port, c->peer,
				  RAIL_ERRSTR(-rail_verbs_err(ret)));
	}
	if (p->mr)
		rail_ibv.dereg_mr(p->mr);
	if (p->cq)
		rail_ibv.destroy_cq(p->cq);
	free(p);
	c->back.p = NULL;
}

/* The probe's CQ, buffer and QP on this side's home device (QP in INIT). */
static int build(struct rail_ib_comm *c, enum pr_state state, char *why, size_t len)
{
	struct rail_ib_dev *d = c->home[0];
	struct rail_ib_probe *p = calloc(1, sizeof(*p));
	int access = IBV_ACCESS_LOCAL_WRITE | (state == PR_ANSWERED ? IBV_ACCESS_REMOTE_READ : 0);
	int err;

	if (!p)
		return -ENOMEM;
	c->back.p = p;
	p->state = state;
	p->dev = d;
	p->start_ns = rail_now_ns();
	err = rail_ib_dev_gid_resolve(d, &p->gid);
	if (err) {
		snprintf(why, len, "no GID on %s:%d: %.100s", d->hca->name, d->port, p->gid.reason);
		return err;
	}
	p->cq = rail_ibv.create_cq(d->hca->ctx, 4, NULL, NULL, 0);	/* no comm's: ib_async.c */
	p->mr = p->cq ? rail_ibv.reg_mr(d->hca->pd, p->buf, sizeof(p->buf), access) : NULL;
	if (!p->mr) {
		err = -(errno ? errno : EIO);
		snprintf(why, len, "%s on %s:%d failed: %s", p->cq ? "ibv_reg_mr" : "ibv_create_cq",
			 d->hca->name, d->port, RAIL_ERRSTR(err));
		return err;
	}
	p->qp = rail_ib_qp_make(c, d, p->cq, 1, 1, state == PR_ANSWERED ? IBV_ACCESS_REMOTE_READ : 0,
				&err);
	if (p->qp)	/* not the comm's: an async event on it must not touch the comm */
		p->qp->qp_context = NULL;
	else
		snprintf(why, len, "ibv_create_qp on %s:%d failed: %s", d->hca->name, d->port,
			 RAIL_ERRSTR(err));
	return err;
}

static void wire_dev(const struct rail_ib_probe *p, uint32_t rkey, struct rail_ib_wire_dev *w)
{
	memset(w, 0, sizeof(*w));
	w->lid = p->dev->lid;
	w->port = (uint8_t)p->dev->port;
	w->link_layer = (uint8_t)p->dev->link_layer;
	w->mtu = (uint8_t)p->dev->mtu;
	w->gid_index = (uint8_t)p->gid.index;
	w->ctrl_rkey = rkey;
	memcpy(w->gid, p->gid.raw, 16);
}

/* RTR and RTS to the peer's probe QP, with the probe's short timer; failures not logged. */
static int connect_to(struct rail_ib_comm *c, const struct rail_ib_wire_dev *remote, uint32_t qpn,
		      char *why, size_t len)
{
	struct rail_ib_probe *p = c->back.p;
	struct rail_ib_qp_path path = { p->dev, &p->gid, c->tc, PROBE_TIMEOUT, PROBE_RETRY, 1 };
	int err;

	p->peer_port = remote->port;
	p->peer_qpn = qpn;
	err = rail_ib_qp_connect(c, p->qp, &path, remote, qpn);
	if (err)
		snprintf(why, len, "ibv_modify_qp(RTR/RTS) of qp 0x%x on %s:%d to the peer's qp 0x%x "
			 "on its port %u failed: %s", p->qp->qp_num, p->dev->hca->name, p->dev->port,
			 qpn, remote->port, RAIL_ERRSTR(err));
	return err;
}

static int send_msg(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	int err = rail_ib_chan_put(c, m);

	if (!err)
		err = rail_ib_chan_flush(c);
	return err == -EAGAIN ? 0 : err;	/* the rest goes at the next step */
}

/* ---- the receiver: answer ---------------------------------------------------- */

static int answer(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	struct rail_ib_msg a;
	struct rail_ib_probe *p;
	char why[RAIL_IB_REFUSE_TEXT + 1] = "";
	int err = 0;

	rail_ib_probe_stop(c);	/* a newer probe replaces one not finished */
	memset(&a, 0, sizeof(a));
	a.type = RAIL_IB_MSG_PROBE_ACK;
	a.nonce = m->nonce;
	if (c->back.off || c->ndevs != 1 || c->remote_ndevs != 1)
		snprintf(why, sizeof(why), "the connection is closing or fused");
	else if (rail_ib_dev_down(c->home[0]))
		snprintf(why, sizeof(why), "its home port %s:%d is down", c->home[0]->hca->name,
			 c->home[0]->port);
	else if (!(err = build(c, PR_ANSWERED, why, sizeof(why))))
		err = connect_to(c, &m->devs[0], m->qpn[0], why, sizeof(why));
	p = c->back.p;
	if (why[0] || err) {
		rail_ib_probe_stop(c);
		a.refuse_code = RAIL_IB_PROBE_REFUSED;
		rail_strlcpy(a.text, why, sizeof(a.text));
		return send_msg(c, &a);
	}
	p->number = m->nonce;
	p->token = (rail_now_ns() * 0x9e3779b97f4a7c15ull) ^ m->nonce ^ (uintptr_t)p;
	memcpy(p->buf, &p->token, sizeof(p->token));
	p->state = PR_ANSWERED;
	p->deadline_ns = rail_now_ns() + PROBE_ANSWER_NS + PROBE_READ_NS;
	a.ndevs = a.nqps = 1;
	wire_dev(p, p->mr->rkey, &a.devs[0]);
	a.qpn[0] = p->qp->qp_num;
	a.ctrl_addr = (uint64_t)(uintptr_t)p->buf;
	a.aux_addr = p->token;
	return send_msg(c, &a);
}

static void answered(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	struct rail_ib_probe *p = c->back.p;

	if (!p || p->state != PR_ANSWERED || p->number != m->nonce)
		return;	/* an older probe's (this side answered a newer one) */
	if (!m->refuse_code) {
		c->back.verified_ns = rail_now_ns();
		RAIL_INFO(RAIL_LOG_NET, "connection from peer %s (receive comm): the peer's probe of "
			  "the way home (an RDMA READ from its port %u qp 0x%x of %s:%d qp 0x%x) "
			  "passed: the connection moves back", c->peer, p->peer_port, p->peer_qpn,
			  p->dev->hca->name, p->dev->port, p->qp->qp_num);
	}
	rail_ib_probe_stop(c);
}

/* ---- the sender: ask, read, conclude ------------------------------------------- */

static int ask(struct rail_ib_comm *c)
{
	struct rail_ib_msg m;
	char why[200];
	int err = build(c, PR_ASKED, why, sizeof(why));

	if (err) {	/* this side's resources: no message went, try again later */
		RAIL_INFO(RAIL_LOG_NET, "connection to peer %s (send comm): no probe of the way home "
			  "now: %s", c->peer, why);
		rail_ib_probe_stop(c);
		c->back.next_ns = rail_now_ns() + c->back.wait_ns;
		return 0;
	}
	c->back.p->number = ++c->back.number;
	c->back.p->deadline_ns = c->back.p->start_ns + PROBE_ANSWER_NS;
	memset(&m, 0, sizeof(m));
	m.type = RAIL_IB_MSG_PROBE;
	m.nonce = c->back.p->number;
	m.ndevs = m.nqps = 1;
	wire_dev(c->back.p, 0, &m.devs[0]);
	m.qpn[0] = c->back.p->qp->qp_num;
	return send_msg(c, &m);
}

static void log_result(struct rail_ib_comm *c, const struct rail_ib_probe *p, int ok,
		       const char *why, uint64_t wait)
{
	double ms = (double)(rail_now_ns() - p->start_ns) / 1e6;
	char path[160], after[48] = "";

	snprintf(path, sizeof(path), "%s:%d qp 0x%x to the peer's port %u qp 0x%x", p->dev->hca->name,
		 p->dev->port, p->qp ? p->qp->qp_num : 0, p->peer_port, p->peer_qpn);
	if (c->back.fails)
		snprintf(after, sizeof(after), ", after %d that failed", c->back.fails);
	if (ok)
		RAIL_INFO(RAIL_LOG_NET, "connection to peer %s (send comm): the probe of the way home "
			  "(an RDMA READ from %s) passed in %.1f ms%s: the connection moves back",
			  c->peer, path, ms, after);
	else if (c->back.fails == 1)	/* one line per streak */
		RAIL_INFO(RAIL_LOG_NET, "connection to peer %s (send comm): the probe of the way home "
			  "(an RDMA READ from %s) failed after %.1f ms: %s; it stays where it is and "
			  "probes again in %llu s, then less often (no line until one passes)",
			  c->peer, path, ms, why, (unsigned long long)(wait / 1000000000ull));
}

/*
 * The sender's probe is over: tell the receiver, tear down; passed: home
 * is verified; failed: the next one after twice the last wait (to a cap).
 */
static int conclude(struct rail_ib_comm *c, int ok, const char *why)
{
	struct rail_ib_probe *p = c->back.p;
	struct rail_ib_msg m;

	memset(&m, 0, sizeof(m));
	m.type = RAIL_IB_MSG_PROBE_DONE;
	m.nonce = p->number;
	m.refuse_code = ok ? 0 : RAIL_IB_PROBE_FAILED;
	rail_strlcpy(m.text, why, sizeof(m.text));
	if (ok) {	/* no probe while that holds (the move back is due) */
		c->back.verified_ns = rail_now_ns();
		c->back.next_ns = c->back.verified_ns + RAIL_IB_VERIFIED_NS;
	} else {
		c->back.fails++;
		c->back.wait_ns = RAIL_MIN(2 * c->back.wait_ns,
					   RAIL_MAX(PROBE_WAIT_MAX_NS, first_wait_ns()));
		c->back.next_ns = rail_now_ns() + c->back.wait_ns;
	}
	log_result(c, p, ok, why, c->back.wait_ns);
	if (ok)
		c->back.fails = 0;
	rail_ib_probe_stop(c);
	return send_msg(c, &m);
}

static int acked(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	struct rail_ib_probe *p = c->back.p;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad = NULL;
	char why[RAIL_IB_REFUSE_TEXT + 64];
	int ret;

	if (!p || p->state != PR_ASKED || p->number != m->nonce)
		return 0;	/* an answer to a probe this side gave up */
	if (m->refuse_code) {
		snprintf(why, sizeof(why), "the peer did not answer it: %s", m->text);
		return conclude(c, 0, why);
	}
	if (connect_to(c, &m->devs[0], m->qpn[0], why, sizeof(why)))
		return conclude(c, 0, why);
	p->token = m->aux_addr;
	memset(&sge, 0, sizeof(sge));
	sge.addr = (uint64_t)(uintptr_t)p->buf;
	sge.length = PROBE_READ;
	sge.lkey = p->mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = p->number;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = m->ctrl_addr;
	wr.wr.rdma.rkey = m->devs[0].ctrl_rkey;
	ret = rail_ibv.post_send(p->qp, &wr, &bad);
	if (ret) {
		snprintf(why, sizeof(why), "ibv_post_send(RDMA READ) on qp 0x%x failed: %s",
			 p->qp->qp_num, RAIL_ERRSTR(-rail_verbs_err(ret)));
		return conclude(c, 0, why);
	}
	p->state = PR_READING;
	p->deadline_ns = rail_now_ns() + PROBE_READ_NS;
	return 0;
}

/* The READ in flight: 0 (go on waiting) or what conclude() returns. */
static int reading(struct rail_ib_comm *c, uint64_t now)
{
	struct rail_ib_probe *p = c->back.p;
	struct ibv_wc wc;
	char why[160];
	int n = rail_ibv.poll_cq(p->cq, 1, &wc);

	if (n > 0 && wc.status == IBV_WC_SUCCESS && !memcmp(p->buf, &p->token, PROBE_READ))
		return conclude(c, 1, "passed");
	if (n > 0) {
		snprintf(why, sizeof(why), wc.status == IBV_WC_SUCCESS
			 ? "the bytes read are not those the peer holds (status %d)"
			 : "completion status %d (%s)", (int)wc.status,
			 rail_ibv_wc_status_str(wc.status));
		return conclude(c, 0, why);
	}
	if (n < 0) {
		snprintf(why, sizeof(why), "ibv_poll_cq failed (%d)", n);
		return conclude(c, 0, why);
	}
	if (now < p->deadline_ns)
		return 0;
	snprintf(why, sizeof(why), "no completion within %llu ms", PROBE_READ_NS / 1000000ull);
	return conclude(c, 0, why);
}

/* ---- what ib_move.c calls --------------------------------------------------- */

int rail_ib_probe_msg(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	if (is_send(c))
		return m->type == RAIL_IB_MSG_PROBE_ACK ? acked(c, m) : 0;
	if (m->type == RAIL_IB_MSG_PROBE)
		return answer(c, m);
	if (m->type == RAIL_IB_MSG_PROBE_DONE)
		answered(c, m);
	return 0;
}

int rail_ib_probe_step(struct rail_ib_comm *c)
{
	struct rail_ib_probe *p = c->back.p;
	uint64_t now = rail_now_ns();
	int err = rail_ib_chan_flush(c);

	if (err && err != -EAGAIN)
		return err;
	if (!p) {
		if (!is_send(c) || !c->back.due || c->back.off || now < c->back.next_ns)
			return 0;
		if (rail_ib_dev_down(c->home[0])) {	/* its port event will bring it home */
			c->back.next_ns = now + c->back.wait_ns;
			return 0;
		}
		return ask(c);
	}
	if (p->state == PR_READING)
		return reading(c, now);
	if (now < p->deadline_ns)
		return 0;
	if (p->state == PR_ANSWERED) {	/* the sender's result never came */
		rail_ib_probe_stop(c);
		return 0;
	}
	return conclude(c, 0, "the peer did not answer within 10 s");
}

void rail_ib_back_after_move(struct rail_ib_comm *c, int avoided, int away)
{
	struct rail_ib_back *b = &c->back;

	b->verified_ns = 0;
	if (c->ndevs != 1 || c->remote_ndevs != 1 || !away) {
		b->due = 0;	/* both at home (or fused: not probed) */
		return;
	}
	if (!avoided)
		return;	/* a due probe stays due, on its schedule */
	b->due = 1;
	b->fails = 0;
	b->wait_ns = first_wait_ns();
	b->next_ns = rail_now_ns() + b->wait_ns;
}

int rail_ib_probe_wanted(const struct rail_ib_comm *c)
{
	uint64_t next = rail_ib_probe_next_ns(c);

	return next && rail_now_ns() >= next;
}

uint64_t rail_ib_probe_next_ns(const struct rail_ib_comm *c)
{
	const struct rail_ib_probe *p = c->back.p;

	if (c->back.off)
		return 0;
	if (p && p->state == PR_READING)
		return RAIL_MIN(rail_now_ns() + PROBE_POLL_NS, p->deadline_ns);
	if (p)
		return p->deadline_ns;
	return is_send(c) && c->back.due ? c->back.next_ns : 0;
}
