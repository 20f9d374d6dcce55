/*
 * rail-check's parts: what each process tells the others about itself
 * (check_info.c) and the verdict and report (check_report.c), here in the
 * core library so the unit tests reach them; the rendezvous and the framed
 * control messages (tools/rail_check/meet.c) and the test of one device
 * pair through the plugin's API (tools/rail_check/pair.c) in the tool.
 */
#ifndef RAIL_CHECK_H
#define RAIL_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nccl_common.h"
#include "sock.h"

#define RAIL_CK_MAX_RANKS 64
#define RAIL_CK_MAX_DEVS 16
#define RAIL_CK_MAX_CONF 24
#define RAIL_CK_WHY 512

/* Exit status. */
enum { RAIL_CK_EXIT_OK = 0, RAIL_CK_EXIT_FAIL = 1, RAIL_CK_EXIT_SETUP = 2 };

struct rail_ck_opts {
	const char *server;	/* --server [ADDR:]PORT */
	const char *connect;	/* --connect HOST:PORT */
	const char *rendezvous;	/* --rendezvous HOST:PORT with the launcher's rank */
	int ranks;		/* processes in all */
	int env_rank;		/* from the launcher, -1 without */
	int all_pairs;
	int expect_devs;	/* --expect-devices: each process must have this many, 0 any */
	int routed;		/* subnets may differ (a routed RoCE v2 / IB fabric) */
	int json;
	int verbose;
	double timeout;		/* per step */
	double meet_timeout;	/* waiting for the peers */
	int lat_iters;
	size_t bw_bytes, bw_msg;
	const char *hook;	/* test aid: run after the peers met */
	const char *svg;	/* --svg FILE: the report as a heatmap (the first process) */
};

struct rail_ck_dev {
	char name[64];		/* "mlx5_0:1", "eth0" */
	int port;
	char link[16];		/* "InfiniBand", "RoCE", "Ethernet" (TCP) */
	char gid[64];		/* GID text (verbs) or IP address (TCP) */
	int gid_index;		/* -1: none (TCP) */
	char gid_type[16];	/* "RoCEv2", "RoCEv1", "IB", "IP" */
	char subnet[64];	/* "192.0.2.0/24", "fe80:0:0:0/64 prefix", "" unknown */
	int mtu;		/* bytes, 0 unknown */
	int speed;		/* Mbps */
};

struct rail_ck_conf {
	char name[40];
	char value[64];
};

struct rail_ck_info {
	int rank;
	int want_rank;		/* from the launcher, -1 none */
	char host[64];
	char version[32];
	char transport[16];	/* "" when the plugin did not start */
	char why[RAIL_CK_WHY];	/* the transport's reason, or why the plugin did not start */
	int wire_handle, wire_tcp, wire_ib;
	int nconf;
	struct rail_ck_conf conf[RAIL_CK_MAX_CONF];
	int ndev;
	struct rail_ck_dev dev[RAIL_CK_MAX_DEVS];
	char ctrl_host[RAIL_ADDR_STRLEN];	/* pair control address ("" = the hub's) */
	int ctrl_port;
};

/* ---- check_info.c ---- */
/* The plugin's state after rail_net_init (err: its result, 0 on success). */
void rail_ck_info_local(struct rail_ck_info *me, int init_ok, const char *init_why);
/* Text form (lines of tab-separated fields); returns the length, or -1 if too long. */
int rail_ck_info_encode(const struct rail_ck_info *in, char *buf, size_t len);
/* 0, or -1 with why (the bytes came from a peer). */
int rail_ck_info_decode(const char *buf, size_t len, struct rail_ck_info *out, char *why,
			size_t why_len);
/* The value of one setting in info, or NULL. */
const char *rail_ck_conf_get(const struct rail_ck_info *in, const char *name);

/* ---- tools/rail_check/meet.c: framed control messages ---- */
enum rail_ck_msg_type {
	RAIL_CK_MSG_INFO = 1,	/* process -> hub: its info */
	RAIL_CK_MSG_ALL = 2,		/* hub -> process: its rank, then every info */
	RAIL_CK_MSG_PAIR = 3,	/* pair control: the connecting side's rank */
	RAIL_CK_MSG_HANDLE = 4,	/* pair: a listen handle */
	RAIL_CK_MSG_STATUS = 5,	/* pair: a step's outcome */
	RAIL_CK_MSG_RESULT = 6,	/* process -> hub: its rows */
	RAIL_CK_MSG_FINAL = 7,	/* hub -> process: the exit status */
	RAIL_CK_MSG_GO = 8,		/* hub -> process: start the pair tests */
};
#define RAIL_CK_MSG_MAX (16u << 20)

