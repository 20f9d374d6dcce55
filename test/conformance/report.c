/*
 * Conformance suite: what a role tells the supervisor (verdict, stage,
 * notes) and the logger handed to the plugin's init.
 *
 * Reports are single lines written to a pipe ("STAGE ...", "NOTE ...",
 * "RESULT PASS|FAIL|SKIP ...", "KILLME"); each fits in one atomic write.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "conf.h"

#define REPORT_MAX 3072

static char skip_text[512];

static void sup_write(struct rail_conf *cx, const char *kind, const char *text)
{
	char line[REPORT_MAX];
	int n = snprintf(line, sizeof(line), "%s %s", kind, text);

	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line) - 1)
		n = (int)sizeof(line) - 2;
	/* One line per report: newlines inside become spaces. */
	for (int i = 0; i < n; i++) {
		if (line[i] == '\n')
			line[i] = ' ';
	}
	line[n++] = '\n';
	if (cx->sup >= 0 && write(cx->sup, line, (size_t)n) < 0)
		perror("rail-conformance: report");
}

void rail_conf_report(struct rail_conf *cx, const char *verdict, const char *text)
{
	char buf[REPORT_MAX];

	snprintf(buf, sizeof(buf), "%s %s", verdict, text ? text : "");
	sup_write(cx, "RESULT", buf);
}

void rail_conf_fail(struct rail_conf *cx, const char *fmt, ...)
{
	char buf[REPORT_MAX - 64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	rail_conf_report(cx, "FAIL", buf);
	/* No cleanup: the plugin may be in any state; the process is the unit. */
	_exit(1);
}

void rail_conf_skip_reason(struct rail_conf *cx, const char *fmt, ...)
{
	va_list ap;

	(void)cx;
	va_start(ap, fmt);
	vsnprintf(skip_text, sizeof(skip_text), fmt, ap);
	va_end(ap);
}

const char *rail_conf_skip_text(void)
{
	return skip_text;
}

void rail_conf_stage(struct rail_conf *cx, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	sup_write(cx, "STAGE", buf);
}

void rail_conf_note(struct rail_conf *cx, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	sup_write(cx, "NOTE", buf);
}

void rail_conf_expect_kill(struct rail_conf *cx)
{
	sup_write(cx, "KILLME", "-");
}

/* ---- the logger given to init ---- */

#define WARN_KEEP 160	/* room for a flight record (src/flight.h: 64 events) */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_prefix[32] = "[?]";
static int log_info;
static int warn_count;
static int warn_kept;
static char warn_lines[WARN_KEEP][512];

void rail_conf_log_setup(int role, int abi)
{
	const char *dbg = getenv("NCCL_DEBUG");

	snprintf(log_prefix, sizeof(log_prefix), "[%c v%d]", role == RAIL_CONF_ROLE_A ? 'A' : 'B',
		 abi);
	log_info = dbg && (!strcasecmp(dbg, "INFO") || !strcasecmp(dbg, "TRACE"));
}

void rail_conf_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		      const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	(void)flags;
	if (level != NCCL_LOG_WARN && !(log_info && level >= NCCL_LOG_INFO))
		return;
	if (!fmt)
		fmt = "(null format)";
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&log_lock);
	if (level == NCCL_LOG_WARN) {
		warn_count++;
		if (warn_kept < WARN_KEEP)
			snprintf(warn_lines[warn_kept++], sizeof(warn_lines[0]), "%s", msg);
	}
	fprintf(stderr, "%s %s %s:%d %s\n", log_prefix, level == NCCL_LOG_WARN ? "WARN" : "INFO",
		file ? file : "?", line, msg);
	pthread_mutex_unlock(&log_lock);
}

int rail_conf_warn_count(void)
{
	int n;

	pthread_mutex_lock(&log_lock);
	n = warn_count;
	pthread_mutex_unlock(&log_lock);
	return n;
}

int rail_conf_warn_has(const char *const *needles, int n)
{
	int found = 0;

	pthread_mutex_lock(&log_lock);
	for (int i = 0; i < warn_kept && !found; i++) {
		int all = 1;

		for (int j = 0; j < n && all; j++)
			all = strstr(warn_lines[i], needles[j]) != NULL;
		found = all;
	}
	pthread_mutex_unlock(&log_lock);
	return found;
}

void rail_conf_warn_first(char *buf, size_t len)
{
	pthread_mutex_lock(&log_lock);
	snprintf(buf, len, "%s", warn_kept ? warn_lines[0] : "");
	pthread_mutex_unlock(&log_lock);
}

void rail_conf_warn_reset(void)
{
	pthread_mutex_lock(&log_lock);
	warn_count = 0;
	warn_kept = 0;
	pthread_mutex_unlock(&log_lock);
}
