/* nccl-net-rail: the version-neutral API; errno -> ncclResult_t happens here. */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "api_int.h"
#include "fdlimit.h"
#include "gpu.h"
#include "handles.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "stats.h"
#include "topo/topo.h"

#define RAIL_CTX_MAGIC 0x43545852u /* "RXTC": the kind of a context's handle */
#define RAIL_MR_MAGIC 0x524d5852u  /* "RXMR": the kind of a registration's handle */

_Static_assert(RAIL_MAX_REQUESTS * RAIL_MAX_RECVS <= 1u << RAIL_H_REQ_BITS,
	       "a request handle has room for every request of a comm");

/*
 * Contexts, comms, memory registrations and requests reach NCCL as handles
 * (src/handles.h), never as pointers: a handle used after its object died
 * is refused with a WARN without reading freed memory.
 */
struct rail_ctx {
	uint64_t comm_id;
	int traffic_class;
};

static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;
static int api_refs;		/* live contexts, plus one for a legacy init */
static int api_legacy;
static const struct rail_transport_ops *api_ops;
static int api_topo_fd = -1;	/* the NCCL topology memfd we exported */
static char api_why[512];	/* why api_ops was chosen */
/* NCCL asked a device's properties: it uses this plugin as its network. */
static int api_props_asked;

ncclResult_t rail_result(int err)
{
	switch (err) {
	case 0:
		return ncclSuccess;
	case -ECONNRESET:
	case -ECONNREFUSED:
	case -ECONNABORTED:
	case -EPIPE:
	case -ENOTCONN:
	case -ETIMEDOUT:
	case -EHOSTUNREACH:
	case -ENETUNREACH:
	case -EPROTO:
	case -EREMOTEIO:
	case -RAIL_ECLOSED:
		return ncclRemoteError;
	case -EMSGSIZE:
		return ncclInvalidUsage;
	case -EINVAL:
	case -EBADF:
	case -ENOSPC:
	case -EALREADY:
	case -EOPNOTSUPP:
		return ncclInternalError;
	default:
		return ncclSystemError;
	}
}

/*
 * Log the NIC choice for this process's GPU (or every GPU when unknown).
 * Where the PCIe tree hides locality and the operator gave a mapping, write
 * an NCCL topology file saying it and point NCCL_TOPO_FILE at it (NCCL reads
 * it after the plugin's init), unless the user set NCCL_TOPO_FILE.
 */
static void apply_topology(const struct rail_transport_ops *ops)
{
	const struct rail_topo *t = rail_topo_get();
	char bdf[32], path[256];
	const char *user = getenv("NCCL_TOPO_FILE");
	int err;

	if (!t || t->ngpus == 0)
		return;
	if (rail_current_gpu_bdf(bdf, sizeof(bdf)) == 0)
		rail_topo_log_gpu(t, bdf);
	else
		rail_topo_log(t);
	if (ops != &rail_ib_ops || !t->map_used)
		return;
	if (user && user[0]) {
		RAIL_INFO(RAIL_LOG_INIT, "topology: NCCL_TOPO_FILE=%s is set, so the mapping from "
			  "NCCL_RAIL_GPU_NIC_MAP is not exported to NCCL", user);
		return;
	}
	err = rail_topo_write_nccl_xml(t, NULL, path, sizeof(path));
	if (err < 0) {
		RAIL_WARN("topology: writing the NCCL topology file for NCCL_RAIL_GPU_NIC_MAP "
			  "failed: %s; NCCL will not see the mapping", RAIL_ERRSTR(err));
	} else if (err == 1) {
		setenv("NCCL_TOPO_FILE", path, 1);
		/* A memory file: closed, and the variable dropped, at the last finalize. */
		if (!strncmp(path, "/proc/self/fd/", 14))
			api_topo_fd = atoi(path + 14);
		RAIL_INFO(RAIL_LOG_INIT, "topology: the PCIe tree hides locality; NCCL_TOPO_FILE "
			  "set to %s, which places each GPU with the NICs NCCL_RAIL_GPU_NIC_MAP "
			  "gives it", path);
	}
}

