/*
 * nccl-net-rail: subnet-aware routing at connect and accept
 * (NCCL_IB_SUBNET_AWARE_ROUTING, NCCL_IB_SUBNET_PREFIX_LEN; NCCL 2.30.7,
 * connect.cc ncclIbFindDevBySubnet). On RoCE fabrics of several subnets
 * (direct-connect rails: port i of a node reaches only the ports on its
 * own subnet) the device NCCL picked may not be on the peer's subnet.
 *
 * The listener puts the GIDs of its device's RoCE ports in the handle
 * (the first RAIL_IB_HANDLE_GIDS, ib_wire.h); the connector compares them
 * with its device's ports; the acceptor compares the ports of the
 * connector's HELLO (its devices as it chose them) with its own. A device
 * (one port, or a fused NIC) is on the peer's subnet when every one of its
 * RoCE ports has a valid GID on the subnet of one of the peer's valid GIDs
 * (rail_ib_gid_routing_net: IPv4-mapped GIDs under NCCL_IB_SUBNET_PREFIX_LEN,
 * IPv6 ones by their first 64 bits). NCCL's device when it is; else the
 * device (of every index, fused ones included) that is, whose ports are
 * all up and offer at least the memory types NCCL's does: of those, one
 * with as many ports as NCCL's, then the nearest to NCCL's on PCIe
 * (rail_ib_dev_nearest), then the first; else NCCL's. InfiniBand ports
 * take no part (a device of those alone keeps NCCL's choice), as in NCCL.
 * The whole connection moves: every QP, the flush QP and its
 * registrations are on the chosen device.
 */
#ifndef RAIL_IB_SUBNET_H
#define RAIL_IB_SUBNET_H

#include "handle.h"
#include "ib/ib_wire.h"

/* Listener, with the variable on: its ports' GIDs into h's payload (else left empty). */
void rail_ib_subnet_handle(int vdev, struct rail_handle *h);
/* Connector: the device to use instead of vdev (vdev unless the variable is on). */
int rail_ib_subnet_connect_dev(int vdev, const struct rail_handle *h, const char *peer);
/* Acceptor: the same from the connector's HELLO. */
int rail_ib_subnet_accept_dev(int vdev, const struct rail_ib_msg *hello, const char *peer);

#endif
