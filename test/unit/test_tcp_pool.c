/*
 * Unit tests of the TCP transport's helper thread pool (tcp_pool.c): the
 * threads of a process stay within NCCL_RAIL_TCP_THREADS however many
 * connections it opens, every byte still arrives in order, one thread
 * serves the send and the receive side of one process at once (a blocking
 * shared helper would deadlock), and the last finalize joins every thread.
 */
#include "unit.h"

#include <dirent.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "rail.h"

#define NCONN 32
#define MSG (1u << 20)

struct pair {
	void *sc, *rc;
	char *sbuf, *rbuf;
};

static void *noop_thread(void *arg)
{
	return arg;
}

static int count_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Joined threads can stay listed for a moment: wait up to 3 s for at most want. */
static int threads_settle(int want)
{
	int t = count_threads();

	for (int i = 0; i < 150 && t > want; i++) {
		usleep(20000);
		t = count_threads();
	}
	return t;
}

static void pair_open(void *ctx, void *lc, const uint8_t *handle, struct pair *p)
{
	uint8_t h[RAIL_HANDLE_SIZE];
	uint64_t deadline = rail_now_ns() + 20ull * 1000000000ull;

	(void)ctx;
	memcpy(h, handle, sizeof(h));
	p->sc = p->rc = NULL;
	while ((!p->sc || !p->rc) && rail_now_ns() < deadline) {
		if (!p->sc)
			assert_int_equal(rail_net_connect(ctx, 0, -1, h, &p->sc), ncclSuccess);
		if (!p->rc)
			assert_int_equal(rail_net_accept(lc, &p->rc), ncclSuccess);
	}
	assert_non_null(p->sc);
	assert_non_null(p->rc);
}

/* One message of `size` bytes on every pair at once, then check every byte. */
static void traffic(struct pair *ps, int n, size_t size, unsigned seed)
{
	void *sreq[NCONN] = { 0 }, *rreq[NCONN] = { 0 };
	int sdone[NCONN] = { 0 }, rdone[NCONN] = { 0 }, left = 2 * n, got;
	uint64_t deadline = rail_now_ns() + 60ull * 1000000000ull;

	for (int i = 0; i < n; i++) {
		int tag = 1;
		size_t sz = size;
		void *data = ps[i].rbuf;

		for (size_t k = 0; k < size; k++)
			ps[i].sbuf[k] = (char)(k * 131 + (size_t)i * 7 + seed);
		memset(ps[i].rbuf, 0, size);
		while (!rreq[i])
			assert_int_equal(rail_net_irecv(ps[i].rc, 1, &data, &sz, &tag, NULL,
							&rreq[i]), ncclSuccess);
		while (!sreq[i])
			assert_int_equal(rail_net_isend(ps[i].sc, ps[i].sbuf, size, 1, NULL,
							&sreq[i]), ncclSuccess);
	}
	while (left && rail_now_ns() < deadline) {
		for (int i = 0; i < n; i++) {
			if (!sdone[i]) {
				assert_int_equal(rail_net_test(sreq[i], &sdone[i], &got), ncclSuccess);
				left -= sdone[i];
			}
			if (!rdone[i]) {
				assert_int_equal(rail_net_test(rreq[i], &rdone[i], &got), ncclSuccess);
				if (rdone[i])
					assert_int_equal(got, (int)size);
				left -= rdone[i];
			}
		}
	}
	if (left)
		fail_msg("%d of %d requests not done in 60 s (helper threads stuck?)", left, 2 * n);
	for (int i = 0; i < n; i++)
		if (memcmp(ps[i].sbuf, ps[i].rbuf, size))
			fail_msg("connection %d: the %zu bytes received differ from those sent", i,
				 size);
}

static void pairs_run(int nconn, const char *threads, int bound, size_t size)
{
	static struct pair ps[NCONN];
	uint8_t handle[RAIL_HANDLE_SIZE];
	void *ctx = NULL, *lc = NULL;
	pthread_t th;
	int t0, t;

	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	setenv("NCCL_RAIL_TCP_THREADS", threads, 1);
	/* A first thread starts any runtime helper threads (TSan's) before the baseline. */
	if (!pthread_create(&th, NULL, noop_thread, NULL))
		pthread_join(th, NULL);
	t0 = threads_settle(1);
	unit_log_capture();
	assert_int_equal(rail_net_init(&ctx, 1, -1, unit_log_sink, 12), ncclSuccess);
	assert_true(unit_log_has(RAIL_LOG_INFO, "helper threads per process"));
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	for (int i = 0; i < nconn; i++) {
		pair_open(ctx, lc, handle, &ps[i]);
		ps[i].sbuf = malloc(size);
		ps[i].rbuf = malloc(size);
		assert_non_null(ps[i].sbuf);
		assert_non_null(ps[i].rbuf);
	}
	for (unsigned round = 0; round < 3; round++)
		traffic(ps, nconn, size, round);
	t = count_threads();
	if (t - t0 > bound)
		fail_msg("%d connections (%d comms) run %d threads, %d before init: more than "
			 "the %d helper threads per process NCCL_RAIL_TCP_THREADS=%s allows", nconn,
			 2 * nconn, t, t0, bound, threads);
	for (int i = 0; i < nconn; i++) {
		assert_int_equal(rail_net_close_send(ps[i].sc), ncclSuccess);
		assert_int_equal(rail_net_close_recv(ps[i].rc), ncclSuccess);
		free(ps[i].sbuf);
		free(ps[i].rbuf);
	}
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unit_log_release();
	t = threads_settle(t0);
	if (t > t0)
		fail_msg("%d threads after the last finalize, %d before init: helpers outlive it",
			 t, t0);
	unsetenv("NCCL_RAIL_TCP_THREADS");
}

/* 32 connections in one process, 64 comms, 256 data sockets: at most 4 helper threads. */
static void test_threads_bounded(void **state)
{
	(void)state;
	pairs_run(NCONN, "4", 4, MSG);
}

/* One helper thread moves 16 MiB both ways for 4 connections of the same process at once. */
static void test_one_thread_both_sides(void **state)
{
	(void)state;
	pairs_run(4, "1", 1, 16u << 20);
}

/* Threads start as sockets appear: one connection (4 + 4 data sockets in this process) starts 8, not 16. */
static void test_threads_lazy(void **state)
{
	(void)state;
	pairs_run(1, "16", 8, 3u << 20);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_bounded),
		cmocka_unit_test(test_one_thread_both_sides),
		cmocka_unit_test(test_threads_lazy),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
