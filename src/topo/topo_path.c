/*
 * nccl-net-rail: PCI paths and the distance between two devices, in
 * nvidia-smi's terms.
 *
 * A device's real sysfs path lists every bridge above it. Bridges come in
 * levels below the host bridge: a root port (depth 0), then for every PCIe
 * switch its upstream port (odd depth) and downstream ports (even depth,
 * children of the upstream port). Counting whole switches rather than
 * bridges gives nvidia-smi's answer: two functions behind one switch are
 * PIX even though the path crosses three bridges (down, up, down).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rail.h"
#include "topo/topo_internal.h"

static const char *const rel_names[] = { "PIX", "PXB", "PHB", "NODE", "SYS" };
static const char *const loc_names[] = { "pcie", "numa", "none" };

const char *rail_topo_rel_name(enum rail_topo_rel rel)
{
	return (unsigned)rel < RAIL_ARRAY_SIZE(rel_names) ? rel_names[rel] : "?";
}

const char *rail_topo_locality_name(enum rail_topo_locality loc)
{
	return (unsigned)loc < RAIL_ARRAY_SIZE(loc_names) ? loc_names[loc] : "?";
}

static int hexrun(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isxdigit((unsigned char)s[i]))
			return 0;
	return 1;
}

int rail_topo_is_bdf(const char *s)
{
	size_t len = strlen(s), dom;

	/* dddd:bb:dd.f -> the domain is everything before the last 8 chars */
	if (len < 12 || len > RAIL_TOPO_BDF_LEN - 1)
		return 0;
	dom = len - 8;
	return hexrun(s, dom) && s[dom] == ':' && hexrun(s + dom + 1, 2) && s[dom + 3] == ':' &&
	       hexrun(s + dom + 4, 2) && s[dom + 6] == '.' && s[dom + 7] >= '0' && s[dom + 7] <= '7';
}

int rail_topo_norm_bdf(const char *in, char *out, size_t len)
{
	char buf[RAIL_TOPO_BDF_LEN + 8];
	size_t n = strlen(in);

	if (n + 5 >= sizeof(buf))
		return -EINVAL;
	if (n == 7) /* bb:dd.f */
		snprintf(buf, sizeof(buf), "0000:%s", in);
	else
		snprintf(buf, sizeof(buf), "%s", in);
	for (char *p = buf; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	if (!rail_topo_is_bdf(buf) || strlen(buf) >= len)
		return -EINVAL;
	rail_strlcpy(out, buf, len);
	return 0;
}

int rail_topo_chain_parse(const char *path, struct rail_topo_chain *c)
{
	char buf[RAIL_TOPO_PATH_LEN];
	char *save = NULL, *tok;
	size_t off = 0;
	int n = 0, in_pci = 0;

	if (strlen(path) >= sizeof(buf))
		return -ENAMETOOLONG;
	rail_strlcpy(buf, path, sizeof(buf));
	c->host[0] = '\0';
	for (tok = strtok_r(buf, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
		if (rail_topo_is_bdf(tok)) {
			if (n == RAIL_TOPO_CHAIN_MAX)
				return -E2BIG;
			rail_strlcpy(c->bdf[n++], tok, sizeof(c->bdf[0]));
			in_pci = 1;
		} else if (in_pci) {
			break; /* net/eth0, virtio2, infiniband/mlx5_0 ... */
		} else {
			int w = snprintf(c->host + off, sizeof(c->host) - off, "/%s", tok);

			if (w < 0 || (size_t)w >= sizeof(c->host) - off)
				return -ENAMETOOLONG;
			off += (size_t)w;
		}
	}
	if (n == 0)
		return -ENODEV;
	c->n = n;
	return 0;
}

int rail_topo_trim_to_pci(char *path)
{
	char *last = NULL;

	for (char *p = strchr(path, '/'); p; p = strchr(p + 1, '/')) {
		char comp[RAIL_TOPO_BDF_LEN];
		const char *end = strchr(p + 1, '/');
		size_t len = end ? (size_t)(end - (p + 1)) : strlen(p + 1);

		if (len >= sizeof(comp))
			continue;
		memcpy(comp, p + 1, len);
		comp[len] = '\0';
		if (rail_topo_is_bdf(comp))
			last = p + 1 + len;
	}
	if (!last)
		return -ENODEV;
	*last = '\0';
	return 0;
}

/* The switch a bridge belongs to (see the top of the file). */
static const char *switch_of(const struct rail_topo_chain *c, int i)
{
	return (i >= 2 && i % 2 == 0) ? c->bdf[i - 1] : c->bdf[i];
}

static int add_unique(const char **set, int n, const char *id)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(set[i], id))
			return n;
	set[n] = id;
	return n + 1;
}