static ncclResult_t init_locked(ncclDebugLogger_t logger, const char *abi)
{
	char why[512] = "", devs[768] = "";
	const struct rail_transport_ops *ops;

	if (logger)
		rail_log_set_logger((rail_logger_fn)logger);
	if (api_ops) {
		api_refs++;
		return ncclSuccess;
	}
	rail_params_load();
	(void)rail_nofile_raise();	/* a failure is warned; the limit stays */
	ops = rail_transport_select(why, sizeof(why));
	if (!ops) {
		RAIL_WARN("init failed: %s", why);
		return ncclSystemError;
	}
	api_ops = ops;
	api_refs++;
	rail_strlcpy(api_why, why, sizeof(api_why));
	ops->describe(devs, sizeof(devs));
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET,
		  "nccl-net-rail %s (%s): using the %s transport because %s; %s",
		  RAIL_VERSION_STRING, abi, ops->name, why, devs);
	apply_topology(ops);
	return ncclSuccess;
}

/* A new context handle and a reference on the process state; abi names the caller's ABI. */
static ncclResult_t ctx_init(void **ctx, uint64_t comm_id, int traffic_class,
			     ncclDebugLogger_t logger, const char *abi)
{
	struct rail_ctx *c;
	ncclResult_t res;
	uintptr_t h;
	int err;

	if (!ctx)
		return ncclInvalidArgument;
	c = calloc(1, sizeof(*c));
	if (!c)
		return ncclSystemError;
	c->comm_id = comm_id;
	c->traffic_class = traffic_class;
	err = rail_h_alloc(RAIL_HT_CTX, RAIL_CTX_MAGIC, c, 0, &h, NULL);
	if (err) {
		RAIL_WARN("init: no handle for a new context: %s (more than 65536 contexts open?)",
			  RAIL_ERRSTR(err));
		free(c);
		return ncclSystemError;
	}
	pthread_mutex_lock(&api_lock);
	res = init_locked(logger, abi);
	pthread_mutex_unlock(&api_lock);
	if (res != ncclSuccess) {
		void *obj;

		rail_h_free(RAIL_HT_CTX, h, &obj, NULL);
		free(c);
		return res;
	}
	*ctx = (void *)h;
	return ncclSuccess;
}

ncclResult_t rail_net_init(void **ctx, uint64_t comm_id, int traffic_class,
			   ncclDebugLogger_t logger, int abi_version)
{
	char abi[32];

	snprintf(abi, sizeof(abi), "net ABI v%d", abi_version);
	return ctx_init(ctx, comm_id, traffic_class, logger, abi);
}

ncclResult_t rail_core_init(void **ctx, uint64_t comm_id, ncclDebugLogger_t logger,
			    const char *abi)
{
	return ctx_init(ctx, comm_id, -1, logger, abi);
}

ncclResult_t rail_net_init_legacy(ncclDebugLogger_t logger, int abi_version)
{
	ncclResult_t res = ncclSuccess;

	pthread_mutex_lock(&api_lock);
	if (!api_legacy) {
		char abi[32];

		snprintf(abi, sizeof(abi), "net ABI v%d", abi_version);
		res = init_locked(logger, abi);
		api_legacy = res == ncclSuccess;
	} else if (logger) {
		rail_log_set_logger((rail_logger_fn)logger);
	}
	pthread_mutex_unlock(&api_lock);
	return res;
}

/*
 * Keep this library mapped for the rest of the process: helper threads of
 * comms left open would run unmapped code after NCCL's dlclose.
 */
static void pin_library(void)
{
	Dl_info info;

	if (dladdr((void *)rail_net_finalize, &info) && info.dli_fname &&
	    !dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE))
		RAIL_WARN("finalize: pinning %s in memory failed: %s", info.dli_fname, dlerror());
}

static struct rail_ctx *ctx_of(void *ctx)
{
	uint32_t kind;

