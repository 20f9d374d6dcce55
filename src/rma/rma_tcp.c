/*
 * nccl-net-rail: the TCP RMA backend's ops (rma.h): listen on the TCP
 * transport's device, connect the group, contexts, windows, close. The
 * protocol is in rma_tcp.h.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "rma/rma_tcp.h"
#include "tcp/tcp.h"
#include "transport.h"

static int tcp_rma_listen(int dev, void *handle, struct rail_rma_listen **out)
{
	const struct tcp_dev *d = tcp_dev_get(dev);
	struct rma_tcp_listen *lc;
	int err;

	if (!d)
		return -EINVAL;
	err = rma_mesh_listen(dev, &d->addr, handle, &lc);
	if (err)
		return err;
	lc->base.ops = &rail_rma_tcp_ops;
	rail_comm_live_add(1);
	*out = &lc->base;
	return 0;
}

static int tcp_rma_close_listen(struct rail_rma_listen *l)
{
	rma_mesh_close_listen((struct rma_tcp_listen *)l);
	rail_comm_live_add(-1);
	return 0;
}

static int tcp_rma_close_coll(struct rail_rma_coll *base)
{
	struct rma_tcp_coll *c = (struct rma_tcp_coll *)base;

	if (c->nlanes)
		RAIL_INFO(RAIL_LOG_NET, "RMA (rank %d of %d, device %d): %llu puts (%.1f MiB) striped "
			  "over %d lanes", c->base.rank, c->base.nranks, c->base.dev,
			  (unsigned long long)atomic_load(&c->striped),
			  (double)atomic_load(&c->striped_bytes) / (1 << 20), c->nlanes);
	rma_apply_stop(c);
	rma_lanes_stop(c);
	rma_mesh_fini(&c->mesh);
	rma_wins_fini(&c->wins);
	rma_gpu_fini(&c->gpu);
	free(c);
	rail_comm_live_add(-1);
	return 0;
}

static int tcp_rma_connect(struct rail_rma_listen *l, void *const *handles, int nranks,
			   int rank, struct rail_rma_coll **out)
{
	struct rma_tcp_coll *c = calloc(1, sizeof(*c));
	uint32_t lanes = (uint32_t)rail_param_int(RAIL_P_RMA_LANES);
	int err;

	if (!c)
		return -ENOMEM;
	c->base = (struct rail_rma_coll){ .dev = l->dev, .nranks = nranks, .rank = rank,
					  .ops = &rail_rma_tcp_ops };
	rma_wins_init(&c->wins);
	rma_gpu_init(&c->gpu, l->dev, rank, nranks);
	rail_comm_live_add(1);
	err = rma_mesh_init(&c->mesh, (const struct rma_tcp_listen *)l, handles, nranks, rank);
	if (!err)
		err = rma_mesh_group(&c->mesh, &lanes);
	c->nlanes = nranks > 1 ? (int)RAIL_MIN(lanes, RMA_LANES_MAX) : 0;
	c->stall_ns = (uint64_t)rail_param_int(RAIL_P_RMA_STALL_WARN) * 1000000000ull;
	c->gpu.track = c->stall_ns > 0;
	if (!err)
		err = rma_lanes_start(c);
	if (!err)
		err = rma_apply_start(c);
	if (err) {
		tcp_rma_close_coll(&c->base);
		return err;
	}
	RAIL_INFO(RAIL_LOG_NET, "RMA connect: rank %d of %d on device %d, listening on %s, %d "
		  "lanes for puts of %u KiB and more", rank, nranks, l->dev,
		  RAIL_ADDRSTR(&c->mesh.addr[rank]), c->nlanes, RMA_STRIPE_MIN >> 10);
	*out = &c->base;
	return 0;
}

/* ---- contexts --------------------------------------------------------------- */

static int tcp_rma_destroy_ctx(struct rail_rma_ctx *base)
{
	struct rma_tcp_ctx *x = (struct rma_tcp_ctx *)base;
	struct rma_tcp_coll *c = x->coll;
	int n = x->base.ncontexts * c->base.nranks, nl = c->nlanes * c->base.nranks;

	rma_watch_remove(x);
	/* the lanes' senders first: a write blocked on a full socket fails at once */
	for (int i = 0; x->lane_out && i < nl; i++) {
		if (x->lane_out[i] >= 0)
			shutdown(x->lane_out[i], SHUT_RDWR);
	}
	rma_lanes_forget(c, x);
	rma_apply_remove(c, x);
	for (int i = 0; x->streams && i < n; i++) {
		if (x->streams[i].out_fd >= 0)
			close(x->streams[i].out_fd);
		if (x->streams[i].in_fd >= 0)
			close(x->streams[i].in_fd);
	}
	for (int i = 0; x->lane_out && i < nl; i++) {
		if (x->lane_out[i] >= 0)
			close(x->lane_out[i]);
		if (x->lane_in[i] >= 0)
			close(x->lane_in[i]);
	}
	if (x->lanes_reserved)
		rma_lanes_reserve(c, -(int64_t)x->nreqs);
	free(x->lane_out);
	free(x->lane_in);
	free(x->lane_err);
	/* first: it waits for the copies still queued into the pieces (a put cut short) */
	rma_gpu_stream_free(&x->coll->gpu, x->stream);
	for (int i = 0; x->streams && i < n; i++) {
		rma_gpu_pinned_free(&x->coll->gpu, x->streams[i].stage);
		rma_gpu_event_free(&x->coll->gpu, x->streams[i].ev[0]);
		rma_gpu_event_free(&x->coll->gpu, x->streams[i].ev[1]);
	}
	for (int i = 0; i < x->nrx; i++) {
		rma_gpu_pinned_free(&x->coll->gpu, x->rx[i]->rstage);
		free(x->rx[i]);
	}
	free(x->rx);
	free(x->streams);
	if (x->reqs)
		rma_send_fini(x);
	free(x);
	return 0;
}

