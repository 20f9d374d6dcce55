/*
 * nccl-net-rail unit tests: the topology model (src/topo/) on the sysfs
 * fixtures of test/fixtures/: each GPU's NICs, ports, relations and
 * locality against the fixture's expected.json (written from public
 * documentation, see each SOURCE.md), distances, VFs, down ports, the flat
 * VM, NCCL_RAIL_GPU_NIC_MAP, NCCL_IB_HCA, rails, PCI paths and GPU lookup.
 */
#include "unit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "param.h"
#include "rail.h"
#include "sysfs.h"
#include "test_topo_json.h"
#include "topo/topo.h"

#define FX "test/fixtures/"

static const char *const fixtures[] = { "dgx-h100", "dgx-a100", "b200-dualport", "sriov-v100",
					"azure-ndv5", "roce-h100", "gcp-a3", "gid-roce", "h200-vm" };

static void set_env(const char *map, const char *hca)
{
	if (map)
		setenv("NCCL_RAIL_GPU_NIC_MAP", map, 1);
	else
		unsetenv("NCCL_RAIL_GPU_NIC_MAP");
	if (hca)
		setenv("NCCL_IB_HCA", hca, 1);
	else
		unsetenv("NCCL_IB_HCA");
	rail_params_reload();
}

static struct rail_topo *load_root(const char *root, const char *map, const char *hca,
				   const char *extra)
{
	struct rail_topo *t = NULL;
	int err;

	set_env(map, hca);
	rail_sysfs_set_root(root);
	err = rail_topo_build(extra, &t);
	if (err)
		fail_msg("rail_topo_build(%s): %s", root, RAIL_ERRSTR(err));
	return t;
}

static struct rail_topo *load(const char *fixture, const char *map, const char *hca)
{
	char root[256];

	snprintf(root, sizeof(root), FX "%s", fixture);
	return load_root(root, map, hca, NULL);
}

static int setup(void **state)
{
	(void)state;
	unit_log_capture();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unit_log_release();
	set_env(NULL, NULL);
	rail_sysfs_set_root("");
	rail_topo_reset();
	return 0;
}

static int nic_index(const struct rail_topo *t, const char *name)
{
	for (int i = 0; i < t->nnics; i++)
		if (!strcmp(t->nics[i].name, name))
			return i;
	fail_msg("no NIC %s", name);
	return -1;
}

static const char *pick_name(const struct rail_topo *t, const struct rail_topo_choice *ch, int i)
{
	return t->nics[ch->picks[i].nic].name;
}

static int pick_port(const struct rail_topo *t, const struct rail_topo_choice *ch, int i)
{
	return t->nics[ch->picks[i].nic].ports[ch->picks[i].port_idx].port;
}

static const struct rail_topo_choice *choice(const struct rail_topo *t, const char *bdf)
{
	const struct rail_topo_choice *ch = rail_topo_choice_for_gpu(t, bdf);

	if (!ch)
		fail_msg("no GPU %s", bdf);
	return ch;
}

/* ---- every fixture against its expected.json ------------------------------ */

static void check_gpu(const char *fx, const struct rail_topo *t, const struct tj *g)
{
	const char *bdf = tj_str(g, "bdf"), *loc = tj_str(g, "locality");
	const struct tj *nics = tj_get(g, "nics");
	const struct rail_topo_choice *ch = choice(t, bdf);

	assert_non_null(loc);
	assert_non_null(nics);
	if (strcmp(rail_topo_locality_name(ch->locality), loc))
		fail_msg("%s GPU %s: locality %s, expected %s (%s)", fx, bdf,
			 rail_topo_locality_name(ch->locality), loc, ch->reason);
	if (ch->npicks != nics->n)
		fail_msg("%s GPU %s: %d NICs, expected %d (%s)", fx, bdf, ch->npicks, nics->n,
			 ch->reason);
	for (int i = 0; i < nics->n; i++) {
		const struct tj *n = &nics->items[i];
		const struct tj *port = tj_get(n, "port");

		if (strcmp(pick_name(t, ch, i), tj_str(n, "name")) ||
		    pick_port(t, ch, i) != (int)port->num ||
		    strcmp(rail_topo_rel_name(ch->picks[i].rel), tj_str(n, "relation")))
			fail_msg("%s GPU %s NIC %d: %s:%d %s, expected %s:%d %s", fx, bdf, i,
				 pick_name(t, ch, i), pick_port(t, ch, i),
				 rail_topo_rel_name(ch->picks[i].rel), tj_str(n, "name"),
				 (int)port->num, tj_str(n, "relation"));
	}
}

