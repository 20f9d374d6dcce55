/*
 * rail-check: one device pair tested through the plugin's version-neutral
 * API (what NCCL reaches through the ABI shims): listen, exchange handles,
 * connect and accept; a pattern both ways with every byte checked; a
 * small-message ping-pong (median half round trip); a few MiB each way
 * (bandwidth, every byte checked). Each phase is bounded by --timeout and
 * ends with both sides exchanging their outcome on the pair's control
 * connection, so both stop at the same phase and name the same failure.
 */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "log.h"
#include "rail.h"
#include "check/check.h"

int rail_ck_verbose;

/* ---- the plugin's warnings, kept for the failure reasons --------------- */

static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static char warn_last[RAIL_CK_WHY];

void rail_ck_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		    const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	(void)flags, (void)file, (void)line;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (level == NCCL_LOG_WARN) {
		const char *m = strncmp(msg, "NET/Rail : ", 11) ? msg : msg + 11;

		pthread_mutex_lock(&warn_lock);
		rail_strlcpy(warn_last, m, sizeof(warn_last));
		pthread_mutex_unlock(&warn_lock);
	}
	if (rail_ck_verbose || ((int)level <= rail_log_level() && getenv("NCCL_DEBUG")))
		fprintf(stderr, "%s%s\n", level == NCCL_LOG_WARN ? "WARN " : "", msg);
}

void rail_ck_last_warning(char *buf, size_t len)
{
	pthread_mutex_lock(&warn_lock);
	rail_strlcpy(buf, warn_last, len);
	warn_last[0] = '\0';
	pthread_mutex_unlock(&warn_lock);
}

/* ---- one device pair ----------------------------------------------------- */

struct link {
	const struct rail_ck_opts *o;
	void *ctx;
	int fd, role, mine, theirs;
	void *lc, *send, *recv, *smh, *rmh;
	char *sbuf, *rbuf;
	size_t blen;
	int window;
	uint64_t deadline;
	char peer_data[RAIL_ADDR_STRLEN + 32];
	int failed;
	const char *res;	/* the result's meaning, when the plugin said nothing */
	char why[RAIL_CK_WHY];
};

__attribute__((format(printf, 2, 3))) static void fail(struct link *l, const char *fmt, ...)
{
	char plugin[RAIL_CK_WHY];
	va_list ap;

	if (l->failed++)
		return;
	va_start(ap, fmt);
	vsnprintf(l->why, sizeof(l->why), fmt, ap);
	va_end(ap);
	rail_ck_last_warning(plugin, sizeof(plugin));
	if (plugin[0])	/* the plugin's own words say more than the result code */
		rail_ck_catf(l->why, sizeof(l->why), ": %s", plugin);
	else if (l->res)
		rail_ck_catf(l->why, sizeof(l->why), ": %s", l->res);
	l->res = NULL;
}

static const char *res_text(ncclResult_t r)
{
	switch (r) {
	case ncclRemoteError:
		return "the peer failed, or the network between the two devices dropped the "
		       "connection";
	case ncclSystemError:
		return "a system or device error on this host";
	default:
		return "an error in the plugin";
	}
}

/* 1 when the phase ran out of time (and says so). */
static int late(struct link *l, const char *what)
{
	if (rail_now_ns() < l->deadline)
		return 0;
	fail(l, "%s: nothing within %.0f s (a dead link, a GID or route the peer cannot reach, "
	     "or a firewall; --timeout waits longer)", what, l->o->timeout);
	return 1;
}

static void idle(unsigned *n)
{
	if (++*n > 256)
		usleep(50);
	else
		sched_yield();
}

static int wait_req(struct link *l, void *req, const char *what)
{
	unsigned spins = 0;
	int done = 0;

	while (!done) {
		ncclResult_t r = rail_net_test(req, &done, NULL);

		if (r != ncclSuccess) {
			l->res = res_text(r);
			fail(l, "%s", what);
			return -1;
		}
		if (!done) {
			if (late(l, what))
				return -1;
			idle(&spins);
		}
	}
	return 0;
}

