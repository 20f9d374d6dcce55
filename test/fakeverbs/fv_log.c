/*
 * fakeverbs: the call log. RAIL_FAKEVERBS_LOG names a file that gets one
 * line per event, appended and flushed at once so that a test reads it back
 * at any time: "<call> key=value key=value ...". Without the variable
 * nothing is written.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fv.h"

static int log_fd = -1;
static char log_path[4096];

/* Called under fv_lock (ibv_get_device_list, ibv_fork_init): follow the variable. */
void fv_log_reopen(void)
{
	const char *p = getenv("RAIL_FAKEVERBS_LOG");

	if (p && log_fd >= 0 && !strcmp(p, log_path))
		return;
	if (log_fd >= 0)
		close(log_fd);
	log_fd = -1;
	log_path[0] = '\0';
	if (!p || !p[0])
		return;
	log_fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (log_fd < 0) {
		fprintf(stderr, "fakeverbs: cannot open RAIL_FAKEVERBS_LOG=%s\n", p);
		return;
	}
	snprintf(log_path, sizeof(log_path), "%s", p);
}

void fv_log(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n;

	if (log_fd < 0)
		return;
	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(log_fd, line, (size_t)n) != n)
		fprintf(stderr, "fakeverbs: short write to %s\n", log_path);
}
