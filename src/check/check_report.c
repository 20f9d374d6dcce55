/*
 * rail-check's verdict: the checks that need no traffic (plugin version and
 * wire formats, the transport, the settings that must agree, device counts
 * per rail, and per device pair GID type, subnet and MTU), then the matrix
 * (rows: this host:device, columns: peer host:device) with latency and
 * bandwidth or the failed step, and the failing pairs named by host, NIC
 * and GID with the reason and what to try; or all of it as JSON.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "rail.h"
#include "check/check.h"

/*
 * Settings that change the wire or the choice of GID and that the
 * handshakes do not negotiate: a difference is a failure. The others in
 * info.c's list are negotiated or local: a difference is a note.
 */
static const char *const strict[] = {
	"NCCL_IB_GID_INDEX", "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_ADDR_FAMILY",
	"NCCL_IB_ADDR_RANGE", "NCCL_IB_TC", "NCCL_IB_SL", "NCCL_IB_PKEY", "NCCL_RAIL_IB_EAGER",
};

void rail_ck_catf(char *buf, size_t len, const char *fmt, ...)
{
	size_t n = strnlen(buf, len);
	va_list ap;

	if (n + 1 >= len)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + n, len - n, fmt, ap);
	va_end(ap);
}

void rail_ck_problem(struct rail_ck_report *r, int fatal, const char *what, const char *fmt, ...)
{
	struct rail_ck_problem *p;
	va_list ap;

	if (r->nprobs >= (int)RAIL_ARRAY_SIZE(r->probs))
		return;
	p = &r->probs[r->nprobs++];
	p->fatal = fatal;
	rail_strlcpy(p->what, what, sizeof(p->what));
	va_start(ap, fmt);
	vsnprintf(p->text, sizeof(p->text), fmt, ap);
	va_end(ap);
	r->nfail += fatal;
}

static int is_strict(const char *name)
{
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(strict); i++)
		if (!strcmp(strict[i], name))
			return 1;
	return 0;
}

/* Does the setting matter for this transport? */
static int relevant(const char *name, const char *transport)
{
	int ib = !strncmp(name, "NCCL_IB_", 8) || !strncmp(name, "NCCL_RAIL_IB_", 13);
	int tcp = !strncmp(name, "NCCL_SOCKET_", 12) || !strncmp(name, "NCCL_NSOCKS", 11) ||
		  !strncmp(name, "NCCL_RAIL_TCP_", 14);

	return ib ? !strcmp(transport, "ib") : tcp ? !strcmp(transport, "tcp") : 1;
}

static void check_config(struct rail_ck_report *r, const struct rail_ck_info *a,
			 const struct rail_ck_info *b)
{
	for (int i = 0; i < a->nconf; i++) {
		const char *n = a->conf[i].name, *bv = rail_ck_conf_get(b, n);

		if (!bv || !strcmp(bv, a->conf[i].value) || !relevant(n, a->transport))
			continue;
		rail_ck_problem(r, is_strict(n), "config", "%s differs: %s on %s (rank %d), %s on %s "
			   "(rank %d)%s", n, a->conf[i].value, a->host, a->rank, bv, b->host, b->rank,
			   is_strict(n) ? ": it changes the wire or the GID chosen; set it the same "
			   "on every node (or leave it unset everywhere)"
			   : ": it works, but the two directions may perform differently");
	}
}

