/*
 * Conformance scenarios: properties, nonblocking-connect, sizes,
 * recv-larger, send-larger, iflush.
 */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf.h"

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- properties ---- */

/*
 * NCCL reads the PCI tree from pciPath. Like NCCL's IB transport, a plugin
 * may zero the function digit, so only the parent directory must exist.
 */
static int parent_exists(const char *path)
{
	char dir[1024];
	char *slash;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir || !slash[1])
		return 0;
	*slash = 0;
	return access(dir, F_OK) == 0;
}

static void check_props(struct rail_conf *cx, int dev, const struct rail_conf_props *p,
			int physical)
{
	const char *n = p->name;

	RAIL_CONF_CHECK(cx, n[0], "dev %d: empty name", dev);
	RAIL_CONF_CHECK(cx, p->speed > 0, "dev %d (%s): speed %d Mbps", dev, n, p->speed);
	RAIL_CONF_CHECK(cx, p->ptr_support & NCCL_PTR_HOST, "dev %d (%s): ptrSupport 0x%x lacks HOST",
			dev, n, p->ptr_support);
	RAIL_CONF_CHECK(cx, p->max_comms > 0, "dev %d (%s): maxComms %d", dev, n, p->max_comms);
	RAIL_CONF_CHECK(cx, p->max_recvs >= 1 && p->max_recvs <= RAIL_CONF_MAX_RECVS,
			"dev %d (%s): maxRecvs %d (NCCL allows 1..8)", dev, n, p->max_recvs);
	RAIL_CONF_CHECK(cx, !isnan(p->latency) && p->latency >= 0, "dev %d (%s): latency %f", dev,
			n, (double)p->latency);
	RAIL_CONF_CHECK(cx, !p->has_pci || parent_exists(p->pci_path),
			"dev %d (%s): pciPath \"%s\": not a path under an existing directory", dev,
			n, p->pci_path);
	if (cx->abi >= 7)
		RAIL_CONF_CHECK(cx, p->dev_type == NCCL_NET_DEVICE_HOST,
				"dev %d (%s): netDeviceType %d, expected HOST (0)", dev, n,
				p->dev_type);
	if (cx->abi >= 8)
		RAIL_CONF_CHECK(cx, p->reg_is_global == 0 || p->reg_is_global == 1,
				"dev %d (%s): regIsGlobal %d", dev, n, p->reg_is_global);
	if (cx->abi >= 9) {
		RAIL_CONF_CHECK(cx, p->max_p2p_bytes > 0 && p->max_coll_bytes > 0,
				"dev %d (%s): maxP2pBytes %zu, maxCollBytes %zu", dev, n,
				p->max_p2p_bytes, p->max_coll_bytes);
		RAIL_CONF_CHECK(cx, p->force_flush == 0 || p->force_flush == 1,
				"dev %d (%s): forceFlush %d", dev, n, p->force_flush);
		if (physical)
			RAIL_CONF_CHECK(cx, p->vndevs == 1 && p->vdevs[0] == dev,
					"dev %d (%s): vProps = {%d, {%d, ...}}, a physical device "
					"must report {1, {%d}}",
					dev, n, p->vndevs, p->vdevs[0], dev);
	}
	if (cx->abi >= 11)
		RAIL_CONF_CHECK(cx, p->max_multi_request_size >= 1,
				"dev %d (%s): maxMultiRequestSize %d", dev, n,
				p->max_multi_request_size);
	if (cx->abi >= 12)
		RAIL_CONF_CHECK(cx, p->rail_id >= -1 && p->plane_id >= -1,
				"dev %d (%s): railId %d planeId %d", dev, n, p->rail_id,
				p->plane_id);
}

