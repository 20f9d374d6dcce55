/*
 * nccl-net-rail unit tests: mlx5 Data Direct on the fake providers. The
 * plugin loads the fake libibverbs (NCCL_IBVERBS_LIB) and the fake libmlx5
 * beside it (NCCL_RAIL_MLX5_LIB, test/fakeverbs/mlx5/), whose devices get a
 * Data Direct DMA function from the description's data_direct= key. As
 * NCCL 2.30 (init.cc, reg.cc): NCCL_IB_DATA_DIRECT=1 exposes such a port on
 * that function ("/sys" + the path, named DEV_dma) with forceFlush, and its
 * DMA-BUF registrations go through mlx5dv_reg_dmabuf_mr with the Data
 * Direct access bit; 2 exposes the PCIe device too; 0, a missing library
 * or a library without the calls leave everything as it was.
 */
#include "unit.h"

#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "api.h"
#include "param.h"
#include "rail.h"

#include "fake.h"

#define DD_SYSFS "/devices/pci0000:00/0000:00:02.0/0000:02:00.0"
#define DD_PATH "/sys" DD_SYSFS
#define GPU_VA 0x7f0000000000ull	/* never dereferenced: DMA-BUF memory is not mapped */
#define DMABUF_FD 77
#define MLX5_ACCESS_DD 1	/* MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT (rdma-core's mlx5dv.h) */

static const char dd_dev[] = "device mlx5_0 pci=0000:1b:00.0 data_direct=" DD_SYSFS "\n"
			     "port 1 link=eth speed=ndr width=4x\n"
			     "gid 0 fe80::1 type=v1\n"
			     "gid 1 ::ffff:10.1.0.1 type=v2\n";

static void props(int dev, struct rail_props *p)
{
	memset(p, 0, sizeof(*p));
	assert_int_equal(rail_net_get_properties(dev, p), ncclSuccess);
}

static void *reg_dmabuf(void *comm, uint64_t va)
{
	void *mh = NULL;

	assert_int_equal(rail_net_reg_mr_dmabuf(comm, (void *)(uintptr_t)va, 4096, NCCL_PTR_CUDA,
						0, DMABUF_FD, &mh), ncclSuccess);
	assert_non_null(mh);
	return mh;
}

/* The device is what it was before Data Direct: PCIe path, no forceFlush, plain DMA-BUF. */
static void assert_pcie_only(struct fake *F)
{
	struct rail_props p;
	char line[LINE];
	void *mh;

	assert_int_equal(F->ndev, 1);
	props(0, &p);
	assert_string_equal(p.name, "mlx5_0");
	assert_non_null(p.pci_path);
	assert_non_null(strstr(p.pci_path, "0000:1b:00.0"));
	assert_int_equal(p.force_flush, 0);
	fake_connect(F, 0, 0, -1);
	mh = reg_dmabuf(F->rc, GPU_VA);
	assert_true(log_find(F, 0, line, "ibv_reg_dmabuf_mr", "fd=77", NULL));
	assert_int_equal(log_count(F, "mlx5dv_reg_dmabuf_mr", NULL, NULL), 0);
	assert_int_equal(rail_net_dereg_mr(F->rc, mh), ncclSuccess);
}

