/*
 * Conformance scenarios about misuse and hostile input: misuse (calls NCCL
 * would never make, which must end in an error, never a crash) and
 * random-handle (random and damaged connection handles fed to connect).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

/* A call that must fail, with a WARN saying why. */
#define MUST_FAIL(cx, call, what)                                                        \
	do {                                                                             \
		int w_ = rail_conf_warn_count();                                         \
		ncclResult_t r_ = (call);                                                \
		RAIL_CONF_CHECK((cx), r_ != ncclSuccess, "%s returned ncclSuccess", (what)); \
		RAIL_CONF_CHECK((cx), rail_conf_warn_count() > w_,                       \
				"%s returned %s but printed no WARN saying why", (what),  \
				rail_conf_result_str(r_));                               \
	} while (0)

/* ---- misuse ---- */

static void misuse_properties(struct rail_conf *cx)
{
	struct rail_conf_props p;
	int ndev = 0;

	rail_conf_stage(cx, "getProperties(dev, NULL)");
	RAIL_CONF_CALL(cx, cx->net.devices(&ndev), "devices");
	MUST_FAIL(cx, cx->net.get_props_raw(cx->dev, NULL), "getProperties(dev, NULL)");
	MUST_FAIL(cx, cx->net.get_props(-1, &p), "getProperties(-1, props)");
	MUST_FAIL(cx, cx->net.get_props(ndev, &p), "getProperties(ndev, props)");
	/* Still usable afterwards. */
	RAIL_CONF_CALL(cx, cx->net.get_props(cx->dev, &p), "getProperties after misuse");
}

int rail_conf_misuse(struct rail_conf *cx)
{
	misuse_properties(cx);
	rail_conf_barrier(cx, "misuse-done");
	return 0;
}
