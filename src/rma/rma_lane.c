/*
 * nccl-net-rail: the lanes' sender threads of the TCP RMA backend
 * (rma_tcp.h, Lanes), and how a request's parts complete.
 *
 * A striped put is queued as one job per lane that carries any of its
 * blocks; lane l's thread takes its jobs in the order they were posted
 * (every context of every createContext call of the collComm) and writes
 * each block as a PUT frame and its bytes on the lane's socket to the peer,
 * blocking in poll while the socket is full. A block out of a GPU window is
 * copied into the thread's pinned buffer on its own stream first, the next
 * block's copy queued while the current one is written. A job's end is one
 * part of its request; the request is done when its stream frames and
 * every lane's blocks have left (its source is then reusable).
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "rail.h"
#include "rma/rma_tcp.h"
#include "thread.h"

struct rma_lane_tx {
	struct rma_tcp_coll *c;
	int lane;
	pthread_t thread;
	int started;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	struct rma_lane_job *q;	/* ring of cap */
	uint32_t head, n, cap;
	int stop;
	struct rma_tcp_ctx *busy;	/* the context of the job being sent */
	rail_cu_stream stream;	/* copies out of GPU windows */
	char *pinned;		/* two blocks */
};

uint32_t rma_lane_blocks(uint64_t off, uint64_t len, int lane, int nlanes)
{
	uint64_t first, last, k = (uint64_t)nlanes;

	if (!len || nlanes <= 0)
		return 0;
	first = off / RMA_LANE_BLOCK;
	last = (off + len - 1) / RMA_LANE_BLOCK;
	/* blocks b in [first, last] with b % k == lane */
	first += ((uint64_t)lane + k - first % k) % k;
	return first > last ? 0 : (uint32_t)((last - first) / k + 1);
}

void rma_coll_fail(struct rma_tcp_coll *c, int err)
{
	int none = 0;

	atomic_compare_exchange_strong(&c->err, &none, err);
}

void rma_req_part(struct rma_req *r, int err)
{
	int none = 0;

	if (err)
		atomic_compare_exchange_strong(&r->err, &none, err);
	if (atomic_fetch_sub(&r->parts, 1) == 1)
		atomic_store(&r->state, atomic_load(&r->err) ? RMA_REQ_FAILED : RMA_REQ_DONE);
}

/*
 * The lane to the peer took no byte for the limit (NCCL_RAIL_RMA_STALL_WARN),
 * said once per wait by the lane's own thread; *warned: when it was said.
 */
static void lane_stalled(struct rma_lane_tx *t, int peer, uint64_t since, uint64_t *warned)
{
	struct rma_tcp_coll *c = t->c;
	uint64_t now = rail_now_ns();

	if (*warned || !c->stall_ns || now - since < c->stall_ns)
		return;
	*warned = since;
	RAIL_WARN("RMA (rank %d of %d, device %d): lane %d to %s took no byte for %.0f s: the "
		  "target does not read it; " RMA_STALL_AT_TARGET, c->base.rank, c->base.nranks,
		  c->base.dev,
		  t->lane, RMA_PEER(&c->mesh, peer), (double)(now - since) / 1e9);
}

/* Write the whole iov, waiting in poll while the socket is full: 0 or -errno. */
static int write_all(struct rma_lane_tx *t, int fd, int peer, struct iovec *iov, int niov)
{
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)niov };
	uint64_t since = rail_now_ns(), warned = 0;

	while (msg.msg_iovlen) {
		ssize_t n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };

			if (__atomic_load_n(&t->stop, __ATOMIC_RELAXED))
				return -ECANCELED;
			poll(&p, 1, 200);
			lane_stalled(t, peer, since, &warned);
			continue;
		}
		if (n < 0)
			return -errno;
		if (warned) {
			RAIL_INFO(RAIL_LOG_NET, "RMA (rank %d of %d, device %d): lane %d to %s moves "
				  "again after %.1f s", t->c->base.rank, t->c->base.nranks,
				  t->c->base.dev, t->lane, RMA_PEER(&t->c->mesh, peer),
				  (double)(rail_now_ns() - warned) / 1e9);
			warned = 0;
		}
		since = rail_now_ns();
		while (msg.msg_iovlen && (size_t)n >= msg.msg_iov->iov_len) {
			n -= (ssize_t)msg.msg_iov->iov_len;
			msg.msg_iov++;
			msg.msg_iovlen--;
		}
		if (msg.msg_iovlen) {
			msg.msg_iov->iov_base = (char *)msg.msg_iov->iov_base + n;
			msg.msg_iov->iov_len -= (size_t)n;
		}
	}
	return 0;
}

