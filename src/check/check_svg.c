/*
 * rail-check's report as a picture: one self-contained SVG file (no script,
 * no external font, style or image) that any browser opens. Two panels,
 * bandwidth and latency, each a matrix with one cell per tested device pair
 * (row: the sending process's device, column: the receiving one's), with
 * the rails as blocks: side by side when each device was tested against its
 * own rail, a grid of rail pairs with --all-pairs. A cell's colour is its
 * figure as a fraction of the best pair's (bandwidth / best bandwidth, best
 * latency / latency), so the one slow link stands out however fast the
 * fabric is; a failed pair is a white cell with a red outline and cross,
 * whose element carries the pair (data-from, data-to, data-step). Every
 * cell's tooltip names the pair and its figures or why it failed; below the
 * panels come the failing pairs and the other problems as text. Host names,
 * device names and reasons come from the peers: every byte of them is
 * escaped, and what is not valid UTF-8 or not allowed in XML becomes '?'.
 */
#include <stdlib.h>
#include <string.h>

#include "rail.h"
#include "check/check.h"

#define SVG_M 16		/* outer margin */
#define SVG_FS 12		/* text size */
#define SVG_EM 0.61		/* a character's width in a monospace font, in em */
#define SVG_GAP 14		/* between rail blocks */
#define SVG_LEGW 200		/* legend */
#define SVG_BAR 140		/* legend colour bar */
#define SVG_LEGH (SVG_BAR + 88)
#define SVG_LINE 17		/* a line of text below the panels */
#define SVG_FAIL "#d7191c"
#define SVG_NONE "#ececec"
#define SVG_FONT "DejaVu Sans Mono,Menlo,Consolas,monospace"

enum { SVG_BW, SVG_LAT };

struct svg {
	const struct rail_ck_report *r;
	FILE *out;
	int *idx;		/* cell by (row endpoint, column endpoint), -1 none; endpoint = rank * D + dev */
	int R, D, full;		/* ranks, rails (the most devices of a rank), every rail pair tested */
	int cs, lfs;		/* cell size, label font size */
	int capw, lw, lh;	/* left captions (full), row labels, column labels */
	int gx, gw, gh;		/* grid left, width, height */
	int ph, W, H;		/* panel height, picture size */
	double best_bw, best_lat;
	int npairs, nbad, nprob;
};

/* ---- text ------------------------------------------------------------------------ */

/* The length of the UTF-8 character at s if it is valid and XML allows it, else 0. */
static int utf8_char(const unsigned char *s)
{
	unsigned c = s[0], cp, min, n;

	if (c < 0x80)
		return c >= 0x20 && c != 0x7f;
	if (c >= 0xc2 && c <= 0xdf)
		n = 1, min = 0x80, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		n = 2, min = 0x800, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 3, min = 0x10000, cp = c & 0x07;
	else
		return 0;
	for (unsigned i = 1; i <= n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3fu);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe ||
	    cp == 0xffff)
		return 0;
	return (int)n + 1;
}

/* At most n bytes of s as XML text or attribute value. */
static void esc_n(FILE *f, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + n;

	while (p < end && *p) {
		int k = utf8_char(p);

		if (*p == '<')
			fputs("&lt;", f);
		else if (*p == '>')
			fputs("&gt;", f);
		else if (*p == '&')
			fputs("&amp;", f);
		else if (*p == '"')
			fputs("&quot;", f);
		else if (*p == '\'')
			fputs("&#39;", f);
		else if (!k || p + k > end)
			fputc('?', f);
		else
			fwrite(p, 1, (size_t)k, f);
		p += k && p + k <= end ? k : 1;
	}
}

static void esc(FILE *f, const char *s)
{
	esc_n(f, s, strlen(s));
}

/* Characters in s as a browser shows them (an invalid byte: one '?'). */
static int text_len(const char *s)
{
	int n = 0;

	for (const unsigned char *p = (const unsigned char *)s; *p; n++)
		p += utf8_char(p) ? utf8_char(p) : 1;
	return n;
}

/* Width in pixels of n characters at font size fs. */
static int text_px(int n, int fs)
{
	return (int)(n * fs * SVG_EM + 0.999);
}

/* ---- colours ----------------------------------------------------------------------- */

/* viridis: dark purple (0) to yellow (1), no red, readable in grey and by the colour blind */
static const unsigned char viridis[9][3] = {
	{ 0x44, 0x01, 0x54 }, { 0x47, 0x2d, 0x7b }, { 0x3b, 0x52, 0x8b }, { 0x2c, 0x72, 0x8e },
	{ 0x21, 0x91, 0x8c }, { 0x28, 0xae, 0x80 }, { 0x5e, 0xc9, 0x62 }, { 0xad, 0xdc, 0x30 },
	{ 0xfd, 0xe7, 0x25 },
};

