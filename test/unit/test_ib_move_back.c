/*
 * nccl-net-rail unit tests: verbs failover's move back by probe and the
 * fallback by topology (src/ib/ib_probe.c, src/ib/ib_move_rules.c,
 * docs/FAILOVER.md) on the fake provider, with move_loop.h's transfer
 * loop (every byte checked throughout).
 */
#include "unit.h"

#include <sched.h>

#include <infiniband/verbs.h>

#include "fv_harness.h"
#include "handles.h"
#include "ib/ib.h"
#include "move_loop.h"

/*
 * test_move_stall_twice's fault, with NCCL_RAIL_FAILOVER_HOLDDOWN=1: both
 * sides end off their devices (mlx5_0 holds its sends, its port up).
 * Returns when, with the log mark from before.
 */
static uint64_t stall_off_both(struct loop *L, int *mark)
{
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "1", 1);
	L->F = fvh_start(one_net);
	fvh_connect(L->F, 2, 0, -1);	/* receiver on mlx5_2, sender on mlx5_0 */
	*mark = fvh_log_mark();
	if (!run_until(L, *mark, NCCL_LOG_WARN, "(receive comm) moved from mlx5_2:1 to mlx5_3:1",
		       "off the device", 20000)) {
		fvh_log_dump();
		fail_msg("the receive comm did not leave mlx5_2 after the second stall");
	}
	assert_moved(*mark, "(send comm) moved from mlx5_0:1 to mlx5_1:1",
		     "again within 60 s with the port up: off the device");
	return rail_now_ns();
}

/*
 * The move back by probe: the path behind mlx5_0 failed twice with its
 * port up, both sides left their devices (test_move_stall_twice), then the
 * fault is repaired with no port event (the hold ends). A hold-down later
 * the sender's probe (an RDMA READ from mlx5_0 of a buffer on mlx5_2)
 * passes and both sides move back home, each with a line; every message
 * arrives intact throughout, and after. Fails without the probe: nothing
 * ever moves back (no PORT_ACTIVE comes).
 */
static void test_move_back_probe(void **state)
{
	struct loop L = { .fault_at = -1, .hold_at = 20, .fault_dev = "mlx5_0" };
	uint64_t off_ns;
	int mark, fixed;

	(void)state;
	off_ns = stall_off_both(&L, &mark);
	assert_true(L.F->hold("mlx5_0", 0) >= 0);	/* repaired: no event says so */
	L.held = 2;
	fixed = fvh_log_mark();
	if (!run_until(&L, fixed, NCCL_LOG_INFO, "(receive comm) moved back from mlx5_3:1 to "
		       "mlx5_2:1", NULL, 10000) ||
	    !fvh_log_count_from(fixed, NCCL_LOG_INFO, "(send comm) moved back from mlx5_1:1 to "
				"mlx5_0:1", "the probe of the way home to mlx5_0:1 passed")) {
		fvh_log_dump();
		fail_msg("no move back on both sides after the path was repaired");
	}
	if (rail_now_ns() - off_ns < 1000000000ull) {
		fvh_log_dump();
		fail_msg("moved back before the hold-down (1 s) ended");
	}
	assert_true(fvh_log_count_from(fixed, NCCL_LOG_INFO, "(send comm): the probe of the way "
				       "home (an RDMA READ from mlx5_0:1", "passed in") == 1);
	assert_true(fvh_log_count_from(fixed, NCCL_LOG_INFO, "(receive comm): the peer's probe of "
				       "the way home", "of mlx5_2:1") == 1);
	assert_int_equal(fvh_log_count_from(mark, NCCL_LOG_WARN, "protocol error", NULL), 0);
	/* the peer's fence for the move back is no second path failure: nobody leaves home */
	assert_int_equal(fvh_log_count_from(fixed, NCCL_LOG_INFO, "moved back", "port up: off the "
					    "device"), 0);
	assert_int_equal(run_to(&L, L.sent + 200), 0);	/* home, intact */
	loop_end(&L);
}

/*
 * The fault stays (mlx5_0 holds its sends for good): every probe's READ is
 * held and fails at its bound, so nothing moves back and traffic goes on
 * on mlx5_1/mlx5_3. The probes go on, less often (a hold-down after the move, then
 * 2 s after a failure, 4 s ...), with one INFO line for the streak, not one per probe.
 */
