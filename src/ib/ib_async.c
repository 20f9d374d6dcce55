/*
 * nccl-net-rail: one async-event thread per HCA. Fatal events mark what
 * they hit: DEVICE_FATAL the HCA (every comm on it), CQ_ERR and the QP
 * errors the comm owning the CQ/QP (cq_context/qp_context). Later calls on
 * those comms return an error -- except with failover (ib_move.c), where a
 * comm on a device that reported DEVICE_FATAL, or whose QP reported
 * QP_FATAL (the QP went to error on its own: a transport fault), moves to
 * another device or to new QPs at its next call. QP_REQ_ERR and
 * QP_ACCESS_ERR mean a bad request or key (a bug): they still fail it.
 *
 * PORT_ERR marks the port down: listen, connect and accept on it are
 * refused with a named error (rail_ib_dev_port_up) until PORT_ACTIVE, which
 * re-enables them. It also counts the port's PORT_ERR events (port_downs):
 * every comm took the count when it was made and compares it in
 * rail_ib_comm_check, so the comms on the port fail (or, with failover,
 * move: ib_move.c) at their next call
 * without this thread knowing them (no list, no lock; one load per call).
 *
 * GID_CHANGE: connections resolve their GID when made
 * (rail_ib_dev_gid_resolve), so nothing depends on this event; the thread
 * re-selects the port's GID by the same rules and says old -> new (INFO),
 * or warns that no usable GID is left.
 *
 * DEVICE_SPEED_CHANGE (a RoCE LAG member down or up; Linux 6.19) and
 * PORT_ACTIVE read the port's speed again, so that getProperties reports
 * the speed now (a drop is a WARN). The QP error events' WARN carries the
 * QP's state and PSNs (ibv_query_qp), as NCCL 2.30's does.
 *
 * The thread waits in poll() on the async fd and a wake pipe, so fini
 * stops it at once. After an event that may start or end a move it wakes
 * the move thread (the hook that thread sets: it is above this layer).
 */
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "thread.h"

/*
 * The next device from *i on that port (with NCCL_IB_DATA_DIRECT=2 a port
 * is two devices: its PCIe and its Data Direct entry), or NULL.
 */
static struct rail_ib_dev *port_dev_next(struct rail_ib_hca *hca, int port, int *i)
{
	for (; *i < rail_ib_ndevs_phys(); (*i)++) {
		struct rail_ib_dev *d = rail_ib_dev_get(*i);

		if (d->hca == hca && d->port == port) {
			(*i)++;
			return d;
		}
	}
	return NULL;
}

static struct rail_ib_dev *port_dev(struct rail_ib_hca *hca, int port)
{
	int i = 0;

	return port_dev_next(hca, port, &i);
}

/*
 * What ibv_query_qp says of a QP an error event named, as NCCL 2.30 puts in
 * its WARN (state, sq_psn, rq_psn), with the peer's QP number; *port is the
 * QP's port, 0 when unknown. The event is not acked yet, so the QP cannot
 * be destroyed meanwhile (ibv_destroy_qp waits for it).
 */
static void qp_describe(struct ibv_qp *qp, int *port, char *buf, size_t len)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int ret;

	*port = 0;
	if (!rail_ibv.query_qp) {
		snprintf(buf, len, "state unknown: libibverbs lacks ibv_query_qp");
		return;
	}
	memset(&a, 0, sizeof(a));
	ret = rail_ibv.query_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN |
				IBV_QP_PORT | IBV_QP_DEST_QPN, &ia);
	if (ret) {
		snprintf(buf, len, "state unknown: ibv_query_qp failed: %s",
			 RAIL_ERRSTR(-rail_verbs_err(ret)));
		return;
	}
	*port = a.port_num;
	snprintf(buf, len, "state=%s sq_psn=%u rq_psn=%u, remote qp 0x%x",
		 rail_ibv_qp_state_str((int)a.qp_state), a.sq_psn, a.rq_psn, a.dest_qp_num);
}

static const char *qp_event_name(enum ibv_event_type t)
{
	return t == IBV_EVENT_QP_FATAL ? "QP_FATAL" : t == IBV_EVENT_QP_REQ_ERR ? "QP_REQ_ERR"
						  : "QP_ACCESS_ERR";
}

