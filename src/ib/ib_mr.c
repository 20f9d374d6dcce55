/*
 * nccl-net-rail: memory registration through a per-HCA cache.
 *
 * Entries cover whole pages, are reference-counted and sorted by start
 * address; a request inside an existing entry with enough access rights
 * takes a reference (NCCL's regIsGlobal promise: registering sub-ranges of
 * a registered buffer is cheap). One mutex per HCA: regMr runs on NCCL's
 * service thread while test runs on the progress thread, and comms share
 * the HCA. Access rights: local write and remote write always (a buffer
 * may be a receive target), remote read only where a flush will read it;
 * PCIe relaxed ordering on every kind of registration, as NCCL (reg.cc),
 * unless the caller asks for strict ordering (RAIL_IB_MR_STRICT: the RMA
 * backend's windows, which carry signals); an entry serves only requests
 * with the same ordering. RAIL_IB_MR_OWN (the RMA backend's windows) gets an
 * entry of its own that serves no other request, so deregistering it
 * revokes its rkey even where another window shares its pages.
 * DMA-BUF on a Data Direct device goes through mlx5dv_reg_dmabuf_mr (its
 * entries serve only such requests: with NCCL_IB_DATA_DIRECT=2 the PCIe
 * and the Data Direct device of a port share the HCA's cache).
 * An entry records the range the NIC registered (its iova range), which for
 * DMA-BUF may start inside the first page (reg_range).
 *
 * deregMr runs on NCCL's service thread while isend/irecv/test may run on
 * the progress thread for the same comm, so it touches nothing the data
 * path owns: it releases the cache entries (the MRs go when unreferenced, so
 * the NIC can no longer reach memory given back) and pushes the handle onto
 * the comm's dead_mhs stack. The progress thread, at its next call
 * (rail_ib_comm_check), looks for requests still using a dead handle (an
 * abort): if there is one, it stops the QPs itself and the comm fails with
 * a WARN naming deregMr; then it frees the handles. No lock on the data
 * path: one atomic load per call.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ib/ib.h"
#include "log.h"
#include "param.h"
#include "rail.h"

struct rail_ib_mr_ent {
	uintptr_t start;
	size_t len;
	int access;
	int refs;
	int dmabuf;
	int data_direct;	/* DMA-BUF through mlx5 Data Direct: serves only such requests */
	int own;		/* RAIL_IB_MR_OWN: serves no other request */
	struct ibv_mr *mr;
};

/* Any thread may register (RMA ranks of one process): every first caller stores the same value. */
static size_t page_size(void)
{
	static _Atomic size_t pg;
	size_t v = atomic_load_explicit(&pg, memory_order_relaxed);

	if (!v) {
		long sys = sysconf(_SC_PAGESIZE);

		v = sys > 0 ? (size_t)sys : 4096;
		atomic_store_explicit(&pg, v, memory_order_relaxed);
	}
	return v;
}

/* An entry covering [s, e) with these rights (sorted by start). */
static struct rail_ib_mr_ent *cache_find(struct rail_ib_hca *hca, uintptr_t s, uintptr_t e,
					 int access, int dd)
{
	for (int i = 0; i < hca->nmrs; i++) {
		struct rail_ib_mr_ent *m = hca->mrs[i];

		if (m->start > s)
			break;
		if (!m->own && m->start + m->len >= e && (m->access & access) == access &&
		    !((m->access ^ access) & IBV_ACCESS_RELAXED_ORDERING) && m->data_direct == dd)
			return m;
	}
	return NULL;
}

static int cache_insert(struct rail_ib_hca *hca, struct rail_ib_mr_ent *ent)
{
	int i;

	if (hca->nmrs == hca->mrs_cap) {
		int cap = hca->mrs_cap ? hca->mrs_cap * 2 : 32;
		void *p = realloc(hca->mrs, (size_t)cap * sizeof(*hca->mrs));

		if (!p)
			return -ENOMEM;
		hca->mrs = p;
		hca->mrs_cap = cap;
	}
	for (i = hca->nmrs; i > 0 && hca->mrs[i - 1]->start > ent->start; i--)
		hca->mrs[i] = hca->mrs[i - 1];
	hca->mrs[i] = ent;
	hca->nmrs++;
	return 0;
}

