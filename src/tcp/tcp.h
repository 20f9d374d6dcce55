/*
 * nccl-net-rail: the TCP transport.
 *
 * A connection is one control socket plus nsocks data sockets, opened by
 * the connector and grouped by the listener through a hello message (magic,
 * version, the listen comm's nonce, a connection id, the socket's index and
 * the stream layout). The connector's layout (threads, sockets, inline
 * limit, chunk size) is adopted by the listener, so both sides cut messages
 * identically.
 *
 * Lazy data sockets (NCCL_RAIL_TCP_LAZY, the default; the hello's LAZY
 * flag): the connection starts with its control socket alone (nsocks 0).
 * The first message above the inline limit makes the sender open its data
 * sockets: it dials the receiver's process-wide listener (tcp_rescue.c, the
 * one failover uses) with an OPEN hello per data socket and the same
 * challenge-response as a move, proving it holds the comm's key; the hello
 * says how many it opens (the layout's nsocks, or 1 once the process holds
 * TCP_LAZY_BUDGET comms with data sockets, tcp_host.c). That message and
 * any large one after it wait (their frames sent, their chunks held) until
 * the sockets are up; the receiver takes them (tcp_move_take_open) when it
 * reads the frame of a large message, waiting for the rescue thread to
 * deliver them if need be (a wait NCCL_RAIL_STALL_TIMEOUT bounds). A comm moves (failover) the sockets it has: its
 * control socket alone before the open; an open under way is dropped for a
 * move and started again after it. Without a listener on the receiver's
 * side (its reply names none) every message goes on the control socket.
 *
 * Every message starts with a 24-byte frame header on the control socket
 * (sequence number, tag, size, flags). Messages up to the inline limit
 * follow their header on the control socket and are moved by NCCL's
 * progress thread (isend/irecv/test), as are those up to
 * NCCL_RAIL_TCP_DIRECT that a sender with nothing queued marks INLINE
 * (tcp_isend). Larger ones are cut into at most nsocks
 * chunks; chunk i of message seq travels on data socket
 * (seq + i) % nsocks, moved by the helper thread owning that socket. Each
 * helper handles its tasks in message order on both sides, so the streams
 * never interleave and never deadlock.
 *
 * The control socket carries one thing back from the receiver: a 40-byte
 * refusal when a message does not fit its posted receive (or carries a tag
 * the receive does not expect), so that the sender's next isend or test
 * fails with both sizes too. A peer of an older build never reads it.
 *
 * Layers. The files of src/tcp/ call each other one way only: a file uses
 * the functions and data of files of a lower rank (LAYER.STEP), never of a
 * higher one, and of its own rank only where an "allow" line below says
 * why (none does now). test/check-layering.sh (make test-layering, part of
 * make check) reads this table and nm of the objects and fails naming every
 * use that breaks it. Where a lower layer needs something of an upper one,
 * the upper one passes it down (the ops table, at init). This header's
 * inline code (tcp_move_due) uses layer 0 only.
 *
 *   0.0  tcp_wire    layer 0, no other file: every format exchanged with the peer; key, MACs
 *   0.0  tcp_fault   fault injection (NCCL_RAIL_TCP_FAULT)
 *   0.0  tcp_host    what the host allows: local ranks, CPUs, the pool's bound, the inline limit
 *   0.0  tcp_link    the interfaces' link state, written by the link watch, read by every comm
 *   1.0  tcp_dev     layer 1, devices: discovery, the device table, lookups
 *   1.1  tcp_comm    what every layer needs of a comm: ops table, first error, path failure
 *   2.0  tcp_pool    layer 2, a comm's resources: the helper threads that move chunks
 *   2.0  tcp_ctl     the control socket's request FIFO and the send side's writer (the ring)
 *   2.0  tcp_rescue  the rescue listeners, the link watch, the registry of comms that can move
 *   3.0  tcp_move    layer 3, failover: a comm's move to another interface, and back
 *   4.0  tcp_data    layer 4, the data path: isend, irecv, test, close (drives a due move)
 *   5.0  tcp_conn    layer 5, connection setup: listen, connect, accept
 *   6.0  tcp_init    layer 6, the ops table; init and fini, properties, registrations
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
/*
 * 2: rescue addresses after the hello and the reply; 3: a key share in that
 * block, and a challenge-response on the rescue listeners; 4: the hello's
 * flags (LAZY) and the OPEN kind of move hello; 5: the frame's INLINE flag.
 */
