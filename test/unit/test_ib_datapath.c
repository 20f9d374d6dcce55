/*
 * nccl-net-rail unit tests of the verbs data path on the fake verbs provider
 * (test/fakeverbs/, helpers in fake.h), against NCCL 2.30's IB transport
 * (docs/NCCL-IB-PARITY.md): adaptive routing (the WR form of a large
 * message), fused devices (every message striped over the members), small
 * sends from GPU memory (no wait before asking for a clear-to-send) and ECE
 * negotiation.
 */
#include "unit.h"

#include <arpa/inet.h>

#include "fake.h"
#include "../fakeverbs/fv_confs.h"

#if defined(__SANITIZE_THREAD__)
#define RAIL_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RAIL_TEST_UNDER_TSAN 1
#endif
#endif
#ifndef RAIL_TEST_UNDER_TSAN
#define RAIL_TEST_UNDER_TSAN 0
#endif

static const char ib_dev[] = "device mlx5_0\n"
			     "port 1 link=ib speed=ndr width=4x lid=5\n"
			     "gid 0 fe80::2:c903:a0:1\n";

static const char roce_dev[] = "device mlx5_0\n"
			       "port 1 link=eth speed=ndr width=4x\n"
			       "gid 0 fe80::1 type=v1\n"
			       "gid 1 ::ffff:10.1.0.1 type=v2\n";

#define BIG 65536
static char sbuf[4 * BIG], rbuf[4 * BIG];

static void fill(size_t n)
{
	for (size_t i = 0; i < n; i++)
		sbuf[i] = (char)(i * 7 + 1);
	memset(rbuf, 0, n);
}

/* One host message of size bytes through a connection on device 0. */
static struct fake *send_one(const char *conf, size_t size)
{
	struct fake *F = fake_start(conf);
	void *smh = NULL, *rmh = NULL;

	fake_connect(F, 0, 0, -1);
	fill(size);
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, size, NCCL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, size, NCCL_PTR_HOST, &rmh), ncclSuccess);
	assert_int_equal(fake_xfer(F, sbuf, smh, size, rbuf, rmh, size, 7), size);
	assert_memory_equal(sbuf, rbuf, size);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	return F;
}

/*
 * The data WR of the message (the one write of size bytes): with ar, a
 * plain RDMA WRITE followed, in the same chain on the same QP, by a
 * zero-byte RDMA WRITE WITH IMMEDIATE carrying the size; without, the data
 * write carries the immediate itself.
 */
static void check_ar_form(struct fake *F, size_t size, int ar)
{
	char want_len[32], line[LINE], next[LINE], qpn[32], qpn2[32];

	snprintf(want_len, sizeof(want_len), " len=%zu ", size);
	assert_int_equal(log_count(F, "ibv_post_send", want_len, NULL), 1);
	assert_true(log_find(F, 0, line, "ibv_post_send", want_len, NULL));
	if (!ar) {
		if (!strstr(line, "opcode=RDMA_WRITE_WITH_IMM "))
			fail_msg("expected the data to carry the immediate: %s", line);
		assert_int_equal(ntohl((uint32_t)kvnum(line, "imm")), (long long)size);
		return;
	}
	if (!strstr(line, "opcode=RDMA_WRITE "))
		fail_msg("expected a plain RDMA write of the data (adaptive routing): %s", line);
	assert_true(log_find_ex(F, 0, next, "ibv_post_send", want_len, NULL, 1));
	if (strncmp(next, "ibv_post_send ", 14) || !strstr(next, "opcode=RDMA_WRITE_WITH_IMM "))
		fail_msg("expected a zero-byte write with immediate after the data, got: %s", next);
	assert_string_equal(kv(next, "qpn", qpn2, sizeof(qpn2)), kv(line, "qpn", qpn, sizeof(qpn)));
	assert_int_equal(kvnum(next, "len"), 0);
	assert_int_equal(kvnum(next, "num_sge"), 0);
	assert_int_equal(ntohl((uint32_t)kvnum(next, "imm")), (long long)size);
}