/* =1 (NCCL's default): one device, on the Data Direct function, forceFlush, mlx5dv DMA-BUF. */
static void test_dd_replaces_pcie(void **state)
{
	struct fake *F;
	struct rail_props p;
	char line[LINE];
	void *mh, *host_mh;
	static char host[8192];

	(void)state;
	F = fake_start(dd_dev);
	assert_int_equal(F->ndev, 1);
	props(0, &p);
	assert_string_equal(p.name, "mlx5_0_dma");
	assert_non_null(p.pci_path);
	assert_string_equal(p.pci_path, DD_PATH);
	assert_int_equal(p.force_flush, 1);
	unit_assert_logged2(RAIL_LOG_INFO, "mlx5_0: mlx5 Data Direct DMA function " DD_PATH,
			    "instead of the PCIe path");
	assert_true(log_find(F, 0, line, "mlx5dv_get_data_direct_sysfs_path", "dev=mlx5_0",
			     "ret=0"));

	fake_connect(F, 0, 0, -1);
	mh = reg_dmabuf(F->rc, GPU_VA);
	assert_true(log_find(F, 0, line, "mlx5dv_reg_dmabuf_mr", "fd=77", NULL));
	assert_int_equal(kvnum(line, "mlx5_access"), MLX5_ACCESS_DD);
	assert_true(kvnum(line, "access") & IBV_ACCESS_RELAXED_ORDERING);
	assert_int_equal(log_count(F, "ibv_reg_dmabuf_mr", "fd=77", NULL), 0);
	/* host memory is registered as on any device */
	assert_int_equal(rail_net_reg_mr(F->rc, host, sizeof(host), NCCL_PTR_HOST, &host_mh),
			 ncclSuccess);
	assert_true(log_find(F, 0, line, "ibv_reg_mr_iova2", NULL, NULL));
	assert_int_equal(rail_net_dereg_mr(F->rc, host_mh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, mh), ncclSuccess);
	fake_stop(F);
}

/* =0: no Data Direct, and libmlx5 is not even asked. */
static void test_dd_off(void **state)
{
	struct fake *F;

	(void)state;
	setenv("NCCL_IB_DATA_DIRECT", "0", 1);
	F = fake_start(dd_dev);
	assert_pcie_only(F);
	assert_int_equal(log_count(F, "mlx5dv_get_data_direct_sysfs_path", NULL, NULL), 0);
	assert_int_equal(log_count(F, "mlx5dv_is_supported", NULL, NULL), 0);
	fake_stop(F);
}


/*
 * =2: the PCIe device, then the Data Direct one; each registers DMA-BUF its
 * own way, and the shared per-HCA cache does not hand one's MR to the other.
 */
static void test_dd_both(void **state)
{
	struct fake *F;
	struct rail_props p;
	char line[LINE];
	void *a, *b, *sc0, *rc0, *lc0;

	(void)state;
	setenv("NCCL_IB_DATA_DIRECT", "2", 1);
	F = fake_start(dd_dev);
	assert_int_equal(F->ndev, 2);
	props(0, &p);
	assert_string_equal(p.name, "mlx5_0");
	assert_non_null(strstr(p.pci_path, "0000:1b:00.0"));
	assert_int_equal(p.force_flush, 0);
	props(1, &p);
	assert_string_equal(p.name, "mlx5_0_dma");
	assert_string_equal(p.pci_path, DD_PATH);
	assert_int_equal(p.force_flush, 1);
	unit_assert_logged2(RAIL_LOG_INFO, "mlx5 Data Direct DMA function " DD_PATH,
			    "second device (_dma) beside the PCIe one");

	fake_connect(F, 0, 0, -1);
	a = reg_dmabuf(F->rc, GPU_VA);
	assert_int_equal(log_count(F, "ibv_reg_dmabuf_mr", "fd=77", NULL), 1);
	assert_int_equal(log_count(F, "mlx5dv_reg_dmabuf_mr", "fd=77", NULL), 0);
	/* a second connection, on the Data Direct device, while a stays registered */
	sc0 = F->sc, rc0 = F->rc, lc0 = F->lc;
	F->sc = F->rc = F->lc = NULL;
	fake_connect(F, 1, 1, -1);
	b = reg_dmabuf(F->rc, GPU_VA);
	assert_int_equal(log_count(F, "ibv_reg_dmabuf_mr", "fd=77", NULL), 1);
	assert_true(log_find(F, 0, line, "mlx5dv_reg_dmabuf_mr", "fd=77", NULL));
	assert_int_equal(kvnum(line, "mlx5_access"), MLX5_ACCESS_DD);
	assert_int_equal(rail_net_dereg_mr(F->rc, b), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(rc0, a), ncclSuccess);
	assert_int_equal(rail_net_close_send(sc0), ncclSuccess);
	assert_int_equal(rail_net_close_recv(rc0), ncclSuccess);
	assert_int_equal(rail_net_close_listen(lc0), ncclSuccess);
	fake_stop(F);
}

