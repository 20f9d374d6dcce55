/*
 * rail-info: the doctor, and a gate for job prologs and readiness probes.
 * It prints what the plugin would do on this host and why, by calling the
 * same functions the plugin calls: NCCL's configuration files
 * (rail_ncclconf_apply), the plugin library NCCL would load
 * (rail_netplugin_resolve), the transport choice (rail_transport_select),
 * the verbs devices, GIDs and GPU-memory ladder (rail_ib_report), the
 * topology and the NIC of every GPU (src/topo), every configuration
 * variable (rail_params_print), and the problems found, with remedies.
 *
 *   rail-info                      report for humans
 *   rail-info --json               the same as one JSON object (schema 1)
 *   rail-info --check              one line per problem, or one OK line
 *   rail-info --version
 *   rail-info --plugin VALUE       check VALUE instead of NCCL_NET_PLUGIN
 *   rail-info --sysfs-root DIR     read a copy of sysfs (fixture, snapshot)
 *   rail-info --snapshot DIR       also copy what was read into DIR
 *   rail-info --config [--markdown|--json]   the configuration table
 *   rail-info --stats FILE         the NCCL_RAIL_STATS counters as a table
 *
 * Exit status of the reporting modes (plain, --json, --check): 0 ready,
 * 1 usable with warnings, 2 not usable, 64 bad command line.
 */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib/ib_report.h"
#include "ifaces.h"
#include "log.h"
#include "ncclconf.h"
#include "netplugin.h"
#include "param.h"
#include "rail.h"
#include "rail_info/stats_table.h"
#include "sysfs.h"
#include "topo/topo.h"
#include "transport.h"

#define ABI_FIRST 6
#define ABI_LAST 12
/* Bump on any incompatible change of the JSON document (README: rail-info as a gate). */
#define RAIL_INFO_SCHEMA 1

enum rail_info_exit {
	RAIL_INFO_READY = 0,
	RAIL_INFO_WARNINGS = 1,
	RAIL_INFO_NOT_USABLE = 2,
	RAIL_INFO_USAGE = 64,
};

struct opts {
	int json;
	int check;
	int config;
	const char *config_format;
	const char *root;
	const char *gpus;
	const char *snapshot;
	const char *gpu;
	const char *plugin;
	int no_transport;
	int xml;
	const char *stats;
};

struct transport_info {
	const char *name;	/* NULL: none usable */
	char why[512];
	char desc[1024];
	int ndevs;
	int loopback_only;	/* every interface selected for sockets is loopback */
	char ifaces[160];
};

#define MAX_PROBLEMS 48

struct problem {
	int error;		/* 0: warning */
	const char *area;	/* config, plugin, transport, topology */
	char text[2048];
};

struct report {
	const struct opts *o;
	struct rail_ncclconf conf;
	struct rail_netplugin np;
	const char *np_source;	/* option, environment, conf_file, default */
	const char *np_file;	/* the configuration file that set it */
	struct transport_info ti;
	struct rail_topo *t;
	int nproblems;
	struct problem problems[MAX_PROBLEMS];
};

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: rail-info [options]\n"
		"Explains what the nccl-net-rail plugin would do on this host, and why.\n\n"
		"  --check             one line per problem (WARN: / ERROR:), or one OK: line\n"
		"  --json              print one JSON object instead of text\n"
		"  --plugin VALUE      check this NCCL_NET_PLUGIN value (a name, a path or a\n"
		"                      comma list) instead of the environment's\n"
		"  --sysfs-root DIR    read a copy of sysfs (DIR holds sys/...) instead of /sys\n"
		"  --gpus BDF[,BDF]    also treat these PCI devices as GPUs (other accelerators)\n"
		"  --gpu SPEC          only the NICs of one GPU: PCI address, index, or UUID\n"
		"  --snapshot DIR      copy every sysfs file read into DIR; read it back later\n"
		"                      with --sysfs-root DIR to get the same answer\n"
		"  --nccl-topo-xml     print the NCCL topology file the plugin would write\n"
		"  --no-transport      skip the transport and verbs sections (and checks)\n"
		"  --config            every configuration variable: value, default, doc\n"
		"      --markdown      ... as the README's markdown table\n"
		"      --json          ... as JSON\n"
		"  --stats FILE        the per-connection counters NCCL_RAIL_STATS wrote (a\n"
		"                      stats file or an NCCL log; - for stdin) as a table\n"
		"  --version           print the version\n"
		"  --help              this text\n\n"
		"Exit status (report, --json, --check): 0 ready, 1 usable with warnings,\n"
		"2 not usable, 64 bad command line.\n"
		"Environment: every NCCL_* variable the plugin reads (see --config), after\n"
		"NCCL's configuration files (NCCL_CONF_FILE or ~/.nccl.conf, then\n"
		"/etc/nccl.conf); NCCL_DEBUG=INFO for the plugin's own log lines on stderr.\n");
}

