/*
 * nccl-net-rail: a verbs comm's move to another path (failover; layer 4.2
 * of src/ib/, ib.h; the design: docs/FAILOVER.md).
 *
 * When a comm's path fails -- its port went down (PORT_ERR), or a
 * completion says the path is gone (retry exceeded, flushed) -- the comm
 * is not failed. It moves: both sides stop posting, drain their old QPs,
 * build new QPs (on another NIC when their own port is down, else on the
 * same one), and tell each other, over the handshake socket every comm
 * keeps, where they are; then each posts again exactly what the old path
 * lost. NCCL sees a delay: isend/irecv say "not now" and test() says "not
 * done" while the move runs.
 *
 *   side A (its port failed)                side B (joins when it reads MOVE)
 *   fence: QPs to error, drain marks
 *   drain: poll until every mark came back
 *   rebuild on the fallback device
 *   MOVE {device, QPNs, state}  ------->    fence, drain, read the MOVE, rebuild
 *                                           (its own device, or the one on the
 *                                           peer's new network: follow_peer)
 *                               <-------    MOVE {device, QPNs, state}
 *   RTR+RTS to the peer's QPNs; the receiver posts its receive WRs
 *   MOVE_READY                  <------>    MOVE_READY
 *   the receiver writes every unanswered CTS again (new rkeys) and its
 *   credit word; the sender writes again the eager messages the receiver
 *   did not see and, CTS by CTS as they arrive, the pieces whose answers
 *   the receiver did not poll (rail_ib_send_*, rail_ib_recv_replay_*).
 *
 * Why nothing arrives twice: after the drain no old QP places anything;
 * the receiver's ans_next per QP says exactly which answers it polled, and
 * its eager counts which messages it saw; only the rest is written again,
 * into the same buffers, which NCCL has not been given back (a receive
 * completes only when its answers were polled). A write from the old path
 * that landed partly is overwritten with the same bytes.
 *
 * Fused NICs (several member devices on either side, NCCL's makeVDevice):
 * the move is per comm, not per member. The whole comm fences (every
 * member's QPs and flush QP) and drains, then EVERY member is rebuilt: a
 * member whose port is down moves to a target of its own (its home if that
 * is up, else the nearest surviving member's device of this comm, as NCCL
 * fails over inside the fused NIC, else the fallback device), the others
 * are rebuilt on their own device. MOVE carries every member's device and
 * every QPN; each QP keeps its local and remote member (QP i: member
 * i % ndevs, the peer's i % remote_ndevs, as at connect). Registrations
 * follow member by member (rail_ib_comm_mh_rehome: a slot whose member
 * stayed on its HCA, or moved to another port of it, is kept). Each member
 * has its own home, and the comm moves back once every member that is away
 * has had its home up for the hold-down.
 *
 * Triggers: PORT_ERR on either side, completion errors (retry exceeded:
 * the HCA's own transport watchdog; flushed), QP_FATAL, DEVICE_FATAL, and
 * the stall watchdog (ib_engine.c: completions owed, none for
 * NCCL_RAIL_IB_STALL_TIMEOUT; the port is up, so new QPs on the same one).
 * A dead device completes nothing: when a member's HCA is dead the side
 * does not drain but writes off every completion its queues owed
 * (rail_ib_comm_write_off), which the replay covers as it covers flushed
 * ones, since what is written again is decided by the receiver's record,
 * not by the sender's completions. QP_REQ_ERR and QP_ACCESS_ERR (a bug)
 * still fail the comm. The new QPs' RTR and RTS run on the move thread
 * (rail_ib_move_work: RTR on RoCE resolves the peer's address in the
 * kernel, up to a second), never on NCCL's proxy thread, whose calls see a
 * move under way meanwhile.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "zmem.h"
#include "sock.h"

#define DRAIN_NS (5ull * 1000000000ull)
#define QUIET_NS (200ull * 1000000ull)	/* drain by time: a mark the provider refused */
#define MOVES_NS (60ull * 1000000000ull)	/* at most 4 moves of a comm in this time */
#define LOOK_NS (10ull * 1000000ull)	/* a probe due: the socket read this often on a tick */
#define POLL_NS (10ull * 1000000ull)	/* a drain or a replay wants a look this often */

enum mv_state { MV_DRAIN, MV_XCHG, MV_RTR, MV_READY };
enum { RTR_NONE, RTR_PENDING, RTR_DONE };

struct rail_ib_move {
	enum mv_state state;
	int reason;			/* RAIL_IB_MOVE_* */
	char why[320];
	uint64_t start_ns, deadline_ns;
	int refused_marks;
	int path;			/* a path failure with every port of this side up */
	int avoid;			/* ... the second within MOVES_NS: leave the device */
	unsigned dead;			/* members whose HCA is dead (DEVICE_FATAL): written off */
	int written_off;		/* completions the old queues owed, counted as flushed */
	struct rail_ib_dev *from[RAIL_MAX_VDEV_DEVS], *to[RAIL_MAX_VDEV_DEVS];
	char from_s[160], to_s[160];	/* the members, "mlx5_0:1+mlx5_0:2" */
	struct rail_ib_old old;
	struct rail_ib_msg peer;	/* its MOVE */
	int have_move, have_ready;
	int follows;			/* to is where the peer went (follow_peer) */
	atomic_int rtr;			/* RTR_*: the move thread connects the new QPs (MV_RTR) */
	int rtr_err;			/* ... its result, once RTR_DONE */
	char fb_why[160];		/* which rule chose a fallback device (ib_move_rules.c) */
};

static int is_send(const struct rail_ib_comm *c)
{
	return c->base.kind == RAIL_COMM_SEND;
}

