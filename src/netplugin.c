/*
 * nccl-net-rail: the net plugin library NCCL would load (netplugin.h).
 * Our own implementation of the rules in NVIDIA/nccl src/plugin/net.cc
 * (the list, "none") and src/plugin/plugin_open.cc (the two names tried
 * per entry, dlopen with RTLD_NOW | RTLD_LOCAL, the path from
 * RTLD_DI_LINKMAP).
 */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "netplugin.h"
#include "rail.h"

#define IDENT "@(#)nccl-net-rail "
#define IDENT_MAX_FILE (512u << 20)

static int ident_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       strchr(".+~-_", c);
}

/* The first "@(#)nccl-net-rail X" in buf followed by a non-empty version. */
static int find_ident(const char *buf, size_t n, char *version, size_t len)
{
	const size_t il = sizeof(IDENT) - 1;
	const char *p = buf, *end = buf + n;

	while ((p = memmem(p, (size_t)(end - p), IDENT, il)) != NULL) {
		const char *v = p + il, *e = v;

		while (e < end && *e && ident_char(*e))
			e++;
		if (e > v && e < end && *e == '\0' && (size_t)(e - v) < len) {
			memcpy(version, v, (size_t)(e - v));
			version[e - v] = '\0';
			return 0;
		}
		p += il;
	}
	return -ENOENT;
}

int rail_netplugin_read_ident(const char *path, char *version, size_t len)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	char *buf;
	size_t n;
	int err;

	if (!f)
		return -errno;
	if (fstat(fileno(f), &st) || st.st_size <= 0 || (size_t)st.st_size > IDENT_MAX_FILE) {
		err = errno ? -errno : -EFBIG;
		goto out_close;
	}
	buf = malloc((size_t)st.st_size);
	if (!buf) {
		err = -ENOMEM;
		goto out_close;
	}
	n = fread(buf, 1, (size_t)st.st_size, f);
	err = n ? find_ident(buf, n, version, len) : -EIO;
	free(buf);
out_close:
	fclose(f);
	return err;
}

const char *rail_netplugin_abi_text(unsigned mask, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int v = RAIL_NETPLUGIN_ABI_MIN; v <= RAIL_NETPLUGIN_ABI_MAX && off < len; v++) {
		int last = v;

		if (!(mask & (1u << v)))
			continue;
		while (last < RAIL_NETPLUGIN_ABI_MAX && (mask & (1u << (last + 1))))
			last++;
		off += (size_t)snprintf(buf + off, len - off, last > v ? "%sv%d..v%d" : "%sv%d",
					off ? "," : "", v, last);
		v = last;
	}
	if (!buf[0])
		snprintf(buf, len, "none");
	return buf;
}

static int names_rail(const char *entry)
{
	const char *base = strrchr(entry, '/');

	base = base ? base + 1 : entry;
	return !strcmp(entry, "rail") || !strncmp(base, "libnccl-net-rail", 16);
}

/* NCCL adds the prefix only to a bare name: no '/', and not lib*.so. */
static int wants_prefix(const char *entry)
{
	size_t l = strlen(entry);

	if (strchr(entry, '/'))
		return 0;
	return strncmp(entry, "lib", 3) || l < 3 || strcmp(entry + l - 3, ".so");
}

/* What the loaded library is: path, tables, name, version. */
static void inspect(void *h, struct rail_netplugin_entry *e)
{
	struct link_map *lm = NULL;
	char resolved[PATH_MAX];

	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name)
		rail_strlcpy(e->path, realpath(lm->l_name, resolved) ? resolved : lm->l_name,
			     sizeof(e->path));
	for (int v = RAIL_NETPLUGIN_ABI_MIN; v <= RAIL_NETPLUGIN_ABI_MAX; v++) {
		char sym[32];
		void *table;

		snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
		table = dlsym(h, sym);
		if (!table)
			continue;
		e->abi_mask |= 1u << v;
		e->newest_abi = v;
	}
	/* NCCL takes a tuner from the net plugin's library when NCCL_TUNER_PLUGIN names none. */
	for (int v = RAIL_TUNER_ABI_MIN; v <= RAIL_TUNER_ABI_MAX; v++) {
		char sym[32];

		snprintf(sym, sizeof(sym), "ncclTunerPlugin_v%d", v);
		if (dlsym(h, sym))
			e->tuner_mask |= 1u << v;
	}
	if (e->newest_abi) {
		char sym[32];
		/* Every ncclNet_vN table starts with its name (const char *). */
		const char *const *table;

		snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", e->newest_abi);
		table = dlsym(h, sym);
		if (table && *table)
			rail_strlcpy(e->name, *table, sizeof(e->name));
	}
	if (e->path[0])
		rail_netplugin_read_ident(e->path, e->rail_version, sizeof(e->rail_version));
	e->is_rail = e->rail_version[0] || !strcmp(e->name, "Rail");
}

static void try_name(struct rail_netplugin_entry *e, const char *name)
{
	int i = e->ntried++;
	void *h;

	rail_strlcpy(e->tried[i], name, sizeof(e->tried[i]));
	dlerror();
	h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *msg = dlerror();

		rail_strlcpy(e->error[i], msg ? msg : "dlopen failed", sizeof(e->error[i]));
		return;
	}
	e->loaded = 1;
	inspect(h, e);
	dlclose(h);
}

static void resolve_entry(struct rail_netplugin_entry *e, int bare_default)
{
	e->names_rail = names_rail(e->entry);
	e->is_path = strchr(e->entry, '/') != NULL;
	try_name(e, e->entry);
	if (!e->loaded && !bare_default && wants_prefix(e->entry)) {
		char alt[300];

		snprintf(alt, sizeof(alt), "libnccl-net-%s.so", e->entry);
		try_name(e, alt);
	}
}

int rail_netplugin_resolve(const char *value, struct rail_netplugin *out)
{
	const unsigned probed = ~((1u << RAIL_NETPLUGIN_ABI_PROBED) - 1);
	char list[sizeof(out->value)];
	char *save = NULL;

	memset(out, 0, sizeof(*out));
	out->chosen = -1;
	if (value && !value[0])
		value = NULL; /* NCCL: an empty value means the default name */
	out->set = value != NULL;
	rail_strlcpy(out->value, value ? value : "", sizeof(out->value));
	if (value && !strcasecmp(value, "none")) {
		out->none = 1;
		return 0;
	}
	rail_strlcpy(list, value ? value : "libnccl-net.so", sizeof(list));
	for (char *tok = strtok_r(list, ",", &save); tok && out->nentries < RAIL_NETPLUGIN_MAX_ENTRIES;
	     tok = strtok_r(NULL, ",", &save)) {
		struct rail_netplugin_entry *e = &out->entries[out->nentries++];

		rail_strlcpy(e->entry, tok, sizeof(e->entry));
		resolve_entry(e, !value);
		out->names_rail |= e->names_rail;
		out->any_path |= e->is_path;
		if (out->chosen < 0 && e->loaded && (e->abi_mask & probed))
			out->chosen = out->nentries - 1;
	}
	return 0;
}
