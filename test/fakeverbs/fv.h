/*
 * fakeverbs: a libibverbs stand-in for tests (README.md in this folder).
 *
 * The library exports the ibv_* calls nccl-net-rail binds with dlvsym, at
 * the symbol versions rdma-core gives them (fakeverbs.map). Its devices come
 * from a description file (RAIL_FAKEVERBS_CONF); every call, work request
 * and attribute it is given goes to a log (RAIL_FAKEVERBS_LOG) that tests
 * read back. Work requests between QPs of one process are carried out with
 * memcpy, so a whole connection runs in one test process.
 *
 * One lock (fv_lock) guards all state: the fake is about behaviour, not
 * speed.
 */
#ifndef FAKEVERBS_FV_H
#define FAKEVERBS_FV_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>

/* verbs.h wraps some exported names in macros; the fake defines the real ones. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define FV_MAX_DEVS 16
#define FV_MAX_PORTS 4
#define FV_MAX_GIDS 16
#define FV_NAME 64
#define FV_PSN_MASK 0xffffffu	/* PSNs are 24 bits */

/* rdma-core 48+ appends u32 active_speed_ex after port_cap_flags2. */
#define FV_SPEED_EX_OFF ((offsetof(struct ibv_port_attr, port_cap_flags2) + 2 + 3) & ~(size_t)3)

struct fv_gid {
	int valid;
	union ibv_gid gid;
	int type;		/* 0 IB, 1 RoCE v1, 2 RoCE v2 */
};

struct fv_port {
	int state;		/* enum ibv_port_state */
	int link_layer;
	uint32_t speed;		/* active_speed code, may exceed 8 bits (XDR 0x100) */
	int width;		/* active_width code */
	int mtu;		/* enum ibv_mtu */
	uint16_t lid, sm_lid;
	uint8_t flags;		/* ibv_port_attr.flags (IBV_QPF_GRH_REQUIRED) */
	long port_speed;	/* ibv_query_port_speed, 100 Mb/s units; -1: computed, -2: fails */
	int gid_tbl_len;
	struct fv_gid gids[FV_MAX_GIDS];
};

struct fv_dev {
	struct ibv_device ibdev;	/* first: the pointer handed out */
	char pci[256];		/* PCI path below the host bridge, the function last */
	uint64_t sys_image_guid, node_guid;
	uint32_t vendor_part_id;
	int max_qp, max_cqe, max_qp_wr, max_inline;
	int dmabuf;		/* 1: ibv_reg_dmabuf_mr works (fd -1 gives EBADF) */
	int data_in_order;	/* ibv_query_qp_data_in_order's answer */
	int reorder;		/* RDMA writes into this device's QPs land out of order */
	int reorder_tail;	/* bytes of such a write placed first (0: FV_REORDER_TAIL) */
	int reorder_head;	/* N: its first N bytes are placed first instead (0: the tail) */
	int reorder_delay;	/* entries into the provider before the rest lands (0: 1) */
	int ece;		/* 0: EOPNOTSUPP, else the vendor_id/options answered */
	int atomic;		/* 0: atomic_cap NONE, every atomic WR fails (REM_ACCESS_ERR) */
	int retrying;		/* a WR to a QP that is gone never completes (still retrying) */
	int retry_ms;		/* a held send WR fails after this long; -1: not given (200) */
	int rtr_ms;		/* ibv_modify_qp to RTR toward another QP takes this long */
	int hold;		/* fv_test_hold: every send WR of this device's QPs is held */
	int dead;		/* DEVICE_FATAL injected: completes nothing, places nothing */
	/* fv_test_modify_fail: the next fail_left ibv_modify_qp to fail_state return fail_err */
	int fail_state, fail_err, fail_left;
	/* mlx5 Data Direct function, relative to /sys, as libmlx5 names it; "": none */
	char data_direct[128];
	int nports;
	struct fv_port ports[FV_MAX_PORTS];
};