/* The thread's stream and pinned blocks, for a job out of a GPU window. */
static int gpu_ready(struct rma_lane_tx *t)
{
	struct rma_gpu *g = &t->c->gpu;

	if (!t->stream && rma_gpu_stream(g, &t->stream))
		return -EIO;
	if (!t->pinned && !(t->pinned = rma_gpu_pinned(g, 2 * (size_t)RMA_LANE_BLOCK)))
		return -EIO;
	return 0;
}

/* The range of block b inside [off, off + len). */
static void block_range(const struct rma_lane_job *j, uint64_t b, uint64_t *s, uint64_t *e)
{
	*s = RAIL_MAX(j->off, b * RMA_LANE_BLOCK);
	*e = RAIL_MIN(j->off + j->len, (b + 1) * RMA_LANE_BLOCK);
}

/* Every block of the job on this lane, in order: 0 or -errno. */
static int job_send(struct rma_lane_tx *t, const struct rma_lane_job *j, int fd)
{
	struct rma_gpu *g = &t->c->gpu;
	uint64_t k = (uint64_t)t->c->nlanes, b = j->off / RMA_LANE_BLOCK, last;
	int cur = 0, err = j->gpu ? gpu_ready(t) : 0;
	uint64_t s, e;

	last = (j->off + j->len - 1) / RMA_LANE_BLOCK;
	b += ((uint64_t)t->lane + k - b % k) % k;
	if (!err && j->gpu && b <= last) {
		block_range(j, b, &s, &e);
		err = rma_mem_stage_out(g, t->stream, t->pinned, j->src + (s - j->off), e - s);
	}
	for (; !err && b <= last; b += k) {
		struct rma_frame f = { .op = RMA_OP_PUT, .win = j->win,
				       .id = (uint64_t)j->context << 32 | j->seq };
		uint8_t hdr[RMA_FRAME_SIZE];
		struct iovec iov[2];
		uint64_t ns = 0, ne = 0;

		block_range(j, b, &s, &e);
		f.off = s;
		f.len = e - s;
		rma_frame_encode(&f, hdr);
		iov[0] = (struct iovec){ hdr, RMA_FRAME_SIZE };
		iov[1].iov_base = j->gpu ? t->pinned + cur * RMA_LANE_BLOCK
					 : (void *)(uintptr_t)(j->src + (s - j->off));
		iov[1].iov_len = e - s;
		/* the next block's copy runs while this one is written */
		if (j->gpu && b + k <= last) {
			block_range(j, b + k, &ns, &ne);
			err = rma_mem_stage_start(g, t->stream, t->pinned + (cur ^ 1) * RMA_LANE_BLOCK,
						  j->src + (ns - j->off), ne - ns);
		}
		if (!err)
			err = write_all(t, fd, j->peer, iov, 2);
		if (!err && j->gpu && b + k <= last)
			err = rma_mem_stage_wait(g, t->stream, ne - ns);
		cur ^= 1;
	}
	/* a copy queued before a failed write must end before the source may be reused */
	if (err && j->gpu && t->stream)
		rma_mem_stage_wait(g, t->stream, 0);
	return err;
}

void rma_peer_cut(struct rma_tcp_ctx *x, int peer)
{
	int nranks = x->coll->base.nranks;

	for (int l = 0; l < x->coll->nlanes; l++) {
		if (x->lane_out[l * nranks + peer] >= 0)
			shutdown(x->lane_out[l * nranks + peer], SHUT_RDWR);
	}
	for (int k = 0; k < x->base.ncontexts; k++) {
		if (x->streams[k * nranks + peer].out_fd >= 0)
			shutdown(x->streams[k * nranks + peer].out_fd, SHUT_RDWR);
	}
}

static void job_run(struct rma_lane_tx *t, const struct rma_lane_job *j)
{
	struct rma_tcp_ctx *x = j->x;
	struct rma_tcp_coll *c = t->c;
	int i = t->lane * c->base.nranks + j->peer;
	int err = atomic_load(&x->lane_err[i]);

	if (!err && (err = job_send(t, j, x->lane_out[i]))) {
		int none = 0;

		/* log once per lane socket: later jobs on it fail the same way */
		if (atomic_compare_exchange_strong(&x->lane_err[i], &none, err) &&
		    err != -ECANCELED) {
			RAIL_WARN("RMA iput of %llu bytes to %s (context %d, rank %d of %d, device "
				  "%d): writing lane %d: %s; every operation of this context call to "
				  "that rank fails", (unsigned long long)j->len,
				  RMA_PEER(&c->mesh, j->peer), j->context, c->base.rank,
				  c->base.nranks, c->base.dev, t->lane, RAIL_ERRSTR(err));
			rma_peer_cut(x, j->peer);
		}
		rma_coll_fail(c, err);
	}
	rma_req_part(&x->reqs[j->req], err);
}

