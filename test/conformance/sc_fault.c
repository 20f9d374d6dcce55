/*
 * Conformance scenarios about failure and lifetime: close-inflight,
 * peer-dies, bad-handle, reload.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"

static size_t cap_size(size_t s, size_t cap)
{
	return s < cap ? s : cap;
}

/* ---- close-inflight ---- */

struct ci {
	size_t sz;
	int n;
	uint8_t *buf[8];
	void *req[8];
};

/* A request that finished: a receive must hold exactly message i. */
static void ci_done(struct rail_conf *cx, struct ci *c, int i, ncclResult_t res, int done,
		    int size)
{
	char why[512];

	if (res != ncclSuccess || !done || cx->role != RAIL_CONF_ROLE_A)
		return;
	RAIL_CONF_CHECK(cx, size == (int)c->sz,
			"receive #%d completed while the comms were closing, with %d bytes of %zu",
			i, size, c->sz);
	if (rail_conf_verify(c->buf[i], c->sz, rail_conf_seed(cx, 1, (unsigned)i, 0), why,
			     sizeof(why)))
		rail_conf_fail(cx, "receive #%d completed while the comms were closing: %s", i, why);
}

/* Test what is in flight once; a done or failed request is never tested again. */
static void ci_test_all(struct rail_conf *cx, struct ci *c)
{
	for (int i = 0; i < c->n; i++) {
		int done = 0, sizes[RAIL_CONF_MAX_RECVS] = { -1 };
		ncclResult_t res;

		if (!c->req[i])
			continue;
		res = cx->net.test(c->req[i], &done, sizes);
		ci_done(cx, c, i, res, done, sizes[0]);
		if (res != ncclSuccess || done)
			c->req[i] = NULL;
	}
}

/* Post each request once (a few tries on NULL). */
static void ci_post(struct rail_conf *cx, void *comm, struct rail_conf_arena *a, struct ci *c)
{
	int is_recv = cx->role == RAIL_CONF_ROLE_A;
	uint64_t until;

	for (int i = 0; i < c->n; i++) {
		uint64_t seed = rail_conf_seed(cx, 1, (unsigned)i, 0);
		ncclResult_t res = ncclSuccess;
		int tag = 1;

		c->buf[i] = rail_conf_arena_take(cx, a, c->sz);
		if (is_recv)
			rail_conf_poison(c->buf[i], c->sz + RAIL_CONF_GUARD, seed);
		else
			rail_conf_fill(c->buf[i], c->sz, seed);
		c->req[i] = NULL;
		/*
		 * A NULL request means "retry later" (a receiver-driven transport
		 * has no clear-to-send yet). Retry the same message; skipping it
		 * would shift every later send into the wrong receive. If it is
		 * still refused at the deadline, post nothing after it.
		 */
		until = rail_conf_now_ns() + 5000000000ull;
		while (res == ncclSuccess && !c->req[i] && rail_conf_now_ns() < until) {
			void *data[1] = { c->buf[i] };
			size_t size = c->sz;

			res = is_recv ? cx->net.irecv(comm, 1, data, &size, &tag, &a->mh, &c->req[i])
				      : cx->net.isend(comm, c->buf[i], c->sz, tag, a->mh, &c->req[i]);
			if (!c->req[i])
				sched_yield();
		}
		RAIL_CONF_CHECK(cx, res == ncclSuccess, "%s #%d returned %s", is_recv ? "irecv" : "isend",
				i, rail_conf_result_str(res));
		if (!c->req[i]) {
			for (int j = i + 1; j < c->n; j++)
				c->req[j] = NULL;
			return;
		}
	}
}

static void close_comms(struct rail_conf *cx, struct rail_conf_pair *p, struct rail_conf_arena *a)
{
	rail_conf_arena_dereg(cx, a);
	if (cx->role == RAIL_CONF_ROLE_A) {
		rail_conf_close_recv(cx, p->comm);
		rail_conf_close_listen(cx, p->lc);
	} else {
		rail_conf_close_send(cx, p->comm);
	}
}

