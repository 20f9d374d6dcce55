/* Conformance suite: time, sizes, seeds, /proc counting. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conf.h"

uint64_t rail_conf_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void rail_conf_sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int rail_conf_expired(const struct rail_conf *cx)
{
	return rail_conf_now_ns() >= cx->deadline_ns;
}

const char *rail_conf_size_str(size_t size, char *buf, size_t len)
{
	if (size >= RAIL_CONF_GIB && size % RAIL_CONF_GIB == 0)
		snprintf(buf, len, "%zuG", size / RAIL_CONF_GIB);
	else if (size >= RAIL_CONF_MIB && size % RAIL_CONF_MIB == 0)
		snprintf(buf, len, "%zuM", size / RAIL_CONF_MIB);
	else if (size >= RAIL_CONF_KIB && size % RAIL_CONF_KIB == 0)
		snprintf(buf, len, "%zuK", size / RAIL_CONF_KIB);
	else
		snprintf(buf, len, "%zu", size);
	return buf;
}

int rail_conf_parse_size(const char *s, size_t *out)
{
	char *end = NULL;
	unsigned long long v;
	size_t mult = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	switch (*end) {
	case 0: break;
	case 'k': case 'K': mult = RAIL_CONF_KIB; end++; break;
	case 'm': case 'M': mult = RAIL_CONF_MIB; end++; break;
	case 'g': case 'G': mult = RAIL_CONF_GIB; end++; break;
	default: return -1;
	}
	if (*end == 'i' || *end == 'I')
		end++;
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end || v > (unsigned long long)(SIZE_MAX / mult))
		return -1;
	*out = (size_t)v * mult;
	return 0;
}

uint64_t rail_conf_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint64_t rail_conf_seed(const struct rail_conf *cx, unsigned stream, unsigned msg, unsigned part)
{
	uint64_t x = ((uint64_t)cx->scn_id << 56) ^ ((uint64_t)cx->abi << 48) ^
		     ((uint64_t)stream << 32) ^ ((uint64_t)msg << 8) ^ part;

	return rail_conf_mix64(x);
}

int rail_conf_count_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] != '.')
			n++;
	}
	closedir(d);
	return n;
}

/* "3:socket:[123] 7:/dev/foo ..." for leak messages. */
void rail_conf_list_fds(char *buf, size_t len)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	size_t off = 0;

	buf[0] = 0;
	if (!d)
		return;
	while ((e = readdir(d)) != NULL && off + 1 < len) {
		char path[300], target[256];
		ssize_t n;

		if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, target, sizeof(target) - 1);
		target[n > 0 ? n : 0] = 0;
		off += (size_t)snprintf(buf + off, len - off, "%s%s:%s", off ? " " : "", e->d_name,
					target);
	}
	closedir(d);
	if (off >= len)
		buf[len - 1] = 0;
}
