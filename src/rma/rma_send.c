/*
 * nccl-net-rail: the initiator side of the TCP RMA backend (rma_tcp.h):
 * requests, the streams of a context, and the calls NCCL's progress thread
 * makes (iput, iputSignal, iget, test, rmaProgress).
 *
 * A put is one PUT frame and its bytes, a put with a signal those and a
 * SIGNAL frame, a signal alone (size 0) the SIGNAL frame only, a get one GET
 * frame; each goes on the stream of its (context, peer) behind everything
 * posted before it, and NCCL's thread writes the streams without blocking
 * from post, test and rmaProgress. A put is done once its bytes are on the
 * socket (its source may be reused: NCCL's local completion); a get once
 * the applier landed the reply. To oneself, a put, a signal and a get are
 * memory copies and an add, done before post returns (rma_mem.c).
 *
 * A put of RMA_STRIPE_MIN bytes or more, where the collComm has lanes, is
 * striped instead (rma_tcp.h, Lanes): its stream carries a STRIPED frame,
 * numbered by the frames posted on the stream before it (its seq), and each
 * lane that carries some of its blocks gets a job (rma_lane.c); the put is
 * done once the frame and every job have left.
 *
 * A put out of a GPU window is sent in pieces through the stream's two
 * pinned pieces: while one is written to the socket, the copy of the next
 * runs on the context's own non-blocking stream, and is waited for before
 * that piece is written; the put is done once its last piece has left (its
 * source is then reusable: every copy out of it has ended).
 *
 * Every range is checked here before anything is sent: the source against
 * this rank's window, the destination against the peer's copy (its size
 * came with the registration). The target checks again (rma_apply.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "log.h"
#include "rail.h"
#include "rma/rma_tcp.h"
#include "thread.h"

#define RMA_REQS_PER_PEER 64	/* NCCL keeps 32 x maxRecvs (1) per (context, peer) */
#define RMA_REQS_MAX 65535	/* the API's request handle has 16 bits for the index */
#define RMA_SEND_PIECE (256u << 10)	/* a piece of a put out of the GPU; two per stream */

static const char *kind_call(const struct rma_req *r, int signal)
{
	return r->kind == RAIL_RMA_GET ? "iget" : signal ? "iputSignal" : "iput";
}

int rma_send_init(struct rma_tcp_ctx *x)
{
	int nranks = x->coll->base.nranks;
	size_t n = (size_t)x->base.ncontexts * (size_t)(nranks / x->base.stride + 1) *
		   RMA_REQS_PER_PEER;

	x->nreqs = (uint32_t)RAIL_MIN(n, RMA_REQS_MAX);
	x->reqs = calloc(x->nreqs, sizeof(*x->reqs));
	if (!x->reqs)
		return -ENOMEM;
	for (uint32_t i = 0; i < x->nreqs; i++)
		x->reqs[i].next = i + 1 < x->nreqs ? i + 1 : RMA_NONE;
	x->free_head = 0;
	pthread_mutex_init(&x->lock, NULL);
	return 0;
}

void rma_send_fini(struct rma_tcp_ctx *x)
{
	for (uint32_t i = 0; x->reqs && i < x->nreqs; i++)
		rma_gpu_event_free(&x->coll->gpu, x->reqs[i].ev);
	free(x->reqs);
	x->reqs = NULL;
	pthread_mutex_destroy(&x->lock);
}

static struct rma_stream *stream_of(struct rma_tcp_ctx *x, int context, int peer)
{
	return &x->streams[context * x->coll->base.nranks + peer];
}

/* The stream failed: every request still queued on it fails with err. */
static void stream_fail(struct rma_tcp_ctx *x, struct rma_stream *s, int context, int peer,
			int err)
{
	struct rma_tcp_coll *c = x->coll;

	RAIL_WARN("RMA (rank %d of %d, device %d): writing context %d's stream to %s: %s; every "
		  "operation of this context call to that rank fails", c->base.rank, c->base.nranks,
		  c->base.dev, context, RMA_PEER(&c->mesh, peer), RAIL_ERRSTR(err));
	s->err = err;
	rma_coll_fail(c, err);
	rma_peer_cut(x, peer);	/* its striped puts' lanes, and its other contexts */
	while (s->qhead != RMA_NONE) {
		struct rma_req *r = &x->reqs[s->qhead];

		s->qhead = r->next;
		rma_req_part(r, err);	/* a striped put fails once its lanes are done with it */
	}
	s->qtail = RMA_NONE;
}