static void colour(double t, char buf[8])
{
	double x = (t < 0 ? 0 : t > 1 ? 1 : t) * 8;
	int i = x >= 8 ? 7 : (int)x;
	double f = x - i;
	int rgb[3];

	for (int k = 0; k < 3; k++)
		rgb[k] = (int)(viridis[i][k] + (viridis[i + 1][k] - viridis[i][k]) * f + 0.5);
	snprintf(buf, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

/* A cell's figure as a fraction of the best pair's: 1 best, towards 0 worse. */
static double cell_t(const struct svg *g, const struct rail_ck_cell *c, int m)
{
	if (m == SVG_BW)
		return g->best_bw > 0 ? c->bw / g->best_bw : 0;
	return c->lat_us > 0 ? g->best_lat / c->lat_us : 1;
}

/* ---- layout ------------------------------------------------------------------------- */

static int svg_index(struct svg *g)
{
	const struct rail_ck_report *r = g->r;
	size_t n;

	g->R = r->nranks;
	for (int k = 0; k < r->nranks; k++)
		g->D = RAIL_MAX(g->D, r->all[k].ndev);
	n = (size_t)(g->R * g->D) * (size_t)(g->R * g->D);
	g->idx = malloc((n ? n : 1) * sizeof(*g->idx));
	if (!g->idx)
		return -1;
	for (size_t i = 0; i < n; i++)
		g->idx[i] = -1;
	for (int i = 0; i < r->ncells; i++) {
		const struct rail_ck_cell *c = &r->cells[i];

		if (!c->tested || c->ra >= g->R || c->rb >= g->R || c->da >= g->D || c->db >= g->D)
			continue;
		g->idx[(size_t)(c->ra * g->D + c->da) * (size_t)(g->R * g->D) +
		       (size_t)(c->rb * g->D + c->db)] = i;
		g->full |= c->da != c->db;
		if (c->ok) {
			g->best_bw = RAIL_MAX(g->best_bw, c->bw);
			if (c->lat_us > 0 && (g->best_lat == 0 || c->lat_us < g->best_lat))
				g->best_lat = c->lat_us;
		}
		if (c->ra <= c->rb) {	/* a pair once, as the text report counts it */
			g->npairs++;
			g->nbad += !c->ok;
		}
	}
	for (int i = 0; i < r->nprobs; i++)
		g->nprob += r->probs[i].fatal;
	return 0;
}

static const struct rail_ck_cell *cell_at(const struct svg *g, int ra, int da, int rb, int db)
{
	int i = g->idx[(size_t)(ra * g->D + da) * (size_t)(g->R * g->D) + (size_t)(rb * g->D + db)];

	return i < 0 ? NULL : &g->r->cells[i];
}

static void svg_geometry(struct svg *g)
{
	char l[160];
	int across = RAIL_MAX(g->D * g->R, 1), longest = 1;

	g->cs = RAIL_MIN(RAIL_MAX(960 / across, 8), 56);
	g->lfs = RAIL_MIN(SVG_FS, g->cs - 2);
	for (int k = 0; k < g->R; k++)
		longest = RAIL_MAX(longest, text_len(rail_ck_label(g->r, k, -1, l, sizeof(l))));
	g->capw = g->full ? 22 : 0;
	g->lw = text_px(longest, g->lfs) + 10;
	g->lh = text_px(longest, g->lfs) + 10;
	g->gx = SVG_M + g->capw + g->lw;
	g->gw = g->D * g->R * g->cs + RAIL_MAX(g->D - 1, 0) * SVG_GAP;
	g->gh = (g->full ? g->D : 1) * g->R * g->cs + (g->full ? g->D - 1 : 0) * SVG_GAP;
	g->ph = g->D ? 42 + g->lh + RAIL_MAX(g->gh, SVG_LEGH) + 28 : 0;
	g->W = RAIL_MAX(g->gx + g->gw + 28 + SVG_LEGW + SVG_M, 760);
}

/* ---- the notes below the panels ------------------------------------------------------ */

/*
 * text wrapped to the picture's width at spaces, the first line at SVG_M
 * and the others indented; with emit, written from baseline y. The lines.
 */
static int wrap(const struct svg *g, int y, const char *text, const char *fill, int emit)
{
	int width = (g->W - 2 * SVG_M) / text_px(1, SVG_FS), lines = 0;
	const char *p = text;

	while (*p) {
		const char *q = p, *cut = NULL;
		int n = 0, room = lines ? width - 2 : width;

		while (*q && n < room) {
			if (*q == ' ')
				cut = q;
			q += utf8_char((const unsigned char *)q) ? utf8_char((const unsigned char *)q) : 1;
			n++;
		}
		if (!*q || !cut)
			cut = q;
		if (emit) {
			fprintf(g->out, "<text x=\"%d\" y=\"%d\" fill=\"%s\">", SVG_M +
				(lines ? text_px(2, SVG_FS) : 0), y + lines * SVG_LINE, fill);
			esc_n(g->out, p, (size_t)(cut - p));
			fputs("</text>\n", g->out);
		}
		lines++;
		p = *cut == ' ' ? cut + 1 : cut;
	}
	return lines;
}

/* The failing pairs and the other problems; the lines written (or counted). */
static int svg_notes(const struct svg *g, int y, int emit)
{
	const struct rail_ck_report *r = g->r;
	char t[4 * RAIL_CK_WHY], la[160], lb[160];
	int lines = 0;

	for (int i = 0; i < r->ncells; i++) {
		const struct rail_ck_cell *c = &r->cells[i];

		if (!c->tested || c->ok || c->ra > c->rb)
			continue;
		if (!lines)
			lines += wrap(g, y, "failing pairs:", "#222", emit);
		snprintf(t, sizeof(t), "FAIL %s (GID %s) <-> %s (GID %s): %s: %s",
			 rail_ck_label(r, c->ra, c->da, la, sizeof(la)), rail_ck_gid(r, c->ra, c->da),
			 rail_ck_label(r, c->rb, c->db, lb, sizeof(lb)), rail_ck_gid(r, c->rb, c->db),
			 c->step, c->why);
		lines += wrap(g, y + lines * SVG_LINE, t, SVG_FAIL, emit);
		snprintf(t, sizeof(t), "try: %s", rail_ck_hint(c->step));
		lines += wrap(g, y + lines * SVG_LINE, t, "#222", emit);
	}
	for (int i = 0; i < r->nprobs; i++) {
		snprintf(t, sizeof(t), "%s %s: %s", r->probs[i].fatal ? "FAIL" : "note",
			 r->probs[i].what, r->probs[i].text);
		lines += wrap(g, y + lines * SVG_LINE, t, r->probs[i].fatal ? SVG_FAIL : "#555",
			      emit);
	}
	return lines;
}

/* ---- the picture ---------------------------------------------------------------------- */

static void svg_head(const struct svg *g)
{
	FILE *f = g->out;

	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
		"viewBox=\"0 0 %d %d\" font-family=\"%s\" font-size=\"%d\">\n", g->W, g->H, g->W,
		g->H, SVG_FONT, SVG_FS);
	fprintf(f, "<title>rail-check: %s: %d device pair(s) tested, %d failed; %d other "
		"problem(s)</title>\n", g->r->nfail ? "FAILED" : "all good", g->npairs, g->nbad,
		g->nprob);
	fputs("<defs><linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">", f);
	for (int i = 0; i < 9; i++)
		fprintf(f, "<stop offset=\"%g\" stop-color=\"#%02x%02x%02x\"/>", i / 8.0,
			viridis[i][0], viridis[i][1], viridis[i][2]);
	fprintf(f, "</linearGradient></defs>\n<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n",
		g->W, g->H);
}

/* The heading; returns the top of the first panel. */
static int svg_title(const struct svg *g)
{
	FILE *f = g->out;

	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"%d\" font-weight=\"bold\" fill=\"%s\">"
		"rail-check: %s</text>\n", SVG_M, SVG_M + 14, SVG_FS + 4,
		g->r->nfail ? SVG_FAIL : "#1a7f37", g->r->nfail ? "FAILED" : "all good");
	fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#222\">nccl-net-rail %s, %d processes: %d "
		"device pair(s) tested, %d failed; %d other problem(s)</text>\n", SVG_M, SVG_M + 34,
		RAIL_VERSION_STRING, g->R, g->npairs, g->nbad, g->nprob);
	return SVG_M + 48;
}

