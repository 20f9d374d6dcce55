/* nccl-net-rail: RLIMIT_NOFILE raised at init and named in errors (fdlimit.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "fdlimit.h"
#include "log.h"
#include "param.h"
#include "rail.h"

/* fs.nr_open: the most a limit may be, or 1048576 (the kernel's default) when unreadable. */
static rlim_t nr_open(void)
{
	FILE *f = fopen("/proc/sys/fs/nr_open", "r");
	unsigned long v = 0;

	if (f) {
		if (fscanf(f, "%lu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v ? (rlim_t)v : (rlim_t)1048576;
}

int rail_nofile_raise(void)
{
	struct rlimit rl, nl;
	rlim_t want;
	int err;

	if (!rail_param_int(RAIL_P_RAISE_NOFILE))
		return 0;
	if (getrlimit(RLIMIT_NOFILE, &rl))
		return -errno;
	if (rl.rlim_cur == RLIM_INFINITY)
		return 0;
	want = rl.rlim_max == RLIM_INFINITY ? nr_open() : rl.rlim_max;
	if (rl.rlim_cur >= want)
		return 0;
	nl.rlim_cur = want;
	nl.rlim_max = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &nl)) {
		err = -errno;
		RAIL_WARN("setrlimit(RLIMIT_NOFILE, soft %lu -> %lu) failed: %s; the process keeps "
			  "%lu descriptors (ulimit -n)", (unsigned long)rl.rlim_cur,
			  (unsigned long)want, RAIL_ERRSTR(err), (unsigned long)rl.rlim_cur);
		return err;
	}
	RAIL_INFO(RAIL_LOG_INIT, "RLIMIT_NOFILE: soft limit raised from %lu to %lu, the hard "
		  "limit, as NCCL does in its root process: each TCP peer takes several "
		  "descriptors (NCCL_RAIL_RAISE_NOFILE=0 keeps the limit)",
		  (unsigned long)rl.rlim_cur, (unsigned long)want);
	return 0;
}

int rail_nofile_state(long *soft, long *hard, long *open)
{
	struct rlimit rl;
	DIR *d;
	long n = 0;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return -errno;
	*soft = rl.rlim_cur == RLIM_INFINITY ? -1 : (long)rl.rlim_cur;
	*hard = rl.rlim_max == RLIM_INFINITY ? -1 : (long)rl.rlim_max;
	d = opendir("/proc/self/fd");
	if (!d) {
		*open = -1;
		return 0;
	}
	while (readdir(d))
		n++;
	closedir(d);
	*open = n > 3 ? n - 3 : 0;	/* ".", ".." and the directory's own */
	return 0;
}

const char *rail_nofile_hint(char *buf, size_t len)
{
	long soft = -1, hard = -1, open = -1;

	(void)rail_nofile_state(&soft, &hard, &open);
	snprintf(buf, len, "the process has no descriptor left: %ld open, RLIMIT_NOFILE soft "
		 "limit %ld, hard limit %ld (-1: unlimited); a TCP peer takes up to "
		 "2 + NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD descriptors, a verbs peer 2: "
		 "raise the limit (ulimit -n, the container's nofile) or the hard limit the "
		 "plugin raises the soft one to", open, soft, hard);
	return buf;
}