static void cache_remove(struct rail_ib_hca *hca, struct rail_ib_mr_ent *ent)
{
	for (int i = 0; i < hca->nmrs; i++) {
		if (hca->mrs[i] != ent)
			continue;
		memmove(&hca->mrs[i], &hca->mrs[i + 1],
			(size_t)(hca->nmrs - i - 1) * sizeof(*hca->mrs));
		hca->nmrs--;
		return;
	}
}

static const char *reg_hint(int err, int gpu)
{
	if (err == ENOMEM || err == EAGAIN)
		return "raise the locked-memory limit (ulimit -l unlimited) or free registrations";
	if (err == EFAULT && gpu)
		return "GPU memory needs nvidia-peermem loaded or DMA-BUF support";
	if (err == EFAULT)
		return "the buffer is not mapped memory of this process";
	return "check dmesg for the driver's reason";
}

/*
 * NCCL's rule (init.cc): relaxed ordering when NCCL_IB_PCI_RELAXED_ORDERING
 * is 1 or 2 and libibverbs has ibv_reg_mr_iova2 (IBVERBS_1.8, the API that
 * knows the flag), for host, peermem and DMA-BUF registrations alike.
 */
static int relaxed_ordering(void)
{
	return rail_ibv.reg_mr_iova2 && rail_param_int(RAIL_P_IB_PCI_RELAXED_ORDERING);
}

static struct ibv_mr *reg_dmabuf(struct rail_ib_hca *hca, uint64_t offset, size_t len,
				 uint64_t iova, int fd, int access, int dd)
{
	if (dd)
		return rail_mlx5dv.reg_dmabuf_mr(hca->pd, offset, len, iova, fd, access,
						 RAIL_MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT);
	return rail_ibv.reg_dmabuf_mr(hca->pd, offset, len, iova, fd, access);
}

/*
 * Register the page range [*s, *s + *len) with the HCA's PD (relaxed
 * ordering when access has it); NULL with errno on failure. A DMA-BUF whose offset is smaller than the buffer's
 * distance from its page start cannot be mapped from the page start: the
 * range then starts at the buffer, and *s, *len say so. dd: a DMA-BUF for a
 * Data Direct device (NCCL reg.cc: mlx5dv_reg_dmabuf_mr with
 * MLX5DV_REG_DMABUF_ACCESS_DATA_DIRECT).
 */
static struct ibv_mr *reg_range(struct rail_ib_hca *hca, uintptr_t *s, size_t *len, int access,
				int fd, uint64_t offset, uintptr_t addr, int dd)
{
	if (fd >= 0) {
		uintptr_t delta = addr - *s;

		if (offset >= delta)
			return reg_dmabuf(hca, offset - delta, *len, *s, fd, access, dd);
		*len -= delta;
		*s = addr;
		return reg_dmabuf(hca, offset, *len, addr, fd, access, dd);
	}
	if (access & IBV_ACCESS_RELAXED_ORDERING)
		return rail_ibv.reg_mr_iova2(hca->pd, (void *)*s, *len, *s, (unsigned)access);
	return rail_ibv.reg_mr(hca->pd, (void *)*s, *len, access);
}

