/*
 * nccl-net-rail test tool: every thread's stack of a running process, on
 * demand, for hangs on a machine without a debugger. Preload it into the
 * ranks (mpirun -x LD_PRELOAD=build/test/nccl/stackdump.so, built by make
 * tests) and send the process SIGRTMIN+5 (kill -s RTMIN+5 PID, or
 * test/nccl/stackdump.sh, which also names each frame): it writes to
 * STACKDUMP_DIR (default /tmp)/stacks.PID.N its memory map, then for each
 * thread "=== tid T (comm)" and the frames glibc's backtrace() finds, as
 * "object(symbol+off)[address]".
 *
 * The trigger's handler (whichever thread takes it) writes a byte to a
 * pipe; a helper thread started at load reads it, then signals each thread
 * in turn with SIGRTMIN+6, whose handler writes that thread's frames and
 * says it is done. backtrace() is warmed up at load, so the handler does
 * not load libgcc_s. A test tool only, never linked into the plugin.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DUMP_FRAMES 64

static int dump_fd = -1;
static atomic_int dump_done;

static void on_dump(int sig)
{
	void *frames[DUMP_FRAMES];
	int n = backtrace(frames, DUMP_FRAMES);

	(void)sig;
	backtrace_symbols_fd(frames, n, dump_fd);
	atomic_store(&dump_done, 1);
}

static void copy_file(const char *path, int out)
{
	char buf[4096];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n)
			break;
	close(fd);
}

/* Signal one thread and wait (at most 2 s) for its frames. */
static void dump_thread(pid_t pid, pid_t tid)
{
	char path[64], comm[64] = "?", head[160];
	int fd, n;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", pid, tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		n = (int)read(fd, comm, sizeof(comm) - 1);
		comm[n > 0 ? n - 1 : 0] = 0;
		close(fd);
	}
	n = snprintf(head, sizeof(head), "=== tid %d (%s)\n", tid, comm);
	if (write(dump_fd, head, (size_t)n) != n)
		return;
	atomic_store(&dump_done, 0);
	if (syscall(SYS_tgkill, pid, tid, SIGRTMIN + 6))
		return;
	for (int i = 0; i < 2000 && !atomic_load(&dump_done); i++)
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	if (!atomic_load(&dump_done) && write(dump_fd, "(no answer in 2 s)\n", 19) < 0)
		return;
}

static void dump_all(int seq)
{
	const char *dir = getenv("STACKDUMP_DIR");
	pid_t pid = getpid(), self = (pid_t)syscall(SYS_gettid);
	char path[256];
	DIR *d;
	struct dirent *e;

	snprintf(path, sizeof(path), "%s/stacks.%d.%d", dir ? dir : "/tmp", pid, seq);
	dump_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (dump_fd < 0)
		return;
	copy_file("/proc/self/maps", dump_fd);
	d = opendir("/proc/self/task");
	while (d && (e = readdir(d))) {
		pid_t tid = (pid_t)atoi(e->d_name);

		if (tid > 0 && tid != self)
			dump_thread(pid, tid);
	}
	if (d)
		closedir(d);
	close(dump_fd);
	dump_fd = -1;
}

static int trigger_pipe[2] = { -1, -1 };

static void on_trigger(int sig)
{
	char c = 1;

	(void)sig;
	if (write(trigger_pipe[1], &c, 1) < 0) {
		/* full: a dump is pending anyway */
	}
}

static void *waiter(void *arg)
{
	char c;

	(void)arg;
	for (int seq = 0;; seq++) {
		if (read(trigger_pipe[0], &c, 1) == 1)
			dump_all(seq);
	}
	return NULL;
}

__attribute__((constructor)) static void stackdump_init(void)
{
	struct sigaction sa;
	void *warm[4];
	pthread_t t;

	backtrace(warm, 4);
	if (pipe2(trigger_pipe, O_CLOEXEC))
		return;
	memset(&sa, 0, sizeof(sa));
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_dump;
	sigaction(SIGRTMIN + 6, &sa, NULL);
	sa.sa_handler = on_trigger;
	sigaction(SIGRTMIN + 5, &sa, NULL);
	if (pthread_create(&t, NULL, waiter, NULL) == 0)
		pthread_detach(t);
}