static int check_args(int argc, char **argv, const struct opts *o)
{
	if (optind < argc) {
		fprintf(stderr, "rail-info: unexpected argument \"%s\"\n", argv[optind]);
		return -EINVAL;
	}
	if (o->config_format && !o->config) {
		fprintf(stderr, "rail-info: --markdown goes with --config\n");
		return -EINVAL;
	}
	if (o->check && (o->json || o->config || o->gpu || o->xml)) {
		fprintf(stderr, "rail-info: --check goes with none of --json, --config, --gpu, "
			"--nccl-topo-xml\n");
		return -EINVAL;
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "check", no_argument, NULL, 'k' },
		{ "plugin", required_argument, NULL, 'p' },
		{ "sysfs-root", required_argument, NULL, 'r' },
		{ "gpus", required_argument, NULL, 'g' },
		{ "gpu", required_argument, NULL, 'G' },
		{ "snapshot", required_argument, NULL, 's' },
		{ "config", no_argument, NULL, 'c' },
		{ "markdown", no_argument, NULL, 'm' },
		{ "nccl-topo-xml", no_argument, NULL, 'x' },
		{ "no-transport", no_argument, NULL, 'n' },
		{ "stats", required_argument, NULL, 'S' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'j': o->json = 1; break;
		case 'k': o->check = 1; break;
		case 'p': o->plugin = optarg; break;
		case 'r': o->root = optarg; break;
		case 'g': o->gpus = optarg; break;
		case 'G': o->gpu = optarg; break;
		case 's': o->snapshot = optarg; break;
		case 'c': o->config = 1; break;
		case 'm': o->config_format = "markdown"; break;
		case 'x': o->xml = 1; break;
		case 'S': o->stats = optarg; break;
		case 'n': o->no_transport = 1; break;
		case 'V': printf("rail-info (nccl-net-rail) %s\n", RAIL_VERSION_STRING); exit(0);
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -EINVAL;
		}
	}
	return check_args(argc, argv, o);
}

