/*
 * nccl-net-rail: the verbs transport's private header.
 *
 * Objects:
 *   rail_ib_hca   one opened RDMA device (ibv_context): its PD, the
 *                 registration cache, the GPU-memory ladder, the async
 *                 event thread, a fatal-event counter.
 *   rail_ib_dev   one usable port of an HCA (a "physical device" for NCCL).
 *   rail_ib_vdev  what NCCL indexes: one dev, or several fused
 *                 (make_vdevice). vdev i < ndev is dev i.
 *   rail_ib_comm  a send or receive comm: per member device a CQ, QPs
 *                 spread over the members, the CTS FIFO and credit word
 *                 (sender) or the completion records, want word and eager
 *                 ring (receiver). Protocol: ib_send.c; the eager path and
 *                 its flow control: ib_eager.c; receives: ib_recv.c.
 *
 * Layers. The files of src/ib/ call each other one way only: a file uses
 * the functions and data of files of a lower rank (LAYER.STEP), never of a
 * higher one, and of its own rank only where an "allow" line below says
 * why. test/check-layering.sh (make test-layering, part of make check)
 * reads this table and nm of the objects and fails naming every use that
 * breaks it. Where a lower layer must reach an upper one, the upper one
 * drives: it passes what is needed down when it sets things up.
 *
 *   0.0  ib_verbs    layer 0, the library: libibverbs through dlopen (rail_ibv)
 *   0.0  ib_fault    fault injection into that table (NCCL_RAIL_IB_FAULT)
 *   0.0  ib_wire     every format exchanged with the peer: pure codecs
 *   0.1  ib_mqp      ibv_modify_qp retried as NCCL does, on the handshake's thread only
 *   0.2  ib_job      the handshakes' helper threads, shared (ib_job.h)
 *   1.0  ib_gid      layer 1, devices: RoCE GID choice from the sysfs table
 *   1.0  ib_ladder   the GPU-memory ladder of an HCA
 *   1.1  ib_init     discovery, the device table, properties, NIC fusion
 *   1.2  ib_async    the async-event thread of an HCA (finds its devices)
 *   1.2  ib_report   what rail-info prints about the verbs side
 *   1.3  ib_move_rules  where a moving comm's member goes: home, a survivor, the fallback
 *   1.4  ib_subnet   a new connection's device on the peer's subnet (NCCL_IB_SUBNET_AWARE_ROUTING)
 *   2.0  ib_qp       layer 2, a comm's resources: CQs, control regions, QPs
 *   2.0  ib_mr       the registration cache of an HCA, regMr and deregMr
 *   2.1  ib_flush    the self-connected QP: flushes and loopback copies
 *   2.2  ib_chan     framed messages on a comm's handshake socket after connect
 *   2.3  ib_probe    the probe of a comm's way home (failover's move back)
 *   3.0  ib_engine   layer 3, the progress engine: posting, CQ poll, dispatch
 *   4.0  ib_eager    layer 4, send/receive: the eager ring, flow control
 *   4.1  ib_send     the send side: isend, CTS batches (the protocol: its top)
 *   4.1  ib_recv     the receive side: irecv, CTS writes, answers
 *   4.2  ib_move     a comm's move to another path (failover, docs/FAILOVER.md)
 *   4.3  ib_move_thread  the thread driving the moves of comms NCCL does not call
 *   5.0  ib_conn     layer 5, connection setup: handshake, comms, the listen comm's close
 *   5.1  ib_close    closing a send or receive comm: the last sends drained, a move settled
 *   6.0  ib_ops      layer 6, the ops table (src/transport.c); init and fini
 *
 *   allow  ib_verbs -> ib_fault  one unit: unloading the table disarms its faults
 *   allow  ib_fault -> ib_verbs  one unit: the fault wrappers replace table entries
 *   allow  ib_move -> ib_move_thread  one unit: arm and free register comms with the thread
 */
#ifndef RAIL_IB_H
#define RAIL_IB_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "ib/ib_gid.h"
#include "ib/ib_verbs.h"
#include "ib/ib_wire.h"
#include "matchlist.h"
#include "rail.h"
#include "sock.h"
#include "transport.h"

#define RAIL_IB_MAX_HCAS 32
#define RAIL_IB_MAX_DEVS 64
#define RAIL_IB_MAX_VDEVS 128
#define RAIL_IB_NAME_MAX 64
/* NCCL_IB_AR_THRESHOLD left at auto (NCCL 2.30: -2): NCCL's 8192 bytes. */
#define RAIL_IB_AR_THRESHOLD_AUTO 8192
#define RAIL_IB_CQ_POLL 16	/* CQEs per ibv_poll_cq */

/* GPU memory: the ladder decided per HCA at init (ib_ladder.c). */
struct rail_ib_ladder {
	int dmabuf;		/* ibv_reg_dmabuf_mr works and NCCL_DMABUF_ENABLE */
	int peermem;		/* nvidia peermem present */
	char dmabuf_why[160];
	char peermem_why[200];
	char summary[96];	/* "DMA-BUF", "peermem", "host memory only" */
};

struct rail_ib_mr_ent;
struct rail_ib_comm;

struct rail_ib_hca {
	char name[RAIL_IB_NAME_MAX];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr attr;
	int max_inline;		/* probed inline size of an RC QP */
	struct rail_ib_ladder ladder;
	/*
	 * mlx5 Data Direct (ib_init.c dd_decide): the device has a Data Direct
	 * DMA function, at dd_path ("/sys" + what libmlx5 names), that its
	 * ports are exposed on (NCCL_IB_DATA_DIRECT).
	 */
	int data_direct;
	char dd_path[PATH_MAX];
	atomic_int fatal;	/* DEVICE_FATAL seen */
	/* registration cache (ib_mr.c), sorted by address */
	pthread_mutex_t mr_lock;
	struct rail_ib_mr_ent **mrs;
	int nmrs, mrs_cap;
	/* async events (ib_async.c) */
	pthread_t async_thread;
	int async_started;
	int async_wake[2];
};

struct rail_ib_dev {
	char name[RAIL_IB_NAME_MAX];	/* unique: "mlx5_0" or "mlx5_0:2" */
	struct rail_ib_hca *hca;
	int port;
	int link_layer;		/* IBV_LINK_LAYER_* */
	enum ibv_mtu mtu;	/* active */
	uint16_t lid;
	uint8_t port_flags;	/* ibv_port_attr.flags: IBV_QPF_GRH_REQUIRED */
	/*
	 * Mbps, what getProperties reports: read at init, again by the async
	 * thread on DEVICE_SPEED_CHANGE and PORT_ACTIVE (rail_ib_port_speed_read).
	 */
	atomic_int speed;
	int gid_tbl_len;
	/*
	 * The GID chosen at init, updated by the async thread on GID_CHANGE
	 * (which alone reads it afterwards): a connection resolves its own
	 * (rail_ib_dev_gid_resolve, into rail_ib_devres.gid).
	 */
	struct rail_ib_gid_choice gid;
	uint64_t guid;		/* sys_image_guid */
	char pci_path[PATH_MAX];	/* the PCI function's real sysfs path */
	/*
	 * What NCCL reports (init.cc): the path with the function digit
	 * zeroed (and the device digits, NCCL_IB_MERGE_VFS), so that the ports
	 * and functions of one card sit on one NIC; and a port number unique
	 * on that card: ibv port + the number of earlier devices on that path.
	 */
	char nccl_pci_path[PATH_MAX];
	int nccl_port;
	/*
	 * Exposed on the HCA's Data Direct function (pci_path and
	 * nccl_pci_path are its path, as NCCL reports it: not shortened):
	 * DMA-BUF registrations go through mlx5dv_reg_dmabuf_mr with the Data
	 * Direct access bit, and the properties ask NCCL for forceFlush.
	 */
	int data_direct;
	int rail, plane;	/* from NCCL_IB_HCA, -1 unset */
	int plane_bit;		/* its plane's bit in a fused NIC's planeId (plane_bits) */
	int ar;			/* adaptive routing: NCCL_IB_ADAPTIVE_ROUTING, else IB only */
	/* async thread: the last port event was PORT_ERR (new connections refused) */
	atomic_int port_err;
	/* PORT_ERR events seen: a comm made before the last one fails (rail_ib_comm_check) */
	atomic_uint port_downs;
	/* when the last PORT_ACTIVE came (rail_now_ns), 0 since a PORT_ERR: move-back's hold-down */
	_Atomic uint64_t up_ns;
};

