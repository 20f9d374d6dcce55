/*
 * nccl-net-rail tests: a fake CUDA driver (libfakecuda.so) serving the
 * entries of src/cuda.h over host memory, so that the RMA backend's GPU
 * path runs without a GPU (NCCL_RAIL_CUDA_LIB names it).
 *
 * Device memory is a memfd mapped twice: the addresses handed out
 * (fcu_test_alloc_device) are mapped PROT_NONE, so that any dereference of
 * a device address by the plugin faults, as it would on a real GPU; the
 * second mapping is the fake's own view, through which its streams copy
 * and the tests read and write (fcu_test_host). cuPointerGetAttribute says
 * DEVICE for the first, HOST for cuMemHostAlloc memory, and refuses any
 * other pointer.
 *
 * Streams are real: each has a worker thread that runs its operations in
 * the order they were queued, after the call returned; each copy first
 * sleeps FAKECUDA_COPY_DELAY_US (or fcu_test_set_delay_us), so that a
 * write the plugin does not order behind a copy shows up before it.
 * fcu_test_hold stops every stream before its next operation, as a GPU
 * busy with other work does. fcu_test_sms_busy stops copies within device
 * memory only: CUDA runs those on the SMs, which kernels that spin (the
 * device API's, waiting for signals) can hold; copy engines still run.
 * fcu_test_refuse_host_alloc makes cuMemHostAlloc of one size fail.
 * cuStreamWriteValue64 writes device memory, or pinned host memory
 * allocated with CU_MEMHOSTALLOC_DEVICEMAP (not with
 * FAKECUDA_NO_HOST_WRITE set).
 *
 * cuModuleGetLoadingMode says LAZY (CUDA's default), or EAGER with
 * FAKECUDA_LOADING=eager.
 *
 * As real CUDA, every call but cuCtxGetCurrent, cuCtxSetCurrent,
 * cuModuleGetLoadingMode and cuGetErrorString is refused with
 * CUDA_ERROR_INVALID_CONTEXT on a thread with no current context (counted:
 * fcu_test_refused).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* The entries, with the CUDA driver's names and (opaque-handle) signatures. */
EXPORT int cuCtxGetCurrent(void **ctx);
EXPORT int cuCtxSetCurrent(void *ctx);
EXPORT int cuPointerGetAttribute(void *data, int attr, uint64_t ptr);
EXPORT int cuMemHostAlloc(void **pp, size_t n, unsigned flags);
EXPORT int cuMemFreeHost(void *p);
EXPORT int cuStreamCreate(void **hs, unsigned flags);
EXPORT int cuStreamSynchronize(void *hs);
EXPORT int cuStreamDestroy_v2(void *hs);
EXPORT int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *hs);
EXPORT int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *hs);
EXPORT int cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, void *hs);
EXPORT int cuStreamWriteValue64_v2(void *hs, uint64_t addr, uint64_t value, unsigned flags);
EXPORT int cuGetErrorString(int e, const char **str);
EXPORT int cuModuleGetLoadingMode(int *mode);
EXPORT int cuEventCreate(void **he, unsigned flags);
EXPORT int cuEventRecord(void *he, void *hs);
EXPORT int cuEventQuery(void *he);
EXPORT int cuEventDestroy_v2(void *he);
/* The tests' hooks (fakecuda.h). */
EXPORT void *fcu_test_alloc_device(size_t size);
EXPORT void *fcu_test_host(const void *dptr);
EXPORT void fcu_test_make_current(void);
EXPORT void fcu_test_set_delay_us(unsigned us);
EXPORT void fcu_test_hold(int on);
EXPORT void fcu_test_sms_busy(int on);
EXPORT void fcu_test_refuse_host_alloc(size_t n);
EXPORT unsigned long fcu_test_calls(const char *name);
EXPORT unsigned long fcu_test_refused(void);
EXPORT int fcu_test_dmabuf(const void *dptr, uint64_t *offset);

enum { OK = 0, E_INVALID_VALUE = 1, E_OUT_OF_MEMORY = 2, E_INVALID_CONTEXT = 201,
       E_INVALID_HANDLE = 400, E_NOT_READY = 600, E_ILLEGAL_ADDRESS = 700 };

