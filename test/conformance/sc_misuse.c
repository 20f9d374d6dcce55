/*
 * Conformance scenarios about misuse and hostile input: misuse (calls NCCL
 * would never make, which must end in an error, never a crash) and
 * misuse-closed (handles used after they died: close twice, test or
 * deregMr after close, finalize twice), random-handle (random and damaged
 * connection handles fed to connect),
 * finalize-open (the last finalize with comms still open, then dlclose).
 */
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

/* A call that must fail, with a WARN saying why. */
#define MUST_FAIL(cx, call, what)                                                        \
	do {                                                                             \
		int w_ = rail_conf_warn_count();                                         \
		ncclResult_t r_ = (call);                                                \
		RAIL_CONF_CHECK((cx), r_ != ncclSuccess, "%s returned ncclSuccess", (what)); \
		RAIL_CONF_CHECK((cx), rail_conf_warn_count() > w_,                       \
				"%s returned %s but printed no WARN saying why", (what),  \
				rail_conf_result_str(r_));                               \
	} while (0)

/* ---- misuse ---- */

static void misuse_properties(struct rail_conf *cx)
{
	struct rail_conf_props p;
	int ndev = 0;

	rail_conf_stage(cx, "getProperties(dev, NULL)");
	RAIL_CONF_CALL(cx, cx->net.devices(&ndev), "devices");
	MUST_FAIL(cx, cx->net.get_props_raw(cx->dev, NULL), "getProperties(dev, NULL)");
	MUST_FAIL(cx, cx->net.get_props(-1, &p), "getProperties(-1, props)");
	MUST_FAIL(cx, cx->net.get_props(ndev, &p), "getProperties(ndev, props)");
	/* Still usable afterwards. */
	RAIL_CONF_CALL(cx, cx->net.get_props(cx->dev, &p), "getProperties after misuse");
}

/* regMr of a type that is neither HOST nor CUDA fails; so does a second deregMr. */
static void misuse_regmr(struct rail_conf *cx)
{
	static const int bad[] = { 0, NCCL_PTR_HOST | NCCL_PTR_CUDA, NCCL_PTR_DMABUF, 0x10 };
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	char what[96];
	void *mh = NULL;

	rail_conf_pair_open(cx, &p);
	rail_conf_arena_init(cx, &a, p.comm, 4096);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		rail_conf_stage(cx, "regMr type 0x%x", bad[i]);
		snprintf(what, sizeof(what), "regMr(type 0x%x)", bad[i]);
		MUST_FAIL(cx, cx->net.reg_mr(p.comm, a.base, 1024, bad[i], &mh), what);
	}
	rail_conf_stage(cx, "deregMr twice");
	RAIL_CONF_CALL(cx, cx->net.reg_mr(p.comm, a.base, 1024, NCCL_PTR_HOST, &mh), "regMr");
	RAIL_CONF_CALL(cx, cx->net.dereg_mr(p.comm, mh), "deregMr");
	MUST_FAIL(cx, cx->net.dereg_mr(p.comm, mh), "a second deregMr of the same handle");
	rail_conf_arena_dereg(cx, &a);
	rail_conf_pair_close(cx, &p);
	rail_conf_arena_free(&a);
}

/*
 * A single receive for tag 7 while the peer sends with tag 5. The message
 * must never complete that receive. Two behaviours are right: a transport
 * that hands a single receive the next message (TCP) fails the receive with
 * a WARN naming the tags; a transport that matches messages to receives by
 * tag (verbs: NCCL's shared comms carry several tags on one comm) leaves it
 * pending, and a receive posted for tag 5 then gets the message.
 */
static int tag_poll(struct rail_conf *cx, void *req, int *size, ncclResult_t *res, double secs)
{
	uint64_t end = rail_conf_now_ns() + (uint64_t)(secs * 1e9);
	int done = 0;

	do {
		*res = cx->net.test(req, &done, size);
		if (*res != ncclSuccess || done)
			return 1;
		sched_yield();
	} while (rail_conf_now_ns() < end);
	return 0;
}

static void misuse_tag_recv(struct rail_conf *cx, struct rail_conf_pair *p,
			    struct rail_conf_arena *a)
{
	static const char *const needles[] = { "tag" };
	void *d = a->base, *req = NULL, *req5 = NULL;
	size_t sz = 4096;
	int tag = 7, tag5 = 5, w = rail_conf_warn_count(), size = 0;
	ncclResult_t res = ncclSuccess;

