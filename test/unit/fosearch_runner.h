/*
 * nccl-net-rail unit tests: the seeded randomized failover search
 * (test_ib_fosearch.c), part 6: the runner. Each seed runs in a child
 * process (a crash, an ASan report or a hang costs one seed, and no state
 * leaks from seed to seed); its output comes back on a pipe, and a failing
 * seed is reported with the command that replays it and the scenario drawn.
 *
 * Included at the end of test_ib_fosearch.c.
 */
#ifndef RAIL_FOSEARCH_RUNNER_H
#define RAIL_FOSEARCH_RUNNER_H

#define FO_CHILD_NS (40ull * 1000000000ull)	/* the child is killed after this */
#define FO_HEAD 16384
#define FO_TAIL 32768
#define FO_MAXJOBS 8
#define FO_MAXCAT 32

struct fo_child {
	pid_t pid;
	int fd;
	uint64_t seed, start;
	char head[FO_HEAD];
	size_t hlen;
	char tail[FO_TAIL];
	size_t tlen;
	int killed;
};

static struct {
	uint64_t base, count;
	int jobs, list;
	const char *argv0;
	uint64_t run, failed, detailed;
	struct {
		char name[128];
		int n;
		uint64_t seeds[6];
	} cat[FO_MAXCAT];
	int ncat;
} fo_cfg = { .base = 1, .count = 2000, .jobs = 1 };

static void fo_cat_add(const char *name, uint64_t seed)
{
	int i;

	for (i = 0; i < fo_cfg.ncat && strcmp(fo_cfg.cat[i].name, name); i++)
		;
	if (i == fo_cfg.ncat) {
		if (fo_cfg.ncat == FO_MAXCAT)
			i = FO_MAXCAT - 1;	/* the last one takes the rest */
		else
			snprintf(fo_cfg.cat[fo_cfg.ncat++].name, sizeof(fo_cfg.cat[0].name), "%s", name);
	}
	if (fo_cfg.cat[i].n < 6)
		fo_cfg.cat[i].seeds[fo_cfg.cat[i].n] = seed;
	fo_cfg.cat[i].n++;
}

static void fo_take(struct fo_child *c, const char *buf, size_t n)
{
	size_t h = n < FO_HEAD - 1 - c->hlen ? n : FO_HEAD - 1 - c->hlen;

	memcpy(c->head + c->hlen, buf, h);
	c->hlen += h;
	c->head[c->hlen] = 0;
	if (n >= FO_TAIL - 1) {
		buf += n - (FO_TAIL - 1);
		n = FO_TAIL - 1;
		c->tlen = 0;
	} else if (c->tlen + n >= FO_TAIL) {
		size_t keep = FO_TAIL - 1 - n;

		memmove(c->tail, c->tail + c->tlen - keep, keep);
		c->tlen = keep;
	}
	memcpy(c->tail + c->tlen, buf, n);
	c->tlen += n;
	c->tail[c->tlen] = 0;
}

/*
 * The function of the first frame of a sanitizer's report ("#N 0x... in
 * FUNC file:line") in the plugin or the fake; *item1 when a stale send
 * record (ib_send.c's failover replay) is on the stack.
 */
static void fo_san_frame(const char *rep, char *fn, size_t len, int *item1)
{
	const char *p = rep;

	fn[0] = 0;
	*item1 = strstr(rep, " sent_post_again ") || strstr(rep, " sent_finish ") ||
		 strstr(rep, " send_replay ") || strstr(rep, " sent_record ");
	while ((p = strstr(p, " in ")) != NULL) {
		p += 4;
		if (p[-5] != ' ' && (p[-5] < '0' || p[-5] > '9' ) && p[-5] != 'f')
			continue;	/* "#3 0x55d... in f": the address ends in a hex digit */
		if (!strncmp(p, "__", 2) || !strncmp(p, "memcpy", 6) || !strncmp(p, "memmove", 7) ||
		    !strncmp(p, "memcmp", 6) || !strncmp(p, "memset", 6))
			continue;
		snprintf(fn, len, "%.*s", (int)strcspn(p, " \n("), p);
		return;
	}
}