/* The head request's bytes were all written. */
static void stream_pop(struct rma_tcp_ctx *x, struct rma_stream *s, struct rma_req *r)
{
	int st = RMA_REQ_QUEUED, broken;

	s->qhead = r->next;
	if (s->qhead == RMA_NONE)
		s->qtail = RMA_NONE;
	s->stage_at = s->stage_len = s->pre_len = 0;
	if (r->kind != RAIL_RMA_GET) {
		rma_req_part(r, 0);	/* done, unless a lane still sends its blocks */
		return;
	}
	/* A get waits for its reply, unless the applier found the stream broken meanwhile. */
	r->wait_ns = rail_now_ns();
	if (atomic_compare_exchange_strong(&r->state, &st, RMA_REQ_WAIT) &&
	    (broken = atomic_load(&s->broken))) {
		st = RMA_REQ_WAIT;
		atomic_store(&r->err, broken);
		atomic_compare_exchange_strong(&r->state, &st, RMA_REQ_FAILED);
	}
	(void)x;
}

/* Queue the copy of n GPU bytes at src into piece k, its event recorded behind it. */
static int stage_queue(struct rma_tcp_ctx *x, struct rma_stream *s, int k, const char *src,
		       size_t n)
{
	int err = rma_mem_stage_queue(&x->coll->gpu, x->stream, s->ev[k],
				      s->stage + (size_t)k * RMA_SEND_PIECE, src, n);

	s->queued_ns[k] = err ? 0 : rail_now_ns();
	return err;
}

/*
 * The GPU bytes of r from pos on, as an iov: 0; -EAGAIN while the copy of
 * their piece out of the GPU has not ended (NCCL's thread never waits for
 * the GPU here: the stream is tried again at the next progress); -errno.
 * A piece that becomes the current one has the copy of the one after it
 * queued at once. Both copies go on the context's one CUDA stream, in
 * order, so a copy into a piece whose bytes are all sent never races an
 * older one into it.
 */
static int stage_next(struct rma_tcp_ctx *x, struct rma_stream *s, const struct rma_req *r,
		      size_t pos, struct iovec *iov)
{
	const struct iovec *g = &r->iov[r->gpu_iov];
	const char *src = g->iov_base;
	int err = 0, k;

	if (pos < s->stage_at || pos >= s->stage_at + s->stage_len) {
		if (s->pre_len && pos >= s->pre_at && pos < s->pre_at + s->pre_len) {
			s->stage_cur ^= 1;
			s->stage_at = s->pre_at;
			s->stage_len = s->pre_len;
		} else {
			s->stage_len = RAIL_MIN(g->iov_len - pos, RMA_SEND_PIECE);
			s->stage_at = pos;
			err = stage_queue(x, s, s->stage_cur, src + pos, s->stage_len);
		}
		s->pre_len = 0;
		s->pre_at = s->stage_at + s->stage_len;
		if (!err && s->pre_at < g->iov_len) {
			size_t n = RAIL_MIN(g->iov_len - s->pre_at, RMA_SEND_PIECE);

			err = stage_queue(x, s, s->stage_cur ^ 1, src + s->pre_at, n);
			s->pre_len = err ? 0 : n;
		}
		if (err) {
			s->stage_len = 0;
			return err;
		}
	}
	k = s->stage_cur;
	if (s->queued_ns[k]) {
		err = rma_mem_stage_ready(&x->coll->gpu, s->ev[k], s->stage_len, s->queued_ns[k]);
		if (err <= 0)
			return err ? err : -EAGAIN;
		s->queued_ns[k] = 0;
	}
	iov->iov_base = s->stage + (size_t)k * RMA_SEND_PIECE + (pos - s->stage_at);
	iov->iov_len = s->stage_at + s->stage_len - pos;
	return 0;
}