struct rail_ib_vdev {
	char name[RAIL_IB_NAME_MAX * 2];
	int ndevs;
	int devs[RAIL_MAX_VDEV_DEVS];
	int plane;		/* v12 planeId: the device's, or fused (vdev_plane) */
};

/* ---- device table (ib_init.c) ------------------------------------------ */
/*
 * Discovery (the ops' init, ib_ops.c): the number of devices, or 0 with
 * why. The ops' fini stops what the upper layers keep per HCA, then
 * rail_ib_devices_fini closes the HCAs and unloads libibverbs.
 */
int rail_ib_devices_init(char *why, size_t why_len);
void rail_ib_devices_fini(void);
int rail_ib_hca_count(void);
struct rail_ib_hca *rail_ib_hca_get(int i);
/* The ops of the same names (struct rail_transport_ops). */
int rail_ib_ndevs(void);
int rail_ib_get_props(int vdev, struct rail_props *props);
void rail_ib_describe(char *buf, size_t len);
int rail_ib_make_vdevice(int n, const int *devs, int *vdev);
int rail_ib_ndevs_phys(void);
struct rail_ib_dev *rail_ib_dev_get(int dev);
/* d's number (NCCL's device index), -1 if d is not in the table. */
int rail_ib_dev_num(const struct rail_ib_dev *d);
/* NULL if vdev does not exist. */
const struct rail_ib_vdev *rail_ib_vdev_get(int vdev);
/* The OOB address (listen sockets bind it). */
const union rail_sockaddr *rail_ib_oob_addr(void);
const char *rail_link_layer_str(int ll);
/* NCCL's table: Mbps for an active_speed(_ex) code and an active_width code. */
int rail_ib_port_speed(uint32_t active_speed, int active_width);
/* The GID a new connection on dev uses, from the table now; -ENOENT (out->reason). */
int rail_ib_dev_gid_resolve(const struct rail_ib_dev *dev, struct rail_ib_gid_choice *out);
int rail_ib_mtu_bytes(enum ibv_mtu mtu);

/* ---- discovery, shared with the report (ib_init.c) --------------------- */
struct rail_ib_port_info {
	char hca[RAIL_IB_NAME_MAX];
	int port;
	union {
		struct ibv_port_attr attr;
		struct rail_port_attr attr_ext;	/* with active_speed_ex */
	};
	int speed;		/* Mbps, by NCCL's rule (ib_init.c port_mbps) */
	int kept;
	char why[160];		/* why not kept */
};
/*
 * The port's speed now, by init's rule (NCCL's: ibv_query_port_speed, else
 * the table), in *mbps, and its state (enum ibv_port_state) in *state; 0 or
 * a negative errno (ibv_query_port failed).
 */
int rail_ib_port_speed_read(struct ibv_context *ctx, int port, int *mbps, int *state);
/* "DOWN", "ACTIVE", ... for an enum ibv_port_state. */
const char *rail_ib_port_state_str(int state);
/* Query one port and decide whether to use it (state, link layer, NCCL_IB_HCA). */
int rail_ib_port_check(struct ibv_context *ctx, const char *hca, int port,
		       struct rail_ib_port_info *out, const struct rail_match_entry **entry);

/* Parse NCCL_IB_HCA for rail_ib_port_check (init and the report). */
void rail_ib_hca_filter_load(void);
/* The device list in NCCL's order (NCCL_IB_DEVICE_PCI_ORDER): a copy to free(), or NULL. */
struct ibv_device **rail_ib_dev_order(struct ibv_device **list, int n);

/* ---- where a moving comm's member goes (ib_move_rules.c) ---------------- */
/* d's port is down (its last port event was PORT_ERR) or its HCA is dead. */
int rail_ib_dev_down(const struct rail_ib_dev *d);
/* Of the n devices in v, the nearest to d on PCIe (longest common sysfs path); NULL if none. */
struct rail_ib_dev *rail_ib_dev_nearest(const struct rail_ib_dev *d, struct rail_ib_dev *const *v,
					int n);
/*
 * Where a comm on d moves when d cannot serve, a usable port of d's link
 * layer: the topology model's fallback for the GPU whose first choice is d,
 * else the nearest to d by PCI path; why says which. NULL: none usable.
 */
struct rail_ib_dev *rail_ib_dev_fallback(const struct rail_ib_dev *d, char *why, size_t len);
/* 1 if d's GID is on the network of peer_gid (net: d's network, rail_ib_gid_net). */
int rail_ib_dev_reaches(const struct rail_ib_dev *d, const uint8_t *peer_gid,
			struct rail_ib_gid_net *net);
/* The usable port of to's link layer on peer_gid's network nearest to `to` (net: its), or NULL. */
struct rail_ib_dev *rail_ib_dev_on_net(const struct rail_ib_dev *to, const uint8_t *peer_gid,
				       struct rail_ib_gid_net *net);
/* Member m of c: its port went down since it was built, or is down; any member. */
int rail_ib_member_down(const struct rail_ib_comm *c, int m);
int rail_ib_own_port_down(const struct rail_ib_comm *c);
/* Seconds the homes of the members away have all been up (PORT_ACTIVE), -1: one down, none away. */
int64_t rail_ib_home_up_s(const struct rail_ib_comm *c);
/* Time to go home: the hold-down passed (not while following the peer), or a probe passed. */
int rail_ib_home_ready(const struct rail_ib_comm *c);
#define RAIL_IB_VERIFIED_NS (10ull * 1000000000ull)	/* a probe that passed holds this long */
int rail_ib_home_verified(const struct rail_ib_comm *c);
/* Where member m goes in a move (the rules: ib_move_rules.c; why: the fallback's), NULL: none. */
struct rail_ib_dev *rail_ib_pick_target(const struct rail_ib_comm *c, int m, int avoid, char *why,
					size_t len);

/* ---- GPU memory ladder (ib_ladder.c) ----------------------------------- */
void rail_ib_ladder_decide(struct rail_ib_hca *hca, struct rail_ib_ladder *out);
int rail_ib_ladder_ptr_support(const struct rail_ib_ladder *l);

/* ---- async events (ib_async.c) ----------------------------------------- */
int rail_ib_async_start(struct rail_ib_hca *hca);
void rail_ib_async_stop(struct rail_ib_hca *hca);
/*
 * Called by the async threads after an event that may start or end a move
 * (PORT_ERR, PORT_ACTIVE, DEVICE_FATAL, QP_FATAL); set by the move thread
 * (ib_move_thread.c, above this layer), NULL to stop.
 */
void rail_ib_async_hook_set(void (*fn)(void));
/*
 * New connections on dev (listen, connect, accept): -ENETDOWN, logged with
 * the call, the port and what to try, while its last event was PORT_ERR.
 */
int rail_ib_dev_port_up(const struct rail_ib_dev *dev, const char *call, const char *peer);

/* ---- registration cache (ib_mr.c) -------------------------------------- */
#define RAIL_IB_MH_MAGIC 0x484d4952u /* "RIMH" */
#define RAIL_IB_MR_NEEDS_READ 0x100	/* with RAIL_PTR_*: a flush reads it back */
#define RAIL_IB_MR_NEEDS_ATOMIC 0x200	/* remote atomics target it (RMA signals) */
#define RAIL_IB_MR_STRICT 0x400		/* never PCIe relaxed ordering (RMA: FORCE_SO) */
#define RAIL_IB_MR_OWN 0x800		/* its own MR, shared with no other registration */
struct rail_ib_mh {
	uint32_t magic;
	struct rail_ib_mh *dead_next;	/* deregistered, on the comm's dead_mhs */
	int type;		/* RAIL_PTR_* as registered */
	int gpu;		/* NIC writes need a flush */
	int ndevs;
	struct rail_ib_hca *hca[RAIL_MAX_VDEV_DEVS];
	struct rail_ib_mr_ent *ent[RAIL_MAX_VDEV_DEVS];
	uint32_t lkey[RAIL_MAX_VDEV_DEVS];
	uint32_t rkey[RAIL_MAX_VDEV_DEVS];
	void *addr;		/* as registered, for a move (rail_ib_mh_rehome) */
	size_t len;
	int access;
	int dmabuf;		/* registered through DMA-BUF (regMrDmaBuf) */
	int fd;			/* a dup of the DMA-BUF fd with failover, else -1 */
	uint64_t offset;
	uint32_t gen;		/* its keys are of the comm's devices at res_gen (rail_ib_mh_keys) */
};
/*
 * A move: member m's registration on device d's HCA instead (a no-op when
 * it is there already), the old one released. 0 or -errno (logged).
 */
