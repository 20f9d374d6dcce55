/*
 * fakeverbs: the description file (RAIL_FAKEVERBS_CONF) and the sysfs files
 * that go with it (RAIL_FAKEVERBS_SYSFS). Format: README.md.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fv.h"

struct fv_conf fv_conf;

struct name_val {
	const char *name;
	long val;
};

static const struct name_val speeds[] = {
	{ "sdr", 1 }, { "ddr", 2 }, { "qdr", 4 }, { "fdr10", 8 }, { "fdr", 16 },
	{ "edr", 32 }, { "hdr", 64 }, { "ndr", 128 }, { "xdr", 256 }, { NULL, 0 },
};
static const struct name_val widths[] = {
	{ "1x", 1 }, { "4x", 2 }, { "8x", 4 }, { "12x", 8 }, { "2x", 16 }, { NULL, 0 },
};
static const struct name_val states[] = {
	{ "down", IBV_PORT_DOWN }, { "init", IBV_PORT_INIT }, { "armed", IBV_PORT_ARMED },
	{ "active", IBV_PORT_ACTIVE }, { NULL, 0 },
};
static const struct name_val links[] = {
	{ "ib", IBV_LINK_LAYER_INFINIBAND }, { "eth", IBV_LINK_LAYER_ETHERNET },
	{ "unspecified", IBV_LINK_LAYER_UNSPECIFIED }, { NULL, 0 },
};
static const struct name_val mtus[] = {
	{ "256", IBV_MTU_256 }, { "512", IBV_MTU_512 }, { "1024", IBV_MTU_1024 },
	{ "2048", IBV_MTU_2048 }, { "4096", IBV_MTU_4096 }, { NULL, 0 },
};
static const struct name_val gid_types[] = {
	{ "ib", 0 }, { "v1", 1 }, { "v2", 2 }, { NULL, 0 },
};
static const struct name_val yesno[] = {
	{ "yes", 1 }, { "no", 0 }, { "1", 1 }, { "0", 0 }, { NULL, 0 },
};

struct parse {
	const char *file;
	int line;
	struct fv_dev *dev;
	struct fv_port *port;
};

static int bad(struct parse *p, const char *what, const char *tok)
{
	fprintf(stderr, "fakeverbs: %s:%d: %s '%s'\n", p->file, p->line, what, tok);
	return EINVAL;
}

static int lookup(const struct name_val *t, const char *v, long *out)
{
	char *end;

	for (; t->name; t++) {
		if (!strcmp(t->name, v)) {
			*out = t->val;
			return 0;
		}
	}
	errno = 0;
	*out = strtol(v, &end, 0);
	return errno || end == v || *end ? EINVAL : 0;
}

static int num(const char *v, long *out)
{
	static const struct name_val none[] = { { NULL, 0 } };

	return lookup(none, v, out);
}

static int u64(const char *v, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(v, &end, 0);
	return errno || end == v || *end ? EINVAL : 0;
}

static int dev_key(struct parse *p, const char *k, const char *v)
{
	struct fv_dev *d = p->dev;
	long n = 0;
	int err;

	if (!strcmp(k, "pci")) {
		if (strlen(v) >= sizeof(d->pci))
			return EINVAL;
		snprintf(d->pci, sizeof(d->pci), "%s", v);
		return 0;
	}
	if (!strcmp(k, "data_direct")) {
		if (v[0] != '/' || strlen(v) >= sizeof(d->data_direct))
			return EINVAL;
		snprintf(d->data_direct, sizeof(d->data_direct), "%s", v);
		return 0;
	}
	if (!strcmp(k, "sys_image_guid"))
		return u64(v, &d->sys_image_guid);
	if (!strcmp(k, "node_guid"))
		return u64(v, &d->node_guid);
	err = !strcmp(k, "dmabuf") || !strcmp(k, "data_in_order") || !strcmp(k, "reorder") ||
		      !strcmp(k, "retrying") || !strcmp(k, "atomic")
		      ? lookup(yesno, v, &n)
		      : num(v, &n);
	if (err)
		return err;
	if (!strcmp(k, "vendor_part_id")) d->vendor_part_id = (uint32_t)n;
	else if (!strcmp(k, "max_qp")) d->max_qp = (int)n;
	else if (!strcmp(k, "max_cqe")) d->max_cqe = (int)n;
	else if (!strcmp(k, "max_qp_wr")) d->max_qp_wr = (int)n;
	else if (!strcmp(k, "max_inline")) d->max_inline = (int)n;
	else if (!strcmp(k, "dmabuf")) d->dmabuf = (int)n;
	else if (!strcmp(k, "data_in_order")) d->data_in_order = (int)n;
	else if (!strcmp(k, "reorder")) d->reorder = (int)n;
	else if (!strcmp(k, "reorder_tail") && n > 0 && n % 8 == 0) d->reorder_tail = (int)n;
	else if (!strcmp(k, "reorder_head") && n > 0 && n % 8 == 0) d->reorder_head = (int)n;
	else if (!strcmp(k, "reorder_delay") && n > 0 && n <= 100000) d->reorder_delay = (int)n;
	else if (!strcmp(k, "ece")) d->ece = (int)n;
	else if (!strcmp(k, "retrying")) d->retrying = (int)n;
	else if (!strcmp(k, "atomic")) d->atomic = (int)n;
	else if (!strcmp(k, "retry_ms") && n >= 0 && n <= 3600000) d->retry_ms = (int)n;
	else if (!strcmp(k, "rtr_ms") && n >= 0 && n <= 60000) d->rtr_ms = (int)n;
	else return EINVAL;
	return 0;
}

static int port_key(struct parse *p, const char *k, const char *v)
{
	struct fv_port *pt = p->port;
	long n;

	if (!strcmp(k, "port_speed")) {
		if (!strcmp(v, "fail")) {
			pt->port_speed = -2;
			return 0;
		}
		return num(v, &pt->port_speed);
	}
	if (!strcmp(k, "flags")) {
		if (!strcmp(v, "grh_required"))
			pt->flags |= IBV_QPF_GRH_REQUIRED;
		else if (strcmp(v, "none"))
			return EINVAL;
		return 0;
	}
	if (!strcmp(k, "link")) { if (lookup(links, v, &n)) return EINVAL; pt->link_layer = (int)n; }
	else if (!strcmp(k, "state")) { if (lookup(states, v, &n)) return EINVAL; pt->state = (int)n; }
	else if (!strcmp(k, "speed")) { if (lookup(speeds, v, &n)) return EINVAL; pt->speed = (uint32_t)n; }
	else if (!strcmp(k, "width")) { if (lookup(widths, v, &n)) return EINVAL; pt->width = (int)n; }
	else if (!strcmp(k, "mtu")) { if (lookup(mtus, v, &n)) return EINVAL; pt->mtu = (int)n; }
	else if (!strcmp(k, "lid")) { if (num(v, &n)) return EINVAL; pt->lid = (uint16_t)n; }
	else if (!strcmp(k, "sm_lid")) { if (num(v, &n)) return EINVAL; pt->sm_lid = (uint16_t)n; }
	else if (!strcmp(k, "gid_tbl_len")) { if (num(v, &n)) return EINVAL; pt->gid_tbl_len = (int)n; }
	else return EINVAL;
	return 0;
}

static int lib_key(struct parse *p, const char *k, const char *v)
{
	long n;

	(void)p;
	if (lookup(yesno, v, &n))
		return EINVAL;
	if (!strcmp(k, "speed_ex"))
		fv_conf.speed_ex = (int)n;
	else if (!strcmp(k, "port_speed"))
		fv_conf.port_speed = (int)n;
	else
		return EINVAL;
	return 0;
}

static int keyvals(struct parse *p, char *save, int (*fn)(struct parse *, const char *,
							   const char *))
{
	char *tok;

	while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
		char *eq = strchr(tok, '=');

		if (!eq)
			return bad(p, "expected key=value, got", tok);
		*eq = '\0';
		if (fn(p, tok, eq + 1)) {
			*eq = '=';
			return bad(p, "bad setting", tok);
		}
	}
	return 0;
}

static void dev_defaults(struct fv_dev *d, const char *name, int idx)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", name);
	snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs%d", idx);
	snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path), "/sys/class/infiniband_verbs/uverbs%d",
		 idx);
	snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path), "/sys/class/infiniband/%s",
		 name);
	d->ibdev.node_type = IBV_NODE_CA;
	d->ibdev.transport_type = IBV_TRANSPORT_IB;
	snprintf(d->pci, sizeof(d->pci), "0000:%02x:00.0", 0x10 + idx);
	d->sys_image_guid = 0x0002c90300a00000ull + ((uint64_t)idx << 8);
	d->node_guid = d->sys_image_guid + 1;
	d->vendor_part_id = 4129;	/* ConnectX-7 */
	d->max_qp = 131072;
	d->max_cqe = 4194303;
	d->max_qp_wr = 32768;
	d->max_inline = 256;
	d->dmabuf = 1;
	d->data_in_order = 1;
	d->atomic = 1;
	d->retry_ms = -1;	/* FV_RETRY_MS; a destination in ERR fails at once */
}

