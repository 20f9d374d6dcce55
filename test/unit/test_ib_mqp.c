/*
 * nccl-net-rail unit tests: ibv_modify_qp retried as NCCL 2.24+ does
 * (NCCL_IB_MQP_RETRY_ALL, _CNT, _SLEEP_MSEC; src/ib/ib_mqp.c) on the fake
 * provider, whose fv_test_modify_fail makes the next state changes of a
 * device fail (RoCE's address resolution timing out at RTR). The retries
 * and their sleeps run on the handshake's helper thread: NCCL's connect
 * and accept calls return promptly meanwhile, freeing the handshake (its
 * deadline, closing the listener) cuts them short, and a failover move's
 * RTR is attempted once.
 */
#include "unit.h"

#include <infiniband/verbs.h>

#include "fv_harness.h"

static const char roce_two[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n"
			       "device mlx5_1\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::2 type=v1\n"
			       "gid 1 ::ffff:10.2.0.1 type=v2\n";

#define PROMPT_NS (500ull * 1000000ull)	/* no NCCL call may wait for a retry's sleep */
#define MS(ns) ((double)(ns) / 1e6)

/* Drive connect (mlx5_0) and accept (mlx5_1) as fvh_try_connect does, timing every call. */
static int timed_connect(struct fvh *F, uint64_t limit_ns, uint64_t *worst, ncclResult_t *cr,
			 ncclResult_t *ar)
{
	uint64_t end = rail_now_ns() + limit_ns, grace = 0;

	*worst = 0;
	*cr = *ar = ncclSuccess;
	assert_int_equal(rail_net_listen(F->ctx, 1, F->handle, &F->lc), ncclSuccess);
	while (rail_now_ns() < end) {
		int cdone = F->sc || *cr != ncclSuccess, adone = F->rc || *ar != ncclSuccess;
		uint64_t t;

		if (cdone && adone)
			break;
		if (!cdone) {
			t = rail_now_ns();
			*cr = rail_net_connect(F->ctx, 0, -1, F->handle, &F->sc);
			*worst = RAIL_MAX(*worst, rail_now_ns() - t);
		}
		if (adone)
			continue;
		if (*cr != ncclSuccess) {
			if (!grace)
				grace = rail_now_ns() + 200000000ull;
			if (rail_now_ns() > grace)
				break;
		}
		t = rail_now_ns();
		*ar = rail_net_accept(F->lc, &F->rc);
		*worst = RAIL_MAX(*worst, rail_now_ns() - t);
		usleep(1000);
	}
	return F->sc && F->rc;
}

/* Lines of the fake's log since mark where a modify_qp of dev failed by fv_test_modify_fail. */
static int injected(const struct fvh *F, int mark, const char *dev)
{
	char d[64];

	snprintf(d, sizeof(d), "dev=%s ", dev);
	return fvh_calls(F, mark, "ibv_modify_qp", d, "modify_fail", NULL);
}


/*
 * The sender's RTR times out twice, then works: the connection is made on
 * the third attempt, after sleeps of 300 and 600 ms on the helper thread,
 * each retry logged; no connect or accept call waits for them.
 */
static void test_rtr_timeout_clears(void **state)
{
	struct fvh *F;
	ncclResult_t cr, ar;
	uint64_t worst, t0;

	(void)state;
	setenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "300", 1);
	F = fvh_start(roce_two);
	assert_non_null(F->modify_fail);
	assert_int_equal(F->modify_fail("mlx5_0", IBV_QPS_RTR, ETIMEDOUT, 2), 0);
	t0 = rail_now_ns();
	if (!timed_connect(F, 10000000000ull, &worst, &cr, &ar)) {
		fvh_log_dump();
		fail_msg("an RTR timing out twice failed the connection (connect %d, accept %d)", cr,
			 ar);
	}
	if (rail_now_ns() - t0 < 900000000ull)
		fail_msg("connected %.0f ms after the start, before the two sleeps (900 ms)",
			 MS(rail_now_ns() - t0));
	if (worst >= PROMPT_NS)
		fail_msg("a connect or accept call took %.0f ms: the retry slept on NCCL's thread",
			 MS(worst));
	assert_int_equal(injected(F, 0, "mlx5_0"), 2);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, "ibv_modify_qp(RTR) on mlx5_0:1 qp 0x",
				       "Connection timed out; attempt 1/35, retrying in 300 ms"), 1);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, "to peer ", "attempt 2/35, retrying in 600 ms"),
			 1);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, "ibv_modify_qp(RTR)", "succeeded at attempt 3"),
			 1);
	assert_int_equal(fvh_log_count(NCCL_LOG_WARN, "ibv_modify_qp", NULL), 0);
	fvh_one_message(F, 3);
	fvh_stop(F);
}

