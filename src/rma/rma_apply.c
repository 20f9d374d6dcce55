/*
 * nccl-net-rail: the target side of the TCP RMA backend (rma_tcp.h): one
 * main applier thread per collComm for the streams, and one per lane.
 *
 * It waits in epoll on every socket of the group's contexts and an eventfd
 * for commands. On a peer's stream (TARGET) it reads frames in order: a put's
 * bytes go straight into a host window, or through pinned staging and the
 * collComm's stream into a GPU one, a signal is a 64-bit add written behind
 * them (rma_mem.c: never visible before the bytes of the puts before it), a get
 * is answered on the same socket the other way (while a reply is being
 * written the stream is not read further: one answer in flight per stream,
 * and this thread never blocks on a write). On this rank's own streams
 * (REPLIES) it lands the answers to its gets and completes them.
 *
 * A lane's thread reads the blocks of striped puts from every peer's lane
 * and lands them as puts. Each frame read is held until its gate is open
 * (rma_tcp.h, Lanes): a stream's frame until every block announced before
 * it landed, a block until its STRIPED frame was reached. A reader whose
 * gate is shut flags the stream, leaves epoll and waits in its thread's
 * parked list; the thread that lands the block or reaches the frame it
 * waits for sees the flag and wakes the parked reader's thread (eventfd),
 * which looks at its gates again.
 *
 * Every frame is checked before memory is touched: its window must be live
 * in this rank's table, the range inside it, a signal 8-byte aligned. A
 * frame that fails its check is logged (the peer, the call, the window and
 * its size) and the stream is shut down, so that the peer's later writes
 * fail and its requests with them; nothing is written. A stream that ends
 * between frames is a peer that destroyed its context: quietly dropped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "rail.h"
#include "rma/rma_tcp.h"
#include "thread.h"

#define RMA_APPLY_BUDGET (8u << 20)	/* bytes read from one socket per wake-up */
#define RMA_APPLY_CHUNK (4u << 20)	/* bytes per recv/send into or out of a window */
#define RMA_LAND_PIECE (256u << 10)	/* bytes staged per HtoD copy into a GPU window */

/* One applier thread: the main one (every stream), or a lane's. */
struct rma_applier {
	struct rma_tcp_coll *c;	/* set when started */
	pthread_t thread;
	int started;
	int epfd;
	int evfd;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	struct rma_tcp_ctx *remove;	/* the command: stop reading this context */
	int stop;
	uint64_t cmd, ack;
	atomic_int wake;	/* a gate may have opened: look at the parked readers */
	struct rma_rx **parked;	/* readers whose frame waits for its gate */
	int nparked, capparked;
	struct rma_ring ring;	/* a lane's staging into GPU windows */
};

static struct rma_applier *ap_of(struct rma_tcp_coll *c, const struct rma_rx *rx)
{
	return &c->ap[rx->role == RMA_RX_LANE ? 1 + rx->lane : 0];
}

/* Wake the thread out of epoll_wait (its eventfd). */
static void ap_kick(struct rma_applier *ap)
{
	uint64_t one = 1;

	if (write(ap->evfd, &one, sizeof(one)) < 0) {
		/* the counter is full: the thread has a wake-up pending anyway */
	}
}

/* A gate may have opened: the thread looks at its parked readers. */
static void ap_wake(struct rma_applier *ap)
{
	atomic_store(&ap->wake, 1);
	ap_kick(ap);
}

static struct rma_stream *rx_stream(const struct rma_rx *rx)
{
	return &rx->ctx->streams[rx->context * rx->ctx->coll->base.nranks + rx->peer];
}

static const char *rx_call(int op)
{
	return op == RMA_OP_PUT || op == RMA_OP_STRIPED ? "iput" : op == RMA_OP_SIGNAL
	       ? "iputSignal" : "iget";
}

/* The context a reader's frame belongs to (a lane's block names its own). */
static int rx_context(const struct rma_rx *rx)
{
	return rx->role == RMA_RX_LANE ? (int)(rx->f.id >> 32) : rx->context;
}

/* r is a get of this rank whose reply comes on rx (a replies stream): its peer and context. */
static int get_of_stream(const struct rma_req *r, const struct rma_rx *rx)
{
	return r->kind == RAIL_RMA_GET && r->peer == rx->peer && r->context == rx->context;
}

/*
 * Gets of this stream waiting for a reply fail with err (the stream broke).
 * Under the poster's lock, as gets_waiting: a slot read here is not freed
 * and reused meanwhile.
 */
static void rx_fail_gets(struct rma_rx *rx, int err)
{
	struct rma_tcp_ctx *x = rx->ctx;

	atomic_store(&rx_stream(rx)->broken, err);
	pthread_mutex_lock(&x->lock);
	for (uint32_t i = 0; i < x->nreqs; i++) {
		struct rma_req *r = &x->reqs[i];
		int st = RMA_REQ_WAIT;

		if (atomic_load(&r->state) != RMA_REQ_WAIT || !get_of_stream(r, rx))
			continue;
		atomic_store(&r->err, err);
		atomic_compare_exchange_strong(&r->state, &st, RMA_REQ_FAILED);
	}
	pthread_mutex_unlock(&x->lock);
}