/* Round 0: both close at once; round 1: the receiver first; round 2: the sender first. */
static void close_round(struct rail_conf *cx, int round)
{
	int first = round == 1 ? RAIL_CONF_ROLE_A : RAIL_CONF_ROLE_B;
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	struct ci c;
	char name[32];

	memset(&c, 0, sizeof(c));
	c.sz = cap_size(8 * RAIL_CONF_MIB, rail_conf_common_max_msg(cx));
	c.n = cx->role == RAIL_CONF_ROLE_A ? 4 : 8;
	rail_conf_pair_open(cx, &p);
	rail_conf_arena_init(cx, &a, p.comm, (size_t)c.n * rail_conf_slice_room(c.sz));
	ci_post(cx, p.comm, &a, &c);
	ci_test_all(cx, &c);
	snprintf(name, sizeof(name), "ci-posted-%d", round);
	rail_conf_barrier(cx, name);
	if (round == 0 || cx->role == first) {
		close_comms(cx, &p, &a);
		if (round)
			rail_conf_ctl_send(cx, RAIL_CONF_MSG_DONE, NULL, 0);
	} else {
		uint64_t until;

		rail_conf_ctl_recv(cx, RAIL_CONF_MSG_DONE, NULL, 0);
		/* The peer closed: requests may fail or stay pending, never crash or lie. */
		until = rail_conf_now_ns() + 200000000ull;
		while (rail_conf_now_ns() < until) {
			ci_test_all(cx, &c);
			sched_yield();
		}
		close_comms(cx, &p, &a);
	}
	/* Unmapped now: a plugin still writing there crashes this role. */
	rail_conf_arena_free(&a);
	rail_conf_sleep_ms(100);
	snprintf(name, sizeof(name), "ci-closed-%d", round);
	rail_conf_barrier(cx, name);
}

int rail_conf_close_inflight(struct rail_conf *cx)
{
	static const size_t sizes[] = { 1, 65537, 4 * RAIL_CONF_MIB };
	struct rail_conf_pair p;

	for (int round = 0; round < 3; round++)
		close_round(cx, round);
	rail_conf_pair_open(cx, &p);
	rail_conf_simple_traffic(cx, &p, 2, sizes, NULL, 3, "a new connection after the closes");
	rail_conf_pair_close(cx, &p);
	return 0;
}

/* ---- peer-dies ---- */

struct slot {
	uint8_t *buf;
	void *req;
	unsigned msg;
};

static RAIL_CONF_NORETURN void peer_dies_sender(struct rail_conf *cx, void *sc, size_t sz)
{
	struct rail_conf_arena a;
	struct slot s[2];
	unsigned next = 0;
	int pid = getpid();

	rail_conf_arena_init(cx, &a, sc, 2 * rail_conf_slice_room(sz));
	for (int i = 0; i < 2; i++) {
		s[i].buf = rail_conf_arena_take(cx, &a, sz);
		s[i].req = NULL;
	}
	/* The verdict goes first: this role ends by SIGKILL from role A. */
	rail_conf_report(cx, "PASS", "");
	rail_conf_expect_kill(cx);
	rail_conf_ctl_send(cx, RAIL_CONF_MSG_PID, &pid, sizeof(pid));
	rail_conf_stage(cx, "sending until killed");
	while (!rail_conf_expired(cx)) {
		for (int i = 0; i < 2; i++) {
			int done = 0, size;

			if (!s[i].req) {
				s[i].msg = next;
				rail_conf_fill(s[i].buf, sz, rail_conf_seed(cx, 1, next, 0));
				if (cx->net.isend(sc, s[i].buf, sz, 1, a.mh, &s[i].req) != ncclSuccess)
					rail_conf_sleep_ms(1000); /* A will notice; wait for the kill */
				if (s[i].req)
					next++;
			} else if (cx->net.test(s[i].req, &done, &size) != ncclSuccess || done) {
				s[i].req = NULL;
			}
		}
		sched_yield();
	}
	_exit(0);
}

