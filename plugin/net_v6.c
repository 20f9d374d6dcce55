/* nccl-net-rail: ABI v6 shim (NCCL 2.13 - 2.18 load this one). */
#include "net_v6.h"
#include "shim.h"

static ncclResult_t v6_init(ncclDebugLogger_t logger)
{
	return rail_net_init_legacy(logger, 6);
}

static ncclResult_t v6_get_properties(int dev, ncclNetProperties_v6_t *props)
{
	struct rail_props p;
	ncclResult_t res = rail_shim_get_properties(dev, props, &p);

	if (res == ncclSuccess)
		RAIL_SHIM_COPY_V6(props, p);
	return res;
}

static ncclResult_t v6_connect(int dev, void *handle, void **send_comm)
{
	return rail_net_connect(NULL, dev, -1, handle, send_comm);
}

RAIL_EXPORT ncclNet_v6_t ncclNetPlugin_v6 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v6_init,
	.devices = rail_net_devices,
	.getProperties = v6_get_properties,
	.listen = rail_shim_listen,
	.connect = v6_connect,
	.accept = rail_net_accept,
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
};
