/*
 * nccl-net-rail unit tests on the fake verbs provider (test/fakeverbs/):
 * the plugin loads libfakeverbs.so through NCCL_IBVERBS_LIB, which models
 * ConnectX devices from a description written here and logs every verbs
 * call; the tests assert what the plugin reports and asks of the devices
 * against NCCL 2.30's IB transport (docs/NCCL-IB-PARITY.md): port speed
 * (XDR, RoCE LAG), port and GUID of two-port NICs, fork safety, the
 * address vector on InfiniBand (GRH when required, routed IB, service
 * level), DMA-BUF registration ranges and relaxed ordering, and the eager
 * ring's protocol against the device's data-in-order answer (a device that
 * reorders writes: the single-write protocol copies stale payloads).
 *
 * The library comes from RAIL_FAKEVERBS_LIB (make test-unit sets it), else
 * from next to this binary (build/test/unit/../fakeverbs/).
 */
#include "unit.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "api.h"
#include "handle.h"
#include "param.h"
#include "ib/ib_wire.h"
#include "rail.h"
#include "sysfs.h"

#include "fake.h"

static void props(int dev, struct rail_props *p)
{
	memset(p, 0, sizeof(*p));
	assert_int_equal(rail_net_get_properties(dev, p), ncclSuccess);
}

/* ---- defect 1: port speed ----------------------------------------------- */

/* XDR (0x100) does not fit the 8-bit active_speed: active_speed_ex carries it. */
static void test_speed_xdr(void **state)
{
	struct fake *F;
	struct rail_props p;

	(void)state;
	F = fake_start("lib port_speed=no\n"
		       "device mlx5_0\n"
		       "port 1 link=ib speed=xdr width=4x lid=3\n"
		       "gid 0 fe80::2:c903:a0:1\n");
	assert_int_equal(F->ndev, 1);
	props(0, &p);
	assert_int_equal(p.speed, 800000);	/* 200 Gb/s per lane x 4 */
	fake_stop(F);
}

/* ibv_query_port_speed, where libibverbs has it, wins: a RoCE LAG reports both members. */
static void test_speed_query_port_speed_lag(void **state)
{
	struct fake *F;
	struct rail_props p;
	char line[LINE];

	(void)state;
	F = fake_start("device mlx5_bond_0\n"
		       "port 1 link=eth speed=ndr width=4x port_speed=8000\n"
		       "gid 0 fe80::a:b:c:d type=v1\n"
		       "gid 1 ::ffff:10.1.0.1 type=v1\n"
		       "gid 2 ::ffff:10.1.0.1 type=v2\n");
	assert_int_equal(F->ndev, 1);
	props(0, &p);
	assert_int_equal(p.speed, 800000);
	assert_true(log_find(F, 0, line, "ibv_query_port_speed", "dev=mlx5_bond_0", NULL));
	fake_stop(F);
}

/* Without ibv_query_port_speed and active_speed_ex (rdma-core < 48): NCCL's table. */
static void test_speed_old_library(void **state)
{
	struct fake *F;
	struct rail_props p;

	(void)state;
	F = fake_start("lib port_speed=no speed_ex=no\n"
		       "device mlx5_0\n"
		       "port 1 link=ib speed=hdr width=2x lid=3\n"
		       "gid 0 fe80::2:c903:a0:1\n"
		       "device mlx5_1\n"
		       "port 1 link=ib speed=fdr10 width=4x lid=4\n"
		       "gid 0 fe80::2:c903:a0:2\n");
	assert_int_equal(F->ndev, 2);
	props(0, &p);
	assert_int_equal(p.speed, 100000);	/* HDR 50 x 2 */
	props(1, &p);
	assert_int_equal(p.speed, 40000);	/* FDR10 10 x 4 */
	fake_stop(F);
}

/* ---- defect 3: two-port NICs -------------------------------------------- */

static const char two_functions[] =
	"device mlx5_0 pci=0000:1b:00.0 sys_image_guid=0x1070fd0300a1b2c0\n"
	"port 1 link=eth speed=ndr width=4x\n"
	"gid 0 fe80::1 type=v1\n"
	"gid 1 ::ffff:10.1.0.1 type=v2\n"
	"device mlx5_1 pci=0000:1b:00.1 sys_image_guid=0x1070fd0300a1b2c0\n"
	"port 1 link=eth speed=ndr width=4x\n"
	"gid 0 fe80::2 type=v1\n"
	"gid 1 ::ffff:10.2.0.1 type=v2\n"
	"device mlx5_2 pci=0000:3d:00.0 sys_image_guid=0x1070fd0300a1c4d0\n"
	"port 1 link=ib speed=ndr width=4x lid=7\n"
	"gid 0 fe80::3\n"
	"port 2 link=ib speed=ndr width=4x lid=8\n"
	"gid 0 fe80::4\n";

/*
 * NCCL: pciPath with the function digit zeroed (and the device digits, for
 * VFs), port = ibv port + the number of earlier devices with that path,
 * guid = sys_image_guid. Its search charges NICs with equal guid and port
 * to one budget, so each port and PCI function needs its own port number.
 */
