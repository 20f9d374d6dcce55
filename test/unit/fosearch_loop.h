/*
 * nccl-net-rail unit tests: the seeded randomized failover search
 * (test_ib_fosearch.c), part 4: the proxy loop. One thread drives both
 * comms as NCCL's proxy does: each turn, in an order the seed draws, it
 * posts receives (grouped), posts sends (one window per tag, as NCCL's
 * sub-operations), tests sends, tests receives, tests flushes; a send
 * buffer is refilled with the next message through its slot as soon as its
 * send completes; every receive is checked byte by byte once complete (and
 * flushed). Events (fosearch_ev.h) fire between phases.
 *
 * Include after fosearch_run.h, in test_ib_fosearch.c only.
 */
#ifndef RAIL_FOSEARCH_LOOP_H
#define RAIL_FOSEARCH_LOOP_H

static void fo_events(struct fo_run *R, int phase);
static void fo_stall_check(struct fo_run *R);

static int fo_sslot(const struct fo_run *R, int t, int k)
{
	return t * R->S->tr.ws + k % R->S->tr.ws;
}

static int fo_tag_of(int m, const struct fo_run *R)
{
	return R->S->tr.msg[m].tag - FO_TAG0;
}

/* The k-th send of its tag, for message m. */
static int fo_kth(const struct fo_run *R, int m)
{
	int t = fo_tag_of(m, R);

	for (int k = 0; k < R->tn[t]; k++)
		if (R->tmsg[t][k] == m)
			return k;
	return -1;
}

/* The send slot of the k-th send of tag t, filled with that message's bytes now. */
static void fo_slot_load(struct fo_run *R, int t, int k)
{
	int s = fo_sslot(R, t, k), m = R->tmsg[t][k];

	fo_fill(fo_slot_buf(&R->mem[0], s), R->S->tr.msg[m].size, R->S->seed, m);
	R->mem[0].slot[s].holds = m;
}

/* ---- sender ----------------------------------------------------------------------- */

static void fo_post_sends(struct fo_run *R)
{
	const struct fo_traffic *tr = &R->S->tr;
	int order[3] = { 0, 1, 2 };

	for (int i = tr->ntags - 1; i > 0; i--) {
		int j = (int)fo_below(&R->g, (uint32_t)i + 1), x = order[i];

		order[i] = order[j];
		order[j] = x;
	}
	for (int i = 0; i < tr->ntags && !R->stop && !R->closed_s && !R->closed_r; i++) {
		int t = order[i], k = R->tsent[t], m, s;
		ncclResult_t res;
		void *req = NULL;

		if (k >= R->tn[t] || (k >= tr->ws && R->sstate[R->tmsg[t][k - tr->ws]] != S_DONE))
			continue;
		m = R->tmsg[t][k];
		s = fo_sslot(R, t, k);
		res = rail_net_isend(R->F->sc, fo_slot_buf(&R->mem[0], s), tr->msg[m].size,
				     tr->msg[m].tag, R->mem[0].reg[R->mem[0].slot[s].reg].mh, &req);
		if (res != ncclSuccess) {
			fo_call_failed(R, "isend of message", m, res);
			return;
		}
		if (!req)
			continue;
		R->sreq[m] = req;
		R->sstate[m] = S_POSTED;
		R->mem[0].slot[s].busy = 1;
		R->tsent[t]++;
		R->n_sent++;
		R->progress_ns = rail_now_ns();
		fo_trace(R, "isend m%d (tag %d, %u bytes, slot %d, reg %d)", m, tr->msg[m].tag,
			 tr->msg[m].size, s, R->mem[0].slot[s].reg);
	}
}

static void fo_send_done(struct fo_run *R, int m, int got)
{
	const struct fo_traffic *tr = &R->S->tr;
	int t = fo_tag_of(m, R), k = fo_kth(R, m), s = fo_sslot(R, t, k);

	R->sstate[m] = S_DONE;
	R->sreq[m] = NULL;
	R->n_sdone++;
	R->progress_ns = rail_now_ns();
	R->mem[0].slot[s].busy = 0;
	fo_trace(R, "send m%d done", m);
	if (got != (int)tr->msg[m].size)
		fo_fail(R, "wrong-size", "send of message m%d (%u bytes) completed reporting %d bytes",
			m, tr->msg[m].size, got);
	/* NCCL reuses the buffer at once: the next message through this slot */
	if (k + tr->ws < R->tn[t])
		fo_slot_load(R, t, k + tr->ws);
}