static int slot_step(struct rail_conf *cx, void *rc, struct rail_conf_arena *a, struct slot *s,
		     size_t sz, unsigned *next, ncclResult_t *err)
{
	int done = 0, sizes[RAIL_CONF_MAX_RECVS] = { -1 }, tag = 1;
	char why[512];

	if (!s->req) {
		void *data[1] = { s->buf };
		size_t size = sz;

		s->msg = *next;
		rail_conf_poison(s->buf, sz + RAIL_CONF_GUARD, rail_conf_seed(cx, 1, s->msg, 0));
		*err = cx->net.irecv(rc, 1, data, &size, &tag, &a->mh, &s->req);
		if (s->req)
			(*next)++;
		return 0;
	}
	*err = cx->net.test(s->req, &done, sizes);
	if (*err != ncclSuccess || !done)
		return 0;
	s->req = NULL;
	RAIL_CONF_CHECK(cx, sizes[0] == (int)sz, "message %u: test reported %d bytes, sent %zu",
			s->msg, sizes[0], sz);
	if (rail_conf_verify(s->buf, sz, rail_conf_seed(cx, 1, s->msg, 0), why, sizeof(why)))
		rail_conf_fail(cx, "message %u (completed %s the sender was killed): %s", s->msg,
			       "around the time", why);
	return 1;
}

/*
 * The failure logged the receive comm's flight record, naming the peer and a
 * receive in flight by its size and tag (src/flight.c).
 */
static void peer_dies_flight(struct rail_conf *cx, size_t sz, ncclResult_t err)
{
	char want[64];
	const char *record[] = { "flight record of", "receive comm" };
	const char *inflight[] = { "in flight: recv", want };
	const char *peer[] = { "flight record of", "receive comm (peer " };

	snprintf(want, sizeof(want), "size=%zu tag=1", sz);
	RAIL_CONF_CHECK(cx, rail_conf_warn_has(record, 2), "the receive failed with %s but the "
			"plugin logged no flight record of the receive comm",
			rail_conf_result_str(err));
	RAIL_CONF_CHECK(cx, rail_conf_warn_has(inflight, 2), "the flight record names no "
			"receive in flight with %s", want);
	RAIL_CONF_CHECK(cx, rail_conf_warn_has(peer, 2), "the flight record does not name "
			"the peer (the transport's describe_comm)");
}