static void test_two_port_nics(void **state)
{
	struct fake *F;
	struct rail_props p[4];

	(void)state;
	F = fake_start(two_functions);
	assert_int_equal(F->ndev, 4);
	for (int i = 0; i < 4; i++)
		props(i, &p[i]);
	assert_int_equal(p[0].port, 1);
	assert_int_equal(p[1].port, 2);
	assert_int_equal(p[2].port, 1);
	assert_int_equal(p[3].port, 3);	/* ibv port 2 + 1 earlier entry of 3d:00.0 */
	assert_true(p[0].guid == 0x1070fd0300a1b2c0ull && p[1].guid == p[0].guid);
	assert_true(p[2].guid == 0x1070fd0300a1c4d0ull && p[3].guid == p[2].guid);
	assert_non_null(p[0].pci_path);
	assert_non_null(p[1].pci_path);
	assert_string_equal(p[0].pci_path, "/sys/devices/pci0000:00/0000:1b:00.0");
	assert_string_equal(p[1].pci_path, "/sys/devices/pci0000:00/0000:1b:00.0");
	assert_string_equal(p[3].pci_path, "/sys/devices/pci0000:00/0000:3d:00.0");
	fake_stop(F);
}

/* ---- device order: NCCL_IB_DEVICE_PCI_ORDER ------------------------------ */

/*
 * Listed by the library out of PCI order: mlx5_0 is the second function of
 * the card whose first function is mlx5_2; mlx5_1 (two ports) is on 3d:00.0.
 */
static const char out_of_pci_order[] =
	"device mlx5_0 pci=0000:1b:00.1\n"
	"port 1 link=ib lid=3\ngid 0 fe80::1\n"
	"device mlx5_1 pci=0000:3d:00.0\n"
	"port 1 link=ib lid=4\ngid 0 fe80::2\n"
	"port 2 link=ib lid=5\ngid 0 fe80::3\n"
	"device mlx5_2 pci=0000:1b:00.0\n"
	"port 1 link=ib lid=6\ngid 0 fe80::4\n";

/* Device i is called names[i] and has NCCL port ports[i]. */
static void expect_devs(struct fake *F, int n, const char *const *names, const int *ports)
{
	struct rail_props p;

	assert_int_equal(F->ndev, n);
	for (int i = 0; i < n; i++) {
		props(i, &p);
		assert_string_equal(p.name, names[i]);
		assert_int_equal(p.port, ports[i]);
	}
}

/*
 * NCCL (init.cc ncclIbCompareDevs): with NCCL_IB_DEVICE_PCI_ORDER=1 (the
 * default) devices are sorted by the last component of their full PCI
 * path; the realPort count then follows that order. 0: the library's order.
 */
static void test_device_pci_order(void **state)
{
	static const char *const sorted[] = { "mlx5_2", "mlx5_0", "mlx5_1:1", "mlx5_1:2" };
	static const char *const listed[] = { "mlx5_0", "mlx5_1:1", "mlx5_1:2", "mlx5_2" };
	static const char *const hca[] = { "mlx5_2", "mlx5_0" };
	static const char *const dd[] = { "mlx5_1", "mlx5_0", "mlx5_0_dma" };
	static const int sorted_ports[] = { 1, 2, 1, 3 }, listed_ports[] = { 1, 1, 3, 2 };
	static const int hca_ports[] = { 1, 2 }, dd_ports[] = { 1, 1, 1 };
	struct fake *F;

	(void)state;
	expect_devs(F = fake_start(out_of_pci_order), 4, sorted, sorted_ports);
	fake_stop(F);
	setenv("NCCL_IB_DEVICE_PCI_ORDER", "0", 1);
	expect_devs(F = fake_start(out_of_pci_order), 4, listed, listed_ports);
	fake_stop(F);
	/* NCCL_IB_HCA selects; its order does not matter. */
	setenv("NCCL_IB_HCA", "=mlx5_0,mlx5_2", 1);
	expect_devs(F = fake_start(out_of_pci_order), 2, hca, hca_ports);
	fake_stop(F);
	/* A Data Direct entry sorts on its PCIe function's path, after the PCIe entry. */
	setenv("NCCL_IB_DATA_DIRECT", "2", 1);
	F = fake_start("device mlx5_0 pci=0000:3d:00.0 "
		       "data_direct=/devices/pci0000:00/0000:00:02.0/0000:02:00.0\n"
		       "port 1 link=ib lid=3\ngid 0 fe80::1\n"
		       "device mlx5_1 pci=0000:1b:00.0\nport 1 link=ib lid=4\ngid 0 fe80::2\n");
	expect_devs(F, 3, dd, dd_ports);
	fake_stop(F);
}

/* ---- defect 4: fork safety ---------------------------------------------- */

/* ibv_fork_init runs once, before any device is listed or opened. */
static void test_fork_init_first(void **state)
{
	struct fake *F;
	char first[LINE];
	FILE *f;

	(void)state;
	F = fake_start("device mlx5_0\nport 1 link=ib lid=3\ngid 0 fe80::1\n");
	f = fopen(F->log, "r");
	assert_non_null(f);
	assert_non_null(fgets(first, sizeof(first), f));
	fclose(f);
	if (strncmp(first, "ibv_fork_init ", 14))
		fail_msg("the first verbs call is not ibv_fork_init but: %s", first);
	assert_int_equal(log_count(F, "ibv_fork_init", NULL, NULL), 1);
	fake_stop(F);
}