	struct rail_ctx *c = ctx ? rail_h_get(RAIL_HT_CTX, (uintptr_t)ctx, &kind) : NULL;

	/* The table also holds the RMA contexts (api_rma.c): not ours. */
	return c && kind == RAIL_CTX_MAGIC ? c : NULL;
}

/* The last finalize: stop everything, or say honestly why not. Holds api_lock. */
static ncclResult_t finalize_last(void)
{
	int live = rail_comm_live();

	if (live > 0) {
		RAIL_WARN("finalize: %d comms (listen, send, receive or RMA) are still open; their helper "
			  "threads keep running, so the %s transport stays up and the library stays "
			  "loaded (dlclose will not unload it). Close every comm before the last "
			  "finalize", live, api_ops->name);
		pin_library();
		return ncclInvalidUsage;
	}
	api_ops->fini();
	api_ops = NULL;
	api_props_asked = 0;
	rail_stats_finalize();
	rail_topo_reset();
	rail_params_unload();
	if (api_topo_fd >= 0) {
		close(api_topo_fd);
		api_topo_fd = -1;
		unsetenv("NCCL_TOPO_FILE");
	}
	rail_h_release_if_empty();
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "finalized: no comm open, every thread stopped");
	rail_log_set_logger(NULL);
	return ncclSuccess;
}

ncclResult_t rail_net_finalize(void *ctx)
{
	ncclResult_t res = ncclSuccess;
	void *c;

	/* NCCL calls finalize even after a failed init, with no context. */
	if (!ctx)
		return ncclSuccess;
	if (!ctx_of(ctx) || rail_h_free(RAIL_HT_CTX, (uintptr_t)ctx, &c, NULL)) {
		RAIL_WARN("finalize: %p is not a context of this plugin (finalized already, or "
			  "never returned by init)", ctx);
		return ncclInternalError;
	}
	free(c);
	pthread_mutex_lock(&api_lock);
	if (api_refs > 0 && --api_refs == 0 && api_ops)
		res = finalize_last();
	pthread_mutex_unlock(&api_lock);
	return res;
}

int rail_net_transport_info(const char **name, char *why, size_t why_len, char *devs,
			    size_t devs_len)
{
	int err = -ENODEV;

	pthread_mutex_lock(&api_lock);
	if (api_ops) {
		*name = api_ops->name;
		rail_strlcpy(why, api_why, why_len);
		api_ops->describe(devs, devs_len);
		err = 0;
	}
	pthread_mutex_unlock(&api_lock);
	return err;
}

const char *rail_net_in_use(void)
{
	const char *name = NULL;

	pthread_mutex_lock(&api_lock);
	if (api_ops && __atomic_load_n(&api_props_asked, __ATOMIC_RELAXED))
		name = api_ops->name;
	pthread_mutex_unlock(&api_lock);
	return name;
}

static const struct rail_transport_ops *ops_or_warn(const char *call)
{
	const struct rail_transport_ops *ops = api_ops;

	if (!ops)
		RAIL_WARN("%s called before a successful init", call);
	return ops;
}

ncclResult_t rail_net_devices(int *ndev)
{
	const struct rail_transport_ops *ops = ops_or_warn("devices");

	if (!ops || !ndev)
		return ncclInternalError;
	*ndev = ops->ndevs();
	return ncclSuccess;
}

static int check_dev(const struct rail_transport_ops *ops, const char *call, int dev)
{
	int n = ops->ndevs();

	if (dev < 0 || dev >= n) {
		RAIL_WARN("%s: device %d does not exist (%d devices)", call, dev, n);
		return -EINVAL;
	}
	return 0;
}

/* mark: NCCL asks for its network (the net tables), not for RMA. */
static ncclResult_t get_props(int dev, struct rail_props *props, int mark, const char *call)
{
	const struct rail_transport_ops *ops = ops_or_warn(call);
	int err;

	if (!ops || !props)
		return ncclInternalError;
	err = check_dev(ops, call, dev);
	if (!err) {
		if (mark)
			__atomic_store_n(&api_props_asked, 1, __ATOMIC_RELAXED);
		memset(props, 0, sizeof(*props));
		props->rail_id = props->plane_id = -1;
		err = ops->get_props(dev, props);
	}
	return rail_result(err);
}

