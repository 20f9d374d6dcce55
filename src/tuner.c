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
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "log.h"
#include "nccl_tuner.h"
#include "param.h"
#include "tuner.h"

#define RAIL_LOG_TUNING 0x40ul	/* NCCL_TUNING */

struct rail_tuner {
	double us_per_mib;	/* 0: inactive */
};

/* Why a context is inactive, or NULL when it is active. */
static const char *tuner_idle_why(size_t nnodes, int64_t penalty)
{
	const char *transport = rail_net_in_use();

	if (penalty <= 0)
		return "NCCL_RAIL_TCP_LL_PENALTY=0";
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
	const char *why;

	if (!t)
		return -ENOMEM;
	why = tuner_idle_why(nnodes, penalty);
	if (why) {
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_TUNING,
			  "tuner: %zu ranks on %zu nodes: NCCL's choices left alone (%s)",
			  nranks, nnodes, why);
	} else {
		t->us_per_mib = (double)penalty;
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_TUNING,
			  "tuner: %zu ranks on %zu nodes over TCP: LL costs %.0f us "
			  "more per MiB than NCCL's model (NCCL_RAIL_TCP_LL_PENALTY)",
			  nranks, nnodes, t->us_per_mib);
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

void rail_tuner_close(struct rail_tuner *t)
{
	free(t);
}
