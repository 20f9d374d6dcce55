/* nccl-net-rail: subnet-aware routing at connect and accept (rules in ib_subnet.h). */
#include <stdio.h>
#include <string.h>

#include "ib/ib.h"
#include "ib/ib_subnet.h"
#include "log.h"
#include "param.h"
#include "rail.h"

_Static_assert(16 * RAIL_IB_HANDLE_GIDS <= RAIL_HANDLE_PAYLOAD_MAX,
	       "the handle's payload holds the listener's GIDs");

/* The peer's valid RoCE GIDs. */
struct peer_gids {
	int n;
	uint8_t gid[RAIL_MAX_VDEV_DEVS][16];
};

static int routing_on(void)
{
	return rail_param_int(RAIL_P_IB_SUBNET_AWARE_ROUTING) != 0;
}

/* d's GID now (the one its connections use): 0 for a RoCE port with a valid one, else -1. */
static int gid_now(const struct rail_ib_dev *d, uint8_t raw[16])
{
	struct rail_ib_gid_choice g;

	if (d->link_layer != IBV_LINK_LAYER_ETHERNET || rail_ib_dev_gid_resolve(d, &g) ||
	    !rail_ib_gid_valid(g.raw))
		return -1;
	memcpy(raw, g.raw, 16);
	return 0;
}

/* 1: the RoCE port d is on the subnet of one of the peer's GIDs; 0: it is not; -1: not RoCE. */
static int dev_on_peer(const struct rail_ib_dev *d, const struct peer_gids *p, int bits)
{
	struct rail_ib_gid_net net;
	uint8_t g[16];

	if (d->link_layer != IBV_LINK_LAYER_ETHERNET)
		return -1;
	if (gid_now(d, g))
		return 0;
	rail_ib_gid_routing_net(g, bits, &net);
	for (int i = 0; i < p->n; i++)
		if (rail_ib_gid_is_v4(g) == rail_ib_gid_is_v4(p->gid[i]) &&
		    rail_ib_gid_in_net(&net, p->gid[i]))
			return 1;
	return 0;
}

/* Every RoCE port of v is on one of the peer's subnets, and v has one. */
static int vdev_on_peer(const struct rail_ib_vdev *v, const struct peer_gids *p, int bits)
{
	int roce = 0;

	for (int m = 0; m < v->ndevs; m++) {
		int r = dev_on_peer(rail_ib_dev_get(v->devs[m]), p, bits);

		if (r == 0)
			return 0;
		roce += r > 0;
	}
	return roce > 0;
}

/* The memory types (RAIL_PTR_*) every port of v offers. */
static int vdev_ptr(const struct rail_ib_vdev *v)
{
	int ptr = ~0;

	for (int m = 0; m < v->ndevs; m++)
		ptr &= rail_ib_ladder_ptr_support(&rail_ib_dev_get(v->devs[m])->hca->ladder);
	return ptr;
}

/* Every port of v is up and v offers the memory types ptr. */
static int vdev_usable(const struct rail_ib_vdev *v, int ptr)
{
	for (int m = 0; m < v->ndevs; m++)
		if (rail_ib_dev_down(rail_ib_dev_get(v->devs[m])))
			return 0;
	return (vdev_ptr(v) & ptr) == ptr;
}

/* vdev when it is on the peer's subnet; else the device to use instead; -1: none is. */
static int pick(int vdev, const struct rail_ib_vdev *def, const struct peer_gids *p, int bits)
{
	struct rail_ib_dev *first[2][RAIL_IB_MAX_VDEVS], *best;
	int idx[2][RAIL_IB_MAX_VDEVS], n[2] = { 0, 0 }, ptr, k;

	if (vdev_on_peer(def, p, bits))
		return vdev;
	ptr = vdev_ptr(def);
	for (int i = 0; i < rail_ib_ndevs(); i++) {
		const struct rail_ib_vdev *v = rail_ib_vdev_get(i);

		if (i == vdev || !v || !vdev_usable(v, ptr) || !vdev_on_peer(v, p, bits))
			continue;
		k = v->ndevs == def->ndevs ? 0 : 1;	/* as many ports as NCCL's first */
		first[k][n[k]] = rail_ib_dev_get(v->devs[0]);
		idx[k][n[k]++] = i;
	}
	k = n[0] ? 0 : 1;
	best = rail_ib_dev_nearest(rail_ib_dev_get(def->devs[0]), first[k], n[k]);
	for (int i = 0; i < n[k]; i++)
		if (first[k][i] == best)
			return idx[k][i];
	return -1;
}

