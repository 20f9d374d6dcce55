/*
 * nccl-net-rail unit tests: subnet-aware routing at connect and accept
 * (NCCL_IB_SUBNET_AWARE_ROUTING, NCCL_IB_SUBNET_PREFIX_LEN; src/ib/ib_subnet.c)
 * on the fake provider. Two "nodes" in one process, each with a port on
 * each of two RoCE subnets: node S mlx5_0 (10.1.0.1) and mlx5_1 (10.2.0.1)
 * on one card, node R mlx5_2 (10.1.0.2) and mlx5_3 (10.2.0.2) on another.
 * The fake joins any two QPs: what is asserted is which device each side's
 * QPs are made on (the fake's ibv_create_qp lines), the RTR's GIDs, the one
 * INFO line, and that a message goes through.
 */
#include "unit.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "fv_harness.h"

static const char two_subnets[] = "device mlx5_0 pci=0000:1a:00.0\n"
				  "port 1 link=eth speed=ndr width=4x\n"
				  "gid 0 fe80::1 type=v1\n"
				  "gid 1 ::ffff:10.1.0.1 type=v2\n"
				  "device mlx5_1 pci=0000:1a:00.1\n"
				  "port 1 link=eth speed=ndr width=4x\n"
				  "gid 0 fe80::2 type=v1\n"
				  "gid 1 ::ffff:10.2.0.1 type=v2\n"
				  "device mlx5_2 pci=0000:3b:00.0\n"
				  "port 1 link=eth speed=ndr width=4x\n"
				  "gid 0 fe80::3 type=v1\n"
				  "gid 1 ::ffff:10.1.0.2 type=v2\n"
				  "device mlx5_3 pci=0000:3b:00.1\n"
				  "port 1 link=eth speed=ndr width=4x\n"
				  "gid 0 fe80::4 type=v1\n"
				  "gid 1 ::ffff:10.2.0.2 type=v2\n";

/* The same, the subnets 10.1.0.0/24 and 10.1.1.0/24: one subnet under a /16. */
static const char near_subnets[] = "device mlx5_0 pci=0000:1a:00.0\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 0 ::ffff:10.1.0.1 type=v2\n"
				   "device mlx5_1 pci=0000:1a:00.1\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 0 ::ffff:10.1.1.1 type=v2\n"
				   "device mlx5_2 pci=0000:3b:00.0\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 0 ::ffff:10.1.0.2 type=v2\n"
				   "device mlx5_3 pci=0000:3b:00.1\n"
				   "port 1 link=eth speed=ndr width=4x\n"
				   "gid 0 ::ffff:10.1.1.2 type=v2\n";

#define ROUTING "NCCL_IB_SUBNET_AWARE_ROUTING"
#define LOG_TAG "NCCL_IB_SUBNET_AWARE_ROUTING"

/* QPs the fake made on dev since mark. */
static int qps_on(const struct fvh *F, int mark, const char *dev)
{
	char d[64];

	snprintf(d, sizeof(d), "dev=%s ", dev);
	return fvh_calls(F, mark, "ibv_create_qp", d, NULL, NULL);
}

/* The payload bytes of the listener's handle. */
static int handle_payload(const struct fvh *F)
{
	struct rail_handle h;
	char why[128];

	assert_int_equal(rail_handle_decode(F->handle, RAIL_HANDLE_SIZE, &h, why, sizeof(why)), 0);
	return h.payload_len;
}

/* The listener's handle rewritten with gid (text) as its only GID, or none (NULL). */
static void handle_set_gid(struct fvh *F, const char *gid)
{
	struct rail_handle h;
	char why[128];

	assert_int_equal(rail_handle_decode(F->handle, RAIL_HANDLE_SIZE, &h, why, sizeof(why)), 0);
	h.payload_len = 0;
	if (gid) {
		assert_int_equal(inet_pton(AF_INET6, gid, h.payload), 1);
		h.payload_len = 16;
	}
	assert_int_equal(rail_handle_encode(&h, F->handle, RAIL_HANDLE_SIZE), 0);
}

static void listen_on(struct fvh *F, int dev)
{
	assert_int_equal(rail_net_listen(F->ctx, dev, F->handle, &F->lc), ncclSuccess);
}


/* QPs on exactly the devices on (and none on off) since mark; dumps the logs when not. */
static void assert_qps(const struct fvh *F, int mark, const char *const *on, const char *const *off)
{
	for (int i = 0; on[i]; i++)
		if (!qps_on(F, mark, on[i])) {
			fvh_log_dump();
			fail_msg("no QP on %s", on[i]);
		}
	for (int i = 0; off[i]; i++)
		if (qps_on(F, mark, off[i])) {
			fvh_log_dump();
			fail_msg("%d QPs on %s", qps_on(F, mark, off[i]), off[i]);
		}
}

static void assert_no_warn(void)
{
	if (fvh_log_count(NCCL_LOG_WARN, NULL, NULL)) {
		fvh_log_dump();
		fail_msg("a WARN was logged");
	}
}