static void port_defaults(struct fv_port *pt, int lid)
{
	memset(pt, 0, sizeof(*pt));
	pt->state = IBV_PORT_ACTIVE;
	pt->link_layer = IBV_LINK_LAYER_INFINIBAND;
	pt->speed = 128;
	pt->width = 2;
	pt->mtu = IBV_MTU_4096;
	pt->lid = (uint16_t)lid;
	pt->sm_lid = 1;
	pt->port_speed = -1;
}

static int gid_line(struct parse *p, char *save)
{
	char *idx = strtok_r(NULL, " \t\r\n", &save), *addr = strtok_r(NULL, " \t\r\n", &save);
	struct fv_gid *g;
	long i = -1, type = 2;

	if (!p->port || !idx || !addr || num(idx, &i) || i < 0 || i >= FV_MAX_GIDS)
		return bad(p, "expected 'gid INDEX ADDRESS [type=ib|v1|v2]' after a port, got",
			   idx ? idx : "");
	g = &p->port->gids[i];
	if (inet_pton(AF_INET6, addr, g->gid.raw) != 1)
		return bad(p, "not an IPv6-style GID", addr);
	g->valid = 1;
	g->type = p->port->link_layer == IBV_LINK_LAYER_INFINIBAND ? 0 : 2;
	for (char *t; (t = strtok_r(NULL, " \t\r\n", &save));) {
		if (strncmp(t, "type=", 5) || lookup(gid_types, t + 5, &type))
			return bad(p, "bad gid setting", t);
		g->type = (int)type;
	}
	if (p->port->gid_tbl_len < i + 1)
		p->port->gid_tbl_len = (int)i + 1;
	return 0;
}

