/* nccl-net-rail: ABI v9 shim (NCCL 2.24 - 2.25). */
#include "net_v9.h"
#include "shim.h"

extern ncclNet_v9_t ncclNetPlugin_v9;

static ncclResult_t v9_init(ncclDebugLogger_t logger)
{
	ncclResult_t res = rail_net_init_legacy(logger, 9);

	ncclNetPlugin_v9.makeVDevice = rail_net_can_fuse() ? rail_shim_make_vdevice_v9 : NULL;
	return res;
}

static ncclResult_t v9_get_properties(int dev, ncclNetProperties_v9_t *props)
{
	struct rail_props p;
	ncclResult_t res = rail_shim_get_properties(dev, props, &p);

	if (res == ncclSuccess)
		RAIL_SHIM_COPY_V9(props, p, NCCL_NET_MAX_DEVS_PER_NIC_V9);
	return res;
}

RAIL_EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v9_init,
	.devices = rail_net_devices,
	.getProperties = v9_get_properties,
	.listen = rail_shim_listen,
	.connect = rail_shim_connect_devcomm,
	.accept = rail_shim_accept_devcomm,
	.regMr = rail_net_reg_mr,
	.regMrDmaBuf = rail_net_reg_mr_dmabuf,
	.deregMr = rail_net_dereg_mr,
	.isend = rail_net_isend,
	.irecv = rail_net_irecv,
	.iflush = rail_net_iflush,
	.test = rail_net_test,
	.closeSend = rail_net_close_send,
	.closeRecv = rail_net_close_recv,
	.closeListen = rail_net_close_listen,
	.getDeviceMr = NULL,
	.irecvConsumed = NULL,
	.makeVDevice = rail_shim_make_vdevice_v9,
};
