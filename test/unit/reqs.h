/*
 * Unit tests: wait for n send and n receive requests of the version-neutral
 * API as NCCL does, testing each in turn until all are done; receive i must
 * report want[i] bytes. Fails the test, naming `what`, on a wrong size or
 * when requests are left after timeout_s seconds.
 */
#ifndef RAIL_TEST_REQS_H
#define RAIL_TEST_REQS_H

#include "unit.h"

#include "api.h"
#include "rail.h"

static inline void reqs_wait(void **sreq, void **rreq, const size_t *want, int n,
			     unsigned timeout_s, const char *what)
{
	int sdone[64] = { 0 }, rdone[64] = { 0 }, left = 2 * n, got;
	uint64_t deadline = rail_now_ns() + (uint64_t)timeout_s * 1000000000ull;

	assert_true(n <= 64);
	while (left && rail_now_ns() < deadline) {
		for (int i = 0; i < n; i++) {
			if (!sdone[i]) {
				assert_int_equal(rail_net_test(sreq[i], &sdone[i], &got), ncclSuccess);
				left -= sdone[i];
			}
			if (!rdone[i]) {
				assert_int_equal(rail_net_test(rreq[i], &rdone[i], &got), ncclSuccess);
				if (rdone[i] && got != (int)want[i])
					fail_msg("%s: receive %d of %d reported %d bytes, %zu sent", what,
						 i, n, got, want[i]);
				left -= rdone[i];
			}
		}
	}
	if (left)
		fail_msg("%s: %d of %d requests not done in %u s", what, left, 2 * n, timeout_s);
}

#endif
