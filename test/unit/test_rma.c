/*
 * nccl-net-rail unit tests: one-sided RMA through the exported table.
 *
 * The built plugin is loaded with dlopen and ncclRmaPlugin_v14 looked up,
 * as NCCL 2.30.7 does; nothing of the core is linked. Ranks are threads of
 * this process over loopback TCP (NCCL_RAIL_TRANSPORT=tcp,
 * NCCL_SOCKET_IFNAME=lo), each with its own contexts, collComm and windows,
 * as NCCL's communicators in one process are.
 * Skips, saying why, when the plugin is not built.
 */
#include "unit.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "rma_v14.h"

static char plugin[PATH_MAX];
static void *lib;
static ncclRma_v14_t *rma;

/* ---- the tests ------------------------------------------------------------- */

static void test_exported(void **state)
{
	(void)state;
	assert_non_null(rma);
	assert_string_equal(rma->name, "Rail");
	/* Every slot NCCL calls without checking is set. */
	assert_non_null(rma->init);
	assert_non_null(rma->finalize);
	assert_non_null(rma->iput);
	assert_non_null(rma->iputSignal);
	assert_non_null(rma->iget);
	assert_non_null(rma->test);
}

/* NCCL_RAIL_RMA=0: init declines (NCCL moves on to its own backend), saying why. */
static void test_off_declines(void **state)
{
	void *ctx = NULL;

	(void)state;
	setenv("NCCL_RAIL_RMA", "0", 1);
	unit_log_reset();
	assert_int_not_equal(rma->init(&ctx, 1, unit_log_sink), ncclSuccess);
	unsetenv("NCCL_RAIL_RMA");
	assert_null(ctx);
	unit_assert_logged2(RAIL_LOG_INFO, "RMA (ABI v14): not offered", "NCCL_RAIL_RMA=0");
	assert_int_equal(rma->finalize(NULL), ncclSuccess);
}

/* ---- harness ----------------------------------------------------------------- */

static int group_setup(void **state)
{
	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	lib = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
	if (lib)
		rma = dlsym(lib, "ncclRmaPlugin_v14");
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	if (lib)
		dlclose(lib);
	return 0;
}

static int need_plugin(void **state)
{
	(void)state;
	if (!lib) {
		printf("SKIP: %s not loadable (%s): run make plugin\n", plugin, dlerror());
		skip();
	}
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_exported, need_plugin),
		cmocka_unit_test_setup(test_off_declines, need_plugin),
	};
	char build_dir[PATH_MAX];

	(void)argc;
	unit_build_dir(argv[0], build_dir, sizeof(build_dir));
	snprintf(plugin, sizeof(plugin), "%.*s/libnccl-net-rail.so", PATH_MAX - 32, build_dir);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