ncclResult_t rail_net_get_properties(int dev, struct rail_props *props)
{
	return get_props(dev, props, 1, "getProperties");
}

ncclResult_t rail_core_get_properties(int dev, struct rail_props *props, const char *call)
{
	return get_props(dev, props, 0, call);
}

/* Give a new comm of the transport a handle; on failure the comm is closed. */
static int comm_publish(struct rail_comm *c, const char *call, void **out)
{
	uintptr_t h;
	uint32_t idx;
	int err = rail_h_alloc(RAIL_HT_COMM, c->kind, c, 0, &h, &idx);

	if (err) {
		RAIL_WARN("%s: no handle for a new %s comm on device %d: %s (%u comms open)", call,
			  kind_name(c->kind), c->dev, RAIL_ERRSTR(err), rail_h_live(RAIL_HT_COMM));
		if (c->kind == RAIL_COMM_SEND)
			c->ops->close_send(c);
		else if (c->kind == RAIL_COMM_RECV)
			c->ops->close_recv(c);
		else
			c->ops->close_listen(c);
		return err;
	}
	c->handle = h;
	c->hidx = idx;
	/* Request stamps of a new comm in a reused slot start far from the last one's. */
	c->stamp = (uint32_t)(h >> RAIL_H_IDX_BITS) * 0x9e3779b1u;
	*out = (void *)h;
	return 0;
}

int rail_net_adopt_comm(struct rail_comm *comm, void **handle)
{
	return comm_publish(comm, "adopt", handle);
}

ncclResult_t rail_net_listen(void *ctx, int dev, void *handle, void **listen_comm)
{
	const struct rail_transport_ops *ops = ops_or_warn("listen");
	struct rail_comm *lc = NULL;
	int err;

	(void)ctx;
	if (!ops || !handle || !listen_comm)
		return ncclInternalError;
	err = check_dev(ops, "listen", dev);
	if (!err)
		err = ops->listen(dev, handle, &lc);
	if (!err)
		err = comm_publish(lc, "listen", listen_comm);
	return rail_result(err);
}

ncclResult_t rail_net_connect(void *ctx, int dev, int traffic_class, void *handle,
			      void **send_comm)
{
	const struct rail_transport_ops *ops = ops_or_warn("connect");
	struct rail_conn_opts opts = { .traffic_class = traffic_class };
	struct rail_ctx *c = ctx_of(ctx);
	struct rail_comm *sc = NULL;
	int err;

	if (!ops || !handle || !send_comm)
		return ncclInternalError;
	if (opts.traffic_class < 0 && c)
		opts.traffic_class = c->traffic_class;
	err = check_dev(ops, "connect", dev);
	if (!err)
		err = ops->connect(dev, &opts, handle, &sc);
	if (!err && sc)
		err = comm_publish(sc, "connect", send_comm);
	else if (!err)
		*send_comm = NULL;
	return rail_result(err);
}

ncclResult_t rail_net_accept(void *listen_comm, void **recv_comm)
{
	struct rail_comm *lc = comm_of(listen_comm, RAIL_COMM_LISTEN, "accept");
	struct rail_comm *rc = NULL;
	int err;

	if (!lc || !recv_comm)
		return ncclInternalError;
	err = lc->ops->accept(lc, &rc);
	if (!err && rc)
		err = comm_publish(rc, "accept", recv_comm);
	else if (!err)
		*recv_comm = NULL;
	return rail_result(err);
}

static struct rail_comm *data_comm_of(void *p, const char *call)
{
	uint32_t k = 0;
	struct rail_comm *c = rail_h_get(RAIL_HT_COMM, (uintptr_t)p, &k);