int rail_conf_properties(struct rail_conf *cx)
{
	struct rail_conf_props *props, again;
	int ndev = 0;

	RAIL_CONF_CHECK(cx, cx->net.name && !strcmp(cx->net.name, "Rail"),
			"the table's name is \"%s\", expected \"Rail\"",
			cx->net.name ? cx->net.name : "(null)");
	if (cx->abi >= 11)
		RAIL_CONF_CHECK(cx, cx->net.has_finalize,
				"finalize is NULL: NCCL calls it without checking");
	RAIL_CONF_CALL(cx, cx->net.devices(&ndev), "devices");
	RAIL_CONF_CHECK(cx, ndev > 0, "devices() = %d", ndev);
	props = calloc((size_t)ndev, sizeof(*props));
	RAIL_CONF_CHECK(cx, props, "out of memory");
	for (int d = 0; d < ndev; d++) {
		ncclResult_t res = cx->net.get_props(d, &props[d]);
		int physical = !(cx->opts->nfuse && d == ndev - 1);

		RAIL_CONF_CHECK(cx, res != ncclNumResults,
				"getProperties(%d) wrote past the end of ncclNetProperties_v%d_t", d,
				cx->abi);
		RAIL_CONF_CHECK(cx, res == ncclSuccess, "getProperties(%d) returned %s", d,
				rail_conf_result_str(res));
		check_props(cx, d, &props[d], physical);
		for (int e = 0; e < d; e++)
			RAIL_CONF_CHECK(cx, strcmp(props[e].name, props[d].name),
					"devices %d and %d are both named \"%s\": NCCL keys NICs by "
					"name", e, d, props[d].name);
		RAIL_CONF_CALL(cx, cx->net.get_props(d, &again), "getProperties (again)");
		RAIL_CONF_CHECK(cx, !memcmp(&again, &props[d], sizeof(again)),
				"getProperties(%d) changed between two calls", d);
		if (cx->role == RAIL_CONF_ROLE_A && cx->opts->verbose)
			rail_conf_note(cx, "dev %d: %s speed %d maxRecvs %d maxComms %d", d,
				       props[d].name, props[d].speed, props[d].max_recvs,
				       props[d].max_comms);
	}
	free(props);
	return 0;
}

/* ---- nonblocking-connect ---- */

int rail_conf_nonblocking_connect(struct rail_conf *cx)
{
	static const size_t sizes[] = { 1024, 70000 };
	struct rail_conf_pair p;
	uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
	int late_is_a;

	cx->call_limit_ns = 1000000000ull;
	for (int round = 0; round < 2; round++) {
		struct rail_conf_pend pend;

		/* Round 0: the acceptor starts late; round 1: the connector does. */
		late_is_a = round == 0;
		memset(&pend, 0, sizeof(pend));
		memset(&p, 0, sizeof(p));
		if (cx->role == RAIL_CONF_ROLE_A) {
			p.lc = rail_conf_listen(cx, handle);
			rail_conf_ctl_send(cx, RAIL_CONF_MSG_HANDLE, handle, sizeof(handle));
			pend.kind = RAIL_CONF_ACCEPT;
			pend.lc = p.lc;
		} else {
			rail_conf_ctl_recv(cx, RAIL_CONF_MSG_HANDLE, pend.handle, sizeof(pend.handle));
			pend.kind = RAIL_CONF_CONNECT;
		}
		if ((cx->role == RAIL_CONF_ROLE_A) == late_is_a)
			rail_conf_sleep_ms(300);
		rail_conf_establish(cx, &pend, 1, round ? "connector late" : "acceptor late");
		p.comm = pend.comm;
		if (cx->opts->verbose)
			rail_conf_note(cx, "round %d: %s needed %d calls, longest %.1f ms", round,
				       pend.kind == RAIL_CONF_CONNECT ? "connect" : "accept",
				       pend.calls, (double)pend.max_call_ns / 1e6);
		rail_conf_simple_traffic(cx, &p, (unsigned)round, sizes, NULL, NELEM(sizes),
					 "after connect");
		rail_conf_pair_close(cx, &p);
	}
	return 0;
}

/* ---- sizes ---- */

