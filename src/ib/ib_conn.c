/*
 * nccl-net-rail: verbs connection setup over an out-of-band TCP socket,
 * never blocking: NCCL calls connect/accept again until they return a comm,
 * and the state lives in the handle's stage slot (connect) or the listen
 * comm's pending list (accept).
 *
 *   sender (connect)                       receiver (accept)
 *   HELLO {nonce, devices, QPs/device} -->
 *                                          checks the nonce (REFUSE if wrong),
 *                                          creates CQs + QPs (INIT), flush QPs
 *                                      <-- ACCEPT {devices, QPNs, completion records,
 *                                                  eager ring, want word}
 *   creates QPs, RTR + RTS
 *   READY {QPNs, CTS FIFO, credit word,
 *          eager order wanted} -->
 *   returns the comm                       RTR + RTS, returns the comm
 *
 * The sender's QPs are ready before READY leaves, and the receiver writes
 * nothing before its QPs are ready, so no further message is needed: the
 * first clear-to-send entry is the receiver's "go". The socket stays open
 * with the comm: its closing tells a waiting side that the peer died.
 *
 * QP creation and the RTR/RTS transitions run as a job on a helper thread
 * (ib_job.c: threads shared by every handshake, a new one only when none is
 * idle, so handshakes progress side by side): on RoCE the kernel resolves
 * the peer's address inside ibv_modify_qp(RTR), which can take a second,
 * and connect/accept must not block NCCL's proxy thread. There alone a
 * failed ibv_modify_qp is tried again (NCCL_IB_MQP_RETRY_*, ib_mqp.c);
 * freeing the handshake cuts its sleep short, or takes a queued step back.
 */
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fdlimit.h"
#include "handle.h"
#include "ib/ib.h"
#include "ib/ib_job.h"
#include "ib/ib_subnet.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "sock.h"

/*
 * Accepted sockets whose handshake is in progress, at most (as many as the
 * TCP transport keeps). One that has not sent a valid hello for
 * STRAY_GRACE_NS is a stray (a port scanner, a health check, another
 * program): when the list is full and a connection waits, the oldest such
 * one is dropped, so strays never starve the peer. A younger one may be a
 * real connector that has not sent its hello yet (NCCL opens many
 * connections to one listener at once, and calls connect again later).
 */
#define MAX_PENDING 128
#define STRAY_GRACE_NS (2ull * 1000000000ull)

enum hs_state {
	S_CONNECTING,
	S_SEND_HELLO,
	S_RECV_ACCEPT,
	S_SEND_READY,
	R_RECV_HELLO,
	R_SEND_ACCEPT,
	R_RECV_READY,
	R_SEND_REFUSE,
	HS_WORKING,
	HS_DONE,
};

static const char *const state_names[] = {
	"connecting", "sending the hello", "waiting for the accept", "sending ready",
	"waiting for the hello", "sending the accept", "waiting for ready", "sending a refusal",
	"setting up QPs", "done",
};

struct rail_ib_hs {
	int fd;
	enum hs_state state;
	int vdev;
	uint64_t nonce;
	uint64_t start_ns;
	int hello_ok;		/* accept: a hello with this listener's nonce arrived */
	int peer_failover;	/* the peer's hello or accept said it runs with failover */
	struct rail_conn_opts opts;
	struct rail_ib_comm *comm;
	char peer[RAIL_ADDR_STRLEN];
	/* connect: "" or what the listener's handle says of its release, when not ours */
	char release_note[128];
	uint8_t buf[RAIL_IB_HDR_SIZE + RAIL_IB_BODY_MAX];
	size_t len, off;
	int body_len;
	/* the helper thread's job: the verbs part of a step (ib_job.c) */
	struct rail_ib_msg msg;
	int (*work)(struct rail_ib_hs *hs);
	enum hs_state after;
	struct rail_ib_job job;	/* first member's container: hs_job_main */
	int worker_err;
	atomic_int cancel;	/* hs_free: a retrying ibv_modify_qp stops (ib_mqp.c) */
	struct rail_ib_mqp_retry retry;
};

struct rail_ib_listen {
	struct rail_comm base;
	int fd;
	uint64_t nonce;
	int npending;
	struct rail_ib_hs *pending[MAX_PENDING];
	unsigned long dropped;	/* strays dropped to make room (the first is a WARN) */
};

/* ---- comms ------------------------------------------------------------- */

void rail_ib_comm_free(struct rail_ib_comm *c)
{
	if (!c)
		return;
	if (rail_ib_move_free(c, rail_ib_comm_free))
		return;	/* the move thread is connecting its QPs: it frees c when done */
	rail_ib_flush_fini(c);
	rail_ib_comm_res_fini(c);
	rail_ib_tags_free(&c->tags);
	if (c->oob_fd >= 0)
		close(c->oob_fd);
	rail_comm_fini(&c->base);
	free(c);
}

