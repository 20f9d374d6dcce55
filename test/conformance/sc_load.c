/*
 * Conformance scenarios under load: inflight-32, grouped-recv, many-comms,
 * listen-many, bidirectional, regmr-thread.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static size_t cap_size(size_t s, size_t cap)
{
	return s < cap ? s : cap;
}

/* ---- inflight-32 ---- */

int rail_conf_inflight32(struct rail_conf *cx)
{
	static const size_t mix[] = { 1, 100, 4096, 65536, 65537, 300000, RAIL_CONF_MIB + 3, 0,
				      8, 131072, 2 * RAIL_CONF_MIB - 1, 17 };
	size_t cap = rail_conf_common_max_msg(cx), sizes[64], room[64];
	struct rail_conf_pair p;
	int most;

	for (int i = 0; i < 64; i++) {
		sizes[i] = cap_size(mix[(i * 5) % NELEM(mix)], cap);
		room[i] = i % 5 == 0 ? cap_size(sizes[i] + 1000, cap) : sizes[i];
	}
	rail_conf_pair_open(cx, &p);
	/* 64 messages, up to 32 in flight: the first 32 are posted before any test. */
	most = rail_conf_simple_traffic(cx, &p, 0, sizes, room, 64, "inflight-32");
	if (most < NCCL_NET_MAX_REQUESTS)
		rail_conf_note(cx, "at most %d %s in flight at once (the plugin returned NULL "
			       "requests for the rest)", most,
			       cx->role == RAIL_CONF_ROLE_A ? "receives" : "sends");
	rail_conf_pair_close(cx, &p);
	return 0;
}

/* ---- grouped-recv ---- */

static size_t group_size(int g, int i, size_t cap)
{
	static const size_t mix[] = { 1000, 0, 65539, 4096, 17, 200000, 1, RAIL_CONF_MIB };

	return cap_size(mix[(g * 3 + i) % NELEM(mix)], cap);
}

