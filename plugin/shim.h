/*
 * nccl-net-rail: helpers for the per-ABI shims. A shim converts arguments
 * and properties between one ABI version and the version-neutral API in
 * src/api.h, and nothing else.
 */
#ifndef RAIL_SHIM_H
#define RAIL_SHIM_H

#include <limits.h>

#include "api.h"
#include "log.h"
#include "rail.h"

#define RAIL_PLUGIN_NAME "Rail"

/* Fields every version has (v6 order). */
#define RAIL_SHIM_COPY_V6(dst, src)                  \
	do {                                         \
		(dst)->name = (char *)(src).name;            \
		(dst)->pciPath = (char *)(src).pci_path;     \
		(dst)->guid = (src).guid;                    \
		(dst)->ptrSupport = (src).ptr_support;       \
		(dst)->speed = (src).speed;                  \
		(dst)->port = (src).port;                    \
		(dst)->latency = (src).latency;              \
		(dst)->maxComms = (src).max_comms;           \
		(dst)->maxRecvs = (src).max_recvs;           \
	} while (0)

/* v7 adds the device offload type: always host. */
#define RAIL_SHIM_COPY_V7(dst, src)                          \
	do {                                                 \
		RAIL_SHIM_COPY_V6(dst, src);                         \
		(dst)->netDeviceType = NCCL_NET_DEVICE_HOST;         \
		(dst)->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION; \
	} while (0)

#define RAIL_SHIM_COPY_V8(dst, src)                  \
	do {                                         \
		RAIL_SHIM_COPY_V7(dst, src);                 \
		(dst)->regIsGlobal = (src).reg_is_global;    \
	} while (0)

/* v9 adds flush forcing, virtual NIC members and size limits. */
#define RAIL_SHIM_COPY_V9(dst, src, maxdevs)                         \
	do {                                                         \
		RAIL_SHIM_COPY_V8(dst, src);                                 \
		(dst)->forceFlush = (src).force_flush;                       \
		(dst)->vProps.ndevs = RAIL_MIN((src).vdev_ndevs, (maxdevs)); \
		for (int i_ = 0; i_ < (dst)->vProps.ndevs; i_++)             \
			(dst)->vProps.devs[i_] = (src).vdev_devs[i_];        \
		(dst)->maxP2pBytes = (src).max_p2p_bytes;                    \
		(dst)->maxCollBytes = (src).max_coll_bytes;                  \
	} while (0)

/*
 * getProperties of every ABI: the ABI's struct (out) is checked here, before
 * the shim copies into it.
 */
static inline ncclResult_t rail_shim_get_properties(int dev, const void *out,
						    struct rail_props *p)
{
	if (!out) {
		RAIL_WARN("getProperties(dev %d): the properties pointer is NULL; the caller "
			  "must pass a struct to fill", dev);
		return ncclInvalidArgument;
	}
	return rail_net_get_properties(dev, p);
}

/* ABIs with int sizes: widen the receive sizes. */
static inline void rail_shim_sizes_from_int(int n, const int *in, size_t *out)
{
	for (int i = 0; i < n; i++)
		out[i] = in[i] < 0 ? 0 : (size_t)in[i];
}

/* regMr of ABIs v6/v7 takes an int size. */
static inline ncclResult_t rail_shim_reg_mr_int(void *comm, void *data, int size, int type,
						void **mhandle)
{
	if (size < 0) {
		RAIL_WARN("regMr(%p): negative size %d", data, size);
		return ncclInvalidArgument;
	}
	return rail_net_reg_mr(comm, data, (size_t)size, type, mhandle);
}

static inline ncclResult_t rail_shim_isend_int(void *send_comm, void *data, int size, int tag,
					       void *mhandle, void **request)
{
	if (size < 0)
		return ncclInvalidArgument;
	return rail_net_isend(send_comm, data, (size_t)size, tag, mhandle, request);
}

static inline ncclResult_t rail_shim_irecv_int(void *recv_comm, int n, void **data, int *sizes,
					       int *tags, void **mhandles, void **request)
{
	size_t wide[RAIL_MAX_RECVS];

	if (n < 1 || n > RAIL_MAX_RECVS)
		return ncclInternalError;
	rail_shim_sizes_from_int(n, sizes, wide);
	return rail_net_irecv(recv_comm, n, data, wide, tags, mhandles, request);
}

/* v6-v10 have no per-communicator context. */
static inline ncclResult_t rail_shim_listen(int dev, void *handle, void **listen_comm)
{
	return rail_net_listen(NULL, dev, handle, listen_comm);
}

/*
 * v7+: device offload is not offered (netDeviceType HOST), so the device
 * handle pointer is left alone. The handle type is the same in v7-v12.
 */
static inline ncclResult_t rail_shim_connect_devcomm(int dev, void *handle, void **send_comm,
						     ncclNetDeviceHandle_v7_t **dev_comm)
{
	(void)dev_comm;
	return rail_net_connect(NULL, dev, -1, handle, send_comm);
}

static inline ncclResult_t rail_shim_accept_devcomm(void *listen_comm, void **recv_comm,
						    ncclNetDeviceHandle_v7_t **dev_comm)
{
	(void)dev_comm;
	return rail_net_accept(listen_comm, recv_comm);
}

/* v10+: isend and irecv carry the profiler's parent handles: the core takes them as they are. */
#define rail_shim_isend_ph rail_net_isend_ph
#define rail_shim_irecv_ph rail_net_irecv_ph

/* v9-v11 share the 4-member virtual NIC struct. */
static inline ncclResult_t rail_shim_make_vdevice_v9(int *d, ncclNetVDeviceProps_v9_t *props)
{
	if (!props)
		return ncclInternalError;
	return rail_net_make_vdevice(d, props->ndevs, props->devs, NCCL_NET_MAX_DEVS_PER_NIC_V9);
}

#endif