/* The ops table, set by the layer above at init (rail_ib_conn_ops_set). */
static const struct rail_transport_ops *conn_ops;

void rail_ib_conn_ops_set(const struct rail_transport_ops *ops)
{
	conn_ops = ops;
}

static struct rail_ib_comm *comm_new(int vdev, int is_send, const char *peer, int *err)
{
	struct rail_ib_comm *c = calloc(1, sizeof(*c));

	if (!c) {
		*err = -ENOMEM;
		return NULL;
	}
	c->oob_fd = -1;
	/* The engine's completions for the layer above (ib.h). */
	c->on_answer = rail_ib_on_answer;
	c->on_loop = rail_ib_on_loop;
	rail_strlcpy(c->peer, peer, sizeof(c->peer));
	*err = rail_comm_init(&c->base, is_send ? RAIL_COMM_SEND : RAIL_COMM_RECV, vdev,
			      conn_ops);
	if (*err) {
		free(c);
		return NULL;
	}
	c->split = (int)rail_param_int(RAIL_P_IB_SPLIT_DATA_ON_QPS);
	*err = rail_ib_comm_res_init(c, vdev, is_send);
	if (*err) {
		rail_ib_comm_free(c);
		return NULL;
	}
	return c;
}

/* ---- handshake I/O ------------------------------------------------------ */

/* The helper thread's job: one step's verbs work. */
static void hs_job_main(struct rail_ib_job *j)
{
	struct rail_ib_hs *hs = (struct rail_ib_hs *)((char *)j - offsetof(struct rail_ib_hs, job));

	hs->worker_err = hs->work(hs);
}

/*
 * Run work(hs) on a helper thread (ib_job.c, shared by every handshake);
 * the handshake goes to state next after it.
 */
static void hs_spawn(struct rail_ib_hs *hs, int (*work)(struct rail_ib_hs *hs),
		     enum hs_state next)
{
	int64_t limit = rail_param_int(RAIL_P_CONNECT_TIMEOUT);

	hs->work = work;
	hs->after = next;
	hs->state = HS_WORKING;
	hs->retry.deadline_ns = limit > 0 ? hs->start_ns + (uint64_t)limit * 1000000000ull : 0;
	hs->retry.cancel = &hs->cancel;
	hs->job.fn = hs_job_main;
	hs->job.retry = &hs->retry;
	if (rail_ib_job_start(&hs->job) == 0)
		return;
	/* no thread: do it here, NCCL's thread, without retries */
	hs->worker_err = work(hs);
	atomic_store(&hs->job.done, 1);
}

/* -EAGAIN while the helper runs, then its result. */
static int hs_wait(struct rail_ib_hs *hs)
{
	if (!rail_ib_job_done(&hs->job))
		return -EAGAIN;
	(void)rail_ib_job_cancel(&hs->job);	/* done: the job is free for the next step */
	if (hs->worker_err)
		return hs->worker_err;
	hs->state = hs->after;
	return 0;
}

static void hs_free(struct rail_ib_hs *hs)
{
	atomic_store(&hs->cancel, 1);	/* a helper asleep between retries ends within 50 ms */
	(void)rail_ib_job_cancel(&hs->job);	/* a queued step never runs; a running one ends */
	if (hs->fd >= 0)
		close(hs->fd);
	rail_ib_comm_free(hs->comm);
	free(hs);
}

static int hs_put(struct rail_ib_hs *hs, const struct rail_ib_msg *m)
{
	int n = rail_ib_msg_encode(m, hs->buf, sizeof(hs->buf));

	if (n < 0) {
		RAIL_WARN("handshake with peer %s: cannot encode message type %d (%d devices, %d "
			  "QPs)", hs->peer, m->type, m->ndevs, m->nqps);
		return n;
	}
	hs->len = (size_t)n;
	hs->off = 0;
	return 0;
}

static int io_warn(struct rail_ib_hs *hs, int err)
{
	if (!err || err == -EAGAIN)
		return err;
	RAIL_WARN("verbs handshake with peer %s failed while %s: %s%s%s", hs->peer,
		  state_names[hs->state], RAIL_ERRSTR(err),
		  err == -ECONNRESET || err == -EPIPE ? " (the peer closed the connection: did it "
							 "fail or exit?)" : "", hs->release_note);
	return err;
}

static int hs_send(struct rail_ib_hs *hs)
{
	return io_warn(hs, rail_sock_send_nb(hs->fd, hs->buf, hs->len, &hs->off));
}

static void hs_recv_reset(struct rail_ib_hs *hs)
{
	hs->off = 0;
	hs->body_len = -1;
}