static void test_fixtures_expected(void **state)
{
	(void)state;
	for (size_t f = 0; f < RAIL_ARRAY_SIZE(fixtures); f++) {
		char path[256], *text;
		const char *err;
		long at;
		struct tj doc;
		const struct tj *gpus;
		struct rail_topo *t = load(fixtures[f], NULL, NULL);

		snprintf(path, sizeof(path), FX "%s/expected.json", fixtures[f]);
		text = tj_slurp(path);
		if (!text)
			fail_msg("cannot read %s", path);
		if (tj_parse(text, &doc, &err, &at))
			fail_msg("%s: %s at offset %ld", path, err, at);
		gpus = tj_get(&doc, "gpus");
		assert_non_null(gpus);
		if (gpus->n != t->ngpus)
			fail_msg("%s: %d GPUs found, expected %d", fixtures[f], t->ngpus, gpus->n);
		for (int g = 0; g < gpus->n; g++)
			check_gpu(fixtures[f], t, &gpus->items[g]);
		tj_free(&doc);
		free(text);
		rail_topo_free(t);
	}
}

/* ---- distances ------------------------------------------------------------ */

static void test_relation_paths(void **state)
{
	const char *gpu = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:03.0/0000:1b:00.0";
	const char *nic = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0";

	(void)state;
	/* same switch (down-up-down) is one switch: PIX */
	assert_int_equal(rail_topo_relation(gpu, 0, nic, 0, 2), RAIL_TOPO_PIX);
	/* a netdev path below the function changes nothing */
	assert_int_equal(rail_topo_relation(gpu, 0,
		"/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0/net/ib0",
		0, 2), RAIL_TOPO_PIX);
	/* two functions of one card on a root port: one bridge, PIX */
	assert_int_equal(rail_topo_relation("/sys/devices/pci0000:28/0000:28:01.0/0000:29:00.0", 0,
					    "/sys/devices/pci0000:28/0000:28:01.0/0000:29:00.1", 0, 2),
			 RAIL_TOPO_PIX);
	/* a switch below a switch: PXB */
	assert_int_equal(rail_topo_relation(
		"/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", 3,
		"/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:01.0/0000:0a:00.0/0000:0b:00.0/0000:0c:00.0", 3, 8),
		RAIL_TOPO_PXB);
	/* different root ports of one host bridge, and devices on the root bus: PHB */
	assert_int_equal(rail_topo_relation("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0", 0,
					    "/sys/devices/pci0000:00/0000:00:02.0/0000:02:00.0", 0, 2),
			 RAIL_TOPO_PHB);
	assert_int_equal(rail_topo_relation("/sys/devices/pci0000:00/0000:00:06.0", -1,
					    "/sys/devices/pci0000:00/0000:00:03.0/virtio2", -1, 1),
			 RAIL_TOPO_PHB);
	/* several host bridges: NODE on one NUMA node, SYS across */
	assert_int_equal(rail_topo_relation("/sys/devices/pci0000:15/0000:15:01.0/0000:18:00.0", 0,
					    "/sys/devices/pci0000:3d/0000:3d:01.0/0000:40:00.0", 0, 2),
			 RAIL_TOPO_NODE);
	assert_int_equal(rail_topo_relation("/sys/devices/pci0000:15/0000:15:01.0/0000:18:00.0", 0,
					    "/sys/devices/pci0000:97/0000:97:01.0/0000:9a:00.0", 1, 2),
			 RAIL_TOPO_SYS);
	/* NUMA unknown: NODE only on a one-node machine */
	assert_int_equal(rail_topo_relation("/sys/devices/pci0001:00/0001:00:00.0", -1,
					    "/sys/devices/pci0101:00/0101:00:00.0", -1, 1),
			 RAIL_TOPO_NODE);
	assert_int_equal(rail_topo_relation("/sys/devices/pci0001:00/0001:00:00.0", -1,
					    "/sys/devices/pci0101:00/0101:00:00.0", -1, 2),
			 RAIL_TOPO_SYS);
	/* VMD-style 5-digit domains parse; no PCI function at all is SYS */
	assert_int_equal(rail_topo_relation("/sys/devices/pci10000:e0/10000:e0:01.0/10000:e1:00.0", 0,
					    "/sys/devices/pci10000:e0/10000:e0:01.0/10000:e1:00.1", 0, 1),
			 RAIL_TOPO_PIX);
	assert_int_equal(rail_topo_relation("/sys/devices/virtual/net/lo", 0,
					    "/sys/devices/pci0000:00/0000:00:03.0", 0, 1),
			 RAIL_TOPO_SYS);
}

