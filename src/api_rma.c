/*
 * nccl-net-rail: the version-neutral RMA API (api_rma.h); errno ->
 * ncclResult_t happens here, through rail_result.
 *
 * Handles NCCL holds: listen comms and collComms in the comm table, RMA
 * contexts in the context table, windows in the registration table (owned
 * by their collComm, so closeColl releases what NCCL left), each with its
 * own kind, so that a handle of the net tables, or of another kind, is
 * refused with a WARN. A request is a number too:
 *
 *   tag 'R' u8 | context slot u16 | request index u16 | stamp u24
 *
 * the backend checks the stamp against the request it hands out.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "api_rma.h"
#include "cuda.h"
#include "handles.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "rma/rma.h"

#define RMA_REQ_IDX_BITS 16
#define RMA_REQ_STAMP_BITS 24

static pthread_mutex_t rma_lock = PTHREAD_MUTEX_INITIALIZER;
static int rma_refs;			/* live contexts of rail_rma_init */
static const struct rail_rma_ops *rma_ops;

_Static_assert(RAIL_RMA_SIGNAL_INC == 1 && RAIL_RMA_SIGNAL_ADD == 2, "NCCL's signal ops");

/*
 * Which backend serves RMA now, and why (or why none). Holds rma_lock.
 * NCCL_RAIL_RMA is read after the core's init loaded the parameters.
 */
static const struct rail_rma_ops *choose(char *why, size_t len)
{
	char twhy[8], tdevs[8];
	const char *tname = NULL;

	if (!rail_param_int(RAIL_P_RMA)) {
		snprintf(why, len, "NCCL_RAIL_RMA=0");
		return NULL;
	}
	if (rail_net_transport_info(&tname, twhy, sizeof(twhy), tdevs, sizeof(tdevs))) {
		snprintf(why, len, "no transport is initialised");
		return NULL;
	}
	return rail_rma_backend(tname, why, len);
}

ncclResult_t rail_rma_init(void **ctx, uint64_t comm_id, ncclDebugLogger_t logger,
			   int abi_version)
{
	const struct rail_rma_ops *ops;
	char abi[32], why[256] = "";
	void *c = NULL;
	ncclResult_t res;

	if (!ctx)
		return ncclInvalidArgument;
	snprintf(abi, sizeof(abi), "RMA ABI v%d", abi_version);
	res = rail_core_init(&c, comm_id, logger, abi);
	if (res != ncclSuccess) {
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "RMA (ABI v%d): not offered: the plugin "
			  "did not initialise (above); NCCL uses its own RMA backend if it has one",
			  abi_version);
		return res;
	}
	pthread_mutex_lock(&rma_lock);
	ops = choose(why, sizeof(why));
	if (!ops) {
		pthread_mutex_unlock(&rma_lock);
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "RMA (ABI v%d): not offered because %s; "
			  "NCCL uses its own RMA backend if it has one", abi_version, why);
		rail_net_finalize(c);
		return ncclInvalidUsage;
	}
	/* NCCL made its device current: the context GPU windows are reached in. */
	rail_cuda_note_ctx();
	if (rma_refs++ == 0) {
		__atomic_store_n(&rma_ops, ops, __ATOMIC_RELEASE);
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "RMA (ABI v%d): served by the %s backend "
			  "because %s", abi_version, ops->name, why);
	}
	pthread_mutex_unlock(&rma_lock);
	*ctx = c;
	return ncclSuccess;
}

ncclResult_t rail_rma_finalize(void *ctx)
{
	/* NCCL may finalize after a failed init, with no context. */
	if (!ctx)
		return ncclSuccess;
	pthread_mutex_lock(&rma_lock);
	if (rma_refs > 0 && --rma_refs == 0)
		__atomic_store_n(&rma_ops, NULL, __ATOMIC_RELEASE);	/* objects keep their own */
	pthread_mutex_unlock(&rma_lock);
	return rail_net_finalize(ctx);
}

static const struct rail_rma_ops *ops_or_warn(const char *call)
{
	const struct rail_rma_ops *ops = __atomic_load_n(&rma_ops, __ATOMIC_ACQUIRE);

	if (!ops)
		RAIL_WARN("RMA %s called before a successful RMA init", call);
	return ops;
}