	while (!req)
		RAIL_CONF_CALL(cx, cx->net.irecv(p->comm, 1, &d, &sz, &tag, &a->mh, &req), "irecv");
	rail_conf_barrier(cx, "tag-posted");
	if (tag_poll(cx, req, &size, &res, 3.0)) {
		RAIL_CONF_CHECK(cx, res != ncclSuccess, "a receive posted for tag 7 completed with "
				"a message sent with tag 5 (%d bytes)", size);
		RAIL_CONF_CHECK(cx, rail_conf_warn_count() > w && rail_conf_warn_has(needles, 1),
				"the tag mismatch failed the receive without a WARN naming the tag");
		rail_conf_note(cx, "tag mismatch: the single receive failed with a WARN");
		return;
	}
	/* Matched by tag: the tag-5 message waits for its own receive. */
	d = (char *)a->base + 4096;
	while (!req5)
		RAIL_CONF_CALL(cx, cx->net.irecv(p->comm, 1, &d, &sz, &tag5, &a->mh, &req5),
			       "irecv tag 5");
	res = rail_conf_wait(cx, req5, &size, "the receive for tag 5");
	RAIL_CONF_CHECK(cx, res == ncclSuccess && size == 1024, "the receive for tag 5 returned "
			"%d with %d bytes; expected the 1024-byte message sent with tag 5", res, size);
	RAIL_CONF_CHECK(cx, !tag_poll(cx, req, &size, &res, 0.2), "the receive for tag 7 "
			"completed (result %d, %d bytes) with no message sent for it", res, size);
	rail_conf_note(cx, "tag mismatch: matched by tag (the tag-7 receive stays pending)");
}

static void misuse_tag(struct rail_conf *cx)
{
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	void *req = NULL;
	int size = 0;

	rail_conf_pair_open(cx, &p);
	rail_conf_arena_init(cx, &a, p.comm, 8192);
	rail_conf_stage(cx, "single receive, wrong tag");
	if (cx->role == RAIL_CONF_ROLE_A) {
		misuse_tag_recv(cx, &p, &a);
	} else {
		rail_conf_barrier(cx, "tag-posted");
		while (!req)
			RAIL_CONF_CALL(cx, cx->net.isend(p.comm, a.base, 1024, 5, a.mh, &req),
				       "isend");
		rail_conf_wait(cx, req, &size, "the send with tag 5");
	}
	rail_conf_barrier(cx, "tag-done");
	rail_conf_arena_dereg(cx, &a);
	rail_conf_pair_close(cx, &p);
	rail_conf_arena_free(&a);
}

/* The sender closes: the receive fails saying the peer closed, not "reset". */
static void misuse_eof(struct rail_conf *cx)
{
	static const char *const closed[] = { "closed" };
	static const char *const reset[] = { "reset by peer" };
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	void *req = NULL;
	int size = 0;

	rail_conf_pair_open(cx, &p);
	rail_conf_arena_init(cx, &a, p.comm, 8192);
	rail_conf_stage(cx, "sender closes under a posted receive");
	if (cx->role == RAIL_CONF_ROLE_A) {
		void *d = a.base;
		size_t sz = 4096;
		int tag = 1;
		ncclResult_t res;

		rail_conf_warn_reset();
		while (!req)
			RAIL_CONF_CALL(cx, cx->net.irecv(p.comm, 1, &d, &sz, &tag, &a.mh, &req),
				       "irecv");
		rail_conf_barrier(cx, "eof-posted");
		res = rail_conf_wait(cx, req, &size, "the receive whose sender closed");
		RAIL_CONF_CHECK(cx, res != ncclSuccess, "the receive completed (%d bytes) although "
				"the sender closed without sending", size);
		RAIL_CONF_CHECK(cx, rail_conf_warn_has(closed, 1) && !rail_conf_warn_has(reset, 1),
				"the peer closed the connection (end of file), but no WARN says so "
				"or one says 'reset by peer'");
		rail_conf_arena_dereg(cx, &a);
		rail_conf_close_recv(cx, p.comm);
		rail_conf_close_listen(cx, p.lc);
	} else {
		rail_conf_barrier(cx, "eof-posted");
		rail_conf_arena_dereg(cx, &a);
		rail_conf_close_send(cx, p.comm);
	}
	rail_conf_arena_free(&a);
	rail_conf_barrier(cx, "eof-done");
}

int rail_conf_misuse(struct rail_conf *cx)
{
	misuse_properties(cx);
	misuse_regmr(cx);
	misuse_tag(cx);
	misuse_eof(cx);
	rail_conf_barrier(cx, "misuse-done");
	return 0;
}

/* ---- misuse-closed ---- */

/*
 * Handles used after they died: a request tested again after completing or
 * after its comm was closed, deregMr/regMr/isend/irecv on a closed comm,
 * accept on a closed listen comm, every close twice, finalize twice. Each
 * must fail with a WARN, and (under ASan) without reading freed memory.
 */
