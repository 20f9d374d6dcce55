/* nccl-net-rail: ABI v12 shim (NCCL 2.30 and later). */
#include "net_v12.h"
#include "shim.h"

extern ncclNet_v12_t ncclNetPlugin_v12;

static ncclResult_t v12_make_vdevice(int *d, ncclNetVDeviceProps_v12_t *props)
{
	if (!props)
		return ncclInternalError;
	return rail_net_make_vdevice(d, props->ndevs, props->devs, NCCL_NET_MAX_DEVS_PER_NIC_V12);
}

static ncclResult_t v12_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v12_t *config,
			     ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
	ncclResult_t res = rail_net_init(ctx, comm_id, config ? config->trafficClass : -1, logger, 12);

	rail_net_profiler(prof);
	ncclNetPlugin_v12.makeVDevice = rail_net_can_fuse() ? v12_make_vdevice : NULL;
	return res;
}

static ncclResult_t v12_get_properties(int dev, ncclNetProperties_v12_t *props)
{
	struct rail_props p;
	ncclResult_t res = rail_shim_get_properties(dev, props, &p);

	if (res == ncclSuccess) {
		RAIL_SHIM_COPY_V9(props, p, NCCL_NET_MAX_DEVS_PER_NIC_V12);
		props->maxMultiRequestSize = p.max_multi_request_size;
		props->railId = (int16_t)p.rail_id;
		props->planeId = (int16_t)p.plane_id;
	}
	return res;
}

static ncclResult_t v12_connect(void *ctx, int dev, void *handle, void **send_comm,
				ncclNetDeviceHandle_v12_t **dev_comm)
{
	(void)dev_comm;
	return rail_net_connect(ctx, dev, -1, handle, send_comm);
}

static ncclResult_t v12_set_net_attr(void *ctx, ncclNetAttr_v12_t *attr)
{
	return rail_net_set_net_attr(ctx, attr);
}

RAIL_EXPORT ncclNet_v12_t ncclNetPlugin_v12 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v12_init,
	.devices = rail_net_devices,
	.getProperties = v12_get_properties,
	.listen = rail_net_listen,
	.connect = v12_connect,
	.accept = rail_shim_accept_devcomm,
	.regMr = rail_net_reg_mr,
	.regMrDmaBuf = rail_net_reg_mr_dmabuf,
	.deregMr = rail_net_dereg_mr,
	.isend = rail_shim_isend_ph,
	.irecv = rail_shim_irecv_ph,
	.iflush = rail_net_iflush,
	.test = rail_net_test,
	.closeSend = rail_net_close_send,
	.closeRecv = rail_net_close_recv,
	.closeListen = rail_net_close_listen,
	.getDeviceMr = NULL,
	.irecvConsumed = NULL,
	.makeVDevice = v12_make_vdevice,
	.finalize = rail_net_finalize,
	.setNetAttr = v12_set_net_attr,
};