#define FV_MAX_GPUS 8

struct fv_conf {
	int ndevs;
	struct fv_dev devs[FV_MAX_DEVS];
	int ngpus;
	char gpus[FV_MAX_GPUS][256];	/* GPUs' PCI paths, as a device's pci= */
	int speed_ex;		/* query_port fills active_speed_ex (rdma-core 48+) */
	int port_speed;		/* ibv_query_port_speed answers (IBVERBS_1.16) */
};

extern struct fv_conf fv_conf;
extern pthread_mutex_t fv_lock;

/* fv_conf.c: (re)load RAIL_FAKEVERBS_CONF; 0 or an errno (logged to stderr). */
int fv_conf_load(void);
/* Write the sysfs files the plugin reads under RAIL_FAKEVERBS_SYSFS, if set. */
void fv_sysfs_write(void);
/* The port's state and rate files again (fv_test_port_state, fv_test_port_speed). */
void fv_sysfs_port(const struct fv_dev *dev, int port);
const char *fv_gid_str(const union ibv_gid *g, char *buf, size_t len);

/* fv_log.c: one line per event, "call key=value ...". */
void fv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fv_log_reopen(void);

/* fv_verbs.c / fv_data.c */
#define FV_EVQ 64	/* async events queued per context */
struct fv_ctx {
	struct verbs_context vctx;	/* ibv_context is its last member */
	struct fv_dev *dev;
	int async_pipe[2];	/* one byte per queued event: the async fd polls the read end */
	struct ibv_async_event evq[FV_EVQ];	/* under fv_lock */
	int evq_head, evq_n;
	struct fv_ctx *next;	/* the open contexts (fv_ctxs) */
};

/* Under fv_lock: every open context, for the events a test injects (fv_ctl.c). */
extern struct fv_ctx *fv_ctxs;

struct fv_mr {
	struct ibv_mr mr;
	int access;
	uint64_t iova;
	int dmabuf;		/* no host mapping: data is not copied */
	char *host;		/* where the data is: the address, or a mapping (fv_mr_host) */
	void *map;		/* a DMA-BUF of the fake CUDA driver, mapped here */
	size_t map_len;
	struct fv_mr *next;
	struct fv_mr *hnext;	/* its lkey's bucket (fv_mr_by_key) */
};

struct fv_cq {
	struct ibv_cq cq;
	int cap, head, count;
	uint64_t mem;		/* its buffer as mlx5 would size it (fv_test_mem) */
	struct ibv_wc *wcs;
};

struct fv_recv {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t len, lkey;
	int nsge;
};

struct fv_qp {
	struct ibv_qp qp;
	struct fv_dev *dev;
	int port;
	int state;
	uint32_t dest_qpn;
	int access;
	int sq_sig_all;
	uint32_t max_inline;
	int path_mtu;		/* enum ibv_mtu, set at RTR (0: none yet) */
	/*
	 * The next PSN to send and the next one expected (24 bits), as set at
	 * RTS and RTR; each request carried out advances its sender's sq_psn and
	 * its destination's rq_psn by one per path-MTU packet (at least one).
	 */
	uint32_t sq_psn, rq_psn;
	int ece_set;		/* ibv_set_ece was called: ece_options is the settled set */
	uint32_t ece_options;
	int rcap, rhead, rcount;
	uint64_t mem;		/* its queues as mlx5 would size them (fv_test_mem) */
	struct fv_recv *rq;
	struct fv_swr *sq, **sq_tail;	/* held send WRs, in posting order (fv_hold.c) */
	struct fv_qp *next;
	struct fv_qp *hnext;	/* its number's bucket (fv_qp_by_num) */
};

struct fv_dev *fv_ctx_dev(struct ibv_context *ctx);
/*
 * A provider library registering itself when loaded, as rdma-core's
 * providers (libmlx5.so.1 among them) do with verbs_register_driver:
 * libibverbs keeps the entry for good and calls into it at every
 * ibv_get_device_list, so unloading that library makes the next one crash.
 */
