/*
 * nccl-net-rail unit tests: sysfs snapshots (src/sysfs.c recording) read back
 * to the same answer, on every fixture and on this machine's /sys; the
 * topology JSON is valid; rail-info --json / --config / --snapshot work
 * (skipped, saying so, when build/rail-info has not been built).
 */
#include "unit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ncclconf.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"
#include "test_topo_json.h"
#include "topo/topo.h"

#define FX "test/fixtures/"

static const char *const fixtures[] = { "dgx-h100", "dgx-a100", "b200-dualport", "sriov-v100",
					"azure-ndv5", "roce-h100", "gcp-a3", "gid-roce", "h200-vm" };

static char rail_info[512];

static int setup(void **state)
{
	(void)state;
	unsetenv("NCCL_RAIL_GPU_NIC_MAP");
	unsetenv("NCCL_IB_HCA");
	rail_params_reload();
	unit_log_capture();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unit_log_release();
	rail_sysfs_record_stop();
	rail_sysfs_set_root("");
	return 0;
}

static void make_tmp(char *dir, size_t len)
{
	snprintf(dir, len, "/tmp/rail-snap-XXXXXX");
	if (!mkdtemp(dir))
		fail_msg("mkdtemp: %s", strerror(errno));
}

static void remove_tree(const char *dir)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		print_message("could not remove %s\n", dir);
}

/* The model as JSON, with the sysfs root blanked out (it differs by design). */
static char *model_json(const char *extra)
{
	struct rail_topo *t = NULL;
	char *buf = NULL, *p, *q;
	size_t len = 0;
	FILE *f;
	int err = rail_topo_build(extra, &t);

	if (err)
		fail_msg("rail_topo_build under %s: %s", rail_sysfs_root(), RAIL_ERRSTR(err));
	f = open_memstream(&buf, &len);
	assert_non_null(f);
	rail_topo_print(t, f, 1);
	fclose(f);
	rail_topo_free(t);
	p = strstr(buf, "\"sysfs_root\": \"");
	assert_non_null(p);
	p += strlen("\"sysfs_root\": \"");
	q = strchr(p, '"');
	memmove(p, q, strlen(q) + 1);
	return buf;
}

static void first_difference(const char *a, const char *b)
{
	size_t i = 0;

	while (a[i] && a[i] == b[i])
		i++;
	print_message("first difference at %zu:\n--- original: %.200s\n--- snapshot: %.200s\n", i,
		      a + (i > 80 ? i - 80 : 0), b + (i > 80 ? i - 80 : 0));
}

/* Record while building from root, then build from the snapshot. */
static void round_trip(const char *root)
{
	char dir[64], *a, *b;

	make_tmp(dir, sizeof(dir));
	rail_sysfs_set_root(root);
	assert_int_equal(rail_sysfs_record_start(dir), 0);
	a = model_json(NULL);
	rail_sysfs_record_stop();
	rail_sysfs_set_root(dir);
	b = model_json(NULL);
	if (strcmp(a, b)) {
		first_difference(a, b);
		fail_msg("snapshot of %s in %s reads back differently", root[0] ? root : "/", dir);
	}
	free(a);
	free(b);
	remove_tree(dir);
}

static void test_round_trip_fixtures(void **state)
{
	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(fixtures); i++) {
		char root[128];

		snprintf(root, sizeof(root), FX "%s", fixtures[i]);
		round_trip(root);
	}
}

static void test_round_trip_live(void **state)
{
	(void)state;
	round_trip("");
}