int rail_ib_mh_rehome(struct rail_ib_mh *mh, int m, struct rail_ib_dev *d, const char *peer);
/* Register [addr, addr+len) on every member HCA (fd < 0: not DMA-BUF). */
int rail_ib_mr_register(struct rail_ib_dev *const *devs, int n, void *addr, size_t len,
			int type, int fd, uint64_t offset, const char *peer,
			struct rail_ib_mh **out);
void rail_ib_mr_deregister(struct rail_ib_mh *mh);
/*
 * After a move: every member slot of mh on the device its member of c is on
 * now (rail_ib_mh_rehome per member; no-ops where the HCA did not change; a
 * member whose HCA is dead is left for after the move), then mh->gen is
 * c->res_gen. Through rail_ib_mh_keys, where keys are read.
 */
int rail_ib_comm_mh_rehome(const struct rail_ib_comm *c, struct rail_ib_mh *mh);
/* Drop every cached registration of an HCA (fini). */
void rail_ib_mr_cache_fini(struct rail_ib_hca *hca);

/* ---- comms (ib_conn.c, ib_qp.c, ib_engine.c, ib_send.c, ib_recv.c, ib_eager.c, ib_flush.c) */
#define RAIL_IB_SLOTS 64	/* CTS FIFO slots, a power of two */
#define RAIL_IB_EARLY_DEPTH 256	/* sender WRs of early-completed batches in flight per QP */
#define RAIL_IB_MAX_QPS 128
/* The eager geometry may be overridden at build time (OPT="-O2 -DRAIL_IB_EAGER_SLOTS=16"). */
/*
 * Eager ring slots per connection, a power of two. 16: twice the
 * NCCL_STEPS (8) messages NCCL's proxy keeps in flight on one connection,
 * and the ring and its staging (2 x 16 x 4672 bytes) keep a connection's
 * registrations under NCCL IB's (docs/PERFORMANCE.md, "Memory per
 * connection"). A receiver offers its ring in the handshake; a sender
 * takes one of at most this many slots.
 */
#ifndef RAIL_IB_EAGER_SLOTS
#define RAIL_IB_EAGER_SLOTS 16
#endif
#ifndef RAIL_IB_EAGER_MAX
#define RAIL_IB_EAGER_MAX 4096	/* largest eager payload */
#endif
/* payload + trailer, 64-aligned, then the LL region (ib_wire.h) */
#define RAIL_IB_EAGER_SLOT (RAIL_IB_EAGER_MAX + 64 + RAIL_IB_LL_BYTES)
#define RAIL_IB_LOOP_DEPTH (2 * RAIL_MAX_REQUESTS + RAIL_IB_EAGER_SLOTS + 8)
/*
 * Inline data a QP is made for (NCCL_IB_USE_INLINE, at most the HCA's):
 * mlx5 sizes every send WQE for it, so 92 bytes (one 64-byte CTS entry, the
 * LL image of a payload of up to 32 bytes) keeps a WQE at two 64-byte
 * blocks where the HCA's 256 would take five.
 */
#define RAIL_IB_INLINE_MAX 92
/* Order-safe ring: receive WRs on the eager QP beyond the slots, posted again in batches. */
#define RAIL_IB_RING_RECV_BATCH 16

/* Control regions: CTS FIFO + credit word (sender), records + want word + ring (receiver). */
#define RAIL_IB_FIFO_BYTES (RAIL_IB_SLOTS * RAIL_MAX_RECVS * RAIL_IB_CTS_SIZE)
#define RAIL_IB_SIZES_BYTES (RAIL_IB_SLOTS * RAIL_MAX_RECVS * 4)
#define RAIL_IB_CREDIT_OFF RAIL_IB_FIFO_BYTES
#define RAIL_IB_SEND_CTRL_BYTES (RAIL_IB_FIFO_BYTES + 64)
#define RAIL_IB_WANT_OFF RAIL_IB_SIZES_BYTES
#define RAIL_IB_RING_OFF (RAIL_IB_SIZES_BYTES + 64)
#define RAIL_IB_RECV_CTRL_BYTES (RAIL_IB_RING_OFF + RAIL_IB_EAGER_SLOTS * RAIL_IB_EAGER_SLOT)
/* Scratch (local only): sizes + want staging + eager staging (sender), CTS + credit staging. */
#define RAIL_IB_WANT_STAGE_OFF RAIL_IB_SIZES_BYTES
#define RAIL_IB_STAGE_OFF (RAIL_IB_SIZES_BYTES + 64)
#define RAIL_IB_SEND_SCRATCH_BYTES (RAIL_IB_STAGE_OFF + RAIL_IB_EAGER_SLOTS * RAIL_IB_EAGER_SLOT)
#define RAIL_IB_CREDIT_STAGE_OFF RAIL_IB_FIFO_BYTES
#define RAIL_IB_RECV_SCRATCH_BYTES (RAIL_IB_FIFO_BYTES + 64)

/* wr_id of our work requests: the low 3 bits say what it is. */
#define RAIL_IB_WR_REQ 0	/* a request pointer (send batch lead, flush) */
#define RAIL_IB_WR_RETIRE 1	/* retires send-queue slots: QP index, posted count */
#define RAIL_IB_WR_RECV 2	/* a receive WR (answers to a CTS): QP index */
#define RAIL_IB_WR_LOOP 3	/* a loopback copy of an eager message: ring slot */
#define RAIL_IB_WR_MARK 4	/* a move's drain mark: QP index, 0 send / 1 receive queue */
static inline uint64_t rail_ib_wrid(int kind, uint32_t a, uint32_t b)
{
	return (uint64_t)kind | ((uint64_t)a << 3) | ((uint64_t)b << 32);
}
#define RAIL_IB_WRID_KIND(w) ((int)((w) & 7))
#define RAIL_IB_WRID_A(w) ((uint32_t)(((w) >> 3) & 0x1fffffff))
#define RAIL_IB_WRID_B(w) ((uint32_t)((w) >> 32))

/* Serial-number order of 32-bit counters: a before b. */
static inline int rail_ib_before(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) < 0;
}

/* Per-tag ordinals (ib_eager.c): the i-th send with tag T fills the i-th buffer with tag T. */
struct rail_ib_tag {
	int32_t tag;
	uint32_t next;		/* ordinal of the next send (sender) or entry (receiver) */
	uint32_t want;		/* CTS asked (sender) / owed (receiver) up to this ordinal */
	int wanted;		/* want is set */
	int cts_big;		/* sender: its last CTS entry was larger than the ring takes */
	uint32_t blk_ord;	/* sender: the send of this tag refused since blk_ns (a want's delay) */
	uint64_t blk_ns;
};
struct rail_ib_tags {
	int n, cap;
	struct rail_ib_tag *v;
};
/* The entry of tag, created at ordinal 0 if new; NULL when out of memory. */
struct rail_ib_tag *rail_ib_tag_get(struct rail_ib_tags *t, int32_t tag);
void rail_ib_tags_free(struct rail_ib_tags *t);

struct rail_ib_comm;

struct rail_ib_qp {
	struct ibv_qp *qp;
	int member;		/* local member index: devres[member] */
	int remote_member;	/* the peer's member this QP talks to */
	uint32_t remote_qpn;
	uint32_t max_inline;
	/*
	 * Receiver: CTS and credit writes posted / known complete. Sender: WRs
	 * of early-completed (all-inline) batches, eager and want writes posted
	 * / known complete.
	 */
	uint32_t sq_posted;
	uint32_t sq_retired;
	uint32_t sq_signaled;	/* sq_posted at its last signaled WR (the stall watchdog) */
	uint64_t ans_next;	/* receiver: the CTS number of the next answer on this QP */
};

/*
 * Sender with failover (ib_move.c): what was posted to answer CTS num, so
 * that the pieces a failed path lost can be posted again. An early batch
 * (completed at post) keeps its payloads here. Another batch's requests
 * are referenced only while it is in flight: once its completions came
 * back, the remote HCA acknowledged its data (placed), NCCL gets the
 * requests and buffers back, and the record keeps no pointer to them
 * (acked: a replay writes the answer alone, never the buffer again).
 */