void fv_provider_register(const char *name, int (*probe)(void));
/*
 * A memory region (fd >= 0: DMA-BUF, refused with EOPNOTSUPP where the
 * device has dmabuf=no), logged as call with extra appended; NULL with
 * errno. Exported for the fake libmlx5 (FAKEVERBS_PRIVATE).
 */
struct ibv_mr *fv_mr_new(const char *call, struct ibv_pd *pd, void *addr, size_t len,
			 uint64_t iova, int access, int fd, uint64_t offset, const char *extra);
struct fv_mr *fv_mr_by_key(uint32_t key, int remote);
struct fv_qp *fv_qp_by_num(uint32_t qpn);
/* Under fv_lock: the first of every QP (then ->next). */
struct fv_qp *fv_qp_list(void);
void fv_cq_push(struct fv_cq *cq, const struct ibv_wc *wc);
/*
 * Out-of-order placement (reorder=yes): an RDMA WRITE longer than
 * FV_REORDER_TAIL bytes (reorder_tail=N: N, a multiple of 8) into such a
 * device has its last FV_REORDER_TAIL (N) bytes placed when it is posted
 * and the rest held back until the next data-path call of the process
 * (post_send, post_recv, poll_cq), a dereg_mr or a destroy_qp: so a
 * completion, always taken through poll_cq, comes after the whole message,
 * and a reader polling memory may see the end of a message before its
 * beginning. reorder_head=N places the first N bytes first instead (a
 * reader sees the beginning of a message before its end), and
 * reorder_delay=K holds the rest through K entries into the provider
 * instead of one. Under fv_lock.
 */
#define FV_REORDER_TAIL 64
/*
 * mr NULL: one more entry into the provider (the parts whose delay is over
 * land); else every part written through registration mr lands now, before
 * it goes (dereg_mr).
 */
void fv_place_held(const void *mr);

/*
 * Held send WRs (fv_hold.c). A send WR that cannot go now is held in its
 * QP's queue, in order: the QP's port or its destination QP's port is not
 * ACTIVE, the device is held (fv_test_hold), the destination QP is in ERR
 * and the device has retry_ms in the description, or earlier WRs are held.
 * At each entry into the provider (fv_progress) a QP in RTS carries its
 * held WRs out in order once nothing stops them, or the head fails with
 * IBV_WC_RETRY_EXC_ERR after retry_ms (never on a retrying or held device)
 * and the QP goes to ERR. A QP going to ERR flushes (fv_qp_error).
 */
#define FV_RETRY_MS 200
struct fv_swr {
	struct ibv_send_wr wr;	/* sg_list points to sge; inline data is copied after it */
	uint64_t since_ns;	/* held since (CLOCK_MONOTONIC); its retry timer */
	struct fv_swr *next;
	struct ibv_sge sge[];
};
/* Why a send WR posted on q now is held, or NULL: it is carried out. */
const char *fv_hold_why(const struct fv_qp *q);
/* Hold a copy of wr at the tail of q's queue (logged as hold); 0 or ENOMEM. */
int fv_hold_push(struct fv_qp *q, const struct ibv_send_wr *wr, const char *why);
/* Every entry into the provider: fv_place_held, then the held WRs' release or timeout. */
void fv_progress(void);
/* q goes to ERR: its held send WRs and posted receives complete with WR_FLUSH_ERR, in order. */
void fv_qp_error(struct fv_qp *q);
/* One WR_FLUSH_ERR completion of q's send (recv 0) or receive queue, logged as flush. */
void fv_flush_one(struct fv_qp *q, int recv, uint64_t wr_id, enum ibv_wc_opcode op);
/* Drop q's held send WRs without completions (RESET, destroy). */
void fv_hold_drop(struct fv_qp *q);
/* Held WRs of the device's QPs; with restart, their retry timers restart now. */
int fv_hold_count(const struct fv_dev *d, int restart);
uint64_t fv_now_ns(void);

