/* nccl-net-rail: the wrapper over NCCL's logger. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "log.h"
#include "nccl_common.h"

static _Atomic(ncclDebugLogger_t) rail_logger;
static int rail_stderr_level = -1;

void rail_log_set_logger(rail_logger_fn fn)
{
	atomic_store(&rail_logger, (ncclDebugLogger_t)fn);
}

static int level_from_env(void)
{
	const char *v = getenv("NCCL_DEBUG");

	if (!v)
		return RAIL_LOG_WARN;
	if (!strcasecmp(v, "VERSION"))
		return RAIL_LOG_VERSION;
	if (!strcasecmp(v, "INFO"))
		return RAIL_LOG_INFO;
	if (!strcasecmp(v, "TRACE"))
		return RAIL_LOG_TRACE;
	if (!strcasecmp(v, "NONE"))
		return RAIL_LOG_NONE;
	return RAIL_LOG_WARN;
}

void rail_log_set_stderr_level(int level)
{
	rail_stderr_level = level;
}

int rail_log_level(void)
{
	if (rail_stderr_level < 0)
		rail_stderr_level = level_from_env();
	return rail_stderr_level;
}

void rail_log(int level, unsigned long flags, const char *file, int line, const char *fmt, ...)
{
	ncclDebugLogger_t logger = atomic_load(&rail_logger);
	char msg[1024];
	va_list ap;
	int n;

	if (!logger && level > rail_log_level())
		return;
	n = snprintf(msg, sizeof(msg), "NET/Rail : ");
	va_start(ap, fmt);
	vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
	va_end(ap);
	if (logger) {
		logger((ncclDebugLogLevel)level, flags, file, line, "%s", msg);
		return;
	}
	fprintf(stderr, "%s%s\n", level == RAIL_LOG_WARN ? "WARN " : "", msg);
}

int rail_log_flood(struct rail_log_flood *f, unsigned long long now_ns, unsigned long *before)
{
	unsigned long long start = atomic_load(&f->start_ns);

	*before = 0;
	if (start && now_ns - start < RAIL_LOG_FLOOD_NS) {
		atomic_fetch_add(&f->n, 1);
		return RAIL_LOG_INFO;
	}
	/* a new minute: one caller wins it and says how many the last one had */
	if (!atomic_compare_exchange_strong(&f->start_ns, &start, now_ns)) {
		atomic_fetch_add(&f->n, 1);
		return RAIL_LOG_INFO;
	}
	*before = atomic_exchange(&f->n, 1);
	*before = *before ? *before - 1 : 0;	/* the old minute's WARN was its first */
	return RAIL_LOG_WARN;
}