/* More timeouts than retries: the connect fails, the WARN says after how many and what to try. */
static void test_retries_exhausted(void **state)
{
	struct fvh *F;
	ncclResult_t cr, ar;
	uint64_t worst;

	(void)state;
	setenv("NCCL_IB_MQP_RETRY_CNT", "2", 1);
	setenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "20", 1);
	F = fvh_start(roce_two);
	assert_int_equal(F->modify_fail("mlx5_0", IBV_QPS_RTR, ETIMEDOUT, 10), 0);
	assert_false(timed_connect(F, 10000000000ull, &worst, &cr, &ar));
	assert_int_not_equal(cr, ncclSuccess);
	assert_true(worst < PROMPT_NS);
	assert_int_equal(injected(F, 0, "mlx5_0"), 3);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, "ibv_modify_qp(RTR)", "retrying in"), 2);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, "ibv_modify_qp(RTR)", "attempt 2/3"), 1);
	if (fvh_log_count(NCCL_LOG_WARN, "ibv_modify_qp(RTR) on mlx5_0:1 qp 0x",
			  "failed after 3 attempts in ") != 1 ||
	    fvh_log_count(NCCL_LOG_WARN, "(1 + NCCL_IB_MQP_RETRY_CNT=2): Connection timed out",
			  "NCCL_CROSS_NIC=0") != 1 ||
	    fvh_log_count(NCCL_LOG_WARN, "ibv_modify_qp(RTR)", "NCCL_IB_GID_INDEX (chosen 1") != 1) {
		fvh_log_dump();
		fail_msg("no WARN naming the RTR, its 3 attempts, the error and what to try");
	}
	F->modify_fail("mlx5_0", IBV_QPS_RTR, 0, 0);
	fvh_stop(F);
}

/* EINVAL is not retried by default: one attempt, and the WARN says how to retry it. */
static void test_einval_once(void **state)
{
	struct fvh *F;
	ncclResult_t cr, ar;
	uint64_t worst;

	(void)state;
	setenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "20", 1);
	F = fvh_start(roce_two);
	assert_int_equal(F->modify_fail("mlx5_0", IBV_QPS_RTR, EINVAL, 1), 0);
	assert_false(timed_connect(F, 10000000000ull, &worst, &cr, &ar));
	assert_int_equal(injected(F, 0, "mlx5_0"), 1);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, "ibv_modify_qp", "retrying in"), 0);
	if (fvh_log_count(NCCL_LOG_WARN, "ibv_modify_qp(RTR) on mlx5_0:1", "failed after 1 attempt "
			  "in ") != 1 ||
	    fvh_log_count(NCCL_LOG_WARN, "NCCL_IB_MQP_RETRY_ALL=1 retries every error): Invalid "
			  "argument", NULL) != 1) {
		fvh_log_dump();
		fail_msg("no WARN saying the EINVAL was tried once and how to retry it");
	}
	fvh_stop(F);
}

