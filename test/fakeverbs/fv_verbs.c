/*
 * fakeverbs: devices, contexts, queries, protection domains, memory
 * regions, completion queues and queue pairs. The data path (post_send,
 * post_recv, poll_cq) is in fv_data.c.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fv.h"

pthread_mutex_t fv_lock = PTHREAD_MUTEX_INITIALIZER;

static int open_ctxs;
struct fv_ctx *fv_ctxs;
static uint32_t next_qpn = 0x100, next_key = 0x1000;

/*
 * Registrations by lkey and QPs by number, hashed: a post looks both up,
 * and a walk of every one of thousands of connections per post would make
 * the fake, not the plugin, what a benchmark of many connections measures.
 * An rkey is its lkey + 1 (fv_mr_new). Under fv_lock.
 */
#define FV_BUCKETS 4096u
static struct fv_mr *mr_bucket[FV_BUCKETS];
static struct fv_qp *qp_bucket[FV_BUCKETS];
static struct fv_mr *mrs;
static struct fv_qp *qps;
static long long cq_count, cq_mem;	/* live CQs and their buffers (fv_test_mem) */

#define LOCKED(expr) do { pthread_mutex_lock(&fv_lock); expr; pthread_mutex_unlock(&fv_lock); } while (0)

struct fv_dev *fv_ctx_dev(struct ibv_context *ctx)
{
	struct verbs_context *v = verbs_get_ctx(ctx);

	return ((struct fv_ctx *)(void *)v)->dev;
}

static const char *ctx_name(struct ibv_context *ctx)
{
	return fv_ctx_dev(ctx)->ibdev.name;
}

/* ---- library, devices, contexts ----------------------------------------- */

static struct {
	const char *name;
	int (*probe)(void);
} providers[8];
static int nproviders;

void fv_provider_register(const char *name, int (*probe)(void))
{
	pthread_mutex_lock(&fv_lock);
	if (nproviders < (int)(sizeof(providers) / sizeof(providers[0]))) {
		providers[nproviders].name = name;
		providers[nproviders++].probe = probe;
	}
	pthread_mutex_unlock(&fv_lock);
}

/* Under fv_lock. Where rdma-core would crash, say why first, then crash the same way. */
static void providers_probe(void)
{
	for (int i = 0; i < nproviders; i++) {
		Dl_info info;

		if (!dladdr((void *)providers[i].probe, &info)) {
			fv_log("ibv_get_device_list provider_unloaded=1");
			fprintf(stderr, "fakeverbs: ibv_get_device_list: a provider registered by a "
				"library that has been unloaded since (dlclose without "
				"RTLD_NODELETE); rdma-core's libibverbs crashes here\n");
			abort();
		}
		providers[i].probe();
	}
}

int ibv_fork_init(void)
{
	LOCKED(fv_log_reopen(); fv_log("ibv_fork_init ret=0"));
	return 0;
}

struct ibv_device **ibv_get_device_list(int *num)
{
	struct ibv_device **list;
	int n;

	pthread_mutex_lock(&fv_lock);
	fv_log_reopen();
	if (open_ctxs == 0) {	/* a fresh start reads the description again */
		fv_conf_load();
		fv_sysfs_write();
	}
	providers_probe();
	n = fv_conf.ndevs;
	list = calloc((size_t)n + 1, sizeof(*list));
	for (int i = 0; list && i < n; i++)
		list[i] = &fv_conf.devs[i].ibdev;
	fv_log("ibv_get_device_list n=%d", n);
	pthread_mutex_unlock(&fv_lock);
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	if (num)
		*num = n;
	return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *dev)
{
	return dev->name;
}

