/*
 * nccl-net-rail unit tests: rail-check's heatmap (src/check/check_svg.c) on
 * a synthetic matrix: well-formed XML (a small checker here, and xmllint
 * when installed), the failing pair and only it crossed out in both panels,
 * hostile host names escaped, invalid UTF-8 replaced, the same bytes for the
 * same report, and the rail-pair grid of --all-pairs.
 */
#include "unit.h"

#include <ctype.h>
#include <unistd.h>

#include "check/check.h"
#include "rail.h"

#define NR 3
#define ND 2

struct fixture {
	struct rail_ck_info all[NR];
	struct rail_ck_cell cells[NR * NR * ND * ND];
	struct rail_ck_report r;
};

static void make_rank(struct rail_ck_info *in, int rank, const char *host)
{
	memset(in, 0, sizeof(*in));
	in->rank = rank;
	rail_strlcpy(in->host, host, sizeof(in->host));
	rail_strlcpy(in->version, "0.2.0", sizeof(in->version));
	rail_strlcpy(in->transport, "ib", sizeof(in->transport));
	in->ndev = ND;
	for (int d = 0; d < ND; d++) {
		snprintf(in->dev[d].name, sizeof(in->dev[d].name), "mlx5_%d:1", d);
		snprintf(in->dev[d].gid, sizeof(in->dev[d].gid), "::ffff:10.%d.0.%d", d, rank + 1);
	}
}

/*
 * NR ranks with ND rails; every pair of ranks tested on each rail (all_pairs:
 * every device pair), at 20 GB/s and 3 us, but rank 1's rail 0 at 5 GB/s and
 * the pair (host-0, rail 1) <-> (host-2, rail 1) failed to connect.
 */
static void make_report(struct fixture *fx, const char *host0, int all_pairs)
{
	struct rail_ck_report *r = &fx->r;
	int n = 0;

	memset(r, 0, sizeof(*r));
	make_rank(&fx->all[0], 0, host0);
	make_rank(&fx->all[1], 1, "host-1");
	make_rank(&fx->all[2], 2, "host-2");
	for (int a = 0; a < NR; a++)
		for (int da = 0; da < ND; da++)
			for (int b = 0; b < NR; b++)
				for (int db = 0; db < ND; db++) {
					struct rail_ck_cell *c = &fx->cells[n];
					int slow = (a == 1 && da == 0) || (b == 1 && db == 0);

					if (a == b || (!all_pairs && da != db))
						continue;
					*c = (struct rail_ck_cell){ .ra = a, .da = da, .rb = b, .db = db,
								    .tested = 1, .ok = 1,
								    .bw = slow ? 5 : 20,
								    .lat_us = slow ? 12 : 3 };
					if (da == 1 && db == 1 && a + b == 2 && a != 1) {
						c->ok = 0, c->bw = 0, c->lat_us = 0;
						rail_strlcpy(c->step, "connect", sizeof(c->step));
						rail_strlcpy(c->why, "this side: nothing within 10 s <&>",
							     sizeof(c->why));
						r->nfail++;
					}
					n++;
				}
	r->nranks = NR;
	r->all = fx->all;
	r->cells = fx->cells;
	r->ncells = n;
}

/* The picture as a string (free it); RAIL_TEST_SVG_DIR=DIR also keeps it as DIR/NAME.svg. */
static char *svg_of(const struct rail_ck_report *r, const char *name)
{
	const char *dir = getenv("RAIL_TEST_SVG_DIR");
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	assert_int_equal(rail_ck_print_svg(r, f), 0);
	assert_int_equal(fclose(f), 0);
	if (dir) {
		char path[PATH_MAX];

		snprintf(path, sizeof(path), "%s/%s.svg", dir, name);
		f = fopen(path, "w");
		assert_non_null(f);
		fputs(buf, f);
		fclose(f);
	}
	return buf;
}

/* ---- a small XML well-formedness checker --------------------------------------- */

static int xml_name(const char **p)
{
	const char *s = *p;

	while (**p && (isalnum((unsigned char)**p) || strchr(":-_.", **p)))
		(*p)++;
	return *p > s;
}

