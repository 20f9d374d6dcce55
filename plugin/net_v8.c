/* nccl-net-rail: ABI v8 shim (NCCL 2.20 - 2.23). */
#include "net_v8.h"
#include "shim.h"

static ncclResult_t v8_init(ncclDebugLogger_t logger)
{
	return rail_net_init_legacy(logger, 8);
}

static ncclResult_t v8_get_properties(int dev, ncclNetProperties_v8_t *props)
{
	struct rail_props p;
	ncclResult_t res = rail_shim_get_properties(dev, props, &p);

	if (res == ncclSuccess)
		RAIL_SHIM_COPY_V8(props, p);
	return res;
}

RAIL_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v8_init,
	.devices = rail_net_devices,
	.getProperties = v8_get_properties,
	.listen = rail_shim_listen,
	.connect = rail_shim_connect_devcomm,
	.accept = rail_shim_accept_devcomm,
	.regMr = rail_net_reg_mr,
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
