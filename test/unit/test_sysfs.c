/*
 * Unit tests of the sysfs reader (src/sysfs.c) on hostile roots: a FIFO or
 * another special file where an attribute should be must be refused with a
 * named error at once, never block (NCCL_RAIL_SYSFS_ROOT or rail-info
 * --sysfs-root pointing at a damaged copy).
 */
#include "unit.h"

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rail.h"
#include "sysfs.h"

static char root[64];

static int setup(void **state)
{
	char p[256];
	FILE *f;

	(void)state;
	snprintf(root, sizeof(root), "/tmp/rail-sysfs-XXXXXX");
	if (!mkdtemp(root))
		return -1;
	snprintf(p, sizeof(p), "mkdir -p %s/sys/class/net/eth0/dir", root);
	if (system(p))
		return -1;
	snprintf(p, sizeof(p), "%s/sys/class/net/eth0/speed", root);
	if (mkfifo(p, 0600))
		return -1;
	snprintf(p, sizeof(p), "%s/sys/class/net/eth0/mtu", root);
	f = fopen(p, "w");
	if (!f)
		return -1;
	fputs("1500\n", f);
	fclose(f);
	rail_sysfs_set_root(root);
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	rail_sysfs_set_root(NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	return system(cmd) ? -1 : 0;
}

/* Read in a child with a 5 s alarm: the result, or a hang reported as such. */
static int read_in_child(const char *path)
{
	int status = 0;
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		char buf[64];
		int n;

		alarm(5);
		unit_log_capture();
		n = rail_sysfs_read(path, buf, sizeof(buf));
		if (n >= 0)
			_exit(100);
		/* The refusal names the path and says what it is. */
		if (!unit_log_has(RAIL_LOG_WARN, "speed") || !unit_log_has(RAIL_LOG_WARN, "FIFO"))
			_exit(101);
		_exit(-n < 100 ? -n : 99);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (WIFSIGNALED(status))
		fail_msg("reading %s: killed by signal %d (SIGALRM: blocked for 5 s)", path,
			 WTERMSIG(status));
	return WEXITSTATUS(status);
}

static void test_fifo_refused(void **state)
{
	int rc;

	(void)state;
	rc = read_in_child("/sys/class/net/eth0/speed");
	if (rc == 100)
		fail_msg("reading a FIFO succeeded");
	if (rc == 101)
		fail_msg("reading a FIFO failed without a WARN naming the path and 'FIFO'");
	assert_int_equal(rc, EINVAL);
}

static void test_regular_and_dir(void **state)
{
	char buf[64];
	long v = 0;

	(void)state;
	assert_int_equal(rail_sysfs_read_long("/sys/class/net/eth0/mtu", &v), 0);
	assert_int_equal(v, 1500);
	/* A directory fails with EISDIR, as snapshots of unreadable attributes rely on. */
	assert_int_equal(rail_sysfs_read("/sys/class/net/eth0/dir", buf, sizeof(buf)), -EISDIR);
	assert_int_equal(rail_sysfs_read("/sys/class/net/eth0/none", buf, sizeof(buf)), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fifo_refused),
		cmocka_unit_test(test_regular_and_dir),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