int rail_conf_peer_dies(struct rail_conf *cx)
{
	size_t sz = cap_size(cx->full ? 64 * RAIL_CONF_MIB : 16 * RAIL_CONF_MIB,
			     rail_conf_common_max_msg(cx));
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	struct slot s[2];
	unsigned next = 0;
	int pid = 0, received = 0, after = 0;
	uint64_t t_kill = 0;
	ncclResult_t err = ncclSuccess;

	if (cx->opts->host_role >= 0)
		return rail_conf_peer_dies_2h(cx);
	rail_conf_pair_open(cx, &p);
	if (cx->role == RAIL_CONF_ROLE_B)
		peer_dies_sender(cx, p.comm, sz);
	rail_conf_ctl_recv(cx, RAIL_CONF_MSG_PID, &pid, sizeof(pid));
	rail_conf_arena_init(cx, &a, p.comm, 2 * rail_conf_slice_room(sz));
	for (int i = 0; i < 2; i++) {
		s[i].buf = rail_conf_arena_take(cx, &a, sz);
		s[i].req = NULL;
	}
	rail_conf_stage(cx, "receiving %zu-byte messages", sz);
	while (err == ncclSuccess) {
		for (int i = 0; i < 2 && err == ncclSuccess; i++) {
			int got = slot_step(cx, p.comm, &a, &s[i], sz, &next, &err);

			received += got;
			after += got && t_kill;
		}
		if (err != ncclSuccess)
			break;
		if (received >= 2 && !t_kill) {
			rail_conf_stage(cx, "killed the sender; waiting for an error");
			kill(pid, SIGKILL);
			t_kill = rail_conf_now_ns();
		}
		if (rail_conf_expired(cx))
			rail_conf_fail(cx, "no error %.1f s after the sender was killed (%d messages "
				       "completed since, requests still in flight)",
				       (double)(rail_conf_now_ns() - t_kill) / 1e9, after);
		sched_yield();
	}
	RAIL_CONF_CHECK(cx, t_kill, "error %s after %d messages, before the sender was killed",
			rail_conf_result_str(err), received);
	RAIL_CONF_CHECK(cx, rail_conf_warn_count() > 0,
			"the receive failed with %s but the plugin printed no WARN",
			rail_conf_result_str(err));
	peer_dies_flight(cx, sz, err);
	rail_conf_note(cx, "%s %.0f ms after the kill (%d complete messages after it)",
		       rail_conf_result_str(err), (double)(rail_conf_now_ns() - t_kill) / 1e6, after);
	rail_conf_arena_dereg(cx, &a);
	rail_conf_close_recv(cx, p.comm);
	rail_conf_close_listen(cx, p.lc);
	rail_conf_arena_free(&a);
	return 0;
}

/* ---- peer-stops ---- */

/* The bound the scenario sets (main.c: NCCL_RAIL_STALL_TIMEOUT for the roles). */
#define PS_BOUND_S 2

/* 1 once /proc says the process is stopped (state T). */
static int ps_stopped(int pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'T';
}

/* B: an idle gap longer than the bound, one small message; then a big one and SIGSTOP. */
static RAIL_CONF_NORETURN void peer_stops_sender(struct rail_conf *cx, void *sc, size_t sz)
{
	struct rail_conf_arena a;
	void *req = NULL;
	int pid = getpid(), size = 0;

	rail_conf_arena_init(cx, &a, sc, sz);
	if (cx->full) {
		rail_conf_barrier(cx, "ps-idle-posted");
		rail_conf_stage(cx, "idle for %d s before sending", PS_BOUND_S + 2);
		rail_conf_sleep_ms((PS_BOUND_S + 2) * 1000);
		rail_conf_fill(a.base, 4096, rail_conf_seed(cx, 2, 0, 0));
		while (!req)
			RAIL_CONF_CALL(cx, cx->net.isend(sc, a.base, 4096, 1, a.mh, &req), "isend");
		RAIL_CONF_CALL(cx, rail_conf_wait(cx, req, &size, "the message after the gap"),
			       "test");
		req = NULL;
	}
	rail_conf_barrier(cx, "ps-posted");
	/* The verdict goes first: this role ends stopped, then SIGKILLed by role A. */
	rail_conf_report(cx, "PASS", "");
	rail_conf_expect_kill(cx);
	rail_conf_ctl_send(cx, RAIL_CONF_MSG_PID, &pid, sizeof(pid));
	rail_conf_stage(cx, "isend %zu bytes, then SIGSTOP", sz);
	while (!req && !rail_conf_expired(cx))
		if (cx->net.isend(sc, a.base, sz, 1, a.mh, &req) != ncclSuccess)
			break;
	raise(SIGSTOP);
	_exit(0);
}