/* 0 with *m decoded, -EAGAIN, or an error (logged). */
static int hs_recv(struct rail_ib_hs *hs, struct rail_ib_msg *m)
{
	char why[200];
	int err, type;

	if (hs->body_len < 0) {
		err = rail_sock_recv_nb(hs->fd, hs->buf, RAIL_IB_HDR_SIZE, &hs->off);
		if (err)
			return io_warn(hs, err);
		hs->body_len = rail_ib_msg_header(hs->buf, &type, why, sizeof(why));
		if (hs->body_len < 0)
			goto bad;
	}
	err = rail_sock_recv_nb(hs->fd, hs->buf, RAIL_IB_HDR_SIZE + (size_t)hs->body_len,
				&hs->off);
	if (err)
		return io_warn(hs, err);
	err = rail_ib_msg_decode(hs->buf, hs->off, m, why, sizeof(why));
	if (!err)
		return 0;
bad:
	RAIL_WARN("verbs handshake with peer %s while %s: %s%s", hs->peer, state_names[hs->state],
		  why, hs->release_note);
	return -EPROTO;
}

static int hs_timed_out(struct rail_ib_hs *hs)
{
	int64_t limit = rail_param_int(RAIL_P_CONNECT_TIMEOUT);

	if (limit <= 0 || rail_now_ns() - hs->start_ns < (uint64_t)limit * 1000000000ull)
		return 0;
	RAIL_WARN("verbs handshake with peer %s timed out after %lld s while %s; is the peer "
		  "alive and reachable? (NCCL_RAIL_CONNECT_TIMEOUT)", hs->peer, (long long)limit,
		  state_names[hs->state]);
	return 1;
}

/* ---- messages ----------------------------------------------------------- */

static void msg_devs(struct rail_ib_comm *c, struct rail_ib_msg *m, int ctrl)
{
	m->ndevs = c->ndevs;
	for (int i = 0; i < c->ndevs; i++)
		rail_ib_local_wire_dev(&c->res[i], ctrl ? c->res[i].ctrl_mr->rkey : 0,
				       &m->devs[i]);
}

static int check_link_layers(struct rail_ib_comm *c, const struct rail_ib_msg *m,
			     char *why, size_t why_len)
{
	int ll = c->res[0].dev->link_layer;

	for (int i = 0; i < m->ndevs; i++) {
		if (m->devs[i].link_layer != ll) {
			snprintf(why, why_len, "link layer mismatch: local %s is %s, peer device %d "
				 "is %s", c->res[0].dev->name, rail_link_layer_str(ll), i,
				 rail_link_layer_str(m->devs[i].link_layer));
			return -EPROTO;
		}
	}
	return 0;
}

static void remote_devs(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	c->remote_ndevs = m->ndevs;
	memcpy(c->remote, m->devs, sizeof(m->devs[0]) * (size_t)m->ndevs);
	rail_ib_rail_local_note(c, m);
}

static int qp_count(int ndevs, int remote_ndevs, int qpd_remote)
{
	int qpd = RAIL_MAX((int)rail_param_int(RAIL_P_IB_QPS_PER_CONNECTION), qpd_remote);
	int n = RAIL_MAX(ndevs, remote_ndevs) * qpd;

	if (n > RAIL_IB_MAX_QPS) {
		RAIL_WARN("%d QPs per connection asked (NCCL_IB_QPS_PER_CONNECTION=%d x %d "
			  "devices); using %d", n, qpd, RAIL_MAX(ndevs, remote_ndevs),
			  RAIL_IB_MAX_QPS);
		n = RAIL_IB_MAX_QPS - RAIL_IB_MAX_QPS % RAIL_MAX(ndevs, remote_ndevs);
	}
	return n;
}

/* ---- sender ------------------------------------------------------------- */

static int sender_hello(struct rail_ib_hs *hs)
{
	struct rail_ib_comm *c = hs->comm;
	int tc = (int)rail_param_int(RAIL_P_IB_TC), sl = (int)rail_param_int(RAIL_P_IB_SL);
	struct rail_ib_msg m;

	memset(&m, 0, sizeof(m));
	/* NCCL (connect.cc): both follow the communicator's traffic class unless set. */
	c->tc = tc >= 0 ? tc : hs->opts.traffic_class >= 0 ? hs->opts.traffic_class : 0;
	c->sl = sl >= 0 ? sl : hs->opts.traffic_class >= 0 ? hs->opts.traffic_class : 0;
	m.type = RAIL_IB_MSG_HELLO;
	m.flags = rail_param_int(RAIL_P_FAILOVER) ? RAIL_IB_FLAG_FAILOVER : 0;
	m.nonce = hs->nonce;
	m.qps_per_dev = (int)rail_param_int(RAIL_P_IB_QPS_PER_CONNECTION);
	m.tc = c->tc;
	m.sl = c->sl;
	msg_devs(c, &m, 0);
	return hs_put(hs, &m);
}

