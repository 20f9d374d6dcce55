/*
 * nccl-net-rail conformance suite: shared declarations.
 *
 * The suite loads a net plugin with dlopen() exactly as NCCL does and
 * drives it only through the exported ncclNetPlugin_vN tables, from two
 * processes ("role A" and "role B", two nodes) connected by a control
 * socketpair. A supervisor process forks the two roles for every
 * (scenario, ABI) pair, enforces the timeout and prints the verdict.
 * Nothing here knows the plugin's internals: it must pass against any
 * transport (TCP over loopback, verbs over Soft-RoCE).
 */
#ifndef RAIL_CONF_H
#define RAIL_CONF_H

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl_common.h"

#define RAIL_CONF_ABI_MIN 6
#define RAIL_CONF_ABI_MAX 12
#define RAIL_CONF_MAX_RECVS 8		/* the ABI's limit on grouped receives */
#define RAIL_CONF_MAX_VDEVS 8
#define RAIL_CONF_GUARD 256		/* poison bytes checked after every receive */
#define RAIL_CONF_KIB ((size_t)1 << 10)
#define RAIL_CONF_MIB ((size_t)1 << 20)
#define RAIL_CONF_GIB ((size_t)1 << 30)

#define RAIL_CONF_NORETURN __attribute__((noreturn))
#define RAIL_CONF_PRINTF(a, b) __attribute__((format(printf, a, b)))

enum rail_conf_role { RAIL_CONF_ROLE_A = 0, RAIL_CONF_ROLE_B = 1 };

/* ---- ABI adapter (abi.c) ---------------------------------------------- */

/* Properties of every version in one struct; fields a version lacks stay -1/0. */
struct rail_conf_props {
	char name[256];
	int has_pci;
	char pci_path[1024];
	uint64_t guid;
	int ptr_support;
	int reg_is_global;		/* v8+ */
	int force_flush;		/* v9+ */
	int speed;
	int port;
	float latency;
	int max_comms;
	int max_recvs;
	int dev_type;			/* v7+ */
	int dev_version;		/* v7+ */
	int vndevs;			/* v9+ */
	int vdevs[RAIL_CONF_MAX_VDEVS];
	size_t max_p2p_bytes;		/* v9+ */
	size_t max_coll_bytes;		/* v9+ */
	int max_multi_request_size;	/* v11+ */
	int rail_id;			/* v12 */
	int plane_id;			/* v12 */
};

/*
 * One version-neutral signature set. Each entry is a thin wrapper that calls
 * the vN table with the vN signature (int sizes, config, ctx, ...).
 */
struct rail_conf_net {
	int abi;
	const char *name;		/* the table's name field */
	const void *table;
	void *ctx;			/* v11+: init's context */
	int has_make_vdevice;
	int has_finalize;
	int has_reg_mr_dmabuf;
	ncclResult_t (*init)(struct rail_conf_net *net, ncclDebugLogger_t logger);
	ncclResult_t (*devices)(int *ndev);
	ncclResult_t (*get_props)(int dev, struct rail_conf_props *props);
	/* The table's getProperties as is: misuse checks pass NULL. */
	ncclResult_t (*get_props_raw)(int dev, void *props);
	ncclResult_t (*listen)(struct rail_conf_net *net, int dev, void *handle, void **lc);
	/* *dev_comm receives what the plugin put in the device-handle slot (v7+). */
	ncclResult_t (*connect)(struct rail_conf_net *net, int dev, void *handle, void **sc,
				void **dev_comm);
	ncclResult_t (*accept)(void *lc, void **rc, void **dev_comm);
	ncclResult_t (*reg_mr)(void *comm, void *data, size_t size, int type, void **mh);
	ncclResult_t (*dereg_mr)(void *comm, void *mh);
	ncclResult_t (*isend)(void *sc, void *data, size_t size, int tag, void *mh, void **req);
	ncclResult_t (*irecv)(void *rc, int n, void **data, size_t *sizes, int *tags,
			      void **mh, void **req);
	ncclResult_t (*iflush)(void *rc, int n, void **data, int *sizes, void **mh, void **req);
	ncclResult_t (*test)(void *req, int *done, int *sizes);
	ncclResult_t (*close_send)(void *sc);
	ncclResult_t (*close_recv)(void *rc);
	ncclResult_t (*close_listen)(void *lc);
	ncclResult_t (*make_vdevice)(int *d, int ndevs, const int *devs);
	ncclResult_t (*finalize)(void *ctx);
	/* v10+: isend/irecv with profiler parent handles; NULL below v10. */
	ncclResult_t (*isend_ph)(void *sc, void *data, size_t size, int tag, void *mh, void *ph,
				 void **req);
	ncclResult_t (*irecv_ph)(void *rc, int n, void **data, size_t *sizes, int *tags,
				 void **mh, void **ph, void **req);
	/* A second context (v11+: one per NCCL communicator); NULL below v11. */
	ncclResult_t (*init_ctx)(void **ctx, uint64_t comm_id, ncclDebugLogger_t logger);
	ncclResult_t (*listen_ctx)(void *ctx, int dev, void *handle, void **lc);
	ncclResult_t (*connect_ctx)(void *ctx, int dev, void *handle, void **sc, void **dev_comm);
};