static void fo_test_sends(struct fo_run *R)
{
	const struct fo_traffic *tr = &R->S->tr;

	for (int t = 0; t < tr->ntags && !R->stop && !R->closed_s; t++) {
		for (int k = 0; k < R->tsent[t] && !R->stop; k++) {
			int m = R->tmsg[t][k], done = 0, sz[1] = { -1 };
			ncclResult_t res;

			if (R->sstate[m] != S_POSTED)
				continue;
			res = rail_net_test(R->sreq[m], &done, sz);
			if (res != ncclSuccess) {
				R->sstate[m] = S_DONE;	/* the request is gone */
				fo_call_failed(R, "test of the send of message", m, res);
				return;
			}
			if (done)
				fo_send_done(R, m, sz[0]);
			else if (!tr->test_all)
				break;	/* NCCL tests the oldest */
		}
	}
}

/* ---- receiver ----------------------------------------------------------------------- */

/* With the sender closed, only receives whose every message was reported sent count. */
static int fo_recv_owed(const struct fo_run *R, int k)
{
	const struct fo_traffic *tr = &R->S->tr;

	if (!R->closed_s)
		return 1;
	for (int i = 0; i < tr->rn[k]; i++)
		if (R->sstate[tr->rfirst[k] + i] != S_DONE)
			return 0;
	return 1;
}

static void fo_post_recvs(struct fo_run *R)
{
	const struct fo_traffic *tr = &R->S->tr;
	int n = (int)fo_range(&R->g, 1, 2);

	for (int j = 0; j < n && !R->stop && !R->closed_r; j++) {
		int k = R->recvd, tags[FO_MAXBUF];
		void *data[FO_MAXBUF], *mhs[FO_MAXBUF], *req = NULL;
		size_t sizes[FO_MAXBUF];
		ncclResult_t res;

		if (k >= tr->nrecv || (k >= tr->wr && R->rstate[k - tr->wr] != R_DONE) ||
		    !fo_recv_owed(R, k))
			return;
		for (int i = 0; i < tr->rn[k]; i++) {
			const struct fo_msg *m = &tr->msg[tr->rfirst[k] + i];
			int s = (k % tr->wr) * R->maxn + i;

			data[i] = fo_slot_buf(&R->mem[1], s);
			sizes[i] = m->posted;
			tags[i] = m->tag;
			mhs[i] = R->mem[1].reg[R->mem[1].slot[s].reg].mh;
			memset(data[i], FO_POISON, m->posted + FO_GUARD);	/* host copy: unchecked on GPU */
		}
		res = rail_net_irecv(R->F->rc, tr->rn[k], data, sizes, tags, mhs, &req);
		if (res != ncclSuccess) {
			fo_call_failed(R, "irecv", k, res);
			return;
		}
		if (!req)
			return;
		for (int i = 0; i < tr->rn[k]; i++)
			R->mem[1].slot[(k % tr->wr) * R->maxn + i].busy = 1;
		R->rreq[k] = req;
		R->rstate[k] = R_POSTED;
		if (R->sstate[tr->rfirst[k]] != S_IDLE) {	/* its message went first */
			R->ahead_k = k;
			R->ahead = 0;
		}
		R->recvd++;
		R->n_recvd++;
		R->progress_ns = rail_now_ns();
		fo_trace(R, "irecv %d (%d buffer(s))", k, tr->rn[k]);
	}
}

/* Receive k complete and flushed: check it, free its slot. */
static void fo_consume(struct fo_run *R, int k)
{
	const struct fo_traffic *tr = &R->S->tr;

	for (int i = 0; i < tr->rn[k]; i++) {
		int m = tr->rfirst[k] + i;

		if (R->sstate[m] == S_IDLE) {
			fo_fail(R, R->recv_died ? "item1-corruption" : "early-completion",
				"receive %d completed with buffer %d (message m%d) filled before the send "
				"of m%d was posted", k, i, m, m);
			return;
		}
		fo_check_buf(R, k, i);
		if (R->failed)
			return;
	}
	for (int i = 0; i < tr->rn[k]; i++)
		R->mem[1].slot[(k % tr->wr) * R->maxn + i].busy = 0;
	R->rstate[k] = R_DONE;
	fo_trace(R, "receive %d checked", k);
}