static void json_str(FILE *out, const char *s)
{
	fputc('"', out);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c < 0x20)
			fprintf(out, "\\u%04x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}

/* A string, or null when s is NULL or empty. */
static void json_str_or_null(FILE *out, const char *s)
{
	if (s && s[0])
		json_str(out, s);
	else
		fputs("null", out);
}

__attribute__((format(printf, 4, 5)))
static void problem(struct report *r, int error, const char *area, const char *fmt, ...)
{
	struct problem *p;
	va_list ap;

	if (r->nproblems == MAX_PROBLEMS)
		return;
	p = &r->problems[r->nproblems++];
	p->error = error;
	p->area = area;
	va_start(ap, fmt);
	vsnprintf(p->text, sizeof(p->text), fmt, ap);
	va_end(ap);
}

static int exit_status(const struct report *r)
{
	int status = RAIL_INFO_READY;

	for (int i = 0; i < r->nproblems; i++)
		status = RAIL_MAX(status, r->problems[i].error ? RAIL_INFO_NOT_USABLE
							       : RAIL_INFO_WARNINGS);
	return status;
}

static const char *status_name(int status)
{
	return status == RAIL_INFO_READY      ? "ready"
	       : status == RAIL_INFO_WARNINGS ? "usable_with_warnings"
					      : "not_usable";
}

/* ---- gathering ---------------------------------------------------------- */

/* NCCL's configuration files, applied before any variable is read. */
static void apply_conf_files(struct report *r)
{
	char paths[RAIL_NCCLCONF_MAX_FILES][PATH_MAX];
	const char *list[RAIL_NCCLCONF_MAX_FILES];
	int n = rail_ncclconf_default_paths(paths, RAIL_NCCLCONF_MAX_FILES);

	for (int i = 0; i < n; i++)
		list[i] = paths[i];
	if (rail_ncclconf_apply(list, n < 0 ? 0 : n, &r->conf))
		fprintf(stderr, "rail-info: out of memory reading NCCL's configuration files\n");
}

static void resolve_plugin(struct report *r)
{
	const char *value = NULL;

	if (r->o->plugin) {
		value = r->o->plugin;
		r->np_source = "option";
	} else if (rail_param_is_set(RAIL_P_NET_PLUGIN)) {
		value = rail_param_str(RAIL_P_NET_PLUGIN);
		r->np_file = rail_ncclconf_source(&r->conf, "NCCL_NET_PLUGIN");
		r->np_source = r->np_file ? "conf_file" : "environment";
	} else {
		r->np_source = "default";
	}
	rail_netplugin_resolve(value, &r->np);
}

/* Are the interfaces sockets would use (TCP data, verbs handshake) all loopback? */
static void check_ifaces(struct transport_info *ti)
{
	struct rail_iface ifs[RAIL_MAX_IFACES];
	char rule[160];
	int n = rail_ifaces_find(ifs, RAIL_MAX_IFACES, rule, sizeof(rule)), lo = 0;
	size_t off = 0;

	for (int i = 0; i < n; i++) {
		lo += ifs[i].loopback;
		if (off < sizeof(ti->ifaces))
			off += (size_t)snprintf(ti->ifaces + off, sizeof(ti->ifaces) - off, "%s%s",
						i ? "," : "", ifs[i].name);
	}
	ti->loopback_only = n > 0 && lo == n;
}

/* The transport the plugin would pick, described, then released again. */
static void probe_transport(struct transport_info *ti)
{
	const struct rail_transport_ops *ops;

	memset(ti, 0, sizeof(*ti));
	ops = rail_transport_select(ti->why, sizeof(ti->why));
	if (!ops)
		return;
	ti->name = ops->name;
	ti->ndevs = ops->ndevs ? ops->ndevs() : 0;
	if (ops->describe)
		ops->describe(ti->desc, sizeof(ti->desc));
	ops->fini();
	check_ifaces(ti);
}

/* ---- problems ------------------------------------------------------------ */

static void conf_problems(struct report *r)
{
	for (int f = 0; f < r->conf.nfiles; f++) {
		const struct rail_ncclconf_file *file = &r->conf.files[f];

		if (file->err && file->err != -ENOENT)
			problem(r, 0, "config", "cannot read NCCL configuration file %s: %s; NCCL "
				"skips it too: fix its permissions or remove it", file->path,
				RAIL_ERRSTR(file->err));
		for (int i = 0; i < file->nvars; i++) {
			const struct rail_ncclconf_var *v = &file->vars[i];

			if (v->state == RAIL_NCCLCONF_REJECTED)
				problem(r, 0, "config", "%s line %d: \"%s\" is not a variable name; "
					"write VAR=value", file->path, v->line, v->name);
			else if (v->odd_space)
				problem(r, 0, "config", "%s line %d: NCCL keeps the spaces or carriage "
					"return in \"%s=%s\" (no trimming): remove them", file->path,
					v->line, v->name, v->value);
		}
	}
}

static void param_problems(struct report *r)
{
	extern char **environ;

	for (int i = 0; i < RAIL_P_COUNT; i++) {
		const struct rail_param_desc *d = &rail_param_table[i];
		const char *v = getenv(d->name);
		char why[160];
		int64_t num;

		if (v && rail_param_parse((enum rail_param_id)i, v, &num, why, sizeof(why)))
			problem(r, 0, "config", "%s=\"%s\" is not valid (%s): the default %s is used",
				d->name, v, why, d->def[0] ? d->def : "\"\"");
	}
	for (char **e = environ; e && *e; e++) {
		size_t len = strcspn(*e, "=");
		int known = 0;

		if (strncmp(*e, "NCCL_RAIL_", 10))
			continue;
		for (int i = 0; i < RAIL_P_COUNT && !known; i++)
			known = strlen(rail_param_table[i].name) == len &&
				!strncmp(rail_param_table[i].name, *e, len);
		if (!known)
			problem(r, 0, "config", "unknown variable %.*s is ignored; rail-info --config "
				"lists them all", (int)len, *e);
	}
}

static void tries_text(const struct rail_netplugin_entry *e, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < e->ntried && off < len; i++) {
		if (e->loaded && i == e->ntried - 1)
			break;
		off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "; " : "", e->error[i]);
	}
}

#define PLUGIN_REMEDY                                                                        \
	"put the directory of libnccl-net-rail.so in the loader's path (ldconfig after "     \
	"installing to a directory listed in /etc/ld.so.conf.d, or LD_LIBRARY_PATH exported " \
	"to every rank), or give its absolute path: NCCL_NET_PLUGIN=/abs/path/"               \
	"libnccl-net-rail.so (NCCL 2.21 and later)"

/* NCCL_NET_PLUGIN is set (not "none") but the library NCCL uses is not ours. */
static void plugin_not_rail(struct report *r, const struct rail_netplugin_entry *c)
{
	const struct rail_netplugin *np = &r->np;
	char errs[1024] = "";

	if (c && !np->names_rail) {
		problem(r, 0, "plugin", "NCCL_NET_PLUGIN=%s loads %s (plugin \"%s\"), not "
			"nccl-net-rail: set NCCL_NET_PLUGIN=rail to use it", np->value, c->path,
			c->name);
		return;
	}
	for (int i = 0; i < np->nentries; i++) {
		const struct rail_netplugin_entry *e = &np->entries[i];

		if (e->loaded && e->is_rail) {
			problem(r, 0, "plugin", "NCCL tries %s (plugin \"%s\") before nccl-net-rail "
				"(%s): if it initialises, nccl-net-rail is not used; put rail first "
				"in NCCL_NET_PLUGIN", c->path, c->name, e->path);
			return;
		}
		if (e->names_rail && !errs[0])
			tries_text(e, errs, sizeof(errs));
	}
	if (!errs[0] && !np->entries[0].loaded)
		tries_text(&np->entries[0], errs, sizeof(errs));
	problem(r, 1, "plugin", "NCCL_NET_PLUGIN=%s: %s (%s), so NCCL %s; %s", np->value,
		np->names_rail ? "nccl-net-rail does not load" : "no net plugin loads",
		errs[0] ? errs : "no such library",
		c ? "uses another plugin" : "falls back to its built-in IB/Socket transports",
		PLUGIN_REMEDY);
}