#define TCP_WIRE_VERSION 5
#define TCP_WIRE_VERSION_STR "5"
#define TCP_HELLO_SIZE 40
#define TCP_REPLY_SIZE 8
#define TCP_FRAME_SIZE 24
#define TCP_REFUSAL_MAGIC 0x52u
#define TCP_REFUSAL_SIZE 40

struct tcp_hello {
	uint16_t index;		/* 0: control socket, 1..nsocks: data sockets */
	uint64_t nonce;		/* the listen comm's, from the handle */
	uint64_t conn_id;	/* random, groups the sockets of one connection */
	uint16_t nsocks;	/* LAZY: the data sockets the sender may open later */
	uint8_t nthreads;
	uint8_t flags;		/* TCP_HELLO_LAZY */
	uint32_t inline_max;
	uint32_t min_chunk;
};
/* Only the control socket comes now; the data sockets are opened at the first large message. */
#define TCP_HELLO_LAZY 0x01u

struct tcp_frame {
	uint64_t seq;
	int32_t tag;
	uint64_t size;
	uint8_t flags;		/* TCP_FRAME_INLINE */
};
/*
 * The message's bytes follow its frame on the control socket although it is
 * larger than the inline limit: a sender with nothing queued in its process
 * sends one up to NCCL_RAIL_TCP_DIRECT that way (tcp_isend).
 */
#define TCP_FRAME_INLINE 0x01u
#define TCP_DIRECT_MAX (512u << 10)	/* NCCL_RAIL_TCP_DIRECT's maximum: no INLINE frame is larger */

void tcp_hello_encode(const struct tcp_hello *h, uint8_t out[TCP_HELLO_SIZE]);
/* -EPROTO / -EPROTONOSUPPORT / -EBADMSG with a reason in why. */
int tcp_hello_decode(const uint8_t in[TCP_HELLO_SIZE], struct tcp_hello *h, char *why,
		     size_t why_len);
void tcp_reply_encode(int status, uint8_t out[TCP_REPLY_SIZE]);
/* Returns the listener's status (0 accepted, >0 an errno why not), or -EPROTO. */
int tcp_reply_decode(const uint8_t in[TCP_REPLY_SIZE]);
/*
 * Version 2: the hello of socket 0 and an accepting reply are followed by
 * the sender's rescue addresses (one listener per interface and process,
 * tcp_rescue.c), at most TCP_RESCUE_MAX; count 0 when failover is off or
 * the process has a single interface. Version 3: and by 32 random bytes of
 * each side (the share), from which both derive the comm's key
 * (tcp_move_key); the key itself never travels.
 */
#define TCP_RESCUE_MAX 4
#define TCP_SHARE_SIZE 32
#define TCP_RESCUE_SIZE 120
struct tcp_rescue {
	int count;
	union rail_sockaddr addr[TCP_RESCUE_MAX];
	uint8_t share[TCP_SHARE_SIZE];	/* its side's part of the comm's key */
};
void tcp_rescue_encode(const struct tcp_rescue *r, uint8_t out[TCP_RESCUE_SIZE]);
int tcp_rescue_decode(const uint8_t in[TCP_RESCUE_SIZE], struct tcp_rescue *r);

/*
 * The comm's key: HMAC-SHA256 keyed with both shares (the connector's
 * first) over a label, the conn_id and the nonce. Only the two ends of the
 * original connection know it (docs/FAILOVER.md section 6 says against whom).
 */
#define TCP_KEY_SIZE 32
#define TCP_MAC_SIZE 32
void tcp_move_key(const uint8_t conn_share[TCP_SHARE_SIZE],
		  const uint8_t listen_share[TCP_SHARE_SIZE], uint64_t conn_id, uint64_t nonce,
		  uint8_t key[TCP_KEY_SIZE]);