/* ---- defect 5: the address vector on InfiniBand ------------------------- */

/* The RTR of the send comm's QP on dev (the connecting side's first modify to RTR). */
static void rtr_line(struct fake *F, const char *dev, char *line)
{
	if (!log_find(F, 0, line, "ibv_modify_qp", "state=RTR", dev))
		fail_msg("no RTR recorded on %s", dev);
}

/* A port flagged GRH_REQUIRED needs a GRH in every address vector. */
static void test_ib_grh_required(void **state)
{
	struct fake *F;
	char line[LINE], buf[64];

	(void)state;
	F = fake_start("device mlx5_0\n"
		       "port 1 link=ib lid=5 flags=grh_required\n"
		       "gid 0 fe80::2:c903:a0:1\n");
	fake_connect(F, 0, 0, -1);
	assert_int_equal(log_count(F, "ibv_modify_qp", "state=RTR", "ret=EINVAL"), 0);
	rtr_line(F, "dev=mlx5_0", line);
	assert_int_equal(kvnum(line, "ah.is_global"), 1);
	assert_int_equal(kvnum(line, "ah.dlid"), 5);
	assert_string_equal(kv(line, "ah.dgid", buf, sizeof(buf)), "fe80::2:c903:a0:1");
	assert_int_equal(kvnum(line, "ah.sgid_index"), 0);
	assert_int_equal(kvnum(line, "ah.hop_limit"), 255);
	fake_stop(F);
}

/* An IB port without the flag, on one subnet: LID routing, no GRH (as NCCL). */
static void test_ib_local_no_grh(void **state)
{
	struct fake *F;
	char line[LINE];

	(void)state;
	F = fake_start("device mlx5_0\nport 1 link=ib lid=5\ngid 0 fe80::2:c903:a0:1\n");
	fake_connect(F, 0, 0, -1);
	rtr_line(F, "dev=mlx5_0", line);
	assert_int_equal(kvnum(line, "ah.is_global"), 0);
	assert_int_equal(kvnum(line, "ah.dlid"), 5);
	fake_stop(F);
}

/*
 * Routed IB: GID index NCCL_IB_ROUTABLE_FLID_GID_INDEX (1) carries a FLID
 * (bytes 4-5) and the subnet (bytes 6-7); peers on different subnets are
 * addressed with a GRH and the remote FLID as dlid.
 */
static void test_ib_routed_flid(void **state)
{
	struct fake *F;
	char line[LINE], buf[64];

	(void)state;
	F = fake_start("device mlx5_0\n"
		       "port 1 link=ib lid=5\n"
		       "gid 0 fe80::2:c903:a0:1\n"
		       "gid 1 fec0:0:11:1:2:c903:a0:1\n"
		       "device mlx5_1\n"
		       "port 1 link=ib lid=6\n"
		       "gid 0 fe80::2:c903:a0:2\n"
		       "gid 1 fec0:0:22:2:2:c903:a0:2\n");
	fake_connect(F, 0, 1, -1);
	rtr_line(F, "dev=mlx5_1", line);	/* sender on mlx5_1 toward mlx5_0 */
	assert_int_equal(kvnum(line, "ah.is_global"), 1);
	assert_int_equal(kvnum(line, "ah.dlid"), 0x11);
	assert_int_equal(kvnum(line, "ah.sgid_index"), 1);
	assert_string_equal(kv(line, "ah.dgid", buf, sizeof(buf)), "fec0:0:11:1:2:c903:a0:1");
	/* the receiver's QP toward mlx5_1 (its loopback QP to itself stays LID-routed) */
	if (!log_find(F, 0, line, "ibv_modify_qp", "dev=mlx5_0", "ah.dgid=fec0:0:22:2:"))
		fail_msg("no RTR on mlx5_0 toward mlx5_1's routable GID");
	assert_int_equal(kvnum(line, "ah.is_global"), 1);
	assert_int_equal(kvnum(line, "ah.dlid"), 0x22);
	assert_int_equal(kvnum(line, "ah.sgid_index"), 1);
	fake_stop(F);
}

/* The service level follows the communicator's traffic class unless NCCL_IB_SL is set. */
static void test_ib_sl_from_traffic_class(void **state)
{
	struct fake *F;
	char line[LINE];
	static const char conf[] = "device mlx5_0\nport 1 link=ib lid=5\ngid 0 fe80::1\n";

	(void)state;
	F = fake_start(conf);
	fake_connect(F, 0, 0, 5);
	for (int i = 0; log_find(F, i, line, "ibv_modify_qp", "state=RTR", NULL); i++)
		assert_int_equal(kvnum(line, "ah.sl"), 5);
	assert_true(log_count(F, "ibv_modify_qp", "state=RTR", NULL) >= 2);
	fake_stop(F);

	setenv("NCCL_IB_SL", "3", 1);
	F = fake_start(conf);
	fake_connect(F, 0, 0, 5);
	for (int i = 0; log_find(F, i, line, "ibv_modify_qp", "state=RTR", NULL); i++)
		assert_int_equal(kvnum(line, "ah.sl"), 3);
	fake_stop(F);
}

