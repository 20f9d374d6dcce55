/*
 * nccl-net-rail: NCCL RMA plugin ABI v13, the older table NCCL 2.30.7
 * accepts as ncclRmaPlugin_v13 when a library has no ncclRmaPlugin_v14.
 * Its type is the GIN plugin table v13 (NCCL: ncclRma_v13_t is
 * ncclGin_v13_t), so it is declared here under both names.
 *
 * Written for this project from the interface facts of NCCL's GIN ABI v13
 * (field order and types). Against v14 (include/rma_v14.h):
 *
 *   createContext   takes ncclGinConfig_v13_t (no rankStride: every rank is
 *                   a target) and hands back a device handle as well
 *   regMrSym[DmaBuf] hand back a GIN handle as well
 *   iputSignal      has no isStrongSignal: every signal is strong
 *   ginProgress     is v14's rmaProgress
 *
 * NCCL's adapter fails init unless getProperties(0) reports the device type
 * NCCL_NET_DEVICE_GIN_PROXY.
 */
#ifndef RAIL_RMA_V13_H
#define RAIL_RMA_V13_H

#include <stdbool.h>

#include "net_v12.h"
#include "rma_v14.h"	/* the mrFlags and signalOp values, the same in v13 */

typedef struct {
	int nSignals;
	int nCounters;
	int nContexts;		/* contexts the one createContext call makes */
	int queueDepth;
	int trafficClass;	/* -1: unset */
} ncclGinConfig_v13_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(void **ctx, uint64_t commId, ncclDebugLogger_t logFunction);
	ncclResult_t (*devices)(int *ndev);
	ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t *props);
	ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
	ncclResult_t (*connect)(void *ctx, void *handles[], int nranks, int rank, void *listenComm,
				void **collComm);
	ncclResult_t (*createContext)(void *collComm, ncclGinConfig_v13_t *config, void **ginCtx,
				      ncclNetDeviceHandle_v11_t **devHandle);
	ncclResult_t (*regMrSym)(void *collComm, void *data, size_t size, int type, uint64_t mrFlags,
				 void **mhandle, void **ginHandle);
	ncclResult_t (*regMrSymDmaBuf)(void *collComm, void *data, size_t size, int type,
				       uint64_t offset, int fd, uint64_t mrFlags, void **mhandle,
				       void **ginHandle);
	ncclResult_t (*deregMrSym)(void *collComm, void *mhandle);
	ncclResult_t (*destroyContext)(void *ginCtx);
	ncclResult_t (*closeColl)(void *collComm);
	ncclResult_t (*closeListen)(void *listenComm);
	ncclResult_t (*iput)(void *ginCtx, int context, uint64_t srcOff, void *srcMhandle,
			     size_t size, uint64_t dstOff, void *dstMhandle, uint32_t rank,
			     void **request);
	ncclResult_t (*iputSignal)(void *ginCtx, int context, uint64_t srcOff, void *srcMhandle,
				   size_t size, uint64_t dstOff, void *dstMhandle, uint32_t rank,
				   uint64_t signalOff, void *signalMhandle, uint64_t signalValue,
				   uint32_t signalOp, void **request);
	ncclResult_t (*iget)(void *ginCtx, int context, uint64_t remoteOff, void *remoteMhandle,
			     size_t size, uint64_t localOff, void *localMhandle, uint32_t rank,
			     void **request);
	ncclResult_t (*iflush)(void *ginCtx, int context, void *mhandle, uint32_t rank,
			       void **request);
	ncclResult_t (*test)(void *collComm, void *request, int *done);
	/* May be NULL; NCCL calls it in its progress loops when set. */
	ncclResult_t (*ginProgress)(void *ginCtx);
	/* May be NULL. */
	ncclResult_t (*queryLastError)(void *ginCtx, bool *hasError);
	ncclResult_t (*finalize)(void *ctx);
} ncclGin_v13_t;

typedef ncclGin_v13_t ncclRma_v13_t;

#endif