static int sender_check_accept(struct rail_ib_hs *hs, const struct rail_ib_msg *m)
{
	struct rail_ib_comm *c = hs->comm;
	char why[200];

	if (m->type == RAIL_IB_MSG_REFUSE) {
		RAIL_WARN("connection to peer %s refused by the listener: %s%s", hs->peer, m->text,
			  hs->release_note);
		return -ECONNREFUSED;
	}
	if (m->type != RAIL_IB_MSG_ACCEPT || m->nqps < RAIL_MAX(c->ndevs, m->ndevs) ||
	    m->nqps > RAIL_IB_MAX_QPS) {
		RAIL_WARN("verbs handshake with peer %s: expected an accept, got type %d with %d "
			  "QPs", hs->peer, m->type, m->nqps);
		return -EPROTO;
	}
	if (check_link_layers(c, m, why, sizeof(why))) {
		RAIL_WARN("connection to peer %s: %s", hs->peer, why);
		return -EPROTO;
	}
	return 0;
}

/* The receiver's eager ring, if it offers one that our staging area can mirror. */
static void sender_eager(struct rail_ib_hs *hs, const struct rail_ib_msg *m)
{
	struct rail_ib_comm *c = hs->comm;

	if (!m->eager_slots)
		return;
	if (m->eager_slots > RAIL_IB_EAGER_SLOTS || m->eager_slot_bytes > RAIL_IB_EAGER_SLOT) {
		RAIL_INFO(RAIL_LOG_NET, "connection to peer %s: its eager ring (%d slots of %u "
			  "bytes) is larger than this build's (%d of %d); small messages wait for "
			  "a clear-to-send", hs->peer, m->eager_slots, m->eager_slot_bytes,
			  RAIL_IB_EAGER_SLOTS, RAIL_IB_EAGER_SLOT);
		return;
	}
	/* Room for a trailer and 64 bytes of payload before the LL region, in 64-byte units. */
	if (m->eager_slot_bytes < RAIL_IB_LL_BYTES + 128 || m->eager_slot_bytes % 64) {
		RAIL_INFO(RAIL_LOG_NET, "connection to peer %s: its eager ring's slots of %u bytes "
			  "are not a multiple of 64 of at least %d; small messages wait for a "
			  "clear-to-send", hs->peer, m->eager_slot_bytes, RAIL_IB_LL_BYTES + 128);
		return;
	}
	c->eager_slots = m->eager_slots;
	c->eager_slot_bytes = m->eager_slot_bytes;
	c->eager_end = m->eager_slot_bytes;	/* until the receiver's choice (credit_refresh) */
	c->eager_max = RAIL_MIN((uint32_t)RAIL_IB_EAGER_MAX,
				m->eager_slot_bytes - RAIL_IB_LL_BYTES - RAIL_IB_EAGER_TRAILER);
	c->remote_ring_addr = m->eager_addr;
	c->remote_want_addr = m->aux_addr;
}

/* Helper thread: QPs, RTR + RTS, then the READY message. */
static int sender_setup(struct rail_ib_hs *hs)
{
	struct rail_ib_comm *c = hs->comm;
	const struct rail_ib_msg *m = &hs->msg;
	struct rail_ib_msg r;
	int err;

	remote_devs(c, m);
	hs->peer_failover = !!(m->flags & RAIL_IB_FLAG_FAILOVER);
	c->remote_cmpl_addr = m->ctrl_addr;
	for (int i = 0; i < m->ndevs; i++)
		c->remote_cmpl_rkey[i] = m->devs[i].ctrl_rkey;
	sender_eager(hs, m);
	memcpy(c->remote_ece, m->ece, sizeof(m->ece[0]) * (size_t)m->nece);
	err = rail_ib_comm_qps_create(c, m->nqps, 1);
	if (!err) {
		rail_ib_comm_ece_query(c, NULL);	/* whether ours have ECE at all */
		err = rail_ib_comm_qps_connect(c, m->qpn);
	}
	if (err)
		return err;
	memset(&r, 0, sizeof(r));
	r.type = RAIL_IB_MSG_READY;
	/* The ECE our QPs settled on with the receiver's, which it then sets on its QPs. */
	r.nece = m->nece ? rail_ib_comm_ece_query(c, r.ece) : 0;
	r.nqps = c->nqps;
	for (int i = 0; i < c->nqps; i++)
		r.qpn[i] = c->qps[i].qp->qp_num;
	r.ctrl_addr = (uintptr_t)c->fifo;
	r.aux_addr = (uintptr_t)(c->fifo + RAIL_IB_CREDIT_OFF);
	r.flags = (int)rail_param_int(RAIL_P_IB_EAGER_ORDER);	/* RAIL_IB_ORDER_* */
	r.tc = c->tc;
	r.sl = c->sl;
	msg_devs(c, &r, 1);
	return hs_put(hs, &r);
}