/* ---- NCCL_IB_FIFO_TC ---------------------------------------------------- */

static const char roce_two[] = "device mlx5_0 pci=0000:1b:00.0\n"
			       "port 1 link=eth\ngid 0 fe80::1 type=v1\ngid 1 ::ffff:10.1.0.1 type=v2\n"
			       "device mlx5_1 pci=0000:3d:00.0\n"
			       "port 1 link=eth\ngid 0 fe80::2 type=v1\ngid 1 ::ffff:10.2.0.1 type=v2\n";

/* The traffic class QP qpn (a "0x..." string) of dev got at RTR; fails if it had no RTR. */
static int rtr_tc_of(struct fake *F, const char *dev, const char *qpn)
{
	char line[LINE], pat[96];

	snprintf(pat, sizeof(pat), "dev=%s qpn=%s ", dev, qpn);
	if (!log_find(F, 0, line, "ibv_modify_qp", "state=RTR", pat))
		fail_msg("no RTR for qp %s", qpn);
	return (int)kvnum(line, "ah.traffic_class");
}

/* Every RDMA write posted on dev went on a QP whose RTR traffic class is tc; how many. */
static int writes_with_tc(struct fake *F, const char *dev, int tc)
{
	char line[LINE], buf[32], d[32];
	int n = 0;

	snprintf(d, sizeof(d), "dev=%s ", dev);
	for (; log_find(F, n, line, "ibv_post_send", d, "opcode=RDMA_WRITE"); n++)
		assert_int_equal(rtr_tc_of(F, dev, kv(line, "qpn", buf, sizeof(buf))), tc);
	return n;
}

/*
 * NCCL (connect.cc): the receiver's QPs, which carry its clear-to-send
 * writes, get NCCL_IB_FIFO_TC at RTR on RoCE when it is set, the sender's
 * (NCCL_IB_TC) otherwise; the sender's data QPs keep NCCL_IB_TC.
 */
static void test_fifo_tc(void **state)
{
	static char sbuf[65536], rbuf[65536];
	void *smh = NULL, *rmh = NULL;
	struct fake *F;

	(void)state;
	for (int fifo = 0; fifo < 2; fifo++) {
		setenv("NCCL_IB_TC", "106", 1);
		if (fifo)
			setenv("NCCL_IB_FIFO_TC", "96", 1);
		F = fake_start(roce_two);
		fake_connect(F, 0, 1, -1);	/* receiver on mlx5_0, sender on mlx5_1 */
		assert_int_equal(rail_net_reg_mr(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh), 0);
		assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
		assert_int_equal(fake_xfer(F, sbuf, smh, sizeof(sbuf), rbuf, rmh, sizeof(rbuf), 7),
				 sizeof(sbuf));
		/* CTS writes (and credit returns) from the receiver; data from the sender. */
		assert_true(writes_with_tc(F, "mlx5_0", fifo ? 96 : 106) >= 1);
		assert_true(writes_with_tc(F, "mlx5_1", 106) >= 1);
		assert_int_equal(rail_net_dereg_mr(F->sc, smh), 0);
		assert_int_equal(rail_net_dereg_mr(F->rc, rmh), 0);
		fake_stop(F);
	}
	/* InfiniBand has no traffic class: said once, not silently ignored. */
	setenv("NCCL_IB_FIFO_TC", "96", 1);
	F = fake_start("device mlx5_0\nport 1 link=ib lid=5\ngid 0 fe80::1\n");
	fake_connect(F, 0, 0, -1);
	assert_true(unit_log_has(RAIL_LOG_INFO, "NCCL_IB_FIFO_TC=96 has no effect on mlx5_0:1"));
	fake_stop(F);
}

/* ---- defect 8 and relaxed ordering: DMA-BUF registrations --------------- */

static const char roce_dev[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n";

#define GPU_VA 0x7f0000000000ull	/* never dereferenced: DMA-BUF memory is not mapped */

static void *reg_dmabuf(struct fake *F, uint64_t va, size_t size, uint64_t offset)
{
	void *mh = NULL;

	assert_int_equal(rail_net_reg_mr_dmabuf(F->rc, (void *)(uintptr_t)va, size, NCCL_PTR_CUDA,
						offset, 77, &mh), ncclSuccess);
	assert_non_null(mh);
	return mh;
}

/*
 * A buffer 0x100 into its page with a DMA-BUF offset below 0x100: the
 * registration can start only at the buffer, so the cache must not claim
 * the head of the page; a later buffer there gets its own registration.
 */
static void test_dmabuf_unaligned_cache(void **state)
{
	struct fake *F;
	char line[LINE];
	long pg = sysconf(_SC_PAGESIZE);
	void *a, *b;

	(void)state;
	F = fake_start(roce_dev);
	fake_connect(F, 0, 0, -1);
	a = reg_dmabuf(F, GPU_VA + 0x100, 0x2000, 0x40);
	assert_true(log_find(F, 0, line, "ibv_reg_dmabuf_mr", "fd=77", NULL));
	assert_int_equal(kvnum(line, "offset"), 0x40);
	assert_int_equal(kvnum(line, "iova"), (long long)(GPU_VA + 0x100));
	/* up to the page end after the buffer */
	assert_int_equal(kvnum(line, "len"), (long long)(((0x100 + 0x2000 + pg - 1) / pg) * pg -
							  0x100));
	b = reg_dmabuf(F, GPU_VA, 0x80, 0);
	assert_int_equal(log_count(F, "ibv_reg_dmabuf_mr", "fd=77", NULL), 2);
	assert_int_equal(rail_net_dereg_mr(F->rc, b), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, a), ncclSuccess);
	fake_stop(F);
}

