/* nccl-net-rail: which RMA backend serves which net transport (rma.h). */
#include <stdio.h>
#include <string.h>

#include "rma/rma.h"
#include "rma/rma_tcp.h"

const struct rail_rma_ops *rail_rma_backend(const char *transport, char *why, size_t why_len)
{
	if (!strcmp(transport, "tcp")) {
		snprintf(why, why_len, "the net transport is tcp: one ordered stream per context "
			 "and peer, puts and signals applied by the target's thread; GPU windows "
			 "through the CUDA driver and pinned staging");
		return &rail_rma_tcp_ops;
	}
	snprintf(why, why_len, "this build has no RMA backend for the %s transport yet (the "
		 "verbs one is to come)", transport);
	return NULL;
}
