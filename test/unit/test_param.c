/* nccl-net-rail unit tests: the parameter table and its parser (src/param.c). */
#include "unit.h"

#include <errno.h>

#include "param.h"
#include "rail.h"

extern char **environ;

/* Remove every variable the table knows and every NCCL_RAIL_* one. */
static void clear_env(void)
{
	for (int i = 0; i < RAIL_P_COUNT; i++)
		unsetenv(rail_param_table[i].name);
	for (;;) {
		char name[256];
		int found = 0;

		for (char **e = environ; e && *e; e++) {
			if (!strncmp(*e, "NCCL_RAIL_", 10)) {
				size_t len = strcspn(*e, "=");

				if (len >= sizeof(name))
					len = sizeof(name) - 1;
				memcpy(name, *e, len);
				name[len] = '\0';
				found = 1;
				break;
			}
		}
		if (!found)
			break;
		unsetenv(name);
	}
}

static int setup(void **state)
{
	(void)state;
	clear_env();
	rail_params_reload();
	unit_log_capture();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unit_log_release();
	clear_env();
	rail_params_reload();
	return 0;
}

/* Parse text for id; returns the error and stores the value / reason. */
static int parse(enum rail_param_id id, const char *text, int64_t *v, char *why, size_t len)
{
	why[0] = '\0';
	*v = 0x5a5a5a5a;
	return rail_param_parse(id, text, v, why, len);
}

static void expect_ok(enum rail_param_id id, const char *text, int64_t want)
{
	char why[200];
	int64_t v;
	int err = parse(id, text, &v, why, sizeof(why));

	if (err)
		fail_msg("%s=\"%s\" rejected: %s", rail_param_table[id].name, text, why);
	if (v != want)
		fail_msg("%s=\"%s\" parsed to %lld, expected %lld", rail_param_table[id].name, text,
			 (long long)v, (long long)want);
}

static void expect_bad(enum rail_param_id id, const char *text)
{
	char why[200];
	int64_t v;
	int err = parse(id, text, &v, why, sizeof(why));

	if (err != -EINVAL)
		fail_msg("%s=\"%s\" accepted (value %lld, err %d), expected -EINVAL",
			 rail_param_table[id].name, text, (long long)v, err);
	if (why[0] == '\0')
		fail_msg("%s=\"%s\" rejected without a reason", rail_param_table[id].name, text);
}

static void test_every_default_parses(void **state)
{
	(void)state;
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		const struct rail_param_desc *d = &rail_param_table[i];
		char why[200] = "";
		int64_t v;

		assert_non_null(d->name);
		assert_non_null(d->def);
		assert_non_null(d->doc);
		assert_true(d->doc[0] != '\0');
		if (rail_param_parse((enum rail_param_id)i, d->def, &v, why, sizeof(why)) != 0)
			fail_msg("default %s=\"%s\" does not parse: %s", d->name, d->def, why);
		/* The loaded value (environment cleared) is the default. */
		assert_false(rail_param_is_set((enum rail_param_id)i));
		assert_string_equal(rail_param_str((enum rail_param_id)i), d->def);
		if (d->type != RAIL_PT_STR)
			assert_true(rail_param_int((enum rail_param_id)i) == v);
		if (d->type == RAIL_PT_ENUM)
			assert_non_null(strstr(d->values, "|"));
	}
	/* Loading the defaults warned about nothing. */
	rail_params_reload();
	if (unit_log_count(RAIL_LOG_WARN, NULL)) {
		unit_log_dump();
		fail_msg("loading defaults warned");
	}
}

static void test_names_unique(void **state)
{
	(void)state;
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		assert_true(!strncmp(rail_param_table[i].name, "NCCL_", 5));
		for (int j = i + 1; j < RAIL_P_COUNT; j++)
			if (!strcmp(rail_param_table[i].name, rail_param_table[j].name))
				fail_msg("%s declared twice", rail_param_table[i].name);
	}
}

