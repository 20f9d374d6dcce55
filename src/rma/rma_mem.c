/*
 * nccl-net-rail: how the TCP RMA backend reaches a window's bytes
 * (rma_tcp.h): host windows directly, GPU windows through the CUDA driver
 * (src/cuda.h) and pinned host staging, never by dereferencing a device
 * address.
 *
 * Every write into this rank's GPU windows, whoever makes it (the applier
 * for peers' puts, signals and this rank's get replies; NCCL's thread for
 * operations to itself), goes on the collComm's one non-blocking stream,
 * under its lock: a signal written with cuStreamWriteValue64 behind the
 * copies of the puts before it can never be seen before their bytes, and
 * two writers of one signal word write their values in the order they
 * computed them. A signal word of a window registered SIGNAL_NEVER_RESET
 * is only ever written here, so its value is kept in a host shadow;
 * another is read back (DtoH, after every write before it) and written
 * with the sum. A signal into a host window first waits for the GPU
 * copies still in flight, so that it too comes after their bytes.
 *
 * A staging ring takes the bytes one applier thread reads from its sockets
 * (the main applier's is g->ring, each lane's its own): a recv lands at the
 * ring's position, its HtoD copy is queued, and the ring starts over after
 * a stream synchronize once it is full, so that no byte is overwritten
 * while a copy may still read it. The thread's readers share its ring, so
 * a reader queues the copy of what it staged before the thread turns to
 * another (rma_apply.c body_recv). Only the ring's own thread moves its
 * position: a synchronize by another thread does not, since the owner may
 * hold room it has not yet filled.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "log.h"
#include "rail.h"
#include "rma/rma_tcp.h"

#define RMA_STAGE_RING (8u << 20)	/* pinned bytes for the applier's copies into the GPU */
#define RMA_STAGE_LANE (4u << 20)	/* ... for a lane's */
#define RMA_STAGE_MIN (64u << 10)	/* less room than this left: start the ring over */
#define RMA_BOUNCE (4u << 20)	/* pinned bytes for GPU-to-GPU copies to the rank itself */

static void clock_add(struct rma_gpu_clock *c, uint64_t t0, size_t bytes)
{
	uint64_t ns = rail_now_ns() - t0, max = atomic_load_explicit(&c->max_ns, memory_order_relaxed);

	atomic_fetch_add_explicit(&c->n, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->ns, ns, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->bytes, bytes, memory_order_relaxed);
	while (ns > max && !atomic_compare_exchange_weak(&c->max_ns, &max, ns))
		;
}

/* " NAME N (mean X us, max Y us[, Z GB/s])" for one kind of wait, or nothing. */
static int clock_str(const struct rma_gpu_clock *c, const char *name, int rate, char *buf,
		     size_t len)
{
	uint64_t n = atomic_load(&c->n), ns = atomic_load(&c->ns);

	if (!n)
		return snprintf(buf, len, "%s none", name);
	if (rate && ns)
		return snprintf(buf, len, "%s %llu (mean %.1f us, max %.1f us, %.2f GB/s)", name,
				(unsigned long long)n, ns / 1e3 / (double)n,
				atomic_load(&c->max_ns) / 1e3, (double)atomic_load(&c->bytes) / (double)ns);
	return snprintf(buf, len, "%s %llu (mean %.1f us, max %.1f us)", name, (unsigned long long)n,
			ns / 1e3 / (double)n, atomic_load(&c->max_ns) / 1e3);
}

/*
 * At close: how long this rank waited for its GPU, in the waits the
 * backend makes anyway (a put's source piece, the staging ring, a get, a
 * signal read back). A wait far above the bytes' copy time is the GPU
 * running the plugin's copies late. Signal writes are not waited for: a
 * wait on NCCL's GIN progress thread, which calls in with its state locked,
 * would hold up every other GIN operation of the process.
 */