/* The order the sender posts the parts of group g: shuffled, never identity. */
static void group_order(struct rail_conf *cx, int g, int n, int *perm)
{
	uint64_t x = rail_conf_seed(cx, 77, (unsigned)g, 0);
	int identity = 1;

	for (int i = 0; i < n; i++)
		perm[i] = i;
	for (int i = n - 1; i > 0; i--) {
		int j = (int)((x = rail_conf_mix64(x)) % (uint64_t)(i + 1)), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (int i = 0; i < n; i++)
		identity &= perm[i] == i;
	if (identity) {
		int t = perm[0];

		for (int i = 0; i < n - 1; i++)
			perm[i] = perm[i + 1];
		perm[n - 1] = t;
	}
}

static void grouped_round(struct rail_conf *cx, void *comm, int ngroups, int nr, unsigned stream)
{
	int is_recv = cx->role == RAIL_CONF_ROLE_A;
	int nops = is_recv ? ngroups : ngroups * nr, k = 0;
	size_t cap = rail_conf_common_max_msg(cx), total = 0;
	struct rail_conf_op *ops = calloc((size_t)nops, sizeof(*ops));
	struct rail_conf_lane lane = { .comm = comm };
	struct rail_conf_engine e = { .ops = ops, .nops = nops, .lanes = &lane, .nlanes = 1 };
	struct rail_conf_arena a;

	RAIL_CONF_CHECK(cx, ops, "out of memory");
	lane.limit = is_recv ? NCCL_NET_MAX_REQUESTS : NCCL_NET_MAX_REQUESTS * nr;
	for (int g = 0; g < ngroups; g++) {
		for (int i = 0; i < nr; i++)
			total += rail_conf_slice_room(group_size(g, i, cap) + (is_recv ? 512 : 0));
	}
	rail_conf_arena_init(cx, &a, comm, total);
	for (int g = 0; g < ngroups; g++) {
		int perm[RAIL_CONF_MAX_RECVS] = { 0 };

		group_order(cx, g, nr, perm);
		for (int i = 0; i < nr; i++) {
			int part = is_recv ? i : perm[i];
			struct rail_conf_op *op = &ops[is_recv ? g : k++];
			int j = is_recv ? i : 0;
			size_t sz = group_size(g, part, cap);

			op->kind = is_recv ? RAIL_CONF_RECV : RAIL_CONF_SEND;
			op->n = is_recv ? nr : 1;
			op->expect[j] = sz;
			op->size[j] = is_recv && (g + part) % 3 == 0 ? sz + 512 : sz;
			op->buf[j] = rail_conf_arena_take(cx, &a, op->size[j]);
			op->seed[j] = rail_conf_seed(cx, stream, (unsigned)g, (unsigned)part);
			op->tag[j] = 100 + part;
			op->mh[j] = a.mh;
		}
	}
	rail_conf_ops_prepare(ops, nops);
	rail_conf_engine_run(cx, &e, ngroups == 1 ? "one grouped receive" : "grouped receives");
	rail_conf_arena_dereg(cx, &a);
	rail_conf_arena_free(&a);
	free(ops);
}

int rail_conf_grouped_recv(struct rail_conf *cx)
{
	int nr = rail_conf_common_max_recvs(cx);
	struct rail_conf_pair p;

	if (nr <= 1) {
		rail_conf_skip_reason(cx, "maxRecvs is %d: the plugin offers no grouped receives", nr);
		return 1;
	}
	rail_conf_pair_open(cx, &p);
	grouped_round(cx, p.comm, 1, nr, 1);
	rail_conf_barrier(cx, "one-group");
	grouped_round(cx, p.comm, NCCL_NET_MAX_REQUESTS, nr, 2);
	rail_conf_pair_close(cx, &p);
	return 0;
}

/* ---- many comms between the two processes ---- */

struct multi {
	int n;
	int one_listen;
	void **lcs;		/* A: listen comms */
	void **comms;		/* A: receive comms (in B's order), B: send comms */
};

static void multi_open(struct rail_conf *cx, struct multi *m)
{
	int nl = m->one_listen ? 1 : m->n;
	size_t hlen = (size_t)nl * NCCL_NET_HANDLE_MAXSIZE;
	uint8_t *handles = calloc(1, hlen);
	struct rail_conf_pend *pend = calloc((size_t)m->n, sizeof(*pend));

	RAIL_CONF_CHECK(cx, handles && pend, "out of memory");
	m->lcs = calloc((size_t)nl, sizeof(void *));
	m->comms = calloc((size_t)m->n, sizeof(void *));
	RAIL_CONF_CHECK(cx, m->lcs && m->comms, "out of memory");
	if (cx->role == RAIL_CONF_ROLE_A) {
		for (int i = 0; i < nl; i++)
			m->lcs[i] = rail_conf_listen(cx, handles + (size_t)i * NCCL_NET_HANDLE_MAXSIZE);
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_BLOB, handles, hlen);
		for (int i = 0; i < m->n; i++) {
			pend[i].kind = RAIL_CONF_ACCEPT;
			pend[i].lc = m->lcs[m->one_listen ? 0 : i];
		}
	} else {
		rail_conf_ctl_recv(cx, RAIL_CONF_MSG_BLOB, handles, hlen);
		for (int i = 0; i < m->n; i++) {
			pend[i].kind = RAIL_CONF_CONNECT;
			/* Each connection has its own copy of the handle, as in NCCL. */
			memcpy(pend[i].handle,
			       handles + (size_t)(m->one_listen ? 0 : i) * NCCL_NET_HANDLE_MAXSIZE,
			       NCCL_NET_HANDLE_MAXSIZE);
		}
	}
	rail_conf_establish(cx, pend, m->n, m->one_listen ? "one listen, many accepts"
							  : "one listen per comm");
	for (int i = 0; i < m->n; i++)
		m->comms[i] = pend[i].comm;
	free(pend);
	free(handles);
}

/*
 * With one listen comm the accept order need not follow the connect order:
 * B sends its connection index first, A sorts its comms by it.
 */
