/*
 * nccl-net-rail: the verbs RMA backend's ops (rma.h, design in rma_ib.h):
 * listen on the verbs transport's out-of-band address, connect the group's
 * mesh, contexts of RC QPs, symmetric windows, close.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rail.h"
#include "rma/rma_ib.h"
#include "transport.h"
#include "wire.h"

#define WIN_REC_SIZE 32

int rma_ib_usable(char *why, size_t why_len)
{
	for (int i = 0; i < rail_ib_hca_count(); i++) {
		const struct rail_ib_hca *h = rail_ib_hca_get(i);

		if (h && h->attr.atomic_cap == IBV_ATOMIC_NONE) {
			snprintf(why, why_len, "device %s cannot do atomics (atomic_cap NONE), which "
				 "the verbs backend's signals are", h->name);
			return 0;
		}
	}
	return 1;
}

/* The port of net device dev (a virtual device: its first member). */
static struct rail_ib_dev *dev_of(int dev)
{
	const struct rail_ib_vdev *v = rail_ib_vdev_get(dev);

	return v && v->ndevs > 0 ? rail_ib_dev_get(v->devs[0]) : NULL;
}

static int ib_rma_listen(int dev, void *handle, struct rail_rma_listen **out)
{
	struct rma_tcp_listen *lc;
	int err;

	if (!dev_of(dev))
		return -EINVAL;
	err = rma_mesh_listen(dev, rail_ib_oob_addr(), handle, &lc);
	if (err)
		return err;
	lc->base.ops = &rail_rma_ib_ops;
	rail_comm_live_add(1);
	*out = &lc->base;
	return 0;
}

static int ib_rma_close_listen(struct rail_rma_listen *l)
{
	rma_mesh_close_listen((struct rma_tcp_listen *)l);
	rail_comm_live_add(-1);
	return 0;
}

static int ib_rma_close_coll(struct rail_rma_coll *base)
{
	struct rma_ib_coll *c = (struct rma_ib_coll *)base;

	if (c->scratch_mr)
		rail_ibv.dereg_mr(c->scratch_mr);
	free(c->scratch);
	rma_mesh_fini(&c->mesh);
	free(c);
	rail_comm_live_add(-1);
	return 0;
}

/* The port's GID and the word the atomics' old values land in. */
static int coll_port(struct rma_ib_coll *c)
{
	struct rail_ib_dev *d = c->dev;
	int err = rail_ib_dev_gid_resolve(d, &c->gid);

	if (err) {
		RAIL_WARN("RMA connect (rank %d, device %d): %s:%d has no usable GID: %s",
			  c->base.rank, c->base.dev, d->hca->name, d->port, c->gid.reason);
		return err;
	}
	c->scratch = aligned_alloc(64, 64);
	if (!c->scratch)
		return -ENOMEM;
	c->scratch_mr = rail_ibv.reg_mr(d->hca->pd, c->scratch, 64, IBV_ACCESS_LOCAL_WRITE);
	if (!c->scratch_mr) {
		err = -(errno ? errno : EIO);
		RAIL_WARN("RMA connect (rank %d, device %d): ibv_reg_mr of 64 bytes on %s failed: %s",
			  c->base.rank, c->base.dev, d->hca->name, RAIL_ERRSTR(err));
	}
	return err;
}

static int ib_rma_connect(struct rail_rma_listen *l, void *const *handles, int nranks,
			  int rank, struct rail_rma_coll **out)
{
	struct rma_ib_coll *c = calloc(1, sizeof(*c));
	int err;

	if (!c)
		return -ENOMEM;
	c->base = (struct rail_rma_coll){ .dev = l->dev, .nranks = nranks, .rank = rank,
					  .ops = &rail_rma_ib_ops };
	c->dev = dev_of(l->dev);
	rail_comm_live_add(1);
	err = rma_mesh_init(&c->mesh, (const struct rma_tcp_listen *)l, handles, nranks, rank);
	if (!err)
		err = rma_mesh_group(&c->mesh, NULL);
	if (!err)
		err = coll_port(c);
	if (err) {
		ib_rma_close_coll(&c->base);
		return err;
	}
	RAIL_INFO(RAIL_LOG_NET, "RMA connect: rank %d of %d on %s:%d (verbs), mesh on %s", rank,
		  nranks, c->dev->hca->name, c->dev->port, RAIL_ADDRSTR(&c->mesh.addr[rank]));
	*out = &c->base;
	return 0;
}

/* ---- contexts --------------------------------------------------------------- */

