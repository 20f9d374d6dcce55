/*
 * nccl-net-rail: the verbs transport's devices: discovery (every active
 * IB/Ethernet port of every device, filtered by NCCL_IB_HCA; mlx5 Data
 * Direct), speed, properties, NIC fusion. The ops table, which also starts
 * and stops what the upper layers keep per HCA (async thread,
 * registrations): ib_ops.c.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ib/ib.h"
#include "ifaces.h"
#include "log.h"
#include "matchlist.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"
#include "topo/topo.h"

static struct {
	pthread_mutex_t lock;
	int nhca;
	struct rail_ib_hca *hcas[RAIL_IB_MAX_HCAS];
	int ndev;
	struct rail_ib_dev devs[RAIL_IB_MAX_DEVS];
	atomic_int nvdev;
	struct rail_ib_vdev vdevs[RAIL_IB_MAX_VDEVS];
	struct rail_iface oob;
	struct rail_matchlist hca_list;
	int verbs_loaded;
} ib = { .lock = PTHREAD_MUTEX_INITIALIZER };

int rail_ib_ndevs_phys(void)
{
	return ib.ndev;
}

int rail_ib_dev_num(const struct rail_ib_dev *d)
{
	return d >= ib.devs && d < ib.devs + ib.ndev ? (int)(d - ib.devs) : -1;
}

struct rail_ib_dev *rail_ib_dev_get(int dev)
{
	return dev >= 0 && dev < ib.ndev ? &ib.devs[dev] : NULL;
}

const struct rail_ib_vdev *rail_ib_vdev_get(int vdev)
{
	return vdev >= 0 && vdev < atomic_load(&ib.nvdev) ? &ib.vdevs[vdev] : NULL;
}

int rail_ib_hca_count(void)
{
	return ib.nhca;
}

struct rail_ib_hca *rail_ib_hca_get(int i)
{
	return i >= 0 && i < ib.nhca ? ib.hcas[i] : NULL;
}

const union rail_sockaddr *rail_ib_oob_addr(void)
{
	return &ib.oob.addr;
}

const char *rail_link_layer_str(int ll)
{
	switch (ll) {
	case IBV_LINK_LAYER_INFINIBAND: return "IB";
	case IBV_LINK_LAYER_ETHERNET: return "RoCE";
	case IBV_LINK_LAYER_UNSPECIFIED: return "IB (unspecified)";
	default: return "unknown";
	}
}

/* NCCL's tables: Mbps per lane for the first set bit of active_speed, lanes per width bit. */
int rail_ib_port_speed(uint32_t active_speed, int active_width)
{
	static const int speeds[] = { 2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000,
				      200000 };
	static const int widths[] = { 1, 4, 8, 12, 2 };
	int s = active_speed ? __builtin_ctz(active_speed) : 0;
	int w = active_width ? __builtin_ctz((unsigned)active_width) : 0;

	if (s >= (int)RAIL_ARRAY_SIZE(speeds))
		s = (int)RAIL_ARRAY_SIZE(speeds) - 1;
	if (w >= (int)RAIL_ARRAY_SIZE(widths))
		w = 0;
	return speeds[s] * widths[w];
}

/*
 * NCCL's rule (init.cc): ibv_query_port_speed (100 Mb/s units; a RoCE LAG
 * answers its aggregate) where the library has it and NCCL_IB_QUERY_PORT_SPEED
 * allows, else the table on active_speed_ex (XDR and faster), else on the
 * 8-bit active_speed.
 */
static int port_mbps(struct ibv_context *ctx, int port, const struct rail_port_attr *a)
{
	uint32_t ex = rail_port_active_speed_ex(a);
	uint64_t q = 0;

	if (rail_param_int(RAIL_P_IB_QUERY_PORT_SPEED) && rail_ibv.query_port_speed &&
	    rail_ibv.query_port_speed(ctx, (uint32_t)port, &q) == 0 && q > 0 &&
	    q <= INT32_MAX / 100)
		return (int)(q * 100);
	return rail_ib_port_speed(ex ? ex : a->attr.active_speed, a->attr.active_width);
}

int rail_ib_port_speed_read(struct ibv_context *ctx, int port, int *mbps, int *state)
{
	struct rail_port_attr a;
	int ret;

	memset(&a, 0, sizeof(a));
	ret = rail_ibv.query_port(ctx, (uint8_t)port, &a);
	if (ret)
		return -rail_verbs_err(ret);
	*state = a.attr.state;
	*mbps = port_mbps(ctx, port, &a);
	return 0;
}

int rail_ib_mtu_bytes(enum ibv_mtu mtu)
{
	return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << mtu : 0;
}

const char *rail_ib_port_state_str(int s)
{
	static const char *const names[] = { "NOP", "DOWN", "INIT", "ARMED", "ACTIVE",
					     "ACTIVE_DEFER" };

	return s >= 0 && s < (int)RAIL_ARRAY_SIZE(names) ? names[s] : "unknown";
}