static void multi_identify(struct rail_conf *cx, struct multi *m)
{
	struct rail_conf_op *ops = calloc((size_t)m->n, sizeof(*ops));
	struct rail_conf_lane *lanes = calloc((size_t)m->n, sizeof(*lanes));
	struct rail_conf_arena *ar = calloc((size_t)m->n, sizeof(*ar));
	struct rail_conf_engine e = { .ops = ops, .nops = m->n, .lanes = lanes, .nlanes = m->n };
	int is_recv = cx->role == RAIL_CONF_ROLE_A;
	void **sorted = calloc((size_t)m->n, sizeof(void *));

	RAIL_CONF_CHECK(cx, ops && lanes && ar && sorted, "out of memory");
	for (int i = 0; i < m->n; i++) {
		rail_conf_arena_init(cx, &ar[i], m->comms[i], 4096);
		lanes[i].comm = m->comms[i];
		lanes[i].limit = 1;
		ops[i].kind = is_recv ? RAIL_CONF_RECV : RAIL_CONF_SEND;
		ops[i].lane = i;
		ops[i].n = 1;
		ops[i].size[0] = ops[i].expect[0] = 8;
		ops[i].buf[0] = rail_conf_arena_take(cx, &ar[i], 8);
		ops[i].seed[0] = rail_conf_seed(cx, 999, (unsigned)i, 0);
		ops[i].tag[0] = 1;
		ops[i].mh[0] = ar[i].mh;
	}
	rail_conf_ops_prepare(ops, m->n);
	e.flags = RAIL_CONF_ENGINE_NOVERIFY;
	rail_conf_engine_run(cx, &e, "identify connections");
	for (int i = 0; is_recv && i < m->n; i++) {
		int j = 0;
		uint8_t want[8];

		RAIL_CONF_CHECK(cx, ops[i].got[0] == 8, "identify: comm %d received %d bytes, sent 8",
				i, ops[i].got[0]);
		for (j = 0; j < m->n; j++) {
			rail_conf_fill(want, 8, rail_conf_seed(cx, 999, (unsigned)j, 0));
			if (!memcmp(want, ops[i].buf[0], 8))
				break;
		}
		RAIL_CONF_CHECK(cx, j < m->n && !sorted[j],
				"identify: accepted comm %d carries %s connection index", i,
				j < m->n ? "a duplicate" : "no valid");
		sorted[j] = m->comms[i];
	}
	for (int i = 0; i < m->n; i++)
		rail_conf_arena_dereg(cx, &ar[i]);
	for (int i = 0; i < m->n; i++)
		rail_conf_arena_free(&ar[i]);
	if (is_recv)
		memcpy(m->comms, sorted, sizeof(void *) * (size_t)m->n);
	free(sorted);
	free(ar);
	free(lanes);
	free(ops);
}