static void test_move_back_probe_fails(void **state)
{
	struct loop L = { .fault_at = -1, .hold_at = 20, .fault_dev = "mlx5_0" };
	char last[FVH_LINE];
	int mark, reads;

	(void)state;
	(void)stall_off_both(&L, &mark);
	(void)run_until(&L, mark, NCCL_LOG_INFO, "nothing", "never", 6000);
	reads = fvh_calls(L.F, 0, "ibv_post_send", "dev=mlx5_0", "opcode=RDMA_READ", last);
	if (reads != 2 ||
	    fvh_log_count_from(mark, NCCL_LOG_INFO, "the probe of the way home", "failed") != 1 ||
	    fvh_log_count_from(mark, NCCL_LOG_INFO, "moved back", NULL)) {
		fvh_log_dump();
		fail_msg("%d probes in 6 s (2 expected: at 1 and 4 s), %d failure lines (1), %d move backs "
			 "(none)", reads, fvh_log_count_from(mark, NCCL_LOG_INFO,
							     "the probe of the way home", "failed"),
			 fvh_log_count_from(mark, NCCL_LOG_INFO, "moved back", NULL));
	}
	assert_moved(0, "(send comm) moved from mlx5_0:1 to mlx5_1:1", "off the device");
	if (!fvh_log_count_from(mark, NCCL_LOG_INFO, "from mlx5_0:1 qp 0x", "no completion within "
				"1000 ms; it stays where it is and probes again in 2 s")) {
		fvh_log_dump();
		fail_msg("no INFO naming the failed probe");
	}
	loop_end(&L);
}

/*
 * Close with a probe in flight (its READ held on mlx5_0): each side's probe
 * QP is destroyed at close (the fake's log), and the close does not wait
 * for the probe's bound (1 s). Fails without the probe's teardown at close.
 */