int rail_conf_sizes(struct rail_conf *cx)
{
	static const size_t all[] = { 0, 1, 7, 4096, 65537, RAIL_CONF_MIB, 64 * RAIL_CONF_MIB,
				      RAIL_CONF_GIB };
	size_t cap = rail_conf_common_max_msg(cx), list[NELEM(all)];
	size_t limit = cx->full ? cap : (cap < 64 * RAIL_CONF_MIB ? cap : 64 * RAIL_CONF_MIB);
	struct rail_conf_pair p;
	int n = 0;
	char a[32];

	for (int i = 0; i < NELEM(all); i++) {
		if (all[i] <= limit)
			list[n++] = all[i];
	}
	if (list[n - 1] < RAIL_CONF_GIB)
		rail_conf_note(cx, "sizes up to %s (%s)", rail_conf_size_str(list[n - 1], a, sizeof(a)),
			       limit < cap ? "reduced on this ABI; full sweep on v6 and v12"
					   : "capped by --max-size or maxP2pBytes");
	rail_conf_pair_open(cx, &p);
	rail_conf_simple_traffic(cx, &p, 0, list, NULL, n, "sizes");
	rail_conf_pair_close(cx, &p);
	return 0;
}

/* ---- recv-larger ---- */

int rail_conf_recv_larger(struct rail_conf *cx)
{
	static const size_t msg[] = { 0, 1, 100, 65537, RAIL_CONF_MIB, 3 * RAIL_CONF_MIB + 5, 4095 };
	static const size_t room[] = { 4096, 64, 65536, RAIL_CONF_MIB, 4 * RAIL_CONF_MIB,
				       8 * RAIL_CONF_MIB, 4096 };
	size_t cap = rail_conf_common_max_msg(cx), m[NELEM(msg)], r[NELEM(msg)];
	struct rail_conf_pair p;
	int n = 0;

	for (int i = 0; i < NELEM(msg); i++) {
		if (room[i] <= cap) {
			m[n] = msg[i];
			r[n++] = room[i];
		}
	}
	rail_conf_pair_open(cx, &p);
	rail_conf_simple_traffic(cx, &p, 0, m, r, n, "recv-larger");
	rail_conf_pair_close(cx, &p);
	return 0;
}

/* ---- send-larger ---- */

/* Role A: post the small receive; it must end in an error. */
static void send_larger_recv(struct rail_conf *cx, void *rc, size_t send, size_t room, int k)
{
	struct rail_conf_arena a;
	uint8_t *buf;
	uint64_t seed = rail_conf_seed(cx, 1, (unsigned)k, 0);
	void *req = NULL, *data[1];
	int tag = 1, sizes[RAIL_CONF_MAX_RECVS];
	ncclResult_t res;
	char why[512];

	rail_conf_arena_init(cx, &a, rc, rail_conf_slice_room(room));
	buf = rail_conf_arena_take(cx, &a, room);
	rail_conf_poison(buf, room + RAIL_CONF_GUARD, seed);
	data[0] = buf;
	rail_conf_stage(cx, "irecv %zu bytes (peer sends %zu)", room, send);
	do {
		res = cx->net.irecv(rc, 1, data, &room, &tag, &a.mh, &req);
		RAIL_CONF_CHECK(cx, res == ncclSuccess || !req, "irecv failed but set a request");
		if (res == ncclSuccess && !req && rail_conf_expired(cx))
			rail_conf_fail(cx, "irecv kept returning a NULL request");
		if (!req && res == ncclSuccess)
			sched_yield();
	} while (res == ncclSuccess && !req);
	if (res == ncclSuccess) {
		for (int j = 0; j < RAIL_CONF_MAX_RECVS; j++)
			sizes[j] = -1;
		rail_conf_stage(cx, "test: expecting an error (%zu-byte send into %zu)", send, room);
		res = rail_conf_wait(cx, req, sizes, "receive smaller than the send");
		RAIL_CONF_CHECK(cx, res != ncclSuccess,
				"a %zu-byte send into a %zu-byte receive completed with success "
				"(test reported %d bytes); it must be an error",
				send, room, sizes[0]);
	}
	if (rail_conf_verify_poison(buf, room, room + RAIL_CONF_GUARD, seed, why, sizeof(why)))
		rail_conf_fail(cx, "%zu-byte send into a %zu-byte receive: %s", send, room, why);
	rail_conf_ctl_send(cx, RAIL_CONF_MSG_DONE, NULL, 0);
	rail_conf_arena_dereg(cx, &a);
	rail_conf_arena_free(&a);
}