static void log_waits(const struct rma_gpu *g)
{
	char a[96], b[96];

	if (!atomic_load(&g->waits[RMA_WAIT_SOURCE].n) && !atomic_load(&g->waits[RMA_WAIT_QUEUE].n))
		return;
	clock_str(&g->waits[RMA_WAIT_SOURCE], "put sources copied out", 1, a, sizeof(a));
	clock_str(&g->waits[RMA_WAIT_QUEUE], "stream drained", 1, b, sizeof(b));
	RAIL_INFO(RAIL_LOG_NET, "RMA on GPU memory (rank %d of %d, device %d): waits for the GPU: "
		  "%s; %s; %llu signal words written", g->rank, g->nranks, g->dev, a, b,
		  (unsigned long long)g->signals);
}

void rma_gpu_init(struct rma_gpu *g, int dev, int rank, int nranks)
{
	memset(g, 0, sizeof(*g));
	pthread_mutex_init(&g->lock, NULL);
	g->dev = dev;
	g->rank = rank;
	g->nranks = nranks;
}

/* A driver call failed: say what, where, and what to try. */
static int cu_fail(const struct rma_gpu *g, const char *what, rail_cu_result r)
{
	RAIL_WARN("RMA on GPU memory (rank %d of %d, device %d): %s failed: %s; the operation "
		  "fails (NCCL_RAIL_RMA=0 lets NCCL use another RMA backend)", g->rank, g->nranks,
		  g->dev, what, RAIL_CUSTR(g->cu, r));
	return -EIO;
}

/* NCCL's progress threads and the applier have no current context: set the captured one. */
static int cu_enter(const struct rma_gpu *g)
{
	rail_cu_result r = g->cu->ctx_set_current(g->ctx);

	return r == RAIL_CU_SUCCESS ? 0 : cu_fail(g, "cuCtxSetCurrent", r);
}

void rma_gpu_fini(struct rma_gpu *g)
{
	log_waits(g);
	if (g->cu && !cu_enter(g)) {
		if (g->stream) {
			g->cu->stream_synchronize(g->stream);
			g->cu->stream_destroy(g->stream);
		}
		if (g->ring.buf)
			g->cu->mem_free_host(g->ring.buf);
		if (g->word)
			g->cu->mem_free_host(g->word);
		if (g->bounce)
			g->cu->mem_free_host(g->bounce);
		if (g->ran_mem)
			g->cu->mem_free_host(g->ran_mem);
	}
	pthread_mutex_destroy(&g->lock);
}

/*
 * How the driver loads modules (g->lazy: 1 lazily, 0 eagerly, -1 unknown),
 * said once per process where lazily: a kernel the process launches for
 * the first time while other kernels wait on the GPU (the device API's
 * spin on signals this plugin writes) makes the driver hold the context
 * until the GPU drains, and every CUDA call of the process, this plugin's
 * copies and signal writes included, waits for it: a hang.
 */
static void loading_note(struct rma_gpu *g)
{
	static atomic_int said;
	int mode = 0;

	g->lazy = -1;
	if (!g->cu->module_get_loading_mode || g->cu->module_get_loading_mode(&mode))
		return;
	g->lazy = mode == RAIL_CU_MODULE_LAZY_LOADING;
	if (g->lazy && !atomic_exchange(&said, 1))
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "RMA on GPU memory (rank %d of %d, device "
			  "%d): CUDA loads modules lazily in this process (CUDA_MODULE_LOADING unset "
			  "or LAZY); with the device API (GIN) over this plugin, a kernel launched "
			  "for the first time while other kernels wait for signals can hold every "
			  "CUDA call, the plugin's signal writes included, until those kernels end: "
			  "set CUDA_MODULE_LOADING=EAGER", g->rank, g->nranks, g->dev);
}

/* The stall check goes without the GPU's count of signal writes run: say so, fail nothing. */
static void progress_lost(const struct rma_gpu *g, const char *what, rail_cu_result r)
{
	RAIL_WARN("RMA on GPU memory (rank %d of %d, device %d): %s for the stall check's progress "
		  "word failed: %s; the check (NCCL_RAIL_RMA_STALL_WARN) does not see signal writes "
		  "the GPU does not run, and nothing else changes", g->rank, g->nranks, g->dev,
		  what, RAIL_CUSTR(g->cu, r));
}