static void rx_drop(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	rx->dead = 1;
	epoll_ctl(ap_of(c, rx)->epfd, EPOLL_CTL_DEL, rx->fd, NULL);
}

/* A lane from the peer failed: the peer's streams that wait for its blocks fail too. */
static void lane_failed(struct rma_tcp_coll *c, struct rma_rx *rx, int err)
{
	struct rma_tcp_ctx *x = rx->ctx;

	for (int k = 0; k < x->base.ncontexts; k++) {
		struct rma_stream *s = &x->streams[k * c->base.nranks + rx->peer];
		int none = 0;

		atomic_compare_exchange_strong(&s->lane_err, &none, err);
		if (atomic_load(&s->main_parked))
			ap_wake(&c->ap[0]);
	}
}

/* The stream failed (err already logged where it was understood). */
static void rx_fail(struct rma_tcp_coll *c, struct rma_rx *rx, int err)
{
	rx_drop(c, rx);
	shutdown(rx->fd, SHUT_RDWR);	/* the peer's writes, and this rank's, fail from now on */
	rma_coll_fail(c, err);
	rma_peer_cut(rx->ctx, rx->peer);	/* and every other writer to that peer */
	if (rx->role == RMA_RX_REPLIES)
		rx_fail_gets(rx, err);
	if (rx->role == RMA_RX_LANE)
		lane_failed(c, rx, err);
}

/* This rank's gets still waiting for a reply on a replies stream (under the poster's lock). */
static int gets_waiting(const struct rma_rx *rx)
{
	int waiting = 0;

	pthread_mutex_lock(&rx->ctx->lock);
	for (uint32_t i = 0; i < rx->ctx->nreqs; i++) {
		const struct rma_req *r = &rx->ctx->reqs[i];
		int st = atomic_load(&r->state);

		if (st == RMA_REQ_QUEUED || st == RMA_REQ_WAIT)
			waiting += get_of_stream(r, rx);
	}
	pthread_mutex_unlock(&rx->ctx->lock);
	return waiting;
}

/* End of stream between frames. */
static int rx_closed(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	int waiting = rx->role == RMA_RX_REPLIES ? gets_waiting(rx) : 0;

	/* A stream still waiting for blocks of this lane never gets them: it fails (its gate says). */
	if (rx->role == RMA_RX_LANE)
		lane_failed(c, rx, -RAIL_ECLOSED);
	if (!waiting) {
		rx_drop(c, rx);	/* the peer destroyed its context */
		return 0;
	}
	rx->logged = 1;
	RAIL_WARN("RMA iget (rank %d of %d, device %d): %s closed context %d with %d gets of "
		  "this rank unanswered", c->base.rank, c->base.nranks, c->base.dev,
		  RMA_PEER(&c->mesh, rx->peer), rx->context, waiting);
	return -RAIL_ECLOSED;
}

enum { REF_OUTSIDE, REF_UNKNOWN, REF_MISALIGNED, REF_GONE };

/* A frame that must not touch memory: log it (the stream is then closed). */
static int frame_refuse(struct rma_tcp_coll *c, struct rma_rx *rx, int why,
			const struct rma_win *w)
{
	const struct rma_frame *f = &rx->f;
	unsigned long long size = w ? (unsigned long long)w->base.size : 0;
	char what[96];

	if (why == REF_OUTSIDE)
		snprintf(what, sizeof(what), "is outside window %u (%llu bytes)", f->win, size);
	else if (why == REF_MISALIGNED)
		snprintf(what, sizeof(what), "is not 8-byte aligned in window %u", f->win);
	else if (why == REF_UNKNOWN)
		snprintf(what, sizeof(what), "names window %u, not registered here", f->win);
	else
		snprintf(what, sizeof(what), "is in window %u, deregistered meanwhile", f->win);
	rx->logged = 1;
	RAIL_WARN("RMA %s from %s (context %d) refused on rank %d of %d, device %d: %s of %llu "
		  "bytes at offset %llu %s; %s", rx_call(f->op),
		  RMA_PEER(&c->mesh, rx->peer), rx_context(rx), c->base.rank, c->base.nranks,
		  c->base.dev, f->op == RMA_OP_SIGNAL ? "a signal" : f->op == RMA_OP_GET ? "a get"
		  : "a put", f->op == RMA_OP_SIGNAL ? 8ull : (unsigned long long)f->len,
		  (unsigned long long)f->off, what, f->op == RMA_OP_GET
		  ? "answered with an error" : "the stream is closed");
	return -EFAULT;
}

