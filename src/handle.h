/*
 * nccl-net-rail: the connection handle NCCL carries from listen() on one
 * node to connect() on another (at most 128 bytes). It holds a magic
 * number, a format version, the transport, a random nonce chosen per
 * listen comm, and the listener's address. Decoding refuses anything that
 * does not match, with a reason an operator can read. Beside the checked
 * bytes it carries the listener's release (VERSION), outside the checksum
 * and readable whatever the format version, so that a connector refused for
 * a version or wire mismatch can name both releases (older releases leave
 * those bytes zero: "").
 */
#ifndef RAIL_HANDLE_H
#define RAIL_HANDLE_H

#include <stddef.h>
#include <stdint.h>

#include "sock.h"

#define RAIL_HANDLE_MAGIC 0x4c494152u /* "RAIL" */
#define RAIL_HANDLE_VERSION 1
#define RAIL_HANDLE_SIZE 128
#define RAIL_HANDLE_WIRE_SIZE 76	/* encoded bytes, checksum included */
#define RAIL_HANDLE_PAYLOAD_MAX 32
#define RAIL_HANDLE_STAGE_OFFSET 120	/* connector-local stage index and generation */
#define RAIL_HANDLE_RELEASE_OFFSET 80	/* the listener's release, NUL-terminated */
#define RAIL_HANDLE_RELEASE_MAX 32

enum rail_transport_id {
	RAIL_TRANSPORT_TCP = 1,
	RAIL_TRANSPORT_IB = 2,
	RAIL_TRANSPORT_RMA_TCP = 3,	/* an RMA listener (src/rma/), never a net one */
};

struct rail_handle {
	uint8_t transport;
	uint64_t nonce;
	union rail_sockaddr addr;
	uint16_t payload_len;
	uint8_t payload[RAIL_HANDLE_PAYLOAD_MAX];
	/* decode: the listener's release ("" when absent); encode writes this build's */
	char release[RAIL_HANDLE_RELEASE_MAX];
};

/* Writes the whole 128-byte handle (zero-filled, stage slot cleared). */
int rail_handle_encode(const struct rail_handle *h, void *buf, size_t len);

/*
 * -EMSGSIZE truncated, -EPROTO wrong magic, -EPROTONOSUPPORT other format
 * version, -EBADMSG corrupt (checksum, family, lengths). why explains.
 */
int rail_handle_decode(const void *buf, size_t len, struct rail_handle *h, char *why,
		       size_t why_len);

/*
 * The connector's in-progress state for one handle buffer. NCCL passes the
 * same handle buffer to every connect() retry, so the buffer's last 8 bytes
 * (not covered by the checksum) name an entry of a process-local table:
 * index and generation, never a pointer. get returns the stage only when
 * that entry is live and was set for this very buffer, so random, damaged,
 * copied or stale bytes give NULL. set(buf, NULL) releases the entry.
 * set returns 0, or -ENOMEM/-ENOSPC (the slot is then cleared).
 */
void *rail_handle_get_stage(const void *buf);
int rail_handle_set_stage(void *buf, void *stage);

const char *rail_transport_name(int transport);

#endif
