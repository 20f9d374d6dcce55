/*
 * nccl-net-rail unit tests: the tuner NCCL finds in the plugin's library.
 * The built plugin is loaded with dlopen and driven as NCCL drives it: the
 * net table's init and getProperties (NCCL asks the properties of the
 * network it uses), then a tuner table's init and getCollInfo on a cost
 * table. Checked: LL gets NCCL_RAIL_TCP_LL_PENALTY us per MiB on TCP across
 * nodes, and nothing changes on one node, before NCCL uses the network, with
 * the penalty 0, or in entries NCCL ignores; every exported version (v3-v6)
 * does the same; small collectives keep LL, mid-size ones move to Simple;
 * a mid-size ring collective gets the channels that keep its steps at
 * NCCL_RAIL_TCP_MIN_STEP or more.
 * Skips, saying why, when the plugin is not built.
 */
#include "unit.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_tuner.h"
#include "net_v11.h"
#include "rail.h"

#define NALGO 7
#define NPROTO 3
#define MIB (1024.0 * 1024.0)

static char plugin[PATH_MAX];
static void *lib;
static ncclNet_v11_t *net;
static void *net_ctx;

static void quiet_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
			 const char *fmt, ...)
{
	(void)level, (void)flags, (void)file, (void)line, (void)fmt;
}

static void *sym(const char *name)
{
	void *p = dlsym(lib, name);

	if (!p)
		fail_msg("%s does not export %s", plugin, name);
	return p;
}

/* The net started as NCCL starts it, over TCP; asked its properties or not. */
static void net_up(const char *penalty, int ask_props)
{
	ncclNetCommConfig_v11_t config = { .trafficClass = -1 };
	ncclNetProperties_v11_t props;
	int ndev = 0;

	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	if (penalty)
		setenv("NCCL_RAIL_TCP_LL_PENALTY", penalty, 1);
	else
		unsetenv("NCCL_RAIL_TCP_LL_PENALTY");
	net = sym("ncclNetPlugin_v11");
	assert_int_equal(net->init(&net_ctx, 1, &config, quiet_logger, NULL), ncclSuccess);
	assert_int_equal(net->devices(&ndev), ncclSuccess);
	assert_true(ndev >= 1);
	if (ask_props)
		assert_int_equal(net->getProperties(0, &props), ncclSuccess);
}

static void net_down(void)
{
	assert_int_equal(net->finalize(net_ctx), ncclSuccess);
	net_ctx = NULL;
}

/* Ring and Tree with LL 10 us and Simple 50 us, LL128 ignored, the rest ignored. */
static void table_fill(float t[NALGO][NPROTO], float ll, float simple)
{
	for (int a = 0; a < NALGO; a++)
		for (int p = 0; p < NPROTO; p++)
			t[a][p] = NCCL_ALGO_PROTO_IGNORE;
	for (int a = NCCL_ALGO_TREE; a <= NCCL_ALGO_RING; a++) {
		t[a][NCCL_PROTO_LL] = ll;
		t[a][NCCL_PROTO_SIMPLE] = simple;
	}
}

/* One collective coll through the v5 table (NCCL 2.27-2.29 load it): the channels it asked. */
static int coll_v5_func(ncclFunc_t coll, size_t nranks, size_t nnodes, size_t nbytes,
			float t[NALGO][NPROTO])
{
	ncclTuner_v5_t *tuner = sym("ncclTunerPlugin_v5");
	void *ctx = NULL;
	int nch = 0;

	assert_int_equal(tuner->init(&ctx, 1, nranks, nnodes, quiet_logger, NULL, NULL),
			 ncclSuccess);
	assert_non_null(ctx);
	assert_int_equal(tuner->getCollInfo(ctx, coll, nbytes, 1, (float **)t, NALGO, NPROTO, 0,
					    &nch),
			 ncclSuccess);
	assert_int_equal(tuner->finalize(ctx), ncclSuccess);
	return nch;
}