static void *post(struct link *l, int is_send, void *buf, size_t size, const char *what)
{
	void *req = NULL, *data = buf;
	int tag = is_send ? l->role + 1 : 2 - l->role;
	unsigned spins = 0;

	while (!req) {
		ncclResult_t r = is_send
			? rail_net_isend(l->send, buf, size, tag, l->smh, &req)
			: rail_net_irecv(l->recv, 1, &data, &size, &tag, &l->rmh, &req);

		if (r != ncclSuccess) {
			l->res = res_text(r);
			fail(l, "%s: posting failed", what);
			return NULL;
		}
		if (!req && (late(l, what), l->failed))
			return NULL;
		if (!req)
			idle(&spins);
	}
	return req;
}

/* Word i of message msg from side role. */
static uint64_t pattern_word(int role, uint64_t msg, uint64_t i)
{
	return ((msg << 32 ^ i) + (uint64_t)role * 0x5851f42d4c957f2dull) * 0x9e3779b97f4a7c15ull;
}

static void pattern_fill(char *b, size_t size, int role, uint64_t msg)
{
	for (size_t i = 0; i < size; i += 8) {
		uint64_t v = pattern_word(role, msg, i / 8);

		memcpy(b + i, &v, RAIL_MIN(8, size - i));
	}
}

/* The first wrong byte, or size. */
static size_t pattern_check(const char *b, size_t size, int role, uint64_t msg)
{
	for (size_t i = 0; i < size; i += 8) {
		uint64_t v = pattern_word(role, msg, i / 8);
		size_t n = RAIL_MIN(8, size - i);

		if (memcmp(b + i, &v, n))
			for (size_t k = 0; k < n; k++)
				if (b[i + k] != ((char *)&v)[k])
					return i + k;
	}
	return size;
}

/* ---- phases ------------------------------------------------------------ */

/* The outcome of a phase both ways: 0 both fine; -1 one failed (cell why set); -2 control lost. */
static int settle(struct link *l, const char *phase, struct rail_ck_cell *cell, double *peer_value,
		  double my_value)
{
	char out[RAIL_CK_WHY + 64], in[RAIL_CK_WHY + 64], *tab;
	size_t got;
	uint64_t dl = rail_ck_deadline(l->o->timeout + 10);

	snprintf(out, sizeof(out), "%d\t%.6f\t%s", l->failed ? 1 : 0, my_value,
		 l->failed ? l->why : "");
	if (rail_ck_msg_send(l->fd, RAIL_CK_MSG_STATUS, out, strlen(out), dl) ||
	    rail_ck_msg_recv(l->fd, RAIL_CK_MSG_STATUS, in, sizeof(in), &got, dl)) {
		fail(l, "%s: the peer's rail-check stopped answering on the control connection",
		     phase);
		rail_strlcpy(cell->step, phase, sizeof(cell->step));
		rail_strlcpy(cell->why, l->why, sizeof(cell->why));
		return -2;
	}
	if (peer_value)
		*peer_value = atof(strchr(in, '\t') ? strchr(in, '\t') + 1 : "0");
	if (!l->failed && in[0] == '0')
		return 0;
	rail_strlcpy(cell->step, phase, sizeof(cell->step));
	tab = strchr(in, '\t');
	tab = tab ? strchr(tab + 1, '\t') : NULL;
	if (l->failed && in[0] != '0' && tab)
		snprintf(cell->why, sizeof(cell->why), "this side: %.*s; the peer: %.*s",
			 (int)(sizeof(cell->why) / 2 - 24), l->why, (int)(sizeof(cell->why) / 2 - 24),
			 tab + 1);
	else if (l->failed)
		cell->why[0] = '\0', rail_ck_catf(cell->why, sizeof(cell->why), "this side: %s", l->why);
	else
		cell->why[0] = '\0', rail_ck_catf(cell->why, sizeof(cell->why), "the peer: %s",
					      tab ? tab + 1 : "?");
	return -1;
}

