/*
 * nccl-net-rail: a fixed-capacity pool of equal-sized elements (requests).
 * Not thread-safe: each comm's requests are posted and tested by one
 * thread at a time (NCCL's progress thread).
 */
#ifndef RAIL_POOL_H
#define RAIL_POOL_H

#include <stddef.h>
#include <stdint.h>

struct rail_pool {
	unsigned char *mem;
	size_t elem_size;
	uint32_t capacity;
	uint32_t nfree;
	uint32_t *free_stack;
};

int rail_pool_init(struct rail_pool *pool, uint32_t capacity, size_t elem_size);
void rail_pool_destroy(struct rail_pool *pool);
/* A zeroed element, or NULL when all are in use. */
void *rail_pool_get(struct rail_pool *pool);
/* The same, with the element's index in *idx. */
void *rail_pool_get_idx(struct rail_pool *pool, uint32_t *idx);
/* -EINVAL if elem is not an in-use element of this pool (double free). */
int rail_pool_put(struct rail_pool *pool, void *elem);
/* 1 if elem points at the start of an element of this pool. */
int rail_pool_owns(const struct rail_pool *pool, const void *elem);
uint32_t rail_pool_in_use(const struct rail_pool *pool);
/*
 * Element i (for iterating over every slot, used or not); NULL past the end.
 * Inline: test() finds a request by its index.
 */
static inline void *rail_pool_at(const struct rail_pool *pool, uint32_t i)
{
	return i < pool->capacity ? pool->mem + (size_t)i * pool->elem_size : NULL;
}

#endif
