/*
 * nccl-net-rail: the TCP transport.
 *
 * A connection is one control socket plus nsocks data sockets, all opened
 * by the connector and grouped by the listener through a hello message
 * (magic, version, the listen comm's nonce, a connection id, the socket's
 * index and the stream layout). The connector's layout (threads, sockets,
 * inline limit, chunk size) is adopted by the listener, so both sides cut
 * messages identically.
 *
 * Every message starts with a 24-byte frame header on the control socket
 * (sequence number, tag, size). Messages up to the inline limit follow
 * their header on the control socket and are moved by NCCL's progress
 * thread (isend/irecv/test). Larger ones are cut into at most nsocks
 * chunks; chunk i of message seq travels on data socket
 * (seq + i) % nsocks, moved by the helper thread owning that socket. Each
 * helper handles its tasks in message order on both sides, so the streams
 * never interleave and never deadlock.
 *
 * The control socket carries one thing back from the receiver: a 40-byte
 * refusal when a message does not fit its posted receive (or carries a tag
 * the receive does not expect), so that the sender's next isend or test
 * fails with both sizes too. A peer of an older build never reads it.
 */
#ifndef RAIL_TCP_H
#define RAIL_TCP_H

#include <limits.h>
#include <net/if.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "handle.h"
#include "sock.h"
#include "transport.h"

#define TCP_MAX_DEVS 16
#define TCP_MAX_THREADS 16
#define TCP_MAX_SOCKS 64
#define TCP_DEFAULT_THREADS 4
#define TCP_DEFAULT_SOCKS_PER_THREAD 1

/* ---- wire formats (tcp_wire.c) ---- */

#define TCP_HELLO_MAGIC 0x50435452u /* "RTCP" */
#define TCP_REPLY_MAGIC 0x41435452u /* "RTCA" */
#define TCP_FRAME_MAGIC 0x46u
#define TCP_WIRE_VERSION 1
#define TCP_HELLO_SIZE 40
#define TCP_REPLY_SIZE 8
#define TCP_FRAME_SIZE 24
#define TCP_REFUSAL_MAGIC 0x52u
#define TCP_REFUSAL_SIZE 40

struct tcp_hello {
	uint16_t index;		/* 0: control socket, 1..nsocks: data sockets */
	uint64_t nonce;		/* the listen comm's, from the handle */
	uint64_t conn_id;	/* random, groups the sockets of one connection */
	uint16_t nsocks;
	uint16_t nthreads;
	uint32_t inline_max;
	uint32_t min_chunk;
};

struct tcp_frame {
	uint64_t seq;
	int32_t tag;
	uint64_t size;
};

void tcp_hello_encode(const struct tcp_hello *h, uint8_t out[TCP_HELLO_SIZE]);
/* -EPROTO / -EPROTONOSUPPORT / -EBADMSG with a reason in why. */
int tcp_hello_decode(const uint8_t in[TCP_HELLO_SIZE], struct tcp_hello *h, char *why,
		     size_t why_len);
void tcp_reply_encode(int status, uint8_t out[TCP_REPLY_SIZE]);
/* Returns the listener's status (0 accepted, >0 an errno why not), or -EPROTO. */
int tcp_reply_decode(const uint8_t in[TCP_REPLY_SIZE]);
void tcp_frame_encode(const struct tcp_frame *f, uint8_t out[TCP_FRAME_SIZE]);
int tcp_frame_decode(const uint8_t in[TCP_FRAME_SIZE], struct tcp_frame *f);

/* Why a receiver refused a message. */
enum tcp_refusal_reason {
	TCP_REFUSE_SIZE = 1,	/* larger than the posted receive */
	TCP_REFUSE_TAG = 2,	/* a tag no posted receive expects */
};

struct tcp_refusal {
	int reason;		/* enum tcp_refusal_reason */
	int32_t tag;		/* the message's */
	int32_t want_tag;	/* TAG: the tag the receive expects */
	uint64_t seq;
	uint64_t size;		/* the message's */
	uint64_t posted;	/* SIZE: the receive's size (smaller) */
};

void tcp_refusal_encode(const struct tcp_refusal *r, uint8_t out[TCP_REFUSAL_SIZE]);
/* -EPROTO for anything but a well-formed refusal. */
int tcp_refusal_decode(const uint8_t in[TCP_REFUSAL_SIZE], struct tcp_refusal *r);

/* How a message of `size` bytes is cut: chunk i goes to socket (first + i) % nsocks. */
struct tcp_plan {
	size_t chunk;
	int nchunks;
	int first;
};
void tcp_plan_message(size_t size, uint64_t seq, int nsocks, size_t min_chunk,
		      struct tcp_plan *plan);