int rail_ib_port_check(struct ibv_context *ctx, const char *hca, int port,
		       struct rail_ib_port_info *out, const struct rail_match_entry **entry)
{
	int ret;

	memset(out, 0, sizeof(*out));
	rail_strlcpy(out->hca, hca, sizeof(out->hca));
	out->port = port;
	ret = rail_ibv.query_port(ctx, (uint8_t)port, &out->attr_ext);
	if (ret) {
		snprintf(out->why, sizeof(out->why), "ibv_query_port failed: %s",
			 RAIL_ERRSTR(-rail_verbs_err(ret)));
		return -rail_verbs_err(ret);
	}
	out->speed = port_mbps(ctx, port, &out->attr_ext);
	if (out->attr.state != IBV_PORT_ACTIVE) {
		snprintf(out->why, sizeof(out->why), "port state %s, not ACTIVE",
			 rail_ib_port_state_str(out->attr.state));
		return 0;
	}
	if (out->attr.link_layer != IBV_LINK_LAYER_INFINIBAND &&
	    out->attr.link_layer != IBV_LINK_LAYER_ETHERNET &&
	    out->attr.link_layer != IBV_LINK_LAYER_UNSPECIFIED) {
		snprintf(out->why, sizeof(out->why), "link layer %d is neither IB nor Ethernet",
			 out->attr.link_layer);
		return 0;
	}
	if (!rail_matchlist_match(&ib.hca_list, hca, port, entry)) {
		snprintf(out->why, sizeof(out->why), "not selected by NCCL_IB_HCA=%s",
			 rail_param_str(RAIL_P_IB_HCA));
		return 0;
	}
	out->kept = 1;
	return 0;
}

/* Largest inline size an RC QP accepts on this HCA (0 if none). */
static int probe_inline(struct rail_ib_hca *hca)
{
	static const int tries[] = { 256, 128, 64, 0 };
	struct ibv_cq *cq = rail_ibv.create_cq(hca->ctx, 2, NULL, NULL, 0);
	int got = 0;

	if (!cq)
		return 0;
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(tries); i++) {
		struct ibv_qp_init_attr a = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
				 .max_recv_sge = 1, .max_inline_data = (uint32_t)tries[i] },
		};
		struct ibv_qp *qp = rail_ibv.create_qp(hca->pd, &a);

		if (qp) {
			got = (int)a.cap.max_inline_data;
			rail_ibv.destroy_qp(qp);
			break;
		}
	}
	rail_ibv.destroy_cq(cq);
	return got;
}

/* Its async thread and registration cache are gone (ib_ops.c ib_fini), or never were. */
static void hca_close(struct rail_ib_hca *hca)
{
	if (hca->pd)
		rail_ibv.dealloc_pd(hca->pd);
	if (hca->ctx)
		rail_ibv.close_device(hca->ctx);
	pthread_mutex_destroy(&hca->mr_lock);
	free(hca);
}

static struct rail_ib_hca *hca_open(struct ibv_device *d, char *why, size_t why_len)
{
	struct rail_ib_hca *hca = calloc(1, sizeof(*hca));
	int ret;

	if (!hca)
		return NULL;
	pthread_mutex_init(&hca->mr_lock, NULL);
	hca->async_wake[0] = hca->async_wake[1] = -1;
	rail_strlcpy(hca->name, rail_ibv.get_device_name(d), sizeof(hca->name));
	hca->ctx = rail_ibv.open_device(d);
	if (!hca->ctx) {
		snprintf(why, why_len, "%s: ibv_open_device failed: %s", hca->name,
			 RAIL_ERRSTR(-errno));
		goto fail;
	}
	ret = rail_ibv.query_device(hca->ctx, &hca->attr);
	if (ret) {
		snprintf(why, why_len, "%s: ibv_query_device failed: %s", hca->name,
			 RAIL_ERRSTR(-rail_verbs_err(ret)));
		goto fail;
	}
	hca->pd = rail_ibv.alloc_pd(hca->ctx);
	if (!hca->pd) {
		snprintf(why, why_len, "%s: ibv_alloc_pd failed: %s", hca->name,
			 RAIL_ERRSTR(-errno));
		goto fail;
	}
	hca->max_inline = probe_inline(hca);
	return hca;
fail:
	hca_close(hca);
	return NULL;
}

/* NCCL's pciPath: "...:1b:00.1" -> "...:1b:00.0"; merging VFs, "...:1b:05.2" -> "...:1b:00.0". */
static void pci_path_merged(const char *path, char *out, size_t len)
{
	size_t n = strlen(path);

	rail_strlcpy(out, path, len);
	if (n < 4 || n >= len)
		return;
	out[n - 1] = '0';
	if (rail_param_int(RAIL_P_IB_MERGE_VFS))
		out[n - 3] = out[n - 4] = '0';
}

