/*
 * nccl-net-rail: each GPU's fallback NIC port, where its connections would
 * go when its chosen port fails (docs/FAILOVER.md, section 2).
 *
 * Among the usable ports with the link layer of the GPU's first choice,
 * not chosen for it already:
 *   1. the nearest to the GPU (PIX before PXB ... before SYS): NCCL uses
 *      GPUDirect RDMA only up to NCCL_NET_GDR_LEVEL (PXB by default), so a
 *      farther port stages every byte through host memory;
 *   2. among equally near ones, a port on another card: it survives a
 *      card failure of the first choice, where the other port of the same
 *      card survives only the more common cable, transceiver and
 *      switch-port failures;
 *   3. then the one with the fewest GPUs on it (chosen first, or as an
 *      earlier GPU's fallback), so the GPUs of one NUMA node do not all
 *      fall back on the same NIC;
 *   4. then the fastest, then by PCI address, name and port.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rail.h"
#include "topo/topo_internal.h"

/* The card of a NIC: its (physical function's) PCI address without the function. */
static void card_of(const struct rail_topo_nic *nic, char *out, size_t len)
{
	const char *bdf = nic->is_vf && nic->pf_bdf[0] ? nic->pf_bdf : nic->bdf;
	const char *dot = strrchr(bdf, '.');

	if (!bdf[0]) {	/* not PCI (rxe, siw): a device of its own */
		snprintf(out, len, "%s", nic->name);
		return;
	}
	snprintf(out, len, "%.*s", dot ? (int)(dot - bdf) : (int)strlen(bdf), bdf);
}

/* How many GPUs chose port p of NIC n among their first choices. */
static int chosen_by(const struct rail_topo *t, int n, int p)
{
	int k = 0;

	for (int g = 0; g < t->ngpus; g++)
		for (int i = 0; i < t->choice[g].npicks; i++)
			k += t->choice[g].picks[i].nic == n && t->choice[g].picks[i].port_idx == p;
	return k;
}

struct fb_cand {
	int nic, port_idx, other_card, rel, load, fb, rate;
};

/* < 0: a is the better fallback. */
static int fb_cmp(const struct rail_topo *t, const struct fb_cand *a, const struct fb_cand *b)
{
	const struct rail_topo_nic *na = &t->nics[a->nic], *nb = &t->nics[b->nic];
	int c;

	if (a->rel != b->rel)
		return a->rel - b->rel;
	if (a->other_card != b->other_card)
		return b->other_card - a->other_card;
	if (a->load + a->fb != b->load + b->fb)
		return a->load + a->fb - b->load - b->fb;
	if (a->rate != b->rate)
		return b->rate - a->rate;
	c = strcmp(na->bdf, nb->bdf);
	if (!c)
		c = rail_topo_natcmp(na->name, nb->name);
	return c ? c : a->port_idx - b->port_idx;
}

static int is_pick(const struct rail_topo_choice *ch, int n, int p)
{
	for (int i = 0; i < ch->npicks; i++)
		if (ch->picks[i].nic == n && ch->picks[i].port_idx == p)
			return 1;
	return 0;
}

static void explain(struct rail_topo_choice *ch,
		    const struct fb_cand *b, const char *first, const char *ll)
{
	if (!ch->has_fallback) {
		snprintf(ch->fallback_reason, sizeof(ch->fallback_reason),
			 "none: no other usable %s port; a failure of %s leaves this GPU without "
			 "RDMA", ll[0] ? ll : "RDMA", first);
		return;
	}
	snprintf(ch->fallback_reason, sizeof(ch->fallback_reason),
		 "%s, %s; first choice of %d GPU%s, fallback of %d before this one",
		 rail_topo_rel_name((enum rail_topo_rel)b->rel),
		 b->other_card ? "on another card (survives a card, cable or switch-port failure "
				 "of the first choice)"
			       : "the other port of the first choice's card (survives a cable or "
				 "switch-port failure, not a card failure)",
		 b->load, b->load == 1 ? "" : "s", b->fb);
}