static void fill_port(struct fv_dev *d, int pn, struct ibv_port_attr *a, size_t size)
{
	const struct fv_port *p = &d->ports[pn - 1];

	memset(a, 0, size);
	a->state = (enum ibv_port_state)p->state;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = (enum ibv_mtu)p->mtu;
	a->gid_tbl_len = p->gid_tbl_len;
	a->port_cap_flags = IBV_PORT_CM_SUP;
	a->max_msg_sz = 1u << 30;
	a->pkey_tbl_len = 128;
	a->lid = p->link_layer == IBV_LINK_LAYER_ETHERNET ? 0 : p->lid;
	a->sm_lid = p->sm_lid;
	a->active_width = (uint8_t)p->width;
	a->active_speed = (uint8_t)p->speed;	/* the kernel's u8: XDR (0x100) reads 0 */
	a->phys_state = p->state == IBV_PORT_ACTIVE ? 5 : 3;
	a->link_layer = (uint8_t)p->link_layer;
	if (size > offsetof(struct ibv_port_attr, flags))
		a->flags = p->flags;
	if (fv_conf.speed_ex && size >= FV_SPEED_EX_OFF + 4) {
		uint32_t ex = p->speed;

		memcpy((char *)a + FV_SPEED_EX_OFF, &ex, sizeof(ex));
	}
}

/* verbs_context->query_port: what verbs.h's inline ibv_query_port calls. */
static int query_port_ex(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a,
			 size_t size)
{
	struct fv_dev *d = fv_ctx_dev(ctx);

	pthread_mutex_lock(&fv_lock);
	fv_log("ibv_query_port dev=%s port=%u size=%zu", d->ibdev.name, port, size);
	if (port < 1 || port > d->nports) {
		pthread_mutex_unlock(&fv_lock);
		return EINVAL;
	}
	fill_port(d, port, a, size);
	pthread_mutex_unlock(&fv_lock);
	return 0;
}

/* The exported legacy entry: the layout before 'flags', never extended. */
int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr)
{
	return query_port_ex(ctx, port, (struct ibv_port_attr *)(void *)attr,
			     offsetof(struct ibv_port_attr, flags));
}

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
	struct fv_ctx *c = calloc(1, sizeof(*c));
	struct ibv_context *ctx;

	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	if (pipe2(c->async_pipe, O_CLOEXEC | O_NONBLOCK)) {
		free(c);
		return NULL;
	}
	c->dev = (struct fv_dev *)(void *)dev;
	c->vctx.sz = sizeof(c->vctx);
	c->vctx.query_port = query_port_ex;
	ctx = &c->vctx.context;
	ctx->device = dev;
	ctx->cmd_fd = -1;
	ctx->async_fd = c->async_pipe[0];
	ctx->num_comp_vectors = 1;
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->ops.post_send = fv_post_send;
	ctx->ops.post_recv = fv_post_recv;
	ctx->ops.poll_cq = fv_poll_cq;
	pthread_mutex_init(&ctx->mutex, NULL);
	LOCKED(open_ctxs++; c->next = fv_ctxs; fv_ctxs = c;
	       fv_log("ibv_open_device dev=%s", dev->name));
	return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
	struct fv_ctx *c = (struct fv_ctx *)(void *)verbs_get_ctx(ctx);

	pthread_mutex_lock(&fv_lock);
	open_ctxs--;
	for (struct fv_ctx **p = &fv_ctxs; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	fv_log("ibv_close_device dev=%s", c->dev->ibdev.name);
	pthread_mutex_unlock(&fv_lock);
	close(c->async_pipe[0]);
	close(c->async_pipe[1]);
	pthread_mutex_destroy(&ctx->mutex);
	free(c);
	return 0;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	struct fv_dev *d = fv_ctx_dev(ctx);

	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "28.99.1000");
	a->node_guid = d->node_guid;
	a->sys_image_guid = d->sys_image_guid;
	a->max_mr_size = ~0ull;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0x02c9;
	a->vendor_part_id = d->vendor_part_id;
	a->max_qp = d->max_qp;
	a->max_qp_wr = d->max_qp_wr;
	a->max_sge = 30;
	a->max_cq = 1 << 24;
	a->max_cqe = d->max_cqe;
	a->max_mr = 1 << 24;
	a->max_pd = 1 << 24;
	a->max_qp_rd_atom = 16;
	a->max_qp_init_rd_atom = 16;
	a->atomic_cap = d->atomic ? IBV_ATOMIC_HCA : IBV_ATOMIC_NONE;
	a->max_pkeys = 128;
	a->phys_port_cnt = (uint8_t)d->nports;
	LOCKED(fv_log("ibv_query_device dev=%s ports=%d", d->ibdev.name, d->nports));
	return 0;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	struct fv_dev *d = fv_ctx_dev(ctx);
	char g[64];

	if (port < 1 || port > d->nports || index < 0 || index >= FV_MAX_GIDS)
		return -1;
	LOCKED(*gid = d->ports[port - 1].gids[index].gid;	/* a test may change it */
	       fv_log("ibv_query_gid dev=%s port=%u index=%d gid=%s", d->ibdev.name, port, index,
		      fv_gid_str(gid, g, sizeof(g))));
	return 0;
}

