/*
 * nccl-net-rail: which NIC ports each GPU uses, and why (the rules are in
 * topo.h), NCCL_RAIL_GPU_NIC_MAP, rails, and finding the process's GPU.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "matchlist.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"
#include "topo/topo_internal.h"

#define MAX_CAND 256

struct cand {
	int nic, port_idx;
	enum rail_topo_rel rel;
};

static const char *state_name(int state)
{
	static const char *const names[] = { "state unknown", "DOWN", "INIT", "ARMED", "ACTIVE",
					     "ACTIVE_DEFER" };

	return state >= 0 && state < (int)RAIL_ARRAY_SIZE(names) ? names[state] : "state unknown";
}

static void mark_usable(struct rail_topo *t)
{
	struct rail_matchlist ml;
	char why[128];

	/* A malformed NCCL_IB_HCA is warned by the verbs transport; select all. */
	if (rail_matchlist_parse(rail_param_str(RAIL_P_IB_HCA), 4, &ml, why, sizeof(why)))
		memset(&ml, 0, sizeof(ml));
	for (int i = 0; i < t->nnics; i++) {
		for (int p = 0; p < t->nics[i].nports; p++) {
			struct rail_topo_port *port = &t->nics[i].ports[p];

			port->usable = 0;
			if (port->state != RAIL_TOPO_PORT_ACTIVE)
				snprintf(port->why_not, sizeof(port->why_not), "%s",
					 state_name(port->state));
			else if (!rail_matchlist_match(&ml, t->nics[i].name, port->port, NULL))
				snprintf(port->why_not, sizeof(port->why_not),
					 "excluded by NCCL_IB_HCA");
			else
				port->usable = 1;
		}
	}
}

static const char *sort_key(const struct rail_topo *t, int nic)
{
	return t->nics[nic].bdf[0] ? t->nics[nic].bdf : t->nics[nic].name;
}

static int cmp_cand(const struct rail_topo *t, const struct cand *a, const struct cand *b)
{
	int c = strcmp(sort_key(t, a->nic), sort_key(t, b->nic));

	if (!c)
		c = strcmp(t->nics[a->nic].name, t->nics[b->nic].name);
	return c ? c : a->port_idx - b->port_idx;
}

/* The nearest, fastest usable ports of GPU g, sorted; returns how many. */
static int nearest(const struct rail_topo *t, int g, struct cand *out, int *all_same)
{
	int n = 0, best = RAIL_TOPO_SYS + 1, rate = -1;

	for (int i = 0; i < t->nnics; i++) /* the nearest relation */
		for (int p = 0; p < t->nics[i].nports; p++)
			if (t->nics[i].ports[p].usable && (int)t->rel[g * t->nnics + i] < best)
				best = (int)t->rel[g * t->nnics + i];
	*all_same = 1;
	for (int i = 0; i < t->nnics; i++) /* the fastest rate at that distance */
		for (int p = 0; p < t->nics[i].nports; p++) {
			if (!t->nics[i].ports[p].usable)
				continue;
			if ((int)t->rel[g * t->nnics + i] != best)
				*all_same = 0;
			else if (t->nics[i].ports[p].rate_mbps > rate)
				rate = t->nics[i].ports[p].rate_mbps;
		}
	for (int i = 0; i < t->nnics; i++)
		for (int p = 0; p < t->nics[i].nports; p++)
			if (t->nics[i].ports[p].usable && (int)t->rel[g * t->nnics + i] == best &&
			    t->nics[i].ports[p].rate_mbps == rate && n < MAX_CAND)
				out[n++] = (struct cand){ i, p, (enum rail_topo_rel)best };
	for (int i = 1; i < n; i++) /* insertion sort: n is small */
		for (int j = i; j > 0 && cmp_cand(t, &out[j - 1], &out[j]) > 0; j--) {
			struct cand tmp = out[j];

			out[j] = out[j - 1];
			out[j - 1] = tmp;
		}
	return n;
}

static int same_set(const struct cand *a, int na, const struct cand *b, int nb)
{
	if (na != nb)
		return 0;
	for (int i = 0; i < na; i++)
		if (a[i].nic != b[i].nic || a[i].port_idx != b[i].port_idx || a[i].rel != b[i].rel)
			return 0;
	return 1;
}

