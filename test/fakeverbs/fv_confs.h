/*
 * Device descriptions for the fake provider (test/fakeverbs/README.md) that
 * several tests and benchmarks share. A test that needs its own variant
 * keeps it beside its cases.
 */
#ifndef RAIL_FV_CONFS_H
#define RAIL_FV_CONFS_H

/* Two single-port RoCE NICs (400G), RoCE v2 IPv4 GIDs at index 1 on different subnets. */
#define FV_CONF_ROCE_2DEV                              \
	"device mlx5_0 pci=0000:1b:00.0\n"             \
	"port 1 link=eth speed=ndr width=4x\n"         \
	"gid 0 fe80::1 type=v1\n"                      \
	"gid 1 ::ffff:10.1.0.1 type=v2\n"              \
	"device mlx5_1 pci=0000:3d:00.0\n"             \
	"port 1 link=eth speed=ndr width=4x\n"         \
	"gid 0 fe80::2 type=v1\n"                      \
	"gid 1 ::ffff:10.2.0.1 type=v2\n"

#endif