static void test_int_range(void **state)
{
	char why[200];
	int64_t v;

	(void)state;
	/* NCCL_IB_TIMEOUT: [1, 31] */
	expect_ok(RAIL_P_IB_TIMEOUT, "1", 1);
	expect_ok(RAIL_P_IB_TIMEOUT, "31", 31);
	expect_ok(RAIL_P_IB_TIMEOUT, "20", 20);
	expect_bad(RAIL_P_IB_TIMEOUT, "0");
	expect_bad(RAIL_P_IB_TIMEOUT, "32");
	expect_bad(RAIL_P_IB_TIMEOUT, "-5");
	assert_int_equal(parse(RAIL_P_IB_TIMEOUT, "32", &v, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "[1, 31]"));
	/* NCCL_IB_GID_INDEX: [-1, 65535], negative minimum */
	expect_ok(RAIL_P_IB_GID_INDEX, "-1", -1);
	expect_ok(RAIL_P_IB_GID_INDEX, "65535", 65535);
	expect_bad(RAIL_P_IB_GID_INDEX, "-2");
	expect_bad(RAIL_P_IB_GID_INDEX, "65536");
	/* NCCL_RAIL_CONNECT_TIMEOUT: [0, 86400] */
	expect_ok(RAIL_P_CONNECT_TIMEOUT, "0", 0);
	expect_bad(RAIL_P_CONNECT_TIMEOUT, "86401");
	expect_bad(RAIL_P_CONNECT_TIMEOUT, "99999999999999999999999"); /* overflow */
	/* junk */
	expect_bad(RAIL_P_IB_TIMEOUT, "");
	expect_bad(RAIL_P_IB_TIMEOUT, "abc");
	expect_bad(RAIL_P_IB_TIMEOUT, "12x");
	expect_bad(RAIL_P_IB_TIMEOUT, "12 ");
	expect_bad(RAIL_P_IB_TIMEOUT, "auto"); /* INT, not AUTOINT */
	expect_bad(RAIL_P_IB_TIMEOUT, "1k");   /* INT takes no size suffix */
}

static void test_size_suffixes(void **state)
{
	char why[200];
	int64_t v;

	(void)state;
	/* NCCL_RAIL_TCP_INLINE: [0, 4M], default auto */
	expect_ok(RAIL_P_TCP_INLINE, "64k", 64 * 1024);
	expect_ok(RAIL_P_TCP_INLINE, "64K", 64 * 1024);
	expect_ok(RAIL_P_TCP_INLINE, "64kb", 64 * 1024);
	expect_ok(RAIL_P_TCP_INLINE, "64KB", 64 * 1024);
	expect_ok(RAIL_P_TCP_INLINE, "1M", 1 << 20);
	expect_ok(RAIL_P_TCP_INLINE, "1m", 1 << 20);
	expect_ok(RAIL_P_TCP_INLINE, "4m", 4 << 20);
	expect_ok(RAIL_P_TCP_INLINE, "4096", 4096);
	expect_ok(RAIL_P_TCP_INLINE, "0", 0);
	expect_bad(RAIL_P_TCP_INLINE, "5m"); /* above max */
	assert_int_equal(parse(RAIL_P_TCP_INLINE, "5m", &v, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "size"));
	assert_non_null(strstr(why, "4194304"));
	/* NCCL_SOCKET_SNDBUF: [4096, 1G], default auto */
	expect_ok(RAIL_P_SOCKET_SNDBUF, "1g", 1ll << 30);
	expect_ok(RAIL_P_SOCKET_SNDBUF, "1G", 1ll << 30);
	expect_ok(RAIL_P_SOCKET_SNDBUF, "4096", 4096);
	expect_ok(RAIL_P_SOCKET_SNDBUF, "auto", RAIL_PARAM_AUTO);
	expect_ok(RAIL_P_SOCKET_SNDBUF, "AUTO", RAIL_PARAM_AUTO);
	expect_bad(RAIL_P_SOCKET_SNDBUF, "2g");	 /* parses as 2 GiB, above max */
	expect_bad(RAIL_P_SOCKET_SNDBUF, "4095"); /* below min */
	/* "auto" only where the default is auto */
	expect_ok(RAIL_P_TCP_INLINE, "auto", RAIL_PARAM_AUTO);
	expect_bad(RAIL_P_TCP_MIN_CHUNK, "auto");
	/* negative and junk */
	expect_bad(RAIL_P_TCP_INLINE, "-1");
	expect_bad(RAIL_P_TCP_INLINE, "-64k");
	expect_bad(RAIL_P_TCP_INLINE, "-0"); /* the sign itself is refused */
	expect_bad(RAIL_P_SOCKET_SNDBUF, "-4096");
	expect_bad(RAIL_P_TCP_INLINE, "12x");
	expect_bad(RAIL_P_TCP_INLINE, "abc");
	expect_bad(RAIL_P_TCP_INLINE, "");
	expect_bad(RAIL_P_TCP_INLINE, "k");
	expect_bad(RAIL_P_TCP_INLINE, "64kk");
	expect_bad(RAIL_P_TCP_INLINE, "64kbb");
	expect_bad(RAIL_P_TCP_INLINE, "64b"); /* 'b' only after a unit */
	expect_bad(RAIL_P_TCP_INLINE, "1.5m");
	expect_bad(RAIL_P_TCP_INLINE, "64 k");
	expect_bad(RAIL_P_SOCKET_SNDBUF, "99999999999g");	  /* overflows int64 */
	expect_bad(RAIL_P_SOCKET_SNDBUF, "18446744073709551615"); /* UINT64_MAX */
}

