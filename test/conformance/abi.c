/*
 * Conformance suite: one adapter per net ABI version. Every wrapper calls
 * the ncclNetPlugin_vN table with that version's signature, the way NCCL's
 * own adapters do, and converts to the version-neutral struct in conf.h.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "net_v6.h"
#include "net_v7.h"
#include "net_v8.h"
#include "net_v9.h"
#include "net_v10.h"
#include "net_v11.h"
#include "net_v12.h"

/* A role drives one ABI at a time: the bound table of each version. */
static const ncclNet_v6_t *t6;
static const ncclNet_v7_t *t7;
static const ncclNet_v8_t *t8;
static const ncclNet_v9_t *t9;
static const ncclNet_v10_t *t10;
static const ncclNet_v11_t *t11;
static const ncclNet_v12_t *t12;

const char *rail_conf_result_str(ncclResult_t res)
{
	static const char *const names[] = {
		"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
		"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress",
		"ncclTimeout",
	};
	static __thread char other[32];

	if ((unsigned)res < sizeof(names) / sizeof(names[0]))
		return names[res];
	snprintf(other, sizeof(other), "result %d", (int)res);
	return other;
}

int rail_conf_abi_max_vdevs(int abi)
{
	return abi >= 12 ? NCCL_NET_MAX_DEVS_PER_NIC_V12 : NCCL_NET_MAX_DEVS_PER_NIC_V9;
}

/* ---- property conversion ---- */

static void props_clear(struct rail_conf_props *p)
{
	memset(p, 0, sizeof(*p));
	p->reg_is_global = p->force_flush = -1;
	p->dev_type = p->dev_version = -1;
	p->vndevs = -1;
	p->max_multi_request_size = -1;
	p->rail_id = p->plane_id = -2; /* -2: not in this ABI (-1 means unset) */
}

#define COPY_STR(dst, src)                                                        \
	do {                                                                      \
		if (src)                                                          \
			snprintf((dst), sizeof(dst), "%s", (src));                \
	} while (0)

#define COPY_V6(p, q)                                                             \
	do {                                                                      \
		COPY_STR((p)->name, (q).name);                                    \
		(p)->has_pci = (q).pciPath != NULL;                               \
		COPY_STR((p)->pci_path, (q).pciPath);                             \
		(p)->guid = (q).guid;                                             \
		(p)->ptr_support = (q).ptrSupport;                                \
		(p)->speed = (q).speed;                                           \
		(p)->port = (q).port;                                             \
		(p)->latency = (q).latency;                                       \
		(p)->max_comms = (q).maxComms;                                    \
		(p)->max_recvs = (q).maxRecvs;                                    \
	} while (0)

#define COPY_V7(p, q)                                                             \
	do {                                                                      \
		COPY_V6(p, q);                                                    \
		(p)->dev_type = (int)(q).netDeviceType;                           \
		(p)->dev_version = (q).netDeviceVersion;                          \
	} while (0)

#define COPY_V8(p, q)                                                             \
	do {                                                                      \
		COPY_V7(p, q);                                                    \
		(p)->reg_is_global = (q).regIsGlobal;                             \
	} while (0)

#define COPY_V9(p, q, maxdevs)                                                    \
	do {                                                                      \
		COPY_V8(p, q);                                                    \
		(p)->force_flush = (q).forceFlush;                                \
		(p)->vndevs = (q).vProps.ndevs;                                   \
		for (int i_ = 0; i_ < (maxdevs) && i_ < (q).vProps.ndevs; i_++)   \
			(p)->vdevs[i_] = (q).vProps.devs[i_];                     \
		(p)->max_p2p_bytes = (q).maxP2pBytes;                             \
		(p)->max_coll_bytes = (q).maxCollBytes;                           \
	} while (0)

/*
 * The plugin writes into a struct of exactly the vN size; a canary after it
 * catches a plugin filling a newer (larger) layout.
 */