static void on_qp_event(struct rail_ib_hca *hca, struct ibv_async_event *ev)
{
	struct ibv_qp *qp = ev->element.qp;
	struct rail_ib_comm *c = qp->qp_context;
	enum ibv_event_type t = ev->event_type;
	char at[RAIL_IB_NAME_MAX + 16], st[128];
	int port;

	if (!c || (t != IBV_EVENT_QP_FATAL && t != IBV_EVENT_QP_REQ_ERR &&
		   t != IBV_EVENT_QP_ACCESS_ERR)) {	/* !c: a probe's (ib_probe.c) */
		RAIL_INFO(RAIL_LOG_NET, "%s: async event %s on qp 0x%x", hca->name,
			  rail_ibv_event_str(t), qp->qp_num);
		return;
	}
	qp_describe(qp, &port, st, sizeof(st));
	if (port > 0)
		snprintf(at, sizeof(at), "%s:%d", hca->name, port);
	else
		snprintf(at, sizeof(at), "%s", hca->name);
	if (c->failover && t == IBV_EVENT_QP_FATAL) {
		/* the QP went to error on its own: the path failed, not the plugin */
		atomic_store(&c->qp_event, qp->qp_num + 1);
		RAIL_WARN("%s: async event %s (%s) on qp 0x%x (%s; connection to peer %s): the "
			  "connection moves to new QPs (NCCL_RAIL_FAILOVER)", at, qp_event_name(t),
			  rail_ibv_event_str(t), qp->qp_num, st, c->peer);
		return;
	}
	atomic_store(&c->fatal, (int)t + 1);
	RAIL_WARN("%s: async event %s (%s) on qp 0x%x (%s; connection to peer %s): the "
		  "communicator fails from now on; %s", at, qp_event_name(t),
		  rail_ibv_event_str(t), qp->qp_num, st, c->peer,
		  t == IBV_EVENT_QP_ACCESS_ERR
			  ? "a remote access was refused (bad rkey or buffer freed while registered?)"
			  : "check the link and the peer process");
}

/*
 * Read the speed of port d->port again, by init's rule, into every device
 * entry of the port (with NCCL_IB_DATA_DIRECT=2 a port is two): getProperties
 * reports it from then on, and NCCL asks it again for each communicator it
 * creates (its topology), so later communicators plan with the new speed.
 * A port that is not ACTIVE keeps its speed (a down link has none to read):
 * PORT_ACTIVE reads it again. loud: say so even when nothing changed (the
 * speed event); PORT_ACTIVE is quiet unless the speed changed.
 */
static void speed_reread(struct rail_ib_hca *hca, struct rail_ib_dev *d, const char *why,
			 int loud)
{
	int old = atomic_load(&d->speed), now = 0, state = 0;
	int err = rail_ib_port_speed_read(hca->ctx, d->port, &now, &state);
	int i = (int)(d - rail_ib_dev_get(0));
	struct rail_ib_dev *o;

	if (err) {
		RAIL_WARN("%s:%d: %s: ibv_query_port failed: %s; getProperties keeps reporting "
			  "%d Mbps", hca->name, d->port, why, RAIL_ERRSTR(err), old);
		return;
	}
	if (state != IBV_PORT_ACTIVE) {
		if (loud)
			RAIL_INFO(RAIL_LOG_NET, "%s:%d: %s while the port is not ACTIVE (%s): "
				  "getProperties keeps reporting %d Mbps; the speed is read again "
				  "when the port is ACTIVE", hca->name, d->port, why,
				  rail_ib_port_state_str(state), old);
		return;
	}
	while ((o = port_dev_next(hca, d->port, &i)))
		atomic_store(&o->speed, now);
	if (now < old)
		RAIL_WARN("%s:%d: port speed fell, %d -> %d Mbps (%s): getProperties reports the "
			  "new speed, which communicators created from now on plan with (those "
			  "created before keep their plan). Check the link and, for a bond, its "
			  "members (ibstat, ethtool)", hca->name, d->port, old, now, why);
	else if (now > old)
		RAIL_INFO(RAIL_LOG_NET, "%s:%d: port speed rose, %d -> %d Mbps (%s): getProperties "
			  "reports the new speed to communicators created from now on", hca->name,
			  d->port, old, now, why);
	else if (loud)
		RAIL_INFO(RAIL_LOG_NET, "%s:%d: %s: port speed %d Mbps, unchanged", hca->name,
			  d->port, why, now);
}

/* DEVICE_SPEED_CHANGE names no port (mlx5: port_num 0): every port of the HCA in use. */
static void on_speed_change(struct rail_ib_hca *hca)
{
	int any = 0;

	for (int p = 1; p <= hca->attr.phys_port_cnt; p++) {
		struct rail_ib_dev *d = port_dev(hca, p);

		if (d) {
			speed_reread(hca, d, "async event DEVICE_SPEED_CHANGE", 1);
			any = 1;
		}
	}
	if (!any)
		RAIL_INFO(RAIL_LOG_NET, "%s: async event DEVICE_SPEED_CHANGE (no port of it is "
			  "used by this process)", hca->name);
}

