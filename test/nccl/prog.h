/*
 * What the MPI + NCCL test programs of test/nccl (allreduce.c,
 * rma_pingpong.c) share: failing a call names the rank and aborts the job,
 * sizes with K/M/G suffixes, and the GPU a rank takes. Include it once,
 * after cuda_runtime.h, mpi.h and nccl.h; it defines the program's g_rank.
 */
#ifndef RAIL_TEST_NCCL_PROG_H
#define RAIL_TEST_NCCL_PROG_H

#include <stdio.h>
#include <stdlib.h>

static int g_rank;

#define CUDA_CHECK(call)                                                           \
	do {                                                                       \
		cudaError_t e_ = (call);                                           \
		if (e_ != cudaSuccess) {                                           \
			fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call,  \
				cudaGetErrorString(e_));                           \
			MPI_Abort(MPI_COMM_WORLD, 1);                              \
		}                                                                  \
	} while (0)

#define NCCL_CHECK(call)                                                           \
	do {                                                                       \
		ncclResult_t r_ = (call);                                          \
		if (r_ != ncclSuccess) {                                           \
			fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call,  \
				ncclGetErrorString(r_));                           \
			MPI_Abort(MPI_COMM_WORLD, 1);                              \
		}                                                                  \
	} while (0)

/* "8", "512K", "1.5M", "2G": bytes (binary multiples). */
static inline size_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (*end == 'K' || *end == 'k')
		v *= 1024;
	else if (*end == 'M' || *end == 'm')
		v *= 1024 * 1024;
	else if (*end == 'G' || *end == 'g')
		v *= 1024.0 * 1024 * 1024;
	return (size_t)v;
}

/* $RAIL_TEST_GPU (test/nccl/wrapper.sh sets it), else the local rank modulo the GPUs. */
static inline int pick_gpu(void)
{
	const char *g = getenv("RAIL_TEST_GPU");
	const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
	int n = 0;

	if (g)
		return atoi(g);
	CUDA_CHECK(cudaGetDeviceCount(&n));
	return (local ? atoi(local) : g_rank) % (n > 0 ? n : 1);
}

#endif
