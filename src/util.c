/* nccl-net-rail: errno text, clocks, random numbers. */
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "rail.h"

const char *rail_strerror(int neg_errno, char *buf, size_t len)
{
	int err = neg_errno < 0 ? -neg_errno : neg_errno;
	const char *s;

	if (err == RAIL_ECLOSED) {
		rail_strlcpy(buf, "the peer closed the connection", len);
		return buf;
	}
	/* GNU strerror_r may return a static string instead of filling buf. */
	s = strerror_r(err, buf, len);

	if (s != buf)
		rail_strlcpy(buf, s, len);
	return buf;
}

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t rail_now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

uint64_t rail_coarse_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC_COARSE);
}

uint64_t rail_random64(void)
{
	uint64_t v = 0;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v) && v != 0)
		return v;
	v = rail_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&v;
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdull;
	v ^= v >> 33;
	return v ? v : 1;
}

int rail_random_bytes(void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

void rail_strlcpy(char *dst, const char *src, size_t size)
{
	size_t n;

	if (size == 0)
		return;
	n = strnlen(src, size - 1);
	memcpy(dst, src, n);
	dst[n] = '\0';
}
