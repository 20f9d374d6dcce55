/*
 * nccl-net-rail unit tests: a seeded randomized search for failover defects
 * (docs/FAILOVER.md) on the fake verbs provider.
 *
 * Each seed draws (fosearch.h) a topology (1-4 HCAs, one or two ports each,
 * RoCE or InfiniBand, PCI paths so that fused devices and fallbacks mean
 * something; each side's comm on one device or two fused), the plugin's
 * parameters (flushes of host memory counted as GPU memory, GPU memory by
 * DMA-BUF on either side (the fake checks its keys, moves no bytes), eager
 * ring on or off and its order, QPs per connection), each side's
 * registrations (several arenas, whole and sub-range registrations: keys
 * differ), traffic (grouped
 * receives of 1-8 buffers with tags, sizes from 0 B to 8 MiB: inline, LL,
 * eager, clear-to-send, large) and events at drawn points: PORT_ERR (and the
 * port back), DEVICE_FATAL on either side, QP_FATAL, a stall (rarely: it
 * costs a second), sends held in flight before a fault, regMr of new
 * buffers (also right after a fault, before any data call), close of the
 * comms mid-move. One thread drives both comms as NCCL's proxy does
 * (fosearch_loop.h); a send buffer is refilled with the next message as
 * soon as its send completes; every received byte, every completion and
 * every reported size is checked (fosearch_run.h). With a usable port left
 * no call may fail; with none, the comm must fail with a WARN, never
 * deliver wrong bytes or hang. Under ASan (make test-sanitizers) a read of
 * freed memory (a buffer deregistered and freed after its send completed)
 * fails the seed. A failure is named by what the plugin and the fake logged
 * (fosearch_run.h: an old lkey or rkey the fake refused, a registration on a
 * dead HCA, bytes of another message, a stale record's crash...).
 *
 * Each seed runs in a child process (fosearch_runner.h); it waits for the
 * plugin to log each fault before going on, so that a seed replays: the
 * same trace twice (--check-replay), but for seeds whose path turns on the
 * plugin's timers (the 100 ms look at the peer's move message, the fake's
 * retry_ms, the stall watchdog), which may take either way.
 *
 *   test_ib_fosearch                  the budget: FOSEARCH_SEEDS (2000) seeds
 *                                     from FOSEARCH_BASE (1), each in a child
 *   test_ib_fosearch --seeds A-B      seeds A..B
 *   test_ib_fosearch --count N        N seeds from the base (also --base B)
 *   test_ib_fosearch --seed N         one seed in this process, with the
 *                                     scenario and a trace of what was done
 *   --jobs J (FOSEARCH_JOBS)          children at once (default 2: most of a seed
 *                                     waits on the plugin's timers and threads)
 *   --list                            every failing seed's line, no detail
 *   --draw (with the seeds)           print the scenarios drawn, run nothing
 *   --check-replay N                  run seed N twice, compare the traces
 *
 * A failing seed prints `FAIL seed=N [category]: what`, the command that
 * replays it, and the scenario drawn. The search fails while any seed does.
 */
#include "unit.h"

#include <execinfo.h>
#include <fcntl.h>
#include <ftw.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include "fv_harness.h"

#define FO_SEED_NS (20ull * 1000000000ull)	/* a seed's whole run */
#define FO_IDLE_NS (5ull * 1000000000ull)	/* no progress: a hang */

#include "fosearch.h"
#include "fosearch_mem.h"
#include "fosearch_run.h"
#include "fosearch_loop.h"
#include "fosearch_ev.h"


static uint64_t fo_seed_arg;
static int fo_verbose;		/* --seed: this process, every log line, a full teardown */

/* ---- one seed ------------------------------------------------------------------------ */

static void fo_setenv_int(const char *name, int on, const char *value)
{
	if (on)
		setenv(name, value, 1);
	else
		unsetenv(name);
}

static void fo_env(const struct fo_scn *s)
{
	char q[8];

	snprintf(q, sizeof(q), "%d", s->p.qps);
	fo_setenv_int("NCCL_RAIL_IB_FLUSH_HOST", s->p.flush_host, "1");
	fo_setenv_int("NCCL_RAIL_IB_EAGER_ORDER", s->p.order != 0, s->p.order == 1 ? "safe" : "inorder");
	fo_setenv_int("NCCL_RAIL_IB_EAGER", s->p.eager_off, "0");
	fo_setenv_int("NCCL_IB_QPS_PER_CONNECTION", s->p.qps != 1, q);
	fo_setenv_int("NCCL_IB_SPLIT_DATA_ON_QPS", s->p.split, "1");
	fo_setenv_int("NCCL_RAIL_IB_STALL_TIMEOUT", s->p.stall, "1");
	fo_setenv_int("NCCL_RAIL_FAILOVER_HOLDDOWN", s->p.holddown0, "0");
}

