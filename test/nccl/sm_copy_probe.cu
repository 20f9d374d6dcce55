/*
 * nccl-net-rail GPU probe: does a copy queued on one stream run while
 * kernels that spin (as the device API's do, waiting for signals) hold
 * every SM of the GPU? For each way of copying 1 MiB within the GPU it
 * fills the SMs with a kernel that spins on a flag, queues the copy and
 * then a write of the flag behind it on another non-blocking stream, and
 * reports whether the kernel was released within 3 s (then frees it
 * from the host either way). A grid of one block is the control.
 *   nvcc -O2 -o /tmp/sm_copy_probe test/nccl/sm_copy_probe.cu -lcuda && /tmp/sm_copy_probe
 * The RMA backend copies a rank's operations to itself through pinned
 * memory because of what this prints (docs/DEPLOY.md section 11).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define PROBE_BYTES (1u << 20)
#define PROBE_WAIT_S 3.0

__global__ void spin(volatile unsigned *flag)
{
	while (*flag == 0) {
	}
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                    \
	do {                                                                           \
		cudaError_t e_ = (call);                                               \
		if (e_ != cudaSuccess) {                                               \
			fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
			return 2;                                                      \
		}                                                                      \
	} while (0)

enum way { WAY_DTOD, WAY_PINNED, WAY_CONTROL };

static const char *way_name[] = { "cuMemcpyDtoDAsync", "DtoH + HtoD through pinned memory",
				  "cuMemcpyDtoDAsync, one spinning block (control)" };

/* One way: 1 if the kernel was released by the flag written behind the copy, 0 if not. */
static int probe(enum way w, int blocks, char *a, char *b, char *pinned, unsigned *flag,
		 unsigned *dflag, double *took)
{
	cudaStream_t k, s;
	double t0;
	int released = 0;

	CHECK(cudaStreamCreateWithFlags(&k, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	*(volatile unsigned *)flag = 0;
	spin<<<w == WAY_CONTROL ? 1 : blocks, 1024, 0, k>>>(dflag);
	CHECK(cudaGetLastError());
	usleep(200000);		/* the kernel is resident */
	if (w == WAY_PINNED) {
		CHECK(cudaMemcpyAsync(pinned, a, PROBE_BYTES, cudaMemcpyDeviceToHost, s));
		CHECK(cudaMemcpyAsync(b, pinned, PROBE_BYTES, cudaMemcpyHostToDevice, s));
	} else {
		CHECK(cudaMemcpyAsync(b, a, PROBE_BYTES, cudaMemcpyDeviceToDevice, s));
	}
	if (cuStreamWriteValue32((CUstream)s, (CUdeviceptr)dflag, 1, 0) != CUDA_SUCCESS) {
		fprintf(stderr, "cuStreamWriteValue32 failed\n");
		return 2;
	}
	t0 = now_s();
	while (now_s() - t0 < PROBE_WAIT_S && !released) {
		released = cudaStreamQuery(k) == cudaSuccess;
		usleep(100);
	}
	*took = now_s() - t0;
	*(volatile unsigned *)flag = 1;	/* free the kernel, then the copy */
	CHECK(cudaStreamSynchronize(k));
	CHECK(cudaStreamSynchronize(s));
	CHECK(cudaStreamDestroy(k));
	CHECK(cudaStreamDestroy(s));
	return released;
}

int main(void)
{
	int sms, per;
	char *a, *b, *pinned;
	unsigned *flag, *dflag;

	CHECK(cudaSetDevice(0));
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, spin, 1024, 0));
	CHECK(cudaMalloc((void **)&a, PROBE_BYTES));
	CHECK(cudaMalloc((void **)&b, PROBE_BYTES));
	CHECK(cudaHostAlloc((void **)&pinned, PROBE_BYTES, cudaHostAllocPortable));
	CHECK(cudaHostAlloc((void **)&flag, sizeof(*flag), cudaHostAllocMapped));
	CHECK(cudaHostGetDevicePointer((void **)&dflag, flag, 0));
	printf("spinning grid: %d blocks of 1024 threads (%d SMs x %d)\n", sms * per, sms, per);
	for (int w = WAY_DTOD; w <= WAY_CONTROL; w++) {
		double took = 0;
		int r = probe((enum way)w, sms * per, a, b, pinned, flag, dflag, &took);

		if (r > 1)
			return r;
		printf("%-48s %s after %.3f s\n", way_name[w], r ? "ran: kernel released" :
		       "DID NOT RUN", took);
	}
	return 0;
}
