/*
 * nccl-net-rail: the TCP RMA backend's private header.
 *
 * Sockets. Every rank listens on its net device's address (the handle NCCL
 * allgathers). connect builds a control mesh: one socket from each rank to
 * each other rank, the connector writing, the listener reading; the
 * collComm keeps its listening socket for createContext, which opens, for
 * every context and every rank its stride names, one more socket each way.
 * Each socket starts with a 40-byte hello (rank, number of ranks, the
 * listener's nonce from its handle, which createContext call and which
 * context) so that the listener files it; a hello of a later call (a
 * faster rank) waits in a stash.
 *
 * Streams. A data socket from rank A to rank B for context c is A's stream
 * to B: A's puts, signals and get requests go on it in program order
 * (NCCL's progress thread writes it, never blocking), B's thread reads it
 * and applies each frame in that order, and B answers gets on the same
 * socket the other way. So a signal is applied only once every byte of
 * every earlier put of that (context, peer) is in memory: every signal is
 * strong. Operations to oneself are memory copies, done at once.
 *
 * Lanes. One TCP stream carries about one core's worth of copying, so a
 * put of RMA_STRIPE_MIN bytes or more is striped: its stream carries a
 * STRIPED frame (window, offset, length) in its place, and its bytes travel
 * on the createContext call's lanes to that peer, NCCL_RAIL_RMA_LANES more
 * sockets each way (the lowest value of any rank, agreed at connect),
 * written by one sender thread per lane (rma_lane.c) and read by one
 * applier thread per lane. The destination range is cut at multiples of
 * RMA_LANE_BLOCK of the window offset and block b goes on lane b % lanes,
 * as a PUT frame whose id names its context and the STRIPED frame's place
 * in its stream (seq): two puts that write the same byte put it on the same
 * lane, in order. The target keeps program order with two gates per
 * (context, peer): a frame of the stream other than STRIPED waits until
 * every lane has landed every block announced before it (so a signal still
 * follows every byte of the puts before it), and a block waits until its
 * STRIPED frame was reached (so it never lands under an earlier put of the
 * stream). Each lane is read in order, and a gate waits only for what was
 * posted before it, so they never wait for each other in a circle.
 *
 * Frames (40 bytes, little-endian, rma_wire.c):
 *   PUT    window, offset, length; the bytes follow
 *   SIGNAL window, offset, the 64-bit value to add
 *   STRIPED window, offset, length; the bytes follow on the lanes
 *   GET    window, offset, length, the request's id
 *   REPLY  the request's id, status, length; the bytes follow
 * Windows are named by registration index, the same on every rank
 * (regMrSym is collective and ordered). The target checks every frame
 * against its own table before it touches memory: a frame that would write
 * or read outside a live window fails the stream with a WARN naming the
 * peer, the call and the window, and nothing is written.
 *
 * Threads. One applier thread per collComm (rma_apply.c) reads every
 * stream of the group with epoll (and one more per lane reads its lane): puts land straight into a host window,
 * signals are atomic adds, gets are answered without blocking, replies to
 * this rank's gets land in their buffers. GPU windows are reached through
 * rma_mem.c only: copies and signal writes in order on the collComm's one
 * CUDA stream, so a signal still follows every byte before it. NCCL's
 * threads post and test (rma_send.c) under the context's lock; windows are
 * looked up under the collComm's window lock, read-held while bytes are
 * written to or read from a window (the appliers together), write-held by
 * regMrSym and deregMrSym, so that deregMrSym never races with a frame.
 *
 * Layers. The files of src/rma/ call each other one way only: a file uses
 * the functions and data of files of a lower rank (LAYER.STEP), never of a
 * higher one, and of its own rank only where an "allow" line says why
 * (test/check-layering.sh -t src/rma/rma_tcp.h, make test-layering).
 *
 *   0.0  rma_wire     every format exchanged between ranks: pure codecs
 *   0.1  rma_mem      a window's bytes: host directly, GPU through the CUDA driver and staging
 *   1.0  rma_mesh     sockets between the ranks: listen, links to a set of peers, exchanges
 *   1.1  rma_mr       the windows of a collComm: the table, bounds, registration
 *   1.2  rma_ib_qp    the verbs backend: a context's CQ and QPs, connected over the mesh
 *   1.3  rma_lane     the lanes' sender threads; a request's parts; the group's first error
 *   2.0  rma_apply    the target side: the applier threads of a collComm
 *   2.1  rma_send     the initiator side: requests, streams, post and test
 *   2.2  rma_ib_data  the verbs backend: requests, post, test
 *   3.0  rma_tcp      the TCP backend's ops: listen, connect, contexts, close
 *   3.1  rma_ib       the verbs backend's ops (rma_ib.h)
 *   4.0  rma_backend  which backend serves which net transport
 */