ncclResult_t rail_rma_devices(int *ndev)
{
	if (!ops_or_warn("devices"))
		return ncclInternalError;
	return rail_net_devices(ndev);
}

ncclResult_t rail_rma_get_properties(int dev, struct rail_props *props)
{
	const struct rail_rma_ops *ops = ops_or_warn("getProperties");
	ncclResult_t res;

	if (!ops)
		return ncclInternalError;
	res = rail_core_get_properties(dev, props, "RMA getProperties");
	if (res == ncclSuccess) {
		props->ptr_support &= ops->ptr_support;
		props->max_recvs = 1;
	}
	return res;
}

/* ---- lookups ---------------------------------------------------------------- */

static void *obj_of(enum rail_htab_id t, void *h, uint32_t kind, const char *call,
		    const char *what)
{
	uint32_t k = 0;
	void *o = h ? rail_h_get(t, (uintptr_t)h, &k) : NULL;

	if (rail_unlikely(!o || k != kind)) {
		RAIL_WARN("RMA %s: %p is not a live %s of this plugin (%s)", call, h, what,
			  !h ? "NULL" : o ? "a handle of another kind"
			  : "closed or deregistered already, or never returned");
		return NULL;
	}
	return o;
}

static struct rail_rma_coll *coll_of(void *h, const char *call)
{
	return obj_of(RAIL_HT_COMM, h, RAIL_RMA_COLL_MAGIC, call, "collComm");
}

static struct rail_rma_ctx *ctx_of(void *h, const char *call)
{
	return obj_of(RAIL_HT_CTX, h, RAIL_RMA_CTX_MAGIC, call, "RMA context");
}

/* A window of this collComm; NULL allowed only when may_null (a size-0 operation). */
static int mr_of(void *h, const struct rail_rma_coll *c, int may_null, const char *call,
		 const char *what, const struct rail_rma_mr **out)
{
	const struct rail_rma_mr *mr;

	if (!h && may_null) {
		*out = NULL;
		return 0;
	}
	mr = obj_of(RAIL_HT_MR, h, RAIL_RMA_MR_MAGIC, call, what);
	if (!mr)
		return -EINVAL;
	if (rail_unlikely(mr->coll != c)) {
		RAIL_WARN("RMA %s: %s %p was registered on another collComm", call, what, h);
		return -EINVAL;
	}
	*out = mr;
	return 0;
}

/* ---- connections --------------------------------------------------------------- */

ncclResult_t rail_rma_listen(void *ctx, int dev, void *handle, void **listen_comm)
{
	const struct rail_rma_ops *ops = ops_or_warn("listen");
	struct rail_rma_listen *lc = NULL;
	int ndev = 0, err;
	uintptr_t h;

	(void)ctx;
	if (!ops || !handle || !listen_comm)
		return ncclInternalError;
	if (rail_net_devices(&ndev) != ncclSuccess || dev < 0 || dev >= ndev) {
		RAIL_WARN("RMA listen: device %d does not exist (%d devices)", dev, ndev);
		return ncclInternalError;
	}
	err = ops->listen(dev, handle, &lc);
	if (err)
		return rail_result(err);
	err = rail_h_alloc(RAIL_HT_COMM, RAIL_RMA_LISTEN_MAGIC, lc, 0, &h, NULL);
	if (err) {
		RAIL_WARN("RMA listen on device %d: no handle: %s", dev, RAIL_ERRSTR(err));
		ops->close_listen(lc);
		return rail_result(err);
	}
	*listen_comm = (void *)h;
	return ncclSuccess;
}

static int check_handles(void *const *handles, int nranks, int rank)
{
	if (!handles || nranks < 1 || nranks > RAIL_RMA_MAX_RANKS || rank < 0 || rank >= nranks) {
		RAIL_WARN("RMA connect: rank %d of %d ranks, handles %p: %s", rank, nranks,
			  (void *)handles, !handles ? "no handle array"
			  : "the rank or the number of ranks is out of range");
		return -EINVAL;
	}
	for (int i = 0; i < nranks; i++) {
		if (!handles[i]) {
			RAIL_WARN("RMA connect (rank %d of %d): the handle of rank %d is NULL", rank,
				  nranks, i);
			return -EINVAL;
		}
	}
	return 0;
}