/* The driver, the context, the stream and the staging: once, on NCCL's thread. Holds g->lock. */
static int gpu_start(struct rma_gpu *g, const char *call, void *data, size_t size)
{
	char why[320];
	rail_cu_stream s;
	rail_cu_result r;

	if (g->stream)
		return 0;
	g->cu = rail_cuda_get(why, sizeof(why));
	if (!g->cu) {
		RAIL_WARN("RMA %s(%p, %zu bytes) on device %d (rank %d of %d): GPU memory "
			  "(NCCL_PTR_CUDA) needs the CUDA driver, and %s; set NCCL_RAIL_RMA=0 to let "
			  "NCCL use another RMA backend", call, data, size, g->dev, g->rank, g->nranks,
			  why);
		return -EOPNOTSUPP;
	}
	g->ctx = rail_cuda_ctx(g->cu);
	if (!g->ctx) {
		RAIL_WARN("RMA %s(%p, %zu bytes) on device %d (rank %d of %d): GPU memory, but no "
			  "CUDA context is current on this thread, nor was one at RMA init", call, data,
			  size, g->dev, g->rank, g->nranks);
		return -EINVAL;
	}
	if (cu_enter(g))
		return -EIO;
	/* A failure is tried again at the next GPU window: keep what was made. */
	if (!g->ring.buf && (r = g->cu->mem_host_alloc((void **)&g->ring.buf, RMA_STAGE_RING,
						       RAIL_CU_MEMHOSTALLOC_PORTABLE)))
		return cu_fail(g, "cuMemHostAlloc of the staging ring", r);
	if (!g->word && (r = g->cu->mem_host_alloc((void **)&g->word, 8,
						   RAIL_CU_MEMHOSTALLOC_PORTABLE)))
		return cu_fail(g, "cuMemHostAlloc of a signal word", r);
	if (g->track && !g->ran_mem) {
		uint64_t *ran;

		r = g->cu->mem_host_alloc((void **)&ran, 8, RAIL_CU_MEMHOSTALLOC_PORTABLE |
					  RAIL_CU_MEMHOSTALLOC_DEVICEMAP);
		if (!r) {
			*ran = 0;
			g->ran_mem = ran;
			__atomic_store_n(&g->ran, ran, __ATOMIC_RELEASE);	/* the check reads it */
		} else {
			g->track = 0;
			progress_lost(g, "cuMemHostAlloc of 8 bytes", r);
		}
	}
	g->ring.size = RMA_STAGE_RING;
	if ((r = g->cu->stream_create(&s, RAIL_CU_STREAM_NON_BLOCKING)))
		return cu_fail(g, "cuStreamCreate", r);
	loading_note(g);
	__atomic_store_n(&g->stream, s, __ATOMIC_RELEASE);	/* read without the lock */
	return 0;
}

int rma_gpu_win(struct rma_gpu *g, void *data, size_t size, const char *call, int *gpu)
{
	unsigned int type = 0;
	rail_cu_result r;
	int err;

	pthread_mutex_lock(&g->lock);
	err = gpu_start(g, call, data, size);
	if (!err && (r = g->cu->pointer_get_attribute(&type, RAIL_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
						      (rail_cu_ptr)(uintptr_t)data))) {
		RAIL_WARN("RMA %s(%p, %zu bytes) on device %d (rank %d of %d): NCCL_PTR_CUDA memory "
			  "the CUDA driver does not know: %s", call, data, size, g->dev, g->rank,
			  g->nranks, RAIL_CUSTR(g->cu, r));
		err = -EINVAL;
	}
	pthread_mutex_unlock(&g->lock);
	if (!err)
		*gpu = type == RAIL_CU_MEMORYTYPE_DEVICE;	/* host memory the GPU maps: direct */
	return err;
}

int rma_gpu_stream(struct rma_gpu *g, rail_cu_stream *s)
{
	rail_cu_result r;

	if (cu_enter(g))
		return -EIO;
	r = g->cu->stream_create(s, RAIL_CU_STREAM_NON_BLOCKING);
	return r ? cu_fail(g, "cuStreamCreate", r) : 0;
}

