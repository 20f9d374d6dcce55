/*
 * rail-conformance: drives an NCCL net plugin through its exported
 * ncclNetPlugin_v6..v12 tables from two processes, as NCCL would.
 *
 *   rail-conformance --plugin PATH [--abi N|all] [--dev A] [--peer-dev B]
 *                    [--fuse LIST] [--max-size SIZE] [--scenario NAME[,NAME]]
 *                    [--timeout SEC] [--full] [--list] [-v]
 *
 * For every (scenario, ABI) the supervisor forks role A and role B; each
 * dlopens the plugin itself (two "nodes") and they talk over a control
 * socketpair. The supervisor never loads the plugin: it collects the
 * roles' reports, enforces the timeout (a hang is a FAIL: both roles are
 * killed) and prints PASS/FAIL/SKIP lines, then "N passed, N failed, N
 * skipped". Exit status 0 only if nothing failed.
 *
 * Across two hosts, --ctl-listen [ADDR:]PORT runs only role A here and
 * --ctl-connect HOST:PORT only role B; the roles' control channel is then a
 * TCP connection per (scenario, ABI) (twohost.c), and each host prints the
 * verdicts of its own role.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conf.h"

const struct rail_conf_scenario rail_conf_scenarios[] = {
	{ "properties", "devices() > 0 and sane getProperties for every device",
	  rail_conf_properties, 0, 0, 6, NULL },
	{ "nonblocking-connect", "listen/connect/accept never block, with either side late",
	  rail_conf_nonblocking_connect, 0, 0, 6, NULL },
	{ "sizes", "0 B .. 1 GiB (capped by --max-size), every byte and the guard checked",
	  rail_conf_sizes, 0, 0, 6, NULL },
	{ "inflight-32", "32 receives and 32 sends in flight per comm, mixed sizes",
	  rail_conf_inflight32, 0, 0, 6, NULL },
	{ "grouped-recv", "irecv with n = maxRecvs, tags sent shuffled; 32 groups in flight",
	  rail_conf_grouped_recv, 0, 0, 6, NULL },
	{ "recv-larger", "receive buffers larger than the message: real size, tail untouched",
	  rail_conf_recv_larger, 0, 0, 6, NULL },
	{ "send-larger", "a send larger than the receive is an error with a WARN, no hang",
	  rail_conf_send_larger, 1, 0, 6, NULL },
	{ "many-comms", "64 comms (64 listens, then 1 listen + 64 accepts), interleaved traffic",
	  rail_conf_many_comms, 0, 0, 6, NULL },
	{ "bidirectional", "both processes send and receive large messages at once",
	  rail_conf_bidirectional, 0, 0, 6, NULL },
	{ "close-inflight", "close comms with requests in flight; then a new connection works",
	  rail_conf_close_inflight, 1, 0, 6, NULL },
	{ "listen-many", "one listen comm accepting 8 connections, each carrying traffic",
	  rail_conf_listen_many, 0, 0, 6, NULL },
	{ "regmr-thread", "regMr/deregMr in a thread while isend/irecv/test run on the comm",
	  rail_conf_regmr_thread, 0, 0, 6, NULL },
	{ "peer-dies", "the sender is SIGKILLed mid-stream: the receiver gets an error",
	  rail_conf_peer_dies, 1, 0, 6, NULL },
	{ "peer-stops", "the sender is SIGSTOPped mid-message: the receive fails within the bound "
	  "(an idle receive does not)", rail_conf_peer_stops, 1, 0, 6,
	  "NCCL_RAIL_STALL_TIMEOUT=2" },
	{ "bad-handle", "corrupt and stale handles are refused with an error, never a hang",
	  rail_conf_bad_handle, 1, 0, 6, NULL },
	{ "reload", "finalize + dlclose leaves no thread or fd behind; reload works (v11+)",
	  rail_conf_reload, 0, 1, 11, NULL },
	{ "profiler", "v10+: NCCL profiler events, start/stop paired, under the right parent "
	  "handle, lengths summing to the message; none without a parent; a failing callback "
	  "breaks nothing", rail_conf_profiler, 1, 0, 10, NULL },
	{ "iflush", "iflush on received host memory succeeds (NULL request = nothing to do)",
	  rail_conf_iflush, 0, 0, 6, NULL },
	{ "misuse", "calls NCCL never makes (NULL props, ...) fail with a WARN, never crash",
	  rail_conf_misuse, 1, 0, 6, NULL },
	{ "misuse-closed", "handles used after they died (close twice, test/deregMr after close, "
	  "finalize twice) fail with a WARN, never read freed memory", rail_conf_misuse_closed,
	  1, 0, 6, NULL },
	{ "random-handle", "random handles are refused with a WARN; stray bytes after the handle "
	  "are never trusted", rail_conf_random_handle, 1, 0, 6, NULL },
	{ "failover-loop", "B streams mixed sizes to A for RAIL_CONF_FAILOVER_SECONDS (and until "
	  "the file RAIL_CONF_FAILOVER_UNTIL names exists) while a harness fails a link: no "
	  "request fails, every byte arrives (SKIP when unset)",
	  rail_conf_failover_loop, 1, 0, 6, NULL },
	{ "finalize-open", "the last finalize with comms open, then dlclose: threads stopped, or "
	  "a WARN and the library kept loaded (v11+)", rail_conf_finalize_open, 1, 1, 11, NULL },
};
const int rail_conf_nscenarios = sizeof(rail_conf_scenarios) / sizeof(rail_conf_scenarios[0]);

/* Two hosts: role A's listening socket for the control connections. */
static int ctl_lfd = -1;