#ifndef RAIL_RMA_TCP_H
#define RAIL_RMA_TCP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>

#include "cuda.h"
#include "rma/rma.h"
#include "sock.h"

/* ---- wire formats (rma_wire.c) ---- */

#define RMA_HELLO_MAGIC 0x48414d52u	/* "RMAH" */
#define RMA_FRAME_MAGIC 0x46414d52u	/* "RMAF" */
#define RMA_RECORD_MAGIC 0x52414d52u	/* "RMAR" */
#define RMA_WIRE_VERSION 1
#define RMA_HELLO_SIZE 40
#define RMA_FRAME_SIZE 40
#define RMA_RECORD_SIZE 40
/* The most a frame may carry; windows bound it further. */
#define RMA_MAX_LEN (1ull << 40)

enum rma_link_kind { RMA_LINK_CTRL = 1, RMA_LINK_DATA = 2 };

struct rma_hello {
	uint16_t kind;		/* enum rma_link_kind */
	uint64_t nonce;		/* the listener's, from its handle */
	uint32_t rank;		/* the connector's */
	uint32_t nranks;
	uint32_t seq;		/* DATA: which createContext call (1, 2, ...) */
	uint32_t index;		/* DATA: which context of it */
};

enum rma_op { RMA_OP_PUT = 1, RMA_OP_SIGNAL = 2, RMA_OP_GET = 3, RMA_OP_REPLY = 4,
	      RMA_OP_STRIPED = 5 };

struct rma_frame {
	uint8_t op;		/* enum rma_op */
	uint32_t win;		/* window index (PUT, SIGNAL, GET) */
	int32_t status;		/* REPLY: 0, or the errno why the target refused */
	uint64_t off;
	uint64_t len;		/* bytes (PUT, GET, REPLY), or the value to add (SIGNAL) */
	uint64_t id;		/* GET, REPLY: the request's id; a lane's PUT: context << 32 | seq */
};

/* One rank's part of a collective exchange (connect's check, regMrSym). */
struct rma_record {
	int32_t status;		/* 0, or the errno of this rank's failure */
	uint32_t index;		/* regMrSym: the window's index; connect: the rank */
	uint32_t nranks;
	uint64_t base;
	uint64_t size;
};

void rma_hello_encode(const struct rma_hello *h, uint8_t out[RMA_HELLO_SIZE]);
/* -EPROTO not a hello, -EPROTONOSUPPORT another version, -EBADMSG bad fields; why says. */
int rma_hello_decode(const uint8_t in[RMA_HELLO_SIZE], struct rma_hello *h, char *why,
		     size_t why_len);
void rma_frame_encode(const struct rma_frame *f, uint8_t out[RMA_FRAME_SIZE]);
int rma_frame_decode(const uint8_t in[RMA_FRAME_SIZE], struct rma_frame *f, char *why,
		     size_t why_len);
void rma_record_encode(const struct rma_record *r, uint8_t out[RMA_RECORD_SIZE]);
int rma_record_decode(const uint8_t in[RMA_RECORD_SIZE], struct rma_record *r);
const char *rma_op_name(int op);

/* ---- the mesh of sockets between ranks (rma_mesh.c) ---- */

struct rma_tcp_listen {
	struct rail_rma_listen base;
	int fd;
	uint64_t nonce;
	union rail_sockaddr addr;
};

struct rma_link {
	int peer;
	uint32_t index;
};

/* An accepted socket whose hello belongs to a later call. */
struct rma_stashed {
	int fd;
	struct rma_hello hello;
};

/* An accepted socket whose hello has not all arrived (kept from call to call). */
struct rma_pending {
	int fd;
	uint8_t buf[RMA_HELLO_SIZE];
	size_t got;
};

struct rma_mesh {
	int dev;
	int rank;
	int nranks;
	int listen_fd;		/* this rank's, kept from the listen comm */
	uint64_t nonce;		/* this rank's listener's */
	union rail_sockaddr *addr;	/* every rank's listener */
	uint64_t *nonces;
	struct rma_stashed *stash;
	int nstash;
	struct rma_pending *pend;
	int npend, cappend;
	int *ctrl_out;		/* [peer]: this rank's control socket to the peer */
	int *ctrl_in;		/* [peer]: the peer's to this rank */
};