/* A: the small message after the gap must arrive (an idle receive is not a stall). */
static void peer_stops_idle(struct rail_conf *cx, void *rc, struct rail_conf_arena *a, size_t sz)
{
	void *req = NULL, *data[1] = { a->base };
	int tag = 1, size = 0;
	char why[256];

	while (!req)
		RAIL_CONF_CALL(cx, cx->net.irecv(rc, 1, data, &sz, &tag, &a->mh, &req), "irecv");
	rail_conf_barrier(cx, "ps-idle-posted");
	rail_conf_stage(cx, "a receive waiting %d s for its message (bound %d s)", PS_BOUND_S + 2,
			PS_BOUND_S);
	RAIL_CONF_CALL(cx, rail_conf_wait(cx, req, &size, "a receive whose message came after an "
					  "idle gap longer than the bound"),
		       "test of a receive whose sender was idle (not stopped) longer than the "
		       "stall bound: waiting between messages is normal");
	RAIL_CONF_CHECK(cx, size == 4096, "the message after the gap: %d bytes, sent 4096", size);
	if (rail_conf_verify(a->base, 4096, rail_conf_seed(cx, 2, 0, 0), why, sizeof(why)))
		rail_conf_fail(cx, "the message after the gap: %s", why);
}

/*
 * The sender stops (SIGSTOP) right after posting a large message: its host
 * still answers, so only the plugin can bound the receive. It must fail
 * with a WARN naming the peer and the message's size, a bound after the
 * stop (PS_BOUND_S, set through NCCL_RAIL_STALL_TIMEOUT), not before.
 * First (full ABIs) a receive whose sender is idle for longer than the
 * bound must still complete: the bound is for a message already started.
 */
int rail_conf_peer_stops(struct rail_conf *cx)
{
	size_t sz = cap_size(256 * RAIL_CONF_MIB, rail_conf_common_max_msg(cx));
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	void *req = NULL, *data[1];
	char ssz[32];
	const char *needles[2] = { ssz, "peer" };
	int pid = 0, tag = 1, done = 0, size = 0;
	uint64_t t_stop = 0;
	double dt;
	ncclResult_t res = ncclSuccess;

	if (cx->ctl_stream) {
		/* Role A watches (/proc) and finally kills role B's process: one host only. */
		rail_conf_skip_reason(cx, "two hosts: the receiver must see and kill the stopped "
				      "sender's process (one host only; the single-host run covers it)");
		return 1;
	}
	rail_conf_pair_open(cx, &p);
	if (cx->role == RAIL_CONF_ROLE_B)
		peer_stops_sender(cx, p.comm, sz);
	rail_conf_arena_init(cx, &a, p.comm, sz);
	if (cx->full)
		peer_stops_idle(cx, p.comm, &a, sz);
	data[0] = a.base;
	while (!req)
		RAIL_CONF_CALL(cx, cx->net.irecv(p.comm, 1, data, &sz, &tag, &a.mh, &req), "irecv");
	rail_conf_barrier(cx, "ps-posted");
	rail_conf_ctl_recv(cx, RAIL_CONF_MSG_PID, &pid, sizeof(pid));
	rail_conf_warn_reset();
	rail_conf_stage(cx, "receiving %zu bytes from a sender that stops", sz);
	while (res == ncclSuccess && !done) {
		if (!t_stop && ps_stopped(pid))
			t_stop = rail_conf_now_ns();
		res = cx->net.test(req, &done, &size);
		if (rail_conf_expired(cx)) {
			kill(pid, SIGKILL);
			rail_conf_fail(cx, "the sender stopped (SIGSTOP) %.1f s ago in the middle of a "
				       "%zu-byte message and the receive is still waiting (bound %d s)",
				       t_stop ? (double)(rail_conf_now_ns() - t_stop) / 1e9 : -1.0, sz,
				       PS_BOUND_S);
		}
		sched_yield();
	}
	dt = t_stop ? (double)(rail_conf_now_ns() - t_stop) / 1e9 : -1.0;
	kill(pid, SIGKILL);
	if (done) {
		rail_conf_skip_reason(cx, "the %zu-byte message completed although its sender "
				      "stopped (the NIC moved it without the process): nothing to "
				      "bound", sz);
	} else {
		snprintf(ssz, sizeof(ssz), "%zu", sz);
		RAIL_CONF_CHECK(cx, t_stop, "the receive failed (%s) before the sender stopped",
				rail_conf_result_str(res));
		RAIL_CONF_CHECK(cx, dt >= PS_BOUND_S / 2.0 && dt <= PS_BOUND_S + 5.0,
				"the receive failed %.1f s after the sender stopped; the bound is "
				"%d s", dt, PS_BOUND_S);
		RAIL_CONF_CHECK(cx, rail_conf_warn_has(needles, 2), "the stalled receive failed "
				"(%s) without a WARN naming the peer and the message's %s bytes",
				rail_conf_result_str(res), ssz);
		rail_conf_note(cx, "%s %.1f s after the sender stopped (bound %d s)",
			       rail_conf_result_str(res), dt, PS_BOUND_S);
	}
	rail_conf_arena_dereg(cx, &a);
	rail_conf_close_recv(cx, p.comm);
	rail_conf_close_listen(cx, p.lc);
	rail_conf_arena_free(&a);
	return done;
}