static int cache_get(const struct rail_ib_dev *d, void *addr, size_t size, int access, int fd,
		     uint64_t offset, int own, const char *peer, struct rail_ib_mr_ent **out)
{
	struct rail_ib_hca *hca = d->hca;
	uintptr_t s = (uintptr_t)addr & ~(uintptr_t)(page_size() - 1);
	uintptr_t e = RAIL_ALIGN_UP((uintptr_t)addr + RAIL_MAX(size, 1), page_size());
	uintptr_t a = (uintptr_t)addr;
	size_t len = e - s;
	struct rail_ib_mr_ent *ent;
	int dd = fd >= 0 && d->data_direct, err = 0;

	pthread_mutex_lock(&hca->mr_lock);
	/* the bytes asked for: an entry may start inside the first page */
	ent = own ? NULL : cache_find(hca, a, a + RAIL_MAX(size, 1), access, dd);
	if (ent) {
		ent->refs++;
		goto out;
	}
	ent = calloc(1, sizeof(*ent));
	if (!ent) {
		err = -ENOMEM;
		goto out;
	}
	ent->mr = reg_range(hca, &s, &len, access, fd, offset, a, dd);
	if (!ent->mr) {
		err = -(errno ? errno : EIO);
		RAIL_WARN("%s(%p, %zu bytes%s) on %s:%d for a connection to peer %s failed: %s; %s",
			  dd ? "mlx5dv_reg_dmabuf_mr" : fd >= 0 ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr",
			  addr, size, dd ? ", DMA-BUF, Data Direct" : fd >= 0 ? ", DMA-BUF" : "",
			  hca->name, d->port, peer, RAIL_ERRSTR(err),
			  reg_hint(-err, fd >= 0 || (access & IBV_ACCESS_REMOTE_READ)));
		free(ent);
		goto out;
	}
	ent->start = s;		/* what was registered */
	ent->len = len;
	ent->access = access;
	ent->refs = 1;
	ent->dmabuf = fd >= 0;
	ent->data_direct = dd;
	ent->own = own;
	err = cache_insert(hca, ent);
	if (err) {
		rail_ibv.dereg_mr(ent->mr);
		free(ent);
	}
out:
	if (!err)
		*out = ent;
	pthread_mutex_unlock(&hca->mr_lock);
	return err;
}

static void cache_put(struct rail_ib_hca *hca, struct rail_ib_mr_ent *ent)
{
	pthread_mutex_lock(&hca->mr_lock);
	if (--ent->refs == 0) {
		int ret;

		cache_remove(hca, ent);
		ret = rail_ibv.dereg_mr(ent->mr);
		if (ret)
			RAIL_WARN("ibv_dereg_mr(%#lx, %zu bytes) on %s failed: %s", (unsigned long)ent->start,
				  ent->len, hca->name, RAIL_ERRSTR(-rail_verbs_err(ret)));
		free(ent);
	}
	pthread_mutex_unlock(&hca->mr_lock);
}

void rail_ib_mr_cache_fini(struct rail_ib_hca *hca)
{
	pthread_mutex_lock(&hca->mr_lock);
	if (hca->nmrs)
		RAIL_INFO(RAIL_LOG_NET, "%s: %d registrations still cached at finalize; releasing",
			  hca->name, hca->nmrs);
	for (int i = 0; i < hca->nmrs; i++) {
		rail_ibv.dereg_mr(hca->mrs[i]->mr);
		free(hca->mrs[i]);
	}
	free(hca->mrs);
	hca->mrs = NULL;
	hca->nmrs = hca->mrs_cap = 0;
	pthread_mutex_unlock(&hca->mr_lock);
}

int rail_ib_mr_register(struct rail_ib_dev *const *devs, int n, void *addr, size_t len,
			int type, int fd, uint64_t offset, const char *peer,
			struct rail_ib_mh **out)
{
	struct rail_ib_mh *mh = calloc(1, sizeof(*mh));
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	int err = 0;

