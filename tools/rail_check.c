/*
 * rail-check: a preflight across nodes. Started on two or more hosts, it
 * meets its peers through a TCP rendezvous and checks, through the plugin's
 * own API (what NCCL gets), that every local device reaches every peer
 * device on the same rail (or every device, --all-pairs): connect, a
 * pattern both ways with every byte checked, small-message latency and
 * bandwidth; and that the plugin version, the transport, the settings that
 * must agree, and per device pair GID type, subnet and MTU agree.
 *
 *   rail-check --server [ADDR:]PORT [--ranks N]   the first process (it prints the report)
 *   rail-check --connect HOST:PORT                 each other process
 *   rail-check --rendezvous HOST:PORT              under mpirun/srun: rank 0 (from
 *                                                  OMPI_COMM_WORLD_RANK, SLURM_PROCID or
 *                                                  PMI_RANK) serves on PORT, the others
 *                                                  connect to HOST:PORT
 *
 * The first process prints the report (text, or --json) and, with --svg
 * FILE, writes it as a heatmap too (src/check/check_svg.c).
 *
 * Exit status: 0 all good, 1 any failure, 2 usage or setup error (the
 * check could not run: bad options, no rendezvous).
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "rail.h"
#include "check/check.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: rail-check --server [ADDR:]PORT [--ranks N] [options]   (first process)\n"
		"       rail-check --connect HOST:PORT [options]                (every other one)\n"
		"       rail-check --rendezvous HOST:PORT [options]     (under mpirun / srun)\n"
		"  --ranks N          processes in all, the first included (default 2)\n"
		"  --all-pairs        test every local device against every peer device\n"
		"                     (default: the same device index, i.e. the same rail)\n"
		"  --expect-devices N every process must have N devices (a port that is down\n"
		"                     is left out by the plugin on both ends of its link)\n"
		"  --routed           GIDs may be on different subnets (a routed fabric)\n"
		"  --json             the report as one JSON object (on the first process)\n"
		"  --svg FILE         also write the report as a heatmap picture (SVG, opens in\n"
		"                     a browser): bandwidth and latency per device pair, rails\n"
		"                     as blocks, failing pairs crossed out in red (on the first\n"
		"                     process; exit 2 when FILE cannot be written)\n"
		"  --timeout SEC      bound on each step of each pair (default 10)\n"
		"  --meet-timeout SEC wait for the other processes (default 120)\n"
		"  --lat-iters N      ping-pong round trips for the latency (default 100)\n"
		"  --bw-bytes B       bytes each way for the bandwidth (default 8M; k/M/G)\n"
		"  --bw-msg B         message size for the bandwidth (default 1M)\n"
		"  --hook CMD         (test aid) the first process runs CMD after all met\n"
		"  -v, --verbose      show the plugin's warnings as they happen\n"
		"  --version          print the version\n"
		"The transport and devices are the plugin's choice, as under NCCL:\n"
		"NCCL_RAIL_TRANSPORT, NCCL_IB_HCA, NCCL_SOCKET_IFNAME. Exit status: 0 all good,\n"
		"1 a failure (the report names it), 2 usage or setup error.\n");
}

static size_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	switch (*end) {
	case 'k': case 'K': v *= 1024; end++; break;
	case 'm': case 'M': v *= 1024 * 1024; end++; break;
	case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
	}
	return end == s || *end || v < 1 || v > (double)(1u << 30) ? 0 : (size_t)v;
}

/* The launcher's rank and size, if any; 0 when found. */
static int env_rank(int *rank, int *size)
{
	static const char *const vars[][2] = {
		{ "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
		{ "SLURM_PROCID", "SLURM_NTASKS" },
		{ "PMI_RANK", "PMI_SIZE" },
		{ "PMIX_RANK", "PMIX_SIZE" },
	};

	for (size_t i = 0; i < RAIL_ARRAY_SIZE(vars); i++) {
		const char *r = getenv(vars[i][0]), *s = getenv(vars[i][1]);

		if (r && s) {
			*rank = atoi(r);
			*size = atoi(s);
			return 0;
		}
	}
	return -1;
}

static int check_opts(struct rail_ck_opts *o)
{
	const char *bad = NULL;
	int modes = !!o->server + !!o->connect + !!o->rendezvous, size = 0;
	static char port_spec[16];

	if (modes != 1)
		bad = "give one of --server, --connect or --rendezvous";
	else if (o->ranks < 2 || o->ranks > RAIL_CK_MAX_RANKS)
		bad = "--ranks must be from 2 to 64";
	else if (o->timeout <= 0 || o->meet_timeout <= 0)
		bad = "--timeout and --meet-timeout must be positive";
	else if (o->expect_devs < 0 || o->expect_devs > RAIL_CK_MAX_DEVS)
		bad = "--expect-devices must be from 0 to 16";
	else if (o->lat_iters < 1)
		bad = "--lat-iters must be at least 1";
	else if (!o->bw_bytes || !o->bw_msg || o->bw_msg > (64u << 20))
		bad = "--bw-bytes and --bw-msg need sizes, --bw-msg at most 64M";
	if (!bad && o->rendezvous) {
		char host[256];
		int port;

		if (env_rank(&o->env_rank, &size))
			bad = "--rendezvous needs the launcher's rank and size (OMPI_COMM_WORLD_RANK/"
			      "SIZE, SLURM_PROCID/NTASKS or PMI_RANK/SIZE); without a launcher use "
			      "--server and --connect";
		else if (size < 2 || size > RAIL_CK_MAX_RANKS || o->env_rank < 0 || o->env_rank >= size)
			bad = "the launcher's rank and size are out of range (2 to 64 processes)";
		else if (rail_hostport_split(o->rendezvous, host, sizeof(host), &port) || !host[0])
			bad = "--rendezvous needs HOST:PORT, HOST being where rank 0 runs";
		else if (o->env_rank == 0) {
			snprintf(port_spec, sizeof(port_spec), "%d", port);
			o->server = port_spec;
			o->ranks = size;
		}
	}
	if (bad)
		fprintf(stderr, "rail-check: %s (--help lists the options)\n", bad);
	return bad ? -1 : 0;
}

static int parse_opts(int argc, char **argv, struct rail_ck_opts *o)
{
	static const struct option longopts[] = {
		{ "server", required_argument, NULL, 'S' },
		{ "connect", required_argument, NULL, 'C' },
		{ "rendezvous", required_argument, NULL, 'R' },
		{ "ranks", required_argument, NULL, 'n' },
		{ "all-pairs", no_argument, NULL, 'a' },
		{ "expect-devices", required_argument, NULL, 'e' },
		{ "routed", no_argument, NULL, 'r' },
		{ "json", no_argument, NULL, 'j' },
		{ "svg", required_argument, NULL, 'G' },
		{ "timeout", required_argument, NULL, 't' },
		{ "meet-timeout", required_argument, NULL, 'm' },
		{ "lat-iters", required_argument, NULL, 'l' },
		{ "bw-bytes", required_argument, NULL, 'b' },
		{ "bw-msg", required_argument, NULL, 'B' },
		{ "hook", required_argument, NULL, 'H' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "vh", longopts, NULL)) != -1) {
		switch (c) {
		case 'S': o->server = optarg; break;
		case 'C': o->connect = optarg; break;
		case 'R': o->rendezvous = optarg; break;
		case 'n': o->ranks = atoi(optarg); break;
		case 'a': o->all_pairs = 1; break;
		case 'e': o->expect_devs = atoi(optarg); break;
		case 'r': o->routed = 1; break;
		case 'j': o->json = 1; break;
		case 'G': o->svg = optarg; break;
		case 't': o->timeout = atof(optarg); break;
		case 'm': o->meet_timeout = atof(optarg); break;
		case 'l': o->lat_iters = atoi(optarg); break;
		case 'b': o->bw_bytes = parse_size(optarg); break;
		case 'B': o->bw_msg = parse_size(optarg); break;
		case 'H': o->hook = optarg; break;
		case 'v': o->verbose = 1; break;
		case 'V': printf("rail-check (nccl-net-rail) %s\n", RAIL_VERSION_STRING); exit(0);
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "rail-check: unexpected argument '%s' (--help lists the options)\n",
			argv[optind]);
		return -1;
	}
	return check_opts(o);
}

