/*
 * nccl-net-rail: reading the topology from sysfs (only through sysfs.h):
 * GPUs from /sys/bus/pci/devices, RDMA devices and their ports from
 * /sys/class/infiniband, netdevs from /sys/class/net, NUMA nodes from
 * /sys/devices/system/node. Then the distance matrix and the choice.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rail.h"
#include "sysfs.h"
#include "topo/topo_internal.h"

#define MAX_DEVICES 1024

struct name_list {
	int n;
	char (*names)[RAIL_TOPO_NAME_LEN];
};

static int collect_name(const char *name, void *arg)
{
	struct name_list *l = arg;

	if (l->n == MAX_DEVICES)
		return 0;
	rail_strlcpy(l->names[l->n++], name, RAIL_TOPO_NAME_LEN);
	return 0;
}

/* Entries of a sysfs directory; an absent directory is an empty list. */
static int list_dir(const char *dir, struct name_list *l)
{
	int err;

	l->n = 0;
	l->names = calloc(MAX_DEVICES, sizeof(*l->names));
	if (!l->names)
		return -ENOMEM;
	err = rail_sysfs_list(dir, collect_name, l);
	if (err == -ENOENT || err == -ENOTDIR)
		err = 0;
	return err;
}

void rail_topo_add_warn(struct rail_topo *t, const char *fmt, ...)
{
	char(*w)[RAIL_TOPO_REASON_LEN] = realloc(t->warn, (size_t)(t->nwarn + 1) * sizeof(*w));
	va_list ap;

	if (!w)
		return;
	t->warn = w;
	va_start(ap, fmt);
	vsnprintf(t->warn[t->nwarn++], RAIL_TOPO_REASON_LEN, fmt, ap);
	va_end(ap);
}

static int read_numa(const char *dev_path)
{
	char p[RAIL_TOPO_PATH_LEN + 16];
	long v;

	snprintf(p, sizeof(p), "%s/numa_node", dev_path);
	return rail_sysfs_read_long(p, &v) == 0 && v >= 0 ? (int)v : -1;
}

static unsigned read_hex_attr(const char *dev_path, const char *attr)
{
	char p[RAIL_TOPO_PATH_LEN + 32];
	unsigned long v;

	snprintf(p, sizeof(p), "%s/%s", dev_path, attr);
	return rail_sysfs_read_hex(p, &v) == 0 ? (unsigned)v : 0;
}

/* realpath of link, cut after its PCI function; bdf gets that function. */
static int pci_of_link(const char *link, char *path, size_t len, char *bdf, size_t bdf_len)
{
	char real[RAIL_TOPO_PATH_LEN];
	const char *base;
	int err = rail_sysfs_realpath(link, real, sizeof(real));

	if (err)
		return err;
	err = rail_topo_trim_to_pci(real);
	if (err)
		return err;
	if (strlen(real) >= len)
		return -ENAMETOOLONG;
	base = strrchr(real, '/');
	rail_strlcpy(bdf, base ? base + 1 : real, bdf_len);
	rail_strlcpy(path, real, len);
	return 0;
}

/* ---- GPUs -------------------------------------------------------------- */

static int in_list(const char *list, const char *bdf)
{
	char buf[1024], norm[RAIL_TOPO_BDF_LEN], *save = NULL;

	if (!list)
		return 0;
	rail_strlcpy(buf, list, sizeof(buf));
	for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save))
		if (!rail_topo_norm_bdf(tok, norm, sizeof(norm)) && !strcmp(norm, bdf))
			return 1;
	return 0;
}

static int add_gpu(struct rail_topo *t, const char *bdf, int nvidia)
{
	struct rail_topo_gpu *g = &t->gpus[t->ngpus];
	char link[128];
	int err;

	snprintf(link, sizeof(link), "/sys/bus/pci/devices/%s", bdf);
	memset(g, 0, sizeof(*g));
	err = pci_of_link(link, g->pci_path, sizeof(g->pci_path), g->bdf, sizeof(g->bdf));
	if (err)
		return err;
	g->numa = read_numa(g->pci_path);
	g->vendor = read_hex_attr(g->pci_path, "vendor");
	g->device = read_hex_attr(g->pci_path, "device");
	g->pci_class = read_hex_attr(g->pci_path, "class");
	g->nvidia = nvidia;
	t->ngpus++;
	return 0;
}

