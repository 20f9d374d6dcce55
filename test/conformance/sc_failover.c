/*
 * Conformance: failover-loop. B sends to A, round after round, messages of
 * mixed sizes (eager-sized to megabytes), every byte and guard checked by
 * the engine, for RAIL_CONF_FAILOVER_SECONDS (unset: SKIP; the scenario
 * needs a harness that fails a link meanwhile, test/rxe/tests.d/16-...).
 * A writes "READY" to --event-file after the first round; at the end one
 * "SLOW round=K start=T0 end=T1 ms=X" line per round that took more than
 * three times the median round (a move, a move back), T0 and T1 wall-clock
 * seconds since the epoch, and "DONE rounds=N median_ms=M longest_ms=X
 * longest_end=T": the harness subtracts the time it failed the link from
 * the end of the first slow round after it, to get the time to recover.
 * RAIL_CONF_FAILOVER_UNTIL=PATH (A's): past those seconds, A goes on until
 * PATH exists, so a harness that writes it once the link is back and the
 * hold-down has passed sees the move back even when the fault's events came
 * late (a guest that stalled for tens of seconds); --timeout still bounds it.
 * Any failed request fails the scenario: a link failure must cost a delay.
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "conf.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static double wall_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median round duration, in seconds. */
static double median_round(const double *t0s, const double *t1s, int n)
{
	double *d = malloc((size_t)(n ? n : 1) * sizeof(*d)), m;

	if (!d || !n) {
		free(d);
		return 0;
	}
	for (int k = 0; k < n; k++)
		d[k] = t1s[k] - t0s[k];
	qsort(d, (size_t)n, sizeof(*d), cmp_double);
	m = d[n / 2];
	free(d);
	return m;
}

int rail_conf_failover_loop(struct rail_conf *cx)
{
	static const size_t base[] = { 8, 1000, 4096, 4097, 65536, 262144, RAIL_CONF_MIB, 100,
				       16384, 2 * RAIL_CONF_MIB };
	const char *env = getenv("RAIL_CONF_FAILOVER_SECONDS");
	const char *until = getenv("RAIL_CONF_FAILOVER_UNTIL");
	size_t cap = rail_conf_common_max_msg(cx), sizes[4 * NELEM(base)];
	double seconds = env ? atof(env) : 0, longest = 0, longest_end = 0;
	struct rail_conf_pair p;
	uint64_t start;
	int rounds = 0, go = 1, mine, cap_rounds = 0;
	double *t0s = NULL, *t1s = NULL;

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
		if (rounds == cap_rounds) {
			cap_rounds = cap_rounds ? 2 * cap_rounds : 256;
			t0s = realloc(t0s, (size_t)cap_rounds * sizeof(*t0s));
			t1s = realloc(t1s, (size_t)cap_rounds * sizeof(*t1s));
			RAIL_CONF_CHECK(cx, t0s && t1s, "out of memory");
		}
		t0s[rounds] = t0;
		t1s[rounds] = t1;
		if (t1 - t0 > longest) {
			longest = t1 - t0;
			longest_end = t1;
		}
		if (rounds++ == 0 && cx->role == RAIL_CONF_ROLE_A)
			rail_conf_event(cx, "READY");
		/* A decides when to stop; B follows */
		mine = cx->role != RAIL_CONF_ROLE_A ||
		       (double)(rail_conf_now_ns() - start) / 1e9 < seconds ||
		       (until && *until && access(until, F_OK) != 0);
		go = (int)rail_conf_xchg(cx, mine) && mine;
	}
	if (cx->role == RAIL_CONF_ROLE_A) {
		double med = median_round(t0s, t1s, rounds);

		for (int k = 0; k < rounds; k++)
			if (t1s[k] - t0s[k] > 3 * med)
				rail_conf_event(cx, "SLOW round=%d start=%.3f end=%.3f ms=%.1f", k,
						t0s[k], t1s[k], (t1s[k] - t0s[k]) * 1e3);
		rail_conf_event(cx, "DONE rounds=%d median_ms=%.1f longest_ms=%.1f longest_end=%.3f",
				rounds, med * 1e3, longest * 1e3, longest_end);
		rail_conf_note(cx, "%d rounds of %zu messages; the slowest took %.1f ms", rounds,
			       NELEM(sizes), longest * 1e3);
	}
	free(t0s);
	free(t1s);
	rail_conf_pair_close(cx, &p);
	return 0;
}
