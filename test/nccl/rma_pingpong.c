/*
 * rma-pingpong: NCCL's host one-sided API (ncclPutSignal / ncclWaitSignal,
 * NCCL 2.29+) against two-sided ncclSend / ncclRecv, in one program.
 *
 *   mpirun -np N [wrapper] rma-pingpong [-b MIN] [-e MAX] [-f FACTOR]
 *                                       [-w WARMUP] [-n ITERS] [-r] [-t]
 *
 * Setup: ncclMemAlloc'd buffers registered with ncclCommWindowRegister(...,
 * NCCL_WIN_COLL_SYMMETRIC); ncclCommQueryProperties says whether the
 * communicator has host RMA (hostRmaSupport), and the program prints it.
 * Then, per size:
 *   a) ping-pong between ranks 0 and 1: one-sided (rank 0 puts and waits for
 *      the answer, rank 1 waits and puts back) and two-sided (send/recv), side
 *      by side; time is half a round trip in us, bandwidth size / that time;
 *   b) many-to-one: every rank but 0 puts its block to rank 0 (at offset
 *      rank x MAX of rank 0's window), rank 0 waits for all of them and
 *      answers each with ncclSignal; time per round in us, bandwidth the
 *      bytes that reached rank 0 per round over its time.
 * Every received byte is checked: the bytes of a put from rank r in check
 * round v follow pattern(r, v, offset); the timed loops' last data too.
 * Last, the two targets of the TCP RMA backend: one-sided bandwidth at the
 * largest size >= 0.8 x two-sided, and the smallest size's one-sided round
 * trip <= 1.5 x two-sided.
 *
 * Every rank makes its first one-sided call at the same time (a ring of
 * ncclSignal / ncclWaitSignal right after the windows are registered): in
 * NCCL 2.30 a communicator's first one-sided call registers a symmetric
 * signal window (ncclRmaCeInit from the group end), which is collective, so
 * a ping-pong between ranks 0 and 1 as the first one-sided traffic hangs
 * with more than 2 ranks while the others wait in MPI.
 * -r: exit 1 when the communicator has no host RMA (else the one-sided
 * parts are skipped with a line saying so and two-sided still runs).
 * -t: exit 1 when a target is missed (else only reported).
 * The GPU is $RAIL_TEST_GPU if set, else the local rank modulo the GPUs.
 * Exits non-zero if a byte is wrong or a call fails.
 */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <nccl_device/core.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prog.h"

#define NCHECK_ROUNDS 2 /* check rounds per size, each with a fresh pattern */

static int g_nranks;

struct opts {
	size_t min, max;
	double factor;
	int warmup, iters;
	int need_rma, need_targets;
};

struct bufs {
	ncclComm_t comm;
	cudaStream_t stream;
	size_t max;
	/* one-sided: symmetric windows; send holds MAX, recv nranks x MAX */
	char *send, *recv;
	ncclWindow_t send_win, recv_win;
	/* two-sided: plain device buffers of MAX */
	char *ssend, *srecv;
	unsigned char *host; /* MAX bytes to fill and check */
	int rma;
};