static void test_move_back_probe_close(void **state)
{
	struct loop L = { .fault_at = -1, .hold_at = 20, .fault_dev = "mlx5_0" };
	char line[FVH_LINE], sqpn[16], rqpn[16], pat[48];
	uint64_t end, t0;
	int mark, calls;

	(void)state;
	(void)stall_off_both(&L, &mark);
	calls = fvh_calls_mark(L.F);
	end = rail_now_ns() + 5000000000ull;
	while (!fvh_calls(L.F, calls, "ibv_post_send", "dev=mlx5_0", "opcode=RDMA_READ", line) &&
	       rail_now_ns() < end)
		assert_int_equal(run_to(&L, L.sent + 5), 0);
	if (!fvh_calls(L.F, calls, "ibv_post_send", "dev=mlx5_0", "opcode=RDMA_READ", line))
		fail_msg("no probe's RDMA READ on mlx5_0 within 5 s of the move");
	fvh_kv(line, "qpn", sqpn, sizeof(sqpn));
	snprintf(pat, sizeof(pat), "qpn=%s state=RTR", sqpn);
	assert_int_equal(fvh_calls(L.F, calls, "ibv_modify_qp", pat, NULL, line), 1);
	fvh_kv(line, "dest_qpn", rqpn, sizeof(rqpn));
	assert_int_equal(rail_net_dereg_mr(L.F->sc, L.smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(L.F->rc, L.rmh), ncclSuccess);
	t0 = rail_now_ns();
	fvh_close_comms(L.F);
	assert_true(rail_now_ns() - t0 < 500000000ull);
	snprintf(pat, sizeof(pat), "qpn=%s\n", sqpn);
	assert_int_equal(fvh_calls(L.F, calls, "ibv_destroy_qp", "dev=mlx5_0", pat, NULL), 1);
	snprintf(pat, sizeof(pat), "qpn=%s\n", rqpn);
	assert_int_equal(fvh_calls(L.F, calls, "ibv_destroy_qp", "dev=mlx5_2", pat, NULL), 1);
	fvh_stop(L.F);
}

/*
 * rail_ib_move_next_ns of a comm handle, read on the owner's side of the
 * guard, as NCCL's calls take a comm: the guard has one mover, the move
 * thread, so a test that took it as a second mover could hold it with the
 * thread (each mover's give clears the other's hold): ThreadSanitizer then
 * saw the close that followed race with the thread's last look.
 */
static uint64_t next_ns(void *comm)
{
	uint32_t kind = 0;
	struct rail_ib_comm *c = rail_h_get(RAIL_HT_COMM, (uintptr_t)comm, &kind);
	uint64_t t;

	assert_non_null(c);
	while (rail_guard_owner_in(&c->base, c->base.guarded)) {
		rail_guard_owner_out(&c->base);	/* the move thread has it: its turn first */
		sched_yield();
	}
	t = rail_ib_move_next_ns(c);
	rail_guard_owner_out(&c->base);
	return t;
}

/*
 * The contract for an event-driven move thread (rail_ib_move_next_ns): 0
 * while nothing is due on time alone; after the move made with the port
 * up, the sender's next probe a hold-down (1 s) later, nothing for the
 * receiver (it answers on the socket's event); while the probe's READ is
 * in flight, a look within 10 ms.
 */
static void test_move_next_ns(void **state)
{
	struct loop L = { .fault_at = -1, .hold_at = 20, .fault_dev = "mlx5_0" };
	char line[FVH_LINE];
	uint64_t now, t, end;
	int mark, calls;

	(void)state;
	setenv("NCCL_RAIL_IB_STALL_TIMEOUT", "1", 1);
	setenv("NCCL_RAIL_FAILOVER_HOLDDOWN", "1", 1);
	L.F = fvh_start(one_net);
	fvh_connect(L.F, 2, 0, -1);
	assert_int_equal(run_to(&L, 10), 0);
	assert_true(next_ns(L.F->sc) == 0 && next_ns(L.F->rc) == 0);
	fvh_stop(L.F);
	memset(&L, 0, sizeof(L));
	L.fault_at = -1;
	L.hold_at = 20;
	L.fault_dev = "mlx5_0";
	(void)stall_off_both(&L, &mark);
	calls = fvh_calls_mark(L.F);
	now = rail_now_ns();
	t = next_ns(L.F->sc);
	if (t < now || t > now + 1000000000ull) {
		fvh_log_dump();
		fail_msg("the sender's next look %lld ms from now, not within the hold-down (1 s)",
			 (long long)((int64_t)(t - now) / 1000000));
	}
	assert_true(next_ns(L.F->rc) == 0);
	end = now + 3000000000ull;
	while (!fvh_calls(L.F, calls, "ibv_post_send", "dev=mlx5_0", "opcode=RDMA_READ", line) &&
	       rail_now_ns() < end)
		assert_int_equal(run_to(&L, L.sent + 5), 0);
	assert_true(fvh_calls(L.F, calls, "ibv_post_send", "dev=mlx5_0", "opcode=RDMA_READ", line));
	t = next_ns(L.F->sc);
	now = rail_now_ns();
	if (t > now + 10000000ull) {
		fvh_log_dump();
		fail_msg("a probe's READ in flight: the next look %lld ms away, not within 10 ms",
			 (long long)((int64_t)(t - now) / 1000000));
	}
	loop_end(&L);
}

static int probe_teardown(void **state)
{
	unsetenv("NCCL_RAIL_IB_STALL_TIMEOUT");
	unsetenv("NCCL_RAIL_FAILOVER_HOLDDOWN");
	return fvh_teardown(state);
}

/*
 * The fallback by the topology (src/topo): a GPU and three RoCE ports
 * under one PCIe switch, the GPU's first choice mlx5_0 (the fastest), the
 * other port of its card mlx5_1, another card mlx5_2; the peer on mlx5_3
 * under another host bridge. mlx5_0 goes down: the prefix of the PCI paths
 * says mlx5_1 (same card), the topology's fallback for the GPU mlx5_2 (as
 * near, and it survives a card failure). The send comm moves to mlx5_2 and
 * says why; fails with the prefix rule alone (it moves to mlx5_1).
 */
static void test_move_topo_fallback(void **state)
{
	static const char conf[] = "gpu 0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0\n"
				   "device mlx5_0 pci=0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.1 type=v2\n"
				   "device mlx5_1 pci=0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.1\n"
				   "port 1 link=eth speed=hdr width=4x\n"
				   "gid 1 ::ffff:10.1.0.2 type=v2\n"
				   "device mlx5_2 pci=0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0\n"
				   "port 1 link=eth speed=hdr width=4x\n"
				   "gid 1 ::ffff:10.1.0.3 type=v2\n"
				   "device mlx5_3 pci=pci0000:80/0000:80:01.0/0000:81:00.0\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 1 ::ffff:10.1.0.4 type=v2\n";
	struct loop L = { .fault_at = 20, .fault_dev = "mlx5_0" };
	int mark;

	(void)state;
	mark = run_case(&L, conf, 3, 0, 60);	/* receiver on mlx5_3, sender on mlx5_0 */
	assert_moved(mark, "(send comm) moved from mlx5_0:1 to mlx5_2:1 (the topology's fallback "
		     "for GPU 0000:03:00.0: PIX, another card)", "PORT_ERR on mlx5_0:1");
	assert_moved(mark, "(receive comm) moved from mlx5_3:1 to mlx5_3:1", "PORT_ERR on mlx5_0:1");
	loop_end(&L);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_move_back_probe, probe_teardown),
		cmocka_unit_test_teardown(test_move_back_probe_fails, probe_teardown),
		cmocka_unit_test_teardown(test_move_back_probe_close, probe_teardown),
		cmocka_unit_test_teardown(test_move_next_ns, probe_teardown),
		cmocka_unit_test_teardown(test_move_topo_fallback, fvh_teardown),
	};

	if (!fvh_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_move_back: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fvh_lib);
			return 1;
		}
		printf("test_ib_move_back: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fvh_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
