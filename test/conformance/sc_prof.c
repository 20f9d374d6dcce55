/*
 * Conformance scenario "profiler" (v10+): the plugin's events for NCCL's
 * profiler, recorded by a callback of our own (the hook of abi.c's
 * callback, which every v10+ init passes).
 *
 * Role B sends, role A receives, one message at a time, each with a parent
 * handle of its own (the address of a token: NCCL passes its proxy step's).
 * After each message completes, on each side: every event started under
 * that parent was stopped exactly once, the plugin id is verbs or sockets
 * (layout 1), and the descriptors are sane: sockets name an fd and the
 * side's operation, verbs a QP number, a member device and an opcode;
 * lengths add up to the message (verbs: a receive filled through the eager
 * ring posts no work request, so it may have no event; a zero-byte send has
 * no data write). A grouped receive gets events under each buffer's parent.
 * Messages without parents produce no callback at all, and a callback that
 * fails breaks no transfer and is logged once.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"
#include "nccl_profiler_net.h"

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define REC_MAX 4096
#define NTOKENS 16
/* libibverbs' values (its ABI): the opcodes the plugin reports. */
#define IBV_OP_RDMA_WRITE 0
#define IBV_OP_RDMA_WRITE_WITH_IMM 1
#define IBV_WC_OP_RECV_RDMA_WITH_IMM 129

struct rec {
	void *parent;
	int64_t id;
	ncclProfilerNetIbDescr_v1_t ib;
	ncclProfilerNetSockDescr_v1_t sock;
	int stops;
};

static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rec recs[REC_MAX];
static int nrec, ncalls, bad_stops, bad_types, fail_starts;
static char tokens[NTOKENS];

static ncclResult_t prof_record(void **eh, int type, void *ph, int64_t id, void *ext)
{
	ncclResult_t res = ncclSuccess;

	pthread_mutex_lock(&rec_lock);
	ncalls++;
	if (type == NCCL_PROFILER_NET_EVENT_START && fail_starts) {
		res = ncclInternalError;
	} else if (type == NCCL_PROFILER_NET_EVENT_START && nrec < REC_MAX) {
		struct rec *r = &recs[nrec++];

		memset(r, 0, sizeof(*r));
		r->parent = ph;
		r->id = id;
		if ((id & ~0xffff) == NCCL_PROFILER_NET_TYPE_IB && ext)
			memcpy(&r->ib, ext, sizeof(r->ib));
		else if ((id & ~0xffff) == NCCL_PROFILER_NET_TYPE_SOCK && ext)
			memcpy(&r->sock, ext, sizeof(r->sock));
		*eh = r;
	} else if (type == NCCL_PROFILER_NET_EVENT_STOP) {
		struct rec *r = eh ? *eh : NULL;

		if (r >= recs && r < recs + nrec)
			r->stops++;
		else
			bad_stops++;
	} else if (type != NCCL_PROFILER_NET_EVENT_START) {
		bad_types++;
	}
	pthread_mutex_unlock(&rec_lock);
	return res;
}

static int is_token(const void *p)
{
	return p >= (const void *)tokens && p < (const void *)(tokens + NTOKENS);
}

struct sums {
	int n;
	size_t bytes;
};

/* Check the events under parent (a message of size bytes) on this side. */
static struct sums check_parent(struct rail_conf *cx, void *parent, size_t size,
				const char *what)
{
	int send = cx->role == RAIL_CONF_ROLE_B;
	struct sums s = { 0, 0 };

	pthread_mutex_lock(&rec_lock);
	for (int k = 0; k < nrec; k++) {
		const struct rec *r = &recs[k];

		if (r->parent != parent)
			continue;
		s.n++;
		RAIL_CONF_CHECK(cx, r->stops == 1, "%s: an event stopped %d times (once expected)",
				what, r->stops);
		if (r->id == (NCCL_PROFILER_NET_TYPE_SOCK | NCCL_PROFILER_NET_SOCKET_VER)) {
			RAIL_CONF_CHECK(cx, r->sock.type == NCCL_PROFILE_SOCKET && r->sock.sock.fd >= 0 &&
					r->sock.sock.op == (send ? NCCL_PROFILER_SOCK_OP_SEND
						       : NCCL_PROFILER_SOCK_OP_RECV),
					"%s: socket descriptor type %d fd %d op %d", what,
					r->sock.type, r->sock.sock.fd, r->sock.sock.op);
			s.bytes += r->sock.sock.length;
		} else if (r->id == (NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER)) {
			int op = r->ib.qp.opcode;

			RAIL_CONF_CHECK(cx, r->ib.type == NCCL_PROFILE_QP && r->ib.qp.qpNum > 0 &&
					r->ib.qp.device >= 0 && r->ib.qp.device < 8 &&
					(send ? op == IBV_OP_RDMA_WRITE ||
						op == IBV_OP_RDMA_WRITE_WITH_IMM
					      : op == IBV_WC_OP_RECV_RDMA_WITH_IMM),
					"%s: verbs descriptor type %d qp %d device %d opcode %d", what,
					r->ib.type, r->ib.qp.qpNum, r->ib.qp.device, op);
			s.bytes += r->ib.qp.length;
		} else {
			rail_conf_fail(cx, "%s: unknown plugin id 0x%llx", what,
				       (unsigned long long)r->id);
		}
	}
	pthread_mutex_unlock(&rec_lock);
	RAIL_CONF_CHECK(cx, s.n <= 8, "%s: %d events under one parent (NCCL's example profiler "
			"keeps 8)", what, s.n);
	RAIL_CONF_CHECK(cx, !s.n || s.bytes == size, "%s: event lengths add up to %zu bytes, "
			"the message has %zu", what, s.bytes, size);
	return s;
}

