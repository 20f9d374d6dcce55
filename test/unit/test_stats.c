/*
 * nccl-net-rail unit tests: the per-connection counters (src/stats.c), their
 * summary line and file read back by rail-info --stats, and the flight
 * record ring (src/flight.c).
 */
#include "unit.h"

#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include "flight.h"
#include "param.h"
#include "rail.h"
#include "stats.h"
#include "transport.h"

static char build_dir[PATH_MAX];

static void test_hist_buckets(void **state)
{
	struct rail_stats s;

	(void)state;
	assert_int_equal(rail_stats_bucket(0), 0);
	assert_int_equal(rail_stats_bucket(1), 0);
	assert_int_equal(rail_stats_bucket(2), 1);
	assert_int_equal(rail_stats_bucket(3), 1);
	assert_int_equal(rail_stats_bucket(1023), 9);
	assert_int_equal(rail_stats_bucket(1024), 10);
	assert_int_equal(rail_stats_bucket(UINT64_MAX), RAIL_STATS_HIST - 1);
	memset(&s, 0, sizeof(s));
	for (int i = 0; i < 98; i++)
		rail_stats_latency(&s, 1000);		/* bucket 9: 512..1023 ns */
	rail_stats_latency(&s, 5000);			/* bucket 12 */
	rail_stats_latency(&s, 3000000);		/* bucket 21 */
	assert_int_equal(s.lat_n, 100);
	assert_int_equal(s.lat_hist[9], 98);
	assert_int_equal(s.lat_hist[12], 1);
	assert_int_equal(s.lat_hist[21], 1);
	assert_int_equal(s.lat_max_ns, 3000000);
	assert_int_equal(s.lat_sum_ns, 98 * 1000 + 5000 + 3000000);
	/* A quantile is its bucket's upper bound, never above the maximum. */
	assert_int_equal(rail_stats_quantile(&s, 0.5), 1023);
	assert_int_equal(rail_stats_quantile(&s, 0.98), 1023);
	assert_int_equal(rail_stats_quantile(&s, 0.99), 8191);
	assert_int_equal(rail_stats_quantile(&s, 1.0), 3000000);
	memset(&s, 0, sizeof(s));
	assert_int_equal(rail_stats_quantile(&s, 0.5), 0);
}

static void sample(struct rail_stats *s, uint64_t k)
{
	memset(s, 0, sizeof(*s));
	s->tx_bytes = 1048576 * k;
	s->tx_msgs = 16 * k;
	s->rx_bytes = 7 * k;
	s->rx_msgs = 3 * k;
	s->flushes = k;
	s->refused = 11 * k;
	s->errors = k - 1;
	s->eager = 5 * k;
	s->cts = 12 * k;
	s->cts_eager = 2 * k;
	s->wants = 4 * k;
	s->credits = 6 * k;
	s->loops = 1;
	rail_stats_latency(s, 700 * k);
	rail_stats_latency(s, 40000);
	rail_stats_latency(s, UINT64_MAX / 2);
}

static void test_format_parse(void **state)
{
	struct rail_stats s;
	struct rail_stats_line l;
	char line[1536], log[1700];

	(void)state;
	sample(&s, 3);
	assert_true(rail_stats_format(&s, "send", "ib", 2, "peer 10.0.0.2<1234>, mlx5_0:1",
				      line, sizeof(line)) < (int)sizeof(line));
	assert_int_equal(rail_stats_parse(line, &l), 0);
	assert_memory_equal(&l.s, &s, sizeof(s));
	assert_string_equal(l.kind, "send");
	assert_string_equal(l.transport, "ib");
	assert_int_equal(l.dev, 2);
	assert_int_equal(l.pid, (int)getpid());
	assert_string_equal(l.desc, "peer 10.0.0.2<1234>, mlx5_0:1");
	/* The same line as NCCL logs it. */
	snprintf(log, sizeof(log), "host:1:2 [0] NCCL INFO NET/Rail : %s\n", line);
	memset(&l, 0xa5, sizeof(l));
	assert_int_equal(rail_stats_parse(log, &l), 0);
	assert_memory_equal(&l.s, &s, sizeof(s));
	/* No histogram, empty description. */
	memset(&s, 0, sizeof(s));
	rail_stats_format(&s, "recv", "tcp", 0, "", line, sizeof(line));
	assert_int_equal(rail_stats_parse(line, &l), 0);
	assert_memory_equal(&l.s, &s, sizeof(s));
	assert_string_equal(l.desc, "");
	/* Malformed lines are refused. */
	assert_int_equal(rail_stats_parse("no stats here", &l), -EINVAL);
	assert_int_equal(rail_stats_parse("rail-stats v1 kind=send tx_bytes=12x", &l), -EINVAL);
	assert_int_equal(rail_stats_parse("rail-stats v1 kind=send hist=99:1", &l), -EINVAL);
	assert_int_equal(rail_stats_parse("rail-stats v1 tx_bytes=1", &l), -EINVAL);
}