	if (!c || (k != RAIL_COMM_SEND && k != RAIL_COMM_RECV)) {
		RAIL_WARN("%s: %p is not an open send or receive comm of this plugin (%s)", call,
			  p, c ? "a listen comm"
			  : "closed already, or never returned by connect or accept");
		return NULL;
	}
	return c;
}

/* A registration's handle for the transport's object; the registration is undone on failure. */
static int mr_publish(struct rail_comm *c, void *mh, const char *call, void **out)
{
	uintptr_t h;
	int err = rail_h_alloc(RAIL_HT_MR, RAIL_MR_MAGIC, mh, c->handle, &h, NULL);

	if (err) {
		RAIL_WARN("%s on device %d: no handle for a new registration: %s (%u live)", call,
			  c->dev, RAIL_ERRSTR(err), rail_h_live(RAIL_HT_MR));
		c->ops->dereg_mr(c, mh);
		return err;
	}
	*out = (void *)h;
	return 0;
}

ncclResult_t rail_net_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
	struct rail_comm *c = data_comm_of(comm, "regMr");
	void *mh = NULL;
	int err;

	if (!c || !mhandle)
		return ncclInternalError;
	if (type != RAIL_PTR_HOST && type != RAIL_PTR_CUDA) {
		RAIL_WARN("regMr(%p, %zu bytes) on device %d: unknown pointer type 0x%x, neither "
			  "NCCL_PTR_HOST (0x%x) nor NCCL_PTR_CUDA (0x%x); DMA-BUF memory goes through "
			  "regMrDmaBuf", data, size, c->dev, (unsigned)type, RAIL_PTR_HOST,
			  RAIL_PTR_CUDA);
		return ncclInternalError;
	}
	err = c->ops->reg_mr(c, data, size, type, &mh);
	if (!err)
		err = mr_publish(c, mh, "regMr", mhandle);
	return rail_result(err);
}

ncclResult_t rail_net_reg_mr_dmabuf(void *comm, void *data, size_t size, int type,
				    uint64_t offset, int fd, void **mhandle)
{
	struct rail_comm *c = data_comm_of(comm, "regMrDmaBuf");
	void *mh = NULL;
	int err;

	if (!c || !mhandle)
		return ncclInternalError;
	if (!c->ops->reg_mr_dmabuf) {
		/* Without DMA-BUF support we never advertise NCCL_PTR_DMABUF. */
		if (type != RAIL_PTR_HOST && fd >= 0) {
			RAIL_WARN("regMrDmaBuf(%p, %zu bytes, fd %d): the %s transport has no "
				  "DMA-BUF support", data, size, fd, c->ops->name);
			return ncclInternalError;
		}
		err = c->ops->reg_mr(c, data, size, type, &mh);
	} else {
		err = c->ops->reg_mr_dmabuf(c, data, size, type, offset, fd, &mh);
	}
	if (!err)
		err = mr_publish(c, mh, "regMrDmaBuf", mhandle);
	return rail_result(err);
}

ncclResult_t rail_net_dereg_mr(void *comm, void *mhandle)
{
	struct rail_comm *c = data_comm_of(comm, "deregMr");
	void *mh;
	uint32_t k;

	if (!c)
		return ncclInternalError;
	if (!mhandle)
		return ncclSuccess;
	mh = rail_h_get(RAIL_HT_MR, (uintptr_t)mhandle, &k);
	if (!mh || !rail_h_owned_by((uintptr_t)mhandle, c->handle)) {
		RAIL_WARN("deregMr(%p) on the %s comm %p (device %d): %s", mhandle,
			  kind_name(c->kind), comm, c->dev, mh ? "registered on another comm"
			  : "not a live registration (deregistered twice, or never registered)");
		return ncclInternalError;
	}
	/* One of two racing deregMr calls wins the handle; only it deregisters. */
	if (rail_h_free(RAIL_HT_MR, (uintptr_t)mhandle, &mh, NULL)) {
		RAIL_WARN("deregMr(%p): deregistered by another thread meanwhile", mhandle);
		return ncclInternalError;
	}
	return rail_result(c->ops->dereg_mr(c, mh));
}