/* Text or an attribute value up to stop: entities known, no '<', valid UTF-8, no controls. */
static int xml_chars(const char **p, char stop)
{
	static const char *const ents[] = { "&lt;", "&gt;", "&amp;", "&quot;", "&#39;" };

	while (**p && **p != stop) {
		unsigned char c = (unsigned char)**p;

		if (c == '<' || (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
			return -1;
		if (c == '&') {
			size_t i = 0;

			while (i < RAIL_ARRAY_SIZE(ents) && strncmp(*p, ents[i], strlen(ents[i])))
				i++;
			if (i == RAIL_ARRAY_SIZE(ents))
				return -1;
			*p += strlen(ents[i]);
		} else if (c >= 0x80) {
			int n = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 ? 1 : -1;

			if (n < 0 || c > 0xf4)
				return -1;
			for (int k = 1; k <= n; k++)
				if (((unsigned char)(*p)[k] & 0xc0) != 0x80)
					return -1;
			*p += n + 1;
		} else {
			(*p)++;
		}
	}
	return 0;
}

/* One tag after its '<': pushes or pops the element stack. 0 or -1. */
static int xml_tag(const char **p, const char *stack[], size_t lens[], int *depth)
{
	int close = **p == '/';
	const char *name;
	size_t nlen;

	*p += close;
	name = *p;
	if (!xml_name(p))
		return -1;
	nlen = (size_t)(*p - name);
	if (close) {
		if (*depth == 0 || lens[*depth - 1] != nlen || strncmp(stack[*depth - 1], name, nlen) ||
		    **p != '>')
			return -1;
		(*depth)--;
		(*p)++;
		return 0;
	}
	for (;;) {
		int space = 0;

		while (**p == ' ' || **p == '\n')
			(*p)++, space = 1;
		if (**p == '>' || (**p == '/' && (*p)[1] == '>'))
			break;
		if (!space || !xml_name(p) || *(*p)++ != '=' || *(*p)++ != '"' ||
		    xml_chars(p, '"') || *(*p)++ != '"')
			return -1;
	}
	if (**p == '/') {
		*p += 2;
		return 0;
	}
	if (*depth == 64)
		return -1;
	stack[*depth] = name;
	lens[(*depth)++] = nlen;
	(*p)++;
	return 0;
}

/* 0 when s is one well-formed XML document (the subset an SVG writer needs). */
static int xml_check(const char *s)
{
	const char *stack[64], *p = s;
	size_t lens[64];
	int depth = 0, roots = 0;

	if (!strncmp(p, "<?xml ", 6)) {
		p = strstr(p, "?>");
		if (!p)
			return -1;
		p += 2;
	}
	while (*p) {
		const char *t = p;

		if (*p != '<') {	/* text: outside the root element only blanks */
			if (xml_chars(&p, '<') || (depth == 0 && strspn(t, " \n") < (size_t)(p - t)))
				return -1;
			continue;
		}
		p++;
		if (depth == 0 && *p != '/' && roots++)
			return -1;
		if (xml_tag(&p, stack, lens, &depth))
			return -1;
	}
	return depth == 0 && roots == 1 ? 0 : -1;
}

/* xmllint's verdict on s: 0 well-formed, 1 not, -1 no xmllint (libxml2-utils). */
static int xmllint(const char *s)
{
	char path[] = "/tmp/rail-svg-XXXXXX", cmd[128];
	int fd, rc;

	if (system("command -v xmllint >/dev/null 2>&1") != 0)
		return -1;
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s));
	close(fd);
	snprintf(cmd, sizeof(cmd), "xmllint --noout %s", path);
	rc = system(cmd);
	unlink(path);
	return rc == 0 ? 0 : 1;
}

/* ---- tests ------------------------------------------------------------------------ */

static void test_checker_rejects(void **state)
{
	static const char *const bad[] = {
		"<a><b></a></b>", "<a x=\"<\"/>", "<a>&nbsp;</a>", "<a>x & y</a>", "<a/><b/>",
		"<a>\x01</a>", "<a>\xc3</a>", "<a x='1'/>", "<a", "<a>", "text<a/>",
	};

	(void)state;
	assert_int_equal(xml_check("<?xml version=\"1.0\"?>\n<a x=\"&lt;\"><b/>t&amp;\xc2\xb5</a>\n"),
			 0);
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(bad); i++) {
		print_message("not XML: %s\n", bad[i]);
		assert_int_equal(xml_check(bad[i]), -1);
	}
}

