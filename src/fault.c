/*
 * nccl-net-rail: parsing and counting of injected faults (fault.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "rail.h"

static const struct {
	const char *name;
	int value;
} errnos[] = {
	{ "ENOMEM", ENOMEM }, { "EINVAL", EINVAL }, { "EIO", EIO }, { "EAGAIN", EAGAIN },
	{ "ETIMEDOUT", ETIMEDOUT }, { "EPERM", EPERM }, { "EFAULT", EFAULT },
	{ "ENOSPC", ENOSPC }, { "EBUSY", EBUSY }, { "EOPNOTSUPP", EOPNOTSUPP },
	{ "ENODEV", ENODEV }, { "EACCES", EACCES }, { "ECONNRESET", ECONNRESET },
};

static int parse_errno(const char *s)
{
	char *end;
	long v;

	for (size_t i = 0; i < RAIL_ARRAY_SIZE(errnos); i++)
		if (!strcmp(s, errnos[i].name))
			return errnos[i].value;
	v = strtol(s, &end, 10);
	return (*s && !*end && v > 0 && v < 4096) ? (int)v : -1;
}

static int find_call(const char *e, const char *const *names, int ncalls)
{
	for (int i = 0; i < ncalls; i++)
		if (!strcmp(e, names[i]) || (!strncmp(names[i], "ibv_", 4) && !strcmp(e, names[i] + 4)))
			return i;
	return -1;
}

static void list_calls(const char *const *names, int ncalls, char *out, size_t len)
{
	size_t n = 0;

	out[0] = '\0';
	for (int i = 0; i < ncalls && n < len; i++)
		n += (size_t)snprintf(out + n, len - n, "%s%s", i ? ", " : "", names[i]);
}

/* One "call:ERRNO:N[+]" entry into out[]. */
static int parse_entry(char *e, const char *const *names, int ncalls, struct rail_fault *out,
		       char *why, size_t why_len)
{
	char *c1 = strchr(e, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL, *end, calls[256];
	int call, err, sticky = 0;
	size_t nlen;
	long nth;

	if (!c1 || !c2) {
		snprintf(why, why_len, "'%s' is not call:ERRNO:N", e);
		return -EINVAL;
	}
	*c1 = *c2 = '\0';
	call = find_call(e, names, ncalls);
	err = parse_errno(c1 + 1);
	nlen = strlen(c2 + 1);
	if (nlen && c2[nlen] == '+') {
		sticky = 1;
		c2[nlen] = '\0';
	}
	nth = strtol(c2 + 1, &end, 10);
	if (call < 0 || err < 0 || *end || nth < 1) {
		list_calls(names, ncalls, calls, sizeof(calls));
		snprintf(why, why_len, "bad entry '%s:%s:%s' (calls: %s; ERRNO a name or number; "
			 "N >= 1)", e, c1 + 1, c2 + 1, calls);
		return -EINVAL;
	}
	out[call].armed = 1;
	out[call].err = err;
	out[call].nth = nth;
	out[call].sticky = sticky;
	atomic_store(&out[call].calls, 0);
	return 0;
}

int rail_fault_parse(const char *spec, const char *const *names, int ncalls,
		     struct rail_fault *out, char *why, size_t why_len)
{
	char buf[512], *save = NULL;

	for (int i = 0; i < ncalls; i++) {
		out[i].armed = 0;
		atomic_store(&out[i].calls, 0);
	}
	if (!spec || !spec[0])
		return 0;
	rail_strlcpy(buf, spec, sizeof(buf));
	for (char *e = strtok_r(buf, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
		if (parse_entry(e, names, ncalls, out, why, why_len)) {
			for (int i = 0; i < ncalls; i++)
				out[i].armed = 0;
			return -EINVAL;
		}
	}
	return 0;
}

int rail_fault_hit(struct rail_fault *f)
{
	long n;

	if (!f->armed)
		return 0;
	n = atomic_fetch_add(&f->calls, 1) + 1;
	return (n == f->nth || (f->sticky && n > f->nth)) ? f->err : 0;
}
