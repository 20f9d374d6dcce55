/* nccl-net-rail: ABI v7 shim (NCCL 2.19). */
#include "net_v7.h"
#include "shim.h"

static ncclResult_t v7_init(ncclDebugLogger_t logger)
{
	return rail_net_init_legacy(logger, 7);
}

static ncclResult_t v7_get_properties(int dev, ncclNetProperties_v7_t *props)
{
	struct rail_props p;
	ncclResult_t res = rail_shim_get_properties(dev, props, &p);

	if (res == ncclSuccess)
		RAIL_SHIM_COPY_V7(props, p);
	return res;
}

RAIL_EXPORT ncclNet_v7_t ncclNetPlugin_v7 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v7_init,
	.devices = rail_net_devices,
	.getProperties = v7_get_properties,
	.listen = rail_shim_listen,
	.connect = rail_shim_connect_devcomm,
	.accept = rail_shim_accept_devcomm,
	.regMr = rail_shim_reg_mr_int,
	.regMrDmaBuf = rail_net_reg_mr_dmabuf,
	.deregMr = rail_net_dereg_mr,
	.isend = rail_shim_isend_int,
	.irecv = rail_shim_irecv_int,
	.iflush = rail_net_iflush,
	.test = rail_net_test,
	.closeSend = rail_net_close_send,
	.closeRecv = rail_net_close_recv,
	.closeListen = rail_net_close_listen,
	.getDeviceMr = NULL,
	.irecvConsumed = NULL,
};