static int parse_line(struct parse *p, char *line)
{
	char *save = NULL, *kw = strtok_r(line, " \t\r\n", &save);

	if (!kw || kw[0] == '#')
		return 0;
	if (!strcmp(kw, "lib"))
		return keyvals(p, save, lib_key);
	if (!strcmp(kw, "device")) {
		char *name = strtok_r(NULL, " \t\r\n", &save);

		if (!name || fv_conf.ndevs == FV_MAX_DEVS)
			return bad(p, "device needs a name (at most 16 devices)", name ? name : "");
		p->dev = &fv_conf.devs[fv_conf.ndevs];
		dev_defaults(p->dev, name, fv_conf.ndevs++);
		p->port = NULL;
		return keyvals(p, save, dev_key);
	}
	if (!strcmp(kw, "port")) {
		char *n = strtok_r(NULL, " \t\r\n", &save);
		long pn = 0;

		if (!p->dev || !n || num(n, &pn) || pn != p->dev->nports + 1 || pn > FV_MAX_PORTS)
			return bad(p, "ports follow their device, numbered from 1 in order; got",
				   n ? n : "");
		p->port = &p->dev->ports[p->dev->nports++];
		port_defaults(p->port, 16 * fv_conf.ndevs + (int)pn);
		return keyvals(p, save, port_key);
	}
	if (!strcmp(kw, "gid"))
		return gid_line(p, save);
	if (!strcmp(kw, "gpu")) {
		char *path = strtok_r(NULL, " \t\r\n", &save);

		if (!path || fv_conf.ngpus == FV_MAX_GPUS || strlen(path) >= sizeof(fv_conf.gpus[0]))
			return bad(p, "expected 'gpu PCI-PATH' (at most 8 GPUs), got", path ? path : "");
		snprintf(fv_conf.gpus[fv_conf.ngpus++], sizeof(fv_conf.gpus[0]), "%s", path);
		return 0;
	}
	return bad(p, "unknown keyword", kw);
}

int fv_conf_load(void)
{
	const char *path = getenv("RAIL_FAKEVERBS_CONF");
	struct parse p = { .file = path };
	char line[512];
	FILE *f;
	int err = 0;

	memset(&fv_conf, 0, sizeof(fv_conf));
	fv_conf.speed_ex = 1;
	fv_conf.port_speed = 1;
	if (!path || !path[0])
		return 0;	/* no devices */
	f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "fakeverbs: cannot open RAIL_FAKEVERBS_CONF=%s: %s\n", path,
			strerror(errno));
		return errno;
	}
	while (!err && fgets(line, sizeof(line), f)) {
		p.line++;
		err = parse_line(&p, line);
	}
	fclose(f);
	if (err)
		fv_conf.ndevs = 0;
	return err;
}

