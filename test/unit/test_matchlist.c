/* nccl-net-rail unit tests: NCCL's [^][=]name[:port[:rail[:plane]]] lists (src/matchlist.c). */
#include "unit.h"

#include <errno.h>

#include "matchlist.h"
#include "rail.h"

#define HCA_FIELDS 4
#define IF_FIELDS 1

static struct rail_matchlist parse_ok(const char *spec, int max_fields)
{
	struct rail_matchlist ml;
	char why[256] = "";
	int err;

	memset(&ml, 0xa5, sizeof(ml));
	err = rail_matchlist_parse(spec, max_fields, &ml, why, sizeof(why));
	if (err)
		fail_msg("'%s' (max_fields %d) rejected: %d %s", spec, max_fields, err, why);
	return ml;
}

/* Returns the reason; the output must not be touched on failure. */
static void parse_bad(const char *spec, int max_fields, const char *why_has)
{
	struct rail_matchlist ml, before;
	char why[256] = "";
	int err;

	memset(&ml, 0xa5, sizeof(ml));
	before = ml;
	err = rail_matchlist_parse(spec, max_fields, &ml, why, sizeof(why));
	if (err != -EINVAL)
		fail_msg("'%s' (max_fields %d) returned %d, expected -EINVAL", spec, max_fields,
			 err);
	if (why[0] == '\0')
		fail_msg("'%s' rejected without a reason", spec);
	if (why_has && !strstr(why, why_has))
		fail_msg("'%s': reason '%s' does not mention '%s'", spec, why, why_has);
	if (memcmp(&ml, &before, sizeof(ml)))
		fail_msg("'%s': output written on failure", spec);
}

static int match(const struct rail_matchlist *ml, const char *name, int port)
{
	return rail_matchlist_match(ml, name, port, NULL);
}

static void test_empty_list_matches_everything(void **state)
{
	struct rail_matchlist ml = parse_ok("", HCA_FIELDS);
	const struct rail_match_entry *e = (const void *)1;

	(void)state;
	assert_int_equal(ml.n, 0);
	assert_false(ml.exclude);
	assert_false(ml.exact);
	assert_true(match(&ml, "mlx5_0", 1));
	assert_true(match(&ml, "anything", -1));
	assert_true(rail_matchlist_match(&ml, "eth0", -1, &e));
	assert_null(e);
	/* Stray commas are not entries. */
	ml = parse_ok(",,", IF_FIELDS);
	assert_int_equal(ml.n, 0);
	assert_true(match(&ml, "eth0", -1));
}

static void test_prefix_match(void **state)
{
	struct rail_matchlist ml = parse_ok("mlx5_1", HCA_FIELDS);

	(void)state;
	assert_int_equal(ml.n, 1);
	assert_string_equal(ml.e[0].name, "mlx5_1");
	assert_int_equal(ml.e[0].port, -1);
	assert_int_equal(ml.e[0].rail, -1);
	assert_int_equal(ml.e[0].plane, -1);
	assert_true(match(&ml, "mlx5_1", 1));
	assert_true(match(&ml, "mlx5_10", 1)); /* prefix */
	assert_true(match(&ml, "mlx5_1", -1));
	assert_false(match(&ml, "mlx5_0", 1));
	assert_false(match(&ml, "mlx5_", 1)); /* shorter than the entry */
	assert_false(match(&ml, "xmlx5_1", 1));

	ml = parse_ok("eth,ib", IF_FIELDS);
	assert_int_equal(ml.n, 2);
	assert_true(match(&ml, "eth0", -1));
	assert_true(match(&ml, "ib0", -1));
	assert_true(match(&ml, "ibp12s0", -1));
	assert_false(match(&ml, "enp1s0", -1));
	assert_false(match(&ml, "lo", -1));
}

static void test_exact_match(void **state)
{
	struct rail_matchlist ml = parse_ok("=mlx5_1", HCA_FIELDS);

	(void)state;
	assert_true(ml.exact);
	assert_false(ml.exclude);
	assert_int_equal(ml.n, 1);
	assert_string_equal(ml.e[0].name, "mlx5_1");
	assert_true(match(&ml, "mlx5_1", 1));
	assert_false(match(&ml, "mlx5_10", 1));
	assert_false(match(&ml, "mlx5_", 1));

	/* '=' applies to the whole list */
	ml = parse_ok("=eth0,eth1", IF_FIELDS);
	assert_int_equal(ml.n, 2);
	assert_true(match(&ml, "eth1", -1));
	assert_false(match(&ml, "eth10", -1));
}