/* Symlinks stay relative; unreadable files stay unreadable; missing stays missing. */
static void test_snapshot_details(void **state)
{
	const char *port = "/sys/class/infiniband/mlx5_0/ports/1";
	char dir[64], path[256], target[256], buf[64];
	struct stat st;
	ssize_t n;

	(void)state;
	make_tmp(dir, sizeof(dir));
	rail_sysfs_set_root(FX "roce-h100");
	assert_int_equal(rail_sysfs_record_start(dir), 0);
	snprintf(path, sizeof(path), "%s/gid_attrs/types/3", port);
	assert_true(rail_sysfs_read(path, buf, sizeof(buf)) > 0);
	snprintf(path, sizeof(path), "%s/gid_attrs/types/6", port);
	assert_true(rail_sysfs_read(path, buf, sizeof(buf)) < 0); /* a directory in the fixture */
	snprintf(path, sizeof(path), "%s/gid_attrs/ndevs/6", port);
	assert_int_equal(rail_sysfs_read(path, buf, sizeof(buf)), -ENOENT); /* dangling link */
	snprintf(path, sizeof(path), "%s/gid_attrs/types/7", port);
	assert_int_equal(rail_sysfs_read(path, buf, sizeof(buf)), -ENOENT);
	rail_sysfs_record_stop();

	snprintf(path, sizeof(path), "%s/sys/class/infiniband/mlx5_0", dir);
	n = readlink(path, target, sizeof(target) - 1);
	assert_true(n > 0);
	target[n] = '\0';
	assert_int_equal(strncmp(target, "../../devices/pci0000:15/", 25), 0);

	rail_sysfs_set_root(dir);
	snprintf(path, sizeof(path), "%s/gid_attrs/types/3", port);
	assert_true(rail_sysfs_read(path, buf, sizeof(buf)) > 0);
	assert_string_equal(buf, "RoCE v2");
	snprintf(path, sizeof(path), "%s/gid_attrs/types/6", port);
	assert_true(rail_sysfs_read(path, buf, sizeof(buf)) < 0);
	snprintf(path, sizeof(path), "%s/gid_attrs/types/7", port);
	assert_int_equal(rail_sysfs_read(path, buf, sizeof(buf)), -ENOENT);
	snprintf(path, sizeof(path), "%s/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/"
		 "0000:17:00.0/0000:18:00.0/infiniband/mlx5_0/ports/1/gid_attrs/types/6", dir);
	assert_int_equal(stat(path, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	remove_tree(dir);
}

/* ---- JSON ------------------------------------------------------------------ */

/* rail-info's top-level keys (README "rail-info as a gate"), and its exit code. */
static void check_report_keys(const char *what, const struct tj *doc, int rc)
{
	static const char *const keys[] = { "schema", "rail_info_version", "abi_versions",
					    "status", "exit_code", "problems", "nccl_conf_files",
					    "net_plugin", "transport", "verbs", "numa_nodes",
					    "parameters", "topology" };
	const struct tj *schema = tj_get(doc, "schema"), *code = tj_get(doc, "exit_code");

	for (size_t k = 0; k < RAIL_ARRAY_SIZE(keys); k++)
		if (!tj_get(doc, keys[k]))
			fail_msg("%s: rail-info key \"%s\" missing", what, keys[k]);
	if (schema->type != TJ_NUM || schema->num != 1)
		fail_msg("%s: \"schema\" is not the integer 1", what);
	if (code->type != TJ_NUM || (int)code->num != rc)
		fail_msg("%s: exited %d but \"exit_code\" says %g", what, rc, code->num);
}

/* report_rc: -1 for the topology model's JSON, else rail-info's exit code. */
static void check_doc(const char *what, const char *text, int report_rc)
{
	static const char *const gpu_keys[] = { "bdf", "numa", "locality", "reason", "nics" };
	static const char *const nic_keys[] = { "name", "port", "relation" };
	const struct tj *gpus, *devs, *topo;
	const char *err;
	struct tj doc;
	long at;

	if (tj_parse(text, &doc, &err, &at))
		fail_msg("%s: invalid JSON: %s at offset %ld: %.80s", what, err, at, text + at);
	topo = &doc;
	if (report_rc >= 0) {
		check_report_keys(what, &doc, report_rc);
		topo = tj_get(&doc, "topology");
	}
	gpus = tj_get(topo, "gpus");
	devs = tj_get(topo, "rdma_devices");
	if (!gpus || gpus->type != TJ_ARR || !devs || devs->type != TJ_ARR)
		fail_msg("%s: no \"gpus\" and \"rdma_devices\" arrays", what);
	for (int g = 0; g < gpus->n; g++) {
		const struct tj *nics = tj_get(&gpus->items[g], "nics");
		const char *loc = tj_str(&gpus->items[g], "locality");

		for (size_t k = 0; k < RAIL_ARRAY_SIZE(gpu_keys); k++)
			if (!tj_get(&gpus->items[g], gpu_keys[k]))
				fail_msg("%s: GPU %d has no \"%s\"", what, g, gpu_keys[k]);
		if (strcmp(loc, "pcie") && strcmp(loc, "numa") && strcmp(loc, "none"))
			fail_msg("%s: locality \"%s\"", what, loc);
		for (int n = 0; n < nics->n; n++)
			for (size_t k = 0; k < RAIL_ARRAY_SIZE(nic_keys); k++)
				if (!tj_get(&nics->items[n], nic_keys[k]))
					fail_msg("%s: GPU %d NIC %d has no \"%s\"", what, g, n,
						 nic_keys[k]);
	}
	tj_free(&doc);
}

static void test_model_json_valid(void **state)
{
	(void)state;
	setenv("NCCL_RAIL_GPU_NIC_MAP", "0=mlx5_ib3;1=nothing\"quoted", 1);
	rail_params_reload();
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(fixtures); i++) {
		char root[128], *text;

		snprintf(root, sizeof(root), FX "%s", fixtures[i]);
		rail_sysfs_set_root(root);
		text = model_json(NULL);
		check_doc(root, text, -1);
		free(text);
	}
	/* the mini parser really rejects broken documents */
	{
		struct tj v;
		const char *err;
		long at;

		assert_int_equal(tj_parse("{\"a\": [1, 2,]}", &v, &err, &at), -1);
		assert_int_equal(tj_parse("{\"a\": \"x\ny\"}", &v, &err, &at), -1);
		assert_int_equal(tj_parse("{} {}", &v, &err, &at), -1);
	}
}

/* ---- rail-info -------------------------------------------------------------- */

/*
 * The command's standard output. rail-info's reports exit 0, 1 or 2 by
 * readiness; *rc gets the status, and anything else (a crash, 64) fails.
 * With rc NULL only 0 is accepted.
 */
static char *run_rc(const char *cmd, int *rc_out)
{
	FILE *p = popen(cmd, "r");
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int c, rc;

	if (!p)
		fail_msg("popen %s: %s", cmd, strerror(errno));
	while ((c = fgetc(p)) != EOF) {
		if (len + 2 > cap) {
			char *nb = realloc(buf, cap = cap ? cap * 2 : 4096);

			assert_non_null(nb);
			buf = nb;
		}
		buf[len++] = (char)c;
	}
	rc = pclose(p);
	rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
	if (rc_out ? rc > 2 : rc != 0)
		fail_msg("%s exited with %d", cmd, rc);
	if (rc_out)
		*rc_out = rc;
	if (!buf)
		buf = calloc(1, 1);
	else
		buf[len] = '\0';
	return buf;
}

static char *run(const char *cmd)
{
	return run_rc(cmd, NULL);
}

static void need_rail_info(void)
{
	char lib[sizeof(rail_info) + 32];
	struct stat tool, core;

	if (access(rail_info, X_OK)) {
		print_message("SKIP: %s not built (make %s); rail-info checks skipped\n", rail_info,
			      rail_info);
		skip();
	}
	/* rail-info must come from the same core library as this test */
	snprintf(lib, sizeof(lib), "%.*s/librail-core.a",
		 (int)(strrchr(rail_info, '/') ? strrchr(rail_info, '/') - rail_info : 1),
		 strrchr(rail_info, '/') ? rail_info : ".");
	if (!stat(rail_info, &tool) && !stat(lib, &core) && tool.st_mtime < core.st_mtime) {
		print_message("SKIP: %s is older than %s (make %s); rail-info checks skipped\n",
			      rail_info, lib, rail_info);
		skip();
	}
}

static void test_rail_info_json(void **state)
{
	char cmd[1024];
	int python = system("python3 -c '' >/dev/null 2>&1") == 0;

	(void)state;
	need_rail_info();
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(fixtures); i++) {
		char *out;

		int rc;

		snprintf(cmd, sizeof(cmd), "%s --sysfs-root " FX "%s --json", rail_info, fixtures[i]);
		out = run_rc(cmd, &rc);
		check_doc(cmd, out, rc);
		free(out);
		if (python) {
			snprintf(cmd, sizeof(cmd), "%s --sysfs-root " FX "%s --json | "
				 "python3 -m json.tool >/dev/null", rail_info, fixtures[i]);
			if (system(cmd))
				fail_msg("python3 -m json.tool rejects: %s", cmd);
		}
	}
	snprintf(cmd, sizeof(cmd), "%s --json", rail_info); /* this machine */
	{
		int rc;
		char *out = run_rc(cmd, &rc);

		check_doc(cmd, out, rc);
		free(out);
	}
}

