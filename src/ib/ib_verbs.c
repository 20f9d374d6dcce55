/*
 * nccl-net-rail: libibverbs through dlopen + dlvsym, one wrapper table.
 *
 * Symbols are bound with their version (IBVERBS_1.1 for the base API, 1.8,
 * 1.10, 1.12, 1.14 and 1.16 for the optional newer calls) so that the behaviour does
 * not depend on which default version the library exports. verbs.h defines
 * ibv_query_port as a static inline that prefers the extended context op
 * (verbs_context->query_port, which knows the caller's struct size) and
 * falls back to the exported ibv_query_port@IBVERBS_1.1 with the old
 * layout; our shim does the same, with room for the fields newer
 * rdma-core appends (struct rail_port_attr). ibv_post_send, ibv_post_recv and
 * ibv_poll_cq are inlines calling the provider through ctx->ops.
 *
 * libmlx5's three Data Direct calls (struct rail_mlx5dv) are loaded after
 * it, the same way, and are optional as a whole.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib/ib_verbs.h"
#include "log.h"
#include "param.h"
#include "rail.h"

struct rail_verbs rail_ibv;

static struct rail_verbs loaded;	/* what dlvsym gave (plus shims) */
static void *lib_handle;
static int lib_refs;
static pthread_mutex_t lib_lock = PTHREAD_MUTEX_INITIALIZER;
static int (*compat_query_port)(struct ibv_context *ctx, uint8_t port, void *attr);

static atomic_int live_pd, live_mr, live_cq, live_qp, live_ctx;

struct rail_mlx5dv rail_mlx5dv;
static struct rail_mlx5dv mlx5_loaded;
static void *mlx5_handle;

struct verbs_sym {
	const char *name;	/* exported name */
	const char *version;
	size_t offset;		/* in struct rail_verbs; SIZE_MAX: not a table slot */
	int optional;
};

#define SLOT(f) offsetof(struct rail_verbs, f)
#define NOSLOT ((size_t)-1)

static const struct verbs_sym syms[] = {
	{ "ibv_fork_init", "IBVERBS_1.1", SLOT(fork_init), 0 },
	{ "ibv_get_device_list", "IBVERBS_1.1", SLOT(get_device_list), 0 },
	{ "ibv_free_device_list", "IBVERBS_1.1", SLOT(free_device_list), 0 },
	{ "ibv_get_device_name", "IBVERBS_1.1", SLOT(get_device_name), 0 },
	{ "ibv_open_device", "IBVERBS_1.1", SLOT(open_device), 0 },
	{ "ibv_close_device", "IBVERBS_1.1", SLOT(close_device), 0 },
	{ "ibv_query_device", "IBVERBS_1.1", SLOT(query_device), 0 },
	{ "ibv_query_port", "IBVERBS_1.1", NOSLOT, 0 },
	{ "ibv_query_gid", "IBVERBS_1.1", SLOT(query_gid), 0 },
	{ "ibv_alloc_pd", "IBVERBS_1.1", SLOT(alloc_pd), 0 },
	{ "ibv_dealloc_pd", "IBVERBS_1.1", SLOT(dealloc_pd), 0 },
	{ "ibv_reg_mr", "IBVERBS_1.1", SLOT(reg_mr), 0 },
	{ "ibv_reg_mr_iova2", "IBVERBS_1.8", SLOT(reg_mr_iova2), 1 },
	{ "ibv_reg_dmabuf_mr", "IBVERBS_1.12", SLOT(reg_dmabuf_mr), 1 },
	{ "ibv_dereg_mr", "IBVERBS_1.1", SLOT(dereg_mr), 0 },
	{ "ibv_create_cq", "IBVERBS_1.1", SLOT(create_cq), 0 },
	{ "ibv_destroy_cq", "IBVERBS_1.1", SLOT(destroy_cq), 0 },
	{ "ibv_create_qp", "IBVERBS_1.1", SLOT(create_qp), 0 },
	{ "ibv_modify_qp", "IBVERBS_1.1", SLOT(modify_qp), 0 },
	{ "ibv_destroy_qp", "IBVERBS_1.1", SLOT(destroy_qp), 0 },
	{ "ibv_query_qp", "IBVERBS_1.1", SLOT(query_qp), 1 },
	{ "ibv_query_ece", "IBVERBS_1.10", SLOT(query_ece), 1 },
	{ "ibv_set_ece", "IBVERBS_1.10", SLOT(set_ece), 1 },
	{ "ibv_get_async_event", "IBVERBS_1.1", SLOT(get_async_event), 0 },
	{ "ibv_ack_async_event", "IBVERBS_1.1", SLOT(ack_async_event), 0 },
	{ "ibv_event_type_str", "IBVERBS_1.1", SLOT(event_type_str), 0 },
	{ "ibv_wc_status_str", "IBVERBS_1.1", SLOT(wc_status_str), 0 },
	{ "ibv_query_port_speed", "IBVERBS_1.16", SLOT(query_port_speed), 1 },
	{ "ibv_query_qp_data_in_order", "IBVERBS_1.14", SLOT(query_qp_data_in_order), 1 },
};

