/*
 * nccl-net-rail: the version-neutral API under the plugin/net_vN.c shims.
 * It checks arguments, owns the request pools, and translates negative
 * errno into ncclResult_t, once, here.
 */
#ifndef RAIL_API_H
#define RAIL_API_H

#include "nccl_common.h"
#include "transport.h"

ncclResult_t rail_result(int err);

/* v11+: one context per NCCL communicator. */
ncclResult_t rail_net_init(void **ctx, uint64_t comm_id, int traffic_class,
			   ncclDebugLogger_t logger, int abi_version);
/* v6-v10: one process-wide init, never finalized. */
ncclResult_t rail_net_init_legacy(ncclDebugLogger_t logger, int abi_version);
ncclResult_t rail_net_finalize(void *ctx);
/*
 * Another table's init (RMA): a context and a reference on the process state
 * as rail_net_init gives, logged as abi ("RMA ABI v14"). rail_net_finalize
 * releases it.
 */
ncclResult_t rail_core_init(void **ctx, uint64_t comm_id, ncclDebugLogger_t logger,
			    const char *abi);
/* The net device's properties for another table (not counted as NCCL using the network). */
ncclResult_t rail_core_get_properties(int dev, struct rail_props *props, const char *call);
/*
 * For the tools: the transport in use, why it was chosen, and its one-line
 * device summary (as in the init log line). -ENODEV before init.
 */
int rail_net_transport_info(const char **name, char *why, size_t why_len, char *devs,
			    size_t devs_len);
/*
 * The transport's name ("tcp", "ib") once NCCL has asked a device's
 * properties, which it does only of the network it uses; else NULL.
 */
const char *rail_net_in_use(void);
ncclResult_t rail_net_devices(int *ndev);
ncclResult_t rail_net_get_properties(int dev, struct rail_props *props);
ncclResult_t rail_net_listen(void *ctx, int dev, void *handle, void **listen_comm);
/* traffic_class < 0: the ctx's (v11+) or unset. */
ncclResult_t rail_net_connect(void *ctx, int dev, int traffic_class, void *handle,
			      void **send_comm);
ncclResult_t rail_net_accept(void *listen_comm, void **recv_comm);
ncclResult_t rail_net_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle);
ncclResult_t rail_net_reg_mr_dmabuf(void *comm, void *data, size_t size, int type,
				    uint64_t offset, int fd, void **mhandle);
ncclResult_t rail_net_dereg_mr(void *comm, void *mhandle);
/*
 * phandle / phandles (v10+): NCCL's profiler parent of the send, and of each
 * buffer of the receive; NULL for none (prof.h). The short forms pass NULL.
 */
ncclResult_t rail_net_isend_ph(void *send_comm, void *data, size_t size, int tag, void *mhandle,
			       void *phandle, void **request);
ncclResult_t rail_net_irecv_ph(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
			       void **mhandles, void **phandles, void **request);
ncclResult_t rail_net_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
			    void **request);
ncclResult_t rail_net_irecv(void *recv_comm, int n, void **data, size_t *sizes,
			    int *tags, void **mhandles, void **request);
/* v10+: NCCL's profiler callback, from init (src/prof.c); NULL is ignored. */
void rail_net_profiler(ncclProfilerCallback_t cb);
ncclResult_t rail_net_iflush(void *recv_comm, int n, void **data, int *sizes,
			     void **mhandles, void **request);
ncclResult_t rail_net_test(void *request, int *done, int *sizes);
ncclResult_t rail_net_close_send(void *send_comm);
ncclResult_t rail_net_close_recv(void *recv_comm);
ncclResult_t rail_net_close_listen(void *listen_comm);
/*
 * Unit tests with a fake transport: give a comm the transport made a handle,
 * as listen, connect and accept do (0 or -errno; on failure it is closed).
 */
int rail_net_adopt_comm(struct rail_comm *comm, void **handle);
/* max_devs: 4 for v9-v11, 8 for v12. */
ncclResult_t rail_net_make_vdevice(int *d, int ndevs, const int *devs, int max_devs);
ncclResult_t rail_net_set_net_attr(void *ctx, const void *attr);
/*
 * 1 when the transport in use can fuse devices. Shims clear their
 * makeVDevice slot otherwise, so NCCL never asks (it checks for NULL).
 */
int rail_net_can_fuse(void);

/* Shims: the size limits of the ABI (v6-v8 carry int sizes). */
#define RAIL_ABI_INT_SIZE_MAX 0x7fffffff

#endif
