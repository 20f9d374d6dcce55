/* nccl-net-rail: NCCL's device filter syntax. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matchlist.h"
#include "rail.h"

static int parse_field(const char *s, size_t len, int max, int *out)
{
	char buf[16];
	char *end;
	long v;

	if (len == 0) {
		*out = -1;
		return 0;
	}
	if (len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, len);
	buf[len] = '\0';
	v = strtol(buf, &end, 10);
	if (*end != '\0' || v < 0 || v > max)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

static int parse_entry(const char *s, size_t len, int max_fields, struct rail_match_entry *e,
		       char *why, size_t why_len)
{
	static const char *const what[] = { "name", "port", "rail", "plane" };
	static const int limits[] = { 0, 255, 32767, 32767 };
	int *fields[] = { NULL, &e->port, &e->rail, &e->plane };
	const char *p = s, *end = s + len;
	int f = 0;

	e->port = e->rail = e->plane = -1;
	for (; p <= end && f < 4; f++) {
		const char *colon = memchr(p, ':', (size_t)(end - p));
		size_t flen = colon ? (size_t)(colon - p) : (size_t)(end - p);

		if (f >= max_fields) {
			snprintf(why, why_len, "'%.*s': no %s field allowed here", (int)len, s,
				 what[f]);
			return -EINVAL;
		}
		if (f == 0) {
			if (flen == 0 || flen >= sizeof(e->name)) {
				snprintf(why, why_len, "'%.*s': empty or too long name", (int)len, s);
				return -EINVAL;
			}
			memcpy(e->name, p, flen);
			e->name[flen] = '\0';
		} else if (parse_field(p, flen, limits[f], fields[f])) {
			snprintf(why, why_len, "'%.*s': bad %s '%.*s'", (int)len, s, what[f],
				 (int)flen, p);
			return -EINVAL;
		}
		if (!colon)
			return 0;
		p = colon + 1;
	}
	snprintf(why, why_len, "'%.*s': too many ':' fields", (int)len, s);
	return -EINVAL;
}

int rail_matchlist_parse(const char *spec, int max_fields, struct rail_matchlist *out, char *why,
			 size_t why_len)
{
	struct rail_matchlist ml;
	const char *p = spec;

	memset(&ml, 0, sizeof(ml));
	if (*p == '^') {
		ml.exclude = 1;
		p++;
	}
	if (*p == '=') {
		ml.exact = 1;
		p++;
	}
	if (*p == '\0' && p != spec) {
		snprintf(why, why_len, "'%s': no names after '^' or '='", spec);
		return -EINVAL;
	}
	while (*p) {
		size_t len = strcspn(p, ",");

		if (len > 0) {
			if (ml.n == RAIL_MATCH_MAX) {
				snprintf(why, why_len, "more than %d entries", RAIL_MATCH_MAX);
				return -EINVAL;
			}
			if (parse_entry(p, len, max_fields, &ml.e[ml.n], why, why_len))
				return -EINVAL;
			ml.n++;
		}
		p += len;
		if (*p == ',')
			p++;
	}
	*out = ml;
	return 0;
}

int rail_matchlist_match(const struct rail_matchlist *ml, const char *name, int port,
			 const struct rail_match_entry **entry)
{
	if (entry)
		*entry = NULL;
	if (ml->n == 0)
		return 1;
	for (int i = 0; i < ml->n; i++) {
		const struct rail_match_entry *e = &ml->e[i];
		int name_ok = ml->exact ? !strcmp(name, e->name)
					: !strncmp(name, e->name, strlen(e->name));

		if (!name_ok || (e->port >= 0 && port >= 0 && e->port != port))
			continue;
		if (ml->exclude)
			return 0;
		if (entry)
			*entry = e;
		return 1;
	}
	return ml->exclude;
}