/* Append the subnet of g ("10.1.0.0/24") to buf, comma-separated. */
static void nets_add(char *buf, size_t len, const uint8_t g[16], int bits)
{
	struct rail_ib_gid_net net;
	size_t used = strlen(buf);
	char s[80];

	rail_ib_gid_routing_net(g, bits, &net);
	rail_ib_gid_net_str(&net, s, sizeof(s));
	if (used < len && !strstr(buf, s))
		snprintf(buf + used, len - used, "%s%s", used ? "," : "", s);
}

static const char *vdev_nets(const struct rail_ib_vdev *v, int bits, char *buf, size_t len)
{
	uint8_t g[16];

	buf[0] = '\0';
	for (int m = 0; m < v->ndevs; m++)
		if (!gid_now(rail_ib_dev_get(v->devs[m]), g))
			nets_add(buf, len, g, bits);
	return buf[0] ? buf : "no RoCE GID";
}

static int route(int vdev, const struct peer_gids *p, const char *what, const char *peer)
{
	const struct rail_ib_vdev *def = rail_ib_vdev_get(vdev), *v;
	int bits = (int)rail_param_int(RAIL_P_IB_SUBNET_PREFIX_LEN), to;
	char mine[200], theirs[200], there[200];

	if (!def || !p->n)
		return vdev;	/* nothing to compare: an InfiniBand peer, a handle without GIDs */
	to = pick(vdev, def, p, bits);
	if (to == vdev)
		return vdev;
	theirs[0] = '\0';
	for (int i = 0; i < p->n; i++)
		nets_add(theirs, sizeof(theirs), p->gid[i], bits);
	vdev_nets(def, bits, mine, sizeof(mine));
	v = to < 0 ? NULL : rail_ib_vdev_get(to);
	if (!v) {
		RAIL_INFO(RAIL_LOG_NET, "%s peer %s: NCCL_IB_SUBNET_AWARE_ROUTING: no usable "
			  "local device is on the peer's subnet (%s); device %d (%s, on %s) is "
			  "used as NCCL chose", what, peer, theirs, vdev, def->name, mine);
		return vdev;
	}
	RAIL_INFO(RAIL_LOG_NET, "%s peer %s: NCCL_IB_SUBNET_AWARE_ROUTING: device %d (%s, on %s) "
		  "is not on the peer's subnet (%s); using device %d (%s, on %s)", what, peer, vdev,
		  def->name, mine, theirs, to, v->name, vdev_nets(v, bits, there, sizeof(there)));
	return to;
}

static void peer_add(struct peer_gids *p, const uint8_t g[16])
{
	if (p->n < RAIL_MAX_VDEV_DEVS && rail_ib_gid_valid(g))
		memcpy(p->gid[p->n++], g, 16);
}

void rail_ib_subnet_handle(int vdev, struct rail_handle *h)
{
	const struct rail_ib_vdev *v = rail_ib_vdev_get(vdev);
	uint8_t g[RAIL_IB_HANDLE_GIDS][16];
	int n = 0;

	if (!routing_on() || !v)
		return;
	for (int m = 0; m < v->ndevs && n < RAIL_IB_HANDLE_GIDS; m++)
		if (!gid_now(rail_ib_dev_get(v->devs[m]), g[n]))
			n++;
	h->payload_len = (uint16_t)rail_ib_handle_gids_encode(g, n, h->payload);
}

int rail_ib_subnet_connect_dev(int vdev, const struct rail_handle *h, const char *peer)
{
	uint8_t g[RAIL_IB_HANDLE_GIDS][16];
	struct peer_gids p = { 0 };
	int n;

	if (!routing_on())
		return vdev;
	n = rail_ib_handle_gids_decode(h->payload, h->payload_len, g);
	if (n < 0) {
		RAIL_INFO(RAIL_LOG_NET, "connect to peer %s: NCCL_IB_SUBNET_AWARE_ROUTING: the "
			  "listener's handle carries %u bytes that are not a GID list; device %d "
			  "is used as NCCL chose", peer, (unsigned)h->payload_len, vdev);
		return vdev;
	}
	for (int i = 0; i < n; i++)
		peer_add(&p, g[i]);
	return route(vdev, &p, "connect to", peer);
}

int rail_ib_subnet_accept_dev(int vdev, const struct rail_ib_msg *hello, const char *peer)
{
	struct peer_gids p = { 0 };

	if (!routing_on())
		return vdev;
	for (int i = 0; i < hello->ndevs; i++)
		if (hello->devs[i].link_layer == IBV_LINK_LAYER_ETHERNET)
			peer_add(&p, hello->devs[i].gid);
	return route(vdev, &p, "accept from", peer);
}