static enum rail_topo_locality locality_of(const struct rail_topo *t, int g, enum rail_topo_rel best,
					   int all_same, const struct cand *c)
{
	const struct rail_topo_nic *nic = &t->nics[c->nic];

	if (best <= RAIL_TOPO_PXB)
		return RAIL_TOPO_LOC_PCIE;
	if (best == RAIL_TOPO_PHB)
		/* Every NIC on the GPU's host bridge and NUMA unknown: a VM's flat tree. */
		return (!all_same || t->gpus[g].numa >= 0) ? RAIL_TOPO_LOC_PCIE : RAIL_TOPO_LOC_NONE;
	if (best == RAIL_TOPO_NODE && t->gpus[g].numa >= 0 && nic->numa == t->gpus[g].numa)
		return RAIL_TOPO_LOC_NUMA;
	return RAIL_TOPO_LOC_NONE;
}

static void explain(const struct rail_topo *t, int g, struct rail_topo_choice *ch, int k, int j,
		    int gsize)
{
	const struct rail_topo_pick *p = &ch->picks[0];
	const struct rail_topo_nic *nic = &t->nics[p->nic];
	char anchor[96];
	int off;

	rail_topo_relation_ex(t->gpus[g].pci_path, t->gpus[g].numa,
			      nic->bdf[0] ? nic->pci_path : NULL, nic->numa, t->nnuma, anchor,
			      sizeof(anchor));
	if (ch->locality == RAIL_TOPO_LOC_NONE && (p->rel <= RAIL_TOPO_NODE || t->gpus[g].numa < 0))
		off = snprintf(ch->reason, sizeof(ch->reason),
			       "locality unknown: flat PCIe tree (every NIC %s, %s), spread by index",
			       rail_topo_rel_name(p->rel), anchor);
	else if (p->rel == RAIL_TOPO_PIX)
		off = snprintf(ch->reason, sizeof(ch->reason), "PIX: same PCIe switch %s", anchor);
	else if (p->rel == RAIL_TOPO_PXB)
		off = snprintf(ch->reason, sizeof(ch->reason), "PXB: same PCIe switch tree under %s",
			       anchor);
	else if (p->rel == RAIL_TOPO_PHB)
		off = snprintf(ch->reason, sizeof(ch->reason), "PHB: same host bridge %s", anchor);
	else if (p->rel == RAIL_TOPO_NODE)
		off = snprintf(ch->reason, sizeof(ch->reason),
			       "NODE: only the NUMA node matches (%s), other host bridge", anchor);
	else
		off = snprintf(ch->reason, sizeof(ch->reason),
			       "SYS: no NIC on this GPU's PCIe tree or NUMA node (%s)", anchor);
	if (off > 0 && (size_t)off < sizeof(ch->reason) && (gsize > 1 || k > 1))
		snprintf(ch->reason + off, sizeof(ch->reason) - (size_t)off,
			 "; %d equally near port%s shared by %d GPU%s, this is GPU %d of them", k,
			 k > 1 ? "s" : "", gsize, gsize > 1 ? "s" : "", j);
}

static void choose_auto(struct rail_topo *t, struct cand (*sets)[MAX_CAND], int *nset,
			int *same)
{
	for (int g = 0; g < t->ngpus; g++)
		nset[g] = nearest(t, g, sets[g], &same[g]);
	for (int g = 0; g < t->ngpus; g++) {
		struct rail_topo_choice *ch = &t->choice[g];
		int k = nset[g], j = 0, gsize = 0;

		memset(ch, 0, sizeof(*ch));
		if (k == 0) {
			ch->locality = RAIL_TOPO_LOC_NONE;
			snprintf(ch->reason, sizeof(ch->reason), "no usable RDMA port");
			continue;
		}
		for (int o = 0; o < t->ngpus; o++)
			if (same_set(sets[o], nset[o], sets[g], k)) {
				if (o < g)
					j++;
				gsize++;
			}
		if (k >= gsize)
			for (int i = j; i < k && ch->npicks < RAIL_TOPO_MAX_PICKS; i += gsize)
				ch->picks[ch->npicks++] = (struct rail_topo_pick){
					sets[g][i].nic, sets[g][i].port_idx, sets[g][i].rel
				};
		else
			ch->picks[ch->npicks++] = (struct rail_topo_pick){
				sets[g][j % k].nic, sets[g][j % k].port_idx, sets[g][j % k].rel
			};
		ch->locality = locality_of(t, g, sets[g][0].rel, same[g], &sets[g][0]);
		explain(t, g, ch, k, j, gsize);
	}
}

