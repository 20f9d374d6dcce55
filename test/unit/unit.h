/*
 * nccl-net-rail unit tests: shared helpers.
 *
 * Include this first in every test/unit/test_*.c: it pulls in what cmocka
 * needs before cmocka.h, and provides a capturing logger that records the
 * lines the core sends through rail_log() so tests can assert on warnings.
 *
 *   unit_log_capture();                 install the logger, clear the record
 *   ... code under test ...
 *   assert_true(unit_log_has(RAIL_LOG_WARN, "NCCL_IB_TIMEOUT"));
 *   unit_log_release();                 back to the stderr logger
 */
#ifndef RAIL_UNIT_H
#define RAIL_UNIT_H

#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "log.h"
#include "nccl_common.h"

/*
 * The build folder of a test binary (build/test/unit/test_x -> build,
 * resolved), or "build" when argv0 names no folder; out holds PATH_MAX.
 */
static inline void unit_build_dir(const char *argv0, char *out, size_t len)
{
	char here[PATH_MAX], *slash;

	snprintf(here, sizeof(here), "%s", argv0);
	for (int up = 0; up < 3 && (slash = strrchr(here, '/')); up++)
		*slash = '\0';
	if (!strrchr(argv0, '/') || len < PATH_MAX || !realpath(here, out))
		snprintf(out, len, "build");
}

#define UNIT_LOG_MAX_LINES 256
#define UNIT_LOG_LINE_LEN 1024

struct unit_log_line {
	int level;
	unsigned long flags;
	char text[UNIT_LOG_LINE_LEN];
};

struct unit_log {
	int n;
	int dropped;
	struct unit_log_line lines[UNIT_LOG_MAX_LINES];
};

/*
 * One record per test binary; the header is included by one file each. The
 * plugin logs from its own threads too (handshake workers, the async
 * thread), as NCCL's logger allows: one lock for writers and readers.
 */
static struct unit_log unit_log_rec;
static pthread_mutex_t unit_log_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void unit_log_reset(void)
{
	pthread_mutex_lock(&unit_log_mu);
	unit_log_rec.n = 0;
	unit_log_rec.dropped = 0;
	pthread_mutex_unlock(&unit_log_mu);
}

/* Has NCCL's logger signature (ncclDebugLogger_t). */
static inline void unit_log_sink(ncclDebugLogLevel level, unsigned long flags, const char *file,
				 int line, const char *fmt, ...)
{
	struct unit_log_line *l;
	va_list ap;

	(void)file;
	(void)line;
	pthread_mutex_lock(&unit_log_mu);
	if (unit_log_rec.n == UNIT_LOG_MAX_LINES) {
		unit_log_rec.dropped++;
		pthread_mutex_unlock(&unit_log_mu);
		return;
	}
	l = &unit_log_rec.lines[unit_log_rec.n++];
	l->level = (int)level;
	l->flags = flags;
	va_start(ap, fmt);
	vsnprintf(l->text, sizeof(l->text), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&unit_log_mu);
}

static inline void unit_log_capture(void)
{
	unit_log_reset();
	rail_log_set_logger((rail_logger_fn)unit_log_sink);
}

static inline void unit_log_release(void)
{
	rail_log_set_logger(NULL);
}

/* Number of captured lines at this level containing every given substring. */
static inline int unit_log_count2(int level, const char *a, const char *b)
{
	int count = 0;

	pthread_mutex_lock(&unit_log_mu);
	for (int i = 0; i < unit_log_rec.n; i++) {
		const struct unit_log_line *l = &unit_log_rec.lines[i];

		if (l->level != level)
			continue;
		if (a && !strstr(l->text, a))
			continue;
		if (b && !strstr(l->text, b))
			continue;
		count++;
	}
	pthread_mutex_unlock(&unit_log_mu);
	return count;
}

static inline int unit_log_count(int level, const char *substr)
{
	return unit_log_count2(level, substr, NULL);
}

static inline int unit_log_has(int level, const char *substr)
{
	return unit_log_count(level, substr) > 0;
}

/* The first captured line at this level containing substr, or NULL. */
static inline const struct unit_log_line *unit_log_find(int level, const char *substr)
{
	const struct unit_log_line *found = NULL;

	pthread_mutex_lock(&unit_log_mu);
	for (int i = 0; i < unit_log_rec.n && !found; i++) {
		const struct unit_log_line *l = &unit_log_rec.lines[i];

		if (l->level == level && (!substr || strstr(l->text, substr)))
			found = l;
	}
	pthread_mutex_unlock(&unit_log_mu);
	return found;
}

/* Print what was captured (call before failing an assertion about logs). */
static inline void unit_log_dump(void)
{
	pthread_mutex_lock(&unit_log_mu);
	for (int i = 0; i < unit_log_rec.n; i++)
		print_message("  captured [%d 0x%lx] %s\n", unit_log_rec.lines[i].level,
			      unit_log_rec.lines[i].flags, unit_log_rec.lines[i].text);
	if (unit_log_rec.dropped)
		print_message("  (%d lines dropped)\n", unit_log_rec.dropped);
	pthread_mutex_unlock(&unit_log_mu);
}

/* Assert that a line at this level contains both substrings, dumping the log if not. */
#define unit_assert_logged2(level, a, b)                                   \
	do {                                                               \
		if (unit_log_count2((level), (a), (b)) == 0) {             \
			unit_log_dump();                                   \
			fail_msg("no level-%d log line containing '%s'%s%s", \
				 (level), (a), (b) ? " and " : "", (b) ? (b) : ""); \
		}                                                          \
	} while (0)
#define unit_assert_logged(level, a) unit_assert_logged2((level), (a), NULL)

/* Unused-variable guard for the static record in files that never capture. */
static inline int unit_log_lines(void)
{
	int n;

	pthread_mutex_lock(&unit_log_mu);
	n = unit_log_rec.n;
	pthread_mutex_unlock(&unit_log_mu);
	return n;
}

/* Threads of this process whose name (/proc/self/task/TID/comm) begins with prefix. */
static inline int unit_threads_named(const char *prefix)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)) != NULL) {
		char path[300], name[32] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (f && fgets(name, sizeof(name), f) && !strncmp(name, prefix, strlen(prefix)))
			n++;
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
	return n;
}

#endif
