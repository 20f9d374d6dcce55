/*
 * nccl-net-rail: NCCL RMA plugin ABI v14 (NCCL 2.30.7 and later), the
 * host-driven one-sided backend NCCL looks up as ncclRmaPlugin_v14 in the
 * net plugin's library.
 *
 * Written for this project from the interface facts of NCCL's RMA ABI
 * (field order and types, constants). Devices and properties are those of
 * the net ABI v12. The calls, in the order NCCL makes them:
 *
 *   init(&ctx, commId, logger)           per communicator, twice (RMA, GIN)
 *   devices, getProperties               as the net table
 *   listen(ctx, dev, handle, &lc)        handle: 128 bytes, allgathered by NCCL
 *   connect(ctx, handles[], nranks, rank, lc, &coll)
 *                                        collective and blocking; ctx may be
 *                                        another plugin's (never read it)
 *   createContext(coll, config, &rctx)   collective; config below
 *   regMrSym[DmaBuf](coll, ...)          collective, same order on every rank
 *   iput / iputSignal / iget / iflush    on an rctx, to a rank; offsets are
 *                                        relative to registered windows, named
 *                                        by the caller's own handle of them
 *   test(coll, request, &done)           done: the source may be reused
 *   deregMrSym, destroyContext, closeColl, closeListen, finalize
 */
#ifndef RAIL_RMA_V14_H
#define RAIL_RMA_V14_H

#include <stdbool.h>

#include "net_v12.h"

/* mrFlags of regMrSym: the window carries signals, keep its writes in order. */
#define NCCL_NET_MR_FLAG_FORCE_SO (1 << 0)
/* The window is a signal array that starts at 0 and only the plugin writes. */
#define NCCL_NET_MR_FLAG_SIGNAL_NEVER_RESET (1 << 1)

/* signalOp of iputSignal: INC adds 1, ADD adds signalValue. */
#define NCCL_NET_SIGNAL_OP_INC 0x1
#define NCCL_NET_SIGNAL_OP_ADD 0x2

typedef struct {
	int nContexts;		/* contexts the one createContext call makes */
	int trafficClass;	/* -1: unset */
	int rankStride;		/* only ranks (rank + k * rankStride) % nranks are targets */
} ncclRmaConfig_v14_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(void **ctx, uint64_t commId, ncclDebugLogger_t logFunction);
	ncclResult_t (*devices)(int *ndev);
	ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t *props);
	ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
	ncclResult_t (*connect)(void *ctx, void *handles[], int nranks, int rank, void *listenComm,
				void **collComm);
	ncclResult_t (*createContext)(void *collComm, ncclRmaConfig_v14_t *config, void **rmaCtx);
	ncclResult_t (*regMrSym)(void *collComm, void *data, size_t size, int type, uint64_t mrFlags,
				 void **mhandle);
	ncclResult_t (*regMrSymDmaBuf)(void *collComm, void *data, size_t size, int type,
				       uint64_t offset, int fd, uint64_t mrFlags, void **mhandle);
	ncclResult_t (*deregMrSym)(void *collComm, void *mhandle);
	ncclResult_t (*destroyContext)(void *rmaCtx);
	ncclResult_t (*closeColl)(void *collComm);
	ncclResult_t (*closeListen)(void *listenComm);
	ncclResult_t (*iput)(void *rmaCtx, int context, uint64_t srcOff, void *srcMhandle,
			     size_t size, uint64_t dstOff, void *dstMhandle, uint32_t rank,
			     void **request);
	ncclResult_t (*iputSignal)(void *rmaCtx, int context, uint64_t srcOff, void *srcMhandle,
				   size_t size, uint64_t dstOff, void *dstMhandle, uint32_t rank,
				   uint64_t signalOff, void *signalMhandle, uint64_t signalValue,
				   uint32_t signalOp, bool isStrongSignal, void **request);
	ncclResult_t (*iget)(void *rmaCtx, int context, uint64_t remoteOff, void *remoteMhandle,
			     size_t size, uint64_t localOff, void *localMhandle, uint32_t rank,
			     void **request);
	ncclResult_t (*iflush)(void *rmaCtx, int context, void *mhandle, uint32_t rank,
			       void **request);
	ncclResult_t (*test)(void *collComm, void *request, int *done);
	/* May be NULL; NCCL calls it in its progress loops when set. */
	ncclResult_t (*rmaProgress)(void *rmaCtx);
	/* May be NULL; NCCL's GIN path asks it from ncclCommGetAsyncError. */
	ncclResult_t (*queryLastError)(void *rmaCtx, bool *hasError);
	ncclResult_t (*finalize)(void *ctx);
} ncclRma_v14_t;

#endif