static void test_autoint(void **state)
{
	char why[200];
	int64_t v;

	(void)state;
	/* NCCL_SOCKET_NTHREADS: [1, 16] or auto */
	expect_ok(RAIL_P_SOCKET_NTHREADS, "auto", RAIL_PARAM_AUTO);
	expect_ok(RAIL_P_SOCKET_NTHREADS, "Auto", RAIL_PARAM_AUTO);
	expect_ok(RAIL_P_SOCKET_NTHREADS, "4", 4);
	expect_ok(RAIL_P_SOCKET_NTHREADS, "16", 16);
	/* NCCL's -2, "not set", wherever auto is: its default of these variables */
	expect_ok(RAIL_P_SOCKET_NTHREADS, "-2", RAIL_PARAM_AUTO);
	expect_ok(RAIL_P_IB_AR_THRESHOLD, "-2", RAIL_PARAM_AUTO);
	expect_bad(RAIL_P_TCP_MIN_CHUNK, "-2");	/* a size without auto */
	expect_bad(RAIL_P_IB_ADAPTIVE_ROUTING, "-3");
	expect_bad(RAIL_P_SOCKET_NTHREADS, "0");
	expect_bad(RAIL_P_SOCKET_NTHREADS, "17");
	expect_bad(RAIL_P_SOCKET_NTHREADS, "-1"); /* the auto value itself is not accepted as a number */
	expect_bad(RAIL_P_SOCKET_NTHREADS, "automatic");
	expect_bad(RAIL_P_SOCKET_NTHREADS, "");
	assert_int_equal(parse(RAIL_P_SOCKET_NTHREADS, "99", &v, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "or auto"));
	assert_non_null(strstr(why, "[1, 16]"));
}

static void test_bool_words(void **state)
{
	static const char *const yes[] = { "1", "y", "Y", "yes", "YES", "true", "True", "on", "ON" };
	static const char *const no[] = { "0", "n", "N", "no", "No", "false", "FALSE", "off", "Off" };
	static const char *const bad[] = { "", "2", "-1", "maybe", "yess", "tru", "enable", " 1" };

	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(yes); i++)
		expect_ok(RAIL_P_IB_DISABLE, yes[i], 1);
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(no); i++)
		expect_ok(RAIL_P_IB_DISABLE, no[i], 0);
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(bad); i++)
		expect_bad(RAIL_P_IB_DISABLE, bad[i]);
}

