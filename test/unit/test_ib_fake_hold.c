/*
 * nccl-net-rail unit tests of the fake verbs provider itself (test/fakeverbs/,
 * fv_hold.c): data in flight when a port fails, which the failover tests
 * build on (docs/FAILOVER.md section 7 item 1). No plugin here: the test
 * loads libfakeverbs.so, connects two RC QPs on two devices through the
 * real ibv_* entry points and checks what the fake does with send WRs while
 * a port is down (held, released in order when it comes back, or
 * IBV_WC_RETRY_EXC_ERR after retry_ms), the flush of a QP that goes to ERR
 * (held sends, unsignaled ones too, and posted receives, in order), and
 * fv_test_hold. Each test also reads the fake's log.
 *
 * The library comes from RAIL_FAKEVERBS_LIB (make test-unit sets it), else
 * from next to this binary (build/test/unit/../fakeverbs/).
 */
#include "unit.h"

#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "rail.h"

#include "fake.h"

#define NBUF 4096
#define NWC 16

/* mlx5_0 (QP a) and mlx5_1 (QP b), InfiniBand, connected a <-> b. */
struct vt {
	struct fake log;	/* only .log and .dir: the log helpers of fake.h */
	void *lib;
	struct ibv_device **list;
	struct ibv_context *ctx[2];
	struct ibv_pd *pd[2];
	struct ibv_cq *scq[2], *rcq[2];
	struct ibv_qp *qp[2];
	struct ibv_mr *mr[2];
	char buf[2][NBUF];
	struct ibv_device **(*get_device_list)(int *n);
	void (*free_device_list)(struct ibv_device **l);
	struct ibv_context *(*open_device)(struct ibv_device *d);
	int (*close_device)(struct ibv_context *c);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *c);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_cq *(*create_cq)(struct ibv_context *c, int cqe, void *cctx,
				    struct ibv_comp_channel *ch, int vec);
	int (*destroy_cq)(struct ibv_cq *cq);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *a);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask);
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask,
			struct ibv_qp_init_attr *ia);
	int (*port_state)(const char *dev, int port, int state);
	int (*hold)(const char *dev, int on);
};

static struct vt vt;

static void *sym(const char *name)
{
	void *p = dlsym(vt.lib, name);

	if (!p)
		fail_msg("%s lacks %s: rebuild it (make tests)", fake_lib, name);
	return p;
}

static void bind_lib(void)
{
	vt.lib = dlopen(fake_lib, RTLD_NOW | RTLD_LOCAL);
	if (!vt.lib)
		fail_msg("dlopen %s: %s", fake_lib, dlerror());
	*(void **)&vt.get_device_list = sym("ibv_get_device_list");
	*(void **)&vt.free_device_list = sym("ibv_free_device_list");
	*(void **)&vt.open_device = sym("ibv_open_device");
	*(void **)&vt.close_device = sym("ibv_close_device");
	*(void **)&vt.alloc_pd = sym("ibv_alloc_pd");
	*(void **)&vt.dealloc_pd = sym("ibv_dealloc_pd");
	*(void **)&vt.reg_mr = sym("ibv_reg_mr");
	*(void **)&vt.dereg_mr = sym("ibv_dereg_mr");
	*(void **)&vt.create_cq = sym("ibv_create_cq");
	*(void **)&vt.destroy_cq = sym("ibv_destroy_cq");
	*(void **)&vt.create_qp = sym("ibv_create_qp");
	*(void **)&vt.destroy_qp = sym("ibv_destroy_qp");
	*(void **)&vt.modify_qp = sym("ibv_modify_qp");
	*(void **)&vt.query_qp = sym("ibv_query_qp");
	*(void **)&vt.port_state = sym("fv_test_port_state");
	*(void **)&vt.hold = dlsym(vt.lib, "fv_test_hold");	/* checked where used */
}

static int hold(const char *dev, int on)
{
	if (!vt.hold)
		fail_msg("%s lacks fv_test_hold: rebuild it (make tests)", fake_lib);
	return vt.hold(dev, on);
}

static void qp_modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	int r = vt.modify_qp(qp, a, mask);

	if (r)
		fail_msg("ibv_modify_qp qp 0x%x to %d: %d", qp->qp_num, (int)a->qp_state, r);
}

