/*
 * nccl-net-rail unit tests: errno -> ncclResult_t (rail_result) and the
 * argument and request checks of the version-neutral API (src/api.c),
 * driven through a fake transport.
 */
#include "unit.h"

#include <errno.h>

#include "api.h"
#include "rail.h"
#include "transport.h"

/*
 * api.o refers to the real transports through transport.o. These tests
 * never call init, so a weak placeholder keeps them linkable whether or
 * not the TCP transport is in the core library (a real one wins).
 */
__attribute__((weak)) const struct rail_transport_ops rail_tcp_ops = { .name = "tcp-placeholder" };

/* ---- rail_result -------------------------------------------------------- */

static void test_result_required_mappings(void **state)
{
	(void)state;
	assert_int_equal(rail_result(0), ncclSuccess);
	assert_int_equal(rail_result(-ECONNRESET), ncclRemoteError);
	assert_int_equal(rail_result(-EMSGSIZE), ncclInvalidUsage);
	assert_int_equal(rail_result(-ENOMEM), ncclSystemError);
	assert_int_equal(rail_result(-EINVAL), ncclInternalError);
}

static void test_result_remote_errors(void **state)
{
	static const int remote[] = { ECONNRESET, ECONNREFUSED, ECONNABORTED, EPIPE, ENOTCONN,
				      ETIMEDOUT, EHOSTUNREACH, ENETUNREACH, EPROTO, EREMOTEIO,
				      RAIL_ECLOSED };

	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(remote); i++)
		if (rail_result(-remote[i]) != ncclRemoteError)
			fail_msg("-%d (%s) maps to %d, expected ncclRemoteError", remote[i],
				 RAIL_ERRSTR(-remote[i]), rail_result(-remote[i]));
}

static void test_result_internal_and_system(void **state)
{
	static const int internal[] = { EINVAL, EBADF, ENOSPC, EALREADY, EOPNOTSUPP };
	static const int system[] = { ENOMEM, EIO, EACCES, EPERM, ENODEV, ENOENT, EMFILE, EFAULT };

	(void)state;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(internal); i++)
		assert_int_equal(rail_result(-internal[i]), ncclInternalError);
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(system); i++)
		if (rail_result(-system[i]) != ncclSystemError)
			fail_msg("-%d (%s) maps to %d, expected ncclSystemError", system[i],
				 RAIL_ERRSTR(-system[i]), rail_result(-system[i]));
}

/* No errno is ever reported as success or as "in progress". */
static void test_result_every_errno_is_an_error(void **state)
{
	(void)state;
	for (int e = 1; e < 200; e++) {
		ncclResult_t r = rail_result(-e);

		if (r == ncclSuccess || r == ncclInProgress || r >= ncclNumResults)
			fail_msg("-%d maps to %d", e, r);
	}
}

/* ---- calls without a transport ----------------------------------------- */

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
	return 0;
}

static void test_calls_before_init(void **state)
{
	struct rail_props props;
	char handle[NCCL_NET_HANDLE_MAXSIZE];
	void *comm = NULL;
	int n = -1, d = -1, devs[2] = { 0, 1 };

	(void)state;
	assert_int_equal(rail_net_devices(&n), ncclInternalError);
	assert_int_equal(n, -1);
	unit_assert_logged(RAIL_LOG_WARN, "devices called before a successful init");
	assert_int_equal(rail_net_get_properties(0, &props), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "getProperties called before");
	assert_int_equal(rail_net_listen(NULL, 0, handle, &comm), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "listen called before");
	assert_int_equal(rail_net_connect(NULL, 0, -1, handle, &comm), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "connect called before");
	assert_int_equal(rail_net_make_vdevice(&d, 2, devs, 4), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "makeVDevice called before");
	assert_null(comm);
	assert_int_equal(d, -1);
}