/* ---- the role process ---- */

static void open_fused(struct rail_conf *cx, int ndev)
{
	const struct rail_conf_opts *o = cx->opts;
	struct rail_conf_props props;
	int d = -1, n2 = 0;

	if (cx->abi < 9 || !cx->net.has_make_vdevice) {
		rail_conf_report(cx, "SKIP", cx->abi < 9 ? "--fuse needs makeVDevice (ABI v9+)"
						      : "the plugin's makeVDevice is NULL (no NIC "
							"fusion)");
		exit(0);
	}
	RAIL_CONF_CHECK(cx, o->nfuse <= rail_conf_abi_max_vdevs(cx->abi),
			"--fuse lists %d devices, ABI v%d allows %d", o->nfuse, cx->abi,
			rail_conf_abi_max_vdevs(cx->abi));
	RAIL_CONF_CALL(cx, cx->net.make_vdevice(&d, o->nfuse, o->fuse), "makeVDevice");
	RAIL_CONF_CALL(cx, cx->net.devices(&n2), "devices() after makeVDevice");
	RAIL_CONF_CHECK(cx, n2 == ndev + 1 && d == ndev,
			"after makeVDevice: devices() is %d (was %d) and the new device is %d; "
			"expected %d and %d",
			n2, ndev, d, ndev + 1, ndev);
	RAIL_CONF_CALL(cx, cx->net.get_props(d, &props), "getProperties(virtual device)");
	RAIL_CONF_CHECK(cx, props.vndevs == o->nfuse, "virtual device %d: vProps.ndevs %d, fused %d",
			d, props.vndevs, o->nfuse);
	for (int i = 0; i < o->nfuse; i++)
		RAIL_CONF_CHECK(cx, props.vdevs[i] == o->fuse[i],
				"virtual device %d: vProps.devs[%d] = %d, fused %d", d, i,
				props.vdevs[i], o->fuse[i]);
	cx->dev = d;
}

/* dlopen + init + devices, as NCCL does for every new communicator. */
static void open_plugin(struct rail_conf *cx)
{
	char why[256];
	int ndev = 0;

	rail_conf_stage(cx, "dlopen %s", cx->opts->plugin);
	cx->lib = dlopen(cx->opts->plugin, RTLD_NOW | RTLD_LOCAL);
	RAIL_CONF_CHECK(cx, cx->lib, "dlopen(%s): %s", cx->opts->plugin, dlerror());
	if (rail_conf_bind(cx->lib, cx->abi, &cx->net, why, sizeof(why)))
		rail_conf_fail(cx, "%s", why);
	rail_conf_stage(cx, "init");
	RAIL_CONF_CALL(cx, cx->net.init(&cx->net, rail_conf_logger), "init");
	RAIL_CONF_CALL(cx, cx->net.devices(&ndev), "devices");
	RAIL_CONF_CHECK(cx, ndev > 0, "devices() reported %d devices", ndev);
	RAIL_CONF_CHECK(cx, cx->dev >= 0 && cx->dev < ndev,
			"device %d requested (--dev/--peer-dev) but the plugin has %d", cx->dev, ndev);
	if (cx->opts->nfuse)
		open_fused(cx, ndev);
}