int ibv_query_port_speed(struct ibv_context *ctx, uint32_t port, uint64_t *speed)
{
	static const int lane[] = { 25, 50, 100, 100, 140, 250, 500, 1000, 2000 };
	static const int lanes[] = { 1, 4, 8, 12, 2 };
	struct fv_dev *d = fv_ctx_dev(ctx);
	const struct fv_port *p;
	int ret = 0;

	pthread_mutex_lock(&fv_lock);
	if (!fv_conf.port_speed || port < 1 || port > (uint32_t)d->nports ||
	    d->ports[port - 1].port_speed == -2) {
		ret = EOPNOTSUPP;
	} else {
		p = &d->ports[port - 1];
		if (p->port_speed >= 0)
			*speed = (uint64_t)p->port_speed;
		else
			*speed = (uint64_t)lane[p->speed ? __builtin_ctz(p->speed) % 9 : 0] *
				 (uint64_t)lanes[p->width ? __builtin_ctz((unsigned)p->width) % 5 : 0];
	}
	fv_log("ibv_query_port_speed dev=%s port=%u ret=%d speed=%llu", d->ibdev.name, port, ret,
	       ret ? 0ull : (unsigned long long)*speed);
	pthread_mutex_unlock(&fv_lock);
	return ret;
}

/* The events a test queued (fv_ctl.c), one byte each in the pipe the async fd reads. */
int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	struct fv_ctx *c = (struct fv_ctx *)(void *)verbs_get_ctx(ctx);
	char b;
	int got = 0;

	if (read(ctx->async_fd, &b, 1) != 1) {
		errno = EAGAIN;
		return -1;
	}
	pthread_mutex_lock(&fv_lock);
	if (c->evq_n) {
		*ev = c->evq[c->evq_head];
		c->evq_head = (c->evq_head + 1) % FV_EVQ;
		c->evq_n--;
		got = 1;
		fv_log("ibv_get_async_event dev=%s event=%d port=%d", c->dev->ibdev.name,
		       ev->event_type, ev->element.port_num);
	}
	pthread_mutex_unlock(&fv_lock);
	if (!got)
		errno = EAGAIN;
	return got ? 0 : -1;
}

void ibv_ack_async_event(struct ibv_async_event *ev)
{
	(void)ev;
}

const char *ibv_event_type_str(enum ibv_event_type type)
{
	if ((int)type == FV_EVENT_DEVICE_SPEED_CHANGE)
		return "device speed change";
	switch (type) {
	case IBV_EVENT_DEVICE_FATAL: return "local catastrophic error";
	case IBV_EVENT_PORT_ACTIVE: return "port active";
	case IBV_EVENT_PORT_ERR: return "port error";
	case IBV_EVENT_GID_CHANGE: return "GID table change";
	case IBV_EVENT_LID_CHANGE: return "LID change";
	case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
	case IBV_EVENT_CQ_ERR: return "CQ error";
	default: return "async event";
	}
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	switch (status) {
	case IBV_WC_SUCCESS: return "success";
	case IBV_WC_REM_ACCESS_ERR: return "remote access error";
	case IBV_WC_LOC_PROT_ERR: return "local protection error";
	case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
	case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
	case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
	default: return "error";
	}
}