static void nccl_pci_path(struct rail_ib_dev *dev)
{
	pci_path_merged(dev->pci_path, dev->nccl_pci_path, sizeof(dev->nccl_pci_path));
}

/*
 * NCCL's port: ibv port + earlier devices on the same (merged) PCI path.
 * NCCL compares paths ignoring those digits (init.cc ncclIbMatchVfPath),
 * which also applies to a Data Direct path, reported unshortened.
 */
static void nccl_ports(void)
{
	char a[PATH_MAX], b[PATH_MAX];

	for (int i = 0; i < ib.ndev; i++) {
		struct rail_ib_dev *d = &ib.devs[i];

		d->nccl_port = d->port;
		if (!d->pci_path[0])
			continue;
		pci_path_merged(d->pci_path, a, sizeof(a));
		for (int j = 0; j < i; j++) {
			pci_path_merged(ib.devs[j].pci_path, b, sizeof(b));
			d->nccl_port += !strcmp(a, b);
		}
	}
}

/*
 * v12 planeId of a fused NIC, as NCCL 2.30.7 (init.cc ncclIbGetPlaneIndex,
 * ncclIbMakeVDeviceInternal): bit 14 marks it fused, and each member sets
 * its plane's bit: bit 0 for no plane, then one bit per distinct plane in
 * device order (so the same on identical nodes), at most 12.
 * NCCL refuses to start its IB transport past that, or for a plane that
 * has bit 14 set (it would read as a fused NIC); so do we.
 */
#define PLANE_FUSED (1 << 14)
#define PLANE_BITS 13	/* bit 0: no plane; 1..12: the planes */

static int plane_bits(char *why, size_t why_len)
{
	int planes[PLANE_BITS] = { -1 }, n = 1;

	for (int i = 0; i < ib.ndev; i++) {
		struct rail_ib_dev *d = &ib.devs[i];
		const char *dma = d->data_direct ? "_dma" : "";
		int b = 0;

		while (b < n && planes[b] != d->plane)
			b++;
		if (b == n && n == PLANE_BITS)
			snprintf(why, why_len, "NCCL_IB_HCA puts %s%s:%d on a 13th distinct plane "
				 "(%d); a fused NIC's planeId has room for 12", d->hca->name, dma,
				 d->port, d->plane);
		else if (b == n && (d->plane & PLANE_FUSED))
			snprintf(why, why_len, "NCCL_IB_HCA gives %s%s:%d plane %d, which has bit 14 "
				 "set, the mark of a fused NIC; planes go up to 16383", d->hca->name,
				 dma, d->port, d->plane);
		else {
			if (b == n)
				planes[n++] = d->plane;
			d->plane_bit = b;
			continue;
		}
		RAIL_WARN("%s (NCCL refuses the same): the verbs transport is not used", why);
		return -EINVAL;
	}
	return 0;
}

static int vdev_plane(int n, const int *devs)
{
	int plane = PLANE_FUSED;

	if (n == 1)
		return ib.devs[devs[0]].plane;
	for (int i = 0; i < n; i++)
		plane |= 1 << ib.devs[devs[i]].plane_bit;
	return plane;
}

/*
 * NCCL's sort key (init.cc ncclIbCompareDevs, misc/utils.cc pciPathToInt64):
 * the last component of the device's full PCI path ("0000:1b:00.1") read as
 * one hex number, ':' and '.' skipped, up to the first other character.
 * Returns 1 with the key, 0 when the device has no PCI path (NCCL sorts
 * those last).
 */
static int pci_order_key(struct ibv_device *d, uint64_t *key)
{
	char path[256], real[PATH_MAX];
	const char *s;
	size_t n;
	int digits = 0;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device",
		 rail_ibv.get_device_name(d));
	if (rail_sysfs_realpath(path, real, sizeof(real)))
		return 0;
	n = strlen(real);
	if (n > 1 && real[n - 1] == '/')
		real[--n] = '\0';
	s = strrchr(real, '/');
	*key = 0;
	for (s = s ? s + 1 : real; *s && digits < 16; s++) {
		int v = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 :
			*s >= 'A' && *s <= 'F' ? *s - 'A' + 10 : -1;

		if (*s == ':' || *s == '.')
			continue;
		if (v < 0)
			break;
		*key = *key << 4 | (uint64_t)v;
		digits++;
	}
	return 1;
}

/*
 * The library's device list in NCCL's device order: with
 * NCCL_IB_DEVICE_PCI_ORDER=1 by pci_order_key, devices without a PCI path
 * last; 0: as listed. Every port (and Data Direct entry) of a device has
 * the device's key, so ordering the devices before their ports are scanned
 * orders the entries as NCCL's sort of its entries does; equal keys keep
 * the library's order (NCCL's qsort leaves it unspecified). A copy to
 * free(), or NULL (no memory: the library's order).
 */
struct ibv_device **rail_ib_dev_order(struct ibv_device **list, int n)
{
	struct ibv_device **out = calloc((size_t)n + 1, sizeof(*out));
	uint64_t *key = calloc((size_t)n + 1, sizeof(*key));
	int *has = calloc((size_t)n + 1, sizeof(*has));