static void why_add(struct rail_ib_move *mv, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Add to why the move is made (mv->why, for both sides' move lines). */
static void why_add(struct rail_ib_move *mv, const char *fmt, ...)
{
	size_t len = strlen(mv->why);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(mv->why + len, sizeof(mv->why) - len, fmt, ap);
	va_end(ap);
}

/* "mlx5_0:1+mlx5_0:2": the devices v[k] for k < n with bit k of mask. */
static void devs_str(struct rail_ib_dev *const *v, int n, unsigned mask, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int k = 0; k < n && off < len; k++) {
		int w;

		if (!(mask & (1u << k)) || !v[k])
			continue;
		w = snprintf(buf + off, len - off, "%s%s:%d", off ? "+" : "", v[k]->hca->name,
			     v[k]->port);
		off += w > 0 ? (size_t)w : 0;
	}
}

/*
 * A path failed (a completion error, the stall watchdog, QP_FATAL) while
 * every port of this side is up: the first time the comm gets new QPs on
 * the same devices (a switch that dropped the path briefly); a second time
 * within MOVES_NS it leaves them for a survivor's or the fallback device
 * (a fault in the fabric behind the port). Such a move has no move-back of
 * its own (the port never went down): a later PORT_ACTIVE of the device
 * starts its hold-down.
 */
static int path_failed_here(const struct rail_ib_comm *c, int trigger)
{
	return (trigger == RAIL_IB_TRIG_WC || trigger == RAIL_IB_TRIG_STALL ||
		trigger == RAIL_IB_TRIG_QP) && !rail_ib_own_port_down(c);
}

/*
 * At the end of such a move: it counts as a failed path only if the peer's
 * side does not explain it (the peer joined, or its path failed too); a
 * completion error that the peer's own port, device or move back caused
 * (its QPs went to error first) does not.
 */
static int path_reason(int reason)
{
	return reason == RAIL_IB_MOVE_WC_ERR || reason == RAIL_IB_MOVE_STALL ||
	       reason == RAIL_IB_MOVE_QP;
}

static int explained(int reason)
{
	return reason == RAIL_IB_MOVE_PORT_ERR || reason == RAIL_IB_MOVE_FATAL ||
	       reason == RAIL_IB_MOVE_BACK;
}

static void path_fail_note(struct rail_ib_comm *c, const struct rail_ib_move *mv, int peer_reason)
{
	if ((mv->path || path_reason(peer_reason)) && !explained(peer_reason) &&
	    !explained(mv->reason))
		c->path_fail_ns = mv->start_ns;
}

/*
 * The joining side, with the peer's MOVE before its rebuild: a path failure
 * on the peer's side, the second of the comm within MOVES_NS, takes this
 * side off its devices too (which side's port sits behind the fault is not
 * known; both leave). Returns 1 if it changed where this side goes.
 */
static int avoid_with_peer(struct rail_ib_comm *c, struct rail_ib_move *mv)
{
	struct rail_ib_dev *to[RAIL_MAX_VDEV_DEVS];

	if (mv->avoid || !path_reason(mv->peer.move.reason) || !c->path_fail_ns ||
	    mv->start_ns - c->path_fail_ns >= MOVES_NS)
		return 0;
	for (int m = 0; m < c->ndevs; m++) {
		to[m] = rail_ib_pick_target(c, m, 1, mv->fb_why, sizeof(mv->fb_why));
		if (!to[m])
			return 0;	/* nowhere else: as the peer asked, on these devices */
	}
	mv->avoid = 1;
	memcpy(mv->to, to, sizeof(to[0]) * (size_t)c->ndevs);
	devs_str(mv->to, c->ndevs, ~0u, mv->to_s, sizeof(mv->to_s));
	why_add(mv, "; the path failed again within %llu s: off the device",
		MOVES_NS / 1000000000ull);
	return 1;
}


/* ---- following the peer to its rail --------------------------------------------- */

/*
 * Where a side that has the peer's MOVE before its rebuild goes, given
 * where it would go (to: pick_target). On a rail-only fabric (NIC i of
 * every node reaches only NIC i of the others, a network per rail) the
 * peer's new device may be on another rail than to. Networks by GID
 * (rail_ib_gid_net: the interface's prefix for RoCE, the subnet prefix for
 * InfiniBand). Rule: to, if it is on the peer's network; else the usable
 * port (ACTIVE, same link layer) on that network nearest to `to` (the
 * fallback rule); else to (no local device is on it: a routed fabric, or
 * one where every address has its own subnet, may still join them; a
 * rail-only one fails at RTR, named). Only for a comm made within one
 * network (one_net: its device on the network of the peer's, as seen at its
 * first move): one made across networks shows that the fabric routes
 * between them. Where all devices share one network (one switch) nothing
 * changes.
 */
static struct rail_ib_dev *follow_peer(struct rail_ib_comm *c, struct rail_ib_dev *to)
{
	struct rail_ib_move *mv = c->mv;
	const struct rail_ib_wire_dev *p = &mv->peer.devs[0];
	struct rail_ib_gid_net net, best_net;
	struct rail_ib_dev *best;
	char g[64], n[80];

	/* a comm made across networks: the fabric routes between them, nothing to follow */
	if (!c->one_net || p->link_layer != to->link_layer || rail_ib_dev_reaches(to, p->gid, &net))
		return to;
	best = rail_ib_dev_on_net(to, p->gid, &best_net);
	rail_ib_gid_str(p->gid, g, sizeof(g));
	if (!best) {
		RAIL_INFO(RAIL_LOG_NET, "connection to peer %s (%s comm): the peer moved to GID %s, "
			  "and no usable local port is on its network (%s:%d is on %s); it stays: a "
			  "routed fabric joins them, on a rail-only one the RTR fails", c->peer,
			  is_send(c) ? "send" : "receive", g, to->hca->name, to->port,
			  rail_ib_gid_net_str(&net, n, sizeof(n)));
		return to;
	}
	why_add(mv, "; follows the peer to %s", rail_ib_gid_net_str(&best_net, n, sizeof(n)));
	mv->follows = 1;
	return best;
}

/* ---- messages on the handshake socket ----------------------------------------- */

static int tx_put(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	if (rail_ib_chan_put(c, m))
		return rail_ib_protocol_error(c, 0, "cannot encode a move message");
	return 0;
}

static int is_probe_msg(int type)
{
	return type == RAIL_IB_MSG_PROBE || type == RAIL_IB_MSG_PROBE_ACK ||
	       type == RAIL_IB_MSG_PROBE_DONE;
}

/*
 * The next message of the move: 0 with *m, -EAGAIN, or an error (logged).
 * A probe's, read meanwhile, is dropped: a move ends any probe, on both
 * sides (each side's move starts with it).
 */
static int rx_msg(struct rail_ib_comm *c, struct rail_ib_msg *m)
{
	int err;

	while (!(err = rail_ib_chan_recv(c, m)) && is_probe_msg(m->type))
		;
	return err;
}

/* ---- the steps ---------------------------------------------------------------- */

static const char *reason_text(int reason)
{
	switch (reason) {
	case RAIL_IB_MOVE_PORT_ERR: return "PORT_ERR";
	case RAIL_IB_MOVE_WC_ERR: return "completion error";
	case RAIL_IB_MOVE_PEER: return "joins the peer's move";
	case RAIL_IB_MOVE_FATAL: return "DEVICE_FATAL";
	case RAIL_IB_MOVE_QP: return "QP_FATAL";
	case RAIL_IB_MOVE_STALL: return "stall";
	default: return "move back";
	}
}

/* Members whose HCA reported DEVICE_FATAL (bit m: member m). */
static unsigned dead_members(const struct rail_ib_comm *c)
{
	unsigned dead = 0;

	for (int m = 0; m < c->ndevs; m++)
		dead |= (unsigned)(atomic_load(&c->res[m].dev->hca->fatal) != 0) << m;
	return dead;
}

/*
 * Why this side moves (mv->why): its members whose devices died or whose
 * ports are down, a QP that failed, homes back, or the trigger.
 */
static void move_why(struct rail_ib_comm *c, struct rail_ib_move *mv, int trigger)
{
	unsigned down = 0, back = 0;
	char s[112];

	for (int m = 0; m < c->ndevs; m++) {
		down |= (unsigned)rail_ib_member_down(c, m) << m;
		back |= (unsigned)(mv->to[m] == c->home[m] && mv->to[m] != mv->from[m]) << m;
	}
	if (mv->dead) {
		devs_str(mv->from, c->ndevs, mv->dead, s, sizeof(s));
		snprintf(mv->why, sizeof(mv->why), "DEVICE_FATAL on %s", s);
	} else if (trigger == RAIL_IB_TRIG_QP && !down) {
		snprintf(mv->why, sizeof(mv->why), "QP_FATAL on %.100s qp 0x%x", mv->from_s,
			 atomic_load(&c->qp_event) - 1);
	} else if (down) {
		devs_str(mv->from, c->ndevs, down, s, sizeof(s));
		snprintf(mv->why, sizeof(mv->why), "PORT_ERR on %s", s);
	} else if (back && rail_ib_home_verified(c)) {
		devs_str(mv->to, c->ndevs, back, s, sizeof(s));
		snprintf(mv->why, sizeof(mv->why), "the probe of the way home to %s passed", s);
	} else if (back) {
		devs_str(mv->to, c->ndevs, back, s, sizeof(s));
		snprintf(mv->why, sizeof(mv->why), "%s ACTIVE again for %lld s", s,
			 (long long)rail_ib_home_up_s(c));
	} else {
		snprintf(mv->why, sizeof(mv->why), "%s", reason_text(mv->reason));
	}
}

static int peer_move_check(struct rail_ib_comm *c, const struct rail_ib_msg *m);

/*
 * Where each member goes (mv->to) and why (mv->why); the first member with
 * nowhere to go, or -1.
 */
static int move_plan(struct rail_ib_comm *c, struct rail_ib_move *mv, int trigger)
{
	int nowhere = -1;

	mv->path = path_failed_here(c, trigger);
	/* not just after a probe found the way home working: the peer's move back fenced */
	mv->avoid = mv->path && !rail_ib_home_verified(c) && c->path_fail_ns &&
		    mv->start_ns - c->path_fail_ns < MOVES_NS;
	for (int m = 0; m < c->ndevs; m++) {
		mv->from[m] = c->res[m].dev;
		mv->to[m] = rail_ib_pick_target(c, m, mv->avoid, mv->fb_why, sizeof(mv->fb_why));
		if (!mv->to[m] && nowhere < 0)
			nowhere = m;
	}
	devs_str(mv->from, c->ndevs, ~0u, mv->from_s, sizeof(mv->from_s));
	devs_str(mv->to, c->ndevs, ~0u, mv->to_s, sizeof(mv->to_s));
	if (!c->epoch && c->ndevs == 1) {
		struct rail_ib_gid_net net;

		/* both as made */
		c->one_net = rail_ib_dev_reaches(c->res[0].dev, c->remote[0].gid, &net);
	}
	mv->dead = dead_members(c);
	move_why(c, mv, trigger);
	if (mv->avoid)
		why_add(mv, ", again within %llu s with the port up: off the device",
			MOVES_NS / 1000000000ull);
	return nowhere;
}

/* peer: the peer's MOVE, read before this side's move started (it joins), or NULL. */
static int move_start(struct rail_ib_comm *c, int trigger, const struct rail_ib_msg *peer)
{
	struct rail_ib_move *mv = calloc(1, sizeof(*mv));
	int nowhere;

	if (!mv)
		return -ENOMEM;
	c->mv = mv;
	mv->start_ns = rail_now_ns();
	mv->deadline_ns = mv->start_ns + DRAIN_NS;
	mv->reason = trigger == RAIL_IB_TRIG_PORT ? RAIL_IB_MOVE_PORT_ERR
		     : trigger == RAIL_IB_TRIG_WC ? RAIL_IB_MOVE_WC_ERR
		     : trigger == RAIL_IB_TRIG_FATAL ? RAIL_IB_MOVE_FATAL
		     : trigger == RAIL_IB_TRIG_QP ? RAIL_IB_MOVE_QP
		     : trigger == RAIL_IB_TRIG_STALL ? RAIL_IB_MOVE_STALL
		     : trigger == RAIL_IB_TRIG_BACK ? RAIL_IB_MOVE_BACK : RAIL_IB_MOVE_PEER;
	if (peer) {
		if (peer_move_check(c, peer))
			return -EPROTO;
		mv->peer = *peer;
		mv->have_move = 1;
	}
	rail_ib_probe_stop(c);	/* the peer's move stops its side's */
	nowhere = move_plan(c, mv, trigger);
	/* a path that keeps failing (a flapping link, a fabric fault both ports survive) */
	if (c->move_ns[c->epoch % 4] && mv->start_ns - c->move_ns[c->epoch % 4] < MOVES_NS) {
		RAIL_WARN("connection to peer %s (%s comm) on %s: %s, its 5th move within %llu s; "
			  "the path keeps failing and the connection fails. Check the links and the "
			  "switch ports (ibstat, ip link, the fabric's error counters)", c->peer,
			  is_send(c) ? "send" : "receive", mv->from_s, mv->why,
			  MOVES_NS / 1000000000ull);
		return -ENETDOWN;
	}
	c->move_ns[c->epoch % 4] = mv->start_ns;
	if (nowhere >= 0) {
		const struct rail_ib_dev *d = mv->from[nowhere];

		RAIL_WARN("connection to peer %s (%s comm) on %s: %s, and no other usable port "
			  "(ACTIVE, %s) is left to move %s:%d to; the connection fails. Check the "
			  "links (ibstat, ip link) and NCCL_IB_HCA", c->peer,
			  is_send(c) ? "send" : "receive", mv->from_s, mv->why,
			  rail_link_layer_str(d->link_layer), d->hca->name, d->port);
		return -ENETDOWN;
	}
	rail_flight_note(&c->base.fl, RAIL_FEV_STATE, c->qps[0].qp->qp_num, (int32_t)c->epoch,
			 "move started");
	c->path_failed = 0;
	c->stall_ns = 0;	/* the stall watchdog starts again on the new QPs */
	atomic_store(&c->qp_event, 0);	/* every QP is replaced */
	if (mv->dead)
		mv->written_off = rail_ib_comm_write_off(c, mv->dead);
	else
		mv->refused_marks = rail_ib_comm_fence(c);
	mv->state = MV_DRAIN;
	return 0;
}

/* The state a MOVE carries (struct rail_ib_move_state). */
static void move_state(struct rail_ib_comm *c, struct rail_ib_move_state *s)
{
	memset(s, 0, sizeof(*s));
	s->epoch = c->epoch + 1;
	s->role = is_send(c) ? 0 : 1;
	s->reason = (uint8_t)c->mv->reason;
	if (is_send(c)) {
		s->seq = c->seq;
		s->e_seen = c->e_sent;
		return;
	}
	s->seq = c->cts_next;
	/* order-safe: an immediate polled places every message before it (LL images) */
	s->e_seen = c->eager_safe && rail_ib_before(c->e_seen, c->e_placed) ? c->e_placed
									    : c->e_seen;
	s->e_head = c->e_head;
	s->nans = c->nqps;
	for (int q = 0; q < c->nqps; q++)
		s->ans[q] = c->qps[q].ans_next;
}

/*
 * Before the rebuild: the peer's MOVE, if its bytes are on the socket (this
 * side joins the peer's move, the usual case; or both moved at once and the
 * peer's came first), so that this side rebuilds where it reaches the peer
 * (follow_peer). 0 read or nothing there (this side's MOVE goes first, the
 * peer's is read after it, as before), -EAGAIN part of it is here, or an
 * error. The first message of a move is always the MOVE: MOVE_READY comes
 * only after the other side's MOVE.
 */
static int peer_move_early(struct rail_ib_comm *c)
{
	struct rail_ib_move *mv = c->mv;
	int err;

	if (!mv->have_move) {
		err = rx_msg(c, &mv->peer);
		if (err == -EAGAIN && !rail_ib_chan_partial(c))
			return 0;
		if (!err)
			err = peer_move_check(c, &mv->peer);
		if (err)
			return err;
		mv->have_move = 1;
	}
	(void)avoid_with_peer(c, mv);
	if (c->ndevs == 1 && c->remote_ndevs == 1) {	/* fused comms keep their members' rails */
		mv->to[0] = follow_peer(c, mv->to[0]);
		devs_str(mv->to, c->ndevs, ~0u, mv->to_s, sizeof(mv->to_s));
	}
	return 0;
}

/*
 * Before the rebuild: a target whose port went down or whose HCA died since
 * the move was planned (the card of the other port failing too, say) is
 * replaced as the plan chose it, or the move fails, named, when none is left.
 */
static int retarget(struct rail_ib_comm *c, struct rail_ib_move *mv)
{
	int changed = 0;

	for (int k = 0; k < c->ndevs; k++) {
		const struct rail_ib_dev *was = mv->to[k];

		if (!rail_ib_dev_down(was))
			continue;
		mv->to[k] = rail_ib_pick_target(c, k, mv->avoid, mv->fb_why, sizeof(mv->fb_why));
		if (!mv->to[k]) {
			RAIL_WARN("connection to peer %s (%s comm) on %s: %s; %s:%d, where it was "
				  "moving, went down too, and no other usable port (ACTIVE, %s) is "
				  "left; the connection fails. Check the links (ibstat, ip link) and "
				  "NCCL_IB_HCA", c->peer, is_send(c) ? "send" : "receive", mv->from_s,
				  mv->why, was->hca->name, was->port,
				  rail_link_layer_str(was->link_layer));
			return -ENETDOWN;
		}
		changed = 1;
	}
	if (changed) {
		devs_str(mv->to, c->ndevs, ~0u, mv->to_s, sizeof(mv->to_s));
		why_add(mv, "; the first target went down during the move");
	}
	return 0;
}

/* Drained: build the new path and say so (MOVE). 0, -EAGAIN, or an error. */
static int step_drain(struct rail_ib_comm *c)
{
	struct rail_ib_move *mv = c->mv;
	struct rail_ib_msg m;
	uint64_t now;
	int err;

	if (!mv->dead && (mv->dead = dead_members(c))) {
		/* a device died during the drain: its marks will never come back */
		mv->written_off = rail_ib_comm_write_off(c, mv->dead);
		move_why(c, mv, RAIL_IB_TRIG_FATAL);
	}
	err = mv->dead ? 0 : rail_ib_poll(c);	/* a dead device's CQ is not read */
	if (err)
		return err;
	now = rail_now_ns();
	/*
	 * A provider that does not flush receive WRs posted in the error state
	 * (rxe on Linux 6.1): once the send queues drained, the receive queues
	 * had QUIET_NS in the error state, in which no completion is made, with
	 * the CQ polled throughout: every answer that arrived was polled.
	 */
	if (c->marks_left > 0 && c->marks_left == c->rq_marks_left &&
	    now - mv->start_ns >= QUIET_NS) {
		RAIL_INFO(RAIL_LOG_NET, "connection to peer %s on %s: %d receive-queue drain "
			  "marks not flushed after %llu ms (the provider does not flush receive WRs "
			  "of a QP in error); the send queues drained, going on", c->peer,
			  mv->from_s, c->rq_marks_left,
			  QUIET_NS / 1000000ull);
		c->marks_left = c->rq_marks_left = 0;
	}
	if (c->marks_left > 0 || (mv->refused_marks && now - mv->start_ns < QUIET_NS)) {
		if (now < mv->deadline_ns)
			return -EAGAIN;
		RAIL_WARN("connection to peer %s on %s: the old QPs did not drain within %llu s "
			  "(%d drain marks outstanding, %d of them on receive queues); the connection "
			  "fails", c->peer, mv->from_s,
			  DRAIN_NS / 1000000000ull, c->marks_left, c->rq_marks_left);
		return -ETIMEDOUT;
	}
	err = retarget(c, mv);
	if (!err)
		err = peer_move_early(c);
	if (err)
		return err;
	c->fencing = 0;
	if (is_send(c)) {
		/* the receiver writes every unanswered CTS again: none of the old is to be read */
		memset(c->fifo, 0, RAIL_IB_FIFO_BYTES);
		c->batch_stale = c->batch.nreqs != 0;
	}
	/* every member, moved or not: the whole comm was fenced (its old QPs are in error) */
	for (int k = 0; k < c->ndevs && !err; k++)
		err = rail_ib_member_rebuild(c, k, mv->to[k], is_send(c), &mv->old);
	for (int k = 0; k < c->ndevs && !err && !is_send(c); k++)
		err = rail_ib_flush_member(c, k);
	if (err)
		return err;
	memset(&m, 0, sizeof(m));
	m.type = RAIL_IB_MSG_MOVE;
	m.ndevs = c->ndevs;
	for (int k = 0; k < c->ndevs; k++)
		rail_ib_local_wire_dev(&c->res[k], c->res[k].ctrl_mr->rkey, &m.devs[k]);
	/* each side sets the other's offer on its new QPs: both keep the options both have */
	m.nece = rail_ib_comm_ece_query(c, m.ece);
	m.nqps = c->nqps;
	for (int i = 0; i < c->nqps; i++)
		m.qpn[i] = c->qps[i].qp->qp_num;
	rail_strlcpy(m.text, mv->why, sizeof(m.text));
	move_state(c, &m.move);
	m.move.flags = (uint8_t)((mv->avoid ? RAIL_IB_MOVE_F_AVOID : 0) |
				 (rail_ib_away(c) ? RAIL_IB_MOVE_F_AWAY : 0));
	/*
	 * No deadline from here: the peer joins at its next call on the comm (an
	 * idle comm waits, as it would without a move); a dead peer ends the
	 * socket, and a silent host trips its keepalive (NCCL_RAIL_PEER_TIMEOUT).
	 */
	mv->state = MV_XCHG;
	return tx_put(c, &m);
}

static int peer_move_check(struct rail_ib_comm *c, const struct rail_ib_msg *m)
{
	char what[200];

	if (m->type == RAIL_IB_MSG_MOVE && m->move.epoch == c->epoch + 1 &&
	    m->ndevs == c->remote_ndevs &&
	    m->nqps == c->nqps && m->move.role != (is_send(c) ? 0 : 1) &&
	    (is_send(c) ? m->move.nans == c->nqps : m->move.nans == 0))
		return 0;
	snprintf(what, sizeof(what), "the peer's move message (type %d, move %u, %d devices, %d "
		 "QPs) does not match this comm's move %u with %d QPs and %d devices on the peer's "
		 "side", m->type, m->move.epoch, m->ndevs, m->nqps, c->epoch + 1, c->nqps,
		 c->remote_ndevs);
	return rail_ib_protocol_error(c, 0, what);
}

/*
 * RTR and RTS of every new QP: the move thread's work (rail_ib_move_work),
 * without the comm's guard. It touches the QPs alone, and writes nothing
 * but its result: NCCL's calls meanwhile stop at the move (step_ready).
 */
static void rtr_work(struct rail_ib_comm *c)
{
	struct rail_ib_move *mv = c->mv;
	int err = 0;

	for (int i = 0; i < c->nqps && !err; i++) {
		struct rail_ib_qp *q = &c->qps[i];

		err = rail_ib_qp_ece_set(c, i);	/* the peer's offer, as at connect */
		if (!err)
			err = rail_ib_qp_connect_to(c, q->qp, c->res[q->member].dev,
						    &c->remote[q->remote_member], q->remote_qpn, 0);
	}
	mv->rtr_err = err;
	atomic_store_explicit(&mv->rtr, RTR_DONE, memory_order_release);
}

/* Both MOVEs are out: the new QPs connect to the peer's, on the move thread. */
static int step_connect(struct rail_ib_comm *c)
{
	struct rail_ib_move *mv = c->mv;
	const struct rail_ib_msg *p = &mv->peer;

	for (int k = 0; k < p->ndevs; k++) {
		c->remote[k] = p->devs[k];
		if (is_send(c))
			c->remote_cmpl_rkey[k] = p->devs[k].ctrl_rkey;
		else
			c->remote_fifo_rkey[k] = p->devs[k].ctrl_rkey;
	}
	memset(c->remote_ece, 0, sizeof(c->remote_ece));
	memcpy(c->remote_ece, p->ece, sizeof(p->ece[0]) * (size_t)p->nece);
	/* each QP keeps its members on both sides (QP i: i % ndevs, i % remote_ndevs) */
	for (int i = 0; i < c->nqps; i++)
		c->qps[i].remote_qpn = p->qpn[i];
	mv->state = MV_RTR;
	atomic_store_explicit(&mv->rtr, RTR_PENDING, memory_order_relaxed);
	if (!rail_ib_move_work(c, rtr_work))
		rtr_work(c);	/* no move thread: here */
	return 0;
}

/* The new QPs are connected: the receiver's receive WRs, then MOVE_READY. -EAGAIN before. */
static int step_ready(struct rail_ib_comm *c)
{
	struct rail_ib_move *mv = c->mv;
	struct rail_ib_msg m;
	int err;

	if (atomic_load_explicit(&mv->rtr, memory_order_acquire) != RTR_DONE)
		return -EAGAIN;
	if (mv->rtr_err)
		return mv->rtr_err;
	for (int i = 0; i < c->nqps; i++)
		rail_flight_note(&c->base.fl, RAIL_FEV_STATE, c->qps[i].qp->qp_num, IBV_QPS_RTS,
				 "QP ready to send (RTS)");
	memset(&m, 0, sizeof(m));
	if (!is_send(c) && rail_ib_ring_recheck(c))
		m.flags = RAIL_IB_ORDER_SAFE;	/* the sender turns its ring too */
	err = is_send(c) ? 0 : rail_ib_recv_replay_prepare(c);
	if (err)
		return err;
	m.type = RAIL_IB_MSG_MOVE_READY;
	mv->state = MV_READY;
	return tx_put(c, &m);
}

/* The peer's QPs are ready: write again what the old path lost; the move is over. */
static int step_resume(struct rail_ib_comm *c)
{
	struct rail_ib_move *mv = c->mv;
	const struct rail_ib_move_state *ps = &mv->peer.move;
	char ports[64];
	int again = 0, eager = 0, back, err;
	size_t off = 0;

	if (is_send(c)) {
		c->rp_end = c->seq;
		c->rp_next = c->seq > RAIL_IB_SLOTS ? c->seq - RAIL_IB_SLOTS : 0;
		memcpy(c->rp_ans, ps->ans, sizeof(ps->ans[0]) * (size_t)c->nqps);
		for (uint64_t n = c->rp_next; n < c->rp_end; n++) {
			int first, count;

			rail_ib_qp_set(c, n, &first, &count);
			for (int j = 0; j < count; j++)
				again += rail_ib_sent_num(&c->sent[n & (RAIL_IB_SLOTS - 1)]) == n &&
					 c->rp_ans[first + j] <= n;
		}
		eager = rail_ib_eager_replay(c, ps->e_seen);
		err = eager < 0 ? eager : 0;
	} else {
		again = rail_ib_recv_replay_write(c);
		err = again < 0 ? again : rail_ib_flush_replay(c);
	}
	if (err)
		return err;
	rail_ib_old_free(&mv->old);
	c->epoch++;
	c->follows = mv->follows && mv->to[0] != c->home[0];
	path_fail_note(c, mv, ps->reason);
	/* a side left a device whose port is up: probe the way home (ib_probe.c) */
	rail_ib_back_after_move(c, mv->avoid || (ps->flags & RAIL_IB_MOVE_F_AVOID),
				rail_ib_away(c) || (ps->flags & RAIL_IB_MOVE_F_AWAY));
	ports[0] = '\0';
	for (int k = 0; k < mv->peer.ndevs && off < sizeof(ports); k++) {
		int w = snprintf(ports + off, sizeof(ports) - off, "%s%u", k ? "+" : "",
				 mv->peer.devs[k].port);

		off += w > 0 ? (size_t)w : 0;
	}
	back = mv->reason == RAIL_IB_MOVE_BACK || ps->reason == RAIL_IB_MOVE_BACK;
	rail_log(back ? RAIL_LOG_INFO : RAIL_LOG_WARN, RAIL_LOG_NET, __FILE__, __LINE__,
		 "connection to peer %s (%s comm) moved%s from %s to %s%s%s%s: %s%s%s; the peer is "
		 "on its port %s (GID index %u); %d %s and %d eager messages written again%s; "
		 "%.1f ms (move %u)", c->peer, is_send(c) ? "send" : "receive",
		 back ? " back" : "", mv->from_s, mv->to_s, mv->fb_why[0] ? " (" : "", mv->fb_why,
		 mv->fb_why[0] ? ")" : "", mv->why,
		 mv->peer.text[0] ? "; the peer's side: " : "", mv->peer.text, ports,
		 mv->peer.devs[0].gid_index, again,
		 is_send(c) ? "lost pieces" : "clear-to-sends", eager > 0 ? eager : 0,
		 mv->dead ? "; the dead device's queues were written off, not drained" : "",
		 (double)(rail_now_ns() - mv->start_ns) / 1e6, c->epoch);
	rail_flight_note(&c->base.fl, RAIL_FEV_STATE, c->qps[0].qp->qp_num, (int32_t)c->epoch,
			 "move done");
	free(mv);
	c->mv = NULL;
	return 0;
}

/* Run the move as far as it goes now: 0 done, -EAGAIN, or an error. */
static int move_step(struct rail_ib_comm *c)
{
	struct rail_ib_move *mv = c->mv;
	int err = 0;

	/* the move thread connects the new QPs: nothing of the move is touched meanwhile */
	if (mv->state == MV_RTR && atomic_load_explicit(&mv->rtr, memory_order_acquire) != RTR_DONE)
		return -EAGAIN;
	if (mv->state == MV_DRAIN) {
		err = step_drain(c);
		if (err)
			return err;
	}
	err = rail_ib_chan_flush(c);
	if (err)
		return err;
	while (mv->state == MV_XCHG && !mv->have_move) {
		err = rx_msg(c, &mv->peer);
		if (err)
			return err;
		err = peer_move_check(c, &mv->peer);
		if (err)
			return err;
		mv->have_move = 1;
	}
	if (mv->state == MV_XCHG && (err = step_connect(c)))
		return err;
	if (mv->state == MV_RTR) {
		err = step_ready(c);
		if (!err)
			err = rail_ib_chan_flush(c);
		if (err)
			return err;
	}
	if (!mv->have_ready) {
		struct rail_ib_msg m;

		err = rx_msg(c, &m);
		if (err)
			return err;
		if (m.type != RAIL_IB_MSG_MOVE_READY)
			return rail_ib_protocol_error(c, 0, "expected the peer's move-ready message");
		if (is_send(c) && (m.flags & RAIL_IB_READY_ORDER_MASK) == RAIL_IB_ORDER_SAFE)
			rail_ib_ring_turn_safe(c);	/* before anything is written again */
		mv->have_ready = 1;
	}
	return step_resume(c);
}

static int move_fail(struct rail_ib_comm *c, int err, const char *call)
{
	struct rail_ib_move *mv = c->mv;
	int sock_err = rail_ib_chan_sock_err(c);

	if (sock_err && (err == -RAIL_ECLOSED || err == -ECONNRESET || err == -EPIPE))
		RAIL_WARN("%s: connection to peer %s: the peer closed its socket during a move (its "
			  "process exited, or its side of the move failed: its log says why); the "
			  "connection fails", call, c->peer);
	else if (err == -ETIMEDOUT && sock_err)
		RAIL_WARN("%s: connection to peer %s: its host stopped answering during a move "
			  "(%s; NCCL_RAIL_PEER_TIMEOUT=%lld s); the connection fails", call, c->peer,
			  mv ? mv->why : "between moves", (long long)rail_param_int(RAIL_P_PEER_TIMEOUT));
	else if (err != -ENETDOWN && err != -EPROTO)
		RAIL_WARN("%s: connection to peer %s: the move to another path (%s%s%s) failed: "
			  "%s; the connection fails (the WARN before names the call that failed)",
			  call, c->peer, mv ? mv->why : "?", mv && mv->to_s[0] ? ", to " : "",
			  mv ? mv->to_s : "", RAIL_ERRSTR(err));
	if (!c->error)
		c->error = err;
	/* the peer, waiting in its move or for data, sees the socket close: it fails too, named */
	if (c->oob_fd >= 0)
		(void)shutdown(c->oob_fd, SHUT_RDWR);
	c->fencing = 0;
	if (mv) {
		rail_ib_old_free(&mv->old);
		free(mv);
		c->mv = NULL;
	}
	return c->error;
}

/*
 * No move under way: the messages on the handshake socket (a probe's go to
 * ib_probe.c; the peer's MOVE ends the look), then the probe's step. 1
 * with *m the peer's MOVE, 0, or an error that fails the comm (a bad
 * message). A socket that failed is left to the watchdog
 * (rail_ib_peer_check), which names it.
 */
static int look(struct rail_ib_comm *c, struct rail_ib_msg *m)
{
	int err;

	while (!(err = rail_ib_chan_recv(c, m))) {
		if (m->type == RAIL_IB_MSG_MOVE)
			return 1;
		if (!is_probe_msg(m->type))
			return rail_ib_protocol_error(c, 0, "a handshake message that is neither a "
						      "move's nor a probe's between moves");
		if (rail_ib_probe_msg(c, m))
			return 0;	/* the socket failed */
	}
	if (err == -EPROTO)
		return err;
	if (err == -EAGAIN)
		(void)rail_ib_probe_step(c);	/* only the socket can fail it */
	return 0;
}

static int on_move(struct rail_ib_comm *c, int trigger, const char *call)
{
	struct rail_ib_msg m;
	uint64_t now = trigger == RAIL_IB_TRIG_BACK ? rail_now_ns() : 0;
	int err = 0, got = 0;

	/*
	 * The 256th call's look (trigger BACK) reads the socket only while a
	 * probe is due, and at most every LOOK_NS (a system call); the engine's
	 * look, the move thread and failures read it whenever they come.
	 */
	if (!c->mv && c->chan && (!now || (c->back.due && now - c->back.looked_ns >= LOOK_NS))) {
		c->back.looked_ns = now;
		got = look(c, &m);
		if (got < 0)
			return move_fail(c, got, call);
		if (got && trigger == RAIL_IB_TRIG_BACK)
			trigger = RAIL_IB_TRIG_OOB;	/* it joins the peer's move */
	}
	if (!c->mv && !got && (trigger == RAIL_IB_TRIG_OOB || trigger == RAIL_IB_TRIG_BACK)) {
		if (c->back.off || !rail_ib_home_ready(c))
			return 0;	/* nothing from the peer; home down, held down or not probed */
		trigger = RAIL_IB_TRIG_BACK;
	}
	if (!c->mv) {
		err = move_start(c, trigger, got ? &m : NULL);
		if (!err)
			rail_ib_move_watch(c);	/* if NCCL stops calling, the thread goes on */
	}
	if (!err)
		err = move_step(c);
	if (err && err != -EAGAIN)
		return move_fail(c, err, call);
	return err;
}

/* ---- what the move thread (ib_move_thread.c) asks ---------------------------------- */

int rail_ib_move_due(struct rail_ib_comm *c)
{
	char b;

	if (!c->mv && atomic_load(&c->qp_event))
		(void)rail_ib_qp_event_current(c);	/* drops one on a replaced QP */
	return c->mv || c->path_failed || rail_ib_own_port_down(c) || atomic_load(&c->qp_event) ||
	       recv(c->oob_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/* A move to start or drive on c (its port, its peer, home back, one under way), or a probe. */
int rail_ib_move_wanted(struct rail_ib_comm *c)
{
	return rail_ib_move_due(c) || rail_ib_home_ready(c) || rail_ib_probe_wanted(c);
}

/* The sender's lost pieces not yet written again (CTS by CTS, as the receiver re-writes them). */
static int replay_pending(const struct rail_ib_comm *c)
{
	return is_send(c) && (c->rp_next != c->rp_end || c->batch_stale);
}

uint64_t rail_ib_move_next_ns(struct rail_ib_comm *c)
{
	uint64_t probe = rail_ib_probe_next_ns(c), hold = 0;

	/* completions and clear-to-sends land in memory and raise no event: poll */
	if ((c->mv && c->mv->state == MV_DRAIN) || (!c->mv && replay_pending(c)))
		return rail_now_ns() + POLL_NS;

	for (int m = 0; !c->mv && !c->follows && m < c->ndevs; m++) {
		uint64_t up = atomic_load(&c->home[m]->up_ns);

		if (c->home[m] == c->res[m].dev)
			continue;
		if (!up || rail_ib_dev_down(c->home[m])) {
			hold = 0;	/* a PORT_ACTIVE (the async thread) starts the hold-down */
			break;
		}
		hold = RAIL_MAX(hold, up + (uint64_t)rail_param_int(RAIL_P_FAILOVER_HOLDDOWN) *
					       1000000000ull);
	}
	return !probe ? hold : !hold ? probe : RAIL_MIN(probe, hold);
}

int rail_ib_move_failure_trigger(struct rail_ib_comm *c)
{
	if (c->path_failed)
		return c->path_failed;	/* RAIL_IB_TRIG_WC or _STALL */
	if (dead_members(c))
		return RAIL_IB_TRIG_FATAL;
	if (rail_ib_own_port_down(c))
		return RAIL_IB_TRIG_PORT;
	if (atomic_load(&c->qp_event))
		return RAIL_IB_TRIG_QP;
	return RAIL_IB_TRIG_OOB;
}

int rail_ib_move_trigger(struct rail_ib_comm *c)
{
	int t = rail_ib_move_failure_trigger(c);

	return t == RAIL_IB_TRIG_OOB && rail_ib_home_ready(c) && !c->mv ? RAIL_IB_TRIG_BACK : t;
}

int rail_ib_move_close_due(struct rail_ib_comm *c)
{
	return c->failover && !c->error && (rail_ib_move_due(c) || replay_pending(c));
}

void rail_ib_move_settle_late(struct rail_ib_comm *c, const char *call)
{
	RAIL_WARN("%s: connection to peer %s: a move to another path (%s) was not over within "
		  "%llu s of the close; sends it owes the peer are lost", call, c->peer,
		  c->mv ? c->mv->why : "lost pieces to write again",
		  RAIL_IB_SETTLE_NS / 1000000000ull);
}

void rail_ib_move_arm(struct rail_ib_comm *c, int peer_failover)
{
	c->on_move = on_move;
	for (int m = 0; m < c->ndevs; m++)
		c->home[m] = c->res[m].dev;
	if (!rail_param_int(RAIL_P_FAILOVER) || c->oob_fd < 0)
		return;
	if (!peer_failover) {
		RAIL_INFO(RAIL_LOG_NET, "connection %s peer %s: no failover (the peer runs with "
			  "NCCL_RAIL_FAILOVER=0): a port failing fails it", is_send(c) ? "to" : "from",
			  c->peer);
		return;
	}
	if (rail_ib_chan_open(c))
		return;	/* no room for the messages: no failover for this comm */
	if (is_send(c)) {
		/* zeroed pages, no record in any slot, touched as CTSes are answered (zmem.h) */
		c->sent = rail_zalloc(RAIL_IB_SLOTS * sizeof(*c->sent), 64);
		if (!c->sent)
			return;	/* no records: no failover for this comm */
	}
	c->failover = 1;
	c->base.guarded = rail_guard_setup();	/* NCCL's calls and the move thread take turns */
	rail_ib_move_register(c);
}

int rail_ib_move_free(struct rail_ib_comm *c, void (*later)(struct rail_ib_comm *c))
{
	/* the thread no longer looks at it after this, or is connecting its QPs */
	if (c->failover && rail_ib_move_unregister(c, later)) {
		rail_comm_closed(&c->base);	/* closed to NCCL (finalize): freed by the thread */
		return 1;
	}
	if (c->mv) {
		rail_ib_old_free(&c->mv->old);
		free(c->mv);
		c->mv = NULL;
	}
	rail_ib_probe_stop(c);
	if (c->chan)
		rail_ib_chan_close(c);
	rail_zfree(c->sent, RAIL_IB_SLOTS * sizeof(*c->sent));
	c->sent = NULL;
	return 0;
}
