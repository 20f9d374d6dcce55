/*
 * nccl-net-rail: events for NCCL's profiler (prof.h). The one place in the
 * core that builds NCCL's profiler descriptors (include/nccl_profiler_net.h).
 */
#include <string.h>

#include "api.h"
#include "log.h"
#include "nccl_profiler_net.h"
#include "prof.h"
#include "transport.h"

_Static_assert(RAIL_PROF_MAX_PARENTS == RAIL_MAX_RECVS, "a parent per buffer of a receive");

atomic_int rail_prof_active;
static _Atomic(ncclProfilerCallback_t) prof_cb;
static atomic_int prof_warned;

void rail_net_profiler(ncclProfilerCallback_t cb)
{
	if (!cb || atomic_load(&prof_cb) == cb)
		return;
	atomic_store(&prof_cb, cb);
	atomic_store(&rail_prof_active, 1);
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "NCCL profiler callback registered: verbs work "
		  "requests and TCP socket operations are reported as net plugin events when "
		  "the profiler asks for them");
}

static void prof_failed(const char *what, ncclResult_t res)
{
	if (atomic_exchange(&prof_warned, 1))
		return;
	RAIL_WARN("NCCL's profiler callback failed (%s of a net plugin event: result %d); that "
		  "event is dropped, data movement is not affected (logged once)", what, (int)res);
}

static void *prof_start(struct rail_prof_req *p, int i, int64_t id, void *descr)
{
	ncclProfilerCallback_t cb = atomic_load_explicit(&prof_cb, memory_order_relaxed);
	void *ev = NULL;
	ncclResult_t res;

	if (i < 0 || i >= RAIL_PROF_MAX_PARENTS || !p->parent[i] ||
	    p->count[i] >= RAIL_PROF_PER_PARENT || !cb)
		return NULL;
	res = cb(&ev, NCCL_PROFILER_NET_EVENT_START, p->parent[i], id, descr);
	if (res != ncclSuccess) {
		prof_failed("start", res);
		return NULL;
	}
	if (ev)
		p->count[i]++;
	return ev;
}

static void prof_keep(struct rail_prof_req *p, void *ev)
{
	if (!ev)
		return;
	if (p->nev < RAIL_PROF_MAX_EV)
		p->ev[p->nev++] = ev;
	else
		rail_prof_stop(ev);	/* no room to wait for the completion */
}

void rail_prof_attach(struct rail_prof_req *p, int n, void *const *parents)
{
	memset(p, 0, sizeof(*p));
	for (int i = 0; i < n && i < RAIL_PROF_MAX_PARENTS; i++)
		p->parent[i] = parents[i];
}

void rail_prof_ib(struct rail_prof_req *p, int i, int device, uint64_t wr_id, int opcode,
		  uint32_t qpn, size_t length)
{
	ncclProfilerNetIbDescr_v1_t d;

	memset(&d, 0, sizeof(d));
	d.type = NCCL_PROFILE_QP;
	d.qp.device = device;
	d.qp.wr_id = wr_id;
	d.qp.opcode = opcode;
	d.qp.qpNum = (int)qpn;
	d.qp.length = length;
	prof_keep(p, prof_start(p, i, NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER, &d));
}

void *rail_prof_sock(struct rail_prof_req *p, int i, int keep, int fd, int op, size_t length)
{
	ncclProfilerNetSockDescr_v1_t d;
	void *ev;

	memset(&d, 0, sizeof(d));
	d.type = NCCL_PROFILE_SOCKET;
	d.sock.fd = fd;
	d.sock.op = op;
	d.sock.length = length;
	ev = prof_start(p, i, NCCL_PROFILER_NET_TYPE_SOCK | NCCL_PROFILER_NET_SOCKET_VER, &d);
	if (keep) {
		prof_keep(p, ev);
		return NULL;
	}
	return ev;
}

void rail_prof_stop(void *ev)
{
	ncclProfilerCallback_t cb = atomic_load_explicit(&prof_cb, memory_order_relaxed);
	ncclResult_t res;

	if (!ev || !cb)
		return;
	res = cb(&ev, NCCL_PROFILER_NET_EVENT_STOP, NULL, 0, NULL);
	if (res != ncclSuccess)
		prof_failed("stop", res);
}

void rail_prof_finish(struct rail_prof_req *p)
{
	for (int k = 0; k < p->nev; k++)
		rail_prof_stop(p->ev[k]);
	p->nev = 0;
}