/* nmsg messages on every comm, all comms interleaved, all verified. */
static void multi_traffic(struct rail_conf *cx, struct multi *m, int nmsg, const size_t *mix,
			  int nmix, unsigned stream)
{
	int nops = m->n * nmsg, is_recv = cx->role == RAIL_CONF_ROLE_A;
	size_t cap = rail_conf_common_max_msg(cx);
	/* nops > 0: gcc 11 otherwise finds a path with a negative count (-Walloc-size-larger-than). */
	struct rail_conf_op *ops = calloc(nops > 0 ? (size_t)nops : 1, sizeof(*ops));
	struct rail_conf_lane *lanes = calloc((size_t)m->n, sizeof(*lanes));
	struct rail_conf_arena *ar = calloc((size_t)m->n, sizeof(*ar));
	struct rail_conf_engine e = { .ops = ops, .nops = nops, .lanes = lanes, .nlanes = m->n };

	RAIL_CONF_CHECK(cx, ops && lanes && ar, "out of memory");
	for (int c = 0; c < m->n; c++) {
		size_t total = 0;

		for (int k = 0; k < nmsg; k++)
			total += rail_conf_slice_room(cap_size(mix[(c * 7 + k) % nmix], cap));
		rail_conf_arena_init(cx, &ar[c], m->comms[c], total);
		lanes[c].comm = m->comms[c];
		lanes[c].limit = NCCL_NET_MAX_REQUESTS;
	}
	/* Message k of every comm before message k+1 of any: the lanes interleave. */
	for (int k = 0, i = 0; k < nmsg; k++) {
		for (int c = 0; c < m->n; c++, i++) {
			struct rail_conf_op *op = &ops[i];

			op->kind = is_recv ? RAIL_CONF_RECV : RAIL_CONF_SEND;
			op->lane = c;
			op->n = 1;
			op->size[0] = op->expect[0] = cap_size(mix[(c * 7 + k) % nmix], cap);
			op->buf[0] = rail_conf_arena_take(cx, &ar[c], op->size[0]);
			op->seed[0] = rail_conf_seed(cx, stream, (unsigned)(c * 1000 + k), 0);
			op->tag[0] = 1;
			op->mh[0] = ar[c].mh;
		}
	}
	rail_conf_ops_prepare(ops, nops);
	rail_conf_engine_run(cx, &e, m->one_listen ? "traffic (one listen)" : "traffic");
	for (int c = 0; c < m->n; c++)
		rail_conf_arena_dereg(cx, &ar[c]);
	for (int c = 0; c < m->n; c++)
		rail_conf_arena_free(&ar[c]);
	free(ar);
	free(lanes);
	free(ops);
}

static void multi_close(struct rail_conf *cx, struct multi *m)
{
	int nl = m->one_listen ? 1 : m->n;

	rail_conf_barrier(cx, "multi-close");
	for (int i = 0; i < m->n; i++) {
		if (cx->role == RAIL_CONF_ROLE_A)
			rail_conf_close_recv(cx, m->comms[i]);
		else
			rail_conf_close_send(cx, m->comms[i]);
	}
	for (int i = 0; cx->role == RAIL_CONF_ROLE_A && i < nl; i++)
		rail_conf_close_listen(cx, m->lcs[i]);
	free(m->lcs);
	free(m->comms);
}

static void multi_run(struct rail_conf *cx, int n, int one_listen, int nmsg, const size_t *mix,
		      int nmix, unsigned stream)
{
	struct multi m = { .n = n, .one_listen = one_listen };

	multi_open(cx, &m);
	if (one_listen)
		multi_identify(cx, &m);
	multi_traffic(cx, &m, nmsg, mix, nmix, stream);
	multi_close(cx, &m);
}

static int max_comms(struct rail_conf *cx)
{
	struct rail_conf_props props;
	int mine, theirs;

	RAIL_CONF_CALL(cx, cx->net.get_props(cx->dev, &props), "getProperties");
	mine = props.max_comms;
	theirs = (int)rail_conf_xchg(cx, mine);
	return mine < theirs ? mine : theirs;
}

int rail_conf_many_comms(struct rail_conf *cx)
{
	static const size_t mix[] = { 1, 777, 8192, 70000, 200000, 4101 };
	int n = 64, lim = max_comms(cx);

	if (lim < n) {
		rail_conf_note(cx, "maxComms is %d: %d comms instead of 64", lim, lim);
		n = lim;
	}
	multi_run(cx, n, 0, cx->full ? 4 : 2, mix, NELEM(mix), 1);
	rail_conf_barrier(cx, "second-variant");
	multi_run(cx, n, 1, cx->full ? 4 : 2, mix, NELEM(mix), 2);
	return 0;
}

int rail_conf_listen_many(struct rail_conf *cx)
{
	static const size_t mix[] = { 4 * RAIL_CONF_MIB, 65537, 1, RAIL_CONF_MIB, 0 };

	multi_run(cx, 8, 1, 5, mix, NELEM(mix), 1);
	return 0;
}

/* ---- bidirectional ---- */