static enum rail_topo_rel numa_rel(int numa_a, int numa_b, int nnuma, char *anchor,
				   size_t anchor_len)
{
	if (numa_a >= 0 && numa_b >= 0) {
		snprintf(anchor, anchor_len, numa_a == numa_b ? "NUMA %d" : "NUMA %d and %d",
			 numa_a, numa_b);
		return numa_a == numa_b ? RAIL_TOPO_NODE : RAIL_TOPO_SYS;
	}
	/* Unknown NUMA node: only a one-node machine is sure to be NODE. */
	snprintf(anchor, anchor_len, "NUMA unknown");
	return nnuma == 1 ? RAIL_TOPO_NODE : RAIL_TOPO_SYS;
}

enum rail_topo_rel rail_topo_relation_ex(const char *path_a, int numa_a, const char *path_b,
					 int numa_b, int nnuma, char *anchor, size_t anchor_len)
{
	struct rail_topo_chain *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
	const char *set[2 * RAIL_TOPO_CHAIN_MAX];
	enum rail_topo_rel rel;
	int c = 0, n = 0, na, nb;

	anchor[0] = '\0';
	if (!a || !b || !path_a || !path_b || rail_topo_chain_parse(path_a, a) ||
	    rail_topo_chain_parse(path_b, b)) {
		snprintf(anchor, anchor_len, "not on PCI");
		rel = RAIL_TOPO_SYS;
		goto out;
	}
	if (strcmp(a->host, b->host)) {
		rel = numa_rel(numa_a, numa_b, nnuma, anchor, anchor_len);
		goto out;
	}
	na = a->n - 1; /* bridges above each device */
	nb = b->n - 1;
	while (c < na && c < nb && !strcmp(a->bdf[c], b->bdf[c]))
		c++;
	if (c == 0) {
		const char *h = strrchr(a->host, '/');

		snprintf(anchor, anchor_len, "%s", h ? h + 1 : a->host);
		rel = RAIL_TOPO_PHB;
		goto out;
	}
	n = add_unique(set, n, switch_of(a, c - 1));
	for (int i = c; i < na; i++)
		n = add_unique(set, n, switch_of(a, i));
	for (int i = c; i < nb; i++)
		n = add_unique(set, n, switch_of(b, i));
	snprintf(anchor, anchor_len, "%s", switch_of(a, c - 1));
	rel = n == 1 ? RAIL_TOPO_PIX : RAIL_TOPO_PXB;
out:
	free(a);
	free(b);
	return rel;
}

enum rail_topo_rel rail_topo_relation(const char *path_a, int numa_a, const char *path_b,
				      int numa_b, int nnuma)
{
	char anchor[64];

	return rail_topo_relation_ex(path_a, numa_a, path_b, numa_b, nnuma, anchor,
				     sizeof(anchor));
}

int rail_topo_natcmp(const char *a, const char *b)
{
	while (*a && *b) {
		if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
			char *ea, *eb;
			unsigned long va = strtoul(a, &ea, 10), vb = strtoul(b, &eb, 10);

			if (va != vb)
				return va < vb ? -1 : 1;
			a = ea;
			b = eb;
			continue;
		}
		if (*a != *b)
			return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
		a++;
		b++;
	}
	return *a ? 1 : *b ? -1 : 0;
}