/* The listening socket of device dev (addr: the net device's address). */
int rma_mesh_listen(int dev, const union rail_sockaddr *addr, void *handle,
		    struct rma_tcp_listen **out);
void rma_mesh_close_listen(struct rma_tcp_listen *lc);
/* From every rank's handle: addresses, nonces, this rank's listener (kept). */
int rma_mesh_init(struct rma_mesh *m, const struct rma_tcp_listen *lc, void *const *handles,
		  int nranks, int rank);
void rma_mesh_fini(struct rma_mesh *m);
/*
 * Collective: one socket to each link of want and one from each (the peer's
 * link with the same index), each opened with a hello of kind and seq;
 * out[i] and in[i] for want[i]. Bounded by NCCL_RAIL_CONNECT_TIMEOUT.
 */
int rma_mesh_links(struct rma_mesh *m, enum rma_link_kind kind, uint32_t seq, int n,
		   const struct rma_link *want, int *out, int *in, const char *call);
/*
 * Collective: the control mesh (a link each way with every other rank),
 * checked; *agree (if not NULL) becomes the lowest value any rank gave.
 */
int rma_mesh_group(struct rma_mesh *m, uint32_t *agree);
/*
 * Collective over the control mesh: out[q * len] goes to rank q, in[q *
 * len] comes from rank q (in[rank] = out[rank]); fixed length, so a peer
 * can send nothing longer.
 */
int rma_mesh_alltoall(struct rma_mesh *m, const void *out, void *in, size_t len,
		      const char *call);
/* Collective over the control mesh: every rank's record, all[rank] = *mine. */
int rma_mesh_exchange(struct rma_mesh *m, const struct rma_record *mine,
		      struct rma_record *all, const char *call);
/* "rank 3 (10.0.0.2:41234)" into buf. */
const char *rma_mesh_peer(const struct rma_mesh *m, int peer, char *buf, size_t len);
#define RMA_PEER(m, p) rma_mesh_peer((m), (p), (char[RAIL_ADDR_STRLEN + 32]){0}, \
				     RAIL_ADDR_STRLEN + 32)

/* ---- windows (rma_mr.c) ---- */

struct rma_win {
	struct rail_rma_mr base;
	int gpu;		/* device memory: reached through the CUDA driver only (rma_mem.c) */
	uint64_t *shadow;	/* gpu and SIGNAL_NEVER_RESET: every signal word's value */
	uint64_t *peer_base;	/* [rank]: every rank's copy */
	uint64_t *peer_size;
};

/* ---- a window's bytes (rma_mem.c) ---- */

/*
 * How long this rank waited for the GPU (rma_mem.c), logged when the
 * collComm closes: what a busy GPU costs the copies.
 */
enum rma_gpu_wait {
	RMA_WAIT_SOURCE,	/* a put's source piece copied out (the initiator) */
	RMA_WAIT_QUEUE,		/* the stream's queue: staging ring, gets, signals read back */
	RMA_WAIT_KINDS
};
struct rma_gpu_clock {
	_Atomic uint64_t n, ns, max_ns, bytes;
};

/* A wait for the GPU in progress (any thread's), for the stall check (rma_mem_watch). */
#define RMA_GPU_BUSY_SLOTS 8
struct rma_gpu_busy {
	atomic_int used;	/* claimed by a waiting thread */
	_Atomic uint64_t since;	/* when its wait began (0: not yet) */
	_Atomic(const char *) what;	/* the call */
	_Atomic uint64_t bytes;	/* copied on that stream since its last wait */
	atomic_int warned;	/* the stall check logged it */
};

/* Pinned bytes on their way into GPU windows: one thread's, started over once full. */
struct rma_ring {
	char *buf;
	size_t size, pos;
};