/* Look up ncclNetPlugin_v<abi> in lib and bind net to it. 0, or -1 with why. */
int rail_conf_bind(void *lib, int abi, struct rail_conf_net *net, char *why, size_t len);
/* Fault injection (inject.c): wraps a bound table; "none" turns it off. */
int rail_conf_inject_set(const char *name);
void rail_conf_inject_apply(struct rail_conf_net *net);
void rail_conf_inject_list(FILE *f);

/*
 * The profiler callback every v10+ init passes is the suite's own; it
 * forwards to this hook when set (the profiler scenario), else records
 * nothing and sets no event handle, as NCCL does with no profiler loaded.
 */
extern ncclProfilerCallback_t rail_conf_prof_hook;

/* The maximum vProps members of an ABI (4 for v9-v11, 8 for v12). */
int rail_conf_abi_max_vdevs(int abi);
const char *rail_conf_result_str(ncclResult_t res);

/* ---- options ----------------------------------------------------------- */

struct rail_conf_opts {
	const char *plugin;
	int abi;			/* 0: all found */
	int dev_a, dev_b;
	int nfuse;
	int fuse[RAIL_CONF_MAX_VDEVS];
	size_t max_size;
	const char *scenario;
	int timeout;			/* seconds per scenario */
	int full;			/* heavy settings on every ABI */
	int verbose;
	const char *inject;		/* a fault to inject (see inject.c) */
	int self_test;
	/* Two hosts (--ctl-listen / --ctl-connect): this process runs one role. */
	int host_role;			/* -1: both roles here (fork); else the role */
	const char *ctl_addr;		/* [ADDR:]PORT to listen on, or HOST:PORT */
	int doomed;			/* peer-dies on two hosts: the role killed, -1 */
	const char *event_file;		/* READY/ERROR lines for the harness */
};

/* ---- the per-process context (one role of one scenario) ---------------- */

struct rail_conf {
	const struct rail_conf_opts *opts;
	const struct rail_conf_scenario *scn;
	int scn_id;
	int role;
	int abi;
	int full;			/* heavy settings for this ABI */
	int ctl;			/* control socket to the peer role */
	int ctl_stream;			/* ctl is a TCP stream (two hosts) */
	int sup;			/* report pipe to the supervisor */
	void *lib;
	struct rail_conf_net net;
	int dev;			/* the device this role uses */
	uint64_t start_ns;
	uint64_t deadline_ns;		/* fail with a reason before the supervisor kills */
	uint64_t call_limit_ns;		/* longest connect/accept/listen call allowed */
	int peer_pid;
};

/* ---- scenarios ---------------------------------------------------------- */

struct rail_conf_scenario {
	const char *name;
	const char *doc;
	/* 0 pass, 1 skip (reason set with rail_conf_skip_reason). Failures exit. */
	int (*run)(struct rail_conf *cx);
	int allow_warn;			/* the scenario provokes errors */
	int own_load;			/* the scenario dlopens the plugin itself */
	int min_abi;
	const char *env;		/* NAME=VALUE set in both roles before the plugin loads */
};

extern const struct rail_conf_scenario rail_conf_scenarios[];
extern const int rail_conf_nscenarios;