	if (!out || !key || !has) {
		free(out);
		out = NULL;
		goto done;
	}
	for (int i = 0; i < n; i++) {
		int j = i, h = 0;
		uint64_t k = 0;

		if (rail_param_int(RAIL_P_IB_DEVICE_PCI_ORDER))
			h = pci_order_key(list[i], &k);
		/* Stable insertion: move past every entry that sorts after this one. */
		for (; j > 0 && h && (!has[j - 1] || key[j - 1] > k); j--) {
			out[j] = out[j - 1];
			key[j] = key[j - 1];
			has[j] = has[j - 1];
		}
		out[j] = list[i];
		key[j] = k;
		has[j] = h;
	}
	for (int i = 0; i < n; i++) {
		if (out[i] != list[i]) {
			RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "devices numbered in PCI address "
				  "order as NCCL does, not libibverbs' (NCCL_IB_DEVICE_PCI_ORDER=0 "
				  "keeps libibverbs' order)");
			break;
		}
	}
done:
	free(key);
	free(has);
	return out;
}

static void dev_fill(struct rail_ib_dev *dev, struct rail_ib_hca *hca,
		     const struct rail_ib_port_info *pi, const struct rail_match_entry *entry)
{
	char path[256];
	int ar;

	memset(dev, 0, sizeof(*dev));
	dev->hca = hca;
	dev->port = pi->port;
	dev->link_layer = pi->attr.link_layer == IBV_LINK_LAYER_UNSPECIFIED
				  ? IBV_LINK_LAYER_INFINIBAND : pi->attr.link_layer;
	dev->mtu = pi->attr.active_mtu;
	dev->lid = pi->attr.lid;
	dev->port_flags = pi->attr.flags;
	atomic_store(&dev->speed, pi->speed);
	dev->gid_tbl_len = pi->attr.gid_tbl_len;
	dev->guid = hca->attr.sys_image_guid;
	/* NCCL (init.cc): on for InfiniBand by default, else as the variable says. */
	ar = (int)rail_param_int(RAIL_P_IB_ADAPTIVE_ROUTING);
	dev->ar = ar >= 0 ? ar : dev->link_layer == IBV_LINK_LAYER_INFINIBAND;
	dev->rail = entry ? entry->rail : -1;
	dev->plane = entry ? entry->plane : -1;
	/* NCCL_IB_HCA's :rail:plane win; otherwise the rail comes from the topology. */
	if (dev->rail < 0) {
		int rail = -1, plane = -1;

		if (rail_topo_rail_of(hca->name, pi->port, &rail, &plane) == 0) {
			dev->rail = rail;
			if (dev->plane < 0)
				dev->plane = plane;
		}
	}
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device", hca->name);
	if (rail_sysfs_realpath(path, dev->pci_path, sizeof(dev->pci_path)))
		dev->pci_path[0] = '\0';
	nccl_pci_path(dev);
}

/*
 * InfiniBand, as NCCL (connect.cc): GID index NCCL_IB_ROUTABLE_FLID_GID_INDEX
 * when the port has it and it carries a FLID (routed IB), else 0. The GID
 * goes to the peer, which adds a GRH when the port requires one or the
 * subnets differ (rail_ib_qp_rtr_rts).
 */
static void gid_ib(const struct rail_ib_dev *dev, struct rail_ib_gid_choice *out)
{
	int idx = (int)rail_param_int(RAIL_P_IB_ROUTABLE_FLID_GID_INDEX);
	union ibv_gid gid;

	memset(out, 0, sizeof(*out));
	if (idx > 0 && idx < dev->gid_tbl_len &&
	    rail_ibv.query_gid(dev->hca->ctx, (uint8_t)dev->port, idx, &gid) == 0 &&
	    rail_ib_gid_flid(gid.raw) != 0) {
		out->index = idx;
		memcpy(out->raw, gid.raw, 16);
		snprintf(out->reason, sizeof(out->reason), "InfiniBand: LID %u, routable GID index "
			 "%d (FLID 0x%x)", dev->lid, idx, rail_ib_gid_flid(gid.raw));
		return;
	}
	if (rail_ibv.query_gid(dev->hca->ctx, (uint8_t)dev->port, 0, &gid) == 0)
		memcpy(out->raw, gid.raw, 16);
	snprintf(out->reason, sizeof(out->reason), "InfiniBand: LID %u%s", dev->lid,
		 dev->port_flags & IBV_QPF_GRH_REQUIRED ? ", GRH required" : "");
}

/*
 * The GID a connection on dev uses now, by the rules of ib_gid.h (RoCE) or
 * gid_ib (InfiniBand), from the table as it is at this moment: init, every
 * connect and accept, and the async thread on GID_CHANGE call it, so an
 * address changed since init is seen (NCCL also resolves it per
 * connection, connect.cc). 0, or -ENOENT with out->reason saying why.
 */
