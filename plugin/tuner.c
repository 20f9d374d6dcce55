/*
 * nccl-net-rail: the tuner tables NCCL looks for in the net plugin's
 * library (ncclTunerPlugin_v3 .. v6), each a thin conversion to src/tuner.h.
 * NCCL tries the newest version it knows first.
 */
#include "nccl_tuner.h"
#include "shim.h"
#include "tuner.h"

static ncclResult_t tuner_open(size_t nranks, size_t nnodes, void **context)
{
	struct rail_tuner *t = NULL;

	if (!context)
		return ncclInvalidArgument;
	if (rail_tuner_open(nranks, nnodes, &t))
		return ncclSystemError;
	*context = t;
	return ncclSuccess;
}

static ncclResult_t tuner_init_v3(size_t nranks, size_t nnodes, ncclDebugLogger_t logger,
				  void **context)
{
	(void)logger;	/* the net plugin's init set the same logger */
	return tuner_open(nranks, nnodes, context);
}

static ncclResult_t tuner_init_v5(void **context, uint64_t comm_id, size_t nranks, size_t nnodes,
				  ncclDebugLogger_t logger, ncclNvlDomainInfo_v5_t *nvl,
				  ncclTunerConstants_v5_t *constants)
{
	(void)comm_id;
	(void)logger;
	(void)nvl;
	(void)constants;	/* NCCL's constants are left as they are */
	return tuner_open(nranks, nnodes, context);
}

static ncclResult_t tuner_coll_v3(void *context, ncclFunc_t coll, size_t nbytes, int pipe_ops,
				  float **table, int nalgo, int nproto, int *nchannels)
{
	int nc;

	(void)pipe_ops;
	rail_tuner_adjust(context, nbytes, (float *)table, nalgo, nproto);
	nc = rail_tuner_channels(context, (int)coll, nbytes, (const float *)table, nalgo, nproto);
	if (nc > 0 && nchannels)
		*nchannels = nc;	/* 0, left alone: NCCL chooses */
	return ncclSuccess;
}

static ncclResult_t tuner_coll_v4(void *context, ncclFunc_t coll, size_t nbytes, int pipe_ops,
				  float **table, int nalgo, int nproto, int reg_buff,
				  int *nchannels)
{
	(void)reg_buff;
	return tuner_coll_v3(context, coll, nbytes, pipe_ops, table, nalgo, nproto, nchannels);
}

static ncclResult_t tuner_close(void *context)
{
	rail_tuner_close(context);
	return ncclSuccess;
}

RAIL_EXPORT ncclTuner_v6_t ncclTunerPlugin_v6 = {
	.name = RAIL_PLUGIN_NAME,
	.init = tuner_init_v5,
	.getCollInfo = tuner_coll_v4,
	.finalize = tuner_close,
	.getChunkSize = NULL,
};

RAIL_EXPORT ncclTuner_v5_t ncclTunerPlugin_v5 = {
	.name = RAIL_PLUGIN_NAME,
	.init = tuner_init_v5,
	.getCollInfo = tuner_coll_v4,
	.finalize = tuner_close,
};

RAIL_EXPORT ncclTuner_v4_t ncclTunerPlugin_v4 = {
	.name = RAIL_PLUGIN_NAME,
	.init = tuner_init_v3,
	.getCollInfo = tuner_coll_v4,
	.destroy = tuner_close,
};

RAIL_EXPORT ncclTuner_v3_t ncclTunerPlugin_v3 = {
	.name = RAIL_PLUGIN_NAME,
	.init = tuner_init_v3,
	.getCollInfo = tuner_coll_v3,
	.destroy = tuner_close,
};
