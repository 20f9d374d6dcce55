/* nccl-net-rail: connection handle encoding and validation. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handle.h"
#include "rail.h"
#include "wire.h"

const char *rail_transport_name(int transport)
{
	switch (transport) {
	case RAIL_TRANSPORT_TCP: return "tcp";
	case RAIL_TRANSPORT_IB: return "ib";
	case RAIL_TRANSPORT_RMA_TCP: return "rma-tcp";
	default: return "unknown";
	}
}

int rail_handle_encode(const struct rail_handle *h, void *buf, size_t len)
{
	uint8_t *p = buf;
	int fam = h->addr.sa.sa_family;

	if (len < RAIL_HANDLE_SIZE || h->payload_len > RAIL_HANDLE_PAYLOAD_MAX ||
	    (fam != AF_INET && fam != AF_INET6))
		return -EINVAL;
	memset(p, 0, RAIL_HANDLE_SIZE);
	rail_put_u32(p, RAIL_HANDLE_MAGIC);
	rail_put_u16(p + 4, RAIL_HANDLE_VERSION);
	p[6] = h->transport;
	p[7] = fam == AF_INET ? 4 : 6;
	rail_put_u64(p + 8, h->nonce);
	rail_put_u16(p + 16, (uint16_t)rail_sockaddr_port(&h->addr));
	rail_put_u16(p + 18, h->payload_len);
	if (fam == AF_INET) {
		memcpy(p + 24, &h->addr.sin.sin_addr, 4);
	} else {
		rail_put_u32(p + 20, h->addr.sin6.sin6_scope_id);
		memcpy(p + 24, &h->addr.sin6.sin6_addr, 16);
	}
	memcpy(p + 40, h->payload, h->payload_len);
	rail_put_u32(p + 72, rail_fnv1a(p, 72));
	rail_strlcpy((char *)p + RAIL_HANDLE_RELEASE_OFFSET, RAIL_VERSION_STRING,
		     RAIL_HANDLE_RELEASE_MAX);
	return 0;
}

/* The listener's release: printable and NUL-terminated within its field, else "". */
static void release_decode(const uint8_t *p, size_t len, char *out)
{
	const uint8_t *r = p + RAIL_HANDLE_RELEASE_OFFSET;
	int i;

	out[0] = '\0';
	if (len < RAIL_HANDLE_RELEASE_OFFSET + RAIL_HANDLE_RELEASE_MAX)
		return;
	for (i = 0; i < RAIL_HANDLE_RELEASE_MAX && r[i]; i++)
		if (r[i] < 0x21 || r[i] > 0x7e)
			return;
	if (i < RAIL_HANDLE_RELEASE_MAX)
		memcpy(out, r, (size_t)i + 1);
}

int rail_handle_decode(const void *buf, size_t len, struct rail_handle *h, char *why,
		       size_t why_len)
{
	const uint8_t *p = buf;
	struct rail_handle out;
	uint32_t magic, sum;
	uint16_t version;

	if (len < RAIL_HANDLE_WIRE_SIZE) {
		snprintf(why, why_len, "handle truncated: %zu bytes, need %d", len,
			 RAIL_HANDLE_WIRE_SIZE);
		return -EMSGSIZE;
	}
	magic = rail_get_u32(p);
	if (magic != RAIL_HANDLE_MAGIC) {
		snprintf(why, why_len,
			 "not a nccl-net-rail handle (magic 0x%08x, expected 0x%08x): "
			 "are both nodes loading the same NCCL net plugin?", magic,
			 RAIL_HANDLE_MAGIC);
		return -EPROTO;
	}
	version = rail_get_u16(p + 4);
	if (version != RAIL_HANDLE_VERSION) {
		char rel[RAIL_HANDLE_RELEASE_MAX];

		release_decode(p, len, rel);
		snprintf(why, why_len,
			 "handle format version %u from a listener running nccl-net-rail %s, this "
			 "plugin (%s) speaks version %d: use the same nccl-net-rail release on "
			 "every node", version, rel[0] ? rel : "(an older release)",
			 RAIL_VERSION_STRING, RAIL_HANDLE_VERSION);
		return -EPROTONOSUPPORT;
	}
	sum = rail_fnv1a(p, 72);
	if (rail_get_u32(p + 72) != sum) {
		snprintf(why, why_len, "handle corrupt (checksum 0x%08x, computed 0x%08x)",
			 rail_get_u32(p + 72), sum);
		return -EBADMSG;
	}
	memset(&out, 0, sizeof(out));
	out.transport = p[6];
	out.nonce = rail_get_u64(p + 8);
	out.payload_len = rail_get_u16(p + 18);
	if (out.payload_len > RAIL_HANDLE_PAYLOAD_MAX || (p[7] != 4 && p[7] != 6) ||
	    (out.transport != RAIL_TRANSPORT_TCP && out.transport != RAIL_TRANSPORT_IB &&
	     out.transport != RAIL_TRANSPORT_RMA_TCP)) {
		snprintf(why, why_len, "handle corrupt (family %u, transport %u, payload %u)",
			 p[7], p[6], out.payload_len);
		return -EBADMSG;
	}
	if (p[7] == 4) {
		out.addr.sin.sin_family = AF_INET;
		memcpy(&out.addr.sin.sin_addr, p + 24, 4);
	} else {
		out.addr.sin6.sin6_family = AF_INET6;
		out.addr.sin6.sin6_scope_id = rail_get_u32(p + 20);
		memcpy(&out.addr.sin6.sin6_addr, p + 24, 16);
	}
	rail_sockaddr_set_port(&out.addr, rail_get_u16(p + 16));
	memcpy(out.payload, p + 40, out.payload_len);
	release_decode(p, len, out.release);
	*h = out;
	return 0;
}

