/*
 * libFuzzer target: the text parsers fed by sysfs and the environment:
 * PCI device paths (symlinks of a damaged sysfs copy resolve to anything),
 * PCI addresses, NCCL_IB_ADDR_RANGE, NCCL_IB_HCA / NCCL_SOCKET_IFNAME
 * lists. The input is one NUL-terminated string (at most 1 KiB).
 */
#include <stdint.h>
#include <string.h>

#include "ib/ib_gid.h"
#include "matchlist.h"
#include "topo/topo_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct rail_topo_chain chain;
	static struct rail_matchlist ml;
	char s[1025], path[1025], bdf[RAIL_TOPO_BDF_LEN], why[256];
	struct rail_ib_gid_params p;

	if (size > sizeof(s) - 1)
		size = sizeof(s) - 1;
	memcpy(s, data, size);
	s[size] = '\0';
	(void)rail_topo_chain_parse(s, &chain);
	(void)rail_topo_is_bdf(s);
	(void)rail_topo_norm_bdf(s, bdf, sizeof(bdf));
	memcpy(path, s, size + 1);
	(void)rail_topo_trim_to_pci(path);
	memset(&p, 0, sizeof(p));
	(void)rail_ib_gid_parse_range(s, &p);
	if (rail_matchlist_parse(s, 4, &ml, why, sizeof(why)) == 0)
		(void)rail_matchlist_match(&ml, "mlx5_0", 1, NULL);
	(void)rail_matchlist_parse(s, 1, &ml, why, sizeof(why));
	return 0;
}