/* Bytes of the head request left (or a request became the head): the stall clock restarts. */
static void stream_moved(struct rma_tcp_ctx *x, struct rma_stream *s, int context, int peer)
{
	uint64_t now = rail_now_ns();

	if (s->stall_warned) {
		RAIL_INFO(RAIL_LOG_NET, "RMA (rank %d of %d, device %d): context %d's stream to %s "
			  "moves again after %.1f s", x->coll->base.rank, x->coll->base.nranks,
			  x->coll->base.dev, context, RMA_PEER(&x->coll->mesh, peer),
			  (double)(now - s->stall_warned) / 1e9);
		s->stall_warned = 0;
	}
	s->moved_ns = now;
}

/* Write what the socket takes: 0, or -errno (the stream failed). */
static int stream_send(struct rma_tcp_ctx *x, struct rma_stream *s, int context, int peer)
{
	while (s->qhead != RMA_NONE) {
		struct rma_req *r = &x->reqs[s->qhead];
		struct iovec iov[3];
		struct msghdr msg = { .msg_iov = iov };
		size_t skip = r->sent;
		ssize_t n;

		for (int i = 0; i < r->niov; i++) {
			if (skip >= r->iov[i].iov_len) {
				skip -= r->iov[i].iov_len;
				continue;
			}
			if (i == r->gpu_iov) {
				int err = stage_next(x, s, r, skip, &iov[msg.msg_iovlen]);

				if (err && err != -EAGAIN) {
					stream_fail(x, s, context, peer, err);
					return err;
				}
				msg.msg_iovlen += !err;
				break;	/* what follows waits for these bytes */
			}
			iov[msg.msg_iovlen].iov_base = (char *)r->iov[i].iov_base + skip;
			iov[msg.msg_iovlen++].iov_len = r->iov[i].iov_len - skip;
			skip = 0;
		}
		if (!msg.msg_iovlen)
			return 0;	/* the head's bytes are still being copied out of the GPU */
		n = sendmsg(s->out_fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return 0;
		if (n < 0) {
			int err = -errno;

			stream_fail(x, s, context, peer, err);
			return err;
		}
		r->sent += (size_t)n;
		stream_moved(x, s, context, peer);
		if (r->sent < r->total)
			continue;
		stream_pop(x, s, r);
	}
	return 0;
}

static void progress_all(struct rma_tcp_ctx *x)
{
	int nranks = x->coll->base.nranks;

	for (int c = 0; c < x->base.ncontexts; c++) {
		for (int p = 0; p < nranks; p++) {
			struct rma_stream *s = stream_of(x, c, p);

			if (s->qhead != RMA_NONE && !s->err)
				stream_send(x, s, c, p);
		}
	}
}

static int range_refuse(struct rma_tcp_ctx *x, const struct rail_rma_op *op, const char *what,
			const struct rail_rma_mr *mr, uint64_t off, uint64_t len, uint64_t size)
{
	const struct rma_tcp_coll *c = x->coll;

	int misaligned = what[0] == 's' && off % 8;

	RAIL_WARN("RMA %s to %s (context %d, rank %d of %d, device %d): %s [%llu, +%llu) is "
		  "%s window %u (%llu bytes%s)%s", op->call, RMA_PEER(&c->mesh, op->peer),
		  op->context, c->base.rank, c->base.nranks, c->base.dev, what,
		  (unsigned long long)off, (unsigned long long)len,
		  misaligned ? "misaligned in" : "outside", mr->index, (unsigned long long)size,
		  what[0] == 'l' ? " here" : " at the target",
		  misaligned ? ": a signal is a 64-bit word at an offset multiple of 8" : "");
	return -EINVAL;
}

/* Every range of the operation inside its window (here, or the target's copy). */
static int op_check(struct rma_tcp_ctx *x, const struct rail_rma_op *op)
{
	const struct rma_win *rw = (const struct rma_win *)op->remote;
	const struct rma_win *sw = (const struct rma_win *)op->sig;

	if (op->size && !rma_in_bounds(op->local_off, op->size, op->local->size))
		return range_refuse(x, op, "local range", op->local, op->local_off, op->size,
				    op->local->size);
	if (op->size && !rma_in_bounds(op->remote_off, op->size, rw->peer_size[op->peer]))
		return range_refuse(x, op, "remote range", op->remote, op->remote_off, op->size,
				    rw->peer_size[op->peer]);
	if (sw && (op->sig_off % 8 || !rma_in_bounds(op->sig_off, 8, sw->peer_size[op->peer])))
		return range_refuse(x, op, "signal word", op->sig, op->sig_off, 8,
				    sw->peer_size[op->peer]);
	return 0;
}

static struct rma_req *req_get(struct rma_tcp_ctx *x, const struct rail_rma_op *op)
{
	const struct rma_tcp_coll *c = x->coll;
	struct rma_req *r;

	if (x->free_head == RMA_NONE) {
		RAIL_WARN("RMA %s to %s (context %d, rank %d of %d, device %d): %u requests are in "
			  "flight on this context, all it has: test them before posting more (NCCL's "
			  "NCCL_RMA_PROXY_QUEUE_SIZE or NCCL_GIN_PROXY_QUEUE_SIZE above %d?)", op->call,
			  RMA_PEER(&c->mesh, op->peer), op->context, c->base.rank, c->base.nranks,
			  c->base.dev, x->nreqs, RMA_REQS_PER_PEER);
		return NULL;
	}
	r = &x->reqs[x->free_head];
	x->free_head = r->next;
	x->stamp = (x->stamp + 1) & 0xffffff;
	r->stamp = x->stamp ? x->stamp : (x->stamp = 1);
	r->kind = op->kind;
	r->peer = op->peer;
	r->context = op->context;
	r->next = RMA_NONE;
	atomic_store(&r->parts, 1);
	r->niov = 0;
	r->gpu_iov = -1;
	r->sent = r->total = 0;
	r->dst = NULL;
	r->len = r->landed = 0;
	atomic_store(&r->stall_warned, 0);
	atomic_store(&r->err, 0);
	return r;
}

/*
 * To this rank itself: the copy and the add in program order (GPU copies
 * and signal writes on the collComm's stream, behind whatever the applier
 * queued there). Host memory only: done at once (1). With GPU memory an
 * event is recorded behind them and the request is done once test finds
 * it passed (0): NCCL's thread does not wait for the GPU here.
 */
static int op_self(struct rma_tcp_ctx *x, struct rma_req *r, const struct rail_rma_op *op)
{
	struct rma_gpu *g = &x->coll->gpu;
	const struct rma_win *lw = (const struct rma_win *)op->local;
	const struct rma_win *rw = (const struct rma_win *)op->remote;
	const struct rma_win *sw = (const struct rma_win *)op->sig;
	int err = 0;

	if (op->size && op->kind == RAIL_RMA_PUT)
		err = rma_mem_copy(g, rw, op->remote_off, lw, op->local_off, op->size);
	else if (op->size)
		err = rma_mem_copy(g, lw, op->local_off, rw, op->remote_off, op->size);
	if (!err && sw)
		err = rma_mem_signal(g, sw, op->sig_off, op->sig_add);
	if (err || !((lw && lw->gpu) || (rw && rw->gpu) || (sw && sw->gpu)))
		return err ? err : 1;
	if (!r->ev && rma_gpu_event(g, &r->ev))
		return -EIO;
	return rma_mem_mark(g, r->ev);
}

/* A put out of a GPU window needs the context's stream and the stream's staging. */
static int gpu_send_ready(struct rma_tcp_ctx *x, struct rma_stream *s)
{
	if (!x->stream && rma_gpu_stream(&x->coll->gpu, &x->stream))
		return -EIO;
	if (!s->stage && !(s->stage = rma_gpu_pinned(&x->coll->gpu, 2 * RMA_SEND_PIECE)))
		return -EIO;
	for (int k = 0; k < 2; k++)
		if (!s->ev[k] && rma_gpu_event(&x->coll->gpu, &s->ev[k]))
			return -EIO;
	return 0;
}

static void iov_add(struct rma_req *r, void *base, size_t len)
{
	r->iov[r->niov].iov_base = base;
	r->iov[r->niov++].iov_len = len;
	r->total += len;
}

/* The frames of an operation to a peer (striped: a STRIPED frame for the put): how many. */
static uint32_t op_frames(struct rma_req *r, const struct rail_rma_op *op, uint32_t idx,
			  int striped)
{
	struct rma_frame f = { .off = op->remote_off, .len = op->size };

	if (op->kind == RAIL_RMA_GET && !op->size)
		return 0;	/* nothing to read: done at once */
	if (op->kind == RAIL_RMA_GET) {
		f.op = RMA_OP_GET;
		f.win = op->remote->index;
		f.id = (uint64_t)r->stamp << 32 | idx;
		r->dst = op->local->base + op->local_off;
		r->len = op->size;
		r->dst_win = op->local->index;
		rma_frame_encode(&f, r->hdr[0]);
		iov_add(r, r->hdr[0], RMA_FRAME_SIZE);
		return 1;
	}
	if (op->size) {
		f.op = striped ? RMA_OP_STRIPED : RMA_OP_PUT;
		f.win = op->remote->index;
		rma_frame_encode(&f, r->hdr[0]);
		iov_add(r, r->hdr[0], RMA_FRAME_SIZE);
		if (!striped)
			iov_add(r, op->local->base + op->local_off, op->size);
		if (!striped && ((const struct rma_win *)op->local)->gpu)
			r->gpu_iov = r->niov - 1;	/* never read here: staged as it is sent */
	}
	if (op->sig) {
		f = (struct rma_frame){ .op = RMA_OP_SIGNAL, .win = op->sig->index,
					.off = op->sig_off, .len = op->sig_add };
		rma_frame_encode(&f, r->hdr[1]);
		iov_add(r, r->hdr[1], RMA_FRAME_SIZE);
	}
	return (op->size != 0) + (op->sig != NULL);
}

/* A put striped over the lanes to its peer (rma_tcp.h, Lanes)? */
static int op_striped(const struct rma_tcp_ctx *x, const struct rail_rma_op *op)
{
	return op->kind == RAIL_RMA_PUT && op->size >= RMA_STRIPE_MIN && x->coll->nlanes &&
	       x->lane_out && x->lane_out[op->peer] >= 0;
}

/* One job per lane that carries blocks of the put, each a part of its request. */
static void op_lanes(struct rma_tcp_ctx *x, struct rma_req *r, const struct rail_rma_op *op,
		     uint32_t idx, uint32_t seq)
{
	struct rma_lane_job j = { .x = x, .req = idx, .peer = op->peer, .context = op->context,
				  .win = op->remote->index, .seq = seq,
				  .src = op->local->base + op->local_off,
				  .gpu = ((const struct rma_win *)op->local)->gpu,
				  .off = op->remote_off, .len = op->size };
	int nlanes = x->coll->nlanes, used[RMA_LANES_MAX], n = 0;

	for (int l = 0; l < nlanes; l++) {
		if (rma_lane_blocks(op->remote_off, op->size, l, nlanes))
			used[n++] = l;
	}
	atomic_fetch_add(&r->parts, n);
	atomic_fetch_add(&x->coll->striped, 1);
	atomic_fetch_add(&x->coll->striped_bytes, op->size);
	for (int i = 0; i < n; i++)
		rma_lane_post(x->coll, used[i], &j);
}

/* Queue a remote operation behind what its stream holds, and write what it can. */
static int op_queue(struct rma_tcp_ctx *x, struct rma_req *r, const struct rail_rma_op *op,
		    uint32_t idx)
{
	struct rma_stream *s = stream_of(x, op->context, op->peer);
	int broken = atomic_load(&s->broken), err = s->err ? s->err : broken, striped;
	uint32_t frames, seq;

	if (err) {
		RAIL_WARN("RMA %s to %s (context %d, device %d): the stream to it failed earlier "
			  "(%s)", kind_call(r, op->sig != NULL), RMA_PEER(&x->coll->mesh, op->peer),
			  op->context, x->coll->base.dev, RAIL_ERRSTR(err));
		return err;
	}
	striped = op_striped(x, op);
	frames = op_frames(r, op, idx, striped);
	x->gets += op->kind == RAIL_RMA_GET;
	if (r->gpu_iov >= 0 && (err = gpu_send_ready(x, s)))
		return err;
	seq = s->frames;
	s->frames += frames;
	if (!r->total) {
		atomic_store(&r->state, RMA_REQ_DONE);	/* a put of nothing, with no signal */
		return 0;
	}
	atomic_store(&r->state, RMA_REQ_QUEUED);
	if (s->qtail == RMA_NONE) {
		s->qhead = idx;
		stream_moved(x, s, op->context, op->peer);
	} else
		x->reqs[s->qtail].next = idx;
	s->qtail = idx;
	if (striped)
		op_lanes(x, r, op, idx, seq);
	stream_send(x, s, op->context, op->peer);
	return 0;
}

int rma_send_post(struct rma_tcp_ctx *x, const struct rail_rma_op *op, uint32_t *idx,
		  uint32_t *stamp)
{
	struct rma_req *r;
	uint32_t i;
	int err;

	pthread_mutex_lock(&x->lock);
	err = op_check(x, op);
	r = err ? NULL : req_get(x, op);
	if (!err && !r)
		err = -ENOSPC;
	if (err) {
		pthread_mutex_unlock(&x->lock);
		return err;
	}
	i = (uint32_t)(r - x->reqs);
	if (op->peer == x->coll->base.rank && (err = op_self(x, r, op)) >= 0) {
		if (!err) {	/* the stall check names it if the GPU never runs it */
			r->wait_ns = rail_now_ns();
			x->self_gpu = 1;
		}
		atomic_store(&r->state, err ? RMA_REQ_DONE : RMA_REQ_GPU);
		err = 0;
	} else if (err || (err = op_queue(x, r, op, i))) {
		r->next = x->free_head;
		x->free_head = i;
		pthread_mutex_unlock(&x->lock);
		return err;
	}
	*idx = i;
	*stamp = r->stamp;
	pthread_mutex_unlock(&x->lock);
	return 0;
}

/* ---- the stall check (NCCL_RAIL_RMA_STALL_WARN) ---- */

/* The head request of this rank's stream to the peer has not moved for the limit. */
static void watch_out(struct rma_tcp_ctx *x, struct rma_stream *s, int context, int peer,
		      uint64_t now)
{
	const struct rma_tcp_coll *c = x->coll;
	const struct rma_req *r;
	uint32_t behind = 0;
	char why[192];
	int signal;

	if (s->qhead == RMA_NONE || s->err || now < s->moved_ns ||
	    now - s->moved_ns < c->stall_ns || s->stall_warned == s->moved_ns)
		return;
	r = &x->reqs[s->qhead];
	signal = r->niov && r->iov[r->niov - 1].iov_base == (void *)r->hdr[1];
	for (uint32_t i = r->next; i != RMA_NONE; i = x->reqs[i].next)
		behind++;
	s->stall_warned = s->moved_ns;
	if (s->stage_len && s->queued_ns[s->stage_cur])
		snprintf(why, sizeof(why), "the GPU has not run the plugin's copy of its source out "
			 "of GPU memory (queued %.0f s ago); look for kernels that keep the GPU busy",
			 (double)(now - s->queued_ns[s->stage_cur]) / 1e9);
	else
		snprintf(why, sizeof(why), "the target does not read this stream; "
			 RMA_STALL_AT_TARGET);
	RAIL_WARN("RMA %s to %s (context %d, rank %d of %d, device %d): no byte of it has left "
		  "for %.0f s (%zu of its %zu bytes written, %u operations queued behind it): %s",
		  kind_call(r, signal), RMA_PEER(&c->mesh, peer), context, c->base.rank,
		  c->base.nranks, c->base.dev, (double)(now - s->moved_ns) / 1e9, r->sent, r->total,
		  behind, why);
}

/* Is this park (bit of gate_warned, since when) past the limit, and not yet logged? */
static int gate_overdue(const struct rma_tcp_ctx *x, struct rma_stream *s, uint32_t bit,
			uint64_t since, uint64_t now)
{
	return since && now >= since && now - since >= x->coll->stall_ns &&
	       !(atomic_fetch_or(&s->gate_warned, bit) & bit);
}

/* The peer's stream, or a lane's block for it, held at its gate here for the limit. */
static void watch_in(struct rma_tcp_ctx *x, struct rma_stream *s, int context, int peer,
		     uint64_t now)
{
	const struct rma_tcp_coll *c = x->coll;
	uint32_t mask = atomic_load(&s->lanes_parked);
	char landed[8 * 12] = "", *p = landed;

	if (atomic_load(&s->main_parked) &&
	    gate_overdue(x, s, rma_gate_bit(-1), atomic_load(&s->main_parked_ns), now)) {
		for (int l = 0; l < c->nlanes; l++)
			p += snprintf(p, sizeof(landed) - (size_t)(p - landed), "%s%u", l ? " " : "",
				      atomic_load(&s->landed[l]));
		RAIL_WARN("RMA (rank %d of %d, device %d): context %d's stream from %s has waited "
			  "%.0f s at its gate for the blocks of striped puts before its next frame "
			  "(blocks landed so far, per lane: %s): the peer's lanes have not sent them, "
			  "or this rank's lane threads cannot land them (a GPU line above says why)",
			  c->base.rank, c->base.nranks, c->base.dev, context, RMA_PEER(&c->mesh, peer),
			  (double)(now - atomic_load(&s->main_parked_ns)) / 1e9, landed);
	}
	for (int l = 0; mask && l < c->nlanes; l++) {
		uint64_t since = atomic_load(&s->lane_parked_ns[l]);

		if (!(mask & (1u << l)) || !gate_overdue(x, s, rma_gate_bit(l), since, now))
			continue;
		RAIL_WARN("RMA (rank %d of %d, device %d): lane %d from %s has waited %.0f s at its "
			  "gate for context %d's stream to reach the striped put its block belongs "
			  "to (%u frames of that stream applied): the frames before it have not "
			  "arrived, or are held themselves", c->base.rank, c->base.nranks, c->base.dev,
			  l, RMA_PEER(&c->mesh, peer), (double)(now - since) / 1e9, context,
			  atomic_load(&s->reached));
	}
}

/*
 * Requests past the limit: gets whose reply has not come (their request has
 * left), and GPU operations to this rank itself the GPU has not run.
 */
static void watch_reqs(struct rma_tcp_ctx *x, uint64_t now)
{
	const struct rma_tcp_coll *c = x->coll;

	for (uint32_t i = 0; (x->gets || x->self_gpu) && i < x->nreqs; i++) {
		struct rma_req *r = &x->reqs[i];
		int st = atomic_load(&r->state), no = 0;

		if ((st != RMA_REQ_GPU && (st != RMA_REQ_WAIT || r->kind != RAIL_RMA_GET)) ||
		    now < r->wait_ns || now - r->wait_ns < c->stall_ns ||
		    !atomic_compare_exchange_strong(&r->stall_warned, &no, 1))
			continue;
		if (st == RMA_REQ_GPU) {
			RAIL_WARN("RMA %s to this rank itself (context %d, rank %d of %d, device %d): "
				  "not done after %.0f s: the GPU has not run its copy and signal on "
				  "the plugin's CUDA stream; look for kernels that keep the GPU busy",
				  r->kind == RAIL_RMA_GET ? "iget" : "iput", r->context, c->base.rank,
				  c->base.nranks, c->base.dev, (double)(now - r->wait_ns) / 1e9);
			continue;
		}
		RAIL_WARN("RMA iget of %zu bytes from %s (context %d, rank %d of %d, device %d): no "
			  "reply for %.0f s: the target has not answered it; " RMA_STALL_AT_TARGET, r->len,
			  RMA_PEER(&c->mesh, r->peer), r->context, c->base.rank, c->base.nranks,
			  c->base.dev, (double)(now - r->wait_ns) / 1e9);
	}
}

/* One context's streams and its collComm's GPU calls (the watcher thread, x->lock free). */
static void watch_ctx(struct rma_tcp_ctx *x, uint64_t now)
{
	int nranks = x->coll->base.nranks;

	rma_mem_watch(&x->coll->gpu, now, x->coll->stall_ns);
	if (pthread_mutex_trylock(&x->lock))
		return;	/* NCCL's thread is in a call: the GPU line says where, if anywhere */
	now = rail_now_ns();	/* after the lock: no stamp below is later than it */
	for (int k = 0; k < x->base.ncontexts; k++) {
		for (int p = 0; p < nranks; p++) {
			struct rma_stream *s = stream_of(x, k, p);

			if (s->out_fd >= 0)
				watch_out(x, s, k, p, now);
			if (s->in_fd >= 0)
				watch_in(x, s, k, p, now);
		}
	}
	watch_reqs(x, now);
	pthread_mutex_unlock(&x->lock);
}

/*
 * The watcher: one thread per process while any context with the check on
 * lives, waking once a second. Not NCCL's thread, which may itself be held
 * in a CUDA call (an operation to its own rank).
 */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct rma_tcp_ctx **v;
	int n, cap;
	int running, stopping;
	pthread_t thread;
} watcher = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void *watch_main(void *arg)
{
	(void)arg;
	rail_thread_name("rail-rma-watch");
	pthread_mutex_lock(&watcher.mu);
	while (!watcher.stopping) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&watcher.cv, &watcher.mu, &ts);
		for (int i = 0; !watcher.stopping && i < watcher.n; i++)
			watch_ctx(watcher.v[i], rail_now_ns());
	}
	pthread_mutex_unlock(&watcher.mu);
	return NULL;
}