static void closed_recv_side(struct rail_conf *cx, struct rail_conf_pair *p,
			     struct rail_conf_arena *a)
{
	void *d = a->base, *req = NULL, *rc = NULL, *dev_comm = NULL, *mh = NULL;
	size_t sz = 4096;
	int tag = 1, done = 0, size = 0;

	rail_conf_stage(cx, "receive posted, then its comm closed");
	while (!req)
		RAIL_CONF_CALL(cx, cx->net.irecv(p->comm, 1, &d, &sz, &tag, &a->mh, &req), "irecv");
	rail_conf_close_recv(cx, p->comm);
	MUST_FAIL(cx, cx->net.test(req, &done, &size), "test of a request whose comm was closed");
	rail_conf_stage(cx, "calls on a closed receive comm");
	MUST_FAIL(cx, cx->net.dereg_mr(p->comm, a->mh), "deregMr after closeRecv");
	MUST_FAIL(cx, cx->net.reg_mr(p->comm, a->base, 4096, NCCL_PTR_HOST, &mh),
		  "regMr on a closed receive comm");
	req = NULL;
	MUST_FAIL(cx, cx->net.irecv(p->comm, 1, &d, &sz, &tag, &a->mh, &req),
		  "irecv on a closed receive comm");
	MUST_FAIL(cx, cx->net.close_recv(p->comm), "a second closeRecv");
	rail_conf_close_listen(cx, p->lc);
	MUST_FAIL(cx, cx->net.accept(p->lc, &rc, &dev_comm), "accept on a closed listen comm");
	MUST_FAIL(cx, cx->net.close_listen(p->lc), "a second closeListen");
}

static void closed_send_side(struct rail_conf *cx, struct rail_conf_pair *p,
			     struct rail_conf_arena *a)
{
	void *req = NULL;

	rail_conf_stage(cx, "calls on a closed send comm");
	rail_conf_close_send(cx, p->comm);
	MUST_FAIL(cx, cx->net.dereg_mr(p->comm, a->mh), "deregMr after closeSend");
	MUST_FAIL(cx, cx->net.isend(p->comm, a->base, 64, 1, a->mh, &req),
		  "isend on a closed send comm");
	MUST_FAIL(cx, cx->net.close_send(p->comm), "a second closeSend");
}

/* A second context (v11+), finalized twice while the first keeps the plugin up. */
static void closed_finalize(struct rail_conf *cx)
{
	void *ctx2 = NULL;

	if (cx->abi < 11 || !cx->net.has_finalize)
		return;
	rail_conf_stage(cx, "finalize twice");
	RAIL_CONF_CALL(cx, cx->net.init_ctx(&ctx2, 0x6d69737573650002ull, rail_conf_logger),
		       "init (a second context)");
	RAIL_CONF_CALL(cx, cx->net.finalize(ctx2), "finalize (the second context)");
	MUST_FAIL(cx, cx->net.finalize(ctx2), "a second finalize of the same context");
}

int rail_conf_misuse_closed(struct rail_conf *cx)
{
	struct rail_conf_pair p;
	struct rail_conf_arena a;
	void *req = NULL, *d;
	size_t sz = 4096;
	int tag = 1, done = 0, size = 0;

	rail_conf_pair_open(cx, &p);
	rail_conf_arena_init(cx, &a, p.comm, 8192);
	d = a.base;
	rail_conf_stage(cx, "one message, then its request tested again");
	while (!req) {
		if (cx->role == RAIL_CONF_ROLE_A)
			RAIL_CONF_CALL(cx, cx->net.irecv(p.comm, 1, &d, &sz, &tag, &a.mh, &req),
				       "irecv");
		else
			RAIL_CONF_CALL(cx, cx->net.isend(p.comm, a.base, 1024, 1, a.mh, &req),
				       "isend");
	}
	RAIL_CONF_CALL(cx, rail_conf_wait(cx, req, &size, "the message"), "test");
	MUST_FAIL(cx, cx->net.test(req, &done, &size), "test of a request that completed");
	rail_conf_barrier(cx, "closed-msg");
	if (cx->role == RAIL_CONF_ROLE_A)
		closed_recv_side(cx, &p, &a);
	rail_conf_barrier(cx, "closed-recv");
	if (cx->role == RAIL_CONF_ROLE_B)
		closed_send_side(cx, &p, &a);
	rail_conf_arena_free(&a);
	closed_finalize(cx);
	rail_conf_barrier(cx, "closed-done");
	return 0;
}

/* ---- random-handle ---- */

#define RH_RANDOM 32

static void random_bytes(uint8_t *p, size_t len, uint64_t seed)
{
	for (size_t i = 0; i < len; i += 8) {
		uint64_t v = rail_conf_mix64(seed + i);

		memcpy(p + i, &v, len - i < 8 ? len - i : 8);
	}
}

