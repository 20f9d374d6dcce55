/*
 * nccl-net-rail: the verbs RMA backend's private header (the contract is
 * rma.h).
 *
 * The group. listen and connect build the TCP mesh of the TCP backend
 * (rma_tcp.h: a control socket each way with every rank, on the verbs
 * transport's out-of-band address); it carries nothing but the set-up
 * exchanges below, never data.
 *
 * Contexts. createContext makes one CQ and, for every context and every
 * rank its stride names, this rank included, one RC QP on the net device's
 * port. Every rank sends each peer one record (its LID, GID, MTU, link layer
 * and, for each context, the number of its QP toward that peer); each QP
 * goes to RTR and RTS toward the peer's matching QP (a rank's own QP toward
 * itself is connected to itself: loopback through the NIC), then a second
 * exchange makes sure every QP of the group is ready before anyone posts.
 *
 * Windows. regMrSym and regMrSymDmaBuf register through the net path's
 * registration (rail_ib_mr_register, ib_mr.c) with local write, remote
 * write, remote read and remote atomic access, never relaxed ordering
 * (RAIL_IB_MR_STRICT: every window is FORCE_SO), each window an MR of its
 * own (RAIL_IB_MR_OWN: deregistering it revokes its rkey), and allgather
 * (status, base address, size, rkey): all ranks fail together.
 *
 * Data. A put is one signalled RDMA WRITE on the QP of (context, peer); a
 * put with a signal is an unsignalled RDMA WRITE chained with a signalled
 * 8-byte ATOMIC_FETCH_AND_ADD on the peer's signal word in one
 * ibv_post_send (size 0: the atomic alone; its old value lands in a
 * scratch word nobody reads). RC executes a QP's requests in order, so a
 * signal is seen only after every byte of every earlier put of that
 * (context, peer): every signal is strong. A get is one RDMA READ. The
 * initiator checks every operation against the bounds every rank
 * registered before it posts: an offset outside the window fails the call
 * with a WARN naming the window, the peer and the bounds. test polls the
 * context's CQ; done means the request's signalled WR completed. An error
 * completion (a bad rkey: a peer that deregistered early, a dead peer)
 * fails its request and every later one on that QP, with a WARN naming
 * the call, the peer and the completion status, and is the group's error
 * for queryLastError.
 *
 * Memory. Host memory, and GPU memory through the HCA's ladder, as the
 * net path's regMr decides (win_ladder): a DMA-BUF (regMrSymDmaBuf: NCCL's
 * fd and offset) where the ladder found DMA-BUF; GPU memory by address
 * (regMrSym of RAIL_PTR_CUDA) where it found peermem (ibv_reg_mr of the
 * GPU address); else the window is refused, naming it and both reasons.
 * ptr_support is the net device's (the API masks HOST|CUDA|DMABUF with the
 * net properties), so NCCL sends GPU memory through regMrSymDmaBuf exactly
 * where DMA-BUF works; a DMA-BUF of the CUDA driver's own for regMrSym is
 * not fetched (NCCL asks for regMrSym of GPU memory only where it found
 * DMA-BUF unusable). The atomics' scratch word stays host memory. Signals
 * into a GPU window are NIC atomics on GPU memory over PCIe: the HCA and
 * the PCIe path must support them (not probed). A get into GPU memory is
 * not visible to the GPU at its completion: iflush of a GPU window posts
 * an RDMA READ of up to 8 bytes of the rank's own copy on its loopback QP
 * of that context (as the net path's GDR flush, ib_flush.c), whose
 * completion follows every earlier NIC write on that path; a host window
 * has nothing to flush.
 *
 * Failures. There is no move or failover during RMA: a QP that fails
 * (port down, peer gone, remote access error) fails its requests and the
 * group's error is set; NCCL then fails the communicator (GIN through
 * queryLastError, host RMA through the test error). A device that cannot
 * do atomics (atomic_cap NONE) is declined at init (rma_ib_usable), so
 * NCCL falls back to its own backend.
 *
 * Layers (test/check-layering.sh -t src/rma/rma_tcp.h): rma_ib_qp (queue
 * pairs and the contexts' exchange), rma_ib_data (requests: post, test),
 * rma_ib (the ops), over rma_mesh.
 */
#ifndef RAIL_RMA_IB_H
#define RAIL_RMA_IB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ib/ib.h"
#include "rma/rma.h"
#include "rma/rma_tcp.h"

/* Send WRs per QP: NCCL keeps at most 32 operations of two WRs in flight per (context, peer). */
#define RMA_IB_SQ_DEPTH 128

struct rma_ib_coll {
	struct rail_rma_coll base;
	struct rma_mesh mesh;
	struct rail_ib_dev *dev;
	struct rail_ib_gid_choice gid;
	uint64_t *scratch;	/* the atomics' old values land here, never read */
	struct ibv_mr *scratch_mr;
	atomic_int err;		/* the first error of the group (negative errno) */
	uint32_t nwins;		/* windows registered: the next index */
};

struct rma_ib_mr {
	struct rail_rma_mr base;
	struct rail_ib_mh *mh;	/* the registration (ib_mr.c's cache) */
	uint32_t lkey, rkey;
	uint64_t *peer_base;	/* [rank] */
	uint64_t *peer_size;
	uint32_t *peer_rkey;
};

struct rma_ib_qp {
	struct ibv_qp *qp;	/* NULL: a peer off the stride */
	int inflight;		/* send WRs posted, not yet completed */
	int failed;		/* an error completion came: everything later fails */
};

enum rma_ib_req_state { RMA_IB_FREE = 0, RMA_IB_WAIT, RMA_IB_DONE, RMA_IB_FAILED };

struct rma_ib_req {
	uint32_t stamp;
	int state;		/* enum rma_ib_req_state */
	int err;		/* FAILED: why (logged) */
	int qpi;
	int nwr;
	int peer, context;
	const char *call;
	uint32_t next;		/* the free list */
};

struct rma_ib_ctx {
	struct rail_rma_ctx base;
	struct rma_ib_coll *coll;
	int tc;			/* the traffic class asked for, -1: NCCL_IB_TC */
	pthread_mutex_t lock;	/* the CQ, the QPs' counts, the requests */
	struct ibv_cq *cq;
	struct rma_ib_qp *qps;	/* [context * nranks + peer] */
	struct rma_ib_req *reqs;
	uint32_t nreqs, free_head, stamp;
};

/* rma_ib_qp.c: the QPs of a context, created and connected (collective). */
int rma_ib_ctx_qps(struct rma_ib_ctx *x);
void rma_ib_ctx_qps_free(struct rma_ib_ctx *x);

/* rma_ib_data.c: the ops of the same names (rma.h). */
int rma_ib_post(struct rail_rma_ctx *x, const struct rail_rma_op *op, uint32_t *idx,
		uint32_t *stamp);
int rma_ib_flush(struct rail_rma_ctx *x, int context, const struct rail_rma_mr *mr,
		 uint32_t *idx, uint32_t *stamp);
int rma_ib_test(struct rail_rma_ctx *x, uint32_t idx, uint32_t stamp, int *done);
int rma_ib_progress(struct rail_rma_ctx *x);
void rma_ib_reqs_free(struct rma_ib_ctx *x);

/* 1 when every device can serve (atomics); else 0 with why. */
int rma_ib_usable(char *why, size_t why_len);

extern const struct rail_rma_ops rail_rma_ib_ops;

#endif