/* Names accepted by rail_verbs_override, including the inline-backed slots. */
static const struct {
	const char *name;
	size_t offset;
} slots[] = {
	{ "fork_init", SLOT(fork_init) },
	{ "get_device_list", SLOT(get_device_list) }, { "free_device_list", SLOT(free_device_list) },
	{ "get_device_name", SLOT(get_device_name) }, { "open_device", SLOT(open_device) },
	{ "close_device", SLOT(close_device) },	      { "query_device", SLOT(query_device) },
	{ "query_port", SLOT(query_port) },	      { "query_gid", SLOT(query_gid) },
	{ "alloc_pd", SLOT(alloc_pd) },		      { "dealloc_pd", SLOT(dealloc_pd) },
	{ "reg_mr", SLOT(reg_mr) },		      { "reg_mr_iova2", SLOT(reg_mr_iova2) },
	{ "reg_dmabuf_mr", SLOT(reg_dmabuf_mr) },     { "dereg_mr", SLOT(dereg_mr) },
	{ "create_cq", SLOT(create_cq) },	      { "destroy_cq", SLOT(destroy_cq) },
	{ "create_qp", SLOT(create_qp) },	      { "modify_qp", SLOT(modify_qp) },
	{ "destroy_qp", SLOT(destroy_qp) },	      { "query_qp", SLOT(query_qp) },	      { "query_ece", SLOT(query_ece) },
	{ "set_ece", SLOT(set_ece) },		      { "get_async_event", SLOT(get_async_event) },
	{ "ack_async_event", SLOT(ack_async_event) }, { "event_type_str", SLOT(event_type_str) },
	{ "wc_status_str", SLOT(wc_status_str) },     { "post_send", SLOT(post_send) },
	{ "post_recv", SLOT(post_recv) },	      { "poll_cq", SLOT(poll_cq) },
	{ "query_port_speed", SLOT(query_port_speed) },
	{ "query_qp_data_in_order", SLOT(query_qp_data_in_order) },
};

static void **slot_ptr(struct rail_verbs *t, size_t offset)
{
	return (void **)((char *)t + offset);
}

int rail_verbs_err(int ret)
{
	if (ret > 0)
		return ret;
	return errno ? errno : EIO;
}

/* ---- shims for the inlines and the live-object counters ---------------- */

static int shim_query_port(struct ibv_context *ctx, uint8_t port, struct rail_port_attr *attr)
{
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);

	memset(attr, 0, sizeof(*attr));
	if (vctx)
		return vctx->query_port(ctx, port, &attr->attr, sizeof(*attr));
	return compat_query_port(ctx, port, &attr->attr);
}

uint32_t rail_port_active_speed_ex(const struct rail_port_attr *a)
{
	uint32_t v;

	memcpy(&v, (const char *)a + RAIL_PORT_SPEED_EX_OFF, sizeof(v));
	return v;
}

static int shim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	return qp->context->ops.post_send(qp, wr, bad);
}

static int shim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	return qp->context->ops.post_recv(qp, wr, bad);
}

static int shim_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return cq->context->ops.poll_cq(cq, n, wc);
}

