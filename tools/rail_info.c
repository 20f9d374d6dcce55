/*
 * rail-info: the doctor. It prints what the plugin would do on this host and
 * why, by calling the same functions the plugin calls: the transport choice
 * (rail_transport_select), the verbs devices, GIDs and GPU-memory ladder
 * (rail_ib_report), the topology and the NIC of every GPU (src/topo), every
 * configuration variable (rail_params_print), and advice with remedies.
 *
 *   rail-info                      report for humans
 *   rail-info --json               the same as one JSON object
 *   rail-info --sysfs-root DIR     read a copy of sysfs (fixture, snapshot)
 *   rail-info --snapshot DIR       also copy what was read into DIR
 *   rail-info --config [--markdown|--json]   the configuration table
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib/ib_report.h"
#include "log.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"
#include "topo/topo.h"
#include "transport.h"

#define ABI_FIRST 6
#define ABI_LAST 12

struct opts {
	int json;
	int config;
	const char *config_format;
	const char *root;
	const char *gpus;
	const char *snapshot;
	const char *gpu;
	int no_transport;
	int xml;
};

struct transport_info {
	const char *name;	/* NULL: none usable */
	char why[512];
	char desc[1024];
};

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: rail-info [options]\n"
		"Explains what the nccl-net-rail plugin would do on this host, and why.\n\n"
		"  --json              print one JSON object instead of text\n"
		"  --sysfs-root DIR    read a copy of sysfs (DIR holds sys/...) instead of /sys\n"
		"  --gpus BDF[,BDF]    also treat these PCI devices as GPUs (other accelerators)\n"
		"  --gpu SPEC          only the NICs of one GPU: PCI address, index, or UUID\n"
		"  --snapshot DIR      copy every sysfs file read into DIR; read it back later\n"
		"                      with --sysfs-root DIR to get the same answer\n"
		"  --nccl-topo-xml     print the NCCL topology file the plugin would write\n"
		"  --no-transport      skip the transport and verbs sections\n"
		"  --config            every configuration variable: value, default, doc\n"
		"      --markdown      ... as the README's markdown table\n"
		"      --json          ... as JSON\n"
		"  --help              this text\n\n"
		"Environment: every NCCL_* variable the plugin reads (see --config),\n"
		"NCCL_DEBUG=INFO for the plugin's own log lines on stderr.\n");
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "sysfs-root", required_argument, NULL, 'r' },
		{ "gpus", required_argument, NULL, 'g' },
		{ "gpu", required_argument, NULL, 'G' },
		{ "snapshot", required_argument, NULL, 's' },
		{ "config", no_argument, NULL, 'c' },
		{ "markdown", no_argument, NULL, 'm' },
		{ "nccl-topo-xml", no_argument, NULL, 'x' },
		{ "no-transport", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'j': o->json = 1; break;
		case 'r': o->root = optarg; break;
		case 'g': o->gpus = optarg; break;
		case 'G': o->gpu = optarg; break;
		case 's': o->snapshot = optarg; break;
		case 'c': o->config = 1; break;
		case 'm': o->config_format = "markdown"; break;
		case 'x': o->xml = 1; break;
		case 'n': o->no_transport = 1; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "rail-info: unexpected argument \"%s\"\n", argv[optind]);
		return -EINVAL;
	}
	if (o->config_format && !o->config) {
		fprintf(stderr, "rail-info: --markdown goes with --config\n");
		return -EINVAL;
	}
	return 0;
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

/* The transport the plugin would pick, described, then released again. */
static void probe_transport(struct transport_info *ti)
{
	const struct rail_transport_ops *ops;

	memset(ti, 0, sizeof(*ti));
	ops = rail_transport_select(ti->why, sizeof(ti->why));
	if (!ops)
		return;
	ti->name = ops->name;
	if (ops->describe)
		ops->describe(ti->desc, sizeof(ti->desc));
	ops->fini();
}

/* "node0 0-55,112-167" for each NUMA node. */
static void numa_text(FILE *out)
{
	fprintf(out, "NUMA nodes:");
	for (int n = 0, found = 0; n < 64; n++) {
		char path[96], cpus[256];

		snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", n);
		if (rail_sysfs_read(path, cpus, sizeof(cpus)) < 0) {
			if (n == 63 && !found)
				fprintf(out, " none listed");
			continue;
		}
		fprintf(out, "%s node%d: CPUs %s", found++ ? "," : "", n, cpus);
	}
	fprintf(out, "\n");
}

