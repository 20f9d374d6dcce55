/*
 * nccl-net-rail unit tests: the seeded randomized failover search
 * (test_ib_fosearch.c), part 3: one seed's state, its trace, the events
 * (faults injected into the fake, registrations, closes) and the checks of
 * what the plugin delivered.
 *
 * Include after fosearch_mem.h, in test_ib_fosearch.c only.
 */
#ifndef RAIL_FOSEARCH_RUN_H
#define RAIL_FOSEARCH_RUN_H

#include <stdarg.h>

enum { P_RECV, P_SEND, P_TSEND, P_TRECV, P_FLUSH, P_N };
enum { R_IDLE, R_POSTED, R_FLUSH, R_DONE };	/* a receive: not posted .. consumed */
enum { S_IDLE, S_POSTED, S_DONE };		/* a send */

struct fo_run {
	const struct fo_scn *S;
	struct fvh *F;
	struct fo_rng g;		/* the loop's own draws (phase orders, counts) */
	int verbose;
	struct fo_mem mem[2];		/* 0 sender, 1 receiver */
	int maxn;			/* buffers per receive slot */
	/* sender: per tag, its messages in order; per message its request */
	int tmsg[3][FO_MAXMSG], tn[3], tsent[3];
	int sstate[FO_MAXMSG];
	void *sreq[FO_MAXMSG];
	/* receiver */
	int recvd;
	int rstate[FO_MAXRECV];
	void *rreq[FO_MAXRECV], *freq[FO_MAXRECV];
	int rgot[FO_MAXRECV][FO_MAXBUF];
	/* what events count */
	int n_sent, n_sdone, n_recvd, n_rdone;
	long turn, ev_turn, idle;
	int ahead_k;			/* a receive posted after its message was sent (-1: none) */
	int ahead;			/* sender phases since, that receive still in flight */
	int evnext;
	int dead[FO_MAXDEV], down[FO_MAXDEV][3], held[FO_MAXDEV];
	int stall_dev;			/* held until the stall WARN (-1: none) */
	int recv_died;			/* DEVICE_FATAL on an HCA of the receive comm */
	int send_freed;			/* the sender deregistered a buffer's registration before */
	int faults;			/* faults injected */
	int closed_s, closed_r;
	int dmabuf_fd;			/* the fd GPU memory is registered with */
	int close_mark;			/* CLOSE: what the surviving side still owes */
	uint64_t progress_ns;		/* the last change */
	/* outcome */
	int stop;			/* a call failed: NCCL would abort */
	int failed;
	char what[600], cat[96];
};

/* ---- trace -------------------------------------------------------------------- */

static void fo_trace(struct fo_run *R, const char *fmt, ...)
{
	char line[700];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	printf("fo: t%ld %s\n", R->turn, line);
	(void)R;
}

/* Pieces the send comm wrote again after a move (its move WARNs), or 0. */
static int fo_lost_pieces(void)
{
	int n = 0;

	pthread_mutex_lock(&fvh_log_lock);
	for (int i = 0; i < fvh_logs.n; i++) {
		const char *t = strstr(fvh_logs.l[i].text, "(send comm) moved"), *p;

		if (t && (p = strstr(t, " lost pieces")) != NULL) {
			while (p > t && p[-1] >= '0' && p[-1] <= '9')
				p--;
			n += atoi(p);
		}
	}
	pthread_mutex_unlock(&fvh_log_lock);
	return n;
}

