/*
 * nccl-net-rail: the verbs data path of one small message, counted in
 * instructions rather than timed (test/perf/instr.sh runs it under
 * callgrind). One process, two connections on the fake provider
 * (test/fakeverbs): A sends to B, B answers, as rail-bench -L does between
 * two processes. Each step of a round trip is its own function, so that
 * callgrind can count it alone:
 *   step_send:   isend, and test until the send is done (the sender's path)
 *   step_detect: test of a receive whose message is there (arrival to done)
 *   step_recv:   irecv (posted ahead in rail-bench, off the critical path)
 *   step_idle:   one test of a receive whose message has not come (a spin
 *                of the receiver's wait: half of it is, on average, added
 *                to the time from arrival to detection)
 * Under the rxe guest's emulated CPU every instruction on the path from a
 * message's arrival to the answer's post shows in the latency, and host
 * noise makes timed runs differ by 30%; counts do not move.
 *   pingpong ITERS [SIZE]
 */
#include <stdio.h>
#include <stdlib.h>

#include "api.h"
#include "handle.h"
#include "rail.h"

#define NET_ABI 12

struct pair {
	void *lc, *sc, *rc;
};

static void *ctx;

static void check(ncclResult_t r, const char *what)
{
	if (r != ncclSuccess) {
		fprintf(stderr, "pingpong: %s failed (%d)\n", what, (int)r);
		exit(1);
	}
}

static void pair_connect(struct pair *p, int rdev, int sdev)
{
	char h[RAIL_HANDLE_SIZE];

	check(rail_net_listen(ctx, rdev, h, &p->lc), "listen");
	while (!p->sc || !p->rc) {
		if (!p->sc)
			check(rail_net_connect(ctx, sdev, -1, h, &p->sc), "connect");
		if (!p->rc)
			check(rail_net_accept(p->lc, &p->rc), "accept");
	}
}

static void wait_req(void *r)
{
	int done = 0;

	while (!done)
		check(rail_net_test(r, &done, NULL), "test");
}

__attribute__((noinline)) void step_send(struct pair *p, void *buf, size_t n, void *mh);
__attribute__((noinline)) void step_send(struct pair *p, void *buf, size_t n, void *mh)
{
	void *r = NULL;

	while (!r)
		check(rail_net_isend(p->sc, buf, n, 1, mh, &r), "isend");
	wait_req(r);
}

__attribute__((noinline)) void step_detect(void *r);
__attribute__((noinline)) void step_detect(void *r)
{
	wait_req(r);
}

__attribute__((noinline)) void step_idle(void *r);
__attribute__((noinline)) void step_idle(void *r)
{
	int done = 1;

	check(rail_net_test(r, &done, NULL), "test");
	if (done) {
		fprintf(stderr, "pingpong: a receive completed before its message was sent\n");
		exit(1);
	}
}

__attribute__((noinline)) void *step_recv(struct pair *p, void *buf, size_t n, void *mh);
__attribute__((noinline)) void *step_recv(struct pair *p, void *buf, size_t n, void *mh)
{
	void *r = NULL, *d = buf;
	int tag = 1;

	while (!r)
		check(rail_net_irecv(p->rc, 1, &d, &n, &tag, &mh, &r), "irecv");
	return r;
}

int main(int argc, char **argv)
{
	static char abuf[2][65536], bbuf[2][65536];
	int iters = argc > 1 ? atoi(argv[1]) : 1000, ndev;
	size_t size = argc > 2 ? (size_t)atoll(argv[2]) : 8;
	struct pair ab = { 0 }, ba = { 0 };
	void *mh[4];

	if (iters < 1 || size > sizeof(abuf[0])) {
		fprintf(stderr, "usage: pingpong ITERS [SIZE <= %zu]\n", sizeof(abuf[0]));
		return 2;
	}
	check(rail_net_init(&ctx, 1, -1, NULL, NET_ABI), "init");
	check(rail_net_devices(&ndev), "devices");
	pair_connect(&ab, ndev > 1 ? 1 : 0, 0);
	pair_connect(&ba, 0, ndev > 1 ? 1 : 0);
	check(rail_net_reg_mr(ab.sc, abuf[0], sizeof(abuf[0]), NCCL_PTR_HOST, &mh[0]), "regMr");
	check(rail_net_reg_mr(ba.rc, abuf[1], sizeof(abuf[1]), NCCL_PTR_HOST, &mh[1]), "regMr");
	check(rail_net_reg_mr(ab.rc, bbuf[0], sizeof(bbuf[0]), NCCL_PTR_HOST, &mh[2]), "regMr");
	check(rail_net_reg_mr(ba.sc, bbuf[1], sizeof(bbuf[1]), NCCL_PTR_HOST, &mh[3]), "regMr");
	for (int i = 0; i < iters; i++) {
		void *rb = step_recv(&ab, bbuf[0], size, mh[2]);
		void *ra = step_recv(&ba, abuf[1], size, mh[1]);

		step_idle(rb);
		step_send(&ab, abuf[0], size, mh[0]);
		step_detect(rb);
		step_idle(ra);
		step_send(&ba, bbuf[1], size, mh[3]);
		step_detect(ra);
	}
	for (int i = 0; i < 4; i++)
		check(rail_net_dereg_mr(i == 0 ? ab.sc : i == 1 ? ba.rc : i == 2 ? ab.rc : ba.sc,
					mh[i]),
		      "deregMr");
	check(rail_net_close_send(ab.sc), "closeSend");
	check(rail_net_close_send(ba.sc), "closeSend");
	check(rail_net_close_recv(ab.rc), "closeRecv");
	check(rail_net_close_recv(ba.rc), "closeRecv");
	check(rail_net_close_listen(ab.lc), "closeListen");
	check(rail_net_close_listen(ba.lc), "closeListen");
	check(rail_net_finalize(ctx), "finalize");
	return 0;
}
