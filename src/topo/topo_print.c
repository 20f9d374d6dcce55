/*
 * nccl-net-rail: the topology as rail-info prints it (text like
 * `nvidia-smi topo -m`, or JSON) and as the plugin logs it at init. Both
 * print the model's own decisions and reasons; nothing is recomputed here
 * except the rail numbers, which come from rail_topo_rail_of_model().
 */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "rail.h"
#include "sysfs.h"
#include "topo/topo_internal.h"

static const char *state_text(int s)
{
	static const char *const names[] = { "?", "DOWN", "INIT", "ARMED", "ACTIVE", "DEFER" };

	return s >= 0 && s < (int)RAIL_ARRAY_SIZE(names) ? names[s] : "?";
}

static void json_str(FILE *out, const char *s)
{
	fputc('"', out);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", out);
		else if (c < 0x20)
			fprintf(out, "\\u%04x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}

static const char *source_of(const struct rail_topo_choice *ch)
{
	if (ch->from_map)
		return "map";
	return ch->npicks ? "topology" : "none";
}

static int rail_of(const struct rail_topo *t, int nic, int port)
{
	int rail = -1, plane;

	if (rail_topo_rail_of_model(t, t->nics[nic].name, port, &rail, &plane))
		return -1;
	return rail;
}

/* ---- JSON --------------------------------------------------------------- */

static void json_pick(const struct rail_topo *t, FILE *out, const struct rail_topo_pick *p)
{
	const struct rail_topo_nic *nic = &t->nics[p->nic];
	const struct rail_topo_port *port = &nic->ports[p->port_idx];

	fprintf(out, "{\"name\": ");
	json_str(out, nic->name);
	fprintf(out, ", \"port\": %d, \"relation\": \"%s\", \"netdev\": ", port->port,
		rail_topo_rel_name(p->rel));
	json_str(out, port->netdev);
	fprintf(out, ", \"speed_mbps\": %d, \"rail\": %d}", port->rate_mbps,
		rail_of(t, p->nic, port->port));
}

static void json_gpu(const struct rail_topo *t, FILE *out, int g)
{
	const struct rail_topo_gpu *gpu = &t->gpus[g];
	const struct rail_topo_choice *ch = &t->choice[g];

	fprintf(out, "    {\"index\": %d, \"bdf\": ", g);
	json_str(out, gpu->bdf);
	fprintf(out, ", \"numa\": %d, \"pci_vendor\": \"0x%04x\", \"pci_device\": \"0x%04x\", "
		"\"nvidia\": %s, \"pci_path\": ", gpu->numa, gpu->vendor, gpu->device,
		gpu->nvidia ? "true" : "false");
	json_str(out, gpu->pci_path);
	fprintf(out, ",\n     \"locality\": \"%s\", \"source\": \"%s\", \"reason\": ",
		rail_topo_locality_name(ch->locality), source_of(ch));
	json_str(out, ch->reason);
	fprintf(out, ",\n     \"nics\": [");
	for (int i = 0; i < ch->npicks; i++) {
		fprintf(out, "%s", i ? ", " : "");
		json_pick(t, out, &ch->picks[i]);
	}
	fprintf(out, "],\n     \"fallback\": ");
	if (ch->has_fallback)
		json_pick(t, out, &ch->fallback);
	else
		fprintf(out, "null");
	fprintf(out, ", \"fallback_reason\": ");
	json_str(out, ch->fallback_reason);
	fprintf(out, ",\n     \"relations\": {");
	for (int n = 0; n < t->nnics; n++) {
		fprintf(out, "%s", n ? ", " : "");
		json_str(out, t->nics[n].name);
		fprintf(out, ": \"%s\"", rail_topo_rel_name(t->rel[g * t->nnics + n]));
	}
	fprintf(out, "}}");
}

static void json_nic(const struct rail_topo *t, FILE *out, int n)
{
	const struct rail_topo_nic *nic = &t->nics[n];

	fprintf(out, "    {\"name\": ");
	json_str(out, nic->name);
	fprintf(out, ", \"bdf\": ");
	json_str(out, nic->bdf);
	fprintf(out, ", \"pci_path\": ");
	json_str(out, nic->pci_path);
	fprintf(out, ", \"numa\": %d, \"pci_vendor\": \"0x%04x\", \"pci_device\": \"0x%04x\", "
		"\"vf\": %s, \"pf\": ", nic->numa, nic->vendor, nic->device,
		nic->is_vf ? "true" : "false");
	json_str(out, nic->pf_bdf);
	fprintf(out, ",\n     \"ports\": [");
	for (int p = 0; p < nic->nports; p++) {
		const struct rail_topo_port *port = &nic->ports[p];

		fprintf(out, "%s{\"port\": %d, \"state\": \"%s\", \"phys_state\": %d, "
			"\"link_layer\": ", p ? ", " : "", port->port, state_text(port->state),
			port->phys_state);
		json_str(out, port->link_layer);
		fprintf(out, ", \"speed_mbps\": %d, \"netdev\": ", port->rate_mbps);
		json_str(out, port->netdev);
		fprintf(out, ", \"usable\": %s, \"reason\": ", port->usable ? "true" : "false");
		json_str(out, port->usable ? "" : port->why_not);
		fprintf(out, ", \"rail\": %d}", rail_of(t, n, port->port));
	}
	fprintf(out, "]}");
}

static void json_netdev(FILE *out, const struct rail_topo_netdev *nd)
{
	fprintf(out, "    {\"name\": ");
	json_str(out, nd->name);
	fprintf(out, ", \"bdf\": ");
	json_str(out, nd->bdf);
	fprintf(out, ", \"numa\": %d, \"rdma_device\": ", nd->numa);
	json_str(out, nd->ibdev);
	fprintf(out, ", \"rdma_port\": %d, \"speed_mbps\": %d, \"operstate\": ",
		nd->ibdev[0] ? nd->ibport : 0, nd->speed_mbps);
	json_str(out, nd->operstate);
	fprintf(out, "}");
}

void rail_topo_print_json_members(const struct rail_topo *t, FILE *out)
{
	fprintf(out, "\"sysfs_root\": ");
	json_str(out, rail_sysfs_root()[0] ? rail_sysfs_root() : "/");
	fprintf(out, ", \"numa_node_count\": %d,\n  \"gpus\": [\n", t->nnuma);
	for (int g = 0; g < t->ngpus; g++) {
		json_gpu(t, out, g);
		fprintf(out, "%s\n", g + 1 < t->ngpus ? "," : "");
	}
	fprintf(out, "  ],\n  \"rdma_devices\": [\n");
	for (int n = 0; n < t->nnics; n++) {
		json_nic(t, out, n);
		fprintf(out, "%s\n", n + 1 < t->nnics ? "," : "");
	}
	fprintf(out, "  ],\n  \"netdevs\": [\n");
	for (int i = 0; i < t->nnetdevs; i++) {
		json_netdev(out, &t->netdevs[i]);
		fprintf(out, "%s\n", i + 1 < t->nnetdevs ? "," : "");
	}
	fprintf(out, "  ],\n  \"gpu_nic_map\": {\"set\": %s, \"used\": %s, \"status\": ",
		t->map_set ? "true" : "false", t->map_used ? "true" : "false");
	json_str(out, t->map_status);
	fprintf(out, "}");
}

static void json_warnings(const struct rail_topo *t, FILE *out)
{
	fprintf(out, ",\n  \"warnings\": [");
	for (int i = 0; i < t->nwarn; i++) {
		fprintf(out, "%s\n    ", i ? "," : "");
		json_str(out, t->warn[i]);
	}
	fprintf(out, "%s]", t->nwarn ? "\n  " : "");
}

/* ---- text --------------------------------------------------------------- */

static void text_matrix(const struct rail_topo *t, FILE *out)
{
	fprintf(out, "%-6s", "");
	for (int n = 0; n < t->nnics; n++)
		fprintf(out, " %-8s", t->nics[n].name);
	fprintf(out, " NUMA  PCI address\n");
	for (int g = 0; g < t->ngpus; g++) {
		fprintf(out, "GPU%-3d", g);
		for (int n = 0; n < t->nnics; n++)
			fprintf(out, " %-8s", rail_topo_rel_name(t->rel[g * t->nnics + n]));
		fprintf(out, " %-5d %s%s\n", t->gpus[g].numa, t->gpus[g].bdf,
			t->gpus[g].nvidia ? "" : " (given)");
	}
	fprintf(out, "  PIX same PCIe switch, PXB several switches, PHB one host bridge,\n"
		     "  NODE other host bridge on the same NUMA node, SYS other NUMA node or "
		     "unknown\n");
}

static void text_choices(const struct rail_topo *t, FILE *out)
{
	fprintf(out, "%-4s %-13s %-5s %-9s %s\n", "GPU", "PCI address", "NUMA", "locality",
		"NICs, best first [relation rail] -- reason");
	for (int g = 0; g < t->ngpus; g++) {
		const struct rail_topo_choice *ch = &t->choice[g];

		fprintf(out, "%-4d %-13s %-5d %-9s", g, t->gpus[g].bdf, t->gpus[g].numa,
			rail_topo_locality_name(ch->locality));
		for (int i = 0; i < ch->npicks; i++) {
			const struct rail_topo_nic *nic = &t->nics[ch->picks[i].nic];
			int port = nic->ports[ch->picks[i].port_idx].port;

			fprintf(out, " %s:%d [%s %d]", nic->name, port,
				rail_topo_rel_name(ch->picks[i].rel),
				rail_of(t, ch->picks[i].nic, port));
		}
		fprintf(out, "%s\n      -- %s\n", ch->npicks ? "" : " (none)", ch->reason);
		if (ch->has_fallback) {
			const struct rail_topo_nic *nic = &t->nics[ch->fallback.nic];
			int port = nic->ports[ch->fallback.port_idx].port;

			fprintf(out, "      fallback %s:%d [%s %d] -- %s\n", nic->name, port,
				rail_topo_rel_name(ch->fallback.rel),
				rail_of(t, ch->fallback.nic, port), ch->fallback_reason);
		} else if (ch->npicks) {
			fprintf(out, "      fallback %s\n", ch->fallback_reason);
		}
	}
}

static void text_devices(const struct rail_topo *t, FILE *out)
{
	if (t->nnics)
		fprintf(out, "\nRDMA devices (topology view):\n");
	for (int n = 0; n < t->nnics; n++) {
		const struct rail_topo_nic *nic = &t->nics[n];

		fprintf(out, "  %-10s %-13s NUMA %-3d%s%s\n", nic->name,
			nic->bdf[0] ? nic->bdf : "(not PCI)", nic->numa,
			nic->is_vf ? " VF of " : "", nic->is_vf ? nic->pf_bdf : "");
		for (int p = 0; p < nic->nports; p++) {
			const struct rail_topo_port *port = &nic->ports[p];

			fprintf(out, "      port %d %-6s %-10s %6d Gb/s %-14s %s%s\n", port->port,
				state_text(port->state), port->link_layer[0] ? port->link_layer : "?",
				port->rate_mbps / 1000, port->netdev[0] ? port->netdev : "-",
				port->usable ? "usable" : "not used: ",
				port->usable ? "" : port->why_not);
		}
	}
	if (t->nnetdevs)
		fprintf(out, "\nNetwork interfaces:\n");
	for (int i = 0; i < t->nnetdevs; i++) {
		const struct rail_topo_netdev *nd = &t->netdevs[i];

		fprintf(out, "  %-14s %-13s NUMA %-3d %-8s", nd->name, nd->bdf[0] ? nd->bdf : "-",
			nd->numa, nd->operstate[0] ? nd->operstate : "?");
		if (nd->speed_mbps > 0)
			fprintf(out, " %d Mb/s", nd->speed_mbps);
		if (nd->ibdev[0])
			fprintf(out, "  RDMA %s:%d", nd->ibdev, nd->ibport);
		fprintf(out, "\n");
	}
}

static void print_text(const struct rail_topo *t, FILE *out)
{
	fprintf(out, "Topology (sysfs root %s): %d GPU%s, %d RDMA device%s, %d NUMA node%s\n",
		rail_sysfs_root()[0] ? rail_sysfs_root() : "/", t->ngpus, t->ngpus == 1 ? "" : "s",
		t->nnics, t->nnics == 1 ? "" : "s", t->nnuma, t->nnuma == 1 ? "" : "s");
	if (t->ngpus && t->nnics) {
		fprintf(out, "\n");
		text_matrix(t, out);
	}
	if (t->ngpus) {
		fprintf(out, "\n");
		text_choices(t, out);
	}
	text_devices(t, out);
	fprintf(out, "\nNCCL_RAIL_GPU_NIC_MAP: %s%s%s\n",
		!t->map_set ? "unset" : t->map_used ? "used" : "not used",
		t->map_status[0] ? ", " : "", t->map_status);
}

void rail_topo_print(const struct rail_topo *t, FILE *out, int json)
{
	if (json) {
		fprintf(out, "{");
		rail_topo_print_json_members(t, out);
		json_warnings(t, out);
		fprintf(out, "}\n");
	} else
		print_text(t, out);
}

static void log_gpu(const struct rail_topo *t, int g, const char *who)
{
	const struct rail_topo_choice *ch = &t->choice[g];
	char nics[160] = "none", fallback[96] = "none";
	size_t off = 0;

	for (int i = 0; i < ch->npicks && off < sizeof(nics) - 24; i++) {
		const struct rail_topo_nic *nic = &t->nics[ch->picks[i].nic];

		off += (size_t)snprintf(nics + off, sizeof(nics) - off, "%s%s:%d[%s]",
					i ? "," : "", nic->name,
					nic->ports[ch->picks[i].port_idx].port,
					rail_topo_rel_name(ch->picks[i].rel));
	}
	if (ch->has_fallback) {
		const struct rail_topo_nic *fb = &t->nics[ch->fallback.nic];

		snprintf(fallback, sizeof(fallback), "%s:%d[%s]", fb->name,
			 fb->ports[ch->fallback.port_idx].port, rail_topo_rel_name(ch->fallback.rel));
	}
	RAIL_INFO(RAIL_LOG_INIT, "topology: GPU %s%s NUMA %d -> %s, locality %s: %s; fallback %s",
		  t->gpus[g].bdf, who, t->gpus[g].numa, nics,
		  rail_topo_locality_name(ch->locality), ch->reason, fallback);
}

void rail_topo_log(const struct rail_topo *t)
{
	if (!t)
		return;
	for (int g = 0; g < t->ngpus; g++)
		log_gpu(t, g, "");
	for (int i = 0; i < t->nwarn; i++)
		RAIL_INFO(RAIL_LOG_INIT, "topology: %s", t->warn[i]);
}

void rail_topo_log_gpu(const struct rail_topo *t, const char *bdf)
{
	int g = t ? rail_topo_gpu_index(t, bdf) : -1;

	if (g < 0) {
		RAIL_INFO(RAIL_LOG_INIT, "topology: this process's GPU %s is not in the PCI "
			  "topology read from sysfs", bdf);
		return;
	}
	log_gpu(t, g, " (this process's GPU)");
	for (int i = 0; i < t->nwarn; i++)
		RAIL_INFO(RAIL_LOG_INIT, "topology: %s", t->warn[i]);
}