static void fo_fail(struct fo_run *R, const char *cat, const char *fmt, ...)
{
	va_list ap;

	if (R->failed)
		return;
	R->failed = 1;
	R->stop = 1;
	/*
	 * The receiver's HCA died, the sender wrote lost pieces again from its
	 * records, and it had given a buffer's registration back: a stale record
	 * read the freed handle (item 1). In the plain build what that does
	 * varies (an old lkey, EBADF, a crash; never an old rkey: those come
	 * from the receiver's CTSes); ASan names it.
	 */
	int freed = R->recv_died && R->send_freed && strncmp(cat, "item1", 5) &&
		    strncmp(cat, "item2a", 6) && strncmp(cat, "item2b", 6) && fo_lost_pieces() > 0;
	int n = freed ? snprintf(R->what, sizeof(R->what), "(seen as %s) ", cat) : 0;

	snprintf(R->cat, sizeof(R->cat), "%s", freed ? "item1-freed-registration" : cat);
	va_start(ap, fmt);
	vsnprintf(R->what + n, sizeof(R->what) - (size_t)n, fmt, ap);
	va_end(ap);
	fo_trace(R, "CHECK FAILED [%s]: %s", R->cat, R->what);
}

/* The sink of the plugin's log: fv_harness's record (WARNs kept when it fills), echoed. */
static int fo_log_echo;
static void fo_sink(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		    const char *fmt, ...)
{
	char text[FVH_LINE];
	va_list ap;

	(void)flags;
	(void)file;
	(void)line;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (fo_log_echo || level == NCCL_LOG_WARN)
		printf("[log %d] %s\n", (int)level, text);
	pthread_mutex_lock(&fvh_log_lock);
	if (fvh_logs.n < FVH_LOG_MAX - 64 || (level == NCCL_LOG_WARN && fvh_logs.n < FVH_LOG_MAX)) {
		fvh_logs.l[fvh_logs.n].level = (int)level;
		memcpy(fvh_logs.l[fvh_logs.n].text, text, sizeof(text));
		fvh_logs.n++;
	}
	pthread_mutex_unlock(&fvh_log_lock);
}

/* ---- the ports left -------------------------------------------------------------- */

/* Usable ports (ACTIVE, HCA alive) left: with none a failure of the comms is expected. */
static int fo_ports_left(const struct fo_run *R)
{
	const struct fo_topo *t = &R->S->t;
	int n = 0;

	for (int pd = 0; pd < t->nplug; pd++)
		n += !R->dead[t->plug_dev[pd]] && !R->down[t->plug_dev[pd]][t->plug_port[pd]];
	return n;
}

/* Whether a failed call is allowed: no port left, or the peer's comm was closed. */
static int fo_may_fail(const struct fo_run *R)
{
	return fo_ports_left(R) == 0 || R->closed_s || R->closed_r;
}

static int fo_uses_dev(const struct fo_topo *t, int send, int dev)
{
	const int *v = send ? t->sdev : t->rdev;
	int n = send ? t->ns : t->nr;

	for (int i = 0; i < n; i++)
		if (t->plug_dev[v[i]] == dev)
			return 1;
	return 0;
}

/* ---- what the fake's log says about a failed completion (item 2's cases) ---------- */

static unsigned long long fo_kv_hex(const char *line, const char *key)
{
	const char *p = strstr(line, key);

	return p ? strtoull(p + strlen(key), NULL, 16) : 0;
}

/*
 * The first completion with a protection or access error in the fake's log,
 * named: an old lkey (LOC_PROT_ERR, status 4), or an old rkey (REM_ACCESS_ERR,
 * status 10) in a CTS's data write, a loopback copy or a flush read.
 */
static int fo_key_error(const struct fvh *F, char *cat, size_t len, char *line_out, size_t olen)
{
	FILE *f = fopen(F->log, "r");
	char line[FVH_LINE];
	unsigned long long wr = 0;
	int status = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "wc ", 3) || (!strstr(line, " status=4") && !strstr(line, " status=10")))
			continue;
		status = strstr(line, " status=4") ? 4 : 10;
		wr = fo_kv_hex(line, " wr_id=0x");
		line[strcspn(line, "\n")] = 0;
		snprintf(line_out, olen, "%s", line);
		break;
	}
	if (!status) {
		fclose(f);
		return 0;
	}
	if (status == 4) {
		snprintf(cat, len, "item2c-old-lkey");
		fclose(f);
		return 1;
	}
	snprintf(cat, len, (wr & 7) == 3 ? "item2b-old-rkey-loopback" : "item2a-old-rkey-cts");
	rewind(f);
	while ((wr & 7) == 0 && wr && fgets(line, sizeof(line), f)) {
		char want[48];

		snprintf(want, sizeof(want), " wr_id=0x%llx ", wr);
		if (!strncmp(line, "ibv_post_send ", 14) && strstr(line, want) &&
		    strstr(line, "opcode=RDMA_READ"))
			snprintf(cat, len, "item2b-old-rkey-flush");
	}
	fclose(f);
	return 1;
}