static void fo_out_line(void *arg, const char *line)
{
	(void)arg;
	printf("fo: scn %s\n", line);
}

static int fo_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

/* The comms made: the fake, the plugin on it, vdevs fused, both comms connected. */
static int fo_setup(struct fo_run *R, const char *conf)
{
	const struct fo_topo *t = &R->S->t;
	int rv = t->rdev[0], sv = t->sdev[0];
	ncclResult_t lr, cr, ar;

	fo_env(R->S);
	R->F = fvh_start(conf);
	printf("FODIR %s\n", R->F->dir);	/* the runner removes it if this child cannot */
	rail_log_set_logger((rail_logger_fn)fo_sink);
	if (R->F->ndev != t->nplug) {
		fo_fail(R, "harness", "the plugin lists %d devices, the description has %d ports",
			R->F->ndev, t->nplug);
		return -1;
	}
	if ((t->nr == 2 && rail_net_make_vdevice(&rv, 2, t->rdev, 8) != ncclSuccess) ||
	    (t->ns == 2 && rail_net_make_vdevice(&sv, 2, t->sdev, 8) != ncclSuccess)) {
		fo_fail(R, "harness", "makeVDevice failed");
		return -1;
	}
	if (!fvh_try_connect(R->F, rv, sv, -1, &lr, &cr, &ar)) {
		fo_fail(R, "connect", "connecting failed (listen %d, connect %d, accept %d)", lr, cr, ar);
		return -1;
	}
	return 0;
}

static void fo_teardown(struct fo_run *R)
{
	struct fvh *F = R->F;
	ncclResult_t res = ncclSuccess;

	for (int d = 0; d < FO_MAXDEV; d++)
		if (R->held[d]) {
			char dev[24];

			snprintf(dev, sizeof(dev), "mlx5_%d", d);
			F->hold(dev, 0);
		}
	if (F->sc && fo_mem_dereg(&R->mem[0], F->sc) != ncclSuccess && !R->stop)
		fo_fail(R, "teardown", "deregMr on the send comm failed");
	if (F->rc && fo_mem_dereg(&R->mem[1], F->rc) != ncclSuccess && !R->stop)
		fo_fail(R, "teardown", "deregMr on the receive comm failed");
	if (F->sc && (res = rail_net_close_send(F->sc)) != ncclSuccess)
		fo_fail(R, "close", "closing the send comm failed (%d)", (int)res);
	if (F->rc && (res = rail_net_close_recv(F->rc)) != ncclSuccess)
		fo_fail(R, "close", "closing the receive comm failed (%d)", (int)res);
	if (F->lc && rail_net_close_listen(F->lc) != ncclSuccess)
		fo_fail(R, "close", "closing the listen comm failed");
	F->sc = F->rc = F->lc = NULL;
	fvh_live = 0;
	if (F->ctx && rail_net_finalize(F->ctx) != ncclSuccess)
		fo_fail(R, "close", "finalize failed");
	F->ctx = NULL;
	rail_log_set_logger(NULL);
	if (!getenv("RAIL_FAKEVERBS_KEEP"))
		nftw(F->dir, fo_rm, 8, FTW_DEPTH | FTW_PHYS);
	else
		printf("fo: kept %s\n", F->dir);
	for (int side = 0; side < 2; side++)
		for (int a = 0; a < R->mem[side].narena; a++)
			free(R->mem[side].arena[a].p);
	if (R->dmabuf_fd >= 0)
		close(R->dmabuf_fd);
	rail_params_reload();
}