/* RESET -> INIT -> RTR -> RTS toward dest, on port 1 (dest's LID). */
static void qp_connect(struct ibv_qp *qp, const struct ibv_qp *dest, int dlid)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_LOCAL_WRITE;
	qp_modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = dest->qp_num;
	a.ah_attr.dlid = (uint16_t)dlid;
	a.ah_attr.port_num = 1;
	qp_modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	qp_modify(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Two devices; opts go on mlx5_0's device line (the sender's). */
static void vt_start(const char *opts)
{
	char conf[512];
	int n = 0;

	memset(&vt, 0, sizeof(vt));
	snprintf(vt.log.dir, sizeof(vt.log.dir), "/tmp/rail-fakeverbs-XXXXXX");
	assert_non_null(mkdtemp(vt.log.dir));
	snprintf(vt.log.conf, sizeof(vt.log.conf), "%.60s/devices.conf", vt.log.dir);
	snprintf(vt.log.log, sizeof(vt.log.log), "%.60s/verbs.log", vt.log.dir);
	snprintf(conf, sizeof(conf),
		 "device mlx5_0 %s\nport 1 link=ib lid=5\ngid 0 fe80::1\n"
		 "device mlx5_1\nport 1 link=ib lid=6\ngid 0 fe80::2\n", opts);
	fake_write_file(vt.log.conf, conf);
	setenv("RAIL_FAKEVERBS_CONF", vt.log.conf, 1);
	setenv("RAIL_FAKEVERBS_LOG", vt.log.log, 1);
	bind_lib();
	vt.list = vt.get_device_list(&n);
	assert_int_equal(n, 2);
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr ia;

		assert_non_null(vt.ctx[i] = vt.open_device(vt.list[i]));
		assert_non_null(vt.pd[i] = vt.alloc_pd(vt.ctx[i]));
		assert_non_null(vt.scq[i] = vt.create_cq(vt.ctx[i], NWC, NULL, NULL, 0));
		assert_non_null(vt.rcq[i] = vt.create_cq(vt.ctx[i], NWC, NULL, NULL, 0));
		assert_non_null(vt.mr[i] = vt.reg_mr(vt.pd[i], vt.buf[i], NBUF,
						     IBV_ACCESS_LOCAL_WRITE |
							     IBV_ACCESS_REMOTE_WRITE |
							     IBV_ACCESS_REMOTE_READ));
		memset(&ia, 0, sizeof(ia));
		ia.send_cq = vt.scq[i];
		ia.recv_cq = vt.rcq[i];
		ia.qp_type = IBV_QPT_RC;
		ia.cap.max_send_wr = NWC;
		ia.cap.max_recv_wr = NWC;
		ia.cap.max_send_sge = 1;
		ia.cap.max_recv_sge = 1;
		ia.cap.max_inline_data = 64;
		assert_non_null(vt.qp[i] = vt.create_qp(vt.pd[i], &ia));
	}
	qp_connect(vt.qp[0], vt.qp[1], 6);
	qp_connect(vt.qp[1], vt.qp[0], 5);
}

static int vt_teardown(void **state)
{
	char cmd[128];

	(void)state;
	if (!vt.lib)
		return 0;
	for (int i = 0; i < 2; i++) {
		if (vt.qp[i])
			vt.destroy_qp(vt.qp[i]);
		if (vt.mr[i])
			vt.dereg_mr(vt.mr[i]);
		if (vt.scq[i])
			vt.destroy_cq(vt.scq[i]);
		if (vt.rcq[i])
			vt.destroy_cq(vt.rcq[i]);
		if (vt.pd[i])
			vt.dealloc_pd(vt.pd[i]);
		if (vt.ctx[i])
			vt.close_device(vt.ctx[i]);
	}
	if (vt.list)
		vt.free_device_list(vt.list);
	dlclose(vt.lib);
	vt.lib = NULL;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", vt.log.dir);
	if (getenv("RAIL_FAKEVERBS_KEEP"))
		print_message("kept %s\n", vt.log.dir);
	else if (system(cmd) != 0)
		print_message("could not remove %s\n", vt.log.dir);
	unsetenv("RAIL_FAKEVERBS_CONF");
	unsetenv("RAIL_FAKEVERBS_LOG");
	return 0;
}