/*
 * Connect: the listener (mlx5_3) is on 10.2.0.0/24, NCCL's device for the
 * connector (mlx5_0) on 10.1.0.0/24: the connector uses mlx5_1, its port on
 * 10.2.0.0/24 (nearest to mlx5_0 on PCIe of the two there), and says so;
 * the acceptor stays where it listens.
 */
static void test_connect_uses_listener_subnet(void **state)
{
	static const char *const on[] = { "mlx5_1", "mlx5_3", NULL };
	static const char *const off[] = { "mlx5_0", "mlx5_2", NULL };
	char last[FVH_LINE];
	struct fvh *F;
	int mark;

	(void)state;
	setenv(ROUTING, "1", 1);
	F = fvh_start(two_subnets);
	mark = fvh_calls_mark(F);
	listen_on(F, 3);
	assert_int_equal(handle_payload(F), 16);	/* mlx5_3's GID */
	fvh_connect(F, 3, 0, -1);
	assert_qps(F, mark, on, off);
	assert_true(fvh_calls(F, mark, "ibv_modify_qp", "dev=mlx5_1 ", "state=RTR", last));
	assert_non_null(strstr(last, "ah.dgid=::ffff:10.2.0.2"));
	if (fvh_log_count(NCCL_LOG_INFO, "connect to peer", "device 0 (mlx5_0, on 10.1.0.0/24) is "
			  "not on the peer's subnet (10.2.0.0/24); using device 1 (mlx5_1, on "
			  "10.2.0.0/24)") != 1 ||
	    fvh_log_count(NCCL_LOG_INFO, "accept from", LOG_TAG)) {
		fvh_log_dump();
		fail_msg("not one INFO line naming the devices and subnets, on the connector only");
	}
	assert_no_warn();
	fvh_one_message(F, 5);
	fvh_stop(F);
}

/* Off (NCCL's default): the handle carries no GID and nothing moves. */
static void test_default_off_unchanged(void **state)
{
	static const char *const on[] = { "mlx5_0", "mlx5_3", NULL };
	static const char *const off[] = { "mlx5_1", "mlx5_2", NULL };
	struct fvh *F;
	int mark;

	(void)state;
	F = fvh_start(two_subnets);
	mark = fvh_calls_mark(F);
	listen_on(F, 3);
	assert_int_equal(handle_payload(F), 0);
	fvh_connect(F, 3, 0, -1);
	assert_qps(F, mark, on, off);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, LOG_TAG, NULL), 0);
	fvh_one_message(F, 5);
	fvh_stop(F);
}

/*
 * Accept: a handle without GIDs (a listener of an earlier release) leaves
 * the connector on mlx5_1 (10.2.0.0/24); the acceptor, listening on mlx5_2
 * (10.1.0.0/24), sees the connector's GID in its hello and uses mlx5_3.
 */
static void test_accept_uses_connector_subnet(void **state)
{
	static const char *const on[] = { "mlx5_1", "mlx5_3", NULL };
	static const char *const off[] = { "mlx5_0", "mlx5_2", NULL };
	struct fvh *F;
	int mark;

	(void)state;
	setenv(ROUTING, "1", 1);
	F = fvh_start(two_subnets);
	mark = fvh_calls_mark(F);
	listen_on(F, 2);
	handle_set_gid(F, NULL);
	fvh_connect(F, 2, 1, -1);
	assert_qps(F, mark, on, off);
	if (fvh_log_count(NCCL_LOG_INFO, "accept from peer", "device 2 (mlx5_2, on 10.1.0.0/24) is "
			  "not on the peer's subnet (10.2.0.0/24); using device 3 (mlx5_3, on "
			  "10.2.0.0/24)") != 1 ||
	    fvh_log_count(NCCL_LOG_INFO, "connect to", LOG_TAG)) {
		fvh_log_dump();
		fail_msg("not one INFO line naming both devices and subnets, on the acceptor only");
	}
	assert_no_warn();
	fvh_one_message(F, 5);
	fvh_stop(F);
}

/* NCCL_IB_SUBNET_PREFIX_LEN=16: 10.1.0.1 and 10.1.1.2 are one subnet, nothing moves. */
static void test_prefix_len_16(void **state)
{
	static const char *const on[] = { "mlx5_0", "mlx5_3", NULL };
	static const char *const off[] = { "mlx5_1", "mlx5_2", NULL };
	struct fvh *F;
	int mark;

	(void)state;
	setenv(ROUTING, "1", 1);
	setenv("NCCL_IB_SUBNET_PREFIX_LEN", "16", 1);
	F = fvh_start(near_subnets);
	mark = fvh_calls_mark(F);
	listen_on(F, 3);
	fvh_connect(F, 3, 0, -1);
	assert_qps(F, mark, on, off);
	assert_int_equal(fvh_log_count(NCCL_LOG_INFO, LOG_TAG, NULL), 0);
	assert_no_warn();
	fvh_stop(F);
}