int rail_ib_dev_gid_resolve(const struct rail_ib_dev *dev, struct rail_ib_gid_choice *out)
{
	if (dev->link_layer != IBV_LINK_LAYER_ETHERNET) {
		gid_ib(dev, out);
		return 0;
	}
	return rail_ib_gid_select(dev->hca->name, dev->port, dev->gid_tbl_len, out);
}

/* GID at init: a RoCE port without a usable one is not used. */
static int dev_gid(struct rail_ib_dev *dev, char *why, size_t why_len)
{
	char g[64];
	int err = rail_ib_dev_gid_resolve(dev, &dev->gid);

	if (err) {
		snprintf(why, why_len, "%s:%d: %s", dev->hca->name, dev->port, dev->gid.reason);
		return err;
	}
	if (dev->link_layer == IBV_LINK_LAYER_ETHERNET)
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s:%d: RoCE GID index %d %s (%s)",
			  dev->hca->name, dev->port, dev->gid.index,
			  rail_ib_gid_str(dev->gid.raw, g, sizeof(g)), dev->gid.reason);
	return 0;
}

/*
 * mlx5 Data Direct, NCCL's rule (init.cc): with NCCL_IB_DATA_DIRECT > 0, an
 * mlx5 device (mlx5dv_is_supported) whose mlx5dv_reg_dmabuf_mr(fd -1) does
 * not answer "not supported" and for which mlx5dv_get_data_direct_sysfs_path
 * names a function is exposed on that function ("/sys" + the path); 2 keeps
 * the PCIe entry too. Decided once per HCA, at its first selected port, and
 * logged in one line. NCCL asks for the path after the DMA-BUF probe and
 * fails its init on an error other than ENODEV; we ask first (no probe for
 * the usual device without one) and use such a device on its PCIe path.
 */
static int dd_dmabuf_capable(struct rail_ib_hca *hca, char *why, size_t why_len)
{
	struct ibv_mr *mr;
	int err;

	errno = 0;
	mr = rail_mlx5dv.reg_dmabuf_mr(hca->pd, 0, 0, 0, -1, 0, 0);
	err = errno;
	if (mr)
		rail_ibv.dereg_mr(mr);
	if (!mr && (err == EOPNOTSUPP || err == EPROTONOSUPPORT)) {
		snprintf(why, why_len, "mlx5dv_reg_dmabuf_mr(fd -1) returned %s: the driver "
			 "cannot import DMA-BUF", RAIL_ERRSTR(-err));
		return 0;
	}
	return 1;
}

static void dd_decide(struct rail_ib_hca *hca, struct ibv_device *d)
{
	int mode = (int)rail_param_int(RAIL_P_IB_DATA_DIRECT);
	char path[PATH_MAX - 8], why[160];
	int err;

	hca->data_direct = 0;
	if (!mode || !rail_mlx5dv_loaded())
		return;		/* the load said why, once */
	if (!rail_mlx5dv.is_supported(d)) {
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s: PCIe path (mlx5 Data Direct: not an "
			  "mlx5 device)", hca->name);
		return;
	}
	err = rail_mlx5dv.get_data_direct_sysfs_path(hca->ctx, path, sizeof(path));
	if (err == ENODEV) {
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s: PCIe path (mlx5 Data Direct: no Data "
			  "Direct DMA function, mlx5dv_get_data_direct_sysfs_path: ENODEV)",
			  hca->name);
		return;
	}
	if (err) {
		RAIL_WARN("mlx5dv_get_data_direct_sysfs_path on %s failed: %s; using the device on "
			  "its PCIe path, without Data Direct (NCCL_IB_DATA_DIRECT=0 skips the "
			  "query)", hca->name, RAIL_ERRSTR(err > 0 ? -err : -EIO));
		return;
	}
	if (!dd_dmabuf_capable(hca, why, sizeof(why))) {
		RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s: PCIe path (mlx5 Data Direct function "
			  "/sys%s not used: %s)", hca->name, path, why);
		return;
	}
	snprintf(hca->dd_path, sizeof(hca->dd_path), "/sys%s", path);
	hca->data_direct = 1;
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s: mlx5 Data Direct DMA function %s: %s; "
		  "DMA-BUF registered through it, forceFlush=1 (NCCL_IB_DATA_DIRECT=%d)", hca->name,
		  hca->dd_path, mode == 2 ? "exposed on it as a second device (_dma) beside the "
		  "PCIe one" : "exposed on it instead of the PCIe path", mode);
}

