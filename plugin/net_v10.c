/* nccl-net-rail: ABI v10 shim (NCCL 2.26 - 2.27). */
#include "net_v10.h"
#include "shim.h"

extern ncclNet_v10_t ncclNetPlugin_v10;

static ncclResult_t v10_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
	ncclResult_t res = rail_net_init_legacy(logger, 10);

	rail_net_profiler(prof);
	ncclNetPlugin_v10.makeVDevice = rail_net_can_fuse() ? rail_shim_make_vdevice_v9 : NULL;
	return res;
}

static ncclResult_t v10_get_properties(int dev, ncclNetProperties_v10_t *props)
{
	struct rail_props p;
	ncclResult_t res = rail_shim_get_properties(dev, props, &p);

	if (res == ncclSuccess)
		RAIL_SHIM_COPY_V9(props, p, NCCL_NET_MAX_DEVS_PER_NIC_V9);
	return res;
}

static ncclResult_t v10_connect(int dev, ncclNetCommConfig_v10_t *config, void *handle,
				void **send_comm, ncclNetDeviceHandle_v10_t **dev_comm)
{
	(void)dev_comm;
	return rail_net_connect(NULL, dev, config ? config->trafficClass : -1, handle, send_comm);
}

RAIL_EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v10_init,
	.devices = rail_net_devices,
	.getProperties = v10_get_properties,
	.listen = rail_shim_listen,
	.connect = v10_connect,
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
};
