/*
 * nccl-net-rail: RMA ABI v14 shim (NCCL 2.30.7 and later): NCCL finds
 * ncclRmaPlugin_v14 in the net plugin's library, or through NCCL_RMA_PLUGIN.
 * Properties are the net ABI v12's, with the GIN proxy device type, which
 * puts NCCL's own GIN proxy on top of this table.
 */
#include "rma_shim.h"
#include "rma_v14.h"

static ncclResult_t v14_init(void **ctx, uint64_t comm_id, ncclDebugLogger_t logger)
{
	return rail_rma_init(ctx, comm_id, logger, 14);
}

static ncclResult_t v14_connect(void *ctx, void *handles[], int nranks, int rank,
				void *listen_comm, void **coll)
{
	return rail_rma_connect(ctx, handles, nranks, rank, listen_comm, coll);
}

static ncclResult_t v14_create_context(void *coll, ncclRmaConfig_v14_t *config, void **rma_ctx)
{
	if (!config) {
		RAIL_WARN("RMA createContext: the config pointer is NULL");
		return ncclInvalidArgument;
	}
	return rail_rma_create_context(coll, config->nContexts, config->trafficClass,
				       config->rankStride, rma_ctx);
}

static ncclResult_t v14_reg_mr_sym(void *coll, void *data, size_t size, int type,
				   uint64_t mr_flags, void **mhandle)
{
	return rail_rma_reg_mr_sym(coll, data, size, type, 0, -1, mr_flags, mhandle);
}

static ncclResult_t v14_reg_mr_sym_dmabuf(void *coll, void *data, size_t size, int type,
					  uint64_t offset, int fd, uint64_t mr_flags, void **mhandle)
{
	return rail_rma_reg_mr_sym(coll, data, size, type, offset, fd, mr_flags, mhandle);
}

/* isStrongSignal is not needed: every signal of this plugin is strong. */
static ncclResult_t v14_iput_signal(void *rma_ctx, int context, uint64_t src_off, void *src_mh,
				    size_t size, uint64_t dst_off, void *dst_mh, uint32_t rank,
				    uint64_t sig_off, void *sig_mh, uint64_t sig_value,
				    uint32_t sig_op, bool strong, void **request)
{
	(void)strong;
	return rail_rma_iput_signal(rma_ctx, context, src_off, src_mh, size, dst_off, dst_mh, rank,
				    sig_off, sig_mh, sig_value, sig_op, request);
}

RAIL_EXPORT ncclRma_v14_t ncclRmaPlugin_v14 = {
	.name = RAIL_PLUGIN_NAME,
	.init = v14_init,
	.devices = rail_rma_devices,
	.getProperties = rail_rma_shim_props_v12,
	.listen = rail_rma_listen,
	.connect = v14_connect,
	.createContext = v14_create_context,
	.regMrSym = v14_reg_mr_sym,
	.regMrSymDmaBuf = v14_reg_mr_sym_dmabuf,
	.deregMrSym = rail_rma_dereg_mr_sym,
	.destroyContext = rail_rma_destroy_context,
	.closeColl = rail_rma_close_coll,
	.closeListen = rail_rma_close_listen,
	.iput = rail_rma_iput,
	.iputSignal = v14_iput_signal,
	.iget = rail_rma_iget,
	.iflush = rail_rma_iflush,
	.test = rail_rma_test,
	.rmaProgress = rail_rma_progress,
	.queryLastError = rail_rma_shim_query_last_error,
	.finalize = rail_rma_finalize,
};
