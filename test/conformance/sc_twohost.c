/*
 * peer-dies across two hosts (--ctl-listen/--ctl-connect with --doomed A|B).
 *
 * Role B streams messages to role A. The role that is not doomed (the
 * survivor) appends "READY" to --event-file once messages flow; the harness
 * then kills the doomed role's host, or takes a link down, and measures how
 * long the survivor takes to append "ERROR ...". The survivor passes if a
 * request fails with a WARN before the scenario's timeout, and fails naming
 * the hang otherwise. The doomed role reports PASS at once and streams
 * until it dies (or, when only a link went down, until the timeout),
 * appending "ERROR ..." too if it sees one.
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"

struct stream_slot {
	uint8_t *buf;
	void *req;
	unsigned msg;
};

/* One step of one slot: post, or test. 1 when a message completed (verified on A). */
static int slot_step(struct rail_conf *cx, void *comm, struct rail_conf_arena *a,
		     struct stream_slot *s, size_t sz, unsigned *next, ncclResult_t *err)
{
	int done = 0, sizes[RAIL_CONF_MAX_RECVS] = { -1 }, tag = 1;
	char why[512];

	if (!s->req) {
		void *data[1] = { s->buf };
		size_t size = sz;

		s->msg = *next;
		if (cx->role == RAIL_CONF_ROLE_B) {
			rail_conf_fill(s->buf, sz, rail_conf_seed(cx, 1, s->msg, 0));
			*err = cx->net.isend(comm, s->buf, sz, tag, a->mh, &s->req);
		} else {
			rail_conf_poison(s->buf, sz + RAIL_CONF_GUARD,
					 rail_conf_seed(cx, 1, s->msg, 0));
			*err = cx->net.irecv(comm, 1, data, &size, &tag, &a->mh, &s->req);
		}
		if (s->req)
			(*next)++;
		return 0;
	}
	*err = cx->net.test(s->req, &done, sizes);
	if (*err != ncclSuccess || !done)
		return 0;
	s->req = NULL;
	if (cx->role == RAIL_CONF_ROLE_B)
		return 1;
	RAIL_CONF_CHECK(cx, sizes[0] == (int)sz, "message %u: test reported %d bytes, sent %zu",
			s->msg, sizes[0], sz);
	if (rail_conf_verify(s->buf, sz, rail_conf_seed(cx, 1, s->msg, 0), why, sizeof(why)))
		rail_conf_fail(cx, "message %u: %s", s->msg, why);
	return 1;
}

/* The doomed role: streams until its host dies; notes an error if it sees one. */
static RAIL_CONF_NORETURN void doomed_loop(struct rail_conf *cx, void *comm,
					   struct rail_conf_arena *a, struct stream_slot *s,
					   size_t sz)
{
	unsigned next = 0;
	ncclResult_t err = ncclSuccess;
	char first[512];

	rail_conf_report(cx, "PASS", "");
	rail_conf_expect_kill(cx);
	rail_conf_stage(cx, "streaming until this host is killed or unplugged");
	while (!rail_conf_expired(cx) && err == ncclSuccess) {
		for (int i = 0; i < 2 && err == ncclSuccess; i++)
			slot_step(cx, comm, a, &s[i], sz, &next, &err);
		sched_yield();
	}
	if (err != ncclSuccess) {
		rail_conf_warn_first(first, sizeof(first));
		rail_conf_event(cx, "ERROR %s (the doomed role; WARN: %s)", rail_conf_result_str(err),
				first[0] ? first : "none");
	}
	while (!rail_conf_expired(cx))
		rail_conf_sleep_ms(100);
	_exit(0);
}

int rail_conf_peer_dies_2h(struct rail_conf *cx)
{
	size_t sz = cx->full ? 64 * RAIL_CONF_MIB : 16 * RAIL_CONF_MIB;
	size_t cap = rail_conf_common_max_msg(cx);
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	struct stream_slot s[2];
	unsigned next = 0;
	int done = 0, after = 0;
	uint64_t t_ready = 0;
	ncclResult_t err = ncclSuccess;
	char first[512];

	if (cx->opts->doomed < 0) {
		rail_conf_skip_reason(cx, "two hosts: needs --doomed A|B (the harness kills that "
				      "role's host once --event-file says READY)");
		return 1;
	}
	sz = sz < cap ? sz : cap;
	rail_conf_pair_open(cx, &p);
	rail_conf_arena_init(cx, &a, p.comm, 2 * rail_conf_slice_room(sz));
	for (int i = 0; i < 2; i++) {
		s[i].buf = rail_conf_arena_take(cx, &a, sz);
		s[i].req = NULL;
	}
	if (cx->role == cx->opts->doomed)
		doomed_loop(cx, p.comm, &a, s, sz);
	rail_conf_stage(cx, "streaming %zu-byte messages", sz);
	while (err == ncclSuccess) {
		for (int i = 0; i < 2 && err == ncclSuccess; i++) {
			int got = slot_step(cx, p.comm, &a, &s[i], sz, &next, &err);

			done += got;
			after += got && t_ready;
		}
		if (err != ncclSuccess)
			break;
		if (done >= 2 && !t_ready) {
			rail_conf_event(cx, "READY %zu-byte messages flow (%d complete)", sz, done);
			rail_conf_stage(cx, "traffic flows; waiting for an error (the peer host is "
					"killed or unplugged now)");
			t_ready = rail_conf_now_ns();
		}
		if (rail_conf_expired(cx)) {
			RAIL_CONF_CHECK(cx, t_ready, "no traffic: %d messages completed", done);
			rail_conf_event(cx, "HANG no error %.1f s after READY (%d messages completed "
					"since)", (double)(rail_conf_now_ns() - t_ready) / 1e9, after);
			rail_conf_fail(cx, "no error %.1f s after READY, when the peer host was killed "
				       "or unplugged (%d messages completed since): the plugin waits "
				       "forever", (double)(rail_conf_now_ns() - t_ready) / 1e9, after);
		}
		sched_yield();
	}
	RAIL_CONF_CHECK(cx, t_ready, "error %s after %d messages, before READY",
			rail_conf_result_str(err), done);
	rail_conf_warn_first(first, sizeof(first));
	rail_conf_event(cx, "ERROR %s %.0f ms after READY (%d messages since; WARN: %s)",
			rail_conf_result_str(err), (double)(rail_conf_now_ns() - t_ready) / 1e6, after,
			first[0] ? first : "none");
	RAIL_CONF_CHECK(cx, rail_conf_warn_count() > 0,
			"the request failed with %s but the plugin printed no WARN",
			rail_conf_result_str(err));
	rail_conf_note(cx, "%s %.0f ms after READY (%d complete messages after it)",
		       rail_conf_result_str(err), (double)(rail_conf_now_ns() - t_ready) / 1e6, after);
	rail_conf_stage(cx, "closing after the error");
	rail_conf_arena_dereg(cx, &a);
	if (cx->role == RAIL_CONF_ROLE_A) {
		rail_conf_close_recv(cx, p.comm);
		rail_conf_close_listen(cx, p.lc);
	} else {
		rail_conf_close_send(cx, p.comm);
	}
	rail_conf_arena_free(&a);
	return 0;
}