static void test_exclusion(void **state)
{
	struct rail_matchlist ml = parse_ok("^docker,lo", IF_FIELDS);

	(void)state;
	assert_true(ml.exclude);
	assert_false(ml.exact);
	assert_int_equal(ml.n, 2);
	assert_false(match(&ml, "docker0", -1));
	assert_false(match(&ml, "lo", -1));
	assert_false(match(&ml, "loopback7", -1)); /* prefix excluded too */
	assert_true(match(&ml, "eth0", -1));
	assert_true(match(&ml, "ib0", -1));
}

static void test_exclusion_exact(void **state)
{
	struct rail_matchlist ml = parse_ok("^=mlx5_1", HCA_FIELDS);
	const struct rail_match_entry *e = (const void *)1;

	(void)state;
	assert_true(ml.exclude);
	assert_true(ml.exact);
	assert_int_equal(ml.n, 1);
	assert_false(match(&ml, "mlx5_1", 1));
	assert_true(match(&ml, "mlx5_10", 1)); /* exact: only mlx5_1 is excluded */
	assert_true(rail_matchlist_match(&ml, "mlx5_0", 1, &e));
	assert_null(e); /* excluding lists give no entry */

	/* "=^" is not "^=": the '^' would be part of the name. */
	ml = parse_ok("=^mlx5_1", HCA_FIELDS);
	assert_false(ml.exclude);
	assert_string_equal(ml.e[0].name, "^mlx5_1");
}

static void test_ports(void **state)
{
	struct rail_matchlist ml = parse_ok("mlx5_0:1,mlx5_1:2", HCA_FIELDS);
	const struct rail_match_entry *e = NULL;

	(void)state;
	assert_int_equal(ml.n, 2);
	assert_int_equal(ml.e[0].port, 1);
	assert_int_equal(ml.e[1].port, 2);
	assert_true(match(&ml, "mlx5_0", 1));
	assert_false(match(&ml, "mlx5_0", 2));
	assert_true(match(&ml, "mlx5_1", 2));
	assert_false(match(&ml, "mlx5_1", 1));
	assert_true(match(&ml, "mlx5_0", -1)); /* any port */
	assert_true(rail_matchlist_match(&ml, "mlx5_1", 2, &e));
	assert_ptr_equal(e, &ml.e[1]);

	/* Excluding one port keeps the other. */
	ml = parse_ok("^mlx5_0:1", HCA_FIELDS);
	assert_false(match(&ml, "mlx5_0", 1));
	assert_true(match(&ml, "mlx5_0", 2));
	assert_true(match(&ml, "mlx5_1", 1));

	/* Same device, two ports. */
	ml = parse_ok("=mlx5_0:1,mlx5_0:2", HCA_FIELDS);
	assert_true(match(&ml, "mlx5_0", 2));
	assert_false(match(&ml, "mlx5_0", 3));

	ml = parse_ok("mlx5_0:0,mlx5_1:255", HCA_FIELDS);
	assert_int_equal(ml.e[0].port, 0);
	assert_int_equal(ml.e[1].port, 255);
}

static void test_rail_plane(void **state)
{
	struct rail_matchlist ml = parse_ok("mlx5_0:1:3:1,=mlx5_1", HCA_FIELDS);
	const struct rail_match_entry *e = NULL;

	(void)state;
	/* '=' only counts at the front of the list; here it is part of a name */
	assert_false(ml.exact);
	assert_int_equal(ml.n, 2);
	assert_string_equal(ml.e[0].name, "mlx5_0");
	assert_int_equal(ml.e[0].port, 1);
	assert_int_equal(ml.e[0].rail, 3);
	assert_int_equal(ml.e[0].plane, 1);
	assert_string_equal(ml.e[1].name, "=mlx5_1");
	assert_true(rail_matchlist_match(&ml, "mlx5_0", 1, &e));
	assert_non_null(e);
	assert_int_equal(e->rail, 3);
	assert_int_equal(e->plane, 1);

	ml = parse_ok("mlx5_2:1:7", HCA_FIELDS);
	assert_int_equal(ml.e[0].rail, 7);
	assert_int_equal(ml.e[0].plane, -1);
	ml = parse_ok("mlx5_2:1:32767:32767", HCA_FIELDS);
	assert_int_equal(ml.e[0].rail, 32767);
	assert_int_equal(ml.e[0].plane, 32767);
}