/* With watcher.mu held. */
static int watch_start(void)
{
	int err = -pthread_create(&watcher.thread, NULL, watch_main, NULL);

	watcher.running = !err;
	if (err)
		RAIL_WARN("RMA: starting the stall check's thread: %s; waits are not named "
			  "(NCCL_RAIL_RMA_STALL_WARN)", RAIL_ERRSTR(err));
	return err;
}

void rma_watch_add(struct rma_tcp_ctx *x)
{
	if (!x->coll->stall_ns)
		return;
	pthread_mutex_lock(&watcher.mu);
	if (watcher.n == watcher.cap) {
		int cap = watcher.cap ? 2 * watcher.cap : 8;
		struct rma_tcp_ctx **v = realloc(watcher.v, (size_t)cap * sizeof(*v));

		if (!v) {
			pthread_mutex_unlock(&watcher.mu);
			return;	/* this context goes unwatched */
		}
		watcher.v = v;
		watcher.cap = cap;
	}
	watcher.v[watcher.n++] = x;
	x->watched = 1;
	if (!watcher.running)
		watch_start();
	pthread_mutex_unlock(&watcher.mu);
}

void rma_watch_remove(struct rma_tcp_ctx *x)
{
	if (!x->watched)
		return;
	pthread_mutex_lock(&watcher.mu);
	for (int i = 0; i < watcher.n; i++) {
		if (watcher.v[i] == x) {
			watcher.v[i] = watcher.v[--watcher.n];
			break;
		}
	}
	x->watched = 0;
	if (!watcher.n && watcher.running && !watcher.stopping) {
		pthread_t t = watcher.thread;

		watcher.stopping = 1;
		pthread_cond_broadcast(&watcher.cv);
		pthread_mutex_unlock(&watcher.mu);
		pthread_join(t, NULL);
		pthread_mutex_lock(&watcher.mu);
		watcher.running = watcher.stopping = 0;
		if (watcher.n)
			watch_start();	/* a context came meanwhile */
	}
	if (!watcher.n) {
		free(watcher.v);
		watcher.v = NULL;
		watcher.cap = 0;
	}
	pthread_mutex_unlock(&watcher.mu);
}