/* The byte at offset i of a block sent by rank r in round v. */
static unsigned char pattern(int r, int v, size_t i)
{
	uint32_t x = (uint32_t)i * 2654435761u;

	x ^= (uint32_t)(r + 1) * 0x9e3779b9u + (uint32_t)(v + 1) * 0x85ebca6bu;
	x ^= x >> 15;
	return (unsigned char)(x ^ (x >> 8));
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
	int c;

	o->min = 8;
	o->max = 64 << 20;
	o->factor = 4;
	o->warmup = 5;
	o->iters = 20;
	o->need_rma = 0;
	o->need_targets = 0;
	while ((c = getopt(argc, argv, "b:e:f:w:n:rt")) != -1) {
		switch (c) {
		case 'b': o->min = parse_size(optarg); break;
		case 'e': o->max = parse_size(optarg); break;
		case 'f': o->factor = atof(optarg); break;
		case 'w': o->warmup = atoi(optarg); break;
		case 'n': o->iters = atoi(optarg); break;
		case 'r': o->need_rma = 1; break;
		case 't': o->need_targets = 1; break;
		default:
			if (g_rank == 0)
				fprintf(stderr, "usage: %s [-b MIN] [-e MAX] [-f FACTOR] "
					"[-w WARMUP] [-n ITERS] [-r] [-t]\n", argv[0]);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	if (o->min < 1 || o->max < o->min || o->factor <= 1 || o->iters < 1 || o->warmup < 0) {
		if (g_rank == 0)
			fprintf(stderr, "bad sizes or counts\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
}

/* Fill the first SIZE bytes of device buffer DST with pattern(r, v). */
static void fill(struct bufs *b, char *dst, size_t size, int r, int v)
{
	for (size_t i = 0; i < size; i++)
		b->host[i] = pattern(r, v, i);
	CUDA_CHECK(cudaMemcpy(dst, b->host, size, cudaMemcpyHostToDevice));
}

/* Count the bytes of device buffer SRC that are not pattern(r, v). */
static size_t check(struct bufs *b, const char *src, size_t size, int r, int v,
		    const char *what)
{
	size_t bad = 0, first = 0;

	CUDA_CHECK(cudaMemcpy(b->host, src, size, cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < size; i++) {
		if (b->host[i] != pattern(r, v, i)) {
			if (!bad)
				first = i;
			bad++;
		}
	}
	if (bad)
		fprintf(stderr, "rank %d: %s, %zu bytes from rank %d round %d: %zu wrong, "
			"the first at offset %zu (0x%02x, expected 0x%02x)\n", g_rank, what,
			size, r, v, bad, first, b->host[first], pattern(r, v, first));
	return bad;
}

/* The first one-sided call of every rank together: a ring of signals. */
static void first_rma_call(struct bufs *b)
{
	ncclWaitSignalDesc_t w = { .opCnt = 1, .peer = (g_rank + g_nranks - 1) % g_nranks,
				   .sigIdx = 0, .ctx = 0 };

	NCCL_CHECK(ncclSignal((g_rank + 1) % g_nranks, 0, 0, 0, b->comm, b->stream));
	NCCL_CHECK(ncclWaitSignal(1, &w, b->comm, b->stream));
	CUDA_CHECK(cudaStreamSynchronize(b->stream));
	MPI_Barrier(MPI_COMM_WORLD);
	if (g_rank == 0)
		printf("# first one-sided call on every rank done (a ring of signals)\n");
}

static void setup(struct bufs *b, const struct opts *o)
{
	ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
	ncclUniqueId id;

	if (g_rank == 0)
		NCCL_CHECK(ncclGetUniqueId(&id));
	MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
	NCCL_CHECK(ncclCommInitRank(&b->comm, g_nranks, id, g_rank));
	CUDA_CHECK(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
	NCCL_CHECK(ncclCommQueryProperties(b->comm, &props));
	b->rma = props.hostRmaSupport;
	if (g_rank == 0)
		printf("# rma-pingpong: %d ranks, NCCL %d; hostRmaSupport %d, ginType %d, "
		       "railedGinType %d, nLsaTeams %d, deviceApiSupport %d\n", g_nranks,
		       NCCL_VERSION_CODE, (int)props.hostRmaSupport, (int)props.ginType,
		       (int)props.railedGinType, props.nLsaTeams, (int)props.deviceApiSupport);
	b->max = o->max;
	b->host = malloc(o->max);
	if (!b->host) {
		fprintf(stderr, "rank %d: no memory for %zu bytes\n", g_rank, o->max);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	CUDA_CHECK(cudaMalloc((void **)&b->ssend, o->max));
	CUDA_CHECK(cudaMalloc((void **)&b->srecv, o->max));
	if (!b->rma)
		return;
	NCCL_CHECK(ncclMemAlloc((void **)&b->send, o->max));
	NCCL_CHECK(ncclMemAlloc((void **)&b->recv, o->max * (size_t)g_nranks));
	NCCL_CHECK(ncclCommWindowRegister(b->comm, b->send, o->max, &b->send_win,
					  NCCL_WIN_COLL_SYMMETRIC));
	NCCL_CHECK(ncclCommWindowRegister(b->comm, b->recv, o->max * (size_t)g_nranks,
					  &b->recv_win, NCCL_WIN_COLL_SYMMETRIC));
	first_rma_call(b);
}

static void teardown(struct bufs *b)
{
	CUDA_CHECK(cudaStreamSynchronize(b->stream));
	if (b->rma) {
		NCCL_CHECK(ncclCommWindowDeregister(b->comm, b->send_win));
		NCCL_CHECK(ncclCommWindowDeregister(b->comm, b->recv_win));
		NCCL_CHECK(ncclMemFree(b->send));
		NCCL_CHECK(ncclMemFree(b->recv));
	}
	CUDA_CHECK(cudaFree(b->ssend));
	CUDA_CHECK(cudaFree(b->srecv));
	NCCL_CHECK(ncclCommDestroy(b->comm));
	CUDA_CHECK(cudaStreamDestroy(b->stream));
	free(b->host);
}

/* One one-sided ping-pong exchange of SIZE bytes between ranks 0 and 1. */
static void put_exchange(struct bufs *b, size_t size)
{
	int peer = 1 - g_rank;
	ncclWaitSignalDesc_t w = { .opCnt = 1, .peer = peer, .sigIdx = 0, .ctx = 0 };

	if (g_rank == 0) {
		NCCL_CHECK(ncclPutSignal(b->send, size, ncclInt8, peer, b->recv_win, 0, 0, 0, 0,
					 b->comm, b->stream));
		NCCL_CHECK(ncclWaitSignal(1, &w, b->comm, b->stream));
	} else {
		NCCL_CHECK(ncclWaitSignal(1, &w, b->comm, b->stream));
		NCCL_CHECK(ncclPutSignal(b->send, size, ncclInt8, peer, b->recv_win, 0, 0, 0, 0,
					 b->comm, b->stream));
	}
}

/* The same with ncclSend / ncclRecv on the plain buffers. */
static void sr_exchange(struct bufs *b, size_t size)
{
	int peer = 1 - g_rank;

	if (g_rank == 0) {
		NCCL_CHECK(ncclSend(b->ssend, size, ncclInt8, peer, b->comm, b->stream));
		NCCL_CHECK(ncclRecv(b->srecv, size, ncclInt8, peer, b->comm, b->stream));
	} else {
		NCCL_CHECK(ncclRecv(b->srecv, size, ncclInt8, peer, b->comm, b->stream));
		NCCL_CHECK(ncclSend(b->ssend, size, ncclInt8, peer, b->comm, b->stream));
	}
}

/* Seconds per exchange over ITERS after WARMUP, timed on rank 0. */
static double time_loop(struct bufs *b, size_t size, const struct opts *o, int one_sided)
{
	double t0 = 0, t = 0;

	for (int i = 0; i < o->warmup + o->iters; i++) {
		if (i == o->warmup) {
			CUDA_CHECK(cudaStreamSynchronize(b->stream));
			MPI_Barrier(MPI_COMM_WORLD);
			t0 = MPI_Wtime();
		}
		if (g_rank < 2) {
			if (one_sided)
				put_exchange(b, size);
			else
				sr_exchange(b, size);
		}
	}
	CUDA_CHECK(cudaStreamSynchronize(b->stream));
	t = MPI_Wtime() - t0;
	MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
	return t / o->iters;
}

/* Ping-pong of one size: timed loops then check rounds; wrong bytes. */
static size_t pingpong(struct bufs *b, size_t size, const struct opts *o, double *put_s,
		       double *sr_s)
{
	int peer = 1 - g_rank;
	size_t bad = 0;

	if (g_rank < 2)
		fill(b, b->ssend, size, g_rank, 0);
	*sr_s = time_loop(b, size, o, 0);
	if (g_rank < 2)
		bad += check(b, b->srecv, size, peer, 0, "send/recv ping-pong (timed)");
	*put_s = 0;
	if (!b->rma)
		return bad;
	if (g_rank < 2)
		fill(b, b->send, size, g_rank, 0);
	*put_s = time_loop(b, size, o, 1);
	if (g_rank < 2)
		bad += check(b, b->recv, size, peer, 0, "putSignal ping-pong (timed)");
	for (int v = 1; v <= NCHECK_ROUNDS; v++) {
		if (g_rank < 2) {
			fill(b, b->send, size, g_rank, v);
			CUDA_CHECK(cudaMemset(b->recv, 0, size));
		}
		MPI_Barrier(MPI_COMM_WORLD);
		if (g_rank < 2) {
			put_exchange(b, size);
			CUDA_CHECK(cudaStreamSynchronize(b->stream));
			bad += check(b, b->recv, size, peer, v, "putSignal ping-pong");
		}
	}
	return bad;
}

/* One many-to-one round: ranks > 0 put to rank 0, which answers each. */
static void gather_round(struct bufs *b, size_t size, ncclWaitSignalDesc_t *descs)
{
	if (g_rank == 0) {
		NCCL_CHECK(ncclWaitSignal(g_nranks - 1, descs, b->comm, b->stream));
		NCCL_CHECK(ncclGroupStart());
		for (int r = 1; r < g_nranks; r++)
			NCCL_CHECK(ncclSignal(r, 0, 0, 0, b->comm, b->stream));
		NCCL_CHECK(ncclGroupEnd());
	} else {
		NCCL_CHECK(ncclPutSignal(b->send, size, ncclInt8, 0, b->recv_win,
					 (size_t)g_rank * b->max, 0, 0, 0, b->comm, b->stream));
		NCCL_CHECK(ncclWaitSignal(1, descs, b->comm, b->stream));
	}
}

/* Many-to-one of one size; seconds per round in *s; wrong bytes. */
static size_t many_to_one(struct bufs *b, size_t size, const struct opts *o, double *s)
{
	ncclWaitSignalDesc_t descs[g_nranks];
	size_t bad = 0;
	double t0 = 0;

	/* rank 0 waits for every other rank, the others for rank 0's answer */
	for (int r = 0; r < g_nranks; r++)
		descs[r] = (ncclWaitSignalDesc_t){ .opCnt = 1, .peer = g_rank == 0 ? r + 1 : 0,
						   .sigIdx = 0, .ctx = 0 };
	for (int v = 0; v <= NCHECK_ROUNDS; v++) {
		if (g_rank == 0)
			CUDA_CHECK(cudaMemset(b->recv, 0, b->max * (size_t)g_nranks));
		else
			fill(b, b->send, size, g_rank, 10 + v);
		MPI_Barrier(MPI_COMM_WORLD);
		if (v == 0) { /* the timed rounds, then their data is checked */
			for (int i = 0; i < o->warmup + o->iters; i++) {
				if (i == o->warmup) {
					CUDA_CHECK(cudaStreamSynchronize(b->stream));
					MPI_Barrier(MPI_COMM_WORLD);
					t0 = MPI_Wtime();
				}
				gather_round(b, size, descs);
			}
		} else {
			gather_round(b, size, descs);
		}
		CUDA_CHECK(cudaStreamSynchronize(b->stream));
		if (v == 0) {
			*s = (MPI_Wtime() - t0) / o->iters;
			MPI_Bcast(s, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
		}
		for (int r = 1; g_rank == 0 && r < g_nranks; r++)
			bad += check(b, b->recv + (size_t)r * b->max, size, r, 10 + v,
				     "many-to-one");
	}
	return bad;
}

static double gbps(size_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / 1e9 : 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct bufs b = { 0 };
	double put_s, sr_s, m_s = 0, put_small = 0, sr_small = 0, put_big = 0, sr_big = 0;
	size_t bad = 0, total_bad = 0, last = 0;
	int status = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
	MPI_Comm_size(MPI_COMM_WORLD, &g_nranks);
	parse_opts(argc, argv, &o);
	if (g_nranks < 2) {
		fprintf(stderr, "rma-pingpong needs at least 2 ranks\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	CUDA_CHECK(cudaSetDevice(pick_gpu()));
	setup(&b, &o);
	if (g_rank == 0 && !b.rma)
		printf("# host RMA is not supported in this communicator: one-sided parts "
		       "skipped, send/recv only\n");
	if (g_rank == 0)
		printf("# ping-pong 0<->1, time = half round trip; many-to-one: %d ranks -> 0, "
		       "time per round, GB/s = bytes into rank 0 per round\n"
		       "#%11s %11s %9s %11s %9s %8s %8s %11s %9s %6s\n", g_nranks, "size",
		       "put us", "put GB/s", "sr us", "sr GB/s", "put/sr t", "bw ratio",
		       "m2one us", "m2one GB/s", "wrong");
	for (size_t size = o.min; size <= o.max; size = (size_t)(size * o.factor)) {
		bad = pingpong(&b, size, &o, &put_s, &sr_s);
		if (b.rma)
			bad += many_to_one(&b, size, &o, &m_s);
		MPI_Allreduce(&bad, &total_bad, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
		if (total_bad)
			status = 1;
		if (size == o.min) {
			put_small = put_s;
			sr_small = sr_s;
		}
		put_big = put_s;
		sr_big = sr_s;
		last = size;
		if (g_rank == 0)
			printf("%12zu %11.2f %9.3f %11.2f %9.3f %8.2f %8.2f %11.2f %9.3f %6zu\n",
			       size, put_s / 2 * 1e6, gbps(size, put_s / 2), sr_s / 2 * 1e6,
			       gbps(size, sr_s / 2), sr_s > 0 ? put_s / sr_s : 0,
			       put_s > 0 ? sr_s / put_s : 0, m_s * 1e6,
			       gbps(size * (size_t)(g_nranks - 1), m_s), total_bad);
		fflush(stdout);
	}
	if (g_rank == 0 && b.rma) {
		double bw = put_big > 0 ? sr_big / put_big : 0, lat = sr_small > 0 ? put_small / sr_small : 0;
		int bw_ok = bw >= 0.8, lat_ok = lat <= 1.5;

		printf("# target bandwidth at %zu B: putSignal %.3f GB/s = %.2f x send/recv %.3f "
		       "GB/s (need >= 0.80): %s\n", last, gbps(last, put_big / 2), bw,
		       gbps(last, sr_big / 2), bw_ok ? "met" : "MISSED");
		printf("# target latency at %zu B: putSignal round trip %.2f us = %.2f x "
		       "send/recv %.2f us (need <= 1.50): %s\n", o.min, put_small * 1e6, lat,
		       sr_small * 1e6, lat_ok ? "met" : "MISSED");
		if (o.need_targets && !(bw_ok && lat_ok))
			status = 1;
	}
	if (!b.rma && o.need_rma)
		status = 1;
	if (g_rank == 0)
		printf("# rma-pingpong: %s\n", status ? "FAILED" : "OK (every byte right)");
	teardown(&b);
	MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
	MPI_Finalize();
	return status;
}
