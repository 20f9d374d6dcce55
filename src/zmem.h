/*
 * nccl-net-rail: zeroed buffers whose pages are touched only when used.
 *
 * A connection's control regions and request pool are large (hundreds of
 * KiB) and mostly idle. malloc + memset writes every page at setup: with
 * 1024 connections that is most of the setup's CPU time (page faults and
 * the zeroing). Large buffers come from mmap instead, whose pages the
 * kernel zeroes on first touch (or when ibv_reg_mr pins them); small ones
 * from aligned_alloc + memset.
 */
#ifndef RAIL_ZMEM_H
#define RAIL_ZMEM_H

#include <stddef.h>

/* len zeroed bytes aligned to align (a power of two, at most 4096), or NULL. */
void *rail_zalloc(size_t len, size_t align);
/* Frees what rail_zalloc(len, ...) returned (NULL: nothing). */
void rail_zfree(void *p, size_t len);

#endif
