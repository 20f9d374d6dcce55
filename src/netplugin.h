/*
 * nccl-net-rail: which net plugin library NCCL would load for a value of
 * NCCL_NET_PLUGIN, found with NCCL's rules and the dynamic loader itself,
 * and what that library is (rail-info's report).
 *
 * NCCL's rules (src/plugin/net.cc, plugin_open.cc): unset means
 * "libnccl-net.so"; "none" (any case) means no external plugin; otherwise a
 * comma-separated list tried in order. Each entry is passed to dlopen
 * unchanged (so a path works, since NCCL 2.21); if that fails and the entry
 * has no '/' and is not "lib*.so", NCCL tries "libnccl-net-<entry>.so".
 */
#ifndef RAIL_NETPLUGIN_H
#define RAIL_NETPLUGIN_H

#include <limits.h>

#define RAIL_NETPLUGIN_MAX_ENTRIES 14
#define RAIL_NETPLUGIN_ABI_MIN 2
#define RAIL_NETPLUGIN_ABI_MAX 12
/* NCCL's tuner ABIs (ncclTunerPlugin_vN), which it also looks for in the net plugin's library. */
#define RAIL_TUNER_ABI_MIN 2
#define RAIL_TUNER_ABI_MAX 6
/* The ABIs NCCL 2.28 and later still probe. */
#define RAIL_NETPLUGIN_ABI_PROBED 6

struct rail_netplugin_entry {
	char entry[256];	/* the list entry as written */
	int ntried;
	char tried[2][300];	/* the names passed to dlopen, in order */
	char error[2][512];	/* dlerror() for each that failed */
	int loaded;		/* 1: tried[ntried - 1] loaded */
	char path[PATH_MAX];	/* the file the loader opened (RTLD_DI_LINKMAP) */
	unsigned abi_mask;	/* bit N: exports ncclNetPlugin_vN, N in 2..12 */
	int newest_abi;		/* 0: none */
	unsigned tuner_mask;	/* bit N: exports ncclTunerPlugin_vN, N in 2..6 (NCCL's tuner ABIs) */
	char name[64];		/* the name field of the newest table */
	char rail_version[64];	/* from the @(#) ident; "" when not nccl-net-rail */
	int is_rail;		/* the ident or the table name says nccl-net-rail */
	int names_rail;		/* the entry itself names nccl-net-rail */
	int is_path;		/* the entry has a '/' (NCCL 2.21 and later only) */
};

struct rail_netplugin {
	char value[1024];	/* NCCL_NET_PLUGIN as checked; "" when unset */
	int set;		/* 0: unset (NCCL tries libnccl-net.so) */
	int none;		/* "none": no external plugin */
	int nentries;
	struct rail_netplugin_entry entries[RAIL_NETPLUGIN_MAX_ENTRIES];
	/* The entry NCCL would try first among those that load and export a
	 * table it probes, or -1. */
	int chosen;
	int names_rail;		/* some entry names nccl-net-rail */
	int any_path;		/* some entry is a path */
};

/*
 * Resolve value (NULL: unset) as NCCL would, loading each candidate with
 * dlopen(RTLD_NOW | RTLD_LOCAL) like NCCL, reading what it exports, and
 * closing it again. Returns 0 (the outcome, good or bad, is in *out).
 */
int rail_netplugin_resolve(const char *value, struct rail_netplugin *out);

/*
 * Read the "@(#)nccl-net-rail VERSION" ident from a library file: 0 and
 * the version, -ENOENT when the file has none, or -errno.
 */
int rail_netplugin_read_ident(const char *path, char *version, size_t len);

/* "v6..v12" or "v6,v8" for an ABI mask. */
const char *rail_netplugin_abi_text(unsigned mask, char *buf, size_t len);

#endif
