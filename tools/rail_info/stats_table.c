/* rail-info --stats FILE (tools/rail_info/stats_table.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "stats.h"
#include "stats_table.h"

static void human_bytes(uint64_t b, char *buf, size_t len)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	int u = 0;

	while (v >= 1024.0 && u < 4) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static void us(uint64_t ns, char *buf, size_t len)
{
	if (!ns)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.1f", (double)ns / 1e3);
}

static void header(FILE *out)
{
	fprintf(out, "%-5s %-4s %3s %11s %9s %11s %9s %8s %6s %9s %9s %9s %8s %8s %8s %7s  %s\n",
		"kind", "xprt", "dev", "tx", "tx_msgs", "rx", "rx_msgs", "refused", "errors",
		"p50_us", "p99_us", "max_us", "eager", "cts", "credits", "wants", "connection");
}

static void row(FILE *out, const struct rail_stats_line *l)
{
	const struct rail_stats *s = &l->s;
	char tx[24], rx[24], p50[24], p99[24], mx[24], dev[12];

	human_bytes(s->tx_bytes, tx, sizeof(tx));
	human_bytes(s->rx_bytes, rx, sizeof(rx));
	us(rail_stats_quantile(s, 0.5), p50, sizeof(p50));
	us(rail_stats_quantile(s, 0.99), p99, sizeof(p99));
	us(s->lat_max_ns, mx, sizeof(mx));
	if (l->dev < 0)
		snprintf(dev, sizeof(dev), "-");
	else
		snprintf(dev, sizeof(dev), "%d", l->dev);
	fprintf(out, "%-5s %-4s %3s %11s %9" PRIu64 " %11s %9" PRIu64 " %8" PRIu64 " %6" PRIu64
		" %9s %9s %9s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %7" PRIu64 "  %s\n",
		l->kind, l->transport, dev, tx, s->tx_msgs, rx, s->rx_msgs, s->refused, s->errors,
		p50, p99, mx, s->eager, s->cts, s->credits, s->wants, l->desc);
}

/* A bucket bound: ns below a microsecond, then us, ms, s. */
static void bound(uint64_t ns, char *buf, size_t len)
{
	if (ns < 1000)
		snprintf(buf, len, "%" PRIu64 " ns", ns);
	else if (ns < 1000000)
		snprintf(buf, len, "%.1f us", (double)ns / 1e3);
	else if (ns < 1000000000)
		snprintf(buf, len, "%.1f ms", (double)ns / 1e6);
	else
		snprintf(buf, len, "%.1f s", (double)ns / 1e9);
}

/* The latency histogram of all rows: one line per bucket that has completions. */
static void histogram(FILE *out, const struct rail_stats *all)
{
	uint64_t peak = 0;

	if (!all->lat_n)
		return;
	for (int i = 0; i < RAIL_STATS_HIST; i++)
		if (all->lat_hist[i] > peak)
			peak = all->lat_hist[i];
	fprintf(out, "\ncompletion latency (post to done), all connections above:\n");
	for (int i = 0; i < RAIL_STATS_HIST; i++) {
		char lo[24], hi[24];
		int bar;

		if (!all->lat_hist[i])
			continue;
		bar = (int)(all->lat_hist[i] * 40 / peak);
		bound(i ? 1ull << i : 0, lo, sizeof(lo));
		bound(2ull << i, hi, sizeof(hi));
		fprintf(out, "  %9s - %-9s %10" PRIu64 " %.*s\n", lo, hi, all->lat_hist[i],
			bar ? bar : 1, "########################################");
	}
}

int rail_info_stats(const char *path, FILE *out)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
	struct rail_stats all;
	struct rail_stats_line l;
	char line[4096];
	int rows = 0, bad = 0;

	if (!f) {
		fprintf(stderr, "rail-info: --stats %s: %s\n", path, strerror(errno));
		return 2;
	}
	memset(&all, 0, sizeof(all));
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, "rail-stats v1 "))
			continue;
		if (rail_stats_parse(line, &l)) {
			bad++;
			continue;
		}
		if (!rows++)
			header(out);
		row(out, &l);
		if (strcmp(l.kind, "total"))
			rail_stats_add(&all, &l.s);
	}
	if (f != stdin)
		fclose(f);
	if (bad)
		fprintf(stderr, "rail-info: --stats %s: %d malformed rail-stats lines skipped\n",
			path, bad);
	if (!rows) {
		fprintf(stderr, "rail-info: --stats %s: no \"rail-stats v1\" line (write one with "
			"NCCL_RAIL_STATS=1 or NCCL_RAIL_STATS=/path/%%h.%%p)\n", path);
		return 1;
	}
	histogram(out, &all);
	return 0;
}
