/*
 * nccl-net-rail: the interface between the version-neutral API (api.c) and
 * a transport (tcp/, ib/). Transports see no NCCL type and no ABI version;
 * every function returns 0 or a negative errno, logs its own error with
 * full context (call, errno text, device:port, QP, peer), and writes its
 * outputs only on success.
 */
#ifndef RAIL_TRANSPORT_H
#define RAIL_TRANSPORT_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "flight.h"
#include "pool.h"
#include "prof.h"
#include "stats.h"

/* Pointer kinds, with NCCL's bit values. */
#define RAIL_PTR_HOST 0x1
#define RAIL_PTR_CUDA 0x2
#define RAIL_PTR_DMABUF 0x4

#define RAIL_MAX_REQUESTS 32	  /* NCCL_NET_MAX_REQUESTS */
#define RAIL_MAX_RECVS 8	  /* grouped receives we advertise at most */
#define RAIL_MAX_VDEV_DEVS 8	  /* members of a virtual NIC (v12) */
#define RAIL_MAX_MSG_BYTES (1ull << 30)

struct rail_props {
	const char *name;	/* unique among the devices */
	const char *pci_path;	/* real sysfs path, or NULL */
	uint64_t guid;
	int ptr_support;	/* RAIL_PTR_* */
	int reg_is_global;
	int force_flush;
	int speed;		/* Mbps */
	int port;
	float latency;		/* us */
	int max_comms;
	int max_recvs;
	int vdev_ndevs;
	int vdev_devs[RAIL_MAX_VDEV_DEVS];
	size_t max_p2p_bytes;
	size_t max_coll_bytes;
	int max_multi_request_size;
	int rail_id;		/* -1: unset */
	int plane_id;		/* -1: unset */
};

struct rail_conn_opts {
	int traffic_class;	/* -1: unset */
};

enum rail_comm_kind {
	RAIL_COMM_LISTEN = 0x4c495354, /* "LIST" */
	RAIL_COMM_SEND = 0x53454e44,   /* "SEND" */
	RAIL_COMM_RECV = 0x52454356,   /* "RECV" */
	RAIL_COMM_DEAD = 0x44454144,   /* "DEAD": closed */
};

struct rail_transport_ops;

/* First member of every transport comm. */
struct rail_comm {
	uint32_t kind;
	int dev;
	const struct rail_transport_ops *ops;
	struct rail_pool reqs;
	/* api.c: the comm's handle (src/handles.h) and the next request stamp. */
	uintptr_t handle;
	uint32_t hidx;
	uint32_t stamp;
	/* api.c: counters and the flight record (src/stats.h, src/flight.h). */
	struct rail_stats st;
	struct rail_flight fl;
	uint32_t lat_tick;	/* requests posted: every RAIL_LAT_EVERY-th is timed */
	/* api.c: profiler state per request slot, made at the first profiled post (prof.h). */
	struct rail_prof_req *prof;
	/*
	 * A transport's own thread may work on the comm between NCCL's calls
	 * (verbs failover's move thread, src/ib/ib_move_thread.c). With guarded
	 * set (by the transport, before the comm is returned), each data call
	 * (isend, irecv, iflush, test) holds the comm for its whole duration,
	 * flight record and counters included, and finding the thread on it
	 * answers "not now" (the guard below). calls counts them, so the
	 * thread can see a comm NCCL leaves alone; NCCL makes one call on a
	 * comm at a time, so only the caller writes it (a load and a store).
	 */
	int guarded;		/* RAIL_GUARD_*: 0 for a comm only NCCL's calls touch */
	atomic_int in_call;	/* NCCL's side (api_int.h comm_enter) holds it */
	atomic_int mover;	/* the transport's thread wants it, or holds it */
	atomic_uint calls;
	/*
	 * The thread found nothing owed on it and stopped looking: the next
	 * data call clears it and wakes the thread (rail_comm_woken), so an
	 * idle comm costs the thread no timer.
	 */
	atomic_int quiet;
	int closed;		/* rail_comm_closed: no longer counted live */
};

