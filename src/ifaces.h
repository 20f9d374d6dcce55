/*
 * nccl-net-rail: the network interfaces the TCP transport and the verbs
 * out-of-band connection use, chosen with NCCL_SOCKET_IFNAME and
 * NCCL_SOCKET_FAMILY, or NCCL's default order when unset.
 */
#ifndef RAIL_IFACES_H
#define RAIL_IFACES_H

#include <net/if.h>

#include "sock.h"

#define RAIL_MAX_IFACES 16

struct rail_iface {
	char name[IF_NAMESIZE];
	union rail_sockaddr addr;
	int loopback;
};

/*
 * Fill out[0..max) and return the count (0 if none), or -EINVAL when
 * NCCL_SOCKET_IFNAME is malformed (warned). rule gets a sentence saying
 * which rule selected them, for the init log line.
 */
int rail_ifaces_find(struct rail_iface *out, int max, char *rule, size_t rule_len);

/* Same, with an explicit filter spec and family (AF_UNSPEC for any). */
int rail_ifaces_find_spec(const char *spec, int family, struct rail_iface *out, int max);

#endif