#define PROPS_FN(V, COPY)                                                         \
	static ncclResult_t v##V##_get_props_raw(int dev, void *p)                \
	{                                                                         \
		return t##V->getProperties(dev, p);                               \
	}                                                                         \
	static ncclResult_t v##V##_get_props(int dev, struct rail_conf_props *p)  \
	{                                                                         \
		struct {                                                          \
			ncclNetProperties_v##V##_t q;                             \
			uint64_t canary[4];                                       \
		} s;                                                              \
		ncclResult_t res;                                                 \
		memset(&s, 0, sizeof(s));                                         \
		memset(s.canary, 0xc5, sizeof(s.canary));                         \
		res = t##V->getProperties(dev, &s.q);                             \
		props_clear(p);                                                   \
		if (res != ncclSuccess)                                           \
			return res;                                               \
		for (int i_ = 0; i_ < 4; i_++) {                                  \
			if (s.canary[i_] != 0xc5c5c5c5c5c5c5c5ull)                \
				return ncclNumResults; /* wrote past the struct */ \
		}                                                                 \
		COPY;                                                             \
		return ncclSuccess;                                               \
	}

PROPS_FN(6, COPY_V6(p, s.q))
PROPS_FN(7, COPY_V7(p, s.q))
PROPS_FN(8, COPY_V8(p, s.q))
PROPS_FN(9, COPY_V9(p, s.q, NCCL_NET_MAX_DEVS_PER_NIC_V9))
PROPS_FN(10, COPY_V9(p, s.q, NCCL_NET_MAX_DEVS_PER_NIC_V9))
PROPS_FN(11, COPY_V9(p, s.q, NCCL_NET_MAX_DEVS_PER_NIC_V9);
	 p->max_multi_request_size = s.q.maxMultiRequestSize)
PROPS_FN(12, COPY_V9(p, s.q, NCCL_NET_MAX_DEVS_PER_NIC_V12);
	 p->max_multi_request_size = s.q.maxMultiRequestSize; p->rail_id = s.q.railId;
	 p->plane_id = s.q.planeId)

/* ---- functions with the same signature in every version ---- */

#define COMMON_FNS(V)                                                                    \
	static ncclResult_t v##V##_devices(int *n) { return t##V->devices(n); }           \
	static ncclResult_t v##V##_dereg_mr(void *c, void *mh)                           \
	{                                                                                \
		return t##V->deregMr(c, mh);                                             \
	}                                                                                \
	static ncclResult_t v##V##_iflush(void *rc, int n, void **data, int *sizes,      \
					  void **mh, void **req)                         \
	{                                                                                \
		return t##V->iflush(rc, n, data, sizes, mh, req);                        \
	}                                                                                \
	static ncclResult_t v##V##_test(void *req, int *done, int *sizes)                \
	{                                                                                \
		return t##V->test(req, done, sizes);                                     \
	}                                                                                \
	static ncclResult_t v##V##_close_send(void *c) { return t##V->closeSend(c); }     \
	static ncclResult_t v##V##_close_recv(void *c) { return t##V->closeRecv(c); }     \
	static ncclResult_t v##V##_close_listen(void *c) { return t##V->closeListen(c); }

COMMON_FNS(6)
COMMON_FNS(7)
COMMON_FNS(8)
COMMON_FNS(9)
COMMON_FNS(10)
COMMON_FNS(11)
COMMON_FNS(12)

/* v6-v10: no context; listen(dev, handle, lc). */
#define LISTEN_NOCTX(V)                                                                   \
	static ncclResult_t v##V##_listen(struct rail_conf_net *net, int dev, void *h,     \
					  void **lc)                                       \
	{                                                                                  \
		(void)net;                                                                 \
		return t##V->listen(dev, h, lc);                                           \
	}
LISTEN_NOCTX(6)
LISTEN_NOCTX(7)
LISTEN_NOCTX(8)
LISTEN_NOCTX(9)
LISTEN_NOCTX(10)

/* v7+: accept(lc, rc, devComm**). NCCL passes a slot holding NULL. */
#define ACCEPT_DEV(V)                                                                     \
	static ncclResult_t v##V##_accept(void *lc, void **rc, void **dev_comm)            \
	{                                                                                  \
		ncclNetDeviceHandle_v##V##_t *dh = NULL;                                   \
		ncclResult_t res = t##V->accept(lc, rc, &dh);                              \
		*dev_comm = dh;                                                            \
		return res;                                                                \
	}
ACCEPT_DEV(7)
ACCEPT_DEV(8)
ACCEPT_DEV(9)
ACCEPT_DEV(10)
ACCEPT_DEV(11)
ACCEPT_DEV(12)

/* v8+: regMr takes size_t. */
#define REGMR_SIZET(V)                                                                    \
	static ncclResult_t v##V##_reg_mr(void *c, void *d, size_t size, int type,         \
					  void **mh)                                       \
	{                                                                                  \
		return t##V->regMr(c, d, size, type, mh);                                  \
	}
