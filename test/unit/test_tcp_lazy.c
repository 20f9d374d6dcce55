/*
 * Lazy TCP data sockets (NCCL_RAIL_TCP_LAZY, the default): a connection
 * holds its control socket alone until its first message above the inline
 * limit, then 1 + nsocks sockets while the process holds fewer than
 * TCP_LAZY_BUDGET comms with data sockets, 1 + 1 beyond. The sockets of
 * this process are counted in /proc/self/fd around connects, small
 * messages and large ones, and every byte received is checked, also for
 * messages posted while the open of the data sockets is under way: a
 * seeded random mix of sizes and tags (the seed is printed; set
 * RAIL_TEST_SEED to replay one).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "handles.h"
#include "rail.h"
#include "tcp/tcp.h"
#include "unit.h"
#include "reqs.h"

#define NPAIRS 40	/* 80 comms: more than TCP_LAZY_BUDGET hold data sockets */
#define BATCH 8
#define LARGE_MAX (3u << 20)

struct pair {
	void *sc, *rc;
	struct tcp_comm *s, *r;
};

static struct pair pairs[NPAIRS];
static char *sbuf[BATCH], *rbuf[BATCH];

/* The sockets this process holds (/proc/self/fd entries that are sockets). */
static int count_sockets(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d))) {
		char path[300], target[64];
		ssize_t len;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		len = readlink(path, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		n += strncmp(target, "socket:", 7) == 0;
	}
	closedir(d);
	return n;
}

static struct tcp_comm *comm_ptr(void *h)
{
	uint32_t kind = 0;

	return rail_h_get(RAIL_HT_COMM, (uintptr_t)h, &kind);
}

static void pair_open(void *ctx, void *lc, const uint8_t *handle, struct pair *p)
{
	uint8_t h[RAIL_HANDLE_SIZE];
	uint64_t deadline = rail_now_ns() + 20ull * 1000000000ull;

	memcpy(h, handle, sizeof(h));
	while ((!p->sc || !p->rc) && rail_now_ns() < deadline) {
		if (!p->sc)
			assert_int_equal(rail_net_connect(ctx, 0, -1, h, &p->sc), ncclSuccess);
		if (!p->rc)
			assert_int_equal(rail_net_accept(lc, &p->rc), ncclSuccess);
	}
	assert_non_null(p->sc);
	assert_non_null(p->rc);
	p->s = comm_ptr(p->sc);
	p->r = comm_ptr(p->rc);
	assert_non_null(p->s);
	assert_non_null(p->r);
}

static unsigned rnd(unsigned *state)
{
	*state = *state * 1103515245u + 12345u;
	return *state >> 8;
}

/*
 * n messages on pair p at once, all posted before any is tested (so on a
 * comm without data sockets the large ones wait for the open): sizes[i]
 * bytes with tags[i]; every byte checked.
 */
static void batch(struct pair *p, int n, const size_t *sizes, const int *tags, unsigned k)
{
	void *sreq[BATCH] = { 0 }, *rreq[BATCH] = { 0 };

	for (int i = 0; i < n; i++) {
		size_t sz = sizes[i];
		int tag = tags[i];
		void *data = rbuf[i];

		for (size_t b = 0; b < sizes[i]; b++)
			sbuf[i][b] = (char)(b * 131 + (size_t)i * 7 + k);
		memset(rbuf[i], 0, sizes[i] + 1);
		while (!rreq[i])
			assert_int_equal(rail_net_irecv(p->rc, 1, &data, &sz, &tag, NULL, &rreq[i]),
					 ncclSuccess);
	}
	/* 1 ms between sends: an open under way completes between two of them. */
	for (int i = 0; i < n; i++) {
		while (!sreq[i])
			assert_int_equal(rail_net_isend(p->sc, sbuf[i], sizes[i], tags[i], NULL,
							&sreq[i]), ncclSuccess);
		usleep(1000);
	}
	reqs_wait(sreq, rreq, sizes, n, 30, "a batch of mixed sizes and tags");
	for (int i = 0; i < n; i++)
		if (memcmp(sbuf[i], rbuf[i], sizes[i]) || rbuf[i][sizes[i]])
			fail_msg("message %d of %zu bytes (tag %d): the bytes received differ from "
				 "those sent", i, sizes[i], tags[i]);
}

/*
 * A seeded mix of sizes: small (up to the inline limit) or large (above it:
 * those above NCCL_RAIL_TCP_DIRECT too, or sent while others are queued, open
 * the data sockets), random tags.
 */
static void mix(struct pair *p, unsigned *state, int large_ok, size_t inl)
{
	size_t sizes[BATCH];
	int tags[BATCH];

	for (int i = 0; i < BATCH; i++) {
		unsigned r = rnd(state);

		sizes[i] = large_ok && (r & 1) ? inl + 1 + rnd(state) % (LARGE_MAX - inl)
					       : rnd(state) % (inl + 1);
		tags[i] = (int)(rnd(state) % 1000);
	}
	batch(p, BATCH, sizes, tags, *state);
}

/* The rule of tcp_lazy_socks, played over the pairs in the order they open. */
static int expected_data_socks(int opened_before, int nsocks)
{
	return 2 * opened_before >= TCP_LAZY_BUDGET ? 1 : nsocks;
}