/* Whether a WARN is part of a flight record (logged after the failure it explains). */
static int fo_flight_line(const char *t)
{
	return strstr(t, "flight record of") || strstr(t, "   flight: ") || strstr(t, "   in flight: ");
}

/*
 * The last WARN that names a failure (not the faults themselves, the moves
 * or flight records), shortened; any: also one containing `any`, if found.
 */
static void fo_last_warn(char *buf, size_t len, const char *any)
{
	buf[0] = 0;
	pthread_mutex_lock(&fvh_log_lock);
	for (int i = 0; i < fvh_logs.n; i++) {
		const char *t = fvh_logs.l[i].text;

		if (fvh_logs.l[i].level != NCCL_LOG_WARN || fo_flight_line(t))
			continue;
		if (any && strstr(t, any)) {
			snprintf(buf, len, "%.240s", t);
			break;
		}
		if (!strstr(t, "went down") && !strstr(t, "the device failed") &&
		    !strstr(t, "moved from") && !strstr(t, "async event QP_FATAL") &&
		    !strstr(t, "completions owed"))
			snprintf(buf, len, "%.240s", t);
	}
	pthread_mutex_unlock(&fvh_log_lock);
}

/* A call failed (res): allowed where no port is left (then named), else a finding. */
static void fo_call_failed(struct fo_run *R, const char *call, int id, ncclResult_t res)
{
	char cat[96], wc[FVH_LINE] = "", warn[256];

	R->stop = 1;
	fo_trace(R, "%s %d failed: %d", call, id, (int)res);
	if (fo_may_fail(R)) {
		if (!fvh_log_count(NCCL_LOG_WARN, NULL, NULL))
			fo_fail(R, "unnamed-error", "%s %d failed (%d) with no WARN naming why", call, id,
				(int)res);
		return;
	}
	if (!strncmp(call, "regMr", 5) && fvh_calls(R->F, 0, "ibv_reg_mr", "ret=EIO", "device dead",
						   wc) + fvh_calls(R->F, 0, "ibv_reg_mr_iova2", "ret=EIO", "device dead", wc) +
	    fvh_calls(R->F, 0, "ibv_reg_dmabuf_mr", "ret=EIO", "device dead", wc)) {
		fo_fail(R, "item3-regmr-on-dead-hca", "%s failed (%d) after DEVICE_FATAL with %d usable "
			"port(s) left; the fake: %s", call, (int)res, fo_ports_left(R), wc);
		return;
	}
	if (fo_key_error(R->F, cat, sizeof(cat), wc, sizeof(wc))) {
		fo_fail(R, cat, "%s %d failed (%d) with %d usable port(s) left; the fake: %s", call, id,
			(int)res, fo_ports_left(R), wc);
		return;
	}
	fo_last_warn(warn, sizeof(warn), R->S->p.flush_host ? "DMA-BUF fd was not kept" : NULL);
	if (R->S->p.flush_host && strstr(warn, "DMA-BUF fd was not kept")) {
		fo_fail(R, "new-flushhost-rehome-EBADF", "%s %d failed (%d): a host buffer of a receive "
			"comm with NCCL_RAIL_IB_FLUSH_HOST=1 cannot be registered on the new HCA after a "
			"move: %s", call, id, (int)res, warn);
		return;
	}
	if (strstr(warn, "Input/output error") &&
	    (strstr(warn, "ibv_reg_mr") || strstr(warn, "the move to another path"))) {
		fo_fail(R, "new-move-onto-dead-hca", "%s %d failed (%d) with %d usable port(s) left: %s",
			call, id, (int)res, fo_ports_left(R), warn);
		return;
	}
	if (strstr(warn, "protocol error")) {
		fo_fail(R, R->recv_died ? "item1-protocol-error" : "protocol-error", "%s %d failed (%d) "
			"with %d usable port(s) left: %s", call, id, (int)res, fo_ports_left(R), warn);
		return;
	}
	fo_fail(R, R->faults ? "error-after-fault" : "error-without-fault",
		"%s %d failed (%d) with %d usable port(s) left: %s", call, id, (int)res,
		fo_ports_left(R), warn);
}

