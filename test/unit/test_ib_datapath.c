/*
 * nccl-net-rail unit tests of the verbs data path on the fake verbs provider
 * (test/fakeverbs/, helpers in fake.h), against NCCL 2.30's IB transport
 * (docs/NCCL-IB-PARITY.md): adaptive routing (the WR form of a large
 * message), fused devices (every message striped over the members), small
 * sends from GPU memory (no wait before asking for a clear-to-send) and ECE.
 */
#include "unit.h"

#include <arpa/inet.h>

#include "fake.h"

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_ar_ib_large, fake_teardown),
		cmocka_unit_test_teardown(test_ar_ib_threshold, fake_teardown),
		cmocka_unit_test_teardown(test_ar_variable, fake_teardown),
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
