/* nccl-net-rail: ABI v11 shim (NCCL 2.28 - 2.29). */
#include "net_v11.h"
#include "shim.h"

extern ncclNet_v11_t ncclNetPlugin_v11;

static ncclResult_t v11_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v11_t *config,
			     ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
	ncclResult_t res = rail_net_init(ctx, comm_id, config ? config->trafficClass : -1, logger, 11);

	rail_net_profiler(prof);
	ncclNetPlugin_v11.makeVDevice = rail_net_can_fuse() ? rail_shim_make_vdevice_v9 : NULL;
	return res;
}

static ncclResult_t v11_get_properties(int dev, ncclNetProperties_v11_t *props)
{
	struct rail_props p;
	ncclResult_t res = rail_shim_get_properties(dev, props, &p);

	if (res == ncclSuccess) {
		RAIL_SHIM_COPY_V9(props, p, NCCL_NET_MAX_DEVS_PER_NIC_V9);
		props->maxMultiRequestSize = p.max_multi_request_size;
	}
	return res;
}

/* The traffic class comes from the context (init's config). */
static ncclResult_t v11_connect(void *ctx, int dev, void *handle, void **send_comm,
				ncclNetDeviceHandle_v11_t **dev_comm)
{
	(void)dev_comm;
	return rail_net_connect(ctx, dev, -1, handle, send_comm);
}

static ncclResult_t v11_set_net_attr(void *ctx, ncclNetAttr_v11_t *attr)
{
	return rail_net_set_net_attr(ctx, attr);
}

RAIL_EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v11_init,
	.devices = rail_net_devices,
	.getProperties = v11_get_properties,
	.listen = rail_net_listen,
	.connect = v11_connect,
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
	.makeVDevice = rail_shim_make_vdevice_v9,
	.finalize = rail_net_finalize,
	.setNetAttr = v11_set_net_attr,
};