static int ib_rma_destroy_ctx(struct rail_rma_ctx *base)
{
	struct rma_ib_ctx *x = (struct rma_ib_ctx *)base;

	rma_ib_ctx_qps_free(x);
	rma_ib_reqs_free(x);
	pthread_mutex_destroy(&x->lock);
	free(x);
	return 0;
}

static int ib_rma_create_ctx(struct rail_rma_coll *base, int ncontexts, int traffic_class,
			     int stride, struct rail_rma_ctx **out)
{
	struct rma_ib_ctx *x = calloc(1, sizeof(*x));
	int err;

	if (!x)
		return -ENOMEM;
	x->base = (struct rail_rma_ctx){ .coll = base, .ncontexts = ncontexts, .stride = stride };
	x->coll = (struct rma_ib_coll *)base;
	x->tc = traffic_class;
	x->free_head = UINT32_MAX;
	pthread_mutex_init(&x->lock, NULL);
	err = rma_ib_ctx_qps(x);
	if (err) {
		ib_rma_destroy_ctx(&x->base);
		return err;
	}
	*out = &x->base;
	return 0;
}

/* ---- windows ---------------------------------------------------------------- */

static void win_free(struct rma_ib_mr *w)
{
	if (w->mh)
		rail_ib_mr_deregister(w->mh);
	free(w->peer_base);
	free(w->peer_size);
	free(w->peer_rkey);
	free(w);
}

/*
 * Whether the device's GPU-memory ladder can register this window (as the
 * net path's regMr decides): a DMA-BUF needs DMA-BUF support, GPU memory
 * without one needs peermem. 0, or -EOPNOTSUPP with a WARN naming both.
 */
static int win_ladder(const struct rma_ib_coll *c, const struct rma_ib_mr *w, int fd)
{
	const struct rail_ib_hca *h = c->dev->hca;
	const struct rail_ib_ladder *l = &h->ladder;

	if (w->base.type != RAIL_PTR_HOST && w->base.type != RAIL_PTR_CUDA) {
		RAIL_WARN("RMA regMrSym (rank %d, device %d): window #%u (%p, %zu bytes) has memory "
			  "type %d, neither host nor CUDA", c->base.rank, c->base.dev, w->base.index,
			  (void *)w->base.base, w->base.size, w->base.type);
		return -EINVAL;
	}
	if (fd >= 0 && !l->dmabuf) {
		RAIL_WARN("RMA regMrSymDmaBuf (rank %d, device %d): window #%u (%p, %zu bytes, fd %d) "
			  "cannot be registered on %s: DMA-BUF is unusable there (%s)", c->base.rank,
			  c->base.dev, w->base.index, (void *)w->base.base, w->base.size, fd, h->name,
			  l->dmabuf_why);
		return -EOPNOTSUPP;
	}
	if (fd < 0 && w->base.type == RAIL_PTR_CUDA && !l->peermem) {
		RAIL_WARN("RMA regMrSym (rank %d, device %d): window #%u (%p, %zu bytes) is GPU memory, "
			  "which %s registers only through DMA-BUF (%s) or peermem (%s)%s",
			  c->base.rank, c->base.dev, w->base.index, (void *)w->base.base, w->base.size,
			  h->name, l->dmabuf ? "usable: NCCL should have used regMrSymDmaBuf"
			  : l->dmabuf_why, l->peermem_why,
			  l->dmabuf ? "" : "; the device serves host memory only");
		return -EOPNOTSUPP;
	}
	return 0;
}

/*
 * Register through the net path's registration and ladder (ib_mr.c), an MR
 * of the window's own (deregistering it revokes its rkey): host memory and
 * peermem with ibv_reg_mr, a DMA-BUF with ibv_reg_dmabuf_mr (or
 * mlx5dv's on a Data Direct device). Remote write, read and atomic access;
 * never relaxed ordering: every window may carry signals (FORCE_SO).
 */