/* The dev just filled on a Data Direct HCA: 1 or 2 entries (ib.ndev not yet counted). */
static int dd_expose(struct rail_ib_dev *dev)
{
	struct rail_ib_dev *dd = dev;

	if (rail_param_int(RAIL_P_IB_DATA_DIRECT) == 2) {
		if (ib.ndev + 1 >= RAIL_IB_MAX_DEVS) {
			RAIL_WARN("%s:%d: no room for the Data Direct device (%d devices at most); "
				  "only the PCIe one is used", dev->hca->name, dev->port,
				  RAIL_IB_MAX_DEVS);
			return 1;
		}
		dd = dev + 1;
		memcpy(dd, dev, sizeof(*dd));
	}
	rail_strlcpy(dd->pci_path, dev->hca->dd_path, sizeof(dd->pci_path));
	rail_strlcpy(dd->nccl_pci_path, dev->hca->dd_path, sizeof(dd->nccl_pci_path));
	dd->data_direct = 1;
	return dd == dev ? 1 : 2;
}

static void append_why(char *why, size_t why_len, const char *what)
{
	size_t l = strlen(why);

	if (l + 3 < why_len)
		snprintf(why + l, why_len - l, "%s%s", l ? "; " : "", what);
}

/* Keep the usable ports of one HCA. Returns the number kept. */
static int hca_scan_ports(struct rail_ib_hca *hca, struct ibv_device *ibdev, char *why,
			  size_t why_len)
{
	int first = ib.ndev, kept = 0, dd_done = 0;

	for (int p = 1; p <= hca->attr.phys_port_cnt && ib.ndev < RAIL_IB_MAX_DEVS; p++) {
		const struct rail_match_entry *entry = NULL;
		struct rail_ib_port_info pi;
		struct rail_ib_dev *dev = &ib.devs[ib.ndev];
		char msg[320];

		rail_ib_port_check(hca->ctx, hca->name, p, &pi, &entry);
		if (!pi.kept) {
			snprintf(msg, sizeof(msg), "%s:%d %s", hca->name, p, pi.why);
			append_why(why, why_len, msg);
			continue;
		}
		if (!dd_done++)
			dd_decide(hca, ibdev);
		dev_fill(dev, hca, &pi, entry);
		if (dev_gid(dev, msg, sizeof(msg))) {
			RAIL_WARN("%s; the port is not used", msg);
			append_why(why, why_len, msg);
			continue;
		}
		ib.ndev += hca->data_direct ? dd_expose(dev) : 1;
		kept++;
	}
	/* NCCL names a Data Direct entry DEV_dma. */
	for (int i = first; i < ib.ndev; i++) {
		struct rail_ib_dev *d = &ib.devs[i];
		const char *dma = d->data_direct ? "_dma" : "";

		if (kept > 1)
			snprintf(d->name, sizeof(d->name), "%.48s%s:%d", hca->name, dma, d->port);
		else
			snprintf(d->name, sizeof(d->name), "%.52s%s", hca->name, dma);
	}
	return kept;
}

static void hca_setup(struct ibv_device *d, char *why, size_t why_len)
{
	char msg[256] = "";
	struct rail_ib_hca *hca;

	if (ib.nhca == RAIL_IB_MAX_HCAS)
		return;
	hca = hca_open(d, msg, sizeof(msg));
	if (!hca) {
		RAIL_WARN("%s; skipping this device", msg);
		append_why(why, why_len, msg);
		return;
	}
	if (hca_scan_ports(hca, d, why, why_len) == 0) {
		hca_close(hca);
		return;
	}
	rail_ib_ladder_decide(hca, &hca->ladder);
	ib.hcas[ib.nhca++] = hca;
}

void rail_ib_hca_filter_load(void)
{
	const char *spec = rail_param_str(RAIL_P_IB_HCA);
	char why[160];

	memset(&ib.hca_list, 0, sizeof(ib.hca_list));
	if (spec[0] && rail_matchlist_parse(spec, 4, &ib.hca_list, why, sizeof(why))) {
		RAIL_WARN("NCCL_IB_HCA=%s is not valid (%s); using every device", spec, why);
		memset(&ib.hca_list, 0, sizeof(ib.hca_list));
	}
}

static int find_oob(char *why, size_t why_len)
{
	char rule[160] = "";
	int n = rail_ifaces_find(&ib.oob, 1, rule, sizeof(rule));

	if (n <= 0) {
		snprintf(why, why_len, "no network interface for the out-of-band connection "
			 "(%s); set NCCL_SOCKET_IFNAME", rule);
		return -ENODEV;
	}
	return 0;
}

/* The handshake interface is d's own: its address is d's RoCE GID, or it is d's netdev. */
static int oob_on_port(const struct rail_ib_dev *d)
{
	const union rail_sockaddr *a = &ib.oob.addr;
	static const uint8_t v4mapped[12] = { [10] = 0xff, [11] = 0xff };
	char path[320], name[64];

	if (d->link_layer == IBV_LINK_LAYER_ETHERNET) {
		if (a->sa.sa_family == AF_INET && !memcmp(d->gid.raw, v4mapped, 12) &&
		    !memcmp(d->gid.raw + 12, &a->sin.sin_addr, 4))
			return 1;
		if (a->sa.sa_family == AF_INET6 && !memcmp(d->gid.raw, &a->sin6.sin6_addr, 16))
			return 1;
		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/ndevs/%d",
			 d->hca->name, d->port, d->gid.index);
		return rail_sysfs_read(path, name, sizeof(name)) > 0 && !strcmp(name, ib.oob.name);
	}
	/* IPoIB: the interface sits under the HCA's PCI function, dev_port = port - 1 */
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/net/%s/dev_port",
		 d->hca->name, ib.oob.name);
	if (rail_sysfs_read(path, name, sizeof(name)) <= 0)
		return 0;
	return atoi(name) == d->port - 1;
}