static int check_extra_gpus(const char *extra)
{
	char buf[1024], norm[RAIL_TOPO_BDF_LEN], link[128], *save = NULL;
	int bad = 0;

	if (!extra)
		return 0;
	rail_strlcpy(buf, extra, sizeof(buf));
	for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		if (rail_topo_norm_bdf(tok, norm, sizeof(norm))) {
			RAIL_WARN("accelerator \"%s\" is not a PCI address (expected dddd:bb:dd.f)",
				  tok);
			bad = -EINVAL;
			continue;
		}
		snprintf(link, sizeof(link), "/sys/bus/pci/devices/%s", norm);
		if (!rail_sysfs_exists(link)) {
			RAIL_WARN("accelerator %s: no such PCI device under %s/sys/bus/pci/devices",
				  norm, rail_sysfs_root());
			bad = -ENOENT;
		}
	}
	return bad;
}

static int scan_gpus(struct rail_topo *t, const char *extra)
{
	struct name_list l;
	int err = list_dir("/sys/bus/pci/devices", &l);

	if (!err)
		err = check_extra_gpus(extra);
	if (!err && l.n)
		t->gpus = calloc((size_t)l.n, sizeof(*t->gpus));
	if (!err && l.n && !t->gpus)
		err = -ENOMEM;
	for (int i = 0; !err && i < l.n; i++) {
		char p[128], bdf[RAIL_TOPO_BDF_LEN];
		unsigned long vendor = 0, cls = 0;
		int nvidia;

		if (rail_topo_norm_bdf(l.names[i], bdf, sizeof(bdf)))
			continue;
		snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/vendor", l.names[i]);
		rail_sysfs_read_hex(p, &vendor);
		snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/class", l.names[i]);
		rail_sysfs_read_hex(p, &cls);
		/* 0x0300xx VGA, 0x0302xx 3D controller; not NVSwitch (0x0680xx). */
		nvidia = vendor == 0x10de && ((cls >> 8) == 0x0300 || (cls >> 8) == 0x0302);
		if (nvidia || in_list(extra, bdf)) {
			int e = add_gpu(t, l.names[i], nvidia);

			if (e && e != -ENOENT)
				err = e;
		}
	}
	free(l.names);
	return err;
}

/* ---- RDMA devices ------------------------------------------------------ */

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/* "400 Gb/sec (4X NDR)" -> 400000 */
static int parse_rate(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || !(v > 0))	/* also NaN */
		return 0;
	while (*end == ' ')
		end++;
	if (strncmp(end, "Mb", 2))
		v *= 1000.0;
	return v >= (double)INT_MAX ? INT_MAX : (int)v;	/* a rate no int holds (fuzz_sysfs) */
}

/* The netdev of an RDMA port: gid_attrs/ndevs/0 (RoCE), else device/net/ by dev_port. */
static void port_netdev(const char *dev, struct rail_topo_port *p, int nports)
{
	char path[256], buf[RAIL_TOPO_NAME_LEN];
	struct name_list l;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/ndevs/0", dev,
		 p->port);
	if (rail_sysfs_read(path, buf, sizeof(buf)) > 0) {
		rail_strlcpy(p->netdev, buf, sizeof(p->netdev));
		return;
	}
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/net", dev);
	if (list_dir(path, &l))
		goto out;
	for (int i = 0; i < l.n; i++) {
		long dev_port = 0;

		snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/net/%s/dev_port", dev,
			 l.names[i]);
		if (l.n == 1 || nports == 1 ||
		    (rail_sysfs_read_long(path, &dev_port) == 0 && dev_port == p->port - 1)) {
			rail_strlcpy(p->netdev, l.names[i], sizeof(p->netdev));
			break;
		}
	}
out:
	free(l.names);
}

static void scan_port(const char *dev, struct rail_topo_port *p)
{
	char path[256], buf[64];

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/state", dev, p->port);
	if (rail_sysfs_read(path, buf, sizeof(buf)) > 0)
		p->state = atoi(buf);
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/phys_state", dev, p->port);
	if (rail_sysfs_read(path, buf, sizeof(buf)) > 0)
		p->phys_state = atoi(buf);
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/link_layer", dev, p->port);
	if (rail_sysfs_read(path, buf, sizeof(buf)) > 0)
		rail_strlcpy(p->link_layer, buf, sizeof(p->link_layer));
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/rate", dev, p->port);
	if (rail_sysfs_read(path, buf, sizeof(buf)) > 0)
		p->rate_mbps = parse_rate(buf);
}