void rma_gpu_stream_free(struct rma_gpu *g, rail_cu_stream s)
{
	if (s && !cu_enter(g)) {
		g->cu->stream_synchronize(s);
		g->cu->stream_destroy(s);
	}
}

void *rma_gpu_pinned(struct rma_gpu *g, size_t size)
{
	void *p = NULL;
	rail_cu_result r;

	if (cu_enter(g))
		return NULL;
	r = g->cu->mem_host_alloc(&p, size, RAIL_CU_MEMHOSTALLOC_PORTABLE);
	if (r) {
		cu_fail(g, "cuMemHostAlloc", r);
		return NULL;
	}
	return p;
}

void rma_gpu_pinned_free(struct rma_gpu *g, void *p)
{
	if (p && !cu_enter(g))
		g->cu->mem_free_host(p);
}

/*
 * A driver call that may block (a synchronize; any call while another
 * thread holds the context lock, as CUDA's lazy module loading does until
 * the GPU drains) takes a free slot for rma_mem_watch, NULL when all are
 * taken (the call goes unwatched).
 */
static struct rma_gpu_busy *busy_in(struct rma_gpu *g, const char *what, size_t bytes)
{
	for (int i = 0; i < RMA_GPU_BUSY_SLOTS; i++) {
		struct rma_gpu_busy *b = &g->busy[i];
		int no = 0;

		if (atomic_load_explicit(&b->used, memory_order_relaxed) ||
		    !atomic_compare_exchange_strong(&b->used, &no, 1))
			continue;
		atomic_store(&b->what, what);
		atomic_store(&b->bytes, bytes);
		atomic_store(&b->warned, 0);
		atomic_store(&b->since, rail_now_ns());
		return b;
	}
	return NULL;
}

static void busy_out(struct rma_gpu *g, struct rma_gpu_busy *b)
{
	if (!b)
		return;
	if (atomic_load(&b->warned))
		RAIL_INFO(RAIL_LOG_NET, "RMA on GPU memory (rank %d of %d, device %d): %s returned "
			  "after %.1f s", g->rank, g->nranks, g->dev, atomic_load(&b->what),
			  (double)(rail_now_ns() - atomic_load(&b->since)) / 1e9);
	atomic_store(&b->since, 0);
	atomic_store(&b->used, 0);
}

static const char *stall_hint(const struct rma_gpu *g)
{
	return g->lazy == 1 ? "; CUDA loads modules lazily in this process, and a kernel launched "
			      "for the first time while other kernels wait on the GPU holds the "
			      "context until the GPU drains: set CUDA_MODULE_LOADING=EAGER"
			    : "; look for kernels that keep the GPU busy";
}

/* Signal writes queued that the GPU has not run: named once limit_ns pass with none run. */
static void watch_lag(struct rma_gpu *g, uint64_t now, uint64_t limit_ns)
{
	uint64_t *ran_p = __atomic_load_n(&g->ran, __ATOMIC_ACQUIRE);
	uint64_t q = atomic_load_explicit(&g->sigq, memory_order_acquire);
	uint64_t ran = ran_p ? __atomic_load_n(ran_p, __ATOMIC_ACQUIRE) : q;
	uint64_t sig = atomic_load(&g->signals_at);

	/* Counted from the first look that found it so, never from before (since 0). */
	if (ran != g->lag.seen || ran >= q || !g->lag.since) {
		if (g->lag.warned)
			RAIL_INFO(RAIL_LOG_NET, "RMA on GPU memory (rank %d of %d, device %d): the "
				  "GPU runs the plugin's signal writes again, after %.1f s", g->rank,
				  g->nranks, g->dev, (double)(now - g->lag.since) / 1e9);
		g->lag.seen = ran;
		g->lag.since = now;
		g->lag.warned = 0;
		return;
	}
	if (g->lag.warned || now - g->lag.since < limit_ns)
		return;
	g->lag.warned = 1;
	RAIL_WARN("RMA on GPU memory (rank %d of %d, device %d): the GPU has run none of the "
		  "plugin's signal writes for %.0f s (%llu of %llu run; the last queued %.1f s "
		  "ago): they wait on the plugin's CUDA stream behind work the GPU does not finish, "
		  "and whatever waits for these signals (a device API kernel, ncclWaitSignal) "
		  "waits too%s", g->rank, g->nranks, g->dev, (double)(now - g->lag.since) / 1e9,
		  (unsigned long long)ran, (unsigned long long)q,
		  (double)(now > sig ? now - sig : 0) / 1e9, stall_hint(g));
}