/* With enough offset, the whole page range is registered: iova page-aligned. */
static void test_dmabuf_aligned_range(void **state)
{
	struct fake *F;
	char line[LINE];
	long pg = sysconf(_SC_PAGESIZE);
	void *a;

	(void)state;
	F = fake_start(roce_dev);
	fake_connect(F, 0, 0, -1);
	a = reg_dmabuf(F, GPU_VA + 0x100, 0x100, (uint64_t)pg + 0x100);
	assert_true(log_find(F, 0, line, "ibv_reg_dmabuf_mr", "fd=77", NULL));
	assert_int_equal(kvnum(line, "offset"), pg);
	assert_int_equal(kvnum(line, "iova"), (long long)GPU_VA);
	assert_int_equal(kvnum(line, "len"), pg);
	assert_int_equal(rail_net_dereg_mr(F->rc, a), ncclSuccess);
	fake_stop(F);
}

/* NCCL_IB_PCI_RELAXED_ORDERING (2: when ibv_reg_mr_iova2 exists) covers DMA-BUF too. */
static void test_dmabuf_relaxed_ordering(void **state)
{
	struct fake *F;
	char line[LINE];
	void *a;

	(void)state;
	F = fake_start(roce_dev);
	fake_connect(F, 0, 0, -1);
	a = reg_dmabuf(F, GPU_VA, 4096, 0);
	assert_true(log_find(F, 0, line, "ibv_reg_dmabuf_mr", "fd=77", NULL));
	assert_true(kvnum(line, "access") & IBV_ACCESS_RELAXED_ORDERING);
	assert_int_equal(rail_net_dereg_mr(F->rc, a), ncclSuccess);
	fake_stop(F);

	setenv("NCCL_IB_PCI_RELAXED_ORDERING", "0", 1);
	F = fake_start(roce_dev);
	fake_connect(F, 0, 0, -1);
	a = reg_dmabuf(F, GPU_VA, 4096, 0);
	assert_true(log_find(F, 0, line, "ibv_reg_dmabuf_mr", "fd=77", NULL));
	assert_false(kvnum(line, "access") & IBV_ACCESS_RELAXED_ORDERING);
	assert_int_equal(rail_net_dereg_mr(F->rc, a), ncclSuccess);
	fake_stop(F);
}

/* ---- the fake's data path ------------------------------------------------ */

/* A message goes through the fake: RDMA writes are carried out with memcpy. */
static void test_transfer_through_fake(void **state)
{
	struct fake *F;
	static char sbuf[65536], rbuf[65536];
	void *smh = NULL, *rmh = NULL, *sreq = NULL, *rreq = NULL;
	void *data[1] = { rbuf };
	size_t sizes[1] = { sizeof(rbuf) };
	int tags[1] = { 7 }, done = 0, got[1] = { 0 };
	void *mhs[1];
	uint64_t deadline;

	(void)state;
	F = fake_start(roce_dev);
	fake_connect(F, 0, 0, -1);
	for (size_t i = 0; i < sizeof(sbuf); i++)
		sbuf[i] = (char)(i * 7 + 1);
	memset(rbuf, 0, sizeof(rbuf));
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh), 0);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	mhs[0] = rmh;
	deadline = rail_now_ns() + 10ull * 1000000000ull;
	while ((!sreq || !rreq) && rail_now_ns() < deadline) {
		if (!rreq)
			assert_int_equal(rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq), 0);
		if (!sreq)
			assert_int_equal(rail_net_isend(F->sc, sbuf, sizeof(sbuf), 7, smh, &sreq), 0);
	}
	assert_non_null(sreq);
	assert_non_null(rreq);
	while (!done && rail_now_ns() < deadline)
		assert_int_equal(rail_net_test(rreq, &done, got), ncclSuccess);
	assert_true(done);
	for (done = 0; !done && rail_now_ns() < deadline;)
		assert_int_equal(rail_net_test(sreq, &done, NULL), ncclSuccess);
	assert_int_equal(got[0], (int)sizeof(sbuf));
	assert_memory_equal(sbuf, rbuf, sizeof(sbuf));
	assert_true(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE", NULL) > 0);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), 0);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), 0);
	fake_stop(F);
}

/*
 * A listener that refuses the connection (here: the handle's nonce was
 * changed) and whose handle says it runs another release: the connector's
 * warning names both releases, the likely cause.
 */