static int scan_ports(struct rail_topo_nic *nic)
{
	char dir[128];
	struct name_list l;
	int nums[RAIL_TOPO_MAX_PORTS], n = 0, err;

	snprintf(dir, sizeof(dir), "/sys/class/infiniband/%s/ports", nic->name);
	err = list_dir(dir, &l);
	for (int i = 0; !err && i < l.n && n < RAIL_TOPO_MAX_PORTS; i++) {
		char *end;
		long v = strtol(l.names[i], &end, 10);

		if (*end == '\0' && v > 0 && v < 256)
			nums[n++] = (int)v;
	}
	free(l.names);
	if (err)
		return err;
	qsort(nums, (size_t)n, sizeof(int), cmp_int);
	for (int i = 0; i < n; i++) {
		nic->ports[i].port = nums[i];
		scan_port(nic->name, &nic->ports[i]);
	}
	for (int i = 0; i < n; i++)
		port_netdev(nic->name, &nic->ports[i], n);
	nic->nports = n;
	return 0;
}

static void scan_nic_pci(struct rail_topo_nic *nic)
{
	char link[128], real[RAIL_TOPO_PATH_LEN], p[RAIL_TOPO_PATH_LEN + 16];
	const char *base;

	nic->numa = -1;
	snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device", nic->name);
	if (pci_of_link(link, nic->pci_path, sizeof(nic->pci_path), nic->bdf, sizeof(nic->bdf)))
		return; /* rxe, siw: no PCI function */
	nic->numa = read_numa(nic->pci_path);
	nic->vendor = read_hex_attr(nic->pci_path, "vendor");
	nic->device = read_hex_attr(nic->pci_path, "device");
	snprintf(p, sizeof(p), "%s/physfn", nic->pci_path);
	if (rail_sysfs_exists(p)) {
		nic->is_vf = 1;
		if (rail_sysfs_realpath(p, real, sizeof(real)) == 0 &&
		    (base = strrchr(real, '/')) != NULL)
			rail_strlcpy(nic->pf_bdf, base + 1, sizeof(nic->pf_bdf));
	}
}

static int cmp_nic(const void *a, const void *b)
{
	return rail_topo_natcmp(((const struct rail_topo_nic *)a)->name,
				((const struct rail_topo_nic *)b)->name);
}

static int scan_nics(struct rail_topo *t)
{
	struct name_list l;
	int err = list_dir("/sys/class/infiniband", &l);

	if (!err && l.n && !(t->nics = calloc((size_t)l.n, sizeof(*t->nics))))
		err = -ENOMEM;
	for (int i = 0; !err && i < l.n; i++) {
		struct rail_topo_nic *nic = &t->nics[t->nnics];

		rail_strlcpy(nic->name, l.names[i], sizeof(nic->name));
		scan_nic_pci(nic);
		err = scan_ports(nic);
		if (err == -ENOENT) /* a device without ports/ is no use */
			err = 0;
		else if (!err)
			t->nnics++;
	}
	free(l.names);
	if (!err && t->nnics)
		qsort(t->nics, (size_t)t->nnics, sizeof(*t->nics), cmp_nic);
	return err;
}

/* ---- netdevs and NUMA -------------------------------------------------- */

static void netdev_rdma(struct rail_topo *t, struct rail_topo_netdev *nd)
{
	for (int i = 0; i < t->nnics; i++)
		for (int p = 0; p < t->nics[i].nports; p++)
			if (!strcmp(t->nics[i].ports[p].netdev, nd->name)) {
				rail_strlcpy(nd->ibdev, t->nics[i].name, sizeof(nd->ibdev));
				nd->ibport = t->nics[i].ports[p].port;
				return;
			}
}

static int cmp_netdev(const void *a, const void *b)
{
	return rail_topo_natcmp(((const struct rail_topo_netdev *)a)->name,
				((const struct rail_topo_netdev *)b)->name);
}

static int scan_netdevs(struct rail_topo *t)
{
	struct name_list l;
	int err = list_dir("/sys/class/net", &l);

	if (!err && l.n && !(t->netdevs = calloc((size_t)l.n, sizeof(*t->netdevs))))
		err = -ENOMEM;
	for (int i = 0; !err && i < l.n; i++) {
		struct rail_topo_netdev *nd = &t->netdevs[t->nnetdevs++];
		char p[256];
		long speed;

		rail_strlcpy(nd->name, l.names[i], sizeof(nd->name));
		nd->numa = -1;
		snprintf(p, sizeof(p), "/sys/class/net/%s/device", nd->name);
		if (pci_of_link(p, nd->pci_path, sizeof(nd->pci_path), nd->bdf, sizeof(nd->bdf)) ==
		    0)
			nd->numa = read_numa(nd->pci_path);
		snprintf(p, sizeof(p), "/sys/class/net/%s/speed", nd->name);
		nd->speed_mbps = rail_sysfs_read_long(p, &speed) == 0 && speed > 0 ? (int)speed : -1;
		snprintf(p, sizeof(p), "/sys/class/net/%s/operstate", nd->name);
		if (rail_sysfs_read(p, nd->operstate, sizeof(nd->operstate)) < 0)
			nd->operstate[0] = '\0';
		netdev_rdma(t, nd);
	}
	free(l.names);
	if (!err && t->nnetdevs)
		qsort(t->netdevs, (size_t)t->nnetdevs, sizeof(*t->netdevs), cmp_netdev);
	return err;
}