static RAIL_CONF_NORETURN void role_main(const struct rail_conf_opts *o, int sidx, int abi,
					 int role, int ctl, int sup)
{
	const struct rail_conf_scenario *s = &rail_conf_scenarios[sidx];
	struct rail_conf cx;
	uint64_t budget = (uint64_t)o->timeout * 1000000000ull;
	int rc;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGPIPE, SIG_IGN);
	memset(&cx, 0, sizeof(cx));
	cx.opts = o;
	cx.scn = s;
	cx.scn_id = sidx + 1;
	cx.role = role;
	cx.abi = abi;
	cx.full = o->full || abi == 6 || abi == 12;
	cx.ctl = ctl;
	cx.ctl_stream = o->host_role >= 0;
	cx.sup = sup;
	cx.dev = role == RAIL_CONF_ROLE_A ? o->dev_a : o->dev_b;
	cx.start_ns = rail_conf_now_ns();
	/* Leave the supervisor time to hear the reason before it kills. */
	cx.deadline_ns = cx.start_ns + budget - (budget > 20000000000ull ? 5000000000ull : budget / 4);
	cx.call_limit_ns = 5000000000ull;
	rail_conf_log_setup(role, abi);
	if (s->env)
		putenv((char *)s->env);
	if (!s->own_load)
		open_plugin(&cx);
	rc = s->run(&cx);
	if (rc == 0 && !s->allow_warn && rail_conf_warn_count() > 0) {
		char first[512];

		rail_conf_warn_first(first, sizeof(first));
		rail_conf_fail(&cx, "the plugin printed %d WARN line(s) in a scenario without errors; "
			       "first: %s", rail_conf_warn_count(), first);
	}
	if (!s->own_load && cx.net.has_finalize) {
		rail_conf_stage(&cx, "finalize");
		RAIL_CONF_CALL(&cx, cx.net.finalize(cx.net.ctx), "finalize");
	}
	rail_conf_report(&cx, rc == 0 ? "PASS" : "SKIP", rc == 0 ? "" : rail_conf_skip_text());
	fflush(stderr);
	exit(0);
}

/* ---- the supervisor ---- */

struct role_state {
	pid_t pid;
	int fd;
	int eof;
	int reaped;
	int status;
	int killme;
	uint64_t t_fail;	/* when the supervisor saw it fail or die (0: not) */
	uint64_t exit_by;	/* after its verdict, it must exit by then */
	int hung_exit;
	char buf[8192];
	size_t len;
	char verdict[8];
	char result[3072];
	char stage[512];
	char notes[2048];
};

static void role_line(struct role_state *r, char *line)
{
	if (!strncmp(line, "STAGE ", 6)) {
		snprintf(r->stage, sizeof(r->stage), "%s", line + 6);
	} else if (!strncmp(line, "NOTE ", 5)) {
		size_t n = strlen(r->notes);

		snprintf(r->notes + n, sizeof(r->notes) - n, "%s%s", n ? "; " : "", line + 5);
	} else if (!strncmp(line, "KILLME", 6)) {
		r->killme = 1;
	} else if (!strncmp(line, "RESULT ", 7) && !r->verdict[0]) {
		char *text = strchr(line + 7, ' ');

		snprintf(r->verdict, sizeof(r->verdict), "%.4s", line + 7);
		if (!strcmp(r->verdict, "FAIL"))
			r->t_fail = rail_conf_now_ns();
		else
			r->exit_by = rail_conf_now_ns() + 15000000000ull;
		snprintf(r->result, sizeof(r->result), "%s", text ? text + 1 : "");
	}
}

static void role_read(struct role_state *r)
{
	ssize_t n = read(r->fd, r->buf + r->len, sizeof(r->buf) - 1 - r->len);
	char *nl;

	if (n <= 0) {
		if (n == 0 || (errno != EINTR && errno != EAGAIN))
			r->eof = 1;
		return;
	}
	r->len += (size_t)n;
	r->buf[r->len] = 0;
	while ((nl = strchr(r->buf, '\n')) != NULL) {
		*nl = 0;
		role_line(r, r->buf);
		r->len -= (size_t)(nl + 1 - r->buf);
		memmove(r->buf, nl + 1, r->len + 1);
	}
	if (r->len == sizeof(r->buf) - 1)
		r->len = 0; /* an absurd line: drop it */
}

static void role_reap(struct role_state *r, int block)
{
	if (r->reaped || r->pid <= 0)
		return;
	if (waitpid(r->pid, &r->status, block ? 0 : WNOHANG) != r->pid)
		return;
	r->reaped = 1;
	if (!r->t_fail && (!r->verdict[0] || (WIFSIGNALED(r->status) && !r->killme)))
		r->t_fail = rail_conf_now_ns();
}

/* One /proc file of a task, on one line ("?" when unreadable: /proc/PID/stack needs root). */
static void proc_read(pid_t pid, const char *tid, const char *what, char *out, size_t len)
{
	char path[96];
	size_t n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%s/%s", (int)pid, tid, what);
	f = fopen(path, "r");
	if (f) {
		n = fread(out, 1, len - 1, f);
		fclose(f);
	}
	out[n] = 0;
	for (size_t i = 0; i < n; i++)
		out[i] = out[i] == '\n' ? ' ' : out[i];
	if (!n)
		snprintf(out, len, "?");
}