/* NCCL_IB_MQP_RETRY_ALL=1: an EINVAL that clears is retried like a timeout. */
static void test_einval_retry_all(void **state)
{
	struct fvh *F;
	ncclResult_t cr, ar;
	uint64_t worst;

	(void)state;
	setenv("NCCL_IB_MQP_RETRY_ALL", "1", 1);
	setenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "20", 1);
	F = fvh_start(roce_two);
	assert_int_equal(F->modify_fail("mlx5_1", IBV_QPS_INIT, EINVAL, 1), 0);
	if (!timed_connect(F, 10000000000ull, &worst, &cr, &ar)) {
		fvh_log_dump();
		fail_msg("NCCL_IB_MQP_RETRY_ALL=1 did not retry an EINVAL (connect %d, accept %d)",
			 cr, ar);
	}
	assert_int_equal(injected(F, 0, "mlx5_1"), 1);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, "ibv_modify_qp(INIT) on mlx5_1:1",
				       "Invalid argument; attempt 1/35, retrying in 20 ms"), 1);
	fvh_one_message(F, 3);
	fvh_stop(F);
}

/*
 * A retry budget of hours, NCCL_RAIL_CONNECT_TIMEOUT=1: the sender's RTR
 * is tried at 0, 0.2 and 0.6 s, and not again, as the next try (after
 * 0.6 s more) would pass the deadline; the connect fails then, and no
 * call waits for the helper's sleep.
 */
static void test_deadline_cuts_retries(void **state)
{
	struct fvh *F;
	ncclResult_t cr, ar;
	uint64_t worst, t0, took;

	(void)state;
	setenv("NCCL_IB_MQP_RETRY_CNT", "1000", 1);
	setenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "200", 1);
	setenv("NCCL_RAIL_CONNECT_TIMEOUT", "1", 1);
	F = fvh_start(roce_two);
	assert_int_equal(F->modify_fail("mlx5_0", IBV_QPS_RTR, ETIMEDOUT, 1000000), 0);
	t0 = rail_now_ns();
	assert_false(timed_connect(F, 20000000000ull, &worst, &cr, &ar));
	took = rail_now_ns() - t0;
	assert_int_not_equal(cr, ncclSuccess);
	if (took > 2500000000ull || worst >= PROMPT_NS) {
		fvh_log_dump();
		fail_msg("with NCCL_RAIL_CONNECT_TIMEOUT=1 the connect ended after %.0f ms, its slowest "
			 "call %.0f ms", MS(took), MS(worst));
	}
	assert_true(took > 500000000ull);
	assert_int_equal(injected(F, 0, "mlx5_0"), 3);
	if (fvh_log_count(NCCL_LOG_WARN, "ibv_modify_qp(RTR) on mlx5_0:1",
			  "failed after 3 attempts in ") != 1 ||
	    fvh_log_count(NCCL_LOG_WARN, "(stopped: the next would come after "
			  "NCCL_RAIL_CONNECT_TIMEOUT=1 s): Connection timed out", NULL) != 1) {
		fvh_log_dump();
		fail_msg("no WARN saying the RTR's retries stopped before the handshake's deadline");
	}
	F->modify_fail("mlx5_0", IBV_QPS_RTR, 0, 0);
	fvh_stop(F);
}

/*
 * The receiver's INIT keeps timing out (a retry budget of minutes):
 * closing the listener while its helper sleeps returns promptly, and the
 * connector then fails.
 */
static void test_close_listen_cancels(void **state)
{
	struct fvh *F;
	ncclResult_t cr = ncclSuccess;
	uint64_t t, took, end;
	void *rc = NULL;

	(void)state;
	setenv("NCCL_IB_MQP_RETRY_CNT", "1000", 1);
	setenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "1000", 1);
	setenv("NCCL_RAIL_CONNECT_TIMEOUT", "30", 1);
	F = fvh_start(roce_two);
	assert_int_equal(F->modify_fail("mlx5_1", IBV_QPS_INIT, ETIMEDOUT, 1000000), 0);
	assert_int_equal(rail_net_listen(F->ctx, 1, F->handle, &F->lc), ncclSuccess);
	end = rail_now_ns() + 10000000000ull;
	while (!fvh_log_count(NCCL_LOG_INFO, "ibv_modify_qp(INIT) on mlx5_1:1", "attempt 2/1001") &&
	       rail_now_ns() < end) {
		if (cr == ncclSuccess && !F->sc)
			cr = rail_net_connect(F->ctx, 0, -1, F->handle, &F->sc);
		assert_int_equal(rail_net_accept(F->lc, &rc), ncclSuccess);
		assert_null(rc);
		usleep(1000);
	}
	if (!fvh_log_count(NCCL_LOG_INFO, "ibv_modify_qp(INIT) on mlx5_1:1", "attempt 2/1001")) {
		fvh_log_dump();
		fail_msg("the receiver's INIT was not retried twice within 10 s");
	}
	t = rail_now_ns();
	assert_int_equal(rail_net_close_listen(F->lc), ncclSuccess);
	took = rail_now_ns() - t;
	F->lc = NULL;
	if (took >= PROMPT_NS)
		fail_msg("closing the listener took %.0f ms: it waited for the retries' sleep",
			 MS(took));
	end = rail_now_ns() + 5000000000ull;
	while (cr == ncclSuccess && !F->sc && rail_now_ns() < end)
		cr = rail_net_connect(F->ctx, 0, -1, F->handle, &F->sc);
	assert_int_not_equal(cr, ncclSuccess);
	assert_int_equal(fvh_log_count(NCCL_LOG_WARN, "ibv_modify_qp(INIT)", "was abandoned"), 1);
	F->modify_fail("mlx5_1", IBV_QPS_INIT, 0, 0);
	fvh_stop(F);
}