/* A collComm's way into its GPU windows, started at the first one. */
struct rma_gpu {
	pthread_mutex_t lock;	/* the stream's order, the ring, the shadows */
	const struct rail_cuda *cu;
	rail_cu_ctx ctx;	/* captured on NCCL's thread, set by every thread before a call */
	rail_cu_stream stream;	/* every write into this rank's GPU windows, in order */
	struct rma_ring ring;	/* the main applier's staging (lanes have their own) */
	uint64_t *word;		/* pinned: a signal word read back */
	char *bounce;		/* pinned: GPU-to-GPU copies to the rank itself pass here */
	int pending;		/* work queued on the stream since its last synchronize */
	size_t queued;		/* bytes copied on it since then */
	uint64_t signals;	/* GPU signal words written */
	struct rma_gpu_clock waits[RMA_WAIT_KINDS];
	struct rma_gpu_busy busy[RMA_GPU_BUSY_SLOTS];
	_Atomic uint64_t signals_at;	/* when the last signal word was queued (ns) */
	/*
	 * With the stall check on: after each signal write the stream also writes
	 * the count queued so far into ran (pinned), so that the check sees signal
	 * writes the GPU has not run though no thread waits for them.
	 */
	int track;
	uint64_t *ran;		/* NULL once a write of it failed (the check goes without) */
	uint64_t *ran_mem;	/* its memory, freed at the end */
	_Atomic uint64_t sigq;	/* signal writes queued (what *ran catches up with) */
	struct {
		uint64_t seen, since;	/* *ran when last seen to move, and when */
		int warned;
	} lag;			/* the check's thread's own */
	int lazy;		/* the driver loads modules lazily: 1, eagerly: 0, unknown: -1 */
	int dev, rank, nranks;	/* for messages */
};

void rma_gpu_init(struct rma_gpu *g, int dev, int rank, int nranks);
void rma_gpu_fini(struct rma_gpu *g);
/*
 * A window of NCCL_PTR_CUDA memory (NCCL's thread): starts the driver, the
 * context, the stream, or refuses naming why; *gpu = 1 for device memory.
 */
int rma_gpu_win(struct rma_gpu *g, void *data, size_t size, const char *call, int *gpu);
/* A stream of the caller's own, and pinned memory (for the initiator's staging). */
int rma_gpu_stream(struct rma_gpu *g, rail_cu_stream *s);
void rma_gpu_stream_free(struct rma_gpu *g, rail_cu_stream s);
void *rma_gpu_pinned(struct rma_gpu *g, size_t size);
void rma_gpu_pinned_free(struct rma_gpu *g, void *p);
/* Room in a staging ring for up to want bytes (its thread only; allocated at first use). */
char *rma_mem_stage(struct rma_gpu *g, struct rma_ring *ring, size_t want, size_t *room);
/* Staged bytes (of ring) into a GPU window at off, queued on the stream. */
int rma_mem_land(struct rma_gpu *g, struct rma_ring *ring, const struct rma_win *w, uint64_t off,
		 const char *staged, size_t n);
void rma_mem_ring_free(struct rma_gpu *g, struct rma_ring *ring);
/* add to the signal word at off, after every write queued before it. */
int rma_mem_signal(struct rma_gpu *g, const struct rma_win *w, uint64_t off, uint64_t add);
/* n bytes of a window into host memory (pinned for a GPU window), after the writes before. */
int rma_mem_read(struct rma_gpu *g, const struct rma_win *w, uint64_t off, void *pinned,
		 size_t n);
/* Window to window on this rank (queued: rma_mem_sync before the bytes are used). */
int rma_mem_copy(struct rma_gpu *g, const struct rma_win *dw, uint64_t doff,
		 const struct rma_win *sw, uint64_t soff, size_t n);
/* Everything queued on the collComm's stream is done. */
int rma_mem_sync(struct rma_gpu *g);
/*
 * The stall check: a wait for the GPU (any thread's) going on for limit_ns
 * or more is logged once (a WARN naming the call); its end is logged by
 * the thread that waited. So are signal writes queued on the stream that
 * the GPU has not run for limit_ns (nobody need wait for them), and their
 * end (the check's thread).
 */
void rma_mem_watch(struct rma_gpu *g, uint64_t now, uint64_t limit_ns);
/*
 * A put's source out of the GPU into pinned memory, on stream s: queued
 * (rma_mem_stage_start), waited for (rma_mem_stage_wait: everything queued
 * on s, n bytes of which are counted in the wait's rate), or both
 * (rma_mem_stage_out).
 */
int rma_mem_stage_start(struct rma_gpu *g, rail_cu_stream s, void *pinned, const char *src,
			size_t n);
/*
 * The same without a wait, for NCCL's thread: the copy queued on s and
 * event e recorded behind it (rma_mem_stage_queue); whether e has passed
 * (rma_mem_stage_ready: 1, and the wait since the queueing counted; 0 not
 * yet; -errno). Events come from rma_gpu_event.
 */