/* Each tag's messages, in the receivers' order; the send slots loaded with the first. */
static int fo_traffic_init(struct fo_run *R)
{
	const struct fo_traffic *tr = &R->S->tr;
	ncclResult_t res;

	for (int m = 0; m < tr->nmsg; m++) {
		int t = tr->msg[m].tag - FO_TAG0;

		R->tmsg[t][R->tn[t]++] = m;
	}
	for (int k = 0; k < tr->nrecv; k++)
		R->maxn = tr->rn[k] > R->maxn ? tr->rn[k] : R->maxn;
	if (R->S->p.dmabuf[0] || R->S->p.dmabuf[1])
		R->dmabuf_fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
	res = fo_mem_init(&R->mem[0], R->F->sc, &R->S->lay[0], tr->ws * tr->ntags, tr->smax,
			  R->S->p.dmabuf[0] ? R->dmabuf_fd : -1);
	if (res == ncclSuccess)
		res = fo_mem_init(&R->mem[1], R->F->rc, &R->S->lay[1], tr->wr * R->maxn, tr->rmax,
				  R->S->p.dmabuf[1] ? R->dmabuf_fd : -1);
	if (res != ncclSuccess) {
		fo_fail(R, "regmr-initial", "registering the initial buffers failed (%d)", (int)res);
		return -1;
	}
	for (int t = 0; t < tr->ntags; t++)
		for (int k = 0; k < tr->ws && k < R->tn[t]; k++)
			fo_slot_load(R, t, k);
	return 0;
}

/* After the loop: hangs, and sends reported done that a closed sender took along. */
static void fo_after_loop(struct fo_run *R, uint64_t start)
{
	const struct fo_traffic *tr = &R->S->tr;
	int lost = 0, first = -1;

	if (R->closed_s && !R->closed_r)
		for (int k = 0; k < tr->nrecv; k++)
			if (R->rstate[k] != R_DONE && fo_recv_owed(R, k) &&
			    (R->rstate[k] == R_POSTED ||
			     (k == R->recvd && (k < tr->wr || R->rstate[k - tr->wr] == R_DONE)))) {
				lost++;
				first = first < 0 ? k : first;
			}
	if (lost && !R->failed)
		fo_fail(R, "close-mid-move-lost-sends", "the send comm closed mid-move; %d receive(s) "
			"(first: %d) of sends it had reported done never completed%s", lost, first,
			R->stop ? " (the receive comm failed)" : "");
	if (R->failed || R->stop || fo_finished(R))
		return;
	fo_hang(R, "no progress for %.1f s (%.1f s into the seed): %d/%d sends posted, %d done; "
		"%d/%d receives posted, %d done; %d usable port(s) left",
		(double)(rail_now_ns() - R->progress_ns) / 1e9, (double)(rail_now_ns() - start) / 1e9,
		R->n_sent, tr->nmsg, R->n_sdone, R->n_recvd, tr->nrecv, R->n_rdone, fo_ports_left(R));
}

/* Holds whose fault never came (the traffic ended first): the final message must pass. */
static void fo_unhold(struct fo_run *R)
{
	for (int d = 0; d < FO_MAXDEV; d++)
		if (R->held[d] && d != R->stall_dev) {
			char dev[24];

			snprintf(dev, sizeof(dev), "mlx5_%d", d);
			R->F->hold(dev, 0);
			R->held[d] = 0;
			fo_trace(R, "hold on %s released: its fault did not come before the end", dev);
		}
}

static struct fo_scn fo_scn_buf;
static struct fo_run fo_run_buf;

/*
 * A crash in the plugin (cmocka would only say "Segmentation fault"): the
 * frames, as file and offset, for the runner to name with addr2line.
 */
static void *fo_crash_base;	/* where the test binary (with the plugin's core) is mapped */

static void fo_crash(int sig)
{
	void *bt[48];
	char line[700];
	int n = backtrace(bt, 48), len;

	len = snprintf(line, sizeof(line), "\nFOCRASH signal %d%s\n", sig,
		       fo_run_buf.recv_died ? " after DEVICE_FATAL on an HCA of the receive comm" : "");
	if (write(1, line, (size_t)len) < 0)
		_exit(128 + sig);
	for (int i = 0; i < n; i++) {
		Dl_info di;

		if (!dladdr(bt[i], &di) || !di.dli_fname)
			continue;
		len = snprintf(line, sizeof(line), "FOFRAME %s 0x%lx\n", di.dli_fname,
			       (unsigned long)((char *)bt[i] - (char *)di.dli_fbase - (i > 0)));
		if (write(1, line, (size_t)len) < 0)
			break;
	}
	if (fo_verbose) {	/* the replay: name the frames here (not async-safe; it dies anyway) */
		char cmd[64];

		snprintf(cmd, sizeof(cmd), "addr2line -f -p -e /proc/%d/exe", (int)getpid());
		for (int i = 0; i < n; i++) {
			Dl_info di;
			char c2[160];

			if (dladdr(bt[i], &di) && di.dli_fname && di.dli_fbase == fo_crash_base) {
				snprintf(c2, sizeof(c2), "%s 0x%lx", cmd,
					 (unsigned long)((char *)bt[i] - (char *)di.dli_fbase - (i > 0)));
				if (system(c2) < 0)
					break;
			}
		}
	}
	_exit(128 + sig);
}

