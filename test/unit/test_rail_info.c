/*
 * nccl-net-rail unit tests: rail-info as a gate (build/rail-info run as a
 * program). Each exit status is produced and asserted: 0 ready, 1 usable
 * with warnings, 2 not usable, 64 bad command line; --check prints one
 * line per problem or one OK line; --version; NCCL's configuration files
 * are applied (the environment wins); --plugin finds the built .so with
 * its version and ABIs v6..v12, and a missing name fails with the loader's
 * error; the JSON parses with python3's json.loads and has "schema": 1.
 *
 * Every run starts from a known environment: the variables that decide
 * the outcome are unset or set on the command line, NCCL_CONF_FILE points
 * at /dev/null (or a test file), and the sysfs root is an empty directory
 * so the host's GPUs and NICs add no topology advice. Skipped, saying why,
 * when build/rail-info or the plugin is not built.
 */
#include "unit.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ifaces.h"
#include "rail.h"
#include "test_topo_json.h"

static char rail_info[PATH_MAX];
static char build_dir[PATH_MAX];
static char plugin[PATH_MAX];
static char tmp[64];
static char root[96];

#define BASE_ENV                                                                              \
	"env -u NCCL_NET_PLUGIN -u NCCL_SOCKET_IFNAME -u NCCL_SOCKET_FAMILY "                 \
	"-u NCCL_RAIL_TRANSPORT -u NCCL_IB_HCA -u NCCL_IB_DISABLE -u NCCL_DEBUG "             \
	"-u NCCL_RAIL_GPU_NIC_MAP -u NCCL_RAIL_SYSFS_ROOT "

struct result {
	int rc;
	char *out;
};

static struct result run(const char *env, const char *args)
{
	char *cmd;
	struct result r = { 0, NULL };
	size_t len = 0, cap = 0;
	FILE *p;
	int c;

	if (asprintf(&cmd, BASE_ENV "LD_LIBRARY_PATH=%s %s %s %s --sysfs-root %s %s 2>/dev/null",
		     build_dir, strstr(env, "NCCL_CONF_FILE=") ? "" : "NCCL_CONF_FILE=/dev/null",
		     env, rail_info, root, args) < 0)
		fail_msg("asprintf: out of memory");
	p = popen(cmd, "r");
	if (!p)
		fail_msg("popen %s: %s", cmd, strerror(errno));
	while ((c = fgetc(p)) != EOF) {
		if (len + 2 > cap) {
			char *nb = realloc(r.out, cap = cap ? cap * 2 : 4096);

			assert_non_null(nb);
			r.out = nb;
		}
		r.out[len++] = (char)c;
	}
	c = pclose(p);
	free(cmd);
	r.rc = WIFEXITED(c) ? WEXITSTATUS(c) : 128;
	if (!r.out)
		r.out = calloc(1, 1);
	else
		r.out[len] = '\0';
	return r;
}

static void expect_rc(const struct result *r, int want, const char *what)
{
	if (r->rc != want)
		fail_msg("%s: rail-info exited %d, expected %d; it printed:\n%s", what, r->rc, want,
			 r->out);
}

/* --check: every line is "OK: ", "WARN: " or "ERROR: "; OK only alone. */
static int check_lines(const char *out, int *nwarn, int *nerr)
{
	int lines = 0, ok = 0;

	*nwarn = *nerr = 0;
	for (const char *l = out; *l; lines++) {
		const char *nl = strchr(l, '\n');

		if (!strncmp(l, "OK: ", 4))
			ok++;
		else if (!strncmp(l, "WARN: ", 6))
			(*nwarn)++;
		else if (!strncmp(l, "ERROR: ", 7))
			(*nerr)++;
		else
			fail_msg("--check printed a line that is not OK:/WARN:/ERROR:\n%s", out);
		if (!nl)
			fail_msg("--check output does not end with a newline:\n%s", out);
		l = nl + 1;
	}
	if (ok && lines != 1)
		fail_msg("--check printed OK next to other lines:\n%s", out);
	return ok;
}