int rma_gpu_event(struct rma_gpu *g, rail_cu_event *e);
void rma_gpu_event_free(struct rma_gpu *g, rail_cu_event e);
int rma_mem_stage_queue(struct rma_gpu *g, rail_cu_stream s, rail_cu_event e, void *pinned,
			const char *src, size_t n);
int rma_mem_stage_ready(struct rma_gpu *g, rail_cu_event e, size_t n, uint64_t since);
/*
 * Event e recorded on the collComm's stream, behind everything queued there
 * (rma_mem_mark); whether it passed (rma_gpu_passed: 1, 0 not yet, -errno).
 */
int rma_mem_mark(struct rma_gpu *g, rail_cu_event e);
int rma_gpu_passed(struct rma_gpu *g, rail_cu_event e);
int rma_mem_stage_wait(struct rma_gpu *g, rail_cu_stream s, size_t n);
int rma_mem_stage_out(struct rma_gpu *g, rail_cu_stream s, void *pinned, const char *src,
		      size_t n);

struct rma_wins {
	pthread_rwlock_t lock;	/* written: the table; read: any access to a window's bytes by an applier */
	struct rma_win **v;	/* [index]; NULL once deregistered */
	uint32_t n;		/* indices handed out (never reused) */
	uint32_t cap;
};

void rma_wins_init(struct rma_wins *t);
void rma_wins_fini(struct rma_wins *t);
/* Collective: register (status, index, base, size exchanged; all fail together). */
int rma_wins_reg(struct rma_wins *t, struct rma_mesh *m, struct rma_gpu *g,
		 struct rail_rma_coll *coll, void *data, size_t size, int type, uint64_t flags,
		 int fd, struct rma_win **out);
void rma_wins_dereg(struct rma_wins *t, struct rma_win *w);
/* With t->lock held: the live window of index, or NULL. */
struct rma_win *rma_wins_get(struct rma_wins *t, uint32_t index);
/* [off, off + len) inside a window of size bytes (overflow-safe). */
static inline int rma_in_bounds(uint64_t off, uint64_t len, uint64_t size)
{
	return off <= size && len <= size - off;
}

/* ---- the collComm and its contexts ---- */

/* A stream's gate_warned bit for its main reader (lane -1) or lane l's (the stall check). */
static inline uint32_t rma_gate_bit(int lane)
{
	return lane < 0 ? 1u : 2u << lane;
}

/* Where a stall WARN of the initiator sends the operator. */
#define RMA_STALL_AT_TARGET "its log says why (an RMA line about a gate or the GPU), or its " \
	"process has stopped"

/* Lanes: the most, where a put is cut, and from which size it is striped. */
#define RMA_LANES_MAX 8
#define RMA_LANE_BLOCK (256u << 10)
#define RMA_STRIPE_MIN (512u << 10)

/* RMA_REQ_GPU: an operation to this rank itself, done once the GPU passed its event. */
enum rma_req_state { RMA_REQ_FREE = 0, RMA_REQ_QUEUED, RMA_REQ_WAIT, RMA_REQ_DONE,
		     RMA_REQ_FAILED, RMA_REQ_GPU };

#define RMA_NONE UINT32_MAX

struct rma_req {
	uint32_t stamp;
	_Atomic int state;	/* enum rma_req_state */
	atomic_int err;		/* FAILED: why (already logged) */
	int kind;		/* RAIL_RMA_PUT, RAIL_RMA_GET */
	int peer;
	int context;
	uint32_t next;		/* its stream's queue, or the free list */
	atomic_int parts;	/* a put: its stream's frames and each lane's blocks, not yet sent */
	uint8_t hdr[2][RMA_FRAME_SIZE];
	struct iovec iov[3];
	int niov;
	int gpu_iov;		/* the iov in GPU memory (staged as it is sent), or -1 */
	size_t sent, total;	/* bytes of iov on the socket */
	/* A get: where the reply lands (the applier's), and its window. */
	char *dst;
	size_t len;
	uint32_t dst_win;
	size_t landed;
	uint64_t wait_ns;	/* a get: when its request left (it waits for the reply since);
				 * to this rank, RMA_REQ_GPU: when it was posted */
	atomic_int stall_warned;	/* a get: the stall check logged it */
	rail_cu_event ev;	/* to this rank itself: recorded behind its GPU work (made once) */
};

