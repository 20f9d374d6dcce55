/*
 * libFuzzer target: what rail-check reads from its peers (src/check/): a
 * process's description (rail_ck_info_decode) and the rows of results a
 * process sends the first one (rail_ck_cells_decode). A description that
 * decodes must encode again and decode to the same fields.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check/check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct rail_ck_info a, b;
	static struct rail_ck_cell cells[16];
	static char buf[65536], text[4097];
	char why[160];
	int n;

	if (size > sizeof(text) - 1)
		size = sizeof(text) - 1;
	memcpy(text, data, size);
	text[size] = '\0';
	(void)rail_ck_cells_decode(text, cells, 16);
	if (rail_ck_info_decode((const char *)data, size, &a, why, sizeof(why)))
		return 0;
	n = rail_ck_info_encode(&a, buf, sizeof(buf));
	if (n < 0 || rail_ck_info_decode(buf, (size_t)n, &b, why, sizeof(why)) ||
	    a.ndev != b.ndev || a.nconf != b.nconf || strcmp(a.host, b.host) ||
	    strcmp(a.version, b.version))
		abort();
	return 0;
}
