/*
 * nccl-net-rail: fault injection into the TCP transport, for tests.
 *
 * NCCL_RAIL_TCP_FAULT=pthread_create:ERRNO:N[+] makes the N-th helper
 * thread creation (counted from the transport's init) fail with ERRNO, as
 * pthread_create does under RLIMIT_NPROC or a pids cgroup; "N+" fails the
 * N-th and every later one. accept_reply:ERRNO:N[+] fails the N-th reply
 * an accepting side sends to a connector (its receive comm already made),
 * as a send on a socket the peer reset does. ERRNO is a name (EAGAIN,
 * ENOMEM, EPERM...) or a number. The rule and its parser are shared with
 * the verbs seam (fault.h).
 */
#include <stdatomic.h>
#include <stdio.h>

#include "fault.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

enum { TCP_FAULT_THREAD, TCP_FAULT_ACCEPT_REPLY, TCP_FAULT_N };
static const char *const tcp_fault_names[TCP_FAULT_N] = { "pthread_create", "accept_reply" };
static struct rail_fault tcp_fault[TCP_FAULT_N];

void tcp_fault_arm(void)
{
	const char *spec = rail_param_str(RAIL_P_TCP_FAULT);
	char why[256];

	if (rail_fault_parse(spec, tcp_fault_names, TCP_FAULT_N, tcp_fault, why, sizeof(why))) {
		RAIL_WARN("NCCL_RAIL_TCP_FAULT=%s ignored: %s", spec, why);
		return;
	}
	for (int k = 0; k < TCP_FAULT_N; k++) {
		if (!tcp_fault[k].armed)
			continue;
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "NCCL_RAIL_TCP_FAULT=%s armed (fault "
			  "injection for tests)", spec);
		return;
	}
}

/* Count one call of kind k: its -errno when it must fail (said at INFO), else 0. */
static int hit(int k, const char *what)
{
	int err = rail_fault_hit(&tcp_fault[k]);

	if (err)
		RAIL_INFO(RAIL_LOG_NET, "NCCL_RAIL_TCP_FAULT: failing %s %ld with %s", what,
			  atomic_load(&tcp_fault[k].calls), RAIL_ERRSTR(-err));
	return -err;
}

int tcp_fault_thread_create(void)
{
	return hit(TCP_FAULT_THREAD, "helper thread creation");
}

int tcp_fault_accept_reply(void)
{
	return hit(TCP_FAULT_ACCEPT_REPLY, "accept reply");
}