void rma_mem_watch(struct rma_gpu *g, uint64_t now, uint64_t limit_ns)
{
	watch_lag(g, now, limit_ns);
	for (int i = 0; i < RMA_GPU_BUSY_SLOTS; i++) {
		struct rma_gpu_busy *b = &g->busy[i];
		uint64_t t0 = atomic_load(&b->since), sig = atomic_load(&g->signals_at);
		const char *what = atomic_load(&b->what);
		char last[64] = "no signal word queued yet";
		int no = 0;

		if (!t0 || now < t0 || now - t0 < limit_ns)
			continue;
		if (!atomic_compare_exchange_strong(&b->warned, &no, 1))
			continue;
		if (sig)
			snprintf(last, sizeof(last), "the last signal word queued %.1f s ago",
				 (double)(now - sig) / 1e9);
		RAIL_WARN("RMA on GPU memory (rank %d of %d, device %d): a thread of the plugin has "
			  "been in %s for %.0f s (%llu bytes; %s): %s, so every operation into this "
			  "rank's GPU windows waits%s", g->rank, g->nranks, g->dev, what,
			  (double)(now - t0) / 1e9, (unsigned long long)atomic_load(&b->bytes), last,
			  strncmp(what, "cuStreamSynchronize", 19) ? "the CUDA driver does not return "
			  "(another thread holds the context)" : "the GPU has not run the copies and "
			  "signal writes queued on the stream", stall_hint(g));
	}
}

/* Wait for everything queued on stream s, timed as kind with bytes; what names the call. */
static int timed_sync(struct rma_gpu *g, rail_cu_stream s, enum rma_gpu_wait kind, size_t bytes,
		      const char *what)
{
	struct rma_gpu_busy *b;
	rail_cu_result r;
	uint64_t t0;

	if (cu_enter(g))
		return -EIO;
	t0 = rail_now_ns();
	b = busy_in(g, what, bytes);
	r = g->cu->stream_synchronize(s);
	busy_out(g, b);
	if (r)
		return cu_fail(g, what, r);
	clock_add(&g->waits[kind], t0, bytes);
	return 0;
}

/* Wait for everything queued on the collComm's stream, timed as kind. Holds g->lock. */
static int gpu_wait(struct rma_gpu *g, enum rma_gpu_wait kind)
{
	int err;

	if (!g->pending)
		return 0;
	if ((err = timed_sync(g, g->stream, kind, g->queued, "cuStreamSynchronize")))
		return err;
	g->pending = 0;
	g->queued = 0;
	return 0;
}

static int gpu_sync(struct rma_gpu *g)
{
	return gpu_wait(g, RMA_WAIT_QUEUE);
}

