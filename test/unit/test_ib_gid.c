/* nccl-net-rail unit tests: RoCE GID selection (src/ib/ib_gid.c) on test/fixtures/gid-roce. */
#include "unit.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "ib/ib_gid.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"

#define FIXTURE "test/fixtures/gid-roce"

static const char *const gid_vars[] = {
	"NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE",
	"NCCL_IB_ROCE_VERSION_NUM",
};

static int setup(void **state)
{
	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(gid_vars); i++)
		unsetenv(gid_vars[i]);
	rail_params_reload();
	rail_sysfs_set_root(FIXTURE);
	unit_log_capture();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unit_log_release();
	rail_sysfs_set_root("");
	return 0;
}

static int pick(int port, const char *var, const char *value, struct rail_ib_gid_choice *c)
{
	if (var)
		setenv(var, value, 1);
	rail_params_reload();
	memset(c, 0xa5, sizeof(*c));
	return rail_ib_gid_select("roce0", port, 0, c);
}

static void test_default_first_ipv4_v2(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(1, NULL, NULL, &c), 0);
	assert_int_equal(c.index, 5);
	assert_int_equal(c.roce_version, 2);
	assert_non_null(strstr(c.reason, "first valid IPv4 RoCE v2 GID"));
	/* The entry with an unreadable type file is skipped, and said so. */
	unit_assert_logged2(RAIL_LOG_INFO, "GID 3", "cannot be read");
}

static void test_roce_v1_wanted(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(1, "NCCL_IB_ROCE_VERSION_NUM", "1", &c), 0);
	assert_int_equal(c.index, 2);
	assert_int_equal(c.roce_version, 1);
}

static void test_family_ipv6(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(1, "NCCL_IB_ADDR_FAMILY", "AF_INET6", &c), 0);
	assert_int_equal(c.index, 4);	/* never the link-local 0 or 1 */
}

static void test_range(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(1, "NCCL_IB_ADDR_RANGE", "10.1.0.0/16", &c), 0);
	assert_int_equal(c.index, 6);
	assert_non_null(strstr(c.reason, "NCCL_IB_ADDR_RANGE"));
	/* 10.0.0.1 exists as v1 (idx 2) and as v2 with an unreadable type (idx 3). */
	assert_int_equal(pick(1, "NCCL_IB_ADDR_RANGE", "10.0.0.0/16", &c), 0);
	assert_int_equal(c.index, 2);
	assert_non_null(strstr(c.reason, "none is RoCE v2"));
}

static void test_bad_range_warned(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(1, "NCCL_IB_ADDR_RANGE", "10.0.0.0", &c), 0);
	assert_int_equal(c.index, 5);
	unit_assert_logged(RAIL_LOG_WARN, "NCCL_IB_ADDR_RANGE");
}

static void test_forced_index(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(1, "NCCL_IB_GID_INDEX", "6", &c), 0);
	assert_int_equal(c.index, 6);
	assert_non_null(strstr(c.reason, "NCCL_IB_GID_INDEX=6"));
}

static void test_ipv6_only_port(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(2, NULL, NULL, &c), 0);
	assert_int_equal(c.index, 3);	/* idx 1 has a bogus type, idx 2 is v1 */
	assert_non_null(strstr(c.reason, "no valid IPv4 GID"));
	unit_assert_logged2(RAIL_LOG_INFO, "GID 1", "skipped");
}

static void test_link_local_only_port(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(3, NULL, NULL, &c), -ENOENT);
	assert_int_equal(c.index, -1);
	assert_non_null(strstr(c.reason, "no usable GID"));
}

static void test_missing_table(void **state)
{
	struct rail_ib_gid_choice c;

	(void)state;
	assert_int_equal(pick(9, NULL, NULL, &c), -ENOENT);
	assert_non_null(strstr(c.reason, "cannot read the GID table"));
}

