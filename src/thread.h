/*
 * nccl-net-rail: names for the plugin's own threads, as top -H, ps -L,
 * /proc/PID/task/TID/comm and debuggers show them ("rail-" and what the
 * thread does; at most 15 characters, the rest cut).
 */
#ifndef RAIL_THREAD_H
#define RAIL_THREAD_H

/* Name the calling thread (printf format). */
void rail_thread_name(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