/* ---- adaptive routing ------------------------------------------------------ */

/* InfiniBand (AR on by default): above 8192 bytes, WRITE + 0-byte WRITE_WITH_IMM. */
static void test_ar_ib_large(void **state)
{
	struct fake *F;

	(void)state;
	F = send_one(ib_dev, BIG);	/* the data is checked there */
	check_ar_form(F, BIG, 1);
	fake_stop(F);
}

/* NCCL's threshold is "larger than": 8192 bytes keep the usual form. */
static void test_ar_ib_threshold(void **state)
{
	struct fake *F;

	(void)state;
	F = send_one(ib_dev, 8192);
	check_ar_form(F, 8192, 0);
	fake_stop(F);
	setenv("NCCL_IB_AR_THRESHOLD", "65536", 1);
	F = send_one(ib_dev, BIG);
	check_ar_form(F, BIG, 0);
	fake_stop(F);
	setenv("NCCL_IB_AR_THRESHOLD", "0", 1);
	F = send_one(ib_dev, 4097);
	check_ar_form(F, 4097, 1);
	fake_stop(F);
	/* -2, NCCL's own default since 2.30.3: 8192, taken without a warning. */
	setenv("NCCL_IB_AR_THRESHOLD", "-2", 1);
	unit_log_capture();
	rail_params_reload();
	assert_false(unit_log_has(RAIL_LOG_WARN, "NCCL_IB_AR_THRESHOLD"));
	unit_log_release();
	F = send_one(ib_dev, 8193);
	check_ar_form(F, 8193, 1);
	fake_stop(F);
	F = send_one(ib_dev, 8192);
	check_ar_form(F, 8192, 0);
	fake_stop(F);
}

/* RoCE: off by default, on when NCCL_IB_ADAPTIVE_ROUTING=1; IB: off with 0. */
static void test_ar_variable(void **state)
{
	struct fake *F;

	(void)state;
	F = send_one(roce_dev, BIG);
	check_ar_form(F, BIG, 0);
	fake_stop(F);
	setenv("NCCL_IB_ADAPTIVE_ROUTING", "1", 1);
	F = send_one(roce_dev, BIG);
	check_ar_form(F, BIG, 1);
	fake_stop(F);
	setenv("NCCL_IB_ADAPTIVE_ROUTING", "0", 1);
	F = send_one(ib_dev, BIG);
	check_ar_form(F, BIG, 0);
	fake_stop(F);
}

/* ---- fused NICs ------------------------------------------------------------ */

static const char roce_2dev[] = FV_CONF_ROCE_2DEV;

/* A connection between two fused NICs of mlx5_0 + mlx5_1. */
static struct fake *fused_start(const char *conf)
{
	struct fake *F = fake_start(conf);
	int devs[2] = { 0, 1 }, v = -1;

	assert_int_equal(F->ndev, 2);
	assert_int_equal(rail_net_make_vdevice(&v, 2, devs, 8), ncclSuccess);
	fake_connect(F, v, v, -1);
	return F;
}

/* Data writes of n bytes on dev: each has its immediate (no AR on RoCE). */
static int pieces(struct fake *F, const char *dev, size_t n)
{
	char len[32];

	snprintf(len, sizeof(len), " len=%zu ", n);
	return log_count(F, "ibv_post_send", dev, len);
}

/*
 * NCCL (p2p.cc ncclIbMultiSend): a message is split over one QP per device
 * of the fused NIC, in pieces of ceil(size / ndevs) rounded up to 128
 * bytes; every message uses both devices.
 */
