/*
 * nccl-net-rail: where a moving verbs comm's member goes (layer 1.3 of
 * src/ib/, ib.h; docs/FAILOVER.md): home, where it is, a fused comm's
 * surviving member, the fallback device, a device on the peer's network.
 * How a move runs, and the rules that need the move's state (the second
 * path failure: leave the devices; following the peer to its rail), are
 * ib_move.c's.
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
#include "param.h"
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

/* ---- home, where it is, a survivor ------------------------------------------- */

/* Member m's port went down since it was built (PORT_ERR), or is down. */
int rail_ib_member_down(const struct rail_ib_comm *c, int m)
{
	const struct rail_ib_devres *r = &c->res[m];

	return atomic_load(&r->dev->port_downs) != r->port_gen || atomic_load(&r->dev->port_err) ||
	       atomic_load(&r->dev->hca->fatal);
}

int rail_ib_own_port_down(const struct rail_ib_comm *c)
{
	for (int m = 0; m < c->ndevs; m++)
		if (rail_ib_member_down(c, m))
			return 1;
	return 0;
}

/*
 * Seconds the homes of the members away from home have all been up (the
 * least), or -1 while one of them is down (or every member is at home).
 */
int64_t rail_ib_home_up_s(const struct rail_ib_comm *c)
{
	uint64_t now = rail_now_ns();
	int64_t least = -1;

	for (int m = 0; m < c->ndevs; m++) {
		const struct rail_ib_dev *h = c->home[m];
		uint64_t up = atomic_load(&h->up_ns);
		int64_t s;

		if (h == c->res[m].dev)
			continue;
		if (rail_ib_dev_down(h) || !up)
			return -1;
		s = (int64_t)((now - up) / 1000000000ull);
		if (least < 0 || s < least)
			least = s;
	}
	return least;
}

/*
 * Home is ready: every member away has had its home up for the hold-down
 * (its PORT_ACTIVE's stamp), not while the comm sits where it followed the
 * peer to (follow_peer: its home is fine, and the peer, whose own home may
 * still be down, is where this side can reach it; when the peer moves
 * back, this side follows); or a probe of the way home passed
 * (ib_probe.c: a move made with the port up has no port event to wait
 * for) and the comm is away.
 */
int rail_ib_home_verified(const struct rail_ib_comm *c)
{
	return c->back.verified_ns && rail_now_ns() - c->back.verified_ns < RAIL_IB_VERIFIED_NS;
}

int rail_ib_home_ready(const struct rail_ib_comm *c)
{
	int64_t up;

	if (rail_ib_home_verified(c)) {
		for (int m = 0; m < c->ndevs; m++)
			if (rail_ib_dev_down(c->home[m]))
				return 0;
		return rail_ib_away(c);
	}
	up = rail_ib_home_up_s(c);
	return !c->follows && up >= 0 && up >= rail_param_int(RAIL_P_FAILOVER_HOLDDOWN);
}

/*
 * A fused comm's member whose port is down: the device of a surviving
 * member (port up) nearest to d on PCIe (the other port of the card
 * first), where the comm's buffers are registered already. NULL if none.
 */
static struct rail_ib_dev *survivor_dev(const struct rail_ib_comm *c, const struct rail_ib_dev *d)
{
	struct rail_ib_dev *v[RAIL_MAX_VDEV_DEVS];
	int n = 0;

	for (int k = 0; k < c->ndevs; k++)
		if (c->res[k].dev != d && !rail_ib_member_down(c, k) && !rail_ib_dev_down(c->res[k].dev))
			v[n++] = c->res[k].dev;
	return rail_ib_dev_nearest(d, v, n);
}

/*
 * Where member m of this side goes: home once every member away has had
 * its home up for the hold-down, or a probe found the way home working;
 * else where it is while that works (avoid clear); else its home if it is
 * up at all (avoid clear); else a surviving member's device; else the
 * fallback of where it is (rail_ib_dev_fallback; why says which rule chose it);
 * else, avoiding a device whose port is up, that device after all (new
 * QPs, as the first time).
 */
struct rail_ib_dev *rail_ib_pick_target(const struct rail_ib_comm *c, int m, int avoid, char *why,
					size_t len)
{
	struct rail_ib_dev *d = c->res[m].dev, *s;

	if (rail_ib_home_ready(c) && !rail_ib_dev_down(c->home[m]))
		return c->home[m];
	if (!rail_ib_member_down(c, m) && !avoid)
		return d;
	if (!avoid && c->home[m] != d && !rail_ib_dev_down(c->home[m]))
		return c->home[m];
	s = survivor_dev(c, d);
	if (!s)
		s = rail_ib_dev_fallback(d, why, len);
	return s ? s : avoid && !rail_ib_member_down(c, m) ? d : NULL;
}