#define COUNT_CTOR(ret_t, name, counter, params, args)          \
	static ret_t count_##name params                        \
	{                                                       \
		ret_t obj = loaded.name args;                   \
		if (obj)                                        \
			atomic_fetch_add(&counter, 1);          \
		return obj;                                     \
	}
#define COUNT_DTOR(arg_t, name, counter)                        \
	static int count_##name(arg_t obj)                      \
	{                                                       \
		int ret = loaded.name(obj);                     \
		if (ret == 0)                                   \
			atomic_fetch_sub(&counter, 1);          \
		return ret;                                     \
	}

COUNT_CTOR(struct ibv_context *, open_device, live_ctx, (struct ibv_device *d), (d))
COUNT_DTOR(struct ibv_context *, close_device, live_ctx)
COUNT_CTOR(struct ibv_pd *, alloc_pd, live_pd, (struct ibv_context *c), (c))
COUNT_DTOR(struct ibv_pd *, dealloc_pd, live_pd)
COUNT_CTOR(struct ibv_mr *, reg_mr, live_mr, (struct ibv_pd *p, void *a, size_t l, int f),
	   (p, a, l, f))
COUNT_DTOR(struct ibv_mr *, dereg_mr, live_mr)
COUNT_CTOR(struct ibv_cq *, create_cq, live_cq,
	   (struct ibv_context *c, int n, void *x, struct ibv_comp_channel *ch, int v),
	   (c, n, x, ch, v))
COUNT_DTOR(struct ibv_cq *, destroy_cq, live_cq)
COUNT_CTOR(struct ibv_qp *, create_qp, live_qp, (struct ibv_pd *p, struct ibv_qp_init_attr *a),
	   (p, a))
COUNT_DTOR(struct ibv_qp *, destroy_qp, live_qp)

static struct ibv_mr *count_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len,
					 uint64_t iova, unsigned int access)
{
	struct ibv_mr *mr = loaded.reg_mr_iova2(pd, addr, len, iova, access);

	if (mr)
		atomic_fetch_add(&live_mr, 1);
	return mr;
}

static struct ibv_mr *count_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					  uint64_t iova, int fd, int access)
{
	struct ibv_mr *mr = loaded.reg_dmabuf_mr(pd, offset, len, iova, fd, access);

	if (mr)
		atomic_fetch_add(&live_mr, 1);
	return mr;
}

static struct ibv_mr *count_mlx5dv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
						 uint64_t iova, int fd, int access, int mlx5_access)
{
	struct ibv_mr *mr = mlx5_loaded.reg_dmabuf_mr(pd, offset, len, iova, fd, access,
						       mlx5_access);

	if (mr)
		atomic_fetch_add(&live_mr, 1);
	return mr;
}

void rail_verbs_counts(struct rail_verbs_counts *out)
{
	out->pd = atomic_load(&live_pd);
	out->mr = atomic_load(&live_mr);
	out->cq = atomic_load(&live_cq);
	out->qp = atomic_load(&live_qp);
	out->ctx = atomic_load(&live_ctx);
}

/* ---- loading ------------------------------------------------------------ */

/*
 * RTLD_NODELETE: once ibv_fork_init ran, libibverbs tracks registered pages
 * for fork() in its own memory; unloading it would drop that state (and
 * LeakSanitizer reports it as lost). A dlclose only drops our reference.
 */
#define LIB_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)

static void *open_lib(char *why, size_t why_len)
{
	const char *user = rail_param_str(RAIL_P_IBVERBS_LIB);
	void *h;

	if (user[0]) {
		h = dlopen(user, LIB_FLAGS);
		if (h)
			return h;
		RAIL_WARN("NCCL_IBVERBS_LIB=%s cannot be loaded (%s); trying libibverbs.so.1", user,
			  dlerror());
	}
	h = dlopen("libibverbs.so.1", LIB_FLAGS);
	if (!h)
		snprintf(why, why_len, "libibverbs.so.1 cannot be loaded (%s): install rdma-core "
			 "(libibverbs1) to use RDMA devices", dlerror());
	return h;
}