/*
 * On a rescue listener: the hello of a socket of a moved connection (kind
 * SOCKET, or BACK when it moves back to its first interface; index 0 the
 * control socket), or a receiver asking its sender to move (kind KICK, one
 * socket, closed after it). Version 3: a handshake before anything changes,
 *
 *   mover -> listener  hello: ..., conn_id, 16 fresh random bytes (rand)
 *   listener -> mover  challenge: 16 fresh random bytes (rand), and
 *                      MAC(key, LISTENER, hello, challenge rand)
 *   mover -> listener  proof: MAC(key, MOVER, hello, challenge rand)
 *
 * MAC = HMAC-SHA256 (tcp_move_mac). Each side checks the other's MAC before
 * going on: the listener hands the socket over (or takes the request to
 * move) only after a right proof, and the mover goes on only after a right
 * challenge. Replaying a recorded proof fails: the challenge is new.
 */
#define TCP_MOVE_MAGIC 0x4d435452u /* "RTCM" */
#define TCP_MOVE_HELLO_SIZE 56
#define TCP_MOVE_RAND_SIZE 16
/* OPEN: a data socket of a lazy comm's first open (index 1..nsocks), on the same interface. */
enum { TCP_MOVE_SOCKET = 1, TCP_MOVE_KICK = 2, TCP_MOVE_BACK = 3, TCP_MOVE_OPEN = 4 };
struct tcp_move_hello {
	int kind;
	uint16_t index;
	uint16_t nsocks;
	uint32_t gen;		/* the attempt's number, per comm */
	uint32_t up_s;		/* BACK: how long the sender's first interface has run */
	uint64_t nonce;		/* the listen comm's */
	uint64_t conn_id;
	uint8_t rand[TCP_MOVE_RAND_SIZE];	/* the mover's, fresh per attempt */
};
void tcp_move_hello_encode(const struct tcp_move_hello *h, uint8_t out[TCP_MOVE_HELLO_SIZE]);
int tcp_move_hello_decode(const uint8_t in[TCP_MOVE_HELLO_SIZE], struct tcp_move_hello *h);

#define TCP_MOVE_CHALLENGE_MAGIC 0x43435452u /* "RTCC" */
#define TCP_MOVE_CHALLENGE_SIZE (8 + TCP_MOVE_RAND_SIZE + TCP_MAC_SIZE)
#define TCP_MOVE_PROOF_MAGIC 0x52435452u /* "RTCR" */
#define TCP_MOVE_PROOF_SIZE (8 + TCP_MAC_SIZE)
/* Who computes a MAC of the move handshake. */
enum tcp_move_role { TCP_ROLE_LISTENER = 1, TCP_ROLE_MOVER = 2 };
void tcp_move_mac(const uint8_t key[TCP_KEY_SIZE], enum tcp_move_role role,
		  const uint8_t hello[TCP_MOVE_HELLO_SIZE],
		  const uint8_t challenge[TCP_MOVE_RAND_SIZE], uint8_t mac[TCP_MAC_SIZE]);
void tcp_move_challenge_encode(const uint8_t rand[TCP_MOVE_RAND_SIZE],
			       const uint8_t mac[TCP_MAC_SIZE],
			       uint8_t out[TCP_MOVE_CHALLENGE_SIZE]);
/* -EPROTO unless well-formed; the MAC is the caller's to check. */
int tcp_move_challenge_decode(const uint8_t in[TCP_MOVE_CHALLENGE_SIZE],
			      uint8_t rand[TCP_MOVE_RAND_SIZE], uint8_t mac[TCP_MAC_SIZE]);
void tcp_move_proof_encode(const uint8_t mac[TCP_MAC_SIZE], uint8_t out[TCP_MOVE_PROOF_SIZE]);
int tcp_move_proof_decode(const uint8_t in[TCP_MOVE_PROOF_SIZE], uint8_t mac[TCP_MAC_SIZE]);

/*
 * The receiver's answer on the new control socket: for each stream
 * (control first, then the data sockets) the byte offset the sender must
 * resume at (all it consumed, plus what the old socket's kernel buffer
 * still holds, which it reads first).
 */