#define DEV_CAP (4ull << 30)	/* address space of the fake device (sparse) */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *dev_base, *dev_view;
static int dev_fd = -1;	/* the device's memory: what DMA-BUF fds share */
static size_t dev_used;
static char ctx_obj;		/* the one context */
static __thread void *cur_ctx;
static unsigned delay_us;
static int hold;	/* fcu_test_hold: the streams start no operation */
static int sms_busy;	/* fcu_test_sms_busy: no copy within device memory starts */
static size_t refuse_halloc;	/* fcu_test_refuse_host_alloc: this size is out of memory */
static int delay_set;
static unsigned long refused;

/* ---- call counters ---- */

static const char *const names[] = {
	"cuCtxGetCurrent", "cuCtxSetCurrent", "cuPointerGetAttribute", "cuMemHostAlloc",
	"cuMemFreeHost", "cuStreamCreate", "cuStreamDestroy_v2", "cuStreamSynchronize",
	"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2",
	"cuStreamWriteValue64_v2", "cuGetErrorString", "cuModuleGetLoadingMode",
	"cuEventCreate", "cuEventRecord", "cuEventQuery", "cuEventDestroy_v2",
};
enum { C_GET, C_SET, C_ATTR, C_HALLOC, C_HFREE, C_SCREATE, C_SDESTROY, C_SSYNC, C_HTOD,
       C_DTOH, C_DTOD, C_WRITE64, C_ERRSTR, C_LOADING, C_ECREATE, C_ERECORD, C_EQUERY,
       C_EDESTROY, C_N };
static unsigned long counts[C_N];

static void count(int c)
{
	__atomic_fetch_add(&counts[c], 1, __ATOMIC_RELAXED);
}

/* A call that needs a context: 0, or the refusal. */
static int need_ctx(int c)
{
	count(c);
	if (cur_ctx)
		return OK;
	__atomic_fetch_add(&refused, 1, __ATOMIC_RELAXED);
	return E_INVALID_CONTEXT;
}

/* ---- memory ---- */

