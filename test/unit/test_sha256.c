/*
 * SHA-256 and HMAC-SHA256 (src/sha256.c) against the examples of FIPS 180
 * and the test cases of RFC 4231; fed whole and in pieces of every size
 * (block boundaries), and the constant-time comparison.
 */
#include <stdio.h>
#include <string.h>

#include "unit.h"

#include "rail.h"
#include "sha256.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

static void assert_sha(const void *data, size_t len, const char *want)
{
	uint8_t d[RAIL_SHA256_SIZE];
	char got[2 * RAIL_SHA256_SIZE + 1];

	rail_sha256(data, len, d);
	hex(d, sizeof(d), got);
	assert_string_equal(got, want);
}

static void test_sha256_fips180(void **state)
{
	static char million[1000000];

	(void)state;
	assert_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	assert_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	assert_sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56,
		   "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	assert_sha("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklm"
		   "nopqklmnopqrlmnopqrsmnopqrstnopqrstu", 112,
		   "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
	memset(million, 'a', sizeof(million));
	assert_sha(million, sizeof(million),
		   "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* The same digest whatever pieces the message comes in. */
static void test_sha256_pieces(void **state)
{
	uint8_t msg[300], whole[RAIL_SHA256_SIZE], part[RAIL_SHA256_SIZE];

	(void)state;
	for (size_t i = 0; i < sizeof(msg); i++)
		msg[i] = (uint8_t)(i * 13 + 5);
	for (size_t len = 0; len <= sizeof(msg); len += 7) {
		rail_sha256(msg, len, whole);
		for (size_t piece = 1; piece <= 70; piece++) {
			struct rail_sha256 s;

			rail_sha256_init(&s);
			for (size_t off = 0; off < len; off += piece)
				rail_sha256_update(&s, msg + off, RAIL_MIN(piece, len - off));
			rail_sha256_final(&s, part);
			assert_memory_equal(whole, part, sizeof(whole));
		}
	}
}

static void assert_hmac(const void *key, size_t klen, const void *data, size_t len,
			const char *want)
{
	uint8_t d[RAIL_SHA256_SIZE];
	char got[2 * RAIL_SHA256_SIZE + 1];

	rail_hmac_sha256(key, klen, data, len, d);
	hex(d, sizeof(d), got);
	got[strlen(want)] = '\0';	/* test case 5 checks the first 128 bits */
	assert_string_equal(got, want);
}

static void test_hmac_rfc4231(void **state)
{
	uint8_t k[131], d[50];

	(void)state;
	memset(k, 0x0b, 20);
	assert_hmac(k, 20, "Hi There", 8,
		    "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
	assert_hmac("Jefe", 4, "what do ya want for nothing?", 28,
		    "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
	memset(k, 0xaa, 20);
	memset(d, 0xdd, 50);
	assert_hmac(k, 20, d, 50,
		    "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
	for (int i = 0; i < 25; i++)
		k[i] = (uint8_t)(i + 1);
	memset(d, 0xcd, 50);
	assert_hmac(k, 25, d, 50,
		    "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
	memset(k, 0x0c, 20);
	assert_hmac(k, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b");
	memset(k, 0xaa, 131);
	assert_hmac(k, 131, "Test Using Larger Than Block-Size Key - Hash Key First", 54,
		    "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
	assert_hmac(k, 131, "This is a test using a larger than block-size key and a larger "
		    "than block-size data. The key needs to be hashed before being used by the "
		    "HMAC algorithm.", 152,
		    "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

static void test_equal_ct(void **state)
{
	uint8_t a[32], b[32];

	(void)state;
	memset(a, 7, sizeof(a));
	memcpy(b, a, sizeof(b));
	assert_true(rail_equal_ct(a, b, sizeof(a)));
	for (size_t i = 0; i < sizeof(a); i++) {
		b[i] ^= 0x80;
		assert_false(rail_equal_ct(a, b, sizeof(a)));
		b[i] ^= 0x80;
	}
	assert_true(rail_equal_ct(a, b, 0));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sha256_fips180),
		cmocka_unit_test(test_sha256_pieces),
		cmocka_unit_test(test_hmac_rfc4231),
		cmocka_unit_test(test_equal_ct),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