const char *fv_gid_str(const union ibv_gid *g, char *buf, size_t len)
{
	if (!inet_ntop(AF_INET6, g->raw, buf, (socklen_t)len))
		snprintf(buf, len, "?");
	return buf;
}

/* ---- sysfs -------------------------------------------------------------- */

static void mkdirs(const char *path)
{
	char tmp[PATH_MAX];

	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *s = tmp + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		mkdir(tmp, 0755);
		*s = '/';
	}
	mkdir(tmp, 0755);
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f) {
		fprintf(stderr, "fakeverbs: cannot write %s: %s\n", path, strerror(errno));
		return;
	}
	fputs(text, f);
	fclose(f);
}

/* The files of GID index i under the device's sysfs directory base. */
static void gid_sysfs(const char *base, int pn, const struct fv_port *pt, int i)
{
	static const char *const type_text[] = { "IB/RoCE v1\n", "IB/RoCE v1\n", "RoCE v2\n" };
	char dir[PATH_MAX + 64], path[PATH_MAX + 96], g[64];

	snprintf(dir, sizeof(dir), "%s/ports/%d/gids", base, pn);
	mkdirs(dir);
	snprintf(path, sizeof(path), "%s/%d", dir, i);
	if (pt->gids[i].valid) {
		fv_gid_str(&pt->gids[i].gid, g, sizeof(g) - 1);
		strcat(g, "\n");
	} else {
		snprintf(g, sizeof(g), "0000:0000:0000:0000:0000:0000:0000:0000\n");
	}
	put(path, g);
	if (pt->link_layer != IBV_LINK_LAYER_ETHERNET)
		return;	/* the kernel has no RoCE type for IB GIDs */
	snprintf(dir, sizeof(dir), "%s/ports/%d/gid_attrs/types", base, pn);
	mkdirs(dir);
	snprintf(path, sizeof(path), "%s/%d", dir, i);
	if (pt->gids[i].valid)
		put(path, type_text[pt->gids[i].type]);
	else
		unlink(path);	/* reading an empty entry's type fails */
}

/* "400 Gb/sec (4X NDR)", as the kernel writes ports/<p>/rate. */
static void rate_text(const struct fv_port *pt, char *out, size_t len)
{
	static const struct { uint32_t code; double gbps; const char *name; } lanes[] = {
		{ 1, 2.5, "SDR" }, { 2, 5, "DDR" }, { 4, 10, "QDR" }, { 8, 10, "FDR10" },
		{ 16, 14, "FDR" }, { 32, 25, "EDR" }, { 64, 50, "HDR" }, { 128, 100, "NDR" },
		{ 256, 200, "XDR" },
	};
	static const int widths_x[] = { 0, 1, 4, 0, 8, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 2 };
	int w = pt->width > 0 && pt->width <= 16 ? widths_x[pt->width] : 0;

	for (size_t i = 0; i < sizeof(lanes) / sizeof(lanes[0]); i++)
		if (lanes[i].code == pt->speed && w) {
			snprintf(out, len, "%g Gb/sec (%dX %s)\n", lanes[i].gbps * w, w, lanes[i].name);
			return;
		}
	snprintf(out, len, "0 Gb/sec\n");
}

static void port_state_sysfs(const char *base, int pn, const struct fv_port *pt)
{
	static const char *const names[] = { "NOP", "DOWN", "INIT", "ARMED", "ACTIVE" };
	char dir[PATH_MAX + 32], path[PATH_MAX + 64], text[64];
	int st = pt->state >= 0 && pt->state <= 4 ? pt->state : 0;

	snprintf(dir, sizeof(dir), "%s/ports/%d", base, pn);
	mkdirs(dir);
	snprintf(path, sizeof(path), "%s/state", dir);
	snprintf(text, sizeof(text), "%d: %s\n", st, names[st]);
	put(path, text);
	snprintf(path, sizeof(path), "%s/phys_state", dir);
	put(path, st == IBV_PORT_ACTIVE ? "5: LinkUp\n" : "3: Disabled\n");
}

static void port_rate_sysfs(const char *base, int pn, const struct fv_port *pt)
{
	char path[PATH_MAX + 64], text[64];

	snprintf(path, sizeof(path), "%s/ports/%d/rate", base, pn);
	rate_text(pt, text, sizeof(text));
	put(path, text);
}

