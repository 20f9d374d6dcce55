/* nccl-net-rail: connection handle encoding and validation. */
#include <stdio.h>
#include <string.h>

#include "handle.h"
#include "rail.h"
#include "wire.h"

const char *rail_transport_name(int transport)
{
	switch (transport) {
	case RAIL_TRANSPORT_TCP: return "tcp";
	case RAIL_TRANSPORT_IB: return "ib";
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
	return 0;
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
		snprintf(why, why_len,
			 "handle format version %u, this plugin (%s) speaks version %d: "
			 "use the same nccl-net-rail build on every node", version,
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
	    (out.transport != RAIL_TRANSPORT_TCP && out.transport != RAIL_TRANSPORT_IB)) {
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
	*h = out;
	return 0;
}

void *rail_handle_get_stage(const void *buf)
{
	void *stage;

	memcpy(&stage, (const uint8_t *)buf + RAIL_HANDLE_STAGE_OFFSET, sizeof(stage));
	return stage;
}

void rail_handle_set_stage(void *buf, void *stage)
{
	memcpy((uint8_t *)buf + RAIL_HANDLE_STAGE_OFFSET, &stage, sizeof(stage));
}