/*
 * The guard of a guarded comm: an asymmetric Dekker protocol between
 * NCCL's calls (the owner, one call at a time) and the transport's thread
 * (the mover). The owner stores in_call = 1, then loads mover, with only
 * a compiler barrier between (rail_guard_light: no locked instruction on
 * the data path); the mover stores mover = 1 on the comms it wants, then
 * makes every running thread of the process execute a full barrier
 * (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), one system call for a
 * batch of comms), then loads in_call. Either the owner sees mover or the
 * mover sees in_call: never both in. Whoever finds the other there backs
 * off. Without membarrier (an old kernel, a seccomp filter) all four
 * accesses are sequentially consistent instead (plain C11 Dekker: a locked
 * exchange on x86), chosen once at the first guarded comm
 * (rail_guard_setup) and carried in each comm's guarded, so that the data
 * path reads no global.
 */
enum { RAIL_GUARD_OFF, RAIL_GUARD_LIGHT, RAIL_GUARD_FENCE };
extern atomic_int rail_guard_fence;	/* 1: no membarrier, the owner fences */

/* Once per process, then what a new guarded comm's guarded is (RAIL_GUARD_LIGHT or _FENCE). */
int rail_guard_setup(void);
/*
 * Tests, with no guarded comm live: 1 forces the fallback (full fences on
 * both sides), 0 back to membarrier if it works. Returns rail_guard_setup's.
 */
int rail_guard_force_fence(int on);

/* The owner's half: in_call = 1, then whether the mover is there (nonzero: back off). */
static inline int rail_guard_owner_in(struct rail_comm *c, int guarded)
{
	if (__builtin_expect(guarded == RAIL_GUARD_FENCE, 0)) {
		atomic_store_explicit(&c->in_call, 1, memory_order_seq_cst);
		return atomic_load_explicit(&c->mover, memory_order_seq_cst);
	}
	atomic_store_explicit(&c->in_call, 1, memory_order_relaxed);
	atomic_signal_fence(memory_order_seq_cst);	/* the compiler's order only: membarrier */
	return atomic_load_explicit(&c->mover, memory_order_acquire);
}

/* The owner's half, leaving (a close that hands the comm to the mover uses it too). */
static inline void rail_guard_owner_out(struct rail_comm *c)
{
	atomic_store_explicit(&c->in_call, 0, memory_order_release);
}

/*
 * The mover takes what it can of the n comms in v (NULL entries skipped):
 * taken[i] is 1 for each it now holds (release with rail_guard_give), 0
 * where NCCL is in a call on it. Returns how many it took.
 */
int rail_guard_take(struct rail_comm *const *v, int n, unsigned char *taken);

/*
 * The transport thread's wake-up for a quiet comm NCCL calls again (set once
 * by the thread's start, NULL at its end): called by the data call that
 * finds quiet set, after clearing it; cheap and non-blocking.
 */
void rail_comm_wake_set(void (*fn)(void));
void rail_comm_woken(struct rail_comm *c);

static inline void rail_guard_give(struct rail_comm *c)
{
	atomic_store_explicit(&c->mover, 0, memory_order_release);
}

enum rail_req_type {
	RAIL_REQ_SEND = 1,
	RAIL_REQ_RECV = 2,
	RAIL_REQ_FLUSH = 3,
};

#define RAIL_REQ_MAGIC 0x52455153u /* "REQS" */

/* First member of every transport request; the API owns the pool. */
struct rail_req {
	uint32_t magic;
	int type;
	int n;
	uint32_t stamp;		/* api.c: must match the handle's (src/handles.h) */
	uint32_t slot;		/* api.c: its index in the comm's pool */
	struct rail_comm *comm;
	/*
	 * api.c: when it was posted (rail_coarse_ns), and what, for the flight
	 * record; t_lat: rail_now_ns at post for a timed request, else 0.
	 */
	uint64_t t_post;
	uint64_t t_lat;
	uint64_t size;		/* a receive: its first buffer's */
	int32_t tag;
	/*
	 * NCCL's profiler parents of the buffers and the events kept (prof.h),
	 * or NULL: no profiler, or no parent handle given. Set by api.c before
	 * the transport's isend/irecv.
	 */
	struct rail_prof_req *prof;
};