/* An all-reduce whose cheapest entry is not Ring/Simple: channels stay NCCL's. */
static void coll_v5(size_t nranks, size_t nnodes, size_t nbytes, float t[NALGO][NPROTO])
{
	assert_int_equal(coll_v5_func(ncclFuncAllReduce, nranks, nnodes, nbytes, t), 0);
}

static void assert_untouched(float t[NALGO][NPROTO], float ll, float simple)
{
	float want[NALGO][NPROTO];

	table_fill(want, ll, simple);
	assert_memory_equal(t, want, sizeof(want));
}

static void test_tcp_two_nodes_penalises_ll(void **state)
{
	float t[NALGO][NPROTO];

	(void)state;
	net_up(NULL, 1);
	table_fill(t, 10, 50);
	coll_v5(4, 2, 1 << 20, t);
	for (int a = NCCL_ALGO_TREE; a <= NCCL_ALGO_RING; a++) {
		assert_float_equal(t[a][NCCL_PROTO_LL], 10 + 2048, 1e-3);
		assert_float_equal(t[a][NCCL_PROTO_SIMPLE], 50, 0);
		assert_float_equal(t[a][NCCL_PROTO_LL128], NCCL_ALGO_PROTO_IGNORE, 0);
	}
	for (int a = 2; a < NALGO; a++)
		for (int p = 0; p < NPROTO; p++)
			assert_float_equal(t[a][p], NCCL_ALGO_PROTO_IGNORE, 0);
	net_down();
}

static void test_untouched_cases(void **state)
{
	float t[NALGO][NPROTO];

	(void)state;
	/* one node: no network step */
	net_up(NULL, 1);
	table_fill(t, 10, 50);
	coll_v5(8, 1, 1 << 20, t);
	assert_untouched(t, 10, 50);
	net_down();
	/* NCCL never asked a property: it uses another network */
	net_up(NULL, 0);
	table_fill(t, 10, 50);
	coll_v5(4, 2, 1 << 20, t);
	assert_untouched(t, 10, 50);
	net_down();
	/* switched off */
	net_up("0", 1);
	table_fill(t, 10, 50);
	coll_v5(4, 2, 1 << 20, t);
	assert_untouched(t, 10, 50);
	net_down();
}

static void test_penalty_set_by_environment(void **state)
{
	float t[NALGO][NPROTO];

	(void)state;
	net_up("100", 1);
	table_fill(t, 10, 50);
	coll_v5(2, 2, 4 << 20, t);
	assert_float_equal(t[NCCL_ALGO_RING][NCCL_PROTO_LL], 10 + 400, 1e-3);
	net_down();
}

/* Which protocol NCCL would take from a row: the cheapest considered one. */
static int cheapest(const float *row)
{
	int best = -1;

	for (int p = 0; p < NPROTO; p++)
		if (row[p] >= 0 && (best < 0 || row[p] < row[best]))
			best = p;
	return best;
}

/* LL keeps small collectives and loses mid-size ones; forced LL stays LL. */
static void test_choice_moves_with_size(void **state)
{
	float t[NALGO][NPROTO];

	(void)state;
	net_up(NULL, 1);
	table_fill(t, 20, 40);		/* 8 KiB: LL 20 us, Simple 40 us */
	coll_v5(2, 2, 8 << 10, t);
	assert_int_equal(cheapest(t[NCCL_ALGO_RING]), NCCL_PROTO_LL);
	table_fill(t, 300, 400);	/* 512 KiB: NCCL's model prefers LL */
	coll_v5(2, 2, 512 << 10, t);
	assert_int_equal(cheapest(t[NCCL_ALGO_RING]), NCCL_PROTO_SIMPLE);
	table_fill(t, 300, NCCL_ALGO_PROTO_IGNORE);	/* NCCL_PROTO=LL */
	coll_v5(2, 2, 512 << 10, t);
	assert_int_equal(cheapest(t[NCCL_ALGO_RING]), NCCL_PROTO_LL);
	net_down();
}

