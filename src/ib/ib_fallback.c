/*
 * nccl-net-rail: the device a verbs comm's member moves to (layer 1.3 of
 * src/ib/, ib.h; docs/FAILOVER.md, "Fallback"), and the devices on a
 * peer's network. The rules that decide when to move and whether to use
 * these are ib_move.c's.
 *
 * Fallback of a device d: a usable port (ACTIVE as the async thread last
 * saw it, HCA alive) of d's link layer other than d.
 *   1. The topology model's per-GPU fallback (src/topo/topo_fallback.c)
 *      of the GPU whose first choice is d (the process's GPU when that
 *      one's): nearest to the GPU on PCIe (GPUDirect RDMA stays within
 *      NCCL_NET_GDR_LEVEL), then on another card, then the least loaded,
 *      then the fastest. The model knows GPUs; the move knows only d.
 *   2. Else (no GPU in the model, d no GPU's first choice, or that
 *      fallback not usable now): the nearest to d on PCIe by the longest
 *      common prefix of their sysfs paths (the other port of the card,
 *      then a device under the same switch, the same root port...), then
 *      table order.
 */
#include <stdio.h>
#include <string.h>

#include "gpu.h"
#include "ib/ib.h"
#include "rail.h"
#include "topo/topo.h"

static size_t common_prefix(const char *a, const char *b)
{
	size_t n = 0;

	while (a[n] && a[n] == b[n])
		n++;
	return n;
}

int rail_ib_dev_down(const struct rail_ib_dev *d)
{
	return atomic_load(&d->port_err) || atomic_load(&d->hca->fatal);
}

struct rail_ib_dev *rail_ib_dev_nearest(const struct rail_ib_dev *d, struct rail_ib_dev *const *v,
					int n)
{
	struct rail_ib_dev *best = NULL;
	size_t best_len = 0;

	for (int i = 0; i < n; i++) {
		size_t len = common_prefix(v[i]->pci_path, d->pci_path);

		if (!best || len > best_len) {
			best = v[i];
			best_len = len;
		}
	}
	return best;
}

/* A usable port of d's link layer, not d. */
static int usable_for(const struct rail_ib_dev *o, const struct rail_ib_dev *d)
{
	return o && o != d && !rail_ib_dev_down(o) && o->link_layer == d->link_layer;
}

/* Rule 1: the topology's, if it has one and it is usable now. */
static struct rail_ib_dev *topo_fallback(const struct rail_ib_dev *d, char *why, size_t len)
{
	char gpu[32], name[RAIL_IB_NAME_MAX], reason[160];
	int port = 0;

	if (rail_current_gpu_bdf(gpu, sizeof(gpu)))
		gpu[0] = '\0';
	if (rail_topo_fallback_of(d->hca->name, d->port, gpu[0] ? gpu : NULL, name, sizeof(name),
				  &port, reason, sizeof(reason)))
		return NULL;
	for (int i = 0; i < rail_ib_ndevs_phys(); i++) {
		struct rail_ib_dev *o = rail_ib_dev_get(i);

		if (o && o->port == port && !strcmp(o->hca->name, name) && usable_for(o, d)) {
			snprintf(why, len, "%s", reason);
			return o;
		}
	}
	return NULL;
}

struct rail_ib_dev *rail_ib_dev_fallback(const struct rail_ib_dev *d, char *why, size_t len)
{
	struct rail_ib_dev *v[RAIL_IB_MAX_DEVS], *best = topo_fallback(d, why, len);
	int n = 0;

	if (best)
		return best;
	for (int i = 0; i < rail_ib_ndevs_phys() && n < RAIL_IB_MAX_DEVS; i++) {
		struct rail_ib_dev *o = rail_ib_dev_get(i);

		if (usable_for(o, d))
			v[n++] = o;
	}
	best = rail_ib_dev_nearest(d, v, n);
	if (best)
		snprintf(why, len, "the nearest to %s:%d by PCI path", d->hca->name, d->port);
	return best;
}

int rail_ib_dev_reaches(const struct rail_ib_dev *d, const uint8_t *peer_gid,
			struct rail_ib_gid_net *net)
{
	struct rail_ib_gid_choice g;

	if (rail_ib_dev_gid_resolve(d, &g))
		return 0;
	rail_ib_gid_net(g.raw, d->link_layer != IBV_LINK_LAYER_ETHERNET, net);
	return rail_ib_gid_in_net(net, peer_gid);
}

struct rail_ib_dev *rail_ib_dev_on_net(const struct rail_ib_dev *to, const uint8_t *peer_gid,
				       struct rail_ib_gid_net *net)
{
	struct rail_ib_dev *v[RAIL_IB_MAX_DEVS], *best;
	int nv = 0;

	for (int i = 0; i < rail_ib_ndevs_phys() && nv < RAIL_IB_MAX_DEVS; i++) {
		struct rail_ib_dev *o = rail_ib_dev_get(i);
		struct rail_ib_gid_net on;

		if (usable_for(o, to) && rail_ib_dev_reaches(o, peer_gid, &on))
			v[nv++] = o;
	}
	best = rail_ib_dev_nearest(to, v, nv);
	if (best)
		(void)rail_ib_dev_reaches(best, peer_gid, net);
	return best;
}