static int connect_progress(struct rail_ib_hs *hs)
{
	int err;

	for (;;) {
		switch (hs->state) {
		case S_CONNECTING:
			err = rail_sock_connect_done(hs->fd);
			if (err)
				return io_warn(hs, err);
			err = sender_hello(hs);
			if (err)
				return err;
			hs->state = S_SEND_HELLO;
			break;
		case S_SEND_HELLO:
			err = hs_send(hs);
			if (err)
				return err;
			hs_recv_reset(hs);
			hs->state = S_RECV_ACCEPT;
			break;
		case S_RECV_ACCEPT:
			err = hs_recv(hs, &hs->msg);
			if (!err)
				err = sender_check_accept(hs, &hs->msg);
			if (err)
				return err;
			hs_spawn(hs, sender_setup, S_SEND_READY);
			break;
		case HS_WORKING:
			err = hs_wait(hs);
			if (err)
				return err;
			break;
		case S_SEND_READY:
			err = hs_send(hs);
			if (err)
				return err;
			hs->state = HS_DONE;
			return 0;
		default:
			return -EINVAL;
		}
	}
}

static int connect_start(int vdev, const struct rail_conn_opts *opts, const void *handle,
			 struct rail_ib_hs **out)
{
	struct rail_handle h;
	struct rail_ib_hs *hs;
	char why[256];
	int err;

	err = rail_handle_decode(handle, RAIL_HANDLE_SIZE, &h, why, sizeof(why));
	if (err) {
		RAIL_WARN("connect on device %d: %s", vdev, why);
		return err;
	}
	if (h.transport != RAIL_TRANSPORT_IB) {
		RAIL_WARN("connect to %s: the listener uses the %s transport and this process the "
			  "verbs one; set the same NCCL_RAIL_TRANSPORT on every node",
			  RAIL_ADDRSTR(&h.addr), rail_transport_name(h.transport));
		return -EPROTO;
	}
	hs = calloc(1, sizeof(*hs));
	if (!hs)
		return -ENOMEM;
	hs->fd = -1;
	hs->vdev = vdev;
	hs->nonce = h.nonce;
	hs->opts = *opts;
	hs->start_ns = rail_now_ns();
	hs->state = S_CONNECTING;
	rail_sockaddr_str(&h.addr, hs->peer, sizeof(hs->peer));
	if (h.release[0] && strcmp(h.release, RAIL_VERSION_STRING))
		snprintf(hs->release_note, sizeof(hs->release_note), " (the listener runs "
			 "nccl-net-rail %s, this node %s: use one release on every node)", h.release,
			 RAIL_VERSION_STRING);
	/* NCCL_IB_SUBNET_AWARE_ROUTING: on the listener's subnet (ib_subnet.c) */
	hs->comm = comm_new(rail_ib_subnet_connect_dev(vdev, &h, hs->peer), 1, hs->peer, &err);
	if (hs->comm)
		err = rail_sock_connect_start(&h.addr, &hs->fd);
	if (err) {
		if (hs->comm)
			RAIL_WARN("connect to peer %s: %s", hs->peer, RAIL_ERRSTR(err));
		hs_free(hs);
		return err;
	}
	*out = hs;
	return 0;
}

/*
 * The handshake's TCP socket stays open beside the comm: the peer's exit
 * closes it (rail_ib_peer_check sees that), and keepalive with a user
 * timeout of NCCL_RAIL_PEER_TIMEOUT makes it fail when the peer host stops
 * answering (killed, link down, partition): the verbs layer alone may never
 * say so (rxe retries forever at NCCL_IB_RETRY_CNT=7; a side with nothing
 * in flight gets no completion at all). The plugin's watchdog.
 */
static void oob_keep(struct rail_ib_hs *hs)
{
	int liveness = (int)rail_param_int(RAIL_P_PEER_TIMEOUT);

	rail_sock_set_liveness(hs->fd, liveness / 2, liveness);
	hs->comm->oob_fd = hs->fd;
	hs->fd = -1;
	rail_ib_move_arm(hs->comm, hs->peer_failover);	/* the socket also carries moves */
}

int rail_ib_connect(int dev, const struct rail_conn_opts *opts, void *handle,
		    struct rail_comm **send_comm)
{
	struct rail_ib_hs *hs = rail_handle_get_stage(handle);
	int err;

	if (!hs) {
		err = connect_start(dev, opts, handle, &hs);
		if (err)
			return err;
		rail_handle_set_stage(handle, hs);
	}
	err = connect_progress(hs);
	if (err == -EAGAIN && !hs_timed_out(hs))
		return 0;
	rail_handle_set_stage(handle, NULL);
	if (err) {
		hs_free(hs);
		return err == -EAGAIN ? -ETIMEDOUT : err;
	}
	oob_keep(hs);
	*send_comm = &hs->comm->base;
	hs->comm = NULL;
	hs_free(hs);
	return 0;
}

/* ---- receiver ----------------------------------------------------------- */

