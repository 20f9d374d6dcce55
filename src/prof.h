/*
 * nccl-net-rail: events for NCCL's profiler (net ABI v10+).
 *
 * NCCL gives the plugin a callback at init and, with each isend and irecv,
 * a parent handle per buffer (the proxy step the transfer belongs to). The
 * API (api.c) attaches those parents to the request, in a struct
 * rail_prof_req, only when both a callback and a parent exist; otherwise
 * req->prof stays NULL and a transport pays one test of that pointer.
 *
 * A transport starts one event per work request it posts (verbs) or per
 * socket operation (TCP: a chunk on a data stream, or an inline message on
 * the control socket), naming the buffer (parent index) it moves. Events
 * kept in the request are stopped when the request completes or is given
 * back (api.c); a TCP helper thread stops its chunk's event itself, when
 * the chunk is moved, before the request can complete.
 *
 * The callback is NCCL's: it runs on the caller's thread (NCCL's progress
 * thread, or a TCP helper for a stop). A callback error drops that event,
 * is logged once per process, and never fails a transfer.
 */
#ifndef RAIL_PROF_H
#define RAIL_PROF_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define RAIL_PROF_MAX_PARENTS 8	/* one per buffer of a grouped receive */
#define RAIL_PROF_MAX_EV 16	/* events a request keeps until it completes */
/*
 * Events per parent at most: NCCL's example profiler has room for 8 per
 * proxy step and does not check; a transfer needing more gets 8.
 */
#define RAIL_PROF_PER_PARENT 8

/* Socket operations (the descriptor's op). */
#define RAIL_PROF_SOCK_SEND 0
#define RAIL_PROF_SOCK_RECV 1

struct rail_prof_req {
	void *parent[RAIL_PROF_MAX_PARENTS];
	uint8_t count[RAIL_PROF_MAX_PARENTS];	/* events started per parent */
	int nev;
	void *ev[RAIL_PROF_MAX_EV];		/* kept until the request completes */
};

/* Nonzero once NCCL gave a callback (read on every post: one relaxed load). */
extern atomic_int rail_prof_active;

static inline int rail_prof_on(void)
{
	return atomic_load_explicit(&rail_prof_active, memory_order_relaxed);
}

/* Prepare p for a request with n buffers and their parents. */
void rail_prof_attach(struct rail_prof_req *p, int n, void *const *parents);
/*
 * Verbs: a work request moving length bytes of buffer i is being posted on
 * member device `device`, QP qpn. The event is kept in p.
 */
void rail_prof_ib(struct rail_prof_req *p, int i, int device, uint64_t wr_id, int opcode,
		  uint32_t qpn, size_t length);
/*
 * Sockets: an operation moving length bytes of buffer i on fd starts.
 * keep: the request keeps the event (stopped at completion); else the
 * event is returned for the caller to stop (rail_prof_stop). NULL: none.
 */
void *rail_prof_sock(struct rail_prof_req *p, int i, int keep, int fd, int op, size_t length);
/* Stop one event (NULL: nothing). Any thread. */
void rail_prof_stop(void *ev);
/* Stop every event p keeps (the request completed, failed or was given back). */
void rail_prof_finish(struct rail_prof_req *p);

#endif