#define RAIL_IB_EARLY_COPY 128	/* with failover, an early batch's entries are this small */
struct rail_ib_sent {
	/* ~ the CTS number it answers (rail_ib_sent_num): zeroed memory reads as no record */
	uint64_t num_inv;
	int nreqs;
	int early;
	int acked;			/* its data placed: the answer alone goes again */
	struct rail_ib_req *lead;		/* NULL: early, acked, or every entry went eagerly */
	struct rail_ib_req *reqs[RAIL_MAX_RECVS];	/* NULL: went eagerly (or early, acked) */
	uint32_t sizes[RAIL_MAX_RECVS];
	uint8_t copy[RAIL_MAX_RECVS][RAIL_IB_EARLY_COPY];
};

/* The CTS number a failover record answers; UINT64_MAX: none yet. */
static inline uint64_t rail_ib_sent_num(const struct rail_ib_sent *rec)
{
	return ~rec->num_inv;
}

/* Move triggers, what the engine and the checks hand to c->on_move. */
enum {
	RAIL_IB_TRIG_NONE, RAIL_IB_TRIG_PORT, RAIL_IB_TRIG_WC, RAIL_IB_TRIG_OOB, RAIL_IB_TRIG_BACK,
	RAIL_IB_TRIG_FATAL,	/* DEVICE_FATAL on the comm's device */
	RAIL_IB_TRIG_QP,	/* QP_FATAL on one of its QPs (c->qp_event) */
	RAIL_IB_TRIG_STALL,	/* completions owed, none polled for NCCL_RAIL_IB_STALL_TIMEOUT */
};

struct rail_ib_move;
struct rail_ib_chan;	/* ib_chan.c */
struct rail_ib_probe;	/* ib_probe.c */

/*
 * Failover's move back after a move made with the port up (ib_probe.c): no
 * port event says when the way home works again, so a probe does. due: a
 * side of the comm left a device whose port stayed up (MOVE's AVOID flag)
 * and a side is still away; the sender probes, the receiver answers.
 */
struct rail_ib_back {
	int due;
	uint64_t verified_ns;	/* the last probe passed then: the sides away go home (10 s) */
	int off;		/* closing: no probe started or answered */
	int fails;		/* probes failed in a row (one INFO line per streak) */
	uint64_t next_ns, wait_ns;	/* sender: the next probe; the wait after a failure */
	uint64_t number;	/* sender: probes made (the messages carry the number) */
	uint64_t looked_ns;	/* the socket last read between moves (ib_move.c) */
	struct rail_ib_probe *p;	/* one under way, either side */
};

/* Per member device of a comm. */
struct rail_ib_devres {
	struct rail_ib_dev *dev;
	struct ibv_cq *cq;
	struct ibv_mr *ctrl_mr;		/* FIFO (sender) or records + ring (receiver) */
	struct ibv_mr *scratch_mr;	/* sender: sizes + staging; receiver: CTS staging */
	struct ibv_qp *flush_qp;	/* receiver: flushes and loopback copies */
	struct ibv_mr *flush_mr;
	uint64_t cqes;			/* completions polled on this device */
	struct rail_ib_gid_choice gid;	/* resolved when the comm was made */
	unsigned port_gen;		/* dev->port_downs then */
};

/* The send batch being matched to one CTS. */
struct rail_ib_batch {
	int nreqs;
	int matched;			/* entries with a send, or sent eagerly before */
	struct rail_ib_cts cts[RAIL_MAX_RECVS];
	struct rail_ib_req *reqs[RAIL_MAX_RECVS];	/* NULL: unmatched or eager */
	uint8_t eager;			/* bit i: entry i's message went through the ring */
};

/* Receiver: one CTS written and not yet answered (slot = CTS number % RAIL_IB_SLOTS). */
struct rail_ib_cts_state {
	struct rail_ib_req *r;		/* NULL once the receive completed through the ring */
	uint64_t num;			/* CTS number */
	int active;
	int n;
	int left;			/* answers (one per QP of the set) still expected */
	uint32_t imm;			/* the last answer's immediate */
};

/* Receiver: what it knows of an eager ring slot. */
enum { RAIL_IB_RING_FREE, RAIL_IB_RING_WAITING, RAIL_IB_RING_LOOP, RAIL_IB_RING_DONE };
struct rail_ib_ring_ent {
	uint8_t state;
	int8_t idx;			/* LOOP: the buffer of r being written */
	struct rail_ib_eager_hdr h;
	struct rail_ib_req *r;		/* LOOP: the receive */
};