static void need_built(void)
{
	if (access(rail_info, X_OK)) {
		print_message("SKIP: %s not built (make tools); rail-info gate checks skipped\n",
			      rail_info);
		skip();
	}
	if (access(plugin, R_OK)) {
		print_message("SKIP: %s not built (make plugin); rail-info gate checks skipped\n",
			      plugin);
		skip();
	}
}

/* An interface the default rule picks that is not loopback, or skip. */
static void non_loopback_iface(char *name, size_t len)
{
	struct rail_iface ifs[RAIL_MAX_IFACES];
	int n;

	unsetenv("NCCL_SOCKET_IFNAME");
	unsetenv("NCCL_SOCKET_FAMILY");
	n = rail_ifaces_find_spec("^docker,lo,virbr", AF_UNSPEC, ifs, RAIL_MAX_IFACES);
	for (int i = 0; i < n; i++)
		if (!ifs[i].loopback) {
			rail_strlcpy(name, ifs[i].name, len);
			return;
		}
	print_message("SKIP: no non-loopback interface is up here; the 'ready' case needs one\n");
	skip();
}

static void test_version_and_usage(void **state)
{
	struct result r;
	char want[128];

	(void)state;
	need_built();
	r = run("", "--version");
	expect_rc(&r, 0, "--version");
	snprintf(want, sizeof(want), "rail-info (nccl-net-rail) %s\n", RAIL_VERSION_STRING);
	assert_string_equal(r.out, want);
	free(r.out);
	{
		static const char *const bad[] = { "--no-such-option", "extra-argument",
						   "--markdown", "--check --json", "--plugin" };

		for (size_t i = 0; i < RAIL_ARRAY_SIZE(bad); i++) {
			r = run("", bad[i]);
			expect_rc(&r, 64, bad[i]);
			free(r.out);
		}
	}
}

static void test_ready(void **state)
{
	char iface[IF_NAMESIZE], env[256], want[PATH_MAX + 64];
	struct result r;
	int nwarn, nerr;

	(void)state;
	need_built();
	non_loopback_iface(iface, sizeof(iface));
	snprintf(env, sizeof(env), "NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME==%s", iface);
	r = run(env, "--plugin rail --check");
	expect_rc(&r, 0, "tcp on a real interface, --plugin rail");
	assert_int_equal(check_lines(r.out, &nwarn, &nerr), 1);
	assert_non_null(strstr(r.out, "transport tcp, 1 device"));
	snprintf(want, sizeof(want), "NCCL loads %s (nccl-net-rail %s)", plugin,
		 RAIL_VERSION_STRING);
	if (!strstr(r.out, want))
		fail_msg("OK line does not name %s:\n%s", want, r.out);
	free(r.out);
	/* the plain report and --json say the same */
	r = run(env, "--plugin rail");
	expect_rc(&r, 0, "plain report");
	assert_non_null(strstr(r.out, "Status: ready (exit 0): no problems found"));
	free(r.out);
	r = run(env, "--plugin rail --json");
	expect_rc(&r, 0, "--json");
	assert_non_null(strstr(r.out, "\"status\": \"ready\", \"exit_code\": 0"));
	free(r.out);
}

static void test_warnings(void **state)
{
	struct result r;
	int nwarn, nerr;

	(void)state;
	need_built();
	/* loopback only: works on one host, not across hosts */
	r = run("NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME=lo", "--plugin rail --check");
	expect_rc(&r, 1, "tcp on lo");
	assert_int_equal(check_lines(r.out, &nwarn, &nerr), 0);
	assert_int_equal(nwarn, 1);
	assert_int_equal(nerr, 0);
	assert_non_null(strstr(r.out, "WARN: the only network interface selected is loopback (lo)"));
	assert_non_null(strstr(r.out, "set NCCL_SOCKET_IFNAME"));
	free(r.out);
	/* NCCL_NET_PLUGIN=none: NCCL would not use the plugin */
	r = run("NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME=lo NCCL_NET_PLUGIN=none", "--check");
	expect_rc(&r, 1, "NCCL_NET_PLUGIN=none");
	assert_non_null(strstr(r.out, "WARN: NCCL_NET_PLUGIN=none: NCCL loads no external"));
	free(r.out);
	/* a bad value is a warning too (the default is used) */
	r = run("NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME=lo NCCL_IB_TIMEOUT=abc",
		"--plugin rail --check");
	expect_rc(&r, 1, "NCCL_IB_TIMEOUT=abc");
	assert_non_null(strstr(r.out, "WARN: NCCL_IB_TIMEOUT=\"abc\" is not valid"));
	free(r.out);
}

