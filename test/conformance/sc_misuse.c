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

/* ---- random-handle ---- */

#define RH_RANDOM 32

static void random_bytes(uint8_t *p, size_t len, uint64_t seed)
{
	for (size_t i = 0; i < len; i += 8) {
		uint64_t v = rail_conf_mix64(seed + i);

		memcpy(p + i, &v, len - i < 8 ? len - i : 8);
	}
}

/*
 * B: random handles, then random handles that start like the real one
 * (magic and version, so the decoder gets past its first checks), must be
 * refused with a WARN; nothing in the handle may be trusted as a pointer.
 */
static void random_handles_b(struct rail_conf *cx, const uint8_t *good)
{
	uint8_t bad[NCCL_NET_HANDLE_MAXSIZE];
	char what[96];

	for (int i = 0; i < 2 * RH_RANDOM; i++) {
		random_bytes(bad, sizeof(bad), rail_conf_seed(cx, 77, (unsigned)i, 0));
		if (i >= RH_RANDOM)
			memcpy(bad, good, 8);
		snprintf(what, sizeof(what), "random handle #%d%s", i,
			 i >= RH_RANDOM ? " (real magic and version)" : "");
		rail_conf_connect_refused(cx, bad, what);
	}
}

int rail_conf_random_handle(struct rail_conf *cx)
{
	uint8_t h[NCCL_NET_HANDLE_MAXSIZE], damaged[NCCL_NET_HANDLE_MAXSIZE];
	void *lc = NULL;

	if (cx->role == RAIL_CONF_ROLE_A) {
		lc = rail_conf_listen(cx, h);
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_HANDLE, h, sizeof(h));
		rail_conf_watch_listener(cx, lc, "random");
	} else {
		rail_conf_ctl_recv(cx, RAIL_CONF_MSG_HANDLE, h, sizeof(h));
		random_handles_b(cx, h);
		rail_conf_ctl_send(cx, RAIL_CONF_MSG_DONE, NULL, 0);
	}
	/*
	 * The real handle with the zero bytes at its end (the last 32 at most:
	 * listen wrote nothing there) randomized, as a buffer NCCL did not
	 * clear could hold: a plugin keeping connector state there must not
	 * trust those bytes. The connection must work.
	 */
	memcpy(damaged, h, sizeof(damaged));
	for (int i = NCCL_NET_HANDLE_MAXSIZE - 1; i >= NCCL_NET_HANDLE_MAXSIZE - 32 && !h[i]; i--)
		damaged[i] = (uint8_t)(rail_conf_mix64((uint64_t)i * 131) | 1);
	rail_conf_good_connection(cx, lc, damaged);
	return 0;
}