static void fo_recv_done(struct fo_run *R, int k, const int *got)
{
	const struct fo_traffic *tr = &R->S->tr;
	void *data[FO_MAXBUF], *mhs[FO_MAXBUF], *req = NULL;
	int sizes[FO_MAXBUF], any = 0;
	ncclResult_t res;

	R->rreq[k] = NULL;
	R->n_rdone++;
	R->progress_ns = rail_now_ns();
	for (int i = 0; i < tr->rn[k]; i++) {
		int s = (k % tr->wr) * R->maxn + i;

		R->rgot[k][i] = got[i];
		data[i] = fo_slot_buf(&R->mem[1], s);
		mhs[i] = R->mem[1].reg[R->mem[1].slot[s].reg].mh;
		sizes[i] = got[i];
		any |= got[i] > 0;
	}
	fo_trace(R, "receive %d done", k);
	if ((!R->S->p.flush_host && !R->S->p.dmabuf[1]) || !any) {
		fo_consume(R, k);
		return;
	}
	res = rail_net_iflush(R->F->rc, tr->rn[k], data, sizes, mhs, &req);
	if (res != ncclSuccess) {
		R->rstate[k] = R_DONE;
		fo_call_failed(R, "iflush of receive", k, res);
		return;
	}
	R->freq[k] = req;
	R->rstate[k] = R_FLUSH;
	if (!req)
		fo_consume(R, k);
}

static void fo_test_recvs(struct fo_run *R)
{
	const struct fo_traffic *tr = &R->S->tr;

	for (int k = 0; k < R->recvd && !R->stop && !R->closed_r; k++) {
		int done = 0, got[FO_MAXBUF];
		ncclResult_t res;

		if (R->rstate[k] != R_POSTED)
			continue;
		for (int i = 0; i < FO_MAXBUF; i++)
			got[i] = -1;
		res = rail_net_test(R->rreq[k], &done, got);
		if (res != ncclSuccess && R->closed_s && !fo_recv_owed(R, k)) {
			/* its send was in flight when NCCL closed the send comm: it may fail */
			R->rstate[k] = R_DONE;
			fo_trace(R, "receive %d failed (%d): a send of it was not done at the close", k,
				 (int)res);
			continue;
		}
		if (res != ncclSuccess) {
			R->rstate[k] = R_DONE;
			fo_call_failed(R, "test of receive", k, res);
			return;
		}
		if (done)
			fo_recv_done(R, k, got);
		else if (!tr->test_all)
			break;
	}
}

static void fo_test_flushes(struct fo_run *R)
{
	for (int k = 0; k < R->recvd && !R->stop && !R->closed_r; k++) {
		int done = 0;
		ncclResult_t res;

		if (R->rstate[k] != R_FLUSH || !R->freq[k])
			continue;
		res = rail_net_test(R->freq[k], &done, NULL);
		if (res != ncclSuccess) {
			R->rstate[k] = R_DONE;
			fo_call_failed(R, "test of the flush of receive", k, res);
			return;
		}
		if (done) {
			R->freq[k] = NULL;
			R->progress_ns = rail_now_ns();
			fo_consume(R, k);
		}
	}
}

/* ---- turns -------------------------------------------------------------------------- */

/*
 * Everything done; after the receive comm closed, every send in flight
 * ended; after the send comm closed, every receive the sender owed (its
 * sends reported done) complete, up to the first that is not owed.
 */
static int fo_finished(const struct fo_run *R)
{
	const struct fo_traffic *tr = &R->S->tr;
	int k = R->recvd;

	if (R->closed_r) {
		for (int m = 0; m < tr->nmsg && !R->closed_s; m++)
			if (R->sstate[m] == S_POSTED)
				return 0;
		return 1;
	}
	for (int j = 0; j < R->recvd; j++)
		if (R->rstate[j] != R_DONE && fo_recv_owed(R, j))
			return 0;
	if (k < tr->nrecv && fo_recv_owed(R, k) && (k < tr->wr || R->rstate[k - tr->wr] == R_DONE))
		return 0;
	for (int m = 0; m < tr->nmsg && !R->closed_s; m++)
		if (R->sstate[m] != S_DONE)
			return 0;
	return 1;
}