static void test_enum_case_insensitive(void **state)
{
	char why[200];
	int64_t v;

	(void)state;
	/* "auto|ib|tcp": the value is the index */
	expect_ok(RAIL_P_TRANSPORT, "auto", 0);
	expect_ok(RAIL_P_TRANSPORT, "AUTO", 0);
	expect_ok(RAIL_P_TRANSPORT, "ib", 1);
	expect_ok(RAIL_P_TRANSPORT, "IB", 1);
	expect_ok(RAIL_P_TRANSPORT, "tcp", 2);
	expect_ok(RAIL_P_TRANSPORT, "Tcp", 2);
	expect_bad(RAIL_P_TRANSPORT, "");
	expect_bad(RAIL_P_TRANSPORT, "t");	  /* no prefix matching */
	expect_bad(RAIL_P_TRANSPORT, "tcpx");
	expect_bad(RAIL_P_TRANSPORT, "rdma");
	expect_bad(RAIL_P_TRANSPORT, "ib|tcp");
	expect_bad(RAIL_P_TRANSPORT, "|");
	assert_int_equal(parse(RAIL_P_TRANSPORT, "rdma", &v, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "auto|ib|tcp"));
	/* "auto|AF_INET|AF_INET6": AF_INET must not match AF_INET6 or vice versa */
	expect_ok(RAIL_P_SOCKET_FAMILY, "af_inet", 1);
	expect_ok(RAIL_P_SOCKET_FAMILY, "AF_INET6", 2);
	expect_ok(RAIL_P_SOCKET_FAMILY, "af_Inet6", 2);
	expect_bad(RAIL_P_SOCKET_FAMILY, "AF_INET4");
	expect_ok(RAIL_P_IB_ADDR_FAMILY, "AF_INET6", 1);
}

static void test_str_accepts_anything(void **state)
{
	(void)state;
	expect_ok(RAIL_P_SOCKET_IFNAME, "", 0);
	expect_ok(RAIL_P_SOCKET_IFNAME, "^docker,lo", 0);
	expect_ok(RAIL_P_IB_HCA, "=mlx5_0:1", 0);
}

static void test_env_bad_value_warns_and_keeps_default(void **state)
{
	const struct unit_log_line *l;

	(void)state;
	setenv("NCCL_IB_TIMEOUT", "99", 1);
	setenv("NCCL_IB_DISABLE", "maybe", 1);
	setenv("NCCL_RAIL_TCP_INLINE", "12x", 1);
	setenv("NCCL_RAIL_TRANSPORT", "rdma", 1);
	unit_log_reset();
	rail_params_reload();

	unit_assert_logged2(RAIL_LOG_WARN, "NCCL_IB_TIMEOUT", "99");
	unit_assert_logged2(RAIL_LOG_WARN, "NCCL_IB_DISABLE", "maybe");
	unit_assert_logged2(RAIL_LOG_WARN, "NCCL_RAIL_TCP_INLINE", "12x");
	unit_assert_logged2(RAIL_LOG_WARN, "NCCL_RAIL_TRANSPORT", "rdma");
	/* The warning says what was expected and which default is kept. */
	l = unit_log_find(RAIL_LOG_WARN, "NCCL_IB_TIMEOUT");
	assert_non_null(l);
	assert_non_null(strstr(l->text, "[1, 31]"));
	assert_non_null(strstr(l->text, "default 20"));
	assert_non_null(strstr(l->text, "NET/Rail"));
	/* Known variables are not reported as unknown. */
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "unknown"), 0);
	/* Nothing claims to have been set. */
	assert_int_equal(unit_log_count(RAIL_LOG_INFO, "set by environment"), 0);

	assert_int_equal(rail_param_int(RAIL_P_IB_TIMEOUT), 20);
	assert_string_equal(rail_param_str(RAIL_P_IB_TIMEOUT), "20");
	assert_false(rail_param_is_set(RAIL_P_IB_TIMEOUT));
	assert_int_equal(rail_param_int(RAIL_P_IB_DISABLE), 0);
	assert_int_equal(rail_param_int(RAIL_P_TCP_INLINE), RAIL_PARAM_AUTO);
	assert_int_equal(rail_param_int(RAIL_P_TRANSPORT), 0);
	assert_string_equal(rail_param_str(RAIL_P_TRANSPORT), "auto");
}