static void test_init_finalize_arguments(void **state)
{
	uint32_t junk[8] = { 0xdeadbeef };

	(void)state;
	assert_int_equal(rail_net_init(NULL, 1, -1, NULL, 11), ncclInvalidArgument);
	/* NCCL finalizes even after a failed init. */
	assert_int_equal(rail_net_finalize(NULL), ncclSuccess);
	assert_int_equal(rail_net_finalize(junk), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "not a context of this plugin");
	assert_int_equal(rail_net_set_net_attr(NULL, NULL), ncclSuccess);
}

/* ---- a fake transport --------------------------------------------------- */

struct fake_req {
	struct rail_req base;
	size_t size;
};

static struct {
	int post_err;	/* returned by isend / irecv / iflush / reg_mr / close */
	int test_err;	/* returned by test */
	int test_done;
	size_t test_size;
	int calls;
	size_t last_size;	/* what isend/irecv got */
	void *last_mh;
} fake;

static int fake_reg_mr(struct rail_comm *c, void *data, size_t size, int type, void **mh)
{
	(void)c;
	(void)size;
	(void)type;
	fake.calls++;
	if (!fake.post_err)
		*mh = data;
	return fake.post_err;
}

static int fake_dereg_mr(struct rail_comm *c, void *mh)
{
	(void)c;
	(void)mh;
	fake.calls++;
	return fake.post_err;
}

static int fake_isend(struct rail_comm *c, struct rail_req *req, void *data, size_t size,
		      int tag, void *mh)
{
	(void)c;
	(void)data;
	(void)tag;
	fake.calls++;
	((struct fake_req *)req)->size = size;
	fake.last_size = size;
	fake.last_mh = mh;
	return fake.post_err;
}

static int fake_irecv(struct rail_comm *c, struct rail_req *req, int n, void **data,
		      const size_t *sizes, const int *tags, void **mhs)
{
	(void)c;
	(void)n;
	(void)data;
	(void)tags;
	fake.calls++;
	((struct fake_req *)req)->size = sizes[0];
	fake.last_size = sizes[0];
	fake.last_mh = mhs ? mhs[0] : NULL;
	return fake.post_err;
}

static int fake_iflush(struct rail_comm *c, struct rail_req *req, int n, void **data,
		       const int *sizes, void **mhs)
{
	(void)c;
	(void)req;
	(void)n;
	(void)data;
	(void)sizes;
	(void)mhs;
	fake.calls++;
	return fake.post_err;
}

static int fake_test(struct rail_req *req, int *done, size_t *sizes)
{
	fake.calls++;
	if (fake.test_err)
		return fake.test_err;
	*done = fake.test_done;
	for (int i = 0; i < req->n; i++)
		sizes[i] = fake.test_size + (size_t)i;
	return 0;
}

static int fake_close(struct rail_comm *c)
{
	fake.calls++;
	rail_comm_fini(c);
	return fake.post_err;
}

static int fake_accept(struct rail_comm *lc, struct rail_comm **rc)
{
	(void)lc;
	(void)rc;
	fake.calls++;
	return fake.post_err;
}

static const struct rail_transport_ops fake_ops = {
	.name = "fake",
	.req_size = sizeof(struct fake_req),
	.accept = fake_accept,
	.reg_mr = fake_reg_mr,
	.dereg_mr = fake_dereg_mr,
	.isend = fake_isend,
	.irecv = fake_irecv,
	.iflush = fake_iflush,
	.test = fake_test,
	.close_send = fake_close,
	.close_recv = fake_close,
	.close_listen = fake_close,
};

struct comms {
	struct rail_comm send, recv, listen;
	void *hs, *hr, *hl;	/* their handles, as NCCL holds them */
};

static int fake_setup(void **state)
{
	struct comms *c = calloc(1, sizeof(*c));

	if (!c)
		return -1;
	memset(&fake, 0, sizeof(fake));
	if (rail_comm_init(&c->send, RAIL_COMM_SEND, 0, &fake_ops) ||
	    rail_comm_init(&c->recv, RAIL_COMM_RECV, 0, &fake_ops) ||
	    rail_comm_init(&c->listen, RAIL_COMM_LISTEN, 0, &fake_ops))
		return -1;
	if (rail_net_adopt_comm(&c->send, &c->hs) || rail_net_adopt_comm(&c->recv, &c->hr) ||
	    rail_net_adopt_comm(&c->listen, &c->hl))
		return -1;
	*state = c;
	unit_log_capture();
	return 0;
}