/* ---- NCCL_RAIL_GPU_NIC_MAP --------------------------------------------- */

static int find_nic(const struct rail_topo *t, const char *name)
{
	for (int i = 0; i < t->nnics; i++)
		if (!strcmp(t->nics[i].name, name))
			return i;
	return -1;
}

int rail_topo_gpu_index(const struct rail_topo *t, const char *bdf)
{
	char norm[RAIL_TOPO_BDF_LEN];

	if (!t || rail_topo_norm_bdf(bdf, norm, sizeof(norm)))
		return -ENOENT;
	for (int g = 0; g < t->ngpus; g++)
		if (!strcmp(t->gpus[g].bdf, norm))
			return g;
	return -ENOENT;
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

static int add_pick(const struct rail_topo *t, struct rail_topo_choice *ch, int g, int nic, int p)
{
	const struct rail_topo_port *port = &t->nics[nic].ports[p];

	if (!port->usable) {
		RAIL_WARN("NCCL_RAIL_GPU_NIC_MAP: %s:%d (for GPU %s) is %s; not used",
			  t->nics[nic].name, port->port, t->gpus[g].bdf, port->why_not);
		return 0;
	}
	for (int i = 0; i < ch->npicks; i++)
		if (ch->picks[i].nic == nic && ch->picks[i].port_idx == p)
			return 0;
	if (ch->npicks == RAIL_TOPO_MAX_PICKS)
		return 0;
	ch->picks[ch->npicks++] =
		(struct rail_topo_pick){ nic, p, t->rel[g * t->nnics + nic] };
	return 0;
}

/* One "nic[:port]" of an entry for GPU g. */
static int map_nic(const struct rail_topo *t, int g, char *tok, struct rail_topo_choice *ch,
		   char *why, size_t why_len)
{
	char *colon = strchr(tok, ':'), *end;
	int nic, port = -1;

	if (colon) {
		*colon = '\0';
		port = (int)strtol(colon + 1, &end, 10);
		if (end == colon + 1 || *end || port < 1 || port > 255) {
			snprintf(why, why_len, "bad port \"%s\" of %s", colon + 1, tok);
			return -EINVAL;
		}
	}
	nic = find_nic(t, tok);
	for (int i = 0; nic < 0 && port < 0 && i < t->nnetdevs; i++)
		if (!strcmp(t->netdevs[i].name, tok) && t->netdevs[i].ibdev[0]) {
			nic = find_nic(t, t->netdevs[i].ibdev);
			port = t->netdevs[i].ibport;
		}
	if (nic < 0) {
		snprintf(why, why_len, "unknown NIC \"%s\" (not an RDMA device or its netdev here)",
			 tok);
		return -ENODEV;
	}
	for (int p = 0; p < t->nics[nic].nports; p++)
		if (port < 0 || t->nics[nic].ports[p].port == port) {
			add_pick(t, ch, g, nic, p);
			if (port >= 0)
				return 0;
		}
	if (port >= 0) {
		snprintf(why, why_len, "%s has no port %d", tok, port);
		return -ENODEV;
	}
	return 0;
}

/* The GPU of an entry: -ENOENT when this host does not have it (skipped). */
static int map_gpu(const struct rail_topo *t, const char *s, char *why, size_t why_len)
{
	char *end;
	long idx;

	if (*s && strspn(s, "0123456789") == strlen(s)) {
		idx = strtol(s, &end, 10);
		return idx < t->ngpus ? (int)idx : -ENOENT;
	}
	if (rail_topo_norm_bdf(s, (char[RAIL_TOPO_BDF_LEN]){ 0 }, RAIL_TOPO_BDF_LEN)) {
		snprintf(why, why_len, "\"%s\" is not a GPU index or PCI address", s);
		return -EINVAL;
	}
	return rail_topo_gpu_index(t, s);
}

static int map_entry(const struct rail_topo *t, char *entry, struct rail_topo_choice *mapped,
		     char *why, size_t why_len)
{
	char *eq = strchr(entry, '=');
	int g, err;

	if (!eq) {
		snprintf(why, why_len, "entry \"%s\" has no '='", entry);
		return -EINVAL;
	}
	*eq = '\0';
	g = map_gpu(t, trim(entry), why, why_len);
	if (g == -ENOENT) {
		RAIL_INFO(RAIL_LOG_INIT, "NCCL_RAIL_GPU_NIC_MAP: no GPU %s here; entry skipped",
			  trim(entry));
		return 0;
	}
	if (g < 0)
		return g;
	if (mapped[g].from_map) {
		snprintf(why, why_len, "GPU %s is mapped twice", t->gpus[g].bdf);
		return -EINVAL;
	}
	mapped[g].from_map = 1;
	if (!*trim(eq + 1)) {
		snprintf(why, why_len, "GPU %s has no NIC after '='", trim(entry));
		return -EINVAL;
	}
	for (char *tok = eq + 1, *next; tok; tok = next) {
		next = strchr(tok, '+');
		if (next)
			*next++ = '\0';
		tok = trim(tok);
		if (!*tok) {
			snprintf(why, why_len, "empty NIC name for GPU %s", t->gpus[g].bdf);
			return -EINVAL;
		}
		err = map_nic(t, g, tok, &mapped[g], why, why_len);
		if (err)
			return err;
	}
	return 0;
}

static int parse_map(const struct rail_topo *t, const char *spec, struct rail_topo_choice *mapped,
		     char *why, size_t why_len)
{
	char *buf = strdup(spec), *save = NULL;
	int err = 0;

	if (!buf)
		return -ENOMEM;
	for (char *e = strtok_r(buf, ";,", &save); e && !err; e = strtok_r(NULL, ";,", &save))
		if (*trim(e))
			err = map_entry(t, trim(e), mapped, why, why_len);
	free(buf);
	return err;
}

static void apply_map(struct rail_topo *t)
{
	const char *spec = rail_param_str(RAIL_P_GPU_NIC_MAP);
	struct rail_topo_choice *mapped;
	char why[160] = "";
	int err;

	if (!spec[0])
		return;
	t->map_set = 1;
	if (!t->ngpus) {
		snprintf(t->map_status, sizeof(t->map_status), "no GPU on this host");
		return;
	}
	mapped = calloc((size_t)t->ngpus, sizeof(*mapped));
	if (!mapped)
		return;
	err = parse_map(t, spec, mapped, why, sizeof(why));
	if (err) {
		snprintf(t->map_status, sizeof(t->map_status), "ignored: %s", why);
		RAIL_WARN("NCCL_RAIL_GPU_NIC_MAP=\"%s\" ignored: %s; expected gpu=nic[:port][+nic...] "
			  "entries separated by ';', e.g. "
			  "0000:1b:00.0=mlx5_0:1+mlx5_1:1;0000:3d:00.0=mlx5_2 or 0=mlx5_0;1=mlx5_1",
			  spec, why);
		rail_topo_add_warn(t, "NCCL_RAIL_GPU_NIC_MAP %s: fix the value (see rail-info --config)",
				   t->map_status);
		free(mapped);
		return;
	}
	t->map_used = 1;
	for (int g = 0; g < t->ngpus; g++) {
		if (!mapped[g].from_map)
			continue;
		if (mapped[g].npicks == 0) {
			rail_topo_add_warn(t, "NCCL_RAIL_GPU_NIC_MAP leaves GPU %s no ACTIVE port: "
					   "using the automatic choice", t->gpus[g].bdf);
			continue;
		}
		mapped[g].locality = t->choice[g].locality;
		snprintf(mapped[g].reason, sizeof(mapped[g].reason),
			 "operator map NCCL_RAIL_GPU_NIC_MAP");
		if (t->choice[g].npicks && mapped[g].picks[0].rel > t->choice[g].picks[0].rel)
			rail_topo_add_warn(t, "NCCL_RAIL_GPU_NIC_MAP gives GPU %s %s (%s) although "
					   "%s is %s: check the map",
					   t->gpus[g].bdf, t->nics[mapped[g].picks[0].nic].name,
					   rail_topo_rel_name(mapped[g].picks[0].rel),
					   t->nics[t->choice[g].picks[0].nic].name,
					   rail_topo_rel_name(t->choice[g].picks[0].rel));
		t->choice[g] = mapped[g];
	}
	free(mapped);
}

/* ---- advice ------------------------------------------------------------ */

static void advise_down(struct rail_topo *t, int g)
{
	char list[160] = "";
	size_t off = 0;

	for (int i = 0; i < t->nnics && off < sizeof(list) - 32; i++)
		for (int p = 0; p < t->nics[i].nports && off < sizeof(list) - 32; p++)
			off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s:%d %s",
						off ? ", " : "", t->nics[i].name,
						t->nics[i].ports[p].port, t->nics[i].ports[p].why_not);
	rail_topo_add_warn(t, "GPU %s has no usable RDMA port (%s): the verbs transport cannot "
			   "serve it; check cables and `ibstat`, and NCCL_IB_HCA", t->gpus[g].bdf,
			   list);
}

