/*
 * nccl-net-rail: what N idle verbs connections cost a process, on the fake
 * provider (test/fakeverbs/). One process opens N send+receive pairs (one
 * listener, N connects, one 8-byte message each way through every pair),
 * leaves them idle, and reports the process's CPU time over the idle window
 * (getrusage: all threads), its threads and its context switches (each a
 * thread going to sleep or being preempted: a wake-up that did work). Each
 * (failover, N) combination runs in a child process of its own, so the
 * parameters are read fresh.
 *
 *   scale_bench [-n N[,N...]] [-t SECONDS] [-f 1,0] [-r REPEATS] [-w SECONDS]
 *
 * Defaults: -n 1,64,256,1024 -t 5 -f 1,0 -r 1 -w 0: each N REPEATS times,
 * the -f values taken in turn (a virtual machine's CPU accounting of one
 * thread's wake-up in a large process can reach tens of milliseconds); the
 * window starts -w seconds after the last message (0: the cost of going
 * idle included; 20, past the two sweeps of the move thread that find the
 * comms quiet, at most 15 s with NCCL_RAIL_IB_STALL_TIMEOUT=10: the cost of
 * staying idle). RAIL_FAKEVERBS_LIB names the fake
 * libibverbs (default: beside this binary, ../fakeverbs/libfakeverbs.so).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "rail.h"

#define NET_ABI 12
#define MAX_N 4096
#define WINDOW 64	/* connects in flight at once (the listener keeps 128 pending) */

static const char conf[] =
	"device mlx5_0 pci=0000:1b:00.0\n"
	"port 1 link=eth speed=ndr width=4x\n"
	"gid 0 fe80::1 type=v1\n"
	"gid 1 ::ffff:10.1.0.1 type=v2\n"
	"device mlx5_1 pci=0000:3d:00.0\n"
	"port 1 link=eth speed=ndr width=4x\n"
	"gid 0 fe80::2 type=v1\n"
	"gid 1 ::ffff:10.2.0.1 type=v2\n";

struct pairs {
	int n;
	void *ctx, *lc;
	void **sc, **rc;
	uint8_t (*h)[RAIL_HANDLE_SIZE];
};