int rail_conf_properties(struct rail_conf *cx);
int rail_conf_nonblocking_connect(struct rail_conf *cx);
int rail_conf_sizes(struct rail_conf *cx);
int rail_conf_recv_larger(struct rail_conf *cx);
int rail_conf_send_larger(struct rail_conf *cx);
int rail_conf_iflush(struct rail_conf *cx);
int rail_conf_failover_loop(struct rail_conf *cx);
int rail_conf_inflight32(struct rail_conf *cx);
int rail_conf_grouped_recv(struct rail_conf *cx);
int rail_conf_many_comms(struct rail_conf *cx);
int rail_conf_bidirectional(struct rail_conf *cx);
int rail_conf_listen_many(struct rail_conf *cx);
int rail_conf_regmr_thread(struct rail_conf *cx);
int rail_conf_close_inflight(struct rail_conf *cx);
int rail_conf_peer_dies(struct rail_conf *cx);
int rail_conf_peer_stops(struct rail_conf *cx);
int rail_conf_bad_handle(struct rail_conf *cx);
int rail_conf_reload(struct rail_conf *cx);
int rail_conf_misuse(struct rail_conf *cx);
int rail_conf_misuse_closed(struct rail_conf *cx);
int rail_conf_random_handle(struct rail_conf *cx);
int rail_conf_finalize_open(struct rail_conf *cx);
int rail_conf_profiler(struct rail_conf *cx);
/* peer-dies across two hosts: the harness kills (or unplugs) a host (sc_twohost.c). */
int rail_conf_peer_dies_2h(struct rail_conf *cx);

/* ---- two hosts (twohost.c) ------------------------------------------------ */

/* Role A: the listening socket for the peer host's control connections. -1 with why. */
int rail_conf_2h_listen(const char *addr, char *why, size_t len);
/*
 * One control connection for one (scenario, ABI): A accepts on lfd, B
 * connects to addr (retrying while refused); both check that the peer runs
 * the same scenario and ABI. The connected fd, or -1 with why.
 */
int rail_conf_2h_pair(const struct rail_conf_opts *o, int lfd, const char *scenario, int abi,
		      char *why, size_t len);
/* Append one line to --event-file (READY, ERROR ...), with this role's elapsed time. */
void rail_conf_event(struct rail_conf *cx, const char *fmt, ...) RAIL_CONF_PRINTF(2, 3);

/* ---- reporting (report.c) ------------------------------------------------ */

/* Report a failure to the supervisor and _exit(). */
RAIL_CONF_NORETURN void rail_conf_fail(struct rail_conf *cx, const char *fmt, ...)
	RAIL_CONF_PRINTF(2, 3);
void rail_conf_skip_reason(struct rail_conf *cx, const char *fmt, ...) RAIL_CONF_PRINTF(2, 3);
/* Where this role is, shown if the scenario times out. */
void rail_conf_stage(struct rail_conf *cx, const char *fmt, ...) RAIL_CONF_PRINTF(2, 3);
/* A remark printed with the verdict. */
void rail_conf_note(struct rail_conf *cx, const char *fmt, ...) RAIL_CONF_PRINTF(2, 3);
/* Tell the supervisor this role is about to be killed on purpose. */
void rail_conf_expect_kill(struct rail_conf *cx);
void rail_conf_report(struct rail_conf *cx, const char *verdict, const char *text);
const char *rail_conf_skip_text(void);

#define RAIL_CONF_CHECK(cx, cond, ...)                  \
	do {                                            \
		if (!(cond))                            \
			rail_conf_fail((cx), __VA_ARGS__); \
	} while (0)

/* A plugin call that must return ncclSuccess. */
#define RAIL_CONF_CALL(cx, call, what)                                                   \
	do {                                                                             \
		ncclResult_t res_ = (call);                                              \
		if (res_ != ncclSuccess)                                                 \
			rail_conf_fail((cx), "%s returned %s", (what),                  \
				       rail_conf_result_str(res_));                      \
	} while (0)

/* ---- logger (report.c) ---------------------------------------------------- */

void rail_conf_log_setup(int role, int abi);
void rail_conf_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
		      const char *fmt, ...);
int rail_conf_warn_count(void);
/* Does a WARN since the last reset contain every one of the strings? */
int rail_conf_warn_has(const char *const *needles, int n);
/* The first WARN line seen, for messages. */
void rail_conf_warn_first(char *buf, size_t len);
void rail_conf_warn_reset(void);

