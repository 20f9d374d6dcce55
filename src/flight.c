/* nccl-net-rail: the flight record of a connection (src/flight.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "flight.h"
#include "log.h"
#include "rail.h"
#include "transport.h"

_Static_assert((RAIL_FLIGHT_N & (RAIL_FLIGHT_N - 1)) == 0, "RAIL_FLIGHT_N is a power of two");

static const char *const fev_names[RAIL_FEV_NTYPES] = {
	[RAIL_FEV_NONE] = "none",
	[RAIL_FEV_SEND] = "send posted",
	[RAIL_FEV_RECV] = "recv posted",
	[RAIL_FEV_FLUSH] = "flush posted",
	[RAIL_FEV_DONE] = "done",
	[RAIL_FEV_REFUSED] = "refused (not now)",
	[RAIL_FEV_ERROR] = "error",
	[RAIL_FEV_CTS_TX] = "clear-to-send written",
	[RAIL_FEV_CTS_RX] = "clear-to-send received",
	[RAIL_FEV_CREDIT_TX] = "credit written",
	[RAIL_FEV_WANT_TX] = "want written",
	[RAIL_FEV_WANT_RX] = "want seen",
	[RAIL_FEV_EAGER] = "eager message",
	[RAIL_FEV_REFUSAL_RX] = "eager refusal received",
	[RAIL_FEV_STATE] = "state",
	[RAIL_FEV_WC_ERROR] = "completion error",
	[RAIL_FEV_PEER_GONE] = "peer gone",
};

const char *rail_fev_name(uint8_t type)
{
	return type < RAIL_FEV_NTYPES && fev_names[type] ? fev_names[type] : "?";
}

uint64_t rail_flight_now(struct rail_flight *f)
{
	if (!f->now)
		f->now = rail_coarse_ns();
	return f->now;
}

void rail_flight_refused(struct rail_flight *f, uint64_t ns, uint64_t size, int32_t tag)
{
	struct rail_fev *e;

	if (!ns)
		ns = rail_flight_now(f);
	/* A refusal repeats while NCCL retries: count it in the last event instead. */
	if (f->head) {
		e = &f->ev[(f->head - 1) & (RAIL_FLIGHT_N - 1)];
		if (e->type == RAIL_FEV_REFUSED && e->tag == tag && e->size == size) {
			e->arg++;
			e->ns = ns;
			return;
		}
	}
	e = &f->ev[f->head++ & (RAIL_FLIGHT_N - 1)];
	e->ns = ns;
	e->size = size;
	e->tag = tag;
	e->arg = 1;
	e->slot = 0;
	e->type = RAIL_FEV_REFUSED;
	e->n = 0;
	e->note = NULL;
}

void rail_flight_note(struct rail_flight *f, uint8_t type, uint64_t size, int32_t arg,
		      const char *note)
{
	rail_flight_add(f, 0, type, 0, size, 0, arg);
	f->ev[(f->head - 1) & (RAIL_FLIGHT_N - 1)].note = note;
}

int rail_flight_events(const struct rail_flight *f, struct rail_fev *out, int max)
{
	uint32_t n = f->head < RAIL_FLIGHT_N ? f->head : RAIL_FLIGHT_N;
	uint32_t first = f->head - n;
	int k = 0;

	for (uint32_t i = 0; i < n && k < max; i++)
		out[k++] = f->ev[(first + i) & (RAIL_FLIGHT_N - 1)];
	return k;
}