static void test_not_usable(void **state)
{
	struct result r;
	int nwarn, nerr;

	(void)state;
	need_built();
	/* verbs forced, and no device can match: no transport */
	r = run("NCCL_RAIL_TRANSPORT=ib NCCL_IB_HCA==rail_no_such_hca", "--plugin rail --check");
	expect_rc(&r, 2, "NCCL_RAIL_TRANSPORT=ib without a device");
	check_lines(r.out, &nwarn, &nerr);
	assert_int_equal(nerr, 1);
	assert_non_null(strstr(r.out, "ERROR: no transport is usable"));
	free(r.out);
	r = run("NCCL_RAIL_TRANSPORT=ib NCCL_IB_HCA==rail_no_such_hca", "--plugin rail --json");
	expect_rc(&r, 2, "--json, no transport");
	assert_non_null(strstr(r.out, "\"status\": \"not_usable\", \"exit_code\": 2"));
	free(r.out);
	/* a plugin that is not there: the loader's words and the remedy */
	r = run("NCCL_RAIL_TRANSPORT=tcp", "--plugin rail_no_such_plugin --check");
	expect_rc(&r, 2, "--plugin rail_no_such_plugin");
	check_lines(r.out, &nwarn, &nerr);
	assert_int_equal(nerr, 1);
	if (!strstr(r.out, "libnccl-net-rail_no_such_plugin.so: cannot open shared object file") ||
	    !strstr(r.out, "LD_LIBRARY_PATH") || !strstr(r.out, "ldconfig"))
		fail_msg("no dlerror or remedy in:\n%s", r.out);
	free(r.out);
}

static void test_plugin_path(void **state)
{
	char args[PATH_MAX + 32];
	const struct tj *np, *c, *abis;
	struct result r;
	const char *err;
	struct tj doc;
	long at;

	(void)state;
	need_built();
	snprintf(args, sizeof(args), "--plugin %s --json", plugin);
	r = run("NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME=lo", args);
	expect_rc(&r, 1, "--plugin PATH (path form and loopback warnings)");
	if (tj_parse(r.out, &doc, &err, &at))
		fail_msg("invalid JSON: %s at %ld", err, at);
	np = tj_get(&doc, "net_plugin");
	assert_non_null(np);
	assert_string_equal(tj_str(np, "source"), "option");
	assert_string_equal(tj_str(np, "path"), plugin);
	assert_string_equal(tj_str(np, "rail_version"), RAIL_VERSION_STRING);
	c = &tj_get(np, "candidates")->items[0];
	assert_string_equal(tj_str(c, "table_name"), "Rail");
	assert_int_equal(tj_get(c, "is_path")->num, 1);
	abis = tj_get(c, "abi_versions");
	assert_int_equal(abis->n, 7);
	for (int i = 0; i < 7; i++)
		assert_int_equal((int)abis->items[i].num, 6 + i);
	abis = tj_get(c, "tuner_abi_versions");
	assert_int_equal(abis->n, 4);
	for (int i = 0; i < 4; i++)
		assert_int_equal((int)abis->items[i].num, 3 + i);
	assert_non_null(strstr(r.out, "is a path: NCCL before 2.21 accepts only a name"));
	tj_free(&doc);
	free(r.out);
	/* the name form: "rail" fails as is, then libnccl-net-rail.so loads */
	r = run("NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME=lo NCCL_NET_PLUGIN=rail", "--json");
	expect_rc(&r, 1, "NCCL_NET_PLUGIN=rail");
	if (tj_parse(r.out, &doc, &err, &at))
		fail_msg("invalid JSON: %s at %ld", err, at);
	np = tj_get(&doc, "net_plugin");
	assert_string_equal(tj_str(np, "source"), "environment");
	c = &tj_get(np, "candidates")->items[0];
	assert_int_equal(tj_get(c, "tried")->n, 2);
	assert_string_equal(tj_str(&tj_get(c, "tried")->items[1], "name"), "libnccl-net-rail.so");
	assert_non_null(tj_str(&tj_get(c, "tried")->items[0], "error"));
	assert_int_equal(tj_get(&tj_get(c, "tried")->items[1], "error")->type, TJ_NULL);
	assert_string_equal(tj_str(np, "path"), plugin);
	tj_free(&doc);
	free(r.out);
}