static int refuse(struct rail_ib_hs *hs, uint32_t code, const char *why)
{
	struct rail_ib_msg m;

	RAIL_WARN("verbs connection from %s refused: %s", hs->peer, why);
	memset(&m, 0, sizeof(m));
	m.type = RAIL_IB_MSG_REFUSE;
	m.refuse_code = code;
	rail_strlcpy(m.text, why, sizeof(m.text));
	hs->state = R_SEND_REFUSE;
	return hs_put(hs, &m);
}

static int receiver_accept_msg(struct rail_ib_hs *hs)
{
	struct rail_ib_comm *c = hs->comm;
	struct rail_ib_msg m;

	memset(&m, 0, sizeof(m));
	m.type = RAIL_IB_MSG_ACCEPT;
	m.flags = rail_param_int(RAIL_P_FAILOVER) ? RAIL_IB_FLAG_FAILOVER : 0;
	m.nqps = c->nqps;
	for (int i = 0; i < c->nqps; i++)
		m.qpn[i] = c->qps[i].qp->qp_num;
	m.ctrl_addr = (uintptr_t)c->cmpl;
	m.tc = c->tc;
	m.sl = c->sl;
	m.nece = rail_ib_comm_ece_query(c, m.ece);	/* NCCL's requestor side */
	if (rail_ib_eager_possible(c)) {
		c->eager_slots = RAIL_IB_EAGER_SLOTS;
		c->eager_slot_bytes = RAIL_IB_EAGER_SLOT;
		c->eager_end = RAIL_IB_EAGER_SLOT;	/* until the protocol's choice */
		c->eager_max = RAIL_IB_EAGER_SLOT - RAIL_IB_LL_BYTES - RAIL_IB_EAGER_TRAILER;
		m.eager_slots = c->eager_slots;
		m.eager_slot_bytes = c->eager_slot_bytes;
		m.eager_addr = (uintptr_t)(c->cmpl + RAIL_IB_RING_OFF);
		m.aux_addr = (uintptr_t)(c->cmpl + RAIL_IB_WANT_OFF);
	}
	msg_devs(c, &m, 1);
	return hs_put(hs, &m);
}

/* Helper thread: QPs (INIT), flush QPs, then the ACCEPT message. */
static int receiver_setup(struct rail_ib_hs *hs)
{
	struct rail_ib_comm *c = hs->comm;
	int err;

	err = rail_ib_comm_qps_create(c, qp_count(c->ndevs, hs->msg.ndevs, hs->msg.qps_per_dev), 0);
	if (!err)
		err = rail_ib_flush_init(c);
	if (err)
		return err;
	return receiver_accept_msg(hs);
}

/*
 * Helper thread: RTR + RTS toward the sender's QPs; then, with an eager
 * ring, its protocol (in-order or order-safe, said in every credit word) and
 * the first credit word: the sender writes into the ring only after
 * it, as a write reaching a QP not yet ready is dropped (and retried only
 * after the QP timeout).
 */
static int receiver_connect(struct rail_ib_hs *hs)
{
	int err = rail_ib_comm_qps_connect(hs->comm, hs->msg.qpn);

	if (!err)
		err = rail_ib_eager_order_setup(hs->comm, hs->msg.flags & RAIL_IB_READY_ORDER_MASK);
	if (!err)
		err = rail_ib_credit_return(hs->comm, RAIL_IB_CREDIT_FORCE);
	return err;
}

static int receiver_on_hello(struct rail_ib_hs *hs, uint64_t nonce, const struct rail_ib_msg *m)
{
	int tc = (int)rail_param_int(RAIL_P_IB_TC), sl = (int)rail_param_int(RAIL_P_IB_SL);
	struct rail_ib_comm *c;
	char why[200];
	int err;

	if (m->type != RAIL_IB_MSG_HELLO) {
		RAIL_WARN("verbs connection from %s: expected a hello, got type %d", hs->peer,
			  m->type);
		return -EPROTO;
	}
	if (m->nonce != nonce) {
		snprintf(why, sizeof(why), "nonce 0x%016llx does not match this listener's: the "
			 "handle is stale (from an earlier listen) or belongs to another "
			 "communicator", (unsigned long long)m->nonce);
		return refuse(hs, RAIL_IB_REFUSE_NONCE, why);
	}
	hs->hello_ok = 1;
	hs->peer_failover = !!(m->flags & RAIL_IB_FLAG_FAILOVER);
	/* NCCL_IB_SUBNET_AWARE_ROUTING: on the connector's subnet (ib_subnet.c) */
	hs->comm = c = comm_new(rail_ib_subnet_accept_dev(hs->vdev, m, hs->peer), 0, hs->peer,
				&err);
	if (!c)
		return err;
	if (check_link_layers(c, m, why, sizeof(why)))
		return refuse(hs, RAIL_IB_REFUSE_LINK_LAYER, why);
	remote_devs(c, m);
	c->tc = tc >= 0 ? tc : m->tc;
	c->sl = sl >= 0 ? sl : m->sl;
	hs_spawn(hs, receiver_setup, R_SEND_ACCEPT);
	return 0;
}