/* Post one WR on a's QP: an RDMA write of len bytes at off of a's buffer to off of b's. */
static void post_wr(uint64_t wr_id, size_t off, size_t len, int flags, enum ibv_wr_opcode op,
		    uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(vt.buf[0] + off), .length = (uint32_t)len,
			       .lkey = vt.mr[0]->lkey };
	struct ibv_send_wr wr, *bad = NULL;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.opcode = op;
	wr.send_flags = (unsigned)flags;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = (uintptr_t)(vt.buf[1] + off);
	wr.wr.rdma.rkey = rkey;
	wr.imm_data = (uint32_t)wr_id;
	assert_int_equal(ibv_post_send(vt.qp[0], &wr, &bad), 0);
}

static void post_write(uint64_t wr_id, size_t off, size_t len, int flags, enum ibv_wr_opcode op)
{
	post_wr(wr_id, off, len, flags, op, vt.mr[1]->rkey);
}

static void post_recv(int side, uint64_t wr_id)
{
	struct ibv_recv_wr wr, *bad = NULL;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	assert_int_equal(ibv_post_recv(vt.qp[side], &wr, &bad), 0);
}

static int cq_poll(struct ibv_cq *cq, struct ibv_wc *wc)
{
	int n = ibv_poll_cq(cq, NWC, wc);

	assert_true(n >= 0);
	return n;
}

/* Poll cq until it gives something, up to ms; what it gave. */
static int poll_wait(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
	uint64_t end = rail_now_ns() + (uint64_t)ms * 1000000u;
	int n;

	while (!(n = cq_poll(cq, wc)) && rail_now_ns() < end)
		usleep(1000);
	return n;
}

static int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	assert_int_equal(vt.query_qp(qp, &a, IBV_QP_STATE, &ia), 0);
	return (int)a.qp_state;
}

static void fill(char c)
{
	memset(vt.buf[0], c, NBUF);
	memset(vt.buf[1], 0, NBUF);
}

static int all(const char *p, char c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != c)
			return 0;
	return 1;
}

/* ---- held while a port is down, released when it is ACTIVE again ------------ */