static void plugin_problems(struct report *r)
{
	const struct rail_netplugin *np = &r->np;
	const struct rail_netplugin_entry *c = np->chosen >= 0 ? &np->entries[np->chosen] : NULL;

	if (np->none) {
		problem(r, 0, "plugin", "NCCL_NET_PLUGIN=%s: NCCL loads no external net plugin, so "
			"nccl-net-rail is not used; set NCCL_NET_PLUGIN=rail", np->value);
		return;
	}
	if (np->any_path)
		problem(r, 0, "plugin", "NCCL_NET_PLUGIN=%s is a path: NCCL before 2.21 accepts "
			"only a name (it loads libnccl-net-NAME.so from the loader's path); for "
			"older NCCL set NCCL_NET_PLUGIN=rail and put the directory in LD_LIBRARY_PATH "
			"or the ldconfig cache", np->value);
	if (!np->set && !c)
		problem(r, 0, "plugin", "NCCL_NET_PLUGIN is unset and libnccl-net.so does not load "
			"(%s): NCCL uses its built-in IB/Socket transports, not nccl-net-rail; set "
			"NCCL_NET_PLUGIN=rail (or check the value jobs use with --plugin VALUE)",
			np->entries[0].error[0]);
	else if (!np->set && !c->is_rail)
		problem(r, 0, "plugin", "NCCL_NET_PLUGIN is unset: NCCL loads libnccl-net.so = %s "
			"(plugin \"%s\"), not nccl-net-rail; set NCCL_NET_PLUGIN=rail", c->path,
			c->name);
	else if (np->set && (!c || !c->is_rail))
		plugin_not_rail(r, c);
	for (int i = 0; i < np->nentries; i++)
		if (np->entries[i].loaded && np->entries[i].newest_abi < RAIL_NETPLUGIN_ABI_PROBED)
			problem(r, 0, "plugin", "%s exports no ncclNetPlugin_v6..v12 table: NCCL "
				"2.28 and later skip it", np->entries[i].path);
	if (!c || !c->is_rail)
		return;
	if (!c->rail_version[0])
		problem(r, 0, "plugin", "%s is nccl-net-rail without a version ident (built "
			"before 0.2.0?): install the same version as rail-info %s", c->path,
			RAIL_VERSION_STRING);
	else if (strcmp(c->rail_version, RAIL_VERSION_STRING))
		problem(r, 0, "plugin", "NCCL would load nccl-net-rail %s (%s) but this rail-info "
			"is %s, so its report may not match what the plugin does: install one "
			"version of both", c->rail_version, c->path, RAIL_VERSION_STRING);
}

static int usable_ports(const struct rail_topo *t)
{
	int usable = 0;

	for (int i = 0; t && i < t->nnics; i++)
		for (int p = 0; p < t->nics[i].nports; p++)
			usable += t->nics[i].ports[p].usable;
	return usable;
}

/* What only rail-info can see: the transport next to the topology. */
static void transport_problems(struct report *r)
{
	const struct transport_info *ti = &r->ti;
	int usable = usable_ports(r->t);

	if (!ti->name) {
		problem(r, 1, "transport", "no transport is usable (%s): NCCL cannot use the "
			"plugin's network; check NCCL_RAIL_TRANSPORT, NCCL_IB_HCA and "
			"NCCL_SOCKET_IFNAME", ti->why);
		return;
	}
	if (!strcmp(ti->name, "tcp") && usable)
		problem(r, 0, "transport", "%d RDMA port%s ACTIVE but the TCP transport is chosen "
			"(%s): check NCCL_IB_DISABLE, NCCL_RAIL_TRANSPORT and that libibverbs.so.1 "
			"loads (NCCL_IBVERBS_LIB)", usable, usable > 1 ? "s are" : " is", ti->why);
	if (r->t && r->t->ngpus && r->t->nnics && !usable)
		problem(r, 0, "transport", "RDMA devices exist but no port is ACTIVE: GPUDirect "
			"RDMA cannot be used; check cables, the subnet manager (IB) or the link "
			"(RoCE)");
	if (ti->loopback_only)
		problem(r, 0, "transport", "the only network interface selected is loopback (%s): "
			"processes on other hosts cannot connect; set NCCL_SOCKET_IFNAME to the "
			"cluster network's interface", ti->ifaces);
}

