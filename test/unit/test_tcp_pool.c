/*
 * Unit tests of the TCP transport's helper thread pool (tcp_pool.c): the
 * threads of a process stay within NCCL_RAIL_TCP_THREADS however many
 * connections it opens, every byte still arrives in order, one thread
 * serves the send and the receive side of one process at once (a blocking
 * shared helper would deadlock), the last finalize joins every thread, and
 * a close that races with the owner taking the socket off its inbox leaves
 * the owner serving other comms; the inline limit grows on a crowded host;
 * messages NCCL's progress thread moves itself (NCCL_RAIL_TCP_DIRECT) wake
 * no helper, and mixed with helper-moved ones keep every byte in order.
 */
#include "unit.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"
#include "reqs.h"

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
	size_t want[NCONN];

	for (int i = 0; i < n; i++) {
		int tag = 1;
		size_t sz = size;
		void *data = ps[i].rbuf;

		want[i] = size;
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
	reqs_wait(sreq, rreq, want, n, 60, "one message per connection (helper threads stuck?)");
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
	/* the helpers are named so (top -H, ps -L) */
	if (unit_threads_named("rail-tcp-help") < 1 || unit_threads_named("rail-tcp-help") > bound)
		fail_msg("%d threads named rail-tcp-help, %d helpers allowed",
			 unit_threads_named("rail-tcp-help"), bound);
	/* and the thread of the data socket listeners (lazy data sockets, tcp_rescue.c) */
	if (t - t0 > bound + 1)
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

/* A send comm of one data socket (one end of a socketpair), attached to the pool. */
static struct tcp_comm *bare_comm(int *peer_fd)
{
	struct tcp_comm *c = calloc(1, sizeof(*c));
	int sv[2];

	assert_non_null(c);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
	c->is_send = 1;
	c->nsocks = 1;
	c->fds[0] = sv[0];
	snprintf(c->peer, sizeof(c->peer), "socketpair");
	assert_int_equal(tcp_pool_attach(c, 4), 0);
	*peer_fd = sv[1];
	return c;
}

/* Wait up to 5 s for *flag to be set. */
static int wait_flag(_Atomic int *flag, int want)
{
	uint64_t deadline = rail_now_ns() + 5000000000ull;

	while (atomic_load(flag) != want && rail_now_ns() < deadline)
		usleep(1000);
	return atomic_load(flag) == want;
}

/* The inline limit per host: the process pinned to one CPU, the launcher's rank count varied. */
static void test_inline_crowded_host(void **state)
{
	cpu_set_t old, one;
	char why[160];
	uint32_t v;

	(void)state;
	assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
	CPU_ZERO(&one);
	CPU_SET(0, &one);
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	unsetenv("NCCL_RAIL_TCP_INLINE");
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
	rail_params_reload();
	v = tcp_inline_max(why, sizeof(why));
	assert_int_equal(v, TCP_INLINE_DEFAULT);	/* one rank: not crowded, whatever the CPUs */
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
	v = tcp_inline_max(why, sizeof(why));
	assert_int_equal(v, TCP_INLINE_CROWDED);	/* 1 CPU / 2 ranks */
	assert_non_null(strstr(why, "1 CPUs / 2 local ranks (OMPI_COMM_WORLD_LOCAL_SIZE)"));
	assert_non_null(strstr(why, "crowded"));
	setenv("NCCL_RAIL_TCP_INLINE", "64k", 1);
	rail_params_reload();
	v = tcp_inline_max(why, sizeof(why));
	assert_int_equal(v, 64 * 1024);	/* the operator's value wins */
	assert_string_equal(why, "NCCL_RAIL_TCP_INLINE");
	unsetenv("NCCL_RAIL_TCP_INLINE");
	unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
	rail_params_reload();
	v = tcp_inline_max(why, sizeof(why));
	assert_int_equal(v, TCP_INLINE_DEFAULT);	/* no launcher: not crowded */
	assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
}

/*
 * The closer's kick comes after the owner took the socket off its inbox and
 * forgot it (the comm was closing already): tcp_pool_detach kicks every
 * socket of its comm. The owner must not forget it a second time: that
 * second forget spun forever on the socket's busy flag (which the first
 * leaves set), so no other comm of that thread moved a byte and its close,
 * then finalize's join, hung (or it wrote into the freed comm: ASan's
 * heap-use-after-free in forget). With one helper thread, a comm attached
 * after the close must still be served.
 */
static void test_close_after_forget(void **state)
{
	struct tcp_req r = { 0 }, r2 = { 0 };
	char out[4] = "rail", in[4] = { 0 };
	struct tcp_comm *c, *c2;
	int peer, peer2;

	(void)state;
	setenv("NCCL_RAIL_TCP_THREADS", "1", 1);
	rail_params_reload();
	c = bare_comm(&peer);
	/* The owner takes the socket off its inbox while its comm closes. */
	atomic_store(&c->closing, 1);
	atomic_store(&r.pending, 1);
	tcp_pool_push(c, 0, out, sizeof(out), &r, NULL, 0);
	if (!wait_flag(&c->streams[0].detached, 1))
		fail_msg("the helper thread did not forget the socket of a closing comm in 5 s");
	assert_int_equal(atomic_load(&r.pending), 0);
	assert_int_equal(atomic_load(&r.failed), 1);
	/* Then the closer kicks it. */
	tcp_pool_detach(c);
	c2 = bare_comm(&peer2);
	atomic_store(&r2.pending, 1);
	tcp_pool_push(c2, 0, out, sizeof(out), &r2, NULL, 0);
	if (!wait_flag(&r2.pending, 0))
		fail_msg("a chunk of a new comm was not moved in 5 s: the only helper thread is "
			 "stuck since a close kicked a socket it had forgotten (forgot it twice?)");
	assert_int_equal(atomic_load(&r2.failed), 0);
	assert_int_equal(read(peer2, in, sizeof(in)), (int)sizeof(in));
	assert_memory_equal(in, out, sizeof(in));
	atomic_store(&c2->closing, 1);
	tcp_pool_detach(c2);
	tcp_pool_stop();
	for (int i = 0; i < 2; i++) {
		struct tcp_comm *k = i ? c2 : c;

		close(k->fds[0]);
		free(k);
	}
	close(peer);
	close(peer2);
	unsetenv("NCCL_RAIL_TCP_THREADS");
	rail_params_reload();
}

/* One TCP pair in a fresh context, buffers of size bytes. */
static void direct_open(void **ctx, void **lc, struct pair *p, size_t size)
{
	uint8_t handle[RAIL_HANDLE_SIZE];

	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	rail_params_reload();
	*ctx = *lc = NULL;
	assert_int_equal(rail_net_init(ctx, 1, -1, NULL, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(*ctx, 0, handle, lc), ncclSuccess);
	pair_open(*ctx, *lc, handle, p);
	p->sbuf = malloc(size);
	p->rbuf = malloc(size);
	assert_non_null(p->sbuf);
	assert_non_null(p->rbuf);
}

static void direct_close(void *ctx, void *lc, struct pair *p)
{
	assert_int_equal(rail_net_close_send(p->sc), ncclSuccess);
	assert_int_equal(rail_net_close_recv(p->rc), ncclSuccess);
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	free(p->sbuf);
	free(p->rbuf);
}

/*
 * A window of n messages (sizes[i] bytes at offset offs[i] of the buffers)
 * posted at once on the pair, tested to the end; then every byte checked.
 */
static void window_run(struct pair *p, int n, const size_t *sizes, const size_t *offs,
		       unsigned seed, const char *what)
{
	void *sreq[8] = { 0 }, *rreq[8] = { 0 };

	for (int i = 0; i < n; i++) {
		void *data = p->rbuf + offs[i];
		size_t sz = sizes[i];
		int tag = 7;

		for (size_t k = 0; k < sizes[i]; k++)
			p->sbuf[offs[i] + k] = (char)(k * 131 + (size_t)i * 29 + seed);
		memset(data, 0, sizes[i]);
		while (!rreq[i])
			assert_int_equal(rail_net_irecv(p->rc, 1, &data, &sz, &tag, NULL, &rreq[i]),
					 ncclSuccess);
		while (!sreq[i])
			assert_int_equal(rail_net_isend(p->sc, p->sbuf + offs[i], sizes[i], 7, NULL,
							&sreq[i]), ncclSuccess);
	}
	reqs_wait(sreq, rreq, sizes, n, 30, what);
	for (int i = 0; i < n; i++)
		if (memcmp(p->sbuf + offs[i], p->rbuf + offs[i], sizes[i]))
			fail_msg("%s: message %d of %d (%zu bytes): the bytes received differ from "
				 "those sent", what, i, n, sizes[i]);
}

/*
 * n messages of size bytes one after another on a new pair: the messages
 * sent inline above the inline limit, the chunks pushed direct and those
 * helper threads moved meanwhile. busy: another
 * pair of the process keeps a 64 MiB message in flight (its receiver never
 * reads), so its chunks stay queued all along.
 */
static void one_by_one(const char *direct, const char *help, int n, size_t size, int busy,
		       uint64_t *ninline, uint64_t *ndirect, uint64_t *nhelper)
{
	struct pair p, q;
	void *ctx, *lc, *qreq = NULL;
	uint64_t d0, h0, i0;
	size_t off = 0;

	setenv("NCCL_RAIL_TCP_DIRECT", direct, 1);
	setenv("NCCL_RAIL_TCP_HELP", help, 1);
	direct_open(&ctx, &lc, &p, size);
	window_run(&p, 1, &size, &off, 1, "warm-up"); /* up to the bound it goes inline */
	if (busy) {
		uint8_t handle[RAIL_HANDLE_SIZE];
		void *qlc;
		size_t big = 64u << 20;

		assert_int_equal(rail_net_listen(ctx, 0, handle, &qlc), ncclSuccess);
		pair_open(ctx, qlc, handle, &q);
		assert_int_equal(rail_net_close_listen(qlc), ncclSuccess);
		q.sbuf = calloc(1, big);
		q.rbuf = malloc(size);
		assert_non_null(q.sbuf);
		assert_non_null(q.rbuf);
		window_run(&q, 1, &size, &off, 2, "warm-up");
		while (!qreq)
			assert_int_equal(rail_net_isend(q.sc, q.sbuf, big, 1, NULL, &qreq),
					 ncclSuccess);
		/* its chunks are queued once its data sockets are open (the warm-up went inline) */
		for (int t = 0; tcp_pool_idle() && t < 5000; t++) {
			int done = 0;

			assert_int_equal(rail_net_test(qreq, &done, NULL), ncclSuccess);
			usleep(1000);
		}
		if (tcp_pool_idle())
			fail_msg("the busy pair's 64 MiB message has no chunk queued after 5 s");
	}
	tcp_pool_counts(&d0, &h0);
	i0 = tcp_data_idle_inline();
	for (int i = 0; i < n; i++)
		window_run(&p, 1, &size, &off, (unsigned)i, "one by one");
	tcp_pool_counts(ndirect, nhelper);
	*ndirect -= d0;
	*nhelper -= h0;
	*ninline = tcp_data_idle_inline() - i0;
	if (busy) {
		/* never completes: its receiver posted nothing; closing fails its chunks */
		assert_int_equal(rail_net_close_send(q.sc), ncclSuccess);
		assert_int_equal(rail_net_close_recv(q.rc), ncclSuccess);
		free(q.sbuf);
		free(q.rbuf);
	}
	direct_close(ctx, lc, &p);
	if (!tcp_pool_idle())
		fail_msg("chunks still counted as queued after every comm closed: a path that "
			 "ends a chunk without counting it");
	unsetenv("NCCL_RAIL_TCP_DIRECT");
	unsetenv("NCCL_RAIL_TCP_HELP");
	rail_params_reload();
}

/*
 * 64 KiB messages one at a time (a ping-pong's pattern): with
 * NCCL_RAIL_TCP_DIRECT at or above their size each goes inline on the
 * control socket (the frame's INLINE flag): no chunk is pushed, no helper
 * thread moves any (a hand-off woke one on each side: 64 instead of 20 us
 * at 32 KiB on this VM); with NCCL_RAIL_TCP_HELP=0 the helpers move all of
 * them; and while another pair of the process has chunks in flight (as the
 * other channels and direction of an all-reduce do), none goes inline and
 * none is direct: the helpers move them.
 */
static void test_direct_wakes_no_helper(void **state)
{
	uint64_t inl, direct, helper;

	(void)state;
	one_by_one("512k", "1", 100, 64u << 10, 0, &inl, &direct, &helper);
	if (inl != 100 || direct || helper)
		fail_msg("100 messages of 64 KiB sent one at a time, NCCL_RAIL_TCP_DIRECT=512k: "
			 "%llu sent inline, %llu chunks pushed direct, %llu moved by helper threads "
			 "(want 100, 0 and 0)", (unsigned long long)inl, (unsigned long long)direct,
			 (unsigned long long)helper);
	one_by_one("32k", "1", 100, 64u << 10, 0, &inl, &direct, &helper);
	if (inl || direct)
		fail_msg("64 KiB messages with NCCL_RAIL_TCP_DIRECT=32k: %llu sent inline, %llu "
			 "chunks pushed direct (want 0 and 0: above the bound they are cut for the "
			 "data sockets)", (unsigned long long)inl, (unsigned long long)direct);
	one_by_one("512k", "0", 100, 64u << 10, 0, &inl, &direct, &helper);
	if (inl || direct || helper != 200)
		fail_msg("with NCCL_RAIL_TCP_HELP=0: %llu sent inline, %llu chunks pushed direct, "
			 "helper threads moved %llu (want 0, 0 and 200)", (unsigned long long)inl,
			 (unsigned long long)direct, (unsigned long long)helper);
	one_by_one("512k", "1", 50, 64u << 10, 1, &inl, &direct, &helper);
	if (inl || direct)
		fail_msg("with another pair's message in flight, %llu of 50 messages went inline and "
			 "%llu of 100 chunks were pushed direct (want 0 and 0: the progress thread's "
			 "copies would delay that pair)", (unsigned long long)inl,
			 (unsigned long long)direct);
}

/*
 * Seeded: windows of 1-8 messages of mixed sizes (inline, direct, several
 * chunks) on one pair, so direct and helper-moved chunks share sockets in
 * every order; every byte must arrive. TCP_DIRECT_SEEDS=N runs N seeds;
 * a failure names its seed, and TCP_DIRECT_SEED=S replays it alone.
 */
static void test_direct_mixed(void **state)
{
	const char *one = getenv("TCP_DIRECT_SEED"), *many = getenv("TCP_DIRECT_SEEDS");
	unsigned first = one ? (unsigned)atoi(one) : 1, nseeds = one ? 1 :
		many ? (unsigned)atoi(many) : 6;
	size_t cap = 8 * (3u << 20);
	struct pair p;
	void *ctx, *lc;

	(void)state;
	direct_open(&ctx, &lc, &p, cap);
	for (unsigned seed = first; seed < first + nseeds; seed++) {
		unsigned r = seed;
		char what[64];

		snprintf(what, sizeof(what), "seed %u (TCP_DIRECT_SEED=%u replays it)", seed, seed);
		for (int round = 0; round < 20; round++) {
			size_t sizes[8], offs[8], off = 0;
			int n = 1 + rand_r(&r) % 8;

			for (int i = 0; i < n; i++) {
				int kind = rand_r(&r) % 3;

				sizes[i] = kind == 0 ? (size_t)(rand_r(&r) % (16 << 10))
					 : kind == 1 ? (16u << 10) + 1 + (size_t)(rand_r(&r) % (496 << 10))
					 : (512u << 10) + 1 + (size_t)(rand_r(&r) % (2560 << 10));
				offs[i] = off;
				off += sizes[i];
			}
			window_run(&p, n, sizes, offs, seed * 131 + (unsigned)round, what);
		}
	}
	direct_close(ctx, lc, &p);
	if (!tcp_pool_idle())
		fail_msg("chunks still counted as queued after every comm closed");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_bounded),
		cmocka_unit_test(test_one_thread_both_sides),
		cmocka_unit_test(test_threads_lazy),
		cmocka_unit_test(test_close_after_forget),
		cmocka_unit_test(test_inline_crowded_host),
		cmocka_unit_test(test_direct_wakes_no_helper),
		cmocka_unit_test(test_direct_mixed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