struct rail_ib_comm {
	struct rail_comm base;		/* first */
	int vdev;
	int ndevs;
	struct rail_ib_devres res[RAIL_MAX_VDEV_DEVS];
	/* res[m].dev, for regMr: NCCL registers on other threads, while a move may rebuild */
	struct rail_ib_dev *_Atomic reg_dev[RAIL_MAX_VDEV_DEVS];
	int remote_ndevs;
	struct rail_ib_wire_dev remote[RAIL_MAX_VDEV_DEVS];
	/* ECE per member (vendor_id 0: none): offered, then (sender) settled; the peer's */
	struct rail_ib_ece ece[RAIL_MAX_VDEV_DEVS];
	struct rail_ib_ece remote_ece[RAIL_MAX_VDEV_DEVS];
	int nqps;
	struct rail_ib_qp qps[RAIL_IB_MAX_QPS];
	int split;			/* NCCL_IB_SPLIT_DATA_ON_QPS */
	int ar;				/* sender: every member has adaptive routing */
	uint64_t ar_threshold;		/* larger messages end with a 0-byte write with imm */
	int tc, sl;
	char peer[RAIL_ADDR_STRLEN];
	atomic_int fatal;		/* async event on one of our QPs/CQs */
	atomic_uint qp_event;		/* failover: QP_FATAL on QP number qp_event - 1 */
	/*
	 * Handles deregMr released (their MRs are gone) and the progress thread
	 * has not yet checked against its requests: a stack pushed by deregMr
	 * (NCCL's service thread), taken whole by rail_ib_comm_check.
	 */
	struct rail_ib_mh *_Atomic dead_mhs;
	int error;			/* a failed completion: -errno */
	/*
	 * Completions the engine (ib_engine.c) hands up, put here by the layer
	 * above when it makes the comm: an answer to a CTS (rail_ib_on_answer)
	 * and a loopback copy of an eager message (rail_ib_on_loop).
	 */
	int (*on_answer)(struct rail_ib_comm *c, int qpi, int m, const struct ibv_wc *wc);
	int (*on_loop)(struct rail_ib_comm *c, uint32_t slot);
	int oob_fd;			/* the handshake socket, kept to notice a dead peer */
	/*
	 * Failover (ib_move.c, docs/FAILOVER.md). failover: NCCL_RAIL_FAILOVER
	 * and a comm it covers. on_move (set by ib_conn.c): called by the checks
	 * below layer 5 with a trigger; 0 the comm may go on, -EAGAIN a move is
	 * under way (isend/irecv refuse, test waits), or an error. path_failed:
	 * a completion said the path failed (the engine, RAIL_IB_TRIG_WC), or the
 * stall watchdog did (RAIL_IB_TRIG_STALL).
	 * fencing: the old QPs drain; their flushed completions are expected.
	 */
	int failover;
	int (*on_move)(struct rail_ib_comm *c, int trigger, const char *call);
	/* per member: the device the comm was made on; a member that moved moves back there */
	struct rail_ib_dev *home[RAIL_MAX_VDEV_DEVS];
	_Atomic uint32_t res_gen;	/* member rebuilds so far: keys of an older one are stale */
	uint32_t back_tick;		/* away from home: calls between looks at it */
	int follows;			/* on the device it followed the peer to: no move back of its own */
	int one_net;			/* made within one network (ib_move.c, at its first move) */
	uint64_t move_ns[4];		/* when the last moves started (ring by epoch) */
	uint64_t path_fail_ns;		/* the last move for a failed path with every port up */
	/* the move thread's record of it (ib_move_thread.c), NULL when not registered */
	struct rail_ib_mt *mt;
	struct rail_ib_chan *chan;	/* the socket's messages after connect (failover) */
	struct rail_ib_back back;	/* the move back by probe */
	struct rail_ib_move *mv;
	uint32_t epoch;
	int path_failed;
	int fencing;
	int marks_left;			/* drain marks not yet polled */
	int rq_marks_left;		/* ... of them, on receive queues */
	struct rail_ib_sent *sent;	/* sender with failover: RAIL_IB_SLOTS records */
	uint64_t rp_next, rp_end;	/* sender: CTS numbers whose lost pieces go again */
	uint64_t rp_ans[RAIL_IB_MAX_QPS];	/* the receiver's answers per QP at the move */
	int batch_stale;		/* sender: the loaded CTS is re-written by the receiver */
	int nreflush;			/* receiver: flushes the drain cut short */
	struct rail_ib_req *reflush[RAIL_MAX_REQUESTS];
	uint32_t e_img[RAIL_IB_EAGER_SLOTS];	/* sender: image length per slot (bit 31: LL) */
	uint32_t idle;			/* calls that found nothing to do */
	uint64_t oob_checked_ns;
	uint64_t stall_cqes;		/* the stall watchdog (ib_engine.c): CQEs polled at ... */
	uint64_t stall_ns;		/* ... the last progress (or nothing owed), then */
	int stall_shift;		/* stalls fired: the timeout doubles with each (<= 16x) */
	uint64_t seq;			/* next receive (recv) or CTS to process (send) */
	struct rail_ib_tags tags;	/* per-tag ordinals */
	int eager_slots;		/* ring slots (0: no eager path) */
	uint32_t eager_slot_bytes;
	uint32_t eager_max;		/* largest eager payload */
	int eager_safe;			/* order-safe ring: writes with immediate, or LL images */
	int eager_ll;			/* ... small ones as LL images (0: a move turned it safe) */
	int eager_probed;		/* in-order because the NIC promised it (auto on both sides) */
	uint32_t eager_end;		/* where the images with a trailer end in a slot */
	/* sender */
	uint8_t *fifo;			/* CTS entries, then the credit word */
	uint8_t *sizes;			/* sizes records, want staging, eager staging */
	uint64_t remote_cmpl_addr;
	uint32_t remote_cmpl_rkey[RAIL_MAX_VDEV_DEVS];
	uint64_t remote_ring_addr;
	uint64_t remote_want_addr;
	struct rail_ib_batch batch;
	uint32_t e_sent;		/* eager messages written */
	uint32_t e_credit;		/* eager messages the receiver consumed (as last told) */
	uint16_t want_seq, want_ack;	/* wants sent / acknowledged */
	int ring_ready;			/* the receiver's QPs are ready (its first credit word) */
	/* receiver */
	uint8_t *cmpl;			/* records, want word, eager ring */
	uint8_t *cts_stage;		/* CTS entries, credit staging */
	uint64_t remote_fifo_addr;
	uint32_t remote_fifo_rkey[RAIL_MAX_VDEV_DEVS];
	uint64_t remote_credit_addr;
	struct rail_ib_req *recvs[RAIL_IB_SLOTS];	/* receives in flight, by number */
	uint64_t recv_lo;		/* no receive before this one is in flight */
	uint64_t cts_next;		/* number of the next CTS */
	uint64_t cts_k;			/* receives before this one have a CTS or need none */
	int cts_owed;			/* a want asked for CTSes not written yet */
	struct rail_ib_cts_state cts[RAIL_IB_SLOTS];
	struct rail_ib_ring_ent ring[RAIL_IB_EAGER_SLOTS];
	uint32_t e_head;		/* eager messages consumed (a prefix) */
	uint32_t e_seen;		/* eager messages seen arriving */
	uint32_t e_placed;		/* order-safe: eager messages whose immediate came */
	uint32_t ring_recvs_owed;	/* order-safe: receive WRs consumed, not posted again */
	uint32_t e_returned;		/* consumed count last written to the sender */
	uint32_t want_seen;		/* the sender's last want processed */
	uint32_t fast_polls;		/* test() calls that looked at the ring only */
	int credit_owed;		/* a credit write is due */
	int flush;			/* flush QPs exist */
	uint32_t flush_host;		/* flush host buffers too (testing) */
	uint8_t flush_buf[64];		/* RDMA read target of flushes */
	/* counters: base.st (src/stats.h); events: base.fl (src/flight.h) */
};

struct rail_ib_req {
	struct rail_req base;		/* first */
	int done;
	int error;			/* -errno once failed */
	uint8_t events[RAIL_MAX_VDEV_DEVS];	/* CQEs still expected per member */
	size_t sizes[RAIL_MAX_RECVS];	/* recv: posted sizes, then received sizes */
	uint64_t seq;
	/* send */
	struct rail_ib_req *lead;	/* the request whose CQEs complete the batch */
	int nmembers;
	struct rail_ib_req *members[RAIL_MAX_RECVS];
	void *data;
	struct rail_ib_mh *mh;		/* send; a receive's are in mhs */
	struct rail_ib_mh *mhs[RAIL_MAX_RECVS];
	int tag;
	/* receive */
	void *bufs[RAIL_MAX_RECVS];
	int32_t tags[RAIL_MAX_RECVS];
	uint32_t ords[RAIL_MAX_RECVS];
	uint8_t pending;		/* bit i: buffer i not filled yet */
	int loops;			/* loopback copies in flight */
	int64_t cts;			/* number of its unanswered CTS, or -1 */
	int had_cts;
	int flushed;			/* a completion of it was flushed by a move's drain */
};

/* Failover: a member of the comm is on another device than the one it was made on. */
static inline int rail_ib_away(const struct rail_ib_comm *c)
{
	for (int m = 0; m < c->ndevs; m++)
		if (c->res[m].dev != c->home[m])
			return 1;
	return 0;
}

/*
 * Where a registration's keys are read (a data write's lkey, a CTS's or a
 * loopback copy's rkeys, a flush's): 0 once mh's keys are those of the
 * devices c's members are on now, registering it there first after a move;
 * else -errno (logged). One load and compare when nothing moved.
 */
static inline int rail_ib_mh_keys(const struct rail_ib_comm *c, struct rail_ib_mh *mh)
{
	return rail_likely(!mh || mh->gen == atomic_load_explicit(&c->res_gen, memory_order_relaxed))
		       ? 0 : rail_ib_comm_mh_rehome(c, mh);
}

/*
 * Sender: the batch lead answers completed (every completion back: the data
 * placed): its sends are done and NCCL gets them back, so the batch's
 * record forgets them (a replay writes the answer alone).
 */
static inline void rail_ib_send_complete(struct rail_ib_comm *c, struct rail_ib_req *lead)
{
	for (int i = 0; i < lead->nmembers; i++)
		lead->members[i]->done = 1;
	if (c->sent) {
		struct rail_ib_sent *rec = &c->sent[lead->seq & (RAIL_IB_SLOTS - 1)];

		if (rail_ib_sent_num(rec) == lead->seq && rec->lead == lead) {
			rec->lead = NULL;
			memset(rec->reqs, 0, sizeof(rec->reqs));
			rec->acked = 1;
		}
	}
}

/* Receiver: receive k if it is in flight, else NULL. */
static inline struct rail_ib_req *rail_ib_recv_at(struct rail_ib_comm *c, uint64_t k)
{
	struct rail_ib_req *r = c->recvs[k & (RAIL_IB_SLOTS - 1)];

	return r && r->seq == k ? r : NULL;
}

/*
 * QPs that carry one message, as NCCL (common.h): every QP with
 * NCCL_IB_SPLIT_DATA_ON_QPS=1, else one per device of the larger side, so
 * that a fused NIC stripes every message over all its members. nqps is a
 * multiple of it, and QP i is on member i % ndevs: the QPs of a set (a
 * block of consecutive ones) cover every member of both sides.
 */
static inline int rail_ib_qps_per_msg(const struct rail_ib_comm *c)
{
	return c->split ? c->nqps : c->ndevs > c->remote_ndevs ? c->ndevs : c->remote_ndevs;
}

/* Piece j of count of a message split over a QP set: [*off, *off + *len) (128-byte pieces, as NCCL). */
static inline void rail_ib_split_piece(size_t size, int j, int count, size_t *off, size_t *len)
{
	size_t chunk = RAIL_ALIGN_UP(RAIL_DIV_UP(size, (size_t)count), (size_t)128);

	*off = RAIL_MIN((size_t)j * chunk, size);
	*len = RAIL_MIN(chunk, size - *off);
}