/* Role B: test one request until it completes or fails. */
static ncclResult_t sl_test(struct rail_conf *cx, void **req, int *done)
{
	int size = -1;
	ncclResult_t res = cx->net.test(*req, done, &size);

	if (res != ncclSuccess || *done)
		*req = NULL;
	return res;
}

/*
 * Role B: the oversized send may complete locally (its bytes left, e.g. a
 * verbs eager message, pushed without a clear-to-send), but the sender must
 * be told: that send, or a later small one on the same comm, fails (isend or
 * test) within 10 s of the receiver's error.
 */
static ncclResult_t send_larger_send(struct rail_conf *cx, void *sc, size_t send, int k)
{
	struct rail_conf_arena a;
	uint8_t *buf;
	void *req = NULL;
	int done = 0, got_done = 0, posted_big = 0, followups = 0, big_done = 0;
	uint64_t limit = 0, now;
	ncclResult_t res = ncclSuccess;

	rail_conf_arena_init(cx, &a, sc, rail_conf_slice_room(send));
	buf = rail_conf_arena_take(cx, &a, send);
	rail_conf_fill(buf, send, rail_conf_seed(cx, 1, (unsigned)k, 0));
	rail_conf_stage(cx, "isend %zu bytes into a smaller receive", send);
	while (res == ncclSuccess) {
		if (req) {
			res = sl_test(cx, &req, &done);
			big_done |= done && !followups;
		} else if (!posted_big) {
			res = cx->net.isend(sc, buf, send, 1, a.mh, &req);
			posted_big = req != NULL;
		} else {
			/* A later message on the comm: the refusal must surface by now. */
			res = cx->net.isend(sc, buf, 8, 2, a.mh, &req);
			followups += req != NULL;
		}
		if (!got_done && rail_conf_ctl_poll(cx, RAIL_CONF_MSG_DONE, NULL, 0)) {
			got_done = 1;
			limit = rail_conf_now_ns() + 10000000000ull;
			rail_conf_stage(cx, "%zu-byte send: waiting to be told of the receiver's error",
					send);
		}
		now = rail_conf_now_ns();
		if (res == ncclSuccess && ((got_done && now > limit) || rail_conf_expired(cx)))
			rail_conf_fail(cx, "a %zu-byte send into a smaller receive: the receiver failed "
				       "but the sender was never told (the send %s, then %d later "
				       "sends on the comm succeeded for 10 s)", send,
				       big_done ? "completed" : "stayed in flight", followups);
		sched_yield();
	}
	if (!got_done)
		rail_conf_ctl_recv(cx, RAIL_CONF_MSG_DONE, NULL, 0);
	if (cx->opts->verbose)
		rail_conf_note(cx, "sender of %zu: %s after %d later sends", send,
			       rail_conf_result_str(res), followups);
	rail_conf_arena_dereg(cx, &a);
	rail_conf_arena_free(&a);
	return res;
}