int rail_conf_bidirectional(struct rail_conf *cx)
{
	size_t cap = rail_conf_common_max_msg(cx), big = cx->full ? 128 * RAIL_CONF_MIB
								: 16 * RAIL_CONF_MIB;
	size_t sizes[] = { cap_size(big, cap), 1, cap_size(big, cap), 65537,
			   cap_size(4 * RAIL_CONF_MIB, cap), 0 };
	int nmsg = NELEM(sizes), me = cx->role, peer = !cx->role;
	uint8_t mine[NCCL_NET_HANDLE_MAXSIZE];
	struct rail_conf_pend pend[2];
	struct rail_conf_op ops[2 * NELEM(sizes)];
	struct rail_conf_lane lanes[2];
	struct rail_conf_arena ar[2];
	struct rail_conf_engine e = { .ops = ops, .nops = 2 * nmsg, .lanes = lanes, .nlanes = 2 };
	void *lc;
	size_t total = 0;

	memset(pend, 0, sizeof(pend));
	memset(ops, 0, sizeof(ops));
	memset(lanes, 0, sizeof(lanes));
	lc = rail_conf_listen(cx, mine);
	rail_conf_ctl_send(cx, RAIL_CONF_MSG_HANDLE, mine, sizeof(mine));
	rail_conf_ctl_recv(cx, RAIL_CONF_MSG_HANDLE, pend[0].handle, sizeof(pend[0].handle));
	pend[0].kind = RAIL_CONF_CONNECT;
	pend[1].kind = RAIL_CONF_ACCEPT;
	pend[1].lc = lc;
	/* Each side connects and accepts at once; doing one first would deadlock. */
	rail_conf_establish(cx, pend, 2, "both ways");
	for (int i = 0; i < nmsg; i++)
		total += rail_conf_slice_room(sizes[i]);
	for (int l = 0; l < 2; l++) {
		rail_conf_arena_init(cx, &ar[l], pend[l].comm, total);
		lanes[l].comm = pend[l].comm;
		lanes[l].limit = NCCL_NET_MAX_REQUESTS;
	}
	for (int i = 0; i < 2 * nmsg; i++) {
		struct rail_conf_op *op = &ops[i];
		int l = i % 2, k = i / 2; /* lane 0 sends, lane 1 receives */

		op->kind = l == 0 ? RAIL_CONF_SEND : RAIL_CONF_RECV;
		op->lane = l;
		op->n = 1;
		op->size[0] = op->expect[0] = sizes[k];
		op->buf[0] = rail_conf_arena_take(cx, &ar[l], sizes[k]);
		op->seed[0] = rail_conf_seed(cx, (unsigned)(l == 0 ? me : peer), (unsigned)k, 0);
		op->tag[0] = l == 0 ? me : peer;
		op->mh[0] = ar[l].mh;
	}
	rail_conf_ops_prepare(ops, 2 * nmsg);
	rail_conf_engine_run(cx, &e, "bidirectional");
	rail_conf_arena_dereg(cx, &ar[0]);
	rail_conf_arena_dereg(cx, &ar[1]);
	rail_conf_barrier(cx, "bidir-close");
	rail_conf_close_send(cx, pend[0].comm);
	rail_conf_close_recv(cx, pend[1].comm);
	rail_conf_close_listen(cx, lc);
	rail_conf_arena_free(&ar[0]);
	rail_conf_arena_free(&ar[1]);
	return 0;
}

/* ---- regmr-thread ---- */

struct regmr_arg {
	struct rail_conf *cx;
	void *comm;
	uint8_t *extra;
	size_t extra_len;
	uint8_t *data;		/* the comm's registered buffer: sub-ranges of it */
	size_t data_len;
	atomic_int stop;
	atomic_long iters;
};

