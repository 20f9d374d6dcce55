/*
 * Conformance: failover-loop. B sends to A, round after round, messages of
 * mixed sizes (eager-sized to megabytes), every byte and guard checked by
 * the engine, for RAIL_CONF_FAILOVER_SECONDS (unset: SKIP; the scenario
 * needs a harness that fails a link meanwhile, test/rxe/tests.d/16-...).
 * A writes "READY" to --event-file after the first round, then at the end
 * "DONE rounds=N longest_ms=X longest_end=T" with T the wall-clock time
 * (seconds since the epoch) when the slowest round ended: the harness
 * subtracts the time it failed the link to get the time to recover. Any
 * failed request fails the scenario: a link failure must cost a delay only.
 */
#include <stdlib.h>
#include <time.h>

#include "conf.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static double wall_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int rail_conf_failover_loop(struct rail_conf *cx)
{
	static const size_t base[] = { 8, 1000, 4096, 4097, 65536, 262144, RAIL_CONF_MIB, 100,
				       16384, 2 * RAIL_CONF_MIB };
	const char *env = getenv("RAIL_CONF_FAILOVER_SECONDS");
	size_t cap = rail_conf_common_max_msg(cx), sizes[4 * NELEM(base)];
	double seconds = env ? atof(env) : 0, longest = 0, longest_end = 0;
	struct rail_conf_pair p;
	uint64_t start;
	int rounds = 0, go = 1, mine;

	if (seconds <= 0) {
		rail_conf_skip_reason(cx, "set RAIL_CONF_FAILOVER_SECONDS to run it, with a "
				      "harness that fails a link meanwhile (test/rxe/tests.d)");
		return 1;
	}
	for (size_t i = 0; i < NELEM(sizes); i++)
		sizes[i] = base[i % NELEM(base)] < cap ? base[i % NELEM(base)] : cap;
	rail_conf_pair_open(cx, &p);
	start = rail_conf_now_ns();
	rail_conf_stage(cx, "rounds of %zu messages for %.0f s", NELEM(sizes), seconds);
	while (go) {
		double t0 = wall_now(), t1;

		rail_conf_simple_traffic(cx, &p, (unsigned)rounds, sizes, NULL, (int)NELEM(sizes),
					 "failover-loop");
		t1 = wall_now();
		if (t1 - t0 > longest) {
			longest = t1 - t0;
			longest_end = t1;
		}
		if (rounds++ == 0 && cx->role == RAIL_CONF_ROLE_A)
			rail_conf_event(cx, "READY");
		/* A decides when to stop; B follows */
		mine = cx->role != RAIL_CONF_ROLE_A ||
		       (double)(rail_conf_now_ns() - start) / 1e9 < seconds;
		go = (int)rail_conf_xchg(cx, mine) && mine;
	}
	if (cx->role == RAIL_CONF_ROLE_A) {
		rail_conf_event(cx, "DONE rounds=%d longest_ms=%.1f longest_end=%.3f", rounds,
				longest * 1e3, longest_end);
		rail_conf_note(cx, "%d rounds of %zu messages; the slowest took %.1f ms", rounds,
			       NELEM(sizes), longest * 1e3);
	}
	rail_conf_pair_close(cx, &p);
	return 0;
}
