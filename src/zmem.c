/* nccl-net-rail: zeroed buffers whose pages are touched only when used (zmem.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rail.h"
#include "zmem.h"

/*
 * From this size on, a buffer has pages of its own (mmap). Not under
 * ThreadSanitizer: an address range glibc unmapped behind its back (a
 * thread's stack) and mmap handed out again kept the old thread's accesses
 * in its shadow, so the first reads of a new CTS FIFO were reported as
 * racing with a pthread_create of long before; heap blocks it tracks.
 */
#define ZMEM_MMAP_MIN (RAIL_TSAN ? SIZE_MAX : 16u * 1024u)
#define ZMEM_PAGE 4096u

void *rail_zalloc(size_t len, size_t align)
{
	void *p;

	if (!len || !align || align > ZMEM_PAGE || (align & (align - 1)))
		return NULL;
	if (len >= ZMEM_MMAP_MIN) {
		p = mmap(NULL, RAIL_ALIGN_UP(len, ZMEM_PAGE), PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		return p == MAP_FAILED ? NULL : p;
	}
	p = aligned_alloc(align, RAIL_ALIGN_UP(len, align));
	if (p)
		memset(p, 0, len);
	return p;
}

void rail_zfree(void *p, size_t len)
{
	if (!p)
		return;
	if (len >= ZMEM_MMAP_MIN)
		munmap(p, RAIL_ALIGN_UP(len, ZMEM_PAGE));
	else
		free(p);
}
