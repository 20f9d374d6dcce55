/*
 * nccl-net-rail: the fault-injection rule shared by the transports' test
 * seams (NCCL_RAIL_IB_FAULT, NCCL_RAIL_TCP_FAULT). A spec is a comma list
 * of call:ERRNO:N[+] entries: the N-th call (counted from arming) of that
 * call fails with ERRNO; "N+" fails the N-th and every later one. ERRNO is
 * a name (ENOMEM, EAGAIN, ...) or a number.
 */
#ifndef RAIL_FAULT_H
#define RAIL_FAULT_H

#include <stdatomic.h>
#include <stddef.h>

struct rail_fault {
	int armed;
	int err;	/* positive errno */
	long nth;
	int sticky;
	atomic_long calls;
};

/*
 * Parse spec against the ncalls names (an entry may also drop a name's
 * "ibv_" prefix) into out[], all disarmed first. 0, or -EINVAL with why set
 * (it lists the valid calls); out[] is then all disarmed.
 */
int rail_fault_parse(const char *spec, const char *const *names, int ncalls,
		     struct rail_fault *out, char *why, size_t why_len);

/* Count one call: its errno (positive) when this call must fail, else 0. */
int rail_fault_hit(struct rail_fault *f);

#endif