static int dev_init_locked(void)
{
	char *base;
	int fd;

	if (dev_base)
		return 0;
	fd = memfd_create("fakecuda-device", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)DEV_CAP))
		return -1;
	base = mmap(NULL, DEV_CAP, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	dev_view = mmap(NULL, DEV_CAP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (base == MAP_FAILED || dev_view == MAP_FAILED) {
		close(fd);
		return -1;
	}
	dev_fd = fd;
	__atomic_store_n(&dev_base, base, __ATOMIC_RELEASE);	/* read without the lock */
	return 0;
}

/* The view of [p, p + n) of device memory, or NULL if it is not all device memory. */
static char *dev_at(uint64_t p, size_t n)
{
	char *base = __atomic_load_n(&dev_base, __ATOMIC_ACQUIRE);
	size_t used = __atomic_load_n(&dev_used, __ATOMIC_ACQUIRE);
	uint64_t b = (uintptr_t)base;

	if (!base || p < b || p - b > used || n > used - (p - b))
		return NULL;
	return dev_view + (p - b);
}

static int is_dev(const void *p)
{
	const char *base = __atomic_load_n(&dev_base, __ATOMIC_ACQUIRE);

	return base && (const char *)p >= base && (const char *)p < base + DEV_CAP;
}

struct pinned {
	void *p;
	size_t n;
	unsigned flags;
	struct pinned *next;
};
static struct pinned *pinned;

/* [p, p + n) inside one allocation of cuMemHostAlloc mapped for the device (DEVICEMAP). */
static int is_mapped(uint64_t p, size_t n)
{
	int yes = 0;

	pthread_mutex_lock(&lock);
	for (struct pinned *q = pinned; q && !yes; q = q->next)
		yes = (q->flags & 0x2) && p >= (uintptr_t)q->p && n <= q->n &&
		      p - (uintptr_t)q->p <= q->n - n;
	pthread_mutex_unlock(&lock);
	return yes;
}

static int is_pinned(const void *p)
{
	int yes = 0;

	pthread_mutex_lock(&lock);
	for (struct pinned *q = pinned; q && !yes; q = q->next)
		yes = (const char *)p >= (char *)q->p && (const char *)p < (char *)q->p + q->n;
	pthread_mutex_unlock(&lock);
	return yes;
}

/* ---- streams ---- */

enum op_kind { OP_COPY = 1, OP_WRITE64 = 2, OP_COPY_SM = 3 };

struct op {
	int kind;
	char *dst;
	const char *src;
	size_t n;
	uint64_t value;
	struct op *next;
};

struct stream {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct op *head, *tail;
	unsigned long queued, done;
	int stop;
};

static unsigned copy_delay(void)
{
	if (!__atomic_load_n(&delay_set, __ATOMIC_ACQUIRE)) {
		const char *e = getenv("FAKECUDA_COPY_DELAY_US");

		__atomic_store_n(&delay_us, e ? (unsigned)atoi(e) : 0, __ATOMIC_RELAXED);
		__atomic_store_n(&delay_set, 1, __ATOMIC_RELEASE);
	}
	return __atomic_load_n(&delay_us, __ATOMIC_RELAXED);
}

static void run_op(const struct op *o)
{
	if (o->kind != OP_WRITE64) {
		unsigned d = copy_delay();

		if (d)
			usleep(d);
		memmove(o->dst, o->src, o->n);
	} else {
		__atomic_store_n((uint64_t *)(void *)o->dst, o->value, __ATOMIC_RELEASE);
	}
}

static void *stream_main(void *arg)
{
	struct stream *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct op *o;

		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		if (!s->head)
			break;
		o = s->head;
		pthread_mutex_unlock(&s->mu);
		while (__atomic_load_n(&hold, __ATOMIC_ACQUIRE) ||
		       (o->kind == OP_COPY_SM && __atomic_load_n(&sms_busy, __ATOMIC_ACQUIRE)))
			usleep(1000);
		run_op(o);
		pthread_mutex_lock(&s->mu);
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		s->done++;
		free(o);
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static int enqueue(void *hs, int kind, char *dst, const char *src, size_t n, uint64_t value)
{
	struct stream *s = hs;
	struct op *o;

	if (!s)
		return E_INVALID_HANDLE;	/* the legacy default stream: the plugin must not use it */
	o = calloc(1, sizeof(*o));
	if (!o)
		return E_OUT_OF_MEMORY;
	*o = (struct op){ .kind = kind, .dst = dst, .src = src, .n = n, .value = value };
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	s->queued++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return OK;
}

/* ---- the driver entries ---- */

EXPORT int cuCtxGetCurrent(void **ctx)
{
	count(C_GET);
	if (!ctx)
		return E_INVALID_VALUE;
	*ctx = cur_ctx;
	return OK;
}

EXPORT int cuCtxSetCurrent(void *ctx)
{
	count(C_SET);
	if (ctx && ctx != &ctx_obj)
		return E_INVALID_CONTEXT;
	cur_ctx = ctx;
	return OK;
}

EXPORT int cuPointerGetAttribute(void *data, int attr, uint64_t ptr)
{
	int r = need_ctx(C_ATTR);

	if (r)
		return r;
	if (attr != 2 || !data)
		return E_INVALID_VALUE;
	if (is_dev((void *)(uintptr_t)ptr))
		*(unsigned *)data = 2;
	else if (is_pinned((void *)(uintptr_t)ptr))
		*(unsigned *)data = 1;
	else
		return E_INVALID_VALUE;
	return OK;
}

EXPORT int cuMemHostAlloc(void **pp, size_t n, unsigned flags)
{
	struct pinned *q;
	int r = need_ctx(C_HALLOC);

	if (r)
		return r;
	if (n && n == __atomic_load_n(&refuse_halloc, __ATOMIC_ACQUIRE))
		return E_OUT_OF_MEMORY;
	q = calloc(1, sizeof(*q));
	if (!q || posix_memalign(&q->p, 4096, n ? n : 1)) {
		free(q);
		return E_OUT_OF_MEMORY;
	}
	q->n = n;
	q->flags = flags;
	pthread_mutex_lock(&lock);
	q->next = pinned;
	pinned = q;
	pthread_mutex_unlock(&lock);
	*pp = q->p;
	return OK;
}

EXPORT int cuMemFreeHost(void *p)
{
	struct pinned **q, *f = NULL;
	int r = need_ctx(C_HFREE);

	if (r)
		return r;
	pthread_mutex_lock(&lock);
	for (q = &pinned; *q; q = &(*q)->next) {
		if ((*q)->p == p) {
			f = *q;
			*q = f->next;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	if (!f)
		return E_INVALID_VALUE;
	free(f->p);
	free(f);
	return OK;
}

EXPORT int cuStreamCreate(void **hs, unsigned flags)
{
	struct stream *s;
	int r = need_ctx(C_SCREATE);

	if (r)
		return r;
	if (!hs || flags != 1)	/* the plugin asks for CU_STREAM_NON_BLOCKING */
		return E_INVALID_VALUE;
	s = calloc(1, sizeof(*s));
	if (!s)
		return E_OUT_OF_MEMORY;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->th, NULL, stream_main, s)) {
		free(s);
		return E_OUT_OF_MEMORY;
	}
	*hs = s;
	return OK;
}

EXPORT int cuStreamSynchronize(void *hs)
{
	struct stream *s = hs;
	unsigned long upto;
	int r = need_ctx(C_SSYNC);

	if (r)
		return r;
	if (!s)
		return E_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	upto = s->queued;
	while (s->done < upto)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	return OK;
}

/* An event: the operations its stream had queued when it was recorded. */
struct event {
	struct stream *s;	/* NULL: never recorded (done) */
	unsigned long mark;
};

EXPORT int cuEventCreate(void **he, unsigned flags)
{
	int r = need_ctx(C_ECREATE);

	(void)flags;
	if (r)
		return r;
	*he = calloc(1, sizeof(struct event));
	return *he ? OK : E_OUT_OF_MEMORY;
}

EXPORT int cuEventRecord(void *he, void *hs)
{
	struct event *e = he;
	struct stream *s = hs;
	int r = need_ctx(C_ERECORD);

	if (r)
		return r;
	if (!e || !s)
		return E_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	e->mark = s->queued;
	pthread_mutex_unlock(&s->mu);
	__atomic_store_n(&e->s, s, __ATOMIC_RELEASE);
	return OK;
}

EXPORT int cuEventQuery(void *he)
{
	struct event *e = he;
	struct stream *s;
	int r = need_ctx(C_EQUERY), done;

	if (r)
		return r;
	if (!e)
		return E_INVALID_HANDLE;
	s = __atomic_load_n(&e->s, __ATOMIC_ACQUIRE);
	if (!s)
		return OK;
	pthread_mutex_lock(&s->mu);
	done = s->done >= e->mark;
	pthread_mutex_unlock(&s->mu);
	return done ? OK : E_NOT_READY;
}

EXPORT int cuEventDestroy_v2(void *he)
{
	int r = need_ctx(C_EDESTROY);

	if (r)
		return r;
	free(he);
	return OK;
}

EXPORT int cuStreamDestroy_v2(void *hs)
{
	struct stream *s = hs;
	int r = need_ctx(C_SDESTROY);

	if (r)
		return r;
	if (!s)
		return E_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);	/* it ran what was queued first */
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
	return OK;
}

EXPORT int cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *hs)
{
	char *d = dev_at(dst, n);
	int r = need_ctx(C_HTOD);

	if (r)
		return r;
	if (!d || !src || is_dev(src))
		return E_INVALID_VALUE;
	return enqueue(hs, OP_COPY, d, src, n, 0);
}

