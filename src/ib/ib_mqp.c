/*
 * nccl-net-rail: ibv_modify_qp with NCCL's retry (NCCL_IB_MQP_RETRY_ALL,
 * _CNT, _SLEEP_MSEC, as NCCL 2.24+). On a large RoCE job the kernel's
 * address resolution inside the RTR transition can time out while the
 * fabric's neighbour tables fill at start-up, and a later try succeeds.
 *
 * Only a thread that carries a retry policy retries: a connect
 * handshake's helper thread, while it runs that handshake's job (ib_job.c
 * sets it). Every other caller makes
 * one attempt, as before: NCCL's proxy thread (which runs the handshake's
 * work itself when no helper thread could be started), the move thread
 * (one per process: a sleep there would stall every other move) and the
 * probes. Before retry k it sleeps NCCL_IB_MQP_RETRY_SLEEP_MSEC x k ms, in
 * slices of at most 50 ms, and stops early when the handshake's owner
 * abandons it (its cancel flag) or when the next try would come after the
 * handshake's deadline (NCCL_RAIL_CONNECT_TIMEOUT).
 */
#include <stdio.h>
#include <time.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"

#define SLICE_NS (50ull * 1000000ull)

static _Thread_local const struct rail_ib_mqp_retry *policy;

void rail_ib_mqp_retry_set(const struct rail_ib_mqp_retry *r)
{
	policy = r;
}

static int cancelled(const struct rail_ib_mqp_retry *r)
{
	return r->cancel && atomic_load(r->cancel);
}

/* Sleep ms in slices of at most 50 ms: 0, or 1 when the handshake was cancelled meanwhile. */
static int nap(const struct rail_ib_mqp_retry *r, int64_t ms)
{
	uint64_t end = rail_now_ns() + (uint64_t)ms * 1000000ull;

	while (!cancelled(r)) {
		uint64_t now = rail_now_ns();
		struct timespec ts;

		if (now >= end)
			return 0;
		ts.tv_sec = 0;
		ts.tv_nsec = (long)RAIL_MIN(end - now, SLICE_NS);
		nanosleep(&ts, NULL);
	}
	return 1;
}

/* The positive errno of ibv_modify_qp's return: an errno, -1 with errno, or a negative errno. */
static int modify_err(int ret)
{
	return ret < -1 ? -ret : rail_verbs_err(ret);
}

/* Why the retries end after attempt k (err), or NULL to sleep ms and try again. */
static const char *stop_reason(const struct rail_ib_mqp_retry *r, int k, int err, int64_t ms,
			       char *buf, size_t len)
{
	int64_t cnt = rail_param_int(RAIL_P_IB_MQP_RETRY_CNT);
	int64_t limit = rail_param_int(RAIL_P_CONNECT_TIMEOUT);

	if (err != ETIMEDOUT && !rail_param_int(RAIL_P_IB_MQP_RETRY_ALL))
		return "only ETIMEDOUT is retried; NCCL_IB_MQP_RETRY_ALL=1 retries every error";
	if (k > cnt) {
		snprintf(buf, len, "1 + NCCL_IB_MQP_RETRY_CNT=%lld", (long long)cnt);
		return buf;
	}
	if (cancelled(r))
		return "stopped: the connection attempt was abandoned";
	if (r->deadline_ns && rail_now_ns() + (uint64_t)ms * 1000000ull >= r->deadline_ns) {
		snprintf(buf, len, "stopped: the next would come after NCCL_RAIL_CONNECT_TIMEOUT=%lld "
			 "s", (long long)limit);
		return buf;
	}
	return NULL;
}

int rail_ib_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask,
		      struct rail_ib_mqp_call *x)
{
	const struct rail_ib_mqp_retry *r = x->quiet ? NULL : policy;
	int64_t base = rail_param_int(RAIL_P_IB_MQP_RETRY_SLEEP_MSEC);
	int64_t attempts = rail_param_int(RAIL_P_IB_MQP_RETRY_CNT) + 1;
	uint64_t t0 = rail_now_ns();
	const char *why = NULL;
	char buf[96];
	int k, err;

	x->note[0] = '\0';
	for (k = 1;; k++) {
		int ret = rail_ibv.modify_qp(qp, a, mask);

		x->attempts = k;
		if (!ret && k > 1)
			RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "ibv_modify_qp(%s) on %s:%d qp 0x%x to "
				  "peer %s succeeded at attempt %d, %.1f s after the first", x->state,
				  x->dev->hca->name, x->dev->port, qp->qp_num, x->peer, k,
				  (double)(rail_now_ns() - t0) / 1e9);
		if (!ret)
			return 0;
		err = modify_err(ret);
		if (!r)
			return err;	/* not the handshake's thread: one attempt, as before */
		why = stop_reason(r, k, err, base * k, buf, sizeof(buf));
		if (why)
			break;
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "ibv_modify_qp(%s) on %s:%d qp 0x%x to peer %s "
			  "failed: %s; attempt %d/%lld, retrying in %lld ms (NCCL_IB_MQP_RETRY_CNT, "
			  "NCCL_IB_MQP_RETRY_SLEEP_MSEC)", x->state, x->dev->hca->name, x->dev->port,
			  qp->qp_num, x->peer, RAIL_ERRSTR(-err), k, (long long)RAIL_MAX(attempts, 1),
			  (long long)(base * k));
		if (nap(r, base * k)) {
			why = "stopped: the connection attempt was abandoned";
			break;
		}
	}
	snprintf(x->note, sizeof(x->note), " after %d attempt%s in %.1f s (%s)", k, k > 1 ? "s" : "",
		 (double)(rail_now_ns() - t0) / 1e9, why);
	return err;
}