static void collect_problems(struct report *r)
{
	conf_problems(r);
	param_problems(r);
	plugin_problems(r);
	if (!r->o->no_transport)
		transport_problems(r);
	for (int i = 0; r->t && i < r->t->nwarn; i++)
		problem(r, 0, "topology", "%s", r->t->warn[i]);
}

/* ---- text ---------------------------------------------------------------- */

/* "node0: CPUs 0-55,112-167" for each NUMA node. */
static void numa_text(FILE *out)
{
	int found = 0;

	fprintf(out, "NUMA nodes:");
	for (int n = 0; n < 64; n++) {
		char path[96], cpus[256];

		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", n);
		if (rail_sysfs_read(path, cpus, sizeof(cpus)) < 0)
			continue;
		fprintf(out, "%s node%d: CPUs %s", found++ ? "," : "", n, cpus);
	}
	fprintf(out, "%s\n", found ? "" : " none listed in sysfs");
}

static const char *state_text(enum rail_ncclconf_state s)
{
	switch (s) {
	case RAIL_NCCLCONF_APPLIED: return "applied";
	case RAIL_NCCLCONF_ENV_WINS: return "ignored: the environment sets it";
	case RAIL_NCCLCONF_SHADOWED: return "ignored: set by an earlier line or file";
	case RAIL_NCCLCONF_REJECTED: return "ignored: not a variable name";
	}
	return "?";
}

static void conf_text(const struct report *r)
{
	int any = 0;

	for (int f = 0; f < r->conf.nfiles; f++)
		any |= r->conf.files[f].err != -ENOENT;
	printf("NCCL configuration files");
	if (!any) {
		printf(":");
		for (int f = 0; f < r->conf.nfiles; f++)
			printf("%s %s", f ? "," : "", r->conf.files[f].path);
		printf(" (none exists)\n");
		return;
	}
	printf(" in NCCL's order (the environment wins over them, the first over the second)\n");
	for (int f = 0; f < r->conf.nfiles; f++) {
		const struct rail_ncclconf_file *file = &r->conf.files[f];

		printf("  %s: %s\n", file->path, file->err == -ENOENT ? "absent"
						  : file->err  ? RAIL_ERRSTR(file->err)
						  : file->nvars ? "read"
								: "read, sets nothing");
		for (int i = 0; i < file->nvars; i++)
			printf("    line %d: %s=%s (%s)\n", file->vars[i].line, file->vars[i].name,
			       file->vars[i].value, state_text(file->vars[i].state));
	}
}

static void plugin_entry_text(const struct rail_netplugin *np, int i)
{
	const struct rail_netplugin_entry *e = &np->entries[i];
	char abis[64], tabis[64], errs[1024];

	if (!e->loaded) {
		tries_text(e, errs, sizeof(errs));
		printf("  %s: does not load: %s\n", e->entry, errs);
		return;
	}
	printf("  %s: %s", e->entry, e->path[0] ? e->path : e->tried[e->ntried - 1]);
	if (e->is_rail)
		printf(": nccl-net-rail %s", e->rail_version[0] ? e->rail_version : "(no version)");
	printf(", plugin \"%s\", ABIs %s", e->name,
	       rail_netplugin_abi_text(e->abi_mask, abis, sizeof(abis)));
	if (e->tuner_mask)
		printf(", tuner ABIs %s", rail_netplugin_abi_text(e->tuner_mask, tabis, sizeof(tabis)));
	printf("%s\n", np->nentries > 1 && i == np->chosen ? "  <= NCCL tries this one first" : "");
}

static void plugin_text(const struct report *r)
{
	const struct rail_netplugin *np = &r->np;

	if (np->none) {
		printf("Net plugin: NCCL_NET_PLUGIN=%s: NCCL loads no external plugin\n", np->value);
		return;
	}
	if (np->set)
		printf("Net plugin NCCL would load (NCCL_NET_PLUGIN=%s, from %s):\n", np->value,
		       !strcmp(r->np_source, "option") ? "--plugin"
		       : r->np_file			? r->np_file
							: "the environment");
	else
		printf("Net plugin NCCL would load (NCCL_NET_PLUGIN unset: libnccl-net.so):\n");
	for (int i = 0; i < np->nentries; i++)
		plugin_entry_text(np, i);
}