/* fv_data.c: carry out one send WR of a QP in RTS and complete it (errors: fv_qp_error). */
void fv_send_run(struct fv_qp *q, const struct ibv_send_wr *wr);
enum ibv_wc_opcode fv_wc_op(enum ibv_wr_opcode op);
/* Complete a send WR (a failed one is logged as wc; a successful unsignaled one gets none). */
void fv_send_complete(struct fv_qp *q, uint64_t wr_id, enum ibv_wr_opcode op, int signaled,
		      enum ibv_wc_status st, uint32_t len);

int fv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int fv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int fv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);

/* fv_ctl.c: what tests change at run time (exported, FAKEVERBS_TEST in fakeverbs.map). */
int fv_test_event(const char *dev, int port, int event_type);
int fv_test_set_gid(const char *dev, int port, int index, const char *addr, int type);
int fv_test_port_state(const char *dev, int port, int state);
int fv_test_hold(const char *dev, int on);
/*
 * The port's speed changes: active_speed code (0 keeps it), active_width
 * code (0 keeps it) and what ibv_query_port_speed answers (100 Mb/s units;
 * -1: speed x width, -2: EOPNOTSUPP); the sysfs rate file follows. event 1
 * also queues FV_EVENT_DEVICE_SPEED_CHANGE on the device's contexts with
 * element.port_num 0, as mlx5 raises it for the whole device; 0 raises
 * nothing (a link that came back at another speed, on a kernel without the
 * event). The number of contexts the event went to (0 without it), or -ENODEV.
 */
int fv_test_port_speed(const char *dev, int port, unsigned speed, int width, long port_speed,
		       int event);
/*
 * QP_FATAL on the first connected QP in RTS of dev: the QP goes to ERR (its
 * WRs flushed, as hardware does) and the event is queued on its context.
 * Returns its QP number, or -ENODEV.
 */
int fv_test_qp_fatal(const char *dev);
/*
 * The next count ibv_modify_qp to state (enum ibv_qp_state) on dev's QPs
 * fail with err (a positive errno), as the kernel's address resolution
 * timing out at RTR; count 0 disarms. 0, or -ENODEV.
 */
int fv_test_modify_fail(const char *dev, int state, int err, int count);
/*
 * What the process holds now, for memory tests (fv_verbs.c): what is one
 * of FV_MEM_*. MR_BYTES: the lengths of the live registrations summed;
 * MR_PINNED: the 4 KiB pages each one spans (what the kernel pins), in
 * bytes; QP_BYTES and CQ_BYTES: the queue buffers as rdma-core's mlx5
 * provider would size them for the caps asked (fv_verbs.c mlx5_qp_bytes).
 * -EINVAL for another what.
 */
enum { FV_MEM_MRS, FV_MEM_MR_BYTES, FV_MEM_MR_PINNED, FV_MEM_QPS, FV_MEM_QP_BYTES, FV_MEM_CQS,
       FV_MEM_CQ_BYTES };
long long fv_test_mem(int what);
/* fv_conf.c: rewrite one GID's sysfs files (gone: the kernel's all-zero entry, no type). */
void fv_sysfs_gid(const struct fv_dev *dev, int port, int index);

/*
 * IBV_EVENT_DEVICE_SPEED_CHANGE (rdma-core 62, Linux 6.19), the value after
 * IBV_EVENT_WQ_FATAL; older verbs.h lack the name.
 */
#define FV_EVENT_DEVICE_SPEED_CHANGE ((int)IBV_EVENT_WQ_FATAL + 1)

/* Not in every verbs.h (rdma-core adds it with IBVERBS_1.16). */
int ibv_query_port_speed(struct ibv_context *context, uint32_t port_num, uint64_t *port_speed);

#endif