/* Whether this side's events say verbs (1), sockets (0); -1 before any event. */
static int events_verbs(void)
{
	int v = -1;

	pthread_mutex_lock(&rec_lock);
	if (nrec)
		v = (recs[0].id & ~0xffff) == NCCL_PROFILER_NET_TYPE_IB;
	pthread_mutex_unlock(&rec_lock);
	return v;
}

/* One message B -> A under parent tokens[t] (NULL: none); verified on A. */
static void one_message(struct rail_conf *cx, void *comm, size_t size, int t, unsigned k)
{
	void *ph = t >= 0 ? &tokens[t] : NULL, *req = NULL, *data[1];
	uint64_t seed = rail_conf_seed(cx, 7, k, 0);
	struct rail_conf_arena a;
	int tag = 3, got[RAIL_CONF_MAX_RECVS] = { 0 };
	size_t room = size;
	ncclResult_t res;
	char why[256];

	rail_conf_arena_init(cx, &a, comm, rail_conf_slice_room(size));
	data[0] = rail_conf_arena_take(cx, &a, size);
	rail_conf_stage(cx, "message %u: %zu bytes, parent %p", k, size, ph);
	do {
		if (cx->role == RAIL_CONF_ROLE_B) {
			rail_conf_fill(data[0], size, seed);
			res = cx->net.isend_ph(comm, data[0], size, tag, a.mh, ph, &req);
		} else {
			rail_conf_poison(data[0], size + RAIL_CONF_GUARD, seed ^ 1);
			res = cx->net.irecv_ph(comm, 1, data, &room, &tag, &a.mh, &ph, &req);
		}
		RAIL_CONF_CHECK(cx, res == ncclSuccess, "post of message %u failed: %s", k,
				rail_conf_result_str(res));
		RAIL_CONF_CHECK(cx, req || !rail_conf_expired(cx), "NULL requests until the deadline");
	} while (!req);
	res = rail_conf_wait(cx, req, got, "profiled message");
	RAIL_CONF_CHECK(cx, res == ncclSuccess, "message %u (%zu bytes) failed: %s", k, size,
			rail_conf_result_str(res));
	if (cx->role == RAIL_CONF_ROLE_A) {
		RAIL_CONF_CHECK(cx, (size_t)got[0] == size, "message %u: %d bytes reported, %zu sent",
				k, got[0], size);
		if (rail_conf_verify(data[0], size, seed, why, sizeof(why)))
			rail_conf_fail(cx, "message %u (%zu bytes): %s", k, size, why);
	}
	rail_conf_barrier(cx, "profiled message done");
	rail_conf_arena_dereg(cx, &a);
	rail_conf_arena_free(&a);
}

/*
 * Messages with parents: each one's events checked as soon as it completed;
 * which messages must have events depends on the transport, known from the
 * plugin ids either role saw (a verbs side may see none for small messages).
 */
static void with_parents(struct rail_conf *cx, void *comm)
{
	static const size_t sizes[] = { 0, 1, 4096, 65537, RAIL_CONF_MIB + 3, 4 * RAIL_CONF_MIB };
	int nev[NELEM(sizes)], send = cx->role == RAIL_CONF_ROLE_B, verbs;
	char what[96];

	for (int i = 0; i < NELEM(sizes); i++) {
		one_message(cx, comm, sizes[i], i, 100 + (unsigned)i);
		snprintf(what, sizeof(what), "message %d (%zu bytes, %s)", i, sizes[i],
			 send ? "send" : "receive");
		nev[i] = check_parent(cx, &tokens[i], sizes[i], what).n;
	}
	verbs = events_verbs();
	verbs = (int)rail_conf_xchg(cx, verbs) > 0 || verbs > 0;
	/* Sockets: every operation; verbs: every send with data, every receive with a CTS. */
	for (int i = 0; i < NELEM(sizes); i++)
		if (!verbs || (send ? sizes[i] > 0 : sizes[i] > 4096))
			RAIL_CONF_CHECK(cx, nev[i] > 0, "message %d (%zu bytes, %s): no event under "
					"its parent handle", i, sizes[i], send ? "send" : "receive");
	rail_conf_note(cx, "%d events checked (%s)", nrec, verbs ? "verbs" : "sockets");
}

