/*
 * Conformance suite: listen, connect and accept as NCCL drives them. connect
 * and accept are retried until they return a comm, each connect with its own
 * handle buffer (the same one on every retry); no single call may block.
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "conf.h"

static void check_call_time(struct rail_conf *cx, const char *call, uint64_t ns)
{
	RAIL_CONF_CHECK(cx, ns <= cx->call_limit_ns,
			"a single %s call took %llu ms (limit %llu ms): listen/connect/accept must "
			"not block",
			call, (unsigned long long)(ns / 1000000),
			(unsigned long long)(cx->call_limit_ns / 1000000));
}

#define CANARY 0xa7

static int canary_ok(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		if (p[i] != CANARY)
			return 0;
	}
	return 1;
}

void *rail_conf_listen(struct rail_conf *cx, void *handle)
{
	uint8_t buf[NCCL_NET_HANDLE_MAXSIZE + 64];
	void *lc = NULL;
	uint64_t t0 = rail_conf_now_ns();
	ncclResult_t res;

	memset(buf, 0, NCCL_NET_HANDLE_MAXSIZE);
	memset(buf + NCCL_NET_HANDLE_MAXSIZE, CANARY, 64);
	res = cx->net.listen(&cx->net, cx->dev, buf, &lc);
	check_call_time(cx, "listen", rail_conf_now_ns() - t0);
	RAIL_CONF_CHECK(cx, canary_ok(buf + NCCL_NET_HANDLE_MAXSIZE, 64),
			"listen wrote past the %d-byte handle", NCCL_NET_HANDLE_MAXSIZE);
	memcpy(handle, buf, NCCL_NET_HANDLE_MAXSIZE);
	RAIL_CONF_CHECK(cx, res == ncclSuccess, "listen(dev %d) returned %s", cx->dev,
			rail_conf_result_str(res));
	RAIL_CONF_CHECK(cx, lc != NULL, "listen(dev %d) returned success and no listen comm",
			cx->dev);
	return lc;
}

static void pend_step(struct rail_conf *cx, struct rail_conf_pend *p, int idx, const char *what)
{
	void *comm = NULL, *dev_comm = NULL;
	uint64_t t0 = rail_conf_now_ns(), dt;
	ncclResult_t res;

	if (p->kind == RAIL_CONF_CONNECT) {
		if (p->ctx)
			res = cx->net.connect_ctx(p->ctx, cx->dev, p->handle, &comm, &dev_comm);
		else
			res = cx->net.connect(&cx->net, cx->dev, p->handle, &comm, &dev_comm);
	} else {
		res = cx->net.accept(p->lc, &comm, &dev_comm);
	}
	dt = rail_conf_now_ns() - t0;
	p->calls++;
	RAIL_CONF_CHECK(cx, canary_ok(p->canary, sizeof(p->canary)),
			"%s: connect wrote past the %d-byte handle", what, NCCL_NET_HANDLE_MAXSIZE);
	if (dt > p->max_call_ns)
		p->max_call_ns = dt;
	check_call_time(cx, p->kind == RAIL_CONF_CONNECT ? "connect" : "accept", dt);
	RAIL_CONF_CHECK(cx, res == ncclSuccess, "%s: %s #%d returned %s on call %d", what,
			p->kind == RAIL_CONF_CONNECT ? "connect" : "accept", idx,
			rail_conf_result_str(res), p->calls);
	RAIL_CONF_CHECK(cx, dev_comm == NULL,
			"%s: %s set the device-handle slot although netDeviceType is HOST", what,
			p->kind == RAIL_CONF_CONNECT ? "connect" : "accept");
	p->comm = comm;
}

void rail_conf_establish(struct rail_conf *cx, struct rail_conf_pend *p, int n, const char *what)
{
	int left = 0;

	for (int i = 0; i < n; i++) {
		p[i].comm = NULL;
		p[i].calls = 0;
		p[i].max_call_ns = 0;
		memset(p[i].canary, CANARY, sizeof(p[i].canary));
		left++;
	}
	rail_conf_stage(cx, "%s: connect/accept (%d)", what, n);
	while (left) {
		for (int i = 0; i < n; i++) {
			if (p[i].comm)
				continue;
			pend_step(cx, &p[i], i, what);
			if (p[i].comm)
				left--;
		}
		if (!left)
			break;
		if (rail_conf_expired(cx)) {
			int i = 0;

			while (p[i].comm)
				i++;
			rail_conf_fail(cx, "%s: %d of %d connect/accept still without a comm at the "
				       "deadline (#%d: %s called %d times)", what, left, n, i,
				       p[i].kind == RAIL_CONF_CONNECT ? "connect" : "accept",
				       p[i].calls);
		}
		sched_yield();
	}
}

void rail_conf_pair_open(struct rail_conf *cx, struct rail_conf_pair *p)
{
	struct rail_conf_pend pend;
	uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];

	memset(p, 0, sizeof(*p));
	memset(&pend, 0, sizeof(pend));
	if (cx->role == RAIL_CONF_ROLE_A) {
		p->lc = rail_conf_listen(cx, handle);
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_HANDLE, handle, sizeof(handle));
		pend.kind = RAIL_CONF_ACCEPT;
		pend.lc = p->lc;
	} else {
		rail_conf_ctl_recv(cx, RAIL_CONF_MSG_HANDLE, pend.handle, sizeof(pend.handle));
		pend.kind = RAIL_CONF_CONNECT;
	}
	rail_conf_establish(cx, &pend, 1, "pair");
	p->comm = pend.comm;
}

static void close_timed(struct rail_conf *cx, ncclResult_t (*fn)(void *), void *comm,
			const char *what)
{
	uint64_t t0 = rail_conf_now_ns(), dt;
	ncclResult_t res;

	if (!comm)
		return;
	rail_conf_stage(cx, "%s", what);
	res = fn(comm);
	dt = rail_conf_now_ns() - t0;
	RAIL_CONF_CHECK(cx, res == ncclSuccess, "%s returned %s", what, rail_conf_result_str(res));
	RAIL_CONF_CHECK(cx, dt < 10000000000ull, "%s took %llu ms", what,
			(unsigned long long)(dt / 1000000));
}

void rail_conf_close_send(struct rail_conf *cx, void *sc)
{
	close_timed(cx, cx->net.close_send, sc, "closeSend");
}

void rail_conf_close_recv(struct rail_conf *cx, void *rc)
{
	close_timed(cx, cx->net.close_recv, rc, "closeRecv");
}

void rail_conf_close_listen(struct rail_conf *cx, void *lc)
{
	close_timed(cx, cx->net.close_listen, lc, "closeListen");
}

void rail_conf_pair_close(struct rail_conf *cx, struct rail_conf_pair *p)
{
	/* Both sides are done with the pair before either closes. */
	rail_conf_barrier(cx, "pair-close");
	if (cx->role == RAIL_CONF_ROLE_A) {
		rail_conf_close_recv(cx, p->comm);
		rail_conf_close_listen(cx, p->lc);
	} else {
		rail_conf_close_send(cx, p->comm);
	}
	memset(p, 0, sizeof(*p));
}

int rail_conf_common_max_recvs(struct rail_conf *cx)
{
	struct rail_conf_props props;
	int mine, theirs;

	RAIL_CONF_CALL(cx, cx->net.get_props(cx->dev, &props), "getProperties");
	mine = props.max_recvs;
	theirs = (int)rail_conf_xchg(cx, mine);
	return mine < theirs ? mine : theirs;
}

size_t rail_conf_common_max_msg(struct rail_conf *cx)
{
	struct rail_conf_props props;
	size_t mine = cx->opts->max_size, theirs;

	RAIL_CONF_CALL(cx, cx->net.get_props(cx->dev, &props), "getProperties");
	if (cx->abi >= 9 && props.max_p2p_bytes > 0 && props.max_p2p_bytes < mine)
		mine = props.max_p2p_bytes;
	theirs = (size_t)rail_conf_xchg(cx, (int64_t)mine);
	return mine < theirs ? mine : theirs;
}