static int fake_teardown(void **state)
{
	struct comms *c = *state;

	fake.post_err = 0;
	/* Close what a test left open (the handles die; a closed one is refused). */
	rail_net_close_send(c->hs);
	rail_net_close_recv(c->hr);
	rail_net_close_listen(c->hl);
	unit_log_release();
	rail_comm_fini(&c->send);
	rail_comm_fini(&c->recv);
	rail_comm_fini(&c->listen);
	free(c);
	return 0;
}

static void test_isend_error_translation(void **state)
{
	struct comms *c = *state;
	static const struct {
		int err;
		ncclResult_t res;
	} cases[] = {
		{ -ECONNRESET, ncclRemoteError }, { -EPIPE, ncclRemoteError },
		{ -EMSGSIZE, ncclInvalidUsage },  { -ENOMEM, ncclSystemError },
		{ -EINVAL, ncclInternalError },
	};
	char buf[16];

	for (size_t i = 0; i < RAIL_ARRAY_SIZE(cases); i++) {
		void *req = (void *)1;

		fake.post_err = cases[i].err;
		assert_int_equal(rail_net_isend(c->hs, buf, sizeof(buf), 0, NULL, &req),
				 cases[i].res);
		/* The request went back to the pool. */
		assert_int_equal(rail_pool_in_use(&c->send.reqs), 0);
	}
}

static void test_isend_eagain_is_null_request(void **state)
{
	struct comms *c = *state;
	void *req = (void *)1;
	char buf[16];

	fake.post_err = -EAGAIN;
	assert_int_equal(rail_net_isend(c->hs, buf, sizeof(buf), 0, NULL, &req), ncclSuccess);
	assert_null(req);
	assert_int_equal(rail_pool_in_use(&c->send.reqs), 0);
	req = (void *)1;
	assert_int_equal(rail_net_irecv(c->hr, 1, (void *[]){ buf }, (size_t[]){ 16 },
					(int[]){ 0 }, (void *[]){ NULL }, &req),
			 ncclSuccess);
	assert_null(req);
	assert_int_equal(rail_pool_in_use(&c->recv.reqs), 0);
}

static void test_send_and_test_lifecycle(void **state)
{
	struct comms *c = *state;
	void *req = NULL;
	int done = -1, size = -1;
	char buf[300];

	assert_int_equal(rail_net_isend(c->hs, buf, 300, 7, NULL, &req), ncclSuccess);
	assert_non_null(req);
	assert_int_equal(fake.last_size, 300);
	assert_int_equal(rail_pool_in_use(&c->send.reqs), 1);

	/* Not done yet: the request stays. */
	fake.test_done = 0;
	assert_int_equal(rail_net_test(req, &done, &size), ncclSuccess);
	assert_int_equal(done, 0);
	assert_int_equal(size, -1);
	assert_int_equal(rail_pool_in_use(&c->send.reqs), 1);

	fake.test_done = 1;
	fake.test_size = 300;
	assert_int_equal(rail_net_test(req, &done, &size), ncclSuccess);
	assert_int_equal(done, 1);
	assert_int_equal(size, 300);
	assert_int_equal(rail_pool_in_use(&c->send.reqs), 0);

	/* Testing a completed request is an error, and warned. */
	assert_int_equal(rail_net_test(req, &done, &size), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "not a request in flight");
	assert_int_equal(rail_net_test(NULL, &done, &size), ncclInternalError);
}

