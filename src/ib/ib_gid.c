/* nccl-net-rail: RoCE GID selection (rules in ib_gid.h). */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ib/ib_gid.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"

static const uint8_t v4_prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

const char *rail_ib_gid_str(const uint8_t raw[16], char *buf, size_t len)
{
	if (!inet_ntop(AF_INET6, raw, buf, (socklen_t)len))
		snprintf(buf, len, "?");
	return buf;
}

int rail_ib_gid_parse_range(const char *text, struct rail_ib_gid_params *p)
{
	char addr[64];
	const char *slash = strchr(text, '/');
	uint8_t raw[16];
	char *end;
	long bits;
	int fam;

	if (!slash || (size_t)(slash - text) >= sizeof(addr))
		return -EINVAL;
	memcpy(addr, text, (size_t)(slash - text));
	addr[slash - text] = '\0';
	bits = strtol(slash + 1, &end, 10);
	if (!slash[1] || *end)
		return -EINVAL;
	memset(raw, 0, sizeof(raw));
	if (inet_pton(AF_INET, addr, raw) == 1)
		fam = AF_INET;
	else if (inet_pton(AF_INET6, addr, raw) == 1)
		fam = AF_INET6;
	else
		return -EINVAL;
	if (bits < 0 || bits > (fam == AF_INET ? 32 : 128))
		return -EINVAL;
	p->range_family = fam;
	memcpy(p->range_addr, raw, sizeof(raw));
	p->range_bits = (int)bits;
	return 0;
}

void rail_ib_gid_params_from_env(struct rail_ib_gid_params *p)
{
	const char *range = rail_param_str(RAIL_P_IB_ADDR_RANGE);

	memset(p, 0, sizeof(*p));
	p->forced_index = (int)rail_param_int(RAIL_P_IB_GID_INDEX);
	p->family = rail_param_int(RAIL_P_IB_ADDR_FAMILY) == 1 ? AF_INET6 : AF_INET;
	p->version = (int)rail_param_int(RAIL_P_IB_ROCE_VERSION_NUM);
	if (range[0] && rail_ib_gid_parse_range(range, p))
		RAIL_WARN("NCCL_IB_ADDR_RANGE=%s is not addr/prefixlen (e.g. 10.0.0.0/8 or "
			  "fd00::/8); ignored", range);
}

static int prefix_match(const uint8_t *a, const uint8_t *b, int bits)
{
	int bytes = bits / 8, rest = bits % 8;

	if (memcmp(a, b, (size_t)bytes))
		return 0;
	if (!rest)
		return 1;
	return ((a[bytes] ^ b[bytes]) & (0xff << (8 - rest))) == 0;
}

static int in_range(const struct rail_ib_gid_entry *e, const struct rail_ib_gid_params *p)
{
	if (!p->range_family)
		return 1;
	if (p->range_family != e->family)
		return 0;
	if (e->family == AF_INET)
		return prefix_match(e->raw + 12, p->range_addr, p->range_bits);
	return prefix_match(e->raw, p->range_addr, p->range_bits);
}

int rail_ib_gid_is_v4(const uint8_t raw[16])
{
	return !memcmp(raw, v4_prefix, sizeof(v4_prefix));
}

int rail_ib_gid_valid(const uint8_t raw[16])
{
	static const uint8_t zero[16];

	return memcmp(raw, zero, 16) != 0 &&
	       !(raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80 && !memcmp(raw + 2, zero, 6));
}

static void classify(struct rail_ib_gid_entry *e)
{
	e->family = rail_ib_gid_is_v4(e->raw) ? AF_INET : AF_INET6;
	e->valid = rail_ib_gid_valid(e->raw);
}

static int read_type(const char *dev, int port, int index, int *version)
{
	char path[256], buf[64];
	int n;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev,
		 port, index);
	n = rail_sysfs_read(path, buf, sizeof(buf));
	if (n < 0)
		return n;
	if (strstr(buf, "RoCE v2") || strstr(buf, "RoCE V2"))
		*version = 2;
	else if (strstr(buf, "RoCE v1") || strstr(buf, "RoCE V1") || strstr(buf, "IB/RoCE"))
		*version = 1;
	else
		return -EINVAL;
	return 0;
}