static void params_text(const struct report *r)
{
	int any = 0;

	for (int i = 0; i < RAIL_P_COUNT; i++) {
		const char *name = rail_param_table[i].name;
		const char *file;

		if (!rail_param_is_set((enum rail_param_id)i))
			continue;
		file = rail_ncclconf_source(&r->conf, name);
		printf("%s %s=%s (%s)", any++ ? "," : "Configuration set here:", name,
		       rail_param_str((enum rail_param_id)i), file ? file : "environment");
	}
	if (any)
		printf("\n  `rail-info --config` lists every variable\n");
	else
		printf("Configuration: every variable at its default (`rail-info --config` lists "
		       "them)\n");
}

static void problems_text(const struct report *r, int status)
{
	if (r->nproblems)
		printf("Problems:\n");
	for (int i = 0; i < r->nproblems; i++)
		printf("  %-5s %s: %s\n", r->problems[i].error ? "ERROR" : "WARN",
		       r->problems[i].area, r->problems[i].text);
	printf("Status: %s (exit %d)%s\n",
	       status == RAIL_INFO_READY      ? "ready"
	       : status == RAIL_INFO_WARNINGS ? "usable with warnings"
					      : "not usable",
	       status, r->nproblems ? "" : ": no problems found");
}

static void report_text(const struct report *r, int status)
{
	const struct opts *o = r->o;
	const struct transport_info *ti = &r->ti;

	printf("nccl-net-rail %s: NCCL net plugin, ABIs v%d..v%d (ncclNetPlugin_v%d ... "
	       "ncclNetPlugin_v%d)\n\n", RAIL_VERSION_STRING, ABI_FIRST, ABI_LAST, ABI_FIRST,
	       ABI_LAST);
	conf_text(r);
	printf("\n");
	plugin_text(r);
	printf("\n");
	if (!o->no_transport) {
		if (ti->name)
			printf("Transport: %s -- %s\n  %s\n", ti->name, ti->why, ti->desc);
		else
			printf("Transport: none usable -- %s\n", ti->why);
		if (o->root)
			printf("  (the transports open the live devices; --sysfs-root only changes "
			       "what is read from sysfs)\n");
		printf("\n");
		rail_ib_report(stdout, 0);
		printf("\n");
	}
	numa_text(stdout);
	printf("\n");
	rail_topo_print(r->t, stdout, 0);
	printf("\n");
	params_text(r);
	printf("\n");
	problems_text(r, status);
}

/* One line per problem, or one OK line: quiet enough for a prolog's log. */
static void report_check(const struct report *r)
{
	const struct rail_netplugin *np = &r->np;
	const struct rail_netplugin_entry *c = np->chosen >= 0 ? &np->entries[np->chosen] : NULL;

	for (int i = 0; i < r->nproblems; i++)
		printf("%s: %s\n", r->problems[i].error ? "ERROR" : "WARN", r->problems[i].text);
	if (r->nproblems)
		return;
	printf("OK: nccl-net-rail %s ready: ", RAIL_VERSION_STRING);
	if (r->o->no_transport)
		printf("transport not checked (--no-transport)");
	else
		printf("transport %s, %d device%s", r->ti.name, r->ti.ndevs,
		       r->ti.ndevs == 1 ? "" : "s");
	if (c)
		printf("; NCCL loads %s (nccl-net-rail %s)", c->path, c->rail_version);
	printf("\n");
}

/* ---- JSON ---------------------------------------------------------------- */

static void numa_json(FILE *out)
{
	int found = 0;

	fprintf(out, "\"numa_nodes\": [");
	for (int n = 0; n < 64; n++) {
		char path[96], cpus[256];

		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", n);
		if (rail_sysfs_read(path, cpus, sizeof(cpus)) < 0)
			continue;
		fprintf(out, "%s{\"node\": %d, \"cpus\": ", found++ ? ", " : "", n);
		json_str(out, cpus);
		fprintf(out, "}");
	}
	fprintf(out, "]");
}

static void abis_json(unsigned mask)
{
	int first = 1;

	printf("[");
	for (int v = RAIL_NETPLUGIN_ABI_MIN; v <= RAIL_NETPLUGIN_ABI_MAX; v++)
		if (mask & (1u << v)) {
			printf("%s%d", first ? "" : ", ", v);
			first = 0;
		}
	printf("]");
}

static void conf_json(const struct report *r)
{
	printf("\"nccl_conf_files\": [");
	for (int f = 0; f < r->conf.nfiles; f++) {
		const struct rail_ncclconf_file *file = &r->conf.files[f];

		printf("%s\n  {\"path\": ", f ? "," : "");
		json_str(stdout, file->path);
		printf(", \"exists\": %s, \"read\": %s, \"error\": ",
		       file->err != -ENOENT ? "true" : "false", file->err ? "false" : "true");
		if (file->err && file->err != -ENOENT)
			json_str(stdout, RAIL_ERRSTR(file->err));
		else
			printf("null");
		printf(", \"variables\": [");
		for (int i = 0; i < file->nvars; i++) {
			const struct rail_ncclconf_var *v = &file->vars[i];

			printf("%s{\"line\": %d, \"name\": ", i ? ", " : "", v->line);
			json_str(stdout, v->name);
			printf(", \"value\": ");
			json_str(stdout, v->value);
			printf(", \"effect\": \"%s\"}", rail_ncclconf_state_name(v->state));
		}
		printf("]}");
	}
	printf("]");
}