static void test_env_good_value_logged(void **state)
{
	(void)state;
	setenv("NCCL_IB_TIMEOUT", "22", 1);
	setenv("NCCL_RAIL_TCP_INLINE", "1M", 1);
	setenv("NCCL_RAIL_TRANSPORT", "TCP", 1);
	setenv("NCCL_SOCKET_IFNAME", "^docker,lo", 1);
	unit_log_reset();
	rail_params_reload();

	unit_assert_logged(RAIL_LOG_INFO, "NCCL_IB_TIMEOUT set by environment to 22");
	unit_assert_logged(RAIL_LOG_INFO, "NCCL_RAIL_TCP_INLINE set by environment to 1M");
	unit_assert_logged(RAIL_LOG_INFO, "NCCL_RAIL_TRANSPORT set by environment to TCP");
	unit_assert_logged(RAIL_LOG_INFO, "NCCL_SOCKET_IFNAME set by environment to ^docker,lo");
	assert_true(unit_log_find(RAIL_LOG_INFO, "NCCL_IB_TIMEOUT set")->flags & RAIL_LOG_ENV);
	/* Exactly the four that are set, and no warnings. */
	assert_int_equal(unit_log_count(RAIL_LOG_INFO, "set by environment"), 4);
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, NULL), 0);

	assert_int_equal(rail_param_int(RAIL_P_IB_TIMEOUT), 22);
	assert_true(rail_param_is_set(RAIL_P_IB_TIMEOUT));
	assert_int_equal(rail_param_int(RAIL_P_TCP_INLINE), 1 << 20);
	assert_string_equal(rail_param_str(RAIL_P_TCP_INLINE), "1M");
	assert_int_equal(rail_param_int(RAIL_P_TRANSPORT), 2);
	assert_string_equal(rail_param_str(RAIL_P_SOCKET_IFNAME), "^docker,lo");
	assert_true(rail_param_is_set(RAIL_P_SOCKET_IFNAME));
	assert_false(rail_param_is_set(RAIL_P_IB_RETRY_CNT));

	/* A reload without the variables returns to the defaults. */
	unsetenv("NCCL_IB_TIMEOUT");
	unsetenv("NCCL_RAIL_TCP_INLINE");
	unsetenv("NCCL_RAIL_TRANSPORT");
	unsetenv("NCCL_SOCKET_IFNAME");
	unit_log_reset();
	rail_params_reload();
	assert_int_equal(rail_param_int(RAIL_P_IB_TIMEOUT), 20);
	assert_false(rail_param_is_set(RAIL_P_IB_TIMEOUT));
	assert_int_equal(rail_param_int(RAIL_P_TCP_INLINE), RAIL_PARAM_AUTO);
	assert_string_equal(rail_param_str(RAIL_P_SOCKET_IFNAME), "");
	assert_int_equal(unit_log_count(RAIL_LOG_INFO, "set by environment"), 0);
}

static void test_load_is_once(void **state)
{
	(void)state;
	rail_params_load();
	setenv("NCCL_IB_RETRY_CNT", "3", 1);
	rail_params_load(); /* no-op: already loaded */
	assert_int_equal(rail_param_int(RAIL_P_IB_RETRY_CNT), 7);
	rail_params_reload();
	assert_int_equal(rail_param_int(RAIL_P_IB_RETRY_CNT), 3);
}

