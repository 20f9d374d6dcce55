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
 *                 spread over the members, the CTS FIFO (sender) or the
 *                 completion records (receiver). Protocol: ib_p2p.c.
 */
#ifndef RAIL_IB_H
#define RAIL_IB_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ib/ib_gid.h"
#include "ib/ib_verbs.h"
#include "ib/ib_wire.h"
#include "matchlist.h"
#include "sock.h"
#include "transport.h"

#define RAIL_IB_MAX_HCAS 32
#define RAIL_IB_MAX_DEVS 64
#define RAIL_IB_MAX_VDEVS 128
#define RAIL_IB_NAME_MAX 64
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

struct rail_ib_hca {
	char name[RAIL_IB_NAME_MAX];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_device_attr attr;
	int max_inline;		/* probed inline size of an RC QP */
	struct rail_ib_ladder ladder;
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
	int speed;		/* Mbps */
	int gid_tbl_len;
	struct rail_ib_gid_choice gid;
	uint64_t guid;		/* sys_image_guid */
	char pci_path[PATH_MAX];
	int rail, plane;	/* from NCCL_IB_HCA, -1 unset */
	atomic_int port_err;	/* PORT_ERR seen */
};

struct rail_ib_vdev {
	char name[RAIL_IB_NAME_MAX * 2];
	int ndevs;
	int devs[RAIL_MAX_VDEV_DEVS];
};

/* ---- device table (ib_init.c) ------------------------------------------ */
int rail_ib_ndevs_phys(void);
struct rail_ib_dev *rail_ib_dev_get(int dev);
/* NULL if vdev does not exist. */
const struct rail_ib_vdev *rail_ib_vdev_get(int vdev);
/* The OOB address (listen sockets bind it). */
const union rail_sockaddr *rail_ib_oob_addr(void);
const char *rail_link_layer_str(int ll);
int rail_ib_port_speed(int active_speed, int active_width);
int rail_ib_mtu_bytes(enum ibv_mtu mtu);

/* ---- discovery, shared with the report (ib_init.c) --------------------- */
struct rail_ib_port_info {
	char hca[RAIL_IB_NAME_MAX];
	int port;
	struct ibv_port_attr attr;
	int kept;
	char why[160];		/* why not kept */
};
/* Query one port and decide whether to use it (state, link layer, NCCL_IB_HCA). */
int rail_ib_port_check(struct ibv_context *ctx, const char *hca, int port,
		       struct rail_ib_port_info *out, const struct rail_match_entry **entry);

/* Parse NCCL_IB_HCA for rail_ib_port_check (init and the report). */
void rail_ib_hca_filter_load(void);

/* ---- GPU memory ladder (ib_ladder.c) ----------------------------------- */
void rail_ib_ladder_decide(struct rail_ib_hca *hca, struct rail_ib_ladder *out);
int rail_ib_ladder_ptr_support(const struct rail_ib_ladder *l);

/* ---- async events (ib_async.c) ----------------------------------------- */
int rail_ib_async_start(struct rail_ib_hca *hca);
void rail_ib_async_stop(struct rail_ib_hca *hca);

/* ---- registration cache (ib_mr.c) -------------------------------------- */
#define RAIL_IB_MH_MAGIC 0x484d4952u /* "RIMH" */
#define RAIL_IB_MR_NEEDS_READ 0x100	/* with RAIL_PTR_*: a flush reads it back */
struct rail_ib_mh {
	uint32_t magic;
	int type;		/* RAIL_PTR_* as registered */
	int gpu;		/* NIC writes need a flush */
	int ndevs;
	struct rail_ib_hca *hca[RAIL_MAX_VDEV_DEVS];
	struct rail_ib_mr_ent *ent[RAIL_MAX_VDEV_DEVS];
	uint32_t lkey[RAIL_MAX_VDEV_DEVS];
	uint32_t rkey[RAIL_MAX_VDEV_DEVS];
};
/* Register [addr, addr+len) on every member HCA (fd < 0: not DMA-BUF). */
int rail_ib_mr_register(struct rail_ib_dev *const *devs, int n, void *addr, size_t len,
			int type, int fd, uint64_t offset, const char *peer,
			struct rail_ib_mh **out);
void rail_ib_mr_deregister(struct rail_ib_mh *mh);
/* Drop every cached registration of an HCA (fini). */
void rail_ib_mr_cache_fini(struct rail_ib_hca *hca);

/* ---- comms (ib_conn.c, ib_qp.c, ib_p2p.c, ib_flush.c) ------------------ */
#define RAIL_IB_SLOTS 64	/* CTS FIFO slots, a power of two */
#define RAIL_IB_EARLY_DEPTH 256	/* sender WRs of early-completed batches in flight per QP */
#define RAIL_IB_MAX_QPS 128

struct rail_ib_comm;

struct rail_ib_qp {
	struct ibv_qp *qp;
	int member;		/* local member index: devres[member] */
	int remote_member;	/* the peer's member this QP talks to */
	uint32_t remote_qpn;
	uint32_t max_inline;
	/*
	 * Receiver: CTS writes posted / known complete. Sender: WRs of
	 * early-completed (all-inline) batches posted / known complete.
	 */
	uint32_t sq_posted;
	uint32_t sq_retired;
};

/* Per member device of a comm. */
struct rail_ib_devres {
	struct rail_ib_dev *dev;
	struct ibv_cq *cq;
	struct ibv_mr *ctrl_mr;		/* FIFO (sender) or completion records (receiver) */
	struct ibv_mr *scratch_mr;	/* sender: sizes; receiver: CTS staging */
	struct ibv_qp *flush_qp;	/* receiver, when flushes are needed */
	struct ibv_mr *flush_mr;
	uint64_t cqes;			/* completions polled on this device */
};