EXPORT int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *hs)
{
	const char *s = dev_at(src, n);
	int r = need_ctx(C_DTOH);

	if (r)
		return r;
	if (!s || !dst || is_dev(dst))
		return E_INVALID_VALUE;
	return enqueue(hs, OP_COPY, dst, s, n, 0);
}

EXPORT int cuMemcpyDtoDAsync_v2(uint64_t dst, uint64_t src, size_t n, void *hs)
{
	char *d = dev_at(dst, n);
	const char *s = dev_at(src, n);
	int r = need_ctx(C_DTOD);

	if (r)
		return r;
	if (!d || !s)
		return E_INVALID_VALUE;
	return enqueue(hs, OP_COPY_SM, d, s, n, 0);
}

EXPORT int cuStreamWriteValue64_v2(void *hs, uint64_t addr, uint64_t value, unsigned flags)
{
	char *d = dev_at(addr, 8);
	int r = need_ctx(C_WRITE64);

	if (!d && is_mapped(addr, 8) && !getenv("FAKECUDA_NO_HOST_WRITE"))
		d = (char *)(uintptr_t)addr;	/* pinned host memory mapped for the device */
	if (r)
		return r;
	if (!d || addr % 8 || flags)
		return E_INVALID_VALUE;
	return enqueue(hs, OP_WRITE64, d, NULL, 8, value);
}