/* The fixture engineer's RoCE H100 server: index 3 everywhere, entry 6 unreadable. */
static void test_roce_h100_fixture(void **state)
{
	static const char *const nics[] = { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3",
					    "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9" };
	struct rail_ib_gid_choice c;

	(void)state;
	rail_sysfs_set_root("test/fixtures/roce-h100");
	if (!rail_sysfs_exists("/sys/class/infiniband/mlx5_0/ports/1/gids"))
		skip();
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(nics); i++) {
		assert_int_equal(rail_ib_gid_select(nics[i], 1, 0, &c), 0);
		if (c.index != 3)
			fail_msg("%s: GID %d (%s), expected 3", nics[i], c.index, c.reason);
	}
	unit_assert_logged2(RAIL_LOG_INFO, "mlx5_0:1 GID 6", "cannot be read");
	setenv("NCCL_IB_ADDR_FAMILY", "AF_INET6", 1);
	rail_params_reload();
	assert_int_equal(rail_ib_gid_select("mlx5_0", 1, 0, &c), 0);
	assert_int_equal(c.index, 5);
	setenv("NCCL_IB_ROCE_VERSION_NUM", "1", 1);
	rail_params_reload();
	assert_int_equal(rail_ib_gid_select("mlx5_0", 1, 0, &c), 0);
	assert_int_equal(c.index, 4);
}

static void test_choose_pure(void **state)
{
	struct rail_ib_gid_entry tab[3];
	struct rail_ib_gid_params p = { .forced_index = -1, .family = AF_INET, .version = 2 };
	struct rail_ib_gid_choice c;

	(void)state;
	memset(tab, 0, sizeof(tab));
	for (int i = 0; i < 3; i++) {
		tab[i].index = i;
		tab[i].valid = 1;
		tab[i].family = AF_INET;
		tab[i].roce_version = 2;
	}
	tab[0].valid = 0;	/* zero or link-local: never chosen */
	tab[1].type_err = -EINVAL;
	rail_ib_gid_choose(tab, 3, &p, &c);
	assert_int_equal(c.index, 2);
	rail_ib_gid_choose(tab, 2, &p, &c);
	assert_int_equal(c.index, -1);
}

static void test_range_parse(void **state)
{
	struct rail_ib_gid_params p;

	(void)state;
	memset(&p, 0, sizeof(p));
	assert_int_equal(rail_ib_gid_parse_range("fd00::/8", &p), 0);
	assert_int_equal(p.range_family, AF_INET6);
	assert_int_equal(p.range_bits, 8);
	assert_int_equal(rail_ib_gid_parse_range("10.0.0.0/33", &p), -EINVAL);
	assert_int_equal(rail_ib_gid_parse_range("nonsense/8", &p), -EINVAL);
	assert_int_equal(rail_ib_gid_parse_range("10.0.0.0/", &p), -EINVAL);
}

static void gid_of(const char *text, uint8_t raw[16])
{
	assert_int_equal(inet_pton(AF_INET6, text, raw), 1);
}