/* ---- the pair tests ----------------------------------------------------------- */

struct run {
	struct rail_ck_opts *o;
	struct rail_ck_meet m;
	struct rail_ck_info me;
	void *ctx;
	FILE *svg;		/* --svg on the first process: opened before the tests */
	struct rail_ck_cell *cells;
	int ncells, cap;
};

static struct rail_ck_cell *new_cell(struct run *u, int mine, int peer, int theirs)
{
	struct rail_ck_cell *c;

	if (u->ncells == u->cap) {
		int cap = u->cap ? 2 * u->cap : 64;
		struct rail_ck_cell *n = realloc(u->cells, (size_t)cap * sizeof(*n));

		if (!n) {
			fprintf(stderr, "rail-check: out of memory\n");
			exit(RAIL_CK_EXIT_SETUP);
		}
		u->cells = n, u->cap = cap;
	}
	c = &u->cells[u->ncells++];
	memset(c, 0, sizeof(*c));
	c->ra = u->m.rank, c->da = mine, c->rb = peer, c->db = theirs;
	return c;
}

/* Device pairs with one peer, in the order both sides use (the lower rank's devices outer). */
static void test_peer(struct run *u, int peer, uint64_t fd_deadline)
{
	const struct rail_ck_info *p = &u->m.all[peer];
	int role = u->m.rank < peer ? 0 : 1, fd = -1, lost = 0;
	int na = role == 0 ? u->me.ndev : p->ndev, nb = role == 0 ? p->ndev : u->me.ndev;

	if (!u->me.transport[0] || !p->transport[0] || strcmp(u->me.transport, p->transport))
		return;	/* listed as a problem by the report */
	fd = rail_ck_pair_fd(&u->m, peer, fd_deadline);
	for (int a = 0; a < na; a++)
		for (int b = 0; b < nb; b++) {
			int mine = role == 0 ? a : b, theirs = role == 0 ? b : a;
			struct rail_ck_cell *c;

			if (!u->o->all_pairs && a != b)
				continue;
			c = new_cell(u, mine, peer, theirs);
			if (fd < 0 || lost) {
				c->tested = 1;
				rail_strlcpy(c->step, "control", sizeof(c->step));
				snprintf(c->why, sizeof(c->why), "no control connection with rank %d "
					 "(%s): its rail-check stopped or cannot be reached (see its "
					 "output)", peer, p->host);
				continue;
			}
			if (!u->o->json)
				fprintf(stderr, "# rail-check: %s <-> %s %s ...\n", u->me.dev[mine].name,
					p->host, p->dev[theirs].name);
			lost = rail_ck_pair_test(u->o, u->ctx, fd, role, mine, theirs, c) < 0;
		}
}