/* The send batch being matched to one CTS slot. */
struct rail_ib_batch {
	int nreqs;
	int matched;
	struct rail_ib_cts cts[RAIL_MAX_RECVS];
	struct rail_ib_req *reqs[RAIL_MAX_RECVS];
};

struct rail_ib_comm {
	struct rail_comm base;		/* first */
	int vdev;
	int ndevs;
	struct rail_ib_devres res[RAIL_MAX_VDEV_DEVS];
	int remote_ndevs;
	struct rail_ib_wire_dev remote[RAIL_MAX_VDEV_DEVS];
	int nqps;
	struct rail_ib_qp qps[RAIL_IB_MAX_QPS];
	int split;			/* NCCL_IB_SPLIT_DATA_ON_QPS */
	int tc, sl;
	char peer[RAIL_ADDR_STRLEN];
	atomic_int fatal;		/* async event on one of our QPs/CQs */
	int error;			/* a failed completion: -errno */
	int oob_fd;			/* the handshake socket, kept to notice a dead peer */
	uint32_t idle;			/* calls that found nothing to do */
	uint64_t oob_checked_ns;
	uint64_t seq;			/* next receive (recv) or batch (send) */
	/* sender */
	uint8_t *fifo;			/* RAIL_IB_SLOTS x RAIL_MAX_RECVS CTS entries */
	uint8_t *sizes;			/* RAIL_IB_SLOTS x RAIL_MAX_RECVS x u32 */
	uint64_t remote_cmpl_addr;
	uint32_t remote_cmpl_rkey[RAIL_MAX_VDEV_DEVS];
	struct rail_ib_batch batch;
	/* receiver */
	uint8_t *cmpl;			/* RAIL_IB_SLOTS x RAIL_MAX_RECVS x u32 sizes */
	uint8_t *cts_stage;		/* RAIL_IB_SLOTS x RAIL_MAX_RECVS CTS entries */
	uint64_t remote_fifo_addr;
	uint32_t remote_fifo_rkey[RAIL_MAX_VDEV_DEVS];
	struct rail_ib_req *slot_busy[RAIL_IB_SLOTS];
	int flush;			/* flush QPs exist */
	uint32_t flush_host;		/* flush host buffers too (testing) */
	uint8_t flush_buf[64];		/* RDMA read target of flushes */
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
};

/* ib_qp.c */
int rail_ib_comm_res_init(struct rail_ib_comm *c, int vdev, int is_send);
void rail_ib_comm_res_fini(struct rail_ib_comm *c);
int rail_ib_comm_qps_create(struct rail_ib_comm *c, int nqps, int is_send);
/* An RC QP on member m, in INIT; NULL with *err (logged). */
struct ibv_qp *rail_ib_qp_new(struct rail_ib_comm *c, int m, int send_wr, int recv_wr,
			      int access, int *err);
int rail_ib_comm_qps_connect(struct rail_ib_comm *c, const uint32_t *remote_qpns);
void rail_ib_local_wire_dev(const struct rail_ib_dev *d, uint32_t rkey,
			    struct rail_ib_wire_dev *out);
int rail_ib_qp_rtr_rts(struct rail_ib_comm *c, struct ibv_qp *qp, struct rail_ib_dev *d,
		       const struct rail_ib_wire_dev *remote, uint32_t remote_qpn,
		       int flush);
int rail_ib_comm_check(struct rail_ib_comm *c, const char *call);
/* Move every QP to the error state (the NIC stops using our memory); the comm fails. */
void rail_ib_comm_quiesce(struct rail_ib_comm *c, const char *why);
const char *rail_ib_qp_where(struct rail_ib_comm *c, int qpi, char *buf, size_t len);

/* ib_p2p.c */
int rail_ib_isend(struct rail_comm *comm, struct rail_req *req, void *data, size_t size, int tag,
		  void *mhandle);
int rail_ib_irecv(struct rail_comm *comm, struct rail_req *req, int n, void **data,
		  const size_t *sizes, const int *tags, void **mhandles);
int rail_ib_test(struct rail_req *req, int *done, size_t *sizes);
int rail_ib_poll(struct rail_ib_comm *c);
/* Every ~100 ms of waiting: -ECONNRESET (logged) once the peer closed its socket. */
int rail_ib_peer_check(struct rail_ib_comm *c, const char *call);

/* ib_flush.c */
int rail_ib_flush_init(struct rail_ib_comm *c);
void rail_ib_flush_fini(struct rail_ib_comm *c);
int rail_ib_iflush(struct rail_comm *comm, struct rail_req *req, int n, void **data,
		   const int *sizes, void **mhandles);

/* ib_conn.c */
int rail_ib_listen(int dev, void *handle, struct rail_comm **listen_comm);
int rail_ib_connect(int dev, const struct rail_conn_opts *opts, void *handle,
		    struct rail_comm **send_comm);
int rail_ib_accept(struct rail_comm *listen_comm, struct rail_comm **recv_comm);
int rail_ib_close_send(struct rail_comm *comm);
int rail_ib_close_recv(struct rail_comm *comm);
int rail_ib_close_listen(struct rail_comm *comm);
void rail_ib_comm_free(struct rail_ib_comm *c);

/* ib_mr.c, the ops */
int rail_ib_reg_mr(struct rail_comm *comm, void *data, size_t size, int type, void **mhandle);
int rail_ib_reg_mr_dmabuf(struct rail_comm *comm, void *data, size_t size, int type,
			  uint64_t offset, int fd, void **mhandle);
int rail_ib_dereg_mr(struct rail_comm *comm, void *mhandle);

#endif