static void test_distances_dgx(void **state)
{
	struct rail_topo *t = load("dgx-h100", NULL, NULL);
	int g0 = rail_topo_gpu_index(t, "0000:1b:00.0"), g4 = rail_topo_gpu_index(t, "0000:9d:00.0");

	(void)state;
	assert_int_equal(t->ngpus, 8); /* the four NVSwitches (class 0x0680) are not GPUs */
	assert_int_equal(t->nnuma, 2);
	assert_int_equal(t->rel[g0 * t->nnics + nic_index(t, "mlx5_0")], RAIL_TOPO_PIX);
	assert_int_equal(t->rel[g0 * t->nnics + nic_index(t, "mlx5_3")], RAIL_TOPO_NODE);
	assert_int_equal(t->rel[g0 * t->nnics + nic_index(t, "mlx5_6")], RAIL_TOPO_SYS);
	assert_int_equal(t->rel[g4 * t->nnics + nic_index(t, "irdma0")], RAIL_TOPO_NODE);
	assert_non_null(strstr(choice(t, "0000:1b:00.0")->reason, "PIX: same PCIe switch 0000:16:00.0"));
	rail_topo_free(t);

	t = load("dgx-a100", NULL, NULL);
	g0 = rail_topo_gpu_index(t, "0000:07:00.0");
	assert_int_equal(t->rel[g0 * t->nnics + nic_index(t, "mlx5_1")], RAIL_TOPO_PXB);
	assert_int_equal(t->rel[g0 * t->nnics + nic_index(t, "mlx5_2")], RAIL_TOPO_SYS); /* NPS4 */
	assert_non_null(strstr(choice(t, "0000:07:00.0")->reason, "2 GPUs"));
	rail_topo_free(t);
}

/* ---- VFs, down ports, non-RDMA NICs ----------------------------------------- */

static void test_vfs_are_rails(void **state)
{
	struct rail_topo *t = load("sriov-v100", NULL, NULL);
	const struct rail_topo_nic *pf = &t->nics[nic_index(t, "mlx5_0")];
	const struct rail_topo_nic *vf = &t->nics[nic_index(t, "mlx5_2")];
	int rails[4], plane;

	(void)state;
	assert_false(pf->is_vf);
	assert_true(vf->is_vf);
	assert_string_equal(vf->pf_bdf, "0000:59:00.0");
	assert_string_equal(vf->bdf, "0000:59:00.3");
	for (int i = 0; i < 4; i++) {
		char name[32];

		snprintf(name, sizeof(name), "mlx5_%d", i & 7);
		assert_int_equal(rail_topo_rail_of_model(t, name, 1, &rails[i], &plane), 0);
		assert_int_equal(plane, -1);
		for (int j = 0; j < i; j++)
			assert_int_not_equal(rails[i], rails[j]);
	}
	rail_topo_free(t);
}

static void test_down_ports_never_chosen(void **state)
{
	static const struct { const char *fx, *nic; } down[] = {
		{ "dgx-h100", "mlx5_1" }, { "dgx-h100", "mlx5_2" }, { "dgx-h100", "mlx5_7" },
		{ "dgx-h100", "irdma1" }, { "sriov-v100", "mlx5_4" }, { "b200-dualport", "mlx5_4" },
		{ "b200-dualport", "mlx5_7" }, { "dgx-a100", "mlx5_10" },
	};

	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(down); i++) {
		struct rail_topo *t = load(down[i].fx, NULL, NULL);
		int n = nic_index(t, down[i].nic), rail, plane;

		assert_false(t->nics[n].ports[0].usable);
		assert_string_equal(t->nics[n].ports[0].why_not, "DOWN");
		for (int g = 0; g < t->ngpus; g++)
			for (int p = 0; p < t->choice[g].npicks; p++)
				if (t->choice[g].picks[p].nic == n)
					fail_msg("%s: %s is down but chosen for %s", down[i].fx,
						 down[i].nic, t->gpus[g].bdf);
		assert_int_equal(rail_topo_rail_of_model(t, down[i].nic, 1, &rail, &plane), 0);
		assert_int_equal(rail, -1);
		rail_topo_free(t);
	}
}

static void test_no_rdma_no_choice(void **state)
{
	struct rail_topo *t = load("gcp-a3", NULL, NULL);

	(void)state;
	assert_int_equal(t->ngpus, 8);
	assert_int_equal(t->nnics, 0);
	assert_true(t->nnetdevs >= 5); /* the gVNICs are netdevs, not rails */
	for (int g = 0; g < t->ngpus; g++) {
		assert_int_equal(t->choice[g].npicks, 0);
		assert_string_equal(t->choice[g].reason, "no usable RDMA port");
	}
	rail_topo_free(t);
}