static void check_ranks(struct rail_ck_report *r, const struct rail_ck_opts *o)
{
	const struct rail_ck_info *a = &r->all[0];

	for (int k = 0; k < r->nranks; k++) {
		const struct rail_ck_info *b = &r->all[k];

		if (!b->transport[0])
			rail_ck_problem(r, 1, "plugin", "the plugin did not start on %s (rank %d): %s; "
				   "run rail-info there", b->host, k, b->why);
		else if (b->ndev == 0)
			rail_ck_problem(r, 1, "plugin", "the %s transport on %s (rank %d) has no device; "
				   "run rail-info there", b->transport, b->host, k);
		if (b->transport[0] && o->expect_devs && b->ndev != o->expect_devs)
			rail_ck_problem(r, 1, "devices", "%s (rank %d) has %d device(s), "
					"--expect-devices %d: a port or interface is down or left out by "
					"NCCL_IB_HCA / NCCL_SOCKET_IFNAME (rail-info there says which and "
					"why)", b->host, k, b->ndev, o->expect_devs);
		if (k == 0)
			continue;
		if (strcmp(a->version, b->version) || a->wire_handle != b->wire_handle ||
		    a->wire_tcp != b->wire_tcp || a->wire_ib != b->wire_ib)
			rail_ck_problem(r, 1, "version", "nccl-net-rail %s on %s (rank %d) (handle/TCP/"
				   "verbs wire versions %d/%d/%d), %s on %s (rank 0) (%d/%d/%d): "
				   "install one release on every node%s", b->version, b->host, k,
				   b->wire_handle, b->wire_tcp, b->wire_ib, a->version, a->host,
				   a->wire_handle, a->wire_tcp, a->wire_ib,
				   a->wire_handle != b->wire_handle || a->wire_tcp != b->wire_tcp ||
				   a->wire_ib != b->wire_ib ? " (these two cannot connect: the plugin "
				   "refuses the other wire version)" : "");
		if (a->transport[0] && b->transport[0] && strcmp(a->transport, b->transport))
			rail_ck_problem(r, 1, "transport", "%s (rank 0) uses the %s transport (%s), %s "
				   "(rank %d) the %s transport (%s): they cannot connect; set "
				   "NCCL_RAIL_TRANSPORT the same everywhere, or fix the RDMA devices of "
				   "the TCP one (rail-info)", a->host, a->transport, a->why, b->host, k,
				   b->transport, b->why);
		else if (a->transport[0] && b->transport[0]) {
			check_config(r, a, b);
			if (a->ndev != b->ndev && a->ndev && b->ndev)
				rail_ck_problem(r, 1, "rail", "%s (rank 0) has %d device(s), %s (rank %d) "
					   "%d: the rails beyond %d have no partner; check NCCL_IB_HCA / "
					   "NCCL_SOCKET_IFNAME and the links (rail-info)", a->host, a->ndev,
					   b->host, k, b->ndev, RAIL_MIN(a->ndev, b->ndev));
		}
	}
}

