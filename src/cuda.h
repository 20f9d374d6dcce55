/*
 * nccl-net-rail: the few CUDA driver entries one-sided RMA needs to read
 * and write GPU memory through host staging, found at run time.
 *
 * The plugin never links CUDA and the build needs no CUDA header: the
 * types and constants below are declared here with the values of the CUDA
 * driver API (cuda.h), and the entries are looked up with dlsym in the
 * driver library the process already loaded, libcuda.so.1 (RTLD_NOLOAD:
 * a process that does not use CUDA has no GPU memory to serve, and is not
 * made to load it). NCCL_RAIL_CUDA_LIB names another library to load
 * instead, and only that one is tried: the unit tests point it at their
 * fake driver (test/fakecuda/fakecuda.c), which serves the same entries
 * over host memory.
 *
 * The entries are those of the CUDA 12/13 ABI: the _v2 names where cuda.h
 * maps the API name to one (cuMemcpyHtoDAsync_v2, cuStreamWriteValue64_v2,
 * cuStreamDestroy_v2, cuEventDestroy_v2), never the per-thread-default-stream variants.
 * CUDA calls need a current context on the calling thread; NCCL's progress
 * threads have none, so every caller sets the context it captured on
 * NCCL's thread (rail_cuda_ctx) before its calls.
 */
#ifndef RAIL_CUDA_H
#define RAIL_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int rail_cu_result;		/* CUresult */
typedef struct rail_cu_ctx_s *rail_cu_ctx;	/* CUcontext */
typedef struct rail_cu_stream_s *rail_cu_stream;	/* CUstream */
typedef unsigned long long rail_cu_ptr;	/* CUdeviceptr */
typedef struct rail_cu_event_s *rail_cu_event;	/* CUevent */

#define RAIL_CU_SUCCESS 0			/* CUDA_SUCCESS */
#define RAIL_CU_NOT_READY 600			/* CUDA_ERROR_NOT_READY */
#define RAIL_CU_EVENT_DISABLE_TIMING 0x2	/* CU_EVENT_DISABLE_TIMING */
#define RAIL_CU_STREAM_NON_BLOCKING 0x1	/* CU_STREAM_NON_BLOCKING */
#define RAIL_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2	/* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
#define RAIL_CU_MEMORYTYPE_HOST 0x1		/* CU_MEMORYTYPE_HOST */
#define RAIL_CU_MEMORYTYPE_DEVICE 0x2		/* CU_MEMORYTYPE_DEVICE */
#define RAIL_CU_MEMHOSTALLOC_PORTABLE 0x1	/* CU_MEMHOSTALLOC_PORTABLE */
#define RAIL_CU_MEMHOSTALLOC_DEVICEMAP 0x2	/* CU_MEMHOSTALLOC_DEVICEMAP */
#define RAIL_CU_STREAM_WRITE_VALUE_DEFAULT 0x0	/* CU_STREAM_WRITE_VALUE_DEFAULT */
#define RAIL_CU_MODULE_LAZY_LOADING 0x2		/* CU_MODULE_LAZY_LOADING */

struct rail_cuda {
	rail_cu_result (*ctx_get_current)(rail_cu_ctx *ctx);
	rail_cu_result (*ctx_set_current)(rail_cu_ctx ctx);
	rail_cu_result (*pointer_get_attribute)(void *data, int attribute, rail_cu_ptr ptr);
	rail_cu_result (*mem_host_alloc)(void **p, size_t size, unsigned int flags);
	rail_cu_result (*mem_free_host)(void *p);
	rail_cu_result (*stream_create)(rail_cu_stream *s, unsigned int flags);
	rail_cu_result (*stream_destroy)(rail_cu_stream s);
	rail_cu_result (*stream_synchronize)(rail_cu_stream s);
	rail_cu_result (*memcpy_htod_async)(rail_cu_ptr dst, const void *src, size_t n,
					    rail_cu_stream s);
	rail_cu_result (*memcpy_dtoh_async)(void *dst, rail_cu_ptr src, size_t n, rail_cu_stream s);
	rail_cu_result (*stream_write_value64)(rail_cu_stream s, rail_cu_ptr addr, uint64_t value,
					       unsigned int flags);
	rail_cu_result (*get_error_string)(rail_cu_result r, const char **str);
	rail_cu_result (*event_create)(rail_cu_event *e, unsigned int flags);
	rail_cu_result (*event_record)(rail_cu_event e, rail_cu_stream s);
	rail_cu_result (*event_query)(rail_cu_event e);	/* RAIL_CU_NOT_READY: not yet */
	rail_cu_result (*event_destroy)(rail_cu_event e);
	/* optional (CUDA 11.7+; NULL where the driver has none) */
	rail_cu_result (*module_get_loading_mode)(int *mode);
};

/*
 * The driver's entries, loaded once per process (a failure is tried again
 * at the next call), or NULL with why saying what is missing.
 */
const struct rail_cuda *rail_cuda_get(char *why, size_t why_len);

/*
 * At RMA init, on NCCL's thread (its device is current): remember the
 * current context, if the driver is loaded and one is current.
 */
void rail_cuda_note_ctx(void);
/* The context current on this thread, else the one noted at init, else NULL. */
rail_cu_ctx rail_cuda_ctx(const struct rail_cuda *cu);

/* "CUDA_ERROR_INVALID_VALUE (1): invalid argument" into buf. */
const char *rail_cuda_strerror(const struct rail_cuda *cu, rail_cu_result r, char *buf,
			       size_t len);
#define RAIL_CUSTR(cu, r) rail_cuda_strerror((cu), (r), (char[128]){0}, 128)

#endif