int rma_mem_sync(struct rma_gpu *g)
{
	int err;

	if (!__atomic_load_n(&g->stream, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&g->lock);
	err = gpu_sync(g);
	pthread_mutex_unlock(&g->lock);
	return err;
}

char *rma_mem_stage(struct rma_gpu *g, struct rma_ring *ring, size_t want, size_t *room)
{
	if (!ring->buf && (ring->buf = rma_gpu_pinned(g, RMA_STAGE_LANE)))
		ring->size = RMA_STAGE_LANE;
	if (!ring->buf)
		return NULL;
	if (ring->size - ring->pos < RAIL_MIN(want, RMA_STAGE_MIN)) {
		/*
		 * Every copy out of this ring was queued before now: a synchronize
		 * frees it. Without g->lock, so that the other threads go on
		 * queueing theirs meanwhile.
		 */
		if (timed_sync(g, __atomic_load_n(&g->stream, __ATOMIC_ACQUIRE), RMA_WAIT_QUEUE,
			       ring->pos, "cuStreamSynchronize (the staging ring is full)"))
			return NULL;
		ring->pos = 0;
	}
	*room = RAIL_MIN(want, ring->size - ring->pos);
	return ring->buf + ring->pos;
}

void rma_mem_ring_free(struct rma_gpu *g, struct rma_ring *ring)
{
	rma_gpu_pinned_free(g, ring->buf);
	*ring = (struct rma_ring){ 0 };
}

int rma_mem_land(struct rma_gpu *g, struct rma_ring *ring, const struct rma_win *w, uint64_t off,
		 const char *staged, size_t n)
{
	rail_cu_result r = RAIL_CU_SUCCESS;
	int err;

	pthread_mutex_lock(&g->lock);
	err = cu_enter(g);
	if (!err) {
		struct rma_gpu_busy *b = busy_in(g, "cuMemcpyHtoDAsync into a window", n);

		r = g->cu->memcpy_htod_async((rail_cu_ptr)(uintptr_t)(w->base.base + off), staged,
					     n, g->stream);
		busy_out(g, b);
	}
	if (!err && r)
		err = cu_fail(g, "cuMemcpyHtoDAsync into a window", r);
	if (!err) {
		g->pending = 1;
		g->queued += n;
		if (staged == ring->buf + ring->pos)
			ring->pos += n;
	}
	pthread_mutex_unlock(&g->lock);
	return err;
}

/*
 * After a signal write: how many were queued, for the stall check (pinned,
 * written by the GPU). A driver that refuses it costs the check this view,
 * never the operation.
 */
static void progress_write(struct rma_gpu *g)
{
	uint64_t n = atomic_load_explicit(&g->sigq, memory_order_relaxed) + 1;
	struct rma_gpu_busy *b = busy_in(g, "cuStreamWriteValue64 of the progress word", 8);
	rail_cu_result r = g->cu->stream_write_value64(g->stream, (rail_cu_ptr)(uintptr_t)g->ran,
							n, RAIL_CU_STREAM_WRITE_VALUE_DEFAULT);

	busy_out(g, b);
	if (!r) {
		atomic_store_explicit(&g->sigq, n, memory_order_release);
		return;
	}
	__atomic_store_n(&g->ran, NULL, __ATOMIC_RELEASE);
	progress_lost(g, "cuStreamWriteValue64 into pinned host memory", r);
}

/* A GPU signal word: shadow or read back, plus add, written behind what came before. */
static int gpu_signal(struct rma_gpu *g, const struct rma_win *w, uint64_t off, uint64_t add)
{
	rail_cu_ptr p = (rail_cu_ptr)(uintptr_t)(w->base.base + off);
	struct rma_gpu_busy *b;
	uint64_t v;
	rail_cu_result r;

	if (cu_enter(g))
		return -EIO;
	if (w->shadow) {
		v = (w->shadow[off / 8] += add);
	} else {
		b = busy_in(g, "cuMemcpyDtoHAsync of a signal word", 8);
		r = g->cu->memcpy_dtoh_async(g->word, p, 8, g->stream);
		busy_out(g, b);
		if (r)
			return cu_fail(g, "cuMemcpyDtoHAsync of a signal word", r);
		g->pending = 1;
		if (gpu_sync(g))
			return -EIO;
		v = *g->word + add;
	}
	b = busy_in(g, "cuStreamWriteValue64 of a signal", 8);
	r = g->cu->stream_write_value64(g->stream, p, v, RAIL_CU_STREAM_WRITE_VALUE_DEFAULT);
	busy_out(g, b);
	if (r)
		return cu_fail(g, "cuStreamWriteValue64 of a signal", r);
	g->pending = 1;
	g->signals++;
	atomic_store_explicit(&g->signals_at, rail_now_ns(), memory_order_relaxed);
	if (g->ran)
		progress_write(g);
	return 0;
}

int rma_mem_signal(struct rma_gpu *g, const struct rma_win *w, uint64_t off, uint64_t add)
{
	int err = 0;

	if (!w->gpu && !__atomic_load_n(&g->stream, __ATOMIC_ACQUIRE)) {
		__atomic_fetch_add((uint64_t *)(void *)(w->base.base + off), add, __ATOMIC_SEQ_CST);
		return 0;
	}
	pthread_mutex_lock(&g->lock);
	if (w->gpu)
		err = gpu_signal(g, w, off, add);
	else if (!(err = gpu_sync(g)))	/* after the bytes of the puts before it */
		__atomic_fetch_add((uint64_t *)(void *)(w->base.base + off), add, __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&g->lock);
	return err;
}

int rma_mem_read(struct rma_gpu *g, const struct rma_win *w, uint64_t off, void *pinned,
		 size_t n)
{
	rail_cu_result r = RAIL_CU_SUCCESS;
	int err;

	if (!w->gpu) {
		memcpy(pinned, w->base.base + off, n);
		return 0;
	}
	pthread_mutex_lock(&g->lock);
	err = cu_enter(g);
	/* On the stream: behind every write into the window before it. */
	if (!err) {
		struct rma_gpu_busy *b = busy_in(g, "cuMemcpyDtoHAsync out of a window", n);

		r = g->cu->memcpy_dtoh_async(pinned, (rail_cu_ptr)(uintptr_t)(w->base.base + off),
					     n, g->stream);
		busy_out(g, b);
	}
	if (!err && r)
		err = cu_fail(g, "cuMemcpyDtoHAsync out of a window", r);
	if (!err) {
		g->pending = 1;
		g->queued += n;
		err = gpu_sync(g);
	}
	pthread_mutex_unlock(&g->lock);
	return err;
}

/*
 * GPU window to GPU window (an operation of the rank to itself), on the
 * stream, through a pinned bounce buffer: DtoH then HtoD, piece by piece
 * (the stream runs each piece's two copies before the next piece reuses the
 * buffer). Never cuMemcpyDtoDAsync: the driver runs a copy within one GPU
 * on the SMs, and while the device API's kernels fill them waiting for this
 * rank's signals, a copy queued ahead of those signals never ran (GIN at 4
 * ranks; test/nccl/sm_copy_probe.cu). Copy engines do not wait for SMs.
 */
static rail_cu_result copy_gpu_gpu(struct rma_gpu *g, rail_cu_ptr dp, rail_cu_ptr sp, size_t n)
{
	rail_cu_result r = RAIL_CU_SUCCESS;

	for (size_t o = 0; o < n && !r; o += RMA_BOUNCE) {
		size_t k = RAIL_MIN(RMA_BOUNCE, n - o);

		r = g->cu->memcpy_dtoh_async(g->bounce, sp + o, k, g->stream);
		if (!r)
			r = g->cu->memcpy_htod_async(dp + o, g->bounce, k, g->stream);
	}
	return r;
}

int rma_mem_copy(struct rma_gpu *g, const struct rma_win *dw, uint64_t doff,
		 const struct rma_win *sw, uint64_t soff, size_t n)
{
	char *d = dw->base.base + doff, *s = sw->base.base + soff;
	rail_cu_ptr dp = (rail_cu_ptr)(uintptr_t)d, sp = (rail_cu_ptr)(uintptr_t)s;
	rail_cu_result r = RAIL_CU_SUCCESS;
	int err;

	if (!dw->gpu && !sw->gpu) {
		memmove(d, s, n);
		return 0;
	}
	pthread_mutex_lock(&g->lock);
	err = cu_enter(g);
	if (!err && dw->gpu && sw->gpu && !g->bounce &&
	    (r = g->cu->mem_host_alloc((void **)&g->bounce, RMA_BOUNCE,
				       RAIL_CU_MEMHOSTALLOC_PORTABLE)))
		err = cu_fail(g, "cuMemHostAlloc of the pinned buffer that copies between GPU windows "
			      "of this rank pass through", r);
	if (!err) {
		struct rma_gpu_busy *b = busy_in(g, "a copy to this rank itself", n);

		r = dw->gpu && sw->gpu ? copy_gpu_gpu(g, dp, sp, n)
		    : dw->gpu ? g->cu->memcpy_htod_async(dp, s, n, g->stream)
		    : g->cu->memcpy_dtoh_async(d, sp, n, g->stream);
		busy_out(g, b);
	}
	if (!err && r)
		err = cu_fail(g, "a copy to this rank itself", r);
	if (!err) {
		g->pending = 1;
		g->queued += n;
	}
	pthread_mutex_unlock(&g->lock);
	return err;
}

int rma_mem_stage_start(struct rma_gpu *g, rail_cu_stream s, void *pinned, const char *src,
			size_t n)
{
	struct rma_gpu_busy *b;
	rail_cu_result r;

	if (cu_enter(g))
		return -EIO;
	b = busy_in(g, "cuMemcpyDtoHAsync of a put's source", n);
	r = g->cu->memcpy_dtoh_async(pinned, (rail_cu_ptr)(uintptr_t)src, n, s);
	busy_out(g, b);
	return r ? cu_fail(g, "cuMemcpyDtoHAsync of a put's source", r) : 0;
}

int rma_gpu_event(struct rma_gpu *g, rail_cu_event *e)
{
	rail_cu_result r;

	if (cu_enter(g))
		return -EIO;
	r = g->cu->event_create(e, RAIL_CU_EVENT_DISABLE_TIMING);
	return r ? cu_fail(g, "cuEventCreate", r) : 0;
}

void rma_gpu_event_free(struct rma_gpu *g, rail_cu_event e)
{
	if (e && !cu_enter(g))
		g->cu->event_destroy(e);
}

int rma_mem_stage_queue(struct rma_gpu *g, rail_cu_stream s, rail_cu_event e, void *pinned,
			const char *src, size_t n)
{
	struct rma_gpu_busy *b;
	rail_cu_result r;
	int err = rma_mem_stage_start(g, s, pinned, src, n);

	if (err)
		return err;
	b = busy_in(g, "cuEventRecord after a put's source", n);
	r = g->cu->event_record(e, s);
	busy_out(g, b);
	return r ? cu_fail(g, "cuEventRecord after a put's source", r) : 0;
}

int rma_mem_mark(struct rma_gpu *g, rail_cu_event e)
{
	rail_cu_result r = RAIL_CU_SUCCESS;
	int err;

	pthread_mutex_lock(&g->lock);
	err = cu_enter(g);
	if (!err)
		r = g->cu->event_record(e, g->stream);
	if (!err && r)
		err = cu_fail(g, "cuEventRecord after an operation to this rank itself", r);
	pthread_mutex_unlock(&g->lock);
	return err;
}

/* Whether e passed (1, 0 not yet, -errno), the query in a watch slot: what names it. */
static int event_passed(struct rma_gpu *g, rail_cu_event e, const char *what, size_t n)
{
	struct rma_gpu_busy *b;
	rail_cu_result r;

	if (cu_enter(g))
		return -EIO;
	b = busy_in(g, what, n);
	r = g->cu->event_query(e);
	busy_out(g, b);
	if (r == RAIL_CU_NOT_READY)
		return 0;
	return r ? cu_fail(g, what, r) : 1;
}

int rma_gpu_passed(struct rma_gpu *g, rail_cu_event e)
{
	return event_passed(g, e, "cuEventQuery after an operation to this rank itself", 0);
}

int rma_mem_stage_ready(struct rma_gpu *g, rail_cu_event e, size_t n, uint64_t since)
{
	int passed = event_passed(g, e, "cuEventQuery of a put's source", n);

	if (passed > 0)
		clock_add(&g->waits[RMA_WAIT_SOURCE], since, n);
	return passed;
}

int rma_mem_stage_wait(struct rma_gpu *g, rail_cu_stream s, size_t n)
{
	return timed_sync(g, s, RMA_WAIT_SOURCE, n, "cuStreamSynchronize of a put's source");
}

int rma_mem_stage_out(struct rma_gpu *g, rail_cu_stream s, void *pinned, const char *src,
		      size_t n)
{
	int err = rma_mem_stage_start(g, s, pinned, src, n);

	return err ? err : rma_mem_stage_wait(g, s, n);
}