static void on_port_event(struct rail_ib_hca *hca, const struct ibv_async_event *ev)
{
	int i = 0;
	struct rail_ib_dev *d = port_dev_next(hca, ev->element.port_num, &i), *o;
	int down = ev->event_type == IBV_EVENT_PORT_ERR;

	if (!d) {
		RAIL_INFO(RAIL_LOG_NET, "%s:%d: async event %s (a port this process does not use)",
			  hca->name, ev->element.port_num, rail_ibv_event_str(ev->event_type));
		return;
	}
	if (down) {
		/*
		 * The flag, then the count: a comm being made takes the count, then
		 * reads the flag (rail_ib_comm_res_init). With the old count it fails
		 * at its next call; with the new one it sees the flag and is refused.
		 */
		for (o = d; o; o = port_dev_next(hca, d->port, &i)) {
			atomic_store(&o->up_ns, 0);
			atomic_store(&o->port_err, 1);
			atomic_fetch_add(&o->port_downs, 1);
		}
		RAIL_WARN("%s:%d: async event PORT_ERR (%s): the port went down; communicators "
			  "using it %s at their next call, and new connections on it are refused "
			  "until it is ACTIVE again. Check the link (ibstat, ip link, the switch "
			  "port)", hca->name, d->port, rail_ibv_event_str(ev->event_type),
			  rail_param_int(RAIL_P_FAILOVER)
				  ? "move to another port (NCCL_RAIL_FAILOVER=1; a fused NIC's member to a "
				    "surviving member first)"
				  : "fail");
		return;
	}
	for (o = d; o; o = port_dev_next(hca, d->port, &i)) {
		atomic_store(&o->port_err, 0);
		atomic_store(&o->up_ns, rail_now_ns());	/* a flap starts the hold-down again */
	}
	if (rail_param_int(RAIL_P_FAILOVER))
		RAIL_INFO(RAIL_LOG_NET, "%s:%d: port ACTIVE again: new connections on it are "
			  "accepted; communicators that moved away move back once it has stayed up "
			  "for NCCL_RAIL_FAILOVER_HOLDDOWN=%lld s", hca->name, d->port,
			  (long long)rail_param_int(RAIL_P_FAILOVER_HOLDDOWN));
	else
		RAIL_INFO(RAIL_LOG_NET, "%s:%d: port ACTIVE again: new connections on it are "
			  "accepted (communicators that failed with it stay failed)", hca->name,
			  d->port);
	/* the link may have come back at another speed (no DEVICE_SPEED_CHANGE before Linux 6.19) */
	speed_reread(hca, d, "async event PORT_ACTIVE", 0);
}

static void on_gid_change(struct rail_ib_dev *d)
{
	struct rail_ib_gid_choice now;
	char og[64], ng[64];

	if (rail_ib_dev_gid_resolve(d, &now)) {
		RAIL_WARN("%s:%d: GID table changed and no usable GID is left (%s); new "
			  "connections on this port fail until the interface has an address again; "
			  "connections made before keep GID index %d %s", d->hca->name, d->port,
			  now.reason, d->gid.index, rail_ib_gid_str(d->gid.raw, og, sizeof(og)));
		return;
	}
	if (now.index == d->gid.index && !memcmp(now.raw, d->gid.raw, 16)) {
		RAIL_INFO(RAIL_LOG_NET, "%s:%d: GID table changed; the GID chosen stays index %d %s",
			  d->hca->name, d->port, now.index,
			  rail_ib_gid_str(now.raw, ng, sizeof(ng)));
		return;
	}
	RAIL_INFO(RAIL_LOG_NET, "%s:%d: GID table changed: index %d %s -> index %d %s (%s); new "
		  "connections use the new GID, connections made before keep theirs",
		  d->hca->name, d->port, d->gid.index, rail_ib_gid_str(d->gid.raw, og, sizeof(og)),
		  now.index, rail_ib_gid_str(now.raw, ng, sizeof(ng)), now.reason);
	d->gid = now;
}

int rail_ib_dev_port_up(const struct rail_ib_dev *dev, const char *call, const char *peer)
{
	if (rail_likely(!atomic_load(&dev->port_err)))
		return 0;
	RAIL_WARN("%s%s%s on %s:%d refused: the port is down (async event PORT_ERR, no "
		  "PORT_ACTIVE since); new connections on it work again once it is ACTIVE. Check "
		  "the link (ibstat, ip link, the switch port), or leave the port out with "
		  "NCCL_IB_HCA", call, peer ? " for peer " : "", peer ? peer : "", dev->hca->name,
		  dev->port);
	return -ENETDOWN;
}

/* The move thread's wake-up (rail_ib_async_hook_set): it looks at its comms once. */
static void (*_Atomic move_hook)(void);