static void numa_json(FILE *out)
{
	int found = 0;

	fprintf(out, "\"numa\": [");
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

/* Advice only rail-info can give: it sees the transport and the topology. */
static int transport_advice(const struct transport_info *ti, const struct rail_topo *t,
			    char out[][1024], int max)
{
	int n = 0, usable = 0;

	for (int i = 0; t && i < t->nnics; i++)
		for (int p = 0; p < t->nics[i].nports; p++)
			usable += t->nics[i].ports[p].usable;
	if (!ti->name && n < max)
		snprintf(out[n++], 1024, "no transport is usable (%s): NCCL will not load the "
			 "plugin's network; check NCCL_SOCKET_IFNAME and NCCL_RAIL_TRANSPORT",
			 ti->why);
	if (ti->name && !strcmp(ti->name, "tcp") && usable && n < max)
		snprintf(out[n++], 1024, "%d RDMA port%s ACTIVE but the TCP transport is chosen "
			 "(%s): check NCCL_IB_DISABLE, NCCL_RAIL_TRANSPORT and that "
			 "libibverbs.so.1 loads (NCCL_IBVERBS_LIB)", usable, usable > 1 ? "s are" : " is",
			 ti->why);
	if (t && t->ngpus && t->nnics && !usable && n < max)
		snprintf(out[n++], 1024, "RDMA devices exist but no port is ACTIVE: GPUDirect RDMA "
			 "cannot be used; check cables, the subnet manager (IB) or the link (RoCE)");
	return n;
}

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

static void report_text(const struct opts *o, const struct transport_info *ti,
			const struct rail_topo *t, char advice[][1024], int nadvice)
{
	printf("nccl-net-rail %s: NCCL net plugin, ABIs v%d..v%d (ncclNetPlugin_v%d ... "
	       "ncclNetPlugin_v%d)\n\n", RAIL_VERSION_STRING, ABI_FIRST, ABI_LAST, ABI_FIRST,
	       ABI_LAST);
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
	rail_topo_print(t, stdout, 0);
	if (nadvice)
		printf("\nAdvice on the transport:\n");
	for (int i = 0; i < nadvice; i++)
		printf("  - %s\n", advice[i]);
	printf("\nConfiguration: `rail-info --config` lists every variable; set here:");
	for (int i = 0, any = 0; i < RAIL_P_COUNT; i++) {
		if (!rail_param_is_set((enum rail_param_id)i))
			continue;
		printf("%s %s=%s", any++ ? "," : "", rail_param_table[i].name,
		       rail_param_str((enum rail_param_id)i));
	}
	printf("\n");
}

static void report_json(const struct opts *o, const struct transport_info *ti,
			const struct rail_topo *t, char advice[][1024], int nadvice)
{
	printf("{\"version\": \"%s\", \"abis\": [", RAIL_VERSION_STRING);
	for (int v = ABI_FIRST; v <= ABI_LAST; v++)
		printf("%s%d", v > ABI_FIRST ? ", " : "", v);
	printf("],\n \"transport\": ");
	if (o->no_transport) {
		printf("null, \"ib\": null");
	} else {
		printf("{\"name\": ");
		if (ti->name)
			json_str(stdout, ti->name);
		else
			printf("null");
		printf(", \"why\": ");
		json_str(stdout, ti->why);
		printf(", \"description\": ");
		json_str(stdout, ti->desc);
		printf("},\n \"ib\": ");
		rail_ib_report(stdout, 1);
	}
	printf(",\n ");
	numa_json(stdout);
	printf(",\n \"advice\": [");
	for (int i = 0; i < nadvice; i++) {
		printf("%s", i ? ", " : "");
		json_str(stdout, advice[i]);
	}
	printf("],\n \"config\": ");
	fflush(stdout);
	rail_params_print(stdout, "json");
	printf(",\n ");
	rail_topo_print_json_members(t, stdout);
	printf("}\n");
}

int main(int argc, char **argv)
{
	struct transport_info ti;
	struct rail_topo *t = NULL;
	char advice[4][1024];
	struct opts o;
	int nadvice, err;

	if (parse_args(argc, argv, &o))
		return 1;
	rail_params_load();
	if (o.config) {
		rail_params_print(stdout, o.config_format ? o.config_format : o.json ? "json" : "text");
		return 0;
	}
	if (o.root)
		rail_sysfs_set_root(o.root);
	if (o.snapshot && (err = rail_sysfs_record_start(o.snapshot))) {
		fprintf(stderr, "rail-info: cannot write a snapshot into %s: %s\n", o.snapshot,
			RAIL_ERRSTR(err));
		return 1;
	}
	err = rail_topo_build(o.gpus, &t);
	if (err) {
		fprintf(stderr, "rail-info: cannot read the topology under %s/sys: %s\n",
			rail_sysfs_root(), RAIL_ERRSTR(err));
		return 2;
	}
	if (o.gpu || o.xml) {
		if (o.gpu)
			print_one_gpu(t, o.gpu, o.json);
		if (o.xml && rail_topo_print_nccl_xml(t, stdout) == 0)
			fprintf(stderr, "rail-info: no topology file needed (NCCL_RAIL_GPU_NIC_MAP "
				"unset or the PCIe tree shows locality)\n");
		goto out;
	}
	if (!o.no_transport)
		probe_transport(&ti);
	else
		memset(&ti, 0, sizeof(ti));
	nadvice = o.no_transport ? 0 : transport_advice(&ti, t, advice, 4);
	if (o.json)
		report_json(&o, &ti, t, advice, nadvice);
	else
		report_text(&o, &ti, t, advice, nadvice);
out:
	if (o.snapshot) {
		rail_sysfs_record_stop();
		fprintf(stderr, "rail-info: snapshot written to %s; read it back with "
			"rail-info --sysfs-root %s\n", o.snapshot, o.snapshot);
	}
	rail_topo_free(t);
	return 0;
}