static void test_rail_info_config(void **state)
{
	static const char *const formats[] = { "text", "markdown", "json" };
	static const char *const flags[] = { "--config", "--config --markdown", "--config --json" };
	char paths[RAIL_NCCLCONF_MAX_FILES][PATH_MAX];
	const char *list[RAIL_NCCLCONF_MAX_FILES];
	struct rail_ncclconf conf;
	int n;

	(void)state;
	need_rail_info();
	/* rail-info applies NCCL's configuration files first: do the same here */
	n = rail_ncclconf_default_paths(paths, RAIL_NCCLCONF_MAX_FILES);
	for (int i = 0; i < n; i++)
		list[i] = paths[i];
	assert_int_equal(rail_ncclconf_apply(list, n, &conf), 0);
	rail_ncclconf_free(&conf);
	rail_params_reload();
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(formats); i++) {
		char cmd[600], *out, *want = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&want, &len);

		rail_params_print(f, formats[i]);
		fclose(f);
		snprintf(cmd, sizeof(cmd), "env -u NCCL_RAIL_GPU_NIC_MAP %s %s", rail_info, flags[i]);
		out = run(cmd);
		if (strcmp(out, want))
			fail_msg("rail-info %s differs from rail_params_print(\"%s\")", flags[i],
				 formats[i]);
		free(out);
		free(want);
	}
}

