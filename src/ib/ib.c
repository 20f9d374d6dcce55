/* nccl-net-rail: placeholder until the verbs transport lands. */
#include <stdio.h>

#include "transport.h"

static int ib_init(char *why, size_t why_len)
{
	snprintf(why, why_len, "the verbs transport is not part of this build yet");
	return 0;
}

static void ib_fini(void)
{
}

const struct rail_transport_ops rail_ib_ops = {
	.name = "ib",
	.init = ib_init,
	.fini = ib_fini,
};

#include "ib/ib_report.h"

void rail_ib_report(FILE *out, int json)
{
	if (json)
		fprintf(out, "{\"available\": false, \"reason\": \"verbs transport not built\"}");
	else
		fprintf(out, "verbs transport: not part of this build yet\n");
}