/*
 * Is there a host label of class cls ("row" or "col") reading host (as
 * escaped in the SVG) at y (row) or x (col) within [lo, hi]?
 */
static int label_in(const char *svg, const char *cls, const char *host, double lo, double hi)
{
	char tag[32];

	snprintf(tag, sizeof(tag), "<text class=\"%s\" ", cls);
	for (const char *p = strstr(svg, tag); p; p = strstr(p + 1, tag)) {
		const char *gt = strchr(p, '>');
		double x, y, at;
		int ok = !strcmp(cls, "row") ? sscanf(p + strlen(tag), "x=\"%lf\" y=\"%lf\"", &x, &y) == 2
					     : sscanf(p + strlen(tag), "transform=\"translate(%lf %lf)", &x,
						      &y) == 2;

		at = !strcmp(cls, "row") ? y : x;
		if (ok && gt && !strncmp(gt + 1, host, strlen(host)) &&
		    !strncmp(gt + 1 + strlen(host), "</text>", 7) && at >= lo && at <= hi)
			return 1;
	}
	return 0;
}

/*
 * Elements of class "cell fail": their count; each one's data-from/data-to is
 * the pair from1 <-> from2, and it lies in the row of its sender's host label
 * and the column of its receiver's (where an operator reads it).
 */
static int failed_cells(const char *svg, const char *from1, const char *from2)
{
	int n = 0;

	for (const char *p = strstr(svg, "class=\"cell fail\""); p;
	     p = strstr(p + 1, "class=\"cell fail\"")) {
		char from[160], to[160];
		double x, y, w, h;

		assert_int_equal(sscanf(p, "class=\"cell fail\" data-from=\"%159[^\"]\" "
				       "data-to=\"%159[^\"]\"", from, to), 2);
		assert_true((!strcmp(from, from1) && !strcmp(to, from2)) ||
			    (!strcmp(from, from2) && !strcmp(to, from1)));
		assert_int_equal(sscanf(strstr(p, "<rect "), "<rect x=\"%lf\" y=\"%lf\" width=\"%lf\" "
				       "height=\"%lf\"", &x, &y, &w, &h), 4);
		*strchr(from, ':') = '\0';	/* the host labels: "host-0:mlx5_1:1" -> "host-0" */
		*strchr(to, ':') = '\0';
		assert_true(label_in(svg, "row", from, y, y + h));
		assert_true(label_in(svg, "col", to, x, x + w));
		n++;
	}
	return n;
}

static void test_svg_rails(void **state)
{
	struct fixture fx;
	char *svg, *again;
	int lint;

	(void)state;
	make_report(&fx, "host-0", 0);
	svg = svg_of(&fx.r, "rails");
	assert_int_equal(xml_check(svg), 0);
	lint = xmllint(svg);
	if (lint < 0)
		print_message("xmllint not installed (libxml2-utils): the built-in check only\n");
	assert_true(lint <= 0);
	/* the one failed pair, both directions, in both panels; the other 10 cells x 2 fine */
	assert_int_equal(failed_cells(svg, "host-0:mlx5_1:1", "host-2:mlx5_1:1"), 4);
	assert_non_null(strstr(svg, "data-step=\"connect\""));
	/* listed below the panels (the line wraps after the pair) */
	assert_non_null(strstr(svg, ">FAIL host-0:mlx5_1:1 (GID ::ffff:10.1.0.1) &lt;-&gt; "
				    "host-2:mlx5_1:1 (GID ::ffff:10.1.0.3):"));
	assert_non_null(strstr(svg, "nothing within 10 s &lt;&amp;&gt;</text>"));
	assert_non_null(strstr(svg, "rail-check: FAILED"));
	assert_non_null(strstr(svg, ">rail 0 (mlx5_0:1)</text>"));
	assert_null(strstr(svg, "from rail"));	/* one block per rail */
	/* host-1 on rail 0 at a quarter of the best bandwidth: its own colour */
	assert_non_null(strstr(svg, "host-0:mlx5_0:1 -&gt; host-1:mlx5_0:1: 5.00 GB/s, 12.0"));
	assert_non_null(strstr(svg, "host-0:mlx5_0:1 -&gt; host-2:mlx5_0:1: 20.00 GB/s, 3.0"));
	/* the same report, the same bytes */
	again = svg_of(&fx.r, "rails-again");
	assert_string_equal(svg, again);
	free(again);
	free(svg);
}

