/*
 * nccl-net-rail: the version-neutral RMA API under plugin/rma_v14.c (NCCL's
 * ncclRma_v14_t). Like src/api.h for the net tables: it checks arguments,
 * hands NCCL numbers for its objects (src/handles.h), and translates
 * negative errno into ncclResult_t (rail_result) at this edge only. The
 * backends are in src/rma/.
 */
#ifndef RAIL_API_RMA_H
#define RAIL_API_RMA_H

#include "nccl_common.h"
#include "transport.h"

/*
 * A context and a reference on the process state, or an error when this
 * plugin does not offer RMA (NCCL_RAIL_RMA=0, or no backend serves the
 * transport in use): NCCL then goes on to its own RMA backend. One INFO
 * line says which backend serves RMA and why, or why none does.
 */
ncclResult_t rail_rma_init(void **ctx, uint64_t comm_id, ncclDebugLogger_t logger,
			   int abi_version);
ncclResult_t rail_rma_finalize(void *ctx);
ncclResult_t rail_rma_devices(int *ndev);
/* The net device's properties, maxRecvs 1, ptrSupport what the backend serves. */
ncclResult_t rail_rma_get_properties(int dev, struct rail_props *props);
ncclResult_t rail_rma_listen(void *ctx, int dev, void *handle, void **listen_comm);
/* ctx is never read: NCCL's host RMA passes another plugin's context. */
ncclResult_t rail_rma_connect(void *ctx, void *const *handles, int nranks, int rank,
			      void *listen_comm, void **coll);
ncclResult_t rail_rma_create_context(void *coll, int ncontexts, int traffic_class,
				     int rank_stride, void **rma_ctx);
/* fd < 0: memory at data; else a DMA-BUF (regMrSymDmaBuf). */
ncclResult_t rail_rma_reg_mr_sym(void *coll, void *data, size_t size, int type,
				 uint64_t offset, int fd, uint64_t mr_flags, void **mhandle);
ncclResult_t rail_rma_dereg_mr_sym(void *coll, void *mhandle);
ncclResult_t rail_rma_destroy_context(void *rma_ctx);
ncclResult_t rail_rma_close_coll(void *coll);
ncclResult_t rail_rma_close_listen(void *listen_comm);
ncclResult_t rail_rma_iput(void *rma_ctx, int context, uint64_t src_off, void *src_mh,
			   size_t size, uint64_t dst_off, void *dst_mh, uint32_t rank,
			   void **request);
/* Every signal is strong: applied after every earlier operation to that (context, rank). */
ncclResult_t rail_rma_iput_signal(void *rma_ctx, int context, uint64_t src_off, void *src_mh,
				  size_t size, uint64_t dst_off, void *dst_mh, uint32_t rank,
				  uint64_t sig_off, void *sig_mh, uint64_t sig_value,
				  uint32_t sig_op, void **request);
ncclResult_t rail_rma_iget(void *rma_ctx, int context, uint64_t remote_off, void *remote_mh,
			   size_t size, uint64_t local_off, void *local_mh, uint32_t rank,
			   void **request);
/* *request stays NULL when there is nothing to wait for. */
ncclResult_t rail_rma_iflush(void *rma_ctx, int context, void *mhandle, uint32_t rank,
			     void **request);
ncclResult_t rail_rma_test(void *coll, void *request, int *done);
ncclResult_t rail_rma_progress(void *rma_ctx);
ncclResult_t rail_rma_query_last_error(void *rma_ctx, int *has_error);

#endif