/* The default /24 makes them two: the connector uses mlx5_1 (10.1.1.0/24). */
static void test_prefix_len_24(void **state)
{
	static const char *const on[] = { "mlx5_1", "mlx5_3", NULL };
	static const char *const off[] = { "mlx5_0", "mlx5_2", NULL };
	struct fvh *F;
	int mark;

	(void)state;
	setenv(ROUTING, "1", 1);
	F = fvh_start(near_subnets);
	mark = fvh_calls_mark(F);
	listen_on(F, 3);
	fvh_connect(F, 3, 0, -1);
	assert_qps(F, mark, on, off);
	if (fvh_log_count(NCCL_LOG_INFO, "connect to peer", "(mlx5_0, on 10.1.0.0/24) is not on "
			  "the peer's subnet (10.1.1.0/24); using device 1 (mlx5_1, on "
			  "10.1.1.0/24)") != 1) {
		fvh_log_dump();
		fail_msg("no INFO line for the /24 choice");
	}
	fvh_stop(F);
}

/*
 * No local device on the listener's subnet (its handle names 10.9.0.1):
 * the connector keeps NCCL's device (one INFO line, no WARN); the
 * acceptor then finds its own port on the connector's subnet (mlx5_2).
 */
static void test_no_match_keeps_default(void **state)
{
	static const char *const on[] = { "mlx5_0", "mlx5_2", NULL };
	static const char *const off[] = { "mlx5_1", "mlx5_3", NULL };
	struct fvh *F;
	int mark;

	(void)state;
	setenv(ROUTING, "1", 1);
	F = fvh_start(two_subnets);
	mark = fvh_calls_mark(F);
	listen_on(F, 3);
	handle_set_gid(F, "::ffff:10.9.0.1");
	fvh_connect(F, 3, 0, -1);
	assert_qps(F, mark, on, off);
	if (fvh_log_count(NCCL_LOG_INFO, "connect to peer", "no usable local device is on the "
			  "peer's subnet (10.9.0.0/24); device 0 (mlx5_0, on 10.1.0.0/24) is used "
			  "as NCCL chose") != 1 ||
	    fvh_log_count(NCCL_LOG_INFO, "accept from peer", "using device 2 (mlx5_2") != 1) {
		fvh_log_dump();
		fail_msg("no INFO lines of a connector without a match and of its acceptor");
	}
	assert_no_warn();
	fvh_one_message(F, 5);
	fvh_stop(F);
}

/*
 * A fused NIC of NCCL's (mlx5_0+mlx5_1) with a port off the peer's subnet
 * is replaced as a whole: by a fused one all on it (mlx5_1+mlx5_3) before
 * a single port (mlx5_1, nearer on PCIe).
 */
static void test_fused_replaced_whole(void **state)
{
	static const char *const on[] = { "mlx5_1", "mlx5_3", NULL };
	static const char *const off[] = { "mlx5_0", "mlx5_2", NULL };
	int sdevs[2] = { 0, 1 }, odevs[2] = { 1, 3 }, sv = -1, ov = -1;
	struct fvh *F;
	char want[160];
	int mark;

	(void)state;
	setenv(ROUTING, "1", 1);
	F = fvh_start(two_subnets);
	assert_int_equal(rail_net_make_vdevice(&sv, 2, sdevs, 8), ncclSuccess);
	assert_int_equal(rail_net_make_vdevice(&ov, 2, odevs, 8), ncclSuccess);
	mark = fvh_calls_mark(F);
	listen_on(F, 3);
	fvh_connect(F, 3, sv, -1);
	assert_qps(F, mark, on, off);
	snprintf(want, sizeof(want), "device %d (mlx5_0+mlx5_1, on 10.1.0.0/24,10.2.0.0/24) is not "
		 "on the peer's subnet (10.2.0.0/24); using device %d (mlx5_1+mlx5_3, on "
		 "10.2.0.0/24)", sv, ov);
	if (fvh_log_count(NCCL_LOG_INFO, "connect to peer", want) != 1) {
		fvh_log_dump();
		fail_msg("no INFO line: %s", want);
	}
	fvh_one_message(F, 5);
	fvh_stop(F);
}

static int env_teardown(void **state)
{
	unsetenv(ROUTING);
	unsetenv("NCCL_IB_SUBNET_PREFIX_LEN");
	return fvh_teardown(state);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_connect_uses_listener_subnet, env_teardown),
		cmocka_unit_test_teardown(test_default_off_unchanged, env_teardown),
		cmocka_unit_test_teardown(test_accept_uses_connector_subnet, env_teardown),
		cmocka_unit_test_teardown(test_prefix_len_16, env_teardown),
		cmocka_unit_test_teardown(test_prefix_len_24, env_teardown),
		cmocka_unit_test_teardown(test_no_match_keeps_default, env_teardown),
		cmocka_unit_test_teardown(test_fused_replaced_whole, env_teardown),
	};

	if (!fvh_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_subnet: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fvh_lib);
			return 1;
		}
		printf("test_ib_subnet: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fvh_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