static void advise(struct rail_topo *t)
{
	int flat = 0, nousable = 0;
	char example[160] = "";
	size_t off = 0;

	if (!t->ngpus && t->nnics)
		rail_topo_add_warn(t, "no NVIDIA GPU found in sysfs: give other accelerators with "
				   "rail-info --gpus BDF");
	if (t->ngpus && !t->nnics)
		rail_topo_add_warn(t, "no RDMA device in /sys/class/infiniband: NCCL traffic goes "
				   "over TCP and GPUDirect RDMA is impossible; if this host has "
				   "InfiniBand/RoCE NICs, load their RDMA driver (e.g. mlx5_ib)");
	for (int g = 0; g < t->ngpus; g++) {
		const struct rail_topo_choice *ch = &t->choice[g];

		if (ch->npicks == 0) {
			nousable += t->nnics > 0;
			continue;
		}
		if (ch->locality == RAIL_TOPO_LOC_NONE &&
		    (ch->picks[0].rel != RAIL_TOPO_SYS || t->gpus[g].numa < 0))
			flat++;
		else if (ch->picks[0].rel == RAIL_TOPO_SYS && !ch->from_map)
			rail_topo_add_warn(t, "GPU %s has no NIC closer than SYS (nearest %s:%d): "
					   "expect low bandwidth; check NCCL_IB_HCA and which "
					   "slots hold the NICs", t->gpus[g].bdf,
					   t->nics[ch->picks[0].nic].name,
					   t->nics[ch->picks[0].nic].ports[ch->picks[0].port_idx].port);
		if (off < sizeof(example) - 40 && g < 3)
			off += (size_t)snprintf(example + off, sizeof(example) - off, "%s%d=%s:%d",
						off ? ";" : "", g, t->nics[ch->picks[0].nic].name,
						t->nics[ch->picks[0].nic].ports[ch->picks[0].port_idx].port);
	}
	for (int g = 0; nousable && g < t->ngpus; g++)
		if (t->choice[g].npicks == 0) {
			advise_down(t, g);
			break; /* the same ports for every GPU: once is enough */
		}
	if (flat && !t->map_used)
		rail_topo_add_warn(t, "locality unknown on this host for %d GPU%s (flat PCIe tree%s): "
				   "NICs are spread by index; give the real mapping with "
				   "NCCL_RAIL_GPU_NIC_MAP, e.g. \"%s%s\"", flat, flat > 1 ? "s" : "",
				   t->gpus[0].numa < 0 ? ", NUMA node unknown" : "", example,
				   t->ngpus > 3 ? ";..." : "");
}