static int have_loopback_v4(void)
{
	struct ifaddrs *list, *i;
	int found = 0;

	if (getifaddrs(&list))
		return 0;
	for (i = list; i && !found; i = i->ifa_next)
		found = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
			((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
	freeifaddrs(list);
	return found;
}

/* The network of a GID (a move's choice of device on rails, ib_move.c follow_peer). */
static void test_gid_net(void **state)
{
	struct rail_ib_gid_net n;
	uint8_t a[16], b[16];
	char t[80];

	(void)state;
	/* no interface here holds 10.201.7.9: /24 assumed, and said so */
	gid_of("::ffff:10.201.7.9", a);
	rail_ib_gid_net(a, 0, &n);
	assert_int_equal(n.assumed, 1);
	assert_int_equal(n.bits, 120);
	assert_string_equal(rail_ib_gid_net_str(&n, t, sizeof(t)), "10.201.7.0/24 (prefix assumed)");
	gid_of("::ffff:10.201.7.200", b);
	assert_true(rail_ib_gid_in_net(&n, b));
	gid_of("::ffff:10.201.8.9", b);
	assert_false(rail_ib_gid_in_net(&n, b));
	gid_of("fd00::10:201:7:9", b);	/* another family */
	assert_false(rail_ib_gid_in_net(&n, b));
	/* InfiniBand: the 64-bit subnet prefix */
	gid_of("fe80::1:0:0:2", a);
	rail_ib_gid_net(a, 1, &n);
	assert_int_equal(n.bits, 64);
	assert_int_equal(n.assumed, 0);
	gid_of("fe80::9:9:9:9", b);
	assert_true(rail_ib_gid_in_net(&n, b));
	gid_of("fe80:0:0:1::2", b);
	assert_false(rail_ib_gid_in_net(&n, b));
	assert_string_equal(rail_ib_gid_net_str(&n, t, sizeof(t)), "fe80::/64");
	/* an interface's own prefix: the loopback's 127.0.0.1/8 */
	if (!have_loopback_v4()) {
		printf("test_gid_net: the interface prefix part skipped: no 127.0.0.1 here\n");
		return;
	}
	gid_of("::ffff:127.0.0.1", a);
	rail_ib_gid_net(a, 0, &n);
	assert_int_equal(n.assumed, 0);
	assert_int_equal(n.bits, 96 + 8);
	gid_of("::ffff:127.9.9.9", b);
	assert_true(rail_ib_gid_in_net(&n, b));
	assert_string_equal(rail_ib_gid_net_str(&n, t, sizeof(t)), "127.0.0.0/8");
}

/*
 * The subnet of NCCL_IB_SUBNET_AWARE_ROUTING (ib_subnet.c): IPv4-mapped
 * GIDs under the prefix length given, whatever the interfaces say (the
 * loopback's /8 is not used); IPv6 ones by their first 64 bits. And
 * NCCL's validGid.
 */
static void test_gid_routing_net(void **state)
{
	struct rail_ib_gid_net n;
	uint8_t a[16], b[16];
	char t[80];

	(void)state;
	gid_of("::ffff:127.0.0.1", a);
	rail_ib_gid_routing_net(a, 24, &n);
	assert_int_equal(n.assumed, 0);
	assert_string_equal(rail_ib_gid_net_str(&n, t, sizeof(t)), "127.0.0.0/24");
	gid_of("::ffff:127.0.1.1", b);
	assert_false(rail_ib_gid_in_net(&n, b));
	rail_ib_gid_routing_net(a, 16, &n);
	assert_true(rail_ib_gid_in_net(&n, b));
	rail_ib_gid_routing_net(a, 32, &n);
	assert_string_equal(rail_ib_gid_net_str(&n, t, sizeof(t)), "127.0.0.1/32");
	gid_of("::ffff:127.0.0.2", b);
	assert_false(rail_ib_gid_in_net(&n, b));
	rail_ib_gid_routing_net(a, 1, &n);
	gid_of("::ffff:100.0.0.1", b);
	assert_true(rail_ib_gid_in_net(&n, b));
	gid_of("::ffff:128.0.0.1", b);
	assert_false(rail_ib_gid_in_net(&n, b));
	/* IPv6: 64 bits, the prefix length has no part */
	gid_of("fd00:1:2:3::1", a);
	rail_ib_gid_routing_net(a, 8, &n);
	assert_string_equal(rail_ib_gid_net_str(&n, t, sizeof(t)), "fd00:1:2:3::/64");
	gid_of("fd00:1:2:3:ffff::9", b);
	assert_true(rail_ib_gid_in_net(&n, b));
	gid_of("fd00:1:2:4::1", b);
	assert_false(rail_ib_gid_in_net(&n, b));
	/* valid: neither all-zero nor link-local */
	gid_of("::", a);
	assert_false(rail_ib_gid_valid(a));
	gid_of("fe80::1", a);
	assert_false(rail_ib_gid_valid(a));
	gid_of("fe80:0:0:1::1", a);
	assert_true(rail_ib_gid_valid(a));
	gid_of("::ffff:10.0.0.1", a);
	assert_true(rail_ib_gid_valid(a) && rail_ib_gid_is_v4(a));
	gid_of("fd00::1", a);
	assert_true(rail_ib_gid_valid(a) && !rail_ib_gid_is_v4(a));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_default_first_ipv4_v2, setup, teardown),
		cmocka_unit_test_setup_teardown(test_roce_v1_wanted, setup, teardown),
		cmocka_unit_test_setup_teardown(test_family_ipv6, setup, teardown),
		cmocka_unit_test_setup_teardown(test_range, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_range_warned, setup, teardown),
		cmocka_unit_test_setup_teardown(test_forced_index, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ipv6_only_port, setup, teardown),
		cmocka_unit_test_setup_teardown(test_link_local_only_port, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_table, setup, teardown),
		cmocka_unit_test_setup_teardown(test_roce_h100_fixture, setup, teardown),
		cmocka_unit_test_setup_teardown(test_choose_pure, setup, teardown),
		cmocka_unit_test_setup_teardown(test_range_parse, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gid_net, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gid_routing_net, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