#define TCP_STATE_MAGIC 0x53435452u /* "RTCS" */
/* Declined (the sender stays where it runs): pos[0] says why. */
#define TCP_STATE_BUSY_MAGIC 0x42435452u /* "RTCB" */
enum { TCP_BUSY_LEFTOVERS = 1, TCP_BUSY_DOWN = 2 };
#define TCP_STATE_SIZE(nsocks) (16 + 8 * ((size_t)(nsocks) + 1))
int tcp_state_encode(uint32_t gen, int busy, int nsocks, const uint64_t *pos, uint8_t *out);
/* Fills pos[0..nsocks]; -EBUSY when declined, -EPROTO when malformed or of another move. */
int tcp_state_decode(const uint8_t *in, uint32_t gen, int nsocks, uint64_t *pos);

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

/* ---- what the host allows (tcp_host.c) ---- */

#define TCP_POOL_MAX 64
/* The helper pool's bound: NCCL_RAIL_TCP_THREADS, or the rule of tcp_host.c. */
int tcp_pool_size(char *why, size_t why_len);
/*
 * Messages up to the inline limit go on the control socket: NCCL_RAIL_TCP_INLINE, or
 * tcp_host.c's rule (the default, or more on a crowded host).
 */
#define TCP_INLINE_DEFAULT (16u << 10)
#define TCP_INLINE_CROWDED (4u << 20)
#define TCP_CROWDED_CPUS 4	/* fewer CPUs per local rank: a crowded host */
uint32_t tcp_inline_max(char *why, size_t why_len);
/*
 * Lazy data sockets: how many a comm opens, wanting `want`: all of them
 * while fewer than TCP_LAZY_BUDGET comms of this process hold data
 * sockets, else 1 (bandwidth then comes from the many comms at once).
 * tcp_data_comms_add counts a comm that got (+1) or closed (-1) its data
 * sockets.
 */
#define TCP_LAZY_BUDGET 64
int tcp_lazy_socks(int want);
void tcp_data_comms_add(int d);
int tcp_data_comms(void);
/*
 * The ranks a launcher says share this host (OMPI_COMM_WORLD_LOCAL_SIZE,
 * MPI_LOCALNRANKS, LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE), or 0; *from
 * names the variable.
 */
int tcp_local_ranks(const char **from);

/* ---- devices (tcp_dev.c) ---- */

struct tcp_dev {
	char name[IF_NAMESIZE];
	union rail_sockaddr addr;
	char pci_path[PATH_MAX];
	int has_pci;
	int speed;
};

/* Find the interfaces (at init): their number, or 0 or -errno with a reason in why. */
int tcp_devs_init(char *why, size_t why_len);
void tcp_devs_fini(void);
/* NULL unless 0 <= dev < tcp_ndevs_now(). */
const struct tcp_dev *tcp_dev_get(int dev);
int tcp_ndevs_now(void);
/* How the interfaces were chosen (NCCL_SOCKET_IFNAME ...), for the description. */
const char *tcp_devs_rule(void);
int tcp_same_ip(const union rail_sockaddr *a, const union rail_sockaddr *b);
/* The interface (device index) holding local address a, or -1. */
int tcp_dev_of_addr(const union rail_sockaddr *a);

/*
 * ---- the interfaces' link state (tcp_link.c) ----
 * Written by the link watch (tcp_rescue.c), read by every comm: the
 * lowest layer, so that tcp_move_due below depends on nothing above it.
 */
/* Bumped at every change of an interface's state; whether dev is down now. */
uint32_t tcp_link_gen(void);
int tcp_link_down(int dev);
/* When dev last started running (rail_now_ns()), or 0 while it is down. */
uint64_t tcp_link_up_since(int dev);
/* The link watch: dev runs, from now (at its start). */
void tcp_link_reset(int dev);
/* The link watch: dev runs or not; 1 when that changed (and the generation was bumped). */
int tcp_link_set(int dev, int running);

/* ---- comms ---- */

struct tcp_comm;