int rail_topo_choose(struct rail_topo *t)
{
	struct cand(*sets)[MAX_CAND];
	int *nset, *same, err;

	mark_usable(t);
	if (!t->ngpus)
		return (advise(t), 0);
	sets = calloc((size_t)t->ngpus, sizeof(*sets));
	nset = calloc((size_t)t->ngpus, sizeof(int));
	same = calloc((size_t)t->ngpus, sizeof(int));
	if (!sets || !nset || !same) {
		free(sets);
		free(nset);
		free(same);
		return -ENOMEM;
	}
	choose_auto(t, sets, nset, same);
	free(sets);
	free(nset);
	free(same);
	apply_map(t);
	err = rail_topo_fallbacks(t);
	advise(t);
	return err;
}

const struct rail_topo_choice *rail_topo_choice_for_gpu(const struct rail_topo *t,
							 const char *bdf)
{
	int g = rail_topo_gpu_index(t, bdf);

	return g < 0 ? NULL : &t->choice[g];
}

/* ---- rails ------------------------------------------------------------- */

int rail_topo_rail_of_model(const struct rail_topo *t, const char *ibdev, int port, int *rail,
			    int *plane)
{
	int nic = t ? find_nic(t, ibdev) : -1, pidx = -1, next = 0;

	for (int p = 0; nic >= 0 && p < t->nics[nic].nports; p++)
		if (t->nics[nic].ports[p].port == port)
			pidx = p;
	if (pidx < 0)
		return -ENODEV;
	for (int g = 0; g < t->ngpus; g++)
		for (int i = 0; i < t->choice[g].npicks; i++) {
			const struct rail_topo_pick *pk = &t->choice[g].picks[i];
			int seen = 0;

			/* numbered already by an earlier GPU? */
			for (int h = 0; h <= g && !seen; h++)
				for (int j = 0; j < (h == g ? i : t->choice[h].npicks); j++)
					if (t->choice[h].picks[j].nic == pk->nic &&
					    t->choice[h].picks[j].port_idx == pk->port_idx)
						seen = 1;
			if (seen)
				continue;
			if (pk->nic == nic && pk->port_idx == pidx) {
				*rail = next;
				*plane = -1;
				return 0;
			}
			next++;
		}
	*rail = -1;
	*plane = -1;
	return 0;
}