static void test_path_template(void **state)
{
	char host[64], want[256], out[256], tiny[8];

	(void)state;
	assert_int_equal(gethostname(host, sizeof(host)), 0);
	snprintf(want, sizeof(want), "/tmp/s.%s.%d.%%x%%", host, (int)getpid());
	assert_int_equal(rail_stats_path("/tmp/s.%h.%p.%x%%", out, sizeof(out)), 0);
	assert_string_equal(out, want);
	assert_int_equal(rail_stats_path("/tmp/long-name.%p", tiny, sizeof(tiny)), -ENAMETOOLONG);
}

static int run_capture(const char *cmd, char *out, size_t len)
{
	FILE *p = popen(cmd, "r");
	size_t n;

	if (!p)
		fail_msg("popen %s: %s", cmd, strerror(errno));
	n = fread(out, 1, len - 1, p);
	out[n] = '\0';
	return pclose(p);
}

/* NCCL_RAIL_STATS=file: two comms and the total, read back by rail-info --stats. */
static void test_stats_file_rail_info(void **state)
{
	char dir[] = "/tmp/rail-stats-test-XXXXXX", tmpl[PATH_MAX], path[PATH_MAX];
	char info[PATH_MAX + 16], cmd[3 * PATH_MAX], out[8192];
	struct rail_stats a, b;
	int rc;

	(void)state;
	snprintf(info, sizeof(info), "%s/rail-info", build_dir);
	if (access(info, X_OK)) {
		print_message("SKIP: %s not built (make tools); the round trip needs it\n", info);
		skip();
	}
	assert_non_null(mkdtemp(dir));
	snprintf(tmpl, sizeof(tmpl), "%s/stats.%%h.%%p", dir);
	setenv("NCCL_RAIL_STATS", tmpl, 1);
	rail_params_load();
	assert_int_equal(rail_stats_mode(), 2);
	sample(&a, 1);
	sample(&b, 2);
	rail_stats_report(&a, "send", "ib", 0, "peer 192.0.2.7<5000>, mlx5_1:1, 4 QPs");
	rail_stats_report(&b, "recv", "tcp", 1, "");
	rail_stats_finalize();
	assert_int_equal(rail_stats_path(tmpl, path, sizeof(path)), 0);
	assert_int_equal(access(path, R_OK), 0);
	snprintf(cmd, sizeof(cmd), "%s --stats %s 2>&1", info, path);
	rc = run_capture(cmd, out, sizeof(out));
	if (rc != 0)
		fail_msg("rail-info --stats exited %d:\n%s", rc, out);
	if (!strstr(out, "tx_msgs") || !strstr(out, "1.0 MiB") || !strstr(out, "2.0 MiB") ||
	    !strstr(out, "3.0 MiB") || !strstr(out, "peer 192.0.2.7<5000>, mlx5_1:1, 4 QPs") ||
	    !strstr(out, "2 connections") || !strstr(out, "completion latency"))
		fail_msg("rail-info --stats printed:\n%s", out);
	/* An empty file: exit 1, saying what writes one. */
	snprintf(cmd, sizeof(cmd), "%s --stats /dev/null 2>&1", info);
	rc = run_capture(cmd, out, sizeof(out));
	assert_int_equal(WEXITSTATUS(rc), 1);
	assert_non_null(strstr(out, "NCCL_RAIL_STATS"));
	unlink(path);
	rmdir(dir);
	unsetenv("NCCL_RAIL_STATS");
	rail_params_load();
}

