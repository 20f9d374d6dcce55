/*
 * nccl-net-rail: per-connection counters (NCCL_RAIL_STATS).
 *
 * Every send and receive comm carries a struct rail_stats in its struct
 * rail_comm. The fields are plain integers written only by the thread that
 * drives the comm (NCCL's proxy thread: isend, irecv, test and close are
 * never called concurrently on one comm), so counting costs a few adds and
 * two clock reads per message; nothing else reads them until close. Process
 * totals are added up at close under a lock.
 *
 * A summary is one text line, "rail-stats v1 key=value ... | description",
 * written to the NCCL log (INFO NET) or to a file per process, and read
 * back by rail-info --stats (rail_stats_parse).
 */
#ifndef RAIL_STATS_H
#define RAIL_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Bucket i counts completions taking [2^i, 2^(i+1)) ns (bucket 0 also 0 ns). */
#define RAIL_STATS_HIST 40

struct rail_stats {
	uint64_t tx_bytes, tx_msgs;	/* sends completed: bytes the peer received */
	uint64_t rx_bytes, rx_msgs;	/* receives completed (each buffer of a group counts) */
	uint64_t flushes;
	uint64_t refused;		/* isend/irecv answered "not now" (NCCL retries) */
	uint64_t errors;		/* calls that failed */
	uint64_t lat_n, lat_sum_ns, lat_max_ns;
	uint64_t lat_hist[RAIL_STATS_HIST];	/* post to the test() that said done */
	/* verbs (zero on TCP) */
	uint64_t eager;			/* messages through the eager ring */
	uint64_t cts;			/* clear-to-send answered (sender) or written (receiver) */
	uint64_t cts_eager;		/* ... whose messages all went through the ring */
	uint64_t wants;			/* wants sent (sender) or seen (receiver) */
	uint64_t credits;		/* credit words written */
	uint64_t loops;			/* loopback copies into GPU buffers */
};

/* The bucket of a latency. */
static inline unsigned rail_stats_bucket(uint64_t ns)
{
	unsigned b = ns ? 63u - (unsigned)__builtin_clzll(ns) : 0;

	return b < RAIL_STATS_HIST ? b : RAIL_STATS_HIST - 1;
}

static inline void rail_stats_latency(struct rail_stats *s, uint64_t ns)
{
	s->lat_n++;
	s->lat_sum_ns += ns;
	if (ns > s->lat_max_ns)
		s->lat_max_ns = ns;
	s->lat_hist[rail_stats_bucket(ns)]++;
}

/* The latency below which a fraction q (0..1) of completions fell: a bucket's upper bound. */
uint64_t rail_stats_quantile(const struct rail_stats *s, double q);
/* Add b into a. */
void rail_stats_add(struct rail_stats *a, const struct rail_stats *b);

/*
 * One summary line (no newline): "rail-stats v1 kind=send ... | desc".
 * kind is "send", "recv" or "total"; desc may be empty. Returns the length
 * (truncated at len like snprintf).
 */
int rail_stats_format(const struct rail_stats *s, const char *kind, const char *transport,
		      int dev, const char *desc, char *buf, size_t len);

/* Parse a line holding "rail-stats v1 ..." anywhere (a log line too): 0, or -EINVAL. */
struct rail_stats_line {
	struct rail_stats s;
	char kind[16];
	char transport[16];
	int dev;
	char host[64];
	int pid;
	char desc[256];
};
int rail_stats_parse(const char *line, struct rail_stats_line *out);

/* Expand %h (host name) and %p (pid) and %% in a path template: 0 or -ENAMETOOLONG. */
int rail_stats_path(const char *tmpl, char *out, size_t len);

/*
 * Report a comm's counters at close, as NCCL_RAIL_STATS asks (0: nothing,
 * 1: the NCCL log, otherwise a file), and add them to the process total.
 */
void rail_stats_report(const struct rail_stats *s, const char *kind, const char *transport,
		       int dev, const char *desc);
/* Report the process total (if any comm was reported) and close the file. */
void rail_stats_finalize(void);
/* The mode of NCCL_RAIL_STATS: 0 off, 1 log, 2 file. */
int rail_stats_mode(void);

#endif
