/*
 * Conformance suite: the request engine, NCCL's progress loop in small.
 *
 * Operations belong to lanes (one comm each). Within a lane they are posted
 * in array order, at most `limit` in flight; a NULL request means "retry
 * later". Every posted request is tested until done and never again; a
 * finished receive is checked at once: sizes reported, every byte, and the
 * poison after the message.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

void rail_conf_ops_prepare(struct rail_conf_op *ops, int nops)
{
	for (int i = 0; i < nops; i++) {
		struct rail_conf_op *op = &ops[i];

		if (op->kind == RAIL_CONF_SEND) {
			rail_conf_fill(op->buf[0], op->size[0], op->seed[0]);
			continue;
		}
		for (int j = 0; j < op->n; j++)
			rail_conf_poison(op->buf[j], op->size[j] + RAIL_CONF_GUARD, op->seed[j]);
	}
}

void rail_conf_verify_recv(struct rail_conf *cx, const struct rail_conf_op *op, const char *what,
			   int index)
{
	char why[512];

	for (int j = 0; j < op->n; j++) {
		size_t want = op->expect[j];

		RAIL_CONF_CHECK(cx, op->got[j] >= 0 && (size_t)op->got[j] == want,
				"%s: receive #%d (lane %d, part %d of %d, tag %d): test reported %d "
				"bytes, the peer sent %zu",
				what, index, op->lane, j, op->n, op->tag[j], op->got[j], want);
		if (rail_conf_verify(op->buf[j], want, op->seed[j], why, sizeof(why)))
			rail_conf_fail(cx, "%s: receive #%d (lane %d, part %d, tag %d, %zu bytes): %s",
				       what, index, op->lane, j, op->tag[j], want, why);
		if (rail_conf_verify_poison(op->buf[j], want, op->size[j] + RAIL_CONF_GUARD,
					    op->seed[j], why, sizeof(why)))
			rail_conf_fail(cx,
				       "%s: receive #%d (lane %d, part %d, %zu bytes into %zu "
				       "posted): %s",
				       what, index, op->lane, j, want, op->size[j], why);
	}
}

/* The plugin must not write into a send buffer. */
static void verify_send(struct rail_conf *cx, const struct rail_conf_op *op, const char *what,
			int index)
{
	char why[512];

	if (rail_conf_verify(op->buf[0], op->size[0], op->seed[0], why, sizeof(why)))
		rail_conf_fail(cx, "%s: send #%d (%zu bytes) was modified by the plugin: %s", what,
			       index, op->size[0], why);
}

static ncclResult_t op_post(struct rail_conf *cx, struct rail_conf_op *op, void *comm)
{
	void *data[RAIL_CONF_MAX_RECVS];

	op->req = NULL;
	/*
	 * NCCL (v9+) passes (void*)1 in *request for small LL/LL128 receives:
	 * "completion optional". The plugin must still return a real request.
	 */
	if (op->kind == RAIL_CONF_RECV && op->n == 1 && op->hint && cx->abi >= 9)
		op->req = (void *)1;
	if (op->kind == RAIL_CONF_SEND)
		return cx->net.isend(comm, op->buf[0], op->size[0], op->tag[0], op->mh[0],
				     &op->req);
	for (int j = 0; j < op->n; j++)
		data[j] = op->buf[j];
	return cx->net.irecv(comm, op->n, data, op->size, op->tag, op->mh, &op->req);
}

static int engine_fail(struct rail_conf *cx, struct rail_conf_engine *e, int i, ncclResult_t res,
		       int in_post, const char *what)
{
	struct rail_conf_op *op = &e->ops[i];

	if (!(e->flags & RAIL_CONF_ENGINE_TOLERATE))
		rail_conf_fail(cx, "%s: %s of %s #%d (lane %d, %zu bytes%s) returned %s", what,
			       in_post ? (op->kind == RAIL_CONF_SEND ? "isend" : "irecv") : "test",
			       op->kind == RAIL_CONF_SEND ? "send" : "receive", i, op->lane,
			       op->size[0], op->n > 1 ? ", grouped" : "", rail_conf_result_str(res));
	op->err = res;
	op->done = 1;
	e->failed_op = i;
	e->failed_res = res;
	e->failed_in_post = in_post;
	return -1;
}

