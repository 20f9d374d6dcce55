/*
 * nccl-net-rail: fault injection into the TCP transport, for tests.
 *
 * NCCL_RAIL_TCP_FAULT=pthread_create:ERRNO:N[+] makes the N-th helper
 * thread creation (counted from the transport's init) fail with ERRNO, as
 * pthread_create does under RLIMIT_NPROC or a pids cgroup; "N+" fails the
 * N-th and every later one. ERRNO is EAGAIN, ENOMEM, EPERM or a number.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

static struct {
	int armed;
	int err;
	long nth;
	int sticky;
	atomic_long calls;
} tcp_fault;

static int parse_errno(const char *s)
{
	char *end;
	long v;

	if (!strcmp(s, "EAGAIN"))
		return EAGAIN;
	if (!strcmp(s, "ENOMEM"))
		return ENOMEM;
	if (!strcmp(s, "EPERM"))
		return EPERM;
	v = strtol(s, &end, 10);
	return (*s && !*end && v > 0 && v < 4096) ? (int)v : -1;
}

void tcp_fault_arm(void)
{
	const char *spec = rail_param_str(RAIL_P_TCP_FAULT);
	char buf[128], *c1, *c2, *end;
	int err, sticky = 0;
	size_t n;
	long nth;

	tcp_fault.armed = 0;
	atomic_store(&tcp_fault.calls, 0);
	if (!spec || !spec[0])
		return;
	rail_strlcpy(buf, spec, sizeof(buf));
	c1 = strchr(buf, ':');
	c2 = c1 ? strchr(c1 + 1, ':') : NULL;
	if (!c1 || !c2 || strncmp(buf, "pthread_create:", 15)) {
		RAIL_WARN("NCCL_RAIL_TCP_FAULT=%s ignored: expected pthread_create:ERRNO:N[+]", spec);
		return;
	}
	*c2 = '\0';
	err = parse_errno(c1 + 1);
	n = strlen(c2 + 1);
	if (n && c2[n] == '+') {
		sticky = 1;
		c2[n] = '\0';
	}
	nth = strtol(c2 + 1, &end, 10);
	if (err < 0 || *end || nth < 1) {
		RAIL_WARN("NCCL_RAIL_TCP_FAULT=%s ignored: ERRNO must be EAGAIN, ENOMEM, EPERM or a "
			  "number, N at least 1", spec);
		return;
	}
	tcp_fault.err = err;
	tcp_fault.nth = nth;
	tcp_fault.sticky = sticky;
	tcp_fault.armed = 1;
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "NCCL_RAIL_TCP_FAULT=%s armed (fault injection for "
		  "tests)", spec);
}

int tcp_fault_thread_create(void)
{
	long n;

	if (!tcp_fault.armed)
		return 0;
	n = atomic_fetch_add(&tcp_fault.calls, 1) + 1;
	if (n == tcp_fault.nth || (tcp_fault.sticky && n > tcp_fault.nth)) {
		RAIL_INFO(RAIL_LOG_NET, "NCCL_RAIL_TCP_FAULT: failing helper thread creation %ld "
			  "with %s", n, RAIL_ERRSTR(-tcp_fault.err));
		return -tcp_fault.err;
	}
	return 0;
}