ncclResult_t rail_rma_connect(void *ctx, void *const *handles, int nranks, int rank,
			      void *listen_comm, void **coll)
{
	struct rail_rma_listen *lc;
	struct rail_rma_coll *c = NULL;
	uintptr_t h;
	int err;

	(void)ctx;	/* may be the net plugin's context, or another plugin's: never read */
	lc = obj_of(RAIL_HT_COMM, listen_comm, RAIL_RMA_LISTEN_MAGIC, "connect", "listen comm");
	if (!lc || !coll)
		return ncclInternalError;
	err = check_handles(handles, nranks, rank);
	if (!err)
		err = lc->ops->connect(lc, handles, nranks, rank, &c);
	if (err)
		return rail_result(err);
	err = rail_h_alloc(RAIL_HT_COMM, RAIL_RMA_COLL_MAGIC, c, 0, &h, NULL);
	if (err) {
		RAIL_WARN("RMA connect (rank %d of %d): no handle: %s", rank, nranks,
			  RAIL_ERRSTR(err));
		c->ops->close_coll(c);
		return rail_result(err);
	}
	c->handle = h;
	*coll = (void *)h;
	return ncclSuccess;
}

ncclResult_t rail_rma_create_context(void *coll, int ncontexts, int traffic_class,
				     int rank_stride, void **rma_ctx)
{
	struct rail_rma_coll *c = coll_of(coll, "createContext");
	struct rail_rma_ctx *x = NULL;
	uintptr_t h;
	int err;

	if (!c || !rma_ctx)
		return ncclInternalError;
	if (ncontexts < 1 || ncontexts > RAIL_RMA_MAX_CONTEXTS || rank_stride < 1 ||
	    c->nranks % rank_stride) {
		RAIL_WARN("RMA createContext (rank %d of %d, device %d): %d contexts with rank "
			  "stride %d: %s", c->rank, c->nranks, c->dev, ncontexts, rank_stride,
			  ncontexts < 1 || ncontexts > RAIL_RMA_MAX_CONTEXTS
			  ? "the number of contexts is out of range (1..64)"
			  : "the stride must be at least 1 and divide the number of ranks");
		return ncclInvalidArgument;
	}
	err = c->ops->create_ctx(c, ncontexts, traffic_class, rank_stride, &x);
	if (err)
		return rail_result(err);
	err = rail_h_alloc(RAIL_HT_CTX, RAIL_RMA_CTX_MAGIC, x, 0, &h, NULL);
	if (err) {
		RAIL_WARN("RMA createContext (rank %d of %d): no handle: %s", c->rank, c->nranks,
			  RAIL_ERRSTR(err));
		c->ops->destroy_ctx(x);
		return rail_result(err);
	}
	x->handle = h;
	pthread_mutex_lock(&rma_lock);
	x->next = c->ctxs;
	c->ctxs = x;
	pthread_mutex_unlock(&rma_lock);
	*rma_ctx = (void *)h;
	return ncclSuccess;
}

static void ctx_unlink(struct rail_rma_ctx *x)
{
	struct rail_rma_ctx **p;

	pthread_mutex_lock(&rma_lock);
	for (p = &x->coll->ctxs; *p && *p != x; p = &(*p)->next)
		;
	if (*p)
		*p = x->next;
	pthread_mutex_unlock(&rma_lock);
}

ncclResult_t rail_rma_destroy_context(void *rma_ctx)
{
	struct rail_rma_ctx *x = ctx_of(rma_ctx, "destroyContext");
	void *obj;

	if (!x)
		return ncclInternalError;
	if (rail_h_free(RAIL_HT_CTX, (uintptr_t)rma_ctx, &obj, NULL)) {
		RAIL_WARN("RMA destroyContext(%p): destroyed by another thread meanwhile", rma_ctx);
		return ncclInternalError;
	}
	ctx_unlink(x);
	return rail_result(x->coll->ops->destroy_ctx(x));
}