static void test_fused_striped(void **state)
{
	struct fake *F;
	void *smh = NULL, *rmh = NULL;
	static const size_t sizes[] = { BIG, 10000, BIG, BIG };

	(void)state;
	F = fused_start(roce_2dev);
	fill(BIG);
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, BIG, NCCL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, BIG, NCCL_PTR_HOST, &rmh), ncclSuccess);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		memset(rbuf, 0, BIG);
		assert_int_equal(fake_xfer(F, sbuf, smh, sizes[i], rbuf, rmh, BIG, 3), sizes[i]);
		assert_memory_equal(sbuf, rbuf, sizes[i]);
	}
	assert_int_equal(pieces(F, "dev=mlx5_0 ", BIG / 2), 3);
	assert_int_equal(pieces(F, "dev=mlx5_1 ", BIG / 2), 3);
	/* 10000: 5120 (ceil(5000) to 128) + 4880 */
	assert_int_equal(pieces(F, "dev=mlx5_", 5120) + pieces(F, "dev=mlx5_", 4880), 2);
	assert_int_equal(pieces(F, "dev=mlx5_0 ", 5120) + pieces(F, "dev=mlx5_0 ", 4880), 1);
	assert_int_equal(pieces(F, "dev=mlx5_", BIG), 0);
	assert_int_equal(log_count(F, "ibv_post_send", "opcode=RDMA_WRITE_WITH_IMM", " len=32768 "),
			 6);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fake_stop(F);
}

/* A message smaller than one 128-byte piece: the second device gets a zero-byte answer. */
static void test_fused_small(void **state)
{
	struct fake *F;
	void *smh = NULL, *rmh = NULL;
	char line[LINE];

	(void)state;
	setenv("NCCL_RAIL_IB_EAGER", "0", 1);	/* every message through a CTS */
	F = fused_start(roce_2dev);
	fill(100);
	assert_int_equal(rail_net_reg_mr(F->sc, sbuf, 100, NCCL_PTR_HOST, &smh), ncclSuccess);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, BIG, NCCL_PTR_HOST, &rmh), ncclSuccess);
	assert_int_equal(fake_xfer(F, sbuf, smh, 100, rbuf, rmh, BIG, 3), 100);
	assert_memory_equal(sbuf, rbuf, 100);
	assert_int_equal(pieces(F, "dev=mlx5_", 100), 1);
	assert_true(log_find(F, 0, line, "ibv_post_send", "opcode=RDMA_WRITE_WITH_IMM", " len=0 "));
	assert_int_equal(ntohl((uint32_t)kvnum(line, "imm")), 100);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fake_stop(F);
}

/* ---- small sends from GPU memory -------------------------------------------- */

#define GPU_MSGS 200
#define GPU_MSG_BYTES 64

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * A small message from GPU memory (a DMA-BUF registration: the fake skips
 * its copies) cannot go through the ring, and a small host receive gets no
 * CTS unasked: the sender asks (a want) at once, not after 100 us. The
 * fake's data path is in-process, so a message takes a few microseconds.
 */
static void test_small_gpu_send_no_wait(void **state)
{
	static uint64_t ns[GPU_MSGS];
	struct fake *F;
	void *smh = NULL, *rmh = NULL;

	(void)state;
	F = fake_start(roce_dev);
	fake_connect(F, 0, 0, -1);
	assert_int_equal(rail_net_reg_mr_dmabuf(F->sc, sbuf, 4096, NCCL_PTR_CUDA, 0, 77, &smh),
			 ncclSuccess);
	assert_int_equal(rail_net_reg_mr(F->rc, rbuf, 4096, NCCL_PTR_HOST, &rmh), ncclSuccess);
	for (int i = 0; i < GPU_MSGS; i++) {
		uint64_t t0 = rail_now_ns();

		assert_int_equal(fake_xfer(F, sbuf, smh, GPU_MSG_BYTES, rbuf, rmh, GPU_MSG_BYTES, 9),
				 GPU_MSG_BYTES);
		ns[i] = rail_now_ns() - t0;
	}
	qsort(ns, GPU_MSGS, sizeof(ns[0]), cmp_u64);
	print_message("small GPU send to a host receive: median %.1f us, p90 %.1f us\n",
		      (double)ns[GPU_MSGS / 2] / 1e3, (double)ns[GPU_MSGS * 9 / 10] / 1e3);
	/* nothing went through the ring; every message asked for its CTS */
	assert_int_equal(log_count(F, "ibv_post_send", " len=64 ", "opcode=RDMA_WRITE_WITH_IMM"),
			 GPU_MSGS);
	/*
	 * The old wait was 100 us a message. ThreadSanitizer slows every
	 * message of the fake's data path past that by itself, so the time
	 * says nothing there (the WR count above still holds).
	 */
	if (RAIL_TEST_UNDER_TSAN)
		print_message("timing not checked: ThreadSanitizer build\n");
	else if (ns[GPU_MSGS / 2] >= 50000)
		fail_msg("median %.1f us per message: the sender waits before asking for a "
			 "clear-to-send", (double)ns[GPU_MSGS / 2] / 1e3);
	assert_int_equal(rail_net_dereg_mr(F->sc, smh), ncclSuccess);
	assert_int_equal(rail_net_dereg_mr(F->rc, rmh), ncclSuccess);
	fake_stop(F);
}