/* A hung role: where each of its threads waits, to stderr before it is killed. */
static void role_dump(const struct role_state *r, char role)
{
	char path[64], comm[64], wchan[128], stack[2048];
	struct dirent *d;
	DIR *dir;

	if (r->reaped || r->pid <= 0)
		return;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)r->pid);
	dir = opendir(path);
	if (!dir)
		return;
	while ((d = readdir(dir))) {
		if (d->d_name[0] == '.')
			continue;
		proc_read(r->pid, d->d_name, "comm", comm, sizeof(comm));
		proc_read(r->pid, d->d_name, "wchan", wchan, sizeof(wchan));
		proc_read(r->pid, d->d_name, "stack", stack, sizeof(stack));
		fprintf(stderr, "# hung role %c at '%s': pid %d task %s (%s) waits in %s; kernel "
			"stack: %s\n", role, r->stage, (int)r->pid, d->d_name, comm, wchan, stack);
	}
	closedir(dir);
}

static void role_kill(struct role_state *r)
{
	if (!r->reaped && r->pid > 0)
		kill(r->pid, SIGKILL);
}

/* Why a role did not pass, or NULL if it did. */
static const char *role_problem(struct role_state *r, char *buf, size_t len)
{
	const char *stage = r->stage[0] ? r->stage : "start";

	if (!strcmp(r->verdict, "FAIL")) {
		snprintf(buf, len, "%s", r->result);
		return buf;
	}
	if (r->hung_exit) {
		snprintf(buf, len, "reported %s, then hung in exit() for 15 s (killed): plugin "
			 "threads or destructors block process exit", r->verdict);
		return buf;
	}
	if (!r->verdict[0]) {
		if (WIFSIGNALED(r->status))
			snprintf(buf, len, "died of signal %d (%s) at stage '%s'", WTERMSIG(r->status),
				 strsignal(WTERMSIG(r->status)), stage);
		else
			snprintf(buf, len, "exited with status %d without a verdict at stage '%s'",
				 WEXITSTATUS(r->status), stage);
		return buf;
	}
	if (WIFSIGNALED(r->status) && !(r->killme && WTERMSIG(r->status) == SIGKILL)) {
		snprintf(buf, len, "reported %s, then died of signal %d (%s) while exiting",
			 r->verdict, WTERMSIG(r->status), strsignal(WTERMSIG(r->status)));
		return buf;
	}
	if (WIFEXITED(r->status) && WEXITSTATUS(r->status) != 0) {
		snprintf(buf, len, "reported %s, then exited with status %d (a sanitizer report "
			 "at exit? see stderr)", r->verdict, WEXITSTATUS(r->status));
		return buf;
	}
	return NULL;
}

static pid_t spawn(const struct rail_conf_opts *o, int sidx, int abi, int role, int ctl,
		   int sup, const int *close_fds, int nclose)
{
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid == 0) {
		for (int i = 0; i < nclose; i++)
			close(close_fds[i]);
		role_main(o, sidx, abi, role, ctl, sup);
	}
	return pid;
}

static void supervise(const struct rail_conf_opts *o, struct role_state *r, int *timed_out)
{
	uint64_t deadline = rail_conf_now_ns() + (uint64_t)o->timeout * 1000000000ull;
	uint64_t grace = 0;

	*timed_out = 0;
	while (!r[0].eof || !r[1].eof) {
		struct pollfd pfd[2];
		uint64_t now = rail_conf_now_ns();
		int np = 0, idx[2];

		for (int i = 0; i < 2; i++) {
			if (!r[i].eof) {
				pfd[np].fd = r[i].fd;
				pfd[np].events = POLLIN;
				idx[np++] = i;
			}
		}
		if (now >= deadline || (grace && now >= grace)) {
			*timed_out = now >= deadline;
			if (*timed_out) {
				role_dump(&r[0], 'A');
				role_dump(&r[1], 'B');
			}
			role_kill(&r[0]);
			role_kill(&r[1]);
			break;
		}
		if (poll(pfd, (nfds_t)np, 100) > 0) {
			for (int i = 0; i < np; i++) {
				if (pfd[i].revents)
					role_read(&r[idx[i]]);
			}
		}
		for (int i = 0; i < 2; i++) {
			role_reap(&r[i], 0);
			if (r[i].exit_by && !r[i].reaped && !r[i].killme &&
			    rail_conf_now_ns() > r[i].exit_by) {
				r[i].hung_exit = 1;
				role_kill(&r[i]);
			}
			/* One role failed or died: the other gets 5 s to finish, then dies. */
			if (!grace && (!strcmp(r[i].verdict, "FAIL") || (r[i].reaped && !r[i].killme &&
									   !r[i].verdict[0])))
				grace = rail_conf_now_ns() + 5000000000ull;
		}
	}
	for (int i = 0; i < 2; i++) {
		if (r[i].fd < 0)
			continue; /* the peer host's role (two hosts) */
		/* The pipe closes at exit: it must be gone in a moment. */
		for (int k = 0; k < 50 && !r[i].reaped; k++) {
			role_reap(&r[i], 0);
			if (!r[i].reaped)
				rail_conf_sleep_ms(100);
		}
		role_kill(&r[i]);
		role_reap(&r[i], 1);
		/* Dead now: read what it wrote before dying, up to EOF. */
		while (!r[i].eof) {
			struct pollfd pfd = { .fd = r[i].fd, .events = POLLIN };

			if (poll(&pfd, 1, 100) <= 0)
				break;
			role_read(&r[i]);
		}
		close(r[i].fd);
	}
}

