/*
 * nccl-net-rail: rail-info's view of the verbs side. It runs the same
 * decisions as the transport (rail_ib_port_check, rail_ib_gid_table +
 * rail_ib_gid_choose with the environment's parameters, rail_ib_ladder_decide)
 * on devices it opens itself, so it works with or without an initialised
 * transport, and prints their reasons.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ib/ib.h"
#include "ib/ib_report.h"
#include "log.h"
#include "param.h"
#include "rail.h"

struct out {
	FILE *f;
	int json;
};

static void jstr(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", (unsigned char)*s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static const char *state_str(int s)
{
	static const char *const names[] = { "NOP", "DOWN", "INIT", "ARMED", "ACTIVE",
					     "ACTIVE_DEFER" };

	return s >= 0 && s < (int)RAIL_ARRAY_SIZE(names) ? names[s] : "unknown";
}

static const char *gid_type(const struct rail_ib_gid_entry *e, char *buf, size_t len)
{
	if (!e->valid)
		snprintf(buf, len, "%s", "");
	else if (e->type_err)
		snprintf(buf, len, "type unreadable: %s", RAIL_ERRSTR(e->type_err));
	else
		snprintf(buf, len, "RoCE v%d", e->roce_version);
	return buf;
}

static void report_gids(struct out *o, const char *hca, int port, int tbl_len)
{
	struct rail_ib_gid_entry *tab = calloc(RAIL_IB_GID_MAX, sizeof(*tab));
	struct rail_ib_gid_params p;
	struct rail_ib_gid_choice c;
	char t[96];
	int n;

	if (!tab)
		return;
	rail_ib_gid_params_from_env(&p);
	n = rail_ib_gid_table(hca, port, tbl_len, tab, RAIL_IB_GID_MAX);
	rail_ib_gid_choose(tab, n < 0 ? 0 : n, &p, &c);
	if (o->json)
		fprintf(o->f, ", \"gids\": [");
	else if (n < 0)
		fprintf(o->f, "    GID table: unreadable from sysfs: %s\n", RAIL_ERRSTR(n));
	for (int i = 0, first = 1; i < n; i++) {
		const struct rail_ib_gid_entry *e = &tab[i];
		static const uint8_t zero[16];

		if (!memcmp(e->raw, zero, 16))
			continue;
		if (o->json) {
			fprintf(o->f, "%s{\"index\": %d, \"gid\": ", first ? "" : ", ", e->index);
			jstr(o->f, e->text);
			fprintf(o->f, ", \"valid\": %s, \"type\": ", e->valid ? "true" : "false");
			jstr(o->f, gid_type(e, t, sizeof(t)));
			fprintf(o->f, "}");
		} else {
			if (first)
				fprintf(o->f, "    GID table:\n");
			fprintf(o->f, "      [%d] %-40s %s%s%s\n", e->index, e->text,
				gid_type(e, t, sizeof(t)), e->valid ? "" : "(zero or link-local: never chosen)",
				e->index == c.index ? "  <= chosen" : "");
		}
		first = 0;
	}
	if (o->json) {
		fprintf(o->f, "], \"gid_chosen\": %d, \"gid_reason\": ", c.index);
		jstr(o->f, c.reason);
	} else {
		fprintf(o->f, "    chosen GID: %d (%s)\n", c.index, c.reason);
	}
	free(tab);
}

static void report_port(struct out *o, struct ibv_context *ctx, const char *hca, int port,
			int first)
{
	struct rail_ib_port_info pi;
	const struct ibv_port_attr *a = &pi.attr;
	int speed;

	rail_ib_port_check(ctx, hca, port, &pi, NULL);
	speed = pi.speed;
	if (o->json) {
		fprintf(o->f, "%s{\"port\": %d, \"state\": \"%s\", \"link_layer\": \"%s\", "
			"\"speed_mbps\": %d, \"active_mtu\": %d, \"max_mtu\": %d, \"lid\": %u, "
			"\"used\": %s, \"reason\": ", first ? "" : ", ", port, state_str(a->state),
			rail_link_layer_str(a->link_layer), speed, rail_ib_mtu_bytes(a->active_mtu),
			rail_ib_mtu_bytes(a->max_mtu), a->lid, pi.kept ? "true" : "false");
		jstr(o->f, pi.why);
	} else {
		fprintf(o->f, "  port %d: %s, %s, %d Mbps, MTU %d (max %d), LID %u: %s%s\n", port,
			state_str(a->state), rail_link_layer_str(a->link_layer), speed,
			rail_ib_mtu_bytes(a->active_mtu), rail_ib_mtu_bytes(a->max_mtu), a->lid,
			pi.kept ? "used" : "not used: ", pi.why);
	}
	if (a->link_layer == IBV_LINK_LAYER_ETHERNET)
		report_gids(o, hca, port, a->gid_tbl_len);
	if (o->json)
		fprintf(o->f, "}");
}

static void report_ladder(struct out *o, struct rail_ib_hca *h)
{
	struct rail_ib_ladder l;

	rail_ib_ladder_decide(h, &l);
	if (o->json) {
		fprintf(o->f, ", \"gpu_memory\": {\"result\": ");
		jstr(o->f, l.summary);
		fprintf(o->f, ", \"dmabuf\": %s, \"dmabuf_check\": ", l.dmabuf ? "true" : "false");
		jstr(o->f, l.dmabuf_why);
		fprintf(o->f, ", \"peermem\": %s, \"peermem_check\": ", l.peermem ? "true" : "false");
		jstr(o->f, l.peermem_why);
		fprintf(o->f, ", \"ptr_support\": %d}", rail_ib_ladder_ptr_support(&l));
	} else {
		fprintf(o->f, "  GPU memory: %s\n    1. DMA-BUF: %s: %s\n    2. peermem: %s: %s\n"
			"    3. host memory: always\n", l.summary, l.dmabuf ? "yes" : "no",
			l.dmabuf_why, l.peermem ? "yes" : "no", l.peermem_why);
	}
}

static void report_device(struct out *o, struct ibv_device *d, int first)
{
	struct rail_ib_hca h;

	memset(&h, 0, sizeof(h));
	rail_strlcpy(h.name, rail_ibv.get_device_name(d), sizeof(h.name));
	if (o->json) {
		fprintf(o->f, "%s{\"name\": ", first ? "" : ", ");
		jstr(o->f, h.name);
	} else {
		fprintf(o->f, "%s:\n", h.name);
	}
	h.ctx = rail_ibv.open_device(d);
	if (!h.ctx || rail_ibv.query_device(h.ctx, &h.attr)) {
		if (o->json)
			fprintf(o->f, ", \"error\": \"cannot open or query the device\"}");
		else
			fprintf(o->f, "  cannot open or query the device: %s\n", RAIL_ERRSTR(-errno));
		goto out;
	}
	h.pd = rail_ibv.alloc_pd(h.ctx);
	if (o->json)
		fprintf(o->f, ", \"ports\": [");
	for (int p = 1; p <= h.attr.phys_port_cnt; p++)
		report_port(o, h.ctx, h.name, p, p == 1);
	if (o->json)
		fprintf(o->f, "]");
	if (h.pd)
		report_ladder(o, &h);
	if (o->json)
		fprintf(o->f, "}");
out:
	if (h.pd)
		rail_ibv.dealloc_pd(h.pd);
	if (h.ctx)
		rail_ibv.close_device(h.ctx);
}

void rail_ib_report(FILE *f, int json)
{
	struct out o = { .f = f, .json = json };
	struct ibv_device **list, **order = NULL;
	char why[256] = "";
	int n = 0;

	rail_params_load();
	if (rail_verbs_load(why, sizeof(why))) {
		if (json) {
			fprintf(f, "{\"library_loaded\": false, \"library_error\": ");
			jstr(f, why);
			fprintf(f, ", \"devices\": []}");
		} else {
			fprintf(f, "verbs transport unavailable: %s\n", why);
		}
		return;
	}
	rail_ib_hca_filter_load();
	list = rail_ibv.get_device_list(&n);
	if (json)
		fprintf(f, "{\"library_loaded\": true, \"library_error\": \"\", \"devices\": [");
	else if (n <= 0)
		fprintf(f, "verbs transport: no RDMA device\n");
	if (list)
		order = rail_ib_dev_order(list, n);
	for (int i = 0; list && i < n; i++)
		report_device(&o, order ? order[i] : list[i], i == 0);
	free(order);
	if (json)
		fprintf(f, "]}");
	if (list)
		rail_ibv.free_device_list(list);
	rail_verbs_unload();
}
