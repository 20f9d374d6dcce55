/*
 * nccl-net-rail unit tests: every NCCL_IB_* variable of the NCCL release in
 * test/fixtures/nccl-params/nccl-ib.tsv is decided on: declared in
 * src/params.def (Rail reads it) or a row of docs/NCCL-IB-PARITY.md's
 * "differ on purpose" table (Rail does not, and says why). Refreshing the
 * list for a new NCCL (the script's header says how) makes this test name
 * every new variable until it is decided.
 */
#include "unit.h"

#include "param.h"
#include "rail.h"

#define LIST "test/fixtures/nccl-params/nccl-ib.tsv"
#define DOC "docs/NCCL-IB-PARITY.md"
#define MAXVARS 256

struct nccl_var {
	char name[96];
	char def[32];
	char first[32];
};

static struct nccl_var vars[MAXVARS];
static int nvars;
static char release[64];
static char *differ[MAXVARS];	/* variables of the doc's table */
static int ndiffer;

/* The vendored list; fails the test when it is missing or malformed. */
static void load_list(void)
{
	FILE *f = fopen(LIST, "r");
	char line[512];

	assert_non_null(f);
	nvars = 0;
	release[0] = '\0';
	while (fgets(line, sizeof(line), f)) {
		struct nccl_var *v = &vars[nvars];

		line[strcspn(line, "\n")] = '\0';
		if (line[0] == '#') {
			if (!release[0])
				sscanf(line, "# %*s parameters declared by NCCL %63s", release);
			continue;
		}
		assert_true(nvars < MAXVARS);
		if (sscanf(line, "%95[^\t]\t%31[^\t]\t%31s", v->name, v->def, v->first) != 3)
			fail_msg(LIST ": malformed line \"%s\" (NAME<TAB>DEFAULT<TAB>RELEASE)", line);
		nvars++;
	}
	fclose(f);
}

/* The first cell of each row of the "differ on purpose" table, `NAME`. */
static void load_differ(void)
{
	FILE *f = fopen(DOC, "r");
	char line[4096];
	int in = 0, seen = 0;

	assert_non_null(f);
	ndiffer = 0;
	while (fgets(line, sizeof(line), f)) {
		char name[96];

		if (!strncmp(line, "## ", 3)) {
			in = strstr(line, "differ on purpose") != NULL;
			seen |= in;
			continue;
		}
		if (!in || sscanf(line, "| `%95[A-Z0-9_]` |", name) != 1)
			continue;
		assert_true(ndiffer < MAXVARS);
		differ[ndiffer++] = strdup(name);
	}
	fclose(f);
	if (!seen)
		fail_msg(DOC " has no section whose title says \"differ on purpose\"");
}

static int declared(const char *name)
{
	for (int i = 0; i < RAIL_P_COUNT; i++)
		if (!strcmp(rail_param_table[i].name, name))
			return 1;
	return 0;
}

static int in_differ(const char *name)
{
	for (int i = 0; i < ndiffer; i++)
		if (!strcmp(differ[i], name))
			return 1;
	return 0;
}

static int in_list(const char *name)
{
	for (int i = 0; i < nvars; i++)
		if (!strcmp(vars[i].name, name))
			return 1;
	return 0;
}

static int setup(void **state)
{
	(void)state;
	load_list();
	load_differ();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int i = 0; i < ndiffer; i++)
		free(differ[i]);
	ndiffer = 0;
	return 0;
}

/* The list is the whole of a release, not an empty or truncated file. */
static void test_list_is_a_release(void **state)
{
	(void)state;
	assert_true(release[0] != '\0');
	assert_true(nvars >= 40);	/* NCCL 2.30.7 declares 46 */
	assert_true(in_list("NCCL_IB_HCA"));
	assert_true(in_list("NCCL_IB_TIMEOUT"));
	for (int i = 0; i < nvars; i++) {
		assert_int_equal(strncmp(vars[i].name, "NCCL_IB_", 8), 0);
		assert_true(vars[i].first[0] == 'v' || !strncmp(vars[i].first, "<=v", 3));
	}
}

/* Each listed variable is read by Rail or explained. */
static void test_every_variable_decided(void **state)
{
	int missing = 0;

	(void)state;
	for (int i = 0; i < nvars; i++) {
		if (declared(vars[i].name) || in_differ(vars[i].name))
			continue;
		print_message("%s (NCCL %s, default %s): neither declared in src/params.def nor "
			      "explained in " DOC "'s \"differ on purpose\" table\n",
			      vars[i].name, vars[i].first, vars[i].def);
		missing++;
	}
	if (missing)
		fail_msg("%d NCCL_IB_* variable(s) of NCCL %s undecided: implement each "
			 "(src/params.def) or say in " DOC " why Rail differs", missing, release);
}

/* A row of the table names a NCCL variable Rail does not read. */
static void test_differ_rows_are_true(void **state)
{
	(void)state;
	assert_true(ndiffer > 0);
	for (int i = 0; i < ndiffer; i++) {
		if (declared(differ[i]))
			fail_msg(DOC ": %s is in the \"differ on purpose\" table but src/params.def "
				 "declares it (Rail reads it): move its row", differ[i]);
		if (!strncmp(differ[i], "NCCL_IB_", 8) && !in_list(differ[i]))
			fail_msg(DOC ": %s is not a variable of NCCL %s (" LIST ")", differ[i],
				 release);
	}
}

/* Rail declares no NCCL_IB_* name that NCCL does not have: one meaning per name. */
static void test_no_invented_ib_names(void **state)
{
	(void)state;
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		const char *n = rail_param_table[i].name;

		if (!strncmp(n, "NCCL_IB_", 8) && !in_list(n))
			fail_msg("src/params.def declares %s, which NCCL %s does not: Rail's own "
				 "variables are NCCL_RAIL_*", n, release);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_list_is_a_release),
		cmocka_unit_test(test_every_variable_decided),
		cmocka_unit_test(test_differ_rows_are_true),
		cmocka_unit_test(test_no_invented_ib_names),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