/* The comm's counters, to the summary and the process total (NCCL_RAIL_STATS). */
static void comm_report(struct rail_comm *c, enum rail_comm_kind kind)
{
	char desc[512] = "";

	if (rail_stats_mode() && c->ops->describe_comm)
		c->ops->describe_comm(c, 0, desc, sizeof(desc));
	rail_stats_report(&c->st, kind == RAIL_COMM_SEND ? "send" : "recv", c->ops->name, c->dev,
			  desc);
}

static ncclResult_t close_comm(void *p, enum rail_comm_kind kind, const char *call)
{
	struct rail_comm *c = comm_of(p, kind, call);
	void *obj, *mh;
	int err, left = 0;

	if (!c)
		return ncclInternalError;
	while (kind != RAIL_COMM_LISTEN && !comm_enter(c))
		sched_yield();	/* the transport's thread finishes its step; then it is ours */
	rail_flight_call(&c->fl);
	/* Registrations NCCL did not deregister go with the comm (their handles die too). */
	while (rail_h_take_owned((uintptr_t)p, &mh)) {
		c->ops->dereg_mr(c, mh);
		left++;
	}
	if (left)
		RAIL_INFO(RAIL_LOG_NET, "%s: %d memory registrations were still live; released "
			  "with the comm", call, left);
	/* One of two racing closes wins the handle; only it closes. */
	if (rail_h_free(RAIL_HT_COMM, (uintptr_t)p, &obj, NULL)) {
		RAIL_WARN("%s: %p closed by another thread meanwhile", call, p);
		return ncclInternalError;
	}
	if (kind != RAIL_COMM_LISTEN)
		comm_report(c, kind);
	if (kind == RAIL_COMM_SEND)
		err = c->ops->close_send(c);
	else if (kind == RAIL_COMM_RECV)
		err = c->ops->close_recv(c);
	else
		err = c->ops->close_listen(c);
	return rail_result(err);
}

ncclResult_t rail_net_close_send(void *send_comm)
{
	return close_comm(send_comm, RAIL_COMM_SEND, "closeSend");
}

ncclResult_t rail_net_close_recv(void *recv_comm)
{
	return close_comm(recv_comm, RAIL_COMM_RECV, "closeRecv");
}

ncclResult_t rail_net_close_listen(void *listen_comm)
{
	return close_comm(listen_comm, RAIL_COMM_LISTEN, "closeListen");
}

ncclResult_t rail_net_make_vdevice(int *d, int ndevs, const int *devs, int max_devs)
{
	const struct rail_transport_ops *ops = ops_or_warn("makeVDevice");
	int vdev = -1, err;

	if (!ops || !d || !devs)
		return ncclInternalError;
	if (!ops->make_vdevice) {
		RAIL_WARN("makeVDevice: the %s transport cannot fuse devices; set "
			  "NCCL_NET_MERGE_LEVEL=LOC to stop NCCL asking", ops->name);
		return ncclInvalidUsage;
	}
	if (ndevs < 1 || ndevs > max_devs || ndevs > RAIL_MAX_VDEV_DEVS) {
		RAIL_WARN("makeVDevice: %d devices, at most %d can be fused", ndevs,
			  RAIL_MIN(max_devs, RAIL_MAX_VDEV_DEVS));
		return ncclInvalidUsage;
	}
	for (int i = 0; i < ndevs; i++) {
		if (check_dev(ops, "makeVDevice", devs[i]))
			return ncclInvalidArgument;
	}
	err = ops->make_vdevice(ndevs, devs, &vdev);
	if (!err)
		*d = vdev;
	return rail_result(err);
}

int rail_net_can_fuse(void)
{
	const struct rail_transport_ops *ops = api_ops;

	return ops && ops->make_vdevice;
}

ncclResult_t rail_net_set_net_attr(void *ctx, const void *attr)
{
	/* A hint only; the transports size themselves from their parameters. */
	(void)ctx;
	(void)attr;
	return ncclSuccess;
}
