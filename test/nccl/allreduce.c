/*
 * nccl-allreduce: a small all-reduce driver against nccl.h and MPI.
 *
 * Every rank fills its buffer with small integers (exact in float), runs
 * ncclAllReduce(sum) over a size sweep, checks every element of the result
 * against the closed-form sum, and prints time, algorithm bandwidth and
 * bus bandwidth per size as nccl-tests does: busbw = algbw * 2(n-1)/n; then
 * the CPU seconds per GB that crossed the network (all ranks' threads but
 * the one calling NCCL, which waits for the GPU: NCCL's proxy threads, the
 * net plugin's, CUDA's; /proc/self/task, 10 ms ticks, so only sizes whose
 * timed calls run for seconds say much), the network bytes being
 * 2(n-1) x size per call over all ranks.
 *
 *   mpirun -np N [wrapper] nccl-allreduce [-b MIN] [-e MAX] [-f FACTOR]
 *                                         [-w WARMUP] [-n ITERS] [-s SLICES]
 * -s SLICES: time the ITERS calls in SLICES equal slices and report the
 * median slice's time per call instead of the mean over all of them, so
 * that one stall of the host (a descheduled rank) moves one slice only.
 * The GPU is $RAIL_TEST_GPU if set, else the local rank
 * ($OMPI_COMM_WORLD_LOCAL_RANK) modulo the number of GPUs.
 * Exits non-zero if any element is wrong or any call fails.
 */
#include <cuda_runtime.h>
#include <dirent.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "prog.h"

/* Value of element i on rank r: small integers, exact in float. */
static float value_of(int r, size_t i)
{
	return (float)(r + 1 + (int)(i % 7));
}

static long check_result(const float *host, size_t count, int nranks)
{
	long wrong = 0;

	for (size_t i = 0; i < count; i++) {
		float expect = (float)(nranks * (nranks + 1) / 2 + nranks * (int)(i % 7));

		if (host[i] != expect)
			wrong++;
	}
	return wrong;
}

