/* nccl-net-rail: the CUDA driver entries found at run time (cuda.h). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda.h"
#include "param.h"
#include "rail.h"

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rail_cuda cuda;
static const struct rail_cuda *cuda_ok;	/* set once every entry was found */
static rail_cu_ctx init_ctx;

struct cuda_sym {
	const char *name;
	size_t off;
};

#define SYM(field, name) { name, offsetof(struct rail_cuda, field) }
static const struct cuda_sym cuda_syms[] = {
	SYM(ctx_get_current, "cuCtxGetCurrent"),
	SYM(ctx_set_current, "cuCtxSetCurrent"),
	SYM(pointer_get_attribute, "cuPointerGetAttribute"),
	SYM(mem_host_alloc, "cuMemHostAlloc"),
	SYM(mem_free_host, "cuMemFreeHost"),
	SYM(stream_create, "cuStreamCreate"),
	SYM(stream_destroy, "cuStreamDestroy_v2"),
	SYM(stream_synchronize, "cuStreamSynchronize"),
	SYM(memcpy_htod_async, "cuMemcpyHtoDAsync_v2"),
	SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2"),
	SYM(stream_write_value64, "cuStreamWriteValue64_v2"),
	SYM(get_error_string, "cuGetErrorString"),
	SYM(event_create, "cuEventCreate"),
	SYM(event_record, "cuEventRecord"),
	SYM(event_query, "cuEventQuery"),
	SYM(event_destroy, "cuEventDestroy_v2"),
};

/* Open the library and fill cuda; 0, or -ENOENT with why. Holds cuda_lock. */
static int cuda_load(char *why, size_t why_len)
{
	const char *user = rail_param_str(RAIL_P_CUDA_LIB);
	const char *name = user && user[0] ? user : "libcuda.so.1";
	void *h = user && user[0] ? dlopen(name, RTLD_NOW | RTLD_LOCAL)
		  : dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);

	if (!h) {
		const char *e = dlerror();

		snprintf(why, why_len, user && user[0] ? "NCCL_RAIL_CUDA_LIB=%s cannot be loaded "
			 "(%s)" : "%s is not loaded in this process (%s)", name,
			 e ? e : "no CUDA driver");
		return -ENOENT;
	}
	for (size_t i = 0; i < sizeof(cuda_syms) / sizeof(cuda_syms[0]); i++) {
		void *f = dlsym(h, cuda_syms[i].name);

		if (!f) {
			snprintf(why, why_len, "%s has no %s (a CUDA driver older than 12?)", name,
				 cuda_syms[i].name);
			dlclose(h);
			return -ENOENT;
		}
		memcpy((char *)&cuda + cuda_syms[i].off, &f, sizeof(f));
	}
	/* optional entries: NULL where the driver has none */
	{
		void *f = dlsym(h, "cuModuleGetLoadingMode");

		memcpy(&cuda.module_get_loading_mode, &f, sizeof(f));
	}
	return 0;	/* the library stays loaded for the life of the process */
}

const struct rail_cuda *rail_cuda_get(char *why, size_t why_len)
{
	const struct rail_cuda *cu = __atomic_load_n(&cuda_ok, __ATOMIC_ACQUIRE);

	if (cu)
		return cu;
	pthread_mutex_lock(&cuda_lock);
	if (!cuda_ok && !cuda_load(why, why_len))
		__atomic_store_n(&cuda_ok, &cuda, __ATOMIC_RELEASE);
	cu = cuda_ok;
	pthread_mutex_unlock(&cuda_lock);
	return cu;
}

void rail_cuda_note_ctx(void)
{
	char why[256];
	const struct rail_cuda *cu = rail_cuda_get(why, sizeof(why));
	rail_cu_ctx ctx = NULL;

	if (cu && cu->ctx_get_current(&ctx) == RAIL_CU_SUCCESS && ctx)
		__atomic_store_n(&init_ctx, ctx, __ATOMIC_RELEASE);
}

rail_cu_ctx rail_cuda_ctx(const struct rail_cuda *cu)
{
	rail_cu_ctx ctx = NULL;

	if (cu->ctx_get_current(&ctx) == RAIL_CU_SUCCESS && ctx)
		return ctx;
	return __atomic_load_n(&init_ctx, __ATOMIC_ACQUIRE);
}

const char *rail_cuda_strerror(const struct rail_cuda *cu, rail_cu_result r, char *buf,
			       size_t len)
{
	const char *s = NULL;

	if (cu->get_error_string(r, &s) != RAIL_CU_SUCCESS || !s)
		s = "unknown CUDA error";
	snprintf(buf, len, "CUDA error %d: %s", r, s);
	return buf;
}