/*
 * B: random handles, then random handles that start like the real one
 * (magic and version, so the decoder gets past its first checks), must be
 * refused with a WARN; nothing in the handle may be trusted as a pointer.
 */
static void random_handles_b(struct rail_conf *cx, const uint8_t *good)
{
	uint8_t bad[NCCL_NET_HANDLE_MAXSIZE];
	char what[96];

	for (int i = 0; i < 2 * RH_RANDOM; i++) {
		random_bytes(bad, sizeof(bad), rail_conf_seed(cx, 77, (unsigned)i, 0));
		if (i >= RH_RANDOM)
			memcpy(bad, good, 8);
		snprintf(what, sizeof(what), "random handle #%d%s", i,
			 i >= RH_RANDOM ? " (real magic and version)" : "");
		rail_conf_connect_refused(cx, bad, what);
	}
}

int rail_conf_random_handle(struct rail_conf *cx)
{
	uint8_t h[NCCL_NET_HANDLE_MAXSIZE], damaged[NCCL_NET_HANDLE_MAXSIZE];
	void *lc = NULL;

	if (cx->role == RAIL_CONF_ROLE_A) {
		lc = rail_conf_listen(cx, h);
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_HANDLE, h, sizeof(h));
		rail_conf_watch_listener(cx, lc, "random");
	} else {
		rail_conf_ctl_recv(cx, RAIL_CONF_MSG_HANDLE, h, sizeof(h));
		random_handles_b(cx, h);
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_DONE, NULL, 0);
	}
	/*
	 * The real handle with the zero bytes at its end (the last 32 at most:
	 * listen wrote nothing there) randomized, as a buffer NCCL did not
	 * clear could hold: a plugin keeping connector state there must not
	 * trust those bytes. The connection must work.
	 */
	memcpy(damaged, h, sizeof(damaged));
	for (int i = NCCL_NET_HANDLE_MAXSIZE - 1; i >= NCCL_NET_HANDLE_MAXSIZE - 32 && !h[i]; i--)
		damaged[i] = (uint8_t)(rail_conf_mix64((uint64_t)i * 131) | 1);
	rail_conf_good_connection(cx, lc, damaged);
	return 0;
}

/* ---- finalize-open ---- */

/*
 * The last finalize with comms still open (NCCL never does this, a buggy
 * caller might), then dlclose: the plugin must either stop every thread or
 * say so and keep its code mapped; threads running in an unloaded library
 * crash the process when they wake.
 */
/* The comms this role leaves open stay referenced (no leak report: the caller holds them). */
static struct rail_conf_pair fo_pair;

int rail_conf_finalize_open(struct rail_conf *cx)
{
	static const size_t sizes[] = { RAIL_CONF_MIB };
	struct rail_conf_pair *pp = &fo_pair;
	ncclResult_t res;
	char why[256];
	void *still;
	int t0, t, warns;

	t0 = rail_conf_count_dir("/proc/self/task");
	cx->lib = dlopen(cx->opts->plugin, RTLD_NOW | RTLD_LOCAL);
	RAIL_CONF_CHECK(cx, cx->lib, "dlopen: %s", dlerror());
	if (rail_conf_bind(cx->lib, cx->abi, &cx->net, why, sizeof(why)))
		rail_conf_fail(cx, "%s", why);
	RAIL_CONF_CALL(cx, cx->net.init(&cx->net, rail_conf_logger), "init");
	rail_conf_pair_open(cx, pp);
	rail_conf_simple_traffic(cx, pp, 1, sizes, NULL, 1, "traffic before finalize");
	rail_conf_barrier(cx, "before-finalize");
	rail_conf_stage(cx, "finalize with comms open");
	warns = rail_conf_warn_count();
	res = cx->net.finalize(cx->net.ctx);
	RAIL_CONF_CHECK(cx, dlclose(cx->lib) == 0, "dlclose: %s", dlerror());
	cx->lib = NULL;
	rail_conf_sleep_ms(200);
	t = rail_conf_count_dir("/proc/self/task");
	still = dlopen(cx->opts->plugin, RTLD_NOW | RTLD_NOLOAD);
	if (still)
		dlclose(still);
	RAIL_CONF_CHECK(cx, t <= t0 || still, "%d threads after finalize+dlclose (%d before "
			"dlopen) and the library is unloaded: they crash when they wake", t, t0);
	if (t > t0) {
		RAIL_CONF_CHECK(cx, res != ncclSuccess, "finalize returned ncclSuccess with comms "
				"open and %d plugin threads still running", t - t0);
		RAIL_CONF_CHECK(cx, rail_conf_warn_count() > warns, "finalize left threads running "
				"without a WARN saying so");
		rail_conf_note(cx, "finalize refused (%s), library kept loaded",
			       rail_conf_result_str(res));
	}
	rail_conf_barrier(cx, "after-finalize");
	return 0;
}