/*
 * Two hosts: the role of this host on a TCP control connection; the other
 * role's slot stands for the peer host (it passed, as far as this host can
 * tell: the peer host prints its own verdict). 0, or 1 with line set.
 */
static int start_one_2h(const struct rail_conf_opts *o, int sidx, int abi, struct role_state *r,
			char *line, size_t len)
{
	const char *name = rail_conf_scenarios[sidx].name;
	int me = o->host_role, p[2], fd;
	char why[512];

	fd = rail_conf_2h_pair(o, ctl_lfd, name, abi, why, sizeof(why));
	if (fd < 0) {
		snprintf(line, len, "FAIL %s v%d: %s", name, abi, why);
		return 1;
	}
	if (pipe(p)) {
		snprintf(line, len, "FAIL %s v%d: pipe: %s", name, abi, strerror(errno));
		close(fd);
		return 1;
	}
	int close_fds[] = { p[0], ctl_lfd };

	r[me].pid = spawn(o, sidx, abi, me, fd, p[1], close_fds, ctl_lfd >= 0 ? 2 : 1);
	close(fd);
	close(p[1]);
	r[me].fd = p[0];
	r[!me].eof = r[!me].reaped = 1;
	r[!me].fd = -1;
	snprintf(r[!me].verdict, sizeof(r[!me].verdict), "PASS");
	return 0;
}

/* 0 pass, 1 fail, 2 skip; line gets the verdict text. */
static int run_one(const struct rail_conf_opts *o, int sidx, int abi, char *line, size_t len)
{
	const char *name = rail_conf_scenarios[sidx].name;
	struct role_state r[2];
	int sv[2], pa[2], pb[2], timed_out;
	char why[2][3200];
	const char *pr[2];

	memset(r, 0, sizeof(r));
	if (o->host_role >= 0) {
		if (start_one_2h(o, sidx, abi, r, line, len))
			return 1;
	} else if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) || pipe(pa) || pipe(pb)) {
		snprintf(line, len, "FAIL %s v%d: socketpair/pipe: %s", name, abi, strerror(errno));
		return 1;
	} else {
		int close_a[] = { sv[1], pa[0], pb[0], pb[1] };
		int close_b[] = { sv[0], pa[0], pa[1], pb[0] };

		r[0].pid = spawn(o, sidx, abi, RAIL_CONF_ROLE_A, sv[0], pa[1], close_a, 4);
		r[1].pid = spawn(o, sidx, abi, RAIL_CONF_ROLE_B, sv[1], pb[1], close_b, 4);
		close(sv[0]);
		close(sv[1]);
		close(pa[1]);
		close(pb[1]);
		r[0].fd = pa[0];
		r[1].fd = pb[0];
	}
	supervise(o, r, &timed_out);
	if (timed_out) {
		snprintf(line, len, "FAIL %s v%d: timeout after %d s (A at '%s', B at '%s')", name, abi,
			 o->timeout, r[0].stage, r[1].stage);
		return 1;
	}
	pr[0] = role_problem(&r[0], why[0], sizeof(why[0]));
	pr[1] = role_problem(&r[1], why[1], sizeof(why[1]));
	if (o->verbose || pr[0] || pr[1]) {
		for (int i = 0; i < 2; i++) {
			if (r[i].notes[0])
				printf("#   %s v%d role %c: %s\n", name, abi, 'A' + i, r[i].notes);
		}
	}
	if (pr[0] || pr[1]) {
		/* The role that failed first is the cause; the other often just lost its peer. */
		uint64_t t0 = r[0].t_fail ? r[0].t_fail : UINT64_MAX;
		uint64_t t1 = r[1].t_fail ? r[1].t_fail : UINT64_MAX;
		int first = pr[0] && (!pr[1] || t0 <= t1) ? 0 : 1;

		if (pr[!first])
			snprintf(line, len, "FAIL %s v%d: %c: %s | %c: %s", name, abi, 'A' + first,
				 pr[first], 'A' + !first, pr[!first]);
		else
			snprintf(line, len, "FAIL %s v%d: %c: %s", name, abi, 'A' + first, pr[first]);
		return 1;
	}
	if (!strcmp(r[0].verdict, "SKIP") || !strcmp(r[1].verdict, "SKIP")) {
		snprintf(line, len, "SKIP %s v%d: %s", name, abi,
			 !strcmp(r[0].verdict, "SKIP") ? r[0].result : r[1].result);
		return 2;
	}
	snprintf(line, len, "PASS %s v%d", name, abi);
	/* Role A's notes; on role B's host (two hosts), B's. */
	int nr = o->host_role == RAIL_CONF_ROLE_B;

	if (r[nr].notes[0] && !o->verbose)
		snprintf(line + strlen(line), len - strlen(line), " (%s)", r[nr].notes);
	return 0;
}

