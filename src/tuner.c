/*
 * nccl-net-rail: the tuner's one correction (see tuner.h).
 *
 * NCCL models the LL protocol on a network as min(llMaxBw, busBw / 2): half
 * the bandwidth of Simple, with a lower latency per step. Over this plugin's
 * TCP transport LL moves twice the bytes in small steps, each a message with
 * its own hand-off, and runs far below that: on the GPU machine NCCL kept LL
 * up to 512 KiB at 2, 4 and 8 ranks, where Simple was 1.4-1.6x faster (and
 * Socket, whose reported 10 Gbps makes NCCL leave LL sooner, won). The
 * correction adds NCCL_RAIL_TCP_LL_PENALTY microseconds per MiB of the
 * collective to every LL entry NCCL considers. The latency advantage of LL
 * stays, so small collectives keep it; the size where Simple takes over grows
 * with the steps of the algorithm (about 16 KiB at 2 ranks, 64 KiB at 4,
 * 128 KiB at 8 for the default 2048). LL is never removed: when NCCL
 * considers nothing else (NCCL_PROTO=LL), it is still chosen.
 *
 * Channels: a ring collective of n bytes on c channels and r ranks sends
 * messages of n / (c x r) bytes per step. NCCL opens as many channels as the
 * speed we report deserves (4 at 2 ranks for loopback's 240 Gbps) and uses
 * them all from a few hundred KiB, where TCP's fixed cost per message (a
 * hand-off to a helper thread, a wake-up) outweighs what a channel adds.
 * For Ring/Simple, the tuner asks for n / (r x NCCL_RAIL_TCP_MIN_STEP)
 * channels when that is 1 or 2, and leaves larger collectives alone.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "log.h"
#include "nccl_tuner.h"
#include "param.h"
#include "tuner.h"

#define RAIL_LOG_TUNING 0x40ul	/* NCCL_TUNING */

struct rail_tuner {
	double us_per_mib;	/* 0: LL left alone */
	size_t nranks;
	uint64_t min_step;	/* 0: channels left to NCCL */
};

/* Why a context is inactive, or NULL when it is active. */
static const char *tuner_idle_why(size_t nnodes, int64_t penalty, int64_t min_step)
{
	const char *transport = rail_net_in_use();

	if (penalty <= 0 && min_step <= 0)
		return "NCCL_RAIL_TCP_LL_PENALTY=0 and NCCL_RAIL_TCP_MIN_STEP=0";
	if (nnodes < 2)
		return "one node: no network step";
	if (!transport)
		return "NCCL does not use this plugin's network";
	if (strcmp(transport, "tcp") != 0)
		return "the verbs transport: NCCL's model holds";
	return NULL;
}

int rail_tuner_open(size_t nranks, size_t nnodes, struct rail_tuner **out)
{
	struct rail_tuner *t = calloc(1, sizeof(*t));
	int64_t penalty = rail_param_int(RAIL_P_TCP_LL_PENALTY);
	int64_t min_step = rail_param_int(RAIL_P_TCP_MIN_STEP);
	const char *why;

	if (!t)
		return -ENOMEM;
	why = tuner_idle_why(nnodes, penalty, min_step);
	if (why) {
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_TUNING,
			  "tuner: %zu ranks on %zu nodes: NCCL's choices left alone (%s)",
			  nranks, nnodes, why);
	} else {
		t->us_per_mib = penalty > 0 ? (double)penalty : 0;
		t->nranks = nranks;
		t->min_step = min_step > 0 ? (uint64_t)min_step : 0;
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_TUNING,
			  "tuner: %zu ranks on %zu nodes over TCP: LL costs %.0f us more per MiB "
			  "than NCCL's model (NCCL_RAIL_TCP_LL_PENALTY%s); ring steps of at least "
			  "%llu bytes (NCCL_RAIL_TCP_MIN_STEP%s)", nranks, nnodes, t->us_per_mib,
			  t->us_per_mib > 0 ? "" : "=0: LL left alone",
			  (unsigned long long)t->min_step,
			  t->min_step ? "" : "=0: channels left to NCCL");
	}
	*out = t;
	return 0;
}

void rail_tuner_adjust(struct rail_tuner *t, size_t nbytes, float *table, int nalgo, int nproto)
{
	float extra;

	if (!t || t->us_per_mib <= 0 || !table || nproto <= NCCL_PROTO_LL || nalgo <= 0)
		return;
	extra = (float)(t->us_per_mib * ((double)nbytes / (1024.0 * 1024.0)));
	for (int a = 0; a < nalgo; a++) {
		float *ll = &table[a * nproto + NCCL_PROTO_LL];

		if (*ll >= 0)
			*ll += extra;
	}
}

/* The algorithm of the cheapest entry NCCL considers, or -1. */
static int cheapest(const float *table, int nalgo, int nproto, int *proto)
{
	int best = -1;

	for (int a = 0; a < nalgo; a++) {
		for (int p = 0; p < nproto; p++) {
			float v = table[a * nproto + p];

			if (v >= 0 && (best < 0 || v < table[best]))
				best = a * nproto + p;
		}
	}
	*proto = best < 0 ? -1 : best % nproto;
	return best < 0 ? -1 : best / nproto;
}

int rail_tuner_channels(const struct rail_tuner *t, int coll, size_t nbytes, const float *table,
			int nalgo, int nproto)
{
	uint64_t want;
	int proto;

	if (!t || !t->min_step || !table || t->nranks < 2)
		return 0;
	if (coll != ncclFuncAllReduce && coll != ncclFuncAllGather &&
	    coll != ncclFuncReduceScatter)
		return 0;
	if (cheapest(table, nalgo, nproto, &proto) != NCCL_ALGO_RING || proto != NCCL_PROTO_SIMPLE)
		return 0;
	want = (uint64_t)nbytes / ((uint64_t)t->nranks * t->min_step);
	return want > 2 ? 0 : want < 1 ? 1 : (int)want;
}

void rail_tuner_close(struct rail_tuner *t)
{
	free(t);
}