void rail_ib_async_hook_set(void (*fn)(void))
{
	atomic_store(&move_hook, fn);
}

static void move_notify(enum ibv_event_type t)
{
	void (*fn)(void) = atomic_load(&move_hook);

	if (fn && (t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_PORT_ACTIVE ||
		   t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_QP_FATAL))
		fn();
}

static void handle_event(struct rail_ib_hca *hca, struct ibv_async_event *ev)
{
	struct rail_ib_dev *d;

	/* (int): older verbs.h have no enumerator for DEVICE_SPEED_CHANGE (-Wswitch) */
	switch ((int)ev->event_type) {
	case IBV_EVENT_DEVICE_FATAL:
		atomic_store(&hca->fatal, 1);
		RAIL_WARN("%s: async event %s: the device failed; every communicator on it %s "
			  "(check dmesg and the adapter firmware)", hca->name,
			  rail_ibv_event_str(ev->event_type), rail_param_int(RAIL_P_FAILOVER)
			  ? "moves to another device at its next call (NCCL_RAIL_FAILOVER=1)"
			  : "fails from now on");
		break;
	case IBV_EVENT_CQ_ERR: {
		struct rail_ib_comm *c = ev->element.cq->cq_context;

		if (c)
			atomic_store(&c->fatal, (int)ev->event_type + 1);
		RAIL_WARN("%s: async event %s (completion queue overrun?) on a connection to peer "
			  "%s: the communicator fails from now on", hca->name,
			  rail_ibv_event_str(ev->event_type), c ? c->peer : "?");
		break;
	}
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		on_qp_event(hca, ev);
		break;
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_PORT_ACTIVE:
		on_port_event(hca, ev);
		break;
	case IBV_EVENT_GID_CHANGE:
		d = port_dev(hca, ev->element.port_num);
		if (d) {
			struct rail_ib_dev *o;
			int i = (int)(d - rail_ib_dev_get(0)) + 1;

			on_gid_change(d);
			/* the port's Data Direct entry: the same GID */
			while ((o = port_dev_next(hca, d->port, &i)))
				o->gid = d->gid;
		} else
			RAIL_INFO(RAIL_LOG_NET, "%s:%d: GID table changed (a port this process does "
				  "not use)", hca->name, ev->element.port_num);
		break;
	case RAIL_IBV_EVENT_DEVICE_SPEED_CHANGE:
		on_speed_change(hca);
		break;
	default:
		RAIL_INFO(RAIL_LOG_NET, "%s: async event %s", hca->name,
			  rail_ibv_event_str(ev->event_type));
		break;
	}
}

static void *async_main(void *arg)
{
	struct rail_ib_hca *hca = arg;
	struct pollfd fds[2] = {
		{ .fd = hca->ctx->async_fd, .events = POLLIN },
		{ .fd = hca->async_wake[0], .events = POLLIN },
	};

	rail_thread_name("rail-ev-%s", hca->name);
	for (;;) {
		struct ibv_async_event ev;

		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			RAIL_WARN("%s: async event thread: poll failed: %s; stopping it", hca->name,
				  RAIL_ERRSTR(-errno));
			break;
		}
		if (fds[1].revents)
			break;
		if (!(fds[0].revents & POLLIN))
			continue;
		if (rail_ibv.get_async_event(hca->ctx, &ev))
			continue;	/* EAGAIN: the fd is non-blocking */
		handle_event(hca, &ev);
		move_notify(ev.event_type);
		rail_ibv.ack_async_event(&ev);
	}
	return NULL;
}

int rail_ib_async_start(struct rail_ib_hca *hca)
{
	int flags = fcntl(hca->ctx->async_fd, F_GETFL);
	int err;

	if (flags < 0 || fcntl(hca->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -errno;
	if (pipe2(hca->async_wake, O_CLOEXEC))
		return -errno;
	err = pthread_create(&hca->async_thread, NULL, async_main, hca);
	if (err) {
		close(hca->async_wake[0]);
		close(hca->async_wake[1]);
		hca->async_wake[0] = hca->async_wake[1] = -1;
		return -err;
	}
	hca->async_started = 1;
	return 0;
}

void rail_ib_async_stop(struct rail_ib_hca *hca)
{
	if (hca->async_started) {
		ssize_t n;

		do {
			n = write(hca->async_wake[1], "x", 1);
		} while (n < 0 && errno == EINTR);
		pthread_join(hca->async_thread, NULL);
		hca->async_started = 0;
	}
	for (int i = 0; i < 2; i++) {
		if (hca->async_wake[i] >= 0)
			close(hca->async_wake[i]);
		hca->async_wake[i] = -1;
	}
}