/* Post what each lane may post now. Returns how many were posted, or -1. */
static int engine_post(struct rail_conf *cx, struct rail_conf_engine *e, int **lane_ops,
		       const int *lane_n, const char *what)
{
	int posted = 0;

	for (int l = 0; l < e->nlanes; l++) {
		struct rail_conf_lane *ln = &e->lanes[l];

		while (ln->next < lane_n[l] && ln->inflight < ln->limit) {
			int i = lane_ops[l][ln->next];
			struct rail_conf_op *op = &e->ops[i];
			ncclResult_t res = op_post(cx, op, ln->comm);

			if (res != ncclSuccess)
				return engine_fail(cx, e, i, res, 1, what);
			RAIL_CONF_CHECK(cx, op->req != (void *)1,
					"%s: irecv #%d left the (void*)1 completion hint in *request: "
					"it must return a real request or NULL", what, i);
			if (!op->req) {
				op->nulls++;
				break;
			}
			op->posted = 1;
			ln->next++;
			ln->inflight++;
			if (ln->inflight > ln->max_inflight)
				ln->max_inflight = ln->inflight;
			posted++;
		}
	}
	return posted;
}

/* Test every request in flight once. Returns how many finished, or -1. */
static int engine_test(struct rail_conf *cx, struct rail_conf_engine *e, const char *what)
{
	int finished = 0;

	for (int i = 0; i < e->nops; i++) {
		struct rail_conf_op *op = &e->ops[i];
		int done = 0, sizes[RAIL_CONF_MAX_RECVS];
		ncclResult_t res;

		if (!op->posted || op->done)
			continue;
		/* sizes: n entries for a receive, &size for a send (as NCCL passes). */
		for (int j = 0; j < RAIL_CONF_MAX_RECVS; j++)
			sizes[j] = -1;
		res = cx->net.test(op->req, &done, sizes);
		op->tests++;
		if (res != ncclSuccess)
			return engine_fail(cx, e, i, res, 0, what);
		if (!done)
			continue;
		op->done = 1;
		e->lanes[op->lane].inflight--;
		finished++;
		memcpy(op->got, sizes, sizeof(op->got));
		if (e->flags & RAIL_CONF_ENGINE_NOVERIFY)
			continue;
		if (op->kind == RAIL_CONF_RECV)
			rail_conf_verify_recv(cx, op, what, i);
		else
			verify_send(cx, op, what, i);
	}
	return finished;
}

static void engine_timeout(struct rail_conf *cx, struct rail_conf_engine *e, const char *what)
{
	int pending = 0, unposted = 0, first = -1;

	for (int i = 0; i < e->nops; i++) {
		if (e->ops[i].done)
			continue;
		if (first < 0)
			first = i;
		if (e->ops[i].posted)
			pending++;
		else
			unposted++;
	}
	rail_conf_fail(cx,
		       "%s: deadline reached with %d requests still in flight and %d not posted; "
		       "first: %s #%d (lane %d, %zu bytes) %s %d times%s",
		       what, pending, unposted,
		       e->ops[first].kind == RAIL_CONF_SEND ? "send" : "receive", first,
		       e->ops[first].lane, e->ops[first].size[0],
		       e->ops[first].posted ? "tested" : "got a NULL request",
		       e->ops[first].posted ? e->ops[first].tests : e->ops[first].nulls,
		       e->ops[first].posted ? " without completing" : "");
}