static void *regmr_loop(void *p)
{
	struct regmr_arg *a = p;
	struct rail_conf *cx = a->cx;

	while (!atomic_load(&a->stop)) {
		void *mh = NULL, *mh2 = NULL;
		size_t off = ((size_t)atomic_load(&a->iters) * 4096) % (a->data_len / 2);

		RAIL_CONF_CALL(cx, cx->net.reg_mr(a->comm, a->extra, a->extra_len, NCCL_PTR_HOST, &mh),
			       "regMr (registration thread)");
		/* NCCL registers sub-ranges of buffers that are already registered. */
		RAIL_CONF_CALL(cx, cx->net.reg_mr(a->comm, a->data + off, a->data_len / 4,
						  NCCL_PTR_HOST, &mh2),
			       "regMr of a sub-range (registration thread)");
		RAIL_CONF_CALL(cx, cx->net.dereg_mr(a->comm, mh2), "deregMr (registration thread)");
		RAIL_CONF_CALL(cx, cx->net.dereg_mr(a->comm, mh), "deregMr (registration thread)");
		atomic_fetch_add(&a->iters, 1);
	}
	return NULL;
}

int rail_conf_regmr_thread(struct rail_conf *cx)
{
	static const size_t mix[] = { 1, 4096, 65537, 262144, 100, 0, 131072 };
	int is_recv = cx->role == RAIL_CONF_ROLE_A, nmsg = 200;
	size_t cap = rail_conf_common_max_msg(cx), total = 0;
	struct rail_conf_op *ops = calloc((size_t)nmsg, sizeof(*ops));
	struct rail_conf_lane lane = { .limit = NCCL_NET_MAX_REQUESTS };
	struct rail_conf_engine e = { .ops = ops, .nops = nmsg, .lanes = &lane, .nlanes = 1 };
	struct rail_conf_arena a, extra;
	struct regmr_arg arg;
	struct rail_conf_pair p;
	pthread_t th;

	RAIL_CONF_CHECK(cx, ops, "out of memory");
	rail_conf_pair_open(cx, &p);
	lane.comm = p.comm;
	for (int i = 0; i < nmsg; i++)
		total += rail_conf_slice_room(cap_size(mix[i % NELEM(mix)], cap));
	rail_conf_arena_init(cx, &a, p.comm, total);
	for (int i = 0; i < nmsg; i++) {
		ops[i].kind = is_recv ? RAIL_CONF_RECV : RAIL_CONF_SEND;
		ops[i].n = 1;
		ops[i].size[0] = ops[i].expect[0] = cap_size(mix[i % NELEM(mix)], cap);
		ops[i].buf[0] = rail_conf_arena_take(cx, &a, ops[i].size[0]);
		ops[i].seed[0] = rail_conf_seed(cx, 0, (unsigned)i, 0);
		ops[i].tag[0] = 1;
		ops[i].mh[0] = a.mh;
	}
	rail_conf_ops_prepare(ops, nmsg);
	/* The extra buffer is mapped but unregistered; the thread owns its registrations. */
	memset(&extra, 0, sizeof(extra));
	rail_conf_arena_init(cx, &extra, p.comm, RAIL_CONF_MIB);
	rail_conf_arena_dereg(cx, &extra);
	memset(&arg, 0, sizeof(arg));
	arg.cx = cx;
	arg.comm = p.comm;
	arg.extra = extra.base;
	arg.extra_len = extra.len;
	arg.data = a.base;
	arg.data_len = a.len;
	RAIL_CONF_CHECK(cx, !pthread_create(&th, NULL, regmr_loop, &arg), "pthread_create");
	/* The thread is registering before the traffic starts. */
	while (atomic_load(&arg.iters) == 0) {
		RAIL_CONF_CHECK(cx, !rail_conf_expired(cx), "the registration thread never "
				"completed a regMr/deregMr round");
		sched_yield();
	}
	rail_conf_engine_run(cx, &e, "traffic during regMr/deregMr");
	atomic_store(&arg.stop, 1);
	pthread_join(th, NULL);
	if (cx->opts->verbose)
		rail_conf_note(cx, "%ld regMr/deregMr rounds during traffic",
			       (long)atomic_load(&arg.iters));
	rail_conf_arena_dereg(cx, &a);
	rail_conf_pair_close(cx, &p);
	rail_conf_arena_free(&a);
	rail_conf_arena_free(&extra);
	free(ops);
	return 0;
}