/* fb[n * RAIL_TOPO_MAX_PORTS + p]: GPUs before g that fall back on port p of NIC n. */
static void fallback_one(struct rail_topo *t, int g, int *fb)
{
	struct rail_topo_choice *ch = &t->choice[g];
	const struct rail_topo_nic *first;
	const struct rail_topo_port *fport;
	struct fb_cand best = { .nic = -1 };
	char fcard[RAIL_TOPO_BDF_LEN + RAIL_TOPO_NAME_LEN], card[sizeof(fcard)], fname[80];

	ch->has_fallback = 0;
	if (!ch->npicks) {
		snprintf(ch->fallback_reason, sizeof(ch->fallback_reason), "none: no first choice");
		return;
	}
	first = &t->nics[ch->picks[0].nic];
	fport = &first->ports[ch->picks[0].port_idx];
	card_of(first, fcard, sizeof(fcard));
	snprintf(fname, sizeof(fname), "%s:%d", first->name, fport->port);
	for (int n = 0; n < t->nnics; n++) {
		card_of(&t->nics[n], card, sizeof(card));
		for (int p = 0; p < t->nics[n].nports; p++) {
			const struct rail_topo_port *port = &t->nics[n].ports[p];
			struct fb_cand c = { n, p, strcmp(card, fcard) != 0,
					     (int)t->rel[g * t->nnics + n], chosen_by(t, n, p),
					     fb[n * RAIL_TOPO_MAX_PORTS + p], port->rate_mbps };

			if (!port->usable || is_pick(ch, n, p) ||
			    strcmp(port->link_layer, fport->link_layer))
				continue;
			if (best.nic < 0 || fb_cmp(t, &c, &best) < 0)
				best = c;
		}
	}
	if (best.nic >= 0) {
		ch->has_fallback = 1;
		ch->fallback = (struct rail_topo_pick){ best.nic, best.port_idx,
							(enum rail_topo_rel)best.rel };
		fb[best.nic * RAIL_TOPO_MAX_PORTS + best.port_idx]++;
	}
	explain(ch, &best, fname, fport->link_layer);
}

int rail_topo_fallbacks(struct rail_topo *t)
{
	int *fb = calloc((size_t)t->nnics * RAIL_TOPO_MAX_PORTS + 1, sizeof(int));

	if (!fb)
		return -ENOMEM;
	for (int g = 0; g < t->ngpus; g++)
		fallback_one(t, g, fb);
	free(fb);
	return 0;
}

/* GPU g's first choice is port `port` of NIC `name` and it has a fallback. */
static int falls_from(const struct rail_topo *t, int g, const char *name, int port)
{
	const struct rail_topo_choice *ch = &t->choice[g];
	const struct rail_topo_nic *n;

	if (!ch->npicks || !ch->has_fallback)
		return 0;
	n = &t->nics[ch->picks[0].nic];
	return !strcmp(n->name, name) && n->ports[ch->picks[0].port_idx].port == port;
}

int rail_topo_fallback_of_model(const struct rail_topo *t, const char *ibdev, int port,
				const char *gpu, char *fb_ibdev, size_t len, int *fb_port,
				char *why, size_t why_len)
{
	int g = gpu && t ? rail_topo_gpu_index(t, gpu) : -1;
	const struct rail_topo_choice *ch;
	const struct rail_topo_nic *first, *fb;
	char c1[RAIL_TOPO_BDF_LEN + RAIL_TOPO_NAME_LEN], c2[sizeof(c1)];

	if (!t)
		return -ENOENT;
	if (g < 0 || !falls_from(t, g, ibdev, port))
		for (g = 0; g < t->ngpus && !falls_from(t, g, ibdev, port); g++)
			;
	if (g >= t->ngpus)
		return -ENOENT;
	ch = &t->choice[g];
	first = &t->nics[ch->picks[0].nic];
	fb = &t->nics[ch->fallback.nic];
	if (strlen(fb->name) >= len)
		return -ENAMETOOLONG;
	card_of(first, c1, sizeof(c1));
	card_of(fb, c2, sizeof(c2));
	rail_strlcpy(fb_ibdev, fb->name, len);
	*fb_port = fb->ports[ch->fallback.port_idx].port;
	snprintf(why, why_len, "the topology's fallback for GPU %s: %s, %s", t->gpus[g].bdf,
		 rail_topo_rel_name(ch->fallback.rel), strcmp(c1, c2) ? "another card" : "same card");
	return 0;
}

int rail_topo_fallback_of(const char *ibdev, int port, const char *gpu, char *fb_ibdev,
			  size_t len, int *fb_port, char *why, size_t why_len)
{
	return rail_topo_fallback_of_model(rail_topo_get(), ibdev, port, gpu, fb_ibdev, len, fb_port,
					   why, why_len);
}