static int win_local(struct rma_ib_coll *c, struct rma_ib_mr *w, int fd, uint64_t offset)
{
	struct rail_ib_dev *d = c->dev;
	int n = c->base.nranks, err;
	char what[64];

	w->peer_base = calloc((size_t)n, sizeof(uint64_t));
	w->peer_size = calloc((size_t)n, sizeof(uint64_t));
	w->peer_rkey = calloc((size_t)n, sizeof(uint32_t));
	if (!w->peer_base || !w->peer_size || !w->peer_rkey)
		return -ENOMEM;
	err = win_ladder(c, w, fd);
	if (err)
		return err;
	snprintf(what, sizeof(what), "(RMA window #%u of rank %d)", w->base.index, c->base.rank);
	err = rail_ib_mr_register(&d, 1, w->base.base, w->base.size, w->base.type |
				  RAIL_IB_MR_NEEDS_READ | RAIL_IB_MR_NEEDS_ATOMIC | RAIL_IB_MR_STRICT |
				  RAIL_IB_MR_OWN,
				  fd, offset, what, &w->mh);
	if (err)
		return err;	/* logged, with the call and what to try */
	w->lkey = w->mh->lkey[0];
	w->rkey = w->mh->rkey[0];
	return 0;
}

/* Every rank's (status, index, rkey, base, size): all ranks fail together. */
static int win_exchange(struct rma_ib_coll *c, struct rma_ib_mr *w, int err)
{
	int n = c->base.nranks, e;
	uint8_t *out = calloc((size_t)n, WIN_REC_SIZE), *in = calloc((size_t)n, WIN_REC_SIZE);

	if (!out || !in) {
		free(out);
		free(in);
		return -ENOMEM;
	}
	for (int q = 0; q < n; q++) {
		uint8_t *p = out + (size_t)q * WIN_REC_SIZE;

		rail_put_u32(p, (uint32_t)err);
		rail_put_u32(p + 4, w->base.index);
		rail_put_u32(p + 8, w->rkey);
		rail_put_u64(p + 16, (uint64_t)(uintptr_t)w->base.base);
		rail_put_u64(p + 24, w->base.size);
	}
	e = rma_mesh_alltoall(&c->mesh, out, in, WIN_REC_SIZE, "regMrSym");
	for (int q = 0; !e && !err && q < n; q++) {
		const uint8_t *p = in + (size_t)q * WIN_REC_SIZE;

		if (rail_get_u32(p) || rail_get_u32(p + 4) != w->base.index) {
			RAIL_WARN("RMA regMrSym (rank %d, device %d): %s failed to register window #%u "
				  "(status %d, its window #%u)", c->base.rank, c->base.dev,
				  RMA_PEER(&c->mesh, q), w->base.index, (int)rail_get_u32(p),
				  rail_get_u32(p + 4));
			err = -ECONNABORTED;
		}
		w->peer_rkey[q] = rail_get_u32(p + 8);
		w->peer_base[q] = rail_get_u64(p + 16);
		w->peer_size[q] = rail_get_u64(p + 24);
	}
	free(out);
	free(in);
	return err ? err : e;
}

static int ib_rma_reg(struct rail_rma_coll *base, void *data, size_t size, int type,
		      uint64_t flags, int fd, uint64_t offset, struct rail_rma_mr **out)
{
	struct rma_ib_coll *c = (struct rma_ib_coll *)base;
	struct rma_ib_mr *w = calloc(1, sizeof(*w));
	int err;

	if (!w)
		return -ENOMEM;
	w->base = (struct rail_rma_mr){ .coll = base, .index = c->nwins++, .type = type,
					.flags = flags, .base = data, .size = size };
	err = win_local(c, w, fd, offset);
	if (w->peer_base)
		err = win_exchange(c, w, err);
	if (err) {
		win_free(w);
		return err;
	}
	*out = &w->base;
	return 0;
}

static int ib_rma_dereg(struct rail_rma_coll *base, struct rail_rma_mr *mr)
{
	(void)base;
	win_free((struct rma_ib_mr *)mr);
	return 0;
}

static int ib_rma_last_error(struct rail_rma_ctx *x)
{
	return atomic_load(&((struct rma_ib_ctx *)x)->coll->err);
}

const struct rail_rma_ops rail_rma_ib_ops = {
	.name = "ib",
	/* what the device's ladder allows: the net properties mask it (rail_rma_get_properties) */
	.ptr_support = RAIL_PTR_HOST | RAIL_PTR_CUDA | RAIL_PTR_DMABUF,
	.listen = ib_rma_listen,
	.connect = ib_rma_connect,
	.create_ctx = ib_rma_create_ctx,
	.reg = ib_rma_reg,
	.dereg = ib_rma_dereg,
	.post = rma_ib_post,
	.flush = rma_ib_flush,
	.test = rma_ib_test,
	.progress = rma_ib_progress,
	.last_error = ib_rma_last_error,
	.destroy_ctx = ib_rma_destroy_ctx,
	.close_coll = ib_rma_close_coll,
	.close_listen = ib_rma_close_listen,
};