struct tcp_task {
	void *buf;
	size_t len;
	int fd;
	struct tcp_req *req;
	void *ev;		/* its profiler event, stopped by whoever moves it (prof.h), or NULL */
	uint64_t start;		/* the stream offset of its first byte */
	int direct;		/* moved by NCCL's progress thread: no helper watches for it */
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
	_Atomic uint32_t tail;		/* written by the owner: moved (send: written) */
	/* send with ack completion: chunks before it are acknowledged by the peer's kernel */
	_Atomic uint32_t ack_tail;
	uint64_t pushed;		/* progress thread: stream bytes queued */
	_Atomic int ready;		/* set up: the owner may use it */
	_Atomic int kicked;		/* on the owner's inbox */
	_Atomic int detached;		/* the owner forgot it: it can be freed */
	_Atomic int busy;		/* a thread is moving its chunks (owner or progress) */
	_Atomic int again;		/* look again: a thread found it busy */
	struct tcp_stream *inbox_next;
	/* owner only */
	size_t off;			/* bytes of the head chunk moved */
	uint64_t moved;			/* stream bytes moved (send: written, recv: read) */
	int old_fd;			/* recv after a move: the old socket, read first */
	uint64_t old_left;		/* bytes still to read there */
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
	int inl;			/* send: its bytes follow the frame on the control socket */
	uint64_t ctl_end;		/* send, failover: control stream offset after its bytes */
	uint64_t first_seq;		/* receive: the message of its first matched entry */
	uint64_t seq;			/* send: its message number */
	int held;			/* send: its chunks wait for the lazy open (one pending) */
	struct tcp_req *held_next;	/* send: the next held request */
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
	uint32_t stream_ring;		/* entries of each stream's ring (tcp_pool_attach) */
	/* lazy data sockets: none open yet (nsocks 0) until the first large message */
	int lazy;
	int lazy_max;			/* the layout's nsocks: at most this many */
	int lazy_threads;		/* and its nthreads */
	int counted;			/* in tcp_data_comms */
	int held;			/* send: large messages waiting for the open */
	struct tcp_req *held_head, *held_tail;	/* send: them, in posting order */
	int help;			/* NCCL_RAIL_TCP_HELP */
	size_t direct_max;		/* NCCL_RAIL_TCP_DIRECT, 0 without help */
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
	/* ---- failover (tcp_move.c) ---- */
	int fo;				/* this comm can move to another interface */
	int ack;			/* sends complete when the peer's kernel acknowledged them */
	int cur_dev;			/* the local interface it runs on now */
	union rail_sockaddr peer_addr;	/* the peer's address now (control socket) */
	struct tcp_rescue peer_rescue;	/* the peer's rescue listeners */
	uint64_t conn_id, nonce;
	uint8_t key[TCP_KEY_SIZE];	/* known to both ends only (tcp_move_key) */
	uint32_t link_gen;		/* tcp_link_gen() when last looked at */
	_Atomic int path_err;		/* a socket error that means "path", not "peer" */
	_Atomic int moving;		/* send: streams paused while a move is under way */
	_Atomic uint32_t peer_kick;	/* send: the receiver asked for move number n */
	int moves;			/* the number of the last completed move (attempts count) */
	uint32_t attempts;		/* send: the number of the last attempt */
	union rail_sockaddr home_peer;	/* the peer's first address */
	int away;			/* send: moved away from it; moves back after the hold-down */
	uint64_t back_after;		/* send: no move back before this time */
	uint64_t recover_t0;		/* send: the last move's fault, until a message completes */
	struct tcp_move *mv;		/* the move under way */
	/* send: the control stream's copy, kept until the peer's kernel acknowledged it */
	uint8_t *ring;
	size_t ring_size;
	uint64_t ring_acked, ring_sent, ring_staged;
	struct tcp_req *ring_next;	/* first request of the FIFO not yet copied in */
	/* receive: control stream bytes read, and the old control socket after a move */
	uint64_t ctl_rx;
	int ctl_old_fd;
	uint64_t ctl_old_left;
	/* receive: sockets of a move delivered by the rescue thread (under rescue_lock) */
	pthread_mutex_t rescue_lock;
	uint32_t rescue_gen;
	struct tcp_move_hello rescue_hello;	/* of the sockets delivered */
	int rescue_n;
	int rescue_fds[TCP_MAX_SOCKS + 1];
	_Atomic int rescue_ready;
	/* receive, lazy: the data sockets of an open, delivered by the rescue thread */
	uint32_t open_gen;
	int open_nsocks, open_n;
	int open_fds[TCP_MAX_SOCKS];
	_Atomic int open_ready;
	struct tcp_comm *reg_next;	/* the registry of comms that can move */
	/* live memory registrations (ids handed out as mhandles), any thread */
	pthread_mutex_t mr_lock;
	uintptr_t *mrs;
	int nmrs, cap_mrs;
};