/* ---- flat VM and NCCL_RAIL_GPU_NIC_MAP ------------------------------------- */

static int has_warn(const struct rail_topo *t, const char *a, const char *b)
{
	for (int i = 0; i < t->nwarn; i++)
		if (strstr(t->warn[i], a) && (!b || strstr(t->warn[i], b)))
			return 1;
	return 0;
}

static void test_flat_vm(void **state)
{
	struct rail_topo *t = load("azure-ndv5", NULL, NULL);

	(void)state;
	for (int g = 0; g < t->ngpus; g++) {
		assert_int_equal(t->choice[g].locality, RAIL_TOPO_LOC_NONE);
		assert_non_null(strstr(t->choice[g].reason, "locality unknown: flat PCIe tree"));
		/* the slower Ethernet VF is never chosen over the IB VFs */
		assert_string_not_equal(pick_name(t, &t->choice[g], 0), "mlx5_an0");
	}
	assert_true(has_warn(t, "locality unknown", "NCCL_RAIL_GPU_NIC_MAP"));
	assert_false(has_warn(t, "closer than SYS", NULL));
	rail_topo_free(t);
}

static void test_map_good(void **state)
{
	struct rail_topo *t = load("azure-ndv5", " 0=mlx5_ib7 ; 0002:00:00.0=mlx5_ib6:1+mlx5_ib5,"
				   "3=ib2;", NULL);
	const struct rail_topo_choice *c0 = choice(t, "0001:00:00.0"), *c1 = choice(t, "0002:00:00.0");
	const struct rail_topo_choice *c3 = choice(t, "0008:00:00.0"), *c4 = choice(t, "0009:00:00.0");
	int rail, plane;

	(void)state;
	assert_true(t->map_set);
	assert_true(t->map_used);
	assert_true(c0->from_map);
	assert_string_equal(pick_name(t, c0, 0), "mlx5_ib7");
	assert_string_equal(c0->reason, "operator map NCCL_RAIL_GPU_NIC_MAP");
	assert_int_equal(c1->npicks, 2);
	assert_string_equal(pick_name(t, c1, 0), "mlx5_ib6");
	assert_string_equal(pick_name(t, c1, 1), "mlx5_ib5");
	assert_string_equal(pick_name(t, c3, 0), "mlx5_ib2"); /* by netdev name */
	assert_false(c4->from_map);			       /* not in the map: automatic */
	assert_false(has_warn(t, "locality unknown", NULL));
	/* rails follow the map: GPU 0's NIC is rail 0 */
	assert_int_equal(rail_topo_rail_of_model(t, "mlx5_ib7", 1, &rail, &plane), 0);
	assert_int_equal(rail, 0);
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, "NCCL_RAIL_GPU_NIC_MAP"), 0);
	rail_topo_free(t);
}

static void test_map_bad_values(void **state)
{
	static const struct { const char *map, *why; } bad[] = {
		{ "garbage", "has no '='" },
		{ "0=", "has no NIC" },
		{ "0=mlx5_ib9", "unknown NIC" },
		{ "0=mlx5_ib0:x", "bad port" },
		{ "0=mlx5_ib0:7", "has no port 7" },
		{ "0=mlx5_ib0;0001:00:00.0=mlx5_ib1", "mapped twice" },
		{ "zz:00=mlx5_ib0", "not a GPU index or PCI address" },
		{ "0=mlx5_ib0++mlx5_ib1", "empty NIC name" },
	};

	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(bad); i++) {
		struct rail_topo *t;

		unit_log_reset();
		t = load("azure-ndv5", bad[i].map, NULL);
		assert_true(t->map_set);
		if (t->map_used)
			fail_msg("map \"%s\" accepted", bad[i].map);
		if (!strstr(t->map_status, bad[i].why))
			fail_msg("map \"%s\": status \"%s\", expected \"%s\"", bad[i].map,
				 t->map_status, bad[i].why);
		unit_assert_logged2(RAIL_LOG_WARN, "NCCL_RAIL_GPU_NIC_MAP", bad[i].why);
		/* the automatic choice stays */
		assert_false(t->choice[0].from_map);
		assert_string_equal(pick_name(t, &t->choice[0], 0), "mlx5_ib0");
		rail_topo_free(t);
	}
}