static void test_empty_fields(void **state)
{
	struct rail_matchlist ml = parse_ok("=mlx5_0::0:0", HCA_FIELDS);

	(void)state;
	assert_true(ml.exact);
	assert_int_equal(ml.n, 1);
	assert_string_equal(ml.e[0].name, "mlx5_0");
	assert_int_equal(ml.e[0].port, -1);
	assert_int_equal(ml.e[0].rail, 0);
	assert_int_equal(ml.e[0].plane, 0);
	assert_true(match(&ml, "mlx5_0", 1));
	assert_true(match(&ml, "mlx5_0", 2));

	ml = parse_ok("mlx5_0:::", HCA_FIELDS);
	assert_int_equal(ml.e[0].port, -1);
	assert_int_equal(ml.e[0].rail, -1);
	assert_int_equal(ml.e[0].plane, -1);

	ml = parse_ok("mlx5_0::5", HCA_FIELDS);
	assert_int_equal(ml.e[0].port, -1);
	assert_int_equal(ml.e[0].rail, 5);
	assert_int_equal(ml.e[0].plane, -1);

	ml = parse_ok("mlx5_0:1:", HCA_FIELDS);
	assert_int_equal(ml.e[0].port, 1);
	assert_int_equal(ml.e[0].rail, -1);
}

static void test_entry_limit(void **state)
{
	char spec[32 * 8 + 64];
	size_t off = 0;
	struct rail_matchlist ml;

	(void)state;
	for (int i = 0; i < RAIL_MATCH_MAX; i++)
		off += (size_t)snprintf(spec + off, sizeof(spec) - off, "%sd%d", i ? "," : "", i);
	ml = parse_ok(spec, IF_FIELDS);
	assert_int_equal(ml.n, RAIL_MATCH_MAX);
	assert_string_equal(ml.e[RAIL_MATCH_MAX - 1].name, "d31");
	assert_true(match(&ml, "d31", -1));
	assert_false(match(&ml, "e1", -1));

	snprintf(spec + off, sizeof(spec) - off, ",d%d", RAIL_MATCH_MAX);
	parse_bad(spec, IF_FIELDS, "32");
}

static void test_bad_port(void **state)
{
	(void)state;
	parse_bad("mlx5_0:x", HCA_FIELDS, "port");
	parse_bad("mlx5_0:1x", HCA_FIELDS, "port");
	parse_bad("mlx5_0:-1", HCA_FIELDS, "port");
	parse_bad("mlx5_0:256", HCA_FIELDS, "port");
	parse_bad("mlx5_0:99999999999999999999", HCA_FIELDS, "port");
	parse_bad("mlx5_0:1:r", HCA_FIELDS, "rail");
	parse_bad("mlx5_0:1:32768", HCA_FIELDS, "rail");
	parse_bad("mlx5_0:1:0:p", HCA_FIELDS, "plane");
	/* A bad entry anywhere fails the whole list, naming the entry. */
	parse_bad("mlx5_0:1,mlx5_1:zz", HCA_FIELDS, "mlx5_1:zz");
}

static void test_too_many_fields(void **state)
{
	(void)state;
	parse_bad("mlx5_0:1:2:3:4", HCA_FIELDS, "too many");
	parse_bad("mlx5_0:1:2:3:", HCA_FIELDS, "too many");
	/* Interface names take no port. */
	parse_bad("eth0:1", IF_FIELDS, "port");
	parse_bad("eth0:", IF_FIELDS, "eth0:");
	parse_bad("^eth0,eth1:1", IF_FIELDS, "eth1:1");
	/* max_fields 2: name:port only */
	parse_bad("mlx5_0:1:2", 2, "rail");
	parse_ok("mlx5_0:1", 2);
}

static void test_bad_names(void **state)
{
	char spec[RAIL_MATCH_NAME_MAX + 8];

	(void)state;
	parse_bad("^", HCA_FIELDS, NULL);
	parse_bad("=", HCA_FIELDS, NULL);
	parse_bad("^=", HCA_FIELDS, NULL);
	parse_bad(":1", HCA_FIELDS, "name");
	parse_bad("mlx5_0,:1", HCA_FIELDS, "name");
	/* Names up to 63 characters fit; 64 do not. */
	memset(spec, 'n', RAIL_MATCH_NAME_MAX - 1);
	spec[RAIL_MATCH_NAME_MAX - 1] = '\0';
	assert_int_equal(parse_ok(spec, IF_FIELDS).n, 1);
	memset(spec, 'n', RAIL_MATCH_NAME_MAX);
	spec[RAIL_MATCH_NAME_MAX] = '\0';
	parse_bad(spec, IF_FIELDS, "too long");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty_list_matches_everything),
		cmocka_unit_test(test_prefix_match),
		cmocka_unit_test(test_exact_match),
		cmocka_unit_test(test_exclusion),
		cmocka_unit_test(test_exclusion_exact),
		cmocka_unit_test(test_ports),
		cmocka_unit_test(test_rail_plane),
		cmocka_unit_test(test_empty_fields),
		cmocka_unit_test(test_entry_limit),
		cmocka_unit_test(test_bad_port),
		cmocka_unit_test(test_too_many_fields),
		cmocka_unit_test(test_bad_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