static void test_unknown_variable_suggests_nearest(void **state)
{
	(void)state;
	setenv("NCCL_RAIL_TRANSPRT", "ib", 1);
	setenv("NCCL_RAIL_TCP_INLNE", "1M", 1);
	unit_log_reset();
	rail_params_reload();
	unit_assert_logged2(RAIL_LOG_WARN, "NCCL_RAIL_TRANSPRT", "NCCL_RAIL_TRANSPORT");
	unit_assert_logged2(RAIL_LOG_WARN, "NCCL_RAIL_TCP_INLNE", "NCCL_RAIL_TCP_INLINE");
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "NCCL_RAIL_TRANSPRT"), 1);
	/* The typo does not set the real variable. */
	assert_int_equal(rail_param_int(RAIL_P_TRANSPORT), 0);
	assert_false(rail_param_is_set(RAIL_P_TRANSPORT));
}

static void test_unknown_variable_far_from_everything(void **state)
{
	const struct unit_log_line *l;

	(void)state;
	setenv("NCCL_RAIL_QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ", "1", 1);
	unit_log_reset();
	rail_params_reload();
	l = unit_log_find(RAIL_LOG_WARN, "NCCL_RAIL_QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ");
	if (!l) {
		unit_log_dump();
		fail_msg("unknown variable not warned");
	}
	assert_null(strstr(l->text, "did you mean"));
	assert_non_null(strstr(l->text, "rail-info"));
	/* The value part of the environment string is not part of the name. */
	assert_null(strstr(l->text, "=1"));
}

static void test_known_rail_variable_not_unknown(void **state)
{
	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_RAIL_CONNECT_TIMEOUT", "5", 1);
	unit_log_reset();
	rail_params_reload();
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, NULL), 0);
}

static void test_edit_distance(void **state)
{
	(void)state;
	assert_int_equal(rail_edit_distance("", ""), 0);
	assert_int_equal(rail_edit_distance("abc", ""), 3);
	assert_int_equal(rail_edit_distance("", "abc"), 3);
	assert_int_equal(rail_edit_distance("abc", "abc"), 0);
	assert_int_equal(rail_edit_distance("abc", "ABC"), 0); /* case-insensitive */
	assert_int_equal(rail_edit_distance("kitten", "sitting"), 3);
	assert_int_equal(rail_edit_distance("sitting", "kitten"), 3);
	assert_int_equal(rail_edit_distance("flaw", "lawn"), 2);
	assert_int_equal(rail_edit_distance("abc", "acb"), 2); /* no transpositions */
	assert_int_equal(rail_edit_distance("NCCL_RAIL_TRANSPRT", "NCCL_RAIL_TRANSPORT"), 1);
	assert_int_equal(rail_edit_distance("NCCL_IB_HCA", "NCCL_IB_TC"), 2);
	/* Long strings do not overflow a fixed row. */
	{
		char a[300], b[300];

		memset(a, 'a', sizeof(a) - 1);
		a[sizeof(a) - 1] = '\0';
		memset(b, 'a', sizeof(b) - 1);
		b[sizeof(b) - 1] = '\0';
		b[10] = 'b';
		assert_true(rail_edit_distance(a, "aaa") == 296);
		assert_true(rail_edit_distance(a, b) >= 1);
	}
}

/* Run rail_params_print into a string. */
static char *print_to_string(const char *format)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	rail_params_print(f, format);
	assert_int_equal(fclose(f), 0);
	assert_non_null(buf);
	return buf;
}

/* Cells of a markdown row: count '|' not escaped with a backslash. */
static int md_pipes(const char *line, size_t len)
{
	int n = 0;

	for (size_t i = 0; i < len; i++)
		if (line[i] == '|' && (i == 0 || line[i - 1] != '\\'))
			n++;
	return n;
}