/* 0, -ETIMEDOUT, or -errno (-RAIL_ECLOSED: the peer closed). */
int rail_ck_msg_send(int fd, int type, const void *buf, size_t len, uint64_t deadline);
/* Receives one message of type into buf (NUL-terminated, len - 1 bytes at most). */
int rail_ck_msg_recv(int fd, int type, char *buf, size_t len, size_t *got, uint64_t deadline);
uint64_t rail_ck_deadline(double seconds);

struct rail_ck_meet {
	int hub_fd;		/* process: the connection to the hub; -1 on the hub */
	int fds[RAIL_CK_MAX_RANKS];	/* hub: the connection to each rank (fds[0] = -1) */
	int ctrl_lfd;		/* pair control listener */
	int pair_fd[RAIL_CK_MAX_RANKS]; /* pair control connections by rank, -1 none */
	char hub_host[256];	/* the hub's address as this process reached it */
	int nranks;
	int rank;
	struct rail_ck_info *all;	/* nranks entries */
};

/* Meet the others: 0, or -1 after a message (a setup error). */
int rail_ck_meet(const struct rail_ck_opts *o, struct rail_ck_info *me, struct rail_ck_meet *m);
/* The pair control connection to rank peer (lower rank listens). -1 after a message. */
int rail_ck_pair_fd(struct rail_ck_meet *m, int peer, uint64_t deadline);
void rail_ck_meet_close(struct rail_ck_meet *m);

/* ---- tools/rail_check/pair.c ---- */
struct rail_ck_cell {
	int ra, da, rb, db;	/* row: rank ra device da; column: rank rb device db */
	int tested;
	int ok;
	double lat_us;		/* median half round trip */
	double bw;		/* GB/s from the row to the column */
	char step[32];		/* the step that failed */
	char why[2 * RAIL_CK_WHY];	/* this side's reason and the peer's */
};

/* The logger handed to the plugin: keeps its last warning (for failure reasons). */
void rail_ck_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		    const char *fmt, ...);
/* The last warning the plugin logged since the last call ("" none), and forget it. */
void rail_ck_last_warning(char *buf, size_t len);
extern int rail_ck_verbose;
/* snprintf into buf at its current end (truncating quietly). */
__attribute__((format(printf, 3, 4)))
void rail_ck_catf(char *buf, size_t len, const char *fmt, ...);

/*
 * Test device `mine` against the peer's device `theirs` over the pair control
 * connection fd; both sides call it in the same order. Fills *cell (this
 * side's row). Returns -1 only when the control connection itself is lost.
 */
int rail_ck_pair_test(const struct rail_ck_opts *o, void *ctx, int fd, int role, int mine,
		      int theirs, struct rail_ck_cell *cell);

/* ---- check_report.c ---- */
struct rail_ck_problem {
	int fatal;		/* 1: a failure, 0: a note */
	char what[32];		/* "version", "config", "transport", "plugin", "rail", "lost" */
	char text[2 * RAIL_CK_WHY];
};

struct rail_ck_report {
	int nranks;
	const struct rail_ck_info *all;
	int ncells;
	struct rail_ck_cell *cells;
	int nprobs;
	struct rail_ck_problem probs[4 * RAIL_CK_MAX_RANKS + 16];
	int nfail;		/* failed cells + fatal problems */
};
/* A problem for the list (fatal or a note). */
__attribute__((format(printf, 4, 5)))
void rail_ck_problem(struct rail_ck_report *r, int fatal, const char *what, const char *fmt, ...);
/* Static checks (version, configuration, GID type, subnet, MTU); marks cells failed. */
void rail_ck_static_checks(struct rail_ck_report *r, const struct rail_ck_opts *o);
void rail_ck_print_text(const struct rail_ck_report *r, FILE *out);
void rail_ck_print_json(const struct rail_ck_report *r, FILE *out);
/* "host:dev", or "host#rank:dev" when several processes share the host name; dev < 0: the host. */
const char *rail_ck_label(const struct rail_ck_report *r, int rank, int dev, char *buf,
			  size_t len);
/* The GID (or address) of a device, "-" none, "?" no such device. */
const char *rail_ck_gid(const struct rail_ck_report *r, int rank, int dev);
/* What to try after a failed step. */
const char *rail_ck_hint(const char *step);
/*
 * ---- check_svg.c ----
 * The report as a self-contained SVG heatmap: one cell per tested device pair,
 * coloured by bandwidth and, in a second panel, by latency; rails as blocks;
 * failing pairs crossed out in red and listed with the reason. The same
 * report gives the same bytes. 0, or -1 when out of memory or writing failed.
 */
int rail_ck_print_svg(const struct rail_ck_report *r, FILE *out);
/* Cells as text lines and back (process -> hub); decode returns the count or -1. */
int rail_ck_cells_encode(const struct rail_ck_cell *c, int n, char *buf, size_t len);
int rail_ck_cells_decode(const char *buf, struct rail_ck_cell *c, int max);

#endif