static void port_sysfs(const char *base, int pn, const struct fv_port *pt)
{
	char path[PATH_MAX + 64];

	for (int i = 0; i < FV_MAX_GIDS; i++)
		if (pt->gids[i].valid)
			gid_sysfs(base, pn, pt, i);
	port_state_sysfs(base, pn, pt);
	snprintf(path, sizeof(path), "%s/ports/%d/link_layer", base, pn);
	put(path, pt->link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet\n" : "InfiniBand\n");
	port_rate_sysfs(base, pn, pt);
}

void fv_sysfs_gid(const struct fv_dev *dev, int port, int index)
{
	const char *root = getenv("RAIL_FAKEVERBS_SYSFS");
	char base[PATH_MAX];

	if (!root || !root[0])
		return;
	snprintf(base, sizeof(base), "%s/sys/class/infiniband/%s", root, dev->ibdev.name);
	gid_sysfs(base, port, &dev->ports[port - 1], index);
}

void fv_sysfs_port(const struct fv_dev *dev, int port)
{
	const char *root = getenv("RAIL_FAKEVERBS_SYSFS");
	char base[PATH_MAX];

	if (!root || !root[0])
		return;
	snprintf(base, sizeof(base), "%s/sys/class/infiniband/%s", root, dev->ibdev.name);
	port_state_sysfs(base, port, &dev->ports[port - 1]);
	port_rate_sysfs(base, port, &dev->ports[port - 1]);
}

/* A PCI path of the description below /sys/devices: "pci0000:00/" unless it names its host. */
static void pci_rel(const char *pci, char *out, size_t len)
{
	snprintf(out, len, "%s%s", strncmp(pci, "pci", 3) ? "pci0000:00/" : "", pci);
}

/* The PCI function at rel: its directory, vendor, device and class, /sys/bus/pci/devices/<bdf>. */
static void pci_function(const char *root, const char *rel, unsigned vendor, unsigned device,
			 unsigned cls)
{
	const char *bdf = strrchr(rel, '/') ? strrchr(rel, '/') + 1 : rel;
	char dir[PATH_MAX], path[PATH_MAX + 32], text[PATH_MAX];

	snprintf(dir, sizeof(dir), "%s/sys/devices/%s", root, rel);
	mkdirs(dir);
	snprintf(path, sizeof(path), "%s/vendor", dir);
	snprintf(text, sizeof(text), "0x%04x\n", vendor);
	put(path, text);
	snprintf(path, sizeof(path), "%s/device", dir);
	snprintf(text, sizeof(text), "0x%04x\n", device);
	put(path, text);
	snprintf(path, sizeof(path), "%s/class", dir);
	snprintf(text, sizeof(text), "0x%06x\n", cls);
	put(path, text);
	snprintf(dir, sizeof(dir), "%s/sys/bus/pci/devices", root);
	mkdirs(dir);
	snprintf(path, sizeof(path), "%s/%s", dir, bdf);
	unlink(path);
	snprintf(text, sizeof(text), "../../../devices/%s", rel);
	if (symlink(text, path))
		fprintf(stderr, "fakeverbs: symlink %s: %s\n", path, strerror(errno));
}

void fv_sysfs_write(void)
{
	const char *root = getenv("RAIL_FAKEVERBS_SYSFS");
	char base[PATH_MAX], path[PATH_MAX + 64], text[PATH_MAX], rel[300];

	if (!root || !root[0])
		return;
	for (int g = 0; g < fv_conf.ngpus; g++) {	/* NVIDIA H100, 3D controller */
		pci_rel(fv_conf.gpus[g], rel, sizeof(rel));
		pci_function(root, rel, 0x10de, 0x2330, 0x030200);
	}
	for (int d = 0; d < fv_conf.ndevs; d++) {
		const struct fv_dev *dev = &fv_conf.devs[d];

		pci_rel(dev->pci, rel, sizeof(rel));
		pci_function(root, rel, 0x15b3, 0x1021, 0x020700);	/* ConnectX-7 */
		snprintf(base, sizeof(base), "%s/sys/class/infiniband/%s", root, dev->ibdev.name);
		mkdirs(base);
		snprintf(path, sizeof(path), "%s/device", base);
		unlink(path);
		snprintf(text, sizeof(text), "../../../devices/%s", rel);
		if (symlink(text, path))
			fprintf(stderr, "fakeverbs: symlink %s: %s\n", path, strerror(errno));
		snprintf(path, sizeof(path), "%s/sys_image_guid", base);
		snprintf(text, sizeof(text), "%016llx\n", (unsigned long long)dev->sys_image_guid);
		put(path, text);
		for (int p = 0; p < dev->nports; p++)
			port_sysfs(base, p + 1, &dev->ports[p]);
	}
}
