/* nccl-net-rail: which RMA backend serves which net transport (rma.h). */
#include <stdio.h>
#include <string.h>

#include "param.h"
#include "rma/rma.h"
#include "rma/rma_ib.h"
#include "rma/rma_tcp.h"

const struct rail_rma_ops *rail_rma_backend(const char *transport, char *why, size_t why_len)
{
	if (!strcmp(transport, "tcp")) {
		snprintf(why, why_len, "the net transport is tcp: one ordered stream per context "
			 "and peer, puts and signals applied by the target's threads, large puts "
			 "striped over NCCL_RAIL_RMA_LANES lanes; GPU windows through the CUDA driver "
			 "and pinned staging");
		return &rail_rma_tcp_ops;
	}
	if (!strcmp(transport, "ib")) {
		char no[200];

		if (!rail_param_int(RAIL_P_RMA_IB)) {
			snprintf(why, why_len, "the net transport is ib and the plugin's verbs backend "
				 "is opt-in (NCCL_RAIL_RMA_IB=1 uses it): NCCL's own backend serves");
			return NULL;
		}
		if (!rma_ib_usable(no, sizeof(no))) {
			snprintf(why, why_len, "the net transport is ib, but %s: NCCL's own backend "
				 "serves", no);
			return NULL;
		}
		snprintf(why, why_len, "the net transport is ib: one RC QP per context and peer, a "
			 "put an RDMA WRITE, a signal a FETCH_AND_ADD after it on the same QP; GPU "
			 "windows where the device's ladder registers GPU memory");
		return &rail_rma_ib_ops;
	}
	snprintf(why, why_len, "this build has no RMA backend for the %s transport", transport);
	return NULL;
}