static void plugin_entry_json(const struct rail_netplugin_entry *e)
{
	printf("{\"entry\": ");
	json_str(stdout, e->entry);
	printf(", \"names_rail\": %s, \"is_path\": %s, \"tried\": [", e->names_rail ? "true" : "false",
	       e->is_path ? "true" : "false");
	for (int t = 0; t < e->ntried; t++) {
		int ok = e->loaded && t == e->ntried - 1;

		printf("%s{\"name\": ", t ? ", " : "");
		json_str(stdout, e->tried[t]);
		printf(", \"error\": ");
		json_str_or_null(stdout, ok ? NULL : e->error[t]);
		printf("}");
	}
	printf("], \"loaded\": %s, \"path\": ", e->loaded ? "true" : "false");
	json_str_or_null(stdout, e->path);
	printf(", \"abi_versions\": ");
	abis_json(e->abi_mask);
	printf(", \"tuner_abi_versions\": ");
	abis_json(e->tuner_mask);
	printf(", \"table_name\": ");
	json_str_or_null(stdout, e->name);
	printf(", \"is_rail\": %s, \"rail_version\": ", e->is_rail ? "true" : "false");
	json_str_or_null(stdout, e->rail_version);
	printf("}");
}

static void plugin_json(const struct report *r)
{
	const struct rail_netplugin *np = &r->np;
	const struct rail_netplugin_entry *c = np->chosen >= 0 ? &np->entries[np->chosen] : NULL;

	printf("\"net_plugin\": {\"nccl_net_plugin\": ");
	json_str_or_null(stdout, np->set ? np->value : NULL);
	printf(", \"source\": \"%s\", \"conf_file\": ", r->np_source);
	json_str_or_null(stdout, r->np_file);
	printf(", \"none\": %s, \"candidates\": [", np->none ? "true" : "false");
	for (int i = 0; i < np->nentries; i++) {
		printf("%s\n   ", i ? "," : "");
		plugin_entry_json(&np->entries[i]);
	}
	printf("],\n  \"chosen\": ");
	if (c)
		printf("%d", np->chosen);
	else
		printf("null");
	printf(", \"path\": ");
	json_str_or_null(stdout, c ? c->path : NULL);
	printf(", \"is_rail\": %s, \"rail_version\": ", c && c->is_rail ? "true" : "false");
	json_str_or_null(stdout, c ? c->rail_version : NULL);
	printf("}");
}

static void problems_json(const struct report *r)
{
	printf("\"problems\": [");
	for (int i = 0; i < r->nproblems; i++) {
		printf("%s\n  {\"severity\": \"%s\", \"area\": \"%s\", \"message\": ", i ? "," : "",
		       r->problems[i].error ? "error" : "warning", r->problems[i].area);
		json_str(stdout, r->problems[i].text);
		printf("}");
	}
	printf("%s]", r->nproblems ? "\n " : "");
}

static void transport_json(const struct report *r)
{
	const struct transport_info *ti = &r->ti;

	printf("\"transport\": ");
	if (r->o->no_transport) {
		printf("null, \"verbs\": null");
		return;
	}
	printf("{\"name\": ");
	json_str_or_null(stdout, ti->name);
	printf(", \"reason\": ");
	json_str(stdout, ti->why);
	printf(", \"description\": ");
	json_str(stdout, ti->desc);
	printf(", \"device_count\": %d, \"socket_interfaces\": ", ti->ndevs);
	json_str(stdout, ti->ifaces);
	printf(", \"loopback_only\": %s},\n \"verbs\": ", ti->loopback_only ? "true" : "false");
	fflush(stdout);
	rail_ib_report(stdout, 1);
}

static void report_json(const struct report *r, int status)
{
	printf("{\"schema\": %d, \"rail_info_version\": \"%s\", \"abi_versions\": [",
	       RAIL_INFO_SCHEMA, RAIL_VERSION_STRING);
	for (int v = ABI_FIRST; v <= ABI_LAST; v++)
		printf("%s%d", v > ABI_FIRST ? ", " : "", v);
	printf("],\n \"status\": \"%s\", \"exit_code\": %d,\n ", status_name(status), status);
	problems_json(r);
	printf(",\n ");
	conf_json(r);
	printf(",\n ");
	plugin_json(r);
	printf(",\n ");
	transport_json(r);
	printf(",\n ");
	fflush(stdout);
	numa_json(stdout);
	printf(",\n \"parameters\": ");
	fflush(stdout);
	rail_params_print(stdout, "json");
	printf(",\n \"topology\": {");
	rail_topo_print_json_members(r->t, stdout);
	printf("}}\n");
}