/* A signal: a 64-bit add at a checked, aligned offset (behind the bytes before it). */
static int frame_signal(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	const struct rma_frame *f = &rx->f;
	struct rma_win *w;
	int err = 0;

	pthread_rwlock_rdlock(&c->wins.lock);
	w = rma_wins_get(&c->wins, f->win);
	if (!w || f->off % 8 || !rma_in_bounds(f->off, 8, w->base.size))
		err = frame_refuse(c, rx, !w ? REF_UNKNOWN : f->off % 8 ? REF_MISALIGNED
				   : REF_OUTSIDE, w);
	else if ((err = rma_mem_signal(&c->gpu, w, f->off, f->len)))
		rx->logged = 1;
	pthread_rwlock_unlock(&c->wins.lock);
	return err;
}

/* A get: answer it (or refuse it with a status: a get writes nothing here). */
static int frame_get(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	const struct rma_frame *f = &rx->f;
	struct rma_frame r = { .op = RMA_OP_REPLY, .id = f->id, .len = f->len };
	struct epoll_event ev = { .events = EPOLLOUT, .data.ptr = rx };
	struct rma_win *w;

	pthread_rwlock_rdlock(&c->wins.lock);
	w = rma_wins_get(&c->wins, f->win);
	if (!w || !rma_in_bounds(f->off, f->len, w->base.size)) {
		frame_refuse(c, rx, !w ? REF_UNKNOWN : REF_OUTSIDE, w);
		r.status = EFAULT;
		r.len = 0;
	}
	pthread_rwlock_unlock(&c->wins.lock);
	rma_frame_encode(&r, rx->rhdr);
	rx->rwin = f->win;
	rx->roff = f->off;
	rx->rlen = r.len;
	rx->rsent = 0;
	rx->rstage_at = rx->rstage_len = 0;
	rx->replying = 1;
	return epoll_ctl(ap_of(c, rx)->epfd, EPOLL_CTL_MOD, rx->fd, &ev) ? -errno : 0;
}

/*
 * The get of this rank that the reply's id names, waiting for it from the
 * stream's peer and context, or NULL. Under the poster's lock, as
 * gets_waiting: a slot read here is not freed and reused meanwhile, and a
 * get whose request is written is already WAIT (stream_pop, same lock), so
 * a reply to a request not yet sent names no get. Once found, the get stays
 * WAIT until this thread completes it (or fails it, rx_fail_gets).
 */
static struct rma_req *reply_get(const struct rma_rx *rx)
{
	const struct rma_frame *f = &rx->f;
	struct rma_tcp_ctx *x = rx->ctx;
	uint32_t idx = (uint32_t)f->id, stamp = (uint32_t)(f->id >> 32);
	struct rma_req *r = idx < x->nreqs ? &x->reqs[idx] : NULL;

	pthread_mutex_lock(&x->lock);
	if (r && (atomic_load(&r->state) != RMA_REQ_WAIT || r->stamp != stamp ||
		  !get_of_stream(r, rx) || (f->status ? f->len != 0 : f->len != r->len)))
		r = NULL;
	pthread_mutex_unlock(&x->lock);
	return r;
}

/* A reply to one of this rank's gets: find the request it answers. */
static int frame_reply(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	const struct rma_frame *f = &rx->f;
	struct rma_req *r = reply_get(rx);

	if (!r) {
		rx->logged = 1;
		RAIL_WARN("RMA iget (rank %d of %d, device %d): %s sent a reply for no get of this "
			  "rank waiting on context %d (id 0x%llx, %llu bytes); the stream is closed",
			  c->base.rank, c->base.nranks, c->base.dev, RMA_PEER(&c->mesh, rx->peer),
			  rx->context, (unsigned long long)f->id, (unsigned long long)f->len);
		return -EPROTO;
	}
	if (atomic_exchange(&r->stall_warned, 0))	/* the stall check logged it */
		RAIL_INFO(RAIL_LOG_NET, "RMA iget of %zu bytes from %s (context %d, device %d): its "
			  "reply came after %.1f s", r->len, RMA_PEER(&c->mesh, rx->peer),
			  rx->context, c->base.dev, (double)(rail_now_ns() - r->wait_ns) / 1e9);
	if (f->status) {
		RAIL_WARN("RMA iget of %zu bytes from %s (context %d, device %d): the target refused "
			  "it: %s", r->len, RMA_PEER(&c->mesh, rx->peer), rx->context, c->base.dev,
			  RAIL_ERRSTR(-f->status));
		atomic_store(&r->err, -f->status);
		atomic_store(&r->state, RMA_REQ_FAILED);
		return 0;
	}
	rx->in_body = 1;
	rx->body_got = 0;
	rx->body_gpu = 0;
	return 0;
}

/* ---- the gates (rma_tcp.h, Lanes) ---- */

/* The stream whose gate the reader's frame passes (a lane: its block's context's). */
static struct rma_stream *gate_stream(const struct rma_rx *rx)
{
	return &rx->ctx->streams[rx_context(rx) * rx->ctx->coll->base.nranks + rx->peer];
}

/* A frame of the peer's stream was applied: lanes waiting for it may go on. */
static void frame_reached(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	struct rma_stream *s = rx_stream(rx);
	uint32_t mask;

	atomic_fetch_add(&s->reached, 1);
	mask = atomic_load(&s->lanes_parked);
	for (int l = 0; mask && l < c->nlanes; l++) {
		if (mask & (1u << l))
			ap_wake(&c->ap[1 + l]);
	}
}