/*
 * A failover move's RTR is attempted once: with the move target's next RTR
 * timing out, the sender's port goes down; the move fails at its first
 * RTR (no retry line, one timeout in the fake's log), as before this
 * feature: the move thread serves every comm and never sleeps for one.
 */
static void test_move_rtr_once(void **state)
{
	struct fvh *F;
	int mark, calls;

	(void)state;
	setenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC", "20", 1);
	F = fvh_start(roce_two);
	fvh_connect(F, 1, 0, -1);
	fvh_one_message(F, 3);
	mark = fvh_log_mark();
	calls = fvh_calls_mark(F);
	assert_int_equal(F->modify_fail("mlx5_1", IBV_QPS_RTR, ETIMEDOUT, 1), 0);
	assert_int_equal(F->port_state("mlx5_0", 1, IBV_PORT_DOWN), 1);
	if (!fvh_wait_log_from(mark, NCCL_LOG_WARN, "ibv_modify_qp(RTR) on mlx5_1:1",
			       "Connection timed out", 10000)) {
		fvh_log_dump();
		fail_msg("no move's RTR failed on mlx5_1 within 10 s%s",
			 fvh_log_count_from(mark, NCCL_LOG_INFO, "ibv_modify_qp", "retrying in")
				 ? ": it was retried, on the move thread" : "");
	}
	usleep(300000);	/* a retry would come 20 ms later */
	assert_int_equal(injected(F, calls, "mlx5_1"), 1);
	assert_int_equal(fvh_log_count_from(mark, NCCL_LOG_INFO, "ibv_modify_qp", "retrying in"), 0);
	assert_int_equal(fvh_log_count_from(mark, NCCL_LOG_WARN, "ibv_modify_qp(RTR)", " attempt"),
			 0);
	assert_int_equal(fvh_log_count_from(mark, NCCL_LOG_WARN, "the move to another path", NULL),
			 1);
	fvh_stop(F);
}

static int env_teardown(void **state)
{
	unsetenv("NCCL_IB_MQP_RETRY_ALL");
	unsetenv("NCCL_IB_MQP_RETRY_CNT");
	unsetenv("NCCL_IB_MQP_RETRY_SLEEP_MSEC");
	unsetenv("NCCL_RAIL_CONNECT_TIMEOUT");
	return fvh_teardown(state);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_rtr_timeout_clears, env_teardown),
		cmocka_unit_test_teardown(test_retries_exhausted, env_teardown),
		cmocka_unit_test_teardown(test_einval_once, env_teardown),
		cmocka_unit_test_teardown(test_einval_retry_all, env_teardown),
		cmocka_unit_test_teardown(test_deadline_cuts_retries, env_teardown),
		cmocka_unit_test_teardown(test_close_listen_cancels, env_teardown),
		cmocka_unit_test_teardown(test_move_rtr_once, env_teardown),
	};

	if (!fvh_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_mqp: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fvh_lib);
			return 1;
		}
		printf("test_ib_mqp: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fvh_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