ncclResult_t rail_rma_close_coll(void *coll)
{
	struct rail_rma_coll *c = coll_of(coll, "closeColl");
	void *mr, *obj;
	int left = 0;

	if (!c)
		return ncclInternalError;
	/* Contexts and windows NCCL left go with the collComm (their handles die too). */
	for (struct rail_rma_ctx *x; (x = c->ctxs);) {
		RAIL_INFO(RAIL_LOG_NET, "RMA closeColl: a context was not destroyed; destroyed "
			  "with the collComm");
		ctx_unlink(x);
		rail_h_free(RAIL_HT_CTX, x->handle, &obj, NULL);
		c->ops->destroy_ctx(x);
	}
	while (rail_h_take_owned((uintptr_t)coll, &mr)) {
		c->ops->dereg(c, mr);
		left++;
	}
	if (left)
		RAIL_INFO(RAIL_LOG_NET, "RMA closeColl: %d windows were still registered; released "
			  "with the collComm", left);
	if (rail_h_free(RAIL_HT_COMM, (uintptr_t)coll, &obj, NULL)) {
		RAIL_WARN("RMA closeColl(%p): closed by another thread meanwhile", coll);
		return ncclInternalError;
	}
	return rail_result(c->ops->close_coll(c));
}

ncclResult_t rail_rma_close_listen(void *listen_comm)
{
	struct rail_rma_listen *lc;
	void *obj;

	lc = obj_of(RAIL_HT_COMM, listen_comm, RAIL_RMA_LISTEN_MAGIC, "closeListen",
		    "listen comm");
	if (!lc)
		return ncclInternalError;
	if (rail_h_free(RAIL_HT_COMM, (uintptr_t)listen_comm, &obj, NULL))
		return ncclInternalError;
	return rail_result(lc->ops->close_listen(lc));
}

/* ---- windows ----------------------------------------------------------------- */

ncclResult_t rail_rma_reg_mr_sym(void *coll, void *data, size_t size, int type,
				 uint64_t offset, int fd, uint64_t mr_flags, void **mhandle)
{
	const char *call = fd < 0 ? "regMrSym" : "regMrSymDmaBuf";
	struct rail_rma_coll *c = coll_of(coll, call);
	struct rail_rma_mr *mr = NULL;
	uintptr_t h;
	int err;

	if (!c || !mhandle)
		return ncclInternalError;
	/* Collective: a bad argument is the backend's to report, so every rank fails together. */
	err = c->ops->reg(c, data, size, type, mr_flags, fd, offset, &mr);
	if (err)
		return rail_result(err);
	err = rail_h_alloc(RAIL_HT_MR, RAIL_RMA_MR_MAGIC, mr, c->handle, &h, NULL);
	if (err) {
		RAIL_WARN("RMA %s(%p, %zu bytes) on device %d: no handle: %s", call, data, size,
			  c->dev, RAIL_ERRSTR(err));
		c->ops->dereg(c, mr);
		return rail_result(err);
	}
	*mhandle = (void *)h;
	return ncclSuccess;
}

ncclResult_t rail_rma_dereg_mr_sym(void *coll, void *mhandle)
{
	struct rail_rma_coll *c = coll_of(coll, "deregMrSym");
	const struct rail_rma_mr *mr;
	void *obj;

	if (!c)
		return ncclInternalError;
	if (mr_of(mhandle, c, 0, "deregMrSym", "window", &mr))
		return ncclInternalError;
	if (rail_h_free(RAIL_HT_MR, (uintptr_t)mhandle, &obj, NULL)) {
		RAIL_WARN("RMA deregMrSym(%p): deregistered by another thread meanwhile", mhandle);
		return ncclInternalError;
	}
	return rail_result(c->ops->dereg(c, obj));
}

/* ---- data -------------------------------------------------------------------- */

