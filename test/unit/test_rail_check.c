/*
 * nccl-net-rail unit tests: rail-check's description of a process and its
 * verdict (src/check/): the text form both ways, the settings that must
 * agree (a failure) or should (a note), the version and transport checks,
 * and per device pair GID type, subnet and MTU.
 */
#include "unit.h"

#include "check/check.h"
#include "rail.h"

static void make_info(struct rail_ck_info *in, int rank, const char *host)
{
	memset(in, 0, sizeof(*in));
	in->rank = rank;
	in->want_rank = -1;
	rail_strlcpy(in->host, host, sizeof(in->host));
	rail_strlcpy(in->version, "0.2.0", sizeof(in->version));
	rail_strlcpy(in->transport, "ib", sizeof(in->transport));
	rail_strlcpy(in->why, "NCCL_RAIL_TRANSPORT=ib", sizeof(in->why));
	in->wire_handle = 1, in->wire_tcp = 1, in->wire_ib = 4;
	in->nconf = 2;
	rail_strlcpy(in->conf[0].name, "NCCL_IB_TC", sizeof(in->conf[0].name));
	rail_strlcpy(in->conf[0].value, "0", sizeof(in->conf[0].value));
	rail_strlcpy(in->conf[1].name, "NCCL_IB_QPS_PER_CONNECTION", sizeof(in->conf[1].name));
	rail_strlcpy(in->conf[1].value, "1", sizeof(in->conf[1].value));
	in->ndev = 1;
	rail_strlcpy(in->dev[0].name, rank ? "rxe1:1" : "rxe0:1", sizeof(in->dev[0].name));
	in->dev[0].port = 1;
	rail_strlcpy(in->dev[0].link, "RoCE", sizeof(in->dev[0].link));
	rail_strlcpy(in->dev[0].gid, rank ? "::ffff:192.0.2.2" : "::ffff:192.0.2.1",
		     sizeof(in->dev[0].gid));
	in->dev[0].gid_index = 1;
	rail_strlcpy(in->dev[0].gid_type, "RoCEv2", sizeof(in->dev[0].gid_type));
	rail_strlcpy(in->dev[0].subnet, "192.0.2.0/24", sizeof(in->dev[0].subnet));
	in->dev[0].mtu = 1024;
	in->dev[0].speed = 10000;
}

static void test_info_roundtrip(void **state)
{
	struct rail_ck_info a, b;
	char buf[8192], why[128];
	int n;

	(void)state;
	make_info(&a, 1, "node\tB");	/* a tab in a value must not split the line */
	a.want_rank = 3;
	rail_strlcpy(a.ctrl_host, "10.0.0.2", sizeof(a.ctrl_host));
	a.ctrl_port = 4242;
	n = rail_ck_info_encode(&a, buf, sizeof(buf));
	assert_true(n > 0);
	assert_int_equal(rail_ck_info_decode(buf, (size_t)n, &b, why, sizeof(why)), 0);
	assert_string_equal(b.host, "node B");
	assert_int_equal(b.rank, 1);
	assert_int_equal(b.want_rank, 3);
	assert_string_equal(b.version, "0.2.0");
	assert_string_equal(b.transport, "ib");
	assert_int_equal(b.wire_ib, 4);
	assert_int_equal(b.nconf, 2);
	assert_string_equal(rail_ck_conf_get(&b, "NCCL_IB_TC"), "0");
	assert_null(rail_ck_conf_get(&b, "NCCL_IB_SL"));
	assert_int_equal(b.ndev, 1);
	assert_string_equal(b.dev[0].name, "rxe1:1");
	assert_string_equal(b.dev[0].gid, "::ffff:192.0.2.2");
	assert_string_equal(b.dev[0].gid_type, "RoCEv2");
	assert_string_equal(b.dev[0].subnet, "192.0.2.0/24");
	assert_int_equal(b.dev[0].mtu, 1024);
	assert_string_equal(b.ctrl_host, "10.0.0.2");
	assert_int_equal(b.ctrl_port, 4242);
	/* a peer's control bytes never reach the terminal */
	{
		const char *esc = "rail-check\t1\nhost\tab\x1b[31m\r\n";

		assert_int_equal(rail_ck_info_decode(esc, strlen(esc), &b, why, sizeof(why)), 0);
		assert_string_equal(b.host, "ab?[31m?");
	}
	/* too small a buffer is refused, not truncated */
	assert_int_equal(rail_ck_info_encode(&a, buf, 40), -1);
}