/* ---- control channel (ctl.c) ------------------------------------------------ */

enum rail_conf_msg {
	RAIL_CONF_MSG_HANDLE = 1,
	RAIL_CONF_MSG_BARRIER,
	RAIL_CONF_MSG_INT,
	RAIL_CONF_MSG_DONE,
	RAIL_CONF_MSG_PID,
	RAIL_CONF_MSG_BLOB,
};

void rail_conf_ctl_send(struct rail_conf *cx, int type, const void *buf, size_t len);
/* Waits until the deadline; a different type or an early EOF fails. Returns the length. */
size_t rail_conf_ctl_recv(struct rail_conf *cx, int type, void *buf, size_t len);
/* Non-blocking: 1 and the message if one of `type` is waiting, 0 if none. */
int rail_conf_ctl_poll(struct rail_conf *cx, int type, void *buf, size_t len);
void rail_conf_barrier(struct rail_conf *cx, const char *name);
/* Both roles call it; returns the peer's value. */
int64_t rail_conf_xchg(struct rail_conf *cx, int64_t mine);

/* ---- time and misc (util.c) ---------------------------------------------- */

uint64_t rail_conf_now_ns(void);
void rail_conf_sleep_ms(int ms);
int rail_conf_expired(const struct rail_conf *cx);
const char *rail_conf_size_str(size_t size, char *buf, size_t len);
int rail_conf_parse_size(const char *s, size_t *out);
uint64_t rail_conf_mix64(uint64_t x);
/* A seed for the pattern of (stream, message, part) in this scenario/ABI. */
uint64_t rail_conf_seed(const struct rail_conf *cx, unsigned stream, unsigned msg, unsigned part);
int rail_conf_count_dir(const char *path);
void rail_conf_list_fds(char *buf, size_t len);

/* ---- memory and patterns (buf.c) ----------------------------------------- */

/* One host buffer registered on one comm, carved into slices with guards. */
struct rail_conf_arena {
	uint8_t *base;
	size_t len;
	size_t used;
	void *comm;
	void *mh;
};

/* Room one slice of `size` bytes takes (guard and alignment included). */
size_t rail_conf_slice_room(size_t size);
void rail_conf_arena_init(struct rail_conf *cx, struct rail_conf_arena *a, void *comm,
			  size_t len);
uint8_t *rail_conf_arena_take(struct rail_conf *cx, struct rail_conf_arena *a, size_t size);
void rail_conf_arena_dereg(struct rail_conf *cx, struct rail_conf_arena *a);
/* munmap: a plugin writing to it later crashes the role instead of passing. */
void rail_conf_arena_free(struct rail_conf_arena *a);

void rail_conf_fill(uint8_t *p, size_t len, uint64_t seed);
void rail_conf_poison(uint8_t *p, size_t len, uint64_t seed);
/* 0, or -1 and a description of the first mismatch in why. */
int rail_conf_verify(const uint8_t *p, size_t len, uint64_t seed, char *why, size_t wlen);
/* Checks [from, to) still holds the poison. */
int rail_conf_verify_poison(const uint8_t *p, size_t from, size_t to, uint64_t seed, char *why,
			    size_t wlen);

/* ---- connections (conn.c) -------------------------------------------------- */

enum rail_conf_pend_kind { RAIL_CONF_CONNECT = 1, RAIL_CONF_ACCEPT = 2 };

/* One connect or accept being retried until it returns a comm. */
struct rail_conf_pend {
	int kind;
	void *lc;				/* accept */
	uint8_t handle[NCCL_NET_HANDLE_MAXSIZE]; /* connect: this connection's copy */
	uint8_t canary[64];			 /* catches writes past the handle */
	void *ctx;				/* connect: v11+ context (NULL: net's) */
	void *comm;
	int calls;
	uint64_t max_call_ns;
};

/* Retry every entry round-robin until all have a comm (or the deadline). */
void rail_conf_establish(struct rail_conf *cx, struct rail_conf_pend *p, int n, const char *what);
void *rail_conf_listen(struct rail_conf *cx, void *handle);

