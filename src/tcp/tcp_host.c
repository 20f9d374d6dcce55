/*
 * nccl-net-rail: what the TCP transport sizes by the host: the ranks a
 * launcher says share it and the CPUs this process may run on, and the two
 * rules made of them, the helper pool's bound (tcp_pool.c) and the inline
 * limit. Plain reads of the environment and of the affinity mask, below
 * every other file of src/tcp/ (the devices' loopback speed uses the ranks).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "param.h"
#include "rail.h"
#include "tcp/tcp.h"

/* The launcher's count of ranks on this host, or 0 when none says (tcp.h). */
int tcp_local_ranks(const char **from)
{
	static const char *const vars[] = { "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
					    "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		char *end;
		long n = v ? strtol(v, &end, 10) : 0;

		if (v && end != v && (*end == '\0' || *end == '(') && n > 0 && n < 100000) {
			*from = vars[i];
			return (int)n;
		}
	}
	return 0;
}

/* The CPUs this process may run on (sched_getaffinity), at least 1. */
static int cpus_allowed(void)
{
	cpu_set_t set;
	int cpus = 0;

	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		cpus = CPU_COUNT(&set);
	return cpus > 0 ? cpus : (int)RAIL_MAX(sysconf(_SC_NPROCESSORS_ONLN), 1);
}

/*
 * The bound: NCCL_RAIL_TCP_THREADS, or else the CPUs this process may run on
 * (sched_getaffinity), divided by the ranks a launcher says share the host,
 * minus 1 for NCCL's proxy progress thread (which moves chunks too, in
 * test()), within 2..16: at least two, so that one socket's wait for a
 * slow peer never leaves a process with no helper free.
 */
int tcp_pool_size(char *why, size_t why_len)
{
	int64_t forced = rail_param_int(RAIL_P_TCP_THREADS);
	const char *from = NULL;
	int cpus, ranks, n;

	if (forced > 0) {
		snprintf(why, why_len, "NCCL_RAIL_TCP_THREADS");
		return (int)RAIL_MIN(forced, TCP_POOL_MAX);
	}
	cpus = cpus_allowed();
	ranks = tcp_local_ranks(&from);
	n = cpus / (ranks > 0 ? ranks : 1) - 1;
	n = RAIL_MAX(2, RAIL_MIN(n, 16));
	if (ranks > 0)
		snprintf(why, why_len, "%d CPUs / %d local ranks (%s) - 1, within 2..16", cpus,
			 ranks, from);
	else
		snprintf(why, why_len, "%d CPUs - 1, within 2..16", cpus);
	return n;
}

/*
 * The inline limit: NCCL_RAIL_TCP_INLINE, or else 16 KiB, and 4 MiB on a
 * crowded host (several ranks a launcher says share it, with fewer than
 * TCP_CROWDED_CPUS CPUs each). There every rank's NCCL proxy thread and
 * GPU-waiting thread spin, and a hand-off to a helper thread waits for a
 * CPU: with 8 ranks on 16 CPUs, 1-8 MiB all-reduces ran 1.2-1.6x faster with
 * NCCL's progress thread moving the messages itself, while 4 ranks lost
 * bandwidth that way.
 */
uint32_t tcp_inline_max(char *why, size_t why_len)
{
	int64_t forced = rail_param_int(RAIL_P_TCP_INLINE);
	const char *from = NULL;
	int cpus, ranks;

	if (forced != RAIL_PARAM_AUTO) {
		snprintf(why, why_len, "NCCL_RAIL_TCP_INLINE");
		return (uint32_t)forced;
	}
	cpus = cpus_allowed();
	ranks = tcp_local_ranks(&from);
	if (ranks > 1 && cpus / ranks < TCP_CROWDED_CPUS) {
		snprintf(why, why_len, "%d CPUs / %d local ranks (%s) < %d: a crowded host", cpus,
			 ranks, from, TCP_CROWDED_CPUS);
		return TCP_INLINE_CROWDED;
	}
	if (ranks > 1)
		snprintf(why, why_len, "%d CPUs / %d local ranks (%s): not crowded", cpus, ranks,
			 from);
	else
		snprintf(why, why_len, "default");
	return TCP_INLINE_DEFAULT;
}

/* Comms of this process holding data sockets (tcp.h, lazy data sockets). */
static _Atomic int data_comms;

void tcp_data_comms_add(int d)
{
	atomic_fetch_add_explicit(&data_comms, d, memory_order_relaxed);
}

int tcp_data_comms(void)
{
	return atomic_load_explicit(&data_comms, memory_order_relaxed);
}

int tcp_lazy_socks(int want)
{
	return tcp_data_comms() >= TCP_LAZY_BUDGET ? RAIL_MIN(want, 1) : want;
}