static void *req_encode(const struct rail_rma_ctx *x, uint32_t idx, uint32_t stamp)
{
	uint64_t v = (uint64_t)RAIL_H_TAG_RMA_REQ << 56 |
		     (uint64_t)rail_h_index(x->handle) << (RMA_REQ_IDX_BITS + RMA_REQ_STAMP_BITS) |
		     (uint64_t)idx << RMA_REQ_STAMP_BITS |
		     (stamp & ((1u << RMA_REQ_STAMP_BITS) - 1));

	return (void *)(uintptr_t)v;
}

/* The context, the rank and the context index of a data call, checked. */
static struct rail_rma_ctx *data_ctx(void *rma_ctx, int context, uint32_t rank, void **request,
				     const char *call)
{
	struct rail_rma_ctx *x = ctx_of(rma_ctx, call);
	const struct rail_rma_coll *c;
	uint32_t dist;

	if (!x || !request)
		return NULL;
	c = x->coll;
	if (rail_unlikely(context < 0 || context >= x->ncontexts || rank >= (uint32_t)c->nranks)) {
		RAIL_WARN("RMA %s (rank %d of %d, device %d): context %d of %d, target rank %u: out "
			  "of range", call, c->rank, c->nranks, c->dev, context, x->ncontexts, rank);
		return NULL;
	}
	dist = (rank + (uint32_t)c->nranks - (uint32_t)c->rank) % (uint32_t)c->nranks;
	if (rail_unlikely(dist % (uint32_t)x->stride)) {
		RAIL_WARN("RMA %s (rank %d of %d, device %d): rank %u is not a target of this "
			  "context (rank stride %d)", call, c->rank, c->nranks, c->dev, rank,
			  x->stride);
		return NULL;
	}
	return x;
}

/* The two windows of a put or a get (NULL allowed for size 0). */
static int data_mrs(const struct rail_rma_ctx *x, struct rail_rma_op *op, void *local_mh,
		    void *remote_mh)
{
	int may_null = op->size == 0;
	int err = mr_of(local_mh, x->coll, may_null, op->call,
			op->kind == RAIL_RMA_PUT ? "source window" : "local window", &op->local);

	if (!err)
		err = mr_of(remote_mh, x->coll, may_null, op->call,
			    op->kind == RAIL_RMA_PUT ? "destination window" : "remote window",
			    &op->remote);
	return err;
}

static ncclResult_t post(struct rail_rma_ctx *x, const struct rail_rma_op *op, void **request)
{
	uint32_t idx = 0, stamp = 0;
	int err = x->coll->ops->post(x, op, &idx, &stamp);

	if (err)
		return rail_result(err);
	*request = req_encode(x, idx, stamp);
	return ncclSuccess;
}

ncclResult_t rail_rma_iput(void *rma_ctx, int context, uint64_t src_off, void *src_mh,
			   size_t size, uint64_t dst_off, void *dst_mh, uint32_t rank,
			   void **request)
{
	struct rail_rma_ctx *x = data_ctx(rma_ctx, context, rank, request, "iput");
	struct rail_rma_op op = {
		.kind = RAIL_RMA_PUT, .call = "iput", .context = context, .peer = (int)rank,
		.size = size, .local_off = src_off, .remote_off = dst_off,
	};

	if (!x || data_mrs(x, &op, src_mh, dst_mh))
		return ncclInternalError;
	return post(x, &op, request);
}

ncclResult_t rail_rma_iput_signal(void *rma_ctx, int context, uint64_t src_off, void *src_mh,
				  size_t size, uint64_t dst_off, void *dst_mh, uint32_t rank,
				  uint64_t sig_off, void *sig_mh, uint64_t sig_value,
				  uint32_t sig_op, void **request)
{
	struct rail_rma_ctx *x = data_ctx(rma_ctx, context, rank, request, "iputSignal");
	struct rail_rma_op op = {
		.kind = RAIL_RMA_PUT, .call = "iputSignal", .context = context, .peer = (int)rank,
		.size = size, .local_off = src_off, .remote_off = dst_off, .sig_off = sig_off,
		.sig_add = sig_op == RAIL_RMA_SIGNAL_INC ? 1 : sig_value,
	};

	if (!x || data_mrs(x, &op, src_mh, dst_mh))
		return ncclInternalError;
	if (sig_op != RAIL_RMA_SIGNAL_INC && sig_op != RAIL_RMA_SIGNAL_ADD) {
		RAIL_WARN("RMA iputSignal to rank %u (device %d): signal op %u is neither "
			  "NCCL_NET_SIGNAL_OP_INC (1) nor NCCL_NET_SIGNAL_OP_ADD (2)", rank,
			  x->coll->dev, sig_op);
		return ncclInvalidArgument;
	}
	if (mr_of(sig_mh, x->coll, 0, "iputSignal", "signal window", &op.sig))
		return ncclInternalError;
	return post(x, &op, request);
}

