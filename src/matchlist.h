/*
 * nccl-net-rail: NCCL's device filter syntax, shared by NCCL_SOCKET_IFNAME
 * and NCCL_IB_HCA:  [^][=]name[:port[:rail[:plane]]][,name...]
 *   ^  the list excludes instead of selecting
 *   =  names must match exactly (otherwise they are prefixes)
 *   empty port/rail/plane fields mean "any" / "unset" (-1)
 */
#ifndef RAIL_MATCHLIST_H
#define RAIL_MATCHLIST_H

#include <stddef.h>

#define RAIL_MATCH_MAX 32
#define RAIL_MATCH_NAME_MAX 64

struct rail_match_entry {
	char name[RAIL_MATCH_NAME_MAX];
	int port;  /* -1: any */
	int rail;  /* -1: unset */
	int plane; /* -1: unset */
};

struct rail_matchlist {
	int exclude;
	int exact;
	int n;
	struct rail_match_entry e[RAIL_MATCH_MAX];
};

/*
 * max_fields: 1 for interface names, 4 for HCAs (name:port:rail:plane).
 * An empty spec gives an empty list, which selects everything.
 * On error returns -EINVAL and explains in why.
 */
int rail_matchlist_parse(const char *spec, int max_fields, struct rail_matchlist *out, char *why,
			 size_t why_len);

/*
 * 1 if (name, port) is selected; port -1 matches any entry port. For
 * selecting lists *entry (if not NULL) gets the entry that matched.
 */
int rail_matchlist_match(const struct rail_matchlist *ml, const char *name, int port,
			 const struct rail_match_entry **entry);

#endif