/* ib_mqp.c: ibv_modify_qp retried as NCCL does (NCCL_IB_MQP_RETRY_*), on the handshake's thread only */
struct rail_ib_mqp_retry {
	uint64_t deadline_ns;		/* no try after it (0: none): NCCL_RAIL_CONNECT_TIMEOUT */
	const atomic_int *cancel;	/* set: the handshake was abandoned, stop at once */
};
/* The calling thread's policy (NULL: one attempt, the default of every thread). */
void rail_ib_mqp_retry_set(const struct rail_ib_mqp_retry *r);
/* One ibv_modify_qp to state, named in the INFO line of each retry. */
struct rail_ib_mqp_call {
	const struct rail_ib_dev *dev;
	const char *state;	/* "INIT", "RTR", "RTS" */
	const char *peer;
	int quiet;		/* a probe's: never retried */
	int attempts;		/* out: the calls made */
	char note[192];		/* out: "" or " after N attempts in T s (why no more)", for the WARN */
};
/*
 * 0, or the positive errno of the last attempt (not logged: the caller's
 * WARN adds x->note). Retries only where the thread has a policy.
 */
int rail_ib_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask,
		      struct rail_ib_mqp_call *x);

/* ib_qp.c */
/*
 * Move a new RC QP on d to INIT with these remote access flags and
 * NCCL_IB_PKEY; 0 or a negative errno, WARNed as "<who>ibv_modify_qp(INIT) on
 * dev:port qp 0x.. to peer <peer> failed...". who: "" or a prefix that ends
 * in ": " (the RMA backend's "RMA createContext (rank R): ").
 */
int rail_ib_qp_to_init(struct ibv_qp *qp, const struct rail_ib_dev *d, int access,
		       const char *who, const char *peer);
int rail_ib_comm_res_init(struct rail_ib_comm *c, int vdev, int is_send);
void rail_ib_comm_res_fini(struct rail_ib_comm *c);
int rail_ib_comm_qps_create(struct rail_ib_comm *c, int nqps, int is_send);
/* The inline size QPs on d are made for: NCCL_IB_USE_INLINE, at most RAIL_IB_INLINE_MAX. */
uint32_t rail_ib_qp_inline(const struct rail_ib_dev *d);
/* An RC QP on member m, in INIT; NULL with *err (logged). */
struct ibv_qp *rail_ib_qp_new(struct rail_ib_comm *c, int m, int send_wr, int recv_wr,
			      int access, int *err);
/*
 * The peer's ECE (remote_ece) on QP i, where both sides have one; only a
 * real failure fails (logged).
 */
int rail_ib_qp_ece_set(struct rail_ib_comm *c, int i);
/* The same on any device d with completions to cq (a probe's QP). */
struct ibv_qp *rail_ib_qp_make(struct rail_ib_comm *c, struct rail_ib_dev *d, struct ibv_cq *cq,
			       int send_wr, int recv_wr, int access, int *err);
/* How a QP reaches the peer: device, GID, traffic class, timer; quiet: the caller logs failures. */
struct rail_ib_qp_path {
	struct rail_ib_dev *dev;
	const struct rail_ib_gid_choice *gid;
	int tc, timeout, retry_cnt, quiet;
};
/*
 * RTR + RTS of qp to the peer's remote_qpn on remote: 0 or -errno (logged
 * unless quiet). No flight-record note: the move thread calls it too.
 */
int rail_ib_qp_connect(struct rail_ib_comm *c, struct ibv_qp *qp, const struct rail_ib_qp_path *p,
		       const struct rail_ib_wire_dev *remote, uint32_t remote_qpn);
/* The same on the path of a comm's member device d (flush: the flush QP's traffic class). */
int rail_ib_qp_connect_to(struct rail_ib_comm *c, struct ibv_qp *qp, struct rail_ib_dev *d,
			  const struct rail_ib_wire_dev *remote, uint32_t remote_qpn, int flush);
/* RTR + RTS of every QP, each after ibv_set_ece(the peer's ECE) where both sides have one. */
int rail_ib_comm_qps_connect(struct rail_ib_comm *c, const uint32_t *remote_qpns);
/*
 * ECE of each member's QPs (ibv_query_ece on its first QP) into c->ece and
 * out: the number of entries (ndevs), 0 when no member has ECE.
 */
int rail_ib_comm_ece_query(struct rail_ib_comm *c, struct rail_ib_ece *out);
void rail_ib_local_wire_dev(const struct rail_ib_devres *r, uint32_t rkey,
			    struct rail_ib_wire_dev *out);
/*
 * NCCL_IB_WARN_RAIL_LOCAL=1: one INFO line when the peer's devices (m, its
 * handshake message) are not the comm's own, by device number: the
 * connection leaves its rail (NCCL: connect.cc ncclIbCheckVProps).
 */
void rail_ib_rail_local_note(const struct rail_ib_comm *c, const struct rail_ib_msg *m);
/*
 * rail_ib_qp_connect_to and a flight-record note. The move thread, which
 * connects a moving comm's QPs while NCCL's calls (the record's writer) go
 * on, calls rail_ib_qp_connect_to.
 */
int rail_ib_qp_rtr_rts(struct rail_ib_comm *c, struct ibv_qp *qp, struct rail_ib_dev *d,
		       const struct rail_ib_wire_dev *remote, uint32_t remote_qpn,
		       int flush);
int rail_ib_comm_check(struct rail_ib_comm *c, const char *call);
/*
 * Progress thread (rail_ib_comm_check): the registrations deregMr gave back
 * since the last call; with a request of the comm still using one, the comm
 * is stopped (rail_ib_comm_quiesce) and -ECANCELED returned.
 */
int rail_ib_mr_reap(struct rail_ib_comm *c, const char *call);
/* Close: forget the deregistered handles still owed a look. */
void rail_ib_mr_dead_free(struct rail_ib_comm *c);
/*
 * A move (ib_move.c). Fence: every QP and flush QP to the error state and a
 * drain mark on each queue (c->fencing, c->marks_left: the engine counts the
 * marks down); returns how many marks the provider refused (then drain by
 * time). Rebuild: member m on device d (its own or another): port and GID
 * checked, control regions registered again, a new CQ and new QPs in INIT
 * (QP indices keep their meaning); the old resources go to old, freed once
 * drained by rail_ib_old_free.
 */
struct rail_ib_old {
	int nres, nqps;
	struct rail_ib_devres res[RAIL_MAX_VDEV_DEVS];
	struct ibv_qp *qps[RAIL_IB_MAX_QPS];
};
int rail_ib_comm_fence(struct rail_ib_comm *c);
/*
 * Fence when the HCA of a member in dead (bit m: member m) reported
 * DEVICE_FATAL: a dead HCA completes nothing, so nothing is drained. The
 * live members' QPs go to the error state (the dead ones' are not touched),
 * no marks are posted, and every completion still expected of any member
 * is counted as flushed (send batches and flushes of the requests in
 * flight), as a drain would have, so the old CQs are not read again.
 * Returns how many completions were written off.
 */
int rail_ib_comm_write_off(struct rail_ib_comm *c, unsigned dead);
/* QP_FATAL seen (c->qp_event) on a current QP of c; one on a replaced QP is dropped. */
int rail_ib_qp_event_current(struct rail_ib_comm *c);
int rail_ib_member_rebuild(struct rail_ib_comm *c, int m, struct rail_ib_dev *d, int is_send,
			   struct rail_ib_old *old);
void rail_ib_old_free(struct rail_ib_old *old);
/* Move every QP to the error state (the NIC stops using our memory); the comm fails. */
void rail_ib_comm_quiesce(struct rail_ib_comm *c, const char *why);
const char *rail_ib_qp_where(struct rail_ib_comm *c, int qpi, char *buf, size_t len);

/* ib_engine.c: the progress engine, shared by the send and receive sides */
void rail_ib_qp_set(const struct rail_ib_comm *c, uint64_t num, int *first, int *count);
int rail_ib_post_send(struct rail_ib_comm *c, int qpi, struct ibv_send_wr *wr, const char *what);
/* Room for nwr more retire-tracked WRs on QP qpi (below limit); polls once if short. */
int rail_ib_sq_room(struct rail_ib_comm *c, int qpi, int nwr, uint32_t limit);
int rail_ib_protocol_error(struct rail_ib_comm *c, int m, const char *what);
/*
 * A small RDMA WRITE from scratch memory (CTS, credits, want, eager),
 * signaled every 16th (its completion retires the SQ slots before it).
 */