static const struct tj *param(const struct tj *doc, const char *name)
{
	const struct tj *ps = tj_get(doc, "parameters");

	for (int i = 0; ps && i < ps->n; i++)
		if (!strcmp(tj_str(&ps->items[i], "name"), name))
			return &ps->items[i];
	fail_msg("no parameter %s in the JSON", name);
	return NULL;
}

static void test_conf_files(void **state)
{
	char conf[128], env[512];
	const struct tj *files, *vars;
	struct result r;
	const char *err;
	struct tj doc;
	long at;
	FILE *f;

	(void)state;
	need_built();
	snprintf(conf, sizeof(conf), "%s/nccl.conf", tmp);
	f = fopen(conf, "w");
	assert_non_null(f);
	fprintf(f, "# a comment\nNCCL_RAIL_TCP_SPIN_US=77\nNCCL_IB_TIMEOUT=9\n"
		   "NCCL_SOCKET_IFNAME=lo\nNCCL_NET_PLUGIN=rail\n");
	fclose(f);
	/* the file's lo is applied before the transport reads it: a warning */
	snprintf(env, sizeof(env), "NCCL_CONF_FILE=%s NCCL_RAIL_TRANSPORT=tcp NCCL_IB_TIMEOUT=21",
		 conf);
	r = run(env, "--json");
	expect_rc(&r, 1, "NCCL_SOCKET_IFNAME=lo from the file");
	if (tj_parse(r.out, &doc, &err, &at))
		fail_msg("invalid JSON: %s at %ld", err, at);
	assert_string_equal(tj_str(param(&doc, "NCCL_RAIL_TCP_SPIN_US"), "value"), "77");
	assert_int_equal(tj_get(param(&doc, "NCCL_RAIL_TCP_SPIN_US"), "set")->type, TJ_BOOL);
	assert_int_equal(tj_get(param(&doc, "NCCL_RAIL_TCP_SPIN_US"), "set")->num, 1);
	assert_string_equal(tj_str(param(&doc, "NCCL_IB_TIMEOUT"), "value"), "21"); /* env wins */
	assert_string_equal(tj_str(tj_get(&doc, "net_plugin"), "source"), "conf_file");
	assert_string_equal(tj_str(tj_get(&doc, "net_plugin"), "conf_file"), conf);
	files = tj_get(&doc, "nccl_conf_files");
	assert_true(files->n >= 1);
	assert_string_equal(tj_str(&files->items[0], "path"), conf);
	vars = tj_get(&files->items[0], "variables");
	assert_int_equal(vars->n, 4);
	assert_string_equal(tj_str(&vars->items[0], "effect"), "applied");
	assert_int_equal((int)tj_get(&vars->items[0], "line")->num, 2);
	assert_string_equal(tj_str(&vars->items[1], "name"), "NCCL_IB_TIMEOUT");
	assert_string_equal(tj_str(&vars->items[1], "effect"), "environment_wins");
	assert_non_null(strstr(r.out, "the only network interface selected is loopback"));
	tj_free(&doc);
	free(r.out);
	/* the plain report says which file set what */
	r = run(env, "");
	expect_rc(&r, 1, "plain report with a configuration file");
	assert_non_null(strstr(r.out, "line 2: NCCL_RAIL_TCP_SPIN_US=77 (applied)"));
	assert_non_null(strstr(r.out, "line 3: NCCL_IB_TIMEOUT=9 (ignored: the environment sets it)"));
	assert_non_null(strstr(r.out, "NCCL_RAIL_TCP_SPIN_US=77 ("));
	assert_non_null(strstr(r.out, "NCCL_IB_TIMEOUT=21 (environment)"));
	free(r.out);
}