/*
 * One reader for each socket of the context: the peer's operations and the
 * replies (the first n links), and the lanes from the peer (the nl after).
 */
static int ctx_readers(struct rma_tcp_ctx *x, int n, int nl, const struct rma_link *want)
{
	int nranks = x->coll->base.nranks;

	x->rx = calloc((size_t)(2 * n + nl) + 1, sizeof(*x->rx));
	if (!x->rx)
		return -ENOMEM;
	for (int i = n; i < n + nl; i++) {
		int lane = (int)want[i].index - x->base.ncontexts;
		struct rma_rx *rx = calloc(1, sizeof(*rx));

		if (!rx)
			return -ENOMEM;
		*rx = (struct rma_rx){ .fd = x->lane_in[lane * nranks + want[i].peer],
				       .role = RMA_RX_LANE, .peer = want[i].peer, .context = -1,
				       .lane = lane, .ctx = x };
		x->rx[x->nrx++] = rx;
	}
	for (int i = 0; i < n; i++) {
		struct rma_stream *s = &x->streams[(int)want[i].index * x->coll->base.nranks +
						   want[i].peer];

		for (int role = RMA_RX_TARGET; role <= RMA_RX_REPLIES; role++) {
			struct rma_rx *rx = calloc(1, sizeof(*rx));

			if (!rx)
				return -ENOMEM;
			*rx = (struct rma_rx){ .fd = role == RMA_RX_TARGET ? s->in_fd : s->out_fd,
					       .role = role, .peer = want[i].peer, .lane = -1,
					       .context = (int)want[i].index, .ctx = x };
			x->rx[x->nrx++] = rx;
		}
	}
	return 0;
}

/*
 * The links of a context: every context to every rank (rank + k * stride) %
 * nranks (index: the context), then the lanes to each (index: ncontexts + lane).
 */
static int ctx_links(struct rma_tcp_ctx *x)
{
	struct rma_tcp_coll *c = x->coll;
	int nranks = c->base.nranks, npeers = nranks / x->base.stride - 1;
	int n = x->base.ncontexts * npeers, nl = c->nlanes * npeers, k = 0, err;
	struct rma_link *want = calloc((size_t)(n + nl) + 1, sizeof(*want));
	int *out = calloc((size_t)(n + nl) + 1, sizeof(int));
	int *in = calloc((size_t)(n + nl) + 1, sizeof(int));

	err = want && out && in ? 0 : -ENOMEM;
	for (int ctx = 0; !err && ctx < x->base.ncontexts + c->nlanes; ctx++) {
		for (int j = 1; j <= npeers; j++)
			want[k++] = (struct rma_link){
				.peer = (c->base.rank + j * x->base.stride) % nranks,
				.index = (uint32_t)ctx };
	}
	if (!err && n + nl)
		err = rma_mesh_links(&c->mesh, RMA_LINK_DATA, x->seq, n + nl, want, out, in,
				     "createContext");
	for (int i = 0; !err && i < n; i++) {
		struct rma_stream *s = &x->streams[(int)want[i].index * nranks + want[i].peer];

		s->out_fd = out[i];
		s->in_fd = in[i];
	}
	for (int i = n; !err && i < n + nl; i++) {
		int at = ((int)want[i].index - x->base.ncontexts) * nranks + want[i].peer;

		x->lane_out[at] = out[i];
		x->lane_in[at] = in[i];
	}
	if (!err)
		err = ctx_readers(x, n, nl, want);
	free(want);
	free(out);
	free(in);
	return err;
}

