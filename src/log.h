/*
 * nccl-net-rail: logging through NCCL's logger, prefix "NET/Rail".
 *
 * Levels and subsystem flags have NCCL's values. Without an NCCL logger
 * (tools, unit tests) lines go to stderr, filtered by NCCL_DEBUG.
 */
#ifndef RAIL_LOG_H
#define RAIL_LOG_H

enum rail_log_level {
	RAIL_LOG_NONE = 0,
	RAIL_LOG_VERSION = 1,
	RAIL_LOG_WARN = 2,
	RAIL_LOG_INFO = 3,
	RAIL_LOG_ABORT = 4,
	RAIL_LOG_TRACE = 5,
};

/* Subsystem flags (NCCL_INIT, NCCL_NET, NCCL_ENV). */
#define RAIL_LOG_INIT 0x1ul
#define RAIL_LOG_NET 0x10ul
#define RAIL_LOG_ENV 0x80ul

/* The logger NCCL hands to init(), as an opaque function pointer. */
typedef void (*rail_logger_fn)(void);

void rail_log_set_logger(rail_logger_fn fn);
/* For programs without NCCL: print to stderr at or below this level. */
void rail_log_set_stderr_level(int level);
/* The level lines are printed at (for the stderr logger). */
int rail_log_level(void);

void rail_log(int level, unsigned long flags, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

/*
 * A line a flood repeats (one per stray connection): the first of each
 * minute is a WARN, the others INFO. rail_log_flood() takes one event at
 * now_ns and returns RAIL_LOG_WARN or RAIL_LOG_INFO; *before is how many
 * came at INFO in the minute that ended (0 but on a new minute's WARN).
 */
struct rail_log_flood {
	_Atomic unsigned long long start_ns;	/* the minute's first event; 0: none yet */
	_Atomic unsigned long n;		/* events in that minute */
};
#define RAIL_LOG_FLOOD_NS 60000000000ull
int rail_log_flood(struct rail_log_flood *f, unsigned long long now_ns, unsigned long *before);

#define RAIL_WARN(fmt, ...) \
	rail_log(RAIL_LOG_WARN, RAIL_LOG_NET, __FILE__, __LINE__, fmt, ##__VA_ARGS__)
#define RAIL_INFO(flags, fmt, ...) \
	rail_log(RAIL_LOG_INFO, (flags), __FILE__, __LINE__, fmt, ##__VA_ARGS__)
#ifdef RAIL_ENABLE_TRACE
#define RAIL_TRACE(fmt, ...) \
	rail_log(RAIL_LOG_TRACE, RAIL_LOG_NET, __FILE__, __LINE__, fmt, ##__VA_ARGS__)
#else
#define RAIL_TRACE(fmt, ...) \
	do {                 \
	} while (0)
#endif

#endif