void rail_flight_format(const struct rail_fev *e, uint64_t now_ns, char *buf, size_t len)
{
	double ago = now_ns >= e->ns ? (double)(now_ns - e->ns) / 1e3 : 0.0;
	const char *name = rail_fev_name(e->type);

	switch (e->type) {
	case RAIL_FEV_SEND:
	case RAIL_FEV_RECV:
	case RAIL_FEV_FLUSH:
		snprintf(buf, len, "-%.1f us %s size=%" PRIu64 " tag=%d req=%u%s", ago, name,
			 e->size, (int)e->tag, (unsigned)e->slot,
			 e->arg > 1 ? " (grouped)" : "");
		break;
	case RAIL_FEV_DONE:
		if (e->arg >= 0)
			snprintf(buf, len, "-%.1f us %s req=%u size=%" PRIu64 " after %d us", ago,
				 name, (unsigned)e->slot, e->size, (int)e->arg);
		else
			snprintf(buf, len, "-%.1f us %s req=%u size=%" PRIu64, ago, name,
				 (unsigned)e->slot, e->size);
		break;
	case RAIL_FEV_REFUSED:
		snprintf(buf, len, "-%.1f us %s size=%" PRIu64 " tag=%d, %d times", ago, name,
			 e->size, (int)e->tag, (int)e->arg);
		break;
	case RAIL_FEV_ERROR: {
		char eb[96];

		snprintf(buf, len, "-%.1f us %s req=%u: %s", ago, name, (unsigned)e->slot,
			 rail_strerror(e->arg, eb, sizeof(eb)));
		break;
	}
	case RAIL_FEV_CTS_TX:
	case RAIL_FEV_CTS_RX:
	case RAIL_FEV_EAGER:
		snprintf(buf, len, "-%.1f us %s #%u size=%" PRIu64 " tag=%d", ago, name,
			 (unsigned)e->slot, e->size, (int)e->tag);
		break;
	case RAIL_FEV_CREDIT_TX:
		if (e->arg < 0)
			snprintf(buf, len, "-%.1f us %s: refusal of eager message #%u (%" PRIu64
				 " bytes)", ago, name, (unsigned)e->slot, e->size);
		else
			snprintf(buf, len, "-%.1f us %s: eager messages consumed so far %d", ago, name,
				 (int)e->arg);
		break;
	case RAIL_FEV_WANT_TX:
	case RAIL_FEV_WANT_RX:
		snprintf(buf, len, "-%.1f us %s #%u tag=%d ord=%d", ago, name, (unsigned)e->slot,
			 (int)e->tag, (int)e->arg);
		break;
	case RAIL_FEV_STATE:
		snprintf(buf, len, "-%.1f us %s: %s, qp 0x%" PRIx64, ago, name,
			 e->note ? e->note : "?", e->size);
		break;
	case RAIL_FEV_WC_ERROR:
		snprintf(buf, len, "-%.1f us %s: %s (status %d), qp 0x%" PRIx64, ago, name,
			 e->note ? e->note : "?", (int)e->arg, e->size);
		break;
	case RAIL_FEV_REFUSAL_RX:
		snprintf(buf, len, "-%.1f us %s: message #%u of %" PRIu64 " bytes, room %d", ago,
			 name, (unsigned)e->slot, e->size, (int)e->arg);
		break;
	case RAIL_FEV_PEER_GONE: {
		char eb[96];

		snprintf(buf, len, "-%.1f us %s: %s", ago, name, rail_strerror(e->arg, eb, sizeof(eb)));
		break;
	}
	default:
		snprintf(buf, len, "-%.1f us %s %d", ago, name, (int)e->arg);
		break;
	}
}

static const char *req_kind(int type)
{
	return type == RAIL_REQ_SEND ? "send" : type == RAIL_REQ_RECV ? "recv" : "flush";
}

/* The requests handed to NCCL and not yet reported done or failed. */
static void dump_in_flight(struct rail_comm *c, uint64_t now)
{
	for (uint32_t i = 0; i < c->reqs.capacity; i++) {
		const struct rail_req *r = rail_pool_at(&c->reqs, i);

		if (!r || r->magic != RAIL_REQ_MAGIC)
			continue;
		if (!r->t_post)
			RAIL_WARN("  in flight: %s req=%u size=%" PRIu64 " tag=%d%s, being posted "
				  "(this call)", req_kind(r->type), (unsigned)i, r->size, (int)r->tag,
				  r->n > 1 ? " (first of a group)" : "");
		else
			RAIL_WARN("  in flight: %s req=%u size=%" PRIu64 " tag=%d%s, posted %.1f us "
				  "ago", req_kind(r->type), (unsigned)i, r->size, (int)r->tag,
				  r->n > 1 ? " (first of a group)" : "",
				  now >= r->t_post ? (double)(now - r->t_post) / 1e3 : 0.0);
	}
}

int rail_flight_dump(struct rail_comm *c, const char *why)
{
	struct rail_fev ev[RAIL_FLIGHT_N];
	char desc[512] = "", line[192];
	uint64_t now;
	int n, pending;

	if (c->fl.logged)
		return 0;
	c->fl.logged = 1;
	if (c->ops && c->ops->describe_comm)
		c->ops->describe_comm(c, 1, desc, sizeof(desc));
	else
		snprintf(desc, sizeof(desc), "device %d", c->dev);
	n = rail_flight_events(&c->fl, ev, RAIL_FLIGHT_N);
	pending = c->reqs.mem ? (int)rail_pool_in_use(&c->reqs) : 0;
	RAIL_WARN("flight record of %s %s comm (%s): %s; %d requests in flight, last %d of %u "
		  "events, oldest first:", c->ops ? c->ops->name : "?",
		  c->kind == RAIL_COMM_SEND ? "send" : "receive", desc, why, pending, n,
		  (unsigned)c->fl.head);
	now = rail_coarse_ns();
	for (int i = 0; i < n; i++) {
		rail_flight_format(&ev[i], now, line, sizeof(line));
		RAIL_WARN("  flight: %s", line);
	}
	dump_in_flight(c, now);
	return 1;
}