static void test_map_down_port_and_unknown_gpu(void **state)
{
	struct rail_topo *t = load("dgx-h100", "0000:1b:00.0=mlx5_1;12=mlx5_0;1=ibp24s0", NULL);

	(void)state;
	assert_true(t->map_used);
	/* mlx5_1 is DOWN: dropped with a warning, GPU 0 keeps its automatic NIC */
	unit_assert_logged2(RAIL_LOG_WARN, "mlx5_1:1", "DOWN");
	assert_false(choice(t, "0000:1b:00.0")->from_map);
	assert_string_equal(pick_name(t, choice(t, "0000:1b:00.0"), 0), "mlx5_0");
	assert_true(has_warn(t, "leaves GPU 0000:1b:00.0 no ACTIVE port", NULL));
	/* GPU index 12 does not exist here: skipped, not an error */
	unit_assert_logged2(RAIL_LOG_INFO, "no GPU 12", "skipped");
	/* a map against the PCIe tree is honoured, and questioned */
	assert_string_equal(pick_name(t, choice(t, "0000:43:00.0"), 0), "mlx5_0");
	assert_true(has_warn(t, "gives GPU 0000:43:00.0 mlx5_0 (NODE)", "mlx5_3 is PIX"));
	rail_topo_free(t);
}

static void test_nccl_ib_hca_and_numa_locality(void **state)
{
	struct rail_topo *t = load("dgx-h100", NULL, "^mlx5_0");
	const struct rail_topo_choice *c = choice(t, "0000:1b:00.0");

	(void)state;
	assert_string_equal(t->nics[nic_index(t, "mlx5_0")].ports[0].why_not,
			    "excluded by NCCL_IB_HCA");
	assert_int_equal(c->locality, RAIL_TOPO_LOC_NUMA);
	assert_int_equal(c->picks[0].rel, RAIL_TOPO_NODE);
	assert_non_null(strstr(c->reason, "NODE: only the NUMA node matches"));
	rail_topo_free(t);

	t = load("dgx-h100", NULL, "=mlx5_0:1,mlx5_6");
	assert_int_equal(choice(t, "0000:1b:00.0")->picks[0].rel, RAIL_TOPO_PIX);
	assert_string_equal(pick_name(t, choice(t, "0000:43:00.0"), 0), "mlx5_0");
	assert_int_equal(choice(t, "0000:43:00.0")->picks[0].rel, RAIL_TOPO_NODE);
	rail_topo_free(t);
}

/* ---- GPU lookup, rails, PCI paths, extra accelerators ---------------------- */

static void test_resolve_gpu(void **state)
{
	struct rail_topo *t = load("dgx-h100", NULL, NULL);
	char bdf[RAIL_TOPO_BDF_LEN];

	(void)state;
	assert_int_equal(rail_topo_resolve_gpu(t, "0000:1B:00.0", bdf, sizeof(bdf)), 0);
	assert_string_equal(bdf, "0000:1b:00.0");
	assert_int_equal(rail_topo_resolve_gpu(t, "c3:00.0", bdf, sizeof(bdf)), 0);
	assert_string_equal(bdf, "0000:c3:00.0");
	assert_int_equal(rail_topo_resolve_gpu(t, "3", bdf, sizeof(bdf)), 0);
	assert_string_equal(bdf, "0000:61:00.0");
	assert_int_equal(rail_topo_resolve_gpu(t, "5,", bdf, sizeof(bdf)), 0);
	assert_string_equal(bdf, "0000:c3:00.0");
	assert_int_equal(rail_topo_resolve_gpu(t, "GPU-fa4e0000-0000-4000-8000-0000000000d1", bdf,
					       sizeof(bdf)), 0);
	assert_string_equal(bdf, "0000:d1:00.0");
	assert_int_equal(rail_topo_resolve_gpu(t, "GPU-fa4e0000", bdf, sizeof(bdf)), -EINVAL);
	assert_int_equal(rail_topo_resolve_gpu(t, "0,1", bdf, sizeof(bdf)), -EINVAL);
	assert_int_equal(rail_topo_resolve_gpu(t, "MIG-1234", bdf, sizeof(bdf)), -EINVAL);
	assert_int_equal(rail_topo_resolve_gpu(t, "8", bdf, sizeof(bdf)), -ENOENT);
	assert_int_equal(rail_topo_resolve_gpu(t, "0000:aa:00.0", bdf, sizeof(bdf)), -ENOENT);
	assert_int_equal(rail_topo_resolve_gpu(t, "banana", bdf, sizeof(bdf)), -EINVAL);
	assert_int_equal(rail_topo_resolve_gpu(t, "", bdf, sizeof(bdf)), -EINVAL);
	assert_null(rail_topo_choice_for_gpu(t, "0000:aa:00.0"));
	rail_topo_free(t);
}