int rail_topo_rail_of(const char *ibdev, int port, int *rail, int *plane)
{
	return rail_topo_rail_of_model(rail_topo_get(), ibdev, port, rail, plane);
}

/* ---- the process's GPU -------------------------------------------------- */

static int gpu_by_uuid(const struct rail_topo *t, const char *uuid)
{
	int found = -ENOENT;

	for (int g = 0; g < t->ngpus; g++) {
		char path[128], info[2048], *line;

		snprintf(path, sizeof(path), "/proc/driver/nvidia/gpus/%s/information",
			 t->gpus[g].bdf);
		if (rail_sysfs_read(path, info, sizeof(info)) <= 0)
			continue;
		line = strstr(info, "GPU UUID:");
		if (!line)
			continue;
		line = trim(line + strlen("GPU UUID:"));
		line[strcspn(line, "\n")] = '\0';
		/* CUDA accepts any unique prefix of the UUID */
		if (!strncasecmp(line, uuid, strlen(uuid))) {
			if (found >= 0)
				return -EINVAL;
			found = g;
		}
	}
	return found;
}

int rail_topo_resolve_gpu(const struct rail_topo *t, const char *spec, char *bdf, size_t len)
{
	char buf[128], *s;
	int g = -ENOENT;

	if (!t || !spec || strlen(spec) >= sizeof(buf))
		return -EINVAL;
	rail_strlcpy(buf, spec, sizeof(buf));
	s = trim(buf);
	if (strchr(s, ',')) { /* a CUDA_VISIBLE_DEVICES list: one device only */
		char *comma = strchr(s, ',');

		if (*trim(comma + 1))
			return -EINVAL;
		*comma = '\0';
		s = trim(s);
	}
	if (!*s)
		return -EINVAL;
	if (!strncasecmp(s, "GPU-", 4)) {
		g = gpu_by_uuid(t, s);
	} else if (!strncasecmp(s, "MIG-", 4)) {
		return -EINVAL;
	} else if (strspn(s, "0123456789") == strlen(s)) {
		long idx = strtol(s, NULL, 10);
		int n = 0;

		for (int i = 0; i < t->ngpus && g < 0; i++)
			if (t->gpus[i].nvidia && n++ == idx)
				g = i;
	} else {
		g = rail_topo_gpu_index(t, s);
		if (g == -ENOENT && rail_topo_norm_bdf(s, (char[RAIL_TOPO_BDF_LEN]){ 0 },
						       RAIL_TOPO_BDF_LEN))
			return -EINVAL;
	}
	if (g < 0)
		return g;
	if (strlen(t->gpus[g].bdf) >= len)
		return -ENAMETOOLONG;
	rail_strlcpy(bdf, t->gpus[g].bdf, len);
	return 0;
}