	if (!mh)
		return -ENOMEM;
	mh->magic = RAIL_IB_MH_MAGIC;
	mh->type = type;
	mh->gpu = (type & RAIL_PTR_CUDA) || fd >= 0;
	if (type & RAIL_IB_MR_NEEDS_READ)
		access |= IBV_ACCESS_REMOTE_READ;
	if (type & RAIL_IB_MR_NEEDS_ATOMIC)
		access |= IBV_ACCESS_REMOTE_ATOMIC;
	if (!(type & RAIL_IB_MR_STRICT) && relaxed_ordering())
		access |= IBV_ACCESS_RELAXED_ORDERING;
	/*
	 * What a move needs to register it on another HCA (rail_ib_mh_rehome).
	 * NCCL closes a DMA-BUF fd after regMrDmaBuf: with failover, keep a dup.
	 */
	mh->addr = addr;
	mh->len = len;
	mh->access = access;
	mh->offset = offset;
	mh->dmabuf = fd >= 0;
	mh->fd = fd >= 0 && rail_param_int(RAIL_P_FAILOVER) ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
	for (int i = 0; i < n; i++) {
		mh->ndevs = i + 1;
		if (!devs[i])
			continue;	/* a dead HCA: registered where the member moves */
		err = cache_get(devs[i], addr, len, access, fd, offset, !!(type & RAIL_IB_MR_OWN),
				peer, &mh->ent[i]);
		if (err)
			break;
		mh->hca[i] = devs[i]->hca;
		mh->lkey[i] = mh->ent[i]->mr->lkey;
		mh->rkey[i] = mh->ent[i]->mr->rkey;
	}
	if (err) {
		rail_ib_mr_deregister(mh);
		return err;
	}
	*out = mh;
	return 0;
}

static void mr_release(struct rail_ib_mh *mh)
{
	for (int i = 0; i < mh->ndevs; i++)
		if (mh->ent[i])
			cache_put(mh->hca[i], mh->ent[i]);
	mh->ndevs = 0;
	if (mh->fd >= 0)
		close(mh->fd);
	mh->fd = -1;
}

int rail_ib_mh_rehome(struct rail_ib_mh *mh, int m, struct rail_ib_dev *d, const char *peer)
{
	struct rail_ib_mr_ent *ent;
	int err;

	if (m >= mh->ndevs || mh->hca[m] == d->hca)
		return 0;
	if (mh->dmabuf && mh->fd < 0) {
		RAIL_WARN("registering %p (%zu bytes) on %s:%d for the connection to peer %s after a "
			  "move: its DMA-BUF fd was not kept (NCCL_RAIL_FAILOVER was 0 when it was "
			  "registered)", mh->addr, mh->len, d->hca->name, d->port, peer);
		return -EBADF;
	}
	err = cache_get(d, mh->addr, mh->len, mh->access, mh->fd, mh->offset,
			!!(mh->type & RAIL_IB_MR_OWN), peer, &ent);
	if (err)
		return err;
	if (mh->ent[m])
		cache_put(mh->hca[m], mh->ent[m]);
	mh->hca[m] = d->hca;
	mh->ent[m] = ent;
	mh->lkey[m] = ent->mr->lkey;
	mh->rkey[m] = ent->mr->rkey;
	return 0;
}

int rail_ib_comm_mh_rehome(const struct rail_ib_comm *c, struct rail_ib_mh *mh)
{
	int err = 0, dead = 0;

	for (int m = 0; m < c->ndevs && !err; m++) {
		const struct rail_ib_dev *d = c->res[m].dev;

		if (atomic_load(&d->hca->fatal) && mh->hca[m] != d->hca) {
			dead = 1;	/* the comm has yet to move off it: registered there after */
			continue;
		}
		err = rail_ib_mh_rehome(mh, m, c->res[m].dev, c->peer);
	}
	if (!err && !dead)
		mh->gen = atomic_load_explicit(&c->res_gen, memory_order_relaxed);
	return err;
}

void rail_ib_mr_deregister(struct rail_ib_mh *mh)
{
	mr_release(mh);
	mh->magic = 0;
	free(mh);
}

/* ---- the transport ops -------------------------------------------------- */

