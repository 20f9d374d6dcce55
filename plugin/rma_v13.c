/*
 * nccl-net-rail: RMA ABI v13 shim: NCCL 2.30.7 takes ncclRmaPlugin_v13
 * from a library without ncclRmaPlugin_v14 and adapts it. Same backend as
 * v14 (plugin/rma_v14.c); what differs is converted here: every rank is a
 * target (stride 1), there is no device handle nor GIN handle to give back
 * (NULL), and every signal is strong already.
 *
 * Not exported as ncclGinPlugin_v13 as well: NCCL skips an external GIN
 * plugin of the GIN proxy type and puts its own proxy on the RMA table.
 */
#include "rma_shim.h"
#include "rma_v13.h"

static ncclResult_t v13_init(void **ctx, uint64_t comm_id, ncclDebugLogger_t logger)
{
	return rail_rma_init(ctx, comm_id, logger, 13);
}

static ncclResult_t v13_connect(void *ctx, void *handles[], int nranks, int rank,
				void *listen_comm, void **coll)
{
	return rail_rma_connect(ctx, handles, nranks, rank, listen_comm, coll);
}

static ncclResult_t v13_create_context(void *coll, ncclGinConfig_v13_t *config, void **rma_ctx,
				       ncclNetDeviceHandle_v11_t **dev_handle)
{
	if (dev_handle)
		*dev_handle = NULL;
	if (!config) {
		RAIL_WARN("RMA createContext: the config pointer is NULL");
		return ncclInvalidArgument;
	}
	return rail_rma_create_context(coll, config->nContexts, config->trafficClass, 1, rma_ctx);
}

static ncclResult_t v13_reg_mr_sym(void *coll, void *data, size_t size, int type,
				   uint64_t mr_flags, void **mhandle, void **gin_handle)
{
	if (gin_handle)
		*gin_handle = NULL;
	return rail_rma_reg_mr_sym(coll, data, size, type, 0, -1, mr_flags, mhandle);
}

static ncclResult_t v13_reg_mr_sym_dmabuf(void *coll, void *data, size_t size, int type,
					  uint64_t offset, int fd, uint64_t mr_flags, void **mhandle,
					  void **gin_handle)
{
	if (gin_handle)
		*gin_handle = NULL;
	return rail_rma_reg_mr_sym(coll, data, size, type, offset, fd, mr_flags, mhandle);
}

RAIL_EXPORT ncclRma_v13_t ncclRmaPlugin_v13 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v13_init,
	.devices = rail_rma_devices,
	.getProperties = rail_rma_shim_props_v12,
	.listen = rail_rma_listen,
	.connect = v13_connect,
	.createContext = v13_create_context,
	.regMrSym = v13_reg_mr_sym,
	.regMrSymDmaBuf = v13_reg_mr_sym_dmabuf,
	.deregMrSym = rail_rma_dereg_mr_sym,
	.destroyContext = rail_rma_destroy_context,
	.closeColl = rail_rma_close_coll,
	.closeListen = rail_rma_close_listen,
	.iput = rail_rma_iput,
	.iputSignal = rail_rma_iput_signal,
	.iget = rail_rma_iget,
	.iflush = rail_rma_iflush,
	.test = rail_rma_test,
	.ginProgress = rail_rma_progress,
	.queryLastError = rail_rma_shim_query_last_error,
	.finalize = rail_rma_finalize,
};
