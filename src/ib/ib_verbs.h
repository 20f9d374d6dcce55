/*
 * nccl-net-rail: libibverbs, loaded at run time. Every verbs call of the
 * transport goes through the one table rail_ibv, so that the plugin loads on
 * hosts without rdma-core (dlopen fails, the transport reports 0 devices)
 * and tests can substitute any call (rail_verbs_override) or make the n-th
 * call of one fail (NCCL_RAIL_IB_FAULT=call:ERRNO:n[+]).
 *
 * Return conventions are libibverbs': object constructors return NULL and
 * set errno; the int calls return 0 or an errno value (some providers
 * return -1 and set errno: use rail_verbs_err()).
 */
#ifndef RAIL_IB_VERBS_H
#define RAIL_IB_VERBS_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * struct ibv_port_attr with room for the fields newer rdma-core appends,
 * whatever verbs.h this is built against: rdma-core 48+ puts u32
 * active_speed_ex (XDR and faster; the 8-bit active_speed reads 0 for XDR)
 * right after port_cap_flags2. query_port passes the whole size, so a
 * library that knows the field fills it and an older one leaves it 0.
 */
struct rail_port_attr {
	struct ibv_port_attr attr;
	unsigned char ext[16];
};
#define RAIL_PORT_SPEED_EX_OFF \
	((offsetof(struct ibv_port_attr, port_cap_flags2) + 2 + 3) / 4 * 4)
_Static_assert(RAIL_PORT_SPEED_EX_OFF + 4 <= sizeof(struct rail_port_attr),
	       "struct rail_port_attr has no room for active_speed_ex");

/* active_speed_ex, or 0 where the library does not know it. */
uint32_t rail_port_active_speed_ex(const struct rail_port_attr *a);

struct rail_verbs {
	int (*fork_init)(void);
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *dev);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *ctx);
	int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
	int (*query_port)(struct ibv_context *ctx, uint8_t port, struct rail_port_attr *attr);
	/* Optional (IBVERBS_1.16): effective port speed in 100 Mb/s. */
	int (*query_port_speed)(struct ibv_context *ctx, uint32_t port, uint64_t *speed);
	int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
	/* Optional (IBVERBS_1.8): NULL when libibverbs lacks it. */
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				       unsigned int access);
	/* Optional (IBVERBS_1.12). */
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
				    struct ibv_comp_channel *channel, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	/* Optional here (IBVERBS_1.1, but only the flight record needs it). */
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
			struct ibv_qp_init_attr *init_attr);
	/* Optional (IBVERBS_1.10). */
	int (*query_ece)(struct ibv_qp *qp, struct ibv_ece *ece);
	int (*set_ece)(struct ibv_qp *qp, struct ibv_ece *ece);
	/*
	 * Optional (IBVERBS_1.14, rdma-core 37): whether remote writes into qp
	 * are placed in order; with RAIL_IBV_DATA_IN_ORDER_RETURN_CAPS a mask.
	 */
	int (*query_qp_data_in_order)(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags);
	int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
	void (*ack_async_event)(struct ibv_async_event *ev);
	const char *(*event_type_str)(enum ibv_event_type type);
	const char *(*wc_status_str)(enum ibv_wc_status status);
	/* Static inlines in verbs.h: they call the provider through the context. */
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
	int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
};

extern struct rail_verbs rail_ibv;

/*
 * ibv_query_qp_data_in_order's flag and answer bits, as rdma-core 46+
 * names them (IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS, ..._WHOLE_MSG,
 * ..._ALIGNED_128_BYTES; enums, not in Debian 12's verbs.h). An older
 * library answers 1 for whole-message order whatever the flags, which the
 * WHOLE_MSG bit reads the same way.
 */
#define RAIL_IBV_DATA_IN_ORDER_RETURN_CAPS 1u
#define RAIL_IBV_DATA_IN_ORDER_WHOLE_MSG 1u
#define RAIL_IBV_DATA_IN_ORDER_ALIGNED_128 2u

/*
 * libmlx5's direct verbs for mlx5 Data Direct (NCCL: misc/mlx5dvsymbols.cc),
 * loaded with libibverbs when NCCL_IB_DATA_DIRECT is not 0: the library
 * NCCL_RAIL_MLX5_LIB names, else libmlx5.so.1; mlx5dv_is_supported at
 * MLX5_1.8, the other two at MLX5_1.25 (rdma-core 54+). All three or none:
 * a missing library or symbol is one INFO line and an empty table.
 * rdma-core 44's mlx5dv.h has neither call, hence our prototypes.
 */
struct rail_mlx5dv {
	bool (*is_supported)(struct ibv_device *dev);
	/* 0, or an errno value (ENODEV: no Data Direct device); the path is under /sys. */
	int (*get_data_direct_sysfs_path)(struct ibv_context *ctx, char *buf, size_t len);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
					uint64_t iova, int fd, int access, int mlx5_access);
};
extern struct rail_mlx5dv rail_mlx5dv;
/* mlx5dv_reg_dmabuf_mr's mlx5_access bit (MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT). */
#define RAIL_MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT 1
/* 1 while rail_mlx5dv is filled. */
int rail_mlx5dv_loaded(void);

/*
 * Load libibverbs (NCCL_IBVERBS_LIB, then libibverbs.so.1) and fill the
 * table, then libmlx5 (rail_mlx5dv); reference-counted. A fresh load calls ibv_fork_init first, as
 * NCCL does, before any verbs object exists. 0, or -ENOENT/-ENOSYS with
 * why explaining.
 */
int rail_verbs_load(char *why, size_t why_len);
void rail_verbs_unload(void);
/* 1 while the table is filled. */
int rail_verbs_loaded(void);

/*
 * Replace one call by name ("ibv_reg_mr" or "reg_mr"); fn NULL restores
 * the loaded one. Returns the previous pointer through *old when not NULL.
 * -ENOENT for an unknown name. For tests.
 */
int rail_verbs_override(const char *name, void *fn, void **old);

/*
 * Parse NCCL_RAIL_IB_FAULT ("ibv_post_send:EIO:3,ibv_reg_mr:ENOMEM:2+") and
 * arm the fault wrappers; counting starts now. -EINVAL (warned) on a bad
 * spec. rail_verbs_fault_clear disarms them.
 */
int rail_verbs_fault_arm(const char *spec);
void rail_verbs_fault_clear(void);
/* Number of injected failures so far (tests assert they happened). */
int rail_verbs_faults_injected(void);

/* Live objects created through the table, for leak checks in tests. */
struct rail_verbs_counts {
	int pd, mr, cq, qp, ctx;
};
void rail_verbs_counts(struct rail_verbs_counts *out);

/* errno of a failed int-returning verbs call: ret if positive, else errno. */
int rail_verbs_err(int ret);

const char *rail_ibv_wc_status_str(enum ibv_wc_status status);
const char *rail_ibv_event_str(enum ibv_event_type type);
/* "RESET" ... "ERR" for an enum ibv_qp_state, "?" for anything else. */
const char *rail_ibv_qp_state_str(int state);

/*
 * IBV_EVENT_DEVICE_SPEED_CHANGE (rdma-core 62, Linux 6.19): the effective
 * speed of the device's ports changed (a RoCE LAG member went down or up).
 * It follows IBV_EVENT_WQ_FATAL in enum ibv_event_type (the kernel's number,
 * passed through); older verbs.h lack the name, so it is taken by number.
 * mlx5 raises it for the whole device: element.port_num is 0.
 */
#define RAIL_IBV_EVENT_DEVICE_SPEED_CHANGE ((int)IBV_EVENT_WQ_FATAL + 1)

#endif