/* ---- ECE ------------------------------------------------------------------- */

/* Receiver on mlx5_0 (options 0x7), sender on mlx5_1 (0x5): the one device fake connects both. */
static const char ece_2dev[] = "device mlx5_0 ece=0x7\n"
			       "port 1 link=ib lid=5\n"
			       "gid 0 fe80::2:c903:a0:1\n"
			       "device mlx5_1 ece=0x5\n"
			       "port 1 link=ib lid=6\n"
			       "gid 0 fe80::2:c903:a0:2\n";

/* Every ibv_set_ece on dev: vendor 0x15b3, these options, before that QP's RTR. */
static int ece_sets(struct fake *F, const char *dev, long long options)
{
	char line[LINE], qpn[32], pat[48];
	int n = 0;

	for (int i = 0; log_find(F, i, line, "ibv_set_ece", dev, NULL); i++, n++) {
		assert_int_equal(kvnum(line, "vendor_id"), 0x15b3);
		assert_int_equal(kvnum(line, "options"), options);
		assert_int_equal(kvnum(line, "ret"), 0);
		/* set before RTR: the log has no RTR of this QP before it */
		snprintf(pat, sizeof(pat), " qpn=%s ", kv(line, "qpn", qpn, sizeof(qpn)));
		if (log_find(F, 0, line, "ibv_modify_qp", pat, "state=RTR")) {
			char set[LINE];
			FILE *f = fopen(F->log, "r");
			int saw_set = 0;

			assert_non_null(f);
			while (fgets(set, sizeof(set), f)) {
				if (!strncmp(set, "ibv_set_ece ", 12) && strstr(set, pat))
					saw_set = 1;
				if (!strncmp(set, "ibv_modify_qp ", 14) && strstr(set, pat) &&
				    strstr(set, "state=RTR"))
					break;
			}
			fclose(f);
			if (!saw_set)
				fail_msg("ibv_set_ece on %s after its RTR", pat);
		}
	}
	return n;
}

/*
 * NCCL (connect.cc): one side queries its QPs' ECE and sends it; the other
 * sets it on its QPs before RTR, queries what they settled on and sends that
 * back, which the first sets on its own QPs before RTR. Here the receiver
 * offers (it creates its QPs first), the sender settles.
 */
static void test_ece_negotiated(void **state)
{
	struct fake *F;

	(void)state;
	F = fake_start(ece_2dev);
	fake_connect(F, 0, 1, -1);
	assert_true(log_count(F, "ibv_query_ece", "dev=mlx5_0", "options=0x7") >= 1);
	assert_int_equal(ece_sets(F, "dev=mlx5_1 ", 0x7), 1);	/* the sender's one QP */
	assert_int_equal(ece_sets(F, "dev=mlx5_0 ", 0x5), 1);	/* the receiver's: settled */
	assert_int_equal(fake_xfer(F, sbuf, NULL, 0, rbuf, NULL, 0, 1), 0);
	fake_stop(F);
}

