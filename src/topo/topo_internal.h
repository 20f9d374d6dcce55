/*
 * nccl-net-rail: what the files of src/topo/ share with each other and
 * nobody else.
 */
#ifndef RAIL_TOPO_INTERNAL_H
#define RAIL_TOPO_INTERNAL_H

#include <stddef.h>

#include "topo/topo.h"

#define RAIL_TOPO_CHAIN_MAX 24

/*
 * A sysfs device path cut into the host-bridge prefix and the PCI
 * functions below it, the device itself last:
 *   /sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0/net/x
 *   host "/sys/devices/pci0000:15", bdf {15:01.0, 16:00.0, 18:00.0}
 * Components after the last PCI function (net/x, virtio2) are dropped.
 */
struct rail_topo_chain {
	char host[RAIL_TOPO_PATH_LEN];
	int n;
	char bdf[RAIL_TOPO_CHAIN_MAX][RAIL_TOPO_BDF_LEN];
};

/* -ENODEV when the path holds no PCI function. */
int rail_topo_chain_parse(const char *path, struct rail_topo_chain *c);
/* 1 if s is a PCI address "dddd:bb:dd.f" (4 or more domain digits). */
int rail_topo_is_bdf(const char *s);
/* Lower-case a PCI address and add domain 0 to "bb:dd.f"; -EINVAL if not one. */
int rail_topo_norm_bdf(const char *in, char *out, size_t len);
/* Cut path after its last PCI function component; -ENODEV if none. */
int rail_topo_trim_to_pci(char *path);

/*
 * Relation plus what it hangs on, for the reason text: the switch or
 * bridge ("0000:16:00.0"), the host bridge ("pci0000:15") or "NUMA 1".
 */
enum rail_topo_rel rail_topo_relation_ex(const char *path_a, int numa_a, const char *path_b,
					 int numa_b, int nnuma, char *anchor, size_t anchor_len);

/* Names sort "mlx5_2" before "mlx5_10". */
int rail_topo_natcmp(const char *a, const char *b);

/* Advice for rail-info and the init log (printf format). */
void rail_topo_add_warn(struct rail_topo *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* topo_choice.c: fill t->choice (and the advice) from t->rel. */
int rail_topo_choose(struct rail_topo *t);
/* topo_fallback.c: each choice's fallback port, once every GPU has its choice. */
int rail_topo_fallbacks(struct rail_topo *t);

#endif