/* ---- devices (tcp_init.c) ---- */

struct tcp_dev {
	char name[IF_NAMESIZE];
	union rail_sockaddr addr;
	char pci_path[PATH_MAX];
	int has_pci;
	int speed;
};

const struct tcp_dev *tcp_dev_get(int dev);

/* ---- comms ---- */

struct tcp_comm;

struct tcp_task {
	void *buf;
	size_t len;
	int fd;
	struct tcp_req *req;
	void *ev;		/* its profiler event, stopped by whoever moves it (prof.h), or NULL */
};

/*
 * A data socket and its queue of chunks. The comm's progress thread pushes
 * (single producer); the pool thread owning the socket moves them in order
 * with non-blocking send/recv (single consumer), waiting in epoll when the
 * socket is not ready (tcp_pool.c).
 */
struct tcp_stream {
	struct tcp_comm *comm;
	int fd;
	int index;			/* in the comm: data socket index */
	struct tcp_pool_thread *owner;
	struct tcp_task *ring;
	uint32_t mask;
	_Atomic uint32_t head;		/* written by the progress thread */
	_Atomic uint32_t tail;		/* written by the owner */
	_Atomic int ready;		/* set up: the owner may use it */
	_Atomic int kicked;		/* on the owner's inbox */
	_Atomic int detached;		/* the owner forgot it: it can be freed */
	_Atomic int busy;		/* a thread is moving its chunks (owner or progress) */
	_Atomic int again;		/* look again: a thread found it busy */
	struct tcp_stream *inbox_next;
	/* owner only */
	size_t off;			/* bytes of the head chunk moved */
	int active;
	struct tcp_stream *act_next, *act_prev;
};

struct tcp_req {
	struct rail_req base;
	struct tcp_req *next;		/* control-socket FIFO */
	void *data[RAIL_MAX_RECVS];
	size_t size[RAIL_MAX_RECVS];	/* posted sizes */
	size_t got[RAIL_MAX_RECVS];	/* real sizes */
	int tag[RAIL_MAX_RECVS];
	uint8_t matched[RAIL_MAX_RECVS];
	int nmatched;
	/* send side: the frame header and how much of header+inline went out */
	uint8_t frame[TCP_FRAME_SIZE];
	size_t sent;
	int ctrl_done;			/* nothing left for the control socket */
	uint64_t first_seq;		/* receive: the message of its first matched entry */
	_Atomic size_t moved;		/* receive: bytes arrived for its entries */
	_Atomic int pending;		/* chunks still with helper threads */
	_Atomic int failed;		/* a helper could not move one of them */
};

struct tcp_comm {
	struct rail_comm base;
	int is_send;
	int ctrl_fd;
	int nsocks;
	int nthreads;
	int fds[TCP_MAX_SOCKS];
	struct tcp_stream streams[TCP_MAX_SOCKS];
	int nattached;			/* streams handed to the pool */
	int help;			/* NCCL_RAIL_TCP_HELP */
	size_t inline_max;
	size_t min_chunk;
	uint64_t seq;			/* next message to post (send) or match (recv) */
	struct tcp_req *fifo_head, *fifo_tail;
	unsigned test_skips;
	/* receive side: the frame being read from the control socket */
	uint8_t rx_frame[TCP_FRAME_SIZE];
	size_t rx_frame_off;
	int rx_have_frame;
	struct tcp_frame rx;
	struct tcp_req *rx_req;		/* request and entry receiving inline data */
	int rx_entry;
	size_t rx_off;
	/* send side: a refusal being read from the control socket */
	uint8_t rx_refusal[TCP_REFUSAL_SIZE];
	size_t rx_refusal_off;
	int ctrl_quiet;			/* nothing more to read there (EOF, error, refusal) */
	unsigned polls;
	int refused;			/* receive side: a refusal went out */
	/* receive side: a started message without progress (NCCL_RAIL_STALL_TIMEOUT) */
	_Atomic uint64_t rx_moved;	/* bytes that arrived, any thread */
	uint64_t stall_ns;		/* the bound, 0: none */
	uint64_t stall_seen;		/* rx_moved when last sampled */
	uint64_t stall_since;		/* when it last changed */
	/* first error seen by any thread; the message is logged once */
	_Atomic int error;
	_Atomic int warned;	/* the failure's WARN went out (before error was set) */
	_Atomic int closing;
	char peer[RAIL_ADDR_STRLEN];
	/* live memory registrations (ids handed out as mhandles), any thread */
	pthread_mutex_t mr_lock;
	uintptr_t *mrs;
	int nmrs, cap_mrs;
};