ncclResult_t rail_rma_iget(void *rma_ctx, int context, uint64_t remote_off, void *remote_mh,
			   size_t size, uint64_t local_off, void *local_mh, uint32_t rank,
			   void **request)
{
	struct rail_rma_ctx *x = data_ctx(rma_ctx, context, rank, request, "iget");
	struct rail_rma_op op = {
		.kind = RAIL_RMA_GET, .call = "iget", .context = context, .peer = (int)rank,
		.size = size, .local_off = local_off, .remote_off = remote_off,
	};

	if (!x || data_mrs(x, &op, local_mh, remote_mh))
		return ncclInternalError;
	return post(x, &op, request);
}

ncclResult_t rail_rma_iflush(void *rma_ctx, int context, void *mhandle, uint32_t rank,
			     void **request)
{
	struct rail_rma_ctx *x = data_ctx(rma_ctx, context, rank, request, "iflush");
	const struct rail_rma_mr *mr;
	uint32_t idx = 0, stamp = 0;
	int err;

	if (!x || mr_of(mhandle, x->coll, 1, "iflush", "window", &mr))
		return ncclInternalError;
	err = x->coll->ops->flush(x, context, mr, &idx, &stamp);
	if (err < 0)
		return rail_result(err);
	*request = err == 1 ? NULL : req_encode(x, idx, stamp);
	return ncclSuccess;
}

ncclResult_t rail_rma_test(void *coll, void *request, int *done)
{
	struct rail_rma_coll *c = coll_of(coll, "test");
	uint64_t v = (uint64_t)(uintptr_t)request;
	uint32_t kind = 0, slot, idx, stamp;
	struct rail_rma_ctx *x;

	if (!c || !done)
		return ncclInternalError;
	slot = (uint32_t)(v >> (RMA_REQ_IDX_BITS + RMA_REQ_STAMP_BITS)) & 0xffffu;
	idx = (uint32_t)(v >> RMA_REQ_STAMP_BITS) & ((1u << RMA_REQ_IDX_BITS) - 1);
	stamp = (uint32_t)v & ((1u << RMA_REQ_STAMP_BITS) - 1);
	x = (v >> 56) == RAIL_H_TAG_RMA_REQ ? rail_h_get_idx(RAIL_HT_CTX, slot, &kind) : NULL;
	if (rail_unlikely(!x || kind != RAIL_RMA_CTX_MAGIC || x->coll != c)) {
		RAIL_WARN("RMA test (rank %d of %d, device %d): %p is not a request of this "
			  "collComm (%s)", c->rank, c->nranks, c->dev, request,
			  x && kind == RAIL_RMA_CTX_MAGIC ? "it belongs to another collComm"
			  : "its context was destroyed, or it was never returned");
		return ncclInternalError;
	}
	return rail_result(c->ops->test(x, idx, stamp, done));
}

ncclResult_t rail_rma_progress(void *rma_ctx)
{
	struct rail_rma_ctx *x = ctx_of(rma_ctx, "rmaProgress");

	if (!x)
		return ncclInternalError;
	return rail_result(x->coll->ops->progress(x));
}

ncclResult_t rail_rma_query_last_error(void *rma_ctx, int *has_error)
{
	struct rail_rma_ctx *x = ctx_of(rma_ctx, "queryLastError");

	if (!x || !has_error)
		return ncclInternalError;
	*has_error = x->coll->ops->last_error(x) != 0;
	return ncclSuccess;
}