/* ---- what every layer needs of a comm (tcp_comm.c) ---- */
/* The ops table new comms carry (tcp_init.c, at init: the table is above every layer). */
void tcp_comm_ops_set(const struct rail_transport_ops *ops);
const struct rail_transport_ops *tcp_comm_ops(void);
const char *tcp_comm_dev_name(const struct tcp_comm *c);
/*
 * Record the first error of a comm and log it (once, and not while the
 * comm is being closed). Returns err.
 */
int tcp_comm_fail(struct tcp_comm *c, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* A socket error that means the path failed (not the peer process): a move may heal it. */
int tcp_path_error(int err);
/* Record a path failure of a comm that can move (1), or 0: the caller fails as today. */
int tcp_path_failed(struct tcp_comm *c, int err);

/* ---- the control socket's side of the requests (tcp_ctl.c) ---- */
/* Append a request to the comm's FIFO (posting order, both sides); drop its head. */
void tcp_ctl_push(struct tcp_comm *c, struct tcp_req *r);
void tcp_ctl_pop(struct tcp_comm *c);
/* Send bytes [*off, hlen + plen) of header + payload without blocking; 0, -EAGAIN or -errno. */
int tcp_ctl_write(int fd, const uint8_t *hdr, size_t hlen, const char *payload, size_t plen,
		  size_t *off);
/*
 * Send side: write the frames and inline bytes of the FIFO's requests (or
 * what the control stream holds after a move rewound it); 0 or the error.
 */
int tcp_ctl_flush(struct tcp_comm *c);

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
		    const union rail_sockaddr *peer, const struct tcp_rescue *rescue,
		    const uint8_t key[TCP_KEY_SIZE], struct tcp_comm **out);
int tcp_isend(struct rail_comm *send_comm, struct rail_req *req, void *data, size_t size,
	      int tag, void *mhandle);
int tcp_irecv(struct rail_comm *recv_comm, struct rail_req *req, int n, void **data,
	      const size_t *sizes, const int *tags, void **mhandles);
int tcp_test(struct rail_req *req, int *done, size_t *sizes);
int tcp_close(struct rail_comm *comm);

/* tcp_init.c: memory registrations, tracked per comm so a second deregMr fails. */
int tcp_reg_mr(struct rail_comm *comm, void *data, size_t size, int type, void **mh);
int tcp_dereg_mr(struct rail_comm *comm, void *mh);

/*
 * tcp_pool.c: one bounded pool of helper threads per process, shared by all
 * comms, started lazily (a thread per new socket until the bound,
 * tcp_pool_size) and stopped by tcp_pool_stop at the transport's fini.
 */
/* Start the first thread early, at listen and connect (best effort). */
void tcp_pool_reserve(void);
/* Hand the comm's data sockets to the pool; on failure nothing stays attached. */
int tcp_pool_attach(struct tcp_comm *c, uint32_t ring_size);
/* Take them back (after shutdown): on return no pool thread touches the comm. */
void tcp_pool_detach(struct tcp_comm *c);
/*
 * Queue a chunk on data socket sock (NCCL's progress thread only); ev: its
 * profiler event, stopped by whoever moves the chunk (prof.h), or NULL.
 * direct: the caller moves it now and in later test() calls (tcp_pool_help),
 * and no helper is woken for it (a socket that is not ready then is polled
 * by those calls, not watched by a helper).
 */
void tcp_pool_push(struct tcp_comm *c, int sock, void *buf, size_t len, struct tcp_req *req,
		   void *ev, int direct);
/*
 * No chunk of any comm of the process is queued or in flight: a message
 * moved now by the progress thread delays nothing else it would move.
 */
int tcp_pool_idle(void);
/*
 * NCCL's progress thread, in test(): move the comm's queued chunks itself
 * where no helper is moving them (a bounded amount), so a message does not
 * wait for a helper to be woken and scheduled on a busy host.
 */
void tcp_pool_help(struct tcp_comm *c);
/* Threads running now. */
int tcp_pool_threads(void);
/* Since the process started: chunks pushed direct, chunks helper threads moved (tests). */
void tcp_pool_counts(uint64_t *direct, uint64_t *helper);
/* Since the process started: messages above the inline limit sent inline (tests). */
uint64_t tcp_data_idle_inline(void);
/* Stop and join every pool thread (no comm may be attached). */
void tcp_pool_stop(void);