static int bind_all(void *h, char *why, size_t why_len)
{
	memset(&loaded, 0, sizeof(loaded));
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(syms); i++) {
		void *fn = dlvsym(h, syms[i].name, syms[i].version);

		if (!fn && !syms[i].optional) {
			snprintf(why, why_len, "libibverbs lacks %s@%s (rdma-core too old?)",
				 syms[i].name, syms[i].version);
			return -ENOSYS;
		}
		if (syms[i].offset == NOSLOT)
			memcpy(&compat_query_port, &fn, sizeof(fn));
		else
			*slot_ptr(&loaded, syms[i].offset) = fn;
	}
	loaded.query_port = shim_query_port;
	loaded.post_send = shim_post_send;
	loaded.post_recv = shim_post_recv;
	loaded.poll_cq = shim_poll_cq;
	return 0;
}

static void fill_table(void)
{
	rail_ibv = loaded;
	rail_ibv.open_device = count_open_device;
	rail_ibv.close_device = count_close_device;
	rail_ibv.alloc_pd = count_alloc_pd;
	rail_ibv.dealloc_pd = count_dealloc_pd;
	rail_ibv.reg_mr = count_reg_mr;
	rail_ibv.reg_mr_iova2 = loaded.reg_mr_iova2 ? count_reg_mr_iova2 : NULL;
	rail_ibv.reg_dmabuf_mr = loaded.reg_dmabuf_mr ? count_reg_dmabuf_mr : NULL;
	rail_ibv.dereg_mr = count_dereg_mr;
	rail_ibv.create_cq = count_create_cq;
	rail_ibv.destroy_cq = count_destroy_cq;
	rail_ibv.create_qp = count_create_qp;
	rail_ibv.destroy_qp = count_destroy_qp;
}

/*
 * NCCL calls ibv_fork_init once, unconditionally, before listing devices
 * (init.cc). With it, registered pages are kept out of fork() children
 * (MADV_DONTFORK) on kernels without copy-on-fork for pinned pages (before
 * 5.13), so a fork() (a DataLoader worker) cannot leave the NIC writing
 * into pages the parent no longer owns. RDMAV_FORK_SAFE / IBV_FORK_SAFE
 * are read by libibverbs itself, which then calls it on its own.
 */
static void fork_init(void)
{
	int ret = loaded.fork_init();

	if (ret)
		RAIL_WARN("ibv_fork_init failed: %s; registered buffers are not protected from "
			  "fork() in this process (kernels before 5.13 need it: avoid fork() "
			  "after NCCL init, or use a newer kernel)",
			  RAIL_ERRSTR(-rail_verbs_err(ret)));
}

/* ---- libmlx5 (Data Direct) ---------------------------------------------- */

static const struct verbs_sym mlx5_syms[] = {
	{ "mlx5dv_is_supported", "MLX5_1.8", offsetof(struct rail_mlx5dv, is_supported), 0 },
	{ "mlx5dv_get_data_direct_sysfs_path", "MLX5_1.25",
	  offsetof(struct rail_mlx5dv, get_data_direct_sysfs_path), 0 },
	{ "mlx5dv_reg_dmabuf_mr", "MLX5_1.25", offsetof(struct rail_mlx5dv, reg_dmabuf_mr), 0 },
};

/*
 * After libibverbs (libmlx5 needs it). Everything missing is one INFO
 * line: Data Direct is then not used and nothing else changes.
 */
/*
 * Why Data Direct is off, at INFO, once per process for the same reason
 * (rail-info and a re-initialised plugin load libibverbs again). Under lib_lock.
 */
static void mlx5_skip(const char *why)
{
	static char said[512];

	if (!strcmp(said, why))
		return;
	rail_strlcpy(said, why, sizeof(said));
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s: mlx5 Data Direct is not used", why);
}