static void phase_connect(struct link *l)
{
	char mine[NCCL_NET_HANDLE_MAXSIZE] = { 0 }, theirs[NCCL_NET_HANDLE_MAXSIZE + 1] = { 0 };
	char why[128];
	struct rail_handle ph;
	unsigned spins = 0;
	size_t got = 0;
	ncclResult_t r;

	r = rail_net_listen(l->ctx, l->mine, mine, &l->lc);
	if (r != ncclSuccess) {
		l->res = res_text(r);
		fail(l, "listen on device %d", l->mine);
		l->lc = NULL;
	}
	if (rail_ck_msg_send(l->fd, RAIL_CK_MSG_HANDLE, mine, sizeof(mine), l->deadline) ||
	    rail_ck_msg_recv(l->fd, RAIL_CK_MSG_HANDLE, theirs, sizeof(theirs), &got, l->deadline) ||
	    got != sizeof(mine))
		return fail(l, "exchanging connection handles: the peer's rail-check stopped "
			    "answering");
	if (l->failed)
		return;
	if (rail_handle_decode(theirs, sizeof(mine), &ph, why, sizeof(why)) == 0)
		rail_sockaddr_str(&ph.addr, l->peer_data, sizeof(l->peer_data));
	else
		l->peer_data[0] = '\0', rail_ck_catf(l->peer_data, sizeof(l->peer_data),
						 "(unreadable handle: %s)", why);
	while (!l->send || !l->recv) {
		if (!l->send && (r = rail_net_connect(l->ctx, l->mine, -1, theirs, &l->send)))
			return l->res = res_text(r), fail(l, "connect to the peer's address %s",
							    l->peer_data);
		if (!l->recv && (r = rail_net_accept(l->lc, &l->recv)))
			return l->res = res_text(r), fail(l, "accept the peer's connection");
		if (l->send && l->recv)
			break;
		if (late(l, l->send ? "accepting the peer's connection"
				    : "connecting to the peer's data address"))
			return;
		idle(&spins);
	}
}

static void phase_register(struct link *l)
{
	ncclResult_t r;

	l->window = 4;
	l->blen = l->o->bw_msg * (size_t)l->window;
	if (posix_memalign((void **)&l->sbuf, 4096, l->blen) ||
	    posix_memalign((void **)&l->rbuf, 4096, l->blen))
		return fail(l, "cannot allocate %zu bytes of buffers (--bw-msg smaller?)", l->blen);
	memset(l->sbuf, 0, l->blen);
	memset(l->rbuf, 0, l->blen);
	if ((r = rail_net_reg_mr(l->send, l->sbuf, l->blen, NCCL_PTR_HOST, &l->smh)))
		return l->smh = NULL, l->res = res_text(r), fail(l, "registering the send buffer");
	if ((r = rail_net_reg_mr(l->recv, l->rbuf, l->blen, NCCL_PTR_HOST, &l->rmh)))
		return l->rmh = NULL, l->res = res_text(r),
		       fail(l, "registering the receive buffer");
}