static void fo_turn(struct fo_run *R)
{
	int order[P_N] = { P_RECV, P_SEND, P_TSEND, P_TRECV, P_FLUSH };
	uint64_t before = R->progress_ns;

	for (int i = P_N - 1; i > 0; i--) {
		int j = (int)fo_below(&R->g, (uint32_t)i + 1), x = order[i];

		order[i] = order[j];
		order[j] = x;
	}
	for (int i = 0; i < P_N && !R->stop; i++) {
		switch (order[i]) {
		case P_RECV: fo_post_recvs(R); break;
		case P_SEND: fo_post_sends(R); break;
		case P_TSEND: fo_test_sends(R); break;
		case P_TRECV: fo_test_recvs(R); break;
		default: fo_test_flushes(R); break;
		}
		if (R->ahead_k >= 0 && (order[i] == P_SEND || order[i] == P_TSEND))
			R->ahead = R->rstate[R->ahead_k] == R_POSTED ? R->ahead + 1 : 0;
		if (!R->stop)
			fo_events(R, order[i]);
	}
	R->turn++;
	/* waiting (a peer's move message, a retry timer): spin less, NCCL's proxy yields too */
	R->idle = R->progress_ns == before ? R->idle + 1 : 0;
	if (R->idle > 64) {
		struct timespec ts = { 0, 100000 };

		nanosleep(&ts, NULL);
	}
}

/*
 * After the traffic, when faults fired: one more 8-byte message (tag 7, into
 * receive slot 0) so that each comm is called after the last fault and
 * finishes its move (NCCL always has more traffic); a comm closed while its
 * HCA holds writes would drain for a second. Checked like the others.
 */
static void fo_final(struct fo_run *R, uint64_t deadline)
{
	const struct fo_traffic *tr = &R->S->tr;
	int id = tr->nmsg, tag = FO_TAG0, got[1] = { -1 }, sdone = 0, rdone = 0, sz[1];
	struct fo_mem *ms = &R->mem[0], *mr = &R->mem[1];
	void *rbuf = fo_slot_buf(mr, 0), *sbuf = fo_slot_buf(ms, 0), *rreq = NULL, *sreq = NULL;
	void *rmh = mr->reg[mr->slot[0].reg].mh;
	size_t rsize = 8;
	ncclResult_t res = ncclSuccess;

	if (!R->faults || R->stop || R->closed_s || R->closed_r)
		return;
	fo_fill(sbuf, 8, R->S->seed, id);
	memset(rbuf, FO_POISON, 8 + FO_GUARD);
	fo_trace(R, "final message m%d (8 bytes) after the faults", id);
	R->progress_ns = rail_now_ns();
	while (!R->stop && (!sdone || !rdone) && rail_now_ns() < deadline &&
	       rail_now_ns() - R->progress_ns < FO_IDLE_NS) {
		fo_stall_check(R);	/* a stall's hold ends at its WARN */
		if (!rreq && !rdone && (res = rail_net_irecv(R->F->rc, 1, &rbuf, &rsize, &tag, &rmh,
							    &rreq)) != ncclSuccess)
			fo_call_failed(R, "irecv of the final message", id, res);
		if (!R->stop && !sreq && !sdone &&
		    (res = rail_net_isend(R->F->sc, sbuf, 8, tag, ms->reg[ms->slot[0].reg].mh,
					  &sreq)) != ncclSuccess)
			fo_call_failed(R, "isend of the final message", id, res);
		if (!R->stop && sreq && (res = rail_net_test(sreq, &sdone, sz)) != ncclSuccess)
			fo_call_failed(R, "test of the final send", id, res);
		if (!R->stop && sdone && sreq) {
			sreq = NULL;
			R->progress_ns = rail_now_ns();
		}
		if (!R->stop && rreq && (res = rail_net_test(rreq, &rdone, got)) != ncclSuccess)
			fo_call_failed(R, "test of the final receive", id, res);
		if (!R->stop && rdone && rreq) {
			rreq = NULL;
			R->progress_ns = rail_now_ns();
		}
	}
	if (R->stop)
		return;
	if (!sdone || !rdone) {
		fo_hang(R, "the final message after the faults did not complete (send %s, receive "
			"%s); %d usable port(s) left", sdone ? "done" : "not done",
			rdone ? "done" : "not done", fo_ports_left(R));
		return;
	}
	if (got[0] != 8 || fo_diff(rbuf, 8, R->S->seed, id) < 8)
		if (!R->S->p.dmabuf[0] && !R->S->p.dmabuf[1])
			fo_fail(R, R->recv_died ? "item1-corruption" : "corruption", "the final message "
				"arrived wrong (%d bytes reported, 8 sent)", got[0]);
}

#endif