static int read_entry(const char *dev, int port, int index, struct rail_ib_gid_entry *e)
{
	char path[256];
	int n;

	memset(e, 0, sizeof(*e));
	e->index = index;
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gids/%d", dev, port, index);
	n = rail_sysfs_read(path, e->text, sizeof(e->text));
	if (n < 0)
		return n;
	if (inet_pton(AF_INET6, e->text, e->raw) != 1)
		return -EINVAL;
	classify(e);
	if (e->valid)
		e->type_err = read_type(dev, port, index, &e->roce_version);
	return 0;
}

int rail_ib_gid_table(const char *dev, int port, int tbl_len, struct rail_ib_gid_entry *out,
		      int max)
{
	char dir[256];
	int n = 0;

	snprintf(dir, sizeof(dir), "/sys/class/infiniband/%s/ports/%d/gids", dev, port);
	if (!rail_sysfs_exists(dir))
		return -ENOENT;
	if (tbl_len <= 0 || tbl_len > max)
		tbl_len = max;
	for (int i = 0; i < tbl_len; i++) {
		if (read_entry(dev, port, i, &out[n]) == 0)
			n++;
	}
	return n;
}

static int usable(const struct rail_ib_gid_entry *e, const struct rail_ib_gid_params *p,
		  int family, int version)
{
	if (!e->valid || e->type_err || e->family != family || !in_range(e, p))
		return 0;
	return version == 0 || e->roce_version == version;
}

static const char *fam_name(int family)
{
	return family == AF_INET ? "IPv4" : "IPv6";
}

static void choose_forced(const struct rail_ib_gid_entry *tab, int n,
			  const struct rail_ib_gid_params *p, struct rail_ib_gid_choice *out)
{
	out->index = p->forced_index;
	for (int i = 0; i < n; i++) {
		if (tab[i].index != p->forced_index)
			continue;
		memcpy(out->raw, tab[i].raw, 16);
		out->roce_version = tab[i].roce_version;
	}
	snprintf(out->reason, sizeof(out->reason), "NCCL_IB_GID_INDEX=%d", p->forced_index);
}

static void describe(struct rail_ib_gid_choice *out, int pass, const struct rail_ib_gid_params *p,
		     const struct rail_ib_gid_entry *e)
{
	const char *range = p->range_family ? " in NCCL_IB_ADDR_RANGE" : "";

	if (pass == 0)
		snprintf(out->reason, sizeof(out->reason), "first valid %s RoCE v%d GID%s",
			 fam_name(e->family), e->roce_version, range);
	else if (pass == 1)
		snprintf(out->reason, sizeof(out->reason), "first valid %s GID%s (RoCE v%d; none "
			 "is RoCE v%d)", fam_name(e->family), range, e->roce_version, p->version);
	else
		snprintf(out->reason, sizeof(out->reason), "first valid %s GID (RoCE v%d): no valid "
			 "%s GID%s", fam_name(e->family), e->roce_version, fam_name(p->family),
			 range);
}

void rail_ib_gid_choose(const struct rail_ib_gid_entry *tab, int n,
			const struct rail_ib_gid_params *p, struct rail_ib_gid_choice *out)
{
	int other = p->family == AF_INET ? AF_INET6 : AF_INET;
	const struct {
		int family, version;
	} passes[4] = { { p->family, p->version }, { p->family, 0 }, { other, p->version },
			{ other, 0 } };

	memset(out, 0, sizeof(*out));
	out->index = -1;
	if (p->forced_index >= 0) {
		choose_forced(tab, n, p, out);
		return;
	}
	for (int pass = 0; pass < 4; pass++) {
		for (int i = 0; i < n; i++) {
			const struct rail_ib_gid_entry *e = &tab[i];

			if (!usable(e, p, passes[pass].family, passes[pass].version))
				continue;
			out->index = e->index;
			memcpy(out->raw, e->raw, 16);
			out->roce_version = e->roce_version;
			describe(out, pass, p, e);
			return;
		}
	}
	snprintf(out->reason, sizeof(out->reason),
		 "no usable GID: every entry is zero, link-local, outside NCCL_IB_ADDR_RANGE or "
		 "of unreadable type; give the netdev an IP address or set NCCL_IB_GID_INDEX");
}

