/* rail-info --stats FILE: the per-connection counters of NCCL_RAIL_STATS as a table. */
#ifndef RAIL_INFO_STATS_TABLE_H
#define RAIL_INFO_STATS_TABLE_H

#include <stdio.h>

/*
 * Read every "rail-stats v1" line of path ("-": standard input; a stats
 * file or an NCCL log) and print a table to out. Returns 0, 1 when no line
 * was found, 2 when the file cannot be read (said on stderr).
 */
int rail_info_stats(const char *path, FILE *out);

#endif