/* ---- results --------------------------------------------------------------------- */

static double total_budget(const struct run *u)
{
	int maxdev = 1;

	for (int r = 0; r < u->m.nranks; r++)
		maxdev = RAIL_MAX(maxdev, u->m.all[r].ndev);
	return u->o->meet_timeout + (double)u->m.nranks * maxdev *
	       (u->o->all_pairs ? maxdev : 1) * 6 * (u->o->timeout + 10);
}

/* --svg: the report as a picture; 0, or -1 after a message. */
static int svg_finish(struct run *u, const struct rail_ck_report *r)
{
	int bad;

	errno = 0;
	bad = rail_ck_print_svg(r, u->svg);
	bad |= fclose(u->svg);
	u->svg = NULL;
	if (bad)
		fprintf(stderr, "rail-check: --svg %s: writing the picture failed: %s (the report "
			"above stands)\n", u->o->svg, errno ? strerror(errno) : "out of memory");
	else if (!u->o->json)
		printf("rail-check: the heatmap is in %s (open it in a browser)\n", u->o->svg);
	return bad ? -1 : 0;
}

static int hub_finish(struct run *u)
{
	struct rail_ck_report *r = calloc(1, sizeof(*r));
	char *buf = malloc(RAIL_CK_MSG_MAX);
	uint64_t dl = rail_ck_deadline(total_budget(u));
	int code;

	if (!r || !buf)
		return RAIL_CK_EXIT_SETUP;
	r->nranks = u->m.nranks;
	r->all = u->m.all;
	for (int k = 1; k < u->m.nranks; k++) {
		struct rail_ck_cell *tmp = NULL;
		int n = -1, lines = 1;

		if (!rail_ck_msg_recv(u->m.fds[k], RAIL_CK_MSG_RESULT, buf, RAIL_CK_MSG_MAX, NULL, dl)) {
			for (const char *q = buf; *q; q++)
				lines += *q == '\n';
			tmp = calloc((size_t)lines, sizeof(*tmp));
			n = tmp ? rail_ck_cells_decode(buf, tmp, lines) : -1;
		}
		if (n < 0)
			rail_ck_problem(r, 1, "lost", "rank %d (%s) stopped before sending its results "
				   "(see its output)", k, u->m.all[k].host);
		for (int i = 0; i < n; i++)	/* only rank k's own rows, of devices that exist */
			if (tmp[i].ra == k && tmp[i].da < u->m.all[k].ndev &&
			    tmp[i].rb < u->m.nranks && tmp[i].db < u->m.all[tmp[i].rb].ndev)
				*new_cell(u, 0, 0, 0) = tmp[i];
		free(tmp);
	}
	r->cells = u->cells;
	r->ncells = u->ncells;
	rail_ck_static_checks(r, u->o);
	if (u->o->json)
		rail_ck_print_json(r, stdout);
	else
		rail_ck_print_text(r, stdout);
	fflush(stdout);
	code = r->nfail ? RAIL_CK_EXIT_FAIL : RAIL_CK_EXIT_OK;
	if (u->svg && svg_finish(u, r) && code == RAIL_CK_EXIT_OK)
		code = RAIL_CK_EXIT_SETUP;
	snprintf(buf, 16, "%d", code);
	for (int k = 1; k < u->m.nranks; k++)
		rail_ck_msg_send(u->m.fds[k], RAIL_CK_MSG_FINAL, buf, strlen(buf), rail_ck_deadline(5));
	free(buf);
	free(r);
	return code;
}

