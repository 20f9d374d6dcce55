/*
 * nccl-net-rail: one-sided RMA, the interface between the version-neutral
 * RMA API (src/api_rma.c) and an RMA backend.
 *
 * NCCL's RMA table (include/rma_v14.h) works on a group of ranks: every rank
 * listens on a device, NCCL allgathers the handles, and connect builds the
 * group (a collComm) from all of them at once. Contexts (createContext) are
 * independent ordered channels inside the group; windows (regMrSym) are
 * registered by every rank in the same order, so the k-th window of every
 * rank is the same symmetric window and a data operation names it by the
 * caller's own registration plus an offset. A put lands in the target's
 * copy, a signal is a 64-bit add at an offset of a window, a get reads the
 * target's copy.
 *
 * Backends see no NCCL type: they return 0 or a negative errno, log their
 * own errors with the call, the errno text, the device and the peer rank
 * and address, and write outputs only on success. Their objects start with
 * the common structs below. The API owns the handles NCCL holds (numbers,
 * src/handles.h) and checks everything that needs no backend knowledge:
 * handles, ranks, context indices, signal ops.
 *
 * Devices are the net transport's own devices, in the same order and with
 * the same properties (NCCL keys its topology nodes by name and lets the
 * last plugin's index win: RMA device i must be net device i).
 */
#ifndef RAIL_RMA_H
#define RAIL_RMA_H

#include <stddef.h>
#include <stdint.h>

/* Pointer kinds and the regMrSym flags, with NCCL's bit values. */
#define RAIL_RMA_MR_FORCE_SO 0x1
#define RAIL_RMA_MR_SIGNAL_NEVER_RESET 0x2
#define RAIL_RMA_MR_FLAGS (RAIL_RMA_MR_FORCE_SO | RAIL_RMA_MR_SIGNAL_NEVER_RESET)

/* The signal ops of NCCL (iputSignal): INC adds 1, ADD adds the value. */
#define RAIL_RMA_SIGNAL_INC 0x1
#define RAIL_RMA_SIGNAL_ADD 0x2

#define RAIL_RMA_LISTEN_MAGIC 0x4c414d52u	/* "RMAL" */
#define RAIL_RMA_COLL_MAGIC 0x43414d52u		/* "RMAC" */
#define RAIL_RMA_CTX_MAGIC 0x58414d52u		/* "RMAX" */
#define RAIL_RMA_MR_MAGIC 0x4d414d52u		/* "RMAM" */

#define RAIL_RMA_MAX_RANKS 65536
#define RAIL_RMA_MAX_CONTEXTS 64	/* per createContext call */

struct rail_rma_ops;

struct rail_rma_listen {
	int dev;
	const struct rail_rma_ops *ops;
};

struct rail_rma_coll {
	int dev;
	int nranks;
	int rank;
	const struct rail_rma_ops *ops;
	uintptr_t handle;	/* the API's, for the registrations it owns */
	struct rail_rma_ctx *ctxs;	/* the API's: contexts not destroyed yet */
};

struct rail_rma_ctx {
	struct rail_rma_coll *coll;
	int ncontexts;
	int stride;		/* targets: (rank + k * stride) % nranks */
	uintptr_t handle;	/* the API's */
	struct rail_rma_ctx *next;	/* the API's: the collComm's list */
};

/* A symmetric window as this rank registered it. */
struct rail_rma_mr {
	struct rail_rma_coll *coll;
	uint32_t index;		/* the same on every rank: registration order */
	int type;		/* RAIL_PTR_HOST, RAIL_PTR_CUDA */
	uint64_t flags;		/* RAIL_RMA_MR_* */
	char *base;
	size_t size;
};

enum rail_rma_op_kind { RAIL_RMA_PUT = 1, RAIL_RMA_GET = 2 };

/*
 * One data operation, its handles resolved by the API. local is the source
 * of a put and the destination of a get; remote names the target's copy by
 * this rank's registration of the same window. Both are NULL for a size-0
 * put (a signal alone). sig is NULL without a signal.
 */
struct rail_rma_op {
	enum rail_rma_op_kind kind;
	const char *call;	/* "iput", "iputSignal", "iget": for messages */
	int context;
	int peer;
	size_t size;
	const struct rail_rma_mr *local;
	uint64_t local_off;
	const struct rail_rma_mr *remote;
	uint64_t remote_off;
	const struct rail_rma_mr *sig;
	uint64_t sig_off;
	uint64_t sig_add;	/* what the signal adds: 1 for INC, the value for ADD */
};

struct rail_rma_ops {
	const char *name;
	/* Memory kinds it serves (RAIL_PTR_*): the ptrSupport it reports. */
	int ptr_support;
	int (*listen)(int dev, void *handle, struct rail_rma_listen **listen_comm);
	/* Collective and blocking; handles[i] is rank i's listen handle. */
	int (*connect)(struct rail_rma_listen *lc, void *const *handles, int nranks, int rank,
		       struct rail_rma_coll **coll);
	/* Collective: ncontexts channels to the ranks the stride names. */
	int (*create_ctx)(struct rail_rma_coll *coll, int ncontexts, int traffic_class,
			  int stride, struct rail_rma_ctx **ctx);
	/* Collective, same order on every rank; fd >= 0: a DMA-BUF. */
	int (*reg)(struct rail_rma_coll *coll, void *data, size_t size, int type, uint64_t flags,
		   int fd, uint64_t offset, struct rail_rma_mr **mr);
	int (*dereg)(struct rail_rma_coll *coll, struct rail_rma_mr *mr);
	/* A put, a put with a signal, or a get: *idx and *stamp name the request. */
	int (*post)(struct rail_rma_ctx *ctx, const struct rail_rma_op *op, uint32_t *idx,
		    uint32_t *stamp);
	/* Returns 1 when gets already done are visible (no request), else posts one. */
	int (*flush)(struct rail_rma_ctx *ctx, int context, const struct rail_rma_mr *mr,
		     uint32_t *idx, uint32_t *stamp);
	/* An error fails the request (logged); a done request is given back. */
	int (*test)(struct rail_rma_ctx *ctx, uint32_t idx, uint32_t stamp, int *done);
	int (*progress)(struct rail_rma_ctx *ctx);
	/* 0, or the first error of the group (negative errno), as queryLastError reports it. */
	int (*last_error)(struct rail_rma_ctx *ctx);
	int (*destroy_ctx)(struct rail_rma_ctx *ctx);
	int (*close_coll)(struct rail_rma_coll *coll);
	int (*close_listen)(struct rail_rma_listen *lc);
};

/*
 * The backend that serves the net transport named transport ("tcp", "ib"),
 * or NULL with why saying why none does (for the init line).
 */
const struct rail_rma_ops *rail_rma_backend(const char *transport, char *why, size_t why_len);

#endif