/* "rail d", with the device name when every process has the same one there. */
static void rail_caption(const struct svg *g, int d, char *buf, size_t len)
{
	const char *name = NULL;
	int same = 1;

	for (int k = 0; k < g->R && same; k++) {
		if (d >= g->r->all[k].ndev)
			continue;
		if (!name)
			name = g->r->all[k].dev[d].name;
		same = !strcmp(name, g->r->all[k].dev[d].name);
	}
	snprintf(buf, len, "%srail %d", g->full ? "to " : "", d);
	if (name && same)
		rail_ck_catf(buf, len, " (%s)", name);
}

static void cell_title(const struct svg *g, const struct rail_ck_cell *c)
{
	char t[4 * RAIL_CK_WHY], la[160], lb[160];

	snprintf(t, sizeof(t), "%s -> %s: ", rail_ck_label(g->r, c->ra, c->da, la, sizeof(la)),
		 rail_ck_label(g->r, c->rb, c->db, lb, sizeof(lb)));
	if (c->ok)
		rail_ck_catf(t, sizeof(t), "%.2f GB/s, %.1f \xc2\xb5s", c->bw, c->lat_us);
	else
		rail_ck_catf(t, sizeof(t), "FAIL %s: %s; try: %s", c->step, c->why,
			     rail_ck_hint(c->step));
	fputs("<title>", g->out);
	esc(g->out, t);
	fputs("</title>", g->out);
}