/* A grouped receive of two buffers, each with its parent; B sends one message per buffer. */
static void grouped(struct rail_conf *cx, void *comm)
{
	size_t sz[2] = { 65537, 300001 };
	int tags[2] = { 11, 12 }, got[RAIL_CONF_MAX_RECVS] = { 0 };
	void *ph[2] = { &tokens[10], &tokens[11] }, *data[2], *mhs[2], *req[2] = { NULL, NULL };
	struct rail_conf_arena a;

	rail_conf_arena_init(cx, &a, comm, rail_conf_slice_room(sz[0]) + rail_conf_slice_room(sz[1]));
	for (int i = 0; i < 2; i++) {
		data[i] = rail_conf_arena_take(cx, &a, sz[i]);
		mhs[i] = a.mh;
		if (cx->role == RAIL_CONF_ROLE_B)
			rail_conf_fill(data[i], sz[i], rail_conf_seed(cx, 8, (unsigned)i, 0));
	}
	rail_conf_stage(cx, "grouped receive of 2 buffers with parents");
	for (int i = 0; i < (cx->role == RAIL_CONF_ROLE_B ? 2 : 1); i++) {
		ncclResult_t res;

		do {
			res = cx->role == RAIL_CONF_ROLE_B
				? cx->net.isend_ph(comm, data[i], sz[i], tags[i], a.mh, ph[i], &req[i])
				: cx->net.irecv_ph(comm, 2, data, sz, tags, mhs, ph, &req[i]);
			RAIL_CONF_CHECK(cx, res == ncclSuccess && (req[i] || !rail_conf_expired(cx)),
					"grouped post %d: %s", i, rail_conf_result_str(res));
		} while (!req[i]);
	}
	for (int i = 0; i < 2 && req[i]; i++)
		RAIL_CONF_CALL(cx, rail_conf_wait(cx, req[i], got, "grouped"), "test (grouped)");
	for (int i = 0; i < 2; i++) {
		struct sums s = check_parent(cx, ph[i], sz[i], i ? "grouped buffer 1"
								 : "grouped buffer 0");

		RAIL_CONF_CHECK(cx, s.n > 0, "grouped buffer %d: no event under its parent", i);
	}
	rail_conf_barrier(cx, "grouped done");
	rail_conf_arena_dereg(cx, &a);
	rail_conf_arena_free(&a);
}

/* Every event started was stopped once, under a parent we gave. */
static void check_all(struct rail_conf *cx)
{
	pthread_mutex_lock(&rec_lock);
	for (int k = 0; k < nrec; k++)
		RAIL_CONF_CHECK(cx, recs[k].stops == 1 && is_token(recs[k].parent),
				"event %d: stopped %d times, parent %p", k, recs[k].stops,
				recs[k].parent);
	RAIL_CONF_CHECK(cx, !bad_stops && !bad_types, "%d stops of unknown events, %d calls of "
			"an unknown type", bad_stops, bad_types);
	pthread_mutex_unlock(&rec_lock);
}

int rail_conf_profiler(struct rail_conf *cx)
{
	static const size_t plain[] = { 1, 65537, RAIL_CONF_MIB };
	static const char *const failed[] = { "profiler callback failed" };
	struct rail_conf_pair p;
	int calls, warns;

	rail_conf_prof_hook = prof_record;
	rail_conf_pair_open(cx, &p);
	rail_conf_simple_traffic(cx, &p, 0, plain, NULL, NELEM(plain), "without parents");
	for (int i = 0; i < NELEM(plain); i++)
		one_message(cx, p.comm, plain[i], -1, 50 + (unsigned)i);
	RAIL_CONF_CHECK(cx, ncalls == 0, "%d profiler calls for messages without a parent "
			"handle (none expected)", ncalls);
	with_parents(cx, p.comm);
	if (rail_conf_common_max_recvs(cx) >= 2)
		grouped(cx, p.comm);
	check_all(cx);
	/* A callback that fails: transfers still complete and verify; one WARN. */
	rail_conf_warn_reset();
	pthread_mutex_lock(&rec_lock);
	fail_starts = 1;
	calls = ncalls;
	pthread_mutex_unlock(&rec_lock);
	for (int i = 0; i < 3; i++)
		one_message(cx, p.comm, i ? 2 * RAIL_CONF_MIB : 65537, 13 + i, 200 + (unsigned)i);
	warns = rail_conf_warn_count();
	RAIL_CONF_CHECK(cx, ncalls > calls, "the failing callback was never called");
	RAIL_CONF_CHECK(cx, warns == 1 && rail_conf_warn_has(failed, 1), "%d WARNs for a failing "
			"profiler callback (one naming it expected)", warns);
	rail_conf_pair_close(cx, &p);
	rail_conf_prof_hook = NULL;
	return 0;
}
