/*
 * nccl-net-rail unit tests: the seeded randomized failover search
 * (test_ib_fosearch.c), part 5: the events. A fault is injected into the
 * fake (fv_test_port_state, fv_test_event DEVICE_FATAL, fv_test_qp_fatal,
 * fv_test_hold) and the loop waits until the plugin logged it (its async
 * thread), so that the schedule replays; registrations of new buffers (on
 * NCCL's service thread, here between phases: right after a fault, before
 * any data call, for item 3); closes of the comms.
 *
 * Include after fosearch_loop.h, in test_ib_fosearch.c only.
 */
#ifndef RAIL_FOSEARCH_EV_H
#define RAIL_FOSEARCH_EV_H

#define FO_WAIT_MS 3000

static void fo_wait(struct fo_run *R, int mark, int level, const char *a, const char *b)
{
	if (!fvh_wait_log_from(mark, level, a, b, FO_WAIT_MS))
		fo_trace(R, "(the plugin logged no \"%s\" \"%s\" within %d ms)", a, b ? b : "",
			 FO_WAIT_MS);
}

static void fo_inject(struct fo_run *R, const struct fo_event *e)
{
	const struct fo_topo *t = &R->S->t;
	char dev[24], name[40];
	int mark = fvh_log_mark(), n;

	snprintf(dev, sizeof(dev), "mlx5_%d", e->dev);
	snprintf(name, sizeof(name), "%s:%d", dev, e->port ? e->port : 1);
	switch (e->type) {
	case FO_EV_PORT_DOWN:
		n = R->F->port_state(dev, e->port, IBV_PORT_DOWN);
		R->down[e->dev][e->port] = 1;
		R->faults++;
		fo_wait(R, mark, NCCL_LOG_WARN, name, "went down");
		if (R->held[e->dev]) {	/* the other ports' held sends go now */
			R->F->hold(dev, 0);
			R->held[e->dev] = 0;
		}
		fo_trace(R, "PORT_ERR %s injected (%d contexts)", name, n);
		break;
	case FO_EV_PORT_UP:
		n = R->F->port_state(dev, e->port, IBV_PORT_ACTIVE);
		R->down[e->dev][e->port] = 0;
		fo_wait(R, mark, NCCL_LOG_INFO, name, "ACTIVE again");
		fo_trace(R, "PORT_ACTIVE %s injected (%d contexts)", name, n);
		break;
	case FO_EV_FATAL:
		n = R->F->event(dev, 1, IBV_EVENT_DEVICE_FATAL);
		R->dead[e->dev] = 1;
		R->faults++;
		R->recv_died |= fo_uses_dev(t, 0, e->dev);
		fo_wait(R, mark, NCCL_LOG_WARN, dev, "the device failed");
		fo_trace(R, "DEVICE_FATAL %s injected (%d contexts)%s", dev, n,
			 fo_uses_dev(t, 0, e->dev) ? ": an HCA of the receive comm" : "");
		break;
	case FO_EV_QP_FATAL:
		n = R->F->qp_fatal(dev);
		R->faults++;
		if (n > 0)
			fo_wait(R, mark, NCCL_LOG_WARN, dev, "on qp");
		if (R->held[e->dev]) {	/* the held sends go now (the failed QP's are flushed) */
			R->F->hold(dev, 0);
			R->held[e->dev] = 0;
		}
		fo_trace(R, "QP_FATAL on %s: qp 0x%x", dev, n > 0 ? n : 0);
		break;
	case FO_EV_HOLD:
		n = R->F->hold(dev, 1);
		R->held[e->dev] = 1;
		fo_trace(R, "hold on %s (%d held)", dev, n);
		break;
	default:	/* the stall: sends held for good, no port event; released at the WARN */
		n = R->F->hold(dev, 1);
		R->held[e->dev] = 1;
		R->stall_dev = e->dev;
		R->faults++;
		fo_trace(R, "stall: hold on %s (%d held), NCCL_RAIL_IB_STALL_TIMEOUT=1", dev, n);
		break;
	}
	R->progress_ns = rail_now_ns();
}

/*
 * regMr of a new buffer (NCCL's service thread: between phases here). A
 * free slot of the side moves to it (a new arena, or a new handle on its own
 * memory) and the registration it leaves, if no slot uses it any more, is
 * deregistered and its arena freed.
 */