/* rail-info --snapshot, read back with --sysfs-root, prints the same. */
static void test_rail_info_snapshot(void **state)
{
	static const char *const roots[] = { FX "roce-h100", FX "azure-ndv5", "/" };
	char dir[64], cmd[1024];
	int rc;

	(void)state;
	need_rail_info();
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(roots); i++) {
		char *a, *b, *p;

		make_tmp(dir, sizeof(dir));
		snprintf(cmd, sizeof(cmd), "%s --sysfs-root %s --snapshot %s/snap --no-transport "
			 "2>/dev/null", rail_info, roots[i], dir);
		a = run_rc(cmd, &rc);
		snprintf(cmd, sizeof(cmd), "%s --sysfs-root %s/snap --no-transport", rail_info, dir);
		b = run_rc(cmd, &rc);
		/* only the root line may differ */
		p = strstr(a, "Topology (sysfs root ");
		assert_non_null(p);
		if (strcmp(strchr(p, ')'), strchr(strstr(b, "Topology (sysfs root "), ')'))) {
			first_difference(strchr(p, ')'), strchr(strstr(b, "Topology (sysfs root "), ')'));
			fail_msg("rail-info on the snapshot of %s differs", roots[i]);
		}
		free(a);
		free(b);
		remove_tree(dir);
	}
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_round_trip_fixtures, setup, teardown),
		cmocka_unit_test_setup_teardown(test_round_trip_live, setup, teardown),
		cmocka_unit_test_setup_teardown(test_snapshot_details, setup, teardown),
		cmocka_unit_test_setup_teardown(test_model_json_valid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rail_info_json, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rail_info_config, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rail_info_snapshot, setup, teardown),
	};
	char *slash;

	/* build/test/unit/test_topo_snapshot -> build/rail-info */
	(void)argc;
	snprintf(rail_info, sizeof(rail_info), "%s", argv[0]);
	for (int up = 0; up < 3 && (slash = strrchr(rail_info, '/')); up++)
		*slash = '\0';
	if (strrchr(argv[0], '/') && strlen(rail_info) + 12 < sizeof(rail_info))
		strcat(rail_info, "/rail-info");
	else
		snprintf(rail_info, sizeof(rail_info), "build/rail-info");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