static void test_flight_ring(void **state)
{
	struct rail_flight f;
	struct rail_fev ev[RAIL_FLIGHT_N];
	int n;

	(void)state;
	memset(&f, 0, sizeof(f));
	assert_int_equal(rail_flight_events(&f, ev, RAIL_FLIGHT_N), 0);
	for (int i = 0; i < 3; i++)
		rail_flight_add(&f, 100 + (uint64_t)i, RAIL_FEV_SEND, (uint16_t)i, 8, 1, 1);
	n = rail_flight_events(&f, ev, RAIL_FLIGHT_N);
	assert_int_equal(n, 3);
	for (int i = 0; i < n; i++)
		assert_int_equal(ev[i].slot, i);
	/* Past N: the oldest go, the rest stay in order. */
	for (int i = 3; i < RAIL_FLIGHT_N + 37; i++)
		rail_flight_add(&f, 100 + (uint64_t)i, RAIL_FEV_SEND, (uint16_t)i, 8, 1, 1);
	n = rail_flight_events(&f, ev, RAIL_FLIGHT_N);
	assert_int_equal(n, RAIL_FLIGHT_N);
	for (int i = 0; i < n; i++) {
		assert_int_equal(ev[i].slot, 37 + i);
		assert_int_equal(ev[i].ns, 137 + (uint64_t)i);
	}
	/* Fewer asked for: the oldest of them. */
	assert_int_equal(rail_flight_events(&f, ev, 5), 5);
	assert_int_equal(ev[4].slot, 41);
}

static void test_flight_refused_coalesce(void **state)
{
	struct rail_flight f;
	struct rail_fev ev[RAIL_FLIGHT_N];
	char line[160];

	(void)state;
	memset(&f, 0, sizeof(f));
	for (int i = 0; i < 1000; i++)
		rail_flight_add(&f, 0, RAIL_FEV_REFUSED, 0, 65536, 3, 1);
	rail_flight_add(&f, 0, RAIL_FEV_SEND, 4, 65536, 3, 1);
	rail_flight_add(&f, 0, RAIL_FEV_REFUSED, 0, 65536, 3, 1);
	assert_int_equal(rail_flight_events(&f, ev, RAIL_FLIGHT_N), 3);
	assert_int_equal(ev[0].arg, 1000);
	assert_int_equal(ev[2].arg, 1);
	rail_flight_format(&ev[0], ev[0].ns + 2500, line, sizeof(line));
	assert_string_equal(line, "-2.5 us refused (not now) size=65536 tag=3, 1000 times");
	rail_flight_format(&ev[1], ev[1].ns, line, sizeof(line));
	assert_string_equal(line, "-0.0 us send posted size=65536 tag=3 req=4");
}

static const struct rail_transport_ops fake_ops = {
	.name = "fake",
	.req_size = sizeof(struct rail_req),
};

/* The record is logged once, with the requests still in flight. */
static void test_flight_dump_once(void **state)
{
	struct rail_comm c;
	struct rail_req *r;
	uint32_t slot;

	(void)state;
	assert_int_equal(rail_comm_init(&c, RAIL_COMM_SEND, 0, &fake_ops), 0);
	r = rail_pool_get_idx(&c.reqs, &slot);
	assert_non_null(r);
	r->magic = RAIL_REQ_MAGIC;
	r->type = RAIL_REQ_SEND;
	r->n = 1;
	r->size = 4096;
	r->tag = 7;
	r->t_post = rail_now_ns();
	rail_flight_add(&c.fl, r->t_post, RAIL_FEV_SEND, (uint16_t)slot, 4096, 7, 1);
	rail_flight_add(&c.fl, 0, RAIL_FEV_ERROR, (uint16_t)slot, 4096, 7, -ECONNRESET);
	unit_log_capture();
	assert_int_equal(rail_flight_dump(&c, "test of send failed"), 1);
	unit_assert_logged2(RAIL_LOG_WARN, "flight record of fake send comm (device 0)",
			    "test of send failed");
	unit_assert_logged2(RAIL_LOG_WARN, "flight: ", "send posted size=4096 tag=7 req=0");
	unit_assert_logged2(RAIL_LOG_WARN, "flight: ", "error req=0");
	unit_assert_logged(RAIL_LOG_WARN, "in flight: send req=0 size=4096 tag=7, posted");
	unit_log_reset();
	assert_int_equal(rail_flight_dump(&c, "again"), 0);
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "flight"), 0);
	unit_log_release();
	rail_pool_put(&c.reqs, r);
	rail_comm_fini(&c);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hist_buckets),
		cmocka_unit_test(test_format_parse),
		cmocka_unit_test(test_path_template),
		cmocka_unit_test(test_stats_file_rail_info),
		cmocka_unit_test(test_flight_ring),
		cmocka_unit_test(test_flight_refused_coalesce),
		cmocka_unit_test(test_flight_dump_once),
	};
	/* build/test/unit/test_stats -> build/ */
	(void)argc;
	unit_build_dir(argv[0], build_dir, sizeof(build_dir));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