/*
 * A crash's frames (FOFRAME file offset) named by addr2line: the first
 * function of the plugin or the fake into fn; *item1 when a stale send
 * record (ib_send.c's failover replay) is on the stack.
 */
static void fo_crash_frames(const char *rep, char *fn, size_t len, int *item1)
{
	char cmd[4096], file[512] = "", out[256];
	size_t off;
	FILE *p;

	fn[0] = 0;
	*item1 = 0;
	off = (size_t)snprintf(cmd, sizeof(cmd), "addr2line -f -e ");
	for (const char *f = rep; (f = strstr(f, "FOFRAME ")) != NULL; f++) {
		char name[512];
		unsigned long a;

		if (sscanf(f, "FOFRAME %511s %lx", name, &a) != 2)
			continue;
		if (!file[0]) {
			snprintf(file, sizeof(file), "%s", name);
			off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, "%s", file);
		}
		if (strcmp(name, file) || off > sizeof(cmd) - 32)
			continue;	/* one file: the test binary holds the plugin's core */
		off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, " 0x%lx", a);
	}
	if (!file[0] || !(p = popen(cmd, "r")))
		return;
	for (int i = 0; fgets(out, sizeof(out), p); i++) {
		out[strcspn(out, "\n")] = 0;
		if (i % 2)
			continue;	/* file:line */
		*item1 |= !strcmp(out, "sent_post_again") || !strcmp(out, "sent_finish") ||
			  !strcmp(out, "send_replay");
		if (!fn[0] && strncmp(out, "fo_", 3) && strcmp(out, "??") && strncmp(out, "__", 2))
			snprintf(fn, len, "%.90s", out);
	}
	pclose(p);
}