/* CPU seconds of this process's threads other than the caller (utime + stime). */
static double cpu_other_threads(void)
{
	long self = syscall(SYS_gettid), ticks = 0;
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char path[300], buf[1024], *p;
		unsigned long ut = 0, st = 0;
		FILE *f;

		if (e->d_name[0] == '.' || atol(e->d_name) == self)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		/* after "(comm)": state is field 3; utime, stime are 14 and 15 */
		if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) &&
		    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
			ticks += (long)(ut + st);
		fclose(f);
	}
	closedir(d);
	return (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

struct sweep {
	size_t min, max;
	int factor, warmup, iters, slices;
};

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

/* The timed calls, in slices: the mean ms per call, or the median slice's; *calls made. */
static double timed_calls(ncclComm_t comm, cudaStream_t stream, float *dsend, float *drecv,
			  size_t count, int iters, int slices, int *calls)
{
	cudaEvent_t ev[65];
	float ms[64], total = 0;
	int per;

	slices = slices < 1 ? 1 : slices > 64 ? 64 : slices > iters ? iters : slices;
	per = iters / slices;
	*calls = per * slices;
	for (int k = 0; k <= slices; k++)
		CUDA_CHECK(cudaEventCreate(&ev[k]));
	CUDA_CHECK(cudaEventRecord(ev[0], stream));
	for (int k = 0; k < slices; k++) {
		for (int i = 0; i < per; i++)
			NCCL_CHECK(ncclAllReduce(dsend, drecv, count, ncclFloat, ncclSum, comm,
						 stream));
		CUDA_CHECK(cudaEventRecord(ev[k + 1], stream));
	}
	CUDA_CHECK(cudaEventSynchronize(ev[slices]));
	for (int k = 0; k < slices; k++) {
		CUDA_CHECK(cudaEventElapsedTime(&ms[k], ev[k], ev[k + 1]));
		total += ms[k];
	}
	for (int k = 0; k <= slices; k++)
		CUDA_CHECK(cudaEventDestroy(ev[k]));
	if (slices == 1)
		return (double)total / per;
	qsort(ms, (size_t)slices, sizeof(ms[0]), cmp_float);
	return (double)ms[slices / 2] / per;
}

static long run_size(ncclComm_t comm, cudaStream_t stream, float *dsend, float *drecv,
		     float *host, size_t bytes, int nranks, const struct sweep *sw)
{
	size_t count = bytes / sizeof(float);
	int iters = bytes >= (64u << 20) ? (sw->iters + 3) / 4 : sw->iters;
	double ms_per_call;
	long wrong, all_wrong = 0;
	double cpu, all_cpu = 0;

	for (size_t i = 0; i < count; i++)
		host[i] = value_of(g_rank, i);
	CUDA_CHECK(cudaMemcpy(dsend, host, bytes, cudaMemcpyHostToDevice));
	CUDA_CHECK(cudaMemset(drecv, 0xff, bytes)); /* NaN poison: unwritten elements fail */
	for (int i = 0; i < sw->warmup; i++)
		NCCL_CHECK(ncclAllReduce(dsend, drecv, count, ncclFloat, ncclSum, comm, stream));
	CUDA_CHECK(cudaStreamSynchronize(stream));
	CUDA_CHECK(cudaMemcpy(host, drecv, bytes, cudaMemcpyDeviceToHost));
	wrong = check_result(host, count, nranks);
	MPI_Barrier(MPI_COMM_WORLD);
	cpu = cpu_other_threads();
	ms_per_call = timed_calls(comm, stream, dsend, drecv, count, iters, sw->slices, &iters);
	cpu = cpu_other_threads() - cpu;
	MPI_Allreduce(&cpu, &all_cpu, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	CUDA_CHECK(cudaMemcpy(host, drecv, bytes, cudaMemcpyDeviceToHost));
	wrong += check_result(host, count, nranks);
	MPI_Allreduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (g_rank == 0) {
		double us = ms_per_call * 1e3;
		double algbw = (double)bytes / us / 1e3;
		double busbw = algbw * 2.0 * (nranks - 1) / nranks;
		double net_gb = 2.0 * (nranks - 1) * (double)bytes * iters / 1e9;

		printf("%12zu %12zu %6s %6s %10.1f %8.2f %8.2f %8ld %9.2f\n", bytes, count, "float",
		       "sum", us, algbw, busbw, all_wrong, all_cpu / net_gb);
		fflush(stdout);
	}
	return all_wrong;
}

int main(int argc, char **argv)
{
	struct sweep sw = { 8, 512u << 20, 2, 5, 20, 1 };
	int nranks, opt, ver, gpu;
	ncclUniqueId id;
	ncclComm_t comm;
	cudaStream_t stream;
	float *dsend, *drecv, *host;
	long wrong = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	while ((opt = getopt(argc, argv, "b:e:f:w:n:s:")) != -1) {
		switch (opt) {
		case 'b': sw.min = parse_size(optarg); break;
		case 'e': sw.max = parse_size(optarg); break;
		case 'f': sw.factor = atoi(optarg); break;
		case 'w': sw.warmup = atoi(optarg); break;
		case 'n': sw.iters = atoi(optarg); break;
		case 's': sw.slices = atoi(optarg); break;
		default: MPI_Abort(MPI_COMM_WORLD, 2);
		}
	}
	gpu = pick_gpu();
	CUDA_CHECK(cudaSetDevice(gpu));
	if (g_rank == 0)
		NCCL_CHECK(ncclGetUniqueId(&id));
	MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
	NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, g_rank));
	CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	CUDA_CHECK(cudaMalloc((void **)&dsend, sw.max));
	CUDA_CHECK(cudaMalloc((void **)&drecv, sw.max));
	CUDA_CHECK(cudaMallocHost((void **)&host, sw.max));
	ncclGetVersion(&ver);
	if (g_rank == 0)
		printf("# nccl-allreduce: NCCL %d, %d ranks, warmup %d, iters %d\n"
		       "# %10s %12s %6s %6s %10s %8s %8s %8s %9s\n", ver, nranks, sw.warmup, sw.iters,
		       "size(B)", "count", "type", "redop", "time(us)", "algbw", "busbw", "#wrong",
		       "cpu_s/GB");
	for (size_t bytes = sw.min; bytes <= sw.max; bytes *= (size_t)sw.factor)
		wrong += run_size(comm, stream, dsend, drecv, host, bytes, nranks, &sw);
	if (g_rank == 0)
		printf("# %s: %ld wrong elements\n", wrong ? "FAILED" : "OK", wrong);
	NCCL_CHECK(ncclCommDestroy(comm));
	CUDA_CHECK(cudaFree(dsend));
	CUDA_CHECK(cudaFree(drecv));
	CUDA_CHECK(cudaFreeHost(host));
	MPI_Finalize();
	return wrong ? 1 : 0;
}