static void test_grouped_recv_sizes(void **state)
{
	struct comms *c = *state;
	char a[8], b[8], d[8];
	void *data[3] = { a, b, d }, *mh[3] = { NULL, NULL, NULL }, *req = NULL;
	size_t sizes[3] = { 8, 8, 8 };
	int tags[3] = { 1, 2, 3 }, got[3] = { -1, -1, -1 }, done = 0;

	assert_int_equal(rail_net_irecv(c->hr, 3, data, sizes, tags, mh, &req), ncclSuccess);
	assert_non_null(req);
	fake.test_done = 1;
	fake.test_size = 5;
	assert_int_equal(rail_net_test(req, &done, got), ncclSuccess);
	assert_int_equal(done, 1);
	assert_int_equal(got[0], 5);
	assert_int_equal(got[1], 6);
	assert_int_equal(got[2], 7);
}

static void test_test_error_frees_request(void **state)
{
	struct comms *c = *state;
	void *req = NULL;
	int done = 0;
	char buf[8];

	assert_int_equal(rail_net_isend(c->hs, buf, 8, 0, NULL, &req), ncclSuccess);
	fake.test_err = -ETIMEDOUT;
	assert_int_equal(rail_net_test(req, &done, NULL), ncclRemoteError);
	assert_int_equal(rail_pool_in_use(&c->send.reqs), 0);
	assert_int_equal(done, 0);
}

static void test_request_exhaustion(void **state)
{
	struct comms *c = *state;
	uint32_t cap = c->send.reqs.capacity;
	void *req;
	char buf[8];

	assert_int_equal(cap, RAIL_MAX_REQUESTS * RAIL_MAX_RECVS);
	for (uint32_t i = 0; i < cap; i++) {
		req = NULL;
		assert_int_equal(rail_net_isend(c->hs, buf, 8, 0, NULL, &req), ncclSuccess);
		assert_non_null(req);
	}
	req = (void *)1;
	assert_int_equal(rail_net_isend(c->hs, buf, 8, 0, NULL, &req), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "in flight");
}

static void test_irecv_and_iflush_limits(void **state)
{
	struct comms *c = *state;
	void *data[RAIL_MAX_RECVS + 1] = { 0 }, *mh[RAIL_MAX_RECVS + 1] = { 0 }, *req = NULL;
	size_t sizes[RAIL_MAX_RECVS + 1] = { 0 };
	int tags[RAIL_MAX_RECVS + 1] = { 0 }, isizes[1] = { 0 };

	assert_int_equal(rail_net_irecv(c->hr, 0, data, sizes, tags, mh, &req),
			 ncclInternalError);
	assert_int_equal(rail_net_irecv(c->hr, RAIL_MAX_RECVS + 1, data, sizes, tags, mh, &req),
			 ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "grouped receives");
	assert_int_equal(rail_net_irecv(c->hr, 1, NULL, sizes, tags, mh, &req),
			 ncclInternalError);
	assert_int_equal(rail_pool_in_use(&c->recv.reqs), 0);
	assert_int_equal(fake.calls, 0); /* the transport was never asked */

	/* Nothing to flush: success with no request. */
	fake.post_err = 1;
	req = (void *)1;
	assert_int_equal(rail_net_iflush(c->hr, 1, data, isizes, mh, &req), ncclSuccess);
	assert_null(req);
	assert_int_equal(rail_pool_in_use(&c->recv.reqs), 0);
	fake.post_err = -EIO;
	assert_int_equal(rail_net_iflush(c->hr, 1, data, isizes, mh, &req), ncclSystemError);
	assert_int_equal(rail_pool_in_use(&c->recv.reqs), 0);
}