static unsigned test_seed(void)
{
	const char *env = getenv("RAIL_TEST_SEED");
	unsigned seed = env ? (unsigned)strtoul(env, NULL, 0) : (unsigned)rail_random64();

	fprintf(stderr, "lazy: seed %u (replay: RAIL_TEST_SEED=%u)\n", seed, seed);
	return seed;
}

static void test_lazy_data_sockets(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	void *ctx = NULL, *lc = NULL;
	unsigned seed = test_seed(), st = seed;
	int base, nsocks, want, full = 0, one = 0;
	size_t inl;

	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	unsetenv("NCCL_RAIL_TCP_LAZY");
	for (int i = 0; i < BATCH; i++) {
		sbuf[i] = malloc(LARGE_MAX + 1);
		rbuf[i] = malloc(LARGE_MAX + 1);
		assert_non_null(sbuf[i]);
		assert_non_null(rbuf[i]);
	}
	assert_int_equal(rail_net_init(&ctx, 1, -1, NULL, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	base = count_sockets();
	memset(pairs, 0, sizeof(pairs));
	for (int i = 0; i < NPAIRS; i++)
		pair_open(ctx, lc, handle, &pairs[i]);
	want = base + 2 * NPAIRS;
	if (count_sockets() != want)
		fail_msg("%d pairs connected: %d sockets, expected %d (%d before + 1 control "
			 "socket per comm)", NPAIRS, count_sockets(), want, base);
	nsocks = pairs[0].s->lazy_max;
	inl = pairs[0].s->inline_max;
	assert_true(nsocks > 1);
	/* Small messages only: no data socket opens. */
	for (int i = 0; i < NPAIRS; i++)
		mix(&pairs[i], &st, 0, inl);
	assert_int_equal(count_sockets(), want);
	/* Then a mix with large ones, pair after pair: the budget decides each pair's sockets. */
	for (int i = 0; i < NPAIRS; i++) {
		int exp = expected_data_socks(i, nsocks);

		mix(&pairs[i], &st, 1, inl);
		/*
		 * The mix had no message that needs the data sockets (larger ones up to
		 * NCCL_RAIL_TCP_DIRECT go inline while nothing else is queued): send one.
		 */
		if (!pairs[i].s->nsocks) {
			size_t sz = RAIL_MAX(inl, pairs[i].s->direct_max) + 1;
			int tag = 5;

			batch(&pairs[i], 1, &sz, &tag, st);
		}
		want += 2 * exp;
		if (pairs[i].s->nsocks != exp || pairs[i].r->nsocks != exp)
			fail_msg("pair %d: %d data sockets on the send comm, %d on the receive comm, "
				 "expected %d (%d comms hold data sockets)", i, pairs[i].s->nsocks,
				 pairs[i].r->nsocks, exp, tcp_data_comms());
		if (count_sockets() != want)
			fail_msg("pair %d: %d sockets in the process, expected %d", i,
				 count_sockets(), want);
		full += exp == nsocks;
		one += exp == 1;
		mix(&pairs[i], &st, 1, inl);	/* and more traffic on the open sockets */
	}
	fprintf(stderr, "lazy: %d pairs with %d data sockets, %d with 1; %d sockets for %d pairs "
		"(eager: %d)\n", full, nsocks, one, want - base, NPAIRS, NPAIRS * 2 * (1 + nsocks));
	assert_true(full > 0 && one > 0);
	for (int i = 0; i < NPAIRS; i++) {
		assert_int_equal(rail_net_close_send(pairs[i].sc), ncclSuccess);
		assert_int_equal(rail_net_close_recv(pairs[i].rc), ncclSuccess);
	}
	assert_int_equal(count_sockets(), base);
	assert_int_equal(tcp_data_comms(), 0);
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	for (int i = 0; i < BATCH; i++) {
		free(sbuf[i]);
		free(rbuf[i]);
	}
}

/* NCCL_RAIL_TCP_LAZY=0: every data socket at connect, as before. */
static void test_eager_when_asked(void **state)
{
	uint8_t handle[RAIL_HANDLE_SIZE];
	void *ctx = NULL, *lc = NULL;
	struct pair p;
	int base;

	(void)state;
	setenv("NCCL_RAIL_TRANSPORT", "tcp", 1);
	setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	setenv("NCCL_RAIL_TCP_LAZY", "0", 1);
	assert_int_equal(rail_net_init(&ctx, 1, -1, NULL, 12), ncclSuccess);
	assert_int_equal(rail_net_listen(ctx, 0, handle, &lc), ncclSuccess);
	base = count_sockets();
	memset(&p, 0, sizeof(p));
	pair_open(ctx, lc, handle, &p);
	assert_true(p.s->nsocks > 1);
	assert_int_equal(p.r->nsocks, p.s->nsocks);
	assert_int_equal(count_sockets(), base + 2 * (1 + p.s->nsocks));
	assert_int_equal(rail_net_close_send(p.sc), ncclSuccess);
	assert_int_equal(rail_net_close_recv(p.rc), ncclSuccess);
	assert_int_equal(rail_net_close_listen(lc), ncclSuccess);
	assert_int_equal(rail_net_finalize(ctx), ncclSuccess);
	unsetenv("NCCL_RAIL_TCP_LAZY");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lazy_data_sockets),
		cmocka_unit_test(test_eager_when_asked),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