/* NCCL_IB_ECE_ENABLE=0, or a device without ECE: no ECE call sets anything. */
static void test_ece_off(void **state)
{
	struct fake *F;

	(void)state;
	setenv("NCCL_IB_ECE_ENABLE", "0", 1);
	F = fake_start(ece_2dev);
	fake_connect(F, 0, 1, -1);
	assert_int_equal(log_count(F, "ibv_query_ece", NULL, NULL), 0);
	assert_int_equal(log_count(F, "ibv_set_ece", NULL, NULL), 0);
	fake_stop(F);
	F = fake_start("device mlx5_0 ece=0x7\nport 1 link=ib lid=5\ngid 0 fe80::1\n"
		       "device mlx5_1\nport 1 link=ib lid=6\ngid 0 fe80::2\n");
	fake_connect(F, 0, 1, -1);
	assert_int_equal(log_count(F, "ibv_set_ece", NULL, NULL), 0);
	assert_int_equal(fake_xfer(F, sbuf, NULL, 0, rbuf, NULL, 0, 1), 0);
	fake_stop(F);
}

/*
 * NCCL_IB_WARN_RAIL_LOCAL=1 (NCCL connect.cc ncclIbCheckVProps): one INFO
 * line when the two sides' NICs, as device numbers, are not the same set:
 * a connection that leaves its rail.
 */
static void test_warn_rail_local(void **state)
{
	static const char *const line = "not the same devices";
	struct fake *F;
	int devs[2] = { 0, 1 }, v = -1;

	(void)state;
	F = fake_start(ece_2dev);	/* unset: nothing said */
	fake_connect(F, 0, 1, -1);
	assert_false(unit_log_has(RAIL_LOG_INFO, line));
	fake_stop(F);
	setenv("NCCL_IB_WARN_RAIL_LOCAL", "1", 1);
	F = fake_start(ece_2dev);	/* one rail: nothing said */
	fake_connect(F, 1, 1, -1);
	assert_false(unit_log_has(RAIL_LOG_INFO, line));
	fake_stop(F);
	setenv("NCCL_IB_WARN_RAIL_LOCAL", "1", 1);	/* fake_stop unset it */
	F = fake_start(ece_2dev);	/* device 1 to device 0: both sides say it */
	fake_connect(F, 0, 1, -1);
	assert_int_equal(unit_log_count2(RAIL_LOG_INFO, line, "local (1) and remote (0)"), 1);
	assert_int_equal(unit_log_count2(RAIL_LOG_INFO, line, "local (0) and remote (1)"), 1);
	assert_true(unit_log_has(RAIL_LOG_INFO, "NCCL_IB_WARN_RAIL_LOCAL=0"));
	fake_stop(F);
	setenv("NCCL_IB_WARN_RAIL_LOCAL", "1", 1);
	F = fake_start(ece_2dev);	/* a fused NIC of 0 and 1 to device 1 */
	assert_int_equal(rail_net_make_vdevice(&v, 2, devs, 8), ncclSuccess);
	fake_connect(F, 1, v, -1);
	assert_int_equal(unit_log_count2(RAIL_LOG_INFO, line, "local (0,1) and remote (1)"), 1);
	assert_int_equal(fake_xfer(F, sbuf, NULL, 0, rbuf, NULL, 0, 1), 0);
	fake_stop(F);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_ar_ib_large, fake_teardown),
		cmocka_unit_test_teardown(test_ar_ib_threshold, fake_teardown),
		cmocka_unit_test_teardown(test_ar_variable, fake_teardown),
		cmocka_unit_test_teardown(test_fused_striped, fake_teardown),
		cmocka_unit_test_teardown(test_warn_rail_local, fake_teardown),
		cmocka_unit_test_teardown(test_fused_small, fake_teardown),
		cmocka_unit_test_teardown(test_small_gpu_send_no_wait, fake_teardown),
		cmocka_unit_test_teardown(test_ece_negotiated, fake_teardown),
		cmocka_unit_test_teardown(test_ece_off, fake_teardown),
	};

	if (!fake_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_datapath: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fake_lib);
			return 1;
		}
		printf("test_ib_datapath: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fake_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