/* ---- bad-handle ---- */

/* A: the listener must accept nothing (and not fail) until B says DONE. */
void rail_conf_watch_listener(struct rail_conf *cx, void *lc, const char *what)
{
	rail_conf_stage(cx, "accepting while the peer tries %s handles", what);
	while (!rail_conf_ctl_poll(cx, RAIL_CONF_MSG_DONE, NULL, 0)) {
		void *rc = NULL, *dev_comm = NULL;
		ncclResult_t res = cx->net.accept(lc, &rc, &dev_comm);

		RAIL_CONF_CHECK(cx, res == ncclSuccess,
				"accept returned %s while the peer tried %s handles: a refused "
				"connection must not break the listen comm",
				rail_conf_result_str(res), what);
		RAIL_CONF_CHECK(cx, !rc, "accept returned a comm for a connection made with a %s "
				"handle", what);
		RAIL_CONF_CHECK(cx, !rail_conf_expired(cx), "the peer never finished (%s)", what);
		rail_conf_sleep_ms(1);
	}
}

/* B: connect with a bad handle until it fails; a comm must fail its first request. */
void rail_conf_connect_refused(struct rail_conf *cx, const uint8_t *handle, const char *what)
{
	uint8_t h[NCCL_NET_HANDLE_MAXSIZE];
	uint64_t t0 = rail_conf_now_ns(), until = t0 + 20000000000ull;
	int warns = rail_conf_warn_count(), calls = 0;
	ncclResult_t res = ncclSuccess;
	void *sc = NULL, *dev_comm = NULL;

	if (until > cx->deadline_ns)
		until = cx->deadline_ns;
	memcpy(h, handle, sizeof(h));
	rail_conf_stage(cx, "connect with %s", what);
	while (res == ncclSuccess && !sc) {
		res = cx->net.connect(&cx->net, cx->dev, h, &sc, &dev_comm);
		calls++;
		RAIL_CONF_CHECK(cx, rail_conf_now_ns() < until,
				"connect with %s neither failed nor completed in %.0f s (%d calls)",
				what, (double)(until - t0) / 1e9, calls);
		if (res == ncclSuccess && !sc)
			rail_conf_sleep_ms(1);
	}
	if (sc) {
		struct rail_conf_arena a;
		void *req = NULL;
		int done = 0, size;

		rail_conf_arena_init(cx, &a, sc, 4096);
		rail_conf_fill(a.base, 1024, 1);
		while (res == ncclSuccess && !done) {
			if (!req)
				res = cx->net.isend(sc, a.base, 1024, 1, a.mh, &req);
			else
				res = cx->net.test(req, &done, &size);
			RAIL_CONF_CHECK(cx, rail_conf_now_ns() < until,
					"connect with %s returned a comm whose first send neither "
					"failed nor completed", what);
		}
		RAIL_CONF_CHECK(cx, !done, "connect with %s succeeded and so did a send on it; "
				"the handle must be refused", what);
		rail_conf_arena_dereg(cx, &a);
		rail_conf_close_send(cx, sc);
		rail_conf_arena_free(&a);
	}
	RAIL_CONF_CHECK(cx, rail_conf_warn_count() > warns,
			"connect with %s failed with %s but printed no WARN saying why", what,
			rail_conf_result_str(res));
}