REGMR_SIZET(8)
REGMR_SIZET(9)
REGMR_SIZET(10)
REGMR_SIZET(11)
REGMR_SIZET(12)

/* v6/v7: regMr takes int. */
#define REGMR_INT(V)                                                                      \
	static ncclResult_t v##V##_reg_mr(void *c, void *d, size_t size, int type,         \
					  void **mh)                                       \
	{                                                                                  \
		if (size > INT_MAX)                                                        \
			return ncclNumResults; /* the suite never does this */             \
		return t##V->regMr(c, d, (int)size, type, mh);                             \
	}
REGMR_INT(6)
REGMR_INT(7)

/* v6-v8: int sizes for isend and irecv. */
#define DATA_INT(V)                                                                       \
	static ncclResult_t v##V##_isend(void *sc, void *d, size_t size, int tag, void *mh, \
					 void **req)                                       \
	{                                                                                  \
		if (size > INT_MAX)                                                        \
			return ncclNumResults;                                             \
		return t##V->isend(sc, d, (int)size, tag, mh, req);                        \
	}                                                                                  \
	static ncclResult_t v##V##_irecv(void *rc, int n, void **d, size_t *sizes,         \
					 int *tags, void **mh, void **req)                 \
	{                                                                                  \
		int isz[RAIL_CONF_MAX_RECVS];                                              \
		for (int i = 0; i < n && i < RAIL_CONF_MAX_RECVS; i++) {                   \
			if (sizes[i] > INT_MAX)                                            \
				return ncclNumResults;                                     \
			isz[i] = (int)sizes[i];                                            \
		}                                                                          \
		return t##V->irecv(rc, n, d, isz, tags, mh, req);                          \
	}
DATA_INT(6)
DATA_INT(7)
DATA_INT(8)

static ncclResult_t v9_isend(void *sc, void *d, size_t size, int tag, void *mh, void **req)
{
	return t9->isend(sc, d, size, tag, mh, req);
}

static ncclResult_t v9_irecv(void *rc, int n, void **d, size_t *sizes, int *tags, void **mh,
			     void **req)
{
	return t9->irecv(rc, n, d, sizes, tags, mh, req);
}

/* v10+: profiler handles, NULL as when NCCL's profiler is off. */
#define DATA_PH(V)                                                                        \
	static ncclResult_t v##V##_isend(void *sc, void *d, size_t size, int tag, void *mh, \
					 void **req)                                       \
	{                                                                                  \
		return t##V->isend(sc, d, size, tag, mh, NULL, req);                       \
	}                                                                                  \
	static ncclResult_t v##V##_irecv(void *rc, int n, void **d, size_t *sizes,         \
					 int *tags, void **mh, void **req)                 \
	{                                                                                  \
		void *ph[RAIL_CONF_MAX_RECVS] = { 0 };                                     \
		return t##V->irecv(rc, n, d, sizes, tags, mh, ph, req);                    \
	}                                                                                  \
	static ncclResult_t v##V##_isend_ph(void *sc, void *d, size_t size, int tag,       \
					    void *mh, void *ph, void **req)                \
	{                                                                                  \
		return t##V->isend(sc, d, size, tag, mh, ph, req);                         \
	}                                                                                  \
	static ncclResult_t v##V##_irecv_ph(void *rc, int n, void **d, size_t *sizes,      \
					    int *tags, void **mh, void **ph, void **req)   \
	{                                                                                  \
		return t##V->irecv(rc, n, d, sizes, tags, mh, ph, req);                    \
	}
DATA_PH(10)
DATA_PH(11)
DATA_PH(12)

/* ---- init, connect, makeVDevice: the version-specific ones ---- */

ncclProfilerCallback_t rail_conf_prof_hook;

/* NCCL passes a profiler callback from v10 on; ours records only through the hook. */
static ncclResult_t conf_prof_cb(void **eh, int type, void *ph, int64_t plugin_id, void *ext)
{
	ncclProfilerCallback_t hook = rail_conf_prof_hook;

	if (hook)
		return hook(eh, type, ph, plugin_id, ext);
	if (eh && type == 0)
		*eh = NULL;
	return ncclSuccess;
}