int rail_ib_gid_select(const char *dev, int port, int tbl_len, struct rail_ib_gid_choice *out)
{
	/* as many entries as the port has (each connection reads them: ib_qp.c member_ready) */
	int max = tbl_len > 0 && tbl_len < RAIL_IB_GID_MAX ? tbl_len : RAIL_IB_GID_MAX;
	struct rail_ib_gid_entry *tab = calloc((size_t)max, sizeof(*tab));
	struct rail_ib_gid_params p;
	struct rail_ib_gid_choice c;
	int n;

	if (!tab)
		return -ENOMEM;
	rail_ib_gid_params_from_env(&p);
	n = rail_ib_gid_table(dev, port, tbl_len, tab, max);
	if (n < 0 && p.forced_index < 0) {
		snprintf(out->reason, sizeof(out->reason), "cannot read the GID table of %s:%d "
			 "from sysfs (%s); set NCCL_IB_GID_INDEX", dev, port, RAIL_ERRSTR(n));
		out->index = -1;
		free(tab);
		return -ENOENT;
	}
	for (int i = 0; i < n; i++) {
		if (tab[i].valid && tab[i].type_err)
			RAIL_INFO(RAIL_LOG_INIT | RAIL_LOG_NET, "%s:%d GID %d (%s) skipped: its type "
				  "file gid_attrs/types/%d cannot be read (%s)", dev, port,
				  tab[i].index, tab[i].text, tab[i].index, RAIL_ERRSTR(tab[i].type_err));
	}
	rail_ib_gid_choose(tab, n < 0 ? 0 : n, &p, &c);
	free(tab);
	*out = c;
	return c.index >= 0 ? 0 : -ENOENT;
}

/* ---- the network of a GID (ib_gid.h) ------------------------------------- */

/* The prefix length of this host's interface address a (4 or 16 bytes); -1 if none has it. */
static int if_prefix(int family, const uint8_t *a)
{
	size_t alen = family == AF_INET ? 4 : 16;
	struct ifaddrs *list, *i;
	int bits = -1;

	if (getifaddrs(&list))
		return -1;
	for (i = list; i && bits < 0; i = i->ifa_next) {
		const uint8_t *x, *m;

		if (!i->ifa_addr || !i->ifa_netmask || i->ifa_addr->sa_family != family)
			continue;
		x = family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
				      : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
		m = family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_netmask)->sin_addr
				      : (const void *)&((struct sockaddr_in6 *)i->ifa_netmask)->sin6_addr;
		if (memcmp(x, a, alen))
			continue;
		bits = 0;
		for (size_t k = 0; k < alen; k++)
			bits += __builtin_popcount(m[k]);
	}
	freeifaddrs(list);
	return bits;
}

/* out: raw's first bits bits (over the 16 bytes), the rest cleared. */
static void net_set(const uint8_t raw[16], int bits, int assumed, struct rail_ib_gid_net *out)
{
	out->assumed = assumed;
	out->bits = bits;
	memset(out->raw, 0, sizeof(out->raw));
	for (int k = 0; k < 16; k++) {
		int b = bits - 8 * k;

		out->raw[k] = b >= 8 ? raw[k] : b > 0 ? (uint8_t)(raw[k] & (0xff << (8 - b))) : 0;
	}
}

void rail_ib_gid_net(const uint8_t raw[16], int infiniband, struct rail_ib_gid_net *out)
{
	int v4 = !infiniband && rail_ib_gid_is_v4(raw);
	int bits = infiniband ? 64 : if_prefix(v4 ? AF_INET : AF_INET6, v4 ? raw + 12 : raw);
	int assumed = bits < 0;

	if (assumed)
		bits = v4 ? 24 : 64;
	net_set(raw, v4 ? 96 + bits : bits, assumed, out);
}

void rail_ib_gid_routing_net(const uint8_t raw[16], int v4_bits, struct rail_ib_gid_net *out)
{
	int v4 = rail_ib_gid_is_v4(raw);

	net_set(raw, v4 ? 96 + v4_bits : 64, 0, out);
}

int rail_ib_gid_in_net(const struct rail_ib_gid_net *n, const uint8_t raw[16])
{
	return prefix_match(n->raw, raw, n->bits);
}

const char *rail_ib_gid_net_str(const struct rail_ib_gid_net *n, char *buf, size_t len)
{
	char a[INET6_ADDRSTRLEN];
	int v4 = n->bits >= 96 && !memcmp(n->raw, v4_prefix, sizeof(v4_prefix));

	if (!inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? n->raw + 12 : n->raw, a, sizeof(a)))
		snprintf(a, sizeof(a), "?");
	snprintf(buf, len, "%s/%d%s", a, v4 ? n->bits - 96 : n->bits,
		 n->assumed ? " (prefix assumed)" : "");
	return buf;
}