/* In a child, so the supervisor never has the plugin loaded: which tables exist. */
static int probe_abis(const char *path, unsigned *mask, char *err, size_t len)
{
	int p[2];
	pid_t pid;
	char buf[600] = "";
	ssize_t n;
	int st;

	if (pipe(p))
		return -1;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		unsigned m = 0;

		close(p[0]);
		if (!lib) {
			snprintf(buf, sizeof(buf), "E%s", dlerror());
		} else {
			for (int v = RAIL_CONF_ABI_MIN; v <= RAIL_CONF_ABI_MAX; v++) {
				char sym[32];

				snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
				if (dlsym(lib, sym))
					m |= 1u << v;
			}
			snprintf(buf, sizeof(buf), "M%u", m);
		}
		if (write(p[1], buf, strlen(buf)) < 0)
			_exit(2);
		_exit(0);
	}
	close(p[1]);
	n = read(p[0], buf, sizeof(buf) - 1);
	close(p[0]);
	waitpid(pid, &st, 0);
	buf[n > 0 ? n : 0] = 0;
	if (buf[0] == 'M') {
		*mask = (unsigned)strtoul(buf + 1, NULL, 10);
		return 0;
	}
	snprintf(err, len, "%s", buf[0] == 'E' ? buf + 1 : "the probe process died");
	return -1;
}

/* ---- options ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: rail-conformance --plugin PATH [options]\n"
		"  --plugin PATH     the net plugin .so (dlopen'ed as NCCL does)\n"
		"  --abi N|all       one ABI version (6..12) or all the plugin exports (default)\n"
		"  --dev A           device index of role A (listener/receiver), default 0\n"
		"  --peer-dev B      device index of role B (connector/sender), default 0\n"
		"  --fuse LIST       makeVDevice over these physical devices (e.g. 0,1) and use it\n"
		"  --max-size SIZE   largest message (k/M/G suffixes), default 1G\n"
		"  --scenario NAMES  run only these (comma list); --list shows them\n"
		"  --timeout SEC     per scenario and ABI, default 120; a hang is a FAIL\n"
		"  --full            heavy settings on every ABI (default: v6 and v12 only)\n"
		"  -v                print notes and per-scenario times\n"
		"  --inject FAULT    make the plugin look broken in one way (suite self-check):\n");
	rail_conf_inject_list(f);
	fprintf(f, "  --self-test       run every scenario with the faults it must catch; each must "
		"FAIL\n"
		"two hosts (each runs one role; the same other options on both):\n"
		"  --ctl-listen [ADDR:]PORT   run role A here; the peer host connects here\n"
		"  --ctl-connect HOST:PORT    run role B here, connecting to role A's host\n"
		"  --doomed A|B      peer-dies: the role whose host the harness kills or unplugs\n"
		"  --event-file PATH peer-dies: append 'READY' once traffic flows, 'ERROR ...'\n"
		"                    when a role sees the error (for a harness measuring it)\n");
}

static int parse_list(const char *s, int *out, int max)
{
	int n = 0;
	char *end;

	while (*s) {
		long v = strtol(s, &end, 10);

		if (end == s || v < 0 || n >= max)
			return -1;
		out[n++] = (int)v;
		s = end;
		if (*s == ',')
			s++;
		else if (*s)
			return -1;
	}
	return n;
}

static int find_scenario(const char *name, size_t len)
{
	for (int i = 0; i < rail_conf_nscenarios; i++) {
		if (strlen(rail_conf_scenarios[i].name) == len &&
		    !strncmp(rail_conf_scenarios[i].name, name, len))
			return i;
	}
	return -1;
}

/* Which scenarios to run: a bitmask over the table; -1 on a bad name. */
static long long pick_scenarios(const char *list)
{
	long long mask = 0;

	if (!list)
		return (1ll << rail_conf_nscenarios) - 1;
	while (*list) {
		size_t len = strcspn(list, ",");
		int i = find_scenario(list, len);

		if (i < 0) {
			fprintf(stderr, "rail-conformance: unknown scenario '%.*s' (see --list)\n",
				(int)len, list);
			return -1;
		}
		mask |= 1ll << i;
		list += len;
		if (*list == ',')
			list++;
	}
	return mask;
}