/* A lane's block landed: the stream waiting for it may go on. */
static void block_landed(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	struct rma_stream *s = gate_stream(rx);

	atomic_fetch_add(&s->landed[rx->lane], 1);
	if (atomic_load(&s->main_parked))
		ap_wake(&c->ap[0]);
}

/* 1: the held frame may be applied, 0: it waits, -errno: it never will (a lane failed). */
static int gate_open(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	struct rma_stream *s;

	if (rx->role == RMA_RX_REPLIES)
		return 1;
	s = gate_stream(rx);
	if (rx->role == RMA_RX_LANE)
		return (int32_t)(atomic_load(&s->reached) - (uint32_t)rx->f.id) > 0;
	if (rx->f.op == RMA_OP_STRIPED)
		return 1;
	for (int l = 0; l < c->nlanes; l++) {
		if ((int32_t)(atomic_load(&s->landed[l]) - s->expected[l]) < 0) {
			int err = atomic_load(&s->lane_err);

			return err ? err : 0;
		}
	}
	return 1;
}

static void gate_unflag(struct rma_rx *rx)
{
	struct rma_stream *s = gate_stream(rx);
	struct rma_tcp_coll *c = rx->ctx->coll;
	uint32_t bit = rma_gate_bit(rx->lane);
	uint64_t since;

	if (rx->role == RMA_RX_LANE) {
		atomic_fetch_and(&s->lanes_parked, ~(1u << rx->lane));
		since = atomic_load(&s->lane_parked_ns[rx->lane]);
	} else {
		atomic_store(&s->main_parked, 0);
		since = atomic_load(&s->main_parked_ns);
	}
	if (atomic_fetch_and(&s->gate_warned, ~bit) & bit)	/* the stall check logged it */
		RAIL_INFO(RAIL_LOG_NET, "RMA (rank %d of %d, device %d): %s from %s goes on after "
			  "%.1f s at its gate", c->base.rank, c->base.nranks, c->base.dev,
			  rx->role == RMA_RX_LANE ? "a lane's block" : "a stream's frame",
			  RMA_PEER(&c->mesh, rx->peer), (double)(rail_now_ns() - since) / 1e9);
}

/*
 * The held frame's gate is closed: flag the stream (the thread that opens
 * it then wakes this one), look once more, and sleep out of epoll. 1: it
 * opened meanwhile, 0: parked, -errno.
 */
static int gate_park(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	struct rma_applier *ap = ap_of(c, rx);
	int open;

	/* a log of an earlier park that ended as it was logged must not hide this one */
	atomic_fetch_and(&gate_stream(rx)->gate_warned, ~rma_gate_bit(rx->lane));
	if (rx->role == RMA_RX_LANE) {
		atomic_store(&gate_stream(rx)->lane_parked_ns[rx->lane], rail_now_ns());
		atomic_fetch_or(&gate_stream(rx)->lanes_parked, 1u << rx->lane);
	} else {
		atomic_store(&gate_stream(rx)->main_parked_ns, rail_now_ns());
		atomic_store(&gate_stream(rx)->main_parked, 1);
	}
	open = gate_open(c, rx);
	if (open) {
		gate_unflag(rx);
		return open;
	}
	if (ap->nparked == ap->capparked) {
		int cap = ap->capparked ? 2 * ap->capparked : 16;
		struct rma_rx **v = realloc(ap->parked, (size_t)cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		ap->parked = v;
		ap->capparked = cap;
	}
	ap->parked[ap->nparked++] = rx;
	rx->parked = 1;
	epoll_ctl(ap->epfd, EPOLL_CTL_DEL, rx->fd, NULL);
	return 0;
}

static void rx_service(struct rma_tcp_coll *c, struct rma_rx *rx, uint32_t events);

/* Woken: every parked reader whose gate opened reads on. */
static void gate_wake(struct rma_applier *ap)
{
	struct rma_tcp_coll *c = ap->c;

	for (int i = 0; i < ap->nparked;) {
		struct rma_rx *rx = ap->parked[i];
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = rx };
		int open = rx->dead ? 1 : gate_open(c, rx);

		if (!open) {
			i++;
			continue;
		}
		ap->parked[i] = ap->parked[--ap->nparked];
		rx->parked = 0;
		if (rx->dead)
			continue;
		gate_unflag(rx);
		epoll_ctl(ap->epfd, EPOLL_CTL_ADD, rx->fd, &ev);
		rx_service(c, rx, EPOLLIN);
	}
}

/* A lane's block: a PUT of a context of this call whose stream from the peer exists. */
static int block_check(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	int k = (int)(rx->f.id >> 32);

	if (rx->f.op == RMA_OP_PUT && rx->f.len && k >= 0 && k < rx->ctx->base.ncontexts &&
	    rx->ctx->streams[k * c->base.nranks + rx->peer].in_fd >= 0)
		return 0;
	rx->logged = 1;
	RAIL_WARN("RMA (rank %d of %d, device %d): %s sent a %s for context %d on lane %d, which "
		  "carries puts of this call's contexts only; the lane is closed", c->base.rank,
		  c->base.nranks, c->base.dev, RMA_PEER(&c->mesh, rx->peer), rma_op_name(rx->f.op),
		  k, rx->lane);
	return -EPROTO;
}