static void check(ncclResult_t r, const char *what, int i)
{
	if (r != ncclSuccess) {
		fprintf(stderr, "scale_bench: %s (pair %d) failed (%d)\n", what, i, (int)r);
		exit(1);
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* N connects (each with its own copy of the listener's handle, as NCCL's peers have), N accepts. */
static void connect_all(struct pairs *P)
{
	int made = 0, accepted = 0, next = 0;
	double deadline = now_s() + 120;

	while (made < P->n || accepted < P->n) {
		int inflight = 0;

		for (int i = 0; i < next; i++)
			inflight += !P->sc[i];
		while (next < P->n && inflight < WINDOW) {
			inflight++;
			next++;
		}
		for (int i = 0; i < next; i++) {
			if (P->sc[i])
				continue;
			check(rail_net_connect(P->ctx, 1, -1, P->h[i], &P->sc[i]), "connect", i);
			made += P->sc[i] != NULL;
		}
		if (accepted < P->n) {
			check(rail_net_accept(P->lc, &P->rc[accepted]), "accept", accepted);
			accepted += P->rc[accepted] != NULL;
		}
		if (now_s() > deadline) {
			fprintf(stderr, "scale_bench: %d of %d connects, %d accepts after 120 s\n", made,
				P->n, accepted);
			exit(1);
		}
	}
}

static void wait_done(void *r, int i)
{
	int done = 0;

	while (!done)
		check(rail_net_test(r, &done, NULL), "test", i);
}

/*
 * One 8-byte message through every pair (accept order pairs the receive
 * comms with the send comms in no known order: a tag per round, all sends
 * and receives posted, then all tested).
 */
static void one_message_each(struct pairs *P)
{
	static char buf[8];
	void **mh = calloc((size_t)P->n * 2, sizeof(void *));
	void **req = calloc((size_t)P->n * 2, sizeof(void *));

	if (!mh || !req)
		exit(1);
	for (int i = 0; i < P->n; i++) {
		check(rail_net_reg_mr(P->sc[i], buf, sizeof(buf), NCCL_PTR_HOST, &mh[i]), "regMr", i);
		check(rail_net_reg_mr(P->rc[i], buf, sizeof(buf), NCCL_PTR_HOST, &mh[P->n + i]),
		      "regMr", i);
	}
	for (int i = 0; i < P->n; i++) {
		void *d = buf;
		size_t n = sizeof(buf);
		int tag = 1;

		while (!req[P->n + i])
			check(rail_net_irecv(P->rc[i], 1, &d, &n, &tag, &mh[P->n + i], &req[P->n + i]),
			      "irecv", i);
	}
	for (int i = 0; i < P->n; i++)
		while (!req[i])
			check(rail_net_isend(P->sc[i], buf, sizeof(buf), 1, mh[i], &req[i]), "isend", i);
	for (int i = 0; i < 2 * P->n; i++)
		wait_done(req[i], i % P->n);
	for (int i = 0; i < P->n; i++) {
		check(rail_net_dereg_mr(P->sc[i], mh[i]), "deregMr", i);
		check(rail_net_dereg_mr(P->rc[i], mh[P->n + i]), "deregMr", i);
	}
	free(mh);
	free(req);
}

static int threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static double cpu_s(const struct rusage *u)
{
	return (double)u->ru_utime.tv_sec + (double)u->ru_utime.tv_usec / 1e6 +
	       (double)u->ru_stime.tv_sec + (double)u->ru_stime.tv_usec / 1e6;
}

static struct timespec ts_of(double secs)
{
	return (struct timespec){ (time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9) };
}

/*
 * The child: N pairs with failover on or off, idle for wait seconds, then
 * measured over secs; one result line.
 */
static int run(int n, int failover, double wait, double secs, const char *dir)
{
	struct pairs P = { .n = n };
	struct rusage u0, u1;
	struct timespec idle = ts_of(secs), before = ts_of(wait);
	double t0, t1;
	int ndev, nthreads;

	setenv("NCCL_RAIL_FAILOVER", failover ? "1" : "0", 1);
	P.sc = calloc((size_t)n, sizeof(void *));
	P.rc = calloc((size_t)n, sizeof(void *));
	P.h = calloc((size_t)n, sizeof(*P.h));
	if (!P.sc || !P.rc || !P.h)
		return 1;
	check(rail_net_init(&P.ctx, 1, -1, NULL, NET_ABI), "init", -1);
	check(rail_net_devices(&ndev), "devices", -1);
	if (ndev < 2) {
		fprintf(stderr, "scale_bench: %d devices on the fake (conf in %s)\n", ndev, dir);
		return 1;
	}
	check(rail_net_listen(P.ctx, 0, P.h[0], &P.lc), "listen", -1);
	for (int i = 1; i < n; i++)
		memcpy(P.h[i], P.h[0], RAIL_HANDLE_SIZE);
	connect_all(&P);
	one_message_each(&P);
	while (nanosleep(&before, &before) && errno == EINTR)
		;
	nthreads = threads();
	getrusage(RUSAGE_SELF, &u0);
	t0 = now_s();
	while (nanosleep(&idle, &idle) && errno == EINTR)
		;
	t1 = now_s();
	getrusage(RUSAGE_SELF, &u1);
	printf("%8d %9d %7.1f %10.1f %8.2f %8d %10ld\n", failover, n, t1 - t0,
	       (cpu_s(&u1) - cpu_s(&u0)) * 1e3, 100 * (cpu_s(&u1) - cpu_s(&u0)) / (t1 - t0),
	       nthreads, (u1.ru_nvcsw - u0.ru_nvcsw) + (u1.ru_nivcsw - u0.ru_nivcsw));
	fflush(stdout);
	/* every sender first: a receiver closed before its sender fails the sender's last writes */
	for (int i = 0; i < n; i++)
		check(rail_net_close_send(P.sc[i]), "closeSend", i);
	for (int i = 0; i < n; i++)
		check(rail_net_close_recv(P.rc[i]), "closeRecv", i);
	check(rail_net_close_listen(P.lc), "closeListen", -1);
	check(rail_net_finalize(P.ctx), "finalize", -1);
	return 0;
}

static int parse_list(const char *s, int *v, int max)
{
	int n = 0;

	while (*s && n < max) {
		char *end;
		long x = strtol(s, &end, 10);

		if (end == s || x < 0 || x > MAX_N)
			return -1;
		v[n++] = (int)x;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
}

/* The fake provider: its library, a description of two RoCE NICs, a sysfs tree. */
static int fake_env(char *dir, size_t len)
{
	char lib[PATH_MAX], path[PATH_MAX + 32];
	const char *env = getenv("RAIL_FAKEVERBS_LIB");
	ssize_t n;
	FILE *f;

	if (env && env[0]) {
		snprintf(lib, sizeof(lib), "%s", env);
	} else {
		n = readlink("/proc/self/exe", path, sizeof(path) - 1);
		if (n <= 0)
			return -1;
		path[n] = '\0';
		*strrchr(path, '/') = '\0';
		snprintf(lib, sizeof(lib), "%.4000s/../fakeverbs/libfakeverbs.so", path);
	}
	if (access(lib, R_OK)) {
		fprintf(stderr, "scale_bench: %s cannot be read (make tests; or set "
			"RAIL_FAKEVERBS_LIB)\n", lib);
		return -1;
	}
	snprintf(dir, len, "/tmp/rail-scale-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/devices.conf", dir);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(conf, f);
	fclose(f);
	setenv("NCCL_IBVERBS_LIB", lib, 1);
	setenv("RAIL_FAKEVERBS_CONF", path, 1);
	setenv("RAIL_FAKEVERBS_SYSFS", dir, 1);
	setenv("NCCL_RAIL_SYSFS_ROOT", dir, 1);
	setenv("NCCL_RAIL_TRANSPORT", "ib", 1);
	if (!getenv("NCCL_SOCKET_IFNAME"))
		setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	return 0;
}

int main(int argc, char **argv)
{
	int ns[64] = { 1, 64, 256, 1024 }, nn = 4, fs[4] = { 1, 0 }, nf = 2, reps = 1, opt, bad = 0;
	double secs = 5, wait = 0;
	char dir[64], cmd[96];
	struct rlimit rl;

	while ((opt = getopt(argc, argv, "n:t:f:r:w:")) != -1) {
		if (opt == 'n')
			bad |= (nn = parse_list(optarg, ns, 64)) <= 0;
		else if (opt == 'f')
			bad |= (nf = parse_list(optarg, fs, 4)) <= 0;
		else if (opt == 't')
			bad |= (secs = atof(optarg)) <= 0;
		else if (opt == 'w')
			bad |= (wait = atof(optarg)) < 0;
		else if (opt == 'r')
			bad |= (reps = atoi(optarg)) <= 0;
		else
			bad = 1;
	}
	if (bad || optind != argc) {
		fprintf(stderr, "usage: scale_bench [-n N[,N...]] [-t SECONDS] [-f 1,0] [-r REPEATS] "
			"[-w SECONDS]\n");
		return 2;
	}
	if (fake_env(dir, sizeof(dir)))
		return 1;
	/* two sockets per pair, and the fake's descriptors */
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	printf("%8s %9s %7s %10s %8s %8s %10s\n", "failover", "pairs", "idle_s", "cpu_ms", "cpu_%",
	       "threads", "ctx_sw");
	fflush(stdout);
	for (int i = 0; i < nn * reps; i++) {	/* each size reps times, the -f values interleaved */
		for (int j = 0; j < nf; j++) {
			pid_t pid = fork();
			int st = 0;

			if (pid == 0)
				_exit(run(ns[i / reps], fs[j], wait, secs, dir));
			if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
				bad = 1;
		}
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "scale_bench: could not remove %s\n", dir);
	return bad;
}