#define INIT_LEGACY(V)                                                                    \
	static ncclResult_t v##V##_init(struct rail_conf_net *net, ncclDebugLogger_t log)  \
	{                                                                                  \
		(void)net;                                                                 \
		return t##V->init(log);                                                    \
	}
INIT_LEGACY(6)
INIT_LEGACY(7)
INIT_LEGACY(8)
INIT_LEGACY(9)

static ncclResult_t v10_init(struct rail_conf_net *net, ncclDebugLogger_t log)
{
	(void)net;
	return t10->init(log, conf_prof_cb);
}

static ncclResult_t v6_connect(struct rail_conf_net *net, int dev, void *h, void **sc,
			       void **dev_comm)
{
	(void)net;
	*dev_comm = NULL;
	return t6->connect(dev, h, sc);
}

static ncclResult_t v6_accept(void *lc, void **rc, void **dev_comm)
{
	*dev_comm = NULL;
	return t6->accept(lc, rc);
}

#define CONNECT_DEV(V)                                                                    \
	static ncclResult_t v##V##_connect(struct rail_conf_net *net, int dev, void *h,    \
					   void **sc, void **dev_comm)                     \
	{                                                                                  \
		ncclNetDeviceHandle_v##V##_t *dh = NULL;                                   \
		ncclResult_t res;                                                          \
		(void)net;                                                                 \
		res = t##V->connect(dev, h, sc, &dh);                                      \
		*dev_comm = dh;                                                            \
		return res;                                                                \
	}
CONNECT_DEV(7)
CONNECT_DEV(8)
CONNECT_DEV(9)

static ncclResult_t v10_connect(struct rail_conf_net *net, int dev, void *h, void **sc,
				void **dev_comm)
{
	ncclNetCommConfig_v10_t config = { .trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF };
	ncclNetDeviceHandle_v10_t *dh = NULL;
	ncclResult_t res;

	(void)net;
	res = t10->connect(dev, &config, h, sc, &dh);
	*dev_comm = dh;
	return res;
}

/* v11/v12: per-communicator contexts. */
#define CTX_FNS(V)                                                                         \
	static ncclResult_t v##V##_init_ctx(void **ctx, uint64_t id, ncclDebugLogger_t log) \
	{                                                                                   \
		ncclNetCommConfig_v##V##_t config = {                                       \
			.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF                        \
		};                                                                          \
		return t##V->init(ctx, id, &config, log, conf_prof_cb);                     \
	}                                                                                   \
	static ncclResult_t v##V##_init(struct rail_conf_net *net, ncclDebugLogger_t log)   \
	{                                                                                   \
		return v##V##_init_ctx(&net->ctx, 0x5241494c434f4e46ull, log);              \
	}                                                                                   \
	static ncclResult_t v##V##_listen_ctx(void *ctx, int dev, void *h, void **lc)        \
	{                                                                                   \
		return t##V->listen(ctx, dev, h, lc);                                       \
	}                                                                                   \
	static ncclResult_t v##V##_listen(struct rail_conf_net *net, int dev, void *h,      \
					  void **lc)                                        \
	{                                                                                   \
		return t##V->listen(net->ctx, dev, h, lc);                                  \
	}                                                                                   \
	static ncclResult_t v##V##_connect_ctx(void *ctx, int dev, void *h, void **sc,       \
					       void **dev_comm)                             \
	{                                                                                   \
		ncclNetDeviceHandle_v##V##_t *dh = NULL;                                    \
		ncclResult_t res = t##V->connect(ctx, dev, h, sc, &dh);                     \
		*dev_comm = dh;                                                             \
		return res;                                                                 \
	}                                                                                   \
	static ncclResult_t v##V##_connect(struct rail_conf_net *net, int dev, void *h,     \
					   void **sc, void **dev_comm)                      \
	{                                                                                   \
		return v##V##_connect_ctx(net->ctx, dev, h, sc, dev_comm);                  \
	}                                                                                   \
	static ncclResult_t v##V##_finalize(void *ctx) { return t##V->finalize(ctx); }
CTX_FNS(11)
CTX_FNS(12)

#define VDEV_V9(V)                                                                        \
	static ncclResult_t v##V##_make_vdevice(int *d, int ndevs, const int *devs)        \
	{                                                                                  \
		ncclNetVDeviceProps_v9_t props;                                            \
		memset(&props, 0, sizeof(props));                                          \
		if (ndevs > NCCL_NET_MAX_DEVS_PER_NIC_V9)                                  \
			return ncclNumResults;                                             \
		props.ndevs = ndevs;                                                       \
		memcpy(props.devs, devs, sizeof(int) * (size_t)ndevs);                     \
		return t##V->makeVDevice(d, &props);                                       \
	}