static void test_refusal_names_release(void **state)
{
	struct fake *F;
	uint8_t handle[RAIL_HANDLE_SIZE];
	struct rail_handle h;
	char why[128];
	ncclResult_t cr = ncclSuccess, ar = ncclSuccess;
	uint64_t deadline = rail_now_ns() + 30ull * 1000000000ull;

	(void)state;
	F = fake_start(roce_dev);
	assert_int_equal(rail_net_listen(F->ctx, 0, handle, &F->lc), ncclSuccess);
	assert_int_equal(rail_handle_decode(handle, sizeof(handle), &h, why, sizeof(why)), 0);
	h.nonce ^= 0x5a5aull;
	assert_int_equal(rail_handle_encode(&h, handle, sizeof(handle)), 0);
	memcpy(handle + RAIL_HANDLE_RELEASE_OFFSET, "9.8.7", 6);
	while (cr == ncclSuccess && !F->sc && rail_now_ns() < deadline) {
		cr = rail_net_connect(F->ctx, 0, -1, handle, &F->sc);
		if (!F->rc && ar == ncclSuccess)
			ar = rail_net_accept(F->lc, &F->rc);
	}
	assert_int_not_equal(cr, ncclSuccess);
	assert_null(F->sc);
	unit_assert_logged2(RAIL_LOG_WARN, "refused by the listener",
			    "(the listener runs nccl-net-rail 9.8.7, this node " RAIL_VERSION_STRING
			    ": use one release on every node)");
	fake_stop(F);
}

/* ---- defect 2: the eager ring's order ----------------------------------- */

/*
 * One eager message of `size` bytes, sent before its receive is posted (so
 * the receiver finds it in the ring at irecv). Returns 1 if the receive got
 * the sender's bytes, 0 if it got anything else (a stale payload).
 */
static int eager_one(struct fake *F, size_t size, unsigned seed)
{
	static unsigned char sbuf[4096], rbuf[4096];
	void *smh = NULL, *rmh = NULL, *sreq = NULL, *rreq = NULL;
	void *data[1] = { rbuf }, *mhs[1];
	size_t sizes[1] = { sizeof(rbuf) };
	int tags[1] = { 5 }, done = 0, got[1] = { 0 }, same;
	uint64_t deadline = rail_now_ns() + 10ull * 1000000000ull;

	assert_true(size <= sizeof(sbuf));
	for (size_t i = 0; i < size; i++)
		sbuf[i] = (unsigned char)(seed + i * 13 + 1);
	memset(rbuf, 0xee, sizeof(rbuf));
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, sizeof(sbuf), NCCL_PTR_HOST, &smh), 0);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, sizeof(rbuf), NCCL_PTR_HOST, &rmh), 0);
	mhs[0] = rmh;
	while (!sreq && rail_now_ns() < deadline)
		assert_int_equal(rail_net_isend(F->sc, sbuf, size, 5, smh, &sreq), ncclSuccess);
	assert_non_null(sreq);
	assert_int_equal(rail_net_test(sreq, &done, NULL), ncclSuccess);
	assert_true(done);	/* an eager send is complete at post */
	while (!rreq && rail_now_ns() < deadline)
		assert_int_equal(rail_net_irecv(F->rc, 1, data, sizes, tags, mhs, &rreq),
				 ncclSuccess);
	assert_non_null(rreq);
	for (done = 0; !done && rail_now_ns() < deadline;)
		assert_int_equal(rail_net_test(rreq, &done, got), ncclSuccess);
	assert_true(done);
	assert_int_equal(got[0], (int)size);
	same = memcmp(sbuf, rbuf, size) == 0;
	assert_int_equal(rbuf[size], 0xee);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), 0);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), 0);
	return same;
}

/* " imm=" as the fake logs it (the raw, network-order imm_data) for an eager message's seq. */
static const char *ring_imm(uint32_t seq, char *buf, size_t len)
{
	snprintf(buf, len, "imm=0x%x", htonl(0xa0000000u | seq));
	return buf;
}

static const char ooo_dev[] = "device mlx5_0 data_in_order=0 reorder=yes\n"
			      "port 1 link=eth speed=ndr width=4x\n"
			      "gid 0 fe80::1 type=v1\n"
			      "gid 1 ::ffff:10.1.0.1 type=v2\n";

/*
 * The receiver asks ibv_query_qp_data_in_order about RDMA writes into its
 * eager QP, with RETURN_CAPS, once the QP is ready; only the whole-message
 * bit selects the single-write protocol (128-byte blocks are not enough:
 * the trailer could land before the payload).
 */
static void test_eager_order_query(void **state)
{
	static const struct {
		const char *caps;
		int safe;
	} cases[] = { { "1", 0 }, { "3", 0 }, { "2", 1 }, { "0", 1 } };
	char conf[256], line[LINE], imm[32];

	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(cases); i++) {
		struct fake *F;

		snprintf(conf, sizeof(conf), "device mlx5_0 data_in_order=%s\n%s", cases[i].caps,
			 strchr(roce_dev, '\n') + 1);
		F = fake_start(conf);
		fake_connect(F, 0, 0, -1);
		assert_int_equal(log_count(F, "ibv_query_qp_data_in_order", NULL, NULL), 1);
		assert_true(log_find(F, 0, line, "ibv_query_qp_data_in_order", NULL, NULL));
		assert_int_equal(kvnum(line, "op"), IBV_WR_RDMA_WRITE);
		assert_int_equal(kvnum(line, "flags"), 1);	/* RETURN_CAPS */
		assert_int_equal(unit_log_count2(RAIL_LOG_INFO, "eager ring order-safe",
						 "ibv_query_qp_data_in_order"), cases[i].safe);
		assert_int_equal(unit_log_count2(RAIL_LOG_INFO, "eager ring in-order",
						 "ibv_query_qp_data_in_order"), !cases[i].safe);
		/* above RAIL_IB_LL_MAX: order-safe, a write with immediate */
		assert_true(eager_one(F, 1000, (unsigned)i));
		assert_int_equal(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE_WITH_IMM",
					   ring_imm(1, imm, sizeof(imm))), cases[i].safe);
		/* the sender logged the receiver's choice at its first eager send */
		assert_int_equal(unit_log_count2(RAIL_LOG_INFO, "eager ring order-safe",
						 "as the receiver chose"), cases[i].safe);
		fake_stop(F);
	}
}