static void check_released_after_active(const char *dev, const char *why)
{
	struct ibv_wc wc[NWC];
	char inl[32], line[LINE];

	fill('x');
	post_recv(1, 0xb1);
	assert_int_equal(vt.port_state(dev, 1, IBV_PORT_DOWN), 1);
	post_write(1, 0, NBUF, 0, IBV_WR_RDMA_WRITE);		/* unsignaled */
	memset(inl, 'i', sizeof(inl));
	{	/* inline: the fake must keep a copy, the caller reuses its buffer */
		struct ibv_sge sge = { .addr = (uintptr_t)inl, .length = sizeof(inl) };
		struct ibv_send_wr wr, *bad = NULL;

		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 2;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.send_flags = IBV_SEND_INLINE;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.wr.rdma.remote_addr = (uintptr_t)vt.buf[1];
		wr.wr.rdma.rkey = vt.mr[1]->rkey;
		assert_int_equal(ibv_post_send(vt.qp[0], &wr, &bad), 0);
		memset(inl, 'z', sizeof(inl));
	}
	post_write(3, 0, 0, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE_WITH_IMM);
	usleep(20000);
	assert_int_equal(cq_poll(vt.scq[0], wc), 0);
	assert_int_equal(cq_poll(vt.rcq[1], wc), 0);
	assert_true(all(vt.buf[1], 0, NBUF));	/* nothing arrived */
	assert_int_equal(log_count(&vt.log, "hold", why, NULL), 3);
	assert_int_equal(qp_state(vt.qp[0]), IBV_QPS_RTS);

	assert_int_equal(vt.port_state(dev, 1, IBV_PORT_ACTIVE), 1);
	assert_true(all(vt.buf[1], 0, NBUF));	/* not before the next entry */
	assert_int_equal(cq_poll(vt.scq[0], wc), 1);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_int_equal(wc[0].wr_id, 3);
	/* in order: the whole buffer, then the inline write's original bytes over its head */
	assert_true(all(vt.buf[1], 'i', sizeof(inl)));
	assert_true(all(vt.buf[1] + sizeof(inl), 'x', NBUF - sizeof(inl)));
	assert_int_equal(cq_poll(vt.rcq[1], wc), 1);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_int_equal(wc[0].wr_id, 0xb1);
	assert_int_equal(wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
	assert_int_equal(log_count(&vt.log, "release", NULL, NULL), 3);
	for (int k = 0; k < 3; k++) {
		assert_true(log_find(&vt.log, k, line, "release", NULL, NULL));
		assert_int_equal(kvnum(line, "wr_id"), k + 1);
	}
	assert_int_equal(log_count(&vt.log, "timeout", NULL, NULL), 0);
}

static void test_held_own_port_down(void **state)
{
	(void)state;
	vt_start("retry_ms=60000");
	check_released_after_active("mlx5_0", "why=port_down");
}

static void test_held_dest_port_down(void **state)
{
	(void)state;
	vt_start("retry_ms=60000");
	check_released_after_active("mlx5_1", "why=dest_port_down");
}

/* ---- RETRY_EXC_ERR after retry_ms; the QP goes to ERR and flushes -------------- */

/* Two writes held on a dead destination port: (RETRY_EXC_ERR, FLUSH_ERR) and after how long. */
static uint64_t check_timeout(int retry_ms)
{
	struct ibv_wc wc[NWC];
	uint64_t t0;
	char line[LINE];

	fill('y');
	assert_int_equal(vt.port_state("mlx5_1", 1, IBV_PORT_DOWN), 1);
	t0 = rail_now_ns();
	post_write(1, 0, 64, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE);
	post_write(2, 64, 64, 0, IBV_WR_RDMA_WRITE);	/* unsignaled: flushed all the same */
	assert_int_equal(cq_poll(vt.scq[0], wc), 0);	/* not before retry_ms */
	assert_int_equal(poll_wait(vt.scq[0], wc, 5000 + retry_ms), 2);
	assert_int_equal(wc[0].wr_id, 1);
	assert_int_equal(wc[0].status, IBV_WC_RETRY_EXC_ERR);
	assert_int_equal(wc[1].wr_id, 2);
	assert_int_equal(wc[1].status, IBV_WC_WR_FLUSH_ERR);
	assert_int_equal(qp_state(vt.qp[0]), IBV_QPS_ERR);
	assert_true(log_find(&vt.log, 0, line, "timeout", "wr_id=0x1 ", NULL));
	assert_int_equal(kvnum(line, "retry_ms"), retry_ms);
	assert_true(kvnum(line, "held_ms") >= retry_ms);
	assert_int_equal(log_count(&vt.log, "flush", "queue=send", "wr_id=0x2 "), 1);
	/* the port back: nothing more, nothing arrived */
	assert_int_equal(vt.port_state("mlx5_1", 1, IBV_PORT_ACTIVE), 1);
	assert_int_equal(cq_poll(vt.scq[0], wc), 0);
	assert_true(all(vt.buf[1], 0, NBUF));
	return (rail_now_ns() - t0) / 1000000u;
}

static void test_retry_exceeded(void **state)
{
	(void)state;
	vt_start("retry_ms=50");
	assert_true(check_timeout(50) >= 50);
	vt_teardown(NULL);
	vt_start("");	/* the default */
	assert_true(check_timeout(200) >= 200);
}

/* retrying=yes: held for good, as long as the port is down. */
static void test_retrying_never_times_out(void **state)
{
	struct ibv_wc wc[NWC];

	(void)state;
	vt_start("retrying=yes retry_ms=10");
	fill('r');
	assert_int_equal(vt.port_state("mlx5_0", 1, IBV_PORT_DOWN), 1);
	post_write(1, 0, 64, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE);
	assert_int_equal(poll_wait(vt.scq[0], wc, 100), 0);
	assert_int_equal(qp_state(vt.qp[0]), IBV_QPS_RTS);
	assert_int_equal(vt.port_state("mlx5_0", 1, IBV_PORT_ACTIVE), 1);
	assert_int_equal(cq_poll(vt.scq[0], wc), 1);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_true(all(vt.buf[1], 'r', 64));
}

/*
 * A destination QP in ERR drops packets: without retry_ms in the
 * description the sender fails at once (as always); with it the WR is held
 * and fails after retry_ms.
 */
static void test_dest_in_error(void **state)
{
	struct ibv_qp_attr a;
	struct ibv_wc wc[NWC];

	(void)state;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	vt_start("");
	qp_modify(vt.qp[1], &a, IBV_QP_STATE);
	post_write(1, 0, 64, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE);
	assert_int_equal(cq_poll(vt.scq[0], wc), 1);
	assert_int_equal(wc[0].status, IBV_WC_RETRY_EXC_ERR);
	vt_teardown(NULL);

	vt_start("retry_ms=30");
	qp_modify(vt.qp[1], &a, IBV_QP_STATE);
	post_write(1, 0, 64, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE);
	assert_int_equal(cq_poll(vt.scq[0], wc), 0);
	assert_int_equal(log_count(&vt.log, "hold", "why=dest_err", NULL), 1);
	assert_int_equal(poll_wait(vt.scq[0], wc, 5000), 1);
	assert_int_equal(wc[0].status, IBV_WC_RETRY_EXC_ERR);
}

/* ---- the flush of a QP that goes to ERR ------------------------------------ */

static void check_flush(struct ibv_cq *cq, const uint64_t *ids, int n, const char *queue)
{
	struct ibv_wc wc[NWC];
	char line[LINE];

	assert_int_equal(cq_poll(cq, wc), n);
	for (int k = 0; k < n; k++) {
		assert_int_equal(wc[k].status, IBV_WC_WR_FLUSH_ERR);
		assert_int_equal(wc[k].wr_id, ids[k]);
		assert_true(log_find(&vt.log, k, line, "flush", queue, NULL));
		assert_int_equal(kvnum(line, "wr_id"), (long long)ids[k]);
	}
}

static void test_flush_on_modify_error(void **state)
{
	static const uint64_t sends[] = { 11, 12, 13 }, recvs[] = { 21, 22 };
	struct ibv_qp_attr a;
	struct ibv_wc wc[NWC];

	(void)state;
	vt_start("retry_ms=60000");
	fill('f');
	post_recv(0, 21);
	post_recv(0, 22);
	assert_int_equal(vt.port_state("mlx5_0", 1, IBV_PORT_DOWN), 1);
	post_write(11, 0, 64, 0, IBV_WR_RDMA_WRITE);
	post_write(12, 64, 64, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE);
	post_write(13, 128, 64, 0, IBV_WR_RDMA_WRITE);
	assert_int_equal(cq_poll(vt.scq[0], wc), 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	qp_modify(vt.qp[0], &a, IBV_QP_STATE);
	check_flush(vt.scq[0], sends, 3, "queue=send");
	check_flush(vt.rcq[0], recvs, 2, "queue=recv");
	assert_int_equal(vt.port_state("mlx5_0", 1, IBV_PORT_ACTIVE), 1);
	assert_int_equal(cq_poll(vt.scq[0], wc), 0);
	assert_true(all(vt.buf[1], 0, NBUF));
	assert_int_equal(log_count(&vt.log, "release", NULL, NULL), 0);
}

/* An error completion (a bad rkey here) flushes the same way, after itself. */
static void test_flush_on_error_completion(void **state)
{
	static const uint64_t recvs[] = { 41 };
	struct ibv_wc wc[NWC];

	(void)state;
	vt_start("retry_ms=60000");
	fill('e');
	post_recv(0, 41);
	assert_int_equal(hold("mlx5_0", 1), 0);
	post_wr(31, 0, 64, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE, 0xdead);
	post_write(32, 64, 64, 0, IBV_WR_RDMA_WRITE);
	assert_int_equal(hold("mlx5_0", 0), 2);
	assert_int_equal(cq_poll(vt.scq[0], wc), 2);
	assert_int_equal(wc[0].wr_id, 31);
	assert_int_equal(wc[0].status, IBV_WC_REM_ACCESS_ERR);
	assert_int_equal(wc[1].wr_id, 32);
	assert_int_equal(wc[1].status, IBV_WC_WR_FLUSH_ERR);
	assert_int_equal(log_count(&vt.log, "flush", "queue=send", "wr_id=0x20 "), 1);
	check_flush(vt.rcq[0], recvs, 1, "queue=recv");
	assert_int_equal(qp_state(vt.qp[0]), IBV_QPS_ERR);
	assert_true(all(vt.buf[1], 0, NBUF));
}

/* A receive posted on a QP in ERR completes at once, flushed. */
static void test_recv_on_error_qp(void **state)
{
	static const uint64_t recvs[] = { 51, 52 };
	struct ibv_qp_attr a;

	(void)state;
	vt_start("");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	qp_modify(vt.qp[1], &a, IBV_QP_STATE);
	post_recv(1, 51);
	post_recv(1, 52);
	check_flush(vt.rcq[1], recvs, 2, "queue=recv");
}

/* ---- fv_test_hold ------------------------------------------------------------ */

static void test_hold_on_off(void **state)
{
	struct ibv_wc wc[NWC];

	(void)state;
	vt_start("retry_ms=20");
	fill('h');
	assert_int_equal(hold("mlx5_9", 1), -ENODEV);
	assert_int_equal(hold("mlx5_0", 1), 0);
	post_write(1, 0, 64, 0, IBV_WR_RDMA_WRITE);
	post_write(2, 64, 64, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE);
	/* well past retry_ms: a held device never times out */
	assert_int_equal(poll_wait(vt.scq[0], wc, 100), 0);
	assert_true(all(vt.buf[1], 0, NBUF));
	assert_int_equal(log_count(&vt.log, "hold", "why=test_hold", NULL), 2);
	/* the other device is not held: b still sends to a */
	memset(vt.buf[1] + 1024, 'b', 8);
	{
		struct ibv_sge sge = { .addr = (uintptr_t)(vt.buf[1] + 1024), .length = 8,
				       .lkey = vt.mr[1]->lkey };
		struct ibv_send_wr wr, *bad = NULL;

		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.wr.rdma.remote_addr = (uintptr_t)(vt.buf[0] + 1024);
		wr.wr.rdma.rkey = vt.mr[0]->rkey;
		assert_int_equal(ibv_post_send(vt.qp[1], &wr, &bad), 0);
		assert_true(all(vt.buf[0] + 1024, 'b', 8));
	}
	assert_int_equal(hold("mlx5_0", 0), 2);
	assert_true(all(vt.buf[1], 0, 128));	/* at the next entry */
	assert_int_equal(cq_poll(vt.scq[0], wc), 1);
	assert_int_equal(wc[0].wr_id, 2);
	assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
	assert_true(all(vt.buf[1], 'h', 128));
	assert_int_equal(log_count(&vt.log, "test_hold", "dev=mlx5_0", "on=0 held=2"), 1);
	assert_int_equal(log_count(&vt.log, "release", NULL, NULL), 2);
	/* off: posted WRs go at once again */
	post_write(3, 256, 64, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE);
	assert_true(all(vt.buf[1] + 256, 'h', 64));
	assert_int_equal(cq_poll(vt.scq[0], wc), 1);
	assert_int_equal(log_count(&vt.log, "hold", NULL, NULL), 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_held_own_port_down, vt_teardown),
		cmocka_unit_test_teardown(test_held_dest_port_down, vt_teardown),
		cmocka_unit_test_teardown(test_retry_exceeded, vt_teardown),
		cmocka_unit_test_teardown(test_retrying_never_times_out, vt_teardown),
		cmocka_unit_test_teardown(test_dest_in_error, vt_teardown),
		cmocka_unit_test_teardown(test_flush_on_modify_error, vt_teardown),
		cmocka_unit_test_teardown(test_flush_on_error_completion, vt_teardown),
		cmocka_unit_test_teardown(test_recv_on_error_qp, vt_teardown),
		cmocka_unit_test_teardown(test_hold_on_off, vt_teardown),
	};

	if (!fake_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_fake_hold: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fake_lib);
			return 1;
		}
		printf("test_ib_fake_hold: all %zu tests skipped: %s not built (make tests)\n",
		       sizeof(tests) / sizeof(tests[0]), fake_lib);
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