static void test_info_decode_rejects(void **state)
{
	struct rail_ck_info b;
	char why[128];
	const char *bad[] = {
		"", "rail-check\t2\n", "hello\n", "rail-check\t1\nhost\n",
		"rail-check\t1\ndev\ta\tb\n", "rail-check\t1\nbogus\tx\n",
	};

	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(bad); i++) {
		why[0] = '\0';
		assert_int_equal(rail_ck_info_decode(bad[i], strlen(bad[i]), &b, why, sizeof(why)),
				 -1);
		assert_true(why[0] != '\0');
	}
}

/* Two ranks, one tested cell each way, both fine; then the checks. */
static void run_checks(struct rail_ck_info *all, struct rail_ck_report *r, struct rail_ck_cell *c,
		       int routed)
{
	struct rail_ck_opts o = { .routed = routed };

	memset(r, 0, sizeof(*r));
	memset(c, 0, 2 * sizeof(*c));
	c[0] = (struct rail_ck_cell){ .ra = 0, .da = 0, .rb = 1, .db = 0, .tested = 1, .ok = 1,
				      .lat_us = 5, .bw = 1 };
	c[1] = (struct rail_ck_cell){ .ra = 1, .da = 0, .rb = 0, .db = 0, .tested = 1, .ok = 1,
				      .lat_us = 5, .bw = 1 };
	r->nranks = 2;
	r->all = all;
	r->cells = c;
	r->ncells = 2;
	rail_ck_static_checks(r, &o);
}

static const struct rail_ck_problem *find_problem(const struct rail_ck_report *r, const char *what)
{
	for (int i = 0; i < r->nprobs; i++)
		if (!strcmp(r->probs[i].what, what))
			return &r->probs[i];
	return NULL;
}

static void test_all_agree(void **state)
{
	struct rail_ck_info all[2];
	struct rail_ck_report r;
	struct rail_ck_cell c[2];

	(void)state;
	make_info(&all[0], 0, "a");
	make_info(&all[1], 1, "b");
	run_checks(all, &r, c, 0);
	assert_int_equal(r.nfail, 0);
	assert_int_equal(r.nprobs, 0);
	assert_true(c[0].ok && c[1].ok);
}

static void test_config_mismatch(void **state)
{
	struct rail_ck_info all[2];
	struct rail_ck_report r;
	struct rail_ck_cell c[2];
	const struct rail_ck_problem *p;

	(void)state;
	make_info(&all[0], 0, "a");
	make_info(&all[1], 1, "b");
	rail_strlcpy(all[1].conf[0].value, "106", sizeof(all[1].conf[0].value));	/* NCCL_IB_TC */
	rail_strlcpy(all[1].conf[1].value, "4", sizeof(all[1].conf[1].value));	/* QPS: a note */
	run_checks(all, &r, c, 0);
	assert_int_equal(r.nfail, 1);
	assert_int_equal(r.nprobs, 2);
	p = &r.probs[0];
	assert_int_equal(p->fatal, 1);
	assert_string_equal(p->what, "config");
	assert_non_null(strstr(p->text, "NCCL_IB_TC differs: 0 on a (rank 0), 106 on b (rank 1)"));
	assert_non_null(strstr(p->text, "set it the same on every node"));
	assert_int_equal(r.probs[1].fatal, 0);
	assert_non_null(strstr(r.probs[1].text, "NCCL_IB_QPS_PER_CONNECTION differs"));
	/* verbs settings do not matter to two TCP processes */
	rail_strlcpy(all[0].transport, "tcp", sizeof(all[0].transport));
	rail_strlcpy(all[1].transport, "tcp", sizeof(all[1].transport));
	run_checks(all, &r, c, 0);
	assert_int_equal(r.nfail, 0);
}

static void test_version_and_transport(void **state)
{
	struct rail_ck_info all[2];
	struct rail_ck_report r;
	struct rail_ck_cell c[2];
	const struct rail_ck_problem *p;

	(void)state;
	make_info(&all[0], 0, "a");
	make_info(&all[1], 1, "b");
	rail_strlcpy(all[1].version, "0.3.0", sizeof(all[1].version));
	all[1].wire_ib = 5;
	run_checks(all, &r, c, 0);
	p = find_problem(&r, "version");
	assert_non_null(p);
	assert_int_equal(p->fatal, 1);
	assert_non_null(strstr(p->text, "nccl-net-rail 0.3.0 on b (rank 1)"));
	assert_non_null(strstr(p->text, "0.2.0 on a (rank 0)"));
	assert_non_null(strstr(p->text, "cannot connect"));
	make_info(&all[1], 1, "b");
	rail_strlcpy(all[1].transport, "tcp", sizeof(all[1].transport));
	run_checks(all, &r, c, 0);
	p = find_problem(&r, "transport");
	assert_non_null(p);
	assert_non_null(strstr(p->text, "NCCL_RAIL_TRANSPORT"));
	make_info(&all[1], 1, "b");
	all[1].transport[0] = '\0';
	rail_strlcpy(all[1].why, "no RDMA device", sizeof(all[1].why));
	run_checks(all, &r, c, 0);
	p = find_problem(&r, "plugin");
	assert_non_null(p);
	assert_non_null(strstr(p->text, "the plugin did not start on b (rank 1): no RDMA device"));
}