struct rail_transport_ops {
	const char *name;
	/* Size of the transport's request struct (sends, receives, flushes). */
	size_t req_size;

	/*
	 * Discover devices. Returns the number found (0 is allowed; why then
	 * says what is missing, for the transport-choice log line) or -errno.
	 */
	int (*init)(char *why, size_t why_len);
	/* Stop every thread and release everything init created. */
	void (*fini)(void);
	/* Physical plus virtual devices. */
	int (*ndevs)(void);
	int (*get_props)(int dev, struct rail_props *props);
	/* One line describing the devices, for the init summary. */
	void (*describe)(char *buf, size_t len);

	int (*listen)(int dev, void *handle, struct rail_comm **listen_comm);
	/* *send_comm stays NULL while the handshake is in progress. */
	int (*connect)(int dev, const struct rail_conn_opts *opts, void *handle,
		       struct rail_comm **send_comm);
	int (*accept)(struct rail_comm *listen_comm, struct rail_comm **recv_comm);

	int (*reg_mr)(struct rail_comm *comm, void *data, size_t size, int type, void **mhandle);
	/* NULL when DMA-BUF registration is not supported. */
	int (*reg_mr_dmabuf)(struct rail_comm *comm, void *data, size_t size, int type,
			     uint64_t offset, int fd, void **mhandle);
	int (*dereg_mr)(struct rail_comm *comm, void *mhandle);

	/* -EAGAIN: cannot be posted now, NCCL retries (request stays free). */
	int (*isend)(struct rail_comm *send_comm, struct rail_req *req, void *data, size_t size,
		     int tag, void *mhandle);
	int (*irecv)(struct rail_comm *recv_comm, struct rail_req *req, int n, void **data,
		     const size_t *sizes, const int *tags, void **mhandles);
	/* Returns 1 when nothing needs flushing (no request is handed out). */
	int (*iflush)(struct rail_comm *recv_comm, struct rail_req *req, int n, void **data,
		      const int *sizes, void **mhandles);
	/* sizes: n entries for a receive, 1 for a send, unused for a flush. */
	int (*test)(struct rail_req *req, int *done, size_t *sizes);

	/* Close with requests possibly in flight: never blocks on the peer. */
	int (*close_send)(struct rail_comm *comm);
	int (*close_recv)(struct rail_comm *comm);
	int (*close_listen)(struct rail_comm *comm);

	/*
	 * NULL when the transport has nothing to add: a description of a send
	 * or receive comm for its stats line and flight record (peer,
	 * device:port; with detail, QP numbers and states). Only called by
	 * the thread driving the comm.
	 */
	void (*describe_comm)(struct rail_comm *comm, int detail, char *buf, size_t len);

	/* NULL when NIC fusion is not supported. *vdev gets the new index. */
	int (*make_vdevice)(int ndevs, const int *devs, int *vdev);
};

/* Called by transports when they create and destroy a comm. */
int rail_comm_init(struct rail_comm *comm, enum rail_comm_kind kind, int dev,
		   const struct rail_transport_ops *ops);
void rail_comm_fini(struct rail_comm *comm);
/*
 * Closed to NCCL but freed later by the transport's own thread (its
 * rail_comm_fini then): no longer counted live, so finalize goes ahead.
 */
void rail_comm_closed(struct rail_comm *comm);
/* Comms initialised and not yet finalised (listen, send, receive; any transport). */
int rail_comm_live(void);
/* Objects that are not rail_comms but keep threads or sockets (RMA): +1 made, -1 gone. */
void rail_comm_live_add(int delta);

/* The transports this build knows. */
extern const struct rail_transport_ops rail_tcp_ops;
extern const struct rail_transport_ops rail_ib_ops;

/*
 * Pick and initialise the transport for NCCL_RAIL_TRANSPORT: returns it,
 * or NULL with why explaining (for the warning). why also gets the reason
 * for the choice on success (for the init summary line).
 */
const struct rail_transport_ops *rail_transport_select(char *why, size_t why_len);

#endif
