/*
 * libFuzzer target: everything the plugin reads from sysfs. A fixture (a
 * real machine's sysfs copy, FUZZ_SYSFS_FIXTURE, default
 * test/fixtures/roce-h100) is copied once into a temporary root; each input
 * overwrites some of its files, then the whole topology is built
 * (rail_topo_build: PCI paths, NUMA, CPU lists, link speeds, net devices)
 * and every RDMA port's GID table is read, as the plugin and rail-info do.
 * The files are restored afterwards.
 *
 * Input: records of [file index u16][length u8][length bytes of content].
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ib/ib_gid.h"
#include "sysfs.h"
#include "topo/topo.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FILES 4096

static char root[64];
static int nfiles;
static char *files[MAX_FILES];	/* paths under root */
static char *orig[MAX_FILES];	/* their content */
static size_t orig_len[MAX_FILES];
static char ibdevs[16][64];
static int nib;

static void collect(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d)) && nfiles < MAX_FILES) {
		char p[4096];
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		if (lstat(p, &st))
			continue;
		if (S_ISDIR(st.st_mode)) {
			collect(p);
		} else if (S_ISREG(st.st_mode) && st.st_size < 65536) {
			FILE *f = fopen(p, "rb");

			if (!f)
				continue;
			orig[nfiles] = malloc((size_t)st.st_size + 1);
			orig_len[nfiles] = fread(orig[nfiles], 1, (size_t)st.st_size, f);
			fclose(f);
			files[nfiles++] = strdup(p);
		}
	}
	closedir(d);
}

static void cleanup(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "fuzz_sysfs: could not remove %s\n", root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *fx = getenv("FUZZ_SYSFS_FIXTURE");
	char cmd[4200], p[256];
	DIR *d;
	struct dirent *e;

	(void)argc;
	(void)argv;
	if (!fx)
		fx = "test/fixtures/roce-h100";
	snprintf(root, sizeof(root), "/tmp/rail-fuzz-sysfs-XXXXXX");
	if (!mkdtemp(root))
		abort();
	snprintf(cmd, sizeof(cmd), "cp -a '%s'/. '%s'/", fx, root);
	if (system(cmd) != 0) {
		fprintf(stderr, "fuzz_sysfs: cannot copy the fixture %s (FUZZ_SYSFS_FIXTURE)\n", fx);
		abort();
	}
	atexit(cleanup);
	collect(root);
	if (nfiles == 0)
		abort();
	snprintf(p, sizeof(p), "%s/sys/class/infiniband", root);
	d = opendir(p);
	while (d && (e = readdir(d)) && nib < 16)
		if (e->d_name[0] != '.')
			snprintf(ibdevs[nib++], sizeof(ibdevs[0]), "%s", e->d_name);
	if (d)
		closedir(d);
	setenv("NCCL_DEBUG", "NONE", 1);
	rail_sysfs_set_root(root);
	return 0;
}

static void put(int i, const void *buf, size_t len)
{
	int fd = open(files[i], O_WRONLY | O_TRUNC);

	if (fd < 0)
		return;
	if (write(fd, buf, len) != (ssize_t)len)
		fprintf(stderr, "fuzz_sysfs: short write to %s\n", files[i]);
	close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct rail_ib_gid_entry gids[32];
	int touched[16], nt = 0;
	struct rail_topo *t = NULL;

	while (size >= 3 && nt < 16) {
		int i = (data[0] | data[1] << 8) % nfiles;
		size_t len = data[2];

		data += 3;
		size -= 3;
		if (len > size)
			len = size;
		put(i, data, len);
		touched[nt++] = i;
		data += len;
		size -= len;
	}
	if (rail_topo_build(NULL, &t) == 0)
		rail_topo_free(t);
	for (int d = 0; d < nib; d++)
		for (int port = 1; port <= 2; port++)
			(void)rail_ib_gid_table(ibdevs[d], port, 32, gids, 32);
	for (int k = 0; k < nt; k++)
		put(touched[k], orig[touched[k]], orig_len[touched[k]]);
	return 0;
}