static void test_rails_and_paths(void **state)
{
	static const char *const order[] = { "mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5",
					     "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11" };
	char path[RAIL_TOPO_PATH_LEN];
	int rail, plane;

	(void)state;
	set_env(NULL, NULL);
	rail_sysfs_set_root(FX "dgx-h100");
	rail_topo_reset(); /* the process-wide model follows the new root */
	for (int i = 0; i < 8; i++) {
		assert_int_equal(rail_topo_rail_of(order[i], 1, &rail, &plane), 0);
		assert_int_equal(rail, i);
		assert_int_equal(plane, -1);
	}
	assert_int_equal(rail_topo_rail_of("mlx5_1", 1, &rail, &plane), 0);
	assert_int_equal(rail, -1);
	assert_int_equal(rail_topo_rail_of("mlx5_0", 2, &rail, &plane), -ENODEV);
	assert_int_equal(rail_topo_rail_of("mlx5_99", 1, &rail, &plane), -ENODEV);

	assert_int_equal(rail_topo_pci_path("mlx5_0", path, sizeof(path)), 0);
	assert_string_equal(path, "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/"
				  "0000:18:00.0");
	assert_int_equal(rail_topo_netdev_pci_path("ibp24s0", path, sizeof(path)), 0);
	assert_string_equal(path, "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/"
				  "0000:18:00.0");
	assert_int_equal(rail_topo_pci_path("mlx5_99", path, sizeof(path)), -ENODEV);
	assert_int_equal(rail_topo_pci_path("mlx5_0", path, 8), -ENAMETOOLONG);

	rail_sysfs_set_root(FX "azure-ndv5");
	assert_int_equal(rail_topo_netdev_pci_path("eth0", path, sizeof(path)), -ENODEV);
	assert_int_equal(rail_topo_netdev_pci_path("ib3", path, sizeof(path)), 0);
	assert_non_null(strstr(path, "/VMBUS:00/"));
	assert_non_null(strstr(path, "/pci0104:00/0104:00:00.0"));
}

static void test_extra_gpus(void **state)
{
	struct rail_topo *t = load_root(FX "dgx-h100", NULL, NULL, "0000:05:00.0");
	int g = rail_topo_gpu_index(t, "0000:05:00.0");

	(void)state;
	assert_int_equal(t->ngpus, 9);
	assert_true(g >= 0);
	assert_false(t->gpus[g].nvidia);
	assert_int_equal(t->gpus[g].pci_class, 0x068000);
	rail_topo_free(t);

	t = NULL;
	set_env(NULL, NULL);
	assert_int_equal(rail_topo_build("0000:77:00.0", &t), -ENOENT);
	assert_null(t);
	assert_int_equal(rail_topo_build("not-a-bdf", &t), -EINVAL);
	unit_assert_logged(RAIL_LOG_WARN, "not a PCI address");
}

/* ---- shapes made from a fixture copy -------------------------------------- */

static void copy_fixture(const char *fx, char *dir, size_t len)
{
	char cmd[512];

	snprintf(dir, len, "/tmp/rail-topo-XXXXXX");
	if (!mkdtemp(dir))
		fail_msg("mkdtemp: %s", strerror(errno));
	snprintf(cmd, sizeof(cmd), "cp -a '" FX "%s/.' '%s/'", fx, dir);
	if (system(cmd))
		fail_msg("%s failed", cmd);
}

static void remove_tree(const char *dir)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		print_message("could not remove %s\n", dir);
}

/* One GPU behind a dual-port card: both ports are its rails. */
static void test_several_rails_per_gpu(void **state)
{
	char dir[64], link[128];
	struct rail_topo *t;
	const struct rail_topo_choice *c;

	(void)state;
	copy_fixture("b200-dualport", dir, sizeof(dir));
	snprintf(link, sizeof(link), "%s/sys/bus/pci/devices/0000:1a:00.0", dir);
	assert_int_equal(unlink(link), 0);
	t = load_root(dir, NULL, NULL, NULL);
	c = choice(t, "0000:19:00.0");
	assert_int_equal(c->npicks, 2);
	assert_string_equal(pick_name(t, c, 0), "mlx5_0");
	assert_string_equal(pick_name(t, c, 1), "mlx5_1");
	assert_int_equal(c->picks[1].rel, RAIL_TOPO_PIX);
	rail_topo_free(t);
	remove_tree(dir);
}