static void svg_fail_cell(const struct svg *g, int x, int y, const struct rail_ck_cell *c)
{
	FILE *f = g->out;
	char la[160], lb[160];
	int s = g->cs - 1;
	double w = RAIL_MAX(s / 12.0, 1.5), h = w / 2, in = RAIL_MAX(s / 6.0, w);

	fputs("<g class=\"cell fail\" data-from=\"", f);
	esc(f, rail_ck_label(g->r, c->ra, c->da, la, sizeof(la)));
	fputs("\" data-to=\"", f);
	esc(f, rail_ck_label(g->r, c->rb, c->db, lb, sizeof(lb)));
	fputs("\" data-step=\"", f);
	esc(f, c->step);
	fputs("\">", f);
	cell_title(g, c);
	/* the outline and the cross stay inside the cell: its neighbours show no red */
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fff\" "
		"stroke=\"%s\" stroke-width=\"%.1f\"/><path d=\"M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f "
		"%.1f\" stroke=\"%s\" stroke-width=\"%.1f\"/></g>\n", x + h, y + h, s - w, s - w,
		SVG_FAIL, w, x + in, y + in, x + s - in, y + s - in, x + s - in, y + in, x + in,
		y + s - in, SVG_FAIL, w);
}

static void svg_cell(const struct svg *g, int x, int y, const struct rail_ck_cell *c, int m)
{
	FILE *f = g->out;
	double t = cell_t(g, c, m), v = m == SVG_BW ? c->bw : c->lat_us;
	char fill[8];

	if (!c->ok)
		return svg_fail_cell(g, x, y, c);
	colour(t, fill);
	fputs("<g class=\"cell\">", f);
	cell_title(g, c);
	fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"/>", x, y,
		g->cs - 1, g->cs - 1, fill);
	if (g->cs >= 40)	/* the figure, dark on the light end of the scale */
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"%d\" "
			"fill=\"%s\">%.*f</text>", x + g->cs / 2, y + g->cs / 2 + 4,
			g->cs >= 52 ? 12 : 10, t >= 0.55 ? "#000" : "#fff", v < 10 ? 2 : 1, v);
	fputs("</g>\n", f);
}

/* Block (br, bc): rows are the processes' device br, columns their device bc. */
static void svg_block(const struct svg *g, int x0, int y0, int br, int bc, int m)
{
	int side = g->R * g->cs;

	fprintf(g->out, "<rect class=\"rail\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
		"fill=\"%s\"/>\n", x0, y0, side, side, SVG_NONE);
	for (int a = 0; a < g->R; a++)
		for (int b = 0; b < g->R; b++) {
			const struct rail_ck_cell *c = cell_at(g, a, br, b, bc);

			if (c)
				svg_cell(g, x0 + b * g->cs, y0 + a * g->cs, c, m);
		}
	fprintf(g->out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
		"stroke=\"#444\"/>\n", x0 - 1, y0 - 1, side + 1, side + 1);
}

/* Host labels (class row, col): left of a block row at y0, or above a block column at x0. */
static void svg_labels(const struct svg *g, int x0, int y0, int rows)
{
	FILE *f = g->out;
	char l[160];

	for (int k = 0; k < g->R; k++) {
		int c = (rows ? y0 : x0) + k * g->cs + g->cs / 2 + g->lfs / 3;

		if (rows)
			fprintf(f, "<text class=\"row\" x=\"%d\" y=\"%d\" text-anchor=\"end\" "
				"font-size=\"%d\">", g->gx - 6, c, g->lfs);
		else
			fprintf(f, "<text class=\"col\" transform=\"translate(%d %d) rotate(-90)\" "
				"font-size=\"%d\">", c, y0 - 6, g->lfs);
		esc(f, rail_ck_label(g->r, k, -1, l, sizeof(l)));
		fputs("</text>\n", f);
	}
}

