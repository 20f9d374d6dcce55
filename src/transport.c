/* nccl-net-rail: transport choice, comm bookkeeping, and the guard of a guarded comm. */
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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

void rail_comm_live_add(int delta)
{
	atomic_fetch_add(&comms_live, delta);
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
	comm->closed = 0;
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
	rail_comm_closed(comm);
	comm->kind = RAIL_COMM_DEAD;
}

void rail_comm_closed(struct rail_comm *comm)
{
	if (comm->kind != RAIL_COMM_DEAD && !comm->closed)
		atomic_fetch_sub(&comms_live, 1);
	comm->closed = 1;
}

/* ---- the guard (transport.h) ------------------------------------------------ */

atomic_int rail_guard_fence;
static atomic_int guard_forced;		/* rail_guard_force_fence */
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;

static long guard_membarrier(int cmd)
{
	return syscall(__NR_membarrier, cmd, 0, 0);
}

static void guard_setup_once(void)
{
	long cmds = guard_membarrier(MEMBARRIER_CMD_QUERY);
	int ok = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
		 guard_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;

	atomic_store(&rail_guard_fence, !ok || atomic_load(&guard_forced));
	RAIL_INFO(RAIL_LOG_INIT, "guarded comms: %s",
		  atomic_load(&rail_guard_fence)
			  ? "a full fence per data call (membarrier(PRIVATE_EXPEDITED) unavailable)"
			  : "membarrier(PRIVATE_EXPEDITED) on the transport's thread, none on the data path");
}

int rail_guard_setup(void)
{
	pthread_once(&guard_once, guard_setup_once);
	return atomic_load(&rail_guard_fence) ? RAIL_GUARD_FENCE : RAIL_GUARD_LIGHT;
}

int rail_guard_force_fence(int on)
{
	rail_guard_setup();
	atomic_store(&guard_forced, on);
	atomic_store(&rail_guard_fence, on || guard_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0);
	return rail_guard_setup();
}

static void (*_Atomic comm_wake)(void);

void rail_comm_wake_set(void (*fn)(void))
{
	atomic_store(&comm_wake, fn);
}

void rail_comm_woken(struct rail_comm *c)
{
	void (*fn)(void) = atomic_load(&comm_wake);

	atomic_store_explicit(&c->quiet, 0, memory_order_relaxed);
	if (fn)
		fn();
}

int rail_guard_take(struct rail_comm *const *v, int n, unsigned char *taken)
{
	int got = 0;

	/* sequentially consistent on this side in both modes: the rare path */
	for (int i = 0; i < n; i++)
		if (v[i])
			atomic_store_explicit(&v[i]->mover, 1, memory_order_seq_cst);
	/* a full barrier on every running thread, owners included (none in the fallback) */
	if (!atomic_load_explicit(&rail_guard_fence, memory_order_relaxed) &&
	    guard_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
		/* registered at setup, so this cannot fail; if it did, taking would be unsafe */
		RAIL_WARN("membarrier(PRIVATE_EXPEDITED) failed: %s; the transport's thread "
			  "leaves %d comms to NCCL's calls", RAIL_ERRSTR(-errno), n);
		for (int i = 0; i < n; i++)
			if ((taken[i] = 0, v[i]))
				rail_guard_give(v[i]);
		return 0;
	}
	for (int i = 0; i < n; i++) {
		taken[i] = v[i] && !atomic_load_explicit(&v[i]->in_call, memory_order_seq_cst);
		if (v[i] && !taken[i])
			rail_guard_give(v[i]);	/* NCCL is in a call on it */
		got += taken[i];
	}
	return got;
}

/* ---- choosing the transport ------------------------------------------------ */

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
