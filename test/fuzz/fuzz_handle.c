/*
 * libFuzzer target: the connection handle decoder (src/handle.c) on any
 * bytes of any length, and the connector's stage lookup on a 128-byte
 * buffer whose stage slot (bytes 120-127) is the input's: it must never be
 * trusted as a pointer (with no stage set, nothing may be found).
 */
#include <stdint.h>
#include <string.h>

#include "handle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t buf[RAIL_HANDLE_SIZE];
	struct rail_handle h, h2;
	char why[256];

	if (rail_handle_decode(data, size, &h, why, sizeof(why)) == 0) {
		if (rail_handle_encode(&h, buf, sizeof(buf)) ||
		    rail_handle_decode(buf, sizeof(buf), &h2, why, sizeof(why)) ||
		    h.nonce != h2.nonce || h.transport != h2.transport ||
		    h.payload_len != h2.payload_len || memcmp(h.payload, h2.payload, h.payload_len))
			__builtin_trap();
	}
	memset(buf, 0, sizeof(buf));
	memcpy(buf, data, size < sizeof(buf) ? size : sizeof(buf));
	if (rail_handle_get_stage(buf))
		__builtin_trap();
	return 0;
}
