/*
 * nccl-net-rail: little-endian field access for everything that crosses
 * the wire (handles, handshakes, frame headers), independent of host
 * byte order and struct padding.
 */
#ifndef RAIL_WIRE_H
#define RAIL_WIRE_H

#include <stdint.h>
#include <string.h>

/*
 * Written out byte by byte, not as loops: gcc -O2 does not unroll a 4- or
 * 8-step loop here, and then reads and writes one byte per step (six
 * instructions a byte, on the data path's every CTS, credit, want and eager
 * trailer). Spelled out, gcc and clang merge the bytes into one load or
 * store on a little-endian host, and stay correct on any other.
 */
static inline void rail_put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void rail_put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static inline void rail_put_u64(uint8_t *p, uint64_t v)
{
	rail_put_u32(p, (uint32_t)v);
	rail_put_u32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t rail_get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t rail_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t rail_get_u64(const uint8_t *p)
{
	return (uint64_t)rail_get_u32(p) | (uint64_t)rail_get_u32(p + 4) << 32;
}

/* FNV-1a, used as a corruption check (not security) on handles and hellos. */
static inline uint32_t rail_fnv1a(const uint8_t *p, size_t len)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

#endif