/* A device with two ports (mlx4-style): each port is a rail of its own. */
static void test_two_port_device(void **state)
{
	char dir[64], cmd[512];
	struct rail_topo *t;
	const struct rail_topo_choice *c;
	int r1, r2, plane;
	const char *ports = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/"
			    "0000:18:00.0/infiniband/mlx5_0/ports";

	(void)state;
	copy_fixture("dgx-h100", dir, sizeof(dir));
	snprintf(cmd, sizeof(cmd), "cp -a '%s/%s/1' '%s/%s/2'", dir, ports, dir, ports);
	assert_int_equal(system(cmd), 0);
	t = load_root(dir, NULL, NULL, NULL);
	c = choice(t, "0000:1b:00.0");
	assert_int_equal(t->nics[nic_index(t, "mlx5_0")].nports, 2);
	assert_int_equal(c->npicks, 2);
	assert_int_equal(pick_port(t, c, 0), 1);
	assert_int_equal(pick_port(t, c, 1), 2);
	assert_int_equal(rail_topo_rail_of_model(t, "mlx5_0", 1, &r1, &plane), 0);
	assert_int_equal(rail_topo_rail_of_model(t, "mlx5_0", 2, &r2, &plane), 0);
	assert_int_equal(r1, 0);
	assert_int_equal(r2, 1);
	rail_topo_free(t);
	remove_tree(dir);
}

/* ---- fallback ports (issue 14) ---------------------------------------------------- */

static const struct rail_topo_port *fb_port(const struct rail_topo *t,
					    const struct rail_topo_choice *ch)
{
	return &t->nics[ch->fallback.nic].ports[ch->fallback.port_idx];
}

/*
 * On every fixture: a fallback is usable, not a first choice of its GPU, of
 * the first choice's link layer, and no eligible port is nearer the GPU.
 */
static void test_fallback_rules(void **state)
{
	(void)state;
	for (size_t f = 0; f < RAIL_ARRAY_SIZE(fixtures); f++) {
		struct rail_topo *t = load(fixtures[f], NULL, NULL);

		for (int g = 0; g < t->ngpus; g++) {
			const struct rail_topo_choice *ch = &t->choice[g];
			const char *ll;

			assert_true(ch->fallback_reason[0]);
			if (!ch->has_fallback)
				continue;
			ll = t->nics[ch->picks[0].nic].ports[ch->picks[0].port_idx].link_layer;
			assert_true(fb_port(t, ch)->usable);
			assert_string_equal(fb_port(t, ch)->link_layer, ll);
			assert_int_equal(ch->fallback.rel, t->rel[g * t->nnics + ch->fallback.nic]);
			for (int i = 0; i < ch->npicks; i++)
				assert_false(ch->picks[i].nic == ch->fallback.nic &&
					     ch->picks[i].port_idx == ch->fallback.port_idx);
			for (int n = 0; n < t->nnics; n++)
				for (int p = 0; p < t->nics[n].nports; p++)
					if (t->nics[n].ports[p].usable &&
					    !strcmp(t->nics[n].ports[p].link_layer, ll) &&
					    t->rel[g * t->nnics + n] < ch->fallback.rel &&
					    !(n == ch->picks[0].nic && p == ch->picks[0].port_idx))
						fail_msg("%s GPU %d: fallback %s (%s) but %s is nearer",
							 fixtures[f], g, t->nics[ch->fallback.nic].name,
							 rail_topo_rel_name(ch->fallback.rel),
							 t->nics[n].name);
		}
		rail_topo_free(t);
	}
}

/*
 * DGX H100: each GPU's PIX NIC is its own; the fallback is a NODE NIC on
 * another card, and the four GPUs of a NUMA node do not share one.
 * B200 with dual-port cards: the other port of the card, still PIX, wins
 * over a NODE port on another card. One usable NIC: no fallback, said why.
 */
static void test_fallback_choice(void **state)
{
	struct rail_topo *t = load("dgx-h100", NULL, NULL);
	const struct rail_topo_choice *c = choice(t, "0000:1b:00.0");
	int used[64] = { 0 };

	(void)state;
	assert_true(c->has_fallback);
	assert_string_equal(t->nics[c->fallback.nic].name, "mlx5_3");
	assert_int_equal(c->fallback.rel, RAIL_TOPO_NODE);
	assert_non_null(strstr(c->fallback_reason, "another card"));
	for (int g = 0; g < 4; g++) {
		assert_true(t->choice[g].has_fallback);
		assert_true(t->choice[g].fallback.nic < 64);
		if (used[t->choice[g].fallback.nic]++)
			fail_msg("GPU %d: fallback %s already taken by a GPU before it", g,
				 t->nics[t->choice[g].fallback.nic].name);
	}
	rail_topo_free(t);

	t = load("b200-dualport", NULL, NULL);
	c = choice(t, "0000:19:00.0");
	assert_string_equal(pick_name(t, c, 0), "mlx5_0");
	assert_true(c->has_fallback);
	assert_string_equal(t->nics[c->fallback.nic].name, "mlx5_1");
	assert_int_equal(c->fallback.rel, RAIL_TOPO_PIX);
	assert_non_null(strstr(c->fallback_reason, "the other port of the first choice's card"));
	rail_topo_free(t);

	t = load("dgx-h100", NULL, "mlx5_0");
	c = choice(t, "0000:1b:00.0");
	assert_string_equal(pick_name(t, c, 0), "mlx5_0");
	assert_false(c->has_fallback);
	assert_non_null(strstr(c->fallback_reason, "none: no other usable InfiniBand port"));
	rail_topo_free(t);
}

