/*
 * nccl-net-rail unit tests on the fake verbs provider (test/fakeverbs/):
 * ABI v12's planeId as NCCL 2.30.7's IB transport reports it
 * (transport/net_ib/init.cc). A physical NIC has the plane NCCL_IB_HCA
 * gives it, else -1. A fused NIC (makeVDevice, two devices or more) has
 * bit 14 set and one bit per member: bit 0 for a member without a plane,
 * bits 1..12 for the distinct planes in device order (not the plane's
 * value). NCCL never pairs two NICs whose defined planeIds differ
 * (graph/search.cc ncclTopoSearchCheckNet), so a fused NIC is kept off
 * NICs and fused NICs on other planes. A 13th distinct plane, or a plane
 * with bit 14 set, makes the transport unusable, as it does NCCL's.
 */
#include "unit.h"

#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include "api.h"
#include "rail.h"

#include "fake.h"

#define FUSED 0x4000	/* bit 14: the planeId of a fused NIC */

/* Five InfiniBand devices, numbered in this order (PCI 10:00.0 .. 14:00.0). */
static const char five_devs[] =
	"device mlx5_0\nport 1 link=ib lid=3\ngid 0 fe80::1\n"
	"device mlx5_1\nport 1 link=ib lid=4\ngid 0 fe80::2\n"
	"device mlx5_2\nport 1 link=ib lid=5\ngid 0 fe80::3\n"
	"device mlx5_3\nport 1 link=ib lid=6\ngid 0 fe80::4\n"
	"device mlx5_4\nport 1 link=ib lid=7\ngid 0 fe80::5\n";

static void props(int dev, struct rail_props *p)
{
	memset(p, 0, sizeof(*p));
	assert_int_equal(rail_net_get_properties(dev, p), ncclSuccess);
}

/* Fuse devs[0..n-1]; the fused NIC's properties. */
static void fused(int n, const int *devs, struct rail_props *p)
{
	int v = -1;

	assert_int_equal(rail_net_make_vdevice(&v, n, devs, NCCL_NET_MAX_DEVS_PER_NIC_V12),
			 ncclSuccess);
	props(v, p);
	assert_int_equal(p->vdev_ndevs, n);
}

/*
 * mlx5_0 rail 0 plane 1 (the first plane seen: bit 1), mlx5_1 rail 0
 * plane 0 (bit 2), mlx5_2 and mlx5_3 no plane (bit 0), mlx5_4 plane 1.
 */
static void test_planes_fused_vnic(void **state)
{
	static const int want_phys[] = { 1, 0, -1, -1, 1 };
	static const struct {
		int devs[2];
		int plane, rail;
	} cases[] = {
		{ { 0, 1 }, FUSED | 0x2 | 0x4, 0 },	/* planes 1 and 0 */
		{ { 1, 2 }, FUSED | 0x4 | 0x1, -1 },	/* plane 0 and a member without */
		{ { 2, 3 }, FUSED | 0x1, -1 },		/* no member has a plane */
		{ { 0, 4 }, FUSED | 0x2, -1 },		/* both on plane 1 */
	};
	struct rail_props p;
	struct fake *F;

	(void)state;
	setenv("NCCL_IB_HCA", "=mlx5_0:1:0:1,mlx5_1:1:0:0,mlx5_2,mlx5_3:1:2,mlx5_4:1::1", 1);
	F = fake_start(five_devs);
	assert_int_equal(F->ndev, 5);
	for (int i = 0; i < 5; i++) {
		props(i, &p);
		assert_int_equal(p.plane_id, want_phys[i]);
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		fused(2, cases[i].devs, &p);
		assert_int_equal(p.plane_id, cases[i].plane);
		assert_int_equal(p.rail_id, cases[i].rail);
	}
	/* A group of one is the device itself (NCCL never asks for one). */
	fused(1, (const int[]){ 1 }, &p);
	assert_int_equal(p.plane_id, 0);
	fake_stop(F);
	/* No device has a plane: a fused NIC still has a defined planeId. */
	F = fake_start(five_devs);
	fused(2, (const int[]){ 0, 1 }, &p);
	assert_int_equal(p.plane_id, FUSED | 0x1);
	props(0, &p);
	assert_int_equal(p.plane_id, -1);
	fake_stop(F);
}

/* The verbs transport does not start; a WARN names the device and the plane. */
static void expect_refused(const char *conf, const char *hca, const char *warn)
{
	struct fake *F;

	setenv("NCCL_IB_HCA", hca, 1);
	F = fake_prepare(conf);
	assert_int_not_equal(rail_net_init(&F->ctx, 1, -1, NULL, FAKE_NET_ABI), ncclSuccess);
	if (!unit_log_has(RAIL_LOG_WARN, warn)) {
		unit_log_dump();
		fail_msg("no warning \"%s\"", warn);
	}
	fake_stop(F);
}

/* As in NCCL (init.cc ncclIbGetPlaneIndex): at most 12 distinct planes, none with bit 14. */
static void test_planes_refused(void **state)
{
	char conf[4096], hca[512];
	size_t c = 0, h = 0;

	(void)state;
	h += (size_t)snprintf(hca, sizeof(hca), "=");
	for (int i = 0; i < 13; i++) {
		c += (size_t)snprintf(conf + c, sizeof(conf) - c,
				      "device mlx5_%d\nport 1 link=ib lid=%d\ngid 0 fe80::%d\n", i,
				      i + 3, i + 1);
		h += (size_t)snprintf(hca + h, sizeof(hca) - h, "%smlx5_%d:1::%d", i ? "," : "",
				      i, 20 + i);
	}
	expect_refused(conf, hca, "puts mlx5_12:1 on a 13th distinct plane (32)");
	/* Twelve are fine. */
	hca[strlen(hca) - strlen(",mlx5_12:1::32")] = '\0';
	setenv("NCCL_IB_HCA", hca, 1);
	assert_int_equal(fake_start(conf)->ndev, 12);
	fake_stop(&fk);
	expect_refused(five_devs, "mlx5_0,mlx5_1:1::16384", "gives mlx5_1:1 plane 16384, which has bit 14");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_planes_fused_vnic, fake_teardown),
		cmocka_unit_test_teardown(test_planes_refused, fake_teardown),
	};

	if (!fake_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_planes: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fake_lib);
			return 1;
		}
		printf("test_ib_planes: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fake_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
