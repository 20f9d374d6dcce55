/*
 * nccl-net-rail: the process's file descriptor limit (RLIMIT_NOFILE).
 *
 * A TCP peer takes several descriptors (control and data sockets) and a
 * verbs peer two, so a job of hundreds of peers passes the soft limit of
 * 1024 that many containers start with. NCCL raises the soft limit to the
 * hard one in its bootstrap root's process only; the plugin does it in
 * every process, once, at init (NCCL_RAIL_RAISE_NOFILE), and names the
 * limit when a socket or accept fails for want of a descriptor.
 */
#ifndef RAIL_FDLIMIT_H
#define RAIL_FDLIMIT_H

/* Soft limit to the hard one (capped by fs.nr_open), with one INFO line when it moved; 0 or -errno. */
int rail_nofile_raise(void);
/* The soft limit and the descriptors open now; 0 or -errno. */
int rail_nofile_state(long *soft, long *hard, long *open);
/*
 * The text after "failed: Too many open files" for an error of call (a
 * socket, accept, ...) toward peer: the limit, the count open, what the
 * job needs per peer, and the fix; into buf.
 */
const char *rail_nofile_hint(char *buf, size_t len);

#endif