EXPORT int cuGetErrorString(int e, const char **str)
{
	count(C_ERRSTR);
	if (!str)
		return E_INVALID_VALUE;
	*str = e == OK ? "no error" : e == E_INVALID_VALUE ? "invalid argument"
	       : e == E_OUT_OF_MEMORY ? "out of memory"
	       : e == E_INVALID_CONTEXT ? "invalid device context"
	       : e == E_INVALID_HANDLE ? "invalid resource handle"
	       : e == E_ILLEGAL_ADDRESS ? "an illegal memory access was encountered" : NULL;
	return *str ? OK : E_INVALID_VALUE;
}

EXPORT int cuModuleGetLoadingMode(int *mode)
{
	const char *e = getenv("FAKECUDA_LOADING");

	count(C_LOADING);
	if (!mode)
		return E_INVALID_VALUE;
	*mode = e && !strcmp(e, "eager") ? 1 : 2;	/* CU_MODULE_EAGER_LOADING, _LAZY_ */
	return OK;
}

/* ---- the tests' hooks (fakecuda.h) ---- */

EXPORT void *fcu_test_alloc_device(size_t size)
{
	void *p = NULL;
	size_t n = (size + 255) & ~(size_t)255;

	pthread_mutex_lock(&lock);
	if (!dev_init_locked() && n <= DEV_CAP - dev_used) {
		p = dev_base + dev_used;
		memset(dev_view + dev_used, 0, n);
		__atomic_store_n(&dev_used, dev_used + n, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
	return p;
}

EXPORT void *fcu_test_host(const void *dptr)
{
	return is_dev(dptr) ? dev_view + ((const char *)dptr - dev_base) : NULL;
}

EXPORT void fcu_test_make_current(void)
{
	cur_ctx = &ctx_obj;
}

EXPORT void fcu_test_hold(int on)
{
	__atomic_store_n(&hold, on, __ATOMIC_RELEASE);
}

EXPORT void fcu_test_sms_busy(int on)
{
	__atomic_store_n(&sms_busy, on, __ATOMIC_RELEASE);
}

EXPORT void fcu_test_refuse_host_alloc(size_t n)
{
	__atomic_store_n(&refuse_halloc, n, __ATOMIC_RELEASE);
}

EXPORT void fcu_test_set_delay_us(unsigned us)
{
	__atomic_store_n(&delay_us, us, __ATOMIC_RELAXED);
	__atomic_store_n(&delay_set, 1, __ATOMIC_RELEASE);
}

EXPORT unsigned long fcu_test_calls(const char *name)
{
	for (int i = 0; i < C_N; i++) {
		if (!strcmp(names[i], name))
			return __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
	}
	return 0;
}

EXPORT unsigned long fcu_test_refused(void)
{
	return __atomic_load_n(&refused, __ATOMIC_RELAXED);
}

EXPORT int fcu_test_dmabuf(const void *dptr, uint64_t *offset)
{
	int fd;

	if (!is_dev(dptr) || !offset)
		return -1;
	pthread_mutex_lock(&lock);
	fd = dev_fd >= 0 ? fcntl(dev_fd, F_DUPFD_CLOEXEC, 0) : -1;
	pthread_mutex_unlock(&lock);
	*offset = (uint64_t)((const char *)dptr - dev_base);
	return fd;
}