/* A put's range inside a live window (and valid, what the caller checked): 0, or refused. */
static int put_range(struct rma_tcp_coll *c, struct rma_rx *rx, int valid)
{
	const struct rma_frame *f = &rx->f;
	struct rma_win *w;
	int ok;

	pthread_rwlock_rdlock(&c->wins.lock);
	w = rma_wins_get(&c->wins, f->win);
	ok = valid && w && rma_in_bounds(f->off, f->len, w->base.size);
	pthread_rwlock_unlock(&c->wins.lock);
	return ok ? 0 : frame_refuse(c, rx, !w ? REF_UNKNOWN : REF_OUTSIDE, w);
}

/* A STRIPED frame: count its blocks per lane (the lanes check and land them). */
static int frame_striped(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	const struct rma_frame *f = &rx->f;
	struct rma_stream *s = rx_stream(rx);
	int err = put_range(c, rx, f->len && c->nlanes);

	if (err)
		return err;
	for (int l = 0; l < c->nlanes; l++)
		s->expected[l] += rma_lane_blocks(f->off, f->len, l, c->nlanes);
	return 0;
}

/* A frame header arrived and passed its gate: apply what has no body, set up what has one. */
static int frame_start(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	const struct rma_frame *f = &rx->f;
	int target = rx->role != RMA_RX_REPLIES;
	int err;

	if (target != (f->op != RMA_OP_REPLY)) {
		rx->logged = 1;
		RAIL_WARN("RMA (rank %d of %d, device %d): %s sent a %s on context %d's %s stream; "
			  "the stream is closed", c->base.rank, c->base.nranks, c->base.dev,
			  RMA_PEER(&c->mesh, rx->peer), rma_op_name(f->op), rx->context,
			  target ? "operation" : "reply");
		return -EPROTO;
	}
	if (f->op == RMA_OP_REPLY)
		return frame_reply(c, rx);
	if (f->op != RMA_OP_PUT) {
		err = f->op == RMA_OP_SIGNAL ? frame_signal(c, rx) : f->op == RMA_OP_GET
		      ? frame_get(c, rx) : frame_striped(c, rx);
		if (!err)
			frame_reached(c, rx);
		return err;
	}
	if ((err = put_range(c, rx, 1)))
		return err;
	rx->in_body = f->len > 0;
	rx->body_got = 0;
	rx->body_gpu = 0;
	if (!rx->in_body && rx->role == RMA_RX_TARGET)
		frame_reached(c, rx);
	return 0;
}

/* The window the next bytes of the body go to, and where in it, with the window lock held. */
static struct rma_win *body_win(struct rma_tcp_coll *c, struct rma_rx *rx, uint64_t *off)
{
	struct rma_win *w;

	if (rx->role != RMA_RX_REPLIES) {
		w = rma_wins_get(&c->wins, rx->f.win);
		*off = rx->f.off + rx->body_got;
	} else {
		struct rma_req *r = &rx->ctx->reqs[(uint32_t)rx->f.id];

		w = rma_wins_get(&c->wins, r->dst_win);
		*off = w ? (uint64_t)(r->dst - w->base.base) + rx->body_got : 0;
	}
	return w;
}

/*
 * Bytes off the socket into a window: a host window directly; a GPU one
 * through the reader's staging ring, a piece of up to RMA_LAND_PIECE bytes
 * filled by as many reads as it takes and then copied in with one HtoD
 * (fewer driver calls than one per read). The ring is its thread's, shared
 * by every reader the thread serves, and a piece is only taken from it
 * when its copy is queued: so a piece never stays open once this reader
 * leaves the thread to another (its socket ran dry here, and rx_read does
 * not stop for its budget mid-piece), or two readers would fill the same
 * bytes.
 */
static ssize_t body_recv(struct rma_tcp_coll *c, struct rma_rx *rx, struct rma_win *w,
			 uint64_t off, size_t want, int *err)
{
	struct rma_ring *ring = rx->role == RMA_RX_LANE ? &ap_of(c, rx)->ring : &c->gpu.ring;
	ssize_t n;

	if (!w->gpu) {
		n = recv(rx->fd, w->base.base + off, want, MSG_DONTWAIT);
		*err = n < 0 ? -errno : 0;
		return n;
	}
	if (!rx->stage_room) {	/* a new piece: never longer than what is left of the body */
		rx->stage_ptr = rma_mem_stage(&c->gpu, ring, RAIL_MIN(want, RMA_LAND_PIECE),
					      &rx->stage_room);
		if (!rx->stage_ptr) {
			rx->stage_room = 0;
			*err = -EIO;
			return -1;
		}
		rx->stage_off = off;
		rx->staged = 0;
	}
	n = recv(rx->fd, rx->stage_ptr + rx->staged, rx->stage_room - rx->staged, MSG_DONTWAIT);
	*err = n < 0 ? -errno : 0;
	if (n > 0) {
		rx->body_gpu = 1;
		rx->staged += (size_t)n;
	}
	/* full, or the socket ran dry: queue the copy of what is staged, give the room back */
	if (rx->staged == rx->stage_room || (n < 0 && (*err == -EAGAIN || *err == -EWOULDBLOCK))) {
		int e = rx->staged ? rma_mem_land(&c->gpu, ring, w, rx->stage_off, rx->stage_ptr,
						  rx->staged) : 0;

		if (e)
			*err = e;
		rx->stage_room = 0;
	}
	return n;
}