int rail_conf_send_larger(struct rail_conf *cx)
{
	size_t cap = rail_conf_common_max_msg(cx);
	size_t send[2] = { 1000, 2 * RAIL_CONF_MIB + 7 }, room[2] = { 500, RAIL_CONF_MIB };
	int ncase = cap >= send[1] ? 2 : 1;

	for (int k = 0; k < ncase; k++) {
		struct rail_conf_pair p;
		char s1[32], s2[32];
		const char *needles[3] = { s1, s2, "peer" };
		char first[512];

		snprintf(s1, sizeof(s1), "%zu", send[k]);
		snprintf(s2, sizeof(s2), "%zu", room[k]);
		rail_conf_warn_reset();
		rail_conf_pair_open(cx, &p);
		if (cx->role == RAIL_CONF_ROLE_A)
			send_larger_recv(cx, p.comm, send[k], room[k], k);
		else
			send_larger_send(cx, p.comm, send[k], k);	/* fails unless told */
		rail_conf_pair_close(cx, &p);
		/* Each side's error must be explained: both sizes and the peer. */
		rail_conf_warn_first(first, sizeof(first));
		if (!rail_conf_warn_has(needles, 3))
			rail_conf_fail(cx, "the %s's error has no WARN naming both sizes (%s and %s) "
				       "and the peer%s%s", cx->role == RAIL_CONF_ROLE_A ? "receiver"
				       : "sender", s1, s2, first[0] ? "; first WARN: " : "; no WARN",
				       first);
		rail_conf_barrier(cx, "sl-next");
	}
	return 0;
}

/* ---- iflush ---- */

int rail_conf_iflush(struct rail_conf *cx)
{
	static const size_t sizes[] = { 1, 4096, RAIL_CONF_MIB };
	struct rail_conf_op ops[NELEM(sizes)];
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	struct rail_conf_lane lane;
	struct rail_conf_engine e;
	int is_recv = cx->role == RAIL_CONF_ROLE_A, nreq = 0;
	char why[512];

	rail_conf_pair_open(cx, &p);
	memset(ops, 0, sizeof(ops));
	memset(&lane, 0, sizeof(lane));
	memset(&e, 0, sizeof(e));
	rail_conf_arena_init(cx, &a, p.comm, 4 * RAIL_CONF_MIB);
	for (int i = 0; i < NELEM(sizes); i++) {
		ops[i].kind = is_recv ? RAIL_CONF_RECV : RAIL_CONF_SEND;
		ops[i].n = 1;
		ops[i].size[0] = ops[i].expect[0] = sizes[i];
		ops[i].buf[0] = rail_conf_arena_take(cx, &a, sizes[i]);
		ops[i].seed[0] = rail_conf_seed(cx, 0, (unsigned)i, 0);
		ops[i].tag[0] = 1;
		ops[i].mh[0] = a.mh;
	}
	lane.comm = p.comm;
	lane.limit = NCCL_NET_MAX_REQUESTS;
	e.ops = ops;
	e.nops = NELEM(sizes);
	e.lanes = &lane;
	e.nlanes = 1;
	rail_conf_ops_prepare(ops, NELEM(sizes));
	rail_conf_engine_run(cx, &e, "iflush traffic");
	for (int i = 0; is_recv && i < NELEM(sizes); i++) {
		void *data[1] = { ops[i].buf[0] }, *req = NULL;
		int isize = (int)sizes[i];

		rail_conf_stage(cx, "iflush of %zu bytes", sizes[i]);
		RAIL_CONF_CALL(cx, cx->net.iflush(p.comm, 1, data, &isize, &a.mh, &req), "iflush");
		if (req) {
			nreq++;
			RAIL_CONF_CALL(cx, rail_conf_wait(cx, req, NULL, "iflush"), "test(iflush)");
		}
		if (rail_conf_verify(ops[i].buf[0], sizes[i], ops[i].seed[0], why, sizeof(why)))
			rail_conf_fail(cx, "after iflush of %zu bytes: %s", sizes[i], why);
	}
	if (is_recv && cx->opts->verbose)
		rail_conf_note(cx, "iflush returned %d requests for %d flushes", nreq, NELEM(sizes));
	rail_conf_arena_dereg(cx, &a);
	rail_conf_pair_close(cx, &p);
	rail_conf_arena_free(&a);
	return 0;
}