static void test_print_markdown(void **state)
{
	char *out = print_to_string("markdown");
	const char *p = out;
	int rows = 0, line_no = 0;

	(void)state;
	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		if (!nl)
			fail_msg("markdown output does not end with a newline");
		if (line_no == 0) {
			assert_true(!strncmp(p, "| Variable |", 12));
		} else if (line_no == 1) {
			assert_true(!strncmp(p, "|---|", 5));
		} else {
			const struct rail_param_desc *d;
			char want[160];

			if (rows >= RAIL_P_COUNT)
				fail_msg("more rows than parameters: %.*s", (int)len, p);
			d = &rail_param_table[rows];
			snprintf(want, sizeof(want), "| `%s` | ", d->name);
			if (strncmp(p, want, strlen(want)))
				fail_msg("row %d is '%.*s', expected it to start '%s'", rows, (int)len,
					 p, want);
			/* Four cells exactly: a '|' in a doc or default would break the table. */
			if (md_pipes(p, len) != 5)
				fail_msg("row for %s has %d unescaped '|': %.*s", d->name,
					 md_pipes(p, len), (int)len, p);
			rows++;
		}
		assert_int_equal(md_pipes(p, len), 5);
		line_no++;
		p += len + 1;
	}
	assert_int_equal(rows, RAIL_P_COUNT);
	/* ENUM types list their values with escaped bars. */
	assert_non_null(strstr(out, "| `NCCL_RAIL_TRANSPORT` | auto\\|ib\\|tcp | `auto` |"));
	/* Empty defaults are shown as "". */
	assert_non_null(strstr(out, "| `NCCL_SOCKET_IFNAME` | string | `\"\"` |"));
	free(out);
}

static void test_print_text_and_json(void **state)
{
	char *text, *json;
	const char *p;
	int objs = 0;

	(void)state;
	setenv("NCCL_IB_TIMEOUT", "22", 1);
	rail_params_reload();
	text = print_to_string("text");
	json = print_to_string("json");
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		assert_non_null(strstr(text, rail_param_table[i].name));
		assert_non_null(strstr(json, rail_param_table[i].name));
	}
	for (p = json; (p = strstr(p, "{\"name\"")) != NULL; p++)
		objs++;
	assert_int_equal(objs, RAIL_P_COUNT);
	assert_non_null(strstr(json, "\"name\": \"NCCL_IB_TIMEOUT\", \"type\": \"int\", "
				     "\"value\": \"22\", \"default\": \"20\", \"set\": true"));
	assert_non_null(strstr(text, "[env]"));
	assert_true(json[0] == '[');
	free(text);
	free(json);
}

static void test_value_text(void **state)
{
	char buf[8];

	(void)state;
	setenv("NCCL_SOCKET_IFNAME", "eth0,eth1,eth2", 1);
	rail_params_reload();
	assert_string_equal(rail_param_value_text(RAIL_P_SOCKET_IFNAME, buf, sizeof(buf)),
			    "eth0,et"); /* truncated, terminated */
	assert_string_equal(rail_param_type_name(RAIL_PT_SIZE), "size");
	assert_string_equal(rail_param_type_name(RAIL_PT_AUTOINT), "int|auto");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_every_default_parses, setup, teardown),
		cmocka_unit_test_setup_teardown(test_names_unique, setup, teardown),
		cmocka_unit_test_setup_teardown(test_int_range, setup, teardown),
		cmocka_unit_test_setup_teardown(test_size_suffixes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_autoint, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bool_words, setup, teardown),
		cmocka_unit_test_setup_teardown(test_enum_case_insensitive, setup, teardown),
		cmocka_unit_test_setup_teardown(test_str_accepts_anything, setup, teardown),
		cmocka_unit_test_setup_teardown(test_env_bad_value_warns_and_keeps_default, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_env_good_value_logged, setup, teardown),
		cmocka_unit_test_setup_teardown(test_load_is_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unknown_variable_suggests_nearest, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_unknown_variable_far_from_everything, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_known_rail_variable_not_unknown, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_edit_distance, setup, teardown),
		cmocka_unit_test_setup_teardown(test_print_markdown, setup, teardown),
		cmocka_unit_test_setup_teardown(test_print_text_and_json, setup, teardown),
		cmocka_unit_test_setup_teardown(test_value_text, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