/* The last byte of a body arrived. */
static int body_done(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	int err = 0;

	rx->in_body = 0;
	if (rx->role == RMA_RX_TARGET)
		frame_reached(c, rx);
	if (rx->role == RMA_RX_LANE)
		block_landed(c, rx);
	if (rx->role != RMA_RX_REPLIES)
		return 0;
	/* A get into a GPU window is done once its copies are. */
	if (rx->body_gpu && (err = rma_mem_sync(&c->gpu)))
		return err;
	atomic_store(&rx->ctx->reqs[(uint32_t)rx->f.id].state, RMA_REQ_DONE);
	return 0;
}

/* Body bytes into their window: -EAGAIN when the socket is empty. */
static int body_more(struct rma_tcp_coll *c, struct rma_rx *rx, size_t *budget)
{
	size_t want = (size_t)RAIL_MIN(rx->f.len - rx->body_got, RMA_APPLY_CHUNK);
	struct rma_win *w;
	uint64_t off;
	ssize_t n = -1;
	int err = 0;

	pthread_rwlock_rdlock(&c->wins.lock);
	w = body_win(c, rx, &off);
	if (w)
		n = body_recv(c, rx, w, off, want, &err);
	pthread_rwlock_unlock(&c->wins.lock);
	if (!w)
		return frame_refuse(c, rx, REF_GONE, NULL);
	if (err == -EIO) {
		rx->logged = 1;
		return err;
	}
	if (n == 0)
		return -RAIL_ECLOSED;
	if (n < 0)
		return err == -EAGAIN || err == -EWOULDBLOCK ? -EAGAIN : err;
	rx->body_got += (uint64_t)n;
	*budget -= RAIL_MIN(*budget, (size_t)n);
	if (rx->body_got == rx->f.len && (err = body_done(c, rx)))
		rx->logged = 1;
	return err;
}

static int header_more(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	char why[160];
	int err = rail_sock_recv_nb(rx->fd, rx->hdr, RMA_FRAME_SIZE, &rx->hdr_got);

	if (err == -RAIL_ECLOSED && rx->hdr_got == 0)
		return rx_closed(c, rx) ? -RAIL_ECLOSED : -EAGAIN;
	if (err)
		return err;
	rx->hdr_got = 0;
	err = rma_frame_decode(rx->hdr, &rx->f, why, sizeof(why));
	if (err) {
		rx->logged = 1;
		RAIL_WARN("RMA (rank %d of %d, device %d): %s sent a bad frame on context %d: %s; "
			  "the stream is closed", c->base.rank, c->base.nranks, c->base.dev,
			  RMA_PEER(&c->mesh, rx->peer), rx->context, why);
		return err;
	}
	if (rx->role == RMA_RX_LANE && (err = block_check(c, rx)))
		return err;
	rx->held = 1;	/* applied once its gate is open (rx_read) */
	return 0;
}

/* The held frame never passes its gate: a lane it waits for failed. */
static int gate_fail(struct rma_tcp_coll *c, struct rma_rx *rx, int err)
{
	rx->logged = 1;
	RAIL_WARN("RMA (rank %d of %d, device %d): context %d's stream from %s waits for the "
		  "bytes of a striped put on a lane that failed (%s); the stream is closed",
		  c->base.rank, c->base.nranks, c->base.dev, rx->context,
		  RMA_PEER(&c->mesh, rx->peer), RAIL_ERRSTR(err));
	return err;
}

/* Read what the socket holds, up to the budget: 0, or -errno (the stream failed). */
static int rx_read(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	size_t budget = RMA_APPLY_BUDGET;
	int err = 0;

	while (!err && (budget || rx->stage_room) && !rx->replying && !rx->dead && !rx->parked) {
		if (rx->held) {
			int open = gate_open(c, rx);

			if (!open)
				open = gate_park(c, rx);
			if (open < 0)
				err = open == -ENOMEM ? open : gate_fail(c, rx, open);
			else if (open) {
				rx->held = 0;
				err = frame_start(c, rx);
			}
		} else if (rx->in_body) {
			err = body_more(c, rx, &budget);
		} else {
			budget -= RAIL_MIN(budget, RMA_FRAME_SIZE);
			err = header_more(c, rx);
		}
	}
	return err == -EAGAIN ? 0 : err;
}

#define RMA_REPLY_STAGE (1u << 20)	/* pinned bytes of a reply out of a GPU window */