static void cell_mismatch(struct rail_ck_cell *c, const char *step, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void cell_mismatch(struct rail_ck_cell *c, const char *step, const char *fmt, ...)
{
	char old[2 * RAIL_CK_WHY], add[RAIL_CK_WHY];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(add, sizeof(add), fmt, ap);
	va_end(ap);
	rail_strlcpy(old, c->ok ? "" : c->why, sizeof(old));
	rail_strlcpy(c->why, add, sizeof(c->why));
	if (old[0])
		rail_ck_catf(c->why, sizeof(c->why), "; and the %s step failed: %s", c->step, old);
	rail_strlcpy(c->step, step, sizeof(c->step));
	c->ok = 0;
}

static void check_cell(struct rail_ck_cell *c, const struct rail_ck_info *a,
		       const struct rail_ck_info *b, const struct rail_ck_opts *o)
{
	const struct rail_ck_dev *x, *y;

	if (c->da >= a->ndev || c->db >= b->ndev)
		return;
	x = &a->dev[c->da];
	y = &b->dev[c->db];
	if (strcmp(x->link, y->link) || strcmp(x->gid_type, y->gid_type))
		cell_mismatch(c, "gid-type", "link layer / GID type differ: %s %s GID %s on %s, "
			      "%s %s GID %s on %s; RoCE v1 and v2 do not talk to each other: set "
			      "NCCL_IB_ROCE_VERSION_NUM (or NCCL_IB_GID_INDEX) the same everywhere, "
			      "and check the GID tables (rail-info)", x->name, x->link, x->gid_type,
			      a->host, y->name, y->link, y->gid_type, b->host);
	else if (!o->routed && x->subnet[0] && y->subnet[0] && strcmp(x->subnet, y->subnet) &&
		 strcmp(x->gid_type, "IP"))
		cell_mismatch(c, "subnet", "GIDs on different subnets: %s %s (%s) on %s, %s %s "
			      "(%s) on %s; check the interface addresses (ip addr) and "
			      "NCCL_IB_ADDR_RANGE; on a routed fabric pass --routed", x->name, x->gid,
			      x->subnet, a->host, y->name, y->gid, y->subnet, b->host);
	else if (x->mtu != y->mtu && x->mtu && y->mtu && strcmp(x->gid_type, "IP"))
		cell_mismatch(c, "mtu", "MTU differs: %d on %s (%s), %d on %s (%s); the "
			      "connection uses the smaller: set the same MTU on both ports and on "
			      "the switch", x->mtu, x->name, a->host, y->mtu, y->name, b->host);
}

void rail_ck_static_checks(struct rail_ck_report *r, const struct rail_ck_opts *o)
{
	check_ranks(r, o);
	for (int i = 0; i < r->ncells; i++) {
		struct rail_ck_cell *c = &r->cells[i];

		if (c->ra < r->nranks && c->rb < r->nranks)
			check_cell(c, &r->all[c->ra], &r->all[c->rb], o);
		if (!c->ok)
			r->nfail++;
	}
}

/* ---- text ---------------------------------------------------------------- */

static int host_unique(const struct rail_ck_report *r, int rank)
{
	for (int k = 0; k < r->nranks; k++)
		if (k != rank && !strcmp(r->all[k].host, r->all[rank].host))
			return 0;
	return 1;
}

const char *rail_ck_label(const struct rail_ck_report *r, int rank, int dev, char *buf,
			  size_t len)
{
	const struct rail_ck_info *in = &r->all[rank];
	const char *d = dev >= 0 && dev < in->ndev ? in->dev[dev].name : "?";

	if (host_unique(r, rank))
		snprintf(buf, len, "%s%s%s", in->host, dev < 0 ? "" : ":", dev < 0 ? "" : d);
	else
		snprintf(buf, len, "%s#%d%s%s", in->host, rank, dev < 0 ? "" : ":", dev < 0 ? "" : d);
	return buf;
}

const char *rail_ck_gid(const struct rail_ck_report *r, int rank, int dev)
{
	const struct rail_ck_info *in = &r->all[rank];

	return dev >= in->ndev ? "?" : in->dev[dev].gid[0] ? in->dev[dev].gid : "-";
}

static const struct rail_ck_cell *find(const struct rail_ck_report *r, int ra, int da, int rb,
				       int db)
{
	for (int i = 0; i < r->ncells; i++) {
		const struct rail_ck_cell *c = &r->cells[i];

		if (c->ra == ra && c->da == da && c->rb == rb && c->db == db)
			return c;
	}
	return NULL;
}

const char *rail_ck_hint(const char *step)
{
	static const struct { const char *step, *text; } hints[] = {
		{ "connect", "check the link and the route between these two addresses (ip link, "
			     "ip route, ping from one to the other; for verbs also ibstat / ibv_devinfo, "
			     "the GID tables and NCCL_IB_GID_INDEX; rail-info on both hosts)" },
		{ "pattern", "data arrived wrong or not at all: check the NIC firmware and the "
			     "switch port (errors in ethtool -S / perfquery), and retry with -v" },
		{ "latency", "the link stalls under small messages: check for packet loss (ethtool -S, "
			     "perfquery), PFC/ECN on RoCE, and NCCL_IB_TIMEOUT" },
		{ "bandwidth", "the link stalls under load: check for packet loss, PFC/ECN on RoCE, "
			       "the MTU on the path, and the switch port counters" },
		{ "control", "rail-check on the peer stopped or is unreachable on its control "
			     "address: see its output" },
	};

	for (size_t i = 0; i < RAIL_ARRAY_SIZE(hints); i++)
		if (!strcmp(hints[i].step, step))
			return hints[i].text;
	return "the reason above says what differs: make both ends the same";
}

static void print_matrix(const struct rail_ck_report *r, FILE *out)
{
	char l[160], v[64];
	int w = 18;

	for (int a = 0; a < r->nranks; a++)
		for (int d = 0; d < r->all[a].ndev; d++)
			w = RAIL_MAX(w, (int)strlen(rail_ck_label(r, a, d, l, sizeof(l))) + 2);
	fprintf(out, "%-*s", w, "from \\ to");
	for (int b = 0; b < r->nranks; b++)
		for (int d = 0; d < r->all[b].ndev; d++)
			fprintf(out, " %-*s", w, rail_ck_label(r, b, d, l, sizeof(l)));
	fprintf(out, "\n");
	for (int a = 0; a < r->nranks; a++)
		for (int da = 0; da < r->all[a].ndev; da++) {
			fprintf(out, "%-*s", w, rail_ck_label(r, a, da, l, sizeof(l)));
			for (int b = 0; b < r->nranks; b++)
				for (int db = 0; db < r->all[b].ndev; db++) {
					const struct rail_ck_cell *c = find(r, a, da, b, db);

					if (!c || !c->tested)
						snprintf(v, sizeof(v), "%s", a == b ? "." : "-");
					else if (c->ok)
						snprintf(v, sizeof(v), "%.1fus %.2fGB/s", c->lat_us,
							 c->bw);
					else
						snprintf(v, sizeof(v), "FAIL(%s)", c->step);
					fprintf(out, " %-*s", w, v);
				}
			fprintf(out, "\n");
		}
}

void rail_ck_print_text(const struct rail_ck_report *r, FILE *out)
{
	char la[160], lb[160];
	int npairs = 0, nbad = 0, nprob = 0;

	fprintf(out, "# rail-check (nccl-net-rail %s): %d processes\n", RAIL_VERSION_STRING,
		r->nranks);
	for (int k = 0; k < r->nranks; k++) {
		const struct rail_ck_info *in = &r->all[k];

		fprintf(out, "# rank %d: %s, nccl-net-rail %s, transport %s (%s)\n", k, in->host,
			in->version, in->transport[0] ? in->transport : "none", in->why);
		for (int d = 0; d < in->ndev; d++) {
			const struct rail_ck_dev *x = &in->dev[d];

			fprintf(out, "#   [%d] %s port %d %s GID %s (index %d, %s) subnet %s MTU %d, "
				"%d Mbps\n", d, x->name, x->port, x->link, x->gid, x->gid_index,
				x->gid_type, x->subnet[0] ? x->subnet : "?", x->mtu, x->speed);
		}
	}
	fprintf(out, "\nlatency (median half round trip of 8 bytes) and bandwidth from the row "
		"to the column:\n");
	print_matrix(r, out);
	for (int i = 0; i < r->ncells; i++) {
		const struct rail_ck_cell *c = &r->cells[i];

		if (!c->tested || c->ra > c->rb)
			continue;
		npairs++;
		if (c->ok)
			continue;
		if (!nbad++)
			fprintf(out, "\nfailing pairs:\n");
		fprintf(out, "FAIL %s (GID %s) <-> %s (GID %s): %s: %s\n  try: %s\n",
			rail_ck_label(r, c->ra, c->da, la, sizeof(la)), rail_ck_gid(r, c->ra, c->da),
			rail_ck_label(r, c->rb, c->db, lb, sizeof(lb)), rail_ck_gid(r, c->rb, c->db),
			c->step, c->why, rail_ck_hint(c->step));
	}
	for (int i = 0; i < r->nprobs; i++) {
		fprintf(out, "%s%s %s: %s\n", i == 0 ? "\n" : "", r->probs[i].fatal ? "FAIL" : "note",
			r->probs[i].what, r->probs[i].text);
		nprob += r->probs[i].fatal;
	}
	fprintf(out, "\nrail-check: %s: %d device pair(s) tested, %d failed; %d other problem(s)\n",
		r->nfail ? "FAILED" : "all good", npairs, nbad, nprob);
}

/* ---- JSON ------------------------------------------------------------------ */

static void jstr(FILE *out, const char *s)
{
	fputc('"', out);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(out, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(out, "\\u%04x", ch);
		else
			fputc(ch, out);
	}
	fputc('"', out);
}

static void json_end(const struct rail_ck_report *r, int rank, int dev, FILE *out)
{
	const struct rail_ck_info *in = &r->all[rank];

	fprintf(out, "{\"rank\": %d, \"host\": ", rank);
	jstr(out, in->host);
	fprintf(out, ", \"dev\": %d, \"name\": ", dev);
	jstr(out, dev < in->ndev ? in->dev[dev].name : "?");
	fprintf(out, ", \"gid\": ");
	jstr(out, rail_ck_gid(r, rank, dev));
	fprintf(out, "}");
}

static void json_ranks(const struct rail_ck_report *r, FILE *out)
{
	fprintf(out, "  \"ranks\": [\n");
	for (int k = 0; k < r->nranks; k++) {
		const struct rail_ck_info *in = &r->all[k];

		fprintf(out, "    {\"rank\": %d, \"host\": ", k);
		jstr(out, in->host);
		fprintf(out, ", \"version\": ");
		jstr(out, in->version);
		fprintf(out, ", \"transport\": ");
		jstr(out, in->transport);
		fprintf(out, ", \"why\": ");
		jstr(out, in->why);
		fprintf(out, ", \"devices\": [");
		for (int d = 0; d < in->ndev; d++) {
			const struct rail_ck_dev *x = &in->dev[d];

			fprintf(out, "%s{\"name\": ", d ? ", " : "");
			jstr(out, x->name);
			fprintf(out, ", \"port\": %d, \"link_layer\": ", x->port);
			jstr(out, x->link);
			fprintf(out, ", \"gid\": ");
			jstr(out, x->gid);
			fprintf(out, ", \"gid_index\": %d, \"gid_type\": ", x->gid_index);
			jstr(out, x->gid_type);
			fprintf(out, ", \"subnet\": ");
			jstr(out, x->subnet);
			fprintf(out, ", \"mtu\": %d, \"speed_mbps\": %d}", x->mtu, x->speed);
		}
		fprintf(out, "]}%s\n", k + 1 < r->nranks ? "," : "");
	}
	fprintf(out, "  ],\n");
}

void rail_ck_print_json(const struct rail_ck_report *r, FILE *out)
{
	int first = 1;

	fprintf(out, "{\n  \"schema\": 1,\n  \"tool\": \"rail-check\",\n  \"version\": ");
	jstr(out, RAIL_VERSION_STRING);
	fprintf(out, ",\n  \"ok\": %s,\n  \"failures\": %d,\n", r->nfail ? "false" : "true",
		r->nfail);
	json_ranks(r, out);
	fprintf(out, "  \"pairs\": [\n");
	for (int i = 0; i < r->ncells; i++) {
		const struct rail_ck_cell *c = &r->cells[i];

		if (!c->tested)
			continue;
		fprintf(out, "%s    {\"from\": ", first ? "" : ",\n");
		first = 0;
		json_end(r, c->ra, c->da, out);
		fprintf(out, ", \"to\": ");
		json_end(r, c->rb, c->db, out);
		fprintf(out, ", \"ok\": %s, \"lat_us\": %.2f, \"bw_gbs\": %.3f, \"step\": ",
			c->ok ? "true" : "false", c->lat_us, c->bw);
		jstr(out, c->ok ? "" : c->step);
		fprintf(out, ", \"why\": ");
		jstr(out, c->ok ? "" : c->why);
		fprintf(out, "}");
	}
	fprintf(out, "\n  ],\n  \"problems\": [\n");
	for (int i = 0; i < r->nprobs; i++) {
		fprintf(out, "    {\"fatal\": %s, \"what\": ", r->probs[i].fatal ? "true" : "false");
		jstr(out, r->probs[i].what);
		fprintf(out, ", \"text\": ");
		jstr(out, r->probs[i].text);
		fprintf(out, "}%s\n", i + 1 < r->nprobs ? "," : "");
	}
	fprintf(out, "  ]\n}\n");
}

/* ---- cells on the wire ------------------------------------------------------- */

int rail_ck_cells_encode(const struct rail_ck_cell *c, int n, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < n; i++) {
		char why[2 * RAIL_CK_WHY];
		size_t k = 0;

		for (; c[i].why[k] && k + 1 < sizeof(why); k++)
			why[k] = c[i].why[k] == '\t' || c[i].why[k] == '\n' ? ' ' : c[i].why[k];
		why[k] = '\0';
		off += (size_t)snprintf(buf + off, off < len ? len - off : 0,
					"%d\t%d\t%d\t%d\t%d\t%d\t%.3f\t%.4f\t%s\t%s\n", c[i].ra, c[i].da,
					c[i].rb, c[i].db, c[i].tested, c[i].ok, c[i].lat_us, c[i].bw,
					c[i].step[0] ? c[i].step : "-", why[0] ? why : "-");
		if (off >= len)
			return -1;
	}
	return (int)off;
}