/* No contradictory or empty lines in the plain report. */
static void test_text_consistent(void **state)
{
	static const char *const never[] = { "Advice: none", "set here:\n", "GID table:\n\n",
					     "Network interfaces:\n\n", ":\n\nStatus" };
	struct result r;

	(void)state;
	need_built();
	r = run("NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME=lo", "--plugin rail");
	expect_rc(&r, 1, "plain report");
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(never); i++)
		if (strstr(r.out, never[i]))
			fail_msg("the report contains \"%s\":\n%s", never[i], r.out);
	assert_null(strstr(r.out, "\n\n\n"));
	assert_non_null(strstr(r.out, "Problems:\n  WARN  transport: the only network interface"));
	assert_non_null(strstr(r.out, "Status: usable with warnings (exit 1)\n"));
	free(r.out);
}

static void test_json_python(void **state)
{
	static const char *const py =
		"import json, sys\n"
		"d = json.loads(sys.stdin.read())\n"
		"assert type(d['schema']) is int and d['schema'] == 1, d.get('schema')\n"
		"assert d['exit_code'] == int(sys.argv[1]), d['exit_code']\n"
		"assert d['status'] == sys.argv[2], d['status']\n"
		"assert all(p['severity'] in ('warning', 'error') for p in d['problems'])\n"
		"assert 'version' not in d and 'ib' not in d and 'config' not in d\n";
	static const struct {
		const char *env;
		int rc;
		const char *status;
	} cases[] = {
		{ "NCCL_RAIL_TRANSPORT=tcp NCCL_SOCKET_IFNAME=lo", 1, "usable_with_warnings" },
		{ "NCCL_RAIL_TRANSPORT=ib NCCL_IB_HCA==rail_no_such_hca", 2, "not_usable" },
	};
	char pyfile[128], args[256];
	FILE *f;

	(void)state;
	need_built();
	if (system("python3 -c '' >/dev/null 2>&1")) {
		print_message("SKIP: python3 not found; json.loads check skipped\n");
		skip();
	}
	snprintf(pyfile, sizeof(pyfile), "%s/check.py", tmp);
	f = fopen(pyfile, "w");
	assert_non_null(f);
	fputs(py, f);
	fclose(f);
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(cases); i++) {
		struct result r;

		snprintf(args, sizeof(args), "--plugin rail --json | python3 %s %d %s", pyfile,
			 cases[i].rc, cases[i].status);
		r = run(cases[i].env, args);
		expect_rc(&r, 0, "python3 json.loads check");
		free(r.out);
	}
}

static int group_setup(void **state)
{
	(void)state;
	snprintf(tmp, sizeof(tmp), "/tmp/rail-info-test-XXXXXX");
	if (!mkdtemp(tmp))
		return -1;
	snprintf(root, sizeof(root), "%s/root", tmp);
	if (mkdir(root, 0755))
		return -1;
	snprintf(root, sizeof(root), "%s/root/sys", tmp);
	if (mkdir(root, 0755))
		return -1;
	snprintf(root, sizeof(root), "%s/root", tmp);
	return 0;
}

static int group_teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	return system(cmd) ? -1 : 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_version_and_usage),
		cmocka_unit_test(test_ready),
		cmocka_unit_test(test_warnings),
		cmocka_unit_test(test_not_usable),
		cmocka_unit_test(test_plugin_path),
		cmocka_unit_test(test_conf_files),
		cmocka_unit_test(test_text_consistent),
		cmocka_unit_test(test_json_python),
	};
	/* build/test/unit/test_rail_info -> build/ */
	(void)argc;
	unit_build_dir(argv[0], build_dir, sizeof(build_dir));
	snprintf(rail_info, sizeof(rail_info), "%.*s/rail-info", PATH_MAX - 16, build_dir);
	snprintf(plugin, sizeof(plugin), "%.*s/libnccl-net-rail.so", PATH_MAX - 32, build_dir);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