/* Ring and Tree with Simple at 40 and 50 us (Ring cheapest), LL at 100. */
static void ring_table(float t[NALGO][NPROTO])
{
	table_fill(t, 100, 50);
	t[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = 40;
}

/*
 * The channels asked for a Ring/Simple all-reduce of nbytes over nranks nodes,
 * the net started with NCCL_RAIL_TCP_MIN_STEP and the LL penalty given (NULL:
 * unset); t keeps the table the tuner left.
 */
static int ring_channels(const char *min_step, const char *penalty, size_t nranks, size_t nbytes,
			 float t[NALGO][NPROTO])
{
	int nch;

	if (min_step)
		setenv("NCCL_RAIL_TCP_MIN_STEP", min_step, 1);
	else
		unsetenv("NCCL_RAIL_TCP_MIN_STEP");
	net_up(penalty, 1);
	ring_table(t);
	nch = coll_v5_func(ncclFuncAllReduce, nranks, nranks, nbytes, t);
	net_down();
	unsetenv("NCCL_RAIL_TCP_MIN_STEP");
	return nch;
}

/*
 * A ring step moves bytes / (channels x ranks): below NCCL_RAIL_TCP_MIN_STEP
 * (256 KiB) the tuner asks for 1 or 2 channels, and leaves larger
 * collectives, other algorithms and protocols, other collectives and the
 * switched-off case to NCCL.
 */
static void test_channels_keep_ring_steps_large(void **state)
{
	static const struct {
		size_t nranks, nbytes;
		int want;
	} cases[] = {
		{ 2, 128 << 10, 1 }, { 2, 512 << 10, 1 }, { 2, 1 << 20, 2 },
		{ 2, 1280 << 10, 2 }, { 2, 1536 << 10, 0 }, { 2, 2 << 20, 0 },
		{ 2, 64 << 20, 0 }, { 8, 1 << 20, 1 }, { 8, 2 << 20, 1 },
		{ 8, 4 << 20, 2 }, { 8, 8 << 20, 0 },
	};
	float t[NALGO][NPROTO];

	(void)state;
	net_up(NULL, 1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int got;

		ring_table(t);
		got = coll_v5_func(ncclFuncAllReduce, cases[i].nranks, cases[i].nranks,
				   cases[i].nbytes, t);
		if (got != cases[i].want)
			fail_msg("%zu ranks, %zu bytes: %d channels asked, want %d", cases[i].nranks,
				 cases[i].nbytes, got, cases[i].want);
	}
	ring_table(t);
	assert_int_equal(coll_v5_func(ncclFuncAllGather, 2, 2, 1 << 20, t), 2);
	ring_table(t);
	assert_int_equal(coll_v5_func(ncclFuncReduceScatter, 2, 2, 512 << 10, t), 1);
	ring_table(t);	/* a pipeline: its steps are not bytes / ranks */
	assert_int_equal(coll_v5_func(ncclFuncBroadcast, 2, 2, 512 << 10, t), 0);
	table_fill(t, 100, 50);	/* Tree first among equals */
	assert_int_equal(coll_v5_func(ncclFuncAllReduce, 2, 2, 512 << 10, t), 0);
	table_fill(t, 100, NCCL_ALGO_PROTO_IGNORE);	/* only LL considered */
	assert_int_equal(coll_v5_func(ncclFuncAllReduce, 2, 2, 512 << 10, t), 0);
	ring_table(t);	/* one node */
	assert_int_equal(coll_v5_func(ncclFuncAllReduce, 2, 1, 512 << 10, t), 0);
	net_down();

	assert_int_equal(ring_channels("0", NULL, 2, 512 << 10, t), 0);
	assert_int_equal(ring_channels(NULL, "0", 2, 512 << 10, t), 1);	/* LL left alone, */
	assert_float_equal(t[NCCL_ALGO_RING][NCCL_PROTO_LL], 100, 0);	/* channels asked */
	assert_int_equal(ring_channels("1m", NULL, 8, 8 << 20, t), 1);
}

/* v3, v4 and v6 give the same table as v5. */
static void test_every_version(void **state)
{
	ncclTuner_v3_t *v3 = sym("ncclTunerPlugin_v3");
	ncclTuner_v4_t *v4 = sym("ncclTunerPlugin_v4");
	ncclTuner_v6_t *v6 = sym("ncclTunerPlugin_v6");
	float want[NALGO][NPROTO], t[NALGO][NPROTO];
	void *ctx;
	int nch = 0;

	(void)state;
	net_up(NULL, 1);
	table_fill(want, 10, 50);
	coll_v5(4, 2, 3 << 20, want);
	assert_string_equal(v3->name, "Rail");
	assert_string_equal(v4->name, "Rail");
	assert_string_equal(v6->name, "Rail");
	assert_null(v6->getChunkSize);

	table_fill(t, 10, 50);
	assert_int_equal(v3->init(4, 2, quiet_logger, &ctx), ncclSuccess);
	assert_int_equal(v3->getCollInfo(ctx, ncclFuncAllReduce, 3 << 20, 1, (float **)t, NALGO,
					 NPROTO, &nch), ncclSuccess);
	assert_int_equal(v3->destroy(ctx), ncclSuccess);
	assert_memory_equal(t, want, sizeof(t));

	table_fill(t, 10, 50);
	assert_int_equal(v4->init(4, 2, quiet_logger, &ctx), ncclSuccess);
	assert_int_equal(v4->getCollInfo(ctx, ncclFuncAllReduce, 3 << 20, 1, (float **)t, NALGO,
					 NPROTO, 1, &nch), ncclSuccess);
	assert_int_equal(v4->destroy(ctx), ncclSuccess);
	assert_memory_equal(t, want, sizeof(t));

	table_fill(t, 10, 50);
	assert_int_equal(v6->init(&ctx, 7, 4, 2, quiet_logger, NULL, NULL), ncclSuccess);
	assert_int_equal(v6->getCollInfo(ctx, ncclFuncAllReduce, 3 << 20, 1, (float **)t, NALGO,
					 NPROTO, 0, &nch), ncclSuccess);
	assert_int_equal(v6->finalize(ctx), ncclSuccess);
	assert_memory_equal(t, want, sizeof(t));
	assert_int_equal(nch, 0);

	/* and ask the same channels */
	ring_table(t);
	assert_int_equal(v3->init(2, 2, quiet_logger, &ctx), ncclSuccess);
	assert_int_equal(v3->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float **)t, NALGO,
					 NPROTO, &nch), ncclSuccess);
	assert_int_equal(v3->destroy(ctx), ncclSuccess);
	assert_int_equal(nch, 2);
	nch = 0;
	ring_table(t);
	assert_int_equal(v6->init(&ctx, 7, 2, 2, quiet_logger, NULL, NULL), ncclSuccess);
	assert_int_equal(v6->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float **)t, NALGO,
					 NPROTO, 0, &nch), ncclSuccess);
	assert_int_equal(v6->finalize(ctx), ncclSuccess);
	assert_int_equal(nch, 2);
	net_down();
}

static int group_setup(void **state)
{
	(void)state;
	lib = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
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
		cmocka_unit_test_setup(test_tcp_two_nodes_penalises_ll, need_plugin),
		cmocka_unit_test_setup(test_untouched_cases, need_plugin),
		cmocka_unit_test_setup(test_penalty_set_by_environment, need_plugin),
		cmocka_unit_test_setup(test_choice_moves_with_size, need_plugin),
		cmocka_unit_test_setup(test_channels_keep_ring_steps_large, need_plugin),
		cmocka_unit_test_setup(test_every_version, need_plugin),
	};
	char build_dir[PATH_MAX];

	/* build/test/unit/test_tuner -> build/libnccl-net-rail.so */
	(void)argc;
	unit_build_dir(argv[0], build_dir, sizeof(build_dir));
	snprintf(plugin, sizeof(plugin), "%.*s/libnccl-net-rail.so", PATH_MAX - 32, build_dir);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