static int peer_finish(struct run *u)
{
	char *buf = malloc(RAIL_CK_MSG_MAX), fin[16];
	const struct rail_ck_info *hub = &u->m.all[0];
	int nfail = 0, code;

	if (!buf || rail_ck_cells_encode(u->cells, u->ncells, buf, RAIL_CK_MSG_MAX) < 0)
		return RAIL_CK_EXIT_SETUP;
	for (int i = 0; i < u->ncells; i++)
		nfail += !u->cells[i].ok;
	if (rail_ck_msg_send(u->m.hub_fd, RAIL_CK_MSG_RESULT, buf, strlen(buf),
			     rail_ck_deadline(u->o->timeout)) ||
	    rail_ck_msg_recv(u->m.hub_fd, RAIL_CK_MSG_FINAL, fin, sizeof(fin), NULL,
			rail_ck_deadline(total_budget(u)))) {
		fprintf(stderr, "rail-check: the first process (%s) stopped before the report "
			"(see its output)\n", hub->host);
		free(buf);
		return RAIL_CK_EXIT_SETUP;
	}
	free(buf);
	code = atoi(fin);
	if (!u->o->json)
		printf("rail-check: rank %d (%s): %d device pair(s) tested here, %d failed; %s; the "
		       "report is printed by rank 0 (%s)\n", u->m.rank, u->me.host, u->ncells, nfail,
		       code ? "FAILED" : "all good", hub->host);
	return code;
}

int main(int argc, char **argv)
{
	struct rail_ck_opts o = { .ranks = 2, .env_rank = -1, .timeout = 10, .meet_timeout = 120,
			     .lat_iters = 100, .bw_bytes = 8u << 20, .bw_msg = 1u << 20 };
	struct run u = { .o = &o };
	char why[RAIL_CK_WHY] = "";
	int init_ok, code;

	if (parse_opts(argc, argv, &o))
		return RAIL_CK_EXIT_SETUP;
	/* the first process writes it: find out now, not after the tests, that it cannot */
	if (o.svg && o.server && !(u.svg = fopen(o.svg, "w"))) {
		fprintf(stderr, "rail-check: --svg %s: cannot write it: %s\n", o.svg, strerror(errno));
		return RAIL_CK_EXIT_SETUP;
	}
	rail_ck_verbose = o.verbose;
	o.bw_msg = RAIL_MIN(o.bw_msg, o.bw_bytes);
	/* Each rail is tested alone: a connection that moved to another NIC would hide its fault. */
	setenv("NCCL_RAIL_FAILOVER", "0", 1);
	init_ok = rail_net_init(&u.ctx, 0x72636b, -1, (ncclDebugLogger_t)rail_ck_logger, 12) ==
		  ncclSuccess;
	if (!init_ok)
		rail_ck_last_warning(why, sizeof(why));
	rail_ck_info_local(&u.me, init_ok, why[0] ? why : "init failed");
	u.me.want_rank = o.env_rank;
	if (rail_ck_meet(&o, &u.me, &u.m)) {
		code = RAIL_CK_EXIT_SETUP;
		goto out;
	}
	u.me = u.m.all[u.m.rank];
	for (int peer = 0; peer < u.m.nranks; peer++)
		if (peer != u.m.rank)
			test_peer(&u, peer, rail_ck_deadline(total_budget(&u)));
	code = u.m.rank == 0 ? hub_finish(&u) : peer_finish(&u);
out:
	if (u.svg) {	/* the check did not run: no picture rather than an empty one */
		fclose(u.svg);
		unlink(o.svg);
	}
	rail_ck_meet_close(&u.m);
	free(u.cells);
	if (init_ok)
		rail_net_finalize(u.ctx);
	return code;
}