int rail_ib_ctl_write(struct rail_ib_comm *c, int qpi, const void *src, uint32_t len,
		      uint64_t raddr, uint32_t rkey, const char *what);
/* One signaled zero-byte RDMA write on QP qpi: its completion retires every WR before it. */
int rail_ib_sq_mark(struct rail_ib_comm *c, int qpi);
/*
 * Poll every member's CQ; completions of receive WRs and loopback copies go
 * to c->on_answer and c->on_loop.
 */
int rail_ib_poll(struct rail_ib_comm *c);
/*
 * The stall watchdog's look for the move thread at a comm NCCL has stopped
 * calling (its last sends completed at post, their writes owed), last: the
 * thread's previous look at it (NCCL's calls make theirs in
 * rail_ib_peer_check). It polls first. Sets path_failed when it fires;
 * returns 1 when it posted a probe behind a tail of unsignaled writes
 * (polled again later, the comm may then be quiet), else 0. watched: the
 * caller's epoll set would have told of the peer closing its socket (no
 * peek before a probe).
 */
int rail_ib_stall_look(struct rail_ib_comm *c, uint64_t last, int watched);
/*
 * Nothing for the stall watchdog to watch until NCCL calls c again: no
 * request in flight and every write posted has retired (the stall probe
 * made a tail of unsignaled ones owe a completion, and it was polled).
 */
int rail_ib_stall_quiet(const struct rail_ib_comm *c);
/* Every ~100 ms of waiting: -ECONNRESET (logged) once the peer closed its socket. */
int rail_ib_peer_check(struct rail_ib_comm *c, const char *call);
/*
 * The handshake socket, peeked without blocking: 0 while the peer may be
 * there (bytes, or nothing yet), -RAIL_ECLOSED once it closed its end,
 * else -errno (ETIMEDOUT: keepalive found its host silent). Logs nothing.
 */
int rail_ib_oob_peek(const struct rail_ib_comm *c);
/*
 * The describe_comm of the ops table: peer, member devices, and with
 * detail every QP's number, the peer's QP and the state (ibv_query_qp).
 */
void rail_ib_describe_comm(struct rail_comm *base, int detail, char *buf, size_t len);
/* r's buffers are all filled: complete it (and forget it). */
void rail_ib_recv_check_done(struct rail_ib_comm *c, struct rail_ib_req *r);

/* ib_send.c */
int rail_ib_isend(struct rail_comm *comm, struct rail_req *req, void *data, size_t size, int tag,
		  void *mhandle);
/* Sender progress besides the CQ: a refusal from the receiver, the CTSes that came. */
int rail_ib_send_progress(struct rail_ib_comm *c);

/* ib_recv.c */
int rail_ib_irecv(struct rail_comm *comm, struct rail_req *req, int n, void **data,
		  const size_t *sizes, const int *tags, void **mhandles);
/* A receive WR completed on QP qpi: an answer to a CTS. */
int rail_ib_on_answer(struct rail_ib_comm *c, int qpi, int m, const struct ibv_wc *wc);
/* CTSes for every receive in flight that lacks one (a want, or ordering). */
int rail_ib_cts_upto(struct rail_ib_comm *c, uint64_t k);
/*
 * After a move (ib_move.c), the receiver. Prepare (before telling the peer
 * its QPs are ready): the buffers of unanswered CTSes registered on the new
 * device, a receive WR per answer still owed on each QP, the ring's.
 * Write (once the peer's QPs are ready): every unanswered CTS again, in
 * order, with the new rkeys; the credit word. Returns the CTSes written.
 */
int rail_ib_recv_replay_prepare(struct rail_ib_comm *c);
int rail_ib_recv_replay_write(struct rail_ib_comm *c);
/* Receiver progress besides the CQ: the ring, the want word, owed writes. */
int rail_ib_recv_progress(struct rail_ib_comm *c);
/*
 * test() of a receive that only the ring can complete: 1 when handled by
 * looking at the ring alone, 0 when the full progress is due, or an error.
 */
int rail_ib_recv_fast(struct rail_ib_comm *c, struct rail_ib_req *r);

/* ib_eager.c */
/* Sender: 0 sent (the request is complete), -EAGAIN (*no_credit), or an error. */
int rail_ib_eager_send(struct rail_ib_comm *c, struct rail_ib_req *r, void *data, size_t size,
		       int tag, uint32_t ord, int *no_credit);
int rail_ib_eager_fits(const struct rail_ib_comm *c, size_t size, const struct rail_ib_mh *mh);
/* Sender: a send (tag, ord) is refused for now; ask the receiver for credits or a CTS. */
int rail_ib_want_maybe(struct rail_ib_comm *c, struct rail_ib_tag *t, size_t size, int no_credit);
void rail_ib_credit_refresh(struct rail_ib_comm *c, uint32_t cts_credits);
/* -EMSGSIZE (WARN, comm failed) once the receiver refused an eager message of ours. */
int rail_ib_eager_refused(struct rail_ib_comm *c, const char *call);
/* Receiver: new arrivals in the ring, matched to receives in flight. */
int rail_ib_ring_poll(struct rail_ib_comm *c);
/* Receiver: whether the next ring slot holds a new message (one load). */
int rail_ib_ring_peek(struct rail_ib_comm *c);
/* Order-safe receiver: whether the next message's completion may be in the CQ (one load). */
int rail_ib_ring_due(struct rail_ib_comm *c);
/* Receiver: messages already in the ring for a receive just posted. */
int rail_ib_ring_match_recv(struct rail_ib_comm *c, struct rail_ib_req *r);
/*
 * Order-safe ring: the next message, a small one for r, straight to r's
 * buffer (1); 0: nothing in the next slot's LL words; 2: the general path.
 */
int rail_ib_ring_direct(struct rail_ib_comm *c, struct rail_ib_req *r);
int rail_ib_on_loop(struct rail_ib_comm *c, uint32_t slot);
/*
 * Receiver, once its QPs are ready: choose the ring's protocol (in-order
 * single write, or write with immediate) from NCCL_RAIL_IB_EAGER_ORDER on
 * both sides (peer_order: the sender's, RAIL_IB_ORDER_*) and what
 * ibv_query_qp_data_in_order says of the eager QP; log it; post the
 * receive WRs the order-safe protocol needs.
 */
int rail_ib_eager_order_setup(struct rail_ib_comm *c, int peer_order);
/*
 * After a move to a NIC that does not promise in-order placement, an
 * in-order ring (chosen because the old one did) turns order-safe at the
 * move's boundary, keeping its slot layout: every message then goes with
 * an immediate, none as an LL image. Receiver (once the new QPs are ready,
 * before it writes anything again): 1 if it turned (MOVE_READY says so).
 * Sender: told by MOVE_READY, before it writes anything again.
 */
int rail_ib_ring_recheck(struct rail_ib_comm *c);
void rail_ib_ring_turn_safe(struct rail_ib_comm *c);
/* Receiver: an eager message written with immediate (low bits of its seq) completed. */
int rail_ib_ring_on_imm(struct rail_ib_comm *c, int qpi, int m, uint32_t seq_bits);
/*
 * After a move (ib_move.c). Sender: write eager messages [from, e_sent)
 * again from their staging slots, and an unanswered want; the number of
 * messages or an error. Receiver: the order-safe ring's receive WRs on the
 * new eager QP, and the loopback copies the drain flushed, posted again.
 */
#define RAIL_IB_IMG_LL 0x80000000u	/* e_img: the slot holds an LL image */
int rail_ib_eager_replay(struct rail_ib_comm *c, uint32_t from);
int rail_ib_ring_replay(struct rail_ib_comm *c);
/* Receiver: return credits when due (FORCE: answer a want, or say "ready"). */
enum { RAIL_IB_CREDIT_BUSY, RAIL_IB_CREDIT_IDLE, RAIL_IB_CREDIT_FORCE };
int rail_ib_credit_return(struct rail_ib_comm *c, int mode);
int rail_ib_want_poll(struct rail_ib_comm *c);

/* ib_flush.c */
int rail_ib_flush_init(struct rail_ib_comm *c);
void rail_ib_flush_fini(struct rail_ib_comm *c);
int rail_ib_eager_possible(struct rail_ib_comm *c);
/*
 * A move: member m's self-connected QP on its new device (when the comm
 * flushes); the flushes the drain cut short (c->reflush), posted again.
 */