static void test_wrong_comm_kind(void **state)
{
	struct comms *c = *state;
	void *req = NULL, *rc = NULL, *mh = NULL;
	char buf[8];
	uint32_t junk[16] = { 0 };

	assert_int_equal(rail_net_isend(c->hr, buf, 8, 0, NULL, &req), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "isend");
	unit_assert_logged(RAIL_LOG_WARN, "not an open send comm");
	assert_int_equal(rail_net_irecv(c->hs, 1, (void *[]){ buf }, (size_t[]){ 8 },
					(int[]){ 0 }, (void *[]){ NULL }, &req),
			 ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "not an open receive comm");
	assert_int_equal(rail_net_accept(c->hs, &rc), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "not an open listen comm");
	assert_int_equal(rail_net_reg_mr(c->hl, buf, 8, RAIL_PTR_HOST, &mh),
			 ncclInternalError);
	assert_int_equal(rail_net_reg_mr(junk, buf, 8, RAIL_PTR_HOST, &mh), ncclInternalError);
	assert_int_equal(rail_net_close_send(NULL), ncclInternalError);
	assert_int_equal(rail_net_close_recv(c->hs), ncclInternalError);
	assert_int_equal(fake.calls, 0);
	assert_null(req);
	assert_null(rc);
	assert_null(mh);
}

static void test_reg_mr(void **state)
{
	struct comms *c = *state;
	void *mh = NULL, *req = NULL;
	char buf[8];
	int calls;

	assert_int_equal(rail_net_reg_mr(c->hs, buf, 8, RAIL_PTR_HOST, &mh), ncclSuccess);
	/* A handle, not the transport's object; the transport gets its object back. */
	assert_ptr_not_equal(mh, buf);
	assert_int_equal(rail_net_isend(c->hs, buf, 8, 0, mh, &req), ncclSuccess);
	assert_ptr_equal(fake.last_mh, buf);
	assert_int_equal(rail_net_dereg_mr(c->hs, mh), ncclSuccess);
	/* Twice: refused, and the transport is not asked. */
	calls = fake.calls;
	assert_int_equal(rail_net_dereg_mr(c->hs, mh), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "not a live registration");
	assert_int_equal(fake.calls, calls);
	/* A dead registration handle in isend is refused too. */
	req = NULL;
	assert_int_equal(rail_net_isend(c->hs, buf, 8, 0, mh, &req), ncclInternalError);
	assert_null(req);
	mh = NULL;
	assert_int_equal(rail_net_reg_mr(c->hs, buf, 8, 0, &mh), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "unknown pointer type");
	/* Only exactly HOST or CUDA: a mix or another bit names the type. */
	assert_int_equal(rail_net_reg_mr(c->hs, buf, 8, RAIL_PTR_HOST | RAIL_PTR_CUDA, &mh),
			 ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "0x3");
	assert_int_equal(rail_net_reg_mr(c->hs, buf, 8, RAIL_PTR_HOST | 0x10, &mh),
			 ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "0x11");
	assert_null(mh);
	fake.post_err = -ENOMEM;
	assert_int_equal(rail_net_reg_mr(c->hr, buf, 8, RAIL_PTR_HOST, &mh), ncclSystemError);
	assert_null(mh);
	/* No DMA-BUF support in the transport: a host buffer falls back to reg_mr... */
	fake.post_err = 0;
	assert_int_equal(rail_net_reg_mr_dmabuf(c->hs, buf, 8, RAIL_PTR_HOST, 0, -1, &mh),
			 ncclSuccess);
	assert_non_null(mh);
	/* ...a dma-buf fd is refused. */
	mh = NULL;
	assert_int_equal(rail_net_reg_mr_dmabuf(c->hs, buf, 8, RAIL_PTR_CUDA, 0, 5, &mh),
			 ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "no DMA-BUF support");
	assert_null(mh);
}

static void test_close_marks_dead(void **state)
{
	struct comms *c = *state;
	void *req = NULL;
	char buf[8];

	assert_int_equal(rail_net_close_send(c->hs), ncclSuccess);
	/* The comm is dead now: using or closing it again is refused. */
	assert_int_equal(rail_net_close_send(c->hs), ncclInternalError);
	assert_int_equal(rail_net_isend(c->hs, buf, 8, 0, NULL, &req), ncclInternalError);
	fake.post_err = -EIO;
	assert_int_equal(rail_net_close_listen(c->hl), ncclSystemError);
	fake.post_err = -ECONNRESET;
	assert_int_equal(rail_net_close_recv(c->hr), ncclRemoteError);
}