static int parse_opts(int argc, char **argv, struct rail_conf_opts *o, int *list)
{
	static const struct option lo[] = {
		{ "plugin", required_argument, 0, 'p' }, { "abi", required_argument, 0, 'a' },
		{ "dev", required_argument, 0, 'd' },    { "peer-dev", required_argument, 0, 'D' },
		{ "fuse", required_argument, 0, 'f' },   { "max-size", required_argument, 0, 'm' },
		{ "scenario", required_argument, 0, 's' }, { "timeout", required_argument, 0, 't' },
		{ "full", no_argument, 0, 'F' },         { "list", no_argument, 0, 'l' },
		{ "help", no_argument, 0, 'h' },         { "inject", required_argument, 0, 'i' },
		{ "self-test", no_argument, 0, 'S' },    { "ctl-listen", required_argument, 0, 'L' },
		{ "ctl-connect", required_argument, 0, 'C' }, { "doomed", required_argument, 0, 'K' },
		{ "event-file", required_argument, 0, 'E' }, { 0, 0, 0, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	o->max_size = RAIL_CONF_GIB;
	o->timeout = 120;
	o->host_role = -1;
	o->doomed = -1;
	while ((c = getopt_long(argc, argv, "vh", lo, NULL)) != -1) {
		switch (c) {
		case 'p': o->plugin = optarg; break;
		case 'a':
			o->abi = strcmp(optarg, "all") ? atoi(optarg) : 0;
			if (strcmp(optarg, "all") &&
			    (o->abi < RAIL_CONF_ABI_MIN || o->abi > RAIL_CONF_ABI_MAX))
				return -1;
			break;
		case 'd': o->dev_a = atoi(optarg); break;
		case 'D': o->dev_b = atoi(optarg); break;
		case 'f':
			o->nfuse = parse_list(optarg, o->fuse, RAIL_CONF_MAX_VDEVS);
			if (o->nfuse <= 0)
				return -1;
			break;
		case 'm':
			if (rail_conf_parse_size(optarg, &o->max_size))
				return -1;
			break;
		case 's': o->scenario = optarg; break;
		case 't':
			o->timeout = atoi(optarg);
			if (o->timeout < 5)
				return -1;
			break;
		case 'F': o->full = 1; break;
		case 'l': *list = 1; break;
		case 'v': o->verbose = 1; break;
		case 'i':
			o->inject = optarg;
			if (rail_conf_inject_set(optarg))
				return -1;
			break;
		case 'S': o->self_test = 1; break;
		case 'L':
		case 'C':
			if (o->host_role >= 0)
				return -1;
			o->host_role = c == 'L' ? RAIL_CONF_ROLE_A : RAIL_CONF_ROLE_B;
			o->ctl_addr = optarg;
			break;
		case 'K':
			if (strcmp(optarg, "A") && strcmp(optarg, "B"))
				return -1;
			o->doomed = optarg[0] - 'A';
			break;
		case 'E': o->event_file = optarg; break;
		case 'h': usage(stdout); exit(0);
		default: return -1;
		}
	}
	return optind == argc && (o->plugin || *list) ? 0 : -1;
}

/* Each scenario with a fault it must catch. */
static const struct {
	const char *scenario;
	const char *fault;
} self_tests[] = {
	{ "properties", "bad-props" },		{ "nonblocking-connect", "slow-connect" },
	{ "sizes", "corrupt-byte" },		{ "sizes", "overrun" },
	{ "inflight-32", "corrupt-byte" },	{ "grouped-recv", "swap-group" },
	{ "recv-larger", "report-room" },	{ "send-larger", "no-error" },
	{ "send-larger", "mute-warn" },		{ "many-comms", "corrupt-byte" },
	{ "bidirectional", "corrupt-byte" },	{ "close-inflight", "write-after-close" },
	{ "listen-many", "overrun" },		{ "regmr-thread", "regmr-fail" },
	{ "peer-dies", "hide-error" },		{ "peer-stops", "hide-error" },
	{ "bad-handle", "connect-hide-error" },
	{ "reload", "leak-thread" },		{ "iflush", "flush-error" },
	{ "misuse", "mute-warn" },		{ "misuse-closed", "mute-warn" },
	{ "random-handle", "connect-hide-error" },
	{ "finalize-open", "mute-warn" },
	{ "profiler", "wrong-parent" },		{ "profiler", "mute-warn" },
};

/* What the ABIs before v`abi` lack, for a scenario that needs v`abi`. */
static const char *abi_lacks(int abi)
{
	switch (abi) {
	case 10:
		return "no profiler handles before v10";
	case 11:
		return "NCCL never unloads older plugins: they have no finalize";
	default:
		return "older ABIs lack what it tests";
	}
}

/* Every scenario must FAIL under its faults; returns the number that did not. */
static int self_test(struct rail_conf_opts *o, int abi, long long picked)
{
	int bad = 0, n = 0;
	char line[8192];

	o->timeout = o->timeout < 10 ? o->timeout : 10;
	for (size_t k = 0; k < sizeof(self_tests) / sizeof(self_tests[0]); k++) {
		int i = find_scenario(self_tests[k].scenario, strlen(self_tests[k].scenario));
		int r;

		if (i < 0 || !(picked & (1ll << i)) || abi < rail_conf_scenarios[i].min_abi)
			continue;
		rail_conf_inject_set(self_tests[k].fault);
		r = run_one(o, i, abi, line, sizeof(line));
		rail_conf_inject_set("none");
		n++;
		if (r == 1) {
			printf("PASS self-test %s v%d with %s: caught (%s)\n", self_tests[k].scenario, abi,
			       self_tests[k].fault, line + 5);
		} else {
			printf("FAIL self-test %s v%d with %s: not caught (%s)\n",
			       self_tests[k].scenario, abi, self_tests[k].fault, line);
			bad++;
		}
	}
	printf("%d passed, %d failed, 0 skipped\n", n - bad, bad);
	return bad;
}

/* Every picked scenario on every ABI, newest first. counts: passed, failed, skipped. */
static void run_all(const struct rail_conf_opts *o, unsigned mask, long long picked, int *counts)
{
	char line[8192];

	for (int abi = RAIL_CONF_ABI_MAX; abi >= RAIL_CONF_ABI_MIN; abi--) {
		if (o->abi && abi != o->abi)
			continue;
		if (!(mask & (1u << abi))) {
			if (o->abi) {
				printf("FAIL load v%d: the plugin does not export ncclNetPlugin_v%d\n",
				       abi, abi);
				counts[1]++;
			}
			continue;
		}
		for (int i = 0; i < rail_conf_nscenarios; i++) {
			const struct rail_conf_scenario *s = &rail_conf_scenarios[i];
			uint64_t ts = rail_conf_now_ns();
			int r;

			if (!(picked & (1ll << i)))
				continue;
			if (abi < s->min_abi) {
				printf("SKIP %s v%d: needs ABI v%d+ (%s)\n", s->name, abi, s->min_abi,
				       abi_lacks(s->min_abi));
				counts[2]++;
				continue;
			}
			r = run_one(o, i, abi, line, sizeof(line));
			if (o->verbose)
				printf("%s [%.2f s]\n", line, (double)(rail_conf_now_ns() - ts) / 1e9);
			else
				printf("%s\n", line);
			counts[r]++;
		}
	}
}

int main(int argc, char **argv)
{
	struct rail_conf_opts o;
	int list = 0, counts[3] = { 0, 0, 0 };
	unsigned mask = 0;
	long long picked;
	char err[600], sz[32];
	uint64_t t0 = rail_conf_now_ns();

	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (parse_opts(argc, argv, &o, &list)) {
		usage(stderr);
		return 2;
	}
	if (list) {
		for (int i = 0; i < rail_conf_nscenarios; i++)
			printf("%-20s %s\n", rail_conf_scenarios[i].name, rail_conf_scenarios[i].doc);
		return 0;
	}
	picked = pick_scenarios(o.scenario);
	if (picked < 0)
		return 2;
	if (probe_abis(o.plugin, &mask, err, sizeof(err))) {
		printf("FAIL load: dlopen(%s): %s\n0 passed, 1 failed, 0 skipped\n", o.plugin, err);
		return 1;
	}
	if (!mask) {
		printf("FAIL load: %s exports no ncclNetPlugin_v6..v12\n0 passed, 1 failed, 0 skipped\n",
		       o.plugin);
		return 1;
	}
	if (o.host_role >= 0 && o.self_test) {
		fprintf(stderr, "rail-conformance: --self-test runs on one host only\n");
		return 2;
	}
	if (o.host_role == RAIL_CONF_ROLE_A) {
		ctl_lfd = rail_conf_2h_listen(o.ctl_addr, err, sizeof(err));
		if (ctl_lfd < 0) {
			printf("FAIL setup: %s\n0 passed, 1 failed, 0 skipped\n", err);
			return 1;
		}
	}
	if (o.self_test) {
		int abi = o.abi ? o.abi : 31 - __builtin_clz(mask);

		printf("# self-test on v%d: every scenario must FAIL with an injected fault\n", abi);
		return self_test(&o, abi, picked) ? 1 : 0;
	}
	printf("# rail-conformance: %s, max message %s, timeout %d s per scenario\n", o.plugin,
	       rail_conf_size_str(o.max_size, sz, sizeof(sz)), o.timeout);
	if (o.host_role >= 0)
		printf("# two hosts: role %c here, control %s %s; verdicts are this role's\n",
		       'A' + o.host_role, o.host_role ? "connecting to" : "listening on", o.ctl_addr);
	if (!o.full)
		printf("# reduced on v7..v11 (full on v6 and v12; --full for all): sizes up to 64M, "
		       "bidirectional/peer-dies 16M messages, many-comms 2 messages per comm, "
		       "bad-handle without the stale-handle part\n");
	run_all(&o, mask, picked, counts);
	printf("# %.1f s\n", (double)(rail_conf_now_ns() - t0) / 1e9);
	printf("%d passed, %d failed, %d skipped\n", counts[0], counts[1], counts[2]);
	return counts[1] ? 1 : 0;
}