int rail_ib_flush_member(struct rail_ib_comm *c, int m);
int rail_ib_flush_replay(struct rail_ib_comm *c);
/* Post wr on member m's self-connected QP; a failure is logged (what), set on c and returned. */
int rail_ib_loop_post(struct rail_ib_comm *c, int m, struct ibv_send_wr *wr, const char *what);
int rail_ib_iflush(struct rail_comm *comm, struct rail_req *req, int n, void **data,
		   const int *sizes, void **mhandles);

/*
 * ib_chan.c: framed messages on the handshake socket after connect. Put
 * queues one (-EINVAL, logged); flush: 0 all sent, -EAGAIN or the socket's
 * error; recv: 0 with *m, -EAGAIN (partial: part of one read), -EPROTO
 * (logged) or the socket's error (then sock_err).
 */
int rail_ib_chan_open(struct rail_ib_comm *c);
void rail_ib_chan_close(struct rail_ib_comm *c);
int rail_ib_chan_put(struct rail_ib_comm *c, const struct rail_ib_msg *m);
int rail_ib_chan_flush(struct rail_ib_comm *c);
int rail_ib_chan_recv(struct rail_ib_comm *c, struct rail_ib_msg *m);
int rail_ib_chan_partial(const struct rail_ib_comm *c);
int rail_ib_chan_sock_err(const struct rail_ib_comm *c);

/*
 * ib_probe.c, driven by ib_move.c between moves. After a move: did a side
 * leave a device whose port is up, is a side away (this side's or the
 * MOVE's flags); schedules c->back (first probe a hold-down later). Msg: a
 * probe's message read. Step: the sender starts a due probe, polls its
 * READ, times it out; the receiver times out an answer. 0 or the socket's
 * error (a failed probe is no error). Stop: tear down, no message (a move,
 * close). Next: when a probe next needs a look (READ in flight: 10 ms; a
 * deadline; the next probe), 0 none; wanted: that time has come.
 */
void rail_ib_back_after_move(struct rail_ib_comm *c, int avoided, int away);
int rail_ib_probe_msg(struct rail_ib_comm *c, const struct rail_ib_msg *m);
int rail_ib_probe_step(struct rail_ib_comm *c);
void rail_ib_probe_stop(struct rail_ib_comm *c);
uint64_t rail_ib_probe_next_ns(const struct rail_ib_comm *c);
int rail_ib_probe_wanted(const struct rail_ib_comm *c);

/*
 * ib_move.c. Arm: set c->on_move, and with NCCL_RAIL_FAILOVER=1 on both
 * sides (peer_failover: the peer's handshake said so) turn failover on, for
 * comms of one device and of fused devices alike: the sender keeps its
 * records. Free: at close, a move in progress and the records.
 */
void rail_ib_move_arm(struct rail_ib_comm *c, int peer_failover);
/*
 * 1 when the move thread is connecting c's new QPs right now: it calls
 * later(c) when done, and c must not be freed before (close returns at
 * once); else 0, the move's state freed.
 */
int rail_ib_move_free(struct rail_ib_comm *c, void (*later)(struct rail_ib_comm *c));
/*
 * Close (call: "closeSend", "closeRecv"): a move under way or due (not a
 * move back) and the sender's lost pieces are driven to their end, since
 * NCCL was told eager and early sends were done that may sit in the failed
 * path. One step: 1 once nothing is left (or the peer closed its socket,
 * or the comm failed), else 0. On the move thread when there is one (a
 * closed comm handed to it: rail_ib_move_close), else here: settle loops,
 * bounded by RAIL_IB_SETTLE_NS (settle_late: the WARN), 0 or the comm's
 * error.
 */
#define RAIL_IB_SETTLE_NS (10ull * 1000000000ull)
/* Whether a close has a move to finish (under way or due, lost pieces left); no action. */
int rail_ib_move_close_due(struct rail_ib_comm *c);
/* The WARN when settling ran out of time (what was lost). */
void rail_ib_move_settle_late(struct rail_ib_comm *c, const char *call);
/* A move under way, or one a failure calls for (its port, its peer, a QP, a completion). */
int rail_ib_move_due(struct rail_ib_comm *c);
/* The trigger of the move a failure calls for, or the peer's (never a move back). */
int rail_ib_move_failure_trigger(struct rail_ib_comm *c);
/*
 * For the move thread: whether c has a move to start or drive (its port,
 * its device, a QP, the peer's MOVE waiting, home back, one under way), and
 * the trigger to hand to c->on_move; when home's hold-down ends for a comm
 * away from it (rail_now_ns; 0: not by the clock alone).
 */
int rail_ib_move_wanted(struct rail_ib_comm *c);
int rail_ib_move_trigger(struct rail_ib_comm *c);
/*
 * For an event-driven move thread: when c next needs a look for a reason
 * of time alone (rail_now_ns), 0 for none: the end of the hold-down of a
 * home up again (its PORT_ACTIVE stamp), the next probe of the way home, a
 * probe's deadline; every 10 ms while a probe's READ is in flight, a move
 * drains its old QPs or a sender writes lost pieces again (completions and
 * clear-to-sends raise no event). Everything else raises an event: the
 * handshake socket readable (a MOVE, a probe's message), the async
 * thread's port or device event, NCCL's calls. May be past (look now);
 * ask again after each look. Read with c taken, as rail_ib_move_wanted.
 */
uint64_t rail_ib_move_next_ns(struct rail_ib_comm *c);

/*
 * ib_move_thread.c: one thread per process drives the moves of comms with
 * failover that NCCL does not call, woken by events only (an idle comm
 * costs no wake-up). Register at arm (starts the thread), unregister at
 * close: 1 when the thread runs c's work now and calls later(c) when done
 * (else it no longer looks at c once this returns); fini (ib_ops' fini)
 * stops the thread. Under c's guard: watch (a move NCCL's call started:
 * the thread looks at it every tick until done) and work (fn(c) on the
 * thread, without the guard: a move's slow verbs calls; 0 when there is
 * no thread, then the caller runs it). Loops: the thread's wake-ups so far
 * (tests).
 */
struct rail_ib_mt;
void rail_ib_move_register(struct rail_ib_comm *c);
int rail_ib_move_unregister(struct rail_ib_comm *c, void (*later)(struct rail_ib_comm *c));
void rail_ib_move_fini(void);
void rail_ib_move_watch(struct rail_ib_comm *c);
int rail_ib_move_work(struct rail_ib_comm *c, void (*fn)(struct rail_ib_comm *c));
/*
 * Close with a move to finish (rail_ib_move_settle_step): 1 when the thread
 * takes c, drives it to the end (bounded by RAIL_IB_SETTLE_NS) and then
 * calls finish(c), which frees it (the thread's fini finishes the ones
 * left); 0 without a thread (the caller settles it itself).
 */
int rail_ib_move_close(struct rail_ib_comm *c, void (*finish)(struct rail_ib_comm *c));
/* The steps of a close's move (ib_move.c's comment on RAIL_IB_SETTLE_NS). */
int rail_ib_move_settle_step(struct rail_ib_comm *c, const char *call);
int rail_ib_move_settle(struct rail_ib_comm *c, const char *call);
uint64_t rail_ib_move_thread_loops(void);

/* ib_conn.c */
/* The ops table new comms carry (ib_ops.c, at init: the table is above this layer). */
void rail_ib_conn_ops_set(const struct rail_transport_ops *ops);
int rail_ib_listen(int dev, void *handle, struct rail_comm **listen_comm);
int rail_ib_connect(int dev, const struct rail_conn_opts *opts, void *handle,
		    struct rail_comm **send_comm);
int rail_ib_accept(struct rail_comm *listen_comm, struct rail_comm **recv_comm);
int rail_ib_close_listen(struct rail_comm *comm);
void rail_ib_comm_free(struct rail_ib_comm *c);

/* ib_close.c */
int rail_ib_close_send(struct rail_comm *comm);
int rail_ib_close_recv(struct rail_comm *comm);

/* ib_ops.c: test, the op both sides share */
int rail_ib_test(struct rail_req *req, int *done, size_t *sizes);

/* ib_mr.c, the ops */
int rail_ib_reg_mr(struct rail_comm *comm, void *data, size_t size, int type, void **mhandle);
int rail_ib_reg_mr_dmabuf(struct rail_comm *comm, void *data, size_t size, int type,
			  uint64_t offset, int fd, void **mhandle);
int rail_ib_dereg_mr(struct rail_comm *comm, void *mhandle);

#endif