/* This rank's side of (context, peer). */
struct rma_stream {
	int out_fd;		/* this rank's operations out, the replies to its gets in */
	int in_fd;		/* the peer's operations in, this rank's replies out */
	uint32_t qhead, qtail;	/* requests with bytes left to send, in order */
	int err;		/* the stream failed: every later operation fails */
	atomic_int broken;	/* the applier found it failed (its gets cannot be answered) */
	char *stage;		/* pinned, two pieces: the head request's GPU bytes being sent */
	int stage_cur;		/* the piece being written (0 or 1) */
	size_t stage_at, stage_len;	/* which bytes it holds: [at, at + len) of the GPU iov */
	size_t pre_at, pre_len;	/* the other piece's copy, queued while it is written (len 0: none) */
	rail_cu_event ev[2];	/* recorded behind each piece's copy */
	uint64_t queued_ns[2];	/* when that copy was queued; 0: its bytes are there */
	uint32_t frames;	/* frames posted on out_fd (a STRIPED frame's seq) */
	/* The target's gates (rma_tcp.h, Lanes), for the peer's stream in_fd. */
	uint32_t expected[RMA_LANES_MAX];	/* blocks announced per lane (the main applier's) */
	_Atomic uint32_t landed[RMA_LANES_MAX];	/* blocks landed per lane */
	_Atomic uint32_t reached;	/* frames of in_fd applied */
	atomic_int main_parked;	/* its reader waits for blocks */
	_Atomic uint32_t lanes_parked;	/* bit l: lane l's reader waits for reached */
	atomic_int lane_err;	/* a lane from the peer failed: its reader fails too */
	/* The stall check (rma_send.c, NCCL_RAIL_RMA_STALL_WARN). */
	uint64_t moved_ns;	/* a byte of the head request last left, or it became the head */
	uint64_t stall_warned;	/* the moved_ns a WARN was logged for (0: none) */
	_Atomic uint64_t main_parked_ns;	/* when in_fd's reader parked at its gate */
	_Atomic uint64_t lane_parked_ns[RMA_LANES_MAX];	/* ... lane l's reader, for this stream */
	_Atomic uint32_t gate_warned;	/* bit 0: the main reader's park was logged, 1 + l: lane l's */
};

struct rma_tcp_coll;

struct rma_tcp_ctx {
	struct rail_rma_ctx base;
	struct rma_tcp_coll *coll;
	uint32_t seq;		/* which createContext call */
	pthread_mutex_t lock;	/* requests and streams, for NCCL's threads */
	struct rma_stream *streams;	/* [context * nranks + peer]; fds -1 off the stride */
	struct rma_req *reqs;
	uint32_t nreqs;
	uint32_t free_head;
	uint32_t stamp;
	struct rma_rx **rx;	/* the applier's readers of this context's sockets */
	int nrx;
	rail_cu_stream stream;	/* the initiator's copies out of GPU windows */
	int *lane_out, *lane_in;	/* [lane * nranks + peer]; -1 off the stride */
	atomic_int *lane_err;	/* [lane * nranks + peer]: writing it failed (logged once) */
	int lanes_reserved;	/* nreqs jobs of room on every lane */
	int watched;		/* in the stall check's list (rma_watch_add) */
	uint32_t gets;		/* gets posted (the check looks for late replies only then) */
	int self_gpu;		/* GPU operations to this rank posted (the check looks for them) */
};

struct rma_applier;
struct rma_lane_tx;

struct rma_tcp_coll {
	struct rail_rma_coll base;
	struct rma_mesh mesh;
	struct rma_wins wins;
	struct rma_gpu gpu;
	struct rma_applier *ap;	/* [1 + nlanes]: the main applier, then one per lane */
	struct rma_lane_tx *tx;	/* [nlanes]: the lanes' sender threads */
	int nlanes;
	_Atomic uint64_t striped, striped_bytes;	/* puts sent over the lanes */
	atomic_int err;		/* the first error of the group (negative errno) */
	uint32_t ctx_seq;
	uint64_t stall_ns;	/* NCCL_RAIL_RMA_STALL_WARN (0: off) */
};

/* ---- the applier (rma_apply.c) ---- */

enum rma_rx_role { RMA_RX_TARGET = 1, RMA_RX_REPLIES = 2, RMA_RX_LANE = 3 };

