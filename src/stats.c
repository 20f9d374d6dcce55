/* nccl-net-rail: per-connection counters and their summaries (src/stats.h). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "stats.h"

#define STATS_TAG "rail-stats v1 "

/* The summed integer fields of a stats line, in order (then lat_max_ns, hist=). */
#define STATS_SUMS(X) \
	X(tx_bytes) X(tx_msgs) X(rx_bytes) X(rx_msgs) X(flushes) X(refused) X(errors) \
	X(lat_n) X(lat_sum_ns) X(eager) X(cts) X(cts_eager) X(wants) X(credits) X(loops)

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rail_stats stats_total;
static int stats_ncomms;
static FILE *stats_file;
static int stats_file_failed;

uint64_t rail_stats_quantile(const struct rail_stats *s, double q)
{
	uint64_t want, seen = 0;

	if (!s->lat_n)
		return 0;
	want = (uint64_t)(q * (double)s->lat_n + 0.999999);
	if (want < 1)
		want = 1;
	for (int i = 0; i < RAIL_STATS_HIST; i++) {
		seen += s->lat_hist[i];
		if (seen >= want) {
			uint64_t top = i == RAIL_STATS_HIST - 1 ? UINT64_MAX : (2ull << i) - 1;

			return top < s->lat_max_ns ? top : s->lat_max_ns;
		}
	}
	return s->lat_max_ns;
}

void rail_stats_add(struct rail_stats *a, const struct rail_stats *b)
{
#define ADD(f) a->f += b->f;
	STATS_SUMS(ADD)
#undef ADD
	if (b->lat_max_ns > a->lat_max_ns)
		a->lat_max_ns = b->lat_max_ns;
	for (int i = 0; i < RAIL_STATS_HIST; i++)
		a->lat_hist[i] += b->lat_hist[i];
}

static void host_name(char *buf, size_t len)
{
	if (gethostname(buf, len) != 0 || !buf[0])
		rail_strlcpy(buf, "unknown", len);
	buf[len - 1] = '\0';
	for (char *p = buf; *p; p++)
		if (*p == ' ' || *p == '|')
			*p = '_';
}

#define APPEND(...) \
	do { \
		int w_ = snprintf(buf + (off < len ? off : len), off < len ? len - off : 0, \
				  __VA_ARGS__); \
		off += w_ > 0 ? (size_t)w_ : 0; \
	} while (0)

int rail_stats_format(const struct rail_stats *s, const char *kind, const char *transport,
		      int dev, const char *desc, char *buf, size_t len)
{
	char host[64];
	size_t off = 0;
	int first = 1;

	host_name(host, sizeof(host));
	APPEND(STATS_TAG "host=%s pid=%d kind=%s transport=%s dev=%d", host, (int)getpid(),
	       kind, transport, dev);
#define FMT(f) APPEND(" " #f "=%" PRIu64, s->f);
	STATS_SUMS(FMT)
#undef FMT
	APPEND(" lat_max_ns=%" PRIu64 " lat_p50_ns=%" PRIu64 " lat_p99_ns=%" PRIu64 " hist=",
	       s->lat_max_ns, rail_stats_quantile(s, 0.5), rail_stats_quantile(s, 0.99));
	for (int i = 0; i < RAIL_STATS_HIST; i++) {
		if (!s->lat_hist[i])
			continue;
		APPEND("%s%d:%" PRIu64, first ? "" : ",", i, s->lat_hist[i]);
		first = 0;
	}
	if (first)
		APPEND("-");
	APPEND(" | %s", desc ? desc : "");
	return (int)off;
}

static int set_field(struct rail_stats_line *o, const char *key, size_t klen, const char *val)
{
	char *end;
	uint64_t v;

#define KEY(k) (klen == sizeof(k) - 1 && !memcmp(key, k, klen))
	if (KEY("host") || KEY("kind") || KEY("transport")) {
		char *dst = KEY("host") ? o->host : KEY("kind") ? o->kind : o->transport;
		size_t cap = KEY("host") ? sizeof(o->host) : sizeof(o->kind);
		size_t n = strcspn(val, " ");

		if (n >= cap)
			n = cap - 1;
		memcpy(dst, val, n);
		dst[n] = '\0';
		return 0;
	}
	if (KEY("hist")) {
		const char *p = val;

		if (*p == '-')
			return 0;
		while (*p && *p != ' ') {
			unsigned long b = strtoul(p, &end, 10);

			if (end == p || *end != ':' || b >= RAIL_STATS_HIST)
				return -EINVAL;
			p = end + 1;
			o->s.lat_hist[b] = strtoull(p, &end, 10);
			if (end == p)
				return -EINVAL;
			p = *end == ',' ? end + 1 : end;
		}
		return 0;
	}
	v = strtoull(val, &end, 10);
	if (end == val || (*end && *end != ' '))
		return -EINVAL;
	if (KEY("dev"))
		o->dev = (int)v;
	else if (KEY("pid"))
		o->pid = (int)v;
	else if (KEY("lat_max_ns"))
		o->s.lat_max_ns = v;
#define SET(f) else if (KEY(#f)) o->s.f = v;
	STATS_SUMS(SET)
#undef SET
	/* Unknown keys (a newer writer, the printed quantiles) are skipped. */
#undef KEY
	return 0;
}

