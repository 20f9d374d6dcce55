/*
 * Conformance suite: host buffers and data patterns.
 *
 * Byte o of a message with seed s is byte (o % 8) of mix64(s + o / 8), so a
 * byte from another message (stale) or another offset (misplaced) shows.
 * Receive buffers are filled with a poison pattern (another seed) before
 * posting, over the room posted plus RAIL_CONF_GUARD bytes after it; what
 * the message did not cover must still hold the poison afterwards.
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "conf.h"

#define POISON_SALT 0x706f69736f6e2121ull

size_t rail_conf_slice_room(size_t size)
{
	return (size + RAIL_CONF_GUARD + 63) & ~(size_t)63;
}

void rail_conf_arena_init(struct rail_conf *cx, struct rail_conf_arena *a, void *comm,
			  size_t len)
{
	void *p;

	memset(a, 0, sizeof(*a));
	len = (len + 4095) & ~(size_t)4095;
	if (!len)
		len = 4096;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	RAIL_CONF_CHECK(cx, p != MAP_FAILED, "mmap of %zu bytes failed", len);
	/* Huge pages make filling and checking a GiB much cheaper. */
	if (len >= 4 * RAIL_CONF_MIB)
		madvise(p, len, MADV_HUGEPAGE);
	a->base = p;
	a->len = len;
	a->comm = comm;
	RAIL_CONF_CALL(cx, cx->net.reg_mr(comm, a->base, len, NCCL_PTR_HOST, &a->mh),
		       "regMr(NCCL_PTR_HOST) of a host buffer");
}

uint8_t *rail_conf_arena_take(struct rail_conf *cx, struct rail_conf_arena *a, size_t size)
{
	size_t room = rail_conf_slice_room(size);
	uint8_t *p;

	RAIL_CONF_CHECK(cx, a->used + room <= a->len, "suite bug: arena of %zu bytes too small",
			a->len);
	p = a->base + a->used;
	a->used += room;
	return p;
}

void rail_conf_arena_dereg(struct rail_conf *cx, struct rail_conf_arena *a)
{
	if (!a->base || !a->comm)
		return;
	RAIL_CONF_CALL(cx, cx->net.dereg_mr(a->comm, a->mh), "deregMr");
	a->comm = NULL;
	a->mh = NULL;
}

void rail_conf_arena_free(struct rail_conf_arena *a)
{
	if (a->base)
		munmap(a->base, a->len);
	memset(a, 0, sizeof(*a));
}

static void gen(uint8_t *p, size_t len, uint64_t seed)
{
	size_t words = len / 8, i;

	for (i = 0; i < words; i++) {
		uint64_t w = rail_conf_mix64(seed + i);

		memcpy(p + i * 8, &w, 8);
	}
	if (len % 8) {
		uint64_t w = rail_conf_mix64(seed + i);

		memcpy(p + i * 8, &w, len % 8);
	}
}

static uint8_t byte_at(uint64_t seed, size_t off)
{
	uint64_t w = rail_conf_mix64(seed + off / 8);
	uint8_t b[8];

	memcpy(b, &w, 8);
	return b[off % 8];
}

void rail_conf_fill(uint8_t *p, size_t len, uint64_t seed)
{
	gen(p, len, seed);
}

void rail_conf_poison(uint8_t *p, size_t len, uint64_t seed)
{
	gen(p, len, seed ^ POISON_SALT);
}

/* Compare [from, to) of p with the pattern of seed; first bad offset or `to`. */
static size_t first_bad(const uint8_t *p, size_t from, size_t to, uint64_t seed)
{
	size_t o = from;

	while (o < to && o % 8) {
		if (p[o] != byte_at(seed, o))
			return o;
		o++;
	}
	for (; o + 8 <= to; o += 8) {
		uint64_t w = rail_conf_mix64(seed + o / 8), got;

		memcpy(&got, p + o, 8);
		if (got != w)
			break;
	}
	for (; o < to; o++) {
		if (p[o] != byte_at(seed, o))
			return o;
	}
	return to;
}

static void describe(const uint8_t *p, size_t bad, size_t to, uint64_t seed, uint64_t alt,
		     const char *alt_means, char *why, size_t wlen, const char *what)
{
	size_t nbad = 0, nalt = 0, nzero = 0;

	for (size_t o = bad; o < to; o++) {
		uint8_t want = byte_at(seed, o);

		if (p[o] == want)
			continue;
		nbad++;
		if (p[o] == 0)
			nzero++;
		if (p[o] == byte_at(alt, o))
			nalt++;
	}
	snprintf(why, wlen,
		 "%s: byte %zu is 0x%02x, expected 0x%02x; %zu of the %zu bytes from there differ"
		 " (%s)",
		 what, bad, p[bad], byte_at(seed, bad), nbad, to - bad,
		 nalt * 2 > nbad ? alt_means : nzero * 2 > nbad ? "most are zero" : "unknown bytes");
}

int rail_conf_verify(const uint8_t *p, size_t len, uint64_t seed, char *why, size_t wlen)
{
	size_t bad = first_bad(p, 0, len, seed);

	if (bad == len)
		return 0;
	describe(p, bad, len, seed, seed ^ POISON_SALT,
		 "most still hold the receive poison: never written", why, wlen, "data");
	return -1;
}

int rail_conf_verify_poison(const uint8_t *p, size_t from, size_t to, uint64_t seed, char *why,
			    size_t wlen)
{
	size_t bad = first_bad(p, from, to, seed ^ POISON_SALT);

	if (bad == to)
		return 0;
	describe(p, bad, to, seed ^ POISON_SALT, seed,
		 "they continue the sender's pattern: the message overflowed", why, wlen,
		 "guard/tail written past the message");
	return -1;
}
