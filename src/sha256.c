/*
 * nccl-net-rail: SHA-256 and HMAC-SHA256, written from FIPS 180-4 sections
 * 4.1.2, 4.2.2, 5.1.1, 5.3.3 and 6.2, and RFC 2104; checked against the
 * FIPS 180 examples and RFC 4231's test cases (test/unit/test_sha256.c).
 */
#include <string.h>

#include "sha256.h"

/* The first 32 bits of the fractional parts of the cube roots of the first 64 primes. */
static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n)
{
	return (x >> n) | (x << (32 - n));
}

static void block(uint32_t h[8], const uint8_t *p)
{
	uint32_t w[64], v[8];

	for (int t = 0; t < 16; t++)
		w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
		       (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
	for (int t = 16; t < 64; t++) {
		uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
		uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);

		w[t] = w[t - 16] + s0 + w[t - 7] + s1;
	}
	memcpy(v, h, sizeof(v));
	for (int t = 0; t < 64; t++) {
		uint32_t e = v[4], a = v[0];
		uint32_t t1 = v[7] + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) +
			      ((e & v[5]) ^ (~e & v[6])) + K[t] + w[t];
		uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) +
			      ((a & v[1]) ^ (a & v[2]) ^ (v[1] & v[2]));

		memmove(v + 1, v, 7 * sizeof(v[0]));
		v[4] += t1;
		v[0] = t1 + t2;
	}
	for (int i = 0; i < 8; i++)
		h[i] += v[i];
}

void rail_sha256_init(struct rail_sha256 *s)
{
	/* The first 32 bits of the fractional parts of the square roots of the first 8 primes. */
	static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };

	memcpy(s->h, h0, sizeof(h0));
	s->len = 0;
	s->fill = 0;
}

void rail_sha256_update(struct rail_sha256 *s, const void *data, size_t len)
{
	const uint8_t *p = data;

	s->len += len;
	while (len > 0) {
		size_t take = RAIL_SHA256_BLOCK - s->fill;

		if (take > len)
			take = len;
		memcpy(s->buf + s->fill, p, take);
		s->fill += take;
		p += take;
		len -= take;
		if (s->fill == RAIL_SHA256_BLOCK) {
			block(s->h, s->buf);
			s->fill = 0;
		}
	}
}

void rail_sha256_final(struct rail_sha256 *s, uint8_t out[RAIL_SHA256_SIZE])
{
	uint64_t bits = s->len * 8;
	uint8_t pad[RAIL_SHA256_BLOCK + 8] = { 0x80 };
	size_t npad = (s->fill < 56 ? 56 : 120) - s->fill;

	/* A 1 bit, zeros up to 8 bytes short of a block, then the length in bits. */
	for (int i = 0; i < 8; i++)
		pad[npad + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
	rail_sha256_update(s, pad, npad + 8);
	for (int i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(s->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)s->h[i];
	}
	memset(s, 0, sizeof(*s));
}

void rail_sha256(const void *data, size_t len, uint8_t out[RAIL_SHA256_SIZE])
{
	struct rail_sha256 s;

	rail_sha256_init(&s);
	rail_sha256_update(&s, data, len);
	rail_sha256_final(&s, out);
}

void rail_hmac_init(struct rail_hmac *m, const void *key, size_t key_len)
{
	uint8_t k[RAIL_SHA256_BLOCK] = { 0 }, pad[RAIL_SHA256_BLOCK];

	/* A key longer than a block is hashed first; a shorter one is padded with zeros. */
	if (key_len > RAIL_SHA256_BLOCK)
		rail_sha256(key, key_len, k);
	else
		memcpy(k, key, key_len);
	for (int i = 0; i < RAIL_SHA256_BLOCK; i++)
		pad[i] = k[i] ^ 0x36;
	rail_sha256_init(&m->inner);
	rail_sha256_update(&m->inner, pad, sizeof(pad));
	for (int i = 0; i < RAIL_SHA256_BLOCK; i++)
		pad[i] = k[i] ^ 0x5c;
	rail_sha256_init(&m->outer);
	rail_sha256_update(&m->outer, pad, sizeof(pad));
	memset(k, 0, sizeof(k));
	memset(pad, 0, sizeof(pad));
}

void rail_hmac_update(struct rail_hmac *m, const void *data, size_t len)
{
	rail_sha256_update(&m->inner, data, len);
}

void rail_hmac_final(struct rail_hmac *m, uint8_t out[RAIL_SHA256_SIZE])
{
	uint8_t inner[RAIL_SHA256_SIZE];

	rail_sha256_final(&m->inner, inner);
	rail_sha256_update(&m->outer, inner, sizeof(inner));
	rail_sha256_final(&m->outer, out);
	memset(inner, 0, sizeof(inner));
}

void rail_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
		      uint8_t out[RAIL_SHA256_SIZE])
{
	struct rail_hmac m;

	rail_hmac_init(&m, key, key_len);
	rail_hmac_update(&m, data, len);
	rail_hmac_final(&m, out);
}

int rail_equal_ct(const void *a, const void *b, size_t n)
{
	const volatile uint8_t *x = a, *y = b;
	uint8_t d = 0;

	for (size_t i = 0; i < n; i++)
		d |= (uint8_t)(x[i] ^ y[i]);
	return d == 0;
}