/* ---- the NCCL topology file ---------------------------------------------------- */

static void test_nccl_xml(void **state)
{
	struct rail_topo *t = load("azure-ndv5", "0=mlx5_ib0;1=mlx5_ib1", NULL);
	char path[256], *text;
	int n;

	(void)state;
	n = rail_topo_write_nccl_xml(t, NULL, path, sizeof(path));
	assert_int_equal(n, 1);
	assert_non_null(strstr(path, "/proc/self/fd/"));
	text = tj_slurp(path);
	assert_non_null(text);
	assert_non_null(strstr(text, "<system version=\"1\">"));
	assert_non_null(strstr(text, "<cpu numaid=\"-1\" arch=\"x86_64\" vendor=\"GenuineIntel\" "
				     "familyid=\"6\" modelid=\"143\">"));
	assert_non_null(strstr(text, "<pci busid=\"ffff:ff:01.0\" class=\"0x060400\""));
	assert_non_null(strstr(text, "<pci busid=\"0001:00:00.0\" class=\"0x030200\" vendor=\"0x10de\" "
				     "device=\"0x2330\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\"/>"));
	assert_non_null(strstr(text, "<pci busid=\"0102:00:00.0\" class=\"0x020700\""));
	assert_null(strstr(text, "0003:00:00.0")); /* not mapped: NCCL finds it itself */
	free(text);
	close(atoi(strrchr(path, '/') + 1));

	n = rail_topo_write_nccl_xml(t, "/tmp", path, sizeof(path));
	assert_int_equal(n, 1);
	assert_int_equal(strncmp(path, "/tmp/nccl-rail-topo-", 20), 0);
	assert_int_equal(unlink(path), 0);
	rail_topo_free(t);

	/* not needed where the PCIe tree shows locality, nor without a map */
	t = load("dgx-h100", "0=mlx5_0", NULL);
	assert_int_equal(rail_topo_write_nccl_xml(t, "/tmp", path, sizeof(path)), 0);
	rail_topo_free(t);
	t = load("azure-ndv5", NULL, NULL);
	assert_int_equal(rail_topo_write_nccl_xml(t, "/tmp", path, sizeof(path)), 0);
	rail_topo_free(t);
}

static void test_log_lines(void **state)
{
	struct rail_topo *t = load("dgx-a100", NULL, NULL);

	(void)state;
	unit_log_reset();
	rail_topo_log(t);
	assert_int_equal(unit_log_count(RAIL_LOG_INFO, "topology: GPU"), 8);
	unit_assert_logged2(RAIL_LOG_INFO, "GPU 0000:07:00.0 NUMA 3 -> mlx5_0:1[PXB]", "locality pcie");
	unit_assert_logged2(RAIL_LOG_INFO, "GPU 0000:07:00.0 NUMA 3", "; fallback mlx5_1:1[PXB]");
	rail_topo_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_fixtures_expected, setup, teardown),
		cmocka_unit_test_setup_teardown(test_relation_paths, setup, teardown),
		cmocka_unit_test_setup_teardown(test_distances_dgx, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vfs_are_rails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_down_ports_never_chosen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_rdma_no_choice, setup, teardown),
		cmocka_unit_test_setup_teardown(test_flat_vm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_map_good, setup, teardown),
		cmocka_unit_test_setup_teardown(test_map_bad_values, setup, teardown),
		cmocka_unit_test_setup_teardown(test_map_down_port_and_unknown_gpu, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nccl_ib_hca_and_numa_locality, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resolve_gpu, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rails_and_paths, setup, teardown),
		cmocka_unit_test_setup_teardown(test_extra_gpus, setup, teardown),
		cmocka_unit_test_setup_teardown(test_several_rails_per_gpu, setup, teardown),
		cmocka_unit_test_setup_teardown(test_two_port_device, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fallback_rules, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fallback_choice, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nccl_xml, setup, teardown),
		cmocka_unit_test_setup_teardown(test_log_lines, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