static int count_numa(const char *name, void *arg)
{
	int *n = arg;

	if (!strncmp(name, "node", 4) && isdigit((unsigned char)name[4]))
		(*n)++;
	return 0;
}

static int cmp_gpu(const void *a, const void *b)
{
	return strcmp(((const struct rail_topo_gpu *)a)->bdf, ((const struct rail_topo_gpu *)b)->bdf);
}

static int fill_rel(struct rail_topo *t)
{
	if (!t->ngpus || !t->nnics)
		return 0;
	t->rel = calloc((size_t)t->ngpus * (size_t)t->nnics, sizeof(*t->rel));
	if (!t->rel)
		return -ENOMEM;
	for (int g = 0; g < t->ngpus; g++)
		for (int n = 0; n < t->nnics; n++)
			t->rel[g * t->nnics + n] =
				rail_topo_relation(t->gpus[g].pci_path, t->gpus[g].numa,
						   t->nics[n].bdf[0] ? t->nics[n].pci_path : NULL,
						   t->nics[n].numa, t->nnuma);
	return 0;
}

int rail_topo_build(const char *extra_gpus, struct rail_topo **out)
{
	struct rail_topo *t = calloc(1, sizeof(*t));
	int err;

	if (!t)
		return -ENOMEM;
	rail_sysfs_list("/sys/devices/system/node", count_numa, &t->nnuma);
	err = scan_gpus(t, extra_gpus);
	if (!err && t->ngpus)
		qsort(t->gpus, (size_t)t->ngpus, sizeof(*t->gpus), cmp_gpu);
	if (!err)
		err = scan_nics(t);
	if (!err)
		err = scan_netdevs(t);
	if (!err)
		err = fill_rel(t);
	if (!err && t->ngpus && !(t->choice = calloc((size_t)t->ngpus, sizeof(*t->choice))))
		err = -ENOMEM;
	if (!err)
		err = rail_topo_choose(t);
	if (err) {
		RAIL_WARN("reading the topology from %s/sys failed: %s; check NCCL_RAIL_SYSFS_ROOT",
			  rail_sysfs_root(), RAIL_ERRSTR(err));
		rail_topo_free(t);
		return err;
	}
	*out = t;
	return 0;
}

void rail_topo_free(struct rail_topo *t)
{
	if (!t)
		return;
	free(t->gpus);
	free(t->nics);
	free(t->netdevs);
	free(t->rel);
	free(t->choice);
	free(t->warn);
	free(t);
}

/* ---- the process-wide model -------------------------------------------- */

static pthread_mutex_t topo_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rail_topo *topo_global;
static int topo_failed;

const struct rail_topo *rail_topo_get(void)
{
	struct rail_topo *t;

	pthread_mutex_lock(&topo_lock);
	if (!topo_global && !topo_failed && rail_topo_build(NULL, &topo_global))
		topo_failed = 1;
	t = topo_global;
	pthread_mutex_unlock(&topo_lock);
	return t;
}

void rail_topo_reset(void)
{
	pthread_mutex_lock(&topo_lock);
	rail_topo_free(topo_global);
	topo_global = NULL;
	topo_failed = 0;
	pthread_mutex_unlock(&topo_lock);
}

/* ---- PCI paths for NCCL ------------------------------------------------ */

static int pci_path_of(const char *link, char *out, size_t len)
{
	char path[RAIL_TOPO_PATH_LEN], bdf[RAIL_TOPO_BDF_LEN];
	int err = pci_of_link(link, path, sizeof(path), bdf, sizeof(bdf));

	if (err)
		return err == -ENOENT ? -ENODEV : err;
	if (strlen(path) >= len)
		return -ENAMETOOLONG;
	rail_strlcpy(out, path, len);
	return 0;
}

int rail_topo_pci_path(const char *ibdev, char *out, size_t len)
{
	char link[128];

	snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device", ibdev);
	return pci_path_of(link, out, len);
}

int rail_topo_netdev_pci_path(const char *ifname, char *out, size_t len)
{
	char link[128];

	snprintf(link, sizeof(link), "/sys/class/net/%s/device", ifname);
	return pci_path_of(link, out, len);
}