static void mlx5_load(void)
{
	const char *user = rail_param_str(RAIL_P_MLX5_LIB);
	const char *name = user[0] ? user : "libmlx5.so.1";
	char why[480];
	void *h;

	if (!rail_param_int(RAIL_P_IB_DATA_DIRECT))
		return;
	/*
	 * RTLD_NODELETE: libmlx5.so.1 is rdma-core's mlx5 provider, which
	 * registers itself with libibverbs when loaded; libibverbs calls into
	 * it at every ibv_get_device_list, so unmapping it (a library without
	 * the Data Direct calls, or at unload) crashes the next listing.
	 */
	h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!h) {
		snprintf(why, sizeof(why), "%s cannot be loaded (%s; rdma-core 54+'s libmlx5 has "
			 "it)", name, dlerror());
		mlx5_skip(why);
		return;
	}
	memset(&mlx5_loaded, 0, sizeof(mlx5_loaded));
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(mlx5_syms); i++) {
		void *fn = dlvsym(h, mlx5_syms[i].name, mlx5_syms[i].version);

		if (!fn) {
			snprintf(why, sizeof(why), "%s lacks %s@%s (rdma-core older than 54?)",
				 name, mlx5_syms[i].name, mlx5_syms[i].version);
			mlx5_skip(why);
			memset(&mlx5_loaded, 0, sizeof(mlx5_loaded));
			dlclose(h);
			return;
		}
		memcpy((char *)&mlx5_loaded + mlx5_syms[i].offset, &fn, sizeof(fn));
	}
	mlx5_handle = h;
	rail_mlx5dv = mlx5_loaded;
	rail_mlx5dv.reg_dmabuf_mr = count_mlx5dv_reg_dmabuf_mr;
}

static void mlx5_unload(void)
{
	memset(&rail_mlx5dv, 0, sizeof(rail_mlx5dv));
	memset(&mlx5_loaded, 0, sizeof(mlx5_loaded));
	if (mlx5_handle)
		dlclose(mlx5_handle);
	mlx5_handle = NULL;
}

int rail_mlx5dv_loaded(void)
{
	return mlx5_handle != NULL;
}

int rail_verbs_load(char *why, size_t why_len)
{
	int err = 0;
	void *h;

	pthread_mutex_lock(&lib_lock);
	if (lib_refs > 0) {
		lib_refs++;
		goto out;
	}
	h = open_lib(why, why_len);
	if (!h) {
		err = -ENOENT;
		goto out;
	}
	err = bind_all(h, why, why_len);
	if (err) {
		dlclose(h);
		goto out;
	}
	lib_handle = h;
	lib_refs = 1;
	fork_init();
	fill_table();
	mlx5_load();
out:
	pthread_mutex_unlock(&lib_lock);
	return err;
}

void rail_verbs_unload(void)
{
	pthread_mutex_lock(&lib_lock);
	if (lib_refs > 0 && --lib_refs == 0) {
		rail_verbs_fault_clear();
		mlx5_unload();
		memset(&rail_ibv, 0, sizeof(rail_ibv));
		memset(&loaded, 0, sizeof(loaded));
		dlclose(lib_handle);
		lib_handle = NULL;
	}
	pthread_mutex_unlock(&lib_lock);
}

int rail_verbs_loaded(void)
{
	return lib_refs > 0;
}

static int find_slot(const char *name, size_t *offset)
{
	if (!strncmp(name, "ibv_", 4))
		name += 4;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(slots); i++) {
		if (!strcmp(slots[i].name, name)) {
			*offset = slots[i].offset;
			return 0;
		}
	}
	return -ENOENT;
}

int rail_verbs_override(const char *name, void *fn, void **old)
{
	struct rail_verbs fresh;
	size_t off;

	if (find_slot(name, &off))
		return -ENOENT;
	if (old)
		*old = *slot_ptr(&rail_ibv, off);
	if (!fn) {
		/* Back to what rail_verbs_load installed (counting shims included). */
		struct rail_verbs save = rail_ibv;

		fill_table();
		fresh = rail_ibv;
		rail_ibv = save;
		fn = *slot_ptr(&fresh, off);
	}
	*slot_ptr(&rail_ibv, off) = fn;
	return 0;
}

const char *rail_ibv_wc_status_str(enum ibv_wc_status status)
{
	return rail_ibv.wc_status_str ? rail_ibv.wc_status_str(status) : "unknown status";
}

const char *rail_ibv_event_str(enum ibv_event_type type)
{
	return rail_ibv.event_type_str ? rail_ibv.event_type_str(type) : "unknown event";
}

const char *rail_ibv_qp_state_str(int state)
{
	static const char *const names[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };

	return state >= 0 && state < (int)(sizeof(names) / sizeof(names[0])) ? names[state] : "?";
}