static int receiver_on_ready(struct rail_ib_hs *hs, const struct rail_ib_msg *m)
{
	struct rail_ib_comm *c = hs->comm;

	if (m->type != RAIL_IB_MSG_READY || m->nqps != c->nqps || m->ndevs != c->remote_ndevs) {
		RAIL_WARN("verbs connection from %s: expected ready with %d QPs and %d devices, "
			  "got type %d with %d QPs, %d devices", hs->peer, c->nqps, c->remote_ndevs,
			  m->type, m->nqps, m->ndevs);
		return -EPROTO;
	}
	c->remote_fifo_addr = m->ctrl_addr;
	c->remote_credit_addr = m->aux_addr;
	memcpy(c->remote_ece, m->ece, sizeof(m->ece[0]) * (size_t)m->nece);
	for (int i = 0; i < m->ndevs; i++)
		c->remote_fifo_rkey[i] = m->devs[i].ctrl_rkey;
	hs_spawn(hs, receiver_connect, HS_DONE);
	return 0;
}

/* 0 done, 1 refused and finished, -EAGAIN, or an error. */
static int accept_progress(struct rail_ib_listen *l, struct rail_ib_hs *hs)
{
	int err;

	for (;;) {
		switch (hs->state) {
		case R_RECV_HELLO:
			err = hs_recv(hs, &hs->msg);
			if (!err)
				err = receiver_on_hello(hs, l->nonce, &hs->msg);
			if (err)
				return err;
			break;
		case HS_WORKING:
			err = hs_wait(hs);
			if (err)
				return err;
			if (hs->state == HS_DONE)
				return 0;
			break;
		case R_SEND_ACCEPT:
			err = hs_send(hs);
			if (err)
				return err;
			hs_recv_reset(hs);
			hs->state = R_RECV_READY;
			break;
		case R_RECV_READY:
			err = hs_recv(hs, &hs->msg);
			if (!err)
				err = receiver_on_ready(hs, &hs->msg);
			if (err)
				return err;
			break;
		case R_SEND_REFUSE:
			err = rail_sock_send_nb(hs->fd, hs->buf, hs->len, &hs->off);
			return err == -EAGAIN ? err : 1;
		default:
			return -EINVAL;
		}
	}
}

static void pending_drop(struct rail_ib_listen *l, int i)
{
	hs_free(l->pending[i]);
	l->pending[i] = l->pending[--l->npending];
}

/* 1 when a connection waits in the listen socket's backlog. */
static int backlog_waiting(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
}

/*
 * The list is full and a connection waits: drop the oldest stray (0), or
 * -EAGAIN when none has waited STRAY_GRACE_NS without a hello (the newcomer
 * waits in the backlog).
 */
static int drop_oldest_stray(struct rail_ib_listen *l)
{
	uint64_t now = rail_now_ns();
	int o = -1;

	for (int i = 0; i < l->npending; i++)
		if (!l->pending[i]->hello_ok && l->pending[i]->state == R_RECV_HELLO &&
		    now - l->pending[i]->start_ns >= STRAY_GRACE_NS &&
		    (o < 0 || l->pending[i]->start_ns < l->pending[o]->start_ns))
			o = i;
	if (o < 0)
		return -EAGAIN;
	if (l->dropped++ == 0)
		RAIL_WARN("verbs accept on device %d: dropping the connection from %s, which sent no "
			  "hello in %llu ms, to make room for a waiting one (%d handshakes pending); a "
			  "port scanner or a client of another program? Further drops are logged at "
			  "INFO", l->base.dev, l->pending[o]->peer,
			  (unsigned long long)((rail_now_ns() - l->pending[o]->start_ns) / 1000000),
			  l->npending);
	else
		RAIL_INFO(RAIL_LOG_NET, "verbs accept on device %d: dropped the connection from %s "
			  "(no hello; %lu dropped so far)", l->base.dev, l->pending[o]->peer,
			  l->dropped);
	pending_drop(l, o);
	return 0;
}

/*
 * 0, or -EMFILE/-ENFILE when the process is at its descriptor limit with
 * no stray to drop: waiting does not free one (NCCL opens every connection
 * before it frees any), so accept fails at once, naming the limit.
 */
