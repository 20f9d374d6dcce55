/*
 * nccl-net-rail: what the RMA shims of every ABI share (plugin/rma_v13.c,
 * plugin/rma_v14.c): both fill the net ABI v12 properties and answer
 * queryLastError with a bool.
 */
#ifndef RAIL_RMA_SHIM_H
#define RAIL_RMA_SHIM_H

#include <stdbool.h>

#include "api_rma.h"
#include "net_v12.h"
#include "shim.h"

/* The net device's v12 properties, with the GIN proxy device type. */
static inline ncclResult_t rail_rma_shim_props_v12(int dev, ncclNetProperties_v12_t *props)
{
	struct rail_props p;
	ncclResult_t res;

	if (!props) {
		RAIL_WARN("RMA getProperties(dev %d): the properties pointer is NULL", dev);
		return ncclInvalidArgument;
	}
	res = rail_rma_get_properties(dev, &p);
	if (res == ncclSuccess) {
		RAIL_SHIM_COPY_V9(props, p, NCCL_NET_MAX_DEVS_PER_NIC_V12);
		props->maxMultiRequestSize = p.max_multi_request_size;
		props->railId = (int16_t)p.rail_id;
		props->planeId = (int16_t)p.plane_id;
		props->netDeviceType = NCCL_NET_DEVICE_GIN_PROXY;
	}
	return res;
}

static inline ncclResult_t rail_rma_shim_query_last_error(void *rma_ctx, bool *has_error)
{
	int e = 0;
	ncclResult_t res;

	if (!has_error)
		return ncclInvalidArgument;
	res = rail_rma_query_last_error(rma_ctx, &e);
	if (res == ncclSuccess)
		*has_error = e != 0;
	return res;
}

#endif
