/*
 * nccl-net-rail: RoCE GID selection from the sysfs GID table
 * (/sys/class/infiniband/<dev>/ports/<p>/gids/<i> and gid_attrs/types/<i>),
 * read through src/sysfs.h so that it runs on fixture trees.
 *
 * Rules (NCCL's, section 3.3 of the reference): NCCL_IB_GID_INDEX >= 0 is
 * used as given. Otherwise the first valid GID of NCCL_IB_ADDR_FAMILY inside
 * NCCL_IB_ADDR_RANGE whose RoCE version is NCCL_IB_ROCE_VERSION_NUM; failing
 * that the first valid GID of that family and range of another version;
 * failing that the first valid GID of the other family with the wanted
 * version, then of any version. Valid means neither all-zero nor
 * link-local (fe80::/64); an entry whose type cannot be read is skipped
 * (and said so). Nothing valid: no GID, the port is not used.
 */
#ifndef RAIL_IB_GID_H
#define RAIL_IB_GID_H

#include <stddef.h>
#include <stdint.h>

#define RAIL_IB_GID_MAX 256	/* entries read per port */

struct rail_ib_gid_entry {
	int index;
	uint8_t raw[16];
	int valid;		/* non-zero and not link-local */
	int family;		/* AF_INET (IPv4-mapped) or AF_INET6 */
	int roce_version;	/* 1 or 2; 0 unknown */
	int type_err;		/* -errno reading the type file, 0 if read */
	char text[48];		/* as sysfs shows it */
};

struct rail_ib_gid_params {
	int forced_index;	/* NCCL_IB_GID_INDEX, -1 auto */
	int family;		/* AF_INET or AF_INET6 */
	int version;		/* 1 or 2 */
	int range_family;	/* 0: no range */
	uint8_t range_addr[16];
	int range_bits;
};

struct rail_ib_gid_choice {
	int index;		/* -1: none */
	uint8_t raw[16];
	int roce_version;
	char reason[160];
};

/* From NCCL_IB_GID_INDEX/ADDR_FAMILY/ADDR_RANGE/ROCE_VERSION_NUM (warns on a bad range). */
void rail_ib_gid_params_from_env(struct rail_ib_gid_params *p);
/* Parse "addr/bits" into p's range; -EINVAL for a malformed one. */
int rail_ib_gid_parse_range(const char *text, struct rail_ib_gid_params *p);

/*
 * Read up to max entries (0..tbl_len-1) of the port's table: the count read,
 * or -errno when the gids directory cannot be read at all.
 */
int rail_ib_gid_table(const char *dev, int port, int tbl_len, struct rail_ib_gid_entry *out,
		      int max);

/* The choice over a table already read (pure; unit-tested). */
void rail_ib_gid_choose(const struct rail_ib_gid_entry *tab, int n,
			const struct rail_ib_gid_params *p, struct rail_ib_gid_choice *out);

/*
 * Read the table and choose, logging skipped entries once at INFO.
 * 0 with out->index >= 0, or -ENOENT when no usable GID exists
 * (out->reason says why).
 */
int rail_ib_gid_select(const char *dev, int port, int tbl_len, struct rail_ib_gid_choice *out);

/* 1 for an IPv4-mapped GID (::ffff:a.b.c.d). */
int rail_ib_gid_is_v4(const uint8_t raw[16]);
/* 1 unless all-zero or link-local (fe80::/64): NCCL's validGid. */
int rail_ib_gid_valid(const uint8_t raw[16]);

/* "::ffff:192.0.2.1" style text of a raw GID. */
const char *rail_ib_gid_str(const uint8_t raw[16], char *buf, size_t len);

/*
 * The network a GID is on, for a move's choice of device (ib_move.c: the
 * joining side follows the peer to its rail). InfiniBand: the 64-bit subnet
 * prefix. RoCE (IPv4-mapped or IPv6): the prefix length of this host's
 * interface that holds the address (getifaddrs); when none does (the
 * netdev in another network namespace, the fake provider) /24 for IPv4
 * and /64 for IPv6 are assumed (assumed = 1). bits counts over the 16
 * bytes of the GID (an IPv4 /24 is 120).
 */
struct rail_ib_gid_net {
	uint8_t raw[16];	/* the GID, host bits cleared */
	int bits;
	int assumed;
};

void rail_ib_gid_net(const uint8_t raw[16], int infiniband, struct rail_ib_gid_net *out);
/*
 * The subnet NCCL_IB_SUBNET_AWARE_ROUTING compares (NCCL's rule, connect.cc
 * gidSameSubnet): an IPv4-mapped GID's address under v4_bits
 * (NCCL_IB_SUBNET_PREFIX_LEN, 1..32), any other GID's first 64 bits.
 */
void rail_ib_gid_routing_net(const uint8_t raw[16], int v4_bits, struct rail_ib_gid_net *out);
/* 1 if raw is on the network n. */
int rail_ib_gid_in_net(const struct rail_ib_gid_net *n, const uint8_t raw[16]);
/* "192.0.4.0/24", "fd00:1::/64" (IPv6 and InfiniBand prefixes). */
const char *rail_ib_gid_net_str(const struct rail_ib_gid_net *n, char *buf, size_t len);

/* InfiniBand GID fields NCCL reads (bytes 4-5: FLID, 6-7: local subnet prefix). */
static inline unsigned rail_ib_gid_flid(const uint8_t *raw)
{
	return (unsigned)raw[4] << 8 | raw[5];
}

static inline unsigned rail_ib_gid_subnet(const uint8_t *raw)
{
	return (unsigned)raw[6] << 8 | raw[7];
}

#endif