/* The lanes' sockets (made by ctx_links) and room for the context's jobs on each lane. */
static int ctx_lanes(struct rma_tcp_ctx *x)
{
	int nl = x->coll->nlanes * x->coll->base.nranks, err;

	x->lane_out = malloc((size_t)nl * sizeof(int));
	x->lane_in = malloc((size_t)nl * sizeof(int));
	x->lane_err = calloc((size_t)nl, sizeof(*x->lane_err));
	if (!x->lane_out || !x->lane_in || !x->lane_err)
		return -ENOMEM;
	for (int i = 0; i < nl; i++)
		x->lane_out[i] = x->lane_in[i] = -1;
	err = rma_lanes_reserve(x->coll, x->nreqs);
	x->lanes_reserved = !err;
	return err;
}

static int tcp_rma_create_ctx(struct rail_rma_coll *base, int ncontexts, int traffic_class,
			      int stride, struct rail_rma_ctx **out)
{
	struct rma_tcp_coll *c = (struct rma_tcp_coll *)base;
	struct rma_tcp_ctx *x = calloc(1, sizeof(*x));
	int n = ncontexts * base->nranks, err;

	(void)traffic_class;	/* an InfiniBand traffic class: nothing to map it to on TCP */
	if (!x)
		return -ENOMEM;
	x->base = (struct rail_rma_ctx){ .coll = base, .ncontexts = ncontexts, .stride = stride };
	x->coll = c;
	x->seq = ++c->ctx_seq;
	x->streams = calloc((size_t)n, sizeof(*x->streams));
	err = x->streams ? rma_send_init(x) : -ENOMEM;
	for (int i = 0; x->streams && i < n; i++)
		x->streams[i] = (struct rma_stream){ .out_fd = -1, .in_fd = -1,
						     .qhead = RMA_NONE, .qtail = RMA_NONE };
	if (!err && c->nlanes)
		err = ctx_lanes(x);
	if (!err)
		err = ctx_links(x);
	if (!err)
		err = rma_apply_add(c, x);
	if (err) {
		tcp_rma_destroy_ctx(&x->base);
		return err;
	}
	rma_watch_add(x);
	*out = &x->base;
	return 0;
}

/* ---- windows and data ----------------------------------------------------------- */

static int tcp_rma_reg(struct rail_rma_coll *base, void *data, size_t size, int type,
		       uint64_t flags, int fd, uint64_t offset, struct rail_rma_mr **out)
{
	struct rma_tcp_coll *c = (struct rma_tcp_coll *)base;
	struct rma_win *w;
	int err;

	(void)offset;
	err = rma_wins_reg(&c->wins, &c->mesh, &c->gpu, base, data, size, type, flags, fd, &w);
	if (!err)
		*out = &w->base;
	return err;
}

static int tcp_rma_dereg(struct rail_rma_coll *base, struct rail_rma_mr *mr)
{
	struct rma_tcp_coll *c = (struct rma_tcp_coll *)base;
	int gpu = ((struct rma_win *)mr)->gpu;

	rma_wins_dereg(&c->wins, (struct rma_win *)mr);
	/* No copy queued before may still write into memory NCCL frees next. */
	return gpu ? rma_mem_sync(&c->gpu) : 0;
}

static int tcp_rma_post(struct rail_rma_ctx *x, const struct rail_rma_op *op, uint32_t *idx,
			uint32_t *stamp)
{
	return rma_send_post((struct rma_tcp_ctx *)x, op, idx, stamp);
}

/*
 * A get is done only once its bytes are in memory (written by the applier,
 * and for a GPU window its copies waited for, before it marks the request
 * done), so there is never anything left to flush.
 */
static int tcp_rma_flush(struct rail_rma_ctx *x, int context, const struct rail_rma_mr *mr,
			 uint32_t *idx, uint32_t *stamp)
{
	(void)x, (void)context, (void)mr, (void)idx, (void)stamp;
	return 1;
}

static int tcp_rma_test(struct rail_rma_ctx *x, uint32_t idx, uint32_t stamp, int *done)
{
	return rma_send_test((struct rma_tcp_ctx *)x, idx, stamp, done);
}

static int tcp_rma_progress(struct rail_rma_ctx *x)
{
	return rma_send_progress((struct rma_tcp_ctx *)x);
}

static int tcp_rma_last_error(struct rail_rma_ctx *x)
{
	return atomic_load(&((struct rma_tcp_ctx *)x)->coll->err);
}

const struct rail_rma_ops rail_rma_tcp_ops = {
	.name = "tcp",
	.ptr_support = RAIL_PTR_HOST,
	.listen = tcp_rma_listen,
	.connect = tcp_rma_connect,
	.create_ctx = tcp_rma_create_ctx,
	.reg = tcp_rma_reg,
	.dereg = tcp_rma_dereg,
	.post = tcp_rma_post,
	.flush = tcp_rma_flush,
	.test = tcp_rma_test,
	.progress = tcp_rma_progress,
	.last_error = tcp_rma_last_error,
	.destroy_ctx = tcp_rma_destroy_ctx,
	.close_coll = tcp_rma_close_coll,
	.close_listen = tcp_rma_close_listen,
};