static void fo_crash_handlers(void)
{
	static const int sigs[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT };
	void *warm[2];
	Dl_info di;

	if (dladdr((void *)fo_crash_handlers, &di))
		fo_crash_base = di.dli_fbase;
	(void)backtrace(warm, 2);	/* loads what backtrace needs, before a crash */
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		signal(sigs[i], fo_crash);
}

/* Run seed fo_seed_arg; its outcome in fo_run_buf (what, cat). */
static void fo_one(void **state)
{
	struct fo_run *R = &fo_run_buf;
	struct fo_scn *S = &fo_scn_buf;
	char conf[4096];
	uint64_t start = rail_now_ns(), t_setup = 0, t_loop;

	(void)state;
	fo_crash_handlers();	/* after cmocka's, which would hide where */
	fo_draw(fo_seed_arg, S);
	memset(R, 0, sizeof(*R));
	R->S = S;
	R->g.s = fo_mix(fo_seed_arg ^ 0x5bd1e995u);
	R->stall_dev = -1;
	R->dmabuf_fd = -1;
	R->ahead_k = -1;
	R->progress_ns = start;
	fo_log_echo = fo_verbose;
	printf("fo: scn seed %llu\n", (unsigned long long)S->seed);
	fo_describe(S, fo_out_line, NULL);
	if (fo_conf(S, conf, sizeof(conf)))
		fail_msg("the description does not fit");
	if (fo_verbose)
		printf("fo: scn fake description:\n%s", conf);
	if (!fo_setup(R, conf) && !fo_traffic_init(R)) {
		t_setup = rail_now_ns();
		while (!R->stop && !fo_finished(R) && rail_now_ns() - start < FO_SEED_NS &&
		       rail_now_ns() - R->progress_ns < FO_IDLE_NS)
			fo_turn(R);
		fo_after_loop(R, start);
		fo_unhold(R);
		fo_final(R, start + FO_SEED_NS);
	}
	t_loop = rail_now_ns();
	fo_trace(R, "loop over: %d/%d sends done, %d/%d receives done; teardown", R->n_sdone,
		 S->tr.nmsg, R->n_rdone, S->tr.nrecv);
	/*
	 * A failed seed's child ends here, and most of those where a call failed
	 * as it may (no port left): closing a comm whose HCA holds its writes
	 * drains for a second. One in four of the latter closes all the same.
	 */
	if (fo_verbose || (!R->failed && (!R->stop || S->seed % 4 == 0)))
		fo_teardown(R);
	else if (R->F && !getenv("RAIL_FAKEVERBS_KEEP"))
		nftw(R->F->dir, fo_rm, 8, FTW_DEPTH | FTW_PHYS);
	fo_trace(R, "%s (setup %.1f ms, loop %.1f ms, teardown %.1f ms)",
		 R->failed ? "FAILED" : "passed", t_setup ? (double)(t_setup - start) / 1e6 : 0.0,
		 t_setup ? (double)(t_loop - t_setup) / 1e6 : 0.0, (double)(rail_now_ns() - t_loop) / 1e6);
	fflush(stdout);
}

/* The seed in this process (under cmocka: the harness asserts). 0 passed. */
static int fo_run_seed(uint64_t seed)
{
	const struct CMUnitTest one[] = { cmocka_unit_test(fo_one) };
	int bad;

	fo_seed_arg = seed;
	bad = cmocka_run_group_tests_name("fosearch seed", one, NULL, NULL);
	if (fo_run_buf.failed)
		printf("FOFAIL|%s|%s\n", fo_run_buf.cat, fo_run_buf.what);
	else if (bad)
		printf("FOFAIL|harness|a harness assertion failed (above)\n");
	else
		printf("FOPASS\n");
	fflush(stdout);
	return fo_run_buf.failed || bad;
}

#include "fosearch_runner.h"