/* ---- protection domains and memory regions ----------------------------- */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = ctx;
	LOCKED(pd->handle = next_key++; fv_log("ibv_alloc_pd dev=%s pd=%u", ctx_name(ctx),
					       pd->handle));
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	LOCKED(fv_log("ibv_dealloc_pd dev=%s pd=%u", ctx_name(pd->context), pd->handle));
	free(pd);
	return 0;
}

/*
 * Where the NIC reaches the memory of a new MR. A DMA-BUF is mapped when it
 * is the fake CUDA driver's (a memfd named "fakecuda-device": test/fakecuda),
 * so data lands in its device memory; another fd (a test's made-up number)
 * has no mapping and its data is not copied. A plain address inside the
 * fake CUDA driver's device memory (what peermem registers) is reached
 * through that driver's host view (fcu_test_host, when RAIL_FAKECUDA_LIB
 * names a library this process has loaded).
 */
static void fv_mr_host(struct fv_mr *m, void *addr, size_t len, int fd, uint64_t offset)
{
	char link[64], name[128];
	ssize_t n;

	m->host = addr;
	if (fd < 0) {
		const char *lib = getenv("RAIL_FAKECUDA_LIB");
		void *h = lib && lib[0] ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
		void *(*view)(const void *) = NULL;

		if (h)
			*(void **)&view = dlsym(h, "fcu_test_host");
		if (view && view(addr))
			m->host = view(addr);
		if (h)
			dlclose(h);
		return;
	}
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, name, sizeof(name) - 1);
	if (n > 0) {
		long pg = sysconf(_SC_PAGESIZE);
		uint64_t at = offset & ~(uint64_t)(pg - 1);

		name[n] = 0;
		if (strncmp(name, "/memfd:fakecuda-device", 22))
			return;
		m->map_len = len + (size_t)(offset - at);
		m->map = mmap(NULL, m->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)at);
		if (m->map == MAP_FAILED) {
			m->map = NULL;
			return;
		}
		m->host = (char *)m->map + (offset - at);
	}
}

