/*
 * nccl-net-rail: what the API's two files share (src/api.c: init, devices,
 * connections, registrations, close; src/api_data.c: the data calls):
 * handle lookups and the turn-taking of a guarded comm. Internal to them.
 */
#ifndef RAIL_API_INT_H
#define RAIL_API_INT_H

#include <stdatomic.h>

#include "api.h"
#include "handles.h"
#include "log.h"
#include "rail.h"

static inline const char *kind_name(uint32_t kind)
{
	return kind == RAIL_COMM_SEND ? "send" : kind == RAIL_COMM_RECV ? "receive" : "listen";
}

/* The comm of a live handle of this kind, or NULL with a WARN naming the call. */
static inline struct rail_comm *comm_of(void *p, enum rail_comm_kind kind, const char *call)
{
	uint32_t k = 0;
	struct rail_comm *c = rail_h_get(RAIL_HT_COMM, (uintptr_t)p, &k);

	if (rail_unlikely(!c || k != (uint32_t)kind)) {
		RAIL_WARN("%s: %p is not an open %s comm of this plugin (%s)", call, p,
			  kind_name(kind), c ? "a comm of another kind"
			  : "closed already, or never returned by listen, connect or accept");
		return NULL;
	}
	return c;
}

/* The transport's object of a live registration handle (NULL stays NULL). */
static inline int mr_of(void *h, const char *call, void **mh)
{
	uint32_t k;

	if (!h) {
		*mh = NULL;
		return 0;
	}
	*mh = rail_h_get(RAIL_HT_MR, (uintptr_t)h, &k);
	if (rail_unlikely(!*mh)) {
		RAIL_WARN("%s: memory handle %p is not a live registration of this plugin "
			  "(deregistered already, or its comm was closed)", call, h);
		return -EINVAL;
	}
	return 0;
}

static inline int mrs_of(int n, void **in, void **out, const char *call)
{
	for (int i = 0; i < n; i++) {
		int err = mr_of(in[i], call, &out[i]);

		if (err)
			return err;
	}
	return 0;
}

/*
 * A comm a transport thread may also work on (rail_comm.guarded): the data
 * call holds it for its duration; 0 when the thread has it now. The owner's
 * half of the guard (transport.h): plain stores and loads, a compiler
 * barrier, no locked instruction.
 */
static inline int comm_enter(struct rail_comm *c)
{
	int guarded = c->guarded;

	if (rail_likely(!guarded))
		return 1;
	atomic_store_explicit(&c->calls, atomic_load_explicit(&c->calls, memory_order_relaxed) + 1,
			      memory_order_relaxed);
	if (rail_likely(!rail_guard_owner_in(c, guarded))) {
		if (rail_unlikely(atomic_load_explicit(&c->quiet, memory_order_relaxed)))
			rail_comm_woken(c);	/* the thread stopped looking: it looks again */
		return 1;
	}
	rail_guard_owner_out(c);
	return 0;
}

static inline void comm_leave(struct rail_comm *c)
{
	if (c->guarded)
		rail_guard_owner_out(c);
}

#endif
