/* nccl-net-rail: interface selection with NCCL's rules. */
#include <ifaddrs.h>
#include <stdio.h>
#include <string.h>

#include "ifaces.h"
#include "log.h"
#include "matchlist.h"
#include "param.h"
#include "rail.h"

/* Rank an address: IPv4 first, then global IPv6, then link-local IPv6. */
static int addr_rank(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return 3;
	if (IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)sa)->sin6_addr))
		return 1;
	return 2;
}

static int usable(const struct ifaddrs *ifa, int family)
{
	const struct sockaddr *sa = ifa->ifa_addr;

	if (!sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6))
		return 0;
	if (family != AF_UNSPEC && sa->sa_family != family)
		return 0;
	if (!(ifa->ifa_flags & IFF_UP) || !(ifa->ifa_flags & IFF_RUNNING))
		return 0;
	if (sa->sa_family == AF_INET6 &&
	    IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr))
		return 0;
	return 1;
}

int rail_ifaces_find_spec(const char *spec, int family, struct rail_iface *out, int max)
{
	struct rail_matchlist ml;
	struct ifaddrs *list, *ifa;
	int ranks[RAIL_MAX_IFACES];
	char why[128];
	int n = 0;

	if (rail_matchlist_parse(spec, 1, &ml, why, sizeof(why)))
		return -EINVAL;
	if (getifaddrs(&list))
		return -errno;
	for (ifa = list; ifa; ifa = ifa->ifa_next) {
		int i, rank;

		if (!usable(ifa, family) || !rail_matchlist_match(&ml, ifa->ifa_name, -1, NULL))
			continue;
		rank = addr_rank(ifa->ifa_addr);
		for (i = 0; i < n; i++)
			if (!strcmp(out[i].name, ifa->ifa_name))
				break;
		if (i < n) {
			/* One address per interface: keep the best ranked. */
			if (rank <= ranks[i])
				continue;
		} else if (n == max) {
			continue;
		} else {
			n++;
		}
		memset(&out[i], 0, sizeof(out[i]));
		rail_strlcpy(out[i].name, ifa->ifa_name, sizeof(out[i].name));
		memcpy(&out[i].addr, ifa->ifa_addr, ifa->ifa_addr->sa_family == AF_INET
			       ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
		if (ifa->ifa_addr->sa_family == AF_INET6 && rank == 1)
			out[i].addr.sin6.sin6_scope_id = if_nametoindex(ifa->ifa_name);
		out[i].loopback = !!(ifa->ifa_flags & IFF_LOOPBACK);
		ranks[i] = rank;
	}
	freeifaddrs(list);
	return n;
}

int rail_ifaces_find(struct rail_iface *out, int max, char *rule, size_t rule_len)
{
	/* NCCL's order when NCCL_SOCKET_IFNAME is unset. */
	static const char *const defaults[] = { "ib", "^docker,lo,virbr", "docker", "lo", "virbr" };
	const char *spec = rail_param_str(RAIL_P_SOCKET_IFNAME);
	int fam_idx = (int)rail_param_int(RAIL_P_SOCKET_FAMILY);
	int family = fam_idx == 1 ? AF_INET : fam_idx == 2 ? AF_INET6 : AF_UNSPEC;
	struct rail_matchlist ml;
	char why[128];
	int n;

	if (max > RAIL_MAX_IFACES)
		max = RAIL_MAX_IFACES;
	if (spec[0]) {
		if (rail_matchlist_parse(spec, 1, &ml, why, sizeof(why))) {
			RAIL_WARN("NCCL_SOCKET_IFNAME=\"%s\" is not valid (%s); using NCCL's "
				  "default interface order", spec, why);
		} else {
			n = rail_ifaces_find_spec(spec, family, out, max);
			snprintf(rule, rule_len, "NCCL_SOCKET_IFNAME=%s", spec);
			return n;
		}
	}
	for (size_t i = 0; i < RAIL_ARRAY_SIZE(defaults); i++) {
		n = rail_ifaces_find_spec(defaults[i], family, out, max);
		if (n != 0) {
			snprintf(rule, rule_len, "default rule '%s'", defaults[i]);
			return n;
		}
	}
	snprintf(rule, rule_len, "no usable interface (up, running, with an address)");
	return 0;
}
