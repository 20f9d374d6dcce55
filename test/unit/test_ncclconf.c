/*
 * nccl-net-rail unit tests: NCCL's configuration files (src/ncclconf.c):
 * the environment wins over the files, the first file over the second,
 * '#' lines and lines without '=' are skipped, nothing is trimmed, a
 * missing file is reported, and the file list follows NCCL_CONF_FILE.
 */
#include "unit.h"

#include <errno.h>
#include <unistd.h>

#include "ncclconf.h"
#include "rail.h"

static char dir[64];

static const char *const vars[] = { "RAIL_T_A", "RAIL_T_B", "RAIL_T_C", "RAIL_T_D", "RAIL_T_E",
				    "RAIL_T_SP ", "RAIL_T_CR" };

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/rail-ncclconf-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(vars); i++)
		unsetenv(vars[i]);
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		print_message("could not remove %s\n", dir);
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(vars); i++)
		unsetenv(vars[i]);
	unsetenv("NCCL_CONF_FILE");
	return 0;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static const struct rail_ncclconf_var *find_var(const struct rail_ncclconf_file *f,
						const char *name, int nth)
{
	for (int i = 0; i < f->nvars; i++)
		if (!strcmp(f->vars[i].name, name) && nth-- == 0)
			return &f->vars[i];
	fail_msg("%s: no line %d for \"%s\"", f->path, nth, name);
	return NULL;
}

static void test_precedence(void **state)
{
	char first[128], second[128];
	const char *paths[2] = { first, second };
	struct rail_ncclconf c;

	(void)state;
	snprintf(first, sizeof(first), "%s/first.conf", dir);
	snprintf(second, sizeof(second), "%s/second.conf", dir);
	write_file(first, "RAIL_T_A=from-first\nRAIL_T_B=from-first\nRAIL_T_C=1\nRAIL_T_C=2\n");
	write_file(second, "RAIL_T_A=from-second\nRAIL_T_B=from-second\nRAIL_T_D=only-second\n");
	setenv("RAIL_T_B", "from-env", 1);

	assert_int_equal(rail_ncclconf_apply(paths, 2, &c), 0);
	assert_int_equal(c.nfiles, 2);
	assert_int_equal(c.files[0].err, 0);
	assert_int_equal(c.files[1].err, 0);
	/* environment > first file > second file; first line > later line */
	assert_string_equal(getenv("RAIL_T_A"), "from-first");
	assert_string_equal(getenv("RAIL_T_B"), "from-env");
	assert_string_equal(getenv("RAIL_T_C"), "1");
	assert_string_equal(getenv("RAIL_T_D"), "only-second");
	assert_int_equal(find_var(&c.files[0], "RAIL_T_A", 0)->state, RAIL_NCCLCONF_APPLIED);
	assert_int_equal(find_var(&c.files[0], "RAIL_T_B", 0)->state, RAIL_NCCLCONF_ENV_WINS);
	assert_int_equal(find_var(&c.files[0], "RAIL_T_C", 0)->state, RAIL_NCCLCONF_APPLIED);
	assert_int_equal(find_var(&c.files[0], "RAIL_T_C", 1)->state, RAIL_NCCLCONF_SHADOWED);
	assert_int_equal(find_var(&c.files[1], "RAIL_T_A", 0)->state, RAIL_NCCLCONF_SHADOWED);
	assert_int_equal(find_var(&c.files[1], "RAIL_T_B", 0)->state, RAIL_NCCLCONF_ENV_WINS);
	assert_int_equal(find_var(&c.files[1], "RAIL_T_D", 0)->state, RAIL_NCCLCONF_APPLIED);
	assert_int_equal(find_var(&c.files[1], "RAIL_T_D", 0)->line, 3);
	assert_string_equal(rail_ncclconf_source(&c, "RAIL_T_A"), first);
	assert_string_equal(rail_ncclconf_source(&c, "RAIL_T_D"), second);
	assert_null(rail_ncclconf_source(&c, "RAIL_T_B"));
	rail_ncclconf_free(&c);
	assert_int_equal(c.nfiles, 0);
}

