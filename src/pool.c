/* nccl-net-rail: fixed-capacity element pool. */
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "rail.h"
#include "zmem.h"

/* The first byte after each element's payload marks it in use. */
static unsigned char *in_use_flag(const struct rail_pool *pool, uint32_t i)
{
	return pool->mem + (size_t)i * pool->elem_size + pool->elem_size - 1;
}

int rail_pool_init(struct rail_pool *pool, uint32_t capacity, size_t elem_size)
{
	if (capacity == 0 || elem_size == 0)
		return -EINVAL;
	/* One extra byte holds the in-use flag; keep elements 64-byte aligned. */
	elem_size = RAIL_ALIGN_UP(elem_size + 1, 64);
	memset(pool, 0, sizeof(*pool));
	pool->mem = rail_zalloc(elem_size * capacity, 64);	/* zeroed, touched when used */
	if (!pool->mem)
		return -ENOMEM;
	pool->free_stack = calloc(capacity, sizeof(uint32_t));
	if (!pool->free_stack) {
		rail_zfree(pool->mem, elem_size * capacity);
		pool->mem = NULL;
		return -ENOMEM;
	}
	pool->elem_size = elem_size;
	pool->capacity = capacity;
	pool->nfree = capacity;
	/* Hand out low indices first: index capacity-1 sits at the bottom. */
	for (uint32_t i = 0; i < capacity; i++)
		pool->free_stack[i] = capacity - 1 - i;
	return 0;
}

void rail_pool_destroy(struct rail_pool *pool)
{
	rail_zfree(pool->mem, pool->elem_size * pool->capacity);
	free(pool->free_stack);
	memset(pool, 0, sizeof(*pool));
}

void *rail_pool_get_idx(struct rail_pool *pool, uint32_t *idx)
{
	uint32_t i;
	unsigned char *e;

	if (pool->nfree == 0)
		return NULL;
	i = pool->free_stack[--pool->nfree];
	e = pool->mem + (size_t)i * pool->elem_size;
	memset(e, 0, pool->elem_size - 1);
	*in_use_flag(pool, i) = 1;
	*idx = i;
	return e;
}

void *rail_pool_get(struct rail_pool *pool)
{
	uint32_t i;

	return rail_pool_get_idx(pool, &i);
}

int rail_pool_owns(const struct rail_pool *pool, const void *elem)
{
	const unsigned char *p = elem;
	size_t off;

	if (!pool->mem || p < pool->mem)
		return 0;
	off = (size_t)(p - pool->mem);
	return off < pool->elem_size * pool->capacity && off % pool->elem_size == 0;
}

int rail_pool_put(struct rail_pool *pool, void *elem)
{
	uint32_t i;

	if (!rail_pool_owns(pool, elem))
		return -EINVAL;
	i = (uint32_t)(((unsigned char *)elem - pool->mem) / pool->elem_size);
	if (!*in_use_flag(pool, i))
		return -EINVAL;
	*in_use_flag(pool, i) = 0;
	pool->free_stack[pool->nfree++] = i;
	return 0;
}

uint32_t rail_pool_in_use(const struct rail_pool *pool)
{
	return pool->capacity - pool->nfree;
}