static void test_svg_hostile_names(void **state)
{
	struct fixture fx;
	char *svg;

	(void)state;
	make_report(&fx, "a<b&\"c'd>", 0);
	rail_strlcpy(fx.all[1].host, "bad\xff\xc3utf8\xed\xa0\x80", sizeof(fx.all[1].host));
	rail_strlcpy(fx.all[2].dev[0].name, "</text><script>x</script>", sizeof(fx.all[2].dev[0].name));
	svg = svg_of(&fx.r, "hostile");
	assert_int_equal(xml_check(svg), 0);
	assert_true(xmllint(svg) <= 0);
	assert_null(strstr(svg, "a<b"));
	assert_null(strstr(svg, "<script"));
	assert_non_null(strstr(svg, ">a&lt;b&amp;&quot;c&#39;d&gt;</text>"));	/* a row label */
	assert_non_null(strstr(svg, "data-from=\"a&lt;b&amp;&quot;c&#39;d&gt;:mlx5_1:1\""));
	assert_non_null(strstr(svg, ">bad?" "?utf8?" "?" "?</text>"));
	assert_non_null(strstr(svg, "&lt;/text&gt;&lt;script&gt;x&lt;/script&gt;"));
	assert_int_equal(failed_cells(svg, "a&lt;b&amp;&quot;c&#39;d&gt;:mlx5_1:1",
				      "host-2:mlx5_1:1"), 4);
	free(svg);
}

static void test_svg_all_pairs(void **state)
{
	struct fixture fx;
	char *svg;

	(void)state;
	make_report(&fx, "host-0", 1);
	svg = svg_of(&fx.r, "all-pairs");
	assert_int_equal(xml_check(svg), 0);
	assert_non_null(strstr(svg, ">from rail 1</text>"));
	assert_non_null(strstr(svg, ">to rail 1 (mlx5_1:1)</text>"));
	assert_non_null(strstr(svg, "host-0:mlx5_0:1 -&gt; host-2:mlx5_1:1: 20.00 GB/s"));
	assert_int_equal(failed_cells(svg, "host-0:mlx5_1:1", "host-2:mlx5_1:1"), 4);
	free(svg);
}

/* All good, and nothing tested at all (no device anywhere): still a picture. */
static void test_svg_edges(void **state)
{
	struct fixture fx;
	char *svg;

	(void)state;
	make_report(&fx, "host-0", 0);
	for (int i = 0; i < fx.r.ncells; i++)
		fx.cells[i].ok = 1, fx.cells[i].bw = 10, fx.cells[i].lat_us = 4;
	fx.r.nfail = 0;
	svg = svg_of(&fx.r, "all-good");
	assert_int_equal(xml_check(svg), 0);
	assert_non_null(strstr(svg, "rail-check: all good"));
	assert_int_equal(failed_cells(svg, "", ""), 0);
	free(svg);
	for (int k = 0; k < NR; k++)
		fx.all[k].ndev = 0;
	fx.r.ncells = 0;
	rail_ck_problem(&fx.r, 1, "plugin", "the tcp transport on host-0 (rank 0) has no device");
	svg = svg_of(&fx.r, "no-device");
	assert_int_equal(xml_check(svg), 0);
	assert_non_null(strstr(svg, "FAIL plugin: the tcp transport on host-0 (rank 0) has no device"));
	free(svg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_checker_rejects),
		cmocka_unit_test(test_svg_rails),
		cmocka_unit_test(test_svg_hostile_names),
		cmocka_unit_test(test_svg_all_pairs),
		cmocka_unit_test(test_svg_edges),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