static int reg_common(struct rail_comm *comm, void *data, size_t size, int type, int fd,
		      uint64_t offset, void **mhandle)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;
	struct rail_ib_dev *devs[RAIL_MAX_VDEV_DEVS];
	struct rail_ib_hca *hcas[RAIL_MAX_VDEV_DEVS];
	struct rail_ib_mh *mh;
	/*
	 * NCCL's service thread, beside the data calls and a move's rebuild: the
	 * generation first, then the devices (reg_dev, stored by the rebuild
	 * before it bumps res_gen), so a registration on a device a move is
	 * leaving carries an old generation and re-homes at its first use
	 * (rail_ib_mh_keys). A member whose HCA died (DEVICE_FATAL) before the
	 * comm moved gets no registration there: the same first use registers it
	 * where the member is then.
	 */
	uint32_t gen = atomic_load_explicit(&c->res_gen, memory_order_acquire);
	int gpu = (type & RAIL_PTR_CUDA) || fd >= 0, dead = 0, err;

	for (int i = 0; i < c->ndevs; i++) {
		const struct rail_ib_ladder *l;

		devs[i] = atomic_load(&c->reg_dev[i]);	/* a move rehomes it at its first use */
		hcas[i] = devs[i]->hca;
		if (atomic_load(&hcas[i]->fatal)) {
			devs[i] = NULL;
			dead = 1;
			continue;
		}
		l = &hcas[i]->ladder;
		if (type & RAIL_PTR_CUDA && fd < 0 && !l->peermem) {
			RAIL_WARN("regMr(%p, %zu bytes, CUDA) on %s for peer %s: GPU memory needs "
				  "peermem, which is absent (%s); NCCL should have used DMA-BUF "
				  "or host buffers", data, size, hcas[i]->name, c->peer, l->peermem_why);
			return -EOPNOTSUPP;
		}
		if (fd >= 0 && !l->dmabuf) {
			RAIL_WARN("regMrDmaBuf(%p, %zu bytes, fd %d) on %s for peer %s: DMA-BUF is "
				  "unusable here (%s)", data, size, fd, hcas[i]->name, c->peer,
				  l->dmabuf_why);
			return -EOPNOTSUPP;
		}
	}
	/* Only a receive comm's buffers are read back by a flush. */
	if (comm->kind == RAIL_COMM_RECV && c->flush && (gpu || c->flush_host))
		type |= RAIL_IB_MR_NEEDS_READ;
	err = rail_ib_mr_register(devs, c->ndevs, data, size, type, fd, offset, c->peer, &mh);
	if (err)
		return err;
	mh->gpu = gpu || (c->flush_host && comm->kind == RAIL_COMM_RECV);
	mh->gen = dead ? gen - 1 : gen;
	*mhandle = mh;
	return 0;
}

int rail_ib_reg_mr(struct rail_comm *comm, void *data, size_t size, int type, void **mhandle)
{
	return reg_common(comm, data, size, type, -1, 0, mhandle);
}

int rail_ib_reg_mr_dmabuf(struct rail_comm *comm, void *data, size_t size, int type,
			  uint64_t offset, int fd, void **mhandle)
{
	if (fd < 0)
		return reg_common(comm, data, size, type, -1, 0, mhandle);
	return reg_common(comm, data, size, type | RAIL_PTR_CUDA, fd, offset, mhandle);
}

int rail_ib_dereg_mr(struct rail_comm *comm, void *mhandle)
{
	struct rail_ib_comm *c = (struct rail_ib_comm *)comm;
	struct rail_ib_mh *mh = mhandle, *head;

	if (!mh)
		return 0;
	if (mh->magic != RAIL_IB_MH_MAGIC) {
		RAIL_WARN("deregMr: %p is not a registration of the verbs transport", mhandle);
		return -EINVAL;
	}
	/* Service thread: release the MRs, leave the requests to the progress thread. */
	mh->magic = 0;
	mr_release(mh);
	head = atomic_load_explicit(&c->dead_mhs, memory_order_relaxed);
	do {
		mh->dead_next = head;
	} while (!atomic_compare_exchange_weak_explicit(&c->dead_mhs, &head, mh,
							memory_order_release,
							memory_order_relaxed));
	return 0;
}