struct ibv_mr *fv_mr_new(const char *call, struct ibv_pd *pd, void *addr, size_t len,
			 uint64_t iova, int access, int fd, uint64_t offset, const char *extra)
{
	struct fv_mr *m;

	pthread_mutex_lock(&fv_lock);
	if (fv_ctx_dev(pd->context)->dead) {
		/* after DEVICE_FATAL the kernel refuses every verbs command (EIO), as mlx5 does */
		fv_log("%s dev=%s ret=EIO why=\"device dead (DEVICE_FATAL)\"", call,
		       ctx_name(pd->context));
		pthread_mutex_unlock(&fv_lock);
		errno = EIO;
		return NULL;
	}
	if (fd >= 0 && !fv_ctx_dev(pd->context)->dmabuf) {
		fv_log("%s dev=%s ret=EOPNOTSUPP", call, ctx_name(pd->context));
		pthread_mutex_unlock(&fv_lock);
		errno = EOPNOTSUPP;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		pthread_mutex_unlock(&fv_lock);
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.handle = next_key;
	m->mr.lkey = next_key++;
	m->mr.rkey = next_key++;
	m->access = access;
	m->iova = iova;
	fv_mr_host(m, addr, len, fd, offset);
	m->dmabuf = fd >= 0 && !m->map;
	m->next = mrs;
	mrs = m;
	m->hnext = mr_bucket[m->mr.lkey % FV_BUCKETS];
	mr_bucket[m->mr.lkey % FV_BUCKETS] = m;
	if (fd >= 0)
		fv_log("%s dev=%s offset=0x%llx len=%zu iova=0x%llx fd=%d access=0x%x%s lkey=0x%x "
		       "rkey=0x%x", call, ctx_name(pd->context), (unsigned long long)offset, len,
		       (unsigned long long)iova, fd, access, extra, m->mr.lkey, m->mr.rkey);
	else
		fv_log("%s dev=%s addr=%p len=%zu iova=0x%llx access=0x%x%s lkey=0x%x rkey=0x%x",
		       call, ctx_name(pd->context), addr, len, (unsigned long long)iova, access,
		       extra, m->mr.lkey, m->mr.rkey);
	pthread_mutex_unlock(&fv_lock);
	return &m->mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return fv_mr_new("ibv_reg_mr", pd, addr, len, (uintptr_t)addr, access, -1, 0, "");
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				unsigned int access)
{
	return fv_mr_new("ibv_reg_mr_iova2", pd, addr, len, iova, (int)access, -1, 0, "");
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
				 int fd, int access)
{
	if (fd < 0) {	/* the probe: a driver that knows DMA-BUF checks the fd */
		int dmabuf = fv_ctx_dev(pd->context)->dmabuf;

		LOCKED(fv_log("ibv_reg_dmabuf_mr dev=%s fd=%d ret=%s", ctx_name(pd->context), fd,
			      dmabuf ? "EBADF" : "EOPNOTSUPP"));
		errno = dmabuf ? EBADF : EOPNOTSUPP;
		return NULL;
	}
	return fv_mr_new("ibv_reg_dmabuf_mr", pd, NULL, len, iova, access, fd, offset, "");
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	pthread_mutex_lock(&fv_lock);
	fv_progress();	/* before the memory may go */
	fv_place_held(mr);
	for (struct fv_mr **p = &mrs; *p; p = &(*p)->next) {
		if (&(*p)->mr == mr) {
			struct fv_mr *m = *p;

			*p = m->next;
			for (struct fv_mr **h = &mr_bucket[mr->lkey % FV_BUCKETS]; *h;
			     h = &(*h)->hnext)
				if (*h == m) {
					*h = m->hnext;
					break;
				}
			fv_log("ibv_dereg_mr dev=%s lkey=0x%x", ctx_name(mr->context), mr->lkey);
			if (m->map)
				munmap(m->map, m->map_len);
			free(m);
			break;
		}
	}
	pthread_mutex_unlock(&fv_lock);
	return 0;
}

/* Under fv_lock. remote: match the rkey, else the lkey. */
struct fv_mr *fv_mr_by_key(uint32_t key, int remote)
{
	uint32_t lkey = remote ? key - 1 : key;

	for (struct fv_mr *m = mr_bucket[lkey % FV_BUCKETS]; m; m = m->hnext)
		if ((remote ? m->mr.rkey : m->mr.lkey) == key)
			return m;
	return NULL;
}

/* ---- what the process holds (fv_test_mem) -------------------------------- */

#define FV_PAGE 4096ull

static uint64_t pow2_up(uint64_t v)
{
	uint64_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

static uint64_t page_up(uint64_t v)
{
	return (v + FV_PAGE - 1) & ~(FV_PAGE - 1);
}

/*
 * A QP's send and receive queues as rdma-core's mlx5 provider sizes them
 * (providers/mlx5/verbs.c, an estimate: no doorbell record, no BlueFlame):
 * a send WQE is the control and remote-address segments (16 + 16 bytes)
 * and the larger of its data segments (16 bytes per SGE) and its inline
 * data (a 4-byte header, 16-aligned), rounded up to 64-byte basic blocks;
 * a receive WQE is 16 bytes per SGE, a power of two; each queue holds a
 * power of two of WQEs; the buffer is whole pages.
 */
static uint64_t mlx5_qp_bytes(const struct ibv_qp_cap *c)
{
	uint64_t data = 16ull * (c->max_send_sge ? c->max_send_sge : 1);
	uint64_t inl = c->max_inline_data ? (4ull + c->max_inline_data + 15) & ~15ull : 0;
	uint64_t swqe = (32 + (data > inl ? data : inl) + 63) & ~63ull;
	uint64_t rwqe = pow2_up(16ull * (c->max_recv_sge ? c->max_recv_sge : 1));
	uint64_t sq = c->max_send_wr ? pow2_up(c->max_send_wr) * swqe : 0;
	uint64_t rq = c->max_recv_wr ? pow2_up(c->max_recv_wr) * rwqe : 0;

	return page_up(sq + rq);
}

/* A CQ of cqe entries: mlx5 makes room for a power of two above cqe, 64 bytes each. */
static uint64_t mlx5_cq_bytes(int cqe)
{
	return page_up(pow2_up((uint64_t)cqe + 1) * 64);
}

long long fv_test_mem(int what)
{
	long long n = 0;

	pthread_mutex_lock(&fv_lock);
	switch (what) {
	case FV_MEM_MRS:
	case FV_MEM_MR_BYTES:
	case FV_MEM_MR_PINNED:
		for (const struct fv_mr *m = mrs; m; m = m->next) {
			uint64_t a = (uintptr_t)m->mr.addr;

			n += what == FV_MEM_MRS ? 1 : what == FV_MEM_MR_BYTES ? (long long)m->mr.length
			     : (long long)(page_up(a + m->mr.length) - (a & ~(FV_PAGE - 1)));
		}
		break;
	case FV_MEM_QPS:
	case FV_MEM_QP_BYTES:
		for (const struct fv_qp *q = qps; q; q = q->next)
			n += what == FV_MEM_QPS ? 1 : (long long)q->mem;
		break;
	case FV_MEM_CQS:
		n = cq_count;
		break;
	case FV_MEM_CQ_BYTES:
		n = cq_mem;
		break;
	default:
		n = -EINVAL;
	}
	pthread_mutex_unlock(&fv_lock);
	return n;
}

/* ---- completion queues --------------------------------------------------- */

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct fv_cq *c = calloc(1, sizeof(*c));

	(void)comp_vector;
	if (!c || cqe < 1 || cqe > fv_ctx_dev(ctx)->max_cqe) {
		free(c);
		errno = c ? EINVAL : ENOMEM;
		return NULL;
	}
	c->cap = cqe;
	c->wcs = calloc((size_t)cqe, sizeof(*c->wcs));
	if (!c->wcs) {
		free(c);
		errno = ENOMEM;
		return NULL;
	}
	c->cq.context = ctx;
	c->cq.channel = channel;
	c->cq.cq_context = cq_context;
	c->cq.cqe = cqe;
	c->mem = mlx5_cq_bytes(cqe);
	LOCKED(c->cq.handle = next_key++; cq_count++; cq_mem += (long long)c->mem;
	       fv_log("ibv_create_cq dev=%s cqe=%d cq=%u", ctx_name(ctx), cqe, c->cq.handle));
	return &c->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct fv_cq *c = (struct fv_cq *)(void *)cq;

	LOCKED(cq_count--; cq_mem -= (long long)c->mem;
	       fv_log("ibv_destroy_cq dev=%s cq=%u", ctx_name(cq->context), cq->handle));
	free(c->wcs);
	free(c);
	return 0;
}

/* Under fv_lock. An overflow is logged and the entry dropped (real CQs go to error). */
void fv_cq_push(struct fv_cq *c, const struct ibv_wc *wc)
{
	if (c->count == c->cap) {
		fv_log("cq_overflow cq=%u", c->cq.handle);
		return;
	}
	c->wcs[(c->head + c->count++) % c->cap] = *wc;
}

/* ---- queue pairs -------------------------------------------------------- */

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct fv_dev *d = fv_ctx_dev(pd->context);
	struct fv_qp *q;
	int dead;

	LOCKED(dead = d->dead);
	if (dead) {	/* a dead HCA takes no new object */
		LOCKED(fv_log("ibv_create_qp dev=%s ret=EIO why=\"device dead (DEVICE_FATAL)\"",
			      d->ibdev.name));
		errno = EIO;
		return NULL;
	}
	if (a->qp_type != IBV_QPT_RC || a->cap.max_inline_data > (uint32_t)d->max_inline ||
	    a->cap.max_send_wr > (uint32_t)d->max_qp_wr ||
	    a->cap.max_recv_wr > (uint32_t)d->max_qp_wr) {
		LOCKED(fv_log("ibv_create_qp dev=%s type=%d max_send_wr=%u max_recv_wr=%u "
			      "max_inline=%u ret=EINVAL", d->ibdev.name, a->qp_type,
			      a->cap.max_send_wr, a->cap.max_recv_wr, a->cap.max_inline_data));
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (q)
		q->rq = calloc((size_t)a->cap.max_recv_wr + 1, sizeof(*q->rq));
	if (!q || !q->rq) {
		if (q)
			free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->dev = d;
	q->sq_tail = &q->sq;
	q->rcap = (int)a->cap.max_recv_wr + 1;
	q->sq_sig_all = a->sq_sig_all;
	q->max_inline = a->cap.max_inline_data;
	q->mem = mlx5_qp_bytes(&a->cap);
	q->state = IBV_QPS_RESET;
	q->qp.context = pd->context;
	q->qp.qp_context = a->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = a->send_cq;
	q->qp.recv_cq = a->recv_cq;
	q->qp.qp_type = a->qp_type;
	q->qp.state = IBV_QPS_RESET;
	pthread_mutex_lock(&fv_lock);
	q->qp.qp_num = next_qpn++;
	q->qp.handle = q->qp.qp_num;
	q->next = qps;
	qps = q;
	q->hnext = qp_bucket[q->qp.qp_num % FV_BUCKETS];
	qp_bucket[q->qp.qp_num % FV_BUCKETS] = q;
	fv_log("ibv_create_qp dev=%s qpn=0x%x type=RC max_send_wr=%u max_recv_wr=%u "
	       "max_send_sge=%u max_recv_sge=%u max_inline=%u sq_sig_all=%d", d->ibdev.name,
	       q->qp.qp_num, a->cap.max_send_wr, a->cap.max_recv_wr, a->cap.max_send_sge,
	       a->cap.max_recv_sge, a->cap.max_inline_data, a->sq_sig_all);
	pthread_mutex_unlock(&fv_lock);
	return &q->qp;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct fv_qp *q = (struct fv_qp *)(void *)qp;

	pthread_mutex_lock(&fv_lock);
	fv_progress();
	fv_hold_drop(q);
	for (struct fv_qp **p = &qps; *p; p = &(*p)->next) {
		if (*p == q) {
			*p = q->next;
			break;
		}
	}
	for (struct fv_qp **h = &qp_bucket[qp->qp_num % FV_BUCKETS]; *h; h = &(*h)->hnext)
		if (*h == q) {
			*h = q->hnext;
			break;
		}
	fv_log("ibv_destroy_qp dev=%s qpn=0x%x", q->dev->ibdev.name, qp->qp_num);
	pthread_mutex_unlock(&fv_lock);
	free(q->rq);
	free(q);
	return 0;
}

/* Under fv_lock. */
struct fv_qp *fv_qp_list(void)
{
	return qps;
}

/* Under fv_lock. */
struct fv_qp *fv_qp_by_num(uint32_t qpn)
{
	for (struct fv_qp *q = qp_bucket[qpn % FV_BUCKETS]; q; q = q->hnext)
		if (q->qp.qp_num == qpn)
			return q;
	return NULL;
}