/* No libmlx5: one INFO line, and the device as before. */
static void test_dd_library_absent(void **state)
{
	struct fake *F;

	(void)state;
	setenv("NCCL_RAIL_MLX5_LIB", "/nonexistent/libmlx5.so.1", 1);
	F = fake_start(dd_dev);
	assert_int_equal(unit_log_count(RAIL_LOG_INFO, "Data Direct"), 1);
	unit_assert_logged2(RAIL_LOG_INFO, "/nonexistent/libmlx5.so.1 cannot be loaded",
			    "mlx5 Data Direct is not used");
	assert_int_equal(unit_log_count(RAIL_LOG_WARN, ""), 0);
	assert_pcie_only(F);
	fake_stop(F);
}

/* A libmlx5 without the calls (rdma-core before 54; here the fake libibverbs): the same. */
static void test_dd_symbols_absent(void **state)
{
	struct fake *F;

	(void)state;
	setenv("NCCL_RAIL_MLX5_LIB", fake_lib, 1);
	F = fake_start(dd_dev);
	assert_int_equal(unit_log_count(RAIL_LOG_INFO, "Data Direct"), 1);
	unit_assert_logged2(RAIL_LOG_INFO, "lacks mlx5dv_is_supported@MLX5_1.8",
			    "mlx5 Data Direct is not used");
	assert_pcie_only(F);
	fake_stop(F);
}

/*
 * rdma-core before 54: libmlx5.so.1 is the mlx5 provider, which registers
 * itself with libibverbs when loaded and lacks the Data Direct calls. The
 * plugin must not unload it: libibverbs calls into it at the next
 * ibv_get_device_list (on the rxe guest, Debian 12's rdma-core: SIGSEGV in
 * every init; the fake aborts).
 */
static void test_dd_old_provider_kept(void **state)
{
	struct fake *F;
	char old[PATH_MAX];
	const char *slash = strrchr(fake_lib, '/');

	(void)state;
	snprintf(old, sizeof(old), "%.*s/libfakemlx5old.so", (int)(slash - fake_lib), fake_lib);
	setenv("NCCL_RAIL_MLX5_LIB", old, 1);
	F = fake_start(dd_dev);
	unit_assert_logged2(RAIL_LOG_INFO, "lacks mlx5dv_is_supported@MLX5_1.8",
			    "mlx5 Data Direct is not used");
	assert_pcie_only(F);
	fake_stop(F);
	/* A second init lists the devices again. */
	setenv("NCCL_RAIL_MLX5_LIB", old, 1);
	F = fake_start(dd_dev);
	assert_int_equal(F->ndev, 1);
	fake_stop(F);
}

/* A Data Direct function but no DMA-BUF (mlx5dv_reg_dmabuf_mr(fd -1): EOPNOTSUPP): PCIe. */
static void test_dd_no_dmabuf(void **state)
{
	struct fake *F;
	struct rail_props p;

	(void)state;
	F = fake_start("device mlx5_0 pci=0000:1b:00.0 dmabuf=no data_direct=" DD_SYSFS "\n"
		       "port 1 link=eth speed=ndr width=4x\n"
		       "gid 0 fe80::1 type=v1\n"
		       "gid 1 ::ffff:10.1.0.1 type=v2\n");
	assert_int_equal(F->ndev, 1);
	props(0, &p);
	assert_string_equal(p.name, "mlx5_0");
	assert_non_null(strstr(p.pci_path, "0000:1b:00.0"));
	assert_int_equal(p.force_flush, 0);
	unit_assert_logged2(RAIL_LOG_INFO, "mlx5_0: PCIe path (mlx5 Data Direct function " DD_PATH
			    " not used", "mlx5dv_reg_dmabuf_mr(fd -1) returned Operation not "
			    "supported");
	fake_stop(F);
}

