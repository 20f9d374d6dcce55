/*
 * nccl-net-rail: what N connections cost a process, over TCP (loopback,
 * NCCL_SOCKET_IFNAME=lo) and verbs (the fake provider, test/fakeverbs/).
 * One process opens N send+receive pairs through the core API (one
 * listener, N connects with WINDOW in flight, one 8-byte message each way
 * through every pair), leaves them idle, and reports:
 *   - descriptors (/proc/self/fd), threads (/proc/self/task) and resident
 *     memory (VmRSS) that init and listen added, then that the N pairs
 *     added, and per pair;
 *   - pinned memory: on verbs the bytes registered with the fake provider
 *     (fv_test_mem's FV_MEM_MR_BYTES, what a real NIC pins), on TCP VmLck;
 *   - setup time: all connects and accepts, then the first message through
 *     every pair; each connect's time from its first call to its send comm
 *     (median and 99th percentile);
 *   - over the idle window: the process's CPU time (getrusage: all threads)
 *     and context switches (each a thread going to sleep or being
 *     preempted: a wake-up that did work).
 * Each (transport, N, failover) runs in a child process of its own, so the
 * parameters are read fresh. Output: a Markdown table (docs/PERFORMANCE.md
 * reproduces it), then one key=value line per row (test/scale/check.sh
 * reads them; -k FILE writes them to FILE instead).
 *
 *   scale_bench [-T tcp,verbs] [-n N[,N...]] [-t SECONDS] [-w SECONDS] [-f 1[,0]]
 *               [-r REPEATS] [-k FILE]
 *
 * Defaults: -T tcp,verbs -n 1,16,128,512,1024 -t 5 -w 0 -f 1 -r 1: each N
 * REPEATS times, the transports and -f values taken in turn (a virtual
 * machine's CPU accounting of one thread's wake-up in a large process can
 * reach tens of milliseconds); the window starts -w seconds after the last
 * message (0: the cost of going idle included; 20, past the two sweeps of
 * the move thread that find the comms quiet, at most 15 s with
 * NCCL_RAIL_IB_STALL_TIMEOUT=10: the cost of staying idle).
 * RAIL_FAKEVERBS_LIB names the fake libibverbs (default: beside this
 * binary, ../fakeverbs/libfakeverbs.so). The soft RLIMIT_NOFILE is raised
 * to the hard limit: a TCP pair takes several descriptors at each end.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "handle.h"
#include "rail.h"
#include "../fakeverbs/fv_confs.h"

#define NET_ABI 12
#define MAX_N 4096
#define WINDOW 64	/* connects in flight at once (the listener keeps 128 pending) */

static const char conf[] = FV_CONF_ROCE_2DEV;

static const char *const transports[] = { "tcp", "verbs" };

struct pairs {
	int n, cdev;	/* the connects' device (the listener is on device 0) */
	void *ctx, *lc;
	void **sc, **rc;
	uint8_t (*h)[RAIL_HANDLE_SIZE];
	double *lat;	/* each connect: first call to its send comm, seconds */
};

/* What the process holds at one moment. */
struct snap {
	int fds, threads;
	long rss_kib, lck_kib;
	long long mr_bytes;	/* registered with the fake provider (0 when not loaded) */
};

/* One row: a transport, N pairs, failover on or off. */
struct row {
	int tcp, n, failover;
	struct snap s0, s1, s2;	/* before init, after init and listen, with the pairs set up */
	double connect_s, msg_s, p50_ms, p99_ms;
	double idle_s, cpu_ms;
	long ctx_sw;
	int threads_idle;	/* at the idle window's end (setup's helpers gone) */
};

/* What the parent tells every child. */
struct opts {
	double wait, secs;
	int show_failover;
	const char *dir, *kv;
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

/*
 * N connects (each with its own copy of the listener's handle, as NCCL's
 * peers have), N accepts; each connect's time from its first call to its
 * send comm in P->lat.
 */
static void connect_all(struct pairs *P)
{
	int made = 0, accepted = 0, next = 0, inflight = 0;
	double deadline = now_s() + 120;
	double *t0 = calloc((size_t)P->n, sizeof(double));

	if (!t0)
		exit(1);
	while (made < P->n || accepted < P->n) {
		while (next < P->n && inflight < WINDOW) {
			t0[next++] = now_s();
			inflight++;
		}
		for (int i = 0; i < next; i++) {
			if (P->sc[i])
				continue;
			check(rail_net_connect(P->ctx, P->cdev, -1, P->h[i], &P->sc[i]), "connect", i);
			if (P->sc[i]) {
				P->lat[i] = now_s() - t0[i];
				made++;
				inflight--;
			}
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
	free(t0);
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

/* Entries of a /proc directory, less "." and "..". */
static int count_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* VmRSS and VmLck of /proc/self/status, KiB. */
static void read_status(long *rss, long *lck)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];

	*rss = *lck = -1;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "VmRSS:", 6))
			*rss = strtol(line + 6, NULL, 10);
		else if (!strncmp(line, "VmLck:", 6))
			*lck = strtol(line + 6, NULL, 10);
	}
	fclose(f);
}