int rail_conf_engine_run(struct rail_conf *cx, struct rail_conf_engine *e, const char *what)
{
	int **lane_ops = calloc((size_t)e->nlanes, sizeof(*lane_ops));
	int *lane_n = calloc((size_t)e->nlanes, sizeof(*lane_n));
	int left = e->nops, rc = 0;

	RAIL_CONF_CHECK(cx, lane_ops && lane_n, "out of memory");
	for (int l = 0; l < e->nlanes; l++) {
		lane_ops[l] = calloc((size_t)e->nops + 1, sizeof(int));
		RAIL_CONF_CHECK(cx, lane_ops[l], "out of memory");
		e->lanes[l].inflight = e->lanes[l].max_inflight = e->lanes[l].next = 0;
	}
	for (int i = 0; i < e->nops; i++) {
		struct rail_conf_op *op = &e->ops[i];

		RAIL_CONF_CHECK(cx, op->lane >= 0 && op->lane < e->nlanes, "suite bug: lane");
		lane_ops[op->lane][lane_n[op->lane]++] = i;
		op->posted = op->done = op->nulls = op->tests = 0;
		op->req = NULL;
	}
	e->failed_op = -1;
	rail_conf_stage(cx, "%s: %d requests on %d comms", what, e->nops, e->nlanes);
	while (left > 0) {
		int posted = engine_post(cx, e, lane_ops, lane_n, what);
		int finished = posted < 0 ? -1 : engine_test(cx, e, what);

		if (posted < 0 || finished < 0) {
			rc = -1;
			break;
		}
		left -= finished;
		if (left > 0 && rail_conf_expired(cx))
			engine_timeout(cx, e, what);
		if (!posted && !finished)
			sched_yield();
	}
	for (int l = 0; l < e->nlanes; l++)
		free(lane_ops[l]);
	free(lane_ops);
	free(lane_n);
	return rc;
}

ncclResult_t rail_conf_wait(struct rail_conf *cx, void *req, int *sizes, const char *what)
{
	for (;;) {
		int done = 0;
		ncclResult_t res = cx->net.test(req, &done, sizes);

		if (res != ncclSuccess || done)
			return res;
		if (rail_conf_expired(cx))
			rail_conf_fail(cx, "%s: request never completed (deadline)", what);
		sched_yield();
	}
}

int rail_conf_simple_traffic(struct rail_conf *cx, struct rail_conf_pair *p, unsigned stream,
			     const size_t *sizes, const size_t *room, int nmsg, const char *what)
{
	struct rail_conf_op *ops = calloc((size_t)nmsg, sizeof(*ops));
	struct rail_conf_lane lane = { .comm = p->comm, .limit = NCCL_NET_MAX_REQUESTS };
	struct rail_conf_engine e = { .ops = ops, .nops = nmsg, .lanes = &lane, .nlanes = 1 };
	struct rail_conf_arena arena;
	int is_recv = cx->role == RAIL_CONF_ROLE_A;
	size_t total = 0;

	RAIL_CONF_CHECK(cx, ops, "out of memory");
	for (int i = 0; i < nmsg; i++) {
		size_t r = room && room[i] ? room[i] : sizes[i];

		total += rail_conf_slice_room(is_recv ? r : sizes[i]);
	}
	rail_conf_arena_init(cx, &arena, p->comm, total);
	for (int i = 0; i < nmsg; i++) {
		struct rail_conf_op *op = &ops[i];
		size_t r = room && room[i] ? room[i] : sizes[i];

		op->kind = is_recv ? RAIL_CONF_RECV : RAIL_CONF_SEND;
		op->n = 1;
		op->size[0] = is_recv ? r : sizes[i];
		op->expect[0] = sizes[i];
		op->buf[0] = rail_conf_arena_take(cx, &arena, op->size[0]);
		op->seed[0] = rail_conf_seed(cx, stream, (unsigned)i, 0);
		op->tag[0] = 1; /* the sender's rank */
		op->mh[0] = arena.mh;
		op->hint = (i & 1) && op->size[0] <= 65536; /* like NCCL's LL/LL128 receives */
	}
	rail_conf_ops_prepare(ops, nmsg);
	rail_conf_engine_run(cx, &e, what);
	rail_conf_arena_dereg(cx, &arena);
	rail_conf_arena_free(&arena);
	free(ops);
	return lane.max_inflight;
}