static void svg_legend(const struct svg *g, int x, int y, int m)
{
	static const double bw_ticks[] = { 1, 0.75, 0.5, 0.25, 0 }, lat_ticks[] = { 1, 0.5, 0.25,
										      0.1 };
	const double *tk = m == SVG_BW ? bw_ticks : lat_ticks;
	int nt = m == SVG_BW ? 5 : 4;
	FILE *f = g->out;

	fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", x, y + 10,
		m == SVG_BW ? "GB/s (% of the best)" : "\xc2\xb5s (x the best)");
	fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"%d\" fill=\"url(#scale)\" "
		"stroke=\"#444\"/>\n", x, y + 24, SVG_BAR);
	for (int i = 0; i < nt; i++) {
		int ty = y + 24 + (int)((1 - tk[i]) * SVG_BAR + 0.5);
		double v = m == SVG_BW ? tk[i] * g->best_bw : g->best_lat / tk[i];

		fprintf(f, "<path d=\"M%d %dh5\" stroke=\"#444\"/><text x=\"%d\" y=\"%d\">%.*f "
			"(%g%s)</text>\n", x + 16, ty, x + 24, ty + 4, v < 10 ? 2 : 1, v,
			m == SVG_BW ? tk[i] * 100 : 1 / tk[i], m == SVG_BW ? "%" : "x");
	}
	y += 24 + SVG_BAR + 18;
	fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"16\" fill=\"#fff\" stroke=\"%s\" "
		"stroke-width=\"2\"/><path d=\"M%d %dL%d %dM%d %dL%d %d\" stroke=\"%s\" "
		"stroke-width=\"2\"/><text x=\"%d\" y=\"%d\">failed</text>\n", x, y, SVG_FAIL,
		x + 3, y + 3, x + 13, y + 13, x + 13, y + 3, x + 3, y + 13, SVG_FAIL, x + 24, y + 12);
	fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"16\" fill=\"%s\" stroke=\"#444\"/>"
		"<text x=\"%d\" y=\"%d\">not tested</text>\n", x, y + 24, SVG_NONE, x + 24, y + 36);
}

/* One metric's panel from y; returns the top of the next. */
static int svg_panel(const struct svg *g, int y, int m)
{
	FILE *f = g->out;
	int side = g->R * g->cs, gy = y + 42 + g->lh;
	char cap[160];

	fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">%s</text>\n", SVG_M, y + 14,
		m == SVG_BW ? "bandwidth (GB/s) from the row's device to the column's"
			    : "latency (\xc2\xb5s, median half round trip of 8 bytes)");
	for (int bc = 0; bc < g->D; bc++) {
		int x0 = g->gx + bc * (side + SVG_GAP);

		rail_caption(g, bc, cap, sizeof(cap));
		fprintf(f, "<text class=\"rail\" x=\"%d\" y=\"%d\" font-weight=\"bold\">", x0, y + 34);
		esc(f, cap);
		fputs("</text>\n", f);
		svg_labels(g, x0, gy, 0);
	}
	for (int br = 0; br < (g->full ? g->D : 1); br++) {
		int y0 = gy + br * (side + SVG_GAP);

		if (g->full)
			fprintf(f, "<text transform=\"translate(%d %d) rotate(-90)\" text-anchor=\"end\" "
				"font-weight=\"bold\">from rail %d</text>\n", SVG_M + 12, y0, br);
		svg_labels(g, g->gx, y0, 1);
		for (int bc = 0; bc < g->D; bc++)	/* one rail each, or every rail pair */
			svg_block(g, g->gx + bc * (side + SVG_GAP), y0, g->full ? br : bc, bc, m);
	}
	svg_legend(g, g->gx + g->gw + 28, gy, m);
	return y + g->ph;
}

int rail_ck_print_svg(const struct rail_ck_report *r, FILE *out)
{
	struct svg g = { .r = r, .out = out };
	int y, lines;

	if (svg_index(&g))
		return -1;
	svg_geometry(&g);
	lines = svg_notes(&g, 0, 0);
	g.H = SVG_M + 48 + 2 * g.ph + lines * SVG_LINE + SVG_M;
	svg_head(&g);
	y = svg_title(&g);
	for (int m = SVG_BW; g.D && m <= SVG_LAT; m++)
		y = svg_panel(&g, y, m);
	svg_notes(&g, y + 12, 1);
	fputs("</svg>\n", out);
	free(g.idx);
	return ferror(out) ? -1 : 0;
}
