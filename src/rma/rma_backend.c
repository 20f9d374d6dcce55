/* nccl-net-rail: which RMA backend serves which net transport (rma.h). */
#include <stdio.h>
#include <string.h>

#include "rma/rma.h"

const struct rail_rma_ops *rail_rma_backend(const char *transport, char *why, size_t why_len)
{
	snprintf(why, why_len, "this build has no RMA backend for the %s transport yet",
		 transport);
	return NULL;
}