static void test_device_pair_checks(void **state)
{
	struct rail_ck_info all[2];
	struct rail_ck_report r;
	struct rail_ck_cell c[2];

	(void)state;
	make_info(&all[0], 0, "a");
	make_info(&all[1], 1, "b");
	rail_strlcpy(all[1].dev[0].subnet, "198.51.100.0/24", sizeof(all[1].dev[0].subnet));
	run_checks(all, &r, c, 0);
	assert_int_equal(r.nfail, 2);	/* both rows */
	assert_false(c[0].ok);
	assert_string_equal(c[0].step, "subnet");
	assert_non_null(strstr(c[0].why, "GIDs on different subnets: rxe0:1 ::ffff:192.0.2.1 "
					  "(192.0.2.0/24) on a, rxe1:1 ::ffff:192.0.2.2 "
					  "(198.51.100.0/24) on b"));
	run_checks(all, &r, c, 1);	/* --routed */
	assert_int_equal(r.nfail, 0);

	make_info(&all[1], 1, "b");
	all[1].dev[0].mtu = 4096;
	run_checks(all, &r, c, 0);
	assert_string_equal(c[0].step, "mtu");
	assert_non_null(strstr(c[0].why, "MTU differs: 1024 on rxe0:1 (a), 4096 on rxe1:1 (b)"));

	make_info(&all[1], 1, "b");
	rail_strlcpy(all[1].dev[0].gid_type, "RoCEv1", sizeof(all[1].dev[0].gid_type));
	run_checks(all, &r, c, 0);
	assert_string_equal(c[1].step, "gid-type");

	/* a data failure keeps its reason behind the static one */
	make_info(&all[1], 1, "b");
	rail_strlcpy(all[1].dev[0].subnet, "198.51.100.0/24", sizeof(all[1].dev[0].subnet));
	{
		struct rail_ck_opts o = { 0 };

		memset(&r, 0, sizeof(r));
		c[0] = (struct rail_ck_cell){ .ra = 0, .rb = 1, .tested = 1 };
		rail_strlcpy(c[0].step, "connect", sizeof(c[0].step));
		rail_strlcpy(c[0].why, "nothing within 10 s", sizeof(c[0].why));
		r.nranks = 2, r.all = all, r.cells = c, r.ncells = 1;
		rail_ck_static_checks(&r, &o);
		assert_string_equal(c[0].step, "subnet");
		assert_non_null(strstr(c[0].why, "; and the connect step failed: nothing within 10 s"));
	}
}

static void test_cells_roundtrip(void **state)
{
	struct rail_ck_cell c[2] = { { .ra = 0, .da = 1, .rb = 2, .db = 1, .tested = 1, .ok = 1,
				       .lat_us = 3.5, .bw = 1.25 },
				     { .ra = 0, .da = 0, .rb = 2, .db = 0, .tested = 1 } }, d[4];
	char buf[4096];

	(void)state;
	rail_strlcpy(c[1].step, "connect", sizeof(c[1].step));
	rail_strlcpy(c[1].why, "a\tb\nc", sizeof(c[1].why));
	assert_true(rail_ck_cells_encode(c, 2, buf, sizeof(buf)) > 0);
	assert_int_equal(rail_ck_cells_decode(buf, d, 4), 2);
	assert_int_equal(d[0].da, 1);
	assert_int_equal(d[0].rb, 2);
	assert_true(d[0].ok);
	assert_true(d[0].lat_us > 3.4 && d[0].lat_us < 3.6);
	assert_string_equal(d[0].step, "");
	assert_false(d[1].ok);
	assert_string_equal(d[1].step, "connect");
	assert_string_equal(d[1].why, "a b c");
	assert_int_equal(rail_ck_cells_decode("1\t2\n", d, 4), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_info_roundtrip),
		cmocka_unit_test(test_info_decode_rejects),
		cmocka_unit_test(test_all_agree),
		cmocka_unit_test(test_config_mismatch),
		cmocka_unit_test(test_version_and_transport),
		cmocka_unit_test(test_device_pair_checks),
		cmocka_unit_test(test_cells_roundtrip),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