int rma_send_test(struct rma_tcp_ctx *x, uint32_t idx, uint32_t stamp, int *done)
{
	struct rma_req *r;
	int st, err = 0;

	pthread_mutex_lock(&x->lock);
	progress_all(x);
	r = idx < x->nreqs ? &x->reqs[idx] : NULL;
	st = r ? atomic_load(&r->state) : RMA_REQ_FREE;
	if (st == RMA_REQ_GPU && r->stamp == stamp) {
		int passed = rma_gpu_passed(&x->coll->gpu, r->ev);

		if (passed < 0)
			atomic_store(&r->err, passed);
		st = passed < 0 ? RMA_REQ_FAILED : passed ? RMA_REQ_DONE : RMA_REQ_GPU;
	}
	if (!r || st == RMA_REQ_FREE || r->stamp != stamp) {
		pthread_mutex_unlock(&x->lock);
		RAIL_WARN("RMA test (rank %d of %d, device %d): request %u.%u is not in flight "
			  "(tested again after it completed?)", x->coll->base.rank,
			  x->coll->base.nranks, x->coll->base.dev, idx, stamp);
		return -EINVAL;
	}
	*done = st == RMA_REQ_DONE || st == RMA_REQ_FAILED;
	if (st == RMA_REQ_FAILED)
		err = atomic_load(&r->err);
	if (*done) {
		atomic_store(&r->state, RMA_REQ_FREE);
		r->next = x->free_head;
		x->free_head = idx;
	}
	pthread_mutex_unlock(&x->lock);
	return err;
}

int rma_send_progress(struct rma_tcp_ctx *x)
{
	pthread_mutex_lock(&x->lock);
	progress_all(x);
	pthread_mutex_unlock(&x->lock);
	return 0;
}
