/*
 * nccl-net-rail: fault injection into the TCP transport, for tests.
 *
 * NCCL_RAIL_TCP_FAULT=pthread_create:ERRNO:N[+] makes the N-th helper
 * thread creation (counted from the transport's init) fail with ERRNO, as
 * pthread_create does under RLIMIT_NPROC or a pids cgroup; "N+" fails the
 * N-th and every later one. ERRNO is a name (EAGAIN, ENOMEM, EPERM...) or a
 * number. The rule and its parser are shared with the verbs seam (fault.h).
 */
#include <stdatomic.h>
#include <stdio.h>

#include "fault.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

static const char *const tcp_fault_names[] = { "pthread_create" };
static struct rail_fault tcp_fault;

void tcp_fault_arm(void)
{
	const char *spec = rail_param_str(RAIL_P_TCP_FAULT);
	char why[256];

	if (rail_fault_parse(spec, tcp_fault_names, 1, &tcp_fault, why, sizeof(why))) {
		RAIL_WARN("NCCL_RAIL_TCP_FAULT=%s ignored: %s", spec, why);
		return;
	}
	if (tcp_fault.armed)
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "NCCL_RAIL_TCP_FAULT=%s armed (fault "
			  "injection for tests)", spec);
}

int tcp_fault_thread_create(void)
{
	int err = rail_fault_hit(&tcp_fault);

	if (err)
		RAIL_INFO(RAIL_LOG_NET, "NCCL_RAIL_TCP_FAULT: failing helper thread creation %ld "
			  "with %s", atomic_load(&tcp_fault.calls), RAIL_ERRSTR(-err));
	return -err;
}