/*
 * tcp_pool.c, for a move (the caller holds every stream's busy flag, taken
 * with tcp_pool_pause and given back with tcp_pool_resume, which kicks).
 */
void tcp_pool_pause(struct tcp_comm *c);
void tcp_pool_resume(struct tcp_comm *c);
/* Send: go on at stream offset pos on fd (chunks before it complete); bytes re-sent, or -EPROTO. */
int64_t tcp_pool_resume_send(struct tcp_comm *c, int i, uint64_t pos, int fd);
/* Receive: bytes consumed on stream i, plus what its socket holds (FIONREAD); -errno. */
int64_t tcp_pool_recv_pos(struct tcp_comm *c, int i, uint64_t *inq);
/* Receive: read inq more bytes from the old socket, then fd. */
void tcp_pool_switch_recv(struct tcp_comm *c, int i, uint64_t inq, int fd);
/* Send with ack completion: complete the chunks the peer's kernel acknowledged. */
void tcp_pool_ack(struct tcp_comm *c);

/* ---- failover: tcp_rescue.c (listeners, link watch, registry) and tcp_move.c ---- */
/*
 * The rescue thread never waits on one peer: accepted sockets are
 * non-blocking, each with its handshake's state, closed unless the
 * handshake is done within TCP_RESCUE_HELLO_NS of the accept. At most
 * TCP_RESCUE_PENDING at once; beyond, the oldest is closed if it has waited
 * TCP_RESCUE_MIN_AGE_NS (a mover answers within one call of its progress
 * thread), else new connections wait in the listener's backlog. A lazy
 * comm's data socket whose hello named the comm has TCP_RESCUE_OPEN_NS and
 * is never closed to make room.
 */
#define TCP_RESCUE_PENDING 512
#define TCP_RESCUE_HELLO_NS (2ull * 1000000000ull)
#define TCP_RESCUE_MIN_AGE_NS (500ull * 1000000ull)
/*
 * A lazy comm's open: how long the sender waits for its connects and the
 * challenges, and the listener for the proof of a hello that named one of
 * its comms (never closed to make room meanwhile).
 */
#define TCP_RESCUE_OPEN_NS (30ull * 1000000000ull)
/* Start the rescue listeners and the link watch (failover on, two interfaces or more). */
void tcp_rescue_start(void);
void tcp_rescue_stop(void);
/* This process's rescue addresses (count 0 when none run). */
void tcp_rescue_mine(struct tcp_rescue *r);
void tcp_rescue_register(struct tcp_comm *c);
void tcp_rescue_unregister(struct tcp_comm *c);

/* Called by isend/irecv/test when a move may be due or under way; 0 or the comm's error. */
int tcp_move_send(struct tcp_comm *c);
int tcp_move_recv(struct tcp_comm *c);
void tcp_move_free(struct tcp_comm *c);
/*
 * Lazy data sockets. Send: start opening them (none open, no move or open
 * under way); tcp_move_send drives it, and on return c->nsocks > 0 once they
 * are up. Receive: take the delivered ones, if complete (1), else 0.
 */
int tcp_move_open(struct tcp_comm *c);
int tcp_move_take_open(struct tcp_comm *c);
/* The first message completed after a move: log the time since the fault (INFO). */
void tcp_move_first_done(struct tcp_comm *c);
static inline int tcp_move_due(struct tcp_comm *c)
{
	return c->mv ||
	       (c->fo && (atomic_load_explicit(&c->path_err, memory_order_relaxed) ||
			  atomic_load_explicit(&c->rescue_ready, memory_order_relaxed) ||
			  atomic_load_explicit(&c->peer_kick, memory_order_relaxed) >
				  (uint32_t)c->moves || c->away || tcp_link_gen() != c->link_gen));
}

/* tcp_fault.c: NCCL_RAIL_TCP_FAULT, read at init. */
void tcp_fault_arm(void);
/* 0, or the -errno a helper thread creation must fail with. */
int tcp_fault_thread_create(void);
/* 0, or the -errno an accepting side's reply to a connector must fail with. */
int tcp_fault_accept_reply(void);

extern const struct rail_transport_ops rail_tcp_ops;

#endif
