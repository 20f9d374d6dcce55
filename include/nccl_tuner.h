/*
 * nccl-net-rail: the NCCL tuner plugin interface, versions 3 to 6, as NCCL
 * (2.21 and later) finds it with dlsym in a tuner library or, when
 * NCCL_TUNER_PLUGIN names none, in the net plugin's library. Written from
 * NCCL's published interface; only what this plugin uses is declared.
 *
 * The cost table NCCL passes as "float **" is its float[numAlgo][numProto]
 * array: numAlgo * numProto contiguous floats, in microseconds, with -1
 * (NCCL_ALGO_PROTO_IGNORE) for a pair NCCL does not consider.
 */
#ifndef NCCL_TUNER_H_
#define NCCL_TUNER_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl_common.h"

typedef enum {
	ncclFuncBroadcast = 0,
	ncclFuncReduce = 1,
	ncclFuncAllGather = 2,
	ncclFuncReduceScatter = 3,
	ncclFuncAllReduce = 4,
	ncclFuncSendRecv = 5,
	ncclFuncSend = 6,
	ncclFuncRecv = 7,
	ncclNumFuncs = 8,
} ncclFunc_t;

#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_ALGO_PROTO_IGNORE -1.0f

/* v5 and v6: what init may read and change (unused here, passed through). */
typedef struct {
	int nNvlDomains;
	int minRanksPerNvlDomain;
	int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;
typedef struct ncclTunerConstants_v5 ncclTunerConstants_v5_t; /* opaque here */

typedef struct {
	const char *name;
	ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
			     void **context);
	ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes,
				    int numPipeOps, float **collCostTable, int numAlgo,
				    int numProto, int *nChannels);
	ncclResult_t (*destroy)(void *context);
} ncclTuner_v3_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
			     void **context);
	ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes,
				    int numPipeOps, float **collCostTable, int numAlgo,
				    int numProto, int regBuff, int *nChannels);
	ncclResult_t (*destroy)(void *context);
} ncclTuner_v4_t;

typedef struct {
	const char *name;
	ncclResult_t (*init)(void **context, uint64_t commId, size_t nRanks, size_t nNodes,
			     ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t *nvlDomainInfo,
			     ncclTunerConstants_v5_t *constants);
	ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes,
				    int numPipeOps, float **collCostTable, int numAlgo,
				    int numProto, int regBuff, int *nChannels);
	ncclResult_t (*finalize)(void *context);
} ncclTuner_v5_t;

/* v6 adds an optional chunk-size hook at the end (NULL: NCCL's own). */
typedef struct {
	const char *name;
	ncclResult_t (*init)(void **context, uint64_t commId, size_t nRanks, size_t nNodes,
			     ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t *nvlDomainInfo,
			     ncclTunerConstants_v5_t *constants);
	ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes,
				    int numPipeOps, float **collCostTable, int numAlgo,
				    int numProto, int regBuff, int *nChannels);
	ncclResult_t (*finalize)(void *context);
	ncclResult_t (*getChunkSize)(void *context, ncclFunc_t collType, size_t nBytes, int algo,
				     int proto, int nChannels, size_t *chunkSize);
} ncclTuner_v6_t;

#endif