void rail_conf_good_connection(struct rail_conf *cx, void *lc, const uint8_t *handle)
{
	static const size_t sizes[] = { 4096 };
	struct rail_conf_pend pend;
	struct rail_conf_pair p;

	memset(&pend, 0, sizeof(pend));
	if (cx->role == RAIL_CONF_ROLE_A) {
		pend.kind = RAIL_CONF_ACCEPT;
		pend.lc = lc;
	} else {
		pend.kind = RAIL_CONF_CONNECT;
		memcpy(pend.handle, handle, sizeof(pend.handle));
	}
	/*
	 * B connects only once A has left rail_conf_watch_listener: A polls for
	 * DONE, then calls accept, so a connect right after DONE could be
	 * accepted there and taken for a refused handle's connection.
	 */
	rail_conf_barrier(cx, "good-connection");
	rail_conf_establish(cx, &pend, 1, "the valid handle after refused ones");
	p.lc = lc;
	p.comm = pend.comm;
	rail_conf_simple_traffic(cx, &p, 9, sizes, NULL, 1, "after refused handles");
	rail_conf_pair_close(cx, &p);
}

int rail_conf_bad_handle(struct rail_conf *cx)
{
	static const int flip[] = { 0, 10, 37, 75 };
	uint8_t h[2][NCCL_NET_HANDLE_MAXSIZE];
	void *lc = NULL;

	/* Part 1: one byte of the encoded handle corrupted. */
	if (cx->role == RAIL_CONF_ROLE_A) {
		lc = rail_conf_listen(cx, h[0]);
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_HANDLE, h[0], sizeof(h[0]));
		rail_conf_watch_listener(cx, lc, "corrupt");
	} else {
		rail_conf_ctl_recv(cx, RAIL_CONF_MSG_HANDLE, h[0], sizeof(h[0]));
		for (size_t i = 0; i < sizeof(flip) / sizeof(flip[0]); i++) {
			uint8_t bad[NCCL_NET_HANDLE_MAXSIZE];
			char what[64];

			memcpy(bad, h[0], sizeof(bad));
			bad[flip[i]] ^= 0x5a;
			snprintf(what, sizeof(what), "byte %d of the handle flipped", flip[i]);
			rail_conf_connect_refused(cx, bad, what);
		}
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_DONE, NULL, 0);
	}
	rail_conf_good_connection(cx, lc, h[0]);
	if (!cx->full) {
		rail_conf_note(cx, "stale-handle part on v6 and v12 only");
		return 0;
	}

	/* Part 2: the handle of a closed listen comm, with a new listener up. */
	if (cx->role == RAIL_CONF_ROLE_A) {
		void *old = rail_conf_listen(cx, h[0]);

		rail_conf_close_listen(cx, old);
		lc = rail_conf_listen(cx, h[1]);
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_BLOB, h, sizeof(h));
		rail_conf_watch_listener(cx, lc, "stale");
	} else {
		rail_conf_ctl_recv(cx, RAIL_CONF_MSG_BLOB, h, sizeof(h));
		rail_conf_connect_refused(cx, h[0], "the handle of a closed listen comm");
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_DONE, NULL, 0);
	}
	rail_conf_good_connection(cx, lc, h[1]);
	return 0;
}

/* ---- reload ---- */