/*
 * The fake places a reordering device's writes end first: the single-write
 * protocol, forced on such a device, copies a stale payload (the defect;
 * this also shows the fake models it).
 */
static void test_eager_inorder_on_reordering_device(void **state)
{
	struct fake *F;

	(void)state;
	setenv("NCCL_RAIL_IB_EAGER_ORDER", "inorder", 1);
	F = fake_start(ooo_dev);
	fake_connect(F, 0, 0, -1);
	assert_true(unit_log_has(RAIL_LOG_INFO, "eager ring in-order"));
	assert_false(eager_one(F, 4000, 1));	/* stale: only the trailer had landed */
	assert_true(log_count(F, "reorder", NULL, NULL) > 0);
	fake_stop(F);
}

/*
 * On a device that promises no order and reorders writes, the default
 * (auto) picks the order-safe protocol: each eager message a write with
 * immediate, read after its completion; the payload arrives intact.
 */
static void test_eager_auto_on_reordering_device(void **state)
{
	struct fake *F;
	char imm[32];

	(void)state;
	F = fake_start(ooo_dev);
	fake_connect(F, 0, 0, -1);
	for (unsigned k = 0; k < 3; k++)
		assert_true(eager_one(F, 4000 - k * 1000, k));
	assert_true(log_count(F, "reorder", NULL, NULL) >= 3);
	assert_true(unit_log_has(RAIL_LOG_INFO, "eager ring order-safe"));
	for (uint32_t seq = 1; seq <= 3; seq++)
		assert_int_equal(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE_WITH_IMM",
					   ring_imm(seq, imm, sizeof(imm))), 1);
	fake_stop(F);
}

/*
 * The order-safe ring's small messages are LL images (ib_wire.h): one plain
 * RDMA write of 8-byte words that each carry their message's flag, taken
 * without a completion. On a device that places a write's last 8 bytes
 * (the size word) first and the rest later, each arrives intact; larger
 * messages, interleaved, still go as writes with immediate.
 */
static void test_eager_ll_on_reordering_device(void **state)
{
	static const size_t sizes[] = { 8, 4000, 0, 1, RAIL_IB_LL_MAX, RAIL_IB_LL_MAX + 1, 100 };
	char conf[256], imm[32], len[32];
	struct fake *F;

	(void)state;
	snprintf(conf, sizeof(conf), "device mlx5_0 data_in_order=0 reorder=yes reorder_tail=8\n%s",
		 strchr(ooo_dev, '\n') + 1);
	F = fake_start(conf);
	fake_connect(F, 0, 0, -1);
	for (unsigned k = 0; k < RAIL_ARRAY_SIZE(sizes); k++)
		assert_true(eager_one(F, sizes[k], k));
	assert_true(unit_log_has(RAIL_LOG_INFO, "eager ring order-safe"));
	for (unsigned k = 0; k < RAIL_ARRAY_SIZE(sizes); k++) {
		int ll = sizes[k] <= RAIL_IB_LL_MAX;

		assert_int_equal(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE_WITH_IMM",
					   ring_imm(k + 1, imm, sizeof(imm))), !ll);
		snprintf(len, sizeof(len), "len=%u ", rail_ib_ll_bytes((uint32_t)sizes[k]));
		if (ll)	/* the image went whole-word out of order: its size word first */
			assert_true(log_count(F, "reorder", len, "held=") >= 1);
	}
	fake_stop(F);
}

/*
 * Small control and eager writes are signaled one in 16 (a completion costs
 * the provider, and rxe's kernel inside the post, on every message); a
 * sender closing with unsignaled writes outstanding posts one signaled
 * zero-byte write, whose completion says they all reached the peer.
 */
