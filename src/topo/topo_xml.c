/*
 * nccl-net-rail: an NCCL topology file (NCCL_TOPO_FILE) for hosts whose
 * PCIe tree hides locality but whose operator gave NCCL_RAIL_GPU_NIC_MAP.
 *
 * NCCL's format (src/graph/xml.cc): <system version="1"> holding <cpu
 * numaid=...> nodes holding <pci busid=... class=...> nodes; a GPU and a
 * NIC under the same <pci> bridge are PIX to each other. NCCL completes
 * what the file leaves out from sysfs when it meets a device (vendor,
 * link speed, the <gpu> and <nic> children), and fills a <cpu>'s affinity
 * and model only for CPUs it reaches, so every attribute we know is
 * written. Virtual bridges get busid ffff:ff:NN.0, as cloud providers'
 * published topology files do. NCCL merges the functions of a multi-port
 * NIC into function 0, so NICs are written with function 0.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "rail.h"
#include "sysfs.h"
#include "topo/topo_internal.h"

static int needs_xml(const struct rail_topo *t)
{
	if (!t || !t->map_used)
		return 0;
	for (int g = 0; g < t->ngpus; g++)
		if (t->choice[g].from_map && t->choice[g].locality == RAIL_TOPO_LOC_NONE)
			return 1;
	return 0;
}

static void attr_from_sys(FILE *out, const char *dev_path, const char *file, const char *attr)
{
	char p[RAIL_TOPO_PATH_LEN + 32], v[128];

	snprintf(p, sizeof(p), "%s/%s", dev_path, file);
	if (dev_path[0] && rail_sysfs_read(p, v, sizeof(v)) > 0)
		fprintf(out, " %s=\"%s\"", attr, v);
}

/* arch, vendor, familyid, modelid of the CPU, from /proc/cpuinfo (x86). */
static void cpu_model(FILE *out)
{
	char info[4096], *v;
	long family = -1, model = -1;
	char vendor[32] = "";

#if defined(__x86_64__)
	fprintf(out, " arch=\"x86_64\"");
#elif defined(__aarch64__)
	fprintf(out, " arch=\"arm64\"");
#elif defined(__PPC__)
	fprintf(out, " arch=\"ppc64\"");
#endif
	if (rail_sysfs_read("/proc/cpuinfo", info, sizeof(info)) <= 0) {
#if defined(__x86_64__)
		/* NCCL needs vendor, familyid and modelid of an x86 <cpu>: ask the CPU. */
		unsigned a, b, c, d;

		if (__get_cpuid(0, &a, &b, &c, &d)) {
			memcpy(vendor, &b, 4);
			memcpy(vendor + 4, &d, 4);
			memcpy(vendor + 8, &c, 4);
			vendor[12] = '\0';
		}
		if (__get_cpuid(1, &a, &b, &c, &d)) {
			family = ((a >> 8) & 0xf) + ((a >> 20) & 0xff);
			model = ((a >> 4) & 0xf) + (((a >> 16) & 0xf) << 4);
		}
		if (vendor[0] && family >= 0)
			fprintf(out, " vendor=\"%s\" familyid=\"%ld\" modelid=\"%ld\"", vendor,
				family, model);
#endif
		return;
	}
	if ((v = strstr(info, "vendor_id")) && (v = strchr(v, ':')))
		sscanf(v + 1, " %31s", vendor);
	if ((v = strstr(info, "cpu family")) && (v = strchr(v, ':')))
		family = strtol(v + 1, NULL, 10);
	if ((v = strstr(info, "\nmodel\t")) && (v = strchr(v, ':')))
		model = strtol(v + 1, NULL, 10);
	if (vendor[0] && family >= 0 && model >= 0)
		fprintf(out, " vendor=\"%s\" familyid=\"%ld\" modelid=\"%ld\"", vendor, family, model);
}

/* NCCL requires link_speed and link_width; "" and 0 are its own "unknown". */
static void pci_leaf(FILE *out, const char *bdf, const char *path)
{
	char p[RAIL_TOPO_PATH_LEN + 32], speed[64] = "";
	long width = 0;

	fprintf(out, "      <pci busid=\"%s\"", bdf);
	attr_from_sys(out, path, "class", "class");
	attr_from_sys(out, path, "vendor", "vendor");
	attr_from_sys(out, path, "device", "device");
	snprintf(p, sizeof(p), "%s/max_link_speed", path);
	if (rail_sysfs_read(p, speed, sizeof(speed)) < 0)
		speed[0] = '\0';
	snprintf(p, sizeof(p), "%s/max_link_width", path);
	if (rail_sysfs_read_long(p, &width))
		width = 0;
	fprintf(out, " link_speed=\"%s\" link_width=\"%ld\"/>\n", speed, width);
}