/* An mlx5 device without a Data Direct function, and a device that is not mlx5: PCIe. */
static void test_dd_none(void **state)
{
	struct fake *F;
	struct rail_props p;

	(void)state;
	F = fake_start("device mlx5_0 pci=0000:1b:00.0\n"
		       "port 1 link=eth speed=ndr width=4x\n"
		       "gid 0 fe80::1 type=v1\n"
		       "gid 1 ::ffff:10.1.0.1 type=v2\n"
		       "device bnxt_re0 pci=0000:3d:00.0\n"
		       "port 1 link=eth speed=ndr width=4x\n"
		       "gid 0 fe80::2 type=v1\n"
		       "gid 1 ::ffff:10.2.0.1 type=v2\n");
	assert_int_equal(F->ndev, 2);
	for (int i = 0; i < 2; i++) {
		props(i, &p);
		assert_null(strstr(p.name, "_dma"));
		assert_int_equal(p.force_flush, 0);
	}
	unit_assert_logged2(RAIL_LOG_INFO, "mlx5_0: PCIe path", "ENODEV");
	unit_assert_logged2(RAIL_LOG_INFO, "bnxt_re0: PCIe path", "not an mlx5 device");
	assert_int_equal(log_count(F, "mlx5dv_reg_dmabuf_mr", NULL, NULL), 0);
	fake_stop(F);
}

/*
 * Two functions of one card, each with its Data Direct function on one PCI
 * device: NCCL counts realPort on the Data Direct paths with the function
 * digit ignored (ncclIbMatchVfPath), so the second is port 2.
 */
static void test_dd_two_functions_port(void **state)
{
	struct fake *F;
	struct rail_props p;

	(void)state;
	F = fake_start("device mlx5_0 pci=0000:1b:00.0 sys_image_guid=0x1070fd0300a1b2c0 "
		       "data_direct=/devices/pci0000:00/0000:00:02.0/0000:02:00.0\n"
		       "port 1 link=eth speed=ndr width=4x\n"
		       "gid 0 fe80::1 type=v1\n"
		       "gid 1 ::ffff:10.1.0.1 type=v2\n"
		       "device mlx5_1 pci=0000:1b:00.1 sys_image_guid=0x1070fd0300a1b2c0 "
		       "data_direct=/devices/pci0000:00/0000:00:02.0/0000:02:00.1\n"
		       "port 1 link=eth speed=ndr width=4x\n"
		       "gid 0 fe80::2 type=v1\n"
		       "gid 1 ::ffff:10.2.0.1 type=v2\n");
	assert_int_equal(F->ndev, 2);
	props(0, &p);
	assert_string_equal(p.pci_path, "/sys/devices/pci0000:00/0000:00:02.0/0000:02:00.0");
	assert_int_equal(p.port, 1);
	props(1, &p);
	assert_string_equal(p.name, "mlx5_1_dma");
	assert_string_equal(p.pci_path, "/sys/devices/pci0000:00/0000:00:02.0/0000:02:00.1");
	assert_int_equal(p.port, 2);
	fake_stop(F);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_dd_replaces_pcie, fake_teardown),
		cmocka_unit_test_teardown(test_dd_off, fake_teardown),
		cmocka_unit_test_teardown(test_dd_both, fake_teardown),
		cmocka_unit_test_teardown(test_dd_library_absent, fake_teardown),
		cmocka_unit_test_teardown(test_dd_symbols_absent, fake_teardown),
		cmocka_unit_test_teardown(test_dd_old_provider_kept, fake_teardown),
		cmocka_unit_test_teardown(test_dd_no_dmabuf, fake_teardown),
		cmocka_unit_test_teardown(test_dd_none, fake_teardown),
		cmocka_unit_test_teardown(test_dd_two_functions_port, fake_teardown),
	};
	char mlx5[PATH_MAX];

	if (!fake_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_datadirect: RAIL_FAKEVERBS_LIB=%s cannot be read\n",
			       fake_lib);
			return 1;
		}
		printf("test_ib_datadirect: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fake_lib);
		return 0;
	}
	fake_mlx5_lib(mlx5, sizeof(mlx5));
	if (access(mlx5, R_OK)) {
		printf("test_ib_datadirect: %s cannot be read (make tests)\n", mlx5);
		return 1;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
