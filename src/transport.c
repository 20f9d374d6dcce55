/* nccl-net-rail: transport choice and comm bookkeeping. */
#include <stdlib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "transport.h"

/* Comms between rail_comm_init and rail_comm_fini, for finalize. */
static _Atomic int comms_live;

int rail_comm_live(void)
{
	return atomic_load(&comms_live);
}

int rail_comm_init(struct rail_comm *comm, enum rail_comm_kind kind, int dev,
		   const struct rail_transport_ops *ops)
{
	/* NCCL's limits: 32 requests per comm, x maxRecvs on the send side; a
	 * receive comm also carries up to 32 flushes. */
	uint32_t cap = kind == RAIL_COMM_SEND ? RAIL_MAX_REQUESTS * RAIL_MAX_RECVS
		       : kind == RAIL_COMM_RECV ? 2 * RAIL_MAX_REQUESTS : 0;
	int err;

	comm->kind = kind;
	comm->dev = dev;
	comm->ops = ops;
	memset(&comm->st, 0, sizeof(comm->st));
	memset(&comm->fl, 0, sizeof(comm->fl));
	memset(&comm->reqs, 0, sizeof(comm->reqs));
	comm->prof = NULL;
	err = cap ? rail_pool_init(&comm->reqs, cap, ops->req_size) : 0;
	if (err) {
		RAIL_WARN("%s: cannot allocate %u requests for a comm on device %d: %s", ops->name,
			  cap, dev, RAIL_ERRSTR(err));
		comm->kind = RAIL_COMM_DEAD;
		return err;
	}
	atomic_fetch_add(&comms_live, 1);
	return 0;
}

void rail_comm_fini(struct rail_comm *comm)
{
	if (comm->reqs.mem)
		rail_pool_destroy(&comm->reqs);
	free(comm->prof);
	comm->prof = NULL;
	if (comm->kind != RAIL_COMM_DEAD)
		atomic_fetch_sub(&comms_live, 1);
	comm->kind = RAIL_COMM_DEAD;
}

static const struct rail_transport_ops *try_init(const struct rail_transport_ops *ops, char *why,
						 size_t why_len)
{
	int n = ops->init(why, why_len);

	if (n > 0)
		return ops;
	if (n == 0)
		ops->fini();
	else if (!why[0])
		snprintf(why, why_len, "%s", RAIL_ERRSTR(n));
	return NULL;
}

const struct rail_transport_ops *rail_transport_select(char *why, size_t why_len)
{
	int choice = (int)rail_param_int(RAIL_P_TRANSPORT); /* auto|ib|tcp */
	const struct rail_transport_ops *ops;
	char ib_why[256] = "", tcp_why[256] = "";

	if (choice == 2 || (choice == 0 && rail_param_int(RAIL_P_IB_DISABLE))) {
		ops = try_init(&rail_tcp_ops, tcp_why, sizeof(tcp_why));
		if (ops)
			snprintf(why, why_len, "%s", choice == 2 ? "NCCL_RAIL_TRANSPORT=tcp"
								 : "NCCL_IB_DISABLE=1");
		else
			snprintf(why, why_len, "TCP transport unusable: %s", tcp_why);
		return ops;
	}
	if (choice == 1 && rail_param_int(RAIL_P_IB_DISABLE)) {
		snprintf(why, why_len, "NCCL_RAIL_TRANSPORT=ib conflicts with NCCL_IB_DISABLE=1");
		return NULL;
	}
	ops = try_init(&rail_ib_ops, ib_why, sizeof(ib_why));
	if (ops) {
		snprintf(why, why_len, "%s", choice == 1 ? "NCCL_RAIL_TRANSPORT=ib"
							 : "a usable RDMA port was found");
		return ops;
	}
	if (choice == 1) {
		snprintf(why, why_len, "NCCL_RAIL_TRANSPORT=ib but the verbs transport is unusable: %s",
			 ib_why);
		return NULL;
	}
	ops = try_init(&rail_tcp_ops, tcp_why, sizeof(tcp_why));
	if (ops)
		snprintf(why, why_len, "no usable RDMA port (%s)", ib_why);
	else
		snprintf(why, why_len, "no usable RDMA port (%s) and TCP unusable (%s)", ib_why,
			 tcp_why);
	return ops;
}