/*
 * Connector stages: a table of (stage, owner buffer, generation). The
 * handle holds only an index and a generation, so bytes from anywhere (a
 * random or damaged handle, a copy, a stale buffer) never reach a pointer:
 * they match a live entry of this very buffer or nothing.
 */
struct stage_slot {
	void *stage;
	const void *owner;
	uint32_t gen;
};

static pthread_mutex_t stage_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stage_slot *stage_slots;
static uint32_t stage_cap, stage_live;
static uint32_t stage_gen;	/* never reset: generations are unique per process */

/* The live slot this buffer names, or NULL. Called with stage_lock held. */
static struct stage_slot *stage_lookup(const void *buf)
{
	const uint8_t *p = (const uint8_t *)buf + RAIL_HANDLE_STAGE_OFFSET;
	uint32_t idx = rail_get_u32(p), gen = rail_get_u32(p + 4);
	struct stage_slot *s;

	if (idx == 0 || idx > stage_cap || gen == 0)
		return NULL;
	s = &stage_slots[idx - 1];
	return s->stage && s->gen == gen && s->owner == buf ? s : NULL;
}

void *rail_handle_get_stage(const void *buf)
{
	struct stage_slot *s;
	void *stage;

	pthread_mutex_lock(&stage_lock);
	s = stage_lookup(buf);
	stage = s ? s->stage : NULL;
	pthread_mutex_unlock(&stage_lock);
	return stage;
}

static void stage_write(void *buf, uint32_t idx, uint32_t gen)
{
	uint8_t *p = (uint8_t *)buf + RAIL_HANDLE_STAGE_OFFSET;

	rail_put_u32(p, idx);
	rail_put_u32(p + 4, gen);
}

static void stage_release(struct stage_slot *s)
{
	s->stage = NULL;
	s->owner = NULL;
	s->gen = 0;
	if (--stage_live == 0) {
		/* Nothing in progress: give the table back (dlclose leaves no leak). */
		free(stage_slots);
		stage_slots = NULL;
		stage_cap = 0;
	}
}

/* A free slot's index (0-based), growing the table. Called with stage_lock held. */
static int stage_alloc(void)
{
	struct stage_slot *n;
	uint32_t ncap, old = stage_cap;

	for (uint32_t i = 0; i < stage_cap; i++)
		if (!stage_slots[i].stage)
			return (int)i;
	ncap = stage_cap ? stage_cap * 2 : 64;
	if (ncap > (1u << 20))
		return -ENOSPC;
	n = realloc(stage_slots, ncap * sizeof(*n));
	if (!n)
		return -ENOMEM;
	memset(n + stage_cap, 0, (ncap - stage_cap) * sizeof(*n));
	stage_slots = n;
	stage_cap = ncap;
	return (int)old;
}

int rail_handle_set_stage(void *buf, void *stage)
{
	struct stage_slot *s;
	int idx, err = 0;

	pthread_mutex_lock(&stage_lock);
	s = stage_lookup(buf);
	if (s && stage) {
		s->stage = stage;
	} else if (s) {
		stage_release(s);
		stage_write(buf, 0, 0);
	} else if (stage) {
		idx = stage_alloc();
		if (idx < 0) {
			err = idx;
			stage_write(buf, 0, 0);
		} else {
			if (++stage_gen == 0)
				stage_gen = 1;
			stage_slots[idx] = (struct stage_slot){ stage, buf, stage_gen };
			stage_live++;
			stage_write(buf, (uint32_t)idx + 1, stage_gen);
		}
	} else {
		stage_write(buf, 0, 0);
	}
	pthread_mutex_unlock(&stage_lock);
	return err;
}