static void test_send_close_retires_unsignaled(void **state)
{
	char line[LINE];
	struct fake *F;
	int signaled = 0, writes = 0;

	(void)state;
	F = fake_start(roce_dev);
	fake_connect(F, 0, 0, -1);
	for (unsigned k = 0; k < 19; k++)
		assert_true(eager_one(F, 8, k));
	for (int n = 0; log_find(F, n, line, "ibv_post_send", "opcode=RDMA_WRITE ", NULL); n++) {
		if (strstr(line, "len=0 "))
			continue;
		writes++;
		signaled += (kvnum(line, "send_flags") & IBV_SEND_SIGNALED) != 0;
	}
	/* the 19 eager writes, and the receiver's credit words, one in 16 of each QP's */
	assert_true(writes >= 19);
	assert_true(signaled >= 1 && signaled <= writes / 16 + 2);
	assert_int_equal(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE ", "len=0 "), 0);
	assert_int_equal(rail_net_close_send(F->sc), ncclSuccess);
	F->sc = NULL;
	assert_true(log_find(F, 0, line, "ibv_post_send", "opcode=RDMA_WRITE ", "len=0 "));
	assert_true(kvnum(line, "send_flags") & IBV_SEND_SIGNALED);
	assert_false(unit_log_has(RAIL_LOG_INFO, "still unacknowledged"));
	fake_stop(F);
}

/*
 * A receiver that already closed needs nothing more: the sender's closing
 * write then goes to a QP that is gone, which real hardware retries for
 * seconds. NCCL closes hundreds of comms at teardown, so the sender must not
 * wait out its 1 s bound on each: the peer's closed socket ends the wait.
 */
static void test_send_close_after_receiver(void **state)
{
	char conf[256];
	struct fake *F;
	uint64_t t0, ms;

	(void)state;
	snprintf(conf, sizeof(conf), "device mlx5_0 retrying=yes\n%s", strchr(roce_dev, '\n') + 1);
	F = fake_start(conf);
	fake_connect(F, 0, 0, -1);
	for (unsigned k = 0; k < 3; k++)
		assert_true(eager_one(F, 8, k));
	assert_int_equal(rail_net_close_recv(F->rc), ncclSuccess);
	F->rc = NULL;
	t0 = rail_now_ns();
	assert_int_equal(rail_net_close_send(F->sc), ncclSuccess);
	F->sc = NULL;
	ms = (rail_now_ns() - t0) / 1000000;
	/* the mark was posted, and held by the device (the receiver's QP is gone) */
	assert_true(log_count(F, "wc", "held", NULL) >= 1);
	assert_false(unit_log_has(RAIL_LOG_INFO, "still unacknowledged"));
	assert_true(ms < 500);
	fake_stop(F);
}

/* Either side's NCCL_RAIL_IB_EAGER_ORDER=safe wins over a device that promises order. */
static void test_eager_safe_forced(void **state)
{
	struct fake *F;
	char imm[32];

	(void)state;
	setenv("NCCL_RAIL_IB_EAGER_ORDER", "safe", 1);
	F = fake_start(roce_dev);
	fake_connect(F, 0, 0, -1);
	assert_int_equal(log_count(F, "ibv_query_qp_data_in_order", NULL, NULL), 0);
	assert_true(unit_log_has(RAIL_LOG_INFO, "NCCL_RAIL_IB_EAGER_ORDER=safe on the receiver"));
	/* 8 bytes: an LL image (5 words, one plain write); 1000: a write with immediate */
	assert_true(eager_one(F, 8, 3));
	assert_true(eager_one(F, 1000, 4));
	assert_int_equal(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE ", "len=40 "), 1);
	assert_int_equal(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE_WITH_IMM",
				   ring_imm(1, imm, sizeof(imm))), 0);
	assert_int_equal(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE_WITH_IMM",
				   ring_imm(2, imm, sizeof(imm))), 1);
	fake_stop(F);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_speed_xdr, fake_teardown),
		cmocka_unit_test_teardown(test_speed_query_port_speed_lag, fake_teardown),
		cmocka_unit_test_teardown(test_speed_old_library, fake_teardown),
		cmocka_unit_test_teardown(test_two_port_nics, fake_teardown),
		cmocka_unit_test_teardown(test_device_pci_order, fake_teardown),
		cmocka_unit_test_teardown(test_fork_init_first, fake_teardown),
		cmocka_unit_test_teardown(test_ib_grh_required, fake_teardown),
		cmocka_unit_test_teardown(test_ib_local_no_grh, fake_teardown),
		cmocka_unit_test_teardown(test_ib_routed_flid, fake_teardown),
		cmocka_unit_test_teardown(test_ib_sl_from_traffic_class, fake_teardown),
		cmocka_unit_test_teardown(test_fifo_tc, fake_teardown),
		cmocka_unit_test_teardown(test_dmabuf_unaligned_cache, fake_teardown),
		cmocka_unit_test_teardown(test_dmabuf_aligned_range, fake_teardown),
		cmocka_unit_test_teardown(test_dmabuf_relaxed_ordering, fake_teardown),
		cmocka_unit_test_teardown(test_transfer_through_fake, fake_teardown),
		cmocka_unit_test_teardown(test_refusal_names_release, fake_teardown),
		cmocka_unit_test_teardown(test_eager_order_query, fake_teardown),
		cmocka_unit_test_teardown(test_eager_inorder_on_reordering_device, fake_teardown),
		cmocka_unit_test_teardown(test_eager_auto_on_reordering_device, fake_teardown),
		cmocka_unit_test_teardown(test_eager_ll_on_reordering_device, fake_teardown),
		cmocka_unit_test_teardown(test_send_close_retires_unsignaled, fake_teardown),
		cmocka_unit_test_teardown(test_send_close_after_receiver, fake_teardown),
		cmocka_unit_test_teardown(test_eager_safe_forced, fake_teardown),
	};

	if (!fake_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_fake: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fake_lib);
			return 1;
		}
		printf("test_ib_fake: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fake_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