/* ---- main ---------------------------------------------------------------- */

static void print_one_gpu(const struct rail_topo *t, const char *spec, int json)
{
	char bdf[RAIL_TOPO_BDF_LEN];
	const struct rail_topo_choice *ch;
	int err = rail_topo_resolve_gpu(t, spec, bdf, sizeof(bdf));

	if (err) {
		fprintf(stderr, "rail-info: --gpu %s: %s\n", spec,
			err == -ENOENT ? "no such GPU here" : "names no single GPU");
		return;
	}
	ch = rail_topo_choice_for_gpu(t, bdf);
	if (json) {
		fprintf(stdout, "{\"bdf\": \"%s\", \"locality\": \"%s\", \"reason\": ", bdf,
			rail_topo_locality_name(ch->locality));
		json_str(stdout, ch->reason);
		fprintf(stdout, ", \"nics\": [");
	} else {
		fprintf(stdout, "GPU %s (%s): ", bdf, rail_topo_locality_name(ch->locality));
	}
	for (int i = 0; i < ch->npicks; i++) {
		const struct rail_topo_nic *nic = &t->nics[ch->picks[i].nic];
		int port = nic->ports[ch->picks[i].port_idx].port;

		if (json)
			fprintf(stdout, "%s{\"name\": \"%s\", \"port\": %d, \"relation\": \"%s\"}",
				i ? ", " : "", nic->name, port, rail_topo_rel_name(ch->picks[i].rel));
		else
			fprintf(stdout, "%s%s:%d", i ? "," : "", nic->name, port);
	}
	if (json)
		fprintf(stdout, "]}\n");
	else
		fprintf(stdout, "%s -- %s\n", ch->npicks ? "" : "none", ch->reason);
}

/* Everything the report needs; 0, or the exit status when it cannot be made. */
static int gather(struct report *r)
{
	const struct opts *o = r->o;
	int err;

	if (o->root)
		rail_sysfs_set_root(o->root);
	if (o->snapshot && (err = rail_sysfs_record_start(o->snapshot))) {
		fprintf(stderr, "rail-info: cannot write a snapshot into %s: %s\n", o->snapshot,
			RAIL_ERRSTR(err));
		return RAIL_INFO_USAGE;
	}
	err = rail_topo_build(o->gpus, &r->t);
	if (err) {
		fprintf(o->check ? stdout : stderr, "%s: cannot read the topology under %s/sys: %s\n",
			o->check ? "ERROR" : "rail-info", rail_sysfs_root(), RAIL_ERRSTR(err));
		return RAIL_INFO_NOT_USABLE;
	}
	if (o->gpu || o->xml)
		return 0;
	resolve_plugin(r);
	if (!o->no_transport)
		probe_transport(&r->ti);
	collect_problems(r);
	return 0;
}

static int run(struct report *r)
{
	const struct opts *o = r->o;
	int status = gather(r);

	if (status)
		return status;
	if (o->gpu || o->xml) {
		if (o->gpu)
			print_one_gpu(r->t, o->gpu, o->json);
		if (o->xml && rail_topo_print_nccl_xml(r->t, stdout) == 0)
			fprintf(stderr, "rail-info: no topology file needed (NCCL_RAIL_GPU_NIC_MAP "
				"unset or the PCIe tree shows locality)\n");
		return 0;
	}
	status = exit_status(r);
	if (o->check)
		report_check(r);
	else if (o->json)
		report_json(r, status);
	else
		report_text(r, status);
	return status;
}

int main(int argc, char **argv)
{
	static struct report r;
	struct opts o;
	int status;

	if (parse_args(argc, argv, &o))
		return RAIL_INFO_USAGE;
	if (o.stats)
		return rail_info_stats(o.stats, stdout);
	r.o = &o;
	/* --check speaks through its own lines; NCCL_DEBUG still shows the log. */
	if (o.check && !getenv("NCCL_DEBUG"))
		rail_log_set_stderr_level(RAIL_LOG_NONE);
	apply_conf_files(&r);
	rail_params_load();
	if (o.config) {
		rail_params_print(stdout, o.config_format ? o.config_format : o.json ? "json" : "text");
		rail_ncclconf_free(&r.conf);
		return 0;
	}
	status = run(&r);
	if (o.snapshot && status != RAIL_INFO_USAGE) {
		rail_sysfs_record_stop();
		fprintf(stderr, "rail-info: snapshot written to %s; read it back with "
			"rail-info --sysfs-root %s\n", o.snapshot, o.snapshot);
	}
	rail_topo_free(r.t);
	rail_ncclconf_free(&r.conf);
	return status;
}