/*
 * Failover agrees on a move over the handshake sockets: on the interface of
 * one of the ports, they fail with that port's link, when they are needed.
 * An INFO line, not a WARN: a configuration to improve, not an error (and
 * a common one, where the RoCE interface is the only network).
 */
static void oob_fate_check(void)
{
	if (!rail_param_int(RAIL_P_FAILOVER) || ib.ndev < 2)
		return;
	for (int i = 0; i < ib.ndev; i++) {
		const struct rail_ib_dev *d = &ib.devs[i];

		if (!oob_on_port(d))
			continue;
		RAIL_INFO(RAIL_LOG_INIT, "the handshake sockets (out-of-band, %s %s) run over the interface of "
			  "%s:%d: if that port's link fails, its connections cannot agree on a move "
			  "to another port (NCCL_RAIL_FAILOVER) and fail once the sockets' keepalive "
			  "gives up (NCCL_RAIL_PEER_TIMEOUT=%lld s), as may the other connections of "
			  "this process whose sockets route through it. Put them on an interface no "
			  "RDMA port uses: NCCL_SOCKET_IFNAME=<management interface>",
			  ib.oob.name, RAIL_ADDRSTR(&ib.oob.addr), d->hca->name, d->port,
			  (long long)rail_param_int(RAIL_P_PEER_TIMEOUT));
		return;
	}
}

int rail_ib_devices_init(char *why, size_t why_len)
{
	struct ibv_device **list, **order;
	int n = 0;

	if (rail_param_int(RAIL_P_IB_DISABLE)) {
		snprintf(why, why_len, "NCCL_IB_DISABLE=1");
		return 0;
	}
	if (rail_verbs_load(why, why_len))
		return 0;
	ib.verbs_loaded = 1;
	if (find_oob(why, why_len))
		return 0;
	rail_ib_hca_filter_load();
	list = rail_ibv.get_device_list(&n);
	if (!list || n == 0) {
		int err = errno;

		snprintf(why, why_len, "no RDMA device (ibv_get_device_list: %s%s)",
			 list ? "empty" : RAIL_ERRSTR(-err),
			 !list && err == ENOSYS ? ": the kernel has no RDMA stack loaded; "
			 "modprobe ib_uverbs and the NIC's driver" : "");
		if (list)
			rail_ibv.free_device_list(list);
		return 0;
	}
	why[0] = '\0';
	order = rail_ib_dev_order(list, n);
	for (int i = 0; i < n; i++)
		hca_setup(order ? order[i] : list[i], why, why_len);
	free(order);
	rail_ibv.free_device_list(list);
	if (ib.ndev == 0) {
		if (!why[0])
			snprintf(why, why_len, "no usable RDMA port");
		return 0;
	}
	nccl_ports();
	if (plane_bits(why, why_len))
		return 0;
	oob_fate_check();
	for (int i = 0; i < ib.ndev; i++) {
		ib.vdevs[i].ndevs = 1;
		ib.vdevs[i].devs[0] = i;
		ib.vdevs[i].plane = ib.devs[i].plane;
		rail_strlcpy(ib.vdevs[i].name, ib.devs[i].name, sizeof(ib.vdevs[i].name));
	}
	atomic_store(&ib.nvdev, ib.ndev);
	rail_verbs_fault_arm(rail_param_str(RAIL_P_IB_FAULT));
	return ib.ndev;
}

void rail_ib_devices_fini(void)
{
	for (int i = 0; i < ib.nhca; i++)
		hca_close(ib.hcas[i]);
	ib.nhca = 0;
	ib.ndev = 0;
	atomic_store(&ib.nvdev, 0);
	if (ib.verbs_loaded) {
		rail_verbs_fault_clear();
		rail_verbs_unload();
		ib.verbs_loaded = 0;
	}
}

int rail_ib_ndevs(void)
{
	return atomic_load(&ib.nvdev);
}

static void props_fill_member(struct rail_props *props, const struct rail_ib_dev *d, int first)
{
	int ptr = rail_ib_ladder_ptr_support(&d->hca->ladder);

	if (first) {
		props->pci_path = d->nccl_pci_path[0] ? d->nccl_pci_path : NULL;
		props->guid = d->guid;
		props->port = d->nccl_port;
		props->ptr_support = ptr;
		props->max_comms = d->hca->attr.max_qp;
		props->rail_id = d->rail;
	} else {
		props->ptr_support &= ptr;
		props->max_comms = RAIL_MIN(props->max_comms, d->hca->attr.max_qp);
		if (props->rail_id != d->rail)
			props->rail_id = -1;
	}
	props->speed += atomic_load(&d->speed);	/* the async thread may change it */
	/* NCCL (init.cc): forceFlush for Data Direct; of a fused NIC, any member's. */
	props->force_flush |= d->data_direct;
}

