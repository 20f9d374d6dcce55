/*
 * nccl-net-rail: the TCP transport's devices, one per interface selected by
 * NCCL_SOCKET_IFNAME and NCCL_SOCKET_FAMILY, with their speed and PCI path;
 * and the lookups every other file of src/tcp/ makes: a device by index,
 * the device of a local address.
 */
#include <stdio.h>
#include <string.h>

#include "ifaces.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"
#include "tcp/tcp.h"

static struct tcp_dev tcp_devs[TCP_MAX_DEVS];
static int tcp_ndevs;
static char tcp_rule[160];

const struct tcp_dev *tcp_dev_get(int dev)
{
	return dev >= 0 && dev < tcp_ndevs ? &tcp_devs[dev] : NULL;
}

/*
 * Loopback has no wire: its speed is that of memory copies (rail-rawtcp
 * measures 27-29 GB/s, about 230 Gbps, with 8 streams on the GPU machine).
 * NCCL sizes its channels from the reported speed; at 10 Gbps it gives a
 * loopback run two channels, which the GPU side, not TCP, then limits.
 * That figure is for two processes; the copies are the host's CPUs, shared
 * by every rank on it, so with N ranks a launcher reports each reports
 * 2/N of it (not below 10 Gbps). Eight ranks at the full figure opened 4
 * channels each and lost to NCCL Socket at 128 KiB-2 MiB; at 60 Gbps they
 * open 2 (GPU machine, docs/PERFORMANCE.md).
 */
#define TCP_LOOPBACK_SPEED 240000
#define TCP_UNKNOWN_SPEED 10000

static int tcp_speed_of(const struct rail_iface *ifc)
{
	char path[PATH_MAX];
	long speed = 0;
	int64_t forced = rail_param_int(RAIL_P_TCP_SPEED);

	if (forced > 0)
		return (int)forced;
	snprintf(path, sizeof(path), "/sys/class/net/%s/speed", ifc->name);
	/* Virtual interfaces have no speed (EINVAL) or report -1. */
	if (rail_sysfs_read_long(path, &speed) == 0 && speed > 0)
		return (int)speed;
	if (ifc->loopback) {
		const char *from = NULL;
		int n = tcp_local_ranks(&from);

		return n > 2 ? RAIL_MAX(TCP_LOOPBACK_SPEED * 2 / n, TCP_UNKNOWN_SPEED)
			     : TCP_LOOPBACK_SPEED;
	}
	return TCP_UNKNOWN_SPEED;
}

static void tcp_fill_dev(struct tcp_dev *d, const struct rail_iface *ifc)
{
	char path[PATH_MAX];

	memset(d, 0, sizeof(*d));
	rail_strlcpy(d->name, ifc->name, sizeof(d->name));
	d->addr = ifc->addr;
	d->speed = tcp_speed_of(ifc);
	snprintf(path, sizeof(path), "/sys/class/net/%s/device", ifc->name);
	d->has_pci = rail_sysfs_realpath(path, d->pci_path, sizeof(d->pci_path)) == 0;
}

int tcp_devs_init(char *why, size_t why_len)
{
	struct rail_iface ifs[TCP_MAX_DEVS];
	int n = rail_ifaces_find(ifs, TCP_MAX_DEVS, tcp_rule, sizeof(tcp_rule));

	if (n < 0) {
		snprintf(why, why_len, "cannot list network interfaces: %s", RAIL_ERRSTR(n));
		return n;
	}
	if (n == 0) {
		snprintf(why, why_len, "%s; check NCCL_SOCKET_IFNAME and NCCL_SOCKET_FAMILY",
			 tcp_rule);
		return 0;
	}
	for (int i = 0; i < n; i++)
		tcp_fill_dev(&tcp_devs[i], &ifs[i]);
	tcp_ndevs = n;
	return n;
}

void tcp_devs_fini(void)
{
	tcp_ndevs = 0;
}

int tcp_ndevs_now(void)
{
	return tcp_ndevs;
}

const char *tcp_devs_rule(void)
{
	return tcp_rule;
}

int tcp_same_ip(const union rail_sockaddr *a, const union rail_sockaddr *b)
{
	if (a->sa.sa_family != b->sa.sa_family)
		return 0;
	return a->sa.sa_family == AF_INET ? a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr
					  : !memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, 16);
}

int tcp_dev_of_addr(const union rail_sockaddr *a)
{
	for (int i = 0; i < tcp_ndevs_now(); i++) {
		const struct tcp_dev *d = tcp_dev_get(i);

		if (d->addr.sa.sa_family != a->sa.sa_family)
			continue;
		if (a->sa.sa_family == AF_INET ? d->addr.sin.sin_addr.s_addr == a->sin.sin_addr.s_addr
		    : !memcmp(&d->addr.sin6.sin6_addr, &a->sin6.sin6_addr, 16))
			return i;
	}
	return -1;
}