/* A socket the applier reads: the peer's operations, or the replies to this rank's gets. */
struct rma_rx {
	int fd;
	int role;
	int peer;
	int context;		/* -1 for a lane (each block names its own) */
	int lane;		/* a lane's, else -1 */
	struct rma_tcp_ctx *ctx;
	uint8_t hdr[RMA_FRAME_SIZE];
	size_t hdr_got;
	struct rma_frame f;	/* the frame whose bytes are being read */
	uint64_t body_got;
	int in_body;
	/* A reply being written (TARGET). */
	uint8_t rhdr[RMA_FRAME_SIZE];
	uint64_t roff, rlen, rsent;
	uint32_t rwin;
	int replying;
	char *rstage;		/* pinned: a reply's bytes out of a GPU window */
	uint64_t rstage_at, rstage_len;	/* which of them */
	int body_gpu;		/* the body being read lands in a GPU window */
	char *stage_ptr;	/* ... through this piece of the reader's staging ring */
	size_t staged, stage_room;	/* bytes in it, and its size (0: none started) */
	uint64_t stage_off;	/* the window offset of its first byte */
	int held;		/* the frame in f waits for its gate */
	int parked;		/* ... and the reader sleeps until woken (out of epoll) */
	int dead;
	int logged;		/* the failure was logged where it was understood */
};

int rma_apply_start(struct rma_tcp_coll *c);
void rma_apply_stop(struct rma_tcp_coll *c);
/* Read the sockets of a new context (0 or -errno). */
int rma_apply_add(struct rma_tcp_coll *c, struct rma_tcp_ctx *x);
/* Stop reading a context's sockets; returns once the thread no longer touches it. */
void rma_apply_remove(struct rma_tcp_coll *c, struct rma_tcp_ctx *x);

/* ---- the lanes' senders (rma_lane.c) ---- */

/* One lane's part of a striped put: every block of [off, off + len) on that lane. */
struct rma_lane_job {
	struct rma_tcp_ctx *x;
	uint32_t req;
	int peer, context;
	uint32_t win, seq;
	const char *src;	/* the source of offset off (GPU memory if gpu) */
	int gpu;
	uint64_t off, len;
};

/* Blocks of [off, off + len) that go on lane (of nlanes). */
uint32_t rma_lane_blocks(uint64_t off, uint64_t len, int lane, int nlanes);
int rma_lanes_start(struct rma_tcp_coll *c);
void rma_lanes_stop(struct rma_tcp_coll *c);
/* Room for delta more jobs on every lane (a context's requests; negative at its end). */
int rma_lanes_reserve(struct rma_tcp_coll *c, int64_t delta);
/* Queue a job on its lane (never fails once reserved). */
void rma_lane_post(struct rma_tcp_coll *c, int lane, const struct rma_lane_job *j);
/* Drop x's queued jobs and wait until no lane thread works for x. */
void rma_lanes_forget(struct rma_tcp_coll *c, struct rma_tcp_ctx *x);
/* Record the group's first error (queryLastError). */
void rma_coll_fail(struct rma_tcp_coll *c, int err);
/*
 * A stream or lane to the peer failed: the group has failed, and a put
 * whose other parts sit on a socket that still blocks (the peer not reading
 * it) would never end. Every socket of the context call to the peer is
 * shut down, so that each writer to it fails at once and each request to
 * it ends, failed.
 */
void rma_peer_cut(struct rma_tcp_ctx *x, int peer);
/* One part of a put or a get ended (err 0 or -errno): the last one completes it. */
void rma_req_part(struct rma_req *r, int err);

/* ---- the initiator (rma_send.c) ---- */

int rma_send_init(struct rma_tcp_ctx *x);
void rma_send_fini(struct rma_tcp_ctx *x);
int rma_send_post(struct rma_tcp_ctx *x, const struct rail_rma_op *op, uint32_t *idx,
		  uint32_t *stamp);
int rma_send_test(struct rma_tcp_ctx *x, uint32_t idx, uint32_t stamp, int *done);
int rma_send_progress(struct rma_tcp_ctx *x);
/*
 * The stall check (NCCL_RAIL_RMA_STALL_WARN): a thread of the process looks
 * at every added context once a second and names each wait past the limit
 * (one WARN); it runs while any context is added. Remove a context before
 * its streams go away.
 */
void rma_watch_add(struct rma_tcp_ctx *x);
void rma_watch_remove(struct rma_tcp_ctx *x);

extern const struct rail_rma_ops rail_rma_tcp_ops;

#endif