/* tcp_conn.c */
int tcp_listen(int dev, void *handle, struct rail_comm **listen_comm);
int tcp_connect(int dev, const struct rail_conn_opts *opts, void *handle,
		struct rail_comm **send_comm);
int tcp_accept(struct rail_comm *listen_comm, struct rail_comm **recv_comm);
/* Peer, interface, and with detail the sockets (transport.h describe_comm). */
void tcp_describe_comm(struct rail_comm *comm, int detail, char *buf, size_t len);
int tcp_close_listen(struct rail_comm *listen_comm);

/* tcp_data.c */
/*
 * The comm takes the nsocks + 1 fds (control socket first) on success and
 * on failure alike: the caller forgets them either way, so each is closed
 * exactly once. Every failure is logged here; never -EAGAIN.
 */
int tcp_comm_create(int dev, int is_send, const int *fds, const struct tcp_hello *layout,
		    const union rail_sockaddr *peer, struct tcp_comm **out);
int tcp_isend(struct rail_comm *send_comm, struct rail_req *req, void *data, size_t size,
	      int tag, void *mhandle);
int tcp_irecv(struct rail_comm *recv_comm, struct rail_req *req, int n, void **data,
	      const size_t *sizes, const int *tags, void **mhandles);
int tcp_test(struct rail_req *req, int *done, size_t *sizes);
int tcp_close(struct rail_comm *comm);
/*
 * Record the first error of a comm and log it (once, and not while the
 * comm is being closed). Returns err.
 */
int tcp_comm_fail(struct tcp_comm *c, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
const char *tcp_comm_dev_name(const struct tcp_comm *c);

/* tcp_init.c: memory registrations, tracked per comm so a second deregMr fails. */
int tcp_reg_mr(struct rail_comm *comm, void *data, size_t size, int type, void **mh);
int tcp_dereg_mr(struct rail_comm *comm, void *mh);

/*
 * tcp_pool.c: one bounded pool of helper threads per process, shared by all
 * comms, started lazily (a thread per new socket until the bound) and
 * stopped by tcp_pool_stop at the transport's fini.
 */
#define TCP_POOL_MAX 64
/* The pool's bound: NCCL_RAIL_TCP_THREADS, or the rule of tcp_pool.c. */
int tcp_pool_size(char *why, size_t why_len);
/*
 * Messages up to the inline limit go on the control socket: NCCL_RAIL_TCP_INLINE, or
 * tcp_pool.c's rule (the default, or more on a crowded host).
 */
#define TCP_INLINE_DEFAULT (16u << 10)
#define TCP_INLINE_CROWDED (4u << 20)
#define TCP_CROWDED_CPUS 4	/* fewer CPUs per local rank: a crowded host */
uint32_t tcp_inline_max(char *why, size_t why_len);
/*
 * The ranks a launcher says share this host (OMPI_COMM_WORLD_LOCAL_SIZE,
 * MPI_LOCALNRANKS, LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE), or 0; *from
 * names the variable.
 */
int tcp_local_ranks(const char **from);
/* Start the first thread early, at listen and connect (best effort). */
void tcp_pool_reserve(void);
/* Hand the comm's data sockets to the pool; on failure nothing stays attached. */
int tcp_pool_attach(struct tcp_comm *c, uint32_t ring_size);
/* Take them back (after shutdown): on return no pool thread touches the comm. */
void tcp_pool_detach(struct tcp_comm *c);
/*
 * Queue a chunk on data socket sock (NCCL's progress thread only); ev: its
 * profiler event, stopped by whoever moves the chunk (prof.h), or NULL.
 */
void tcp_pool_push(struct tcp_comm *c, int sock, void *buf, size_t len, struct tcp_req *req,
		   void *ev);
/*
 * NCCL's progress thread, in test(): move the comm's queued chunks itself
 * where no helper is moving them (a bounded amount), so a message does not
 * wait for a helper to be woken and scheduled on a busy host.
 */
void tcp_pool_help(struct tcp_comm *c);
/* Threads running now. */
int tcp_pool_threads(void);
/* Stop and join every pool thread (no comm may be attached). */
void tcp_pool_stop(void);

/* tcp_fault.c: NCCL_RAIL_TCP_FAULT, read at init. */
void tcp_fault_arm(void);
/* 0, or the -errno a helper thread creation must fail with. */
int tcp_fault_thread_create(void);

extern const struct rail_transport_ops rail_tcp_ops;

#endif