/* A pattern both ways, every byte checked. */
static void phase_pattern(struct link *l)
{
	size_t size = RAIL_MIN((size_t)65536 + 13, l->blen);
	void *rr, *sr;
	size_t bad;

	pattern_fill(l->sbuf, size, l->role, 7);
	rr = post(l, 0, l->rbuf, size, "receiving the pattern");
	sr = rr ? post(l, 1, l->sbuf, size, "sending the pattern") : NULL;
	if (!sr || wait_req(l, sr, "sending the pattern") || wait_req(l, rr, "receiving the pattern"))
		return;
	bad = pattern_check(l->rbuf, size, !l->role, 7);
	if (bad != size)
		fail(l, "data corrupted: byte %zu of the %zu-byte pattern from the peer is wrong",
		     bad, size);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Small-message ping-pong; the median half round trip in microseconds. */
static double phase_latency(struct link *l)
{
	int n = l->o->lat_iters;
	uint64_t *rtt = calloc((size_t)n, sizeof(*rtt)), t = rail_now_ns();
	double med = 0;

	if (!rtt)
		return fail(l, "out of memory"), 0;
	for (int i = 0; i < n && !l->failed; i++) {
		void *rr = post(l, 0, l->rbuf, 8, "ping-pong"), *sr;
		uint64_t now;

		if (!rr)
			break;
		if (l->role == 1 && wait_req(l, rr, "ping-pong: waiting for the ping"))
			break;
		sr = post(l, 1, l->sbuf, 8, "ping-pong");
		if (!sr || wait_req(l, sr, "ping-pong: sending"))
			break;
		if (l->role == 0 && wait_req(l, rr, "ping-pong: waiting for the pong"))
			break;
		now = rail_now_ns();
		rtt[i] = now - t;
		t = now;
	}
	if (!l->failed) {
		qsort(rtt, (size_t)n, sizeof(*rtt), cmp_u64);
		med = (double)rtt[n / 2] / 2e3;
	}
	free(rtt);
	return med;
}

/* The sender's side of one direction: bytes / time until the receiver's ack. */
static double bw_send(struct link *l, int nmsg)
{
	void *req[8], *ack;
	int posted = 0, done = 0;
	uint64_t t0 = rail_now_ns();

	ack = post(l, 0, l->rbuf, 1, "bandwidth: posting the receive of the ack");
	while (ack && done < nmsg && !l->failed) {
		while (posted < nmsg && posted - done < l->window) {
			char *b = l->sbuf + (size_t)(posted % l->window) * l->o->bw_msg;

			pattern_fill(b, l->o->bw_msg, l->role, 100 + (uint64_t)posted);
			if (!(req[posted % l->window] = post(l, 1, b, l->o->bw_msg, "bandwidth: send")))
				return 0;
			posted++;
		}
		if (wait_req(l, req[done % l->window], "bandwidth: sending"))
			return 0;
		done++;
	}
	if (!ack || l->failed || wait_req(l, ack, "bandwidth: waiting for the receiver's ack"))
		return 0;
	return (double)nmsg * (double)l->o->bw_msg / ((double)(rail_now_ns() - t0) / 1e9) / 1e9;
}

static void bw_recv(struct link *l, int nmsg)
{
	void *req[8], *ack;
	int posted = 0, done = 0;

	while (done < nmsg && !l->failed) {
		while (posted < nmsg && posted - done < l->window) {
			char *b = l->rbuf + (size_t)(posted % l->window) * l->o->bw_msg;

			if (!(req[posted % l->window] = post(l, 0, b, l->o->bw_msg, "bandwidth: receive")))
				return;
			posted++;
		}
		if (wait_req(l, req[done % l->window], "bandwidth: receiving"))
			return;
		if (pattern_check(l->rbuf + (size_t)(done % l->window) * l->o->bw_msg, l->o->bw_msg,
				  !l->role, 100 + (uint64_t)done) != l->o->bw_msg)
			return fail(l, "data corrupted in bandwidth message %d from the peer", done);
		done++;
	}
	ack = post(l, 1, l->sbuf, 1, "bandwidth: sending the ack");
	if (ack)
		wait_req(l, ack, "bandwidth: sending the ack");
}

static void release(struct link *l)
{
	if (l->smh)
		rail_net_dereg_mr(l->send, l->smh);
	if (l->rmh)
		rail_net_dereg_mr(l->recv, l->rmh);
	if (l->send)
		rail_net_close_send(l->send);
	if (l->recv)
		rail_net_close_recv(l->recv);
	if (l->lc)
		rail_net_close_listen(l->lc);
	free(l->sbuf);
	free(l->rbuf);
	rail_ck_last_warning((char[8]){ 0 }, 8);	/* a close's warnings belong to no check */
}

static int next_phase(struct link *l)
{
	l->deadline = rail_ck_deadline(l->o->timeout);
	return 0;
}

int rail_ck_pair_test(const struct rail_ck_opts *o, void *ctx, int fd, int role, int mine,
		      int theirs, struct rail_ck_cell *cell)
{
	struct link l = { .o = o, .ctx = ctx, .fd = fd, .role = role, .mine = mine,
			  .theirs = theirs };
	int nmsg = (int)RAIL_MAX(o->bw_bytes / o->bw_msg, 1), rc;
	double peer_bw = 0, bw = 0, lat;

	cell->tested = 1;
	rail_ck_last_warning((char[8]){ 0 }, 8);
	next_phase(&l);
	phase_connect(&l);
	if ((rc = settle(&l, "connect", cell, NULL, 0)))
		goto out;
	next_phase(&l);
	phase_register(&l);
	if (!l.failed)
		phase_pattern(&l);
	if ((rc = settle(&l, "pattern", cell, NULL, 0)))
		goto out;
	next_phase(&l);
	lat = phase_latency(&l);
	if ((rc = settle(&l, "latency", cell, NULL, lat)))
		goto out;
	cell->lat_us = lat;
	for (int dir = 0; dir < 2; dir++) {
		next_phase(&l);
		if (dir == role)
			bw = bw_send(&l, nmsg);
		else
			bw_recv(&l, nmsg);
		if ((rc = settle(&l, "bandwidth", cell, &peer_bw, dir == role ? bw : 0)))
			goto out;
	}
	cell->bw = bw;
	cell->ok = 1;
out:
	release(&l);
	return rc == -2 ? -1 : 0;
}