int rail_stats_parse(const char *line, struct rail_stats_line *out)
{
	const char *p = strstr(line, STATS_TAG);

	if (!p)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	p += strlen(STATS_TAG);
	while (*p && *p != '\n') {
		const char *eq, *tok_end;

		while (*p == ' ')
			p++;
		if (*p == '|') {
			size_t n = strcspn(p + 1 + (p[1] == ' '), "\r\n");

			if (n >= sizeof(out->desc))
				n = sizeof(out->desc) - 1;
			memcpy(out->desc, p + 1 + (p[1] == ' '), n);
			out->desc[n] = '\0';
			break;
		}
		tok_end = p + strcspn(p, " \n");
		eq = memchr(p, '=', (size_t)(tok_end - p));
		if (!eq || set_field(out, p, (size_t)(eq - p), eq + 1))
			return -EINVAL;
		p = tok_end;
	}
	return out->kind[0] ? 0 : -EINVAL;
}

int rail_stats_path(const char *tmpl, char *out, size_t len)
{
	char host[64];
	size_t off = 0;

	host_name(host, sizeof(host));
	for (const char *p = tmpl; *p; p++) {
		char *buf = out;
		int w;

		if (*p == '%' && p[1] == 'h')
			w = snprintf(buf + off, off < len ? len - off : 0, "%s", host);
		else if (*p == '%' && p[1] == 'p')
			w = snprintf(buf + off, off < len ? len - off : 0, "%d", (int)getpid());
		else if (*p == '%' && p[1] == '%')
			w = snprintf(buf + off, off < len ? len - off : 0, "%%");
		else
			w = snprintf(buf + off, off < len ? len - off : 0, "%c", *p);
		if (*p == '%' && (p[1] == 'h' || p[1] == 'p' || p[1] == '%'))
			p++;
		off += w > 0 ? (size_t)w : 0;
		if (off >= len)
			return -ENAMETOOLONG;
	}
	if (off >= len)
		return -ENAMETOOLONG;
	out[off] = '\0';
	return 0;
}

int rail_stats_mode(void)
{
	const char *v = rail_param_str(RAIL_P_STATS);

	if (!v || !v[0] || !strcmp(v, "0"))
		return 0;
	if (!strcmp(v, "1"))
		return 1;
	return 2;
}

/* The file of NCCL_RAIL_STATS, opened at the first summary. Holds stats_lock. */
static FILE *stats_open(void)
{
	char path[4096];
	int err;

	if (stats_file || stats_file_failed)
		return stats_file;
	err = rail_stats_path(rail_param_str(RAIL_P_STATS), path, sizeof(path));
	if (!err) {
		stats_file = fopen(path, "a");
		err = stats_file ? 0 : -errno;
	}
	if (err) {
		stats_file_failed = 1;
		RAIL_WARN("NCCL_RAIL_STATS=%s: opening the stats file failed: %s; connection "
			  "summaries go to the NCCL log (INFO NET) instead. Use a writable path "
			  "(%%h: host, %%p: pid)", rail_param_str(RAIL_P_STATS), RAIL_ERRSTR(err));
	}
	return stats_file;
}

static void stats_emit(const struct rail_stats *s, const char *kind, const char *transport,
		       int dev, const char *desc)
{
	char line[1536];
	int mode = rail_stats_mode();
	FILE *f = mode == 2 ? stats_open() : NULL;

	rail_stats_format(s, kind, transport, dev, desc, line, sizeof(line));
	if (f) {
		fprintf(f, "%s\n", line);
		fflush(f);
	} else {
		RAIL_INFO(RAIL_LOG_NET, "%s", line);
	}
}

void rail_stats_report(const struct rail_stats *s, const char *kind, const char *transport,
		       int dev, const char *desc)
{
	int mode = rail_stats_mode();

	pthread_mutex_lock(&stats_lock);
	rail_stats_add(&stats_total, s);
	stats_ncomms++;
	if (mode)
		stats_emit(s, kind, transport, dev, desc);
	pthread_mutex_unlock(&stats_lock);
}

void rail_stats_finalize(void)
{
	char desc[64];

	pthread_mutex_lock(&stats_lock);
	if (stats_ncomms && rail_stats_mode()) {
		snprintf(desc, sizeof(desc), "%d connections", stats_ncomms);
		stats_emit(&stats_total, "total", "-", -1, desc);
	}
	memset(&stats_total, 0, sizeof(stats_total));
	stats_ncomms = 0;
	if (stats_file)
		fclose(stats_file);
	stats_file = NULL;
	stats_file_failed = 0;
	pthread_mutex_unlock(&stats_lock);
}