int rail_ck_cells_decode(const char *buf, struct rail_ck_cell *c, int max)
{
	int n = 0;

	while (*buf && n < max) {
		const char *nl = strchr(buf, '\n');
		struct rail_ck_cell *x = &c[n];
		int used = 0;

		memset(x, 0, sizeof(*x));
		if (sscanf(buf, "%d\t%d\t%d\t%d\t%d\t%d\t%lf\t%lf\t%31[^\t]\t%n", &x->ra, &x->da,
			   &x->rb, &x->db, &x->tested, &x->ok, &x->lat_us, &x->bw, x->step,
			   &used) < 9 || !used || x->ra < 0 || x->rb < 0 || x->da < 0 || x->db < 0)
			return -1;
		snprintf(x->why, sizeof(x->why), "%.*s", (int)((nl ? nl : buf + strlen(buf)) -
							     (buf + used)), buf + used);
		for (char *q = x->why; *q; q++)	/* the report goes to a terminal */
			if ((unsigned char)*q < 0x20 || *q == 0x7f)
				*q = '?';
		for (char *q = x->step; *q; q++)
			if ((unsigned char)*q < 0x20 || *q == 0x7f)
				*q = '?';
		if (!strcmp(x->why, "-"))
			x->why[0] = '\0';
		if (!strcmp(x->step, "-"))
			x->step[0] = '\0';
		n++;
		buf = nl ? nl + 1 : buf + strlen(buf);
	}
	return n;
}