static void *lane_main(void *arg)
{
	struct rma_lane_tx *t = arg;

	rail_thread_name("rail-rma-tx%d", t->lane);
	pthread_mutex_lock(&t->lock);
	for (;;) {
		struct rma_lane_job j;

		while (!t->n && !t->stop)
			pthread_cond_wait(&t->cv, &t->lock);
		if (!t->n)
			break;
		j = t->q[t->head];
		t->head = (t->head + 1) % t->cap;
		t->n--;
		t->busy = j.x;
		pthread_mutex_unlock(&t->lock);
		job_run(t, &j);
		pthread_mutex_lock(&t->lock);
		t->busy = NULL;
		pthread_cond_broadcast(&t->cv);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

int rma_lanes_start(struct rma_tcp_coll *c)
{
	int err = 0;

	if (!c->nlanes)
		return 0;
	c->tx = calloc((size_t)c->nlanes, sizeof(*c->tx));
	if (!c->tx)
		return -ENOMEM;
	for (int l = 0; l < c->nlanes && !err; l++) {
		struct rma_lane_tx *t = &c->tx[l];

		t->c = c;
		t->lane = l;
		pthread_mutex_init(&t->lock, NULL);
		pthread_cond_init(&t->cv, NULL);
		err = -pthread_create(&t->thread, NULL, lane_main, t);
		t->started = !err;
	}
	if (err)
		RAIL_WARN("RMA connect (rank %d of %d, device %d): starting the lanes' sender "
			  "threads: %s", c->base.rank, c->base.nranks, c->base.dev, RAIL_ERRSTR(err));
	return err;
}

void rma_lanes_stop(struct rma_tcp_coll *c)
{
	for (int l = 0; c->tx && l < c->nlanes; l++) {
		struct rma_lane_tx *t = &c->tx[l];

		if (t->started) {
			pthread_mutex_lock(&t->lock);
			t->stop = 1;
			t->n = 0;
			pthread_cond_broadcast(&t->cv);
			pthread_mutex_unlock(&t->lock);
			pthread_join(t->thread, NULL);
		}
		rma_gpu_stream_free(&c->gpu, t->stream);
		rma_gpu_pinned_free(&c->gpu, t->pinned);
		free(t->q);
		pthread_mutex_destroy(&t->lock);
		pthread_cond_destroy(&t->cv);
	}
	free(c->tx);
	c->tx = NULL;
}

int rma_lanes_reserve(struct rma_tcp_coll *c, int64_t delta)
{
	for (int l = 0; l < c->nlanes; l++) {
		struct rma_lane_tx *t = &c->tx[l];
		struct rma_lane_job *q;
		uint32_t cap;

		pthread_mutex_lock(&t->lock);
		cap = (uint32_t)RAIL_MAX((int64_t)t->n, (int64_t)t->cap + delta);
		q = cap ? calloc(cap, sizeof(*q)) : NULL;
		if (cap && !q) {
			pthread_mutex_unlock(&t->lock);
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < t->n; i++)
			q[i] = t->q[(t->head + i) % t->cap];
		free(t->q);
		t->q = q;
		t->head = 0;
		t->cap = cap;
		pthread_mutex_unlock(&t->lock);
	}
	return 0;
}

void rma_lane_post(struct rma_tcp_coll *c, int lane, const struct rma_lane_job *j)
{
	struct rma_lane_tx *t = &c->tx[lane];

	pthread_mutex_lock(&t->lock);
	t->q[(t->head + t->n) % t->cap] = *j;
	t->n++;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->lock);
}

void rma_lanes_forget(struct rma_tcp_coll *c, struct rma_tcp_ctx *x)
{
	for (int l = 0; c->tx && l < c->nlanes; l++) {
		struct rma_lane_tx *t = &c->tx[l];
		uint32_t kept = 0;

		pthread_mutex_lock(&t->lock);
		for (uint32_t i = 0; i < t->n; i++) {
			const struct rma_lane_job *j = &t->q[(t->head + i) % t->cap];

			if (j->x != x)
				t->q[(t->head + kept++) % t->cap] = *j;
		}
		t->n = kept;
		while (t->busy == x)
			pthread_cond_wait(&t->cv, &t->lock);
		pthread_mutex_unlock(&t->lock);
	}
}