/*
 * Nothing moved for FO_IDLE_NS and no call failed. An old key the fake
 * refused (item 2) often comes first: a write that completed early failed
 * later, the sender's comm failed silently (NCCL does not call it again)
 * and the receiver waits for its part of the move for ever.
 */
static void fo_hang(struct fo_run *R, const char *fmt, ...)
{
	char cat[96], wc[FVH_LINE] = "", what[500], warn[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (fo_key_error(R->F, cat, sizeof(cat), wc, sizeof(wc))) {
		strncat(cat, "-then-hang", sizeof(cat) - strlen(cat) - 1);
		fo_fail(R, cat, "%s; the fake refused a key first: %s", what, wc);
		return;
	}
	if (R->stall_dev >= 0 && !fvh_log_count(NCCL_LOG_WARN, "completions owed", NULL)) {
		fo_fail(R, "new-stall-of-idle-sender-unseen", "%s; the stall was never seen (no "
			"\"completions owed\" WARN: the sender, its sends all complete, is not called)",
			what);
		return;
	}
	fo_last_warn(warn, sizeof(warn), "the connection fails");
	if (strstr(warn, "the connection fails") || strstr(warn, "completion error")) {
		fo_fail(R, "new-peer-failed-silently", "%s; a comm failed and its peer waits for it: "
			"%s", what, warn);
		return;
	}
	fo_fail(R, fo_ports_left(R) ? "hang" : "hang-no-port-left", "%s", what);
}

/* Receive k's buffer i holds message m's bytes, its size reported, and nothing beyond. */
static void fo_check_buf(struct fo_run *R, int k, int i)
{
	const struct fo_traffic *tr = &R->S->tr;
	int m = tr->rfirst[k] + i, s = (k % tr->wr) * R->maxn + i;
	const struct fo_msg *msg = &tr->msg[m];
	const uint8_t *p = fo_slot_buf(&R->mem[1], s);
	size_t bad;
	int got = R->rgot[k][i];

	if (got != (int)msg->size) {
		fo_fail(R, R->recv_died ? "item1-corruption" : "wrong-size",
			"receive %d buffer %d (message m%d, tag %d): %d bytes reported, %u sent", k, i, m,
			msg->tag, got, msg->size);
		return;
	}
	if (R->S->p.dmabuf[0] || R->S->p.dmabuf[1])
		return;	/* GPU memory on a side: the fake moved no bytes (sizes checked) */
	bad = fo_diff(p, msg->size, R->S->seed, m);
	if (bad < msg->size) {
		int whose = fo_whose(p, msg->size, bad, R->S->seed, tr->nmsg);

		fo_fail(R, R->recv_died ? "item1-corruption" : "corruption",
			"receive %d buffer %d (message m%d, tag %d, %u bytes): byte %zu differs (0x%02x); "
			"the word there is %s%d's", k, i, m, msg->tag, msg->size, bad, p[bad],
			whose >= 0 ? "message m" : "no message's: ", whose);
		return;
	}
	for (size_t b = msg->size; b < msg->posted + FO_GUARD && b < R->mem[1].slot[s].len + FO_GUARD;
	     b++)
		if (p[b] != FO_POISON) {
			fo_fail(R, R->recv_died ? "item1-corruption" : "overrun", "receive %d buffer %d "
				"(message m%d, %u bytes of %u posted): "
				"byte %zu past the message was written", k, i, m, msg->size, msg->posted, b);
			return;
		}
}

#endif