/*
 * Handles outlive their objects: a request of a closed comm, a registration
 * released with its comm, and a request whose comm's slot now holds another
 * comm (same request index) are refused, reading only live memory (ASan).
 */
static void test_handles_outlive_objects(void **state)
{
	struct comms *c = *state;
	struct rail_comm *other = calloc(1, sizeof(*other));
	void *req = NULL, *req2 = NULL, *mh = NULL, *h2 = NULL;
	int done = 0, calls, tries = 0;
	char buf[8];

	assert_non_null(other);
	assert_int_equal(rail_net_reg_mr(c->hs, buf, 8, RAIL_PTR_HOST, &mh), ncclSuccess);
	assert_int_equal(rail_net_isend(c->hs, buf, 8, 0, mh, &req), ncclSuccess);
	calls = fake.calls;
	assert_int_equal(rail_net_close_send(c->hs), ncclSuccess);
	assert_int_equal(fake.calls, calls + 2); /* the forgotten registration, then close */
	assert_int_equal(rail_net_test(req, &done, NULL), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "not a request in flight");
	assert_int_equal(rail_net_dereg_mr(c->hs, mh), ncclInternalError);
	unit_assert_logged(RAIL_LOG_WARN, "not an open send or receive comm");
	/* Cycle comms until one lands in the closed comm's slot. */
	do {
		if (h2)
			assert_int_equal(rail_net_close_send(h2), ncclSuccess);
		assert_int_equal(rail_comm_init(other, RAIL_COMM_SEND, 0, &fake_ops), 0);
		assert_int_equal(rail_net_adopt_comm(other, &h2), 0);
	} while (other->hidx != c->send.hidx && ++tries < 20000);
	assert_int_equal(other->hidx, c->send.hidx);
	assert_ptr_not_equal(h2, c->hs);
	assert_int_equal(rail_net_isend(h2, buf, 8, 0, NULL, &req2), ncclSuccess);
	assert_ptr_not_equal(req2, req);
	assert_int_equal(rail_net_test(req, &done, NULL), ncclInternalError);
	assert_int_equal(rail_net_close_send(c->hs), ncclInternalError);
	fake.test_done = 1;
	assert_int_equal(rail_net_test(req2, &done, NULL), ncclSuccess);
	assert_int_equal(done, 1);
	assert_int_equal(rail_net_close_send(h2), ncclSuccess);
	free(other);
}

static void test_accept_error(void **state)
{
	struct comms *c = *state;
	void *rc = (void *)1;

	fake.post_err = -ECONNABORTED;
	assert_int_equal(rail_net_accept(c->hl, &rc), ncclRemoteError);
	assert_ptr_equal(rc, (void *)1); /* not written on failure */
}

#define FAKE_TEST(fn) cmocka_unit_test_setup_teardown(fn, fake_setup, fake_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_result_required_mappings),
		cmocka_unit_test(test_result_remote_errors),
		cmocka_unit_test(test_result_internal_and_system),
		cmocka_unit_test(test_result_every_errno_is_an_error),
		cmocka_unit_test_setup_teardown(test_calls_before_init, setup, teardown),
		cmocka_unit_test_setup_teardown(test_init_finalize_arguments, setup, teardown),
		FAKE_TEST(test_isend_error_translation),
		FAKE_TEST(test_isend_eagain_is_null_request),
		FAKE_TEST(test_send_and_test_lifecycle),
		FAKE_TEST(test_grouped_recv_sizes),
		FAKE_TEST(test_test_error_frees_request),
		FAKE_TEST(test_request_exhaustion),
		FAKE_TEST(test_irecv_and_iflush_limits),
		FAKE_TEST(test_wrong_comm_kind),
		FAKE_TEST(test_reg_mr),
		FAKE_TEST(test_close_marks_dead),
		FAKE_TEST(test_accept_error),
		FAKE_TEST(test_handles_outlive_objects),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