VDEV_V9(9)
VDEV_V9(10)
VDEV_V9(11)

static ncclResult_t v12_make_vdevice(int *d, int ndevs, const int *devs)
{
	ncclNetVDeviceProps_v12_t props;

	memset(&props, 0, sizeof(props));
	if (ndevs > NCCL_NET_MAX_DEVS_PER_NIC_V12)
		return ncclNumResults;
	props.ndevs = ndevs;
	memcpy(props.devs, devs, sizeof(int) * (size_t)ndevs);
	return t12->makeVDevice(d, &props);
}

/* ---- binding ---- */

#define BIND_COMMON(net, V)                                                    \
	do {                                                                   \
		(net)->name = t##V->name;                                      \
		(net)->table = t##V;                                           \
		(net)->has_reg_mr_dmabuf = t##V->regMrDmaBuf != NULL;           \
		(net)->init = v##V##_init;                                     \
		(net)->devices = v##V##_devices;                               \
		(net)->get_props = v##V##_get_props;                           \
		(net)->get_props_raw = v##V##_get_props_raw;                   \
		(net)->listen = v##V##_listen;                                 \
		(net)->connect = v##V##_connect;                               \
		(net)->accept = v##V##_accept;                                 \
		(net)->reg_mr = v##V##_reg_mr;                                 \
		(net)->dereg_mr = v##V##_dereg_mr;                             \
		(net)->isend = v##V##_isend;                                   \
		(net)->irecv = v##V##_irecv;                                   \
		(net)->iflush = v##V##_iflush;                                 \
		(net)->test = v##V##_test;                                     \
		(net)->close_send = v##V##_close_send;                         \
		(net)->close_recv = v##V##_close_recv;                         \
		(net)->close_listen = v##V##_close_listen;                     \
	} while (0)

#define BIND_VDEV(net, V)                                                      \
	do {                                                                   \
		(net)->has_make_vdevice = t##V->makeVDevice != NULL;            \
		(net)->make_vdevice = v##V##_make_vdevice;                     \
	} while (0)

#define BIND_PH(net, V)                                                        \
	do {                                                                   \
		(net)->isend_ph = v##V##_isend_ph;                             \
		(net)->irecv_ph = v##V##_irecv_ph;                             \
	} while (0)

#define BIND_CTX(net, V)                                                       \
	do {                                                                   \
		(net)->has_finalize = t##V->finalize != NULL;                   \
		(net)->finalize = v##V##_finalize;                             \
		(net)->init_ctx = v##V##_init_ctx;                             \
		(net)->listen_ctx = v##V##_listen_ctx;                         \
		(net)->connect_ctx = v##V##_connect_ctx;                       \
	} while (0)

int rail_conf_bind(void *lib, int abi, struct rail_conf_net *net, char *why, size_t len)
{
	char sym[32];
	void *table;

	snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", abi);
	dlerror();
	table = dlsym(lib, sym);
	if (!table) {
		snprintf(why, len, "the plugin does not export %s", sym);
		return -1;
	}
	memset(net, 0, sizeof(*net));
	net->abi = abi;
	switch (abi) {
	case 6: t6 = table; BIND_COMMON(net, 6); break;
	case 7: t7 = table; BIND_COMMON(net, 7); break;
	case 8: t8 = table; BIND_COMMON(net, 8); break;
	case 9: t9 = table; BIND_COMMON(net, 9); BIND_VDEV(net, 9); break;
	case 10: t10 = table; BIND_COMMON(net, 10); BIND_VDEV(net, 10); BIND_PH(net, 10); break;
	case 11:
		t11 = table;
		BIND_COMMON(net, 11); BIND_VDEV(net, 11); BIND_PH(net, 11); BIND_CTX(net, 11);
		break;
	case 12:
		t12 = table;
		BIND_COMMON(net, 12); BIND_VDEV(net, 12); BIND_PH(net, 12); BIND_CTX(net, 12);
		break;
	default:
		snprintf(why, len, "ABI v%d is not known to this suite", abi);
		return -1;
	}
	rail_conf_inject_apply(net);
	return 0;
}