/* The bytes registered with the fake provider, if the plugin loaded it; else 0. */
static long long mr_bytes(void)
{
	const char *lib = getenv("NCCL_IBVERBS_LIB");
	void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
	long long (*mem)(int);
	long long b = 0;

	if (!h)
		return 0;
	*(void **)&mem = dlsym(h, "fv_test_mem");
	if (!mem) {
		fprintf(stderr, "scale_bench: %s lacks fv_test_mem: rebuild it (make tests)\n", lib);
		exit(1);
	}
	b = mem(1);	/* FV_MEM_MR_BYTES (test/fakeverbs/fv.h) */
	dlclose(h);
	return b;
}

static void take_snap(struct snap *s)
{
	s->fds = count_dir("/proc/self/fd") - 1;	/* less the directory's own */
	s->threads = count_dir("/proc/self/task");
	read_status(&s->rss_kib, &s->lck_kib);
	s->mr_bytes = mr_bytes();
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Nearest rank: the value at or below which a fraction p of v lies (v is sorted). */
static double percentile(double *v, int n, double p)
{
	int k = (int)(p * n + 0.999999) - 1;

	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static double cpu_s(const struct rusage *u)
{
	return (double)u->ru_utime.tv_sec + (double)u->ru_utime.tv_usec / 1e6 +
	       (double)u->ru_stime.tv_sec + (double)u->ru_stime.tv_usec / 1e6;
}

static void sleep_s(double secs)
{
	struct timespec ts = { (time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9) };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Init, listen and N pairs, one message through each; the snapshots and times in R. */
static void open_pairs(struct pairs *P, struct row *R, const char *dir)
{
	int ndev;
	double t0, t1, t2;

	P->n = R->n;
	P->cdev = R->tcp ? 0 : 1;	/* verbs: from the fake's second NIC to its first */
	P->sc = calloc((size_t)P->n, sizeof(void *));
	P->rc = calloc((size_t)P->n, sizeof(void *));
	P->h = calloc((size_t)P->n, sizeof(*P->h));
	P->lat = calloc((size_t)P->n, sizeof(double));
	if (!P->sc || !P->rc || !P->h || !P->lat)
		exit(1);
	take_snap(&R->s0);
	check(rail_net_init(&P->ctx, 1, -1, NULL, NET_ABI), "init", -1);
	check(rail_net_devices(&ndev), "devices", -1);
	if (ndev < (R->tcp ? 1 : 2)) {
		fprintf(stderr, "scale_bench: %d %s devices (fake's conf in %s)\n", ndev,
			transports[!R->tcp], dir);
		exit(1);
	}
	check(rail_net_listen(P->ctx, 0, P->h[0], &P->lc), "listen", -1);
	take_snap(&R->s1);
	for (int i = 1; i < P->n; i++)
		memcpy(P->h[i], P->h[0], RAIL_HANDLE_SIZE);
	t0 = now_s();
	connect_all(P);
	t1 = now_s();
	one_message_each(P);
	t2 = now_s();
	R->connect_s = t1 - t0;
	R->msg_s = t2 - t1;
	R->p50_ms = 1e3 * percentile(P->lat, P->n, 0.50);
	R->p99_ms = 1e3 * percentile(P->lat, P->n, 0.99);
}

/* Every sender first: a receiver closed before its sender fails the sender's last writes. */
static void close_pairs(struct pairs *P)
{
	for (int i = 0; i < P->n; i++)
		check(rail_net_close_send(P->sc[i]), "closeSend", i);
	for (int i = 0; i < P->n; i++)
		check(rail_net_close_recv(P->rc[i]), "closeRecv", i);
	check(rail_net_close_listen(P->lc), "closeListen", -1);
	check(rail_net_finalize(P->ctx), "finalize", -1);
	free(P->sc);
	free(P->rc);
	free(P->h);
	free(P->lat);
}

/* Pinned KiB: with the pairs (total) and what the pairs added. */
static double pinned_kib(const struct row *R, int added)
{
	if (R->tcp)
		return (double)(R->s2.lck_kib - (added ? R->s1.lck_kib : 0));
	return (double)(R->s2.mr_bytes - (added ? R->s1.mr_bytes : 0)) / 1024;
}

static void print_header(const struct opts *O)
{
	printf("| transport | pairs |%s fds: init + pairs (per pair) | threads idle (added; at setup) "
	       "| RSS KiB: init + pairs (per pair) | pinned KiB (per pair) "
	       "| setup s: connect + 1st message | connect p50 / p99 ms "
	       "| idle CPU ms in %g s (%% of a core) | context switches |\n",
	       O->show_failover ? " failover |" : "", O->secs);
	printf("|---|---:|%s---:|---:|---:|---:|---:|---:|---:|---:|\n",
	       O->show_failover ? "---:|" : "");
	fflush(stdout);
}

static void print_row(const struct row *R, const struct opts *O)
{
	int n = R->n;
	char fo[16] = "";

	if (O->show_failover)
		snprintf(fo, sizeof(fo), " %d |", R->failover);
	printf("| %s | %d |%s %d + %d (%.2f) | %d (%+d; %+d) | %ld + %ld (%.1f) | %.1f (%.2f) "
	       "| %.3f + %.3f | %.2f / %.2f | %.1f (%.3f) | %ld |\n",
	       transports[!R->tcp], n, fo, R->s1.fds - R->s0.fds, R->s2.fds - R->s1.fds,
	       (double)(R->s2.fds - R->s1.fds) / n, R->threads_idle, R->threads_idle - R->s0.threads,
	       R->s2.threads - R->s0.threads, R->s1.rss_kib - R->s0.rss_kib, R->s2.rss_kib - R->s1.rss_kib,
	       (double)(R->s2.rss_kib - R->s1.rss_kib) / n, pinned_kib(R, 0),
	       pinned_kib(R, 1) / n, R->connect_s, R->msg_s, R->p50_ms, R->p99_ms, R->cpu_ms,
	       100 * R->cpu_ms / 1e3 / R->idle_s, R->ctx_sw);
	fflush(stdout);
}

/* The row as key=value pairs, one line (test/scale/check.sh reads it). */
static void write_kv(const struct row *R, FILE *f)
{
	int n = R->n;

	fprintf(f, "transport=%s n=%d failover=%d fds_init=%d fds_added=%d fds_per_pair=%.3f "
		"threads=%d threads_added=%d threads_setup_added=%d rss_init_kib=%ld rss_added_kib=%ld "
		"rss_kib_per_pair=%.2f pinned_kib=%.1f pinned_kib_per_pair=%.3f connect_s=%.4f "
		"msg_s=%.4f setup_s=%.4f connect_p50_ms=%.3f connect_p99_ms=%.3f idle_s=%.2f "
		"cpu_ms=%.2f cpu_pct=%.4f ctx_sw=%ld\n",
		transports[!R->tcp], n, R->failover, R->s1.fds - R->s0.fds, R->s2.fds - R->s1.fds,
		(double)(R->s2.fds - R->s1.fds) / n, R->threads_idle, R->threads_idle - R->s0.threads,
		R->s2.threads - R->s0.threads, R->s1.rss_kib - R->s0.rss_kib, R->s2.rss_kib - R->s1.rss_kib,
		(double)(R->s2.rss_kib - R->s1.rss_kib) / n, pinned_kib(R, 0),
		pinned_kib(R, 1) / n, R->connect_s, R->msg_s, R->connect_s + R->msg_s, R->p50_ms,
		R->p99_ms, R->idle_s, R->cpu_ms, 100 * R->cpu_ms / 1e3 / R->idle_s, R->ctx_sw);
}

/*
 * The child: N pairs of one transport with failover on or off, idle for
 * wait seconds, then measured over secs; one table row and one key=value
 * line.
 */
static int run(int tcp, int n, int failover, const struct opts *O)
{
	struct row R = { .tcp = tcp, .n = n, .failover = failover };
	struct pairs P = { 0 };
	struct rusage u0, u1;
	double t0, t1;
	FILE *kv;

	setenv("NCCL_RAIL_FAILOVER", failover ? "1" : "0", 1);
	setenv("NCCL_RAIL_TRANSPORT", tcp ? "tcp" : "ib", 1);
	open_pairs(&P, &R, O->dir);
	sleep_s(O->wait);
	take_snap(&R.s2);
	getrusage(RUSAGE_SELF, &u0);
	t0 = now_s();
	sleep_s(O->secs);
	t1 = now_s();
	getrusage(RUSAGE_SELF, &u1);
	R.idle_s = t1 - t0;
	R.cpu_ms = (cpu_s(&u1) - cpu_s(&u0)) * 1e3;
	R.ctx_sw = (u1.ru_nvcsw - u0.ru_nvcsw) + (u1.ru_nivcsw - u0.ru_nivcsw);
	R.threads_idle = count_dir("/proc/self/task");
	print_row(&R, O);
	kv = fopen(O->kv, "a");
	if (!kv) {
		fprintf(stderr, "scale_bench: cannot open %s: %s\n", O->kv, strerror(errno));
		return 1;
	}
	write_kv(&R, kv);
	fclose(kv);
	close_pairs(&P);
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

/* -T tcp,verbs: 1 for TCP, 0 for verbs ("ib" too), in v. */
static int parse_transports(const char *s, int *v, int max)
{
	int n = 0;

	while (*s && n < max) {
		size_t len = strcspn(s, ",");

		if (len == 3 && !strncmp(s, "tcp", 3))
			v[n++] = 1;
		else if ((len == 5 && !strncmp(s, "verbs", 5)) || (len == 2 && !strncmp(s, "ib", 2)))
			v[n++] = 0;
		else
			return -1;
		s += len + (s[len] == ',');
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
	if (!getenv("NCCL_SOCKET_IFNAME"))
		setenv("NCCL_SOCKET_IFNAME", "lo", 1);
	return 0;
}

/* Each N reps times; the transports and failover settings in turn. Nonzero if a child failed. */
static int run_all(const int *ts, int nt, const int *ns, int nn, const int *fs, int nf, int reps,
		   const struct opts *O)
{
	int bad = 0;

	for (int i = 0; i < nn * reps; i++) {
		for (int t = 0; t < nt; t++) {
			for (int j = 0; j < nf; j++) {
				pid_t pid = fork();
				int st = 0;

				if (pid == 0)
					_exit(run(ts[t], ns[i / reps], fs[j], O));
				if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) ||
				    WEXITSTATUS(st))
					bad = 1;
			}
		}
	}
	return bad;
}

/* The key=value lines, after the table. */
static void print_kv(const char *path)
{
	FILE *f = fopen(path, "r");
	char line[1024];

	if (!f)
		return;
	printf("\n");
	while (fgets(line, sizeof(line), f))
		fputs(line, stdout);
	fclose(f);
}

static void usage(void)
{
	fprintf(stderr, "usage: scale_bench [-T tcp,verbs] [-n N[,N...]] [-t SECONDS] "
		"[-w SECONDS] [-f 1[,0]] [-r REPEATS] [-k FILE]\n");
}

int main(int argc, char **argv)
{
	int ns[64] = { 1, 16, 128, 512, 1024 }, nn = 5, fs[4] = { 1 }, nf = 1, ts[4] = { 1, 0 };
	int nt = 2, reps = 1, opt, bad = 0;
	struct opts O = { .wait = 0, .secs = 5 };
	char dir[64], cmd[96], kv[96];
	struct rlimit rl;

	while ((opt = getopt(argc, argv, "T:n:t:f:r:w:k:")) != -1) {
		if (opt == 'T')
			bad |= (nt = parse_transports(optarg, ts, 4)) <= 0;
		else if (opt == 'n')
			bad |= (nn = parse_list(optarg, ns, 64)) <= 0 || !ns[0];
		else if (opt == 'f')
			bad |= (nf = parse_list(optarg, fs, 4)) <= 0;
		else if (opt == 't')
			bad |= (O.secs = atof(optarg)) <= 0;
		else if (opt == 'w')
			bad |= (O.wait = atof(optarg)) < 0;
		else if (opt == 'r')
			bad |= (reps = atoi(optarg)) <= 0;
		else if (opt == 'k')
			O.kv = optarg;
		else
			bad = 1;
	}
	for (int i = 0; i < nn && !bad; i++)
		bad |= ns[i] == 0;
	if (bad || optind != argc) {
		usage();
		return 2;
	}
	if (fake_env(dir, sizeof(dir)))
		return 1;
	snprintf(kv, sizeof(kv), "%s/kv", dir);
	if (O.kv && unlink(O.kv) && errno != ENOENT)
		fprintf(stderr, "scale_bench: cannot replace %s: %s\n", O.kv, strerror(errno));
	O.dir = dir;
	O.show_failover = nf > 1;
	if (!O.kv)
		O.kv = kv;
	/* several sockets per TCP pair at each end, and the fake's descriptors */
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	print_header(&O);
	bad = run_all(ts, nt, ns, nn, fs, nf, reps, &O);
	if (O.kv == kv)
		print_kv(kv);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "scale_bench: could not remove %s\n", dir);
	return bad;
}