int rail_ib_get_props(int vdev, struct rail_props *props)
{
	const struct rail_ib_vdev *v = rail_ib_vdev_get(vdev);

	if (!v)
		return -EINVAL;
	props->name = v->name;
	props->speed = 0;
	props->force_flush = 0;
	for (int i = 0; i < v->ndevs; i++)
		props_fill_member(props, &ib.devs[v->devs[i]], i == 0);
	props->plane_id = v->plane;
	props->reg_is_global = 1;
	props->latency = 0;
	props->max_recvs = RAIL_MAX_RECVS;
	props->vdev_ndevs = v->ndevs;
	memcpy(props->vdev_devs, v->devs, sizeof(v->devs));
	props->max_p2p_bytes = RAIL_MAX_MSG_BYTES;
	props->max_coll_bytes = 512ull << 20;
	props->max_multi_request_size = 1;
	return 0;
}

void rail_ib_describe(char *buf, size_t len)
{
	size_t off = 0;

	for (int i = 0; i < ib.ndev && off < len; i++) {
		const struct rail_ib_dev *d = &ib.devs[i];
		int w = snprintf(buf + off, len - off, "%s[%d]%s%s:%d/%s/%dMbps/%s", i ? " " : "",
				 i, d->hca->name, d->data_direct ? "_dma" : "", d->port,
				 rail_link_layer_str(d->link_layer),
				 atomic_load(&d->speed), d->hca->ladder.summary);

		off += w > 0 ? (size_t)w : 0;
	}
	if (off < len)
		snprintf(buf + off, len - off, "; OOB %s:%s", ib.oob.name,
			 RAIL_ADDRSTR(&ib.oob.addr));
}

static int vdev_check(int n, const int *devs)
{
	if (n > 1 && !rail_param_int(RAIL_P_IB_MERGE_NICS)) {
		RAIL_WARN("makeVDevice: fusing %d devices refused: NCCL_IB_MERGE_NICS=0", n);
		return -EINVAL;
	}
	for (int i = 0; i < n; i++) {
		if (devs[i] < 0 || devs[i] >= ib.ndev) {
			RAIL_WARN("makeVDevice: %d is not a physical device (0..%d)", devs[i],
				  ib.ndev - 1);
			return -EINVAL;
		}
		for (int j = 0; j < i; j++) {
			if (devs[j] == devs[i]) {
				RAIL_WARN("makeVDevice: device %d given twice", devs[i]);
				return -EINVAL;
			}
		}
		if (ib.devs[devs[i]].link_layer != ib.devs[devs[0]].link_layer) {
			RAIL_WARN("makeVDevice: %s is %s but %s is %s: cannot fuse different link "
				  "layers", ib.devs[devs[i]].name,
				  rail_link_layer_str(ib.devs[devs[i]].link_layer),
				  ib.devs[devs[0]].name,
				  rail_link_layer_str(ib.devs[devs[0]].link_layer));
			return -EINVAL;
		}
	}
	return 0;
}

int rail_ib_make_vdevice(int n, const int *devs, int *vdev)
{
	struct rail_ib_vdev *v;
	size_t off = 0;
	int idx, err;

	if (n < 1 || n > RAIL_MAX_VDEV_DEVS)
		return -EINVAL;
	pthread_mutex_lock(&ib.lock);
	err = vdev_check(n, devs);
	idx = atomic_load(&ib.nvdev);
	if (!err && idx == RAIL_IB_MAX_VDEVS) {
		RAIL_WARN("makeVDevice: already %d virtual devices", idx);
		err = -ENOSPC;
	}
	if (err)
		goto out;
	v = &ib.vdevs[idx];
	memset(v, 0, sizeof(*v));
	v->ndevs = n;
	for (int i = 0; i < n; i++) {
		char part[RAIL_IB_NAME_MAX + 2];
		int w = snprintf(part, sizeof(part), "%s%s", i ? "+" : "", ib.devs[devs[i]].name);

		rail_strlcpy(v->name + off, part, sizeof(v->name) - off);
		off = RAIL_MIN(sizeof(v->name) - 1, off + (size_t)(w > 0 ? w : 0));
		v->devs[i] = devs[i];
	}
	v->plane = vdev_plane(n, devs);
	atomic_store(&ib.nvdev, idx + 1);
	RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "virtual device %d = %s (%d devices fused, "
		  "planeId %d)", idx, v->name, n, v->plane);
	*vdev = idx;
out:
	pthread_mutex_unlock(&ib.lock);
	return err;
}
