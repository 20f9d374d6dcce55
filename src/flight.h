/*
 * nccl-net-rail: the flight record of a connection.
 *
 * Every send and receive comm keeps its last RAIL_FLIGHT_N events in a
 * fixed ring inside its struct rail_comm: posts (size, tag, request slot),
 * completions, refusals, errors, and on verbs the control messages (CTS,
 * credit, want) and state changes. Written only by the thread driving the
 * comm, with no allocation and no lock. When the comm first fails, or the
 * verbs watchdog finds the peer gone, the record is logged once at WARN
 * (rail_flight_dump) with the transport's description of the connection
 * (peer, device:port, QPs and their states), one line per event, oldest
 * first, times in microseconds before the failure (rail_coarse_ns: 1-4 ms
 * steps; a done event's "after" is precise, for the requests api.c times).
 */
#ifndef RAIL_FLIGHT_H
#define RAIL_FLIGHT_H

#include <stddef.h>
#include <stdint.h>

#define RAIL_FLIGHT_N 64	/* a power of two */

enum rail_fev_type {
	RAIL_FEV_NONE = 0,
	RAIL_FEV_SEND,		/* isend posted: size, tag, slot */
	RAIL_FEV_RECV,		/* irecv posted: size (first), tag (first), slot, n */
	RAIL_FEV_FLUSH,		/* iflush posted */
	RAIL_FEV_DONE,		/* test() said done: size (first), slot, arg = latency us */
	RAIL_FEV_REFUSED,	/* isend/irecv said "not now": arg = times in a row */
	RAIL_FEV_ERROR,		/* a call failed: arg = -errno, slot */
	RAIL_FEV_CTS_TX,	/* verbs: clear-to-send written: slot = CTS number, size, tag */
	RAIL_FEV_CTS_RX,	/* verbs: clear-to-send answered */
	RAIL_FEV_CREDIT_TX,	/* verbs: credit word written: arg = consumed count */
	RAIL_FEV_WANT_TX,	/* verbs: want written: arg = want number */
	RAIL_FEV_WANT_RX,	/* verbs: want seen */
	RAIL_FEV_EAGER,		/* verbs: a message through the eager ring: size, tag */
	RAIL_FEV_REFUSAL_RX,	/* verbs: the receiver refused an eager message: size, arg = room */
	RAIL_FEV_STATE,		/* a state change: note says which, size = QP number */
	RAIL_FEV_WC_ERROR,	/* verbs: a failed work completion: note = status, size = QP */
	RAIL_FEV_PEER_GONE,	/* verbs watchdog: the handshake socket closed or failed: arg = -errno */
	RAIL_FEV_NTYPES
};

struct rail_fev {
	uint64_t ns;		/* rail_now_ns() */
	uint64_t size;
	int32_t tag;
	int32_t arg;
	uint16_t slot;
	uint8_t type;		/* enum rail_fev_type */
	uint8_t n;
	const char *note;	/* NULL, or a string that outlives the comm */
};

struct rail_flight {
	uint32_t head;		/* events ever added; the next goes to head % N */
	uint32_t logged;	/* the record was logged (once per comm) */
	/*
	 * The time of the API call in progress on the comm, read at its first
	 * event (rail_flight_now); api.c clears it as each call starts. A
	 * message's events (posted, eager, done) share one clock read.
	 */
	uint64_t now;
	struct rail_fev ev[RAIL_FLIGHT_N];
};

/* The coarse time of the call in progress (read once per call). */
uint64_t rail_flight_now(struct rail_flight *f);

/* A new API call on the comm starts: its events get a fresh time. */
static inline void rail_flight_call(struct rail_flight *f)
{
	f->now = 0;
}

/* A refusal: counted in the last event when that was the same refusal (flight.c). */
void rail_flight_refused(struct rail_flight *f, uint64_t ns, uint64_t size, int32_t tag);

/* Add an event at time ns (0: the call's time, rail_flight_now). Inline: the data path's. */
static inline void rail_flight_add(struct rail_flight *f, uint64_t ns, uint8_t type,
				   uint16_t slot, uint64_t size, int32_t tag, int32_t arg)
{
	struct rail_fev *e;

	if (type == RAIL_FEV_REFUSED) {
		rail_flight_refused(f, ns, size, tag);
		return;
	}
	if (!ns)
		ns = f->now ? f->now : rail_flight_now(f);
	e = &f->ev[f->head++ & (RAIL_FLIGHT_N - 1)];
	e->ns = ns;
	e->size = size;
	e->tag = tag;
	e->arg = arg;
	e->slot = slot;
	e->type = type;
	e->n = 0;
	e->note = NULL;
}

/* An event described by a static string (state changes, completion errors). */
void rail_flight_note(struct rail_flight *f, uint8_t type, uint64_t size, int32_t arg,
		      const char *note);

/* Events in the ring, oldest first, at most max: returns how many copied. */
int rail_flight_events(const struct rail_flight *f, struct rail_fev *out, int max);

/* One event as text: "-12.3 us  send posted size=4096 tag=7 req=3". */
void rail_flight_format(const struct rail_fev *e, uint64_t now_ns, char *buf, size_t len);

const char *rail_fev_name(uint8_t type);

struct rail_comm;
/*
 * Log the comm's flight record once at WARN: why (the call and error),
 * the transport's description of the connection, then one line per event.
 * Returns 1 when logged now, 0 when it was logged before.
 */
int rail_flight_dump(struct rail_comm *c, const char *why);

#endif
