/*
 * nccl-net-rail: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the
 * TCP transport's per-connection key and its challenge-response on the
 * rescue listeners (docs/FAILOVER.md section 6). Small and portable, not
 * fast: it hashes a few hundred bytes per move.
 */
#ifndef RAIL_SHA256_H
#define RAIL_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define RAIL_SHA256_SIZE 32
#define RAIL_SHA256_BLOCK 64

struct rail_sha256 {
	uint32_t h[8];
	uint64_t len;		/* bytes hashed so far */
	uint8_t buf[RAIL_SHA256_BLOCK];
	size_t fill;		/* bytes waiting in buf */
};

void rail_sha256_init(struct rail_sha256 *s);
void rail_sha256_update(struct rail_sha256 *s, const void *data, size_t len);
void rail_sha256_final(struct rail_sha256 *s, uint8_t out[RAIL_SHA256_SIZE]);
void rail_sha256(const void *data, size_t len, uint8_t out[RAIL_SHA256_SIZE]);

struct rail_hmac {
	struct rail_sha256 inner, outer;
};

void rail_hmac_init(struct rail_hmac *m, const void *key, size_t key_len);
void rail_hmac_update(struct rail_hmac *m, const void *data, size_t len);
void rail_hmac_final(struct rail_hmac *m, uint8_t out[RAIL_SHA256_SIZE]);
void rail_hmac_sha256(const void *key, size_t key_len, const void *data, size_t len,
		      uint8_t out[RAIL_SHA256_SIZE]);

/* 1 when the n bytes are equal; the time does not depend on where they differ. */
int rail_equal_ct(const void *a, const void *b, size_t n);

#endif