/* A: listen+accept (comm = receive comm), B: connect (comm = send comm). */
struct rail_conf_pair {
	void *lc;
	void *comm;
};
void rail_conf_pair_open(struct rail_conf *cx, struct rail_conf_pair *p);
void rail_conf_pair_close(struct rail_conf *cx, struct rail_conf_pair *p);
void rail_conf_close_send(struct rail_conf *cx, void *sc);
void rail_conf_close_recv(struct rail_conf *cx, void *rc);
void rail_conf_close_listen(struct rail_conf *cx, void *lc);
/* bad-handle helpers (sc_fault.c), shared with random-handle. */
/* A: accept must return nothing, and no error, until B sends DONE. */
void rail_conf_watch_listener(struct rail_conf *cx, void *lc, const char *what);
/* B: connect with this handle must fail (or its comm's first send), with a WARN. */
void rail_conf_connect_refused(struct rail_conf *cx, const uint8_t *handle, const char *what);
/* Both: one connection with this handle (B) / listen comm (A), then traffic. */
void rail_conf_good_connection(struct rail_conf *cx, void *lc, const uint8_t *handle);
/* The smaller maxRecvs of the two roles' devices. */
int rail_conf_common_max_recvs(struct rail_conf *cx);
/* The largest message both roles' devices accept (maxP2pBytes, v9+), capped by --max-size. */
size_t rail_conf_common_max_msg(struct rail_conf *cx);

/* ---- the request engine (engine.c) ------------------------------------------ */

enum rail_conf_op_kind { RAIL_CONF_SEND = 1, RAIL_CONF_RECV = 2 };

struct rail_conf_op {
	int kind;
	int lane;
	int n;					/* receive: sub-buffers */
	uint8_t *buf[RAIL_CONF_MAX_RECVS];
	size_t size[RAIL_CONF_MAX_RECVS];	/* send: bytes; receive: room posted */
	size_t expect[RAIL_CONF_MAX_RECVS];	/* receive: bytes the peer sends */
	uint64_t seed[RAIL_CONF_MAX_RECVS];
	int tag[RAIL_CONF_MAX_RECVS];
	void *mh[RAIL_CONF_MAX_RECVS];
	int hint;				/* post with NCCL's (void*)1 request hint */
	/* engine state */
	void *req;
	int posted;
	int done;
	int nulls;				/* NULL requests before posting */
	int tests;
	int got[RAIL_CONF_MAX_RECVS];
	ncclResult_t err;			/* with RAIL_CONF_ENGINE_TOLERATE */
};

struct rail_conf_lane {
	void *comm;
	int limit;				/* requests in flight at most */
	/* engine state */
	int inflight;
	int max_inflight;
	int next;
};

#define RAIL_CONF_ENGINE_TOLERATE 0x1	/* stop at the first error and return it */
#define RAIL_CONF_ENGINE_NOVERIFY 0x2	/* the caller checks the receives itself */

struct rail_conf_engine {
	struct rail_conf_op *ops;
	int nops;
	struct rail_conf_lane *lanes;
	int nlanes;
	int flags;
	/* results */
	int failed_op;
	ncclResult_t failed_res;
	int failed_in_post;
};

/* Fill send buffers and poison receive buffers of the ops (call before running). */
void rail_conf_ops_prepare(struct rail_conf_op *ops, int nops);
/* Post and test everything; verifies every byte of every receive. 0, or -1 (TOLERATE). */
int rail_conf_engine_run(struct rail_conf *cx, struct rail_conf_engine *e, const char *what);
/* Verify one completed receive (sizes, bytes, guard). Fails the role. */
void rail_conf_verify_recv(struct rail_conf *cx, const struct rail_conf_op *op, const char *what,
			   int index);
/* Test one request until done. Returns the result (fail on timeout). */
ncclResult_t rail_conf_wait(struct rail_conf *cx, void *req, int *sizes, const char *what);

/*
 * The common exchange: nmsg messages B -> A on a pair, sizes[i] sent,
 * room[i] posted (0: equal to the size), everything verified. Returns the
 * most requests this role had in flight at once.
 */
int rail_conf_simple_traffic(struct rail_conf *cx, struct rail_conf_pair *p, unsigned stream,
			     const size_t *sizes, const size_t *room, int nmsg, const char *what);

#endif