static void bridge(const struct rail_topo *t, FILE *out, int g, int nbridge, char *done)
{
	const struct rail_topo_gpu *gpu = &t->gpus[g];
	const struct rail_topo_choice *ch = &t->choice[g];
	char p[RAIL_TOPO_PATH_LEN + 32], speed[64] = "16.0 GT/s PCIe";
	long width = 16;

	snprintf(p, sizeof(p), "%s/max_link_speed", gpu->pci_path);
	rail_sysfs_read(p, speed, sizeof(speed));
	snprintf(p, sizeof(p), "%s/max_link_width", gpu->pci_path);
	rail_sysfs_read_long(p, &width);
	fprintf(out, "    <pci busid=\"ffff:ff:%02x.0\" class=\"0x060400\" vendor=\"0x0000\" "
		"device=\"0x0000\" subsystem_vendor=\"0x0000\" subsystem_device=\"0x0000\" "
		"link_speed=\"%s\" link_width=\"%ld\">\n", nbridge, speed, width);
	pci_leaf(out, gpu->bdf, gpu->pci_path);
	for (int i = 0; i < ch->npicks; i++) {
		const struct rail_topo_nic *nic = &t->nics[ch->picks[i].nic];
		char bdf[RAIL_TOPO_BDF_LEN];

		if (!nic->bdf[0] || done[ch->picks[i].nic])
			continue; /* a NIC can sit under one bridge only */
		done[ch->picks[i].nic] = 1;
		rail_strlcpy(bdf, nic->bdf, sizeof(bdf));
		bdf[strlen(bdf) - 1] = '0';
		pci_leaf(out, bdf, nic->pci_path);
	}
	fprintf(out, "    </pci>\n");
}

int rail_topo_print_nccl_xml(const struct rail_topo *t, FILE *out)
{
	char *done;
	int nbridge = 1, max_numa = -1;

	if (!needs_xml(t))
		return 0;
	done = calloc((size_t)t->nnics + 1, 1);
	if (!done)
		return -ENOMEM;
	for (int g = 0; g < t->ngpus; g++)
		max_numa = RAIL_MAX(max_numa, t->gpus[g].numa);
	fprintf(out, "<system version=\"1\">\n");
	/* One <cpu> per NUMA node of the mapped GPUs; -1 lets NCCL leave affinity alone. */
	for (int numa = -1; numa <= max_numa; numa++) {
		int any = 0;

		for (int g = 0; g < t->ngpus; g++) {
			if (!t->choice[g].from_map || t->gpus[g].numa != numa)
				continue;
			if (!any++) {
				char node[64];

				fprintf(out, "  <cpu numaid=\"%d\"", numa);
				snprintf(node, sizeof(node), "/sys/devices/system/node/node%d", numa);
				if (numa >= 0)
					attr_from_sys(out, node, "cpumap", "affinity");
				cpu_model(out);
				fprintf(out, ">\n");
			}
			bridge(t, out, g, nbridge++, done);
		}
		if (any)
			fprintf(out, "  </cpu>\n");
	}
	fprintf(out, "</system>\n");
	free(done);
	return ferror(out) ? -EIO : 1;
}

int rail_topo_write_nccl_xml(const struct rail_topo *t, const char *dir, char *path, size_t len)
{
	char name[RAIL_TOPO_PATH_LEN];
	FILE *f;
	int fd, err;

	if (!needs_xml(t))
		return 0;
	if (dir) {
		if (snprintf(name, sizeof(name), "%s/nccl-rail-topo-XXXXXX.xml", dir) >=
		    (int)sizeof(name))
			return -ENAMETOOLONG;
		fd = mkstemps(name, 4);
	} else {
		fd = memfd_create("nccl-rail-topo.xml", 0);
		snprintf(name, sizeof(name), "/proc/self/fd/%d", fd);
	}
	if (fd < 0)
		return -errno;
	f = fdopen(fd, "w");
	if (!f) {
		err = -errno;
		close(fd);
		return err;
	}
	err = rail_topo_print_nccl_xml(t, f);
	if (!dir) {
		/* keep the memfd open: it is the file */
		fflush(f);
		fd = dup(fd);
	}
	if (fclose(f) && err >= 0)
		err = -errno;
	if (err < 0 || strlen(name) >= len) {
		if (dir)
			unlink(name);
		else if (fd >= 0)
			close(fd);
		return err < 0 ? err : -ENAMETOOLONG;
	}
	if (!dir)
		snprintf(name, sizeof(name), "/proc/self/fd/%d", fd);
	rail_strlcpy(path, name, len);
	return 1;
}