/*
 * Where the reply's bytes from done on are, and how many of them, with the
 * window lock held: the window itself, or for a GPU window the next piece
 * copied out of it into the reader's pinned buffer.
 */
static const char *reply_src(struct rma_tcp_coll *c, struct rma_rx *rx, const struct rma_win *w,
			     uint64_t done, size_t *want, int *err)
{
	if (!w->gpu)
		return w->base.base + rx->roff + done;
	if (done < rx->rstage_at || done >= rx->rstage_at + rx->rstage_len) {
		size_t n = (size_t)RAIL_MIN(rx->rlen - done, RMA_REPLY_STAGE);

		if (!rx->rstage && !(rx->rstage = rma_gpu_pinned(&c->gpu, RMA_REPLY_STAGE))) {
			*err = -EIO;
			return NULL;
		}
		if ((*err = rma_mem_read(&c->gpu, w, rx->roff + done, rx->rstage, n)))
			return NULL;
		rx->rstage_at = done;
		rx->rstage_len = n;
	}
	*want = (size_t)RAIL_MIN(*want, rx->rstage_at + rx->rstage_len - done);
	return rx->rstage + (done - rx->rstage_at);
}

/* Write more of the reply being sent: 0 (done or later), or -errno. */
static int reply_more(struct rma_tcp_coll *c, struct rma_rx *rx)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = rx };
	int err = 0;

	if (rx->rsent < RMA_FRAME_SIZE) {
		size_t off = (size_t)rx->rsent;

		err = rail_sock_send_nb(rx->fd, rx->rhdr, RMA_FRAME_SIZE, &off);
		rx->rsent = off;
	}
	while (!err && rx->rsent < RMA_FRAME_SIZE + rx->rlen) {
		uint64_t done = rx->rsent - RMA_FRAME_SIZE;
		size_t want = (size_t)RAIL_MIN(rx->rlen - done, RMA_APPLY_CHUNK);
		const char *src = NULL;
		struct rma_win *w;
		ssize_t n = -1;

		pthread_rwlock_rdlock(&c->wins.lock);
		w = rma_wins_get(&c->wins, rx->rwin);
		if (w)
			src = reply_src(c, rx, w, done, &want, &err);
		if (src)
			n = send(rx->fd, src, want, MSG_DONTWAIT | MSG_NOSIGNAL);
		pthread_rwlock_unlock(&c->wins.lock);
		if (!w)
			return frame_refuse(c, rx, REF_GONE, NULL);
		if (err) {
			rx->logged = 1;
			return err;
		}
		if (n < 0)
			err = errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -errno;
		else
			rx->rsent += (uint64_t)n;
	}
	if (err)
		return err == -EAGAIN ? 0 : err;
	rx->replying = 0;
	return epoll_ctl(ap_of(c, rx)->epfd, EPOLL_CTL_MOD, rx->fd, &ev) ? -errno : 0;
}