static void test_syntax(void **state)
{
	char path[128];
	const char *paths[1] = { path };
	struct rail_ncclconf c;

	(void)state;
	snprintf(path, sizeof(path), "%s/syntax.conf", dir);
	/* As NCCL: '#' only in the first column, no trimming, the value runs to
	 * the end of the line and may hold '=', no final newline needed. */
	write_file(path, "# RAIL_T_A=commented\n"
			 "no equals sign here\n"
			 "\n"
			 "  # RAIL_T_E=not a comment\n"
			 "RAIL_T_A=x=y # not a comment\n"
			 "RAIL_T_SP =spaced\n"
			 "=empty name\n"
			 "RAIL_T_CR=dos\r\n"
			 "RAIL_T_B=");
	assert_int_equal(rail_ncclconf_apply(paths, 1, &c), 0);
	assert_int_equal(c.files[0].nvars, 6);
	assert_null(getenv("RAIL_T_E"));
	assert_string_equal(getenv("RAIL_T_A"), "x=y # not a comment");
	assert_string_equal(getenv("RAIL_T_SP "), "spaced");
	assert_string_equal(getenv("RAIL_T_CR"), "dos\r");
	assert_string_equal(getenv("RAIL_T_B"), "");
	assert_string_equal(c.files[0].vars[0].name, "  # RAIL_T_E");
	assert_int_equal(c.files[0].vars[0].odd_space, 1);
	assert_int_equal(find_var(&c.files[0], "RAIL_T_A", 0)->odd_space, 0);
	assert_int_equal(find_var(&c.files[0], "RAIL_T_SP ", 0)->odd_space, 1);
	assert_int_equal(find_var(&c.files[0], "RAIL_T_CR", 0)->odd_space, 1);
	assert_int_equal(find_var(&c.files[0], "", 0)->state, RAIL_NCCLCONF_REJECTED);
	assert_int_equal(find_var(&c.files[0], "RAIL_T_B", 0)->state, RAIL_NCCLCONF_APPLIED);
	rail_ncclconf_free(&c);
	unsetenv("  # RAIL_T_E");
}

static void test_missing_file(void **state)
{
	char path[128], other[128];
	const char *paths[2] = { path, other };
	struct rail_ncclconf c;

	(void)state;
	snprintf(path, sizeof(path), "%s/absent.conf", dir);
	snprintf(other, sizeof(other), "%s/present.conf", dir);
	write_file(other, "RAIL_T_A=1\n");
	assert_int_equal(rail_ncclconf_apply(paths, 2, &c), 0);
	assert_int_equal(c.files[0].err, -ENOENT);
	assert_int_equal(c.files[0].nvars, 0);
	assert_int_equal(c.files[1].err, 0);
	assert_string_equal(getenv("RAIL_T_A"), "1");
	rail_ncclconf_free(&c);
	/* a directory cannot be read as a file */
	paths[0] = dir;
	assert_int_equal(rail_ncclconf_apply(paths, 1, &c), 0);
	assert_int_not_equal(c.files[0].err, 0);
	rail_ncclconf_free(&c);
}

static void test_default_paths(void **state)
{
	char paths[RAIL_NCCLCONF_MAX_FILES][PATH_MAX];
	int n;

	(void)state;
	setenv("NCCL_CONF_FILE", "/some/where.conf", 1);
	n = rail_ncclconf_default_paths(paths, RAIL_NCCLCONF_MAX_FILES);
	assert_int_equal(n, 2);
	assert_string_equal(paths[0], "/some/where.conf");
	assert_string_equal(paths[1], "/etc/nccl.conf");
	/* empty counts as unset: then the home directory's .nccl.conf */
	setenv("NCCL_CONF_FILE", "", 1);
	n = rail_ncclconf_default_paths(paths, RAIL_NCCLCONF_MAX_FILES);
	assert_in_range(n, 1, 2);
	if (n == 2) {
		size_t l = strlen(paths[0]);

		assert_true(l > 11 && !strcmp(paths[0] + l - 11, "/.nccl.conf"));
	}
	assert_string_equal(paths[n - 1], "/etc/nccl.conf");
	assert_int_equal(rail_ncclconf_default_paths(paths, 1), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_precedence, setup, teardown),
		cmocka_unit_test_setup_teardown(test_syntax, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_default_paths, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