/* The category and one line of what of a finished child. */
static int fo_classify(const struct fo_child *c, int status, char *cat, size_t clen, char *what,
		       size_t wlen)
{
	const char *f = strstr(c->tail, "FOFAIL|"), *san = strstr(c->tail, "ERROR: AddressSanitizer");
	const char *tsan = strstr(c->tail, "WARNING: ThreadSanitizer:");
	const char *ub = strstr(c->tail, "runtime error:");

	if (!san)
		san = strstr(c->tail, "ERROR: LeakSanitizer");
	if (tsan) {
		const char *f0 = strstr(tsan, "#0 ");
		int n = (int)strcspn(tsan + 26, "(\n");

		while (n > 0 && tsan[26 + n - 1] == ' ')
			n--;
		snprintf(cat, clen, "tsan-%.*s", n > 40 ? 40 : n, tsan + 26);
		for (char *q = cat; *q; q++)
			*q = *q == ' ' ? '-' : *q;
		snprintf(what, wlen, "ThreadSanitizer: %.*s at %.*s", n, tsan + 26,
			 f0 ? (int)strcspn(f0 + 3, " \n") : 1, f0 ? f0 + 3 : "?");
		return 1;
	}
	if (san || ub) {
		char fn[96], kind[96];
		int item1;

		fo_san_frame(san ? san : ub, fn, sizeof(fn), &item1);
		if (san)
			snprintf(kind, sizeof(kind), "%.*s", (int)strcspn(san + 25, " \n"), san + 25);
		else
			snprintf(kind, sizeof(kind), "%.80s", ub + 15);
		kind[strcspn(kind, "\n")] = 0;
		snprintf(cat, clen, "%s%s", item1 ? "item1-" : "", san ? "asan-" : "ubsan");
		if (san)
			snprintf(cat + strlen(cat), clen - strlen(cat), "%s", kind);
		snprintf(what, wlen, "%s: %s in %s", san ? "AddressSanitizer" : "UBSan", kind,
			 fn[0] ? fn : "?");
		return 1;
	}
	if (strstr(c->tail, "FOCRASH signal ")) {
		char fn[96];
		int item1, sig = atoi(strstr(c->tail, "FOCRASH signal ") + 15);

		fo_crash_frames(strstr(c->tail, "FOCRASH signal "), fn, sizeof(fn), &item1);
		/* stale send records also mark unrelated sends done: crashes far from the replay */
		item1 |= strstr(c->tail, "after DEVICE_FATAL on an HCA of the receive comm") != NULL;
		snprintf(cat, clen, "%scrash-%s", item1 ? "item1-" : "",
			 sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGABRT ? "SIGABRT"
			 : sig == SIGFPE ? "SIGFPE" : "signal");
		snprintf(what, wlen, "the child died of %s in %s", strsignal(sig), fn[0] ? fn : "?");
		return 1;
	}
	if (c->killed) {
		const char *last = c->tail + c->tlen;
		int lines = 0;

		while (last > c->tail && lines < 2)
			lines += *--last == '\n';
		snprintf(cat, clen, "hang-killed");
		snprintf(what, wlen, "the child ran past %llu s and was killed; its last line: %.200s",
			 FO_CHILD_NS / 1000000000ull, last + (*last == '\n'));
		return 1;
	}
	if (f) {
		const char *bar = strchr(f + 7, '|');

		snprintf(cat, clen, "%.*s", bar ? (int)(bar - f - 7) : 0, f + 7);
		snprintf(what, wlen, "%.*s", (int)strcspn(bar ? bar + 1 : f, "\n"), bar ? bar + 1 : f);
		return 1;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && strstr(c->tail, "FOPASS"))
		return 0;
	snprintf(cat, clen, "crash");
	snprintf(what, wlen, "the child %s %d without a verdict",
		 WIFSIGNALED(status) ? "died of signal" : "exited with",
		 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	return 1;
}

/*
 * FOSEARCH_DUMP=DIR: a failing child's output (its last FO_TAIL bytes: the
 * plugin's log and the trace) into DIR/seed-N.log, for a failure that
 * depends on timing and does not come back on replay.
 */
static void fo_dump(const struct fo_child *c)
{
	const char *dir = getenv("FOSEARCH_DUMP");
	char path[PATH_MAX];
	FILE *f;

	if (!dir || !*dir)
		return;
	snprintf(path, sizeof(path), "%s/seed-%llu.log", dir, (unsigned long long)c->seed);
	f = fopen(path, "w");
	if (!f) {
		printf("  FOSEARCH_DUMP: cannot write %s\n", path);
		return;
	}
	fputs(c->head, f);
	fputs("\n[...]\n", f);
	fputs(c->tail, f);
	fclose(f);
	printf("  output: %s\n", path);
}

static void fo_report(const struct fo_child *c, int status)
{
	char cat[128], what[700];
	const char *lib = getenv("RAIL_FAKEVERBS_LIB");

	if (getenv("FOSEARCH_TIMES")) {
		const char *t = strstr(c->tail, " (setup ");

		printf("time seed=%llu%.*s\n", (unsigned long long)c->seed,
		       t ? (int)strcspn(t, "\n") : 0, t ? t : "");
	}
	if (!fo_classify(c, status, cat, sizeof(cat), what, sizeof(what)))
		return;
	fo_cfg.failed++;
	fo_cat_add(cat, c->seed);
	printf("FAIL seed=%llu [%s]: %s\n", (unsigned long long)c->seed, cat, what);
	fo_dump(c);
	if (fo_cfg.list || fo_cfg.detailed++ >= 20)
		return;
	printf("  replay: RAIL_FAKEVERBS_LIB=%s %s --seed %llu\n", lib ? lib : fvh_lib, fo_cfg.argv0,
	       (unsigned long long)c->seed);
	for (const char *p = c->head; (p = strstr(p, "fo: scn ")) != NULL; p++) {
		int n = (int)strcspn(p + 8, "\n");

		printf("  %.*s\n", n, p + 8);
	}
	fflush(stdout);
}

/* The child's fake directory, if a crash or a kill left it behind. */
static void fo_child_dir_rm(const struct fo_child *c)
{
	const char *d = strstr(c->head, "FODIR ");
	char dir[128];

	if (!d || getenv("RAIL_FAKEVERBS_KEEP"))
		return;
	snprintf(dir, sizeof(dir), "%.*s", (int)strcspn(d + 6, "\n"), d + 6);
	if (strstr(dir, "/rail-fakeverbs-") && access(dir, F_OK) == 0)
		nftw(dir, fo_rm, 8, FTW_DEPTH | FTW_PHYS);
}

static int fo_spawn(struct fo_child *c, uint64_t seed, const struct fo_child *all, int nall)
{
	int p[2];

	if (pipe(p))
		return -1;
	fflush(stdout);
	fflush(stderr);
	c->pid = fork();
	if (c->pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (c->pid == 0) {
		for (int i = 0; i < nall; i++)
			if (all[i].pid > 0)
				close(all[i].fd);
		close(p[0]);
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[1]);
		setvbuf(stdout, NULL, _IOLBF, 0);
		_exit(fo_run_seed(seed) ? 1 : 0);
	}
	close(p[1]);
	c->fd = p[0];
	c->seed = seed;
	c->start = rail_now_ns();
	c->hlen = c->tlen = 0;
	c->head[0] = c->tail[0] = 0;
	c->killed = 0;
	return 0;
}

/* Read what the children wrote; reap those that ended. Returns the number still running. */
static int fo_poll(struct fo_child *ch, int n)
{
	struct pollfd pf[FO_MAXJOBS];
	char buf[8192];
	int live = 0;

	for (int i = 0; i < n; i++) {
		pf[i].fd = ch[i].pid > 0 ? ch[i].fd : -1;
		pf[i].events = POLLIN;
		pf[i].revents = 0;
	}
	(void)poll(pf, (nfds_t)n, 100);
	for (int i = 0; i < n; i++) {
		struct fo_child *c = &ch[i];
		ssize_t r = 0;
		int status = 0;

		if (c->pid <= 0)
			continue;
		if (pf[i].revents & (POLLIN | POLLHUP | POLLERR))
			r = read(c->fd, buf, sizeof(buf));
		if (r > 0) {
			fo_take(c, buf, (size_t)r);
		} else if (r == 0 && (pf[i].revents & (POLLIN | POLLHUP | POLLERR))) {
			close(c->fd);
			waitpid(c->pid, &status, 0);
			c->pid = 0;
			fo_child_dir_rm(c);
			fo_cfg.run++;
			fo_report(c, status);
			continue;
		}
		if (!c->killed && rail_now_ns() - c->start > FO_CHILD_NS) {
			kill(c->pid, SIGKILL);
			c->killed = 1;
		}
		live++;
	}
	return live;
}

static void fo_budget(void **state)
{
	struct fo_child ch[FO_MAXJOBS];
	uint64_t next = fo_cfg.base, end = fo_cfg.base + fo_cfg.count, t0 = rail_now_ns(), shown = 0;
	int jobs = fo_cfg.jobs < 1 ? 1 : fo_cfg.jobs > FO_MAXJOBS ? FO_MAXJOBS : fo_cfg.jobs;

	(void)state;
	memset(ch, 0, sizeof(ch));
	printf("fosearch: seeds %llu..%llu, %d at a time\n", (unsigned long long)fo_cfg.base,
	       (unsigned long long)(end - 1), jobs);
	for (;;) {
		int live = 0;

		for (int i = 0; i < jobs && next < end; i++)
			if (ch[i].pid <= 0 && fo_spawn(&ch[i], next, ch, jobs) == 0)
				next++;
		live = fo_poll(ch, jobs);
		if (!live && next >= end)
			break;
		if (fo_cfg.run / 500 != shown) {
			shown = fo_cfg.run / 500;
			printf("fosearch: %llu seeds run, %llu failing, %.0f s\n",
			       (unsigned long long)fo_cfg.run, (unsigned long long)fo_cfg.failed,
			       (double)(rail_now_ns() - t0) / 1e9);
			fflush(stdout);
		}
	}
	printf("fosearch: %llu seeds in %.1f s, %llu failing\n", (unsigned long long)fo_cfg.run,
	       (double)(rail_now_ns() - t0) / 1e9, (unsigned long long)fo_cfg.failed);
	for (int i = 0; i < fo_cfg.ncat; i++) {
		printf("  %5d  %s  seeds", fo_cfg.cat[i].n, fo_cfg.cat[i].name);
		for (int k = 0; k < fo_cfg.cat[i].n && k < 6; k++)
			printf(" %llu", (unsigned long long)fo_cfg.cat[i].seeds[k]);
		printf("\n");
	}
	if (fo_cfg.failed)
		fail_msg("%llu of %llu seeds failed (each replays with --seed N)",
			 (unsigned long long)fo_cfg.failed, (unsigned long long)fo_cfg.run);
}

/* Sanitizer builds: UBSan's reports with the stack (the runner names the function). */
__attribute__((visibility("default"))) const char *__ubsan_default_options(void);
__attribute__((visibility("default"))) const char *__ubsan_default_options(void)
{
	return "print_stacktrace=1";
}

/* The default budget: 2000 seeds; fewer under the sanitizers (make test-sanitizers, test-tsan). */
#if defined(__SANITIZE_THREAD__)
#define FO_DEFAULT_SEEDS 100
#elif defined(__SANITIZE_ADDRESS__)
#define FO_DEFAULT_SEEDS 300
#else
#define FO_DEFAULT_SEEDS 2000
#endif

/* The trace lines ("fo: t...") of a child's output, addresses and timings masked. */
static void fo_trace_of(const struct fo_child *c, char *out, size_t len)
{
	size_t o = 0;

	for (const char *p = c->tail; (p = strstr(p, "fo: t")) != NULL && o + 2 < len; p++) {
		size_t n = strcspn(p, "\n");
		const char *cut = strstr(p, " (setup ");

		if (cut && (size_t)(cut - p) < n)
			n = (size_t)(cut - p);
		for (size_t i = 0; i < n && o + 2 < len; i++) {
			/* turn numbers too: waits on the plugin's timers (stall, retry) vary */
			if (i == 5)
				while (i < n && p[i] >= '0' && p[i] <= '9')
					i++;
			if (p[i] == '0' && p[i + 1] == 'x') {	/* an address: masked */
				out[o++] = '#';
				for (i += 2; i < n && strchr("0123456789abcdef", p[i]); i++)
					;
				i--;
				continue;
			}
			if (!strncmp(p + i, "127.0.0.1:", 10)) {
				out[o++] = '#';
				for (i += 10; i < n && p[i] >= '0' && p[i] <= '9'; i++)
					;
				i--;
				continue;
			}
			out[o++] = p[i];
		}
		out[o++] = '\n';
	}
	out[o] = 0;
}

/* Run seed twice, each in a child; 0 when the two traces are the same. */
static int fo_check_replay(uint64_t seed)
{
	static char a[FO_TAIL], b[FO_TAIL];
	struct fo_child c;
	int status;

	for (int k = 0; k < 2; k++) {
		memset(&c, 0, sizeof(c));
		if (fo_spawn(&c, seed, NULL, 0))
			return 2;
		for (;;) {
			char buf[8192];
			ssize_t r = read(c.fd, buf, sizeof(buf));

			if (r <= 0)
				break;
			fo_take(&c, buf, (size_t)r);
		}
		close(c.fd);
		waitpid(c.pid, &status, 0);
		fo_child_dir_rm(&c);
		fo_trace_of(&c, k ? b : a, FO_TAIL);
	}
	if (!strcmp(a, b)) {
		printf("seed %llu replays: the same trace twice (%zu bytes)\n",
		       (unsigned long long)seed, strlen(a));
		return 0;
	}
	printf("seed %llu: the two traces differ\n--- first\n%s--- second\n%s",
	       (unsigned long long)seed, a, b);
	return 1;
}

static uint64_t fo_env_u64(const char *name, uint64_t dflt)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : dflt;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = { cmocka_unit_test(fo_budget) };
	int one = 0, draw = 0, replay = 0;

	fo_cfg.argv0 = argv[0];
	fo_cfg.count = fo_env_u64("FOSEARCH_SEEDS", FO_DEFAULT_SEEDS);
	fo_cfg.base = fo_env_u64("FOSEARCH_BASE", 1);
	fo_cfg.jobs = (int)fo_env_u64("FOSEARCH_JOBS", 2);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
			fo_seed_arg = strtoull(argv[++i], NULL, 0);
			one = 1;
		} else if (!strcmp(argv[i], "--seeds") && i + 1 < argc) {
			char *dash;
			uint64_t a = strtoull(argv[++i], &dash, 0), b = *dash == '-' ?
					     strtoull(dash + 1, NULL, 0) : a;

			fo_cfg.base = a;
			fo_cfg.count = b >= a ? b - a + 1 : 0;
		} else if (!strcmp(argv[i], "--count") && i + 1 < argc) {
			fo_cfg.count = strtoull(argv[++i], NULL, 0);
		} else if (!strcmp(argv[i], "--base") && i + 1 < argc) {
			fo_cfg.base = strtoull(argv[++i], NULL, 0);
		} else if (!strcmp(argv[i], "--jobs") && i + 1 < argc) {
			fo_cfg.jobs = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--list")) {
			fo_cfg.list = 1;
		} else if (!strcmp(argv[i], "--draw")) {
			draw = 1;
		} else if (!strcmp(argv[i], "--check-replay") && i + 1 < argc) {
			fo_seed_arg = strtoull(argv[++i], NULL, 0);
			replay = 1;
		} else {
			fprintf(stderr, "usage: %s [--seed N | --seeds A-B | --count N --base B] "
				"[--jobs J] [--list] [--draw] [--check-replay N]\n", argv[0]);
			return 2;
		}
	}
	if (draw) {	/* the scenarios only, nothing run */
		for (uint64_t k = one ? fo_seed_arg : fo_cfg.base;
		     k < (one ? fo_seed_arg + 1 : fo_cfg.base + fo_cfg.count); k++) {
			fo_draw(k, &fo_scn_buf);
			printf("fo: scn seed %llu\n", (unsigned long long)k);
			fo_describe(&fo_scn_buf, fo_out_line, NULL);
		}
		return 0;
	}
	/* thousands of fake sysfs trees: on tmpfs when there is one */
	if (!getenv("RAIL_FAKEVERBS_TMPDIR") && access("/dev/shm", W_OK | X_OK) == 0)
		setenv("RAIL_FAKEVERBS_TMPDIR", "/dev/shm", 1);
	if (!fvh_find_lib()) {
		if (getenv("RAIL_FAKEVERBS_LIB")) {
			printf("test_ib_fosearch: RAIL_FAKEVERBS_LIB=%s cannot be read\n", fvh_lib);
			return 1;
		}
		printf("test_ib_fosearch: skipped: %s not built (make tests)\n", fvh_lib);
		return 0;
	}
	if (replay)
		return fo_check_replay(fo_seed_arg);
	if (one) {
		int bad;

		fo_verbose = 1;
		setvbuf(stdout, NULL, _IOLBF, 0);	/* a crash loses nothing of the trace */
		bad = fo_run_seed(fo_seed_arg);
		if (bad)
			printf("FAIL seed=%llu [%s]: %s\n  replay: RAIL_FAKEVERBS_LIB=%s %s --seed %llu\n",
			       (unsigned long long)fo_seed_arg, fo_run_buf.cat, fo_run_buf.what, fvh_lib,
			       argv[0], (unsigned long long)fo_seed_arg);
		return bad;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