static void rx_service(struct rma_tcp_coll *c, struct rma_rx *rx, uint32_t events)
{
	int err = 0;

	if (rx->dead || rx->parked)
		return;
	if (rx->replying && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
		err = reply_more(c, rx);
	if (!err && !rx->replying && (events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
		err = rx_read(c, rx);
	/* A reply just finished leaves what followed it unread: read it now. */
	if (!err && !rx->replying && !rx->dead && (events & EPOLLOUT))
		err = rx_read(c, rx);
	if (!err)
		return;
	if (!rx->logged && rx->role == RMA_RX_LANE)
		RAIL_WARN("RMA (rank %d of %d, device %d): lane %d from %s failed: %s",
			  c->base.rank, c->base.nranks, c->base.dev, rx->lane,
			  RMA_PEER(&c->mesh, rx->peer), RAIL_ERRSTR(err));
	else if (!rx->logged)
		RAIL_WARN("RMA (rank %d of %d, device %d): context %d's %s stream with %s failed: "
			  "%s", c->base.rank, c->base.nranks, c->base.dev, rx->context,
			  rx->role == RMA_RX_TARGET ? "incoming" : "outgoing",
			  RMA_PEER(&c->mesh, rx->peer), RAIL_ERRSTR(err));
	rx_fail(c, rx, err);
}

/* Commands from the application thread: 1 to stop. */
static int apply_commands(struct rma_applier *ap)
{
	uint64_t v;
	int stop;

	if (read(ap->evfd, &v, sizeof(v)) < 0) {
		/* nothing to read: a command is still answered below */
	}
	if (atomic_exchange(&ap->wake, 0))
		gate_wake(ap);
	pthread_mutex_lock(&ap->lock);
	if (ap->remove) {
		struct rma_tcp_ctx *x = ap->remove;
		int kept = 0;

		for (int i = 0; i < x->nrx; i++) {
			struct rma_rx *rx = x->rx[i];

			/* this thread's readers only: the others' state is theirs */
			if (ap_of(ap->c, rx) == ap && !rx->dead && !rx->parked)
				epoll_ctl(ap->epfd, EPOLL_CTL_DEL, rx->fd, NULL);
		}
		for (int i = 0; i < ap->nparked; i++) {
			if (ap->parked[i]->ctx != x)
				ap->parked[kept++] = ap->parked[i];
		}
		ap->nparked = kept;
		ap->remove = NULL;
	}
	ap->ack = ap->cmd;
	stop = ap->stop;
	pthread_cond_broadcast(&ap->cv);
	pthread_mutex_unlock(&ap->lock);
	return stop;
}

static void *apply_main(void *arg)
{
	struct rma_applier *ap = arg;
	struct rma_tcp_coll *c = ap->c;
	struct epoll_event ev[64];

	if (ap == c->ap)
		rail_thread_name("rail-rma-rx");
	else
		rail_thread_name("rail-rma-rx%d", (int)(ap - c->ap) - 1);
	for (;;) {
		int n = epoll_wait(ap->epfd, ev, 64, -1), cmd = 0;

		if (n < 0 && errno != EINTR) {
			RAIL_WARN("RMA (rank %d of %d, device %d): epoll_wait: %s; the applier thread "
				  "stops", c->base.rank, c->base.nranks, c->base.dev,
				  RAIL_ERRSTR(-errno));
			rma_coll_fail(c, -EIO);
			return NULL;
		}
		for (int i = 0; i < n; i++) {
			if (ev[i].data.ptr)
				rx_service(c, ev[i].data.ptr, ev[i].events);
			else
				cmd = 1;
		}
		if (cmd && apply_commands(ap))
			return NULL;
	}
}

static int ap_start(struct rma_tcp_coll *c, struct rma_applier *ap)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	int err;

	ap->c = c;
	pthread_mutex_init(&ap->lock, NULL);
	pthread_cond_init(&ap->cv, NULL);
	ap->epfd = epoll_create1(EPOLL_CLOEXEC);
	ap->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	err = ap->epfd < 0 || ap->evfd < 0 || epoll_ctl(ap->epfd, EPOLL_CTL_ADD, ap->evfd, &ev)
	      ? -errno : -pthread_create(&ap->thread, NULL, apply_main, ap);
	ap->started = !err;
	return err;
}

/* Post a command and wait until the thread took it. */
static void apply_command(struct rma_applier *ap, struct rma_tcp_ctx *remove, int stop)
{
	pthread_mutex_lock(&ap->lock);
	ap->remove = remove;
	ap->stop |= stop;
	ap->cmd++;
	ap_kick(ap);
	while (ap->ack != ap->cmd)
		pthread_cond_wait(&ap->cv, &ap->lock);
	pthread_mutex_unlock(&ap->lock);
}

void rma_apply_stop(struct rma_tcp_coll *c)
{
	for (int i = 0; c->ap && i <= c->nlanes; i++) {
		struct rma_applier *ap = &c->ap[i];

		if (!ap->c)
			continue;	/* never started: nothing made */
		if (ap->started) {
			apply_command(ap, NULL, 1);
			pthread_join(ap->thread, NULL);
		}
		if (ap->epfd >= 0)
			close(ap->epfd);
		if (ap->evfd >= 0)
			close(ap->evfd);
		pthread_mutex_destroy(&ap->lock);
		pthread_cond_destroy(&ap->cv);
		free(ap->parked);
		rma_mem_ring_free(&c->gpu, &ap->ring);
	}
	free(c->ap);
	c->ap = NULL;
}

int rma_apply_start(struct rma_tcp_coll *c)
{
	int err = 0, n = 1 + c->nlanes;

	c->ap = calloc((size_t)n, sizeof(*c->ap));
	if (!c->ap)
		return -ENOMEM;
	for (int i = 0; i < n; i++)
		c->ap[i].epfd = c->ap[i].evfd = -1;
	for (int i = 0; i < n && !err; i++)
		err = ap_start(c, &c->ap[i]);
	if (err) {
		RAIL_WARN("RMA connect (rank %d of %d, device %d): starting the applier threads: %s",
			  c->base.rank, c->base.nranks, c->base.dev, RAIL_ERRSTR(err));
		rma_apply_stop(c);
	}
	return err;
}

int rma_apply_add(struct rma_tcp_coll *c, struct rma_tcp_ctx *x)
{
	for (int i = 0; i < x->nrx; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = x->rx[i] };

		if (epoll_ctl(ap_of(c, x->rx[i])->epfd, EPOLL_CTL_ADD, x->rx[i]->fd, &ev)) {
			int err = -errno;

			RAIL_WARN("RMA createContext (rank %d of %d, device %d): epoll_ctl: %s",
				  c->base.rank, c->base.nranks, c->base.dev, RAIL_ERRSTR(err));
			return err;	/* rma_apply_remove drops those added (DEL of the rest fails, harmless) */
		}
	}
	return 0;
}

void rma_apply_remove(struct rma_tcp_coll *c, struct rma_tcp_ctx *x)
{
	for (int i = 0; c->ap && x->nrx && i <= c->nlanes; i++)
		apply_command(&c->ap[i], x, 0);
}