static void reload_round(struct rail_conf *cx, int round)
{
	static const size_t sizes[] = { 1, 65537, RAIL_CONF_MIB };
	struct rail_conf_pair p;
	void *ctx2 = NULL;
	char why[256];
	int ndev = 0;

	rail_conf_stage(cx, "round %d: dlopen", round);
	cx->lib = dlopen(cx->opts->plugin, RTLD_NOW | RTLD_LOCAL);
	RAIL_CONF_CHECK(cx, cx->lib, "round %d: dlopen: %s", round, dlerror());
	if (rail_conf_bind(cx->lib, cx->abi, &cx->net, why, sizeof(why)))
		rail_conf_fail(cx, "%s", why);
	RAIL_CONF_CHECK(cx, cx->net.has_finalize, "finalize is NULL");
	RAIL_CONF_CALL(cx, cx->net.init(&cx->net, rail_conf_logger), "init");
	if (round == 1) {
		/* Two communicators: finalizing one must leave the other working. */
		RAIL_CONF_CALL(cx, cx->net.init_ctx(&ctx2, 0x1234, rail_conf_logger),
			       "init (second context)");
		RAIL_CONF_CALL(cx, cx->net.finalize(ctx2), "finalize (second context)");
	}
	RAIL_CONF_CALL(cx, cx->net.devices(&ndev), "devices");
	RAIL_CONF_CHECK(cx, cx->dev < ndev, "device %d of %d", cx->dev, ndev);
	rail_conf_pair_open(cx, &p);
	rail_conf_simple_traffic(cx, &p, (unsigned)round, sizes, NULL, 3, "traffic before unload");
	rail_conf_pair_close(cx, &p);
	rail_conf_stage(cx, "round %d: finalize", round);
	RAIL_CONF_CALL(cx, cx->net.finalize(cx->net.ctx), "finalize");
	RAIL_CONF_CHECK(cx, dlclose(cx->lib) == 0, "dlclose: %s", dlerror());
	cx->lib = NULL;
}

static void *noop_thread(void *arg)
{
	return arg;
}

int rail_conf_reload(struct rail_conf *cx)
{
	pthread_t th;
	int t0, f0;

	/* A first thread starts any runtime helper threads (TSan's) before the baseline. */
	if (!pthread_create(&th, NULL, noop_thread, NULL))
		pthread_join(th, NULL);
	/* A joined thread can stay listed for a moment: wait for the count to settle. */
	t0 = rail_conf_count_dir("/proc/self/task");
	for (int i = 0; i < 50 && t0 > 1; i++) {
		rail_conf_sleep_ms(10);
		t0 = rail_conf_count_dir("/proc/self/task");
	}
	f0 = rail_conf_count_dir("/proc/self/fd");

	cx->dev = cx->role == RAIL_CONF_ROLE_A ? cx->opts->dev_a : cx->opts->dev_b;
	for (int round = 0; round < 2; round++) {
		uint64_t until;
		int t, f;
		void *still;

		reload_round(cx, round);
		/* Joined threads can linger in /proc for a moment. */
		until = rail_conf_now_ns() + 3000000000ull;
		do {
			t = rail_conf_count_dir("/proc/self/task");
			f = rail_conf_count_dir("/proc/self/fd");
			if (t <= t0 && f == f0)
				break;
			rail_conf_sleep_ms(20);
		} while (rail_conf_now_ns() < until);
		if (f != f0) {
			char fds[1024];

			rail_conf_list_fds(fds, sizeof(fds));
			rail_conf_fail(cx, "round %d: %d fds open after finalize+dlclose, %d before "
				       "dlopen (leaked); now: %s", round, f, f0, fds);
		}
		RAIL_CONF_CHECK(cx, t <= t0, "round %d: %d threads after finalize+dlclose, %d before "
				"dlopen: plugin threads outlive finalize (NCCL dlcloses the library)",
				round, t, t0);
		still = dlopen(cx->opts->plugin, RTLD_NOW | RTLD_NOLOAD);
		if (still) {
			if (round == 0)
				rail_conf_note(cx, "the library stays mapped after dlclose "
					       "(-z nodelete or a held reference)");
			dlclose(still);
		}
		rail_conf_barrier(cx, round ? "reload-1" : "reload-0");
	}
	return 0;
}