static int accept_new(struct rail_ib_listen *l)
{
	for (;;) {
		union rail_sockaddr peer;
		struct rail_ib_hs *hs;
		char hint[384];
		int fd = -1, err;

		if (l->npending >= MAX_PENDING &&
		    (!backlog_waiting(l->fd) || drop_oldest_stray(l)))
			return 0;
		err = rail_sock_accept(l->fd, &fd, &peer);
		if ((err == -EMFILE || err == -ENFILE) && l->npending) {
			/* a stray past its grace gives its descriptor back, or a handshake ends */
			(void)drop_oldest_stray(l);
			return 0;
		}
		if (err == -EMFILE || err == -ENFILE) {
			RAIL_WARN("accept of a verbs connection on %s failed: %s; %s",
				  RAIL_ADDRSTR(rail_ib_oob_addr()), RAIL_ERRSTR(err),
				  rail_nofile_hint(hint, sizeof(hint)));
			return err;
		}
		if (err)
			return 0;
		hs = calloc(1, sizeof(*hs));
		if (!hs) {
			close(fd);
			return 0;
		}
		hs->fd = fd;
		hs->vdev = l->base.dev;
		hs->state = R_RECV_HELLO;
		hs->start_ns = rail_now_ns();
		rail_sockaddr_str(&peer, hs->peer, sizeof(hs->peer));
		hs_recv_reset(hs);
		l->pending[l->npending++] = hs;
	}
}

/*
 * Advance every pending handshake once: 1 with *recv_comm, 0, or the error
 * of a real peer (one whose hello carried this listener's nonce). A stray
 * (closed, reset, garbage, silent past NCCL_RAIL_CONNECT_TIMEOUT) or a
 * refused connection is dropped after the one line its failure logged, and
 * accept keeps waiting for the real peer, as the TCP transport does.
 */
static int pending_pass(struct rail_ib_listen *l, struct rail_comm **recv_comm)
{
	for (int i = 0; i < l->npending; i++) {
		struct rail_ib_hs *hs = l->pending[i];
		int err = accept_progress(l, hs), real = hs->hello_ok;

		if (err == -EAGAIN && !hs_timed_out(hs))
			continue;
		if (err == 0) {
			oob_keep(hs);
			*recv_comm = &hs->comm->base;
			hs->comm = NULL;
			pending_drop(l, i);
			return 1;
		}
		pending_drop(l, i--);
		if (err != 1 && real)
			return err == -EAGAIN ? -ETIMEDOUT : err;
	}
	return 0;
}

/* No listener on a port that is down (PORT_ERR): connections to it would fail. */
static int listen_ports_up(int vdev)
{
	const struct rail_ib_vdev *v = rail_ib_vdev_get(vdev);

	for (int m = 0; v && m < v->ndevs; m++) {
		int err = rail_ib_dev_port_up(rail_ib_dev_get(v->devs[m]), "listen", NULL);

		if (err)
			return err;
	}
	return 0;
}

int rail_ib_accept(struct rail_comm *listen_comm, struct rail_comm **recv_comm)
{
	struct rail_ib_listen *l = (struct rail_ib_listen *)listen_comm;
	/* Reap closed and failed strays first: their slots go to waiting connections. */
	int r = pending_pass(l, recv_comm);

	if (r)
		return r < 0 ? r : 0;
	r = accept_new(l);
	if (r)
		return r;
	r = pending_pass(l, recv_comm);
	return r < 0 ? r : 0;
}

int rail_ib_listen(int dev, void *handle, struct rail_comm **listen_comm)
{
	struct rail_ib_listen *l = calloc(1, sizeof(*l));
	struct rail_handle h;
	int err;

	if (!l)
		return -ENOMEM;
	err = listen_ports_up(dev);
	if (err) {
		free(l);
		return err;
	}
	rail_comm_init(&l->base, RAIL_COMM_LISTEN, dev, conn_ops);
	memset(&h, 0, sizeof(h));
	err = rail_sock_listen(rail_ib_oob_addr(), 128, &l->fd, &h.addr);
	if (err) {
		RAIL_WARN("listen on %s for device %d failed: %s; check NCCL_SOCKET_IFNAME",
			  RAIL_ADDRSTR(rail_ib_oob_addr()), dev, RAIL_ERRSTR(err));
		free(l);
		return err;
	}
	l->nonce = rail_random64();
	h.transport = RAIL_TRANSPORT_IB;
	h.nonce = l->nonce;
	rail_ib_subnet_handle(dev, &h);	/* NCCL_IB_SUBNET_AWARE_ROUTING */
	err = rail_handle_encode(&h, handle, RAIL_HANDLE_SIZE);
	if (err) {
		close(l->fd);
		free(l);
		return err;
	}
	*listen_comm = &l->base;
	return 0;
}

int rail_ib_close_listen(struct rail_comm *comm)
{
	struct rail_ib_listen *l = (struct rail_ib_listen *)comm;

	for (int i = 0; i < l->npending; i++)
		atomic_store(&l->pending[i]->cancel, 1);	/* their helpers stop at once, together */
	while (l->npending)
		pending_drop(l, l->npending - 1);
	close(l->fd);
	rail_comm_fini(&l->base);
	free(l);
	return 0;
}