static void fo_reg_event(struct fo_run *R, const struct fo_event *e)
{
	struct fo_mem *m = &R->mem[e->side];
	void *comm = e->side ? R->F->rc : R->F->sc;
	int free_s[FO_MAXSLOT], nf = 0, s, a, r, old;
	ncclResult_t res;

	if (e->side ? R->closed_r : R->closed_s)
		return;
	for (int k = 0; k < m->nslot; k++)
		if (!m->slot[k].busy)
			free_s[nf++] = k;
	s = nf ? free_s[fo_below(&R->g, (uint32_t)nf)] : -1;
	if (s >= 0 && e->sub) {
		a = m->slot[s].arena;
		r = fo_reg_new(m, comm, a, m->slot[s].off, m->slot[s].len, &res);
	} else {
		a = fo_arena_new(m, s >= 0 ? m->slot[s].len + FO_GUARD : 65536);
		r = a < 0 ? -1 : fo_reg_new(m, comm, a, 0, m->arena[a].len, &res);
		if (a < 0)
			res = ncclSuccess;
	}
	if (r < 0) {
		if (res != ncclSuccess)
			fo_call_failed(R, e->side ? "regMr (receiver)" : "regMr (sender)", s, res);
		return;
	}
	fo_trace(R, "regMr on the %s: reg %d (arena %d)%s", e->side ? "receiver" : "sender", r, a,
		 s >= 0 ? "" : ", no slot free: kept for later");
	if (s < 0)
		return;
	old = m->slot[s].reg;
	if (!e->sub) {
		uint8_t *from = fo_slot_buf(m, s);

		memcpy(m->arena[a].p, from, m->slot[s].len);	/* what the slot holds goes along */
		m->slot[s].arena = a;
		m->slot[s].off = 0;
	}
	m->slot[s].reg = r;
	res = fo_reg_release(m, comm, old);
	R->send_freed |= !e->side && !m->reg[old].live;
	fo_trace(R, "slot %d now under reg %d; reg %d %s", s, r, old,
		 m->reg[old].live ? "still used" : "deregistered");
	if (res != ncclSuccess)
		fo_call_failed(R, e->side ? "deregMr (receiver)" : "deregMr (sender)", old, res);
}

static void fo_close_event(struct fo_run *R, const struct fo_event *e)
{
	int moved = fvh_log_count(NCCL_LOG_WARN, "moved from", NULL);
	ncclResult_t res;

	fo_trace(R, "close of the %s comm%s (%d move WARN(s) so far)",
		 e->side == 1 ? "send" : e->side == 2 ? "receive" : "send and receive",
		 e->side == 3 ? "s" : "", moved);
	if ((e->side & 1) && !R->closed_s) {
		fo_mem_dereg(&R->mem[0], R->F->sc);
		res = rail_net_close_send(R->F->sc);
		R->F->sc = NULL;
		R->closed_s = 1;
		if (res != ncclSuccess)
			fo_fail(R, "close", "closing the send comm mid-move failed (%d)", (int)res);
	}
	if ((e->side & 2) && !R->closed_r) {
		fo_mem_dereg(&R->mem[1], R->F->rc);
		res = rail_net_close_recv(R->F->rc);
		R->F->rc = NULL;
		R->closed_r = 1;
		if (res != ncclSuccess)
			fo_fail(R, "close", "closing the receive comm mid-move failed (%d)", (int)res);
	}
	R->progress_ns = rail_now_ns();
}

static int fo_ev_due(const struct fo_run *R, const struct fo_event *e, int phase)
{
	int v;

	if (e->phase >= 0 && e->phase != phase)
		return 0;
	switch (e->when) {
	case FO_W_SENT: v = R->n_sent; break;
	case FO_W_SDONE: v = R->n_sdone; break;
	case FO_W_RECVD: v = R->n_recvd; break;
	case FO_W_RDONE: v = R->n_rdone; break;
	case FO_W_AHEAD: v = R->ahead; break;
	default: v = (int)(R->turn - R->ev_turn); break;
	}
	return v >= e->at;
}

/* The stall's hold ends once the plugin said it saw the stall. */
static void fo_stall_check(struct fo_run *R)
{
	if (R->stall_dev >= 0 &&
	    fvh_log_count(NCCL_LOG_WARN, "completions owed", NULL)) {
		char dev[24];

		snprintf(dev, sizeof(dev), "mlx5_%d", R->stall_dev);
		R->F->hold(dev, 0);
		R->held[R->stall_dev] = 0;
		fo_trace(R, "the stall WARN came: hold on %s released", dev);
		R->stall_dev = -1;
	}
}

/* After a phase: the events now due, in order. */
static void fo_events(struct fo_run *R, int phase)
{
	fo_stall_check(R);
	while (R->evnext < R->S->nev && !R->stop && fo_ev_due(R, &R->S->ev[R->evnext], phase)) {
		const struct fo_event *e = &R->S->ev[R->evnext++];

		R->ev_turn = R->turn;
		if (e->type == FO_EV_REG)
			fo_reg_event(R, e);
		else if (e->type == FO_EV_CLOSE)
			fo_close_event(R, e);
		else
			fo_inject(R, e);
	}
}

#endif
